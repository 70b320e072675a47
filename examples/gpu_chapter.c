/* examples/gpu_chapter.c: kiln-demo, the "GPUs" section of Dive into Deep Learning (devices, copies, a layer, exercise 3) written in C against kiln. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kiln/kiln.h>

#define DEMO_STEPS 1000
#define DEMO_N 100

/* Every kiln call goes through here: on failure the demo says which call
 * failed and kiln's message, then stops (kiln itself never exits). */
#define DEMO_TRY(call)                                                                      \
  do {                                                                                      \
    kiln_status_t demo_status_ = (call);                                                    \
    if (demo_status_ != KILN_OK) {                                                          \
      fprintf(stderr, "kiln-demo: %s failed (%s): %s\n", #call, kiln_status_name(demo_status_), \
              kiln_last_error());                                                           \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static void demo_heading(const char *title) { printf("\n## %s\n\n", title); }

static void demo_usage(FILE *out) {
  fputs("usage: kiln-demo [--help]\n"
        "\n"
        "The \"GPUs\" section of Dive into Deep Learning (d2l.ai, chapter \"Builders' Guide\"),\n"
        "written in C against kiln: listing devices, try_gpu(), tensors on a device, copies\n"
        "between devices, a dense layer on the GPU, and exercise 3 (1000 small matmuls,\n"
        "logging a norm at every step or keeping the log on the device).\n"
        "\n"
        "It runs on the default device. The environment chooses it: KILN_DEVICE=opencl:0\n"
        "kiln-demo, KILN_CPU_DEVICES=2 kiln-demo (a second device to copy to), KILN_POLICY\n"
        "and KILN_PROVIDER (which library runs the matmul); see docs/environment.md.\n",
        out);
}

/* The first operation on an OpenCL device compiles kiln's kernels (seconds
 * on PoCL), which kiln only logs. The demo listens at info level for the
 * line that starts a build, says once per device why it waits, and passes
 * every other line on at the level the user asked for (KILN_LOG). */
static kiln_log_level_t demo_user_level = KILN_LOG_OFF;
static char demo_announced[16][160];
static size_t demo_announced_count;

static void demo_log(kiln_log_level_t level, const char *message, void *user) {
  static const char *const names[] = {"off", "error", "warn", "info", "debug"};
  const char *mark = strstr(message, ": building OpenCL kernels: ");
  if (mark && (size_t)(mark - message) < sizeof demo_announced[0]) {
    int len = (int)(mark - message);
    bool seen = false;
    for (size_t i = 0; i < demo_announced_count && !seen; i++)
      seen = (int)strlen(demo_announced[i]) == len && !strncmp(demo_announced[i], message, (size_t)len);
    if (!seen) {
      if (demo_announced_count < sizeof demo_announced / sizeof demo_announced[0])
        snprintf(demo_announced[demo_announced_count++], sizeof demo_announced[0], "%.*s", len, message);
      fflush(stdout);
      fprintf(stderr, "kiln-demo: building OpenCL kernels for %.*s (first run; cached afterwards)\n", len, message);
    }
  }
  if (level <= demo_user_level && (int)level >= 0 && (int)level <= 4)
    fprintf(stderr, "kiln: %s: %s\n", names[level], message);
}

static double demo_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Prints a tensor of up to two dimensions the way the chapter's frameworks do:
 * tensor([[...]], device=cuda:0). Reading it is where the host waits. */
static void demo_print(const char *label, const kiln_tensor_t *t) {
  int64_t numel = kiln_tensor_numel(t);
  float *host = malloc((size_t)(numel ? numel : 1) * sizeof *host);
  if (!host) {
    fprintf(stderr, "kiln-demo: out of host memory printing %s\n", label);
    exit(1);
  }
  DEMO_TRY(kiln_tensor_read(t, host, (size_t)numel * sizeof *host));
  int ndim = kiln_tensor_ndim(t);
  const int64_t *shape = kiln_tensor_shape(t);
  int64_t rows = ndim == 2 ? shape[0] : 1, cols = ndim == 2 ? shape[1] : numel;
  printf("%s = tensor(", label);
  if (ndim == 2) putchar('[');
  for (int64_t r = 0; r < rows; r++) {
    if (r) printf(",\n%*s", (int)strlen(label) + 11, "");
    putchar('[');
    for (int64_t c = 0; c < cols; c++) printf("%s%.4f", c ? ", " : "", host[r * cols + c]);
    putchar(']');
  }
  if (ndim == 2) putchar(']');
  printf(", device=%s)\n", kiln_device_selector(kiln_tensor_device(t)));
  free(host);
}

/* The chapter's "list the devices" and "how many GPUs" in one table. */
static size_t demo_list_devices(void) {
  size_t count = 0, gpus = 0;
  DEMO_TRY(kiln_device_count(&count));
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *device = NULL;
    kiln_device_info_t info;
    DEMO_TRY(kiln_device_get(i, &device));
    DEMO_TRY(kiln_device_info(device, &info));
    if (info.type == KILN_DEVICE_GPU) gpus++;
    printf("%c %-10s %-4s %s\n", info.is_default ? '*' : ' ', info.selector, kiln_device_type_name(info.type),
           info.name);
  }
  printf("%zu device%s visible, %zu of them GPU%s (* the default device)\n", count, count == 1 ? "" : "s", gpus,
         gpus == 1 ? "" : "s");
  return gpus;
}

/* How many devices the backends found that KILN_DEVICE hides. */
static size_t demo_hidden_devices(void) {
  size_t backends = 0, found = 0, visible = 0;
  DEMO_TRY(kiln_backend_count(&backends));
  for (size_t i = 0; i < backends; i++) {
    kiln_backend_info_t b;
    DEMO_TRY(kiln_backend_info(i, &b));
    found += b.device_count;
  }
  DEMO_TRY(kiln_device_count(&visible));
  return found > visible ? found - visible : 0;
}

/* Y's device: the second GPU where there is one, else the first visible
 * device that is not X's (a second CPU device with KILN_CPU_DEVICES=2), else
 * X's own device. */
static kiln_device_t *demo_second_device(size_t gpus, kiln_device_t *first) {
  if (gpus >= 2) return kiln_try_gpu(1);
  size_t count = 0;
  DEMO_TRY(kiln_device_count(&count));
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *device = NULL;
    DEMO_TRY(kiln_device_get(i, &device));
    if (device != first) return device;
  }
  return first;
}

/* nn.Linear(3, 1) followed by a ReLU: weights and bias live on `device`, and
 * so does every intermediate result. */
static void demo_dense_layer(kiln_device_t *device, kiln_tensor_t *batch) {
  int64_t w_shape[2] = {3, 1}, b_shape[1] = {1};
  kiln_tensor_t *weight = NULL, *bias = NULL, *product = NULL, *pre = NULL, *out = NULL;
  DEMO_TRY(kiln_tensor_normal(device, 2, w_shape, 42, 0.0f, 0.5f, &weight));
  DEMO_TRY(kiln_tensor_full(device, KILN_F32, 1, b_shape, 1.0, &bias));
  DEMO_TRY(kiln_tensor_matmul(batch, weight, false, false, &product));
  /* The provider of the calling thread's last operation: read it before the
   * add and the relu replace it. */
  char provider[64];
  snprintf(provider, sizeof provider, "%s", kiln_last_provider());
  DEMO_TRY(kiln_tensor_add(product, bias, &pre));
  DEMO_TRY(kiln_tensor_relu(pre, &out));
  printf("matmul ran with provider '%s' (policy %s; KILN_POLICY and KILN_PROVIDER choose)\n", provider,
         kiln_policy_name(kiln_policy()));
  demo_print("X @ W + b", pre);
  demo_print("net(X) = relu(X @ W + b)", out);
  printf("net[0].weight lives on %s; net(X) on %s\n", kiln_device_name(kiln_tensor_device(weight)),
         kiln_device_name(kiln_tensor_device(out)));
  kiln_tensor_release(out);
  kiln_tensor_release(pre);
  kiln_tensor_release(product);
  kiln_tensor_release(bias);
  kiln_tensor_release(weight);
}

/* One step of exercise 3: C = A @ B_step, then its Frobenius norm, a 0-d
 * tensor on the device. B changes every step so no two products are alike. */
static kiln_tensor_t *demo_step_norm(const kiln_tensor_t *a, const kiln_tensor_t *b, int step) {
  kiln_tensor_t *scaled = NULL, *c = NULL, *norm = NULL;
  DEMO_TRY(kiln_tensor_mul_scalar(b, 1.0 + step * 1e-3, &scaled));
  DEMO_TRY(kiln_tensor_matmul(a, scaled, false, false, &c));
  DEMO_TRY(kiln_tensor_norm(c, &norm));
  kiln_tensor_release(c);
  kiln_tensor_release(scaled);
  return norm;
}

static void demo_exercise3(kiln_device_t *device) {
  int64_t shape[2] = {DEMO_N, DEMO_N}, log_shape[1] = {DEMO_STEPS};
  kiln_tensor_t *a = NULL, *b = NULL, *log = NULL;
  DEMO_TRY(kiln_tensor_uniform(device, 2, shape, 1, -1.0f, 1.0f, &a));
  DEMO_TRY(kiln_tensor_uniform(device, 2, shape, 2, -1.0f, 1.0f, &b));
  static float host_log[DEMO_STEPS], device_log[DEMO_STEPS];

  /* Warm up: the first operations on a device may compile kernels or fill
   * the memory pool; neither belongs in the comparison. */
  for (int i = 0; i < 3; i++) {
    kiln_tensor_t *norm = demo_step_norm(a, b, i);
    double value = 0;
    DEMO_TRY(kiln_tensor_item(norm, &value));
    kiln_tensor_release(norm);
  }

  /* (a) Read each norm to the host at once: the host waits for the device
   * at every step, and the device then idles while the host catches up. */
  double t0 = demo_now();
  for (int i = 0; i < DEMO_STEPS; i++) {
    kiln_tensor_t *norm = demo_step_norm(a, b, i);
    double value = 0;
    DEMO_TRY(kiln_tensor_item(norm, &value));
    host_log[i] = (float)value;
    kiln_tensor_release(norm);
  }
  double time_a = demo_now() - t0;

  /* (b) Keep the log on the device: each 0-d norm is copied into element i
   * of a device tensor by a device-side copy on the same queue, and the
   * host reads the whole log once at the end. */
  t0 = demo_now();
  DEMO_TRY(kiln_tensor_empty(device, KILN_F32, 1, log_shape, &log));
  kiln_queue_t *queue = kiln_device_current_queue(device);
  for (int i = 0; i < DEMO_STEPS; i++) {
    kiln_tensor_t *norm = demo_step_norm(a, b, i);
    DEMO_TRY(kiln_buffer_copy(queue, kiln_tensor_buffer(norm), kiln_tensor_offset_bytes(norm),
                              kiln_tensor_buffer(log), kiln_tensor_offset_bytes(log) + (size_t)i * sizeof(float),
                              sizeof(float), 0, NULL, NULL));
    kiln_tensor_release(norm);
  }
  DEMO_TRY(kiln_tensor_read(log, device_log, sizeof device_log));
  double time_b = demo_now() - t0;

  double max_diff = 0;
  for (int i = 0; i < DEMO_STEPS; i++) {
    double d = fabs((double)host_log[i] - (double)device_log[i]);
    if (d > max_diff) max_diff = d;
  }
  printf("device: %s\n", kiln_device_name(device));
  printf("norms: first %.4f, last %.4f; largest difference between (a) and (b): %g\n", host_log[0],
         host_log[DEMO_STEPS - 1], max_diff);
  printf("(step i multiplies A by B * (1 + i/1000), so that no two products are alike: the norm grows with\n"
         " the scale, to about twice the first by the last step)\n");
  printf("(a) read each norm to the host : %8.2f ms  (%.1f us per step)\n", time_a * 1e3,
         time_a * 1e6 / DEMO_STEPS);
  printf("(b) log on the device, one read: %8.2f ms  (%.1f us per step)\n", time_b * 1e3,
         time_b * 1e6 / DEMO_STEPS);
  printf("ratio (a)/(b): %.2fx\n", time_b > 0 ? time_a / time_b : 0.0);
  kiln_tensor_release(log);
  kiln_tensor_release(b);
  kiln_tensor_release(a);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      demo_usage(stdout);
      return 0;
    }
    fprintf(stderr, "kiln-demo: unknown argument '%s'\n\n", argv[i]);
    demo_usage(stderr);
    return 2;
  }
  printf("# The \"GPUs\" section of Dive into Deep Learning (d2l.ai), in C with kiln %s\n", kiln_version());
  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_OK) {
    fprintf(stderr, "kiln-demo: kiln failed to start (%s): %s\n", kiln_status_name(status), kiln_last_error());
    return 2;
  }
  demo_user_level = kiln_log_level();
  if (demo_user_level < KILN_LOG_INFO) kiln_log_set_level(KILN_LOG_INFO);
  kiln_log_set_callback(demo_log, NULL);

  demo_heading("Computing devices");
  size_t gpus = demo_list_devices();

  demo_heading("try_gpu(), try_gpu(10), try_all_gpus()");
  printf("try_gpu(0)  -> %s\n", kiln_device_name(kiln_try_gpu(0)));
  printf("try_gpu(10) -> %s\n", kiln_device_name(kiln_try_gpu(10)));
  size_t all_count = 0;
  DEMO_TRY(kiln_try_all_gpus(NULL, 0, &all_count));
  kiln_device_t **all = calloc(all_count ? all_count : 1, sizeof *all);
  if (!all) return 1;
  DEMO_TRY(kiln_try_all_gpus(all, all_count, &all_count));
  printf("try_all_gpus() -> [");
  for (size_t i = 0; i < all_count; i++) printf("%s%s", i ? ", " : "", kiln_device_name(all[i]));
  printf("]\n");
  free(all);

  demo_heading("Storage on the GPU: X = ones(2, 3) on try_gpu()");
  int64_t shape[2] = {2, 3};
  kiln_device_t *first = kiln_try_gpu(0);
  kiln_tensor_t *x = NULL, *y = NULL, *z = NULL, *sum = NULL, *z2 = NULL;
  DEMO_TRY(kiln_tensor_ones(first, KILN_F32, 2, shape, &x));
  demo_print("X", x);

  kiln_device_t *second = demo_second_device(gpus, first);
  printf("\nY = uniform random (2, 3) on the second device, %s\n", kiln_device_name(second));
  if (second == first) {
    size_t hidden = demo_hidden_devices();
    const char *selector = getenv("KILN_DEVICE");
    if (hidden && selector && selector[0])
      printf("(only one device is visible: KILN_DEVICE='%s' hides %zu other%s; widen it to see two)\n", selector,
             hidden, hidden == 1 ? "" : "s");
    else if (hidden)
      printf("(only one device is visible: the device selection hides %zu other%s)\n", hidden, hidden == 1 ? "" : "s");
    else
      printf("(only one device is visible; run with KILN_CPU_DEVICES=2 to see two)\n");
  }
  DEMO_TRY(kiln_tensor_uniform(second, 2, shape, 2024, 0.0f, 1.0f, &y));
  demo_print("Y", y);

  demo_heading("Copying: X + Y across devices");
  status = kiln_tensor_add(x, y, &sum);
  if (status == KILN_OK) {
    printf("X + Y ran: X and Y share a device here, so there is nothing to refuse\n");
    kiln_tensor_release(sum);
    sum = NULL;
  } else {
    printf("kiln_tensor_add(X, Y) -> KILN_%s:\n  %s\n", kiln_status_name(status), kiln_last_error());
    if (status != KILN_DEVICE_MISMATCH) {
      fprintf(stderr, "kiln-demo: expected KILN_DEVICE_MISMATCH\n");
      return 1;
    }
  }

  printf("\nZ = copy of X on %s\n", kiln_device_selector(second));
  DEMO_TRY(kiln_tensor_copy(x, second, &z));
  demo_print("X", x);
  demo_print("Z", z);

  printf("\nY + Z, both on %s:\n", kiln_device_selector(second));
  DEMO_TRY(kiln_tensor_add(y, z, &sum));
  demo_print("Y + Z", sum);

  printf("\nkiln_tensor_to(Z, %s) when Z already lives there:\n", kiln_device_selector(second));
  DEMO_TRY(kiln_tensor_to(z, second, &z2));
  printf("returned %p, Z is %p: %s\n", (void *)z2, (void *)z,
         z2 == z ? "the same tensor, no copy made" : "a different tensor (unexpected)");
  if (z2 != z) return 1;
  kiln_tensor_release(z2);

  demo_heading("Neural networks and GPUs: a dense layer on try_gpu()");
  demo_dense_layer(first, x);

  demo_heading("Exercise 3: 1000 matmuls of 100x100, logging the Frobenius norm");
  demo_exercise3(first);

  kiln_tensor_release(sum);
  kiln_tensor_release(z);
  kiln_tensor_release(y);
  kiln_tensor_release(x);
  kiln_deinitialize();
  printf("\ndone\n");
  return 0;
}
