/* backends/cuda/cublas.c: the cublas provider for MATMUL: cuBLAS loaded at run time through a function-pointer table. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/vendor_api.h"

/* The functions, from dlsym (vendor_api.h declares their types), so that a
 * machine without cuBLAS still loads the plugin and a build without its
 * headers still makes it. */
struct kiln_cuda_cublas_t {
  void *dl; /* the dlopen handle of libcublas */
  kiln_cublas_create_fn create;
  kiln_cublas_destroy_fn destroy;
  kiln_cublas_set_stream_fn set_stream;
  kiln_cublas_set_math_mode_fn set_math_mode;
  kiln_cublas_get_property_fn get_property;
  kiln_cublas_sgemm_fn sgemm;
  kiln_cublas_sgemm_strided_batched_fn sgemm_strided_batched;
};

bool kiln_cuda_cublas_load(kiln_backend_context_t *ctx, char *out_reason, size_t reason_size) {
  static const char *const names[] = {"libcublas.so.13", "libcublas.so"};
  ctx->cublas = NULL;
  if (!kiln_cuda_vendor_wanted(ctx, KILN_CUDA_VENDOR_CUBLAS, out_reason, reason_size)) return false;
  kiln_cuda_cublas_t *cublas = calloc(1, sizeof *cublas);
  if (!cublas) {
    snprintf(out_reason, reason_size, "out of host memory");
    return false;
  }
  void *library = kiln_cuda_vendor_open(KILN_CUDA_VENDOR_CUBLAS, names, 2, ctx->cublas_path, sizeof ctx->cublas_path,
                                        out_reason, reason_size);
  if (!library) {
    free(cublas);
    return false;
  }
  static const struct { const char *symbol; size_t offset; } syms[] = {
      {"cublasCreate_v2", offsetof(kiln_cuda_cublas_t, create)},
      {"cublasDestroy_v2", offsetof(kiln_cuda_cublas_t, destroy)},
      {"cublasSetStream_v2", offsetof(kiln_cuda_cublas_t, set_stream)},
      {"cublasSetMathMode", offsetof(kiln_cuda_cublas_t, set_math_mode)},
      {"cublasGetProperty", offsetof(kiln_cuda_cublas_t, get_property)},
      {"cublasSgemm_v2", offsetof(kiln_cuda_cublas_t, sgemm)},
      {"cublasSgemmStridedBatched", offsetof(kiln_cuda_cublas_t, sgemm_strided_batched)},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    if (!kiln_cuda_vendor_sym(library, syms[i].symbol, (char *)cublas + syms[i].offset, sizeof(void (*)(void)))) {
      snprintf(out_reason, reason_size, "%s lacks %s (a cuBLAS older than 12?)", ctx->cublas_path, syms[i].symbol);
      dlclose(library);
      free(cublas);
      return false;
    }
  }
  cublas->dl = library;
  int major = 0, minor = 0, patch = 0;
  (void)cublas->get_property(KILN_LIBRARY_MAJOR_VERSION, &major);
  (void)cublas->get_property(KILN_LIBRARY_MINOR_VERSION, &minor);
  (void)cublas->get_property(KILN_LIBRARY_PATCH_LEVEL, &patch);
  snprintf(ctx->cublas_version, sizeof ctx->cublas_version, "cuBLAS %d.%d.%d", major, minor, patch);
  ctx->cublas = cublas;
  return true;
}

void kiln_cuda_cublas_unload(kiln_backend_context_t *ctx) {
  /* The library stays mapped: cuBLAS keeps per-thread state and exit
   * handlers that must not outlive its code. */
  free(ctx->cublas);
  ctx->cublas = NULL;
}

void kiln_cuda_cublas_queue_release(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  if (queue->cublas && ctx->cublas) (void)ctx->cublas->destroy((kiln_cublas_handle_t)queue->cublas);
  queue->cublas = NULL;
}

/* The queue's handle, bound to its stream; created on first use with the
 * device's context current. Called with queue->lock held. A handle cuBLAS
 * cannot make (other than for want of memory) means cuBLAS cannot start on
 * this device: KILN_UNAVAILABLE, and the core stops offering the row here. */
static kiln_status_t queue_handle(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  kiln_cublas_handle_t *out_handle) {
  const kiln_cuda_cublas_t *cublas = ctx->cublas;
  if (!queue->cublas) {
    kiln_cublas_handle_t handle = NULL;
    kiln_status_t status =
        kiln_cuda_cublas_check(ctx, cublas->create(&handle), "cublasCreate on cuda:%d", queue->device->ordinal);
    if (status == KILN_OK) {
      status = kiln_cuda_cublas_check(ctx, cublas->set_stream(handle, queue->stream), "cublasSetStream");
      /* CUBLAS_DEFAULT_MATH keeps f32 products in f32: TF32 only when the
       * user asked for it (KILN_CUDA_TF32=1). */
      if (status == KILN_OK)
        status = kiln_cuda_cublas_check(
            ctx, cublas->set_math_mode(handle, ctx->tf32 ? KILN_CUBLAS_TF32_TENSOR_OP_MATH : KILN_CUBLAS_DEFAULT_MATH),
            "cublasSetMathMode");
      if (status != KILN_OK) (void)cublas->destroy(handle);
    }
    if (status == KILN_OUT_OF_MEMORY) return status;
    if (status != KILN_OK) {
      /* Remembered here too, so that supports() says so at once. */
      atomic_store_explicit(&queue->device->cublas_failed, true, memory_order_relaxed);
      return kiln_cuda_error(ctx, KILN_UNAVAILABLE, "cuBLAS cannot start on cuda:%d (%s); the native provider runs "
                                                    "matmul there",
                             queue->device->ordinal, ctx->host.last_error());
    }
    queue->cublas = handle;
  }
  *out_handle = (kiln_cublas_handle_t)queue->cublas;
  return KILN_OK;
}

static bool fits_int(int64_t v) { return v >= 1 && v <= INT_MAX; }

bool kiln_cuda_cublas_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                               const kiln_op_entry_t *entry, const kiln_op_t *op) {
  if (!ctx->cublas || atomic_load_explicit(&device->cublas_failed, memory_order_relaxed)) return false;
  if (!op) return true;
  /* SGEMM: f32 only (the other dtypes run native, or are refused there). */
  if (!kiln_backend_op_dtypes_in(op, 1u << KILN_F32, 1u << KILN_F32, NULL)) return false;
  /* k == 0 is an empty sum, written as zeros without cuBLAS. */
  if (op->u.matmul.k == 0) return true;
  /* cuBLAS takes int sizes: beyond them the native provider runs. */
  return fits_int(op->u.matmul.m) && fits_int(op->u.matmul.n) && fits_int(op->u.matmul.k) &&
         fits_int(op->u.matmul.lda) && fits_int(op->u.matmul.ldb) && fits_int(op->u.matmul.ldc) &&
         fits_int(op->u.matmul.batch);
}

kiln_status_t kiln_cuda_cublas_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  const kiln_cuda_cublas_t *cublas = ctx->cublas;
  if (!cublas)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE, "provider 'cublas' is absent (%s); use 'native'", ctx->cublas_state);
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k, batch = op->u.matmul.batch;
  const CUdeviceptr a = kiln_cuda_view_ptr(&op->in[0]), b = kiln_cuda_view_ptr(&op->in[1]);
  const CUdeviceptr c = kiln_cuda_view_ptr(&op->out);
  if (k == 0)
    /* An empty sum: zeros, without asking cuBLAS about leading dimensions of
     * empty matrices. */
    return kiln_cuda_check(ctx, cuMemsetD32Async(c, 0u, (size_t)(batch * m * n), queue->stream),
                           "cuMemsetD32Async (matmul with k=0) on cuda:%d", queue->device->ordinal);
  /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
   * same memory, so swap the operands and keep each one's transposition. */
  const int op_a = op->u.matmul.trans_a ? KILN_CUBLAS_OP_T : KILN_CUBLAS_OP_N;
  const int op_b = op->u.matmul.trans_b ? KILN_CUBLAS_OP_T : KILN_CUBLAS_OP_N;
  const float alpha = 1.0f, beta = 0.0f;
  pthread_mutex_lock(&queue->lock);
  kiln_cublas_handle_t handle = NULL;
  kiln_status_t status = queue_handle(ctx, queue, &handle);
  if (status == KILN_OK) {
    if (batch == 1) {
      status = kiln_cuda_cublas_check(
          ctx, cublas->sgemm(handle, op_b, op_a, (int)n, (int)m, (int)k, &alpha, (const float *)(uintptr_t)b,
                       (int)op->u.matmul.ldb, (const float *)(uintptr_t)a, (int)op->u.matmul.lda, &beta,
                       (float *)(uintptr_t)c, (int)op->u.matmul.ldc),
          "cublasSgemm(m=%lld n=%lld k=%lld) on cuda:%d", (long long)m, (long long)n, (long long)k,
          queue->device->ordinal);
    } else {
      status = kiln_cuda_cublas_check(
          ctx,
          cublas->sgemm_strided_batched(handle, op_b, op_a, (int)n, (int)m, (int)k, &alpha, (const float *)(uintptr_t)b,
                                        (int)op->u.matmul.ldb, op->u.matmul.stride_b, (const float *)(uintptr_t)a,
                                        (int)op->u.matmul.lda, op->u.matmul.stride_a, &beta, (float *)(uintptr_t)c,
                                        (int)op->u.matmul.ldc, op->u.matmul.stride_c, (int)batch),
          "cublasSgemmStridedBatched(batch=%lld m=%lld n=%lld k=%lld) on cuda:%d", (long long)batch, (long long)m,
          (long long)n, (long long)k, queue->device->ordinal);
    }
  }
  pthread_mutex_unlock(&queue->lock);
  return status;
}
