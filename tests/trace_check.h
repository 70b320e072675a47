/* tests/trace_check.h: a trace's JSON checked with json-c against the rules Perfetto and chrome://tracing rely on (tests/test_trace.c, tests/nn/test_nn_trace.c). */
#ifndef KILN_TESTS_TRACE_CHECK_H
#define KILN_TESTS_TRACE_CHECK_H

#include <check.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the JSON ------------------------------------------------------------------ */

static json_object *field(json_object *o, const char *key) {
  json_object *v = NULL;
  return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

static const char *str_field(json_object *o, const char *key) {
  json_object *v = field(o, key);
  return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

#define TRACKS 64
typedef struct track_t {
  int64_t pid, tid;
  double last_ts;  /* every event */
  double last_end; /* X slices on device tracks: they never overlap */
  int open;        /* B minus E */
  double busy;     /* device tracks: the slices' time but waits for other queues */
} track_t;

static track_t *track_of(track_t *tracks, int *count, int64_t pid, int64_t tid) {
  for (int i = 0; i < *count; i++)
    if (tracks[i].pid == pid && tracks[i].tid == tid) return &tracks[i];
  ck_assert_int_lt(*count, TRACKS);
  tracks[*count] = (track_t){pid, tid, -1e300, -1e300, 0, 0};
  return &tracks[(*count)++];
}

typedef struct checked_t {
  int ops, copies, counters, flows, spans, device_slices;
  double device_busy_us, device_first_us, device_last_us; /* the device's slices: the busiest queue's time in them
                                                           (waits for other queues aside), first start, last end */
  double matmul_device_us; /* every matmul slice on the device's tracks */
  int64_t matmul_flops_seen;
  uint64_t last_in_use, last_pooled;
  int64_t dropped;
} checked_t;

/* Every rule the importers rely on: the required fields, X slices with a
 * duration, B/E balanced, timestamps rising per track, device slices apart,
 * flows s -> f matched by id. */
static checked_t check_json(const char *path, int device_pid) {
  checked_t c = {0};
  json_object *root = json_object_from_file(path);
  ck_assert_msg(root != NULL, "%s is not JSON: %s", path, json_util_get_last_err());
  json_object *other = field(root, "otherData");
  ck_assert_ptr_nonnull(other);
  ck_assert_ptr_nonnull(field(other, "events_dropped"));
  c.dropped = json_object_get_int64(field(other, "events_dropped"));
  json_object *events = field(root, "traceEvents");
  ck_assert_ptr_nonnull(events);
  ck_assert(json_object_is_type(events, json_type_array));
  const size_t n = json_object_array_length(events);
  ck_assert_uint_gt(n, 10);
  track_t tracks[TRACKS];
  int track_count = 0;
  /* Flow ids: +1 at s, and f must find one open. */
  size_t max_id = (size_t)1 << 20;
  int *flow = calloc(max_id, sizeof *flow);
  for (size_t i = 0; i < n; i++) {
    json_object *e = json_object_array_get_idx(events, i);
    const char *name = str_field(e, "name"), *ph = str_field(e, "ph");
    ck_assert_msg(name && ph && field(e, "ts") && field(e, "pid") && field(e, "tid"),
                  "event %zu lacks name/ph/ts/pid/tid: %s", i, json_object_to_json_string(e));
    const double ts = json_object_get_double(field(e, "ts"));
    const int64_t pid = json_object_get_int64(field(e, "pid")), tid = json_object_get_int64(field(e, "tid"));
    if (!strcmp(ph, "M")) continue;
    track_t *t = track_of(tracks, &track_count, pid, tid);
    ck_assert_msg(ts >= t->last_ts, "event %zu (%s %s) at %.3f before %.3f on track %lld/%lld", i, ph, name, ts,
                  t->last_ts, (long long)pid, (long long)tid);
    t->last_ts = ts;
    json_object *args = field(e, "args");
    if (!strcmp(ph, "X")) {
      ck_assert_ptr_nonnull(field(e, "dur"));
      const double dur = json_object_get_double(field(e, "dur"));
      ck_assert_msg(dur >= 0, "event %zu has a negative duration", i);
      const char *cat = str_field(e, "cat");
      ck_assert_ptr_nonnull(cat);
      if (!strcmp(cat, "device")) {
        ck_assert_msg(ts + 0.002 >= t->last_end, "device slices overlap on track %lld/%lld at %.3f",
                      (long long)pid, (long long)tid, ts);
        t->last_end = ts + dur;
        if (pid == device_pid && !strcmp(name, "matmul")) c.matmul_device_us += dur;
        if (pid == device_pid) {
          if (c.device_slices++ == 0) c.device_first_us = ts;
          if (strcmp(name, "wait") != 0) t->busy += dur;
          if (t->busy > c.device_busy_us) c.device_busy_us = t->busy;
          if (ts + dur > c.device_last_us) c.device_last_us = ts + dur;
        }
        ck_assert_ptr_nonnull(str_field(args, "timing"));
      } else if (!strcmp(cat, "op")) {
        c.ops++;
        ck_assert_ptr_nonnull(str_field(args, "provider"));
        ck_assert_ptr_nonnull(str_field(args, "why"));
        ck_assert_ptr_nonnull(str_field(args, "shapes"));
        ck_assert_ptr_nonnull(str_field(args, "dtypes"));
        ck_assert_ptr_nonnull(field(args, "bytes_read"));
        ck_assert_ptr_nonnull(field(args, "bytes_written"));
        if (!strcmp(name, "matmul")) {
          ck_assert_ptr_nonnull(field(args, "flops"));
          c.matmul_flops_seen = json_object_get_int64(field(args, "flops"));
        }
      } else if (!strcmp(cat, "copy")) {
        c.copies++;
        ck_assert_ptr_nonnull(str_field(args, "direction"));
        ck_assert_ptr_nonnull(field(args, "bytes"));
      } else {
        /* A span (kiln_trace_span): host work of any category. */
        ck_assert_msg(pid == 1, "span \"%s\" (%s) is on pid %lld, not the host's", name, cat, (long long)pid);
        ck_assert_ptr_nonnull(str_field(args, "detail"));
        ck_assert_ptr_nonnull(field(args, "bytes"));
        c.spans++;
      }
    } else if (!strcmp(ph, "B")) {
      t->open++;
    } else if (!strcmp(ph, "E")) {
      ck_assert_msg(t->open > 0, "E without B on track %lld/%lld", (long long)pid, (long long)tid);
      t->open--;
    } else if (!strcmp(ph, "s") || !strcmp(ph, "f")) {
      const int64_t id = json_object_get_int64(field(e, "id"));
      ck_assert(id > 0 && (size_t)id < max_id);
      if (ph[0] == 's') {
        ck_assert_int_eq(flow[id], 0);
        flow[id] = 1;
        c.flows++;
      } else {
        ck_assert_msg(flow[id] == 1, "flow end %lld without its start", (long long)id);
        ck_assert_str_eq(str_field(e, "bp"), "e");
        flow[id] = 2;
      }
    } else if (!strcmp(ph, "C")) {
      if (pid == device_pid) {
        c.counters++;
        c.last_in_use = (uint64_t)json_object_get_int64(field(args, "in_use"));
        c.last_pooled = (uint64_t)json_object_get_int64(field(args, "pooled"));
      }
    } else {
      ck_abort_msg("event %zu has ph \"%s\", which the trace never writes", i, ph);
    }
  }
  for (size_t id = 0; id < max_id; id++) ck_assert_msg(flow[id] != 1, "flow %zu never ends", id);
  for (int i = 0; i < track_count; i++) ck_assert_int_eq(tracks[i].open, 0);
  free(flow);
  json_object_put(root);
  return c;
}

#endif /* KILN_TESTS_TRACE_CHECK_H */
