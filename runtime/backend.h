/* runtime/backend.h: the backend interface: a versioned table of functions each backend fills, and its table of operations. */
#ifndef KILN_RUNTIME_BACKEND_H
#define KILN_RUNTIME_BACKEND_H

/* This is the one header of the core that backends include. A backend fills a
 * `static const kiln_backend_iface_t` with designated initializers and returns
 * it from its entry point:
 *
 *   const kiln_backend_iface_t *kiln_backend_entry(void);   (plugins, dlsym'd)
 *
 * Plugins never link against libkiln: everything they need from the core
 * comes through the kiln_host_t table given to initialize(), so an
 * application linked statically against libkiln loads them just as well.
 *
 * Versions. `abi_version` is the major version: the meaning of the slots
 * that exist. The core refuses a table of another major version with a
 * message naming both. `size` is sizeof(kiln_backend_iface_t) as the plugin
 * was compiled: the table only ever grows at its end, the core copies what
 * the plugin filled into a table of its own size and gives every slot the
 * plugin's table is too short to hold its default (the OpenCL ICD loader's
 * rule). A table shorter than the required slots is too old, and refused.
 *
 * State. initialize() returns the backend's context, and every slot gets it
 * back as its first argument: a backend keeps no process globals.
 *
 * Division of work: the core validates every argument, infers result shapes,
 * broadcasts (stride 0), merges contiguous dimensions, converts scalars to
 * the operand dtype, allocates results, chooses the operation entry (policy,
 * KILN_PROVIDER, measured `fastest`, fallback) and orders work across queues
 * (wait lists become queue_wait calls before the enqueue, out events a
 * queue_record after it). Backends trust what reaches them.
 *
 * Threading: any slot may be called from any thread; calls on one queue may
 * come from several threads at once and must be safe. */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"
#include "kernels/kop.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The major version: bump when a slot or a type that exists changes meaning
 * or layout. Adding a slot at the end of a table, or an op kind at the end of
 * KILN_OP_KINDS, does not bump it. */
#define KILN_BACKEND_ABI_VERSION 5u

/* The name of the symbol every plugin exports. */
#define KILN_BACKEND_ENTRY_SYMBOL "kiln_backend_entry"

/* Opaque backend objects: each backend defines these structs privately. */
typedef struct kiln_backend_context_t kiln_backend_context_t;
typedef struct kiln_backend_device_t kiln_backend_device_t;
typedef struct kiln_backend_buffer_t kiln_backend_buffer_t;
typedef struct kiln_backend_queue_t kiln_backend_queue_t;
typedef struct kiln_backend_event_t kiln_backend_event_t;

/* ---- providers ----------------------------------------------------------- */

/* A provider is a name: "native" (kiln's own kernels, present for every op on
 * every backend) or a vendor library's ("blas", "clblast", "cublas",
 * "cudnn", ...). The set is open: a backend offers a provider by listing
 * entries with its name in its op table, and nothing in the core changes.
 * The core accepts in KILN_PROVIDER, before any backend has loaded, the names
 * below (those the backends of this source tree use) and, once they have
 * loaded, every name a loaded backend lists. */
#define KILN_PROVIDER_NATIVE_NAME "native"
#define KILN_BACKEND_KNOWN_PROVIDERS "native", "blas", "clblast", "cublas", "cudnn"

/* ---- operations ------------------------------------------------------------ */

/* Operation kinds as backends see them, one row each: X(NAME, name, LAUNCH).
 * `name` is the op name of KILN_PROVIDER and of devinfo's
 * "providers.<name>". LAUNCH says how a GPU backend's native row runs the
 * kind, so that a kind is a row there too:
 *   FLAT  one work-item per element of out (grid-stride), kernel by name:
 *         <name>[_<FORMULA>]_<dtype of in[0]>_<dtype of out> (no input:
 *         <name>_<dtype of out>), FORMULA the kernels/ops.def row of the
 *         formula kinds (UNARY, BINARY, BINARY_SCALAR, UNARY_BACKWARD);
 *   ROWS  one work-group (CUDA block) per row of out, a row being out's
 *         last dimension, same kernel name;
 *   PLAN  a planner the backend names plan_<name> (a GEMM's tiles, a
 *         reduction's split, a convolution's rounds, several passes).
 * Every kernel takes the op as one kiln_kop_t (kernels/kop.h). New kinds go
 * at the end. */
#define KILN_OP_KINDS(X)                                                                            \
  X(FILL, fill, FLAT) X(ARANGE, arange, FLAT) X(RANDOM, random, FLAT) X(COPY, copy, PLAN)          \
  X(UNARY, unary, FLAT) X(BINARY, binary, FLAT) X(BINARY_SCALAR, binary_scalar, FLAT)              \
  X(MATMUL, matmul, PLAN) X(REDUCE, reduce, PLAN) X(SOFTMAX, softmax, ROWS)                        \
  X(CROSS_ENTROPY, cross_entropy, PLAN) X(CONV2D, conv2d, PLAN) X(MAX_POOL2D, max_pool2d, FLAT)    \
  X(CAST, cast, FLAT) X(UNARY_BACKWARD, unary_backward, FLAT)                                      \
  X(SOFTMAX_BACKWARD, softmax_backward, ROWS) X(CROSS_ENTROPY_BACKWARD, cross_entropy_backward, ROWS) \
  X(CONV2D_BACKWARD_INPUT, conv2d_backward_input, PLAN)                                            \
  X(CONV2D_BACKWARD_WEIGHT, conv2d_backward_weight, PLAN)                                          \
  X(MAX_POOL2D_BACKWARD, max_pool2d_backward, PLAN) X(ACCUMULATE, accumulate, FLAT)                \
  X(SGD_UPDATE, sgd_update, FLAT) X(ADAM_UPDATE, adam_update, FLAT) X(WHERE, where, FLAT)             \
  X(COMPARE, compare, FLAT) X(UNSCALE, unscale, FLAT) X(GATHER, gather, FLAT)                       \
  X(INDEX_ADD, index_add, FLAT)
typedef enum kiln_op_kind_t {
#define KILN_OP_KIND_ENUM_(NAME, name, launch) KILN_OP_##NAME,
  KILN_OP_KINDS(KILN_OP_KIND_ENUM_)
#undef KILN_OP_KIND_ENUM_
  KILN_OP_COUNT
} kiln_op_kind_t;

/* The elementwise kinds: one output element from the elements at the same
 * index of each input. The core merges their dimensions (kiln_op_t). */
static inline bool kiln_backend_op_is_elementwise(kiln_op_kind_t kind) {
  switch (kind) {
  case KILN_OP_COPY:
  case KILN_OP_CAST:
  case KILN_OP_UNARY:
  case KILN_OP_BINARY:
  case KILN_OP_BINARY_SCALAR:
  case KILN_OP_UNARY_BACKWARD:
  case KILN_OP_ACCUMULATE:
  case KILN_OP_SGD_UPDATE:
  case KILN_OP_ADAM_UPDATE:
  case KILN_OP_WHERE:
  case KILN_OP_COMPARE: return true;
  default: return false;
  }
}

/* The update kinds write into existing tensors: `out` is read and written
 * (and SGD's momentum in[1], Adam's m in[1] and v in[2], and the 16-bit copy
 * in[3] too), and every operand is contiguous, so they always come `flat`. */
static inline bool kiln_backend_op_is_update(kiln_op_kind_t kind) {
  return kind == KILN_OP_ACCUMULATE || kind == KILN_OP_SGD_UPDATE || kind == KILN_OP_ADAM_UPDATE;
}

typedef enum kiln_reduce_op_t {
  KILN_REDUCE_SUM = 0,
  KILN_REDUCE_MEAN = 1,   /* f32 only */
  KILN_REDUCE_MAX = 2,
  KILN_REDUCE_ARGMAX = 3, /* output i32: index of the first maximum along len */
  KILN_REDUCE_NORM = 4,   /* sqrt(sum(x*x)), f32 only */
} kiln_reduce_op_t;

/* A strided view of a buffer. offset and strides count elements. */
typedef struct kiln_view_t {
  kiln_backend_buffer_t *buffer;
  size_t offset;
  kiln_dtype_t dtype;
  int32_t ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t strides[KILN_MAX_DIMS]; /* 0 on a broadcast dimension */
} kiln_view_t;

/* A scalar operand (kiln_scalar_t) and each kind's parameters
 * (kiln_kop_params_t) are defined in kernels/kop.h, in the layout the GPU
 * kernels read: kiln_op_t.u below is that union, documented here. */

/* One operation, fully resolved and validated by the core.
 *
 * `out` is always a fresh, contiguous tensor (strides row-major) of its own
 * buffer; numel(out) is never 0 when an entry runs (the core enqueues nothing
 * for an empty result), except for REDUCE with len == 0 (sum of nothing is 0,
 * mean NaN), which runs with in[0] unused.
 *
 * The elementwise kinds (COPY, CAST, UNARY, BINARY, BINARY_SCALAR) come with
 * their dimensions merged: extents of 1 are dropped and neighbouring
 * dimensions fused wherever every operand is contiguous across them, so
 * `out.ndim` is between 1 and KILN_MAX_DIMS and the views of in[] have out's
 * ndim and shape (stride 0 where an input broadcasts). `flat` is true when
 * every operand is one contiguous run (ndim 1, all strides 1): the kernels'
 * fast path. Inputs of the other kinds are contiguous unless said otherwise. */
typedef struct kiln_op_t {
  kiln_op_kind_t kind;
  int32_t n_in;
  bool flat; /* elementwise kinds: every operand is one contiguous run */
  kiln_view_t out;
  kiln_view_t in[KILN_KOP_MAX_IN];
  /* Each kind's parameters (the union of kernels/kop.h, which GPU kernels
   * read as they are; flags are 0 or 1, op codes the enum's value):
   * FILL: out[i] = value in out's dtype.
   * ARANGE: out[i] = start + i*step (1-D).
   * RANDOM: float out (f32, f64, f16, bf16; kernels/philox.h says how
   *   each dtype draws), element i from Philox counter i of `seed`; normal 0:
   *   uniform [a, b); 1: normal(mean a, stddev b).
   * COPY: in[0] of out's dtype. CAST: in[0] of the other dtype (f32 <->
   *   i32): f32 -> i32 truncates toward zero with NaN -> 0 and saturation,
   *   i32 -> f32 rounds to nearest even.
   * UNARY (unary.op, a kiln_unary_op_t): in[0] of out's dtype.
   *   UNARY_BACKWARD (f32): in[0] x, in[1] dy; out = dy * f'(x), the
   *   derivative formula of kernels/ops.def.
   * BINARY (binary.op, a kiln_binary_op_t): in[0], in[1] of out's dtype.
   *   BINARY_SCALAR: in[0] (op) binary.scalar.
   * WHERE: in[0] the condition (any dtype), in[1] a and in[2] b of out's
   *   dtype: out = in[0] != 0 ? a : b (a NaN condition is nonzero).
   * COMPARE (binary.op, a kiln_compare_op_t): in[0], in[1] of one dtype,
   *   out bool (1 where it holds): the KILN_COMPARE formula of
   *   kernels/ops.def, in the dtype's compute type (f32 for f16/bf16).
   * MATMUL: row-major BLAS convention, per batch b (batch >= 1):
   *   C[b] (m x n, ldc) = op(A[b]) (m x k) @ op(B[b]) (k x n); A[b] starts
   *   at in[0].offset + b*stride_a (stride_a 0 broadcasts); !trans_a:
   *   A(i,l) at i*lda + l; trans_a: A(i,l) at l*lda + i. Likewise B with
   *   ldb, stride_b. C = out, contiguous: ldc = n, stride_c = m*n. in[0] and
   *   in[1] views carry buffer, offset, dtype only. k may be 0 (C is zeros).
   *   in[0], in[1] and out have one float dtype; f16 and bf16 accumulate
   *   in f32 and round C once (nearest even).
   * REDUCE (reduce.op, a kiln_reduce_op_t): in[0] contiguous, viewed as
   *   [outer, len, inner]; out [outer, inner].
   * SOFTMAX: in[0] contiguous [rows, cols], over cols. SOFTMAX_BACKWARD:
   *   in[0] the forward's result y, in[1] dy, both [rows, cols]; out dx:
   *   softmax dx = y * (dy - sum(dy * y)), log dx = dy - exp(y) * sum(dy).
   * CROSS_ENTROPY: in[0] f32 [n, c], in[1] i32 [n], in[2] i32 [2] the
   *   report; out 0-d f32 mean loss (NaN when a label is outside [0, c)).
   *   The op always writes the report: {first n with in[1][n] outside
   *   [0, c), in[1][n]}, or {-1, 0} when every label is in range; the core
   *   reads it at the queue's next synchronisation (runtime/checks.c).
   *   CROSS_ENTROPY_BACKWARD: the same inputs, and in[2] a one-element f32
   *   dloss when n_in is 3; out [n, c] = (softmax(in[0]) - onehot(in[1])) /
   *   n (* dloss); a label outside [0, c) makes its row NaN.
   * conv2d: the sizes of one convolution (x [n,c,h,w], w [k,c,r,s], y
   *   [n,k,p,q]) for all three kinds: CONV2D: in[0] x, in[1] w, in[2] bias
   *   [k] when has_bias; out y. CONV2D_BACKWARD_INPUT: in[0] dy [n,k,p,q],
   *   in[1] w; out dx [n,c,h,w]. CONV2D_BACKWARD_WEIGHT: in[0] x, in[1] dy;
   *   out dw [k,c,r,s]. has_bias is 0 for the backward kinds.
   * pooling: MAX_POOL2D: in[0] x [n,c,h,w]; out [n,c,p,q]; padded cells
   *   never win. MAX_POOL2D_BACKWARD: in[0] x, in[1] dy [n,c,p,q]; out dx
   *   [n,c,h,w]: each window's dy goes to its first maximum in row-major
   *   order (NaN wins, as in the forward), summed where windows overlap.
   * update, the update kinds (out f32, flat; see kiln_backend_op_is_update):
   *   ACCUMULATE: out += alpha * in[0] (in[0] f32).
   *   SGD_UPDATE and ADAM_UPDATE read grad in[0] as f32, f16 or bf16
   *   (widened exactly; the kernel name carries its dtype), and when
   *   u.update.copy is 1 they also store out's new value, rounded to
   *   nearest even, into in[3] (f16 or bf16; n_in is then 4 and an unused
   *   slot between has a NULL buffer): mixed-precision training's one pass
   *   per parameter.
   *   SGD_UPDATE: in[0] grad, in[1] momentum buffer when u.update.has_buf:
   *   g = grad + weight_decay * out; buf = momentum * buf + (1 - dampening)
   *   * g (buf = g when n_in is 1); out -= lr * (nesterov ? g + momentum *
   *   buf : buf).
   *   ADAM_UPDATE: in[0] grad, in[1] m, in[2] v: g = grad + weight_decay *
   *   out; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
   *   out -= lr * (m / bias1) / (sqrt(v / bias2) + eps), bias1 and bias2
   *   the corrections 1 - beta^step the core computed. The core also folds,
   *   in double from the caller's values and rounded once to float, keep1 =
   *   1 - beta1, keep2 = 1 - beta2, step_size = lr / bias1 and sqrt_bias2 =
   *   sqrt(bias2); kernels use those (out -= step_size * m / (sqrt(v) /
   *   sqrt_bias2 + eps), torch.optim.Adam's order), never 1 - beta of the
   *   float beta, which is off by up to 1.3e-5 relative at beta2 = 0.999.
   * UNSCALE (not an elementwise kind: nothing merged, every operand
   *   contiguous): in[0] grad (f32, f16 or bf16), out f32 of its shape =
   *   in[0] * u.update.alpha; in[1] one f32 (the found-inf flag) is set to
   *   1.0 when any element of in[0] is an infinity or a NaN, and left alone
   *   otherwise (several work-items may store the 1.0). A loss scaler's
   *   check and unscale in one pass (torch's
   *   _amp_foreach_non_finite_check_and_unscale_).
   * index (GATHER, INDEX_ADD; not elementwise: every operand contiguous):
   *   x viewed as [outer, len, inner] along the indexed axis, in[1] the
   *   index (i32 or i64, m entries; a negative entry counts from the end, as
   *   in NumPy), in[2] the report (i32 [2], filled with -1 by the core): an
   *   entry outside [-len, len) stores its position and value there (one
   *   such entry, by an atomic compare-and-swap of the position from -1, then
   *   its value) and contributes nothing. GATHER: in[0] x; out [outer, m,
   *   inner] = x[o, index[j], i] (zero where the entry is outside; any
   *   dtype: a copy of the element). INDEX_ADD: out is x, updated in place
   *   (read and written); in[0] src [outer, m, inner] of x's dtype: x[o,
   *   index[j], i] += alpha * src[o, j, i], the entries of one (o, i) added
   *   in order of j by one work-item, so repeated indices accumulate and the
   *   sums are the same on every backend (float dtypes computed as the
   *   dtype's formulas, f16/bf16 in f32 rounded once per add; integers
   *   wrapping). With u.index.copy, x[o, index[j], i] = src[o, j, i]
   *   instead (index_copy): the last of repeated entries wins. */
  kiln_kop_params_t u;
} kiln_op_t;

/* ---- a backend's table of operations --------------------------------------- */

typedef struct kiln_op_entry_t kiln_op_entry_t;

/* One row: one provider's implementation of one op kind. A backend lists
 * rows in a static array; the core reads it to list the providers of each
 * device (devinfo -v), to apply KILN_POLICY and KILN_PROVIDER, to measure for
 * `fastest` and to fall back to `native`. Every kind has a `native` row on
 * every backend. */
struct kiln_op_entry_t {
  kiln_op_kind_t kind;
  const char *provider; /* "native", "blas", ...: static storage */
  /* (O) Whether this row serves `op` on `device` (a vendor library's limits:
   * int sizes, an algorithm it lacks). With `op` NULL: whether the row can
   * serve `kind` on this device at all (its library loaded, the device able),
   * which is what listings show. Cheap and without side effects. NULL: the
   * row serves everything of its kind the core validated. */
  bool (*supports)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, const kiln_op_entry_t *entry,
                   const kiln_op_t *op);
  /* (R) Enqueue `op` on `queue`. The op struct may be reused by the caller
   * once this returns (copy what you keep). A row that finds only now that it
   * cannot serve these arguments returns KILN_UNSUPPORTED without enqueuing
   * anything, and the core runs `native` instead; KILN_UNAVAILABLE says the
   * provider cannot work on this device at all (a vendor library that fails
   * to start), and the core stops offering the row on this device. */
  kiln_status_t (*run)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_entry_t *entry,
                       const kiln_op_t *op);
  /* The backend's own data for `run`: the kernel or vendor routine the row
   * calls, so that one `run` can serve many rows. */
  const void *impl;
};

/* The row that ends a table of operations. */
#define KILN_OP_TABLE_END {KILN_OP_COUNT, NULL, NULL, NULL, NULL}

/* ---- what the core gives backends ---------------------------------------- */

typedef struct kiln_host_t {
  uint32_t size; /* sizeof(kiln_host_t) in the core; grows at its end */
  /* Set the calling thread's error message and return `status`. */
  kiln_status_t (*set_error)(kiln_status_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
  /* The calling thread's current message ("" when none). */
  const char *(*last_error)(void);
  /* Log through KILN_LOG / the application's callback. */
  void (*log)(kiln_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
  kiln_log_level_t (*log_level)(void);
  /* The on-disk cache of blobs (compiled kernels). `key` is any string; the
   * core hashes it into a file name and verifies the stored key, size and
   * checksum on load. load: KILN_OK with a malloc'ed copy the backend frees,
   * KILN_NOT_FOUND when absent or invalid (counted, never trusted). store:
   * written to a temporary file and renamed into place; failures are counted
   * and otherwise ignored (a read-only directory runs uncached). evict: drop
   * an entry that loaded but proved unusable. */
  kiln_status_t (*cache_load)(const char *key, void **out_data, size_t *out_size);
  void (*cache_store)(const char *key, const void *data, size_t size);
  void (*cache_evict)(const char *key);
  /* A setting the core parsed and validated, by its variable's name
   * ("KILN_CPU_DEVICES"): its value as text, or NULL when unset. */
  const char *(*setting)(const char *variable);
} kiln_host_t;

/* ---- what each backend says about a device -------------------------------- */

#define KILN_BACKEND_MAX_PROPERTIES 24

typedef struct kiln_backend_device_desc_t {
  kiln_backend_device_t *impl; /* the backend's handle for this device */
  kiln_device_type_t type;
  /* Order among devices of one type while KILN_BACKEND is unset: lower comes
   * first, then backend priority. 0 normally; a backend that reaches a device
   * through a layer a native backend of that device type does without (an
   * OpenCL CPU device beside the host's own cpu backend) gives it 1, so that
   * it is listed and selectable but not the default. */
  int32_t order;
  char name[256];
  char vendor[128];
  char driver_version[128];
  char runtime_version[128];
  char platform[128];
  char uuid[64];
  char pci_bus_id[32];
  char compute_capability[64];
  uint64_t memory_bytes;
  uint64_t max_alloc_bytes;
  uint64_t local_memory_bytes;
  uint32_t compute_units;
  uint32_t max_work_group_size;
  bool fp16, fp64;
  bool memory_free_is_estimate;
  size_t property_count; /* extra key/value pairs for devinfo -v */
  struct { char key[48]; char value[512]; } properties[KILN_BACKEND_MAX_PROPERTIES];
} kiln_backend_device_desc_t;

/* ---- the table ---------------------------------------------------------------
 * (R) required, (O) optional with the core's default in brackets. Every slot
 * but initialize gets the context initialize returned. */
typedef struct kiln_backend_iface_t {
  uint32_t abi_version; /* (R) KILN_BACKEND_ABI_VERSION */
  uint32_t size;        /* (R) sizeof(kiln_backend_iface_t) */
  const char *name;     /* (R) "cpu", "opencl", "cuda"; selector prefix */
  const char *version;  /* (O) the backend's / vendor library's version ["" ] */

  /* (R) Load vendor libraries, enumerate devices, return the context.
   * KILN_UNAVAILABLE with a message saying why (the loader's message, "no
   * OpenCL platform") when the backend cannot work here; a backend with zero
   * devices returns KILN_OK and device_count() 0, leaving the reason as the
   * thread's message. Called once per start. */
  kiln_status_t (*initialize)(const kiln_host_t *host, kiln_backend_context_t **out_ctx);
  /* (O) Free everything (after all queues were destroyed). [nothing] */
  void (*deinitialize)(kiln_backend_context_t *ctx);

  size_t (*device_count)(kiln_backend_context_t *ctx); /* (R) */
  kiln_status_t (*device_describe)(kiln_backend_context_t *ctx, size_t index,
                                   kiln_backend_device_desc_t *out_desc); /* (R) */
  /* (O) Free memory now. [memory_bytes, marked an estimate] */
  kiln_status_t (*device_memory_free)(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                      uint64_t *out_bytes);

  /* Buffers. allocate: KILN_OUT_OF_MEMORY with a message when it does not
   * fit; size 0 must succeed. free: the core guarantees no pending work uses
   * it. host_pointer (O): host-addressable memory of the buffer (the CPU
   * backend), enabling direct cross-backend copies [NULL]. */
  kiln_status_t (*buffer_allocate)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                   kiln_backend_buffer_t **out_buffer); /* (R) */
  void (*buffer_free)(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                      kiln_backend_buffer_t *buffer); /* (R) */
  void *(*buffer_host_pointer)(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer); /* (O) */

  /* (O) Page-locked host memory for staging [malloc/free]. */
  kiln_status_t (*host_allocate)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                 void **out_ptr);
  void (*host_free)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *ptr);

  /* Queues: in order. destroy is called after finish. (R) */
  kiln_status_t (*queue_create)(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                kiln_backend_queue_t **out_queue);
  void (*queue_destroy)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
  /* (R) Block until done; return the first asynchronous error since the last
   * finish (and clear it). */
  kiln_status_t (*queue_finish)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);

  /* Events (all R). record: a marker after all earlier work, with a device
   * timestamp for elapsed(). wait: later work on `queue` waits for `event` (an
   * event of this backend, possibly of another device, whose queue may have
   * been destroyed since). */
  kiln_status_t (*queue_record)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                kiln_backend_event_t **out_event);
  kiln_status_t (*queue_wait)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                              kiln_backend_event_t *event);
  kiln_status_t (*event_wait)(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
  kiln_status_t (*event_query)(kiln_backend_context_t *ctx, kiln_backend_event_t *event); /* OK or NOT_READY */
  kiln_status_t (*event_elapsed)(kiln_backend_context_t *ctx, kiln_backend_event_t *start, kiln_backend_event_t *end,
                                 double *out_ms);
  void (*event_release)(kiln_backend_context_t *ctx, kiln_backend_event_t *event);

  /* Transfers, enqueued on `queue` (a queue of the buffer's device). With
   * blocking false, `host` stays valid until the work completes. (R) */
  kiln_status_t (*buffer_write)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                kiln_backend_buffer_t *buffer, size_t offset, const void *host, size_t size,
                                bool blocking);
  kiln_status_t (*buffer_read)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                               kiln_backend_buffer_t *buffer, size_t offset, void *host, size_t size, bool blocking);
  /* (O) Copy between two buffers of this backend, possibly on two devices
   * (peer); enqueued on `queue`, a queue of dst's device. The core has made the
   * queue wait for the source's pending work. [staged through the host] */
  kiln_status_t (*buffer_copy)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *src,
                               size_t src_offset, kiln_backend_buffer_t *dst, size_t dst_offset, size_t size);
  /* (R) pattern_size 1, 2 or 4; size a multiple of it. */
  kiln_status_t (*buffer_fill)(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                               kiln_backend_buffer_t *buffer, size_t offset, size_t size, const void *pattern,
                               size_t pattern_size);

  /* (R) The operations: rows of (kind, provider, supports, run), at least a
   * `native` row for every kind, ending with KILN_OP_TABLE_END (a row whose
   * run is NULL), so that adding an op is adding a row. Static storage. */
  const kiln_op_entry_t *ops;

  /* New slots go here, at the end, each optional with a default in the core. */

  /* (O) The version as found at start-up (the driver's, the vendor
   * libraries' loaded), for devinfo's backend line; storage owned by the
   * context. [version] */
  const char *(*version_text)(kiln_backend_context_t *ctx);

  /* (O) DLPack: where a device's memory lives as DLPack names it (a
   * DLDeviceType code: 1 kDLCPU, 2 kDLCUDA, 4 kDLOpenCL, ...) and the
   * device_id. [no DLPack exchange] */
  void (*dlpack_device)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, int32_t *out_type,
                        int32_t *out_id);
  /* (O) The native handle of a buffer's memory as DLPack carries it: the host
   * address (kDLCPU), the CUdeviceptr (kDLCUDA), the cl_mem (kDLOpenCL); NULL
   * for an empty buffer. [no DLPack export] */
  void *(*buffer_handle)(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer);
  /* (O) A buffer over memory the backend did not allocate (a DLPack import):
   * `handle` as buffer_handle gives it, `size` bytes. buffer_free releases
   * the record (and any reference taken), never the memory itself. [no DLPack
   * import] */
  kiln_status_t (*buffer_wrap)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *handle, size_t size,
                               kiln_backend_buffer_t **out_buffer);
  /* (O) Allocate a buffer for work on `queue` first (a queue of `device`):
   * the allocation may be ordered on that queue instead of waited for
   * (CUDA's stream-ordered allocation), so it returns at once and never
   * waits on other queues' work. The buffer is usable by work enqueued on
   * `queue` from now on, and by work on other queues once ordered after
   * this point of `queue` (an event recorded on it later, or its finish);
   * the core treats the new block as last used by `queue`. queue NULL: as
   * buffer_allocate. Same errors as buffer_allocate. [buffer_allocate] */
  kiln_status_t (*buffer_allocate_on)(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                      kiln_backend_queue_t *queue, size_t size, kiln_backend_buffer_t **out_buffer);
  /* (O) How `device` serves `dtype`: a kiln_dtype_support_t (native,
   * emulated, unsupported). The core sends a device no op with an operand or
   * result of a dtype it calls unsupported (KILN_UNSUPPORTED naming the
   * device and the dtype instead); storage (allocation, transfers) of every
   * dtype needs no kernel and is always allowed. [f32 and i32 native, every
   * other dtype unsupported] */
  int32_t (*dtype_support)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_dtype_t dtype);
  /* (O) Why `device` does not serve `dtype` (dtype_support said
   * unsupported), for the refusal's message: what the device lacks, naming
   * it (e.g. "opencl:0 (NAME) lacks cl_khr_fp64"). NULL when there is
   * nothing to add; the text lives as long as the context. [the core's
   * message alone] */
  const char *(*dtype_unsupported_why)(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_dtype_t dtype);
} kiln_backend_iface_t;

/* ---- backends compiled into libkiln ------------------------------------------ */

typedef const kiln_backend_iface_t *(*kiln_backend_entry_fn)(void);

/* The built-in backends, by name, ending with { NULL, NULL }: one list
 * (backends/builtin.c), read by the registry, which names none of them. */
typedef struct kiln_backend_builtin_t {
  const char *name;
  kiln_backend_entry_fn entry;
} kiln_backend_builtin_t;
extern const kiln_backend_builtin_t kiln_backend_builtins[];
/* KILN_BACKEND's value when unset ("cuda,opencl,cpu"), from the same file. */
extern const char kiln_backend_default_order[];

/* Plugins mark their entry point with this (the project builds with
 * -fvisibility=hidden). */
#define KILN_PLUGIN_EXPORT __attribute__((visibility("default")))

/* ---- helpers every backend shares (inline: plugins do not link libkiln) ---- */

/* Append one key/value pair to a device description (devinfo -v); what does
 * not fit is dropped (the list is for people). */
static inline void kiln_backend_add_property(kiln_backend_device_desc_t *desc, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void kiln_backend_add_property(kiln_backend_device_desc_t *desc, const char *key, const char *fmt, ...) {
  if (desc->property_count >= KILN_BACKEND_MAX_PROPERTIES) return;
  size_t i = desc->property_count++;
  snprintf(desc->properties[i].key, sizeof desc->properties[i].key, "%s", key);
  va_list args;
  va_start(args, fmt);
  vsnprintf(desc->properties[i].value, sizeof desc->properties[i].value, fmt, args);
  va_end(args);
}

static inline const char *kiln_backend_op_kind_name(kiln_op_kind_t kind) {
  switch (kind) {
#define KILN_BACKEND_KIND_NAME_(NAME, name, launch) case KILN_OP_##NAME: return #name;
    KILN_OP_KINDS(KILN_BACKEND_KIND_NAME_)
#undef KILN_BACKEND_KIND_NAME_
  default: return "?";
  }
}

/* The FORMULA part of a kernel name (the kernels/ops.def row: "ADD",
 * "EXP", "LESS") for the formula kinds (UNARY, UNARY_BACKWARD, BINARY,
 * BINARY_SCALAR, COMPARE), with its index + 1 in *out_index (a key for
 * kernel caches); NULL and 0 for the other kinds, "?" for a bad op. */
static inline const char *kiln_backend_formula_name(const kiln_op_t *op, int *out_index) {
  int index = -1, count = 0;
  const char *name = "?";
  switch (op->kind) {
  case KILN_OP_UNARY:
  case KILN_OP_UNARY_BACKWARD:
    index = op->u.unary.op;
    count = KILN_UNARY_COUNT_;
    switch (index) {
#define KILN_BACKEND_FORMULA_(NAME, name_) case KILN_UNARY_##NAME: name = #NAME; break;
      KILN_UNARY_OPS(KILN_BACKEND_FORMULA_)
#undef KILN_BACKEND_FORMULA_
    default: break;
    }
    break;
  case KILN_OP_BINARY:
  case KILN_OP_BINARY_SCALAR:
    index = op->u.binary.op;
    count = KILN_BINARY_COUNT_;
    switch (index) {
#define KILN_BACKEND_FORMULA_(NAME, name_) case KILN_BINARY_##NAME: name = #NAME; break;
      KILN_BINARY_OPS(KILN_BACKEND_FORMULA_)
#undef KILN_BACKEND_FORMULA_
    default: break;
    }
    break;
  case KILN_OP_COMPARE:
    index = op->u.binary.op;
    count = KILN_COMPARE_COUNT_;
    switch (index) {
#define KILN_BACKEND_FORMULA_(NAME, name_) case KILN_COMPARE_##NAME: name = #NAME; break;
      KILN_COMPARE_OPS(KILN_BACKEND_FORMULA_)
#undef KILN_BACKEND_FORMULA_
    default: break;
    }
    break;
  default:
    if (out_index) *out_index = 0;
    return NULL;
  }
  if (out_index) *out_index = index >= 0 && index < count ? index + 1 : 0;
  return name;
}

static inline const char *kiln_backend_dtype_name(kiln_dtype_t dtype) {
  switch (dtype) {
#define KILN_BACKEND_DTYPE_NAME_(E, name, long_name, size, dl_code, dl_bits, cls) case KILN_##E: return name;
    KILN_DTYPES(KILN_BACKEND_DTYPE_NAME_)
#undef KILN_BACKEND_DTYPE_NAME_
  default: return "?";
  }
}

/* Bytes per element of the dtypes kernels see (0 for an unknown value). */
static inline size_t kiln_backend_dtype_size(kiln_dtype_t dtype) {
  switch (dtype) {
#define KILN_BACKEND_DTYPE_SIZE_(E, name, long_name, size, dl_code, dl_bits, cls) case KILN_##E: return size;
    KILN_DTYPES(KILN_BACKEND_DTYPE_SIZE_)
#undef KILN_BACKEND_DTYPE_SIZE_
  default: return 0;
  }
}

/* Whether every operand of `op` has a dtype of `in_mask` and its result one
 * of `out_mask` (bits 1u << kiln_dtype_t); *out_bad (when not NULL) the
 * first dtype that does not. For kernels that compute some dtypes only: a
 * device serves a dtype once any of its kernels does, so the others check. */
static inline bool kiln_backend_op_dtypes_in(const kiln_op_t *op, uint32_t in_mask, uint32_t out_mask,
                                             kiln_dtype_t *out_bad) {
  for (int i = 0; i < op->n_in; i++)
    if (!((in_mask >> (unsigned)op->in[i].dtype) & 1u)) {
      if (out_bad) *out_bad = op->in[i].dtype;
      return false;
    }
  if (!((out_mask >> (unsigned)op->out.dtype) & 1u)) {
    if (out_bad) *out_bad = op->out.dtype;
    return false;
  }
  return true;
}

static inline int64_t kiln_backend_view_numel(const kiln_view_t *view) {
  int64_t n = 1;
  for (int32_t d = 0; d < view->ndim; d++) n *= view->shape[d];
  return n;
}

#ifndef __cplusplus
_Static_assert(KILN_MAX_DIMS <= KILN_KOP_MAX_DIMS, "kiln_kop_t holds fewer dimensions than a view");
_Static_assert(KILN_KOP_DT_F16 == (int)KILN_F16 && KILN_KOP_DT_BF16 == (int)KILN_BF16 &&
                   KILN_KOP_DT_I32 == (int)KILN_I32 && KILN_KOP_DT_I64 == (int)KILN_I64,
               "kernels/kop.h's dtype codes are kiln_dtype_t's");
_Static_assert(sizeof(kiln_kop_t) % 8 == 0 && sizeof(kiln_kop_params_t) % 8 == 0,
               "kernels/kop.h's structs must be multiples of 8 bytes, as every dialect pads them alike");
/* OpenCL guarantees 1024 bytes of kernel arguments: the record and its buffers fit. */
_Static_assert(sizeof(kiln_kop_t) + (1 + KILN_KOP_MAX_IN) * 8 <= 1024, "kiln_kop_t outgrew OpenCL's smallest argument space");
#endif

/* The kernel-facing record of `op` (kernels/kop.h): every operand's offset,
 * dtype and strides, out's shape and size, the kind's parameters, and
 * ndim 0 when the op is `flat`. The `addr` of each operand and the `plan`
 * are left 0: each GPU backend's one helper sets the addresses its dialect
 * needs (CUDA: buffer address + offset * size; OpenCL: none, buffers are
 * arguments), and planners set `plan` in a copy. */
static inline void kiln_backend_kop_fill(kiln_kop_t *k, const kiln_op_t *op) {
  memset(k, 0, sizeof *k);
  k->kind = (kiln_i32)op->kind;
  k->n_in = op->n_in;
  k->n = kiln_backend_view_numel(&op->out);
  k->ndim = op->flat ? 0 : op->out.ndim;
  for (int32_t d = 0; d < op->out.ndim; d++) {
    k->shape[d] = op->out.shape[d];
    k->out.strides[d] = op->out.strides[d];
  }
  k->out.offset = (kiln_i64)op->out.offset;
  k->out.dtype = (kiln_i32)op->out.dtype;
  for (int32_t i = 0; i < op->n_in && i < KILN_KOP_MAX_IN; i++) {
    const kiln_view_t *v = &op->in[i];
    k->in[i].offset = (kiln_i64)v->offset;
    k->in[i].dtype = (kiln_i32)v->dtype;
    for (int32_t d = 0; d < v->ndim && d < KILN_KOP_MAX_DIMS; d++) k->in[i].strides[d] = v->strides[d];
  }
  k->u = op->u;
}

/* A MATMUL's GEMM plan from a filled record: the operands (CUDA addresses,
 * OpenCL offsets, whichever the backend's fill set) and the product's sizes
 * from u.matmul, once for both GPU backends' planners. */
static inline void kiln_backend_kop_plan_matmul(kiln_kop_t *k) {
  k->plan.gemm.a = k->in[0].addr;
  k->plan.gemm.b = k->in[1].addr;
  k->plan.gemm.c = k->out.addr;
  k->plan.gemm.a_off = k->in[0].offset;
  k->plan.gemm.b_off = k->in[1].offset;
  k->plan.gemm.c_off = k->out.offset;
  k->plan.gemm.m = k->u.matmul.m;
  k->plan.gemm.n = k->u.matmul.n;
  k->plan.gemm.k = k->u.matmul.k;
  k->plan.gemm.lda = k->u.matmul.lda;
  k->plan.gemm.ldb = k->u.matmul.ldb;
  k->plan.gemm.ldc = k->u.matmul.ldc;
  k->plan.gemm.stride_a = k->u.matmul.stride_a;
  k->plan.gemm.stride_b = k->u.matmul.stride_b;
  k->plan.gemm.stride_c = k->u.matmul.stride_c;
  k->plan.gemm.batch = k->u.matmul.batch;
  k->plan.gemm.trans_a = k->u.matmul.trans_a ? 1 : 0;
  k->plan.gemm.trans_b = k->u.matmul.trans_b ? 1 : 0;
}

#ifdef __cplusplus
}
#endif
#endif /* KILN_RUNTIME_BACKEND_H */
