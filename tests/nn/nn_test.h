/* tests/nn/nn_test.h: what libkiln-nn's suites share: a temporary folder per test, files written whole, a seeded generator. */
#ifndef KILN_TESTS_NN_TEST_H
#define KILN_TESTS_NN_TEST_H

#include <stdint.h>

#include "../common.h"
#include "kiln/nn.h"

/* The folder of the running test: made by kt_nn_tmpdir, removed by
 * kt_nn_tmpdir_done or, should the test stop early, at its process's exit. */
static char kt_nn_tmp_[4096];
static pid_t kt_nn_tmp_owner_;

static inline void kt_nn_tmp_cleanup_(void) {
  if (kt_nn_tmp_[0] && getpid() == kt_nn_tmp_owner_) kt_remove_tree_(kt_nn_tmp_);
  kt_nn_tmp_[0] = '\0';
}

static inline const char *kt_nn_tmpdir(void) {
  static int registered;
  kt_nn_tmp_cleanup_();
  const char *tmp = getenv("TMPDIR");
  snprintf(kt_nn_tmp_, sizeof kt_nn_tmp_, "%s/kiln-nn-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  ck_assert_msg(mkdtemp(kt_nn_tmp_) != NULL, "mkdtemp(%s) failed", kt_nn_tmp_);
  kt_nn_tmp_owner_ = getpid();
  if (!registered) {
    registered = 1;
    atexit(kt_nn_tmp_cleanup_);
  }
  return kt_nn_tmp_;
}

static inline void kt_nn_tmpdir_done(void) { kt_nn_tmp_cleanup_(); }

/* "<tmpdir>/<name>" into a static buffer of 8 slots, for several at once. */
static inline const char *kt_nn_path(const char *name) {
  static char slots[8][4200];
  static int next;
  char *p = slots[next++ % 8];
  snprintf(p, sizeof slots[0], "%s/%s", kt_nn_tmp_, name);
  return p;
}

static inline void kt_nn_write_file(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s", path);
  ck_assert_uint_eq(fwrite(data, 1, size, f), size);
  ck_assert_int_eq(fclose(f), 0);
}

/* The whole file in malloc'ed memory; *out_size its length. */
static inline uint8_t *kt_nn_read_file(const char *path, size_t *out_size) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *data = malloc((size_t)size + 1);
  ck_assert_ptr_nonnull(data);
  ck_assert_uint_eq(fread(data, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  *out_size = (size_t)size;
  return data;
}

/* xorshift64*: the tests' own generator, so mutations repeat exactly. */
static inline uint64_t kt_nn_rand(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545f4914f6cdd1dull;
}

static inline kiln_device_t *kt_nn_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu", &device));
  return device;
}

/* A loader of `batch` images (seed 42) in `layout`; the test fails if it
 * cannot be made. */
static inline kiln_nn_loader_t *kt_nn_loader(const kiln_nn_dataset_t *ds, kiln_device_t *device, size_t batch,
                                             bool shuffle, kiln_nn_layout_t layout) {
  kiln_nn_loader_options_t o;
  kiln_nn_loader_options_initialize(&o);
  o.batch_size = batch;
  o.seed = 42;
  o.shuffle = shuffle;
  o.layout = layout;
  kiln_nn_loader_t *loader = NULL;
  KT_OK(kiln_nn_loader_create(ds, device, &o, &loader));
  return loader;
}

/* Every parameter of a model (the f32 master weights), concatenated on the
 * host; the caller frees it. */
static inline float *kt_nn_params(const kiln_nn_model_t *model, size_t *out_count) {
  size_t n = 0, total = 0;
  kiln_nn_param_t *const *params = kiln_nn_model_params(model, &n);
  for (size_t i = 0; i < n; i++) total += (size_t)kiln_tensor_numel(kiln_nn_param_value(params[i]));
  float *all = malloc(total * sizeof(float)), *at = all;
  ck_assert_ptr_nonnull(all);
  for (size_t i = 0; i < n; i++) {
    size_t k = (size_t)kiln_tensor_numel(kiln_nn_param_value(params[i]));
    KT_OK(kiln_tensor_read(kiln_nn_param_value(params[i]), at, k * sizeof(float)));
    at += k;
  }
  *out_count = total;
  return all;
}

#endif /* KILN_TESTS_NN_TEST_H */
