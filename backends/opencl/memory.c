/* backends/opencl/memory.c: OpenCL buffers, pinned host staging, reads, writes, fills, copies within and across devices, scratch memory. */
#include <stdlib.h>
#include <string.h>

#include "backends/opencl/opencl_backend.h"

/* Memory the driver cannot hold is refused before clCreateBuffer: PoCL and
 * others allocate lazily and would fail later, at the first use, or not at
 * all until the machine swaps. */
static kiln_status_t check_size(const kiln_backend_device_t *device, size_t size, const char *what) {
  if (device->max_alloc && size > device->max_alloc)
    return kiln_cl_error(device->ctx, KILN_OUT_OF_MEMORY,
                         "cannot allocate %s of %zu bytes on opencl:%zu (%s): the device allows at most %llu bytes "
                         "per buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE) of %llu bytes in all; use smaller tensors or "
                         "split the work",
                         what, size, device->index, device->desc.name, (unsigned long long)device->max_alloc,
                         (unsigned long long)device->desc.memory_bytes);
  return KILN_OK;
}

static kiln_status_t create_mem(kiln_backend_device_t *device, size_t size, cl_mem_flags flags, const char *what,
                                cl_mem *out_mem) {
  kiln_status_t status = check_size(device, size, what);
  if (status != KILN_OK) return status;
  cl_int err = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(device->context, flags, size, NULL, &err);
  if (err != CL_SUCCESS || !mem) {
    if (err == CL_SUCCESS) err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
    return kiln_cl_check(device->ctx, err, "clCreateBuffer(%zu bytes, %s) on opencl:%zu (%s, %llu bytes of memory)",
                         size, what, device->index, device->desc.name, (unsigned long long)device->desc.memory_bytes);
  }
  *out_mem = mem;
  return KILN_OK;
}

kiln_status_t kiln_cl_buffer_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                      kiln_backend_buffer_t **out_buffer) {
  kiln_backend_buffer_t *buffer = calloc(1, sizeof *buffer);
  if (!buffer) return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for an OpenCL buffer record");
  buffer->device = device;
  buffer->size = size;
  if (size > 0) {
    kiln_status_t status = create_mem(device, size, CL_MEM_READ_WRITE, "a buffer", &buffer->mem);
    if (status != KILN_OK) {
      free(buffer);
      return status;
    }
  }
  *out_buffer = buffer;
  return KILN_OK;
}

void kiln_cl_buffer_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_buffer_t *buffer) {
  if (!buffer) return;
  /* No pending work uses it (the core's guarantee); OpenCL would keep it
   * alive until such work completed anyway. */
  if (buffer->mem) (void)clReleaseMemObject(buffer->mem);
  free(buffer);
}

/* ---- DLPack ---------------------------------------------------------------------- */

void kiln_cl_dlpack_device(kiln_backend_context_t *ctx, kiln_backend_device_t *device, int32_t *out_type,
                           int32_t *out_id) {
  *out_type = 4; /* kDLOpenCL */
  *out_id = (int32_t)device->index;
}

void *kiln_cl_buffer_handle(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer) { return buffer->mem; }

/* A cl_mem of another framework: it must belong to this device's context
 * and hold `size` bytes; kiln holds its own reference while it uses it. */
kiln_status_t kiln_cl_buffer_wrap(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *handle, size_t size,
                                  kiln_backend_buffer_t **out_buffer) {
  cl_mem mem = handle;
  if (mem) {
    cl_context context = NULL;
    size_t mem_size = 0;
    kiln_status_t status =
        kiln_cl_check(ctx, clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof context, &context, NULL),
                      "clGetMemObjectInfo(CL_MEM_CONTEXT) of an imported cl_mem for opencl:%zu", device->index);
    if (status == KILN_OK)
      status = kiln_cl_check(ctx, clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof mem_size, &mem_size, NULL),
                             "clGetMemObjectInfo(CL_MEM_SIZE) of an imported cl_mem for opencl:%zu", device->index);
    if (status != KILN_OK) return status;
    if (context != device->context)
      return kiln_cl_error(ctx, KILN_DEVICE_MISMATCH,
                           "the imported cl_mem belongs to another OpenCL context than kiln's for opencl:%zu (%s); "
                           "export it from a buffer of that device's context, or copy it",
                           device->index, device->desc.name);
    if (mem_size < size)
      return kiln_cl_error(ctx, KILN_INVALID_ARGUMENT,
                           "the imported cl_mem holds %zu bytes but the tensor needs %zu; pass a tensor within its "
                           "memory",
                           mem_size, size);
  }
  kiln_backend_buffer_t *buffer = calloc(1, sizeof *buffer);
  if (!buffer) return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for an OpenCL buffer record");
  if (mem && clRetainMemObject(mem) != CL_SUCCESS) {
    free(buffer);
    return kiln_cl_error(ctx, KILN_INVALID_ARGUMENT, "clRetainMemObject failed on an imported cl_mem");
  }
  buffer->device = device;
  buffer->mem = mem;
  buffer->size = size;
  *out_buffer = buffer;
  return KILN_OK;
}

kiln_status_t kiln_cl_scratch_create(kiln_backend_device_t *device, size_t size, cl_mem *out_mem) {
  return create_mem(device, size ? size : 1, CL_MEM_READ_WRITE, "scratch memory", out_mem);
}

/* ---- pinned host staging ------------------------------------------------------
 * CL_MEM_ALLOC_HOST_PTR memory, mapped once and kept mapped: the pointer the
 * core gets is the mapping. The records live in one list of the context so
 * host_free can find the cl_mem of a pointer. */

struct kiln_cl_pinned_t {
  kiln_cl_pinned_t *next;
  kiln_backend_device_t *device;
  cl_mem mem;
  void *ptr;
};

kiln_status_t kiln_cl_host_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                    void **out_ptr) {
  kiln_cl_pinned_t *record = calloc(1, sizeof *record);
  if (!record) return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for a pinned-memory record");
  const size_t bytes = size ? size : 1;
  kiln_status_t status = create_mem(device, bytes, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, "pinned host staging",
                                    &record->mem);
  if (status != KILN_OK) {
    free(record);
    return status;
  }
  cl_int err = CL_SUCCESS;
  /* The plugin's own queue: mapping must not wait behind the caller's work.
   * (OpenCL calls are thread-safe but for clSetKernelArg; no lock needed.) */
  record->ptr = clEnqueueMapBuffer(device->internal_queue, record->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes,
                                   0, NULL, NULL, &err);
  if (err != CL_SUCCESS || !record->ptr) {
    (void)clReleaseMemObject(record->mem);
    free(record);
    return kiln_cl_check(ctx, err != CL_SUCCESS ? err : CL_MAP_FAILURE,
                         "clEnqueueMapBuffer(%zu bytes of pinned host staging) on opencl:%zu", bytes, device->index);
  }
  record->device = device;
  pthread_mutex_lock(&ctx->pinned_lock);
  record->next = ctx->pinned;
  ctx->pinned = record;
  pthread_mutex_unlock(&ctx->pinned_lock);
  *out_ptr = record->ptr;
  return KILN_OK;
}

static void pinned_release(kiln_cl_pinned_t *record) {
  kiln_backend_device_t *device = record->device;
  if (clEnqueueUnmapMemObject(device->internal_queue, record->mem, record->ptr, 0, NULL, NULL) == CL_SUCCESS)
    (void)clFinish(device->internal_queue);
  (void)clReleaseMemObject(record->mem);
  free(record);
}

void kiln_cl_host_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *ptr) {
  if (!ptr) return;
  pthread_mutex_lock(&ctx->pinned_lock);
  kiln_cl_pinned_t **at = &ctx->pinned;
  while (*at && (*at)->ptr != ptr) at = &(*at)->next;
  kiln_cl_pinned_t *record = *at;
  if (record) *at = record->next;
  pthread_mutex_unlock(&ctx->pinned_lock);
  if (record) pinned_release(record);
}

void kiln_cl_host_release_all(kiln_backend_context_t *ctx) {
  pthread_mutex_lock(&ctx->pinned_lock);
  kiln_cl_pinned_t *list = ctx->pinned;
  ctx->pinned = NULL;
  pthread_mutex_unlock(&ctx->pinned_lock);
  while (list) {
    kiln_cl_pinned_t *next = list->next;
    pinned_release(list);
    list = next;
  }
}

/* ---- transfers ---------------------------------------------------------------- */

kiln_status_t kiln_cl_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_buffer_t *buffer, size_t offset, const void *host, size_t size,
                                   bool blocking) {
  if (size == 0) return KILN_OK;
  return kiln_cl_check(ctx,
                       clEnqueueWriteBuffer(queue->queue, buffer->mem, blocking ? CL_TRUE : CL_FALSE, offset, size,
                                            host, 0, NULL, NULL),
                       "clEnqueueWriteBuffer(%zu bytes at offset %zu of a %zu-byte buffer) on opencl:%zu", size, offset,
                       buffer->size, queue->device->index);
}

kiln_status_t kiln_cl_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  kiln_backend_buffer_t *buffer, size_t offset, void *host, size_t size,
                                  bool blocking) {
  if (size == 0) return KILN_OK;
  return kiln_cl_check(ctx,
                       clEnqueueReadBuffer(queue->queue, buffer->mem, blocking ? CL_TRUE : CL_FALSE, offset, size,
                                           host, 0, NULL, NULL),
                       "clEnqueueReadBuffer(%zu bytes at offset %zu of a %zu-byte buffer) on opencl:%zu", size, offset,
                       buffer->size, queue->device->index);
}

/* Chunks of a staged copy between devices: two in flight, so reading chunk
 * i+1 from the source overlaps writing chunk i to the destination. */
#define KILN_CL_STAGE_CHUNK ((size_t)8 << 20)

/* A copy between two devices (two contexts, possibly two platforms): through
 * the host. The core made `queue` wait for the source's pending work, and a
 * wait across contexts is a host wait (queue.c), so that work has completed:
 * reading the source on its device's own internal queue cannot overtake it,
 * and nothing waits on the destination queue's work from here, so blocking
 * reads cannot deadlock. */
static kiln_status_t copy_across(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *src,
                                 size_t src_offset, kiln_backend_buffer_t *dst, size_t dst_offset, size_t size) {
  kiln_backend_device_t *from = src->device, *to = dst->device;
  const size_t chunk = size < KILN_CL_STAGE_CHUNK ? size : KILN_CL_STAGE_CHUNK;
  unsigned char *stage[2] = {malloc(chunk), size > chunk ? malloc(chunk) : NULL};
  if (!stage[0] || (size > chunk && !stage[1])) {
    free(stage[0]);
    free(stage[1]);
    return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory staging a %zu-byte copy opencl:%zu -> opencl:%zu",
                         size, from->index, to->index);
  }
  cl_event written[2] = {NULL, NULL};
  kiln_status_t status = KILN_OK;
  size_t done = 0;
  for (unsigned i = 0; status == KILN_OK && done < size; i ^= 1u) {
    const size_t n = size - done < chunk ? size - done : chunk;
    /* The half is free again once its previous write completed. */
    if (written[i]) {
      status =
          kiln_cl_check(ctx, clWaitForEvents(1, &written[i]), "waiting for a staged write to opencl:%zu", to->index);
      (void)clReleaseEvent(written[i]);
      written[i] = NULL;
      if (status != KILN_OK) break;
    }
    cl_int err = clEnqueueReadBuffer(from->internal_queue, src->mem, CL_TRUE, src_offset + done, n, stage[i], 0, NULL,
                                     NULL);
    status = kiln_cl_check(ctx, err, "clEnqueueReadBuffer(%zu bytes) staging a copy opencl:%zu -> opencl:%zu", n,
                           from->index, to->index);
    if (status != KILN_OK) break;
    err = clEnqueueWriteBuffer(queue->queue, dst->mem, CL_FALSE, dst_offset + done, n, stage[i], 0, NULL, &written[i]);
    status = kiln_cl_check(ctx, err, "clEnqueueWriteBuffer(%zu bytes) staging a copy opencl:%zu -> opencl:%zu", n, from->index,
                           to->index);
    done += n;
  }
  /* The staging memory must outlive the writes. */
  for (unsigned i = 0; i < 2; i++) {
    if (!written[i]) continue;
    cl_int err = clWaitForEvents(1, &written[i]);
    if (status == KILN_OK)
      status = kiln_cl_check(ctx, err, "waiting for a staged write to opencl:%zu", to->index);
    (void)clReleaseEvent(written[i]);
  }
  free(stage[0]);
  free(stage[1]);
  return status;
}

kiln_status_t kiln_cl_buffer_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *src,
                                  size_t src_offset, kiln_backend_buffer_t *dst, size_t dst_offset, size_t size) {
  if (size == 0) return KILN_OK;
  if (src->device->context == dst->device->context)
    return kiln_cl_check(ctx,
                         clEnqueueCopyBuffer(queue->queue, src->mem, dst->mem, src_offset, dst_offset, size, 0, NULL,
                                             NULL),
                         "clEnqueueCopyBuffer(%zu bytes) on opencl:%zu", size, queue->device->index);
  return copy_across(ctx, queue, src, src_offset, dst, dst_offset, size);
}

kiln_status_t kiln_cl_buffer_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  kiln_backend_buffer_t *buffer, size_t offset, size_t size, const void *pattern,
                                  size_t pattern_size) {
  if (size == 0) return KILN_OK;
  if (offset % pattern_size == 0)
    return kiln_cl_check(ctx,
                         clEnqueueFillBuffer(queue->queue, buffer->mem, pattern, pattern_size, offset, size, 0, NULL,
                                             NULL),
                         "clEnqueueFillBuffer(%zu bytes at offset %zu, %zu-byte pattern) on opencl:%zu", size, offset,
                         pattern_size, queue->device->index);
  /* OpenCL wants the offset aligned to the pattern: write the bytes instead
   * (blocking, so the temporary can go at once). */
  unsigned char *bytes = malloc(size);
  if (!bytes)
    return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory filling %zu bytes of opencl:%zu", size,
                         queue->device->index);
  for (size_t i = 0; i < size; i += pattern_size) memcpy(bytes + i, pattern, pattern_size);
  kiln_status_t status = kiln_cl_buffer_write(ctx, queue, buffer, offset, bytes, size, true);
  free(bytes);
  return status;
}
