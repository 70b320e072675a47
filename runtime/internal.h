/* runtime/internal.h: the core's own types and the functions its modules share; never installed. */
#ifndef KILN_RUNTIME_INTERNAL_H
#define KILN_RUNTIME_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "kiln/kiln.h"
#include "runtime/backend.h"

/* Limits that bound fixed-size tables. */
#define KILN_MAX_DEVICES 64
#define KILN_MAX_BACKENDS 8

/* ---- status.c: errors -------------------------------------------------------- */

/* Set the calling thread's message (printf-style) and status; returns status. */
kiln_status_t kiln__set_error(kiln_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the current message with "context: " (keeps the status). Returns it. */
kiln_status_t kiln__wrap_error(kiln_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- log.c ------------------------------------------------------------------ */

void kiln__log(kiln_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Cheap check before formatting a debug message on a hot path. */
static inline bool kiln__log_enabled(kiln_log_level_t level) {
  extern _Atomic int kiln__log_level_value;
  return (int)level <= atomic_load_explicit(&kiln__log_level_value, memory_order_relaxed);
}

/* ---- config.c: the settings, parsed in one place ------------------------------ */

#define KILN_PROVIDER_NONE (-1)

typedef struct kiln__config_t {
  char backends[KILN_MAX_BACKENDS][32]; /* KILN_BACKEND, in priority order */
  size_t backend_count;
  bool backends_explicit;               /* set by the user: a failed load is an error */
  char *device_selector;                /* KILN_DEVICE, NULL when unset (malloc'ed) */
  kiln_policy_t policy;
  int overrides[KILN_OP_COUNT];         /* kiln_provider_t or KILN_PROVIDER_NONE */
  char *cache_dir;                      /* resolved; NULL when none (malloc'ed) */
  char *backend_path;                   /* KILN_BACKEND_PATH, NULL when unset (malloc'ed) */
  kiln_log_level_t log_level;
  int cpu_devices;                      /* >= 1 */
} kiln__config_t;

/* Merge an optional API config with the environment, validate every field.
 * KILN_INVALID_ARGUMENT with a message quoting the bad value and the grammar. */
kiln_status_t kiln__config_load(const kiln_config_t *api, kiln__config_t *out);
void kiln__config_free(kiln__config_t *config);
/* "matmul=blas,conv2d=native" -> overrides[]; op names are KILN_OP_KINDS
 * names plus every unary/binary op name (mapped to UNARY/BINARY). */
kiln_status_t kiln__parse_providers(const char *text, int out_overrides[KILN_OP_COUNT]);

const char *kiln__provider_name(kiln_provider_t provider);
const char *kiln__op_kind_name(kiln_op_kind_t kind);
/* The kind an op name of KILN_PROVIDER stands for ("matmul", "add" -> BINARY),
 * or -1 for an unknown name; kiln_device_providers accepts the same names. */
int kiln__op_kind_lookup(const char *name);

/* ---- selector.c: the KILN_DEVICE grammar ------------------------------------- */

typedef struct kiln__selector_term_t {
  bool discard;          /* "!term" */
  char backend[32];      /* "*" or a backend name */
  enum { KILN__SEL_ALL, KILN__SEL_TYPE, KILN__SEL_INDEX } kind;
  kiln_device_type_t type; /* KILN__SEL_TYPE */
  uint32_t index;          /* KILN__SEL_INDEX: the backend's own device index */
} kiln__selector_term_t;

typedef struct kiln__selector_t {
  kiln__selector_term_t terms[32];
  size_t count;
} kiln__selector_t;

/* Parse "opencl:gpu;!cuda:1". KILN_INVALID_ARGUMENT naming the bad term and
 * showing the grammar. */
kiln_status_t kiln__selector_parse(const char *text, kiln__selector_t *out);
/* Whether a device (backend name, type, backend index) passes the selector:
 * discards always win; a selector of only discards accepts the rest. */
bool kiln__selector_accepts(const kiln__selector_t *selector, const char *backend,
                            kiln_device_type_t type, uint32_t backend_index);

/* ---- the core's objects ------------------------------------------------------ */

typedef struct kiln__backend_t {
  const kiln_backend_iface_t *iface; /* NULL when it did not load */
  kiln_backend_info_t info;          /* strings point into the fields below */
  char name[32];
  char reason[1024];
  char path[1024];
  void *dl_handle;                   /* never dlclose'd: plugin threads may outlive us */
} kiln__backend_t;

/* Per-device memory pool (buffer.c). Blocks are tagged with the queue they
 * were last used on; a block is reused by an allocation on the same queue at
 * once (the queue is in order), by any other queue only after that queue
 * finished. */
typedef struct kiln__pool_block_t {
  struct kiln__pool_block_t *next;
  kiln_backend_buffer_t *impl;
  size_t capacity;
  uint64_t queue_id;
} kiln__pool_block_t;

typedef struct kiln__pool_t {
  pthread_mutex_t lock;
  kiln__pool_block_t *free_lists[48]; /* by size class */
  size_t pooled_bytes;
  size_t live_bytes;
} kiln__pool_t;

struct kiln_device_t {
  kiln__backend_t *backend;
  const kiln_backend_iface_t *iface;
  kiln_backend_device_t *impl;
  kiln_backend_device_desc_t desc;
  uint32_t index;         /* visible index */
  uint32_t backend_index; /* index within its backend */
  bool is_default;
  char selector[48];      /* "cpu:0" */
  char display_name[320]; /* "cpu:0 (AMD EPYC)" */
  char providers_text[KILN_OP_COUNT][64]; /* "native,blas" per op kind, f32 */
  uint32_t provider_mask[KILN_OP_COUNT][2]; /* by op kind, [f32, i32] */
  kiln_queue_t *default_queue;
  kiln__pool_t pool;
};

struct kiln_queue_t {
  atomic_int refs;
  kiln_device_t *device;
  kiln_backend_queue_t *impl;
  uint64_t id; /* unique per process, never 0 */
};

struct kiln_event_t {
  atomic_int refs;
  kiln_device_t *device;
  uint64_t queue_id;
  kiln_backend_event_t *impl;
};

struct kiln_buffer_t {
  atomic_int refs;
  kiln_device_t *device;
  kiln_backend_buffer_t *impl;
  size_t size;
  size_t capacity;              /* the pool block's size */
  _Atomic uint64_t last_queue;  /* id of the last queue that used it */
  atomic_bool multi_queue;      /* used by more than one queue */
};

struct kiln_tensor_t {
  atomic_int refs;
  kiln_buffer_t *buffer;
  size_t offset; /* elements */
  kiln_dtype_t dtype;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t strides[KILN_MAX_DIMS];
};

/* ---- runtime.c / registry.c: the process-wide state ------------------------- */

typedef struct kiln__runtime_t {
  kiln__config_t config;
  kiln__backend_t backends[KILN_MAX_BACKENDS];
  size_t backend_count;
  kiln_device_t *devices[KILN_MAX_DEVICES]; /* visible devices in order */
  size_t device_count;
  kiln_device_t *default_device;
  kiln_host_t host;
  _Atomic int policy; /* kiln_policy_t, changeable at run time */
  _Atomic int overrides[KILN_OP_COUNT];
} kiln__runtime_t;

extern kiln__runtime_t kiln__rt;

/* Start kiln from the environment if needed; the start's status afterwards.
 * Cheap after the first call (one atomic load). Sets the thread's message on
 * failure every time it is called. */
kiln_status_t kiln__ensure(void);

/* registry.c: load the backends of config, enumerate their devices, apply
 * KILN_DEVICE, order, pick the default. */
kiln_status_t kiln__registry_load(kiln__runtime_t *rt);
void kiln__registry_unload(kiln__runtime_t *rt);
/* Make the backend `name` (not "cpu") come from `entry`, a backend compiled
 * into the program, instead of the plugin libkiln-<name>.so; takes effect at
 * the next start. Not thread-safe: call before kiln starts. Tests use it to
 * drive the registry with backends of their own. */
kiln_status_t kiln__registry_add_builtin(const char *name, kiln_backend_entry_fn entry);

/* Device attach/detach (queue.c, buffer.c): the default queue and the pool. */
kiln_status_t kiln__device_attach(kiln_device_t *device);
void kiln__device_detach(kiln_device_t *device);

/* ---- cache.c: blobs and tuning results on disk -------------------------------- */

kiln_status_t kiln__cache_load(const char *key, void **out_data, size_t *out_size);
void kiln__cache_store(const char *key, const void *data, size_t size);
/* The winner of `fastest` for a key "device-identity|op|dtype|shape";
 * KILN_NOT_FOUND when not measured yet, without touching the thread's last
 * error (a miss is ordinary). Loaded from disk on first use; a corrupt file
 * is ignored (counted) and rewritten by the next store. */
kiln_status_t kiln__tuning_lookup(const char *key, kiln_provider_t *out_provider);
void kiln__tuning_store(const char *key, kiln_provider_t provider);
void kiln__cache_reset(void); /* on deinitialize */

/* ---- buffer.c ---------------------------------------------------------------- */

/* Allocate from the pool for use on `queue` (NULL: the device's default). */
kiln_status_t kiln__buffer_create(kiln_device_t *device, kiln_queue_t *queue, size_t size,
                                  kiln_buffer_t **out_buffer);
/* Note that `queue` enqueued work on the buffer (cheap; for the pool's tags). */
static inline void kiln__buffer_touch(kiln_buffer_t *buffer, const kiln_queue_t *queue) {
  uint64_t prev = atomic_exchange_explicit(&buffer->last_queue, queue->id, memory_order_relaxed);
  if (prev != queue->id && prev != 0)
    atomic_store_explicit(&buffer->multi_queue, true, memory_order_relaxed);
}
/* Free every pooled block of the device (after finishing its queues). */
void kiln__pool_trim(kiln_device_t *device);
/* A buffer from idle pool blocks only (no pending work of any queue), so the
 * caller may use it on any queue: kiln_buffer_create and kiln_tensor_empty. */
kiln_status_t kiln__buffer_create_idle(kiln_device_t *device, size_t size, kiln_buffer_t **out_buffer);

/* ---- queue.c ----------------------------------------------------------------- */

/* Make `queue` wait for each event (same backend: queue_wait; another
 * backend: the caller blocks on it here). */
kiln_status_t kiln__queue_wait_list(kiln_queue_t *queue, uint32_t count,
                                    kiln_event_t *const *events);
/* Record an event into *out_event when out_event is non-NULL. */
kiln_status_t kiln__queue_record_out(kiln_queue_t *queue, kiln_event_t **out_event);
/* Finish every queue of the device that kiln knows of. */
kiln_status_t kiln__device_finish_all(kiln_device_t *device);
/* The pool's clock: a process-wide counter, one tick per call. */
uint64_t kiln__queue_stamp(void);
/* Whether the queue `queue_id` of `device` finished everything enqueued on it
 * before `stamp` (true too when that queue no longer exists). */
bool kiln__queue_done_since(kiln_device_t *device, uint64_t queue_id, uint64_t stamp);
/* Note that everything enqueued on `queue` before `stamp` is done (after a
 * finish or a blocking transfer). */
void kiln__queue_mark_done(kiln_queue_t *queue, uint64_t stamp);
/* The device's list of live queues and its default queue (buffer.c's
 * kiln__device_attach/detach call these). */
kiln_status_t kiln__queues_attach(kiln_device_t *device);
void kiln__queues_detach(kiln_device_t *device);

/* ---- tensor.c ------------------------------------------------------------------ */

/* A new contiguous tensor (uninitialised) on device for `queue`. */
kiln_status_t kiln__tensor_alloc(kiln_device_t *device, kiln_queue_t *queue, kiln_dtype_t dtype,
                                 int ndim, const int64_t *shape, kiln_tensor_t **out);
/* Fill a kiln_view_t from a tensor. */
void kiln__tensor_view(const kiln_tensor_t *tensor, kiln_view_t *out_view);
/* Validate ndim/shape and compute numel and bytes without overflow. */
kiln_status_t kiln__shape_check(const char *call, int ndim, const int64_t *shape, kiln_dtype_t dtype,
                                int64_t *out_numel, size_t *out_bytes);

/* ---- dispatch.c ----------------------------------------------------------------- */

/* Choose the provider for `op` on `queue`'s device (policy, overrides,
 * `fastest` measurements), enqueue it, fall back to NATIVE when a provider
 * answers KILN_UNSUPPORTED, and note the provider for kiln_last_provider(). */
kiln_status_t kiln__dispatch(kiln_queue_t *queue, kiln_op_t *op);
/* Forget the `fastest` measurements held in memory (on device detach). */
void kiln__dispatch_reset(void);
/* Force one provider (a kiln_provider_t) for the calling thread's operations,
 * whatever the policy; KILN_PROVIDER_NONE ends it. kiln_device_check computes
 * its reference this way. */
void kiln__dispatch_force(int provider);

#endif /* KILN_RUNTIME_INTERNAL_H */
