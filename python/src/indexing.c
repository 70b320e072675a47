/* python/src/indexing.c: basic indexing (ints, slices with steps, None, ...) as views over the tensor's memory, advanced indexing (integer tensors, lists and arrays, boolean masks) through index_select and index_copy, and assignment through both. */
#include "kilnpy.h"

#include <math.h>

static PyObject *kp_advanced_error(PyObject *item) {
  return PyErr_Format(PyExc_TypeError,
                      "indexing with %.100s mixes advanced indexing (integer or boolean tensors, lists, arrays) with "
                      "other indices in a way kiln does not take yet: the advanced indices come first, one per "
                      "leading dimension (x[idx], x[mask], x[rows, cols]), followed by ':' or '...' only; for another "
                      "dimension use x.index_select(dim, idx)",
                      Py_TYPE(item)->tp_name);
}

/* Whether `it` is an advanced index: a kiln tensor of one or more dims or
 * of bool dtype, a list, or an array of one or more dims. */
static bool kp_is_advanced(PyObject *it) {
  if (KP_IS_TENSOR(it)) {
    kiln_tensor_t *t = KP_TENSOR(it);
    return kiln_tensor_ndim(t) != 0 || kiln_dtype_class(kiln_tensor_dtype(t)) == KILN_DTYPE_CLASS_BOOL;
  }
  if (PyList_Check(it)) return true;
  if (PyLong_Check(it) || PyBool_Check(it) || it == Py_None || it == Py_Ellipsis || PySlice_Check(it)) return false;
  if (PyObject_HasAttrString(it, "__array_interface__") || PyObject_HasAttrString(it, "__dlpack__")) {
    PyObject *nd = PyObject_GetAttrString(it, "ndim");
    long dims = nd ? PyLong_AsLong(nd) : 0;
    Py_XDECREF(nd);
    PyErr_Clear();
    return dims > 0;
  }
  return false;
}

/* What an advanced key selects: x seen as [rows, rest...] (`base`, sharing
 * x's memory when x is contiguous), the 1-D row index on x's device, and the
 * shape of the result (the index's shape, then rest). */
typedef struct kp_adv_t {
  kiln_tensor_t *base, *index;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
} kp_adv_t;

static void kp_adv_free(kp_adv_t *a) {
  kiln_tensor_release(a->base);
  kiln_tensor_release(a->index);
}

/* `item` as a tensor on `device` (a new reference to a kiln tensor). */
static kiln_tensor_t *kp_index_tensor(PyObject *item, kiln_device_t *device) {
  if (KP_IS_TENSOR(item)) return kiln_tensor_retain(KP_TENSOR(item));
  PyObject *t = kp_tensor_from_object(item, device, NULL);
  if (!t) return NULL;
  kiln_tensor_t *r = kiln_tensor_retain(KP_TENSOR(t));
  Py_DECREF(t);
  return r;
}

/* x's first `k` dims folded into one: [prod, rest...]. */
static kiln_status_t kp_fold(kiln_tensor_t *x, int k, kiln_tensor_t **out) {
  const int n = kiln_tensor_ndim(x);
  int64_t shape[KILN_MAX_DIMS], rows = 1;
  for (int d = 0; d < k; d++) rows *= kiln_tensor_shape(x)[d];
  shape[0] = rows;
  for (int d = k; d < n; d++) shape[1 + d - k] = kiln_tensor_shape(x)[d];
  return kiln_tensor_reshape(x, 1 + n - k, shape, out);
}

/* The plan of an advanced key, or 0 when the key is basic (nothing set),
 * -1 with an exception. */
static int kp_advanced_plan(kiln_tensor_t *x, PyObject *key, kp_adv_t *a) {
  memset(a, 0, sizeof *a);
  PyObject *items = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
  if (!items) return -1;
  const Py_ssize_t count = PyTuple_GET_SIZE(items);
  int k = 0, any = 0;
  while (k < count && kp_is_advanced(PyTuple_GET_ITEM(items, k))) k++;
  for (Py_ssize_t i = 0; i < count; i++) any |= kp_is_advanced(PyTuple_GET_ITEM(items, i));
  if (!any) {
    Py_DECREF(items);
    return 0;
  }
  /* Advanced indices first, then ':' or a last '...' only. */
  for (Py_ssize_t i = k; i < count; i++) {
    PyObject *it = PyTuple_GET_ITEM(items, i);
    const bool full = PySlice_Check(it) && ((PySliceObject *)it)->start == Py_None &&
                      ((PySliceObject *)it)->stop == Py_None && ((PySliceObject *)it)->step == Py_None;
    if (!(full || (it == Py_Ellipsis && i == count - 1))) {
      kp_advanced_error(k == 0 ? PyTuple_GET_ITEM(items, 0) : it);
      Py_DECREF(items);
      return -1;
    }
  }
  const int n = kiln_tensor_ndim(x);
  kiln_device_t *device = kiln_tensor_device(x);
  kiln_status_t status = KILN_OK;
  kiln_tensor_t *t0 = kp_index_tensor(PyTuple_GET_ITEM(items, 0), device);
  if (!t0) goto fail;
  const kiln_dtype_class_t c0 = kiln_dtype_class(kiln_tensor_dtype(t0));
  if (c0 == KILN_DTYPE_CLASS_FLOAT) {
    kiln_tensor_release(t0);
    PyErr_Format(PyExc_IndexError, "tensors used as indices must be integer or bool, not %s; convert with .long()",
                 kiln_dtype_long_name(kiln_tensor_dtype(t0)));
    goto fail;
  }
  if (k == 1 && c0 == KILN_DTYPE_CLASS_BOOL) {
    /* A mask over x's first dims: the positions where it is true, found on
     * the host (the count sizes the result, as in PyTorch). */
    const int md = kiln_tensor_ndim(t0);
    bool match = md <= n && md > 0;
    for (int d = 0; match && d < md; d++) match = kiln_tensor_shape(t0)[d] == kiln_tensor_shape(x)[d];
    if (!match) {
      PyErr_Format(PyExc_IndexError, "a boolean mask of %d dims must have the shape of the tensor's first %d dims",
                   md, md);
      kiln_tensor_release(t0);
      goto fail;
    }
    const int64_t total = kiln_tensor_numel(t0);
    uint8_t *bits = malloc((size_t)(total ? total : 1));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    int64_t found = 0;
    if (!bits || !pos) {
      status = KILN_OUT_OF_MEMORY;
    } else {
      kiln_tensor_t *dense = NULL;
      status = kiln_tensor_contiguous(t0, &dense);
      Py_BEGIN_ALLOW_THREADS
      if (status == KILN_OK) status = kiln_tensor_read(dense, bits, (size_t)total);
      Py_END_ALLOW_THREADS
      kiln_tensor_release(dense);
      for (int64_t i = 0; status == KILN_OK && i < total; i++)
        if (bits[i]) pos[found++] = i;
      if (status == KILN_OK) status = kiln_tensor_from_host(device, KILN_I64, 1, &found, pos, &a->index);
    }
    free(bits);
    free(pos);
    if (status == KILN_OK) status = kp_fold(x, md, &a->base);
    a->ndim = 1 + n - md;
    a->shape[0] = found;
    for (int d = md; d < n; d++) a->shape[1 + d - md] = kiln_tensor_shape(x)[d];
    kiln_tensor_release(t0);
  } else if (k == 1) {
    /* One integer index: kept on the device; index_select wraps negative
     * entries and reports those out of range. */
    const int id = kiln_tensor_ndim(t0);
    if (id + n - 1 > KILN_MAX_DIMS) {
      kiln_tensor_release(t0);
      kp_raise_msg(KILN_INVALID_ARGUMENT, "the index makes more than %d dimensions, kiln's most", KILN_MAX_DIMS);
      goto fail;
    }
    const int64_t flat = kiln_tensor_numel(t0);
    status = kiln_tensor_reshape(t0, 1, &flat, &a->index);
    a->base = kiln_tensor_retain(x);
    a->ndim = id + n - 1;
    for (int d = 0; d < id; d++) a->shape[d] = kiln_tensor_shape(t0)[d];
    for (int d = 1; d < n; d++) a->shape[id + d - 1] = kiln_tensor_shape(x)[d];
    kiln_tensor_release(t0);
  } else {
    /* Several integer indices, broadcast together, one per leading dim:
     * checked and combined into one row index on the host. */
    kiln_tensor_release(t0);
    if (k > n) {
      PyErr_Format(PyExc_IndexError, "too many indices for a tensor of %d dimensions: %d were given", n, k);
      goto fail;
    }
    kiln_tensor_t *ts[KILN_MAX_DIMS] = {NULL};
    int bn = 0;
    int64_t bshape[KILN_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      ts[i] = kp_index_tensor(PyTuple_GET_ITEM(items, i), device);
      if (!ts[i] || kiln_dtype_class(kiln_tensor_dtype(ts[i])) == KILN_DTYPE_CLASS_FLOAT ||
          kiln_dtype_class(kiln_tensor_dtype(ts[i])) == KILN_DTYPE_CLASS_BOOL) {
        if (ts[i]) PyErr_SetString(PyExc_IndexError, "several advanced indices must all be integer tensors, lists or "
                                   "arrays (a boolean mask goes alone: x[mask])");
        for (int j = 0; j <= i; j++) kiln_tensor_release(ts[j]);
        goto fail;
      }
      /* NumPy's broadcast of the shapes. */
      const int tn = kiln_tensor_ndim(ts[i]);
      const int64_t *sh = kiln_tensor_shape(ts[i]);
      const int rn = tn > bn ? tn : bn;
      int64_t merged[KILN_MAX_DIMS];
      bool ok = true;
      for (int d = 0; d < rn; d++) {
        const int64_t p = d - (rn - bn) >= 0 ? bshape[d - (rn - bn)] : 1, q = d - (rn - tn) >= 0 ? sh[d - (rn - tn)] : 1;
        ok = ok && (p == q || p == 1 || q == 1);
        merged[d] = p == 1 ? q : p;
      }
      if (!ok) {
        PyErr_Format(PyExc_IndexError, "the advanced indices' shapes do not broadcast together (index %d)", i);
        for (int j = 0; j <= i; j++) kiln_tensor_release(ts[j]);
        goto fail;
      }
      bn = rn;
      memcpy(bshape, merged, sizeof(int64_t) * (size_t)rn);
    }
    int64_t cnt = 1;
    for (int d = 0; d < bn; d++) cnt *= bshape[d];
    int64_t *rows = calloc((size_t)(cnt ? cnt : 1), sizeof(int64_t)), *vals = malloc(sizeof(int64_t) * (size_t)(cnt ? cnt : 1));
    if (!rows || !vals) status = KILN_OUT_OF_MEMORY;
    for (int i = 0; i < k && status == KILN_OK && !PyErr_Occurred(); i++) {
      kiln_tensor_t *b = NULL, *w = NULL;
      status = kiln_tensor_broadcast_to(ts[i], bn, bshape, &b);
      if (status == KILN_OK) status = kiln_tensor_cast(b, KILN_I64, &w);
      Py_BEGIN_ALLOW_THREADS
      if (status == KILN_OK) status = kiln_tensor_read(w, vals, sizeof(int64_t) * (size_t)cnt);
      Py_END_ALLOW_THREADS
      kiln_tensor_release(b);
      kiln_tensor_release(w);
      const int64_t size = kiln_tensor_shape(x)[i];
      for (int64_t e = 0; status == KILN_OK && e < cnt; e++) {
        const int64_t v = vals[e];
        if (v < -size || v >= size) {
          PyErr_Format(PyExc_IndexError, "index %lld is out of range for dim %d of size %lld", (long long)v, i,
                       (long long)size);
          break;
        }
        rows[e] = rows[e] * size + (v < 0 ? v + size : v);
      }
    }
    for (int i = 0; i < k; i++) kiln_tensor_release(ts[i]);
    if (status == KILN_OK && !PyErr_Occurred()) status = kiln_tensor_from_host(device, KILN_I64, 1, &cnt, rows, &a->index);
    free(rows);
    free(vals);
    if (PyErr_Occurred()) goto fail;
    if (status == KILN_OK) status = kp_fold(x, k, &a->base);
    a->ndim = bn + n - k;
    if (a->ndim > KILN_MAX_DIMS) {
      kp_raise_msg(KILN_INVALID_ARGUMENT, "the index makes more than %d dimensions, kiln's most", KILN_MAX_DIMS);
      goto fail;
    }
    memcpy(a->shape, bshape, sizeof(int64_t) * (size_t)bn);
    for (int d = k; d < n; d++) a->shape[bn + d - k] = kiln_tensor_shape(x)[d];
  }
  Py_DECREF(items);
  if (status != KILN_OK) {
    kp_raise(status);
    kp_adv_free(a);
    return -1;
  }
  return 1;
fail:
  Py_DECREF(items);
  kp_adv_free(a);
  return -1;
}

static int kp_tensor_setitem(PyObject *self, PyObject *key, PyObject *value);

/* x[key] for an advanced key: index_select, then the result's shape.
 * Recorded when x requires grad and one index selects along its first axis
 * (x[idx], an embedding lookup); the other forms are refused then. */
static PyObject *kp_advanced_get(PyObject *self, kp_adv_t *a) {
  kiln_tensor_t *rows = NULL, *out = NULL;
  kiln_status_t status;
  int rec = kp_ag_wanted(self, NULL);
  if (rec && (rec < 0 || a->base != KP_TENSOR(self))) {
    if (rec > 0) kp_ag_refuse(self, "x[rows, cols] or x[mask]");
    kp_adv_free(a);
    return NULL;
  }
  if (rec) {
    status = KP_AG(kiln_nn_tape_index_select(kp_ag_tape(), kp_ag_in(self), 0, a->index, &rows));
    if (status == KILN_OK) status = KP_AG(kiln_nn_tape_reshape(kp_ag_tape(), rows, a->ndim, a->shape, &out));
  } else {
    status = kiln_tensor_index_select(a->base, 0, a->index, &rows);
    if (status == KILN_OK) status = kiln_tensor_reshape(rows, a->ndim, a->shape, &out);
  }
  kiln_tensor_release(rows);
  kp_adv_free(a);
  return kp_ag_result(rec, status, &out);
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
      if (!PyBool_Check(it) && (PyList_Check(it) || PyObject_HasAttrString(it, "__array_interface__") ||
                                PyObject_HasAttrString(it, "__dlpack__")))
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
  kp_adv_t adv;
  const int r = kp_advanced_plan(KP_TENSOR(self), key, &adv);
  if (r < 0) return NULL;
  if (r > 0) return kp_advanced_get(self, &adv);
  if (kp_ag_refuse(self, "basic indexing (x[i], x[a:b], x[..., None])") < 0) return NULL;
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
  kp_adv_t adv;
  if (kp_ag_refuse(self, "assignment x[...] = v") < 0 || kp_ag_refuse(value, "assignment x[...] = v") < 0) return -1;
  const int adv_r = kp_advanced_plan(KP_TENSOR(self), key, &adv);
  if (adv_r < 0) return -1;
  if (adv_r > 0) {
    /* Through index_copy into x's own memory: x must be contiguous. */
    if (!kiln_tensor_is_contiguous(KP_TENSOR(self))) {
      kp_adv_free(&adv);
      kp_raise_msg(KILN_INVALID_ARGUMENT, "assignment through advanced indexing writes x in place and needs a "
                   "contiguous x; this one is a strided view (x = x.contiguous() first, or index the tensor it views)");
      return -1;
    }
    /* The rows selected, as a view of their shape to assign into. */
    int64_t rshape[KILN_MAX_DIMS];
    rshape[0] = kiln_tensor_numel(adv.index);
    const int bn = kiln_tensor_ndim(adv.base);
    for (int d = 1; d < bn; d++) rshape[d] = kiln_tensor_shape(adv.base)[d];
    kiln_status_t st = kiln_tensor_empty(kiln_tensor_device(adv.base), kiln_tensor_dtype(adv.base), bn, rshape, &view);
    kiln_tensor_t *shaped = NULL;
    if (st == KILN_OK) st = kiln_tensor_reshape(view, adv.ndim, adv.shape, &shaped);
    if (st != KILN_OK) {
      kiln_tensor_release(view);
      kp_adv_free(&adv);
      kp_raise(st);
      return -1;
    }
    /* value written into the rows' shape as a basic assignment would (a
     * copy, broadcast and converted), then stored row by row. */
    PyObject *wrapped = kp_tensor_wrap(kiln_tensor_retain(shaped));
    kiln_tensor_release(shaped);
    const int w = wrapped ? kp_tensor_setitem(wrapped, Py_Ellipsis, value) : -1;
    Py_XDECREF(wrapped);
    if (w == 0) st = kiln_tensor_index_copy(adv.base, 0, adv.index, view);
    kiln_tensor_release(view);
    kp_adv_free(&adv);
    if (w < 0) return -1;
    if (st != KILN_OK) {
      kp_raise(st);
      return -1;
    }
    return 0;
  }
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

/* ---- index_select, index_add_, index_copy_, index_put_ ------------------------------------------- */

/* The index argument as a tensor on x's device (tensors, lists, arrays). */
static kiln_tensor_t *kp_index_arg(PyObject *index, kiln_tensor_t *x) {
  kiln_tensor_t *t = kp_index_tensor(index, kiln_tensor_device(x));
  if (t && kiln_dtype_class(kiln_tensor_dtype(t)) != KILN_DTYPE_CLASS_INT &&
      kiln_dtype_class(kiln_tensor_dtype(t)) != KILN_DTYPE_CLASS_UINT) {
    PyErr_Format(PyExc_IndexError, "index must be an integer tensor, list or array, not %s",
                 kiln_dtype_long_name(kiln_tensor_dtype(t)));
    kiln_tensor_release(t);
    return NULL;
  }
  /* index_select takes i32 and i64: smaller integers widen. */
  if (t && kiln_tensor_dtype(t) != KILN_I32 && kiln_tensor_dtype(t) != KILN_I64) {
    kiln_tensor_t *w = NULL;
    const kiln_status_t st = kiln_tensor_cast(t, KILN_I64, &w);
    kiln_tensor_release(t);
    if (st != KILN_OK) {
      kp_raise(st);
      return NULL;
    }
    t = w;
  }
  return t;
}

static PyObject *kp_m_index_select(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"dim", "index", NULL};
  int dim;
  PyObject *index;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO:index_select", names, &dim, &index)) return NULL;
  kiln_tensor_t *t = kp_index_arg(index, KP_TENSOR(self)), *flat = NULL, *out = NULL;
  if (!t) return NULL;
  const int64_t n = kiln_tensor_numel(t);
  int rec = kp_ag_wanted(self, NULL);
  kiln_status_t st = rec < 0 ? KILN_OK : kiln_tensor_reshape(t, 1, &n, &flat);
  if (rec < 0) {
    kiln_tensor_release(t);
    return NULL;
  }
  if (st == KILN_OK)
    st = rec ? KP_AG(kiln_nn_tape_index_select(kp_ag_tape(), kp_ag_in(self), dim, flat, &out))
             : kiln_tensor_index_select(KP_TENSOR(self), dim, flat, &out);
  kiln_tensor_release(t);
  kiln_tensor_release(flat);
  return kp_ag_result(rec, st, &out);
}

/* source as a tensor of x's dtype on x's device. */
static kiln_tensor_t *kp_source_arg(PyObject *source, kiln_tensor_t *x) {
  kiln_tensor_t *s = kp_index_tensor(source, kiln_tensor_device(x));
  if (s && kiln_tensor_dtype(s) != kiln_tensor_dtype(x)) {
    kiln_tensor_t *c = NULL;
    const kiln_status_t st = kiln_tensor_cast(s, kiln_tensor_dtype(x), &c);
    kiln_tensor_release(s);
    if (st != KILN_OK) {
      kp_raise(st);
      return NULL;
    }
    s = c;
  }
  return s;
}

static PyObject *kp_index_update(PyObject *self, PyObject *args, PyObject *kwargs, bool copy) {
  static char *add_names[] = {"dim", "index", "source", "alpha", NULL}, *copy_names[] = {"dim", "index", "source", NULL};
  int dim;
  PyObject *index, *source;
  double alpha = 1.0;
  if (copy ? !PyArg_ParseTupleAndKeywords(args, kwargs, "iOO:index_copy_", copy_names, &dim, &index, &source)
           : !PyArg_ParseTupleAndKeywords(args, kwargs, "iOO|$d:index_add_", add_names, &dim, &index, &source, &alpha))
    return NULL;
  if (kp_ag_refuse(self, copy ? "index_copy_" : "index_add_") < 0 ||
      kp_ag_refuse(source, copy ? "index_copy_" : "index_add_") < 0)
    return NULL;
  kiln_tensor_t *t = kp_index_arg(index, KP_TENSOR(self)), *s = t ? kp_source_arg(source, KP_TENSOR(self)) : NULL;
  if (!s) {
    kiln_tensor_release(t);
    return NULL;
  }
  const kiln_status_t st = copy ? kiln_tensor_index_copy(KP_TENSOR(self), dim, t, s)
                                : kiln_tensor_index_add(KP_TENSOR(self), dim, t, s, alpha);
  kiln_tensor_release(t);
  kiln_tensor_release(s);
  if (st != KILN_OK) return kp_raise(st);
  return Py_NewRef(self);
}

static PyObject *kp_m_index_add_(PyObject *self, PyObject *args, PyObject *kwargs) {
  return kp_index_update(self, args, kwargs, false);
}

static PyObject *kp_m_index_copy_(PyObject *self, PyObject *args, PyObject *kwargs) {
  return kp_index_update(self, args, kwargs, true);
}

/* x.index_put_(indices, values, accumulate=False): x[indices] = values, or
 * with accumulate, += with repeated indices adding up (index_add). */
static PyObject *kp_m_index_put_(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"indices", "values", "accumulate", NULL};
  PyObject *indices, *values;
  int accumulate = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|p:index_put_", names, &indices, &values, &accumulate)) return NULL;
  if (!PyTuple_Check(indices)) return PyErr_Format(PyExc_TypeError, "index_put_: indices is a tuple of index tensors");
  if (!accumulate) {
    if (kp_tensor_setitem(self, indices, values) < 0) return NULL;
    return Py_NewRef(self);
  }
  kiln_tensor_t *x = KP_TENSOR(self);
  kp_adv_t adv;
  const int r = kp_advanced_plan(x, indices, &adv);
  if (r < 0) return NULL;
  if (r == 0) return PyErr_Format(PyExc_TypeError, "index_put_(accumulate=True) takes index tensors, lists or arrays");
  if (!kiln_tensor_is_contiguous(x)) {
    kp_adv_free(&adv);
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "index_put_ writes x in place and needs a contiguous x (x.contiguous())");
  }
  /* values broadcast to the selection's shape, then added row by row. */
  kiln_tensor_t *v = kp_source_arg(values, x), *b = NULL, *rows = NULL;
  kiln_status_t st = v ? kiln_tensor_broadcast_to(v, adv.ndim, adv.shape, &b) : KILN_OK;
  if (v && st == KILN_OK) {
    int64_t rshape[KILN_MAX_DIMS];
    const int bn = kiln_tensor_ndim(adv.base);
    rshape[0] = kiln_tensor_numel(adv.index);
    for (int d = 1; d < bn; d++) rshape[d] = kiln_tensor_shape(adv.base)[d];
    st = kiln_tensor_reshape(b, bn, rshape, &rows);
  }
  if (v && st == KILN_OK) st = kiln_tensor_index_add(adv.base, 0, adv.index, rows, 1.0);
  kiln_tensor_release(v);
  kiln_tensor_release(b);
  kiln_tensor_release(rows);
  kp_adv_free(&adv);
  if (!v) return NULL;
  if (st != KILN_OK) return kp_raise(st);
  return Py_NewRef(self);
}

PyMethodDef kp_tensor_index_methods[] = {
    {"index_select", (PyCFunction)(void (*)(void))kp_m_index_select, METH_VARARGS | METH_KEYWORDS,
     "index_select(dim, index)\n--\n\nThe slices along dim at the indices (torch.index_select): a gather on the "
     "device, any dtype; negative indices count from the end, one out of range raises IndexError at the next read."},
    {"index_add_", (PyCFunction)(void (*)(void))kp_m_index_add_, METH_VARARGS | METH_KEYWORDS,
     "index_add_(dim, index, source, *, alpha=1)\n--\n\nIn place: self[..., index[j], ...] += alpha * "
     "source[..., j, ...], repeated indices adding up in order (index_select's gradient)."},
    {"index_copy_", (PyCFunction)(void (*)(void))kp_m_index_copy_, METH_VARARGS | METH_KEYWORDS,
     "index_copy_(dim, index, source)\n--\n\nIn place: self[..., index[j], ...] = source[..., j, ...], the last of "
     "repeated indices winning."},
    {"index_put_", (PyCFunction)(void (*)(void))kp_m_index_put_, METH_VARARGS | METH_KEYWORDS,
     "index_put_(indices, values, accumulate=False)\n--\n\nself[indices] = values (indices a tuple of index tensors, "
     "lists or arrays); with accumulate, values are added and repeated indices add up (a scatter-add)."},
    {NULL, NULL, 0, NULL},
};
