/* runtime/ops_tensor.c: the tensor calls that run an op or move data: creation (empty, zeros, full, arange, from_host, random), reads, copies between devices, reshape and contiguous. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype_convert.h"
#include "runtime/internal.h"

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
  if (kiln_dtype_size(dtype) == 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: dtype %d is not a kiln_dtype_t; use KILN_F32 ... KILN_BOOL", call,
                           (int)dtype);
  return kiln__shape_check(call, ndim, shape, dtype, NULL, NULL);
}

/* ---- creation --------------------------------------------------------------------- */

kiln_status_t kiln_tensor_empty(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                                kiln_tensor_t **out) {
  kiln_status_t status = create_check("kiln_tensor_empty", device, dtype, ndim, shape, out);
  if (status != KILN_OK) return status;
  /* Nothing orders the caller's first use after a queue: idle memory only. */
  status = kiln__tensor_alloc(device, NULL, dtype, ndim, shape, out);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "kiln_tensor_empty");
}

static kiln_status_t tensor_fill(const char *call, kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                      const int64_t *shape, double value, kiln_tensor_t **out) {
  kiln_status_t status = create_check(call, device, dtype, ndim, shape, out);
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_FILL;
  op.u.fill.value = kiln__scalar(value, dtype);
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
  if (dtype == KILN_BOOL)
    return kiln__set_error(KILN_DTYPE_MISMATCH, "%s: arange of bool is not a range; use a numeric dtype (u8, i32, f32, ...) "
                           "and kiln_tensor_cast the result to bool if needed", call);
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

static kiln_status_t tensor_random(const char *call, kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                   const int64_t *shape, uint64_t seed, bool normal, float a, float b,
                                   kiln_tensor_t **out) {
  kiln_status_t status = create_check(call, device, dtype, ndim, shape, out);
  if (status != KILN_OK) return status;
  if ((unsigned)dtype >= KILN_DTYPE_COUNT_ || !((KILN__DT_FLOAT >> (unsigned)dtype) & 1u)) {
    char takes[96];
    kiln__dtypes_text(KILN__DT_FLOAT, takes, sizeof takes);
    return kiln__set_error(KILN_DTYPE_MISMATCH,
                           "%s: %s does not support dtype %s; random tensors are %s: draw f32 and cast it to %s "
                           "(kiln_tensor_cast)",
                           call, normal ? "normal" : "uniform", kiln_dtype_name(dtype), takes,
                           kiln_dtype_name(dtype));
  }
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
  return create_op(call, device, &op, dtype, ndim, shape, out);
}

kiln_status_t kiln_tensor_uniform(kiln_device_t *device, int ndim, const int64_t *shape, uint64_t seed, float low,
                                  float high, kiln_tensor_t **out) {
  return tensor_random("kiln_tensor_uniform", device, KILN_F32, ndim, shape, seed, false, low, high, out);
}

kiln_status_t kiln_tensor_normal(kiln_device_t *device, int ndim, const int64_t *shape, uint64_t seed, float mean,
                                 float stddev, kiln_tensor_t **out) {
  return tensor_random("kiln_tensor_normal", device, KILN_F32, ndim, shape, seed, true, mean, stddev, out);
}

kiln_status_t kiln_tensor_uniform_dtype(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                                        uint64_t seed, float low, float high, kiln_tensor_t **out) {
  return tensor_random("kiln_tensor_uniform_dtype", device, dtype, ndim, shape, seed, false, low, high, out);
}

kiln_status_t kiln_tensor_normal_dtype(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                                       uint64_t seed, float mean, float stddev, kiln_tensor_t **out) {
  return tensor_random("kiln_tensor_normal_dtype", device, dtype, ndim, shape, seed, true, mean, stddev, out);
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
  union { uint8_t bytes[8]; kiln_f32 f32; kiln_i32 i32; kiln_u16 u16; kiln_f64 f64; kiln_i64 i64; kiln_i8 i8; kiln_u8 u8; kiln_i16 i16; } value;
  status = kiln_tensor_read(tensor, &value, sizeof value);
  if (status != KILN_OK) return status;
  switch (tensor->dtype) {
  case KILN_F32: *out_value = (double)value.f32; break;
  case KILN_I32: *out_value = (double)value.i32; break;
  case KILN_F16: *out_value = kiln_dc_load_f16(value.u16); break;
  case KILN_BF16: *out_value = kiln_dc_load_bf16(value.u16); break;
  case KILN_F64: *out_value = value.f64; break;
  case KILN_I64: *out_value = (double)value.i64; break;
  case KILN_I8: *out_value = (double)value.i8; break;
  case KILN_U8: *out_value = (double)value.u8; break;
  case KILN_I16: *out_value = (double)value.i16; break;
  case KILN_BOOL: *out_value = value.u8 != 0; break;
  default: *out_value = 0.0; break;
  }
  _Static_assert(KILN_DTYPE_COUNT_ == 10, "kiln_tensor_item reads every dtype");
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
    kiln__contiguous_strides(ndim, shape, out_strides);
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
    return kiln__tensor_view_new(tensor, ndim, resolved, strides, tensor->offset, out);
  kiln_tensor_t *copy = NULL;
  status = copy_local(tensor, &copy);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  kiln__contiguous_strides(ndim, resolved, strides);
  status = kiln__tensor_view_new(copy, ndim, resolved, strides, copy->offset, out);
  kiln_tensor_release(copy);
  return status;
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
