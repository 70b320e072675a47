/* kiln/nn.h: libkiln-nn, training on kiln's public API: data sets and batch loading, safetensors checkpoints, the tape, layers, optimizers and the training loop. */
#ifndef KILN_NN_H
#define KILN_NN_H

#include <signal.h>
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
 * bad file. Single-owner objects (data set, loader, loaded safetensors,
 * parameter, tape, layer, model, optimizer) have a create or load and a free;
 * free(NULL) is a no-op. An object of this header is used by one thread at a
 * time. Calls that enqueue device work return without waiting for it unless
 * their comment says they block. Link with
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
 * then the tensors' bytes, little-endian, row-major. kiln reads and writes
 * BOOL, U8, I8, I16, I32, I64, F16, BF16, F32 and F64, each as the kiln dtype
 * of that name (a BF16 checkpoint of PyTorch's loads as bf16 tensors, with
 * their bits as saved); the format's other dtypes (U16, U32, U64, F8_*, C64,
 * ...) are refused by name. Files kiln writes load
 * with safetensors.torch.load_file, and the reference library's files load
 * here. A file that is truncated or hostile is an error, never a crash: the
 * header is limited to 100,000,000 bytes as in the reference loader, and every
 * offset, shape and byte count is checked before any allocation. */

typedef struct kiln_nn_safetensors_t kiln_nn_safetensors_t;

typedef struct kiln_nn_named_tensor_t {
  const char *name;      /* UTF-8, unique in a file, not "__metadata__" */
  kiln_tensor_t *tensor; /* of any dtype, on any device */
} kiln_nn_named_tensor_t;

typedef struct kiln_nn_metadata_t {
  const char *key; /* UTF-8 */
  const char *value;
} kiln_nn_metadata_t;

/* Write `count` tensors (read back from their devices: blocks until each
 * tensor's pending work is done) and `metadata_count` string pairs to `path`.
 * The file is written beside `path` under a temporary name
 * ("<path>.tmp-<pid>-<n>"), synced, renamed into place and the folder synced,
 * so an existing file is replaced whole or not at all; it keeps the mode (and,
 * where permitted, the owner) of the file it replaces. Temporaries of `path`
 * left by processes that died before their rename are removed. The layout is
 * the reference writer's: tensors ordered by dtype then name, the header padded
 * with spaces to a multiple of 8 bytes. KILN_INVALID_ARGUMENT for a NULL or
 * duplicate name, "__metadata__", invalid UTF-8, a control character in a name
 * or metadata key; KILN_IO naming the path when it cannot be written. */
kiln_status_t kiln_nn_safetensors_save(const char *path, const kiln_nn_named_tensor_t *tensors, size_t count,
                                       const kiln_nn_metadata_t *metadata, size_t metadata_count);

/* Read every tensor of the file at `path` into new tensors on `device`. The
 * caller owns the result (kiln_nn_safetensors_free), which owns the tensors
 * (retain one to keep it longer). Blocks until the data reached the device.
 * KILN_NOT_FOUND for a missing file; KILN_IO naming the file and the fault for
 * a truncated or malformed one (header length, JSON, a missing or wrong-typed
 * field, offsets out of range, overlapping or leaving gaps, a shape that does
 * not match its bytes); KILN_UNSUPPORTED naming a dtype kiln does not have
 * (U16, F8_E4M3, C64, ...) or more than KILN_MAX_DIMS dimensions;
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
 * naming the tensor and both values (nothing is converted: a BF16 file into
 * f32 tensors is KILN_DTYPE_MISMATCH, whose message says how to convert); with `strict`, a tensor of the file that
 * was not asked for is KILN_INVALID_ARGUMENT naming it. Every name, dtype
 * and shape is checked before anything is written, so such a failure changes
 * no tensor (a read or device error part-way can leave earlier tensors
 * written). The tensors must be contiguous. Blocks until the data reached the
 * devices. File errors as for load. */
kiln_status_t kiln_nn_safetensors_load_into(const char *path, const kiln_nn_named_tensor_t *tensors, size_t count,
                                            bool strict);

/* ---- training: parameters (nn/param.c) -----------------------------------------
 * A parameter is a trainable f32 tensor (its value) and the gradient a
 * backward pass left for it. The value lives on one device and stays the same
 * tensor for the parameter's life: optimizers and kiln_nn_safetensors_load_into
 * write into it in place. The gradient lives on the same device; it is NULL
 * until a backward pass reaches the parameter, and kiln_nn_param_zero_grad
 * makes it NULL again (NULL reads as zero, as PyTorch's set_to_none). Layers
 * own the parameters they make; kiln_nn_param_create makes one for a model
 * of your own. */

typedef struct kiln_nn_param_t kiln_nn_param_t;

/* A parameter named `name` (copied; may be NULL for "") holding `value`, which
 * must be a contiguous f32 tensor; the parameter takes its own reference. The
 * caller owns the parameter (kiln_nn_param_free). KILN_INVALID_ARGUMENT for a
 * NULL value; KILN_DTYPE_MISMATCH for one not f32; KILN_INVALID_ARGUMENT for a
 * non-contiguous one (kiln_tensor_contiguous makes one); KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn_param_create(const char *name, kiln_tensor_t *value, kiln_nn_param_t **out_param);
/* Releases the value and the gradient; NULL is a no-op. Never blocks. A
 * parameter must not be freed while a tape records with it. */
void kiln_nn_param_free(kiln_nn_param_t *param);

/* The name ("1.weight" inside a model, as PyTorch's state_dict names it),
 * the value and the gradient (NULL when none), all borrowed from the
 * parameter: retain a tensor to keep it past the next step. The value is
 * always f32; the gradient of a bf16 or f16 model's step is of that dtype
 * (kiln_nn_model_set_precision). */
const char *kiln_nn_param_name(const kiln_nn_param_t *param);
kiln_tensor_t *kiln_nn_param_value(const kiln_nn_param_t *param);
kiln_tensor_t *kiln_nn_param_grad(const kiln_nn_param_t *param);

/* Move the value to `device` (torch's module.to(device) for one parameter):
 * a copy there replaces it (the value is then another tensor), the gradient
 * and a low-precision copy are dropped. Nothing happens when it is there
 * already. As in PyTorch, move a model before making its optimizer: an
 * optimizer's state stays where it was made, and a step with it fails with
 * KILN_DEVICE_MISMATCH. Not while a tape records with the parameter.
 * Enqueued; does not block. KILN_INVALID_ARGUMENT for NULL; the errors of
 * kiln_tensor_to (KILN_OUT_OF_MEMORY). */
kiln_status_t kiln_nn_param_to(kiln_nn_param_t *param, kiln_device_t *device);

/* Drop the gradient (it reads as zero from now on); the memory returns to the
 * device's pool once the work using it is done. Never blocks. */
void kiln_nn_param_zero_grad(kiln_nn_param_t *param);

/* The seed of item `index` of a family drawn from one `seed` (SplitMix64 of
 * both): parameter k of a model is initialised from
 * kiln_nn_seed_derive(model_seed, k), so the same seed gives the same network
 * on every device. */
uint64_t kiln_nn_seed_derive(uint64_t seed, uint64_t index);

/* Fill `param`'s value in place with PyTorch's default initialisation of a
 * linear or convolution layer: uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in))
 * (kaiming-uniform with a = sqrt(5) for weights, the same bound for biases),
 * drawn by kiln_tensor_uniform with key `seed`: the same numbers on every
 * backend and device. Enqueued; does not block. KILN_INVALID_ARGUMENT for
 * fan_in < 1. */
kiln_status_t kiln_nn_param_init_uniform(kiln_nn_param_t *param, int64_t fan_in, uint64_t seed);

/* ---- training: the tape (nn/tape.c, nn/tape_backward.c) --------------------------
 * A reverse-mode tape. Each kiln_nn_tape_<op> call runs the forward operation
 * (the kiln_tensor_<op> calls it names, enqueued on the operands' device like
 * any kiln operation) and, when one of its inputs carries a gradient, records
 * it with the tensors its backward needs. kiln_nn_tape_backward then walks the
 * record backwards, enqueueing the gradient operations on the same device,
 * and adds each parameter's gradient to kiln_nn_param_grad (the first
 * contribution is adopted as is, later ones are added with
 * kiln_tensor_accumulate). A recorded tensor is released as soon as the
 * backward pass has consumed it. Nothing is copied between devices and
 * nothing is read back to the host: operands on two devices fail as the
 * kiln_tensor_ call does (KILN_DEVICE_MISMATCH).
 *
 * What carries a gradient: a parameter's value returned by kiln_nn_tape_watch
 * (for this recording), and every result of a kiln_nn_tape_ op that has such
 * an input. Any other tensor (a batch, a tensor made by a kiln_tensor_ call,
 * a view of a recorded result made with kiln_tensor_reshape) is a constant.
 *
 * Every kiln_nn_tape_<op> takes a NULL tape too: it then only computes (for
 * evaluation, like torch.no_grad). Results are new tensors the caller owns,
 * exactly as the kiln_tensor_ calls return them; the tape holds references of
 * its own. Errors are those of the kiln_tensor_ calls, with the tape op named
 * in front of kiln's message, and KILN_OUT_OF_MEMORY when the record cannot
 * grow; on an error nothing is recorded and *out is untouched. A tape is used
 * by one thread at a time. */

typedef struct kiln_nn_tape_t kiln_nn_tape_t;

/* An empty tape; the caller owns it. Its record grows as needed and keeps its
 * host memory between steps. KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn_tape_create(kiln_nn_tape_t **out_tape);
/* Drops the record (kiln_nn_tape_clear) and frees the tape; NULL is a no-op. */
void kiln_nn_tape_free(kiln_nn_tape_t *tape);

/* Make `param` carry a gradient in this recording: *out_value is its value
 * (borrowed from the parameter), to pass to the tape's ops. Watching a
 * parameter twice is harmless. With a NULL tape, *out_value is the value and
 * nothing else happens. The parameter must outlive the recording.
 * KILN_INVALID_ARGUMENT for NULL; KILN_OUT_OF_MEMORY. Never blocks. */
kiln_status_t kiln_nn_tape_watch(kiln_nn_tape_t *tape, kiln_nn_param_t *param, kiln_tensor_t **out_value);

/* Operations recorded so far (0 after a backward pass or a clear). */
size_t kiln_nn_tape_size(const kiln_nn_tape_t *tape);

/* Forget the record without a backward pass, releasing what it held; the
 * parameters' gradients are left as they are. Never blocks. */
void kiln_nn_tape_clear(kiln_nn_tape_t *tape);

/* The backward pass from `y`, a result of a recorded op, with upstream
 * gradient `dy` (y's shape; NULL means 1, for a one-element y such as a
 * loss). Enqueues the gradient operations on y's device, adds the gradients
 * to the watched parameters that y depends on, then clears the record (the
 * tape is ready for the next step). Does not block. KILN_INVALID_ARGUMENT
 * when y was not recorded on this tape (it carries no gradient, or the record
 * was cleared), or when dy is NULL for a y of more than one element;
 * KILN_SHAPE_MISMATCH for a dy of another shape, KILN_DTYPE_MISMATCH for one of
 * another dtype, KILN_DEVICE_MISMATCH for one on another device (nothing is
 * enqueued or cleared then); the errors of the gradient
 * operations, with the op and its place in the record named (the record is
 * cleared then too, and gradients may be partly added). */
kiln_status_t kiln_nn_tape_backward(kiln_nn_tape_t *tape, kiln_tensor_t *y, const kiln_tensor_t *dy);

/* Whether `t` carries a gradient in this recording: a watched parameter's
 * value (or its low-precision copy) or the result of a recorded op. False for
 * NULL, for any other tensor, and for everything after a backward pass or a
 * clear. Never blocks. */
bool kiln_nn_tape_carries(const kiln_nn_tape_t *tape, const kiln_tensor_t *t);

/* The differentiable operations. Each is the kiln_tensor_ call of the same
 * name; the gradient it records is noted where it is not obvious. */

/* kiln_tensor_unary: every unary op (the derivative is kiln_tensor_unary_backward's). */
kiln_status_t kiln_nn_tape_unary(kiln_nn_tape_t *tape, kiln_unary_op_t op, kiln_tensor_t *x, kiln_tensor_t **out);
/* kiln_tensor_binary with broadcasting (a gradient is summed back to its
 * operand's shape with kiln_tensor_sum_to). add, sub, mul, div; maximum and
 * minimum pass the gradient to the operand that won, to `a` on a tie; eq
 * carries no gradient (its result is a constant). */
kiln_status_t kiln_nn_tape_binary(kiln_nn_tape_t *tape, kiln_binary_op_t op, kiln_tensor_t *a, kiln_tensor_t *b,
                                  kiln_tensor_t **out);
/* kiln_tensor_binary_scalar: a (op) scalar; the scalar carries no gradient. */
kiln_status_t kiln_nn_tape_binary_scalar(kiln_nn_tape_t *tape, kiln_binary_op_t op, kiln_tensor_t *a, double scalar,
                                         kiln_tensor_t **out);
/* kiln_tensor_matmul, 2-D or batched (a 2-D operand's gradient is summed over the batch). */
kiln_status_t kiln_nn_tape_matmul(kiln_nn_tape_t *tape, kiln_tensor_t *a, kiln_tensor_t *b, bool trans_a,
                                  bool trans_b, kiln_tensor_t **out);
/* A dense layer, as torch.nn.functional.linear: x [N, in] @ weight[out, in]^T
 * + bias [out] (bias may be NULL): two kiln operations forward (matmul with
 * trans_b, add), one record; backward dW = dy^T x and db = the sum of dy over
 * N, and dx = dy W only when x carries a gradient (not for a first layer). */
kiln_status_t kiln_nn_tape_linear(kiln_nn_tape_t *tape, kiln_tensor_t *x, kiln_tensor_t *weight, kiln_tensor_t *bias,
                                  kiln_tensor_t **out);
/* kiln_tensor_sum and kiln_tensor_mean (f32) along `axis` or KILN_ALL_AXES. */
kiln_status_t kiln_nn_tape_sum(kiln_nn_tape_t *tape, kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out);
kiln_status_t kiln_nn_tape_mean(kiln_nn_tape_t *tape, kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out);
/* kiln_tensor_softmax / kiln_tensor_log_softmax along the last axis. */
kiln_status_t kiln_nn_tape_softmax(kiln_nn_tape_t *tape, kiln_tensor_t *a, kiln_tensor_t **out);
kiln_status_t kiln_nn_tape_log_softmax(kiln_nn_tape_t *tape, kiln_tensor_t *a, kiln_tensor_t **out);
/* The cross-entropy loss, kiln_tensor_cross_entropy: the mean over N of
 * -log_softmax(logits)[n, labels[n]]; logits f32 [N, C], labels i32 [N] (a
 * constant). One fused kiln operation each way (kiln_tensor_cross_entropy_backward). */
kiln_status_t kiln_nn_tape_cross_entropy(kiln_nn_tape_t *tape, kiln_tensor_t *logits, const kiln_tensor_t *labels,
                                         kiln_tensor_t **out_loss);
/* kiln_tensor_conv2d with its bias fused (bias may be NULL); backward through
 * kiln_tensor_conv2d_backward_weight, _bias and, when x carries a gradient, _input. */
kiln_status_t kiln_nn_tape_conv2d(kiln_nn_tape_t *tape, kiln_tensor_t *x, kiln_tensor_t *weight, kiln_tensor_t *bias,
                                  const kiln_conv2d_params_t *params, kiln_tensor_t **out);
/* kiln_tensor_max_pool2d (backward: kiln_tensor_max_pool2d_backward). */
kiln_status_t kiln_nn_tape_max_pool2d(kiln_nn_tape_t *tape, kiln_tensor_t *x, const kiln_pool2d_params_t *params,
                                      kiln_tensor_t **out);
/* kiln_tensor_cast to `dtype`; the gradient is cast back to x's dtype (an
 * f32 loss gradient rounds once into the f16 or bf16 of a low-precision
 * model, as torch.autocast does). */
kiln_status_t kiln_nn_tape_cast(kiln_nn_tape_t *tape, kiln_tensor_t *x, kiln_dtype_t dtype, kiln_tensor_t **out);
/* kiln_tensor_index_select (index a constant); the gradient is dy's slices
 * added into zeros of x's shape at the indices (kiln_tensor_index_add,
 * repeated indices adding up): an embedding lookup's. */
kiln_status_t kiln_nn_tape_index_select(kiln_nn_tape_t *tape, kiln_tensor_t *x, int axis, const kiln_tensor_t *index,
                                        kiln_tensor_t **out);
/* kiln_tensor_reshape (a view when the layout allows); the gradient is
 * reshaped back. */
kiln_status_t kiln_nn_tape_reshape(kiln_nn_tape_t *tape, kiln_tensor_t *x, int ndim, const int64_t *shape,
                                   kiln_tensor_t **out);

/* Which provider ran each operation: the core counts every op a thread
 * enqueues, libkiln-nn's included (kiln_provider_uses and
 * kiln_provider_uses_reset in <kiln/tensor.h>). */

/* ---- training: layers and models (nn/layers.c, nn/model.c) -----------------------
 * A layer turns a tensor into another and may own parameters; a model is a
 * sequence of layers (as torch.nn.Sequential) and owns them. Forward passes
 * take a tape (recording, for training) or NULL (evaluation). Layers and
 * models are single-owner objects used by one thread at a time. */

typedef struct kiln_nn_layer_t kiln_nn_layer_t;

/* Dense: x [N, in] -> [N, out]; parameters "weight" [out, in] and "bias"
 * [out] (when `bias`) on `device`, initialised as kiln_nn_param_init_uniform
 * with fan_in = in and the seeds kiln_nn_seed_derive(seed, 0) and (seed, 1).
 * Enqueues the initialisation; does not block. KILN_INVALID_ARGUMENT for a
 * size < 1; kiln's errors (KILN_OUT_OF_MEMORY). */
kiln_status_t kiln_nn_linear_create(kiln_device_t *device, int64_t in, int64_t out, bool bias, uint64_t seed,
                                    kiln_nn_layer_t **out_layer);
/* Convolution: [N, in_channels, H, W] -> [N, out_channels, P, Q] (params NULL:
 * stride 1, no padding); "weight" [out, in, kh, kw] and "bias" [out], fan_in =
 * in * kh * kw, seeded as linear. */
kiln_status_t kiln_nn_conv2d_create(kiln_device_t *device, int64_t in_channels, int64_t out_channels, int64_t kernel_h,
                                    int64_t kernel_w, const kiln_conv2d_params_t *params, bool bias, uint64_t seed,
                                    kiln_nn_layer_t **out_layer);
/* Max pooling (kiln_tensor_max_pool2d's params, copied), ReLU, and flatten
 * ([N, ...] -> [N, rest], a view): no parameters, no device of their own. */
kiln_status_t kiln_nn_max_pool2d_create(const kiln_pool2d_params_t *params, kiln_nn_layer_t **out_layer);
kiln_status_t kiln_nn_relu_create(kiln_nn_layer_t **out_layer);
/* An elementwise activation, any kiln_unary_op_t (torch.nn.Sigmoid is
 * KILN_UNARY_SIGMOID, Tanh KILN_UNARY_TANH); relu_create is this with RELU. */
kiln_status_t kiln_nn_activation_create(kiln_unary_op_t op, kiln_nn_layer_t **out_layer);
kiln_status_t kiln_nn_flatten_create(kiln_nn_layer_t **out_layer);
/* Frees the layer and its parameters; NULL is a no-op. Not for a layer a
 * model owns. */
void kiln_nn_layer_free(kiln_nn_layer_t *layer);

/* Move the layer's parameters to `device`, all or none (kiln_nn_param_to). */
kiln_status_t kiln_nn_layer_to(kiln_nn_layer_t *layer, kiln_device_t *device);

/* "linear(784, 1000)", "conv2d(1, 6, 5x5, pad 2)", "relu" ... Owned by the layer. */
const char *kiln_nn_layer_describe(const kiln_nn_layer_t *layer);
/* y = layer(x), recorded on `tape` when not NULL (the layer watches its own
 * parameters). The caller owns *out. Errors of the tape ops, with the layer named. */
kiln_status_t kiln_nn_layer_forward(kiln_nn_layer_t *layer, kiln_nn_tape_t *tape, kiln_tensor_t *x,
                                    kiln_tensor_t **out);
/* The layer's parameters (weight, then bias), borrowed. */
size_t kiln_nn_layer_param_count(const kiln_nn_layer_t *layer);
kiln_nn_param_t *kiln_nn_layer_param(const kiln_nn_layer_t *layer, size_t i);

typedef struct kiln_nn_model_t kiln_nn_model_t;

/* An empty sequential model; the caller owns it. KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn_model_create(kiln_nn_model_t **out_model);
/* Frees the model, its layers and their parameters; NULL is a no-op. */
void kiln_nn_model_free(kiln_nn_model_t *model);
/* Append `layer`; the model owns it from now on, even when this fails (it is
 * freed then). Its parameters are renamed "<position>.weight" and
 * "<position>.bias", as a torch.nn.Sequential's state_dict names them.
 * KILN_DEVICE_MISMATCH when its parameters live on another device than the
 * model's others; KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn_model_add(kiln_nn_model_t *model, kiln_nn_layer_t *layer);
/* The model's layers, and its parameters in order (borrowed; the array stays
 * valid until the next kiln_nn_model_add). */
size_t kiln_nn_model_layer_count(const kiln_nn_model_t *model);
kiln_nn_layer_t *kiln_nn_model_layer(const kiln_nn_model_t *model, size_t i);
kiln_nn_param_t *const *kiln_nn_model_params(const kiln_nn_model_t *model, size_t *out_count);
/* The device of the parameters (NULL for a model without any). */
kiln_device_t *kiln_nn_model_device(const kiln_nn_model_t *model);
/* Move every parameter to `device`, all or none (kiln_nn_param_to); the model
 * lives there from then on. KILN_UNSUPPORTED when the model computes in bf16
 * or f16 and `device` has no kernels of that dtype. */
kiln_status_t kiln_nn_model_to(kiln_nn_model_t *model, kiln_device_t *device);
/* Run the layers in order; recorded on `tape` when not NULL. */
kiln_status_t kiln_nn_model_forward(kiln_nn_model_t *model, kiln_nn_tape_t *tape, kiln_tensor_t *x,
                                    kiln_tensor_t **out);
/* Mixed precision (torch.autocast's scheme, with f32 master weights): at
 * `precision` bf16 or f16, each forward casts every parameter's f32 value
 * once into a copy of that dtype (the tape watches the copy) and the input
 * batch too, so matmul, conv2d, bias adds, ReLU and pooling run in 16 bits
 * (computed in f32 by kiln's kernels, rounded once per op), and the output
 * (the logits) comes out in 16 bits; kiln_nn_train_epoch and kiln_nn_evaluate
 * cast it up (kiln_nn_tape_cast) so softmax, cross-entropy and the loss are
 * f32. Gradients reach the parameters in the low dtype; the optimizer reads
 * them into f32 and updates the f32 values and its f32 state. Checkpoints
 * (kiln_nn_model_save/_load) hold the f32 values whatever the precision, and
 * a checkpoint loaded into a low-precision model reaches its copies at the
 * next forward. f16 wants a loss scaler (kiln_nn_grad_scaler_t); bf16 has
 * f32's range and needs none. Default f32 (no copies). KILN_INVALID_ARGUMENT
 * for another dtype; KILN_UNSUPPORTED naming the device when it has no
 * kernels for that dtype. Never blocks. */
kiln_status_t kiln_nn_model_set_precision(kiln_nn_model_t *model, kiln_dtype_t precision);
/* KILN_F32, KILN_BF16 or KILN_F16 (KILN_F32 for NULL). */
kiln_dtype_t kiln_nn_model_precision(const kiln_nn_model_t *model);
/* Initialise parameter k (in kiln_nn_model_params order) with
 * kiln_nn_param_init_uniform from kiln_nn_seed_derive(seed, k). Enqueued. */
kiln_status_t kiln_nn_model_reset_parameters(kiln_nn_model_t *model, uint64_t seed);
/* Save or load every parameter by name as safetensors (kiln_nn_safetensors_save
 * and _load_into, strict); the file opens in PyTorch as the state_dict of the
 * same torch.nn.Sequential. Both block. Load converts nothing: the file's
 * tensors must have the parameters' dtype (f32), and a checkpoint of another
 * dtype (one PyTorch saved in bf16) is KILN_DTYPE_MISMATCH naming the tensor,
 * its dtype and the conversion to make. Save refuses a parameter holding a NaN
 * or an infinity (KILN_INVALID_ARGUMENT naming it; the file is left as it
 * was). */
kiln_status_t kiln_nn_model_save(const kiln_nn_model_t *model, const char *path);
kiln_status_t kiln_nn_model_load(kiln_nn_model_t *model, const char *path);

/* The models of kiln-train, for 28x28 images of one channel and 10 classes,
 * on `device`, initialised from `seed` (kiln_nn_model_reset_parameters):
 * "mlp":   flatten, linear(784, 1000), relu, linear(1000, 10)
 * "lenet": conv2d(1, 6, 5x5, pad 2), relu, max_pool2d(2), conv2d(6, 16, 5x5),
 *          relu, max_pool2d(2), flatten, linear(400, 120), relu,
 *          linear(120, 84), relu, linear(84, 10)
 * KILN_NOT_FOUND naming the presets for another name. */
kiln_status_t kiln_nn_model_create_preset(const char *name, kiln_device_t *device, uint64_t seed,
                                          kiln_nn_model_t **out_model);

/* ---- training: optimizers (nn/optim.c) --------------------------------------------
 * An optimizer updates a list of parameters from their gradients, in place, one
 * fused kiln operation per parameter (kiln_tensor_sgd_update,
 * kiln_tensor_adam_update; a 16-bit gradient of a low-precision model is cast
 * to f32 first); a parameter without a gradient is left alone, as
 * in PyTorch. Its state (momentum buffers; Adam's m and v) is allocated on the
 * parameters' device when it is created. Single-owner; one thread at a time;
 * the parameters must outlive it. */

typedef struct kiln_nn_optimizer_t kiln_nn_optimizer_t;

/* The parameters' device allocations fail with KILN_OUT_OF_MEMORY; bad hyper-
 * parameters are KILN_INVALID_ARGUMENT naming them (checked here, not at the
 * first step); count 0 is allowed. */
kiln_status_t kiln_nn_sgd_create(kiln_nn_param_t *const *params, size_t count, const kiln_sgd_params_t *options,
                                 kiln_nn_optimizer_t **out_optimizer);
kiln_status_t kiln_nn_adam_create(kiln_nn_param_t *const *params, size_t count, const kiln_adam_params_t *options,
                                  kiln_nn_optimizer_t **out_optimizer);
/* The optimizer kiln-train uses for a preset model: "mlp": SGD, lr 0.05,
 * momentum 0.9; "lenet": Adam, lr 0.002, betas (0.9, 0.999), eps 1e-8.
 * kiln-train anneals the rate once per epoch with kiln_nn_lr_cosine. */
kiln_status_t kiln_nn_optimizer_create_preset(const char *name, kiln_nn_model_t *model,
                                              kiln_nn_optimizer_t **out_optimizer);
void kiln_nn_optimizer_free(kiln_nn_optimizer_t *optimizer);
/* One update of every parameter that has a gradient. Enqueued; does not block. */
kiln_status_t kiln_nn_optimizer_step(kiln_nn_optimizer_t *optimizer);
/* kiln_nn_param_zero_grad on every parameter. */
void kiln_nn_optimizer_zero_grad(kiln_nn_optimizer_t *optimizer);
/* "SGD(lr 0.1)", "Adam(lr 0.001)"; owned by the optimizer. */
const char *kiln_nn_optimizer_describe(const kiln_nn_optimizer_t *optimizer);
/* The learning rate now, and a new one for a schedule (KILN_INVALID_ARGUMENT
 * unless > 0 and finite). */
double kiln_nn_optimizer_lr(const kiln_nn_optimizer_t *optimizer);
kiln_status_t kiln_nn_optimizer_set_lr(kiln_nn_optimizer_t *optimizer, double lr);
/* Cosine annealing, as torch.optim.lr_scheduler.CosineAnnealingLR with
 * T_max = epochs and eta_min = 0 stepped once per epoch: the rate of epoch
 * `epoch` (from 0) is base_lr * (1 + cos(pi * epoch / epochs)) / 2. */
double kiln_nn_lr_cosine(double base_lr, uint64_t epoch, uint64_t epochs);

/* ---- training: loss scaling (nn/scaler.c) -------------------------------------------
 * Dynamic loss scaling for f16 training, as torch.cuda.amp.GradScaler: the
 * backward pass starts from scale (d(scale * loss)), so small gradients do
 * not flush to zero in f16; before each update every gradient is read into
 * f32, multiplied by 1/scale and checked; a step with any infinity or NaN is
 * skipped (parameters and optimizer state untouched) and the scale multiplied
 * by backoff_factor; after growth_interval clean steps in a row it is
 * multiplied by growth_factor. Single-owner; one thread at a time. */

typedef struct kiln_nn_grad_scaler_t kiln_nn_grad_scaler_t;

typedef struct kiln_nn_grad_scaler_options_t {
  double init_scale;        /* 65536 (2^16) */
  double growth_factor;     /* 2 */
  double backoff_factor;    /* 0.5 */
  uint64_t growth_interval; /* 2000 */
} kiln_nn_grad_scaler_options_t;

/* Fill with PyTorch's defaults, above. */
void kiln_nn_grad_scaler_options_initialize(kiln_nn_grad_scaler_options_t *options);

typedef struct kiln_nn_grad_scaler_state_t {
  double scale;            /* the scale now */
  uint64_t growth_tracker; /* clean steps since the scale last changed */
  uint64_t skipped;        /* steps skipped for a non-finite gradient, in all */
  uint64_t steps;          /* steps through kiln_nn_grad_scaler_step, skipped ones included */
} kiln_nn_grad_scaler_state_t;

/* A scaler (NULL options: the defaults); the caller owns it.
 * KILN_INVALID_ARGUMENT naming a bad option (init_scale not a positive finite
 * f32, growth_factor <= 1, backoff_factor outside (0, 1), growth_interval 0);
 * KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn_grad_scaler_create(const kiln_nn_grad_scaler_options_t *options,
                                         kiln_nn_grad_scaler_t **out_scaler);
void kiln_nn_grad_scaler_free(kiln_nn_grad_scaler_t *scaler);
/* The state; KILN_INVALID_ARGUMENT for NULL. */
kiln_status_t kiln_nn_grad_scaler_state(const kiln_nn_grad_scaler_t *scaler, kiln_nn_grad_scaler_state_t *out_state);
/* The scale now (1 for NULL). */
double kiln_nn_grad_scaler_scale(const kiln_nn_grad_scaler_t *scaler);
/* Set the scale (a positive finite f32; KILN_INVALID_ARGUMENT otherwise) and
 * restart the count of clean steps, as GradScaler.update(new_scale). */
kiln_status_t kiln_nn_grad_scaler_set_scale(kiln_nn_grad_scaler_t *scaler, double scale);
/* kiln_nn_tape_backward from `loss` (one element) with upstream gradient
 * scale: scaler.scale(loss).backward(). Enqueued; does not block. */
kiln_status_t kiln_nn_grad_scaler_backward(const kiln_nn_grad_scaler_t *scaler, kiln_nn_tape_t *tape,
                                           kiln_tensor_t *loss);
/* scaler.step(optimizer) then scaler.update(): each gradient of the
 * optimizer's parameters is replaced by its f32 value times 1/scale; when all
 * are finite, kiln_nn_optimizer_step; otherwise nothing is updated and
 * *out_skipped (may be NULL) is true. Then the scale backs off or grows.
 * Blocks once, to read whether a gradient overflowed. Errors of the
 * operations, with the parameter named; the scale is unchanged then. */
kiln_status_t kiln_nn_grad_scaler_step(kiln_nn_grad_scaler_t *scaler, kiln_nn_optimizer_t *optimizer,
                                       bool *out_skipped);

/* ---- training: the loop (nn/train.c) -----------------------------------------------
 * One epoch of a classifier: for each batch of the loader, forward with a tape,
 * the cross-entropy loss, backward, an optimizer step, the gradients dropped.
 * The loss and the number of right answers are summed on the device; the host
 * reads them every `report_every` steps (for progress) and at the end. */

typedef struct kiln_nn_progress_t {
  uint64_t epoch;
  size_t step;     /* steps done in this epoch */
  size_t steps;    /* steps in the epoch */
  size_t images;   /* images trained on so far in this epoch */
  double loss;     /* mean of the batch losses so far */
  double accuracy; /* right answers so far / images so far */
  double seconds;  /* since the epoch started */
} kiln_nn_progress_t;

typedef void (*kiln_nn_progress_fn)(const kiln_nn_progress_t *progress, void *user);

typedef struct kiln_nn_train_options_t {
  size_t report_every;          /* steps between progress calls; each reads two numbers back (the host waits for the device); 0: none */
  kiln_nn_progress_fn progress; /* may be NULL */
  void *user;
  size_t max_steps;             /* stop after this many steps; 0: the whole epoch */
  float *step_losses;           /* when not NULL: the loss of each of the first step_loss_count steps, */
  size_t step_loss_count;       /* kept on the device (4-byte copies) and read once at the end */
  /* When not NULL: read before each step; once it is nonzero the epoch ends
   * (KILN_OK, the stats of the steps done). Set it from a signal handler to
   * stop cleanly after the step under way (kiln-train does so on SIGINT). */
  const volatile sig_atomic_t *stop;
  /* When not NULL: each step's backward and update go through it
   * (kiln_nn_grad_scaler_backward and _step): for an f16 model. */
  kiln_nn_grad_scaler_t *scaler;
} kiln_nn_train_options_t;

/* Zero everything: no progress, the whole epoch, no step losses. */
void kiln_nn_train_options_initialize(kiln_nn_train_options_t *options);

typedef struct kiln_nn_epoch_stats_t {
  uint64_t epoch;      /* the loader's epoch number */
  size_t steps;        /* batches */
  size_t images;
  double loss;         /* mean of the batch losses */
  double accuracy;     /* right answers / images (the running training accuracy) */
  double seconds;      /* wall time, until the last step's results were read */
  double images_per_s;
  size_t skipped;      /* steps the scaler skipped (a non-finite gradient); 0 without one */
} kiln_nn_epoch_stats_t;

/* Train `model` for one epoch of `loader` (whose batches must live on the
 * model's device; the loader's next epoch starts where it stands) with
 * `optimizer`. Blocks at each progress report and at the end, until the device
 * has done the work. NULL options: the defaults. Errors of the steps, with the
 * step named; the epoch stops at the first. A loss that is not finite (NaN or
 * infinite: training diverged) is KILN_INVALID_ARGUMENT naming the first such
 * step and the learning rate, found at the next progress report or at the
 * end; the parameters are then not finite either (kiln_nn_model_save refuses
 * them). */
kiln_status_t kiln_nn_train_epoch(kiln_nn_model_t *model, kiln_nn_optimizer_t *optimizer, kiln_nn_loader_t *loader,
                                  const kiln_nn_train_options_t *options, kiln_nn_epoch_stats_t *out_stats);

/* At a precision other than f32 (kiln_nn_model_set_precision) the model's
 * logits are cast to f32 on the tape before the loss, and so in evaluation. */

/* The mean loss and the accuracy of `model` over one epoch of `loader` (a
 * loader without shuffle, of any batch size), without a tape. Blocks until
 * done (one read at the end). */
kiln_status_t kiln_nn_evaluate(kiln_nn_model_t *model, kiln_nn_loader_t *loader, double *out_loss,
                               double *out_accuracy);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_NN_H */
