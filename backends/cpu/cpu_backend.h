/* backends/cpu/cpu_backend.h: the CPU backend's private objects (context, devices, buffers, queues, events), shared by its files. */
#ifndef KILN_CPU_BACKEND_H
#define KILN_CPU_BACKEND_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/cpu/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "runtime/backend.h"

/* Everything the backend keeps between calls: initialize() makes it. */
struct kiln_backend_context_t {
  kiln_host_t host; /* the core's table, copied */
  kiln_backend_device_t *devices;
  size_t device_count;
  int usable_cpus;
  char model[256];
  char vendor[128];
};

struct kiln_backend_device_t {
  kiln_backend_context_t *ctx;
  size_t index;
  int threads;
  int cpu_ids[CPU_SETSIZE];
  cpu_set_t cpus; /* the queue workers and the thread pool's helpers run here */
  kiln_cpu_thread_pool_t *thread_pool;
  kiln_cpu_par_t par; /* the parallel-for kernels get: this device's thread pool */
  uint64_t memory_bytes;
};

struct kiln_backend_buffer_t {
  void *data; /* 64-byte aligned, never NULL (even for size 0); any address when wrapped */
  size_t size;
  kiln_backend_device_t *device;
  bool wrapped; /* memory of a DLPack producer: never freed here */
};

/* A marker in a queue; done once the worker reached it. Shared by the queue
 * (until it passed the marker, or a wait on it) and by the core's handle. */
struct kiln_backend_event_t {
  _Atomic uint32_t refs;
  _Atomic uint32_t done;     /* futex */
  _Atomic uint32_t sleepers; /* threads that may sleep on `done` */
  uint64_t ns;               /* CLOCK_MONOTONIC when the worker reached it */
};

/* queue.c: the interface's queue, event and transfer slots. */
kiln_status_t kiln_cpu_queue_create(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                    kiln_backend_queue_t **out_queue);
void kiln_cpu_queue_destroy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
kiln_status_t kiln_cpu_queue_finish(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
kiln_status_t kiln_cpu_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_event_t **out_event);
kiln_status_t kiln_cpu_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  kiln_backend_event_t *event);
kiln_status_t kiln_cpu_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
kiln_status_t kiln_cpu_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
kiln_status_t kiln_cpu_event_elapsed(kiln_backend_context_t *ctx, kiln_backend_event_t *start,
                                     kiln_backend_event_t *end, double *out_ms);
void kiln_cpu_event_release(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
kiln_status_t kiln_cpu_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *buffer, size_t offset, const void *host, size_t size,
                                    bool blocking);
kiln_status_t kiln_cpu_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_buffer_t *buffer, size_t offset, void *host, size_t size,
                                   bool blocking);
kiln_status_t kiln_cpu_buffer_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_buffer_t *src, size_t src_offset, kiln_backend_buffer_t *dst,
                                   size_t dst_offset, size_t size);
kiln_status_t kiln_cpu_buffer_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_buffer_t *buffer, size_t offset, size_t size, const void *pattern,
                                   size_t pattern_size);
/* Every row's run: enqueue the row's kernel (entry->impl, a kiln_cpu_kernel_t)
 * with a copy of the op; the queue's worker calls it. */
kiln_status_t kiln_cpu_op_run(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                              const kiln_op_t *op);

/* What an op row's impl points to. */
typedef struct kiln_cpu_kernel_t {
  kiln_cpu_kernel_fn fn;
} kiln_cpu_kernel_t;

/* ops.c: the table of operations. */
extern const kiln_op_entry_t kiln_cpu_ops[];

#endif /* KILN_CPU_BACKEND_H */
