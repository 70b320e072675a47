/* bench/sec_cuda.c: section 7, the GPU peers loaded with dlopen: cublasSgemm (the cuBLAS kiln loads, on kiln's data), cuMemcpyHtoD from pinned memory, a raw cuLaunchKernel (its host cost apart from the GPU's). */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* The driver and cuBLAS types the bench needs, declared here so that only
 * the CUDA backend includes CUDA headers and kiln-bench runs without CUDA. */
typedef int bench_cu_result;
typedef int bench_cu_device;
typedef void *bench_cu_context;
typedef void *bench_cu_module;
typedef void *bench_cu_function;
typedef void *bench_cu_stream;
typedef unsigned long long bench_cu_ptr;

typedef struct bench_cu_t {
  void *lib, *blas_lib;
  bench_cu_result (*init)(unsigned);
  bench_cu_result (*device_count)(int *);
  bench_cu_result (*device_get)(bench_cu_device *, int);
  bench_cu_result (*ctx_retain)(bench_cu_context *, bench_cu_device);
  bench_cu_result (*ctx_release)(bench_cu_device);
  bench_cu_result (*ctx_push)(bench_cu_context);
  bench_cu_result (*ctx_pop)(bench_cu_context *);
  bench_cu_result (*stream_create)(bench_cu_stream *, unsigned);
  bench_cu_result (*stream_destroy)(bench_cu_stream);
  bench_cu_result (*stream_sync)(bench_cu_stream);
  bench_cu_result (*mem_alloc)(bench_cu_ptr *, size_t);
  bench_cu_result (*mem_free)(bench_cu_ptr);
  bench_cu_result (*host_alloc)(void **, size_t);
  bench_cu_result (*host_free)(void *);
  bench_cu_result (*htod)(bench_cu_ptr, const void *, size_t);
  bench_cu_result (*htod_async)(bench_cu_ptr, const void *, size_t, bench_cu_stream);
  bench_cu_result (*memset32_async)(bench_cu_ptr, unsigned, size_t, bench_cu_stream);
  bench_cu_result (*module_load)(bench_cu_module *, const void *);
  bench_cu_result (*module_unload)(bench_cu_module);
  bench_cu_result (*module_function)(bench_cu_function *, bench_cu_module, const char *);
  bench_cu_result (*launch)(bench_cu_function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            bench_cu_stream, void **, void **);
  bench_cu_result (*error_name)(bench_cu_result, const char **);
  int (*blas_create)(void **);
  int (*blas_destroy)(void *);
  int (*blas_set_stream)(void *, bench_cu_stream);
  int (*blas_sgemm)(void *, int, int, int, int, int, const float *, const float *, int, const float *, int,
                    const float *, float *, int);
  char blas_path[1024]; /* the file loaded: kiln's own cuBLAS where kiln has one */
  bench_cu_stream stream;
} bench_cu_t;

/* dlerror(), which is NULL when the loader has nothing to say: never "(null)". */
static const char *bench_dlerror(void) {
  const char *e = dlerror();
  return e && *e ? e : "the dynamic loader gave no reason";
}

/* A 16-float add as PTX for sm_75 and newer: the driver compiles it for the GPU at load. */
static const char bench_tiny_ptx[] =
    ".version 7.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry bench_add(.param .u64 bench_add_a, .param .u64 bench_add_b, .param .u64 bench_add_c,\n"
    "  .param .u32 bench_add_n)\n{\n"
    "  .reg .pred %p<2>;\n  .reg .b32 %r<6>;\n  .reg .f32 %f<4>;\n  .reg .b64 %rd<11>;\n"
    "  ld.param.u64 %rd1, [bench_add_a];\n  ld.param.u64 %rd2, [bench_add_b];\n"
    "  ld.param.u64 %rd3, [bench_add_c];\n  ld.param.u32 %r2, [bench_add_n];\n"
    "  mov.u32 %r3, %ctaid.x;\n  mov.u32 %r4, %ntid.x;\n  mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n  setp.ge.u32 %p1, %r1, %r2;\n  @%p1 bra $L_done;\n"
    "  cvta.to.global.u64 %rd4, %rd1;\n  cvta.to.global.u64 %rd5, %rd2;\n  cvta.to.global.u64 %rd6, %rd3;\n"
    "  mul.wide.u32 %rd7, %r1, 4;\n  add.s64 %rd8, %rd4, %rd7;\n  add.s64 %rd9, %rd5, %rd7;\n"
    "  add.s64 %rd10, %rd6, %rd7;\n  ld.global.f32 %f1, [%rd8];\n  ld.global.f32 %f2, [%rd9];\n"
    "  add.f32 %f3, %f1, %f2;\n  st.global.f32 [%rd10], %f3;\n$L_done:\n  ret;\n}\n";

static const char *bench_cu_name(bench_cu_t *cu, bench_cu_result r) {
  const char *name = NULL;
  if (cu->error_name && cu->error_name(r, &name) == 0 && name) return name;
  return "CUDA_ERROR_?";
}

static int bench_cu_fail(bench_cu_t *cu, const char *call, bench_cu_result r) {
  bench_set_error("%s returned %s (%d)", call, bench_cu_name(cu, r), r);
  return -1;
}

#define BENCH_CU_SYM(lib, field, name)                      \
  do {                                                      \
    *(void **)(&cu->field) = dlsym(cu->lib, name);          \
    if (!cu->field) {                                       \
      snprintf(why, why_size, "%s lacks %s", #lib, name);   \
      return false;                                         \
    }                                                       \
  } while (0)

static bool bench_cu_load(bench_cu_t *cu, char *why, size_t why_size) {
  cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cu->lib) {
    snprintf(why, why_size, "%s", bench_dlerror());
    return false;
  }
  BENCH_CU_SYM(lib, init, "cuInit");
  BENCH_CU_SYM(lib, device_count, "cuDeviceGetCount");
  BENCH_CU_SYM(lib, device_get, "cuDeviceGet");
  BENCH_CU_SYM(lib, ctx_retain, "cuDevicePrimaryCtxRetain");
  BENCH_CU_SYM(lib, ctx_release, "cuDevicePrimaryCtxRelease_v2");
  BENCH_CU_SYM(lib, ctx_push, "cuCtxPushCurrent_v2");
  BENCH_CU_SYM(lib, ctx_pop, "cuCtxPopCurrent_v2");
  BENCH_CU_SYM(lib, stream_create, "cuStreamCreate");
  BENCH_CU_SYM(lib, stream_destroy, "cuStreamDestroy_v2");
  BENCH_CU_SYM(lib, stream_sync, "cuStreamSynchronize");
  BENCH_CU_SYM(lib, mem_alloc, "cuMemAlloc_v2");
  BENCH_CU_SYM(lib, mem_free, "cuMemFree_v2");
  BENCH_CU_SYM(lib, host_alloc, "cuMemAllocHost_v2");
  BENCH_CU_SYM(lib, host_free, "cuMemFreeHost");
  BENCH_CU_SYM(lib, htod, "cuMemcpyHtoD_v2");
  BENCH_CU_SYM(lib, htod_async, "cuMemcpyHtoDAsync_v2");
  BENCH_CU_SYM(lib, memset32_async, "cuMemsetD32Async");
  BENCH_CU_SYM(lib, module_load, "cuModuleLoadData");
  BENCH_CU_SYM(lib, module_unload, "cuModuleUnload");
  BENCH_CU_SYM(lib, module_function, "cuModuleGetFunction");
  BENCH_CU_SYM(lib, launch, "cuLaunchKernel");
  BENCH_CU_SYM(lib, error_name, "cuGetErrorName");
  return true;
}

/* The value of a device property, or NULL. */
static const char *bench_property(const bench_device_t *d, const char *key) {
  for (size_t i = 0; i < kiln_device_property_count(d->device); i++) {
    const char *k, *v;
    if (kiln_device_property(d->device, i, &k, &v) == KILN_OK && !strcmp(k, key)) return v;
  }
  return NULL;
}

/* The cuBLAS kiln's CUDA backend loaded (devinfo's cublas_library), so that
 * the peer and kiln's cublas provider run the same library; the usual names
 * only where kiln has none. */
static bool bench_cublas_load(bench_cu_t *cu, const bench_device_t *d, char *why, size_t why_size) {
  const char *kilns = bench_property(d, "cublas_library");
  if (kilns && kilns[0]) {
    cu->blas_lib = dlopen(kilns, RTLD_NOW | RTLD_LOCAL);
    if (!cu->blas_lib) {
      snprintf(why, why_size, "kiln's cuBLAS (%s) does not load here: %s", kilns, bench_dlerror());
      return false;
    }
    snprintf(cu->blas_path, sizeof cu->blas_path, "%s", kilns);
  } else {
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (size_t i = 0; i < 3 && !cu->blas_lib; i++) {
      cu->blas_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
      if (cu->blas_lib) snprintf(cu->blas_path, sizeof cu->blas_path, "%s (kiln loaded none)", names[i]);
    }
    if (!cu->blas_lib) {
      snprintf(why, why_size, "cuBLAS not found (kiln loaded none either): %s", bench_dlerror());
      return false;
    }
  }
  BENCH_CU_SYM(blas_lib, blas_create, "cublasCreate_v2");
  BENCH_CU_SYM(blas_lib, blas_destroy, "cublasDestroy_v2");
  BENCH_CU_SYM(blas_lib, blas_set_stream, "cublasSetStream_v2");
  BENCH_CU_SYM(blas_lib, blas_sgemm, "cublasSgemm_v2");
  return true;
}

/* ---- cublasSgemm -------------------------------------------------------------------- */

typedef struct bench_cu_gemm_t {
  bench_cu_t *cu;
  void *handle;
  int n;
  bench_cu_ptr a, b, c;
} bench_cu_gemm_t;

static int bench_cu_gemm_run(void *ctx, long iters) {
  bench_cu_gemm_t *g = ctx;
  const float one = 1.0f, zero = 0.0f;
  for (long i = 0; i < iters; i++) {
    int st = g->cu->blas_sgemm(g->handle, 0, 0, g->n, g->n, g->n, &one, (const float *)(uintptr_t)g->a, g->n,
                               (const float *)(uintptr_t)g->b, g->n, &zero, (float *)(uintptr_t)g->c, g->n);
    if (st != 0) {
      bench_set_error("cublasSgemm_v2(%d^3) returned cuBLAS status %d", g->n, st);
      return -1;
    }
  }
  bench_cu_result r = g->cu->stream_sync(g->cu->stream);
  return r ? bench_cu_fail(g->cu, "cuStreamSynchronize", r) : 0;
}

/* The peer's operands: the numbers kiln's matmul gets (bench_uniform, seeds
 * 1 and 2), read back from the device and copied in, in order on the peer's
 * own stream. Row-major A @ B is column-major B^T A^T: the peer computes the
 * product of the same two matrices, which is all a timing needs. */
static int bench_cu_gemm_data(bench_cu_t *cu, const bench_device_t *d, bench_cu_gemm_t *g, size_t bytes) {
  float *host = malloc(bytes);
  if (!host) {
    bench_set_error("out of host memory (%zu bytes) for the peer's operands", bytes);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < 2 && rc == 0; i++) {
    kiln_tensor_t *t = NULL;
    kiln_status_t st = bench_uniform(d->device, g->n, g->n, (uint64_t)(i + 1), &t);
    if (st == KILN_OK) st = kiln_tensor_read(t, host, bytes);
    kiln_tensor_release(t);
    if (st != KILN_OK) {
      rc = bench_kiln_error("kiln_tensor_uniform / kiln_tensor_read for the peer's operands", st);
      break;
    }
    bench_cu_result r = cu->htod_async(i == 0 ? g->a : g->b, host, bytes, cu->stream);
    if (!r) r = cu->stream_sync(cu->stream);
    if (r) rc = bench_cu_fail(cu, "cuMemcpyHtoDAsync", r);
  }
  free(host);
  return rc;
}

/* One side of the comparison: the peer, or kiln with one provider. */
typedef struct bench_gemm_side_t {
  const char *provider; /* NULL: the peer */
  bench_fn fn;
  void *ctx;
  long iters;
  double *samples;
  bool ok;
  char why[512];
  char ran[32]; /* the provider that ran (a forced one that cannot serve falls back to native) */
} bench_gemm_side_t;

static void bench_gemm_use(const bench_gemm_side_t *side) {
  if (!side->provider) return;
  char spec[64];
  snprintf(spec, sizeof spec, "matmul=%.31s", side->provider);
  kiln_set_providers(spec);
}

static void bench_cuda_sgemm(const bench_options_t *opts, bench_cu_t *cu, const bench_device_t *d) {
  const int S = BENCH_SECTION_CUDA;
  int n = opts->quick ? 2048 : 8192;
  char params[32], why[512] = "";
  snprintf(params, sizeof params, "%d^3", n);
  double work = 2.0 * n * (double)n * n / 1e9;
  size_t bytes = (size_t)n * (size_t)n * sizeof(float);
  bench_cu_gemm_t g = {cu, NULL, n, 0, 0, 0};
  bench_cu_result r = 0;
  bool peer_ok = false;
  if (!bench_cublas_load(cu, d, why, sizeof why)) {
    /* why says it */
  } else if ((r = cu->mem_alloc(&g.a, bytes)) || (r = cu->mem_alloc(&g.b, bytes)) || (r = cu->mem_alloc(&g.c, bytes))) {
    bench_cu_fail(cu, "cuMemAlloc", r);
    snprintf(why, sizeof why, "%s", bench_error());
  } else if (cu->blas_create(&g.handle) != 0 || cu->blas_set_stream(g.handle, cu->stream) != 0) {
    snprintf(why, sizeof why, "cublasCreate_v2 / cublasSetStream_v2 failed");
  } else if (bench_cu_gemm_data(cu, d, &g, bytes) != 0) {
    snprintf(why, sizeof why, "%s", bench_error());
  } else {
    peer_ok = true;
  }

  /* kiln's side: the same operands, one row per provider. */
  bench_op_t op = {.kind = BENCH_OP_MATMUL, .device = d->device};
  kiln_status_t st = bench_uniform(d->device, n, n, 1, &op.a);
  if (st == KILN_OK) st = bench_uniform(d->device, n, n, 2, &op.b);
  if (st != KILN_OK) {
    bench_kiln_error("kiln_tensor_uniform", st);
    bench_section_error(S, "kiln matmul %s on %s: %s", params, d->info.selector, bench_error());
  }
  char providers[8][32];
  int np = st == KILN_OK ? bench_providers(d, "matmul", providers, 8) : 0;

  bench_gemm_side_t sides[9];
  int nsides = 0;
  memset(sides, 0, sizeof sides);
  sides[nsides++] = (bench_gemm_side_t){NULL, bench_cu_gemm_run, &g, 0, NULL, peer_ok, "", ""};
  snprintf(sides[0].why, sizeof sides[0].why, "%s", why);
  for (int i = 0; i < np; i++)
    sides[nsides++] = (bench_gemm_side_t){providers[i], bench_op_run, &op, 0, NULL, true, "", ""};

  /* Calibrate each side (warm-up, iterations per sample), then take the
   * samples in turns, each round starting with the next side, so that no
   * side always runs first (on a cold or throttled GPU) or last. */
  for (int i = 0; i < nsides; i++) {
    bench_gemm_side_t *side = &sides[i];
    side->samples = calloc((size_t)(opts->reps > 0 ? opts->reps : 1), sizeof *side->samples);
    if (!side->ok || !side->samples) {
      side->ok = false;
      continue;
    }
    bench_gemm_use(side);
    bench_stats_t calib;
    memset(&calib, 0, sizeof calib);
    if (bench_measure_n(side->fn, side->ctx, opts->warmup, 1, opts->min_sample_s, &calib) != 0) {
      side->ok = false;
      snprintf(side->why, sizeof side->why, "%s", bench_error());
    }
    side->iters = calib.iters > 0 ? calib.iters : 1;
    bench_reset_providers();
  }
  for (int rep = 0; rep < opts->reps; rep++) {
    for (int k = 0; k < nsides; k++) {
      bench_gemm_side_t *side = &sides[(rep + k) % nsides];
      if (!side->ok) continue;
      bench_gemm_use(side);
      double t0 = bench_now();
      if (side->fn(side->ctx, side->iters) != 0) {
        side->ok = false;
        snprintf(side->why, sizeof side->why, "%s", bench_error());
      }
      side->samples[rep] = (bench_now() - t0) / (double)side->iters;
      if (side->provider) snprintf(side->ran, sizeof side->ran, "%s", op.provider);
      bench_reset_providers();
    }
  }

  bench_row_t peer = bench_row_make(S, "matmul", d->info.selector, "cublasSgemm", params, "GFLOPS", true);
  peer.is_peer = true;
  peer.valid = sides[0].ok;
  if (peer.valid) {
    bench_stats_t sec;
    bench_stats_of(sides[0].samples, opts->reps, &sec);
    sec.iters = sides[0].iters;
    peer.st = bench_stats_rate(&sec, work);
    bench_row_note(&peer, "FP32 (default math mode: no TF32); %s; kiln's operands; turns alternate with kiln's",
                   cu->blas_path);
  } else {
    bench_row_note(&peer, "%s", sides[0].why);
  }
  bench_add(&peer);
  for (int i = 1; i < nsides; i++) {
    bench_gemm_side_t *side = &sides[i];
    if (!side->ok) {
      bench_section_error(S, "kiln matmul %s on %s with %s: %s", params, d->info.selector, side->provider, side->why);
      continue;
    }
    bench_stats_t sec;
    bench_stats_of(side->samples, opts->reps, &sec);
    sec.iters = side->iters;
    bench_row_t row = bench_row_make(S, "matmul", d->info.selector, side->ran[0] ? side->ran : side->provider, params,
                                     "GFLOPS", true);
    row.st = bench_stats_rate(&sec, work);
    bench_row_compare(&row, "cuBLAS", peer.valid ? peer.st.median : NAN);
    if (!strcmp(row.provider, "native") && n == 8192) bench_row_target_ratio(&row, 0.5);
    bench_add(&row);
  }
  for (int i = 0; i < nsides; i++) free(sides[i].samples);
  bench_op_release(&op);
  if (g.handle) cu->blas_destroy(g.handle);
  if (g.a) cu->mem_free(g.a);
  if (g.b) cu->mem_free(g.b);
  if (g.c) cu->mem_free(g.c);
}

/* ---- transfers from pinned memory -------------------------------------------------------- */

typedef struct bench_cu_copy_t {
  bench_cu_t *cu;
  bench_cu_ptr dst;
  const void *src;
  size_t bytes;
} bench_cu_copy_t;

static int bench_cu_copy_run(void *ctx, long iters) {
  bench_cu_copy_t *c = ctx;
  for (long i = 0; i < iters; i++) {
    bench_cu_result r = c->cu->htod(c->dst, c->src, c->bytes);
    if (r) return bench_cu_fail(c->cu, "cuMemcpyHtoD_v2", r);
  }
  return 0;
}

typedef struct bench_kiln_write_t {
  kiln_queue_t *queue;
  kiln_buffer_t *buf;
  const void *src;
  size_t bytes;
} bench_kiln_write_t;

static int bench_kiln_write_run(void *ctx, long iters) {
  bench_kiln_write_t *w = ctx;
  for (long i = 0; i < iters; i++) {
    kiln_status_t st = kiln_buffer_write(w->queue, w->buf, 0, w->src, w->bytes, true, 0, NULL, NULL);
    if (st != KILN_OK) return bench_kiln_error("kiln_buffer_write", st);
  }
  return 0;
}

static void bench_cuda_copy(const bench_options_t *opts, bench_cu_t *cu, const bench_device_t *d) {
  const int S = BENCH_SECTION_CUDA;
  size_t bytes = opts->quick ? (size_t)16 << 20 : (size_t)256 << 20;
  char params[32];
  bench_format_bytes((double)bytes, params, sizeof params);
  double gb = (double)bytes / 1e9;
  void *pinned = NULL, *pageable = malloc(bytes);
  bench_cu_copy_t c = {cu, 0, NULL, bytes};
  bench_cu_result r = 0;
  bench_row_t peer = bench_row_make(S, "host to device", d->info.selector, "cuMemcpyHtoD (pinned)", params, "GB/s", true);
  peer.is_peer = true;
  if (!pageable || (r = cu->host_alloc(&pinned, bytes)) || (r = cu->mem_alloc(&c.dst, bytes))) {
    peer.valid = false;
    bench_row_note(&peer, "%s", pageable ? bench_cu_name(cu, r) : "out of host memory");
  } else {
    memset(pinned, 1, bytes);
    memset(pageable, 1, bytes);
    c.src = pinned;
    bench_stats_t sec;
    if (bench_measure(opts, bench_cu_copy_run, &c, &sec) == 0) peer.st = bench_stats_rate(&sec, gb);
    else {
      peer.valid = false;
      bench_row_note(&peer, "%s", bench_error());
    }
  }
  bench_add(&peer);
  if (pinned && pageable) {
    bench_kiln_write_t w = {kiln_device_current_queue(d->device), NULL, NULL, bytes};
    kiln_status_t st = kiln_buffer_create(d->device, bytes, &w.buf);
    for (int k = 0; k < 2 && st == KILN_OK; k++) {
      w.src = k == 0 ? pinned : pageable;
      bench_stats_t sec;
      if (bench_measure(opts, bench_kiln_write_run, &w, &sec) != 0) {
        bench_section_error(S, "kiln_buffer_write on %s: %s", d->info.selector, bench_error());
        continue;
      }
      bench_row_t row = bench_row_make(S, "host to device", d->info.selector,
                                       k == 0 ? "kiln_buffer_write (pinned source)" : "kiln_buffer_write (pageable source)",
                                       params, "GB/s", true);
      row.st = bench_stats_rate(&sec, gb);
      bench_row_compare(&row, "cuMemcpyHtoD pinned", peer.valid ? peer.st.median : NAN);
      bench_add(&row);
    }
    if (st != KILN_OK) bench_section_error(S, "kiln_buffer_create(%s) on %s: %s", params, d->info.selector, kiln_last_error());
    kiln_buffer_release(w.buf);
  }
  if (c.dst) cu->mem_free(c.dst);
  if (pinned) cu->host_free(pinned);
  free(pageable);
}

/* ---- a raw launch of a tiny kernel -------------------------------------------------------- */

typedef struct bench_cu_launch_t {
  bench_cu_t *cu;
  bench_cu_function fn;
  bench_cu_ptr a, b, c;
  unsigned n;
  void *args[4];
} bench_cu_launch_t;

static int bench_cu_launch_one(bench_cu_launch_t *l) {
  bench_cu_result r = l->cu->launch(l->fn, 1, 1, 1, 32, 1, 1, 0, l->cu->stream, l->args, NULL);
  return r ? bench_cu_fail(l->cu, "cuLaunchKernel", r) : 0;
}

static int bench_cu_launch_wait_run(void *ctx, long iters) {
  bench_cu_launch_t *l = ctx;
  for (long i = 0; i < iters; i++) {
    if (bench_cu_launch_one(l) != 0) return -1;
    bench_cu_result r = l->cu->stream_sync(l->cu->stream);
    if (r) return bench_cu_fail(l->cu, "cuStreamSynchronize", r);
  }
  return 0;
}

/* Host cost per launch, apart from the GPU's: launches in batches small
 * enough that the driver never blocks (it does after about a thousand
 * pending ones, and then the clock measures the GPU), the clock running only
 * while a batch is enqueued, the wait for it after the clock stopped. */
#define BENCH_LAUNCH_BATCH 256

typedef struct bench_host_side_t {
  /* Enqueue `count` units of work; wait for all of them. */
  int (*enqueue)(void *ctx, long count);
  int (*wait)(void *ctx);
  void *ctx;
  double *samples;
  bool ok;
  char why[512];
} bench_host_side_t;

static int bench_raw_enqueue(void *ctx, long count) {
  for (long i = 0; i < count; i++)
    if (bench_cu_launch_one(ctx) != 0) return -1;
  return 0;
}

static int bench_raw_wait(void *ctx) {
  bench_cu_launch_t *l = ctx;
  bench_cu_result r = l->cu->stream_sync(l->cu->stream);
  return r ? bench_cu_fail(l->cu, "cuStreamSynchronize", r) : 0;
}

typedef struct bench_kiln_add_t {
  kiln_device_t *device;
  kiln_tensor_t *a, *b;
  char provider[32];
} bench_kiln_add_t;

static int bench_kiln_add_enqueue(void *ctx, long count) {
  bench_kiln_add_t *k = ctx;
  for (long i = 0; i < count; i++) {
    kiln_tensor_t *c = NULL;
    kiln_status_t st = kiln_tensor_add(k->a, k->b, &c);
    if (st != KILN_OK) return bench_kiln_error("kiln_tensor_add (16 floats)", st);
    kiln_tensor_release(c);
  }
  snprintf(k->provider, sizeof k->provider, "%s", kiln_last_provider());
  return 0;
}

static int bench_kiln_add_wait(void *ctx) {
  kiln_status_t st = bench_finish(((bench_kiln_add_t *)ctx)->device);
  return st == KILN_OK ? 0 : bench_kiln_error("kiln_queue_finish", st);
}

/* Per rep, each side enqueues n units in batches; sides take turns, each
 * rep starting with the next one. Samples are host seconds per unit. */
static void bench_host_cost(const bench_options_t *opts, bench_host_side_t *sides, int nsides, long n) {
  for (int i = 0; i < nsides; i++) {
    sides[i].samples = calloc((size_t)(opts->reps > 0 ? opts->reps : 1), sizeof(double));
    if (!sides[i].samples) sides[i].ok = false, snprintf(sides[i].why, sizeof sides[i].why, "out of host memory");
    /* Warm up: lazy loading, the pool, the driver's queues. */
    if (sides[i].ok && (sides[i].enqueue(sides[i].ctx, BENCH_LAUNCH_BATCH) != 0 || sides[i].wait(sides[i].ctx) != 0))
      sides[i].ok = false, snprintf(sides[i].why, sizeof sides[i].why, "%s", bench_error());
  }
  for (int rep = 0; rep < opts->reps; rep++) {
    for (int k = 0; k < nsides; k++) {
      bench_host_side_t *side = &sides[(rep + k) % nsides];
      if (!side->ok) continue;
      double host = 0.0;
      for (long done = 0; done < n && side->ok; done += BENCH_LAUNCH_BATCH) {
        const long count = n - done < BENCH_LAUNCH_BATCH ? n - done : BENCH_LAUNCH_BATCH;
        double t0 = bench_now();
        int rc = side->enqueue(side->ctx, count);
        host += bench_now() - t0;
        if (rc == 0) rc = side->wait(side->ctx);
        if (rc != 0) side->ok = false, snprintf(side->why, sizeof side->why, "%s", bench_error());
      }
      side->samples[rep] = host / (double)n;
    }
  }
}

static void bench_cuda_launch(const bench_options_t *opts, bench_cu_t *cu, const bench_device_t *d) {
  const int S = BENCH_SECTION_CUDA;
  long n = opts->quick ? 2000 : 20000;
  bench_cu_module mod = NULL;
  bench_cu_launch_t l = {cu, NULL, 0, 0, 0, 16, {NULL, NULL, NULL, NULL}};
  l.args[0] = &l.a;
  l.args[1] = &l.b;
  l.args[2] = &l.c;
  l.args[3] = &l.n;
  bench_cu_result r = 0;
  double raw[3] = {NAN, NAN, NAN};
  const char *labels[3] = {"add 16 floats: host cost per launch", "add 16 floats: sustained",
                           "add 16 floats: enqueue + wait"};
  bool loaded = false;
  if ((r = cu->module_load(&mod, bench_tiny_ptx)) || (r = cu->module_function(&l.fn, mod, "bench_add")) ||
      (r = cu->mem_alloc(&l.a, 64)) || (r = cu->mem_alloc(&l.b, 64)) || (r = cu->mem_alloc(&l.c, 64)) ||
      (r = cu->memset32_async(l.a, 0x3f800000u, 16, cu->stream)) ||
      (r = cu->memset32_async(l.b, 0x3f800000u, 16, cu->stream)) || (r = cu->stream_sync(cu->stream))) {
    bench_section_error(S, "loading the tiny PTX kernel on %s: %s", d->info.selector, bench_cu_name(cu, r));
  } else {
    loaded = true;
  }

  /* kiln's add on the same device: 16 floats each. */
  bench_kiln_add_t k = {d->device, NULL, NULL, ""};
  int64_t shape[1] = {16};
  kiln_status_t st = kiln_tensor_uniform(d->device, 1, shape, 1, -1, 1, &k.a);
  if (st == KILN_OK) st = kiln_tensor_uniform(d->device, 1, shape, 2, -1, 1, &k.b);
  if (st != KILN_OK) bench_kiln_error("kiln_tensor_uniform", st);

  /* 1. Host cost per launch: the raw launch and kiln's add, in turns. */
  bench_host_side_t sides[2] = {
      {bench_raw_enqueue, bench_raw_wait, &l, NULL, loaded, ""},
      {bench_kiln_add_enqueue, bench_kiln_add_wait, &k, NULL, st == KILN_OK, ""},
  };
  if (st != KILN_OK) snprintf(sides[1].why, sizeof sides[1].why, "%s", bench_error());
  bench_host_cost(opts, sides, 2, n);

  /* 2. Sustained (n back to back, the GPU's pace once the driver's queue is
   * full) and 3. enqueue + wait: the raw launch. */
  bench_stats_t st_raw[3];
  memset(st_raw, 0, sizeof st_raw);
  int rc = loaded ? 0 : -1;
  if (rc == 0 && sides[0].ok) {
    bench_stats_of(sides[0].samples, opts->reps, &st_raw[0]);
    st_raw[0].iters = n;
    st_raw[0] = bench_stats_scale(&st_raw[0], 1e6);
  }
  double *sus = calloc((size_t)(opts->reps > 0 ? opts->reps : 1), sizeof *sus);
  if (!sus) rc = -1;
  for (int rep = 0; rep < opts->reps && rc == 0; rep++) {
    double t0 = bench_now();
    for (long i = 0; i < n && rc == 0; i++) rc = bench_cu_launch_one(&l);
    if (rc == 0 && (r = cu->stream_sync(cu->stream)) != 0) rc = bench_cu_fail(cu, "cuStreamSynchronize", r);
    sus[rep] = (bench_now() - t0) / (double)n * 1e6;
  }
  if (rc == 0) {
    bench_stats_of(sus, opts->reps, &st_raw[1]);
    st_raw[1].iters = n;
    bench_stats_t wait;
    rc = bench_measure(opts, bench_cu_launch_wait_run, &l, &wait);
    if (rc == 0) st_raw[2] = bench_stats_scale(&wait, 1e6);
  }
  free(sus);
  for (int i = 0; i < 3; i++) {
    bench_row_t row = bench_row_make(S, labels[i], d->info.selector, "raw cuLaunchKernel", "16", "us", false);
    row.is_peer = true;
    row.valid = i == 0 ? loaded && sides[0].ok : rc == 0;
    if (row.valid) {
      row.st = st_raw[i];
      raw[i] = st_raw[i].median;
    } else {
      bench_row_note(&row, "%s", i == 0 && !sides[0].ok ? sides[0].why : bench_error());
    }
    if (i == 0) bench_row_note(&row, "host time only: batches of %d launches, the GPU drained between them", BENCH_LAUNCH_BATCH);
    bench_add(&row);
  }
  if (l.a) cu->mem_free(l.a);
  if (l.b) cu->mem_free(l.b);
  if (l.c) cu->mem_free(l.c);
  if (mod) cu->module_unload(mod);

  /* kiln's rows: host cost from the same turns; sustained and enqueue +
   * wait from section 3's measurement. */
  if (!sides[1].ok) {
    bench_section_error(S, "kiln's tiny add on %s: %s", d->info.selector, sides[1].why);
  } else {
    bench_stats_t host;
    bench_stats_of(sides[1].samples, opts->reps, &host);
    host.iters = n;
    bench_row_t row = bench_row_make(S, labels[0], d->info.selector, k.provider, "16", "us", false);
    row.st = bench_stats_scale(&host, 1e6);
    bench_row_compare(&row, "raw CUDA", raw[0]);
    bench_row_target_diff(&row, 1.0);
    bench_row_note(&row, "host time only: batches of %d ops, the GPU drained between them", BENCH_LAUNCH_BATCH);
    bench_add(&row);
  }
  kiln_tensor_release(k.a);
  kiln_tensor_release(k.b);
  free(sides[0].samples);
  free(sides[1].samples);

  bench_stats_t kst[3];
  char provider[32];
  if (bench_kiln_tiny(opts, d->device, n, &kst[0], &kst[1], &kst[2], provider) != 0) {
    bench_section_error(S, "kiln's tiny add on %s: %s", d->info.selector, bench_error());
    return;
  }
  for (int i = 1; i < 3; i++) {
    bench_row_t row = bench_row_make(S, labels[i], d->info.selector, provider, "16", "us", false);
    row.st = bench_stats_scale(&kst[i], 1e6);
    bench_row_compare(&row, "raw CUDA", raw[i]);
    if (i == 2) bench_row_target_diff(&row, 1.0);
    bench_add(&row);
  }
}

void bench_section_cuda(const bench_options_t *opts) {
  const int S = BENCH_SECTION_CUDA;
  bench_cu_t cu_storage, *cu = &cu_storage;
  memset(cu, 0, sizeof *cu);
  char why[512] = "";
  if (!bench_cu_load(cu, why, sizeof why)) {
    bench_section_note(S, "no CUDA device: skipped (%s)", why);
    return;
  }
  bench_cu_result r = cu->init(0);
  int count = 0;
  if (r) {
    bench_section_note(S, "no CUDA device: skipped (cuInit returned %s)", bench_cu_name(cu, r));
    return;
  }
  if ((r = cu->device_count(&count)) || count == 0) {
    bench_section_note(S, "no CUDA device: skipped (the driver reports %d devices)", count);
    return;
  }
  const bench_device_t *devs, *d = NULL;
  size_t ndev = bench_devices(&devs);
  for (size_t i = 0; i < ndev && !d; i++)
    if (!strcmp(devs[i].info.backend, "cuda")) d = &devs[i];
  if (!d) {
    bench_section_note(S, "no CUDA device visible to kiln: skipped (the driver reports %d; see the backends line of "
                          "devinfo, and KILN_BACKEND / KILN_DEVICE)", count);
    return;
  }
  bench_cu_device dev = 0;
  bench_cu_context ctx = NULL;
  if ((r = cu->device_get(&dev, (int)d->info.backend_index)) || (r = cu->ctx_retain(&ctx, dev)) ||
      (r = cu->ctx_push(ctx)) || (r = cu->stream_create(&cu->stream, 1 /* non-blocking */))) {
    bench_section_error(S, "setting up CUDA device %u for the peers: %s", d->info.backend_index, bench_cu_name(cu, r));
    return;
  }
  bench_progress("cuda: peers on %s (%s)", d->info.selector, d->info.name);
  bench_cuda_sgemm(opts, cu, d);
  bench_cuda_copy(opts, cu, d);
  bench_cuda_launch(opts, cu, d);
  cu->stream_destroy(cu->stream);
  bench_cu_context popped;
  cu->ctx_pop(&popped);
  cu->ctx_release(dev);
  bench_section_note(S, "Peers called directly through the driver API and cuBLAS, loaded with dlopen, on the same GPU "
                        "as kiln's %s, on their own non-blocking stream. cublasSgemm is the cuBLAS kiln's backend "
                        "loaded (devinfo -v: cublas_library), multiplying the numbers kiln's matmul gets; the peer "
                        "and kiln's providers take turns, each round starting with the next. The host cost per "
                        "launch is timed in batches of %d, the GPU drained between batches untimed, so that the "
                        "driver never blocks on its queue of pending launches; 'sustained' is the GPU's pace. No "
                        "direct cuDNN peer: kiln's conv2d with provider cudnn is in section 2.",
                     d->info.selector, BENCH_LAUNCH_BATCH);
}
