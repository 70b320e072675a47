/* runtime/buffer.c: buffers (each on a block of its device's memory pool) and transfers between any two devices. */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"
#include "runtime/trace.h"

/* Chunk size of copies staged through host memory. */
#define STAGE_CHUNK ((size_t)4 << 20)

static kiln__pool_block_t *block_of(kiln_buffer_t *buffer) {
  return (kiln__pool_block_t *)((char *)buffer - offsetof(kiln__pool_block_t, buffer));
}

/* queue: the queue the buffer is for, whose own pending work on a block does
 * not matter; NULL when the caller may use it on any queue, so that only idle
 * blocks will do. */
static kiln_status_t buffer_make(kiln_device_t *device, kiln_queue_t *queue, size_t size, kiln_buffer_t **out_buffer) {
  kiln__pool_block_t *block = NULL;
  uint64_t tied = 0;
  kiln_status_t status = kiln__pool_take(device, queue, size, &block, &tied);
  if (status == KILN_OUT_OF_MEMORY) {
    /* Pooled blocks may be what stands in the way; queued work may still
     * use them until the queues finish. */
    kiln__device_finish_all(device);
    kiln_clear_error();
    kiln__pool_trim(device);
    status = kiln__pool_take(device, queue, size, &block, &tied);
    if (status == KILN_OUT_OF_MEMORY)
      return kiln__wrap_error(status, "even after emptying the pool of %s: release tensors or allocate less",
                              device->display_name);
  }
  if (status != KILN_OK) return status;
  kiln_buffer_t *buffer = &block->buffer;
  atomic_init(&buffer->refs, 1);
  buffer->device = device;
  buffer->impl = block->impl;
  buffer->size = size;
  buffer->capacity = block->capacity;
  /* Memory allocated in order on a queue is that queue's until it is done. */
  atomic_init(&buffer->last_queue, tied);
  atomic_init(&buffer->multi_queue, false);
  buffer->release = NULL;
  buffer->owner = NULL;
  buffer->read_only = false;
  *out_buffer = buffer;
  return KILN_OK;
}

kiln_status_t kiln__buffer_wrap(kiln_device_t *device, void *handle, size_t size, void (*release)(void *owner),
                                void *owner, kiln_buffer_t **out_buffer) {
  if (!device->iface->buffer_wrap)
    return kiln__set_error(KILN_UNSUPPORTED, "the %s backend cannot use memory it did not allocate (no DLPack import)",
                           device->iface->name);
  /* A block outside the pool, so that the buffer object has its usual home. */
  kiln__pool_block_t *block = calloc(1, sizeof *block);
  if (!block) return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate a buffer object for %s", device->display_name);
  kiln_status_t status = device->iface->buffer_wrap(device->ctx, device->impl, handle, size, &block->impl);
  if (status != KILN_OK) {
    free(block);
    return kiln__wrap_error(status, "using %zu bytes of imported memory on %s", size, device->display_name);
  }
  block->capacity = size;
  kiln_buffer_t *buffer = &block->buffer;
  atomic_init(&buffer->refs, 1);
  buffer->device = device;
  buffer->impl = block->impl;
  buffer->size = size;
  buffer->capacity = size;
  atomic_init(&buffer->last_queue, 0);
  atomic_init(&buffer->multi_queue, false);
  buffer->release = release;
  buffer->owner = owner;
  buffer->read_only = false;
  *out_buffer = buffer;
  return KILN_OK;
}

kiln_status_t kiln__buffer_check_writable(const char *call, const char *name, const kiln_buffer_t *buffer) {
  if (!buffer->read_only) return KILN_OK;
  return kiln__set_error(KILN_INVALID_ARGUMENT,
                         "%s: %s views memory imported read-only (a DLPack tensor flagged "
                         "DLPACK_FLAG_BITMASK_READ_ONLY), which kiln never writes; write to a copy (kiln_tensor_copy) "
                         "or import the tensor writable",
                         call, name);
}

kiln_status_t kiln__buffer_settle(kiln_buffer_t *buffer) {
  uint64_t queue_id = atomic_load_explicit(&buffer->last_queue, memory_order_relaxed);
  if (queue_id == 0) return KILN_OK;
  return kiln__device_finish_all(buffer->device);
}

kiln_status_t kiln__buffer_create(kiln_device_t *device, kiln_queue_t *queue, size_t size,
                                  kiln_buffer_t **out_buffer) {
  if (!queue) queue = device->default_queue;
  return buffer_make(device, queue, size, out_buffer);
}

kiln_status_t kiln__buffer_create_idle(kiln_device_t *device, size_t size, kiln_buffer_t **out_buffer) {
  return buffer_make(device, NULL, size, out_buffer);
}

/* The last reference is gone: the block goes back to the pool, tagged with
 * the queue whose order covers the work still using it. */
static void buffer_destroy(kiln_buffer_t *buffer) {
  kiln_device_t *device = buffer->device;
  if (buffer->release) {
    /* Imported memory goes back to its owner once no work uses it. */
    if (atomic_load_explicit(&buffer->last_queue, memory_order_relaxed)) kiln__device_finish_all(device);
    kiln__pool_block_t *block = block_of(buffer);
    device->iface->buffer_free(device->ctx, device->impl, block->impl);
    buffer->release(buffer->owner);
    free(block);
    return;
  }
  uint64_t queue_id = atomic_load_explicit(&buffer->last_queue, memory_order_relaxed);
  if (atomic_load_explicit(&buffer->multi_queue, memory_order_relaxed)) {
    /* No single queue's order covers it: wait for them all (rare). */
    kiln__device_finish_all(device);
    queue_id = 0;
  }
  kiln__pool_put(device, block_of(buffer), queue_id, kiln__queue_stamp());
}

KILN__DEFINE_REFCOUNT(kiln_buffer_t, buffer, buffer_destroy)

/* ---- public buffer API ------------------------------------------------------------ */

kiln_status_t kiln_buffer_create(kiln_device_t *device, size_t size, kiln_buffer_t **out_buffer) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!device || !out_buffer)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_buffer_create: %s is NULL; pass a device from kiln_device_get and the address of a "
                           "kiln_buffer_t *",
                           !device ? "device" : "out_buffer");
  /* The caller may use the buffer on any queue: no block that a queue's
   * pending work still uses will do. */
  status = kiln__buffer_create_idle(device, size, out_buffer);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_buffer_create");
}

size_t kiln_buffer_size(const kiln_buffer_t *buffer) { return buffer ? buffer->size : 0; }

kiln_device_t *kiln_buffer_device(const kiln_buffer_t *buffer) { return buffer ? buffer->device : NULL; }

/* Common checks of the transfer calls: queue and buffer present, the range
 * inside the buffer, host memory present when bytes move. */
static kiln_status_t transfer_check(const char *call, kiln_queue_t *queue, kiln_buffer_t *buffer,
                                         size_t offset, const void *host, size_t size) {
  if (!queue)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: queue is NULL; pass kiln_device_current_queue(device)", call);
  if (!buffer) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: buffer is NULL; pass a buffer from kiln_buffer_create", call);
  if (queue->device != buffer->device)
    return kiln__set_error(KILN_DEVICE_MISMATCH,
                           "%s: the buffer lives on %s but the queue belongs to %s; use a queue of the buffer's "
                           "device (kiln_device_current_queue(kiln_buffer_device(buffer)))",
                           call, buffer->device->display_name, queue->device->display_name);
  if (offset > buffer->size || size > buffer->size - offset)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: bytes [%zu, %zu + %zu) lie outside the buffer of %zu bytes; keep offset + size <= "
                           "kiln_buffer_size(buffer)",
                           call, offset, offset, size, buffer->size);
  if (!host && size > 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: host memory is NULL for %zu bytes; pass a valid pointer", call,
                           size);
  return KILN_OK;
}

kiln_status_t kiln_buffer_write(kiln_queue_t *queue, kiln_buffer_t *buffer, size_t offset, const void *host,
                                size_t size, bool blocking, uint32_t wait_count, kiln_event_t *const *wait_events,
                                kiln_event_t **out_event) {
  kiln_status_t status = transfer_check("kiln_buffer_write", queue, buffer, offset, host, size);
  if (status == KILN_OK) status = kiln__buffer_check_writable("kiln_buffer_write", "buffer", buffer);
  if (status != KILN_OK) return status;
  status = kiln__queue_wait_list(queue, wait_count, wait_events);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_buffer_write");
  uint64_t stamp = kiln__queue_stamp();
  if (size > 0) {
    const int64_t trace_t0 = KILN__TRACE_ON() ? kiln__trace_now() : 0;
    kiln__buffer_touch(buffer, queue);
    status = queue->device->iface->buffer_write(queue->device->ctx, queue->impl, buffer->impl, offset, host, size, blocking);
    if (status != KILN_OK)
      return kiln__wrap_error(status, "kiln_buffer_write of %zu bytes to %s", size, queue->device->display_name);
    if (blocking) kiln__queue_mark_done(queue, stamp);
    else kiln__queue_count_op(queue);
    if (trace_t0) kiln__trace_copy(queue, KILN__TRACE_H2D, size, trace_t0);
  }
  status = kiln__queue_record_out(queue, out_event);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_buffer_write");
}

kiln_status_t kiln_buffer_read(kiln_queue_t *queue, kiln_buffer_t *buffer, size_t offset, void *host, size_t size,
                               bool blocking, uint32_t wait_count, kiln_event_t *const *wait_events,
                               kiln_event_t **out_event) {
  kiln_status_t status = transfer_check("kiln_buffer_read", queue, buffer, offset, host, size);
  if (status != KILN_OK) return status;
  status = kiln__queue_wait_list(queue, wait_count, wait_events);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_buffer_read");
  uint64_t stamp = kiln__queue_stamp();
  if (size > 0) {
    const int64_t trace_t0 = KILN__TRACE_ON() ? kiln__trace_now() : 0;
    kiln__buffer_touch(buffer, queue);
    status = queue->device->iface->buffer_read(queue->device->ctx, queue->impl, buffer->impl, offset, host, size, blocking);
    if (status != KILN_OK)
      return kiln__wrap_error(status, "kiln_buffer_read of %zu bytes from %s", size, queue->device->display_name);
    if (trace_t0) kiln__trace_copy(queue, KILN__TRACE_D2H, size, trace_t0);
    /* A blocking read on an in-order queue means all earlier work is done,
     * and what the device found wrong in it is reported now. */
    if (blocking) {
      kiln__queue_mark_done(queue, stamp);
      status = kiln__checks_run(queue);
      if (status != KILN_OK) return status;
    } else {
      kiln__queue_count_op(queue);
    }
  }
  status = kiln__queue_record_out(queue, out_event);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_buffer_read");
}

kiln_status_t kiln_buffer_fill(kiln_queue_t *queue, kiln_buffer_t *buffer, size_t offset, size_t size,
                               const void *pattern, size_t pattern_size, uint32_t wait_count,
                               kiln_event_t *const *wait_events, kiln_event_t **out_event) {
  if (!pattern)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_buffer_fill: pattern is NULL; pass 1, 2 or 4 bytes");
  kiln_status_t status = transfer_check("kiln_buffer_fill", queue, buffer, offset, pattern, size);
  if (status == KILN_OK) status = kiln__buffer_check_writable("kiln_buffer_fill", "buffer", buffer);
  if (status != KILN_OK) return status;
  if (pattern_size != 1 && pattern_size != 2 && pattern_size != 4)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_buffer_fill: pattern_size %zu is not 1, 2 or 4; repeat a 1-, 2- or 4-byte pattern",
                           pattern_size);
  if (size % pattern_size != 0 || offset % pattern_size != 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_buffer_fill: offset %zu and size %zu must be multiples of pattern_size %zu", offset,
                           size, pattern_size);
  status = kiln__queue_wait_list(queue, wait_count, wait_events);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_buffer_fill");
  if (size > 0) {
    kiln__buffer_touch(buffer, queue);
    status = queue->device->iface->buffer_fill(queue->device->ctx, queue->impl, buffer->impl, offset, size, pattern, pattern_size);
    if (status != KILN_OK)
      return kiln__wrap_error(status, "kiln_buffer_fill of %zu bytes on %s", size, queue->device->display_name);
    kiln__queue_count_op(queue);
  }
  status = kiln__queue_record_out(queue, out_event);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_buffer_fill");
}

/* ---- copies ------------------------------------------------------------------------ */

/* Make `waiter` wait for the work enqueued so far on `signaller` (one backend). */
static kiln_status_t order_after(kiln_queue_t *waiter, kiln_queue_t *signaller) {
  const kiln_backend_iface_t *iface = signaller->device->iface;
  kiln_backend_context_t *ctx = signaller->device->ctx;
  kiln_backend_event_t *event = NULL;
  const int64_t trace_t0 = KILN__TRACE_ON() ? kiln__trace_now() : 0;
  kiln_status_t status = iface->queue_record(ctx, signaller->impl, &event);
  if (status != KILN_OK) return status;
  status = iface->queue_wait(ctx, waiter->impl, event);
  iface->event_release(ctx, event);
  if (trace_t0 && status == KILN_OK) kiln__trace_wait(waiter, trace_t0);
  return status;
}

typedef struct stage_t {
  kiln_device_t *owner; /* whose host_allocate made it; NULL: malloc */
  void *ptr;
} stage_t;

static kiln_status_t stage_alloc(kiln_device_t *a, kiln_device_t *b, size_t size, stage_t *out) {
  kiln_device_t *owners[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    kiln_device_t *d = owners[i];
    if (d->iface->host_allocate && d->iface->host_free &&
        d->iface->host_allocate(d->ctx, d->impl, size, &out->ptr) == KILN_OK) {
      out->owner = d;
      return KILN_OK;
    }
    kiln_clear_error();
  }
  out->owner = NULL;
  out->ptr = malloc(size);
  if (!out->ptr)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory to stage a copy", size);
  return KILN_OK;
}

static void stage_free(stage_t *stage) {
  if (!stage->ptr) return;
  if (stage->owner) stage->owner->iface->host_free(stage->owner->ctx, stage->owner->impl, stage->ptr);
  else free(stage->ptr);
  stage->ptr = NULL;
}

/* ---- public host staging memory ------------------------------------------------ */

/* The backend's page-locked memory when it has the pair of slots, malloc
 * otherwise: the choice depends only on the device, so kiln_host_free makes
 * the same one without a record of each pointer. */
kiln_status_t kiln_host_allocate(kiln_device_t *device, size_t size, void **out_ptr) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!device || !out_ptr)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_host_allocate: %s is NULL; pass a device from kiln_device_get and the address of a "
                           "void *",
                           !device ? "device" : "out_ptr");
  void *ptr = NULL;
  if (device->iface->host_allocate && device->iface->host_free) {
    status = device->iface->host_allocate(device->ctx, device->impl, size ? size : 1, &ptr);
    if (status != KILN_OK)
      return kiln__wrap_error(status, "kiln_host_allocate of %zu bytes of page-locked memory for %s", size,
                              device->display_name);
  } else {
    ptr = malloc(size ? size : 1);
    if (!ptr)
      return kiln__set_error(KILN_OUT_OF_MEMORY, "kiln_host_allocate: cannot allocate %zu bytes of host memory for %s",
                             size, device->display_name);
  }
  *out_ptr = ptr;
  return KILN_OK;
}

void kiln_host_free(kiln_device_t *device, void *ptr) {
  if (!ptr || !device) return;
  if (device->iface->host_allocate && device->iface->host_free) device->iface->host_free(device->ctx, device->impl, ptr);
  else free(ptr);
}

/* Through host memory: read chunk i+1 on the source while chunk i is written
 * to the destination. Blocks until done. */
static kiln_status_t copy_staged(kiln_queue_t *src_queue, kiln_buffer_t *src, size_t src_offset,
                                      kiln_queue_t *dst_queue, kiln_buffer_t *dst, size_t dst_offset, size_t size) {
  const kiln_backend_iface_t *si = src_queue->device->iface, *di = dst_queue->device->iface;
  kiln_backend_context_t *sc = src_queue->device->ctx, *dc = dst_queue->device->ctx;
  size_t chunk = size < STAGE_CHUNK ? size : STAGE_CHUNK;
  stage_t stage[2] = {{0}, {0}};
  kiln_backend_event_t *written[2] = {NULL, NULL};
  kiln_status_t status = stage_alloc(src_queue->device, dst_queue->device, chunk, &stage[0]);
  if (status == KILN_OK && size > chunk)
    status = stage_alloc(src_queue->device, dst_queue->device, chunk, &stage[1]);
  size_t done = 0;
  int i = 0;
  if (status == KILN_OK) status = si->buffer_read(sc, src_queue->impl, src->impl, src_offset, stage[0].ptr, chunk, true);
  while (status == KILN_OK && done < size) {
    size_t n = size - done < chunk ? size - done : chunk;
    int s = i & 1;
    status = di->buffer_write(dc, dst_queue->impl, dst->impl, dst_offset + done, stage[s].ptr, n, false);
    if (status != KILN_OK) break;
    status = di->queue_record(dc, dst_queue->impl, &written[s]);
    if (status != KILN_OK) break;
    size_t next = done + n;
    if (next < size) {
      int t = s ^ 1;
      /* The other staging buffer is free once its previous write finished. */
      if (written[t]) {
        status = di->event_wait(dc, written[t]);
        di->event_release(dc, written[t]);
        written[t] = NULL;
        if (status != KILN_OK) break;
      }
      size_t m = size - next < chunk ? size - next : chunk;
      status = si->buffer_read(sc, src_queue->impl, src->impl, src_offset + next, stage[t].ptr, m, true);
    }
    done = next;
    i++;
  }
  for (int s = 0; s < 2; s++) {
    if (written[s]) {
      kiln_status_t w = di->event_wait(dc, written[s]);
      if (status == KILN_OK) status = w;
      di->event_release(dc, written[s]);
    }
  }
  stage_free(&stage[0]);
  stage_free(&stage[1]);
  return status;
}

kiln_status_t kiln_buffer_copy(kiln_queue_t *queue, kiln_buffer_t *src, size_t src_offset, kiln_buffer_t *dst,
                               size_t dst_offset, size_t size, uint32_t wait_count, kiln_event_t *const *wait_events,
                               kiln_event_t **out_event) {
  static const char call[] = "kiln_buffer_copy";
  if (!src)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: src is NULL; pass a buffer from kiln_buffer_create", call);
  if (!dst)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: dst is NULL; pass a buffer from kiln_buffer_create", call);
  char dummy = 0;
  kiln_status_t status = transfer_check(call, queue, dst, dst_offset, &dummy, size);
  if (status == KILN_OK) status = kiln__buffer_check_writable(call, "dst", dst);
  if (status != KILN_OK) return status;
  if (src_offset > src->size || size > src->size - src_offset)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: source bytes [%zu, %zu + %zu) lie outside the source buffer of %zu bytes; keep "
                           "src_offset + size <= kiln_buffer_size(src)",
                           call, src_offset, src_offset, size, src->size);
  if (src == dst && size > 0 && src_offset < dst_offset + size && dst_offset < src_offset + size)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: source [%zu, +%zu) and destination [%zu, +%zu) overlap in one buffer; copy through a "
                           "second buffer",
                           call, src_offset, size, dst_offset, size);
  status = kiln__queue_wait_list(queue, wait_count, wait_events);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);

  kiln_device_t *sd = src->device, *dd = dst->device;
  kiln_queue_t *src_queue = kiln_device_current_queue(sd);
  const kiln_backend_iface_t *iface = dd->iface;
  const int64_t trace_t0 = KILN__TRACE_ON() && size > 0 ? kiln__trace_now() : 0;
  if (size > 0 && sd->iface == dd->iface && iface->buffer_copy) {
    if (src_queue != queue) status = order_after(queue, src_queue);
    if (status == KILN_OK) status = iface->buffer_copy(dd->ctx, queue->impl, src->impl, src_offset, dst->impl, dst_offset, size);
    /* Later writes to src on its own queue must not overtake the copy. */
    if (status == KILN_OK && src_queue != queue) status = order_after(src_queue, queue);
    if (status != KILN_OK)
      return kiln__wrap_error(status, "%s of %zu bytes from %s to %s", call, size, sd->display_name, dd->display_name);
    kiln__buffer_touch(src, src_queue);
    kiln__buffer_touch(dst, queue);
    kiln__queue_count_op(queue);
  } else if (size > 0) {
    /* Across backends (or a backend without device copies): the caller
     * waits, so nothing stays in flight that the queues do not know of. */
    void *src_host = sd->iface->buffer_host_pointer ? sd->iface->buffer_host_pointer(sd->ctx, src->impl) : NULL;
    void *dst_host = dd->iface->buffer_host_pointer ? dd->iface->buffer_host_pointer(dd->ctx, dst->impl) : NULL;
    uint64_t stamp = kiln__queue_stamp();
    if (src_host) {
      status = kiln__device_finish_all(sd);
      if (status == KILN_OK)
        status = iface->buffer_write(dd->ctx, queue->impl, dst->impl, dst_offset, (char *)src_host + src_offset, size, true);
    } else if (dst_host) {
      status = kiln__device_finish_all(dd);
      if (status == KILN_OK)
        status = sd->iface->buffer_read(sd->ctx, src_queue->impl, src->impl, src_offset, (char *)dst_host + dst_offset, size,
                                        true);
    } else {
      status = iface->queue_finish(dd->ctx, queue->impl);
      if (status == KILN_OK) status = copy_staged(src_queue, src, src_offset, queue, dst, dst_offset, size);
    }
    if (status != KILN_OK)
      return kiln__wrap_error(status, "%s of %zu bytes from %s to %s through host memory", call, size,
                              sd->display_name, dd->display_name);
    kiln__queue_mark_done(queue, stamp);
    kiln__queue_mark_done(src_queue, stamp);
    kiln__buffer_touch(src, src_queue);
    kiln__buffer_touch(dst, queue);
  }
  if (trace_t0) {
    const bool host_src = sd->iface->buffer_host_pointer, host_dst = dd->iface->buffer_host_pointer;
    kiln__trace_copy(queue, host_src && !host_dst ? KILN__TRACE_H2D : !host_src && host_dst ? KILN__TRACE_D2H : KILN__TRACE_D2D,
                     size, trace_t0);
  }
  status = kiln__queue_record_out(queue, out_event);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}
