/* runtime/tensor.c: the tensor object: its struct, accessors, allocation, the views that never copy (permute, transpose, slice) and copies into a view. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

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

void kiln__contiguous_strides(int ndim, const int64_t *shape, int64_t *out_strides) {
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
  kiln__contiguous_strides(ndim, shape, tensor->strides);
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

kiln_status_t kiln__tensor_view_new(const kiln_tensor_t *tensor, int ndim, const int64_t *shape, const int64_t *strides,
                                    size_t offset, kiln_tensor_t **out) {
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

static kiln_status_t tensor_check(const char *call, const char *name, const kiln_tensor_t *tensor) {
  if (!tensor)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL; pass a tensor from a kiln_tensor_* call", call, name);
  return KILN_OK;
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
  return kiln__tensor_view_new(tensor, tensor->ndim, shape, strides, tensor->offset, out);
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


kiln_status_t kiln_tensor_slice(kiln_tensor_t *tensor, int dim, int64_t start, int64_t stop, int64_t step,
                                kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_slice";
  kiln_status_t status = tensor_check(call, "tensor", tensor);
  if (status != KILN_OK) return status;
  if (!out) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: out is NULL; pass the address of a kiln_tensor_t *", call);
  const int n = tensor->ndim;
  const int d = dim < 0 ? dim + n : dim;
  if (d < 0 || d >= n)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: dim %d is out of range for a tensor of %d dimensions; use a dim in "
                           "[-%d, %d)", call, dim, n, n, n);
  if (step < 1)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: step %lld; kiln's views take steps >= 1 (no negative strides): slice forward and "
                           "reverse the result's order yourself", call, (long long)step);
  const int64_t size = tensor->shape[d];
  if (start < 0) start += size;
  if (stop < 0) stop += size;
  start = start < 0 ? 0 : start > size ? size : start;
  stop = stop < 0 ? 0 : stop > size ? size : stop;
  const int64_t count = stop > start ? (stop - start - 1) / step + 1 : 0;
  int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    shape[i] = tensor->shape[i];
    strides[i] = tensor->strides[i];
  }
  shape[d] = count;
  strides[d] = tensor->strides[d] * step;
  const size_t offset = tensor->offset + (count > 0 ? (size_t)(start * tensor->strides[d]) : 0);
  return kiln__tensor_view_new(tensor, n, shape, strides, offset, out);
}

kiln_status_t kiln_tensor_copy_into(kiln_tensor_t *dst, const kiln_tensor_t *src) {
  static const char call[] = "kiln_tensor_copy_into";
  kiln_status_t status = tensor_check(call, "dst", dst);
  if (status == KILN_OK) status = tensor_check(call, "src", src);
  if (status != KILN_OK) return status;
  kiln_device_t *device = dst->buffer->device;
  if (src->buffer->device != device)
    return kiln__set_error(KILN_DEVICE_MISMATCH,
                           "%s: src lives on %s and dst on %s; move src first (kiln_tensor_to(src, dst's device))", call,
                           kiln_device_selector(src->buffer->device), kiln_device_selector(device));
  if (kiln_tensor_numel(dst) == 0) return KILN_OK;
  /* Bring src to dst's dtype and shape, contiguous, in memory of its own. */
  kiln_tensor_t *cur = kiln_tensor_retain((kiln_tensor_t *)src), *next = NULL;
  bool own = false; /* cur is a new tensor of this call's */
  if (cur->dtype != dst->dtype) {
    status = kiln_tensor_cast(cur, dst->dtype, &next);
    own = true;
  }
  bool same_shape = cur->ndim == dst->ndim;
  for (int i = 0; same_shape && i < dst->ndim; i++) same_shape = cur->shape[i] == dst->shape[i];
  if (status == KILN_OK && !same_shape) {
    kiln_tensor_t *from = next ? next : cur;
    kiln_tensor_t *b = NULL;
    status = kiln_tensor_broadcast_to(from, dst->ndim, dst->shape, &b);
    if (next) kiln_tensor_release(next);
    next = status == KILN_OK ? b : NULL;
    own = true;
  }
  if (next) {
    kiln_tensor_release(cur);
    cur = next;
    next = NULL;
  }
  if (status == KILN_OK && (!kiln_tensor_is_contiguous(cur) || (!own && cur->buffer == dst->buffer))) {
    /* Strided, or perhaps overlapping dst: read it all before writing. */
    status = kiln_tensor_copy(cur, device, &next);
    kiln_tensor_release(cur);
    cur = next;
  }
  if (status != KILN_OK) {
    kiln_tensor_release(cur);
    return kiln__wrap_error(status, "%s", call);
  }
  /* dst's innermost dims that are dense form runs of `run` elements. */
  const int n = dst->ndim;
  int k = n;
  int64_t run = 1;
  for (int i = n - 1; i >= 0; i--) {
    if (dst->shape[i] != 1 && dst->strides[i] != run) break;
    run *= dst->shape[i];
    k = i;
  }
  const size_t item = kiln_dtype_size(dst->dtype);
  kiln_queue_t *queue = kiln_device_current_queue(device);
  const int64_t runs = kiln_tensor_numel(dst) / run;
  int64_t idx[KILN_MAX_DIMS] = {0};
  for (int64_t r = 0; r < runs && status == KILN_OK; r++) {
    int64_t at = (int64_t)dst->offset;
    for (int i = 0; i < k; i++) at += idx[i] * dst->strides[i];
    status = kiln_buffer_copy(queue, cur->buffer, kiln_tensor_offset_bytes(cur) + (size_t)(r * run) * item, dst->buffer,
                              (size_t)at * item, (size_t)run * item, 0, NULL, NULL);
    for (int i = k - 1; i >= 0; i--) {
      if (++idx[i] < dst->shape[i]) break;
      idx[i] = 0;
    }
  }
  kiln_tensor_release(cur);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}
