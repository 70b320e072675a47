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
 *   errors.c   the one translator from cl_int to kiln codes
 *   ops.c      which providers serve each op, and the native provider: argument
 *              packing and launches of kernels/opencl/*.cl
 *   clblast.c  the clblast provider for matmul, CLBlast loaded with dlopen
 *
 * OpenCL 1.2 is the baseline on the host side as in the kernels: nothing here
 * calls a 2.0 entry point, so every ICD (PoCL, NVIDIA, AMD, Intel, Oclgrind)
 * serves it.
 */

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <pthread.h>
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
#define KILN_CL_PROGRAMS(X) X(copy) X(elementwise) X(reduce) X(nn) X(gemm) X(conv) X(random)

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
  const char *name; /* the caller's string (a literal): compared by pointer first */
  cl_kernel kernel;
  size_t work_group_size; /* CL_KERNEL_WORK_GROUP_SIZE on this device */
} kiln_cl_kernel_entry_t;

#define KILN_CL_MAX_KERNELS_PER_PROGRAM 96

typedef struct kiln_cl_program_state_t {
  cl_program program;  /* NULL until built */
  kiln_status_t build_status; /* KILN_OK, or the failure kept (with build_error) so it is not retried */
  char *build_error;   /* malloc'ed message with the build log, when build_status != OK */
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
  bool fp16, fp64;
  /* The cache key prefix: platform, device, driver version (program.c adds the
   * source hash and options). */
  char cache_identity[768];
  kiln_backend_device_desc_t desc;
  /* Programs, built on first use under program_lock; kernels are looked up
   * under it too. Launches lock launch_lock around clSetKernelArg + enqueue,
   * because a cl_kernel's arguments are shared state. */
  pthread_mutex_t program_lock;
  kiln_cl_program_state_t programs[KILN_CL_PROGRAM_COUNT];
  pthread_mutex_t launch_lock;
};

struct kiln_backend_buffer_t {
  kiln_backend_device_t *device;
  cl_mem mem;  /* NULL for size 0 */
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
};

/* ---- shared state (device.c) ------------------------------------------------- */

extern kiln_host_t kiln_cl_host;
extern size_t kiln_cl_device_count_;
extern kiln_backend_device_t *kiln_cl_devices_;

/* ---- errors (errors.c): the one translator ------------------------------------ */

/* Set the calling thread's kiln error through the host and return status. */
kiln_status_t kiln_cl_error(kiln_status_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* KILN_OK for CL_SUCCESS; otherwise sets and returns the kiln code for `err`
 * (CL_OUT_OF_RESOURCES / CL_MEM_OBJECT_ALLOCATION_FAILURE / CL_OUT_OF_HOST_MEMORY
 * -> KILN_OUT_OF_MEMORY or KILN_OUT_OF_RESOURCES, and so on), with a message naming the call
 * (printf-style) and the cl_int's name ("CL_INVALID_WORK_GROUP_SIZE (-54)"). */
kiln_status_t kiln_cl_check(cl_int err, const char *call_fmt, ...) __attribute__((format(printf, 2, 3)));
kiln_status_t kiln_cl_status_of(cl_int err);
/* "CL_OUT_OF_RESOURCES"; never NULL. */
const char *kiln_cl_error_name(cl_int err);

/* ---- programs and launches (program.c) ------------------------------------------ */

/* A kernel argument. Buffers are passed as the cl_mem of a kiln buffer (NULL
 * for an empty one) plus, by convention of every kernel, a separate `long`
 * element offset argument: sub-buffers would need CL_DEVICE_MEM_BASE_ADDR_ALIGN
 * alignment that views do not have. */
typedef enum kiln_cl_arg_kind_t {
  KILN_CL_ARG_MEM,   /* __global pointer: a cl_mem (may be NULL) */
  KILN_CL_ARG_INT,   /* int (cl_int) */
  KILN_CL_ARG_UINT,  /* uint (cl_uint) */
  KILN_CL_ARG_LONG,  /* long (cl_long) */
  KILN_CL_ARG_ULONG, /* ulong (cl_ulong) */
  KILN_CL_ARG_FLOAT, /* float (cl_float) */
  KILN_CL_ARG_LOCAL, /* __local memory of `local_bytes` bytes */
} kiln_cl_arg_kind_t;

typedef struct kiln_cl_arg_t {
  kiln_cl_arg_kind_t kind;
  union {
    cl_mem mem;
    cl_int i;
    cl_uint u;
    cl_long l;
    cl_ulong ul;
    cl_float f;
    size_t local_bytes;
  } v;
} kiln_cl_arg_t;

#define KILN_CL_MEM(x) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_MEM, .v.mem = (x)})
#define KILN_CL_INT(x) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_INT, .v.i = (cl_int)(x)})
#define KILN_CL_UINT(x) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_UINT, .v.u = (cl_uint)(x)})
#define KILN_CL_LONG(x) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_LONG, .v.l = (cl_long)(x)})
#define KILN_CL_ULONG(x) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_ULONG, .v.ul = (cl_ulong)(x)})
#define KILN_CL_FLOAT(x) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_FLOAT, .v.f = (cl_float)(x)})
#define KILN_CL_LOCAL(bytes) ((kiln_cl_arg_t){.kind = KILN_CL_ARG_LOCAL, .v.local_bytes = (bytes)})

/* Build `program` for the device if it is not built yet: from the cache when
 * an entry matches (platform, device, driver version, source hash, options),
 * otherwise from source, storing the binary. A failed build returns
 * KILN_BUILD_FAILED with the build log in the
 * message; the failure is kept, so later launches fail the same way at once. */
kiln_status_t kiln_cl_program_get(kiln_backend_device_t *device, kiln_cl_program_t program, cl_program *out_program);

/* The kernel `name` (a string literal) of `program` on the device, created
 * once and kept; *out_entry stays valid until the plugin is unloaded. */
kiln_status_t kiln_cl_kernel_get(kiln_backend_device_t *device, kiln_cl_program_t program, const char *name,
                                 const kiln_cl_kernel_entry_t **out_entry);

/* Set the arguments and enqueue an NDRange of `kernel` on the queue, atomically
 * with respect to other launches of the device. global[d] must be a multiple of
 * local[d] when local is not NULL (the caller rounds up and the kernel checks
 * its bounds); local NULL lets the driver choose. No event is returned: queues
 * are in order, and timing uses markers. */
kiln_status_t kiln_cl_launch(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                             cl_uint work_dim, const size_t *global, const size_t *local, size_t arg_count,
                             const kiln_cl_arg_t *args);

/* The build's counters, for tests (through the plugin's exported
 * kiln_cl_debug_counters) and devinfo -v. */
typedef struct kiln_cl_counters_t {
  uint64_t builds_from_source;
  uint64_t builds_from_binary; /* loaded from the cache */
  uint64_t cache_rejected;     /* a cached binary the driver refused: rebuilt from source */
} kiln_cl_counters_t;
void kiln_cl_counters_read(kiln_cl_counters_t *out_counters);

/* Release every program and kernel of the device. */
void kiln_cl_programs_release(kiln_backend_device_t *device);

/* ---- memory (memory.c) -------------------------------------------------------- */

/* Scratch memory for one operation: released with clReleaseMemObject right
 * after the work that uses it was enqueued (OpenCL keeps it alive until that
 * work completes). KILN_OUT_OF_MEMORY with a message when it fails. */
kiln_status_t kiln_cl_scratch_create(kiln_backend_device_t *device, size_t size, cl_mem *out_mem);

/* ---- ops (ops.c) -------------------------------------------------------------- */

uint32_t kiln_cl_op_providers(kiln_backend_device_t *device, kiln_op_kind_t kind, kiln_dtype_t dtype);
kiln_status_t kiln_cl_op_run(kiln_backend_queue_t *queue, kiln_provider_t provider, const kiln_op_t *op);

/* ---- the clblast provider (clblast.c) ------------------------------------------- */

/* dlopen libclblast.so.1 once; false with the loader's message when absent. */
bool kiln_cl_clblast_load(char *out_reason, size_t reason_size);
bool kiln_cl_clblast_available(void);
/* C = op(A) @ op(B) per batch through CLBlastSgemm / CLBlastSgemmStridedBatched
 * on the queue; KILN_UNSUPPORTED for arguments it cannot serve (the core then
 * runs native). */
kiln_status_t kiln_cl_clblast_matmul(kiln_backend_queue_t *queue, const kiln_op_t *op);
void kiln_cl_clblast_unload(void);

#endif /* KILN_BACKENDS_OPENCL_BACKEND_H */
