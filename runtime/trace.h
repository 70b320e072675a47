/* runtime/trace.h: the hooks the core's modules call into runtime/trace.c, each behind one test of kiln__trace_on. */
#ifndef KILN_RUNTIME_TRACE_H
#define KILN_RUNTIME_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "runtime/backend.h"

/* True while a trace records. Callers read it once per op, relaxed: the cost
 * with tracing off is this load and a branch predicted not taken. */
extern atomic_bool kiln__trace_on;
#define KILN__TRACE_ON() __builtin_expect(atomic_load_explicit(&kiln__trace_on, memory_order_relaxed), 0)

/* The trace's clock: CLOCK_MONOTONIC in nanoseconds. */
int64_t kiln__trace_now(void);

/* An op just enqueued on `queue` by the dispatch path, host call from t0 to
 * now: `name` as kiln_op_name gives it, the provider that ran it and why it
 * was chosen ("override", "measured", "fallback" or the policy's name), all
 * static storage. A backend event recorded now on the queue gives its
 * device-side end. Never fails: a record that cannot be kept is counted as
 * dropped. */
void kiln__trace_op(kiln_queue_t *queue, const kiln_op_t *op, const char *name, const kiln_tensor_t *out,
                    const kiln_tensor_t *const *inputs, const char *provider, const char *why, int64_t t0);

typedef enum kiln__trace_copy_t {
  KILN__TRACE_H2D,
  KILN__TRACE_D2H,
  KILN__TRACE_D2D,
} kiln__trace_copy_t;

/* A copy of `bytes` enqueued on `queue` (the destination's for device to
 * device), host call from t0 to now. */
void kiln__trace_copy(kiln_queue_t *queue, kiln__trace_copy_t direction, size_t bytes, int64_t t0);

/* `queue` was told to wait for work of another queue (host call from t0 to
 * now): the wait is a slice of its own on the queue's track. */
void kiln__trace_wait(kiln_queue_t *queue, int64_t t0);

/* A device's memory after an allocation or a free: bytes in live buffers and
 * bytes pooled (kiln_device_memory_stats' in_use_bytes and pooled_bytes).
 * Two stores: the counter track samples it at the device's next traced op,
 * copy or wait, and at the trace's stop. Never blocks. */
void kiln__trace_memory(kiln_device_t *device, uint64_t in_use, uint64_t pooled);

/* A queue created while a trace records: its clock is aligned now, before
 * any work (queue.c). */
void kiln__trace_queue(kiln_queue_t *queue);
/* Call fn for each of the device's live queues, its list locked (queue.c). */
void kiln__queues_each(kiln_device_t *device, void (*fn)(kiln_queue_t *queue));

/* Start a trace into `path` with a ring of `events` records (KILN_TRACE at
 * start-up; kiln_trace_start). */
kiln_status_t kiln__trace_start(const char *path, size_t events);

/* kiln_deinitialize: stop a trace still recording (writing it) while the
 * devices still exist, and forget the last summary. */
void kiln__trace_shutdown(void);

#endif /* KILN_RUNTIME_TRACE_H */
