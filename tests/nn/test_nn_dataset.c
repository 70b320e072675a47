/* tests/nn/test_nn_dataset.c: IDX reading: synthetic files (gzipped and raw), every fault with its exact message, KILN_DATA_DIR, the real Fashion-MNIST, mutated bytes. */
#include <zlib.h>

#include "nn_internal.h"
#include "nn_test.h"

#define KT_HINT_MISSING_TAIL                                                                                       \
  "install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), which puts the four " \
  "files in /usr/share/datasets/fashion-mnist"
#define KT_HINT_DAMAGED                                                                                             \
  "the file is damaged: install the Debian package dataset-fashion-mnist again (apt-get install --reinstall "      \
  "dataset-fashion-mnist)"
#define KT_ORIGIN_ARG " (the folder passed to kiln_nn_dataset_load_fashion_mnist)"

/* IDX bytes: magic, big-endian dims, values. */
static uint8_t *kt_idx(uint32_t magic, const uint32_t *dims, int ndim, const uint8_t *values, size_t count,
                       size_t *out_size) {
  size_t size = 4 + 4 * (size_t)ndim + count;
  uint8_t *b = malloc(size), *p = b;
  ck_assert_ptr_nonnull(b);
  for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(magic >> (8 * k));
  for (int d = 0; d < ndim; d++)
    for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(dims[d] >> (8 * k));
  if (count) memcpy(p, values, count);
  *out_size = size;
  return b;
}

static void kt_write_gz(const char *path, const void *data, size_t size) {
  gzFile gz = gzopen(path, "wb");
  ck_assert_ptr_nonnull(gz);
  ck_assert_int_eq(gzwrite(gz, data, (unsigned)size), (int)size);
  ck_assert_int_eq(gzclose(gz), Z_OK);
}

/* A little Fashion-MNIST look-alike: n images of 28x28 whose pixels are a
 * formula of (image, position), labels i % 10. */
enum { KT_N = 5, KT_PIX = 28 * 28 };
static uint8_t kt_pixels[KT_N * KT_PIX], kt_labels[KT_N];

static void kt_fill(void) {
  for (size_t i = 0; i < KT_N * KT_PIX; i++) kt_pixels[i] = (uint8_t)((i * 7 + i / KT_PIX) & 0xff);
  for (int i = 0; i < KT_N; i++) kt_labels[i] = (uint8_t)((i * 3) % 10);
}

/* <tmp>/fm/{prefix}-{images,labels}... from the given bytes (gzipped). */
static void kt_write_split(const char *prefix, const uint8_t *images, size_t images_size, const uint8_t *labels,
                           size_t labels_size) {
  char path[4300];
  snprintf(path, sizeof path, "%s/fm", kt_nn_tmp_);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/fm/%s-images-idx3-ubyte.gz", kt_nn_tmp_, prefix);
  kt_write_gz(path, images, images_size);
  snprintf(path, sizeof path, "%s/fm/%s-labels-idx1-ubyte.gz", kt_nn_tmp_, prefix);
  kt_write_gz(path, labels, labels_size);
}

static void kt_write_good(void) {
  kt_fill();
  uint32_t idims[3] = {KT_N, 28, 28}, ldims[1] = {KT_N};
  size_t is, ls;
  uint8_t *images = kt_idx(0x803, idims, 3, kt_pixels, sizeof kt_pixels, &is);
  uint8_t *labels = kt_idx(0x801, ldims, 1, kt_labels, sizeof kt_labels, &ls);
  kt_write_split("train", images, is, labels, ls);
  kt_write_split("t10k", images, is, labels, ls);
  free(images);
  free(labels);
}

START_TEST(test_synthetic_round_trip) {
  kt_nn_tmpdir();
  kt_write_good();
  kiln_nn_dataset_t *ds = NULL;
  KT_OK(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TEST, &ds));
  kiln_nn_dataset_info_t info;
  KT_OK(kiln_nn_dataset_info(ds, &info));
  ck_assert_uint_eq(info.count, KT_N);
  ck_assert_uint_eq(info.rows, 28);
  ck_assert_uint_eq(info.cols, 28);
  ck_assert_uint_eq(info.classes, 10);
  ck_assert_mem_eq(kiln_nn_dataset_pixels(ds), kt_pixels, sizeof kt_pixels);
  ck_assert_mem_eq(kiln_nn_dataset_labels(ds), kt_labels, sizeof kt_labels);

  /* On the device: f32 scaled by 1/255 exactly, i32 labels, both layouts. */
  kiln_tensor_t *images = NULL, *labels = NULL;
  KT_OK(kiln_nn_dataset_upload(ds, kt_nn_cpu(), KILN_NN_NCHW, &images, &labels));
  ck_assert_int_eq(kiln_tensor_ndim(images), 4);
  int64_t expect_shape[4] = {KT_N, 1, 28, 28};
  ck_assert_mem_eq(kiln_tensor_shape(images), expect_shape, sizeof expect_shape);
  static float got[KT_N * KT_PIX];
  int32_t got_labels[KT_N];
  KT_OK(kiln_tensor_read(images, got, sizeof got));
  KT_OK(kiln_tensor_read(labels, got_labels, sizeof got_labels));
  for (size_t i = 0; i < KT_N * KT_PIX; i++) ck_assert_float_eq(got[i], (float)kt_pixels[i] / 255.0f);
  for (int i = 0; i < KT_N; i++) ck_assert_int_eq(got_labels[i], kt_labels[i]);
  kiln_tensor_release(images);
  kiln_tensor_release(labels);
  KT_OK(kiln_nn_dataset_upload(ds, kt_nn_cpu(), KILN_NN_FLAT, &images, &labels));
  ck_assert_int_eq(kiln_tensor_ndim(images), 2);
  ck_assert_int_eq(kiln_tensor_shape(images)[1], KT_PIX);
  kiln_tensor_release(images);
  kiln_tensor_release(labels);
  KT_FAILS(kiln_nn_dataset_upload(ds, kt_nn_cpu(), (kiln_nn_layout_t)7, &images, &labels), KILN_INVALID_ARGUMENT,
           "layout 7 is neither KILN_NN_NCHW (0) nor KILN_NN_FLAT (1)");
  kiln_nn_dataset_free(ds);

  /* The generic reader takes uncompressed files too, and its own class count. */
  uint32_t idims[3] = {KT_N, 28, 28}, ldims[1] = {KT_N};
  size_t is, ls;
  uint8_t *raw_images = kt_idx(0x803, idims, 3, kt_pixels, sizeof kt_pixels, &is);
  uint8_t *raw_labels = kt_idx(0x801, ldims, 1, kt_labels, sizeof kt_labels, &ls);
  kt_nn_write_file(kt_nn_path("images.idx"), raw_images, is);
  kt_nn_write_file(kt_nn_path("labels.idx"), raw_labels, ls);
  KT_OK(kiln_nn_dataset_load_idx(kt_nn_path("images.idx"), kt_nn_path("labels.idx"), 10, &ds));
  ck_assert_mem_eq(kiln_nn_dataset_pixels(ds), kt_pixels, sizeof kt_pixels);
  kiln_nn_dataset_free(ds);
  char message[8400];
  snprintf(message, sizeof message, "%s: label 9 of sample 3 is outside [0, 8)", kt_nn_path("labels.idx"));
  ck_assert_int_eq(kiln_nn_dataset_load_idx(kt_nn_path("images.idx"), kt_nn_path("labels.idx"), 8, &ds), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), message);
  KT_FAILS(kiln_nn_dataset_load_idx(kt_nn_path("images.idx"), kt_nn_path("labels.idx"), 0, &ds), KILN_INVALID_ARGUMENT,
           "classes 0 is outside [1, 256]");
  free(raw_images);
  free(raw_labels);
  kt_nn_tmpdir_done();
}
END_TEST

/* Replace one file of the train split and expect the exact message. */
static void kt_expect(const char *file, const uint8_t *bytes, size_t size, bool gz, kiln_status_t status,
                      const char *problem) {
  kt_write_good();
  char path[4300], expect[8192];
  snprintf(path, sizeof path, "%s/fm/%s", kt_nn_tmp_, file);
  if (gz) kt_write_gz(path, bytes, size);
  else kt_nn_write_file(path, bytes, size);
  snprintf(expect, sizeof expect, "%s: %s; " KT_HINT_DAMAGED KT_ORIGIN_ARG, path, problem);
  kiln_nn_dataset_t *ds = NULL;
  kiln_status_t got = kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds);
  ck_assert_msg(got == status, "%s: %s, expected %s: %s", problem, kiln_status_name(got), kiln_status_name(status),
                kiln_last_error());
  ck_assert_str_eq(kiln_last_error(), expect);
  ck_assert_ptr_null(ds);
}

START_TEST(test_faults_exact_messages) {
  kt_nn_tmpdir();
  kt_fill();
  uint32_t idims[3] = {KT_N, 28, 28}, ldims[1] = {KT_N};
  size_t n;
  uint8_t *b;
  const char *images = "train-images-idx3-ubyte.gz", *labels = "train-labels-idx1-ubyte.gz";

  b = kt_idx(0x801, idims, 3, kt_pixels, sizeof kt_pixels, &n);
  kt_expect(images, b, n, true, KILN_IO,
            "magic number 0x00000801 is not 0x00000803 (IDX images: unsigned bytes, 3 dimensions); it is not an IDX "
            "images file");
  free(b);
  b = kt_idx(0x803, idims, 3, kt_pixels, sizeof kt_pixels - 392, &n);
  kt_expect(images, b, n, true, KILN_IO,
            "truncated: its dimensions [5, 28, 28] need 3920 bytes of pixels after the header, but it holds 3528");
  free(b);
  uint8_t more[KT_N * KT_PIX + 3] = {0};
  b = kt_idx(0x803, idims, 3, more, sizeof more, &n);
  kt_expect(images, b, n, true, KILN_IO, "holds more bytes than its dimensions say (3920 after the header)");
  free(b);
  kt_expect(images, (const uint8_t *)"\0\0", 2, true, KILN_IO,
            "truncated: 2 bytes, shorter than the 4-byte IDX magic number 0x00000803");
  b = kt_idx(0x803, idims, 3, NULL, 0, &n);
  kt_expect(images, b, 9, true, KILN_IO, "truncated in its header: 5 of the 12 bytes of dimensions");
  free(b);
  uint32_t zero[3] = {KT_N, 0, 28};
  b = kt_idx(0x803, zero, 3, NULL, 0, &n);
  kt_expect(images, b, n, true, KILN_IO, "images of 0 x 28 pixels: a dimension is 0");
  free(b);
  uint32_t huge[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
  b = kt_idx(0x803, huge, 3, NULL, 0, &n);
  kt_expect(images, b, n, true, KILN_IO, "dimensions 4294967295 x 4294967295 x 4294967295 are too large to be real");
  free(b);
  /* Dimensions that claim terabytes beside 5 labels: refused from the two
   * headers, before any pixel is inflated. */
  uint32_t lying[3] = {0xffffffffu, 28, 28};
  b = kt_idx(0x803, lying, 3, kt_pixels, 100, &n);
  char lie[8400];
  snprintf(lie, sizeof lie, "holds 5 labels but %s/fm/%s holds 4294967295 images", kt_nn_tmp_, images);
  char labels_path[4300], lie_expect[16384];
  snprintf(labels_path, sizeof labels_path, "%s/fm/%s", kt_nn_tmp_, labels);
  kt_write_good();
  snprintf(lie_expect, sizeof lie_expect, "%s/fm/%s", kt_nn_tmp_, images);
  kt_write_gz(lie_expect, b, n);
  snprintf(lie_expect, sizeof lie_expect, "%s: %s; " KT_HINT_DAMAGED KT_ORIGIN_ARG, labels_path, lie);
  kiln_nn_dataset_t *ds = NULL;
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), lie_expect);
  /* When both headers tell the same lie, the memory is still only the bytes
   * that are there: the stream ends short. */
  uint32_t many[1] = {0xffffffffu};
  uint8_t *lying_labels = kt_idx(0x801, many, 1, kt_labels, KT_N, &n);
  snprintf(lie_expect, sizeof lie_expect, "%s/fm/%s", kt_nn_tmp_, labels);
  kt_write_gz(lie_expect, lying_labels, n);
  free(lying_labels);
  snprintf(lie_expect, sizeof lie_expect,
           "%s/fm/%s: truncated: its dimensions [4294967295, 28, 28] need 3367254359280 bytes of pixels after the "
           "header, but it holds 100; " KT_HINT_DAMAGED KT_ORIGIN_ARG,
           kt_nn_tmp_, images);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), lie_expect);
  free(b);

  uint8_t bad_labels[KT_N] = {1, 2, 3, 10, 4};
  b = kt_idx(0x801, ldims, 1, bad_labels, KT_N, &n);
  kt_expect(labels, b, n, true, KILN_IO, "label 10 of sample 3 is outside [0, 10)");
  free(b);
  uint32_t four[1] = {4};
  b = kt_idx(0x801, four, 1, kt_labels, 4, &n);
  char problem[8400];
  snprintf(problem, sizeof problem, "holds 4 labels but %s/fm/%s holds 5 images", kt_nn_tmp_, images);
  kt_expect(labels, b, n, true, KILN_IO, problem);
  free(b);
  b = kt_idx(0x801, ldims, 1, kt_labels, 2, &n);
  kt_expect(labels, b, n, true, KILN_IO,
            "truncated: its dimension [5] needs 5 bytes of labels after the header, but it holds 2");
  free(b);
  kt_nn_tmpdir_done();
}
END_TEST

START_TEST(test_damaged_gzip_and_odd_files) {
  kt_nn_tmpdir();
  kt_write_good();
  char path[4300], expect[8192];
  snprintf(path, sizeof path, "%s/fm/train-images-idx3-ubyte.gz", kt_nn_tmp_);
  size_t n;
  uint8_t *gz = kt_nn_read_file(path, &n);
  kiln_nn_dataset_t *ds = NULL;

  /* Cut before the end: the trailer (CRC and length) is missing. */
  kt_nn_write_file(path, gz, n - 6);
  snprintf(expect, sizeof expect,
           "%s: the gzip stream is truncated (zlib: unexpected end of file) after 3936 bytes of data; " KT_HINT_DAMAGED
               KT_ORIGIN_ARG,
           path);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);

  /* A wrong CRC: zlib's own words, not a crash or a silent success. */
  uint8_t *bad = malloc(n);
  memcpy(bad, gz, n);
  bad[n - 8] ^= 0x55;
  kt_nn_write_file(path, bad, n);
  snprintf(expect, sizeof expect, "%s: corrupt gzip data (zlib: incorrect data check); " KT_HINT_DAMAGED KT_ORIGIN_ARG,
           path);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  /* Bytes flipped inside the deflate stream: some zlib error, or the data's own checks. */
  memcpy(bad, gz, n);
  for (size_t i = 20; i < n - 8; i += 7) bad[i] ^= 0xa5;
  kt_nn_write_file(path, bad, n);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
  ck_assert_msg(strstr(kiln_last_error(), KT_HINT_DAMAGED) != NULL, "%s", kiln_last_error());
  free(bad);

  /* Bytes after the gzip stream (zlib's gz* functions would skip them), or
   * a second gzip member: refused, the file must end where its data does. */
  static const char *const trails[] = {"garbage", "\x1f\x8b"};
  for (int k = 0; k < 2; k++) {
    size_t tail_size = k == 0 ? 7 : n;
    uint8_t *longer = malloc(n + tail_size);
    memcpy(longer, gz, n);
    memcpy(longer + n, k == 0 ? (const uint8_t *)trails[0] : gz, tail_size);
    kt_nn_write_file(path, longer, n + tail_size);
    snprintf(expect, sizeof expect,
             "%s: bytes follow its gzip stream (after 3936 bytes of data); kiln reads one gzip member and nothing "
             "after it; " KT_HINT_DAMAGED KT_ORIGIN_ARG,
             path);
    ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
    ck_assert_str_eq(kiln_last_error(), expect);
    free(longer);
  }
  kt_nn_write_file(path, gz, n);
  free(gz);
  KT_OK(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds));
  kiln_nn_dataset_free(ds);
  ds = NULL;

  /* A FIFO with no writer: refused at once, never waited on. */
  unlink(path);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  alarm(20);
  snprintf(expect, sizeof expect, "%s: is not a regular file; " KT_HINT_DAMAGED KT_ORIGIN_ARG, path);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  ck_assert_int_eq(kiln_nn_dataset_load_idx(path, kt_nn_path("fm/train-labels-idx1-ubyte.gz"), 10, &ds), KILN_IO);
  alarm(0);

  /* A folder where a file should be. */
  unlink(path);
  mkdir(path, 0700);
  snprintf(expect, sizeof expect, "%s: is not a regular file; " KT_HINT_DAMAGED KT_ORIGIN_ARG, path);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_path("fm"), KILN_NN_TRAIN, &ds), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  ck_assert_ptr_null(ds);
  kt_nn_tmpdir_done();
}
END_TEST

START_TEST(test_missing_files_and_data_dir) {
  kt_nn_tmpdir();
  char expect[8192];
  kiln_nn_dataset_t *ds = NULL;
  /* An explicit folder without the files. */
  snprintf(expect, sizeof expect,
           "%s/train-images-idx3-ubyte.gz: cannot open it: No such file or directory; " KT_HINT_MISSING_TAIL
               KT_ORIGIN_ARG,
           kt_nn_tmp_);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(kt_nn_tmp_, KILN_NN_TRAIN, &ds), KILN_NOT_FOUND);
  ck_assert_str_eq(kiln_last_error(), expect);

  /* KILN_DATA_DIR names a root whose fashion-mnist/ holds the files. */
  setenv("KILN_DATA_DIR", kt_nn_tmp_, 1);
  snprintf(expect, sizeof expect,
           "%s/fashion-mnist/t10k-images-idx3-ubyte.gz: cannot open it: No such file or directory; " KT_HINT_MISSING_TAIL
           " (KILN_DATA_DIR=%s, so kiln looked in %s/fashion-mnist)",
           kt_nn_tmp_, kt_nn_tmp_, kt_nn_tmp_);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TEST, &ds), KILN_NOT_FOUND);
  ck_assert_str_eq(kiln_last_error(), expect);
  kt_write_good();
  char from[4300], to[4300];
  snprintf(from, sizeof from, "%s/fm", kt_nn_tmp_);
  snprintf(to, sizeof to, "%s/fashion-mnist", kt_nn_tmp_);
  ck_assert_int_eq(rename(from, to), 0);
  KT_OK(kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TEST, &ds));
  kiln_nn_dataset_info_t info;
  KT_OK(kiln_nn_dataset_info(ds, &info));
  ck_assert_uint_eq(info.count, KT_N);
  kiln_nn_dataset_free(ds);
  /* Only the labels missing: the message names that file. */
  snprintf(to, sizeof to, "%s/fashion-mnist/t10k-labels-idx1-ubyte.gz", kt_nn_tmp_);
  unlink(to);
  ck_assert_int_eq(kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TEST, &ds), KILN_NOT_FOUND);
  ck_assert_msg(strstr(kiln_last_error(), "t10k-labels-idx1-ubyte.gz: cannot open it") != NULL, "%s", kiln_last_error());
  unsetenv("KILN_DATA_DIR");

  /* An empty variable counts as unset: the Debian folder is named. */
  setenv("KILN_DATA_DIR", "", 1);
  if (kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TEST, &ds) == KILN_OK) kiln_nn_dataset_free(ds);
  else ck_assert_msg(strstr(kiln_last_error(), "/usr/share/datasets/fashion-mnist/t10k-") == kiln_last_error(), "%s",
                     kiln_last_error());
  unsetenv("KILN_DATA_DIR");

  KT_FAILS(kiln_nn_dataset_load_fashion_mnist(NULL, (kiln_nn_split_t)2, &ds), KILN_INVALID_ARGUMENT,
           "split 2 is neither KILN_NN_TRAIN (0) nor KILN_NN_TEST (1)");
  KT_FAILS(kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TRAIN, NULL), KILN_INVALID_ARGUMENT, "out_dataset is NULL");
  kt_nn_tmpdir_done();
}
END_TEST

START_TEST(test_create_and_names) {
  kt_fill();
  kiln_nn_dataset_t *ds = NULL;
  KT_OK(kiln_nn_dataset_create(KT_N, 28, 28, 10, kt_pixels, kt_labels, &ds));
  ck_assert_mem_eq(kiln_nn_dataset_labels(ds), kt_labels, KT_N);
  kiln_nn_dataset_free(ds);
  kiln_nn_dataset_free(NULL);
  uint8_t bad[2] = {0, 10};
  KT_FAILS(kiln_nn_dataset_create(2, 28, 28, 10, kt_pixels, bad, &ds), KILN_INVALID_ARGUMENT,
           "label 10 of sample 1 is outside [0, 10)");
  KT_FAILS(kiln_nn_dataset_create(2, 0, 28, 10, kt_pixels, kt_labels, &ds), KILN_INVALID_ARGUMENT,
           "rows 0, cols 28 must be >= 1");
  KT_FAILS(kiln_nn_dataset_create(SIZE_MAX / 2, 28, 28, 10, kt_pixels, kt_labels, &ds), KILN_INVALID_ARGUMENT,
           "overflow size_t");
  ck_assert_str_eq(kiln_nn_fashion_mnist_label_name(0), "T-shirt/top");
  ck_assert_str_eq(kiln_nn_fashion_mnist_label_name(9), "Ankle boot");
  ck_assert_ptr_null(kiln_nn_fashion_mnist_label_name(10));
  ck_assert_ptr_null(kiln_nn_fashion_mnist_label_name(-1));
}
END_TEST

/* Debian's dataset-fashion-mnist, where installed: counts, classes, values
 * checked against Python's gzip module. */
START_TEST(test_real_fashion_mnist) {
  struct stat st;
  if (stat(KILN_NN_FASHION_MNIST_DIR, &st) != 0) {
    printf("test_real_fashion_mnist: skipped: " KILN_NN_FASHION_MNIST_DIR
           " is absent (apt-get install dataset-fashion-mnist)\n");
    return;
  }
  unsetenv("KILN_DATA_DIR");
  kiln_nn_dataset_t *train = NULL, *test = NULL;
  KT_OK(kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TRAIN, &train));
  KT_OK(kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TEST, &test));
  kiln_nn_dataset_info_t info;
  KT_OK(kiln_nn_dataset_info(train, &info));
  ck_assert_uint_eq(info.count, 60000);
  ck_assert_uint_eq(info.rows, 28);
  ck_assert_uint_eq(info.cols, 28);
  size_t per_class[10] = {0};
  const uint8_t *labels = kiln_nn_dataset_labels(train);
  for (size_t i = 0; i < info.count; i++) per_class[labels[i]]++;
  for (int c = 0; c < 10; c++) ck_assert_uint_eq(per_class[c], 6000);
  const uint8_t first_train[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  ck_assert_mem_eq(labels, first_train, 10);
  uint64_t sum = 0;
  const uint8_t *pixels = kiln_nn_dataset_pixels(train);
  for (size_t i = 0; i < info.count * 784; i++) sum += pixels[i];
  ck_assert_uint_eq(sum, 3431114169ull);
  KT_OK(kiln_nn_dataset_info(test, &info));
  ck_assert_uint_eq(info.count, 10000);

  kiln_tensor_t *images = NULL, *ids = NULL;
  KT_OK(kiln_nn_dataset_upload(test, kt_nn_cpu(), KILN_NN_FLAT, &images, &ids));
  float *all = malloc(10000 * 784 * sizeof *all);
  int32_t *all_labels = malloc(10000 * sizeof *all_labels);
  KT_OK(kiln_tensor_read(images, all, 10000 * 784 * sizeof *all));
  KT_OK(kiln_tensor_read(ids, all_labels, 10000 * sizeof *all_labels));
  const float *first = all;
  const int32_t *first_labels = all_labels;
  ck_assert_float_eq(first[14 * 28 + 14], 110.0f / 255.0f);
  const int32_t first_test[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  ck_assert_mem_eq(first_labels, first_test, sizeof first_test);
  free(all);
  free(all_labels);
  kiln_tensor_release(images);
  kiln_tensor_release(ids);
  kiln_nn_dataset_free(train);
  kiln_nn_dataset_free(test);
}
END_TEST

/* A few thousand mutated IDX files through the parser: each is read or
 * refused with KILN_IO, never a crash, a leak or a read out of bounds (the
 * sanitizer build runs this too). */
START_TEST(test_mutated_idx) {
  kt_fill();
  uint32_t idims[3] = {3, 4, 5}, ldims[1] = {7};
  size_t sizes[2];
  uint8_t *bases[2] = {kt_idx(0x803, idims, 3, kt_pixels, 60, &sizes[0]), kt_idx(0x801, ldims, 1, kt_labels, 5, &sizes[1])};
  uint64_t state = 0x9e3779b97f4a7c15ull;
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 4000; iter++) {
    int which = iter & 1;
    size_t n = sizes[which] + 8;
    uint8_t *b = malloc(n);
    memcpy(b, bases[which], sizes[which]);
    memset(b + sizes[which], 0, 8);
    size_t len = sizes[which];
    int edits = 1 + (int)(kt_nn_rand(&state) % 4);
    for (int e = 0; e < edits; e++) {
      uint64_t r = kt_nn_rand(&state);
      size_t at = (size_t)(r >> 8) % len;
      switch (r % 5) {
      case 0: b[at] ^= (uint8_t)(1u << ((r >> 40) % 8)); break;
      case 1: b[at] = (uint8_t)(r >> 48); break;
      case 2: b[at] = (r >> 20) & 1 ? 0xff : 0x00; break;
      case 3: len = at; break;
      default: len = len + (size_t)((r >> 30) % 8) > n ? n : len + (size_t)((r >> 30) % 8); break;
      }
      if (len == 0) len = 1;
    }
    kiln_nn__idx_t idx = {0};
    kiln_status_t s = kiln_nn__idx_parse_memory(b, len, which ? 1 : 3, "mutant", NULL, &idx);
    if (s == KILN_OK) {
      uint64_t product = idx.dims[0] * (uint64_t)(which ? 1 : idx.dims[1] * (uint64_t)idx.dims[2]);
      ck_assert_uint_eq(idx.size, product);
      ck_assert_uint_eq(len, 4 + 4 * (which ? 1 : 3) + product);
      free(idx.data);
      accepted++;
    } else {
      ck_assert_msg(s == KILN_IO, "status %s: %s", kiln_status_name(s), kiln_last_error());
      ck_assert_msg(strncmp(kiln_last_error(), "mutant: ", 8) == 0, "%s", kiln_last_error());
      refused++;
    }
    free(b);
  }
  ck_assert_int_gt(accepted, 0);
  ck_assert_int_gt(refused, 1000);
  free(bases[0]);
  free(bases[1]);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  Suite *s = suite_create("nn_dataset");
  TCase *tc = tcase_create("dataset");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_synthetic_round_trip);
  tcase_add_test(tc, test_faults_exact_messages);
  tcase_add_test(tc, test_damaged_gzip_and_odd_files);
  tcase_add_test(tc, test_missing_files_and_data_dir);
  tcase_add_test(tc, test_create_and_names);
  tcase_add_test(tc, test_real_fashion_mnist);
  tcase_add_test(tc, test_mutated_idx);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
