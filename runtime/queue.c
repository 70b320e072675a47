/* runtime/queue.c: queues, events, the per-thread current queue, and each device's list of live queues. */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"
#include "runtime/trace.h"

/* A queue as the core keeps it: the public struct first, so that a
 * kiln_queue_t pointer is a node pointer. */
typedef struct kiln__queue_node_t {
  kiln_queue_t queue;
  /* The stamp taken before the latest finish that completed: everything
   * enqueued before that stamp is done. The pool reads it to hand a block
   * released on this queue to another queue without waiting. */
  _Atomic uint64_t done_stamp;
  struct kiln__queue_node_t *prev, *next;
  /* The checkpoints of the back-pressure (internal.h), oldest first in a
   * ring; `count` is the number of operations enqueued when it was recorded. */
  pthread_mutex_t pressure_lock;
  struct {
    kiln_backend_event_t *event;
    uint64_t count;
  } checkpoints[KILN__QUEUE_CHECKPOINTS];
  unsigned oldest, outstanding;
} queue_node_t;

/* Never 0: 0 tags "no queue" in buffers and pool blocks. */
static _Atomic uint64_t next_queue_id = 1;
static _Atomic uint64_t clock_ticks = 1;

/* The calling thread's current queues, for the devices it set one on: a
 * small map keyed by the device and its serial, so that a slot naming a
 * device of an earlier start (whose queues are gone, and whose address may
 * have been reused) never matches. */
#define CURRENT_SLOTS 16
typedef struct current_t {
  const kiln_device_t *device;
  uint64_t serial;
  kiln_queue_t *queue; /* retained */
} current_t;

static _Thread_local current_t current[CURRENT_SLOTS];
static _Thread_local int current_used;

static queue_node_t *node_of(kiln_queue_t *queue) { return (queue_node_t *)queue; }

uint64_t kiln__queue_stamp(void) { return atomic_fetch_add_explicit(&clock_ticks, 1, memory_order_relaxed); }

void kiln__queue_mark_done(kiln_queue_t *queue, uint64_t stamp) {
  queue_node_t *node = node_of(queue);
  uint64_t seen = atomic_load_explicit(&node->done_stamp, memory_order_relaxed);
  while (seen < stamp && !atomic_compare_exchange_weak_explicit(&node->done_stamp, &seen, stamp, memory_order_release,
                                                                memory_order_relaxed)) {
  }
}

bool kiln__queue_done_since(kiln_device_t *device, uint64_t queue_id, uint64_t stamp) {
  if (queue_id == 0) return true;
  kiln__queue_list_t *list = &device->queues;
  bool done = true; /* a queue no longer listed was finished before it was destroyed */
  pthread_mutex_lock(&list->lock);
  for (queue_node_t *n = list->head; n; n = n->next) {
    if (n->queue.id == queue_id) {
      done = atomic_load_explicit(&n->done_stamp, memory_order_acquire) > stamp;
      break;
    }
  }
  pthread_mutex_unlock(&list->lock);
  return done;
}

/* ---- back-pressure ------------------------------------------------------------ */

static void note_completed(kiln_queue_t *queue, uint64_t count) {
  uint64_t seen = atomic_load_explicit(&queue->completed, memory_order_relaxed);
  while (seen < count && !atomic_compare_exchange_weak_explicit(&queue->completed, &seen, count, memory_order_relaxed,
                                                                memory_order_relaxed)) {
  }
}

uint64_t kiln__queue_in_flight(kiln_queue_t *queue) {
  const uint64_t completed = atomic_load_explicit(&queue->completed, memory_order_relaxed);
  const uint64_t enqueued = atomic_load_explicit(&queue->enqueued, memory_order_relaxed);
  return enqueued > completed ? enqueued - completed : 0;
}

/* Drop the oldest checkpoint, waiting for it unless `wait` is false (a
 * finish already covered it). Called with pressure_lock held. */
static void checkpoint_pop(queue_node_t *node, bool wait) {
  kiln_device_t *device = node->queue.device;
  const unsigned i = node->oldest;
  kiln_status_t status = wait ? device->iface->event_wait(device->ctx, node->checkpoints[i].event) : KILN_OK;
  if (status != KILN_OK) {
    /* The queue keeps its error for kiln_queue_finish, as for work nobody waits on. */
    kiln__log(KILN_LOG_DEBUG, "a queue of %s failed before its checkpoint: %s", device->display_name, kiln_last_error());
    kiln_clear_error();
  }
  device->iface->event_release(device->ctx, node->checkpoints[i].event);
  note_completed(&node->queue, node->checkpoints[i].count);
  node->checkpoints[i].event = NULL;
  node->oldest = (i + 1) % KILN__QUEUE_CHECKPOINTS;
  node->outstanding--;
}

void kiln__queue_checkpoint(kiln_queue_t *queue, uint64_t count) {
  queue_node_t *node = node_of(queue);
  kiln_device_t *device = queue->device;
  /* Holding the lock while waiting is the point: every enqueuer of this
   * queue blocks until it is below its bound. */
  pthread_mutex_lock(&node->pressure_lock);
  const uint64_t completed = atomic_load_explicit(&queue->completed, memory_order_relaxed);
  while (node->outstanding > 0 && node->checkpoints[node->oldest].count <= completed) checkpoint_pop(node, false);
  kiln_backend_event_t *event = NULL;
  if (device->iface->queue_record(device->ctx, queue->impl, &event) == KILN_OK) {
    const unsigned slot = (node->oldest + node->outstanding) % KILN__QUEUE_CHECKPOINTS;
    node->checkpoints[slot].event = event;
    node->checkpoints[slot].count = count;
    node->outstanding++;
    /* With every checkpoint outstanding, up to KILN__QUEUE_DEPTH operations
     * may be: wait for the oldest, which leaves at most DEPTH - CHECKPOINT,
     * and so at most DEPTH until the next checkpoint. */
    if (node->outstanding == KILN__QUEUE_CHECKPOINTS) checkpoint_pop(node, true);
  } else {
    kiln_clear_error(); /* no event (out of memory): the next checkpoint tries again */
  }
  pthread_mutex_unlock(&node->pressure_lock);
}

static void checkpoints_release(queue_node_t *node) {
  pthread_mutex_lock(&node->pressure_lock);
  while (node->outstanding > 0) checkpoint_pop(node, false);
  pthread_mutex_unlock(&node->pressure_lock);
}

/* Create a queue object on device and list it. */
static kiln_status_t queue_new(kiln_device_t *device, kiln_queue_t **out_queue) {
  queue_node_t *node = calloc(1, sizeof *node);
  if (!node)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate a queue object (%zu bytes) for %s; free host memory",
                           sizeof *node, device->display_name);
  kiln_status_t status = device->iface->queue_create(device->ctx, device->impl, &node->queue.impl);
  if (status != KILN_OK) {
    free(node);
    return kiln__wrap_error(status, "creating a queue on %s", device->display_name);
  }
  atomic_init(&node->queue.refs, 1);
  atomic_init(&node->done_stamp, 0);
  atomic_init(&node->queue.checks, NULL);
  atomic_init(&node->queue.enqueued, 0);
  atomic_init(&node->queue.completed, 0);
  pthread_mutex_init(&node->pressure_lock, NULL);
  node->queue.device = device;
  node->queue.id = atomic_fetch_add_explicit(&next_queue_id, 1, memory_order_relaxed);
  kiln__queue_list_t *list = &device->queues;
  pthread_mutex_lock(&list->lock);
  node->next = list->head;
  if (list->head) list->head->prev = node;
  list->head = node;
  pthread_mutex_unlock(&list->lock);
  if (KILN__TRACE_ON()) kiln__trace_queue(&node->queue);
  *out_queue = &node->queue;
  return KILN_OK;
}

void kiln__queues_each(kiln_device_t *device, void (*fn)(kiln_queue_t *queue)) {
  kiln__queue_list_t *list = &device->queues;
  pthread_mutex_lock(&list->lock);
  for (queue_node_t *n = list->head; n; n = n->next) fn(&n->queue);
  pthread_mutex_unlock(&list->lock);
}

/* Finish, unlist and destroy. */
static void queue_destroy(kiln_queue_t *queue) {
  queue_node_t *node = node_of(queue);
  kiln_device_t *device = queue->device;
  /* Errors of work nobody waits for any more have nowhere to go. */
  device->iface->queue_finish(device->ctx, queue->impl);
  kiln__checks_drop(queue);
  kiln__queue_list_t *list = &device->queues;
  pthread_mutex_lock(&list->lock);
  if (node->prev) node->prev->next = node->next;
  else if (list->head == node) list->head = node->next;
  if (node->next) node->next->prev = node->prev;
  pthread_mutex_unlock(&list->lock);
  checkpoints_release(node);
  pthread_mutex_destroy(&node->pressure_lock);
  device->iface->queue_destroy(device->ctx, queue->impl);
  free(node);
}

KILN__DEFINE_REFCOUNT(kiln_queue_t, queue, queue_destroy)

kiln_status_t kiln__queues_attach(kiln_device_t *device) {
  kiln__queue_list_t *list = &device->queues;
  pthread_mutex_init(&list->lock, NULL);
  list->head = NULL;
  return queue_new(device, &device->default_queue);
}

/* The calling thread's slot of `device`, or NULL. */
static current_t *current_find(const kiln_device_t *device) {
  for (int i = 0; i < current_used; i++)
    if (current[i].device == device && current[i].serial == device->serial) return &current[i];
  return NULL;
}

void kiln__queue_forget_thread(void) {
  /* The queues these slots name are destroyed with their devices. */
  current_used = 0;
}

void kiln__queues_detach(kiln_device_t *device) {
  if (!device->default_queue) return;
  /* This thread's slot is dropped; other threads' slots go stale through the
   * serial (the queues they name are destroyed below). */
  current_t *slot = current_find(device);
  if (slot) *slot = current[--current_used];
  /* Handles the application still holds become invalid (kiln_deinitialize). */
  kiln__queue_list_t *list = &device->queues;
  for (;;) {
    pthread_mutex_lock(&list->lock);
    queue_node_t *node = list->head;
    pthread_mutex_unlock(&list->lock);
    if (!node) break;
    queue_destroy(&node->queue);
  }
  device->default_queue = NULL;
  pthread_mutex_destroy(&list->lock);
}

kiln_status_t kiln__device_finish_all(kiln_device_t *device) {
  kiln__queue_list_t *list = &device->queues;
  kiln_status_t first = KILN_OK;
  char message[1024] = "";
  /* The lock is held throughout so that no queue is destroyed under us;
   * finishing never calls back into the core. */
  pthread_mutex_lock(&list->lock);
  for (queue_node_t *n = list->head; n; n = n->next) {
    uint64_t stamp = kiln__queue_stamp();
    const uint64_t enqueued = atomic_load_explicit(&n->queue.enqueued, memory_order_relaxed);
    kiln_status_t status = device->iface->queue_finish(device->ctx, n->queue.impl);
    if (status == KILN_OK) {
      note_completed(&n->queue, enqueued);
      kiln__queue_mark_done(&n->queue, stamp);
    } else if (first == KILN_OK) {
      first = status;
      strncpy(message, kiln_last_error(), sizeof message - 1);
    }
  }
  pthread_mutex_unlock(&list->lock);
  if (first != KILN_OK) return kiln__set_error(first, "finishing the queues of %s: %s", device->display_name, message);
  return KILN_OK;
}

/* ---- queues ---------------------------------------------------------------- */

kiln_status_t kiln_queue_create(kiln_device_t *device, kiln_queue_t **out_queue) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!device || !out_queue)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_queue_create: %s is NULL; pass a device from kiln_device_get or kiln_device_default "
                           "and the address of a kiln_queue_t *",
                           !device ? "device" : "out_queue");
  return queue_new(device, out_queue);
}

kiln_queue_t *kiln_device_default_queue(kiln_device_t *device) { return device ? device->default_queue : NULL; }

kiln_queue_t *kiln_device_current_queue(kiln_device_t *device) {
  if (!device) return NULL;
  if (current_used) {
    const current_t *slot = current_find(device);
    if (slot) return slot->queue;
  }
  return device->default_queue;
}

kiln_status_t kiln_device_set_current_queue(kiln_device_t *device, kiln_queue_t *queue) {
  if (!device)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_device_set_current_queue: device is NULL; pass the device the queue belongs to");
  if (queue && queue->device != device)
    return kiln__set_error(KILN_DEVICE_MISMATCH,
                           "kiln_device_set_current_queue: the queue belongs to %s, not to %s; pass a queue created "
                           "on %s (kiln_queue_create)",
                           queue->device->display_name, device->display_name, device->display_name);
  current_t *slot = current_find(device);
  /* The default queue is the fallback anyway: holding no slot for it keeps
   * the device's own reference the only one. */
  if (queue == device->default_queue) queue = NULL;
  if (!queue) {
    if (slot) {
      kiln_queue_t *old = slot->queue;
      *slot = current[--current_used];
      kiln_queue_release(old);
    }
    return KILN_OK;
  }
  if (!slot) {
    /* Slots of devices from an earlier start are free for reuse. */
    for (int i = 0; i < current_used && !slot; i++) {
      bool live = false;
      for (size_t d = 0; d < kiln__rt.device_count && !live; d++)
        live = current[i].device == kiln__rt.devices[d] && current[i].serial == kiln__rt.devices[d]->serial;
      if (!live) slot = &current[i];
    }
    if (!slot && current_used == CURRENT_SLOTS)
      return kiln__set_error(KILN_OUT_OF_RESOURCES,
                             "kiln_device_set_current_queue: this thread already set current queues on %d devices; "
                             "set a device's back to its default (NULL) first",
                             CURRENT_SLOTS);
    if (!slot) slot = &current[current_used++];
    slot->queue = NULL;
  } else if (slot->queue == queue) {
    return KILN_OK;
  }
  kiln_queue_t *old = slot->queue;
  slot->device = device;
  slot->serial = device->serial;
  slot->queue = kiln_queue_retain(queue);
  kiln_queue_release(old); /* NULL for a fresh slot or one of an earlier start, whose queue is gone */
  return KILN_OK;
}

kiln_device_t *kiln_queue_device(const kiln_queue_t *queue) { return queue ? queue->device : NULL; }

kiln_status_t kiln_queue_finish(kiln_queue_t *queue) {
  if (!queue)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_queue_finish: queue is NULL; pass a queue from kiln_queue_create or "
                           "kiln_device_current_queue");
  uint64_t stamp = kiln__queue_stamp();
  const uint64_t enqueued = atomic_load_explicit(&queue->enqueued, memory_order_relaxed);
  kiln_status_t status = queue->device->iface->queue_finish(queue->device->ctx, queue->impl);
  if (status != KILN_OK)
    return kiln__wrap_error(status, "kiln_queue_finish: work on a queue of %s failed", queue->device->display_name);
  note_completed(queue, enqueued);
  kiln__queue_mark_done(queue, stamp);
  /* The work is done: what it found wrong on the device is reported now. */
  return kiln__checks_run(queue);
}

static kiln_status_t event_new(kiln_queue_t *queue, kiln_backend_event_t *impl, kiln_event_t **out_event) {
  kiln_event_t *event = malloc(sizeof *event);
  if (!event) {
    queue->device->iface->event_release(queue->device->ctx, impl);
    return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate an event object (%zu bytes); free host memory",
                           sizeof *event);
  }
  atomic_init(&event->refs, 1);
  event->device = queue->device;
  event->queue_id = queue->id;
  event->impl = impl;
  *out_event = event;
  return KILN_OK;
}

kiln_status_t kiln__queue_record_out(kiln_queue_t *queue, kiln_event_t **out_event) {
  if (!out_event) return KILN_OK;
  kiln_backend_event_t *impl = NULL;
  kiln_status_t status = queue->device->iface->queue_record(queue->device->ctx, queue->impl, &impl);
  if (status != KILN_OK)
    return kiln__wrap_error(status, "recording an event on a queue of %s", queue->device->display_name);
  return event_new(queue, impl, out_event);
}

kiln_status_t kiln_queue_record(kiln_queue_t *queue, kiln_event_t **out_event) {
  if (!queue || !out_event)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_queue_record: %s is NULL; pass a queue and the address of a kiln_event_t *",
                           !queue ? "queue" : "out_event");
  kiln_status_t status = kiln__queue_record_out(queue, out_event);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_queue_record");
}

kiln_status_t kiln_queue_wait(kiln_queue_t *queue, kiln_event_t *event) {
  if (!queue || !event)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_queue_wait: %s is NULL; pass the queue that should wait and an event from "
                           "kiln_queue_record",
                           !queue ? "queue" : "event");
  kiln_status_t status = kiln__queue_wait_list(queue, 1, &event);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_queue_wait");
}

kiln_status_t kiln__queue_wait_list(kiln_queue_t *queue, uint32_t count, kiln_event_t *const *events) {
  if (count == 0) return KILN_OK;
  if (!events)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "the wait list is NULL but wait_count is %u; pass wait_count 0 or an array of %u events",
                           count, count);
  for (uint32_t i = 0; i < count; i++) {
    kiln_event_t *event = events[i];
    if (!event)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "wait event %u of %u is NULL; pass events from kiln_queue_record or a smaller "
                             "wait_count",
                             i, count);
    kiln_status_t status;
    const int64_t trace_t0 = KILN__TRACE_ON() ? kiln__trace_now() : 0;
    if (event->device->iface == queue->device->iface) {
      status = queue->device->iface->queue_wait(queue->device->ctx, queue->impl, event->impl);
      if (trace_t0 && status == KILN_OK) kiln__trace_wait(queue, trace_t0);
    } else {
      /* Another backend cannot wait on this one's event: the caller does. */
      status = event->device->iface->event_wait(event->device->ctx, event->impl);
    }
    if (status != KILN_OK)
      return kiln__wrap_error(status, "waiting on an event of %s before work on %s", event->device->display_name,
                              queue->device->display_name);
  }
  return KILN_OK;
}

/* ---- events ----------------------------------------------------------------- */

static void event_destroy(kiln_event_t *event) {
  event->device->iface->event_release(event->device->ctx, event->impl);
  free(event);
}

KILN__DEFINE_REFCOUNT(kiln_event_t, event, event_destroy)

kiln_status_t kiln_event_wait(kiln_event_t *event) {
  if (!event)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_event_wait: event is NULL; pass an event from kiln_queue_record");
  kiln_status_t status = event->device->iface->event_wait(event->device->ctx, event->impl);
  if (status != KILN_OK)
    return kiln__wrap_error(status, "kiln_event_wait: work before the event on %s failed", event->device->display_name);
  return KILN_OK;
}

kiln_status_t kiln_event_query(kiln_event_t *event) {
  if (!event)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_event_query: event is NULL; pass an event from kiln_queue_record");
  kiln_status_t status = event->device->iface->event_query(event->device->ctx, event->impl);
  if (status == KILN_NOT_READY || status == KILN_OK) return status;
  return kiln__wrap_error(status, "kiln_event_query on %s", event->device->display_name);
}

kiln_status_t kiln_event_elapsed(kiln_event_t *start, kiln_event_t *end, double *out_ms) {
  if (!start || !end || !out_ms)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_event_elapsed: %s is NULL; pass two events recorded on one queue and the address of "
                           "a double",
                           !start ? "start" : !end ? "end" : "out_ms");
  if (start->queue_id != end->queue_id || start->device != end->device)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_event_elapsed: the events come from different queues (queue %llu on %s and queue "
                           "%llu on %s); time two events recorded on the same queue",
                           (unsigned long long)start->queue_id, start->device->display_name,
                           (unsigned long long)end->queue_id, end->device->display_name);
  const kiln_backend_iface_t *iface = start->device->iface;
  kiln_backend_context_t *ctx = start->device->ctx;
  kiln_status_t status = iface->event_wait(ctx, start->impl);
  if (status == KILN_OK) status = iface->event_wait(ctx, end->impl);
  if (status == KILN_OK) status = iface->event_elapsed(ctx, start->impl, end->impl, out_ms);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_event_elapsed on %s", start->device->display_name);
  return KILN_OK;
}
