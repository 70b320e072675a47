/* tests/test_trace.c: the trace (kiln/trace.h): its JSON checked structurally with json-c, its counters against kiln_device_memory_stats, its device times against the test's own clock, and its refusals. */
#include <json-c/json.h>
#include <math.h>
#include <sys/wait.h>
#include <time.h>

#include "common.h"

/* The device traced: KILN_TEST_TRACE_DEVICE's first device of that backend
 * ("cpu", the default, or "opencl"). */
static const char *trace_backend(void) {
  const char *b = getenv("KILN_TEST_TRACE_DEVICE");
  return b && *b ? b : "cpu";
}

static kiln_device_t *traced_device(void) {
  kiln_device_t *device = NULL;
  char selector[32];
  snprintf(selector, sizeof selector, "%s:0", trace_backend());
  KT_OK(kiln_device_find(selector, &device));
  return device;
}

static char dir[4096];

static void make_dir(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kiln-trace-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void) { kt_remove_tree_(dir); }

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static kiln_tensor_t *filled(kiln_device_t *device, int64_t rows, int64_t cols, float value) {
  float *host = malloc(sizeof(float) * (size_t)(rows * cols));
  for (int64_t i = 0; i < rows * cols; i++) host[i] = value + (float)(i % 7) * 0.125f;
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_from_host(device, KILN_F32, 2, (int64_t[]){rows, cols}, host, &t));
  free(host);
  return t;
}

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
} track_t;

static track_t *track_of(track_t *tracks, int *count, int64_t pid, int64_t tid) {
  for (int i = 0; i < *count; i++)
    if (tracks[i].pid == pid && tracks[i].tid == tid) return &tracks[i];
  ck_assert_int_lt(*count, TRACKS);
  tracks[*count] = (track_t){pid, tid, -1e300, -1e300, 0};
  return &tracks[(*count)++];
}

typedef struct checked_t {
  int ops, copies, counters, flows;
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
      } else {
        ck_assert_str_eq(cat, "copy");
        c.copies++;
        ck_assert_ptr_nonnull(str_field(args, "direction"));
        ck_assert_ptr_nonnull(field(args, "bytes"));
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

/* ---- the cases ------------------------------------------------------------------- */

#define TIMED_MATMULS 5
#define TIMED_N 384

START_TEST(test_trace_run) {
  make_dir();
  kiln_device_t *device = traced_device();
  kiln_device_t *cpu = NULL;
  KT_OK(kiln_device_find("cpu:0", &cpu));
  kiln_device_info_t info;
  KT_OK(kiln_device_info(device, &info));
  kiln_queue_t *queue = kiln_device_current_queue(device);
  char path[4200];
  snprintf(path, sizeof path, "%s/trace.json", dir);

  /* Before the trace: inputs; warm the kernels so that compiling is not timed. */
  kiln_tensor_t *a = filled(device, TIMED_N, TIMED_N, 0.5f), *b = filled(device, TIMED_N, TIMED_N, -0.25f);
  kiln_tensor_t *warm = NULL;
  KT_OK(kiln_tensor_matmul(a, b, false, false, &warm));
  kiln_tensor_release(warm);
  KT_OK(kiln_queue_finish(queue));

  KT_OK(kiln_trace_start(path));
  ck_assert(kiln_trace_active());
  /* A few small ops, elementwise ones, copies both ways. */
  kiln_tensor_t *x = filled(device, 16, 32, 1.0f), *w = filled(device, 32, 8, 0.5f);
  kiln_tensor_t *y = NULL, *z = NULL, *r = NULL, *moved = NULL;
  KT_OK(kiln_tensor_matmul(x, w, false, false, &y));
  KT_OK(kiln_tensor_add(y, y, &z));
  KT_OK(kiln_tensor_relu(z, &r));
  KT_OK(kiln_tensor_mul_scalar(r, 2.0, &moved));
  kiln_tensor_release(moved);
  moved = NULL;
  KT_OK(kiln_tensor_to(r, cpu, &moved));
  float host[16 * 8];
  KT_OK(kiln_tensor_read(r, host, sizeof host));

  /* The timed part: each matmul alone on an idle queue, timed by the host
   * around the synchronised call, and by the backend's events around the
   * kernel alone. */
  double wall_us = 0, events_us = 0;
  for (int i = 0; i < TIMED_MATMULS; i++) {
    kiln_tensor_t *c = NULL;
    kiln_event_t *e0 = NULL, *e1 = NULL;
    double t0 = now_us();
    KT_OK(kiln_queue_record(queue, &e0));
    KT_OK(kiln_tensor_matmul(a, b, false, false, &c));
    KT_OK(kiln_queue_record(queue, &e1));
    KT_OK(kiln_queue_finish(queue));
    wall_us += now_us() - t0;
    double ms = 0;
    KT_OK(kiln_event_elapsed(e0, e1, &ms));
    events_us += ms * 1e3;
    kiln_event_release(e0);
    kiln_event_release(e1);
    kiln_tensor_release(c);
  }
  kiln_tensor_release(x);
  kiln_tensor_release(w);
  kiln_tensor_release(y);
  kiln_tensor_release(z);
  kiln_tensor_release(r);
  kiln_tensor_release(moved);
  KT_OK(kiln_trace_stop());
  ck_assert(!kiln_trace_active());
  kiln_memory_stats_t stats;
  KT_OK(kiln_device_memory_stats(device, &stats));

  checked_t c = check_json(path, 2 + (int)info.index);
  ck_assert_int_eq(c.dropped, 0);
  /* matmul x 6, add, relu, mul_scalar; the copies: two h2d, the read, maybe tensor_to. */
  ck_assert_int_ge(c.ops, 4 + TIMED_MATMULS);
  ck_assert_int_ge(c.copies, 3);
  ck_assert_int_ge(c.flows, c.ops + c.copies);
  ck_assert_int_eq(c.matmul_flops_seen, 2LL * TIMED_N * TIMED_N * TIMED_N);
  ck_assert_int_ge(c.counters, 2);
  ck_assert_uint_eq(c.last_in_use, stats.in_use_bytes);
  ck_assert_uint_eq(c.last_pooled, stats.pooled_bytes);
  /* The device slices of the matmuls, summed, lie between the kernels'
   * own time (the events the test recorded around each) and the host's time
   * around each synchronised call, within 10% either way. The host's side
   * also counts waking the waiting thread, which a loaded machine makes
   * long: so it bounds from above only. The first matmul (16x32x8) counts
   * too; it is tiny against the timed ones. */
  ck_assert_msg(c.matmul_device_us >= 0.90 * events_us && c.matmul_device_us <= 1.10 * wall_us,
                "matmul device time %.1f us: the kernels' events say %.1f us, the host %.1f us around the "
                "synchronised calls (over 10%% outside)",
                c.matmul_device_us, events_us, wall_us);
  fprintf(stderr, "matmul: trace %.1f us, events %.1f us, host %.1f us\n", c.matmul_device_us, events_us, wall_us);
  /* The summary: the kinds and a header. */
  size_t length = 0;
  KT_OK(kiln_trace_summary(NULL, 0, &length));
  ck_assert_uint_gt(length, 100);
  char *text = malloc(length + 1);
  size_t again = 0;
  KT_OK(kiln_trace_summary(text, length + 1, &again));
  ck_assert_uint_eq(again, length);
  ck_assert_ptr_nonnull(strstr(text, "matmul"));
  ck_assert_ptr_nonnull(strstr(text, "relu"));
  ck_assert_ptr_nonnull(strstr(text, "top 10 ops by device time"));
  ck_assert_ptr_nonnull(strstr(text, "h2d"));
  free(text);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  remove_dir();
}
END_TEST

START_TEST(test_trace_ring_drops) {
  make_dir();
  char path[4200];
  snprintf(path, sizeof path, "%s/small.json", dir);
  setenv("KILN_TRACE_EVENTS", "16", 1);
  kiln_device_t *device = traced_device();
  kiln_tensor_t *x = filled(device, 4, 4, 1.0f);
  KT_OK(kiln_trace_start(path));
  for (int i = 0; i < 40; i++) {
    kiln_tensor_t *y = NULL;
    KT_OK(kiln_tensor_add(x, x, &y));
    kiln_tensor_release(y);
  }
  KT_OK(kiln_trace_stop());
  kiln_device_info_t info;
  KT_OK(kiln_device_info(device, &info));
  checked_t c = check_json(path, 2 + (int)info.index);
  ck_assert_int_gt(c.dropped, 0);
  kiln_tensor_release(x);
  remove_dir();
}
END_TEST

START_TEST(test_trace_bad_input) {
  make_dir();
  KT_FAILS(kiln_trace_start(NULL), KILN_INVALID_ARGUMENT, "NULL");
  KT_FAILS(kiln_trace_start(""), KILN_INVALID_ARGUMENT, "empty");
  char path[4200];
  snprintf(path, sizeof path, "%s/absent/trace.json", dir);
  KT_FAILS(kiln_trace_start(path), KILN_IO, "absent/trace.json");
  ck_assert(!kiln_trace_active());
  KT_FAILS(kiln_trace_stop(), KILN_INVALID_ARGUMENT, "no trace is recording");
  size_t length = 0;
  KT_FAILS(kiln_trace_summary(NULL, 0, &length), KILN_NOT_FOUND, "no trace was recorded");
  KT_FAILS(kiln_trace_summary(NULL, 4, &length), KILN_INVALID_ARGUMENT, "out_text");
  KT_FAILS(kiln_trace_summary(NULL, 0, NULL), KILN_INVALID_ARGUMENT, "out_length");
  snprintf(path, sizeof path, "%s/one.json", dir);
  KT_OK(kiln_trace_start(path));
  char second[4200];
  snprintf(second, sizeof second, "%s/two.json", dir);
  KT_FAILS(kiln_trace_start(second), KILN_INVALID_ARGUMENT, "already recording");
  KT_OK(kiln_trace_stop());
  /* An empty trace is still a valid file. */
  json_object *root = json_object_from_file(path);
  ck_assert_ptr_nonnull(root);
  json_object_put(root);
  remove_dir();
}
END_TEST

START_TEST(test_trace_from_environment) {
  make_dir();
  char path[4200];
  snprintf(path, sizeof path, "%s/env.json", dir);
  setenv("KILN_TRACE", path, 1);
  kiln_device_t *device = traced_device();
  ck_assert(kiln_trace_active());
  kiln_device_info_t info;
  KT_OK(kiln_device_info(device, &info));
  const int pid = 2 + (int)info.index;
  kiln_tensor_t *x = filled(device, 4, 4, 1.0f), *y = NULL;
  KT_OK(kiln_tensor_add(x, x, &y));
  kiln_tensor_release(x);
  kiln_tensor_release(y);
  /* kiln_deinitialize stops the trace and writes it. */
  kiln_deinitialize();
  ck_assert(!kiln_trace_active());
  checked_t c = check_json(path, pid);
  ck_assert_int_eq(c.ops, 1);
  ck_assert_int_eq(c.copies, 1);
  ck_assert_int_eq(c.last_in_use, 0);
  unsetenv("KILN_TRACE");
  remove_dir();
}
END_TEST

START_TEST(test_trace_environment_refused) {
  make_dir();
  char path[4200];
  snprintf(path, sizeof path, "%s/absent/env.json", dir);
  setenv("KILN_TRACE", path, 1);
  kiln_device_t *device = NULL;
  KT_FAILS(kiln_device_find("cpu:0", &device), KILN_IO, "KILN_TRACE=");
  ck_assert_ptr_nonnull(strstr(kiln_last_error(), "absent/env.json"));
  unsetenv("KILN_TRACE");
  remove_dir();
}
END_TEST

START_TEST(test_trace_events_refused) {
  setenv("KILN_TRACE_EVENTS", "12", 1);
  kiln_device_t *device = NULL;
  KT_FAILS(kiln_device_find("cpu:0", &device), KILN_INVALID_ARGUMENT,
           "KILN_TRACE_EVENTS=\"12\" is not an event count; use an integer from 16 to 100000000");
  unsetenv("KILN_TRACE_EVENTS");
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  unsetenv("KILN_TRACE");
  unsetenv("KILN_TRACE_EVENTS");
  if (strcmp(trace_backend(), "cpu") != 0) {
    /* Asked in a child: each case forks, and the parent must not have
     * started kiln's (or the OpenCL driver's) threads. */
    pid_t child = fork();
    if (child == 0) {
      kiln_device_t *device = NULL;
      char selector[32];
      snprintf(selector, sizeof selector, "%s:0", trace_backend());
      if (kiln_device_find(selector, &device) != KILN_OK) {
        printf("test_trace: no %s device (%s); skipped\n", selector, kiln_last_error());
        _exit(77);
      }
      _exit(0);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return 77;
  }
  Suite *s = suite_create("trace");
  TCase *tc = tcase_create("trace");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_trace_bad_input);
  tcase_add_test(tc, test_trace_run);
  tcase_add_test(tc, test_trace_ring_drops);
  tcase_add_test(tc, test_trace_from_environment);
  tcase_add_test(tc, test_trace_environment_refused);
  tcase_add_test(tc, test_trace_events_refused);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
