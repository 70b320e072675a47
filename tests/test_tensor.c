/* tests/test_tensor.c: tensors: creation values, random streams, views, reshape, movement, and operation shapes and errors. */
#include <math.h>

#include "common.h"
#include "runtime/internal.h"

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu", &device));
  return device;
}

static kiln_tensor_t *kt_f32(kiln_device_t *d, int ndim, const int64_t *shape, const float *values) {
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_F32, ndim, shape, values, &t));
  return t;
}

static void kt_read_f32(const kiln_tensor_t *t, float *out, size_t n) { KT_OK(kiln_tensor_read(t, out, n * sizeof(float))); }

static void kt_expect_f32(const kiln_tensor_t *t, const float *want, size_t n) {
  float got[256];
  ck_assert_uint_le(n, 256);
  ck_assert_int_eq(kiln_tensor_numel(t), (int64_t)n);
  kt_read_f32(t, got, n);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(got[i] == want[i] || (isnan(got[i]) && isnan(want[i])), "element %zu: %.9g, expected %.9g", i,
                  (double)got[i], (double)want[i]);
}

static void kt_expect_shape(const kiln_tensor_t *t, int ndim, const int64_t *shape) {
  ck_assert_int_eq(kiln_tensor_ndim(t), ndim);
  for (int i = 0; i < ndim; i++) ck_assert_int_eq(kiln_tensor_shape(t)[i], shape[i]);
}

START_TEST(test_creation_values) {
  kiln_device_t *d = kt_cpu();
  int64_t shape[2] = {2, 3};
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_zeros(d, KILN_F32, 2, shape, &t));
  kt_expect_shape(t, 2, shape);
  ck_assert_int_eq(kiln_tensor_strides(t)[0], 3);
  ck_assert_int_eq(kiln_tensor_strides(t)[1], 1);
  ck_assert_int_eq(kiln_tensor_dtype(t), KILN_F32);
  ck_assert_ptr_eq(kiln_tensor_device(t), d);
  ck_assert(kiln_tensor_is_contiguous(t));
  kt_expect_f32(t, (const float[]){0, 0, 0, 0, 0, 0}, 6);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_ones(d, KILN_F32, 2, shape, &t));
  kt_expect_f32(t, (const float[]){1, 1, 1, 1, 1, 1}, 6);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_full(d, KILN_F32, 2, shape, -2.5, &t));
  kt_expect_f32(t, (const float[]){-2.5f, -2.5f, -2.5f, -2.5f, -2.5f, -2.5f}, 6);
  kiln_tensor_release(t);

  int32_t ints[6];
  KT_OK(kiln_tensor_full(d, KILN_I32, 2, shape, 41, &t));
  KT_OK(kiln_tensor_read(t, ints, sizeof ints));
  for (int i = 0; i < 6; i++) ck_assert_int_eq(ints[i], 41);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_ones(d, KILN_I32, 2, shape, &t));
  KT_OK(kiln_tensor_read(t, ints, sizeof ints));
  for (int i = 0; i < 6; i++) ck_assert_int_eq(ints[i], 1);
  kiln_tensor_release(t);

  /* 0-d and empty tensors. */
  KT_OK(kiln_tensor_full(d, KILN_F32, 0, NULL, 3.25, &t));
  ck_assert_int_eq(kiln_tensor_numel(t), 1);
  double v = 0;
  KT_OK(kiln_tensor_item(t, &v));
  ck_assert(v == 3.25);
  kiln_tensor_release(t);
  int64_t empty[2] = {4, 0};
  KT_OK(kiln_tensor_ones(d, KILN_F32, 2, empty, &t));
  ck_assert_int_eq(kiln_tensor_numel(t), 0);
  KT_OK(kiln_tensor_read(t, NULL, 0));
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_empty(d, KILN_I32, 2, shape, &t));
  ck_assert_int_eq(kiln_tensor_numel(t), 6);
  kiln_tensor_release(t);
}
END_TEST

START_TEST(test_arange) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_arange(d, KILN_F32, 0, 5, 1, &t));
  kt_expect_f32(t, (const float[]){0, 1, 2, 3, 4}, 5);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_arange(d, KILN_F32, 1, 2, 0.25, &t));
  kt_expect_f32(t, (const float[]){1, 1.25f, 1.5f, 1.75f}, 4);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_arange(d, KILN_F32, 3, -3, -2, &t));
  kt_expect_f32(t, (const float[]){3, 1, -1}, 3);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_arange(d, KILN_F32, 5, 0, 1, &t));
  ck_assert_int_eq(kiln_tensor_numel(t), 0);
  ck_assert_int_eq(kiln_tensor_ndim(t), 1);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_arange(d, KILN_I32, -2, 3, 1, &t));
  int32_t ints[5];
  KT_OK(kiln_tensor_read(t, ints, sizeof ints));
  for (int i = 0; i < 5; i++) ck_assert_int_eq(ints[i], i - 2);
  kiln_tensor_release(t);
  KT_FAILS(kiln_tensor_arange(d, KILN_F32, 0, 1, 0, &t), KILN_INVALID_ARGUMENT, "step non-zero");
  KT_FAILS(kiln_tensor_arange(d, KILN_F32, 0, INFINITY, 1, &t), KILN_INVALID_ARGUMENT, "finite");
}
END_TEST

START_TEST(test_random_deterministic) {
  kiln_device_t *d = kt_cpu();
  int64_t shape[1] = {1000};
  kiln_tensor_t *a = NULL, *b = NULL, *c = NULL;
  KT_OK(kiln_tensor_uniform(d, 1, shape, 42, -1.0f, 3.0f, &a));
  KT_OK(kiln_tensor_uniform(d, 1, shape, 42, -1.0f, 3.0f, &b));
  KT_OK(kiln_tensor_uniform(d, 1, shape, 43, -1.0f, 3.0f, &c));
  static float va[1000], vb[1000], vc[1000];
  kt_read_f32(a, va, 1000);
  kt_read_f32(b, vb, 1000);
  kt_read_f32(c, vc, 1000);
  ck_assert_mem_eq(va, vb, sizeof va);
  ck_assert(memcmp(va, vc, sizeof va) != 0);
  for (int i = 0; i < 1000; i++) ck_assert_msg(va[i] >= -1.0f && va[i] < 3.0f, "uniform[%d] = %g", i, (double)va[i]);
  /* Element i draws from counter i: a longer tensor starts with the same numbers. */
  int64_t longer[1] = {1500};
  kiln_tensor_t *l = NULL;
  KT_OK(kiln_tensor_uniform(d, 1, longer, 42, -1.0f, 3.0f, &l));
  static float vl[1500];
  kt_read_f32(l, vl, 1500);
  ck_assert_mem_eq(va, vl, sizeof va);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_tensor_release(c);
  kiln_tensor_release(l);

  KT_OK(kiln_tensor_normal(d, 1, shape, 7, 10.0f, 2.0f, &a));
  KT_OK(kiln_tensor_normal(d, 1, shape, 7, 10.0f, 2.0f, &b));
  kt_read_f32(a, va, 1000);
  kt_read_f32(b, vb, 1000);
  ck_assert_mem_eq(va, vb, sizeof va);
  double mean = 0;
  for (int i = 0; i < 1000; i++) {
    ck_assert(isfinite(va[i]));
    mean += va[i] / 1000.0;
  }
  /* Twelve standard errors: a broken generator, not bad luck. */
  ck_assert_msg(fabs(mean - 10.0) < 12 * 2.0 / sqrt(1000.0), "mean %g", mean);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  KT_FAILS(kiln_tensor_normal(d, 1, shape, 7, 0.0f, -1.0f, &a), KILN_INVALID_ARGUMENT, "stddev >= 0");
  KT_FAILS(kiln_tensor_uniform(d, 1, shape, 7, 2.0f, 1.0f, &a), KILN_INVALID_ARGUMENT, "low <= high");
}
END_TEST

START_TEST(test_bad_shapes) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *t = NULL;
  int64_t negative[2] = {2, -3};
  KT_FAILS(kiln_tensor_zeros(d, KILN_F32, 2, negative, &t), KILN_INVALID_ARGUMENT, "size -3 of dimension 1 is negative");
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  KT_FAILS(kiln_tensor_zeros(d, KILN_F32, 9, nine, &t), KILN_INVALID_ARGUMENT, "ndim 9");
  KT_FAILS(kiln_tensor_zeros(d, KILN_F32, -1, nine, &t), KILN_INVALID_ARGUMENT, "ndim -1");
  int64_t huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 2};
  KT_FAILS(kiln_tensor_zeros(d, KILN_F32, 3, huge, &t), KILN_INVALID_ARGUMENT, "overflows");
  int64_t big[1] = {INT64_C(1) << 62};
  KT_FAILS(kiln_tensor_empty(d, KILN_F32, 1, big, &t), KILN_INVALID_ARGUMENT, "overflows");
  int64_t tooBig[1] = {INT64_C(1) << 50};
  KT_FAILS(kiln_tensor_empty(d, KILN_F32, 1, tooBig, &t), KILN_OUT_OF_MEMORY, "cannot allocate");
  int64_t ok[1] = {4};
  KT_FAILS(kiln_tensor_zeros(d, (kiln_dtype_t)10, 1, ok, &t), KILN_INVALID_ARGUMENT, "dtype 10");
  KT_FAILS(kiln_tensor_zeros(NULL, KILN_F32, 1, ok, &t), KILN_INVALID_ARGUMENT, "device is NULL");
  KT_FAILS(kiln_tensor_zeros(d, KILN_F32, 1, NULL, &t), KILN_INVALID_ARGUMENT, "shape is NULL");
  KT_FAILS(kiln_tensor_from_host(d, KILN_F32, 1, ok, NULL, &t), KILN_INVALID_ARGUMENT, "data is NULL");
  ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_read_and_item) {
  kiln_device_t *d = kt_cpu();
  int64_t shape[2] = {2, 2};
  kiln_tensor_t *t = kt_f32(d, 2, shape, (const float[]){1, 2, 3, 4});
  float small[3];
  KT_FAILS(kiln_tensor_read(t, small, sizeof small), KILN_INVALID_ARGUMENT, "holds 12 bytes but the tensor has 16 bytes");
  double v;
  KT_FAILS(kiln_tensor_item(t, &v), KILN_INVALID_ARGUMENT, "4 elements, not one");
  float big[8] = {0};
  KT_OK(kiln_tensor_read(t, big, sizeof big));
  ck_assert(big[3] == 4.0f && big[4] == 0.0f);
  kiln_tensor_release(t);
  int32_t one = -17;
  kiln_tensor_t *i = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_I32, 0, NULL, &one, &i));
  KT_OK(kiln_tensor_item(i, &v));
  ck_assert(v == -17.0);
  kiln_tensor_release(i);
}
END_TEST

START_TEST(test_views) {
  kiln_device_t *d = kt_cpu();
  int64_t shape[2] = {2, 3};
  kiln_tensor_t *t = kt_f32(d, 2, shape, (const float[]){1, 2, 3, 4, 5, 6});
  kiln_tensor_t *tt = NULL, *c = NULL, *same = NULL;
  KT_OK(kiln_tensor_transpose(t, 0, -1, &tt));
  kt_expect_shape(tt, 2, (const int64_t[]){3, 2});
  ck_assert(!kiln_tensor_is_contiguous(tt));
  ck_assert_ptr_eq(kiln_tensor_buffer(tt), kiln_tensor_buffer(t));
  kt_expect_f32(tt, (const float[]){1, 4, 2, 5, 3, 6}, 6);
  KT_OK(kiln_tensor_contiguous(tt, &c));
  ck_assert_ptr_ne(c, tt);
  ck_assert(kiln_tensor_is_contiguous(c));
  ck_assert_ptr_ne(kiln_tensor_buffer(c), kiln_tensor_buffer(t));
  kt_expect_f32(c, (const float[]){1, 4, 2, 5, 3, 6}, 6);
  KT_OK(kiln_tensor_contiguous(c, &same));
  ck_assert_ptr_eq(same, c);
  kiln_tensor_release(same);

  /* permute of a 3-D tensor, read while non-contiguous */
  kiln_tensor_t *r = NULL, *p = NULL;
  kiln_tensor_t *ar = NULL;
  KT_OK(kiln_tensor_arange(d, KILN_F32, 0, 24, 1, &ar));
  KT_OK(kiln_tensor_reshape(ar, 3, (const int64_t[]){2, 3, 4}, &r));
  KT_OK(kiln_tensor_permute(r, (const int[]){2, 0, 1}, &p));
  kt_expect_shape(p, 3, (const int64_t[]){4, 2, 3});
  float got[24];
  kt_read_f32(p, got, 24);
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 2; b++)
      for (int e = 0; e < 3; e++) ck_assert(got[a * 6 + b * 3 + e] == (float)(b * 12 + e * 4 + a));
  KT_FAILS(kiln_tensor_permute(r, (const int[]){0, 0, 1}, &p), KILN_INVALID_ARGUMENT, "repeated");
  KT_FAILS(kiln_tensor_permute(r, (const int[]){0, 3, 1}, &p), KILN_INVALID_ARGUMENT, "perm[1] = 3 is out of range");
  KT_FAILS(kiln_tensor_transpose(r, 0, 3, &tt), KILN_INVALID_ARGUMENT, "dims (0, 3) are out of range");

  /* A sliced-like view through transpose, then an op on the view. */
  kiln_tensor_t *neg = NULL;
  KT_OK(kiln_tensor_neg(p, &neg));
  ck_assert(kiln_tensor_is_contiguous(neg));
  float ng[24];
  kt_read_f32(neg, ng, 24);
  for (int i = 0; i < 24; i++) ck_assert(ng[i] == -got[i]);
  kiln_tensor_release(neg);
  kiln_tensor_release(p);
  kiln_tensor_release(r);
  kiln_tensor_release(ar);
  kiln_tensor_release(c);
  kiln_tensor_release(tt);
  kiln_tensor_release(t);
}
END_TEST

START_TEST(test_reshape) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *a = NULL, *r = NULL, *tt = NULL, *r2 = NULL;
  KT_OK(kiln_tensor_arange(d, KILN_F32, 0, 12, 1, &a));
  KT_OK(kiln_tensor_reshape(a, 3, (const int64_t[]){2, -1, 3}, &r));
  kt_expect_shape(r, 3, (const int64_t[]){2, 2, 3});
  ck_assert_ptr_eq(kiln_tensor_buffer(r), kiln_tensor_buffer(a)); /* a view */
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_reshape(a, 2, (const int64_t[]){3, 4}, &r));
  /* The transpose of [3,4] cannot be flattened without a copy. */
  KT_OK(kiln_tensor_transpose(r, 0, 1, &tt));
  KT_OK(kiln_tensor_reshape(tt, 1, (const int64_t[]){-1}, &r2));
  ck_assert_ptr_ne(kiln_tensor_buffer(r2), kiln_tensor_buffer(a));
  kt_expect_f32(r2, (const float[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, 12);
  kiln_tensor_release(r2);
  /* Splitting a dimension of the transpose is still a view. */
  KT_OK(kiln_tensor_reshape(tt, 3, (const int64_t[]){2, 2, 3}, &r2));
  ck_assert_ptr_eq(kiln_tensor_buffer(r2), kiln_tensor_buffer(a));
  kt_expect_f32(r2, (const float[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, 12);
  kiln_tensor_release(r2);
  KT_FAILS(kiln_tensor_reshape(a, 2, (const int64_t[]){5, -1}, &r2), KILN_SHAPE_MISMATCH, "cannot infer dimension 1");
  KT_FAILS(kiln_tensor_reshape(a, 2, (const int64_t[]){5, 2}, &r2), KILN_SHAPE_MISMATCH,
           "the new shape has 10 elements but the tensor has 12");
  KT_FAILS(kiln_tensor_reshape(a, 2, (const int64_t[]){-1, -1}, &r2), KILN_INVALID_ARGUMENT, "both -1");
  KT_OK(kiln_tensor_reshape(a, 0 + 1, (const int64_t[]){12}, &r2));
  kiln_tensor_release(r2);
  kiln_tensor_release(tt);
  kiln_tensor_release(r);
  kiln_tensor_release(a);
}
END_TEST

START_TEST(test_to_and_copy) {
  kiln_device_t *d = kt_cpu();
  int64_t shape[1] = {3};
  kiln_tensor_t *t = kt_f32(d, 1, shape, (const float[]){1, 2, 3}), *same = NULL, *copy = NULL;
  KT_OK(kiln_tensor_to(t, d, &same));
  ck_assert_ptr_eq(same, t);
  kiln_tensor_release(same);
  KT_OK(kiln_tensor_copy(t, d, &copy));
  ck_assert_ptr_ne(copy, t);
  ck_assert_ptr_ne(kiln_tensor_buffer(copy), kiln_tensor_buffer(t));
  kt_expect_f32(copy, (const float[]){1, 2, 3}, 3);
  ck_assert_ptr_eq(kiln_tensor_retain(t), t);
  kiln_tensor_release(t);
  kiln_tensor_release(copy);
  kiln_tensor_release(t);
  kiln_tensor_release(NULL);
  KT_FAILS(kiln_tensor_to(NULL, d, &copy), KILN_INVALID_ARGUMENT, "tensor is NULL");
}
END_TEST

START_TEST(test_elementwise_ops) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *a = kt_f32(d, 2, (const int64_t[]){2, 3}, (const float[]){1, -2, 3, -4, 5, -6});
  kiln_tensor_t *b = kt_f32(d, 1, (const int64_t[]){3}, (const float[]){10, 20, 30});
  kiln_tensor_t *r = NULL;
  KT_OK(kiln_tensor_add(a, b, &r));
  kt_expect_shape(r, 2, (const int64_t[]){2, 3});
  kt_expect_f32(r, (const float[]){11, 18, 33, 6, 25, 24}, 6);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_binary(KILN_BINARY_MUL, b, a, &r)); /* broadcast on the left operand */
  kt_expect_f32(r, (const float[]){10, -40, 90, -40, 100, -180}, 6);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_relu(a, &r));
  kt_expect_f32(r, (const float[]){1, 0, 3, 0, 5, 0}, 6);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_maximum_scalar(a, 0.5, &r));
  kt_expect_f32(r, (const float[]){1, 0.5f, 3, 0.5f, 5, 0.5f}, 6);
  kiln_tensor_release(r);
  kiln_tensor_t *col = kt_f32(d, 2, (const int64_t[]){2, 1}, (const float[]){100, 200});
  KT_OK(kiln_tensor_sub(col, b, &r)); /* [2,1] - [3] -> [2,3] */
  kt_expect_f32(r, (const float[]){90, 80, 70, 190, 180, 170}, 6);
  kiln_tensor_release(r);

  kiln_tensor_t *bad = kt_f32(d, 1, (const int64_t[]){2}, (const float[]){1, 2});
  KT_FAILS(kiln_tensor_add(a, bad, &r), KILN_SHAPE_MISMATCH, "shapes [2, 3] and [2] do not broadcast");
  kiln_tensor_t *ints = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_I32, 1, (const int64_t[]){4}, (const int32_t[]){7, -7, 0, 9}, &ints));
  KT_FAILS(kiln_tensor_add(bad, ints, &r), KILN_SHAPE_MISMATCH, "shapes [2] and [4] do not broadcast");
  KT_FAILS(kiln_tensor_exp(ints, &r), KILN_DTYPE_MISMATCH, "exp does not support dtype i32");
  KT_OK(kiln_tensor_abs(ints, &r));
  int32_t got[4];
  KT_OK(kiln_tensor_read(r, got, sizeof got));
  ck_assert(got[0] == 7 && got[1] == 7 && got[2] == 0 && got[3] == 9);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_div_scalar(ints, 2, &r));
  KT_OK(kiln_tensor_read(r, got, sizeof got));
  ck_assert(got[0] == 3 && got[1] == -3 && got[2] == 0 && got[3] == 4);
  kiln_tensor_release(r);
  KT_FAILS(kiln_tensor_unary((kiln_unary_op_t)99, a, &r), KILN_INVALID_ARGUMENT, "op 99");
  KT_FAILS(kiln_tensor_add(a, NULL, &r), KILN_INVALID_ARGUMENT, "kiln_tensor_add: b is NULL");
  KT_FAILS(kiln_tensor_add(a, b, NULL), KILN_INVALID_ARGUMENT, "out is NULL");

  /* An empty result enqueues nothing and is still a tensor. */
  kiln_tensor_t *e = NULL;
  KT_OK(kiln_tensor_zeros(d, KILN_F32, 2, (const int64_t[]){0, 3}, &e));
  KT_OK(kiln_tensor_add(e, b, &r));
  kt_expect_shape(r, 2, (const int64_t[]){0, 3});
  kiln_tensor_release(r);
  kiln_tensor_release(e);
  kiln_tensor_release(ints);
  kiln_tensor_release(bad);
  kiln_tensor_release(col);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
}
END_TEST

START_TEST(test_matmul_layouts) {
  kiln_device_t *d = kt_cpu();
  /* a [2,3], b [3,2]; every combination of stored transposes gives a@b. */
  const float av[6] = {1, 2, 3, 4, 5, 6}, bv[6] = {7, 8, 9, 10, 11, 12};
  const float want[4] = {58, 64, 139, 154};
  kiln_tensor_t *a = kt_f32(d, 2, (const int64_t[]){2, 3}, av), *b = kt_f32(d, 2, (const int64_t[]){3, 2}, bv);
  kiln_tensor_t *at = NULL, *bt = NULL, *atc = NULL, *btc = NULL, *r = NULL;
  KT_OK(kiln_tensor_transpose(a, 0, 1, &at));
  KT_OK(kiln_tensor_transpose(b, 0, 1, &bt));
  KT_OK(kiln_tensor_contiguous(at, &atc));
  KT_OK(kiln_tensor_contiguous(bt, &btc));
  KT_OK(kiln_tensor_matmul(a, b, false, false, &r));
  kt_expect_f32(r, want, 4);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_matmul(atc, btc, true, true, &r));
  kt_expect_f32(r, want, 4);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_matmul(at, bt, true, true, &r)); /* views: flags flip back */
  kt_expect_f32(r, want, 4);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_matmul(a, btc, false, true, &r));
  kt_expect_f32(r, want, 4);
  kiln_tensor_release(r);
  KT_FAILS(kiln_tensor_matmul(a, a, false, false, &r), KILN_SHAPE_MISMATCH, "inner dimensions differ");
  KT_FAILS(kiln_tensor_matmul(a, b, false, true, &r), KILN_SHAPE_MISMATCH, "op(a) is 2 x 3 and op(b) is 2 x 3");

  /* batched [2,2,3] @ 2-D [3,2] broadcasts b over the batch */
  kiln_tensor_t *a3 = kt_f32(d, 3, (const int64_t[]){2, 2, 3}, (const float[]){1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0});
  KT_OK(kiln_tensor_matmul(a3, b, false, false, &r));
  kt_expect_shape(r, 3, (const int64_t[]){2, 2, 2});
  kt_expect_f32(r, (const float[]){58, 64, 139, 154, 7, 8, 9, 10}, 8);
  kiln_tensor_release(r);
  /* k == 0 gives zeros */
  kiln_tensor_t *k0a = NULL, *k0b = NULL;
  KT_OK(kiln_tensor_empty(d, KILN_F32, 2, (const int64_t[]){2, 0}, &k0a));
  KT_OK(kiln_tensor_empty(d, KILN_F32, 2, (const int64_t[]){0, 2}, &k0b));
  KT_OK(kiln_tensor_matmul(k0a, k0b, false, false, &r));
  kt_expect_f32(r, (const float[]){0, 0, 0, 0}, 4);
  kiln_tensor_release(r);
  kiln_tensor_t *ints = NULL;
  KT_OK(kiln_tensor_zeros(d, KILN_I32, 2, (const int64_t[]){3, 2}, &ints));
  KT_FAILS(kiln_tensor_matmul(a, ints, false, false, &r), KILN_DTYPE_MISMATCH, "matmul does not support dtype i32");
  kiln_tensor_release(ints);
  kiln_tensor_release(k0a);
  kiln_tensor_release(k0b);
  kiln_tensor_release(a3);
  kiln_tensor_release(at);
  kiln_tensor_release(bt);
  kiln_tensor_release(atc);
  kiln_tensor_release(btc);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
}
END_TEST

START_TEST(test_reductions) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *a = kt_f32(d, 2, (const int64_t[]){2, 3}, (const float[]){1, 5, 3, 4, 2, 6}), *r = NULL;
  KT_OK(kiln_tensor_sum(a, 0, false, &r));
  kt_expect_shape(r, 1, (const int64_t[]){3});
  kt_expect_f32(r, (const float[]){5, 7, 9}, 3);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_sum(a, -1, true, &r));
  kt_expect_shape(r, 2, (const int64_t[]){2, 1});
  kt_expect_f32(r, (const float[]){9, 12}, 2);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_mean(a, KILN_ALL_AXES, false, &r));
  ck_assert_int_eq(kiln_tensor_ndim(r), 0);
  kt_expect_f32(r, (const float[]){3.5f}, 1);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_max(a, 1, false, &r));
  kt_expect_f32(r, (const float[]){5, 6}, 2);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_argmax(a, 1, false, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_I32);
  int32_t idx[2];
  KT_OK(kiln_tensor_read(r, idx, sizeof idx));
  ck_assert(idx[0] == 1 && idx[1] == 2);
  kiln_tensor_release(r);
  /* A reduction over a non-contiguous view. */
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_transpose(a, 0, 1, &t));
  KT_OK(kiln_tensor_sum(t, 1, false, &r));
  kt_expect_f32(r, (const float[]){5, 7, 9}, 3);
  kiln_tensor_release(r);
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_norm(a, &r));
  double v;
  KT_OK(kiln_tensor_item(r, &v));
  ck_assert(fabs(v - sqrt(91.0)) < 1e-5);
  kiln_tensor_release(r);
  KT_FAILS(kiln_tensor_sum(a, 2, false, &r), KILN_INVALID_ARGUMENT, "axis 2 is out of range");

  /* Empty axes: sum 0, mean NaN, max an error. */
  kiln_tensor_t *e = NULL;
  KT_OK(kiln_tensor_zeros(d, KILN_F32, 2, (const int64_t[]){2, 0}, &e));
  KT_OK(kiln_tensor_sum(e, 1, false, &r));
  kt_expect_f32(r, (const float[]){0, 0}, 2);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_mean(e, 1, false, &r));
  kt_expect_f32(r, (const float[]){NAN, NAN}, 2);
  kiln_tensor_release(r);
  KT_FAILS(kiln_tensor_max(e, 1, false, &r), KILN_INVALID_ARGUMENT, "empty");
  KT_FAILS(kiln_tensor_argmax(e, KILN_ALL_AXES, false, &r), KILN_INVALID_ARGUMENT, "empty");
  kiln_tensor_release(e);
  kiln_tensor_t *ints = NULL;
  KT_OK(kiln_tensor_arange(d, KILN_I32, 0, 4, 1, &ints));
  KT_OK(kiln_tensor_sum(ints, 0, false, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_I64); /* the sum of an integer tensor */
  KT_OK(kiln_tensor_item(r, &v));
  ck_assert(v == 6.0);
  kiln_tensor_release(r);
  KT_FAILS(kiln_tensor_mean(ints, 0, false, &r), KILN_DTYPE_MISMATCH, "mean does not support dtype i32");
  kiln_tensor_release(ints);
  kiln_tensor_release(a);
}
END_TEST

START_TEST(test_nn_ops) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *x = kt_f32(d, 2, (const int64_t[]){2, 2}, (const float[]){0, 0, 1, 1}), *r = NULL;
  KT_OK(kiln_tensor_softmax(x, &r));
  kt_expect_f32(r, (const float[]){0.5f, 0.5f, 0.5f, 0.5f}, 4);
  kiln_tensor_release(r);
  kiln_tensor_t *labels = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_I32, 1, (const int64_t[]){2}, (const int32_t[]){0, 1}, &labels));
  KT_OK(kiln_tensor_cross_entropy(x, labels, &r));
  double v;
  KT_OK(kiln_tensor_item(r, &v));
  ck_assert(fabs(v - log(2.0)) < 1e-6);
  kiln_tensor_release(r);
  KT_FAILS(kiln_tensor_cross_entropy(labels, x, &r), KILN_DTYPE_MISMATCH, "pass f32 logits and i32 labels");

  /* conv2d of a 1x1x3x3 input with a 2x2 kernel of ones plus bias 1 */
  kiln_tensor_t *img = NULL, *w = NULL, *bias = NULL;
  KT_OK(kiln_tensor_arange(d, KILN_F32, 1, 10, 1, &img));
  kiln_tensor_t *img4 = NULL;
  KT_OK(kiln_tensor_reshape(img, 4, (const int64_t[]){1, 1, 3, 3}, &img4));
  KT_OK(kiln_tensor_ones(d, KILN_F32, 4, (const int64_t[]){1, 1, 2, 2}, &w));
  KT_OK(kiln_tensor_ones(d, KILN_F32, 1, (const int64_t[]){1}, &bias));
  KT_OK(kiln_tensor_conv2d(img4, w, bias, NULL, &r));
  kt_expect_shape(r, 4, (const int64_t[]){1, 1, 2, 2});
  kt_expect_f32(r, (const float[]){13, 17, 25, 29}, 4);
  kiln_tensor_release(r);
  kiln_conv2d_params_t p = kiln_conv2d_params_default();
  ck_assert(p.stride[0] == 1 && p.padding[1] == 0 && p.dilation[0] == 1);
  kiln_tensor_t *w3 = NULL;
  KT_OK(kiln_tensor_ones(d, KILN_F32, 4, (const int64_t[]){1, 1, 5, 5}, &w3));
  KT_FAILS(kiln_tensor_conv2d(img4, w3, NULL, NULL, &r), KILN_SHAPE_MISMATCH, "no positions");
  kiln_tensor_t *w2c = NULL;
  KT_OK(kiln_tensor_ones(d, KILN_F32, 4, (const int64_t[]){1, 2, 2, 2}, &w2c));
  KT_FAILS(kiln_tensor_conv2d(img4, w2c, NULL, NULL, &r), KILN_SHAPE_MISMATCH, "x has 1 channels but weight expects 2");

  kiln_pool2d_params_t pool = {{2, 2}, {1, 1}, {0, 0}};
  KT_OK(kiln_tensor_max_pool2d(img4, &pool, &r));
  kt_expect_f32(r, (const float[]){5, 6, 8, 9}, 4);
  kiln_tensor_release(r);
  kiln_pool2d_params_t badpool = {{2, 2}, {0, 0}, {2, 0}};
  KT_FAILS(kiln_tensor_max_pool2d(img4, &badpool, &r), KILN_INVALID_ARGUMENT, "padding within [0, kernel/2]");
  kiln_tensor_release(w2c);
  kiln_tensor_release(w3);
  kiln_tensor_release(img);
  kiln_tensor_release(img4);
  kiln_tensor_release(w);
  kiln_tensor_release(bias);
  kiln_tensor_release(labels);
  kiln_tensor_release(x);
}
END_TEST

START_TEST(test_dtype_helpers) {
  ck_assert_str_eq(kiln_dtype_name(KILN_F32), "f32");
  ck_assert_str_eq(kiln_dtype_name(KILN_BF16), "bf16");
  ck_assert_str_eq(kiln_dtype_name((kiln_dtype_t)77), "?");
  ck_assert_uint_eq(kiln_dtype_size(KILN_I32), 4);
  ck_assert_uint_eq(kiln_dtype_size(KILN_F16), 2);
  ck_assert_uint_eq(kiln_dtype_size((kiln_dtype_t)77), 0);
}
END_TEST

/* kiln_deinitialize leaves nothing of kiln's allocated on the calling thread:
 * its cache of recycled tensor structs went unfreed (1,920 bytes still
 * reachable after two start/stop rounds under valgrind). */
START_TEST(test_deinitialize_frees_everything) {
  for (int round = 0; round < 2; round++) {
    kiln_device_t *cpu = NULL;
    KT_OK(kiln_device_find("cpu:0", &cpu));
    kiln_tensor_t *t[40];
    for (int i = 0; i < 40; i++) KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 1, (const int64_t[]){4}, &t[i]));
    for (int i = 0; i < 40; i++) kiln_tensor_release(t[i]);
    ck_assert_int_gt(kiln__tensor_cache_count(), 0);
    kiln_deinitialize();
    ck_assert_int_eq(kiln__tensor_cache_count(), 0);
  }
}
END_TEST


/* Slices are views (offset and strides, the same memory); copy_into writes
 * through any view, broadcasting and converting, and reads an overlapping
 * source first. */
START_TEST(test_slice_and_copy_into) {
  kiln_device_t *d = kt_cpu();
  float v[12];
  for (int i = 0; i < 12; i++) v[i] = (float)i;
  kiln_tensor_t *x = kt_f32(d, 2, (const int64_t[]){3, 4}, v), *a = NULL, *b = NULL, *c = NULL;
  /* x[1:3, ::2] */
  KT_OK(kiln_tensor_slice(x, 0, 1, 3, 1, &a));
  KT_OK(kiln_tensor_slice(a, 1, 0, 4, 2, &b));
  kt_expect_shape(b, 2, (const int64_t[]){2, 2});
  ck_assert_ptr_eq(kiln_tensor_buffer(b), kiln_tensor_buffer(x));
  ck_assert_uint_eq(kiln_tensor_offset_bytes(b), 4 * sizeof(float));
  ck_assert_int_eq(kiln_tensor_strides(b)[0], 4);
  ck_assert_int_eq(kiln_tensor_strides(b)[1], 2);
  kt_expect_f32(b, (const float[]){4, 6, 8, 10}, 4);
  /* Python's clamping and negative bounds: x[-1:100] along dim 1 of row view; step 3. */
  KT_OK(kiln_tensor_slice(x, -1, -3, 100, 2, &c));
  kt_expect_f32(c, (const float[]){1, 3, 5, 7, 9, 11}, 6);
  kiln_tensor_release(c);
  KT_OK(kiln_tensor_slice(x, 0, 2, 1, 1, &c)); /* stop <= start: empty */
  kt_expect_shape(c, 2, (const int64_t[]){0, 4});
  kiln_tensor_release(c);
  ck_assert_int_eq(kiln_tensor_slice(x, 0, 0, 3, 0, &c), KILN_INVALID_ARGUMENT);
  ck_assert_int_eq(kiln_tensor_slice(x, 0, 0, 3, -1, &c), KILN_INVALID_ARGUMENT);
  ck_assert_int_eq(kiln_tensor_slice(x, 2, 0, 3, 1, &c), KILN_INVALID_ARGUMENT);
  /* Write a row of two values, broadcast over b's rows, from i32: x[1:3, ::2] = [100, 200]. */
  kiln_tensor_t *row = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_I32, 1, (const int64_t[]){2}, (const int32_t[]){100, 200}, &row));
  KT_OK(kiln_tensor_copy_into(b, row));
  kt_expect_f32(x, (const float[]){0, 1, 2, 3, 100, 5, 200, 7, 100, 9, 200, 11}, 12);
  /* Overlap: x[0, 1:4] = x[0, 0:3] reads before it writes. */
  kiln_tensor_t *r0 = NULL, *dst = NULL, *src = NULL;
  KT_OK(kiln_tensor_slice(x, 0, 0, 1, 1, &r0));
  KT_OK(kiln_tensor_slice(r0, 1, 1, 4, 1, &dst));
  KT_OK(kiln_tensor_slice(r0, 1, 0, 3, 1, &src));
  KT_OK(kiln_tensor_copy_into(dst, src));
  kt_expect_f32(r0, (const float[]){0, 0, 1, 2}, 4);
  /* A shape that does not broadcast. */
  kiln_tensor_t *three = kt_f32(d, 1, (const int64_t[]){3}, (const float[]){1, 2, 3});
  ck_assert_int_eq(kiln_tensor_copy_into(b, three), KILN_SHAPE_MISMATCH);
  kiln_tensor_release(three);
  kiln_tensor_release(r0);
  kiln_tensor_release(dst);
  kiln_tensor_release(src);
  kiln_tensor_release(row);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_tensor_release(x);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  Suite *s = suite_create("tensor");
  TCase *tc = tcase_create("tensor");
  tcase_add_test(tc, test_creation_values);
  tcase_add_test(tc, test_arange);
  tcase_add_test(tc, test_random_deterministic);
  tcase_add_test(tc, test_bad_shapes);
  tcase_add_test(tc, test_read_and_item);
  tcase_add_test(tc, test_views);
  tcase_add_test(tc, test_reshape);
  tcase_add_test(tc, test_to_and_copy);
  tcase_add_test(tc, test_elementwise_ops);
  tcase_add_test(tc, test_matmul_layouts);
  tcase_add_test(tc, test_reductions);
  tcase_add_test(tc, test_nn_ops);
  tcase_add_test(tc, test_dtype_helpers);
  tcase_add_test(tc, test_slice_and_copy_into);
  tcase_add_test(tc, test_deinitialize_frees_everything);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
