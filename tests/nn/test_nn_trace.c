/* tests/nn/test_nn_trace.c: a short training run traced on cpu:0 and on PoCL: the JSON checked structurally, its memory counters against kiln_device_memory_stats, and its device time against the run's own clock. */
#include <math.h>

#include "../trace_check.h"
#include "nn_test.h"

/* The devices traced: cpu:0, then the first OpenCL device that is not
 * Oclgrind (a simulator: a training step there takes minutes). */
static kiln_device_t *kt_traced_device(int which) {
  if (which == 0) return kt_nn_cpu();
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  for (size_t d = 0; d < count; d++) {
    kiln_device_t *device = NULL;
    KT_OK(kiln_device_get(d, &device));
    if (!strncmp(kiln_device_selector(device), "opencl:", 7) && !strstr(kiln_device_name(device), "Oclgrind"))
      return device;
  }
  return NULL;
}

/* KT_STEPS steps of the mlp on 100-image batches, traced: every op of the
 * forward pass, the backward pass and the optimizer, and the batches'
 * copies. */
enum { KT_STEPS = 30, KT_BATCH = 100 };

START_TEST(test_traced_training_run) {
  kiln_device_t *device = kt_traced_device(_i);
  if (!device) {
    fprintf(stderr, "no OpenCL device besides Oclgrind: the traced run on OpenCL is skipped\n");
    return;
  }
  kiln_nn_dataset_t *ds = NULL;
  KT_OK(kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TRAIN, &ds));
  kiln_nn_model_t *model = NULL;
  kiln_nn_optimizer_t *opt = NULL;
  KT_OK(kiln_nn_model_create_preset("mlp", device, 42, &model));
  KT_OK(kiln_nn_optimizer_create_preset("mlp", model, &opt));
  kiln_nn_loader_options_t lo;
  kiln_nn_loader_options_initialize(&lo);
  lo.batch_size = KT_BATCH;
  lo.seed = 42;
  kiln_nn_loader_t *loader = NULL;
  KT_OK(kiln_nn_loader_create(ds, device, &lo, &loader));
  kiln_nn_train_options_t o;
  kiln_nn_train_options_initialize(&o);
  kiln_nn_epoch_stats_t st;
  /* Warm: every kernel compiled and the pool filled before the trace. */
  o.max_steps = 3;
  KT_OK(kiln_nn_train_epoch(model, opt, loader, &o, &st));

  kt_nn_tmpdir();
  const char *path = kt_nn_path("train.json");
  KT_OK(kiln_trace_start(path));
  o.max_steps = KT_STEPS;
  KT_OK(kiln_nn_train_epoch(model, opt, loader, &o, &st));
  KT_OK(kiln_trace_stop());
  ck_assert_uint_eq(st.steps, KT_STEPS);
  kiln_memory_stats_t mem;
  KT_OK(kiln_device_memory_stats(device, &mem));

  kiln_device_info_t info;
  KT_OK(kiln_device_info(device, &info));
  checked_t c = check_json(path, 2 + (int)info.index);
  ck_assert_int_eq(c.dropped, 0);
  /* Each step: the forward and backward passes and the update, dozens of
   * ops; the batch's images and labels copied in; the loss read back. */
  ck_assert_int_ge(c.ops, 10 * KT_STEPS);
  ck_assert_int_ge(c.copies, 2 * KT_STEPS);
  ck_assert_int_ge(c.flows, c.ops + c.copies);
  ck_assert_uint_eq(c.last_in_use, mem.in_use_bytes);
  ck_assert_uint_eq(c.last_pooled, mem.pooled_bytes);
  /* The run's own clock (kiln_nn_train_epoch's wall time, until the last
   * step's results were read) against the trace: the device's slices span
   * the run within 10%, and the time each queue spends in its ops and
   * copies lies within that span. */
  const double run_us = st.seconds * 1e6, span_us = c.device_last_us - c.device_first_us;
  fprintf(stderr,
          "%s: %d ops, %d copies; run %.1f ms, device slices span %.1f ms, the busiest queue is busy %.1f ms (%.0f%%)\n",
          kiln_device_selector(device), c.ops, c.copies, run_us / 1e3, span_us / 1e3, c.device_busy_us / 1e3,
          100 * c.device_busy_us / span_us);
  ck_assert_msg(fabs(span_us - run_us) <= 0.10 * run_us,
                "%s: the device slices span %.1f ms; the run took %.1f ms (over 10%% apart)",
                kiln_device_selector(device), span_us / 1e3, run_us / 1e3);
  ck_assert_msg(c.device_busy_us <= span_us * 1.0001 + 1, "%s: a queue is busy %.1f us in a %.1f us span",
                kiln_device_selector(device), c.device_busy_us, span_us);
  /* The summary: the training's op kinds and the copies. */
  size_t length = 0;
  KT_OK(kiln_trace_summary(NULL, 0, &length));
  char *text = malloc(length + 1);
  KT_OK(kiln_trace_summary(text, length + 1, &length));
  ck_assert_ptr_nonnull(strstr(text, "matmul"));
  ck_assert_ptr_nonnull(strstr(text, "h2d"));
  fprintf(stderr, "%s\n", text);
  free(text);
  kiln_nn_loader_free(loader);
  kiln_nn_optimizer_free(opt);
  kiln_nn_model_free(model);
  kiln_nn_dataset_free(ds);
  kt_nn_tmpdir_done();
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  unsetenv("KILN_TRACE");
  unsetenv("KILN_TRACE_EVENTS");
  Suite *s = suite_create("nn_trace");
  TCase *tc = tcase_create("trace");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_traced_training_run, 0, 2);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
