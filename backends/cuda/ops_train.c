/* backends/cuda/ops_train.c: the planners of the training kinds: the convolution's gradients (rounds of images around the GEMM) and max pooling's (two passes). */
#include <limits.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

/* How many images a round of a convolution's gradient takes: as many as
 * `per_image` bytes of scratch each fit in KILN_CUDA_IM2COL_BYTES, at least
 * one. */
static int64_t images_per_round(size_t per_image, int64_t n) {
  int64_t step = per_image ? (int64_t)(KILN_CUDA_IM2COL_BYTES / per_image) : n;
  if (step < 1) step = 1;
  if (step > n) step = n;
  return step;
}

static bool conv_pointwise(const kiln_op_t *op) {
  return op->u.conv2d.r == 1 && op->u.conv2d.s == 1 && op->u.conv2d.stride[0] == 1 && op->u.conv2d.stride[1] == 1 &&
         op->u.conv2d.pad[0] == 0 && op->u.conv2d.pad[1] == 0 && op->u.conv2d.p == op->u.conv2d.h &&
         op->u.conv2d.q == op->u.conv2d.w;
}

/* dx = col2im(W^T @ dy): per round of images, the columns [c*r*s][p*q] by
 * one batched GEMM (W [k][c*r*s] transposed), then gathered into dx (no
 * atomics). A 1x1 convolution of stride 1 without padding needs no columns:
 * dx = W^T @ dy. in[0] dy, in[1] w, out dx. */
kiln_status_t kiln_cuda_plan_conv2d_backward_input(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                   const kiln_op_t *op) {
  (void)ctx;
  kiln_kop_t k, g;
  kiln_cuda_kop_fill(&k, op);
  g = k;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t kk = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  g.plan.gemm.a = k.in[1].addr; /* W^T: A(i, l) = w[l * crs + i] */
  g.plan.gemm.trans_a = 1;
  g.plan.gemm.m = crs;
  g.plan.gemm.n = pq;
  g.plan.gemm.k = kk;
  g.plan.gemm.lda = crs;
  g.plan.gemm.ldb = pq;
  g.plan.gemm.stride_b = kk * pq;
  g.plan.gemm.ldc = pq;
  g.plan.gemm.stride_c = crs * pq;
  if (conv_pointwise(op)) {
    g.plan.gemm.b = k.in[0].addr;
    g.plan.gemm.c = k.out.addr;
    g.plan.gemm.batch = n;
    return kiln_cuda_gemm(queue, &g);
  }
  const size_t per_image = (size_t)crs * (size_t)pq * sizeof(float);
  const int64_t step = images_per_round(per_image, n);
  CUdeviceptr cols = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, per_image * (size_t)step, &cols);
  for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
    const int64_t count = n - first < step ? n - first : step;
    g.plan.gemm.b = k.in[0].addr + (CUdeviceptr)(first * kk * pq) * 4u;
    g.plan.gemm.c = cols;
    g.plan.gemm.batch = count;
    status = kiln_cuda_gemm(queue, &g);
    if (status != KILN_OK) break;
    k.plan.round.images = count;
    k.plan.round.first = first;
    k.plan.round.in = cols;
    k.plan.round.out = k.out.addr + (CUdeviceptr)(first * c * h * w) * 4u;
    status = kiln_cuda_launch_flat(queue, "kiln_col2im_f32", count * c * h * w, &k);
  }
  kiln_cuda_scratch_free(queue, cols);
  return status;
}

/* dW [k][c*r*s] = sum over images of dy [k][p*q] @ columns [c*r*s][p*q]^T:
 * the columns and dy of a round of images laid out side by side
 * ([c*r*s][images*p*q], [k][images*p*q]), so one GEMM's depth runs over
 * every position of every image of the round and sums over them; the rounds
 * after the first add their part. No image: dW is zeros. in[0] x, in[1] dy,
 * out dW. */
kiln_status_t kiln_cuda_plan_conv2d_backward_weight(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                    const kiln_op_t *op) {
  kiln_kop_t k, g;
  kiln_cuda_kop_fill(&k, op);
  g = k;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t kk = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  if (n == 0 || pq == 0)
    return kiln_cuda_check(ctx, cuMemsetD32Async(k.out.addr, 0, (size_t)(kk * crs), queue->stream),
                           "cuMemsetD32Async (conv2d_backward_weight of no image, %lld elements) on cuda:%d",
                           (long long)(kk * crs), queue->device->ordinal);
  const size_t per_image = (size_t)(crs + kk) * (size_t)pq * sizeof(float);
  const int64_t step = images_per_round(per_image, n);
  const bool several_rounds = step < n;
  const size_t cols_bytes = (size_t)(crs * step * pq) * sizeof(float);
  const size_t dy_bytes = (size_t)(kk * step * pq) * sizeof(float);
  const size_t part_bytes = several_rounds ? (size_t)(kk * crs) * sizeof(float) : 0;
  CUdeviceptr scratch = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, cols_bytes + dy_bytes + part_bytes, &scratch);
  const CUdeviceptr cols = scratch, packed = scratch + cols_bytes, part = packed + dy_bytes;
  g.plan.gemm.a = packed;
  g.plan.gemm.b = cols; /* transposed: B(l, j) = cols[j * depth + l] */
  g.plan.gemm.trans_b = 1;
  g.plan.gemm.m = kk;
  g.plan.gemm.n = crs;
  g.plan.gemm.ldc = crs;
  g.plan.gemm.batch = 1;
  for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
    const int64_t count = n - first < step ? n - first : step, depth = count * pq;
    k.plan.round.images = count;
    k.plan.round.first = first;
    k.plan.round.in = k.in[0].addr + (CUdeviceptr)(first * c * h * w) * 4u;
    k.plan.round.out = cols;
    status = kiln_cuda_launch_flat(queue, "kiln_im2col_rows_f32", crs * depth, &k);
    if (status != KILN_OK) break;
    k.plan.round.in = k.in[1].addr + (CUdeviceptr)(first * kk * pq) * 4u;
    k.plan.round.out = packed;
    status = kiln_cuda_launch_flat(queue, "kiln_pack_dy_f32", kk * depth, &k);
    if (status != KILN_OK) break;
    g.plan.gemm.c = first == 0 ? k.out.addr : part;
    g.plan.gemm.k = depth;
    g.plan.gemm.lda = depth;
    g.plan.gemm.ldb = depth;
    status = kiln_cuda_gemm(queue, &g);
    if (status != KILN_OK || first == 0) continue;
    k.plan.round.aux = part;
    status = kiln_cuda_launch_flat(queue, "kiln_conv_weight_add_f32", kk * crs, &k);
  }
  kiln_cuda_scratch_free(queue, scratch);
  return status;
}

/* Two passes: where each window's first maximum is (an index per window, in
 * scratch memory, plan.round.aux), then a gather per element of dx over the
 * windows covering it, so no two threads write one place (no atomics, and
 * the same sums in the same order as the CPU's). */
kiln_status_t kiln_cuda_plan_max_pool2d_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                 const kiln_op_t *op) {
  const int64_t n = op->u.pooling.n, c = op->u.pooling.c, h = op->u.pooling.h, w = op->u.pooling.w;
  const int64_t windows = n * c * op->u.pooling.p * op->u.pooling.q;
  if (h * w > INT_MAX)
    return kiln_cuda_error(ctx, KILN_OUT_OF_RESOURCES,
                           "the native CUDA max_pool2d_backward takes planes of fewer than 2^31 elements, got "
                           "%lldx%lld; split the image",
                           (long long)h, (long long)w);
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  CUdeviceptr index = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, (size_t)windows * sizeof(int32_t), &index);
  if (status == KILN_OK) {
    k.plan.round.aux = index;
    status = kiln_cuda_launch_flat(queue, "kiln_max_pool2d_argmax_f32", windows, &k);
  }
  if (status == KILN_OK) status = kiln_cuda_launch_flat(queue, "kiln_max_pool2d_gather_f32", n * c * h * w, &k);
  kiln_cuda_scratch_free(queue, index);
  return status;
}
