/* bench/results.c: result rows and section notes, their line format for child processes, and progress. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "output.h"

static bench_row_t *bench_rows;
static size_t bench_row_count, bench_row_cap;
static bench_note_t *bench_notes;
static size_t bench_note_count, bench_note_cap;
static bool bench_error_seen;

static const char *const bench_ids[BENCH_SECTION_COUNT] = {
    "matmul", "nn", "overhead", "chapter", "transfer", "cache", "cuda", "train", "python", "half",
};
static const char *const bench_titles[BENCH_SECTION_COUNT] = {
    "1. matmul f32",
    "2. conv2d, add and softmax",
    "3. per-operation overhead",
    "4. the GPU chapter's exercises",
    "5. transfer bandwidth",
    "6. first matmul with a cold and a warm kernel cache",
    "7. GPU peers (cuBLAS, raw CUDA)",
    "8. training (kiln-train's models) side by side with PyTorch",
    "9. kiln from Python beside PyTorch and NumPy (a tiny add, the DLPack round trip, host reads, the GPU tutorial's training step)",
    "10. low precision: f16/bf16 matmul, conv2d and add vs f32",
};

const char *bench_section_id(int section) {
  return section >= 0 && section < BENCH_SECTION_COUNT ? bench_ids[section] : "?";
}
const char *bench_section_title(int section) {
  return section >= 0 && section < BENCH_SECTION_COUNT ? bench_titles[section] : "?";
}

const bench_row_t *bench_rows_all(size_t *out_count) {
  *out_count = bench_row_count;
  return bench_rows;
}
const bench_note_t *bench_notes_all(size_t *out_count) {
  *out_count = bench_note_count;
  return bench_notes;
}

void bench_progress(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("kiln-bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

bench_row_t bench_row_make(int section, const char *name, const char *device, const char *provider,
                           const char *params, const char *unit, bool higher_better) {
  bench_row_t row;
  memset(&row, 0, sizeof row);
  row.section = section;
  snprintf(row.name, sizeof row.name, "%s", name);
  snprintf(row.device, sizeof row.device, "%s", device);
  snprintf(row.provider, sizeof row.provider, "%s", provider);
  snprintf(row.params, sizeof row.params, "%s", params);
  snprintf(row.unit, sizeof row.unit, "%s", unit);
  row.higher_better = higher_better;
  row.met = -1;
  row.valid = true;
  row.st.median = row.st.min = row.st.max = row.st.q1 = row.st.q3 = NAN;
  return row;
}

double bench_row_compare(bench_row_t *row, const char *peer, double peer_value) {
  if (row->ncmp >= BENCH_MAX_CMP) return NAN;
  bench_cmp_t *c = &row->cmp[row->ncmp++];
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  c->peer_value = peer_value;
  c->ratio = NAN;
  if (row->valid && isfinite(peer_value) && peer_value > 0 && isfinite(row->st.median) && row->st.median > 0)
    c->ratio = row->higher_better ? row->st.median / peer_value : peer_value / row->st.median;
  return c->ratio;
}

void bench_row_target_ratio(bench_row_t *row, double min_ratio) {
  if (row->ncmp == 0) return;
  const bench_cmp_t *c = &row->cmp[row->ncmp - 1];
  const int met = isfinite(c->ratio) ? c->ratio >= min_ratio : -1;
  if (row->target[0]) {
    /* A second target on the same row: both must be met. */
    const size_t used = strlen(row->target);
    snprintf(row->target + used, sizeof row->target - used, "; >= %gx %s", min_ratio, c->peer);
    row->met = row->met == 0 || met == 0 ? 0 : row->met == 1 && met == 1 ? 1 : -1;
    return;
  }
  snprintf(row->target, sizeof row->target, ">= %gx %s", min_ratio, c->peer);
  row->met = met;
}

void bench_row_target_max(bench_row_t *row, double max_value, const char *text) {
  snprintf(row->target, sizeof row->target, "%s", text);
  row->met = row->valid && isfinite(row->st.median) ? row->st.median <= max_value : -1;
}

void bench_row_target_diff(bench_row_t *row, double max_diff) {
  if (row->ncmp == 0) return;
  const bench_cmp_t *c = &row->cmp[row->ncmp - 1];
  snprintf(row->target, sizeof row->target, "<= %s + %g %s", c->peer, max_diff, row->unit);
  row->met = row->valid && isfinite(c->peer_value) && isfinite(row->st.median)
                 ? row->st.median - c->peer_value <= max_diff
                 : -1;
}

void bench_row_note(bench_row_t *row, const char *fmt, ...) {
  size_t used = strlen(row->note);
  if (used && used + 2 < sizeof row->note) {
    memcpy(row->note + used, "; ", 3);
    used += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(row->note + used, sizeof row->note - used, fmt, ap);
  va_end(ap);
}

void bench_add(const bench_row_t *row) {
  if (bench_row_count == bench_row_cap) {
    size_t cap = bench_row_cap ? bench_row_cap * 2 : 64;
    bench_row_t *grown = realloc(bench_rows, cap * sizeof *grown);
    if (!grown) {
      bench_progress("out of host memory keeping %zu result rows; row '%s' dropped", cap, row->name);
      return;
    }
    bench_rows = grown;
    bench_row_cap = cap;
  }
  bench_rows[bench_row_count++] = *row;
  char line[512];
  bench_row_text(row, line, sizeof line);
  bench_progress("%s", line);
}

static void bench_note_add(int section, bool error, const char *fmt, va_list ap) {
  if (bench_note_count == bench_note_cap) {
    size_t cap = bench_note_cap ? bench_note_cap * 2 : 32;
    bench_note_t *grown = realloc(bench_notes, cap * sizeof *grown);
    if (!grown) return;
    bench_notes = grown;
    bench_note_cap = cap;
  }
  bench_note_t *n = &bench_notes[bench_note_count++];
  n->section = section;
  n->error = error;
  vsnprintf(n->text, sizeof n->text, fmt, ap);
  bench_progress("%s%s", error ? "error: " : "", n->text);
}

void bench_section_note(int section, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bench_note_add(section, false, fmt, ap);
  va_end(ap);
}

void bench_section_error(int section, const char *fmt, ...) {
  bench_error_seen = true;
  va_list ap;
  va_start(ap, fmt);
  bench_note_add(section, true, fmt, ap);
  va_end(ap);
}

bool bench_had_error(void) { return bench_error_seen; }

/* ---- the line format ---------------------------------------------------------- */

/* Tabs and newlines cannot occur inside a field. */
static void bench_put_field(char *out, size_t size, size_t *used, const char *text) {
  if (*used + 1 < size) out[(*used)++] = '\t';
  for (const char *p = text; *p && *used + 1 < size; p++) out[(*used)++] = (*p == '\t' || *p == '\n') ? ' ' : *p;
  out[*used < size ? *used : size - 1] = 0;
}

static void bench_put_num(char *out, size_t size, size_t *used, double v) {
  char num[40];
  snprintf(num, sizeof num, "%.17g", v);
  bench_put_field(out, size, used, num);
}

void bench_row_serialize(const bench_row_t *row, char *out, size_t size) {
  size_t used = (size_t)snprintf(out, size, "ROW");
  bench_put_num(out, size, &used, row->section);
  bench_put_field(out, size, &used, row->name);
  bench_put_field(out, size, &used, row->device);
  bench_put_field(out, size, &used, row->provider);
  bench_put_field(out, size, &used, row->params);
  bench_put_field(out, size, &used, row->unit);
  bench_put_num(out, size, &used, row->higher_better);
  bench_put_num(out, size, &used, row->is_peer);
  bench_put_num(out, size, &used, row->chosen);
  bench_put_num(out, size, &used, row->valid);
  const double st[] = {row->st.median, row->st.min, row->st.max, row->st.q1, row->st.q3,
                       row->st.samples, (double)row->st.iters};
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) bench_put_num(out, size, &used, st[i]);
  bench_put_num(out, size, &used, row->ncmp);
  for (int i = 0; i < row->ncmp; i++) {
    bench_put_field(out, size, &used, row->cmp[i].peer);
    bench_put_num(out, size, &used, row->cmp[i].peer_value);
    bench_put_num(out, size, &used, row->cmp[i].ratio);
  }
  bench_put_field(out, size, &used, row->target);
  bench_put_num(out, size, &used, row->met);
  bench_put_field(out, size, &used, row->note);
}

bool bench_row_parse(const char *line, bench_row_t *out) {
  if (strncmp(line, "ROW\t", 4) != 0) return false;
  char *copy = strdup(line + 4), *rest = copy;
  if (!copy) return false;
  char *f[64];
  int n = 0;
  char *tok;
  while (n < 64 && (tok = strsep(&rest, "\t")) != NULL) f[n++] = tok;
  bool ok = false;
  if (n >= 18) {
    bench_row_t r = bench_row_make(atoi(f[0]), f[1], f[2], f[3], f[4], f[5], atoi(f[6]) != 0);
    r.is_peer = atoi(f[7]) != 0;
    r.chosen = atoi(f[8]) != 0;
    r.valid = atoi(f[9]) != 0;
    r.st.median = strtod(f[10], NULL);
    r.st.min = strtod(f[11], NULL);
    r.st.max = strtod(f[12], NULL);
    r.st.q1 = strtod(f[13], NULL);
    r.st.q3 = strtod(f[14], NULL);
    r.st.samples = atoi(f[15]);
    r.st.iters = atol(f[16]);
    int ncmp = atoi(f[17]);
    int i = 18;
    if (ncmp >= 0 && ncmp <= BENCH_MAX_CMP && n >= i + 3 * ncmp + 3) {
      for (int c = 0; c < ncmp; c++, i += 3) {
        snprintf(r.cmp[c].peer, sizeof r.cmp[c].peer, "%s", f[i]);
        r.cmp[c].peer_value = strtod(f[i + 1], NULL);
        r.cmp[c].ratio = strtod(f[i + 2], NULL);
      }
      r.ncmp = ncmp;
      snprintf(r.target, sizeof r.target, "%s", f[i]);
      r.met = atoi(f[i + 1]);
      snprintf(r.note, sizeof r.note, "%s", f[i + 2]);
      *out = r;
      ok = true;
    }
  }
  free(copy);
  return ok;
}
