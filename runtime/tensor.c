/* runtime/tensor.c: the tensor object, its creation, views, and movement between host and devices. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

const char *kiln_dtype_name(kiln_dtype_t dtype) {
  switch (dtype) {
    case KILN_F32: return "f32";
    case KILN_I32: return "i32";
    case KILN_F16: return "f16";
    case KILN_BF16: return "bf16";
  }
  return "?";
}

size_t kiln_dtype_size(kiln_dtype_t dtype) {
  switch (dtype) {
    case KILN_F32:
    case KILN_I32: return 4;
    case KILN_F16:
    case KILN_BF16: return 2;
  }
  return 0;
}

/* ---- the object --------------------------------------------------------------- */

/* Tensor structs are recycled per thread: an operation's result must not
 * cost a trip through malloc on the tiny-op path. */
#define KILN_TENSOR_CACHE 32
static _Thread_local kiln_tensor_t *tensor_cache[KILN_TENSOR_CACHE];
static _Thread_local int tensor_cached;

static _Thread_local bool tensor_cache_registered;
static pthread_key_t tensor_cache_key;
static bool tensor_cache_key_ok;
static pthread_once_t tensor_cache_once = PTHREAD_ONCE_INIT;

/* At thread exit: the cached structs would otherwise leak. */
static void tensor_cache_exit(void *unused) {
  while (tensor_cached > 0) free(tensor_cache[--tensor_cached]);
}

void kiln__tensor_cache_drop(void) { tensor_cache_exit(NULL); }

int kiln__tensor_cache_count(void) { return tensor_cached; }

static void tensor_cache_key_create(void) {
  tensor_cache_key_ok = pthread_key_create(&tensor_cache_key, tensor_cache_exit) == 0;
}

static kiln_tensor_t *tensor_struct(void) {
  if (tensor_cached > 0) return tensor_cache[--tensor_cached];
  return malloc(sizeof(kiln_tensor_t));
}

static void tensor_struct_free(kiln_tensor_t *tensor) {
  if (!tensor_cache_registered) {
    /* Only a thread whose exit runs the destructor may keep a cache. */
    pthread_once(&tensor_cache_once, tensor_cache_key_create);
    tensor_cache_registered =
        tensor_cache_key_ok && pthread_setspecific(tensor_cache_key, &tensor_cached) == 0;
  }
  if (tensor_cache_registered && tensor_cached < KILN_TENSOR_CACHE)
    tensor_cache[tensor_cached++] = tensor;
  else
    free(tensor);
}

static void tensor_destroy(kiln_tensor_t *tensor) {
  kiln_buffer_release(tensor->buffer);
  tensor_struct_free(tensor);
}

KILN__DEFINE_REFCOUNT(kiln_tensor_t, tensor, tensor_destroy)

kiln_dtype_t kiln_tensor_dtype(const kiln_tensor_t *tensor) { return tensor ? tensor->dtype : KILN_F32; }
int kiln_tensor_ndim(const kiln_tensor_t *tensor) { return tensor ? tensor->ndim : 0; }
const int64_t *kiln_tensor_shape(const kiln_tensor_t *tensor) { return tensor ? tensor->shape : NULL; }
const int64_t *kiln_tensor_strides(const kiln_tensor_t *tensor) { return tensor ? tensor->strides : NULL; }

int64_t kiln_tensor_numel(const kiln_tensor_t *tensor) { return tensor ? kiln__numel(tensor->ndim, tensor->shape) : 0; }

kiln_device_t *kiln_tensor_device(const kiln_tensor_t *tensor) { return tensor ? tensor->buffer->device : NULL; }
kiln_buffer_t *kiln_tensor_buffer(const kiln_tensor_t *tensor) { return tensor ? tensor->buffer : NULL; }

size_t kiln_tensor_offset_bytes(const kiln_tensor_t *tensor) {
  return tensor ? tensor->offset * kiln_dtype_size(tensor->dtype) : 0;
}

bool kiln_tensor_is_contiguous(const kiln_tensor_t *tensor) {
  if (!tensor) return false;
  /* An empty tensor has no layout to speak of. */
  if (kiln__numel(tensor->ndim, tensor->shape) == 0) return true;
  int64_t expected = 1;
  for (int i = tensor->ndim - 1; i >= 0; i--) {
    if (tensor->shape[i] != 1 && tensor->strides[i] != expected) return false;
    expected = kiln__mul_sat(expected, tensor->shape[i]);
  }
  return true;
}

/* ---- internal helpers ----------------------------------------------------------- */

kiln_status_t kiln__shape_check(const char *call, int ndim, const int64_t *shape, kiln_dtype_t dtype,
                                int64_t *out_numel, size_t *out_bytes) {
  if (ndim < 0 || ndim > KILN_MAX_DIMS)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: ndim %d is outside [0, %d]; use at most KILN_MAX_DIMS dimensions",
                           call, ndim, KILN_MAX_DIMS);
  if (ndim > 0 && !shape)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: shape is NULL for ndim %d; pass an array of %d sizes", call,
                           ndim, ndim);
  size_t esize = kiln_dtype_size(dtype);
  if (esize == 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: dtype %d is not a kiln_dtype_t; use KILN_F32 or KILN_I32", call,
                           (int)dtype);
  int64_t numel = 1;
  bool empty = false;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: size %lld of dimension %d is negative; sizes must be >= 0",
                             call, (long long)shape[i], i);
    if (shape[i] == 0) empty = true;
  }
  if (empty) {
    numel = 0;
  } else {
    for (int i = 0; i < ndim; i++) {
      if (numel > INT64_MAX / shape[i] || (uint64_t)numel * (uint64_t)shape[i] > SIZE_MAX / esize)
        return kiln__set_error(KILN_INVALID_ARGUMENT,
                               "%s: the shape's byte size overflows (dimension %d of size %lld makes more than %zu "
                               "bytes of %s); use a smaller shape",
                               call, i, (long long)shape[i], (size_t)SIZE_MAX, kiln_dtype_name(dtype));
      numel *= shape[i];
    }
  }
  if (out_numel) *out_numel = numel;
  if (out_bytes) *out_bytes = (size_t)numel * esize;
  return KILN_OK;
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *out_strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    out_strides[i] = s;
    s = kiln__mul_sat(s, shape[i] > 0 ? shape[i] : 1);
  }
}

/* queue NULL: the tensor may be used on any queue (idle memory only). */
static kiln_status_t tensor_alloc(kiln_device_t *device, kiln_queue_t *queue, kiln_dtype_t dtype, int ndim,
                                       const int64_t *shape, kiln_tensor_t **out) {
  size_t bytes = 0;
  kiln_status_t status = kiln__shape_check("allocating a tensor", ndim, shape, dtype, NULL, &bytes);
  if (status != KILN_OK) return status;
  kiln_tensor_t *tensor = tensor_struct();
  if (!tensor)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate a tensor object (%zu bytes of host memory)",
                           sizeof *tensor);
  status = queue ? kiln__buffer_create(device, queue, bytes, &tensor->buffer)
                 : kiln__buffer_create_idle(device, bytes, &tensor->buffer);
  if (status != KILN_OK) {
    tensor_struct_free(tensor);
    return status;
  }
  atomic_init(&tensor->refs, 1);
  tensor->offset = 0;
  tensor->dtype = dtype;
  tensor->ndim = ndim;
  for (int i = 0; i < ndim; i++) tensor->shape[i] = shape[i];
  contiguous_strides(ndim, shape, tensor->strides);
  *out = tensor;
  return KILN_OK;
}

kiln_status_t kiln__tensor_alloc(kiln_device_t *device, kiln_queue_t *queue, kiln_dtype_t dtype, int ndim,
                                 const int64_t *shape, kiln_tensor_t **out) {
  return tensor_alloc(device, queue, dtype, ndim, shape, out);
}

void kiln__tensor_view(const kiln_tensor_t *tensor, kiln_view_t *out_view) {
  out_view->buffer = tensor->buffer->impl;
  out_view->offset = tensor->offset;
  out_view->dtype = tensor->dtype;
  out_view->ndim = tensor->ndim;
  for (int i = 0; i < tensor->ndim; i++) {
    out_view->shape[i] = tensor->shape[i];
    out_view->strides[i] = tensor->strides[i];
  }
}

kiln_status_t kiln__tensor_over(kiln_buffer_t *buffer, size_t offset, kiln_dtype_t dtype, int ndim,
                                const int64_t *shape, const int64_t *strides, kiln_tensor_t **out) {
  kiln_tensor_t *t = tensor_struct();
  if (!t)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate a tensor object (%zu bytes of host memory)", sizeof *t);
  atomic_init(&t->refs, 1);
  t->buffer = kiln_buffer_retain(buffer);
  t->offset = offset;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    t->strides[i] = strides[i];
  }
  *out = t;
  return KILN_OK;
}

/* A view sharing tensor's buffer. */
static kiln_status_t view_new(const kiln_tensor_t *tensor, int ndim, const int64_t *shape,
                                          const int64_t *strides, size_t offset, kiln_tensor_t **out) {
  kiln_tensor_t *view = tensor_struct();
  if (!view)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "cannot allocate a tensor object (%zu bytes of host memory)",
                           sizeof *view);
  atomic_init(&view->refs, 1);
  view->buffer = kiln_buffer_retain(tensor->buffer);
  view->offset = offset;
  view->dtype = tensor->dtype;
  view->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    view->shape[i] = shape[i];
    view->strides[i] = strides[i];
  }
  *out = view;
  return KILN_OK;
}

/* Enqueue a creation op (FILL, ARANGE, RANDOM) into a fresh tensor. */
static kiln_status_t create_op(const char *call, kiln_device_t *device, kiln_op_t *op, kiln_dtype_t dtype, int ndim,
                               const int64_t *shape, kiln_tensor_t **out) {
  op->n_in = 0;
  return kiln__op_enqueue(call, device, op, dtype, ndim, shape, NULL, out);
}

/* The checks every creation call shares. */
static kiln_status_t create_check(const char *call, kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                       const int64_t *shape, kiln_tensor_t **out) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!device)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: device is NULL; pass kiln_try_gpu(0), a device from kiln_device_default, or one from "
                           "kiln_device_get",
                           call);
  if (!out) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: out is NULL; pass the address of a kiln_tensor_t *", call);
  if (dtype != KILN_F32 && dtype != KILN_I32) {
    if (kiln_dtype_size(dtype) == 0)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: dtype %d is not a kiln_dtype_t; use KILN_F32 or KILN_I32",
                             call, (int)dtype);
    return kiln__set_error(KILN_DTYPE_MISMATCH, "%s: dtype %s is not supported yet; use KILN_F32 or KILN_I32", call,
                           kiln_dtype_name(dtype));
  }
  return kiln__shape_check(call, ndim, shape, dtype, NULL, NULL);
}

/* ---- creation --------------------------------------------------------------------- */

kiln_status_t kiln_tensor_empty(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                                kiln_tensor_t **out) {
  kiln_status_t status = create_check("kiln_tensor_empty", device, dtype, ndim, shape, out);
  if (status != KILN_OK) return status;
  /* Nothing orders the caller's first use after a queue: idle memory only. */
  status = tensor_alloc(device, NULL, dtype, ndim, shape, out);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_tensor_empty");
}

static kiln_status_t tensor_fill(const char *call, kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                      const int64_t *shape, double value, kiln_tensor_t **out) {
  kiln_status_t status = create_check(call, device, dtype, ndim, shape, out);
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_FILL;
  op.u.fill.value = kiln__scalar(value);
  return create_op(call, device, &op, dtype, ndim, shape, out);
}

kiln_status_t kiln_tensor_zeros(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                                kiln_tensor_t **out) {
  return tensor_fill("kiln_tensor_zeros", device, dtype, ndim, shape, 0.0, out);
}

kiln_status_t kiln_tensor_ones(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                               kiln_tensor_t **out) {
  return tensor_fill("kiln_tensor_ones", device, dtype, ndim, shape, 1.0, out);
}

kiln_status_t kiln_tensor_full(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                               double value, kiln_tensor_t **out) {
  return tensor_fill("kiln_tensor_full", device, dtype, ndim, shape, value, out);
}

kiln_status_t kiln_tensor_arange(kiln_device_t *device, kiln_dtype_t dtype, double start, double stop, double step,
                                 kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_arange";
  kiln_status_t status = create_check(call, device, dtype, 0, NULL, out);
  if (status != KILN_OK) return status;
  if (!isfinite(start) || !isfinite(stop) || !isfinite(step) || step == 0.0)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s(start %g, stop %g, step %g): start, stop and step must be finite and step non-zero",
                           call, start, stop, step);
  double count = ceil((stop - start) / step);
  if (!(count > 0)) count = 0;
  if (count > 9.0e15)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s(start %g, stop %g, step %g): %g elements are too many; use a larger step", call, start,
                           stop, step, count);
  int64_t shape[1] = {(int64_t)count};
  kiln_op_t op;
  op.kind = KILN_OP_ARANGE;
  op.u.arange.start = start;
  op.u.arange.step = step;
  status = kiln__shape_check(call, 1, shape, dtype, NULL, NULL);
  if (status != KILN_OK) return status;
  return create_op(call, device, &op, dtype, 1, shape, out);
}

kiln_status_t kiln_tensor_from_host(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                                    const void *data, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_from_host";
  kiln_status_t status = create_check(call, device, dtype, ndim, shape, out);
  if (status != KILN_OK) return status;
  size_t bytes = 0;
  kiln__shape_check(call, ndim, shape, dtype, NULL, &bytes);
  if (!data && bytes > 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: data is NULL for %zu bytes; pass the host values", call, bytes);
  kiln_queue_t *queue = kiln_device_current_queue(device);
  kiln_tensor_t *t = NULL;
  status = kiln__tensor_alloc(device, queue, dtype, ndim, shape, &t);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  if (bytes > 0) {
    status = kiln_buffer_write(queue, t->buffer, 0, data, bytes, true, 0, NULL, NULL);
    if (status != KILN_OK) {
      kiln_tensor_release(t);
      return kiln__wrap_error(status, "%s", call);
    }
  }
  *out = t;
  return KILN_OK;
}

static kiln_status_t tensor_random(const char *call, kiln_device_t *device, int ndim, const int64_t *shape,
                                        uint64_t seed, bool normal, float a, float b, kiln_tensor_t **out) {
  kiln_status_t status = create_check(call, device, KILN_F32, ndim, shape, out);
  if (status != KILN_OK) return status;
  if (!isfinite(a) || !isfinite(b) || (normal ? b < 0.0f : a > b))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s %g and %s %g are invalid; %s", call, normal ? "mean" : "low",
                           (double)a, normal ? "stddev" : "high", (double)b,
                           normal ? "both must be finite and stddev >= 0" : "both must be finite and low <= high");
  kiln_op_t op;
  op.kind = KILN_OP_RANDOM;
  op.u.random.seed = seed;
  op.u.random.normal = normal;
  op.u.random.a = a;
  op.u.random.b = b;
  return create_op(call, device, &op, KILN_F32, ndim, shape, out);
}

kiln_status_t kiln_tensor_uniform(kiln_device_t *device, int ndim, const int64_t *shape, uint64_t seed, float low,
                                  float high, kiln_tensor_t **out) {
  return tensor_random("kiln_tensor_uniform", device, ndim, shape, seed, false, low, high, out);
}

kiln_status_t kiln_tensor_normal(kiln_device_t *device, int ndim, const int64_t *shape, uint64_t seed, float mean,
                                 float stddev, kiln_tensor_t **out) {
  return tensor_random("kiln_tensor_normal", device, ndim, shape, seed, true, mean, stddev, out);
}

/* ---- movement ----------------------------------------------------------------------- */

/* A contiguous copy of `tensor` on its own device (the COPY op). */
static kiln_status_t copy_local(const kiln_tensor_t *tensor, kiln_tensor_t **out) {
  kiln_op_t op;
  op.kind = KILN_OP_COPY;
  op.n_in = 1;
  kiln__tensor_view(tensor, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {tensor};
  return kiln__op_enqueue("copying a tensor on its device", tensor->buffer->device, &op, tensor->dtype, tensor->ndim,
                          tensor->shape, inputs, out);
}

static kiln_status_t tensor_check(const char *call, const char *name, const kiln_tensor_t *tensor) {
  if (!tensor)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL; pass a tensor from a kiln_tensor_* call", call, name);
  return KILN_OK;
}

kiln_status_t kiln_tensor_read(const kiln_tensor_t *tensor, void *host, size_t size) {
  static const char call[] = "kiln_tensor_read";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  size_t bytes = (size_t)kiln_tensor_numel(tensor) * kiln_dtype_size(tensor->dtype);
  if (size < bytes)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: the host memory holds %zu bytes but the tensor has %zu bytes (%lld %s elements); pass "
                           "at least %zu bytes",
                           call, size, bytes, (long long)kiln_tensor_numel(tensor), kiln_dtype_name(tensor->dtype), bytes);
  if (!host && bytes > 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: host is NULL for %zu bytes; pass host memory", call, bytes);
  if (bytes == 0) return KILN_OK;
  const kiln_tensor_t *src = tensor;
  kiln_tensor_t *tmp = NULL;
  if (!kiln_tensor_is_contiguous(tensor)) {
    status = copy_local(tensor, &tmp);
    if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
    src = tmp;
  }
  kiln_queue_t *queue = kiln_device_current_queue(src->buffer->device);
  status = kiln_buffer_read(queue, src->buffer, kiln_tensor_offset_bytes(src), host, bytes, true, 0, NULL, NULL);
  kiln_tensor_release(tmp);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}

kiln_status_t kiln_tensor_item(const kiln_tensor_t *tensor, double *out_value) {
  static const char call[] = "kiln_tensor_item";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!out_value) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: out_value is NULL; pass the address of a double", call);
  int64_t numel = kiln_tensor_numel(tensor);
  if (numel != 1)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: the tensor has %lld elements, not one; read it with kiln_tensor_read instead", call,
                           (long long)numel);
  if (tensor->dtype != KILN_F32 && tensor->dtype != KILN_I32)
    return kiln__set_error(KILN_DTYPE_MISMATCH, "%s: dtype %s is not supported; use f32 or i32", call,
                           kiln_dtype_name(tensor->dtype));
  union { float f; int32_t i; } value;
  status = kiln_tensor_read(tensor, &value, sizeof value);
  if (status != KILN_OK) return status;
  *out_value = tensor->dtype == KILN_F32 ? (double)value.f : (double)value.i;
  return KILN_OK;
}

kiln_status_t kiln_tensor_copy(const kiln_tensor_t *tensor, kiln_device_t *device, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_copy";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!device || !out)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL; pass a destination device and the address of a kiln_tensor_t *",
                           call, !device ? "device" : "out");
  kiln_device_t *from = tensor->buffer->device;
  if (device == from) {
    status = copy_local(tensor, out);
    return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
  }
  kiln_tensor_t *src = NULL;
  if (kiln_tensor_is_contiguous(tensor)) {
    src = kiln_tensor_retain((kiln_tensor_t *)tensor);
  } else {
    status = copy_local(tensor, &src);
    if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  }
  kiln_queue_t *queue = kiln_device_current_queue(device);
  kiln_tensor_t *t = NULL;
  status = kiln__tensor_alloc(device, queue, src->dtype, src->ndim, src->shape, &t);
  if (status == KILN_OK) {
    size_t bytes = (size_t)kiln_tensor_numel(src) * kiln_dtype_size(src->dtype);
    status = kiln_buffer_copy(queue, src->buffer, kiln_tensor_offset_bytes(src), t->buffer, 0, bytes, 0, NULL, NULL);
    if (status != KILN_OK) {
      kiln_tensor_release(t);
      t = NULL;
    }
  }
  kiln_tensor_release(src);
  if (status != KILN_OK)
    return kiln__wrap_error(status, "%s from %s to %s", call, from->display_name, device->display_name);
  *out = t;
  return KILN_OK;
}

kiln_status_t kiln_tensor_to(kiln_tensor_t *tensor, kiln_device_t *device, kiln_tensor_t **out) {
  kiln_status_t status = tensor_check("kiln_tensor_to", "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!device || !out)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_tensor_to: %s is NULL; pass a destination device and the address of a kiln_tensor_t *",
                           !device ? "device" : "out");
  if (device == tensor->buffer->device) {
    *out = kiln_tensor_retain(tensor);
    return KILN_OK;
  }
  status = kiln_tensor_copy(tensor, device, out);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_tensor_to");
}

/* Strides for viewing `tensor` with a new shape without copying, as
 * PyTorch's computeStride: each run of old dims that is contiguous within
 * itself maps onto a run of new dims with the same element count. */
static bool view_strides(const kiln_tensor_t *tensor, int ndim, const int64_t *shape, int64_t *out_strides) {
  int64_t numel = kiln_tensor_numel(tensor);
  if (numel == 0 || tensor->ndim == 0) {
    contiguous_strides(ndim, shape, out_strides);
    return true;
  }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = tensor->strides[tensor->ndim - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = tensor->ndim - 1; d >= 0; d--) {
    tensor_numel *= tensor->shape[d];
    if (d == 0 || (tensor->shape[d - 1] != 1 && tensor->strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = tensor->strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

kiln_status_t kiln_tensor_reshape(kiln_tensor_t *tensor, int ndim, const int64_t *shape, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_reshape";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!out) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: out is NULL; pass the address of a kiln_tensor_t *", call);
  if (ndim < 0 || ndim > KILN_MAX_DIMS)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: ndim %d is outside [0, %d]", call, ndim, KILN_MAX_DIMS);
  if (ndim > 0 && !shape)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: shape is NULL for ndim %d; pass %d sizes", call, ndim, ndim);
  int64_t numel = kiln_tensor_numel(tensor);
  int64_t resolved[KILN_MAX_DIMS];
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    resolved[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0)
        return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: dimensions %d and %d are both -1; only one size may be inferred",
                               call, infer, i);
      infer = i;
    } else if (shape[i] < 0) {
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: size %lld of dimension %d is negative; use sizes >= 0 or one -1",
                             call, (long long)shape[i], i);
    } else {
      if (shape[i] != 0 && known > INT64_MAX / shape[i])
        return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: the new shape holds more elements than the tensor's %lld", call,
                               (long long)numel);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return kiln__set_error(KILN_SHAPE_MISMATCH,
                             "%s: cannot infer dimension %d: %lld elements are not a multiple of the other sizes' "
                             "product %lld",
                             call, infer, (long long)numel, (long long)known);
    resolved[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    return kiln__set_error(KILN_SHAPE_MISMATCH,
                           "%s: the new shape has %lld elements but the tensor has %lld; keep the element count (or "
                           "use -1 for one size)",
                           call, (long long)known, (long long)numel);
  int64_t strides[KILN_MAX_DIMS];
  if (view_strides(tensor, ndim, resolved, strides))
    return view_new(tensor, ndim, resolved, strides, tensor->offset, out);
  kiln_tensor_t *copy = NULL;
  status = copy_local(tensor, &copy);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  contiguous_strides(ndim, resolved, strides);
  status = view_new(copy, ndim, resolved, strides, copy->offset, out);
  kiln_tensor_release(copy);
  return status;
}

kiln_status_t kiln_tensor_permute(kiln_tensor_t *tensor, const int *perm, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_permute";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!out || (!perm && tensor->ndim > 0))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL; pass %d dimension indices and the address of a kiln_tensor_t *",
                           call, !out ? "out" : "perm", tensor->ndim);
  int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
  bool seen[KILN_MAX_DIMS] = {false};
  for (int i = 0; i < tensor->ndim; i++) {
    int d = perm[i] < 0 ? perm[i] + tensor->ndim : perm[i];
    if (d < 0 || d >= tensor->ndim || seen[d])
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: perm[%d] = %d is %s for a tensor of %d dimensions; pass each of 0..%d exactly once",
                             call, i, perm[i], (d < 0 || d >= tensor->ndim) ? "out of range" : "repeated",
                             tensor->ndim, tensor->ndim - 1);
    seen[d] = true;
    shape[i] = tensor->shape[d];
    strides[i] = tensor->strides[d];
  }
  return view_new(tensor, tensor->ndim, shape, strides, tensor->offset, out);
}

kiln_status_t kiln_tensor_transpose(kiln_tensor_t *tensor, int dim0, int dim1, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_transpose";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!out) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: out is NULL; pass the address of a kiln_tensor_t *", call);
  int n = tensor->ndim;
  int d0 = dim0 < 0 ? dim0 + n : dim0, d1 = dim1 < 0 ? dim1 + n : dim1;
  if (d0 < 0 || d0 >= n || d1 < 0 || d1 >= n)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: dims (%d, %d) are out of range for a tensor of %d dimensions; use dims in [-%d, %d)",
                           call, dim0, dim1, n, n, n);
  int perm[KILN_MAX_DIMS];
  for (int i = 0; i < n; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return kiln_tensor_permute(tensor, perm, out);
}

kiln_status_t kiln_tensor_contiguous(kiln_tensor_t *tensor, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_contiguous";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!out) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: out is NULL; pass the address of a kiln_tensor_t *", call);
  if (kiln_tensor_is_contiguous(tensor)) {
    *out = kiln_tensor_retain(tensor);
    return KILN_OK;
  }
  status = copy_local(tensor, out);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}
