/* kiln/dlpack.h: kiln tensors exchanged with NumPy, PyTorch, CuPy and other frameworks through DLPack, without copies. */
#ifndef KILN_DLPACK_H
#define KILN_DLPACK_H

/* Not included by kiln.h: this header needs DLPack's own, <dlpack/dlpack.h>
 * (Debian: libdlpack-dev). Both forms of the exchange are supported:
 * DLManagedTensor (DLPack 0.x, which NumPy 1.24 and PyTorch 1.13 speak) and
 * DLManagedTensorVersioned (DLPack 1.x, which NumPy 2 and PyTorch 2 ask for);
 * where the installed header predates 1.x, its layout is declared here from
 * the specification.
 *
 * Devices: kiln's CPU backend is kDLCPU (device_id 0), its CUDA devices
 * kDLCUDA with the CUDA ordinal, its OpenCL devices kDLOpenCL with their
 * index in kiln's OpenCL backend (data is then a cl_mem, as DLPack says).
 * dtypes: f32 (kDLFloat, 32 bits) and i32 (kDLInt, 32 bits), one lane. */

#include <dlpack/dlpack.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#if !defined(DLPACK_MAJOR_VERSION)
/* DLPack 1.x's versioned exchange, from the specification (dlpack.h 1.0). */
#define KILN_DLPACK_DECLARES_VERSIONED 1
typedef struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* The DLPack version kiln's versioned exports carry (1.0). */
#define KILN_DLPACK_MAJOR 1u
#define KILN_DLPACK_MINOR 0u

/* Export: a DLPack tensor over the tensor's own memory, no copy; its shape,
 * strides and offset are the tensor's (strides in elements, data the
 * memory's base, byte_offset the tensor's first element). It holds a
 * reference to the tensor until the consumer calls its deleter exactly once;
 * the caller owns the returned object. Blocks until the work already
 * enqueued on the tensor's device is done, so the consumer may read (or
 * write) it at once; writes through it are seen by kiln operations enqueued
 * after they complete. KILN_UNSUPPORTED for a backend without DLPack
 * support; KILN_DTYPE_MISMATCH for f16/bf16 tensors. */
kiln_status_t kiln_tensor_to_dlpack(kiln_tensor_t *tensor, DLManagedTensor **out_managed);
kiln_status_t kiln_tensor_to_dlpack_versioned(kiln_tensor_t *tensor, DLManagedTensorVersioned **out_managed);

/* Import: a kiln tensor viewing the DLPack tensor's memory, no copy, on the
 * kiln device DLPack names (kiln_device_dlpack says which is which). On
 * success kiln owns `managed` and calls its deleter once it no longer needs
 * the memory (after the last tensor viewing it is released and the work
 * using it is done); on failure the caller still owns it. The producer must
 * have finished writing it (DLPack's stream rule: the consumer's stream is
 * the producer's to order; kiln's queues then see it as it is). Errors, each
 * naming the value: a device kiln does not have (KILN_NOT_FOUND), a dtype
 * other than f32/i32 (KILN_DTYPE_MISMATCH), negative strides, more than
 * KILN_MAX_DIMS dimensions, a byte_offset that is not a whole number of
 * elements, or a byte_offset, shape and strides whose bytes overflow or reach
 * past 2^57 bytes (more than any device addresses) or past the top of the
 * address space (KILN_INVALID_ARGUMENT), a versioned tensor of a major
 * version other than 1 (KILN_UNSUPPORTED). A versioned tensor flagged
 * read-only imports as a tensor no writer writes: kiln_buffer_write,
 * kiln_buffer_fill, kiln_buffer_copy into it and the updates in place
 * (kiln_tensor_accumulate, kiln_tensor_sgd_update, kiln_tensor_adam_update)
 * refuse it with KILN_INVALID_ARGUMENT, naming it; kiln's other operations
 * never write their inputs. */
kiln_status_t kiln_tensor_from_dlpack(DLManagedTensor *managed, kiln_tensor_t **out);
kiln_status_t kiln_tensor_from_dlpack_versioned(DLManagedTensorVersioned *managed, kiln_tensor_t **out);

/* The DLPack device of a kiln device. KILN_UNSUPPORTED when its backend has
 * no DLPack support. Never blocks. */
kiln_status_t kiln_device_dlpack(const kiln_device_t *device, DLDevice *out_device);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_DLPACK_H */
