/* backends/opencl/gemm.c: the native GEMM (packed panels on CPUs, local-memory tiles on GPUs), matmul, and the convolutions built on it: conv2d and its gradients with respect to the input and the weights. */
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

static kiln_status_t gemm_tiled(kiln_backend_queue_t *queue, const kiln_cl_gemm_t *g) {
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
    status =
        kiln_cl_launch(queue, KILN_CL_PROGRAM_gemm, "gemm_tiled", 3, global, local, sizeof args / sizeof args[0], args);
  }
  return status;
}

/* Pack `count` batches of one operand (gemm_pack_a or gemm_pack_b) into `dst`. */
static kiln_status_t gemm_pack(kiln_backend_queue_t *queue, const char *kernel, cl_mem src, int64_t src_off, cl_mem dst,
                               int64_t rows, int64_t k, int64_t ld, bool trans, int64_t stride, int64_t blocks,
                               int64_t block_rows, int64_t count) {
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(src), KILN_CL_LONG(src_off),      KILN_CL_MEM(dst),     KILN_CL_INT(rows),   KILN_CL_INT(k),
      KILN_CL_LONG(ld), KILN_CL_INT(trans ? 1 : 0), KILN_CL_LONG(stride), KILN_CL_INT(blocks),
  };
  return kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_gemm, kernel, blocks * block_rows, k, count,
                               sizeof args / sizeof args[0], args);
}

/* The work-group of gemm_packed: two column blocks by up to sixteen row blocks
 * (measured best on PoCL), within the kernel's and the device's limits. */
static kiln_status_t gemm_packed_local(kiln_backend_queue_t *queue, size_t *out_lx, size_t *out_ly) {
  size_t limit = 1;
  kiln_status_t status = kiln_cl_group_limit(queue, KILN_CL_PROGRAM_gemm, "gemm_packed", 32, &limit);
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
static kiln_status_t gemm_packed_compute(kiln_backend_queue_t *queue, const kiln_cl_gemm_t *g, cl_mem pa, cl_mem pb,
                                         int64_t first, int64_t count, int64_t ap_batch, int64_t bp_batch) {
  const int64_t mb = (g->m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM,
                nb = (g->n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  size_t lx = 1, ly = 1;
  kiln_status_t status = gemm_packed_local(queue, &lx, &ly);
  if (status != KILN_OK) return status;
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(pa),           KILN_CL_MEM(pb),   KILN_CL_MEM(g->c), KILN_CL_LONG(g->c_off + first * g->stride_c),
      KILN_CL_INT(g->m),         KILN_CL_INT(g->n), KILN_CL_INT(g->k), KILN_CL_LONG(g->ldc),
      KILN_CL_LONG(g->stride_c), KILN_CL_INT(mb),   KILN_CL_INT(nb),   KILN_CL_LONG(ap_batch),
      KILN_CL_LONG(bp_batch),
  };
  const size_t global[3] = {((size_t)nb + lx - 1) / lx * lx, ((size_t)mb + ly - 1) / ly * ly, (size_t)count};
  const size_t local[3] = {lx, ly, 1};
  return kiln_cl_launch(queue, KILN_CL_PROGRAM_gemm, "gemm_packed", 3, global, local, sizeof args / sizeof args[0],
                        args);
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

static kiln_status_t gemm_packed(kiln_backend_queue_t *queue, const kiln_cl_gemm_t *g) {
  kiln_backend_device_t *device = queue->device;
  const int64_t mb = (g->m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM,
                nb = (g->n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  const int64_t a_elems = mb * KILN_CL_GEMM_RM * g->k, b_elems = nb * KILN_CL_GEMM_RN * g->k;
  const bool shared_a = g->stride_a == 0; /* every batch multiplies the same A: pack it once */
  const int64_t round =
      kiln_cl_round_of(device, (size_t)(b_elems + (shared_a ? 0 : a_elems)) * sizeof(float), g->batch);
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
  kiln_cl_scratch_release(pa);
  kiln_cl_scratch_release(pb);
  return status;
}

kiln_status_t kiln_cl_gemm_run(kiln_backend_queue_t *queue, const kiln_cl_gemm_t *g) {
  if (g->m == 0 || g->n == 0 || g->batch == 0) return KILN_OK;
  if (!kiln_cl_fits_i32(g->m) || !kiln_cl_fits_i32(g->n) || !kiln_cl_fits_i32(g->k) ||
      !kiln_cl_fits_i32((g->m + KILN_CL_GEMM_RM - 1) / KILN_CL_GEMM_RM * KILN_CL_GEMM_RM) ||
      !kiln_cl_fits_i32((g->n + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN * KILN_CL_GEMM_RN))
    return kiln_cl_error(queue->device->ctx, KILN_OUT_OF_RESOURCES,
                         "the native OpenCL matmul takes m, n, k below 2^31, got m=%lld n=%lld k=%lld; split the "
                         "product",
                         (long long)g->m, (long long)g->n, (long long)g->k);
  return gemm_use_tiled(queue) ? gemm_tiled(queue, g) : gemm_packed(queue, g);
}

kiln_status_t kiln_cl_plan_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                 const kiln_op_t *op) {
  kiln_cl_gemm_t g = {
      .a = kiln_cl_mem_of(&op->in[0]),
      .b = kiln_cl_mem_of(&op->in[1]),
      .c = kiln_cl_mem_of(&op->out),
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
  return kiln_cl_gemm_run(queue, &g);
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

/* The sizes every conv.cl kernel of a convolution takes after its buffers:
 * c, h, w, r, s, p, q, then stride, padding and dilation (h, w each). */
#define KILN_CL_CONV_GEOMETRY_ARGS 13
static void conv_geometry_args(const kiln_op_t *op, kiln_cl_arg_t *args) {
  const int64_t sizes[7] = {op->u.conv2d.c, op->u.conv2d.h, op->u.conv2d.w, op->u.conv2d.r,
                            op->u.conv2d.s, op->u.conv2d.p, op->u.conv2d.q};
  for (int i = 0; i < 7; i++) args[i] = KILN_CL_INT(sizes[i]);
  for (int i = 0; i < 2; i++) {
    args[7 + i] = KILN_CL_INT(op->u.conv2d.stride[i]);
    args[9 + i] = KILN_CL_INT(op->u.conv2d.pad[i]);
    args[11 + i] = KILN_CL_INT(op->u.conv2d.dil[i]);
  }
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

kiln_status_t kiln_cl_plan_conv2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                                 const kiln_op_t *op) {
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, r = op->u.conv2d.r, s = op->u.conv2d.s, p = op->u.conv2d.p, q = op->u.conv2d.q;
  const int64_t crs = c * r * s, pq = p * q;
  const int64_t nb = (pq + KILN_CL_GEMM_RN - 1) / KILN_CL_GEMM_RN;
  kiln_status_t status = conv_check_sizes(ctx, op);
  if (status != KILN_OK) return status;
  const cl_mem x = kiln_cl_mem_of(&op->in[0]), y = kiln_cl_mem_of(&op->out);
  const int64_t x_off = (int64_t)op->in[0].offset, y_off = (int64_t)op->out.offset;
  /* Per image: Y[k, pq] = W[k, crs] @ columns[crs, pq]. */
  kiln_cl_gemm_t g = {
      .a = kiln_cl_mem_of(&op->in[1]),
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
  const bool pointwise = conv_pointwise(op);
  const bool packed = !gemm_use_tiled(queue);
  if (pointwise || crs == 0) {
    /* A 1x1 convolution is already a GEMM over each image: no columns (and
     * no channels is a GEMM with k = 0: zeros). */
    g.b = x;
    g.b_off = x_off;
    g.batch = n;
    status = kiln_cl_gemm_run(queue, &g);
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
      if (status == KILN_OK)
        status = gemm_pack(queue, "gemm_pack_a", g.a, g.a_off, pa, k, crs, crs, false, 0, mb, KILN_CL_GEMM_RM, 1);
    }
    for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
      const int64_t count = n - first < step ? n - first : step;
      kiln_cl_arg_t args[3 + KILN_CL_CONV_GEOMETRY_ARGS] = {
          KILN_CL_MEM(x),
          KILN_CL_LONG(x_off + first * c * h * w),
          KILN_CL_MEM(cols),
      };
      conv_geometry_args(op, args + 3);
      /* Work-items along q, p rows (one more for the packed layout's zero
       * columns past p*q, fewer than RN of them), a plane per (image, row). */
      const int64_t across = packed && q < KILN_CL_GEMM_RN ? KILN_CL_GEMM_RN : q;
      status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, kernel, across, packed ? p + 1 : p, count * crs,
                                     sizeof args / sizeof args[0], args);
      if (status != KILN_OK) break;
      if (packed) {
        /* gemm_packed_compute offsets C by first * stride_c itself. */
        status = gemm_packed_compute(queue, &g, pa, cols, first, count, 0, crs * cols_per_image);
      } else {
        kiln_cl_gemm_t gi = g;
        gi.b = cols;
        gi.b_off = 0;
        gi.c_off = y_off + first * k * pq;
        gi.batch = count;
        status = kiln_cl_gemm_run(queue, &gi);
      }
    }
    kiln_cl_scratch_release(cols);
    kiln_cl_scratch_release(pa);
  }
  if (status == KILN_OK && op->u.conv2d.has_bias) {
    /* The batch dimension in rounds, as some drivers limit the third one. */
    for (int64_t first = 0; status == KILN_OK && first < n; first += KILN_CL_MAX_BATCH_PER_LAUNCH) {
      const int64_t count = n - first < KILN_CL_MAX_BATCH_PER_LAUNCH ? n - first : KILN_CL_MAX_BATCH_PER_LAUNCH;
      const kiln_cl_arg_t bargs[] = {
          KILN_CL_MEM(y),
          KILN_CL_LONG(y_off + first * k * pq),
          KILN_CL_MEM(kiln_cl_mem_of(&op->in[2])),
          KILN_CL_LONG(op->in[2].offset),
          KILN_CL_INT(k),
          KILN_CL_INT(pq),
      };
      status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, "bias_nchw_f32", pq, k, count,
                                     sizeof bargs / sizeof bargs[0], bargs);
    }
  }
  return status;
}

kiln_status_t kiln_cl_plan_conv2d_backward_input(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                const kiln_op_entry_t *entry, const kiln_op_t *op) {
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  const cl_mem dx = kiln_cl_mem_of(&op->out);
  const int64_t dx_off = (int64_t)op->out.offset;
  /* No filters: nothing flows back (dy is empty). */
  if (k == 0) return kiln_cl_zero_f32(queue, dx, dx_off, n * c * h * w);
  kiln_status_t status = conv_check_sizes(ctx, op);
  if (status != KILN_OK) return status;
  /* Per image: dcols[crs, pq] = W^T @ dy[k, pq], W^T read transposed from
   * W[k, crs] (packed once per GEMM on the packed path). */
  kiln_cl_gemm_t g = {
      .a = kiln_cl_mem_of(&op->in[1]),
      .a_off = (int64_t)op->in[1].offset,
      .b = kiln_cl_mem_of(&op->in[0]),
      .b_off = (int64_t)op->in[0].offset,
      .m = crs,
      .n = pq,
      .k = k,
      .trans_a = true,
      .lda = crs,
      .ldb = pq,
      .ldc = pq,
      .stride_a = 0,
      .stride_b = k * pq,
      .stride_c = crs * pq,
  };
  if (conv_pointwise(op)) {
    /* dcols is dx itself. */
    g.c = dx;
    g.c_off = dx_off;
    g.batch = n;
    return kiln_cl_gemm_run(queue, &g);
  }
  const size_t per_image = (size_t)crs * (size_t)pq * sizeof(float);
  const int64_t step = kiln_cl_round_of(device, per_image, n);
  cl_mem cols = NULL;
  status = kiln_cl_scratch_create(device, per_image * (size_t)step, &cols);
  for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
    const int64_t count = n - first < step ? n - first : step;
    kiln_cl_gemm_t gi = g;
    gi.b_off = g.b_off + first * k * pq;
    gi.c = cols;
    gi.c_off = 0;
    gi.batch = count;
    status = kiln_cl_gemm_run(queue, &gi);
    if (status != KILN_OK) break;
    kiln_cl_arg_t args[3 + KILN_CL_CONV_GEOMETRY_ARGS] = {
        KILN_CL_MEM(cols),
        KILN_CL_MEM(dx),
        KILN_CL_LONG(dx_off + first * c * h * w),
    };
    conv_geometry_args(op, args + 3);
    status = kiln_cl_launch_tiles(queue, KILN_CL_PROGRAM_conv, "col2im_f32", w, h, count * c,
                                  sizeof args / sizeof args[0], args);
  }
  kiln_cl_scratch_release(cols);
  return status;
}

/* dW += the parts[count][k][crs] of a round, summed in order (the first
 * round writes, the later ones add). */
static kiln_status_t conv_sum_parts(kiln_backend_queue_t *queue, cl_mem parts, int64_t len, int64_t count, cl_mem dw,
                                    int64_t dw_off, bool accumulate) {
  const kiln_cl_arg_t args[] = {
      KILN_CL_MEM(parts), KILN_CL_LONG(len),    KILN_CL_INT(count),
      KILN_CL_MEM(dw),    KILN_CL_LONG(dw_off), KILN_CL_INT(accumulate ? 1 : 0),
  };
  return kiln_cl_launch_flat(queue, KILN_CL_PROGRAM_conv, "sum_batches_f32", len, sizeof args / sizeof args[0], args);
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
    kiln_cl_arg_t args[5 + KILN_CL_CONV_GEOMETRY_ARGS] = {
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[0])),
        KILN_CL_LONG((int64_t)op->in[0].offset + first * c * h * w),
        KILN_CL_MEM(pb),
        KILN_CL_INT(count),
        KILN_CL_INT(round_per),
    };
    conv_geometry_args(op, args + 5);
    status = kiln_cl_launch_tiles(queue, KILN_CL_PROGRAM_conv, "im2col_packed_t_f32", op->u.conv2d.q, op->u.conv2d.p,
                                  round_slices * round_per * nbj, sizeof args / sizeof args[0], args);
    if (status != KILN_OK) break;
    const kiln_cl_arg_t dargs[] = {
        KILN_CL_MEM(kiln_cl_mem_of(&op->in[1])),
        KILN_CL_LONG((int64_t)op->in[1].offset + first * k * pq),
        KILN_CL_MEM(pa),
        KILN_CL_INT(count),
        KILN_CL_INT(round_per),
        KILN_CL_INT(k),
        KILN_CL_INT(pq),
    };
    status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, "pack_dy_f32", pq, 1, round_slices * round_per * mb,
                                   sizeof dargs / sizeof dargs[0], dargs);
    if (status != KILN_OK) break;
    const kiln_cl_gemm_t g = {
        .c = one_gemm ? dw : parts,
        .c_off = one_gemm ? dw_off : 0,
        .m = k,
        .n = crs,
        .k = depth,
        .ldc = crs,
        .stride_c = k * crs,
    };
    status = gemm_packed_compute(queue, &g, pa, pb, 0, round_slices, mb * KILN_CL_GEMM_RM * depth,
                                 nbj * KILN_CL_GEMM_RN * depth);
    if (status == KILN_OK && !one_gemm)
      status = conv_sum_parts(queue, parts, k * crs, round_slices, dw, dw_off, first > 0);
  }
  kiln_cl_scratch_release(pa);
  kiln_cl_scratch_release(pb);
  kiln_cl_scratch_release(parts);
  return status;
}

kiln_status_t kiln_cl_plan_conv2d_backward_weight(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                 const kiln_op_entry_t *entry, const kiln_op_t *op) {
  kiln_backend_device_t *device = queue->device;
  const int64_t n = op->u.conv2d.n, c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t k = op->u.conv2d.k, crs = c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  const cl_mem x = kiln_cl_mem_of(&op->in[0]), dw = kiln_cl_mem_of(&op->out);
  const int64_t x_off = (int64_t)op->in[0].offset, dw_off = (int64_t)op->out.offset;
  /* No images: the sum over them is zeros. */
  if (n == 0) return kiln_cl_zero_f32(queue, dw, dw_off, k * crs);
  kiln_status_t status = conv_check_sizes(ctx, op);
  if (status != KILN_OK) return status;
  if (!gemm_use_tiled(queue)) return conv_backward_weight_packed(queue, op);
  /* The tiled path (GPUs): per image, part[k, crs] = dy[k, pq] @
   * columns^T (columns[crs, pq] read transposed, x itself for a pointwise
   * convolution), a batch of them per round, summed into dW in image order. */
  const bool pointwise = conv_pointwise(op);
  kiln_cl_gemm_t g = {
      .a = kiln_cl_mem_of(&op->in[1]),
      .a_off = (int64_t)op->in[1].offset,
      .m = k,
      .n = crs,
      .k = pq,
      .trans_b = true,
      .lda = pq,
      .ldb = pq,
      .ldc = crs,
      .stride_a = k * pq,
      .stride_b = crs * pq,
      .stride_c = k * crs,
  };
  const size_t part_bytes = (size_t)k * (size_t)crs * sizeof(float);
  const size_t per_image = part_bytes + (pointwise ? 0 : (size_t)crs * (size_t)pq * sizeof(float));
  const int64_t step = kiln_cl_round_of(device, per_image, n);
  cl_mem cols = NULL, parts = NULL;
  status = kiln_cl_scratch_create(device, part_bytes * (size_t)step, &parts);
  if (status == KILN_OK && !pointwise)
    status = kiln_cl_scratch_create(device, (size_t)crs * (size_t)pq * sizeof(float) * (size_t)step, &cols);
  for (int64_t first = 0; status == KILN_OK && first < n; first += step) {
    const int64_t count = n - first < step ? n - first : step;
    kiln_cl_gemm_t gi = g;
    gi.a_off = g.a_off + first * k * pq;
    gi.c = parts;
    gi.c_off = 0;
    gi.batch = count;
    if (pointwise) {
      gi.b = x;
      gi.b_off = x_off + first * c * h * w;
    } else {
      kiln_cl_arg_t args[3 + KILN_CL_CONV_GEOMETRY_ARGS] = {
          KILN_CL_MEM(x),
          KILN_CL_LONG(x_off + first * c * h * w),
          KILN_CL_MEM(cols),
      };
      conv_geometry_args(op, args + 3);
      status = kiln_cl_launch_planes(queue, KILN_CL_PROGRAM_conv, "im2col_f32", op->u.conv2d.q, op->u.conv2d.p,
                                     count * crs, sizeof args / sizeof args[0], args);
      gi.b = cols;
      gi.b_off = 0;
    }
    if (status == KILN_OK) status = kiln_cl_gemm_run(queue, &gi);
    if (status == KILN_OK) status = conv_sum_parts(queue, parts, k * crs, count, dw, dw_off, first > 0);
  }
  kiln_cl_scratch_release(cols);
  kiln_cl_scratch_release(parts);
  return status;
}
