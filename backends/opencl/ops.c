/* backends/opencl/ops.c: the OpenCL table of operation entries (a native row for every op kind, the clblast row of matmul), the launch helpers every row uses, and the rows of the generators, elementwise ops, reductions, softmax, cross-entropy and max pooling. */
#include <string.h>

#include "backends/opencl/ops.h"

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

/* ---- helpers ---------------------------------------------------------------------- */

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

kiln_status_t kiln_cl_group_limit(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
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

kiln_status_t kiln_cl_launch_flat(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel, int64_t n,
                                  size_t arg_count, const kiln_cl_arg_t *args) {
  size_t wg = 1;
  kiln_status_t status = kiln_cl_group_limit(queue, program, kernel, 256, &wg);
  if (status != KILN_OK) return status;
  int64_t groups = (n + (int64_t)wg - 1) / (int64_t)wg;
  if (groups < 1) groups = 1;
  if (groups > KILN_CL_MAX_GROUPS) groups = KILN_CL_MAX_GROUPS;
  const size_t global = (size_t)groups * wg;
  return kiln_cl_launch(queue, program, kernel, 1, &global, &wg, arg_count, args);
}

kiln_status_t kiln_cl_launch_rows(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                  int64_t rows, int64_t row_len, size_t arg_count, const kiln_cl_arg_t *args) {
  size_t limit = 1;
  kiln_status_t status = kiln_cl_group_limit(queue, program, kernel, KILN_CL_REDUCE_WG, &limit);
  if (status != KILN_OK) return status;
  size_t wg = pow2_floor(limit);
  while (wg > 1 && (int64_t)(wg / 2) >= row_len) wg /= 2;
  int64_t groups = rows < 1 ? 1 : rows;
  if (groups > KILN_CL_MAX_GROUPS) groups = KILN_CL_MAX_GROUPS;
  const size_t global = (size_t)groups * wg;
  return kiln_cl_launch(queue, program, kernel, 1, &global, &wg, arg_count, args);
}

kiln_status_t kiln_cl_launch_planes(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                    int64_t cols, int64_t rows, int64_t batches, size_t arg_count,
                                    const kiln_cl_arg_t *args) {
  size_t wg = 1;
  kiln_status_t status = kiln_cl_group_limit(queue, program, kernel, 256, &wg);
  if (status != KILN_OK) return status;
  /* No wider than the columns need: short rows would leave most idle. */
  while (wg > 1 && (int64_t)(wg / 2) >= cols) wg /= 2;
  const size_t global[3] = {((size_t)cols + wg - 1) / wg * wg, (size_t)rows, (size_t)batches};
  const size_t local[3] = {wg, 1, 1};
  return kiln_cl_launch(queue, program, kernel, 3, global, local, arg_count, args);
}

kiln_status_t kiln_cl_launch_tiles(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                   int64_t cols, int64_t rows, int64_t batches, size_t arg_count,
                                   const kiln_cl_arg_t *args) {
  kiln_backend_device_t *device = queue->device;
  size_t limit = 1;
  kiln_status_t status = kiln_cl_group_limit(queue, program, kernel, 256, &limit);
  if (status != KILN_OK) return status;
  size_t lx = pow2_floor(limit);
  while (lx > 1 && (int64_t)(lx / 2) >= cols) lx /= 2;
  size_t ly = limit / lx;
  if (device->max_work_item_sizes[1] && ly > device->max_work_item_sizes[1]) ly = device->max_work_item_sizes[1];
  while (ly > 1 && (int64_t)(ly / 2) >= rows) ly /= 2;
  if (ly < 1) ly = 1;
  const size_t global[3] = {((size_t)cols + lx - 1) / lx * lx, ((size_t)rows + ly - 1) / ly * ly, (size_t)batches};
  const size_t local[3] = {lx, ly, 1};
  return kiln_cl_launch(queue, program, kernel, 3, global, local, arg_count, args);
}

kiln_status_t kiln_cl_zero_f32(kiln_backend_queue_t *queue, cl_mem mem, int64_t offset, int64_t count) {
  const kiln_cl_arg_t args[] = {KILN_CL_MEM(mem), KILN_CL_LONG(offset), KILN_CL_LONG(count), KILN_CL_UINT(0)};
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_copy, "fill32", count, sizeof args / sizeof args[0], args);
}

/* ---- generators ------------------------------------------------------------------ */

kiln_status_t kiln_cl_run_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  /* f32 and i32 are both one 32-bit pattern: the core converted the value. */
  uint32_t bits;
  if (op->out.dtype == KILN_F32)
    memcpy(&bits, &op->u.fill.value.f32, 4);
  else
    memcpy(&bits, &op->u.fill.value.i32, 4);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_LONG(n),
      KILN_CL_UINT(bits),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_copy, "fill32", n, sizeof args / sizeof args[0], args);
}

kiln_status_t kiln_cl_run_arange(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
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
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_LONG(n),
      KILN_CL_ULONG(start_bits),
      KILN_CL_ULONG(step_bits),
      KILN_CL_FLOAT(start_hi),
      KILN_CL_FLOAT((float)(start - (double)start_hi)),
      KILN_CL_FLOAT(step_hi),
      KILN_CL_FLOAT((float)(step - (double)step_hi)),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_copy, op->out.dtype == KILN_F32 ? "arange_f32" : "arange_i32", n,
                             sizeof args / sizeof args[0], args);
}

kiln_status_t kiln_cl_run_random(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                 const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)), KILN_CL_LONG(op->out.offset),  KILN_CL_LONG(n),
      KILN_CL_ULONG(op->u.random.seed),      KILN_CL_FLOAT(op->u.random.a), KILN_CL_FLOAT(op->u.random.b),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_random, op->u.random.normal ? "random_normal" : "random_uniform", n,
                             sizeof args / sizeof args[0], args);
}

/* ---- elementwise ------------------------------------------------------------------
 * The core merged the dimensions (extents of 1 dropped, contiguous runs fused)
 * and set op->flat when every operand is one contiguous run; the kernels get
 * the views' walk as it is, and ndim 0 for their contiguous fast path. */

/* out, then each input's buffer and offset, then the scalar (when there is
 * one), the element count, ndim and the eight-wide shape and input strides. */
kiln_status_t kiln_cl_launch_elementwise(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                         const kiln_op_t *op, int inputs, const kiln_cl_arg_t *scalar,
                                         int flat_per_item) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  const int ndim = op->flat ? 0 : op->out.ndim;
  kiln_cl_arg_t args[48];
  size_t c = 0;
  args[c++] = KILN_CL_MEM(kiln_cl_mem_of(&op->out));
  args[c++] = KILN_CL_LONG(op->out.offset);
  for (int i = 0; i < inputs; i++) {
    args[c++] = KILN_CL_MEM(kiln_cl_mem_of(&op->in[i]));
    args[c++] = KILN_CL_LONG(op->in[i].offset);
  }
  if (scalar) args[c++] = *scalar;
  args[c++] = KILN_CL_LONG(n);
  args[c++] = KILN_CL_INT(ndim);
  for (int d = 0; d < KILN_MAX_DIMS; d++) args[c++] = KILN_CL_LONG(d < ndim ? op->out.shape[d] : 0);
  for (int i = 0; i < inputs; i++)
    for (int d = 0; d < KILN_MAX_DIMS; d++) args[c++] = KILN_CL_LONG(d < ndim ? op->in[i].strides[d] : 0);
  return kiln_cl_launch_flat(queue, program, kernel, ndim == 0 ? (n + flat_per_item - 1) / flat_per_item : n, c,
                             args);
}

kiln_status_t kiln_cl_run_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op) {
  return kiln_cl_launch_elementwise(queue, KILN_CL_PROGRAM_copy, "copy32", op, 1, NULL, 1);
}

kiln_status_t kiln_cl_run_cast(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op) {
  const char *kernel = op->in[0].dtype == op->out.dtype ? "copy32"
                       : op->in[0].dtype == KILN_F32    ? "cast_f32_i32"
                                                        : "cast_i32_f32";
  return kiln_cl_launch_elementwise(queue, KILN_CL_PROGRAM_copy, kernel, op, 1, NULL, 1);
}

kiln_status_t kiln_cl_run_unary(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                const kiln_op_t *op) {
  const char *kernel = op->in[0].dtype == KILN_F32 ? unary_f32[op->u.unary.op] : unary_i32[op->u.unary.op];
  return kiln_cl_launch_elementwise(queue, KILN_CL_PROGRAM_elementwise, kernel, op, 1, NULL, 1);
}

kiln_status_t kiln_cl_run_binary(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                 const kiln_op_t *op) {
  const char *kernel = op->in[0].dtype == KILN_F32 ? binary_f32[op->u.binary.op] : binary_i32[op->u.binary.op];
  return kiln_cl_launch_elementwise(queue, KILN_CL_PROGRAM_elementwise, kernel, op, 2, NULL, 1);
}

kiln_status_t kiln_cl_run_binary_scalar(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                        const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const bool f32 = op->in[0].dtype == KILN_F32;
  const char *kernel = f32 ? binary_scalar_f32[op->u.binary.op] : binary_scalar_i32[op->u.binary.op];
  const kiln_cl_arg_t scalar = f32 ? KILN_CL_FLOAT(op->u.binary.scalar.f32) : KILN_CL_INT(op->u.binary.scalar.i32);
  return kiln_cl_launch_elementwise(queue, KILN_CL_PROGRAM_elementwise, kernel, op, 1, &scalar, 1);
}

/* ---- reductions, softmax, cross-entropy ------------------------------------------------ */

kiln_status_t kiln_cl_run_reduce(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                 const kiln_op_t *op) {
  /* outer * inner >= 1 (the result is never empty); len may be 0. */
  const int64_t outer = op->u.reduce.outer, len = op->u.reduce.len, inner = op->u.reduce.inner;
  const bool f32 = op->in[0].dtype == KILN_F32;
  const kiln_reduce_op_t rop = op->u.reduce.op;
  /* f32 sums (and means and norms) have kernels of their own that read eight
   * floats at a time and track no maximum. */
  const bool sum = f32 && (rop == KILN_REDUCE_SUM || rop == KILN_REDUCE_MEAN || rop == KILN_REDUCE_NORM);
  const cl_mem in = kiln_cl_mem_of(&op->in[0]), out = kiln_cl_mem_of(&op->out);
  if (inner > 1 || len == 0) {
    const kiln_cl_arg_t args[] = {
        KILN_CL_MEM(in),        KILN_CL_LONG(op->in[0].offset), KILN_CL_MEM(out),   KILN_CL_LONG(op->out.offset),
        KILN_CL_LONG(outer),    KILN_CL_LONG(len),              KILN_CL_LONG(inner), KILN_CL_INT(op->u.reduce.op),
    };
    if (sum) /* one work-item per eight columns */
      return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_reduce, "reduce_cols_sum_f32", outer * ((inner + 7) / 8),
                                 sizeof args / sizeof args[0], args);
    return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_reduce, f32 ? "reduce_cols_f32" : "reduce_cols_i32",
                               outer * inner, sizeof args / sizeof args[0], args);
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
  const bool contiguous = kiln_cl_row_runs(queue);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(in),    KILN_CL_LONG(op->in[0].offset), KILN_CL_MEM(out),    KILN_CL_LONG(op->out.offset),
      KILN_CL_MEM(parts), KILN_CL_LONG(outer),            KILN_CL_LONG(len),   KILN_CL_LONG(chunk),
      KILN_CL_LONG(chunks), KILN_CL_INT(op->u.reduce.op), KILN_CL_INT(contiguous ? 1 : 0),
  };
  if (sum)
    status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_reduce, "reduce_rows_sum_f32", outer * chunks, (chunk + 7) / 8,
                                 sizeof args / sizeof args[0], args);
  else
    status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_reduce, f32 ? "reduce_rows_f32" : "reduce_rows_i32",
                                 outer * chunks, chunk, sizeof args / sizeof args[0] - 1, args);
  if (status == KILN_OK && chunks > 1) {
    const kiln_cl_arg_t pargs[] = {
        KILN_CL_MEM(parts), KILN_CL_MEM(out),     KILN_CL_LONG(op->out.offset), KILN_CL_LONG(outer),
        KILN_CL_LONG(len),  KILN_CL_LONG(chunks), KILN_CL_INT(op->u.reduce.op),
    };
    status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_reduce,
                                 sum   ? "reduce_parts_sum_f32"
                                 : f32 ? "reduce_parts_f32"
                                       : "reduce_parts_i32",
                                 outer, chunks, sizeof pargs / sizeof pargs[0], pargs);
  }
  kiln_cl_scratch_release(parts);
  return status;
}

kiln_status_t kiln_cl_run_softmax(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t rows = op->u.softmax.rows, cols = op->u.softmax.cols;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
      KILN_CL_LONG(op->in[0].offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_LONG(rows),
      KILN_CL_LONG(cols),
      KILN_CL_INT(op->u.softmax.log ? 1 : 0),
      KILN_CL_INT(kiln_cl_row_runs(queue) ? 1 : 0),
  };
  return kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_nn, "softmax_f32", rows, cols, sizeof args / sizeof args[0], args);
}

kiln_status_t kiln_cl_run_cross_entropy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                        const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t rows = op->u.cross_entropy.n, cols = op->u.cross_entropy.c;
  cl_mem work = NULL;
  kiln_status_t status = KILN_OK;
  if (rows > 0) {
    status = kiln_cl_scratch_create(queue->device, (size_t)rows * sizeof(float), &work);
    if (status != KILN_OK) return status;
    const kiln_cl_arg_t args[] = {
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
        KILN_CL_LONG(op->in[0].offset),
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[1])),
        KILN_CL_LONG(op->in[1].offset),
        KILN_CL_MEM(work),
        KILN_CL_LONG(rows),
        KILN_CL_LONG(cols),
        KILN_CL_INT(kiln_cl_row_runs(queue) ? 1 : 0),
    };
    status =
        kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_nn, "xent_rows", rows, cols, sizeof args / sizeof args[0], args);
  }
  /* n == 0 still writes the output: NaN, the mean of nothing. */
  if (status == KILN_OK) {
    const kiln_cl_arg_t args[] = {
        KILN_CL_MEM(work),
        KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
        KILN_CL_LONG(op->out.offset),
        KILN_CL_LONG(rows),
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[1])),
        KILN_CL_LONG(op->in[1].offset),
        KILN_CL_LONG(cols),
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[2])),
        KILN_CL_LONG(op->in[2].offset),
    };
    status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_nn, "xent_mean", 1, rows, sizeof args / sizeof args[0], args);
  }
  kiln_cl_scratch_release(work);
  return status;
}

/* ---- pooling ---------------------------------------------------------------------- */

kiln_status_t kiln_cl_run_max_pool2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t planes = op->u.pooling.n * op->u.pooling.c, p = op->u.pooling.p, q = op->u.pooling.q;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
      KILN_CL_LONG(op->in[0].offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_LONG(planes),
      KILN_CL_LONG(op->u.pooling.h),
      KILN_CL_LONG(op->u.pooling.w),
      KILN_CL_LONG(p),
      KILN_CL_LONG(q),
      KILN_CL_INT(op->u.pooling.window[0]),
      KILN_CL_INT(op->u.pooling.window[1]),
      KILN_CL_INT(op->u.pooling.stride[0]),
      KILN_CL_INT(op->u.pooling.stride[1]),
      KILN_CL_INT(op->u.pooling.pad[0]),
      KILN_CL_INT(op->u.pooling.pad[1]),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_conv, "max_pool2d_f32", planes * p * q,
                             sizeof args / sizeof args[0], args);
}

/* ---- the table ------------------------------------------------------------------------
 * A native row for every kind, each running kiln's kernels for it
 * (kiln_cl_run_<name> of this file, gemm.c and ops_train.c: a kind added to
 * KILN_OP_KINDS without its function does not link), then the clblast row
 * of matmul (clblast.c). The core validated every op a row sees (dtypes,
 * shapes, formulas), so no row checks again. */

#define KILN_CL_NATIVE_ROW_(NAME, name, launch)                                                                   \
  {.kind = KILN_OP_##NAME, .provider = KILN_PROVIDER_NATIVE_NAME, .supports = NULL, .run = kiln_cl_run_##name, \
   .impl = NULL},
const kiln_op_entry_t kiln_cl_ops[] = {
    KILN_OP_KINDS(KILN_CL_NATIVE_ROW_)
    {.kind = KILN_OP_MATMUL, .provider = "clblast", .supports = kiln_cl_clblast_supports, .run = kiln_cl_clblast_run,
     .impl = NULL},
    KILN_OP_TABLE_END,
};
#undef KILN_CL_NATIVE_ROW_
