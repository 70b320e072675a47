/* bench/sec_runtime.c: sections 3, 5 and 6: per-operation overhead, transfer bandwidth, the cold and warm kernel cache. */
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

/* ---- section 3: overhead ---------------------------------------------------------------- */

typedef struct bench_tiny_t {
  kiln_device_t *device;
  kiln_tensor_t *a, *b;
  char provider[32];
} bench_tiny_t;

static int bench_tiny_enqueue(bench_tiny_t *t, long n) {
  for (long i = 0; i < n; i++) {
    kiln_tensor_t *c = NULL;
    kiln_status_t st = kiln_tensor_add(t->a, t->b, &c);
    if (st != KILN_OK) return bench_kiln_error("kiln_tensor_add (16 floats)", st);
    kiln_tensor_release(c);
  }
  snprintf(t->provider, sizeof t->provider, "%s", kiln_last_provider());
  return 0;
}

static int bench_tiny_wait_run(void *ctx, long iters) {
  bench_tiny_t *t = ctx;
  for (long i = 0; i < iters; i++) {
    if (bench_tiny_enqueue(t, 1) != 0) return -1;
    kiln_status_t st = bench_finish(t->device);
    if (st != KILN_OK) return bench_kiln_error("kiln_queue_finish", st);
  }
  return 0;
}

int bench_kiln_tiny(const bench_options_t *opts, kiln_device_t *device, long n, bench_stats_t *out_enqueue,
                    bench_stats_t *out_sustained, bench_stats_t *out_wait, char *out_provider) {
  bench_tiny_t t = {device, NULL, NULL, ""};
  int64_t shape[1] = {16};
  kiln_status_t st = kiln_tensor_uniform(device, 1, shape, 1, -1, 1, &t.a);
  if (st == KILN_OK) st = kiln_tensor_uniform(device, 1, shape, 2, -1, 1, &t.b);
  int rc = st == KILN_OK ? 0 : bench_kiln_error("kiln_tensor_uniform", st);
  double *enq = calloc((size_t)opts->reps, sizeof *enq), *sus = calloc((size_t)opts->reps, sizeof *sus);
  if (!enq || !sus) rc = -1, bench_set_error("out of host memory");
  /* Warm the pool, the ring and any lazy kernel loading. */
  if (rc == 0 && (rc = bench_tiny_enqueue(&t, 200)) == 0 && (st = bench_finish(device)) != KILN_OK)
    rc = bench_kiln_error("kiln_queue_finish", st);
  for (int r = 0; r < opts->reps && rc == 0; r++) {
    double t0 = bench_now();
    rc = bench_tiny_enqueue(&t, n);
    double t1 = bench_now();
    if (rc == 0 && (st = bench_finish(device)) != KILN_OK) rc = bench_kiln_error("kiln_queue_finish", st);
    double t2 = bench_now();
    enq[r] = (t1 - t0) / (double)n;
    sus[r] = (t2 - t0) / (double)n;
  }
  if (rc == 0) {
    bench_stats_of(enq, opts->reps, out_enqueue);
    bench_stats_of(sus, opts->reps, out_sustained);
    out_enqueue->iters = out_sustained->iters = n;
    rc = bench_measure(opts, bench_tiny_wait_run, &t, out_wait);
  }
  snprintf(out_provider, 32, "%s", t.provider);
  free(enq);
  free(sus);
  kiln_tensor_release(t.a);
  kiln_tensor_release(t.b);
  return rc;
}

/* The same tiny add with a trace recording (into a temporary file, removed
 * after): what tracing adds per op, beside the rows above, which are tracing
 * off. Target: at most 0.5 us added per op. */
static void bench_overhead_traced(const bench_options_t *opts, int S, const bench_device_t *d, long n, double enq_off,
                                  double sus_off) {
  const char *sel = d->info.selector;
  const char *tmp = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/kiln-bench-trace-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) {
    bench_section_error(S, "tiny add traced on %s: cannot create a temporary file in %s", sel, tmp ? tmp : "/tmp");
    return;
  }
  close(fd);
  kiln_status_t st = kiln_trace_start(path);
  if (st != KILN_OK) {
    bench_section_error(S, "tiny add traced on %s: kiln_trace_start: %s", sel, kiln_last_error());
    unlink(path);
    return;
  }
  bench_stats_t enq, sus, wait;
  char provider[32];
  int rc = bench_kiln_tiny(opts, d->device, n, &enq, &sus, &wait, provider);
  kiln_trace_stop();
  unlink(path);
  if (rc != 0) {
    bench_section_error(S, "tiny add traced on %s: %s", sel, bench_error());
    return;
  }
  enq = bench_stats_scale(&enq, 1e6);
  sus = bench_stats_scale(&sus, 1e6);
  char params[32];
  snprintf(params, sizeof params, "16 (x%ld)", n);
  bench_row_t row = bench_row_make(S, "add 16 floats: enqueue only, traced", sel, provider, params, "us", false);
  row.st = enq;
  bench_row_compare(&row, "tracing off", enq_off);
  bench_row_note(&row, "+%.3f us per op with a trace recording", enq.median - enq_off);
  bench_add(&row);
  row = bench_row_make(S, "add 16 floats: sustained, traced", sel, provider, params, "us", false);
  row.st = sus;
  bench_row_compare(&row, "tracing off", sus_off);
  bench_row_target_diff(&row, 0.5);
  bench_row_note(&row, "+%.3f us per op with a trace recording (op, its event, two memory samples)",
                 sus.median - sus_off);
  bench_add(&row);
}

void bench_section_overhead(const bench_options_t *opts) {
  const int S = BENCH_SECTION_OVERHEAD;
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  long n = opts->quick ? 2000 : 20000;
  const char *tasks[] = {"add16"};
  bench_torch_result_t torch;
  bench_progress("overhead: PyTorch peer (eager add of 16 floats)");
  bench_torch_run(opts, tasks, 1, &torch);
  bench_stats_t torch_us;
  if (torch.valid) torch_us = bench_stats_scale(&torch.st, 1e6);
  bench_row_t row = bench_row_make(S, "add 16 floats: per op", "host", "torch eager add", "16", "us", false);
  row.is_peer = true;
  row.valid = torch.valid;
  if (torch.valid) row.st = torch_us;
  else bench_row_note(&row, "%s", torch.why);
  if (torch.info[0]) bench_row_note(&row, "%s", torch.info);
  bench_add(&row);
  double torch_value = torch.valid ? torch_us.median : NAN;

  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    const char *sel = d->info.selector;
    long dn = d->simulator ? 50 : n;
    bench_stats_t enq, sus, wait;
    char provider[32];
    if (bench_kiln_tiny(opts, d->device, dn, &enq, &sus, &wait, provider) != 0) {
      bench_section_error(S, "tiny add on %s: %s", sel, bench_error());
      continue;
    }
    enq = bench_stats_scale(&enq, 1e6);
    sus = bench_stats_scale(&sus, 1e6);
    wait = bench_stats_scale(&wait, 1e6);

    bool opencl = !strcmp(d->info.backend, "opencl");
    double raw_enq = NAN, raw_sus = NAN, raw_wait = NAN;
    if (opencl) {
      bench_cl_t *cl = NULL;
      bench_stats_t r_enq, r_sus, r_wait;
      bool ok = bench_cl_open(d, &cl) == 0 && bench_cl_tiny(opts, cl, dn, &r_enq, &r_sus, &r_wait) == 0;
      const char *why = bench_error();
      const char *labels[3] = {"add 16 floats: enqueue only", "add 16 floats: sustained", "add 16 floats: enqueue + wait"};
      bench_stats_t *vals[3] = {&r_enq, &r_sus, &r_wait};
      for (int i = 0; i < 3; i++) {
        row = bench_row_make(S, labels[i], sel, "raw clEnqueueNDRangeKernel", "16", "us", false);
        row.is_peer = true;
        row.valid = ok;
        if (ok) row.st = bench_stats_scale(vals[i], 1e6);
        else bench_row_note(&row, "%s", why);
        bench_add(&row);
      }
      if (ok) {
        raw_enq = r_enq.median * 1e6;
        raw_sus = r_sus.median * 1e6;
        raw_wait = r_wait.median * 1e6;
      }
      bench_cl_close(cl);
    }

    char params[32];
    snprintf(params, sizeof params, "16 (x%ld)", dn);
    row = bench_row_make(S, "add 16 floats: enqueue only", sel, provider, params, "us", false);
    row.st = enq;
    bench_row_note(&row, "%ld enqueues timed without the finish", dn);
    if (opencl) {
      bench_row_compare(&row, "raw OpenCL", raw_enq);
      bench_row_target_diff(&row, 1.0);
    }
    bench_add(&row);

    row = bench_row_make(S, "add 16 floats: sustained", sel, provider, params, "us", false);
    row.st = sus;
    bench_row_note(&row, "(%ld enqueues + finish) / %ld", dn, dn);
    if (opencl) bench_row_compare(&row, "raw OpenCL", raw_sus);
    if (d->info.type == KILN_DEVICE_CPU) bench_row_compare(&row, "torch eager add", torch_value);
    if (!strcmp(d->info.backend, "cpu")) bench_row_target_max(&row, 0.4, "<= 0.4 us per op");
    bench_add(&row);

    row = bench_row_make(S, "add 16 floats: enqueue + wait", sel, provider, "16", "us", false);
    row.st = wait;
    if (opencl) {
      bench_row_compare(&row, "raw OpenCL", raw_wait);
      bench_row_target_diff(&row, 1.0);
    }
    if (d->info.type == KILN_DEVICE_CPU) bench_row_compare(&row, "torch eager add", torch_value);
    bench_add(&row);
    if (!strcmp(d->info.backend, "cpu")) bench_overhead_traced(opts, S, d, dn, enq.median, sus.median);
  }
  bench_section_note(S, "Times per operation in microseconds. kiln's add allocates its result from the device's "
                        "pool on every call; the raw OpenCL peer reuses one output buffer. torch's eager add runs "
                        "synchronously on the CPU, so it compares with kiln's sustained and enqueue + wait figures. "
                        "The traced rows repeat the add with kiln_trace_start recording (the other rows are tracing "
                        "off).");
}

/* ---- section 5: transfers -------------------------------------------------------------- */

typedef struct bench_xfer_t {
  kiln_device_t *device;
  kiln_queue_t *queue;
  kiln_buffer_t *buf, *buf2;
  void *host;
  size_t bytes;
  int kind; /* 0 host to device, 1 device to host, 2 device to device */
} bench_xfer_t;

static int bench_xfer_run(void *ctx, long iters) {
  bench_xfer_t *x = ctx;
  for (long i = 0; i < iters; i++) {
    kiln_status_t st;
    if (x->kind == 0) st = kiln_buffer_write(x->queue, x->buf, 0, x->host, x->bytes, true, 0, NULL, NULL);
    else if (x->kind == 1) st = kiln_buffer_read(x->queue, x->buf, 0, x->host, x->bytes, true, 0, NULL, NULL);
    else st = kiln_buffer_copy(x->queue, x->buf, 0, x->buf2, 0, x->bytes, 0, NULL, NULL);
    if (st != KILN_OK) return bench_kiln_error(x->kind == 0 ? "kiln_buffer_write" : x->kind == 1 ? "kiln_buffer_read" : "kiln_buffer_copy", st);
  }
  if (x->kind == 2) {
    kiln_status_t st = kiln_queue_finish(x->queue);
    if (st != KILN_OK) return bench_kiln_error("kiln_queue_finish", st);
  }
  return 0;
}

void bench_section_transfer(const bench_options_t *opts) {
  const int S = BENCH_SECTION_TRANSFER;
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  size_t bytes = opts->quick ? (size_t)16 << 20 : (size_t)256 << 20;
  char params[32];
  bench_format_bytes((double)bytes, params, sizeof params);
  double gb = (double)bytes / 1e9;

  bench_stats_t mc;
  double memcpy_value = NAN;
  if (bench_host_memcpy(opts, bytes, &mc) == 0) {
    bench_row_t row = bench_row_make(S, "host memcpy", "host", "memcpy", params, "GB/s", true);
    row.is_peer = true;
    row.st = bench_stats_rate(&mc, gb);
    memcpy_value = row.st.median;
    bench_add(&row);
  } else {
    bench_section_error(S, "host memcpy: %s", bench_error());
  }

  static const char *const names[3] = {"host to device", "device to host", "device to device"};
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (!bench_heavy_ok(S, d)) continue;
    bool opencl = !strcmp(d->info.backend, "opencl");
    bench_cl_t *cl = NULL;
    bool cl_ok = opencl && bench_cl_open(d, &cl) == 0;
    if (opencl && !cl_ok) bench_section_note(S, "raw OpenCL peer on %s unavailable: %s", d->info.selector, bench_error());
    bench_xfer_t x = {d->device, kiln_device_current_queue(d->device), NULL, NULL, malloc(bytes), bytes, 0};
    kiln_status_t st = x.host ? kiln_buffer_create(d->device, bytes, &x.buf) : KILN_OUT_OF_MEMORY;
    if (st == KILN_OK) st = kiln_buffer_create(d->device, bytes, &x.buf2);
    if (st != KILN_OK || !x.host) {
      bench_section_error(S, "buffers of %s on %s: %s", params, d->info.selector,
                          x.host ? kiln_last_error() : "out of host memory");
    } else {
      memset(x.host, 5, bytes);
      for (int k = 0; k < 3; k++) {
        x.kind = k;
        bench_stats_t sec;
        if (bench_measure(opts, bench_xfer_run, &x, &sec) != 0) {
          bench_section_error(S, "%s on %s: %s", names[k], d->info.selector, bench_error());
          continue;
        }
        bench_row_t row = bench_row_make(S, names[k], d->info.selector, k == 2 ? "kiln_buffer_copy" : k == 0 ? "kiln_buffer_write" : "kiln_buffer_read", params, "GB/s", true);
        row.st = bench_stats_rate(&sec, gb);
        if (k < 2 && cl_ok) {
          bench_stats_t raw;
          if (bench_cl_transfer(opts, cl, bytes, k == 0, &raw) == 0) {
            bench_row_t peer = bench_row_make(S, names[k], d->info.selector,
                                              k == 0 ? "raw clEnqueueWriteBuffer" : "raw clEnqueueReadBuffer", params,
                                              "GB/s", true);
            peer.is_peer = true;
            peer.st = bench_stats_rate(&raw, gb);
            bench_add(&peer);
            bench_row_compare(&row, "raw OpenCL", peer.st.median);
          } else {
            bench_section_note(S, "raw OpenCL %s on %s failed: %s", names[k], d->info.selector, bench_error());
          }
        }
        bench_row_compare(&row, "memcpy", memcpy_value);
        bench_add(&row);
      }
    }
    kiln_buffer_release(x.buf);
    kiln_buffer_release(x.buf2);
    free(x.host);
    bench_cl_close(cl);
  }
  bench_section_note(S, "Blocking kiln_buffer_write / kiln_buffer_read from ordinary (pageable) host memory, and "
                        "kiln_buffer_copy between two buffers of the device followed by a finish; GB/s counts the "
                        "bytes moved once.");
}

/* ---- section 6: cold and warm kernel cache ----------------------------------------------- */

int bench_child_first_matmul(const char *selector) {
  double t0 = bench_now();
  kiln_device_t *dev = NULL;
  kiln_status_t st = kiln_device_find(selector, &dev);
  if (st != KILN_OK) {
    fprintf(stderr, "kiln-bench: kiln_device_find(\"%s\") failed (%s): %s\n", selector, kiln_status_name(st),
            kiln_last_error());
    return 1;
  }
  double t_init = bench_now();
  kiln_tensor_t *a = NULL, *b = NULL, *c = NULL;
  float out[64 * 64];
  double t1 = 0;
  st = bench_uniform(dev, 64, 64, 1, &a);
  if (st == KILN_OK) st = bench_uniform(dev, 64, 64, 2, &b);
  if (st == KILN_OK) st = bench_finish(dev);
  if (st == KILN_OK) {
    t1 = bench_now();
    st = kiln_tensor_matmul(a, b, false, false, &c);
  }
  const char *provider = kiln_last_provider();
  if (st == KILN_OK) st = kiln_tensor_read(c, out, sizeof out);
  double t2 = bench_now();
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_tensor_release(c);
  if (st != KILN_OK) {
    fprintf(stderr, "kiln-bench: first matmul on %s failed (%s): %s\n", selector, kiln_status_name(st), kiln_last_error());
    return 1;
  }
  printf("FIRST\t%.3f\t%.3f\t%.3f\t%s\n", (t2 - t0) * 1e3, (t2 - t1) * 1e3, (t_init - t0) * 1e3, provider);
  return 0;
}

static int bench_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void bench_rm_tree(const char *dir) {
  if (dir[0]) nftw(dir, bench_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void bench_section_cache(const bench_options_t *opts) {
  const int S = BENCH_SECTION_CACHE;
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  bool any = false;
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (strcmp(d->info.backend, "opencl") != 0) continue;
    if (!bench_heavy_ok(S, d)) continue;
    any = true;
    const char *tmp = getenv("TMPDIR");
    char kdir[4096], pdir[4096];
    snprintf(kdir, sizeof kdir, "%s/kiln-bench-cache-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    snprintf(pdir, sizeof pdir, "%s/kiln-bench-pocl-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(kdir) || !mkdtemp(pdir)) {
      bench_section_error(S, "cannot create a temporary folder under %s", tmp && *tmp ? tmp : "/tmp");
      return;
    }
    char kenv[4200], penv[4200], denv[128];
    snprintf(kenv, sizeof kenv, "KILN_CACHE_DIR=%s", kdir);
    snprintf(penv, sizeof penv, "POCL_CACHE_DIR=%s", pdir);
    snprintf(denv, sizeof denv, "KILN_DEVICE=%s", d->info.selector);
    /* kiln's own kernels: the vendor provider (CLBlast) keeps no cache across processes. */
    const char *env[] = {kenv, penv, denv, "KILN_PROVIDER=matmul=native", "KILN_POLICY=vendor", NULL};
    const char *args[] = {"--child", "first-matmul", d->info.selector, NULL};
    double total[2] = {NAN, NAN}, op_ms[2] = {NAN, NAN}, wall[2] = {NAN, NAN};
    char provider[32] = "";
    for (int run = 0; run < 2; run++) {
      char *text = NULL;
      bench_progress("cache: %s run of a new process on %s", run ? "warm" : "cold", d->info.selector);
      int rc = bench_run_self(opts, env, args, &text, &wall[run]);
      const char *line = text ? strstr(text, "FIRST\t") : NULL;
      if (rc != 0 || !line) {
        bench_section_error(S, "the %s child on %s exited with status %d%s%s", run ? "warm" : "cold",
                            d->info.selector, rc, rc < 0 ? ": " : "", rc < 0 ? bench_error() : "");
        free(text);
        break;
      }
      double init_ms = 0;
      if (sscanf(line, "FIRST\t%lf\t%lf\t%lf\t%31s", &total[run], &op_ms[run], &init_ms, provider) < 3)
        bench_section_error(S, "the %s child on %s printed '%s'", run ? "warm" : "cold", d->info.selector, line);
      free(text);
    }
    bench_rm_tree(kdir);
    bench_rm_tree(pdir);
    for (int run = 0; run < 2; run++) {
      if (!isfinite(total[run])) continue;
      bench_row_t row = bench_row_make(S, run ? "first matmul, warm cache" : "first matmul, cold cache",
                                       d->info.selector, provider, "64^3, new process", "ms", false);
      bench_stats_t st = {total[run], total[run], total[run], total[run], total[run], 1, 1};
      row.st = st;
      bench_row_note(&row, "matmul + read %.1f ms; whole process %.0f ms", op_ms[run], wall[run] * 1e3);
      if (run == 1) {
        if (isfinite(total[0])) bench_row_compare(&row, "cold", total[0]);
        bench_row_target_max(&row, 100.0, "warm <= 100 ms");
      }
      bench_add(&row);
    }
  }
  if (!any) bench_section_note(S, "no OpenCL device: skipped");
  else
    bench_section_note(S, "Each figure is one new kiln-bench process (a hidden mode) timing from main() to the "
                          "first matmul's result on the host: kiln's start-up, the device's program build or "
                          "cache load, and the matmul. The cold run had an empty KILN_CACHE_DIR and an empty "
                          "POCL_CACHE_DIR; the warm run reused both. Both folders were temporary and are removed.");
}
