/* tests/conformance/movement.c: conformance rows: from_host, copies between devices, to, contiguous, reshape. */
#include "harness.h"

/* Both dtypes over the elementwise shapes. */
static void kt_build_movement(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kiln_dtype_t dtype = dt ? KILN_I32 : KILN_F32;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dtype, dt ? KT_INT_EDGE : KT_WIDE, 7, s->ndim, s->s, s->view);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s of %s", row->name, in);
      kt_check(&c);
    }
  }
}

/* The input itself: kiln_tensor_from_host, then the machinery's read. */
KT_RUN(kt_run_from_host) {
  *out = kiln_tensor_retain(in[0]);
  return KILN_OK;
}

KT_RUN(kt_run_copy) { return kiln_tensor_copy(in[0], dev, out); }

KT_RUN(kt_run_copy_to_ref) { return kiln_tensor_copy(in[0], kt_ref, out); }

KT_RUN(kt_run_to) { return kiln_tensor_to(in[0], dev, out); }

KT_RUN(kt_run_contiguous) { return kiln_tensor_contiguous(in[0], out); }

KT_RUN(kt_run_reshape_flat) {
  int64_t flat = kt_numel(c->in[0].ndim, c->in[0].shape);
  return kiln_tensor_reshape(in[0], 1, &flat, out);
}

/* kiln_tensor_to returns the tensor itself on its own device, and a copy of
 * the values on another; a copy is always new. */
START_TEST(test_to_identity) {
  for (size_t d = 0; d < kt_ndev; d++) {
    const int64_t shape[2] = {3, 5};
    kt_in_t in = kt_in(KILN_F32, KT_WIDE, 3, 2, shape, false);
    kiln_tensor_t *t = NULL, *same = NULL, *copy = NULL;
    KT_OK(kt_make(kt_devs[d], &in, &t));
    KT_OK(kiln_tensor_to(t, kt_devs[d], &same));
    ck_assert_ptr_eq(same, t);
    KT_OK(kiln_tensor_copy(t, kt_devs[d], &copy));
    ck_assert_ptr_ne(copy, t);
    ck_assert_ptr_ne(kiln_tensor_buffer(copy), kiln_tensor_buffer(t));
    float a[15], b[15];
    KT_OK(kiln_tensor_read(t, a, sizeof a));
    KT_OK(kiln_tensor_read(copy, b, sizeof b));
    ck_assert_mem_eq(a, b, sizeof a);
    kiln_tensor_release(same);
    kiln_tensor_release(copy);
    kiln_tensor_release(t);
  }
}
END_TEST

/* ---- the rows -------------------------------------------------------------------------- */

static const kt_row_t kt_rows[] = {
    {.name = "from_host + read", .op = "copy", .build = kt_build_movement,
     .run = kt_run_from_host, .tol = kt_tol_exact},
    {.name = "copy to the same device", .op = "copy", .build = kt_build_movement,
     .run = kt_run_copy, .tol = kt_tol_exact},
    {.name = "copy from cpu:0", .op = "copy", .build = kt_build_movement, .run = kt_run_copy,
     .tol = kt_tol_exact, .inputs = KT_ON_REF},
    {.name = "copy to cpu:0", .op = "copy", .build = kt_build_movement,
     .run = kt_run_copy_to_ref, .tol = kt_tol_exact, .result = KT_ON_REF},
    {.name = "to from cpu:0", .op = "copy", .build = kt_build_movement, .run = kt_run_to,
     .tol = kt_tol_exact, .inputs = KT_ON_REF},
    {.name = "contiguous", .op = "copy", .build = kt_build_movement, .run = kt_run_contiguous,
     .tol = kt_tol_exact},
    {.name = "reshape to 1-D", .op = "copy", .build = kt_build_movement,
     .run = kt_run_reshape_flat, .tol = kt_tol_exact},
};

static void kt_add_tests(TCase *tc) { tcase_add_test(tc, test_to_identity); }

const kt_group_t kt_group_movement = {
    .name = "movement",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
    .add_tests = kt_add_tests,
};
