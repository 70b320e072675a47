/* runtime/trace_report.c: what a trace's records become: Trace Event Format JSON (Perfetto, chrome://tracing) and the summary table. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/trace_record.h"

/* The process ids of the JSON: the host, then one per device. */
#define HOST_PID 1
static int device_pid(const kiln_device_t *device) { return 2 + (int)device->index; }

/* Every record of the ring, oldest first. */
#define FOR_EACH_RECORD(trace, r)                                                                                    \
  for (uint64_t seq_ = (trace)->next_seq > (trace)->capacity ? (trace)->next_seq - (trace)->capacity : 1;           \
       seq_ < (trace)->next_seq; seq_++)                                                                              \
    for (const kiln__trace_record_t *r = &(trace)->ring[seq_ % (trace)->capacity]; r && r->seq == seq_; r = NULL)

static double us(int64_t ns) { return (double)ns / 1e3; }

static const char *timing_text(int timing) {
  return timing == KILN__TRACE_TIMING_DEVICE ? "the backend's event timestamps"
                                             : "completion observed by the host (the backend gives no timestamps)";
}

/* ---- a growing string ---------------------------------------------------------- */

typedef struct text_t {
  char *data;
  size_t len, cap;
  bool failed;
} text_t;

__attribute__((format(printf, 2, 3))) static void put(text_t *t, const char *fmt, ...) {
  if (t->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->data ? t->data + t->len : NULL, t->data ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
      return;
    }
    if (t->data && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 4096;
    while (cap <= t->len + (size_t)n) cap *= 2;
    char *data = realloc(t->data, cap);
    if (!data) {
      t->failed = true;
      return;
    }
    t->data = data;
    t->cap = cap;
  }
}

/* "[64,1,28,28] [6,1,5,5] -> [64,6,24,24]": the inputs, then the result. */
static void shape_text(const kiln__trace_record_t *r, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  static const int order[3] = {1, 2, 0};
  for (int o = 0; o < 3 && used < size; o++) {
    const int s = order[o];
    if (r->ndim[s] < 0) continue;
    int n = snprintf(out + used, size - used, "%s%s[", used ? " " : "", s == 0 ? "-> " : "");
    for (int d = 0; n >= 0 && d < r->ndim[s] && d < KILN__TRACE_DIMS && used + (size_t)n < size; d++)
      n += snprintf(out + used + n, size - used - (size_t)n, "%s%lld", d ? "," : "", (long long)r->shape[s][d]);
    if (n >= 0 && used + (size_t)n < size)
      n += snprintf(out + used + n, size - used - (size_t)n, "%s]", r->ndim[s] > KILN__TRACE_DIMS ? ",..." : "");
    if (n < 0) break;
    used += (size_t)n;
  }
}

static void dtype_text(const kiln__trace_record_t *r, char *out, size_t size) {
  snprintf(out, size, "%s%s%s%s-> %s", r->ndim[1] >= 0 ? kiln_dtype_name((kiln_dtype_t)r->dtype[1]) : "",
           r->ndim[1] >= 0 ? " " : "", r->ndim[2] >= 0 ? kiln_dtype_name((kiln_dtype_t)r->dtype[2]) : "",
           r->ndim[2] >= 0 ? " " : "", kiln_dtype_name((kiln_dtype_t)r->dtype[0]));
}

/* ---- JSON ---------------------------------------------------------------------- */

/* One output event: the JSON is written in time order, so that every track's
 * timestamps rise. */
enum { EV_HOST, EV_FLOW_START, EV_DEVICE, EV_FLOW_END, EV_COUNTER };
typedef struct event_t {
  int64_t ts;
  uint64_t seq;
  int what;
  const kiln__trace_record_t *r;
} event_t;

static int event_order(const void *a, const void *b) {
  const event_t *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  /* A device slice opens before the flow arrow that ends in it binds to it. */
  if (x->what != y->what) return x->what < y->what ? -1 : 1;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* A span: an X slice on its thread's host track, named and categorised by
 * its caller. */
static void write_span(FILE *f, const kiln__trace_t *trace, const kiln__trace_record_t *r) {
  const int64_t ns = r->host_t1 - r->host_t0;
  fputs("{\"name\":", f);
  json_string(f, r->name);
  fputs(",\"cat\":", f);
  json_string(f, r->provider);
  fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%u,\"args\":{\"detail\":",
          us(r->host_t0 - trace->t_start), us(ns), HOST_PID, (unsigned)r->thread);
  json_string(f, r->detail);
  fprintf(f, ",\"bytes\":%llu,\"gb_per_s\":%.3f}}", (unsigned long long)r->bytes_read,
          ns > 0 ? (double)r->bytes_read / (double)ns : 0.0);
}

static void write_event(FILE *f, const kiln__trace_t *trace, const event_t *e) {
  const kiln__trace_record_t *r = e->r;
  if (r->type == KILN__TRACE_SPAN) {
    write_span(f, trace, r);
    return;
  }
  const double ts = us(e->ts - trace->t_start);
  const int dpid = device_pid(r->device);
  const unsigned long long id = (unsigned long long)r->seq;
  switch (e->what) {
  case EV_HOST: {
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%u,\"args\":{",
            r->name, r->type == KILN__TRACE_OP ? "op" : "copy", ts, us(r->host_t1 - r->host_t0), HOST_PID,
            (unsigned)r->thread);
    fprintf(f, "\"device\":\"%s\",\"queue\":%llu,\"id\":%llu", r->device->selector, (unsigned long long)r->queue_id,
            id);
    if (r->type == KILN__TRACE_OP) {
      char shapes[256], dtypes[64];
      shape_text(r, shapes, sizeof shapes);
      dtype_text(r, dtypes, sizeof dtypes);
      fprintf(f, ",\"provider\":\"%s\",\"why\":\"%s\",\"shapes\":\"%s\",\"dtypes\":\"%s\",\"bytes_read\":%llu,"
                 "\"bytes_written\":%llu",
              r->provider, r->why, shapes, dtypes, (unsigned long long)r->bytes_read,
              (unsigned long long)r->bytes_written);
      if (r->flops > 0) fprintf(f, ",\"flops\":%.0f", r->flops);
    } else {
      const int64_t ns = r->host_t1 - r->host_t0;
      fprintf(f, ",\"direction\":\"%s\",\"bytes\":%llu,\"host_gb_per_s\":%.3f", r->name + 5,
              (unsigned long long)r->bytes_read, ns > 0 ? (double)r->bytes_read / (double)ns : 0.0);
    }
    fputs("}}", f);
    break;
  }
  case EV_FLOW_START:
    fprintf(f, "{\"name\":\"enqueue\",\"cat\":\"flow\",\"ph\":\"s\",\"id\":%llu,\"ts\":%.3f,\"pid\":%d,\"tid\":%u}", id,
            ts, HOST_PID, (unsigned)r->thread);
    break;
  case EV_DEVICE: {
    const int64_t ns = r->dev_t1 - r->dev_t0;
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"device\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%llu,"
               "\"args\":{\"id\":%llu,\"timing\":\"%s\"",
            r->name, ts, us(ns), dpid, (unsigned long long)r->queue_id, id, timing_text(r->timing));
    if (r->type == KILN__TRACE_WAIT) {
      fputs(",\"what\":\"the queue waits for work on another queue\"", f);
    } else if (r->type == KILN__TRACE_OP) {
      fprintf(f, ",\"provider\":\"%s\"", r->provider);
      if (r->flops > 0 && ns > 0) fprintf(f, ",\"gflop_per_s\":%.3f", r->flops / (double)ns);
    } else {
      fprintf(f, ",\"bytes\":%llu,\"gb_per_s\":%.3f", (unsigned long long)r->bytes_read,
              ns > 0 ? (double)r->bytes_read / (double)ns : 0.0);
    }
    fputs("}}", f);
    break;
  }
  case EV_FLOW_END:
    fprintf(f, "{\"name\":\"enqueue\",\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\",\"id\":%llu,\"ts\":%.3f,\"pid\":%d,"
               "\"tid\":%llu}",
            id, ts, dpid, (unsigned long long)r->queue_id);
    break;
  default:
    fprintf(f, "{\"name\":\"memory\",\"cat\":\"memory\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"tid\":0,\"args\":{"
               "\"in_use\":%llu,\"pooled\":%llu}}",
            ts, dpid, (unsigned long long)r->bytes_read, (unsigned long long)r->bytes_written);
    break;
  }
}

static void write_metadata(FILE *f, const kiln__trace_t *trace, bool *first) {
  fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"host\"}}",
          HOST_PID);
  *first = false;
  for (size_t d = 0; d < kiln__rt.device_count; d++) {
    const kiln_device_t *device = kiln__rt.devices[d];
    fprintf(f, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":0,\"args\":{\"name\":",
            device_pid(device));
    json_string(f, device->display_name);
    fputs("}}", f);
  }
  for (size_t i = 0; i < trace->queue_count; i++)
    fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":%llu,\"args\":{\"name\":\"queue "
               "%llu\"}}",
            device_pid(trace->queues[i].device), (unsigned long long)trace->queues[i].id,
            (unsigned long long)trace->queues[i].id);
}

kiln_status_t kiln__trace_write_json(const kiln__trace_t *trace, FILE *f) {
  size_t n = 0;
  FOR_EACH_RECORD(trace, r) n += r->type == KILN__TRACE_MEMORY || r->type == KILN__TRACE_WAIT || r->type == KILN__TRACE_SPAN ? 1 : 4;
  event_t *events = malloc((n ? n : 1) * sizeof *events);
  if (!events)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "kiln_trace_stop: cannot sort the %zu events of \"%s\"", n, trace->path);
  n = 0;
  FOR_EACH_RECORD(trace, r) {
    if (r->type == KILN__TRACE_MEMORY) {
      events[n++] = (event_t){r->host_t0, r->seq, EV_COUNTER, r};
      continue;
    }
    if (r->type == KILN__TRACE_WAIT) {
      if (r->timing != KILN__TRACE_TIMING_NONE) events[n++] = (event_t){r->dev_t0, r->seq, EV_DEVICE, r};
      continue;
    }
    if (r->type == KILN__TRACE_SPAN) {
      events[n++] = (event_t){r->host_t0, r->seq, EV_HOST, r};
      continue;
    }
    events[n++] = (event_t){r->host_t0, r->seq, EV_HOST, r};
    if (r->timing == KILN__TRACE_TIMING_NONE) continue;
    events[n++] = (event_t){r->host_t0, r->seq, EV_FLOW_START, r};
    events[n++] = (event_t){r->dev_t0, r->seq, EV_DEVICE, r};
    events[n++] = (event_t){r->dev_t0, r->seq, EV_FLOW_END, r};
  }
  qsort(events, n, sizeof *events, event_order);
  const uint64_t recorded = trace->next_seq - 1 - trace->dropped;
  fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"kiln %s\",\"clock\":\"CLOCK_MONOTONIC\","
             "\"events_recorded\":%llu,\"events_dropped\":%llu,\"ring_capacity\":%zu},\n\"traceEvents\":[\n",
          kiln_version(), (unsigned long long)recorded, (unsigned long long)trace->dropped, trace->capacity);
  bool first = true;
  write_metadata(f, trace, &first);
  for (size_t i = 0; i < n; i++) {
    fputs(",\n", f);
    write_event(f, trace, &events[i]);
  }
  fputs("\n]}\n", f);
  free(events);
  if (ferror(f))
    return kiln__set_error(KILN_IO, "kiln_trace_stop: writing \"%s\" failed (%s); is the disk full?", trace->path,
                           strerror(errno));
  return KILN_OK;
}

/* ---- the summary ------------------------------------------------------------------ */

typedef struct row_t {
  const char *name, *provider;
  uint64_t calls, bytes; /* bytes: spans' */
  int64_t host_ns, dev_ns;
} row_t;

/* The row of (r's name, r's provider), added when new; NULL when the table
 * (of `cap` rows) is full. The record's host time and call counted. */
static row_t *row_of(row_t *rows, size_t *count, size_t cap, const kiln__trace_record_t *r) {
  size_t i = 0;
  while (i < *count && !(rows[i].name == r->name && rows[i].provider == r->provider)) i++;
  if (i == *count) {
    if (*count == cap) return NULL;
    rows[(*count)++] = (row_t){r->name, r->provider, 0, 0, 0, 0};
  }
  rows[i].calls++;
  rows[i].host_ns += r->host_t1 - r->host_t0;
  return &rows[i];
}

static int row_order(const void *a, const void *b) {
  const row_t *x = a, *y = b;
  if (x->dev_ns != y->dev_ns) return x->dev_ns > y->dev_ns ? -1 : 1;
  return (x->host_ns < y->host_ns) - (x->host_ns > y->host_ns);
}

#define SUMMARY_ROWS 512
#define SUMMARY_TOP 10
#define SUMMARY_SPANS 64

char *kiln__trace_summary_text(const kiln__trace_t *trace) {
  row_t *rows = calloc(SUMMARY_ROWS, sizeof *rows);
  if (!rows) return NULL;
  size_t row_count = 0;
  const kiln__trace_record_t *top[SUMMARY_TOP] = {0};
  struct {
    uint64_t count, bytes;
    int64_t ns;
  } copies[3] = {{0}};
  uint64_t ops = 0, op_records = 0;
  int64_t dev_total = 0, host_total = 0;
  row_t spans[SUMMARY_SPANS];
  size_t span_count = 0;
  FOR_EACH_RECORD(trace, r) {
    if (r->type == KILN__TRACE_SPAN) {
      /* Spans: per category (in provider) and name; host time only. */
      row_t *row = row_of(spans, &span_count, SUMMARY_SPANS, r);
      if (row) row->bytes += r->bytes_read;
      continue;
    }
    if (r->type == KILN__TRACE_MEMORY || r->type == KILN__TRACE_WAIT) continue;
    op_records++;
    const int64_t dev = r->timing ? r->dev_t1 - r->dev_t0 : 0;
    if (r->type == KILN__TRACE_COPY) {
      const int dir = r->name[5] == 'h' ? 0 : r->name[5] == 'd' && r->name[7] == 'h' ? 1 : 2;
      copies[dir].count++;
      copies[dir].bytes += r->bytes_read;
      copies[dir].ns += r->timing ? dev : r->host_t1 - r->host_t0;
      continue;
    }
    ops++;
    dev_total += dev;
    host_total += r->host_t1 - r->host_t0;
    row_t *row = row_of(rows, &row_count, SUMMARY_ROWS, r);
    if (row) row->dev_ns += dev;
    /* The ten longest, kept sorted, longest first. */
    for (int k = 0; k < SUMMARY_TOP; k++) {
      if (top[k] && top[k]->dev_t1 - top[k]->dev_t0 >= dev) continue;
      memmove(&top[k + 1], &top[k], sizeof top[0] * (size_t)(SUMMARY_TOP - 1 - k));
      top[k] = r;
      break;
    }
  }
  qsort(rows, row_count, sizeof *rows, row_order);

  text_t t = {0};
  const int64_t stop = trace->active ? kiln__trace_now() : trace->t_stop;
  put(&t, "kiln trace: %llu ops, %llu copies over %.3f ms; %llu events recorded, %llu dropped (ring of %zu)\n",
      (unsigned long long)ops, (unsigned long long)(op_records - ops), us(stop - trace->t_start) / 1e3,
      (unsigned long long)(trace->next_seq - 1 - trace->dropped), (unsigned long long)trace->dropped,
      trace->capacity);
  put(&t, "\n%-24s %-10s %8s %12s %12s %10s %7s\n", "op", "provider", "calls", "host ms", "device ms", "avg us",
      "device%");
  for (size_t i = 0; i < row_count; i++)
    put(&t, "%-24s %-10s %8llu %12.3f %12.3f %10.2f %6.1f%%\n", rows[i].name, rows[i].provider,
        (unsigned long long)rows[i].calls, us(rows[i].host_ns) / 1e3, us(rows[i].dev_ns) / 1e3,
        us(rows[i].dev_ns) / (double)rows[i].calls, dev_total ? 100.0 * (double)rows[i].dev_ns / (double)dev_total : 0.0);
  put(&t, "%-24s %-10s %8llu %12.3f %12.3f\n", "total", "", (unsigned long long)ops, us(host_total) / 1e3,
      us(dev_total) / 1e3);

  put(&t, "\ntop %d ops by device time\n%-24s %-10s %-8s %12s  %s\n", SUMMARY_TOP, "op", "provider", "device",
      "device us", "shapes");
  for (int k = 0; k < SUMMARY_TOP && top[k]; k++) {
    char shapes[256];
    shape_text(top[k], shapes, sizeof shapes);
    put(&t, "%-24s %-10s %-8s %12.2f  %s\n", top[k]->name, top[k]->provider, top[k]->device->selector,
        us(top[k]->dev_t1 - top[k]->dev_t0), shapes);
  }

  static const char *const directions[3] = {"h2d", "d2h", "d2d"};
  put(&t, "\ncopies\n%-9s %8s %14s %12s %10s\n", "direction", "count", "bytes", "ms", "GB/s");
  for (int d = 0; d < 3; d++)
    if (copies[d].count)
      put(&t, "%-9s %8llu %14llu %12.3f %10.3f\n", directions[d], (unsigned long long)copies[d].count,
          (unsigned long long)copies[d].bytes, us(copies[d].ns) / 1e3,
          copies[d].ns > 0 ? (double)copies[d].bytes / (double)copies[d].ns : 0.0);

  if (span_count) {
    put(&t, "\nspans (host work outside kiln's ops: collectives, the caller's phases)\n%-12s %-24s %8s %12s %14s %10s\n",
        "category", "name", "count", "ms", "bytes", "GB/s");
    for (size_t i = 0; i < span_count; i++)
      put(&t, "%-12s %-24s %8llu %12.3f %14llu %10.3f\n", spans[i].provider, spans[i].name,
          (unsigned long long)spans[i].calls, us(spans[i].host_ns) / 1e3, (unsigned long long)spans[i].bytes,
          spans[i].host_ns > 0 ? (double)spans[i].bytes / (double)spans[i].host_ns : 0.0);
  }

  /* Gaps: where a queue sat idle between its slices, waiting on the host or
   * on another queue. */
  put(&t, "\nqueues (idle: time between the queue's slices, waiting for the host or another queue)\n%-8s %6s %8s %12s %12s "
          "%12s %14s\n",
      "device", "queue", "slices", "busy ms", "span ms", "idle ms", "longest gap us");
  for (size_t i = 0; i < trace->queue_count; i++) {
    const kiln__trace_queue_t *q = &trace->queues[i];
    uint64_t slices = 0;
    int64_t busy = 0, first = 0, last = 0, gap = 0;
    FOR_EACH_RECORD(trace, r) {
      if (r->type == KILN__TRACE_MEMORY || r->type == KILN__TRACE_WAIT || !r->timing || r->queue_id != q->id ||
          r->device != q->device)
        continue;
      if (slices == 0) first = r->dev_t0;
      else if (r->dev_t0 - last > gap) gap = r->dev_t0 - last;
      slices++;
      busy += r->dev_t1 - r->dev_t0;
      last = r->dev_t1;
    }
    if (!slices) continue;
    put(&t, "%-8s %6llu %8llu %12.3f %12.3f %12.3f %14.2f\n", q->device->selector, (unsigned long long)q->id,
        (unsigned long long)slices, us(busy) / 1e3, us(last - first) / 1e3, us(last - first - busy) / 1e3, us(gap));
  }
  free(rows);
  if (t.failed) {
    free(t.data);
    return NULL;
  }
  return t.data ? t.data : strdup("");
}
