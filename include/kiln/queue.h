/* kiln/queue.h: buffers, queues and events: bytes on a device and ordered work on it. */
#ifndef KILN_QUEUE_H
#define KILN_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/device.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef struct kiln_buffer_t kiln_buffer_t;
typedef struct kiln_queue_t kiln_queue_t;
typedef struct kiln_event_t kiln_event_t;

/* ---- queues ------------------------------------------------------------
 * A queue runs its work in order on one device. Each device has a default
 * queue; more can be created. Enqueue calls return at once; the CPU backend's
 * queues are asynchronous too (a worker thread per queue).
 *
 * Back-pressure: a queue holds at most 2048 operations (kernels and
 * non-blocking transfers) enqueued and not yet known complete, on every
 * backend. An enqueue call that would exceed that blocks until the oldest are
 * done (as a CUDA stream or an OpenCL driver does when its own queue is
 * full), so enqueueing without waiting keeps memory bounded. Errors of the
 * earlier work stay with the queue, for kiln_queue_finish. */

/* Create a new queue on a device. Caller owns one reference. Thread-safe. */
kiln_status_t kiln_queue_create(kiln_device_t *device, kiln_queue_t **out_queue);

/* The device's default queue (a borrowed pointer; retain it to keep it). */
kiln_queue_t *kiln_device_default_queue(kiln_device_t *device);

/* The queue tensor operations on this device use from the calling thread:
 * the one set with kiln_device_set_current_queue on this thread, else the
 * device's default queue. Borrowed pointer. */
kiln_queue_t *kiln_device_current_queue(kiln_device_t *device);

/* Make `queue` (which must belong to `device`) the current queue of that device
 * for the calling thread; NULL restores the default queue. The thread holds a
 * reference until it is replaced. */
kiln_status_t kiln_device_set_current_queue(kiln_device_t *device, kiln_queue_t *queue);

kiln_queue_t *kiln_queue_retain(kiln_queue_t *queue);
/* Releasing the last reference waits for the queue's work, then frees it. */
void kiln_queue_release(kiln_queue_t *queue);

kiln_device_t *kiln_queue_device(const kiln_queue_t *queue);

/* Block until all work enqueued so far on the queue has completed. Returns the
 * first asynchronous error the queue met since the last finish, if any. */
kiln_status_t kiln_queue_finish(kiln_queue_t *queue);

/* Enqueue a marker: *out_event completes when all earlier work on the queue
 * has. Caller owns the event. */
kiln_status_t kiln_queue_record(kiln_queue_t *queue, kiln_event_t **out_event);

/* Make later work on `queue` wait for `event` (from any queue, any device, any
 * backend). Does not block the caller unless the event comes from another
 * backend, in which case the caller waits for it here. */
kiln_status_t kiln_queue_wait(kiln_queue_t *queue, kiln_event_t *event);

/* ---- events ------------------------------------------------------------ */

kiln_event_t *kiln_event_retain(kiln_event_t *event);
void kiln_event_release(kiln_event_t *event);

/* Block until the event completed. Returns the status of the work it marks. */
kiln_status_t kiln_event_wait(kiln_event_t *event);

/* Non-blocking: KILN_OK when complete, KILN_NOT_READY when not yet. */
kiln_status_t kiln_event_query(kiln_event_t *event);

/* Device time in milliseconds between the completion of `start` and `end`
 * (both from the same queue, both complete, or waited for here: blocks).
 * KILN_INVALID_ARGUMENT when they come from different queues. */
kiln_status_t kiln_event_elapsed(kiln_event_t *start, kiln_event_t *end, double *out_ms);

/* ---- buffers -----------------------------------------------------------
 * Bytes on one device. Memory comes from a per-device pool: freeing returns it
 * for the next allocation, so an operation's result costs little. */

/* Allocate `size` bytes on the device (size 0 is allowed). Caller owns one
 * reference. KILN_OUT_OF_MEMORY with the size and the device's capacity when
 * it does not fit (after emptying the pool). Contents are undefined. */
kiln_status_t kiln_buffer_create(kiln_device_t *device, size_t size, kiln_buffer_t **out_buffer);

kiln_buffer_t *kiln_buffer_retain(kiln_buffer_t *buffer);
/* The memory returns to the pool once work already enqueued with it is done;
 * release does not block. */
void kiln_buffer_release(kiln_buffer_t *buffer);

size_t kiln_buffer_size(const kiln_buffer_t *buffer);
kiln_device_t *kiln_buffer_device(const kiln_buffer_t *buffer);

/* Copy `size` bytes of host memory into the buffer at `offset`. With
 * `blocking` false the host memory must stay valid and unchanged until
 * *out_event (if asked) or a queue finish says the copy is done. Waits first
 * for the `wait_count` events. out_event may be NULL. */
kiln_status_t kiln_buffer_write(kiln_queue_t *queue, kiln_buffer_t *buffer, size_t offset,
                                const void *host, size_t size, bool blocking, uint32_t wait_count,
                                kiln_event_t *const *wait_events, kiln_event_t **out_event);

/* Copy `size` bytes at `offset` of the buffer into host memory. With
 * `blocking` the call returns after the data arrived. */
kiln_status_t kiln_buffer_read(kiln_queue_t *queue, kiln_buffer_t *buffer, size_t offset, void *host,
                               size_t size, bool blocking, uint32_t wait_count,
                               kiln_event_t *const *wait_events, kiln_event_t **out_event);

/* Copy `size` bytes between buffers on any two devices. Same device: on the
 * queue's device. Same backend: device to device or peer. Across backends:
 * through host staging in overlapping chunks; that path blocks the caller
 * until done. `queue` is a queue of the destination's device; the copy also
 * orders after work already enqueued on the source device's current queue. */
kiln_status_t kiln_buffer_copy(kiln_queue_t *queue, kiln_buffer_t *src, size_t src_offset,
                               kiln_buffer_t *dst, size_t dst_offset, size_t size,
                               uint32_t wait_count, kiln_event_t *const *wait_events,
                               kiln_event_t **out_event);

/* Fill `size` bytes at `offset` with a repeated pattern of 1, 2 or 4 bytes. */
kiln_status_t kiln_buffer_fill(kiln_queue_t *queue, kiln_buffer_t *buffer, size_t offset,
                               size_t size, const void *pattern, size_t pattern_size,
                               uint32_t wait_count, kiln_event_t *const *wait_events,
                               kiln_event_t **out_event);

/* ---- host staging memory -------------------------------------------------
 * Host memory that `device` transfers from and to at full speed and, for
 * non-blocking writes and reads, truly in the background: page-locked memory
 * on CUDA (cuMemHostAlloc), a mapped CL_MEM_ALLOC_HOST_PTR buffer on OpenCL,
 * ordinary memory on the CPU backend. Page-locked memory is scarce: use it to
 * stage transfers (a batch, a chunk), not to hold a whole data set. */

/* Allocate `size` bytes (size 0 gives a valid, distinct pointer). The caller
 * owns the memory and frees it with kiln_host_free on the same device, after
 * the transfers that use it completed and before kiln_deinitialize.
 * KILN_OUT_OF_MEMORY with the size when it cannot be had. Thread-safe; does
 * not wait for queued work. */
kiln_status_t kiln_host_allocate(kiln_device_t *device, size_t size, void **out_ptr);

/* Free memory from kiln_host_allocate(device, ...). NULL is a no-op. */
void kiln_host_free(kiln_device_t *device, void *ptr);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_QUEUE_H */
