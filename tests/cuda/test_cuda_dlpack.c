/* tests/cuda/test_cuda_dlpack.c: DLPack on CUDA devices: export as kDLCUDA with the CUdeviceptr, import of device memory another allocator made without a copy, the checks on imported pointers, and DLPack's stream rule both ways; skipped (77) without a CUDA device. */
/*
 * The test plays the other framework itself, through the CUDA driver the
 * plugin loaded (libcuda.so.1, found with dlopen so that the test starts
 * where no driver is, and says why it skips): it reads exported memory and
 * allocates, fills and frees imported memory with the driver's calls, on
 * the device's primary context and its legacy default stream, which kiln's
 * queues do not order against. So an export must have waited for kiln's
 * work before it returned, and kiln must have finished with imported memory
 * before it calls the deleter.
 */
#include <dlfcn.h>

#include <cuda.h>

#include "../common.h"
#include "kiln/dlpack.h"

static kiln_device_t *gpu, *gpu2;

/* ---- the driver, as another framework uses it --------------------------------------------- */

static struct {
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*primary_retain)(CUcontext *, CUdevice);
  CUresult (*primary_release)(CUdevice);
  CUresult (*push)(CUcontext);
  CUresult (*pop)(CUcontext *);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*sync)(CUstream);
} cu;

static bool driver_load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) return false;
  const struct { const char *name; void *slot; } syms[] = {
      {"cuDeviceGet", &cu.device_get},           {"cuDevicePrimaryCtxRetain", &cu.primary_retain},
      {"cuDevicePrimaryCtxRelease_v2", &cu.primary_release}, {"cuCtxPushCurrent_v2", &cu.push},
      {"cuCtxPopCurrent_v2", &cu.pop},           {"cuMemAlloc_v2", &cu.alloc},
      {"cuMemFree_v2", &cu.free},                {"cuMemcpyHtoDAsync_v2", &cu.htod},
      {"cuMemcpyDtoHAsync_v2", &cu.dtoh},        {"cuStreamSynchronize", &cu.sync},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *p = dlsym(lib, syms[i].name);
    if (!p) return false;
    memcpy(syms[i].slot, &p, sizeof p);
  }
  return true;
}

#define CU_OK(call)                                                                                \
  do {                                                                                             \
    const CUresult cu_r_ = (call);                                                                 \
    ck_assert_msg(cu_r_ == CUDA_SUCCESS, "%s returned %d", #call, (int)cu_r_);                    \
  } while (0)

/* The device's primary context made current (the CUDA runtime's), and back. */
static CUdevice enter(int ordinal) {
  CUdevice dev;
  CUcontext ctx;
  CU_OK(cu.device_get(&dev, ordinal));
  CU_OK(cu.primary_retain(&ctx, dev));
  CU_OK(cu.push(ctx));
  return dev;
}

static void leave(CUdevice dev) {
  CUcontext ctx;
  CU_OK(cu.pop(&ctx));
  CU_OK(cu.primary_release(dev));
}

/* Bytes of device memory into the host, on the legacy default stream. */
static void read_device(int ordinal, CUdeviceptr ptr, void *host, size_t bytes) {
  const CUdevice dev = enter(ordinal);
  CU_OK(cu.dtoh(host, ptr, bytes, NULL));
  CU_OK(cu.sync(NULL));
  leave(dev);
}

/* ---- export --------------------------------------------------------------------------------- */

START_TEST(test_devices_are_kdlcuda) {
  DLDevice d;
  KT_OK(kiln_device_dlpack(gpu, &d));
  ck_assert_int_eq(d.device_type, kDLCUDA);
  ck_assert_int_eq(d.device_id, 0);
  if (gpu2) {
    KT_OK(kiln_device_dlpack(gpu2, &d));
    ck_assert_int_eq(d.device_type, kDLCUDA);
    ck_assert_int_eq(d.device_id, 1);
  }
}
END_TEST

/* The export hands out the CUdeviceptr of the tensor's memory once kiln's
 * work on it is done: the driver reads the values on a stream kiln never
 * ordered. */
START_TEST(test_export_waits_and_points_at_the_memory) {
  enum { N = 1 << 16 };
  kiln_tensor_t *a, *b;
  KT_OK(kiln_tensor_arange(gpu, KILN_F32, 0, N, 1, &a));
  KT_OK(kiln_tensor_binary_scalar(KILN_BINARY_MUL, a, 3.0, &b));
  DLManagedTensor *m = NULL;
  KT_OK(kiln_tensor_to_dlpack(b, &m));
  const DLTensor *t = &m->dl_tensor;
  ck_assert_int_eq(t->device.device_type, kDLCUDA);
  ck_assert_int_eq(t->device.device_id, 0);
  ck_assert(t->data != NULL);
  ck_assert_int_eq(t->ndim, 1);
  ck_assert_int_eq(t->shape[0], N);
  ck_assert_int_eq(t->dtype.code, kDLFloat);
  float *host = malloc(N * sizeof *host);
  ck_assert_ptr_nonnull(host);
  read_device(0, (CUdeviceptr)(uintptr_t)t->data + t->byte_offset, host, N * sizeof *host);
  for (int i = 0; i < N; i++) ck_assert_msg(host[i] == 3.0f * (float)i, "[%d] %g", i, (double)host[i]);

  /* A view: the memory's base, the view's offset and strides. */
  const int64_t shape[2] = {256, 256};
  kiln_tensor_t *square, *view;
  KT_OK(kiln_tensor_reshape(b, 2, shape, &square));
  KT_OK(kiln_tensor_transpose(square, 0, 1, &view));
  DLManagedTensor *mv = NULL;
  KT_OK(kiln_tensor_to_dlpack(view, &mv));
  ck_assert(mv->dl_tensor.data == t->data);
  ck_assert_int_eq(mv->dl_tensor.strides[0], 1);
  ck_assert_int_eq(mv->dl_tensor.strides[1], 256);
  mv->deleter(mv);
  kiln_tensor_release(view);
  kiln_tensor_release(square);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  /* The export keeps the memory alive until its deleter runs. */
  memset(host, 0, N * sizeof *host);
  read_device(0, (CUdeviceptr)(uintptr_t)t->data + t->byte_offset, host, N * sizeof *host);
  ck_assert(host[N - 1] == 3.0f * (float)(N - 1));
  m->deleter(m);
  free(host);
}
END_TEST

/* ---- import --------------------------------------------------------------------------------- */

/* Device memory of "another framework": allocated and filled through the
 * driver; its deleter reads the memory back before freeing it, so the test
 * sees what kiln left there, and when. */
typedef struct owned_t {
  DLManagedTensor managed;
  int64_t shape[1];
  int ordinal;
  CUdeviceptr ptr;
  size_t count;
  float back[64];
  int deleted;
} owned_t;

static void owned_deleter(DLManagedTensor *self) {
  owned_t *o = self->manager_ctx;
  o->deleted++;
  read_device(o->ordinal, o->ptr, o->back, o->count * sizeof(float));
  const CUdevice dev = enter(o->ordinal);
  CU_OK(cu.free(o->ptr));
  leave(dev);
}

static owned_t *owned_new(int ordinal, size_t count, size_t allocated) {
  owned_t *o = calloc(1, sizeof *o);
  ck_assert(o && count <= 64 && allocated >= count);
  o->ordinal = ordinal;
  o->count = count;
  float values[64];
  for (size_t i = 0; i < count; i++) values[i] = (float)i * 0.5f;
  const CUdevice dev = enter(ordinal);
  CU_OK(cu.alloc(&o->ptr, allocated * sizeof(float)));
  CU_OK(cu.htod(o->ptr, values, count * sizeof(float), NULL));
  CU_OK(cu.sync(NULL)); /* the producer finished writing: DLPack's rule */
  leave(dev);
  o->shape[0] = (int64_t)count;
  DLTensor *t = &o->managed.dl_tensor;
  t->data = (void *)(uintptr_t)o->ptr;
  t->device.device_type = kDLCUDA;
  t->device.device_id = ordinal;
  t->ndim = 1;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = o->shape;
  o->managed.manager_ctx = o;
  o->managed.deleter = owned_deleter;
  return o;
}

/* kiln views the memory (no copy: an export of the import points at it),
 * writes into it in place, and hands it back only after that work is done. */
START_TEST(test_import_uses_the_memory_in_place) {
  owned_t *o = owned_new(0, 40, 40);
  kiln_tensor_t *t, *ones;
  KT_OK(kiln_tensor_from_dlpack(&o->managed, &t));
  float got[40];
  KT_OK(kiln_tensor_read(t, got, sizeof got));
  for (int i = 0; i < 40; i++) ck_assert(got[i] == (float)i * 0.5f);
  DLManagedTensor *again = NULL;
  KT_OK(kiln_tensor_to_dlpack(t, &again));
  ck_assert(again->dl_tensor.data == (void *)(uintptr_t)o->ptr);
  again->deleter(again);
  const int64_t shape[1] = {40};
  KT_OK(kiln_tensor_ones(gpu, KILN_F32, 1, shape, &ones));
  for (int k = 0; k < 50; k++) KT_OK(kiln_tensor_accumulate(t, 2.0, ones));
  ck_assert_int_eq(o->deleted, 0);
  kiln_tensor_release(t);
  kiln_tensor_release(ones);
  /* The deleter ran once, after the updates reached the memory. */
  ck_assert_int_eq(o->deleted, 1);
  for (int i = 0; i < 40; i++)
    ck_assert_msg(o->back[i] == (float)i * 0.5f + 100.0f, "[%d] %g", i, (double)o->back[i]);
  free(o);
}
END_TEST

/* Pointers the driver does not call this device's memory of that size are
 * refused, naming the pointer; the caller keeps the tensor. */
START_TEST(test_import_checks_the_pointer) {
  kiln_tensor_t *t = NULL;
  /* Host memory posing as kDLCUDA. */
  float host[16] = {0};
  owned_t *o = owned_new(0, 16, 16);
  o->managed.dl_tensor.data = host;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "is not device memory");
  ck_assert_int_eq(o->deleted, 0);
  o->managed.dl_tensor.data = (void *)(uintptr_t)o->ptr;
  /* Tensors reaching past the 64 bytes of their allocation: by their shape,
   * and by their offset. */
  o->shape[0] = 17;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "reaches 68 bytes");
  ck_assert_msg(strstr(kiln_last_error(), "ends 64 bytes after it"), "%s", kiln_last_error());
  o->shape[0] = 15;
  o->managed.dl_tensor.byte_offset = 8;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "reaches 68 bytes");
  o->shape[0] = 16;
  o->managed.dl_tensor.byte_offset = 0;
  /* Memory of cuda:0 said to be cuda:1's. */
  if (gpu2) {
    o->managed.dl_tensor.device.device_id = 1;
    KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_DEVICE_MISMATCH, "is memory of cuda:0");
    o->managed.dl_tensor.device.device_id = 0;
  }
  ck_assert_int_eq(o->deleted, 0);
  /* Still the caller's, and still good. */
  KT_OK(kiln_tensor_from_dlpack(&o->managed, &t));
  kiln_tensor_release(t);
  ck_assert_int_eq(o->deleted, 1);
  free(o);
}
END_TEST

/* The second device's memory imports as that device's tensor. */
START_TEST(test_import_on_the_second_device) {
  if (!gpu2) return;
  owned_t *o = owned_new(1, 8, 8);
  kiln_tensor_t *t;
  KT_OK(kiln_tensor_from_dlpack(&o->managed, &t));
  ck_assert_ptr_eq(kiln_tensor_device(t), gpu2);
  float got[8];
  KT_OK(kiln_tensor_read(t, got, sizeof got));
  for (int i = 0; i < 8; i++) ck_assert(got[i] == (float)i * 0.5f);
  kiln_tensor_release(t);
  ck_assert_int_eq(o->deleted, 1);
  free(o);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  size_t backends = 0;
  kiln_backend_info_t info;
  bool loaded = false;
  if (kiln_backend_count(&backends) == KILN_OK)
    for (size_t i = 0; i < backends; i++)
      if (kiln_backend_info(i, &info) == KILN_OK && !strcmp(info.name, "cuda"))
        loaded = info.state == KILN_BACKEND_LOADED;
  if (!loaded || kiln_device_find("cuda:0", &gpu) != KILN_OK) {
    printf("SKIP: no CUDA device visible (%s)\n", kiln_last_error());
    return 77;
  }
  if (kiln_device_find("cuda:1", &gpu2) != KILN_OK) gpu2 = NULL;
  kiln_clear_error();
  if (!driver_load()) {
    fprintf(stderr, "the CUDA driver the plugin loaded lacks an entry point this test calls: %s\n", dlerror());
    return 1;
  }
  Suite *suite = suite_create("cuda-dlpack");
  TCase *tc = tcase_create("cuda-dlpack");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_devices_are_kdlcuda);
  tcase_add_test(tc, test_export_waits_and_points_at_the_memory);
  tcase_add_test(tc, test_import_uses_the_memory_in_place);
  tcase_add_test(tc, test_import_checks_the_pointer);
  tcase_add_test(tc, test_import_on_the_second_device);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}
