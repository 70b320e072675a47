/* tests/cuda/emulator/memory.c: device memory over malloc: allocations and their registry, the stream-ordered pool, pinned host memory, copies and fills. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

/* Device pointers are host addresses (unified addressing): a kernel
 * dereferences them directly. Every allocation is its own malloc block, so
 * AddressSanitizer builds catch kernels that read past one; new device
 * memory is filled with 0xff bytes (NaN in f32, -1 in i32), as a GPU leaves
 * it holding whatever was there, so results that read unwritten memory show. */
#define FC_POISON 0xff
#define FC_DEVICE_ALIGNMENT 256

typedef struct fc_alloc_t {
  uintptr_t base;
  size_t size;
  fc_alloc_kind_t kind;
  fc_device_t *device;                 /* device and pool memory */
  struct CUmemPoolHandle_st *pool;     /* pool memory */
  bool free_pending;                   /* cuMemFreeAsync called; gone for later calls */
} fc_alloc_t;

/* Sorted by base; under fc_lock. */
static fc_alloc_t *allocs;
static size_t alloc_count, alloc_capacity;

/* Copies and fills hold this for reading while they run, and check their
 * ranges again first; freeing takes it for writing. So a copy that runs
 * after a free of its memory (a free the program ordered too early) finds
 * the memory gone and says so. Kernels do not take it: a free during a
 * kernel is left to happen, for AddressSanitizer builds to catch the
 * kernel's use after free; waiting would hide the bug. */
static pthread_rwlock_t memory_lock = PTHREAD_RWLOCK_INITIALIZER;

/* Index of the last allocation whose base is <= p, or alloc_count. */
static size_t find_at_or_below(uintptr_t p) {
  size_t lo = 0, hi = alloc_count;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (allocs[mid].base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo == 0 ? alloc_count : lo - 1;
}

/* The allocation holding [p, p + size): for calls, not one whose free is
 * queued already; for work that runs, any not freed yet (stream order may
 * still put it before the free). */
static fc_alloc_t *find_range(uintptr_t p, size_t size, bool even_freeing) {
  const size_t i = find_at_or_below(p);
  if (i == alloc_count) return NULL;
  fc_alloc_t *a = &allocs[i];
  if ((a->free_pending && !even_freeing) || p - a->base > a->size || size > a->size - (p - a->base)) return NULL;
  return a;
}

static fc_alloc_t *find_containing(uintptr_t p, size_t size) { return find_range(p, size, false); }

static void register_alloc(const fc_alloc_t *a) {
  if (alloc_count == alloc_capacity) {
    const size_t capacity = alloc_capacity ? alloc_capacity * 2 : 256;
    fc_alloc_t *grown = realloc(allocs, capacity * sizeof *grown);
    if (!grown) abort(); /* a test tool: out of host memory for its own bookkeeping ends the run */
    allocs = grown;
    alloc_capacity = capacity;
  }
  size_t at = find_at_or_below(a->base);
  at = at == alloc_count ? 0 : at + 1;
  memmove(&allocs[at + 1], &allocs[at], (alloc_count - at) * sizeof *allocs);
  allocs[at] = *a;
  alloc_count++;
}

static void unregister_alloc(fc_alloc_t *a) {
  const size_t at = (size_t)(a - allocs);
  memmove(&allocs[at], &allocs[at + 1], (alloc_count - at - 1) * sizeof *allocs);
  alloc_count--;
}

bool fc_range_is(uintptr_t ptr, size_t size, fc_alloc_kind_t kind, fc_device_t **out_device) {
  const fc_alloc_t *a = find_containing(ptr, size);
  const bool ok = a && (kind == FC_ALLOC_HOST ? a->kind == FC_ALLOC_HOST : a->kind != FC_ALLOC_HOST);
  if (out_device) *out_device = ok ? a->device : NULL;
  return ok;
}

size_t fc_live_allocations(const fc_device_t *device, fc_alloc_kind_t kind, size_t *out_bytes) {
  size_t count = 0, bytes = 0;
  pthread_mutex_lock(&fc_lock);
  for (size_t i = 0; i < alloc_count; i++) {
    const fc_alloc_t *a = &allocs[i];
    if ((kind == FC_ALLOC_HOST) != (a->kind == FC_ALLOC_HOST) || a->free_pending) continue;
    if (device && a->device != device) continue;
    count++;
    bytes += a->size;
  }
  pthread_mutex_unlock(&fc_lock);
  if (out_bytes) *out_bytes = bytes;
  return count;
}

/* What a rejected pointer is near, for the message. fc_lock held. */
static void describe_near(uintptr_t p, char *out, size_t size) {
  const size_t i = find_at_or_below(p);
  if (i == alloc_count) {
    snprintf(out, size, "no allocation starts at or below it");
    return;
  }
  const fc_alloc_t *a = &allocs[i];
  snprintf(out, size, "the nearest allocation below is %s memory [0x%llx, +%zu)%s",
           a->kind == FC_ALLOC_HOST ? "pinned host" : a->kind == FC_ALLOC_POOL ? "pool" : "device",
           (unsigned long long)a->base, a->size, a->free_pending ? ", already freed (cuMemFreeAsync)" : "");
}

/* Check that [ptr, ptr + size) is device memory; reject the call otherwise. */
static bool device_range(const char *call, const char *what, CUdeviceptr ptr, size_t size, fc_device_t **out_device,
                         CUresult *out_result) {
  pthread_mutex_lock(&fc_lock);
  const bool ok = fc_range_is((uintptr_t)ptr, size, FC_ALLOC_DEVICE, out_device);
  char near[256] = "";
  if (!ok) describe_near((uintptr_t)ptr, near, sizeof near);
  pthread_mutex_unlock(&fc_lock);
  if (!ok)
    *out_result = fc_reject(CUDA_ERROR_INVALID_VALUE, call,
                            "the %s [0x%llx, +%zu) is not inside one live device allocation; %s", what,
                            (unsigned long long)ptr, size, near);
  return ok;
}

static bool is_pinned(const void *p, size_t size) {
  pthread_mutex_lock(&fc_lock);
  const bool pinned = fc_range_is((uintptr_t)p, size, FC_ALLOC_HOST, NULL);
  pthread_mutex_unlock(&fc_lock);
  return pinned;
}

/* ---- plain allocations ---------------------------------------------------------------------- */

static void *device_malloc(size_t size) {
  void *p = NULL;
  if (posix_memalign(&p, FC_DEVICE_ALIGNMENT, size) != 0) return NULL;
  memset(p, FC_POISON, size);
  return p;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemAlloc", &r);
  if (!ctx) return r;
  if (!dptr || bytesize == 0)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "dptr is NULL or bytesize is 0 (%zu)", bytesize);
  fc_device_t *d = ctx->device;
  pthread_mutex_lock(&fc_lock);
  const bool fits = bytesize <= d->total_bytes - d->used_bytes;
  if (fits) d->used_bytes += bytesize;
  pthread_mutex_unlock(&fc_lock);
  void *p = fits ? device_malloc(bytesize) : NULL;
  if (!p) {
    if (fits) {
      pthread_mutex_lock(&fc_lock);
      d->used_bytes -= bytesize;
      pthread_mutex_unlock(&fc_lock);
    }
    return CUDA_ERROR_OUT_OF_MEMORY; /* not a misuse: the caller handles it */
  }
  const fc_alloc_t a = {(uintptr_t)p, bytesize, FC_ALLOC_DEVICE, d, NULL, false};
  pthread_mutex_lock(&fc_lock);
  register_alloc(&a);
  pthread_mutex_unlock(&fc_lock);
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

/* Forget an allocation and give its memory back; fc_lock held. */
static void release_alloc(fc_alloc_t *a) {
  fc_device_t *d = a->device;
  if (a->kind == FC_ALLOC_POOL) {
    struct CUmemPoolHandle_st *pool = a->pool;
    pool->used -= a->size;
    /* The pool keeps freed memory up to its release threshold. */
    const uint64_t keep = pool->used > pool->threshold ? pool->used : pool->threshold;
    if (pool->reserved > keep) {
      d->used_bytes -= (size_t)(pool->reserved - keep);
      pool->reserved = keep;
    }
  } else if (a->kind == FC_ALLOC_DEVICE) {
    d->used_bytes -= a->size;
  }
  void *p = (void *)a->base;
  unregister_alloc(a);
  free(p);
}

void fc_device_memory_release(fc_device_t *device) {
  pthread_rwlock_wrlock(&memory_lock);
  pthread_mutex_lock(&fc_lock);
  for (size_t i = alloc_count; i-- > 0;)
    if (allocs[i].device == device) release_alloc(&allocs[i]);
  struct CUmemPoolHandle_st *pool = device->pool;
  device->used_bytes -= (size_t)pool->reserved;
  pool->used = pool->reserved = 0;
  pthread_mutex_unlock(&fc_lock);
  pthread_rwlock_unlock(&memory_lock);
}

CUresult cuMemFree(CUdeviceptr dptr) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemFree", &r);
  if (!ctx) return r;
  if (!dptr) return CUDA_SUCCESS;
  /* cuMemFree waits for the device, as the driver's does. */
  fc_context_drain(ctx);
  pthread_rwlock_wrlock(&memory_lock);
  pthread_mutex_lock(&fc_lock);
  fc_alloc_t *a = find_containing((uintptr_t)dptr, 1);
  const bool ok = a && a->base == (uintptr_t)dptr && a->kind != FC_ALLOC_HOST;
  char near[256] = "";
  if (ok)
    release_alloc(a);
  else
    describe_near((uintptr_t)dptr, near, sizeof near);
  pthread_mutex_unlock(&fc_lock);
  pthread_rwlock_unlock(&memory_lock);
  if (!ok)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemFree", "0x%llx is not the start of a live device allocation; %s",
                     (unsigned long long)dptr, near);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemGetInfo", &r);
  if (!ctx) return r;
  if (!free_bytes || !total) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo", "an output is NULL");
  pthread_mutex_lock(&fc_lock);
  *total = ctx->device->total_bytes;
  *free_bytes = ctx->device->total_bytes - ctx->device->used_bytes;
  pthread_mutex_unlock(&fc_lock);
  return CUDA_SUCCESS;
}

/* ---- pinned host memory ---------------------------------------------------------------------- */

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  CUresult r;
  if (!fc_require_context("cuMemHostAlloc", &r)) return r;
  const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (!pp || bytesize == 0 || (Flags & ~known))
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc", "pp is NULL, bytesize is 0 or Flags 0x%x unknown",
                     Flags);
  void *p = malloc(bytesize);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  const fc_alloc_t a = {(uintptr_t)p, bytesize, FC_ALLOC_HOST, NULL, NULL, false};
  pthread_mutex_lock(&fc_lock);
  register_alloc(&a);
  pthread_mutex_unlock(&fc_lock);
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
  CUresult r;
  if (!fc_require_context("cuMemFreeHost", &r)) return r;
  pthread_rwlock_wrlock(&memory_lock);
  pthread_mutex_lock(&fc_lock);
  fc_alloc_t *a = find_containing((uintptr_t)p, 1);
  const bool ok = a && a->base == (uintptr_t)p && a->kind == FC_ALLOC_HOST;
  if (ok) release_alloc(a);
  pthread_mutex_unlock(&fc_lock);
  pthread_rwlock_unlock(&memory_lock);
  if (!ok) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost", "%p is not from cuMemHostAlloc", p);
  return CUDA_SUCCESS;
}

/* ---- the stream-ordered pool ------------------------------------------------------------------- */

static bool pool_ok(CUmemoryPool pool, const char *call, CUresult *out_result) {
  pthread_mutex_lock(&fc_lock);
  const bool ok = fc_handle_is(pool, FC_KIND_POOL);
  pthread_mutex_unlock(&fc_lock);
  if (!ok) *out_result = fc_reject(CUDA_ERROR_INVALID_VALUE, call, "%p is not a memory pool", (void *)pool);
  return ok;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemAllocFromPoolAsync", &r);
  if (!ctx) return r;
  if (!pool_ok(pool, "cuMemAllocFromPoolAsync", &r) || !fc_stream_check(hStream, ctx, "cuMemAllocFromPoolAsync", &r))
    return r;
  if (!dptr || bytesize == 0)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemAllocFromPoolAsync", "dptr is NULL or bytesize is 0");
  fc_device_t *d = pool->device;
  /* Bookkeeping of a pool that reserves what it hands out and keeps freed
   * memory up to its threshold; the memory itself is malloc'd per block. */
  pthread_mutex_lock(&fc_lock);
  const uint64_t used = pool->used + bytesize;
  const uint64_t grow = used > pool->reserved ? used - pool->reserved : 0;
  const bool fits = grow <= d->total_bytes - d->used_bytes;
  if (fits) {
    d->used_bytes += (size_t)grow;
    pool->reserved += grow;
    pool->used = used;
    if (pool->used > pool->used_high) pool->used_high = pool->used;
    if (pool->reserved > pool->reserved_high) pool->reserved_high = pool->reserved;
  }
  pthread_mutex_unlock(&fc_lock);
  if (!fits) return CUDA_ERROR_OUT_OF_MEMORY;
  void *p = device_malloc(bytesize);
  if (!p) {
    pthread_mutex_lock(&fc_lock);
    pool->used -= bytesize;
    pthread_mutex_unlock(&fc_lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const fc_alloc_t a = {(uintptr_t)p, bytesize, FC_ALLOC_POOL, d, pool, false};
  pthread_mutex_lock(&fc_lock);
  register_alloc(&a);
  pthread_mutex_unlock(&fc_lock);
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

typedef struct free_command_t {
  fc_command_t base;
  uintptr_t ptr;
} free_command_t;

void fc_pool_free_now(uintptr_t ptr) {
  pthread_rwlock_wrlock(&memory_lock);
  pthread_mutex_lock(&fc_lock);
  const size_t i = find_at_or_below(ptr);
  if (i < alloc_count && allocs[i].base == ptr) release_alloc(&allocs[i]);
  pthread_mutex_unlock(&fc_lock);
  pthread_rwlock_unlock(&memory_lock);
}

static CUresult run_free(fc_command_t *command) {
  fc_pool_free_now(((free_command_t *)command)->ptr);
  return CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemFreeAsync", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuMemFreeAsync", &r)) return r;
  pthread_mutex_lock(&fc_lock);
  fc_alloc_t *a = find_containing((uintptr_t)dptr, 1);
  const bool ok = a && a->base == (uintptr_t)dptr && a->kind != FC_ALLOC_HOST;
  char near[256] = "";
  if (ok)
    a->free_pending = true;
  else
    describe_near((uintptr_t)dptr, near, sizeof near);
  pthread_mutex_unlock(&fc_lock);
  if (!ok)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync",
                     "0x%llx is not the start of a live device allocation (a double free?); %s",
                     (unsigned long long)dptr, near);
  free_command_t *command = calloc(1, sizeof *command);
  if (!command) return CUDA_ERROR_OUT_OF_MEMORY;
  command->base.run = run_free;
  command->ptr = (uintptr_t)dptr;
  return fc_stream_enqueue(hStream, ctx, &command->base);
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  CUresult r;
  if (!fc_require_context("cuMemPoolSetAttribute", &r)) return r;
  if (!pool_ok(pool, "cuMemPoolSetAttribute", &r)) return r;
  if (!value) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAttribute", "value is NULL");
  pthread_mutex_lock(&fc_lock);
  r = CUDA_SUCCESS;
  switch (attr) {
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->threshold = *(const cuuint64_t *)value; break;
  case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: pool->reserved_high = pool->reserved; break;
  case CU_MEMPOOL_ATTR_USED_MEM_HIGH: pool->used_high = pool->used; break;
  default: r = CUDA_ERROR_INVALID_VALUE; break;
  }
  pthread_mutex_unlock(&fc_lock);
  if (r != CUDA_SUCCESS)
    return fc_reject(r, "cuMemPoolSetAttribute", "attribute %d cannot be set", (int)attr);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  CUresult r;
  if (!fc_require_context("cuMemPoolGetAttribute", &r)) return r;
  if (!pool_ok(pool, "cuMemPoolGetAttribute", &r)) return r;
  if (!value) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemPoolGetAttribute", "value is NULL");
  pthread_mutex_lock(&fc_lock);
  r = CUDA_SUCCESS;
  switch (attr) {
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->threshold; break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = pool->reserved; break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
  case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
  case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
  case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = 1; break;
  default: r = CUDA_ERROR_INVALID_VALUE; break;
  }
  pthread_mutex_unlock(&fc_lock);
  if (r != CUDA_SUCCESS)
    return fc_reject(r, "cuMemPoolGetAttribute", "attribute %d is not modelled by the test driver", (int)attr);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  CUresult r;
  if (!fc_require_context("cuMemPoolTrimTo", &r)) return r;
  if (!pool_ok(pool, "cuMemPoolTrimTo", &r)) return r;
  pthread_mutex_lock(&fc_lock);
  uint64_t keep = pool->reserved < minBytesToKeep ? pool->reserved : minBytesToKeep;
  if (keep < pool->used) keep = pool->used;
  pool->device->used_bytes -= (size_t)(pool->reserved - keep);
  pool->reserved = keep;
  pthread_mutex_unlock(&fc_lock);
  return CUDA_SUCCESS;
}

/* ---- copies and fills ---------------------------------------------------------------------------- */

typedef struct copy_command_t {
  fc_command_t base;
  const char *call;
  uintptr_t dst, src;    /* device ranges are checked again when the copy runs */
  bool dst_device, src_device;
  size_t size;
  unsigned char staged[]; /* pageable source, copied at the call */
} copy_command_t;

/* Is a device range the command saw at the call still there when it runs?
 * If not, stream order freed it first: on a GPU, an illegal address. */
static CUresult still_there(const char *call, uintptr_t p, size_t size) {
  pthread_mutex_lock(&fc_lock);
  const fc_alloc_t *a = find_range(p, size, true);
  const bool ok = a && a->kind != FC_ALLOC_HOST;
  pthread_mutex_unlock(&fc_lock);
  if (ok) return CUDA_SUCCESS;
  fc_complain("%s: [0x%llx, +%zu) was freed before the work queued on it ran (a free ordered before its last use): "
              "CUDA_ERROR_ILLEGAL_ADDRESS",
              call, (unsigned long long)p, size);
  return CUDA_ERROR_ILLEGAL_ADDRESS;
}

static CUresult run_copy(fc_command_t *command) {
  copy_command_t *c = (copy_command_t *)command;
  pthread_rwlock_rdlock(&memory_lock);
  CUresult r = CUDA_SUCCESS;
  if (c->dst_device) r = still_there(c->call, c->dst, c->size);
  if (r == CUDA_SUCCESS && c->src_device) r = still_there(c->call, c->src, c->size);
  if (r == CUDA_SUCCESS) memcpy((void *)c->dst, c->src ? (const void *)c->src : c->staged, c->size);
  pthread_rwlock_unlock(&memory_lock);
  return r;
}

static CUresult enqueue_copy(const char *call, struct CUctx_st *ctx, CUstream stream, uintptr_t dst, bool dst_device,
                             uintptr_t src, bool src_device, size_t size, bool stage) {
  copy_command_t *c = malloc(sizeof *c + (stage ? size : 0));
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  memset(c, 0, sizeof *c);
  c->base.run = run_copy;
  c->base.touches_memory = true;
  c->call = call;
  c->dst = dst;
  c->dst_device = dst_device;
  c->src_device = src_device;
  c->size = size;
  if (stage)
    memcpy(c->staged, (const void *)src, size);
  else
    c->src = src;
  return fc_stream_enqueue(stream, ctx, &c->base);
}

static bool overlapping(uintptr_t a, uintptr_t b, size_t size) { return a < b + size && b < a + size; }

CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemcpyHtoDAsync", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuMemcpyHtoDAsync", &r)) return r;
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (!srcHost) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoDAsync", "srcHost is NULL");
  if (!device_range("cuMemcpyHtoDAsync", "destination", dstDevice, ByteCount, NULL, &r)) return r;
  /* From pageable memory the driver stages the bytes before it returns, so
   * the caller may reuse its buffer at once; from pinned memory the copy
   * reads the buffer when it runs. */
  return enqueue_copy("cuMemcpyHtoDAsync", ctx, hStream, (uintptr_t)dstDevice, true, (uintptr_t)srcHost, false,
                      ByteCount, !is_pinned(srcHost, ByteCount));
}

CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemcpyDtoHAsync", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuMemcpyDtoHAsync", &r)) return r;
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (!dstHost) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoHAsync", "dstHost is NULL");
  if (!device_range("cuMemcpyDtoHAsync", "source", srcDevice, ByteCount, NULL, &r)) return r;
  r = enqueue_copy("cuMemcpyDtoHAsync", ctx, hStream, (uintptr_t)dstHost, false, (uintptr_t)srcDevice, true, ByteCount,
                   false);
  /* Into pageable memory the driver returns only once the copy is done. */
  if (r == CUDA_SUCCESS && !is_pinned(dstHost, ByteCount)) fc_stream_drain(hStream, ctx);
  return r;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemcpyDtoDAsync", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuMemcpyDtoDAsync", &r)) return r;
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (!device_range("cuMemcpyDtoDAsync", "destination", dstDevice, ByteCount, NULL, &r) ||
      !device_range("cuMemcpyDtoDAsync", "source", srcDevice, ByteCount, NULL, &r))
    return r;
  if (overlapping((uintptr_t)dstDevice, (uintptr_t)srcDevice, ByteCount))
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoDAsync",
                     "source [0x%llx, +%zu) and destination [0x%llx, +%zu) overlap; CUDA leaves the result undefined",
                     (unsigned long long)srcDevice, ByteCount, (unsigned long long)dstDevice, ByteCount);
  return enqueue_copy("cuMemcpyDtoDAsync", ctx, hStream, (uintptr_t)dstDevice, true, (uintptr_t)srcDevice, true,
                      ByteCount, false);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount, CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuMemcpyPeerAsync", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuMemcpyPeerAsync", &r)) return r;
  pthread_mutex_lock(&fc_lock);
  const bool contexts = fc_handle_is(dstContext, FC_KIND_CONTEXT) && dstContext->primary_refs > 0 &&
                        fc_handle_is(srcContext, FC_KIND_CONTEXT) && srcContext->primary_refs > 0;
  pthread_mutex_unlock(&fc_lock);
  if (!contexts)
    return fc_reject(CUDA_ERROR_INVALID_CONTEXT, "cuMemcpyPeerAsync", "dstContext %p or srcContext %p is not active",
                     (void *)dstContext, (void *)srcContext);
  if (ByteCount == 0) return CUDA_SUCCESS;
  fc_device_t *dst_dev = NULL, *src_dev = NULL;
  if (!device_range("cuMemcpyPeerAsync", "destination", dstDevice, ByteCount, &dst_dev, &r) ||
      !device_range("cuMemcpyPeerAsync", "source", srcDevice, ByteCount, &src_dev, &r))
    return r;
  if (dst_dev != dstContext->device || src_dev != srcContext->device)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemcpyPeerAsync",
                     "the destination is memory of device %d and the source of device %d, but the contexts given are "
                     "those of devices %d and %d",
                     dst_dev->ordinal, src_dev->ordinal, dstContext->device->ordinal, srcContext->device->ordinal);
  return enqueue_copy("cuMemcpyPeerAsync", ctx, hStream, (uintptr_t)dstDevice, true, (uintptr_t)srcDevice, true,
                      ByteCount, false);
}

typedef struct fill_command_t {
  fc_command_t base;
  const char *call;
  uintptr_t dst;
  size_t pitch, width, height; /* in elements of `element` bytes, pitch in bytes */
  unsigned element;
  uint32_t value;
} fill_command_t;

static CUresult run_fill(fc_command_t *command) {
  fill_command_t *f = (fill_command_t *)command;
  pthread_rwlock_rdlock(&memory_lock);
  const size_t span = f->pitch * (f->height - 1) + f->width * f->element;
  CUresult r = still_there(f->call, f->dst, span);
  for (size_t row = 0; r == CUDA_SUCCESS && row < f->height; row++) {
    unsigned char *p = (unsigned char *)f->dst + row * f->pitch;
    if (f->element == 1) {
      memset(p, (int)f->value, f->width);
    } else if (f->element == 2) {
      const uint16_t v = (uint16_t)f->value;
      for (size_t i = 0; i < f->width; i++) memcpy(p + 2 * i, &v, 2);
    } else {
      for (size_t i = 0; i < f->width; i++) memcpy(p + 4 * i, &f->value, 4);
    }
  }
  pthread_rwlock_unlock(&memory_lock);
  return r;
}

static CUresult fill(const char *call, CUdeviceptr dst, size_t pitch, unsigned element, uint32_t value, size_t width,
                     size_t height, CUstream stream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context(call, &r);
  if (!ctx) return r;
  if (!fc_stream_check(stream, ctx, call, &r)) return r;
  if (dst % element)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not aligned to the %u-byte elements",
                     (unsigned long long)dst, element);
  if (height > 1 && pitch < width * element)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, call, "the pitch %zu is narrower than a row of %zu bytes", pitch,
                     width * element);
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (!device_range(call, "destination", dst, pitch * (height - 1) + width * element, NULL, &r)) return r;
  fill_command_t *f = calloc(1, sizeof *f);
  if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
  f->base.run = run_fill;
  f->base.touches_memory = true;
  f->call = call;
  f->dst = (uintptr_t)dst;
  f->pitch = pitch;
  f->width = width;
  f->height = height;
  f->element = element;
  f->value = value;
  return fc_stream_enqueue(stream, ctx, &f->base);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  return fill("cuMemsetD8Async", dstDevice, N, 1, uc, N, 1, hStream);
}

CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  return fill("cuMemsetD16Async", dstDevice, 2 * N, 2, us, N, 1, hStream);
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  return fill("cuMemsetD32Async", dstDevice, 4 * N, 4, ui, N, 1, hStream);
}

CUresult cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
                           CUstream hStream) {
  return fill("cuMemsetD2D8Async", dstDevice, dstPitch, 1, uc, Width, Height, hStream);
}

/* ---- scratch additions: pools kiln creates, their access, pointer attributes ---- */

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
  CUresult r;
  if (!fc_require_context("cuMemPoolCreate", &r)) return r;
  if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemPoolCreate", "pinned device pools only");
  fc_device_t *d = fc_device_of(props->location.id, "cuMemPoolCreate", &r);
  if (!d) return r;
  if (!d->pools) return fc_reject(CUDA_ERROR_NOT_SUPPORTED, "cuMemPoolCreate", "device without pools");
  struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  p->kind = FC_KIND_POOL;
  p->device = d;
  p->created = true;
  pthread_mutex_lock(&fc_lock);
  fc_handle_add(p);
  pthread_mutex_unlock(&fc_lock);
  *pool = p;
  return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  CUresult r;
  if (!fc_require_context("cuMemPoolDestroy", &r)) return r;
  if (!pool_ok(pool, "cuMemPoolDestroy", &r)) return r;
  if (!pool->created) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemPoolDestroy", "a device's default pool");
  pthread_mutex_lock(&fc_lock);
  const uint64_t used = pool->used;
  pool->device->used_bytes -= (size_t)pool->reserved;
  fc_handle_remove(pool);
  pthread_mutex_unlock(&fc_lock);
  if (used) fc_complain("cuMemPoolDestroy: %llu bytes of the pool are still allocated", (unsigned long long)used);
  free(pool);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
  CUresult r;
  if (!fc_require_context("cuMemPoolSetAccess", &r)) return r;
  if (!pool_ok(pool, "cuMemPoolSetAccess", &r)) return r;
  for (size_t i = 0; i < count; i++) {
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !fc_device_of(map[i].location.id, "cuMemPoolSetAccess", &r))
      return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAccess", "entry %zu names no device", i);
    pthread_mutex_lock(&fc_lock);
    if (map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      pool->access |= 1u << map[i].location.id;
    else
      pool->access &= ~(1u << map[i].location.id);
    pthread_mutex_unlock(&fc_lock);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location) {
  CUresult r;
  if (!pool_ok(memPool, "cuMemPoolGetAccess", &r)) return r;
  if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuMemPoolGetAccess", "bad arguments");
  pthread_mutex_lock(&fc_lock);
  const bool rw = location->id == memPool->device->ordinal || (memPool->access & (1u << location->id));
  pthread_mutex_unlock(&fc_lock);
  *flags = rw ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

/* What a DLPack import asks of a pointer: its memory type, and for device
 * memory its device and its allocation's range. */
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (attribute != CU_POINTER_ATTRIBUTE_MEMORY_TYPE && attribute != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL &&
      attribute != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && attribute != CU_POINTER_ATTRIBUTE_RANGE_SIZE)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute", "attribute %d is not modelled", (int)attribute);
  if (!data) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute", "data is NULL");
  pthread_mutex_lock(&fc_lock);
  const fc_alloc_t *a = find_containing((uintptr_t)ptr, 1);
  const bool host = a && a->kind == FC_ALLOC_HOST;
  const uintptr_t base = a ? a->base : 0;
  const size_t size = a ? a->size : 0;
  const int ordinal = a && !host && a->device ? a->device->ordinal : -1;
  pthread_mutex_unlock(&fc_lock);
  /* Memory the driver does not know: CUDA_ERROR_INVALID_VALUE, quietly (an
   * ordinary answer, as the real driver gives it for pageable memory). */
  if (!a) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; break;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    if (host)
      return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute",
                       "CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL of pinned host memory is not modelled");
    *(int *)data = ordinal;
    break;
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)base; break;
  default: *(size_t *)data = size; break; /* RANGE_SIZE */
  }
  return CUDA_SUCCESS;
}
