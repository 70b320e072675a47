/* backends/opencl/ops.h: what the files of the OpenCL op table share: every row's run function, the launch helpers and the GEMM. */
#ifndef KILN_BACKENDS_OPENCL_OPS_H
#define KILN_BACKENDS_OPENCL_OPS_H

/*
 * The native rows come from KILN_OP_KINDS: a FLAT kind runs through
 * kiln_cl_run_flat and a ROWS kind through kiln_cl_run_rows (ops.c), each
 * filling the op's record (kiln_cl_kop_args), looking its kernel up by name
 * (kiln_cl_op_kernel) and launching it; nothing per kind. A PLAN kind runs
 * kiln_cl_plan_<name>, which writes only `plan` in a copy of the record:
 *   ops.c        the table, the runners, the launch helpers below; copy,
 *                reduce and cross_entropy
 *   gemm.c       the GEMM (packed and tiled), matmul, and the convolutions
 *                built on it: conv2d and its two backward kinds
 *   ops_train.c  max_pool2d_backward
 */

#include "backends/opencl/opencl_backend.h"

/* Must match kernels/opencl/prelude.cl and gemm.cl. */
#define KILN_CL_REDUCE_WG 256
#define KILN_CL_GEMM_RM 8
#define KILN_CL_GEMM_RN 16
#define KILN_CL_GEMM_TILE 64

/* Work-groups a grid-stride kernel is given at most: beyond, work-items loop. */
#define KILN_CL_MAX_GROUPS 65536
/* Batches per launch at most (some drivers limit the third global dimension). */
#define KILN_CL_MAX_BATCH_PER_LAUNCH 65535
/* Scratch for packed GEMM panels or im2col columns, per round of batches:
 * at most this, and on CPUs a quarter of the last-level cache but at least
 * the minimum (gemm.c, scratch_budget). */
#define KILN_CL_SCRATCH_BUDGET ((size_t)256 << 20)
#define KILN_CL_SCRATCH_MIN_CPU ((size_t)1 << 20)

/* ---- the rows' run functions ------------------------------------------------------ */

/* The generic runners of FLAT and ROWS kinds. */
kiln_status_t kiln_cl_run_flat(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op);
kiln_status_t kiln_cl_run_rows(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                               const kiln_op_t *op);

/* The planners, kiln_cl_plan_<name> for each PLAN kind. */
#define KILN_CL_PLAN_DECL_FLAT(name)
#define KILN_CL_PLAN_DECL_ROWS(name)
#define KILN_CL_PLAN_DECL_PLAN(name)                                                          \
  kiln_status_t kiln_cl_plan_##name(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, \
                                    const kiln_op_entry_t *entry, const kiln_op_t *op);
#define KILN_CL_PLAN_DECL_(NAME, name, launch) KILN_CL_PLAN_DECL_##launch(name)
KILN_OP_KINDS(KILN_CL_PLAN_DECL_)
#undef KILN_CL_PLAN_DECL_

/* An op of f16 or bf16 through its f32 planner (the CPU's via_f32 on the
 * device): each input of the op's dtype cast into f32 scratch, the planner
 * run on the f32 op, the result cast back (one rounding, to nearest even).
 * For the kinds whose kernels are f32 only (the convolution's and
 * max_pool2d's gradients); inputs contiguous from their offsets. */
typedef kiln_status_t (*kiln_cl_planner_fn)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                            const kiln_op_entry_t *entry, const kiln_op_t *op);
kiln_status_t kiln_cl_run_via_f32(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op, kiln_cl_planner_fn f32_planner);

/* The one helper that turns an op into a kernel's arguments: fills `k`
 * (kiln_backend_kop_fill; OpenCL leaves `addr` 0, buffers being arguments)
 * and args[0..5]: the buffers of out, in[0], in[1], in[2], in[3] (NULL past
 * n_in) and the record. A planner then writes k->plan and may put scratch
 * buffers in the argument places its kernels read them from. */
#define KILN_CL_KOP_ARGS (2 + KILN_KOP_MAX_IN)
#define KILN_CL_KOP_SLOT (1 + KILN_KOP_MAX_IN) /* the record's place */
void kiln_cl_kop_args(const kiln_op_t *op, kiln_kop_t *k, kiln_cl_arg_t args[KILN_CL_KOP_ARGS]);

/* ---- launches (ops.c) ---------------------------------------------------------------- */

static inline cl_mem kiln_cl_mem_of(const kiln_view_t *view) { return view->buffer ? view->buffer->mem : NULL; }

static inline bool kiln_cl_fits_i32(int64_t v) { return v >= 0 && v <= 2147483647; }

/* The largest work-group `kernel` may run with on the queue's device along
 * dimension 0, capped at `cap`. */
kiln_status_t kiln_cl_group_limit(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                  size_t cap, size_t *out_limit);

/* A 1-D grid-stride kernel over n items (KILN_FOR_EACH); _entry for a
 * kernel already looked up. */
kiln_status_t kiln_cl_launch_flat(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel, int64_t n,
                                  size_t arg_count, const kiln_cl_arg_t *args);
kiln_status_t kiln_cl_launch_flat_entry(kiln_backend_queue_t *queue, const kiln_cl_kernel_entry_t *entry, int64_t n,
                                        size_t arg_count, const kiln_cl_arg_t *args);

/* A kernel with one work-group per row (a power of two wide, no wider than
 * the row needs), over `rows` rows with group-stride. */
kiln_status_t kiln_cl_launch_rows_entry(kiln_backend_queue_t *queue, const kiln_cl_kernel_entry_t *entry,
                                        int64_t rows, int64_t row_len, size_t arg_count, const kiln_cl_arg_t *args);
kiln_status_t kiln_cl_launch_rows(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                  int64_t rows, int64_t row_len, size_t arg_count, const kiln_cl_arg_t *args);

/* A kernel over (columns, rows, batches) with work-items along columns: one
 * work-group row of up to 256 work-items, rounded up (the kernel checks). */
kiln_status_t kiln_cl_launch_planes(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                    int64_t cols, int64_t rows, int64_t batches, size_t arg_count,
                                    const kiln_cl_arg_t *args);

/* The same range with work-groups that also span rows (up to 256
 * work-items in all): for kernels over short rows, as a CPU driver (PoCL)
 * pays for every work-group. Both global sizes are rounded up: the kernel
 * checks its column and its row. */
kiln_status_t kiln_cl_launch_tiles(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                                   int64_t cols, int64_t rows, int64_t batches, size_t arg_count,
                                   const kiln_cl_arg_t *args);


/* Release scratch memory right after the work that uses it was enqueued:
 * OpenCL deletes a released buffer only once the commands that use it have
 * finished. */
static inline void kiln_cl_scratch_release(cl_mem mem) {
  if (mem) clReleaseMemObject(mem);
}

/* Zeros into `count` floats of `mem` from element `offset` (fill_f32). */
kiln_status_t kiln_cl_zero_f32(kiln_backend_queue_t *queue, cl_mem mem, int64_t offset, int64_t count);

/* ---- the GEMM (gemm.c) ------------------------------------------------------------ */

/* One GEMM on buffers: C[b] = op(A[b]) @ op(B[b]) for b < batch, as
 * k->plan.gemm says (the conventions of kiln_op_t's matmul: row-major,
 * offsets a_off, b_off, c_off and strides in elements, a stride of 0
 * broadcasts, trans_a and trans_b 0 or 1); k is otherwise the op's record
 * (kiln_backend_kop_fill), which gemm.cl's kernels take with C in out's
 * place, A in in[0]'s and B in in[1]'s. */
kiln_status_t kiln_cl_gemm_run(kiln_backend_queue_t *queue, const kiln_kop_t *k, cl_mem c, cl_mem a, cl_mem b);

/* Batches per round for `per_batch` bytes of scratch each, within the
 * scratch budget (and half the device's largest allocation). */
int64_t kiln_cl_round_of(const kiln_backend_device_t *device, size_t per_batch, int64_t batches);

#endif /* KILN_BACKENDS_OPENCL_OPS_H */
