/* backends/opencl/opencl_backend.h: the OpenCL plugin's private types and the functions its files share. */
#ifndef KILN_BACKENDS_OPENCL_BACKEND_H
#define KILN_BACKENDS_OPENCL_BACKEND_H

/*
 * Layout of the plugin (libkiln-opencl.so):
 *   device.c   the entry point, platform and device enumeration, properties
 *   memory.c   buffers, pinned host staging, reads, writes, copies, fills
 *   queue.c    in-order profiling command queues, events, markers
 *   program.c  the embedded kernel sources: built per device on first use,
 *              program binaries cached through the host's cache, kernel lookup
 *              and kiln_cl_launch
 *   errors.c   the one translator from cl_int and CLBlast codes to kiln codes
 *   ops.c      the table of operation entries: a `native` row for every op
 *              kind (argument packing and launches of the kernels/opencl
 *              sources) and the `clblast` row for matmul
 *   clblast.c  the clblast rows' functions, CLBlast loaded with dlopen
 *
 * State lives in the context initialize() returns (kiln_backend_context_t);
 * devices point back to it, and queues, buffers and events reach it through
 * their device. Nothing is kept in process globals but the test exports'
 * list of live contexts (program.c).
 *
 * OpenCL 1.2 is the baseline on the host side as in the kernels: nothing here
 * calls a 2.0 entry point, so every ICD (PoCL, NVIDIA, AMD, Intel, Oclgrind)
 * serves it.
 */

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/backend.h"

/* ---- programs ----------------------------------------------------------------
 * One program per file of kernels/opencl/, each embedded at build time as
 * prelude.cl + that file (with kernels/ops.def and kernels/philox.h inlined
 * where the file includes them), so a process builds only what it uses: the
 * first matmul builds `gemm`, not the elementwise table. The build generates
 * kiln_cl_source_<name>[] and kiln_cl_source_<name>_size (text, NUL-terminated)
 * for each. */
#define KILN_CL_PROGRAMS(X) X(copy) X(elementwise) X(select) X(reduce) X(nn) X(gemm) X(gemm_dtypes) X(conv) X(random) X(update) X(index)

typedef enum kiln_cl_program_t {
#define KILN_CL_PROGRAM_ENUM_(name) KILN_CL_PROGRAM_##name,
  KILN_CL_PROGRAMS(KILN_CL_PROGRAM_ENUM_)
#undef KILN_CL_PROGRAM_ENUM_
  KILN_CL_PROGRAM_COUNT
} kiln_cl_program_t;

#define KILN_CL_SOURCE_DECL_(name)                                                                 \
  extern const unsigned char kiln_cl_source_##name[];                                              \
  extern const size_t kiln_cl_source_##name##_size;
KILN_CL_PROGRAMS(KILN_CL_SOURCE_DECL_)
#undef KILN_CL_SOURCE_DECL_

/* A built program of one device, and the kernels created from it so far. */
typedef struct kiln_cl_kernel_entry_t {
  char name[64];
  cl_kernel kernel;
  size_t work_group_size; /* CL_KERNEL_WORK_GROUP_SIZE on this device */
} kiln_cl_kernel_entry_t;

/* The kernel of an op (kind, formula, dtypes), found by name at first use
 * (program.c, kiln_cl_op_kernel) and kept per device. */
typedef struct kiln_cl_op_kernel_t {
  uint32_t key; /* 0: empty */
  const kiln_cl_kernel_entry_t *entry;
} kiln_cl_op_kernel_t;
#define KILN_CL_OP_KERNEL_SLOTS 1024 /* a power of two: program.c hashes into it by a shift */

#define KILN_CL_MAX_KERNELS_PER_PROGRAM 512

typedef struct kiln_cl_program_state_t {
  cl_program program;  /* NULL until built */
  kiln_status_t build_status; /* KILN_OK, or the failure kept (with build_error) so it is not retried */
  char *build_error;   /* malloc'ed message with the build log, when build_status != OK */
  char *cache_key;     /* malloc'ed: the program's key in the cache, when it came from there */
  size_t kernel_count;
  kiln_cl_kernel_entry_t kernels[KILN_CL_MAX_KERNELS_PER_PROGRAM];
} kiln_cl_program_state_t;

/* The vendor behind a device, for the identity queries and workarounds. */
typedef enum kiln_cl_vendor_t {
  KILN_CL_VENDOR_OTHER = 0,
  KILN_CL_VENDOR_NVIDIA,
  KILN_CL_VENDOR_AMD,
  KILN_CL_VENDOR_INTEL,
  KILN_CL_VENDOR_POCL,
  KILN_CL_VENDOR_OCLGRIND,
} kiln_cl_vendor_t;

struct kiln_backend_device_t {
  kiln_backend_context_t *ctx; /* the context the device belongs to */
  size_t index;              /* kiln's index within this backend */
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;        /* one context per device */
  kiln_cl_vendor_t vendor;
  cl_device_type cl_type;
  bool is_cpu;               /* CL_DEVICE_TYPE_CPU (PoCL's pthread device) */
  /* Limits kernels are launched with; never assume a warp or wavefront width. */
  size_t max_work_group_size;
  size_t max_work_item_sizes[3];
  cl_ulong local_mem_size;   /* 0 when the device has no dedicated local memory */
  bool local_mem_is_global;  /* CL_GLOBAL: tiles in local memory buy nothing */
  cl_uint compute_units;
  cl_uint mem_base_addr_align; /* bytes */
  cl_ulong max_alloc;
  cl_ulong cache_size;       /* CL_DEVICE_GLOBAL_MEM_CACHE_SIZE: the last-level cache on CPUs; 0 if unknown */
  bool fp16, fp64;
  /* Why f64 is refused here (no cl_khr_fp64), for the core's message. */
  char fp64_why[384];
  /* A queue of the plugin's own for mapping pinned staging memory and for the
   * source side of copies between devices (device.c creates it). */
  cl_command_queue internal_queue;
  /* The cache key prefix: platform, device, driver version (program.c adds the
   * source hash and options). */
  char cache_identity[768];
  kiln_backend_device_desc_t desc;
  /* Programs, built on first use under program_lock; kernels are looked up
   * under it too. Launches lock launch_lock around clSetKernelArg + enqueue,
   * because a cl_kernel's arguments are shared state. */
  pthread_mutex_t program_lock;
  kiln_cl_program_state_t programs[KILN_CL_PROGRAM_COUNT];
  kiln_cl_op_kernel_t op_kernels[KILN_CL_OP_KERNEL_SLOTS]; /* open addressing, under program_lock */
  pthread_mutex_t launch_lock;
};

struct kiln_backend_buffer_t {
  kiln_backend_device_t *device;
  cl_mem mem;  /* NULL for size 0; retained when wrapped (a DLPack import) */
  size_t size;
};

struct kiln_backend_queue_t {
  kiln_backend_device_t *device;
  cl_command_queue queue; /* in order, CL_QUEUE_PROFILING_ENABLE */
  /* The first asynchronous error since the last finish (queue_finish returns
   * and clears it), with its message. */
  pthread_mutex_t lock;
  kiln_status_t async_status;
  char async_error[512];
};

struct kiln_backend_event_t {
  kiln_backend_device_t *device;
  cl_event event; /* a marker with profiling information */
  /* The queue the marker was enqueued on, retained: a wait must flush it,
   * and the application may release the kiln queue before the event. */
  cl_command_queue queue;
};

/* ---- the context (device.c) ------------------------------------------------------ */

/* The build's counters, for tests (through the plugin's exported
 * kiln_cl_debug_counters) and devinfo -v. */
typedef struct kiln_cl_counters_t {
  uint64_t builds_from_source;
  uint64_t builds_from_binary; /* loaded from the cache */
  uint64_t cache_rejected;     /* a cached binary the driver refused: rebuilt from source */
} kiln_cl_counters_t;

typedef struct kiln_cl_clblast_t kiln_cl_clblast_t; /* clblast.c */
typedef struct kiln_cl_pinned_t kiln_cl_pinned_t;   /* memory.c */

struct kiln_backend_context_t {
  /* The core's table, copied (what the core's `size` covers; the rest zero). */
  kiln_host_t host;
  size_t device_count;
  kiln_backend_device_t *devices; /* device_count of them, in platform order */
  /* The versions initialize found ("OpenCL ICD Loader 2.3.1; platform
   * OpenCL 3.0 PoCL 3.1; CLBlast 1.5.3"): version_text() and its log line. */
  char summary[512];
  /* CLBlast, loaded once by initialize (never NULL after it; `loaded` says
   * whether it can run). */
  kiln_cl_clblast_t *clblast;
  /* Pinned host staging handed out and not yet freed, so host_free finds the
   * cl_mem of a pointer and deinitialize frees what is left. */
  pthread_mutex_t pinned_lock;
  kiln_cl_pinned_t *pinned;
  /* Program builds (program.c). */
  _Atomic uint64_t builds_from_source, builds_from_binary, cache_rejected;
  /* The list of live contexts the test exports act on (program.c). */
  kiln_backend_context_t *debug_next;
  /* Scratch bytes a round of batched GEMM or convolution work may take; 0
   * for the default (ops.h). Set only by a test export, so that tests reach
   * the rounds without tensors of hundreds of megabytes. */
  _Atomic size_t scratch_budget;
  /* The GEMM path: 0 chooses per device, 1 forces the packed path, 2 the
   * tiled path where the device can run it. Set only by a test export, so
   * that every device runs both paths' kernels (Oclgrind's checker among
   * them). */
  _Atomic int gemm_path;
};

/* ---- errors (errors.c): the one translator ------------------------------------ */

/* Set the calling thread's kiln error through the host and return status. */
kiln_status_t kiln_cl_error(kiln_backend_context_t *ctx, kiln_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The calling thread's current message, through the host ("" when none). */
const char *kiln_cl_last_error(const kiln_backend_context_t *ctx);
/* KILN_OK for CL_SUCCESS; otherwise sets and returns the kiln code for `err`
 * (CL_OUT_OF_RESOURCES / CL_MEM_OBJECT_ALLOCATION_FAILURE / CL_OUT_OF_HOST_MEMORY
 * -> KILN_OUT_OF_MEMORY or KILN_OUT_OF_RESOURCES, and so on), with a message naming the call
 * (printf-style) and the cl_int's name ("CL_INVALID_WORK_GROUP_SIZE (-54)"). */
kiln_status_t kiln_cl_check(kiln_backend_context_t *ctx, cl_int err, const char *call_fmt, ...)
    __attribute__((format(printf, 3, 4)));
kiln_status_t kiln_cl_status_of(cl_int err);
/* "CL_OUT_OF_RESOURCES"; never NULL. */
const char *kiln_cl_error_name(cl_int err);
/* CLBlast's status codes (CLBlastStatusCode, an int): the same translation,
 * with CLBlast's own name for its codes ("CLBlastInvalidLeadDimA"); arguments
 * CLBlast refuses come back as KILN_UNSUPPORTED, so the core runs native. */
kiln_status_t kiln_cl_clblast_check(kiln_backend_context_t *ctx, int status, const char *call_fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *kiln_cl_clblast_status_name(int status);

/* ---- programs and launches (program.c) ------------------------------------------ */

/* A kernel argument: every kiln kernel takes four buffers (the cl_mem of a
 * kiln buffer, NULL for an empty one) and then the op's record, which holds
 * each operand's element offset: sub-buffers would need
 * CL_DEVICE_MEM_BASE_ADDR_ALIGN alignment that views do not have. */
typedef enum kiln_cl_arg_kind_t {
  KILN_CL_ARG_MEM, /* __global pointer: a cl_mem (may be NULL) */
  KILN_CL_ARG_KOP, /* the op's record, kiln_kop_t, by value */
} kiln_cl_arg_kind_t;

typedef struct kiln_cl_arg_t {
  kiln_cl_arg_kind_t kind;
  union {
    cl_mem mem;
    const kiln_kop_t *kop;
  } v;
} kiln_cl_arg_t;

#define KILN_CL_MEM(x) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_MEM, .v.mem = (x)})
#define KILN_CL_KOP(k) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_KOP, .v.kop = (k)})

/* Build `program` for the device if it is not built yet: from the cache when
 * an entry matches (platform, device, driver version, source hash, options),
 * otherwise from source, storing the binary. A failed build returns
 * KILN_BUILD_FAILED with the build log in the
 * message; the failure is kept, so later launches fail the same way at once. */
kiln_status_t kiln_cl_program_get(kiln_backend_device_t *device, kiln_cl_program_t program, cl_program *out_program);

/* The kernel `name` of `program` on the device, created once and kept;
 * *out_entry stays valid until the plugin is unloaded. A kernel the program
 * lacks: KILN_UNSUPPORTED naming it. */
kiln_status_t kiln_cl_kernel_get(kiln_backend_device_t *device, kiln_cl_program_t program, const char *name,
                                 const kiln_cl_kernel_entry_t **out_entry);

/* The kernel of an op kind's row: <name>[_<FORMULA>]_<in[0] dtype>_<out
 * dtype> (no input: <name>_<out dtype>) in the program whose source lists
 * the kind on its "kiln-kinds:" line; looked up once per (kind, formula,
 * dtypes) and device, then from a table. KILN_UNSUPPORTED naming the
 * kernel when no program has it. */
kiln_status_t kiln_cl_op_kernel(kiln_backend_device_t *device, const kiln_op_t *op,
                                const kiln_cl_kernel_entry_t **out_entry);

/* kiln_cl_launch for a kernel already looked up. */
kiln_status_t kiln_cl_launch_entry(kiln_backend_queue_t *queue, const kiln_cl_kernel_entry_t *entry,
                                   cl_uint work_dim, const size_t *global, const size_t *local, size_t arg_count,
                                   const kiln_cl_arg_t *args);

/* Set the arguments and enqueue an NDRange of `kernel` on the queue, atomically
 * with respect to other launches of the device. global[d] must be a multiple of
 * local[d] when local is not NULL (the caller rounds up and the kernel checks
 * its bounds); local NULL lets the driver choose. No event is returned: queues
 * are in order, and timing uses markers. */
kiln_status_t kiln_cl_launch(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                             cl_uint work_dim, const size_t *global, const size_t *local, size_t arg_count,
                             const kiln_cl_arg_t *args);

/* The context's build counters. */
void kiln_cl_counters_read(const kiln_backend_context_t *ctx, kiln_cl_counters_t *out_counters);

/* Release every program and kernel of the device. */
void kiln_cl_programs_release(kiln_backend_device_t *device);

/* The options every program is built with on the device: "-cl-std=CL1.2",
 * -D flags for the device's optional features (KILN_CL_FP64, KILN_CL_FP16:
 * 0 or 1) and for KILN_CL_ROW_RUNS (1 on CPUs: row kernels give each
 * work-item a contiguous run), then KILN_OPENCL_BUILD_OPTIONS when set. */
void kiln_cl_build_options(const kiln_backend_device_t *device, char *out, size_t out_size);

/* Exported for the tests (found with dlsym on the loaded plugin), acting on
 * the context initialized last among those alive:
 *   void kiln_cl_debug_counters(kiln_cl_counters_t *out);
 *   kiln_status_t kiln_cl_debug_program_build(size_t device_index, const char *program_name);
 *   void kiln_cl_debug_scratch_budget(size_t bytes);
 *   void kiln_cl_debug_gemm_path(int path);
 * the second builds one program ("copy", "gemm", ...) of opencl:<device_index>
 * as the first launch would, so the cache is tested without any op; the
 * third sets the scratch budget of a round of batches (0: the default), so
 * that a test of small tensors runs the convolutions in several rounds; the
 * fourth forces a GEMM path (0: per device, 1: packed, 2: tiled).
 * initialize and deinitialize add the context to and drop it from their list. */
void kiln_cl_debug_register(kiln_backend_context_t *ctx);
void kiln_cl_debug_unregister(kiln_backend_context_t *ctx);

/* ---- devices, buffers and queues: the interface's slots (memory.c, queue.c) ---- */

kiln_status_t kiln_cl_buffer_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                      kiln_backend_buffer_t **out_buffer);
void kiln_cl_buffer_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_buffer_t *buffer);
/* DLPack: kDLOpenCL with kiln's index of the device; the cl_mem as handle. */
void kiln_cl_dlpack_device(kiln_backend_context_t *ctx, kiln_backend_device_t *device, int32_t *out_type,
                           int32_t *out_id);
void *kiln_cl_buffer_handle(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer);
kiln_status_t kiln_cl_buffer_wrap(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *handle, size_t size,
                                  kiln_backend_buffer_t **out_buffer);
kiln_status_t kiln_cl_host_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                    void **out_ptr);
void kiln_cl_host_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *ptr);
kiln_status_t kiln_cl_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_buffer_t *buffer, size_t offset, const void *host, size_t size,
                                   bool blocking);
kiln_status_t kiln_cl_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  kiln_backend_buffer_t *buffer, size_t offset, void *host, size_t size, bool blocking);
kiln_status_t kiln_cl_buffer_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_backend_buffer_t *src,
                                  size_t src_offset, kiln_backend_buffer_t *dst, size_t dst_offset, size_t size);
kiln_status_t kiln_cl_buffer_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  kiln_backend_buffer_t *buffer, size_t offset, size_t size, const void *pattern,
                                  size_t pattern_size);
/* Free what host_allocate handed out and was never freed (deinitialize). */
void kiln_cl_host_release_all(kiln_backend_context_t *ctx);

kiln_status_t kiln_cl_queue_create(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                   kiln_backend_queue_t **out_queue);
void kiln_cl_queue_destroy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
kiln_status_t kiln_cl_queue_finish(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
kiln_status_t kiln_cl_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_event_t **out_event);
kiln_status_t kiln_cl_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                 kiln_backend_event_t *event);
kiln_status_t kiln_cl_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
kiln_status_t kiln_cl_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
kiln_status_t kiln_cl_event_elapsed(kiln_backend_context_t *ctx, kiln_backend_event_t *start,
                                    kiln_backend_event_t *end, double *out_ms);
void kiln_cl_event_release(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
/* Keep the first asynchronous error of a queue for queue_finish. */
void kiln_cl_queue_note_error(kiln_backend_queue_t *queue, kiln_status_t status, const char *message);

/* ---- memory (memory.c) -------------------------------------------------------- */

/* Scratch memory for one operation: released with clReleaseMemObject right
 * after the work that uses it was enqueued (OpenCL keeps it alive until that
 * work completes). KILN_OUT_OF_MEMORY with a message when it fails. */
kiln_status_t kiln_cl_scratch_create(kiln_backend_device_t *device, size_t size, cl_mem *out_mem);

/* ---- the table of operations (ops.c) ------------------------------------------- */

/* A `native` row for every kind of KILN_OP_KINDS, then the `clblast` row for
 * matmul, ending with KILN_OP_TABLE_END. */
extern const kiln_op_entry_t kiln_cl_ops[];

/* ---- CLBlast (clblast.c) ----------------------------------------------------------- */

/* dlopen libclblast.so.1 for the context (initialize): ctx->clblast says
 * whether it loaded and, if not, the loader's message. KILN_OUT_OF_MEMORY
 * only when the record cannot be allocated. */
kiln_status_t kiln_cl_clblast_load(kiln_backend_context_t *ctx);
bool kiln_cl_clblast_available(const kiln_backend_context_t *ctx);
/* "libclblast.so.1 loaded (...)" or "absent: <the loader's message>". */
const char *kiln_cl_clblast_state(const kiln_backend_context_t *ctx);
/* Empty CLBlast's program cache (it holds our contexts) and free the record. */
void kiln_cl_clblast_unload(kiln_backend_context_t *ctx);
/* The `clblast` row of matmul. supports: with op NULL, whether CLBlast
 * loaded; with an op, whether CLBlast takes it (f32, no empty dimension).
 * run: C = op(A) @ op(B) per batch through CLBlastSgemm /
 * CLBlastSgemmStridedBatched on the queue; KILN_UNSUPPORTED for arguments
 * CLBlast refuses at run time (the core then runs native). */
bool kiln_cl_clblast_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                              const kiln_op_entry_t *entry, const kiln_op_t *op);
kiln_status_t kiln_cl_clblast_run(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op);

#endif /* KILN_BACKENDS_OPENCL_BACKEND_H */
