/* kernels/opencl/gemm.cl: SGEMM, C = op(A) @ op(B) per batch, row-major: a register-blocked kernel on packed panels (also for f16/bf16 storage, f32 sums), and a local-memory tiled kernel for GPUs. */
/*
 * The packed path (any device; the choice on CPUs and the fallback elsewhere):
 *   gemm_pack_a  op(A) -> [batch][m/RM][k][RM], rows past m zero
 *   gemm_pack_b  op(B) -> [batch][n/RN][k][RN], columns past n zero
 *   gemm_packed  one work-item per RM x RN block of C: each step of k is one
 *                contiguous RN-wide load of B and RM broadcasts of A, all in
 *                registers, so the compiler keeps the block in vector registers
 *                (PoCL on AVX2 / AVX-512 CPUs, where local memory is plain
 *                memory and tiling in it buys nothing).
 * Packing turns every transpose, offset and edge into the same inner loop and
 * costs O(mk + kn) against the product's O(mnk).
 *
 * The tiled path (GPUs with dedicated local memory): gemm_tiled reads A and B
 * in TILE x TK slabs into local memory, each of the 16 x 16 work-items
 * computing a 4 x 4 block; any size, transposes and offsets, edges zero-filled.
 * It must be launched with a 16 x 16 work-group.
 *
 * k == 0 writes zeros (the loops do not run).
 *
 * Every kernel takes KILN_CL_KERNEL's parameters and reads the GEMM from
 * op.plan.gemm (m, n, k, lda, ldb, ldc, strides, batch, transposes, element
 * offsets: never the operands' own offsets, as the planners put other
 * buffers in their places): C in out's place, A in in[0]'s and B in in[1]'s;
 * gemm_pack_a/b write their panel into out's place, and gemm_packed reads
 * the panels from in[0]'s and in[1]'s with stride_a and stride_b the
 * panels' batch strides (stride_a 0: every batch shares one A).
 */

#define KILN_GEMM_RM 8
#define KILN_GEMM_RN 16

/* Element (i, l) of op(A) and (l, j) of op(B). */
#define KILN_GEMM_A(a, i, l) (trans_a ? (a)[(long)(l) * lda + (i)] : (a)[(long)(i) * lda + (l)])
#define KILN_GEMM_B(b, l, j) (trans_b ? (b)[(long)(j) * ldb + (l)] : (b)[(long)(l) * ldb + (j)])

/* The packed path is written once and instantiated per storage type: f32
 * (gemm_pack_a, gemm_pack_b, gemm_packed) and f16 / bf16 (the same names
 * with _f16 / _bf16): the 16-bit packers widen each element exactly into
 * the f32 panel, and the 16-bit gemm_packed rounds each sum once to nearest
 * even as it stores it (KILN_CL_FROM_F32_<d>: the CPU's bits for the same
 * f32 sum). The sums are f32 whatever the storage. */
#define KILN_GEMM_LOAD_f32(x) (x)
#define KILN_GEMM_LOAD_f16(x) KILN_CL_TO_F32_f16(x)
#define KILN_GEMM_LOAD_bf16(x) KILN_CL_TO_F32_bf16(x)

/* Global (rows rounded up to the work-group size, k, batches): work-item
 * (i, l, batch) writes element (i, l) of op(A) to its packed place (zero past
 * m), so neighbouring work-items write neighbouring floats. */
#define KILN_GEMM_PACK_A(name, ST, LOAD)                                                           \
  KILN_CL_KERNEL(name) {                                                                           \
    __global const ST *a = (__global const ST *)in0_;                                              \
    __global float *out = (__global float *)out_;                                                  \
    const long a_off = op.plan.gemm.a_off, lda = op.plan.gemm.lda, stride_a = op.plan.gemm.stride_a; \
    const int m = (int)op.plan.gemm.m, k = (int)op.plan.gemm.k, trans_a = op.plan.gemm.trans_a;     \
    const int mb = (m + KILN_GEMM_RM - 1) / KILN_GEMM_RM;                                          \
    const int i = (int)get_global_id(0), l = (int)get_global_id(1);                                \
    const long batch = (long)get_global_id(2);                                                     \
    if (i >= mb * KILN_GEMM_RM) return;                                                            \
    __global const ST *ab = a + a_off + batch * stride_a;                                          \
    /* unsigned: / and % by a power of two are a shift and a mask */                              \
    const uint ui = (uint)i;                                                                       \
    const long at = batch * ((long)mb * k * KILN_GEMM_RM) +                                        \
                    ((long)(ui / KILN_GEMM_RM) * k + l) * KILN_GEMM_RM + ui % KILN_GEMM_RM;        \
    out[at] = i < m ? LOAD(KILN_GEMM_A(ab, i, l)) : 0.0f;                                          \
  }

/* Likewise for op(B): work-item (j, l, batch), zero past n. */
#define KILN_GEMM_PACK_B(name, ST, LOAD)                                                           \
  KILN_CL_KERNEL(name) {                                                                           \
    __global const ST *b = (__global const ST *)in1_;                                              \
    __global float *out = (__global float *)out_;                                                  \
    const long b_off = op.plan.gemm.b_off, ldb = op.plan.gemm.ldb, stride_b = op.plan.gemm.stride_b; \
    const int n = (int)op.plan.gemm.n, k = (int)op.plan.gemm.k, trans_b = op.plan.gemm.trans_b;     \
    const int nb = (n + KILN_GEMM_RN - 1) / KILN_GEMM_RN;                                          \
    const int j = (int)get_global_id(0), l = (int)get_global_id(1);                                \
    const long batch = (long)get_global_id(2);                                                     \
    if (j >= nb * KILN_GEMM_RN) return;                                                            \
    __global const ST *bb = b + b_off + batch * stride_b;                                          \
    const uint uj = (uint)j;                                                                       \
    const long at = batch * ((long)nb * k * KILN_GEMM_RN) +                                        \
                    ((long)(uj / KILN_GEMM_RN) * k + l) * KILN_GEMM_RN + uj % KILN_GEMM_RN;        \
    out[at] = j < n ? LOAD(KILN_GEMM_B(bb, l, j)) : 0.0f;                                          \
  }

KILN_GEMM_PACK_A(gemm_pack_a, float, KILN_GEMM_LOAD_f32)
KILN_GEMM_PACK_B(gemm_pack_b, float, KILN_GEMM_LOAD_f32)
KILN_GEMM_PACK_A(gemm_pack_a_f16, ushort, KILN_GEMM_LOAD_f16)
KILN_GEMM_PACK_B(gemm_pack_b_f16, ushort, KILN_GEMM_LOAD_f16)
KILN_GEMM_PACK_A(gemm_pack_a_bf16, ushort, KILN_GEMM_LOAD_bf16)
KILN_GEMM_PACK_B(gemm_pack_b_bf16, ushort, KILN_GEMM_LOAD_bf16)

/* Store row i (< m) of a block whose first column is j0. */
KILN_FN void kiln_gemm_store_row(__global float *c, int i, int j0, int n, long ldc, float16 v) {
  __global float *row = c + (long)i * ldc + j0;
  if (j0 + KILN_GEMM_RN <= n) {
    vstore16(v, 0, row);
    return;
  }
  float t[KILN_GEMM_RN];
  vstore16(v, 0, t);
  for (int j = 0; j < n - j0; j++) row[j] = t[j];
}

/* The same into 16-bit storage, each sum rounded once. */
#define KILN_GEMM_STORE_ROW16(d)                                                                   \
  KILN_FN void kiln_gemm_store_row_##d(__global ushort *c, int i, int j0, int n, long ldc, float16 v) { \
    __global ushort *row = c + (long)i * ldc + j0;                                                 \
    float t[KILN_GEMM_RN];                                                                         \
    vstore16(v, 0, t);                                                                             \
    const int w = n - j0 < KILN_GEMM_RN ? n - j0 : KILN_GEMM_RN;                                   \
    for (int j = 0; j < w; j++) row[j] = KILN_CL_FROM_F32_##d(t[j]);                               \
  }
KILN_GEMM_STORE_ROW16(f16)
KILN_GEMM_STORE_ROW16(bf16)

/* Global (n/RN, m/RM, batches), rounded up to the work-group size; the
 * panels' batch strides (stride_a, stride_b of the plan) are their sizes,
 * stride_a 0 when every batch shares one A (conv2d's weights). */
/* One rank-1 update of the 8x16 register block: row r of C += a.sr * b. */
#define KILN_GEMM_RANK1(a, b)                                                                      \
  do {                                                                                             \
    c0 = mad((float16)((a).s0), (b), c0);                                                         \
    c1 = mad((float16)((a).s1), (b), c1);                                                         \
    c2 = mad((float16)((a).s2), (b), c2);                                                         \
    c3 = mad((float16)((a).s3), (b), c3);                                                         \
    c4 = mad((float16)((a).s4), (b), c4);                                                         \
    c5 = mad((float16)((a).s5), (b), c5);                                                         \
    c6 = mad((float16)((a).s6), (b), c6);                                                         \
    c7 = mad((float16)((a).s7), (b), c7);                                                         \
  } while (0)

#define KILN_GEMM_PACKED(name, CT, STORE_ROW)                                                      \
  KILN_CL_KERNEL(name) {                                                                           \
    __global const float *ap = (__global const float *)in0_ + op.plan.gemm.a_off;                  \
    __global const float *bp = (__global const float *)in1_ + op.plan.gemm.b_off;                  \
    __global CT *c = (__global CT *)out_;                                                          \
    const long c_off = op.plan.gemm.c_off, ldc = op.plan.gemm.ldc, stride_c = op.plan.gemm.stride_c; \
    const long ap_batch = op.plan.gemm.stride_a, bp_batch = op.plan.gemm.stride_b;                 \
    const int m = (int)op.plan.gemm.m, n = (int)op.plan.gemm.n, k = (int)op.plan.gemm.k;           \
    const int mb = (m + KILN_GEMM_RM - 1) / KILN_GEMM_RM, nb = (n + KILN_GEMM_RN - 1) / KILN_GEMM_RN; \
    const int jb = (int)get_global_id(0), ib = (int)get_global_id(1);                              \
    const long batch = (long)get_global_id(2);                                                     \
    if (jb >= nb || ib >= mb) return;                                                              \
    __global const float *pa = ap + batch * ap_batch + (long)ib * k * KILN_GEMM_RM;                \
    __global const float *pb = bp + batch * bp_batch + (long)jb * k * KILN_GEMM_RN;                \
    float16 c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f, c4 = 0.0f, c5 = 0.0f, c6 = 0.0f, c7 = 0.0f; \
    int l = 0;                                                                                     \
    for (; l + 2 <= k; l += 2) {                                                                   \
      const float16 b0 = vload16(l, pb), b1 = vload16(l + 1, pb);                                  \
      const float8 a0 = vload8(l, pa), a1 = vload8(l + 1, pa);                                     \
      KILN_GEMM_RANK1(a0, b0);                                                                     \
      KILN_GEMM_RANK1(a1, b1);                                                                     \
    }                                                                                              \
    for (; l < k; l++) {                                                                           \
      const float16 b0 = vload16(l, pb);                                                           \
      const float8 a0 = vload8(l, pa);                                                             \
      KILN_GEMM_RANK1(a0, b0);                                                                     \
    }                                                                                              \
    __global CT *cb = c + c_off + batch * stride_c;                                                \
    const int i0 = ib * KILN_GEMM_RM, j0 = jb * KILN_GEMM_RN;                                      \
    if (i0 + 0 < m) STORE_ROW(cb, i0 + 0, j0, n, ldc, c0);                                         \
    if (i0 + 1 < m) STORE_ROW(cb, i0 + 1, j0, n, ldc, c1);                                         \
    if (i0 + 2 < m) STORE_ROW(cb, i0 + 2, j0, n, ldc, c2);                                         \
    if (i0 + 3 < m) STORE_ROW(cb, i0 + 3, j0, n, ldc, c3);                                         \
    if (i0 + 4 < m) STORE_ROW(cb, i0 + 4, j0, n, ldc, c4);                                         \
    if (i0 + 5 < m) STORE_ROW(cb, i0 + 5, j0, n, ldc, c5);                                         \
    if (i0 + 6 < m) STORE_ROW(cb, i0 + 6, j0, n, ldc, c6);                                         \
    if (i0 + 7 < m) STORE_ROW(cb, i0 + 7, j0, n, ldc, c7);                                         \
  }

KILN_GEMM_PACKED(gemm_packed, float, kiln_gemm_store_row)
KILN_GEMM_PACKED(gemm_packed_f16, ushort, kiln_gemm_store_row_f16)
KILN_GEMM_PACKED(gemm_packed_bf16, ushort, kiln_gemm_store_row_bf16)

/* ---- the tiled kernel for GPUs --------------------------------------------- */

#define KILN_GEMM_TILE 64 /* C tile per work-group: TILE x TILE */
#define KILN_GEMM_TK 16   /* depth of one slab */
#define KILN_GEMM_WPT 4   /* each work-item: WPT x WPT, strided by 16 */

/* Global (ceil(n/64)*16, ceil(m/64)*16, batches), local (16, 16). */
KILN_CL_KERNEL(gemm_tiled) {
  /* As[l][i] and Bs[l][j]; the +1 keeps column reads off one bank. */
  __local float as[KILN_GEMM_TK][KILN_GEMM_TILE + 1];
  __local float bs[KILN_GEMM_TK][KILN_GEMM_TILE + 1];
  __global const float *a = (__global const float *)in0_;
  __global const float *b = (__global const float *)in1_;
  __global float *c = (__global float *)out_;
  const long a_off = op.plan.gemm.a_off, b_off = op.plan.gemm.b_off, c_off = op.plan.gemm.c_off;
  const long lda = op.plan.gemm.lda, ldb = op.plan.gemm.ldb, ldc = op.plan.gemm.ldc;
  const long stride_a = op.plan.gemm.stride_a, stride_b = op.plan.gemm.stride_b, stride_c = op.plan.gemm.stride_c;
  const int m = (int)op.plan.gemm.m, n = (int)op.plan.gemm.n, k = (int)op.plan.gemm.k;
  const int trans_a = op.plan.gemm.trans_a, trans_b = op.plan.gemm.trans_b;
  const int tx = (int)get_local_id(0), ty = (int)get_local_id(1);
  const int i_base = (int)get_group_id(1) * KILN_GEMM_TILE, j_base = (int)get_group_id(0) * KILN_GEMM_TILE;
  const long batch = (long)get_global_id(2);
  __global const float *ab = a + a_off + batch * stride_a;
  __global const float *bb = b + b_off + batch * stride_b;
  const int tid = ty * 16 + tx;
  float acc[KILN_GEMM_WPT][KILN_GEMM_WPT];
  for (int u = 0; u < KILN_GEMM_WPT; u++)
    for (int v = 0; v < KILN_GEMM_WPT; v++) acc[u][v] = 0.0f;
  for (int l0 = 0; l0 < k; l0 += KILN_GEMM_TK) {
    /* 1024 elements of each slab, four per work-item; consecutive work-items
     * take consecutive elements along the contiguous direction. */
    for (uint e = (uint)tid; e < KILN_GEMM_TK * KILN_GEMM_TILE; e += 256) {
      int ii, ll;
      if (trans_a) { ii = e % KILN_GEMM_TILE; ll = e / KILN_GEMM_TILE; }
      else { ll = e % KILN_GEMM_TK; ii = e / KILN_GEMM_TK; }
      const int gi = i_base + ii, gl = l0 + ll;
      as[ll][ii] = gi < m && gl < k ? KILN_GEMM_A(ab, gi, gl) : 0.0f;
      int jj, lb;
      if (trans_b) { lb = e % KILN_GEMM_TK; jj = e / KILN_GEMM_TK; }
      else { jj = e % KILN_GEMM_TILE; lb = e / KILN_GEMM_TILE; }
      const int gj = j_base + jj, glb = l0 + lb;
      bs[lb][jj] = gj < n && glb < k ? KILN_GEMM_B(bb, glb, gj) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int l = 0; l < KILN_GEMM_TK; l++) {
      float av[KILN_GEMM_WPT], bv[KILN_GEMM_WPT];
      for (int u = 0; u < KILN_GEMM_WPT; u++) av[u] = as[l][ty + 16 * u];
      for (int v = 0; v < KILN_GEMM_WPT; v++) bv[v] = bs[l][tx + 16 * v];
      for (int u = 0; u < KILN_GEMM_WPT; u++)
        for (int v = 0; v < KILN_GEMM_WPT; v++) acc[u][v] = mad(av[u], bv[v], acc[u][v]);
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* the slabs are overwritten next */
  }
  __global float *cb = c + c_off + batch * stride_c;
  for (int u = 0; u < KILN_GEMM_WPT; u++) {
    const int i = i_base + ty + 16 * u;
    if (i >= m) continue;
    for (int v = 0; v < KILN_GEMM_WPT; v++) {
      const int j = j_base + tx + 16 * v;
      if (j < n) cb[(long)i * ldc + j] = acc[u][v];
    }
  }
}
