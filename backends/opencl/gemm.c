/* backends/opencl/gemm.c: the native GEMM (packed panels on CPUs, local-memory tiles on GPUs), matmul, and the convolutions built on it: conv2d and its gradients with respect to the input and the weights; matmul and conv2d in f64, f16 and bf16 through gemm_dtypes.cl. */
#include <stdio.h>
#include <string.h>

#include "backends/opencl/ops.h"

/* ---- GEMM ------------------------------------------------------------------------- */

/* Whether the local-memory tiled kernel suits the device: a GPU (dedicated
 * local memory) that runs 16 x 16 work-groups of it (or any device that can,
 * when a test forces the path). */
static bool gemm_use_tiled(kiln_backend_queue_t *queue) {
  kiln_backend_device_t *device = queue->device;
  const int forced = atomic_load_explicit(&device->ctx->gemm_path, memory_order_relaxed);
  if (forced == 1) return false;
  if (forced != 2 && (device->is_cpu || device->local_mem_is_global)) return false;
  if (device->max_work_item_sizes[0] < 16 || device->max_work_item_sizes[1] < 16) return false;
  if (device->local_mem_size < 2u * 16u * (KILN_CL_GEMM_TILE + 1) * sizeof(float)) return false;
  size_t limit = 0;
  if (kiln_cl_group_limit(queue, KILN_CL_PROGRAM_gemm, "gemm_tiled", 256, &limit) != KILN_OK) return false;
  return limit >= 256;
}

/* The arguments of a GEMM kernel: what it writes (C, or a panel) in out's
 * place, A (or A's panel) in in[0]'s, B (or B's panel) in in[1]'s, then the
 * record, whose plan.gemm is the GEMM. */
static void gemm_args(kiln_cl_arg_t args[KILN_CL_KOP_ARGS], cl_mem out, cl_mem a, cl_mem b, const kiln_kop_t *k) {
  args[0] = KILN_CL_MEM(out);
  args[1] = KILN_CL_MEM(a);
  args[2] = KILN_CL_MEM(b);
  args[3] = KILN_CL_MEM(NULL);
  args[4] = KILN_CL_MEM(NULL);
  args[KILN_CL_KOP_SLOT] = KILN_CL_KOP(k);
}

static kiln_status_t gemm_tiled(kiln_backend_queue_t *queue, const kiln_kop_t *k, cl_mem c, cl_mem a, cl_mem b) {
  kiln_kop_t r = *k;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  gemm_args(args, c, a, b, &r);
  const int64_t batch = k->plan.gemm.batch, m = k->plan.gemm.m, n = k->plan.gemm.n;
  kiln_status_t status = KILN_OK;
  for (int64_t first = 0; status == KILN_OK && first < batch; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
    const int64_t count = batch - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? batch - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
    r.plan.gemm.a_off = k->plan.gemm.a_off + first * k->plan.gemm.stride_a;
    r.plan.gemm.b_off = k->plan.gemm.b_off + first * k->plan.gemm.stride_b;
    r.plan.gemm.c_off = k->plan.gemm.c_off + first * k->plan.gemm.stride_c;
    const size_t global[3] = {(size_t)((n + KILN_CL_GEMM_TILE - 1) / KILN_CL_GEMM_TILE) * 16,
                              (size_t)((m + KILN_CL_GEMM_TILE - 1) / KILN_CL_GEMM_TILE) * 16, (size_t)count};
    const size_t local[3] = {16, 16, 1};
    status = kiln_cl_launch(queue, KILN_CL_PROGRAM_gemm, "gemm_tiled", 3, global, local, KILN_CL_KOP_ARGS, args);
  }
  return status;
}

/* Pack `count` batches of one operand (gemm_pack_a: A from plan.gemm.a_off,
 * `rows` = m rounded up to RM; gemm_pack_b: B from b_off, n rounded up to
 * RN) into `dst`. */
static kiln_status_t gemm_pack(kiln_backend_queue_t *queue, const char *kernel, const kiln_kop_t *k, cl_mem src,
                               cl_mem dst, int64_t rows, int64_t count) {
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  gemm_args(args, dst, src, src, k);
  return kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_gemm, kernel, rows, k->plan.gemm.k, count, KILN_CL_KOP_ARGS,
                               args);
}

/* The work-group of gemm_packed: two column blocks by up to sixteen row blocks
 * (measured best on PoCL), within the kernel's and the device's limits. */
static kiln_status_t gemm_packed_local(kiln_backend_queue_t *queue, const char *kernel, size_t *out_lx,
                                       size_t *out_ly) {
  size_t limit = 1;
  kiln_status_t status = kiln_cl_group_limit(queue, KILN_CL_PROGRAM_gemm, kernel, 32, &limit);
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

/* The product of packed panels for `count` batches from `first` (C offset
 * by first * stride_c here); ap_batch and bp_batch are the panels' batch
 * strides, ap_batch 0 when every batch shares one A. */
static kiln_status_t gemm_packed_compute_as(kiln_backend_queue_t *queue, const char *kernel, const kiln_kop_t *k,
                                            cl_mem c, cl_mem pa, cl_mem pb, int64_t first, int64_t count,
                                            int64_t ap_batch, int64_t bp_batch) {
  const int64_t mb = (k->plan.gemm.m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM,
                nb = (k->plan.gemm.n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  size_t lx = 1, ly = 1;
  kiln_status_t status = gemm_packed_local(queue, kernel, &lx, &ly);
  if (status != KILN_OK) return status;
  kiln_kop_t r = *k;
  r.plan.gemm.a_off = 0;
  r.plan.gemm.b_off = 0;
  r.plan.gemm.c_off = k->plan.gemm.c_off + first * k->plan.gemm.stride_c;
  r.plan.gemm.stride_a = ap_batch;
  r.plan.gemm.stride_b = bp_batch;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  gemm_args(args, c, pa, pb, &r);
  const size_t global[3] = {((size_t)nb + lx - 1) / lx * lx, ((size_t)mb + ly - 1) / ly * ly, (size_t)count};
  const size_t local[3] = {lx, ly, 1};
  return kiln_cl_launch(queue, KILN_CL_PROGRAM_gemm, kernel, 3, global, local, KILN_CL_KOP_ARGS, args);
}

static kiln_status_t gemm_packed_compute(kiln_backend_queue_t *queue, const kiln_kop_t *k, cl_mem c, cl_mem pa,
                                         cl_mem pb, int64_t first, int64_t count, int64_t ap_batch,
                                         int64_t bp_batch) {
  return gemm_packed_compute_as(queue, "gemm_packed", k, c, pa, pb, first, count, ap_batch, bp_batch);
}

/* Scratch bytes one round of packed panels or columns may take. Where
 * local memory is global (CPUs), a quarter of the last-level cache (at least
 * 1 MiB): the next kernel of the round (the GEMM after im2col, col2im after
 * the GEMM) then reads what the last one wrote while it is still cached, and
 * at N32 C64 56x56 3x3 rounds of 8 MiB ran conv2d and both its gradients
 * 1.5 to 2 times faster than rounds of 256 MiB on PoCL. GPUs take large
 * rounds (parallelism, and memory fast enough for the columns). */
static size_t scratch_budget(const kiln_backend_device_t *device) {
  const size_t set = atomic_load_explicit(&device->ctx->scratch_budget, memory_order_relaxed);
  size_t budget = KILN_CL_SCRATCH_BUDGET;
  if (set) {
    budget = set;
  } else if ((device->is_cpu || device->local_mem_is_global) && device->cache_size) {
    budget =
        device->cache_size / 4 > KILN_CL_SCRATCH_MIN_CPU ? (size_t)(device->cache_size / 4) : KILN_CL_SCRATCH_MIN_CPU;
    if (budget > KILN_CL_SCRATCH_BUDGET) budget = KILN_CL_SCRATCH_BUDGET;
  }
  if (device->max_alloc && device->max_alloc / 2 < budget) budget = (size_t)(device->max_alloc / 2);
  return budget;
}

/* Batches per round for `per_batch` scratch bytes each. */
int64_t kiln_cl_round_of(const kiln_backend_device_t *device, size_t per_batch, int64_t batches) {
  int64_t round = per_batch ? (int64_t)(scratch_budget(device) / per_batch) : batches;
  if (round < 1) round = 1;
  if (round > batches) round = batches;
  if (round > KILN_CL_MAX_BATCH_PER_LAUNCH) round = KILN_CL_MAX_BATCH_PER_LAUNCH;
  return round;
}

/* The packed product with operands and C stored as `suffix` says: "" f32,
 * "_f16" or "_bf16" (widened into the f32 panels, C rounded once). */
static kiln_status_t gemm_packed(kiln_backend_queue_t *queue, const kiln_kop_t *k, cl_mem c, cl_mem a, cl_mem b,
                                 const char *suffix) {
  char pack_a[32], pack_b[32], packed[32];
  snprintf(pack_a, sizeof pack_a, "gemm_pack_a%s", suffix);
  snprintf(pack_b, sizeof pack_b, "gemm_pack_b%s", suffix);
  snprintf(packed, sizeof packed, "gemm_packed%s", suffix);
  kiln_backend_device_t *device = queue->device;
  const int64_t batch = k->plan.gemm.batch, depth = k->plan.gemm.k;
  const int64_t stride_a = k->plan.gemm.stride_a, stride_b = k->plan.gemm.stride_b;
  const int64_t mb = (k->plan.gemm.m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM,
                nb = (k->plan.gemm.n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  const int64_t a_elems = mb * KILN_CL_GEMM_RM * depth, b_elems = nb * KILN_CL_GEMM_RN * depth;
  const bool shared_a = stride_a == 0; /* every batch multiplies the same A: pack it once */
  const int64_t round = kiln_cl_round_of(device, (size_t)(b_elems + (shared_a ? 0 : a_elems)) * sizeof(float), batch);
  cl_mem pa = NULL, pb = NULL;
  kiln_status_t status = KILN_OK;
  if (depth > 0) {
    status = kiln_cl_scratch_create(device, (size_t)(a_elems * (shared_a ? 1 : round)) * sizeof(float), &pa);
    if (status == KILN_OK) status = kiln_cl_scratch_create(device, (size_t)(b_elems * round) * sizeof(float), &pb);
  }
  kiln_kop_t r = *k;
  for (int64_t first = 0; status == KILN_OK && first < batch; first += round) {
    const int64_t count = batch - first < round ? batch - first : round;
    if (depth > 0) {
      r.plan.gemm.a_off = k->plan.gemm.a_off + first * stride_a;
      r.plan.gemm.b_off = k->plan.gemm.b_off + first * stride_b;
      if (!shared_a || first == 0)
        status = gemm_pack(queue, pack_a, &r, a, pa, mb * KILN_CL_GEMM_RM, shared_a ? 1 : count);
      if (status == KILN_OK) status = gemm_pack(queue, pack_b, &r, b, pb, nb * KILN_CL_GEMM_RN, count);
      if (status != KILN_OK) break;
    }
    status = gemm_packed_compute_as(queue, packed, k, c, pa, pb, first, count, shared_a ? 0 : a_elems, b_elems);
  }
  kiln_cl_scratch_release(pa);
  kiln_cl_scratch_release(pb);
  return status;
}

kiln_status_t kiln_cl_gemm_run(kiln_backend_queue_t *queue, const kiln_kop_t *k, cl_mem c, cl_mem a, cl_mem b) {
  const int64_t m = k->plan.gemm.m, n = k->plan.gemm.n, depth = k->plan.gemm.k;
  if (m == 0 || n == 0 || k->plan.gemm.batch == 0) return KILN_OK;
  if (!kiln_cl_fits_i32(m) || !kiln_cl_fits_i32(n) || !kiln_cl_fits_i32(depth) ||
      !kiln_cl_fits_i32((m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM * KILN_CL_GEMM_RM) ||
      !kiln_cl_fits_i32((n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN * KILN_CL_GEMM_RN))
    return kiln_cl_error(queue->device->ctx, KILN_OUT_OF_RESOURCES,
                         "the native OpenCL matmul takes m, n, k below 2^31, got m=%lld n=%lld k=%lld; split the "
                         "product",
                         (long long)m, (long long)n, (long long)depth);
  return gemm_use_tiled(queue) ? gemm_tiled(queue, k, c, a, b) : gemm_packed(queue, k, c, a, b, "");
}

/* The gradients of the convolution have f32 kernels only: another dtype is
 * refused, never run through them. */
static kiln_status_t need_f32(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  for (int i = 0; i < op->n_in; i++)
    if (op->in[i].dtype != KILN_F32 || op->out.dtype != KILN_F32)
      return kiln_cl_error(ctx, KILN_UNSUPPORTED,
                           "the OpenCL backend has no %s kernels for %s yet (opencl:%zu): compute it on cpu:0 "
                           "(kiln_tensor_to) or cast to f32",
                           kiln_backend_op_kind_name(op->kind),
                           kiln_backend_dtype_name(op->in[i].dtype != KILN_F32 ? op->in[i].dtype : op->out.dtype),
                           queue->device->index);
  return KILN_OK;
}

/* True when the op and every input are f16, or every one bf16: the
 * gradients' planners then run through their f32 selves
 * (kiln_cl_run_via_f32). */
static bool same_half(const kiln_op_t *op) {
  if (op->out.dtype != KILN_F16 && op->out.dtype != KILN_BF16) return false;
  for (int i = 0; i < op->n_in; i++)
    if (op->in[i].dtype != op->out.dtype) return false;
  return true;
}

/* ---- MATMUL and CONV2D in f64, f16 and bf16 ------------------------------------------
 * gemm_dtypes.cl's direct kernels, one source instantiated per dtype
 * (f16/bf16 widened to f32, summed in f32, rounded once to nearest even;
 * f64 in double where the device has cl_khr_fp64). The clblast row declines
 * these dtypes (kiln calls CLBlastSgemm only, and CLBlast's Hgemm would sum
 * in half where the device has cl_khr_fp16, which PoCL lacks), so matmul of
 * them always runs here. */

/* The kernel `<kind>_<dtype>_<dtype>` for the op's dtype, or the refusal:
 * f64 on a device without cl_khr_fp64 (its reason names the device and the
 * extension, as every f64 op's), a dtype without kernels. */
static kiln_status_t dtype_kernel(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op,
                                  char *name, size_t size) {
  const kiln_dtype_t dtype = op->out.dtype;
  const kiln_backend_device_t *device = queue->device;
  if (dtype == KILN_F64 && !device->fp64)
    return kiln_cl_error(ctx, KILN_UNSUPPORTED, "%s in f64: %s", kiln_backend_op_kind_name(op->kind),
                         device->fp64_why);
  bool same = dtype == KILN_F64 || dtype == KILN_F16 || dtype == KILN_BF16;
  for (int i = 0; i < op->n_in; i++) same = same && op->in[i].dtype == dtype;
  if (!same) return need_f32(ctx, queue, op); /* its message names the dtype */
  snprintf(name, size, "%s_%s_%s", kiln_backend_op_kind_name(op->kind), kiln_backend_dtype_name(dtype),
           kiln_backend_dtype_name(dtype));
  return KILN_OK;
}

/* The product, at most KILN_CL_MAX_BATCH_PER_LAUNCH batches a launch. */
static kiln_status_t matmul_dtypes(kiln_backend_queue_t *queue, const kiln_kop_t *k, const char *kernel, cl_mem c,
                                   cl_mem a, cl_mem b) {
  const int64_t batch = k->plan.gemm.batch, m = k->plan.gemm.m, n = k->plan.gemm.n;
  if (m == 0 || n == 0 || batch == 0) return KILN_OK;
  kiln_kop_t r = *k;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  gemm_args(args, c, a, b, &r);
  kiln_status_t status = KILN_OK;
  for (int64_t first = 0; status == KILN_OK && first < batch; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
    const int64_t count = batch - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? batch - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
    r.plan.gemm.a_off = k->plan.gemm.a_off + first * k->plan.gemm.stride_a;
    r.plan.gemm.b_off = k->plan.gemm.b_off + first * k->plan.gemm.stride_b;
    r.plan.gemm.c_off = k->plan.gemm.c_off + first * k->plan.gemm.stride_c;
    status = kiln_cl_launch_tiles(queue, KILN_CL_PROGRAM_gemm_dtypes, kernel, n, m, count, KILN_CL_KOP_ARGS, args);
  }
  return status;
}

kiln_status_t kiln_cl_plan_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op) {
  kiln_kop_t k;
  kiln_backend_kop_fill(&k, op); /* buffers: passed below, OpenCL records hold no addresses */
  kiln_backend_kop_plan_matmul(&k);
  if (op->out.dtype != KILN_F32 || op->in[0].dtype != KILN_F32 || op->in[1].dtype != KILN_F32) {
    char kernel[48];
    kiln_status_t status = dtype_kernel(ctx, queue, op, kernel, sizeof kernel);
    if (status != KILN_OK) return status;
    /* f16 and bf16 on the packed path where f32 takes it (CPUs): the
     * packers widen into the f32 panels and the product rounds each sum
     * once as it stores it, the direct kernel's bits (both sum each element
     * in order of k in f32) at the packed kernel's speed. */
    if ((op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16) && !gemm_use_tiled(queue) &&
        kiln_cl_fits_i32(k.plan.gemm.m + KILN_CL_GEMM_RM) && kiln_cl_fits_i32(k.plan.gemm.n + KILN_CL_GEMM_RN) &&
        kiln_cl_fits_i32(k.plan.gemm.k)) {
      if (k.plan.gemm.m == 0 || k.plan.gemm.n == 0 || k.plan.gemm.batch == 0) return KILN_OK;
      return gemm_packed(queue, &k, kiln_cl_mem_of(&op->out), kiln_cl_mem_of(&op->in[0]), kiln_cl_mem_of(&op->in[1]),
                         op->out.dtype == KILN_F16 ? "_f16" : "_bf16");
    }
    return matmul_dtypes(queue, &k, kernel, kiln_cl_mem_of(&op->out), kiln_cl_mem_of(&op->in[0]),
                         kiln_cl_mem_of(&op->in[1]));
  }
  return kiln_cl_gemm_run(queue, &k, kiln_cl_mem_of(&op->out), kiln_cl_mem_of(&op->in[0]),
                          kiln_cl_mem_of(&op->in[1]));
}

/* ---- convolution ----------------------------------------------------------------------
 * Per image, with columns[c*r*s, p*q] the im2col of x (x itself for a 1x1
 * convolution of stride 1 without padding):
 *   conv2d                  y[k, pq]     = W[k, crs] @ columns
 *   conv2d_backward_input   dcols[crs, pq] = W^T @ dy[k, pq], then dx = col2im(dcols)
 *   conv2d_backward_weight  dW[k, crs]  += dy[k, pq] @ columns^T
 * each over rounds of images whose scratch fits the budget. */

/* The depth of one slice of conv2d_backward_weight's packed GEMM, in
 * positions (about: whole images are sliced). */
#define KILN_CL_CONV_DEPTH 4096

/* A copy of the op's record for a GEMM, plan.gemm cleared for the caller. */
static kiln_kop_t conv_gemm_of(const kiln_kop_t *rec) {
  kiln_kop_t g = *rec;
  memset(&g.plan, 0, sizeof g.plan);
  return g;
}

/* Whether the convolution is a plain GEMM over each image: 1x1, stride 1,
 * no padding (dilation then changes nothing). */
static bool conv_pointwise(const kiln_op_t *op) {
  return op->u.conv2d.r == 1 && op->u.conv2d.s == 1 && op->u.conv2d.stride[0] == 1 && op->u.conv2d.stride[1] == 1 &&
         op->u.conv2d.pad[0] == 0 && op->u.conv2d.pad[1] == 0;
}

/* The limits of the kernels' int arithmetic: KILN_OUT_OF_RESOURCES beyond. */
static kiln_status_t conv_check_sizes(kiln_backend_context_t *ctx, const kiln_op_t *op) {
  const int64_t c = op->u.conv2d.c, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  const int64_t chw = c * op->u.conv2d.h * op->u.conv2d.w, k = op->u.conv2d.k;
  const int64_t pq_padded = (pq + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN * KILN_CL_GEMM_RN;
  const int64_t crs_padded = (crs + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN * KILN_CL_GEMM_RN;
  if (kiln_cl_fits_i32(crs_padded) && kiln_cl_fits_i32(pq_padded) && kiln_cl_fits_i32(k) && kiln_cl_fits_i32(chw))
    return KILN_OK;
  return kiln_cl_error(ctx, KILN_OUT_OF_RESOURCES,
                       "the native OpenCL %s needs c*r*s, p*q, k and c*h*w below 2^31, got %lld, %lld, %lld, %lld; "
                       "split the batch or the channels",
                       kiln_backend_op_kind_name(op->kind), (long long)crs, (long long)pq, (long long)k,
                       (long long)chw);
}

/* conv.cl's kernels take the op's record with plan.round set and scratch in
 * operand places (what a kernel writes in out's, what it reads in in[0]'s,
 * a second input in in[1]'s): `rec` is the op's record filled by
 * kiln_cl_kop_args, `args` its arguments with the record last. */

kiln_status_t kiln_cl_plan_conv2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op) {
  bool f32 = op->out.dtype == KILN_F32;
  for (int i = 0; i < op->n_in; i++) f32 = f32 && op->in[i].dtype == KILN_F32;
  if (!f32) {
    /* The direct kernel of the dtype over every output (N*K*P*Q of them). */
    char kernel[48];
    kiln_status_t status = dtype_kernel(ctx, queue, op, kernel, sizeof kernel);
    if (status != KILN_OK) return status;
    kiln_kop_t rec;
    kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
    kiln_cl_kop_args(op, &rec, args);
    const int64_t outputs = op->u.conv2d.n * op->u.conv2d.k * op->u.conv2d.p * op->u.conv2d.q;
    return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_gemm_dtypes, kernel, outputs, KILN_CL_KOP_ARGS, args);
  }
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, r = op->u.conv2d.r, s = op->u.conv2d.s, p = op->u.conv2d.p, q = op->u.conv2d.q;
  const int64_t crs = c * r * s, pq = p * q;
  const int64_t nb = (pq + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  kiln_status_t status = conv_check_sizes(ctx, op);
  if (status != KILN_OK) return status;
  kiln_kop_t rec;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &rec, args);
  const cl_mem x = kiln_cl_mem_of(&op->in[0]), wt = kiln_cl_mem_of(&op->in[1]), y = kiln_cl_mem_of(&op->out);
  const int64_t x_off = (int64_t)op->in[0].offset, y_off = (int64_t)op->out.offset;
  /* Per image: Y[k, pq] = W[k, crs] @ columns[crs, pq]. */
  kiln_kop_t g = conv_gemm_of(&rec);
  g.plan.gemm.a_off = (int64_t)op->in[1].offset;
  g.plan.gemm.c_off = y_off;
  g.plan.gemm.m = k;
  g.plan.gemm.n = pq;
  g.plan.gemm.k = crs;
  g.plan.gemm.lda = crs;
  g.plan.gemm.ldb = pq;
  g.plan.gemm.ldc = pq;
  g.plan.gemm.stride_a = 0;
  g.plan.gemm.stride_b = crs * pq;
  g.plan.gemm.stride_c = k * pq;
  const bool pointwise = conv_pointwise(op);
  const bool packed = !gemm_use_tiled(queue);
  if (pointwise || crs == 0) {
    /* A 1x1 convolution is already a GEMM over each image: no columns (and
     * no channels is a GEMM with k = 0: zeros). */
    g.plan.gemm.b_off = x_off;
    g.plan.gemm.batch = n;
    status = kiln_cl_gemm_run(queue, &g, y, wt, x);
  } else {
    /* Columns for a round of images, in the packed GEMM's layout for B when
     * that is the GEMM that runs (no packing pass of B then). */
    const char *kernel = packed ? "im2col_packed_f32" : "im2col_f32";
    const int64_t cols_per_image = packed ? nb * KILN_CL_GEMM_RN : pq;
    const size_t per_image = (size_t)crs * (size_t)cols_per_image * sizeof(float);
    const int64_t step = kiln_cl_round_of(device, per_image, n);
    const int64_t mb = (k + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM;
    cl_mem cols = NULL, pa = NULL;
    status = kiln_cl_scratch_create(device, per_image * (size_t)step, &cols);
    if (status == KILN_OK && packed) {
      status = kiln_cl_scratch_create(device, (size_t)(mb * KILN_CL_GEMM_RM * crs) * sizeof(float), &pa);
      if (status == KILN_OK) status = gemm_pack(queue, "gemm_pack_a", &g, wt, pa, mb * KILN_CL_GEMM_RM, 1);
    }
    kiln_cl_arg_t cargs[KILN_CL_KOP_ARGS];
    memcpy(cargs, args, sizeof cargs);
    cargs[0] = KILN_CL_MEM(cols); /* x stays in in[0]'s place */
    for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
      const int64_t count = n - first < step ? n - first : step;
      rec.plan.round.in_off = x_off + first * c * h * w;
      rec.plan.round.out_off = 0;
      rec.plan.round.images = count;
      rec.plan.round.first = first;
      /* Work-items along q, p rows (one more for the packed layout's zero
       * columns past p*q, fewer than RN of them), a plane per (image, row). */
      const int64_t across = packed && q < KILN_CL_GEMM_RN ? KILN_CL_GEMM_RN : q;
      status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, kernel, across, packed ? p + 1 : p, count * crs,
                                     KILN_CL_KOP_ARGS, cargs);
      if (status != KILN_OK) break;
      if (packed) {
        /* gemm_packed_compute offsets C by first * stride_c itself. */
        status = gemm_packed_compute(queue, &g, y, pa, cols, first, count, 0, crs * cols_per_image);
      } else {
        kiln_kop_t gi = g;
        gi.plan.gemm.b_off = 0;
        gi.plan.gemm.c_off = y_off + first * k * pq;
        gi.plan.gemm.batch = count;
        status = kiln_cl_gemm_run(queue, &gi, y, wt, cols);
      }
    }
    kiln_cl_scratch_release(cols);
    kiln_cl_scratch_release(pa);
  }
  if (status == KILN_OK && op->u.conv2d.has_bias) {
    kiln_cl_arg_t bargs[KILN_CL_KOP_ARGS];
    memcpy(bargs, args, sizeof bargs);
    bargs[2] = args[3]; /* the bias, in in[1]'s place */
    rec.plan.round.aux_off = (int64_t)op->in[2].offset;
    /* The batch dimension in rounds, as some drivers limit the third one. */
    for (int64_t first = 0; status == KILN_OK && first < n; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
      const int64_t count = n - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? n - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
      rec.plan.round.out_off = y_off + first * k * pq;
      rec.plan.round.images = count;
      rec.plan.round.first = first;
      status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, "bias_nchw_f32", pq, k, count, KILN_CL_KOP_ARGS,
                                     bargs);
    }
  }
  return status;
}

kiln_status_t kiln_cl_plan_conv2d_backward_input(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                 const kiln_op_entry_t *entry, const kiln_op_t *op) {
  if (same_half(op)) return kiln_cl_run_via_f32(ctx, queue, entry, op, kiln_cl_plan_conv2d_backward_input);
  if (need_f32(ctx, queue, op) != KILN_OK) return KILN_UNSUPPORTED;
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  const cl_mem dx = kiln_cl_mem_of(&op->out), dy = kiln_cl_mem_of(&op->in[0]), wt = kiln_cl_mem_of(&op->in[1]);
  const int64_t dx_off = (int64_t)op->out.offset;
  /* No filters: nothing flows back (dy is empty). */
  if (k == 0) return kiln_cl_zero_f32(queue, dx, dx_off, n * c * h * w);
  kiln_status_t status = conv_check_sizes(ctx, op);
  if (status != KILN_OK) return status;
  kiln_kop_t rec;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &rec, args);
  /* Per image: dcols[crs, pq] = W^T @ dy[k, pq], W^T read transposed from
   * W[k, crs] (packed once per GEMM on the packed path). */
  kiln_kop_t g = conv_gemm_of(&rec);
  g.plan.gemm.a_off = (int64_t)op->in[1].offset;
  g.plan.gemm.b_off = (int64_t)op->in[0].offset;
  g.plan.gemm.m = crs;
  g.plan.gemm.n = pq;
  g.plan.gemm.k = k;
  g.plan.gemm.trans_a = 1;
  g.plan.gemm.lda = crs;
  g.plan.gemm.ldb = pq;
  g.plan.gemm.ldc = pq;
  g.plan.gemm.stride_a = 0;
  g.plan.gemm.stride_b = k * pq;
  g.plan.gemm.stride_c = crs * pq;
  if (conv_pointwise(op)) {
    /* dcols is dx itself. */
    g.plan.gemm.c_off = dx_off;
    g.plan.gemm.batch = n;
    return kiln_cl_gemm_run(queue, &g, dx, wt, dy);
  }
  const size_t per_image = (size_t)crs * (size_t)pq * sizeof(float);
  const int64_t step = kiln_cl_round_of(device, per_image, n);
  cl_mem cols = NULL;
  status = kiln_cl_scratch_create(device, per_image * (size_t)step, &cols);
  args[1] = KILN_CL_MEM(cols); /* col2im reads the columns in in[0]'s place, writes dx in out's */
  for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
    const int64_t count = n - first < step ? n - first : step;
    kiln_kop_t gi = g;
    gi.plan.gemm.b_off = g.plan.gemm.b_off + first * k * pq;
    gi.plan.gemm.c_off = 0;
    gi.plan.gemm.batch = count;
    status = kiln_cl_gemm_run(queue, &gi, cols, wt, dy);
    if (status != KILN_OK) break;
    rec.plan.round.in_off = 0;
    rec.plan.round.out_off = dx_off + first * c * h * w;
    rec.plan.round.images = count;
    rec.plan.round.first = first;
    status = kiln_cl_launch_tiles(queue, KILN_CL_PROGRAM_conv, "col2im_f32", w, h, count * c, KILN_CL_KOP_ARGS, args);
  }
  kiln_cl_scratch_release(cols);
  return status;
}

/* dW += the `count` parts[count][k][crs] of a round, summed in order (the
 * round from image `first`: the first round writes, the later ones add). */
static kiln_status_t conv_sum_parts(kiln_backend_queue_t *queue, const kiln_kop_t *rec, cl_mem parts, cl_mem dw,
                                    int64_t dw_off, int64_t count, int64_t first) {
  kiln_kop_t r = *rec;
  r.plan.round.in_off = 0;
  r.plan.round.out_off = dw_off;
  r.plan.round.images = count;
  r.plan.round.first = first;
  const kiln_cl_arg_t args[KILN_CL_KOP_ARGS] = {KILN_CL_MEM(dw), KILN_CL_MEM(parts), KILN_CL_MEM(NULL),
                                                KILN_CL_MEM(NULL), KILN_CL_MEM(NULL), KILN_CL_KOP(&r)};
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_conv, "sum_batches_f32",
                             rec->u.conv2d.k * rec->u.conv2d.c * rec->u.conv2d.r * rec->u.conv2d.s, KILN_CL_KOP_ARGS,
                             args);
}

/* The packed path (CPUs): one GEMM per slice of images whose depth is every
 * position of the slice's images, its operands written straight in the
 * packed layouts (im2col_packed_t_f32, pack_dy_f32), so the GEMM sums over
 * the images itself; as many slices per round as it takes to give the
 * device enough blocks of dW at once, their parts then summed. */
static kiln_status_t conv_backward_weight_packed(kiln_backend_queue_t *queue, const kiln_op_t *op) {
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  const int64_t mb = (k + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM, nbj = (crs + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  const cl_mem dw = kiln_cl_mem_of(&op->out);
  const int64_t dw_off = (int64_t)op->out.offset;
  /* Per image: its positions in both packed operands. */
  const size_t per_image = (size_t)pq * (size_t)(mb * KILN_CL_GEMM_RM + nbj * KILN_CL_GEMM_RN) * sizeof(float);
  int64_t step = kiln_cl_round_of(device, per_image, n);
  /* The GEMM's depth (a slice's positions) is an int in gemm.cl. */
  if (step * pq > INT32_MAX) step = INT32_MAX / pq;
  /* Slices: enough blocks of dW for four per compute unit, and a depth of
   * about KILN_CL_CONV_DEPTH positions each, so that a panel of the
   * operands (that many rows of RN floats) stays cached while the blocks
   * sharing it run. */
  const int64_t target = 4 * (int64_t)(device->compute_units ? device->compute_units : 1);
  int64_t slices = (target + mb * nbj - 1) / (mb * nbj);
  const int64_t by_depth = (step * pq + KILN_CL_CONV_DEPTH - 1) / KILN_CL_CONV_DEPTH;
  if (slices < by_depth) slices = by_depth;
  if (slices > step) slices = step;
  const int64_t per = (step + slices - 1) / slices;
  slices = (step + per - 1) / per;
  /* A single GEMM over every image writes dW itself; otherwise its parts
   * (one per slice) are summed into dW, round after round. */
  const bool one_gemm = slices == 1 && step >= n;
  kiln_kop_t rec;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &rec, args);
  const kiln_cl_arg_t x = args[1], dy = args[2];
  cl_mem pa = NULL, pb = NULL, parts = NULL;
  kiln_status_t status =
      kiln_cl_scratch_create(device, (size_t)(slices * per * pq * mb * KILN_CL_GEMM_RM) * sizeof(float), &pa);
  if (status == KILN_OK)
    status = kiln_cl_scratch_create(device, (size_t)(slices * per * pq * nbj * KILN_CL_GEMM_RN) * sizeof(float), &pb);
  if (status == KILN_OK && !one_gemm)
    status = kiln_cl_scratch_create(device, (size_t)(slices * k * crs) * sizeof(float), &parts);
  for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
    const int64_t count = n - first < step ? n - first : step;
    const int64_t round_per = (count + slices - 1) / slices, round_slices = (count + round_per - 1) / round_per;
    const int64_t depth = round_per * pq;
    rec.plan.round.out_off = 0;
    rec.plan.round.images = count;
    rec.plan.round.first = first;
    rec.plan.round.per = round_per;
    /* The transposed columns of x into pb. */
    args[0] = KILN_CL_MEM(pb);
    args[1] = x;
    rec.plan.round.in_off = (int64_t)op->in[0].offset + first * c * h * w;
    status = kiln_cl_launch_tiles(queue, KILN_CL_PROGRAM_conv, "im2col_packed_t_f32", op->u.conv2d.q, op->u.conv2d.p,
                                  round_slices * round_per * nbj, KILN_CL_KOP_ARGS, args);
    if (status != KILN_OK) break;
    /* dy into pa, read in in[0]'s place. */
    args[0] = KILN_CL_MEM(pa);
    args[1] = dy;
    rec.plan.round.in_off = (int64_t)op->in[1].offset + first * k * pq;
    status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, "pack_dy_f32", pq, 1, round_slices * round_per * mb,
                                   KILN_CL_KOP_ARGS, args);
    if (status != KILN_OK) break;
    kiln_kop_t g = conv_gemm_of(&rec);
    g.plan.gemm.c_off = one_gemm ? dw_off : 0;
    g.plan.gemm.m = k;
    g.plan.gemm.n = crs;
    g.plan.gemm.k = depth;
    g.plan.gemm.ldc = crs;
    g.plan.gemm.stride_c = k * crs;
    status = gemm_packed_compute(queue, &g, one_gemm ? dw : parts, pa, pb, 0, round_slices,
                                 mb * KILN_CL_GEMM_RM * depth, nbj * KILN_CL_GEMM_RN * depth);
    if (status == KILN_OK && !one_gemm) status = conv_sum_parts(queue, &rec, parts, dw, dw_off, round_slices, first);
  }
  kiln_cl_scratch_release(pa);
  kiln_cl_scratch_release(pb);
  kiln_cl_scratch_release(parts);
  return status;
}

kiln_status_t kiln_cl_plan_conv2d_backward_weight(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                  const kiln_op_entry_t *entry, const kiln_op_t *op) {
  if (same_half(op)) return kiln_cl_run_via_f32(ctx, queue, entry, op, kiln_cl_plan_conv2d_backward_weight);
  if (need_f32(ctx, queue, op) != KILN_OK) return KILN_UNSUPPORTED;
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  const cl_mem x = kiln_cl_mem_of(&op->in[0]), dy = kiln_cl_mem_of(&op->in[1]), dw = kiln_cl_mem_of(&op->out);
  const int64_t x_off = (int64_t)op->in[0].offset, dw_off = (int64_t)op->out.offset;
  /* No images: the sum over them is zeros. */
  if (n == 0) return kiln_cl_zero_f32(queue, dw, dw_off, k * crs);
  kiln_status_t status = conv_check_sizes(ctx, op);
  if (status != KILN_OK) return status;
  if (!gemm_use_tiled(queue)) return conv_backward_weight_packed(queue, op);
  kiln_kop_t rec;
  kiln_cl_arg_t args[KILN_CL_KOP_ARGS];
  kiln_cl_kop_args(op, &rec, args);
  /* The tiled path (GPUs): per image, part[k, crs] = dy[k, pq] @
   * columns^T (columns[crs, pq] read transposed, x itself for a pointwise
   * convolution), a batch of them per round, summed into dW in image order. */
  const bool pointwise = conv_pointwise(op);
  kiln_kop_t g = conv_gemm_of(&rec);
  g.plan.gemm.a_off = (int64_t)op->in[1].offset;
  g.plan.gemm.m = k;
  g.plan.gemm.n = crs;
  g.plan.gemm.k = pq;
  g.plan.gemm.trans_b = 1;
  g.plan.gemm.lda = pq;
  g.plan.gemm.ldb = pq;
  g.plan.gemm.ldc = crs;
  g.plan.gemm.stride_a = k * pq;
  g.plan.gemm.stride_b = crs * pq;
  g.plan.gemm.stride_c = k * crs;
  const size_t part_bytes = (size_t)k * (size_t)crs * sizeof(float);
  const size_t per_image = part_bytes + (pointwise ? 0 : (size_t)crs * (size_t)pq * sizeof(float));
  const int64_t step = kiln_cl_round_of(device, per_image, n);
  cl_mem cols = NULL, parts = NULL;
  status = kiln_cl_scratch_create(device, part_bytes * (size_t)step, &parts);
  if (status == KILN_OK && !pointwise)
    status = kiln_cl_scratch_create(device, (size_t)crs * (size_t)pq * sizeof(float) * (size_t)step, &cols);
  args[0] = KILN_CL_MEM(cols); /* im2col writes the columns in out's place, reads x in in[0]'s */
  for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
    const int64_t count = n - first < step ? n - first : step;
    kiln_kop_t gi = g;
    gi.plan.gemm.a_off = g.plan.gemm.a_off + first * k * pq;
    gi.plan.gemm.c_off = 0;
    gi.plan.gemm.batch = count;
    cl_mem b = x;
    if (pointwise) {
      gi.plan.gemm.b_off = x_off + first * c * h * w;
    } else {
      rec.plan.round.in_off = x_off + first * c * h * w;
      rec.plan.round.out_off = 0;
      rec.plan.round.images = count;
      rec.plan.round.first = first;
      status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, "im2col_f32", op->u.conv2d.q, op->u.conv2d.p,
                                     count * crs, KILN_CL_KOP_ARGS, args);
      b = cols;
      gi.plan.gemm.b_off = 0;
    }
    if (status == KILN_OK) status = kiln_cl_gemm_run(queue, &gi, parts, dy, b);
    if (status == KILN_OK) status = conv_sum_parts(queue, &rec, parts, dw, dw_off, count, first);
  }
  kiln_cl_scratch_release(cols);
  kiln_cl_scratch_release(parts);
  return status;
}
