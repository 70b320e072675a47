/* backends/cuda/ops.c: the CUDA op table (native, cublas and cudnn rows), the native rows' generic runners and the forward kinds' planners. */
#include <limits.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

static CUdeviceptr addr_of(const kiln_view_t *view) {
  return view->buffer ? view->buffer->ptr + (CUdeviceptr)view->offset * kiln_backend_dtype_size(view->dtype) : 0;
}

CUdeviceptr kiln_cuda_view_ptr(const kiln_view_t *view) { return addr_of(view); }

void kiln_cuda_kop_fill(kiln_kop_t *k, const kiln_op_t *op) {
  kiln_backend_kop_fill(k, op);
  k->out.addr = addr_of(&op->out);
  for (int32_t i = 0; i < op->n_in && i < KILN_KOP_MAX_IN; i++) k->in[i].addr = addr_of(&op->in[i]);
}

unsigned kiln_cuda_grid_rows(int64_t items) {
  const int64_t cap = 1 << 20; /* grid-stride beyond this */
  if (items < 1) return 1;
  return (unsigned)(items < cap ? items : cap);
}

/* ---- the generic runners ----------------------------------------------------------------- */

/* FLAT kinds: the kind's kernel, grid-stride over the elements of out. */
static kiln_status_t run_flat(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  (void)ctx;
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  if (k.n == 0) return KILN_OK;
  const kiln_cuda_function_t *kernel;
  kiln_status_t status = kiln_cuda_kind_kernel(queue->device, op, &kernel);
  if (status != KILN_OK) return status;
  return kiln_cuda_launch(queue, kernel, kiln_cuda_grid_for(queue->device, k.n), 1, 1, KILN_CUDA_BLOCK, &k);
}

/* ROWS kinds: one block per row of out (its last dimension). */
static kiln_status_t run_rows(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  (void)ctx;
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  if (k.n == 0) return KILN_OK;
  const int64_t last = op->out.ndim > 0 ? op->out.shape[op->out.ndim - 1] : 1;
  const kiln_cuda_function_t *kernel;
  kiln_status_t status = kiln_cuda_kind_kernel(queue->device, op, &kernel);
  if (status != KILN_OK) return status;
  return kiln_cuda_launch(queue, kernel, kiln_cuda_grid_rows(k.n / last), 1, 1, KILN_CUDA_BLOCK, &k);
}

/* ---- planners ------------------------------------------------------------------------------ */

/* COPY: one contiguous run is a device-to-device copy; a strided view the
 * kind's kernel. */
static kiln_status_t kiln_cuda_plan_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                         const kiln_op_t *op) {
  if (!op->flat) return run_flat(ctx, queue, op);
  const int64_t n = kiln_backend_view_numel(&op->out);
  return kiln_cuda_check(ctx,
                         cuMemcpyDtoDAsync(addr_of(&op->out), addr_of(&op->in[0]),
                                           (size_t)n * kiln_backend_dtype_size(op->out.dtype), queue->stream),
                         "cuMemcpyDtoDAsync (COPY of %lld elements) on cuda:%d", (long long)n,
                         queue->device->ordinal);
}

kiln_status_t kiln_cuda_gemm_grid(kiln_backend_context_t *ctx, int64_t m, int64_t n, int64_t k, int64_t batch,
                                  unsigned out_grid[3]) {
  /* The kernels keep tile indices in an int: m and n below 2^38 (a product
   * that large would be a terabyte of floats). */
  const int64_t limit = (int64_t)1 << 38;
  if (m >= limit || n >= limit)
    return kiln_cuda_error(ctx, KILN_OUT_OF_RESOURCES,
                           "the native CUDA matmul takes m and n below 2^38, got m=%lld n=%lld; split the product",
                           (long long)m, (long long)n);
  /* k's steps of 8 and the batch index are ints too (registers are what the
   * kernel is short of); sizes that large would not fit in memory. */
  if (k >= (int64_t)1 << 33 || batch >= (int64_t)1 << 30)
    return kiln_cuda_error(ctx, KILN_OUT_OF_RESOURCES,
                           "the native CUDA matmul takes k below 2^33 and batch below 2^30, got k=%lld batch=%lld; "
                           "split the product",
                           (long long)k, (long long)batch);
  const int64_t tiles_m = (m + KILN_CUDA_GEMM_TILE - 1) / KILN_CUDA_GEMM_TILE;
  out_grid[0] = (unsigned)((n + KILN_CUDA_GEMM_TILE - 1) / KILN_CUDA_GEMM_TILE);
  /* y and z stop at the grid's 65535; the blocks loop over the rest. */
  out_grid[1] = (unsigned)(tiles_m < 65535 ? tiles_m : 65535);
  out_grid[2] = (unsigned)(batch < 65535 ? batch : 65535);
  return KILN_OK;
}

kiln_status_t kiln_cuda_gemm(kiln_backend_queue_t *queue, kiln_kop_t *k) {
  if (k->plan.gemm.m == 0 || k->plan.gemm.n == 0 || k->plan.gemm.batch == 0) return KILN_OK;
  unsigned grid[3] = {1, 1, 1};
  kiln_status_t status =
      kiln_cuda_gemm_grid(queue->device->ctx, k->plan.gemm.m, k->plan.gemm.n, k->plan.gemm.k, k->plan.gemm.batch,
                          grid);
  if (status != KILN_OK) return status;
  const char ta = k->plan.gemm.trans_a ? 't' : 'n', tb = k->plan.gemm.trans_b ? 't' : 'n';
  char name[40];
  const bool half = k->out.dtype == KILN_F16 || k->out.dtype == KILN_BF16;
  if (half && queue->device->cc_major >= 8) {
    /* f16 and bf16 on the tensor cores (WMMA, sm_80 and newer): 64x64
     * tiles of C, four warps a block; the grid as the scalar kernels',
     * with its own tile. */
    const int64_t tile = 64, tiles_m = (k->plan.gemm.m + tile - 1) / tile;
    snprintf(name, sizeof name, "kiln_gemm_wmma_%s", kiln_backend_dtype_name(k->out.dtype));
    return kiln_cuda_launch_named(queue, name, (unsigned)((k->plan.gemm.n + tile - 1) / tile),
                                  (unsigned)(tiles_m < 65535 ? tiles_m : 65535),
                                  (unsigned)(k->plan.gemm.batch < 65535 ? k->plan.gemm.batch : 65535), 128, k);
  }
  if (k->out.dtype != KILN_F32) {
    /* f64, and f16 and bf16 below sm_80: the same kernel over the storage
     * type (kernels/cuda/gemm.cuh), element loads and stores. */
    const char *dt = kiln_backend_dtype_name(k->out.dtype);
    k->plan.gemm.c_vec = 0;
    snprintf(name, sizeof name, "kiln_gemm_%c%c_%s_%s", ta, tb, dt, dt);
    return kiln_cuda_launch_named(queue, name, grid[0], grid[1], grid[2], KILN_CUDA_GEMM_THREADS, k);
  }
  /* The float4 kernels: A and B 16-byte aligned with lda-like multiples of
   * 4; c_vec says the same of C for the stores. */
  const bool vec = k->plan.gemm.a % 16 == 0 && k->plan.gemm.b % 16 == 0 && k->plan.gemm.lda % 4 == 0 &&
                   k->plan.gemm.ldb % 4 == 0 && k->plan.gemm.stride_a % 4 == 0 && k->plan.gemm.stride_b % 4 == 0;
  k->plan.gemm.c_vec = k->plan.gemm.c % 16 == 0 && k->plan.gemm.ldc % 4 == 0 && k->plan.gemm.stride_c % 4 == 0;
  snprintf(name, sizeof name, "kiln_sgemm_%c%c%s", ta, tb, vec ? "_vec" : "");
  return kiln_cuda_launch_named(queue, name, grid[0], grid[1], grid[2], KILN_CUDA_GEMM_THREADS, k);
}

static kiln_status_t kiln_cuda_plan_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                           const kiln_op_t *op) {
  (void)ctx;
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  kiln_backend_kop_plan_matmul(&k);
  return kiln_cuda_gemm(queue, &k);
}

/* Split `len` into chunks when `items` blocks alone would leave the GPU
 * idle: enough chunks for about `target` blocks in all, each chunk at least
 * `least` elements. */
static void split_axis(kiln_kop_t *k, int64_t items, int64_t target, int64_t least) {
  const int64_t len = k->u.reduce.len;
  int64_t chunks = 1;
  if (items < target && len > 2 * least) {
    chunks = (target + items - 1) / items;
    const int64_t most = (len + least - 1) / least;
    if (chunks > most) chunks = most;
  }
  k->plan.reduce.chunk = len > 0 ? (len + chunks - 1) / chunks : 1;
  k->plan.reduce.chunks = len > 0 ? (len + k->plan.reduce.chunk - 1) / k->plan.reduce.chunk : 1;
}

void kiln_cuda_reduce_plan(kiln_kop_t *k, int sm_count, kiln_cuda_reduce_plan_t *out) {
  const int64_t target = (int64_t)(sm_count > 0 ? sm_count : 1) * 4;
  const int64_t outer = k->u.reduce.outer, inner = k->u.reduce.inner;
  memset(out, 0, sizeof *out);
  k->plan.reduce.rows = outer;
  if (inner > 1 || k->u.reduce.len == 0) {
    /* Columns: `width` of them side by side (a power of two up to a warp),
     * the block's other threads as lanes along the axis. */
    int width = 1;
    while (width < 32 && width < inner) width *= 2;
    k->plan.reduce.width = width;
    const int64_t lanes = KILN_CUDA_BLOCK / width;
    const int64_t tiles = (inner + width - 1) / width;
    /* Each lane of a chunk walks at least 16 positions. */
    split_axis(k, outer * tiles, target, lanes * 16);
    out->cols = true;
    out->blocks = outer * tiles * k->plan.reduce.chunks;
  } else {
    /* Rows: one block per row, long rows split when rows are few. */
    k->plan.reduce.width = 0;
    split_axis(k, outer, target, 4096);
    out->blocks = outer * k->plan.reduce.chunks;
  }
  /* The parts pass finishes outer * inner outputs, one block each. */
  out->parts_rows = k->plan.reduce.chunks > 1 ? outer * (out->cols ? inner : 1) : 0;
}

static kiln_status_t kiln_cuda_plan_reduce(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                           const kiln_op_t *op) {
  (void)ctx;
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  if (op->u.reduce.outer * op->u.reduce.inner == 0) return KILN_OK;
  kiln_cuda_reduce_plan_t plan;
  kiln_cuda_reduce_plan(&k, queue->device->sm_count, &plan);
  const char *dtype = kiln_backend_dtype_name(op->in[0].dtype);
  char first[40], parts_name[40];
  snprintf(first, sizeof first, "kiln_reduce_%s_%s", plan.cols ? "cols" : "rows", dtype);
  snprintf(parts_name, sizeof parts_name, "kiln_reduce_parts_%s", dtype);
  if (k.plan.reduce.chunks == 1)
    return kiln_cuda_launch_named(queue, first, kiln_cuda_grid_rows(plan.blocks), 1, 1, KILN_CUDA_BLOCK, &k);
  CUdeviceptr parts = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(
      queue, (size_t)(plan.parts_rows * k.plan.reduce.chunks) * KILN_CUDA_REDUCE_PART_BYTES, &parts);
  if (status != KILN_OK) return status;
  k.plan.reduce.parts = parts;
  status = kiln_cuda_launch_named(queue, first, kiln_cuda_grid_rows(plan.blocks), 1, 1, KILN_CUDA_BLOCK, &k);
  if (status == KILN_OK) {
    /* Columns' parts are laid out [outer * inner][chunks]: the same pass as
     * rows', over outer * inner rows. */
    k.plan.reduce.rows = plan.parts_rows;
    status = kiln_cuda_launch_named(queue, parts_name, kiln_cuda_grid_rows(plan.parts_rows), 1, 1, KILN_CUDA_BLOCK,
                                    &k);
  }
  kiln_cuda_scratch_free(queue, parts);
  return status;
}

/* Two passes: each row's loss into scratch (plan.reduce.parts), then one
 * block's mean and the label report. */
static kiln_status_t kiln_cuda_plan_cross_entropy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                  const kiln_op_t *op) {
  (void)ctx;
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  const int64_t rows = op->u.cross_entropy.n;
  CUdeviceptr work = 0;
  kiln_status_t status = KILN_OK;
  if (rows > 0) {
    status = kiln_cuda_scratch_alloc(queue, (size_t)rows * sizeof(double), &work);
    if (status != KILN_OK) return status;
    k.plan.reduce.parts = work;
    status = kiln_cuda_launch_named(queue, "kiln_xent_rows_f32", kiln_cuda_grid_rows(rows), 1, 1, KILN_CUDA_BLOCK,
                                    &k);
  }
  /* n == 0 still writes the output: NaN, the mean of nothing. */
  if (status == KILN_OK) status = kiln_cuda_launch_named(queue, "kiln_xent_mean_f32", 1, 1, 1, KILN_CUDA_BLOCK, &k);
  kiln_cuda_scratch_free(queue, work);
  return status;
}

/* The bias of a convolution on the record's out, in the record's dtype. */
static kiln_status_t conv_bias_record(kiln_backend_queue_t *queue, const kiln_op_t *op, const kiln_kop_t *k) {
  if (!op->u.conv2d.has_bias) return KILN_OK;
  char name[32];
  snprintf(name, sizeof name, "kiln_conv_bias_%s", kiln_backend_dtype_name((kiln_dtype_t)k->out.dtype));
  return kiln_cuda_launch_flat(queue, name, op->u.conv2d.n * op->u.conv2d.k * op->u.conv2d.p * op->u.conv2d.q, k);
}

/* CONV2D: per round of images, their columns (im2col, plan.round) and one
 * batched GEMM (plan.gemm) W [k][c*r*s] @ columns; a 1x1 convolution of
 * stride 1 without padding is the GEMM alone. Then the bias. `k` is the
 * op's record, its operands possibly moved (conv2d_via_f32); the sizes come
 * from the op, the dtype from the record. */
static kiln_status_t conv2d_record(kiln_backend_queue_t *queue, const kiln_op_t *op, kiln_kop_t k) {
  kiln_kop_t g = k;
  const kiln_dtype_t dtype = (kiln_dtype_t)k.out.dtype;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t kk = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  g.plan.gemm.a = k.in[1].addr; /* W [k, crs] */
  g.plan.gemm.m = kk;
  g.plan.gemm.n = pq;
  g.plan.gemm.k = crs;
  g.plan.gemm.lda = crs;
  g.plan.gemm.ldb = pq;
  g.plan.gemm.stride_b = crs * pq;
  g.plan.gemm.ldc = pq;
  g.plan.gemm.stride_c = kk * pq;
  kiln_status_t status = KILN_OK;
  const bool pointwise = op->u.conv2d.r == 1 && op->u.conv2d.s == 1 && op->u.conv2d.stride[0] == 1 &&
                         op->u.conv2d.stride[1] == 1 && op->u.conv2d.pad[0] == 0 && op->u.conv2d.pad[1] == 0 &&
                         op->u.conv2d.p == h && op->u.conv2d.q == w;
  if (pointwise) {
    /* A 1x1 convolution is already a GEMM over each image: no columns. */
    g.plan.gemm.b = k.in[0].addr;
    g.plan.gemm.c = k.out.addr;
    g.plan.gemm.batch = n;
    status = kiln_cuda_gemm(queue, &g);
  } else {
    const size_t size = kiln_backend_dtype_size(dtype);
    const size_t per_image = (size_t)crs * (size_t)pq * size;
    char im2col[32];
    snprintf(im2col, sizeof im2col, "kiln_im2col_%s", kiln_backend_dtype_name(dtype));
    int64_t step = per_image ? (int64_t)(KILN_CUDA_IM2COL_BYTES / per_image) : n;
    if (step < 1) step = 1;
    if (step > n) step = n;
    CUdeviceptr cols = 0;
    if (n > 0) status = kiln_cuda_scratch_alloc(queue, per_image * (size_t)step, &cols);
    for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
      const int64_t count = n - first < step ? n - first : step;
      k.plan.round.images = count;
      k.plan.round.first = first;
      k.plan.round.in = k.in[0].addr + (CUdeviceptr)(first * c * h * w) * size;
      k.plan.round.out = cols;
      status = kiln_cuda_launch_flat(queue, im2col, count * crs * pq, &k);
      if (status != KILN_OK) break;
      g.plan.gemm.b = cols;
      g.plan.gemm.c = k.out.addr + (CUdeviceptr)(first * kk * pq) * size;
      g.plan.gemm.batch = count;
      status = kiln_cuda_gemm(queue, &g);
    }
    kiln_cuda_scratch_free(queue, cols);
  }
  if (status == KILN_OK) status = conv_bias_record(queue, op, &k);
  return status;
}

/* `count` contiguous elements from `from` (dtype `from_dtype`) to `to`,
 * by the cast rule (kernel `kiln_cast`, a flat run). */
static kiln_status_t cast_run(kiln_backend_queue_t *queue, CUdeviceptr from, kiln_dtype_t from_dtype, CUdeviceptr to,
                              kiln_dtype_t to_dtype, int64_t count) {
  if (count == 0) return KILN_OK;
  kiln_kop_t c;
  memset(&c, 0, sizeof c);
  c.kind = KILN_OP_CAST;
  c.n_in = 1;
  c.n = count;
  c.in[0].addr = from;
  c.in[0].dtype = from_dtype;
  c.out.addr = to;
  c.out.dtype = to_dtype;
  return kiln_cuda_launch_flat(queue, "kiln_cast", count, &c);
}

/* CONV2D of f16 or bf16: x, w and the bias widened to f32 (exactly), the f32
 * convolution and its bias in f32, the result rounded once to the dtype,
 * nearest even: the CPU's rule (kernels/cpu/via_f32.c), so the results
 * differ from cpu:0's only by the order of the f32 sums. */
static kiln_status_t conv2d_via_f32(kiln_backend_queue_t *queue, const kiln_op_t *op, const kiln_kop_t *k16) {
  const kiln_dtype_t dtype = op->out.dtype;
  const int64_t nx = op->u.conv2d.n * op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w;
  const int64_t nw = op->u.conv2d.k * op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s;
  const int64_t nb = op->u.conv2d.has_bias ? op->u.conv2d.k : 0;
  const int64_t ny = op->u.conv2d.n * op->u.conv2d.k * op->u.conv2d.p * op->u.conv2d.q;
  /* One scratch block, each part on a 256-byte boundary. */
  const size_t align = 256;
  const size_t part[4] = {(size_t)nx * 4, (size_t)nw * 4, (size_t)nb * 4, (size_t)ny * 4};
  size_t at[4], total = 0;
  for (int i = 0; i < 4; i++) {
    at[i] = total;
    total += (part[i] + align - 1) / align * align;
  }
  CUdeviceptr base = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, total ? total : align, &base);
  if (status != KILN_OK) return status;
  kiln_kop_t k = *k16;
  k.in[0].addr = base + at[0];
  k.in[1].addr = base + at[1];
  k.out.addr = base + at[3];
  k.in[0].offset = k.in[1].offset = k.out.offset = 0;
  k.in[0].dtype = k.in[1].dtype = k.out.dtype = KILN_F32;
  if (nb) {
    k.in[2].addr = base + at[2];
    k.in[2].offset = 0;
    k.in[2].dtype = KILN_F32;
  }
  status = cast_run(queue, k16->in[0].addr, dtype, k.in[0].addr, KILN_F32, nx);
  if (status == KILN_OK) status = cast_run(queue, k16->in[1].addr, dtype, k.in[1].addr, KILN_F32, nw);
  if (status == KILN_OK && nb) status = cast_run(queue, k16->in[2].addr, dtype, k.in[2].addr, KILN_F32, nb);
  if (status == KILN_OK) status = conv2d_record(queue, op, k);
  if (status == KILN_OK) status = cast_run(queue, k.out.addr, KILN_F32, k16->out.addr, dtype, ny);
  kiln_cuda_scratch_free(queue, base);
  return status;
}

static kiln_status_t kiln_cuda_plan_conv2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                           const kiln_op_t *op) {
  (void)ctx;
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  if (op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16) return conv2d_via_f32(queue, op, &k);
  return conv2d_record(queue, op, k);
}

/* The bias of a convolution (native, or computed by another provider). */
kiln_status_t kiln_cuda_conv_bias(kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  return conv_bias_record(queue, op, &k);
}

/* CONV2D of f16 or bf16 with a bias: out set to the bias, image by image
 * and channel by channel (each value exact in the dtype), for a provider
 * that then adds its f32 convolution and rounds once (cuDNN with beta = 1).
 * Through f32 scratch: zeros, the bias widened and added by the f32 bias
 * kernel, the sum narrowed (exactly: it is the bias). */
kiln_status_t kiln_cuda_conv_bias_fill(kiln_backend_queue_t *queue, const kiln_op_t *op) {
  const kiln_dtype_t dtype = op->out.dtype;
  const int64_t nb = op->u.conv2d.k;
  const int64_t ny = op->u.conv2d.n * op->u.conv2d.k * op->u.conv2d.p * op->u.conv2d.q;
  if (!op->u.conv2d.has_bias || ny == 0) return KILN_OK;
  const size_t align = 256, y_bytes = ((size_t)ny * 4 + align - 1) / align * align;
  CUdeviceptr base = 0;
  kiln_status_t status = kiln_cuda_scratch_alloc(queue, y_bytes + (size_t)nb * 4, &base);
  if (status != KILN_OK) return status;
  kiln_kop_t k;
  kiln_cuda_kop_fill(&k, op);
  const CUdeviceptr bias16 = k.in[2].addr, out16 = k.out.addr;
  k.out.addr = base;
  k.in[2].addr = base + y_bytes;
  k.out.offset = k.in[2].offset = 0;
  k.out.dtype = k.in[2].dtype = KILN_F32;
  status = kiln_cuda_check(queue->device->ctx, cuMemsetD32Async(base, 0u, (size_t)ny, queue->stream),
                           "cuMemsetD32Async (conv2d bias, %lld elements) on cuda:%d", (long long)ny,
                           queue->device->ordinal);
  if (status == KILN_OK) status = cast_run(queue, bias16, dtype, k.in[2].addr, KILN_F32, nb);
  if (status == KILN_OK) status = conv_bias_record(queue, op, &k);
  if (status == KILN_OK) status = cast_run(queue, base, KILN_F32, out16, dtype, ny);
  kiln_cuda_scratch_free(queue, base);
  return status;
}

/* ---- the table ------------------------------------------------------------- */

typedef kiln_status_t (*routine_t)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op);

/* Every row's run: the device's context made current around the row's
 * routine. The cuBLAS and cuDNN rows need the fatbin as much as the native
 * ones (cuDNN's conv2d adds its bias with kiln's kernel). */
static kiln_status_t in_context(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op,
                                routine_t routine) {
  kiln_backend_device_t *device = queue->device;
  if (!device->module)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE, "cuda:%d cannot run kiln's kernels: %s", device->ordinal,
                           device->module_error);
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  status = routine(ctx, queue, op);
  kiln_cuda_leave();
  return status;
}

/* A row's run function for `routine`: routine##_row. */
#define KILN_CUDA_ROW_(routine)                                                                          \
  static kiln_status_t routine##_row(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,           \
                                     const kiln_op_entry_t *entry, const kiln_op_t *op) {                \
    (void)entry;                                                                                         \
    return in_context(ctx, queue, op, routine);                                                          \
  }
KILN_CUDA_ROW_(run_flat)
KILN_CUDA_ROW_(run_rows)

/* For a refusal of the native row: what the kind's vendor provider says
 * of op's dtypes. It takes them (so it is absent, failed, or declined this
 * shape: the reason is its state), or which dtype it refuses too. Empty for
 * a kind without a vendor row. */
static void vendor_note(const kiln_backend_context_t *ctx, const kiln_op_t *op, char *out, size_t size) {
  out[0] = '\0';
  const bool cublas = op->kind == KILN_OP_MATMUL;
  const bool cudnn = op->kind == KILN_OP_CONV2D || op->kind == KILN_OP_MAX_POOL2D ||
                     op->kind == KILN_OP_CONV2D_BACKWARD_INPUT || op->kind == KILN_OP_CONV2D_BACKWARD_WEIGHT ||
                     op->kind == KILN_OP_SOFTMAX_BACKWARD;
  if (!cublas && !cudnn) return;
  kiln_dtype_t bad = KILN_F32;
  const bool takes = cublas ? kiln_cuda_cublas_takes(op, &bad) : kiln_cuda_cudnn_takes(op, &bad);
  const char *name = cublas ? "cublas" : "cudnn";
  if (takes)
    snprintf(out, size, "; provider '%s' serves %s in %s but did not take it here (%s: %s)", name,
             kiln_backend_op_kind_name(op->kind), kiln_backend_dtype_name(op->out.dtype), name,
             cublas ? ctx->cublas_state : ctx->cudnn_state);
  else
    snprintf(out, size, "; provider '%s' has no %s %s either", name, kiln_backend_dtype_name(bad),
             kiln_backend_op_kind_name(op->kind));
}

/* The planned kinds compute f32 (and i32 where a kind takes integers) only
 * yet, but for COPY and REDUCE (every dtype in and out: the reduction
 * kernels are instantiated per input dtype and store the out dtype the
 * core chose), MATMUL (f32, f64, f16, bf16: kernels/cuda/gemm.cuh) and
 * CONV2D (f32, f64; f16 and bf16 through f32); their rows refuse other dtypes rather than read them as
 * f32. FLAT and ROWS kinds need no such check: a missing kernel is missing
 * by name. */
static kiln_status_t plan_takes(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  const uint32_t f32_i32 = 1u << KILN_F32 | 1u << KILN_I32;
  kiln_dtype_t bad = KILN_F32;
  const uint32_t floats = 1u << KILN_F32 | 1u << KILN_F64 | 1u << KILN_F16 | 1u << KILN_BF16;
  if (op->kind == KILN_OP_COPY || op->kind == KILN_OP_REDUCE || kiln_backend_op_dtypes_in(op, f32_i32, f32_i32, &bad))
    return KILN_OK;
  /* MATMUL: the GEMM kernels of every float dtype; CONV2D: f32 and f64
   * (im2col, the GEMM and the bias in the dtype), f16 and bf16 through f32
   * (conv2d_via_f32). One dtype throughout. */
  if ((op->kind == KILN_OP_MATMUL || op->kind == KILN_OP_CONV2D) && kiln_backend_op_dtypes_in(op, floats, floats, &bad) &&
      op->in[0].dtype == op->out.dtype && op->in[1].dtype == op->out.dtype)
    return KILN_OK;
  char vendor[512];
  vendor_note(ctx, op, vendor, sizeof vendor);
  return kiln_cuda_error(ctx, KILN_UNSUPPORTED,
                         "the CUDA backend's native %s has no %s kernel yet (cuda:%d)%s: cast to f32 first, or compute "
                         "it on cpu:0 (kiln_tensor_to)",
                         kiln_backend_op_kind_name(op->kind), kiln_backend_dtype_name(bad), queue->device->ordinal,
                         vendor);
}

/* The planners of the PLAN kinds, kiln_cuda_plan_<name>: a kind without one
 * fails to compile here. */
#define KILN_CUDA_PLAN_ROW_FLAT(name)
#define KILN_CUDA_PLAN_ROW_ROWS(name)
#define KILN_CUDA_PLAN_ROW_PLAN(name)                                                                   \
  static kiln_status_t kiln_cuda_plan_##name##_row(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, \
                                                   const kiln_op_entry_t *entry, const kiln_op_t *op) {   \
    (void)entry;                                                                                        \
    const kiln_status_t status = plan_takes(ctx, queue, op);                                            \
    return status == KILN_OK ? in_context(ctx, queue, op, kiln_cuda_plan_##name) : status;              \
  }
#define KILN_CUDA_PLAN_ROW_(NAME, name, launch) KILN_CUDA_PLAN_ROW_##launch(name)
KILN_OP_KINDS(KILN_CUDA_PLAN_ROW_)
KILN_CUDA_ROW_(kiln_cuda_cublas_matmul)
KILN_CUDA_ROW_(kiln_cuda_cudnn_conv2d)
KILN_CUDA_ROW_(kiln_cuda_cudnn_max_pool2d)
KILN_CUDA_ROW_(kiln_cuda_cudnn_conv2d_backward_input)
KILN_CUDA_ROW_(kiln_cuda_cudnn_conv2d_backward_weight)
KILN_CUDA_ROW_(kiln_cuda_cudnn_softmax_backward)

#define KILN_CUDA_RUN_FLAT(name) run_flat_row
#define KILN_CUDA_RUN_ROWS(name) run_rows_row
#define KILN_CUDA_RUN_PLAN(name) kiln_cuda_plan_##name##_row

/* Native rows first: listings show providers in this order. */
const kiln_op_entry_t kiln_cuda_ops[] = {
#define KILN_CUDA_NATIVE_ROW_(NAME, name, launch) \
  {.kind = KILN_OP_##NAME, .provider = KILN_PROVIDER_NATIVE_NAME, .run = KILN_CUDA_RUN_##launch(name)},
  KILN_OP_KINDS(KILN_CUDA_NATIVE_ROW_)
#undef KILN_CUDA_NATIVE_ROW_
  {.kind = KILN_OP_MATMUL, .provider = "cublas", .supports = kiln_cuda_cublas_supports,
   .run = kiln_cuda_cublas_matmul_row},
  {.kind = KILN_OP_CONV2D, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports,
   .run = kiln_cuda_cudnn_conv2d_row},
  {.kind = KILN_OP_MAX_POOL2D, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports,
   .run = kiln_cuda_cudnn_max_pool2d_row},
  /* Gradients cuDNN computes as kiln defines them (max_pool2d_backward is
   * not among them: see cudnn.c). */
  {.kind = KILN_OP_CONV2D_BACKWARD_INPUT, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports,
   .run = kiln_cuda_cudnn_conv2d_backward_input_row},
  {.kind = KILN_OP_CONV2D_BACKWARD_WEIGHT, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports,
   .run = kiln_cuda_cudnn_conv2d_backward_weight_row},
  {.kind = KILN_OP_SOFTMAX_BACKWARD, .provider = "cudnn", .supports = kiln_cuda_cudnn_supports,
   .run = kiln_cuda_cudnn_softmax_backward_row},
  KILN_OP_TABLE_END,
};
