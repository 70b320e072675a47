/* bench/sec_python.c: section 9, kiln from Python (the kiln package's C extension) beside PyTorch and NumPy in one process: a tiny add, and the DLPack round trip NumPy -> kiln -> NumPy with its zero-copy check (bench/python_bench.py). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#ifndef KILN_BENCH_PYTHON_EXT_DIR
#define KILN_BENCH_PYTHON_EXT_DIR ""
#endif

enum { PY_TASKS = 20 };

/* What python_bench.py answered for one task. */
typedef struct py_result_t {
  const char *task;
  bool valid;
  bench_stats_t us; /* microseconds per operation */
  char why[200];
  char info[200];
  int zero_copy;    /* -1 unknown, 0 copied, 1 shared */
  char check[200];
} py_result_t;

/* "key": value in one flat JSON line (the helper prints nothing nested). */
static const char *py_json_find(const char *line, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(line, pat);
  if (!p) return NULL;
  p += strlen(pat);
  while (*p == ' ') p++;
  return p;
}

static double py_json_number(const char *line, const char *key) {
  const char *p = py_json_find(line, key);
  return p && strncmp(p, "null", 4) ? strtod(p, NULL) : NAN;
}

static void py_json_string(const char *line, const char *key, char *out, size_t size) {
  const char *p = py_json_find(line, key);
  out[0] = 0;
  if (!p || *p != '"') return;
  size_t n = 0;
  for (p++; *p && *p != '"' && n + 1 < size; p++) {
    if (*p == '\\' && p[1]) p++;
    out[n++] = *p;
  }
  out[n] = 0;
}

/* The extension built in this build tree (tests/meson.build builds it), if
 * any: python_bench.py then imports the source package with it. Otherwise
 * an installed kiln package (pip install ./python) is used, if there is one. */
static bool py_build_tree_extension(char *dir, size_t size) {
  const char *env = getenv("KILN_PYTHON_EXTENSION_DIR");
  snprintf(dir, size, "%s", env && *env ? env : KILN_BENCH_PYTHON_EXT_DIR);
  if (!dir[0]) return false;
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
    size_t len = strlen(e->d_name);
    found = !strncmp(e->d_name, "_kiln.", 6) && len > 3 && !strcmp(e->d_name + len - 3, ".so");
  }
  closedir(d);
  return found;
}

static void py_run(const bench_options_t *opts, const char *device, const char *const *tasks, py_result_t *out) {
  for (int i = 0; i < PY_TASKS && tasks[i]; i++) {
    memset(&out[i], 0, sizeof out[i]);
    out[i].task = tasks[i];
    out[i].zero_copy = -1;
    snprintf(out[i].why, sizeof out[i].why, "python_bench.py gave no answer");
  }
  const char *script = bench_script_path("python_bench.py");
  if (!script) {
    for (int i = 0; i < PY_TASKS && tasks[i]; i++)
      snprintf(out[i].why, sizeof out[i].why, "bench/python_bench.py not found (set KILN_BENCH_SCRIPTS to its folder)");
    return;
  }
  char reps[16], warm[16], min_time[32];
  snprintf(reps, sizeof reps, "%d", opts->reps);
  snprintf(warm, sizeof warm, "%d", opts->warmup);
  snprintf(min_time, sizeof min_time, "%g", opts->min_sample_s);
  const char *argv[32];
  int n = 0;
  argv[n++] = bench_python();
  argv[n++] = script;
  argv[n++] = "--reps";
  argv[n++] = reps;
  argv[n++] = "--warmup";
  argv[n++] = warm;
  argv[n++] = "--min-time";
  argv[n++] = min_time;
  argv[n++] = "--device";
  argv[n++] = device;
  for (int i = 0; i < PY_TASKS && tasks[i]; i++) argv[n++] = tasks[i];
  argv[n] = NULL;

  char ext_dir[4096], ext_env[4200], path_env[4200];
  const char *env[4] = {NULL, NULL, NULL, NULL};
  if (py_build_tree_extension(ext_dir, sizeof ext_dir)) {
    snprintf(ext_env, sizeof ext_env, "KILN_PYTHON_EXTENSION_DIR=%s", ext_dir);
    /* The source package sits beside bench/ (python/kiln). */
    snprintf(path_env, sizeof path_env, "PYTHONPATH=%s/../python", KILN_BENCH_SOURCE_DIR);
    env[0] = ext_env;
    env[1] = path_env;
    env[2] = "PYTHONDONTWRITEBYTECODE=1";
  }
  char *text = NULL;
  int rc = bench_spawn(argv, env, &text, NULL);
  if (rc != 0 && !text) {
    for (int i = 0; i < PY_TASKS && tasks[i]; i++)
      snprintf(out[i].why, sizeof out[i].why, "%s", rc < 0 ? bench_error() : "python_bench.py failed");
    return;
  }
  char *rest = text, *line;
  while (rest && (line = strsep(&rest, "\n")) != NULL) {
    if (line[0] != '{') continue;
    char task[64];
    py_json_string(line, "task", task, sizeof task);
    for (int i = 0; i < PY_TASKS && tasks[i]; i++) {
      if (strcmp(task, tasks[i]) != 0) continue;
      py_result_t *r = &out[i];
      py_json_string(line, "info", r->info, sizeof r->info);
      if (strstr(line, "\"ok\": true")) {
        bench_stats_t s = {0};
        s.median = py_json_number(line, "median_s");
        s.min = py_json_number(line, "min_s");
        s.max = py_json_number(line, "max_s");
        s.q1 = py_json_number(line, "q1_s");
        s.q3 = py_json_number(line, "q3_s");
        s.samples = (int)py_json_number(line, "samples");
        s.iters = (long)py_json_number(line, "iters");
        r->us = bench_stats_scale(&s, 1e6);
        r->valid = true;
        r->why[0] = 0;
        const char *zc = py_json_find(line, "zero_copy");
        if (zc) r->zero_copy = !strncmp(zc, "true", 4);
        py_json_string(line, "check", r->check, sizeof r->check);
      } else {
        py_json_string(line, "error", r->why, sizeof r->why);
      }
    }
  }
  free(text);
}

static bench_row_t py_row_sized(const py_result_t *r, const char *name, const char *device, const char *who, bool peer,
                                const char *size) {
  bench_row_t row = bench_row_make(BENCH_SECTION_PYTHON, name, device, who, size, "us", false);
  row.is_peer = peer;
  row.valid = r->valid;
  if (r->valid) row.st = r->us;
  else bench_row_note(&row, "%s", r->why);
  return row;
}

static bench_row_t py_row(const py_result_t *r, const char *name, const char *device, const char *who, bool peer) {
  return py_row_sized(r, name, device, who, peer, "16 floats");
}

void bench_section_python(const bench_options_t *opts) {
  const int S = BENCH_SECTION_PYTHON;
  const char *tasks[PY_TASKS + 1] = {"kiln_add16",     "torch_add16",     "numpy_add16", "kiln_roundtrip",
                                     "torch_roundtrip", "numpy_roundtrip", "kiln_import", "kiln_export",
                                     "kiln_read_sum",   "torch_read_sum",  "numpy_read_sum",
                                     "kiln_read_item",  "torch_read_item", "numpy_read_item",
                                     "kiln_read_asarray", "torch_read_asarray", "numpy_read_asarray",
                                     "kiln_oci_net",    "torch_oci_net",   "kiln_xp_add16"};
  tasks[PY_TASKS] = NULL;
  py_result_t r[PY_TASKS];
  bench_progress("python: kiln, PyTorch and NumPy from one Python process (%s)", bench_python());
  py_run(opts, "cpu:0", tasks, r);
  if (!r[0].valid) {
    bench_section_note(S, "kiln from Python was not measured: %s", r[0].why);
    return;
  }
  bench_section_note(S, "%s", r[0].info);
  bench_section_note(S, "one process, timed alike (warm-ups, samples of at least %g s, median): a + b of 16 floats "
                        "as a Python expression, the kiln result freed each time and the device synchronised at the "
                        "end of each sample; PyTorch with one thread (its best for a 16-element op)",
                     opts->min_sample_s);

  /* The tiny add: no more than PyTorch's eager add. */
  bench_row_t torch_add = py_row(&r[1], "add 16 floats from Python", "host", "torch eager a + b", true);
  bench_add(&torch_add);
  bench_row_t numpy_add = py_row(&r[2], "add 16 floats from Python", "host", "numpy a + b", true);
  bench_add(&numpy_add);
  bench_row_t add = py_row(&r[0], "add 16 floats from Python", "cpu:0", "kiln a + b", false);
  bench_row_compare(&add, "numpy a + b", numpy_add.valid ? numpy_add.st.median : NAN);
  bench_row_compare(&add, "torch eager a + b", torch_add.valid ? torch_add.st.median : NAN);
  bench_row_target_ratio(&add, 1.0);
  bench_add(&add);
  /* The same add through the Array API namespace: one Python function call more. */
  bench_row_t xp_add = py_row(&r[19], "add 16 floats from Python", "cpu:0", "kiln.array_api add(a, b)", false);
  bench_row_compare(&xp_add, "numpy a + b", numpy_add.valid ? numpy_add.st.median : NAN);
  bench_row_compare(&xp_add, "torch eager a + b", torch_add.valid ? torch_add.st.median : NAN);
  bench_add(&xp_add);

  /* The round trip: under a microsecond, and nothing copied. */
  bench_row_t torch_rt = py_row(&r[4], "DLPack round trip from NumPy", "host", "NumPy -> torch -> NumPy", true);
  bench_add(&torch_rt);
  bench_row_t numpy_rt = py_row(&r[5], "DLPack round trip from NumPy", "host", "NumPy -> NumPy", true);
  bench_add(&numpy_rt);
  bench_row_t rt = py_row(&r[3], "DLPack round trip from NumPy", "cpu:0", "NumPy -> kiln -> NumPy", false);
  bench_row_compare(&rt, "NumPy -> NumPy", numpy_rt.valid ? numpy_rt.st.median : NAN);
  bench_row_compare(&rt, "NumPy -> torch -> NumPy", torch_rt.valid ? torch_rt.st.median : NAN);
  if (r[3].zero_copy == 1) {
    bench_row_target_max(&rt, 1.0, "< 1 us, 0 bytes copied");
    bench_row_note(&rt, "0 bytes copied: %s", r[3].check);
  } else if (r[3].valid) {
    bench_row_target_max(&rt, -1.0, "< 1 us, 0 bytes copied");
    bench_row_note(&rt, "COPIED: %s", r[3].check);
  }
  bench_add(&rt);
  bench_row_t imp = py_row(&r[6], "DLPack: kiln.from_dlpack(ndarray)", "cpu:0", "kiln import", false);
  bench_add(&imp);
  bench_row_t exp = py_row(&r[7], "DLPack: np.from_dlpack(tensor)", "cpu:0", "kiln export", false);
  bench_add(&exp);

  /* Host reads of a small result: within 1.5x of PyTorch's. */
  static const char *const reads[3][2] = {{"read float(t.sum()) from Python", "float(t.sum())"},
                                          {"read t.item() of a 0-d tensor", "t.item()"},
                                          {"read np.asarray(t) of 16 floats", "np.asarray(t)"}};
  for (int k = 0; k < 3; k++) {
    const int at = 8 + 3 * k;
    char who[64];
    snprintf(who, sizeof who, "torch %s", reads[k][1]);
    bench_row_t torch_read = py_row(&r[at + 1], reads[k][0], "host", who, true);
    bench_add(&torch_read);
    snprintf(who, sizeof who, "numpy %s", reads[k][1]);
    bench_row_t numpy_read = py_row(&r[at + 2], reads[k][0], "host", who, true);
    bench_add(&numpy_read);
    snprintf(who, sizeof who, "kiln %s", reads[k][1]);
    bench_row_t read = py_row(&r[at], reads[k][0], "cpu:0", who, false);
    snprintf(who, sizeof who, "torch %s", reads[k][1]);
    bench_row_compare(&read, who, torch_read.valid ? torch_read.st.median : NAN);
    bench_row_target_ratio(&read, 1.0 / 1.5); /* at most 1.5x PyTorch's time */
    bench_add(&read);
  }

  /* The GPU tutorial's training step as PyTorch users write it (examples/oci_net.py): at least PyTorch's speed. */
  bench_row_t torch_net =
      py_row_sized(&r[18], "tutorial Net step (Python)", "host", "torch.nn Module, 1 thread", true, "4 images");
  bench_add(&torch_net);
  bench_row_t net = py_row_sized(&r[17], "tutorial Net step (Python)", "cpu:0", "kiln.nn.Module", false, "4 images");
  bench_row_compare(&net, "torch.nn Module, 1 thread", torch_net.valid ? torch_net.st.median : NAN);
  bench_row_target_ratio(&net, 1.0);
  bench_row_note(&net, "one step: zero_grad, forward, CrossEntropyLoss, loss.backward(), SGD step, loss.item()");
  bench_add(&net);
}
