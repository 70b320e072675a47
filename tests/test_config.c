/* tests/test_config.c: every KILN_* variable: valid values, each malformed value's status and message, API over env. */
#include <pthread.h>

#include "common.h"
#include "runtime/internal.h"

static const char *const kt_variables[] = {"KILN_BACKEND", "KILN_DEVICE", "KILN_POLICY", "KILN_PROVIDER",
                                           "KILN_CACHE_DIR", "KILN_CPU_DEVICES", "KILN_BACKEND_PATH", "KILN_LOG"};

static char kt_cache[4096];

/* Unset every variable except the private cache, so that whatever starts
 * kiln here writes only below the test's temporary directory. */
static void kt_clear_env(void) {
  for (size_t i = 0; i < sizeof kt_variables / sizeof kt_variables[0]; i++) unsetenv(kt_variables[i]);
  if (kt_cache[0]) setenv("KILN_CACHE_DIR", kt_cache, 1);
}

/* A path below the private cache directory. */
static const char *kt_sub(const char *name) {
  static char path[2][4200];
  static int which;
  which ^= 1;
  snprintf(path[which], sizeof path[which], "%s/%s", kt_cache, name);
  return path[which];
}

/* A value that must be rejected: variable, value, status, message fragment. */
typedef struct {
  const char *variable, *value;
  kiln_status_t status;
  const char *needle;
} kt_bad_t;

static const kt_bad_t kt_bad[] = {
    {"KILN_BACKEND", "cuda,,cpu", KILN_INVALID_ARGUMENT, "KILN_BACKEND=\"cuda,,cpu\" has an empty backend name"},
    {"KILN_BACKEND", "cpu,", KILN_INVALID_ARGUMENT, "empty backend name"},
    {"KILN_BACKEND", "OpenCL", KILN_INVALID_ARGUMENT, "\"OpenCL\" is not a backend name; use backend names ([a-z0-9_]+)"},
    {"KILN_BACKEND", "cpu;cuda", KILN_INVALID_ARGUMENT, "\"cpu;cuda\" is not a backend name"},
    {"KILN_BACKEND", "cpu,cpu", KILN_INVALID_ARGUMENT, "KILN_BACKEND=\"cpu,cpu\" names \"cpu\" twice"},
    {"KILN_BACKEND", "a,b,c,d,e,f,g,h,i", KILN_INVALID_ARGUMENT, "names more than 8 backends"},
    {"KILN_BACKEND", "averyveryveryverylongbackendname_x", KILN_INVALID_ARGUMENT, "is not a backend name"},
    {"KILN_DEVICE", "opencl", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"opencl\" is not a device selector: Incomplete selector 'opencl': try 'opencl:*'"},
    {"KILN_DEVICE", "cuda:0:1", KILN_INVALID_ARGUMENT, "too many colons in 'cuda:0:1'"},
    {"KILN_DEVICE", "opencl:gpux", KILN_INVALID_ARGUMENT, "unknown device 'gpux' in 'opencl:gpux'; use *, cpu, gpu, accelerator or an index"},
    {"KILN_POLICY", "fast", KILN_INVALID_ARGUMENT, "KILN_POLICY=\"fast\" is not a policy; use one of: vendor, portable, fastest"},
    {"KILN_POLICY", "Vendor", KILN_INVALID_ARGUMENT, "KILN_POLICY=\"Vendor\" is not a policy"},
    {"KILN_PROVIDER", "matmul", KILN_INVALID_ARGUMENT, "KILN_PROVIDER=\"matmul\": \"matmul\" has no '='; use op=provider pairs"},
    {"KILN_PROVIDER", "matmul=fast", KILN_INVALID_ARGUMENT, "unknown provider \"fast\" in \"matmul=fast\"; use one of: native, blas, clblast, cublas, cudnn"},
    {"KILN_PROVIDER", "gemm=blas", KILN_INVALID_ARGUMENT, "unknown op \"gemm\" in \"gemm=blas\"; ops: fill, arange"},
    {"KILN_PROVIDER", "matmul=blas,", KILN_INVALID_ARGUMENT, "empty item in \"matmul=blas,\""},
    {"KILN_PROVIDER", "add=native,mul=blas", KILN_INVALID_ARGUMENT, "\"add\" and \"mul\" both set the provider of binary ops (native, then blas)"},
    {"KILN_CPU_DEVICES", "0", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"0\" is not a device count; use an integer from 1 to 64"},
    {"KILN_CPU_DEVICES", "65", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"65\" is not a device count"},
    {"KILN_CPU_DEVICES", "two", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"two\""},
    {"KILN_CPU_DEVICES", "2x", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"2x\""},
    {"KILN_CPU_DEVICES", "-2", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"-2\""},
    {"KILN_CPU_DEVICES", " 2", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\" 2\""},
    {"KILN_LOG", "verbose", KILN_INVALID_ARGUMENT, "KILN_LOG=\"verbose\" is not a log level; use one of: off, error, warn, info, debug"},
};

START_TEST(test_bad_values) {
  const kt_bad_t *bad = &kt_bad[_i];
  kt_clear_env();
  setenv(bad->variable, bad->value, 1);
  kiln__config_t config;
  kiln_clear_error();
  KT_FAILS(kiln__config_load(NULL, &config), bad->status, bad->needle);
  /* The same value through the public start fails the same way. */
  KT_FAILS(kiln_ensure_initialized(), bad->status, bad->needle);
  kiln_deinitialize();
  kt_clear_env();
}
END_TEST

START_TEST(test_defaults) {
  kt_clear_env();
  unsetenv("KILN_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  kiln__config_t c;
  KT_OK(kiln__config_load(NULL, &c));
  ck_assert_uint_eq(c.backend_count, 3);
  ck_assert_str_eq(c.backends[0], "cuda");
  ck_assert_str_eq(c.backends[1], "opencl");
  ck_assert_str_eq(c.backends[2], "cpu");
  ck_assert(!c.backends_explicit);
  ck_assert_ptr_null(c.device_selector);
  ck_assert_int_eq(c.policy, KILN_POLICY_VENDOR);
  for (int k = 0; k < KILN_OP_COUNT; k++) ck_assert_int_eq(c.overrides[k], KILN_PROVIDER_NONE);
  ck_assert_str_eq(c.cache_dir, "/xdg/kiln");
  ck_assert_ptr_null(c.backend_path);
  ck_assert_int_eq(c.log_level, KILN_LOG_OFF);
  ck_assert_int_eq(c.cpu_devices, 1);
  kiln__config_free(&c);

  /* Without XDG_CACHE_HOME: ~/.cache/kiln; without HOME either: no cache. */
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/someone", 1);
  KT_OK(kiln__config_load(NULL, &c));
  ck_assert_str_eq(c.cache_dir, "/home/someone/.cache/kiln");
  kiln__config_free(&c);
  unsetenv("HOME");
  KT_OK(kiln__config_load(NULL, &c));
  ck_assert_ptr_null(c.cache_dir);
  kiln__config_free(&c);
}
END_TEST

START_TEST(test_empty_is_unset) {
  kt_clear_env();
  for (size_t i = 0; i < sizeof kt_variables / sizeof kt_variables[0]; i++) setenv(kt_variables[i], "", 1);
  /* config_load only: nothing is written to the default cache here. */
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  kiln__config_t c;
  KT_OK(kiln__config_load(NULL, &c));
  ck_assert_uint_eq(c.backend_count, 3);
  ck_assert(!c.backends_explicit);
  ck_assert_ptr_null(c.device_selector);
  ck_assert_str_eq(c.cache_dir, "/xdg/kiln");
  ck_assert_int_eq(c.cpu_devices, 1);
  kiln__config_free(&c);
  kt_clear_env();
}
END_TEST

START_TEST(test_valid_values) {
  kt_clear_env();
  setenv("KILN_BACKEND", "opencl,cpu", 1);
  setenv("KILN_DEVICE", "opencl:gpu;!cuda:1", 1);
  setenv("KILN_POLICY", "fastest", 1);
  setenv("KILN_PROVIDER", "matmul=blas,conv2d=native,add=clblast,relu=native", 1);
  setenv("KILN_CACHE_DIR", "/nonexistent/kiln-cache", 1); /* parsed only, never written */
  setenv("KILN_CPU_DEVICES", "64", 1);
  setenv("KILN_BACKEND_PATH", "/a:/b", 1);
  setenv("KILN_LOG", "debug", 1);
  kiln__config_t c;
  KT_OK(kiln__config_load(NULL, &c));
  ck_assert_uint_eq(c.backend_count, 2);
  ck_assert_str_eq(c.backends[0], "opencl");
  ck_assert_str_eq(c.backends[1], "cpu");
  ck_assert(c.backends_explicit);
  ck_assert_str_eq(c.device_selector, "opencl:gpu;!cuda:1");
  ck_assert_int_eq(c.policy, KILN_POLICY_FASTEST);
  ck_assert_int_eq(c.overrides[KILN_OP_MATMUL], kiln__provider_find("blas"));
  ck_assert_int_eq(c.overrides[KILN_OP_CONV2D], kiln__provider_find("native"));
  ck_assert_int_eq(c.overrides[KILN_OP_BINARY], kiln__provider_find("clblast"));
  ck_assert_int_eq(c.overrides[KILN_OP_UNARY], kiln__provider_find("native"));
  ck_assert_int_eq(c.overrides[KILN_OP_FILL], KILN_PROVIDER_NONE);
  ck_assert_str_eq(c.cache_dir, "/nonexistent/kiln-cache");
  ck_assert_int_eq(c.cpu_devices, 64);
  ck_assert_str_eq(c.backend_path, "/a:/b");
  ck_assert_int_eq(c.log_level, KILN_LOG_DEBUG);
  kiln__config_free(&c);

  static const struct {
    const char *value;
    kiln_log_level_t level;
  } logs[] = {{"off", KILN_LOG_OFF},   {"error", KILN_LOG_ERROR}, {"warn", KILN_LOG_WARN}, {"info", KILN_LOG_INFO},
              {"DEBUG", KILN_LOG_DEBUG}, {"Warn", KILN_LOG_WARN},   {"OFF", KILN_LOG_OFF}};
  for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
    setenv("KILN_LOG", logs[i].value, 1);
    KT_OK(kiln__config_load(NULL, &c));
    ck_assert_int_eq(c.log_level, logs[i].level);
    kiln__config_free(&c);
  }
  setenv("KILN_POLICY", "portable", 1);
  setenv("KILN_CPU_DEVICES", "1", 1);
  KT_OK(kiln__config_load(NULL, &c));
  ck_assert_int_eq(c.policy, KILN_POLICY_PORTABLE);
  ck_assert_int_eq(c.cpu_devices, 1);
  kiln__config_free(&c);
  kt_clear_env();
}
END_TEST

START_TEST(test_api_overrides_env) {
  kt_clear_env();
  setenv("KILN_BACKEND", "nosuch", 1);
  setenv("KILN_POLICY", "bogus", 1); /* never read: the API value wins */
  setenv("KILN_CPU_DEVICES", "3", 1);
  setenv("KILN_CACHE_DIR", "/from/env", 1);
  setenv("KILN_LOG", "info", 1);
  kiln_config_t api;
  kiln_config_initialize(&api);
  ck_assert_ptr_null(api.backend);
  ck_assert_int_eq(api.cpu_devices, -1);
  api.backend = "cpu";
  api.policy = "portable";
  api.cpu_devices = 2;
  api.provider = "matmul=native";
  kiln__config_t c;
  KT_OK(kiln__config_load(&api, &c));
  ck_assert_uint_eq(c.backend_count, 1);
  ck_assert_str_eq(c.backends[0], "cpu");
  ck_assert(c.backends_explicit);
  ck_assert_int_eq(c.policy, KILN_POLICY_PORTABLE);
  ck_assert_int_eq(c.cpu_devices, 2);
  ck_assert_int_eq(c.overrides[KILN_OP_MATMUL], kiln__provider_find("native"));
  /* Fields the API leaves unset still come from the environment. */
  ck_assert_str_eq(c.cache_dir, "/from/env");
  ck_assert_int_eq(c.log_level, KILN_LOG_INFO);
  kiln__config_free(&c);

  /* A malformed API value is named as the API field. */
  api.policy = "fast";
  KT_FAILS(kiln__config_load(&api, &c), KILN_INVALID_ARGUMENT, "kiln_config_t.policy=\"fast\" is not a policy");
  api.policy = "vendor";
  api.cpu_devices = 0;
  KT_FAILS(kiln__config_load(&api, &c), KILN_INVALID_ARGUMENT, "kiln_config_t.cpu_devices=0 is out of range");
  api.cpu_devices = -1;
  api.device = "cpu";
  KT_FAILS(kiln__config_load(&api, &c), KILN_INVALID_ARGUMENT, "kiln_config_t.device=\"cpu\" is not a device selector");
  kt_clear_env();
}
END_TEST

START_TEST(test_parse_providers) {
  int o[KILN_OP_COUNT];
  KT_OK(kiln__parse_providers("", o));
  for (int k = 0; k < KILN_OP_COUNT; k++) ck_assert_int_eq(o[k], KILN_PROVIDER_NONE);
  KT_OK(kiln__parse_providers("max_pool2d=cudnn,cross_entropy=native,tanh=native,binary_scalar=native", o));
  ck_assert_int_eq(o[KILN_OP_MAX_POOL2D], kiln__provider_find("cudnn"));
  ck_assert_int_eq(o[KILN_OP_CROSS_ENTROPY], kiln__provider_find("native"));
  ck_assert_int_eq(o[KILN_OP_UNARY], kiln__provider_find("native"));
  ck_assert_int_eq(o[KILN_OP_BINARY_SCALAR], kiln__provider_find("native"));
  /* The same provider twice for one kind is consistent and accepted. */
  KT_OK(kiln__parse_providers("add=native,sub=native,matmul=cublas,matmul=cublas", o));
  ck_assert_int_eq(o[KILN_OP_BINARY], kiln__provider_find("native"));
  ck_assert_int_eq(o[KILN_OP_MATMUL], kiln__provider_find("cublas"));
  /* A failure leaves the output untouched. */
  o[KILN_OP_MATMUL] = 4242;
  KT_FAILS(kiln__parse_providers("matmul=blas,=native", o), KILN_INVALID_ARGUMENT, "unknown op \"\"");
  ck_assert_int_eq(o[KILN_OP_MATMUL], 4242);
  KT_FAILS(kiln__parse_providers(NULL, o), KILN_INVALID_ARGUMENT, "NULL");

  ck_assert_str_eq(kiln__provider_name(kiln__provider_find("clblast")), "clblast");
  ck_assert_str_eq(kiln__provider_name(99), "unknown");
  ck_assert_str_eq(kiln__op_kind_name(KILN_OP_CROSS_ENTROPY), "cross_entropy");
  ck_assert_str_eq(kiln__op_kind_name((kiln_op_kind_t)99), "unknown");
}
END_TEST

START_TEST(test_policy_api) {
  kt_clear_env();
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_POLICY", "portable", 1);
  ck_assert_int_eq(kiln_policy(), KILN_POLICY_PORTABLE);
  KT_OK(kiln_set_policy(KILN_POLICY_FASTEST));
  ck_assert_int_eq(kiln_policy(), KILN_POLICY_FASTEST);
  KT_FAILS(kiln_set_policy((kiln_policy_t)7), KILN_INVALID_ARGUMENT, "kiln_set_policy(7): not a policy");
  ck_assert_int_eq(kiln_policy(), KILN_POLICY_FASTEST);
  ck_assert_str_eq(kiln_policy_name(KILN_POLICY_VENDOR), "vendor");
  ck_assert_str_eq(kiln_policy_name(KILN_POLICY_PORTABLE), "portable");
  ck_assert_str_eq(kiln_policy_name(KILN_POLICY_FASTEST), "fastest");
  KT_OK(kiln_set_providers("matmul=native"));
  ck_assert_int_eq(kiln__rt.overrides[KILN_OP_MATMUL], kiln__provider_find("native"));
  KT_FAILS(kiln_set_providers("matmul=magic"), KILN_INVALID_ARGUMENT, "kiln_set_providers(\"matmul=magic\"): unknown provider");
  ck_assert_int_eq(kiln__rt.overrides[KILN_OP_MATMUL], kiln__provider_find("native"));
  KT_OK(kiln_set_providers(""));
  ck_assert_int_eq(kiln__rt.overrides[KILN_OP_MATMUL], KILN_PROVIDER_NONE);
  KT_FAILS(kiln_set_providers(NULL), KILN_INVALID_ARGUMENT, "overrides is NULL");
  ck_assert_str_eq(kiln_version(), "0.1.0");
  kiln_deinitialize();
  kt_clear_env();
}
END_TEST

START_TEST(test_initialize_rules) {
  kt_clear_env();
  kiln_config_t api;
  kiln_config_initialize(&api);
  api.backend = "cpu";
  const char *dir1 = kt_sub("api"), *dir2 = kt_sub("env");
  api.cache_dir = dir1;
  api.policy = "nonsense";
  /* A failed explicit start leaves kiln stopped, so a fixed config can follow. */
  KT_FAILS(kiln_initialize(&api), KILN_INVALID_ARGUMENT, "kiln_config_t.policy=\"nonsense\"");
  api.policy = "portable";
  KT_OK(kiln_initialize(&api));
  ck_assert_int_eq(kiln_policy(), KILN_POLICY_PORTABLE);
  ck_assert_str_eq(kiln_cache_dir(), dir1);
  KT_FAILS(kiln_initialize(&api), KILN_INVALID_ARGUMENT, "kiln already started");
  kiln_deinitialize();
  /* After deinitialize kiln starts again, from the environment this time. */
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_CACHE_DIR", dir2, 1);
  KT_OK(kiln_ensure_initialized());
  ck_assert_str_eq(kiln_cache_dir(), dir2);
  ck_assert_int_eq(kiln_policy(), KILN_POLICY_VENDOR);
  kiln_deinitialize();
  kt_clear_env();
}
END_TEST

START_TEST(test_failed_start_is_remembered) {
  kt_clear_env();
  setenv("KILN_POLICY", "fast", 1);
  KT_FAILS(kiln_ensure_initialized(), KILN_INVALID_ARGUMENT, "KILN_POLICY=\"fast\"");
  /* Fixing the variable does not matter until kiln_deinitialize: the start
   * happened once, and every call reports its cause. */
  unsetenv("KILN_POLICY");
  kiln_clear_error();
  size_t count = 0;
  KT_FAILS(kiln_device_count(&count), KILN_INVALID_ARGUMENT, "kiln could not start: KILN_POLICY=\"fast\"");
  ck_assert_ptr_null(kiln_cache_dir());
  kiln_deinitialize();
  setenv("KILN_BACKEND", "cpu", 1);
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_ge(count, 1);
  kiln_deinitialize();
  kt_clear_env();
}
END_TEST

/* Log lines from the callback. */
static char kt_log[8192];
static void kt_log_sink(kiln_log_level_t level, const char *message, void *user) {
  size_t used = strlen(kt_log);
  snprintf(kt_log + used, sizeof kt_log - used, "%s: %s\n", level == KILN_LOG_WARN ? "warn" : "other", message);
}

/* A misspelled variable is named at warn, with the closest one kiln reads;
 * the variables kiln reads are not; nothing is said below warn. */
START_TEST(test_unknown_variables_warned) {
  kt_clear_env();
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_DEVICES", "cpu:0", 1);
  setenv("KILN_CACHEDIR", "/tmp", 1);
  setenv("KILN_FROBNICATE", "1", 1);
  setenv("KILN_TEST_SOMETHING", "1", 1); /* kiln's own test families are never reported */
  setenv("KILN_LOG", "warn", 1);
  kiln_log_set_callback(kt_log_sink, NULL);
  kt_log[0] = '\0';
  KT_OK(kiln_ensure_initialized());
  ck_assert_msg(strstr(kt_log, "warn: KILN_DEVICES is set, but kiln reads no variable of that name; did you mean "
                               "KILN_DEVICE?"), "%s", kt_log);
  ck_assert_msg(strstr(kt_log, "KILN_CACHEDIR is set, but kiln reads no variable of that name; did you mean "
                               "KILN_CACHE_DIR?"), "%s", kt_log);
  const char *frob = strstr(kt_log, "KILN_FROBNICATE is set");
  ck_assert_msg(frob && strstr(frob, "docs/environment.md"), "%s", kt_log);
  ck_assert_msg(!strstr(frob, "did you mean"), "a guess for KILN_FROBNICATE: %s", kt_log);
  ck_assert_msg(!strstr(kt_log, "KILN_BACKEND is set") && !strstr(kt_log, "KILN_LOG is set") &&
                    !strstr(kt_log, "KILN_CACHE_DIR is set") && !strstr(kt_log, "KILN_BACKEND_PATH is set") &&
                    !strstr(kt_log, "KILN_TEST_SOMETHING"),
                "a variable kiln reads is warned about: %s", kt_log);
  kiln_deinitialize();
  /* Below warn, silence. */
  setenv("KILN_LOG", "error", 1);
  kt_log[0] = '\0';
  KT_OK(kiln_ensure_initialized());
  ck_assert_str_eq(kt_log, "");
  kiln_deinitialize();
  kiln_log_set_callback(NULL, NULL);
  kiln_log_set_level(KILN_LOG_OFF);
  unsetenv("KILN_DEVICES");
  unsetenv("KILN_CACHEDIR");
  unsetenv("KILN_FROBNICATE");
  unsetenv("KILN_TEST_SOMETHING");
  kt_clear_env();
}
END_TEST

static void *kt_start_thread(void *arg) {
  size_t *count = arg;
  if (kiln_device_count(count) != KILN_OK) *count = 0;
  return NULL;
}

START_TEST(test_concurrent_start) {
  /* Many threads racing to start kiln: one start happens, all see it. */
  kt_clear_env();
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_CPU_DEVICES", "3", 1);
  pthread_t threads[8];
  size_t counts[8];
  for (int i = 0; i < 8; i++) ck_assert_int_eq(pthread_create(&threads[i], NULL, kt_start_thread, &counts[i]), 0);
  for (int i = 0; i < 8; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < 8; i++) ck_assert_uint_eq(counts[i], 3);
  kiln_deinitialize();
  kt_clear_env();
}
END_TEST

static Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("variables");
  tcase_add_loop_test(tc, test_bad_values, 0, (int)(sizeof kt_bad / sizeof kt_bad[0]));
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_empty_is_unset);
  tcase_add_test(tc, test_valid_values);
  tcase_add_test(tc, test_api_overrides_env);
  tcase_add_test(tc, test_parse_providers);
  tcase_add_test(tc, test_unknown_variables_warned);
  suite_add_tcase(s, tc);
  TCase *api = tcase_create("api");
  tcase_add_test(api, test_policy_api);
  tcase_add_test(api, test_initialize_rules);
  tcase_add_test(api, test_failed_start_is_remembered);
  tcase_add_test(api, test_concurrent_start);
  suite_add_tcase(s, api);
  return s;
}

int main(void) {
  const char *dir = kt_private_cache_dir();
  if (dir) snprintf(kt_cache, sizeof kt_cache, "%s", dir);
  return kt_run_suite(config_suite());
}
