/* nn/train.c: the classifier training loop (one epoch: forward, loss, backward, update) and evaluation, with their sums kept on the device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn_internal.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kiln_nn_train_options_initialize(kiln_nn_train_options_t *options) {
  if (options) memset(options, 0, sizeof *options);
}

/* Running sums on the device: the loss (f32, in place) and right answers (i32). */
typedef struct sums_t {
  kiln_tensor_t *loss, *correct;
} sums_t;

static kiln_status_t sums_create(kiln_device_t *device, sums_t *s) {
  memset(s, 0, sizeof *s);
  kiln_status_t status = kiln_tensor_zeros(device, KILN_F32, 0, NULL, &s->loss);
  if (status == KILN_OK) status = kiln_tensor_zeros(device, KILN_I32, 0, NULL, &s->correct);
  return status;
}

static void sums_release(sums_t *s) {
  kiln_tensor_release(s->loss);
  kiln_tensor_release(s->correct);
}

/* loss_sum += weight * loss; correct += the number of argmax(logits) == labels. */
static kiln_status_t sums_add(sums_t *s, const kiln_tensor_t *logits, const kiln_tensor_t *labels,
                              const kiln_tensor_t *loss, double weight) {
  kiln_tensor_t *pred = NULL, *hit = NULL, *count = NULL, *total = NULL;
  kiln_status_t status = kiln_tensor_accumulate(s->loss, weight, loss);
  if (status == KILN_OK) status = kiln_tensor_argmax(logits, 1, false, &pred);
  if (status == KILN_OK) status = kiln_tensor_eq(pred, labels, &hit);
  /* sum_to a 0-d shape keeps the hits' i32, the counter's dtype, where
   * kiln_tensor_sum would make an i64 (not every device serves it). */
  if (status == KILN_OK) status = kiln_tensor_sum_to(hit, 0, NULL, &count);
  if (status == KILN_OK && (status = kiln_tensor_add(s->correct, count, &total)) == KILN_OK) {
    kiln_tensor_release(s->correct);
    s->correct = total;
  }
  kiln_tensor_release(pred);
  kiln_tensor_release(hit);
  kiln_tensor_release(count);
  return status;
}

/* Read both sums: the host waits for the device here. */
static kiln_status_t sums_read(const sums_t *s, double *out_loss, double *out_correct) {
  kiln_status_t status = kiln_tensor_item(s->loss, out_loss);
  if (status == KILN_OK) status = kiln_tensor_item(s->correct, out_correct);
  return status;
}

/* The model's output as f32 logits: a low-precision model's cast up on the
 * tape, as torch.autocast runs softmax and cross-entropy in f32. */
static kiln_status_t forward_f32(kiln_nn_model_t *model, kiln_nn_tape_t *tape, kiln_tensor_t *images,
                                 kiln_tensor_t **out_logits) {
  kiln_tensor_t *out = NULL;
  kiln_status_t status = kiln_nn_model_forward(model, tape, images, &out);
  if (status != KILN_OK || kiln_tensor_dtype(out) == KILN_F32) {
    *out_logits = out;
    return status;
  }
  status = kiln_nn_tape_cast(tape, out, KILN_F32, out_logits);
  kiln_tensor_release(out);
  return status;
}

/* One training step on one batch. */
static kiln_status_t train_step(kiln_nn_model_t *model, kiln_nn_optimizer_t *optimizer, kiln_nn_grad_scaler_t *scaler,
                                kiln_nn_tape_t *tape, const kiln_nn_batch_t *batch, sums_t *sums,
                                kiln_buffer_t *losses, size_t step, bool *out_skipped) {
  kiln_tensor_t *logits = NULL, *loss = NULL;
  kiln_status_t status = forward_f32(model, tape, batch->images, &logits);
  if (status == KILN_OK) status = kiln_nn_tape_cross_entropy(tape, logits, batch->labels, &loss);
  if (status == KILN_OK) status = sums_add(sums, logits, batch->labels, loss, 1.0);
  if (status == KILN_OK && losses) {
    /* 4 bytes device to device: the loss stays where it is until the end. */
    kiln_device_t *device = kiln_tensor_device(loss);
    status = kiln_buffer_copy(kiln_device_current_queue(device), kiln_tensor_buffer(loss),
                              kiln_tensor_offset_bytes(loss), losses, step * sizeof(float), sizeof(float), 0, NULL, NULL);
  }
  *out_skipped = false;
  if (scaler) {
    if (status == KILN_OK) status = kiln_nn_grad_scaler_backward(scaler, tape, loss);
    if (status == KILN_OK) status = kiln_nn_grad_scaler_step(scaler, optimizer, out_skipped);
  } else {
    if (status == KILN_OK) status = kiln_nn_tape_backward(tape, loss, NULL);
    if (status == KILN_OK) status = kiln_nn_optimizer_step(optimizer);
  }
  kiln_nn_optimizer_zero_grad(optimizer);
  kiln_nn_tape_clear(tape);
  kiln_tensor_release(logits);
  kiln_tensor_release(loss);
  return status;
}

/* The sum of the losses is not finite: the first step whose loss is not, from
 * the losses kept on the device, named with the learning rate to lower. */
static kiln_status_t diverged(const kiln_nn_optimizer_t *optimizer, kiln_buffer_t *losses, size_t loss_cap,
                              const kiln_nn_epoch_stats_t *st, double sum) {
  size_t n = st->steps < loss_cap ? st->steps : loss_cap;
  float *host = n ? malloc(n * sizeof *host) : NULL;
  if (n && !host) return kiln_set_error(KILN_OUT_OF_MEMORY, "cannot allocate %zu step losses", n);
  kiln_status_t status = KILN_OK;
  if (n)
    status = kiln_buffer_read(kiln_device_current_queue(kiln_buffer_device(losses)), losses, 0, host, n * sizeof *host,
                              true, 0, NULL, NULL);
  size_t bad = 0;
  while (status == KILN_OK && bad < n && isfinite(host[bad])) bad++;
  if (status == KILN_OK && bad < n)
    status = kiln_set_error(KILN_INVALID_ARGUMENT,
                            "the loss is %g at step %zu of epoch %llu: training diverged; lower the learning rate "
                            "(it is %g)",
                            (double)host[bad], bad, (unsigned long long)st->epoch, kiln_nn_optimizer_lr(optimizer));
  else if (status == KILN_OK)
    status = kiln_set_error(KILN_INVALID_ARGUMENT,
                            "the sum of the losses is %g after %zu steps of epoch %llu: training diverged; lower the "
                            "learning rate (it is %g)",
                            sum, st->steps, (unsigned long long)st->epoch, kiln_nn_optimizer_lr(optimizer));
  free(host);
  return status;
}

kiln_status_t kiln_nn_train_epoch(kiln_nn_model_t *model, kiln_nn_optimizer_t *optimizer, kiln_nn_loader_t *loader,
                                  const kiln_nn_train_options_t *options, kiln_nn_epoch_stats_t *out_stats) {
  static const char call[] = "kiln_nn_train_epoch";
  if (!model || !optimizer || !loader || !out_stats)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call,
                          !model ? "model" : !optimizer ? "optimizer" : !loader ? "loader" : "out_stats");
  kiln_nn_train_options_t defaults;
  kiln_nn_train_options_initialize(&defaults);
  const kiln_nn_train_options_t *o = options ? options : &defaults;
  kiln_device_t *device = kiln_nn_model_device(model);
  if (!device) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: the model has no parameters", call);
  const size_t loss_count = o->step_losses ? o->step_loss_count : 0;
  const size_t steps_in_epoch = kiln_nn_loader_batch_count(loader);
  /* Every step's loss is kept on the device (a 4-byte copy each), so that a
   * loss gone non-finite is traced to its step without the host waiting. */
  size_t loss_cap = o->max_steps && o->max_steps < steps_in_epoch ? o->max_steps : steps_in_epoch;
  if (loss_cap < loss_count) loss_cap = loss_count;

  kiln_nn_tape_t *tape = NULL;
  kiln_buffer_t *losses = NULL;
  sums_t sums;
  memset(&sums, 0, sizeof sums);
  kiln_status_t status = kiln_nn_tape_create(&tape);
  if (status == KILN_OK) status = sums_create(device, &sums);
  if (status == KILN_OK && loss_cap) status = kiln_buffer_create(device, loss_cap * sizeof(float), &losses);

  kiln_nn_epoch_stats_t st;
  memset(&st, 0, sizeof st);
  const double t0 = now_s();
  bool first = true;
  while (status == KILN_OK && (!o->max_steps || st.steps < o->max_steps)) {
    if (o->stop && *o->stop) break;
    kiln_nn_batch_t batch;
    status = kiln_nn_loader_next(loader, &batch);
    if (status != KILN_OK || batch.count == 0) break;
    if (first) st.epoch = batch.epoch;
    first = false;
    if (kiln_tensor_device(batch.images) != device) {
      status = kiln_set_error(KILN_DEVICE_MISMATCH,
                              "the loader's batches live on %s but the model's parameters on %s; create the loader on %s",
                              kiln_device_name(kiln_tensor_device(batch.images)), kiln_device_name(device),
                              kiln_device_selector(device));
      break;
    }
    bool skipped = false;
    status = train_step(model, optimizer, o->scaler, tape, &batch, &sums, st.steps < loss_cap ? losses : NULL, st.steps,
                        &skipped);
    st.skipped += skipped;
    if (status != KILN_OK) {
      status = kiln_wrap_error(status, "step %zu of epoch %llu", st.steps, (unsigned long long)batch.epoch);
      break;
    }
    st.steps++;
    st.images += batch.count;
    if (o->report_every && o->progress && st.steps % o->report_every == 0) {
      double loss = 0, correct = 0;
      status = sums_read(&sums, &loss, &correct);
      if (status != KILN_OK) break;
      if (!isfinite(loss)) {
        status = diverged(optimizer, losses, loss_cap, &st, loss);
        break;
      }
      const kiln_nn_progress_t p = {st.epoch, st.steps, steps_in_epoch, st.images, loss / (double)st.steps,
                                    correct / (double)st.images, now_s() - t0};
      o->progress(&p, o->user);
    }
  }
  double loss = 0, correct = 0;
  if (status == KILN_OK) status = sums_read(&sums, &loss, &correct);
  if (status == KILN_OK && !isfinite(loss)) status = diverged(optimizer, losses, loss_cap, &st, loss);
  st.seconds = now_s() - t0;
  if (status == KILN_OK && loss_count) {
    size_t n = st.steps < loss_count ? st.steps : loss_count;
    memset(o->step_losses, 0, loss_count * sizeof(float));
    status = kiln_buffer_read(kiln_device_current_queue(device), losses, 0, o->step_losses, n * sizeof(float), true, 0,
                              NULL, NULL);
  }
  kiln_nn_tape_free(tape);
  sums_release(&sums);
  kiln_buffer_release(losses);
  if (status != KILN_OK) return kiln_wrap_error(status, "%s", call);
  st.loss = st.steps ? loss / (double)st.steps : 0;
  st.accuracy = st.images ? correct / (double)st.images : 0;
  st.images_per_s = st.seconds > 0 ? (double)st.images / st.seconds : 0;
  *out_stats = st;
  return KILN_OK;
}

kiln_status_t kiln_nn_evaluate(kiln_nn_model_t *model, kiln_nn_loader_t *loader, double *out_loss,
                               double *out_accuracy) {
  static const char call[] = "kiln_nn_evaluate";
  if (!model || !loader)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !model ? "model" : "loader");
  kiln_device_t *device = kiln_nn_model_device(model);
  if (!device) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: the model has no parameters", call);
  sums_t sums;
  kiln_status_t status = sums_create(device, &sums);
  size_t images = 0;
  while (status == KILN_OK) {
    kiln_nn_batch_t batch;
    status = kiln_nn_loader_next(loader, &batch);
    if (status != KILN_OK || batch.count == 0) break;
    kiln_tensor_t *logits = NULL, *loss = NULL;
    status = forward_f32(model, NULL, batch.images, &logits);
    if (status == KILN_OK) status = kiln_nn_tape_cross_entropy(NULL, logits, batch.labels, &loss);
    /* Weighted by the batch size: the mean over images, whatever the last batch. */
    if (status == KILN_OK) status = sums_add(&sums, logits, batch.labels, loss, (double)batch.count);
    kiln_tensor_release(logits);
    kiln_tensor_release(loss);
    if (status != KILN_OK) status = kiln_wrap_error(status, "batch %zu", batch.index);
    images += batch.count;
  }
  double loss = 0, correct = 0;
  if (status == KILN_OK) status = sums_read(&sums, &loss, &correct);
  sums_release(&sums);
  if (status != KILN_OK) return kiln_wrap_error(status, "%s", call);
  if (out_loss) *out_loss = images ? loss / (double)images : 0;
  if (out_accuracy) *out_accuracy = images ? correct / (double)images : 0;
  return KILN_OK;
}
