/* backends/cpu/ops.c: which providers serve each op on a CPU device, and running one op on a queue's worker. */
#include <limits.h>

#include "backends/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_native.h"

uint32_t kiln_cpu_op_providers(kiln_backend_device_t *device, kiln_op_kind_t kind, kiln_dtype_t dtype) {
  if (!kiln_backend_native_supports(kind, dtype)) return 0;
  uint32_t mask = 1u << KILN_PROVIDER_NATIVE;
  if ((kind == KILN_OP_MATMUL || kind == KILN_OP_CONV2D) && dtype == KILN_F32 && kiln_cpu_blas_available())
    mask |= 1u << KILN_PROVIDER_BLAS;
  return mask;
}

/* CBLAS takes int sizes. */
static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

kiln_status_t kiln_cpu_op_check(kiln_provider_t provider, const kiln_op_t *op) {
  if (!kiln_backend_native_supports_op(op))
    return kiln_cpu_host.set_error(KILN_UNSUPPORTED,
                                   "the CPU backend has no kernel for %s on %s (output %s); "
                                   "convert the operands to a supported dtype (f32, or i32 where the op has an "
                                   "integer formula)",
                                   kiln_backend_op_kind_name(op->kind), kiln_backend_dtype_name(op->in[0].dtype),
                                   kiln_backend_dtype_name(op->out.dtype));
  if (provider == KILN_PROVIDER_NATIVE) return KILN_OK;
  if (provider != KILN_PROVIDER_BLAS || (op->kind != KILN_OP_MATMUL && op->kind != KILN_OP_CONV2D))
    return kiln_cpu_host.set_error(KILN_UNSUPPORTED,
                                   "provider '%s' does not run %s on the CPU backend; use 'native'%s",
                                   kiln_backend_provider_name(provider), kiln_backend_op_kind_name(op->kind),
                                   op->kind == KILN_OP_MATMUL || op->kind == KILN_OP_CONV2D ? " or 'blas'" : "");
  if (!kiln_cpu_blas_available())
    return kiln_cpu_host.set_error(KILN_UNSUPPORTED,
                                   "provider 'blas' is absent: kiln was built without a CBLAS "
                                   "(rebuild with OpenBLAS installed, or use 'native')");
  if (op->kind == KILN_OP_MATMUL) {
    const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(op->u.matmul.lda) ||
        !fits_int(op->u.matmul.ldb) || !fits_int(op->u.matmul.ldc))
      return kiln_cpu_host.set_error(KILN_UNSUPPORTED,
                                     "provider 'blas' takes int sizes; matmul m=%lld n=%lld k=%lld is too large "
                                     "for it (the native provider runs it)",
                                     (long long)m, (long long)n, (long long)k);
  } else {
    const int64_t crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s;
    const int64_t pq = op->u.conv2d.p * op->u.conv2d.q;
    if (!fits_int(crs) || !fits_int(pq) || !fits_int(op->u.conv2d.k))
      return kiln_cpu_host.set_error(KILN_UNSUPPORTED,
                                     "provider 'blas' takes int sizes; conv2d c*r*s=%lld p*q=%lld k=%lld is too "
                                     "large for it (the native provider runs it)",
                                     (long long)crs, (long long)pq, (long long)op->u.conv2d.k);
  }
  return KILN_OK;
}

/* Element 0 of a view, in bytes. */
static void *view_ptr(const kiln_view_t *view) {
  return (char *)view->buffer->data + view->offset * kiln_cpu_dtype_size(view->dtype);
}

void kiln_cpu_op_execute(kiln_backend_device_t *device, kiln_provider_t provider, const kiln_op_t *op) {
  kiln_cpu_pool_t *pool = device->pool;
  void *out = view_ptr(&op->out);
  switch (op->kind) {
  case KILN_OP_FILL: kiln_cpu_fill(pool, op, out); break;
  case KILN_OP_ARANGE: kiln_cpu_arange(pool, op, out); break;
  case KILN_OP_RANDOM: kiln_cpu_random(pool, op, out); break;
  case KILN_OP_COPY: kiln_cpu_copy(pool, op, view_ptr(&op->in[0]), out); break;
  case KILN_OP_UNARY: kiln_cpu_unary(pool, op, view_ptr(&op->in[0]), out); break;
  case KILN_OP_BINARY: kiln_cpu_binary(pool, op, view_ptr(&op->in[0]), view_ptr(&op->in[1]), out); break;
  case KILN_OP_BINARY_SCALAR: kiln_cpu_binary_scalar(pool, op, view_ptr(&op->in[0]), out); break;
  case KILN_OP_REDUCE: kiln_cpu_reduce(pool, op, view_ptr(&op->in[0]), out); break;
  case KILN_OP_SOFTMAX: kiln_cpu_softmax(pool, op, view_ptr(&op->in[0]), out); break;
  case KILN_OP_CROSS_ENTROPY:
    kiln_cpu_cross_entropy(pool, op, view_ptr(&op->in[0]), view_ptr(&op->in[1]), out);
    break;
  case KILN_OP_MATMUL: {
    /* These take the buffers' element 0 and apply the offsets themselves. */
    const float *a = op->in[0].buffer->data, *b = op->in[1].buffer->data;
    float *c = op->out.buffer->data;
    if (provider == KILN_PROVIDER_BLAS)
      kiln_cpu_matmul_blas(pool, op, a, b, c);
    else
      kiln_cpu_matmul_native(pool, op, a, b, c);
    break;
  }
  case KILN_OP_CONV2D: {
    const float *bias = op->u.conv2d.has_bias ? view_ptr(&op->in[2]) : NULL;
    if (provider == KILN_PROVIDER_BLAS)
      kiln_cpu_conv2d_blas(pool, op, view_ptr(&op->in[0]), view_ptr(&op->in[1]), bias, out);
    else
      kiln_cpu_conv2d_native(pool, op, view_ptr(&op->in[0]), view_ptr(&op->in[1]), bias, out);
    break;
  }
  case KILN_OP_MAX_POOL2D: kiln_cpu_max_pool2d_native(pool, op, view_ptr(&op->in[0]), out); break;
  default: break;
  }
}
