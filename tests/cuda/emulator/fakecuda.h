/* tests/cuda/emulator/fakecuda.h: the test driver's private types, limits and the functions its files share. */
#ifndef KILN_FAKECUDA_H
#define KILN_FAKECUDA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* The driver API as cuda.h declares it is what this library exports (the
 * build hides everything else). */
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include "fakecuda_abi.h"

/* ---- the modelled device: an sm_90 part (H100 SXM) ------------------------------ */

#define FC_MAX_DEVICES 8
#define FC_WARP 32
#define FC_MAX_THREADS_PER_BLOCK 1024u
#define FC_MAX_BLOCK_X 1024u
#define FC_MAX_BLOCK_Y 1024u
#define FC_MAX_BLOCK_Z 64u
#define FC_MAX_GRID_X 2147483647u
#define FC_MAX_GRID_YZ 65535u
#define FC_SHARED_PER_BLOCK 49152u         /* static + dynamic, without opt-in */
#define FC_SHARED_PER_BLOCK_OPTIN 232448u  /* 227 KiB */
#define FC_SHARED_PER_SM 233472u
#define FC_REGISTERS_PER_BLOCK 65536u
#define FC_SM_COUNT 132
#define FC_MEMORY_BYTES ((size_t)80 << 30)
#define FC_DRIVER_VERSION 13000            /* CUDA 13.0, what the toolkit here speaks */

/* Every handle the driver gives out starts with its kind, checked against a
 * registry of live handles before use (a stale or foreign pointer is
 * CUDA_ERROR_INVALID_HANDLE, never a crash). */
typedef enum fc_kind_t {
  FC_KIND_CONTEXT = 0x7c01,
  FC_KIND_STREAM,
  FC_KIND_EVENT,
  FC_KIND_MODULE,
  FC_KIND_FUNCTION,
  FC_KIND_POOL,
} fc_kind_t;

typedef struct fc_device_t {
  int ordinal;
  int cc_major, cc_minor;
  bool pools; /* stream-ordered allocation supported */
  size_t total_bytes;
  size_t used_bytes; /* cuMemAlloc'd plus what the pool reserves; under fc_lock */
  struct CUctx_st *primary;
  struct CUmemPoolHandle_st *pool;
} fc_device_t;

struct CUctx_st {
  fc_kind_t kind;
  fc_device_t *device;
  int primary_refs;        /* cuDevicePrimaryCtxRetain - Release */
  unsigned peers;          /* devices whose memory this context may access */
  CUresult sticky;         /* a kernel fault: every later call returns it */
  size_t live_events, live_modules;
};

typedef struct fc_command_t fc_command_t;
/* Runs on the stream's worker (or in the caller, for the NULL stream). */
typedef CUresult (*fc_command_fn)(fc_command_t *command);
struct fc_command_t {
  fc_command_t *next;
  fc_command_fn run;
  struct CUctx_st *ctx;
  uint64_t seq;
  bool touches_memory; /* skipped once the context has faulted */
};

struct CUstream_st {
  fc_kind_t kind;
  struct CUctx_st *ctx;
  unsigned flags;
  pthread_t worker;
  pthread_cond_t wake; /* with fc_lock: work arrived, or closing */
  fc_command_t *head, *tail;
  uint64_t submitted, completed;
  bool closing;
  struct CUstream_st *next_live; /* fc_streams */
};

struct CUevent_st {
  fc_kind_t kind;
  struct CUctx_st *ctx;
  unsigned flags;
  uint64_t recorded;  /* records enqueued */
  uint64_t completed; /* the latest record that ran */
  struct timespec when;
  int refs;           /* the user's, plus one per pending record or wait */
};

struct CUmod_st {
  fc_kind_t kind;
  struct CUctx_st *ctx;
  struct CUfunc_st *functions; /* [fakecuda__kernel_count], made at load */
};

struct CUfunc_st {
  fc_kind_t kind;
  struct CUmod_st *module;
  const fakecuda_kernel_t *kernel;
};

struct CUmemPoolHandle_st {
  fc_kind_t kind;
  fc_device_t *device;
  unsigned access;  /* devices granted access (cuMemPoolSetAccess), bit = ordinal */
  bool created;     /* cuMemPoolCreate, not a device's default pool */
  uint64_t threshold;
  uint64_t used, reserved, used_high, reserved_high;
};

/* ---- shared state (driver.c) ------------------------------------------------------ */

/* One lock for all driver state; fc_done is broadcast whenever a command
 * completes (stream, event and context waits all wait on it). */
extern pthread_mutex_t fc_lock;
extern pthread_cond_t fc_done;
extern fc_device_t fc_devices[FC_MAX_DEVICES];
extern int fc_device_count;
extern bool fc_initialized;
extern struct CUstream_st *fc_streams;

/* Counters for KILN_FAKECUDA_REPORT. */
extern atomic_ulong fc_stat_launches, fc_stat_blocks, fc_stat_threads, fc_stat_rejected;
extern atomic_ulong *fc_stat_kernel_launches; /* [fakecuda__kernel_count] */

/* ---- diagnostics (driver.c) ---------------------------------------------------------- */

/* Print "kiln-fakecuda: error: <call>: <CUresult name>: <why>" to stderr and
 * return result: a call the driver refuses, which a correct plugin never
 * makes. The emulated test runs fail on any such line. */
CUresult fc_reject(CUresult result, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same for what is wrong without a failing call (leaks, unbalanced
 * context pushes). */
void fc_complain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *fc_result_name(CUresult result);

/* ---- handles and contexts (driver.c) ------------------------------------------------ */

void fc_handle_add(const void *handle);
/* Call fn on every live handle of `kind` (a snapshot taken first, so fn may
 * remove handles; it runs without fc_lock). */
void fc_handles_each(fc_kind_t kind, void (*fn)(void *handle, void *arg), void *arg);
void fc_handle_remove(const void *handle);
/* Is handle live and of this kind? Called with fc_lock held. */
bool fc_handle_is(const void *handle, fc_kind_t kind);

/* The calling thread's current context, or NULL. */
struct CUctx_st *fc_current(void);
/* The current context for `call`, which needs one: NULL after rejecting the
 * call (no context, driver not initialised, sticky fault), *out_result set. */
struct CUctx_st *fc_require_context(const char *call, CUresult *out_result);
CUresult fc_require_init(const char *call);
/* A device ordinal the caller passed: NULL after rejecting it. */
fc_device_t *fc_device_of(CUdevice device, const char *call, CUresult *out_result);

/* ---- memory (memory.c) ----------------------------------------------------------------- */

typedef enum fc_alloc_kind_t { FC_ALLOC_DEVICE, FC_ALLOC_POOL, FC_ALLOC_HOST } fc_alloc_kind_t;

/* Is [ptr, ptr + size) inside one live allocation of `kind` (device: device
 * or pool)? fc_lock held. Returns the device of a device range, else NULL. */
bool fc_range_is(uintptr_t ptr, size_t size, fc_alloc_kind_t kind, fc_device_t **out_device);
/* Pool memory freed in stream order; runs on the stream. */
void fc_pool_free_now(uintptr_t ptr);
/* Allocations, pinned host blocks, of a device (or of all when NULL). */
size_t fc_live_allocations(const fc_device_t *device, fc_alloc_kind_t kind, size_t *out_bytes);
/* Free every allocation of the device (its context went away). */
void fc_device_memory_release(fc_device_t *device);

/* ---- streams (stream.c) ----------------------------------------------------------------- */

/* The stream a call names (NULL: the context's legacy default stream, which
 * runs work in the caller after the context's blocking streams drain). NULL
 * after rejecting it. */
bool fc_stream_check(CUstream stream, struct CUctx_st *ctx, const char *call, CUresult *out_result);
/* Take ownership of command (malloc'd, fc_command_t first) and queue it on
 * stream; for the NULL stream, run it now. Sets command->ctx. */
CUresult fc_stream_enqueue(CUstream stream, struct CUctx_st *ctx, fc_command_t *command);
/* Wait until every command queued on stream so far has run. */
void fc_stream_drain(CUstream stream, struct CUctx_st *ctx);
/* Wait until every stream of ctx has run what was queued on it. */
void fc_context_drain(struct CUctx_st *ctx);
/* Streams and events alive in ctx. */
size_t fc_live_streams(const struct CUctx_st *ctx);
size_t fc_live_events(const struct CUctx_st *ctx);
/* Destroy what is left of them when ctx goes away. */
void fc_context_streams_destroy(struct CUctx_st *ctx);
void fc_context_events_destroy(struct CUctx_st *ctx);

/* ---- kernels (module.c, fiber.c) ---------------------------------------------------- */

size_t fc_live_modules(const struct CUctx_st *ctx);
void fc_context_modules_destroy(struct CUctx_st *ctx);
/* Run a whole grid in the calling thread, block after block. Returns
 * CUDA_SUCCESS, or the fault's CUresult with *out_message set. */
CUresult fc_run_grid(const fakecuda_kernel_t *kernel, void *const *params, fakecuda_dim3 grid, fakecuda_dim3 block,
                     char *out_message, size_t message_size);

#endif /* KILN_FAKECUDA_H */
