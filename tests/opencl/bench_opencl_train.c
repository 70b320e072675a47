/* tests/opencl/bench_opencl_train.c: times the OpenCL backend's training kinds on one device (not a test: the figures in backends/opencl/README.md). */
/*
 * Usage: bench_opencl_train [conv|lenet|updates|providers|all] [rounds]
 * on the default OpenCL device of KILN_DEVICE (e.g. KILN_DEVICE=opencl:0),
 * printing the median of `rounds` runs (default 7) of each operation, each
 * timed on the host from the enqueue to the end of a queue finish.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

#define CHECK(call)                                                                           \
  do {                                                                                        \
    kiln_status_t s_ = (call);                                                                \
    if (s_ != KILN_OK) {                                                                      \
      fprintf(stderr, "%s failed: %s: %s\n", #call, kiln_status_name(s_), kiln_last_error()); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

static double clock_ms(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef void (*op_fn)(void *arg);

static kiln_device_t *device;
static int rounds = 7;
static double last_min, last_cpu;

/* The median time of fn in ms, after one warm-up run (kernel builds); the
 * fastest run in last_min, and the median CPU time of the process (every
 * thread: the driver's workers do the work on a CPU device) in last_cpu,
 * which other processes sharing the cores disturb much less than the clock. */
static double time_op(op_fn fn, void *arg) {
  kiln_queue_t *queue = kiln_device_current_queue(device);
  fn(arg);
  CHECK(kiln_queue_finish(queue));
  double t[64], cpu[64];
  const int n = rounds < 64 ? rounds : 64;
  for (int i = 0; i < n; i++) {
    const double t0 = now_ms(), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
    fn(arg);
    CHECK(kiln_queue_finish(queue));
    t[i] = now_ms() - t0;
    cpu[i] = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
  }
  qsort(t, (size_t)n, sizeof t[0], cmp_double);
  qsort(cpu, (size_t)n, sizeof cpu[0], cmp_double);
  last_min = t[0];
  last_cpu = cpu[n / 2];
  return t[n / 2];
}

/* ---- convolutions ---------------------------------------------------------------------- */

typedef struct conv_t {
  int64_t x[4], w[4], y[4];
  kiln_conv2d_params_t params;
  kiln_tensor_t *tx, *tw, *tdy;
} conv_t;

static void conv_forward(void *arg) {
  conv_t *c = arg;
  kiln_tensor_t *out = NULL;
  CHECK(kiln_tensor_conv2d(c->tx, c->tw, NULL, &c->params, &out));
  kiln_tensor_release(out);
}
static void conv_input(void *arg) {
  conv_t *c = arg;
  kiln_tensor_t *out = NULL;
  CHECK(kiln_tensor_conv2d_backward_input(c->tdy, c->tw, c->x, &c->params, &out));
  kiln_tensor_release(out);
}
static void conv_weight(void *arg) {
  conv_t *c = arg;
  kiln_tensor_t *out = NULL;
  CHECK(kiln_tensor_conv2d_backward_weight(c->tx, c->tdy, c->w, &c->params, &out));
  kiln_tensor_release(out);
}

static void bench_conv(const char *name, int64_t n, int64_t cin, int64_t h, int64_t w, int64_t k, int64_t r,
                       int32_t pad) {
  conv_t c = {.x = {n, cin, h, w}, .w = {k, cin, r, r}};
  c.params = kiln_conv2d_params_default();
  c.params.padding[0] = c.params.padding[1] = pad;
  const int64_t p = h + 2 * pad - r + 1, q = w + 2 * pad - r + 1;
  c.y[0] = n, c.y[1] = k, c.y[2] = p, c.y[3] = q;
  CHECK(kiln_tensor_uniform(device, 4, c.x, 1, -1, 1, &c.tx));
  CHECK(kiln_tensor_uniform(device, 4, c.w, 2, -1, 1, &c.tw));
  CHECK(kiln_tensor_uniform(device, 4, c.y, 3, -1, 1, &c.tdy));
  const double gflop = 2.0 * (double)(n * k * p * q) * (double)(cin * r * r) / 1e9;
  double t[3], m[3], cpu[3];
  const op_fn fns[3] = {conv_forward, conv_input, conv_weight};
  for (int i = 0; i < 3; i++) {
    t[i] = time_op(fns[i], &c);
    m[i] = last_min;
    cpu[i] = last_cpu;
  }
  printf("%-8s x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] pad %d: %.2f GFLOP each\n", name, (long long)n,
         (long long)cin, (long long)h, (long long)w, (long long)k, (long long)cin, (long long)r, (long long)r, pad,
         gflop);
  const char *names[3] = {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"};
  for (int i = 0; i < 3; i++)
    printf("  %-22s %9.2f ms (fastest %9.2f, CPU %9.2f)  %6.1f GFLOP/s\n", names[i], t[i], m[i], cpu[i],
           gflop / t[i] * 1e3);
  kiln_tensor_release(c.tx);
  kiln_tensor_release(c.tw);
  kiln_tensor_release(c.tdy);
}

/* ---- updates ----------------------------------------------------------------------------- */

typedef struct upd_t {
  kiln_tensor_t *p, *g, *b, *m, *v;
} upd_t;

static void op_add(void *arg) {
  upd_t *u = arg;
  kiln_tensor_t *out = NULL;
  CHECK(kiln_tensor_binary(KILN_BINARY_ADD, u->p, u->g, &out));
  kiln_tensor_release(out);
}
static void op_accumulate(void *arg) {
  upd_t *u = arg;
  CHECK(kiln_tensor_accumulate(u->p, 1e-9, u->g));
}
static void op_sgd(void *arg) {
  upd_t *u = arg;
  const kiln_sgd_params_t sp = {1e-9, 0.0, 0.0, 0.0, false};
  CHECK(kiln_tensor_sgd_update(u->p, u->g, NULL, &sp));
}
static void op_sgd_momentum(void *arg) {
  upd_t *u = arg;
  const kiln_sgd_params_t sp = {1e-9, 0.9, 0.0, 1e-4, true};
  CHECK(kiln_tensor_sgd_update(u->p, u->g, u->b, &sp));
}
static void op_adam(void *arg) {
  upd_t *u = arg;
  const kiln_adam_params_t ap = {1e-9, 0.9, 0.999, 1e-8, 0.0};
  CHECK(kiln_tensor_adam_update(u->p, u->g, u->m, u->v, 3, &ap));
}

static void bench_updates(int64_t n) {
  upd_t u;
  CHECK(kiln_tensor_uniform(device, 1, &n, 1, -1, 1, &u.p));
  CHECK(kiln_tensor_uniform(device, 1, &n, 2, -1, 1, &u.g));
  CHECK(kiln_tensor_zeros(device, KILN_F32, 1, &n, &u.b));
  CHECK(kiln_tensor_zeros(device, KILN_F32, 1, &n, &u.m));
  CHECK(kiln_tensor_zeros(device, KILN_F32, 1, &n, &u.v));
  const double mb = (double)n * 4 / 1e6;
  struct {
    const char *name;
    op_fn fn;
    int floats; /* moved per element: reads + writes */
  } ops[] = {
      {"add (a + b, new tensor)", op_add, 3},
      {"accumulate", op_accumulate, 3},
      {"sgd_update", op_sgd, 3},
      {"sgd_update momentum+nesterov", op_sgd_momentum, 5},
      {"adam_update", op_adam, 7},
  };
  printf("updates of %lld floats (%.1f MB per tensor)\n", (long long)n, mb);
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    const double t = time_op(ops[i].fn, &u);
    printf("  %-30s %9.3f ms (fastest %9.3f, CPU %9.3f)  %6.2f GB/s\n", ops[i].name, t, last_min, last_cpu,
           mb * ops[i].floats / t);
  }
  kiln_tensor_release(u.p);
  kiln_tensor_release(u.g);
  kiln_tensor_release(u.b);
  kiln_tensor_release(u.m);
  kiln_tensor_release(u.v);
}

/* accumulate through each provider the device lists, the runs interleaved
 * (one of each in turn) so that both meet the same load from other
 * processes; median and fastest of each. */
static void bench_accumulate_providers(int64_t n) {
  const char *listed = kiln_device_providers(device, "accumulate");
  char providers[128];
  snprintf(providers, sizeof providers, "%s", listed ? listed : "native");
  const char *names[8];
  int count = 0;
  for (char *save = NULL, *p = strtok_r(providers, ",", &save); p && count < 8; p = strtok_r(NULL, ",", &save))
    names[count++] = p;
  upd_t u;
  CHECK(kiln_tensor_uniform(device, 1, &n, 1, -1, 1, &u.p));
  CHECK(kiln_tensor_uniform(device, 1, &n, 2, -1, 1, &u.g));
  kiln_queue_t *queue = kiln_device_current_queue(device);
  const int runs = rounds < 64 ? rounds : 64;
  double t[8][64], cpu[8][64];
  for (int i = -1; i < runs; i++)
    for (int k = 0; k < count; k++) {
      char overrides[64];
      snprintf(overrides, sizeof overrides, "accumulate=%s", names[k]);
      CHECK(kiln_set_providers(overrides));
      const double t0 = now_ms(), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
      op_accumulate(&u);
      CHECK(kiln_queue_finish(queue));
      if (i >= 0) { /* i == -1: warm-up */
        t[k][i] = now_ms() - t0;
        cpu[k][i] = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
      }
    }
  CHECK(kiln_set_providers(""));
  printf("accumulate of %lld floats, providers interleaved:", (long long)n);
  for (int k = 0; k < count; k++) {
    qsort(t[k], (size_t)runs, sizeof t[k][0], cmp_double);
    qsort(cpu[k], (size_t)runs, sizeof cpu[k][0], cmp_double);
    printf("  %s %.3f ms (fastest %.3f, CPU %.3f)", names[k], t[k][runs / 2], t[k][0], cpu[k][runs / 2]);
  }
  printf("\n");
  kiln_tensor_release(u.p);
  kiln_tensor_release(u.g);
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  if (argc > 2) rounds = atoi(argv[2]) > 0 ? atoi(argv[2]) : 7;
  CHECK(kiln_ensure_initialized());
  CHECK(kiln_device_default(&device));
  printf("device %s (%s), median of %d\n", kiln_device_selector(device), kiln_device_name(device), rounds);
  const bool all = !strcmp(what, "all");
  if (all || !strcmp(what, "conv")) bench_conv("resnet", 32, 64, 56, 56, 64, 3, 1);
  if (all || !strcmp(what, "lenet")) {
    bench_conv("lenet1", 100, 1, 28, 28, 6, 5, 2);
    bench_conv("lenet2", 100, 6, 14, 14, 16, 5, 0);
  }
  if (all || !strcmp(what, "providers")) {
    bench_accumulate_providers(61706);
    bench_accumulate_providers((int64_t)1 << 22);
    bench_accumulate_providers((int64_t)1 << 24);
  }
  if (all || !strcmp(what, "updates")) {
    bench_updates(61706); /* LeNet-5's parameters */
    bench_updates((int64_t)1 << 22);
    bench_updates((int64_t)1 << 24);
  }
  kiln_device_release(device);
  return 0;
}
