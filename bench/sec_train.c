/* bench/sec_train.c: section 8, training kiln-train's models with libkiln-nn on every device and policy, side by side with PyTorch on the CPU (bench/torch_train.py). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#if !KILN_BENCH_NN

void bench_section_train(const bench_options_t *opts) {
  (void)opts;
  bench_section_note(BENCH_SECTION_TRAIN,
                     "libkiln-nn was not built (it needs zlib and json-c: zlib1g-dev, libjson-c-dev): section skipped");
}

#else

#include <kiln/nn.h>

enum { TRAIN_MAX_EPOCHS = 50, TRAIN_FIRST = 20 };

/* One training run: per-epoch figures, the first losses and where the ops ran. */
typedef struct train_run_t {
  bool ok;
  char why[200];
  int epochs;                    /* done */
  double rate[TRAIN_MAX_EPOCHS]; /* images per second, training only */
  double loss[TRAIN_MAX_EPOCHS];
  double test[TRAIN_MAX_EPOCHS]; /* test accuracy after the epoch */
  size_t skipped;                /* steps the loss scaler skipped, in all */
  float first[TRAIN_FIRST];
  char providers[600];
  char info[96]; /* the peer's "torch 1.13.0, 1 thread" */
  char probe[96];
} train_run_t;

/* ---- kiln -------------------------------------------------------------------------- */

typedef struct kiln_job_t {
  const char *preset;
  kiln_device_t *device;
  kiln_nn_model_t *model;
  kiln_nn_optimizer_t *opt;
  kiln_nn_loader_t *loader, *tests;
  kiln_nn_grad_scaler_t *scaler; /* f16 only */
  double base_lr;
  int schedule; /* the epochs the rate is annealed over */
} kiln_job_t;

static void providers_text(char *out, size_t size) {
  kiln_provider_use_t uses[64];
  size_t n = kiln_provider_uses(uses, 64), used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n && i < 64 && used + 1 < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%s=%s", i ? " " : "", uses[i].op,
                             uses[i].provider[0] ? uses[i].provider : "?");
}

/* The provider of one op in a providers text ("matmul=blas" -> "blas"). */
static void provider_of(const char *providers, const char *op, char *out, size_t size) {
  char key[48];
  snprintf(key, sizeof key, "%s=", op);
  out[0] = '\0';
  for (const char *p = providers; (p = strstr(p, key)) != NULL; p++)
    if (p == providers || p[-1] == ' ') {
      p += strlen(key);
      snprintf(out, size, "%.*s", (int)strcspn(p, " "), p);
      return;
    }
}

/* A few untimed steps of a throwaway model first: kernels compiled (OpenCL
 * builds programs, CLBlast its kernels, on first use), pools filled, the
 * `fastest` policy's measurements made, so the first timed epoch is like the
 * others. */
static kiln_status_t warm_up(const char *preset, kiln_device_t *device, const kiln_nn_dataset_t *train) {
  kiln_nn_model_t *model = NULL;
  kiln_nn_optimizer_t *opt = NULL;
  kiln_nn_loader_t *loader = NULL;
  kiln_nn_train_options_t to;
  kiln_nn_train_options_initialize(&to);
  to.max_steps = 3;
  kiln_nn_epoch_stats_t es;
  kiln_status_t st = kiln_nn_model_create_preset(preset, device, 1, &model);
  if (st == KILN_OK) st = kiln_nn_optimizer_create_preset(preset, model, &opt);
  if (st == KILN_OK) st = kiln_nn_loader_create(train, device, NULL, &loader);
  if (st == KILN_OK) st = kiln_nn_train_epoch(model, opt, loader, &to, &es);
  kiln_nn_loader_free(loader);
  kiln_nn_optimizer_free(opt);
  kiln_nn_model_free(model);
  return st;
}

static void kiln_job_end(kiln_job_t *job) {
  kiln_nn_loader_free(job->loader);
  kiln_nn_loader_free(job->tests);
  kiln_nn_optimizer_free(job->opt);
  kiln_nn_model_free(job->model);
  kiln_nn_grad_scaler_free(job->scaler);
  memset(job, 0, sizeof *job);
}

/* precision: KILN_F32, or KILN_BF16 / KILN_F16 for mixed precision (f16 with
 * a loss scaler at its defaults, PyTorch's GradScaler's). */
static int kiln_job_start(const char *preset, kiln_device_t *device, const kiln_nn_dataset_t *train,
                          const kiln_nn_dataset_t *test, int schedule, kiln_dtype_t precision, kiln_job_t *job,
                          train_run_t *run) {
  memset(job, 0, sizeof *job);
  memset(run, 0, sizeof *run);
  job->preset = preset;
  job->device = device;
  job->schedule = schedule;
  kiln_nn_loader_options_t lo;
  kiln_nn_loader_options_initialize(&lo);
  lo.seed = 42;
  kiln_status_t st = warm_up(preset, device, train);
  if (st == KILN_OK) st = kiln_nn_model_create_preset(preset, device, 42, &job->model);
  if (st == KILN_OK) st = kiln_nn_model_set_precision(job->model, precision);
  if (st == KILN_OK && precision == KILN_F16) st = kiln_nn_grad_scaler_create(NULL, &job->scaler);
  if (st == KILN_OK) st = kiln_nn_optimizer_create_preset(preset, job->model, &job->opt);
  if (st == KILN_OK) st = kiln_nn_loader_create(train, device, &lo, &job->loader);
  lo.shuffle = false;
  lo.batch_size = 1000;
  if (st == KILN_OK) st = kiln_nn_loader_create(test, device, &lo, &job->tests);
  if (st != KILN_OK) {
    snprintf(run->why, sizeof run->why, "%s", kiln_last_error());
    kiln_job_end(job);
    return -1;
  }
  job->base_lr = kiln_nn_optimizer_lr(job->opt);
  kiln_provider_uses_reset();
  run->ok = true;
  return 0;
}

/* Epoch e (from 0): trained, then evaluated on the test set. */
static int kiln_job_epoch(kiln_job_t *job, train_run_t *run) {
  const int e = run->epochs;
  kiln_nn_train_options_t to;
  kiln_nn_train_options_initialize(&to);
  to.scaler = job->scaler;
  if (e == 0) {
    to.step_losses = run->first;
    to.step_loss_count = TRAIN_FIRST;
  }
  kiln_nn_epoch_stats_t es;
  double test_loss = 0, acc = 0;
  kiln_status_t st = kiln_nn_optimizer_set_lr(job->opt, kiln_nn_lr_cosine(job->base_lr, (uint64_t)e, (uint64_t)job->schedule));
  if (st == KILN_OK) st = kiln_nn_train_epoch(job->model, job->opt, job->loader, &to, &es);
  if (st == KILN_OK) st = kiln_nn_evaluate(job->model, job->tests, &test_loss, &acc);
  providers_text(run->providers, sizeof run->providers);
  if (st != KILN_OK) {
    snprintf(run->why, sizeof run->why, "%s", kiln_last_error());
    run->ok = false;
    return -1;
  }
  run->rate[e] = es.images_per_s;
  run->loss[e] = es.loss;
  run->test[e] = acc;
  run->skipped += es.skipped;
  run->epochs = e + 1;
  bench_progress("train %s on %s (%s): epoch %d  loss %.4f  test %.4f  %.0f images/s", job->preset,
                 kiln_device_selector(job->device), kiln_policy_name(kiln_policy()), e + 1, es.loss, acc,
                 es.images_per_s);
  return 0;
}

/* ---- PyTorch, one epoch at a time ----------------------------------------------------- */

static double json_number(const char *obj, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = strstr(obj, pat);
  return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static void json_string(const char *obj, const char *key, char *out, size_t size) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": \"", key);
  const char *p = strstr(obj, pat);
  out[0] = '\0';
  if (p) {
    p += strlen(pat);
    snprintf(out, size, "%.*s", (int)strcspn(p, "\""), p);
  }
}

/* bench/torch_train.py --serve: set up once, then one epoch per "epoch" line. */
typedef struct torch_child_t {
  pid_t pid;
  FILE *to, *from;
  const char *preset;
  void (*sigpipe)(int); /* the handler before the child: restored at the end */
} torch_child_t;

/* The next JSON line from the child; false at its end. */
static bool torch_line(torch_child_t *c, char **line, size_t *cap) {
  while (c->from && getline(line, cap, c->from) >= 0)
    if ((*line)[0] == '{') return true;
  return false;
}

/* autocast: NULL, or "bf16" for torch.autocast("cpu", dtype=torch.bfloat16). */
static int torch_start(const char *preset, int epochs, size_t limit, size_t test_limit, const char *autocast,
                       torch_child_t *c, train_run_t *run) {
  memset(c, 0, sizeof *c);
  memset(run, 0, sizeof *run);
  c->preset = preset;
  c->sigpipe = SIG_DFL;
  const char *script = bench_script_path("torch_train.py");
  const char *python = bench_python();
  if (!script || access(python, X_OK) != 0) {
    snprintf(run->why, sizeof run->why, "%s", !script ? "bench/torch_train.py not found (set KILN_BENCH_SCRIPTS to its folder)"
                                                      : "no Python to run bench/torch_train.py (KILN_BENCH_PYTHON)");
    return -1;
  }
  char e[16], l[32], tl[32];
  snprintf(e, sizeof e, "%d", epochs);
  snprintf(l, sizeof l, "%zu", limit);
  snprintf(tl, sizeof tl, "%zu", test_limit);
  const char *argv[] = {python, script, "--serve", "--model", preset, "--epochs", e, "--limit", l, "--test-limit", tl,
                        "--autocast", autocast ? autocast : "none", NULL};
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) {
    snprintf(run->why, sizeof run->why, "pipe() failed: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  c->pid = fork();
  if (c->pid < 0) {
    snprintf(run->why, sizeof run->why, "fork() failed: %s", strerror(errno));
    return -1;
  }
  if (c->pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "kiln-bench: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  c->to = fdopen(in[1], "w");
  c->from = fdopen(out[0], "r");
  /* A child that died must not kill the bench with SIGPIPE. */
  c->sigpipe = signal(SIGPIPE, SIG_IGN);
  char *line = NULL;
  size_t cap = 0;
  while (torch_line(c, &line, &cap)) {
    if (strstr(line, "\"ready\": true")) {
      json_string(line, "info", run->info, sizeof run->info);
      run->ok = true;
      break;
    }
    json_string(line, "error", run->why, sizeof run->why);
  }
  free(line);
  if (!run->ok && !run->why[0]) snprintf(run->why, sizeof run->why, "torch_train.py stopped before it was ready");
  return run->ok ? 0 : -1;
}

static int torch_epoch(torch_child_t *c, train_run_t *run) {
  if (!run->ok) return -1;
  fputs("epoch\n", c->to);
  fflush(c->to);
  char *line = NULL;
  size_t cap = 0;
  int rc = -1;
  while (torch_line(c, &line, &cap)) {
    if (!strstr(line, "\"ok\": true")) {
      json_string(line, "error", run->why, sizeof run->why);
      break;
    }
    int e = (int)json_number(line, "epoch");
    if (e != run->epochs + 1) continue;
    run->rate[e - 1] = json_number(line, "images_per_s");
    run->loss[e - 1] = json_number(line, "loss");
    run->test[e - 1] = json_number(line, "test_acc");
    run->epochs = e;
    bench_progress("train %s on the host (PyTorch): epoch %d  loss %.4f  test %.4f  %.0f images/s", c->preset, e,
                   run->loss[e - 1], run->test[e - 1], run->rate[e - 1]);
    rc = 0;
    break;
  }
  free(line);
  if (rc != 0) {
    run->ok = false;
    if (!run->why[0]) snprintf(run->why, sizeof run->why, "torch_train.py stopped at epoch %d", run->epochs + 1);
  }
  return rc;
}

static void torch_end(torch_child_t *c, train_run_t *run) {
  if (c->to) fclose(c->to); /* the end of input: it stops and says what it probed */
  char *line = NULL;
  size_t cap = 0;
  while (torch_line(c, &line, &cap))
    if (strstr(line, "\"done\": true")) {
      const double one = json_number(line, "probe_one"), all = json_number(line, "probe_all");
      if (one > 0 && all > 0)
        snprintf(run->probe, sizeof run->probe, "probe: 1 thread %.0f, %.0f threads %.0f images/s", one,
                 json_number(line, "cores"), all);
      else snprintf(run->probe, sizeof run->probe, "no thread probe (one core)");
    }
  free(line);
  if (c->from) fclose(c->from);
  if (c->pid > 0)
    while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR) {
    }
  if (c->sigpipe != SIG_ERR) signal(SIGPIPE, c->sigpipe);
  memset(c, 0, sizeof *c);
}

/* ---- rows ---------------------------------------------------------------------------- */

static bench_stats_t epoch_stats(const train_run_t *r) {
  double v[TRAIN_MAX_EPOCHS];
  for (int e = 0; e < r->epochs; e++) v[e] = r->rate[e];
  bench_stats_t st;
  bench_stats_of(v, r->epochs, &st);
  st.iters = 1;
  return st;
}

static void note_epochs(bench_row_t *row, const train_run_t *r) {
  char text[160];
  size_t used = 0;
  for (int e = 0; e < r->epochs && used + 1 < sizeof text; e++)
    used += (size_t)snprintf(text + used, sizeof text - used, "%s%.1fk", e ? " " : "", r->rate[e] / 1e3);
  bench_row_note(row, "per epoch: %s", text);
}

/* Epochs of a run: the targets are stated after 10 epochs on the CPU at the
 * default policy, which runs them, its epochs alternating with PyTorch's; the
 * other policies and GPUs run the first 2 epochs of the same 10-epoch recipe,
 * OpenCL CPU devices (PoCL: 0.6k-1.2k images/s here) the first one, each
 * compared with PyTorch's epoch of the same number. KILN_BENCH_TRAIN_EPOCHS
 * sets them all. */
static int epochs_for(const bench_options_t *opts, bool target, const bench_device_t *d) {
  const char *env = getenv("KILN_BENCH_TRAIN_EPOCHS");
  if (env && atoi(env) > 0) return atoi(env) > TRAIN_MAX_EPOCHS ? TRAIN_MAX_EPOCHS : atoi(env);
  if (opts->quick) return 1;
  if (target) return 10;
  return !d || !strcmp(d->info.backend, "cpu") || d->info.type == KILN_DEVICE_GPU ? 2 : 1;
}

typedef struct model_ctx_t {
  const bench_options_t *opts;
  const char *preset;
  const kiln_nn_dataset_t *train, *test;
  int schedule;
  train_run_t torch;
  train_run_t ref; /* the first kiln run: the first losses the others must repeat */
  bool have_ref;
} model_ctx_t;

/* The rows of one kiln run: images per second (with the per-epoch ratio to
 * PyTorch when the epochs alternated), test accuracy, first losses. */
static void add_rows(model_ctx_t *m, const bench_device_t *d, kiln_policy_t policy, const train_run_t *run,
                     bool target, bool paired) {
  const int S = BENCH_SECTION_TRAIN;
  const char *policy_name = kiln_policy_name(policy);
  char name[64], params[64], provider[48], mm[16], conv[16];
  snprintf(name, sizeof name, "train %s: images/s", m->preset);
  provider_of(run->providers, "matmul", mm, sizeof mm);
  provider_of(run->providers, "conv2d", conv, sizeof conv);
  snprintf(provider, sizeof provider, "%s: matmul %s%s%s", policy_name, mm[0] ? mm : "-", conv[0] ? ", conv " : "",
           conv);
  snprintf(params, sizeof params, "batch 100, %d epoch%s", run->epochs, run->epochs == 1 ? "" : "s");
  bench_row_t row = bench_row_make(S, name, d->info.selector, provider, params, "img/s", true);
  if (!run->ok) {
    row.valid = false;
    bench_row_note(&row, "%s", run->why);
    bench_section_error(S, "train %s on %s (%s): %s", m->preset, d->info.selector, policy_name, run->why);
    bench_add(&row);
    return;
  }
  row.st = epoch_stats(run);
  const train_run_t *t = &m->torch;
  bench_row_compare(&row, "torch", t->ok ? epoch_stats(t).median : NAN);
  if (paired && t->ok && t->epochs >= run->epochs) {
    /* Each kiln epoch against the PyTorch epoch run beside it: the machine's
     * load changes, and a pair shares it. */
    double ratios[TRAIN_MAX_EPOCHS];
    for (int e = 0; e < run->epochs; e++) ratios[e] = run->rate[e] / t->rate[e];
    bench_stats_t rs;
    bench_stats_of(ratios, run->epochs, &rs);
    row.cmp[row.ncmp - 1].ratio = rs.median;
    bench_row_note(&row, "ratio: median of %d per-epoch ratios (%.2f..%.2f), epochs alternating with PyTorch's",
                   run->epochs, rs.min, rs.max);
  }
  if (target) bench_row_target_ratio(&row, 1.0);
  note_epochs(&row, run);
  bench_add(&row);
  bench_section_note(S, "%s on %s, policy %s, ran: %s", m->preset, d->info.selector, policy_name, run->providers);

  /* Test accuracy after as many epochs of the same recipe as PyTorch's. */
  snprintf(name, sizeof name, "train %s: test accuracy", m->preset);
  row = bench_row_make(S, name, d->info.selector, policy_name, params, "%", true);
  row.st.median = row.st.min = row.st.max = row.st.q1 = row.st.q3 = 100 * run->test[run->epochs - 1];
  row.st.samples = 1;
  const bool comparable = t->ok && t->epochs >= run->epochs;
  const double torch_acc = comparable ? 100 * t->test[run->epochs - 1] : NAN;
  bench_row_compare(&row, "torch", torch_acc);
  if (target && run->epochs == 10) {
    const double floor = !strcmp(m->preset, "mlp") ? 88.0 : 90.0;
    snprintf(row.target, sizeof row.target, ">= %.0f%%, within 0.5 of torch", floor);
    row.met = isfinite(torch_acc) ? row.st.median >= floor && fabs(row.st.median - torch_acc) <= 0.5 : -1;
  }
  bench_row_note(&row, "loss of epoch %d %.4f (torch %.4f)", run->epochs, run->loss[run->epochs - 1],
                 comparable ? t->loss[run->epochs - 1] : NAN);
  bench_add(&row);

  /* The same seed and recipe: the same first losses everywhere. */
  if (!m->have_ref) {
    m->ref = *run;
    m->have_ref = true;
    return;
  }
  double worst = 0;
  int at = 0;
  for (int k = 0; k < TRAIN_FIRST; k++) {
    double rel = fabs((double)run->first[k] - m->ref.first[k]) / fabs((double)m->ref.first[k]);
    if (!(rel <= worst)) {
      worst = rel;
      at = k;
    }
  }
  snprintf(name, sizeof name, "train %s: first %d losses", m->preset, TRAIN_FIRST);
  row = bench_row_make(S, name, d->info.selector, policy_name, "vs the first run", "rel. diff", false);
  row.st.median = row.st.min = row.st.max = row.st.q1 = row.st.q3 = worst;
  row.st.samples = 1;
  bench_row_target_max(&row, 1e-4, "<= 1e-4 relative");
  bench_row_note(&row, "largest at step %d: %.8g vs %.8g", at + 1, (double)run->first[at], (double)m->ref.first[at]);
  bench_add(&row);
}

/* Mixed precision on cpu:0 at the default policy (issue 21): the recipe's
 * epochs in bf16 and in f16 (with the loss scaler), bf16 alternating with
 * PyTorch's torch.autocast("cpu", dtype=torch.bfloat16) training of the
 * same model. Rows: images per second against kiln's f32 run above (target
 * >= 1.3x for bf16) and against PyTorch's autocast run; test accuracy
 * against f32's after the same epochs (bf16 within 0.5 points, f16 within
 * 1, with the steps the scaler skipped). */
static void train_precision(model_ctx_t *m, const bench_device_t *d, const train_run_t *f32_run, size_t limit,
                            size_t test_limit) {
  const int S = BENCH_SECTION_TRAIN;
  static const kiln_dtype_t precisions[2] = {KILN_BF16, KILN_F16};
  static train_run_t run, peer;
  const bool target = !m->opts->quick && f32_run->epochs == m->schedule;
  for (int pi = 0; pi < 2; pi++) {
    const kiln_dtype_t precision = precisions[pi];
    const char *pname = kiln_dtype_name(precision);
    torch_child_t child;
    memset(&child, 0, sizeof child);
    memset(&peer, 0, sizeof peer);
    if (precision == KILN_BF16) {
      bench_progress("train %s %s: starting PyTorch with torch.autocast (bf16)", m->preset, pname);
      torch_start(m->preset, m->schedule, limit, test_limit, "bf16", &child, &peer);
    } else {
      snprintf(peer.why, sizeof peer.why, "PyTorch's autocast on the CPU takes bf16 only");
    }
    kiln_set_policy(KILN_POLICY_VENDOR);
    kiln_job_t job;
    if (kiln_job_start(m->preset, d->device, m->train, m->test, m->schedule, precision, &job, &run) == 0) {
      for (int e = 0; e < f32_run->epochs && run.ok; e++) {
        if (e % 2 == 0 && peer.ok) torch_epoch(&child, &peer);
        kiln_job_epoch(&job, &run);
        if (e % 2 == 1 && peer.ok) torch_epoch(&child, &peer);
      }
      kiln_job_end(&job);
    }
    while (peer.ok && peer.epochs < f32_run->epochs) torch_epoch(&child, &peer);
    if (precision == KILN_BF16) torch_end(&child, &peer);

    char name[64], params[64];
    snprintf(name, sizeof name, "train %s %s: images/s", m->preset, pname);
    snprintf(params, sizeof params, "batch 100, %d epochs", f32_run->epochs);
    if (precision == KILN_BF16) {
      bench_row_t row = bench_row_make(S, name, "host", "torch.autocast bf16", params, "img/s", true);
      row.is_peer = true;
      if (peer.ok) {
        row.st = epoch_stats(&peer);
        note_epochs(&row, &peer);
        bench_row_note(&row, "%s; test accuracy %.2f%%", peer.info, 100 * peer.test[peer.epochs - 1]);
      } else {
        row.valid = false;
        bench_row_note(&row, "%s", peer.why);
      }
      bench_add(&row);
    }
    bench_row_t row = bench_row_make(S, name, d->info.selector, pname, params, "img/s", true);
    if (!run.ok) {
      row.valid = false;
      bench_row_note(&row, "%s", run.why);
      bench_section_error(S, "train %s %s on %s: %s", m->preset, pname, d->info.selector, run.why);
      bench_add(&row);
      continue;
    }
    row.st = epoch_stats(&run);
    bench_row_compare(&row, "kiln f32", epoch_stats(f32_run).median);
    if (target && precision == KILN_BF16) bench_row_target_ratio(&row, 1.3);
    if (peer.ok && peer.epochs >= run.epochs) bench_row_compare(&row, "torch.autocast", epoch_stats(&peer).median);
    note_epochs(&row, &run);
    bench_add(&row);

    snprintf(name, sizeof name, "train %s %s: test accuracy", m->preset, pname);
    row = bench_row_make(S, name, d->info.selector, pname, params, "%", true);
    row.st.median = row.st.min = row.st.max = row.st.q1 = row.st.q3 = 100 * run.test[run.epochs - 1];
    row.st.samples = 1;
    const double f32_acc = 100 * f32_run->test[run.epochs - 1];
    bench_row_compare(&row, "kiln f32", f32_acc);
    if (target) {
      const double within = precision == KILN_BF16 ? 0.5 : 1.0;
      snprintf(row.target, sizeof row.target, "within %.1f of kiln f32", within);
      row.met = fabs(row.st.median - f32_acc) <= within;
    }
    bench_row_note(&row, "loss of epoch %d %.4f (f32 %.4f)%s", run.epochs, run.loss[run.epochs - 1],
                   f32_run->loss[run.epochs - 1], precision == KILN_F16 ? "; loss scaler on" : "");
    if (precision == KILN_F16) bench_row_note(&row, "%zu steps skipped by the loss scaler", run.skipped);
    bench_add(&row);
  }
  bench_section_note(S, "Mixed precision (%s on cpu:0, default policy): bf16 and f16 forward and backward over f32 "
                        "master weights, f16 with the loss scaler (GradScaler's rules), the same recipe and epochs "
                        "as the f32 run; bf16's epochs alternate with PyTorch's torch.autocast(\"cpu\", "
                        "dtype=torch.bfloat16) training (PyTorch's CPU autocast has no f16).",
                     m->preset);
}

static void train_model(const bench_options_t *opts, const char *preset, const kiln_nn_dataset_t *train,
                        const kiln_nn_dataset_t *test, size_t limit, size_t test_limit) {
  const int S = BENCH_SECTION_TRAIN;
  const bench_device_t *devs;
  const size_t ndev = bench_devices(&devs);
  static model_ctx_t m;
  memset(&m, 0, sizeof m);
  m.opts = opts;
  m.preset = preset;
  m.train = train;
  m.test = test;
  m.schedule = epochs_for(opts, true, NULL);
  const bench_device_t *first_cpu = NULL;
  for (size_t i = 0; i < ndev && !first_cpu; i++)
    if (!strcmp(devs[i].info.backend, "cpu")) first_cpu = &devs[i];

  /* The target run: cpu:0 at the default policy, its epochs alternating with
   * PyTorch's (which first probed its thread counts). */
  static train_run_t run;
  torch_child_t child;
  bench_progress("train %s: starting PyTorch (it probes one thread and all cores first)", preset);
  torch_start(preset, m.schedule, limit, test_limit, NULL, &child, &m.torch);
  if (first_cpu) {
    kiln_set_policy(KILN_POLICY_VENDOR);
    kiln_job_t job;
    if (kiln_job_start(preset, first_cpu->device, train, test, m.schedule, KILN_F32, &job, &run) == 0) {
      for (int e = 0; e < m.schedule && run.ok; e++) {
        /* Who goes first alternates too. */
        if (e % 2 == 0) torch_epoch(&child, &m.torch);
        kiln_job_epoch(&job, &run);
        if (e % 2 == 1) torch_epoch(&child, &m.torch);
      }
      kiln_job_end(&job);
    }
  }
  while (m.torch.ok && m.torch.epochs < m.schedule) torch_epoch(&child, &m.torch);
  torch_end(&child, &m.torch);

  char name[64], params[64];
  snprintf(name, sizeof name, "train %s: images/s", preset);
  snprintf(params, sizeof params, "batch 100, %d epochs", m.torch.epochs);
  bench_row_t row = bench_row_make(S, name, "host", m.torch.info[0] ? m.torch.info : "torch", params, "img/s", true);
  row.is_peer = true;
  if (m.torch.ok) {
    row.st = epoch_stats(&m.torch);
    note_epochs(&row, &m.torch);
    bench_row_note(&row, "%s; test accuracy %.2f%%", m.torch.probe, 100 * m.torch.test[m.torch.epochs - 1]);
  } else {
    row.valid = false;
    bench_row_note(&row, "%s", m.torch.why);
  }
  bench_add(&row);
  /* --quick trains 20 steps: too few to hold a target to. */
  if (first_cpu) add_rows(&m, first_cpu, KILN_POLICY_VENDOR, &run, !opts->quick, true);
  if (first_cpu && run.ok) {
    static train_run_t f32_run;
    f32_run = run;
    train_precision(&m, first_cpu, &f32_run, limit, test_limit);
  }

  /* Every other device and policy: the first epochs of the same recipe. */
  static const kiln_policy_t policies[3] = {KILN_POLICY_VENDOR, KILN_POLICY_PORTABLE, KILN_POLICY_FASTEST};
  for (size_t i = 0; i < ndev; i++) {
    const bench_device_t *d = &devs[i];
    if (!bench_heavy_ok(S, d)) continue;
    for (int pi = 0; pi < 3; pi++) {
      if (d == first_cpu && policies[pi] == KILN_POLICY_VENDOR) continue;
      /* --quick proves the section runs: `fastest` measures every candidate
       * first, and adds nothing to that. */
      if (opts->quick && policies[pi] == KILN_POLICY_FASTEST) continue;
      kiln_set_policy(policies[pi]);
      kiln_job_t job;
      const int epochs = epochs_for(opts, false, d);
      if (kiln_job_start(preset, d->device, train, test, m.schedule, KILN_F32, &job, &run) == 0) {
        for (int e = 0; e < epochs && run.ok; e++) kiln_job_epoch(&job, &run);
        kiln_job_end(&job);
      }
      add_rows(&m, d, policies[pi], &run, false, false);
    }
  }
  bench_reset_providers();
}

void bench_section_train(const bench_options_t *opts) {
  const int S = BENCH_SECTION_TRAIN;
  kiln_nn_dataset_t *train = NULL, *test = NULL;
  if (kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TRAIN, &train) != KILN_OK ||
      kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TEST, &test) != KILN_OK) {
    bench_section_note(S, "Fashion-MNIST is not there (%s): section skipped", kiln_last_error());
    kiln_nn_dataset_free(train);
    return;
  }
  /* Quick: a subset, to prove the section runs. */
  size_t limit = 0, test_limit = 0;
  if (opts->quick) {
    limit = 2000;
    test_limit = 1000;
    kiln_nn_dataset_info_t info;
    kiln_nn_dataset_t *part = NULL;
    kiln_nn_dataset_info(train, &info);
    if (kiln_nn_dataset_create(limit, info.rows, info.cols, info.classes, kiln_nn_dataset_pixels(train),
                               kiln_nn_dataset_labels(train), &part) == KILN_OK) {
      kiln_nn_dataset_free(train);
      train = part;
    }
    if (kiln_nn_dataset_create(test_limit, info.rows, info.cols, info.classes, kiln_nn_dataset_pixels(test),
                               kiln_nn_dataset_labels(test), &part) == KILN_OK) {
      kiln_nn_dataset_free(test);
      test = part;
    }
  }
  bench_device_t opencl_cpu;
  memset(&opencl_cpu, 0, sizeof opencl_cpu);
  opencl_cpu.info.backend = "opencl";
  opencl_cpu.info.type = KILN_DEVICE_CPU;
  bench_section_note(S,
                     "kiln-train's recipes (docs/nn.md): batch 100, seed 42; mlp 784-1000-10 with SGD (lr 0.05, "
                     "momentum 0.9), lenet with Adam (lr 0.002); the rate annealed per epoch by a cosine over %d "
                     "epochs. PyTorch (bench/torch_train.py) trains the same models with the same recipe and "
                     "initialisation scheme on the CPU.",
                     epochs_for(opts, true, NULL));
  bench_section_note(S,
                     "PyTorch runs at the faster of one thread and all cores (it probes both first); its thread "
                     "count governs its own kernels, while its GEMMs go to Debian's OpenBLAS, which uses every core "
                     "whatever the count.");
  bench_section_note(S,
                     "On cpu:0 at the default policy kiln's epochs alternate with PyTorch's (the load of a shared "
                     "machine changes; a pair shares it) and the ratio is the median of the per-epoch ratios. The "
                     "other runs train the first epochs of the same recipe (%d on the CPU and GPUs, %d on OpenCL "
                     "CPU devices) and are compared with PyTorch's epoch of that number.",
                     epochs_for(opts, false, NULL), epochs_for(opts, false, &opencl_cpu));
  bench_section_note(S, "Images per second count training only; the accuracy is measured on the test set after "
                        "the last epoch.");
  train_model(opts, "mlp", train, test, limit, test_limit);
  train_model(opts, "lenet", train, test, limit, test_limit);
  kiln_nn_dataset_free(train);
  kiln_nn_dataset_free(test);
}

#endif
