/* backends/cuda/ops.c: the CUDA op table (native, cublas and cudnn rows) and the native provider: argument packing and launches of kiln's kernels. */
#include <assert.h>
#include <limits.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

/* Kernel of each elementwise op per dtype, + 1 so that 0 means "no formula". */
static const int unary_f32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_F32(NAME, expr) [KILN_UNARY_##NAME] = KILN_CUDA_K_unary_f32_##NAME + 1,
#include "kernels/ops.def"
};
static const int unary_i32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_I32(NAME, expr) [KILN_UNARY_##NAME] = KILN_CUDA_K_unary_i32_##NAME + 1,
#include "kernels/ops.def"
};
static const int binary_f32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_F32(NAME, expr) [KILN_BINARY_##NAME] = KILN_CUDA_K_binary_f32_##NAME + 1,
#include "kernels/ops.def"
};
static const int binary_i32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_I32(NAME, expr) [KILN_BINARY_##NAME] = KILN_CUDA_K_binary_i32_##NAME + 1,
#include "kernels/ops.def"
};
static const int binary_scalar_f32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_F32(NAME, expr) [KILN_BINARY_##NAME] = KILN_CUDA_K_binary_scalar_f32_##NAME + 1,
#include "kernels/ops.def"
};
static const int binary_scalar_i32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_I32(NAME, expr) [KILN_BINARY_##NAME] = KILN_CUDA_K_binary_scalar_i32_##NAME + 1,
#include "kernels/ops.def"
};

/* The kernel of an elementwise op's formula for dtype; the core has checked
 * that the formula exists for it. */
static kiln_cuda_kernel_t formula_of(const kiln_op_t *op, kiln_dtype_t dtype) {
  const bool f = dtype == KILN_F32;
  int k;
  switch (op->kind) {
  case KILN_OP_UNARY: k = f ? unary_f32[op->u.unary.op] : unary_i32[op->u.unary.op]; break;
  case KILN_OP_BINARY: k = f ? binary_f32[op->u.binary.op] : binary_i32[op->u.binary.op]; break;
  default: k = f ? binary_scalar_f32[op->u.binary.op] : binary_scalar_i32[op->u.binary.op]; break;
  }
  assert(k > 0 && "an elementwise op without a formula for its dtype reached the CUDA backend");
  return (kiln_cuda_kernel_t)(k - 1);
}

CUdeviceptr kiln_cuda_view_ptr(const kiln_view_t *view) {
  /* f32 and i32 (the dtypes served) are both 4 bytes. */
  return view->buffer->ptr + (CUdeviceptr)view->offset * 4u;
}

/* The walk of an elementwise kernel: ndim 0 when every operand is one
 * contiguous run (the core's `flat`, the kernels' fast path), else the
 * dimensions the core merged, copied as they are: out contiguous of its
 * shape, the inputs by their strides (0 where broadcast). */
void kiln_cuda_ew_setup(kiln_cuda_ew_args_t *a, const kiln_op_t *op, const kiln_view_t *in0,
                        const kiln_view_t *in1) {
  a->n = kiln_backend_view_numel(&op->out);
  if (op->flat) {
    a->ndim = 0;
    return;
  }
  a->ndim = op->out.ndim;
  for (int32_t d = 0; d < op->out.ndim; d++) {
    a->shape[d] = op->out.shape[d];
    a->stride0[d] = in0->strides[d];
    a->stride1[d] = in1 ? in1->strides[d] : 0;
  }
}

kiln_status_t kiln_cuda_launch_flat(kiln_backend_queue_t *queue, kiln_cuda_kernel_t kernel, int64_t n, void *args) {
  return kiln_cuda_launch(queue, kernel, kiln_cuda_grid_for(queue->device, n), 1, 1, KILN_CUDA_BLOCK, args);
}

/* Blocks for a kernel that gives one block to each of `items` rows. */
unsigned kiln_cuda_grid_rows(int64_t items) {
  const int64_t cap = 1 << 20; /* grid-stride beyond this */
  if (items < 1) return 1;
  return (unsigned)(items < cap ? items : cap);
}

/* FILL, ARANGE, RANDOM. */
static kiln_status_t run_generate(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_ew_args_t a;
  memset(&a, 0, offsetof(kiln_cuda_ew_args_t, shape));
  a.out = kiln_cuda_view_ptr(&op->out);
  a.n = kiln_backend_view_numel(&op->out);
  switch (op->kind) {
  case KILN_OP_FILL:
    /* The kernel writes one 32-bit pattern: the f32's bits or the i32. */
    if (op->out.dtype == KILN_F32)
      memcpy(&a.scalar_i, &op->u.fill.value.f32, 4);
    else
      a.scalar_i = op->u.fill.value.i32;
    return kiln_cuda_launch_flat(queue, KILN_CUDA_K_fill32, a.n, &a);
  case KILN_OP_ARANGE:
    a.start = op->u.arange.start;
    a.step = op->u.arange.step;
    return kiln_cuda_launch_flat(queue, op->out.dtype == KILN_F32 ? KILN_CUDA_K_arange_f32 : KILN_CUDA_K_arange_i32,
                                 a.n, &a);
  default: /* RANDOM */
    a.seed = op->u.random.seed;
    a.scalar_f = op->u.random.a;
    a.scalar_f2 = op->u.random.b;
    return kiln_cuda_launch_flat(queue, op->u.random.normal ? KILN_CUDA_K_random_normal : KILN_CUDA_K_random_uniform,
                                 a.n, &a);
  }
}

/* COPY, CAST, UNARY, BINARY, BINARY_SCALAR. */
static kiln_status_t run_elementwise(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_ew_args_t a;
  memset(&a, 0, offsetof(kiln_cuda_ew_args_t, shape));
  a.out = kiln_cuda_view_ptr(&op->out);
  a.in0 = kiln_cuda_view_ptr(&op->in[0]);
  const kiln_dtype_t dtype = op->in[0].dtype;
  kiln_cuda_kernel_t kernel;
  switch (op->kind) {
  case KILN_OP_COPY:
    kiln_cuda_ew_setup(&a, op, &op->in[0], NULL);
    if (a.ndim == 0)
      return kiln_cuda_check(ctx, cuMemcpyDtoDAsync(a.out, a.in0, (size_t)a.n * 4u, queue->stream),
                             "cuMemcpyDtoDAsync (COPY of %lld elements) on cuda:%d", (long long)a.n,
                             queue->device->ordinal);
    kernel = KILN_CUDA_K_copy32_strided;
    break;
  case KILN_OP_CAST:
    kiln_cuda_ew_setup(&a, op, &op->in[0], NULL);
    kernel = dtype == KILN_F32 ? KILN_CUDA_K_cast_f32_to_i32 : KILN_CUDA_K_cast_i32_to_f32;
    break;
  case KILN_OP_UNARY:
    kiln_cuda_ew_setup(&a, op, &op->in[0], NULL);
    kernel = formula_of(op, dtype);
    break;
  case KILN_OP_BINARY:
    a.in1 = kiln_cuda_view_ptr(&op->in[1]);
    kiln_cuda_ew_setup(&a, op, &op->in[0], &op->in[1]);
    kernel = formula_of(op, dtype);
    break;
  default: /* BINARY_SCALAR: the scalar comes converted to the operand's dtype */
    if (dtype == KILN_F32)
      a.scalar_f = op->u.binary.scalar.f32;
    else
      a.scalar_i = op->u.binary.scalar.i32;
    kiln_cuda_ew_setup(&a, op, &op->in[0], NULL);
    kernel = formula_of(op, dtype);
    break;
  }
  return kiln_cuda_launch_flat(queue, kernel, a.n, &a);
}

/* Split `len` into chunks when `items` blocks alone would leave the GPU
 * idle: enough chunks for about `target` blocks in all, each chunk at least
 * `least` elements. */
static void split_axis(kiln_cuda_reduce_args_t *a, int64_t items, int64_t target, int64_t least) {
  int64_t chunks = 1;
  if (items < target && a->len > 2 * least) {
    chunks = (target + items - 1) / items;
    const int64_t most = (a->len + least - 1) / least;
    if (chunks > most) chunks = most;
  }
  a->chunk = a->len > 0 ? (a->len + chunks - 1) / chunks : 1;
  a->chunks = a->len > 0 ? (a->len + a->chunk - 1) / a->chunk : 1;
}

void kiln_cuda_reduce_plan(kiln_cuda_reduce_args_t *a, int sm_count, kiln_cuda_reduce_plan_t *out) {
  const int64_t target = (int64_t)(sm_count > 0 ? sm_count : 1) * 4;
  memset(out, 0, sizeof *out);
  if (a->inner > 1 || a->len == 0) {
    /* Columns: `width` of them side by side (a power of two up to a warp),
     * the block's other threads as lanes along the axis. */
    int width = 1;
    while (width < 32 && width < a->inner) width *= 2;
    a->width = width;
    const int64_t lanes = KILN_CUDA_BLOCK / width;
    const int64_t tiles = (a->inner + width - 1) / width;
    /* Each lane of a chunk walks at least 16 positions. */
    split_axis(a, a->outer * tiles, target, lanes * 16);
    out->cols = true;
    out->blocks = a->outer * tiles * a->chunks;
  } else {
    /* Rows: one block per row, long rows split when rows are few. */
    a->width = 0;
    split_axis(a, a->outer, target, 4096);
    out->blocks = a->outer * a->chunks;
  }
  /* The parts pass finishes outer * inner outputs, one block each. */
  out->parts_rows = a->chunks > 1 ? a->outer * (out->cols ? a->inner : 1) : 0;
}

static kiln_status_t run_reduce(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_reduce_args_t a;
  memset(&a, 0, sizeof a);
  a.in = kiln_cuda_view_ptr(&op->in[0]);
  a.out = kiln_cuda_view_ptr(&op->out);
  a.outer = op->u.reduce.outer;
  a.len = op->u.reduce.len;
  a.inner = op->u.reduce.inner;
  a.op = (int32_t)op->u.reduce.op;
  const bool f32 = op->in[0].dtype == KILN_F32;
  if (a.outer * a.inner == 0) return KILN_OK;
  kiln_cuda_reduce_plan_t plan;
  kiln_cuda_reduce_plan(&a, queue->device->sm_count, &plan);
  const kiln_cuda_kernel_t first = plan.cols ? (f32 ? KILN_CUDA_K_reduce_cols_f32 : KILN_CUDA_K_reduce_cols_i32)
                                             : (f32 ? KILN_CUDA_K_reduce_rows_f32 : KILN_CUDA_K_reduce_rows_i32);
  if (a.chunks == 1)
    return kiln_cuda_launch(queue, first, kiln_cuda_grid_rows(plan.blocks), 1, 1, KILN_CUDA_BLOCK, &a);
  CUdeviceptr parts = 0;
  kiln_status_t status =
      kiln_cuda_scratch_alloc(queue, (size_t)(plan.parts_rows * a.chunks) * sizeof(kiln_cuda_reduce_part_t), &parts);
  if (status != KILN_OK) return status;
  a.parts = parts;
  status = kiln_cuda_launch(queue, first, kiln_cuda_grid_rows(plan.blocks), 1, 1, KILN_CUDA_BLOCK, &a);
  if (status == KILN_OK) {
    /* Columns' parts are laid out [outer * inner][chunks]: the same pass as
     * rows', over outer * inner rows. */
    kiln_cuda_reduce_args_t merge = a;
    merge.outer = plan.parts_rows;
    status = kiln_cuda_launch(queue, f32 ? KILN_CUDA_K_reduce_parts_f32 : KILN_CUDA_K_reduce_parts_i32,
                              kiln_cuda_grid_rows(plan.parts_rows), 1, 1, KILN_CUDA_BLOCK, &merge);
  }
  kiln_cuda_scratch_free(queue, parts);
  return status;
}

static kiln_status_t run_softmax(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_rows_args_t a;
  memset(&a, 0, sizeof a);
  a.in = kiln_cuda_view_ptr(&op->in[0]);
  a.out = kiln_cuda_view_ptr(&op->out);
  a.rows = op->u.softmax.rows;
  a.cols = op->u.softmax.cols;
  a.log = op->u.softmax.log;
  if (a.rows * a.cols == 0) return KILN_OK;
  return kiln_cuda_launch(queue, KILN_CUDA_K_softmax_f32, kiln_cuda_grid_rows(a.rows), 1, 1, KILN_CUDA_BLOCK, &a);
}

static kiln_status_t run_cross_entropy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                       const kiln_op_t *op) {
  kiln_cuda_rows_args_t a;
  memset(&a, 0, sizeof a);
  a.in = kiln_cuda_view_ptr(&op->in[0]);
  a.labels = kiln_cuda_view_ptr(&op->in[1]);
  a.aux = kiln_cuda_view_ptr(&op->in[2]); /* the report */
  a.out = kiln_cuda_view_ptr(&op->out);
  a.rows = op->u.cross_entropy.n;
  a.cols = op->u.cross_entropy.c;
  CUdeviceptr work = 0;
  kiln_status_t status = KILN_OK;
  if (a.rows > 0) {
    status = kiln_cuda_scratch_alloc(queue, (size_t)a.rows * sizeof(double), &work);
    if (status != KILN_OK) return status;
    a.work = work;
    status = kiln_cuda_launch(queue, KILN_CUDA_K_xent_rows, kiln_cuda_grid_rows(a.rows), 1, 1, KILN_CUDA_BLOCK, &a);
  }
  /* n == 0 still writes the output: NaN, the mean of nothing. */
  if (status == KILN_OK) status = kiln_cuda_launch(queue, KILN_CUDA_K_xent_mean, 1, 1, 1, KILN_CUDA_BLOCK, &a);
  kiln_cuda_scratch_free(queue, work);
  return status;
}

kiln_status_t kiln_cuda_gemm_grid(kiln_backend_context_t *ctx, int64_t m, int64_t n, int64_t batch,
                                  unsigned out_grid[3]) {
  /* The kernels keep tile indices in an int: m and n below 2^38 (a product
   * that large would be a terabyte of floats). */
  const int64_t limit = (int64_t)1 << 38;
  if (m >= limit || n >= limit)
    return kiln_cuda_error(ctx, KILN_OUT_OF_RESOURCES,
                           "the native CUDA matmul takes m and n below 2^38, got m=%lld n=%lld; split the product",
                           (long long)m, (long long)n);
  const int64_t tiles_m = (m + KILN_CUDA_GEMM_TILE - 1) / KILN_CUDA_GEMM_TILE;
  out_grid[0] = (unsigned)((n + KILN_CUDA_GEMM_TILE - 1) / KILN_CUDA_GEMM_TILE);
  /* y and z stop at the grid's 65535; the blocks loop over the rest. */
  out_grid[1] = (unsigned)(tiles_m < 65535 ? tiles_m : 65535);
  out_grid[2] = (unsigned)(batch < 65535 ? batch : 65535);
  return KILN_OK;
}

kiln_status_t kiln_cuda_gemm_native(kiln_backend_queue_t *queue, const kiln_cuda_gemm_args_t *args, bool trans_a,
                                    bool trans_b) {
  kiln_cuda_gemm_args_t a = *args;
  if (a.m == 0 || a.n == 0 || a.batch == 0) return KILN_OK;
  unsigned grid[3] = {1, 1, 1};
  kiln_status_t status = kiln_cuda_gemm_grid(queue->device->ctx, a.m, a.n, a.batch, grid);
  if (status != KILN_OK) return status;
  const bool vec = a.a % 16 == 0 && a.b % 16 == 0 && a.lda % 4 == 0 && a.ldb % 4 == 0 && a.stride_a % 4 == 0 &&
                   a.stride_b % 4 == 0;
  a.c_vec = a.c % 16 == 0 && a.ldc % 4 == 0 && a.stride_c % 4 == 0;
  const int variant = (trans_a ? 2 : 0) + (trans_b ? 1 : 0);
  static const kiln_cuda_kernel_t kernels[2][4] = {
      {KILN_CUDA_K_sgemm_nn, KILN_CUDA_K_sgemm_nt, KILN_CUDA_K_sgemm_tn, KILN_CUDA_K_sgemm_tt},
      {KILN_CUDA_K_sgemm_nn_vec, KILN_CUDA_K_sgemm_nt_vec, KILN_CUDA_K_sgemm_tn_vec, KILN_CUDA_K_sgemm_tt_vec},
  };
  return kiln_cuda_launch(queue, kernels[vec][variant], grid[0], grid[1], grid[2], KILN_CUDA_GEMM_THREADS, &a);
}

static kiln_status_t run_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_gemm_args_t a;
  memset(&a, 0, sizeof a);
  a.a = kiln_cuda_view_ptr(&op->in[0]);
  a.b = kiln_cuda_view_ptr(&op->in[1]);
  a.c = kiln_cuda_view_ptr(&op->out);
  a.m = op->u.matmul.m;
  a.n = op->u.matmul.n;
  a.k = op->u.matmul.k;
  a.lda = op->u.matmul.lda;
  a.ldb = op->u.matmul.ldb;
  a.ldc = op->u.matmul.ldc;
  a.stride_a = op->u.matmul.stride_a;
  a.stride_b = op->u.matmul.stride_b;
  a.stride_c = op->u.matmul.stride_c;
  a.batch = op->u.matmul.batch;
  return kiln_cuda_gemm_native(queue, &a, op->u.matmul.trans_a, op->u.matmul.trans_b);
}

void kiln_cuda_conv_args(kiln_cuda_conv_args_t *a, const kiln_op_t *op) {
  memset(a, 0, sizeof *a);
  a->n = op->u.conv2d.n;
  a->c = op->u.conv2d.c;
  a->h = op->u.conv2d.h;
  a->w = op->u.conv2d.w;
  a->k = op->u.conv2d.k;
  a->r = op->u.conv2d.r;
  a->s = op->u.conv2d.s;
  a->p = op->u.conv2d.p;
  a->q = op->u.conv2d.q;
  for (int i = 0; i < 2; i++) {
    a->stride[i] = op->u.conv2d.stride[i];
    a->pad[i] = op->u.conv2d.pad[i];
    a->dil[i] = op->u.conv2d.dil[i];
  }
}

void kiln_cuda_pooling_args(kiln_cuda_conv_args_t *a, const kiln_op_t *op) {
  memset(a, 0, sizeof *a);
  a->n = op->u.pooling.n;
  a->c = op->u.pooling.c;
  a->h = op->u.pooling.h;
  a->w = op->u.pooling.w;
  a->p = op->u.pooling.p;
  a->q = op->u.pooling.q;
  for (int i = 0; i < 2; i++) {
    a->kernel[i] = op->u.pooling.window[i];
    a->stride[i] = op->u.pooling.stride[i];
    a->pad[i] = op->u.pooling.pad[i];
  }
}

static kiln_status_t run_conv2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_conv_args_t a;
  kiln_cuda_conv_args(&a, op);
  const int64_t crs = a.c * a.r * a.s, pq = a.p * a.q;
  const CUdeviceptr x = kiln_cuda_view_ptr(&op->in[0]), w = kiln_cuda_view_ptr(&op->in[1]);
  const CUdeviceptr y = kiln_cuda_view_ptr(&op->out);
  kiln_cuda_gemm_args_t g;
  memset(&g, 0, sizeof g);
  g.a = w; /* W [k, crs] */
  g.m = a.k;
  g.n = pq;
  g.k = crs;
  g.lda = crs;
  g.ldc = pq;
  g.stride_a = 0;
  g.stride_c = a.k * pq;
  kiln_status_t status = KILN_OK;
  const bool pointwise = a.r == 1 && a.s == 1 && a.stride[0] == 1 && a.stride[1] == 1 && a.pad[0] == 0 &&
                         a.pad[1] == 0 && a.p == a.h && a.q == a.w;
  if (pointwise) {
    /* A 1x1 convolution is already a GEMM over each image: no columns. */
    g.b = x;
    g.ldb = pq;
    g.stride_b = crs * pq;
    g.c = y;
    g.batch = a.n;
    status = kiln_cuda_gemm_native(queue, &g, false, false);
  } else {
    const size_t per_image = (size_t)crs * (size_t)pq * sizeof(float);
    int64_t step = per_image ? (int64_t)(KILN_CUDA_IM2COL_BYTES / per_image) : a.n;
    if (step < 1) step = 1;
    if (step > a.n) step = a.n;
    CUdeviceptr cols = 0;
    if (a.n > 0) status = kiln_cuda_scratch_alloc(queue, per_image * (size_t)step, &cols);
    for (int64_t first = 0; status == KILN_OK && first < a.n; first += step) {
      const int64_t count = a.n - first < step ? a.n - first : step;
      kiln_cuda_conv_args_t ia = a;
      ia.images = count;
      ia.in = x + (CUdeviceptr)(first * a.c * a.h * a.w) * 4u;
      ia.out = cols;
      status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_im2col_f32, count * crs * pq, &ia);
      if (status != KILN_OK) break;
      g.b = cols;
      g.ldb = pq;
      g.stride_b = crs * pq;
      g.c = y + (CUdeviceptr)(first * a.k * pq) * 4u;
      g.batch = count;
      status = kiln_cuda_gemm_native(queue, &g, false, false);
    }
    kiln_cuda_scratch_free(queue, cols);
  }
  if (status == KILN_OK && op->u.conv2d.has_bias) {
    kiln_cuda_conv_args_t ba = a;
    ba.images = a.n;
    ba.out = y;
    ba.bias = kiln_cuda_view_ptr(&op->in[2]);
    status = kiln_cuda_launch_flat(queue, KILN_CUDA_K_bias_nchw_f32, a.n * a.k * pq, &ba);
  }
  return status;
}

/* The bias of a convolution computed by another provider (cuDNN). */
kiln_status_t kiln_cuda_conv_bias(kiln_backend_queue_t *queue, const kiln_op_t *op) {
  if (!op->u.conv2d.has_bias) return KILN_OK;
  kiln_cuda_conv_args_t a;
  kiln_cuda_conv_args(&a, op);
  a.images = a.n;
  a.out = kiln_cuda_view_ptr(&op->out);
  a.bias = kiln_cuda_view_ptr(&op->in[2]);
  return kiln_cuda_launch_flat(queue, KILN_CUDA_K_bias_nchw_f32, a.n * a.k * a.p * a.q, &a);
}

static kiln_status_t run_max_pool2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_cuda_conv_args_t a;
  kiln_cuda_pooling_args(&a, op);
  a.in = kiln_cuda_view_ptr(&op->in[0]);
  a.out = kiln_cuda_view_ptr(&op->out);
  const int64_t n = a.n * a.c * a.p * a.q;
  if (n == 0) return KILN_OK;
  return kiln_cuda_launch_flat(queue, KILN_CUDA_K_max_pool2d_f32, n, &a);
}

/* ---- the table ------------------------------------------------------------- */

/* Every row's run: the device's context made current around the row's
 * routine. The cuBLAS and cuDNN rows need the fatbin as much as the native
 * ones (cuDNN's conv2d adds its bias with kiln's kernel). */
static kiln_status_t run_row(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                             const kiln_op_t *op) {
  kiln_backend_device_t *device = queue->device;
  if (!device->module)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE, "cuda:%d cannot run kiln's kernels: %s", device->ordinal,
                           device->module_error);
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  const kiln_cuda_op_impl_t *impl = entry->impl;
  status = impl->run(ctx, queue, op);
  kiln_cuda_leave();
  return status;
}

/* The native routine of each kind, named native_<kind> so that the table
 * below, expanded from KILN_OP_KINDS, fails to compile for a kind without
 * one. */
static const kiln_cuda_op_impl_t native_fill = {run_generate};
static const kiln_cuda_op_impl_t native_arange = {run_generate};
static const kiln_cuda_op_impl_t native_random = {run_generate};
static const kiln_cuda_op_impl_t native_copy = {run_elementwise};
static const kiln_cuda_op_impl_t native_unary = {run_elementwise};
static const kiln_cuda_op_impl_t native_binary = {run_elementwise};
static const kiln_cuda_op_impl_t native_binary_scalar = {run_elementwise};
static const kiln_cuda_op_impl_t native_matmul = {run_matmul};
static const kiln_cuda_op_impl_t native_reduce = {run_reduce};
static const kiln_cuda_op_impl_t native_softmax = {run_softmax};
static const kiln_cuda_op_impl_t native_cross_entropy = {run_cross_entropy};
static const kiln_cuda_op_impl_t native_conv2d = {run_conv2d};
static const kiln_cuda_op_impl_t native_max_pool2d = {run_max_pool2d};
static const kiln_cuda_op_impl_t native_cast = {run_elementwise};

/* The training kinds (ops_train.c). */
static const kiln_cuda_op_impl_t native_unary_backward = {kiln_cuda_run_unary_backward};
static const kiln_cuda_op_impl_t native_softmax_backward = {kiln_cuda_run_softmax_backward};
static const kiln_cuda_op_impl_t native_cross_entropy_backward = {kiln_cuda_run_cross_entropy_backward};
static const kiln_cuda_op_impl_t native_conv2d_backward_input = {kiln_cuda_run_conv2d_backward_input};
static const kiln_cuda_op_impl_t native_conv2d_backward_weight = {kiln_cuda_run_conv2d_backward_weight};
static const kiln_cuda_op_impl_t native_max_pool2d_backward = {kiln_cuda_run_max_pool2d_backward};
static const kiln_cuda_op_impl_t native_accumulate = {kiln_cuda_run_update};
static const kiln_cuda_op_impl_t native_sgd_update = {kiln_cuda_run_update};
static const kiln_cuda_op_impl_t native_adam_update = {kiln_cuda_run_update};
static const kiln_cuda_op_impl_t cublas_matmul = {kiln_cuda_cublas_matmul};
static const kiln_cuda_op_impl_t cudnn_conv2d = {kiln_cuda_cudnn_conv2d};
static const kiln_cuda_op_impl_t cudnn_max_pool2d = {kiln_cuda_cudnn_max_pool2d};
static const kiln_cuda_op_impl_t cudnn_conv2d_backward_input = {kiln_cuda_cudnn_conv2d_backward_input};
static const kiln_cuda_op_impl_t cudnn_conv2d_backward_weight = {kiln_cuda_cudnn_conv2d_backward_weight};
static const kiln_cuda_op_impl_t cudnn_softmax_backward = {kiln_cuda_cudnn_softmax_backward};

/* Native rows first: listings show providers in this order. */
const kiln_op_entry_t kiln_cuda_ops[] = {
#define KILN_CUDA_NATIVE_ROW_(NAME, name, launch) \
  {.kind = KILN_OP_##NAME, .provider = KILN_PROVIDER_NATIVE_NAME, .run = run_row, .impl = &native_##name},
  KILN_OP_KINDS(KILN_CUDA_NATIVE_ROW_)
#undef KILN_CUDA_NATIVE_ROW_
  {.kind = KILN_OP_MATMUL, .provider = "cublas", .supports = kiln_cuda_cublas_supports, .run = run_row,
   .impl = &cublas_matmul},
  {.kind = KILN_OP_CONV2D, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports, .run = run_row,
   .impl = &cudnn_conv2d},
  {.kind = KILN_OP_MAX_POOL2D, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports, .run = run_row,
   .impl = &cudnn_max_pool2d},
  /* Gradients cuDNN computes as kiln defines them (max_pool2d_backward is
   * not among them: see cudnn.c). */
  {.kind = KILN_OP_CONV2D_BACKWARD_INPUT, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports, .run = run_row,
   .impl = &cudnn_conv2d_backward_input},
  {.kind = KILN_OP_CONV2D_BACKWARD_WEIGHT, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports, .run = run_row,
   .impl = &cudnn_conv2d_backward_weight},
  {.kind = KILN_OP_SOFTMAX_BACKWARD, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports, .run = run_row,
   .impl = &cudnn_softmax_backward},
  KILN_OP_TABLE_END,
};
