/* runtime/trace_record.h: the trace's fixed-size record and its state, shared by runtime/trace.c (recording) and runtime/trace_report.c (JSON, summary). */
#ifndef KILN_RUNTIME_TRACE_RECORD_H
#define KILN_RUNTIME_TRACE_RECORD_H

#include <stdio.h>

#include "runtime/internal.h"
#include "runtime/trace.h"

#define KILN__TRACE_DIMS 4       /* dimensions kept per shape (more are shown as "...") */
#define KILN__TRACE_QUEUES 64    /* queues with device-side times; later ones keep their host side */
#define KILN__TRACE_PENDING 4096 /* events per queue awaiting their timestamps */

/* WAIT: a queue told to wait for another's event; its device slice is the
 * wait, so that the work after it starts where the wait ends. */
/* SPAN: host work outside kiln's ops (kiln_trace_span: a collective, the
 * caller's phase); `provider` holds its category, `detail` its text. */
enum { KILN__TRACE_OP = 1, KILN__TRACE_COPY, KILN__TRACE_MEMORY, KILN__TRACE_WAIT, KILN__TRACE_SPAN };
enum { KILN__TRACE_TIMING_NONE, KILN__TRACE_TIMING_DEVICE, KILN__TRACE_TIMING_HOST };

#define KILN__TRACE_DETAIL 96 /* a span's detail text, with its NUL */

/* One op, copy, memory sample or span. Strings are static storage (op names,
 * provider names of loaded backends, policy names; a span's category and
 * name are interned by runtime/trace.c until the trace stops). Times in ns on
 * kiln__trace_now's clock; dev_t0/dev_t1 0 until resolved. */
typedef struct kiln__trace_record_t {
  uint64_t seq; /* from 1, the flow id; 0 for an empty slot */
  const char *name;
  const char *provider;
  const char *why;
  kiln_device_t *device;
  uint64_t queue_id;
  int64_t host_t0, host_t1;
  int64_t dev_t0, dev_t1;
  uint64_t bytes_read, bytes_written; /* a memory sample: in use, pooled */
  double flops;
  uint16_t thread;
  uint8_t type, timing;
  int8_t ndim[3]; /* out, in[0], in[1]; -1 when absent */
  uint8_t dtype[3];
  union {
    int64_t shape[3][KILN__TRACE_DIMS];
    char detail[KILN__TRACE_DETAIL]; /* a span's */
  };
} kiln__trace_record_t;

typedef struct kiln__trace_pending_t {
  uint64_t seq;
  kiln_backend_event_t *event;
} kiln__trace_pending_t;

/* A queue seen by the trace. */
typedef struct kiln__trace_queue_t {
  uint64_t id;
  kiln_device_t *device;
  kiln_backend_event_t *anchor; /* completed at anchor_ns on the host's clock */
  int64_t anchor_ns;
  int64_t last_end;  /* the end of the queue's latest device slice */
  bool host_timing;  /* the backend gave no elapsed time: completion as the host saw it */
  unsigned head, count;
  kiln__trace_pending_t *pending; /* KILN__TRACE_PENDING of them, malloc'ed */
} kiln__trace_queue_t;

typedef struct kiln__trace_t {
  bool active;
  kiln__trace_record_t *ring;
  size_t capacity;
  uint64_t next_seq;
  uint64_t dropped;
  FILE *file;
  char *path;
  int64_t t_start, t_stop;
  kiln__trace_queue_t queues[KILN__TRACE_QUEUES];
  size_t queue_count;
} kiln__trace_t;

/* Write the trace's JSON (Trace Event Format). KILN_IO naming the path on a
 * write error. */
kiln_status_t kiln__trace_write_json(const kiln__trace_t *trace, FILE *file);
/* The summary's text (malloc'ed; NULL when out of memory). */
char *kiln__trace_summary_text(const kiln__trace_t *trace);

#endif /* KILN_RUNTIME_TRACE_RECORD_H */
