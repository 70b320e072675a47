/* bench/output.h: what results.c keeps and output.c writes out (the table, results.json, report.md). */
#ifndef KILN_BENCH_OUTPUT_H
#define KILN_BENCH_OUTPUT_H

#include "bench.h"

typedef struct bench_note_t {
  int section;
  bool error;
  char text[600];
} bench_note_t;

const bench_row_t *bench_rows_all(size_t *out_count);
const bench_note_t *bench_notes_all(size_t *out_count);

/* One row as a line of text (progress and the stdout table's comparisons). */
void bench_row_text(const bench_row_t *row, char *out, size_t size);
/* A figure with three significant digits or so ("412", "3.27", "0.162"). */
void bench_format_value(double v, char *out, size_t size);

#endif /* KILN_BENCH_OUTPUT_H */
