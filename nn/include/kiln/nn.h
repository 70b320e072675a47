/* kiln/nn.h: libkiln-nn, training on kiln's public API: data sets and batch loading, safetensors checkpoints. */
#ifndef KILN_NN_H
#define KILN_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* The rules of kiln.h hold here too: every fallible call returns a
 * kiln_status_t and leaves its message in kiln_last_error(); outputs are
 * written only on success; nothing prints, nothing aborts on bad input or a
 * bad file. Single-owner objects (data set, loader, loaded safetensors) have
 * a create or load and a free; free(NULL) is a no-op. An object of this
 * header is used by one thread at a time. Link with
 * `pkg-config --cflags --libs kiln-nn`. */

/* ---- data sets (nn/dataset.c) ------------------------------------------------
 * Images of one channel with 8-bit pixels and an integer label each, held in
 * host memory as read (one byte per pixel). Tensors made from them hold f32
 * pixels scaled to [0, 1] (pixel / 255) and i32 labels. */

typedef struct kiln_nn_dataset_t kiln_nn_dataset_t;

typedef enum kiln_nn_split_t {
  KILN_NN_TRAIN = 0, /* train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz */
  KILN_NN_TEST = 1,  /* t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz */
} kiln_nn_split_t;

/* The shape image tensors take. The bytes are the same; only the shape differs. */
typedef enum kiln_nn_layout_t {
  KILN_NN_NCHW = 0, /* [N, 1, rows, cols]: for convolutions */
  KILN_NN_FLAT = 1, /* [N, rows * cols]: for dense layers */
} kiln_nn_layout_t;

typedef struct kiln_nn_dataset_info_t {
  size_t count;     /* images (and labels) */
  uint32_t rows;    /* 28 for Fashion-MNIST */
  uint32_t cols;    /* 28 */
  uint32_t classes; /* labels lie in [0, classes) */
} kiln_nn_dataset_info_t;

/* Where Fashion-MNIST is looked for when no folder is given: $KILN_DATA_DIR/
 * fashion-mnist when KILN_DATA_DIR is set and not empty, else this folder,
 * where Debian's dataset-fashion-mnist installs it. */
#define KILN_NN_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Read one split of Fashion-MNIST (10 classes, 28x28) from `dir`, the folder
 * holding the four gzipped IDX files (NULL: see KILN_NN_FASHION_MNIST_DIR).
 * Blocks while it reads and decompresses (about 0.3 s for the training split).
 * The caller owns the data set (kiln_nn_dataset_free). Errors name the file,
 * what is wrong with it, and the fix (install or reinstall the Debian package
 * dataset-fashion-mnist, or point KILN_DATA_DIR elsewhere):
 * KILN_NOT_FOUND for a missing file; KILN_IO for one that cannot be read, is
 * not gzip or IDX, is truncated, has a wrong magic number, dimensions that
 * disagree with its size or with the other file, or a label out of range;
 * KILN_INVALID_ARGUMENT for a bad split or NULL out_dataset;
 * KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn_dataset_load_fashion_mnist(const char *dir, kiln_nn_split_t split,
                                                 kiln_nn_dataset_t **out_dataset);

/* Read any IDX pair: images (magic 0x00000803, unsigned bytes [N, rows,
 * cols]) and labels (magic 0x00000801, unsigned bytes [N]), each gzipped or
 * not; every label must be below `classes` (1..256). Errors as above, without
 * the Debian hint. Blocks while reading. */
kiln_status_t kiln_nn_dataset_load_idx(const char *images_path, const char *labels_path, uint32_t classes,
                                       kiln_nn_dataset_t **out_dataset);

/* A data set from memory: `count` images of rows x cols pixels, row-major,
 * and `count` labels in [0, classes). Both are copied. KILN_INVALID_ARGUMENT
 * naming the first label out of range, or a size that overflows. */
kiln_status_t kiln_nn_dataset_create(size_t count, uint32_t rows, uint32_t cols, uint32_t classes,
                                     const uint8_t *pixels, const uint8_t *labels,
                                     kiln_nn_dataset_t **out_dataset);

void kiln_nn_dataset_free(kiln_nn_dataset_t *dataset);

/* Count, image size and classes. KILN_INVALID_ARGUMENT for NULL. */
kiln_status_t kiln_nn_dataset_info(const kiln_nn_dataset_t *dataset, kiln_nn_dataset_info_t *out_info);

/* The pixels (count * rows * cols bytes) and labels (count bytes) as read,
 * owned by the data set. NULL for a NULL data set. */
const uint8_t *kiln_nn_dataset_pixels(const kiln_nn_dataset_t *dataset);
const uint8_t *kiln_nn_dataset_labels(const kiln_nn_dataset_t *dataset);

/* The whole data set as two new tensors on `device`: images f32 in `layout`,
 * scaled to [0, 1], and labels i32 [N]. The caller owns both. Blocks until the
 * data reached the device. KILN_OUT_OF_MEMORY when it does not fit. */
kiln_status_t kiln_nn_dataset_upload(const kiln_nn_dataset_t *dataset, kiln_device_t *device,
                                     kiln_nn_layout_t layout, kiln_tensor_t **out_images,
                                     kiln_tensor_t **out_labels);

/* Fashion-MNIST's class names ("T-shirt/top", "Trouser", ... "Ankle boot"), or
 * NULL for a label outside [0, 10). Static storage. */
const char *kiln_nn_fashion_mnist_label_name(int label);

/* ---- batch loader (nn/loader.c) -----------------------------------------------
 * Hands out a data set in batches on one device, epoch after epoch. Each
 * epoch's order is a permutation drawn from (seed, epoch number) alone, so a
 * run is reproducible and can resume at any epoch. With prefetch, batch i+1 is
 * gathered into page-locked staging memory and uploaded on a queue of the
 * loader's own while step i runs; the compute queue waits on an event for the
 * upload, never the host. */

typedef struct kiln_nn_loader_t kiln_nn_loader_t;

typedef struct kiln_nn_loader_options_t {
  size_t batch_size;       /* >= 1; default 100 */
  bool shuffle;            /* a new order each epoch; default true (false: the data set's order) */
  uint64_t seed;           /* of the shuffle; default 0 */
  bool drop_last;          /* drop a last batch smaller than batch_size; default false */
  bool prefetch;           /* upload the next batch during the current step; default true */
  kiln_nn_layout_t layout; /* of the image tensors; default KILN_NN_NCHW */
} kiln_nn_loader_options_t;

/* Fill options with the defaults above. */
void kiln_nn_loader_options_initialize(kiln_nn_loader_options_t *options);

/* One batch. The tensors belong to the loader, which fills them again for a
 * later batch: their contents hold until the next kiln_nn_loader_next or
 * kiln_nn_loader_reset call. Copy (kiln_tensor_copy) what must outlive it. */
typedef struct kiln_nn_batch_t {
  kiln_tensor_t *images; /* f32 [count, 1, rows, cols] or [count, rows * cols]; NULL at epoch end */
  kiln_tensor_t *labels; /* i32 [count]; NULL at epoch end */
  size_t count;          /* samples in the batch; 0 marks the end of an epoch */
  size_t index;          /* the batch's index in its epoch */
  uint64_t epoch;        /* the epoch it belongs to, from 0 */
} kiln_nn_batch_t;

/* A loader for `dataset` (which must outlive it) on `device`. Allocates on
 * the device two batches with prefetch (one without), their staging memory
 * (kiln_host_allocate) and, with prefetch, a second queue. NULL options mean the defaults. The caller owns the
 * loader. KILN_INVALID_ARGUMENT for a batch size of 0, an empty data set or
 * a bad layout; KILN_OUT_OF_MEMORY. Does not block on queued work. */
kiln_status_t kiln_nn_loader_create(const kiln_nn_dataset_t *dataset, kiln_device_t *device,
                                    const kiln_nn_loader_options_t *options, kiln_nn_loader_t **out_loader);

/* Waits for the loader's uploads and for the work that used its batches, then
 * frees it. */
void kiln_nn_loader_free(kiln_nn_loader_t *loader);

/* Batches in one epoch: ceil(N / B), or floor(N / B) with drop_last. */
size_t kiln_nn_loader_batch_count(const kiln_nn_loader_t *loader);

/* The next batch of the current epoch, its upload ordered before the work
 * enqueued after this call on the device's current queue of the calling
 * thread (kiln_device_current_queue). After an epoch's last batch one call
 * returns count 0 (the end of the epoch); the call after it starts the next
 * epoch. The work enqueued before this call is taken to be done with the
 * previous batch: its tensors are refilled once it completes. Blocks only
 * for host work: gathering a batch, and waiting for staging memory whose
 * upload has not finished; without prefetch, the upload itself is blocking.
 * An upload that fails (KILN_DEVICE_LOST ...) is reported by the call that
 * started it or waited for it; the message names the batch and the device.
 * KILN_INVALID_ARGUMENT for NULL arguments. */
kiln_status_t kiln_nn_loader_next(kiln_nn_loader_t *loader, kiln_nn_batch_t *out_batch);

/* Start again at the beginning of `epoch`; a batch prefetched for another
 * position is dropped. */
kiln_status_t kiln_nn_loader_reset(kiln_nn_loader_t *loader, uint64_t epoch);

/* The order of `epoch` that a loader with this seed and shuffle uses:
 * out_order[k] is the data set index of the k-th sample, for count samples.
 * For tests and for tools that must reproduce a run. */
kiln_status_t kiln_nn_shuffle_order(uint64_t seed, uint64_t epoch, bool shuffle, size_t count,
                                    size_t *out_order);

/* ---- safetensors (nn/safetensors.c, nn/safetensors_save.c) ------------------
 * The format of Hugging Face's safetensors: an 8-byte little-endian header
 * length N, N bytes of JSON ({"name": {"dtype": "F32", "shape": [2, 3],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}),
 * then the tensors' bytes, little-endian, row-major. kiln reads and writes F32
 * and I32; other dtypes in a file are refused by name. Files kiln writes load
 * with safetensors.torch.load_file, and the reference library's files load
 * here. A file that is truncated or hostile is an error, never a crash: the
 * header is limited to 100,000,000 bytes as in the reference loader, and every
 * offset, shape and byte count is checked before any allocation. */

typedef struct kiln_nn_safetensors_t kiln_nn_safetensors_t;

typedef struct kiln_nn_named_tensor_t {
  const char *name;      /* UTF-8, unique in a file, not "__metadata__" */
  kiln_tensor_t *tensor; /* f32 or i32, on any device */
} kiln_nn_named_tensor_t;

typedef struct kiln_nn_metadata_t {
  const char *key; /* UTF-8 */
  const char *value;
} kiln_nn_metadata_t;

/* Write `count` tensors (read back from their devices: blocks until each
 * tensor's pending work is done) and `metadata_count` string pairs to `path`.
 * The file is written beside `path` under a temporary name and renamed into
 * place, so an existing file is replaced whole or not at all. The layout is the
 * reference writer's: tensors ordered by dtype then name, the header padded
 * with spaces to a multiple of 8 bytes. KILN_INVALID_ARGUMENT for a NULL or
 * duplicate name, "__metadata__", invalid UTF-8; KILN_UNSUPPORTED for an f16
 * or bf16 tensor; KILN_IO naming the path when it cannot be written. */
kiln_status_t kiln_nn_safetensors_save(const char *path, const kiln_nn_named_tensor_t *tensors, size_t count,
                                       const kiln_nn_metadata_t *metadata, size_t metadata_count);

/* Read every tensor of the file at `path` into new tensors on `device`. The
 * caller owns the result (kiln_nn_safetensors_free), which owns the tensors
 * (retain one to keep it longer). Blocks until the data reached the device.
 * KILN_NOT_FOUND for a missing file; KILN_IO naming the file and the fault for
 * a truncated or malformed one (header length, JSON, a missing or wrong-typed
 * field, offsets out of range, overlapping or leaving gaps, a shape that does
 * not match its bytes); KILN_UNSUPPORTED naming a dtype kiln does not have
 * yet (BF16, F16, F64, ...) or more than KILN_MAX_DIMS dimensions;
 * KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn_safetensors_load(const char *path, kiln_device_t *device, kiln_nn_safetensors_t **out_file);

/* The same from `size` bytes in memory (a file read or mapped by the caller);
 * `data` may be freed once the call returns. Errors as for load, with
 * "<memory>" in place of the path. */
kiln_status_t kiln_nn_safetensors_load_memory(const void *data, size_t size, kiln_device_t *device,
                                              kiln_nn_safetensors_t **out_file);

void kiln_nn_safetensors_free(kiln_nn_safetensors_t *file);

/* Tensors in the file's header order (0 when file is NULL). */
size_t kiln_nn_safetensors_count(const kiln_nn_safetensors_t *file);
/* Tensor i and its name, owned by the result; NULL when i is out of range. */
const char *kiln_nn_safetensors_name(const kiln_nn_safetensors_t *file, size_t i);
kiln_tensor_t *kiln_nn_safetensors_tensor(const kiln_nn_safetensors_t *file, size_t i);
/* The tensor called `name` (borrowed); KILN_NOT_FOUND naming it. */
kiln_status_t kiln_nn_safetensors_find(const kiln_nn_safetensors_t *file, const char *name,
                                       kiln_tensor_t **out_tensor);
/* The __metadata__ pairs; the value of `key`, NULL when absent. Owned by the result. */
size_t kiln_nn_safetensors_metadata_count(const kiln_nn_safetensors_t *file);
kiln_status_t kiln_nn_safetensors_metadata(const kiln_nn_safetensors_t *file, size_t i, const char **out_key,
                                           const char **out_value);
const char *kiln_nn_safetensors_metadata_value(const kiln_nn_safetensors_t *file, const char *key);

/* Read the file's tensors into existing ones, by name (the model's parameters
 * on their devices). Every name must be in the file with the same dtype and
 * shape, else KILN_NOT_FOUND / KILN_DTYPE_MISMATCH / KILN_SHAPE_MISMATCH
 * naming the tensor and both values; with `strict`, a tensor of the file that
 * was not asked for is KILN_INVALID_ARGUMENT naming it. Every name, dtype
 * and shape is checked before anything is written, so such a failure changes
 * no tensor (a read or device error part-way can leave earlier tensors
 * written). The tensors must be contiguous. Blocks until the data reached the
 * devices. File errors as for load. */
kiln_status_t kiln_nn_safetensors_load_into(const char *path, const kiln_nn_named_tensor_t *tensors, size_t count,
                                            bool strict);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_NN_H */
