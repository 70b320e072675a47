/* backends/opencl/ops.c: the OpenCL table of operation entries: a native row for every op kind (argument packing and launches of the kernels in kernels/opencl) and the clblast row of matmul. */
#include <limits.h>
#include <string.h>

#include "backends/opencl/opencl_backend.h"

/* ---- kernel names ---------------------------------------------------------------
 * The elementwise kernels of kernels/opencl/elementwise.cl, by op and dtype;
 * NULL where ops.def has no formula for the dtype (the core lets no such op
 * through). */
static const char *const unary_f32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_F32(NAME, expr) [KILN_UNARY_##NAME] = "unary_f32_" #NAME,
#include "kernels/ops.def"
};
static const char *const unary_i32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_I32(NAME, expr) [KILN_UNARY_##NAME] = "unary_i32_" #NAME,
#include "kernels/ops.def"
};
static const char *const binary_f32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_F32(NAME, expr) [KILN_BINARY_##NAME] = "binary_f32_" #NAME,
#include "kernels/ops.def"
};
static const char *const binary_i32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_I32(NAME, expr) [KILN_BINARY_##NAME] = "binary_i32_" #NAME,
#include "kernels/ops.def"
};
static const char *const binary_scalar_f32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_F32(NAME, expr) [KILN_BINARY_##NAME] = "binary_scalar_f32_" #NAME,
#include "kernels/ops.def"
};
static const char *const binary_scalar_i32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_I32(NAME, expr) [KILN_BINARY_##NAME] = "binary_scalar_i32_" #NAME,
#include "kernels/ops.def"
};

/* Must match kernels/opencl/prelude.cl and gemm.cl. */
#define KILN_CL_REDUCE_WG 256
#define KILN_CL_GEMM_RM 8
#define KILN_CL_GEMM_RN 16
#define KILN_CL_GEMM_TILE 64

/* Work-groups a grid-stride kernel is given at most: beyond, work-items loop. */
#define KILN_CL_MAX_GROUPS 65536
/* Batches per launch at most (some drivers limit the third global dimension). */
#define KILN_CL_MAX_BATCH_PER_LAUNCH 65535
/* Scratch for packed GEMM panels or im2col columns, per round of batches. */
#define KILN_CL_SCRATCH_BUDGET ((size_t)256 << 20)

/* ---- helpers ---------------------------------------------------------------------- */

static cl_mem mem_of(const kiln_view_t *view) { return view->buffer ? view->buffer->mem : NULL; }

static bool fits_i32(int64_t v) { return v >= 0 && v <= INT_MAX; }

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* The largest work-group `kernel` may run with on the queue's device along
 * dimension 0, capped at `cap`. */
static kiln_status_t group_limit(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                 size_t cap, size_t *out_limit) {
  kiln_backend_device_t *device = queue->device;
  const kiln_cl_kernel_entry_t *entry = NULL;
  kiln_status_t status = kiln_cl_kernel_get(device, program, kernel, &entry);
  if (status != KILN_OK) return status;
  size_t limit = min_size(cap, entry->work_group_size ? entry->work_group_size : 1);
  if (device->max_work_group_size) limit = min_size(limit, device->max_work_group_size);
  if (device->max_work_item_sizes[0]) limit = min_size(limit, device->max_work_item_sizes[0]);
  *out_limit = limit ? limit : 1;
  return KILN_OK;
}

/* The largest power of two <= limit. */
static size_t pow2_floor(size_t limit) {
  size_t p = 1;
  while (p * 2 <= limit) p *= 2;
  return p;
}

/* A 1-D grid-stride kernel over n items. */
static kiln_status_t launch_flat(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                 int64_t n, size_t arg_count, const kiln_cl_arg_t *args) {
  size_t wg = 1;
  kiln_status_t status = group_limit(queue, program, kernel, 256, &wg);
  if (status != KILN_OK) return status;
  int64_t groups = (n + (int64_t)wg - 1) / (int64_t)wg;
  if (groups < 1) groups = 1;
  if (groups > KILN_CL_MAX_GROUPS) groups = KILN_CL_MAX_GROUPS;
  const size_t global = (size_t)groups * wg;
  return kiln_cl_launch(queue, program, kernel, 1, &global, &wg, arg_count, args);
}

/* A kernel with one work-group per row (a power of two wide, no wider than
 * the row needs), over `rows` rows with group-stride. */
static kiln_status_t launch_rows(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                 int64_t rows, int64_t row_len, size_t arg_count, const kiln_cl_arg_t *args) {
  size_t limit = 1;
  kiln_status_t status = group_limit(queue, program, kernel, KILN_CL_REDUCE_WG, &limit);
  if (status != KILN_OK) return status;
  size_t wg = pow2_floor(limit);
  while (wg > 1 && (int64_t)(wg / 2) >= row_len) wg /= 2;
  int64_t groups = rows < 1 ? 1 : rows;
  if (groups > KILN_CL_MAX_GROUPS) groups = KILN_CL_MAX_GROUPS;
  const size_t global = (size_t)groups * wg;
  return kiln_cl_launch(queue, program, kernel, 1, &global, &wg, arg_count, args);
}

/* Release scratch memory right after the work that uses it was enqueued:
 * OpenCL deletes a released buffer only once the commands that use it have
 * finished. */
static void scratch_release(kiln_backend_queue_t *queue, cl_mem mem) {
  (void)queue;
  if (mem) clReleaseMemObject(mem);
}

/* ---- generators ------------------------------------------------------------------ */

static kiln_status_t run_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                              const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  /* f32 and i32 are both one 32-bit pattern: the core converted the value. */
  uint32_t bits;
  if (op->out.dtype == KILN_F32)
    memcpy(&bits, &op->u.fill.value.f32, 4);
  else
    memcpy(&bits, &op->u.fill.value.i32, 4);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(mem_of(&op->out)), KILN_CL_LONG(op->out.offset), KILN_CL_LONG(n), KILN_CL_UINT(bits),
  };
  return launch_flat(queue, KILN_CL_PROGRAM_copy, "fill32", n, sizeof args / sizeof args[0], args);
}

static kiln_status_t run_arange(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  /* The doubles' bits for devices with fp64, and hi + lo float pairs for
   * the double-float evaluation of those without. */
  const double start = op->u.arange.start, step = op->u.arange.step;
  uint64_t start_bits, step_bits;
  memcpy(&start_bits, &start, 8);
  memcpy(&step_bits, &step, 8);
  const float start_hi = (float)start, step_hi = (float)step;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_LONG(n),
      KILN_CL_ULONG(start_bits),
      KILN_CL_ULONG(step_bits),
      KILN_CL_FLOAT(start_hi),
      KILN_CL_FLOAT((float)(start - (double)start_hi)),
      KILN_CL_FLOAT(step_hi),
      KILN_CL_FLOAT((float)(step - (double)step_hi)),
  };
  return launch_flat(queue, KILN_CL_PROGRAM_copy, op->out.dtype == KILN_F32 ? "arange_f32" : "arange_i32", n,
                     sizeof args / sizeof args[0], args);
}

static kiln_status_t run_random(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(mem_of(&op->out)),      KILN_CL_LONG(op->out.offset), KILN_CL_LONG(n),
      KILN_CL_ULONG(op->u.random.seed),   KILN_CL_FLOAT(op->u.random.a), KILN_CL_FLOAT(op->u.random.b),
  };
  return launch_flat(queue, KILN_CL_PROGRAM_random, op->u.random.normal ? "random_normal" : "random_uniform", n,
                     sizeof args / sizeof args[0], args);
}

/* ---- elementwise ------------------------------------------------------------------
 * The core merged the dimensions (extents of 1 dropped, contiguous runs fused)
 * and set op->flat when every operand is one contiguous run; the kernels get
 * the views' walk as it is, and ndim 0 for their contiguous fast path. */

/* out, then each input's buffer and offset, then the scalar (when there is
 * one), the element count, ndim and the eight-wide shape and input strides. */
static kiln_status_t launch_elementwise(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                        const kiln_op_t *op, int inputs, const kiln_cl_arg_t *scalar) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  const int ndim = op->flat ? 0 : op->out.ndim;
  kiln_cl_arg_t args[48];
  size_t c = 0;
  args[c++] = KILN_CL_MEM(mem_of(&op->out));
  args[c++] = KILN_CL_LONG(op->out.offset);
  for (int i = 0; i < inputs; i++) {
    args[c++] = KILN_CL_MEM(mem_of(&op->in[i]));
    args[c++] = KILN_CL_LONG(op->in[i].offset);
  }
  if (scalar) args[c++] = *scalar;
  args[c++] = KILN_CL_LONG(n);
  args[c++] = KILN_CL_INT(ndim);
  for (int d = 0; d < KILN_MAX_DIMS; d++) args[c++] = KILN_CL_LONG(d < ndim ? op->out.shape[d] : 0);
  for (int i = 0; i < inputs; i++)
    for (int d = 0; d < KILN_MAX_DIMS; d++) args[c++] = KILN_CL_LONG(d < ndim ? op->in[i].strides[d] : 0);
  return launch_flat(queue, program, kernel, n, c, args);
}

static kiln_status_t run_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                              const kiln_op_t *op) {
  return launch_elementwise(queue, KILN_CL_PROGRAM_copy, "copy32", op, 1, NULL);
}

static kiln_status_t run_cast(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                              const kiln_op_t *op) {
  const char *kernel = op->in[0].dtype == op->out.dtype ? "copy32"
                       : op->in[0].dtype == KILN_F32    ? "cast_f32_i32"
                                                        : "cast_i32_f32";
  return launch_elementwise(queue, KILN_CL_PROGRAM_copy, kernel, op, 1, NULL);
}

static kiln_status_t run_unary(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op) {
  const char *kernel = op->in[0].dtype == KILN_F32 ? unary_f32[op->u.unary.op] : unary_i32[op->u.unary.op];
  return launch_elementwise(queue, KILN_CL_PROGRAM_elementwise, kernel, op, 1, NULL);
}

static kiln_status_t run_binary(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                const kiln_op_t *op) {
  const char *kernel = op->in[0].dtype == KILN_F32 ? binary_f32[op->u.binary.op] : binary_i32[op->u.binary.op];
  return launch_elementwise(queue, KILN_CL_PROGRAM_elementwise, kernel, op, 2, NULL);
}

static kiln_status_t run_binary_scalar(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                       const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const bool f32 = op->in[0].dtype == KILN_F32;
  const char *kernel = f32 ? binary_scalar_f32[op->u.binary.op] : binary_scalar_i32[op->u.binary.op];
  const kiln_cl_arg_t scalar = f32 ? KILN_CL_FLOAT(op->u.binary.scalar.f32) : KILN_CL_INT(op->u.binary.scalar.i32);
  return launch_elementwise(queue, KILN_CL_PROGRAM_elementwise, kernel, op, 1, &scalar);
}

/* ---- reductions, softmax, cross-entropy ------------------------------------------------ */

/* Whether the work-items of a row kernel take contiguous runs of the row
 * (CPUs, where each runs alone on a core) rather than interleaved elements
 * (GPUs, where neighbours reading neighbours coalesce). */
static bool row_runs(kiln_backend_queue_t *queue) {
  return queue->device->is_cpu || queue->device->local_mem_is_global;
}

static kiln_status_t run_reduce(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                const kiln_op_entry_t *entry, const kiln_op_t *op) {
  /* outer * inner >= 1 (the result is never empty); len may be 0. */
  const int64_t outer = op->u.reduce.outer, len = op->u.reduce.len, inner = op->u.reduce.inner;
  const bool f32 = op->in[0].dtype == KILN_F32;
  const kiln_reduce_op_t rop = op->u.reduce.op;
  /* f32 sums (and means and norms) have kernels of their own that read eight
   * floats at a time and track no maximum. */
  const bool sum = f32 && (rop == KILN_REDUCE_SUM || rop == KILN_REDUCE_MEAN || rop == KILN_REDUCE_NORM);
  const cl_mem in = mem_of(&op->in[0]), out = mem_of(&op->out);
  if (inner > 1 || len == 0) {
    const kiln_cl_arg_t args[] = {
        KILN_CL_MEM(in),        KILN_CL_LONG(op->in[0].offset), KILN_CL_MEM(out),   KILN_CL_LONG(op->out.offset),
        KILN_CL_LONG(outer),    KILN_CL_LONG(len),              KILN_CL_LONG(inner), KILN_CL_INT(op->u.reduce.op),
    };
    if (sum) /* one work-item per eight columns */
      return launch_flat(queue, KILN_CL_PROGRAM_reduce, "reduce_cols_sum_f32", outer * ((inner + 7) / 8),
                         sizeof args / sizeof args[0], args);
    return launch_flat(queue, KILN_CL_PROGRAM_reduce, f32 ? "reduce_cols_f32" : "reduce_cols_i32", outer * inner,
                       sizeof args / sizeof args[0], args);
  }
  /* Rows: one work-group per row, and long rows split into chunks when there
   * are too few rows to occupy the device; a second pass merges the chunks. */
  kiln_backend_device_t *device = queue->device;
  const int64_t target_groups = (int64_t)(device->compute_units ? device->compute_units : 1) * 4;
  int64_t chunks = 1;
  if (outer < target_groups && len > 8192) {
    chunks = (target_groups + outer - 1) / outer;
    const int64_t most = (len + 4095) / 4096;
    if (chunks > most) chunks = most;
  }
  int64_t chunk = (len + chunks - 1) / chunks;
  chunks = (len + chunk - 1) / chunk;
  cl_mem parts = NULL;
  kiln_status_t status = KILN_OK;
  if (chunks > 1) {
    /* index (long), sum (float), isum (uint), best (4 bytes) per record */
    status = kiln_cl_scratch_create(device, (size_t)(outer * chunks) * 20u, &parts);
    if (status != KILN_OK) return status;
  }
  const bool contiguous = row_runs(queue);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(in),    KILN_CL_LONG(op->in[0].offset), KILN_CL_MEM(out),    KILN_CL_LONG(op->out.offset),
      KILN_CL_MEM(parts), KILN_CL_LONG(outer),            KILN_CL_LONG(len),   KILN_CL_LONG(chunk),
      KILN_CL_LONG(chunks), KILN_CL_INT(op->u.reduce.op), KILN_CL_INT(contiguous ? 1 : 0),
  };
  if (sum)
    status = launch_rows(queue, KILN_CL_PROGRAM_reduce, "reduce_rows_sum_f32", outer * chunks, (chunk + 7) / 8,
                         sizeof args / sizeof args[0], args);
  else
    status = launch_rows(queue, KILN_CL_PROGRAM_reduce, f32 ? "reduce_rows_f32" : "reduce_rows_i32",
                         outer * chunks, chunk, sizeof args / sizeof args[0] - 1, args);
  if (status == KILN_OK && chunks > 1) {
    const kiln_cl_arg_t pargs[] = {
        KILN_CL_MEM(parts), KILN_CL_MEM(out),     KILN_CL_LONG(op->out.offset), KILN_CL_LONG(outer),
        KILN_CL_LONG(len),  KILN_CL_LONG(chunks), KILN_CL_INT(op->u.reduce.op),
    };
    status = launch_rows(queue, KILN_CL_PROGRAM_reduce,
                         sum ? "reduce_parts_sum_f32" : f32 ? "reduce_parts_f32" : "reduce_parts_i32", outer, chunks,
                         sizeof pargs / sizeof pargs[0], pargs);
  }
  scratch_release(queue, parts);
  return status;
}

static kiln_status_t run_softmax(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                 const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t rows = op->u.softmax.rows, cols = op->u.softmax.cols;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(mem_of(&op->in[0])), KILN_CL_LONG(op->in[0].offset), KILN_CL_MEM(mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),    KILN_CL_LONG(rows),             KILN_CL_LONG(cols),
      KILN_CL_INT(op->u.softmax.log ? 1 : 0),  KILN_CL_INT(row_runs(queue) ? 1 : 0),
  };
  return launch_rows(queue, KILN_CL_PROGRAM_nn, "softmax_f32", rows, cols, sizeof args / sizeof args[0], args);
}

static kiln_status_t run_cross_entropy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                       const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t rows = op->u.cross_entropy.n, cols = op->u.cross_entropy.c;
  cl_mem work = NULL;
  kiln_status_t status = KILN_OK;
  if (rows > 0) {
    status = kiln_cl_scratch_create(queue->device, (size_t)rows * sizeof(float), &work);
    if (status != KILN_OK) return status;
    const kiln_cl_arg_t args[] = {
        KILN_CL_MEM(mem_of(&op->in[0])), KILN_CL_LONG(op->in[0].offset), KILN_CL_MEM(mem_of(&op->in[1])),
        KILN_CL_LONG(op->in[1].offset),  KILN_CL_MEM(work),              KILN_CL_LONG(rows),
        KILN_CL_LONG(cols),                KILN_CL_INT(row_runs(queue) ? 1 : 0),
    };
    status = launch_rows(queue, KILN_CL_PROGRAM_nn, "xent_rows", rows, cols, sizeof args / sizeof args[0], args);
  }
  /* n == 0 still writes the output: NaN, the mean of nothing. */
  if (status == KILN_OK) {
    const kiln_cl_arg_t args[] = {
        KILN_CL_MEM(work), KILN_CL_MEM(mem_of(&op->out)), KILN_CL_LONG(op->out.offset), KILN_CL_LONG(rows),
    };
    status = launch_rows(queue, KILN_CL_PROGRAM_nn, "xent_mean", 1, rows, sizeof args / sizeof args[0], args);
  }
  scratch_release(queue, work);
  return status;
}

/* ---- GEMM ------------------------------------------------------------------------- */

/* One GEMM on buffers: C[b] = op(A[b]) @ op(B[b]) for b < batch. */
typedef struct gemm_t {
  cl_mem a, b, c;
  int64_t a_off, b_off, c_off;
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
} gemm_t;

/* Whether the local-memory tiled kernel suits the device: a GPU (dedicated
 * local memory) that runs 16 x 16 work-groups of it. */
static bool gemm_use_tiled(kiln_backend_queue_t *queue) {
  kiln_backend_device_t *device = queue->device;
  if (device->is_cpu || device->local_mem_is_global) return false;
  if (device->max_work_item_sizes[0] < 16 || device->max_work_item_sizes[1] < 16) return false;
  if (device->local_mem_size < 2u * 16u * (KILN_CL_GEMM_TILE + 1) * sizeof(float)) return false;
  size_t limit = 0;
  if (group_limit(queue, KILN_CL_PROGRAM_gemm, "gemm_tiled", 256, &limit) != KILN_OK) return false;
  return limit >= 256;
}

static kiln_status_t gemm_tiled(kiln_backend_queue_t *queue, const gemm_t *g) {
  kiln_status_t status = KILN_OK;
  for (int64_t first = 0; status == KILN_OK && first < g->batch; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
    const int64_t count =
        g->batch - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? g->batch - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
    const kiln_cl_arg_t args[] = {
        KILN_CL_MEM(g->a),
        KILN_CL_LONG(g->a_off + first * g->stride_a),
        KILN_CL_MEM(g->b),
        KILN_CL_LONG(g->b_off + first * g->stride_b),
        KILN_CL_MEM(g->c),
        KILN_CL_LONG(g->c_off + first * g->stride_c),
        KILN_CL_INT(g->m),
        KILN_CL_INT(g->n),
        KILN_CL_INT(g->k),
        KILN_CL_LONG(g->lda),
        KILN_CL_LONG(g->ldb),
        KILN_CL_LONG(g->ldc),
        KILN_CL_INT(g->trans_a ? 1 : 0),
        KILN_CL_INT(g->trans_b ? 1 : 0),
        KILN_CL_LONG(g->stride_a),
        KILN_CL_LONG(g->stride_b),
        KILN_CL_LONG(g->stride_c),
    };
    const size_t global[3] = {(size_t)((g->n + KILN_CL_GEMM_TILE - 1) / KILN_CL_GEMM_TILE) * 16,
                              (size_t)((g->m + KILN_CL_GEMM_TILE - 1) / KILN_CL_GEMM_TILE) * 16, (size_t)count};
    const size_t local[3] = {16, 16, 1};
    status = kiln_cl_launch(queue, KILN_CL_PROGRAM_gemm, "gemm_tiled", 3, global, local, sizeof args / sizeof args[0],
                            args);
  }
  return status;
}

/* A kernel over (columns, rows, batches) with work-items along columns: one
 * work-group row of up to 256 work-items, rounded up (the kernel checks). */
static kiln_status_t launch_planes(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                   int64_t cols, int64_t rows, int64_t batches, size_t arg_count,
                                   const kiln_cl_arg_t *args) {
  size_t wg = 1;
  kiln_status_t status = group_limit(queue, program, kernel, 256, &wg);
  if (status != KILN_OK) return status;
  /* No wider than the columns need: short rows would leave most idle. */
  while (wg > 1 && (int64_t)(wg / 2) >= cols) wg /= 2;
  const size_t global[3] = {((size_t)cols + wg - 1) / wg * wg, (size_t)rows, (size_t)batches};
  const size_t local[3] = {wg, 1, 1};
  return kiln_cl_launch(queue, program, kernel, 3, global, local, arg_count, args);
}

/* Pack `count` batches of one operand (gemm_pack_a or gemm_pack_b) into `dst`. */
static kiln_status_t gemm_pack(kiln_backend_queue_t *queue, const char *kernel, cl_mem src, int64_t src_off,
                               cl_mem dst, int64_t rows, int64_t k, int64_t ld, bool trans, int64_t stride,
                               int64_t blocks, int64_t block_rows, int64_t count) {
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(src), KILN_CL_LONG(src_off),      KILN_CL_MEM(dst),     KILN_CL_INT(rows), KILN_CL_INT(k),
      KILN_CL_LONG(ld), KILN_CL_INT(trans ? 1 : 0), KILN_CL_LONG(stride), KILN_CL_INT(blocks),
  };
  return launch_planes(queue, KILN_CL_PROGRAM_gemm, kernel, blocks * block_rows, k, count,
                       sizeof args / sizeof args[0], args);
}

/* The work-group of gemm_packed: two column blocks by up to sixteen row blocks
 * (measured best on PoCL), within the kernel's and the device's limits. */
static kiln_status_t gemm_packed_local(kiln_backend_queue_t *queue, size_t *out_lx, size_t *out_ly) {
  size_t limit = 1;
  kiln_status_t status = group_limit(queue, KILN_CL_PROGRAM_gemm, "gemm_packed", 32, &limit);
  if (status != KILN_OK) return status;
  const size_t lx = limit >= 2 ? 2 : 1;
  size_t ly = limit / lx;
  if (ly > 16) ly = 16;
  const size_t dim1 = queue->device->max_work_item_sizes[1];
  if (dim1 && ly > dim1) ly = dim1;
  *out_lx = lx;
  *out_ly = ly ? ly : 1;
  return KILN_OK;
}

/* The product of packed panels for `count` batches from `first`. */
static kiln_status_t gemm_packed_compute(kiln_backend_queue_t *queue, const gemm_t *g, cl_mem pa, cl_mem pb,
                                         int64_t first, int64_t count, int64_t ap_batch, int64_t bp_batch) {
  const int64_t mb = (g->m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM, nb = (g->n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  size_t lx = 1, ly = 1;
  kiln_status_t status = gemm_packed_local(queue, &lx, &ly);
  if (status != KILN_OK) return status;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(pa),
      KILN_CL_MEM(pb),
      KILN_CL_MEM(g->c),
      KILN_CL_LONG(g->c_off + first * g->stride_c),
      KILN_CL_INT(g->m),
      KILN_CL_INT(g->n),
      KILN_CL_INT(g->k),
      KILN_CL_LONG(g->ldc),
      KILN_CL_LONG(g->stride_c),
      KILN_CL_INT(mb),
      KILN_CL_INT(nb),
      KILN_CL_LONG(ap_batch),
      KILN_CL_LONG(bp_batch),
  };
  const size_t global[3] = {((size_t)nb + lx - 1) / lx * lx, ((size_t)mb + ly - 1) / ly * ly, (size_t)count};
  const size_t local[3] = {lx, ly, 1};
  return kiln_cl_launch(queue, KILN_CL_PROGRAM_gemm, "gemm_packed", 3, global, local, sizeof args / sizeof args[0],
                        args);
}

/* Scratch bytes one round of packed panels or columns may take. */
static size_t scratch_budget(const kiln_backend_device_t *device) {
  size_t budget = KILN_CL_SCRATCH_BUDGET;
  if (device->max_alloc && device->max_alloc / 2 < budget) budget = (size_t)(device->max_alloc / 2);
  return budget;
}

/* Batches per round for `per_batch` scratch bytes each. */
static int64_t round_of(const kiln_backend_device_t *device, size_t per_batch, int64_t batches) {
  int64_t round = per_batch ? (int64_t)(scratch_budget(device) / per_batch) : batches;
  if (round < 1) round = 1;
  if (round > batches) round = batches;
  if (round > KILN_CL_MAX_BATCH_PER_LAUNCH) round = KILN_CL_MAX_BATCH_PER_LAUNCH;
  return round;
}

static kiln_status_t gemm_packed(kiln_backend_queue_t *queue, const gemm_t *g) {
  kiln_backend_device_t *device = queue->device;
  const int64_t mb = (g->m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM, nb = (g->n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  const int64_t a_elems = mb * KILN_CL_GEMM_RM * g->k, b_elems = nb * KILN_CL_GEMM_RN * g->k;
  const bool shared_a = g->stride_a == 0; /* every batch multiplies the same A: pack it once */
  const int64_t round =
      round_of(device, (size_t)(b_elems + (shared_a ? 0 : a_elems)) * sizeof(float), g->batch);
  cl_mem pa = NULL, pb = NULL;
  kiln_status_t status = KILN_OK;
  if (g->k > 0) {
    status = kiln_cl_scratch_create(device, (size_t)(a_elems * (shared_a ? 1 : round)) * sizeof(float), &pa);
    if (status == KILN_OK) status = kiln_cl_scratch_create(device, (size_t)(b_elems * round) * sizeof(float), &pb);
  }
  for (int64_t first = 0; status == KILN_OK && first < g->batch; first += round) {
    const int64_t count = g->batch - first < round ? g->batch - first : round;
    if (g->k > 0) {
      if (!shared_a || first == 0)
        status = gemm_pack(queue, "gemm_pack_a", g->a, g->a_off + first * g->stride_a, pa, g->m, g->k, g->lda,
                           g->trans_a, g->stride_a, mb, KILN_CL_GEMM_RM, shared_a ? 1 : count);
      if (status == KILN_OK)
        status = gemm_pack(queue, "gemm_pack_b", g->b, g->b_off + first * g->stride_b, pb, g->n, g->k, g->ldb,
                           g->trans_b, g->stride_b, nb, KILN_CL_GEMM_RN, count);
      if (status != KILN_OK) break;
    }
    status = gemm_packed_compute(queue, g, pa, pb, first, count, shared_a ? 0 : a_elems, b_elems);
  }
  scratch_release(queue, pa);
  scratch_release(queue, pb);
  return status;
}

static kiln_status_t gemm_run(kiln_backend_queue_t *queue, const gemm_t *g) {
  if (g->m == 0 || g->n == 0 || g->batch == 0) return KILN_OK;
  if (!fits_i32(g->m) || !fits_i32(g->n) || !fits_i32(g->k) ||
      !fits_i32((g->m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM * KILN_CL_GEMM_RM) ||
      !fits_i32((g->n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN * KILN_CL_GEMM_RN))
    return kiln_cl_error(queue->device->ctx, KILN_OUT_OF_RESOURCES,
                         "the native OpenCL matmul takes m, n, k below 2^31, got m=%lld n=%lld k=%lld; split the "
                         "product",
                         (long long)g->m, (long long)g->n, (long long)g->k);
  return gemm_use_tiled(queue) ? gemm_tiled(queue, g) : gemm_packed(queue, g);
}

static kiln_status_t run_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                const kiln_op_entry_t *entry, const kiln_op_t *op) {
  gemm_t g = {
      .a = mem_of(&op->in[0]),
      .b = mem_of(&op->in[1]),
      .c = mem_of(&op->out),
      .a_off = (int64_t)op->in[0].offset,
      .b_off = (int64_t)op->in[1].offset,
      .c_off = (int64_t)op->out.offset,
      .batch = op->u.matmul.batch,
      .m = op->u.matmul.m,
      .n = op->u.matmul.n,
      .k = op->u.matmul.k,
      .trans_a = op->u.matmul.trans_a,
      .trans_b = op->u.matmul.trans_b,
      .lda = op->u.matmul.lda,
      .ldb = op->u.matmul.ldb,
      .ldc = op->u.matmul.ldc,
      .stride_a = op->u.matmul.stride_a,
      .stride_b = op->u.matmul.stride_b,
      .stride_c = op->u.matmul.stride_c,
  };
  return gemm_run(queue, &g);
}

/* ---- convolution and pooling ------------------------------------------------------- */

static kiln_status_t run_conv2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                const kiln_op_entry_t *entry, const kiln_op_t *op) {
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, r = op->u.conv2d.r, s = op->u.conv2d.s, p = op->u.conv2d.p, q = op->u.conv2d.q;
  const int64_t crs = c * r * s, pq = p * q;
  const int64_t nb = (pq + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  if (!fits_i32(crs) || !fits_i32(nb * KILN_CL_GEMM_RN) || !fits_i32(k) || !fits_i32(c * h * w))
    return kiln_cl_error(ctx, KILN_OUT_OF_RESOURCES,
                         "the native OpenCL conv2d needs c*r*s, p*q, k and c*h*w below 2^31, got %lld, %lld, %lld, "
                         "%lld; split the batch or the channels",
                         (long long)crs, (long long)pq, (long long)k, (long long)(c * h * w));
  const cl_mem x = mem_of(&op->in[0]), y = mem_of(&op->out);
  const int64_t x_off = (int64_t)op->in[0].offset, y_off = (int64_t)op->out.offset;
  /* Per image: Y[k, pq] = W[k, crs] @ columns[crs, pq]. */
  gemm_t g = {
      .a = mem_of(&op->in[1]),
      .a_off = (int64_t)op->in[1].offset,
      .c = y,
      .c_off = y_off,
      .m = k,
      .n = pq,
      .k = crs,
      .lda = crs,
      .ldb = pq,
      .ldc = pq,
      .stride_a = 0,
      .stride_b = crs * pq,
      .stride_c = k * pq,
  };
  kiln_status_t status = KILN_OK;
  const bool pointwise = r == 1 && s == 1 && op->u.conv2d.stride[0] == 1 && op->u.conv2d.stride[1] == 1 &&
                         op->u.conv2d.pad[0] == 0 && op->u.conv2d.pad[1] == 0 && p == h && q == w;
  const bool packed = !gemm_use_tiled(queue);
  if (pointwise || crs == 0) {
    /* A 1x1 convolution is already a GEMM over each image: no columns (and
     * no channels is a GEMM with k = 0: zeros). */
    g.b = x;
    g.b_off = x_off;
    g.batch = n;
    status = gemm_run(queue, &g);
  } else {
    /* Columns for a round of images, in the packed GEMM's layout for B when
     * that is the GEMM that runs (no packing pass of B then). */
    const char *kernel = packed ? "im2col_packed_f32" : "im2col_f32";
    const int64_t cols_per_image = packed ? nb * KILN_CL_GEMM_RN : pq;
    const size_t per_image = (size_t)crs * (size_t)cols_per_image * sizeof(float);
    const int64_t step = round_of(device, per_image, n);
    const int64_t mb = (k + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM;
    cl_mem cols = NULL, pa = NULL;
    status = kiln_cl_scratch_create(device, per_image * (size_t)step, &cols);
    if (status == KILN_OK && packed) {
      status = kiln_cl_scratch_create(device, (size_t)(mb * KILN_CL_GEMM_RM * crs) * sizeof(float), &pa);
      if (status == KILN_OK)
        status = gemm_pack(queue, "gemm_pack_a", g.a, g.a_off, pa, k, crs, crs, false, 0, mb, KILN_CL_GEMM_RM, 1);
    }
    for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
      const int64_t count = n - first < step ? n - first : step;
      const kiln_cl_arg_t args[] = {
          KILN_CL_MEM(x),
          KILN_CL_LONG(x_off + first * c * h * w),
          KILN_CL_MEM(cols),
          KILN_CL_INT(c),
          KILN_CL_INT(h),
          KILN_CL_INT(w),
          KILN_CL_INT(r),
          KILN_CL_INT(s),
          KILN_CL_INT(p),
          KILN_CL_INT(q),
          KILN_CL_INT(op->u.conv2d.stride[0]),
          KILN_CL_INT(op->u.conv2d.stride[1]),
          KILN_CL_INT(op->u.conv2d.pad[0]),
          KILN_CL_INT(op->u.conv2d.pad[1]),
          KILN_CL_INT(op->u.conv2d.dil[0]),
          KILN_CL_INT(op->u.conv2d.dil[1]),
      };
      /* Work-items along q, p rows (one more for the packed layout's zero
       * columns past p*q, fewer than RN of them), a plane per (image, row). */
      const int64_t across = packed && q < KILN_CL_GEMM_RN ? KILN_CL_GEMM_RN : q;
      status = launch_planes(queue, KILN_CL_PROGRAM_conv, kernel, across, packed ? p + 1 : p, count * crs,
                             sizeof args / sizeof args[0], args);
      if (status != KILN_OK) break;
      if (packed) {
        /* gemm_packed_compute offsets C by first * stride_c itself. */
        status = gemm_packed_compute(queue, &g, pa, cols, first, count, 0, crs * cols_per_image);
      } else {
        gemm_t gi = g;
        gi.b = cols;
        gi.b_off = 0;
        gi.c_off = y_off + first * k * pq;
        gi.batch = count;
        status = gemm_run(queue, &gi);
      }
    }
    scratch_release(queue, cols);
    scratch_release(queue, pa);
  }
  if (status == KILN_OK && op->u.conv2d.has_bias) {
    /* The batch dimension in rounds, as some drivers limit the third one. */
    for (int64_t first = 0; status == KILN_OK && first < n; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
      const int64_t count = n - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? n - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
      const kiln_cl_arg_t bargs[] = {
          KILN_CL_MEM(y),
          KILN_CL_LONG(y_off + first * k * pq),
          KILN_CL_MEM(mem_of(&op->in[2])),
          KILN_CL_LONG(op->in[2].offset),
          KILN_CL_INT(k),
          KILN_CL_INT(pq),
      };
      status = launch_planes(queue, KILN_CL_PROGRAM_conv, "bias_nchw_f32", pq, k, count,
                             sizeof bargs / sizeof bargs[0], bargs);
    }
  }
  return status;
}

static kiln_status_t run_max_pool2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t planes = op->u.pooling.n * op->u.pooling.c, p = op->u.pooling.p, q = op->u.pooling.q;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(mem_of(&op->in[0])),      KILN_CL_LONG(op->in[0].offset),       KILN_CL_MEM(mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),         KILN_CL_LONG(planes),                 KILN_CL_LONG(op->u.pooling.h),
      KILN_CL_LONG(op->u.pooling.w),        KILN_CL_LONG(p),                      KILN_CL_LONG(q),
      KILN_CL_INT(op->u.pooling.kernel[0]), KILN_CL_INT(op->u.pooling.kernel[1]), KILN_CL_INT(op->u.pooling.stride[0]),
      KILN_CL_INT(op->u.pooling.stride[1]), KILN_CL_INT(op->u.pooling.pad[0]),    KILN_CL_INT(op->u.pooling.pad[1]),
  };
  return launch_flat(queue, KILN_CL_PROGRAM_conv, "max_pool2d_f32", planes * p * q, sizeof args / sizeof args[0],
                     args);
}

/* ---- the table ------------------------------------------------------------------------
 * A native row for every kind, each running kiln's kernels for it (run_<name>
 * above: a kind added to KILN_OP_KINDS without its function does not
 * compile), then the clblast row of matmul (clblast.c). The core validated
 * every op a row sees (dtypes, shapes, formulas), so no row checks again. */

#define KILN_CL_NATIVE_ROW_(NAME, name) \
  {.kind = KILN_OP_##NAME, .provider = KILN_PROVIDER_NATIVE_NAME, .supports = NULL, .run = run_##name, .impl = NULL},
const kiln_op_entry_t kiln_cl_ops[] = {
    KILN_OP_KINDS(KILN_CL_NATIVE_ROW_)
    {.kind = KILN_OP_MATMUL, .provider = "clblast", .supports = kiln_cl_clblast_supports, .run = kiln_cl_clblast_run,
     .impl = NULL},
    KILN_OP_TABLE_END,
};
#undef KILN_CL_NATIVE_ROW_
