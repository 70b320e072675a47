/* backends/cuda/device.c: the CUDA plugin's entry point: driver start-up, device enumeration and properties, primary contexts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

kiln_status_t kiln_cuda_enter(kiln_backend_device_t *device) {
  CUresult r = cuCtxPushCurrent(device->context);
  if (r != CUDA_SUCCESS)
    return kiln_cuda_check(device->ctx, r, "cuCtxPushCurrent (the primary context of cuda:%d)", device->ordinal);
  return KILN_OK;
}

void kiln_cuda_leave(void) {
  CUcontext previous;
  (void)cuCtxPopCurrent(&previous);
}

/* One attribute of the device; 0 where the driver does not say. */
static int attribute(CUdevice device, CUdevice_attribute which) {
  int value = 0;
  if (cuDeviceGetAttribute(&value, which, device) != CUDA_SUCCESS) return 0;
  return value;
}

/* "13.0" from 13000. */
static void format_cuda_version(int version, char *out, size_t size) {
  snprintf(out, size, "%d.%d", version / 1000, (version % 1000) / 10);
}

/* KILN_CUDA_TF32: unset, "0" or "1"; anything else is refused, not guessed.
 * The core's settings come first; a variable only this plugin knows, which
 * the core does not parse, comes from the environment. */
static kiln_status_t read_tf32_setting(kiln_backend_context_t *ctx) {
  const char *value = ctx->host.setting ? ctx->host.setting("KILN_CUDA_TF32") : NULL;
  if (!value) value = getenv("KILN_CUDA_TF32");
  ctx->tf32 = false;
  if (!value || !*value || !strcmp(value, "0")) return KILN_OK;
  if (!strcmp(value, "1")) {
    ctx->tf32 = true;
    return KILN_OK;
  }
  return kiln_cuda_error(ctx, KILN_INVALID_ARGUMENT,
                         "KILN_CUDA_TF32='%s' is not valid: use 1 to let cuBLAS and cuDNN use TF32 tensor cores for "
                         "f32, or 0 (the default) for full f32 precision",
                         value);
}

/* KILN_CUDA_VENDOR_LIBS, from the core's settings or the environment. */
static kiln_status_t read_vendor_libs_setting(kiln_backend_context_t *ctx) {
  const char *value = ctx->host.setting ? ctx->host.setting("KILN_CUDA_VENDOR_LIBS") : NULL;
  if (!value) value = getenv("KILN_CUDA_VENDOR_LIBS");
  return kiln_cuda_vendor_libs_parse(ctx, value);
}

kiln_status_t kiln_cuda_driver_check(kiln_backend_context_t *ctx, int driver_version) {
  if (driver_version >= KILN_CUDA_DRIVER_MIN && cuEventElapsedTime != NULL) return KILN_OK;
  char have[32];
  format_cuda_version(driver_version, have, sizeof have);
  return kiln_cuda_error(ctx, KILN_UNAVAILABLE,
                         "the NVIDIA driver here supports CUDA %s (cuDriverGetVersion: %d), but kiln's CUDA backend "
                         "needs a driver for CUDA %d.%d or newer (it calls cuEventElapsedTime_v2), and its kernels "
                         "were built with CUDA toolkit %d.%d, whose code may need that driver version too: update "
                         "the NVIDIA driver; kiln's other backends still work",
                         driver_version > 0 ? have : "(unknown)", driver_version, KILN_CUDA_DRIVER_MIN / 1000,
                         (KILN_CUDA_DRIVER_MIN % 1000) / 10, CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10);
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

/* Whether `reader` accesses `owner`'s buffers directly: pool memory needs
 * the pool's access (cuMemPoolSetAccess), cuMemAlloc'd memory the
 * context's (cuCtxEnablePeerAccess). */
static bool peer_direct(kiln_backend_device_t *reader, kiln_backend_device_t *owner) {
  if (owner->open_status != KILN_OK || !owner->context) return false;
  int can = 0;
  if (cuDeviceCanAccessPeer(&can, reader->device, owner->device) != CUDA_SUCCESS || !can) return false;
  if (!owner->pools) return owner->ctx_peer_from & (1ull << (reader->ordinal & 63));
  CUmemLocation where;
  memset(&where, 0, sizeof where);
  where.type = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id = reader->ordinal;
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return cuMemPoolGetAccess(&flags, owner->pool, &where) == CUDA_SUCCESS && flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* Describe a device once, at start-up: everything devinfo -v shows. */
static void describe(kiln_backend_device_t *d) {
  const kiln_backend_context_t *ctx = d->ctx;
  const int driver_version = ctx->driver_version;
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

  kiln_backend_add_property(desc, "compiled_architectures", "%s", ctx->arch_text);
  char warning[384];
  kiln_cuda_coverage_warning(ctx, d->cc_major, d->cc_minor, warning, sizeof warning);
  if (!d->module)
    kiln_backend_add_property(desc, "warning", "kiln's kernels cannot run here: %s", d->module_error);
  else if (warning[0])
    kiln_backend_add_property(desc, "warning", "%s", warning);
  kiln_backend_add_property(desc, "providers", "native%s%s", ctx->cublas ? ",cublas" : "",
                            ctx->cudnn ? ",cudnn" : "");
  kiln_backend_add_property(desc, "cublas", "%s", ctx->cublas_state);
  if (ctx->cublas) kiln_backend_add_property(desc, "cublas_library", "%s", ctx->cublas_path);
  kiln_backend_add_property(desc, "cudnn", "%s", ctx->cudnn_state);
  if (ctx->cudnn) kiln_backend_add_property(desc, "cudnn_library", "%s", ctx->cudnn_path);
  kiln_backend_add_property(desc, "tf32", "%s",
               ctx->tf32 ? "on (KILN_CUDA_TF32=1): cuBLAS and cuDNN may round f32 inputs to TF32"
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
  if (d->pools)
    kiln_backend_add_property(desc, "memory_pool",
                              "kiln's own stream-ordered pool (cuMemPoolCreate), keeping up to %llu MiB of freed "
                              "memory; buffers allocated on the queue that uses them first",
                              (unsigned long long)(kiln_cuda_pool_threshold(desc->memory_bytes) >> 20));
  else
    kiln_backend_add_property(desc, "memory_pool", "cuMemAlloc (no stream-ordered allocation on this device)");
  kiln_backend_add_property(desc, "driver_api", "CUDA %s (the newest version the installed driver supports)",
               desc->runtime_version);
  kiln_backend_add_property(desc, "built_with", "CUDA toolkit %d.%d", CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10);

  /* Peers whose buffers this device reads and writes directly: access
   * granted by their pool (kiln's buffers come from it), or by their context
   * where they have no pool. Copies from the others are staged by the
   * driver. */
  char peers[256] = "";
  size_t used = 0;
  for (size_t j = 0; j < ctx->device_count; j++) {
    if ((int)j == d->ordinal || !peer_direct(d, &ctx->devices[j]) || used >= sizeof peers) continue;
    used += (size_t)snprintf(peers + used, sizeof peers - used, "%scuda:%zu", used ? "," : "", j);
  }
  kiln_backend_add_property(desc, "peer_access", "%s", peers[0] ? peers : "none");
}

/* Everything a device needs before work reaches it, in its primary context. */
static kiln_status_t open_device(kiln_backend_context_t *ctx, kiln_backend_device_t *d, int ordinal) {
  d->ctx = ctx;
  d->ordinal = ordinal;
  pthread_mutex_init(&d->event_lock, NULL);
  pthread_mutex_init(&d->kernel_lock, NULL);
  atomic_init(&d->cublas_failed, false);
  atomic_init(&d->cudnn_failed, false);
  kiln_status_t status = kiln_cuda_check(ctx, cuDeviceGet(&d->device, ordinal), "cuDeviceGet(%d)", ordinal);
  if (status != KILN_OK) return status;
  d->cc_major = attribute(d->device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  d->cc_minor = attribute(d->device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  d->sm_count = attribute(d->device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  if (d->sm_count < 1) d->sm_count = 1;
  /* Enough resident blocks to fill every SM several times over; grid-stride
   * loops cover the rest. */
  d->max_grid = d->sm_count * 32;
  status = kiln_cuda_check(ctx, cuDevicePrimaryCtxRetain(&d->context, d->device), "cuDevicePrimaryCtxRetain(cuda:%d)",
                           ordinal);
  if (status != KILN_OK) return status;
  if ((status = kiln_cuda_enter(d)) != KILN_OK) return status;

  status = kiln_cuda_check(ctx, cuStreamCreate(&d->alloc_stream, CU_STREAM_NON_BLOCKING),
                           "cuStreamCreate (allocation stream of cuda:%d)", ordinal);
  if (status == KILN_OK) kiln_cuda_pool_create(d);
  if (status == KILN_OK) status = kiln_cuda_cudnn_device_init(d);
  if (status == KILN_OK) kiln_cuda_module_load(d);
  kiln_cuda_leave();
  return status;
}

static void close_device(kiln_backend_device_t *d) {
  if (!d->ctx) return; /* never opened */
  if (d->context && kiln_cuda_enter(d) == KILN_OK) {
    kiln_cuda_events_free(d);
    kiln_cuda_module_unload(d);
    if (d->alloc_stream) {
      (void)cuStreamSynchronize(d->alloc_stream);
      (void)cuStreamDestroy(d->alloc_stream);
      d->alloc_stream = NULL;
    }
    kiln_cuda_pool_destroy(d);
    kiln_cuda_leave();
  }
  kiln_cuda_cudnn_device_release(d); /* host-side descriptors only */
  if (d->context) (void)cuDevicePrimaryCtxRelease(d->device);
  d->context = NULL;
  pthread_mutex_destroy(&d->event_lock);
  pthread_mutex_destroy(&d->kernel_lock);
}

static void cuda_deinitialize(kiln_backend_context_t *ctx) {
  if (!ctx) return;
  /* The pinned blocks cached for staging go first, while a context lives. */
  for (size_t i = 0; i < ctx->device_count; i++) {
    kiln_backend_device_t *d = &ctx->devices[i];
    if (d->open_status == KILN_OK && d->context && kiln_cuda_enter(d) == KILN_OK) {
      kiln_cuda_host_trim(&ctx->host_cache, true);
      kiln_cuda_leave();
      break;
    }
  }
  for (size_t i = 0; i < ctx->device_count; i++) close_device(&ctx->devices[i]);
  free(ctx->devices);
  kiln_cuda_cublas_unload(ctx);
  kiln_cuda_cudnn_unload(ctx);
  pthread_mutex_destroy(&ctx->host_cache.lock);
  free(ctx);
}

/* Direct peer access where the hardware allows it; cuMemcpyPeerAsync works
 * without it too (staged by the driver), so failures only cost speed.
 * kiln's buffers come from each device's pool, whose memory peers reach
 * only once the pool grants them access (cuMemPoolSetAccess; a context's
 * peer access does not cover pool memory); the contexts' peer access still
 * covers devices without pools, whose buffers come from cuMemAlloc. */
static void enable_peers(kiln_backend_context_t *ctx) {
  for (size_t i = 0; i < ctx->device_count; i++) {
    kiln_backend_device_t *a = &ctx->devices[i];
    if (a->open_status != KILN_OK || kiln_cuda_enter(a) != KILN_OK) continue;
    for (size_t j = 0; j < ctx->device_count; j++) {
      kiln_backend_device_t *b = &ctx->devices[j];
      int can = 0;
      if (i == j || b->open_status != KILN_OK || !b->context ||
          cuDeviceCanAccessPeer(&can, a->device, b->device) != CUDA_SUCCESS || !can)
        continue;
      /* a reads and writes b's memory: b's pool grants a access. */
      if (b->pools) {
        CUmemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = a->ordinal;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CUresult r = cuMemPoolSetAccess(b->pool, &access, 1);
        if (r != CUDA_SUCCESS && ctx->host.log)
          ctx->host.log(KILN_LOG_DEBUG, "cuda:%zu -> cuda:%zu: cuMemPoolSetAccess returned %s; copies are staged", i,
                        j, kiln_cuda_result_name(r));
      } else {
        CUresult r = cuCtxEnablePeerAccess(b->context, 0);
        if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
          b->ctx_peer_from |= 1ull << (a->ordinal & 63);
        else if (ctx->host.log)
          ctx->host.log(KILN_LOG_DEBUG, "cuda:%zu -> cuda:%zu: cuCtxEnablePeerAccess returned %s; copies are staged",
                        i, j, kiln_cuda_result_name(r));
      }
    }
    kiln_cuda_leave();
  }
}

/* Start the driver, load the vendor libraries and open every device. On an
 * error the caller frees what was made. */
static kiln_status_t start(kiln_backend_context_t *ctx) {
  kiln_status_t status = read_tf32_setting(ctx);
  if (status == KILN_OK) status = read_vendor_libs_setting(ctx);
  if (status != KILN_OK) return status;

  CUresult r = cuInit(0);
  (void)cuDriverGetVersion(&ctx->driver_version);
  char driver_text[32];
  format_cuda_version(ctx->driver_version, driver_text, sizeof driver_text);
  if (r == CUDA_ERROR_NO_DEVICE) {
    /* The driver is installed but sees no GPU (none present, or hidden by
     * CUDA_VISIBLE_DEVICES): not an error, zero devices and a reason. */
    snprintf(ctx->version_text, sizeof ctx->version_text, "CUDA driver %s", driver_text);
    kiln_cuda_error(ctx, KILN_UNAVAILABLE,
                    "driver present, no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE; check nvidia-smi and "
                    "CUDA_VISIBLE_DEVICES)");
    if (ctx->host.log) ctx->host.log(KILN_LOG_INFO, "cuda: driver present, no CUDA device");
    return KILN_OK;
  }
  if (r == CUDA_ERROR_STUB_LIBRARY)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE,
                           "cuInit failed: CUDA_ERROR_STUB_LIBRARY (34): the libcuda.so.1 that loaded is the CUDA "
                           "toolkit's link stub, not the NVIDIA driver; remove the toolkit's lib64/stubs folder from "
                           "LD_LIBRARY_PATH, or install the driver");
  if (r != CUDA_SUCCESS)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE,
                           "cuInit failed: %s (%d); the NVIDIA driver cannot be used here (check nvidia-smi and the "
                           "kernel module); kiln's other backends still work",
                           kiln_cuda_result_name(r), (int)r);
  if ((status = kiln_cuda_driver_check(ctx, ctx->driver_version)) != KILN_OK) return status;

  int count = 0;
  if (kiln_cuda_check(ctx, cuDeviceGetCount(&count), "cuDeviceGetCount") != KILN_OK)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE, "%s, after cuInit succeeded; check the driver with nvidia-smi",
                           ctx->host.last_error());

  /* Vendor libraries are optional: their absence disables a provider only. */
  char reason[sizeof ctx->cudnn_state - 16];
  if (kiln_cuda_cublas_load(ctx, reason, sizeof reason))
    snprintf(ctx->cublas_state, sizeof ctx->cublas_state, "%s", ctx->cublas_version);
  else
    snprintf(ctx->cublas_state, sizeof ctx->cublas_state, "absent: %s", reason);
  if (kiln_cuda_cudnn_load(ctx, reason, sizeof reason))
    snprintf(ctx->cudnn_state, sizeof ctx->cudnn_state, "%s", ctx->cudnn_version);
  else
    snprintf(ctx->cudnn_state, sizeof ctx->cudnn_state, "absent: %s", reason);

  if (count > 0) {
    ctx->devices = calloc((size_t)count, sizeof *ctx->devices);
    if (!ctx->devices) return kiln_cuda_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for %d CUDA devices", count);
  }
  ctx->device_count = (size_t)count;
  for (int i = 0; i < count; i++) {
    kiln_backend_device_t *d = &ctx->devices[i];
    d->open_status = open_device(ctx, d, i);
    if (d->open_status != KILN_OK) {
      /* One device that cannot open (exclusive-process mode taken by another
       * program, a fault) must not hide the others: describe reports it. */
      snprintf(d->open_error, sizeof d->open_error, "%s", ctx->host.last_error());
      if (ctx->host.log) ctx->host.log(KILN_LOG_WARN, "cuda:%d cannot be opened: %s", i, d->open_error);
    }
  }
  enable_peers(ctx);
  for (size_t i = 0; i < ctx->device_count; i++)
    if (ctx->devices[i].open_status == KILN_OK) describe(&ctx->devices[i]);

  snprintf(ctx->version_text, sizeof ctx->version_text, "CUDA driver %s, toolkit %d.%d; %s; %s", driver_text,
           CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10, ctx->cublas ? ctx->cublas_version : "no cuBLAS",
           ctx->cudnn ? ctx->cudnn_version : "no cuDNN");
  if (ctx->host.log) ctx->host.log(KILN_LOG_INFO, "cuda: %s", ctx->version_text);
  return KILN_OK;
}

static kiln_status_t cuda_initialize(const kiln_host_t *host, kiln_backend_context_t **out_ctx) {
  kiln_backend_context_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return host->set_error(KILN_OUT_OF_MEMORY, "out of host memory for the CUDA backend's context");
  kiln_cuda_host_cache_init(&ctx->host_cache);
  /* The core's table grows at its end: keep what both sides know, and the
   * slots this plugin knows but an older core lacks stay NULL. */
  memcpy(&ctx->host, host, host->size < sizeof ctx->host ? host->size : sizeof ctx->host);
  kiln_cuda_archs_parse(ctx);
  kiln_status_t status = start(ctx);
  if (status != KILN_OK) {
    cuda_deinitialize(ctx);
    return status;
  }
  *out_ctx = ctx;
  return KILN_OK;
}

static size_t cuda_device_count(kiln_backend_context_t *ctx) { return ctx->device_count; }

static kiln_status_t cuda_device_describe(kiln_backend_context_t *ctx, size_t index,
                                          kiln_backend_device_desc_t *out_desc) {
  const kiln_backend_device_t *d = &ctx->devices[index];
  if (d->open_status != KILN_OK)
    return kiln_cuda_error(ctx, d->open_status, "cuda:%zu could not be opened at start-up: %s", index, d->open_error);
  *out_desc = d->desc;
  return KILN_OK;
}

static kiln_status_t cuda_device_memory_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                             uint64_t *out_bytes) {
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  size_t free_bytes = 0, total = 0;
  status = kiln_cuda_check(ctx, cuMemGetInfo(&free_bytes, &total), "cuMemGetInfo (cuda:%d)", device->ordinal);
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

/* Every dtype is stored and converted on every CUDA device (kiln.cu,
 * through kernels/dtype_convert.h); f64, the integers and bool are the GPU's
 * own arithmetic; f16 and bf16 are computed in f32 and rounded to nearest
 * even on store, on every architecture (the rule of every kiln backend), so
 * they are emulated in kiln_dtype_support_t's sense. */
static int32_t cuda_dtype_support(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_dtype_t dtype) {
  (void)ctx;
  (void)device;
  switch (dtype) {
  case KILN_F16:
  case KILN_BF16: return KILN_DTYPE_EMULATED;
  default: return (unsigned)dtype < KILN_DTYPE_COUNT_ ? KILN_DTYPE_NATIVE : KILN_DTYPE_UNSUPPORTED;
  }
}

/* The driver, toolkit, cuBLAS and cuDNN versions found at start-up. */
static const char *cuda_version_text(kiln_backend_context_t *ctx) { return ctx->version_text; }

static const kiln_backend_iface_t cuda_iface = {
  .abi_version = KILN_BACKEND_ABI_VERSION,
  .size = sizeof(kiln_backend_iface_t),
  .name = "cuda",
  /* Static, as the table is: the versions of the driver, cuBLAS and cuDNN,
   * known once started, are each device's properties (devinfo -v) and the
   * context's version_text, logged at start-up. */
  .version = "CUDA toolkit " KILN_CUDA_TOOLKIT_VERSION " (driver API; cuBLAS and cuDNN loaded at run time)",
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
  .ops = kiln_cuda_ops,
  .version_text = cuda_version_text,
  .dlpack_device = kiln_cuda_dlpack_device,
  .buffer_handle = kiln_cuda_buffer_handle,
  .buffer_wrap = kiln_cuda_buffer_wrap,
  .buffer_allocate_on = kiln_cuda_buffer_allocate_on,
  .dtype_support = cuda_dtype_support,
};

KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void);
KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void) { return &cuda_iface; }
