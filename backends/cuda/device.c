/* backends/cuda/device.c: the CUDA plugin's entry point: driver start-up, device enumeration and properties, primary contexts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

kiln_host_t kiln_cuda_host;
size_t kiln_cuda_device_count_;
kiln_backend_device_t *kiln_cuda_devices_;
bool kiln_cuda_tf32;

static char version_text[256];
static char cublas_state[256], cudnn_state[256];

kiln_status_t kiln_cuda_enter(kiln_backend_device_t *device) {
  CUresult r = cuCtxPushCurrent(device->context);
  if (r != CUDA_SUCCESS) return kiln_cuda_check(r, "cuCtxPushCurrent (the primary context of cuda:%d)", device->ordinal);
  return KILN_OK;
}

void kiln_cuda_leave(void) {
  CUcontext previous;
  (void)cuCtxPopCurrent(&previous);
}

/* Appends one key/value pair to a description; silently drops what does not
 * fit (the table is for people). */
static int attribute(CUdevice device, CUdevice_attribute which) {
  int value = 0;
  if (cuDeviceGetAttribute(&value, which, device) != CUDA_SUCCESS) return 0;
  return value;
}

/* "13.0" from 13000. */
static void format_cuda_version(int version, char *out, size_t size) {
  snprintf(out, size, "%d.%d", version / 1000, (version % 1000) / 10);
}

/* KILN_CUDA_TF32: unset, "0" or "1"; anything else is refused, not guessed. */
static kiln_status_t read_tf32_setting(void) {
  const char *value = getenv("KILN_CUDA_TF32");
  kiln_cuda_tf32 = false;
  if (!value || !*value || !strcmp(value, "0")) return KILN_OK;
  if (!strcmp(value, "1")) {
    kiln_cuda_tf32 = true;
    return KILN_OK;
  }
  return kiln_cuda_error(KILN_INVALID_ARGUMENT,
                                  "KILN_CUDA_TF32='%s' is not valid: use 1 to let cuBLAS and cuDNN use TF32 tensor "
                                  "cores for f32, or 0 (the default) for full f32 precision",
                                  value);
}

/* The kernel module's version ("580.65.06"), which the driver API does not
 * report; "" where /proc does not say. */
static void nvidia_driver_version(char *out, size_t size) {
  out[0] = '\0';
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  if (!f) return;
  char line[512];
  if (fgets(line, sizeof line, f)) {
    /* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun ..." */
    const char *at = strstr(line, "Kernel Module");
    if (at) {
      at += strlen("Kernel Module");
      while (*at == ' ') at++;
      size_t n = strcspn(at, " \n");
      if (n > 0 && n < size) {
        memcpy(out, at, n);
        out[n] = '\0';
      }
    }
  }
  fclose(f);
}

/* Describe a device once, at start-up: everything devinfo -v shows. */
static void describe(kiln_backend_device_t *d, int driver_version) {
  kiln_backend_device_desc_t *desc = &d->desc;
  memset(desc, 0, sizeof *desc);
  desc->impl = d;
  desc->type = KILN_DEVICE_GPU;
  if (cuDeviceGetName(desc->name, (int)sizeof desc->name, d->device) != CUDA_SUCCESS)
    snprintf(desc->name, sizeof desc->name, "CUDA device %d", d->ordinal);
  snprintf(desc->vendor, sizeof desc->vendor, "NVIDIA");
  nvidia_driver_version(desc->driver_version, sizeof desc->driver_version);
  if (!desc->driver_version[0])
    format_cuda_version(driver_version, desc->driver_version, sizeof desc->driver_version);
  /* The CUDA version the driver API offers: what "runtime" means here. */
  format_cuda_version(driver_version, desc->runtime_version, sizeof desc->runtime_version);

  CUuuid uuid;
  if (cuDeviceGetUuid(&uuid, d->device) == CUDA_SUCCESS) {
    const unsigned char *u = (const unsigned char *)uuid.bytes;
    snprintf(desc->uuid, sizeof desc->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
             u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  }
  char bus[sizeof desc->pci_bus_id];
  if (cuDeviceGetPCIBusId(bus, (int)sizeof bus, d->device) == CUDA_SUCCESS) {
    /* Lower case, as Linux's sysfs writes it, so identities compare as text. */
    for (size_t i = 0; bus[i]; i++) bus[i] = (char)(bus[i] >= 'A' && bus[i] <= 'F' ? bus[i] - 'A' + 'a' : bus[i]);
    snprintf(desc->pci_bus_id, sizeof desc->pci_bus_id, "%s", bus);
  }
  snprintf(desc->compute_capability, sizeof desc->compute_capability, "%d.%d", d->cc_major, d->cc_minor);
  size_t total = 0;
  if (cuDeviceTotalMem(&total, d->device) == CUDA_SUCCESS) desc->memory_bytes = total;
  desc->max_alloc_bytes = desc->memory_bytes;
  desc->local_memory_bytes = (uint64_t)attribute(d->device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  desc->compute_units = (uint32_t)d->sm_count;
  desc->max_work_group_size = (uint32_t)attribute(d->device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  desc->fp16 = d->cc_major > 5 || (d->cc_major == 5 && d->cc_minor >= 3);
  desc->fp64 = true;
  desc->memory_free_is_estimate = false;

  kiln_backend_add_property(desc, "compiled_architectures", "%s", kiln_cuda_compiled_architectures());
  char warning[384];
  kiln_cuda_coverage_warning(d->cc_major, d->cc_minor, warning, sizeof warning);
  if (!d->module)
    kiln_backend_add_property(desc, "warning", "kiln's kernels cannot run here: %s", d->module_error);
  else if (warning[0])
    kiln_backend_add_property(desc, "warning", "%s", warning);
  kiln_backend_add_property(desc, "providers", "native%s%s", kiln_cuda_cublas_available() ? ",cublas" : "",
               kiln_cuda_cudnn_available() ? ",cudnn" : "");
  kiln_backend_add_property(desc, "cublas", "%s", cublas_state);
  kiln_backend_add_property(desc, "cudnn", "%s", cudnn_state);
  kiln_backend_add_property(desc, "tf32", "%s",
               kiln_cuda_tf32 ? "on (KILN_CUDA_TF32=1): cuBLAS and cuDNN may round f32 inputs to TF32"
                              : "off: f32 matmul and conv2d keep full precision (KILN_CUDA_TF32=1 allows TF32)");
  kiln_backend_add_property(desc, "shared_memory_per_block_optin", "%d",
               attribute(d->device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN));
  kiln_backend_add_property(desc, "l2_cache_bytes", "%d", attribute(d->device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE));
  kiln_backend_add_property(desc, "memory_bus_width_bits", "%d", attribute(d->device,
                            CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH));
  kiln_backend_add_property(desc, "max_threads_per_multiprocessor", "%d",
               attribute(d->device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR));
  kiln_backend_add_property(desc, "async_copy_engines", "%d", attribute(d->device,
                            CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT));
  kiln_backend_add_property(desc, "ecc", "%s", attribute(d->device, CU_DEVICE_ATTRIBUTE_ECC_ENABLED) ? "on" : "off");
  kiln_backend_add_property(desc, "memory_pool", "%s",
               d->pools ? "stream-ordered (cuMemAllocAsync; freed memory stays pooled)" : "cuMemAlloc (no pool support)");
  kiln_backend_add_property(desc, "driver_api", "CUDA %s (the newest version the installed driver supports)",
               desc->runtime_version);
  kiln_backend_add_property(desc, "built_with", "CUDA toolkit %d.%d", CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10);

  /* Peers this device reads and writes directly; copies to others are staged
   * by the driver. */
  char peers[256] = "";
  size_t used = 0;
  for (size_t j = 0; j < kiln_cuda_device_count_; j++) {
    if ((int)j == d->ordinal) continue;
    int can = 0;
    if (cuDeviceCanAccessPeer(&can, d->device, kiln_cuda_devices_[j].device) == CUDA_SUCCESS && can && used < sizeof peers)
      used += (size_t)snprintf(peers + used, sizeof peers - used, "%scuda:%zu", used ? "," : "", j);
  }
  kiln_backend_add_property(desc, "peer_access", "%s", peers[0] ? peers : "none");
}

/* Everything a device needs before work reaches it, in its primary context. */
static kiln_status_t open_device(kiln_backend_device_t *d, int ordinal) {
  d->ordinal = ordinal;
  pthread_mutex_init(&d->cudnn_lock, NULL);
  kiln_status_t status = kiln_cuda_check(cuDeviceGet(&d->device, ordinal), "cuDeviceGet(%d)", ordinal);
  if (status != KILN_OK) return status;
  d->cc_major = attribute(d->device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  d->cc_minor = attribute(d->device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  d->sm_count = attribute(d->device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  if (d->sm_count < 1) d->sm_count = 1;
  /* Enough resident blocks to fill every SM several times over; grid-stride
   * loops cover the rest. */
  d->max_grid = d->sm_count * 32;
  status = kiln_cuda_check(cuDevicePrimaryCtxRetain(&d->context, d->device), "cuDevicePrimaryCtxRetain(cuda:%d)",
                           ordinal);
  if (status != KILN_OK) return status;
  if ((status = kiln_cuda_enter(d)) != KILN_OK) return status;

  status = kiln_cuda_check(cuStreamCreate(&d->alloc_stream, CU_STREAM_NON_BLOCKING),
                           "cuStreamCreate (allocation stream of cuda:%d)", ordinal);
  if (status == KILN_OK && attribute(d->device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) &&
      cuDeviceGetDefaultMemPool(&d->pool, d->device) == CUDA_SUCCESS) {
    /* Keep freed memory in the pool instead of returning it to the driver
     * at every synchronisation: that is what makes per-op results cheap. */
    cuuint64_t threshold = UINT64_MAX;
    d->pools = cuMemPoolSetAttribute(d->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == CUDA_SUCCESS;
  }
  if (status == KILN_OK) kiln_cuda_module_load(d);
  kiln_cuda_leave();
  return status;
}

static void close_device(kiln_backend_device_t *d) {
  if (!d->context) return;
  if (kiln_cuda_enter(d) == KILN_OK) {
    kiln_cuda_cudnn_device_release(d);
    kiln_cuda_module_unload(d);
    if (d->alloc_stream) {
      (void)cuStreamSynchronize(d->alloc_stream);
      (void)cuStreamDestroy(d->alloc_stream);
      d->alloc_stream = NULL;
    }
    if (d->pools) (void)cuMemPoolTrimTo(d->pool, 0);
    kiln_cuda_leave();
  }
  (void)cuDevicePrimaryCtxRelease(d->device);
  d->context = NULL;
  pthread_mutex_destroy(&d->cudnn_lock);
}

static void cuda_deinitialize(void) {
  for (size_t i = 0; i < kiln_cuda_device_count_; i++) close_device(&kiln_cuda_devices_[i]);
  free(kiln_cuda_devices_);
  kiln_cuda_devices_ = NULL;
  kiln_cuda_device_count_ = 0;
  kiln_cuda_cublas_unload();
  kiln_cuda_cudnn_unload();
}

/* Direct peer access where the hardware allows it; cuMemcpyPeerAsync works
 * without it too (staged by the driver), so failures only cost speed. */
static void enable_peers(void) {
  for (size_t i = 0; i < kiln_cuda_device_count_; i++) {
    kiln_backend_device_t *a = &kiln_cuda_devices_[i];
    if (a->open_status != KILN_OK || kiln_cuda_enter(a) != KILN_OK) continue;
    for (size_t j = 0; j < kiln_cuda_device_count_; j++) {
      int can = 0;
      if (i == j || !kiln_cuda_devices_[j].context ||
          cuDeviceCanAccessPeer(&can, a->device, kiln_cuda_devices_[j].device) != CUDA_SUCCESS || !can)
        continue;
      CUresult r = cuCtxEnablePeerAccess(kiln_cuda_devices_[j].context, 0);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED && kiln_cuda_host.log)
        kiln_cuda_host.log(KILN_LOG_DEBUG, "cuda:%zu -> cuda:%zu: cuCtxEnablePeerAccess returned %d; copies are staged",
                           i, j, (int)r);
    }
    kiln_cuda_leave();
  }
}

static kiln_status_t cuda_initialize(const kiln_host_t *host) {
  kiln_cuda_host = *host;
  kiln_status_t status = read_tf32_setting();
  if (status == KILN_OK) status = kiln_cuda_read_vendor_libs_setting();
  if (status != KILN_OK) return status;

  CUresult r = cuInit(0);
  int driver_version = 0;
  (void)cuDriverGetVersion(&driver_version);
  char driver_text[32];
  format_cuda_version(driver_version, driver_text, sizeof driver_text);
  if (r == CUDA_ERROR_NO_DEVICE) {
    /* The driver is installed but sees no GPU (none present, or hidden by
     * CUDA_VISIBLE_DEVICES): not an error, zero devices and a reason. */
    snprintf(version_text, sizeof version_text, "CUDA driver %s", driver_text);
    kiln_cuda_error(KILN_UNAVAILABLE,
                             "driver present, no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE; check nvidia-smi and "
                             "CUDA_VISIBLE_DEVICES)");
    if (kiln_cuda_host.log) kiln_cuda_host.log(KILN_LOG_INFO, "cuda: driver present, no CUDA device");
    return KILN_OK;
  }
  if (r == CUDA_ERROR_STUB_LIBRARY)
    return kiln_cuda_error(KILN_UNAVAILABLE,
                           "cuInit failed: CUDA_ERROR_STUB_LIBRARY (34): the libcuda.so.1 that loaded is the CUDA "
                           "toolkit's link stub, not the NVIDIA driver; remove the toolkit's lib64/stubs folder from "
                           "LD_LIBRARY_PATH, or install the driver");
  if (r != CUDA_SUCCESS)
    return kiln_cuda_error(KILN_UNAVAILABLE,
                           "cuInit failed: %s (%d); the NVIDIA driver cannot be used here (check nvidia-smi and the "
                           "kernel module); kiln's other backends still work",
                           kiln_cuda_result_name(r), (int)r);

  int count = 0;
  if ((status = kiln_cuda_check(cuDeviceGetCount(&count), "cuDeviceGetCount")) != KILN_OK)
    return kiln_cuda_error(KILN_UNAVAILABLE, "cuDeviceGetCount failed after cuInit succeeded; "
                                                      "check the driver with nvidia-smi");

  /* Vendor libraries are optional: their absence disables a provider only. */
  char reason[200];
  if (kiln_cuda_cublas_load(reason, sizeof reason))
    snprintf(cublas_state, sizeof cublas_state, "%s", kiln_cuda_cublas_version());
  else
    snprintf(cublas_state, sizeof cublas_state, "absent: %s", reason);
  if (kiln_cuda_cudnn_load(reason, sizeof reason))
    snprintf(cudnn_state, sizeof cudnn_state, "%s", kiln_cuda_cudnn_version());
  else
    snprintf(cudnn_state, sizeof cudnn_state, "absent: %s", reason);

  if (count > 0) {
    kiln_cuda_devices_ = calloc((size_t)count, sizeof *kiln_cuda_devices_);
    if (!kiln_cuda_devices_)
      return kiln_cuda_error(KILN_OUT_OF_MEMORY, "out of host memory for %d CUDA devices", count);
  }
  kiln_cuda_device_count_ = (size_t)count;
  for (int i = 0; i < count; i++) {
    kiln_backend_device_t *d = &kiln_cuda_devices_[i];
    d->open_status = open_device(d, i);
    if (d->open_status != KILN_OK) {
      /* One device that cannot open (exclusive-process mode taken by another
       * program, a fault) must not hide the others: describe reports it. */
      snprintf(d->open_error, sizeof d->open_error, "%s", kiln_cuda_last_message());
      if (kiln_cuda_host.log) kiln_cuda_host.log(KILN_LOG_WARN, "cuda:%d cannot be opened: %s", i, d->open_error);
    }
  }
  enable_peers();
  for (size_t i = 0; i < kiln_cuda_device_count_; i++)
    if (kiln_cuda_devices_[i].open_status == KILN_OK) describe(&kiln_cuda_devices_[i], driver_version);

  snprintf(version_text, sizeof version_text, "CUDA driver %s, toolkit %d.%d; %s; %s", driver_text,
           CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10,
           kiln_cuda_cublas_available() ? kiln_cuda_cublas_version() : "no cuBLAS",
           kiln_cuda_cudnn_available() ? kiln_cuda_cudnn_version() : "no cuDNN");
  return KILN_OK;
}

static size_t cuda_device_count(void) { return kiln_cuda_device_count_; }

static kiln_status_t cuda_device_describe(size_t index, kiln_backend_device_desc_t *out_desc) {
  const kiln_backend_device_t *d = &kiln_cuda_devices_[index];
  if (d->open_status != KILN_OK)
    return kiln_cuda_error(d->open_status, "cuda:%zu could not be opened at start-up: %s", index,
                                    d->open_error);
  *out_desc = kiln_cuda_devices_[index].desc;
  return KILN_OK;
}

static kiln_status_t cuda_device_memory_free(kiln_backend_device_t *device, uint64_t *out_bytes) {
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  size_t free_bytes = 0, total = 0;
  status = kiln_cuda_check(cuMemGetInfo(&free_bytes, &total), "cuMemGetInfo (cuda:%d)", device->ordinal);
  if (status == KILN_OK) {
    uint64_t bytes = free_bytes;
    /* Memory the pool holds but no buffer uses is free for kiln's purposes. */
    cuuint64_t reserved = 0, in_use = 0;
    if (device->pools && cuMemPoolGetAttribute(device->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == CUDA_SUCCESS &&
        cuMemPoolGetAttribute(device->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &in_use) == CUDA_SUCCESS &&
        reserved > in_use)
      bytes += reserved - in_use;
    *out_bytes = bytes;
  }
  kiln_cuda_leave();
  return status;
}

/* memory.c and queue.c */
kiln_status_t kiln_cuda_buffer_allocate(kiln_backend_device_t *device, size_t size, kiln_backend_buffer_t **out_buffer);
void kiln_cuda_buffer_free(kiln_backend_device_t *device, kiln_backend_buffer_t *buffer);
kiln_status_t kiln_cuda_host_allocate(kiln_backend_device_t *device, size_t size, void **out_ptr);
void kiln_cuda_host_free(kiln_backend_device_t *device, void *ptr);
kiln_status_t kiln_cuda_buffer_write(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                     const void *host, size_t size, bool blocking);
kiln_status_t kiln_cuda_buffer_read(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                    void *host, size_t size, bool blocking);
kiln_status_t kiln_cuda_buffer_copy(kiln_backend_queue_t *queue, kiln_backend_buffer_t *src, size_t src_offset,
                                    kiln_backend_buffer_t *dst, size_t dst_offset, size_t size);
kiln_status_t kiln_cuda_buffer_fill(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                    size_t size, const void *pattern, size_t pattern_size);
kiln_status_t kiln_cuda_queue_create(kiln_backend_device_t *device, kiln_backend_queue_t **out_queue);
void kiln_cuda_queue_destroy(kiln_backend_queue_t *queue);
kiln_status_t kiln_cuda_queue_finish(kiln_backend_queue_t *queue);
kiln_status_t kiln_cuda_queue_record(kiln_backend_queue_t *queue, kiln_backend_event_t **out_event);
kiln_status_t kiln_cuda_queue_wait(kiln_backend_queue_t *queue, kiln_backend_event_t *event);
kiln_status_t kiln_cuda_event_wait(kiln_backend_event_t *event);
kiln_status_t kiln_cuda_event_query(kiln_backend_event_t *event);
kiln_status_t kiln_cuda_event_elapsed(kiln_backend_event_t *start, kiln_backend_event_t *end, double *out_ms);
void kiln_cuda_event_release(kiln_backend_event_t *event);

static const kiln_backend_iface_t cuda_iface = {
  .abi_version = KILN_BACKEND_ABI_VERSION,
  .name = "cuda",
  .version = version_text,
  .initialize = cuda_initialize,
  .deinitialize = cuda_deinitialize,
  .device_count = cuda_device_count,
  .device_describe = cuda_device_describe,
  .device_memory_free = cuda_device_memory_free,
  .buffer_allocate = kiln_cuda_buffer_allocate,
  .buffer_free = kiln_cuda_buffer_free,
  .buffer_host_pointer = NULL, /* device memory is not host-addressable */
  .host_allocate = kiln_cuda_host_allocate,
  .host_free = kiln_cuda_host_free,
  .queue_create = kiln_cuda_queue_create,
  .queue_destroy = kiln_cuda_queue_destroy,
  .queue_finish = kiln_cuda_queue_finish,
  .queue_record = kiln_cuda_queue_record,
  .queue_wait = kiln_cuda_queue_wait,
  .event_wait = kiln_cuda_event_wait,
  .event_query = kiln_cuda_event_query,
  .event_elapsed = kiln_cuda_event_elapsed,
  .event_release = kiln_cuda_event_release,
  .buffer_write = kiln_cuda_buffer_write,
  .buffer_read = kiln_cuda_buffer_read,
  .buffer_copy = kiln_cuda_buffer_copy,
  .buffer_fill = kiln_cuda_buffer_fill,
  .op_providers = kiln_cuda_op_providers,
  .op_run = kiln_cuda_op_run,
};

KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void);
KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void) { return &cuda_iface; }
