/* bench/main.c: kiln-bench's command line, the OPENBLAS_CORETYPE re-exec, the hidden child modes, and the run. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

static void bench_usage(FILE *f) {
  fputs("usage: kiln-bench [--quick] [--only SECTION[,SECTION...]] [--reps N] [--out DIR] [--keep-env]\n"
        "\n"
        "Benchmarks kiln on every visible device (KILN_DEVICE selects them) side by side with\n"
        "OpenBLAS, CLBlast, raw OpenCL, PyTorch and, where a GPU is present, cuBLAS and raw CUDA.\n"
        "Progress goes to stderr, a table to stdout; DIR receives results.json, report.md and plots.\n"
        "\n"
        "  --quick        small sizes and few repetitions (the whole run in about a minute)\n"
        "  --only LIST    sections by name or number: 1 matmul, 2 nn, 3 overhead, 4 chapter,\n"
        "                 5 transfer, 6 cache, 7 cuda, 8 train, 9 python, 10 half\n"
        "  --reps N       timed samples per figure (default 5; 3 with --quick)\n"
        "  --out DIR      output folder, created if missing (default ./kiln-bench-out)\n"
        "  --keep-env     keep OPENBLAS_CORETYPE (by default kiln-bench re-runs itself without it,\n"
        "                 since OpenBLAS reads it when it loads)\n"
        "  --help         this text\n"
        "\n"
        "Variables: KILN_BENCH_PYTHON (the Python for torch_peer.py and report.py, default\n"
        "/usr/bin/python3), KILN_BENCH_SCRIPTS (the folder holding them), KILN_BENCH_TRAIN_EPOCHS (epochs\n"
        "of section 8 on every device; default 10 on the CPU and GPUs, 2 on OpenCL CPU devices, 1 with\n"
        "--quick), and every KILN_* variable.\n",
        f);
}

static int bench_parse_sections(const char *list, uint32_t *out) {
  uint32_t mask = 0;
  char *copy = strdup(list), *rest = copy, *tok;
  if (!copy) return -1;
  int rc = 0;
  while ((tok = strsep(&rest, ",")) != NULL) {
    if (!*tok) continue;
    int found = -1;
    for (int s = 0; s < BENCH_SECTION_COUNT; s++) {
      char num[16];
      snprintf(num, sizeof num, "%d", s + 1);
      if (!strcmp(tok, bench_section_id(s)) || !strcmp(tok, num)) found = s;
    }
    if (found < 0) {
      fprintf(stderr, "kiln-bench: --only: unknown section '%s'; use names or numbers: 1 matmul, 2 nn, 3 overhead, "
                      "4 chapter, 5 transfer, 6 cache, 7 cuda, 8 train, 9 python, 10 half (e.g. --only matmul,3)\n", tok);
      rc = -1;
      break;
    }
    mask |= 1u << found;
  }
  free(copy);
  if (rc == 0 && mask == 0) {
    fprintf(stderr, "kiln-bench: --only needs at least one section (e.g. --only matmul)\n");
    rc = -1;
  }
  *out = mask;
  return rc;
}

static char *bench_join_command(int argc, char **argv) {
  size_t size = 1;
  for (int i = 0; i < argc; i++) size += strlen(argv[i]) * 4 + 3;
  char *out = malloc(size);
  if (!out) return NULL;
  size_t used = 0;
  for (int i = 0; i < argc; i++) {
    bool quote = argv[i][0] == 0 || strpbrk(argv[i], " \t'\"$\\") != NULL;
    if (i) out[used++] = ' ';
    if (quote) out[used++] = '\'';
    for (const char *p = argv[i]; *p; p++) {
      if (*p == '\'') {
        memcpy(out + used, "'\\''", 4);
        used += 4;
      } else {
        out[used++] = *p;
      }
    }
    if (quote) out[used++] = '\'';
  }
  out[used] = 0;
  return out;
}

int main(int argc, char **argv) {
  double t_start = bench_now();
  static char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) self[len] = 0;
  else snprintf(self, sizeof self, "%s", argv[0]);

  bench_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.reps = -1;
  opts.out_dir = "kiln-bench-out";
  opts.sections = (1u << BENCH_SECTION_COUNT) - 1;
  opts.self = self;
  const char *child = NULL, *child_arg = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--quick")) {
      opts.quick = true;
    } else if (!strcmp(a, "--keep-env")) {
      opts.keep_env = true;
    } else if (!strcmp(a, "--only") && i + 1 < argc) {
      if (bench_parse_sections(argv[++i], &opts.sections) != 0) return 2;
    } else if (!strcmp(a, "--reps") && i + 1 < argc) {
      char *end;
      long n = strtol(argv[++i], &end, 10);
      if (*end || n < 1 || n > 1000) {
        fprintf(stderr, "kiln-bench: --reps takes a whole number from 1 to 1000, not '%s'\n", argv[i]);
        return 2;
      }
      opts.reps = (int)n;
    } else if (!strcmp(a, "--out") && i + 1 < argc) {
      opts.out_dir = argv[++i];
    } else if (!strcmp(a, "--child") && i + 1 < argc) {
      /* Hidden: the modes kiln-bench runs itself in as a child process. */
      child = argv[++i];
      if (i + 1 < argc && argv[i + 1][0] != '-') child_arg = argv[++i];
    } else {
      fprintf(stderr, "kiln-bench: unknown or incomplete argument '%s'\n\n", a);
      bench_usage(stderr);
      return 2;
    }
  }
  if (opts.reps < 0) opts.reps = opts.quick ? 3 : 5;
  opts.warmup = opts.quick ? 1 : 2;
  opts.min_sample_s = opts.quick ? 0.01 : 0.05;

  /* OpenBLAS reads OPENBLAS_CORETYPE when it loads, before main: measuring it
   * without the variable means starting again without it. */
  const char *was = getenv("KILN_BENCH_CORETYPE_WAS");
  if (was) {
    snprintf(opts.coretype_was, sizeof opts.coretype_was, "%s", was);
    unsetenv("KILN_BENCH_CORETYPE_WAS");
  }
  const char *coretype = getenv("OPENBLAS_CORETYPE");
  if (coretype && !child) {
    if (opts.keep_env) {
      opts.coretype_kept = true;
    } else {
      setenv("KILN_BENCH_CORETYPE_WAS", coretype, 1);
      unsetenv("OPENBLAS_CORETYPE");
      fflush(NULL);
      execv(self, argv);
      fprintf(stderr, "kiln-bench: could not re-run %s without OPENBLAS_CORETYPE (%s); measuring with it set\n", self,
              strerror(errno));
      setenv("OPENBLAS_CORETYPE", getenv("KILN_BENCH_CORETYPE_WAS"), 1);
      unsetenv("KILN_BENCH_CORETYPE_WAS");
      opts.coretype_kept = true;
    }
  }

  if (child) {
    if (!strcmp(child, "first-matmul") && child_arg) return bench_child_first_matmul(child_arg);
    if (!strcmp(child, "two-devices")) return bench_child_two_devices(&opts);
    fprintf(stderr, "kiln-bench: unknown child mode '%s'\n", child);
    return 2;
  }

  char *command = bench_join_command(argc, argv);
  opts.command = command ? command : "kiln-bench";
  if (opts.coretype_was[0]) bench_progress("OPENBLAS_CORETYPE unset for this run (was %s)", opts.coretype_was);

  kiln_status_t st = kiln_ensure_initialized();
  if (st != KILN_OK) {
    fprintf(stderr, "kiln-bench: kiln could not start (%s): %s\n", kiln_status_name(st), kiln_last_error());
    return 1;
  }
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  if (ndev == 0) {
    fprintf(stderr, "kiln-bench: no visible device (%s); check KILN_DEVICE and KILN_BACKEND\n", kiln_last_error());
    return 1;
  }
  for (size_t i = 0; i < ndev; i++)
    bench_progress("device %s: %s%s%s (%s, %u compute units)", devs[i].info.selector, devs[i].info.name,
                   devs[i].info.platform[0] ? " on " : "", devs[i].info.platform,
                   kiln_device_type_name(devs[i].info.type), devs[i].info.compute_units);
  bench_progress("%s mode, %d samples per figure; policy at start: %s", opts.quick ? "quick" : "full", opts.reps,
                 kiln_policy_name(kiln_policy()));

  typedef void (*section_fn)(const bench_options_t *);
  static const section_fn sections[BENCH_SECTION_COUNT] = {
      bench_section_matmul,   bench_section_nn,    bench_section_overhead, bench_section_chapter,
      bench_section_transfer, bench_section_cache, bench_section_cuda, bench_section_train,
      bench_section_python,   bench_section_half,
  };
  kiln_policy_t policy = kiln_policy();
  for (int s = 0; s < BENCH_SECTION_COUNT; s++) {
    if (!(opts.sections & (1u << s))) continue;
    bench_progress("section %s", bench_section_title(s));
    double t0 = bench_now();
    sections[s](&opts);
    kiln_set_providers("");
    kiln_set_policy(policy);
    bench_progress("section %s took %.1f s", bench_section_id(s), bench_now() - t0);
  }
  int rc = bench_write_outputs(&opts, bench_now() - t_start) == 0 ? 0 : 1;
  if (rc != 0) fprintf(stderr, "kiln-bench: %s\n", bench_error());
  if (bench_had_error()) {
    fprintf(stderr, "kiln-bench: some measurements failed; see the errors above and in the report\n");
    rc = 1;
  }
  free(command);
  bench_cl_close_all();
  kiln_deinitialize();
  return rc;
}
