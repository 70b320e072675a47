/* bench/sec_compute.c: sections 1, 2 and 10: matmul per device and provider against OpenBLAS, CLBlast and PyTorch; conv2d, add, softmax; matmul, conv2d and add in f16/bf16 against f32 and PyTorch. */
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
    case BENCH_OP_CONV2D_BWD_INPUT:
      st = kiln_tensor_conv2d_backward_input(op->a, op->b, op->shape, &op->conv, &out);
      what = "kiln_tensor_conv2d_backward_input";
      break;
    case BENCH_OP_CONV2D_BWD_WEIGHT:
      st = kiln_tensor_conv2d_backward_weight(op->a, op->b, op->shape, &op->conv, &out);
      what = "kiln_tensor_conv2d_backward_weight";
      break;
    case BENCH_OP_SGD: {
      /* torch.optim.SGD(momentum=0.9, weight_decay=1e-4) after its first step */
      const kiln_sgd_params_t sgd = {.lr = 1e-3, .momentum = 0.9, .weight_decay = 1e-4};
      st = kiln_tensor_sgd_update(op->a, op->b, op->c, &sgd);
      what = "kiln_tensor_sgd_update";
      break;
    }
    case BENCH_OP_ADAM: {
      const kiln_adam_params_t adam = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
      st = kiln_tensor_adam_update(op->a, op->b, op->c, op->d, ++op->step, &adam);
      what = "kiln_tensor_adam_update";
      break;
    }
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
  kiln_tensor_release(op->c);
  kiln_tensor_release(op->d);
  kiln_tensor_release(op->bias);
  op->a = op->b = op->c = op->d = op->bias = NULL;
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

/* f64 matmul on cpu:0 (issue 20), each provider against cblas_dgemm called
 * directly, in the same run: blas >= 0.95x, native >= 0.5x. */
static void bench_matmul_f64(const bench_options_t *opts) {
  const int S = BENCH_SECTION_MATMUL;
  const int n = opts->quick ? 256 : 1024;
  char params[32];
  snprintf(params, sizeof params, "%d^3 f64", n);
  const double work = 2.0 * n * (double)n * n / 1e9;
  bench_stats_t blas_sec, blas;
  bool blas_ok = bench_openblas_dgemm(opts, n, &blas_sec) == 0;
  if (blas_ok) blas = bench_stats_rate(&blas_sec, work);
  bench_row_t row = bench_peer_row(S, "matmul", "host", "OpenBLAS dgemm", params, "GFLOPS", blas_ok, &blas,
                                   bench_error());
  bench_add(&row);
  const double blas_value = blas_ok ? blas.median : NAN;
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (!bench_is_cpu_backend(d) || strcmp(d->info.selector, "cpu:0") != 0) continue;
    char providers[8][32];
    int np = bench_providers(d, "matmul", providers, 8);
    for (int pi = 0; pi < np; pi++) {
      char spec[64];
      snprintf(spec, sizeof spec, "matmul=%.31s", providers[pi]);
      if (kiln_set_providers(spec) != KILN_OK) continue;
      bench_op_t op = {.kind = BENCH_OP_MATMUL, .device = d->device};
      const int64_t shape[2] = {n, n};
      kiln_status_t st = kiln_tensor_uniform_dtype(d->device, KILN_F64, 2, shape, 1, -1.0f, 1.0f, &op.a);
      if (st == KILN_OK) st = kiln_tensor_uniform_dtype(d->device, KILN_F64, 2, shape, 2, -1.0f, 1.0f, &op.b);
      bench_stats_t sec;
      int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec)
                             : bench_kiln_error("kiln_tensor_uniform_dtype", st);
      bench_op_release(&op);
      bench_reset_providers();
      if (rc != 0) {
        bench_section_error(S, "matmul %s on %s with %s: %s", params, d->info.selector, providers[pi], bench_error());
        continue;
      }
      row = bench_row_make(S, "matmul", d->info.selector, op.provider, params, "GFLOPS", true);
      row.st = bench_stats_rate(&sec, work);
      if (strcmp(op.provider, providers[pi]) != 0) bench_row_note(&row, "asked for %s, kiln ran %s", providers[pi],
                                                                  op.provider);
      bench_row_compare(&row, "OpenBLAS dgemm", blas_value);
      if (!strcmp(op.provider, "blas")) bench_row_target_ratio(&row, 0.95);
      if (!strcmp(op.provider, "native")) bench_row_target_ratio(&row, 0.5);
      bench_add(&row);
    }
  }
}

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
  bench_matmul_f64(opts);
  bench_section_note(S, "GFLOPS = 2*n^3 / time. Each provider forced with kiln_set_providers(\"matmul=<p>\"); the row "
                        "marked * ran under kiln_set_policy(KILN_POLICY_FASTEST) and names the provider it chose. "
                        "Peers: cblas_sgemm called directly, CLBlastSgemm on the same OpenCL device, torch.mm on the CPU. "
                        "The f64 rows: cpu:0's providers against cblas_dgemm called directly (targets: blas >= "
                        "0.95x, native >= 0.5x).");
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

/* ---- section 10 ------------------------------------------------------------------------ */

/* matmul n^3 (2048, 256 with --quick) on cpu:0 in f32, bf16 and f16 (issue
 * 21), beside PyTorch's bf16 and f16 torch.mm in the same run: bf16 >= 1.0x
 * torch and >= 1.7x kiln's f32; f16 >= 0.9x kiln's f32. */
static void bench_half_matmul(const bench_options_t *opts, const bench_device_t *d) {
  const int S = BENCH_SECTION_HALF;
  const int n = opts->quick ? 256 : 2048;
  const double work = 2.0 * n * (double)n * n / 1e9;
  char tasks[2][32];
  snprintf(tasks[0], sizeof tasks[0], "matmul_bf16:%d", n);
  snprintf(tasks[1], sizeof tasks[1], "matmul_f16:%d", n);
  const char *task_ptrs[2] = {tasks[0], tasks[1]};
  bench_progress("half: PyTorch peer (torch.mm in bf16 and f16 on the CPU)");
  bench_torch_result_t torch[2];
  bench_torch_run(opts, task_ptrs, 2, torch);
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_BF16, KILN_F16};
  double torch_value[3] = {NAN, NAN, NAN};
  for (int t = 0; t < 2; t++) {
    char params[64];
    snprintf(params, sizeof params, "%d^3 %s", n, t == 0 ? "bf16" : "f16");
    bench_stats_t rate;
    if (torch[t].valid) rate = bench_stats_rate(&torch[t].st, work);
    bench_row_t row = bench_peer_row(S, "matmul", "host", "torch.mm", params, "GFLOPS", torch[t].valid, &rate,
                                     torch[t].why);
    if (torch[t].valid && torch[t].info[0]) bench_row_note(&row, "%s", torch[t].info);
    bench_add(&row);
    torch_value[t + 1] = torch[t].valid ? rate.median : NAN;
  }
  double f32_value = NAN;
  for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
    const kiln_dtype_t dt = dtypes[t];
    char params[64];
    snprintf(params, sizeof params, "%d^3 %s", n, kiln_dtype_name(dt));
    bench_op_t op = {.kind = BENCH_OP_MATMUL, .device = d->device};
    const int64_t shape[2] = {n, n};
    kiln_status_t st = kiln_tensor_uniform_dtype(d->device, dt, 2, shape, 1, -1, 1, &op.a);
    if (st == KILN_OK) st = kiln_tensor_uniform_dtype(d->device, dt, 2, shape, 2, -1, 1, &op.b);
    bench_stats_t sec;
    int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec)
                           : bench_kiln_error("kiln_tensor_uniform_dtype", st);
    bench_op_release(&op);
    if (rc != 0) {
      bench_section_error(S, "matmul %s on %s: %s", params, d->info.selector, bench_error());
      continue;
    }
    bench_row_t row = bench_row_make(S, "matmul", d->info.selector, op.provider, params, "GFLOPS", true);
    row.st = bench_stats_rate(&sec, work);
    if (dt == KILN_F32) {
      f32_value = row.st.median;
    } else {
      bench_row_compare(&row, "kiln f32", f32_value);
      bench_row_target_ratio(&row, dt == KILN_BF16 ? 1.7 : 0.9);
      bench_row_compare(&row, "torch.mm", torch_value[t]);
      if (dt == KILN_BF16) bench_row_target_ratio(&row, 1.0);
    }
    bench_add(&row);
  }
  bench_section_note(S, "matmul %d^3 on cpu:0 in f32, bf16 and f16 (operands uniform in [-1, 1], a fresh output "
                        "each time; GFLOPS count 2n^3): bf16 against kiln's f32 (target >= 1.7x) and PyTorch's "
                        "bf16 torch.mm (oneDNN; target >= 1.0x); f16 against kiln's f32 (target >= 0.9x). PyTorch "
                        "1.13 has no f16 matmul on the CPU: its row says so.",
                     n);
}

/* conv2d's two gradients at the same shape in f32, bf16 and f16: the
 * 16-bit rows against f32's of this run, without a target. */
static void bench_half_conv_grads(const bench_options_t *opts, const bench_device_t *d, int64_t n, int64_t c,
                                  int64_t k, int64_t h, int64_t r, int64_t pad, double work) {
  const int S = BENCH_SECTION_HALF;
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_BF16, KILN_F16};
  for (int weight = 0; weight < 2; weight++) {
    const char *name = weight ? "conv2d_backward_weight" : "conv2d_backward_input";
    double f32_value = NAN;
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
      const kiln_dtype_t dt = dtypes[t];
      char params[64];
      snprintf(params, sizeof params, "N%lld C%lld K%lld %lldx%lld %lldx%lld pad%lld %s", (long long)n, (long long)c,
               (long long)k, (long long)h, (long long)h, (long long)r, (long long)r, (long long)pad,
               kiln_dtype_name(dt));
      bench_op_t op = {.kind = weight ? BENCH_OP_CONV2D_BWD_WEIGHT : BENCH_OP_CONV2D_BWD_INPUT, .device = d->device};
      op.conv = kiln_conv2d_params_default();
      op.conv.padding[0] = op.conv.padding[1] = (int32_t)pad;
      const int64_t xs[4] = {n, c, h, h}, ws[4] = {k, c, r, r}, ys[4] = {n, k, h + 2 * pad - r + 1, h + 2 * pad - r + 1};
      kiln_status_t st;
      if (weight) {
        memcpy(op.shape, ws, sizeof ws);
        st = kiln_tensor_uniform_dtype(d->device, dt, 4, xs, 3, -1, 1, &op.a);
        if (st == KILN_OK) st = kiln_tensor_uniform_dtype(d->device, dt, 4, ys, 4, -1, 1, &op.b);
      } else {
        memcpy(op.shape, xs, sizeof xs);
        st = kiln_tensor_uniform_dtype(d->device, dt, 4, ys, 4, -1, 1, &op.a);
        if (st == KILN_OK) st = kiln_tensor_uniform_dtype(d->device, dt, 4, ws, 5, -0.1f, 0.1f, &op.b);
      }
      bench_stats_t sec;
      int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec)
                             : bench_kiln_error("kiln_tensor_uniform_dtype", st);
      bench_op_release(&op);
      if (rc != 0) {
        bench_section_error(S, "%s %s on %s: %s", name, params, d->info.selector, bench_error());
        continue;
      }
      bench_row_t row = bench_row_make(S, name, d->info.selector, op.provider, params, "GFLOPS", true);
      row.st = bench_stats_rate(&sec, work);
      if (dt == KILN_F32)
        f32_value = row.st.median;
      else
        bench_row_compare(&row, "kiln f32", f32_value);
      bench_add(&row);
    }
  }
}

/* conv2d of a ResNet-like layer (N32 C64 K64 56x56 3x3 pad 1; N4 with
 * --quick) on cpu:0 in f32, bf16 and f16 with a bias: bf16 >= 1.5x kiln's
 * f32 (issue 21); and its gradients. */
static void bench_half_conv(const bench_options_t *opts, const bench_device_t *d) {
  const int S = BENCH_SECTION_HALF;
  const int64_t n = opts->quick ? 4 : 32, c = 64, k = 64, h = 56, r = 3, pad = 1;
  const double work = 2.0 * n * k * h * h * c * r * r / 1e9;
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_BF16, KILN_F16};
  double f32_value = NAN;
  for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
    const kiln_dtype_t dt = dtypes[t];
    char params[64];
    snprintf(params, sizeof params, "N%lld C64 K64 56x56 3x3 pad1 %s", (long long)n, kiln_dtype_name(dt));
    bench_op_t op = {.kind = BENCH_OP_CONV2D, .device = d->device};
    op.conv = kiln_conv2d_params_default();
    op.conv.padding[0] = op.conv.padding[1] = (int32_t)pad;
    const int64_t xs[4] = {n, c, h, h}, ws[4] = {k, c, r, r}, bs[1] = {k};
    kiln_status_t st = kiln_tensor_uniform_dtype(d->device, dt, 4, xs, 3, -1, 1, &op.a);
    if (st == KILN_OK) st = kiln_tensor_uniform_dtype(d->device, dt, 4, ws, 4, -0.1f, 0.1f, &op.b);
    if (st == KILN_OK) st = kiln_tensor_uniform_dtype(d->device, dt, 1, bs, 5, -0.1f, 0.1f, &op.bias);
    bench_stats_t sec;
    int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec)
                           : bench_kiln_error("kiln_tensor_uniform_dtype", st);
    bench_op_release(&op);
    if (rc != 0) {
      bench_section_error(S, "conv2d %s on %s: %s", params, d->info.selector, bench_error());
      continue;
    }
    bench_row_t row = bench_row_make(S, "conv2d", d->info.selector, op.provider, params, "GFLOPS", true);
    row.st = bench_stats_rate(&sec, work);
    if (dt == KILN_F32) {
      f32_value = row.st.median;
    } else {
      bench_row_compare(&row, "kiln f32", f32_value);
      if (dt == KILN_BF16) bench_row_target_ratio(&row, 1.5);
    }
    bench_add(&row);
  }
  bench_half_conv_grads(opts, d, n, c, k, h, r, pad, work);
  bench_section_note(S, "conv2d of a ResNet-like layer with a bias on cpu:0 in f32, bf16 and f16 (GFLOPS count "
                        "2*N*K*P*Q*C*R*S): bf16 against kiln's f32 in this run (target >= 1.5x); f16 runs through "
                        "f32 and is reported without a target. Its two gradients at the same shape (the same "
                        "GFLOPS count), each dtype against f32's, without a target.");
}

/* add of 2^24 elements (2^22 with --quick) in f32, f16 and bf16 on cpu:0 and
 * on PoCL (issue 20), side by side: bytes per second (three elements' bytes
 * each), the 16-bit rows against the f32 row of the same device in this run
 * (target >= 0.9x, so about 1.8x f32's elements per second). */
void bench_section_half(const bench_options_t *opts) {
  const int S = BENCH_SECTION_HALF;
  const bench_device_t *devs;
  const size_t ndev = bench_devices(&devs);
  const int64_t n = opts->quick ? (int64_t)1 << 22 : (int64_t)1 << 24;
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_F16, KILN_BF16};
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (!(bench_is_cpu_backend(d) && !strcmp(d->info.selector, "cpu:0")) && !bench_is_pocl(d)) continue;
    if (bench_is_cpu_backend(d)) {
      bench_half_matmul(opts, d);
      bench_half_conv(opts, d);
    }
    double f32_value = NAN;
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
      const kiln_dtype_t dt = dtypes[t];
      char params[64];
      snprintf(params, sizeof params, "2^%d %s", (int)lround(log2((double)n)), kiln_dtype_name(dt));
      bench_op_t op = {.kind = BENCH_OP_ADD, .device = d->device};
      const int64_t shape[1] = {n};
      kiln_status_t st = kiln_tensor_uniform_dtype(d->device, dt, 1, shape, 6, -1, 1, &op.a);
      if (st == KILN_OK) st = kiln_tensor_uniform_dtype(d->device, dt, 1, shape, 7, -1, 1, &op.b);
      kiln_tensor_t *probe = NULL;
      if (st == KILN_OK && kiln_tensor_add(op.a, op.b, &probe) == KILN_DTYPE_MISMATCH) {
        /* A dtype kiln has no add for yet: a row that says so, not an error. */
        bench_row_t row = bench_row_make(S, "add", d->info.selector, "native", params, "GB/s", true);
        row.valid = false;
        bench_row_note(&row, "no %s add yet: %s", kiln_dtype_name(dt), kiln_last_error());
        bench_add(&row);
        bench_op_release(&op);
        continue;
      }
      kiln_tensor_release(probe);
      bench_stats_t sec;
      int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec)
                             : bench_kiln_error("kiln_tensor_uniform_dtype", st);
      bench_op_release(&op);
      if (rc != 0) {
        bench_section_error(S, "add %s on %s: %s", params, d->info.selector, bench_error());
        continue;
      }
      bench_row_t row = bench_row_make(S, "add", d->info.selector, op.provider, params, "GB/s", true);
      row.st = bench_stats_rate(&sec, 3.0 * (double)n * (double)kiln_dtype_size(dt) / 1e9);
      if (dt == KILN_F32) {
        f32_value = row.st.median;
      } else {
        bench_row_compare(&row, "f32 add", f32_value);
        bench_row_target_ratio(&row, 0.9);
      }
      bench_add(&row);
    }
  }
  bench_section_note(S, "add of 2^%d elements (a + b, both contiguous, a fresh output each time) in f32, f16 and bf16 "
                        "on cpu:0 and on PoCL: GB/s counts 3 elements of the dtype per element (two reads, one "
                        "write); each 16-bit row is compared with the f32 row of the same device in this run "
                        "(target >= 0.9x, i.e. about 1.8x f32's elements per second).",
                     (int)lround(log2((double)n)));
}

/* conv2d's two gradients (issue: training on any device), each provider
 * against torch's convolution_backward for the same gradient alone. */
typedef struct bench_conv_shape_t {
  const char *label;
  int n, c, k, h, w, r, pad;
} bench_conv_shape_t;

static void bench_conv_backward(const bench_options_t *opts, const bench_device_t *devs, size_t ndev,
                                const bench_conv_shape_t *cs, bool weight, const bench_torch_result_t *torch) {
  const int S = BENCH_SECTION_NN;
  const char *name = weight ? "conv2d_backward_weight" : "conv2d_backward_input";
  const int p = cs->h + 2 * cs->pad - cs->r + 1, q = cs->w + 2 * cs->pad - cs->r + 1;
  char params[96];
  snprintf(params, sizeof params, "%s: N%d C%d K%d %dx%d %dx%d pad%d", cs->label, cs->n, cs->c, cs->k, cs->h, cs->w,
           cs->r, cs->r, cs->pad);
  /* The same multiply-adds as the forward: 2*N*K*P*Q*C*R*S. */
  const double work = 2.0 * cs->n * cs->k * p * (double)q * cs->c * cs->r * cs->r / 1e9;
  const char *peer = weight ? "torch dW" : "torch dx";
  bench_stats_t torch_rate;
  if (torch->valid) torch_rate = bench_stats_rate(&torch->st, work);
  bench_row_t row = bench_peer_row(S, name, "host", peer, params, "GFLOPS", torch->valid, &torch_rate, torch->why);
  bench_add(&row);
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (!bench_heavy_ok(S, d)) continue;
    char providers[8][32];
    int np = bench_providers(d, name, providers, 8);
    for (int pi = 0; pi < np; pi++) {
      char spec[96];
      snprintf(spec, sizeof spec, "%s=%.31s", name, providers[pi]);
      kiln_set_providers(spec);
      bench_op_t op = {.kind = weight ? BENCH_OP_CONV2D_BWD_WEIGHT : BENCH_OP_CONV2D_BWD_INPUT, .device = d->device};
      op.conv = kiln_conv2d_params_default();
      op.conv.padding[0] = op.conv.padding[1] = cs->pad;
      int64_t xs[4] = {cs->n, cs->c, cs->h, cs->w}, ws[4] = {cs->k, cs->c, cs->r, cs->r}, ys[4] = {cs->n, cs->k, p, q};
      kiln_status_t st;
      if (weight) {
        memcpy(op.shape, ws, sizeof ws);
        st = kiln_tensor_uniform(d->device, 4, xs, 3, -1, 1, &op.a);
        if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 4, ys, 4, -1, 1, &op.b);
      } else {
        memcpy(op.shape, xs, sizeof xs);
        st = kiln_tensor_uniform(d->device, 4, ys, 4, -1, 1, &op.a);
        if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 4, ws, 5, -0.1f, 0.1f, &op.b);
      }
      bench_stats_t sec;
      int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec) : bench_kiln_error("kiln_tensor_uniform", st);
      bench_op_release(&op);
      bench_reset_providers();
      if (rc != 0) {
        bench_section_error(S, "%s %s on %s with %s: %s", name, params, d->info.selector, providers[pi], bench_error());
        continue;
      }
      if (strcmp(op.provider, providers[pi]) != 0) {
        /* The provider declined this shape and the core ran another: that
         * one has its own row. */
        bench_section_note(S, "%s %s on %s: %s declines this shape (%s ran in its place)", name, params,
                           d->info.selector, providers[pi], op.provider);
        continue;
      }
      row = bench_row_make(S, name, d->info.selector, op.provider, params, "GFLOPS", true);
      row.st = bench_stats_rate(&sec, work);
      if (bench_is_cpu_backend(d) || d->info.type == KILN_DEVICE_CPU) {
        bench_row_compare(&row, peer, torch->valid ? torch_rate.median : NAN);
        if (bench_is_cpu_backend(d) && !strcmp(op.provider, "native")) bench_row_target_ratio(&row, 1.0);
      }
      bench_add(&row);
    }
  }
}

/* The fused updates as bytes per second (SGD with momentum: param, grad and
 * buffer read, param and buffer written, 20 bytes per element; Adam: param,
 * grad, m and v read, three written, 28), against the same device's add (12
 * bytes) measured just before at the same size, and against torch.optim's
 * step on one parameter of that size. */
static void bench_updates(const bench_options_t *opts, const bench_device_t *devs, size_t ndev, int64_t n,
                          const bench_torch_result_t *torch_sgd, const bench_torch_result_t *torch_adam) {
  const int S = BENCH_SECTION_NN;
  char params[64];
  snprintf(params, sizeof params, "2^%d floats", (int)lround(log2((double)n)));
  const bench_torch_result_t *torch[2] = {torch_sgd, torch_adam};
  const char *names[2] = {"sgd_update", "adam_update"};
  const char *peers[2] = {"torch SGD step", "torch Adam step"};
  const double bytes[2] = {20.0, 28.0};
  double torch_value[2];
  for (int u = 0; u < 2; u++) {
    bench_stats_t rate;
    if (torch[u]->valid) rate = bench_stats_rate(&torch[u]->st, bytes[u] * (double)n / 1e9);
    torch_value[u] = torch[u]->valid ? rate.median : NAN;
    bench_row_t row = bench_peer_row(S, names[u], "host", peers[u], params, "GB/s", torch[u]->valid, &rate, torch[u]->why);
    bench_add(&row);
  }
  int64_t shape[1] = {n};
  for (size_t di = 0; di < ndev; di++) {
    const bench_device_t *d = &devs[di];
    if (!bench_heavy_ok(S, d)) continue;
    /* the add of the same size on the same device, in this run */
    bench_op_t add = {.kind = BENCH_OP_ADD, .device = d->device};
    kiln_status_t st = kiln_tensor_uniform(d->device, 1, shape, 6, -1, 1, &add.a);
    if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 1, shape, 7, -1, 1, &add.b);
    bench_stats_t add_sec;
    int rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &add, &add_sec) : bench_kiln_error("kiln_tensor_uniform", st);
    bench_op_release(&add);
    if (rc != 0) {
      bench_section_error(S, "add %s on %s: %s", params, d->info.selector, bench_error());
      continue;
    }
    const double add_rate = bench_stats_rate(&add_sec, 12.0 * (double)n / 1e9).median;
    for (int u = 0; u < 2; u++) {
      bench_op_t op = {.kind = u ? BENCH_OP_ADAM : BENCH_OP_SGD, .device = d->device};
      st = kiln_tensor_uniform(d->device, 1, shape, 11, -1, 1, &op.a);
      if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 1, shape, 12, -1e-3f, 1e-3f, &op.b);
      if (st == KILN_OK) st = kiln_tensor_zeros(d->device, KILN_F32, 1, shape, &op.c);
      if (st == KILN_OK && u) st = kiln_tensor_zeros(d->device, KILN_F32, 1, shape, &op.d);
      bench_stats_t sec;
      rc = st == KILN_OK ? bench_measure(opts, bench_op_run, &op, &sec) : bench_kiln_error("kiln_tensor_zeros", st);
      bench_op_release(&op);
      if (rc != 0) {
        bench_section_error(S, "%s %s on %s: %s", names[u], params, d->info.selector, bench_error());
        continue;
      }
      bench_row_t row = bench_row_make(S, names[u], d->info.selector, op.provider, params, "GB/s", true);
      row.st = bench_stats_rate(&sec, bytes[u] * (double)n / 1e9);
      bench_row_compare(&row, "add, same device", add_rate);
      bench_row_target_ratio(&row, 0.8);
      if (d->info.type == KILN_DEVICE_CPU) bench_row_compare(&row, peers[u], torch_value[u]);
      bench_add(&row);
    }
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
  /* The gradients at the forward's ResNet-like shape and at LeNet's two
   * convolutions (kiln-train's lenet, batch 100). */
  const bench_conv_shape_t shapes[3] = {
      {"resnet-like", N, C, C, HW, HW, 3, 1},
      {"lenet conv1", opts->quick ? 20 : 100, 1, 6, 28, 28, 5, 2},
      {"lenet conv2", opts->quick ? 20 : 100, 6, 16, 14, 14, 5, 0},
  };
  char t_bwd[6][80];
  for (int i = 0; i < 6; i++) {
    const bench_conv_shape_t *cs = &shapes[i / 2];
    snprintf(t_bwd[i], sizeof t_bwd[i], "%s:%d,%d,%d,%d,%d,%d,%d", i % 2 ? "conv2d_bwd_weight" : "conv2d_bwd_input",
             cs->n, cs->c, cs->k, cs->h, cs->w, cs->r, cs->pad);
  }
  int64_t upd_n = opts->quick ? (int64_t)1 << 20 : (int64_t)1 << 24;
  char t_sgd[48], t_adam[48];
  snprintf(t_sgd, sizeof t_sgd, "sgd:%lld", (long long)upd_n);
  snprintf(t_adam, sizeof t_adam, "adam:%lld", (long long)upd_n);
  const char *tasks[] = {t_conv, t_add, t_sm, t_bwd[0], t_bwd[1], t_bwd[2], t_bwd[3], t_bwd[4], t_bwd[5], t_sgd, t_adam};
  enum { NTASKS = sizeof tasks / sizeof *tasks };
  bench_torch_result_t torch[NTASKS];
  bench_progress("conv2d/add/softmax, conv2d gradients, updates: PyTorch peer");
  bench_torch_run(opts, tasks, NTASKS, torch);

  bench_conv(opts, devs, ndev, &torch[0], N, C, C, HW, HW);

  bench_stats_t host;
  bool host_ok = bench_host_add(opts, (size_t)add_n, &host) == 0;
  if (!host_ok) bench_section_error(S, "the C loop peer of add failed: %s", bench_error());
  bench_stream_op(opts, devs, ndev, BENCH_OP_ADD, 1, add_n, 12.0, &torch[1], host_ok ? &host : NULL);
  bench_stream_op(opts, devs, ndev, BENCH_OP_SOFTMAX, sm, sm, 8.0, &torch[2], NULL);
  for (int i = 0; i < 6; i++) bench_conv_backward(opts, devs, ndev, &shapes[i / 2], i % 2, &torch[3 + i]);
  bench_updates(opts, devs, ndev, upd_n, &torch[9], &torch[10]);
  bench_section_note(S, "conv2d GFLOPS = 2*N*K*P*Q*C*R*S / time, each provider forced with KILN_PROVIDER-style "
                        "overrides. add GB/s counts 12 bytes per element (two reads, one write); softmax counts 8 "
                        "(one read, one write). The C loop peer is a plain loop split over all usable cores with "
                        "pthreads. conv2d_backward_input/weight: one gradient alone, GFLOPS as the forward's, "
                        "against torch.ops.aten.convolution_backward asked for that gradient only; the target "
                        "(native >= 1.0x torch) is on the CPU backend. sgd_update (momentum 0.9, weight decay 1e-4) "
                        "counts 20 bytes per element, adam_update 28; each is compared with an add of the same size "
                        "on the same device measured just before (target >= 0.8x its bytes per second), and with "
                        "torch.optim's step on one parameter.");
}
