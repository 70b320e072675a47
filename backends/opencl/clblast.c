/* backends/opencl/clblast.c: the clblast row of matmul: CLBlast loaded with dlopen, so its absence disables the row only. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/opencl/opencl_backend.h"

/* clblast_c.h's types, declared here so the plugin needs neither the header
 * nor the library at build time. The enums are ints in the C ABI. */
enum { KILN_CLBLAST_ROW_MAJOR = 101, KILN_CLBLAST_TRANSPOSE_NO = 111, KILN_CLBLAST_TRANSPOSE_YES = 112 };

typedef int (*kiln_clblast_sgemm_fn)(int layout, int a_transpose, int b_transpose, size_t m, size_t n, size_t k,
                                     float alpha, const cl_mem a, size_t a_offset, size_t a_ld, const cl_mem b,
                                     size_t b_offset, size_t b_ld, float beta, cl_mem c, size_t c_offset, size_t c_ld,
                                     cl_command_queue *queue, cl_event *event);
typedef int (*kiln_clblast_sgemm_strided_batched_fn)(int layout, int a_transpose, int b_transpose, size_t m, size_t n,
                                                     size_t k, float alpha, const cl_mem a, size_t a_offset,
                                                     size_t a_ld, size_t a_stride, const cl_mem b, size_t b_offset,
                                                     size_t b_ld, size_t b_stride, float beta, cl_mem c,
                                                     size_t c_offset, size_t c_ld, size_t c_stride, size_t batch_count,
                                                     cl_command_queue *queue, cl_event *event);
typedef int (*kiln_clblast_clear_cache_fn)(void);

struct kiln_cl_clblast_t {
  bool loaded;
  void *handle;
  kiln_clblast_sgemm_fn sgemm;
  kiln_clblast_sgemm_strided_batched_fn sgemm_strided_batched;
  kiln_clblast_clear_cache_fn clear_cache;
  char state[384];
};

kiln_status_t kiln_cl_clblast_load(kiln_backend_context_t *ctx) {
  kiln_cl_clblast_t *clblast = calloc(1, sizeof *clblast);
  if (!clblast) return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for CLBlast's record");
  static const char *const names[] = {"libclblast.so.1", "libclblast.so"};
  char errors[320] = ""; /* fits in state after "absent: " */
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !clblast->handle; i++) {
    clblast->handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!clblast->handle) {
      const char *why = dlerror();
      size_t used = strlen(errors);
      snprintf(errors + used, sizeof errors - used, "%s%s", used ? "; " : "", why ? why : names[i]);
    } else {
      snprintf(clblast->state, sizeof clblast->state,
               "%s loaded (untuned defaults where its database has no entry for the device)", names[i]);
    }
  }
  if (clblast->handle) {
    clblast->sgemm = (kiln_clblast_sgemm_fn)dlsym(clblast->handle, "CLBlastSgemm");
    clblast->sgemm_strided_batched =
        (kiln_clblast_sgemm_strided_batched_fn)dlsym(clblast->handle, "CLBlastSgemmStridedBatched");
    clblast->clear_cache = (kiln_clblast_clear_cache_fn)dlsym(clblast->handle, "CLBlastClearCache");
    if (!clblast->sgemm || !clblast->sgemm_strided_batched) {
      snprintf(clblast->state, sizeof clblast->state,
               "absent: the CLBlast library found lacks CLBlastSgemm or CLBlastSgemmStridedBatched (too old?)");
      /* Never dlclose: a C++ library's static state may outlive us. (A
       * later context's dlopen finds the library mapped already.) */
      clblast->sgemm = NULL;
      clblast->sgemm_strided_batched = NULL;
    } else {
      clblast->loaded = true;
    }
  } else {
    snprintf(clblast->state, sizeof clblast->state, "absent: %s", errors);
  }
  ctx->clblast = clblast;
  return KILN_OK;
}

bool kiln_cl_clblast_available(const kiln_backend_context_t *ctx) { return ctx->clblast && ctx->clblast->loaded; }

const char *kiln_cl_clblast_state(const kiln_backend_context_t *ctx) {
  return ctx->clblast && ctx->clblast->state[0] ? ctx->clblast->state : "not loaded";
}

void kiln_cl_clblast_unload(kiln_backend_context_t *ctx) {
  kiln_cl_clblast_t *clblast = ctx->clblast;
  if (!clblast) return;
  /* The library stays mapped (see above); its compiled-program cache holds
   * our contexts, so it is emptied before they are released. */
  if (clblast->loaded && clblast->clear_cache) (void)clblast->clear_cache();
  free(clblast);
  ctx->clblast = NULL;
}

bool kiln_cl_clblast_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                              const kiln_op_entry_t *entry, const kiln_op_t *op) {
  if (!kiln_cl_clblast_available(ctx)) return false;
  if (!op) return true;
  /* CLBlast's own limits: single precision here (kiln calls Sgemm only), and
   * no empty dimension (it refuses them; C = 0 for k == 0 is native's).
   * f64, f16 and bf16 run the native row (gemm_dtypes.cl): CLBlast's Hgemm
   * would sum in half and needs cl_khr_fp16 (PoCL lacks it), and its Dgemm
   * is not wired yet. */
  if (op->out.dtype != KILN_F32 || op->in[0].dtype != KILN_F32 || op->in[1].dtype != KILN_F32) return false;
  return op->u.matmul.batch >= 1 && op->u.matmul.m >= 1 && op->u.matmul.n >= 1 && op->u.matmul.k >= 1;
}

/* Timing note: CLBlast may run helper kernels (padding, transposes) around
 * its GEMM kernel, and the event it returns covers only the last one. kiln
 * never relies on that event (it passes NULL): `fastest` times each provider
 * on the host clock around the row's run and a queue finish, which covers all
 * of CLBlast's work. */
kiln_status_t kiln_cl_clblast_run(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  const kiln_op_entry_t *entry, const kiln_op_t *op) {
  const kiln_cl_clblast_t *clblast = ctx->clblast;
  const int64_t batch = op->u.matmul.batch, m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  const kiln_view_t *a = &op->in[0], *b = &op->in[1];
  const int ta = op->u.matmul.trans_a ? KILN_CLBLAST_TRANSPOSE_YES : KILN_CLBLAST_TRANSPOSE_NO;
  const int tb = op->u.matmul.trans_b ? KILN_CLBLAST_TRANSPOSE_YES : KILN_CLBLAST_TRANSPOSE_NO;
  cl_mem a_mem = a->buffer ? a->buffer->mem : NULL, b_mem = b->buffer ? b->buffer->mem : NULL;
  cl_mem c_mem = op->out.buffer ? op->out.buffer->mem : NULL;
  cl_command_queue q = queue->queue;
  int result;
  if (batch == 1) {
    result = clblast->sgemm(KILN_CLBLAST_ROW_MAJOR, ta, tb, (size_t)m, (size_t)n, (size_t)k, 1.0f, a_mem, a->offset,
                            (size_t)op->u.matmul.lda, b_mem, b->offset, (size_t)op->u.matmul.ldb, 0.0f, c_mem,
                            op->out.offset, (size_t)op->u.matmul.ldc, &q, NULL);
    return kiln_cl_clblast_check(ctx, result, "CLBlastSgemm(%lldx%lldx%lld%s%s) on opencl:%zu", (long long)m,
                                 (long long)n, (long long)k, op->u.matmul.trans_a ? ", A transposed" : "",
                                 op->u.matmul.trans_b ? ", B transposed" : "", queue->device->index);
  }
  /* A stride of 0 broadcasts one matrix over the batch; CLBlast reads it so. */
  result = clblast->sgemm_strided_batched(
      KILN_CLBLAST_ROW_MAJOR, ta, tb, (size_t)m, (size_t)n, (size_t)k, 1.0f, a_mem, a->offset, (size_t)op->u.matmul.lda,
      (size_t)op->u.matmul.stride_a, b_mem, b->offset, (size_t)op->u.matmul.ldb, (size_t)op->u.matmul.stride_b, 0.0f,
      c_mem, op->out.offset, (size_t)op->u.matmul.ldc, (size_t)op->u.matmul.stride_c, (size_t)batch, &q, NULL);
  return kiln_cl_clblast_check(ctx, result,
                               "CLBlastSgemmStridedBatched(batch %lld of %lldx%lldx%lld%s%s) on opencl:%zu",
                               (long long)batch, (long long)m, (long long)n, (long long)k,
                               op->u.matmul.trans_a ? ", A transposed" : "",
                               op->u.matmul.trans_b ? ", B transposed" : "", queue->device->index);
}
