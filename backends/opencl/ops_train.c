/* backends/opencl/ops_train.c: the native rows of the training kinds other than the convolutions' (gemm.c): unary, softmax, cross-entropy and max-pooling gradients, and the fused updates in place. */
#include <string.h>

#include "backends/opencl/ops.h"

/* unary_grad_f32_<NAME> of kernels/opencl/elementwise.cl, by op: every unary
 * op has its derivative in ops.def (the core checks at compile time). */
static const char *const unary_grad_f32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_GRAD_F32(NAME, expr) [KILN_UNARY_##NAME] = "unary_grad_f32_" #NAME,
#include "kernels/ops.def"
};

/* ---- gradients ------------------------------------------------------------------ */

/* dx = dy * f'(x): x and dy walk as the inputs of a binary op (merged
 * dimensions, stride 0 where broadcast, ndim 0 when flat, eight elements a
 * work-item then). */
kiln_status_t kiln_cl_run_unary_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                         const kiln_op_entry_t *entry, const kiln_op_t *op) {
  return kiln_cl_launch_elementwise(queue, KILN_CL_PROGRAM_elementwise, unary_grad_f32[op->u.unary.op], op, 2, NULL,
                                    8);
}

/* One work-group per row, as the forward: a sum over the row, then the
 * row's gradient from it. */
kiln_status_t kiln_cl_run_softmax_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                           const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t rows = op->u.softmax.rows, cols = op->u.softmax.cols;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
      KILN_CL_LONG(op->in[0].offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[1])),
      KILN_CL_LONG(op->in[1].offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_LONG(rows),
      KILN_CL_LONG(cols),
      KILN_CL_INT(op->u.softmax.log ? 1 : 0),
      KILN_CL_INT(kiln_cl_row_runs(queue) ? 1 : 0),
  };
  return kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_nn, "softmax_backward_f32", rows, cols,
                             sizeof args / sizeof args[0], args);
}

/* One work-group per row: the row's softmax written into the result, then
 * the label's one subtracted and the scale applied in place. dloss is read
 * on the device (n_in 3), never brought to the host. */
kiln_status_t kiln_cl_run_cross_entropy_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                 const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t rows = op->u.cross_entropy.n, cols = op->u.cross_entropy.c;
  const bool has_dloss = op->n_in == 3;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
      KILN_CL_LONG(op->in[0].offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[1])),
      KILN_CL_LONG(op->in[1].offset),
      KILN_CL_MEM(has_dloss ? kiln_cl_mem_of(&op->in[2]) : NULL),
      KILN_CL_LONG(has_dloss ? op->in[2].offset : 0),
      KILN_CL_INT(has_dloss ? 1 : 0),
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_LONG(rows),
      KILN_CL_LONG(cols),
      KILN_CL_INT(kiln_cl_row_runs(queue) ? 1 : 0),
  };
  return kiln_cl_launch_rows(queue, KILN_CL_PROGRAM_nn, "xent_backward_f32", rows, cols, sizeof args / sizeof args[0],
                             args);
}

/* Two passes: where each window's maximum is (an index per window, in
 * scratch memory), then a gather per element of dx over the windows covering
 * it, so no two work-items write one place (no atomics, and the same sums in
 * the same order on every device). */
kiln_status_t kiln_cl_run_max_pool2d_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                              const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t planes = op->u.pooling.n * op->u.pooling.c, h = op->u.pooling.h, w = op->u.pooling.w;
  const int64_t p = op->u.pooling.p, q = op->u.pooling.q;
  if (!kiln_cl_fits_i32(h * w) || !kiln_cl_fits_i32(p * q))
    return kiln_cl_error(
        ctx, KILN_OUT_OF_RESOURCES,
        "the native OpenCL max_pool2d_backward takes planes of fewer than 2^31 elements, got %lldx%lld; "
        "split the image",
        (long long)h, (long long)w);
  const kiln_cl_arg_t window[10] = {
      KILN_CL_INT(h),
      KILN_CL_INT(w),
      KILN_CL_INT(p),
      KILN_CL_INT(q),
      KILN_CL_INT(op->u.pooling.window[0]),
      KILN_CL_INT(op->u.pooling.window[1]),
      KILN_CL_INT(op->u.pooling.stride[0]),
      KILN_CL_INT(op->u.pooling.stride[1]),
      KILN_CL_INT(op->u.pooling.pad[0]),
      KILN_CL_INT(op->u.pooling.pad[1]),
  };
  /* Windows that do not overlap: each cell in one window at most. */
  const bool disjoint =
      op->u.pooling.stride[0] >= op->u.pooling.window[0] && op->u.pooling.stride[1] >= op->u.pooling.window[1];
  cl_mem arg = NULL;
  kiln_status_t status = kiln_cl_scratch_create(queue->device, (size_t)(planes * p * q) * sizeof(cl_int), &arg);
  if (status == KILN_OK) {
    kiln_cl_arg_t args[4 + 10] = {
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
        KILN_CL_LONG(op->in[0].offset),
        KILN_CL_MEM(arg),
        KILN_CL_LONG(planes),
    };
    memcpy(args + 4, window, sizeof window);
    status = kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_conv, "max_pool2d_argmax_f32", planes * p * q,
                                 sizeof args / sizeof args[0], args);
  }
  /* The planes in rounds, as some drivers limit the third dimension. */
  for (int64_t first = 0; status == KILN_OK && first < planes; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
    const int64_t count = planes - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? planes - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
    kiln_cl_arg_t args[6 + 10] = {
        KILN_CL_MEM(arg),
        KILN_CL_LONG(first * p * q),
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[1])),
        KILN_CL_LONG((int64_t)op->in[1].offset + first * p * q),
        KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
        KILN_CL_LONG((int64_t)op->out.offset + first * h * w),
    };
    memcpy(args + 6, window, sizeof window);
    status = kiln_cl_launch_tiles(queue, KILN_CL_PROGRAM_conv,
                                  disjoint ? "max_pool2d_backward_disjoint_f32" : "max_pool2d_backward_f32", w, h,
                                  count, sizeof args / sizeof args[0], args);
  }
  kiln_cl_scratch_release(arg);
  return status;
}

/* ---- updates in place --------------------------------------------------------------
 * The core hands them over flat (one contiguous run per operand, no two
 * sharing memory): `out` is the tensor updated, read and written. The
 * kernels take eight floats a work-item (update.cl). */

static int64_t update_items(int64_t n) { return (n + 7) / 8; }

kiln_status_t kiln_cl_run_accumulate(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
      KILN_CL_LONG(op->in[0].offset),
      KILN_CL_LONG(n),
      KILN_CL_FLOAT(op->u.update.alpha),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_update, "accumulate_f32", update_items(n),
                             sizeof args / sizeof args[0], args);
}

kiln_status_t kiln_cl_run_sgd_update(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  const bool has_buf = op->n_in == 2;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
      KILN_CL_LONG(op->in[0].offset),
      KILN_CL_MEM(has_buf ? kiln_cl_mem_of(&op->in[1]) : NULL),
      KILN_CL_LONG(has_buf ? op->in[1].offset : 0),
      KILN_CL_INT(has_buf ? 1 : 0),
      KILN_CL_LONG(n),
      KILN_CL_FLOAT(op->u.update.lr),
      KILN_CL_FLOAT(op->u.update.momentum),
      KILN_CL_FLOAT(op->u.update.dampening),
      KILN_CL_FLOAT(op->u.update.weight_decay),
      KILN_CL_INT(op->u.update.nesterov ? 1 : 0),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_update, "sgd_f32", update_items(n), sizeof args / sizeof args[0],
                             args);
}

kiln_status_t kiln_cl_run_adam_update(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                      const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t n = kiln_backend_view_numel(&op->out);
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(kiln_cl_mem_of(&op->out)),
      KILN_CL_LONG(op->out.offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
      KILN_CL_LONG(op->in[0].offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[1])),
      KILN_CL_LONG(op->in[1].offset),
      KILN_CL_MEM(kiln_cl_mem_of(&op->in[2])),
      KILN_CL_LONG(op->in[2].offset),
      KILN_CL_LONG(n),
      KILN_CL_FLOAT(op->u.update.beta1),
      KILN_CL_FLOAT(op->u.update.beta2),
      KILN_CL_FLOAT(op->u.update.keep1),
      KILN_CL_FLOAT(op->u.update.keep2),
      KILN_CL_FLOAT(op->u.update.eps),
      KILN_CL_FLOAT(op->u.update.weight_decay),
      KILN_CL_FLOAT(op->u.update.step_size),
      KILN_CL_FLOAT(op->u.update.sqrt_bias2),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_update, "adam_f32", update_items(n), sizeof args / sizeof args[0],
                             args);
}
