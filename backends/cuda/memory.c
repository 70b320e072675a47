/* backends/cuda/memory.c: CUDA buffers from the stream-ordered pool, pinned host staging, transfers, fills and per-op scratch memory. */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

/* Allocate from the pool; when it is exhausted, give the pool's idle memory
 * back to the driver once (other allocators — cuBLAS, cuDNN, the
 * application — may need it) and try again. */
static CUresult pool_alloc(kiln_backend_device_t *device, size_t size, CUstream stream, CUdeviceptr *out_ptr) {
  CUresult r = cuMemAllocFromPoolAsync(out_ptr, size, device->pool, stream);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    (void)cuStreamSynchronize(device->alloc_stream);
    (void)cuMemPoolTrimTo(device->pool, 0);
    r = cuMemAllocFromPoolAsync(out_ptr, size, device->pool, stream);
  }
  return r;
}

kiln_status_t kiln_cuda_buffer_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                        kiln_backend_buffer_t **out_buffer) {
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
    /* Allocated in order on the device's allocation stream, then waited for:
     * the buffer may be used on any queue next, and the core cannot tell
     * which. The wait is short (the stream holds only allocations), and the
     * pool makes the allocation itself cheap. */
    r = pool_alloc(device, size, device->alloc_stream, &buffer->ptr);
    if (r == CUDA_SUCCESS) r = cuStreamSynchronize(device->alloc_stream);
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

void kiln_cuda_buffer_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_buffer_t *buffer) {
  if (!buffer) return;
  if (buffer->ptr && kiln_cuda_enter(device) == KILN_OK) {
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

kiln_status_t kiln_cuda_host_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                      void **out_ptr) {
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  void *ptr = NULL;
  /* Portable: staging memory serves copies to every device, not just this one. */
  status = kiln_cuda_check(ctx, cuMemHostAlloc(&ptr, size ? size : 1, CU_MEMHOSTALLOC_PORTABLE),
                           "cuMemHostAlloc(%zu bytes of pinned host memory) for cuda:%d", size, device->ordinal);
  kiln_cuda_leave();
  if (status == KILN_OK) *out_ptr = ptr;
  return status;
}

void kiln_cuda_host_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *ptr) {
  if (!ptr || kiln_cuda_enter(device) != KILN_OK) return;
  (void)cuMemFreeHost(ptr);
  kiln_cuda_leave();
}

kiln_status_t kiln_cuda_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     kiln_backend_buffer_t *buffer, size_t offset, const void *host, size_t size,
                                     bool blocking) {
  if (size == 0) return KILN_OK;
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) return status;
  status =
      kiln_cuda_check(ctx, cuMemcpyHtoDAsync(buffer->ptr + offset, host, size, queue->stream),
                      "cuMemcpyHtoDAsync(%zu bytes at offset %zu) on cuda:%d", size, offset, queue->device->ordinal);
  if (status == KILN_OK && blocking)
    status = kiln_cuda_check(ctx, cuStreamSynchronize(queue->stream),
                             "cuStreamSynchronize after writing %zu bytes to cuda:%d", size, queue->device->ordinal);
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *buffer, size_t offset, void *host, size_t size,
                                    bool blocking) {
  if (size == 0) return KILN_OK;
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) return status;
  status =
      kiln_cuda_check(ctx, cuMemcpyDtoHAsync(host, buffer->ptr + offset, size, queue->stream),
                      "cuMemcpyDtoHAsync(%zu bytes at offset %zu) on cuda:%d", size, offset, queue->device->ordinal);
  if (status == KILN_OK && blocking)
    status = kiln_cuda_check(ctx, cuStreamSynchronize(queue->stream),
                             "cuStreamSynchronize after reading %zu bytes from cuda:%d", size, queue->device->ordinal);
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
    /* Direct over NVLink/PCIe where peer access is on, staged by the driver
     * otherwise; either way ordered on the destination's queue. */
    status = kiln_cuda_check(ctx, cuMemcpyPeerAsync(dst->ptr + dst_offset, dst->device->context, src->ptr + src_offset,
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
