/* backends/opencl/ops_train.c: the planner of max_pool2d_backward, f16 and bf16 through its f32 kernels (the other training kinds are FLAT or ROWS rows, and the convolutions' gradients are in gemm.c). */
#include "backends/opencl/ops.h"

/* Two passes: where each window's maximum is (an index per window, in
 * scratch memory), then a gather per element of dx over the windows covering
 * it, so no two work-items write one place (no atomics, and the same sums in
 * the same order on every device). */
kiln_status_t kiln_cl_plan_max_pool2d_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                              const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const int64_t planes = op->u.pooling.n * op->u.pooling.c, h = op->u.pooling.h, w = op->u.pooling.w;
  const int64_t p = op->u.pooling.p, q = op->u.pooling.q;
  kiln_dtype_t bad = KILN_F32;
  /* f16 and bf16 through the f32 kernels: widened, the gradient summed in
   * f32, rounded once (cpu:0's rule). */
  if ((op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16) && op->in[0].dtype == op->out.dtype &&
      op->in[1].dtype == op->out.dtype)
    return kiln_cl_run_via_f32(ctx, queue, entry, op, kiln_cl_plan_max_pool2d_backward);
  if (!kiln_backend_op_dtypes_in(op, 1u << KILN_F32, 1u << KILN_F32, &bad))
    return kiln_cl_error(ctx, KILN_UNSUPPORTED,
                         "the OpenCL backend has no max_pool2d_backward kernel for %s yet (opencl:%zu): cast to f32 "
                         "first, or compute it on cpu:0 (kiln_tensor_to)",
                         kiln_backend_dtype_name(bad), queue->device->index);
  if (!kiln_cl_fits_i32(h * w) || !kiln_cl_fits_i32(p * q))
    return kiln_cl_error(
        ctx, KILN_OUT_OF_RESOURCES,
        "the native OpenCL max_pool2d_backward takes planes of fewer than 2^31 elements, got %lldx%lld; "
        "split the image",
        (long long)h, (long long)w);
  /* Windows that do not overlap: each cell in one window at most. */
  const bool disjoint =
      op->u.pooling.stride[0] >= op->u.pooling.window[0] && op->u.pooling.stride[1] >= op->u.pooling.window[1];
  kiln_kop_t rec;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &rec, args);
  const kiln_cl_arg_t dx = args[0];
  cl_mem arg = NULL;
  kiln_status_t status = kiln_cl_scratch_create(queue->device, (size_t)(planes * p * q) * sizeof(cl_int), &arg);
  if (status == KILN_OK) {
    /* x in in[0]'s place, the indices into out's. */
    args[0] = KILN_CL_MEM(arg);
    rec.plan.round.in_off = (int64_t)op->in[0].offset;
    rec.plan.round.out_off = 0;
    status = kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_conv, "max_pool2d_argmax_f32", planes * p * q,
                                 KILN_CL_KOP_ARGS, args);
  }
  /* The indices in in[0]'s place, dy in in[1]'s (its own), dx in out's. */
  args[0] = dx;
  args[1] = KILN_CL_MEM(arg);
  /* The planes in rounds, as some drivers limit the third dimension. */
  for (int64_t first = 0; status == KILN_OK && first < planes; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
    const int64_t count = planes - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? planes - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
    rec.plan.round.in_off = first * p * q;
    rec.plan.round.aux_off = (int64_t)op->in[1].offset + first * p * q;
    rec.plan.round.out_off = (int64_t)op->out.offset + first * h * w;
    rec.plan.round.images = count;
    rec.plan.round.first = first;
    status = kiln_cl_launch_tiles(queue, KILN_CL_PROGRAM_conv,
                                  disjoint ? "max_pool2d_backward_disjoint_f32" : "max_pool2d_backward_f32", w, h,
                                  count, KILN_CL_KOP_ARGS, args);
  }
  kiln_cl_scratch_release(arg);
  return status;
}
