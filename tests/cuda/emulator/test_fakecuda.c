/* tests/cuda/emulator/test_fakecuda.c: the test driver tested through the driver API alone: what it refuses, what it reports, and that its barriers, shuffles and streams behave as a GPU's. */
/*
 * The OpenCL ICD loader tests itself against a stub driver; this suite does
 * the same for the CUDA test driver, so that the runs of kiln's suites
 * against it mean something: a call without a current context and a launch
 * over the device's or the kernel's limits are refused with the driver's
 * CUresult, kernel misuse fails the launch, and correct kernels (the test
 * driver's own, and kiln's SGEMM variants and chunked reduction, which the
 * conformance suite does not reach) give exact results.
 *
 * Run with KILN_FAKECUDA_DEVICES=2 and the path of kiln's fatbin as argv[1].
 * The refusals print "kiln-fakecuda: error:" lines on purpose.
 */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "kop.h"
#include "launch.h"
#include "selftest_args.h"

static unsigned char *fatbin;
static CUcontext ctx;
static CUmodule module;

static const char *name_of(CUresult r) {
  const char *s = NULL;
  return cuGetErrorName(r, &s) == CUDA_SUCCESS && s ? s : "(unknown CUresult)";
}

#define CU_OK(call)                                                                                \
  do {                                                                                             \
    const CUresult r_ = (call);                                                                    \
    ck_assert_msg(r_ == CUDA_SUCCESS, "%s returned %s", #call, name_of(r_));                       \
  } while (0)
#define CU_IS(expected, call)                                                                      \
  do {                                                                                             \
    const CUresult r_ = (call);                                                                    \
    ck_assert_msg(r_ == (expected), "%s returned %s, expected %s", #call, name_of(r_), name_of(expected)); \
  } while (0)

static CUfunction function(const char *name) {
  CUfunction f = NULL;
  CU_OK(cuModuleGetFunction(&f, module, name));
  return f;
}

/* Retain and push device 0's primary context, load kiln's fatbin. */
static void open_context(void) {
  CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CU_OK(cuCtxPushCurrent(ctx));
  CU_OK(cuModuleLoadData(&module, fatbin));
}

/* Undo open_context; the last release also forgets a fault. */
static void close_context(void) {
  (void)cuModuleUnload(module);
  CUcontext popped = NULL;
  (void)cuCtxPopCurrent(&popped);
  (void)cuDevicePrimaryCtxRelease(0);
}

static CUresult launch(CUfunction f, unsigned grid, unsigned block, CUstream stream, const void *args) {
  void *params[1] = {(void *)args};
  return cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, params, NULL);
}

/* ---- what needs a context --------------------------------------------------------------------- */

START_TEST(test_calls_without_a_context_are_refused) {
  CUdeviceptr p = 0;
  CUstream s = NULL;
  CUevent e = NULL;
  CUmodule m = NULL;
  size_t free_bytes, total;
  int value = 0;
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&p, 64));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuMemGetInfo(&free_bytes, &total));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuStreamCreate(&s, 0));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuEventCreate(&e, 0));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuModuleLoadData(&m, fatbin));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuMemcpyHtoDAsync(p, &value, sizeof value, NULL));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuCtxPopCurrent(NULL));
  /* Device queries need none. */
  CU_OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0));

  /* A primary context that is not retained cannot be made current... */
  CUcontext c = NULL;
  CU_OK(cuDevicePrimaryCtxRetain(&c, 0));
  CU_OK(cuDevicePrimaryCtxRelease(0));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuCtxPushCurrent(c));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuDevicePrimaryCtxRelease(0));
  /* ... and one released while pushed stops working. */
  CU_OK(cuDevicePrimaryCtxRetain(&c, 0));
  CU_OK(cuCtxPushCurrent(c));
  CU_OK(cuMemGetInfo(&free_bytes, &total));
  CU_OK(cuDevicePrimaryCtxRelease(0));
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuMemGetInfo(&free_bytes, &total));
  CU_OK(cuCtxPopCurrent(NULL));
}
END_TEST

START_TEST(test_the_device) {
  int count = 0, v = 0;
  CU_OK(cuDeviceGetCount(&count));
  ck_assert_int_eq(count, 2);
  static const struct {
    CUdevice_attribute attribute;
    int value;
  } expected[] = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024}, {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},  {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},       {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9}, {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
  };
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
    CU_OK(cuDeviceGetAttribute(&v, expected[i].attribute, 1));
    ck_assert_msg(v == expected[i].value, "attribute %d is %d, expected %d", (int)expected[i].attribute, v,
                  expected[i].value);
  }
  /* An attribute it does not model is refused, not invented. */
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, 0));
  CU_IS(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 2));
  char bus[32];
  CU_OK(cuDeviceGetPCIBusId(bus, sizeof bus, 1));
  ck_assert_str_eq(bus, "0000:2A:00.0");
  int peer = -1;
  CU_OK(cuDeviceCanAccessPeer(&peer, 0, 1));
  ck_assert_int_eq(peer, 1);
  CU_OK(cuDeviceCanAccessPeer(&peer, 0, 0));
  ck_assert_int_eq(peer, 0);
  int version = 0;
  CU_OK(cuDriverGetVersion(&version));
  ck_assert_int_eq(version, CUDA_VERSION);
}
END_TEST

/* ---- launches ------------------------------------------------------------------------------------ */

START_TEST(test_launches_over_the_limits_are_refused) {
  CUfunction fill = function("kiln_fill_i32"), gemm = function("kiln_sgemm_nn");
  CUdeviceptr out;
  CU_OK(cuMemAlloc(&out, 4096 * 4));
  kiln_kop_t a;
  memset(&a, 0, sizeof a);
  a.out.addr = out;
  a.n = 4096;
  a.u.fill.value.bits = 7; /* FILL stores the value's bits in the dtype */
  void *params[1] = {&a};
  /* The device's grid and block limits. */
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 1, 65536, 1, 256, 1, 1, 0, NULL, params, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 1, 1, 65536, 256, 1, 1, 0, NULL, params, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 0, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 1, 1, 1, 1025, 1, 1, 0, NULL, params, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 1, 1, 1, 1, 1, 65, 0, NULL, params, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 1, 1, 1, 32, 32, 2, 0, NULL, params, NULL));
  /* Shared memory: 48 KiB per block, the kernel's static share included. */
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 49153, NULL, params, NULL));
  kiln_kop_t g;
  memset(&g, 0, sizeof g); /* batch 0: a launch that touches nothing */
  void *gemm_params[1] = {&g};
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(gemm, 1, 1, 1, 256, 1, 1, 32769, NULL, gemm_params, NULL));
  CU_OK(cuLaunchKernel(gemm, 1, 1, 1, 256, 1, 1, 32768, NULL, gemm_params, NULL));
  /* The kernel's own bound: kiln's kernels declare __launch_bounds__(256). */
  CU_IS(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, cuLaunchKernel(fill, 1, 1, 1, 512, 1, 1, 0, NULL, params, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL));

  /* None of that broke the context: a right launch runs, on the NULL stream
   * and on a stream. */
  CU_OK(cuLaunchKernel(fill, 4, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
  uint32_t back[4096];
  CU_OK(cuMemcpyDtoHAsync(back, out, sizeof back, NULL));
  for (int i = 0; i < 4096; i++) ck_assert_uint_eq(back[i], 7u);
  CUstream s;
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  a.u.fill.value.bits = 9;
  a.n = 1000;
  CU_OK(cuLaunchKernel(fill, 2, 1, 1, 256, 1, 1, 0, s, params, NULL));
  a.u.fill.value.bits = 0; /* the launch copied the arguments */
  CU_OK(cuMemcpyDtoHAsync(back, out, sizeof back, s));
  for (int i = 0; i < 4096; i++) ck_assert_uint_eq(back[i], i < 1000 ? 9u : 7u);
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuMemFree(out));
}
END_TEST

START_TEST(test_modules) {
  CUfunction f;
  CU_IS(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction(&f, module, "kiln_no_such_kernel"));
  CUmodule m;
  static const unsigned char garbage[64] = "not a fatbin";
  CU_IS(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, garbage));
  /* A fatbin with one entry: sm_75 SASS does not run on 9.0, compute_75 PTX
   * is compiled for it. */
  _Alignas(8) unsigned char image[16 + 64];
  memset(image, 0, sizeof image);
  const uint32_t magic = 0xBA55ED50u, arch = 75, entry_header = 64;
  const uint64_t payload = 64;
  memcpy(image, &magic, 4);
  image[4] = 1;
  image[6] = 16;
  memcpy(image + 8, &payload, 8);
  image[16] = 2; /* ELF */
  memcpy(image + 16 + 4, &entry_header, 4);
  memcpy(image + 16 + 28, &arch, 4);
  CU_IS(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleLoadData(&m, image));
  image[16] = 1; /* PTX */
  CU_OK(cuModuleLoadData(&m, image));
  CUfunction stale = NULL;
  CU_OK(cuModuleGetFunction(&stale, m, "kiln_fill_i32"));
  CU_OK(cuModuleUnload(m));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(stale, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
}
END_TEST

/* ---- memory ------------------------------------------------------------------------------------------- */

START_TEST(test_memory) {
  size_t free0, free1, total;
  CU_OK(cuMemGetInfo(&free0, &total));
  CUdeviceptr d, e;
  CU_OK(cuMemAlloc(&d, 1000));
  CU_OK(cuMemAlloc(&e, 1000));
  CU_OK(cuMemGetInfo(&free1, &total));
  ck_assert_uint_eq(free0 - free1, 2000);
  ck_assert_uint_eq(d % 256, 0);
  unsigned char bytes[1000];
  /* New device memory holds 0xff bytes (NaN, -1), not zeros. */
  CU_OK(cuMemcpyDtoHAsync(bytes, d, sizeof bytes, NULL));
  for (int i = 0; i < 1000; i++) ck_assert_uint_eq(bytes[i], 0xff);

  for (int i = 0; i < 1000; i++) bytes[i] = (unsigned char)i;
  CU_OK(cuMemcpyHtoDAsync(d, bytes, sizeof bytes, NULL));
  CU_OK(cuMemsetD8Async(d + 1, 0xab, 3, NULL));
  CU_OK(cuMemsetD16Async(d + 4, 0x1234, 2, NULL));
  CU_OK(cuMemsetD32Async(d + 8, 0xdeadbeefu, 2, NULL));
  CU_OK(cuMemsetD2D8Async(d + 100, 10, 0x77, 2, 3, NULL)); /* bytes 100, 101, 110, 111, 120, 121 */
  CU_OK(cuMemcpyDtoDAsync(e, d, 1000, NULL));
  unsigned char back[1000];
  CU_OK(cuMemcpyDtoHAsync(back, e, sizeof back, NULL));
  ck_assert_uint_eq(back[0], 0);
  ck_assert_uint_eq(back[1], 0xab);
  ck_assert_uint_eq(back[3], 0xab);
  uint16_t h;
  memcpy(&h, back + 6, 2);
  ck_assert_uint_eq(h, 0x1234);
  uint32_t w;
  memcpy(&w, back + 12, 4);
  ck_assert_uint_eq(w, 0xdeadbeefu);
  ck_assert_uint_eq(back[100], 0x77);
  ck_assert_uint_eq(back[111], 0x77);
  ck_assert_uint_eq(back[112], 112);
  ck_assert_uint_eq(back[121], 0x77);
  ck_assert_uint_eq(back[999], 999 % 256);

  /* Ranges outside an allocation, overlaps, misalignment, double frees. */
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoDAsync(d + 1, bytes, 1000, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoHAsync(back, d - 1, 4, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoDAsync(d + 1, d, 100, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemsetD32Async(d + 2, 0, 1, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemsetD8Async(d + 999, 0, 2, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemFree(d + 4));
  CU_OK(cuMemFree(d));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemFree(d));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemsetD8Async(d, 0, 1, NULL));
  CU_OK(cuMemFree(e));

  void *pinned = NULL;
  CU_OK(cuMemHostAlloc(&pinned, 64, CU_MEMHOSTALLOC_PORTABLE));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(bytes));
  CU_OK(cuMemFreeHost(pinned));
}
END_TEST

START_TEST(test_the_pool) {
  CUmemoryPool pool;
  CU_OK(cuDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t threshold = UINT64_MAX, used = 1, reserved = 0;
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  CUstream s;
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p;
  CU_OK(cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s));
  CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
  ck_assert_uint_eq(used, 1 << 20);
  CU_OK(cuMemsetD32Async(p, 5, 1 << 18, s));
  CU_OK(cuMemFreeAsync(p, s));
  /* Gone for every later call, even before the free runs. */
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemsetD32Async(p, 5, 1, s));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
  CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  ck_assert_uint_eq(used, 0);
  ck_assert_uint_eq(reserved, 1 << 20); /* kept: the threshold is unlimited */
  CU_OK(cuMemPoolTrimTo(pool, 0));
  CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  ck_assert_uint_eq(reserved, 0);
  CU_OK(cuStreamDestroy(s));
}
END_TEST

/* ---- streams and events ---------------------------------------------------------------------------- */

START_TEST(test_streams_are_asynchronous_and_ordered) {
  CUfunction gate_kernel = function("fakecuda_test_wait_flag");
  void *pinned;
  CU_OK(cuMemHostAlloc(&pinned, 4096, 0));
  volatile int *gate = pinned;
  int *host = (int *)pinned + 16;
  *gate = 0;
  host[0] = -1;
  CUdeviceptr d, flag_out;
  CU_OK(cuMemAlloc(&d, 64));
  CU_OK(cuMemAlloc(&flag_out, 64));
  CU_OK(cuMemsetD32Async(d, 42, 16, NULL));
  CUstream a, b;
  CU_OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CU_OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUevent start, end, untimed;
  CU_OK(cuEventCreate(&start, 0));
  CU_OK(cuEventCreate(&end, 0));
  CU_OK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));

  /* Stream a: record, wait at the gate, copy into pinned memory, record. */
  fakecuda_test_args_t g;
  memset(&g, 0, sizeof g);
  g.flag = (uint64_t)(uintptr_t)gate;
  g.out = flag_out;
  CU_OK(cuEventRecord(start, a));
  CU_OK(launch(gate_kernel, 1, 1, a, &g));
  CU_OK(cuMemcpyDtoHAsync(host, d, 4, a));
  CU_OK(cuEventRecord(end, a));
  CU_OK(cuEventRecord(untimed, a));
  /* Stream b waits for a's end, then overwrites d. */
  CU_OK(cuStreamWaitEvent(b, end, 0));
  CU_OK(cuMemsetD32Async(d, 7, 16, b));

  /* Nothing past the gate has run. */
  CU_IS(CUDA_ERROR_NOT_READY, cuEventQuery(end));
  float ms = -1.0f;
  CU_IS(CUDA_ERROR_NOT_READY, cuEventElapsedTime(&ms, start, end));
  ck_assert_int_eq(host[0], -1);
  *gate = 1;
  CU_OK(cuEventSynchronize(end));
  CU_OK(cuEventQuery(end));
  ck_assert_int_eq(host[0], 42); /* copied before b's memset, in event order */
  CU_OK(cuEventElapsedTime(&ms, start, end));
  ck_assert_msg(ms >= 0.0f, "elapsed %f ms", (double)ms);
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime(&ms, start, untimed));
  CU_OK(cuStreamSynchronize(b));
  int word = 0;
  CU_OK(cuMemcpyDtoHAsync(&word, d, 4, b));
  ck_assert_int_eq(word, 7);

  CU_OK(cuEventDestroy(start));
  CU_OK(cuEventDestroy(end));
  CU_OK(cuEventDestroy(untimed));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(end));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuStreamDestroy(b));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(a));
  CU_OK(cuMemFree(d));
  CU_OK(cuMemFree(flag_out));
  CU_OK(cuMemFreeHost(pinned));
}
END_TEST

/* A free the program orders before the last use of its memory: the copy
 * that runs after it finds the memory gone. */
START_TEST(test_use_after_a_stream_ordered_free_is_reported) {
  CUfunction gate_kernel = function("fakecuda_test_wait_flag");
  CUmemoryPool pool;
  CU_OK(cuDeviceGetDefaultMemPool(&pool, 0));
  void *pinned;
  CU_OK(cuMemHostAlloc(&pinned, 64, 0));
  volatile int *gate = pinned;
  *gate = 0;
  CUstream a, b;
  CU_OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CU_OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buffer, other;
  CU_OK(cuMemAllocFromPoolAsync(&buffer, 256, pool, a));
  CU_OK(cuMemAlloc(&other, 256));
  CU_OK(cuStreamSynchronize(a));
  fakecuda_test_args_t g;
  memset(&g, 0, sizeof g);
  g.flag = (uint64_t)(uintptr_t)gate;
  g.out = other;
  CU_OK(launch(gate_kernel, 1, 1, b, &g));
  CU_OK(cuMemcpyDtoDAsync(other, buffer, 256, b));
  CU_OK(cuMemFreeAsync(buffer, a)); /* not ordered after b's copy: the bug */
  CU_OK(cuStreamSynchronize(a));
  *gate = 1;
  CU_IS(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(b));
  /* The context is unusable from now on, as after any such fault. */
  CU_IS(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemsetD8Async(other, 0, 1, NULL));
  ck_assert_int_eq(*gate, 1);
  (void)cuStreamDestroy(a);
  (void)cuStreamDestroy(b);
  (void)cuMemFree(other);
  (void)cuMemFreeHost(pinned);
}
END_TEST

/* ---- barriers and warp collectives ------------------------------------------------------------------------ */

START_TEST(test_barriers_hold) {
  enum { N = 1000, BLOCKS = 4 };
  int in[N], sums[BLOCKS] = {0};
  for (int i = 0; i < N; i++) in[i] = i * 3 - 500;
  CUdeviceptr d_in, d_out;
  CU_OK(cuMemAlloc(&d_in, sizeof in));
  CU_OK(cuMemAlloc(&d_out, sizeof sums));
  CU_OK(cuMemcpyHtoDAsync(d_in, in, sizeof in, NULL));
  fakecuda_test_args_t a = {d_in, d_out, 0, N, 0};
  CU_OK(launch(function("fakecuda_test_block_sum"), BLOCKS, 256, NULL, &a));
  CU_OK(cuMemcpyDtoHAsync(sums, d_out, sizeof sums, NULL));
  for (int b = 0; b < BLOCKS; b++) {
    int expected = 0;
    for (int i = b * 256; i < (b + 1) * 256 && i < N; i++) expected += in[i];
    ck_assert_int_eq(sums[b], expected);
  }

  /* Without its barrier, a thread reads its neighbour's slot before the
   * neighbour wrote it: the shim must not hide that. */
  for (int i = 0; i < 256; i++) in[i] = 100000 + i;
  CU_OK(cuMemcpyHtoDAsync(d_in, in, 256 * sizeof(int), NULL));
  CUdeviceptr d_rot;
  CU_OK(cuMemAlloc(&d_rot, 256 * sizeof(int)));
  a.out = d_rot;
  CU_OK(launch(function("fakecuda_test_missing_barrier"), 1, 256, NULL, &a));
  int rotated[256];
  CU_OK(cuMemcpyDtoHAsync(rotated, d_rot, sizeof rotated, NULL));
  int stale = 0;
  for (int i = 0; i < 256; i++) stale += rotated[i] != in[(i + 1) % 256];
  ck_assert_msg(stale > 0, "every thread saw its neighbour's write without a barrier");
  CU_OK(cuMemFree(d_in));
  CU_OK(cuMemFree(d_out));
  CU_OK(cuMemFree(d_rot));
}
END_TEST

START_TEST(test_warp_collectives) {
  enum { T = 64 };
  int in[T], out[T * FAKECUDA_TEST_WARP_VALUES];
  for (int i = 0; i < T; i++) in[i] = (i * 37) % 101; /* 0..100, distinct within a warp */
  CUdeviceptr d_in, d_out;
  CU_OK(cuMemAlloc(&d_in, sizeof in));
  CU_OK(cuMemAlloc(&d_out, sizeof out));
  CU_OK(cuMemcpyHtoDAsync(d_in, in, sizeof in, NULL));
  fakecuda_test_args_t a = {d_in, d_out, 0, T, 0};
  CU_OK(launch(function("fakecuda_test_warp"), 1, T, NULL, &a));
  CU_OK(cuMemcpyDtoHAsync(out, d_out, sizeof out, NULL));
  for (int t = 0; t < T; t++) {
    const int lane = t % 32, w = t - lane;
    unsigned ballot = 0;
    int any = 0, all = 1;
    for (int j = 0; j < 32; j++) {
      if (in[w + j] & 1) ballot |= 1u << j;
      any |= in[w + j] == 100;
      all &= in[w + j] >= 0;
    }
    const int expected[FAKECUDA_TEST_WARP_VALUES] = {
        lane + 1 < 32 ? in[t + 1] : in[t],
        lane >= 3 ? in[t - 3] : in[t],
        in[w + (lane ^ 5)],
        in[w + 7],
        lane % 8 + 2 < 8 ? in[t + 2] : in[t],
        (int)ballot,
        any + 2 * all,
        in[w + (lane ^ 16)],
        in[w + (lane & 16)],
    };
    for (int k = 0; k < FAKECUDA_TEST_WARP_VALUES; k++)
      ck_assert_msg(out[t * FAKECUDA_TEST_WARP_VALUES + k] == expected[k], "thread %d value %d: %d, expected %d", t,
                    k, out[t * FAKECUDA_TEST_WARP_VALUES + k], expected[k]);
  }
  CU_OK(cuMemFree(d_in));
  CU_OK(cuMemFree(d_out));
}
END_TEST

/* Each misuse fails its launch (reported when the stream is synchronised)
 * and leaves the context unusable, as a GPU fault does. */
START_TEST(test_misuse_fails_the_launch) {
  static const struct {
    const char *kernel;
    int n;
    CUresult result;
  } cases[] = {
      {"fakecuda_test_divergent_barrier", 16, CUDA_ERROR_LAUNCH_FAILED},
      {"fakecuda_test_two_barriers", 0, CUDA_ERROR_LAUNCH_FAILED},
      {"fakecuda_test_shfl_exited", 0, CUDA_ERROR_LAUNCH_FAILED},
      {"fakecuda_test_misaligned", 0, CUDA_ERROR_MISALIGNED_ADDRESS},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    open_context();
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, 4096));
    CUstream s;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    fakecuda_test_args_t a = {d, d, 0, cases[i].n, 0};
    CU_OK(launch(function(cases[i].kernel), 2, 64, s, &a));
    const CUresult r = cuStreamSynchronize(s);
    ck_assert_msg(r == cases[i].result, "%s: cuStreamSynchronize returned %s, expected %s", cases[i].kernel,
                  name_of(r), name_of(cases[i].result));
    CU_IS(cases[i].result, cuMemsetD8Async(d, 0, 1, NULL));
    (void)cuStreamDestroy(s);
    (void)cuMemFree(d);
    close_context();
  }
}
END_TEST

/* ---- kiln's kernels where the conformance suite does not reach ------------------------------------ */

/* A(i, l) of an operand stored with leading dimension ld, transposed or not. */
static float at(const float *m, int64_t ld, bool trans, int i, int l) { return trans ? m[l * ld + i] : m[i * ld + l]; }

static int64_t leading(int64_t columns, int vec) { return vec ? (columns + 3) / 4 * 4 : columns + 1; }

START_TEST(test_kiln_sgemm_variants) {
  const int m = 70, n = 130, k = 37, batch = 2;
  static const char *const names[2][4] = {
      {"kiln_sgemm_nn", "kiln_sgemm_nt", "kiln_sgemm_tn", "kiln_sgemm_tt"},
      {"kiln_sgemm_nn_vec", "kiln_sgemm_nt_vec", "kiln_sgemm_tn_vec", "kiln_sgemm_tt_vec"},
  };
  for (int vec = 0; vec < 2; vec++)
    for (int variant = 0; variant < 4; variant++) {
      const bool ta = variant & 2, tb = variant & 1;
      /* Leading dimensions padded to multiples of 4 for the float4 kernels,
       * one past the matrix for the others. */
      const int64_t lda = leading(ta ? m : k, vec), ldb = leading(tb ? k : n, vec), ldc = leading(n, vec);
      const int64_t sa = (ta ? k : m) * lda, sb = (tb ? n : k) * ldb, sc = m * ldc;
      float *ha = calloc((size_t)(sa * batch), sizeof *ha), *hb = calloc((size_t)(sb * batch), sizeof *hb);
      float *hc = calloc((size_t)(sc * batch), sizeof *hc);
      for (int64_t i = 0; i < sa * batch; i++) ha[i] = (float)((i * 7) % 5 - 2);
      for (int64_t i = 0; i < sb * batch; i++) hb[i] = (float)((i * 3) % 7 - 3);
      CUdeviceptr da, db, dc;
      CU_OK(cuMemAlloc(&da, (size_t)(sa * batch) * 4));
      CU_OK(cuMemAlloc(&db, (size_t)(sb * batch) * 4));
      CU_OK(cuMemAlloc(&dc, (size_t)(sc * batch) * 4));
      CU_OK(cuMemcpyHtoDAsync(da, ha, (size_t)(sa * batch) * 4, NULL));
      CU_OK(cuMemcpyHtoDAsync(db, hb, (size_t)(sb * batch) * 4, NULL));
      CU_OK(cuMemsetD32Async(dc, 0, (size_t)(sc * batch), NULL));
      kiln_kop_t g;
      memset(&g, 0, sizeof g);
      g.plan.gemm.a = da, g.plan.gemm.b = db, g.plan.gemm.c = dc;
      g.plan.gemm.m = m, g.plan.gemm.n = n, g.plan.gemm.k = k, g.plan.gemm.c_vec = vec;
      g.plan.gemm.lda = lda, g.plan.gemm.ldb = ldb, g.plan.gemm.ldc = ldc;
      g.plan.gemm.stride_a = sa, g.plan.gemm.stride_b = sb, g.plan.gemm.stride_c = sc, g.plan.gemm.batch = batch;
      g.plan.gemm.trans_a = ta, g.plan.gemm.trans_b = tb;
      void *params[1] = {&g};
      CU_OK(cuLaunchKernel(function(names[vec][variant]), (n + 127) / 128, (m + 127) / 128, batch, 256, 1, 1, 0, NULL,
                           params, NULL));
      CU_OK(cuMemcpyDtoHAsync(hc, dc, (size_t)(sc * batch) * 4, NULL));
      for (int z = 0; z < batch; z++)
        for (int i = 0; i < m; i++)
          for (int j = 0; j < n; j++) {
            float sum = 0.0f; /* small integers: exact in any order */
            for (int l = 0; l < k; l++) sum += at(ha + z * sa, lda, ta, i, l) * at(hb + z * sb, ldb, tb, l, j);
            ck_assert_msg(hc[z * sc + i * ldc + j] == sum, "%s C[%d][%d][%d] = %g, expected %g", names[vec][variant],
                          z, i, j, (double)hc[z * sc + i * ldc + j], (double)sum);
          }
      CU_OK(cuMemFree(da));
      CU_OK(cuMemFree(db));
      CU_OK(cuMemFree(dc));
      free(ha);
      free(hb);
      free(hc);
    }
}
END_TEST

/* Rows long enough to be split into chunks, merged by kiln_reduce_parts. */
START_TEST(test_kiln_chunked_reduction) {
  enum { OUTER = 3, LEN = 10000, CHUNK = 4096, CHUNKS = 3 };
  float *x = malloc(sizeof(float) * OUTER * LEN);
  for (int r = 0; r < OUTER; r++)
    for (int l = 0; l < LEN; l++) x[r * LEN + l] = (float)((l * 37 + r * 11) % 1000) * 0.5f;
  CUdeviceptr din, dout, dparts;
  CU_OK(cuMemAlloc(&din, sizeof(float) * OUTER * LEN));
  CU_OK(cuMemAlloc(&dout, sizeof(float) * OUTER));
  CU_OK(cuMemAlloc(&dparts, KILN_CUDA_REDUCE_PART_BYTES * OUTER * CHUNKS));
  CU_OK(cuMemcpyHtoDAsync(din, x, sizeof(float) * OUTER * LEN, NULL));
  static const int ops[3] = {0, 2, 3}; /* sum, max, argmax */
  for (int o = 0; o < 3; o++) {
    kiln_kop_t a;
    memset(&a, 0, sizeof a);
    a.in[0].addr = din, a.out.addr = dout;
    a.u.reduce.outer = OUTER, a.u.reduce.len = LEN, a.u.reduce.inner = 1, a.u.reduce.op = ops[o];
    a.plan.reduce.parts = dparts, a.plan.reduce.rows = OUTER, a.plan.reduce.chunk = CHUNK, a.plan.reduce.chunks = CHUNKS;
    void *params[1] = {&a};
    CU_OK(cuLaunchKernel(function("kiln_reduce_rows_f32"), OUTER * CHUNKS, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CU_OK(cuLaunchKernel(function("kiln_reduce_parts_f32"), OUTER, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    float out[OUTER];
    CU_OK(cuMemcpyDtoHAsync(out, dout, sizeof out, NULL));
    for (int r = 0; r < OUTER; r++) {
      double sum = 0.0;
      float best = -1.0f;
      int index = 0;
      for (int l = 0; l < LEN; l++) {
        const float v = x[r * LEN + l];
        sum += v;
        if (v > best) {
          best = v;
          index = l;
        }
      }
      if (ops[o] == 0) ck_assert_msg(out[r] == (float)sum, "sum row %d: %g vs %g", r, (double)out[r], sum);
      if (ops[o] == 2) ck_assert_msg(out[r] == best, "max row %d: %g vs %g", r, (double)out[r], (double)best);
      if (ops[o] == 3) {
        int got;
        memcpy(&got, &out[r], sizeof got);
        ck_assert_msg(got == index, "argmax row %d: %d vs %d", r, got, index);
      }
    }
  }
  CU_OK(cuMemFree(din));
  CU_OK(cuMemFree(dout));
  CU_OK(cuMemFree(dparts));
  free(x);
}
END_TEST

/* The same split for i32, whose parts accumulate in uint32_t: the sum wraps
 * (the values are large enough to), chunk by chunk and in the merge. */
START_TEST(test_kiln_chunked_reduction_i32) {
  enum { OUTER = 3, LEN = 10000, CHUNK = 4096, CHUNKS = 3 };
  int32_t *x = malloc(sizeof(int32_t) * OUTER * LEN);
  for (int r = 0; r < OUTER; r++)
    for (int l = 0; l < LEN; l++) x[r * LEN + l] = (int32_t)(((l * 7919 + r * 104729) % 2001) - 1000) * 1000003;
  CUdeviceptr din, dout, dparts;
  CU_OK(cuMemAlloc(&din, sizeof(int32_t) * OUTER * LEN));
  CU_OK(cuMemAlloc(&dout, sizeof(int32_t) * OUTER));
  CU_OK(cuMemAlloc(&dparts, KILN_CUDA_REDUCE_PART_BYTES * OUTER * CHUNKS));
  CU_OK(cuMemcpyHtoDAsync(din, x, sizeof(int32_t) * OUTER * LEN, NULL));
  static const int ops[3] = {0, 2, 3}; /* sum, max, argmax */
  for (int o = 0; o < 3; o++) {
    kiln_kop_t a;
    memset(&a, 0, sizeof a);
    a.in[0].addr = din, a.out.addr = dout;
    a.in[0].dtype = 1, a.out.dtype = 1; /* i32 (kiln_dtype_t 1): a sum kept in i32 wraps */
    a.u.reduce.outer = OUTER, a.u.reduce.len = LEN, a.u.reduce.inner = 1, a.u.reduce.op = ops[o];
    a.plan.reduce.parts = dparts, a.plan.reduce.rows = OUTER, a.plan.reduce.chunk = CHUNK, a.plan.reduce.chunks = CHUNKS;
    void *params[1] = {&a};
    CU_OK(cuLaunchKernel(function("kiln_reduce_rows_i32"), OUTER * CHUNKS, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CU_OK(cuLaunchKernel(function("kiln_reduce_parts_i32"), OUTER, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    int32_t out[OUTER];
    CU_OK(cuMemcpyDtoHAsync(out, dout, sizeof out, NULL));
    for (int r = 0; r < OUTER; r++) {
      uint32_t sum = 0;
      int32_t best = INT32_MIN;
      int index = -1;
      for (int l = 0; l < LEN; l++) {
        const int32_t v = x[r * LEN + l];
        sum += (uint32_t)v;
        if (index < 0 || v > best) {
          best = v;
          index = l;
        }
      }
      if (ops[o] == 0) ck_assert_msg((uint32_t)out[r] == sum, "sum row %d: %d vs %d", r, out[r], (int32_t)sum);
      if (ops[o] == 2) ck_assert_msg(out[r] == best, "max row %d: %d vs %d", r, out[r], best);
      if (ops[o] == 3) ck_assert_msg(out[r] == index, "argmax row %d: %d vs %d", r, out[r], index);
    }
  }
  CU_OK(cuMemFree(din));
  CU_OK(cuMemFree(dout));
  CU_OK(cuMemFree(dparts));
  free(x);
}
END_TEST

/* ---- two devices --------------------------------------------------------------------------------------- */

START_TEST(test_two_devices) {
  CUcontext other;
  CU_OK(cuDevicePrimaryCtxRetain(&other, 1));
  CU_OK(cuCtxEnablePeerAccess(other, 0));
  CU_IS(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cuCtxEnablePeerAccess(other, 0));
  CU_IS(CUDA_ERROR_INVALID_DEVICE, cuCtxEnablePeerAccess(ctx, 0));
  CUdeviceptr here;
  CU_OK(cuMemAlloc(&here, 256));
  CU_OK(cuMemsetD32Async(here, 3, 64, NULL));
  CU_OK(cuCtxPushCurrent(other));
  CUdeviceptr there;
  CU_OK(cuMemAlloc(&there, 256));
  CUstream s1;
  CU_OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  /* A module of the other context cannot be used here. */
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuModuleGetFunction(&(CUfunction){NULL}, module, "kiln_fill_i32"));
  CU_OK(cuMemcpyPeerAsync(there, other, here, ctx, 256, s1));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemcpyPeerAsync(there, ctx, here, other, 256, s1));
  uint32_t back[64];
  CU_OK(cuMemcpyDtoHAsync(back, there, sizeof back, s1));
  for (int i = 0; i < 64; i++) ck_assert_uint_eq(back[i], 3u);
  CU_OK(cuCtxPopCurrent(NULL));
  /* Device 1's stream with device 0's context current. */
  CU_IS(CUDA_ERROR_INVALID_CONTEXT, cuMemsetD8Async(here, 0, 1, s1));
  CU_OK(cuCtxPushCurrent(other));
  CU_OK(cuStreamDestroy(s1));
  CU_OK(cuMemFree(there));
  CU_OK(cuCtxPopCurrent(NULL));
  CU_OK(cuMemFree(here));
  CU_OK(cuDevicePrimaryCtxRelease(1));
}
END_TEST

static unsigned char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  const long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *data = size > 0 ? malloc((size_t)size) : NULL;
  if (data && fread(data, 1, (size_t)size, f) != (size_t)size) {
    free(data);
    data = NULL;
  }
  fclose(f);
  return data;
}

int main(int argc, char **argv) {
  if (argc != 2 || !(fatbin = read_file(argv[1]))) {
    fprintf(stderr, "usage: %s KILN_FATBIN (the build's kiln_kernels.fatbin)\n", argv[0]);
    return 1;
  }
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_ERROR_NOT_INITIALIZED) {
    fprintf(stderr, "cuDeviceGetCount before cuInit did not return CUDA_ERROR_NOT_INITIALIZED\n");
    return 1;
  }
  const CUresult r = cuInit(0);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuInit: %s (this suite runs with KILN_FAKECUDA_DEVICES=2)\n", name_of(r));
    return 1;
  }
  Suite *suite = suite_create("fakecuda");
  TCase *bare = tcase_create("no context");
  tcase_add_test(bare, test_calls_without_a_context_are_refused);
  tcase_add_test(bare, test_the_device);
  tcase_add_test(bare, test_misuse_fails_the_launch);
  suite_add_tcase(suite, bare);
  TCase *in_context = tcase_create("in a context");
  tcase_add_checked_fixture(in_context, open_context, close_context);
  tcase_add_test(in_context, test_launches_over_the_limits_are_refused);
  tcase_add_test(in_context, test_modules);
  tcase_add_test(in_context, test_memory);
  tcase_add_test(in_context, test_the_pool);
  tcase_add_test(in_context, test_streams_are_asynchronous_and_ordered);
  tcase_add_test(in_context, test_barriers_hold);
  tcase_add_test(in_context, test_warp_collectives);
  tcase_add_test(in_context, test_kiln_sgemm_variants);
  tcase_add_test(in_context, test_kiln_chunked_reduction);
  tcase_add_test(in_context, test_kiln_chunked_reduction_i32);
  tcase_add_test(in_context, test_two_devices);
  tcase_add_test(in_context, test_use_after_a_stream_ordered_free_is_reported);
  suite_add_tcase(suite, in_context);
  SRunner *runner = srunner_create(suite);
  /* The driver's state (and its worker threads) lives in this process. */
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  free(fatbin);
  return failed == 0 ? 0 : 1;
}
