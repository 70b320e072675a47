/* tests/test_dlpack.c: DLPack export and import: fields, zero copies in both directions, ownership and deleters, refusals. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "kiln/dlpack.h"

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *d = NULL;
  KT_OK(kiln_device_find("cpu:0", &d));
  return d;
}

/* ---- a producer of our own, over malloc'ed memory -------------------------------- */

static atomic_int kt_deleted;

typedef struct kt_owned_t {
  DLManagedTensor managed;
  DLManagedTensorVersioned versioned;
  float *data;
  int64_t shape[3], strides[3];
} kt_owned_t;

static void kt_deleter(DLManagedTensor *self) {
  kt_owned_t *o = self->manager_ctx;
  atomic_fetch_add(&kt_deleted, 1);
  free(o->data);
  free(o);
}

static void kt_deleter_versioned(DLManagedTensorVersioned *self) {
  kt_owned_t *o = self->manager_ctx;
  atomic_fetch_add(&kt_deleted, 1);
  free(o->data);
  free(o);
}

/* A [rows, cols] f32 array holding 0, 1, 2, ... */
static kt_owned_t *kt_owned(int64_t rows, int64_t cols) {
  kt_owned_t *o = calloc(1, sizeof *o);
  ck_assert_ptr_nonnull(o);
  o->data = malloc(sizeof(float) * (size_t)(rows * cols));
  ck_assert_ptr_nonnull(o->data);
  for (int64_t i = 0; i < rows * cols; i++) o->data[i] = (float)i;
  o->shape[0] = rows;
  o->shape[1] = cols;
  DLTensor t = {0};
  t.data = o->data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = o->shape;
  t.strides = NULL;
  t.byte_offset = 0;
  o->managed.dl_tensor = t;
  o->managed.manager_ctx = o;
  o->managed.deleter = kt_deleter;
  o->versioned.version.major = 1;
  o->versioned.version.minor = 0;
  o->versioned.dl_tensor = t;
  o->versioned.manager_ctx = o;
  o->versioned.deleter = kt_deleter_versioned;
  return o;
}

/* ---- export ----------------------------------------------------------------------- */

START_TEST(test_export_fields_and_sharing) {
  kiln_device_t *cpu = kt_cpu();
  float values[6] = {1, 2, 3, 4, 5, 6};
  kiln_tensor_t *a = NULL, *t = NULL;
  KT_OK(kiln_tensor_from_host(cpu, KILN_F32, 2, (const int64_t[]){2, 3}, values, &a));
  KT_OK(kiln_tensor_transpose(a, 0, 1, &t)); /* [3, 2], strides (1, 3) */
  DLManagedTensor *m = NULL;
  KT_OK(kiln_tensor_to_dlpack(t, &m));
  const DLTensor *d = &m->dl_tensor;
  ck_assert_int_eq(d->device.device_type, kDLCPU);
  ck_assert_int_eq(d->device.device_id, 0);
  ck_assert_int_eq(d->ndim, 2);
  ck_assert_int_eq(d->dtype.code, kDLFloat);
  ck_assert_int_eq(d->dtype.bits, 32);
  ck_assert_int_eq(d->dtype.lanes, 1);
  ck_assert_int_eq(d->shape[0], 3);
  ck_assert_int_eq(d->shape[1], 2);
  ck_assert_int_eq(d->strides[0], 1);
  ck_assert_int_eq(d->strides[1], 3);
  const float *data = (const float *)((const char *)d->data + d->byte_offset);
  ck_assert_float_eq(data[0 * 1 + 1 * 3], 4.0f); /* t[0][1] = a[1][0] */
  /* No copy: a write through the export is what kiln reads next. */
  ((float *)data)[2] = 30.0f; /* a[0][2] */
  float back[6];
  KT_OK(kiln_tensor_read(a, back, sizeof back));
  ck_assert_float_eq(back[2], 30.0f);
  /* The export holds the tensor: released here, its memory stays valid. */
  kiln_tensor_release(t);
  kiln_tensor_release(a);
  ck_assert_float_eq(data[0], 1.0f);
  m->deleter(m);

  /* The versioned form carries 1.0 and no flags. */
  KT_OK(kiln_tensor_from_host(cpu, KILN_I32, 1, (const int64_t[]){2}, (const int32_t[]){7, 8}, &a));
  DLManagedTensorVersioned *v = NULL;
  KT_OK(kiln_tensor_to_dlpack_versioned(a, &v));
  ck_assert_uint_eq(v->version.major, 1);
  ck_assert_uint_eq(v->version.minor, 0);
  ck_assert_uint_eq(v->flags, 0);
  ck_assert_int_eq(v->dl_tensor.dtype.code, kDLInt);
  ck_assert_int_eq(((const int32_t *)v->dl_tensor.data)[1], 8);
  kiln_tensor_release(a);
  v->deleter(v);
  kiln_deinitialize();
}
END_TEST

/* The export waits for the work that writes the tensor: the consumer reads
 * the result, not the memory before it. */
START_TEST(test_export_waits_for_work) {
  kiln_device_t *cpu = kt_cpu();
  kiln_tensor_t *a = NULL, *b = NULL;
  KT_OK(kiln_tensor_ones(cpu, KILN_F32, 1, (const int64_t[]){1 << 20}, &a));
  KT_OK(kiln_tensor_mul_scalar(a, 3.0, &b));
  DLManagedTensor *m = NULL;
  KT_OK(kiln_tensor_to_dlpack(b, &m));
  const float *data = (const float *)((const char *)m->dl_tensor.data + m->dl_tensor.byte_offset);
  ck_assert_float_eq(data[0], 3.0f);
  ck_assert_float_eq(data[(1 << 20) - 1], 3.0f);
  m->deleter(m);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_deinitialize();
}
END_TEST

/* ---- import ------------------------------------------------------------------------ */

START_TEST(test_import_zero_copy_and_ownership) {
  kt_cpu();
  atomic_store(&kt_deleted, 0);
  kt_owned_t *o = kt_owned(3, 4);
  float *memory = o->data;
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_from_dlpack(&o->managed, &t));
  ck_assert_int_eq(kiln_tensor_ndim(t), 2);
  ck_assert_int_eq(kiln_tensor_shape(t)[1], 4);
  /* kiln computes on the producer's memory... */
  kiln_tensor_t *sum = NULL;
  KT_OK(kiln_tensor_sum(t, KILN_ALL_AXES, false, &sum));
  double total = 0;
  KT_OK(kiln_tensor_item(sum, &total));
  ck_assert_double_eq(total, 66.0);
  /* ...and an update writes into it, seen by the producer: no copy. */
  kiln_tensor_t *ones = NULL;
  KT_OK(kiln_tensor_ones(kt_cpu(), KILN_F32, 2, (const int64_t[]){3, 4}, &ones));
  KT_OK(kiln_tensor_accumulate(t, 10.0, ones));
  float host[12];
  KT_OK(kiln_tensor_read(t, host, sizeof host));
  ck_assert_float_eq(memory[5], 15.0f);
  ck_assert_float_eq(host[5], 15.0f);
  /* A view keeps the memory alive; the deleter runs once, at the end. */
  kiln_tensor_t *view = NULL;
  KT_OK(kiln_tensor_transpose(t, 0, 1, &view));
  kiln_tensor_release(t);
  ck_assert_int_eq(atomic_load(&kt_deleted), 0);
  kiln_tensor_release(view);
  ck_assert_int_eq(atomic_load(&kt_deleted), 1);
  kiln_tensor_release(sum);
  kiln_tensor_release(ones);

  /* Strides and a byte offset: the second column of a [3, 4] as a [3] view. */
  o = kt_owned(3, 4);
  o->strides[0] = 4;
  o->managed.dl_tensor.ndim = 1;
  o->managed.dl_tensor.strides = o->strides;
  o->managed.dl_tensor.byte_offset = 4;
  KT_OK(kiln_tensor_from_dlpack(&o->managed, &t));
  float column[3];
  KT_OK(kiln_tensor_read(t, column, sizeof column));
  ck_assert_float_eq(column[0], 1.0f);
  ck_assert_float_eq(column[1], 5.0f);
  ck_assert_float_eq(column[2], 9.0f);
  kiln_tensor_release(t);
  ck_assert_int_eq(atomic_load(&kt_deleted), 2);
  kiln_deinitialize();
}
END_TEST

/* A round trip kiln -> DLPack -> kiln views the same memory. */
START_TEST(test_round_trip_shares_memory) {
  kiln_device_t *cpu = kt_cpu();
  kiln_tensor_t *a = NULL, *b = NULL, *ones = NULL;
  KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 1, (const int64_t[]){5}, &a));
  DLManagedTensorVersioned *v = NULL;
  KT_OK(kiln_tensor_to_dlpack_versioned(a, &v));
  KT_OK(kiln_tensor_from_dlpack_versioned(v, &b));
  KT_OK(kiln_tensor_ones(cpu, KILN_F32, 1, (const int64_t[]){5}, &ones));
  KT_OK(kiln_tensor_accumulate(b, 2.0, ones));
  float host[5];
  KT_OK(kiln_tensor_read(a, host, sizeof host));
  ck_assert_float_eq(host[4], 2.0f);
  kiln_tensor_release(b); /* runs the export's deleter, which releases its hold on a */
  kiln_tensor_release(a);
  kiln_tensor_release(ones);
  kiln_deinitialize();
}
END_TEST

/* Refusals name the value, and leave the DLPack tensor with the caller. */
START_TEST(test_import_refusals) {
  kt_cpu();
  atomic_store(&kt_deleted, 0);
  kt_owned_t *o = kt_owned(2, 2);
  kiln_tensor_t *t = NULL;
  o->managed.dl_tensor.device.device_type = kDLVulkan;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_NOT_FOUND, "device type 7, id 0");
  o->managed.dl_tensor.device.device_type = kDLCPU;
  o->managed.dl_tensor.dtype.code = 5;
  o->managed.dl_tensor.dtype.bits = 64;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_DTYPE_MISMATCH, "holds complex64, which kiln does not have");
  o->managed.dl_tensor.dtype.code = kDLFloat;
  o->managed.dl_tensor.dtype.bits = 32;
  o->strides[0] = -2;
  o->strides[1] = 1;
  o->managed.dl_tensor.strides = o->strides;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "stride -2 of dimension 0 is negative");
  o->managed.dl_tensor.strides = NULL;
  o->managed.dl_tensor.byte_offset = 2;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "byte_offset 2 is not a whole number");
  o->managed.dl_tensor.byte_offset = 0;
  o->managed.dl_tensor.ndim = 9;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "ndim 9");
  o->managed.dl_tensor.ndim = 2;
  o->versioned.version.major = 2;
  KT_FAILS(kiln_tensor_from_dlpack_versioned(&o->versioned, &t), KILN_UNSUPPORTED, "DLPack 2.0");
  KT_FAILS(kiln_tensor_from_dlpack(NULL, &t), KILN_INVALID_ARGUMENT, "managed is NULL");
  ck_assert_ptr_null(t);
  ck_assert_int_eq(atomic_load(&kt_deleted), 0);
  /* Read-only memory imports, but no update may write it. */
  o->versioned.version.major = 1;
  o->versioned.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  KT_OK(kiln_tensor_from_dlpack_versioned(&o->versioned, &t));
  kiln_tensor_t *ones = NULL;
  KT_OK(kiln_tensor_ones(kt_cpu(), KILN_F32, 2, (const int64_t[]){2, 2}, &ones));
  KT_FAILS(kiln_tensor_accumulate(t, 1.0, ones), KILN_INVALID_ARGUMENT, "imported read-only");
  kiln_tensor_t *sum = NULL;
  KT_OK(kiln_tensor_add(t, ones, &sum)); /* reading it is fine */
  kiln_tensor_release(sum);
  kiln_tensor_release(ones);
  kiln_tensor_release(t);
  ck_assert_int_eq(atomic_load(&kt_deleted), 1);
  kiln_deinitialize();
}
END_TEST

/* ---- every dtype ------------------------------------------------------------------ */

/* Eight valid elements of `dtype` (bool: 0 and 1 only), distinct bytes. */
static void kt_pattern(kiln_dtype_t dtype, unsigned char *out, size_t bytes) {
  for (size_t i = 0; i < bytes; i++) out[i] = (unsigned char)(0x11 * (i % 15) + 3 + i / 15);
  if (dtype == KILN_BOOL)
    for (size_t i = 0; i < bytes; i++) out[i] = (unsigned char)(i % 3 == 1);
  if (dtype == KILN_F16 || dtype == KILN_BF16 || dtype == KILN_F32 || dtype == KILN_F64) {
    /* Keep every element finite and not NaN: clear the top exponent bit. */
    size_t size = kiln_dtype_size(dtype);
    for (size_t i = size - 1; i < bytes; i += size) out[i] &= 0x3f;
  }
}

/* The (code, bits) DLPack gives each dtype. */
static const struct {
  kiln_dtype_t dtype;
  uint8_t code, bits;
} kt_dl_codes[] = {
    {KILN_BOOL, 6, 8},  {KILN_I8, kDLInt, 8},     {KILN_U8, kDLUInt, 8},     {KILN_I16, kDLInt, 16},
    {KILN_I32, kDLInt, 32}, {KILN_I64, kDLInt, 64}, {KILN_F16, kDLFloat, 16}, {KILN_BF16, kDLBfloat, 16},
    {KILN_F32, kDLFloat, 32}, {KILN_F64, kDLFloat, 64},
};

/* Export of every dtype carries its (code, bits) and points at the tensor's
 * own bytes; importing either form gives the dtype back over those bytes. */
START_TEST(test_every_dtype_round_trip) {
  kiln_device_t *cpu = kt_cpu();
  ck_assert_int_eq(sizeof kt_dl_codes / sizeof kt_dl_codes[0], KILN_DTYPE_COUNT_);
  for (size_t k = 0; k < sizeof kt_dl_codes / sizeof kt_dl_codes[0]; k++) {
    const kiln_dtype_t dtype = kt_dl_codes[k].dtype;
    const size_t size = kiln_dtype_size(dtype);
    unsigned char host[64], back[64];
    kt_pattern(dtype, host, 6 * size);
    kiln_tensor_t *a = NULL, *b = NULL, *c = NULL;
    KT_OK(kiln_tensor_from_host(cpu, dtype, 2, (const int64_t[]){2, 3}, host, &a));
    DLManagedTensor *m = NULL;
    KT_OK(kiln_tensor_to_dlpack(a, &m));
    ck_assert_int_eq(m->dl_tensor.dtype.code, kt_dl_codes[k].code);
    ck_assert_int_eq(m->dl_tensor.dtype.bits, kt_dl_codes[k].bits);
    ck_assert_int_eq(m->dl_tensor.dtype.lanes, 1);
    ck_assert_int_eq(m->dl_tensor.strides[0], 3);
    unsigned char *raw = (unsigned char *)m->dl_tensor.data + m->dl_tensor.byte_offset;
    ck_assert_mem_eq(raw, host, 6 * size);
    KT_OK(kiln_tensor_from_dlpack(m, &b));
    ck_assert_int_eq(kiln_tensor_dtype(b), dtype);
    ck_assert_int_eq(kiln_tensor_ndim(b), 2);
    ck_assert_int_eq(kiln_tensor_shape(b)[1], 3);
    memset(back, 0, sizeof back);
    KT_OK(kiln_tensor_read(b, back, 6 * size));
    ck_assert_mem_eq(back, host, 6 * size);
    /* One memory: a write to the exported bytes shows in both tensors. */
    memcpy(raw, host + 5 * size, size);
    KT_OK(kiln_tensor_read(a, back, 6 * size));
    ck_assert_mem_eq(back, host + 5 * size, size);
    KT_OK(kiln_tensor_read(b, back, 6 * size));
    ck_assert_mem_eq(back, host + 5 * size, size);
    /* The versioned form too, of a strided view (a transpose): strides travel. */
    kiln_tensor_t *tr = NULL;
    KT_OK(kiln_tensor_transpose(a, 0, 1, &tr));
    DLManagedTensorVersioned *v = NULL;
    KT_OK(kiln_tensor_to_dlpack_versioned(tr, &v));
    ck_assert_int_eq(v->dl_tensor.dtype.code, kt_dl_codes[k].code);
    ck_assert_int_eq(v->dl_tensor.strides[0], 1);
    ck_assert_int_eq(v->dl_tensor.strides[1], 3);
    KT_OK(kiln_tensor_from_dlpack_versioned(v, &c));
    ck_assert_int_eq(kiln_tensor_dtype(c), dtype);
    ck_assert_int_eq(kiln_tensor_strides(c)[0], 1);
    ck_assert_int_eq(kiln_tensor_strides(c)[1], 3);
    kiln_tensor_release(c);
    kiln_tensor_release(tr);
    kiln_tensor_release(b);
    kiln_tensor_release(a);
  }
  kiln_deinitialize();
}
END_TEST

typedef struct kt_bytes_t {
  DLManagedTensor managed;
  unsigned char data[64];
  int64_t shape[1];
} kt_bytes_t;

static void kt_bytes_deleter(DLManagedTensor *self) {
  atomic_fetch_add(&kt_deleted, 1);
  free(self->manager_ctx);
}

/* A producer's memory of every dtype is viewed, not copied: a write to it
 * shows in the kiln tensor. byte_offset counts whole elements of the dtype. */
START_TEST(test_every_dtype_import_zero_copy) {
  kt_cpu();
  atomic_store(&kt_deleted, 0);
  for (size_t k = 0; k < sizeof kt_dl_codes / sizeof kt_dl_codes[0]; k++) {
    const kiln_dtype_t dtype = kt_dl_codes[k].dtype;
    const size_t size = kiln_dtype_size(dtype);
    kt_bytes_t *o = calloc(1, sizeof *o);
    ck_assert_ptr_nonnull(o);
    kt_pattern(dtype, o->data, 8 * size);
    o->shape[0] = 4;
    DLTensor *t = &o->managed.dl_tensor;
    t->data = o->data;
    t->device.device_type = kDLCPU;
    t->ndim = 1;
    t->dtype.code = kt_dl_codes[k].code;
    t->dtype.bits = kt_dl_codes[k].bits;
    t->dtype.lanes = 1;
    t->shape = o->shape;
    o->managed.manager_ctx = o;
    o->managed.deleter = kt_bytes_deleter;
    kiln_tensor_t *view = NULL;
    if (size > 1) {
      t->byte_offset = 1;
      KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &view), KILN_INVALID_ARGUMENT, "byte_offset 1 is not a whole number");
    }
    t->byte_offset = 2 * size; /* elements 2..5 */
    KT_OK(kiln_tensor_from_dlpack(&o->managed, &view));
    ck_assert_int_eq(kiln_tensor_dtype(view), dtype);
    unsigned char back[32];
    KT_OK(kiln_tensor_read(view, back, 4 * size));
    ck_assert_mem_eq(back, o->data + 2 * size, 4 * size);
    memcpy(o->data + 2 * size, o->data + 5 * size, size); /* the producer writes element 2 */
    KT_OK(kiln_tensor_read(view, back, 4 * size));
    ck_assert_mem_eq(back, o->data + 5 * size, size);
    kiln_tensor_release(view);
    ck_assert_int_eq(atomic_load(&kt_deleted), (int)k + 1);
  }
  kiln_deinitialize();
}
END_TEST

/* Types kiln lacks are refused in words, not codes, and the tensor stays
 * with the caller. */
START_TEST(test_import_refuses_missing_types_in_words) {
  kt_cpu();
  atomic_store(&kt_deleted, 0);
  static const struct {
    uint8_t code, bits;
    uint16_t lanes;
    const char *words;
  } cases[] = {
      {5, 64, 1, "holds complex64, which"},
      {5, 128, 1, "holds complex128, which"},
      {kDLUInt, 16, 1, "holds uint16, which"},
      {kDLUInt, 32, 1, "holds uint32, which"},
      {kDLUInt, 64, 1, "holds uint64, which"},
      {kDLInt, 4, 1, "holds int4, which"},
      {kDLFloat, 8, 1, "holds float8, which"},
      {kDLBfloat, 32, 1, "holds bfloat32, which"},
      {10, 8, 1, "holds float8_e4m3fn, which"},
      {12, 8, 1, "holds float8_e5m2, which"},
      {17, 4, 1, "holds float4_e2m1fn, which"},
      {6, 16, 1, "holds bool of 16 bits, which"},
      {3, 64, 1, "holds an opaque handle of 64 bits, which"},
      {kDLFloat, 32, 4, "holds vectors of 4 lanes of float32, which"},
      {200, 8, 1, "holds a type DLPack does not name (code 200, 8 bits), which"},
  };
  kt_owned_t *o = kt_owned(2, 2);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kiln_tensor_t *t = NULL;
    o->managed.dl_tensor.dtype.code = cases[i].code;
    o->managed.dl_tensor.dtype.bits = cases[i].bits;
    o->managed.dl_tensor.dtype.lanes = cases[i].lanes;
    KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_DTYPE_MISMATCH, cases[i].words);
    ck_assert_ptr_nonnull(strstr(kiln_last_error(), "kiln exchanges bool, int8, uint8, int16, int32, int64, float16, "
                                                    "bfloat16, float32 and float64"));
    ck_assert_ptr_null(t);
  }
  ck_assert_int_eq(atomic_load(&kt_deleted), 0);
  o->managed.deleter(&o->managed);
  kiln_deinitialize();
}
END_TEST

/* ---- read-only memory ------------------------------------------------------------- */

/* A DLPack 1.x producer of one page the MMU itself keeps read-only: any
 * write to it would be SIGSEGV, not a wrong value. */
typedef struct kt_page_t {
  DLManagedTensorVersioned versioned;
  void *page;
  size_t size;
  int64_t shape[1];
} kt_page_t;

static void kt_page_deleter(DLManagedTensorVersioned *self) {
  kt_page_t *p = self->manager_ctx;
  atomic_fetch_add(&kt_deleted, 1);
  munmap(p->page, p->size);
  free(p);
}

static kt_page_t *kt_page_read_only(void) {
  kt_page_t *p = calloc(1, sizeof *p);
  ck_assert_ptr_nonnull(p);
  p->size = (size_t)sysconf(_SC_PAGESIZE);
  p->page = mmap(NULL, p->size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(p->page, MAP_FAILED);
  p->shape[0] = (int64_t)(p->size / sizeof(float));
  DLTensor *t = &p->versioned.dl_tensor;
  t->data = p->page;
  t->device.device_type = kDLCPU;
  t->ndim = 1;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = p->shape;
  p->versioned.version.major = 1;
  p->versioned.manager_ctx = p;
  p->versioned.deleter = kt_page_deleter;
  p->versioned.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  return p;
}

/* Every writer refuses a read-only import, through the one check, with a
 * message naming what it would have written; reading it still works. */
START_TEST(test_read_only_import_every_writer_refuses) {
  kiln_device_t *cpu = kt_cpu();
  atomic_store(&kt_deleted, 0);
  kt_page_t *p = kt_page_read_only();
  const int64_t n = p->shape[0];
  kiln_tensor_t *t = NULL, *ones = NULL, *zeros = NULL, *sum = NULL;
  KT_OK(kiln_tensor_from_dlpack_versioned(&p->versioned, &t));
  KT_OK(kiln_tensor_ones(cpu, KILN_F32, 1, &n, &ones));
  KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 1, &n, &zeros));
  kiln_buffer_t *buffer = kiln_tensor_buffer(t);
  kiln_queue_t *queue = kiln_device_current_queue(cpu);
  const float one = 1.0f;
  float host[4] = {1, 2, 3, 4};
  KT_FAILS(kiln_buffer_write(queue, buffer, 0, host, sizeof host, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT,
           "kiln_buffer_write: buffer views memory imported read-only");
  KT_FAILS(kiln_buffer_write(queue, buffer, 0, host, sizeof host, false, 0, NULL, NULL), KILN_INVALID_ARGUMENT,
           "imported read-only");
  KT_FAILS(kiln_buffer_fill(queue, buffer, 0, 16, &one, sizeof one, 0, NULL, NULL), KILN_INVALID_ARGUMENT,
           "kiln_buffer_fill: buffer views memory imported read-only");
  KT_FAILS(kiln_buffer_copy(queue, kiln_tensor_buffer(ones), 0, buffer, 0, 16, 0, NULL, NULL), KILN_INVALID_ARGUMENT,
           "kiln_buffer_copy: dst views memory imported read-only");
  KT_FAILS(kiln_tensor_accumulate(t, 1.0, ones), KILN_INVALID_ARGUMENT,
           "kiln_tensor_accumulate: a views memory imported read-only");
  const kiln_sgd_params_t sgd = {.lr = 0.1, .momentum = 0.9};
  KT_FAILS(kiln_tensor_sgd_update(t, ones, zeros, &sgd), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: param views memory imported read-only");
  KT_FAILS(kiln_tensor_sgd_update(zeros, ones, t, &sgd), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: momentum_buf views memory imported read-only");
  const kiln_adam_params_t adam = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  kiln_tensor_t *m = NULL, *v = NULL;
  KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 1, &n, &m));
  KT_OK(kiln_tensor_zeros(cpu, KILN_F32, 1, &n, &v));
  KT_FAILS(kiln_tensor_adam_update(t, ones, m, v, 1, &adam), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: param views memory imported read-only");
  KT_FAILS(kiln_tensor_adam_update(zeros, ones, t, v, 1, &adam), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: m views memory imported read-only");
  KT_FAILS(kiln_tensor_adam_update(zeros, ones, m, t, 1, &adam), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: v views memory imported read-only");
  /* Read as an operand it is fine, and the failed writers left it as it was. */
  KT_OK(kiln_tensor_sgd_update(zeros, t, NULL, &(kiln_sgd_params_t){.lr = 0.1}));
  KT_OK(kiln_tensor_add(t, ones, &sum));
  KT_OK(kiln_buffer_read(queue, buffer, 0, host, sizeof host, true, 0, NULL, NULL));
  for (int i = 0; i < 4; i++) ck_assert_float_eq(host[i], 0.0f);
  float first = 0;
  KT_OK(kiln_buffer_read(queue, kiln_tensor_buffer(sum), 0, &first, sizeof first, true, 0, NULL, NULL));
  ck_assert_float_eq(first, 1.0f);
  kiln_tensor_t *all[] = {sum, ones, zeros, m, v, t};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  ck_assert_int_eq(atomic_load(&kt_deleted), 1);
  kiln_deinitialize();
}
END_TEST

/* Offsets and extents past what any device addresses are refused, naming the value. */
START_TEST(test_import_refuses_unaddressable_extents) {
  kt_cpu();
  atomic_store(&kt_deleted, 0);
  kt_owned_t *o = kt_owned(2, 2);
  kiln_tensor_t *t = NULL;
  o->managed.dl_tensor.byte_offset = UINT64_C(1) << 62;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "byte_offset 4611686018427387904");
  o->managed.dl_tensor.byte_offset = UINT64_MAX - 3;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "byte_offset 18446744073709551612");
  /* Strides that reach 2^58 bytes. */
  o->managed.dl_tensor.byte_offset = 0;
  o->strides[0] = INT64_C(1) << 56;
  o->strides[1] = 1;
  o->managed.dl_tensor.strides = o->strides;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT,
           "reach 72057594037927938 elements past byte_offset 0");
  /* An offset within the limit, but the extent past it. */
  o->strides[0] = 2;
  o->managed.dl_tensor.byte_offset = (UINT64_C(1) << 57) - 8;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT,
           "reach 4 elements past byte_offset 144115188075855864");
  /* Strides whose product overflows 64 bits. */
  o->managed.dl_tensor.byte_offset = 0;
  o->strides[0] = INT64_MAX / 2;
  o->strides[1] = INT64_MAX / 2;
  o->shape[0] = 3;
  o->shape[1] = 3;
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "reach more than");
  /* A pointer whose view would wrap past the top of memory. */
  o->shape[0] = 2;
  o->shape[1] = 2;
  o->managed.dl_tensor.strides = NULL;
  o->managed.dl_tensor.data = (void *)(UINTPTR_MAX - 7);
  KT_FAILS(kiln_tensor_from_dlpack(&o->managed, &t), KILN_INVALID_ARGUMENT, "wraps past the top of the address space");
  o->managed.dl_tensor.data = o->data;
  ck_assert_ptr_null(t);
  ck_assert_int_eq(atomic_load(&kt_deleted), 0);
  /* The honest tensor still imports. */
  KT_OK(kiln_tensor_from_dlpack(&o->managed, &t));
  kiln_tensor_release(t);
  ck_assert_int_eq(atomic_load(&kt_deleted), 1);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_device_of) {
  DLDevice d;
  KT_OK(kiln_device_dlpack(kt_cpu(), &d));
  ck_assert_int_eq(d.device_type, kDLCPU);
  ck_assert_int_eq(d.device_id, 0);
  KT_FAILS(kiln_device_dlpack(NULL, &d), KILN_INVALID_ARGUMENT, "device is NULL");
  kiln_deinitialize();
}
END_TEST

/* On OpenCL devices the handle is the cl_mem, and a round trip shares it. */
START_TEST(test_opencl_round_trip) {
  kiln_device_t *cl = NULL;
  if (kiln_device_find("opencl:0", &cl) != KILN_OK) {
    kiln_clear_error();
    printf("test_opencl_round_trip: no OpenCL device; skipped\n");
    kiln_deinitialize();
    return;
  }
  DLDevice d;
  KT_OK(kiln_device_dlpack(cl, &d));
  ck_assert_int_eq(d.device_type, kDLOpenCL);
  kiln_tensor_t *a = NULL, *b = NULL, *ones = NULL;
  KT_OK(kiln_tensor_zeros(cl, KILN_F32, 1, (const int64_t[]){7}, &a));
  DLManagedTensor *m = NULL;
  KT_OK(kiln_tensor_to_dlpack(a, &m));
  ck_assert_ptr_nonnull(m->dl_tensor.data);
  KT_OK(kiln_tensor_from_dlpack(m, &b));
  KT_OK(kiln_tensor_ones(cl, KILN_F32, 1, (const int64_t[]){7}, &ones));
  KT_OK(kiln_tensor_accumulate(b, 4.0, ones));
  float host[7];
  KT_OK(kiln_tensor_read(a, host, sizeof host));
  ck_assert_float_eq(host[6], 4.0f);
  kiln_tensor_release(b);
  kiln_tensor_release(a);
  kiln_tensor_release(ones);
  /* Storage of a dtype the device does not compute in travels too; an op on
   * it is still refused, naming the device and the dtype. */
  const uint16_t halves[3] = {0x3c00, 0xc000, 0x7bff}; /* 1, -2, 65504 */
  KT_OK(kiln_tensor_from_host(cl, KILN_F16, 1, (const int64_t[]){3}, halves, &a));
  KT_OK(kiln_tensor_to_dlpack(a, &m));
  ck_assert_int_eq(m->dl_tensor.dtype.code, kDLFloat);
  ck_assert_int_eq(m->dl_tensor.dtype.bits, 16);
  ck_assert_int_eq(m->dl_tensor.device.device_type, kDLOpenCL);
  KT_OK(kiln_tensor_from_dlpack(m, &b));
  ck_assert_int_eq(kiln_tensor_dtype(b), KILN_F16);
  uint16_t back[3] = {0};
  KT_OK(kiln_tensor_read(b, back, sizeof back));
  ck_assert_mem_eq(back, halves, sizeof back);
  if (kiln_device_dtype_support(cl, KILN_F16) == KILN_DTYPE_UNSUPPORTED) {
    kiln_tensor_t *wide = NULL;
    KT_FAILS(kiln_tensor_cast(b, KILN_F32, &wide), KILN_UNSUPPORTED, "f16");
    ck_assert_ptr_null(wide);
  }
  kiln_tensor_release(b);
  kiln_tensor_release(a);
  kiln_deinitialize();
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  Suite *s = suite_create("dlpack");
  TCase *tc = tcase_create("dlpack");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_export_fields_and_sharing);
  tcase_add_test(tc, test_export_waits_for_work);
  tcase_add_test(tc, test_import_zero_copy_and_ownership);
  tcase_add_test(tc, test_round_trip_shares_memory);
  tcase_add_test(tc, test_import_refusals);
  tcase_add_test(tc, test_every_dtype_round_trip);
  tcase_add_test(tc, test_every_dtype_import_zero_copy);
  tcase_add_test(tc, test_import_refuses_missing_types_in_words);
  tcase_add_test(tc, test_read_only_import_every_writer_refuses);
  tcase_add_test(tc, test_import_refuses_unaddressable_extents);
  tcase_add_test(tc, test_device_of);
  tcase_add_test(tc, test_opencl_round_trip);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
