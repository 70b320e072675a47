/* python/src/methods.c: what PyTorch users write: shapes as varargs, size()/numel()/dim(), casts, to(dtype), view/squeeze/unsqueeze/expand, reductions with dim= and tuples, cat/stack, comparisons, **, logical and in-place operators. */
#include "kilnpy.h"

#include <math.h>

/* ---- shapes ------------------------------------------------------------------------------- */

int kp_size_args(PyObject *args, Py_ssize_t first, const char *call, int64_t shape[KILN_MAX_DIMS],
                 PyObject **out_dtype) {
  Py_ssize_t n = PyTuple_GET_SIZE(args) - first;
  /* NumPy's zeros(shape, dtype) and kiln's older ones(3, kiln.int32): a dtype last. */
  if (out_dtype && n >= 2 && Py_IS_TYPE(PyTuple_GET_ITEM(args, first + n - 1), &kp_dtype_type)) {
    *out_dtype = PyTuple_GET_ITEM(args, first + n - 1);
    n--;
  }
  if (n == 1 && !PyIndex_Check(PyTuple_GET_ITEM(args, first))) {
    PyObject *seq = PyTuple_GET_ITEM(args, first);
    if (!PyTuple_Check(seq) && !PyList_Check(seq))
      return PyErr_Format(PyExc_TypeError, "%s(): the size must be ints or one tuple/list of ints, not %.100s", call,
                          Py_TYPE(seq)->tp_name), -1;
    return kp_shape_arg(seq, shape, "size");
  }
  if (n > KILN_MAX_DIMS) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s(): %zd sizes; kiln tensors have at most %d dimensions", call, n,
                 KILN_MAX_DIMS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *v = PyTuple_GET_ITEM(args, first + i);
    if (!PyIndex_Check(v)) {
      if (Py_IS_TYPE(v, &kp_dtype_type))
        PyErr_Format(PyExc_TypeError, "%s(): argument %zd is the dtype %s; pass it as dtype=kiln.%s", call, first + i + 1,
                     ((kp_dtype_t *)v)->name, ((kp_dtype_t *)v)->name);
      else
        PyErr_Format(PyExc_TypeError,
                     "%s(): argument %zd (%R) is not an int: the positional arguments are the sizes; every other "
                     "parameter is keyword-only (%s)",
                     call, first + i + 1, v,
                     !strcmp(call, "rand") || !strcmp(call, "uniform") ? "low=, high=, seed=, dtype=, device="
                     : !strcmp(call, "randn") || !strcmp(call, "normal") ? "mean=, std=, seed=, dtype=, device="
                                                                         : "dtype=, device=");
      return -1;
    }
    long long s = PyLong_AsLongLong(v);
    if (s == -1 && PyErr_Occurred()) return -1;
    shape[i] = s;
  }
  return (int)n;
}

/* ---- sizes and casts ---------------------------------------------------------------------- */

static int kp_dim_index(PyObject *arg, int ndim, const char *what, int *out) {
  int32_t v;
  if (kp_int32_arg(arg, what, &v) < 0) return -1;
  int n = ndim == 0 ? 1 : ndim; /* a 0-d tensor takes dim 0 and -1, as PyTorch's */
  if (v < -n || v >= n) {
    PyErr_Format(PyExc_IndexError, "%s %d is out of range for a tensor of %d dimensions (use [-%d, %d))", what, v, ndim,
                 n, n);
    return -1;
  }
  *out = v < 0 ? v + n : v;
  return 0;
}

static PyObject *kp_m_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  kiln_tensor_t *t = KP_TENSOR(self);
  PyObject *dim = nargs > 0 ? args[0] : NULL;
  if (kwnames && PyTuple_GET_SIZE(kwnames) == 1 && !dim &&
      PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "dim") == 0)
    dim = args[nargs];
  else if ((kwnames && PyTuple_GET_SIZE(kwnames) > 0) || nargs > 1)
    return PyErr_Format(PyExc_TypeError, "size(dim=None) takes one optional dim");
  if (!dim || dim == Py_None) return kp_shape_tuple(kiln_tensor_ndim(t), kiln_tensor_shape(t));
  int d;
  if (kp_dim_index(dim, kiln_tensor_ndim(t), "size(): dim", &d) < 0) return NULL;
  return PyLong_FromLongLong(kiln_tensor_ndim(t) ? kiln_tensor_shape(t)[d] : 1);
}

static PyObject *kp_m_numel(PyObject *self, PyObject *unused) {
  return PyLong_FromLongLong(kiln_tensor_numel(KP_TENSOR(self)));
}
static PyObject *kp_m_dim(PyObject *self, PyObject *unused) { return PyLong_FromLong(kiln_tensor_ndim(KP_TENSOR(self))); }

static PyObject *kp_m_clone(PyObject *self, PyObject *unused) {
  kiln_tensor_t *out = NULL;
  int rec = kp_ag_wanted(self, NULL); /* recorded: a copy (x * 1) the gradient passes through */
  return KP_AG_OP(rec, kiln_nn_tape_binary_scalar(kp_ag_tape(), KILN_BINARY_MUL, kp_ag_in(self), 1.0, &out),
                  kiln_tensor_copy(KP_TENSOR(self), kiln_tensor_device(KP_TENSOR(self)), &out), &out);
}

/* The same memory, a new object that requires no grad (a constant to the tape). */
static PyObject *kp_m_detach(PyObject *self, PyObject *unused) {
  return kp_tensor_wrap(kiln_tensor_retain(KP_TENSOR(self)));
}

/* PyTorch's casts return the tensor itself when it already has the dtype. */
static PyObject *kp_cast_to(PyObject *self, kiln_dtype_t dtype) {
  if (kiln_tensor_dtype(KP_TENSOR(self)) == dtype) return Py_NewRef(self);
  return kp_cast(self, dtype);
}
#define KP_CAST_METHOD(name, DT) \
  static PyObject *kp_m_##name(PyObject *self, PyObject *unused) { return kp_cast_to(self, DT); }
KP_CAST_METHOD(float, KILN_F32)
KP_CAST_METHOD(double, KILN_F64)
KP_CAST_METHOD(half, KILN_F16)
KP_CAST_METHOD(bfloat16, KILN_BF16)
KP_CAST_METHOD(long, KILN_I64)
KP_CAST_METHOD(int, KILN_I32)
KP_CAST_METHOD(short, KILN_I16)
KP_CAST_METHOD(bool, KILN_BOOL)

/* to(device), to(dtype), to(device, dtype), to(dtype=, device=), to(other tensor). */
static PyObject *kp_m_to(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"a", "b", "dtype", "device", "copy", "non_blocking", NULL};
  PyObject *a = NULL, *b = NULL, *dtype_arg = NULL, *device_arg = NULL;
  int copy = 0, non_blocking = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO$OOpp:to", names, &a, &b, &dtype_arg, &device_arg, &copy,
                                   &non_blocking))
    return NULL;
  PyObject *pos[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    PyObject *p = pos[i];
    if (!p) continue;
    if (KP_IS_TENSOR(p)) {
      if (!dtype_arg) dtype_arg = kp_dtype_object(kiln_tensor_dtype(KP_TENSOR(p)));
      if (!device_arg) device_arg = kp_device_object(kiln_tensor_device(KP_TENSOR(p)));
      if (!device_arg) return NULL;
      Py_DECREF(device_arg); /* kept alive by the tensor's device */
    } else if (Py_IS_TYPE(p, &kp_dtype_type) || PyType_Check(p) || (!PyUnicode_Check(p) && !PyIndex_Check(p) &&
                                                                     !Py_IS_TYPE(p, &kp_device_type))) {
      if (dtype_arg) return PyErr_Format(PyExc_TypeError, "to(): two dtypes given");
      dtype_arg = p;
    } else if (PyUnicode_Check(p)) {
      /* "cpu:0" names a device, "float64" a dtype. */
      kiln_dtype_t d;
      if (kp_dtype_arg(p, KILN_F32, &d) == 0) {
        dtype_arg = p;
      } else {
        PyErr_Clear();
        device_arg = p;
      }
    } else {
      if (device_arg) return PyErr_Format(PyExc_TypeError, "to(): two devices given");
      device_arg = p;
    }
  }
  if (!dtype_arg && !device_arg)
    return PyErr_Format(PyExc_TypeError, "to() needs a device, a dtype or both (t.to('cpu:0'), t.to(kiln.float64))");
  kiln_tensor_t *t = KP_TENSOR(self);
  kiln_device_t *device = kiln_tensor_device(t);
  kiln_dtype_t dtype = kiln_tensor_dtype(t);
  if (device_arg && device_arg != Py_None && kp_device_arg(device_arg, &device) < 0) return NULL;
  if (kp_dtype_arg(dtype_arg, dtype, &dtype) < 0) return NULL;
  if (device == kiln_tensor_device(t) && dtype == kiln_tensor_dtype(t) && !copy) return Py_NewRef(self);
  if (kp_ag_requires_grad(self)) {
    if (device == kiln_tensor_device(t) && !copy) return kp_cast(self, dtype);
    if (kp_ag_refuse(self, "to(device) or to(copy=True)") < 0) return NULL;
  }
  kiln_tensor_t *moved = NULL, *out = NULL;
  kiln_status_t status = device == kiln_tensor_device(t) ? KILN_OK : kiln_tensor_to(t, device, &moved);
  if (status != KILN_OK) return kp_raise(status);
  kiln_tensor_t *src = moved ? moved : t;
  if (dtype != kiln_tensor_dtype(src)) status = kiln_tensor_cast(src, dtype, &out);
  else if (moved) out = kiln_tensor_retain(moved);
  else status = kiln_tensor_copy(src, device, &out);
  kiln_tensor_release(moved);
  return kp_result(status, &out);
}

/* ---- layout ------------------------------------------------------------------------------------ */


/* view(*shape): reshape that never copies. */
static PyObject *kp_m_view(PyObject *self, PyObject *args) {
  int64_t shape[KILN_MAX_DIMS];
  if (PyTuple_GET_SIZE(args) == 1 && (Py_IS_TYPE(PyTuple_GET_ITEM(args, 0), &kp_dtype_type) ||
                                      PyType_Check(PyTuple_GET_ITEM(args, 0))))
    return kp_raise_msg(KILN_UNSUPPORTED, "view(dtype): kiln does not reinterpret bits; convert with .to(dtype)");
  int ndim = kp_size_args(args, 0, "view", shape, NULL);
  if (ndim < 0) return NULL;
  kiln_tensor_t *t = KP_TENSOR(self), *out = NULL;
  kiln_status_t status = kiln_tensor_reshape(t, ndim, shape, &out);
  if (status != KILN_OK) return kp_raise(status);
  if (kiln_tensor_buffer(out) != kiln_tensor_buffer(t)) {
    kiln_tensor_release(out);
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "view(): this tensor's strides cannot show that shape without a copy; "
                        "use .reshape(...) (which copies then) or .contiguous().view(...)");
  }
  if (kp_ag_requires_grad(self)) { /* the same view, recorded */
    kiln_tensor_release(out);
    return kp_reshape(self, ndim, shape);
  }
  return kp_tensor_wrap(out);
}

static PyObject *kp_m_reshape(PyObject *self, PyObject *args) {
  int64_t shape[KILN_MAX_DIMS];
  int ndim = kp_size_args(args, 0, "reshape", shape, NULL);
  if (ndim < 0) return NULL;
  return kp_reshape(self, ndim, shape);
}

static PyObject *kp_m_squeeze(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"dim", NULL};
  PyObject *dim = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:squeeze", names, &dim)) return NULL;
  kiln_tensor_t *t = KP_TENSOR(self);
  int n = kiln_tensor_ndim(t), m = 0;
  const int64_t *s = kiln_tensor_shape(t);
  bool drop[KILN_MAX_DIMS] = {false};
  if (dim == Py_None) {
    for (int i = 0; i < n; i++) drop[i] = s[i] == 1;
  } else if (PyIndex_Check(dim)) {
    int d;
    if (kp_dim_index(dim, n, "squeeze(): dim", &d) < 0) return NULL;
    if (n > 0) drop[d] = s[d] == 1; /* PyTorch leaves a dim of another size alone */
  } else {
    int32_t dims[KILN_MAX_DIMS];
    int count = kp_int32_seq_arg(dim, "squeeze(): dim", KILN_MAX_DIMS, dims);
    if (count < 0) return NULL;
    for (int i = 0; i < count; i++) {
      PyObject *o = PyLong_FromLong(dims[i]);
      int d;
      int rc = o ? kp_dim_index(o, n, "squeeze(): dim", &d) : -1;
      Py_XDECREF(o);
      if (rc < 0) return NULL;
      if (n > 0) drop[d] = s[d] == 1;
    }
  }
  int64_t shape[KILN_MAX_DIMS];
  for (int i = 0; i < n; i++)
    if (!drop[i]) shape[m++] = s[i];
  return kp_reshape(self, m, shape);
}

static PyObject *kp_m_unsqueeze(PyObject *self, PyObject *arg) {
  kiln_tensor_t *t = KP_TENSOR(self);
  int n = kiln_tensor_ndim(t), d;
  if (n >= KILN_MAX_DIMS)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "unsqueeze(): the tensor has %d dimensions, kiln's most", n);
  if (kp_dim_index(arg, n + 1, "unsqueeze(): dim", &d) < 0) return NULL;
  int64_t shape[KILN_MAX_DIMS];
  const int64_t *s = kiln_tensor_shape(t);
  for (int i = 0, j = 0; i <= n; i++) shape[i] = i == d ? 1 : s[j++];
  return kp_reshape(self, n + 1, shape);
}

/* expand(*sizes): -1 keeps a size. kiln has no stride-0 views yet: a copy (broadcast_to). */
static PyObject *kp_m_expand(PyObject *self, PyObject *args) {
  int64_t shape[KILN_MAX_DIMS];
  int ndim = kp_size_args(args, 0, "expand", shape, NULL);
  if (ndim < 0 || kp_ag_refuse(self, "expand") < 0) return NULL;
  kiln_tensor_t *t = KP_TENSOR(self), *out = NULL;
  int n = kiln_tensor_ndim(t);
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - n);
    if (shape[i] == -1) {
      if (j < 0) return kp_raise_msg(KILN_INVALID_ARGUMENT, "expand(): -1 at a new leading dim %d", i);
      shape[i] = kiln_tensor_shape(t)[j];
    }
  }
  return kp_result(kiln_tensor_broadcast_to(t, ndim, shape, &out), &out);
}

static PyObject *kp_permute_view(kiln_tensor_t *t, const int *perm) {
  kiln_tensor_t *out = NULL;
  return kp_result(kiln_tensor_permute(t, perm, &out), &out);
}

/* transpose(d0, d1) swaps two dims (PyTorch's); transpose() / transpose(axes)
 * / transpose(*axes) of every axis permute them (NumPy's). */
static PyObject *kp_m_transpose(PyObject *self, PyObject *args) {
  kiln_tensor_t *t = KP_TENSOR(self);
  if (kp_ag_refuse(self, "transpose") < 0) return NULL;
  int n = kiln_tensor_ndim(t), perm[KILN_MAX_DIMS];
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (nargs == 2 && PyIndex_Check(PyTuple_GET_ITEM(args, 0)) && PyIndex_Check(PyTuple_GET_ITEM(args, 1))) {
    int a, b;
    if (kp_dim_index(PyTuple_GET_ITEM(args, 0), n, "transpose(): dim0", &a) < 0 ||
        kp_dim_index(PyTuple_GET_ITEM(args, 1), n, "transpose(): dim1", &b) < 0)
      return NULL;
    kiln_tensor_t *out = NULL;
    if (n == 0) return kp_tensor_wrap(kiln_tensor_retain(t));
    return kp_result(kiln_tensor_transpose(t, a, b, &out), &out);
  }
  if (nargs == 0) {
    for (int i = 0; i < n; i++) perm[i] = n - 1 - i;
    return kp_permute_view(t, perm);
  }
  int32_t dims[KILN_MAX_DIMS];
  int count = nargs == 1 && !PyIndex_Check(PyTuple_GET_ITEM(args, 0))
                  ? kp_int32_seq_arg(PyTuple_GET_ITEM(args, 0), "axes", KILN_MAX_DIMS, dims)
                  : kp_int32_seq_arg(args, "axes", KILN_MAX_DIMS, dims);
  if (count < 0) return NULL;
  if (count != n)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "transpose(): %d axes for a tensor of %d dimensions; pass two dims to "
                        "swap (PyTorch's transpose(0, 1)) or every axis (NumPy's)", count, n);
  for (int i = 0; i < n; i++) perm[i] = dims[i];
  return kp_permute_view(t, perm);
}

/* ---- reductions ------------------------------------------------------------------------------- */

enum { KP_SUM, KP_MEAN, KP_MAX, KP_MIN, KP_ARGMAX, KP_ARGMIN };
static const char *const kp_reduce_names[] = {"sum", "mean", "max", "min", "argmax", "argmin"};

static PyTypeObject *kp_minmax_type; /* (values, indices), torch.return_types.max's fields */

/* -x computed where the dtype has a negation that keeps the order: u8 and
 * bool go through i16 and come back. */
static kiln_status_t kp_negate(const kiln_tensor_t *t, kiln_tensor_t **out) {
  kiln_dtype_t d = kiln_tensor_dtype(t);
  if (d != KILN_U8 && d != KILN_BOOL) return kiln_tensor_neg(t, out);
  kiln_tensor_t *wide = NULL;
  kiln_status_t status = kiln_tensor_cast(t, KILN_I16, &wide);
  if (status == KILN_OK) status = kiln_tensor_neg(wide, out);
  kiln_tensor_release(wide);
  return status;
}

/* One axis (or KILN_ALL_AXES) of one reduction kind. */
static kiln_status_t kp_reduce_one(int kind, kiln_tensor_t *t, int axis, bool keep, kiln_tensor_t **out, int rec) {
  switch (kind) {
  case KP_SUM: return rec ? KP_AG(kiln_nn_tape_sum(kp_ag_tape(), t, axis, keep, out)) : kiln_tensor_sum(t, axis, keep, out);
  case KP_MEAN:
    return rec ? KP_AG(kiln_nn_tape_mean(kp_ag_tape(), t, axis, keep, out)) : kiln_tensor_mean(t, axis, keep, out);
  case KP_MAX: return kiln_tensor_max(t, axis, keep, out);
  case KP_ARGMAX: return kiln_tensor_argmax(t, axis, keep, out);
  default: break;
  }
  /* min and argmin are max and argmax of -x. */
  kiln_tensor_t *neg = NULL, *r = NULL;
  kiln_status_t status = kp_negate(t, &neg);
  if (status != KILN_OK) return status;
  if (kind == KP_ARGMIN) {
    status = kiln_tensor_argmax(neg, axis, keep, out);
    kiln_tensor_release(neg);
    return status;
  }
  status = kiln_tensor_max(neg, axis, keep, &r);
  kiln_tensor_release(neg);
  if (status != KILN_OK) return status;
  kiln_tensor_t *back = NULL;
  status = kiln_tensor_neg(r, &back);
  kiln_tensor_release(r);
  if (status == KILN_OK && kiln_tensor_dtype(back) != kiln_tensor_dtype(t)) {
    status = kiln_tensor_cast(back, kiln_tensor_dtype(t), out);
    kiln_tensor_release(back);
    return status;
  }
  if (status == KILN_OK) *out = back;
  return status;
}

/* sum(dim=None, keepdim=False, *, axis=, keepdims=): dim an int, a tuple of
 * ints or None (every axis). With an int dim, max and min return (values,
 * indices) as PyTorch's; with axis= (NumPy's spelling) the values. */
PyObject *kp_reduce_call(PyObject *tensor_obj, PyObject *args, PyObject *kwargs, int kind) {
  static char *names[] = {"dim", "keepdim", "axis", "keepdims", "dtype", NULL};
  PyObject *dim = Py_None, *axis = Py_None, *keepdims_arg = Py_None, *dtype_arg = Py_None;
  int keepdim = 0;
  char format[40];
  snprintf(format, sizeof format, "|Op$OOO:%s", kp_reduce_names[kind]);
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, names, &dim, &keepdim, &axis, &keepdims_arg, &dtype_arg))
    return NULL;
  if (axis != Py_None) {
    if (dim != Py_None)
      return PyErr_Format(PyExc_TypeError, "%s(): pass dim= or axis= (its NumPy name), not both", kp_reduce_names[kind]);
    dim = axis;
  }
  if (keepdims_arg != Py_None) {
    int k = PyObject_IsTrue(keepdims_arg);
    if (k < 0) return NULL;
    keepdim = keepdim || k;
  }
  kiln_tensor_t *t = KP_TENSOR(tensor_obj), *cur = NULL;
  /* sum and mean are recorded; max and min of a tensor that requires grad are refused. */
  int rec = kind == KP_SUM || kind == KP_MEAN ? kp_ag_wanted(tensor_obj, NULL) : 0;
  if (rec < 0 || ((kind == KP_MAX || kind == KP_MIN) && kp_ag_refuse(tensor_obj, kp_reduce_names[kind]) < 0))
    return NULL;
  if (rec) t = kp_ag_in(tensor_obj);
  if (dtype_arg != Py_None) {
    kiln_dtype_t d;
    if (kp_dtype_arg(dtype_arg, KILN_F32, &d) < 0) return NULL;
    kiln_status_t status = rec ? KP_AG(kiln_nn_tape_cast(kp_ag_tape(), t, d, &cur)) : kiln_tensor_cast(t, d, &cur);
    if (status != KILN_OK) return kp_raise(status);
  } else {
    cur = kiln_tensor_retain(t);
  }
  int n = kiln_tensor_ndim(t);
  int axes[KILN_MAX_DIMS], count = 0;
  bool all = dim == Py_None;
  if (!all && PyIndex_Check(dim)) {
    if (kp_dim_index(dim, n, axis != Py_None ? "axis" : "dim", &axes[0]) < 0) goto fail;
    count = 1;
  } else if (!all) {
    if (kind == KP_ARGMAX || kind == KP_ARGMIN) {
      PyErr_Format(PyExc_TypeError, "%s(): dim must be an int or None (one index per position)", kp_reduce_names[kind]);
      goto fail;
    }
    PyObject *seq = PySequence_Fast(dim, "");
    if (!seq) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s(): dim must be an int, a tuple of ints or None, not %.100s",
                   kp_reduce_names[kind], Py_TYPE(dim)->tp_name);
      goto fail;
    }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    bool seen[KILN_MAX_DIMS] = {false};
    for (Py_ssize_t i = 0; i < m; i++) {
      int a;
      if (kp_dim_index(PySequence_Fast_GET_ITEM(seq, i), n, axis != Py_None ? "axis" : "dim", &a) < 0) {
        Py_DECREF(seq);
        goto fail;
      }
      if (seen[a]) {
        Py_DECREF(seq);
        kp_raise_msg(KILN_INVALID_ARGUMENT, "%s(): dim %d appears twice in %R", kp_reduce_names[kind], a, dim);
        goto fail;
      }
      seen[a] = true;
    }
    Py_DECREF(seq);
    /* Highest first, so that the lower axes keep their numbers. */
    for (int a = n - 1; a >= 0; a--)
      if (seen[a]) axes[count++] = a;
    if (count == 0) all = true; /* () reduces everything, as PyTorch's dim=() (NumPy's axis=() reduces nothing: kiln.array_api answers that itself) */
  }
  if (all || n == 0) {
    kiln_tensor_t *out = NULL;
    kiln_status_t status = kp_reduce_one(kind, cur, KILN_ALL_AXES, keepdim != 0, &out, rec);
    kiln_tensor_release(cur);
    return kp_ag_result(rec, status, &out);
  }
  bool pair = (kind == KP_MAX || kind == KP_MIN) && PyIndex_Check(dim) && axis == Py_None;
  for (int i = 0; i < count; i++) {
    kiln_tensor_t *next = NULL;
    kiln_status_t status = kp_reduce_one(kind, cur, axes[i], keepdim != 0, &next, rec);
    if (status != KILN_OK) {
      kiln_tensor_release(cur);
      return kp_raise(status);
    }
    if (pair) {
      kiln_tensor_t *idx = NULL;
      status = kp_reduce_one(kind == KP_MAX ? KP_ARGMAX : KP_ARGMIN, cur, axes[i], keepdim != 0, &idx, 0);
      kiln_tensor_release(cur);
      if (status != KILN_OK) {
        kiln_tensor_release(next);
        return kp_raise(status);
      }
      PyObject *r = PyStructSequence_New(kp_minmax_type);
      PyObject *v = r ? kp_tensor_wrap(next) : (kiln_tensor_release(next), NULL);
      PyObject *ix = v ? kp_tensor_wrap(idx) : (kiln_tensor_release(idx), NULL);
      if (!ix) {
        Py_XDECREF(v);
        Py_XDECREF(r);
        return NULL;
      }
      PyStructSequence_SET_ITEM(r, 0, v);
      PyStructSequence_SET_ITEM(r, 1, ix);
      return r;
    }
    kiln_tensor_release(cur);
    cur = next;
  }
  return kp_ag_result(rec, KILN_OK, &cur);
fail:
  kiln_tensor_release(cur);
  return NULL;
}

#define KP_REDUCE_M(name, KIND)                                                        \
  static PyObject *kp_m_##name(PyObject *self, PyObject *args, PyObject *kwargs) {      \
    return kp_reduce_call(self, args, kwargs, KIND);                                    \
  }
KP_REDUCE_M(sum, KP_SUM)
KP_REDUCE_M(mean, KP_MEAN)
KP_REDUCE_M(max, KP_MAX)
KP_REDUCE_M(min, KP_MIN)
KP_REDUCE_M(argmax, KP_ARGMAX)
KP_REDUCE_M(argmin, KP_ARGMIN)

/* kiln.sum(a, dim=None, keepdim=False, ...) and the rest: the method on a. */
#define KP_REDUCE_F(name, KIND)                                                                         \
  static PyObject *kp_f_##name(PyObject *mod, PyObject *args, PyObject *kwargs) {                        \
    if (PyTuple_GET_SIZE(args) < 1)                                                                      \
      return PyErr_Format(PyExc_TypeError, #name "() needs the tensor to reduce");                      \
    if (!kp_tensor_arg(PyTuple_GET_ITEM(args, 0), "a")) return NULL;                                     \
    PyObject *rest = PyTuple_GetSlice(args, 1, PyTuple_GET_SIZE(args));                                  \
    if (!rest) return NULL;                                                                              \
    PyObject *r = kp_reduce_call(PyTuple_GET_ITEM(args, 0), rest, kwargs, KIND);                         \
    Py_DECREF(rest);                                                                                     \
    return r;                                                                                            \
  }
KP_REDUCE_F(sum, KP_SUM)
KP_REDUCE_F(mean, KP_MEAN)
KP_REDUCE_F(max, KP_MAX)
KP_REDUCE_F(min, KP_MIN)
KP_REDUCE_F(argmax, KP_ARGMAX)
KP_REDUCE_F(argmin, KP_ARGMIN)

/* ---- cat and stack -------------------------------------------------------------------------- */

/* cat(tensors, dim=0): an empty result of the joint shape, each input copied
 * into its slice of it (kiln_tensor_slice + kiln_tensor_copy_into, on the
 * device; inputs of other dtypes are converted to the first one's). */
static PyObject *kp_cat_impl(PyObject *seq_arg, PyObject *dim_arg, bool stack) {
  const char *call = stack ? "stack" : "cat";
  PyObject *seq = PySequence_Fast(seq_arg, "");
  if (!seq) {
    PyErr_Clear();
    return PyErr_Format(PyExc_TypeError, "%s(): pass a sequence of tensors, not %.100s", call, Py_TYPE(seq_arg)->tp_name);
  }
  Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  PyObject *result = NULL;
  kiln_tensor_t *out = NULL;
  if (count == 0) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s() of no tensors; pass at least one", call);
    goto done;
  }
  for (Py_ssize_t i = 0; i < count; i++) {
    if (!KP_IS_TENSOR(PySequence_Fast_GET_ITEM(seq, i))) {
      PyErr_Format(PyExc_TypeError, "%s(): element %zd is %.100s, not a kiln.Tensor", call, i,
                   Py_TYPE(PySequence_Fast_GET_ITEM(seq, i))->tp_name);
      goto done;
    }
    if (kp_ag_refuse(PySequence_Fast_GET_ITEM(seq, i), call) < 0) goto done;
  }
  kiln_tensor_t *first = KP_TENSOR(PySequence_Fast_GET_ITEM(seq, 0));
  const int n = kiln_tensor_ndim(first);
  const int out_n = stack ? n + 1 : n;
  if (out_n == 0 || out_n > KILN_MAX_DIMS) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s(): %s", call, out_n == 0 ? "0-d tensors have no dim to join along; stack "
                 "them instead" : "the result would have more dims than kiln's 8");
    goto done;
  }
  int d;
  if (kp_dim_index(dim_arg ? dim_arg : Py_False, out_n, "dim", &d) < 0) goto done;
  int64_t shape[KILN_MAX_DIMS];
  const int64_t *fs = kiln_tensor_shape(first);
  for (int i = 0, j = 0; i < out_n; i++) shape[i] = stack && i == d ? 0 : fs[j++];
  shape[d] = 0; /* summed below */
  for (Py_ssize_t k = 0; k < count; k++) {
    kiln_tensor_t *t = KP_TENSOR(PySequence_Fast_GET_ITEM(seq, k));
    const int64_t *s = kiln_tensor_shape(t);
    bool ok = kiln_tensor_ndim(t) == n;
    for (int i = 0, j = 0; ok && i < out_n; i++) {
      if (stack && i == d) continue;
      ok = i == d || s[j] == shape[i];
      j++;
    }
    if (!ok) {
      PyObject *want = kp_shape_tuple(n, fs), *got = kp_shape_tuple(kiln_tensor_ndim(t), s);
      if (want && got)
        kp_raise_msg(KILN_SHAPE_MISMATCH, "%s(): tensor %zd has shape %s, tensor 0 %s; %s", call, k,
                     PyUnicode_AsUTF8(PyObject_Repr(got)), PyUnicode_AsUTF8(PyObject_Repr(want)),
                     stack ? "stack needs equal shapes" : "cat needs equal sizes off the joined dim");
      Py_XDECREF(want);
      Py_XDECREF(got);
      goto done;
    }
    shape[d] += stack ? 1 : s[d];
  }
  kiln_status_t status = kiln_tensor_empty(kiln_tensor_device(first), kiln_tensor_dtype(first), out_n, shape, &out);
  int64_t at = 0;
  for (Py_ssize_t k = 0; status == KILN_OK && k < count; k++) {
    kiln_tensor_t *t = KP_TENSOR(PySequence_Fast_GET_ITEM(seq, k)), *part = NULL;
    int64_t len = stack ? 1 : kiln_tensor_shape(t)[d];
    status = kiln_tensor_slice(out, d, at, at + len, 1, &part);
    kiln_tensor_t *src = NULL;
    if (status == KILN_OK && stack) /* t with a size-1 dim at d: part's shape */
      status = kiln_tensor_reshape(t, out_n, kiln_tensor_shape(part), &src);
    if (status == KILN_OK) status = kiln_tensor_copy_into(part, src ? src : t);
    kiln_tensor_release(src);
    kiln_tensor_release(part);
    at += len;
  }
  if (status != KILN_OK) {
    kiln_tensor_release(out);
    kp_raise(status);
    goto done;
  }
  result = kp_tensor_wrap(out);
done:
  Py_DECREF(seq);
  return result;
}

static PyObject *kp_f_cat(PyObject *mod, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"tensors", "dim", "axis", NULL};
  PyObject *seq, *dim = NULL, *axis = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:cat", names, &seq, &dim, &axis)) return NULL;
  return kp_cat_impl(seq, axis ? axis : dim, false);
}

static PyObject *kp_f_stack(PyObject *mod, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"tensors", "dim", "axis", NULL};
  PyObject *seq, *dim = NULL, *axis = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:stack", names, &seq, &dim, &axis)) return NULL;
  return kp_cat_impl(seq, axis ? axis : dim, true);
}

/* ---- operators ------------------------------------------------------------------------------- */

/* A Python or NumPy number as a 0-d tensor beside `like`: in like's dtype,
 * unless like holds integers (or bools) and the number is not a whole
 * integer, then float64, so that `x > 0.5` compares with 0.5 itself. */
static kiln_tensor_t *kp_scalar_tensor(PyObject *obj, const kiln_tensor_t *like, int *out_is_scalar) {
  double v;
  int r = kp_scalar(obj, &v);
  *out_is_scalar = r;
  if (r <= 0) return NULL;
  kiln_dtype_t dtype = kiln_tensor_dtype(like);
  bool integral = kiln_dtype_class(dtype) != KILN_DTYPE_CLASS_FLOAT;
  if (integral && (v != floor(v) || !isfinite(v))) dtype = KILN_F64;
  else if (dtype == KILN_BOOL && v != 0 && v != 1) dtype = KILN_I64;
  kiln_tensor_t *out = NULL;
  kiln_status_t status = kiln_tensor_full(kiln_tensor_device(like), dtype, 0, NULL, v, &out);
  if (status != KILN_OK) {
    kp_raise(status);
    *out_is_scalar = -1;
    return NULL;
  }
  return out;
}

/* Both operands as tensors (a number becomes a 0-d one); 1, 0 (not
 * operands kiln takes: NotImplemented) or -1. *owned are to release. */
static int kp_operands(PyObject *a, PyObject *b, kiln_tensor_t **ta, kiln_tensor_t **tb, kiln_tensor_t **owned) {
  *owned = NULL;
  if (KP_IS_TENSOR(a) && KP_IS_TENSOR(b)) {
    *ta = KP_TENSOR(a);
    *tb = KP_TENSOR(b);
    return 1;
  }
  int r;
  if (KP_IS_TENSOR(a)) {
    *ta = KP_TENSOR(a);
    *tb = *owned = kp_scalar_tensor(b, *ta, &r);
  } else if (KP_IS_TENSOR(b)) {
    *tb = KP_TENSOR(b);
    *ta = *owned = kp_scalar_tensor(a, *tb, &r);
  } else {
    return 0;
  }
  return r;
}

PyObject *kp_compare(PyObject *a, PyObject *b, int pyop) {
  static const kiln_compare_op_t ops[] = {[Py_LT] = KILN_COMPARE_LESS,    [Py_LE] = KILN_COMPARE_LESS_EQUAL,
                                          [Py_EQ] = KILN_COMPARE_EQUAL,   [Py_NE] = KILN_COMPARE_NOT_EQUAL,
                                          [Py_GT] = KILN_COMPARE_GREATER, [Py_GE] = KILN_COMPARE_GREATER_EQUAL};
  kiln_tensor_t *ta, *tb, *owned, *out = NULL;
  int r = kp_operands(a, b, &ta, &tb, &owned);
  if (r < 0) return NULL;
  if (r == 0) Py_RETURN_NOTIMPLEMENTED;
  kiln_status_t status = kiln_tensor_compare(ops[pyop], ta, tb, &out);
  kiln_tensor_release(owned);
  return kp_result(status, &out);
}

static PyObject *kp_logical(PyObject *a, PyObject *b, kiln_compare_op_t op, const char *sym) {
  kiln_tensor_t *ta, *tb, *owned, *out = NULL;
  int r = kp_operands(a, b, &ta, &tb, &owned);
  if (r < 0) return NULL;
  if (r == 0) Py_RETURN_NOTIMPLEMENTED;
  if (kiln_tensor_dtype(ta) != KILN_BOOL || kiln_tensor_dtype(tb) != KILN_BOOL) {
    kiln_tensor_release(owned);
    return kp_raise_msg(KILN_DTYPE_MISMATCH, "%s of %s and %s: kiln has logical %s on bool tensors only (no bitwise "
                        "integer ops yet); compare first (x > 0) or convert with .bool()", sym,
                        kiln_dtype_long_name(kiln_tensor_dtype(ta)), kiln_dtype_long_name(kiln_tensor_dtype(tb)), sym);
  }
  kiln_status_t status = kiln_tensor_compare(op, ta, tb, &out);
  kiln_tensor_release(owned);
  return kp_result(status, &out);
}

PyObject *kp_nb_and(PyObject *a, PyObject *b) { return kp_logical(a, b, KILN_COMPARE_LOGICAL_AND, "&"); }
PyObject *kp_nb_or(PyObject *a, PyObject *b) { return kp_logical(a, b, KILN_COMPARE_LOGICAL_OR, "|"); }
PyObject *kp_nb_xor(PyObject *a, PyObject *b) { return kp_logical(a, b, KILN_COMPARE_LOGICAL_XOR, "^"); }

PyObject *kp_nb_invert(PyObject *a) {
  kiln_tensor_t *t = KP_TENSOR(a), *out = NULL;
  if (kiln_tensor_dtype(t) != KILN_BOOL)
    return kp_raise_msg(KILN_DTYPE_MISMATCH, "~ of a %s tensor: kiln has logical not on bool tensors only (no bitwise "
                        "integer ops yet); use x == 0, or .bool() first", kiln_dtype_long_name(kiln_tensor_dtype(t)));
  return kp_result(kiln_tensor_logical_not(t, &out), &out);
}

PyObject *kp_nb_index(PyObject *a) {
  kiln_tensor_t *t = KP_TENSOR(a);
  if (kiln_dtype_class(kiln_tensor_dtype(t)) == KILN_DTYPE_CLASS_FLOAT || kiln_tensor_numel(t) != 1)
    return PyErr_Format(PyExc_TypeError, "only a one-element integer or bool tensor converts to an index (this one: "
                        "%lld elements of %s)", (long long)kiln_tensor_numel(t),
                        kiln_dtype_long_name(kiln_tensor_dtype(t)));
  return kp_tensor_item_object(t);
}

/* x ** y from kiln's ops: a whole exponent by repeated multiplication (exact,
 * and right for negative bases), 0.5 by sqrt, anything else as exp(y log x)
 * (NaN for a negative base, as pow gives for a fractional exponent). */
PyObject *kp_nb_power(PyObject *a, PyObject *b, PyObject *mod) {
  if (mod != Py_None) Py_RETURN_NOTIMPLEMENTED;
  kiln_tensor_t *out = NULL, *acc = NULL, *base = NULL, *tmp = NULL;
  kiln_status_t status = KILN_OK;
  double e;
  int r;
  if (KP_IS_TENSOR(a) && !KP_IS_TENSOR(b)) {
    if ((r = kp_scalar(b, &e)) <= 0) {
      if (r < 0) return NULL;
      Py_RETURN_NOTIMPLEMENTED;
    }
    kiln_tensor_t *t = KP_TENSOR(a);
    int rec = kp_ag_wanted(a, NULL);
    if (rec < 0) return NULL;
    if (rec) {
      /* The exponents with a recorded form: x*x and sqrt. */
      if (e == 2) return kp_binary(KILN_BINARY_MUL, a, a);
      if (e == 0.5) return kp_unary(KILN_UNARY_SQRT, a, &out);
      if (kp_ag_refuse(a, "x ** (an exponent other than 2 or 0.5)") < 0) return NULL;
    }
    if (e == floor(e) && fabs(e) <= 64) {
      long long k = (long long)fabs(e);
      if (e < 0 && kiln_dtype_class(kiln_tensor_dtype(t)) != KILN_DTYPE_CLASS_FLOAT) {
        char text[32];
        return kp_raise_msg(KILN_DTYPE_MISMATCH, "an integer tensor ** a negative integer: PyTorch refuses it too; "
                            "convert first (x.float() ** %s)", kp_double_text(e, text));
      }
      status = kiln_tensor_ones(kiln_tensor_device(t), kiln_tensor_dtype(t), kiln_tensor_ndim(t), kiln_tensor_shape(t),
                                &acc);
      base = kiln_tensor_retain(t);
      while (status == KILN_OK && k > 0) {
        if (k & 1) {
          status = kiln_tensor_mul(acc, base, &tmp);
          kiln_tensor_release(acc);
          acc = tmp;
          tmp = NULL;
        }
        k >>= 1;
        if (status == KILN_OK && k > 0) {
          status = kiln_tensor_mul(base, base, &tmp);
          kiln_tensor_release(base);
          base = tmp;
          tmp = NULL;
        }
      }
      kiln_tensor_release(base);
      if (status == KILN_OK && e < 0) {
        kiln_tensor_t *one = NULL;
        status = kiln_tensor_full(kiln_tensor_device(acc), kiln_tensor_dtype(acc), 0, NULL, 1.0, &one);
        if (status == KILN_OK) status = kiln_tensor_div(one, acc, &out);
        kiln_tensor_release(one);
        kiln_tensor_release(acc);
      } else {
        out = acc;
      }
      return kp_result(status, &out);
    }
    if (e == 0.5) return kp_result(kiln_tensor_sqrt(t, &out), &out);
    status = kiln_tensor_log(t, &tmp);
    if (status == KILN_OK) status = kiln_tensor_mul_scalar(tmp, e, &acc);
    if (status == KILN_OK) status = kiln_tensor_exp(acc, &out);
    kiln_tensor_release(tmp);
    kiln_tensor_release(acc);
    return kp_result(status, &out);
  }
  /* A tensor exponent: exp(y * log(x)). */
  kiln_tensor_t *ta, *tb, *owned;
  if (kp_ag_refuse(a, "x ** tensor") < 0 || kp_ag_refuse(b, "x ** tensor") < 0) return NULL;
  r = kp_operands(a, b, &ta, &tb, &owned);
  if (r < 0) return NULL;
  if (r == 0) Py_RETURN_NOTIMPLEMENTED;
  status = kiln_tensor_log(ta, &tmp);
  if (status == KILN_OK) status = kiln_tensor_mul(tmp, tb, &acc);
  if (status == KILN_OK) status = kiln_tensor_exp(acc, &out);
  kiln_tensor_release(tmp);
  kiln_tensor_release(acc);
  kiln_tensor_release(owned);
  return kp_result(status, &out);
}

/* a op= b: the result is computed as for a op b, then written into a's own
 * memory (kiln_tensor_copy_into; a float32 += / -= of one shape runs the
 * fused accumulate instead), so every other reference to a, and every view
 * of it, sees the change. */
static PyObject *kp_inplace(PyObject *a, PyObject *b, kiln_binary_op_t op) {
  if (!KP_IS_TENSOR(a)) Py_RETURN_NOTIMPLEMENTED;
  kiln_tensor_t *t = KP_TENSOR(a);
  kiln_status_t status;
  /* PyTorch's rule for leaves, kept for every tensor that requires grad: in
   * place under kiln.no_grad() only (the optimizer's p -= lr * p.grad). */
  if (kp_ag_refuse(a, "an in-place operator") < 0 || kp_ag_refuse(b, "an in-place operator") < 0) return NULL;
  if ((op == KILN_BINARY_ADD || op == KILN_BINARY_SUB) && KP_IS_TENSOR(b) && kiln_tensor_dtype(t) == KILN_F32 &&
      kiln_tensor_dtype(KP_TENSOR(b)) == KILN_F32 && kiln_tensor_is_contiguous(t) &&
      kiln_tensor_is_contiguous(KP_TENSOR(b)) && kiln_tensor_buffer(t) != kiln_tensor_buffer(KP_TENSOR(b)) &&
      kiln_tensor_ndim(t) == kiln_tensor_ndim(KP_TENSOR(b)) && kiln_tensor_device(t) == kiln_tensor_device(KP_TENSOR(b)) &&
      !memcmp(kiln_tensor_shape(t), kiln_tensor_shape(KP_TENSOR(b)), sizeof(int64_t) * kiln_tensor_ndim(t))) {
    status = kiln_tensor_accumulate(t, op == KILN_BINARY_ADD ? 1.0 : -1.0, KP_TENSOR(b));
    if (status != KILN_OK) return kp_raise(status);
    return Py_NewRef(a);
  }
  PyObject *r = kp_binary(op, a, b);
  if (!r || r == Py_NotImplemented) return r;
  kiln_tensor_t *v = KP_TENSOR(r);
  bool same = kiln_tensor_ndim(v) == kiln_tensor_ndim(t) &&
              !memcmp(kiln_tensor_shape(v), kiln_tensor_shape(t), sizeof(int64_t) * kiln_tensor_ndim(t));
  if (!same) {
    PyObject *ws = kp_shape_tuple(kiln_tensor_ndim(t), kiln_tensor_shape(t));
    PyObject *gs = kp_shape_tuple(kiln_tensor_ndim(v), kiln_tensor_shape(v));
    Py_DECREF(r);
    if (ws && gs)
      kp_raise_msg(KILN_SHAPE_MISMATCH, "in-place operator: the result has shape %s, the tensor %s; an in-place update "
                   "cannot grow the tensor: write x = x + y instead", PyUnicode_AsUTF8(PyObject_Repr(gs)),
                   PyUnicode_AsUTF8(PyObject_Repr(ws)));
    Py_XDECREF(ws);
    Py_XDECREF(gs);
    return NULL;
  }
  if (kiln_dtype_class(kiln_tensor_dtype(t)) != KILN_DTYPE_CLASS_FLOAT &&
      kiln_dtype_class(kiln_tensor_dtype(v)) == KILN_DTYPE_CLASS_FLOAT) {
    Py_DECREF(r);
    return kp_raise_msg(KILN_DTYPE_MISMATCH, "in-place operator: the result is %s, the tensor %s; PyTorch refuses that "
                        "cast too: write x = x op y, or convert x first (x = x.float())",
                        kiln_dtype_long_name(kiln_tensor_dtype(v)), kiln_dtype_long_name(kiln_tensor_dtype(t)));
  }
  status = kiln_tensor_copy_into(t, v);
  Py_DECREF(r);
  if (status != KILN_OK) return kp_raise(status);
  return Py_NewRef(a);
}

PyObject *kp_nb_iadd(PyObject *a, PyObject *b) { return kp_inplace(a, b, KILN_BINARY_ADD); }
PyObject *kp_nb_isub(PyObject *a, PyObject *b) { return kp_inplace(a, b, KILN_BINARY_SUB); }
PyObject *kp_nb_imul(PyObject *a, PyObject *b) { return kp_inplace(a, b, KILN_BINARY_MUL); }
PyObject *kp_nb_idiv(PyObject *a, PyObject *b) { return kp_inplace(a, b, KILN_BINARY_DIV); }

/* ---- tables --------------------------------------------------------------------------------------- */

#define KP_NOARGS(fn) (PyCFunction)(void (*)(void))(fn), METH_NOARGS
#define KP_VARKW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS
#define KP_REDUCE_DOC(name, what)                                                                                    \
  #name "(dim=None, keepdim=False, *, axis=None, keepdims=None, dtype=None)\n--\n\n" what " along dim (an int, a "    \
  "tuple of ints, or None for every axis); axis/keepdims are NumPy's names for dim/keepdim."

/* The Array API's array protocol: its namespace (kiln.array_api) and to_device. */
static PyObject *kp_m_array_namespace(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"api_version", NULL};
  PyObject *version = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$O:__array_namespace__", names, &version)) return NULL;
  if (version != Py_None && !(PyUnicode_Check(version) && PyUnicode_CompareWithASCIIString(version, "2021.12") == 0))
    return PyErr_Format(PyExc_ValueError, "kiln.array_api implements the Array API's 2021.12 revision, not %R",
                        version);
  return PyImport_ImportModule("kiln.array_api");
}

static PyObject *kp_m_to_device(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"device", "stream", NULL};
  PyObject *device, *stream = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$O:to_device", names, &device, &stream)) return NULL;
  if (stream != Py_None)
    return PyErr_Format(PyExc_ValueError, "to_device(stream=...): kiln orders work by queue, not by stream");
  return PyObject_CallMethod(self, "to", "O", device);
}

PyMethodDef kp_tensor_torch_methods[] = {
    {"__array_namespace__", (PyCFunction)(void (*)(void))kp_m_array_namespace, METH_VARARGS | METH_KEYWORDS,
     "__array_namespace__(*, api_version=None)\n--\n\nkiln.array_api, the Array API namespace of kiln's tensors."},
    {"to_device", (PyCFunction)(void (*)(void))kp_m_to_device, METH_VARARGS | METH_KEYWORDS,
     "to_device(device, /, *, stream=None)\n--\n\nThe Array API's spelling of to(device)."},
    {"size", (PyCFunction)(void (*)(void))kp_m_size, METH_FASTCALL | METH_KEYWORDS,
     "size(dim=None)\n--\n\nThe shape as a tuple, or the size of one dim (PyTorch's; .shape is the same tuple)."},
    {"numel", KP_NOARGS(kp_m_numel), "numel()\n--\n\nThe number of elements."},
    {"dim", KP_NOARGS(kp_m_dim), "dim()\n--\n\nThe number of dimensions (.ndim)."},
    {"clone", KP_NOARGS(kp_m_clone), "clone()\n--\n\nA copy in new memory on the same device."},
    {"detach", KP_NOARGS(kp_m_detach),
     "detach()\n--\n\nA new tensor object over the same memory (kiln tensors keep no gradient history: the tape does)."},
    {"float", KP_NOARGS(kp_m_float), "float()\n--\n\nAs float32 (this tensor when it already is)."},
    {"double", KP_NOARGS(kp_m_double), "double()\n--\n\nAs float64."},
    {"half", KP_NOARGS(kp_m_half), "half()\n--\n\nAs float16."},
    {"bfloat16", KP_NOARGS(kp_m_bfloat16), "bfloat16()\n--\n\nAs bfloat16."},
    {"long", KP_NOARGS(kp_m_long), "long()\n--\n\nAs int64."},
    {"int", KP_NOARGS(kp_m_int), "int()\n--\n\nAs int32."},
    {"short", KP_NOARGS(kp_m_short), "short()\n--\n\nAs int16."},
    {"bool", KP_NOARGS(kp_m_bool), "bool()\n--\n\nAs bool (nonzero is True)."},
    {"to", KP_VARKW(kp_m_to),
     "to(device=None, dtype=None, *, copy=False)\n--\n\nOn another device and/or in another dtype, in either order "
     "or by keyword (t.to('cpu:1'), t.to(kiln.float64), t.to(other)): this very object when nothing changes."},
    {"view", (PyCFunction)(void (*)(void))kp_m_view, METH_VARARGS,
     "view(*shape)\n--\n\nThe same memory with another shape (one size may be -1); an error when the strides cannot "
     "show it without a copy (then .reshape copies)."},
    {"reshape", (PyCFunction)(void (*)(void))kp_m_reshape, METH_VARARGS,
     "reshape(*shape)\n--\n\nA view with a new shape when the layout allows, else a copy; one size may be -1."},
    {"squeeze", KP_VARKW(kp_m_squeeze), "squeeze(dim=None)\n--\n\nA view without the size-1 dims (or only dim's)."},
    {"unsqueeze", (PyCFunction)(void (*)(void))kp_m_unsqueeze, METH_O,
     "unsqueeze(dim)\n--\n\nA view with a size-1 dim inserted at dim."},
    {"expand", (PyCFunction)(void (*)(void))kp_m_expand, METH_VARARGS,
     "expand(*sizes)\n--\n\nBroadcast to sizes (-1 keeps a size). A copy: kiln has no stride-0 views yet."},
    {"transpose", (PyCFunction)(void (*)(void))kp_m_transpose, METH_VARARGS,
     "transpose(*dims)\n--\n\nA view: two dims swap them (PyTorch's transpose(0, 1)); none reverses every axis; a "
     "full permutation permutes them (NumPy's)."},
    {"sum", KP_VARKW(kp_m_sum), KP_REDUCE_DOC(sum, "The sum (integers and bools sum to int64)")},
    {"mean", KP_VARKW(kp_m_mean), KP_REDUCE_DOC(mean, "The mean (float dtypes)")},
    {"max", KP_VARKW(kp_m_max),
     KP_REDUCE_DOC(max, "The maximum; with an int dim (not axis=), PyTorch's (values, indices) pair")},
    {"min", KP_VARKW(kp_m_min),
     KP_REDUCE_DOC(min, "The minimum; with an int dim (not axis=), PyTorch's (values, indices) pair")},
    {"argmax", KP_VARKW(kp_m_argmax), KP_REDUCE_DOC(argmax, "The index of the first maximum (int32); dim an int")},
    {"argmin", KP_VARKW(kp_m_argmin), KP_REDUCE_DOC(argmin, "The index of the first minimum (int32); dim an int")},
    {NULL, NULL, 0, NULL},
};

PyMethodDef kp_torch_functions[] = {
    {"sum", KP_VARKW(kp_f_sum), "sum(a, dim=None, keepdim=False, *, axis=None, keepdims=None, dtype=None)\n--\n\na.sum(...)."},
    {"mean", KP_VARKW(kp_f_mean), "mean(a, dim=None, keepdim=False, *, axis=None, keepdims=None, dtype=None)\n--\n\na.mean(...)."},
    {"max", KP_VARKW(kp_f_max), "max(a, dim=None, keepdim=False, *, axis=None, keepdims=None, dtype=None)\n--\n\na.max(...)."},
    {"min", KP_VARKW(kp_f_min), "min(a, dim=None, keepdim=False, *, axis=None, keepdims=None, dtype=None)\n--\n\na.min(...)."},
    {"argmax", KP_VARKW(kp_f_argmax), "argmax(a, dim=None, keepdim=False, *, axis=None, keepdims=None)\n--\n\na.argmax(...)."},
    {"argmin", KP_VARKW(kp_f_argmin), "argmin(a, dim=None, keepdim=False, *, axis=None, keepdims=None)\n--\n\na.argmin(...)."},
    {"cat", KP_VARKW(kp_f_cat),
     "cat(tensors, dim=0)\n--\n\nThe tensors joined along dim (one device; dtypes converted to the first's): an empty "
     "result, each input copied into its slice on the device."},
    {"concatenate", KP_VARKW(kp_f_cat), "concatenate(tensors, dim=0)\n--\n\nkiln.cat."},
    {"stack", KP_VARKW(kp_f_stack), "stack(tensors, dim=0)\n--\n\nThe tensors (of one shape) joined along a new dim."},
    {NULL, NULL, 0, NULL},
};

static PyStructSequence_Field kp_minmax_fields[] = {{"values", "the extremes"}, {"indices", "where they are (int32)"},
                                                    {NULL, NULL}};
static PyStructSequence_Desc kp_minmax_desc = {"kiln.return_types.minmax", "max(dim)/min(dim): (values, indices)",
                                               kp_minmax_fields, 2};

int kp_module_init_methods(PyObject *module) {
  kp_minmax_type = PyStructSequence_NewType(&kp_minmax_desc);
  if (!kp_minmax_type) return -1;
  PyObject *dict = kp_tensor_type.tp_dict;
  PyMethodDef *const tables[] = {kp_tensor_torch_methods, kp_tensor_index_methods};
  for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
    for (PyMethodDef *def = tables[t]; def->ml_name; def++) {
      PyObject *descr = PyDescr_NewMethod(&kp_tensor_type, def);
      int rc = descr ? PyDict_SetItemString(dict, def->ml_name, descr) : -1;
      Py_XDECREF(descr);
      if (rc < 0) return -1;
    }
  PyType_Modified(&kp_tensor_type);
  return PyModule_AddFunctions(module, kp_torch_functions);
}
