/* backends/cpu/ops.c: the CPU backend's table of operations: a row per op kind and provider, each naming its kernel. */
#include <limits.h>

#include "backends/cpu/cpu_backend.h"

/* ---- the `blas` provider's limits -------------------------------------------- */

/* CBLAS takes int sizes. */
static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* Every product of a convolution or its gradients has sizes and leading
 * dimensions of at most C*R*S, P*Q and K, whichever way round
 * (kernels/cpu/conv_backward.c). */
static bool conv_fits_int(const kiln_op_t *op) {
  const int64_t crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s;
  return fits_int(crs) && fits_int(op->u.conv2d.p * op->u.conv2d.q) && fits_int(op->u.conv2d.k);
}

static bool blas_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device, const kiln_op_entry_t *entry,
                          const kiln_op_t *op) {
  if (!kiln_cpu_blas_available()) return false;
  if (!op) return true;
  /* The library has GEMMs in f32 and f64 only, and kiln lowers only f32
   * convolutions onto it; the rest run natively (f16 and bf16 through kiln's
   * f32 kernels). */
  if (op->out.dtype != KILN_F32 && !(op->kind == KILN_OP_MATMUL && op->out.dtype == KILN_F64)) return false;
  switch (op->kind) {
  case KILN_OP_MATMUL:
    return fits_int(op->u.matmul.m) && fits_int(op->u.matmul.n) && fits_int(op->u.matmul.k) &&
           fits_int(op->u.matmul.lda) && fits_int(op->u.matmul.ldb) && fits_int(op->u.matmul.ldc);
  /* Where kiln's own kernel is the faster one (the direct weight gradient;
   * the forward through its AVX-512 GEMM tile), `blas` declines, so that the
   * core runs `native` under every policy. */
  case KILN_OP_CONV2D: return !kiln_cpu_conv2d_native_preferred(op) && conv_fits_int(op);
  case KILN_OP_CONV2D_BACKWARD_WEIGHT: return !kiln_cpu_conv2d_backward_weight_direct(op) && conv_fits_int(op);
  case KILN_OP_CONV2D_BACKWARD_INPUT: return conv_fits_int(op);
  default: return false;
  }
}

/* ---- the table ------------------------------------------------------------------ */

#define ROW(KIND, PROVIDER, SUPPORTS, KERNEL) \
  {KILN_OP_##KIND, PROVIDER, SUPPORTS, kiln_cpu_op_run, &(const kiln_cpu_kernel_t){kiln_cpu_##KERNEL}}

const kiln_op_entry_t kiln_cpu_ops[] = {
    ROW(FILL, "native", NULL, fill),
    ROW(ARANGE, "native", NULL, arange),
    ROW(RANDOM, "native", NULL, random),
    ROW(COPY, "native", NULL, copy),
    ROW(CAST, "native", NULL, cast),
    ROW(UNARY, "native", NULL, unary),
    ROW(BINARY, "native", NULL, binary),
    ROW(BINARY_SCALAR, "native", NULL, binary_scalar),
    ROW(REDUCE, "native", NULL, reduce),
    ROW(SOFTMAX, "native", NULL, softmax),
    ROW(CROSS_ENTROPY, "native", NULL, cross_entropy),
    ROW(MATMUL, "native", NULL, matmul_native),
    ROW(MATMUL, "blas", blas_supports, matmul_blas),
    ROW(CONV2D, "native", NULL, conv2d_native),
    ROW(CONV2D, "blas", blas_supports, conv2d_blas),
    ROW(MAX_POOL2D, "native", NULL, max_pool2d_native),
    ROW(UNARY_BACKWARD, "native", NULL, unary_backward),
    ROW(SOFTMAX_BACKWARD, "native", NULL, softmax_backward),
    ROW(CROSS_ENTROPY_BACKWARD, "native", NULL, cross_entropy_backward),
    ROW(CONV2D_BACKWARD_INPUT, "native", NULL, conv2d_backward_input_native),
    ROW(CONV2D_BACKWARD_INPUT, "blas", blas_supports, conv2d_backward_input_blas),
    ROW(CONV2D_BACKWARD_WEIGHT, "native", NULL, conv2d_backward_weight_native),
    ROW(CONV2D_BACKWARD_WEIGHT, "blas", blas_supports, conv2d_backward_weight_blas),
    ROW(MAX_POOL2D_BACKWARD, "native", NULL, max_pool2d_backward_native),
    ROW(ACCUMULATE, "native", NULL, accumulate),
    ROW(SGD_UPDATE, "native", NULL, sgd_update),
    ROW(ADAM_UPDATE, "native", NULL, adam_update),
    ROW(WHERE, "native", NULL, where),
    ROW(COMPARE, "native", NULL, compare),
    ROW(UNSCALE, "native", NULL, unscale),
    ROW(GATHER, "native", NULL, gather),
    ROW(INDEX_ADD, "native", NULL, index_add),
    KILN_OP_TABLE_END,
};
