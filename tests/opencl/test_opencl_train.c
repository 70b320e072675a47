/* tests/opencl/test_opencl_train.c: the OpenCL backend's training kinds on every OpenCL device, against host loops in double: gradients, the convolutions' and pooling's backward, the fused updates. */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>

#include "../common.h"

/* ---- devices and tensors ------------------------------------------------------------ */

static size_t opencl_devices(kiln_device_t **out, size_t capacity) {
  KT_OK(kiln_ensure_initialized());
  size_t count = 0, n = 0;
  KT_OK(kiln_device_count(&count));
  for (size_t i = 0; i < count && n < capacity; i++) {
    kiln_device_t *d = NULL;
    KT_OK(kiln_device_get(i, &d));
    kiln_device_info_t info;
    KT_OK(kiln_device_info(d, &info));
    if (!strcmp(info.backend, "opencl"))
      out[n++] = d;
    else
      kiln_device_release(d);
  }
  return n;
}

static void release_all(kiln_device_t **devices, size_t n) {
  for (size_t i = 0; i < n; i++) kiln_device_release(devices[i]);
}

/* Whether the device is Oclgrind (a simulator: small shapes only). */
static bool is_simulator(kiln_device_t *device) {
  kiln_device_info_t info;
  KT_OK(kiln_device_info(device, &info));
  return strstr(info.name, "Oclgrind") || strstr(info.vendor, "Oclgrind");
}

static kiln_tensor_t *upload(kiln_device_t *device, int ndim, const int64_t *shape, const float *data) {
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_from_host(device, KILN_F32, ndim, shape, data, &t));
  return t;
}

static float *download(const kiln_tensor_t *t) {
  const int64_t n = kiln_tensor_numel(t);
  float *host = malloc((size_t)(n ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(host);
  KT_OK(kiln_tensor_read(t, host, (size_t)n * sizeof(float)));
  return host;
}

/* The plugin's test exports: the scratch budget of a round, the GEMM path. */
static void *plugin_export(const char *name) {
  KT_OK(kiln_ensure_initialized());
  size_t count = 0;
  KT_OK(kiln_backend_count(&count));
  void *handle = NULL;
  for (size_t i = 0; i < count && !handle; i++) {
    kiln_backend_info_t info;
    KT_OK(kiln_backend_info(i, &info));
    if (!strcmp(info.name, "opencl") && info.path && info.path[0]) handle = dlopen(info.path, RTLD_NOW | RTLD_NOLOAD);
  }
  ck_assert_msg(handle != NULL, "the OpenCL plugin is not loaded");
  void *fn = dlsym(handle, name);
  ck_assert_msg(fn != NULL, "the OpenCL plugin lacks %s", name);
  dlclose(handle); /* drops the reference NOLOAD took; the core keeps its own */
  return fn;
}
typedef void (*budget_fn)(size_t bytes);
typedef void (*path_fn)(int path);
static budget_fn scratch_budget_export(void) { return (budget_fn)plugin_export("kiln_cl_debug_scratch_budget"); }
static path_fn gemm_path_export(void) { return (path_fn)plugin_export("kiln_cl_debug_gemm_path"); }

/* A deterministic stream of floats in [-1, 1). */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rnd(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
static float *random_array(int64_t n) {
  float *a = malloc((size_t)(n ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(a);
  for (int64_t i = 0; i < n; i++) a[i] = rnd();
  return a;
}

/* got[i] against want[i]: NaN where want is NaN, equal infinities, else
 * within rtol * mag[i] (the sum of the magnitudes of the terms, so that
 * cancellation does not demand more than float can give) plus atol. */
static void check_close(const char *what, const char *device, const float *got, const double *want, const double *mag,
                        int64_t n, double rtol, double atol) {
  for (int64_t i = 0; i < n; i++) {
    const double g = got[i], w = want[i];
    if (isnan(w)) {
      ck_assert_msg(isnan(g), "%s on %s: element %lld is %.9g, expected NaN", what, device, (long long)i, g);
      continue;
    }
    if (isinf(w)) {
      ck_assert_msg(g == w, "%s on %s: element %lld is %.9g, expected %g", what, device, (long long)i, g, w);
      continue;
    }
    const double scale = mag ? mag[i] : fabs(w);
    ck_assert_msg(fabs(g - w) <= rtol * scale + atol, "%s on %s: element %lld is %.9g, expected %.9g (scale %.3g)",
                  what, device, (long long)i, g, w, scale);
  }
}

/* ---- unary_backward ------------------------------------------------------------------ */

static double unary_grad_ref(kiln_unary_op_t op, double x, double dy) {
  switch (op) {
  case KILN_UNARY_NEG:
    return -dy;
  case KILN_UNARY_ABS:
    return x > 0 ? dy : x < 0 ? -dy : x == 0 ? 0.0 : x;
  case KILN_UNARY_EXP:
    return dy * exp(x);
  case KILN_UNARY_LOG:
    return dy / x;
  case KILN_UNARY_SQRT:
    return dy * 0.5 / sqrt(x);
  case KILN_UNARY_RELU:
    return x > 0 ? dy : isnan(x) ? x : 0.0;
  case KILN_UNARY_SIGMOID: {
    const double s = 1.0 / (1.0 + exp(-x));
    return dy * s * (1.0 - s);
  }
  case KILN_UNARY_TANH:
    return dy * (1.0 - tanh(x) * tanh(x));
  default:
    return NAN;
  }
}

/* Every unary op's derivative, flat and through the strided walk (x and dy
 * transposed views), with zeros, infinities and NaN among the x. */
START_TEST(test_unary_backward) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  enum { ROWS = 7, COLS = 5, N = ROWS * COLS };
  float x[N], dy[N];
  const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 2.5f, -3.75f, 0.125f, 20.0f};
  for (int i = 0; i < N; i++) {
    x[i] = i < (int)(sizeof special / sizeof special[0]) ? special[i] : 3.0f * rnd();
    dy[i] = rnd();
  }
  const int64_t shape[2] = {ROWS, COLS};
  for (size_t d = 0; d < nd; d++) {
    const char *sel = kiln_device_selector(devices[d]);
    kiln_tensor_t *tx = upload(devices[d], 2, shape, x), *tdy = upload(devices[d], 2, shape, dy);
    kiln_tensor_t *tx_t = NULL, *tdy_t = NULL;
    KT_OK(kiln_tensor_transpose(tx, 0, 1, &tx_t));
    KT_OK(kiln_tensor_transpose(tdy, 0, 1, &tdy_t));
    for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
      /* sigmoid and tanh saturate in float (1 - s rounds to 0 at x = 20):
       * their error scales with dy, not with the tiny exact gradient. */
      const bool saturates = op == KILN_UNARY_SIGMOID || op == KILN_UNARY_TANH;
      double want[N], want_t[N], mag[N], mag_t[N];
      for (int i = 0; i < N; i++) {
        want[i] = unary_grad_ref((kiln_unary_op_t)op, x[i], dy[i]);
        mag[i] = fabs(want[i]) + (saturates ? fabs(dy[i]) : 0.0);
      }
      /* out[c][r] = f'(x[r][c]) * dy[r][c] for the [COLS, ROWS] transposes */
      for (int c = 0; c < COLS; c++)
        for (int r = 0; r < ROWS; r++) {
          want_t[c * ROWS + r] = want[r * COLS + c];
          mag_t[c * ROWS + r] = mag[r * COLS + c];
        }
      kiln_tensor_t *out = NULL;
      KT_OK(kiln_tensor_unary_backward((kiln_unary_op_t)op, tx, tdy, &out));
      float *got = download(out);
      char what[64];
      snprintf(what, sizeof what, "unary_backward(%d) flat", op);
      check_close(what, sel, got, want, mag, N, 4e-6, 1e-30);
      free(got);
      kiln_tensor_release(out);
      KT_OK(kiln_tensor_unary_backward((kiln_unary_op_t)op, tx_t, tdy_t, &out));
      got = download(out);
      snprintf(what, sizeof what, "unary_backward(%d) strided", op);
      check_close(what, sel, got, want_t, mag_t, N, 4e-6, 1e-30);
      free(got);
      kiln_tensor_release(out);
    }
    kiln_tensor_release(tx_t);
    kiln_tensor_release(tdy_t);
    kiln_tensor_release(tx);
    kiln_tensor_release(tdy);
  }
  release_all(devices, nd);
}
END_TEST

/* ---- softmax_backward and cross_entropy_backward ---------------------------------------- */

START_TEST(test_softmax_backward) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  const int64_t shapes[][2] = {{1, 1}, {3, 7}, {2, 300}, {5, 1031}, {67, 3}};
  for (size_t d = 0; d < nd; d++) {
    const char *sel = kiln_device_selector(devices[d]);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      const int64_t rows = shapes[si][0], cols = shapes[si][1], n = rows * cols;
      for (int log = 0; log < 2; log++) {
        /* y: the forward's result of random logits, computed here. */
        float *y = random_array(n), *dy = random_array(n);
        for (int64_t r = 0; r < rows; r++) {
          double m = -INFINITY, sum = 0;
          for (int64_t c = 0; c < cols; c++) m = fmax(m, 4.0 * y[r * cols + c]);
          for (int64_t c = 0; c < cols; c++) sum += exp(4.0 * y[r * cols + c] - m);
          for (int64_t c = 0; c < cols; c++) {
            const double v = 4.0 * y[r * cols + c] - m;
            y[r * cols + c] = (float)(log ? v - log1p(sum - 1.0) : exp(v) / sum);
          }
        }
        double *want = malloc((size_t)n * sizeof(double)), *mag = malloc((size_t)n * sizeof(double));
        for (int64_t r = 0; r < rows; r++) {
          double s = 0, sabs = 0;
          for (int64_t c = 0; c < cols; c++) {
            const double t = log ? dy[r * cols + c] : (double)dy[r * cols + c] * y[r * cols + c];
            s += t;
            sabs += fabs(t);
          }
          for (int64_t c = 0; c < cols; c++) {
            const int64_t i = r * cols + c;
            if (log) {
              want[i] = dy[i] - exp(y[i]) * s;
              mag[i] = fabs(dy[i]) + exp(y[i]) * sabs;
            } else {
              want[i] = y[i] * (dy[i] - s);
              mag[i] = fabs(y[i]) * (fabs(dy[i]) + sabs);
            }
          }
        }
        const int64_t shape[2] = {rows, cols};
        kiln_tensor_t *ty = upload(devices[d], 2, shape, y), *tdy = upload(devices[d], 2, shape, dy), *out = NULL;
        KT_OK(kiln_tensor_softmax_backward(ty, tdy, log != 0, &out));
        float *got = download(out);
        char what[96];
        snprintf(what, sizeof what, "softmax_backward(%s) [%lld, %lld]", log ? "log" : "softmax", (long long)rows,
                 (long long)cols);
        check_close(what, sel, got, want, mag, n, 1e-5, 1e-30);
        free(got);
        free(want);
        free(mag);
        free(y);
        free(dy);
        kiln_tensor_release(out);
        kiln_tensor_release(ty);
        kiln_tensor_release(tdy);
      }
    }
  }
  release_all(devices, nd);
}
END_TEST

/* With and without dloss; labels out of range (-1 and c) give NaN rows. */
START_TEST(test_cross_entropy_backward) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  const int64_t shapes[][2] = {{1, 1}, {4, 10}, {5, 513}, {3, 2}};
  for (size_t d = 0; d < nd; d++) {
    const char *sel = kiln_device_selector(devices[d]);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      const int64_t n = shapes[si][0], c = shapes[si][1];
      float *logits = random_array(n * c);
      for (int64_t i = 0; i < n * c; i++) logits[i] *= 6.0f;
      int32_t *labels = malloc((size_t)n * sizeof(int32_t));
      for (int64_t r = 0; r < n; r++) labels[r] = (int32_t)((r * 7 + 3) % c);
      if (n >= 3) {
        labels[1] = -1;
        labels[2] = (int32_t)c;
      }
      const int64_t shape[2] = {n, c};
      kiln_tensor_t *tl = upload(devices[d], 2, shape, logits), *tb = NULL;
      KT_OK(kiln_tensor_from_host(devices[d], KILN_I32, 1, &n, labels, &tb));
      for (int with = 0; with < 2; with++) {
        const float dloss = with ? -0.625f : 1.0f;
        double *want = malloc((size_t)(n * c) * sizeof(double)), *mag = malloc((size_t)(n * c) * sizeof(double));
        for (int64_t r = 0; r < n; r++) {
          double m = -INFINITY, sum = 0;
          for (int64_t j = 0; j < c; j++) m = fmax(m, logits[r * c + j]);
          for (int64_t j = 0; j < c; j++) sum += exp(logits[r * c + j] - m);
          for (int64_t j = 0; j < c; j++) {
            const double p = exp(logits[r * c + j] - m) / sum;
            const bool bad = labels[r] < 0 || labels[r] >= c;
            want[r * c + j] = bad ? NAN : (p - (j == labels[r] ? 1.0 : 0.0)) / (double)n * dloss;
            mag[r * c + j] = (p + (j == labels[r] ? 1.0 : 0.0)) / (double)n * fabs(dloss);
          }
        }
        kiln_tensor_t *tdl = NULL, *out = NULL;
        const int64_t one = 1;
        if (with) tdl = upload(devices[d], 1, &one, &dloss);
        KT_OK(kiln_tensor_cross_entropy_backward(tl, tb, tdl, &out));
        float *got = download(out);
        char what[96];
        snprintf(what, sizeof what, "cross_entropy_backward [%lld, %lld]%s", (long long)n, (long long)c,
                 with ? " with dloss" : "");
        check_close(what, sel, got, want, mag, n * c, 1e-5, 1e-30);
        free(got);
        free(want);
        free(mag);
        kiln_tensor_release(out);
        kiln_tensor_release(tdl);
      }
      kiln_tensor_release(tl);
      kiln_tensor_release(tb);
      free(logits);
      free(labels);
    }
  }
  release_all(devices, nd);
}
END_TEST

/* ---- convolution ------------------------------------------------------------------------- */

typedef struct conv_case_t {
  int64_t n, c, h, w, k, r, s;
  int32_t stride[2], pad[2], dil[2];
} conv_case_t;

static int64_t conv_out(int64_t size, int32_t pad, int32_t dil, int64_t kernel, int32_t stride) {
  return (size + 2 * pad - dil * (kernel - 1) - 1) / stride + 1;
}

/* Awkward convolutions: batch 1, primes, strides and dilations on one axis
 * only, padding larger than half the kernel, 1x1 with and without stride,
 * strides longer than the kernel (inputs no window reads). */
static const conv_case_t conv_cases[] = {
    {1, 1, 5, 5, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}},   {2, 3, 7, 5, 4, 3, 2, {2, 1}, {1, 0}, {1, 2}},
    {3, 2, 11, 13, 5, 5, 3, {3, 2}, {3, 2}, {2, 1}}, {2, 5, 4, 3, 3, 1, 1, {1, 1}, {0, 0}, {1, 1}},
    {2, 3, 5, 5, 2, 1, 1, {2, 2}, {0, 0}, {1, 1}},   {1, 7, 13, 11, 3, 2, 3, {1, 3}, {0, 1}, {1, 1}},
    {2, 2, 9, 8, 3, 1, 2, {3, 4}, {0, 0}, {1, 1}},   {1, 3, 6, 6, 17, 3, 3, {1, 1}, {2, 2}, {2, 2}},
};

/* The gradients of one convolution in double: dx [n,c,h,w] and dw [k,c,r,s],
 * with the sums of the magnitudes of their terms. */
static void conv_backward_ref(const conv_case_t *cc, int64_t p, int64_t q, const float *x, const float *wt,
                              const float *dy, double *dx, double *dx_mag, double *dw, double *dw_mag) {
  const int64_t nx = cc->n * cc->c * cc->h * cc->w, nw = cc->k * cc->c * cc->r * cc->s;
  for (int64_t i = 0; i < nx; i++) dx[i] = dx_mag[i] = 0;
  for (int64_t i = 0; i < nw; i++) dw[i] = dw_mag[i] = 0;
  for (int64_t b = 0; b < cc->n; b++)
    for (int64_t kk = 0; kk < cc->k; kk++)
      for (int64_t pp = 0; pp < p; pp++)
        for (int64_t qq = 0; qq < q; qq++) {
          const double g = dy[((b * cc->k + kk) * p + pp) * q + qq];
          for (int64_t ch = 0; ch < cc->c; ch++)
            for (int64_t ri = 0; ri < cc->r; ri++)
              for (int64_t si = 0; si < cc->s; si++) {
                const int64_t hh = pp * cc->stride[0] - cc->pad[0] + ri * cc->dil[0];
                const int64_t ww = qq * cc->stride[1] - cc->pad[1] + si * cc->dil[1];
                if (hh < 0 || hh >= cc->h || ww < 0 || ww >= cc->w) continue;
                const int64_t xi = ((b * cc->c + ch) * cc->h + hh) * cc->w + ww;
                const int64_t wi = ((kk * cc->c + ch) * cc->r + ri) * cc->s + si;
                dx[xi] += g * wt[wi];
                dx_mag[xi] += fabs(g * wt[wi]);
                dw[wi] += g * x[xi];
                dw_mag[wi] += fabs(g * x[xi]);
              }
        }
}

static void run_conv_cases(kiln_device_t **devices, size_t nd, const conv_case_t *cases, size_t count) {
  for (size_t d = 0; d < nd; d++) {
    const char *sel = kiln_device_selector(devices[d]);
    for (size_t ci = 0; ci < count; ci++) {
      const conv_case_t *cc = &cases[ci];
      const int64_t p = conv_out(cc->h, cc->pad[0], cc->dil[0], cc->r, cc->stride[0]);
      const int64_t q = conv_out(cc->w, cc->pad[1], cc->dil[1], cc->s, cc->stride[1]);
      const int64_t xs[4] = {cc->n, cc->c, cc->h, cc->w}, ws[4] = {cc->k, cc->c, cc->r, cc->s};
      const int64_t ys[4] = {cc->n, cc->k, p, q};
      const int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
      const int64_t ny = ys[0] * ys[1] * ys[2] * ys[3];
      float *x = random_array(nx), *wt = random_array(nw), *dy = random_array(ny);
      double *dx = malloc((size_t)(nx ? nx : 1) * sizeof(double)),
             *dxm = malloc((size_t)(nx ? nx : 1) * sizeof(double));
      double *dw = malloc((size_t)(nw ? nw : 1) * sizeof(double)),
             *dwm = malloc((size_t)(nw ? nw : 1) * sizeof(double));
      conv_backward_ref(cc, p, q, x, wt, dy, dx, dxm, dw, dwm);
      kiln_tensor_t *tx = upload(devices[d], 4, xs, x), *tw = upload(devices[d], 4, ws, wt);
      kiln_tensor_t *tdy = upload(devices[d], 4, ys, dy), *out = NULL;
      const kiln_conv2d_params_t params = {
          {cc->stride[0], cc->stride[1]}, {cc->pad[0], cc->pad[1]}, {cc->dil[0], cc->dil[1]}};
      char desc[160], what[200];
      snprintf(desc, sizeof desc, "x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] stride %dx%d pad %dx%d dil %dx%d",
               (long long)xs[0], (long long)xs[1], (long long)xs[2], (long long)xs[3], (long long)ws[0],
               (long long)ws[1], (long long)ws[2], (long long)ws[3], cc->stride[0], cc->stride[1], cc->pad[0],
               cc->pad[1], cc->dil[0], cc->dil[1]);
      snprintf(what, sizeof what, "conv2d_backward_input %s", desc);
      KT_OK(kiln_tensor_conv2d_backward_input(tdy, tw, xs, &params, &out));
      float *got = download(out);
      check_close(what, sel, got, dx, dxm, nx, 2e-6, 1e-30);
      free(got);
      kiln_tensor_release(out);
      snprintf(what, sizeof what, "conv2d_backward_weight %s", desc);
      KT_OK(kiln_tensor_conv2d_backward_weight(tx, tdy, ws, &params, &out));
      got = download(out);
      check_close(what, sel, got, dw, dwm, nw, 2e-6, 1e-30);
      free(got);
      kiln_tensor_release(out);
      kiln_tensor_release(tx);
      kiln_tensor_release(tw);
      kiln_tensor_release(tdy);
      free(x);
      free(wt);
      free(dy);
      free(dx);
      free(dxm);
      free(dw);
      free(dwm);
    }
  }
}

/* Each device's own GEMM path, then the packed one (CPUs') and the tiled one
 * (GPUs') forced, so that every device runs the kernels of both. */
START_TEST(test_conv2d_backward) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  path_fn gemm_path = gemm_path_export();
  for (int path = 0; path <= 2; path++) {
    gemm_path(path);
    run_conv_cases(devices, nd, conv_cases, sizeof conv_cases / sizeof conv_cases[0]);
  }
  gemm_path(0);
  release_all(devices, nd);
}
END_TEST

/* Shapes larger than a GEMM tile on PoCL (Oclgrind runs the small ones only). */
START_TEST(test_conv2d_backward_larger) {
  kiln_device_t *devices[16];
  size_t nd = opencl_devices(devices, 16), kept = 0;
  for (size_t d = 0; d < nd; d++) {
    if (is_simulator(devices[d]))
      kiln_device_release(devices[d]);
    else
      devices[kept++] = devices[d];
  }
  static const conv_case_t larger[] = {
      {2, 6, 14, 14, 16, 5, 5, {1, 1}, {0, 0}, {1, 1}},  /* LeNet's second layer */
      {3, 19, 17, 23, 37, 3, 3, {1, 1}, {1, 1}, {1, 1}}, /* primes past the 8x16 blocks */
      {1, 9, 31, 29, 70, 3, 3, {2, 2}, {1, 1}, {1, 1}},
  };
  run_conv_cases(devices, kept, larger, sizeof larger / sizeof larger[0]);
  release_all(devices, kept);
}
END_TEST

/* The same convolutions in rounds of one or two images (a budget of a few
 * kilobytes): dW summed over rounds, dx written round by round. */
START_TEST(test_conv2d_backward_rounds) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  budget_fn budget = scratch_budget_export();
  static const conv_case_t batched[] = {
      {5, 3, 7, 5, 4, 3, 2, {2, 1}, {1, 0}, {1, 2}},
      {4, 5, 4, 3, 3, 1, 1, {1, 1}, {0, 0}, {1, 1}},
      {3, 2, 11, 13, 5, 5, 3, {3, 2}, {3, 2}, {2, 1}},
  };
  path_fn gemm_path = gemm_path_export();
  for (int path = 1; path <= 2; path++) {
    gemm_path(path);
    budget(1);
    run_conv_cases(devices, nd, batched, sizeof batched / sizeof batched[0]);
    budget(6000);
    run_conv_cases(devices, nd, batched, sizeof batched / sizeof batched[0]);
  }
  budget(0);
  gemm_path(0);
  release_all(devices, nd);
}
END_TEST

/* No filters: dx is zeros. No images: dW is zeros. */
START_TEST(test_conv2d_backward_empty) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  for (size_t d = 0; d < nd; d++) {
    const int64_t ws[4] = {0, 3, 3, 3}, dys[4] = {2, 0, 5, 5}, xs[4] = {2, 3, 7, 7};
    const kiln_conv2d_params_t params = kiln_conv2d_params_default();
    kiln_tensor_t *tw = NULL, *tdy = NULL, *out = NULL;
    KT_OK(kiln_tensor_empty(devices[d], KILN_F32, 4, ws, &tw));
    KT_OK(kiln_tensor_empty(devices[d], KILN_F32, 4, dys, &tdy));
    KT_OK(kiln_tensor_conv2d_backward_input(tdy, tw, xs, &params, &out));
    float *got = download(out);
    for (int64_t i = 0; i < kiln_tensor_numel(out); i++) ck_assert_float_eq(got[i], 0.0f);
    free(got);
    kiln_tensor_release(out);
    kiln_tensor_release(tw);
    kiln_tensor_release(tdy);
    const int64_t xs0[4] = {0, 3, 7, 7}, dys0[4] = {0, 4, 5, 5}, ws4[4] = {4, 3, 3, 3};
    kiln_tensor_t *tx = NULL;
    KT_OK(kiln_tensor_empty(devices[d], KILN_F32, 4, xs0, &tx));
    KT_OK(kiln_tensor_empty(devices[d], KILN_F32, 4, dys0, &tdy));
    KT_OK(kiln_tensor_conv2d_backward_weight(tx, tdy, ws4, &params, &out));
    got = download(out);
    ck_assert_int_eq(kiln_tensor_numel(out), 108);
    for (int64_t i = 0; i < kiln_tensor_numel(out); i++) ck_assert_float_eq(got[i], 0.0f);
    free(got);
    kiln_tensor_release(out);
    kiln_tensor_release(tx);
    kiln_tensor_release(tdy);
  }
  release_all(devices, nd);
}
END_TEST

/* ---- max_pool2d_backward ------------------------------------------------------------------- */

typedef struct pool_case_t {
  int64_t n, c, h, w;
  int32_t kernel[2], stride[2], pad[2];
} pool_case_t;

START_TEST(test_max_pool2d_backward) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  static const pool_case_t cases[] = {
      {1, 1, 4, 4, {2, 2}, {2, 2}, {0, 0}}, {2, 3, 7, 5, {3, 3}, {1, 1}, {1, 1}}, {1, 2, 9, 11, {3, 2}, {2, 3}, {1, 1}},
      {2, 1, 5, 6, {2, 3}, {1, 2}, {0, 1}}, {1, 1, 1, 1, {1, 1}, {1, 1}, {0, 0}}, {3, 2, 13, 7, {5, 3}, {2, 1}, {2, 1}},
      {2, 2, 11, 10, {2, 3}, {3, 3}, {1, 1}}, /* windows apart: some cells in none */
  };
  for (size_t d = 0; d < nd; d++) {
    const char *sel = kiln_device_selector(devices[d]);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
      const pool_case_t *pc = &cases[ci];
      const int64_t p = (pc->h + 2 * pc->pad[0] - pc->kernel[0]) / pc->stride[0] + 1;
      const int64_t q = (pc->w + 2 * pc->pad[1] - pc->kernel[1]) / pc->stride[1] + 1;
      const int64_t planes = pc->n * pc->c, nx = planes * pc->h * pc->w, ny = planes * p * q;
      /* Few distinct values, so windows tie; a NaN or two and -inf. */
      float *x = malloc((size_t)nx * sizeof(float)), *dy = random_array(ny);
      for (int64_t i = 0; i < nx; i++) x[i] = (float)(int)(rnd() * 3.0f);
      if (nx > 10) {
        x[3] = NAN;
        x[nx - 2] = NAN;
        x[nx / 2] = -INFINITY;
      }
      if (nx > 30)
        for (int64_t i = 20; i < 30; i++) x[i] = -INFINITY;
      double *want = calloc((size_t)nx, sizeof(double)), *mag = calloc((size_t)nx, sizeof(double));
      for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t pp = 0; pp < p; pp++)
          for (int64_t qq = 0; qq < q; qq++) {
            int64_t best = -1;
            for (int64_t a = pp * pc->stride[0] - pc->pad[0]; a < pp * pc->stride[0] - pc->pad[0] + pc->kernel[0]; a++)
              for (int64_t b = qq * pc->stride[1] - pc->pad[1]; b < qq * pc->stride[1] - pc->pad[1] + pc->kernel[1];
                   b++) {
                if (a < 0 || a >= pc->h || b < 0 || b >= pc->w) continue;
                const int64_t i = (pl * pc->h + a) * pc->w + b;
                if (best < 0) {
                  best = i;
                  continue;
                }
                const float v = x[i], m = x[best];
                if (!isnan(m) && (isnan(v) || v > m)) best = i;
              }
            ck_assert_int_ge(best, 0);
            const double g = dy[(pl * p + pp) * q + qq];
            want[best] += g;
            mag[best] += fabs(g);
          }
      const int64_t xs[4] = {pc->n, pc->c, pc->h, pc->w}, ys[4] = {pc->n, pc->c, p, q};
      kiln_tensor_t *tx = upload(devices[d], 4, xs, x), *tdy = upload(devices[d], 4, ys, dy), *out = NULL;
      const kiln_pool2d_params_t params = {
          {pc->kernel[0], pc->kernel[1]}, {pc->stride[0], pc->stride[1]}, {pc->pad[0], pc->pad[1]}};
      KT_OK(kiln_tensor_max_pool2d_backward(tx, tdy, &params, &out));
      float *got = download(out);
      char what[128];
      snprintf(what, sizeof what, "max_pool2d_backward [%lld,%lld,%lld,%lld] kernel %dx%d stride %dx%d pad %dx%d",
               (long long)xs[0], (long long)xs[1], (long long)xs[2], (long long)xs[3], pc->kernel[0], pc->kernel[1],
               pc->stride[0], pc->stride[1], pc->pad[0], pc->pad[1]);
      check_close(what, sel, got, want, mag, nx, 1e-6, 1e-30);
      free(got);
      free(want);
      free(mag);
      free(x);
      free(dy);
      kiln_tensor_release(out);
      kiln_tensor_release(tx);
      kiln_tensor_release(tdy);
    }
  }
  release_all(devices, nd);
}
END_TEST

/* ---- updates in place ------------------------------------------------------------------------ */

/* The updated values are O(0.01) to O(1) from inputs in [-1, 1): a floor of
 * 0.05 under the scale absorbs float's cancellation in the momentum sums and
 * still tells a wrong coefficient (off by far more) from rounding. */
static void check_tensor(const char *what, const char *sel, const kiln_tensor_t *t, const double *want, int64_t n) {
  float *got = download(t);
  double *mag = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++) mag[i] = fabs(want[i]) + 0.05;
  check_close(what, sel, got, want, mag, n, 3e-6, 1e-30);
  free(mag);
  free(got);
}

START_TEST(test_updates) {
  kiln_device_t *devices[16];
  const size_t nd = opencl_devices(devices, 16);
  const int64_t sizes[] = {1, 37, 64, 4099};
  for (size_t d = 0; d < nd; d++) {
    const char *sel = kiln_device_selector(devices[d]);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
      const int64_t n = sizes[si];
      float *p0 = random_array(n), *g0 = random_array(n), *g1 = random_array(n);
      double *p = malloc((size_t)n * sizeof(double)), *b = malloc((size_t)n * sizeof(double));
      double *v = malloc((size_t)n * sizeof(double));
      char what[96];

      /* accumulate, twice, with every provider the device lists for it */
      kiln_tensor_t *tg = upload(devices[d], 1, &n, g0), *tg1 = upload(devices[d], 1, &n, g1);
      for (int64_t i = 0; i < n; i++) p[i] = ((double)p0[i] + g0[i]) - 0.375 * g1[i];
      char providers[128];
      snprintf(providers, sizeof providers, "%s", kiln_device_providers(devices[d], "accumulate"));
      for (char *save = NULL, *provider = strtok_r(providers, ",", &save); provider;
           provider = strtok_r(NULL, ",", &save)) {
        char overrides[160];
        snprintf(overrides, sizeof overrides, "accumulate=%s", provider);
        KT_OK(kiln_set_providers(overrides));
        kiln_tensor_t *tp = upload(devices[d], 1, &n, p0);
        KT_OK(kiln_tensor_accumulate(tp, 1.0, tg));
        ck_assert_str_eq(kiln_last_provider(), provider);
        KT_OK(kiln_tensor_accumulate(tp, -0.375, tg1));
        snprintf(what, sizeof what, "accumulate (%s) n=%lld", provider, (long long)n);
        check_tensor(what, sel, tp, p, n);
        kiln_tensor_release(tp);
      }
      KT_OK(kiln_set_providers(""));

      /* SGD: plain with weight decay; momentum with dampening; nesterov. Two steps each. */
      const kiln_sgd_params_t sgd[] = {
          {0.1, 0.0, 0.0, 0.01, false, false},
          {0.05, 0.9, 0.25, 0.0, false, false},
          {0.02, 0.8, 0.0, 0.005, true, false},
      };
      for (size_t k = 0; k < sizeof sgd / sizeof sgd[0]; k++) {
        const kiln_sgd_params_t sp = sgd[k];
        const float lr = (float)sp.lr, mom = (float)sp.momentum, damp = (float)sp.dampening,
                    wd = (float)sp.weight_decay;
        kiln_tensor_t *tp = upload(devices[d], 1, &n, p0), *tb = NULL;
        if (sp.momentum > 0) KT_OK(kiln_tensor_zeros(devices[d], KILN_F32, 1, &n, &tb));
        for (int64_t i = 0; i < n; i++) {
          p[i] = p0[i];
          b[i] = 0;
        }
        for (int step = 0; step < 2; step++) {
          const float *gs = step ? g1 : g0;
          KT_OK(kiln_tensor_sgd_update(tp, step ? tg1 : tg, tb, &sp));
          for (int64_t i = 0; i < n; i++) {
            const double g = gs[i] + (double)wd * p[i];
            b[i] = sp.momentum > 0 ? mom * b[i] + (1.0 - damp) * g : g;
            p[i] -= lr * (sp.nesterov ? g + mom * b[i] : b[i]);
          }
        }
        snprintf(what, sizeof what, "sgd_update #%zu n=%lld", k, (long long)n);
        check_tensor(what, sel, tp, p, n);
        if (tb) {
          snprintf(what, sizeof what, "sgd_update #%zu momentum buffer n=%lld", k, (long long)n);
          check_tensor(what, sel, tb, b, n);
        }
        kiln_tensor_release(tp);
        kiln_tensor_release(tb);
      }

      /* Adam, three steps, with and without weight decay. */
      for (int k = 0; k < 2; k++) {
        const kiln_adam_params_t ap = {0.01, 0.9, 0.999, 1e-8, k ? 0.1 : 0.0};
        kiln_tensor_t *tp = upload(devices[d], 1, &n, p0), *tm = NULL, *tv = NULL;
        KT_OK(kiln_tensor_zeros(devices[d], KILN_F32, 1, &n, &tm));
        KT_OK(kiln_tensor_zeros(devices[d], KILN_F32, 1, &n, &tv));
        for (int64_t i = 0; i < n; i++) {
          p[i] = p0[i];
          b[i] = v[i] = 0;
        }
        /* torch.optim.Adam in float64, from the caller's values (1 - beta of
         * the float beta would be off by 1.3e-5 relative at 0.999). */
        const double b1 = ap.beta1, b2 = ap.beta2, eps = ap.eps, lr = ap.lr;
        const double wd = ap.weight_decay;
        for (int step = 1; step <= 3; step++) {
          const float *gs = step == 2 ? g1 : g0;
          KT_OK(kiln_tensor_adam_update(tp, step == 2 ? tg1 : tg, tm, tv, step, &ap));
          const double c1 = 1.0 - pow(ap.beta1, step), c2 = 1.0 - pow(ap.beta2, step);
          for (int64_t i = 0; i < n; i++) {
            const double g = gs[i] + wd * p[i];
            b[i] = b1 * b[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            p[i] -= lr * (b[i] / c1) / (sqrt(v[i] / c2) + eps);
          }
        }
        snprintf(what, sizeof what, "adam_update #%d n=%lld", k, (long long)n);
        check_tensor(what, sel, tp, p, n);
        snprintf(what, sizeof what, "adam_update #%d m n=%lld", k, (long long)n);
        check_tensor(what, sel, tm, b, n);
        snprintf(what, sizeof what, "adam_update #%d v n=%lld", k, (long long)n);
        check_tensor(what, sel, tv, v, n);
        kiln_tensor_release(tp);
        kiln_tensor_release(tm);
        kiln_tensor_release(tv);
      }
      kiln_tensor_release(tg);
      kiln_tensor_release(tg1);
      free(p0);
      free(g0);
      free(g1);
      free(p);
      free(b);
      free(v);
    }
  }
  release_all(devices, nd);
}
END_TEST

/* Whether an OpenCL device is visible, asked in a child process: OpenCL
 * drivers start threads that a fork of the suite's runner would not carry. */
static bool opencl_visible(char *why, size_t size) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    char reason[512] = "no OpenCL device is visible";
    size_t n = 0, count = 0;
    if (kiln_ensure_initialized() == KILN_OK && kiln_device_count(&count) == KILN_OK) {
      for (size_t i = 0; i < count; i++) {
        kiln_device_t *d = NULL;
        kiln_device_info_t info;
        if (kiln_device_get(i, &d) != KILN_OK) continue;
        if (kiln_device_info(d, &info) == KILN_OK && !strcmp(info.backend, "opencl")) n++;
        kiln_device_release(d);
      }
    } else {
      snprintf(reason, sizeof reason, "kiln did not start: %s", kiln_last_error());
    }
    if (write(fds[1], reason, strlen(reason) + 1) < 0) _exit(2);
    _exit(n ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], why, size - 1);
  why[got > 0 ? got : 0] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
  const char *cache_dir = kt_private_cache_dir();
  /* PoCL's own kernel cache goes there too: the suite writes nothing outside. */
  if (cache_dir && !getenv("POCL_CACHE_DIR")) {
    char pocl[4200];
    snprintf(pocl, sizeof pocl, "%s/pocl", cache_dir);
    setenv("POCL_CACHE_DIR", pocl, 1);
  }
  char why[512];
  if (!opencl_visible(why, sizeof why)) {
    printf("skipped: %s\n", why);
    return 77;
  }
  Suite *suite = suite_create("opencl-train");
  TCase *grads = tcase_create("gradients");
  tcase_set_timeout(grads, 600);
  tcase_add_test(grads, test_unary_backward);
  tcase_add_test(grads, test_softmax_backward);
  tcase_add_test(grads, test_cross_entropy_backward);
  tcase_add_test(grads, test_max_pool2d_backward);
  suite_add_tcase(suite, grads);
  TCase *conv = tcase_create("conv");
  tcase_set_timeout(conv, 600);
  tcase_add_test(conv, test_conv2d_backward);
  tcase_add_test(conv, test_conv2d_backward_larger);
  tcase_add_test(conv, test_conv2d_backward_rounds);
  tcase_add_test(conv, test_conv2d_backward_empty);
  suite_add_tcase(suite, conv);
  TCase *updates = tcase_create("updates");
  tcase_set_timeout(updates, 600);
  tcase_add_test(updates, test_updates);
  suite_add_tcase(suite, updates);
  return kt_run_suite(suite);
}
