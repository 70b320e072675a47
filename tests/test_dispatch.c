/* tests/test_dispatch.c: provider choice under each policy and override, `fastest` remembered on disk, the debug log line. */
#include <pthread.h>

#include "common.h"

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu", &device));
  return device;
}

/* Whether the CPU device offers the blas provider for matmul (kiln built with a CBLAS). */
static bool kt_has_blas(kiln_device_t *d) {
  const char *providers = kiln_device_providers(d, "matmul");
  return providers && strstr(providers, "blas") != NULL;
}

/* a @ b for 64x64 matrices of small integers; checks the result exactly. */
static void kt_matmul(kiln_device_t *d) {
  enum { N = 64 };
  static float av[N * N], bv[N * N], want[N * N], got[N * N];
  for (int i = 0; i < N * N; i++) {
    av[i] = (float)(i % 7 - 3);
    bv[i] = (float)(i % 5 - 2);
  }
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      float s = 0;
      for (int k = 0; k < N; k++) s += av[i * N + k] * bv[k * N + j];
      want[i * N + j] = s;
    }
  const int64_t shape[2] = {N, N};
  kiln_tensor_t *a = NULL, *b = NULL, *c = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_F32, 2, shape, av, &a));
  KT_OK(kiln_tensor_from_host(d, KILN_F32, 2, shape, bv, &b));
  KT_OK(kiln_tensor_matmul(a, b, false, false, &c));
  KT_OK(kiln_tensor_read(c, got, sizeof got));
  ck_assert_mem_eq(got, want, sizeof got);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_tensor_release(c);
}

static void kt_add(kiln_device_t *d) {
  const int64_t shape[1] = {4};
  kiln_tensor_t *a = NULL, *c = NULL;
  KT_OK(kiln_tensor_ones(d, KILN_F32, 1, shape, &a));
  KT_OK(kiln_tensor_add(a, a, &c));
  kiln_tensor_release(a);
  kiln_tensor_release(c);
}

static void *kt_fresh_thread(void *arg) { return (void *)kiln_last_provider(); }

START_TEST(test_vendor_portable_override) {
  kiln_device_t *d = kt_cpu();
  bool blas = kt_has_blas(d);
  pthread_t other;
  void *seen = NULL;
  pthread_create(&other, NULL, kt_fresh_thread, NULL);
  pthread_join(other, &seen);
  ck_assert_str_eq((const char *)seen, "");

  KT_OK(kiln_set_policy(KILN_POLICY_VENDOR));
  kt_matmul(d);
  ck_assert_str_eq(kiln_last_provider(), blas ? "blas" : "native");
  kt_add(d);
  ck_assert_str_eq(kiln_last_provider(), "native");

  KT_OK(kiln_set_policy(KILN_POLICY_PORTABLE));
  kt_matmul(d);
  ck_assert_str_eq(kiln_last_provider(), "native");
  if (blas) {
    /* An override wins over the policy... */
    KT_OK(kiln_set_providers("matmul=blas"));
    kt_matmul(d);
    ck_assert_str_eq(kiln_last_provider(), "blas");
    KT_OK(kiln_set_policy(KILN_POLICY_VENDOR));
    KT_OK(kiln_set_providers("matmul=native"));
    kt_matmul(d);
    ck_assert_str_eq(kiln_last_provider(), "native");
    KT_OK(kiln_set_providers(""));
    kt_matmul(d);
    ck_assert_str_eq(kiln_last_provider(), "blas");
  }
  /* ...but one naming a provider the op does not have here is not used. */
  KT_OK(kiln_set_providers("add=blas"));
  kt_add(d);
  ck_assert_str_eq(kiln_last_provider(), "native");
  KT_OK(kiln_set_providers(""));
}
END_TEST

/* The calls of one (op, provider) pair in the calling thread's counts, 0 if none. */
static uint64_t kt_calls(const char *op, const char *provider) {
  kiln_provider_use_t uses[64];
  size_t n = kiln_provider_uses(uses, 64);
  ck_assert_uint_le(n, 64);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(uses[i].op, op) && !strcmp(uses[i].provider, provider)) return uses[i].calls;
  return 0;
}

static void *kt_uses_thread(void *arg) { return (void *)kiln_provider_uses(NULL, 0); }

/* The core counts which provider ran each op, per thread, by the op names of
 * KILN_PROVIDER (a binary op by its own name), until reset. */
START_TEST(test_provider_uses) {
  kiln_device_t *d = kt_cpu();
  bool blas = kt_has_blas(d);
  kiln_provider_uses_reset();
  ck_assert_uint_eq(kiln_provider_uses(NULL, 0), 0);
  KT_OK(kiln_set_policy(KILN_POLICY_VENDOR));
  kt_matmul(d); /* from_host twice (no op), matmul */
  kt_matmul(d);
  kt_add(d);    /* ones (fill), add */
  ck_assert_uint_eq(kt_calls("matmul", blas ? "blas" : "native"), 2);
  ck_assert_uint_eq(kt_calls("add", "native"), 1);
  ck_assert_uint_eq(kt_calls("fill", "native"), 1);
  ck_assert_uint_eq(kt_calls("binary", "native"), 0);
  ck_assert_uint_eq(kiln_provider_uses(NULL, 0), 3);
  /* Entries come in kiln_op_name order: the kinds (fill, ..., matmul) before the binary ops. */
  kiln_provider_use_t uses[3];
  ck_assert_uint_eq(kiln_provider_uses(uses, 3), 3);
  ck_assert_str_eq(uses[0].op, "fill");
  ck_assert_str_eq(uses[2].op, "add");
  /* A capacity smaller than the count writes that many and still counts all. */
  kiln_provider_use_t one[1] = {{NULL, NULL, 0}};
  ck_assert_uint_eq(kiln_provider_uses(one, 1), 3);
  ck_assert_str_eq(one[0].op, "fill");
  KT_OK(kiln_set_policy(KILN_POLICY_PORTABLE));
  kt_matmul(d);
  ck_assert_uint_eq(kt_calls("matmul", "native"), blas ? 1 : 3);
  /* Another thread has its own counts. */
  pthread_t other;
  void *seen = (void *)1;
  pthread_create(&other, NULL, kt_uses_thread, NULL);
  pthread_join(other, &seen);
  ck_assert_ptr_null(seen);
  kiln_provider_uses_reset();
  ck_assert_uint_eq(kiln_provider_uses(NULL, 0), 0);
  ck_assert_uint_eq(kt_calls("matmul", "native"), 0);
}
END_TEST

/* Log lines collected from the callback. */
static pthread_mutex_t kt_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char kt_log[1 << 16];

static void kt_log_sink(kiln_log_level_t level, const char *message, void *user) {
  pthread_mutex_lock(&kt_log_lock);
  size_t used = strlen(kt_log);
  snprintf(kt_log + used, sizeof kt_log - used, "%s\n", message);
  pthread_mutex_unlock(&kt_log_lock);
}

static void kt_log_clear(void) {
  pthread_mutex_lock(&kt_log_lock);
  kt_log[0] = '\0';
  pthread_mutex_unlock(&kt_log_lock);
}

START_TEST(test_debug_line) {
  kiln_device_t *d = kt_cpu();
  KT_OK(kiln_set_policy(KILN_POLICY_VENDOR));
  kiln_log_set_callback(kt_log_sink, NULL);
  kiln_log_set_level(KILN_LOG_DEBUG);
  kt_log_clear();
  kt_matmul(d);
  kiln_log_set_level(KILN_LOG_OFF);
  kiln_log_set_callback(NULL, NULL);
  char want[128];
  snprintf(want, sizeof want, "matmul f32 [64x64x64] on cpu:0 -> %s (policy vendor)", kt_has_blas(d) ? "blas" : "native");
  ck_assert_msg(strstr(kt_log, want), "log lacks \"%s\":\n%s", want, kt_log);
}
END_TEST

/* KILN_PROVIDER naming a provider this device lacks for the op (clblast on
 * the CPU): one warn line naming the device and the providers it has, and the
 * policy chooses as if no override were set (blas under vendor where kiln has
 * a BLAS, native under portable). */
static size_t kt_count(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

START_TEST(test_override_missing_provider) {
  setenv("KILN_PROVIDER", "matmul=clblast", 1);
  kiln_log_set_callback(kt_log_sink, NULL);
  kiln_log_set_level(KILN_LOG_WARN);
  kt_log_clear();
  kiln_device_t *d = kt_cpu();
  bool blas = kt_has_blas(d);
  KT_OK(kiln_set_policy(KILN_POLICY_VENDOR));
  kt_matmul(d);
  ck_assert_str_eq(kiln_last_provider(), blas ? "blas" : "native");
  char want[256];
  snprintf(want, sizeof want, "KILN_PROVIDER asks for provider 'clblast' for matmul, but %s has no such provider for "
           "it (it has: %s); the policy chooses instead (vendor)", kiln_device_name(d), blas ? "native,blas" : "native");
  ck_assert_msg(strstr(kt_log, want), "log lacks \"%s\":\n%s", want, kt_log);
  ck_assert_msg(strstr(kt_log, "cpu:0"), "the warning does not name the device:\n%s", kt_log);
  /* Once per device and op kind, whatever the policy does next. */
  kt_matmul(d);
  KT_OK(kiln_set_policy(KILN_POLICY_PORTABLE));
  kt_matmul(d);
  ck_assert_str_eq(kiln_last_provider(), "native");
  ck_assert_uint_eq(kt_count(kt_log, "KILN_PROVIDER asks for provider 'clblast'"), 1);
  /* The other kinds keep the policy's choice and say nothing. */
  kt_add(d);
  ck_assert_str_eq(kiln_last_provider(), "native");
  ck_assert_uint_eq(kt_count(kt_log, "KILN_PROVIDER asks"), 1);
  kiln_log_set_level(KILN_LOG_OFF);
  kiln_log_set_callback(NULL, NULL);
  kiln_deinitialize();
  unsetenv("KILN_PROVIDER");
}
END_TEST

START_TEST(test_fastest_remembered) {
  kiln_device_t *d = kt_cpu();
  if (!kt_has_blas(d)) {
    /* One candidate is never measured; nothing to remember. */
    KT_OK(kiln_set_policy(KILN_POLICY_FASTEST));
    kt_matmul(d);
    ck_assert_str_eq(kiln_last_provider(), "native");
    return;
  }
  kiln_cache_stats_t s0, s1;
  KT_OK(kiln_cache_stats(&s0));
  KT_OK(kiln_set_policy(KILN_POLICY_FASTEST));
  kiln_log_set_callback(kt_log_sink, NULL);
  kiln_log_set_level(KILN_LOG_INFO);
  kt_log_clear();
  kt_matmul(d);
  const char *winner = kiln_last_provider();
  ck_assert(!strcmp(winner, "blas") || !strcmp(winner, "native"));
  char chosen[16];
  snprintf(chosen, sizeof chosen, "%s", winner);
  ck_assert_msg(strstr(kt_log, "fastest cpu|") && strstr(kt_log, "|matmul|f32|64x64x64nn -> "), "%s", kt_log);
  KT_OK(kiln_cache_stats(&s1));
  ck_assert_uint_eq(s1.stores, s0.stores + 1);
  /* The same op again: remembered in the process, neither measured nor stored. */
  kt_log_clear();
  kt_matmul(d);
  ck_assert_str_eq(kiln_last_provider(), chosen);
  ck_assert_ptr_null(strstr(kt_log, "fastest"));
  KT_OK(kiln_cache_stats(&s0));
  ck_assert_uint_eq(s0.stores, s1.stores);

  /* On disk: tuning.tsv names the op and the winner. */
  char path[4200];
  snprintf(path, sizeof path, "%s/tuning.tsv", kiln_cache_dir());
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "no %s", path);
  char text[4096] = "";
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  char line_end[64];
  snprintf(line_end, sizeof line_end, "|matmul|f32|64x64x64nn\t%s\n", chosen);
  ck_assert_msg(strstr(text, line_end), "tuning.tsv lacks \"%s\":\n%s", line_end, text);

  /* A second start reuses the stored winner without measuring. */
  kiln_deinitialize();
  d = kt_cpu();
  KT_OK(kiln_set_policy(KILN_POLICY_FASTEST));
  kiln_log_set_callback(kt_log_sink, NULL);
  kiln_log_set_level(KILN_LOG_INFO);
  kt_log_clear();
  KT_OK(kiln_cache_stats(&s0));
  kt_matmul(d);
  ck_assert_str_eq(kiln_last_provider(), chosen);
  KT_OK(kiln_cache_stats(&s1));
  ck_assert_uint_eq(s1.hits, s0.hits + 1);
  ck_assert_uint_eq(s1.stores, s0.stores);
  ck_assert_msg(strstr(kt_log, "fastest ") == NULL, "measured again:\n%s", kt_log);
  kiln_log_set_level(KILN_LOG_OFF);
  kiln_log_set_callback(NULL, NULL);

  /* An override still wins over fastest. */
  KT_OK(kiln_set_providers(strcmp(chosen, "blas") ? "matmul=blas" : "matmul=native"));
  kt_matmul(d);
  ck_assert_str_ne(kiln_last_provider(), chosen);
  KT_OK(kiln_set_providers(""));
}
END_TEST

START_TEST(test_device_check) {
  kiln_device_t *d = kt_cpu();
  KT_OK(kiln_device_check(d));
  KT_FAILS(kiln_device_check(NULL), KILN_INVALID_ARGUMENT, "kiln_device_check: device is NULL");
  /* The reference uses native whatever the policy; the policy is untouched. */
  KT_OK(kiln_set_policy(KILN_POLICY_VENDOR));
  KT_OK(kiln_device_check(d));
  ck_assert_int_eq(kiln_policy(), KILN_POLICY_VENDOR);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  unsetenv("KILN_POLICY");
  unsetenv("KILN_PROVIDER");
  Suite *s = suite_create("dispatch");
  TCase *tc = tcase_create("dispatch");
  tcase_add_test(tc, test_vendor_portable_override);
  tcase_add_test(tc, test_provider_uses);
  tcase_add_test(tc, test_debug_line);
  tcase_add_test(tc, test_override_missing_provider);
  tcase_add_test(tc, test_fastest_remembered);
  tcase_add_test(tc, test_device_check);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
