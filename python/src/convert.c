/* python/src/convert.c: data between Python and kiln tensors: numbers, nested lists, the buffer protocol and NumPy in; NumPy arrays and lists out (copies, through host memory). */
#include "kilnpy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int kp_scalar(PyObject *obj, double *out) {
  if (PyFloat_CheckExact(obj)) {
    *out = PyFloat_AS_DOUBLE(obj);
    return 1;
  }
  if (PyLong_Check(obj)) {
    *out = PyLong_AsDouble(obj);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 1;
  }
  if (KP_IS_TENSOR(obj)) return 0;
  /* NumPy scalars and other numbers: a number that is not a container. */
  PyTypeObject *tp = Py_TYPE(obj);
  if (!tp->tp_as_number || (!tp->tp_as_number->nb_float && !tp->tp_as_number->nb_index)) return 0;
  if ((tp->tp_as_sequence && tp->tp_as_sequence->sq_length) || (tp->tp_as_mapping && tp->tp_as_mapping->mp_length))
    return 0;
  *out = PyFloat_AsDouble(obj);
  return *out == -1.0 && PyErr_Occurred() ? -1 : 1;
}

static PyObject *kp_numpy_module;

PyObject *kp_numpy(void) {
  if (!kp_numpy_module) {
    kp_numpy_module = PyImport_ImportModule("numpy");
    if (!kp_numpy_module) return NULL;
  }
  return kp_numpy_module;
}

/* ---- to the host ---------------------------------------------------------------------------- */

PyObject *kp_tensor_to_numpy(kiln_tensor_t *t, PyObject *dtype) {
  PyObject *np = kp_numpy();
  if (!np) return NULL;
  PyObject *shape = kp_shape_tuple(kiln_tensor_ndim(t), kiln_tensor_shape(t));
  if (!shape) return NULL;
  PyObject *arr = PyObject_CallMethod(np, "empty", "Os", shape, kiln_tensor_dtype(t) == KILN_I32 ? "int32" : "float32");
  Py_DECREF(shape);
  if (!arr) return NULL;
  Py_buffer view;
  if (PyObject_GetBuffer(arr, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
    Py_DECREF(arr);
    return NULL;
  }
  kiln_status_t status;
  KP_NOGIL(status = kiln_tensor_read(t, view.buf, (size_t)view.len));
  PyBuffer_Release(&view);
  if (status != KILN_OK) {
    Py_DECREF(arr);
    return kp_raise(status);
  }
  if (dtype && dtype != Py_None) {
    PyObject *cast = PyObject_CallMethod(arr, "astype", "O", dtype);
    Py_DECREF(arr);
    return cast;
  }
  return arr;
}

/* Host copy of the elements, row-major; malloc'd. */
static void *kp_read_host(kiln_tensor_t *t, size_t *out_count) {
  size_t n = (size_t)kiln_tensor_numel(t);
  void *host = malloc(n ? n * 4 : 4);
  if (!host) {
    PyErr_NoMemory();
    return NULL;
  }
  kiln_status_t status;
  KP_NOGIL(status = kiln_tensor_read(t, host, n * 4));
  if (status != KILN_OK) {
    free(host);
    kp_raise(status);
    return NULL;
  }
  *out_count = n;
  return host;
}

static PyObject *kp_build_list(const void *host, bool is_int, int ndim, const int64_t *shape, size_t *pos) {
  if (ndim == 0) {
    size_t i = (*pos)++;
    return is_int ? PyLong_FromLong(((const int32_t *)host)[i]) : PyFloat_FromDouble(((const float *)host)[i]);
  }
  PyObject *list = PyList_New((Py_ssize_t)shape[0]);
  for (int64_t i = 0; list && i < shape[0]; i++) {
    PyObject *item = kp_build_list(host, is_int, ndim - 1, shape + 1, pos);
    if (!item) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
  }
  return list;
}

PyObject *kp_tensor_to_list(kiln_tensor_t *t) {
  size_t n, pos = 0;
  void *host = kp_read_host(t, &n);
  if (!host) return NULL;
  PyObject *list = kp_build_list(host, kiln_tensor_dtype(t) == KILN_I32, kiln_tensor_ndim(t), kiln_tensor_shape(t), &pos);
  free(host);
  return list;
}

/* ---- from host data -------------------------------------------------------------------------- */

/* Nested lists and tuples of numbers: their shape, checked rectangular. */
static int kp_nested_shape(PyObject *obj, int depth, int64_t shape[KILN_MAX_DIMS], int *ndim) {
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
    if (*ndim < 0) *ndim = depth;
    else if (*ndim != depth) goto ragged;
    return 0;
  }
  if (depth >= KILN_MAX_DIMS) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "the data nest deeper than %d levels; kiln tensors have at most %d dimensions",
                 KILN_MAX_DIMS, KILN_MAX_DIMS);
    return -1;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
  if (*ndim >= 0 && depth >= *ndim) goto ragged;
  if (*ndim < 0 || shape[depth] < 0) {
    if (*ndim < 0 && n == 0) {
      shape[depth] = 0;
      *ndim = depth + 1;
      return 0;
    }
  }
  if (*ndim >= 0 && depth < *ndim && shape[depth] != n) goto ragged;
  shape[depth] = n;
  for (Py_ssize_t i = 0; i < n; i++)
    if (kp_nested_shape(PySequence_Fast_GET_ITEM(obj, i), depth + 1, shape, ndim) < 0) return -1;
  return 0;
ragged:
  kp_raise_msg(KILN_SHAPE_MISMATCH, "the nested lists are ragged (their lengths or depths differ); a tensor needs a "
               "rectangular shape");
  return -1;
}

static int kp_nested_fill(PyObject *obj, double *values, size_t *pos, bool *any_float) {
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; i++)
      if (kp_nested_fill(PySequence_Fast_GET_ITEM(obj, i), values, pos, any_float) < 0) return -1;
    return 0;
  }
  double v;
  int r = kp_scalar(obj, &v);
  if (r < 0) return -1;
  if (r == 0) {
    PyErr_Format(PyExc_TypeError, "kiln.tensor: an element is a %.100s, not a number", Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (!PyLong_Check(obj)) {
    /* A NumPy integer scalar counts as an integer. */
    PyTypeObject *tp = Py_TYPE(obj);
    if (PyFloat_Check(obj) || !tp->tp_as_number || !tp->tp_as_number->nb_index) *any_float = true;
  }
  values[(*pos)++] = v;
  return 0;
}

static kiln_status_t kp_upload_doubles(kiln_device_t *device, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                                       const double *values, size_t n, kiln_tensor_t **out) {
  void *host = malloc(n ? n * 4 : 4);
  if (!host) return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln.tensor: cannot allocate %zu bytes of host memory", n * 4);
  for (size_t i = 0; i < n; i++) {
    if (dtype == KILN_I32) ((int32_t *)host)[i] = (int32_t)values[i];
    else ((float *)host)[i] = (float)values[i];
  }
  kiln_status_t status;
  KP_NOGIL(status = kiln_tensor_from_host(device, dtype, ndim, shape, host, out));
  free(host);
  return status;
}

static PyObject *kp_from_nested(PyObject *data, kiln_device_t *device, PyObject *dtype_arg) {
  int64_t shape[KILN_MAX_DIMS];
  for (int i = 0; i < KILN_MAX_DIMS; i++) shape[i] = -1;
  int ndim = -1;
  if (kp_nested_shape(data, 0, shape, &ndim) < 0) return NULL;
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  double *values = malloc((n ? n : 1) * sizeof(double));
  if (!values) return PyErr_NoMemory();
  size_t pos = 0;
  bool any_float = false;
  if (kp_nested_fill(data, values, &pos, &any_float) < 0) {
    free(values);
    return NULL;
  }
  kiln_dtype_t dtype;
  if (kp_dtype_arg(dtype_arg, any_float ? KILN_F32 : KILN_I32, &dtype) < 0) {
    free(values);
    return NULL;
  }
  if (dtype == KILN_I32) {
    for (size_t i = 0; i < n; i++) {
      if (!(values[i] >= -2147483648.0 && values[i] <= 2147483647.0)) {
        char text[32];
        kp_double_text(values[i], text); /* before the values go */
        free(values);
        return PyErr_Format(PyExc_OverflowError, "kiln.tensor: %s does not fit in int32 (-2147483648 to 2147483647); "
                            "pass dtype=kiln.float32 for larger numbers", text);
      }
    }
  }
  kiln_tensor_t *out = NULL;
  kiln_status_t status = kp_upload_doubles(device, dtype, ndim, shape, values, n, &out);
  free(values);
  return kp_result(status, &out);
}

/* Element i of a buffer of format `f` (one character) as a double. */
static int kp_buffer_kind(const char *format, char *out_code, bool *out_float) {
  const char *f = format ? format : "B";
  if (*f == '<' || *f == '=' || *f == '@' || *f == '!' || *f == '>') {
    if (*f == '>' || *f == '!') return -1; /* big-endian: let NumPy convert */
    f++;
  }
  if (!f[0] || f[1]) return -1;
  switch (*f) {
  case 'f': case 'd':
    *out_float = true;
    break;
  case 'b': case 'B': case 'h': case 'H': case 'i': case 'I': case 'l': case 'L': case 'q': case 'Q': case '?':
  case 'n': case 'N':
    *out_float = false;
    break;
  default:
    return -1;
  }
  *out_code = *f;
  return 0;
}

static double kp_buffer_get(const char *p, char code, size_t i) {
  switch (code) {
  case 'f': return ((const float *)p)[i];
  case 'd': return ((const double *)p)[i];
  case 'b': return ((const signed char *)p)[i];
  case 'B': return ((const unsigned char *)p)[i];
  case '?': return ((const _Bool *)p)[i];
  case 'h': return ((const short *)p)[i];
  case 'H': return ((const unsigned short *)p)[i];
  case 'i': return ((const int *)p)[i];
  case 'I': return ((const unsigned int *)p)[i];
  case 'l': return (double)((const long *)p)[i];
  case 'L': return (double)((const unsigned long *)p)[i];
  case 'q': return (double)((const long long *)p)[i];
  case 'Q': return (double)((const unsigned long long *)p)[i];
  case 'n': return (double)((const Py_ssize_t *)p)[i];
  case 'N': return (double)((const size_t *)p)[i];
  }
  return 0;
}

/* 1: done (*out set), 0: not usable here (no exception), -1: error. */
static int kp_from_buffer(PyObject *data, kiln_device_t *device, PyObject *dtype_arg, PyObject **out) {
  Py_buffer view;
  if (PyObject_GetBuffer(data, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
    PyErr_Clear();
    return 0;
  }
  char code;
  bool is_float;
  if (view.ndim > KILN_MAX_DIMS || kp_buffer_kind(view.format, &code, &is_float) < 0) {
    PyBuffer_Release(&view);
    return 0;
  }
  kiln_dtype_t dtype;
  if (kp_dtype_arg(dtype_arg, is_float ? KILN_F32 : KILN_I32, &dtype) < 0) {
    PyBuffer_Release(&view);
    return -1;
  }
  int64_t shape[KILN_MAX_DIMS];
  size_t n = 1;
  for (int i = 0; i < view.ndim; i++) {
    shape[i] = view.shape ? view.shape[i] : (int64_t)(view.len / view.itemsize);
    n *= (size_t)shape[i];
  }
  int ndim = view.ndim;
  kiln_tensor_t *t = NULL;
  kiln_status_t status;
  bool direct = (dtype == KILN_F32 && code == 'f') || (dtype == KILN_I32 && code == 'i' && view.itemsize == 4);
  if (direct) {
    KP_NOGIL(status = kiln_tensor_from_host(device, dtype, ndim, shape, view.buf, &t));
  } else {
    void *host = malloc(n ? n * 4 : 4);
    if (!host) {
      PyBuffer_Release(&view);
      PyErr_NoMemory();
      return -1;
    }
    for (size_t i = 0; i < n; i++) {
      double v = kp_buffer_get(view.buf, code, i);
      if (dtype == KILN_I32) {
        if (!(v >= -2147483648.0 && v <= 2147483647.0)) {
          char text[32];
          free(host);
          PyBuffer_Release(&view);
          PyErr_Format(PyExc_OverflowError, "kiln.tensor: element %zu (%s) does not fit in int32 (-2147483648 to "
                       "2147483647)", i, kp_double_text(v, text));
          return -1;
        }
        ((int32_t *)host)[i] = (int32_t)v;
      } else {
        ((float *)host)[i] = (float)v;
      }
    }
    KP_NOGIL(status = kiln_tensor_from_host(device, dtype, ndim, shape, host, &t));
    free(host);
  }
  PyBuffer_Release(&view);
  *out = kp_result(status, &t);
  return *out ? 1 : -1;
}

PyObject *kp_tensor_from_object(PyObject *data, kiln_device_t *device, PyObject *dtype_arg) {
  if (KP_IS_TENSOR(data)) {
    kiln_dtype_t dtype;
    kiln_tensor_t *src = KP_TENSOR(data), *copy = NULL, *cast = NULL;
    if (kp_dtype_arg(dtype_arg, kiln_tensor_dtype(src), &dtype) < 0) return NULL;
    kiln_status_t status = kiln_tensor_copy(src, device, &copy);
    if (status != KILN_OK) return kp_raise(status);
    if (dtype == kiln_tensor_dtype(src)) return kp_tensor_wrap(copy);
    status = kiln_tensor_cast(copy, dtype, &cast);
    kiln_tensor_release(copy);
    return kp_result(status, &cast);
  }
  if (PyList_Check(data) || PyTuple_Check(data) || PyFloat_Check(data) || PyLong_Check(data))
    return kp_from_nested(data, device, dtype_arg);
  if (PyObject_CheckBuffer(data)) {
    PyObject *out = NULL;
    int r = kp_from_buffer(data, device, dtype_arg, &out);
    if (r != 0) return out;
  }
  double v;
  int r = kp_scalar(data, &v);
  if (r < 0) return NULL;
  if (r > 0) {
    PyObject *f = PyFloat_FromDouble(v);
    if (!f) return NULL;
    PyObject *out = kp_from_nested(f, device, dtype_arg);
    Py_DECREF(f);
    return out;
  }
  /* Anything else NumPy understands (non-contiguous arrays, other dtypes,
   * objects with __array__): through numpy.ascontiguousarray. */
  PyObject *np = kp_numpy();
  if (!np) {
    PyErr_Clear();
    return PyErr_Format(PyExc_TypeError, "kiln.tensor: cannot read a %.100s (a number, nested lists, or an object with "
                        "the buffer protocol; NumPy is not importable for anything else)", Py_TYPE(data)->tp_name);
  }
  PyObject *arr = PyObject_CallMethod(np, "ascontiguousarray", "O", data);
  if (!arr) return NULL;
  PyObject *kind = PyObject_GetAttrString(arr, "dtype");
  PyObject *kind_char = kind ? PyObject_GetAttrString(kind, "kind") : NULL;
  Py_XDECREF(kind);
  if (!kind_char) {
    Py_DECREF(arr);
    return NULL;
  }
  const char *k = PyUnicode_AsUTF8(kind_char);
  const char *target = k && (k[0] == 'f' || k[0] == 'c') ? "float32" : (k && (k[0] == 'i' || k[0] == 'u' || k[0] == 'b')) ? "int32" : NULL;
  Py_DECREF(kind_char);
  if (!target) {
    Py_DECREF(arr);
    return PyErr_Format(PyExc_TypeError, "kiln.tensor: a %.100s holds neither numbers nor booleans", Py_TYPE(data)->tp_name);
  }
  if (dtype_arg && dtype_arg != Py_None) {
    kiln_dtype_t d;
    if (kp_dtype_arg(dtype_arg, KILN_F32, &d) < 0) {
      Py_DECREF(arr);
      return NULL;
    }
    target = d == KILN_I32 ? "int32" : "float32";
  }
  PyObject *conv = PyObject_CallMethod(np, "ascontiguousarray", "Os", arr, target);
  Py_DECREF(arr);
  if (!conv) return NULL;
  PyObject *out = NULL;
  r = kp_from_buffer(conv, device, NULL, &out);
  Py_DECREF(conv);
  if (r == 0) return PyErr_Format(PyExc_TypeError, "kiln.tensor: cannot read a %.100s", Py_TYPE(data)->tp_name);
  return out;
}

