/* tests/conformance/elementwise.c: conformance rows: unary and binary ops, their scalar forms, eq, cast, where. */
#include <string.h>

#include "harness.h"

/* Broadcasting pairs. */
static const kt_shape_t kt_broadcast_pairs[][2] = {
    {{2, {3, 1}, false, false}, {2, {1, 4}, false, false}},
    {{3, {2, 1, 3}, false, false}, {1, {3}, false, false}},
    {{0, {0}, false, false}, {2, {2, 3}, false, false}},
    {{2, {0, 3}, false, false}, {1, {3}, false, false}},
    {{2, {3, 4}, true, false}, {2, {3, 1}, false, false}},
    {{1, {1}, false, false}, {1, {5}, false, false}},
    {{2, {13, 1}, false, true}, {2, {1, 257}, false, true}},
    {{3, {2, 1, 7}, false, true}, {2, {13, 1}, false, true}},
    {{2, {13, 257}, true, true}, {1, {257}, false, true}},
};

/* f32 with the row's values and i32 over the whole range, over the
 * elementwise shapes; i32 once only, for the status, where the op has no i32
 * formula. */
static void kt_build_unary(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      if (dt && row->i32_status_only && s != kt_elementwise_shapes + 3) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : row->gen, 11 + (uint32_t)row->sub, s->ndim, s->s,
                      s->view);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s %s", row->name, in);
      kt_check(&c);
    }
  }
}

KT_RUN_SHARED(kt_run_unary) { return kiln_tensor_unary((kiln_unary_op_t)c->row->sub, in[0], out); }

/* Both dtypes, same shapes and broadcasts (both orders); then operands of two
 * dtypes, for the status. */
static void kt_build_binary(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    kiln_dtype_t dtype = dt ? KILN_I32 : KILN_F32;
    kt_gen_t gen_f32 = row->gen != KT_UNSET ? row->gen : KT_WIDE;
    kt_gen_t gen_a = dt ? KT_INT_EDGE : gen_f32;
    kt_gen_t gen_b = !dt ? gen_f32 : row->gen_i32_rhs != KT_UNSET ? row->gen_i32_rhs : KT_INT_EDGE;
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      c.in[0] = kt_in(dtype, gen_a, 21, s->ndim, s->s, s->view);
      c.in[1] = kt_in(dtype, gen_b, 22, s->ndim, s->s, false);
      char a[160], b[160];
      kt_in_text(&c.in[0], a, sizeof a);
      kt_in_text(&c.in[1], b, sizeof b);
      snprintf(c.label, sizeof c.label, "%s %s, %s", row->name, a, b);
      kt_check(&c);
    }
    for (size_t i = 0; i < sizeof kt_broadcast_pairs / sizeof kt_broadcast_pairs[0]; i++) {
      const kt_shape_t *sa = &kt_broadcast_pairs[i][0], *sb = &kt_broadcast_pairs[i][1];
      if (kt_skip(sa) || kt_skip(sb)) continue;
      for (int swap = 0; swap < 2; swap++) {
        const kt_shape_t *x = swap ? sb : sa, *y = swap ? sa : sb;
        kt_case_t c = kt_case(row);
        c.n_in = 2;
        c.in[0] = kt_in(dtype, gen_a, 23, x->ndim, x->s, x->view);
        c.in[1] = kt_in(dtype, gen_b, 24, y->ndim, y->s, y->view);
        char a[160], b[160];
        kt_in_text(&c.in[0], a, sizeof a);
        kt_in_text(&c.in[1], b, sizeof b);
        snprintf(c.label, sizeof c.label, "%s %s, %s (broadcast)", row->name, a, b);
        kt_check(&c);
      }
    }
  }
  if (!strcmp(row->op, "compare")) return; /* comparisons take bool too */
  const int64_t shape[1] = {4};
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  /* bool with bool has no arithmetic: refused before dispatch on every
   * device (operands of two dtypes are promoted and succeed:
   * tests/test_compute_dtypes.c). */
  c.in[0] = kt_in(KILN_BOOL, KT_INT, 1, 1, shape, false);
  c.in[1] = kt_in(KILN_BOOL, KT_INT, 2, 1, shape, false);
  snprintf(c.label, sizeof c.label, "%s bool [4], bool [4] (no arithmetic on bool)", row->name);
  kt_check(&c);
}

KT_RUN_SHARED(kt_run_binary) { return kiln_tensor_binary((kiln_binary_op_t)c->row->sub, in[0], in[1], out); }

KT_RUN_SHARED(kt_run_compare) { return kiln_tensor_compare((kiln_compare_op_t)c->row->sub, in[0], in[1], out); }

/* Four scalars per dtype; the contiguous 2-D and larger shapes with the first only. */
static void kt_build_binary_scalar(const kt_row_t *row) {
  static const double f32_scalars[] = {0.5, -3.25, 0.1, 0};
  static const double i32_scalars[] = {3, -2, 0, -1};
  for (int dt = 0; dt < 2; dt++) {
    for (size_t k = 0; k < 4; k++) {
      for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s) || (s->ndim >= 2 && !s->view && k > 0)) continue;
        kt_case_t c = kt_case(row);
        c.n_in = 1;
        c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : row->gen != KT_UNSET ? row->gen : KT_WIDE, 31,
                        s->ndim, s->s, s->view);
        c.scalar = dt ? i32_scalars[k] : f32_scalars[k];
        char a[160];
        kt_in_text(&c.in[0], a, sizeof a);
        snprintf(c.label, sizeof c.label, "%s %s, %g", row->name, a, c.scalar);
        kt_check(&c);
      }
    }
  }
}

KT_RUN_SHARED(kt_run_binary_scalar) {
  return kiln_tensor_binary_scalar((kiln_binary_op_t)c->row->sub, in[0], c->scalar, out);
}

/* f32 -> i32, i32 -> f32 and each dtype to itself, over the elementwise shapes. */
static void kt_build_cast(const kt_row_t *row) {
  static const kiln_dtype_t pairs[][2] = {
      {KILN_F32, KILN_I32}, {KILN_I32, KILN_F32}, {KILN_F32, KILN_F32}, {KILN_I32, KILN_I32}};
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(pairs[p][0], pairs[p][0] == KILN_I32 ? KT_CAST_I32 : KT_CAST_F32, 101, s->ndim, s->s, s->view);
      c.dtype = pairs[p][1];
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s %s to %s", row->name, in, kiln_dtype_name(c.dtype));
      kt_check(&c);
    }
  }
}

KT_RUN(kt_run_cast) { return kiln_tensor_cast(in[0], c->dtype, out); }

/* What tensor.h documents: f32 -> i32 truncates toward zero, NaN is 0 and
 * values beyond the range the nearest limit; i32 -> f32 rounds to nearest,
 * ties to even (C's conversion in the default rounding mode); to the same
 * dtype the values, bit for bit. */
static void kt_expect_cast(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  out->status = KILN_OK;
  out->dtype = c->dtype;
  out->ndim = in[0].ndim;
  memcpy(out->shape, in[0].shape, sizeof out->shape);
  out->numel = in[0].numel;
  out->data = malloc((size_t)(out->numel > 0 ? out->numel : 1) * 4);
  ck_assert_ptr_nonnull(out->data);
  for (int64_t i = 0; i < out->numel; i++) {
    if (in[0].dtype == KILN_F32 && c->dtype == KILN_I32) {
      float f = ((const float *)in[0].data)[i];
      int32_t v = isnan(f) ? 0 : f >= 2147483648.0f ? INT32_MAX : f < -2147483648.0f ? INT32_MIN : (int32_t)f;
      ((int32_t *)out->data)[i] = v;
    } else if (in[0].dtype == KILN_I32 && c->dtype == KILN_F32) {
      ((float *)out->data)[i] = (float)((const int32_t *)in[0].data)[i];
    } else {
      memcpy((char *)out->data + 4 * i, (const char *)in[0].data + 4 * i, 4);
    }
  }
}

/* eq of the values conversions plant (NaN, -0.0, infinities, denormals) in
 * both operands at once: 1 where they are equal except for NaN, against
 * tensor.h's words on the host. */
static void kt_build_eq_special(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      kt_gen_t gen = dt ? KT_CAST_I32 : KT_CAST_F32;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, gen, 211, s->ndim, s->s, false);
      c.in[1] = kt_in(dt ? KILN_I32 : KILN_F32, gen, 212, s->ndim, s->s, false);
      char a[160];
      kt_in_text(&c.in[0], a, sizeof a);
      snprintf(c.label, sizeof c.label, "eq %s, %s (special values)", a, a);
      kt_check(&c);
    }
  }
}

static void kt_expect_eq(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  (void)c;
  kt_result_alloc(out, in[0].dtype, in[0].ndim, in[0].shape);
  for (int64_t i = 0; i < out->numel; i++) {
    if (in[0].dtype == KILN_F32)
      ((float *)out->data)[i] = ((const float *)in[0].data)[i] == ((const float *)in[1].data)[i] ? 1.0f : 0.0f;
    else
      ((int32_t *)out->data)[i] = ((const int32_t *)in[0].data)[i] == ((const int32_t *)in[1].data)[i];
  }
}

/* where(cond, a, b): each cond dtype (f32 with NaN, -0.0 and denormals
 * planted; i32 with zeros) with each value dtype (bit patterns of every
 * kind), over the elementwise shapes (cond a view where the shape says) and
 * broadcast triples; a dtype mismatch and a shape that does not broadcast
 * must fail. */
static void kt_build_where(const kt_row_t *row) {
  static const kt_shape_t triples[][3] = {
      {{2, {3, 1}, false, false}, {2, {1, 4}, false, false}, {1, {4}, false, false}},
      {{3, {2, 1, 3}, true, false}, {1, {3}, false, false}, {2, {4, 1}, false, false}},
      {{1, {1}, false, false}, {2, {2, 3}, true, false}, {0, {0}, false, false}},
      {{2, {0, 3}, false, false}, {1, {3}, false, false}, {1, {1}, false, false}},
      {{2, {13, 1}, false, true}, {2, {1, 257}, true, true}, {1, {257}, false, true}},
  };
  static const kiln_dtype_t dtypes[2] = {KILN_F32, KILN_I32};
  for (int cd = 0; cd < 2; cd++) {
    const kt_gen_t cond_gen = cd ? KT_INT_DIV : KT_CAST_F32;
    for (int vd = 0; vd < 2; vd++) {
      const kt_gen_t value_gen = vd ? KT_INT_EDGE : KT_CAST_F32;
      for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        kt_case_t c = kt_case(row);
        c.n_in = 3;
        c.in[0] = kt_in(dtypes[cd], cond_gen, 301, s->ndim, s->s, s->view);
        c.in[1] = kt_in(dtypes[vd], value_gen, 302, s->ndim, s->s, false);
        c.in[2] = kt_in(dtypes[vd], value_gen, 303, s->ndim, s->s, s->view);
        char t[3][160];
        for (int i = 0; i < 3; i++) kt_in_text(&c.in[i], t[i], sizeof t[i]);
        snprintf(c.label, sizeof c.label, "%s %s, %s, %s", row->name, t[0], t[1], t[2]);
        kt_check(&c);
      }
      for (size_t i = 0; i < sizeof triples / sizeof triples[0]; i++) {
        if (kt_skip(&triples[i][0]) || kt_skip(&triples[i][1]) || kt_skip(&triples[i][2])) continue;
        kt_case_t c = kt_case(row);
        c.n_in = 3;
        for (int k = 0; k < 3; k++)
          c.in[k] = kt_in(k ? dtypes[vd] : dtypes[cd], k ? value_gen : cond_gen, 304 + (uint32_t)k,
                          triples[i][k].ndim, triples[i][k].s, triples[i][k].view);
        char t[3][160];
        for (int k = 0; k < 3; k++) kt_in_text(&c.in[k], t[k], sizeof t[k]);
        snprintf(c.label, sizeof c.label, "%s %s, %s, %s (broadcast)", row->name, t[0], t[1], t[2]);
        kt_check(&c);
      }
    }
  }
  const int64_t four[1] = {4}, three[1] = {3};
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 3;
  c.in[0] = kt_in(KILN_I32, KT_INT_DIV, 1, 1, three, false);
  c.in[1] = kt_in(KILN_F32, KT_WIDE, 2, 1, four, false);
  c.in[2] = kt_in(KILN_F32, KT_WIDE, 3, 1, four, false);
  snprintf(c.label, sizeof c.label, "%s i32 [3], f32 [4], f32 [4] (shapes do not broadcast)", row->name);
  kt_check(&c);
}

KT_RUN(kt_run_where) { return kiln_tensor_where(in[0], in[1], in[2], out); }

/* tensor.h's words on the host: a's element where cond's is nonzero (NaN
 * included, -0.0 not), else b's, bit for bit, the three broadcast. */
static void kt_expect_where(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  (void)c;
  int ndim = 0;
  for (int i = 0; i < 3; i++)
    if (in[i].ndim > ndim) ndim = in[i].ndim;
  int64_t shape[KILN_MAX_DIMS];
  for (int d = 0; d < ndim; d++) {
    shape[d] = 1;
    for (int i = 0; i < 3; i++) {
      const int j = d - (ndim - in[i].ndim);
      if (j >= 0 && in[i].shape[j] != 1) shape[d] = in[i].shape[j];
    }
  }
  kt_result_alloc(out, in[1].dtype, ndim, shape);
  for (int64_t e = 0; e < out->numel; e++) {
    int64_t at[3] = {0, 0, 0}, rest = e, scale[3] = {1, 1, 1};
    for (int d = ndim - 1; d >= 0; d--) {
      const int64_t coord = rest % shape[d];
      rest /= shape[d];
      for (int i = 0; i < 3; i++) {
        const int j = d - (ndim - in[i].ndim);
        if (j < 0) continue;
        if (in[i].shape[j] != 1) at[i] += coord * scale[i];
        scale[i] *= in[i].shape[j];
      }
    }
    const bool take_a = in[0].dtype == KILN_F32 ? ((const float *)in[0].data)[at[0]] != 0.0f
                                                : ((const int32_t *)in[0].data)[at[0]] != 0;
    memcpy((char *)out->data + 4 * e, (const char *)in[take_a ? 1 : 2].data + 4 * (take_a ? at[1] : at[2]), 4);
  }
}

/* ---- the rows -------------------------------------------------------------------------- */

#define KT_UNARY_ROW(OP, op_, gen_, ulps_, i32_status_only_)                                            \
  {.name = #op_, .op = #op_, .build = kt_build_unary, .run = kt_run_unary,                              \
   .tol = kt_tol_row_ulps, .sub = KILN_UNARY_##OP, .gen = gen_, .ulps = ulps_,                          \
   .i32_status_only = i32_status_only_}
#define KT_BINARY_ROW(OP, op_, ulps_, gen_i32_rhs_)                                                     \
  {.name = #op_, .op = #op_, .build = kt_build_binary, .run = kt_run_binary,                            \
   .tol = kt_tol_row_ulps, .sub = KILN_BINARY_##OP, .ulps = ulps_, .gen_i32_rhs = gen_i32_rhs_}
#define KT_SCALAR_ROW(OP, op_, ulps_)                                                                   \
  {.name = #op_ "_scalar", .op = #op_, .build = kt_build_binary_scalar,                                 \
   .run = kt_run_binary_scalar, .tol = kt_tol_row_ulps, .sub = KILN_BINARY_##OP, .ulps = ulps_}

static const kt_row_t kt_rows[] = {
    /* elementwise: exact in IEEE arithmetic, or a few ulps where OpenCL and
     * CUDA allow them (exp, log, tanh 3-5; sqrt 3 in OpenCL; division 2.5). */
    KT_UNARY_ROW(NEG, neg, KT_WIDE, 0, false),
    KT_UNARY_ROW(ABS, abs, KT_WIDE, 0, false),
    KT_UNARY_ROW(EXP, exp, KT_WIDE, 4, true),
    KT_UNARY_ROW(LOG, log, KT_POSITIVE, 4, true),
    KT_UNARY_ROW(SQRT, sqrt, KT_POSITIVE, 4, true),
    KT_UNARY_ROW(RELU, relu, KT_WIDE, 0, false),
    KT_UNARY_ROW(SIGMOID, sigmoid, KT_WIDE, 8, true),
    KT_UNARY_ROW(TANH, tanh, KT_WIDE, 8, true),
    KT_BINARY_ROW(ADD, add, 0, KT_UNSET),
    KT_BINARY_ROW(SUB, sub, 0, KT_UNSET),
    KT_BINARY_ROW(MUL, mul, 0, KT_UNSET),
    KT_BINARY_ROW(DIV, div, 3, KT_INT_DIV),
    KT_BINARY_ROW(MAXIMUM, maximum, 0, KT_UNSET),
    KT_BINARY_ROW(MINIMUM, minimum, 0, KT_UNSET),
    KT_SCALAR_ROW(ADD, add, 0),
    KT_SCALAR_ROW(SUB, sub, 0),
    KT_SCALAR_ROW(MUL, mul, 0),
    KT_SCALAR_ROW(DIV, div, 3),
    KT_SCALAR_ROW(MAXIMUM, maximum, 0),
    KT_SCALAR_ROW(MINIMUM, minimum, 0),
    /* eq: small integers, so that equal pairs are common; 0 and 1 exactly. */
    {.name = "eq", .op = "eq", .build = kt_build_binary, .run = kt_run_binary,
     .tol = kt_tol_bits, .sub = KILN_BINARY_EQ, .gen = KT_STEPS},
    {.name = "eq_scalar", .op = "eq", .build = kt_build_binary_scalar,
     .run = kt_run_binary_scalar, .tol = kt_tol_bits, .sub = KILN_BINARY_EQ, .gen = KT_STEPS},
    {.name = "eq", .op = "eq", .build = kt_build_eq_special, .run = kt_run_binary,
     .tol = kt_tol_bits, .expect = kt_expect_eq, .sub = KILN_BINARY_EQ},
    {.name = "cast", .op = "cast", .build = kt_build_cast, .run = kt_run_cast,
     .tol = kt_tol_bits, .expect = kt_expect_cast},
    {.name = "where", .op = "where", .build = kt_build_where, .run = kt_run_where,
     .tol = kt_tol_bits, .expect = kt_expect_where},
    /* comparisons -> bool: small integers (KT_STEPS), so that equal pairs
     * are common, and the edge values of each dtype. */
#define KT_COMPARE_ROW(OP, op_, gen_)                                                                    \
  {.name = #op_, .op = "compare", .build = kt_build_binary, .run = kt_run_compare, .tol = kt_tol_bits,   \
   .sub = KILN_COMPARE_##OP, .gen = gen_}
    KT_COMPARE_ROW(EQUAL, equal, KT_STEPS), KT_COMPARE_ROW(NOT_EQUAL, not_equal, KT_STEPS),
    KT_COMPARE_ROW(LESS, less, KT_STEPS), KT_COMPARE_ROW(LESS_EQUAL, less_equal, KT_STEPS),
    KT_COMPARE_ROW(GREATER, greater, KT_WIDE), KT_COMPARE_ROW(GREATER_EQUAL, greater_equal, KT_WIDE),
    KT_COMPARE_ROW(LOGICAL_AND, logical_and, KT_STEPS), KT_COMPARE_ROW(LOGICAL_OR, logical_or, KT_STEPS),
    KT_COMPARE_ROW(LOGICAL_XOR, logical_xor, KT_STEPS),
#undef KT_COMPARE_ROW
};
#undef KT_UNARY_ROW
#undef KT_BINARY_ROW
#undef KT_SCALAR_ROW

const kt_group_t kt_group_elementwise = {
    .name = "elementwise",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
};
