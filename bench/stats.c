/* bench/stats.c: the host clock, measuring with warm-ups and repetitions, order statistics, errors, devices. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static _Thread_local char bench_error_text[1024];

const char *bench_error(void) { return bench_error_text; }

void bench_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bench_error_text, sizeof bench_error_text, fmt, ap);
  va_end(ap);
}

int bench_kiln_error(const char *what, kiln_status_t status) {
  bench_set_error("%s failed (%s): %s", what, kiln_status_name(status), kiln_last_error());
  return -1;
}

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Linear interpolation between order statistics (NumPy's default quantile). */
static double bench_quantile(const double *sorted, int n, double q) {
  double pos = q * (n - 1);
  int lo = (int)floor(pos);
  int hi = lo + 1 < n ? lo + 1 : lo;
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

void bench_stats_of(double *values, int n, bench_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (n <= 0) {
    out->median = out->min = out->max = out->q1 = out->q3 = NAN;
    return;
  }
  qsort(values, (size_t)n, sizeof *values, bench_cmp_double);
  out->min = values[0];
  out->max = values[n - 1];
  out->median = bench_quantile(values, n, 0.5);
  out->q1 = bench_quantile(values, n, 0.25);
  out->q3 = bench_quantile(values, n, 0.75);
  out->samples = n;
  out->iters = 1;
}

bench_stats_t bench_stats_scale(const bench_stats_t *st, double factor) {
  bench_stats_t r = *st;
  r.median *= factor;
  r.min *= factor;
  r.max *= factor;
  r.q1 *= factor;
  r.q3 *= factor;
  return r;
}

bench_stats_t bench_stats_rate(const bench_stats_t *seconds, double work) {
  /* The fastest time is the highest rate: the order flips. */
  bench_stats_t r = *seconds;
  r.median = work / seconds->median;
  r.min = work / seconds->max;
  r.max = work / seconds->min;
  r.q1 = work / seconds->q3;
  r.q3 = work / seconds->q1;
  return r;
}

int bench_measure_n(bench_fn fn, void *ctx, int warmup, int reps, double min_sample_s, bench_stats_t *out) {
  if (reps < 1) reps = 1;
  double one = 0;
  for (int i = 0; i < (warmup < 1 ? 1 : warmup); i++) {
    double t0 = bench_now();
    if (fn(ctx, 1) != 0) return -1;
    one = bench_now() - t0;
  }
  /* Short operations repeat inside a sample so that the clock's resolution
   * and the synchronisation at its end do not dominate; a second calibration
   * run measures them in bulk, since a single warm-up run is noisy. */
  long iters = 1;
  if (one < min_sample_s) {
    long probe = one > 0 ? (long)(min_sample_s / 10 / one) : 1000;
    if (probe < 1) probe = 1;
    if (probe > 1000000) probe = 1000000;
    double t0 = bench_now();
    if (fn(ctx, probe) != 0) return -1;
    double per = (bench_now() - t0) / (double)probe;
    iters = per > 0 ? (long)ceil(min_sample_s / per) : 1000000;
    if (iters < 1) iters = 1;
    if (iters > 10000000) iters = 10000000;
  }
  double *samples = calloc((size_t)reps, sizeof *samples);
  if (!samples) {
    bench_set_error("out of host memory for %d samples", reps);
    return -1;
  }
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now();
    if (fn(ctx, iters) != 0) {
      free(samples);
      return -1;
    }
    samples[r] = (bench_now() - t0) / (double)iters;
  }
  bench_stats_of(samples, reps, out);
  out->iters = iters;
  free(samples);
  return 0;
}

int bench_measure(const bench_options_t *opts, bench_fn fn, void *ctx, bench_stats_t *out) {
  return bench_measure_n(fn, ctx, opts->warmup, opts->reps, opts->min_sample_s, out);
}

/* ---- kiln helpers ---------------------------------------------------------- */

kiln_status_t bench_uniform(kiln_device_t *device, int64_t rows, int64_t cols, uint64_t seed, kiln_tensor_t **out) {
  int64_t shape[2] = {rows, cols};
  return kiln_tensor_uniform(device, 2, shape, seed, -1.0f, 1.0f, out);
}

kiln_status_t bench_finish(kiln_device_t *device) { return kiln_queue_finish(kiln_device_current_queue(device)); }

static kiln_policy_t bench_start_policy = KILN_POLICY_VENDOR;

void bench_reset_providers(void) {
  kiln_set_providers("");
  kiln_set_policy(bench_start_policy);
}

/* ---- devices ---------------------------------------------------------------- */

#define BENCH_MAX_DEVICES 64

static bench_device_t bench_device_list[BENCH_MAX_DEVICES];
static size_t bench_device_n;
static bool bench_device_done;

size_t bench_devices(const bench_device_t **out) {
  if (!bench_device_done) {
    bench_device_done = true;
    bench_start_policy = kiln_policy();
    size_t count = 0;
    if (kiln_device_count(&count) != KILN_OK) count = 0;
    for (size_t i = 0; i < count && bench_device_n < BENCH_MAX_DEVICES; i++) {
      bench_device_t *d = &bench_device_list[bench_device_n];
      if (kiln_device_get(i, &d->device) != KILN_OK) continue;
      if (kiln_device_info(d->device, &d->info) != KILN_OK) continue;
      d->simulator = strstr(d->info.platform, "Oclgrind") != NULL || strstr(d->info.name, "Oclgrind") != NULL;
      d->cl_occurrence = 0;
      for (size_t j = 0; j < bench_device_n; j++) {
        const kiln_device_info_t *o = &bench_device_list[j].info;
        if (!strcmp(o->backend, d->info.backend) && !strcmp(o->platform, d->info.platform) &&
            !strcmp(o->name, d->info.name))
          d->cl_occurrence++;
      }
      bench_device_n++;
    }
  }
  *out = bench_device_list;
  return bench_device_n;
}

void bench_format_bytes(double bytes, char *out, size_t size) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    u++;
  }
  if (bytes == floor(bytes)) snprintf(out, size, "%.0f %s", bytes, units[u]);
  else snprintf(out, size, "%.1f %s", bytes, units[u]);
}
