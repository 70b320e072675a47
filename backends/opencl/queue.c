/* backends/opencl/queue.c: kiln queues as in-order profiling command queues, events as markers with device timestamps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/opencl/opencl_backend.h"

kiln_status_t kiln_cl_queue_create(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                   kiln_backend_queue_t **out_queue) {
  kiln_backend_queue_t *queue = calloc(1, sizeof *queue);
  if (!queue) return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for an OpenCL queue record");
  queue->device = device;
  cl_int err = CL_SUCCESS;
  /* In order (no out-of-order flag) and with profiling, so markers carry
   * the timestamps event_elapsed reads. */
  queue->queue = clCreateCommandQueue(device->context, device->device, CL_QUEUE_PROFILING_ENABLE, &err);
  if (err != CL_SUCCESS || !queue->queue) {
    free(queue);
    return kiln_cl_check(ctx, err != CL_SUCCESS ? err : CL_INVALID_COMMAND_QUEUE,
                         "clCreateCommandQueue(CL_QUEUE_PROFILING_ENABLE) on opencl:%zu (%s)", device->index,
                         device->desc.name);
  }
  pthread_mutex_init(&queue->lock, NULL);
  queue->async_status = KILN_OK;
  *out_queue = queue;
  return KILN_OK;
}

void kiln_cl_queue_destroy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  if (!queue) return;
  (void)clReleaseCommandQueue(queue->queue);
  pthread_mutex_destroy(&queue->lock);
  free(queue);
}

void kiln_cl_queue_note_error(kiln_backend_queue_t *queue, kiln_status_t status, const char *message) {
  pthread_mutex_lock(&queue->lock);
  if (queue->async_status == KILN_OK) {
    queue->async_status = status;
    snprintf(queue->async_error, sizeof queue->async_error, "%s", message);
  }
  pthread_mutex_unlock(&queue->lock);
}

kiln_status_t kiln_cl_queue_finish(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  kiln_status_t status = kiln_cl_check(ctx, clFinish(queue->queue), "clFinish (finishing a queue of opencl:%zu)",
                                       queue->device->index);
  pthread_mutex_lock(&queue->lock);
  kiln_status_t pending = queue->async_status;
  char message[sizeof queue->async_error];
  memcpy(message, queue->async_error, sizeof message);
  queue->async_status = KILN_OK;
  queue->async_error[0] = '\0';
  pthread_mutex_unlock(&queue->lock);
  if (pending != KILN_OK) return kiln_cl_error(ctx, pending, "%s", message);
  return status;
}

kiln_status_t kiln_cl_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_event_t **out_event) {
  kiln_backend_event_t *event = calloc(1, sizeof *event);
  if (!event) return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for an OpenCL event record");
  event->device = queue->device;
  /* A marker with an empty wait list completes after all earlier work of the
   * (in-order) queue; its profiling end is the timestamp. */
  kiln_status_t status = kiln_cl_check(ctx, clEnqueueMarkerWithWaitList(queue->queue, 0, NULL, &event->event),
                                       "clEnqueueMarkerWithWaitList on opencl:%zu", queue->device->index);
  if (status != KILN_OK) {
    free(event);
    return status;
  }
  if (clRetainCommandQueue(queue->queue) == CL_SUCCESS) {
    event->queue = queue->queue;
  } else {
    (void)clReleaseEvent(event->event);
    free(event);
    return kiln_cl_error(ctx, KILN_INTERNAL, "clRetainCommandQueue failed for a queue of opencl:%zu",
                         queue->device->index);
  }
  *out_event = event;
  return KILN_OK;
}

/* Commands of another queue run only once that queue is flushed: whoever
 * waits for an event must flush its queue first, or wait forever. The event
 * holds its own reference to that queue (asking the event for its queue is
 * not enough: the queue may have been released since, and flushing it would
 * touch freed memory); an event already complete needs no flush. */
static void flush_queue_of(const kiln_backend_event_t *event) {
  cl_int state = CL_QUEUED;
  if (clGetEventInfo(event->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL) == CL_SUCCESS &&
      state == CL_COMPLETE)
    return;
  if (event->queue) (void)clFlush(event->queue);
}

kiln_status_t kiln_cl_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                 kiln_backend_event_t *event) {
  if (event->device->context == queue->device->context) {
    flush_queue_of(event);
    return kiln_cl_check(ctx, clEnqueueBarrierWithWaitList(queue->queue, 1, &event->event, NULL),
                         "clEnqueueBarrierWithWaitList (a queue of opencl:%zu waiting for an event of the same device)",
                         queue->device->index);
  }
  /* An event of another context (another device, maybe another platform)
   * cannot be in a wait list: wait on the host now. Work enqueued on `queue`
   * later is then ordered after it, as the core asked. clWaitForEvents
   * flushes the event's queue itself. */
  return kiln_cl_check(ctx, clWaitForEvents(1, &event->event),
                       "clWaitForEvents (a queue of opencl:%zu waiting on the host for an event of opencl:%zu)",
                       queue->device->index, event->device->index);
}

kiln_status_t kiln_cl_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  return kiln_cl_check(ctx, clWaitForEvents(1, &event->event), "clWaitForEvents (an event of opencl:%zu)",
                       event->device->index);
}

kiln_status_t kiln_cl_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  cl_int state = CL_QUEUED;
  kiln_status_t status =
      kiln_cl_check(ctx, clGetEventInfo(event->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL),
                    "clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS) on opencl:%zu", event->device->index);
  if (status != KILN_OK) return status;
  if (state == CL_COMPLETE) return KILN_OK;
  if (state < 0)
    return kiln_cl_check(ctx, state, "work before an event of opencl:%zu (the command's execution status)",
                         event->device->index);
  /* A caller polling must see progress even if nothing else flushes. */
  flush_queue_of(event);
  return KILN_NOT_READY;
}

static kiln_status_t event_end(kiln_backend_context_t *ctx, kiln_backend_event_t *event, cl_ulong *out_ns) {
  cl_int state = CL_QUEUED;
  if (clGetEventInfo(event->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL) == CL_SUCCESS &&
      state != CL_COMPLETE && state >= 0)
    return kiln_cl_error(ctx, KILN_NOT_READY,
                         "an event of opencl:%zu has not completed yet; wait for the end event before asking for the "
                         "elapsed time",
                         event->device->index);
  cl_int err = clGetEventProfilingInfo(event->event, CL_PROFILING_COMMAND_END, sizeof *out_ns, out_ns, NULL);
  if (err == CL_PROFILING_INFO_NOT_AVAILABLE)
    /* Completed, on a profiling queue: the driver keeps no timestamps for
     * markers. */
    return kiln_cl_error(ctx, KILN_UNSUPPORTED,
                         "clGetEventProfilingInfo(CL_PROFILING_COMMAND_END) on opencl:%zu (%s): the driver gives no "
                         "timestamp for a completed marker (CL_PROFILING_INFO_NOT_AVAILABLE); time on the host instead",
                         event->device->index, event->device->desc.name);
  return kiln_cl_check(ctx, err, "clGetEventProfilingInfo(CL_PROFILING_COMMAND_END) on opencl:%zu",
                       event->device->index);
}

kiln_status_t kiln_cl_event_elapsed(kiln_backend_context_t *ctx, kiln_backend_event_t *start,
                                    kiln_backend_event_t *end, double *out_ms) {
  if (start->device != end->device)
    return kiln_cl_error(ctx, KILN_INVALID_ARGUMENT,
                         "cannot time between events of two devices (opencl:%zu and opencl:%zu): their clocks differ; "
                         "record both events on queues of one device",
                         start->device->index, end->device->index);
  /* Both markers' ends: a marker completes when all work before it did, so
   * the span between the two ends covers exactly the work between them. */
  cl_ulong t0 = 0, t1 = 0;
  kiln_status_t status = event_end(ctx, start, &t0);
  if (status == KILN_OK) status = event_end(ctx, end, &t1);
  if (status != KILN_OK) return status;
  *out_ms = t1 >= t0 ? (double)(t1 - t0) / 1e6 : -((double)(t0 - t1) / 1e6);
  return KILN_OK;
}

void kiln_cl_event_release(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  if (!event) return;
  /* Safe while pending: OpenCL frees the event once its command completes. */
  (void)clReleaseEvent(event->event);
  if (event->queue) (void)clReleaseCommandQueue(event->queue);
  free(event);
}
