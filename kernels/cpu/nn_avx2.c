/* kernels/cpu/nn_avx2.c: SOFTMAX / log-softmax rows and their gradients with AVX2 + FMA (built with -mavx2 -mfma): vector max, exp and sums. */
#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/cpu_native.h"

/* exp(x) for x <= 0 (NaN-free), within about one ulp of expf: x = n ln2 + r
 * with |r| <= ln2/2 (ln2 split in two so that n*ln2_hi is exact), exp(r) by a
 * degree-6 polynomial (Cephes' coefficients), then times 2^n built in two
 * halves so that results down to the subnormal range come out right. Below
 * -104 (where expf is 0) it returns 0. */
static inline __m256 exp_nonpositive(__m256 x) {
  const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(-104.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  /* 2^n = 2^h * 2^(n-h), h = n/2 rounded toward -inf: both halves normal for n >= -150. */
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i h = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, h);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, _mm256_set1_epi32(127)), 23));
  p = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_andnot_ps(zero_below, p);
}

static inline float exp_nonpositive_1(float x) {
  float out[8];
  _mm256_storeu_ps(out, exp_nonpositive(_mm256_set1_ps(x)));
  return out[0];
}

/* The row's maximum; NaN when the row holds one. */
static float row_max_avx2(const float *x, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
  }
  if (!_mm256_testz_ps(nan, nan)) return NAN;
  m0 = _mm256_max_ps(m0, m1);
  float lanes[8];
  _mm256_storeu_ps(lanes, m0);
  float m = lanes[0];
  for (int l = 1; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
  for (; i < n; i++) {
    if (x[i] != x[i]) return NAN;
    if (x[i] > m) m = x[i];
  }
  return m;
}

static inline __m256d add_halves(__m256d acc, __m256 e) {
  return _mm256_add_pd(acc, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                          _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
}

void kiln_cpu_softmax_row_avx2(const float *x, float *y, int64_t cols, bool log_out) {
  if (cols <= 0) return;
  const float m = row_max_avx2(x, cols);
  if (!isfinite(m)) {
    /* NaN anywhere, +inf (inf - inf), or a row of -inf: every output is NaN,
     * as the max-subtracted formula gives. */
    for (int64_t i = 0; i < cols; i++) y[i] = NAN;
    return;
  }
  const __m256 vm = _mm256_set1_ps(m);
  /* The sum in double, as the scalar kernel keeps it. */
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= cols; i += 16) {
    const __m256 e0 = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    const __m256 e1 = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm));
    if (!log_out) {
      _mm256_storeu_ps(y + i, e0);
      _mm256_storeu_ps(y + i + 8, e1);
    }
    s0 = add_halves(s0, e0);
    s1 = add_halves(s1, e1);
  }
  double lanes[4];
  _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < cols; i++) {
    const float e = exp_nonpositive_1(x[i] - m);
    if (!log_out) y[i] = e;
    sum += e;
  }
  i = 0;
  if (log_out) {
    /* (x - max) - log(sum): see nn.c. */
    const float lse = (float)log(sum);
    const __m256 vmax = _mm256_set1_ps(m), vl = _mm256_set1_ps(lse);
    for (; i + 8 <= cols; i += 8)
      _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax), vl));
    for (; i < cols; i++) y[i] = (x[i] - m) - lse;
  } else {
    const float inv = (float)(1.0 / sum);
    const __m256 vi = _mm256_set1_ps(inv);
    for (; i + 8 <= cols; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vi));
    for (; i < cols; i++) y[i] *= inv;
  }
}

/* ---- SOFTMAX_BACKWARD ----------------------------------------------------------- */

/* Lanes 0-3 and 4-7 of eight floats, widened. */
static inline __m256d lo_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline __m256d hi_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

/* The eight lanes (a0: 0-3, a1: 4-7) summed in kiln_cpu_dot_f64's order. */
static inline double combine8(__m256d a0, __m256d a1) {
  double l[8];
  _mm256_storeu_pd(l, a0);
  _mm256_storeu_pd(l + 4, a1);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

void kiln_cpu_softmax_backward_row_avx2(const float *y, const float *dy, float *dx, int64_t cols, bool log_in) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  if (!log_in) {
    /* The products of two floats are exact in double, so an FMA adds the
     * same as the scalar row's multiply and add. */
    for (; i + 8 <= cols; i += 8) {
      const __m256 vd = _mm256_loadu_ps(dy + i), vy = _mm256_loadu_ps(y + i);
      a0 = _mm256_fmadd_pd(lo_pd(vd), lo_pd(vy), a0);
      a1 = _mm256_fmadd_pd(hi_pd(vd), hi_pd(vy), a1);
    }
    /* The scalar row adds its tail into lane 0 one term at a time. */
    double l0[4];
    _mm256_storeu_pd(l0, a0);
    for (; i < cols; i++) l0[0] += (double)dy[i] * (double)y[i];
    a0 = _mm256_loadu_pd(l0);
    const float s = (float)combine8(a0, a1);
    const __m256 vs = _mm256_set1_ps(s);
    i = 0;
    for (; i + 8 <= cols; i += 8)
      _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), _mm256_sub_ps(_mm256_loadu_ps(dy + i), vs)));
    for (; i < cols; i++) dx[i] = y[i] * (dy[i] - s);
    return;
  }
  for (; i + 8 <= cols; i += 8) {
    const __m256 vd = _mm256_loadu_ps(dy + i);
    a0 = _mm256_add_pd(a0, lo_pd(vd));
    a1 = _mm256_add_pd(a1, hi_pd(vd));
  }
  double l0[4];
  _mm256_storeu_pd(l0, a0);
  for (; i < cols; i++) l0[0] += (double)dy[i];
  a0 = _mm256_loadu_pd(l0);
  const float s = (float)combine8(a0, a1);
  const __m256 vs = _mm256_set1_ps(s), zero = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= cols; i += 8) {
    const __m256 vy = _mm256_loadu_ps(y + i);
    /* The vector exp serves y in [-inf, 0], what log-softmax makes; any
     * other value (NaN, a positive y from elsewhere) takes expf. */
    if (_mm256_movemask_ps(_mm256_cmp_ps(vy, zero, _CMP_LE_OQ)) == 0xff) {
      _mm256_storeu_ps(dx + i, _mm256_fnmadd_ps(exp_nonpositive(vy), vs, _mm256_loadu_ps(dy + i)));
    } else {
      for (int64_t k = i; k < i + 8; k++) dx[k] = dy[k] - expf(y[k]) * s;
    }
  }
  for (; i < cols; i++) dx[i] = dy[i] - (y[i] <= 0.0f ? exp_nonpositive_1(y[i]) : expf(y[i])) * s;
}
