/* backends/cpu/cpu_backend.h: the CPU backend's private objects (devices, buffers, queues, events), shared by its files. */
#ifndef KILN_CPU_BACKEND_H
#define KILN_CPU_BACKEND_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/cpu/threadpool.h"
#include "runtime/backend.h"

/* The core's table, copied at initialize. */
extern kiln_host_t kiln_cpu_host;

struct kiln_backend_device_t {
  size_t index;
  int threads;
  int cpu_ids[CPU_SETSIZE];
  cpu_set_t cpus; /* the queue workers and the pool's helpers run here */
  kiln_cpu_pool_t *pool;
  uint64_t memory_bytes;
};

struct kiln_backend_buffer_t {
  void *data; /* 64-byte aligned, never NULL (even for size 0) */
  size_t size;
  kiln_backend_device_t *device;
};

/* A marker in a queue; done once the worker reached it. Shared by the queue
 * (until it passed the marker, or a wait on it) and by the core's handle. */
struct kiln_backend_event_t {
  _Atomic uint32_t refs;
  _Atomic uint32_t done;     /* futex */
  _Atomic uint32_t sleepers; /* threads that may sleep on `done` */
  uint64_t ns;               /* CLOCK_MONOTONIC when the worker reached it */
};

/* queue.c */
kiln_status_t kiln_cpu_queue_create(kiln_backend_device_t *device, kiln_backend_queue_t **out_queue);
void kiln_cpu_queue_destroy(kiln_backend_queue_t *queue);
kiln_status_t kiln_cpu_queue_finish(kiln_backend_queue_t *queue);
kiln_status_t kiln_cpu_queue_record(kiln_backend_queue_t *queue, kiln_backend_event_t **out_event);
kiln_status_t kiln_cpu_queue_wait(kiln_backend_queue_t *queue, kiln_backend_event_t *event);
kiln_status_t kiln_cpu_event_wait(kiln_backend_event_t *event);
kiln_status_t kiln_cpu_event_query(kiln_backend_event_t *event);
kiln_status_t kiln_cpu_event_elapsed(kiln_backend_event_t *start, kiln_backend_event_t *end, double *out_ms);
void kiln_cpu_event_release(kiln_backend_event_t *event);
kiln_status_t kiln_cpu_buffer_write(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                    const void *host, size_t size, bool blocking);
kiln_status_t kiln_cpu_buffer_read(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                   void *host, size_t size, bool blocking);
kiln_status_t kiln_cpu_buffer_copy(kiln_backend_queue_t *queue, kiln_backend_buffer_t *src, size_t src_offset,
                                   kiln_backend_buffer_t *dst, size_t dst_offset, size_t size);
kiln_status_t kiln_cpu_buffer_fill(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                   size_t size, const void *pattern, size_t pattern_size);
kiln_status_t kiln_cpu_op_run(kiln_backend_queue_t *queue, kiln_provider_t provider, const kiln_op_t *op);

/* ops.c */
uint32_t kiln_cpu_op_providers(kiln_backend_device_t *device, kiln_op_kind_t kind, kiln_dtype_t dtype);
/* Check that `provider` can run `op` here (KILN_UNSUPPORTED with a message if not). */
kiln_status_t kiln_cpu_op_check(kiln_provider_t provider, const kiln_op_t *op);
/* Run a checked op on the calling thread (the queue's worker). */
void kiln_cpu_op_execute(kiln_backend_device_t *device, kiln_provider_t provider, const kiln_op_t *op);

#endif /* KILN_CPU_BACKEND_H */
