/* backends/cuda/queue.c: kiln queues as non-blocking CUDA streams, and events with device timestamps. */
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

kiln_status_t kiln_cuda_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     kiln_backend_event_t **out_event) {
  kiln_backend_event_t *event = calloc(1, sizeof *event);
  if (!event) return kiln_cuda_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for a CUDA event record");
  event->device = queue->device;
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) {
    free(event);
    return status;
  }
  /* Default flags keep timing on, so event_elapsed works on every event. */
  status = kiln_cuda_check(ctx, cuEventCreate(&event->event, CU_EVENT_DEFAULT), "cuEventCreate on cuda:%d",
                           queue->device->ordinal);
  if (status == KILN_OK) {
    status = kiln_cuda_check(ctx, cuEventRecord(event->event, queue->stream), "cuEventRecord on cuda:%d",
                             queue->device->ordinal);
    if (status != KILN_OK) (void)cuEventDestroy(event->event);
  }
  kiln_cuda_leave();
  if (status != KILN_OK) {
    free(event);
    return status;
  }
  *out_event = event;
  return KILN_OK;
}

kiln_status_t kiln_cuda_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_event_t *event) {
  kiln_status_t status = kiln_cuda_enter(queue->device);
  if (status != KILN_OK) return status;
  /* Works for an event of another device too: the wait happens on the GPU. */
  status = kiln_cuda_check(ctx, cuStreamWaitEvent(queue->stream, event->event, 0),
                           "cuStreamWaitEvent (a queue of cuda:%d waiting for an event of cuda:%d)",
                           queue->device->ordinal, event->device->ordinal);
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  kiln_status_t status = kiln_cuda_enter(event->device);
  if (status != KILN_OK) return status;
  status =
      kiln_cuda_check(ctx, cuEventSynchronize(event->event), "cuEventSynchronize on cuda:%d", event->device->ordinal);
  kiln_cuda_leave();
  return status;
}

kiln_status_t kiln_cuda_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  kiln_status_t status = kiln_cuda_enter(event->device);
  if (status != KILN_OK) return status;
  CUresult r = cuEventQuery(event->event);
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
  CUresult r = cuEventElapsedTime(&ms, start->event, end->event);
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
  /* Safe while the event is pending: the driver frees it once it completes. */
  if (kiln_cuda_enter(event->device) == KILN_OK) {
    (void)cuEventDestroy(event->event);
    kiln_cuda_leave();
  }
  free(event);
}
