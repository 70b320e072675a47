/* backends/cuda/queue.c: kiln queues as non-blocking CUDA streams, and events as reused pairs: one without timing for waits, one with it for elapsed times. */
#include <stdlib.h>

#include "backends/cuda/cuda_backend.h"

kiln_status_t kiln_cuda_queue_create(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                     kiln_backend_queue_t **out_queue) {
  kiln_backend_queue_t *queue = calloc(1, sizeof *queue);
  if (!queue) return kiln_cuda_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for a CUDA queue record");
  queue->device = device;
  kiln_status_t status = kiln_cuda_enter(device);
  if (status == KILN_OK) {
    /* Non-blocking: kiln's queues must not serialise with the legacy default
     * stream an application (or a library) may use on the same context. */
    status = kiln_cuda_check(ctx, cuStreamCreate(&queue->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate on cuda:%d",
                             device->ordinal);
    kiln_cuda_leave();
  }
  if (status != KILN_OK) {
    free(queue);
    return status;
  }
  pthread_mutex_init(&queue->lock, NULL);
  *out_queue = queue;
  return KILN_OK;
}

void kiln_cuda_queue_destroy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  if (!queue) return;
  if (kiln_cuda_enter(queue->device) == KILN_OK) {
    kiln_cuda_cublas_queue_release(ctx, queue);
    kiln_cuda_cudnn_queue_release(ctx, queue);
    (void)cuStreamDestroy(queue->stream);
    kiln_cuda_leave();
  }
  pthread_mutex_destroy(&queue->lock);
  free(queue);
}

kiln_status_t kiln_cuda_queue_finish(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) return status;
  /* A kernel fault surfaces here, as the first asynchronous error. */
  status = kiln_cuda_check(ctx, cuStreamSynchronize(queue->stream),
                           "cuStreamSynchronize (finishing a queue of cuda:%d)", queue->device->ordinal);
  kiln_cuda_leave();
  return status;
}

/* An event pair from the device's free list, or two new events. Context
 * current. Both events of a pair are reused as they are: a record replaces
 * the previous one, and a wait enqueued earlier keeps waiting for the record
 * it saw. */
static kiln_status_t event_take(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                kiln_backend_event_t **out_event) {
  pthread_mutex_lock(&device->event_lock);
  kiln_backend_event_t *event = device->free_events;
  if (event) device->free_events = event->next_free;
  pthread_mutex_unlock(&device->event_lock);
  if (event) {
    event->next_free = NULL;
    *out_event = event;
    return KILN_OK;
  }
  event = calloc(1, sizeof *event);
  if (!event) return kiln_cuda_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for a CUDA event record");
  event->device = device;
  kiln_status_t status = kiln_cuda_check(ctx, cuEventCreate(&event->sync, CU_EVENT_DISABLE_TIMING),
                                         "cuEventCreate(CU_EVENT_DISABLE_TIMING) on cuda:%d", device->ordinal);
  if (status == KILN_OK) {
    status = kiln_cuda_check(ctx, cuEventCreate(&event->timing, CU_EVENT_DEFAULT), "cuEventCreate on cuda:%d",
                             device->ordinal);
    if (status != KILN_OK) (void)cuEventDestroy(event->sync);
  }
  if (status != KILN_OK) {
    free(event);
    return status;
  }
  pthread_mutex_lock(&device->event_lock);
  device->live_events++;
  pthread_mutex_unlock(&device->event_lock);
  *out_event = event;
  return KILN_OK;
}

/* Every event's pair, made at most once per event a program holds at a time:
 * `sync` has no timing (CU_EVENT_DISABLE_TIMING), the cheapest for the waits,
 * queries and synchronisations that most events are for; `timing` is
 * recorded just before it, so that event_elapsed works on any two events
 * the interface hands out (it cannot tell at record time which will be
 * timed). The extra record costs a fraction of a microsecond of host time
 * and no event creation, since pairs are reused. */
kiln_status_t kiln_cuda_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     kiln_backend_event_t **out_event) {
  kiln_backend_device_t *device = queue->device;
  kiln_status_t status = kiln_cuda_enter(device);
  if (status != KILN_OK) return status;
  kiln_backend_event_t *event = NULL;
  status = event_take(ctx, device, &event);
  /* Timing first: once `sync` has completed (what event_wait and
   * event_query see), so has `timing`, and elapsed() can read it. */
  if (status == KILN_OK)
    status = kiln_cuda_check(ctx, cuEventRecord(event->timing, queue->stream), "cuEventRecord (timing) on cuda:%d",
                             device->ordinal);
  if (status == KILN_OK)
    status = kiln_cuda_check(ctx, cuEventRecord(event->sync, queue->stream), "cuEventRecord on cuda:%d",
                             device->ordinal);
  kiln_cuda_leave();
  if (status != KILN_OK) {
    if (event) kiln_cuda_event_release(ctx, event);
    return status;
  }
  *out_event = event;
  return KILN_OK;
}

void kiln_cuda_events_free(kiln_backend_device_t *device) {
  /* Context current; every event was released (the core releases them
   * before the backend deinitialises). */
  pthread_mutex_lock(&device->event_lock);
  kiln_backend_event_t *chain = device->free_events;
  device->free_events = NULL;
  pthread_mutex_unlock(&device->event_lock);
  while (chain) {
    kiln_backend_event_t *next = chain->next_free;
    (void)cuEventDestroy(chain->sync);
    (void)cuEventDestroy(chain->timing);
    free(chain);
    device->live_events--;
    chain = next;
  }
}

kiln_status_t kiln_cuda_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_event_t *event) {
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) return status;
  /* Works for an event of another device too: the wait happens on the GPU. */
  status = kiln_cuda_check(ctx, cuStreamWaitEvent(queue->stream, event->sync, 0),
                           "cuStreamWaitEvent (a queue of cuda:%d waiting for an event of cuda:%d)",
                           queue->device->ordinal, event->device->ordinal);
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  kiln_status_t status = kiln_cuda_enter(event->device);
  if (status != KILN_OK) return status;
  status =
      kiln_cuda_check(ctx, cuEventSynchronize(event->sync), "cuEventSynchronize on cuda:%d", event->device->ordinal);
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  kiln_status_t status = kiln_cuda_enter(event->device);
  if (status != KILN_OK) return status;
  CUresult r = cuEventQuery(event->sync);
  kiln_cuda_leave();
  if (r == CUDA_ERROR_NOT_READY) return KILN_NOT_READY;
  return kiln_cuda_check(ctx, r, "cuEventQuery on cuda:%d", event->device->ordinal);
}

kiln_status_t kiln_cuda_event_elapsed(kiln_backend_context_t *ctx, kiln_backend_event_t *start,
                                      kiln_backend_event_t *end, double *out_ms) {
  if (start->device != end->device)
    return kiln_cuda_error(ctx, KILN_INVALID_ARGUMENT,
                           "cannot time between events of two devices (cuda:%d and cuda:%d): their clocks differ; "
                           "record both events on queues of one device",
                           start->device->ordinal, end->device->ordinal);
  kiln_status_t status = kiln_cuda_enter(start->device);
  if (status != KILN_OK) return status;
  float ms = 0.0f;
  CUresult r = cuEventElapsedTime(&ms, start->timing, end->timing);
  kiln_cuda_leave();
  if (r == CUDA_ERROR_NOT_READY)
    return kiln_cuda_error(ctx, KILN_NOT_READY,
                           "cuEventElapsedTime on cuda:%d: an event has not completed yet; wait for the end event "
                           "first",
                           start->device->ordinal);
  status = kiln_cuda_check(ctx, r, "cuEventElapsedTime on cuda:%d", start->device->ordinal);
  if (status == KILN_OK) *out_ms = (double)ms;
  return status;
}

void kiln_cuda_event_release(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  if (!event) return;
  /* Back to the device's list, even while pending: its next record replaces
   * this one, and waits already enqueued keep the record they saw. */
  kiln_backend_device_t *device = event->device;
  pthread_mutex_lock(&device->event_lock);
  event->next_free = device->free_events;
  device->free_events = event;
  pthread_mutex_unlock(&device->event_lock);
}
