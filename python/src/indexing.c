/* python/src/indexing.c: basic indexing (ints, slices with steps, None, ...) as views over the tensor's memory, and assignment through them. */
#include "kilnpy.h"

#include <math.h>

static PyObject *kp_advanced_error(PyObject *item) {
  return PyErr_Format(PyExc_TypeError,
                      "indexing with %.100s is advanced indexing (integer or boolean tensors, lists, arrays: a gather "
                      "or a mask), which kiln does not support yet; basic indexing works: ints, slices, None and ...",
                      Py_TYPE(item)->tp_name);
}

/* The view `key` selects: slices (kiln_tensor_slice) then one reshape that
 * drops the int dims and inserts the None ones; no copy. New reference to a
 * kiln tensor in *out; 0 or -1 with an exception. */
static int kp_index_view(kiln_tensor_t *t, PyObject *key, kiln_tensor_t **out) {
  PyObject *items = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
  if (!items) return -1;
  const Py_ssize_t count = PyTuple_GET_SIZE(items);
  const int n = kiln_tensor_ndim(t);
  int consumed = 0, ellipses = 0;
  for (Py_ssize_t i = 0; i < count; i++) {
    PyObject *it = PyTuple_GET_ITEM(items, i);
    if (it == Py_Ellipsis) {
      ellipses++;
    } else if (it == Py_None) {
    } else if (PySlice_Check(it)) {
      consumed++;
    } else if (KP_IS_TENSOR(it)) {
      kiln_tensor_t *ix = KP_TENSOR(it);
      kiln_dtype_class_t c = kiln_dtype_class(kiln_tensor_dtype(ix));
      if (kiln_tensor_ndim(ix) != 0 || c == KILN_DTYPE_CLASS_FLOAT || c == KILN_DTYPE_CLASS_BOOL) {
        Py_DECREF(items);
        kp_advanced_error(it);
        return -1;
      }
      consumed++;
    } else if (PyBool_Check(it) || !PyIndex_Check(it)) {
      Py_DECREF(items);
      if (PyList_Check(it) || PyBool_Check(it) || PyObject_HasAttrString(it, "__array_interface__") ||
          PyObject_HasAttrString(it, "__dlpack__"))
        kp_advanced_error(it);
      else
        PyErr_Format(PyExc_TypeError, "a tensor index is an int, a slice, None or ..., not %.100s",
                     Py_TYPE(it)->tp_name);
      return -1;
    } else {
      /* NumPy arrays have __index__ too: one of any dims is advanced indexing. */
      if (!PyLong_Check(it)) {
        PyObject *nd = PyObject_GetAttrString(it, "ndim");
        long dims = nd ? PyLong_AsLong(nd) : 0;
        Py_XDECREF(nd);
        PyErr_Clear();
        if (dims > 0) {
          Py_DECREF(items);
          kp_advanced_error(it);
          return -1;
        }
      }
      consumed++;
    }
  }
  if (ellipses > 1) {
    Py_DECREF(items);
    PyErr_SetString(PyExc_IndexError, "an index can only have a single ellipsis ('...')");
    return -1;
  }
  if (consumed > n) {
    Py_DECREF(items);
    PyErr_Format(PyExc_IndexError, "too many indices for a tensor of %d dimensions: %d were given", n, consumed);
    return -1;
  }
  kiln_tensor_t *cur = kiln_tensor_retain(t);
  int64_t shape[KILN_MAX_DIMS];
  int out_n = 0, d = 0; /* d: the dim of t (and of cur) the next item applies to */
  kiln_status_t status = KILN_OK;
  for (Py_ssize_t i = 0; i < count && status == KILN_OK; i++) {
    PyObject *it = PyTuple_GET_ITEM(items, i);
    if (it == Py_Ellipsis) {
      for (int k = 0; k < n - consumed; k++, d++) {
        if (out_n >= KILN_MAX_DIMS) goto too_many;
        shape[out_n++] = kiln_tensor_shape(cur)[d];
      }
      continue;
    }
    if (it == Py_None) {
      if (out_n >= KILN_MAX_DIMS) goto too_many;
      shape[out_n++] = 1;
      continue;
    }
    const int64_t size = kiln_tensor_shape(cur)[d];
    kiln_tensor_t *next = NULL;
    if (PySlice_Check(it)) {
      Py_ssize_t start, stop, step;
      if (PySlice_Unpack(it, &start, &stop, &step) < 0) goto fail;
      if (step < 0) {
        PyErr_Format(PyExc_ValueError, "slice step %zd: kiln's views, like PyTorch's, take steps >= 1 (no negative "
                     "strides); reverse with a positive step and a copy you order yourself", step);
        goto fail;
      }
      Py_ssize_t len = PySlice_AdjustIndices((Py_ssize_t)size, &start, &stop, step);
      status = kiln_tensor_slice(cur, d, start, len > 0 ? stop : start, step, &next);
      if (status == KILN_OK) {
        if (out_n >= KILN_MAX_DIMS) {
          kiln_tensor_release(next);
          goto too_many;
        }
        shape[out_n++] = kiln_tensor_shape(next)[d];
      }
    } else {
      long long v;
      PyObject *index = PyNumber_Index(it);
      if (!index) goto fail;
      v = PyLong_AsLongLong(index);
      Py_DECREF(index);
      if (v == -1 && PyErr_Occurred()) goto fail;
      if (v < -size || v >= size) {
        PyErr_Format(PyExc_IndexError, "index %lld is out of range for dim %d of size %lld", v, d, (long long)size);
        goto fail;
      }
      if (v < 0) v += size;
      status = kiln_tensor_slice(cur, d, v, v + 1, 1, &next);
    }
    if (status == KILN_OK) {
      kiln_tensor_release(cur);
      cur = next;
    }
    d++;
  }
  if (status != KILN_OK) {
    kp_raise(status);
    goto fail;
  }
  for (; d < n; d++) {
    if (out_n >= KILN_MAX_DIMS) goto too_many;
    shape[out_n++] = kiln_tensor_shape(cur)[d];
  }
  Py_DECREF(items);
  /* Size-1 dims only come and go here, which any strides allow: a view. */
  status = kiln_tensor_reshape(cur, out_n, shape, out);
  kiln_tensor_release(cur);
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  return 0;
too_many:
  kp_raise_msg(KILN_INVALID_ARGUMENT, "the index makes more than %d dimensions, kiln's most", KILN_MAX_DIMS);
fail:
  kiln_tensor_release(cur);
  Py_DECREF(items);
  return -1;
}

static PyObject *kp_tensor_getitem(PyObject *self, PyObject *key) {
  kiln_tensor_t *out = NULL;
  if (kp_index_view(KP_TENSOR(self), key, &out) < 0) return NULL;
  return kp_tensor_wrap(out);
}

/* x[key] = value: a copy into the view key selects (kiln_tensor_copy_into),
 * value broadcast to it and converted to x's dtype. */
static int kp_tensor_setitem(PyObject *self, PyObject *key, PyObject *value) {
  if (!value) {
    PyErr_SetString(PyExc_TypeError, "a tensor's elements cannot be deleted");
    return -1;
  }
  kiln_tensor_t *view = NULL, *src = NULL;
  if (kp_index_view(KP_TENSOR(self), key, &view) < 0) return -1;
  kiln_status_t status = KILN_OK;
  double v;
  int r;
  if (KP_IS_TENSOR(value)) {
    src = kiln_tensor_retain(KP_TENSOR(value));
  } else if ((r = kp_scalar(value, &v)) != 0) {
    if (r < 0) goto fail;
    kiln_dtype_t dtype = kiln_tensor_dtype(view);
    if (kiln_dtype_class(dtype) != KILN_DTYPE_CLASS_FLOAT && dtype != KILN_BOOL && (v != floor(v) || !isfinite(v))) {
      char text[32];
      kp_raise_msg(KILN_DTYPE_MISMATCH, "writing %s into a %s tensor would change it; convert the tensor first "
                   "(x = x.float()) or write a whole number", kp_double_text(v, text), kiln_dtype_long_name(dtype));
      goto fail;
    }
    if (kp_value_fits(v, dtype, "tensor assignment", "the value") < 0) goto fail;
    status = kiln_tensor_full(kiln_tensor_device(view), kiln_dtype_class(dtype) == KILN_DTYPE_CLASS_FLOAT ? dtype
                              : KILN_F64, 0, NULL, v, &src);
  } else {
    PyObject *t = kp_tensor_from_object(value, kiln_tensor_device(view), NULL);
    if (!t) goto fail;
    src = kiln_tensor_retain(KP_TENSOR(t));
    Py_DECREF(t);
  }
  if (status == KILN_OK) status = kiln_tensor_copy_into(view, src);
  kiln_tensor_release(src);
  kiln_tensor_release(view);
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  return 0;
fail:
  kiln_tensor_release(view);
  return -1;
}

PyMappingMethods kp_tensor_mapping = {
    .mp_length = NULL,
    .mp_subscript = kp_tensor_getitem,
    .mp_ass_subscript = kp_tensor_setitem,
};
