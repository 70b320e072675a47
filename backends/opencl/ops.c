/* backends/opencl/ops.c: the OpenCL table of operation entries (a native row for every op kind, the clblast row of matmul), the launch helpers, the generic runners of FLAT and ROWS kinds, f16/bf16 through an f32 planner, and the planners of copy, reduce and cross_entropy. */
#include <stdio.h>
#include <string.h>

#include "backends/opencl/ops.h"

/* ---- helpers ---------------------------------------------------------------------- */

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* The largest work-group of a kernel looked up, capped at `cap`. */
static size_t entry_group_limit(const kiln_backend_device_t *device, const kiln_cl_kernel_entry_t *entry, size_t cap) {
  size_t limit = min_size(cap, entry->work_group_size ? entry->work_group_size : 1);
  if (device->max_work_group_size) limit = min_size(limit, device->max_work_group_size);
  if (device->max_work_item_sizes[0]) limit = min_size(limit, device->max_work_item_sizes[0]);
  return limit ? limit : 1;
}

kiln_status_t kiln_cl_group_limit(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                  size_t cap, size_t *out_limit) {
  const kiln_cl_kernel_entry_t *entry = NULL;
  kiln_status_t status = kiln_cl_kernel_get(queue->device, program, kernel, &entry);
  if (status != KILN_OK) return status;
  *out_limit = entry_group_limit(queue->device, entry, cap);
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
  const kiln_cl_kernel_entry_t *entry = NULL;
  kiln_status_t status = kiln_cl_kernel_get(queue->device, program, kernel, &entry);
  if (status != KILN_OK) return status;
  return kiln_cl_launch_flat_entry(queue, entry, n, arg_count, args);
}

kiln_status_t kiln_cl_launch_flat_entry(kiln_backend_queue_t *queue, const kiln_cl_kernel_entry_t *entry, int64_t n,
                                        size_t arg_count, const kiln_cl_arg_t *args) {
  size_t wg = entry_group_limit(queue->device, entry, 256);
  int64_t groups = (n + (int64_t)wg - 1) / (int64_t)wg;
  if (groups < 1) groups = 1;
  if (groups > KILN_CL_MAX_GROUPS) groups = KILN_CL_MAX_GROUPS;
  const size_t global = (size_t)groups * wg;
  return kiln_cl_launch_entry(queue, entry, 1, &global, &wg, arg_count, args);
}

kiln_status_t kiln_cl_launch_rows(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                  int64_t rows, int64_t row_len, size_t arg_count, const kiln_cl_arg_t *args) {
  const kiln_cl_kernel_entry_t *entry = NULL;
  kiln_status_t status = kiln_cl_kernel_get(queue->device, program, kernel, &entry);
  if (status != KILN_OK) return status;
  return kiln_cl_launch_rows_entry(queue, entry, rows, row_len, arg_count, args);
}

kiln_status_t kiln_cl_launch_rows_entry(kiln_backend_queue_t *queue, const kiln_cl_kernel_entry_t *entry,
                                        int64_t rows, int64_t row_len, size_t arg_count, const kiln_cl_arg_t *args) {
  size_t wg = pow2_floor(entry_group_limit(queue->device, entry, KILN_CL_REDUCE_WG));
  while (wg > 1 && (int64_t)(wg / 2) >= row_len) wg /= 2;
  int64_t groups = rows < 1 ? 1 : rows;
  if (groups > KILN_CL_MAX_GROUPS) groups = KILN_CL_MAX_GROUPS;
  const size_t global = (size_t)groups * wg;
  return kiln_cl_launch_entry(queue, entry, 1, &global, &wg, arg_count, args);
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
  kiln_kop_t k;
  memset(&k, 0, sizeof k);
  k.kind = KILN_OP_FILL;
  k.out.dtype = KILN_F32;
  k.out.offset = offset;
  k.n = count;
  const kiln_cl_arg_t args[KILN_CL_KOP_ARGS] = {KILN_CL_MEM(mem), KILN_CL_MEM(NULL), KILN_CL_MEM(NULL),
                                                KILN_CL_MEM(NULL), KILN_CL_MEM(NULL), KILN_CL_KOP(&k)};
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_copy, "fill_f32", count, KILN_CL_KOP_ARGS, args);
}

/* ---- the record, and the generic runners ---------------------------------------- */

void kiln_cl_kop_args(const kiln_op_t *op, kiln_kop_t *k, kiln_cl_arg_t args[KILN_CL_KOP_ARGS]) {
  kiln_backend_kop_fill(k, op);
  args[0] = KILN_CL_MEM(kiln_cl_mem_of(&op->out));
  for (int i = 0; i < KILN_KOP_MAX_IN; i++) args[1 + i] = KILN_CL_MEM(i < op->n_in ? kiln_cl_mem_of(&op->in[i]) : NULL);
  args[KILN_CL_KOP_SLOT] = KILN_CL_KOP(k);
}

/* Elements a work-item takes on a FLAT kernel's contiguous path (op.ndim 0):
 * the kernels that read eight elements at a time (explicit float8, which
 * PoCL does not derive through a grid-stride loop: the derivatives, the
 * updates, and the f16/bf16 unary and binary rows) are launched with an
 * eighth of the work-items. Every other kernel takes one. */
static int64_t flat_per_item(const kiln_op_t *op) {
  if (op->kind == KILN_OP_UNARY_BACKWARD || kiln_backend_op_is_update(op->kind)) return 8;
  const bool half = op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16;
  const bool elementwise = op->kind == KILN_OP_UNARY || op->kind == KILN_OP_BINARY || op->kind == KILN_OP_BINARY_SCALAR;
  return half && elementwise ? 8 : 1;
}

/* FLAT: one work-item per element of out (grid-stride), or per
 * flat_per_item elements when every operand is contiguous. */
kiln_status_t kiln_cl_run_flat(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op) {
  const kiln_cl_kernel_entry_t *kernel = NULL;
  kiln_status_t status = kiln_cl_op_kernel(queue->device, op, &kernel);
  if (status != KILN_OK) return status;
  kiln_kop_t k;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &k, args);
  const int64_t per = k.ndim == 0 ? flat_per_item(op) : 1;
  return kiln_cl_launch_flat_entry(queue, kernel, (k.n + per - 1) / per, KILN_CL_KOP_ARGS, args);
}

/* ROWS: one work-group per row of out, a row being its last dimension. */
kiln_status_t kiln_cl_run_rows(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op) {
  const kiln_cl_kernel_entry_t *kernel = NULL;
  kiln_status_t status = kiln_cl_op_kernel(queue->device, op, &kernel);
  if (status != KILN_OK) return status;
  kiln_kop_t k;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &k, args);
  const int64_t row_len = op->out.ndim > 0 ? op->out.shape[op->out.ndim - 1] : k.n;
  const int64_t rows = row_len > 0 ? k.n / row_len : 0;
  return kiln_cl_launch_rows_entry(queue, kernel, rows, row_len, KILN_CL_KOP_ARGS, args);
}

/* ---- f16 and bf16 through an f32 planner --------------------------------------------- */

/* One CAST of `n` contiguous elements from `from` into `to` (views), run as
 * the CAST row's kernel (cast_<from>_<to>: kiln_tensor_cast's rounding). */
static kiln_status_t cast_run(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                              const kiln_view_t *from, const kiln_view_t *to) {
  kiln_op_t c;
  memset(&c, 0, sizeof c);
  c.kind = KILN_OP_CAST;
  c.n_in = 1;
  c.flat = true;
  c.in[0] = *from;
  c.out = *to;
  return kiln_cl_run_flat(ctx, queue, entry, &c);
}

/* `view` (contiguous from its offset) as f32 in scratch `buf`, offset 0. */
static kiln_view_t f32_view(const kiln_view_t *view, kiln_backend_buffer_t *buf) {
  kiln_view_t v = *view;
  v.buffer = buf;
  v.offset = 0;
  v.dtype = KILN_F32;
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; d--) {
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

kiln_status_t kiln_cl_run_via_f32(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op, kiln_cl_planner_fn f32_planner) {
  const kiln_dtype_t half = op->out.dtype;
  kiln_backend_buffer_t bufs[1 + KILN_KOP_MAX_IN];
  memset(bufs, 0, sizeof bufs);
  kiln_op_t op32 = *op;
  kiln_status_t status = KILN_OK;
  /* The inputs of the op's 16-bit dtype widened (exactly); others as they are. */
  for (int i = 0; i < op->n_in && status == KILN_OK; i++) {
    if (op->in[i].dtype != half) continue;
    const int64_t n = kiln_backend_view_numel(&op->in[i]);
    bufs[1 + i].device = queue->device;
    bufs[1 + i].size = (size_t)n * sizeof(float);
    if (n > 0) status = kiln_cl_scratch_create(queue->device, bufs[1 + i].size, &bufs[1 + i].mem);
    op32.in[i] = f32_view(&op->in[i], &bufs[1 + i]);
    if (status == KILN_OK && n > 0) status = cast_run(ctx, queue, entry, &op->in[i], &op32.in[i]);
  }
  const int64_t n_out = kiln_backend_view_numel(&op->out);
  bufs[0].device = queue->device;
  bufs[0].size = (size_t)n_out * sizeof(float);
  if (status == KILN_OK) status = kiln_cl_scratch_create(queue->device, bufs[0].size, &bufs[0].mem);
  op32.out = f32_view(&op->out, &bufs[0]);
  if (status == KILN_OK) status = f32_planner(ctx, queue, entry, &op32);
  /* One rounding, to nearest even, into the op's output. */
  if (status == KILN_OK) status = cast_run(ctx, queue, entry, &op32.out, &op->out);
  /* Released now: OpenCL keeps a buffer until the commands using it end. */
  for (int i = 0; i <= KILN_KOP_MAX_IN; i++) kiln_cl_scratch_release(bufs[i].mem);
  return status;
}

/* ---- planners ------------------------------------------------------------------------ */

/* COPY: the strided walk of a FLAT kind (copy_<T>_<T>). */
kiln_status_t kiln_cl_plan_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                const kiln_op_t *op) {
  return kiln_cl_run_flat(ctx, queue, entry, op);
}

kiln_status_t kiln_cl_plan_reduce(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op) {
  /* outer * inner >= 1 (the result is never empty); len may be 0. */
  const int64_t outer = op->u.reduce.outer, len = op->u.reduce.len, inner = op->u.reduce.inner;
  const kiln_dtype_t dtype = op->in[0].dtype;
  const bool f32 = dtype == KILN_F32 && op->out.dtype == KILN_F32;
  const kiln_reduce_op_t rop = op->u.reduce.op;
  /* f32 sums (and means and norms) have kernels of their own that read eight
   * floats at a time and track no maximum. */
  const bool sum = f32 && (rop == KILN_REDUCE_SUM || rop == KILN_REDUCE_MEAN || rop == KILN_REDUCE_NORM);
  kiln_kop_t k;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &k, args);
  /* The generic kernels of the input's dtype (reduce.cl). */
  struct { char rows[48], parts[48], cols[48]; } names;
  const char *dn = kiln_backend_dtype_name(dtype);
  snprintf(names.rows, sizeof names.rows, "reduce_rows_%s", sum ? "sum_f32" : dn);
  snprintf(names.parts, sizeof names.parts, "reduce_parts_%s", sum ? "sum_f32" : dn);
  snprintf(names.cols, sizeof names.cols, "reduce_cols_%s", dn);
  if (inner > 1 || len == 0) {
    if (sum) /* one work-item per eight columns */
      return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_reduce, "reduce_cols_sum_f32", outer * ((inner + 7) / 8),
                                 KILN_CL_KOP_ARGS, args);
    return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_reduce, names.cols, outer * inner, KILN_CL_KOP_ARGS, args);
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
    /* Per record (kernels/opencl/reduce.cl): index (long), the accumulated
     * value (its ACC: float for f32, f16 and bf16, double for f64, long for
     * the integers and bool) and best (its CT: float, double, int or long). */
    const bool float_acc = dtype == KILN_F32 || dtype == KILN_F16 || dtype == KILN_BF16;
    const size_t acc_size = float_acc ? 4u : 8u, ct_size = dtype == KILN_F64 || dtype == KILN_I64 ? 8u : 4u;
    const size_t record = sizeof(cl_long) + acc_size + ct_size;
    status = kiln_cl_scratch_create(device, (size_t)(outer * chunks) * record, &parts);
    if (status != KILN_OK) return status;
  }
  k.plan.reduce.chunk = chunk;
  k.plan.reduce.chunks = chunks;
  k.plan.reduce.rows = outer * chunks;
  args[2] = KILN_CL_MEM(parts); /* the partial records, in in[1]'s place */
  status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_reduce, names.rows, outer * chunks,
                               sum ? (chunk + 7) / 8 : chunk, KILN_CL_KOP_ARGS, args);
  if (status == KILN_OK && chunks > 1) {
    k.plan.reduce.rows = outer;
    status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_reduce, names.parts, outer, chunks, KILN_CL_KOP_ARGS, args);
  }
  kiln_cl_scratch_release(parts);
  return status;
}

/* Two passes: each row's loss into scratch, then their mean and the report. */
kiln_status_t kiln_cl_plan_cross_entropy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                         const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t rows = op->u.cross_entropy.n, cols = op->u.cross_entropy.c;
  kiln_kop_t k;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &k, args);
  const kiln_cl_arg_t out = args[0], logits = args[1];
  cl_mem work = NULL;
  kiln_status_t status = KILN_OK;
  if (rows > 0) {
    status = kiln_cl_scratch_create(queue->device, (size_t)rows * sizeof(float), &work);
    if (status != KILN_OK) return status;
    args[0] = KILN_CL_MEM(work); /* the row losses, in out's place */
    status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_nn, "xent_rows", rows, cols, KILN_CL_KOP_ARGS, args);
  }
  /* n == 0 still writes the output: NaN, the mean of nothing. */
  if (status == KILN_OK) {
    args[0] = out;
    args[1] = KILN_CL_MEM(work); /* the row losses, in in[0]'s place */
    status = kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_nn, "xent_mean", 1, rows, KILN_CL_KOP_ARGS, args);
  }
  (void)logits;
  kiln_cl_scratch_release(work);
  return status;
}

/* ---- the table ------------------------------------------------------------------------
 * A native row for every kind, expanded from KILN_OP_KINDS by its launch
 * shape: FLAT and ROWS kinds run through the generic runners above, PLAN
 * kinds through kiln_cl_plan_<name> (this file, gemm.c, ops_train.c: a PLAN
 * kind without its planner does not link); then the clblast row of matmul
 * (clblast.c). The core validated every op a row sees (dtypes, shapes,
 * formulas), so no row checks again. */

#define KILN_CL_RUN_FLAT(name) kiln_cl_run_flat
#define KILN_CL_RUN_ROWS(name) kiln_cl_run_rows
#define KILN_CL_RUN_PLAN(name) kiln_cl_plan_##name
#define KILN_CL_NATIVE_ROW_(NAME, name, launch)                                                                 \
  {.kind = KILN_OP_##NAME, .provider = KILN_PROVIDER_NATIVE_NAME, .supports = NULL, .run = KILN_CL_RUN_##launch(name), \
   .impl = NULL},
const kiln_op_entry_t kiln_cl_ops[] = {
    KILN_OP_KINDS(KILN_CL_NATIVE_ROW_)
    {.kind = KILN_OP_MATMUL, .provider = "clblast", .supports = kiln_cl_clblast_supports, .run = kiln_cl_clblast_run,
     .impl = NULL},
    KILN_OP_TABLE_END,
};
#undef KILN_CL_NATIVE_ROW_
