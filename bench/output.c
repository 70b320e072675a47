/* bench/output.c: the table on stdout, results.json, the plots (bench/report.py) and report.md. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "output.h"

void bench_format_value(double v, char *out, size_t size) {
  if (!isfinite(v)) snprintf(out, size, "-");
  else if (fabs(v) >= 100) snprintf(out, size, "%.0f", v);
  else if (fabs(v) >= 10) snprintf(out, size, "%.1f", v);
  else if (fabs(v) >= 1) snprintf(out, size, "%.2f", v);
  else snprintf(out, size, "%.3g", v);
}

static const char *bench_met_text(int met) { return met == 1 ? "met" : met == 0 ? "missed" : "unknown"; }

/* "0.97x OpenBLAS (398), 1.10x torch.mm (351)" */
static void bench_cmp_text(const bench_row_t *row, char *out, size_t size) {
  size_t used = 0;
  out[0] = 0;
  for (int i = 0; i < row->ncmp && used < size; i++) {
    const bench_cmp_t *c = &row->cmp[i];
    char ratio[32], peer[32];
    bench_format_value(c->peer_value, peer, sizeof peer);
    if (isfinite(c->ratio)) snprintf(ratio, sizeof ratio, "%.2fx", c->ratio);
    else snprintf(ratio, sizeof ratio, "?x");
    used += (size_t)snprintf(out + used, size - used, "%s%s %s (%s)", i ? ", " : "", ratio, c->peer, peer);
  }
}

static void bench_target_text(const bench_row_t *row, char *out, size_t size) {
  if (row->target[0]) snprintf(out, size, "%s: %s", row->target, bench_met_text(row->met));
  else out[0] = 0;
}

void bench_row_text(const bench_row_t *row, char *out, size_t size) {
  char med[32], lo[32], hi[32], cmp[256], tgt[128];
  bench_format_value(row->st.median, med, sizeof med);
  bench_format_value(row->st.min, lo, sizeof lo);
  bench_format_value(row->st.max, hi, sizeof hi);
  bench_cmp_text(row, cmp, sizeof cmp);
  bench_target_text(row, tgt, sizeof tgt);
  if (!row->valid)
    snprintf(out, size, "%s %s %s %s: not measured: %s", row->name, row->params, row->device, row->provider, row->note);
  else
    snprintf(out, size, "%s %s %s %s%s: %s %s [%s..%s]%s%s%s%s", row->name, row->params, row->device, row->provider,
             row->chosen ? " (fastest chose it)" : "", med, row->unit, lo, hi, cmp[0] ? "; " : "", cmp,
             tgt[0] ? "; target " : "", tgt);
}

/* ---- the table on stdout ------------------------------------------------------ */

enum { BENCH_COLS = 9 };

static void bench_row_cells(const bench_row_t *row, char cells[BENCH_COLS][256]) {
  snprintf(cells[0], 256, "%s", row->name);
  snprintf(cells[1], 256, "%s", row->device);
  snprintf(cells[2], 256, "%s%s", row->provider, row->chosen ? " *" : "");
  snprintf(cells[3], 256, "%s", row->params);
  if (row->valid) {
    char med[32], lo[32], hi[32];
    bench_format_value(row->st.median, med, sizeof med);
    bench_format_value(row->st.min, lo, sizeof lo);
    bench_format_value(row->st.max, hi, sizeof hi);
    snprintf(cells[4], 256, "%s", med);
    snprintf(cells[5], 256, "%s..%s", lo, hi);
  } else {
    snprintf(cells[4], 256, "-");
    snprintf(cells[5], 256, "-");
  }
  snprintf(cells[6], 256, "%s", row->unit);
  bench_cmp_text(row, cells[7], 256);
  bench_target_text(row, cells[8], 256);
}

static const char *const bench_headers[BENCH_COLS] = {"benchmark", "device", "provider", "size", "median",
                                                      "min..max", "unit", "vs peer (kiln speed / peer)", "target"};

static void bench_print_table(FILE *f) {
  size_t nrows, nnotes;
  const bench_row_t *rows = bench_rows_all(&nrows);
  const bench_note_t *notes = bench_notes_all(&nnotes);
  char cells[BENCH_COLS][256];
  for (int s = 0; s < BENCH_SECTION_COUNT; s++) {
    size_t width[BENCH_COLS];
    bool any = false;
    for (int c = 0; c < BENCH_COLS; c++) width[c] = strlen(bench_headers[c]);
    for (size_t i = 0; i < nrows; i++) {
      if (rows[i].section != s) continue;
      any = true;
      bench_row_cells(&rows[i], cells);
      for (int c = 0; c < BENCH_COLS; c++)
        if (strlen(cells[c]) > width[c]) width[c] = strlen(cells[c]);
    }
    bool any_note = false;
    for (size_t i = 0; i < nnotes; i++) any_note |= notes[i].section == s;
    if (!any && !any_note) continue;
    fprintf(f, "\n== %s ==\n", bench_section_title(s));
    if (any) {
      for (int c = 0; c < BENCH_COLS; c++) fprintf(f, "%-*s%s", (int)width[c], bench_headers[c], c + 1 < BENCH_COLS ? "  " : "\n");
      for (size_t i = 0; i < nrows; i++) {
        if (rows[i].section != s) continue;
        bench_row_cells(&rows[i], cells);
        for (int c = 0; c < BENCH_COLS; c++)
          fprintf(f, "%-*s%s", c + 1 < BENCH_COLS ? (int)width[c] : 0, cells[c], c + 1 < BENCH_COLS ? "  " : "\n");
        if (rows[i].note[0]) fprintf(f, "    note: %s\n", rows[i].note);
      }
    }
    for (size_t i = 0; i < nnotes; i++)
      if (notes[i].section == s) fprintf(f, "  %s%s\n", notes[i].error ? "ERROR: " : "", notes[i].text);
  }
  fputs("\n(* = the provider policy `fastest` chose; ratios are kiln's speed over the peer's: > 1 means kiln was faster)\n",
        f);
}

/* ---- machine --------------------------------------------------------------- */

static void bench_cpu_model(char *out, size_t size) {
  snprintf(out, size, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "model name", 10)) {
      const char *colon = strchr(line, ':');
      if (colon) {
        colon++;
        while (*colon == ' ') colon++;
        snprintf(out, size, "%s", colon);
        out[strcspn(out, "\n")] = 0;
      }
      break;
    }
  }
  fclose(f);
}

static void bench_date(char *out, size_t size) {
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(out, size, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

/* ---- JSON -------------------------------------------------------------------- */

static void bench_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", f);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void bench_json_num(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.6g", v);
  else fputs("null", f);
}

static void bench_json_stats(FILE *f, const bench_stats_t *st) {
  fputs("{\"median\": ", f);
  bench_json_num(f, st->median);
  fputs(", \"min\": ", f);
  bench_json_num(f, st->min);
  fputs(", \"max\": ", f);
  bench_json_num(f, st->max);
  fputs(", \"q1\": ", f);
  bench_json_num(f, st->q1);
  fputs(", \"q3\": ", f);
  bench_json_num(f, st->q3);
  fprintf(f, ", \"samples\": %d, \"ops_per_sample\": %ld}", st->samples, st->iters);
}

static int bench_write_json(const bench_options_t *opts, const char *path, double wall_s) {
  FILE *f = fopen(path, "w");
  if (!f) {
    bench_set_error("cannot write %s: %s; check that --out names a writable folder", path, strerror(errno));
    return -1;
  }
  char cpu[256], date[64];
  bench_cpu_model(cpu, sizeof cpu);
  bench_date(date, sizeof date);
  struct utsname un;
  if (uname(&un) != 0) memset(&un, 0, sizeof un);
  fputs("{\n  \"tool\": \"kiln-bench\",\n  \"kiln_version\": ", f);
  bench_json_str(f, kiln_version());
  fputs(",\n  \"date\": ", f);
  bench_json_str(f, date);
  fputs(",\n  \"command\": ", f);
  bench_json_str(f, opts->command);
  fprintf(f, ",\n  \"quick\": %s,\n  \"reps\": %d,\n  \"wall_seconds\": %.1f,\n", opts->quick ? "true" : "false",
          opts->reps, wall_s);
  fputs("  \"openblas_coretype_unset_was\": ", f);
  if (opts->coretype_was[0]) bench_json_str(f, opts->coretype_was);
  else fputs("null", f);
  fprintf(f, ",\n  \"openblas_coretype_kept\": %s,\n", opts->coretype_kept ? "true" : "false");
  fputs("  \"machine\": {\"cpu\": ", f);
  bench_json_str(f, cpu);
  fprintf(f, ", \"usable_cores\": %d, \"online_cpus\": %ld, \"memory_bytes\": %.0f, \"kernel\": ", bench_host_cores(),
          sysconf(_SC_NPROCESSORS_ONLN), (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE));
  bench_json_str(f, un.release);
  fputs("},\n  \"devices\": [", f);
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  for (size_t i = 0; i < ndev; i++) {
    const kiln_device_info_t *d = &devs[i].info;
    fprintf(f, "%s\n    {\"selector\": ", i ? "," : "");
    bench_json_str(f, d->selector);
    fputs(", \"backend\": ", f);
    bench_json_str(f, d->backend);
    fputs(", \"type\": ", f);
    bench_json_str(f, kiln_device_type_name(d->type));
    fputs(", \"name\": ", f);
    bench_json_str(f, d->name);
    fputs(", \"platform\": ", f);
    bench_json_str(f, d->platform);
    fputs(", \"driver\": ", f);
    bench_json_str(f, d->driver_version);
    fprintf(f, ", \"compute_units\": %u, \"memory_bytes\": %llu, \"default\": %s, \"matmul_providers\": ",
            d->compute_units, (unsigned long long)d->memory_bytes, d->is_default ? "true" : "false");
    const char *prov = kiln_device_providers(devs[i].device, "matmul");
    bench_json_str(f, prov ? prov : "");
    fputc('}', f);
  }
  fputs("\n  ],\n  \"backends\": [", f);
  size_t nback = 0;
  if (kiln_backend_count(&nback) != KILN_OK) nback = 0;
  for (size_t i = 0; i < nback; i++) {
    kiln_backend_info_t b;
    if (kiln_backend_info(i, &b) != KILN_OK) continue;
    fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
    bench_json_str(f, b.name);
    fputs(", \"state\": ", f);
    bench_json_str(f, kiln_backend_state_name(b.state));
    fputs(", \"reason\": ", f);
    bench_json_str(f, b.reason);
    fputc('}', f);
  }
  fputs("\n  ],\n  \"sections\": [", f);
  size_t nrows, nnotes;
  const bench_row_t *rows = bench_rows_all(&nrows);
  const bench_note_t *notes = bench_notes_all(&nnotes);
  bool first_section = true;
  for (int s = 0; s < BENCH_SECTION_COUNT; s++) {
    if (!(opts->sections & (1u << s))) continue;
    fprintf(f, "%s\n    {\"id\": \"%s\", \"title\": ", first_section ? "" : ",", bench_section_id(s));
    first_section = false;
    bench_json_str(f, bench_section_title(s));
    fputs(", \"notes\": [", f);
    bool first = true;
    for (size_t i = 0; i < nnotes; i++) {
      if (notes[i].section != s) continue;
      fputs(first ? "" : ", ", f);
      first = false;
      bench_json_str(f, notes[i].text);
    }
    fputs("], \"errors\": [", f);
    first = true;
    for (size_t i = 0; i < nnotes; i++) {
      if (notes[i].section != s || !notes[i].error) continue;
      fputs(first ? "" : ", ", f);
      first = false;
      bench_json_str(f, notes[i].text);
    }
    fputs("],\n     \"rows\": [", f);
    first = true;
    for (size_t i = 0; i < nrows; i++) {
      const bench_row_t *r = &rows[i];
      if (r->section != s) continue;
      fprintf(f, "%s\n       {\"name\": ", first ? "" : ",");
      first = false;
      bench_json_str(f, r->name);
      fputs(", \"device\": ", f);
      bench_json_str(f, r->device);
      fputs(", \"provider\": ", f);
      bench_json_str(f, r->provider);
      fputs(", \"params\": ", f);
      bench_json_str(f, r->params);
      fputs(", \"unit\": ", f);
      bench_json_str(f, r->unit);
      fprintf(f, ", \"higher_is_better\": %s, \"peer\": %s, \"fastest_chose\": %s, \"measured\": %s, \"stats\": ",
              r->higher_better ? "true" : "false", r->is_peer ? "true" : "false", r->chosen ? "true" : "false",
              r->valid ? "true" : "false");
      bench_json_stats(f, &r->st);
      fputs(", \"compare\": [", f);
      for (int c = 0; c < r->ncmp; c++) {
        fputs(c ? ", {\"peer\": " : "{\"peer\": ", f);
        bench_json_str(f, r->cmp[c].peer);
        fputs(", \"peer_value\": ", f);
        bench_json_num(f, r->cmp[c].peer_value);
        fputs(", \"ratio\": ", f);
        bench_json_num(f, r->cmp[c].ratio);
        fputc('}', f);
      }
      fputs("], \"target\": ", f);
      if (r->target[0]) {
        fputs("{\"text\": ", f);
        bench_json_str(f, r->target);
        fputs(", \"met\": ", f);
        fputs(r->met == 1 ? "true" : r->met == 0 ? "false" : "null", f);
        fputc('}', f);
      } else {
        fputs("null", f);
      }
      fputs(", \"note\": ", f);
      bench_json_str(f, r->note);
      fputc('}', f);
    }
    fputs("]}", f);
  }
  fputs("\n  ]\n}\n", f);
  if (fclose(f) != 0) {
    bench_set_error("writing %s failed: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* ---- plots ------------------------------------------------------------------- */

typedef struct bench_plot_t {
  char section[32];
  char file[128];
  char title[160];
} bench_plot_t;

/* Runs report.py; fills plots, or *skip with the reason there are none. */
static size_t bench_make_plots(const char *json_path, const char *out_dir, bench_plot_t *plots, size_t cap, char *skip,
                               size_t skip_size) {
  const char *script = bench_script_path("report.py");
  if (!script) {
    snprintf(skip, skip_size, "bench/report.py was not found (set KILN_BENCH_SCRIPTS to its folder)");
    return 0;
  }
  const char *argv[] = {bench_python(), script, json_path, out_dir, NULL};
  char *text = NULL;
  double wall = 0;
  int rc = bench_spawn(argv, NULL, &text, &wall);
  size_t n = 0;
  snprintf(skip, skip_size, "%s exited with status %d", script, rc);
  if (rc < 0) snprintf(skip, skip_size, "%s", bench_error());
  char *rest = text, *line;
  while (rest && (line = strsep(&rest, "\n")) != NULL) {
    if (!strncmp(line, "SKIP\t", 5)) {
      snprintf(skip, skip_size, "%s", line + 5);
    } else if (!strncmp(line, "PLOT\t", 5) && n < cap) {
      char *fields = line + 5, *sec = strsep(&fields, "\t"), *file = strsep(&fields, "\t");
      if (!sec || !file) continue;
      snprintf(plots[n].section, sizeof plots[n].section, "%s", sec);
      snprintf(plots[n].file, sizeof plots[n].file, "%s", file);
      snprintf(plots[n].title, sizeof plots[n].title, "%s", fields ? fields : file);
      n++;
    }
  }
  free(text);
  return n;
}

/* ---- report.md --------------------------------------------------------------- */

static void bench_md_cell(FILE *f, const char *s) {
  for (const char *p = s; *p; p++) {
    if (*p == '|') fputs("\\|", f);
    else if (*p == '*') fputs("\\*", f);
    else fputc(*p, f);
  }
}

static int bench_write_markdown(const bench_options_t *opts, const char *path, const bench_plot_t *plots,
                                size_t nplots, const char *plot_skip, double wall_s) {
  FILE *f = fopen(path, "w");
  if (!f) {
    bench_set_error("cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  char cpu[256], date[64];
  bench_cpu_model(cpu, sizeof cpu);
  bench_date(date, sizeof date);
  fprintf(f, "# kiln-bench report\n\n");
  fprintf(f, "- date: %s\n- kiln: %s\n- command: `%s`\n", date, kiln_version(), opts->command);
  fprintf(f, "- mode: %s, %d timed samples per figure (median, min..max), %d warm-up run(s)\n",
          opts->quick ? "quick (small sizes, few repetitions; no figure here is meant to be compared)" : "full",
          opts->reps, opts->warmup);
  fprintf(f, "- machine: %s, %d usable cores (%ld online), %.1f GiB memory\n", cpu, bench_host_cores(),
          sysconf(_SC_NPROCESSORS_ONLN), (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / 1073741824.0);
  if (opts->coretype_was[0]) fprintf(f, "- OPENBLAS_CORETYPE unset for this run (was %s)\n", opts->coretype_was);
  else if (opts->coretype_kept) fprintf(f, "- OPENBLAS_CORETYPE kept as %s (--keep-env)\n", getenv("OPENBLAS_CORETYPE"));
  else fprintf(f, "- OPENBLAS_CORETYPE was not set\n");
  fprintf(f, "- CPU BLAS peer: %s\n", bench_openblas_describe());
  fprintf(f, "- whole run: %.0f s\n\n", wall_s);
  fprintf(f, "## Devices\n\n| selector | backend | type | name | platform | compute units | memory | matmul providers |\n"
             "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const bench_device_t *devs;
  size_t ndev = bench_devices(&devs);
  for (size_t i = 0; i < ndev; i++) {
    const kiln_device_info_t *d = &devs[i].info;
    char mem[32];
    bench_format_bytes((double)d->memory_bytes, mem, sizeof mem);
    const char *prov = kiln_device_providers(devs[i].device, "matmul");
    fprintf(f, "| %s%s | %s | %s | ", d->selector, d->is_default ? " (default)" : "", d->backend,
            kiln_device_type_name(d->type));
    bench_md_cell(f, d->name);
    fputs(" | ", f);
    bench_md_cell(f, d->platform[0] ? d->platform : "-");
    fprintf(f, " | %u | %s | %s |\n", d->compute_units, mem, prov ? prov : "");
  }
  size_t nback = 0;
  if (kiln_backend_count(&nback) != KILN_OK) nback = 0;
  fputs("\nBackends: ", f);
  for (size_t i = 0; i < nback; i++) {
    kiln_backend_info_t b;
    if (kiln_backend_info(i, &b) != KILN_OK) continue;
    fprintf(f, "%s%s %s%s%s%s", i ? "; " : "", b.name, kiln_backend_state_name(b.state), b.reason[0] ? " (" : "",
            b.reason, b.reason[0] ? ")" : "");
  }
  fputs(".\n\nHow to read: each figure is the median of the timed samples, with the fastest and slowest sample "
        "beside it. Ratios are kiln's speed over the peer's (rates divided, times inverted): above 1 kiln was "
        "faster. A target is marked met or missed from the medians. `*` marks the provider that policy "
        "`fastest` chose. GFLOPS = 2mnk / time.\n",
        f);

  size_t nrows, nnotes;
  const bench_row_t *rows = bench_rows_all(&nrows);
  const bench_note_t *notes = bench_notes_all(&nnotes);
  for (int s = 0; s < BENCH_SECTION_COUNT; s++) {
    if (!(opts->sections & (1u << s))) continue;
    fprintf(f, "\n## %s\n\n", bench_section_title(s));
    bool any = false;
    for (size_t i = 0; i < nrows; i++) any |= rows[i].section == s;
    if (any) {
      fputs("| benchmark | device | provider | size | median | min..max | unit | vs peer | target | note |\n"
            "| --- | --- | --- | --- | ---: | ---: | --- | --- | --- | --- |\n",
            f);
      char cells[BENCH_COLS][256];
      for (size_t i = 0; i < nrows; i++) {
        if (rows[i].section != s) continue;
        bench_row_cells(&rows[i], cells);
        fputs("|", f);
        for (int c = 0; c < BENCH_COLS; c++) {
          fputc(' ', f);
          if (c == 8 && rows[i].target[0]) {
            bench_md_cell(f, rows[i].target);
            fprintf(f, ": **%s**", bench_met_text(rows[i].met));
          } else {
            bench_md_cell(f, cells[c]);
          }
          fputs(" |", f);
        }
        fputc(' ', f);
        bench_md_cell(f, rows[i].note);
        fputs(" |\n", f);
      }
      fputc('\n', f);
    }
    for (size_t i = 0; i < nnotes; i++)
      if (notes[i].section == s) {
        fputs(notes[i].error ? "- **error**: " : "- ", f);
        fputs(notes[i].text, f);
        fputc('\n', f);
      }
    for (size_t i = 0; i < nplots; i++)
      if (!strcmp(plots[i].section, bench_section_id(s))) fprintf(f, "\n![%s](%s)\n", plots[i].title, plots[i].file);
  }
  if (nplots == 0) fprintf(f, "\n## Plots\n\nPlots were skipped: %s.\n", plot_skip);
  if (fclose(f) != 0) {
    bench_set_error("writing %s failed: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* mkdir -p */
static int bench_mkdirs(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
      bench_set_error("cannot create folder %s: %s", path, strerror(errno));
      return -1;
    }
    *p = '/';
  }
  if (mkdir(path, 0777) != 0 && errno != EEXIST) {
    bench_set_error("cannot create output folder %s: %s; pass --out with a writable folder", path, strerror(errno));
    return -1;
  }
  return 0;
}

int bench_write_outputs(const bench_options_t *opts, double wall_s) {
  bench_print_table(stdout);
  fflush(stdout);
  if (bench_mkdirs(opts->out_dir) != 0) return -1;
  char json_path[4096], md_path[4096];
  snprintf(json_path, sizeof json_path, "%s/results.json", opts->out_dir);
  snprintf(md_path, sizeof md_path, "%s/report.md", opts->out_dir);
  if (bench_write_json(opts, json_path, wall_s) != 0) return -1;
  bench_plot_t plots[32];
  char skip[512];
  bench_progress("plotting with %s", bench_python());
  size_t nplots = bench_make_plots(json_path, opts->out_dir, plots, 32, skip, sizeof skip);
  if (nplots == 0) bench_progress("plots skipped: %s", skip);
  if (bench_write_markdown(opts, md_path, plots, nplots, skip, wall_s) != 0) return -1;
  bench_progress("wrote %s, %s and %zu plot(s)", json_path, md_path, nplots);
  return 0;
}
