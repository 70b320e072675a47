/* tests/conformance/indexing.c: conformance rows of indexing by a tensor of indices: index_select (a gather along an axis) and index_add (its scatter-add), and their report of an index out of range. */
#include "harness.h"

#include "kernels/dtype_convert.h"

/* The index of a case, made the same way by the run (on the device) and the
 * expectation (on the host): m entries in [-len, len), negative ones too,
 * repeats when m > len. c->steps is m. */
static int64_t kt_index_entry(int64_t j, int64_t len) { return len ? (j * 7 + 3) % (2 * len) - len : 0; }

static kiln_status_t kt_index_tensor(const kt_case_t *c, kiln_device_t *dev, int64_t len, int64_t bad_at,
                                     kiln_tensor_t **out) {
  const int64_t m = c->steps;
  int64_t *v = malloc(sizeof(int64_t) * (size_t)(m ? m : 1));
  ck_assert(v);
  for (int64_t j = 0; j < m; j++) v[j] = j == bad_at ? len + 2 : kt_index_entry(j, len);
  kiln_tensor_t *wide = NULL;
  kiln_status_t status = kiln_tensor_from_host(dev, KILN_I64, 1, &m, v, &wide);
  if (status == KILN_OK) status = kiln_tensor_cast(wide, c->index_dtype, out);
  kiln_tensor_release(wide);
  free(v);
  return status;
}

/* x's [outer, len, inner] along the case's axis. */
static void kt_split(const kt_in_t *x, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < axis; d++) *outer *= x->shape[d];
  for (int d = axis + 1; d < x->ndim; d++) *inner *= x->shape[d];
  *len = x->shape[axis];
}

static const struct {
  int ndim;
  int64_t shape[3];
  int axis;
  int64_t m;
} kt_index_cases[] = {
    {1, {9}, 0, 5},        {1, {9}, 0, 0},         {1, {4}, -1, 11}, /* repeats */
    {2, {6, 5}, 0, 8},     {2, {6, 5}, 1, 3},      {2, {6, 5}, -1, 12},
    {3, {3, 4, 5}, 1, 6},  {3, {3, 4, 5}, 2, 1},   {3, {2, 300, 3}, 1, 700},
    {2, {1000, 17}, 0, 333},
};

static kt_gen_t kt_gen_of(kiln_dtype_t dt) { return kiln_dtype_class(dt) == KILN_DTYPE_CLASS_FLOAT ? KT_WIDE : KT_INT; }

/* ---- index_select ----------------------------------------------------------------------------- */

static void kt_build_index_select(const kt_row_t *row) {
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_I32, KILN_F16, KILN_BF16, KILN_F64,
                                        KILN_I64, KILN_I8,  KILN_U8,  KILN_I16,  KILN_BOOL};
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
    for (size_t k = 0; k < sizeof kt_index_cases / sizeof kt_index_cases[0]; k++) {
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dtypes[d], kt_gen_of(dtypes[d]), 301 + (uint32_t)k, kt_index_cases[k].ndim,
                      kt_index_cases[k].shape, false);
      c.axis = kt_index_cases[k].axis;
      c.steps = (int)kt_index_cases[k].m;
      c.index_dtype = (k + d) % 2 ? KILN_I64 : KILN_I32;
      char a[160];
      kt_in_text(&c.in[0], a, sizeof a);
      snprintf(c.label, sizeof c.label, "index_select %s, axis %d, %d %s indices", a, c.axis, c.steps,
               kiln_dtype_name(c.index_dtype));
      kt_check(&c);
    }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 1;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 2, (const int64_t[]){3, 4}, false);
  c.axis = 2;
  c.steps = 2;
  c.index_dtype = KILN_I32;
  snprintf(c.label, sizeof c.label, "index_select of f32 [3x4] along axis 2");
  kt_check(&c);
}

KT_RUN(kt_run_index_select) {
  int64_t outer, len, inner;
  const int axis = c->axis < 0 ? c->axis + c->in[0].ndim : c->axis;
  if (axis >= c->in[0].ndim) return kiln_tensor_index_select(in[0], c->axis, in[0], out); /* the refusal */
  kt_split(&c->in[0], axis, &outer, &len, &inner);
  kiln_tensor_t *index = NULL;
  kiln_status_t status = kt_index_tensor(c, dev, len, -1, &index);
  if (status == KILN_OK) status = kiln_tensor_index_select(in[0], c->axis, index, out);
  kiln_tensor_release(index);
  return status;
}

static void kt_expect_index_select(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  int64_t outer, len, inner;
  const int axis = c->axis < 0 ? c->axis + c->in[0].ndim : c->axis;
  kt_split(&c->in[0], axis, &outer, &len, &inner);
  int64_t shape[KILN_MAX_DIMS];
  memcpy(shape, in[0].shape, sizeof(int64_t) * (size_t)in[0].ndim);
  shape[axis] = c->steps;
  kt_result_alloc(out, in[0].dtype, in[0].ndim, shape);
  const size_t es = kiln_dtype_size(in[0].dtype);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < c->steps; j++) {
      int64_t k = kt_index_entry(j, len);
      k = k < 0 ? k + len : k;
      memcpy((char *)out->data + (size_t)((o * c->steps + j) * inner) * es,
             (const char *)in[0].data + (size_t)((o * len + k) * inner) * es, (size_t)inner * es);
    }
}

/* ---- index_add ---------------------------------------------------------------------------------- */

static void kt_build_index_add(const kt_row_t *row) {
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16, KILN_I32, KILN_I64};
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
    for (size_t k = 0; k < sizeof kt_index_cases / sizeof kt_index_cases[0]; k++) {
      const int ndim = kt_index_cases[k].ndim;
      const int axis = kt_index_cases[k].axis < 0 ? kt_index_cases[k].axis + ndim : kt_index_cases[k].axis;
      int64_t src_shape[3];
      memcpy(src_shape, kt_index_cases[k].shape, sizeof src_shape);
      src_shape[axis] = kt_index_cases[k].m;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      c.in[0] = kt_in(dtypes[d], kt_gen_of(dtypes[d]), 311 + (uint32_t)k, ndim, kt_index_cases[k].shape, false);
      c.in[1] = kt_in(dtypes[d], kt_gen_of(dtypes[d]), 321 + (uint32_t)k, ndim, src_shape, false);
      c.axis = kt_index_cases[k].axis;
      c.steps = (int)kt_index_cases[k].m;
      c.index_dtype = (k + d) % 2 ? KILN_I64 : KILN_I32;
      c.scalar = k % 3 == 0 ? 1.0 : kiln_dtype_class(dtypes[d]) == KILN_DTYPE_CLASS_FLOAT ? -2.5 : -2.0;
      char a[160];
      kt_in_text(&c.in[0], a, sizeof a);
      if (row->sub)
        snprintf(c.label, sizeof c.label, "index_copy into %s, axis %d, %d %s indices", a, c.axis, c.steps,
                 kiln_dtype_name(c.index_dtype));
      else
        snprintf(c.label, sizeof c.label, "index_add into %s, axis %d, %d %s indices, alpha %g", a, c.axis, c.steps,
                 kiln_dtype_name(c.index_dtype), c.scalar);
      kt_check(&c);
    }
  /* src of another shape. */
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 2, (const int64_t[]){3, 4}, false);
  c.in[1] = kt_in(KILN_F32, KT_WIDE, 2, 2, (const int64_t[]){3, 3}, false);
  c.axis = 0;
  c.steps = 2;
  c.index_dtype = KILN_I32;
  c.scalar = 1;
  snprintf(c.label, sizeof c.label, "index_add into f32 [3x4] of src [3x3], 2 indices along axis 0");
  kt_check(&c);
}

KT_RUN(kt_run_index_add) {
  int64_t outer, len, inner;
  const int axis = c->axis < 0 ? c->axis + c->in[0].ndim : c->axis;
  kt_split(&c->in[0], axis, &outer, &len, &inner);
  kiln_tensor_t *index = NULL;
  kiln_status_t status = kt_index_tensor(c, dev, len, -1, &index);
  if (status == KILN_OK)
    status = c->row->sub ? kiln_tensor_index_copy(in[0], c->axis, index, in[1])
                         : kiln_tensor_index_add(in[0], c->axis, index, in[1], c->scalar);
  kiln_tensor_release(index);
  if (status == KILN_OK) *out = kiln_tensor_retain(in[0]);
  return status;
}

/* The adds in order of the index, each as the dtype computes it (row sub
 * 1: index_copy's stores, in the same order). */
static void kt_expect_index_add(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  int64_t outer, len, inner;
  const int axis = c->axis < 0 ? c->axis + c->in[0].ndim : c->axis;
  kt_split(&c->in[0], axis, &outer, &len, &inner);
  const kiln_dtype_t dt = in[0].dtype;
  kt_result_alloc(out, dt, in[0].ndim, in[0].shape);
  memcpy(out->data, in[0].data, (size_t)in[0].numel * kiln_dtype_size(dt));
  const float af = (float)c->scalar;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < c->steps; j++) {
      int64_t k = kt_index_entry(j, len);
      k = k < 0 ? k + len : k;
      for (int64_t i = 0; i < inner; i++) {
        const int64_t at = (o * len + k) * inner + i, from = (o * c->steps + j) * inner + i;
        if (c->row->sub) { /* index_copy: the last entry wins */
          const size_t es = kiln_dtype_size(dt);
          memcpy((char *)out->data + (size_t)at * es, (const char *)in[1].data + (size_t)from * es, es);
          continue;
        }
        switch (dt) {
        case KILN_F32: {
          float *x = out->data;
          const float p = af * ((const float *)in[1].data)[from];
          x[at] = x[at] + p;
          break;
        }
        case KILN_F64: {
          double *x = out->data;
          x[at] = x[at] + c->scalar * ((const double *)in[1].data)[from];
          break;
        }
        case KILN_F16:
        case KILN_BF16: {
          uint16_t *x = out->data;
          const uint16_t s = ((const uint16_t *)in[1].data)[from];
          const float xf = dt == KILN_F16 ? kiln_dc_f16_to_f32(x[at]) : kiln_dc_bf16_to_f32(x[at]);
          const float sf = dt == KILN_F16 ? kiln_dc_f16_to_f32(s) : kiln_dc_bf16_to_f32(s);
          const float p = af * sf, r = xf + p;
          x[at] = dt == KILN_F16 ? kiln_dc_f64_to_f16(r) : kiln_dc_f64_to_bf16(r);
          break;
        }
        case KILN_I32: {
          int32_t *x = out->data;
          x[at] = (int32_t)((uint32_t)x[at] + (uint32_t)(int32_t)c->scalar * (uint32_t)((const int32_t *)in[1].data)[from]);
          break;
        }
        case KILN_I64: {
          int64_t *x = out->data;
          x[at] = (int64_t)((uint64_t)x[at] + (uint64_t)(int64_t)c->scalar * (uint64_t)((const int64_t *)in[1].data)[from]);
          break;
        }
        default: ck_abort_msg("index_add of %s", kiln_dtype_name(dt));
        }
      }
    }
}

/* ---- an index out of range, on every device ------------------------------------------------------ */

/* The op is enqueued; the next synchronisation (a read) reports the entry
 * with KILN_INDEX_OUT_OF_RANGE naming its position and value, and the
 * queue works again after. */
START_TEST(test_index_out_of_range_is_reported) {
  for (size_t d = 0; d < kt_ndev; d++) {
    kiln_device_t *dev = kt_devs[d];
    const int64_t shape[2] = {5, 3};
    kt_in_t xin = kt_in(KILN_F32, KT_WIDE, 9, 2, shape, false);
    kiln_tensor_t *x = NULL, *index = NULL, *y = NULL, *src = NULL;
    KT_OK(kt_make(dev, &xin, &x));
    for (int which = 0; which < 2; which++) {
      kt_case_t c = {.steps = 4, .index_dtype = which ? KILN_I64 : KILN_I32};
      KT_OK(kt_index_tensor(&c, dev, 5, 2, &index));
      float host[15];
      if (which == 0) {
        KT_OK(kiln_tensor_index_select(x, 0, index, &y));
        const kiln_status_t status = kiln_tensor_read(y, host, 4 * 3 * sizeof(float));
        ck_assert_msg(status == KILN_INDEX_OUT_OF_RANGE, "index_select on %s: the read gave %s (%s)",
                      kiln_device_name(dev), kiln_status_name(status), kiln_last_error());
        ck_assert_msg(strstr(kiln_last_error(), "index 7 at position 2") != NULL, "the message: %s",
                      kiln_last_error());
        kiln_tensor_release(y);
      } else {
        KT_OK(kiln_tensor_zeros(dev, KILN_F32, 2, (const int64_t[]){4, 3}, &src));
        KT_OK(kiln_tensor_index_add(x, 0, index, src, 1.0));
        const kiln_status_t status = kiln_tensor_read(x, host, sizeof host);
        ck_assert_msg(status == KILN_INDEX_OUT_OF_RANGE, "index_add on %s: the read gave %s (%s)",
                      kiln_device_name(dev), kiln_status_name(status), kiln_last_error());
        kiln_tensor_release(src);
      }
      kiln_tensor_release(index);
      /* The queue goes on. */
      KT_OK(kiln_tensor_read(x, host, sizeof host));
    }
    kiln_tensor_release(x);
  }
}
END_TEST

static const kt_row_t kt_rows[] = {
    {.name = "index_select", .op = "gather", .build = kt_build_index_select, .run = kt_run_index_select,
     .tol = kt_tol_exact, .expect = kt_expect_index_select},
    {.name = "index_add", .op = "index_add", .build = kt_build_index_add, .run = kt_run_index_add,
     .tol = kt_tol_exact, .expect = kt_expect_index_add},
    {.name = "index_copy", .op = "index_add", .build = kt_build_index_add, .run = kt_run_index_add,
     .tol = kt_tol_exact, .expect = kt_expect_index_add, .sub = 1},
};

static void kt_add_tests(TCase *tc) { tcase_add_test(tc, test_index_out_of_range_is_reported); }

const kt_group_t kt_group_indexing = {
    .name = "indexing",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
    .add_tests = kt_add_tests,
};
