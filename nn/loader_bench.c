/* nn/loader_bench.c: kiln-nn-loader-bench: the time of a training-shaped step with the next batch prefetched and without. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/nn.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int fail(const char *what) {
  fprintf(stderr, "kiln-nn-loader-bench: %s: %s\n", what, kiln_last_error());
  return 1;
}

/* The stand-in for a step until nn's tape exists: the forward pass of the
 * MLP 784-H-10 and its loss, the work a step enqueues per batch. */
typedef struct bench_model_t {
  kiln_tensor_t *w1, *w2;
} bench_model_t;

static kiln_status_t bench_step(const bench_model_t *m, const kiln_nn_batch_t *batch, kiln_tensor_t **out_loss) {
  kiln_tensor_t *h = NULL, *a = NULL, *logits = NULL;
  kiln_status_t s = kiln_tensor_matmul(batch->images, m->w1, false, false, &h);
  if (s == KILN_OK) s = kiln_tensor_relu(h, &a);
  if (s == KILN_OK) s = kiln_tensor_matmul(a, m->w2, false, false, &logits);
  if (s == KILN_OK) s = kiln_tensor_cross_entropy(logits, batch->labels, out_loss);
  kiln_tensor_release(h);
  kiln_tensor_release(a);
  kiln_tensor_release(logits);
  return s;
}

/* Milliseconds per step over `steps` steps (after one epoch's first batches
 * warmed the pools up), finishing the device queue at the end. */
static int bench_run(const kiln_nn_dataset_t *ds, kiln_device_t *device, const bench_model_t *m, size_t batch_size,
                     bool prefetch, int steps, double *out_ms) {
  kiln_nn_loader_options_t options;
  kiln_nn_loader_options_initialize(&options);
  options.batch_size = batch_size;
  options.prefetch = prefetch;
  options.layout = KILN_NN_FLAT;
  options.drop_last = true;
  kiln_nn_loader_t *loader = NULL;
  if (kiln_nn_loader_create(ds, device, &options, &loader) != KILN_OK) return fail("kiln_nn_loader_create");
  double start = 0;
  int done = 0, warm = 3;
  while (done < steps + warm) {
    kiln_nn_batch_t batch;
    if (kiln_nn_loader_next(loader, &batch) != KILN_OK) return fail("kiln_nn_loader_next");
    if (batch.count == 0) continue;
    kiln_tensor_t *loss = NULL;
    if (bench_step(m, &batch, &loss) != KILN_OK) return fail("the step");
    kiln_tensor_release(loss);
    if (++done == warm) {
      if (kiln_queue_finish(kiln_device_current_queue(device)) != KILN_OK) return fail("kiln_queue_finish");
      start = now_ms();
    }
  }
  if (kiln_queue_finish(kiln_device_current_queue(device)) != KILN_OK) return fail("kiln_queue_finish");
  *out_ms = (now_ms() - start) / steps;
  kiln_nn_loader_free(loader);
  return 0;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *selector = NULL;
  size_t batch_size = 100, hidden = 1000;
  int steps = 200, repeats = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      steps = 10;
      repeats = 1;
    } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      selector = argv[++i];
    } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch_size = strtoul(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) {
      hidden = strtoul(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = atoi(argv[++i]);
    } else {
      printf("usage: kiln-nn-loader-bench [--quick] [--device SELECTOR] [--batch B] [--hidden H] [--steps N] "
             "[--repeats R]\n"
             "Times a training-shaped step (MLP 784-H-10 forward and loss) fed by kiln_nn_loader_next,\n"
             "with the next batch prefetched and without; runs alternate, the median is shown.\n");
      return strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  if (batch_size == 0 || hidden == 0 || steps < 1 || repeats < 1) {
    fprintf(stderr, "kiln-nn-loader-bench: batch, hidden, steps and repeats must be positive\n");
    return 2;
  }
  kiln_device_t *device = NULL;
  if ((selector ? kiln_device_find(selector, &device) : kiln_device_default(&device)) != KILN_OK)
    return fail("choosing the device");

  kiln_nn_dataset_t *ds = NULL;
  const char *source = "Fashion-MNIST train";
  if (kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TRAIN, &ds) != KILN_OK) {
    /* Without the package: random images of the same shape, said so. */
    fprintf(stderr, "kiln-nn-loader-bench: %s\nusing 6000 random 28x28 images instead\n", kiln_last_error());
    source = "random 28x28 images";
    size_t n = 6000;
    uint8_t *pixels = malloc(n * 784), *labels = malloc(n);
    if (!pixels || !labels) return 1;
    for (size_t i = 0; i < n * 784; i++) pixels[i] = (uint8_t)((i * 2654435761u) >> 24);
    for (size_t i = 0; i < n; i++) labels[i] = (uint8_t)(i % 10);
    kiln_status_t s = kiln_nn_dataset_create(n, 28, 28, 10, pixels, labels, &ds);
    free(pixels);
    free(labels);
    if (s != KILN_OK) return fail("kiln_nn_dataset_create");
  }
  bench_model_t m = {0};
  int64_t s1[2] = {784, (int64_t)hidden}, s2[2] = {(int64_t)hidden, 10};
  if (kiln_tensor_normal(device, 2, s1, 1, 0.0f, 0.01f, &m.w1) != KILN_OK ||
      kiln_tensor_normal(device, 2, s2, 2, 0.0f, 0.01f, &m.w2) != KILN_OK)
    return fail("the weights");

  double *on = calloc((size_t)repeats, sizeof *on), *off = calloc((size_t)repeats, sizeof *off);
  if (!on || !off) return 1;
  for (int r = 0; r < repeats; r++) {
    if (bench_run(ds, device, &m, batch_size, false, steps, &off[r]) ||
        bench_run(ds, device, &m, batch_size, true, steps, &on[r]))
      return 1;
  }
  qsort(on, (size_t)repeats, sizeof *on, compare_double);
  qsort(off, (size_t)repeats, sizeof *off, compare_double);
  double mon = on[repeats / 2], moff = off[repeats / 2];
  printf("device %s, %s, batch %zu, MLP 784-%zu-10 forward + loss, %d steps x %d runs (median)\n",
         kiln_device_name(device), source, batch_size, hidden, steps, repeats);
  printf("%-12s %10s %12s\n", "prefetch", "ms/step", "images/s");
  printf("%-12s %10.3f %12.0f\n", "off", moff, batch_size / moff * 1e3);
  printf("%-12s %10.3f %12.0f\n", "on", mon, batch_size / mon * 1e3);
  printf("prefetch saves %.1f%% of the step time\n", 100.0 * (moff - mon) / moff);
  free(on);
  free(off);
  kiln_tensor_release(m.w1);
  kiln_tensor_release(m.w2);
  kiln_nn_dataset_free(ds);
  kiln_deinitialize();
  return 0;
}
