/* runtime/backend.h: the backend interface: a versioned table of functions each backend fills. */
#ifndef KILN_RUNTIME_BACKEND_H
#define KILN_RUNTIME_BACKEND_H

/* This is the one header of the core that backends include. A backend fills a
 * `static const kiln_backend_iface_t` with designated initializers and returns
 * it from its entry point:
 *
 *   const kiln_backend_iface_t *kiln_backend_entry(void);   (plugins, dlsym'd)
 *
 * The core checks abi_version and refuses a mismatch with a message. Plugins
 * never link against libkiln: everything they need from the core comes through
 * the kiln_host_t table given to initialize(), so an application linked
 * statically against libkiln loads them just as well.
 *
 * Division of work: the core validates every argument, computes result shapes,
 * broadcasts (stride 0), allocates results, chooses the provider and orders
 * work across queues (wait lists become queue_wait calls before the enqueue,
 * out events a queue_record after it). Backends trust what reaches them.
 *
 * Threading: any slot may be called from any thread; calls on one queue may
 * come from several threads at once and must be safe. */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bump on any change to this file's types or tables. */
#define KILN_BACKEND_ABI_VERSION 1u

/* The name of the symbol every plugin exports. */
#define KILN_BACKEND_ENTRY_SYMBOL "kiln_backend_entry"

/* Opaque backend objects: each backend defines these structs privately. */
typedef struct kiln_backend_device_t kiln_backend_device_t;
typedef struct kiln_backend_buffer_t kiln_backend_buffer_t;
typedef struct kiln_backend_queue_t kiln_backend_queue_t;
typedef struct kiln_backend_event_t kiln_backend_event_t;

/* ---- providers ----------------------------------------------------------- */

/* Every provider kiln knows; a backend reports which it offers as a bitmask
 * (1u << provider). NATIVE (kiln's own kernels) exists for every op on every
 * backend. */
#define KILN_PROVIDERS(X) X(NATIVE, native) X(BLAS, blas) X(CLBLAST, clblast) X(CUBLAS, cublas) X(CUDNN, cudnn)
typedef enum kiln_provider_t {
#define KILN_PROVIDER_ENUM_(NAME, name) KILN_PROVIDER_##NAME,
  KILN_PROVIDERS(KILN_PROVIDER_ENUM_)
#undef KILN_PROVIDER_ENUM_
  KILN_PROVIDER_COUNT
} kiln_provider_t;

/* ---- operations ------------------------------------------------------------ */

/* Operation kinds as backends see them. The names are KILN_PROVIDER's op names. */
#define KILN_OP_KINDS(X)                                                                     \
  X(FILL, fill) X(ARANGE, arange) X(RANDOM, random) X(COPY, copy) X(UNARY, unary)           \
  X(BINARY, binary) X(BINARY_SCALAR, binary_scalar) X(MATMUL, matmul) X(REDUCE, reduce)      \
  X(SOFTMAX, softmax) X(CROSS_ENTROPY, cross_entropy) X(CONV2D, conv2d)                      \
  X(MAX_POOL2D, max_pool2d)
typedef enum kiln_op_kind_t {
#define KILN_OP_KIND_ENUM_(NAME, name) KILN_OP_##NAME,
  KILN_OP_KINDS(KILN_OP_KIND_ENUM_)
#undef KILN_OP_KIND_ENUM_
  KILN_OP_COUNT
} kiln_op_kind_t;

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

/* One operation, fully resolved by the core. `out` is always a fresh,
 * contiguous tensor (strides row-major) of its own buffer. Unless said
 * otherwise, inputs are contiguous too. numel(out) may be 0: then nothing is
 * enqueued by the core at all, except that it still calls the backend for
 * REDUCE with len == 0 (sum of nothing is 0, mean NaN). */
typedef struct kiln_op_t {
  kiln_op_kind_t kind;
  int32_t n_in;
  kiln_view_t out;
  kiln_view_t in[3];
  union {
    struct { double value; } fill;               /* out[i] = value */
    struct { double start, step; } arange;       /* out[i] = start + i*step (1-D) */
    struct {                                     /* f32 out; element i from Philox counter i */
      uint64_t seed;
      bool normal;                               /* false: uniform [a, b); true: normal(mean a, stddev b) */
      float a, b;
    } random;
    /* COPY: in[0] any strided view of out's shape and dtype -> contiguous out. */
    struct { kiln_unary_op_t op; } unary;        /* in[0] strided view of out's shape */
    struct {                                     /* BINARY: in[0], in[1] strided views already broadcast
                                                  * to out's ndim and shape (stride 0 where broadcast).
                                                  * BINARY_SCALAR: in[0] and `scalar`. */
      kiln_binary_op_t op;
      double scalar;
    } binary;
    struct {  /* Row-major BLAS convention, per batch b:
               * C[b] (m x n, ldc) = op(A[b]) (m x k) @ op(B[b]) (k x n)
               * A[b] starts at in[0].offset + b*stride_a (stride_a 0 broadcasts);
               * !trans_a: A(i,l) at i*lda + l;  trans_a: A(i,l) at l*lda + i.
               * Likewise B with ldb, stride_b. C = out, contiguous: ldc = n,
               * stride_c = m*n. in[0]/in[1] views carry buffer, offset, dtype only. */
      int64_t batch, m, n, k;
      bool trans_a, trans_b;
      int64_t lda, ldb, ldc;
      int64_t stride_a, stride_b, stride_c;
    } matmul;
    struct {  /* in[0] contiguous, viewed as [outer, len, inner]; out [outer, inner] */
      kiln_reduce_op_t op;
      int64_t outer, len, inner;
    } reduce;
    struct { int64_t rows, cols; bool log; } softmax; /* in[0] contiguous [rows, cols], over cols */
    struct { int64_t n, c; } cross_entropy; /* in[0] f32 [n, c], in[1] i32 [n]; out 0-d f32 mean loss */
    struct {  /* in[0] x [n,c,h,w], in[1] w [k,c,r,s], in[2] bias [k] when has_bias; out [n,k,p,q] */
      int64_t n, c, h, w, k, r, s, p, q;
      int32_t stride[2], pad[2], dil[2];
      bool has_bias;
    } conv2d;
    struct {  /* in[0] x [n,c,h,w]; out [n,c,p,q]; padded cells never win */
      int64_t n, c, h, w, p, q;
      int32_t kernel[2], stride[2], pad[2];
    } pool2d;
  } u;
} kiln_op_t;

/* ---- what the core gives backends ---------------------------------------- */

typedef struct kiln_host_t {
  uint32_t abi_version;
  /* Set the calling thread's error message and return `status`. */
  kiln_status_t (*set_error)(kiln_status_t status, const char *fmt, ...)
      __attribute__((format(printf, 2, 3)));
  /* Log through KILN_LOG / the application's callback. */
  void (*log)(kiln_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
  kiln_log_level_t (*log_level)(void);
  /* The on-disk cache of blobs (compiled kernels). `key` is any string; the
   * core hashes it into a file name and verifies the stored key, size and
   * checksum on load. load: KILN_OK with a malloc'ed copy the backend frees,
   * KILN_NOT_FOUND when absent or invalid (counted, never trusted). store:
   * written to a temporary file and renamed into place; failures are counted
   * and otherwise ignored (a read-only directory runs uncached). */
  kiln_status_t (*cache_load)(const char *key, void **out_data, size_t *out_size);
  void (*cache_store)(const char *key, const void *data, size_t size);
  /* The CPU backend's device count (KILN_CPU_DEVICES), >= 1. */
  int cpu_devices;
} kiln_host_t;

/* ---- what each backend says about a device -------------------------------- */

#define KILN_BACKEND_MAX_PROPERTIES 24

typedef struct kiln_backend_device_desc_t {
  kiln_backend_device_t *impl; /* the backend's handle for this device */
  kiln_device_type_t type;
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
 * (R) required, (O) optional with the core's default in brackets. */
typedef struct kiln_backend_iface_t {
  uint32_t abi_version; /* (R) KILN_BACKEND_ABI_VERSION */
  const char *name;     /* (R) "cpu", "opencl", "cuda"; selector prefix */
  const char *version;  /* (O) the backend's / vendor library's version ["" ] */

  /* (R) Load vendor libraries and enumerate devices. KILN_UNAVAILABLE with a
   * message saying why (the loader's message, "no OpenCL platform") when the
   * backend cannot work here; a backend with zero devices returns KILN_OK and
   * device_count() 0. Called once. */
  kiln_status_t (*initialize)(const kiln_host_t *host);
  /* (O) Free everything (after all queues were destroyed). [nothing] */
  void (*deinitialize)(void);

  size_t (*device_count)(void);                                              /* (R) */
  kiln_status_t (*device_describe)(size_t index, kiln_backend_device_desc_t *out_desc); /* (R) */
  /* (O) Free memory now. [memory_bytes, marked an estimate] */
  kiln_status_t (*device_memory_free)(kiln_backend_device_t *device, uint64_t *out_bytes);

  /* Buffers. allocate: KILN_OUT_OF_MEMORY with a message when it does not
   * fit; size 0 must succeed. free: the core guarantees no pending work uses
   * it. host_pointer (O): host-addressable memory of the buffer (the CPU
   * backend), enabling direct cross-backend copies [NULL]. */
  kiln_status_t (*buffer_allocate)(kiln_backend_device_t *device, size_t size,
                                   kiln_backend_buffer_t **out_buffer);           /* (R) */
  void (*buffer_free)(kiln_backend_device_t *device, kiln_backend_buffer_t *buffer); /* (R) */
  void *(*buffer_host_pointer)(kiln_backend_buffer_t *buffer);                    /* (O) */

  /* (O) Page-locked host memory for staging [malloc/free]. */
  kiln_status_t (*host_allocate)(kiln_backend_device_t *device, size_t size, void **out_ptr);
  void (*host_free)(kiln_backend_device_t *device, void *ptr);

  /* Queues: in order. destroy is called after finish. */
  kiln_status_t (*queue_create)(kiln_backend_device_t *device, kiln_backend_queue_t **out_queue); /* (R) */
  void (*queue_destroy)(kiln_backend_queue_t *queue);                              /* (R) */
  /* (R) Block until done; return the first asynchronous error since the last
   * finish (and clear it). */
  kiln_status_t (*queue_finish)(kiln_backend_queue_t *queue);

  /* Events (all R). record: a marker after all earlier work, with a device
   * timestamp for elapsed(). wait: later work on `queue` waits for `event` (an
   * event of this backend, possibly of another device). */
  kiln_status_t (*queue_record)(kiln_backend_queue_t *queue, kiln_backend_event_t **out_event);
  kiln_status_t (*queue_wait)(kiln_backend_queue_t *queue, kiln_backend_event_t *event);
  kiln_status_t (*event_wait)(kiln_backend_event_t *event);
  kiln_status_t (*event_query)(kiln_backend_event_t *event); /* KILN_OK or KILN_NOT_READY */
  kiln_status_t (*event_elapsed)(kiln_backend_event_t *start, kiln_backend_event_t *end,
                                 double *out_ms);
  void (*event_release)(kiln_backend_event_t *event);

  /* Transfers, enqueued on `queue` (a queue of the buffer's device). With
   * blocking false, `host` stays valid until the work completes. (R) */
  kiln_status_t (*buffer_write)(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer,
                                size_t offset, const void *host, size_t size, bool blocking);
  kiln_status_t (*buffer_read)(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer,
                               size_t offset, void *host, size_t size, bool blocking);
  /* (O) Copy between two buffers of this backend, possibly on two devices
   * (peer); enqueued on `queue`, a queue of dst's device. The core has made the
   * queue wait for the source's pending work. [staged through the host] */
  kiln_status_t (*buffer_copy)(kiln_backend_queue_t *queue, kiln_backend_buffer_t *src,
                               size_t src_offset, kiln_backend_buffer_t *dst, size_t dst_offset,
                               size_t size);
  /* (R) pattern_size 1, 2 or 4; size a multiple of it. */
  kiln_status_t (*buffer_fill)(kiln_backend_queue_t *queue, kiln_backend_buffer_t *buffer,
                               size_t offset, size_t size, const void *pattern, size_t pattern_size);

  /* (R) Which providers can run `kind` for `dtype` on the device: a bitmask of
   * (1u << kiln_provider_t); must include NATIVE whenever the op is supported
   * for that dtype at all; 0 means "this dtype is not supported". */
  uint32_t (*op_providers)(kiln_backend_device_t *device, kiln_op_kind_t kind, kiln_dtype_t dtype);
  /* (R) Enqueue `op` on `queue` with `provider`. The op struct may be reused
   * by the caller once this returns (copy what you keep). A provider that
   * cannot serve these particular arguments returns KILN_UNSUPPORTED without
   * enqueuing anything, and the core falls back to NATIVE. */
  kiln_status_t (*op_run)(kiln_backend_queue_t *queue, kiln_provider_t provider, const kiln_op_t *op);
} kiln_backend_iface_t;

/* ---- helpers every backend shares (inline: plugins do not link libkiln) ---- */

/* Append one key/value pair to a device description (devinfo -v); what does
 * not fit is dropped (the list is for people). */
static inline void kiln_backend_add_property(kiln_backend_device_desc_t *desc, const char *key,
                                                  const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void kiln_backend_add_property(kiln_backend_device_desc_t *desc, const char *key,
                                                  const char *fmt, ...) {
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
#define KILN_BACKEND_KIND_NAME_(NAME, name) case KILN_OP_##NAME: return #name;
    KILN_OP_KINDS(KILN_BACKEND_KIND_NAME_)
#undef KILN_BACKEND_KIND_NAME_
  default: return "?";
  }
}

static inline const char *kiln_backend_provider_name(kiln_provider_t provider) {
  switch (provider) {
#define KILN_BACKEND_PROVIDER_NAME_(NAME, name) case KILN_PROVIDER_##NAME: return #name;
    KILN_PROVIDERS(KILN_BACKEND_PROVIDER_NAME_)
#undef KILN_BACKEND_PROVIDER_NAME_
  default: return "?";
  }
}

static inline const char *kiln_backend_dtype_name(kiln_dtype_t dtype) {
  switch (dtype) {
  case KILN_F32: return "f32";
  case KILN_I32: return "i32";
  case KILN_F16: return "f16";
  case KILN_BF16: return "bf16";
  default: return "?";
  }
}

/* The dtypes kiln's native kernels serve on every backend, so that the same
 * program runs on any device: f32 everywhere; i32 for the generators, COPY,
 * the integer formulas of ops.def and REDUCE. */
static inline bool kiln_backend_native_supports(kiln_op_kind_t kind, kiln_dtype_t dtype) {
  switch (kind) {
  case KILN_OP_FILL:
  case KILN_OP_ARANGE:
  case KILN_OP_COPY:
  case KILN_OP_UNARY:
  case KILN_OP_BINARY:
  case KILN_OP_BINARY_SCALAR:
  case KILN_OP_REDUCE: return dtype == KILN_F32 || dtype == KILN_I32;
  case KILN_OP_RANDOM:
  case KILN_OP_MATMUL:
  case KILN_OP_SOFTMAX:
  case KILN_OP_CROSS_ENTROPY:
  case KILN_OP_CONV2D:
  case KILN_OP_MAX_POOL2D: return dtype == KILN_F32;
  default: return false;
  }
}

/* Whether kernels/ops.def has an i32 formula for the op (every op has an
 * f32 one: runtime/ops.c checks that at compile time). */
static inline bool kiln_backend_unary_i32_exists(kiln_unary_op_t op) {
  switch (op) {
#define KILN_UNARY_I32(NAME, expr) case KILN_UNARY_##NAME: return true;
#include "kernels/ops.def"
  default: return false;
  }
}

static inline bool kiln_backend_binary_i32_exists(kiln_binary_op_t op) {
  switch (op) {
#define KILN_BINARY_I32(NAME, expr) case KILN_BINARY_##NAME: return true;
#include "kernels/ops.def"
  default: return false;
  }
}

/* Whether kiln's native kernels serve this particular op: its kind and
 * dtypes, the formula of an elementwise op, the reduction's output dtype. The
 * dtype that decides is the input's where there is one (argmax writes i32
 * from f32). */
static inline bool kiln_backend_native_supports_op(const kiln_op_t *op) {
  kiln_dtype_t dtype = op->out.dtype;
  switch (op->kind) {
  case KILN_OP_FILL:
  case KILN_OP_ARANGE:
  case KILN_OP_RANDOM: break;
  case KILN_OP_CROSS_ENTROPY:
    return op->in[0].dtype == KILN_F32 && op->in[1].dtype == KILN_I32 && dtype == KILN_F32;
  default: dtype = op->in[0].dtype; break;
  }
  if (!kiln_backend_native_supports(op->kind, dtype)) return false;
  switch (op->kind) {
  case KILN_OP_UNARY:
    if ((unsigned)op->u.unary.op >= KILN_UNARY_COUNT_) return false;
    return (dtype == KILN_F32 || kiln_backend_unary_i32_exists(op->u.unary.op)) && op->out.dtype == dtype;
  case KILN_OP_BINARY:
  case KILN_OP_BINARY_SCALAR:
    if ((unsigned)op->u.binary.op >= KILN_BINARY_COUNT_) return false;
    if (dtype == KILN_I32 && !kiln_backend_binary_i32_exists(op->u.binary.op)) return false;
    if (op->kind == KILN_OP_BINARY && op->in[1].dtype != dtype) return false;
    return op->out.dtype == dtype;
  case KILN_OP_COPY: return op->out.dtype == dtype;
  case KILN_OP_REDUCE:
    switch (op->u.reduce.op) {
    case KILN_REDUCE_SUM:
    case KILN_REDUCE_MAX: return op->out.dtype == dtype;
    case KILN_REDUCE_ARGMAX: return op->out.dtype == KILN_I32;
    case KILN_REDUCE_MEAN:
    case KILN_REDUCE_NORM: return dtype == KILN_F32 && op->out.dtype == KILN_F32;
    default: return false;
    }
  case KILN_OP_MATMUL:
  case KILN_OP_CONV2D: return op->in[1].dtype == KILN_F32 && op->out.dtype == KILN_F32;
  default: return op->out.dtype == dtype;
  }
}

/* Plugins mark their entry point with this (the project builds with
 * -fvisibility=hidden). */
#define KILN_PLUGIN_EXPORT __attribute__((visibility("default")))

/* The entry point's type. */
typedef const kiln_backend_iface_t *(*kiln_backend_entry_fn)(void);

/* The CPU backend is compiled into libkiln; the registry calls this directly. */
const kiln_backend_iface_t *kiln_cpu_backend_entry(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_RUNTIME_BACKEND_H */
