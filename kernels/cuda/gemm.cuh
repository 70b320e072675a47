/* kernels/cuda/gemm.cuh: kiln's native SGEMM: 128x128 block tiles, 8x8 outputs per thread, double-buffered shared memory, float4 loads. */
/*
 * Included once, by kiln.cu. Row-major C = op(A) @ op(B), every transpose
 * combination through strides, batches through gridDim.z (and a loop past
 * 65535), edges by bounds checks on the loads and stores only.
 *
 * Shared memory holds both tiles k-major: As[k][i] and Bs[k][j], so that the
 * inner product reads four consecutive floats of each with one float4 load.
 * Each of the 256 threads owns the 8x8 outputs at rows {ty*4 + 0..3,
 * 64 + ty*4 + 0..3} and cols {tx*4 + 0..3, 64 + tx*4 + 0..3}: the split into
 * two halves 64 apart keeps a warp's float4 reads of shared memory free of
 * bank conflicts. While a tile is multiplied, the next one is already being
 * loaded into registers; one __syncthreads per k-step suffices because the
 * two shared buffers alternate.
 */

#define KILN_GEMM_BM 128
#define KILN_GEMM_BN 128
#define KILN_GEMM_BK 8

/* Four consecutive elements at ptr[0..3]: all zero unless `ok`, and only the
 * first `avail` of them read (the rest zero) at a matrix edge. */
template <bool VEC>
__device__ __forceinline__ void kiln_gemm_load4(const float *__restrict__ ptr, bool ok, int avail, float v[4]) {
  if (ok && VEC && avail >= 4) {
    const float4 q = __ldg(reinterpret_cast<const float4 *>(ptr));
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; j++) v[j] = ok && j < avail ? __ldg(ptr + j) : 0.0f;
}

template <bool TA, bool TB, bool VEC>
__device__ __forceinline__ void kiln_gemm_body(const kiln_cuda_gemm_args_t &p) {
  __shared__ __align__(16) float As[2][KILN_GEMM_BK][KILN_GEMM_BM];
  __shared__ __align__(16) float Bs[2][KILN_GEMM_BK][KILN_GEMM_BN];

  const int tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;
  const int bm = blockIdx.y * KILN_GEMM_BM, bn = blockIdx.x * KILN_GEMM_BN;
  const int M = p.m, N = p.n, K = p.k;

  /* Which four elements this thread loads per tile, by layout:
   * "row-wise" (the tile's k axis is contiguous in memory): row tid/2 of the
   * tile, k offset (tid%2)*4; "col-wise" (the tile's m/n axis contiguous):
   * k row tid/32, offset (tid%32)*4. */
  const int rw_row = tid >> 1, rw_k = (tid & 1) * 4;
  const int cw_k = tid >> 5, cw_col = (tid & 31) * 4;

  /* Per thread: where its four A and B elements start, how far they move per
   * k-step, and which bound does not change with k. */
  const int64_t a_off = !TA ? (int64_t)(bm + rw_row) * p.lda + rw_k : (int64_t)cw_k * p.lda + bm + cw_col;
  const int64_t a_step = !TA ? KILN_GEMM_BK : KILN_GEMM_BK * p.lda;
  const int64_t b_off = !TB ? (int64_t)cw_k * p.ldb + bn + cw_col : (int64_t)(bn + rw_row) * p.ldb + rw_k;
  const int64_t b_step = !TB ? KILN_GEMM_BK * p.ldb : KILN_GEMM_BK;
  const bool a_row_ok = bm + rw_row < M, b_row_ok = bn + rw_row < N;
  const int a_cols = M - (bm + cw_col), b_cols = N - (bn + cw_col);

  for (int64_t z = blockIdx.z; z < p.batch; z += gridDim.z) {
    const float *__restrict__ A = (const float *)p.a + z * p.stride_a + a_off;
    const float *__restrict__ B = (const float *)p.b + z * p.stride_b + b_off;
    float *__restrict__ C = (float *)p.c + z * p.stride_c;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
      for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

    float ra[4], rb[4];
    /* A(i, l): !TA at A[i*lda + l] (k contiguous), TA at A[l*lda + i]. */
#define KILN_GEMM_LOAD_A(k0, ptr)                                                                 \
  do {                                                                                            \
    if (!TA)                                                                                      \
      kiln_gemm_load4<VEC>(ptr, a_row_ok, K - ((k0) + rw_k), ra);                                 \
    else                                                                                          \
      kiln_gemm_load4<VEC>(ptr, (k0) + cw_k < K, a_cols, ra);                                     \
  } while (0)
    /* B(l, j): !TB at B[l*ldb + j] (n contiguous), TB at B[j*ldb + l]. */
#define KILN_GEMM_LOAD_B(k0, ptr)                                                                 \
  do {                                                                                            \
    if (!TB)                                                                                      \
      kiln_gemm_load4<VEC>(ptr, (k0) + cw_k < K, b_cols, rb);                                     \
    else                                                                                          \
      kiln_gemm_load4<VEC>(ptr, b_row_ok, K - ((k0) + rw_k), rb);                                 \
  } while (0)
#define KILN_GEMM_STORE(buf)                                                                      \
  do {                                                                                            \
    if (!TA) {                                                                                    \
      _Pragma("unroll") for (int j = 0; j < 4; j++) As[buf][rw_k + j][rw_row] = ra[j];            \
    } else {                                                                                      \
      *reinterpret_cast<float4 *>(&As[buf][cw_k][cw_col]) = make_float4(ra[0], ra[1], ra[2], ra[3]); \
    }                                                                                             \
    if (!TB) {                                                                                    \
      *reinterpret_cast<float4 *>(&Bs[buf][cw_k][cw_col]) = make_float4(rb[0], rb[1], rb[2], rb[3]); \
    } else {                                                                                      \
      _Pragma("unroll") for (int j = 0; j < 4; j++) Bs[buf][rw_k + j][rw_row] = rb[j];            \
    }                                                                                             \
  } while (0)

    const int tiles = (K + KILN_GEMM_BK - 1) / KILN_GEMM_BK;
    if (tiles > 0) {
      KILN_GEMM_LOAD_A(0, A);
      KILN_GEMM_LOAD_B(0, B);
      KILN_GEMM_STORE(0);
    }
    __syncthreads();

    for (int t = 0; t < tiles; t++) {
      const int cur = t & 1;
      const bool more = t + 1 < tiles;
      if (more) {
        const int k1 = (t + 1) * KILN_GEMM_BK;
        KILN_GEMM_LOAD_A(k1, A + (t + 1) * a_step);
        KILN_GEMM_LOAD_B(k1, B + (t + 1) * b_step);
      }
#pragma unroll
      for (int kk = 0; kk < KILN_GEMM_BK; kk++) {
        const float4 a0 = *reinterpret_cast<const float4 *>(&As[cur][kk][ty * 4]);
        const float4 a1 = *reinterpret_cast<const float4 *>(&As[cur][kk][64 + ty * 4]);
        const float4 b0 = *reinterpret_cast<const float4 *>(&Bs[cur][kk][tx * 4]);
        const float4 b1 = *reinterpret_cast<const float4 *>(&Bs[cur][kk][64 + tx * 4]);
        const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
          for (int j = 0; j < 8; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      if (more) KILN_GEMM_STORE(cur ^ 1);
      __syncthreads();
    }
#undef KILN_GEMM_LOAD_A
#undef KILN_GEMM_LOAD_B
#undef KILN_GEMM_STORE

#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int row = bm + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
      if (row >= M) continue;
      float *crow = C + (int64_t)row * p.ldc;
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const int col = bn + half * 64 + tx * 4;
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
      kiln_sgemm_##NAME(const kiln_cuda_gemm_args_t p) {                                           \
    kiln_gemm_body<TA, TB, VEC>(p);                                                                \
  }
KILN_GEMM_KERNEL_(nn, false, false, false)
KILN_GEMM_KERNEL_(nt, false, true, false)
KILN_GEMM_KERNEL_(tn, true, false, false)
KILN_GEMM_KERNEL_(tt, true, true, false)
KILN_GEMM_KERNEL_(nn_vec, false, false, true)
KILN_GEMM_KERNEL_(nt_vec, false, true, true)
KILN_GEMM_KERNEL_(tn_vec, true, false, true)
KILN_GEMM_KERNEL_(tt_vec, true, true, true)
