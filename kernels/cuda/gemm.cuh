/* kernels/cuda/gemm.cuh: kiln's native SGEMM: 128x128 block tiles, 8x8 outputs per thread, double-buffered shared memory, float4 loads. */
/*
 * Included once, by kiln.cu. Row-major C = op(A) @ op(B) as the planner
 * wrote it into the record's plan.gemm (a, b, c, sizes, leading dimensions,
 * batch strides; c_vec), every transpose
 * combination through strides, edges by bounds checks on the loads and
 * stores only. Sizes and offsets are 64-bit: m, n and k may exceed 2^31.
 * Counters are ints where the host bounds them (kiln_cuda_gemm_grid: m and
 * n below 2^38, k below 2^33, batch below 2^30): tile indices, batch index,
 * and k's steps of 8 (so K near INT_MAX does not overflow into an empty
 * loop). The grid is tiled: x covers the n tiles, and each
 * block loops over the m tiles (y) and batches (z) its grid leaves, so m
 * and the batch count are not bounded by the grid's 65535 in y and z.
 *
 * Shared memory holds both tiles k-major: As[k][i] and Bs[k][j], so that the
 * inner product reads four consecutive floats of each with one float4 load.
 * Each of the 256 threads owns the 8x8 outputs at rows {ty*4 + 0..3,
 * 64 + ty*4 + 0..3} and cols {tx*4 + 0..3, 64 + tx*4 + 0..3}: the split into
 * two halves 64 apart keeps a warp's float4 reads of shared memory free of
 * bank conflicts. While a tile is multiplied, the next one is already being
 * loaded into registers; one __syncthreads per k-step suffices because the
 * two shared buffers alternate.
 *
 * Registers: at two blocks per SM (__launch_bounds__(256, 2)) a thread has
 * 128. The 64 accumulators, two sets of fragments (the k-step being
 * multiplied and the next, 16 + 16) and the 8 prefetched elements leave
 * about 24 for addresses and bounds, and the record's parameter (plan.gemm
 * starts 544 bytes in) leaves ptxas less slack than a small argument struct
 * did. So the fragments are double-buffered by hand; the k loop counts
 * steps in an int, and a step's bounds are 32-bit: every step but the last
 * is full, the last holds k_last elements; an operand whose k axis is
 * contiguous is a running pointer (step the constant 8), the other's
 * address is its tile base plus step * 8 * ld (no 64-bit step held in
 * registers); the batch index is an int; the outer loops are not unrolled.
 * With these choices ptxas allocates every variant without spilling on
 * sm_90, at 127-128 registers: at the edge, so each change here wants
 * `ptxas -v` run again (tests/cuda/kernel_checks.py, cuda-kernel-checks;
 * the report is in backends/cuda/README.md).
 */

#define KILN_GEMM_BM 128
#define KILN_GEMM_BN 128
#define KILN_GEMM_BK 8

/* Four consecutive elements at ptr[0..3], of which the first `avail` are
 * inside the matrix (avail <= 0: none); the rest read as zero. */
template <bool VEC>
__device__ __forceinline__ void kiln_gemm_load4(const float *__restrict__ ptr, int avail, float v[4]) {
  if (VEC && avail >= 4) {
    const float4 q = __ldg(reinterpret_cast<const float4 *>(ptr));
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; j++) v[j] = j < avail ? __ldg(ptr + j) : 0.0f;
}

/* min(v, 4) for v >= 0, as an int: how many of four elements lie before a bound. */
__device__ __forceinline__ int kiln_gemm_avail(int64_t v) { return v >= 4 ? 4 : (int)v; }

template <bool TA, bool TB, bool VEC>
__device__ __forceinline__ void kiln_gemm_body(const kiln_kop_t &op) {
  const auto &p = op.plan.gemm; /* what the planner wrote; nothing else of the record is read */
  __shared__ __align__(16) float As[2][KILN_GEMM_BK][KILN_GEMM_BM];
  __shared__ __align__(16) float Bs[2][KILN_GEMM_BK][KILN_GEMM_BN];

  const int tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;
  const int64_t M = p.m, N = p.n, K = p.k;
  /* The host keeps m and n below 2^38 (a terabyte of floats), so tile
   * indices fit in an int. */
  const int tiles_m = (int)((M + KILN_GEMM_BM - 1) / KILN_GEMM_BM);
  /* k in steps of KILN_GEMM_BK, counted in an int (k < 2^33): every step
   * but the last is full, the last holds k_last (1..8) elements. */
  const int steps = (int)((K + KILN_GEMM_BK - 1) / KILN_GEMM_BK);
  const int k_last = (int)(K - (int64_t)(steps - 1) * KILN_GEMM_BK);

  /* Which four elements this thread loads per tile, by layout:
   * "row-wise" (the tile's k axis is contiguous in memory): row tid/2 of the
   * tile, k offset (tid%2)*4; "col-wise" (the tile's m/n axis contiguous):
   * k row tid/32, offset (tid%32)*4. */
  const int rw_row = tid >> 1, rw_k = (tid & 1) * 4;
  const int cw_k = tid >> 5, cw_col = (tid & 31) * 4;

  const int64_t bn = (int64_t)blockIdx.x * KILN_GEMM_BN;
#pragma unroll 1
  for (int z = blockIdx.z; z < p.batch; z += gridDim.z)
#pragma unroll 1
    for (int tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
        const int64_t bm = (int64_t)tm * KILN_GEMM_BM;
        /* Where this thread's four A and B elements start, and the bound
         * that does not move with k: A(i, l) is !TA a[i*lda + l] (k
         * contiguous), TA a[l*lda + i]; B(l, j) is !TB b[l*ldb + j], TB
         * b[j*ldb + l]. */
        const float *__restrict__ A =
            (const float *)p.a + (int64_t)z * p.stride_a +
            (!TA ? (bm + rw_row) * p.lda + rw_k : cw_k * p.lda + bm + cw_col);
        const float *__restrict__ B =
            (const float *)p.b + (int64_t)z * p.stride_b +
            (!TB ? cw_k * p.ldb + bn + cw_col : (bn + rw_row) * p.ldb + rw_k);
        /* !TA: the row is inside (4) or not (0); TA: how many of the four
         * columns are. Likewise for B. */
        const int a_fixed = !TA ? (bm + rw_row < M ? 4 : 0)
                                : kiln_gemm_avail(M - (bm + cw_col) > 0 ? M - (bm + cw_col) : 0);
        const int b_fixed = !TB ? kiln_gemm_avail(N - (bn + cw_col) > 0 ? N - (bn + cw_col) : 0)
                                : (bn + rw_row < N ? 4 : 0);

        float acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
          for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

        float ra[4], rb[4];
        /* The elements of k-step `step` that lie inside both bounds (left_ of
         * the step's k lie before K). */
#define KILN_GEMM_LOAD(step)                                                                              \
  do {                                                                                                    \
    const int left_ = (step) + 1 < steps ? KILN_GEMM_BK : k_last;                                         \
    const int a_avail_ = !TA ? (a_fixed ? min(max(left_ - rw_k, 0), 4) : 0)                              \
                             : (cw_k < left_ ? a_fixed : 0);                                              \
    const int b_avail_ = !TB ? (cw_k < left_ ? b_fixed : 0)                                               \
                             : (b_fixed ? min(max(left_ - rw_k, 0), 4) : 0);                              \
    const int64_t k0_ = (int64_t)(step) * KILN_GEMM_BK;                                                   \
    kiln_gemm_load4<VEC>(!TA ? A : A + k0_ * p.lda, a_avail_, ra);                                        \
    kiln_gemm_load4<VEC>(B + (TB ? k0_ : k0_ * p.ldb), b_avail_, rb);                                     \
  } while (0)
#define KILN_GEMM_STORE(buf)                                                                              \
  do {                                                                                                    \
    if (!TA) {                                                                                            \
      _Pragma("unroll") for (int j = 0; j < 4; j++) As[buf][rw_k + j][rw_row] = ra[j];                    \
    } else {                                                                                              \
      *reinterpret_cast<float4 *>(&As[buf][cw_k][cw_col]) = make_float4(ra[0], ra[1], ra[2], ra[3]);      \
    }                                                                                                     \
    if (!TB) {                                                                                            \
      *reinterpret_cast<float4 *>(&Bs[buf][cw_k][cw_col]) = make_float4(rb[0], rb[1], rb[2], rb[3]);      \
    } else {                                                                                              \
      _Pragma("unroll") for (int j = 0; j < 4; j++) Bs[buf][rw_k + j][rw_row] = rb[j];                    \
    }                                                                                                     \
  } while (0)

        if (steps > 0) {
          KILN_GEMM_LOAD(0);
          KILN_GEMM_STORE(0);
        }
        __syncthreads();

        int cur = 0;
#pragma unroll 1
        for (int step = 0; step < steps; step++) {
          const bool more = step + 1 < steps;
          if (more) {
            if (!TA) A += KILN_GEMM_BK;
            KILN_GEMM_LOAD(step + 1);
          }
          /* Fragments double-buffered by hand: those of kk+1 load while kk's
           * 64 products run. */
          float4 a0 = *reinterpret_cast<const float4 *>(&As[cur][0][ty * 4]);
          float4 a1 = *reinterpret_cast<const float4 *>(&As[cur][0][64 + ty * 4]);
          float4 b0 = *reinterpret_cast<const float4 *>(&Bs[cur][0][tx * 4]);
          float4 b1 = *reinterpret_cast<const float4 *>(&Bs[cur][0][64 + tx * 4]);
#pragma unroll
          for (int kk = 0; kk < KILN_GEMM_BK; kk++) {
            float4 na0 = a0, na1 = a1, nb0 = b0, nb1 = b1; /* the last kk loads nothing more */
            if (kk + 1 < KILN_GEMM_BK) {
              na0 = *reinterpret_cast<const float4 *>(&As[cur][kk + 1][ty * 4]);
              na1 = *reinterpret_cast<const float4 *>(&As[cur][kk + 1][64 + ty * 4]);
              nb0 = *reinterpret_cast<const float4 *>(&Bs[cur][kk + 1][tx * 4]);
              nb1 = *reinterpret_cast<const float4 *>(&Bs[cur][kk + 1][64 + tx * 4]);
            }
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
              for (int j = 0; j < 8; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            if (kk + 1 < KILN_GEMM_BK) {
              a0 = na0;
              a1 = na1;
              b0 = nb0;
              b1 = nb1;
            }
          }
          if (more) KILN_GEMM_STORE(cur ^ 1);
          __syncthreads();
          cur ^= 1;
        }
#undef KILN_GEMM_LOAD
#undef KILN_GEMM_STORE

        float *__restrict__ C = (float *)p.c + (int64_t)z * p.stride_c;
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const int64_t row = bm + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
          if (row >= M) continue;
          float *crow = C + row * p.ldc;
#pragma unroll
          for (int half = 0; half < 2; half++) {
            const int64_t col = bn + half * 64 + tx * 4;
            const float *v = &acc[i][half * 4];
            if (p.c_vec && col + 3 < N) {
              *reinterpret_cast<float4 *>(crow + col) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
#pragma unroll
              for (int j = 0; j < 4; j++)
                if (col + j < N) crow[col + j] = v[j];
            }
          }
        }
      }
}

#define KILN_GEMM_KERNEL_(NAME, TA, TB, VEC)                                                      \
  extern "C" __global__ void __launch_bounds__(KILN_CUDA_GEMM_THREADS, 2)                           \
      kiln_sgemm_##NAME(const kiln_kop_t op) {                                                     \
    kiln_gemm_body<TA, TB, VEC>(op);                                                               \
  }
KILN_GEMM_KERNEL_(nn, false, false, false)
KILN_GEMM_KERNEL_(nt, false, true, false)
KILN_GEMM_KERNEL_(tn, true, false, false)
KILN_GEMM_KERNEL_(tt, true, true, false)
KILN_GEMM_KERNEL_(nn_vec, false, false, true)
KILN_GEMM_KERNEL_(nt_vec, false, true, true)
KILN_GEMM_KERNEL_(tn_vec, true, false, true)
KILN_GEMM_KERNEL_(tt_vec, true, true, true)

/* ---- f64, f16, bf16 ------------------------------------------------------------- */

/* The SGEMM's tiling serves f64, f16 and bf16 too (kiln_gemm_<nn|nt|tn|tt>_<dtype>_<dtype>):
 * the body is a template over the storage type T, computing in
 * kiln_cx<T>::type (CT: float for f32, f16 and bf16, double for f64). The
 * 16-bit operands are widened exactly to f32 as they are loaded, the tiles
 * and accumulators are f32, and C is rounded once, to nearest even, as it
 * is stored: the CPU's f16/bf16 matmul (the f32 GEMM of the widened
 * operands, rounded), up to the order of the sums. f64 keeps everything in
 * double (fma), at one block per SM (its 64 accumulators take 128
 * registers). Loads and stores are element by element (no _vec variants).
 * kiln_sgemm_* keep their own copy of the body above, unchanged: they sit at
 * the edge of sm_90's registers, and ptxas spilled two of them when f32 was
 * an instance of this template (tests/cuda/kernel_checks.py); folding them
 * back in wants that check run on each try. */

template <typename T>
__device__ __forceinline__ void kiln_gemm_load4_t(const T *__restrict__ ptr, int avail, typename kiln_cx<T>::type v[4]) {
#pragma unroll
  for (int j = 0; j < 4; j++) v[j] = j < avail ? kiln_cx<T>::in(ptr[j]) : (typename kiln_cx<T>::type)0;
}
/* Four consecutive CT of a shared tile (16-byte aligned for float), and
 * four stored into one. */
struct kiln_gemm_d4 {
  double x, y, z, w;
};
__device__ __forceinline__ float4 kiln_gemm_frag(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ kiln_gemm_d4 kiln_gemm_frag(const double *p) {
  kiln_gemm_d4 v;
  v.x = p[0];
  v.y = p[1];
  v.z = p[2];
  v.w = p[3];
  return v;
}
__device__ __forceinline__ void kiln_gemm_put4(float *p, const float v[4]) {
  *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void kiln_gemm_put4(double *p, const double v[4]) {
#pragma unroll
  for (int j = 0; j < 4; j++) p[j] = v[j];
}
__device__ __forceinline__ float kiln_gemm_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double kiln_gemm_fma(double a, double b, double c) { return fma(a, b, c); }

/* Four results into C[0..3] when col + 3 < N and C may take a float4 (f32
 * only, c_vec), else each inside N alone, rounded into T. */
template <typename T>
__device__ __forceinline__ void kiln_gemm_out4(T *crow, int64_t col, int64_t N, bool c_vec,
                                               const typename kiln_cx<T>::type *v) {
  (void)c_vec;
#pragma unroll
  for (int j = 0; j < 4; j++)
    if (col + j < N) crow[col + j] = kiln_cx<T>::out(v[j]);
}
template <typename T, bool TA, bool TB>
__device__ __forceinline__ void kiln_gemm_body_t(const kiln_kop_t &op) {
  typedef typename kiln_cx<T>::type CT;
  const auto &p = op.plan.gemm; /* what the planner wrote; nothing else of the record is read */
  __shared__ __align__(16) CT As[2][KILN_GEMM_BK][KILN_GEMM_BM];
  __shared__ __align__(16) CT Bs[2][KILN_GEMM_BK][KILN_GEMM_BN];

  const int tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;
  const int64_t M = p.m, N = p.n, K = p.k;
  /* The host keeps m and n below 2^38 (a terabyte of floats), so tile
   * indices fit in an int. */
  const int tiles_m = (int)((M + KILN_GEMM_BM - 1) / KILN_GEMM_BM);
  /* k in steps of KILN_GEMM_BK, counted in an int (k < 2^33): every step
   * but the last is full, the last holds k_last (1..8) elements. */
  const int steps = (int)((K + KILN_GEMM_BK - 1) / KILN_GEMM_BK);
  const int k_last = (int)(K - (int64_t)(steps - 1) * KILN_GEMM_BK);

  /* Which four elements this thread loads per tile, by layout:
   * "row-wise" (the tile's k axis is contiguous in memory): row tid/2 of the
   * tile, k offset (tid%2)*4; "col-wise" (the tile's m/n axis contiguous):
   * k row tid/32, offset (tid%32)*4. */
  const int rw_row = tid >> 1, rw_k = (tid & 1) * 4;
  const int cw_k = tid >> 5, cw_col = (tid & 31) * 4;

  const int64_t bn = (int64_t)blockIdx.x * KILN_GEMM_BN;
#pragma unroll 1
  for (int z = blockIdx.z; z < p.batch; z += gridDim.z)
#pragma unroll 1
    for (int tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
        const int64_t bm = (int64_t)tm * KILN_GEMM_BM;
        /* Where this thread's four A and B elements start, and the bound
         * that does not move with k: A(i, l) is !TA a[i*lda + l] (k
         * contiguous), TA a[l*lda + i]; B(l, j) is !TB b[l*ldb + j], TB
         * b[j*ldb + l]. */
        const T *__restrict__ A =
            (const T *)p.a + (int64_t)z * p.stride_a +
            (!TA ? (bm + rw_row) * p.lda + rw_k : cw_k * p.lda + bm + cw_col);
        const T *__restrict__ B =
            (const T *)p.b + (int64_t)z * p.stride_b +
            (!TB ? cw_k * p.ldb + bn + cw_col : (bn + rw_row) * p.ldb + rw_k);
        /* !TA: the row is inside (4) or not (0); TA: how many of the four
         * columns are. Likewise for B. */
        const int a_fixed = !TA ? (bm + rw_row < M ? 4 : 0)
                                : kiln_gemm_avail(M - (bm + cw_col) > 0 ? M - (bm + cw_col) : 0);
        const int b_fixed = !TB ? kiln_gemm_avail(N - (bn + cw_col) > 0 ? N - (bn + cw_col) : 0)
                                : (bn + rw_row < N ? 4 : 0);

        CT acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
          for (int j = 0; j < 8; j++) acc[i][j] = (CT)0;

        CT ra[4], rb[4];
        /* The elements of k-step `step` that lie inside both bounds (left_ of
         * the step's k lie before K). */
#define KILN_GEMM_LOAD(step)                                                                              \
  do {                                                                                                    \
    const int left_ = (step) + 1 < steps ? KILN_GEMM_BK : k_last;                                         \
    const int a_avail_ = !TA ? (a_fixed ? min(max(left_ - rw_k, 0), 4) : 0)                              \
                             : (cw_k < left_ ? a_fixed : 0);                                              \
    const int b_avail_ = !TB ? (cw_k < left_ ? b_fixed : 0)                                               \
                             : (b_fixed ? min(max(left_ - rw_k, 0), 4) : 0);                              \
    const int64_t k0_ = (int64_t)(step) * KILN_GEMM_BK;                                                   \
    kiln_gemm_load4_t(!TA ? A : A + k0_ * p.lda, a_avail_, ra);                                        \
    kiln_gemm_load4_t(B + (TB ? k0_ : k0_ * p.ldb), b_avail_, rb);                                     \
  } while (0)
#define KILN_GEMM_STORE(buf)                                                                              \
  do {                                                                                                    \
    if (!TA) {                                                                                            \
      _Pragma("unroll") for (int j = 0; j < 4; j++) As[buf][rw_k + j][rw_row] = ra[j];                    \
    } else {                                                                                              \
      kiln_gemm_put4(&As[buf][cw_k][cw_col], ra);                                                         \
    }                                                                                                     \
    if (!TB) {                                                                                            \
      kiln_gemm_put4(&Bs[buf][cw_k][cw_col], rb);                                                         \
    } else {                                                                                              \
      _Pragma("unroll") for (int j = 0; j < 4; j++) Bs[buf][rw_k + j][rw_row] = rb[j];                    \
    }                                                                                                     \
  } while (0)

        if (steps > 0) {
          KILN_GEMM_LOAD(0);
          KILN_GEMM_STORE(0);
        }
        __syncthreads();

        int cur = 0;
#pragma unroll 1
        for (int step = 0; step < steps; step++) {
          const bool more = step + 1 < steps;
          if (more) {
            if (!TA) A += KILN_GEMM_BK;
            KILN_GEMM_LOAD(step + 1);
          }
          /* Fragments double-buffered by hand: those of kk+1 load while kk's
           * 64 products run. */
          auto a0 = kiln_gemm_frag(&As[cur][0][ty * 4]);
          auto a1 = kiln_gemm_frag(&As[cur][0][64 + ty * 4]);
          auto b0 = kiln_gemm_frag(&Bs[cur][0][tx * 4]);
          auto b1 = kiln_gemm_frag(&Bs[cur][0][64 + tx * 4]);
#pragma unroll
          for (int kk = 0; kk < KILN_GEMM_BK; kk++) {
            auto na0 = a0, na1 = a1, nb0 = b0, nb1 = b1; /* the last kk loads nothing more */
            if (kk + 1 < KILN_GEMM_BK) {
              na0 = kiln_gemm_frag(&As[cur][kk + 1][ty * 4]);
              na1 = kiln_gemm_frag(&As[cur][kk + 1][64 + ty * 4]);
              nb0 = kiln_gemm_frag(&Bs[cur][kk + 1][tx * 4]);
              nb1 = kiln_gemm_frag(&Bs[cur][kk + 1][64 + tx * 4]);
            }
            const CT av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const CT bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
              for (int j = 0; j < 8; j++) acc[i][j] = kiln_gemm_fma(av[i], bv[j], acc[i][j]);
            if (kk + 1 < KILN_GEMM_BK) {
              a0 = na0;
              a1 = na1;
              b0 = nb0;
              b1 = nb1;
            }
          }
          if (more) KILN_GEMM_STORE(cur ^ 1);
          __syncthreads();
          cur ^= 1;
        }
#undef KILN_GEMM_LOAD
#undef KILN_GEMM_STORE

        T *__restrict__ C = (T *)p.c + (int64_t)z * p.stride_c;
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const int64_t row = bm + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
          if (row >= M) continue;
          T *crow = C + row * p.ldc;
#pragma unroll
          for (int half = 0; half < 2; half++)
            kiln_gemm_out4(crow, bn + half * 64 + tx * 4, N, p.c_vec, &acc[i][half * 4]);
        }
      }
}

/* The other float dtypes: kiln_gemm_<nn|nt|tn|tt>_<dtype>_<dtype>, no _vec
 * variants; f64 at one block per SM (twice the registers). */
#define KILN_GEMM_DT_KERNEL_(NAME, TA, TB, DT, T, BLOCKS)                                          \
  extern "C" __global__ void __launch_bounds__(KILN_CUDA_GEMM_THREADS, BLOCKS)                      \
      kiln_gemm_##NAME##_##DT##_##DT(const kiln_kop_t op) {                                        \
    kiln_gemm_body_t<T, TA, TB>(op);                                                              \
  }
#define KILN_GEMM_DT_(DT, T, BLOCKS)                                                               \
  KILN_GEMM_DT_KERNEL_(nn, false, false, DT, T, BLOCKS)                                            \
  KILN_GEMM_DT_KERNEL_(nt, false, true, DT, T, BLOCKS)                                             \
  KILN_GEMM_DT_KERNEL_(tn, true, false, DT, T, BLOCKS)                                             \
  KILN_GEMM_DT_KERNEL_(tt, true, true, DT, T, BLOCKS)
KILN_GEMM_DT_(f64, double, 1)
KILN_GEMM_DT_(f16, kiln_f16_t, 2)
KILN_GEMM_DT_(bf16, kiln_bf16_t, 2)
#undef KILN_GEMM_DT_
#undef KILN_GEMM_DT_KERNEL_

/* ---- f16 and bf16 on the tensor cores (WMMA, sm_80 and newer) -------------------
 * kiln_gemm_wmma_<f16|bf16>: C = op(A) @ op(B) with the products on the
 * matrix units (nvcuda::wmma, 16x16x16 fragments, f32 accumulators), the
 * planner's choice on devices of compute capability 8.0 and newer. A block
 * of KILN_WMMA_THREADS (four warps) computes a 64x64 tile of C, each warp a
 * 32x32 quarter (2x2 fragments); k advances 16 at a time. The tiles of A
 * (64x16) and B (16x64) are staged in shared memory as their 16-bit storage,
 * every transpose and edge resolved there (zeros past m, n and k), so the
 * fragments always load row-major from aligned rows. The f32 sums go
 * through shared memory once at the end and are rounded once, to nearest
 * even, into C: f32 accumulation as the scalar kernels, in the matrix
 * units' order of the sums. Grid: x over n's tiles, y over m's (looping past
 * 65535), z over the batch (likewise). Below sm_80 the body is empty: the
 * planner never launches it there. */
#define KILN_WMMA_THREADS 128
#define KILN_WMMA_TILE 64
#define KILN_WMMA_AK 24 /* A's shared row: 16 k, padded (a multiple of 8, rows 32-byte aligned every 16) */
#define KILN_WMMA_BN 72 /* B's shared row: 64 n, padded */
#define KILN_WMMA_CN 68 /* the f32 results' shared row */

template <typename T, typename H>
__device__ __forceinline__ void kiln_gemm_wmma_body(const kiln_kop_t &op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)op;
#else
  namespace wmma = nvcuda::wmma;
  const auto &p = op.plan.gemm;
  __shared__ __align__(32) kiln_u16 As[KILN_WMMA_TILE * KILN_WMMA_AK];
  __shared__ __align__(32) kiln_u16 Bs[16 * KILN_WMMA_BN];
  __shared__ __align__(32) float Cs[KILN_WMMA_TILE * KILN_WMMA_CN];
  const int tid = threadIdx.x, warp = tid >> 5;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  const int64_t M = p.m, N = p.n, K = p.k;
  const int tiles_m = (int)((M + KILN_WMMA_TILE - 1) / KILN_WMMA_TILE);
  const int64_t col0 = (int64_t)blockIdx.x * KILN_WMMA_TILE;
  for (int batch = blockIdx.z; batch < (int)p.batch; batch += gridDim.z) {
    const T *__restrict__ a = (const T *)p.a + (int64_t)batch * p.stride_a;
    const T *__restrict__ b = (const T *)p.b + (int64_t)batch * p.stride_b;
    T *__restrict__ c = (T *)p.c + (int64_t)batch * p.stride_c;
    for (int tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
      const int64_t row0 = (int64_t)tm * KILN_WMMA_TILE;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
      for (int64_t l0 = 0; l0 < K; l0 += 16) {
        __syncthreads(); /* the last step's fragments are loaded */
        /* 1024 elements of each tile, 8 a thread, zeros outside. */
#pragma unroll
        for (int e = 0; e < 8; e++) {
          const int idx = tid + e * KILN_WMMA_THREADS;
          const int r = idx >> 4, kk = idx & 15; /* A: 64 rows of 16 */
          const int64_t i = row0 + r, l = l0 + kk;
          kiln_u16 v = 0;
          if (i < M && l < K) v = kiln_raw(p.trans_a ? a[l * p.lda + i] : a[i * p.lda + l]);
          As[r * KILN_WMMA_AK + kk] = v;
          const int kb = idx >> 6, cc = idx & 63; /* B: 16 rows of 64 */
          const int64_t lb = l0 + kb, j = col0 + cc;
          kiln_u16 w = 0;
          if (lb < K && j < N) w = kiln_raw(p.trans_b ? b[j * p.ldb + lb] : b[lb * p.ldb + j]);
          Bs[kb * KILN_WMMA_BN + cc] = w;
        }
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::row_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; i++)
          wmma::load_matrix_sync(fa[i], reinterpret_cast<const H *>(&As[(wm + i * 16) * KILN_WMMA_AK]), KILN_WMMA_AK);
#pragma unroll
        for (int j = 0; j < 2; j++)
          wmma::load_matrix_sync(fb[j], reinterpret_cast<const H *>(&Bs[wn + j * 16]), KILN_WMMA_BN);
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
          for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
          wmma::store_matrix_sync(&Cs[(wm + i * 16) * KILN_WMMA_CN + wn + j * 16], acc[i][j], KILN_WMMA_CN,
                                  wmma::mem_row_major);
      __syncthreads();
      /* 4096 results, 32 a thread, each rounded once into C. */
      for (int e = tid; e < KILN_WMMA_TILE * KILN_WMMA_TILE; e += KILN_WMMA_THREADS) {
        const int r = e >> 6, cc = e & 63;
        const int64_t i = row0 + r, j = col0 + cc;
        if (i < M && j < N) c[i * p.ldc + j] = kiln_cx<T>::out(Cs[r * KILN_WMMA_CN + cc]);
      }
      __syncthreads(); /* Cs is read before the next tile stores into it */
    }
  }
#endif
}

extern "C" __global__ void __launch_bounds__(KILN_WMMA_THREADS) kiln_gemm_wmma_f16(const kiln_kop_t op) {
  kiln_gemm_wmma_body<kiln_f16_t, __half>(op);
}
extern "C" __global__ void __launch_bounds__(KILN_WMMA_THREADS) kiln_gemm_wmma_bf16(const kiln_kop_t op) {
  kiln_gemm_wmma_body<kiln_bf16_t, __nv_bfloat16>(op);
}
