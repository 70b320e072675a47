/* nn/loader.c: batches of a data set on a device, shuffled per epoch from a seed, the next one uploaded while the current step runs. */
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* One batch's home: tensors on the device (a full batch, and the smaller last
 * one when the epoch ends in one) and page-locked staging memory. Two slots
 * with prefetch (the batch in use, the one being uploaded), one without. */
typedef struct kiln_nn_slot_t {
  kiln_tensor_t *images, *labels;           /* batch_size samples */
  kiln_tensor_t *tail_images, *tail_labels; /* the last batch's size; NULL when it has none */
  float *stage_images;                      /* kiln_host_allocate'd */
  int32_t *stage_labels;
  /* The last upload out of the staging memory: the host must not overwrite it
   * before it completes, nor the compute queue read the tensors. */
  kiln_event_t *uploaded;
  /* Recorded on the compute queue after the work that used the tensors: the
   * next upload into them waits for it on the device. */
  kiln_event_t *consumed;
  bool filled; /* holds batch `index` of `epoch` */
  uint64_t epoch;
  size_t index;
  size_t count;
} kiln_nn_slot_t;

struct kiln_nn_loader_t {
  const kiln_nn_dataset_t *dataset;
  kiln_nn_dataset_info_t info;
  kiln_device_t *device;
  kiln_nn_loader_options_t options;
  size_t pixels;       /* per image */
  size_t batches;      /* per epoch */
  size_t tail;         /* samples of the last batch when smaller than batch_size; 0 when none */
  kiln_queue_t *upload_queue; /* prefetch only */
  kiln_nn_slot_t slots[2];
  int slot_count;
  int handed;          /* the slot whose batch the caller holds; -1 none */
  uint64_t epoch;      /* the position of the next batch */
  size_t index;        /* == batches: the end-of-epoch marker comes next */
  /* The orders of two epochs: the current one and the next one prefetch reaches into. */
  size_t *orders[2];
  uint64_t order_epochs[2];
  bool order_valid[2];
};

/* ---- the order ------------------------------------------------------------------- */

/* Uniform in [0, range) without modulo bias: values below 2^64 mod range are
 * drawn again. */
static uint64_t kiln_nn_bounded(uint64_t *state, uint64_t range) {
  uint64_t threshold = (0 - range) % range;
  for (;;) {
    uint64_t x = kiln_nn__splitmix64(state);
    if (x >= threshold) return x % range;
  }
}

static void kiln_nn_fill_order(uint64_t seed, uint64_t epoch, bool shuffle, size_t count, size_t *order) {
  for (size_t i = 0; i < count; i++) order[i] = i;
  if (!shuffle) return;
  /* Each epoch its own stream, a function of (seed, epoch) alone. */
  uint64_t state = seed ^ (0x6a09e667f3bcc909ull * (epoch + 1));
  for (size_t i = count; i > 1; i--) {
    size_t j = (size_t)kiln_nn_bounded(&state, i);
    size_t t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
}

kiln_status_t kiln_nn_shuffle_order(uint64_t seed, uint64_t epoch, bool shuffle, size_t count, size_t *out_order) {
  if (!out_order && count) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_shuffle_order: out_order is NULL");
  kiln_nn_fill_order(seed, epoch, shuffle, count, out_order);
  return KILN_OK;
}

static const size_t *kiln_nn_order(kiln_nn_loader_t *loader, uint64_t epoch) {
  for (int k = 0; k < 2; k++)
    if (loader->order_valid[k] && loader->order_epochs[k] == epoch) return loader->orders[k];
  /* Replace the older epoch: the one before `epoch`'s predecessor is done. */
  int k = !loader->order_valid[0] ? 0 : !loader->order_valid[1] ? 1 : loader->order_epochs[0] < loader->order_epochs[1] ? 0 : 1;
  kiln_nn_fill_order(loader->options.seed, epoch, loader->options.shuffle, loader->info.count, loader->orders[k]);
  loader->order_epochs[k] = epoch;
  loader->order_valid[k] = true;
  return loader->orders[k];
}

/* ---- create / free ---------------------------------------------------------------- */

void kiln_nn_loader_options_initialize(kiln_nn_loader_options_t *options) {
  if (!options) return;
  *options = (kiln_nn_loader_options_t){
      .batch_size = 100, .shuffle = true, .seed = 0, .drop_last = false, .prefetch = true, .layout = KILN_NN_NCHW};
}

size_t kiln_nn_loader_batch_count(const kiln_nn_loader_t *loader) { return loader ? loader->batches : 0; }

static kiln_status_t kiln_nn_batch_tensors(kiln_nn_loader_t *loader, size_t count, kiln_tensor_t **out_images,
                                           kiln_tensor_t **out_labels) {
  int64_t nchw[4] = {(int64_t)count, 1, loader->info.rows, loader->info.cols};
  int64_t flat[2] = {(int64_t)count, (int64_t)loader->pixels};
  int64_t n = (int64_t)count;
  kiln_status_t status = loader->options.layout == KILN_NN_NCHW
                             ? kiln_tensor_empty(loader->device, KILN_F32, 4, nchw, out_images)
                             : kiln_tensor_empty(loader->device, KILN_F32, 2, flat, out_images);
  if (status != KILN_OK) return status;
  status = kiln_tensor_empty(loader->device, KILN_I32, 1, &n, out_labels);
  if (status != KILN_OK) {
    kiln_tensor_release(*out_images);
    *out_images = NULL;
  }
  return status;
}

static kiln_status_t kiln_nn_slot_create(kiln_nn_loader_t *loader, kiln_nn_slot_t *slot) {
  size_t b = loader->options.batch_size;
  kiln_status_t status = kiln_nn_batch_tensors(loader, b, &slot->images, &slot->labels);
  if (status == KILN_OK && loader->tail) status = kiln_nn_batch_tensors(loader, loader->tail, &slot->tail_images, &slot->tail_labels);
  if (status == KILN_OK) status = kiln_host_allocate(loader->device, b * loader->pixels * sizeof(float), (void **)&slot->stage_images);
  if (status == KILN_OK) status = kiln_host_allocate(loader->device, b * sizeof(int32_t), (void **)&slot->stage_labels);
  return status;
}

void kiln_nn_loader_free(kiln_nn_loader_t *loader) {
  if (!loader) return;
  /* Staging memory may still be read by an upload, tensors by the caller's
   * work: wait for both before anything goes. */
  for (int s = 0; s < loader->slot_count; s++) {
    kiln_nn_slot_t *slot = &loader->slots[s];
    if (slot->uploaded) kiln_event_wait(slot->uploaded);
    if (slot->consumed) kiln_event_wait(slot->consumed);
  }
  if (loader->upload_queue) kiln_queue_finish(loader->upload_queue);
  for (int s = 0; s < loader->slot_count; s++) {
    kiln_nn_slot_t *slot = &loader->slots[s];
    kiln_event_release(slot->uploaded);
    kiln_event_release(slot->consumed);
    kiln_tensor_release(slot->images);
    kiln_tensor_release(slot->labels);
    kiln_tensor_release(slot->tail_images);
    kiln_tensor_release(slot->tail_labels);
    kiln_host_free(loader->device, slot->stage_images);
    kiln_host_free(loader->device, slot->stage_labels);
  }
  kiln_queue_release(loader->upload_queue);
  free(loader->orders[0]);
  free(loader->orders[1]);
  free(loader);
}

kiln_status_t kiln_nn_loader_create(const kiln_nn_dataset_t *dataset, kiln_device_t *device,
                                    const kiln_nn_loader_options_t *options, kiln_nn_loader_t **out_loader) {
  if (!dataset || !device || !out_loader)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_loader_create: %s is NULL",
                          !dataset ? "dataset" : !device ? "device" : "out_loader");
  kiln_nn_loader_options_t opts;
  kiln_nn_loader_options_initialize(&opts);
  if (options) opts = *options;
  kiln_nn_dataset_info_t info;
  kiln_nn_dataset_info(dataset, &info);
  if (opts.batch_size == 0)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_loader_create: batch_size is 0; use 1 or more (100 is usual)");
  if (opts.layout != KILN_NN_NCHW && opts.layout != KILN_NN_FLAT)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "kiln_nn_loader_create: layout %d is neither KILN_NN_NCHW (0) nor KILN_NN_FLAT (1)",
                          (int)opts.layout);
  if (info.count == 0)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_loader_create: the data set is empty; there is nothing to load");
  size_t pixels = (size_t)info.rows * info.cols, stage = 0;
  /* A batch larger than the data set is the data set. */
  if (opts.batch_size > info.count && !opts.drop_last) opts.batch_size = info.count;
  if (__builtin_mul_overflow(opts.batch_size, pixels * sizeof(float), &stage) || opts.batch_size > INT64_MAX)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_loader_create: batch_size %zu of %zu-pixel images overflows",
                          opts.batch_size, pixels);

  kiln_nn_loader_t *loader = calloc(1, sizeof *loader);
  if (!loader) return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_loader_create: cannot allocate the loader");
  loader->dataset = dataset;
  loader->info = info;
  loader->device = device;
  loader->options = opts;
  loader->pixels = pixels;
  loader->batches = info.count / opts.batch_size;
  size_t rest = info.count % opts.batch_size;
  if (rest && !opts.drop_last) {
    loader->batches++;
    loader->tail = rest;
  }
  loader->handed = -1;
  loader->slot_count = opts.prefetch ? 2 : 1;
  kiln_status_t status = KILN_OK;
  for (int k = 0; k < 2 && status == KILN_OK; k++) {
    loader->orders[k] = malloc(info.count * sizeof(size_t));
    if (!loader->orders[k]) status = kiln_set_error(KILN_OUT_OF_MEMORY, "cannot allocate the order of %zu samples", info.count);
  }
  /* No batch at all (drop_last with fewer samples than a batch): no slots. */
  for (int s = 0; s < loader->slot_count && status == KILN_OK && loader->batches; s++)
    status = kiln_nn_slot_create(loader, &loader->slots[s]);
  if (status == KILN_OK && opts.prefetch) status = kiln_queue_create(device, &loader->upload_queue);
  if (status != KILN_OK) {
    kiln_nn_loader_free(loader);
    return kiln_wrap_error(status, "kiln_nn_loader_create (batches of %zu on %s)", opts.batch_size,
                           kiln_device_name(device));
  }
  *out_loader = loader;
  return KILN_OK;
}

/* ---- batches -------------------------------------------------------------------- */

/* Gather batch `index` of `epoch` into the slot's staging memory and upload it:
 * on the loader's queue without blocking (prefetch), or blocking on the
 * compute queue. The upload waits on the device for the work that last used
 * the slot's tensors. */
static kiln_status_t kiln_nn_fill(kiln_nn_loader_t *loader, kiln_nn_slot_t *slot, uint64_t epoch, size_t index,
                                  kiln_queue_t *compute) {
  size_t b = loader->options.batch_size, first = index * b;
  size_t count = loader->info.count - first < b ? loader->info.count - first : b;
  slot->filled = false;
  if (slot->uploaded) {
    kiln_status_t status = kiln_event_wait(slot->uploaded);
    kiln_event_release(slot->uploaded);
    slot->uploaded = NULL;
    if (status != KILN_OK) return status;
  }
  const size_t *order = kiln_nn_order(loader, epoch);
  const uint8_t *pixels = kiln_nn_dataset_pixels(loader->dataset), *labels = kiln_nn_dataset_labels(loader->dataset);
  size_t n = loader->pixels;
  for (size_t k = 0; k < count; k++) {
    size_t sample = order[first + k];
    const uint8_t *src = pixels + sample * n;
    float *dst = slot->stage_images + k * n;
    for (size_t p = 0; p < n; p++) dst[p] = (float)src[p] / 255.0f;
    slot->stage_labels[k] = labels[sample];
  }
  kiln_tensor_t *images = count == b ? slot->images : slot->tail_images;
  kiln_tensor_t *labels_t = count == b ? slot->labels : slot->tail_labels;
  bool prefetch = loader->options.prefetch;
  kiln_queue_t *queue = prefetch ? loader->upload_queue : compute;
  uint32_t waits = slot->consumed ? 1 : 0;
  kiln_status_t status = kiln_buffer_write(queue, kiln_tensor_buffer(images), kiln_tensor_offset_bytes(images),
                                           slot->stage_images, count * n * sizeof(float), !prefetch, waits,
                                           &slot->consumed, NULL);
  if (status == KILN_OK)
    status = kiln_buffer_write(queue, kiln_tensor_buffer(labels_t), kiln_tensor_offset_bytes(labels_t),
                               slot->stage_labels, count * sizeof(int32_t), !prefetch, 0, NULL,
                               prefetch ? &slot->uploaded : NULL);
  /* After a failed enqueue part of the staging may still be read: wait for
   * the queue before the memory can be reused. */
  if (status != KILN_OK) {
    kiln_queue_finish(queue);
    return status;
  }
  kiln_event_release(slot->consumed);
  slot->consumed = NULL;
  slot->filled = true;
  slot->epoch = epoch;
  slot->index = index;
  slot->count = count;
  return KILN_OK;
}

/* The work enqueued so far on the compute queue is done with the handed batch. */
static kiln_status_t kiln_nn_release_handed(kiln_nn_loader_t *loader, kiln_queue_t *compute) {
  if (loader->handed < 0) return KILN_OK;
  kiln_nn_slot_t *slot = &loader->slots[loader->handed];
  loader->handed = -1;
  kiln_event_release(slot->consumed);
  slot->consumed = NULL;
  return kiln_queue_record(compute, &slot->consumed);
}

kiln_status_t kiln_nn_loader_next(kiln_nn_loader_t *loader, kiln_nn_batch_t *out_batch) {
  if (!loader || !out_batch)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_loader_next: %s is NULL", !loader ? "loader" : "out_batch");
  kiln_queue_t *compute = kiln_device_current_queue(loader->device);
  kiln_status_t status = kiln_nn_release_handed(loader, compute);
  if (status != KILN_OK) return kiln_wrap_error(status, "kiln_nn_loader_next: marking the previous batch used");
  if (loader->index >= loader->batches) {
    *out_batch = (kiln_nn_batch_t){.count = 0, .index = loader->batches, .epoch = loader->epoch};
    loader->epoch++;
    loader->index = 0;
    return KILN_OK;
  }
  uint64_t epoch = loader->epoch;
  size_t index = loader->index;
  int s = -1;
  for (int k = 0; k < loader->slot_count; k++)
    if (loader->slots[k].filled && loader->slots[k].epoch == epoch && loader->slots[k].index == index) s = k;
  if (s < 0) {
    /* Not prefetched (the first batch, after a reset, or prefetch off). */
    s = 0;
    status = kiln_nn_fill(loader, &loader->slots[s], epoch, index, compute);
    if (status != KILN_OK)
      return kiln_wrap_error(status, "kiln_nn_loader_next: uploading batch %zu of epoch %llu to %s", index,
                             (unsigned long long)epoch, kiln_device_name(loader->device));
  }
  kiln_nn_slot_t *slot = &loader->slots[s];
  if (slot->uploaded) {
    /* The device waits for the upload; the host goes on. */
    status = kiln_queue_wait(compute, slot->uploaded);
    if (status != KILN_OK)
      return kiln_wrap_error(status, "kiln_nn_loader_next: ordering batch %zu after its upload", index);
  }
  bool full = slot->count == loader->options.batch_size;
  *out_batch = (kiln_nn_batch_t){.images = full ? slot->images : slot->tail_images,
                                 .labels = full ? slot->labels : slot->tail_labels,
                                 .count = slot->count,
                                 .index = index,
                                 .epoch = epoch};
  slot->filled = false; /* handed out: the next fill of this slot is a new batch */
  loader->handed = s;
  loader->index++;

  if (loader->options.prefetch) {
    /* The batch after this one, across the end of the epoch, into the other slot. */
    uint64_t next_epoch = loader->index < loader->batches ? epoch : epoch + 1;
    size_t next_index = loader->index < loader->batches ? loader->index : 0;
    status = kiln_nn_fill(loader, &loader->slots[!s], next_epoch, next_index, compute);
    if (status != KILN_OK)
      return kiln_wrap_error(status, "kiln_nn_loader_next: prefetching batch %zu of epoch %llu to %s", next_index,
                             (unsigned long long)next_epoch, kiln_device_name(loader->device));
  }
  return KILN_OK;
}

kiln_status_t kiln_nn_loader_reset(kiln_nn_loader_t *loader, uint64_t epoch) {
  if (!loader) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_loader_reset: loader is NULL");
  kiln_status_t status = kiln_nn_release_handed(loader, kiln_device_current_queue(loader->device));
  if (status != KILN_OK) return kiln_wrap_error(status, "kiln_nn_loader_reset");
  loader->epoch = epoch;
  loader->index = 0;
  /* A prefetched batch of the new position is kept: it is the same data. */
  return KILN_OK;
}
