/* backends/cuda/memory.c: CUDA buffers from kiln's own stream-ordered pool, the cache of pinned host memory, transfers (staged where the source is pageable), fills and per-op scratch memory. */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

/* ---- kiln's pool on each device ------------------------------------------------------ */

uint64_t kiln_cuda_pool_threshold(uint64_t memory_bytes) {
  uint64_t keep = memory_bytes / 8;
  if (keep < ((uint64_t)256 << 20)) keep = (uint64_t)256 << 20;
  if (keep > ((uint64_t)2 << 30)) keep = (uint64_t)2 << 30;
  return keep;
}

void kiln_cuda_pool_create(kiln_backend_device_t *device) {
  int supported = 0;
  device->pools = false;
  if (cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, device->device) != CUDA_SUCCESS ||
      !supported)
    return;
  /* A pool of kiln's own, not the device's default one: its settings are
   * kiln's business only (the default pool's release threshold would hold
   * back memory from the application, cuBLAS and cuDNN alike). */
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = device->ordinal;
  if (cuMemPoolCreate(&device->pool, &props) != CUDA_SUCCESS) {
    device->pool = NULL;
    return;
  }
  /* Keep up to the threshold of freed memory across synchronisations: the
   * core pools buffers itself, so what reaches this pool is mostly per-op
   * scratch (reduction partials, im2col columns, cuDNN's workspace). */
  size_t total = 0;
  (void)cuDeviceTotalMem(&total, device->device);
  cuuint64_t threshold = kiln_cuda_pool_threshold(total);
  (void)cuMemPoolSetAttribute(device->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
  /* An allocation never waits on another stream's work to reuse what that
   * stream freed (the driver would otherwise insert the dependency, and
   * independent queues would serialise behind a long kernel); memory whose
   * free has completed is reused by any stream. */
  int off = 0;
  (void)cuMemPoolSetAttribute(device->pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off);
  device->pools = true;
}

void kiln_cuda_pool_destroy(kiln_backend_device_t *device) {
  if (!device->pool) return;
  (void)cuMemPoolTrimTo(device->pool, 0);
  (void)cuMemPoolDestroy(device->pool);
  device->pool = NULL;
  device->pools = false;
}

/* Allocate from the pool on `stream`; when it is exhausted, give the pool's
 * idle memory back to the driver once (other allocators may hold the rest)
 * and try again. */
static CUresult pool_alloc(kiln_backend_device_t *device, size_t size, CUstream stream, CUdeviceptr *out_ptr) {
  CUresult r = cuMemAllocFromPoolAsync(out_ptr, size, device->pool, stream);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    (void)cuStreamSynchronize(device->alloc_stream);
    (void)cuMemPoolTrimTo(device->pool, 0);
    r = cuMemAllocFromPoolAsync(out_ptr, size, device->pool, stream);
  }
  return r;
}

/* A buffer for `queue` (NULL: any queue, so the allocation is waited for). */
static kiln_status_t buffer_make(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_queue_t *queue,
                                 size_t size, kiln_backend_buffer_t **out_buffer) {
  kiln_backend_buffer_t *buffer = calloc(1, sizeof *buffer);
  if (!buffer) return kiln_cuda_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for a CUDA buffer record");
  buffer->device = device;
  buffer->size = size;
  if (size == 0) {
    *out_buffer = buffer;
    return KILN_OK;
  }
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) {
    free(buffer);
    return status;
  }
  CUresult r;
  if (device->pools) {
    if (queue) {
      /* Ordered on the queue that uses the buffer first: nothing to wait
       * for, and other queues reach it through that queue's events. */
      r = pool_alloc(device, size, queue->stream, &buffer->ptr);
    } else {
      /* For any queue: allocated on the allocation stream and waited for.
       * The stream holds nothing else, and the pool never makes an
       * allocation wait on another stream's work, so the wait is short. */
      r = pool_alloc(device, size, device->alloc_stream, &buffer->ptr);
      if (r == CUDA_SUCCESS) r = cuStreamSynchronize(device->alloc_stream);
    }
    buffer->pooled = true;
  } else {
    r = cuMemAlloc(&buffer->ptr, size);
  }
  if (r != CUDA_SUCCESS) {
    size_t free_bytes = 0, total = 0;
    (void)cuMemGetInfo(&free_bytes, &total);
    kiln_cuda_leave();
    status = kiln_cuda_check(ctx, r, "allocating %zu bytes on cuda:%d (%zu of %zu bytes free)", size, device->ordinal,
                             free_bytes, total);
    free(buffer);
    return status;
  }
  kiln_cuda_leave();
  *out_buffer = buffer;
  return KILN_OK;
}

kiln_status_t kiln_cuda_buffer_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                        kiln_backend_buffer_t **out_buffer) {
  return buffer_make(ctx, device, NULL, size, out_buffer);
}

kiln_status_t kiln_cuda_buffer_allocate_on(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                           kiln_backend_queue_t *queue, size_t size,
                                           kiln_backend_buffer_t **out_buffer) {
  return buffer_make(ctx, device, queue, size, out_buffer);
}

void kiln_cuda_buffer_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_buffer_t *buffer) {
  if (!buffer) return;
  /* Imported memory stays its owner's: the core calls its deleter. */
  if (buffer->ptr && !buffer->wrapped && kiln_cuda_enter(device) == KILN_OK) {
    /* The core guarantees no pending work uses the buffer, so the free needs
     * no ordering against any queue; the memory returns to the pool. */
    if (buffer->pooled)
      (void)cuMemFreeAsync(buffer->ptr, device->alloc_stream);
    else
      (void)cuMemFree(buffer->ptr);
    kiln_cuda_leave();
  }
  free(buffer);
}

/* ---- the cache of pinned host memory ------------------------------------------------- */

/* Each block starts with this header, one page before the memory handed
 * out (which stays page-aligned). */
#define KILN_CUDA_HOST_HEADER ((size_t)4096)
#define KILN_CUDA_HOST_MAGIC 0x6b696c6e70696e31ull /* "kilnpin1" */
#define KILN_CUDA_HOST_MIN ((size_t)64 << 10)

struct kiln_cuda_host_block_t {
  uint64_t magic;
  kiln_cuda_host_cache_t *cache;
  kiln_cuda_host_block_t *next;
  size_t capacity; /* bytes after the header */
  int cls;         /* -1: larger than every class */
  /* A staged read in flight: where the callback copies the bytes to. */
  void *read_to;
  size_t read_bytes;
};

static kiln_cuda_host_block_t *block_of(void *ptr) {
  return (kiln_cuda_host_block_t *)((char *)ptr - KILN_CUDA_HOST_HEADER);
}

int kiln_cuda_host_class(size_t size) {
  size_t bytes = KILN_CUDA_HOST_MIN;
  for (int c = 0; c < KILN_CUDA_HOST_CLASSES; c++, bytes *= 2)
    if (size <= bytes) return c;
  return -1;
}

void kiln_cuda_host_cache_init(kiln_cuda_host_cache_t *cache) {
  memset(cache, 0, sizeof *cache);
  pthread_mutex_init(&cache->lock, NULL);
}

kiln_status_t kiln_cuda_host_take(kiln_backend_device_t *device, size_t size, void **out_ptr) {
  kiln_cuda_host_cache_t *cache = &device->ctx->host_cache;
  const int c = kiln_cuda_host_class(size);
  if (c >= 0) {
    pthread_mutex_lock(&cache->lock);
    kiln_cuda_host_block_t *block = cache->free[c];
    if (block) {
      cache->free[c] = block->next;
      cache->cached_bytes -= block->capacity;
    }
    pthread_mutex_unlock(&cache->lock);
    if (block) {
      block->next = NULL;
      *out_ptr = (char *)block + KILN_CUDA_HOST_HEADER;
      return KILN_OK;
    }
  }
  kiln_cuda_host_trim(cache, false);
  const size_t capacity = c >= 0 ? KILN_CUDA_HOST_MIN << c : size;
  void *base = NULL;
  /* Portable: the memory serves copies to every device, not just this one. */
  kiln_status_t status =
      kiln_cuda_check(device->ctx, cuMemHostAlloc(&base, capacity + KILN_CUDA_HOST_HEADER, CU_MEMHOSTALLOC_PORTABLE),
                      "cuMemHostAlloc(%zu bytes of pinned host memory) for cuda:%d", capacity, device->ordinal);
  if (status != KILN_OK) return status;
  kiln_cuda_host_block_t *block = base;
  memset(block, 0, sizeof *block);
  block->magic = KILN_CUDA_HOST_MAGIC;
  block->cache = cache;
  block->capacity = capacity;
  block->cls = c;
  *out_ptr = (char *)base + KILN_CUDA_HOST_HEADER;
  return KILN_OK;
}

void kiln_cuda_host_give(kiln_cuda_host_cache_t *cache, void *ptr) {
  if (!ptr) return;
  kiln_cuda_host_block_t *block = block_of(ptr);
  /* No CUDA call here: this may run in a driver callback. Blocks over the
   * cap wait in `doomed` for the next ordinary call to free them. */
  pthread_mutex_lock(&cache->lock);
  if (block->cls >= 0 && cache->cached_bytes + block->capacity <= KILN_CUDA_HOST_CACHE_BYTES) {
    block->next = cache->free[block->cls];
    cache->free[block->cls] = block;
    cache->cached_bytes += block->capacity;
  } else {
    block->next = cache->doomed;
    cache->doomed = block;
  }
  pthread_mutex_unlock(&cache->lock);
}

void kiln_cuda_host_trim(kiln_cuda_host_cache_t *cache, bool everything) {
  pthread_mutex_lock(&cache->lock);
  kiln_cuda_host_block_t *chain = cache->doomed;
  cache->doomed = NULL;
  if (everything) {
    for (int c = 0; c < KILN_CUDA_HOST_CLASSES; c++) {
      while (cache->free[c]) {
        kiln_cuda_host_block_t *b = cache->free[c];
        cache->free[c] = b->next;
        b->next = chain;
        chain = b;
      }
    }
    cache->cached_bytes = 0;
  }
  pthread_mutex_unlock(&cache->lock);
  while (chain) {
    kiln_cuda_host_block_t *next = chain->next;
    (void)cuMemFreeHost(chain);
    chain = next;
  }
}

/* The interface's host_allocate / host_free (the core's staging of copies
 * between backends): from the cache, so a staged copy allocates no pinned
 * memory once the cache holds a block of its size. */
kiln_status_t kiln_cuda_host_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                      void **out_ptr) {
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  status = kiln_cuda_host_take(device, size ? size : 1, out_ptr);
  kiln_cuda_leave();
  return status;
}

void kiln_cuda_host_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *ptr) {
  if (!ptr) return;
  kiln_cuda_host_give(&ctx->host_cache, ptr);
  if (kiln_cuda_enter(device) == KILN_OK) {
    kiln_cuda_host_trim(&ctx->host_cache, false);
    kiln_cuda_leave();
  }
}

/* ---- transfers ------------------------------------------------------------------------ */

/* Host memory the driver does not know (malloc, the stack): copies from or to
 * it are not asynchronous, whatever the call's name. */
static bool host_is_pageable(const void *host) {
  unsigned int type = 0;
  return cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)host) != CUDA_SUCCESS;
}

/* Stream callbacks (driver threads, no CUDA calls): a staged write's block
 * goes back to the cache; a staged read's bytes go to the caller's memory
 * first. */
static void CUDA_CB staged_write_done(void *ptr) { kiln_cuda_host_give(block_of(ptr)->cache, ptr); }

static void CUDA_CB staged_read_done(void *ptr) {
  kiln_cuda_host_block_t *block = block_of(ptr);
  memcpy(block->read_to, ptr, block->read_bytes);
  kiln_cuda_host_give(block->cache, ptr);
}

kiln_status_t kiln_cuda_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     kiln_backend_buffer_t *buffer, size_t offset, const void *host, size_t size,
                                     bool blocking) {
  if (size == 0) return KILN_OK;
  kiln_backend_device_t *device = queue->device;
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  if (!blocking && size <= KILN_CUDA_STAGE_MAX && host_is_pageable(host)) {
    /* From pageable memory the driver would wait for the stream before the
     * copy returns. Copied into pinned memory now instead (the caller's
     * memory is free again at once), and the pinned block goes back to the
     * cache when the stream has copied it. */
    void *stage = NULL;
    status = kiln_cuda_host_take(device, size, &stage);
    if (status == KILN_OK) {
      memcpy(stage, host, size);
      status = kiln_cuda_check(ctx, cuMemcpyHtoDAsync(buffer->ptr + offset, stage, size, queue->stream),
                               "cuMemcpyHtoDAsync(%zu bytes at offset %zu, staged) on cuda:%d", size, offset,
                               device->ordinal);
      if (status != KILN_OK) {
        kiln_cuda_host_give(&ctx->host_cache, stage);
      } else if (cuLaunchHostFunc(queue->stream, staged_write_done, stage) != CUDA_SUCCESS) {
        /* No callback: wait for the copy here, then give the block back. */
        status = kiln_cuda_check(ctx, cuStreamSynchronize(queue->stream),
                                 "cuStreamSynchronize after a staged write to cuda:%d", device->ordinal);
        kiln_cuda_host_give(&ctx->host_cache, stage);
      }
    }
    kiln_cuda_leave();
    return status;
  }
  status = kiln_cuda_check(ctx, cuMemcpyHtoDAsync(buffer->ptr + offset, host, size, queue->stream),
                           "cuMemcpyHtoDAsync(%zu bytes at offset %zu) on cuda:%d", size, offset, device->ordinal);
  if (status == KILN_OK && blocking)
    status = kiln_cuda_check(ctx, cuStreamSynchronize(queue->stream),
                             "cuStreamSynchronize after writing %zu bytes to cuda:%d", size, device->ordinal);
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *buffer, size_t offset, void *host, size_t size,
                                    bool blocking) {
  if (size == 0) return KILN_OK;
  kiln_backend_device_t *device = queue->device;
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  if (!blocking && size <= KILN_CUDA_STAGE_MAX && host_is_pageable(host)) {
    /* Into pageable memory the driver's copy is synchronous. Read into
     * pinned memory instead, and a stream callback copies the bytes to the
     * caller's memory when they have arrived: queue_finish and later events
     * cover it, as they cover the copy. */
    void *stage = NULL;
    status = kiln_cuda_host_take(device, size, &stage);
    if (status == KILN_OK) {
      kiln_cuda_host_block_t *block = block_of(stage);
      block->read_to = host;
      block->read_bytes = size;
      status = kiln_cuda_check(ctx, cuMemcpyDtoHAsync(stage, buffer->ptr + offset, size, queue->stream),
                               "cuMemcpyDtoHAsync(%zu bytes at offset %zu, staged) on cuda:%d", size, offset,
                               device->ordinal);
      if (status != KILN_OK) {
        kiln_cuda_host_give(&ctx->host_cache, stage);
      } else if (cuLaunchHostFunc(queue->stream, staged_read_done, stage) != CUDA_SUCCESS) {
        status = kiln_cuda_check(ctx, cuStreamSynchronize(queue->stream),
                                 "cuStreamSynchronize after a staged read from cuda:%d", device->ordinal);
        if (status == KILN_OK) memcpy(host, stage, size);
        kiln_cuda_host_give(&ctx->host_cache, stage);
      }
    }
    kiln_cuda_leave();
    return status;
  }
  status = kiln_cuda_check(ctx, cuMemcpyDtoHAsync(host, buffer->ptr + offset, size, queue->stream),
                           "cuMemcpyDtoHAsync(%zu bytes at offset %zu) on cuda:%d", size, offset, device->ordinal);
  if (status == KILN_OK && blocking)
    status = kiln_cuda_check(ctx, cuStreamSynchronize(queue->stream),
                             "cuStreamSynchronize after reading %zu bytes from cuda:%d", size, device->ordinal);
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_buffer_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *src, size_t src_offset, kiln_backend_buffer_t *dst,
                                    size_t dst_offset, size_t size) {
  if (size == 0) return KILN_OK;
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) return status;
  if (src->device == dst->device) {
    status = kiln_cuda_check(ctx, cuMemcpyDtoDAsync(dst->ptr + dst_offset, src->ptr + src_offset, size, queue->stream),
                             "cuMemcpyDtoDAsync(%zu bytes) on cuda:%d", size, queue->device->ordinal);
  } else {
    /* Direct over NVLink/PCIe where the source's pool grants this device
     * access (device.c), staged by the driver otherwise; either way ordered
     * on the destination's queue. */
    status = kiln_cuda_check(ctx,
                             cuMemcpyPeerAsync(dst->ptr + dst_offset, dst->device->context, src->ptr + src_offset,
                                               src->device->context, size, queue->stream),
                             "cuMemcpyPeerAsync(%zu bytes, cuda:%d -> cuda:%d)", size, src->device->ordinal,
                             dst->device->ordinal);
  }
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_buffer_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *buffer, size_t offset, size_t size, const void *pattern,
                                    size_t pattern_size) {
  if (size == 0) return KILN_OK;
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) return status;
  const CUdeviceptr at = buffer->ptr + offset;
  CUresult r;
  if (pattern_size == 4 && at % 4 == 0) {
    uint32_t v;
    memcpy(&v, pattern, 4);
    r = cuMemsetD32Async(at, v, size / 4, queue->stream);
  } else if (pattern_size == 2 && at % 2 == 0) {
    uint16_t v;
    memcpy(&v, pattern, 2);
    r = cuMemsetD16Async(at, v, size / 2, queue->stream);
  } else if (pattern_size == 1) {
    r = cuMemsetD8Async(at, *(const unsigned char *)pattern, size, queue->stream);
  } else {
    /* A wide pattern at a misaligned address: one byte-wide 2-D memset per
     * byte of the pattern, its rows pattern_size bytes apart. */
    const unsigned char *bytes = pattern;
    r = CUDA_SUCCESS;
    for (size_t b = 0; b < pattern_size && r == CUDA_SUCCESS; b++)
      r = cuMemsetD2D8Async(at + b, pattern_size, bytes[b], 1, size / pattern_size, queue->stream);
  }
  status = kiln_cuda_check(ctx, r, "filling %zu bytes of cuda:%d with a %zu-byte pattern", size, queue->device->ordinal,
                           pattern_size);
  kiln_cuda_leave();
  return status;
}

/* ---- per-op scratch ------------------------------------------------------------------- */

kiln_status_t kiln_cuda_scratch_alloc(kiln_backend_queue_t *queue, size_t size, CUdeviceptr *out_ptr) {
  kiln_backend_device_t *device = queue->device;
  if (size == 0) size = 1;
  CUresult r;
  if (device->pools) {
    /* Ordered on the op's own queue: usable by the work enqueued next and
     * returned to the pool by the free enqueued after it. */
    r = pool_alloc(device, size, queue->stream, out_ptr);
  } else {
    r = cuMemAlloc(out_ptr, size);
  }
  return kiln_cuda_check(device->ctx, r, "allocating %zu bytes of scratch memory on cuda:%d", size, device->ordinal);
}

void kiln_cuda_scratch_free(kiln_backend_queue_t *queue, CUdeviceptr ptr) {
  if (!ptr) return;
  if (queue->device->pools) {
    (void)cuMemFreeAsync(ptr, queue->stream);
  } else {
    /* Without stream-ordered allocation the work must finish first. */
    (void)cuStreamSynchronize(queue->stream);
    (void)cuMemFree(ptr);
  }
}
