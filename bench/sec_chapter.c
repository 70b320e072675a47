/* bench/sec_chapter.c: section 4, the GPU chapter's exercises 1, 3 and 4 on every device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "output.h"

/* ---- exercise 1: large and small matmul, speed-up over the CPU -------------------------- */

static void bench_exercise1(const bench_options_t *opts, const bench_device_t *devs, size_t ndev) {
  const int S = BENCH_SECTION_CHAPTER;
  const int sizes[2] = {opts->quick ? 256 : 1024, 100};
  size_t ref = ndev;
  for (size_t i = 0; i < ndev; i++)
    if (!strcmp(devs[i].info.backend, "cpu")) {
      ref = i;
      break;
    }
  for (int si = 0; si < 2; si++) {
    int n = sizes[si];
    char params[32];
    snprintf(params, sizeof params, "%d^3", n);
    double cpu_value = NAN;
    /* The CPU reference first, then every other device. */
    for (size_t k = 0; k <= ndev; k++) {
      size_t di = k == 0 ? ref : k - 1;
      if (di >= ndev || (k > 0 && di == ref)) continue;
      const bench_device_t *d = &devs[di];
      if (d->simulator) continue;
      bench_stats_t rate;
      char provider[32] = "";
      if (bench_kiln_matmul(opts, d, n, &rate, provider) != 0) {
        bench_section_error(S, "exercise 1: matmul %s on %s: %s", params, d->info.selector, bench_error());
        continue;
      }
      bench_row_t row = bench_row_make(S, si == 0 ? "ex. 1: large matmul" : "ex. 1: small matmul", d->info.selector,
                                       provider, params, "GFLOPS", true);
      row.st = rate;
      if (di == ref) cpu_value = rate.median;
      else if (ref < ndev) bench_row_compare(&row, devs[ref].info.selector, cpu_value);
      bench_add(&row);
    }
  }
}

/* ---- exercise 3: 1000 matmuls, logging the Frobenius norm -------------------------------- */

typedef struct bench_normlog_t {
  kiln_device_t *device;
  kiln_tensor_t *a, *b;
  kiln_buffer_t *log;
  float *host_log;
  int steps;
  bool on_device;
  char provider[32]; /* the matmul's */
} bench_normlog_t;

static int bench_normlog_run(void *ctx, long iters) {
  bench_normlog_t *g = ctx;
  kiln_queue_t *queue = kiln_device_current_queue(g->device);
  for (long it = 0; it < iters; it++) {
    for (int i = 0; i < g->steps; i++) {
      kiln_tensor_t *c = NULL, *norm = NULL;
      kiln_status_t st = kiln_tensor_matmul(g->a, g->b, false, false, &c);
      if (st == KILN_OK) snprintf(g->provider, sizeof g->provider, "%s", kiln_last_provider());
      if (st == KILN_OK) st = kiln_tensor_norm(c, &norm);
      if (st == KILN_OK) {
        if (g->on_device) {
          /* The log stays on the device: one 4-byte device copy per step. */
          st = kiln_buffer_copy(queue, kiln_tensor_buffer(norm), kiln_tensor_offset_bytes(norm), g->log,
                                (size_t)i * sizeof(float), sizeof(float), 0, NULL, NULL);
        } else {
          double v = 0;
          st = kiln_tensor_item(norm, &v);
          g->host_log[i] = (float)v;
        }
      }
      kiln_tensor_release(c);
      kiln_tensor_release(norm);
      if (st != KILN_OK) return bench_kiln_error("exercise 3 step", st);
    }
    if (g->on_device) {
      kiln_status_t st = kiln_buffer_read(queue, g->log, 0, g->host_log, (size_t)g->steps * sizeof(float), true, 0,
                                          NULL, NULL);
      if (st != KILN_OK) return bench_kiln_error("kiln_buffer_read (the norm log)", st);
    }
  }
  return 0;
}

static void bench_exercise3(const bench_options_t *opts, const bench_device_t *devs, size_t ndev) {
  const int S = BENCH_SECTION_CHAPTER;
  int steps = opts->quick ? 200 : 1000;
  char params[48];
  snprintf(params, sizeof params, "%d x 100^3", steps);
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (d->simulator) continue;
    bench_normlog_t g = {d->device, NULL, NULL, NULL, calloc((size_t)steps, sizeof(float)), steps, false, ""};
    float *first_log = calloc((size_t)steps, sizeof(float));
    kiln_status_t st = bench_uniform(d->device, 100, 100, 11, &g.a);
    if (st == KILN_OK) st = bench_uniform(d->device, 100, 100, 12, &g.b);
    if (st == KILN_OK) st = kiln_buffer_create(d->device, (size_t)steps * sizeof(float), &g.log);
    if (st != KILN_OK || !g.host_log || !first_log) {
      bench_section_error(S, "exercise 3 on %s: %s", d->info.selector,
                          st != KILN_OK ? kiln_last_error() : "out of host memory");
    } else {
      double value[2] = {NAN, NAN};
      for (int v = 0; v < 2; v++) {
        g.on_device = v == 1;
        bench_stats_t sec;
        if (bench_measure_n(bench_normlog_run, &g, 1, opts->reps, 0, &sec) != 0) {
          bench_section_error(S, "exercise 3 on %s: %s", d->info.selector, bench_error());
          continue;
        }
        bench_row_t row = bench_row_make(S, v ? "ex. 3: norm log kept on device, read once" : "ex. 3: norm read each step",
                                         d->info.selector, g.provider, params, "ms", false);
        row.st = bench_stats_scale(&sec, 1e3);
        value[v] = row.st.median;
        if (v == 0) {
          memcpy(first_log, g.host_log, (size_t)steps * sizeof(float));
        } else {
          bench_row_compare(&row, "read each step", value[0]);
          int differ = 0;
          for (int i = 0; i < steps; i++) differ += first_log[i] != g.host_log[i];
          if (differ) bench_row_note(&row, "%d of %d logged norms differ between the two ways", differ, steps);
          else bench_row_note(&row, "both logs identical (%d norms, last %.6g)", steps, (double)g.host_log[steps - 1]);
        }
        bench_add(&row);
      }
    }
    kiln_tensor_release(g.a);
    kiln_tensor_release(g.b);
    kiln_buffer_release(g.log);
    free(g.host_log);
    free(first_log);
  }
}

/* ---- exercise 4: two matmuls on two devices at once vs in sequence on one ----------------- */

typedef struct bench_pair_t {
  kiln_device_t *dev[2];
  kiln_tensor_t *a[2], *b[2];
  bool together;
} bench_pair_t;

static int bench_pair_run(void *ctx, long iters) {
  bench_pair_t *p = ctx;
  for (long it = 0; it < iters; it++) {
    kiln_tensor_t *c[2] = {NULL, NULL};
    kiln_status_t st = KILN_OK;
    /* Together: enqueue one on each device, then finish both. In sequence:
     * both on the first device. */
    for (int k = 0; k < 2 && st == KILN_OK; k++) {
      int d = p->together ? k : 0;
      st = kiln_tensor_matmul(p->a[d], p->b[d], false, false, &c[k]);
    }
    if (st == KILN_OK) st = bench_finish(p->dev[0]);
    if (st == KILN_OK && p->together) st = bench_finish(p->dev[1]);
    kiln_tensor_release(c[0]);
    kiln_tensor_release(c[1]);
    if (st != KILN_OK) return bench_kiln_error("exercise 4 matmuls", st);
  }
  return 0;
}

static void bench_pair_measure(const bench_options_t *opts, const bench_device_t *d0, const bench_device_t *d1,
                               const char *provider) {
  const int S = BENCH_SECTION_CHAPTER;
  int n = opts->quick ? 512 : 2048;
  char params[48], devices[96];
  snprintf(params, sizeof params, "2 x %d^3", n);
  snprintf(devices, sizeof devices, "%s+%s", d0->info.selector, d1->info.selector);
  bench_pair_t p = {{d0->device, d1->device}, {NULL, NULL}, {NULL, NULL}, false};
  kiln_status_t st = KILN_OK;
  for (int k = 0; k < 2 && st == KILN_OK; k++) {
    st = bench_uniform(p.dev[k], n, n, 21 + (uint64_t)k, &p.a[k]);
    if (st == KILN_OK) st = bench_uniform(p.dev[k], n, n, 31 + (uint64_t)k, &p.b[k]);
  }
  if (provider) {
    char spec[64];
    snprintf(spec, sizeof spec, "matmul=%.31s", provider);
    kiln_set_providers(spec);
  }
  double seq = NAN;
  for (int v = 0; v < 2 && st == KILN_OK; v++) {
    p.together = v == 1;
    bench_stats_t sec;
    if (bench_measure_n(bench_pair_run, &p, 1, opts->reps, 0, &sec) != 0) {
      bench_section_error(S, "exercise 4 on %s: %s", devices, bench_error());
      break;
    }
    bench_row_t row = bench_row_make(S, v ? "ex. 4: two matmuls, two devices at once" : "ex. 4: two matmuls in sequence, one device",
                                     v ? devices : d0->info.selector, kiln_last_provider(), params, "ms", false);
    row.st = bench_stats_scale(&sec, 1e3);
    if (v == 0) seq = row.st.median;
    else {
      bench_row_compare(&row, "in sequence", seq);
      bench_row_note(&row, "ratio = scaling (2.0 is linear)");
    }
    bench_add(&row);
  }
  if (st != KILN_OK) bench_section_error(S, "exercise 4 tensors on %s failed (%s): %s", devices, kiln_status_name(st), kiln_last_error());
  bench_reset_providers();
  for (int k = 0; k < 2; k++) {
    kiln_tensor_release(p.a[k]);
    kiln_tensor_release(p.b[k]);
  }
}

/* The pair with the most to gain: two GPUs, else two CPU devices. */
static bool bench_pick_pair(const bench_device_t *devs, size_t ndev, const bench_device_t **d0, const bench_device_t **d1) {
  const kiln_device_type_t order[2] = {KILN_DEVICE_GPU, KILN_DEVICE_CPU};
  for (int o = 0; o < 2; o++) {
    const bench_device_t *found[2];
    int nf = 0;
    for (size_t i = 0; i < ndev && nf < 2; i++) {
      if (devs[i].info.type != order[o] || devs[i].simulator) continue;
      if (o == 1 && strcmp(devs[i].info.backend, "cpu") != 0) continue;
      found[nf++] = &devs[i];
    }
    if (nf == 2) {
      *d0 = found[0];
      *d1 = found[1];
      return true;
    }
  }
  return false;
}

static void bench_pair_all_providers(const bench_options_t *opts, const bench_device_t *d0, const bench_device_t *d1) {
  char providers[8][32];
  int np = bench_providers(d0, "matmul", providers, 8);
  for (int i = 0; i < np; i++) bench_pair_measure(opts, d0, d1, providers[i]);
}

int bench_child_two_devices(const bench_options_t *opts) {
  const bench_device_t *devs, *d0, *d1;
  size_t ndev = bench_devices(&devs);
  if (!bench_pick_pair(devs, ndev, &d0, &d1)) {
    fprintf(stderr, "kiln-bench: the child found fewer than two CPU devices (KILN_CPU_DEVICES=%s)\n",
            getenv("KILN_CPU_DEVICES") ? getenv("KILN_CPU_DEVICES") : "unset");
    return 1;
  }
  bench_pair_all_providers(opts, d0, d1);
  size_t nrows;
  const bench_row_t *rows = bench_rows_all(&nrows);
  char line[2048];
  for (size_t i = 0; i < nrows; i++) {
    bench_row_serialize(&rows[i], line, sizeof line);
    printf("%s\n", line);
  }
  return bench_had_error() ? 1 : 0;
}

static void bench_exercise4(const bench_options_t *opts, const bench_device_t *devs, size_t ndev) {
  const int S = BENCH_SECTION_CHAPTER;
  const bench_device_t *d0, *d1;
  if (bench_pick_pair(devs, ndev, &d0, &d1)) {
    bench_pair_all_providers(opts, d0, d1);
    return;
  }
  bench_section_note(S, "exercise 4 needs two devices of a kind; this machine shows one CPU device, so kiln-bench "
                        "re-ran itself with KILN_CPU_DEVICES=2 (each device then has half the cores). Run with "
                        "KILN_CPU_DEVICES=2 to measure it in one process.");
  char reps[16];
  snprintf(reps, sizeof reps, "%d", opts->reps);
  const char *env[] = {"KILN_CPU_DEVICES=2", "KILN_BACKEND=cpu", "KILN_DEVICE", NULL};
  const char *args[] = {"--child", "two-devices", "--reps", reps, opts->quick ? "--quick" : NULL, NULL};
  char *text = NULL;
  int rc = bench_run_self(opts, env, args, &text, NULL);
  int got = 0;
  char *rest = text, *line;
  while (rest && (line = strsep(&rest, "\n")) != NULL) {
    bench_row_t row;
    if (bench_row_parse(line, &row)) {
      bench_add(&row);
      got++;
    }
  }
  free(text);
  if (rc != 0 || got == 0)
    bench_section_error(S, "exercise 4: the child with KILN_CPU_DEVICES=2 exited with status %d and gave %d rows%s%s",
                        rc, got, rc < 0 ? ": " : "", rc < 0 ? bench_error() : "");
}

void bench_section_chapter(const bench_options_t *opts) {
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  bench_exercise1(opts, devs, ndev);
  bench_exercise3(opts, devs, ndev);
  bench_exercise4(opts, devs, ndev);
  bench_section_note(BENCH_SECTION_CHAPTER,
                     "Exercise 1: GFLOPS under the default policy, ratio = speed-up over the CPU device. Exercise 3: "
                     "total time of all steps; each step is a matmul and its Frobenius norm, either read to the host "
                     "at once or copied into a log buffer on the device that is read once at the end. Exercise 4: "
                     "two matmuls on one device one after the other, against one on each of two devices enqueued "
                     "together and then both finished; ratio = scaling.");
}
