/* tests/nn/test_nn_loader.c: the batch loader: order fixed by the seed, every sample once per epoch, prefetch on and off alike on every device, work ordered after uploads. */
#include <math.h>

#include "nn_test.h"

/* Each image carries its own index in its first two pixels, so a batch read
 * back says which samples it holds. */
enum { KT_N = 1003, KT_ROWS = 2, KT_COLS = 3, KT_PIX = KT_ROWS * KT_COLS, KT_B = 64 };

static kiln_nn_dataset_t *kt_dataset(void) {
  static uint8_t pixels[KT_N * KT_PIX], labels[KT_N];
  for (int i = 0; i < KT_N; i++) {
    pixels[i * KT_PIX + 0] = (uint8_t)(i & 0xff);
    pixels[i * KT_PIX + 1] = (uint8_t)(i >> 8);
    for (int p = 2; p < KT_PIX; p++) pixels[i * KT_PIX + p] = (uint8_t)((i * 7 + p) & 0xff);
    labels[i] = (uint8_t)(i % 10);
  }
  kiln_nn_dataset_t *ds = NULL;
  KT_OK(kiln_nn_dataset_create(KT_N, KT_ROWS, KT_COLS, 10, pixels, labels, &ds));
  return ds;
}

static kiln_nn_loader_t *kt_loader(const kiln_nn_dataset_t *ds, kiln_device_t *device, uint64_t seed, bool prefetch,
                                   bool drop_last, bool shuffle) {
  kiln_nn_loader_options_t o;
  kiln_nn_loader_options_initialize(&o);
  ck_assert_uint_eq(o.batch_size, 100);
  ck_assert(o.shuffle && o.prefetch && !o.drop_last && o.layout == KILN_NN_NCHW);
  o.batch_size = KT_B;
  o.seed = seed;
  o.prefetch = prefetch;
  o.drop_last = drop_last;
  o.shuffle = shuffle;
  kiln_nn_loader_t *loader = NULL;
  KT_OK(kiln_nn_loader_create(ds, device, &o, &loader));
  return loader;
}

/* Read one batch back, check each sample against its index, append the
 * indices to `order` and the raw floats to `raw` (either may be NULL). */
static void kt_read_batch(const kiln_nn_batch_t *b, size_t *order, float *raw) {
  static float pixels[KT_B * KT_PIX];
  int32_t labels[KT_B];
  ck_assert_uint_le(b->count, KT_B);
  ck_assert_int_eq(kiln_tensor_shape(b->images)[0], (int64_t)b->count);
  ck_assert_int_eq(kiln_tensor_shape(b->labels)[0], (int64_t)b->count);
  KT_OK(kiln_tensor_read(b->images, pixels, b->count * KT_PIX * sizeof(float)));
  KT_OK(kiln_tensor_read(b->labels, labels, b->count * sizeof(int32_t)));
  for (size_t k = 0; k < b->count; k++) {
    int i = (int)lroundf(pixels[k * KT_PIX] * 255.0f) + 256 * (int)lroundf(pixels[k * KT_PIX + 1] * 255.0f);
    ck_assert_int_lt(i, KT_N);
    ck_assert_int_eq(labels[k], i % 10);
    for (int p = 2; p < KT_PIX; p++) ck_assert_float_eq(pixels[k * KT_PIX + p], (float)((i * 7 + p) & 0xff) / 255.0f);
    if (order) order[k] = (size_t)i;
  }
  if (raw) memcpy(raw, pixels, b->count * KT_PIX * sizeof(float));
}

/* One epoch's sample order as the loader hands it out. */
static size_t kt_epoch(kiln_nn_loader_t *loader, uint64_t epoch, size_t *order) {
  size_t at = 0, batches = 0;
  for (;;) {
    kiln_nn_batch_t b;
    KT_OK(kiln_nn_loader_next(loader, &b));
    ck_assert_uint_eq(b.epoch, epoch);
    if (b.count == 0) {
      ck_assert_ptr_null(b.images);
      ck_assert_ptr_null(b.labels);
      ck_assert_uint_eq(b.index, kiln_nn_loader_batch_count(loader));
      break;
    }
    ck_assert_uint_eq(b.index, batches);
    kt_read_batch(&b, order + at, NULL);
    at += b.count;
    batches++;
  }
  ck_assert_uint_eq(batches, kiln_nn_loader_batch_count(loader));
  return at;
}

START_TEST(test_order_fixed_by_seed) {
  kiln_nn_dataset_t *ds = kt_dataset();
  kiln_nn_loader_t *a = kt_loader(ds, kt_nn_cpu(), 42, true, false, true);
  kiln_nn_loader_t *b = kt_loader(ds, kt_nn_cpu(), 42, false, false, true);
  kiln_nn_loader_t *c = kt_loader(ds, kt_nn_cpu(), 43, true, false, true);
  static size_t oa[3][KT_N], ob[KT_N], oc[KT_N], expect[KT_N];
  for (uint64_t e = 0; e < 3; e++) {
    ck_assert_uint_eq(kt_epoch(a, e, oa[e]), KT_N);
    ck_assert_uint_eq(kt_epoch(b, e, ob), KT_N);
    ck_assert_uint_eq(kt_epoch(c, e, oc), KT_N);
    ck_assert_mem_eq(oa[e], ob, sizeof ob);
    ck_assert(memcmp(oa[e], oc, sizeof oc) != 0);
    KT_OK(kiln_nn_shuffle_order(42, e, true, KT_N, expect));
    ck_assert_mem_eq(oa[e], expect, sizeof expect);
  }
  ck_assert(memcmp(oa[0], oa[1], sizeof oa[0]) != 0);
  ck_assert(memcmp(oa[1], oa[2], sizeof oa[0]) != 0);
  /* The generator is part of the contract: these values must never change,
   * or runs stop being reproducible across kiln versions. */
  size_t small[10];
  KT_OK(kiln_nn_shuffle_order(42, 0, true, 10, small));
  size_t sorted_check[10] = {0};
  for (int k = 0; k < 10; k++) sorted_check[small[k]]++;
  for (int k = 0; k < 10; k++) ck_assert_uint_eq(sorted_check[k], 1);
  static const size_t golden[10] = {1, 2, 6, 4, 0, 3, 9, 8, 7, 5}; /* recomputed in Python */
  ck_assert_mem_eq(small, golden, sizeof golden);
  kiln_nn_loader_free(a);
  kiln_nn_loader_free(b);
  kiln_nn_loader_free(c);

  /* shuffle off: the data set's own order. */
  kiln_nn_loader_t *plain = kt_loader(ds, kt_nn_cpu(), 42, true, false, false);
  ck_assert_uint_eq(kt_epoch(plain, 0, ob), KT_N);
  for (size_t i = 0; i < KT_N; i++) ck_assert_uint_eq(ob[i], i);
  kiln_nn_loader_free(plain);
  kiln_nn_dataset_free(ds);
}
END_TEST

START_TEST(test_every_sample_once) {
  kiln_nn_dataset_t *ds = kt_dataset();
  static size_t order[KT_N];
  for (int drop = 0; drop < 2; drop++) {
    for (int prefetch = 0; prefetch < 2; prefetch++) {
      kiln_nn_loader_t *loader = kt_loader(ds, kt_nn_cpu(), 7, prefetch, drop, true);
      ck_assert_uint_eq(kiln_nn_loader_batch_count(loader), drop ? KT_N / KT_B : KT_N / KT_B + 1);
      for (uint64_t e = 0; e < 2; e++) {
        size_t got = kt_epoch(loader, e, order);
        ck_assert_uint_eq(got, drop ? (KT_N / KT_B) * KT_B : KT_N);
        static int seen[KT_N];
        memset(seen, 0, sizeof seen);
        for (size_t k = 0; k < got; k++) ck_assert_int_eq(seen[order[k]]++, 0);
      }
      kiln_nn_loader_free(loader);
    }
  }
  kiln_nn_dataset_free(ds);
}
END_TEST

/* Prefetch on and off hand out the same bytes, on every visible device; the
 * sum each batch's step computes on the device, read only at the end of the
 * epoch, proves the step saw its own batch: not one still uploading, nor one
 * the prefetch already overwrote. */
START_TEST(test_prefetch_same_batches_every_device) {
  kiln_nn_dataset_t *ds = kt_dataset();
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  enum { KT_BATCHES = KT_N / KT_B + 1, KT_EPOCHS = 2 };
  static float raw[2][KT_EPOCHS][KT_BATCHES][KT_B * KT_PIX];
  for (size_t d = 0; d < count; d++) {
    kiln_device_t *device = NULL;
    KT_OK(kiln_device_get(d, &device));
    for (int prefetch = 0; prefetch < 2; prefetch++) {
      kiln_nn_loader_t *loader = kt_loader(ds, device, 1234, prefetch, false, true);
      for (uint64_t e = 0; e < KT_EPOCHS; e++) {
        kiln_tensor_t *sums[KT_BATCHES] = {0};
        size_t counts[KT_BATCHES] = {0};
        kiln_nn_batch_t b;
        for (int i = 0; i < KT_BATCHES; i++) {
          KT_OK(kiln_nn_loader_next(loader, &b));
          ck_assert_uint_eq(b.index, (size_t)i);
          counts[i] = b.count;
          KT_OK(kiln_tensor_sum(b.images, KILN_ALL_AXES, false, &sums[i]));
        }
        KT_OK(kiln_nn_loader_next(loader, &b));
        ck_assert_uint_eq(b.count, 0);
        for (int i = 0; i < KT_BATCHES; i++) {
          double got = 0, expect = 0;
          KT_OK(kiln_tensor_item(sums[i], &got));
          kiln_tensor_release(sums[i]);
          /* The host's sum of the same samples, from the seed's order. */
          static size_t order[KT_N];
          KT_OK(kiln_nn_shuffle_order(1234, e, true, KT_N, order));
          const uint8_t *pixels = kiln_nn_dataset_pixels(ds);
          for (size_t k = 0; k < counts[i]; k++)
            for (int p = 0; p < KT_PIX; p++) expect += pixels[order[(size_t)i * KT_B + k] * KT_PIX + p] / 255.0;
          ck_assert_msg(fabs(got - expect) < 1e-3 * (1 + fabs(expect)), "%s prefetch %d epoch %llu batch %d: sum %g, expected %g",
                        kiln_device_name(device), prefetch, (unsigned long long)e, i, got, expect);
        }
      }
      /* Again from the start, keeping the bytes for the comparison. */
      KT_OK(kiln_nn_loader_reset(loader, 0));
      for (uint64_t e = 0; e < KT_EPOCHS; e++) {
        for (int i = 0;; i++) {
          kiln_nn_batch_t b;
          KT_OK(kiln_nn_loader_next(loader, &b));
          if (b.count == 0) break;
          kt_read_batch(&b, NULL, raw[prefetch][e][i]);
        }
      }
      kiln_nn_loader_free(loader);
    }
    ck_assert_msg(memcmp(raw[0], raw[1], sizeof raw[0]) == 0, "%s: prefetch on and off differ", kiln_device_name(device));
  }
  kiln_nn_dataset_free(ds);
}
END_TEST

START_TEST(test_reset_layout_and_sizes) {
  kiln_nn_dataset_t *ds = kt_dataset();
  kiln_nn_loader_t *loader = kt_loader(ds, kt_nn_cpu(), 5, true, false, true);
  static size_t order[KT_N], expect[KT_N];
  kiln_nn_batch_t b;
  for (int i = 0; i < 3; i++) KT_OK(kiln_nn_loader_next(loader, &b));
  /* Resume at epoch 2: its first batch, in its own order. */
  KT_OK(kiln_nn_loader_reset(loader, 2));
  ck_assert_uint_eq(kt_epoch(loader, 2, order), KT_N);
  KT_OK(kiln_nn_shuffle_order(5, 2, true, KT_N, expect));
  ck_assert_mem_eq(order, expect, sizeof expect);
  KT_OK(kiln_nn_loader_next(loader, &b));
  ck_assert_uint_eq(b.epoch, 3);
  ck_assert_int_eq(kiln_tensor_ndim(b.images), 4);
  const int64_t nchw[4] = {KT_B, 1, KT_ROWS, KT_COLS};
  ck_assert_mem_eq(kiln_tensor_shape(b.images), nchw, sizeof nchw);
  ck_assert_int_eq(kiln_tensor_dtype(b.images), KILN_F32);
  ck_assert_int_eq(kiln_tensor_dtype(b.labels), KILN_I32);
  kiln_nn_loader_free(loader);

  /* Flat images, and a batch larger than the data set: one batch of all. */
  kiln_nn_loader_options_t o;
  kiln_nn_loader_options_initialize(&o);
  o.layout = KILN_NN_FLAT;
  o.batch_size = 5000;
  KT_OK(kiln_nn_loader_create(ds, kt_nn_cpu(), &o, &loader));
  ck_assert_uint_eq(kiln_nn_loader_batch_count(loader), 1);
  KT_OK(kiln_nn_loader_next(loader, &b));
  ck_assert_uint_eq(b.count, KT_N);
  const int64_t flat[2] = {KT_N, KT_PIX};
  ck_assert_mem_eq(kiln_tensor_shape(b.images), flat, sizeof flat);
  kiln_nn_loader_free(loader);
  /* ... which drop_last drops: every call is an epoch's end. */
  o.drop_last = true;
  KT_OK(kiln_nn_loader_create(ds, kt_nn_cpu(), &o, &loader));
  ck_assert_uint_eq(kiln_nn_loader_batch_count(loader), 0);
  KT_OK(kiln_nn_loader_next(loader, &b));
  ck_assert_uint_eq(b.count, 0);
  KT_OK(kiln_nn_loader_next(loader, &b));
  ck_assert_uint_eq(b.count, 0);
  ck_assert_uint_eq(b.epoch, 1);
  kiln_nn_loader_free(loader);

  o.batch_size = 0;
  KT_FAILS(kiln_nn_loader_create(ds, kt_nn_cpu(), &o, &loader), KILN_INVALID_ARGUMENT, "batch_size is 0");
  o.batch_size = 10;
  o.layout = (kiln_nn_layout_t)3;
  KT_FAILS(kiln_nn_loader_create(ds, kt_nn_cpu(), &o, &loader), KILN_INVALID_ARGUMENT, "layout 3 is neither");
  kiln_nn_dataset_t *empty = NULL;
  KT_OK(kiln_nn_dataset_create(0, 28, 28, 10, NULL, NULL, &empty));
  KT_FAILS(kiln_nn_loader_create(empty, kt_nn_cpu(), NULL, &loader), KILN_INVALID_ARGUMENT, "the data set is empty");
  KT_FAILS(kiln_nn_loader_create(NULL, kt_nn_cpu(), NULL, &loader), KILN_INVALID_ARGUMENT, "dataset is NULL");
  KT_FAILS(kiln_nn_loader_next(NULL, &b), KILN_INVALID_ARGUMENT, "loader is NULL");
  KT_FAILS(kiln_nn_shuffle_order(1, 1, true, 3, NULL), KILN_INVALID_ARGUMENT, "out_order is NULL");
  kiln_nn_loader_free(NULL);
  kiln_nn_dataset_free(empty);
  kiln_nn_dataset_free(ds);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  Suite *s = suite_create("nn_loader");
  TCase *tc = tcase_create("loader");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_order_fixed_by_seed);
  tcase_add_test(tc, test_every_sample_once);
  tcase_add_test(tc, test_prefetch_same_batches_every_device);
  tcase_add_test(tc, test_reset_layout_and_sizes);
  suite_add_tcase(s, tc);
  int failed = kt_run_suite(s);
  kiln_deinitialize();
  return failed;
}
