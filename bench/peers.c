/* bench/peers.c: host-side peers (OpenBLAS, a parallel C loop, memcpy), PyTorch through torch_peer.py, child processes. */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* ---- OpenBLAS ---------------------------------------------------------------- */

typedef struct bench_sgemm_ctx_t {
  int n;
  float *a, *b, *c;
} bench_sgemm_ctx_t;

static int bench_sgemm_run(void *ctx, long iters) {
  bench_sgemm_ctx_t *g = ctx;
  for (long i = 0; i < iters; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->a, g->n, g->b, g->n, 0.0f, g->c,
                g->n);
  return 0;
}

static void bench_fill_random(float *p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (float)(x >> 8) / 8388608.0f - 1.0f;
  }
}

int bench_openblas_sgemm(const bench_options_t *opts, int n, bench_stats_t *out) {
  size_t count = (size_t)n * (size_t)n;
  bench_sgemm_ctx_t g = {n, malloc(count * sizeof(float)), malloc(count * sizeof(float)), malloc(count * sizeof(float))};
  int rc = -1;
  if (!g.a || !g.b || !g.c) {
    bench_set_error("out of host memory for three %dx%d matrices", n, n);
  } else {
    bench_fill_random(g.a, count, 1);
    bench_fill_random(g.b, count, 2);
    memset(g.c, 0, count * sizeof(float));
    rc = bench_measure(opts, bench_sgemm_run, &g, out);
  }
  free(g.a);
  free(g.b);
  free(g.c);
  return rc;
}

typedef struct bench_dgemm_ctx_t {
  int n;
  double *a, *b, *c;
} bench_dgemm_ctx_t;

static int bench_dgemm_run(void *ctx, long iters) {
  bench_dgemm_ctx_t *g = ctx;
  for (long i = 0; i < iters; i++)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0, g->a, g->n, g->b, g->n, 0.0, g->c,
                g->n);
  return 0;
}

int bench_openblas_dgemm(const bench_options_t *opts, int n, bench_stats_t *out) {
  size_t count = (size_t)n * (size_t)n;
  bench_dgemm_ctx_t g = {n, malloc(count * sizeof(double)), malloc(count * sizeof(double)),
                         calloc(count, sizeof(double))};
  float *tmp = malloc(count * sizeof(float));
  int rc = -1;
  if (!g.a || !g.b || !g.c || !tmp) {
    bench_set_error("out of host memory for three %dx%d f64 matrices", n, n);
  } else {
    bench_fill_random(tmp, count, 1);
    for (size_t i = 0; i < count; i++) g.a[i] = tmp[i];
    bench_fill_random(tmp, count, 2);
    for (size_t i = 0; i < count; i++) g.b[i] = tmp[i];
    rc = bench_measure(opts, bench_dgemm_run, &g, out);
  }
  free(tmp);
  free(g.a);
  free(g.b);
  free(g.c);
  return rc;
}

const char *bench_openblas_describe(void) {
  static char text[256];
  snprintf(text, sizeof text, "OpenBLAS cblas_sgemm (%s; core %s; %d threads)", openblas_get_config(),
           openblas_get_corename(), openblas_get_num_threads());
  return text;
}

int bench_host_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* ---- a parallel C loop ------------------------------------------------------------ */

typedef struct bench_add_part_t {
  const float *a, *b;
  float *c;
  size_t n;
  long iters;
  bool init;
} bench_add_part_t;

static void *bench_add_thread(void *arg) {
  bench_add_part_t *p = arg;
  if (p->init) {
    /* First touch from the thread that later streams the pages. */
    for (size_t i = 0; i < p->n; i++) {
      ((float *)p->a)[i] = (float)(i & 1023);
      ((float *)p->b)[i] = 1.0f;
      p->c[i] = 0.0f;
    }
    return NULL;
  }
  for (long it = 0; it < p->iters; it++) {
    const float *restrict a = p->a, *restrict b = p->b;
    float *restrict c = p->c;
    for (size_t i = 0; i < p->n; i++) c[i] = a[i] + b[i];
    __asm__ __volatile__("" ::: "memory");
  }
  return NULL;
}

typedef struct bench_add_ctx_t {
  float *a, *b, *c;
  size_t n;
  int threads;
} bench_add_ctx_t;

static int bench_add_spread(bench_add_ctx_t *ctx, long iters, bool init) {
  pthread_t tids[256];
  bench_add_part_t parts[256];
  int t = ctx->threads;
  size_t chunk = (ctx->n + (size_t)t - 1) / (size_t)t;
  chunk = (chunk + 15) & ~(size_t)15;
  int started = 0;
  for (int i = 0; i < t; i++) {
    size_t lo = (size_t)i * chunk, hi = lo + chunk > ctx->n ? ctx->n : lo + chunk;
    if (lo >= ctx->n) break;
    parts[i] = (bench_add_part_t){ctx->a + lo, ctx->b + lo, ctx->c + lo, hi - lo, iters, init};
    if (pthread_create(&tids[started], NULL, bench_add_thread, &parts[i]) == 0) started++;
    else bench_add_thread(&parts[i]); /* no thread to spare: do the share here */
  }
  for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
  return 0;
}

static int bench_add_run(void *ctx, long iters) { return bench_add_spread(ctx, iters, false); }

int bench_host_add(const bench_options_t *opts, size_t n, bench_stats_t *out) {
  bench_add_ctx_t ctx = {aligned_alloc(64, (n * 4 + 63) & ~(size_t)63), aligned_alloc(64, (n * 4 + 63) & ~(size_t)63),
                         aligned_alloc(64, (n * 4 + 63) & ~(size_t)63), n, bench_host_cores()};
  if (ctx.threads > 256) ctx.threads = 256;
  int rc = -1;
  if (!ctx.a || !ctx.b || !ctx.c) {
    bench_set_error("out of host memory for three arrays of %zu floats", n);
  } else {
    bench_add_spread(&ctx, 1, true);
    rc = bench_measure(opts, bench_add_run, &ctx, out);
  }
  free(ctx.a);
  free(ctx.b);
  free(ctx.c);
  return rc;
}

typedef struct bench_memcpy_ctx_t {
  void *src, *dst;
  size_t bytes;
} bench_memcpy_ctx_t;

static int bench_memcpy_run(void *ctx, long iters) {
  bench_memcpy_ctx_t *m = ctx;
  for (long i = 0; i < iters; i++) {
    memcpy(m->dst, m->src, m->bytes);
    __asm__ __volatile__("" ::: "memory");
  }
  return 0;
}

int bench_host_memcpy(const bench_options_t *opts, size_t bytes, bench_stats_t *out) {
  bench_memcpy_ctx_t m = {malloc(bytes), malloc(bytes), bytes};
  int rc = -1;
  if (!m.src || !m.dst) {
    bench_set_error("out of host memory for two buffers of %zu bytes", bytes);
  } else {
    memset(m.src, 1, bytes);
    memset(m.dst, 2, bytes);
    rc = bench_measure(opts, bench_memcpy_run, &m, out);
  }
  free(m.src);
  free(m.dst);
  return rc;
}

/* ---- child processes -------------------------------------------------------------- */

int bench_spawn(const char *const *argv, const char *const *env, char **out_text, double *out_wall_s) {
  if (out_text) *out_text = NULL;
  if (access(argv[0], X_OK) != 0) {
    bench_set_error("cannot run %s: %s", argv[0], strerror(errno));
    return -1;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    bench_set_error("pipe() failed: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  double t0 = bench_now();
  pid_t pid = fork();
  if (pid < 0) {
    bench_set_error("fork() failed: %s", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    for (const char *const *e = env; e && *e; e++) {
      const char *eq = strchr(*e, '=');
      if (eq) {
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
        setenv(name, eq + 1, 1);
      } else {
        unsetenv(*e);
      }
    }
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "kiln-bench: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  size_t cap = 4096, len = 0;
  char *text = malloc(cap);
  for (;;) {
    if (text && len + 1024 > cap) {
      char *grown = realloc(text, cap * 2);
      if (!grown) {
        free(text);
        text = NULL;
      } else {
        text = grown;
        cap *= 2;
      }
    }
    char sink[1024];
    ssize_t got = text ? read(fds[0], text + len, cap - len - 1) : read(fds[0], sink, sizeof sink);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (text) len += (size_t)got;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (out_wall_s) *out_wall_s = bench_now() - t0;
  if (text) text[len] = 0;
  if (out_text) *out_text = text;
  else free(text);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int bench_run_self(const bench_options_t *opts, const char *const *env, const char *const *args, char **out_text,
                   double *out_wall_s) {
  const char *argv[32];
  size_t n = 0;
  argv[n++] = opts->self;
  for (const char *const *a = args; *a && n + 1 < 32; a++) argv[n++] = *a;
  argv[n] = NULL;
  return bench_spawn(argv, env, out_text, out_wall_s);
}

/* ---- scripts and PyTorch ------------------------------------------------------------ */

#ifndef KILN_BENCH_SOURCE_DIR
#define KILN_BENCH_SOURCE_DIR ""
#endif
#ifndef KILN_BENCH_DATA_DIR
#define KILN_BENCH_DATA_DIR ""
#endif

const char *bench_script_path(const char *name) {
  static _Thread_local char path[4096];
  const char *dirs[] = {getenv("KILN_BENCH_SCRIPTS"), KILN_BENCH_SOURCE_DIR, KILN_BENCH_DATA_DIR};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    if (!dirs[i] || !dirs[i][0]) continue;
    snprintf(path, sizeof path, "%s/%s", dirs[i], name);
    if (access(path, R_OK) == 0) return path;
  }
  return NULL;
}

const char *bench_python(void) {
  const char *p = getenv("KILN_BENCH_PYTHON");
  return p && *p ? p : "/usr/bin/python3";
}

/* The number after "key": in a flat JSON object, NaN when absent. */
static double bench_json_number(const char *obj, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(obj, pat);
  if (!p) return NAN;
  p += strlen(pat);
  while (*p == ' ') p++;
  if (!strncmp(p, "null", 4)) return NAN;
  return strtod(p, NULL);
}

static void bench_json_string(const char *obj, const char *key, char *out, size_t size) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  out[0] = 0;
  const char *p = strstr(obj, pat);
  if (!p) return;
  p += strlen(pat);
  while (*p == ' ') p++;
  if (*p != '"') return;
  size_t n = 0;
  for (p++; *p && *p != '"' && n + 1 < size; p++) {
    if (*p == '\\' && p[1]) p++;
    out[n++] = *p;
  }
  out[n] = 0;
}

void bench_torch_run(const bench_options_t *opts, const char *const *tasks, int ntasks, bench_torch_result_t *out) {
  for (int i = 0; i < ntasks; i++) {
    memset(&out[i], 0, sizeof out[i]);
    snprintf(out[i].why, sizeof out[i].why, "torch_peer.py gave no answer for %s", tasks[i]);
  }
  const char *script = bench_script_path("torch_peer.py");
  if (!script) {
    for (int i = 0; i < ntasks; i++)
      snprintf(out[i].why, sizeof out[i].why, "bench/torch_peer.py not found (set KILN_BENCH_SCRIPTS to its folder)");
    return;
  }
  char reps[16], warm[16], min_time[32];
  snprintf(reps, sizeof reps, "%d", opts->reps);
  snprintf(warm, sizeof warm, "%d", opts->warmup);
  snprintf(min_time, sizeof min_time, "%g", opts->min_sample_s);
  const char *argv[64];
  int n = 0;
  argv[n++] = bench_python();
  argv[n++] = script;
  argv[n++] = "--reps";
  argv[n++] = reps;
  argv[n++] = "--warmup";
  argv[n++] = warm;
  argv[n++] = "--min-time";
  argv[n++] = min_time;
  for (int i = 0; i < ntasks && n + 1 < 64; i++) argv[n++] = tasks[i];
  argv[n] = NULL;
  char *text = NULL;
  int rc = bench_spawn(argv, NULL, &text, NULL);
  if (rc != 0 && !text) {
    for (int i = 0; i < ntasks; i++)
      snprintf(out[i].why, sizeof out[i].why, "%s", rc < 0 ? bench_error() : "torch_peer.py failed");
    return;
  }
  char *rest = text, *line;
  while (rest && (line = strsep(&rest, "\n")) != NULL) {
    if (line[0] != '{') continue;
    char task[96];
    bench_json_string(line, "task", task, sizeof task);
    for (int i = 0; i < ntasks; i++) {
      if (strcmp(task, tasks[i]) != 0) continue;
      bench_torch_result_t *r = &out[i];
      bench_json_string(line, "info", r->info, sizeof r->info);
      if (strstr(line, "\"ok\": true")) {
        r->valid = true;
        r->why[0] = 0;
        r->st.median = bench_json_number(line, "median_s");
        r->st.min = bench_json_number(line, "min_s");
        r->st.max = bench_json_number(line, "max_s");
        r->st.q1 = bench_json_number(line, "q1_s");
        r->st.q3 = bench_json_number(line, "q3_s");
        r->st.samples = (int)bench_json_number(line, "samples");
        r->st.iters = (long)bench_json_number(line, "iters");
      } else {
        bench_json_string(line, "error", r->why, sizeof r->why);
      }
    }
  }
  if (rc != 0)
    for (int i = 0; i < ntasks; i++)
      if (!out[i].valid && !strncmp(out[i].why, "torch_peer.py gave", 18))
        snprintf(out[i].why, sizeof out[i].why, "torch_peer.py exited with status %d", rc);
  free(text);
}
