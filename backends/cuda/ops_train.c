/* backends/cuda/ops_train.c: the native routines of the training kinds: unary, softmax, cross-entropy, convolution and max-pooling gradients, and the fused updates in place. */
#include <assert.h>
#include <limits.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

/* kiln_unary_grad_f32_<NAME> of kernels/cuda/train.cuh, by op, + 1 so that 0
 * means "none": every unary op has its derivative in ops.def (the core
 * checks at compile time). */
static const int unary_grad_f32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_GRAD_F32(NAME, expr) [KILN_UNARY_##NAME] = KILN_CUDA_K_unary_grad_f32_##NAME + 1,
#include "kernels/ops.def"
};

/* ---- gradients ------------------------------------------------------------------ */

/* dx = dy * f'(x): x and dy walk as the inputs of a binary op (the core's
 * merged dimensions, stride 0 where broadcast, ndim 0 when flat). */
kiln_status_t kiln_cuda_run_unary_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                           const kiln_op_t *op) {
  kiln_cuda_ew_args_t a;
  memset(&a, 0, offsetof(kiln_cuda_ew_args_t, shape));
  a.out = kiln_cuda_view_ptr(&op->out);
  a.in0 = kiln_cuda_view_ptr(&op->in[0]);
  a.in1 = kiln_cuda_view_ptr(&op->in[1]);
  kiln_cuda_ew_setup(&a, op, &op->in[0], &op->in[1]);
  const int k = unary_grad_f32[op->u.unary.op];
  assert(k > 0 && "a unary op without a derivative reached the CUDA backend");
  return kiln_cuda_launch_flat(queue, (kiln_cuda_kernel_t)(k - 1), a.n, &a);
}

/* One block per row, as the forward: a sum over the row, then the row's
 * gradient from it. */
kiln_status_t kiln_cuda_run_softmax_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                             const kiln_op_t *op) {
  kiln_cuda_rows_args_t a;
  memset(&a, 0, sizeof a);
  a.in = kiln_cuda_view_ptr(&op->in[0]);
  a.aux = kiln_cuda_view_ptr(&op->in[1]);
  a.out = kiln_cuda_view_ptr(&op->out);
  a.rows = op->u.softmax.rows;
  a.cols = op->u.softmax.cols;
  a.log = op->u.softmax.log;
  if (a.rows * a.cols == 0) return KILN_OK;
  return kiln_cuda_launch(queue, KILN_CUDA_K_softmax_backward_f32, kiln_cuda_grid_rows(a.rows), 1, 1,
                          KILN_CUDA_BLOCK, &a);
}

/* One block per row: the row's softmax, the label's one subtracted, the
 * scale dloss / n applied. dloss is read on the device (n_in 3), never
 * brought to the host. */
kiln_status_t kiln_cuda_run_cross_entropy_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                   const kiln_op_t *op) {
  kiln_cuda_rows_args_t a;
  memset(&a, 0, sizeof a);
  a.in = kiln_cuda_view_ptr(&op->in[0]);
  a.labels = kiln_cuda_view_ptr(&op->in[1]);
  a.aux = op->n_in == 3 ? kiln_cuda_view_ptr(&op->in[2]) : 0;
  a.out = kiln_cuda_view_ptr(&op->out);
  a.rows = op->u.cross_entropy.n;
  a.cols = op->u.cross_entropy.c;
  if (a.rows * a.cols == 0) return KILN_OK;
  return kiln_cuda_launch(queue, KILN_CUDA_K_xent_backward_f32, kiln_cuda_grid_rows(a.rows), 1, 1, KILN_CUDA_BLOCK,
                          &a);
}

/* How many images a round of a convolution's gradient takes: as many as
 * `per_image` bytes of scratch each fit in KILN_CUDA_IM2COL_BYTES, at least
 * one. */
static int64_t images_per_round(size_t per_image, int64_t n) {
  int64_t step = per_image ? (int64_t)(KILN_CUDA_IM2COL_BYTES / per_image) : n;
  if (step < 1) step = 1;
  if (step > n) step = n;
  return step;
}

/* dx = col2im(W^T @ dy): per image, the columns [c*r*s][p*q] by one batched
 * GEMM (W [k][c*r*s] transposed), then gathered into dx (no atomics). A 1x1
 * convolution of stride 1 without padding needs no columns: dx = W^T @ dy. */
kiln_status_t kiln_cuda_run_conv2d_backward_input(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                  const kiln_op_t *op) {
  kiln_cuda_conv_args_t a;
  kiln_cuda_conv_args(&a, op);
  const int64_t crs = a.c * a.r * a.s, pq = a.p * a.q;
  const CUdeviceptr dy = kiln_cuda_view_ptr(&op->in[0]), w = kiln_cuda_view_ptr(&op->in[1]);
  const CUdeviceptr dx = kiln_cuda_view_ptr(&op->out);
  kiln_cuda_gemm_args_t g;
  memset(&g, 0, sizeof g);
  g.a = w; /* W^T: A(i, l) = w[l * crs + i] */
  g.m = crs;
  g.n = pq;
  g.k = a.k;
  g.lda = crs;
  g.ldb = pq;
  g.stride_b = a.k * pq;
  g.ldc = pq;
  g.stride_c = crs * pq;
  const bool pointwise = a.r == 1 && a.s == 1 && a.stride[0] == 1 && a.stride[1] == 1 && a.pad[0] == 0 &&
                         a.pad[1] == 0 && a.p == a.h && a.q == a.w;
  if (pointwise) {
    g.b = dy;
    g.c = dx;
    g.batch = a.n;
    return kiln_cuda_gemm_native(queue, &g, true, false);
  }
  const size_t per_image = (size_t)crs * (size_t)pq * sizeof(float);
  const int64_t step = images_per_round(per_image, a.n);
  CUdeviceptr cols = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, per_image * (size_t)step, &cols);
  for (int64_t first = 0; status == KILN_OK && first < a.n; first += step) {
    const int64_t count = a.n - first < step ? a.n - first : step;
    g.b = dy + (CUdeviceptr)(first * a.k * pq) * 4u;
    g.c = cols;
    g.batch = count;
    status = kiln_cuda_gemm_native(queue, &g, true, false);
    if (status != KILN_OK) break;
    kiln_cuda_conv_args_t ca = a;
    ca.images = count;
    ca.in = cols;
    ca.out = dx + (CUdeviceptr)(first * a.c * a.h * a.w) * 4u;
    status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_col2im_f32, count * a.c * a.h * a.w, &ca);
  }
  kiln_cuda_scratch_free(queue, cols);
  return status;
}

/* dW [k][c*r*s] = sum over images of dy [k][p*q] @ columns [c*r*s][p*q]^T:
 * the columns and dy of a round of images laid out side by side
 * ([c*r*s][images*p*q], [k][images*p*q]), so one GEMM's depth runs over
 * every position of every image of the round and sums over them; the rounds
 * after the first add their part (the updates' accumulate kernel). No image:
 * dW is zeros. */
kiln_status_t kiln_cuda_run_conv2d_backward_weight(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                   const kiln_op_t *op) {
  kiln_cuda_conv_args_t a;
  kiln_cuda_conv_args(&a, op);
  const int64_t crs = a.c * a.r * a.s, pq = a.p * a.q;
  const CUdeviceptr x = kiln_cuda_view_ptr(&op->in[0]), dy = kiln_cuda_view_ptr(&op->in[1]);
  const CUdeviceptr dw = kiln_cuda_view_ptr(&op->out);
  if (a.n == 0 || pq == 0)
    return kiln_cuda_check(ctx, cuMemsetD32Async(dw, 0, (size_t)(a.k * crs), queue->stream),
                           "cuMemsetD32Async (conv2d_backward_weight of no image, %lld elements) on cuda:%d",
                           (long long)(a.k * crs), queue->device->ordinal);
  const size_t per_image = (size_t)(crs + a.k) * (size_t)pq * sizeof(float);
  const int64_t step = images_per_round(per_image, a.n);
  const bool several_rounds = step < a.n;
  const size_t cols_bytes = (size_t)(crs * step * pq) * sizeof(float);
  const size_t dy_bytes = (size_t)(a.k * step * pq) * sizeof(float);
  const size_t part_bytes = several_rounds ? (size_t)(a.k * crs) * sizeof(float) : 0;
  CUdeviceptr scratch = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, cols_bytes + dy_bytes + part_bytes, &scratch);
  const CUdeviceptr cols = scratch, packed = scratch + cols_bytes, part = packed + dy_bytes;
  for (int64_t first = 0; status == KILN_OK && first < a.n; first += step) {
    const int64_t count = a.n - first < step ? a.n - first : step, depth = count * pq;
    kiln_cuda_conv_args_t ca = a;
    ca.images = count;
    ca.in = x + (CUdeviceptr)(first * a.c * a.h * a.w) * 4u;
    ca.out = cols;
    status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_im2col_rows_f32, crs * depth, &ca);
    if (status != KILN_OK) break;
    ca.in = dy + (CUdeviceptr)(first * a.k * pq) * 4u;
    ca.out = packed;
    status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_pack_dy_f32, a.k * depth, &ca);
    if (status != KILN_OK) break;
    kiln_cuda_gemm_args_t g;
    memset(&g, 0, sizeof g);
    g.a = packed;
    g.b = cols; /* transposed: B(l, j) = cols[j * depth + l] */
    g.c = first == 0 ? dw : part;
    g.m = a.k;
    g.n = crs;
    g.k = depth;
    g.lda = depth;
    g.ldb = depth;
    g.ldc = crs;
    g.batch = 1;
    status = kiln_cuda_gemm_native(queue, &g, false, true);
    if (status != KILN_OK || first == 0) continue;
    kiln_cuda_update_args_t u;
    memset(&u, 0, sizeof u);
    u.param = dw;
    u.grad = part;
    u.n = a.k * crs;
    u.alpha = 1.0f;
    status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_accumulate_f32, u.n, &u);
  }
  kiln_cuda_scratch_free(queue, scratch);
  return status;
}

/* Two passes: where each window's first maximum is (an index per window, in
 * scratch memory), then a gather per element of dx over the windows covering
 * it, so no two threads write one place (no atomics, and the same sums in the
 * same order as the CPU's). */
kiln_status_t kiln_cuda_run_max_pool2d_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                const kiln_op_t *op) {
  kiln_cuda_conv_args_t a;
  kiln_cuda_pooling_args(&a, op);
  const int64_t windows = a.n * a.c * a.p * a.q;
  if (a.h * a.w > INT_MAX)
    return kiln_cuda_error(ctx, KILN_OUT_OF_RESOURCES,
                           "the native CUDA max_pool2d_backward takes planes of fewer than 2^31 elements, got "
                           "%lldx%lld; split the image",
                           (long long)a.h, (long long)a.w);
  CUdeviceptr index = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, (size_t)windows * sizeof(int32_t), &index);
  if (status == KILN_OK) {
    a.in = kiln_cuda_view_ptr(&op->in[0]);
    a.aux = kiln_cuda_view_ptr(&op->in[1]);
    a.out = kiln_cuda_view_ptr(&op->out);
    a.index = index;
    status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_max_pool2d_argmax_f32, windows, &a);
  }
  if (status == KILN_OK)
    status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_max_pool2d_backward_f32, a.n * a.c * a.h * a.w, &a);
  kiln_cuda_scratch_free(queue, index);
  return status;
}

/* ---- updates in place ------------------------------------------------------------------------
 * The core hands them over flat (one contiguous run per operand, none
 * sharing memory); `out` is the tensor updated. One kernel, no allocation:
 * the update is ordered on the queue after whatever made its operands. The
 * constants are folded as the CPU backend folds them (in double, rounded
 * once to float): SGD's here, Adam's by the core (kiln_op_t's comment), so
 * both compute the same bits. */
kiln_status_t kiln_cuda_run_update(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_update_args_t a;
  memset(&a, 0, sizeof a);
  a.param = kiln_cuda_view_ptr(&op->out);
  a.grad = kiln_cuda_view_ptr(&op->in[0]);
  a.n = kiln_backend_view_numel(&op->out);
  if (a.n == 0) return KILN_OK;
  kiln_cuda_kernel_t kernel;
  switch (op->kind) {
  case KILN_OP_ACCUMULATE:
    a.alpha = op->u.update.alpha;
    kernel = KILN_CUDA_K_accumulate_f32;
    break;
  case KILN_OP_SGD_UPDATE:
    a.has_buf = op->n_in == 2;
    a.s1 = a.has_buf ? kiln_cuda_view_ptr(&op->in[1]) : 0;
    a.lr = op->u.update.lr;
    a.momentum = op->u.update.momentum;
    a.keep1 = (float)(1.0 - (double)op->u.update.dampening);
    a.weight_decay = op->u.update.weight_decay;
    a.nesterov = op->u.update.nesterov;
    kernel = KILN_CUDA_K_sgd_f32;
    break;
  default: /* ADAM_UPDATE */
    a.s1 = kiln_cuda_view_ptr(&op->in[1]);
    a.s2 = kiln_cuda_view_ptr(&op->in[2]);
    a.beta1 = op->u.update.beta1;
    a.beta2 = op->u.update.beta2;
    a.keep1 = op->u.update.keep1;
    a.keep2 = op->u.update.keep2;
    a.eps = op->u.update.eps;
    a.weight_decay = op->u.update.weight_decay;
    a.step_size = op->u.update.step_size;
    a.sqrt_bias2 = op->u.update.sqrt_bias2;
    kernel = KILN_CUDA_K_adam_f32;
    break;
  }
  return kiln_cuda_launch_flat(queue, kernel, a.n, &a);
}
