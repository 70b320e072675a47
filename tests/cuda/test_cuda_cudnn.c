/* tests/cuda/test_cuda_cudnn.c: the cudnn rows' host side: a cuDNN that cannot serve never fails an op (absent with its reason when its checks fail at load, falling back to native when it fails at run time), and one that serves gets consistent arguments; skipped (77) without a CUDA device. */
/*
 * Run with tests/cuda/fake-cudnn first on LD_LIBRARY_PATH and
 * KILN_FAKE_CUDNN_FAIL saying how it behaves (meson sets both):
 *   cnn     cudnnCnnVersionCheck fails (a half-installed cuDNN): devinfo's
 *           `cudnn` property says absent and why, and no op has a cudnn
 *           provider;
 *   create  cudnnCreate fails at the first op: under the default policy the
 *           op runs native (never an error), and so does every later one;
 *   none    the fake serves (computing nothing): the forward and gradient
 *           rows run cudnn, and the fake finds their descriptors, algorithm
 *           and workspace consistent with each other (it counts the calls
 *           that were); max_pool2d_backward, which has no cudnn row, runs
 *           native; conv2d with a bias runs cudnn in f32, f64, f16 and bf16
 *           with the descriptors' data and compute types of the dtype, TF32
 *           skipped in f32 only, and a 16-bit y that holds the bias before
 *           cuDNN adds to it (beta 1; the fake adds nothing, so y is the
 *           bias).
 * Without cuDNN serving, the gradients' values are checked against the
 * host's, in double.
 */
#include <dlfcn.h>
#include <math.h>

#include "../common.h"

static kiln_device_t *gpu;

static const char *property(const char *key) {
  for (size_t i = 0; i < kiln_device_property_count(gpu); i++) {
    const char *k, *v;
    if (kiln_device_property(gpu, i, &k, &v) == KILN_OK && !strcmp(k, key)) return v;
  }
  return NULL;
}

/* A small conv2d (and max_pool2d) on the GPU under the default policy, checked
 * against the CPU: it must succeed whatever cuDNN does. */
static void conv_runs(const char **out_conv_provider, const char **out_pooling_provider) {
  const int64_t xs[4] = {1, 2, 7, 6}, ws[4] = {3, 2, 3, 3};
  float x[1 * 2 * 7 * 6], w[3 * 2 * 3 * 3];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)((i * 7) % 11) / 4.0f - 1.0f;
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = (float)((i * 5) % 9) / 8.0f - 0.5f;
  kiln_conv2d_params_t params = {{1, 1}, {1, 1}, {1, 1}};
  kiln_pool2d_params_t pool = {{2, 2}, {2, 2}, {0, 0}};
  float got[3 * 7 * 6], want[3 * 7 * 6], pgot[2 * 3 * 3], pwant[2 * 3 * 3];
  for (int side = 0; side < 2; side++) {
    kiln_device_t *dev = side == 0 ? gpu : NULL;
    if (side == 1) KT_OK(kiln_device_find("cpu:0", &dev));
    kiln_tensor_t *tx, *tw, *ty, *tp;
    KT_OK(kiln_tensor_from_host(dev, KILN_F32, 4, xs, x, &tx));
    KT_OK(kiln_tensor_from_host(dev, KILN_F32, 4, ws, w, &tw));
    KT_OK(kiln_tensor_conv2d(tx, tw, NULL, &params, &ty));
    if (side == 0) *out_conv_provider = kiln_last_provider();
    KT_OK(kiln_tensor_max_pool2d(tx, &pool, &tp));
    if (side == 0) *out_pooling_provider = kiln_last_provider();
    KT_OK(kiln_tensor_read(ty, side == 0 ? got : want, sizeof got));
    KT_OK(kiln_tensor_read(tp, side == 0 ? pgot : pwant, sizeof pgot));
    kiln_tensor_release(tx);
    kiln_tensor_release(tw);
    kiln_tensor_release(ty);
    kiln_tensor_release(tp);
  }
  for (size_t i = 0; i < sizeof got / sizeof got[0]; i++)
    ck_assert_msg(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])), "conv2d [%zu] %g vs %g", i, got[i],
                  want[i]);
  ck_assert_int_eq(memcmp(pgot, pwant, sizeof pgot), 0);
}

/* The gradients: those with a cudnn row (conv2d_backward_input and _weight,
 * softmax_backward) and max_pool2d_backward. */
enum { GRADIENTS = 4 };
static const char *const gradient_ops[GRADIENTS] = {"conv2d_backward_input", "conv2d_backward_weight",
                                                    "softmax_backward", "max_pool2d_backward"};

static void read_tensor(kiln_tensor_t *t, float *out, size_t count) {
  KT_OK(kiln_tensor_read(t, out, count * sizeof *out));
  kiln_tensor_release(t);
}

static void expect_close(const char *what, const float *got, const double *want, size_t count) {
  for (size_t i = 0; i < count; i++)
    ck_assert_msg(fabs((double)got[i] - want[i]) <= 1e-5 * (1.0 + fabs(want[i])), "%s [%zu] %g vs %g", what, i,
                  (double)got[i], want[i]);
}

/* Each gradient once on the GPU under the default policy, its provider into
 * out_providers (in gradient_ops' order); with `check`, the values against
 * the host's. The convolution is x [1, 2, 7, 6] by w [3, 2, 3, 3], stride 1,
 * padding 1; the softmax's rows [4, 5]; the pooling 2x2 of stride 2 over x. */
static void gradients_run(bool check, const char *out_providers[GRADIENTS]) {
  enum { C = 2, H = 7, W = 6, K = 3, R = 3, S = 3, ROWS = 4, COLS = 5, P2 = 3, Q2 = 3 };
  const int64_t xs[4] = {1, C, H, W}, ws[4] = {K, C, R, S}, ys[4] = {1, K, H, W}, ss[2] = {ROWS, COLS};
  const int64_t ps[4] = {1, C, P2, Q2};
  float x[C * H * W], w[K * C * R * S], dy[K * H * W], sx[ROWS * COLS], sdy[ROWS * COLS], pdy[C * P2 * Q2];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)((i * 7) % 11) / 4.0f - 1.0f + (float)i / 512.0f;
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = (float)((i * 5) % 9) / 8.0f - 0.5f;
  for (size_t i = 0; i < sizeof dy / sizeof dy[0]; i++) dy[i] = (float)((i * 3) % 13) / 8.0f - 0.75f;
  for (size_t i = 0; i < sizeof sx / sizeof sx[0]; i++) sx[i] = (float)((i * 11) % 17) / 4.0f - 2.0f;
  for (size_t i = 0; i < sizeof sdy / sizeof sdy[0]; i++) sdy[i] = (float)((i * 5) % 7) / 4.0f - 0.5f;
  for (size_t i = 0; i < sizeof pdy / sizeof pdy[0]; i++) pdy[i] = (float)(i + 1) / 16.0f;
  kiln_conv2d_params_t params = {{1, 1}, {1, 1}, {1, 1}};
  kiln_pool2d_params_t pool = {{2, 2}, {2, 2}, {0, 0}};
  kiln_tensor_t *tx, *tw, *tdy, *tsx, *tsy, *tsdy, *tpdy, *out;
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 4, xs, x, &tx));
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 4, ws, w, &tw));
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 4, ys, dy, &tdy));
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 2, ss, sx, &tsx));
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 2, ss, sdy, &tsdy));
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 4, ps, pdy, &tpdy));
  KT_OK(kiln_tensor_softmax(tsx, &tsy));

  float dx[C * H * W], dw[K * C * R * S], sy[ROWS * COLS], sdx[ROWS * COLS], pdx[C * H * W];
  KT_OK(kiln_tensor_conv2d_backward_input(tdy, tw, xs, &params, &out));
  out_providers[0] = kiln_last_provider();
  read_tensor(out, dx, sizeof dx / sizeof dx[0]);
  KT_OK(kiln_tensor_conv2d_backward_weight(tx, tdy, ws, &params, &out));
  out_providers[1] = kiln_last_provider();
  read_tensor(out, dw, sizeof dw / sizeof dw[0]);
  KT_OK(kiln_tensor_softmax_backward(tsy, tsdy, false, &out));
  out_providers[2] = kiln_last_provider();
  read_tensor(out, sdx, sizeof sdx / sizeof sdx[0]);
  KT_OK(kiln_tensor_max_pool2d_backward(tx, tpdy, &pool, &out));
  out_providers[3] = kiln_last_provider();
  read_tensor(out, pdx, sizeof pdx / sizeof pdx[0]);
  KT_OK(kiln_tensor_read(tsy, sy, sizeof sy));
  kiln_tensor_release(tx);
  kiln_tensor_release(tw);
  kiln_tensor_release(tdy);
  kiln_tensor_release(tsx);
  kiln_tensor_release(tsy);
  kiln_tensor_release(tsdy);
  kiln_tensor_release(tpdy);
  if (!check) return;

  double want_dx[C * H * W] = {0}, want_dw[K * C * R * S] = {0}, want_sdx[ROWS * COLS], want_pdx[C * H * W] = {0};
  /* y[k][p][q] = sum over c, ri, si of w[k][c][ri][si] * x[c][p - 1 + ri][q - 1 + si]. */
  for (int k = 0; k < K; k++)
    for (int c = 0; c < C; c++)
      for (int ri = 0; ri < R; ri++)
        for (int si = 0; si < S; si++)
          for (int p = 0; p < H; p++)
            for (int q = 0; q < W; q++) {
              const int hh = p - 1 + ri, ww = q - 1 + si;
              if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
              const double g = dy[(k * H + p) * W + q];
              want_dx[(c * H + hh) * W + ww] += g * w[((k * C + c) * R + ri) * S + si];
              want_dw[((k * C + c) * R + ri) * S + si] += g * x[(c * H + hh) * W + ww];
            }
  for (int r = 0; r < ROWS; r++) {
    double sum = 0;
    for (int i = 0; i < COLS; i++) sum += (double)sdy[r * COLS + i] * sy[r * COLS + i];
    for (int i = 0; i < COLS; i++) want_sdx[r * COLS + i] = sy[r * COLS + i] * (sdy[r * COLS + i] - sum);
  }
  /* x's values are distinct: each window's gradient goes to its maximum. */
  for (int c = 0; c < C; c++)
    for (int p = 0; p < P2; p++)
      for (int q = 0; q < Q2; q++) {
        int best = -1;
        for (int i = 0; i < 2; i++)
          for (int j = 0; j < 2; j++) {
            const int at = (c * H + 2 * p + i) * W + 2 * q + j;
            if (best < 0 || x[at] > x[best]) best = at;
          }
        want_pdx[best] += pdy[(c * P2 + p) * Q2 + q];
      }
  expect_close("conv2d_backward_input", dx, want_dx, sizeof dx / sizeof dx[0]);
  expect_close("conv2d_backward_weight", dw, want_dw, sizeof dw / sizeof dw[0]);
  expect_close("softmax_backward", sdx, want_sdx, sizeof sdx / sizeof sdx[0]);
  expect_close("max_pool2d_backward", pdx, want_pdx, sizeof pdx / sizeof pdx[0]);
}

/* Whether the device lists cudnn among op's providers. */
static bool lists_cudnn(const char *op) {
  const char *providers = kiln_device_providers(gpu, op);
  return providers && strstr(providers, "cudnn") != NULL;
}

START_TEST(test_incomplete_cudnn_is_absent) {
  const char *state = property("cudnn");
  ck_assert_msg(state && !strncmp(state, "absent: ", 8), "cudnn property '%s'", state ? state : "(missing)");
  ck_assert_msg(strstr(state, "cudnnCnnVersionCheck") && strstr(state, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED") &&
                    strstr(state, "libcudnn_cnn.so.9"),
                "cudnn property '%s' does not say which check failed", state);
  const char *providers = kiln_device_providers(gpu, "conv2d");
  ck_assert_msg(providers && !strstr(providers, "cudnn"), "conv2d providers '%s'", providers ? providers : "");
  const char *conv = NULL, *pool = NULL;
  conv_runs(&conv, &pool);
  ck_assert_str_eq(conv, "native");
  ck_assert_str_eq(pool, "native");
  const char *ran[GRADIENTS];
  gradients_run(true, ran);
  for (int i = 0; i < GRADIENTS; i++) {
    ck_assert_msg(!lists_cudnn(gradient_ops[i]), "%s lists cudnn", gradient_ops[i]);
    ck_assert_msg(!strcmp(ran[i], "native"), "%s ran %s", gradient_ops[i], ran[i]);
  }
}
END_TEST

START_TEST(test_failing_cudnn_falls_back) {
  /* The checks pass at load, so cudnn is offered ... */
  const char *state = property("cudnn");
  ck_assert_msg(state && !strncmp(state, "cuDNN 9.", 8), "cudnn property '%s'", state ? state : "(missing)");
  const char *providers = kiln_device_providers(gpu, "conv2d");
  ck_assert_msg(providers && strstr(providers, "cudnn"), "conv2d providers '%s'", providers ? providers : "");
  /* ... but cannot make its handle: the ops run native, now and later. */
  for (int round = 0; round < 2; round++) {
    const char *conv = NULL, *pool = NULL;
    conv_runs(&conv, &pool);
    ck_assert_str_eq(conv, "native");
    ck_assert_str_eq(pool, "native");
    const char *ran[GRADIENTS];
    gradients_run(true, ran);
    for (int i = 0; i < GRADIENTS; i++)
      ck_assert_msg(!strcmp(ran[i], "native"), "%s ran %s in round %d", gradient_ops[i], ran[i], round);
  }
  /* cudnn is offered for the gradients it has rows for (until the device
   * learnt it cannot start), never for max_pool2d_backward. */
  ck_assert(!lists_cudnn("max_pool2d_backward"));
}
END_TEST

/* The fake's counter of consistent backward calls. */
static int fake_backward_calls(void) {
  void *fake = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(fake != NULL, "the fake libcudnn.so.9 is not loaded: %s", dlerror());
  int (*calls)(void) = NULL;
  void *sym = dlsym(fake, "kiln_fake_cudnn_backward_calls");
  ck_assert_msg(sym != NULL, "the loaded libcudnn.so.9 is not the fake");
  memcpy(&calls, &sym, sizeof calls);
  const int count = calls();
  dlclose(fake);
  return count;
}

START_TEST(test_serving_cudnn_gets_consistent_arguments) {
  for (int i = 0; i < GRADIENTS; i++)
    ck_assert_msg(lists_cudnn(gradient_ops[i]) == (i < 3), "%s: providers '%s'", gradient_ops[i],
                  kiln_device_providers(gpu, gradient_ops[i]));
  /* Twice: planned, then from the plans kept. The fake computes nothing, so
   * the values are not checked. */
  for (int round = 0; round < 2; round++) {
    const int before = fake_backward_calls();
    const char *ran[GRADIENTS];
    gradients_run(false, ran);
    for (int i = 0; i < GRADIENTS; i++)
      ck_assert_msg(!strcmp(ran[i], i < 3 ? "cudnn" : "native"), "%s ran %s in round %d", gradient_ops[i], ran[i],
                    round);
    ck_assert_int_eq(fake_backward_calls() - before, 3);
  }
}
END_TEST

/* The fake's record of its last consistent forward call. */
static void fake_last_forward(int *data_type, int *algo, double *beta) {
  void *fake = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(fake != NULL, "the fake libcudnn.so.9 is not loaded: %s", dlerror());
  void (*last)(int *, int *, double *) = NULL;
  void *sym = dlsym(fake, "kiln_fake_cudnn_last_forward");
  ck_assert_msg(sym != NULL, "the loaded libcudnn.so.9 is not the fake");
  memcpy(&last, &sym, sizeof last);
  last(data_type, algo, beta);
  dlclose(fake);
}

START_TEST(test_serving_cudnn_conv2d_every_dtype) {
  /* cudnnDataType_t of each dtype; the fake ranks a tensor-op algorithm (1)
   * first and an FMA one (0) second: f32 without TF32 skips the first. */
  const struct { kiln_dtype_t dtype; int data, algo; bool onto_bias; } cases[] = {
      {KILN_F32, 0, 0, false}, {KILN_F64, 1, 1, false}, {KILN_F16, 2, 1, true}, {KILN_BF16, 9, 1, true}};
  const int64_t xs[4] = {2, 3, 6, 5}, ws[4] = {4, 3, 3, 3}, bs[1] = {4};
  float x[2 * 3 * 6 * 5], w[4 * 3 * 3 * 3], bias[4] = {0.5f, -1.25f, 3.0f, 0.0f};
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)((i * 7) % 11) / 4.0f - 1.0f;
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = (float)((i * 5) % 9) / 8.0f - 0.5f;
  kiln_conv2d_params_t params = {{1, 1}, {1, 1}, {1, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const kiln_dtype_t d = cases[c].dtype;
    const char *name = kiln_dtype_name(d);
    kiln_tensor_t *t32[3], *t[3], *ty, *y64;
    KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 4, xs, x, &t32[0]));
    KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 4, ws, w, &t32[1]));
    KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 1, bs, bias, &t32[2]));
    for (int i = 0; i < 3; i++) KT_OK(kiln_tensor_cast(t32[i], d, &t[i]));
    /* Twice: planned, then from the plan kept (per shape and dtype). */
    for (int round = 0; round < 2; round++) {
      KT_OK(kiln_tensor_conv2d(t[0], t[1], t[2], &params, &ty));
      ck_assert_msg(!strcmp(kiln_last_provider(), "cudnn"), "conv2d in %s ran %s in round %d", name,
                    kiln_last_provider(), round);
      int data = -1, algo = -1;
      double beta = -1.0;
      fake_last_forward(&data, &algo, &beta);
      ck_assert_msg(data == cases[c].data && algo == cases[c].algo && beta == (cases[c].onto_bias ? 1.0 : 0.0),
                    "conv2d in %s: data type %d, algorithm %d, beta %g", name, data, algo, beta);
      if (cases[c].onto_bias) {
        /* The fake added nothing: y is the bias, image by image, channel by channel. */
        KT_OK(kiln_tensor_cast(ty, KILN_F64, &y64));
        double y[2 * 4 * 6 * 5];
        KT_OK(kiln_tensor_read(y64, y, sizeof y));
        for (size_t i = 0; i < sizeof y / sizeof y[0]; i++)
          ck_assert_msg(y[i] == (double)bias[(i / 30) % 4], "conv2d in %s: y[%zu] = %g before cuDNN's sum", name, i,
                        y[i]);
        kiln_tensor_release(y64);
      }
      kiln_tensor_release(ty);
    }
    if (d == KILN_F16) {
      /* The input's gradient is f32 in every CUDA provider (the core takes
       * f16): the refusal names the dtype and says cudnn has none either. */
      kiln_tensor_t *dy, *dx = NULL;
      KT_OK(kiln_tensor_conv2d(t[0], t[1], NULL, &params, &dy));
      const kiln_status_t status = kiln_tensor_conv2d_backward_input(dy, t[1], xs, &params, &dx);
      const char *message = kiln_last_error();
      ck_assert_msg(status == KILN_UNSUPPORTED && dx == NULL, "f16 conv2d_backward_input: status %d (%s)",
                    (int)status, message);
      ck_assert_msg(strstr(message, "no f16 kernel") && strstr(message, "provider 'cudnn' has no f16"),
                    "f16 conv2d_backward_input refused with '%s'", message);
      printf("f16 conv2d_backward_input: %s\n", message);
      kiln_clear_error();
      kiln_tensor_release(dy);
    }
    for (int i = 0; i < 3; i++) {
      kiln_tensor_release(t32[i]);
      kiln_tensor_release(t[i]);
    }
  }
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  const char *mode = getenv("KILN_FAKE_CUDNN_FAIL");
  if (!mode || (strcmp(mode, "cnn") && strcmp(mode, "create") && strcmp(mode, "none"))) {
    printf("SKIP: KILN_FAKE_CUDNN_FAIL must be cnn, create or none (tests/cuda/meson.build sets it), not '%s'\n",
           mode ? mode : "");
    return 77;
  }
  size_t backends = 0;
  kiln_backend_info_t info;
  bool loaded = false;
  if (kiln_backend_count(&backends) == KILN_OK)
    for (size_t i = 0; i < backends; i++)
      if (kiln_backend_info(i, &info) == KILN_OK && !strcmp(info.name, "cuda"))
        loaded = info.state == KILN_BACKEND_LOADED;
  if (!loaded || kiln_device_find("cuda:0", &gpu) != KILN_OK) {
    printf("SKIP: no CUDA device visible (%s)\n", kiln_last_error());
    return 77;
  }
  kiln_clear_error();
  Suite *suite = suite_create("cuda-cudnn");
  TCase *tc = tcase_create("cuda-cudnn");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, !strcmp(mode, "cnn")      ? test_incomplete_cudnn_is_absent
                     : !strcmp(mode, "create") ? test_failing_cudnn_falls_back
                                               : test_serving_cudnn_gets_consistent_arguments);
  if (!strcmp(mode, "none")) tcase_add_test(tc, test_serving_cudnn_conv2d_every_dtype);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}
