/* tests/test_status.c: status names and descriptions, the per-thread message, wrapping and clearing. */
#include <pthread.h>

#include "common.h"
#include "runtime/internal.h"

START_TEST(test_names) {
  ck_assert_str_eq(kiln_status_name(KILN_OK), "OK");
  ck_assert_str_eq(kiln_status_name(KILN_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  ck_assert_str_eq(kiln_status_name(KILN_DEVICE_MISMATCH), "DEVICE_MISMATCH");
  ck_assert_str_eq(kiln_status_name(KILN_ABI_MISMATCH), "ABI_MISMATCH");
  ck_assert_str_eq(kiln_status_name(KILN_INTERNAL), "INTERNAL");
  ck_assert_str_eq(kiln_status_name((kiln_status_t)999), "UNKNOWN");
  ck_assert_str_eq(kiln_status_name((kiln_status_t)-1), "UNKNOWN");
  ck_assert_int_eq(KILN_ERROR_DEVICE_MISMATCH, KILN_DEVICE_MISMATCH);
}
END_TEST

START_TEST(test_describe) {
  ck_assert_str_eq(kiln_status_describe(KILN_OK), "success");
  ck_assert_str_eq(kiln_status_describe(KILN_DEVICE_MISMATCH), "operands live on different devices");
  ck_assert_str_eq(kiln_status_describe((kiln_status_t)999), "unknown status code");
  /* Every code of the table has a name and a non-empty description. */
#define KT_CHECK_(name, value, text)                                \
  ck_assert_str_eq(kiln_status_name(KILN_##name), #name);           \
  ck_assert_str_eq(kiln_status_describe(KILN_##name), text);        \
  ck_assert_int_eq((int)KILN_##name, value);
  KILN_STATUS_MAP(KT_CHECK_)
#undef KT_CHECK_
}
END_TEST

START_TEST(test_set_and_clear) {
  kiln_clear_error();
  ck_assert_str_eq(kiln_last_error(), "");
  ck_assert_int_eq(kiln_last_status(), KILN_OK);
  ck_assert_int_eq(kiln__set_error(KILN_SHAPE_MISMATCH, "shape [%d, %d] vs [%d]", 2, 3, 4), KILN_SHAPE_MISMATCH);
  ck_assert_str_eq(kiln_last_error(), "shape [2, 3] vs [4]");
  ck_assert_int_eq(kiln_last_status(), KILN_SHAPE_MISMATCH);
  kiln_clear_error();
  ck_assert_str_eq(kiln_last_error(), "");
  ck_assert_int_eq(kiln_last_status(), KILN_OK);
}
END_TEST

START_TEST(test_wrap) {
  kiln__set_error(KILN_IO, "read failed");
  ck_assert_int_eq(kiln__wrap_error(KILN_IO, "loading %s", "cache"), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), "loading cache: read failed");
  kiln__wrap_error(KILN_UNAVAILABLE, "outer");
  ck_assert_str_eq(kiln_last_error(), "outer: loading cache: read failed");
  ck_assert_int_eq(kiln_last_status(), KILN_UNAVAILABLE);
  kiln_clear_error();
  kiln__wrap_error(KILN_INTERNAL, "context only");
  ck_assert_str_eq(kiln_last_error(), "context only");
}
END_TEST

START_TEST(test_public_set_and_wrap) {
  /* The pair libraries on kiln's public API (libkiln-nn) report through. */
  kiln_clear_error();
  ck_assert_int_eq(kiln_set_error(KILN_IO, "cannot open %s", "a.safetensors"), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), "cannot open a.safetensors");
  ck_assert_int_eq(kiln_last_status(), KILN_IO);
  ck_assert_int_eq(kiln_wrap_error(KILN_NOT_FOUND, "kiln_nn_%s", "load"), KILN_NOT_FOUND);
  ck_assert_str_eq(kiln_last_error(), "kiln_nn_load: cannot open a.safetensors");
  ck_assert_int_eq(kiln_last_status(), KILN_NOT_FOUND);
  /* A code outside the table is recorded as INTERNAL, never as itself. */
  ck_assert_int_eq(kiln_set_error((kiln_status_t)999, "odd"), KILN_INTERNAL);
  ck_assert_int_eq(kiln_last_status(), KILN_INTERNAL);
  ck_assert_int_eq(kiln_wrap_error((kiln_status_t)-3, "outer"), KILN_INTERNAL);
  ck_assert_str_eq(kiln_last_error(), "outer: odd");
  kiln_clear_error();
}
END_TEST

START_TEST(test_long_message_is_cut) {
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  kiln__set_error(KILN_INTERNAL, "%s", big);
  size_t len = strlen(kiln_last_error());
  ck_assert_uint_gt(len, 1000);
  ck_assert_uint_lt(len, sizeof big - 1);
  kiln__wrap_error(KILN_INTERNAL, "prefix");
  ck_assert_uint_eq(strlen(kiln_last_error()), len);
  ck_assert(strncmp(kiln_last_error(), "prefix: xxx", 11) == 0);
}
END_TEST

static void *kt_other_thread(void *arg) {
  /* A fresh thread starts with no error, whatever the main thread has. */
  int *ok = arg;
  *ok = !strcmp(kiln_last_error(), "") && kiln_last_status() == KILN_OK;
  kiln__set_error(KILN_NOT_FOUND, "thread message");
  *ok = *ok && !strcmp(kiln_last_error(), "thread message");
  return NULL;
}

START_TEST(test_thread_local) {
  kiln__set_error(KILN_OUT_OF_MEMORY, "main message");
  int ok = 0;
  pthread_t thread;
  ck_assert_int_eq(pthread_create(&thread, NULL, kt_other_thread, &ok), 0);
  pthread_join(thread, NULL);
  ck_assert_int_eq(ok, 1);
  ck_assert_str_eq(kiln_last_error(), "main message");
  ck_assert_int_eq(kiln_last_status(), KILN_OUT_OF_MEMORY);
}
END_TEST

START_TEST(test_public_call_sets_message) {
  /* A public call with a bad argument fails without crashing and says why. */
  KT_FAILS(kiln_device_count(NULL), KILN_INVALID_ARGUMENT, "out_count is NULL");
  ck_assert_int_eq(kiln_last_status(), KILN_INVALID_ARGUMENT);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_log_levels_and_sink) {
  ck_assert_int_eq(kiln_log_level(), KILN_LOG_OFF);
  kiln_log_set_level(KILN_LOG_WARN);
  ck_assert_int_eq(kiln_log_level(), KILN_LOG_WARN);
  ck_assert(kiln__log_enabled(KILN_LOG_ERROR));
  ck_assert(kiln__log_enabled(KILN_LOG_WARN));
  ck_assert(!kiln__log_enabled(KILN_LOG_INFO));
  kiln_log_set_level((kiln_log_level_t)77);
  ck_assert_int_eq(kiln_log_level(), KILN_LOG_DEBUG);
  kiln_log_set_level(KILN_LOG_OFF);
  ck_assert(!kiln__log_enabled(KILN_LOG_ERROR));
}
END_TEST

static char kt_logged[256];
static int kt_logged_level;
static void kt_sink(kiln_log_level_t level, const char *message, void *user) {
  snprintf(kt_logged, sizeof kt_logged, "%s%s", (const char *)user, message);
  kt_logged_level = (int)level;
}

START_TEST(test_log_callback) {
  kt_logged[0] = '\0';
  kiln_log_set_callback(kt_sink, (void *)"sink: ");
  kiln_log_set_level(KILN_LOG_INFO);
  kiln__log(KILN_LOG_DEBUG, "dropped %d", 1);
  ck_assert_str_eq(kt_logged, "");
  kiln__log(KILN_LOG_INFO, "kept %d", 2);
  ck_assert_str_eq(kt_logged, "sink: kept 2");
  ck_assert_int_eq(kt_logged_level, KILN_LOG_INFO);
  kiln_log_set_callback(NULL, NULL);
  kiln_log_set_level(KILN_LOG_OFF);
}
END_TEST

static Suite *status_suite(void) {
  Suite *s = suite_create("status");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_public_set_and_wrap);
  tcase_add_test(tc, test_describe);
  tcase_add_test(tc, test_set_and_clear);
  tcase_add_test(tc, test_wrap);
  tcase_add_test(tc, test_long_message_is_cut);
  tcase_add_test(tc, test_thread_local);
  tcase_add_test(tc, test_public_call_sets_message);
  tcase_add_test(tc, test_log_levels_and_sink);
  tcase_add_test(tc, test_log_callback);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  kt_private_cache_dir();
  /* KILN_LOG from the caller's environment would change the default level. */
  unsetenv("KILN_LOG");
  return kt_run_suite(status_suite());
}
