/* backends/cuda/cublas.c: the cublas provider for MATMUL in f32, f64, f16 and bf16: cuBLAS loaded at run time through a function-pointer table. */
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
  kiln_cublas_dgemm_fn dgemm;
  kiln_cublas_dgemm_strided_batched_fn dgemm_strided_batched;
  kiln_cublas_gemm_ex_fn gemm_ex;
  kiln_cublas_gemm_strided_batched_ex_fn gemm_strided_batched_ex;
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
      {"cublasDgemm_v2", offsetof(kiln_cuda_cublas_t, dgemm)},
      {"cublasDgemmStridedBatched", offsetof(kiln_cuda_cublas_t, dgemm_strided_batched)},
      {"cublasGemmEx", offsetof(kiln_cuda_cublas_t, gemm_ex)},
      {"cublasGemmStridedBatchedEx", offsetof(kiln_cuda_cublas_t, gemm_strided_batched_ex)},
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
       * user asked for it (KILN_CUDA_TF32=1). f16 and bf16 run on tensor
       * cores under either mode (what 16-bit is for on a GPU), their
       * products summed in f32; DISALLOW_REDUCED_PRECISION_REDUCTION keeps
       * a split-k's partial sums in f32 too, not rounded to the 16-bit
       * output between parts, so the result is rounded once, as the
       * native GEMM and the CPU round it. */
      const int math = ctx->tf32 ? KILN_CUBLAS_TF32_TENSOR_OP_MATH : KILN_CUBLAS_DEFAULT_MATH;
      if (status == KILN_OK)
        status = kiln_cuda_cublas_check(
            ctx, cublas->set_math_mode(handle, math | KILN_CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION),
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

/* One float dtype throughout: SGEMM, DGEMM, or GemmEx for f16 and bf16
 * (the native GEMM computes the same dtypes; the rest are refused there). */
bool kiln_cuda_cublas_takes(const kiln_op_t *op, kiln_dtype_t *out_bad) {
  return kiln_cuda_one_float_dtype(op, out_bad);
}

bool kiln_cuda_cublas_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                               const kiln_op_entry_t *entry, const kiln_op_t *op) {
  if (!ctx->cublas || atomic_load_explicit(&device->cublas_failed, memory_order_relaxed)) return false;
  if (!op) return true;
  if (!kiln_cuda_cublas_takes(op, NULL)) return false;
  /* k == 0 is an empty sum, written as zeros without cuBLAS. */
  if (op->u.matmul.k == 0) return true;
  /* cuBLAS takes int sizes: beyond them the native provider runs. */
  return fits_int(op->u.matmul.m) && fits_int(op->u.matmul.n) && fits_int(op->u.matmul.k) &&
         fits_int(op->u.matmul.lda) && fits_int(op->u.matmul.ldb) && fits_int(op->u.matmul.ldc) &&
         fits_int(op->u.matmul.batch);
}

/* The one GEMM call of op's dtype: Sgemm, Dgemm, or GemmEx (A, B and C in
 * CUDA_R_16F or CUDA_R_16BF, CUBLAS_COMPUTE_32F with float alpha and beta,
 * CUBLAS_GEMM_DEFAULT: cuBLAS picks the kernel, tensor cores included), or
 * their strided-batched forms when batch > 1. Row-major C = op(A) op(B) is
 * column-major C^T = op(B)^T op(A)^T: the same memory, so the operands are
 * swapped and each keeps its transposition. */
static kiln_status_t gemm(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_cublas_handle_t handle,
                          const kiln_op_t *op) {
  const kiln_cuda_cublas_t *cublas = ctx->cublas;
  const int m = (int)op->u.matmul.m, n = (int)op->u.matmul.n, k = (int)op->u.matmul.k;
  const int batch = (int)op->u.matmul.batch;
  const int lda = (int)op->u.matmul.lda, ldb = (int)op->u.matmul.ldb, ldc = (int)op->u.matmul.ldc;
  const long long sa = op->u.matmul.stride_a, sb = op->u.matmul.stride_b, sc = op->u.matmul.stride_c;
  const void *a = (const void *)(uintptr_t)kiln_cuda_view_ptr(&op->in[0]);
  const void *b = (const void *)(uintptr_t)kiln_cuda_view_ptr(&op->in[1]);
  void *c = (void *)(uintptr_t)kiln_cuda_view_ptr(&op->out);
  const int op_a = op->u.matmul.trans_a ? KILN_CUBLAS_OP_T : KILN_CUBLAS_OP_N;
  const int op_b = op->u.matmul.trans_b ? KILN_CUBLAS_OP_T : KILN_CUBLAS_OP_N;
  const float alpha = 1.0f, beta = 0.0f; /* f32, f16 and bf16 (COMPUTE_32F scales in float) */
  const double alpha64 = 1.0, beta64 = 0.0;
  kiln_cublas_status_t r;
  const char *call;
  switch (op->out.dtype) {
  case KILN_F64:
    call = batch == 1 ? "cublasDgemm" : "cublasDgemmStridedBatched";
    r = batch == 1 ? cublas->dgemm(handle, op_b, op_a, n, m, k, &alpha64, b, ldb, a, lda, &beta64, c, ldc)
                   : cublas->dgemm_strided_batched(handle, op_b, op_a, n, m, k, &alpha64, b, ldb, sb, a, lda, sa,
                                                   &beta64, c, ldc, sc, batch);
    break;
  case KILN_F16:
  case KILN_BF16: {
    const int type = op->out.dtype == KILN_F16 ? KILN_CUDA_R_16F : KILN_CUDA_R_16BF;
    call = batch == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx";
    r = batch == 1 ? cublas->gemm_ex(handle, op_b, op_a, n, m, k, &alpha, b, type, ldb, a, type, lda, &beta, c, type,
                                     ldc, KILN_CUBLAS_COMPUTE_32F, KILN_CUBLAS_GEMM_DEFAULT)
                   : cublas->gemm_strided_batched_ex(handle, op_b, op_a, n, m, k, &alpha, b, type, ldb, sb, a, type,
                                                     lda, sa, &beta, c, type, ldc, sc, batch, KILN_CUBLAS_COMPUTE_32F,
                                                     KILN_CUBLAS_GEMM_DEFAULT);
    break;
  }
  default: /* f32: supports() admits no other dtype */
    call = batch == 1 ? "cublasSgemm" : "cublasSgemmStridedBatched";
    r = batch == 1 ? cublas->sgemm(handle, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc)
                   : cublas->sgemm_strided_batched(handle, op_b, op_a, n, m, k, &alpha, b, ldb, sb, a, lda, sa, &beta,
                                                   c, ldc, sc, batch);
    break;
  }
  return kiln_cuda_cublas_check(ctx, r, "%s(%s, batch=%d m=%d n=%d k=%d) on cuda:%d", call,
                                kiln_backend_dtype_name(op->out.dtype), batch, m, n, k, queue->device->ordinal);
}

kiln_status_t kiln_cuda_cublas_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  const kiln_cuda_cublas_t *cublas = ctx->cublas;
  if (!cublas)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE, "provider 'cublas' is absent (%s); use 'native'", ctx->cublas_state);
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k, batch = op->u.matmul.batch;
  if (k == 0) {
    /* An empty sum: zeros (all-zero bits in every float dtype), without
     * asking cuBLAS about leading dimensions of empty matrices. */
    const size_t bytes = (size_t)(batch * m * n) * kiln_backend_dtype_size(op->out.dtype);
    return kiln_cuda_check(ctx, cuMemsetD8Async(kiln_cuda_view_ptr(&op->out), 0, bytes, queue->stream),
                           "cuMemsetD8Async (matmul with k=0, %zu bytes) on cuda:%d", bytes, queue->device->ordinal);
  }
  pthread_mutex_lock(&queue->lock);
  kiln_cublas_handle_t handle = NULL;
  kiln_status_t status = queue_handle(ctx, queue, &handle);
  if (status == KILN_OK) status = gemm(ctx, queue, handle, op);
  pthread_mutex_unlock(&queue->lock);
  return status;
}
