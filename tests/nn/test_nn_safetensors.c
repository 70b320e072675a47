/* tests/nn/test_nn_safetensors.c: safetensors: round trips on every device, the reference writer's exact bytes, PyTorch's files, load_into, and hostile files refused with their messages. */
#include <sys/syscall.h>
#include <sys/wait.h>

#include "nn_test.h"

static const char *kt_data_dir(void) {
  const char *dir = getenv("KILN_NN_TEST_DATA");
  ck_assert_msg(dir && *dir, "KILN_NN_TEST_DATA is not set (meson sets it to tests/nn/data)");
  return dir;
}

static kiln_tensor_t *kt_f32(kiln_device_t *d, int ndim, const int64_t *shape, float start, float step) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = start + step * (float)i;
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_F32, ndim, shape, v, &t));
  free(v);
  return t;
}

static void kt_expect_f32(const kiln_tensor_t *t, int ndim, const int64_t *shape, float start, float step) {
  ck_assert_int_eq(kiln_tensor_dtype(t), KILN_F32);
  ck_assert_int_eq(kiln_tensor_ndim(t), ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    ck_assert_int_eq(kiln_tensor_shape(t)[i], shape[i]);
    n *= shape[i];
  }
  float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  KT_OK(kiln_tensor_read(t, v, (size_t)n * sizeof *v));
  for (int64_t i = 0; i < n; i++) ck_assert_float_eq(v[i], start + step * (float)i);
  free(v);
}

START_TEST(test_round_trip_every_device) {
  kt_nn_tmpdir();
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  for (size_t d = 0; d < count; d++) {
    kiln_device_t *dev = NULL;
    KT_OK(kiln_device_get(d, &dev));
    int64_t s34[2] = {3, 4}, s4[1] = {4}, s05[2] = {0, 5}, s2[1] = {2}, s23[2] = {2, 3};
    int32_t ids[6] = {-3, -2, -1, 0, 1, 2147483647};
    kiln_tensor_t *ids_t = NULL, *wide = kt_f32(dev, 2, s34, 0.0f, 1.0f), *view = NULL;
    KT_OK(kiln_tensor_from_host(dev, KILN_I32, 2, s23, ids, &ids_t));
    KT_OK(kiln_tensor_transpose(wide, 0, 1, &view)); /* saved row-major as [4, 3] */
    kiln_nn_named_tensor_t in[] = {
        {"w", kt_f32(dev, 2, s34, -1.0f, 0.5f)}, {"b", kt_f32(dev, 1, s4, 0.25f, -0.125f)},
        {"ids", ids_t},                          {"scale", kt_f32(dev, 0, NULL, 3.25f, 0.0f)},
        {"empty", kt_f32(dev, 2, s05, 0, 0)},    {"couche.poids/名前", kt_f32(dev, 1, s2, 7.0f, 1.0f)},
        {"wt", view},
    };
    size_t n = sizeof in / sizeof *in;
    kiln_nn_metadata_t meta[] = {{"format", "pt"}, {"epoch", "3"}};
    const char *path = kt_nn_path("model.safetensors");
    KT_OK(kiln_nn_safetensors_save(path, in, n, meta, 2));

    kiln_nn_safetensors_t *file = NULL;
    KT_OK(kiln_nn_safetensors_load(path, dev, &file));
    ck_assert_uint_eq(kiln_nn_safetensors_count(file), n);
    /* The reference writer's order: F32 by name, then I32. */
    const char *order[] = {"b", "couche.poids/名前", "empty", "scale", "w", "wt", "ids"};
    for (size_t i = 0; i < n; i++) {
      ck_assert_str_eq(kiln_nn_safetensors_name(file, i), order[i]);
      ck_assert_ptr_eq(kiln_tensor_device(kiln_nn_safetensors_tensor(file, i)), dev);
    }
    ck_assert_ptr_null(kiln_nn_safetensors_name(file, n));
    kiln_tensor_t *t = NULL;
    KT_OK(kiln_nn_safetensors_find(file, "w", &t));
    kt_expect_f32(t, 2, s34, -1.0f, 0.5f);
    KT_OK(kiln_nn_safetensors_find(file, "b", &t));
    kt_expect_f32(t, 1, s4, 0.25f, -0.125f);
    KT_OK(kiln_nn_safetensors_find(file, "scale", &t));
    kt_expect_f32(t, 0, NULL, 3.25f, 0.0f);
    KT_OK(kiln_nn_safetensors_find(file, "empty", &t));
    kt_expect_f32(t, 2, s05, 0, 0);
    KT_OK(kiln_nn_safetensors_find(file, "couche.poids/名前", &t));
    kt_expect_f32(t, 1, s2, 7.0f, 1.0f);
    KT_OK(kiln_nn_safetensors_find(file, "wt", &t));
    float wt[12];
    KT_OK(kiln_tensor_read(t, wt, sizeof wt));
    ck_assert_int_eq(kiln_tensor_shape(t)[0], 4);
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 3; c++) ck_assert_float_eq(wt[r * 3 + c], (float)(c * 4 + r));
    KT_OK(kiln_nn_safetensors_find(file, "ids", &t));
    int32_t got_ids[6];
    KT_OK(kiln_tensor_read(t, got_ids, sizeof got_ids));
    ck_assert_mem_eq(got_ids, ids, sizeof ids);
    ck_assert_int_eq(kiln_tensor_dtype(t), KILN_I32);
    KT_FAILS(kiln_nn_safetensors_find(file, "nope", &t), KILN_NOT_FOUND, "no tensor \"nope\" among the file's 7");
    ck_assert_uint_eq(kiln_nn_safetensors_metadata_count(file), 2);
    ck_assert_str_eq(kiln_nn_safetensors_metadata_value(file, "format"), "pt");
    ck_assert_str_eq(kiln_nn_safetensors_metadata_value(file, "epoch"), "3");
    ck_assert_ptr_null(kiln_nn_safetensors_metadata_value(file, "other"));
    const char *key, *value;
    KT_OK(kiln_nn_safetensors_metadata(file, 0, &key, &value));
    ck_assert_str_eq(key, "format");
    KT_FAILS(kiln_nn_safetensors_metadata(file, 2, &key, &value), KILN_NOT_FOUND, "entry 2 of 2");
    kiln_nn_safetensors_free(file);

    /* Into tensors that exist (zeros on the same device), by name. */
    kiln_tensor_t *w0 = NULL, *ids0 = NULL;
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 2, s34, &w0));
    KT_OK(kiln_tensor_zeros(dev, KILN_I32, 2, s23, &ids0));
    kiln_nn_named_tensor_t into[] = {{"w", w0}, {"ids", ids0}};
    KT_OK(kiln_nn_safetensors_load_into(path, into, 2, false));
    kt_expect_f32(w0, 2, s34, -1.0f, 0.5f);
    KT_OK(kiln_tensor_read(ids0, got_ids, sizeof got_ids));
    ck_assert_mem_eq(got_ids, ids, sizeof ids);
    kiln_tensor_release(w0);
    kiln_tensor_release(ids0);
    for (size_t i = 0; i < n; i++) kiln_tensor_release(in[i].tensor);
    kiln_tensor_release(wide);
  }
  kt_nn_tmpdir_done();
}
END_TEST

/* The bytes of a small file, exactly: the length, the compact JSON with
 * __metadata__ first, spaces to a multiple of 8, the data. */
START_TEST(test_exact_bytes) {
  kt_nn_tmpdir();
  int64_t s2[1] = {2}, s1[1] = {1};
  int32_t one = -7;
  kiln_tensor_t *b = NULL;
  KT_OK(kiln_tensor_from_host(kt_nn_cpu(), KILN_I32, 1, s1, &one, &b));
  kiln_nn_named_tensor_t in[] = {{"b", b}, {"a", kt_f32(kt_nn_cpu(), 1, s2, 1.0f, 1.0f)}};
  kiln_nn_metadata_t meta[] = {{"format", "pt"}};
  const char *path = kt_nn_path("small.safetensors");
  KT_OK(kiln_nn_safetensors_save(path, in, 2, meta, 1));
  const char *json = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
  size_t len = strlen(json), padded = (len + 7) / 8 * 8;
  uint8_t expect[512] = {0};
  for (int i = 0; i < 8; i++) expect[i] = (uint8_t)(padded >> (8 * i));
  memcpy(expect + 8, json, len);
  memset(expect + 8 + len, ' ', padded - len);
  const float a[2] = {1.0f, 2.0f};
  memcpy(expect + 8 + padded, a, 8);
  memcpy(expect + 8 + padded + 8, &one, 4);
  size_t size = 0;
  uint8_t *got = kt_nn_read_file(path, &size);
  ck_assert_uint_eq(size, 8 + padded + 12);
  ck_assert_mem_eq(got, expect, size);
  free(got);
  kiln_tensor_release(in[0].tensor);
  kiln_tensor_release(in[1].tensor);
  /* Nothing but the file is left in the folder: the temporary was renamed. */
  DIR *dir = opendir(kt_nn_tmp_);
  int entries = 0;
  for (struct dirent *e; (e = readdir(dir)) != NULL;) entries += e->d_name[0] != '.';
  closedir(dir);
  ck_assert_int_eq(entries, 1);
  kt_nn_tmpdir_done();
}
END_TEST

/* Files written by PyTorch through the reference library
 * (tests/nn/make_reference.py): values as its formulas say, and kiln writes
 * the very same bytes back. */
START_TEST(test_pytorch_reference_files) {
  kt_nn_tmpdir();
  char path[4200];
  snprintf(path, sizeof path, "%s/reference.safetensors", kt_data_dir());
  kiln_nn_safetensors_t *file = NULL;
  KT_OK(kiln_nn_safetensors_load(path, kt_nn_cpu(), &file));
  ck_assert_uint_eq(kiln_nn_safetensors_count(file), 6);
  ck_assert_str_eq(kiln_nn_safetensors_metadata_value(file, "format"), "pt");
  kiln_tensor_t *t = NULL;
  int64_t s34[2] = {3, 4}, s05[2] = {0, 5}, s2133[4] = {2, 1, 3, 3};
  KT_OK(kiln_nn_safetensors_find(file, "fc1.weight", &t));
  kt_expect_f32(t, 2, s34, -1.0f, 0.5f);
  KT_OK(kiln_nn_safetensors_find(file, "conv.weight", &t));
  kt_expect_f32(t, 4, s2133, 0.0f, 0.125f);
  KT_OK(kiln_nn_safetensors_find(file, "scale", &t));
  kt_expect_f32(t, 0, NULL, 3.25f, 0.0f);
  KT_OK(kiln_nn_safetensors_find(file, "empty", &t));
  kt_expect_f32(t, 2, s05, 0, 0);
  KT_OK(kiln_nn_safetensors_find(file, "fc1.bias", &t));
  float bias[4];
  KT_OK(kiln_tensor_read(t, bias, sizeof bias));
  const float expect_bias[4] = {0.25f, -0.5f, 1e-3f, 3.0e7f};
  ck_assert_mem_eq(bias, expect_bias, sizeof bias);
  KT_OK(kiln_nn_safetensors_find(file, "steps", &t));
  int32_t steps[6];
  KT_OK(kiln_tensor_read(t, steps, sizeof steps));
  for (int i = 0; i < 6; i++) ck_assert_int_eq(steps[i], i - 3);

  kiln_nn_named_tensor_t all[6];
  for (size_t i = 0; i < 6; i++)
    all[i] = (kiln_nn_named_tensor_t){kiln_nn_safetensors_name(file, i), kiln_nn_safetensors_tensor(file, i)};
  kiln_nn_metadata_t meta[] = {{"format", "pt"}};
  KT_OK(kiln_nn_safetensors_save(kt_nn_path("again.safetensors"), all, 6, meta, 1));
  size_t n1 = 0, n2 = 0;
  uint8_t *ref = kt_nn_read_file(path, &n1), *ours = kt_nn_read_file(kt_nn_path("again.safetensors"), &n2);
  ck_assert_uint_eq(n1, n2);
  ck_assert_mem_eq(ours, ref, n1);
  free(ref);
  free(ours);
  kiln_nn_safetensors_free(file);

  /* A checkpoint PyTorch saved in bf16 loads into a bf16 tensor, bits as
   * saved (ones: 0x3f80), and f64 into f64; kiln writes both files back byte
   * for byte (the reference writer's order: F32 before BF16). */
  static const char *const others[] = {"bf16.safetensors", "f64.safetensors"};
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/%s", kt_data_dir(), others[k]);
    KT_OK(kiln_nn_safetensors_load(path, kt_nn_cpu(), &file));
    if (k == 0) {
      KT_OK(kiln_nn_safetensors_find(file, "half", &t));
      ck_assert_int_eq(kiln_tensor_dtype(t), KILN_BF16);
      ck_assert_int_eq(kiln_tensor_shape(t)[0], 2);
      uint16_t halves[2];
      KT_OK(kiln_tensor_read(t, halves, sizeof halves));
      ck_assert_uint_eq(halves[0], 0x3f80);
      ck_assert_uint_eq(halves[1], 0x3f80);
      KT_OK(kiln_nn_safetensors_find(file, "ok", &t));
      kt_expect_f32(t, 1, (const int64_t[]){2}, 1.0f, 0.0f);
    } else {
      KT_OK(kiln_nn_safetensors_find(file, "wide", &t));
      ck_assert_int_eq(kiln_tensor_dtype(t), KILN_F64);
      double wide[3];
      KT_OK(kiln_tensor_read(t, wide, sizeof wide));
      for (int i = 0; i < 3; i++) ck_assert_double_eq(wide[i], 1.0);
    }
    size_t count = kiln_nn_safetensors_count(file);
    kiln_nn_named_tensor_t again[2];
    for (size_t i = 0; i < count; i++)
      again[i] = (kiln_nn_named_tensor_t){kiln_nn_safetensors_name(file, i), kiln_nn_safetensors_tensor(file, i)};
    KT_OK(kiln_nn_safetensors_save(kt_nn_path("again.safetensors"), again, count, NULL, 0));
    ref = kt_nn_read_file(path, &n1);
    ours = kt_nn_read_file(kt_nn_path("again.safetensors"), &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert_mem_eq(ours, ref, n1);
    free(ref);
    free(ours);
    kiln_nn_safetensors_free(file);
  }
  /* Into an f32 tensor (a model's parameter) nothing converts: the message
   * names the tensor, both dtypes and the conversion to make. */
  snprintf(path, sizeof path, "%s/bf16.safetensors", kt_data_dir());
  kiln_tensor_t *param = NULL;
  KT_OK(kiln_tensor_zeros(kt_nn_cpu(), KILN_F32, 1, (const int64_t[]){2}, &param));
  kiln_nn_named_tensor_t into[] = {{"half", param}};
  char expect[8192];
  snprintf(expect, sizeof expect,
           "%s: tensor \"half\": the file holds BF16 [2], the tensor to load into is f32 [2]; nothing is converted "
           "on loading: save the checkpoint as F32 (in PyTorch: {k: v.to(torch.float32) for k, v in "
           "state_dict.items()}), or read it with kiln_nn_safetensors_load and convert with kiln_tensor_cast",
           path);
  ck_assert_int_eq(kiln_nn_safetensors_load_into(path, into, 1, false), KILN_DTYPE_MISMATCH);
  ck_assert_str_eq(kiln_last_error(), expect);
  kiln_tensor_release(param);
  kt_nn_tmpdir_done();
}
END_TEST

/* Every dtype: saved under its safetensors name, in the reference writer's
 * order (dtype descending in its enum, then name), loaded back with its
 * dtype, shape and bytes; on each device for the storage that every device
 * has. */
START_TEST(test_every_dtype_round_trip) {
  kt_nn_tmpdir();
  static const struct {
    kiln_dtype_t dtype;
    const char *st, *name;
  } rows[] = {
      {KILN_BOOL, "BOOL", "a_bool"}, {KILN_U8, "U8", "b_u8"},     {KILN_I8, "I8", "c_i8"},
      {KILN_I16, "I16", "d_i16"},    {KILN_F16, "F16", "e_f16"},  {KILN_BF16, "BF16", "f_bf16"},
      {KILN_I32, "I32", "g_i32"},    {KILN_F32, "F32", "h_f32"},  {KILN_F64, "F64", "i_f64"},
      {KILN_I64, "I64", "j_i64"},
  };
  enum { N = sizeof rows / sizeof rows[0] };
  ck_assert_int_eq(N, KILN_DTYPE_COUNT_);
  size_t ndev = 0;
  KT_OK(kiln_device_count(&ndev));
  for (size_t dv = 0; dv < ndev; dv++) {
    kiln_device_t *device = NULL;
    KT_OK(kiln_device_get(dv, &device));
    kiln_nn_named_tensor_t named[N];
    uint8_t bytes[N][24];
    for (int k = 0; k < N; k++) {
      const size_t size = kiln_dtype_size(rows[k].dtype);
      for (size_t i = 0; i < 3 * size; i++) bytes[k][i] = (uint8_t)(0x21 + 7 * i + k);
      if (rows[k].dtype == KILN_BOOL) bytes[k][0] = 1, bytes[k][1] = 0, bytes[k][2] = 1;
      named[k].name = rows[k].name;
      named[k].tensor = NULL;
      KT_OK(kiln_tensor_from_host(device, rows[k].dtype, 1, (const int64_t[]){3}, bytes[k], &named[k].tensor));
    }
    const char *path = kt_nn_path("every.safetensors");
    KT_OK(kiln_nn_safetensors_save(path, named, N, NULL, 0));
    size_t n = 0;
    uint8_t *raw = kt_nn_read_file(path, &n);
    char *header = strndup((const char *)raw + 8, (size_t)raw[0] | (size_t)raw[1] << 8);
    /* Descending rank: I64 F64 F32 I32 BF16 F16 I16 I8 U8 BOOL. */
    const char *prev = header;
    for (int k = N - 1; k >= 0; k--) {
      char want[64];
      snprintf(want, sizeof want, "\"%s\":{\"dtype\":\"%s\",\"shape\":[3]", rows[k].name, rows[k].st);
      const char *at = strstr(header, want);
      ck_assert_msg(at != NULL, "%s not in %s", want, header);
      ck_assert_msg(at >= prev, "%s out of the reference order in %s", want, header);
      prev = at;
    }
    free(header);
    free(raw);
    kiln_nn_safetensors_t *file = NULL;
    KT_OK(kiln_nn_safetensors_load(path, device, &file));
    ck_assert_uint_eq(kiln_nn_safetensors_count(file), N);
    for (int k = 0; k < N; k++) {
      kiln_tensor_t *t = NULL;
      KT_OK(kiln_nn_safetensors_find(file, rows[k].name, &t));
      ck_assert_int_eq(kiln_tensor_dtype(t), rows[k].dtype);
      ck_assert_int_eq(kiln_tensor_shape(t)[0], 3);
      ck_assert_ptr_eq(kiln_tensor_device(t), device);
      uint8_t back[24];
      const size_t size = kiln_dtype_size(rows[k].dtype);
      KT_OK(kiln_tensor_read(t, back, 3 * size));
      ck_assert_mem_eq(back, bytes[k], 3 * size);
    }
    /* Into existing tensors of each dtype, by name. */
    KT_OK(kiln_nn_safetensors_load_into(path, named, N, true));
    kiln_nn_safetensors_free(file);
    for (int k = 0; k < N; k++) kiln_tensor_release(named[k].tensor);
  }
  kt_nn_tmpdir_done();
}
END_TEST

START_TEST(test_load_into_mismatches) {
  kt_nn_tmpdir();
  kiln_device_t *cpu = kt_nn_cpu();
  int64_t s34[2] = {3, 4}, s43[2] = {4, 3}, s4[1] = {4};
  kiln_nn_named_tensor_t saved[] = {{"w", kt_f32(cpu, 2, s34, 1, 1)}, {"b", kt_f32(cpu, 1, s4, 5, 1)}};
  const char *path = kt_nn_path("m.safetensors");
  KT_OK(kiln_nn_safetensors_save(path, saved, 2, NULL, 0));
  kiln_tensor_t *w = NULL, *b = NULL, *wrong = NULL, *ints = NULL, *view = NULL;
  KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 2, s34, &w));
  KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 1, s4, &b));
  KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 2, s43, &wrong));
  KT_OK(kiln_tensor_zeros(cpu, KILN_I32, 1, s4, &ints));
  KT_OK(kiln_tensor_transpose(wrong, 0, 1, &view));
  char expect[8192];

  /* A good first tensor and a bad second: neither is written. */
  kiln_nn_named_tensor_t bad_shape[] = {{"b", b}, {"w", wrong}};
  snprintf(expect, sizeof expect, "%s: tensor \"w\": the file holds F32 [3, 4], the tensor to load into is f32 [4, 3]",
           path);
  ck_assert_int_eq(kiln_nn_safetensors_load_into(path, bad_shape, 2, false), KILN_SHAPE_MISMATCH);
  ck_assert_str_eq(kiln_last_error(), expect);
  kt_expect_f32(b, 1, s4, 0, 0);
  kiln_nn_named_tensor_t bad_dtype[] = {{"b", ints}};
  snprintf(expect, sizeof expect,
           "%s: tensor \"b\": the file holds F32 [4], the tensor to load into is i32 [4]; nothing is converted on "
           "loading: save the checkpoint as I32 (in PyTorch: {k: v.to(torch.int32) for k, v in state_dict.items()}), "
           "or read it with kiln_nn_safetensors_load and convert with kiln_tensor_cast",
           path);
  ck_assert_int_eq(kiln_nn_safetensors_load_into(path, bad_dtype, 1, false), KILN_DTYPE_MISMATCH);
  ck_assert_str_eq(kiln_last_error(), expect);
  kiln_nn_named_tensor_t absent[] = {{"fc9", w}};
  snprintf(expect, sizeof expect, "%s: no tensor \"fc9\" in the file; it holds 2: \"b\", \"w\"", path);
  ck_assert_int_eq(kiln_nn_safetensors_load_into(path, absent, 1, false), KILN_NOT_FOUND);
  ck_assert_str_eq(kiln_last_error(), expect);
  kiln_nn_named_tensor_t only_b[] = {{"b", b}};
  snprintf(expect, sizeof expect, "%s: the file's tensor \"w\" was not asked for; pass strict = false to leave it out",
           path);
  ck_assert_int_eq(kiln_nn_safetensors_load_into(path, only_b, 1, true), KILN_INVALID_ARGUMENT);
  ck_assert_str_eq(kiln_last_error(), expect);
  kt_expect_f32(b, 1, s4, 0, 0);
  KT_OK(kiln_nn_safetensors_load_into(path, only_b, 1, false));
  kt_expect_f32(b, 1, s4, 5, 1);
  kiln_nn_named_tensor_t both[] = {{"w", w}, {"b", b}};
  KT_OK(kiln_nn_safetensors_load_into(path, both, 2, true));
  kt_expect_f32(w, 2, s34, 1, 1);
  kiln_nn_named_tensor_t strided[] = {{"w", view}};
  KT_FAILS(kiln_nn_safetensors_load_into(path, strided, 1, false), KILN_INVALID_ARGUMENT, "is a non-contiguous view");
  KT_FAILS(kiln_nn_safetensors_load_into(kt_nn_path("absent.safetensors"), both, 2, false), KILN_NOT_FOUND,
           "absent.safetensors: cannot open it: No such file or directory");
  kiln_nn_named_tensor_t null_tensor[] = {{"w", NULL}};
  KT_FAILS(kiln_nn_safetensors_load_into(path, null_tensor, 1, false), KILN_INVALID_ARGUMENT, "tensors[0].tensor is NULL");
  kiln_tensor_t *tensors[] = {w, b, wrong, ints, view, saved[0].tensor, saved[1].tensor};
  for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) kiln_tensor_release(tensors[i]);
  kt_nn_tmpdir_done();
}
END_TEST

START_TEST(test_save_refusals) {
  kt_nn_tmpdir();
  kiln_device_t *cpu = kt_nn_cpu();
  int64_t s2[1] = {2};
  kiln_tensor_t *t = kt_f32(cpu, 1, s2, 0, 1);
  const char *path = kt_nn_path("x.safetensors");
  kiln_nn_named_tensor_t dup[] = {{"w", t}, {"v", t}, {"w", t}};
  KT_FAILS(kiln_nn_safetensors_save(path, dup, 3, NULL, 0), KILN_INVALID_ARGUMENT, "two tensors are named \"w\"");
  kiln_nn_named_tensor_t meta_name[] = {{"__metadata__", t}};
  KT_FAILS(kiln_nn_safetensors_save(path, meta_name, 1, NULL, 0), KILN_INVALID_ARGUMENT,
           "tensors[0] is named \"__metadata__\"");
  kiln_nn_named_tensor_t bad_utf8[] = {{"ok", t}, {"caf\xe9", t}};
  KT_FAILS(kiln_nn_safetensors_save(path, bad_utf8, 2, NULL, 0), KILN_INVALID_ARGUMENT,
           "the name of tensors[1] is not valid UTF-8");
  kiln_nn_named_tensor_t surrogate[] = {{"\xed\xa0\x80", t}};
  KT_FAILS(kiln_nn_safetensors_save(path, surrogate, 1, NULL, 0), KILN_INVALID_ARGUMENT, "not valid UTF-8");
  kiln_nn_named_tensor_t null_name[] = {{NULL, t}};
  KT_FAILS(kiln_nn_safetensors_save(path, null_name, 1, NULL, 0), KILN_INVALID_ARGUMENT, "tensors[0].name is NULL");
  kiln_nn_metadata_t meta[] = {{"k", "v"}, {"k", "w"}};
  kiln_nn_named_tensor_t one[] = {{"w", t}};
  KT_FAILS(kiln_nn_safetensors_save(path, one, 1, meta, 2), KILN_INVALID_ARGUMENT, "metadata key \"k\" appears twice");
  KT_FAILS(kiln_nn_safetensors_save(kt_nn_path("no/such/dir/x.safetensors"), one, 1, NULL, 0), KILN_IO,
           "no/such/dir/x.safetensors.tmp-");
  ck_assert(strstr(kiln_last_error(), "No such file or directory") != NULL);
  /* Replacing a file: the old one stays whole until the new one is complete. */
  KT_OK(kiln_nn_safetensors_save(path, one, 1, NULL, 0));
  kiln_nn_named_tensor_t two[] = {{"w", t}, {"v", t}};
  KT_OK(kiln_nn_safetensors_save(path, two, 2, NULL, 0));
  kiln_nn_safetensors_t *file = NULL;
  KT_OK(kiln_nn_safetensors_load(path, cpu, &file));
  ck_assert_uint_eq(kiln_nn_safetensors_count(file), 2);
  kiln_nn_safetensors_free(file);
  /* Nothing at all is a valid file too. */
  KT_OK(kiln_nn_safetensors_save(path, NULL, 0, NULL, 0));
  KT_OK(kiln_nn_safetensors_load(path, cpu, &file));
  ck_assert_uint_eq(kiln_nn_safetensors_count(file), 0);
  kiln_nn_safetensors_free(file);
  kiln_nn_safetensors_free(NULL);
  KT_FAILS(kiln_nn_safetensors_load(kt_nn_tmp_, cpu, &file), KILN_IO, "is not a regular file");
  KT_FAILS(kiln_nn_safetensors_load(NULL, cpu, &file), KILN_INVALID_ARGUMENT, "path is NULL");
  kiln_tensor_release(t);
  kt_nn_tmpdir_done();
}
END_TEST

/* The folder's entry must reach the disk with the file: every fsync of this
 * process is seen here (the suite links libkiln-nn statically), those of a
 * folder counted. */
static int kt_dir_syncs;
int fsync(int fd) {
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) kt_dir_syncs++;
  return (int)syscall(SYS_fsync, fd);
}

static mode_t kt_mode(const char *path) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  return st.st_mode & 07777;
}

/* A pid that no process has any more: a child's, reaped. */
static pid_t kt_dead_pid(void) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) _exit(0);
  ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
  return pid;
}

START_TEST(test_save_replaces_in_place) {
  kt_nn_tmpdir();
  kiln_device_t *cpu = kt_nn_cpu();
  int64_t s2[1] = {2};
  kiln_tensor_t *t = kt_f32(cpu, 1, s2, 0, 1);
  kiln_nn_named_tensor_t one[] = {{"w", t}};
  const char *path = kt_nn_path("x.safetensors");

  /* The folder is synced after the rename. */
  kt_dir_syncs = 0;
  KT_OK(kiln_nn_safetensors_save(path, one, 1, NULL, 0));
  ck_assert_int_eq(kt_dir_syncs, 1);

  /* The replaced file's mode stays, whatever the umask gives a new file. */
  const mode_t modes[] = {0600, 0640, 0604};
  for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
    ck_assert_int_eq(chmod(path, modes[i]), 0);
    KT_OK(kiln_nn_safetensors_save(path, one, 1, NULL, 0));
    ck_assert_uint_eq(kt_mode(path), modes[i]);
  }

  /* Temporaries of a save killed before its rename: those of a dead process
   * go at the next save of the same file; a live process's, another file's
   * and anything not named as a temporary stay. */
  char dead[4300], alive[4300], other[4300], odd[4300];
  snprintf(dead, sizeof dead, "%s.tmp-%ld-3", path, (long)kt_dead_pid());
  snprintf(alive, sizeof alive, "%s.tmp-%ld-0", path, (long)getppid());
  snprintf(other, sizeof other, "%s/y.safetensors.tmp-%ld-0", kt_nn_tmp_, (long)kt_dead_pid());
  snprintf(odd, sizeof odd, "%s.tmp-%ld-3x", path, (long)kt_dead_pid());
  const char *planted[] = {dead, alive, other, odd};
  for (int i = 0; i < 4; i++) kt_nn_write_file(planted[i], "half", 4);
  KT_OK(kiln_nn_safetensors_save(path, one, 1, NULL, 0));
  ck_assert_msg(access(dead, F_OK) != 0, "%s is still there", dead);
  for (int i = 1; i < 4; i++) ck_assert_msg(access(planted[i], F_OK) == 0, "%s was removed", planted[i]);
  /* A bare file name: the current folder is swept and synced. */
  char cwd[4300];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(chdir(kt_nn_tmp_), 0);
  snprintf(dead, sizeof dead, "x.safetensors.tmp-%ld-0", (long)kt_dead_pid());
  kt_nn_write_file(dead, "half", 4);
  kt_dir_syncs = 0;
  KT_OK(kiln_nn_safetensors_save("x.safetensors", one, 1, NULL, 0));
  ck_assert_int_eq(kt_dir_syncs, 1);
  ck_assert_int_ne(access(dead, F_OK), 0);
  ck_assert_int_eq(chdir(cwd), 0);

  /* What kiln's reader refuses, the writer does not write. */
  kiln_nn_named_tensor_t control[] = {{"a\nb", t}};
  KT_FAILS(kiln_nn_safetensors_save(path, control, 1, NULL, 0), KILN_INVALID_ARGUMENT,
           "the name of tensors[0] holds the control character U+000A at byte 1");
  kiln_nn_metadata_t meta[] = {{"k\x01", "v"}};
  KT_FAILS(kiln_nn_safetensors_save(path, one, 1, meta, 1), KILN_INVALID_ARGUMENT,
           "metadata[0]'s key holds the control character U+0001 at byte 1");
  kiln_nn_metadata_t lines[] = {{"k", "line 1\nline 2"}};
  KT_OK(kiln_nn_safetensors_save(path, one, 1, lines, 1));
  kiln_nn_safetensors_t *file = NULL;
  KT_OK(kiln_nn_safetensors_load(path, cpu, &file));
  ck_assert_str_eq(kiln_nn_safetensors_metadata_value(file, "k"), "line 1\nline 2");
  kiln_nn_safetensors_free(file);
  kiln_tensor_release(t);
  kt_nn_tmpdir_done();
}
END_TEST

/* A FIFO without a writer is refused at once: opening it never waits. */
START_TEST(test_fifo_refused_without_blocking) {
  kt_nn_tmpdir();
  kiln_device_t *cpu = kt_nn_cpu();
  const char *path = kt_nn_path("fifo.safetensors");
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  alarm(20);
  kiln_nn_safetensors_t *file = NULL;
  char expect[4400];
  snprintf(expect, sizeof expect, "%s: is not a regular file", path);
  ck_assert_int_eq(kiln_nn_safetensors_load(path, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  kiln_nn_model_t *model = NULL;
  KT_OK(kiln_nn_model_create_preset("mlp", cpu, 1, &model));
  ck_assert_int_eq(kiln_nn_model_load(model, path), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  alarm(0);
  kiln_nn_model_free(model);
  kt_nn_tmpdir_done();
}
END_TEST

Suite *kt_hostile_suite(void);

int main(void) {
  kt_private_cache_dir();
  Suite *s = suite_create("nn_safetensors");
  TCase *tc = tcase_create("safetensors");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_round_trip_every_device);
  tcase_add_test(tc, test_exact_bytes);
  tcase_add_test(tc, test_pytorch_reference_files);
  tcase_add_test(tc, test_every_dtype_round_trip);
  tcase_add_test(tc, test_load_into_mismatches);
  tcase_add_test(tc, test_save_refusals);
  tcase_add_test(tc, test_save_replaces_in_place);
  tcase_add_test(tc, test_fifo_refused_without_blocking);
  suite_add_tcase(s, tc);
  SRunner *runner = srunner_create(s);
  srunner_add_suite(runner, kt_hostile_suite());
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}
