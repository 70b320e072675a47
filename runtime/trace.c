/* runtime/trace.c: the trace of every op, copy and allocation: a ring of fixed-size records, device times from each queue's events, start and stop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/internal.h"
#include "runtime/trace.h"
#include "runtime/trace_record.h"

atomic_bool kiln__trace_on;

/* Everything below is guarded by `lock`; `control` orders start and stop. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t control = PTHREAD_MUTEX_INITIALIZER;
static kiln__trace_t tr;
/* The summary of the last trace stopped (malloc'ed), until the next start. */
static char *last_summary;
static bool exit_hook_set;

/* Each device's memory as the pool last reported it, written by the pool's
 * hook without the lock and sampled into the ring at the next traced work on
 * the device: a change costs two stores, and the counter track keeps one
 * sample per op at most. Indexed by the device's visible index. */
#define TRACE_DEVICES 64
static struct {
  _Atomic uint64_t in_use, pooled;
  atomic_bool changed;
} memory_now[TRACE_DEVICES];

static atomic_uint next_thread = 1;
static _Thread_local uint16_t thread_no;

int64_t kiln__trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

static uint16_t this_thread(void) {
  if (!thread_no) thread_no = (uint16_t)atomic_fetch_add_explicit(&next_thread, 1, memory_order_relaxed);
  return thread_no;
}

/* ---- the ring ------------------------------------------------------------------ */

/* The slot for the next record; the oldest is overwritten (and counted) when
 * the ring is full. Called with the lock held. */
static kiln__trace_record_t *append_locked(void) {
  const uint64_t seq = tr.next_seq++;
  kiln__trace_record_t *r = &tr.ring[seq % tr.capacity];
  if (r->seq) tr.dropped++;
  memset(r, 0, sizeof *r);
  r->seq = seq;
  return r;
}

/* ---- device-side times ---------------------------------------------------------- */

/* A record's device slice ends where its event completed: the queue's anchor
 * event (waited for when the queue was first seen, at a known host time)
 * plus the backend's elapsed time to this event. It starts where the queue's
 * previous slice ended, or at the host's enqueue when the queue was idle:
 * an in-order queue runs one thing at a time, so its slices never overlap.
 * A backend without timestamps gives the host's time of seeing it complete. */
static void resolve_one(kiln__trace_queue_t *q, const kiln__trace_pending_t *p) {
  kiln_device_t *device = q->device;
  int64_t end = 0;
  if (!q->host_timing) {
    double ms = 0;
    if (device->iface->event_elapsed(device->ctx, q->anchor, p->event, &ms) == KILN_OK) {
      end = q->anchor_ns + (int64_t)(ms * 1e6);
    } else {
      kiln_clear_error();
      q->host_timing = true;
    }
  }
  if (q->host_timing) end = kiln__trace_now();
  kiln__trace_record_t *r = &tr.ring[p->seq % tr.capacity];
  if (r->seq != p->seq) return; /* overwritten since */
  /* On an idle queue an op starts once its enqueue returned (a first use may
   * spend seconds compiling its kernel before that), but not after its end;
   * a copy or a wait, from its call's start. */
  int64_t earliest = r->type == KILN__TRACE_OP ? r->host_t1 : r->host_t0;
  if (earliest > end) earliest = end;
  int64_t start = q->last_end > earliest ? q->last_end : earliest;
  if (end < start) end = start;
  q->last_end = end;
  r->dev_t0 = start;
  r->dev_t1 = end;
  r->timing = q->host_timing ? KILN__TRACE_TIMING_HOST : KILN__TRACE_TIMING_DEVICE;
}

/* Resolve the queue's pending events, oldest first: those complete already,
 * or all of them when `wait`. Called with the lock held. */
static void resolve_locked(kiln__trace_queue_t *q, bool wait) {
  kiln_device_t *device = q->device;
  while (q->count) {
    kiln__trace_pending_t *p = &q->pending[q->head];
    kiln_status_t status = wait ? device->iface->event_wait(device->ctx, p->event)
                                : device->iface->event_query(device->ctx, p->event);
    if (status == KILN_NOT_READY) break;
    if (status != KILN_OK) kiln_clear_error(); /* the queue reports its own failure at its finish */
    resolve_one(q, p);
    device->iface->event_release(device->ctx, p->event);
    q->head = (q->head + 1) % KILN__TRACE_PENDING;
    q->count--;
  }
}

/* The queue's state, created when the trace starts or the queue is: the
 * anchor event is recorded and waited for, so that its completion is now on
 * the host's clock. NULL when the table is full or the anchor fails (the record keeps
 * its host side only). Called with the lock held. */
static kiln__trace_queue_t *queue_locked(kiln_queue_t *queue) {
  for (size_t i = 0; i < tr.queue_count; i++)
    if (tr.queues[i].id == queue->id && tr.queues[i].device == queue->device) return &tr.queues[i];
  if (tr.queue_count == KILN__TRACE_QUEUES) return NULL;
  kiln_device_t *device = queue->device;
  kiln__trace_pending_t *pending = malloc(KILN__TRACE_PENDING * sizeof *pending);
  if (!pending) return NULL;
  kiln_backend_event_t *anchor = NULL;
  if (device->iface->queue_record(device->ctx, queue->impl, &anchor) != KILN_OK) {
    kiln_clear_error();
    free(pending);
    return NULL;
  }
  if (device->iface->event_wait(device->ctx, anchor) != KILN_OK) kiln_clear_error();
  kiln__trace_queue_t *q = &tr.queues[tr.queue_count++];
  memset(q, 0, sizeof *q);
  q->id = queue->id;
  q->device = device;
  q->anchor = anchor;
  q->pending = pending;
  q->anchor_ns = kiln__trace_now();
  q->last_end = q->anchor_ns;
  return q;
}

void kiln__trace_queue(kiln_queue_t *queue) {
  pthread_mutex_lock(&lock);
  if (tr.active) queue_locked(queue);
  pthread_mutex_unlock(&lock);
}

/* Kiln_trace_start: every queue's clock aligned before its first traced op
 * (which waits for the work already on it). Called with the lock held. */
static void queue_align_locked(kiln_queue_t *queue) { queue_locked(queue); }

static void memory_locked(kiln_device_t *device, uint64_t in_use, uint64_t pooled, int64_t ts);

/* The device's memory, when it changed since its last sample. Called with
 * the lock held. */
static void memory_sample_locked(kiln_device_t *device, int64_t ts) {
  if (device->index >= TRACE_DEVICES) return;
  if (!atomic_exchange_explicit(&memory_now[device->index].changed, false, memory_order_acquire)) return;
  memory_locked(device, atomic_load_explicit(&memory_now[device->index].in_use, memory_order_relaxed),
                atomic_load_explicit(&memory_now[device->index].pooled, memory_order_relaxed), ts);
}

/* Append `r` (filled by the caller but for seq) and an event after it on
 * `queue` for its device side. */
static void append_timed(kiln_queue_t *queue, const kiln__trace_record_t *filled) {
  pthread_mutex_lock(&lock);
  if (!tr.active) {
    pthread_mutex_unlock(&lock);
    return;
  }
  kiln__trace_queue_t *q = queue_locked(queue);
  kiln__trace_record_t *r = append_locked();
  const uint64_t seq = r->seq;
  *r = *filled;
  r->seq = seq;
  memory_sample_locked(queue->device, filled->host_t0);
  if (q) {
    kiln_device_t *device = queue->device;
    /* Asked in batches: a query per op would cost more than the op on a
     * fast queue. */
    if (q->count % 32 == 31) resolve_locked(q, false);
    /* Full: the oldest is long done in practice (a queue holds at most
     * KILN__QUEUE_DEPTH ops in flight). */
    if (q->count == KILN__TRACE_PENDING) {
      kiln__trace_pending_t *p = &q->pending[q->head];
      if (device->iface->event_wait(device->ctx, p->event) != KILN_OK) kiln_clear_error();
      resolve_locked(q, false);
    }
    kiln_backend_event_t *event = NULL;
    if (device->iface->queue_record(device->ctx, queue->impl, &event) == KILN_OK) {
      q->pending[(q->head + q->count) % KILN__TRACE_PENDING] = (kiln__trace_pending_t){seq, event};
      q->count++;
    } else {
      kiln_clear_error();
    }
  }
  pthread_mutex_unlock(&lock);
}

/* ---- the hooks ------------------------------------------------------------------- */

static void shape_of(kiln__trace_record_t *r, int slot, const kiln_tensor_t *t) {
  r->ndim[slot] = (int8_t)t->ndim;
  r->dtype[slot] = (uint8_t)t->dtype;
  for (int d = 0; d < t->ndim && d < KILN__TRACE_DIMS; d++) r->shape[slot][d] = t->shape[d];
}

static uint64_t tensor_bytes(const kiln_tensor_t *t) {
  return (uint64_t)kiln_tensor_numel(t) * kiln_dtype_size(t->dtype);
}

void kiln__trace_op(kiln_queue_t *queue, const kiln_op_t *op, const char *name, const kiln_tensor_t *out,
                    const kiln_tensor_t *const *inputs, const char *provider, const char *why, int64_t t0) {
  const int64_t t1 = kiln__trace_now();
  kiln__trace_record_t r;
  memset(&r, 0, sizeof r);
  r.type = KILN__TRACE_OP;
  r.name = name;
  r.provider = provider;
  r.why = why;
  r.device = queue->device;
  r.queue_id = queue->id;
  r.thread = this_thread();
  r.host_t0 = t0;
  for (int s = 0; s < 3; s++) r.ndim[s] = -1;
  shape_of(&r, 0, out);
  r.bytes_written = tensor_bytes(out);
  for (int i = 0; inputs && i < op->n_in; i++) {
    if (!inputs[i]) continue;
    if (i < 2) shape_of(&r, 1 + i, inputs[i]);
    r.bytes_read += tensor_bytes(inputs[i]);
  }
  switch (op->kind) {
  case KILN_OP_MATMUL:
    r.flops = 2.0 * (double)op->u.matmul.m * (double)op->u.matmul.n * (double)op->u.matmul.k *
              (double)(op->u.matmul.batch > 0 ? op->u.matmul.batch : 1);
    break;
  case KILN_OP_CONV2D:
  case KILN_OP_CONV2D_BACKWARD_INPUT:
  case KILN_OP_CONV2D_BACKWARD_WEIGHT:
    r.flops = 2.0 * (double)op->u.conv2d.n * (double)op->u.conv2d.k * (double)op->u.conv2d.p *
              (double)op->u.conv2d.q * (double)op->u.conv2d.c * (double)op->u.conv2d.r * (double)op->u.conv2d.s;
    break;
  default: break;
  }
  r.host_t1 = t1;
  append_timed(queue, &r);
}

void kiln__trace_copy(kiln_queue_t *queue, kiln__trace_copy_t direction, size_t bytes, int64_t t0) {
  static const char *const names[] = {"copy h2d", "copy d2h", "copy d2d"};
  kiln__trace_record_t r;
  memset(&r, 0, sizeof r);
  r.type = KILN__TRACE_COPY;
  r.name = names[direction];
  r.device = queue->device;
  r.queue_id = queue->id;
  r.thread = this_thread();
  r.host_t0 = t0;
  r.bytes_read = bytes;
  r.bytes_written = bytes;
  for (int s = 0; s < 3; s++) r.ndim[s] = -1;
  r.host_t1 = kiln__trace_now();
  append_timed(queue, &r);
}

void kiln__trace_wait(kiln_queue_t *queue, int64_t t0) {
  kiln__trace_record_t r;
  memset(&r, 0, sizeof r);
  r.type = KILN__TRACE_WAIT;
  r.name = "wait";
  r.device = queue->device;
  r.queue_id = queue->id;
  r.thread = this_thread();
  r.host_t0 = t0;
  for (int s = 0; s < 3; s++) r.ndim[s] = -1;
  r.host_t1 = kiln__trace_now();
  append_timed(queue, &r);
}

static void memory_locked(kiln_device_t *device, uint64_t in_use, uint64_t pooled, int64_t ts) {
  kiln__trace_record_t *r = append_locked();
  r->type = KILN__TRACE_MEMORY;
  r->name = "memory";
  r->device = device;
  r->thread = this_thread();
  r->host_t0 = r->host_t1 = ts;
  r->bytes_read = in_use;
  r->bytes_written = pooled;
  for (int s = 0; s < 3; s++) r->ndim[s] = -1;
}

void kiln__trace_memory(kiln_device_t *device, uint64_t in_use, uint64_t pooled) {
  if (device->index >= TRACE_DEVICES) return;
  atomic_store_explicit(&memory_now[device->index].in_use, in_use, memory_order_relaxed);
  atomic_store_explicit(&memory_now[device->index].pooled, pooled, memory_order_relaxed);
  atomic_store_explicit(&memory_now[device->index].changed, true, memory_order_release);
}

/* ---- spans: host work outside kiln's ops ----------------------------------------------- */

/* A span's category and name, interned for the trace's records: a fixed
 * table (no allocation on the traced path), reset when a trace starts.
 * Names past its size share one entry. Guarded by `lock`. */
#define SPAN_NAMES 128
#define SPAN_NAME_MAX 64
static char span_names[SPAN_NAMES][SPAN_NAME_MAX];
static size_t span_name_count;

static const char *intern_locked(const char *s) {
  for (size_t i = 0; i < span_name_count; i++)
    if (!strncmp(span_names[i], s, SPAN_NAME_MAX - 1)) return span_names[i];
  if (span_name_count == SPAN_NAMES) return "(more names than the trace keeps)";
  snprintf(span_names[span_name_count], SPAN_NAME_MAX, "%s", s);
  return span_names[span_name_count++];
}

int64_t kiln_trace_clock_ns(void) { return kiln__trace_now(); }

kiln_status_t kiln_trace_span(const char *category, const char *name, int64_t start_ns, uint64_t bytes,
                              const char *detail) {
  const int64_t end = kiln__trace_now();
  if (!category || !category[0] || !name || !name[0])
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_trace_span: %s is %s; pass a category and a name, e.g. (\"phase\", \"load batch\")",
                           !category || !category[0] ? "the category" : "the name",
                           (!category || !category[0] ? !category : !name) ? "NULL" : "empty");
  if (start_ns > end)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_trace_span(\"%s\", \"%s\"): start_ns %lld is after now (%lld); take it from "
                           "kiln_trace_clock_ns() before the work",
                           category, name, (long long)start_ns, (long long)end);
  if (!KILN__TRACE_ON()) return KILN_OK;
  pthread_mutex_lock(&lock);
  if (tr.active) {
    kiln__trace_record_t *r = append_locked();
    r->type = KILN__TRACE_SPAN;
    r->provider = intern_locked(category);
    r->name = intern_locked(name);
    r->thread = this_thread();
    r->host_t0 = start_ns < tr.t_start ? tr.t_start : start_ns;
    r->host_t1 = end;
    r->bytes_read = bytes;
    for (int s = 0; s < 3; s++) r->ndim[s] = -1;
    snprintf(r->detail, sizeof r->detail, "%s", detail ? detail : "");
  }
  pthread_mutex_unlock(&lock);
  return KILN_OK;
}

/* ---- start and stop ---------------------------------------------------------------- */

/* A sample of what kiln_device_memory_stats says, read from the pool itself:
 * the public call would start kiln, and a KILN_TRACE start runs inside
 * kiln's start-up. Called with the lock held. */
static void memory_stats_locked(kiln_device_t *device, int64_t ts) {
  kiln__pool_t *pool = &device->pool;
  pthread_mutex_lock(&pool->lock);
  const uint64_t in_use = pool->live_bytes, pooled = pool->pooled_bytes;
  pthread_mutex_unlock(&pool->lock);
  memory_locked(device, in_use, pooled, ts);
  if (device->index < TRACE_DEVICES) atomic_store(&memory_now[device->index].changed, false);
}

static void stop_at_exit(void) {
  if (atomic_load(&kiln__trace_on)) kiln_trace_stop();
}

kiln_status_t kiln__trace_start(const char *path, size_t events) {
  if (!path || !path[0])
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_trace_start: the path is %s; pass the name of the JSON file to write, e.g. "
                           "\"trace.json\"",
                           !path ? "NULL" : "empty");
  pthread_mutex_lock(&control);
  if (tr.active) {
    kiln_status_t status = kiln__set_error(KILN_INVALID_ARGUMENT,
                                           "kiln_trace_start(\"%s\"): a trace into \"%s\" is already recording; call "
                                           "kiln_trace_stop first (one trace at a time)",
                                           path, tr.path);
    pthread_mutex_unlock(&control);
    return status;
  }
  FILE *file = fopen(path, "w");
  if (!file) {
    int err = errno;
    pthread_mutex_unlock(&control);
    return kiln__set_error(KILN_IO, "kiln_trace_start: cannot create \"%s\" (%s); pass a path in a directory that "
                           "exists and is writable", path, strerror(err));
  }
  kiln__trace_record_t *ring = malloc(events * sizeof *ring);
  /* Touched now, so that no traced op takes the ring's page faults. */
  if (ring) memset(ring, 0, events * sizeof *ring);
  char *copy = strdup(path);
  if (!ring || !copy) {
    free(ring);
    free(copy);
    fclose(file);
    remove(path);
    pthread_mutex_unlock(&control);
    return kiln__set_error(KILN_OUT_OF_MEMORY,
                           "kiln_trace_start: cannot allocate the ring of %zu events (%zu bytes); set "
                           "KILN_TRACE_EVENTS lower",
                           events, events * sizeof *ring);
  }
  pthread_mutex_lock(&lock);
  memset(&tr, 0, sizeof tr);
  tr.ring = ring;
  tr.capacity = events;
  tr.next_seq = 1;
  tr.file = file;
  tr.path = copy;
  tr.t_start = kiln__trace_now();
  tr.active = true;
  span_name_count = 0;
  free(last_summary);
  last_summary = NULL;
  /* Each queue's clock, and the memory each device holds already as the
   * counters' first values. */
  for (size_t d = 0; d < kiln__rt.device_count; d++) {
    kiln__queues_each(kiln__rt.devices[d], queue_align_locked);
    memory_stats_locked(kiln__rt.devices[d], tr.t_start);
  }
  atomic_store(&kiln__trace_on, true);
  pthread_mutex_unlock(&lock);
  if (!exit_hook_set) exit_hook_set = atexit(stop_at_exit) == 0;
  pthread_mutex_unlock(&control);
  return KILN_OK;
}

kiln_status_t kiln_trace_start(const char *path) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  return kiln__trace_start(path, kiln__rt.config.trace_events);
}

bool kiln_trace_active(void) { return atomic_load(&kiln__trace_on); }

/* Wait for every pending event. Called with the lock held. */
static void resolve_all_locked(void) {
  for (size_t i = 0; i < tr.queue_count; i++) resolve_locked(&tr.queues[i], true);
}

kiln_status_t kiln_trace_stop(void) {
  pthread_mutex_lock(&control);
  if (!tr.active) {
    pthread_mutex_unlock(&control);
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_trace_stop: no trace is recording; start one with kiln_trace_start or KILN_TRACE");
  }
  pthread_mutex_lock(&lock);
  atomic_store(&kiln__trace_on, false);
  resolve_all_locked();
  /* The counters end on what kiln_device_memory_stats says now. */
  const int64_t end = kiln__trace_now();
  for (size_t d = 0; d < kiln__rt.device_count; d++) memory_stats_locked(kiln__rt.devices[d], end);
  tr.active = false;
  tr.t_stop = kiln__trace_now();
  kiln_status_t status = kiln__trace_write_json(&tr, tr.file);
  if (fclose(tr.file) != 0 && status == KILN_OK)
    status = kiln__set_error(KILN_IO, "kiln_trace_stop: closing \"%s\" failed (%s); is the disk full?", tr.path,
                             strerror(errno));
  tr.file = NULL;
  last_summary = kiln__trace_summary_text(&tr);
  for (size_t i = 0; i < tr.queue_count; i++) {
    kiln__trace_queue_t *q = &tr.queues[i];
    q->device->iface->event_release(q->device->ctx, q->anchor);
    free(q->pending);
  }
  free(tr.ring);
  free(tr.path);
  tr.ring = NULL;
  tr.path = NULL;
  tr.queue_count = 0;
  pthread_mutex_unlock(&lock);
  pthread_mutex_unlock(&control);
  return status;
}

kiln_status_t kiln_trace_summary(char *out_text, size_t size, size_t *out_length) {
  if (!out_length || (!out_text && size > 0))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_trace_summary: %s is NULL; pass a buffer of `size` bytes (or NULL with size 0) and "
                           "the address of a size_t",
                           !out_length ? "out_length" : "out_text");
  pthread_mutex_lock(&control);
  char *text = NULL;
  if (tr.active) {
    pthread_mutex_lock(&lock);
    resolve_all_locked();
    text = kiln__trace_summary_text(&tr);
    pthread_mutex_unlock(&lock);
  } else if (last_summary) {
    text = strdup(last_summary);
  } else {
    pthread_mutex_unlock(&control);
    return kiln__set_error(KILN_NOT_FOUND, "kiln_trace_summary: no trace was recorded; start one with "
                                           "kiln_trace_start or KILN_TRACE=path.json");
  }
  pthread_mutex_unlock(&control);
  if (!text)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "kiln_trace_summary: cannot allocate the summary's text");
  const size_t length = strlen(text);
  if (size > 0) {
    const size_t n = length < size - 1 ? length : size - 1;
    memcpy(out_text, text, n);
    out_text[n] = '\0';
  }
  free(text);
  *out_length = length;
  return KILN_OK;
}

void kiln__trace_shutdown(void) {
  if (atomic_load(&kiln__trace_on) && kiln_trace_stop() != KILN_OK) kiln_clear_error();
  pthread_mutex_lock(&control);
  free(last_summary);
  last_summary = NULL;
  pthread_mutex_unlock(&control);
}
