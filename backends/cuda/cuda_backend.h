/* backends/cuda/cuda_backend.h: the CUDA plugin's private types and the functions its files share. */
#ifndef KILN_BACKENDS_CUDA_BACKEND_H
#define KILN_BACKENDS_CUDA_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

/* Imported weakly: it is newer than every other entry point the plugin
 * uses (CUDA 12.8), so a plugin linked against it would fail to load on an
 * older driver with only "undefined symbol: cuEventElapsedTime_v2". Weak,
 * the plugin loads, and initialize says which driver it needs
 * (kiln_cuda_driver_check). */
#pragma weak cuEventElapsedTime_v2

#include "runtime/backend.h"
#include "kernels/cuda/launch.h"

/* A kernel of the embedded fatbin, looked up by name at its first use on a
 * device and kept in the device's table (module.c): a kind's kernel keyed
 * by (kind, formula, dtypes), a planner's by its name. Entries never move,
 * so a pointer to one stays valid while the device is open. */
typedef struct kiln_cuda_function_t {
  uint64_t key;
  CUfunction fn; /* NULL: a free slot */
  char name[64];
} kiln_cuda_function_t;
/* Slots per device: the fatbin holds about 260 kernels, and CAST, WHERE and
 * COMPARE take a slot per dtype pair (about 280 more) for one kernel each. */
#define KILN_CUDA_KERNEL_SLOTS 1024

/* The function-pointer tables of the libraries loaded at run time
 * (cublas.c, cudnn.c). */
typedef struct kiln_cuda_cublas_t kiln_cuda_cublas_t;
typedef struct kiln_cuda_cudnn_t kiln_cuda_cudnn_t;

/* The CUDA version the plugin needs of the driver (cuDriverGetVersion): it
 * imports cuEventElapsedTime_v2, new in CUDA 12.8. */
#define KILN_CUDA_DRIVER_MIN 12080

/* KILN_CUDA_VENDOR_LIBS: which vendor libraries the plugin may load. */
#define KILN_CUDA_VENDOR_CUBLAS 1u
#define KILN_CUDA_VENDOR_CUDNN 2u

/* Page-locked host memory kept for reuse (memory.c): host_allocate's
 * staging blocks and the staging of non-blocking transfers from pageable
 * memory. Blocks come in power-of-two classes from 64 KiB to 64 MiB (larger
 * requests are allocated and freed as they come); at most
 * KILN_CUDA_HOST_CACHE_BYTES stay cached. Blocks may be handed back from a
 * driver callback (cuLaunchHostFunc), which must not call CUDA: they are
 * queued and freed by the next ordinary call. */
#define KILN_CUDA_HOST_CLASSES 11
#define KILN_CUDA_HOST_CACHE_BYTES ((size_t)256 << 20)
typedef struct kiln_cuda_host_block_t kiln_cuda_host_block_t;
typedef struct kiln_cuda_host_cache_t {
  pthread_mutex_t lock;
  kiln_cuda_host_block_t *free[KILN_CUDA_HOST_CLASSES];
  kiln_cuda_host_block_t *doomed; /* over the cap: freed outside callbacks */
  size_t cached_bytes;
} kiln_cuda_host_cache_t;

/* The most architectures KILN_CUDA_ARCHS (the nvcc_archs option) lists. */
#define KILN_CUDA_MAX_ARCHS 16

/* Everything the plugin knows between initialize and deinitialize: the
 * backend's context, given back by the core to every slot, and reached from
 * a device (and so from a queue or event) through its back pointer. Written
 * during initialize only; read-only afterwards, so any thread may read it. */
struct kiln_backend_context_t {
  kiln_host_t host; /* the core's table, copied (as much of it as the core has) */
  /* KILN_CUDA_TF32=1 lets cuBLAS and cuDNN use TF32 tensor cores for f32. */
  bool tf32;
  /* KILN_CUDA_VENDOR_LIBS as bits (KILN_CUDA_VENDOR_*), and its text. */
  unsigned vendor_libs;
  char vendor_libs_text[64];
  int driver_version; /* cuDriverGetVersion: 13000 */
  size_t device_count;
  kiln_backend_device_t *devices;
  /* The vendor libraries: NULL when absent. The state is what devinfo -v
   * shows: the version, or "absent: <why>". */
  kiln_cuda_cublas_t *cublas;
  kiln_cuda_cudnn_t *cudnn;
  char cublas_version[64], cudnn_version[64];
  char cublas_state[384], cudnn_state[384];
  /* The files they were loaded from (dladdr), for devinfo and kiln-bench. */
  char cublas_path[512], cudnn_path[512];
  kiln_cuda_host_cache_t host_cache;
  /* The SASS architectures of the fatbin, parsed from KILN_CUDA_ARCHS
   * (module.c), and "sm_75,...,sm_90 + compute_90 PTX". */
  int archs[KILN_CUDA_MAX_ARCHS];
  int arch_count;
  char arch_text[256];
  /* "CUDA driver 13.0, toolkit 13.0; cuBLAS 13.0.0; cuDNN 9.19.0", logged at
   * start-up. */
  char version_text[256];
};

struct kiln_backend_device_t {
  kiln_backend_context_t *ctx; /* the context that owns the device */
  int ordinal;
  kiln_status_t open_status;  /* KILN_OK, or why the device cannot be used */
  char open_error[512];
  CUdevice device;
  CUcontext context; /* the primary context, retained */
  int cc_major, cc_minor;
  int sm_count;
  bool pools;                 /* stream-ordered allocation works here */
  CUmemoryPool pool;          /* kiln's own pool on this device (cuMemPoolCreate) */
  CUstream alloc_stream;      /* buffers for any queue are allocated here, and all freed */
  uint64_t ctx_peer_from;     /* without pools: devices granted context peer access (bit = ordinal) */
  /* Events for reuse (queue.c), each a pair: one without timing for waits,
   * one with it for event_elapsed. */
  pthread_mutex_t event_lock;
  kiln_backend_event_t *free_events;
  size_t live_events;
  CUmodule module;            /* NULL when the fatbin has no code for it */
  char module_error[384];     /* why not */
  pthread_mutex_t kernel_lock;  /* guards kernels */
  kiln_cuda_function_t kernels[KILN_CUDA_KERNEL_SLOTS];
  int max_grid;               /* blocks launched at most per grid-stride kernel */
  kiln_backend_device_desc_t desc;
  /* cuDNN's per-shape plans and refusals (cudnn.c), with their own lock. */
  void *cudnn_cache;
  /* A vendor library that could not start on this device at run time (its
   * handle, a sub-library): its rows serve no more here. */
  atomic_bool cublas_failed, cudnn_failed;
};

struct kiln_backend_buffer_t {
  kiln_backend_device_t *device;
  CUdeviceptr ptr; /* 0 for size 0 */
  size_t size;
  bool pooled;     /* from the pool: freed with cuMemFreeAsync */
  bool wrapped;    /* another's memory (a DLPack import): never freed here */
};

struct kiln_backend_queue_t {
  kiln_backend_device_t *device;
  CUstream stream;
  /* The vendor handles bound to this stream, created on first use; a lock
   * because calls on one queue may come from several threads. */
  pthread_mutex_t lock;
  void *cublas;
  void *cudnn;
};

struct kiln_backend_event_t {
  kiln_backend_device_t *device;
  CUevent sync;   /* CU_EVENT_DISABLE_TIMING: waits, queries, synchronisation */
  CUevent timing; /* the default flags: event_elapsed */
  kiln_backend_event_t *next_free;
};

/* ---- devices (device.c) ------------------------------------------------------ */

/* The embedded fatbin (generated by scripts/embed.py at build time). */
extern const unsigned char kiln_cuda_fatbin[];
extern const size_t kiln_cuda_fatbin_size;

/* Make the device's primary context current on this thread for the span of
 * one call, and restore whatever the thread had (the application may use
 * CUDA itself). Returns KILN_OK or an error already set. */
kiln_status_t kiln_cuda_enter(kiln_backend_device_t *device);
void kiln_cuda_leave(void);

/* ---- errors (errors.c): the one translator ---------------------------------- */

/* Set the calling thread's kiln error through the host and return status.
 * The message is formatted here first, so it may quote the current one
 * (ctx->host.last_error()). */
kiln_status_t kiln_cuda_error(kiln_backend_context_t *ctx, kiln_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* KILN_OK for CUDA_SUCCESS; otherwise sets and returns the kiln code for
 * `result`, with a message naming the call (printf-style) and the
 * CUresult's name and description. */
kiln_status_t kiln_cuda_check(kiln_backend_context_t *ctx, CUresult result, const char *call_fmt, ...)
    __attribute__((format(printf, 3, 4)));
kiln_status_t kiln_cuda_status_of(CUresult result);
/* "CUDA_ERROR_OUT_OF_MEMORY"; never NULL. */
const char *kiln_cuda_result_name(CUresult result);
/* The same for cuBLAS and cuDNN status values (ints of their enums). */
kiln_status_t kiln_cuda_cublas_check(kiln_backend_context_t *ctx, int status, const char *call_fmt, ...)
    __attribute__((format(printf, 3, 4)));
kiln_status_t kiln_cuda_cudnn_check(kiln_backend_context_t *ctx, int status, const char *name, const char *call_fmt,
                                    ...) __attribute__((format(printf, 4, 5)));

/* ---- modules (module.c) ----------------------------------------------------- */

/* Parse KILN_CUDA_ARCHS into ctx->archs and ctx->arch_text. */
void kiln_cuda_archs_parse(kiln_backend_context_t *ctx);
/* Load the fatbin into the device's context and look up every kernel. A
 * device the fatbin cannot serve keeps module NULL and module_error. */
void kiln_cuda_module_load(kiln_backend_device_t *device);
void kiln_cuda_module_unload(kiln_backend_device_t *device);
/* "" when SASS covers the device, else a warning sentence. */
void kiln_cuda_coverage_warning(const kiln_backend_context_t *ctx, int major, int minor, char *out, size_t out_size);
/* The kernel named `name` on the device (loaded at first use), and the
 * kernel of op's kind: kiln_<kind>[_<FORMULA>]_<in[0] dtype>_<out dtype>,
 * or kiln_<kind>_<out dtype> without inputs. KILN_UNSUPPORTED, naming the
 * kernel, when the fatbin has none of that name. */
kiln_status_t kiln_cuda_kernel(kiln_backend_device_t *device, const char *name, const kiln_cuda_function_t **out);
kiln_status_t kiln_cuda_kind_kernel(kiln_backend_device_t *device, const kiln_op_t *op,
                                    const kiln_cuda_function_t **out);
/* Launch a kernel on the queue's stream with the record `k` (copied by the
 * launch); _named looks the kernel up first; _flat is a grid-stride launch
 * over n items. */
kiln_status_t kiln_cuda_launch(kiln_backend_queue_t *queue, const kiln_cuda_function_t *kernel, unsigned grid_x,
                               unsigned grid_y, unsigned grid_z, unsigned block, const kiln_kop_t *k);
kiln_status_t kiln_cuda_launch_named(kiln_backend_queue_t *queue, const char *name, unsigned grid_x,
                                     unsigned grid_y, unsigned grid_z, unsigned block, const kiln_kop_t *k);
kiln_status_t kiln_cuda_launch_flat(kiln_backend_queue_t *queue, const char *name, int64_t n, const kiln_kop_t *k);
/* Blocks for a grid-stride kernel over n items (>= 1, capped). */
unsigned kiln_cuda_grid_for(const kiln_backend_device_t *device, int64_t n);

/* ---- memory and queues (memory.c, queue.c): the interface's slots ------------ */

kiln_status_t kiln_cuda_buffer_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                        kiln_backend_buffer_t **out_buffer);
kiln_status_t kiln_cuda_buffer_allocate_on(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                           kiln_backend_queue_t *queue, size_t size,
                                           kiln_backend_buffer_t **out_buffer);
void kiln_cuda_buffer_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_buffer_t *buffer);
kiln_status_t kiln_cuda_host_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                      void **out_ptr);
void kiln_cuda_host_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *ptr);
kiln_status_t kiln_cuda_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     kiln_backend_buffer_t *buffer, size_t offset, const void *host, size_t size,
                                     bool blocking);
kiln_status_t kiln_cuda_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *buffer, size_t offset, void *host, size_t size,
                                    bool blocking);
kiln_status_t kiln_cuda_buffer_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *src, size_t src_offset, kiln_backend_buffer_t *dst,
                                    size_t dst_offset, size_t size);
kiln_status_t kiln_cuda_buffer_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                    kiln_backend_buffer_t *buffer, size_t offset, size_t size, const void *pattern,
                                    size_t pattern_size);
kiln_status_t kiln_cuda_queue_create(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                     kiln_backend_queue_t **out_queue);
void kiln_cuda_queue_destroy(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
kiln_status_t kiln_cuda_queue_finish(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
kiln_status_t kiln_cuda_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                     kiln_backend_event_t **out_event);
kiln_status_t kiln_cuda_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                   kiln_backend_event_t *event);
kiln_status_t kiln_cuda_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
kiln_status_t kiln_cuda_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
kiln_status_t kiln_cuda_event_elapsed(kiln_backend_context_t *ctx, kiln_backend_event_t *start,
                                      kiln_backend_event_t *end, double *out_ms);
void kiln_cuda_event_release(kiln_backend_context_t *ctx, kiln_backend_event_t *event);
/* Destroy the device's released events (at close, context current). */
void kiln_cuda_events_free(kiln_backend_device_t *device);

/* Stream-ordered scratch memory for one operation on `queue`: freed with
 * kiln_cuda_scratch_free after the work that uses it was enqueued. */
kiln_status_t kiln_cuda_scratch_alloc(kiln_backend_queue_t *queue, size_t size, CUdeviceptr *out_ptr);
void kiln_cuda_scratch_free(kiln_backend_queue_t *queue, CUdeviceptr ptr);

/* kiln's memory pool on a device (cuMemPoolCreate): freed memory kept up to
 * the release threshold below, allocations that never wait on another
 * stream's work. create leaves device->pools false where the device has no
 * stream-ordered allocation (buffers then come from cuMemAlloc). The
 * device's context is current. */
void kiln_cuda_pool_create(kiln_backend_device_t *device);
void kiln_cuda_pool_destroy(kiln_backend_device_t *device);
/* How much freed memory the pool keeps (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD):
 * an eighth of the device's memory, within [256 MiB, 2 GiB]. */
uint64_t kiln_cuda_pool_threshold(uint64_t memory_bytes);

/* The cache of page-locked host memory (see kiln_cuda_host_cache_t).
 * take: a block of at least `size` bytes (the device's context current);
 * give: back to the cache, from any thread, callbacks included; trim:
 * free what the cache holds past its cap, or everything (context current). */
void kiln_cuda_host_cache_init(kiln_cuda_host_cache_t *cache);
kiln_status_t kiln_cuda_host_take(kiln_backend_device_t *device, size_t size, void **out_ptr);
void kiln_cuda_host_give(kiln_cuda_host_cache_t *cache, void *ptr);
void kiln_cuda_host_trim(kiln_cuda_host_cache_t *cache, bool everything);
/* The size class of a block of `size` bytes: -1 when it is larger than the
 * largest class (such blocks are not kept). */
int kiln_cuda_host_class(size_t size);
/* Non-blocking transfers from pageable host memory of at most this many
 * bytes are staged through the cache; larger ones go to the driver, which
 * makes the caller wait. */
#define KILN_CUDA_STAGE_MAX ((size_t)64 << 20)

/* ---- the op table (ops.c) ------------------------------------------------------ */

/* The rows: `native` for every kind (expanded from KILN_OP_KINDS: FLAT and
 * ROWS kinds through one generic runner each, PLAN kinds through
 * kiln_cuda_plan_<name>), `cublas` for matmul, `cudnn` for conv2d,
 * max_pool2d, conv2d_backward_input, conv2d_backward_weight and
 * softmax_backward; ended by KILN_OP_TABLE_END. Every row's run makes the
 * device's context current around its routine (one shared wrapper). */
extern const kiln_op_entry_t kiln_cuda_ops[];

/* op's kernel-facing record: kiln_backend_kop_fill, and each operand's
 * device address (buffer + offset * dtype size). */
void kiln_cuda_kop_fill(kiln_kop_t *k, const kiln_op_t *op);
/* Device address of element 0 of a view. */
CUdeviceptr kiln_cuda_view_ptr(const kiln_view_t *view);
/* Blocks for a kernel that gives one block to each of `items` rows. */
unsigned kiln_cuda_grid_rows(int64_t items);

/* The native SGEMM of k->plan.gemm (a, b, c, sizes, strides, batch,
 * trans_a, trans_b, filled by the planner); it chooses the float4 variant
 * and sets plan.gemm.c_vec. Shared by matmul and the convolutions. */
kiln_status_t kiln_cuda_gemm(kiln_backend_queue_t *queue, kiln_kop_t *k);
/* Its grid for m x n outputs (over k) in `batch` batches: x covers every n
 * tile; y and z stop at 65535 and the kernel loops over the rest.
 * KILN_OUT_OF_RESOURCES when m or n reaches 2^38, k 2^33 or batch 2^30
 * (the kernel counts tiles, k's steps and batches in ints). */
kiln_status_t kiln_cuda_gemm_grid(kiln_backend_context_t *ctx, int64_t m, int64_t n, int64_t k, int64_t batch,
                                  unsigned out_grid[3]);

/* How a reduction runs: rows or columns kernel, how many blocks, and the
 * rows of the second pass (0 when there is none). From k->u.reduce, sets
 * k->plan.reduce's chunk, chunks, width and rows (outer). */
typedef struct kiln_cuda_reduce_plan_t {
  bool cols;
  int64_t blocks;
  int64_t parts_rows;
} kiln_cuda_reduce_plan_t;
void kiln_cuda_reduce_plan(kiln_kop_t *k, int sm_count, kiln_cuda_reduce_plan_t *out);
/* Add a convolution's bias (when it has one) to its output, in place. */
kiln_status_t kiln_cuda_conv_bias(kiln_backend_queue_t *queue, const kiln_op_t *op);
/* Set a 16-bit convolution's output to its bias (when it has one), for a
 * provider that adds its convolution to it and rounds once. */
kiln_status_t kiln_cuda_conv_bias_fill(kiln_backend_queue_t *queue, const kiln_op_t *op);
/* Scratch for the columns of a convolution's images per GEMM: images are
 * taken in rounds whose columns fit (at least one image a round). */
#define KILN_CUDA_IM2COL_BYTES ((size_t)256 << 20)

/* The planners of the training kinds (ops_train.c). */
kiln_status_t kiln_cuda_plan_conv2d_backward_input(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                   const kiln_op_t *op);
kiln_status_t kiln_cuda_plan_conv2d_backward_weight(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                    const kiln_op_t *op);
kiln_status_t kiln_cuda_plan_max_pool2d_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                 const kiln_op_t *op);

/* ---- providers (cublas.c, cudnn.c) -------------------------------------------- */

/* ---- DLPack (dlpack.c): the interface's slots ------------------------------------ */

/* kDLCUDA and the device's ordinal. */
void kiln_cuda_dlpack_device(kiln_backend_context_t *ctx, kiln_backend_device_t *device, int32_t *out_type,
                             int32_t *out_id);
/* The buffer's CUdeviceptr (NULL when empty). */
void *kiln_cuda_buffer_handle(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer);
/* A buffer over `size` bytes of device memory at the CUdeviceptr `handle`
 * that kiln did not allocate: checked to be device memory of this device
 * with `size` bytes in its allocation (KILN_INVALID_ARGUMENT,
 * KILN_DEVICE_MISMATCH otherwise), never freed by kiln. */
kiln_status_t kiln_cuda_buffer_wrap(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *handle,
                                    size_t size, kiln_backend_buffer_t **out_buffer);

/* ---- start-up checks (device.c) ------------------------------------------------ */

/* KILN_OK when the driver's CUDA version (cuDriverGetVersion) is at least
 * KILN_CUDA_DRIVER_MIN; otherwise KILN_UNAVAILABLE with a message naming
 * both and what to do. */
kiln_status_t kiln_cuda_driver_check(kiln_backend_context_t *ctx, int driver_version);

/* ---- vendor libraries (vendor.c) ------------------------------------------------ */

/* KILN_CUDA_VENDOR_LIBS (NULL or "": cublas,cudnn; "none"; or a subset)
 * into ctx->vendor_libs; KILN_INVALID_ARGUMENT quoting a malformed value. */
kiln_status_t kiln_cuda_vendor_libs_parse(kiln_backend_context_t *ctx, const char *value);
/* false, with the reason, when the setting leaves `which` out. */
bool kiln_cuda_vendor_wanted(const kiln_backend_context_t *ctx, unsigned which, char *out_reason, size_t reason_size);
/* dlopen the first of `names` found for vendor library `which`
 * (KILN_CUDA_VENDOR_*), looking in order: for cuDNN, $CUDNN_PATH and
 * $CUDNN_HOME (lib/, lib64/); the loader's own search (LD_LIBRARY_PATH,
 * ld.so.cache); $CUDA_PATH/lib64 and $CUDA_HOME/lib64; for cuDNN, the folder
 * the build found it in; the toolkit kiln was built with. The file loaded
 * goes to out_path. NULL, with the loader's first message and the places
 * tried, when none loads. */
void *kiln_cuda_vendor_open(unsigned which, const char *const *names, size_t name_count, char *out_path,
                            size_t path_size, char *out_reason, size_t reason_size);
/* dlsym into a function pointer of fn_size bytes; false when absent. */
bool kiln_cuda_vendor_sym(void *library, const char *symbol, void *out_fn, size_t fn_size);
/* dlerror(), never NULL. */
const char *kiln_cuda_dlerror(void);

/* Load the library into ctx->cublas (and ctx->cublas_version); false, with
 * *out_reason, when it is absent. unload forgets it (the library stays
 * mapped). */
bool kiln_cuda_cublas_load(kiln_backend_context_t *ctx, char *out_reason, size_t reason_size);
void kiln_cuda_cublas_unload(kiln_backend_context_t *ctx);
/* Whether op's operands and result are one float dtype throughout (f32, f64,
 * f16 or bf16): what cuBLAS's GEMMs and cuDNN's convolutions take; *out_bad
 * (when not NULL) the first dtype that is not. */
static inline bool kiln_cuda_one_float_dtype(const kiln_op_t *op, kiln_dtype_t *out_bad) {
  const uint32_t floats = 1u << KILN_F32 | 1u << KILN_F64 | 1u << KILN_F16 | 1u << KILN_BF16;
  if (!kiln_backend_op_dtypes_in(op, floats, floats, out_bad)) return false;
  for (int i = 0; i < op->n_in; i++)
    if (op->in[i].dtype != op->out.dtype) {
      if (out_bad) *out_bad = op->in[i].dtype;
      return false;
    }
  return true;
}
/* The cublas row's supports() and routine. */
/* Whether the cublas row computes op's dtypes (f32, f64, f16, bf16, one
 * throughout), whatever the sizes and whether cuBLAS is loaded; *out_bad
 * (when not NULL) the first dtype it does not. */
bool kiln_cuda_cublas_takes(const kiln_op_t *op, kiln_dtype_t *out_bad);
bool kiln_cuda_cublas_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                               const kiln_op_entry_t *entry, const kiln_op_t *op);
kiln_status_t kiln_cuda_cublas_matmul(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op);
void kiln_cuda_cublas_queue_release(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);

/* Load cuDNN 9 and check its sub-libraries (cudnnGraphVersionCheck,
 * cudnnOpsVersionCheck, cudnnCnnVersionCheck); false, with the reason, when
 * it is absent or incomplete. */
bool kiln_cuda_cudnn_load(kiln_backend_context_t *ctx, char *out_reason, size_t reason_size);
void kiln_cuda_cudnn_unload(kiln_backend_context_t *ctx);
/* The device's table of plans (at open), and its release (at close). */
kiln_status_t kiln_cuda_cudnn_device_init(kiln_backend_device_t *device);
/* The cudnn rows' supports() (conv2d, max_pool2d, conv2d_backward_input,
 * conv2d_backward_weight, softmax_backward) and routines. */
/* Whether cudnn's rows compute op's dtypes (CONV2D: f32, f64, f16, bf16,
 * one throughout; the others f32), as kiln_cuda_cublas_takes. */
bool kiln_cuda_cudnn_takes(const kiln_op_t *op, kiln_dtype_t *out_bad);
bool kiln_cuda_cudnn_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                              const kiln_op_entry_t *entry, const kiln_op_t *op);
kiln_status_t kiln_cuda_cudnn_conv2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op);
kiln_status_t kiln_cuda_cudnn_max_pool2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                         const kiln_op_t *op);
kiln_status_t kiln_cuda_cudnn_conv2d_backward_input(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                    const kiln_op_t *op);
kiln_status_t kiln_cuda_cudnn_conv2d_backward_weight(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                     const kiln_op_t *op);
kiln_status_t kiln_cuda_cudnn_softmax_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                               const kiln_op_t *op);
void kiln_cuda_cudnn_queue_release(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue);
void kiln_cuda_cudnn_device_release(kiln_backend_device_t *device);

#endif /* KILN_BACKENDS_CUDA_BACKEND_H */
