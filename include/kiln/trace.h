/* kiln/trace.h: a trace of every operation, copy and allocation in Trace Event Format JSON (Perfetto, chrome://tracing). */
#ifndef KILN_TRACE_H
#define KILN_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* Start recording, process-wide, into a ring of KILN_TRACE_EVENTS records
 * (default 100000; the oldest are overwritten when it is full, and how many
 * were is written into the trace). Every operation, copy between host and
 * device and change of a device's memory is recorded until kiln_trace_stop,
 * which writes the JSON to `path`. KILN_TRACE=path does the same from start-up
 * to kiln_deinitialize or the process's exit. The file is created now, so a
 * path that cannot be written fails here: KILN_IO naming it.
 * KILN_INVALID_ARGUMENT for a NULL or empty path, or when a trace is already
 * recording (one at a time: stop it first); KILN_OUT_OF_MEMORY when the ring
 * cannot be allocated. Starts kiln if needed. Blocks briefly: each queue's
 * first traced op waits for the work already on that queue, to align its
 * clock with the host's. Thread-safe. */
kiln_status_t kiln_trace_start(const char *path);

/* Stop recording: wait for the traced work (every queue of every device is
 * finished), write the JSON and close the file. The summary of the trace
 * stays readable (kiln_trace_summary) until the next kiln_trace_start.
 * KILN_INVALID_ARGUMENT when no trace is recording; KILN_IO when the file
 * could not be written (the trace is stopped all the same). Blocks.
 * Thread-safe. */
kiln_status_t kiln_trace_stop(void);

/* Whether a trace is recording now. Never blocks. */
bool kiln_trace_active(void);

/* The summary of the trace recording now, or else of the last one stopped:
 * time per op and provider, the ten ops with the most device time, copies,
 * and how long each queue sat idle between its ops. As snprintf: up to
 * size - 1 characters and a NUL are written to out_text (which may be NULL
 * when size is 0), and *out_length gets the whole text's length, so a caller
 * whose buffer was short can call again with length + 1. KILN_NOT_FOUND when
 * no trace was recorded since kiln started; KILN_INVALID_ARGUMENT when
 * out_length is NULL or out_text is NULL with size > 0. Waits for the traced
 * work when a trace is recording. Thread-safe. */
kiln_status_t kiln_trace_summary(char *out_text, size_t size, size_t *out_length);

/* The trace's clock: CLOCK_MONOTONIC in nanoseconds, for kiln_trace_span's
 * start. Never fails. */
int64_t kiln_trace_clock_ns(void);

/* Record host work that is not one of kiln's ops, from start_ns (read from
 * kiln_trace_clock_ns before the work) to now, on the calling thread's host
 * track: a collective (libkiln-comm records each one as category
 * "collective"), or a phase of the caller's own ("phase", "load batch").
 * `bytes` is the data it moved (0 for none; the trace shows GB/s from it);
 * `detail` is free text shown with it (NULL for none; its first 95 bytes are
 * kept). The summary totals spans per category and name. KILN_OK and nothing
 * recorded when no trace records, so callers need not test
 * kiln_trace_active first (though testing it saves reading the clock).
 * KILN_INVALID_ARGUMENT for a NULL or empty category or name, or a start
 * after now. The trace keeps 128 distinct categories and names at most;
 * later ones share one entry. Thread-safe. */
kiln_status_t kiln_trace_span(const char *category, const char *name, int64_t start_ns, uint64_t bytes,
                              const char *detail);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* KILN_TRACE_H */
