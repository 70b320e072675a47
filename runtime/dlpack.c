/* runtime/dlpack.c: DLPack export and import of kiln tensors (0.x DLManagedTensor and 1.x DLManagedTensorVersioned), without copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/dlpack.h"
#include "runtime/internal.h"

/* The two managed forms differ only around the DLTensor, so one record holds
 * either, with room for the shape and strides the DLTensor points to. */
typedef struct export_t {
  union {
    DLManagedTensor legacy;
    DLManagedTensorVersioned versioned;
  } managed;
  kiln_tensor_t *tensor; /* retained until the deleter runs */
  int64_t shape[KILN_MAX_DIMS];
  int64_t strides[KILN_MAX_DIMS];
} export_t;

static void export_free(export_t *e) {
  kiln_tensor_release(e->tensor);
  free(e);
}

static void legacy_deleter(DLManagedTensor *self) {
  if (self) export_free(self->manager_ctx);
}

static void versioned_deleter(DLManagedTensorVersioned *self) {
  if (self) export_free(self->manager_ctx);
}

static kiln_status_t dlpack_device_of(const char *call, const kiln_device_t *device, DLDevice *out) {
  if (!device->iface->dlpack_device)
    return kiln__set_error(KILN_UNSUPPORTED,
                           "%s: the %s backend of %s has no DLPack exchange; copy the tensor to the CPU first "
                           "(kiln_tensor_to)",
                           call, device->iface->name, device->display_name);
  int32_t type = 0, id = 0;
  device->iface->dlpack_device(device->ctx, device->impl, &type, &id);
  out->device_type = (DLDeviceType)type;
  out->device_id = id;
  return KILN_OK;
}

kiln_status_t kiln_device_dlpack(const kiln_device_t *device, DLDevice *out_device) {
  static const char call[] = "kiln_device_dlpack";
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!device || !out_device)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !device ? "device" : "out_device");
  return dlpack_device_of(call, device, out_device);
}

/* Fill the DLTensor of an export of `tensor` (retained into e). */
static kiln_status_t export_fill(const char *call, kiln_tensor_t *tensor, export_t *e, DLTensor *t) {
  kiln_device_t *device = tensor->buffer->device;
  kiln_status_t status = dlpack_device_of(call, device, &t->device);
  if (status != KILN_OK) return status;
  if (!device->iface->buffer_handle)
    return kiln__set_error(KILN_UNSUPPORTED, "%s: the %s backend cannot hand out its memory", call,
                           device->iface->name);
  /* The consumer may read at once: the work that writes the tensor first. */
  status = kiln__buffer_settle(tensor->buffer);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s: finishing the work on the tensor", call);
  t->data = device->iface->buffer_handle(device->ctx, tensor->buffer->impl);
  t->ndim = tensor->ndim;
  /* (code, bits) from the dtype list (include/kiln/tensor.h). */
  uint8_t code = 0, bits = 0;
  kiln__dtype_to_dlpack(tensor->dtype, &code, &bits);
  t->dtype.code = code;
  t->dtype.bits = bits;
  t->dtype.lanes = 1;
  for (int i = 0; i < tensor->ndim; i++) {
    e->shape[i] = tensor->shape[i];
    e->strides[i] = tensor->strides[i];
  }
  t->shape = e->shape;
  t->strides = e->strides;
  t->byte_offset = (uint64_t)kiln_tensor_offset_bytes(tensor);
  e->tensor = kiln_tensor_retain(tensor);
  return KILN_OK;
}

kiln_status_t kiln_tensor_to_dlpack(kiln_tensor_t *tensor, DLManagedTensor **out_managed) {
  static const char call[] = "kiln_tensor_to_dlpack";
  if (!tensor || !out_managed)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !tensor ? "tensor" : "out_managed");
  export_t *e = calloc(1, sizeof *e);
  if (!e) return kiln__set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate the DLPack record", call);
  kiln_status_t status = export_fill(call, tensor, e, &e->managed.legacy.dl_tensor);
  if (status != KILN_OK) {
    free(e);
    return status;
  }
  e->managed.legacy.manager_ctx = e;
  e->managed.legacy.deleter = legacy_deleter;
  *out_managed = &e->managed.legacy;
  return KILN_OK;
}

kiln_status_t kiln_tensor_to_dlpack_versioned(kiln_tensor_t *tensor, DLManagedTensorVersioned **out_managed) {
  static const char call[] = "kiln_tensor_to_dlpack_versioned";
  if (!tensor || !out_managed)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !tensor ? "tensor" : "out_managed");
  export_t *e = calloc(1, sizeof *e);
  if (!e) return kiln__set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate the DLPack record", call);
  kiln_status_t status = export_fill(call, tensor, e, &e->managed.versioned.dl_tensor);
  if (status != KILN_OK) {
    free(e);
    return status;
  }
  e->managed.versioned.version.major = KILN_DLPACK_MAJOR;
  e->managed.versioned.version.minor = KILN_DLPACK_MINOR;
  e->managed.versioned.manager_ctx = e;
  e->managed.versioned.deleter = versioned_deleter;
  e->managed.versioned.flags = 0;
  *out_managed = &e->managed.versioned;
  return KILN_OK;
}

/* ---- import -------------------------------------------------------------------------- */

/* The kiln device DLPack names: the first visible device whose backend says
 * it is that (type, id). Pinned CUDA host memory is host memory. */
static kiln_status_t find_device(const char *call, DLDevice want, kiln_device_t **out) {
  if (want.device_type == kDLCUDAHost) want.device_type = kDLCPU, want.device_id = 0;
  for (size_t i = 0; i < kiln__rt.device_count; i++) {
    kiln_device_t *d = kiln__rt.devices[i];
    if (!d->iface->dlpack_device) continue;
    int32_t type = 0, id = 0;
    d->iface->dlpack_device(d->ctx, d->impl, &type, &id);
    if (type == (int32_t)want.device_type && id == want.device_id) {
      *out = d;
      return KILN_OK;
    }
  }
  return kiln__set_error(KILN_NOT_FOUND,
                         "%s: the DLPack tensor lives on device type %d, id %d, which no visible kiln device is "
                         "(kiln has kDLCPU for its CPU backend, kDLCUDA for CUDA, kDLOpenCL for OpenCL; devinfo lists "
                         "what is visible); copy it to host memory first",
                         call, (int)want.device_type, (int)want.device_id);
}

/* A DLPack (code, bits, lanes) in words, as frameworks name them: "complex64",
 * "uint16", "float8_e4m3fn", "vectors of 4 lanes of float32". Returns buf. */
static const char *dlpack_type_words(DLDataType type, char *buf, size_t size) {
  /* The codes after kDLBfloat (4), from DLPack 1.1's dlpack.h. */
  static const char *const float8_names[] = {
      [7] = "float8_e3m4",      [8] = "float8_e4m3",        [9] = "float8_e4m3b11fnuz", [10] = "float8_e4m3fn",
      [11] = "float8_e4m3fnuz", [12] = "float8_e5m2",       [13] = "float8_e5m2fnuz",   [14] = "float8_e8m0fnu",
      [15] = "float6_e2m3fn",   [16] = "float6_e3m2fn",     [17] = "float4_e2m1fn",
  };
  char base[64];
  const unsigned code = type.code, bits = type.bits;
  switch (code) {
  case 0: snprintf(base, sizeof base, "int%u", bits); break;
  case 1: snprintf(base, sizeof base, "uint%u", bits); break;
  case 2: snprintf(base, sizeof base, "float%u", bits); break;
  case 3: snprintf(base, sizeof base, "an opaque handle of %u bits", bits); break;
  case 4: snprintf(base, sizeof base, "bfloat%u", bits); break;
  case 5: snprintf(base, sizeof base, "complex%u", bits); break;
  case 6: snprintf(base, sizeof base, bits == 8 ? "bool" : "bool of %u bits", bits); break;
  default:
    if (code < sizeof float8_names / sizeof float8_names[0] && float8_names[code])
      snprintf(base, sizeof base, "%s", float8_names[code]);
    else
      snprintf(base, sizeof base, "a type DLPack does not name (code %u, %u bits)", code, bits);
  }
  if (type.lanes != 1) snprintf(buf, size, "vectors of %u lanes of %s", (unsigned)type.lanes, base);
  else snprintf(buf, size, "%s", base);
  return buf;
}

typedef struct import_t {
  void (*release)(void *managed);
  void *managed;
} import_t;

static void release_legacy(void *p) {
  DLManagedTensor *m = p;
  if (m->deleter) m->deleter(m);
}

static void release_versioned(void *p) {
  DLManagedTensorVersioned *m = p;
  if (m->deleter) m->deleter(m);
}

static kiln_status_t import_tensor(const char *call, const DLTensor *t, void (*release)(void *), void *managed,
                                   bool read_only, kiln_tensor_t **out) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (t->ndim < 0 || t->ndim > KILN_MAX_DIMS)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: ndim %d is outside [0, %d]", call, t->ndim, KILN_MAX_DIMS);
  if (t->ndim > 0 && !t->shape) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: shape is NULL for ndim %d", call, t->ndim);
  kiln_dtype_t dtype;
  if (t->dtype.lanes != 1 || !kiln__dtype_from_dlpack(t->dtype.code, t->dtype.bits, &dtype)) {
    char words[96];
    return kiln__set_error(KILN_DTYPE_MISMATCH,
                           "%s: the DLPack tensor holds %s, which kiln does not have; kiln exchanges bool, int8, "
                           "uint8, int16, int32, int64, float16, bfloat16, float32 and float64: convert it to one of "
                           "those before exchanging",
                           call, dlpack_type_words(t->dtype, words, sizeof words));
  }
  const uint64_t item = kiln_dtype_size(dtype);
  if (t->byte_offset % item != 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: byte_offset %llu is not a whole number of %llu-byte %s elements; kiln cannot view it",
                           call, (unsigned long long)t->byte_offset, (unsigned long long)item,
                           kiln_dtype_long_name(dtype));
  int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
  int64_t numel = 1, span = 1; /* elements the view reaches, from its first */
  for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
  status = kiln__shape_check(call, t->ndim, shape, dtype, &numel, NULL);
  if (status != KILN_OK) return status;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    strides[i] = t->strides ? t->strides[i] : expected;
    expected = kiln__mul_sat(expected, shape[i] > 0 ? shape[i] : 1);
    if (strides[i] < 0)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: stride %lld of dimension %d is negative; kiln views need strides >= 0 (make the array "
                             "contiguous first)",
                             call, (long long)strides[i], i);
    if (numel > 0) span = kiln__mul_sat(strides[i], shape[i] - 1) > INT64_MAX - span
                              ? INT64_MAX
                              : span + kiln__mul_sat(strides[i], shape[i] - 1);
  }
  if (numel == 0) span = 0;
  /* No device kiln runs on addresses more than 2^57 bytes (x86-64's five-level
   * paging; AArch64 and CUDA's unified addresses have fewer bits): an offset or
   * an extent beyond that is a producer's bug, not memory. */
  const uint64_t limit = UINT64_C(1) << 57;
  if (t->byte_offset >= limit)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: byte_offset %llu lies beyond any address (kiln views at most 2^57 bytes); pass the "
                           "offset of the first element from data",
                           call, (unsigned long long)t->byte_offset);
  if (span == INT64_MAX || (uint64_t)span > (limit - t->byte_offset) / item)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: the shape and strides reach %s%lld elements past byte_offset %llu, more than 2^57 bytes "
                           "in all; kiln cannot view it (check the strides, which count elements, not bytes)",
                           call, span == INT64_MAX ? "more than " : "", (long long)span,
                           (unsigned long long)t->byte_offset);
  const uint64_t first = t->byte_offset / item;
  /* The view's bytes, from data: an address must not wrap past the top of memory. */
  const uint64_t extent = (first + (uint64_t)span) * item;
  if ((uint64_t)(size_t)extent != extent)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: the view's %llu bytes are more than this machine's size_t holds",
                           call, (unsigned long long)extent);
  if (t->device.device_type != kDLOpenCL && span > 0 && (uint64_t)(uintptr_t)t->data > UINTPTR_MAX - extent)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: data %p plus the view's %llu bytes wraps past the top of the address space; kiln "
                           "cannot view it",
                           call, t->data, (unsigned long long)extent);
  kiln_device_t *device = NULL;
  status = find_device(call, t->device, &device);
  if (status != KILN_OK) return status;
  if (!t->data && span > 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: data is NULL for a tensor of %lld elements", call, (long long)numel);
  kiln_tensor_t *tensor = NULL;
  /* The buffer covers the memory from data to the last element viewed. */
  const size_t bytes = (size_t)extent;
  kiln_buffer_t *buffer = NULL;
  status = kiln__buffer_wrap(device, t->data, bytes, release, managed, &buffer);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  buffer->read_only = read_only;
  status = kiln__tensor_over(buffer, (size_t)first, dtype, t->ndim, shape, strides, &tensor);
  if (status != KILN_OK) {
    /* The caller keeps the DLPack tensor: this record must not release it. */
    buffer->release = NULL;
    kiln_buffer_release(buffer);
    return kiln__wrap_error(status, "%s", call);
  }
  kiln_buffer_release(buffer); /* the tensor holds it now */
  *out = tensor;
  return KILN_OK;
}

kiln_status_t kiln_tensor_from_dlpack(DLManagedTensor *managed, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_from_dlpack";
  if (!managed || !out)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !managed ? "managed" : "out");
  return import_tensor(call, &managed->dl_tensor, release_legacy, managed, false, out);
}

kiln_status_t kiln_tensor_from_dlpack_versioned(DLManagedTensorVersioned *managed, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_from_dlpack_versioned";
  if (!managed || !out)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !managed ? "managed" : "out");
  if (managed->version.major != KILN_DLPACK_MAJOR)
    return kiln__set_error(KILN_UNSUPPORTED,
                           "%s: the tensor speaks DLPack %u.%u; kiln reads major version %u (ask the producer for "
                           "that, or for the unversioned form)",
                           call, managed->version.major, managed->version.minor, KILN_DLPACK_MAJOR);
  return import_tensor(call, &managed->dl_tensor, release_versioned, managed,
                       (managed->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, out);
}
