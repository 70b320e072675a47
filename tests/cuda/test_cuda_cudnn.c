/* tests/cuda/test_cuda_cudnn.c: a cuDNN that cannot serve never fails an op: absent with its reason when its checks fail at load, falling back to native when it fails at run time; skipped (77) without a CUDA device. */
/*
 * Run with tests/cuda/fake-cudnn first on LD_LIBRARY_PATH and
 * KILN_FAKE_CUDNN_FAIL saying how it fails (meson sets both):
 *   cnn     cudnnCnnVersionCheck fails (a half-installed cuDNN): devinfo's
 *           `cudnn` property says absent and why, and conv2d has no cudnn
 *           provider;
 *   create  cudnnCreate fails at the first op: under the default policy the
 *           op runs native (never an error), and so does every later one.
 */
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
static void conv_runs(const char **out_conv_provider, const char **out_pool_provider) {
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
    if (side == 0) *out_pool_provider = kiln_last_provider();
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
  }
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  const char *mode = getenv("KILN_FAKE_CUDNN_FAIL");
  if (!mode || (strcmp(mode, "cnn") && strcmp(mode, "create"))) {
    printf("SKIP: KILN_FAKE_CUDNN_FAIL must be cnn or create (tests/cuda/meson.build sets it), not '%s'\n",
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
  tcase_add_test(tc, !strcmp(mode, "cnn") ? test_incomplete_cudnn_is_absent : test_failing_cudnn_falls_back);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}
