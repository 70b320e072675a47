/* tests/conformance/main.c: the conformance suite's entry point: devices under test, every group's rows, the runner. */
/*
 * Every operation on every visible device and provider, against the CPU
 * backend's native kernels (ggml's test-backend-ops, IREE's CTS). The rows
 * live in one file per group, each exporting a kt_group_t (harness.h):
 *
 *   creation.c     zeros, ones, full, arange, uniform, normal
 *   movement.c     from_host, copies, to, contiguous, reshape
 *   elementwise.c  unary, binary, their scalar forms, eq, cast
 *   linalg.c       matmul; sum, mean, max, argmax, norm
 *   nn.c           softmax, log_softmax, cross_entropy, conv2d, max_pool2d
 *   gradients.c    the backward ops
 *   updates.c      accumulate, sgd_update, adam_update
 *
 * A row names the op, the KILN_PROVIDER op name whose providers are tried, a
 * function that builds its cases, one that makes the public API call, and its
 * tolerance rule. Adding an operation adds rows to its group's file;
 * everything else is harness.c, written once. gaps.c declares the cases a
 * vendor provider declines on purpose.
 *
 * Environment:
 *   KILN_CONFORMANCE_BACKEND=<name>  test only that backend's devices; exit 77
 *                                    with the backend's reason when it has none
 *   KILN_CONFORMANCE_SMALL=1         only small shapes (simulators such as
 *                                    Oclgrind), still every op and edge kind
 * Other backends join by being present: KILN_BACKEND picks what loads.
 */
#include "harness.h"

/* The groups, in the order their Check test cases run. */
static const kt_group_t *const kt_groups[] = {
    &kt_group_creation, &kt_group_movement, &kt_group_elementwise, &kt_group_linalg,
    &kt_group_nn,       &kt_group_gradients, &kt_group_updates, &kt_group_indexing,
};

/* Every row of every group, in that order: a test's loop index is its row. */
#define KT_MAX_ROWS 256
static const kt_row_t *kt_rows[KT_MAX_ROWS];
static size_t kt_n_rows;

/* Every case of one row; failures are collected, then asserted once. */
START_TEST(test_row) {
  const kt_row_t *row = kt_rows[_i];
  kt_failures = 0;
  kt_first_failure[0] = '\0';
  row->build(row);
  ck_assert_msg(kt_failures == 0, "%s: %d mismatch(es); the first: %s", row->name, kt_failures, kt_first_failure);
}
END_TEST

static const char *const kt_unary_names[] = {
#define KT_NAME_(NAME, name) #name,
    KILN_UNARY_OPS(KT_NAME_)
#undef KT_NAME_
};
static const char *const kt_binary_names[] = {
#define KT_NAME_(NAME, name) #name,
    KILN_BINARY_OPS(KT_NAME_)
#undef KT_NAME_
};

static bool kt_has_row(kt_run_fn *run, int sub) {
  for (size_t i = 0; i < kt_n_rows; i++)
    if (kt_rows[i]->run == run && kt_rows[i]->sub == sub) return true;
  return false;
}

/* An operation added without its rows would go untested: say which. Every
 * op name KILN_PROVIDER takes (kiln_op_name) needs a row of that op; the
 * kinds unary, binary and binary_scalar are covered by a row per op of
 * KILN_UNARY_OPS and KILN_BINARY_OPS. */
START_TEST(test_rows_cover_ops) {
  for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
    ck_assert_msg(kt_has_row(kt_run_unary, op), "the unary op %s has no row in kt_rows", kt_unary_names[op]);
    ck_assert_msg(kt_has_row(kt_run_unary_backward, op), "the derivative of %s has no row in kt_rows",
                  kt_unary_names[op]);
  }
  for (int op = 0; op < KILN_BINARY_COUNT_; op++) {
    ck_assert_msg(kt_has_row(kt_run_binary, op), "the binary op %s has no row in kt_rows", kt_binary_names[op]);
    ck_assert_msg(kt_has_row(kt_run_binary_scalar, op), "the op %s_scalar has no row in kt_rows",
                  kt_binary_names[op]);
  }
  for (size_t i = 0; kiln_op_name(i); i++) {
    const char *name = kiln_op_name(i);
    bool covered = !strcmp(name, "unary") || !strcmp(name, "binary") || !strcmp(name, "binary_scalar");
    for (size_t r = 0; r < kt_n_rows && !covered; r++) covered = !strcmp(kt_rows[r]->op, name);
    ck_assert_msg(covered, "the op \"%s\" (kiln_op_name(%zu)) has no row in kt_rows", name, i);
  }
}
END_TEST

/* A gap names a row that exists (a misspelt name would declare nothing) and
 * says why; and a case it does not cover is not declared. */
START_TEST(test_gaps_name_rows) {
  for (size_t i = 0; kt_gap_at(i); i++) {
    const kt_gap_t *g = kt_gap_at(i);
    bool found = false;
    for (size_t r = 0; r < kt_n_rows && !found; r++) found = !strcmp(kt_rows[r]->name, g->row);
    ck_assert_msg(found, "gap %zu of tests/conformance/gaps.c names the row \"%s\", which no group has", i, g->row);
    ck_assert_msg(g->reason && strlen(g->reason) > 20, "gap %zu (row \"%s\") gives no reason", i, g->row);
  }
  ck_assert_ptr_nonnull(kt_gap_at(0));
  for (size_t r = 0; r < kt_n_rows; r++) {
    kt_case_t c = kt_case(kt_rows[r]);
    snprintf(c.label, sizeof c.label, "%s (no such case)", kt_rows[r]->name);
    ck_assert_msg(kt_gap_find("cpu", "no-such-provider", &c) == NULL, "a gap covers an unknown provider");
  }
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------- */

/* A Check test case per group, in the order of kt_groups; a test per row. */
static Suite *kt_conformance_suite(void) {
  Suite *s = suite_create("conformance");
  for (size_t g = 0; g < sizeof kt_groups / sizeof kt_groups[0]; g++) {
    const kt_group_t *group = kt_groups[g];
    TCase *tc = tcase_create(group->name);
    for (size_t i = 0; i < group->n_rows; i++) {
      if (kt_n_rows == KT_MAX_ROWS) {
        fprintf(stderr, "conformance: more than %d rows; raise KT_MAX_ROWS in tests/conformance/main.c\n",
                KT_MAX_ROWS);
        exit(1);
      }
      kt_rows[kt_n_rows] = &group->rows[i];
      tcase_add_loop_test(tc, test_row, (int)kt_n_rows, (int)kt_n_rows + 1);
      kt_n_rows++;
    }
    if (group->add_tests) group->add_tests(tc);
    if (group == &kt_group_elementwise) {
      tcase_add_test(tc, test_rows_cover_ops);
      tcase_add_test(tc, test_gaps_name_rows);
    }
    suite_add_tcase(s, tc);
  }
  return s;
}

/* Why a backend has no device under test, in its own words. */
static void kt_backend_reason(const char *name, char *out, size_t size) {
  size_t count = 0;
  if (kiln_backend_count(&count) != KILN_OK) {
    snprintf(out, size, "%s", kiln_last_error());
    return;
  }
  for (size_t i = 0; i < count; i++) {
    kiln_backend_info_t b;
    if (kiln_backend_info(i, &b) != KILN_OK || strcmp(b.name, name) != 0) continue;
    if (b.state == KILN_BACKEND_LOADED)
      snprintf(out, size, "loaded, but KILN_DEVICE hides its devices");
    else if (b.state == KILN_BACKEND_NO_DEVICE && b.device_count > 0 && !b.reason[0])
      snprintf(out, size, "its %zu device(s) are hidden by KILN_DEVICE", b.device_count);
    else
      snprintf(out, size, "%s: %s", kiln_backend_state_name(b.state), b.reason[0] ? b.reason : "no reason given");
    return;
  }
  const char *list = getenv("KILN_BACKEND");
  snprintf(out, size, "the backend was not loaded (KILN_BACKEND=%s; add %s to it)", list && *list ? list : "(unset)",
           name);
}

int main(void) {
  kt_private_cache_dir();
  const char *small = getenv("KILN_CONFORMANCE_SMALL");
  kt_small = small && *small && strcmp(small, "0") != 0;
  const char *only = getenv("KILN_CONFORMANCE_BACKEND");
  if (only && !*only) only = NULL;

  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_OK) {
    /* A backend named in KILN_BACKEND that cannot load fails the start. */
    if (only) {
      printf("no %s device: kiln did not start: %s\n", only, kiln_last_error());
      return 77;
    }
    fprintf(stderr, "kiln did not start (%s): %s\n", kiln_status_name(status), kiln_last_error());
    return 1;
  }
  if (kiln_device_find("cpu:0", &kt_ref) != KILN_OK) {
    printf("no reference: the conformance suite compares with cpu:0, which is not visible (%s); "
           "add cpu to KILN_BACKEND and let KILN_DEVICE keep cpu:0\n",
           kiln_last_error());
    kiln_deinitialize();
    return 77;
  }
  /* Outside a test Check's asserts cannot report: plain checks here. */
  size_t count = 0;
  status = kiln_device_count(&count);
  for (size_t i = 0; i < count && kt_ndev < KT_MAX_DEVICES && status == KILN_OK; i++) {
    kiln_device_t *d = NULL;
    kiln_device_info_t info;
    status = kiln_device_get(i, &d);
    if (status == KILN_OK) status = kiln_device_info(d, &info);
    if (status == KILN_OK && (!only || !strcmp(info.backend, only))) kt_devs[kt_ndev++] = d;
  }
  if (status == KILN_OK) status = kiln_set_policy(KILN_POLICY_PORTABLE);
  if (status != KILN_OK) {
    fprintf(stderr, "listing the devices failed (%s): %s\n", kiln_status_name(status), kiln_last_error());
    kiln_deinitialize();
    return 1;
  }
  if (kt_ndev == 0) {
    char reason[1200];
    kt_backend_reason(only ? only : "cpu", reason, sizeof reason);
    printf("no %s device: %s\n", only ? only : "visible", reason);
    kiln_deinitialize();
    return 77;
  }

  /* The reference runs kiln's own kernels (policy portable, set above); each
   * device's providers are then forced one at a time with kiln_set_providers. */
  printf("conformance%s: reference %s; under test:", kt_small ? " (small shapes)" : "", kiln_device_name(kt_ref));
  for (size_t d = 0; d < kt_ndev; d++) printf(" %s", kiln_device_name(kt_devs[d]));
  printf("\n");
  fflush(stdout);

  SRunner *runner = srunner_create(kt_conformance_suite());
  /* One process: kiln started above, and its worker threads do not survive
   * a fork. */
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  kt_summary_print();
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}