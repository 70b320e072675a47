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

/* The exact value of an f16 / bf16 (both widen to float32 exactly). */
static double kp_f16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) v = ldexp((double)man, -24); /* zero and subnormals */
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = ldexp((double)(man | 0x400), exp - 25);
  return sign ? -v : v;
}

static double kp_bf16_value(uint16_t b) {
  const uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* One element of `dtype` in host memory as a Python object: bool, int or float. */
static PyObject *kp_host_item(kiln_dtype_t dtype, const unsigned char *p) {
  switch (dtype) {
  case KILN_F32: { float v; memcpy(&v, p, sizeof v); return PyFloat_FromDouble(v); }
  case KILN_F64: { double v; memcpy(&v, p, sizeof v); return PyFloat_FromDouble(v); }
  case KILN_F16: { uint16_t v; memcpy(&v, p, sizeof v); return PyFloat_FromDouble(kp_f16_value(v)); }
  case KILN_BF16: { uint16_t v; memcpy(&v, p, sizeof v); return PyFloat_FromDouble(kp_bf16_value(v)); }
  case KILN_I32: { int32_t v; memcpy(&v, p, sizeof v); return PyLong_FromLong(v); }
  case KILN_I64: { int64_t v; memcpy(&v, p, sizeof v); return PyLong_FromLongLong(v); }
  case KILN_I16: { int16_t v; memcpy(&v, p, sizeof v); return PyLong_FromLong(v); }
  case KILN_I8: return PyLong_FromLong((signed char)p[0]);
  case KILN_U8: return PyLong_FromLong(p[0]);
  case KILN_BOOL: return PyBool_FromLong(p[0] != 0);
  default: break;
  }
  return PyErr_Format(PyExc_TypeError, "a tensor of dtype %s has no Python value", kiln_dtype_name(dtype));
}

/* Host copy of the elements, row-major; malloc'd. */
static void *kp_read_host(kiln_tensor_t *t, size_t *out_count) {
  size_t n = (size_t)kiln_tensor_numel(t), size = kiln_dtype_size(kiln_tensor_dtype(t));
  void *host = malloc(n ? n * size : 8);
  if (!host) {
    PyErr_NoMemory();
    return NULL;
  }
  kiln_status_t status;
  KP_NOGIL(status = kiln_tensor_read(t, host, n * size));
  if (status != KILN_OK) {
    free(host);
    kp_raise(status);
    return NULL;
  }
  *out_count = n;
  return host;
}

/* A bfloat16 tensor's values as a new float32 NumPy array (exact). */
static PyObject *kp_bf16_to_numpy_f32(PyObject *np, kiln_tensor_t *t, PyObject *shape) {
  size_t n;
  uint16_t *host = kp_read_host(t, &n);
  if (!host) return NULL;
  PyObject *arr = PyObject_CallMethod(np, "empty", "Os", shape, "float32");
  Py_buffer view;
  if (arr && PyObject_GetBuffer(arr, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) Py_CLEAR(arr);
  if (arr) {
    for (size_t i = 0; i < n; i++) ((float *)view.buf)[i] = (float)kp_bf16_value(host[i]);
    PyBuffer_Release(&view);
  }
  free(host);
  return arr;
}

PyObject *kp_tensor_to_numpy(kiln_tensor_t *t, PyObject *dtype) {
  const kiln_dtype_t kd = kiln_tensor_dtype(t);
  const bool convert = dtype && dtype != Py_None;
  if (kd == KILN_BF16 && !convert)
    return PyErr_Format(PyExc_TypeError,
                        "NumPy has no bfloat16: convert the tensor first, t.astype(kiln.float32).numpy(), or ask for "
                        "float32 on the way, np.asarray(t, dtype=np.float32) (exact: every bfloat16 is a float32)");
  PyObject *np = kp_numpy();
  if (!np) return NULL;
  PyObject *shape = kp_shape_tuple(kiln_tensor_ndim(t), kiln_tensor_shape(t));
  if (!shape) return NULL;
  PyObject *arr;
  if (kd == KILN_BF16) {
    arr = kp_bf16_to_numpy_f32(np, t, shape);
    Py_DECREF(shape);
    if (!arr) return NULL;
  } else {
    arr = PyObject_CallMethod(np, "empty", "Os", shape, kiln_dtype_long_name(kd));
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
  }
  if (convert) {
    PyObject *cast = PyObject_CallMethod(arr, "astype", "O", dtype);
    Py_DECREF(arr);
    return cast;
  }
  return arr;
}

static PyObject *kp_build_list(const unsigned char *host, kiln_dtype_t dtype, int ndim, const int64_t *shape,
                               size_t *pos) {
  if (ndim == 0) return kp_host_item(dtype, host + (*pos)++ * kiln_dtype_size(dtype));
  PyObject *list = PyList_New((Py_ssize_t)shape[0]);
  for (int64_t i = 0; list && i < shape[0]; i++) {
    PyObject *item = kp_build_list(host, dtype, ndim - 1, shape + 1, pos);
    if (!item) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
  }
  return list;
}

PyObject *kp_tensor_to_list(kiln_tensor_t *t) {
  size_t n, pos = 0;
  void *host = kp_read_host(t, &n);
  if (!host) return NULL;
  PyObject *list = kp_build_list(host, kiln_tensor_dtype(t), kiln_tensor_ndim(t), kiln_tensor_shape(t), &pos);
  free(host);
  return list;
}

PyObject *kp_tensor_item_object(kiln_tensor_t *t) {
  size_t n;
  unsigned char *host = kp_read_host(t, &n);
  if (!host) return NULL;
  PyObject *item = kp_host_item(kiln_tensor_dtype(t), host);
  free(host);
  return item;
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

/* What the numbers of nested lists are: any float, all bools (Python's or
 * NumPy's), and their values as doubles and, while they are integers, exactly
 * as int64 (`ints` NULL once one does not fit). */
typedef struct kp_nested_t {
  double *values;
  int64_t *ints;
  size_t pos;
  bool any_float, all_bool;
} kp_nested_t;

static int kp_nested_fill(PyObject *obj, kp_nested_t *acc) {
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; i++)
      if (kp_nested_fill(PySequence_Fast_GET_ITEM(obj, i), acc) < 0) return -1;
    return 0;
  }
  double v;
  int r = kp_scalar(obj, &v);
  if (r < 0) return -1;
  if (r == 0) {
    PyErr_Format(PyExc_TypeError, "kiln.tensor: an element is a %.100s, not a number", Py_TYPE(obj)->tp_name);
    return -1;
  }
  PyTypeObject *tp = Py_TYPE(obj);
  bool is_bool = PyBool_Check(obj) || !strcmp(tp->tp_name, "numpy.bool_") || !strcmp(tp->tp_name, "numpy.bool");
  if (!is_bool) acc->all_bool = false;
  bool is_int = PyLong_Check(obj) || is_bool;
  /* A NumPy integer scalar counts as an integer. */
  if (!is_int && !PyFloat_Check(obj) && tp->tp_as_number && tp->tp_as_number->nb_index) is_int = true;
  if (!is_int) acc->any_float = true;
  if (acc->ints) {
    long long exact = 0;
    int overflow = 0;
    if (is_int) {
      PyObject *index = PyNumber_Index(obj);
      if (!index) return -1;
      exact = PyLong_AsLongLongAndOverflow(index, &overflow);
      Py_DECREF(index);
      if (exact == -1 && PyErr_Occurred()) return -1;
    }
    if (!is_int || overflow) acc->ints = NULL; /* the caller frees the array it allocated */
    else acc->ints[acc->pos] = exact;
  }
  acc->values[acc->pos++] = v;
  return 0;
}

static kiln_device_t *kp_cpu_device(void) {
  kiln_device_t *cpu = NULL;
  if (kiln_device_find("cpu:0", &cpu) != KILN_OK) return NULL;
  return cpu;
}

/* A tensor of `target` on `device` from host data of `src` (both kiln
 * dtypes): uploaded as it is when they agree, otherwise converted on the CPU
 * by kiln's one cast rule (kiln_tensor_cast) and copied to the device, so the
 * result is the same on every device. */
static kiln_status_t kp_upload(kiln_device_t *device, kiln_dtype_t target, kiln_dtype_t src, int ndim,
                               const int64_t *shape, const void *host, kiln_tensor_t **out) {
  kiln_status_t status;
  if (src == target) {
    KP_NOGIL(status = kiln_tensor_from_host(device, target, ndim, shape, host, out));
    return status;
  }
  /* Where the CPU device is hidden (KILN_DEVICE=opencl:0), on the device
   * itself: kiln_tensor_cast is the same rule there (the conformance suite
   * checks every backend's casts against it). */
  kiln_device_t *cpu = kp_cpu_device();
  if (!cpu) cpu = device;
  kiln_tensor_t *raw = NULL, *cast = NULL;
  KP_NOGIL(status = kiln_tensor_from_host(cpu, src, ndim, shape, host, &raw));
  if (status != KILN_OK) return status;
  status = kiln_tensor_cast(raw, target, &cast);
  kiln_tensor_release(raw);
  if (status != KILN_OK || device == cpu) {
    if (status == KILN_OK) *out = cast;
    return status;
  }
  KP_NOGIL(status = kiln_tensor_copy(cast, device, out));
  kiln_tensor_release(cast);
  return status;
}

/* The range of an integer dtype (bool: 0..1), for the OverflowError that
 * refuses a value that would wrap; false for a float dtype. */
static bool kp_int_range(kiln_dtype_t dtype, double *lo, double *hi) {
  switch (dtype) {
  case KILN_I8: *lo = -128.0, *hi = 127.0; return true;
  case KILN_U8: *lo = 0.0, *hi = 255.0; return true;
  case KILN_I16: *lo = -32768.0, *hi = 32767.0; return true;
  case KILN_I32: *lo = -2147483648.0, *hi = 2147483647.0; return true;
  case KILN_I64: *lo = -9223372036854775808.0, *hi = 9223372036854775807.0; return true;
  default: return false;
  }
}

/* OverflowError: `what` (the value, or "element i (value)") does not fit in `dtype`. */
static PyObject *kp_range_error(const char *what, kiln_dtype_t dtype) {
  static const char *const ranges[KILN_DTYPE_COUNT_] = {
      [KILN_I8] = "-128 to 127", [KILN_U8] = "0 to 255", [KILN_I16] = "-32768 to 32767",
      [KILN_I32] = "-2147483648 to 2147483647", [KILN_I64] = "-9223372036854775808 to 9223372036854775807"};
  return PyErr_Format(PyExc_OverflowError, "kiln.tensor: %s does not fit in %s (%s)%s", what,
                      kiln_dtype_long_name(dtype), ranges[dtype] ? ranges[dtype] : "?",
                      dtype == KILN_I64 ? "" : "; pass a wider dtype (dtype=kiln.int64 or kiln.float32)");
}

static PyObject *kp_from_nested(PyObject *data, kiln_device_t *device, PyObject *dtype_arg) {
  int64_t shape[KILN_MAX_DIMS];
  for (int i = 0; i < KILN_MAX_DIMS; i++) shape[i] = -1;
  int ndim = -1;
  if (kp_nested_shape(data, 0, shape, &ndim) < 0) return NULL;
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  double *values = malloc((n ? n : 1) * sizeof(double));
  int64_t *ints = malloc((n ? n : 1) * sizeof(int64_t));
  if (!values || !ints) {
    free(values);
    free(ints);
    return PyErr_NoMemory();
  }
  kp_nested_t acc = {.values = values, .ints = ints, .pos = 0, .any_float = false, .all_bool = n > 0};
  PyObject *result = NULL;
  kiln_dtype_t dtype;
  if (kp_nested_fill(data, &acc) < 0) goto done;
  /* NumPy's choice for Python data, with kiln's 32-bit defaults: bools stay
   * bool, integers become int32, anything with a float float32. */
  if (kp_dtype_arg(dtype_arg, acc.any_float ? KILN_F32 : acc.all_bool ? KILN_BOOL : KILN_I32, &dtype) < 0) goto done;
  double lo, hi;
  if (kp_int_range(dtype, &lo, &hi)) {
    for (size_t i = 0; i < n; i++) {
      /* int64's limits are no doubles: 2^63 rounds onto the top one. */
      bool fits = dtype != KILN_I64 ? values[i] >= lo && values[i] <= hi
                                    : acc.ints != NULL || (values[i] >= lo && values[i] < 9223372036854775808.0);
      if (!fits) {
        char text[32];
        kp_range_error(kp_double_text(values[i], text), dtype);
        goto done;
      }
    }
  }
  kiln_tensor_t *out = NULL;
  kiln_status_t status;
  if (acc.ints && !acc.any_float && dtype != KILN_F32 && dtype != KILN_F64) {
    /* Integers exactly (an int64 beyond 2^53 stays itself). */
    status = kp_upload(device, dtype, KILN_I64, ndim, shape, ints, &out);
  } else if (dtype == KILN_F32) {
    float *host = malloc((n ? n : 1) * sizeof *host);
    if (!host) {
      PyErr_NoMemory();
      goto done;
    }
    for (size_t i = 0; i < n; i++) host[i] = (float)values[i];
    KP_NOGIL(status = kiln_tensor_from_host(device, KILN_F32, ndim, shape, host, &out));
    free(host);
  } else {
    status = kp_upload(device, dtype, KILN_F64, ndim, shape, values, &out);
  }
  result = kp_result(status, &out);
done:
  free(values);
  free(ints);
  return result;
}

/* The kiln dtype of a buffer's format (native byte order, one item), or -1:
 * big-endian, unsigned wider than a byte, complex, or anything else. */
static int kp_buffer_dtype(const char *format, Py_ssize_t itemsize, kiln_dtype_t *out) {
  const char *f = format ? format : "B";
  if (*f == '<' || *f == '=' || *f == '@' || *f == '!' || *f == '>') {
    if (*f == '>' || *f == '!') return -1; /* big-endian: let NumPy convert */
    f++;
  }
  if (!f[0] || f[1]) return -1;
  switch (*f) {
  case 'f': *out = KILN_F32; return itemsize == 4 ? 0 : -1;
  case 'd': *out = KILN_F64; return itemsize == 8 ? 0 : -1;
  case 'e': *out = KILN_F16; return itemsize == 2 ? 0 : -1;
  case '?': *out = KILN_BOOL; return itemsize == 1 ? 0 : -1;
  case 'B': *out = KILN_U8; return itemsize == 1 ? 0 : -1;
  case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
    switch (itemsize) {
    case 1: *out = KILN_I8; return 0;
    case 2: *out = KILN_I16; return 0;
    case 4: *out = KILN_I32; return 0;
    case 8: *out = KILN_I64; return 0;
    }
    return -1;
  default:
    return -1;
  }
}

/* Element i of a host array of a kiln dtype (not bfloat16) as a double. */
static double kp_host_value(kiln_dtype_t dtype, const unsigned char *base, size_t i) {
  const unsigned char *p = base + i * kiln_dtype_size(dtype);
  switch (dtype) {
  case KILN_F32: { float v; memcpy(&v, p, sizeof v); return v; }
  case KILN_F64: { double v; memcpy(&v, p, sizeof v); return v; }
  case KILN_F16: { uint16_t v; memcpy(&v, p, sizeof v); return kp_f16_value(v); }
  case KILN_I16: { int16_t v; memcpy(&v, p, sizeof v); return v; }
  case KILN_I32: { int32_t v; memcpy(&v, p, sizeof v); return v; }
  case KILN_I64: { int64_t v; memcpy(&v, p, sizeof v); return (double)v; }
  case KILN_I8: return (signed char)p[0];
  default: return p[0]; /* u8, bool */
  }
}

/* 1: done (*out set), 0: not usable here (no exception), -1: error. */
static int kp_from_buffer(PyObject *data, kiln_device_t *device, PyObject *dtype_arg, PyObject **out) {
  Py_buffer view;
  if (PyObject_GetBuffer(data, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
    PyErr_Clear();
    return 0;
  }
  kiln_dtype_t src, dtype;
  if (view.ndim > KILN_MAX_DIMS || kp_buffer_dtype(view.format, view.itemsize, &src) < 0) {
    PyBuffer_Release(&view);
    return 0;
  }
  /* The data's own dtype unless another is asked for. */
  if (kp_dtype_arg(dtype_arg, src, &dtype) < 0) {
    PyBuffer_Release(&view);
    return -1;
  }
  int64_t shape[KILN_MAX_DIMS];
  size_t n = 1;
  for (int i = 0; i < view.ndim; i++) {
    shape[i] = view.shape ? view.shape[i] : (int64_t)(view.len / view.itemsize);
    n *= (size_t)shape[i];
  }
  /* Into a narrower integer dtype: a value that would wrap is refused. */
  double lo, hi;
  if (src != dtype && kp_int_range(dtype, &lo, &hi) && dtype != KILN_I64) {
    for (size_t i = 0; i < n; i++) {
      double v = kp_host_value(src, view.buf, i);
      if (!(v >= lo && v <= hi)) {
        char text[32], what[80];
        snprintf(what, sizeof what, "element %zu (%s)", i, kp_double_text(v, text));
        PyBuffer_Release(&view);
        kp_range_error(what, dtype);
        return -1;
      }
    }
  }
  kiln_tensor_t *t = NULL;
  kiln_status_t status = kp_upload(device, dtype, src, view.ndim, shape, view.buf, &t);
  PyBuffer_Release(&view);
  *out = kp_result(status, &t);
  return *out ? 1 : -1;
}

/* A DLPack producer (a PyTorch tensor: bfloat16 too, which NumPy lacks):
 * viewed by kiln.from_dlpack, then copied. 1 done, 0 not usable, -1 error. */
static int kp_from_dlpack_copy(PyObject *data, kiln_device_t *device, PyObject *dtype_arg, PyObject **out) {
  if (!PyObject_HasAttrString(data, "__dlpack__")) return 0;
  PyObject *mod = PyImport_ImportModule("kiln._kiln");
  PyObject *fn = mod ? PyObject_GetAttrString(mod, "from_dlpack") : NULL;
  Py_XDECREF(mod);
  PyObject *view = fn ? PyObject_CallOneArg(fn, data) : NULL;
  Py_XDECREF(fn);
  if (!view) {
    PyErr_Clear(); /* bool from an older PyTorch, memory of a device kiln lacks: NumPy's turn */
    return 0;
  }
  kiln_dtype_t dtype;
  kiln_tensor_t *src = KP_TENSOR(view), *copy = NULL, *cast = NULL;
  if (kp_dtype_arg(dtype_arg, kiln_tensor_dtype(src), &dtype) < 0) {
    Py_DECREF(view);
    return -1;
  }
  kiln_status_t status;
  if (dtype == kiln_tensor_dtype(src)) {
    KP_NOGIL(status = kiln_tensor_copy(src, device, &copy));
    Py_DECREF(view);
    *out = kp_result(status, &copy);
    return *out ? 1 : -1;
  }
  status = kiln_tensor_cast(src, dtype, &cast);
  Py_DECREF(view);
  if (status == KILN_OK && kiln_tensor_device(cast) != device) {
    KP_NOGIL(status = kiln_tensor_copy(cast, device, &copy));
    kiln_tensor_release(cast);
    cast = copy;
  }
  *out = kp_result(status, &cast);
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
  /* Python's numbers (not numpy.float64, a float subclass that keeps its dtype below). */
  if (PyList_Check(data) || PyTuple_Check(data) || PyFloat_CheckExact(data) || PyLong_Check(data))
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
    /* A NumPy scalar keeps its dtype, as an array of it would. */
    PyObject *np = kp_numpy();
    if (np) {
      PyObject *arr = PyObject_CallMethod(np, "asarray", "O", data);
      if (arr) {
        PyObject *out = NULL;
        int rb = kp_from_buffer(arr, device, dtype_arg, &out);
        Py_DECREF(arr);
        if (rb != 0) return out;
      } else {
        PyErr_Clear();
      }
    } else {
      PyErr_Clear();
    }
    PyObject *f = PyFloat_FromDouble(v);
    if (!f) return NULL;
    PyObject *out = kp_from_nested(f, device, dtype_arg);
    Py_DECREF(f);
    return out;
  }
  if (!PyObject_CheckBuffer(data)) {
    PyObject *out = NULL;
    int rd = kp_from_dlpack_copy(data, device, dtype_arg, &out);
    if (rd != 0) return out;
  }
  /* Anything else NumPy understands (non-contiguous or big-endian arrays,
   * objects with __array__): through numpy.ascontiguousarray, keeping the
   * dtype; a dtype kiln lacks (uint16, complex64 ...) is converted only when
   * dtype= names the one to take. */
  PyObject *np = kp_numpy();
  if (!np) {
    PyErr_Clear();
    return PyErr_Format(PyExc_TypeError, "kiln.tensor: cannot read a %.100s (a number, nested lists, or an object with "
                        "the buffer protocol; NumPy is not importable for anything else)", Py_TYPE(data)->tp_name);
  }
  PyObject *arr = PyObject_CallMethod(np, "ascontiguousarray", "O", data);
  if (!arr) return NULL;
  PyObject *np_dtype = PyObject_GetAttrString(arr, "dtype");
  PyObject *native = np_dtype ? PyObject_CallMethod(np_dtype, "newbyteorder", "s", "=") : NULL;
  PyObject *name = np_dtype ? PyObject_GetAttrString(np_dtype, "name") : NULL;
  Py_XDECREF(np_dtype);
  if (!native || !name) {
    Py_XDECREF(native);
    Py_XDECREF(name);
    Py_DECREF(arr);
    return NULL;
  }
  kiln_dtype_t own;
  int has_own = kp_dtype_arg(name, KILN_F32, &own) == 0;
  if (!has_own) PyErr_Clear();
  PyObject *conv = NULL;
  if (has_own) {
    conv = PyObject_CallMethod(arr, "astype", "O", native); /* native byte order */
  } else if (dtype_arg && dtype_arg != Py_None) {
    kiln_dtype_t d;
    if (kp_dtype_arg(dtype_arg, KILN_F32, &d) == 0)
      conv = PyObject_CallMethod(arr, "astype", "s", d == KILN_BF16 ? "float32" : kiln_dtype_long_name(d));
  } else {
    const char *text = PyUnicode_AsUTF8(name);
    PyErr_Format(PyExc_TypeError,
                 "kiln.tensor: a %.100s array has no kiln dtype (kiln has bool, int8, uint8, int16, int32, int64, "
                 "float16, bfloat16, float32 and float64); pass dtype= to convert it (e.g. dtype=kiln.int64), or "
                 "convert it first (.astype(numpy.int64))",
                 text ? text : "?");
  }
  Py_DECREF(native);
  Py_DECREF(name);
  Py_DECREF(arr);
  if (!conv) return NULL;
  PyObject *out = NULL;
  r = kp_from_buffer(conv, device, dtype_arg, &out);
  Py_DECREF(conv);
  if (r == 0) return PyErr_Format(PyExc_TypeError, "kiln.tensor: cannot read a %.100s", Py_TYPE(data)->tp_name);
  return out;
}
