/* bench/sec_compute.c: sections 1 and 2: matmul per device and provider against OpenBLAS, CLBlast and PyTorch; conv2d, add, softmax. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* ---- timing kiln operations ------------------------------------------------------ */

int bench_op_run(void *ctx, long iters) {
  bench_op_t *op = ctx;
  for (long i = 0; i < iters; i++) {
    kiln_tensor_t *out = NULL;
    kiln_status_t st = KILN_OK;
    const char *what = "";
    switch (op->kind) {
    case BENCH_OP_MATMUL:
      st = kiln_tensor_matmul(op->a, op->b, false, false, &out);
      what = "kiln_tensor_matmul";
      break;
    case BENCH_OP_CONV2D:
      st = kiln_tensor_conv2d(op->a, op->b, op->bias, &op->conv, &out);
      what = "kiln_tensor_conv2d";
      break;
    case BENCH_OP_ADD:
      st = kiln_tensor_add(op->a, op->b, &out);
      what = "kiln_tensor_add";
      break;
    case BENCH_OP_SOFTMAX:
      st = kiln_tensor_softmax(op->a, &out);
      what = "kiln_tensor_softmax";
      break;
    }
    if (st != KILN_OK) return bench_kiln_error(what, st);
    snprintf(op->provider, sizeof op->provider, "%s", kiln_last_provider());
    kiln_tensor_release(out);
  }
  kiln_status_t st = bench_finish(op->device);
  return st == KILN_OK ? 0 : bench_kiln_error("kiln_queue_finish", st);
}

void bench_op_release(bench_op_t *op) {
  kiln_tensor_release(op->a);
  kiln_tensor_release(op->b);
  kiln_tensor_release(op->bias);
  op->a = op->b = op->bias = NULL;
}

int bench_providers(const bench_device_t *d, const char *op, char names[][32], int cap) {
  const char *list = kiln_device_providers(d->device, op);
  int n = 0;
  while (list && *list && n < cap) {
    size_t len = strcspn(list, ",");
    snprintf(names[n++], 32, "%.*s", (int)len, list);
    list += len;
    if (*list == ',') list++;
  }
  if (n == 0) snprintf(names[n++], 32, "native");
  return n;
}

bool bench_heavy_ok(int section, const bench_device_t *d) {
  if (!d->simulator) return true;
  bench_section_note(section, "%s (%s) simulates every work-item and is far too slow for this section: skipped",
                     d->info.selector, d->info.name);
  return false;
}

static bool bench_is_cpu_backend(const bench_device_t *d) { return !strcmp(d->info.backend, "cpu"); }
static bool bench_is_pocl(const bench_device_t *d) {
  return !strcmp(d->info.backend, "opencl") && strstr(d->info.platform, "Portable Computing Language") != NULL;
}

int bench_kiln_matmul(const bench_options_t *opts, const bench_device_t *d, int n, bench_stats_t *out_gflops,
                             char *out_provider) {
  bench_op_t op = {.kind = BENCH_OP_MATMUL, .device = d->device};
  kiln_status_t st = bench_uniform(d->device, n, n, 1, &op.a);
  if (st == KILN_OK) st = bench_uniform(d->device, n, n, 2, &op.b);
  int rc = -1;
  if (st != KILN_OK) bench_kiln_error("kiln_tensor_uniform", st);
  else {
    bench_stats_t sec;
    rc = bench_measure(opts, bench_op_run, &op, &sec);
    if (rc == 0) *out_gflops = bench_stats_rate(&sec, 2.0 * n * (double)n * n / 1e9);
    snprintf(out_provider, 32, "%s", op.provider);
  }
  bench_op_release(&op);
  return rc;
}

static bench_row_t bench_peer_row(int section, const char *name, const char *device, const char *peer,
                                  const char *params, const char *unit, bool ok, const bench_stats_t *st,
                                  const char *why) {
  bench_row_t row = bench_row_make(section, name, device, peer, params, unit, true);
  row.is_peer = true;
  row.valid = ok;
  if (ok) row.st = *st;
  else bench_row_note(&row, "%s", why);
  return row;
}

/* ---- section 1 --------------------------------------------------------------------- */

void bench_section_matmul(const bench_options_t *opts) {
  const int S = BENCH_SECTION_MATMUL;
  const int full_sizes[] = {100, 1024, 2048}, quick_sizes[] = {100, 256};
  const int *sizes = opts->quick ? quick_sizes : full_sizes;
  int nsizes = opts->quick ? 2 : 3;
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);

  char torch_tasks[3][32];
  const char *task_ptrs[3];
  for (int i = 0; i < nsizes; i++) {
    snprintf(torch_tasks[i], sizeof torch_tasks[i], "matmul:%d", sizes[i]);
    task_ptrs[i] = torch_tasks[i];
  }
  bench_progress("matmul: PyTorch peer (torch.mm on the CPU)");
  bench_torch_result_t torch[3];
  bench_torch_run(opts, task_ptrs, nsizes, torch);

  for (int si = 0; si < nsizes; si++) {
    int n = sizes[si];
    char params[32];
    snprintf(params, sizeof params, "%d^3", n);
    double work = 2.0 * n * (double)n * n / 1e9;

    bench_stats_t blas_sec, blas;
    bool blas_ok = bench_openblas_sgemm(opts, n, &blas_sec) == 0;
    if (blas_ok) blas = bench_stats_rate(&blas_sec, work);
    bench_row_t row = bench_peer_row(S, "matmul", "host", "OpenBLAS", params, "GFLOPS", blas_ok, &blas, bench_error());
    bench_row_note(&row, "%s", bench_openblas_describe());
    bench_add(&row);
    double blas_value = blas_ok ? blas.median : NAN;

    bench_stats_t torch_rate;
    if (torch[si].valid) torch_rate = bench_stats_rate(&torch[si].st, work);
    row = bench_peer_row(S, "matmul", "host", "torch.mm", params, "GFLOPS", torch[si].valid, &torch_rate,
                         torch[si].why);
    if (torch[si].info[0]) bench_row_note(&row, "%s", torch[si].info);
    bench_add(&row);
    double torch_value = torch[si].valid ? torch_rate.median : NAN;

    for (size_t di = 0; di < ndev; di++) {
      const bench_device_t *d = &devs[di];
      if (si == 0 && !bench_heavy_ok(S, d)) continue;
      if (d->simulator) continue;
      const char *sel = d->info.selector;
      bool cpu = bench_is_cpu_backend(d), opencl = !strcmp(d->info.backend, "opencl");

      double clblast_value = NAN;
      if (opencl) {
        bench_cl_t *cl = NULL;
        bench_stats_t cl_sec, cl_rate;
        bool ok = bench_cl_open(d, &cl) == 0 && bench_cl_clblast_sgemm(opts, cl, n, &cl_sec) == 0;
        if (ok) cl_rate = bench_stats_rate(&cl_sec, work);
        row = bench_peer_row(S, "matmul", sel, "CLBlast", params, "GFLOPS", ok, &cl_rate, bench_error());
        bench_row_note(&row, "untuned defaults; host clock after clFinish");
        bench_add(&row);
        if (ok) clblast_value = cl_rate.median;
        bench_cl_close(cl);
      }

      char providers[8][32];
      int np = bench_providers(d, "matmul", providers, 8);
      for (int pi = 0; pi <= np; pi++) {
        bool fastest = pi == np;
        char used[32] = "";
        bench_stats_t rate;
        int rc;
        if (fastest) {
          kiln_set_providers("");
          kiln_set_policy(KILN_POLICY_FASTEST);
        } else {
          char spec[64];
          snprintf(spec, sizeof spec, "matmul=%.31s", providers[pi]);
          kiln_status_t st = kiln_set_providers(spec);
          if (st != KILN_OK) {
            bench_section_error(S, "kiln_set_providers(\"%s\") failed (%s): %s", spec, kiln_status_name(st),
                                kiln_last_error());
            continue;
          }
        }
        rc = bench_kiln_matmul(opts, d, n, &rate, used);
        bench_reset_providers();
        row = bench_row_make(S, "matmul", sel, used[0] ? used : (fastest ? "fastest" : providers[pi]), params,
                             "GFLOPS", true);
        row.chosen = fastest;
        if (rc != 0) {
          bench_section_error(S, "matmul %s on %s with %s: %s", params, sel, fastest ? "policy fastest" : providers[pi],
                              bench_error());
          continue;
        }
        row.st = rate;
        if (!fastest && strcmp(used, providers[pi]) != 0)
          bench_row_note(&row, "asked for %s, kiln ran %s", providers[pi], used);
        if (fastest) bench_row_note(&row, "policy fastest");
        if (opencl) {
          bench_row_compare(&row, "CLBlast", clblast_value);
          if (bench_is_pocl(d) && !strcmp(used, "native") && !fastest) bench_row_target_ratio(&row, 3.0);
        }
        bench_row_compare(&row, "OpenBLAS", blas_value);
        if (cpu && !fastest && !strcmp(used, "blas")) bench_row_target_ratio(&row, 0.95);
        if (cpu && !fastest && !strcmp(used, "native") && n == 2048) bench_row_target_ratio(&row, 0.5);
        if (cpu || opencl) bench_row_compare(&row, "torch.mm", torch_value);
        bench_add(&row);
      }
    }
  }
  bench_section_note(S, "GFLOPS = 2*n^3 / time. Each provider forced with kiln_set_providers(\"matmul=<p>\"); the row "
                        "marked * ran under kiln_set_policy(KILN_POLICY_FASTEST) and names the provider it chose. "
                        "Peers: cblas_sgemm called directly, CLBlastSgemm on the same OpenCL device, torch.mm on the CPU.");
}

/* ---- section 2 ----------------------------------------------------------------------- */

static void bench_conv(const bench_options_t *opts, const bench_device_t *devs, size_t ndev,
                       const bench_torch_result_t *torch, int N, int C, int K, int H, int W) {
  const int S = BENCH_SECTION_NN;
  char params[64];
  snprintf(params, sizeof params, "N%d C%d K%d %dx%d 3x3 pad1", N, C, K, H, W);
  double work = 2.0 * N * K * H * W * (double)C * 9 / 1e9; /* pad 1, stride 1: P = H, Q = W */
  bench_stats_t torch_rate;
  if (torch->valid) torch_rate = bench_stats_rate(&torch->st, work);
  bench_row_t row = bench_peer_row(S, "conv2d", "host", "torch conv2d", params, "GFLOPS", torch->valid, &torch_rate,
                                   torch->why);
  bench_add(&row);
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (!bench_heavy_ok(S, d)) continue;
    char providers[8][32];
    int np = bench_providers(d, "conv2d", providers, 8);
    for (int pi = 0; pi < np; pi++) {
      char spec[64];
      snprintf(spec, sizeof spec, "conv2d=%.31s", providers[pi]);
      kiln_set_providers(spec);
      bench_op_t op = {.kind = BENCH_OP_CONV2D, .device = d->device};
      op.conv = kiln_conv2d_params_default();
      op.conv.padding[0] = op.conv.padding[1] = 1;
      int64_t xs[4] = {N, C, H, W}, ws[4] = {K, C, 3, 3}, bs[1] = {K};
      kiln_status_t st = kiln_tensor_uniform(d->device, 4, xs, 3, -1, 1, &op.a);
      if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 4, ws, 4, -0.1f, 0.1f, &op.b);
      if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 1, bs, 5, -0.1f, 0.1f, &op.bias);
      bench_stats_t sec;
      int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec) : bench_kiln_error("kiln_tensor_uniform", st);
      bench_op_release(&op);
      bench_reset_providers();
      if (rc != 0) {
        bench_section_error(S, "conv2d %s on %s with %s: %s", params, d->info.selector, providers[pi], bench_error());
        continue;
      }
      row = bench_row_make(S, "conv2d", d->info.selector, op.provider, params, "GFLOPS", true);
      row.st = bench_stats_rate(&sec, work);
      if (bench_is_cpu_backend(d) || d->info.type == KILN_DEVICE_CPU)
        bench_row_compare(&row, "torch conv2d", torch->valid ? torch_rate.median : NAN);
      bench_add(&row);
    }
  }
}

static void bench_stream_op(const bench_options_t *opts, const bench_device_t *devs, size_t ndev,
                            bench_op_kind_t kind, int64_t rows, int64_t cols, double bytes_per_elem,
                            const bench_torch_result_t *torch, const bench_stats_t *host_loop) {
  const int S = BENCH_SECTION_NN;
  double n = (double)rows * (double)cols;
  double gb = n * bytes_per_elem / 1e9;
  const char *name = kind == BENCH_OP_ADD ? "add" : "softmax";
  char params[64];
  if (kind == BENCH_OP_ADD) snprintf(params, sizeof params, "2^%d floats", (int)lround(log2(n)));
  else snprintf(params, sizeof params, "%lldx%lld", (long long)rows, (long long)cols);

  double host_value = NAN;
  if (host_loop) {
    bench_stats_t rate = bench_stats_rate(host_loop, gb);
    char label[64];
    snprintf(label, sizeof label, "C loop, %d threads", bench_host_cores());
    bench_row_t row = bench_peer_row(S, name, "host", label, params, "GB/s", true, &rate, "");
    bench_add(&row);
    host_value = rate.median;
  }
  bench_stats_t torch_rate;
  if (torch->valid) torch_rate = bench_stats_rate(&torch->st, gb);
  bench_row_t row = bench_peer_row(S, name, "host", kind == BENCH_OP_ADD ? "torch add" : "torch softmax", params, "GB/s",
                                   torch->valid, &torch_rate, torch->why);
  bench_add(&row);

  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (!bench_heavy_ok(S, d)) continue;
    bench_op_t op = {.kind = kind, .device = d->device};
    kiln_status_t st;
    if (kind == BENCH_OP_ADD) {
      int64_t shape[1] = {rows * cols};
      st = kiln_tensor_uniform(d->device, 1, shape, 6, -1, 1, &op.a);
      if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 1, shape, 7, -1, 1, &op.b);
    } else {
      st = bench_uniform(d->device, rows, cols, 8, &op.a);
    }
    bench_stats_t sec;
    int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec) : bench_kiln_error("kiln_tensor_uniform", st);
    bench_op_release(&op);
    if (rc != 0) {
      bench_section_error(S, "%s %s on %s: %s", name, params, d->info.selector, bench_error());
      continue;
    }
    row = bench_row_make(S, name, d->info.selector, op.provider, params, "GB/s", true);
    row.st = bench_stats_rate(&sec, gb);
    if (d->info.type == KILN_DEVICE_CPU) {
      if (kind == BENCH_OP_ADD) {
        bench_row_compare(&row, "C loop", host_value);
        bench_row_target_ratio(&row, 0.8);
      }
      bench_row_compare(&row, kind == BENCH_OP_ADD ? "torch add" : "torch softmax",
                        torch->valid ? torch_rate.median : NAN);
    }
    bench_add(&row);
  }
}

void bench_section_nn(const bench_options_t *opts) {
  const int S = BENCH_SECTION_NN;
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  int N = opts->quick ? 4 : 32, C = opts->quick ? 32 : 64, HW = opts->quick ? 28 : 56;
  int64_t add_n = opts->quick ? (int64_t)1 << 22 : (int64_t)1 << 26;
  int64_t sm = opts->quick ? 1024 : 4096;
  char t_conv[64], t_add[64], t_sm[64];
  snprintf(t_conv, sizeof t_conv, "conv2d:%d,%d,%d,%d,%d,3,1", N, C, C, HW, HW);
  snprintf(t_add, sizeof t_add, "add:%lld", (long long)add_n);
  snprintf(t_sm, sizeof t_sm, "softmax:%lld,%lld", (long long)sm, (long long)sm);
  const char *tasks[] = {t_conv, t_add, t_sm};
  bench_torch_result_t torch[3];
  bench_progress("conv2d/add/softmax: PyTorch peer");
  bench_torch_run(opts, tasks, 3, torch);

  bench_conv(opts, devs, ndev, &torch[0], N, C, C, HW, HW);

  bench_stats_t host;
  bool host_ok = bench_host_add(opts, (size_t)add_n, &host) == 0;
  if (!host_ok) bench_section_error(S, "the C loop peer of add failed: %s", bench_error());
  bench_stream_op(opts, devs, ndev, BENCH_OP_ADD, 1, add_n, 12.0, &torch[1], host_ok ? &host : NULL);
  bench_stream_op(opts, devs, ndev, BENCH_OP_SOFTMAX, sm, sm, 8.0, &torch[2], NULL);
  bench_section_note(S, "conv2d GFLOPS = 2*N*K*P*Q*C*R*S / time, each provider forced with KILN_PROVIDER-style "
                        "overrides. add GB/s counts 12 bytes per element (two reads, one write); softmax counts 8 "
                        "(one read, one write). The C loop peer is a plain loop split over all usable cores with "
                        "pthreads.");
}
