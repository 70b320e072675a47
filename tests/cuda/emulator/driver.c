/* tests/cuda/emulator/driver.c: the test driver's start-up, devices and their attributes, primary contexts and the per-thread context stack, handles, diagnostics. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

/* The emulated device and what the driver keeps about it are modelled on
 * CUDA 13's driver API as the toolkit's cuda.h declares it; where the real
 * driver is more lenient than a rule kiln follows anyway (which context is
 * current for pool calls), this one is strict, and says so when it refuses. */

pthread_mutex_t fc_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t fc_done = PTHREAD_COND_INITIALIZER;
fc_device_t fc_devices[FC_MAX_DEVICES];
int fc_device_count;
bool fc_initialized;

atomic_ulong fc_stat_launches, fc_stat_blocks, fc_stat_threads, fc_stat_rejected;
atomic_ulong *fc_stat_kernel_launches;

/* ---- diagnostics ------------------------------------------------------------------------ */

static const struct {
  CUresult result;
  const char *name, *text;
} result_table[] = {
#define FC_RESULT_(NAME, TEXT) {NAME, #NAME, TEXT},
    FC_RESULT_(CUDA_SUCCESS, "no error")
    FC_RESULT_(CUDA_ERROR_INVALID_VALUE, "invalid argument")
    FC_RESULT_(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")
    FC_RESULT_(CUDA_ERROR_NOT_INITIALIZED, "initialization error")
    FC_RESULT_(CUDA_ERROR_DEINITIALIZED, "driver shutting down")
    FC_RESULT_(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")
    FC_RESULT_(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")
    FC_RESULT_(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")
    FC_RESULT_(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")
    FC_RESULT_(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")
    FC_RESULT_(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device")
    FC_RESULT_(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices")
    FC_RESULT_(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")
    FC_RESULT_(CUDA_ERROR_NOT_FOUND, "named symbol not found")
    FC_RESULT_(CUDA_ERROR_NOT_READY, "device not ready")
    FC_RESULT_(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")
    FC_RESULT_(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")
    FC_RESULT_(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")
    FC_RESULT_(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled")
    FC_RESULT_(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled")
    FC_RESULT_(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process")
    FC_RESULT_(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")
    FC_RESULT_(CUDA_ERROR_ASSERT, "device-side assert triggered")
    FC_RESULT_(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")
    FC_RESULT_(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")
    FC_RESULT_(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")
    FC_RESULT_(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")
    FC_RESULT_(CUDA_ERROR_ILLEGAL_STATE, "the operation is not permitted in the current state")
    FC_RESULT_(CUDA_ERROR_UNKNOWN, "unknown error")
#undef FC_RESULT_
};

_Static_assert(CUDA_ERROR_ASSERT == FAKECUDA_ERROR_ASSERT, "fakecuda_abi.h's CUresult values");
_Static_assert(CUDA_ERROR_MISALIGNED_ADDRESS == FAKECUDA_ERROR_MISALIGNED_ADDRESS, "fakecuda_abi.h's CUresult values");
_Static_assert(CUDA_ERROR_LAUNCH_FAILED == FAKECUDA_ERROR_LAUNCH_FAILED, "fakecuda_abi.h's CUresult values");

const char *fc_result_name(CUresult result) {
  for (size_t i = 0; i < sizeof result_table / sizeof result_table[0]; i++)
    if (result_table[i].result == result) return result_table[i].name;
  return "CUDA_ERROR_UNKNOWN";
}

CUresult cuGetErrorName(CUresult error, const char **pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof result_table / sizeof result_table[0]; i++)
    if (result_table[i].result == error) {
      *pStr = result_table[i].name;
      return CUDA_SUCCESS;
    }
  *pStr = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof result_table / sizeof result_table[0]; i++)
    if (result_table[i].result == error) {
      *pStr = result_table[i].text;
      return CUDA_SUCCESS;
    }
  *pStr = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult fc_reject(CUresult result, const char *call, const char *fmt, ...) {
  char why[768];
  va_list args;
  va_start(args, fmt);
  vsnprintf(why, sizeof why, fmt, args);
  va_end(args);
  atomic_fetch_add(&fc_stat_rejected, 1);
  fprintf(stderr, "kiln-fakecuda: error: %s: %s: %s\n", call, fc_result_name(result), why);
  return result;
}

void fc_complain(const char *fmt, ...) {
  char why[768];
  va_list args;
  va_start(args, fmt);
  vsnprintf(why, sizeof why, fmt, args);
  va_end(args);
  atomic_fetch_add(&fc_stat_rejected, 1);
  fprintf(stderr, "kiln-fakecuda: error: %s\n", why);
}

/* ---- handles: a sorted array of the live ones ------------------------------------------ */

static const void **handles;
static size_t handle_count, handle_capacity;

static size_t handle_slot(const void *handle) {
  size_t lo = 0, hi = handle_count;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if ((uintptr_t)handles[mid] < (uintptr_t)handle)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

void fc_handle_add(const void *handle) {
  if (handle_count == handle_capacity) {
    const size_t capacity = handle_capacity ? handle_capacity * 2 : 256;
    const void **grown = realloc(handles, capacity * sizeof *grown);
    if (!grown) abort(); /* a test tool: running out of host memory here ends the run */
    handles = grown;
    handle_capacity = capacity;
  }
  const size_t at = handle_slot(handle);
  memmove(&handles[at + 1], &handles[at], (handle_count - at) * sizeof *handles);
  handles[at] = handle;
  handle_count++;
}

void fc_handle_remove(const void *handle) {
  const size_t at = handle_slot(handle);
  if (at < handle_count && handles[at] == handle) {
    memmove(&handles[at], &handles[at + 1], (handle_count - at - 1) * sizeof *handles);
    handle_count--;
  }
}

void fc_handles_each(fc_kind_t kind, void (*fn)(void *handle, void *arg), void *arg) {
  pthread_mutex_lock(&fc_lock);
  size_t count = 0;
  for (size_t i = 0; i < handle_count; i++) count += *(const fc_kind_t *)handles[i] == kind;
  void **snapshot = malloc((count ? count : 1) * sizeof *snapshot);
  if (!snapshot) abort();
  count = 0;
  for (size_t i = 0; i < handle_count; i++)
    if (*(const fc_kind_t *)handles[i] == kind) snapshot[count++] = (void *)handles[i];
  pthread_mutex_unlock(&fc_lock);
  for (size_t i = 0; i < count; i++) fn(snapshot[i], arg);
  free(snapshot);
}

bool fc_handle_is(const void *handle, fc_kind_t kind) {
  if (!handle) return false;
  const size_t at = handle_slot(handle);
  return at < handle_count && handles[at] == handle && *(const fc_kind_t *)handle == kind;
}

/* ---- the per-thread stack of current contexts --------------------------------------------- */

#define FC_CONTEXT_STACK 64

static _Thread_local struct {
  struct CUctx_st *items[FC_CONTEXT_STACK];
  int depth;
} context_stack;
static pthread_key_t exit_key;

/* A thread that ends with contexts still pushed popped fewer than it pushed:
 * in kiln, where only the plugin touches CUDA, a kiln_cuda_enter without its
 * kiln_cuda_leave. */
static void thread_exit_check(void *marker) {
  (void)marker;
  if (context_stack.depth > 0)
    fc_complain("a thread exited with %d context(s) still pushed: cuCtxPushCurrent without cuCtxPopCurrent",
                context_stack.depth);
}

struct CUctx_st *fc_current(void) {
  return context_stack.depth > 0 ? context_stack.items[context_stack.depth - 1] : NULL;
}

CUresult fc_require_init(const char *call) {
  if (!fc_initialized)
    return fc_reject(CUDA_ERROR_NOT_INITIALIZED, call, "called before cuInit");
  return CUDA_SUCCESS;
}

struct CUctx_st *fc_require_context(const char *call, CUresult *out_result) {
  if ((*out_result = fc_require_init(call)) != CUDA_SUCCESS) return NULL;
  struct CUctx_st *ctx = fc_current();
  if (!ctx) {
    *out_result = fc_reject(CUDA_ERROR_INVALID_CONTEXT, call, "called with no current context on this thread");
    return NULL;
  }
  pthread_mutex_lock(&fc_lock);
  const int refs = ctx->primary_refs;
  const CUresult sticky = ctx->sticky;
  pthread_mutex_unlock(&fc_lock);
  if (refs <= 0) {
    *out_result = fc_reject(CUDA_ERROR_INVALID_CONTEXT, call,
                            "the current context is the primary context of device %d, released (its retain count is "
                            "0) while still pushed",
                            ctx->device->ordinal);
    return NULL;
  }
  if (sticky != CUDA_SUCCESS) {
    /* The fault was reported when it happened; the context stays unusable. */
    *out_result = sticky;
    return NULL;
  }
  return ctx;
}

fc_device_t *fc_device_of(CUdevice device, const char *call, CUresult *out_result) {
  if ((*out_result = fc_require_init(call)) != CUDA_SUCCESS) return NULL;
  if (device < 0 || device >= fc_device_count) {
    *out_result = fc_reject(CUDA_ERROR_INVALID_DEVICE, call, "device %d does not exist (there are %d)", device,
                            fc_device_count);
    return NULL;
  }
  return &fc_devices[device];
}

/* ---- start-up ------------------------------------------------------------------------------ */

static void write_report(void) {
  const char *path = getenv("KILN_FAKECUDA_REPORT");
  if (!path || !*path) return;
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kiln-fakecuda: cannot write KILN_FAKECUDA_REPORT=%s\n", path);
    return;
  }
  fprintf(f, "launches %lu\nblocks %lu\nthreads %lu\nrejected %lu\n", atomic_load(&fc_stat_launches),
          atomic_load(&fc_stat_blocks), atomic_load(&fc_stat_threads), atomic_load(&fc_stat_rejected));
  for (unsigned k = 0; k < fakecuda__kernel_count; k++)
    fprintf(f, "kernel %s %lu\n", fakecuda__kernels[k].name,
            fc_stat_kernel_launches ? atomic_load(&fc_stat_kernel_launches[k]) : 0ul);
  fclose(f);
}

static void at_exit(void) {
  if (context_stack.depth > 0)
    fc_complain("the program ends with %d context(s) still pushed on its main thread: cuCtxPushCurrent without "
                "cuCtxPopCurrent",
                context_stack.depth);
  write_report();
}

/* A small integer from the environment, or -1 (with a complaint) when the
 * value is malformed. */
static int read_count(const char *name, int fallback, int low, int high) {
  const char *value = getenv(name);
  if (!value || !*value) return fallback;
  char *end;
  const long v = strtol(value, &end, 10);
  if (*end || v < low || v > high) {
    fprintf(stderr, "kiln-fakecuda: error: %s='%s' is not an integer from %d to %d\n", name, value, low, high);
    return -1;
  }
  return (int)v;
}

CUresult cuInit(unsigned int Flags) {
  if (Flags != 0) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuInit", "Flags must be 0, got %u", Flags);
  pthread_mutex_lock(&fc_lock);
  CUresult result = CUDA_SUCCESS;
  if (!fc_initialized) {
    /* KILN_FAKECUDA_DEVICES: how many devices (0: the driver sees none);
     * KILN_FAKECUDA_CC: their compute capability, "9.0" by default. */
    const int count = read_count("KILN_FAKECUDA_DEVICES", 1, 0, FC_MAX_DEVICES);
    /* KILN_FAKECUDA_POOLS=0: devices without stream-ordered allocation. */
    const int pools = read_count("KILN_FAKECUDA_POOLS", 1, 0, 1);
    int major = 9, minor = 0;
    const char *cc = getenv("KILN_FAKECUDA_CC");
    if (cc && *cc && (sscanf(cc, "%d.%d", &major, &minor) != 2 || major < 1 || major > 20 || minor < 0 || minor > 9)) {
      fprintf(stderr, "kiln-fakecuda: error: KILN_FAKECUDA_CC='%s' is not a compute capability such as 9.0\n", cc);
      major = -1;
    }
    if (count < 0 || pools < 0 || major < 0) {
      pthread_mutex_unlock(&fc_lock);
      return CUDA_ERROR_INVALID_VALUE;
    }
    fc_stat_kernel_launches = calloc(fakecuda__kernel_count ? fakecuda__kernel_count : 1, sizeof *fc_stat_kernel_launches);
    if (!fc_stat_kernel_launches) {
      pthread_mutex_unlock(&fc_lock);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < count; i++) {
      fc_device_t *d = &fc_devices[i];
      d->ordinal = i;
      d->cc_major = major;
      d->cc_minor = minor;
      d->total_bytes = FC_MEMORY_BYTES;
      d->pools = pools == 1;
      d->primary = calloc(1, sizeof *d->primary);
      d->pool = calloc(1, sizeof *d->pool);
      if (!d->primary || !d->pool) abort();
      d->primary->kind = FC_KIND_CONTEXT;
      d->primary->device = d;
      d->pool->kind = FC_KIND_POOL;
      d->pool->device = d;
      fc_handle_add(d->primary);
      fc_handle_add(d->pool);
    }
    fc_device_count = count;
    pthread_key_create(&exit_key, thread_exit_check);
    atexit(at_exit);
    fc_initialized = true;
  }
  if (fc_device_count == 0) result = CUDA_ERROR_NO_DEVICE;
  pthread_mutex_unlock(&fc_lock);
  return result;
}

CUresult cuDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDriverGetVersion", "driverVersion is NULL");
  *driverVersion = FC_DRIVER_VERSION;
  return CUDA_SUCCESS;
}

/* ---- devices ----------------------------------------------------------------------------- */

CUresult cuDeviceGetCount(int *count) {
  CUresult r = fc_require_init("cuDeviceGetCount");
  if (r != CUDA_SUCCESS) return r;
  if (!count) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount", "count is NULL");
  *count = fc_device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  CUresult r;
  if (!fc_device_of(ordinal, "cuDeviceGet", &r)) return r;
  if (!device) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet", "device is NULL");
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDeviceGetName", &r);
  if (!d) return r;
  if (!name || len <= 0) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName", "name is NULL or len %d", len);
  snprintf(name, (size_t)len, "kiln emulated GPU sm_%d%d (test driver)", d->cc_major, d->cc_minor);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDeviceGetUuid", &r);
  if (!d) return r;
  if (!uuid) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetUuid", "uuid is NULL");
  /* "kilnfake" then the ordinal, with the version nibble of a random UUID. */
  memcpy(uuid->bytes, "kilnfake\x40\x00\x80\x00\x00\x00\x00", 16);
  uuid->bytes[15] = (char)d->ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDeviceGetPCIBusId", &r);
  if (!d) return r;
  if (!pciBusId || len < 13)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetPCIBusId", "pciBusId is NULL or len %d < 13", len);
  /* Upper-case hex, as the driver writes it. */
  snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", 0x1a + 0x10 * d->ordinal);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDeviceTotalMem", &r);
  if (!d) return r;
  if (!bytes) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem", "bytes is NULL");
  *bytes = d->total_bytes;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDeviceGetAttribute", &r);
  if (!d) return r;
  if (!pi) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "pi is NULL");
  int v;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = (int)FC_MAX_THREADS_PER_BLOCK; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = (int)FC_MAX_BLOCK_X; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = (int)FC_MAX_BLOCK_Y; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = (int)FC_MAX_BLOCK_Z; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = (int)FC_MAX_GRID_X; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = (int)FC_MAX_GRID_YZ; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = (int)FC_SHARED_PER_BLOCK; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = (int)FC_SHARED_PER_BLOCK_OPTIN; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = (int)FC_SHARED_PER_SM; break;
  case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: v = 1024; break;
  case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = FC_WARP; break;
  case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = (int)FC_REGISTERS_PER_BLOCK; break;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 << 20; break;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = FC_SM_COUNT; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
  case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = d->cc_major; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = d->cc_minor; break;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x1a + 0x10 * d->ordinal; break;
  case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
  case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
  case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT:
  case CU_DEVICE_ATTRIBUTE_INTEGRATED:
  case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
  case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD:
  case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: /* CU_COMPUTEMODE_DEFAULT */
  case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: v = 0; break;
  case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
  case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
  case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
  case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = d->pools; break;
  default:
    /* A real driver answers every attribute; this one answers what kiln
     * reads, and says so for the rest rather than guess. */
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute",
                     "attribute %d is not modelled by the test driver; add it to tests/cuda/emulator/driver.c",
                     (int)attrib);
  }
  *pi = v;
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
  CUresult r;
  if (!fc_device_of(dev, "cuDeviceCanAccessPeer", &r) || !fc_device_of(peerDev, "cuDeviceCanAccessPeer", &r)) return r;
  if (!canAccessPeer) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceCanAccessPeer", "canAccessPeer is NULL");
  *canAccessPeer = dev != peerDev;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDeviceGetDefaultMemPool", &r);
  if (!d) return r;
  if (!pool_out) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetDefaultMemPool", "pool_out is NULL");
  if (!d->pools)
    return fc_reject(CUDA_ERROR_NOT_SUPPORTED, "cuDeviceGetDefaultMemPool",
                     "device %d has no memory pools (KILN_FAKECUDA_POOLS=0; check "
                     "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED first)",
                     dev);
  *pool_out = d->pool;
  return CUDA_SUCCESS;
}

/* ---- primary contexts and the context stack ------------------------------------------------ */

static void report_leaks(fc_device_t *d, struct CUctx_st *ctx);

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDevicePrimaryCtxRetain", &r);
  if (!d) return r;
  if (!pctx) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain", "pctx is NULL");
  pthread_mutex_lock(&fc_lock);
  d->primary->primary_refs++;
  pthread_mutex_unlock(&fc_lock);
  *pctx = d->primary;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  CUresult r;
  fc_device_t *d = fc_device_of(dev, "cuDevicePrimaryCtxRelease", &r);
  if (!d) return r;
  struct CUctx_st *ctx = d->primary;
  pthread_mutex_lock(&fc_lock);
  if (ctx->primary_refs <= 0) {
    pthread_mutex_unlock(&fc_lock);
    return fc_reject(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease",
                     "the primary context of device %d is released more often than it was retained", dev);
  }
  const bool last = --ctx->primary_refs == 0;
  const bool faulted = ctx->sticky != CUDA_SUCCESS;
  pthread_mutex_unlock(&fc_lock);
  if (!last) return CUDA_SUCCESS;
  /* The context goes away, and with it what it still holds, as in the
   * driver. That is reported, since kiln's plugin must release everything
   * first; after a fault it cannot, and the fault was reported already. */
  if (!faulted) report_leaks(d, ctx);
  fc_context_streams_destroy(ctx);
  fc_context_events_destroy(ctx);
  fc_context_modules_destroy(ctx);
  fc_device_memory_release(d);
  pthread_mutex_lock(&fc_lock);
  ctx->peers = 0;
  ctx->sticky = CUDA_SUCCESS;
  pthread_mutex_unlock(&fc_lock);
  return CUDA_SUCCESS;
}

static void report_leaks(fc_device_t *d, struct CUctx_st *ctx) {
  const int dev = d->ordinal;
  for (int i = 0; i < context_stack.depth; i++)
    if (context_stack.items[i] == ctx) {
      fc_complain("the primary context of device %d was released for the last time while pushed on this thread",
                  dev);
      break;
    }
  size_t bytes = 0;
  const size_t allocations = fc_live_allocations(d, FC_ALLOC_DEVICE, &bytes);
  if (allocations)
    fc_complain("the primary context of device %d was released for the last time with %zu device allocation(s) "
                "(%zu bytes) not freed",
                dev, allocations, bytes);
  const size_t streams = fc_live_streams(ctx), events = fc_live_events(ctx), modules = fc_live_modules(ctx);
  if (streams || events || modules)
    fc_complain("the primary context of device %d was released for the last time with %zu stream(s), %zu "
                "event(s) and %zu module(s) not destroyed",
                dev, streams, events, modules);
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  CUresult r = fc_require_init("cuCtxPushCurrent");
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc_lock);
  const bool valid = fc_handle_is(ctx, FC_KIND_CONTEXT);
  const int refs = valid ? ctx->primary_refs : 0;
  pthread_mutex_unlock(&fc_lock);
  if (!valid) return fc_reject(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent", "%p is not a context", (void *)ctx);
  if (refs <= 0)
    return fc_reject(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent",
                     "the primary context of device %d is not retained (cuDevicePrimaryCtxRetain first)",
                     ctx->device->ordinal);
  if (context_stack.depth == FC_CONTEXT_STACK)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuCtxPushCurrent",
                     "%d contexts are pushed on this thread already: pushes without pops?", FC_CONTEXT_STACK);
  context_stack.items[context_stack.depth++] = ctx;
  pthread_setspecific(exit_key, &context_stack);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx) {
  CUresult r = fc_require_init("cuCtxPopCurrent");
  if (r != CUDA_SUCCESS) return r;
  if (context_stack.depth == 0)
    return fc_reject(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent", "no context is current on this thread");
  struct CUctx_st *ctx = context_stack.items[--context_stack.depth];
  if (pctx) *pctx = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  CUresult r = fc_require_init("cuCtxGetCurrent");
  if (r != CUDA_SUCCESS) return r;
  if (!pctx) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent", "pctx is NULL");
  *pctx = fc_current();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuCtxGetDevice", &r);
  if (!ctx) return r;
  if (!device) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuCtxGetDevice", "device is NULL");
  *device = ctx->device->ordinal;
  return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuCtxEnablePeerAccess", &r);
  if (!ctx) return r;
  if (Flags != 0) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuCtxEnablePeerAccess", "Flags must be 0, got %u", Flags);
  pthread_mutex_lock(&fc_lock);
  const bool valid = fc_handle_is(peerContext, FC_KIND_CONTEXT) && peerContext->primary_refs > 0;
  pthread_mutex_unlock(&fc_lock);
  if (!valid)
    return fc_reject(CUDA_ERROR_INVALID_CONTEXT, "cuCtxEnablePeerAccess", "%p is not an active context",
                     (void *)peerContext);
  if (peerContext->device == ctx->device)
    return fc_reject(CUDA_ERROR_INVALID_DEVICE, "cuCtxEnablePeerAccess", "the peer is the current context's device");
  const unsigned bit = 1u << peerContext->device->ordinal;
  pthread_mutex_lock(&fc_lock);
  const bool already = (ctx->peers & bit) != 0;
  ctx->peers |= bit;
  pthread_mutex_unlock(&fc_lock);
  /* Not a misuse: the answer a program expects when it asks twice. */
  return already ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
}
