/* python/src/tensor.c: kiln.Tensor (its attributes, operators, movement between devices and to NumPy) and kiln.DType. */
#include "kilnpy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- dtypes -------------------------------------------------------------------------- */

/* One object per kiln dtype, in kiln_dtype_t order; `name` is NumPy's and
 * the Array API's, `format` the buffer protocol's character ('\0' for
 * bfloat16, which has none). */
kp_dtype_t kp_dtypes[KILN_DTYPE_COUNT_] = {
#define KP_DTYPE_ROW_(E, short_name_, long_name_, size, dl_code, dl_bits, cls)                                         \
  [KILN_##E] = {PyObject_HEAD_INIT(&kp_dtype_type).dtype = KILN_##E, .name = long_name_, .short_name = short_name_},
    KILN_DTYPES(KP_DTYPE_ROW_)
#undef KP_DTYPE_ROW_
};

static const char kp_dtype_formats[KILN_DTYPE_COUNT_] = {
    [KILN_F32] = 'f', [KILN_I32] = 'i', [KILN_F16] = 'e', [KILN_BF16] = '\0', [KILN_F64] = 'd',
    [KILN_I64] = 'q', [KILN_I8] = 'b',  [KILN_U8] = 'B',  [KILN_I16] = 'h',   [KILN_BOOL] = '?',
};

PyObject *kp_dtype_object(kiln_dtype_t dtype) {
  return (unsigned)dtype < KILN_DTYPE_COUNT_ ? (PyObject *)&kp_dtypes[dtype] : (PyObject *)&kp_dtypes[KILN_F32];
}

/* kiln's names in both forms ("float64", "f64"), NumPy's type strings
 * ("<f8", "f8", "?", "|b1"), PyTorch's ("torch.float64", "torch.half",
 * "torch.long"), Python's ("float", "int", "bool"). */
static int kp_dtype_from_name(const char *name, kiln_dtype_t *out) {
  if (!strncmp(name, "torch.", 6)) {
    static const struct {
      const char *name;
      kiln_dtype_t dtype;
    } torch_names[] = {{"half", KILN_F16}, {"float", KILN_F32}, {"double", KILN_F64}, {"short", KILN_I16},
                       {"int", KILN_I32},  {"long", KILN_I64}};
    name += 6;
    for (size_t i = 0; i < sizeof torch_names / sizeof torch_names[0]; i++)
      if (!strcmp(name, torch_names[i].name)) {
        *out = torch_names[i].dtype;
        return 1;
      }
  }
  if (!strcmp(name, "float")) {
    *out = KILN_F32;
    return 1;
  }
  if (!strcmp(name, "int")) {
    *out = KILN_I32;
    return 1;
  }
  if (!strcmp(name, "bool_") || !strcmp(name, "b1")) { /* numpy.bool_'s __name__, and its type string */
    *out = KILN_BOOL;
    return 1;
  }
  if (kiln_dtype_from_name(name, out) == KILN_OK) return 1;
  kiln_clear_error();
  /* NumPy's type strings: a byte order of this machine, a kind and a size. */
  const char *p = name;
  if (*p == '<' || *p == '=' || *p == '|') p++;
  if (p[0] && !p[1]) {
    for (int d = 0; d < KILN_DTYPE_COUNT_; d++)
      if (kp_dtype_formats[d] && kp_dtype_formats[d] == p[0]) {
        *out = (kiln_dtype_t)d;
        return 1;
      }
    if (p[0] == 'l' && sizeof(long) == 8) {
      *out = KILN_I64;
      return 1;
    }
    return 0;
  }
  static const struct {
    const char *code;
    kiln_dtype_t dtype;
  } codes[] = {{"f2", KILN_F16}, {"f4", KILN_F32}, {"f8", KILN_F64}, {"i1", KILN_I8},  {"u1", KILN_U8},
               {"i2", KILN_I16}, {"i4", KILN_I32}, {"i8", KILN_I64}, {"b1", KILN_BOOL}};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (!strcmp(p, codes[i].code)) {
      *out = codes[i].dtype;
      return 1;
    }
  return 0;
}

int kp_dtype_arg(PyObject *arg, kiln_dtype_t fallback, kiln_dtype_t *out) {
  if (!arg || arg == Py_None) {
    *out = fallback;
    return 0;
  }
  if (Py_IS_TYPE(arg, &kp_dtype_type)) {
    *out = ((kp_dtype_t *)arg)->dtype;
    return 0;
  }
  if (arg == (PyObject *)&PyFloat_Type) {
    *out = KILN_F32;
    return 0;
  }
  if (arg == (PyObject *)&PyLong_Type) {
    *out = KILN_I32;
    return 0;
  }
  if (arg == (PyObject *)&PyBool_Type) {
    *out = KILN_BOOL;
    return 0;
  }
  PyObject *name = NULL;
  if (PyUnicode_Check(arg)) name = Py_NewRef(arg);
  else if (PyType_Check(arg)) name = PyObject_GetAttrString(arg, "__name__"); /* numpy.float32 */
  else {
    name = PyObject_GetAttrString(arg, "name"); /* numpy.dtype('float32') */
    if (!name) {
      PyErr_Clear();
      name = PyObject_Str(arg); /* torch.float32 */
    }
  }
  if (!name) PyErr_Clear();
  const char *text = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  if (!text) PyErr_Clear();
  int found = text ? kp_dtype_from_name(text, out) : 0;
  if (!found) {
    PyObject *r = PyObject_Repr(arg);
    if (!r) PyErr_Clear();
    kp_raise_msg(KILN_DTYPE_MISMATCH,
                 "dtype %s is not one kiln has: kiln has bool, int8, uint8, int16, int32, int64, float16, bfloat16, "
                 "float32 and float64 (kiln.float64, 'float64', numpy.float64 or torch.float64 all name one); "
                 "convert the data to one of them first",
                 r ? PyUnicode_AsUTF8(r) : "?");
    Py_XDECREF(r);
  }
  Py_XDECREF(name);
  return found ? 0 : -1;
}

char kp_dtype_format(kiln_dtype_t dtype) {
  return (unsigned)dtype < KILN_DTYPE_COUNT_ ? kp_dtype_formats[dtype] : '\0';
}

static PyObject *kp_dtype_repr(kp_dtype_t *d) { return PyUnicode_FromFormat("kiln.%s", d->name); }
static PyObject *kp_dtype_str(kp_dtype_t *d) { return PyUnicode_FromString(d->name); }

static PyObject *kp_dtype_richcompare(PyObject *a, PyObject *b, int op) {
  if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  int equal;
  if (Py_IS_TYPE(b, &kp_dtype_type)) {
    equal = a == b;
  } else if (PyUnicode_Check(b)) {
    kiln_dtype_t d;
    const char *text = PyUnicode_AsUTF8(b);
    if (!text) return NULL;
    equal = kp_dtype_from_name(text, &d) && d == ((kp_dtype_t *)a)->dtype;
  } else {
    Py_RETURN_NOTIMPLEMENTED;
  }
  return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static Py_hash_t kp_dtype_hash(kp_dtype_t *d) { return (Py_hash_t)d->dtype + 0x6b696c6e; }

static PyMemberDef kp_dtype_members[] = {
    {"name", T_STRING, offsetof(kp_dtype_t, name), READONLY, "the Array API's (and NumPy's) name: 'float32', 'bfloat16'"},
    {"short_name", T_STRING, offsetof(kp_dtype_t, short_name), READONLY, "kiln's name: 'f32', 'bf16'"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *kp_dtype_itemsize(kp_dtype_t *d, void *closure) {
  return PyLong_FromSize_t(kiln_dtype_size(d->dtype));
}

static PyGetSetDef kp_dtype_getset[] = {
    {"itemsize", (getter)kp_dtype_itemsize, NULL, "bytes per element", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kp_dtype_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.DType",
    .tp_basicsize = sizeof(kp_dtype_t),
    .tp_repr = (reprfunc)kp_dtype_repr,
    .tp_str = (reprfunc)kp_dtype_str,
    .tp_hash = (hashfunc)kp_dtype_hash,
    .tp_richcompare = kp_dtype_richcompare,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An element type: kiln.bool, int8, uint8, int16, int32, int64, float16, bfloat16, float32, float64. "
              "Compares equal to its name ('float32', 'f32').",
    .tp_members = kp_dtype_members,
    .tp_getset = kp_dtype_getset,
};

/* ---- argument helpers ------------------------------------------------------------------ */

kiln_tensor_t *kp_tensor_arg(PyObject *obj, const char *what) {
  if (KP_IS_TENSOR(obj)) return KP_TENSOR(obj);
  PyErr_Format(PyExc_TypeError,
               "%s must be a kiln.Tensor, not %.100s (kiln.tensor(x) copies data into one; kiln.from_dlpack(x) "
               "shares it)",
               what, Py_TYPE(obj)->tp_name);
  return NULL;
}

int kp_shape_arg(PyObject *arg, int64_t shape[KILN_MAX_DIMS], const char *what) {
  if (PyLong_Check(arg)) {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    shape[0] = v;
    return 1;
  }
  PyObject *seq = PySequence_Fast(arg, "");
  if (!seq) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s must be an int or a sequence of ints, not %.100s", what, Py_TYPE(arg)->tp_name);
    return -1;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > KILN_MAX_DIMS) {
    Py_DECREF(seq);
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s has %zd dimensions; kiln tensors have at most %d", what, n, KILN_MAX_DIMS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
    PyObject *index = PyNumber_Index(item);
    if (!index) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_TypeError, "%s[%zd] must be an int, not %.100s", what, i, Py_TYPE(item)->tp_name);
      return -1;
    }
    shape[i] = PyLong_AsLongLong(index);
    Py_DECREF(index);
    if (shape[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  return (int)n;
}

const char *kp_double_text(double v, char buf[32]) {
  /* The shortest text that reads back as v (as Python's repr), so a message
   * shows 1099511627776 or 1e+300 rather than %g's 1.09951e+12; a whole
   * number below 2^63 in full (300, not 3e+02). */
  if (v > -9.2e18 && v < 9.2e18 && v == (double)(long long)v) {
    snprintf(buf, 32, "%lld", (long long)v);
    return buf;
  }
  for (int precision = 1; precision <= 17; precision++) {
    snprintf(buf, 32, "%.*g", precision, v);
    if (strtod(buf, NULL) == v || v != v) break;
  }
  return buf;
}

int kp_int_arg(PyObject *obj, const char *what, long long low, long long high, long long *out) {
  PyObject *index = PyNumber_Index(obj);
  if (!index) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(obj)->tp_name);
    }
    return -1;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  if (v == -1 && PyErr_Occurred()) {
    Py_DECREF(index);
    return -1;
  }
  if (overflow || v < low || v > high) {
    /* Refused, never wrapped: a C int would keep the value modulo 2**32. */
    PyErr_Format(PyExc_OverflowError, "%s %S is out of range: it must lie in [%lld, %lld]", what, index, low, high);
    Py_DECREF(index);
    return -1;
  }
  Py_DECREF(index);
  *out = v;
  return 0;
}

int kp_int32_arg(PyObject *obj, const char *what, int32_t *out) {
  long long v;
  if (kp_int_arg(obj, what, INT32_MIN, INT32_MAX, &v) < 0) return -1;
  *out = (int32_t)v;
  return 0;
}

int kp_int32_seq_arg(PyObject *arg, const char *what, int max, int32_t *out) {
  PyObject *seq = PySequence_Fast(arg, "");
  if (!seq) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s must be an int or a sequence of ints, not %.100s", what, Py_TYPE(arg)->tp_name);
    return -1;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > max) {
    Py_DECREF(seq);
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s has %zd entries; it takes at most %d", what, n, max);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    char name[96];
    snprintf(name, sizeof name, "%s[%zd]", what, i);
    if (kp_int32_arg(PySequence_Fast_GET_ITEM(seq, i), name, &out[i]) < 0) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  return (int)n;
}

PyObject *kp_shape_tuple(int ndim, const int64_t *shape) {
  PyObject *t = PyTuple_New(ndim);
  if (!t) return NULL;
  for (int i = 0; i < ndim; i++) {
    PyObject *v = PyLong_FromLongLong(shape[i]);
    if (!v) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}

/* ---- the Tensor object ------------------------------------------------------------------
 * A free list keeps the objects of short-lived results (the `a + b` of a
 * loop) so that an operation from Python costs kiln's enqueue and little
 * more. Guarded by the GIL. */

#define KP_FREE_MAX 256
static kp_tensor_t *kp_free_list[KP_FREE_MAX];
static int kp_free_count;

PyObject *kp_tensor_wrap(kiln_tensor_t *t) {
  kp_tensor_t *o;
  if (kp_free_count > 0) {
    o = kp_free_list[--kp_free_count];
  } else {
    o = PyObject_Malloc(sizeof *o);
    if (!o) {
      kiln_tensor_release(t);
      return PyErr_NoMemory();
    }
  }
  PyObject_Init((PyObject *)o, &kp_tensor_type);
  o->tensor = t;
  o->weakrefs = NULL;
  o->imported = false;
  o->ag_param = NULL;
  o->ag_recording = 0;
  return (PyObject *)o;
}

static void kp_tensor_dealloc(kp_tensor_t *o) {
  if (o->weakrefs) PyObject_ClearWeakRefs((PyObject *)o);
  if (o->ag_param || o->ag_recording) kp_ag_forget(o);
  kiln_tensor_t *t = o->tensor;
  o->tensor = NULL;
  if (kp_free_count < KP_FREE_MAX) kp_free_list[kp_free_count++] = o;
  else PyObject_Free(o);
  /* Last: releasing memory imported through DLPack can run its producer's
   * deleter, which may run Python code. */
  kiln_tensor_release(t);
}

static Py_hash_t kp_tensor_hash(PyObject *o) {
  /* Identity, as PyTorch's tensors: == builds a tensor, so it cannot serve a dict. */
  Py_hash_t h = (Py_hash_t)((uintptr_t)o >> 4);
  return h == -1 ? -2 : h;
}

/* ---- attributes -------------------------------------------------------------------------- */

static PyObject *kp_tensor_get_shape(kp_tensor_t *o, void *c) {
  return kp_shape_tuple(kiln_tensor_ndim(o->tensor), kiln_tensor_shape(o->tensor));
}
static PyObject *kp_tensor_get_strides(kp_tensor_t *o, void *c) {
  return kp_shape_tuple(kiln_tensor_ndim(o->tensor), kiln_tensor_strides(o->tensor));
}
static PyObject *kp_tensor_get_ndim(kp_tensor_t *o, void *c) { return PyLong_FromLong(kiln_tensor_ndim(o->tensor)); }
static PyObject *kp_tensor_get_dtype(kp_tensor_t *o, void *c) {
  return Py_NewRef(kp_dtype_object(kiln_tensor_dtype(o->tensor)));
}
static PyObject *kp_tensor_get_device(kp_tensor_t *o, void *c) {
  return kp_device_object(kiln_tensor_device(o->tensor));
}
static PyObject *kp_tensor_get_itemsize(kp_tensor_t *o, void *c) {
  return PyLong_FromSize_t(kiln_dtype_size(kiln_tensor_dtype(o->tensor)));
}
static PyObject *kp_tensor_get_nbytes(kp_tensor_t *o, void *c) {
  return PyLong_FromLongLong(kiln_tensor_numel(o->tensor) * (long long)kiln_dtype_size(kiln_tensor_dtype(o->tensor)));
}
static PyObject *kp_tensor_get_contiguous(kp_tensor_t *o, void *c) {
  return PyBool_FromLong(kiln_tensor_is_contiguous(o->tensor));
}

static PyObject *kp_permute_dims(kiln_tensor_t *t, const int *perm) {
  kiln_tensor_t *out = NULL;
  return kp_result(kiln_tensor_permute(t, perm, &out), &out);
}

static PyObject *kp_tensor_get_T(kp_tensor_t *o, void *c) {
  int n = kiln_tensor_ndim(o->tensor), perm[KILN_MAX_DIMS];
  if (kp_ag_refuse((PyObject *)o, "x.T") < 0) return NULL;
  for (int i = 0; i < n; i++) perm[i] = n - 1 - i;
  return kp_permute_dims(o->tensor, perm);
}

static PyGetSetDef kp_tensor_getset[] = {
    {"shape", (getter)kp_tensor_get_shape, NULL, "the sizes, a tuple", NULL},
    {"strides", (getter)kp_tensor_get_strides, NULL, "the strides in elements (NumPy's are in bytes)", NULL},
    {"ndim", (getter)kp_tensor_get_ndim, NULL, "the number of dimensions", NULL},
    {"dtype", (getter)kp_tensor_get_dtype, NULL, "the element type: kiln.float32, kiln.bfloat16, kiln.bool, ...", NULL},
    {"device", (getter)kp_tensor_get_device, NULL, "the kiln.Device the tensor lives on", NULL},
    {"itemsize", (getter)kp_tensor_get_itemsize, NULL, "bytes per element", NULL},
    {"nbytes", (getter)kp_tensor_get_nbytes, NULL, "bytes of the elements", NULL},
    {"is_contiguous", (getter)kp_tensor_get_contiguous, NULL, "whether the elements are dense in row-major order", NULL},
    {"T", (getter)kp_tensor_get_T, NULL, "the axes reversed (a view)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* ---- to the host (convert.c copies) --------------------------------------------------------------------------- */

static PyObject *kp_tensor_array(kp_tensor_t *o, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"dtype", "copy", NULL};
  PyObject *dtype = NULL, *copy = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", names, &dtype, &copy)) return NULL;
  if (copy == Py_False)
    return PyErr_Format(PyExc_ValueError,
                        "a kiln tensor cannot become a NumPy array without a copy (np.asarray copies it to the host); "
                        "to share memory use np.from_dlpack(t)");
  return kp_tensor_to_numpy(o->tensor, dtype);
}

static PyObject *kp_tensor_numpy(kp_tensor_t *o, PyObject *unused) { return kp_tensor_to_numpy(o->tensor, NULL); }

static PyObject *kp_tensor_tolist(kp_tensor_t *o, PyObject *unused) { return kp_tensor_to_list(o->tensor); }

static PyObject *kp_tensor_item(kp_tensor_t *o, PyObject *unused) {
  if (kiln_tensor_numel(o->tensor) != 1)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "item(): the tensor has %lld elements; only a one-element tensor has one "
                        "value (use .tolist() or np.asarray)", (long long)kiln_tensor_numel(o->tensor));
  return kp_tensor_item_object(o->tensor);
}

static PyObject *kp_nb_float(PyObject *o) {
  PyObject *v = kp_tensor_item((kp_tensor_t *)o, NULL);
  if (!v || PyFloat_CheckExact(v)) return v;
  PyObject *f = PyNumber_Float(v);
  Py_DECREF(v);
  return f;
}

static PyObject *kp_nb_int(PyObject *o) {
  PyObject *v = kp_tensor_item((kp_tensor_t *)o, NULL);
  if (!v || PyLong_CheckExact(v)) return v;
  PyObject *i = PyNumber_Long(v);
  Py_DECREF(v);
  return i;
}

static int kp_nb_bool(PyObject *o) {
  if (kiln_tensor_numel(KP_TENSOR(o)) != 1) {
    kp_raise_msg(KILN_INVALID_ARGUMENT,
                 "the truth value of a tensor of %lld elements is ambiguous; reduce it first (kiln.max, .sum) and "
                 "read the one value",
                 (long long)kiln_tensor_numel(KP_TENSOR(o)));
    return -1;
  }
  double v;
  kiln_status_t status;
  KP_NOGIL(status = kiln_tensor_item(KP_TENSOR(o), &v));
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  return v != 0.0;
}

/* ---- movement ------------------------------------------------------------------------------- */

static PyObject *kp_tensor_copy(kp_tensor_t *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *dev_arg = nargs > 0 ? args[0] : NULL;
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; i++) {
    if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "device") == 0 && !dev_arg) dev_arg = args[nargs + i];
    else return PyErr_Format(PyExc_TypeError, "copy() takes one argument, the device");
  }
  if (nargs > 1) return PyErr_Format(PyExc_TypeError, "copy(device=None) takes at most one device");
  if (kp_ag_refuse((PyObject *)o, "copy() (clone() is recorded)") < 0) return NULL;
  kiln_device_t *device = kiln_tensor_device(o->tensor);
  if (dev_arg && dev_arg != Py_None && kp_device_arg(dev_arg, &device) < 0) return NULL;
  kiln_tensor_t *out = NULL;
  return kp_result(kiln_tensor_copy(o->tensor, device, &out), &out);
}

static PyObject *kp_tensor_cpu(kp_tensor_t *o, PyObject *unused) {
  kiln_device_t *cpu;
  kiln_status_t status = kiln_device_find("cpu", &cpu);
  if (status != KILN_OK) return kp_raise(status);
  if (kiln_tensor_device(o->tensor) == cpu) return Py_NewRef((PyObject *)o);
  if (kp_ag_refuse((PyObject *)o, "cpu() of a tensor on another device") < 0) return NULL;
  kiln_tensor_t *out = NULL;
  return kp_result(kiln_tensor_to(o->tensor, cpu, &out), &out);
}

/* flatten(start_dim=0, end_dim=-1): dims start..end as one (torch's; a view when the layout allows). */
static PyObject *kp_tensor_flatten(kp_tensor_t *o, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"start_dim", "end_dim", NULL};
  int start = 0, end = -1, n = kiln_tensor_ndim(o->tensor);
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|ii:flatten", names, &start, &end)) return NULL;
  int lo = start < 0 ? start + n : start, hi = end < 0 ? end + n : end;
  if (n == 0) lo = hi = 0;
  if (n > 0 && (lo < 0 || lo >= n || hi < 0 || hi >= n || lo > hi))
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "flatten(start_dim=%d, end_dim=%d) of a tensor of %d dimensions: each "
                        "must be in [-%d, %d) and start_dim <= end_dim", start, end, n, n, n);
  const int64_t *s = kiln_tensor_shape(o->tensor);
  int64_t shape[KILN_MAX_DIMS];
  int m = 0;
  for (int i = 0; i < lo; i++) shape[m++] = s[i];
  int64_t merged = 1;
  for (int i = lo; i <= hi && i < n; i++) merged *= s[i];
  shape[m++] = merged;
  for (int i = hi + 1; i < n; i++) shape[m++] = s[i];
  return kp_reshape((PyObject *)o, m, shape);
}

/* permute(*dims) / transpose(*axes): a permutation of every axis; transpose()
 * without arguments reverses them, as NumPy's. */
static PyObject *kp_permute_args(kp_tensor_t *o, PyObject *args, bool empty_reverses) {
  int n = kiln_tensor_ndim(o->tensor), perm[KILN_MAX_DIMS];
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (kp_ag_refuse((PyObject *)o, empty_reverses ? "transpose" : "permute") < 0) return NULL;
  if (nargs == 0 && empty_reverses) return kp_tensor_get_T(o, NULL);
  int32_t dims[KILN_MAX_DIMS];
  int count;
  if (nargs == 1 && !PyLong_Check(PyTuple_GET_ITEM(args, 0)))
    count = kp_int32_seq_arg(PyTuple_GET_ITEM(args, 0), "axes", KILN_MAX_DIMS, dims);
  else count = kp_int32_seq_arg(args, "axes", KILN_MAX_DIMS, dims);
  if (count < 0) return NULL;
  if (count != n)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "the permutation has %d axes; the tensor has %d (use swapaxes(a, b) to "
                        "swap two)", count, n);
  for (int i = 0; i < n; i++) perm[i] = dims[i];
  return kp_permute_dims(o->tensor, perm);
}

static PyObject *kp_tensor_permute(kp_tensor_t *o, PyObject *args) { return kp_permute_args(o, args, false); }

static PyObject *kp_tensor_swapaxes(kp_tensor_t *o, PyObject *args) {
  int a, b;
  if (!PyArg_ParseTuple(args, "ii:swapaxes", &a, &b) || kp_ag_refuse((PyObject *)o, "swapaxes") < 0) return NULL;
  kiln_tensor_t *out = NULL;
  return kp_result(kiln_tensor_transpose(o->tensor, a, b, &out), &out);
}

static PyObject *kp_tensor_contiguous(kp_tensor_t *o, PyObject *unused) {
  kiln_tensor_t *out = NULL;
  kiln_status_t status = kiln_tensor_contiguous(o->tensor, &out);
  if (status != KILN_OK) return kp_raise(status);
  if (out == o->tensor) {
    kiln_tensor_release(out);
    return Py_NewRef((PyObject *)o);
  }
  if (kp_ag_refuse((PyObject *)o, "contiguous() of a strided view") < 0) {
    kiln_tensor_release(out);
    return NULL;
  }
  return kp_tensor_wrap(out);
}

static PyObject *kp_tensor_astype(kp_tensor_t *o, PyObject *arg) {
  kiln_dtype_t dtype;
  if (kp_dtype_arg(arg, KILN_F32, &dtype) < 0) return NULL;
  return kp_cast((PyObject *)o, dtype);
}

/* ---- reductions and the rest as methods ------------------------------------------------------ */

static PyObject *kp_tensor_norm(kp_tensor_t *o, PyObject *unused) {
  kiln_tensor_t *out = NULL;
  if (kp_ag_refuse((PyObject *)o, "norm") < 0) return NULL;
  return kp_result(kiln_tensor_norm(o->tensor, &out), &out);
}

#define KP_UNARY_METHOD(NAME, name)                                                       \
  static PyObject *kp_tensor_##name(kp_tensor_t *o, PyObject *unused) {                   \
    kiln_tensor_t *out = NULL;                                                            \
    return kp_unary(KILN_UNARY_##NAME, (PyObject *)o, &out);                              \
  }
KILN_UNARY_OPS(KP_UNARY_METHOD)

static int kp_last_axis(PyObject *args, PyObject *kwargs, int ndim, const char *name) {
  static char *names[] = {"axis", NULL};
  int axis = -1;
  char format[32];
  snprintf(format, sizeof format, "|i:%s", name);
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, names, &axis)) return -1;
  if (axis != -1 && axis != ndim - 1) {
    kp_raise_msg(KILN_UNSUPPORTED, "%s along axis %d: kiln computes it along the last axis only; move the axis last "
                 "first (t.swapaxes(%d, -1))", name, axis, axis);
    return -1;
  }
  return 0;
}

static PyObject *kp_tensor_softmax(kp_tensor_t *o, PyObject *args, PyObject *kwargs) {
  if (kp_last_axis(args, kwargs, kiln_tensor_ndim(o->tensor), "softmax") < 0) return NULL;
  return kp_softmax((PyObject *)o, false);
}

static PyObject *kp_tensor_log_softmax(kp_tensor_t *o, PyObject *args, PyObject *kwargs) {
  if (kp_last_axis(args, kwargs, kiln_tensor_ndim(o->tensor), "log_softmax") < 0) return NULL;
  return kp_softmax((PyObject *)o, true);
}

/* In place: self += alpha * other (f32, contiguous, same shape and device). */
static PyObject *kp_tensor_add_(kp_tensor_t *o, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"other", "alpha", NULL};
  PyObject *other;
  double alpha = 1.0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|d:add_", names, &other, &alpha)) return NULL;
  kiln_tensor_t *b = kp_tensor_arg(other, "other");
  if (!b || kp_ag_refuse((PyObject *)o, "in-place add_") < 0 || kp_ag_refuse(other, "in-place add_") < 0) return NULL;
  kiln_status_t status = kiln_tensor_accumulate(o->tensor, alpha, b);
  if (status != KILN_OK) return kp_raise(status);
  return Py_NewRef((PyObject *)o);
}

/* Device-side copy of src's elements into this tensor from flat element
 * `offset` (both contiguous, one dtype): a log kept on the device. */
static PyObject *kp_tensor_copy_from(kp_tensor_t *o, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"src", "offset", NULL};
  PyObject *src;
  long long offset = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|L:copy_from", names, &src, &offset)) return NULL;
  kiln_tensor_t *s = kp_tensor_arg(src, "src"), *d = o->tensor;
  if (!s || kp_ag_refuse((PyObject *)o, "in-place copy_from") < 0 || kp_ag_refuse(src, "in-place copy_from") < 0)
    return NULL;
  if (kiln_tensor_dtype(s) != kiln_tensor_dtype(d))
    return kp_raise_msg(KILN_DTYPE_MISMATCH, "copy_from: src is %s, this tensor %s; convert with astype first",
                        kiln_dtype_name(kiln_tensor_dtype(s)), kiln_dtype_name(kiln_tensor_dtype(d)));
  if (!kiln_tensor_is_contiguous(s) || !kiln_tensor_is_contiguous(d))
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "copy_from: both tensors must be contiguous (.contiguous())");
  long long n = kiln_tensor_numel(s), total = kiln_tensor_numel(d);
  if (offset < 0 || offset > total || n > total - offset)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "copy_from: %lld elements at offset %lld do not fit in %lld", n, offset,
                        total);
  size_t item = kiln_dtype_size(kiln_tensor_dtype(d));
  kiln_queue_t *queue = kiln_device_current_queue(kiln_tensor_device(d));
  kiln_status_t status =
      kiln_buffer_copy(queue, kiln_tensor_buffer(s), kiln_tensor_offset_bytes(s), kiln_tensor_buffer(d),
                       kiln_tensor_offset_bytes(d) + (size_t)offset * item, (size_t)n * item, 0, NULL, NULL);
  if (status != KILN_OK) return kp_raise(status);
  return Py_NewRef((PyObject *)o);
}

static PyObject *kp_tensor_provider_hint(kp_tensor_t *o, PyObject *unused) {
  return PyUnicode_FromString(kiln_last_provider());
}

/* ---- operators ------------------------------------------------------------------------------ */

#define KP_NB_BINARY(NAME, name) \
  static PyObject *kp_nb_##name(PyObject *a, PyObject *b) { return kp_binary(KILN_BINARY_##NAME, a, b); }
KP_NB_BINARY(ADD, add)
KP_NB_BINARY(SUB, sub)
KP_NB_BINARY(MUL, mul)
KP_NB_BINARY(DIV, div)

static PyObject *kp_nb_matmul(PyObject *a, PyObject *b) {
  if (!KP_IS_TENSOR(a) || !KP_IS_TENSOR(b)) Py_RETURN_NOTIMPLEMENTED;
  return kp_matmul(a, b, false, false);
}

static PyObject *kp_nb_neg(PyObject *a) {
  kiln_tensor_t *out = NULL;
  return kp_unary(KILN_UNARY_NEG, a, &out);
}
static PyObject *kp_nb_abs(PyObject *a) {
  kiln_tensor_t *out = NULL;
  return kp_unary(KILN_UNARY_ABS, a, &out);
}
static PyObject *kp_nb_pos(PyObject *a) { return Py_NewRef(a); }

static PyObject *kp_tensor_richcompare(PyObject *a, PyObject *b, int op) { return kp_compare(a, b, op); }

static Py_ssize_t kp_tensor_len(PyObject *o) {
  if (kiln_tensor_ndim(KP_TENSOR(o)) == 0) {
    PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
    return -1;
  }
  return (Py_ssize_t)kiln_tensor_shape(KP_TENSOR(o))[0];
}

static PyNumberMethods kp_tensor_number = {
    .nb_add = kp_nb_add,
    .nb_subtract = kp_nb_sub,
    .nb_multiply = kp_nb_mul,
    .nb_true_divide = kp_nb_div,
    .nb_matrix_multiply = kp_nb_matmul,
    .nb_negative = kp_nb_neg,
    .nb_positive = kp_nb_pos,
    .nb_absolute = kp_nb_abs,
    .nb_bool = kp_nb_bool,
    .nb_float = kp_nb_float,
    .nb_int = kp_nb_int,
    .nb_index = kp_nb_index,
    .nb_power = kp_nb_power,
    .nb_invert = kp_nb_invert,
    .nb_and = kp_nb_and,
    .nb_or = kp_nb_or,
    .nb_xor = kp_nb_xor,
    .nb_inplace_add = kp_nb_iadd,
    .nb_inplace_subtract = kp_nb_isub,
    .nb_inplace_multiply = kp_nb_imul,
    .nb_inplace_true_divide = kp_nb_idiv,
};

static PySequenceMethods kp_tensor_sequence = {
    .sq_length = kp_tensor_len,
};

/* ---- repr, pickling ------------------------------------------------------------------------- */

static PyObject *kp_repr_hook;

static PyObject *kp_tensor_repr(kp_tensor_t *o) {
  if (kp_repr_hook) return PyObject_CallOneArg(kp_repr_hook, (PyObject *)o);
  PyObject *shape = kp_tensor_get_shape(o, NULL);
  if (!shape) return NULL;
  PyObject *r = PyUnicode_FromFormat("<kiln.Tensor shape=%R dtype=%s device=%s>", shape,
                                     kiln_dtype_name(kiln_tensor_dtype(o->tensor)),
                                     kiln_device_selector(kiln_tensor_device(o->tensor)));
  Py_DECREF(shape);
  return r;
}

static PyObject *kp_set_repr_hook(PyObject *self, PyObject *fn) {
  Py_XSETREF(kp_repr_hook, fn == Py_None ? NULL : Py_NewRef(fn));
  Py_RETURN_NONE;
}

static PyObject *kp_tensor_reduce(kp_tensor_t *o, PyObject *unused) {
  /* Pickles as kiln.tensor(<numpy array>, device=<selector>): a copy through the host. */
  PyObject *mod = PyImport_ImportModule("kiln");
  if (!mod) return NULL;
  PyObject *fn = PyObject_GetAttrString(mod, "_rebuild_tensor");
  Py_DECREF(mod);
  if (!fn) return NULL;
  /* bfloat16, which NumPy lacks, travels as float32 (exact) and is cast back. */
  const kiln_dtype_t dtype = kiln_tensor_dtype(o->tensor);
  PyObject *as = dtype == KILN_BF16 ? PyUnicode_FromString("float32") : NULL;
  PyObject *arr = kp_tensor_to_numpy(o->tensor, as);
  Py_XDECREF(as);
  if (!arr) {
    Py_DECREF(fn);
    return NULL;
  }
  return Py_BuildValue("(N(Nss))", fn, arr, kiln_device_selector(kiln_tensor_device(o->tensor)),
                       kiln_dtype_long_name(dtype));
}

/* ---- the type ------------------------------------------------------------------------------------ */

static PyMethodDef kp_tensor_methods[] = {
    {"copy", (PyCFunction)(void (*)(void))kp_tensor_copy, METH_FASTCALL | METH_KEYWORDS,
     "copy(device=None)\n--\n\nA new copy on `device` (the tensor's own device when None), always new memory."},
    {"cpu", (PyCFunction)kp_tensor_cpu, METH_NOARGS, "cpu()\n--\n\nto(kiln.device('cpu'))."},
    {"numpy", (PyCFunction)kp_tensor_numpy, METH_NOARGS,
     "numpy()\n--\n\nA copy in a new NumPy array (blocks until the data arrived, as np.asarray(t) does)."},
    {"__array__", (PyCFunction)(void (*)(void))kp_tensor_array, METH_VARARGS | METH_KEYWORDS,
     "__array__(dtype=None, copy=None)\n--\n\nnp.asarray(t): always a copy to host memory."},
    {"tolist", (PyCFunction)kp_tensor_tolist, METH_NOARGS, "tolist()\n--\n\nThe values as nested lists (blocks)."},
    {"item", (PyCFunction)kp_tensor_item, METH_NOARGS,
     "item()\n--\n\nThe value of a one-element tensor as a float or int (blocks)."},
    {"flatten", (PyCFunction)(void (*)(void))kp_tensor_flatten, METH_VARARGS | METH_KEYWORDS,
     "flatten(start_dim=0, end_dim=-1)\n--\n\nDims start_dim..end_dim as one (a view when the layout allows)."},
    {"permute", (PyCFunction)kp_tensor_permute, METH_VARARGS, "permute(*dims)\n--\n\nA view with the axes permuted."},
    {"swapaxes", (PyCFunction)kp_tensor_swapaxes, METH_VARARGS, "swapaxes(a, b)\n--\n\nA view with two axes swapped."},
    {"contiguous", (PyCFunction)kp_tensor_contiguous, METH_NOARGS,
     "contiguous()\n--\n\nThis tensor when its elements are dense, else a dense copy."},
    {"astype", (PyCFunction)kp_tensor_astype, METH_O,
     "astype(dtype)\n--\n\nThe values converted to another dtype by kiln's one cast rule (docs/dtypes.md; always a new "
     "tensor). Every pair on the CPU; GPU devices convert the dtypes they serve."},
    {"norm", (PyCFunction)kp_tensor_norm, METH_NOARGS, "norm()\n--\n\nThe Frobenius norm, a 0-d float32 tensor."},
#define KP_UNARY_ENTRY(NAME, name) {#name, (PyCFunction)kp_tensor_##name, METH_NOARGS, #name "()\n--\n\nkiln." #name "(self)."},
    KILN_UNARY_OPS(KP_UNARY_ENTRY)
#undef KP_UNARY_ENTRY
    {"softmax", (PyCFunction)(void (*)(void))kp_tensor_softmax, METH_VARARGS | METH_KEYWORDS,
     "softmax(axis=-1)\n--\n\nSoftmax along the last axis."},
    {"log_softmax", (PyCFunction)(void (*)(void))kp_tensor_log_softmax, METH_VARARGS | METH_KEYWORDS,
     "log_softmax(axis=-1)\n--\n\nLog-softmax along the last axis."},
    {"add_", (PyCFunction)(void (*)(void))kp_tensor_add_, METH_VARARGS | METH_KEYWORDS,
     "add_(other, alpha=1.0)\n--\n\nIn place: self += alpha * other (float32, contiguous, one shape and device); "
     "returns self."},
    {"copy_from", (PyCFunction)(void (*)(void))kp_tensor_copy_from, METH_VARARGS | METH_KEYWORDS,
     "copy_from(src, offset=0)\n--\n\nIn place, on the device: copy src's elements (contiguous, same dtype, any "
     "device) into this tensor's, starting at flat element `offset`; returns self. Enqueued (the chapter's "
     "exercise 3 keeps its log on the device this way)."},
    {"__dlpack__", (PyCFunction)(void (*)(void))kp_tensor_dlpack, METH_FASTCALL | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nA DLPack capsule over this "
     "tensor's memory, without a copy: 'dltensor_versioned' when max_version >= (1, 0), else 'dltensor'. Waits for "
     "the work already enqueued on the tensor's device."},
    {"__dlpack_device__", (PyCFunction)kp_tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(device type, device id) as DLPack numbers them: (1, 0) for kiln's CPU."},
    {"__reduce__", (PyCFunction)kp_tensor_reduce, METH_NOARGS, NULL},
    {"_last_provider", (PyCFunction)kp_tensor_provider_hint, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject kp_tensor_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.Tensor",
    .tp_basicsize = sizeof(kp_tensor_t),
    .tp_dealloc = (destructor)kp_tensor_dealloc,
    .tp_repr = (reprfunc)kp_tensor_repr,
    .tp_as_number = &kp_tensor_number,
    .tp_as_sequence = &kp_tensor_sequence,
    .tp_as_mapping = &kp_tensor_mapping,
    .tp_hash = kp_tensor_hash,
    .tp_richcompare = kp_tensor_richcompare,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A tensor on one kiln device. Operations enqueue work on that device and return at once; reading "
              "values (np.asarray, .tolist(), .item(), print) waits for it. Operands on two devices raise "
              "kiln.DeviceMismatchError: move one with .to(device).",
    .tp_weaklistoffset = offsetof(kp_tensor_t, weakrefs),
    .tp_methods = kp_tensor_methods,
    .tp_getset = kp_tensor_getset,
};

static PyMethodDef kp_tensor_functions[] = {
    {"_set_repr_hook", kp_set_repr_hook, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

int kp_module_init_tensor(PyObject *module) {
  if (PyType_Ready(&kp_dtype_type) < 0 || PyType_Ready(&kp_tensor_type) < 0) return -1;
  /* NumPy must not turn `array + tensor` into an array of objects or a host
   * copy: it defers to the tensor's operators (which refuse arrays). */
  if (PyDict_SetItemString(kp_tensor_type.tp_dict, "__array_ufunc__", Py_None) < 0) return -1;
  PyObject *priority = PyLong_FromLong(1000);
  int rc = priority ? PyDict_SetItemString(kp_tensor_type.tp_dict, "__array_priority__", priority) : -1;
  Py_XDECREF(priority);
  if (rc < 0) return -1;
  PyType_Modified(&kp_tensor_type);
  if (PyModule_AddObjectRef(module, "Tensor", (PyObject *)&kp_tensor_type) < 0) return -1;
  if (PyModule_AddObjectRef(module, "DType", (PyObject *)&kp_dtype_type) < 0) return -1;
  for (int d = 0; d < KILN_DTYPE_COUNT_; d++)
    if (PyModule_AddObjectRef(module, kp_dtypes[d].name, (PyObject *)&kp_dtypes[d]) < 0) return -1;
  return PyModule_AddFunctions(module, kp_tensor_functions);
}
