/* tests/stub_backend.c: a test-only backend plugin on host memory with synchronous queues; it counts its calls. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/backend.h"

/* Built three ways (tests/meson.build): as is; with -DKILN_STUB_BAD_ABI, so
 * that the core must refuse it; with -DKILN_STUB_NEEDS_MISSING, linked against
 * a library whose file does not exist, so that dlopen itself fails. */
#ifdef KILN_STUB_NEEDS_MISSING
int kiln_test_missing_dep_value(void);
#endif

#ifdef KILN_STUB_BAD_ABI
#define KILN_STUB_ABI 999u
#else
#define KILN_STUB_ABI KILN_BACKEND_ABI_VERSION
#endif

/* Call counters by slot name, read by tests through kiln_stub_calls(). */
#define KILN_STUB_SLOTS(X)                                                                         \
  X(initialize) X(deinitialize) X(device_describe) X(buffer_allocate) X(buffer_free) X(queue_create) \
  X(queue_destroy) X(queue_finish) X(queue_record) X(queue_wait) X(event_wait) X(buffer_write)      \
  X(buffer_read) X(buffer_copy) X(buffer_fill) X(op_run)

enum {
#define KILN_STUB_ENUM_(slot) KILN_STUB_##slot,
  KILN_STUB_SLOTS(KILN_STUB_ENUM_)
#undef KILN_STUB_ENUM_
  KILN_STUB_SLOT_COUNT
};

static const char *const kiln_stub_slot_names[KILN_STUB_SLOT_COUNT] = {
#define KILN_STUB_NAME_(slot) #slot,
    KILN_STUB_SLOTS(KILN_STUB_NAME_)
#undef KILN_STUB_NAME_
};

static _Atomic unsigned long kiln_stub_counts[KILN_STUB_SLOT_COUNT];

#define KILN_STUB_COUNT(slot) atomic_fetch_add(&kiln_stub_counts[KILN_STUB_##slot], 1)

/* How often `slot` was called since the plugin was loaded; -1 for an unknown
 * slot name. Tests dlopen this file again and look this function up. */
KILN_PLUGIN_EXPORT long kiln_stub_calls(const char *slot);
KILN_PLUGIN_EXPORT long kiln_stub_calls(const char *slot) {
  for (int i = 0; i < KILN_STUB_SLOT_COUNT; i++)
    if (slot && !strcmp(kiln_stub_slot_names[i], slot)) return (long)atomic_load(&kiln_stub_counts[i]);
  return -1;
}

struct kiln_backend_device_t {
  int unused;
};
struct kiln_backend_buffer_t {
  size_t size;
  unsigned char *data;
};
struct kiln_backend_queue_t {
  int unused;
};
struct kiln_backend_event_t {
  double ms;
};

static struct kiln_backend_device_t kiln_stub_device;
static const kiln_host_t *kiln_stub_host;

/* The stub keeps its state in the process (tests read the counters across
 * starts); its context is only a token the core hands back. */
struct kiln_backend_context_t {
  int unused;
};
static struct kiln_backend_context_t kiln_stub_context;

static kiln_status_t kiln_stub_initialize(const kiln_host_t *host, kiln_backend_context_t **out_ctx) {
  KILN_STUB_COUNT(initialize);
  *out_ctx = &kiln_stub_context;
  kiln_stub_host = host;
#ifdef KILN_STUB_NEEDS_MISSING
  /* Never reached in practice: the loader refuses the plugin first. */
  if (kiln_test_missing_dep_value() != 42)
    return host->set_error(KILN_UNAVAILABLE, "the stub's dependency returned a wrong value");
#endif
  return KILN_OK;
}

static void kiln_stub_deinitialize(kiln_backend_context_t *ctx) {
  KILN_STUB_COUNT(deinitialize);
  kiln_stub_host = NULL;
}

static size_t kiln_stub_device_count(kiln_backend_context_t *ctx) { return 1; }

static kiln_status_t kiln_stub_device_describe(kiln_backend_context_t *ctx, size_t index, kiln_backend_device_desc_t *out_desc) {
  KILN_STUB_COUNT(device_describe);
  memset(out_desc, 0, sizeof *out_desc);
  out_desc->impl = &kiln_stub_device;
  out_desc->type = KILN_DEVICE_ACCELERATOR;
  strcpy(out_desc->name, "kiln stub device");
  strcpy(out_desc->vendor, "kiln");
  strcpy(out_desc->driver_version, "1");
  strcpy(out_desc->uuid, "stub-0000");
  out_desc->memory_bytes = 1ull << 30;
  out_desc->max_alloc_bytes = 1ull << 30;
  out_desc->compute_units = 1;
  out_desc->max_work_group_size = 1;
  out_desc->memory_free_is_estimate = true;
  out_desc->property_count = 1;
  strcpy(out_desc->properties[0].key, "stub_note");
  strcpy(out_desc->properties[0].value, "test backend on host memory");
  return KILN_OK;
}

static kiln_status_t kiln_stub_buffer_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                               kiln_backend_buffer_t **out_buffer) {
  KILN_STUB_COUNT(buffer_allocate);
  kiln_backend_buffer_t *b = calloc(1, sizeof *b);
  unsigned char *data = malloc(size ? size : 1);
  if (!b || !data) {
    free(b);
    free(data);
    return kiln_stub_host->set_error(KILN_OUT_OF_MEMORY, "stub: cannot allocate %zu bytes", size);
  }
  b->size = size;
  b->data = data;
  *out_buffer = b;
  return KILN_OK;
}

static void kiln_stub_buffer_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_buffer_t *buffer) {
  KILN_STUB_COUNT(buffer_free);
  free(buffer->data);
  free(buffer);
}

static kiln_status_t kiln_stub_queue_create(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_queue_t **out_queue) {
  KILN_STUB_COUNT(queue_create);
  kiln_backend_queue_t *q = calloc(1, sizeof *q);
  if (!q) return kiln_stub_host->set_error(KILN_OUT_OF_MEMORY, "stub: cannot allocate a queue");
  *out_queue = q;
  return KILN_OK;
}

static void kiln_stub_queue_destroy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  KILN_STUB_COUNT(queue_destroy);
  free(queue);
}

/* Work runs synchronously, so every queue is always finished. */
static kiln_status_t kiln_stub_queue_finish(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  KILN_STUB_COUNT(queue_finish);
  return KILN_OK;
}

static kiln_status_t kiln_stub_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_event_t **out_event) {
  KILN_STUB_COUNT(queue_record);
  kiln_backend_event_t *e = calloc(1, sizeof *e);
  if (!e) return kiln_stub_host->set_error(KILN_OUT_OF_MEMORY, "stub: cannot allocate an event");
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  e->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
  *out_event = e;
  return KILN_OK;
}

static kiln_status_t kiln_stub_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_event_t *event) {
  KILN_STUB_COUNT(queue_wait);
  return KILN_OK;
}

static kiln_status_t kiln_stub_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  KILN_STUB_COUNT(event_wait);
  return KILN_OK;
}

static kiln_status_t kiln_stub_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event) { return KILN_OK; }

static kiln_status_t kiln_stub_event_elapsed(kiln_backend_context_t *ctx, kiln_backend_event_t *start, kiln_backend_event_t *end,
                                             double *out_ms) {
  *out_ms = end->ms - start->ms;
  return KILN_OK;
}

static void kiln_stub_event_release(kiln_backend_context_t *ctx, kiln_backend_event_t *event) { free(event); }

static kiln_status_t kiln_stub_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                            const void *host, size_t size, bool blocking) {
  KILN_STUB_COUNT(buffer_write);
  if (size) memcpy(buffer->data + offset, host, size);
  return KILN_OK;
}

static kiln_status_t kiln_stub_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                           void *host, size_t size, bool blocking) {
  KILN_STUB_COUNT(buffer_read);
  if (size) memcpy(host, buffer->data + offset, size);
  return KILN_OK;
}

static kiln_status_t kiln_stub_buffer_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *src, size_t src_offset,
                                           kiln_backend_buffer_t *dst, size_t dst_offset, size_t size) {
  KILN_STUB_COUNT(buffer_copy);
  if (size) memmove(dst->data + dst_offset, src->data + src_offset, size);
  return KILN_OK;
}

static kiln_status_t kiln_stub_buffer_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer, size_t offset,
                                           size_t size, const void *pattern, size_t pattern_size) {
  KILN_STUB_COUNT(buffer_fill);
  for (size_t i = 0; i < size; i += pattern_size) memcpy(buffer->data + offset + i, pattern, pattern_size);
  return KILN_OK;
}

/* The stub runs FILL and COPY natively and has no other op, which the core
 * must report rather than guess. */
static kiln_status_t kiln_stub_op_run(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                      const kiln_op_entry_t *entry, const kiln_op_t *op) {
  KILN_STUB_COUNT(op_run);
  const kiln_view_t *out = &op->out;
  int64_t n = kiln_backend_view_numel(out);
  /* f32 and i32 are both four bytes, so one element loop serves both. */
  unsigned char *dst = out->buffer->data + out->offset * 4;
  if (op->kind == KILN_OP_FILL) {
    for (int64_t i = 0; i < n; i++) {
      if (out->dtype == KILN_F32) memcpy(dst + i * 4, &op->u.fill.value.f32, 4);
      else memcpy(dst + i * 4, &op->u.fill.value.i32, 4);
    }
    return KILN_OK;
  }
  const kiln_view_t *in = &op->in[0];
  int64_t index[KILN_MAX_DIMS] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t src = (int64_t)in->offset;
    for (int d = 0; d < in->ndim; d++) src += index[d] * in->strides[d];
    memcpy(dst + i * 4, in->buffer->data + src * 4, 4);
    for (int d = out->ndim - 1; d >= 0; d--) {
      if (++index[d] < out->shape[d]) break;
      index[d] = 0;
    }
  }
  return KILN_OK;
}

static const kiln_op_entry_t kiln_stub_ops[] = {
    {KILN_OP_FILL, "native", NULL, kiln_stub_op_run, NULL},
    {KILN_OP_COPY, "native", NULL, kiln_stub_op_run, NULL},
    KILN_OP_TABLE_END,
};

static const kiln_backend_iface_t kiln_stub_iface = {
    .abi_version = KILN_STUB_ABI,
    .size = sizeof(kiln_backend_iface_t),
    .name = "stub",
    .version = "stub 1.0",
    .initialize = kiln_stub_initialize,
    .deinitialize = kiln_stub_deinitialize,
    .device_count = kiln_stub_device_count,
    .device_describe = kiln_stub_device_describe,
    .buffer_allocate = kiln_stub_buffer_allocate,
    .buffer_free = kiln_stub_buffer_free,
    .queue_create = kiln_stub_queue_create,
    .queue_destroy = kiln_stub_queue_destroy,
    .queue_finish = kiln_stub_queue_finish,
    .queue_record = kiln_stub_queue_record,
    .queue_wait = kiln_stub_queue_wait,
    .event_wait = kiln_stub_event_wait,
    .event_query = kiln_stub_event_query,
    .event_elapsed = kiln_stub_event_elapsed,
    .event_release = kiln_stub_event_release,
    .buffer_write = kiln_stub_buffer_write,
    .buffer_read = kiln_stub_buffer_read,
    .buffer_copy = kiln_stub_buffer_copy,
    .buffer_fill = kiln_stub_buffer_fill,
    .ops = kiln_stub_ops,
};

KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void);
KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void) { return &kiln_stub_iface; }
