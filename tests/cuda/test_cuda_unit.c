/* tests/cuda/test_cuda_unit.c: the CUDA plugin's logic that needs no GPU, called directly: vendor libraries and cuDNN's checks, cuDNN's plans and refusals, launch plans, the driver check. */
/*
 * Linked with the plugin's objects (cuda_plugin_lib) and run against the
 * toolkit's libcuda.so link stub (every driver call fails with
 * CUDA_ERROR_STUB_LIBRARY), so nothing here reaches a GPU: what runs is the
 * plugin's own code, with cuBLAS and cuDNN where the loader finds them and
 * tests/cuda/fake_cudnn.c (KILN_TEST_FAKE_CUDNN names its folder) where a
 * failing cuDNN is needed. Check forks each test, so each one dlopens afresh.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>

#include "../common.h"

#include "backends/cuda/cuda_backend.h"

/* ---- a host table for the plugin --------------------------------------------------- */

static _Thread_local char message[4096];

static kiln_status_t host_set_error(kiln_status_t status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  return status;
}
static const char *host_last_error(void) { return message; }
static void host_log(kiln_log_level_t level, const char *fmt, ...) {}
static kiln_log_level_t host_log_level(void) { return KILN_LOG_OFF; }
static const char *host_setting(const char *variable) { return NULL; }

/* What a test made, freed after it (teardown), so that LeakSanitizer, which
 * the sanitizer build runs these suites under, sees no leak: the contexts
 * (and the vendor tables they loaded), and the devices' tables of cuDNN
 * plans (with the descriptors they hold). */
#define MADE_MAX 16
static kiln_backend_context_t *made_contexts[MADE_MAX];
static struct { kiln_backend_context_t *ctx; void *cache; } made_caches[MADE_MAX];
static int made_context_count, made_cache_count;

static void made_free(void) {
  for (int i = 0; i < made_cache_count; i++) {
    kiln_backend_device_t device;
    memset(&device, 0, sizeof device);
    device.ctx = made_caches[i].ctx;
    device.cudnn_cache = made_caches[i].cache;
    kiln_cuda_cudnn_device_release(&device);
  }
  for (int i = 0; i < made_context_count; i++) {
    kiln_cuda_cudnn_unload(made_contexts[i]);
    kiln_cuda_cublas_unload(made_contexts[i]);
    free(made_contexts[i]);
  }
  made_context_count = made_cache_count = 0;
}

static kiln_backend_context_t *context_new(void) {
  kiln_backend_context_t *ctx = calloc(1, sizeof *ctx);
  ck_assert_ptr_nonnull(ctx);
  ck_assert_int_lt(made_context_count, MADE_MAX);
  made_contexts[made_context_count++] = ctx;
  ctx->host.size = sizeof ctx->host;
  ctx->host.set_error = host_set_error;
  ctx->host.last_error = host_last_error;
  ctx->host.log = host_log;
  ctx->host.log_level = host_log_level;
  ctx->host.setting = host_setting;
  kiln_cuda_host_cache_init(&ctx->host_cache);
  ck_assert_int_eq(kiln_cuda_vendor_libs_parse(ctx, NULL), KILN_OK);
  message[0] = '\0';
  return ctx;
}

#define CONTAINS(haystack, needle) \
  ck_assert_msg(strstr((haystack), (needle)) != NULL, "\"%s\" lacks \"%s\"", (haystack), (needle))

/* The fake cuDNN's folder, made the one CUDNN_PATH names. */
static const char *use_fake_cudnn(const char *mode) {
  const char *dir = getenv("KILN_TEST_FAKE_CUDNN");
  ck_assert_msg(dir && *dir, "KILN_TEST_FAKE_CUDNN must name the folder of the fake libcudnn.so.9 (meson sets it)");
  setenv("CUDNN_PATH", dir, 1);
  if (mode)
    setenv("KILN_FAKE_CUDNN_FAIL", mode, 1);
  else
    unsetenv("KILN_FAKE_CUDNN_FAIL");
  return dir;
}

/* ---- KILN_CUDA_VENDOR_LIBS ------------------------------------------------------------ */

START_TEST(test_vendor_libs_setting) {
  kiln_backend_context_t *ctx = context_new();
  const struct { const char *value; unsigned bits; } good[] = {
      {NULL, 3}, {"", 3}, {"none", 0}, {"cublas", 1}, {"cudnn", 2}, {"cudnn,cublas", 3}, {"cublas,cublas", 1},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    ck_assert_int_eq(kiln_cuda_vendor_libs_parse(ctx, good[i].value), KILN_OK);
    ck_assert_uint_eq(ctx->vendor_libs, good[i].bits);
  }
  const char *bad[] = {"cublas,", "CUDNN", "all", ",cudnn", "cudnn none"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(kiln_cuda_vendor_libs_parse(ctx, bad[i]), KILN_INVALID_ARGUMENT);
    CONTAINS(message, bad[i]);
    CONTAINS(message, "cublas and cudnn");
  }
  ck_assert_int_eq(kiln_cuda_vendor_libs_parse(ctx, "cublas"), KILN_OK);
  char reason[512];
  ck_assert(!kiln_cuda_cudnn_load(ctx, reason, sizeof reason));
  ck_assert_str_eq(reason, "not loaded: KILN_CUDA_VENDOR_LIBS='cublas' leaves cudnn out");
  ck_assert_ptr_null(ctx->cudnn);
}
END_TEST

/* ---- finding libraries ----------------------------------------------------------------- */

START_TEST(test_missing_library_says_where_it_looked) {
  setenv("CUDNN_PATH", "/nonexistent/cudnn-root", 1);
  setenv("CUDA_PATH", "/nonexistent/cuda-root", 1);
  const char *names[] = {"libkiln-no-such-library.so.9"};
  char path[512] = "", reason[2048] = "";
  void *library = kiln_cuda_vendor_open(KILN_CUDA_VENDOR_CUDNN, names, 1, path, sizeof path, reason, sizeof reason);
  ck_assert_ptr_null(library);
  ck_assert_msg(!strstr(reason, "(null)"), "reason '%s'", reason);
  CONTAINS(reason, "libkiln-no-such-library.so.9");
  CONTAINS(reason, "/nonexistent/cudnn-root/lib/libkiln-no-such-library.so.9");
  CONTAINS(reason, "/nonexistent/cuda-root/lib64/libkiln-no-such-library.so.9");
  CONTAINS(reason, "the loader's search");
  /* dlerror() with nothing to report is NULL: the plugin never prints it. */
  (void)dlerror();
  const char *text = kiln_cuda_dlerror();
  ck_assert_ptr_nonnull(text);
  ck_assert_str_ne(text, "(null)");
}
END_TEST

/* ---- cuDNN's checks at load -------------------------------------------------------------- */

START_TEST(test_real_cudnn_passes_its_checks_without_a_gpu) {
  unsetenv("CUDNN_PATH");
  unsetenv("KILN_FAKE_CUDNN_FAIL");
  kiln_backend_context_t *ctx = context_new();
  char reason[1024] = "";
  if (!kiln_cuda_cudnn_load(ctx, reason, sizeof reason)) {
    /* No cuDNN installed is fine; one that loads but fails is not. */
    ck_assert_msg(strstr(reason, "cannot open shared object file") != NULL, "cuDNN did not load: %s", reason);
    printf("no cuDNN on this machine (%s): nothing to check\n", reason);
    return;
  }
  ck_assert_ptr_nonnull(ctx->cudnn);
  ck_assert_msg(!strncmp(ctx->cudnn_version, "cuDNN 9.", 8), "version '%s'", ctx->cudnn_version);
  ck_assert_msg(ctx->cudnn_path[0] == '/', "path '%s'", ctx->cudnn_path);
  ck_assert_msg(strcmp(ctx->cudnn_version, "cuDNN 9.19.99"), "the test's fake cuDNN loaded, from %s", ctx->cudnn_path);
  printf("%s from %s passes cudnnGraphVersionCheck, cudnnOpsVersionCheck, cudnnCnnVersionCheck\n",
         ctx->cudnn_version, ctx->cudnn_path);
}
END_TEST

START_TEST(test_real_cublas_loads_without_a_gpu) {
  kiln_backend_context_t *ctx = context_new();
  char reason[1024] = "";
  if (!kiln_cuda_cublas_load(ctx, reason, sizeof reason)) {
    ck_assert_msg(strstr(reason, "cannot open shared object file") != NULL, "cuBLAS did not load: %s", reason);
    printf("no cuBLAS on this machine (%s)\n", reason);
    return;
  }
  ck_assert_msg(!strncmp(ctx->cublas_version, "cuBLAS ", 7), "version '%s'", ctx->cublas_version);
  ck_assert_msg(ctx->cublas_path[0] == '/', "path '%s'", ctx->cublas_path);
}
END_TEST

/* A half-installed cuDNN: the shim loads, a sub-library does not. The
 * provider is absent, and the reason names the check and the library. */
START_TEST(test_incomplete_cudnn_is_absent) {
  static const struct { const char *mode, *call, *sublib; } cases[] = {
      {"graph", "cudnnGraphVersionCheck", "libcudnn_graph.so.9"},
      {"ops", "cudnnOpsVersionCheck", "libcudnn_ops.so.9"},
      {"cnn", "cudnnCnnVersionCheck", "libcudnn_cnn.so.9"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *dir = use_fake_cudnn(cases[i].mode);
    kiln_backend_context_t *ctx = context_new();
    char reason[1024] = "";
    ck_assert(!kiln_cuda_cudnn_load(ctx, reason, sizeof reason));
    ck_assert_ptr_null(ctx->cudnn);
    CONTAINS(reason, cases[i].call);
    CONTAINS(reason, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED (1008)");
    CONTAINS(reason, cases[i].sublib);
    CONTAINS(reason, dir);
    CONTAINS(reason, "CUDNN_PATH");
  }
  /* Another major version than 9: absent too. */
  use_fake_cudnn(NULL);
  setenv("KILN_FAKE_CUDNN_VERSION", "80904", 1);
  kiln_backend_context_t *ctx = context_new();
  char reason[1024] = "";
  ck_assert(!kiln_cuda_cudnn_load(ctx, reason, sizeof reason));
  CONTAINS(reason, "cuDNN 8.9.4");
  CONTAINS(reason, "cuDNN 9");
  unsetenv("KILN_FAKE_CUDNN_VERSION");
  /* And complete, it loads from CUDNN_PATH. */
  ck_assert_msg(kiln_cuda_cudnn_load(ctx, reason, sizeof reason), "%s", reason);
  ck_assert_str_eq(ctx->cudnn_version, "cuDNN 9.19.99");
  CONTAINS(ctx->cudnn_path, getenv("KILN_TEST_FAKE_CUDNN"));
}
END_TEST

/* ---- cuDNN at op time: handles, sub-libraries, refusals -------------------------------- */

typedef struct fixture_t {
  kiln_backend_context_t *ctx;
  kiln_backend_device_t device;
  kiln_backend_queue_t queue, queue2;
  kiln_backend_buffer_t buffer;
} fixture_t;

static void fixture_init(fixture_t *f) {
  memset(f, 0, sizeof *f);
  f->ctx = context_new();
  char reason[1024];
  ck_assert_msg(kiln_cuda_cudnn_load(f->ctx, reason, sizeof reason), "the fake cuDNN does not load: %s", reason);
  f->device.ctx = f->ctx;
  atomic_init(&f->device.cudnn_failed, false);
  atomic_init(&f->device.cublas_failed, false);
  ck_assert_int_eq(kiln_cuda_cudnn_device_init(&f->device), KILN_OK);
  ck_assert_int_lt(made_cache_count, MADE_MAX);
  made_caches[made_cache_count].ctx = f->ctx;
  made_caches[made_cache_count++].cache = f->device.cudnn_cache;
  f->queue.device = f->queue2.device = &f->device;
  pthread_mutex_init(&f->queue.lock, NULL);
  pthread_mutex_init(&f->queue2.lock, NULL);
  f->buffer.device = &f->device;
}

/* A 3x3 convolution of [1, 2, 9 + rows, 9] by [4, 2, 3, 3] (stride 1, pad 1). */
static kiln_op_t conv_op(fixture_t *f, int rows) {
  kiln_op_t op;
  memset(&op, 0, sizeof op);
  op.kind = KILN_OP_CONV2D;
  op.n_in = 2;
  op.u.conv2d.n = 1, op.u.conv2d.c = 2, op.u.conv2d.h = 9 + rows, op.u.conv2d.w = 9;
  op.u.conv2d.k = 4, op.u.conv2d.r = 3, op.u.conv2d.s = 3, op.u.conv2d.p = 9 + rows, op.u.conv2d.q = 9;
  for (int i = 0; i < 2; i++) op.u.conv2d.stride[i] = op.u.conv2d.pad[i] = op.u.conv2d.dil[i] = 1;
  op.in[0].buffer = op.in[1].buffer = op.out.buffer = &f->buffer;
  return op;
}

START_TEST(test_cudnn_handle_failure_is_remembered) {
  use_fake_cudnn("create");
  fixture_t f;
  fixture_init(&f);
  kiln_op_t op = conv_op(&f, 0);
  ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, NULL));
  ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &op));
  /* KILN_UNAVAILABLE: the core falls back to native and stops offering the
   * row; the device says so from now on. */
  ck_assert_int_eq(kiln_cuda_cudnn_conv2d(f.ctx, &f.queue, &op), KILN_UNAVAILABLE);
  CONTAINS(message, "cuDNN cannot start on cuda:0");
  CONTAINS(message, "CUDNN_STATUS_NOT_INITIALIZED");
  ck_assert(!kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, NULL));
  ck_assert(!kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &op));
}
END_TEST

START_TEST(test_cudnn_sublibrary_failure_at_run_time) {
  /* The checks passed at load, yet the algorithm query cannot load its
   * sub-library: this provider cannot serve here, not "these arguments". */
  use_fake_cudnn("algorithm");
  fixture_t f;
  fixture_init(&f);
  kiln_op_t op = conv_op(&f, 0);
  ck_assert_int_eq(kiln_cuda_cudnn_conv2d(f.ctx, &f.queue, &op), KILN_UNAVAILABLE);
  CONTAINS(message, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED");
  ck_assert(!kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, NULL));
}
END_TEST

START_TEST(test_cudnn_refusals_are_remembered) {
  fixture_t f;
  use_fake_cudnn("shape");
  fixture_init(&f);
  /* cuDNN computes another output shape: the native provider runs it, and
   * the shape is not offered to cuDNN again. */
  kiln_op_t op = conv_op(&f, 0);
  ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &op));
  ck_assert_int_eq(kiln_cuda_cudnn_conv2d(f.ctx, &f.queue, &op), KILN_UNSUPPORTED);
  CONTAINS(message, "another output shape");
  ck_assert(!kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &op));
  ck_assert_int_eq(kiln_cuda_cudnn_conv2d(f.ctx, &f.queue, &op), KILN_UNSUPPORTED);
  CONTAINS(message, "found earlier");
  /* Pooling too. */
  kiln_op_t pool;
  memset(&pool, 0, sizeof pool);
  pool.kind = KILN_OP_MAX_POOL2D;
  pool.n_in = 1;
  pool.u.pooling.n = 1, pool.u.pooling.c = 3, pool.u.pooling.h = 8, pool.u.pooling.w = 8;
  pool.u.pooling.p = 4, pool.u.pooling.q = 4;
  pool.u.pooling.window[0] = pool.u.pooling.window[1] = 2;
  pool.u.pooling.stride[0] = pool.u.pooling.stride[1] = 2;
  pool.in[0].buffer = pool.out.buffer = &f.buffer;
  ck_assert_int_eq(kiln_cuda_cudnn_max_pool2d(f.ctx, &f.queue, &pool), KILN_UNSUPPORTED);
  ck_assert(!kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &pool));
  /* And the gradients, each kind apart from the forward of the same shape. */
  const kiln_op_kind_t gradients[2] = {KILN_OP_CONV2D_BACKWARD_INPUT, KILN_OP_CONV2D_BACKWARD_WEIGHT};
  for (int i = 0; i < 2; i++) {
    kiln_op_t grad = conv_op(&f, 3);
    grad.kind = gradients[i];
    ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &grad));
    const kiln_status_t status = i == 0 ? kiln_cuda_cudnn_conv2d_backward_input(f.ctx, &f.queue, &grad)
                                        : kiln_cuda_cudnn_conv2d_backward_weight(f.ctx, &f.queue, &grad);
    ck_assert_int_eq(status, KILN_UNSUPPORTED);
    CONTAINS(message, kiln_backend_op_kind_name(gradients[i]));
    CONTAINS(message, "another output shape");
    ck_assert(!kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &grad));
  }
  /* A status cuDNN gives for the arguments is a refusal too; other shapes
   * and the device stay offered. */
  setenv("KILN_FAKE_CUDNN_FAIL", "refuse", 1);
  kiln_op_t other = conv_op(&f, 1);
  ck_assert_int_eq(kiln_cuda_cudnn_conv2d(f.ctx, &f.queue, &other), KILN_UNSUPPORTED);
  CONTAINS(message, "CUDNN_STATUS_NOT_SUPPORTED");
  ck_assert(!kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &other));
  kiln_op_t third = conv_op(&f, 2);
  ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &third));
  ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, NULL));
}
END_TEST

typedef struct planner_t {
  fixture_t *f;
  kiln_op_t op;
  kiln_status_t status;
} planner_t;

static void *plan_in_thread(void *arg) {
  planner_t *p = arg;
  p->status = kiln_cuda_cudnn_conv2d(p->f->ctx, &p->f->queue, &p->op);
  return NULL;
}

/* One queue's algorithm search does not hold up the device's other queues. */
START_TEST(test_cudnn_search_holds_no_device_lock) {
  fixture_t f;
  use_fake_cudnn("shape");
  fixture_init(&f);
  kiln_op_t known = conv_op(&f, 5);
  ck_assert_int_eq(kiln_cuda_cudnn_conv2d(f.ctx, &f.queue2, &known), KILN_UNSUPPORTED); /* planned: refused */
  unsetenv("KILN_FAKE_CUDNN_FAIL");
  void *fake = dlopen(f.ctx->cudnn_path, RTLD_NOW | RTLD_NOLOAD);
  ck_assert_ptr_nonnull(fake);
  void (*hold)(int) = NULL;
  int (*waiting)(void) = NULL;
  ck_assert(kiln_cuda_vendor_sym(fake, "kiln_fake_cudnn_hold", &hold, sizeof hold));
  ck_assert(kiln_cuda_vendor_sym(fake, "kiln_fake_cudnn_waiting", &waiting, sizeof waiting));
  hold(1);
  planner_t p = {&f, conv_op(&f, 0), KILN_OK};
  pthread_t thread;
  ck_assert_int_eq(pthread_create(&thread, NULL, plan_in_thread, &p), 0);
  const struct timespec tick = {0, 1000000};
  for (int i = 0; i < 4000 && !waiting(); i++) nanosleep(&tick, NULL);
  ck_assert_msg(waiting() == 1, "the planning thread never reached cuDNN's algorithm search");
  /* While that search waits inside cuDNN, another queue runs a known shape. */
  ck_assert_int_eq(kiln_cuda_cudnn_conv2d(f.ctx, &f.queue2, &known), KILN_UNSUPPORTED);
  CONTAINS(message, "found earlier");
  ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &p.op));
  ck_assert_msg(waiting() == 1, "the other queue's call returned only after the search ended");
  hold(0);
  pthread_join(thread, NULL);
  /* The planned shape's plan was made and kept; running it then needs the
   * workspace, which the link stub cannot allocate: not a refusal. */
  ck_assert_int_ne(p.status, KILN_UNSUPPORTED);
  ck_assert(kiln_cuda_cudnn_supports(f.ctx, &f.device, NULL, &p.op));
}
END_TEST

/* ---- error translation ------------------------------------------------------------------ */

START_TEST(test_cudnn_status_translation) {
  kiln_backend_context_t *ctx = context_new();
  const struct { int status; kiln_status_t code; } cases[] = {
      {1001, KILN_UNAVAILABLE}, {1002, KILN_UNAVAILABLE}, {1008, KILN_UNAVAILABLE}, {3005, KILN_UNAVAILABLE},
      {3007, KILN_UNAVAILABLE}, {3009, KILN_UNAVAILABLE}, {2000, KILN_UNSUPPORTED}, {3000, KILN_UNSUPPORTED},
      {3002, KILN_UNSUPPORTED}, {4003, KILN_OUT_OF_MEMORY}, {4004, KILN_OUT_OF_MEMORY}, {5000, KILN_DEVICE_LOST},
      {4000, KILN_INTERNAL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(kiln_cuda_cudnn_check(ctx, cases[i].status, "NAME", "%s", "call"), cases[i].code);
    CONTAINS(message, "NAME");
  }
  ck_assert_int_eq(kiln_cuda_cudnn_check(ctx, 1008, NULL, "%s", "cudnnConvolutionForward"), KILN_UNAVAILABLE);
  CONTAINS(message, "the native provider runs instead");
  ck_assert_int_eq(kiln_cuda_cublas_check(ctx, 1, "%s", "cublasCreate"), KILN_UNAVAILABLE);
  CONTAINS(message, "the native provider runs instead");
}
END_TEST

/* ---- the driver's version ----------------------------------------------------------------- */

START_TEST(test_driver_version_check) {
  kiln_backend_context_t *ctx = context_new();
  /* The link stub exports every entry point, cuEventElapsedTime_v2 too. */
  ck_assert_int_eq(kiln_cuda_driver_check(ctx, 12080), KILN_OK);
  ck_assert_int_eq(kiln_cuda_driver_check(ctx, 13000), KILN_OK);
  ck_assert_int_eq(kiln_cuda_driver_check(ctx, 12060), KILN_UNAVAILABLE);
  CONTAINS(message, "supports CUDA 12.6");
  CONTAINS(message, "CUDA 12.8 or newer");
  CONTAINS(message, "cuEventElapsedTime_v2");
  CONTAINS(message, "update the NVIDIA driver");
  ck_assert_int_eq(kiln_cuda_driver_check(ctx, 0), KILN_UNAVAILABLE);
  CONTAINS(message, "(unknown)");
}
END_TEST

/* ---- launch plans --------------------------------------------------------------------------- */

START_TEST(test_gemm_grid_is_tiled) {
  kiln_backend_context_t *ctx = context_new();
  unsigned grid[3];
  /* m = 8,388,609 needed 65,537 row tiles: refused before, tiled now. */
  ck_assert_int_eq(kiln_cuda_gemm_grid(ctx, 8388609, 1, 1, grid), KILN_OK);
  ck_assert_uint_eq(grid[0], 1);
  ck_assert_uint_eq(grid[1], 65535);
  ck_assert_uint_eq(grid[2], 1);
  ck_assert_int_eq(kiln_cuda_gemm_grid(ctx, 300, 1000, 100000, grid), KILN_OK);
  ck_assert_uint_eq(grid[0], 8);
  ck_assert_uint_eq(grid[1], 3);
  ck_assert_uint_eq(grid[2], 65535);
  ck_assert_int_eq(kiln_cuda_gemm_grid(ctx, (int64_t)1 << 33, (int64_t)1 << 33, 1, grid), KILN_OK);
  ck_assert_uint_eq(grid[0], 1u << 26);
  ck_assert_int_eq(kiln_cuda_gemm_grid(ctx, (int64_t)1 << 38, 1, 1, grid), KILN_OUT_OF_RESOURCES);
  CONTAINS(message, "below 2^38");
  /* The argument struct carries 64-bit sizes: k near INT_MAX and beyond. */
  kiln_cuda_gemm_args_t a;
  memset(&a, 0, sizeof a);
  a.k = (int64_t)INT32_MAX - 3;
  ck_assert(a.k + 7 > 0);
  a.m = (int64_t)1 << 32;
  ck_assert(a.m > INT32_MAX);
}
END_TEST

START_TEST(test_reduce_plans_split_long_axes) {
  kiln_cuda_reduce_plan_t plan;
  kiln_cuda_reduce_args_t a;
  /* Axis 0 of [1e6, 4]: four columns, a long axis. It used to run on four
   * threads; now on hundreds of blocks, merged by a second pass. */
  memset(&a, 0, sizeof a);
  a.outer = 1, a.len = 1000000, a.inner = 4;
  kiln_cuda_reduce_plan(&a, 132, &plan);
  ck_assert(plan.cols);
  ck_assert_int_eq(a.width, 4);
  ck_assert_int_ge(plan.blocks, 132 * 2);
  ck_assert_int_eq(plan.blocks, a.chunks);
  ck_assert_int_ge(a.chunk * a.chunks, a.len);
  ck_assert_int_lt((a.chunks - 1) * a.chunk, a.len);
  ck_assert_int_eq(plan.parts_rows, 4);
  /* Many columns: whole warps of them, no split needed. */
  memset(&a, 0, sizeof a);
  a.outer = 64, a.len = 1000, a.inner = 4096;
  kiln_cuda_reduce_plan(&a, 132, &plan);
  ck_assert(plan.cols);
  ck_assert_int_eq(a.width, 32);
  ck_assert_int_eq(a.chunks, 1);
  ck_assert_int_eq(plan.blocks, 64 * 128);
  ck_assert_int_eq(plan.parts_rows, 0);
  /* Width follows small inner sizes: 3 -> 4, 17 -> 32. */
  memset(&a, 0, sizeof a);
  a.outer = 2, a.len = 10, a.inner = 3;
  kiln_cuda_reduce_plan(&a, 132, &plan);
  ck_assert_int_eq(a.width, 4);
  ck_assert_int_eq(a.chunks, 1);
  a.inner = 17;
  kiln_cuda_reduce_plan(&a, 132, &plan);
  ck_assert_int_eq(a.width, 32);
  /* An empty axis: one pass writes the empty results. */
  memset(&a, 0, sizeof a);
  a.outer = 3, a.len = 0, a.inner = 1;
  kiln_cuda_reduce_plan(&a, 132, &plan);
  ck_assert(plan.cols);
  ck_assert_int_eq(a.chunks, 1);
  ck_assert_int_eq(plan.parts_rows, 0);
  /* Rows: long ones split when few, as before. */
  memset(&a, 0, sizeof a);
  a.outer = 4, a.len = 1000000, a.inner = 1;
  kiln_cuda_reduce_plan(&a, 132, &plan);
  ck_assert(!plan.cols);
  ck_assert_int_gt(a.chunks, 1);
  ck_assert_int_eq(plan.blocks, 4 * a.chunks);
  ck_assert_int_eq(plan.parts_rows, 4);
  a.outer = 100000, a.len = 100;
  kiln_cuda_reduce_plan(&a, 132, &plan);
  ck_assert_int_eq(a.chunks, 1);
}
END_TEST

/* ---- memory settings ------------------------------------------------------------------------ */

START_TEST(test_pool_and_host_cache_sizes) {
  ck_assert_uint_eq(kiln_cuda_pool_threshold((uint64_t)80 << 30), (uint64_t)2 << 30);
  ck_assert_uint_eq(kiln_cuda_pool_threshold((uint64_t)8 << 30), (uint64_t)1 << 30);
  ck_assert_uint_eq(kiln_cuda_pool_threshold((uint64_t)1 << 30), (uint64_t)256 << 20);
  ck_assert_int_eq(kiln_cuda_host_class(1), 0);
  ck_assert_int_eq(kiln_cuda_host_class((size_t)64 << 10), 0);
  ck_assert_int_eq(kiln_cuda_host_class(((size_t)64 << 10) + 1), 1);
  ck_assert_int_eq(kiln_cuda_host_class((size_t)4 << 20), 6);
  ck_assert_int_eq(kiln_cuda_host_class(KILN_CUDA_STAGE_MAX), KILN_CUDA_HOST_CLASSES - 1);
  ck_assert_int_eq(kiln_cuda_host_class(KILN_CUDA_STAGE_MAX + 1), -1);
}
END_TEST

int main(void) {
  Suite *suite = suite_create("cuda-unit");
  TCase *tc = tcase_create("cuda-unit");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, NULL, made_free);
  tcase_add_test(tc, test_vendor_libs_setting);
  tcase_add_test(tc, test_missing_library_says_where_it_looked);
  tcase_add_test(tc, test_real_cudnn_passes_its_checks_without_a_gpu);
  tcase_add_test(tc, test_real_cublas_loads_without_a_gpu);
  tcase_add_test(tc, test_incomplete_cudnn_is_absent);
  tcase_add_test(tc, test_cudnn_handle_failure_is_remembered);
  tcase_add_test(tc, test_cudnn_sublibrary_failure_at_run_time);
  tcase_add_test(tc, test_cudnn_refusals_are_remembered);
  tcase_add_test(tc, test_cudnn_search_holds_no_device_lock);
  tcase_add_test(tc, test_cudnn_status_translation);
  tcase_add_test(tc, test_driver_version_check);
  tcase_add_test(tc, test_gemm_grid_is_tiled);
  tcase_add_test(tc, test_reduce_plans_split_long_axes);
  tcase_add_test(tc, test_pool_and_host_cache_sizes);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed == 0 ? 0 : 1;
}
