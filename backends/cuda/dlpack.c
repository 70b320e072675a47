/* backends/cuda/dlpack.c: DLPack for the CUDA backend: its devices as kDLCUDA, buffers handed out as their CUdeviceptr, and device memory of other frameworks wrapped without a copy. */
/*
 * DLPack names CUDA memory by the device's ordinal and a CUdeviceptr (the
 * same number as the runtime API's device pointer), which is what kiln's
 * buffers hold. kiln uses each device's primary context, the one the CUDA
 * runtime (and so PyTorch, CuPy, JAX) uses, and with unified addressing a
 * pointer means the same in every context of the process.
 *
 * Ordering (DLPack's stream rule). Export: the core waits for the work
 * already enqueued on the tensor before it hands the pointer out, so the
 * consumer may use it on any stream at once. Import: the producer must have
 * finished writing the memory, or ordered its writes before kiln's work
 * (include/kiln/dlpack.h): kiln's queues use the memory as it is from then
 * on, and hand it back (the deleter, called by the core) only once their
 * work on it is done. Memory imported is never freed here: buffer_free
 * forgets the record alone.
 */
#include <stdint.h>
#include <stdlib.h>

#include "backends/cuda/cuda_backend.h"

void kiln_cuda_dlpack_device(kiln_backend_context_t *ctx, kiln_backend_device_t *device, int32_t *out_type,
                             int32_t *out_id) {
  *out_type = 2; /* kDLCUDA */
  *out_id = device->ordinal;
}

void *kiln_cuda_buffer_handle(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer) {
  return (void *)(uintptr_t)buffer->ptr;
}

/* What the driver knows of `ptr`: that it is device memory, of this device,
 * and that its allocation holds `size` bytes from it. */
static kiln_status_t check_pointer(kiln_backend_context_t *ctx, kiln_backend_device_t *device, CUdeviceptr ptr,
                                   size_t size) {
  unsigned int type = 0;
  CUresult r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
  if (r != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE)
    return kiln_cuda_error(ctx, KILN_INVALID_ARGUMENT,
                           "the imported kDLCUDA pointer 0x%llx is not device memory the CUDA driver knows (%s%s); "
                           "a kDLCUDA tensor must point into memory allocated on a GPU (cuMemAlloc, cudaMalloc, a "
                           "framework's allocator); pass host memory as kDLCPU or kDLCUDAHost",
                           (unsigned long long)ptr, r != CUDA_SUCCESS ? "cuPointerGetAttribute: " : "its memory type is ",
                           r != CUDA_SUCCESS ? kiln_cuda_result_name(r) : type == CU_MEMORYTYPE_HOST ? "host" : "other");
  int ordinal = -1;
  r = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
  kiln_status_t status =
      kiln_cuda_check(ctx, r, "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) of an imported pointer");
  if (status != KILN_OK) return status;
  if (ordinal != device->ordinal)
    return kiln_cuda_error(ctx, KILN_DEVICE_MISMATCH,
                           "the imported kDLCUDA pointer 0x%llx is memory of cuda:%d, but the DLPack tensor names "
                           "device %d (cuda:%d); give the tensor the device_id of its memory",
                           (unsigned long long)ptr, ordinal, device->ordinal, device->ordinal);
  CUdeviceptr start = 0;
  size_t range = 0;
  r = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr);
  if (r == CUDA_SUCCESS) r = cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr);
  status = kiln_cuda_check(ctx, r, "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_*) of an imported pointer");
  if (status != KILN_OK) return status;
  if (size > range - (size_t)(ptr - start))
    return kiln_cuda_error(ctx, KILN_INVALID_ARGUMENT,
                           "the imported kDLCUDA tensor reaches %zu bytes from 0x%llx, but its allocation "
                           "[0x%llx, +%zu) ends %zu bytes after it; pass a tensor within its memory",
                           size, (unsigned long long)ptr, (unsigned long long)start, range,
                           range - (size_t)(ptr - start));
  return KILN_OK;
}

kiln_status_t kiln_cuda_buffer_wrap(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *handle,
                                    size_t size, kiln_backend_buffer_t **out_buffer) {
  const CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)handle;
  if (ptr && size) {
    kiln_status_t status = kiln_cuda_enter(device);
    if (status != KILN_OK) return status;
    status = check_pointer(ctx, device, ptr, size);
    kiln_cuda_leave();
    if (status != KILN_OK) return status;
  }
  kiln_backend_buffer_t *buffer = calloc(1, sizeof *buffer);
  if (!buffer) return kiln_cuda_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for a CUDA buffer record");
  buffer->device = device;
  buffer->ptr = size ? ptr : 0;
  buffer->size = size;
  buffer->wrapped = true;
  *out_buffer = buffer;
  return KILN_OK;
}
