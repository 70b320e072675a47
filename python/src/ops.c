/* python/src/ops.c: kiln's operations as module functions: creation, elementwise with broadcasting, matmul, reductions, neural-network operations, gradients and in-place updates. */
#include "kilnpy.h"

#include <math.h>

/* ---- shared argument helpers ------------------------------------------------------------ */

int kp_axis_arg(PyObject *arg, int *out) {
  if (!arg || arg == Py_None) {
    *out = KILN_ALL_AXES;
    return 0;
  }
  if (!PyIndex_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "axis must be an int or None (kiln reduces along one axis or all of them), not %.100s",
                 Py_TYPE(arg)->tp_name);
    return -1;
  }
  int32_t v;
  if (kp_int32_arg(arg, "axis", &v) < 0) return -1;
  *out = v;
  return 0;
}

int kp_pair_arg(PyObject *arg, int32_t fallback, int32_t out[2], const char *what) {
  if (!arg || arg == Py_None) {
    out[0] = out[1] = fallback;
    return 0;
  }
  if (PyIndex_Check(arg)) {
    if (kp_int32_arg(arg, what, &out[0]) < 0) return -1;
    out[1] = out[0];
    return 0;
  }
  int32_t v[KILN_MAX_DIMS];
  int n = kp_int32_seq_arg(arg, what, KILN_MAX_DIMS, v);
  if (n < 0) return -1;
  if (n == 1) v[1] = v[0];
  else if (n != 2) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s takes one int or two (height, width), not %d", what, n);
    return -1;
  }
  out[0] = v[0];
  out[1] = v[1];
  return 0;
}

static int kp_device_kw(PyObject *arg, kiln_device_t **out) { return kp_device_arg(arg, out); }

/* ---- binary operations -------------------------------------------------------------------- */

/* A scalar operand of an int32 tensor must be a whole number that fits. */
static int kp_scalar_fits(const kiln_tensor_t *t, double v, PyObject *obj) {
  if (kiln_tensor_dtype(t) != KILN_I32) return 0;
  if (v != floor(v) || !(v >= -2147483648.0 && v <= 2147483647.0)) {
    PyObject *r = PyObject_Repr(obj);
    kp_raise_msg(KILN_DTYPE_MISMATCH, "an int32 tensor with the scalar %s: kiln converts scalars to the tensor's dtype, "
                 "which would change its value; convert the tensor first (t.astype(kiln.float32))",
                 r ? PyUnicode_AsUTF8(r) : "?");
    Py_XDECREF(r);
    return -1;
  }
  return 0;
}

/* kp_binary on the implicit tape (an operand requires grad). */
static PyObject *kp_binary_recorded(kiln_binary_op_t op, PyObject *a, PyObject *b) {
  kiln_tensor_t *out = NULL;
  double v;
  int r;
  if (KP_IS_TENSOR(a) && KP_IS_TENSOR(b))
    return kp_ag_result(1, KP_AG(kiln_nn_tape_binary(kp_ag_tape(), op, kp_ag_in(a), kp_ag_in(b), &out)), &out);
  PyObject *t = KP_IS_TENSOR(a) ? a : b, *scalar = t == a ? b : a;
  if ((r = kp_scalar(scalar, &v)) <= 0) {
    if (r < 0) return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (kp_scalar_fits(KP_TENSOR(t), v, scalar) < 0) return NULL;
  if (t == a || (op != KILN_BINARY_SUB && op != KILN_BINARY_DIV)) /* a (op) v, or v (op) b that commutes */
    return kp_ag_result(1, KP_AG(kiln_nn_tape_binary_scalar(kp_ag_tape(), op, kp_ag_in(t), v, &out)), &out);
  kiln_tensor_t *tb = kp_ag_in(b), *tmp = NULL;
  kiln_status_t status;
  if (op == KILN_BINARY_SUB) { /* v - b = (-b) + v */
    status = KP_AG(kiln_nn_tape_unary(kp_ag_tape(), KILN_UNARY_NEG, tb, &tmp));
    if (status == KILN_OK) status = KP_AG(kiln_nn_tape_binary_scalar(kp_ag_tape(), KILN_BINARY_ADD, tmp, v, &out));
  } else { /* v / b = full(v) / b */
    status = kiln_tensor_full(kiln_tensor_device(tb), kiln_tensor_dtype(tb), kiln_tensor_ndim(tb),
                              kiln_tensor_shape(tb), v, &tmp);
    if (status == KILN_OK) status = KP_AG(kiln_nn_tape_binary(kp_ag_tape(), KILN_BINARY_DIV, tmp, tb, &out));
  }
  kiln_tensor_release(tmp);
  return kp_ag_result(1, status, &out);
}

PyObject *kp_binary(kiln_binary_op_t op, PyObject *a, PyObject *b) {
  kiln_tensor_t *out = NULL;
  kiln_status_t status;
  double v;
  int r;
  if ((r = kp_ag_wanted(a, b)) != 0) return r < 0 ? NULL : kp_binary_recorded(op, a, b);
  if (KP_IS_TENSOR(a)) {
    if (KP_IS_TENSOR(b)) return kp_result(kiln_tensor_binary(op, KP_TENSOR(a), KP_TENSOR(b), &out), &out);
    if ((r = kp_scalar(b, &v)) <= 0) {
      if (r < 0) return NULL;
      Py_RETURN_NOTIMPLEMENTED;
    }
    if (kp_scalar_fits(KP_TENSOR(a), v, b) < 0) return NULL;
    return kp_result(kiln_tensor_binary_scalar(op, KP_TENSOR(a), v, &out), &out);
  }
  if (!KP_IS_TENSOR(b)) Py_RETURN_NOTIMPLEMENTED;
  /* scalar (op) tensor */
  if ((r = kp_scalar(a, &v)) <= 0) {
    if (r < 0) return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  kiln_tensor_t *t = KP_TENSOR(b);
  if (kp_scalar_fits(t, v, a) < 0) return NULL;
  switch (op) {
  case KILN_BINARY_SUB: {
    kiln_tensor_t *neg = NULL;
    status = kiln_tensor_neg(t, &neg);
    if (status != KILN_OK) return kp_raise(status);
    status = kiln_tensor_add_scalar(neg, v, &out);
    kiln_tensor_release(neg);
    return kp_result(status, &out);
  }
  case KILN_BINARY_DIV: {
    kiln_tensor_t *full = NULL;
    status = kiln_tensor_full(kiln_tensor_device(t), kiln_tensor_dtype(t), kiln_tensor_ndim(t), kiln_tensor_shape(t), v,
                              &full);
    if (status != KILN_OK) return kp_raise(status);
    status = kiln_tensor_div(full, t, &out);
    kiln_tensor_release(full);
    return kp_result(status, &out);
  }
  default: /* add, mul, maximum, minimum, eq commute */
    return kp_result(kiln_tensor_binary_scalar(op, t, v, &out), &out);
  }
}

/* NumPy's rules for 1-D operands: a vector is a row on the left and a column
 * on the right, and that axis is dropped from the result. */
PyObject *kp_matmul(PyObject *a, PyObject *b, bool trans_a, bool trans_b) {
  kiln_tensor_t *ta = KP_TENSOR(a), *tb = KP_TENSOR(b), *va = NULL, *vb = NULL, *out = NULL;
  int na = kiln_tensor_ndim(ta), nb = kiln_tensor_ndim(tb);
  kiln_status_t status = KILN_OK;
  int rec = kp_ag_wanted(a, b);
  if (rec < 0) return NULL;
  if (rec) {
    /* The vector reshapes are recorded too, so the gradient reaches a 1-D operand. */
    ta = kp_ag_in(a);
    tb = kp_ag_in(b);
    if (na == 1) status = KP_AG(kiln_nn_tape_reshape(kp_ag_tape(), ta, 2, (int64_t[]){1, kiln_tensor_shape(ta)[0]}, &va));
    if (status == KILN_OK && nb == 1)
      status = KP_AG(kiln_nn_tape_reshape(kp_ag_tape(), tb, 2, (int64_t[]){kiln_tensor_shape(tb)[0], 1}, &vb));
    if (status == KILN_OK)
      status = KP_AG(kiln_nn_tape_matmul(kp_ag_tape(), va ? va : ta, vb ? vb : tb, trans_a, trans_b, &out));
  } else {
    if (na == 1) {
      int64_t s[2] = {1, kiln_tensor_shape(ta)[0]};
      status = kiln_tensor_reshape(ta, 2, s, &va);
    }
    if (status == KILN_OK && nb == 1) {
      int64_t s[2] = {kiln_tensor_shape(tb)[0], 1};
      status = kiln_tensor_reshape(tb, 2, s, &vb);
    }
    if (status == KILN_OK) status = kiln_tensor_matmul(va ? va : ta, vb ? vb : tb, trans_a, trans_b, &out);
  }
  kiln_tensor_release(va);
  kiln_tensor_release(vb);
  if (status != KILN_OK) return kp_raise(status);
  if (na != 1 && nb != 1) return kp_ag_result(rec, status, &out);
  /* Drop the axes the vectors added. */
  int n = kiln_tensor_ndim(out), m = 0;
  int64_t shape[KILN_MAX_DIMS];
  const int64_t *os = kiln_tensor_shape(out);
  for (int i = 0; i < n; i++) {
    if (na == 1 && i == n - 2) continue;
    if (nb == 1 && i == n - 1) continue;
    shape[m++] = os[i];
  }
  kiln_tensor_t *r = NULL;
  status = rec ? KP_AG(kiln_nn_tape_reshape(kp_ag_tape(), out, m, shape, &r)) : kiln_tensor_reshape(out, m, shape, &r);
  kiln_tensor_release(out);
  return kp_ag_result(rec, status, &r);
}

#define KP_BINARY_FN(NAME, name)                                                                    \
  static PyObject *kp_fn_##name(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {          \
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, #name "() takes two operands");           \
    PyObject *r = kp_binary(KILN_BINARY_##NAME, args[0], args[1]);                                  \
    if (r == Py_NotImplemented) {                                                                   \
      Py_DECREF(r);                                                                                 \
      return PyErr_Format(PyExc_TypeError, #name "(): operands must be kiln tensors or numbers, "  \
                          "not %.100s and %.100s", Py_TYPE(args[0])->tp_name, Py_TYPE(args[1])->tp_name); \
    }                                                                                               \
    return r;                                                                                       \
  }
KILN_BINARY_OPS(KP_BINARY_FN)

static PyObject *kp_fn_matmul(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"a", "b", "transpose_a", "transpose_b", NULL};
  PyObject *a, *b;
  int ta = 0, tb = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|pp:matmul", names, &a, &b, &ta, &tb)) return NULL;
  if (!kp_tensor_arg(a, "a") || !kp_tensor_arg(b, "b")) return NULL;
  return kp_matmul(a, b, ta, tb);
}

/* ---- unary ---------------------------------------------------------------------------------- */

PyObject *kp_unary(kiln_unary_op_t op, PyObject *x, kiln_tensor_t **out) {
  int rec = kp_ag_wanted(x, NULL);
  return KP_AG_OP(rec, kiln_nn_tape_unary(kp_ag_tape(), op, kp_ag_in(x), out), kiln_tensor_unary(op, KP_TENSOR(x), out),
                  out);
}

#define KP_UNARY_FN(NAME, name)                                                      \
  static PyObject *kp_fn_##name(PyObject *self, PyObject *arg) {                      \
    kiln_tensor_t *t = kp_tensor_arg(arg, "x"), *out = NULL;                          \
    if (!t) return NULL;                                                             \
    return kp_unary(KILN_UNARY_##NAME, arg, &out);                                   \
  }
KILN_UNARY_OPS(KP_UNARY_FN)

static int kp_unary_name(PyObject *arg, kiln_unary_op_t *out) {
  static const char *const names[] = {
#define KP_UNARY_NAME(NAME, name) #name,
      KILN_UNARY_OPS(KP_UNARY_NAME)
#undef KP_UNARY_NAME
  };
  const char *text = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
  for (int i = 0; text && i < KILN_UNARY_COUNT_; i++) {
    if (!strcmp(text, names[i])) {
      *out = (kiln_unary_op_t)i;
      return 0;
    }
  }
  if (!PyErr_Occurred())
    kp_raise_msg(KILN_INVALID_ARGUMENT, "unknown unary operation %R; kiln has neg, abs, exp, log, sqrt, relu, sigmoid, "
                 "tanh", arg);
  return -1;
}

/* ---- creation ---------------------------------------------------------------------------------- */

/* A value that a creation writes into a tensor of `dtype` must fit it: kiln
 * would saturate an int32 (2**40 -> 2147483647) or turn a float32 into inf,
 * silently. 0, or -1 with OverflowError naming the value and the dtype. */
int kp_value_fits(double v, kiln_dtype_t dtype, const char *call, const char *what) {
  char text[32];
  if (dtype == KILN_I32 && !(v >= -2147483648.0 && v <= 2147483647.0)) {
    PyErr_Format(PyExc_OverflowError, "%s: %s %s does not fit in int32 (-2147483648 to 2147483647); use "
                 "dtype=kiln.float32", call, what, kp_double_text(v, text));
    return -1;
  }
  static const struct {
    kiln_dtype_t dtype;
    double lo, hi;
    const char *range;
  } ints[] = {{KILN_I8, -128.0, 127.0, "-128 to 127"},
              {KILN_U8, 0.0, 255.0, "0 to 255"},
              {KILN_I16, -32768.0, 32767.0, "-32768 to 32767"},
              {KILN_I64, -9223372036854775808.0, 9223372036854775807.0, "-9223372036854775808 to 9223372036854775807"}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (dtype == ints[i].dtype && !(v >= ints[i].lo && (dtype == KILN_I64 ? v < ints[i].hi : v <= ints[i].hi))) {
      PyErr_Format(PyExc_OverflowError, "%s: %s %s does not fit in %s (%s); use a wider dtype", call, what,
                   kp_double_text(v, text), kiln_dtype_long_name(dtype), ints[i].range);
      return -1;
    }
  if ((dtype == KILN_F16 && isfinite(v) && fabs(v) >= 65520.0) ||
      (dtype == KILN_BF16 && isfinite(v) && fabs(v) >= ldexp(511.0, 119))) { /* where rounding reaches inf */
    PyErr_Format(PyExc_OverflowError, "%s: %s %s does not fit in %s (its largest magnitude is %s)", call, what,
                 kp_double_text(v, text), kiln_dtype_long_name(dtype), dtype == KILN_F16 ? "65504" : "3.3895314e+38");
    return -1;
  }
  if (dtype == KILN_F32 && isfinite(v) && !isfinite((float)v)) {
    PyErr_Format(PyExc_OverflowError, "%s: %s %s does not fit in float32 (its largest magnitude is 3.4028235e+38)",
                 call, what, kp_double_text(v, text));
    return -1;
  }
  return 0;
}

/* empty, zeros, ones, full (kind 0 to 3) and their _like forms: the first
 * argument is a shape, or with `like` a tensor whose shape, dtype and
 * device are taken unless given. */
static PyObject *kp_fill(PyObject *args, PyObject *kwargs, const char *name, int kind, bool like) {
  static char *names_sized[] = {"size", "shape", "dtype", "device", NULL};
  static char *names_full[] = {"shape", "fill_value", "dtype", "device", NULL};
  static char *names_like_plain[] = {"a", "dtype", "device", NULL};
  static char *names_like_full[] = {"a", "fill_value", "dtype", "device", NULL};
  PyObject *first = NULL, *dtype_arg = NULL, *device_arg = NULL, *size_kw = NULL, *shape_kw = NULL;
  double value = 0;
  char format[48];
  bool ok;
  int64_t shape_buf[KILN_MAX_DIMS];
  const int64_t *shape = shape_buf;
  int ndim = -1;
  if (kind == 3) {
    snprintf(format, sizeof format, "Od|O$O:%s", name);
    ok = PyArg_ParseTupleAndKeywords(args, kwargs, format, like ? names_like_full : names_full, &first, &value,
                                     &dtype_arg, &device_arg);
  } else if (like) {
    snprintf(format, sizeof format, "O|O$O:%s", name);
    ok = PyArg_ParseTupleAndKeywords(args, kwargs, format, names_like_plain, &first, &dtype_arg, &device_arg);
  } else {
    /* PyTorch's zeros(2, 3) and zeros((2, 3)), NumPy's zeros((2, 3), dtype);
     * everything but the sizes by keyword. */
    PyObject *empty = PyTuple_New(0);
    snprintf(format, sizeof format, "|$OOOO:%s", name);
    ok = empty && PyArg_ParseTupleAndKeywords(empty, kwargs, format, names_sized, &size_kw, &shape_kw, &dtype_arg,
                                              &device_arg);
    Py_XDECREF(empty);
    if (!ok) return NULL;
    PyObject *size_obj = size_kw ? size_kw : shape_kw;
    if (size_obj && PyTuple_GET_SIZE(args) > 0)
      return PyErr_Format(PyExc_TypeError, "%s(): the size is given twice (positionally and by keyword)", name);
    if (size_obj) {
      ndim = kp_shape_arg(size_obj, shape_buf, "size");
    } else {
      PyObject *positional_dtype = NULL;
      ndim = kp_size_args(args, 0, name, shape_buf, &positional_dtype);
      if (positional_dtype) {
        if (dtype_arg) return PyErr_Format(PyExc_TypeError, "%s(): dtype given twice", name);
        dtype_arg = positional_dtype;
      }
    }
    if (ndim < 0) return NULL;
  }
  if (!ok) return NULL;
  kiln_dtype_t dtype;
  kiln_device_t *device;
  if (like) {
    kiln_tensor_t *t = kp_tensor_arg(first, "a");
    if (!t) return NULL;
    ndim = kiln_tensor_ndim(t);
    shape = kiln_tensor_shape(t);
    device = kiln_tensor_device(t);
    if (kp_dtype_arg(dtype_arg, kiln_tensor_dtype(t), &dtype) < 0) return NULL;
    if (device_arg && device_arg != Py_None && kp_device_arg(device_arg, &device) < 0) return NULL;
  } else {
    if (kind == 3) ndim = kp_shape_arg(first, shape_buf, "shape");
    if (ndim < 0) return NULL;
    if (kp_dtype_arg(dtype_arg, KILN_F32, &dtype) < 0 || kp_device_kw(device_arg, &device) < 0) return NULL;
  }
  if (kind == 3 && kp_value_fits(value, dtype, name, "fill_value") < 0) return NULL;
  kiln_tensor_t *out = NULL;
  kiln_status_t status;
  switch (kind) {
  case 0: status = kiln_tensor_empty(device, dtype, ndim, shape, &out); break;
  case 1: status = kiln_tensor_zeros(device, dtype, ndim, shape, &out); break;
  case 2: status = kiln_tensor_ones(device, dtype, ndim, shape, &out); break;
  default: status = kiln_tensor_full(device, dtype, ndim, shape, value, &out); break;
  }
  return kp_result(status, &out);
}

static PyObject *kp_fn_empty(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "empty", 0, false); }
static PyObject *kp_fn_zeros(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "zeros", 1, false); }
static PyObject *kp_fn_ones(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "ones", 2, false); }
static PyObject *kp_fn_full(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "full", 3, false); }

static PyObject *kp_fn_empty_like(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "empty_like", 0, true); }
static PyObject *kp_fn_zeros_like(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "zeros_like", 1, true); }
static PyObject *kp_fn_ones_like(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "ones_like", 2, true); }
static PyObject *kp_fn_full_like(PyObject *s, PyObject *a, PyObject *k) { return kp_fill(a, k, "full_like", 3, true); }

/* arange(stop) or arange(start, stop, step=1): int32 when every bound is an int. */
static PyObject *kp_fn_arange(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"start", "stop", "step", "dtype", "device", NULL};
  PyObject *a = NULL, *b = Py_None, *c = NULL, *dtype_arg = NULL, *device_arg = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOO$O:arange", names, &a, &b, &c, &dtype_arg, &device_arg))
    return NULL;
  double start = 0, stop, step = 1;
  bool all_int = PyLong_Check(a) && (b == Py_None || PyLong_Check(b)) && (!c || PyLong_Check(c));
  if (b == Py_None) {
    if (kp_scalar(a, &stop) <= 0) return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "arange: stop must be a number");
  } else {
    if (kp_scalar(a, &start) <= 0 || kp_scalar(b, &stop) <= 0)
      return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "arange: start and stop must be numbers");
  }
  if (c && kp_scalar(c, &step) <= 0) return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "arange: step must be a number");
  kiln_dtype_t dtype;
  kiln_device_t *device;
  if (kp_dtype_arg(dtype_arg, all_int ? KILN_I32 : KILN_F32, &dtype) < 0 || kp_device_kw(device_arg, &device) < 0)
    return NULL;
  if (isfinite(start) && isfinite(stop) && isfinite(step) && step != 0) {
    /* Its count as kiln_tensor_arange computes it; kiln checks the rest. */
    double count = ceil((stop - start) / step);
    if (count > 0 && count <= 9.0e15 &&
        (kp_value_fits(start, dtype, "arange", "start") < 0 ||
         kp_value_fits(start + (count - 1) * step, dtype, "arange", "the last value") < 0))
      return NULL;
  }
  kiln_tensor_t *out = NULL;
  return kp_result(kiln_tensor_arange(device, dtype, start, stop, step, &out), &out);
}

/* tensor(data, dtype=None, device=None): a copy of host data on a device. */
static PyObject *kp_fn_tensor(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"data", "dtype", "device", NULL};
  PyObject *data, *dtype_arg = NULL, *device_arg = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:tensor", names, &data, &dtype_arg, &device_arg)) return NULL;
  kiln_device_t *device;
  if (kp_device_kw(device_arg, &device) < 0) return NULL;
  return kp_tensor_from_object(data, device, dtype_arg);
}

/* The seed of the next random tensor when none is given: a counter that
 * manual_seed restarts, so a program draws the same numbers on every run. */
static uint64_t kp_next_seed;

static int kp_seed_arg(PyObject *arg, uint64_t *out) {
  if (!arg || arg == Py_None) {
    *out = kp_next_seed++;
    return 0;
  }
  unsigned long long v = PyLong_AsUnsignedLongLongMask(arg);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  *out = v;
  return 0;
}

static PyObject *kp_fn_manual_seed(PyObject *self, PyObject *arg) {
  unsigned long long v = PyLong_AsUnsignedLongLongMask(arg);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  kp_next_seed = v;
  Py_RETURN_NONE;
}

/* rand(*size, low=0, high=1, seed=None, dtype=None, device=None) and
 * randn(*size, mean=0, std=1, ...): the sizes as PyTorch's, everything else
 * by keyword (a number among the sizes is a TypeError naming them). Drawn in
 * the dtype named (kiln_tensor_uniform_dtype). */
static PyObject *kp_random(PyObject *args, PyObject *kwargs, bool normal, const char *name) {
  static char *names[] = {"size", "shape", "low", "high", "seed", "dtype", "device", NULL};
  static char *names_n[] = {"size", "shape", "mean", "std", "seed", "dtype", "device", NULL};
  PyObject *size_kw = NULL, *shape_kw = NULL, *seed_arg = NULL, *dtype_arg = NULL, *device_arg = NULL;
  double p0 = 0.0, p1 = 1.0;
  char format[48];
  snprintf(format, sizeof format, "|$OOddOOO:%s", name);
  PyObject *empty = PyTuple_New(0);
  bool ok = empty && PyArg_ParseTupleAndKeywords(empty, kwargs, format, normal ? names_n : names, &size_kw, &shape_kw,
                                                 &p0, &p1, &seed_arg, &dtype_arg, &device_arg);
  Py_XDECREF(empty);
  if (!ok) return NULL;
  int64_t shape[KILN_MAX_DIMS];
  PyObject *size_obj = size_kw ? size_kw : shape_kw;
  if (size_obj && PyTuple_GET_SIZE(args) > 0)
    return PyErr_Format(PyExc_TypeError, "%s(): the size is given twice (positionally and by keyword)", name);
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  /* uniform/normal keep kiln's older (shape, low, high) when the shape is one
   * tuple or list, where nothing can be misread; rand/randn are PyTorch's. */
  bool legacy = !strcmp(name, "uniform") || !strcmp(name, "normal");
  if (legacy && nargs >= 2 && nargs <= 3 && (PyTuple_Check(PyTuple_GET_ITEM(args, 0)) ||
                                             PyList_Check(PyTuple_GET_ITEM(args, 0)))) {
    if ((kwargs && PyDict_GET_SIZE(kwargs) > 0 &&
         (PyDict_GetItemString(kwargs, normal ? "mean" : "low") || PyDict_GetItemString(kwargs, normal ? "std" : "high"))))
      return PyErr_Format(PyExc_TypeError, "%s(): a distribution parameter given twice", name);
    if (kp_scalar(PyTuple_GET_ITEM(args, 1), &p0) <= 0 || (nargs == 3 && kp_scalar(PyTuple_GET_ITEM(args, 2), &p1) <= 0))
      return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "%s(shape, %s, %s): numbers", name,
                                                    normal ? "mean" : "low", normal ? "std" : "high");
    nargs = 1;
  }
  PyObject *sizes = PyTuple_GetSlice(args, 0, nargs);
  if (!sizes) return NULL;
  int ndim = size_obj ? kp_shape_arg(size_obj, shape, "size") : kp_size_args(sizes, 0, name, shape, NULL);
  Py_DECREF(sizes);
  kiln_device_t *device;
  kiln_dtype_t dtype;
  uint64_t seed;
  if (ndim < 0 || kp_device_kw(device_arg, &device) < 0 || kp_dtype_arg(dtype_arg, KILN_F32, &dtype) < 0) return NULL;
  if (kiln_dtype_class(dtype) != KILN_DTYPE_CLASS_FLOAT)
    return kp_raise_msg(KILN_DTYPE_MISMATCH, "%s(): dtype %s; random numbers come in a float dtype (float32, float64, "
                        "float16, bfloat16): convert after (.long())", name, kiln_dtype_long_name(dtype));
  if (kp_seed_arg(seed_arg, &seed) < 0) return NULL;
  /* In the dtype itself (f16/bf16: the f32 numbers rounded; f64: 53-bit
   * numbers of the same counters), the same bits as the C API's. */
  kiln_tensor_t *out = NULL;
  kiln_status_t status =
      normal ? kiln_tensor_normal_dtype(device, dtype, ndim, shape, seed, (float)p0, (float)p1, &out)
             : kiln_tensor_uniform_dtype(device, dtype, ndim, shape, seed, (float)p0, (float)p1, &out);
  return kp_result(status, &out);
}

static PyObject *kp_fn_uniform(PyObject *s, PyObject *a, PyObject *k) { return kp_random(a, k, false, "uniform"); }
static PyObject *kp_fn_normal(PyObject *s, PyObject *a, PyObject *k) { return kp_random(a, k, true, "normal"); }
static PyObject *kp_fn_rand(PyObject *s, PyObject *a, PyObject *k) { return kp_random(a, k, false, "rand"); }
static PyObject *kp_fn_randn(PyObject *s, PyObject *a, PyObject *k) { return kp_random(a, k, true, "randn"); }

/* ---- reductions and nn operations --------------------------------------------------------------- */

static PyObject *kp_fn_norm(PyObject *self, PyObject *arg) {
  kiln_tensor_t *t = kp_tensor_arg(arg, "a"), *out = NULL;
  if (!t || kp_ag_refuse(arg, "norm") < 0) return NULL;
  return kp_result(kiln_tensor_norm(t, &out), &out);
}

PyObject *kp_softmax(PyObject *a, bool log) {
  kiln_tensor_t *out = NULL;
  int rec = kp_ag_wanted(a, NULL);
  return KP_AG_OP(rec,
                  log ? kiln_nn_tape_log_softmax(kp_ag_tape(), kp_ag_in(a), &out)
                      : kiln_nn_tape_softmax(kp_ag_tape(), kp_ag_in(a), &out),
                  log ? kiln_tensor_log_softmax(KP_TENSOR(a), &out) : kiln_tensor_softmax(KP_TENSOR(a), &out), &out);
}

static PyObject *kp_softmax_common(PyObject *args, PyObject *kwargs, bool log) {
  static char *names[] = {"a", "axis", NULL};
  PyObject *a;
  int axis = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, log ? "O|i:log_softmax" : "O|i:softmax", names, &a, &axis)) return NULL;
  kiln_tensor_t *t = kp_tensor_arg(a, "a");
  if (!t) return NULL;
  if (axis != -1 && axis != kiln_tensor_ndim(t) - 1)
    return kp_raise_msg(KILN_UNSUPPORTED, "%s along axis %d: kiln computes it along the last axis only; move the axis "
                        "last first (swapaxes)", log ? "log_softmax" : "softmax", axis);
  return kp_softmax(a, log);
}
static PyObject *kp_fn_softmax(PyObject *s, PyObject *a, PyObject *k) { return kp_softmax_common(a, k, false); }
static PyObject *kp_fn_log_softmax(PyObject *s, PyObject *a, PyObject *k) { return kp_softmax_common(a, k, true); }

static PyObject *kp_fn_cross_entropy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "cross_entropy(logits, labels) takes two tensors");
  kiln_tensor_t *l = kp_tensor_arg(args[0], "logits"), *y = l ? kp_tensor_arg(args[1], "labels") : NULL, *out = NULL;
  if (!y) return NULL;
  /* PyTorch's labels are int64: class indices fit int32, kiln's label dtype
   * (one outside [0, C) is reported by the device as for int32). */
  kiln_tensor_t *y32 = NULL;
  kiln_status_t status = KILN_OK;
  if (kiln_tensor_dtype(y) == KILN_I64 && (status = kiln_tensor_cast(y, KILN_I32, &y32)) != KILN_OK)
    return kp_raise(status);
  int rec = kp_ag_wanted(args[0], NULL);
  if (rec < 0) {
    kiln_tensor_release(y32);
    return NULL;
  }
  status = rec ? KP_AG(kiln_nn_tape_cross_entropy(kp_ag_tape(), kp_ag_in(args[0]), y32 ? y32 : y, &out))
               : kiln_tensor_cross_entropy(l, y32 ? y32 : y, &out);
  kiln_tensor_release(y32);
  return kp_ag_result(rec, status, &out);
}

static int kp_conv_params(PyObject *stride, PyObject *padding, PyObject *dilation, kiln_conv2d_params_t *p) {
  *p = kiln_conv2d_params_default();
  if (kp_pair_arg(stride, 1, p->stride, "stride") < 0 || kp_pair_arg(padding, 0, p->padding, "padding") < 0 ||
      kp_pair_arg(dilation, 1, p->dilation, "dilation") < 0)
    return -1;
  return 0;
}

static PyObject *kp_fn_conv2d(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "weight", "bias", "stride", "padding", "dilation", NULL};
  PyObject *x, *w, *b = Py_None, *stride = NULL, *padding = NULL, *dilation = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OOOO:conv2d", names, &x, &w, &b, &stride, &padding, &dilation))
    return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *tw = tx ? kp_tensor_arg(w, "weight") : NULL, *tb = NULL, *out = NULL;
  if (!tw) return NULL;
  if (b != Py_None && !(tb = kp_tensor_arg(b, "bias"))) return NULL;
  kiln_conv2d_params_t p;
  if (kp_conv_params(stride, padding, dilation, &p) < 0) return NULL;
  int rec = kp_ag_wanted(x, w);
  if (!rec && tb) rec = kp_ag_wanted(b, NULL);
  return KP_AG_OP(rec, kiln_nn_tape_conv2d(kp_ag_tape(), kp_ag_in(x), kp_ag_in(w), tb ? kp_ag_in(b) : NULL, &p, &out),
                  kiln_tensor_conv2d(tx, tw, tb, &p, &out), &out);
}

static int kp_pool_params(PyObject *kernel, PyObject *stride, PyObject *padding, kiln_pool2d_params_t *p) {
  if (kp_pair_arg(kernel, 1, p->kernel, "kernel_size") < 0 || kp_pair_arg(stride, 0, p->stride, "stride") < 0 ||
      kp_pair_arg(padding, 0, p->padding, "padding") < 0)
    return -1;
  return 0;
}

static PyObject *kp_fn_max_pool2d(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "kernel_size", "stride", "padding", NULL};
  PyObject *x, *kernel, *stride = NULL, *padding = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:max_pool2d", names, &x, &kernel, &stride, &padding)) return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *out = NULL;
  if (!tx) return NULL;
  kiln_pool2d_params_t p;
  if (kp_pool_params(kernel, stride, padding, &p) < 0) return NULL;
  int rec = kp_ag_wanted(x, NULL);
  return KP_AG_OP(rec, kiln_nn_tape_max_pool2d(kp_ag_tape(), kp_ag_in(x), &p, &out), kiln_tensor_max_pool2d(tx, &p, &out),
                  &out);
}

/* ---- movement as functions ---------------------------------------------------------------------- */

PyObject *kp_reshape(PyObject *x, int ndim, const int64_t *shape) {
  kiln_tensor_t *out = NULL;
  int rec = kp_ag_wanted(x, NULL);
  return KP_AG_OP(rec, kiln_nn_tape_reshape(kp_ag_tape(), kp_ag_in(x), ndim, shape, &out),
                  kiln_tensor_reshape(KP_TENSOR(x), ndim, shape, &out), &out);
}

PyObject *kp_cast(PyObject *x, kiln_dtype_t dtype) {
  kiln_tensor_t *out = NULL;
  /* To an integer or bool dtype the result is a constant, as in PyTorch. */
  bool floating = dtype == KILN_F32 || dtype == KILN_F16 || dtype == KILN_BF16 || dtype == KILN_F64;
  int rec = floating ? kp_ag_wanted(x, NULL) : 0;
  return KP_AG_OP(rec, kiln_nn_tape_cast(kp_ag_tape(), kp_ag_in(x), dtype, &out), kiln_tensor_cast(KP_TENSOR(x), dtype, &out),
                  &out);
}

static PyObject *kp_fn_reshape(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "reshape(a, shape) takes two arguments");
  kiln_tensor_t *t = kp_tensor_arg(args[0], "a");
  int64_t shape[KILN_MAX_DIMS];
  int ndim = t ? kp_shape_arg(args[1], shape, "shape") : -1;
  if (ndim < 0) return NULL;
  return kp_reshape(args[0], ndim, shape);
}

static PyObject *kp_fn_astype(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "astype(a, dtype) takes two arguments");
  kiln_tensor_t *t = kp_tensor_arg(args[0], "a");
  kiln_dtype_t dtype;
  if (!t || kp_dtype_arg(args[1], KILN_F32, &dtype) < 0) return NULL;
  return kp_cast(args[0], dtype);
}

/* result_type(a, b): the dtype two operands of these dtypes (or tensors)
 * compute in (kiln_result_dtype, the table every binary op uses). */
static PyObject *kp_fn_result_type(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "result_type(a, b) takes two dtypes or tensors");
  kiln_dtype_t d[2], out;
  for (int i = 0; i < 2; i++) {
    if (KP_IS_TENSOR(args[i])) d[i] = kiln_tensor_dtype(KP_TENSOR(args[i]));
    else if (kp_dtype_arg(args[i], KILN_F32, &d[i]) < 0) return NULL;
  }
  kiln_status_t status = kiln_result_dtype(d[0], d[1], &out);
  if (status != KILN_OK) return kp_raise(status);
  return Py_NewRef(kp_dtype_object(out));
}

/* where(cond, a, b): a where cond holds, else b (kiln_tensor_where; a bool
 * or integer cond is taken as int32, nonzero true). Not recorded. */
static PyObject *kp_fn_where(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "where(cond, a, b) takes three tensors");
  kiln_tensor_t *c = kp_tensor_arg(args[0], "cond"), *a = c ? kp_tensor_arg(args[1], "a") : NULL,
                *b = a ? kp_tensor_arg(args[2], "b") : NULL, *c32 = NULL, *out = NULL;
  if (!b || kp_ag_refuse(args[1], "where") < 0 || kp_ag_refuse(args[2], "where") < 0) return NULL;
  kiln_dtype_t cd = kiln_tensor_dtype(c);
  kiln_status_t status = KILN_OK;
  if (cd != KILN_F32 && cd != KILN_I32) status = kiln_tensor_cast(c, KILN_I32, &c32);
  if (status == KILN_OK) status = kiln_tensor_where(c32 ? c32 : c, a, b, &out);
  kiln_tensor_release(c32);
  return kp_result(status, &out);
}

/* ---- gradients -------------------------------------------------------------------------------------- */

static PyObject *kp_fn_unary_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "unary_backward(op, x, dy) takes three arguments");
  kiln_unary_op_t op;
  if (kp_unary_name(args[0], &op) < 0) return NULL;
  kiln_tensor_t *x = kp_tensor_arg(args[1], "x"), *dy = x ? kp_tensor_arg(args[2], "dy") : NULL, *out = NULL;
  if (!dy) return NULL;
  return kp_result(kiln_tensor_unary_backward(op, x, dy, &out), &out);
}

static PyObject *kp_fn_sum_to(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "sum_to(a, shape) takes two arguments");
  kiln_tensor_t *t = kp_tensor_arg(args[0], "a"), *out = NULL;
  int64_t shape[KILN_MAX_DIMS];
  int ndim = t ? kp_shape_arg(args[1], shape, "shape") : -1;
  if (ndim < 0) return NULL;
  return kp_result(kiln_tensor_sum_to(t, ndim, shape, &out), &out);
}

static PyObject *kp_fn_broadcast_to(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "broadcast_to(a, shape) takes two arguments");
  kiln_tensor_t *t = kp_tensor_arg(args[0], "a"), *out = NULL;
  int64_t shape[KILN_MAX_DIMS];
  int ndim = t ? kp_shape_arg(args[1], shape, "shape") : -1;
  if (ndim < 0) return NULL;
  return kp_result(kiln_tensor_broadcast_to(t, ndim, shape, &out), &out);
}

static PyObject *kp_fn_softmax_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"y", "dy", "log", NULL};
  PyObject *y, *dy;
  int log = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|p:softmax_backward", names, &y, &dy, &log)) return NULL;
  kiln_tensor_t *ty = kp_tensor_arg(y, "y"), *tdy = ty ? kp_tensor_arg(dy, "dy") : NULL, *out = NULL;
  if (!tdy) return NULL;
  return kp_result(kiln_tensor_softmax_backward(ty, tdy, log != 0, &out), &out);
}

static PyObject *kp_fn_cross_entropy_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"logits", "labels", "dloss", NULL};
  PyObject *l, *y, *d = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:cross_entropy_backward", names, &l, &y, &d)) return NULL;
  kiln_tensor_t *tl = kp_tensor_arg(l, "logits"), *ty = tl ? kp_tensor_arg(y, "labels") : NULL, *td = NULL, *out = NULL;
  if (!ty) return NULL;
  if (d != Py_None && !(td = kp_tensor_arg(d, "dloss"))) return NULL;
  return kp_result(kiln_tensor_cross_entropy_backward(tl, ty, td, &out), &out);
}

static int kp_shape4(PyObject *arg, int64_t out[4], const char *what) {
  int64_t s[KILN_MAX_DIMS];
  int n = kp_shape_arg(arg, s, what);
  if (n < 0) return -1;
  if (n != 4) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s needs 4 sizes, not %d", what, n);
    return -1;
  }
  memcpy(out, s, 4 * sizeof(int64_t));
  return 0;
}

static PyObject *kp_fn_conv2d_backward_input(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"dy", "weight", "x_shape", "stride", "padding", "dilation", NULL};
  PyObject *dy, *w, *xs, *stride = NULL, *padding = NULL, *dilation = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOO:conv2d_backward_input", names, &dy, &w, &xs, &stride, &padding,
                                   &dilation))
    return NULL;
  kiln_tensor_t *tdy = kp_tensor_arg(dy, "dy"), *tw = tdy ? kp_tensor_arg(w, "weight") : NULL, *out = NULL;
  int64_t shape[4];
  kiln_conv2d_params_t p;
  if (!tw || kp_shape4(xs, shape, "x_shape") < 0 || kp_conv_params(stride, padding, dilation, &p) < 0) return NULL;
  return kp_result(kiln_tensor_conv2d_backward_input(tdy, tw, shape, &p, &out), &out);
}

static PyObject *kp_fn_conv2d_backward_weight(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "dy", "w_shape", "stride", "padding", "dilation", NULL};
  PyObject *x, *dy, *ws, *stride = NULL, *padding = NULL, *dilation = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOO:conv2d_backward_weight", names, &x, &dy, &ws, &stride,
                                   &padding, &dilation))
    return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *tdy = tx ? kp_tensor_arg(dy, "dy") : NULL, *out = NULL;
  int64_t shape[4];
  kiln_conv2d_params_t p;
  if (!tdy || kp_shape4(ws, shape, "w_shape") < 0 || kp_conv_params(stride, padding, dilation, &p) < 0) return NULL;
  return kp_result(kiln_tensor_conv2d_backward_weight(tx, tdy, shape, &p, &out), &out);
}

static PyObject *kp_fn_conv2d_backward_bias(PyObject *self, PyObject *arg) {
  kiln_tensor_t *t = kp_tensor_arg(arg, "dy"), *out = NULL;
  if (!t) return NULL;
  return kp_result(kiln_tensor_conv2d_backward_bias(t, &out), &out);
}

static PyObject *kp_fn_max_pool2d_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "dy", "kernel_size", "stride", "padding", NULL};
  PyObject *x, *dy, *kernel, *stride = NULL, *padding = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OO:max_pool2d_backward", names, &x, &dy, &kernel, &stride,
                                   &padding))
    return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *tdy = tx ? kp_tensor_arg(dy, "dy") : NULL, *out = NULL;
  kiln_pool2d_params_t p;
  if (!tdy || kp_pool_params(kernel, stride, padding, &p) < 0) return NULL;
  return kp_result(kiln_tensor_max_pool2d_backward(tx, tdy, &p, &out), &out);
}

/* ---- updates in place ---------------------------------------------------------------------------------- */

static PyObject *kp_fn_sgd_update(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"param", "grad", "momentum_buffer", "lr", "momentum", "dampening", "weight_decay", "nesterov",
                          "first_step", "copy", NULL};
  PyObject *param, *grad, *buf = Py_None, *copy = Py_None;
  kiln_sgd_params_t p = {.lr = NAN};
  int nesterov = 0, first_step = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$ddddppO:sgd_update", names, &param, &grad, &buf, &p.lr,
                                   &p.momentum, &p.dampening, &p.weight_decay, &nesterov, &first_step, &copy))
    return NULL;
  if (isnan(p.lr)) return PyErr_Format(PyExc_TypeError, "sgd_update() needs lr=");
  p.nesterov = nesterov != 0;
  p.first_step = first_step != 0;
  kiln_tensor_t *tp = kp_tensor_arg(param, "param"), *tg = tp ? kp_tensor_arg(grad, "grad") : NULL, *tb = NULL;
  if (!tg) return NULL;
  if (buf != Py_None && !(tb = kp_tensor_arg(buf, "momentum_buffer"))) return NULL;
  kiln_tensor_t *tc = NULL;
  if (copy != Py_None && !(tc = kp_tensor_arg(copy, "copy"))) return NULL;
  kiln_status_t status = kiln_tensor_sgd_update_mixed(tp, tg, tb, tc, &p);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_fn_adam_update(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"param", "grad", "m", "v", "step", "lr", "beta1", "beta2", "eps", "weight_decay", "copy", NULL};
  PyObject *param, *grad, *m, *v, *copy = Py_None;
  long long step;
  kiln_adam_params_t p = {.lr = NAN, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOL|$dddddO:adam_update", names, &param, &grad, &m, &v, &step,
                                   &p.lr, &p.beta1, &p.beta2, &p.eps, &p.weight_decay, &copy))
    return NULL;
  if (isnan(p.lr)) return PyErr_Format(PyExc_TypeError, "adam_update() needs lr=");
  kiln_tensor_t *tp = kp_tensor_arg(param, "param"), *tg = tp ? kp_tensor_arg(grad, "grad") : NULL;
  kiln_tensor_t *tm = tg ? kp_tensor_arg(m, "m") : NULL, *tv = tm ? kp_tensor_arg(v, "v") : NULL;
  if (!tv) return NULL;
  kiln_tensor_t *tc = NULL;
  if (copy != Py_None && !(tc = kp_tensor_arg(copy, "copy"))) return NULL;
  kiln_status_t status = kiln_tensor_adam_update_mixed(tp, tg, tm, tv, tc, (int64_t)step, &p);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_fn_unscale(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"grad", "scale", "found_inf", NULL};
  PyObject *grad, *found;
  double scale;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OdO:unscale", names, &grad, &scale, &found)) return NULL;
  kiln_tensor_t *tg = kp_tensor_arg(grad, "grad"), *tf = tg ? kp_tensor_arg(found, "found_inf") : NULL, *out = NULL;
  if (!tf) return NULL;
  return kp_result(kiln_tensor_unscale(tg, scale, tf, &out), &out);
}

/* ---- the table -------------------------------------------------------------------------------------------- */

#define KP_KW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS
#define KP_FAST(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL

/* The calls kiln has no recorded form of (the gradient formulas, the
 * optimizers' updates, sum_to, broadcast_to): refused in grad mode when an
 * argument requires grad, as every other unrecorded op. */
static int kp_refuse_any(PyObject *const *items, Py_ssize_t n, PyObject *kwargs, const char *op) {
  for (Py_ssize_t i = 0; i < n; i++)
    if (kp_ag_refuse(items[i], op) < 0) return -1;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (kwargs && PyDict_Next(kwargs, &pos, &key, &value))
    if (kp_ag_refuse(value, op) < 0) return -1;
  return 0;
}
#define KP_UNRECORDED_KW(name)                                                                              \
  static PyObject *kp_fn_##name##_ng(PyObject *s, PyObject *a, PyObject *k) {                                \
    if (kp_refuse_any(&PyTuple_GET_ITEM(a, 0), PyTuple_GET_SIZE(a), k, #name) < 0) return NULL;              \
    return kp_fn_##name(s, a, k);                                                                            \
  }
#define KP_UNRECORDED_FAST(name)                                                                            \
  static PyObject *kp_fn_##name##_ng(PyObject *s, PyObject *const *a, Py_ssize_t n) {                        \
    if (kp_refuse_any(a, n, NULL, #name) < 0) return NULL;                                                   \
    return kp_fn_##name(s, a, n);                                                                            \
  }
KP_UNRECORDED_KW(softmax_backward)
KP_UNRECORDED_KW(cross_entropy_backward)
KP_UNRECORDED_KW(conv2d_backward_input)
KP_UNRECORDED_KW(conv2d_backward_weight)
KP_UNRECORDED_KW(max_pool2d_backward)
KP_UNRECORDED_KW(sgd_update)
KP_UNRECORDED_KW(adam_update)
KP_UNRECORDED_KW(unscale)
KP_UNRECORDED_FAST(unary_backward)
KP_UNRECORDED_FAST(sum_to)
KP_UNRECORDED_FAST(broadcast_to)
static PyObject *kp_fn_conv2d_backward_bias_ng(PyObject *s, PyObject *a) {
  return kp_ag_refuse(a, "conv2d_backward_bias") < 0 ? NULL : kp_fn_conv2d_backward_bias(s, a);
}
#undef KP_UNRECORDED_KW
#undef KP_UNRECORDED_FAST

/* PyTorch's requires_grad= on every creation call: taken out of the
 * keywords before the call parses them, applied to the new tensor (a float32
 * leaf, else the error requires_grad_ gives). */
static PyObject *kp_creation(PyObject *(*make)(PyObject *, PyObject *, PyObject *), PyObject *self, PyObject *args,
                             PyObject *kwargs) {
  PyObject *flag = kwargs ? PyDict_GetItemString(kwargs, "requires_grad") : NULL;
  if (!flag) return make(self, args, kwargs);
  int on = PyObject_IsTrue(flag);
  PyObject *rest = on < 0 ? NULL : PyDict_Copy(kwargs);
  if (!rest || PyDict_DelItemString(rest, "requires_grad") < 0) {
    Py_XDECREF(rest);
    return NULL;
  }
  PyObject *r = make(self, args, rest);
  Py_DECREF(rest);
  if (r && on) {
    PyObject *same = PyObject_CallMethod(r, "requires_grad_", NULL);
    Py_DECREF(r);
    r = same;
  }
  return r;
}
#define KP_CREATION(name) \
  static PyObject *kp_fn_##name##_rg(PyObject *s, PyObject *a, PyObject *k) { return kp_creation(kp_fn_##name, s, a, k); }
KP_CREATION(empty)
KP_CREATION(zeros)
KP_CREATION(ones)
KP_CREATION(full)
KP_CREATION(empty_like)
KP_CREATION(zeros_like)
KP_CREATION(ones_like)
KP_CREATION(full_like)
KP_CREATION(arange)
KP_CREATION(tensor)
KP_CREATION(uniform)
KP_CREATION(rand)
KP_CREATION(normal)
KP_CREATION(randn)
#undef KP_CREATION

PyMethodDef kp_ops_methods[] = {
    {"empty", KP_KW(kp_fn_empty_rg), "empty(*size, dtype=None, device=None, requires_grad=False)\n--\n\nA tensor of undefined values."},
    {"zeros", KP_KW(kp_fn_zeros_rg), "zeros(*size, dtype=None, device=None, requires_grad=False)\n--\n\nA tensor of zeros."},
    {"ones", KP_KW(kp_fn_ones_rg), "ones(*size, dtype=None, device=None, requires_grad=False)\n--\n\nA tensor of ones."},
    {"full", KP_KW(kp_fn_full_rg), "full(shape, fill_value, dtype=None, *, device=None, requires_grad=False)\n--\n\nA tensor of one value."},
    {"empty_like", KP_KW(kp_fn_empty_like_rg), "empty_like(a, dtype=None, *, device=None, requires_grad=False)\n--\n\nempty() of a's shape, dtype and device."},
    {"zeros_like", KP_KW(kp_fn_zeros_like_rg), "zeros_like(a, dtype=None, *, device=None, requires_grad=False)\n--\n\nzeros() of a's shape, dtype and device."},
    {"ones_like", KP_KW(kp_fn_ones_like_rg), "ones_like(a, dtype=None, *, device=None, requires_grad=False)\n--\n\nones() of a's shape, dtype and device."},
    {"full_like", KP_KW(kp_fn_full_like_rg), "full_like(a, fill_value, dtype=None, *, device=None, requires_grad=False)\n--\n\nfull() of a's shape, dtype and device."},
    {"arange", KP_KW(kp_fn_arange_rg),
     "arange(start, stop=None, step=1, dtype=None, *, device=None, requires_grad=False)\n--\n\nEvenly spaced values in [start, stop), as "
     "NumPy's: int32 when the bounds are ints, else float32."},
    {"tensor", KP_KW(kp_fn_tensor_rg),
     "tensor(data, dtype=None, *, device=None, requires_grad=False)\n--\n\nA new tensor holding a copy of `data`: numbers, nested lists, a "
     "NumPy array or anything with the buffer protocol, or another kiln tensor. Floats become float32 and integers "
     "int32 unless dtype says otherwise. Blocks until the data has left host memory."},
    {"asarray", KP_KW(kp_fn_tensor), "asarray(data, dtype=None, *, device=None)\n--\n\nkiln.tensor(data, ...): a copy."},
    {"uniform", KP_KW(kp_fn_uniform_rg),
     "uniform(*size, low=0.0, high=1.0, seed=None, dtype=None, device=None, requires_grad=False)\n--\n\nUniform numbers in [low, "
     "high) from Philox with key `seed` (the same numbers on every device); seed None takes the next of "
     "kiln.manual_seed's counter. The size as ints or one tuple; the rest keyword-only."},
    {"rand", KP_KW(kp_fn_rand_rg),
     "rand(*size, low=0.0, high=1.0, seed=None, dtype=None, device=None, requires_grad=False)\n--\n\nkiln.uniform: rand(2, 3) or "
     "rand((2, 3))."},
    {"normal", KP_KW(kp_fn_normal_rg),
     "normal(*size, mean=0.0, std=1.0, seed=None, dtype=None, device=None, requires_grad=False)\n--\n\nNormal numbers (Philox, as "
     "uniform)."},
    {"randn", KP_KW(kp_fn_randn_rg),
     "randn(*size, mean=0.0, std=1.0, seed=None, dtype=None, device=None, requires_grad=False)\n--\n\nkiln.normal: randn(2, 3)."},
    {"manual_seed", kp_fn_manual_seed, METH_O,
     "manual_seed(seed)\n--\n\nRestart the counter that gives random tensors their seed when none is given."},
#define KP_BINARY_ENTRY(NAME, name) {#name, KP_FAST(kp_fn_##name), #name "(a, b)\n--\n\nElementwise " #name " with NumPy's broadcasting; either side may be a number."},
    KILN_BINARY_OPS(KP_BINARY_ENTRY)
#undef KP_BINARY_ENTRY
    {"matmul", KP_KW(kp_fn_matmul),
     "matmul(a, b, transpose_a=False, transpose_b=False)\n--\n\nMatrix product (2-D, batched 3-D, or a 1-D vector "
     "on either side as NumPy's); float32."},
#define KP_UNARY_ENTRY(NAME, name) {#name, kp_fn_##name, METH_O, #name "(x)\n--\n\nElementwise " #name "."},
    KILN_UNARY_OPS(KP_UNARY_ENTRY)
#undef KP_UNARY_ENTRY
    {"norm", kp_fn_norm, METH_O, "norm(a)\n--\n\nThe Frobenius norm: a 0-d float32 tensor."},
    {"softmax", KP_KW(kp_fn_softmax), "softmax(a, axis=-1)\n--\n\nSoftmax along the last axis."},
    {"log_softmax", KP_KW(kp_fn_log_softmax), "log_softmax(a, axis=-1)\n--\n\nLog-softmax along the last axis."},
    {"cross_entropy", KP_FAST(kp_fn_cross_entropy),
     "cross_entropy(logits, labels)\n--\n\nMean over N of -log_softmax(logits)[n, labels[n]]; logits float32 [N, C], "
     "labels int32 [N]."},
    {"conv2d", KP_KW(kp_fn_conv2d),
     "conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1)\n--\n\nCross-correlation as in deep-learning "
     "frameworks: x [N, C, H, W], weight [K, C, R, S], bias [K]."},
    {"max_pool2d", KP_KW(kp_fn_max_pool2d),
     "max_pool2d(x, kernel_size, stride=None, padding=0)\n--\n\nMax pooling over [N, C, H, W]; stride None means "
     "kernel_size."},
    {"reshape", KP_FAST(kp_fn_reshape), "reshape(a, shape)\n--\n\na.reshape(shape)."},
    {"astype", KP_FAST(kp_fn_astype), "astype(a, dtype)\n--\n\na.astype(dtype)."},
    {"result_type", KP_FAST(kp_fn_result_type),
     "result_type(a, b)\n--\n\nThe dtype a binary op of these two dtypes (or tensors) computes in."},
    {"where", KP_FAST(kp_fn_where),
     "where(cond, a, b)\n--\n\na where cond holds (nonzero), else b, broadcast together; a and b of one dtype."},
    {"unary_backward", KP_FAST(kp_fn_unary_backward_ng),
     "unary_backward(op, x, dy)\n--\n\ndy * op'(x) for a unary op named as kiln names it ('relu', 'tanh', ...)."},
    {"sum_to", KP_FAST(kp_fn_sum_to_ng),
     "sum_to(a, shape)\n--\n\nThe sum of `a` over the axes along which `shape` broadcasts to a's shape."},
    {"broadcast_to", KP_FAST(kp_fn_broadcast_to_ng), "broadcast_to(a, shape)\n--\n\n`a` broadcast to `shape` (a new tensor)."},
    {"softmax_backward", KP_KW(kp_fn_softmax_backward_ng),
     "softmax_backward(y, dy, log=False)\n--\n\nThe gradient of softmax (log_softmax when log) from its result y."},
    {"cross_entropy_backward", KP_KW(kp_fn_cross_entropy_backward_ng),
     "cross_entropy_backward(logits, labels, dloss=None)\n--\n\n(softmax(logits) - onehot(labels)) / N, times dloss."},
    {"conv2d_backward_input", KP_KW(kp_fn_conv2d_backward_input_ng),
     "conv2d_backward_input(dy, weight, x_shape, stride=1, padding=0, dilation=1)\n--\n\nconv2d's gradient for x."},
    {"conv2d_backward_weight", KP_KW(kp_fn_conv2d_backward_weight_ng),
     "conv2d_backward_weight(x, dy, w_shape, stride=1, padding=0, dilation=1)\n--\n\nconv2d's gradient for weight."},
    {"conv2d_backward_bias", kp_fn_conv2d_backward_bias_ng, METH_O,
     "conv2d_backward_bias(dy)\n--\n\nconv2d's gradient for bias: dy summed over N, P and Q."},
    {"max_pool2d_backward", KP_KW(kp_fn_max_pool2d_backward_ng),
     "max_pool2d_backward(x, dy, kernel_size, stride=None, padding=0)\n--\n\nmax_pool2d's gradient for x."},
    {"sgd_update", KP_KW(kp_fn_sgd_update_ng),
     "sgd_update(param, grad, momentum_buffer, *, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, "
     "first_step=False, copy=None)\n--\n\nOne fused SGD step in place, as torch.optim.SGD (momentum_buffer None "
     "when momentum is 0; first_step: the buffer's first update, buf = g whatever the dampening, as torch does). grad "
     "may be float32, float16 or bfloat16; copy (float16 or bfloat16, param's shape) receives the new param rounded, "
     "in the same pass (mixed precision)."},
    {"adam_update", KP_KW(kp_fn_adam_update_ng),
     "adam_update(param, grad, m, v, step, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0, copy=None)"
     "\n--\n\nOne fused Adam step in place, as torch.optim.Adam (step counts from 1); grad and copy as "
     "sgd_update's."},
    {"unscale", KP_KW(kp_fn_unscale_ng),
     "unscale(grad, scale, found_inf)\n--\n\ngrad * scale in float32, and found_inf (one float32 element) set to "
     "1 when grad holds an inf or a NaN, in one pass: a loss scaler's check and unscale."},
    {NULL, NULL, 0, NULL},
};
