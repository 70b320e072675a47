/* runtime/queue.c: queues, events, the per-thread current queue, and each device's list of live queues. */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

/* A queue as the core keeps it: the public struct first, so that a
 * kiln_queue_t pointer is a node pointer. */
typedef struct kiln_queue_node_t {
  kiln_queue_t queue;
  /* The stamp taken before the latest finish that completed: everything
   * enqueued before that stamp is done. The pool reads it to hand a block
   * released on this queue to another queue without waiting. */
  _Atomic uint64_t done_stamp;
  struct kiln_queue_node_t *prev, *next;
} kiln_queue_node_t;

/* The live queues of each device, by visible index. The device struct is a
 * shared contract without room for them, and devices are few. */
typedef struct kiln_queue_list_t {
  pthread_mutex_t lock;
  kiln_queue_node_t *head;
  bool attached;
} kiln_queue_list_t;

static kiln_queue_list_t kiln_queue_lists[KILN_MAX_DEVICES];

/* Never 0: 0 tags "no queue" in buffers and pool blocks. */
static _Atomic uint64_t kiln_next_queue_id = 1;
static _Atomic uint64_t kiln_clock = 1;

/* The current queue per device for this thread. A slot is valid only while
 * its generation matches the device index's: kiln_deinitialize destroys the
 * queues that other threads' slots still name, and a later start reuses the
 * indices. */
typedef struct kiln_current_t {
  kiln_queue_t *queue;
  uint64_t generation;
} kiln_current_t;

static _Thread_local kiln_current_t kiln_current[KILN_MAX_DEVICES];
static _Atomic uint64_t kiln_generation[KILN_MAX_DEVICES];

static kiln_queue_node_t *kiln_node(kiln_queue_t *queue) { return (kiln_queue_node_t *)queue; }

uint64_t kiln__queue_stamp(void) { return atomic_fetch_add_explicit(&kiln_clock, 1, memory_order_relaxed); }

void kiln__queue_mark_done(kiln_queue_t *queue, uint64_t stamp) {
  kiln_queue_node_t *node = kiln_node(queue);
  uint64_t seen = atomic_load_explicit(&node->done_stamp, memory_order_relaxed);
  while (seen < stamp &&
         !atomic_compare_exchange_weak_explicit(&node->done_stamp, &seen, stamp, memory_order_release,
                                                memory_order_relaxed)) {
  }
}

bool kiln__queue_done_since(kiln_device_t *device, uint64_t queue_id, uint64_t stamp) {
  if (queue_id == 0) return true;
  kiln_queue_list_t *list = &kiln_queue_lists[device->index];
  bool done = true; /* a queue no longer listed was finished before it was destroyed */
  pthread_mutex_lock(&list->lock);
  for (kiln_queue_node_t *n = list->head; n; n = n->next) {
    if (n->queue.id == queue_id) {
      done = atomic_load_explicit(&n->done_stamp, memory_order_acquire) > stamp;
      break;
    }
  }
  pthread_mutex_unlock(&list->lock);
  return done;
}

/* Create a queue object on device and list it. */
static kiln_status_t kiln_queue_new(kiln_device_t *device, kiln_queue_t **out_queue) {
  kiln_queue_node_t *node = calloc(1, sizeof *node);
  if (!node)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate a queue object (%zu bytes) for %s; free host memory",
                           sizeof *node, device->display_name);
  kiln_status_t status = device->iface->queue_create(device->impl, &node->queue.impl);
  if (status != KILN_OK) {
    free(node);
    return kiln__wrap_error(status, "creating a queue on %s", device->display_name);
  }
  atomic_init(&node->queue.refs, 1);
  atomic_init(&node->done_stamp, 0);
  node->queue.device = device;
  node->queue.id = atomic_fetch_add_explicit(&kiln_next_queue_id, 1, memory_order_relaxed);
  kiln_queue_list_t *list = &kiln_queue_lists[device->index];
  pthread_mutex_lock(&list->lock);
  node->next = list->head;
  if (list->head) list->head->prev = node;
  list->head = node;
  pthread_mutex_unlock(&list->lock);
  *out_queue = &node->queue;
  return KILN_OK;
}

/* Finish, unlist and destroy. */
static void kiln_queue_destroy(kiln_queue_t *queue) {
  kiln_queue_node_t *node = kiln_node(queue);
  kiln_device_t *device = queue->device;
  /* Errors of work nobody waits for any more have nowhere to go. */
  device->iface->queue_finish(queue->impl);
  kiln_queue_list_t *list = &kiln_queue_lists[device->index];
  pthread_mutex_lock(&list->lock);
  if (node->prev) node->prev->next = node->next;
  else if (list->head == node) list->head = node->next;
  if (node->next) node->next->prev = node->prev;
  pthread_mutex_unlock(&list->lock);
  device->iface->queue_destroy(queue->impl);
  free(node);
}

kiln_status_t kiln__queues_attach(kiln_device_t *device) {
  kiln_queue_list_t *list = &kiln_queue_lists[device->index];
  pthread_mutex_init(&list->lock, NULL);
  list->head = NULL;
  list->attached = true;
  atomic_fetch_add(&kiln_generation[device->index], 1);
  return kiln_queue_new(device, &device->default_queue);
}

void kiln__queues_detach(kiln_device_t *device) {
  kiln_queue_list_t *list = &kiln_queue_lists[device->index];
  if (!list->attached) return;
  /* Slots of other threads become stale through the generation; this
   * thread's is simply dropped. */
  atomic_fetch_add(&kiln_generation[device->index], 1);
  kiln_current[device->index].queue = NULL;
  /* Handles the application still holds become invalid (kiln_deinitialize). */
  for (;;) {
    pthread_mutex_lock(&list->lock);
    kiln_queue_node_t *node = list->head;
    pthread_mutex_unlock(&list->lock);
    if (!node) break;
    kiln_queue_destroy(&node->queue);
  }
  device->default_queue = NULL;
  list->attached = false;
  pthread_mutex_destroy(&list->lock);
}

kiln_status_t kiln__device_finish_all(kiln_device_t *device) {
  kiln_queue_list_t *list = &kiln_queue_lists[device->index];
  kiln_status_t first = KILN_OK;
  char message[1024] = "";
  /* The lock is held throughout so that no queue is destroyed under us;
   * finishing never calls back into the core. */
  pthread_mutex_lock(&list->lock);
  for (kiln_queue_node_t *n = list->head; n; n = n->next) {
    uint64_t stamp = kiln__queue_stamp();
    kiln_status_t status = device->iface->queue_finish(n->queue.impl);
    if (status == KILN_OK) {
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
  return kiln_queue_new(device, out_queue);
}

kiln_queue_t *kiln_device_default_queue(kiln_device_t *device) { return device ? device->default_queue : NULL; }

kiln_queue_t *kiln_device_current_queue(kiln_device_t *device) {
  if (!device) return NULL;
  const kiln_current_t *slot = &kiln_current[device->index];
  if (slot->queue &&
      slot->generation == atomic_load_explicit(&kiln_generation[device->index], memory_order_relaxed))
    return slot->queue;
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
  kiln_current_t *slot = &kiln_current[device->index];
  uint64_t generation = atomic_load_explicit(&kiln_generation[device->index], memory_order_relaxed);
  kiln_queue_t *old = slot->generation == generation ? slot->queue : NULL;
  /* The default queue is the fallback anyway: holding no slot for it keeps
   * the device's own reference the only one. */
  if (queue == device->default_queue) queue = NULL;
  if (queue) kiln_queue_retain(queue);
  slot->queue = queue;
  slot->generation = generation;
  kiln_queue_release(old);
  return KILN_OK;
}

kiln_queue_t *kiln_queue_retain(kiln_queue_t *queue) {
  if (queue) atomic_fetch_add_explicit(&queue->refs, 1, memory_order_relaxed);
  return queue;
}

void kiln_queue_release(kiln_queue_t *queue) {
  if (!queue) return;
  if (atomic_fetch_sub_explicit(&queue->refs, 1, memory_order_acq_rel) == 1) kiln_queue_destroy(queue);
}

kiln_device_t *kiln_queue_device(const kiln_queue_t *queue) { return queue ? queue->device : NULL; }

kiln_status_t kiln_queue_finish(kiln_queue_t *queue) {
  if (!queue)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_queue_finish: queue is NULL; pass a queue from kiln_queue_create or "
                           "kiln_device_current_queue");
  uint64_t stamp = kiln__queue_stamp();
  kiln_status_t status = queue->device->iface->queue_finish(queue->impl);
  if (status != KILN_OK)
    return kiln__wrap_error(status, "kiln_queue_finish: work on a queue of %s failed", queue->device->display_name);
  kiln__queue_mark_done(queue, stamp);
  return KILN_OK;
}

static kiln_status_t kiln_event_new(kiln_queue_t *queue, kiln_backend_event_t *impl, kiln_event_t **out_event) {
  kiln_event_t *event = malloc(sizeof *event);
  if (!event) {
    queue->device->iface->event_release(impl);
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
  kiln_status_t status = queue->device->iface->queue_record(queue->impl, &impl);
  if (status != KILN_OK)
    return kiln__wrap_error(status, "recording an event on a queue of %s", queue->device->display_name);
  return kiln_event_new(queue, impl, out_event);
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
    if (event->device->iface == queue->device->iface) {
      status = queue->device->iface->queue_wait(queue->impl, event->impl);
    } else {
      /* Another backend cannot wait on this one's event: the caller does. */
      status = event->device->iface->event_wait(event->impl);
    }
    if (status != KILN_OK)
      return kiln__wrap_error(status, "waiting on an event of %s before work on %s", event->device->display_name,
                              queue->device->display_name);
  }
  return KILN_OK;
}

/* ---- events ----------------------------------------------------------------- */

kiln_event_t *kiln_event_retain(kiln_event_t *event) {
  if (event) atomic_fetch_add_explicit(&event->refs, 1, memory_order_relaxed);
  return event;
}

void kiln_event_release(kiln_event_t *event) {
  if (!event) return;
  if (atomic_fetch_sub_explicit(&event->refs, 1, memory_order_acq_rel) == 1) {
    event->device->iface->event_release(event->impl);
    free(event);
  }
}

kiln_status_t kiln_event_wait(kiln_event_t *event) {
  if (!event)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_event_wait: event is NULL; pass an event from kiln_queue_record");
  kiln_status_t status = event->device->iface->event_wait(event->impl);
  if (status != KILN_OK)
    return kiln__wrap_error(status, "kiln_event_wait: work before the event on %s failed", event->device->display_name);
  return KILN_OK;
}

kiln_status_t kiln_event_query(kiln_event_t *event) {
  if (!event)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_event_query: event is NULL; pass an event from kiln_queue_record");
  kiln_status_t status = event->device->iface->event_query(event->impl);
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
  kiln_status_t status = iface->event_wait(start->impl);
  if (status == KILN_OK) status = iface->event_wait(end->impl);
  if (status == KILN_OK) status = iface->event_elapsed(start->impl, end->impl, out_ms);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_event_elapsed on %s", start->device->display_name);
  return KILN_OK;
}
