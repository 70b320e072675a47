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

/* Backends KILN_BACKEND may name at once. */
#define KILN_MAX_BACKENDS 8
/* KILN_CPU_DEVICES at most. */
#define KILN_MAX_CPU_DEVICES 64

/* ---- status.c: errors -------------------------------------------------------- */

/* Set the calling thread's message (printf-style) and status; returns status. */
kiln_status_t kiln__set_error(kiln_status_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current message with "context: " (keeps the status). Returns it. */
kiln_status_t kiln__wrap_error(kiln_status_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- log.c ------------------------------------------------------------------ */

void kiln__log(kiln_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Cheap check before formatting a debug message on a hot path. */
static inline bool kiln__log_enabled(kiln_log_level_t level) {
  extern _Atomic int kiln__log_level_value;
  return (int)level <= atomic_load_explicit(&kiln__log_level_value, memory_order_relaxed);
}

/* ---- size arithmetic ------------------------------------------------------------ */

/* a * b for sizes (a, b >= 0), saturating at INT64_MAX instead of overflowing:
 * the extents of an empty tensor may be huge, and only the product's size
 * checks (kiln__shape_check) may say no. */
static inline int64_t kiln__mul_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

/* The element count of a shape: 0 when any extent is 0 (whatever the others),
 * saturating at INT64_MAX. */
static inline int64_t kiln__numel(int ndim, const int64_t *shape) {
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n = kiln__mul_sat(n, shape[i]);
  return n;
}

/* ---- reference counting, written once for every shared object ---------------- */

/* Defines kiln_<name>_retain and kiln_<name>_release for a struct with an
 * `atomic_int refs` member: release(NULL) is a no-op and the last release
 * calls `destroy(object)`. */
#define KILN__DEFINE_REFCOUNT(type, name, destroy)                                      \
  type *kiln_##name##_retain(type *object) {                                            \
    if (object) atomic_fetch_add_explicit(&object->refs, 1, memory_order_relaxed);      \
    return object;                                                                      \
  }                                                                                     \
  void kiln_##name##_release(type *object) {                                            \
    if (object && atomic_fetch_sub_explicit(&object->refs, 1, memory_order_acq_rel) == 1) \
      destroy(object);                                                                  \
  }

/* ---- providers.c: provider names, interned ------------------------------------ */

/* Providers are names (backend.h); the core interns them to small ids so that
 * the hot path compares integers. Ids live for the whole process. */
#define KILN_PROVIDER_NONE (-1)
#define KILN__PROVIDER_NATIVE 0
#define KILN__MAX_PROVIDERS 32

/* The id of `name`, added when new ([a-z0-9_]+, at most 31 characters);
 * KILN_PROVIDER_NONE when the name is malformed or the table is full. */
int kiln__provider_intern(const char *name);
/* The id of a name known so far (the names backend.h lists and those of the
 * backends loaded since the process started), or KILN_PROVIDER_NONE. */
int kiln__provider_find(const char *name);
/* The name of an id, "unknown" for anything else. Static storage. */
const char *kiln__provider_name(int id);
/* "native, blas, ..." for messages. */
void kiln__provider_list(char *out, size_t size);

/* ---- config.c: the settings, parsed in one place ------------------------------ */

typedef struct kiln__config_t {
  char backends[KILN_MAX_BACKENDS][32]; /* KILN_BACKEND, in priority order */
  size_t backend_count;
  bool backends_explicit;               /* set by the user: a failed load is an error */
  char *device_selector;                /* KILN_DEVICE, NULL when unset (malloc'ed) */
  kiln_policy_t policy;
  int overrides[KILN_OP_COUNT];         /* provider id or KILN_PROVIDER_NONE */
  char *cache_dir;                      /* resolved; NULL when none (malloc'ed) */
  char *backend_path;                   /* KILN_BACKEND_PATH, NULL when unset (malloc'ed) */
  kiln_log_level_t log_level;
  bool log_level_set;                   /* KILN_LOG was given (off included) */
  int cpu_devices;                      /* >= 1 */
  char cpu_devices_text[16];            /* the same, as the host table's setting() gives it */
  char *trace_path;                     /* KILN_TRACE, NULL when unset (malloc'ed) */
  size_t trace_events;                  /* KILN_TRACE_EVENTS: the trace's ring, in records */
} kiln__config_t;

/* Merge an optional API config with the environment, validate every field.
 * KILN_INVALID_ARGUMENT with a message quoting the bad value and the grammar. */
kiln_status_t kiln__config_load(const kiln_config_t *api, kiln__config_t *out);
void kiln__config_free(kiln__config_t *config);
/* At warn: every KILN_* variable of the environment that kiln does not read
 * (a misspelling such as KILN_DEVICES), with the closest name it reads. */
void kiln__config_warn_unknown(void);
/* "matmul=blas,conv2d=native" -> overrides[] of provider ids; op names are
 * KILN_OP_KINDS names plus every unary/binary op name (mapped to
 * UNARY/BINARY); provider names must be known (kiln__provider_find). */
kiln_status_t kiln__parse_providers(const char *text, int out_overrides[KILN_OP_COUNT]);

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
/* The same, and every backend a term names must be one of `known`, names
 * joined by ',' ("cuda,opencl,cpu"; NULL accepts any): KILN_DEVICE's check. */
kiln_status_t kiln__selector_parse_known(const char *text, const char *known, kiln__selector_t *out);
/* Whether a device (backend name, type, backend index) passes the selector:
 * discards always win; a selector of only discards accepts the rest. */
bool kiln__selector_accepts(const kiln__selector_t *selector, const char *backend, kiln_device_type_t type,
                            uint32_t backend_index);

/* ---- the core's objects ------------------------------------------------------ */

typedef struct kiln__backend_t {
  kiln_backend_iface_t iface;        /* the backend's table at the core's size, defaults filled in */
  bool loaded;                       /* iface is usable */
  kiln_backend_context_t *ctx;       /* what initialize returned */
  kiln_backend_info_t info;          /* strings point into the fields below */
  char name[32];
  char reason[1024];
  char path[1024];
  void *dl_handle;                   /* never dlclose'd: plugin threads may outlive us */
} kiln__backend_t;

struct kiln_buffer_t {
  atomic_int refs;
  kiln_device_t *device;
  kiln_backend_buffer_t *impl;
  size_t size;
  size_t capacity;              /* the pool block's size */
  _Atomic uint64_t last_queue;  /* id of the last queue that used it */
  atomic_bool multi_queue;      /* used by more than one queue */
  /* Memory of another framework (a DLPack import): not pooled; when the last
   * reference goes, the backend's record is freed and release(owner) runs. */
  void (*release)(void *owner);
  void *owner;
  bool read_only; /* imported read-only: updates refuse to write it */
};

/* pool.c: a device's memory pool. Blocks are tagged with the queue they were
 * last used on; a block is reused by an allocation on the same queue at once
 * (the queue is in order), by any other queue only after that queue finished. */
typedef struct kiln__pool_block_t {
  struct kiln__pool_block_t *next;
  kiln_backend_buffer_t *impl;
  size_t capacity;
  uint64_t queue_id;
  uint64_t stamp; /* kiln__queue_stamp() when it was released */
  /* The buffer object travels with its block, so that reusing a pooled block
   * allocates nothing at all (buffer.c owns it). */
  kiln_buffer_t buffer;
} kiln__pool_block_t;

#define KILN__POOL_CLASSES 48

typedef struct kiln__pool_t {
  pthread_mutex_t lock;
  kiln__pool_block_t *free_lists[KILN__POOL_CLASSES]; /* by size class */
  size_t pooled_bytes;  /* held for reuse */
  size_t live_bytes;    /* in buffers in use */
  size_t peak_bytes;    /* the most live_bytes has been (since start or a reset) */
  uint64_t allocations; /* buffer_allocate calls that succeeded (pool misses) */
  size_t limit;         /* pooled bytes kept at most */
  /* Whether work that queue `queue_id` had enqueued before `stamp` is done:
   * the pool asks, it never calls the queues itself (kiln__pool_init). */
  bool (*idle)(kiln_device_t *device, uint64_t queue_id, uint64_t stamp);
} kiln__pool_t;

/* queue.c: the live queues of a device. */
typedef struct kiln__queue_list_t {
  pthread_mutex_t lock;
  struct kiln__queue_node_t *head;
} kiln__queue_list_t;

/* One row of a device's op table (device.c builds them at attach). */
typedef struct kiln__op_row_t {
  const kiln_op_entry_t *entry;
  int provider;          /* interned id of entry->provider */
  atomic_bool disabled;  /* the row answered KILN_UNAVAILABLE: offered no more */
} kiln__op_row_t;

struct kiln_device_t {
  kiln__backend_t *backend;
  const kiln_backend_iface_t *iface; /* &backend->iface */
  kiln_backend_context_t *ctx;       /* backend->ctx */
  kiln_backend_device_t *impl;
  kiln_backend_device_desc_t desc;
  uint32_t index;         /* visible index */
  uint32_t backend_index; /* index within its backend */
  uint64_t serial;        /* unique in the process: stale per-thread state never matches a new device */
  bool is_default;
  char selector[48];      /* "cpu:0" */
  char display_name[320]; /* "cpu:0 (AMD EPYC)" */
  /* The op table: rows of each kind offered on this device, native first. */
  kiln__op_row_t *rows[KILN_OP_COUNT];
  uint32_t row_count[KILN_OP_COUNT];
  char providers_text[KILN_OP_COUNT][96]; /* "native,blas" */
  _Atomic uint32_t override_warned;       /* a bit per kind: the missing-provider warning was given */
  uint32_t dtypes_served;                 /* a bit per kiln_dtype_t the backend has kernels for, asked once */
  kiln_queue_t *default_queue;
  kiln__queue_list_t queues;
  kiln__pool_t pool;
};

/* Back-pressure (queue.h): at most KILN__QUEUE_DEPTH operations enqueued on a
 * queue and not known complete. Every KILN__QUEUE_CHECKPOINT-th operation
 * records a checkpoint event; when KILN__QUEUE_DEPTH / KILN__QUEUE_CHECKPOINT
 * are outstanding, the enqueuer waits for the oldest. 2048 is twice the CPU
 * backend's own ring (1024 commands), so that there the ring binds first and
 * a checkpoint is already reached when it is waited for (the enqueuer never
 * sleeps twice), and past where a CUDA stream blocks its launches (about
 * 1024): milliseconds of tiny kernels, far more than hides the cost of
 * enqueueing, and a few MB of driver records at most (PoCL keeps ~1.5-2 KB
 * per command). */
#define KILN__QUEUE_DEPTH 2048u
#define KILN__QUEUE_CHECKPOINT 256u
#define KILN__QUEUE_CHECKPOINTS (KILN__QUEUE_DEPTH / KILN__QUEUE_CHECKPOINT)

typedef struct kiln__check_t kiln__check_t;

struct kiln_queue_t {
  atomic_int refs;
  kiln_device_t *device;
  kiln_backend_queue_t *impl;
  uint64_t id; /* unique per process, never 0 */
  /* Checks the device made for ops enqueued here, newest first (checks.c). */
  _Atomic(kiln__check_t *) checks;
  _Atomic uint64_t enqueued;  /* operations enqueued, ever */
  _Atomic uint64_t completed; /* the first `completed` of them are known complete */
};

struct kiln_event_t {
  atomic_int refs;
  kiln_device_t *device;
  uint64_t queue_id;
  kiln_backend_event_t *impl;
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

/* ---- state.c: the process-wide state (a leaf: started and stopped by runtime.c,
 * filled by registry.c, read everywhere) ------------------------------------- */

typedef struct kiln__runtime_t {
  kiln__config_t config;
  kiln__backend_t backends[KILN_MAX_BACKENDS];
  size_t backend_count;
  kiln_device_t **devices; /* visible devices in order (malloc'ed) */
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
 * KILN_DEVICE, order, pick the default, attach every device. */
kiln_status_t kiln__registry_load(kiln__runtime_t *rt);
void kiln__registry_unload(kiln__runtime_t *rt);
/* Make the backend `name` come from `entry`, a backend compiled into the
 * program, instead of a plugin (or a built-in backend of that name); takes
 * effect at the next start. Not thread-safe: call before kiln starts. Tests
 * use it to drive the registry with backends of their own. */
kiln_status_t kiln__registry_add_builtin(const char *name, kiln_backend_entry_fn entry);

/* device.c: bring a described device to life (its op table, memory pool,
 * queues), and back. */
kiln_status_t kiln__device_attach(kiln_device_t *device);
void kiln__device_detach(kiln_device_t *device);

/* ---- cache.c: blobs and tuning results on disk -------------------------------- */

kiln_status_t kiln__cache_load(const char *key, void **out_data, size_t *out_size);
void kiln__cache_store(const char *key, const void *data, size_t size);
void kiln__cache_evict(const char *key);
/* Remove temporaries whose writer died mid-store (bounded in time); at start. */
void kiln__cache_sweep(void);
/* The winner of `fastest` for a key "device-identity|op|dtype|shape": the
 * provider's name into out_provider; KILN_NOT_FOUND when not measured yet,
 * without touching the thread's last error (a miss is ordinary). Loaded from
 * disk on first use; a corrupt file is ignored (counted) and rewritten by the
 * next store. This is the one table of winners, in memory and on disk. */
kiln_status_t kiln__tuning_lookup(const char *key, char *out_provider, size_t size);
/* Remember a winner and why it won (one line of text, kept on disk). */
void kiln__tuning_store(const char *key, const char *provider, const char *reason);
void kiln__cache_reset(void); /* on deinitialize */

/* ---- pool.c: the memory pool --------------------------------------------------- */

/* `idle` answers whether a queue's work before a stamp is done
 * (kiln__queue_done_since): the pool's one view of the queues. */
void kiln__pool_init(kiln_device_t *device, bool (*idle)(kiln_device_t *device, uint64_t queue_id, uint64_t stamp));
/* Free every pooled block (the device's queues must be finished or gone). */
void kiln__pool_destroy(kiln_device_t *device);
/* Free every pooled block of the device; the caller finished its queues
 * first (kiln__device_finish_all), since queued work may still use them. */
void kiln__pool_trim(kiln_device_t *device);
/* A block of at least `size` bytes for `queue` (NULL: usable on any queue
 * at once): a pooled one that queue may use, else a new allocation, ordered
 * on `queue` where the backend can (buffer_allocate_on). *out_queue_id is
 * the queue the new memory is already tied to (0 for none).
 * KILN_OUT_OF_MEMORY when the device has no room: the caller may finish the
 * queues, trim and ask again. */
kiln_status_t kiln__pool_take(kiln_device_t *device, kiln_queue_t *queue, size_t size, kiln__pool_block_t **out_block,
                              uint64_t *out_queue_id);
/* Return a block last used by `queue_id` (0: idle now) up to `stamp`
 * (kiln__queue_stamp when it was released). */
void kiln__pool_put(kiln_device_t *device, kiln__pool_block_t *block, uint64_t queue_id, uint64_t stamp);

/* ---- buffer.c ---------------------------------------------------------------- */

/* Allocate from the pool for use on `queue` (NULL: the device's default). */
kiln_status_t kiln__buffer_create(kiln_device_t *device, kiln_queue_t *queue, size_t size, kiln_buffer_t **out_buffer);
/* A buffer from idle pool blocks only (no pending work of any queue), so the
 * caller may use it on any queue: kiln_buffer_create and kiln_tensor_empty. */
kiln_status_t kiln__buffer_create_idle(kiln_device_t *device, size_t size, kiln_buffer_t **out_buffer);
/* A buffer over memory kiln did not allocate: `handle` as the backend's
 * buffer_handle gives it, `size` bytes; release(owner) runs once kiln is done
 * with it (after the work that uses it). */
kiln_status_t kiln__buffer_wrap(kiln_device_t *device, void *handle, size_t size, void (*release)(void *owner),
                                void *owner, kiln_buffer_t **out_buffer);
/* KILN_OK when kiln may write `buffer`; KILN_INVALID_ARGUMENT, with a message
 * naming `name` (the caller's word for it) in `call`, when it is memory
 * imported read-only (DLPack's DLPACK_FLAG_BITMASK_READ_ONLY). The one check
 * of every writer: buffer write, fill and copy destination, and every update
 * in place. */
kiln_status_t kiln__buffer_check_writable(const char *call, const char *name, const kiln_buffer_t *buffer);
/* Wait for the work enqueued so far that uses the buffer. */
kiln_status_t kiln__buffer_settle(kiln_buffer_t *buffer);
/* Note that `queue` enqueued work on the buffer (cheap; for the pool's tags). */
static inline void kiln__buffer_touch(kiln_buffer_t *buffer, const kiln_queue_t *queue) {
  uint64_t prev = atomic_exchange_explicit(&buffer->last_queue, queue->id, memory_order_relaxed);
  if (prev != queue->id && prev != 0) atomic_store_explicit(&buffer->multi_queue, true, memory_order_relaxed);
}

/* ---- queue.c ----------------------------------------------------------------- */

/* The device's queue list and default queue, and back. */
kiln_status_t kiln__queues_attach(kiln_device_t *device);
void kiln__queues_detach(kiln_device_t *device);
/* Make `queue` wait for each event (same backend: queue_wait; another
 * backend: the caller blocks on it here). */
kiln_status_t kiln__queue_wait_list(kiln_queue_t *queue, uint32_t count, kiln_event_t *const *events);
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
/* Record a checkpoint after operation `count` and, when KILN__QUEUE_DEPTH
 * operations may be outstanding, wait for the oldest checkpoint
 * (kiln__queue_count_op's slow path). */
void kiln__queue_checkpoint(kiln_queue_t *queue, uint64_t count);
/* Count one operation just enqueued on `queue` (a kernel, or a transfer that
 * did not block): one relaxed atomic add, and every KILN__QUEUE_CHECKPOINT-th
 * time a checkpoint, which may block until the queue is below its bound.
 * Never fails: an error of earlier work stays with the queue, for
 * kiln_queue_finish. */
static inline void kiln__queue_count_op(kiln_queue_t *queue) {
  const uint64_t n = atomic_fetch_add_explicit(&queue->enqueued, 1, memory_order_relaxed) + 1;
  if (n % KILN__QUEUE_CHECKPOINT == 0) kiln__queue_checkpoint(queue, n);
}
/* Operations enqueued on `queue` and not known complete: an upper bound on
 * those in flight, at most KILN__QUEUE_DEPTH (the unit suite checks it). */
uint64_t kiln__queue_in_flight(kiln_queue_t *queue);
/* Forget the calling thread's current queues (on deinitialize). */
void kiln__queue_forget_thread(void);

/* ---- checks.c: what only the device can check, reported at the next synchronisation ---- */

/* Remember that an op just enqueued on `queue` writes `report` (i32 [2]: a
 * position whose `what` is outside [low, limit), or -1, and the value
 * there). `report` is retained; `call` and `what` are static strings; `rule`
 * (copied) ends the message: what the values must be and what the op did. */
kiln_status_t kiln__check_add(kiln_queue_t *queue, kiln_tensor_t *report, const char *call, const char *what,
                              int64_t low, int64_t limit, const char *rule);
/* Read every pending check of `queue` (the work before them is complete:
 * called after a finish or a blocking read) and drop them.
 * KILN_INDEX_OUT_OF_RANGE naming the first fault, oldest op first. */
kiln_status_t kiln__checks_run(kiln_queue_t *queue);
/* Drop the pending checks unread (a queue being destroyed). */
void kiln__checks_drop(kiln_queue_t *queue);

/* ---- tensor.c (the object) and ops_tensor.c (creation, reads, copies, reshape) ---- */

/* A new contiguous tensor (uninitialised) on device for `queue` (NULL: any
 * queue may use it, so only idle memory will do). */
kiln_status_t kiln__tensor_alloc(kiln_device_t *device, kiln_queue_t *queue, kiln_dtype_t dtype, int ndim,
                                 const int64_t *shape, kiln_tensor_t **out);
/* A tensor over `buffer` (retained) from element `offset`, with these shape
 * and strides (in elements), which the caller checked fit the buffer. */
kiln_status_t kiln__tensor_over(kiln_buffer_t *buffer, size_t offset, kiln_dtype_t dtype, int ndim,
                                const int64_t *shape, const int64_t *strides, kiln_tensor_t **out);
/* Fill a kiln_view_t from a tensor. */
void kiln__tensor_view(const kiln_tensor_t *tensor, kiln_view_t *out_view);
/* A view sharing tensor's buffer, with these shape, strides and offset (in
 * elements), which the caller checked fit it. */
kiln_status_t kiln__tensor_view_new(const kiln_tensor_t *tensor, int ndim, const int64_t *shape, const int64_t *strides,
                                    size_t offset, kiln_tensor_t **out);
/* Row-major strides (elements) of a contiguous tensor of `shape`. */
void kiln__contiguous_strides(int ndim, const int64_t *shape, int64_t *out_strides);
/* Validate ndim/shape and compute numel and bytes without overflow. */
kiln_status_t kiln__shape_check(const char *call, int ndim, const int64_t *shape, kiln_dtype_t dtype,
                                int64_t *out_numel, size_t *out_bytes);
/* Free the calling thread's cache of tensor structs (on deinitialize); how
 * many it holds (tests). */
void kiln__tensor_cache_drop(void);
int kiln__tensor_cache_count(void);

/* ---- ops.c: the checks and layouts every operation shares ------------------------- */

/* "[2, 3]" into out. */
void kiln__shape_text(int ndim, const int64_t *shape, char *out, size_t size);
/* `name` is not NULL (KILN_INVALID_ARGUMENT naming it otherwise). */
kiln_status_t kiln__op_need(const char *call, const char *name, const kiln_tensor_t *t);
kiln_status_t kiln__op_need_out(const char *call, kiln_tensor_t **out);
/* a and b on one device (KILN_DEVICE_MISMATCH naming both and the fix). */
kiln_status_t kiln__op_same_device(const char *call, const char *na, const kiln_tensor_t *a, const char *nb,
                                   const kiln_tensor_t *b);
/* DLPack's (code, bits) of a dtype and back, from the dtype list. */
bool kiln__dtype_to_dlpack(kiln_dtype_t dtype, uint8_t *out_code, uint8_t *out_bits);
bool kiln__dtype_from_dlpack(uint8_t code, uint8_t bits, kiln_dtype_t *out_dtype);
/* kiln_device_dtype_support without the start-up check (device known). */
kiln_dtype_support_t kiln__device_dtype_support(const kiln_device_t *device, kiln_dtype_t dtype);

/* Sets of dtypes an op accepts: a bit per kiln_dtype_t. */
#define KILN__DT(E) (1u << KILN_##E)
#define KILN__DT_FLOAT (KILN__DT(F32) | KILN__DT(F64) | KILN__DT(F16) | KILN__DT(BF16))
#define KILN__DT_INTEGER (KILN__DT(I32) | KILN__DT(I64) | KILN__DT(I8) | KILN__DT(U8) | KILN__DT(I16))
#define KILN__DT_NUMERIC (KILN__DT_FLOAT | KILN__DT_INTEGER)
#define KILN__DT_ALL (KILN__DT_NUMERIC | KILN__DT(BOOL))

/* a and b have one dtype; else KILN_DTYPE_MISMATCH naming the cast of b to
 * a's dtype. `what` names the op. */
kiln_status_t kiln__op_same_dtype(const char *call, const char *what, const char *na, const kiln_tensor_t *a,
                                  const char *nb, const kiln_tensor_t *b);
/* The float dtypes the CPU runs through f32 besides f32 itself: ops without
 * an f64 kernel take these. */
#define KILN__DT_FLOAT32ISH (KILN__DT(F32) | KILN__DT(F16) | KILN__DT(BF16))
/* t's dtype is in `allowed` (KILN__DT bits); KILN_DTYPE_MISMATCH naming
 * `what`, t's dtype, the dtypes it takes and the cast that makes it valid
 * otherwise. */
kiln_status_t kiln__op_need_dtypes(const char *call, const char *what, const char *name, const kiln_tensor_t *t,
                                   uint32_t allowed);
/* The same with {f32} or {f32, i32} (i32_ok). */
kiln_status_t kiln__op_need_dtype(const char *call, const char *what, const char *name, const kiln_tensor_t *t,
                                  bool i32_ok);
/* "f32, f64, f16 or bf16": the dtypes of `allowed`, in list order, into out. */
void kiln__dtypes_text(uint32_t allowed, char *out, size_t size);
/* A contiguous version of t: itself (retained) when it is. */
kiln_status_t kiln__op_dense(const char *call, const kiln_tensor_t *t, kiln_tensor_t **out);
/* View t as ndim dims of shape, stride 0 where it broadcasts (NumPy's rule). */
void kiln__broadcast_view(const kiln_tensor_t *t, int ndim, const int64_t *shape, kiln_view_t *view);
/* Output size of a window sweep; -1 when no window fits. */
int64_t kiln__window_out(int64_t in, int64_t pad, int64_t dil, int64_t kernel, int64_t stride);
/* A pooling op's sizes: x [N, C, H, W], the window's output P x Q, and the
 * kernel, stride and padding of p (MAX_POOL2D and its gradient). */
void kiln__pooling_op_sizes(kiln_op_t *op, const kiln_tensor_t *x, int64_t P, int64_t Q, const kiln_pool2d_params_t *p);

/* ---- dispatch.c ----------------------------------------------------------------- */

/* The one path of every operation after validation: allocate the result
 * (dtype, ndim, shape) on the device's current queue, and unless it is empty
 * complete `op` (out view, merged dimensions of elementwise kinds), choose
 * the row (policy, KILN_PROVIDER, `fastest`), run it, fall back to native when
 * a vendor row declines, and tag the buffers. `op->in[0 .. n_in)` are filled
 * by the caller; `inputs` are the tensors behind them (NULL entries allowed).
 * Messages are prefixed with `call`. */
kiln_status_t kiln__op_enqueue(const char *call, kiln_device_t *device, kiln_op_t *op, kiln_dtype_t dtype, int ndim,
                               const int64_t *shape, const kiln_tensor_t *const *inputs, kiln_tensor_t **out);
/* The same path for the update kinds: `target` (contiguous) is the op's out,
 * read and written; nothing is allocated. */
kiln_status_t kiln__op_enqueue_into(const char *call, kiln_op_t *op, kiln_tensor_t *target,
                                    const kiln_tensor_t *const *inputs);
/* A scalar in every dtype kernels use (the conversion rule of kiln_scalar_t). */
kiln_scalar_t kiln__scalar(double value, kiln_dtype_t dtype);

#endif /* KILN_RUNTIME_INTERNAL_H */
