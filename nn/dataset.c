/* nn/dataset.c: IDX files (gzipped or not) read into data sets, Fashion-MNIST from Debian's package, data sets to tensors. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "nn_internal.h"

struct kiln_nn_dataset_t {
  kiln_nn_dataset_info_t info;
  uint8_t *pixels; /* count * rows * cols */
  uint8_t *labels; /* count */
};

#define KILN_NN_IDX_UBYTE 0x08
/* Chunks of the f32 conversion on upload: bounded host memory for any size. */
#define KILN_NN_UPLOAD_CHUNK ((size_t)1 << 20)

static const char *const kiln_nn_fashion_names[10] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
};

const char *kiln_nn_fashion_mnist_label_name(int label) {
  return label >= 0 && label < 10 ? kiln_nn_fashion_names[label] : NULL;
}

/* ---- IDX reading ------------------------------------------------------------------
 * One parser for both sources: a file (one gzip member inflated here, or raw
 * bytes) and bytes in memory. zlib's gz* functions are not used: they skip
 * whatever follows the gzip stream, and a file must end where its data does. */

/* Compressed bytes read from the file at a time. */
#define KILN_NN_INFLATE_IN ((size_t)1 << 17)

typedef struct kiln_nn_source_t {
  int fd;             /* -1: read from mem */
  bool gzip;          /* the file is a gzip stream, inflated through `z` */
  bool z_ready;       /* inflateInit2 succeeded: inflateEnd is due */
  bool z_end;         /* the gzip stream ended (its CRC and length checked) */
  z_stream z;
  uint8_t *in;        /* gzip: KILN_NN_INFLATE_IN bytes of compressed input */
  const uint8_t *mem;
  size_t mem_size;
  size_t mem_pos;
  uint64_t pos;     /* bytes of (decompressed) data read so far, for messages */
  const char *name; /* for messages: the path, or "<memory>" */
  const char *hint; /* what to do, appended to every message; may be NULL */
} kiln_nn_source_t;

static kiln_status_t kiln_nn_idx_fail(const kiln_nn_source_t *src, kiln_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kiln_status_t kiln_nn_idx_fail(const kiln_nn_source_t *src, kiln_status_t status, const char *fmt, ...) {
  char problem[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(problem, sizeof problem, fmt, args);
  va_end(args);
  return kiln_set_error(status, "%s: %s%s%s", src->name, problem, src->hint ? "; " : "", src->hint ? src->hint : "");
}

/* Up to n bytes of the file itself; *out_got < n only at its end. */
static kiln_status_t kiln_nn_fd_read(kiln_nn_source_t *src, void *dst, size_t n, size_t *out_got) {
  size_t total = 0;
  while (total < n) {
    ssize_t got = read(src->fd, (uint8_t *)dst + total, n - total);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return kiln_nn_idx_fail(src, KILN_IO, "cannot read it: %s", strerror(errno));
    if (got == 0) break;
    total += (size_t)got;
  }
  *out_got = total;
  return KILN_OK;
}

/* Inflate up to n bytes. At the stream's end the file must end too: a second
 * gzip member or trailing bytes are refused (simplest, and no IDX file from
 * the data sets has either). */
static kiln_status_t kiln_nn_inflate_read(kiln_nn_source_t *src, void *dst, size_t n, size_t *out_got) {
  size_t total = 0;
  while (total < n && !src->z_end) {
    size_t want = n - total;
    if (want > ((size_t)1 << 30)) want = (size_t)1 << 30; /* avail_out is an unsigned int */
    src->z.next_out = (uint8_t *)dst + total;
    src->z.avail_out = (unsigned)want;
    if (src->z.avail_in == 0) {
      size_t got = 0;
      kiln_status_t status = kiln_nn_fd_read(src, src->in, KILN_NN_INFLATE_IN, &got);
      if (status != KILN_OK) return status;
      if (got == 0)
        return kiln_nn_idx_fail(src, KILN_IO,
                                "the gzip stream is truncated (zlib: unexpected end of file) after %llu bytes of data",
                                (unsigned long long)(src->pos + (want - src->z.avail_out)));
      src->z.next_in = src->in;
      src->z.avail_in = (unsigned)got;
    }
    int ret = inflate(&src->z, Z_NO_FLUSH);
    size_t produced = want - src->z.avail_out;
    total += produced;
    src->pos += produced;
    if (ret == Z_STREAM_END) {
      src->z_end = true;
      size_t after = src->z.avail_in, got = 0;
      uint8_t probe[1];
      if (after == 0) {
        kiln_status_t status = kiln_nn_fd_read(src, probe, 1, &got);
        if (status != KILN_OK) return status;
        after = got;
      }
      if (after)
        return kiln_nn_idx_fail(src, KILN_IO,
                                "bytes follow its gzip stream (after %llu bytes of data); kiln reads one gzip member "
                                "and nothing after it",
                                (unsigned long long)src->pos);
    } else if (ret == Z_MEM_ERROR) {
      return kiln_nn_idx_fail(src, KILN_OUT_OF_MEMORY, "zlib ran out of memory inflating it");
    } else if (ret != Z_OK && !(ret == Z_BUF_ERROR && src->z.avail_in == 0)) {
      return kiln_nn_idx_fail(src, KILN_IO, "corrupt gzip data (zlib: %s)", src->z.msg ? src->z.msg : zError(ret));
    }
  }
  *out_got = total;
  return KILN_OK;
}

/* Read up to n bytes; *out_got < n only at the end of the data. */
static kiln_status_t kiln_nn_source_read(kiln_nn_source_t *src, void *dst, size_t n, size_t *out_got) {
  if (src->fd < 0) {
    size_t left = src->mem_size - src->mem_pos;
    size_t got = n < left ? n : left;
    if (got) memcpy(dst, src->mem + src->mem_pos, got);
    src->mem_pos += got;
    *out_got = got;
    return KILN_OK;
  }
  if (src->gzip) return kiln_nn_inflate_read(src, dst, n, out_got);
  kiln_status_t status = kiln_nn_fd_read(src, dst, n, out_got);
  if (status == KILN_OK) src->pos += *out_got;
  return status;
}

static const char *kiln_nn_idx_kind(uint32_t ndim) { return ndim == 3 ? "images" : "labels"; }

/* The magic number and the dimensions; out->size the bytes they promise. */
static kiln_status_t kiln_nn_idx_read_header(kiln_nn_source_t *src, uint32_t ndim, kiln_nn__idx_t *out) {
  uint8_t head[4 + 4 * 3];
  size_t head_size = 4 + 4 * (size_t)ndim, got = 0;
  kiln_status_t status = kiln_nn_source_read(src, head, 4, &got);
  if (status != KILN_OK) return status;
  uint32_t expect_magic = 0x00000800u | ndim;
  if (got < 4)
    return kiln_nn_idx_fail(src, KILN_IO, "truncated: %zu bytes, shorter than the 4-byte IDX magic number 0x%08x", got,
                            expect_magic);
  uint32_t magic = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
  if (magic != expect_magic)
    return kiln_nn_idx_fail(src, KILN_IO,
                            "magic number 0x%08x is not 0x%08x (IDX %s: unsigned bytes, %u dimension%s); it is not an "
                            "IDX %s file",
                            magic, expect_magic, kiln_nn_idx_kind(ndim), ndim, ndim == 1 ? "" : "s",
                            kiln_nn_idx_kind(ndim));
  status = kiln_nn_source_read(src, head + 4, head_size - 4, &got);
  if (status != KILN_OK) return status;
  if (got < head_size - 4)
    return kiln_nn_idx_fail(src, KILN_IO, "truncated in its header: %zu of the %zu bytes of dimensions", got,
                            head_size - 4);
  uint64_t need = 1;
  bool overflow = false;
  for (uint32_t d = 0; d < ndim; d++) {
    const uint8_t *p = head + 4 + 4 * d;
    out->dims[d] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (__builtin_mul_overflow(need, (uint64_t)out->dims[d], &need)) overflow = true;
  }
  out->ndim = ndim;
  if (ndim == 3 && (out->dims[1] == 0 || out->dims[2] == 0))
    return kiln_nn_idx_fail(src, KILN_IO, "images of %u x %u pixels: a dimension is 0", out->dims[1], out->dims[2]);
  if (overflow || need > (uint64_t)(SIZE_MAX / 2))
    return kiln_nn_idx_fail(src, KILN_IO, "dimensions %u x %u x %u are too large to be real", out->dims[0],
                            ndim == 3 ? out->dims[1] : 1, ndim == 3 ? out->dims[2] : 1);
  out->size = (size_t)need;
  return KILN_OK;
}

/* The values the header promised, and nothing after them. Memory grows as
 * data arrives, so dimensions that lie cost no more than the bytes actually
 * there (and never more than the header promised). */
static kiln_status_t kiln_nn_idx_read_values(kiln_nn_source_t *src, kiln_nn__idx_t *out) {
  size_t size = out->size, got = 0;
  size_t capacity = size < ((size_t)1 << 20) ? size : ((size_t)1 << 20), filled = 0;
  kiln_status_t status = KILN_OK;
  uint8_t *data = malloc(capacity ? capacity : 1);
  if (!data) return kiln_nn_idx_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate %zu bytes to read it", capacity);
  while (filled < size) {
    if (filled == capacity) {
      size_t grown = capacity > size / 2 ? size : capacity * 2;
      uint8_t *bigger = realloc(data, grown);
      if (!bigger) {
        free(data);
        return kiln_nn_idx_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate %zu bytes to read it", grown);
      }
      data = bigger;
      capacity = grown;
    }
    status = kiln_nn_source_read(src, data + filled, capacity - filled, &got);
    if (status != KILN_OK) {
      free(data);
      return status;
    }
    filled += got;
    if (got == 0) break;
  }
  if (filled < size) {
    free(data);
    if (out->ndim == 3)
      return kiln_nn_idx_fail(src, KILN_IO,
                              "truncated: its dimensions [%u, %u, %u] need %zu bytes of pixels after the header, but it "
                              "holds %zu",
                              out->dims[0], out->dims[1], out->dims[2], size, filled);
    return kiln_nn_idx_fail(src, KILN_IO,
                            "truncated: its dimension [%u] needs %zu bytes of labels after the header, but it holds %zu",
                            out->dims[0], size, filled);
  }
  /* One more byte must not exist; for gzip this read also checks the CRC. */
  uint8_t extra;
  status = kiln_nn_source_read(src, &extra, 1, &got);
  if (status == KILN_OK && got != 0)
    status = kiln_nn_idx_fail(src, KILN_IO, "holds more bytes than its dimensions say (%zu after the header)", size);
  if (status != KILN_OK) {
    free(data);
    return status;
  }
  out->data = data;
  return KILN_OK;
}

kiln_status_t kiln_nn__idx_parse_memory(const void *bytes, size_t size, uint32_t ndim, const char *name,
                                        const char *hint, kiln_nn__idx_t *out) {
  if ((!bytes && size) || !out || (ndim != 1 && ndim != 3))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn__idx_parse_memory: bad arguments");
  kiln_nn_source_t src = {.fd = -1, .mem = bytes, .mem_size = size, .name = name ? name : "<memory>", .hint = hint};
  kiln_status_t status = kiln_nn_idx_read_header(&src, ndim, out);
  if (status == KILN_OK) status = kiln_nn_idx_read_values(&src, out);
  return status;
}

static void kiln_nn_source_close(kiln_nn_source_t *src) {
  if (src->z_ready) inflateEnd(&src->z);
  if (src->fd >= 0) close(src->fd);
  free(src->in);
  src->fd = -1;
  src->z_ready = false;
  src->in = NULL;
}

/* Open a regular file without blocking on a FIFO or a device, then look at
 * its first two bytes: gzip's magic number, or raw IDX. `missing_hint` when
 * the file is absent, `src->hint` for any other fault. */
static kiln_status_t kiln_nn_source_open(const char *path, const char *missing_hint, kiln_nn_source_t *src) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) src->hint = missing_hint;
    return kiln_nn_idx_fail(src, err == ENOENT ? KILN_NOT_FOUND : KILN_IO, "cannot open it: %s", strerror(err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_nn_idx_fail(src, KILN_IO, "is not a regular file");
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int err = errno;
    close(fd);
    return kiln_nn_idx_fail(src, KILN_IO, "cannot make its reads blocking: %s", strerror(err));
  }
  src->fd = fd;
  uint8_t magic[2];
  ssize_t got;
  do got = pread(fd, magic, 2, 0);
  while (got < 0 && errno == EINTR);
  if (got < 0) {
    kiln_status_t status = kiln_nn_idx_fail(src, KILN_IO, "cannot read it: %s", strerror(errno));
    kiln_nn_source_close(src);
    return status;
  }
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    src->gzip = true;
    src->in = malloc(KILN_NN_INFLATE_IN);
    /* 16 + 15: a gzip wrapper, the largest window. */
    int ret = src->in ? inflateInit2(&src->z, 16 + 15) : Z_MEM_ERROR;
    if (ret != Z_OK) {
      kiln_nn_source_close(src);
      return kiln_nn_idx_fail(src, KILN_OUT_OF_MEMORY, "cannot start zlib to inflate it");
    }
    src->z_ready = true;
  }
  return KILN_OK;
}

/* ---- data sets ---------------------------------------------------------------------- */

/* Takes ownership of pixels and labels (freed on failure too). */
static kiln_status_t kiln_nn_dataset_make(size_t count, uint32_t rows, uint32_t cols, uint32_t classes,
                                          uint8_t *pixels, uint8_t *labels, kiln_nn_dataset_t **out_dataset) {
  kiln_nn_dataset_t *ds = calloc(1, sizeof *ds);
  if (!ds) {
    free(pixels);
    free(labels);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "cannot allocate a data set object");
  }
  ds->info = (kiln_nn_dataset_info_t){.count = count, .rows = rows, .cols = cols, .classes = classes};
  ds->pixels = pixels;
  ds->labels = labels;
  *out_dataset = ds;
  return KILN_OK;
}

/* Both headers first: counts that disagree are refused before anything is
 * inflated, so a file claiming a gigabyte beside three labels costs nothing.
 * Then the values, each file bounded by what its header promised; every label
 * must lie below classes. */
static kiln_status_t kiln_nn_dataset_from_idx(const char *images_path, const char *labels_path, uint32_t classes,
                                              const char *hint, const char *missing_hint,
                                              kiln_nn_dataset_t **out_dataset) {
  kiln_nn__idx_t images = {0}, labels = {0};
  kiln_nn_source_t isrc = {.fd = -1, .name = images_path, .hint = hint};
  kiln_nn_source_t lsrc = {.fd = -1, .name = labels_path, .hint = hint};
  kiln_status_t status = kiln_nn_source_open(images_path, missing_hint, &isrc);
  if (status == KILN_OK) status = kiln_nn_source_open(labels_path, missing_hint, &lsrc);
  if (status == KILN_OK) status = kiln_nn_idx_read_header(&isrc, 3, &images);
  if (status == KILN_OK) status = kiln_nn_idx_read_header(&lsrc, 1, &labels);
  if (status == KILN_OK && labels.dims[0] != images.dims[0])
    status = kiln_nn_idx_fail(&lsrc, KILN_IO, "holds %u labels but %s holds %u images", labels.dims[0], images_path,
                              images.dims[0]);
  if (status == KILN_OK) status = kiln_nn_idx_read_values(&isrc, &images);
  if (status == KILN_OK) status = kiln_nn_idx_read_values(&lsrc, &labels);
  kiln_nn_source_close(&isrc);
  kiln_nn_source_close(&lsrc);
  for (size_t i = 0; status == KILN_OK && i < labels.size; i++) {
    if (labels.data[i] >= classes) {
      status = kiln_nn_idx_fail(&lsrc, KILN_IO, "label %u of sample %zu is outside [0, %u)", labels.data[i], i, classes);
      break;
    }
  }
  if (status != KILN_OK) {
    free(images.data);
    free(labels.data);
    return status;
  }
  return kiln_nn_dataset_make(images.dims[0], images.dims[1], images.dims[2], classes, images.data, labels.data,
                              out_dataset);
}

kiln_status_t kiln_nn_dataset_load_idx(const char *images_path, const char *labels_path, uint32_t classes,
                                       kiln_nn_dataset_t **out_dataset) {
  if (!images_path || !labels_path || !out_dataset)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_load_idx: %s is NULL",
                          !images_path ? "images_path" : !labels_path ? "labels_path" : "out_dataset");
  if (classes < 1 || classes > 256)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "kiln_nn_dataset_load_idx: classes %u is outside [1, 256] (labels are single bytes)",
                          classes);
  return kiln_nn_dataset_from_idx(images_path, labels_path, classes, NULL, NULL, out_dataset);
}

kiln_status_t kiln_nn_dataset_load_fashion_mnist(const char *dir, kiln_nn_split_t split,
                                                 kiln_nn_dataset_t **out_dataset) {
  if (!out_dataset) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_load_fashion_mnist: out_dataset is NULL");
  if (split != KILN_NN_TRAIN && split != KILN_NN_TEST)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "kiln_nn_dataset_load_fashion_mnist: split %d is neither KILN_NN_TRAIN (0) nor KILN_NN_TEST (1)",
                          (int)split);
  /* The folder, and in the hint where it came from: a user who set
   * KILN_DATA_DIR must learn that this is what kiln looked at. */
  char folder[4096], origin[4200];
  const char *env = getenv("KILN_DATA_DIR");
  int n;
  if (dir) {
    n = snprintf(folder, sizeof folder, "%s", dir);
    snprintf(origin, sizeof origin, "the folder passed to kiln_nn_dataset_load_fashion_mnist");
  } else if (env && *env) {
    n = snprintf(folder, sizeof folder, "%s/fashion-mnist", env);
    snprintf(origin, sizeof origin, "KILN_DATA_DIR=%s, so kiln looked in %s/fashion-mnist", env, env);
  } else {
    n = snprintf(folder, sizeof folder, "%s", KILN_NN_FASHION_MNIST_DIR);
    snprintf(origin, sizeof origin, "the default folder; set KILN_DATA_DIR=<dir> to read <dir>/fashion-mnist instead");
  }
  if (n < 0 || (size_t)n >= sizeof folder - 64)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_load_fashion_mnist: the folder \"%.200s...\" is too long",
                          folder);
  const char *prefix = split == KILN_NN_TRAIN ? "train" : "t10k";
  char images[4200], labels[4200], hint[4800], missing[4800];
  snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", folder, prefix);
  snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", folder, prefix);
  snprintf(missing, sizeof missing,
           "install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), which puts the "
           "four files in " KILN_NN_FASHION_MNIST_DIR " (%s)",
           origin);
  snprintf(hint, sizeof hint,
           "the file is damaged: install the Debian package dataset-fashion-mnist again (apt-get install --reinstall "
           "dataset-fashion-mnist) (%s)",
           origin);
  return kiln_nn_dataset_from_idx(images, labels, 10, hint, missing, out_dataset);
}

kiln_status_t kiln_nn_dataset_create(size_t count, uint32_t rows, uint32_t cols, uint32_t classes,
                                     const uint8_t *pixels, const uint8_t *labels,
                                     kiln_nn_dataset_t **out_dataset) {
  if (!out_dataset || (count && (!pixels || !labels)))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_create: %s is NULL",
                          !out_dataset ? "out_dataset" : !pixels ? "pixels" : "labels");
  if (rows == 0 || cols == 0 || classes < 1 || classes > 256)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "kiln_nn_dataset_create: rows %u, cols %u must be >= 1 and classes %u in [1, 256]", rows, cols,
                          classes);
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, (size_t)rows * cols, &bytes))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_create: %zu images of %u x %u pixels overflow size_t",
                          count, rows, cols);
  for (size_t i = 0; i < count; i++)
    if (labels[i] >= classes)
      return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_create: label %u of sample %zu is outside [0, %u)",
                            labels[i], i, classes);
  uint8_t *p = malloc(bytes ? bytes : 1), *l = malloc(count ? count : 1);
  if (!p || !l) {
    free(p);
    free(l);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_dataset_create: cannot allocate %zu bytes for the copy",
                          bytes + count);
  }
  if (bytes) memcpy(p, pixels, bytes);
  if (count) memcpy(l, labels, count);
  return kiln_nn_dataset_make(count, rows, cols, classes, p, l, out_dataset);
}

void kiln_nn_dataset_free(kiln_nn_dataset_t *dataset) {
  if (!dataset) return;
  free(dataset->pixels);
  free(dataset->labels);
  free(dataset);
}

kiln_status_t kiln_nn_dataset_info(const kiln_nn_dataset_t *dataset, kiln_nn_dataset_info_t *out_info) {
  if (!dataset || !out_info)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_info: %s is NULL", !dataset ? "dataset" : "out_info");
  *out_info = dataset->info;
  return KILN_OK;
}

const uint8_t *kiln_nn_dataset_pixels(const kiln_nn_dataset_t *dataset) { return dataset ? dataset->pixels : NULL; }

const uint8_t *kiln_nn_dataset_labels(const kiln_nn_dataset_t *dataset) { return dataset ? dataset->labels : NULL; }

/* ---- to the device ------------------------------------------------------------------ */

kiln_status_t kiln_nn_dataset_upload(const kiln_nn_dataset_t *dataset, kiln_device_t *device,
                                     kiln_nn_layout_t layout, kiln_tensor_t **out_images,
                                     kiln_tensor_t **out_labels) {
  if (!dataset || !device || !out_images || !out_labels)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_dataset_upload: %s is NULL",
                          !dataset ? "dataset" : !device ? "device" : !out_images ? "out_images" : "out_labels");
  if (layout != KILN_NN_NCHW && layout != KILN_NN_FLAT)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "kiln_nn_dataset_upload: layout %d is neither KILN_NN_NCHW (0) nor KILN_NN_FLAT (1)", (int)layout);
  const kiln_nn_dataset_info_t *info = &dataset->info;
  size_t pixels_per_image = (size_t)info->rows * info->cols, total = info->count * pixels_per_image;
  int64_t nchw[4] = {(int64_t)info->count, 1, info->rows, info->cols};
  int64_t flat[2] = {(int64_t)info->count, (int64_t)pixels_per_image};
  int64_t n = (int64_t)info->count;
  kiln_tensor_t *images = NULL, *labels = NULL;
  kiln_status_t status = layout == KILN_NN_NCHW ? kiln_tensor_empty(device, KILN_F32, 4, nchw, &images)
                                                : kiln_tensor_empty(device, KILN_F32, 2, flat, &images);
  if (status == KILN_OK) status = kiln_tensor_empty(device, KILN_I32, 1, &n, &labels);
  float *chunk = NULL;
  int32_t *ids = NULL;
  if (status == KILN_OK) {
    chunk = malloc(KILN_NN_UPLOAD_CHUNK * sizeof *chunk);
    ids = malloc((info->count ? info->count : 1) * sizeof *ids);
    if (!chunk || !ids) status = kiln_set_error(KILN_OUT_OF_MEMORY, "cannot allocate host memory for the conversion");
  }
  kiln_queue_t *queue = kiln_device_current_queue(device);
  /* Blocking writes in bounded chunks: one chunk of host memory serves all. */
  for (size_t done = 0; status == KILN_OK && done < total; done += KILN_NN_UPLOAD_CHUNK) {
    size_t m = total - done < KILN_NN_UPLOAD_CHUNK ? total - done : KILN_NN_UPLOAD_CHUNK;
    for (size_t i = 0; i < m; i++) chunk[i] = (float)dataset->pixels[done + i] / 255.0f;
    status = kiln_buffer_write(queue, kiln_tensor_buffer(images), kiln_tensor_offset_bytes(images) + done * sizeof(float),
                               chunk, m * sizeof(float), true, 0, NULL, NULL);
  }
  if (status == KILN_OK) {
    for (size_t i = 0; i < info->count; i++) ids[i] = dataset->labels[i];
    status = kiln_buffer_write(queue, kiln_tensor_buffer(labels), kiln_tensor_offset_bytes(labels), ids,
                               info->count * sizeof *ids, true, 0, NULL, NULL);
  }
  free(chunk);
  free(ids);
  if (status != KILN_OK) {
    kiln_tensor_release(images);
    kiln_tensor_release(labels);
    return kiln_wrap_error(status, "kiln_nn_dataset_upload of %zu images to %s", info->count,
                           kiln_device_name(device));
  }
  *out_images = images;
  *out_labels = labels;
  return KILN_OK;
}
