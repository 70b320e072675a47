/* runtime/pool.c: each device's memory pool: blocks by size class, reused by the queue that released them at once and by others once that queue finished. */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"
#include "runtime/trace.h"

#define MIN_BYTES ((size_t)256)
/* How many blocks of a class an allocation inspects before allocating anew:
 * bounds the time spent under the lock when a list holds blocks of busy queues. */
#define SCAN 8

/* Two classes per power of two (256, 384, 512, 768, ...): at most a third
 * of a block goes unused. */
static size_t class_bytes(int c) {
  size_t base = MIN_BYTES << (c / 2);
  return (c & 1) ? base + base / 2 : base;
}

/* The smallest class that holds `size`; -1 when none does. */
static int class_for(size_t size) {
  for (int c = 0; c < KILN__POOL_CLASSES; c++)
    if (class_bytes(c) >= size) return c;
  return -1;
}

/* The largest class a block of `capacity` bytes can serve in full. */
static int class_floor(size_t capacity) {
  int found = 0;
  for (int c = 0; c < KILN__POOL_CLASSES; c++) {
    if (class_bytes(c) > capacity) break;
    found = c;
  }
  return found;
}

static void blocks_free(kiln_device_t *device, kiln__pool_block_t *chain) {
  while (chain) {
    kiln__pool_block_t *next = chain->next;
    device->iface->buffer_free(device->ctx, device->impl, chain->impl);
    free(chain);
    chain = next;
  }
}

/* Unlink every pooled block; the caller frees the chain outside the lock. */
static kiln__pool_block_t *pool_empty_locked(kiln__pool_t *pool) {
  kiln__pool_block_t *chain = NULL;
  for (int c = 0; c < KILN__POOL_CLASSES; c++) {
    kiln__pool_block_t *b = pool->free_lists[c];
    while (b) {
      kiln__pool_block_t *next = b->next;
      b->next = chain;
      chain = b;
      b = next;
    }
    pool->free_lists[c] = NULL;
  }
  pool->pooled_bytes = 0;
  return chain;
}

void kiln__pool_init(kiln_device_t *device, bool (*idle)(kiln_device_t *device, uint64_t queue_id, uint64_t stamp)) {
  kiln__pool_t *pool = &device->pool;
  memset(pool, 0, sizeof *pool);
  pool->idle = idle;
  pthread_mutex_init(&pool->lock, NULL);
  /* Pooled bytes a device may keep: an eighth of its memory, within [64 MiB, 2 GiB]. */
  uint64_t limit = device->desc.memory_bytes / 8;
  if (limit < ((uint64_t)64 << 20)) limit = (uint64_t)64 << 20;
  if (limit > ((uint64_t)2 << 30)) limit = (uint64_t)2 << 30;
  pool->limit = (size_t)limit;
}

void kiln__pool_destroy(kiln_device_t *device) {
  kiln__pool_t *pool = &device->pool;
  pthread_mutex_lock(&pool->lock);
  kiln__pool_block_t *chain = pool_empty_locked(pool);
  pthread_mutex_unlock(&pool->lock);
  blocks_free(device, chain);
  pthread_mutex_destroy(&pool->lock);
}

void kiln__pool_trim(kiln_device_t *device) {
  if (!device) return;
  kiln__pool_t *pool = &device->pool;
  pthread_mutex_lock(&pool->lock);
  kiln__pool_block_t *chain = pool_empty_locked(pool);
  const uint64_t in_use = pool->live_bytes, pooled = pool->pooled_bytes;
  pthread_mutex_unlock(&pool->lock);
  blocks_free(device, chain);
  if (KILN__TRACE_ON()) kiln__trace_memory(device, in_use, pooled);
}

/* Take a block of class c usable by queue_id; NULL when none. Lock held. */
static kiln__pool_block_t *take_locked(kiln_device_t *device, int c, uint64_t queue_id) {
  kiln__pool_block_t **link = &device->pool.free_lists[c];
  kiln__pool_block_t **other = NULL;
  int scanned = 0;
  for (kiln__pool_block_t *b = *link; b && scanned < SCAN; link = &b->next, b = b->next, scanned++) {
    /* The same in-order queue may reuse at once: its later work runs after
     * whatever still uses the block. */
    if (b->queue_id == queue_id || b->queue_id == 0) {
      *link = b->next;
      return b;
    }
    if (!other && device->pool.idle(device, b->queue_id, b->stamp)) other = link;
  }
  if (other) {
    kiln__pool_block_t *b = *other;
    *other = b->next;
    return b;
  }
  return NULL;
}

static void live_add(kiln__pool_t *pool, size_t bytes) {
  pool->live_bytes += bytes;
  if (pool->live_bytes > pool->peak_bytes) pool->peak_bytes = pool->live_bytes;
}

/* One allocation from the device: ordered on `queue` when the backend can. */
static kiln_status_t device_allocate(kiln_device_t *device, kiln_queue_t *queue, size_t capacity,
                                     kiln_backend_buffer_t **out_impl, uint64_t *out_queue_id) {
  *out_queue_id = 0;
  if (queue && device->iface->buffer_allocate_on) {
    kiln_status_t status = device->iface->buffer_allocate_on(device->ctx, device->impl, queue->impl, capacity, out_impl);
    if (status == KILN_OK) *out_queue_id = queue->id;
    return status;
  }
  return device->iface->buffer_allocate(device->ctx, device->impl, capacity, out_impl);
}

kiln_status_t kiln__pool_take(kiln_device_t *device, kiln_queue_t *queue, size_t size, kiln__pool_block_t **out_block,
                              uint64_t *out_queue_id) {
  const uint64_t queue_id = queue ? queue->id : 0;
  *out_queue_id = 0;
  uint64_t max_alloc = device->desc.max_alloc_bytes ? device->desc.max_alloc_bytes : device->desc.memory_bytes;
  if (max_alloc && (uint64_t)size > max_alloc)
    return kiln__set_error(KILN_OUT_OF_MEMORY,
                           "cannot allocate %zu bytes on %s: its largest allocation is %llu bytes (memory %llu "
                           "bytes); allocate less or split the tensor",
                           size, device->display_name, (unsigned long long)max_alloc,
                           (unsigned long long)device->desc.memory_bytes);
  int c = class_for(size);
  size_t capacity = c >= 0 ? class_bytes(c) : size;
  /* Rounding up must not push a request that fits over the device's limit. */
  if (max_alloc && (uint64_t)capacity > max_alloc) {
    capacity = size;
    c = -1;
  }

  kiln__pool_t *pool = &device->pool;
  kiln__pool_block_t *block = NULL;
  if (c >= 0) {
    pthread_mutex_lock(&pool->lock);
    block = take_locked(device, c, queue_id);
    if (block) {
      pool->pooled_bytes -= block->capacity;
      live_add(pool, block->capacity);
    }
    const uint64_t in_use = pool->live_bytes, pooled = pool->pooled_bytes;
    pthread_mutex_unlock(&pool->lock);
    if (block && KILN__TRACE_ON()) kiln__trace_memory(device, in_use, pooled);
  }
  if (!block) {
    block = malloc(sizeof *block);
    if (!block)
      return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate a pool block (%zu bytes of host memory) for %s",
                             sizeof *block, device->display_name);
    kiln_backend_buffer_t *impl = NULL;
    kiln_status_t status = device_allocate(device, queue, capacity, &impl, out_queue_id);
    if (status != KILN_OK) {
      free(block);
      if (status == KILN_OUT_OF_MEMORY)
        return kiln__wrap_error(status, "cannot allocate %zu bytes on %s (memory %llu bytes, %zu bytes in use by live "
                                "buffers, %zu pooled)", size, device->display_name,
                                (unsigned long long)device->desc.memory_bytes, pool->live_bytes, pool->pooled_bytes);
      return kiln__wrap_error(status, "allocating %zu bytes on %s", size, device->display_name);
    }
    block->impl = impl;
    block->capacity = capacity;
    pthread_mutex_lock(&pool->lock);
    live_add(pool, capacity);
    pool->allocations++;
    const uint64_t in_use = pool->live_bytes, pooled = pool->pooled_bytes;
    pthread_mutex_unlock(&pool->lock);
    if (KILN__TRACE_ON()) kiln__trace_memory(device, in_use, pooled);
  }
  block->next = NULL;
  block->queue_id = 0;
  block->stamp = 0;
  *out_block = block;
  return KILN_OK;
}

void kiln__pool_put(kiln_device_t *device, kiln__pool_block_t *block, uint64_t queue_id, uint64_t stamp) {
  kiln__pool_t *pool = &device->pool;
  kiln__pool_block_t *chain = NULL;
  block->queue_id = queue_id;
  block->stamp = stamp;
  int c = class_floor(block->capacity);
  pthread_mutex_lock(&pool->lock);
  block->next = pool->free_lists[c];
  pool->free_lists[c] = block;
  pool->pooled_bytes += block->capacity;
  pool->live_bytes -= block->capacity;
  /* Over the limit: free blocks known to be idle, largest first (fewest
   * frees to get back under it). */
  for (int k = KILN__POOL_CLASSES - 1; k >= 0 && pool->pooled_bytes > pool->limit; k--) {
    kiln__pool_block_t **link = &pool->free_lists[k];
    while (*link && pool->pooled_bytes > pool->limit) {
      kiln__pool_block_t *b = *link;
      if (pool->idle(device, b->queue_id, b->stamp)) {
        *link = b->next;
        pool->pooled_bytes -= b->capacity;
        b->next = chain;
        chain = b;
      } else {
        link = &b->next;
      }
    }
  }
  const uint64_t in_use = pool->live_bytes, pooled = pool->pooled_bytes;
  pthread_mutex_unlock(&pool->lock);
  blocks_free(device, chain);
  if (KILN__TRACE_ON()) kiln__trace_memory(device, in_use, pooled);
}
