/* python/src/nn_train.c: kiln.nn's owners, Parameter and Tape (the reverse-mode tape and its differentiable operations) over libkiln-nn. */
#include "kilnnn.h"

#include <pythread.h>
#include <string.h>

/* ---- owners ---------------------------------------------------------------------------- */

static void kp_owner_dealloc(kp_owner_t *o) {
  if (o->free_fn && o->ptr) o->free_fn(o->ptr);
  Py_XDECREF(o->parent);
  PyObject_Free(o);
}

PyTypeObject kp_owner_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn._Owner",
    .tp_basicsize = sizeof(kp_owner_t),
    .tp_dealloc = (destructor)kp_owner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Keeps a libkiln-nn object alive while Python objects borrow from it.",
};

kp_owner_t *kp_owner_new(void *ptr, void (*free_fn)(void *)) {
  kp_owner_t *o = PyObject_New(kp_owner_t, &kp_owner_type);
  if (!o) {
    if (free_fn && ptr) free_fn(ptr);
    return NULL;
  }
  o->ptr = ptr;
  o->free_fn = free_fn;
  o->parent = NULL;
  o->guard = (kp_guard_t){0};
  return o;
}

void kp_owner_transfer(kp_owner_t *owner, kp_owner_t *parent) {
  owner->free_fn = NULL;
  Py_XSETREF(owner->parent, Py_NewRef((PyObject *)parent));
}

/* ---- guards ---------------------------------------------------------------------------------- */

static kp_guard_t *kp_owner_guard(kp_owner_t *o) {
  while (o->parent) o = (kp_owner_t *)o->parent;
  return &o->guard;
}

kp_guard_t *kp_guard_of(PyObject *obj) {
  PyTypeObject *tp = Py_TYPE(obj);
  if (tp == &kp_owner_type) return kp_owner_guard((kp_owner_t *)obj);
  if (tp == &kp_model_type) return kp_owner_guard(((kp_model_t *)obj)->owner);
  if (tp == &kp_layer_type) return kp_owner_guard(((kp_layer_t *)obj)->owner);
  if (tp == &kp_param_type) {
    kp_param_t *p = (kp_param_t *)obj;
    return p->owner ? kp_owner_guard(p->owner) : &p->guard;
  }
  if (tp == &kp_optim_type) {
    kp_optim_t *o = (kp_optim_t *)obj;
    return o->guard_source ? kp_guard_of(o->guard_source) : &o->own_guard;
  }
  if (tp == &kp_loader_type) return &((kp_loader_t *)obj)->guard;
  return NULL;
}

static int kp_guard_busy(PyObject *obj, const kp_guard_t *g) {
  const char *name = Py_TYPE(obj)->tp_name;
  char through[128] = "";
  if (strcmp(name, g->type_name) != 0) snprintf(through, sizeof through, " (through its %s)", g->type_name);
  unsigned long me = PyThread_get_thread_ident();
  if (g->thread == me)
    PyErr_Format(PyExc_RuntimeError, "this %s is in use by %s%s further up this thread's stack (a progress callback "
                 "cannot use it); use it after %s returns", name, g->activity, through, g->activity);
  else
    PyErr_Format(PyExc_RuntimeError, "this %s is in use by %s%s on thread %lu (this is thread %lu): kiln.nn objects "
                 "are single-threaded; give each thread its own, or hold a lock around their use", name, g->activity,
                 through, g->thread, me);
  return -1;
}

int kp_guard_check(PyObject *obj) {
  const kp_guard_t *g = kp_guard_of(obj);
  return g && g->busy ? kp_guard_busy(obj, g) : 0;
}

int kp_guard_enter(PyObject *const *objs, int n, const char *activity, kp_guard_t **out_guards) {
  int count = 0;
  for (int i = 0; i < n; i++) {
    if (!objs[i]) continue;
    kp_guard_t *g = kp_guard_of(objs[i]);
    if (!g) continue;
    bool seen = false;
    for (int j = 0; j < count; j++) seen = seen || out_guards[j] == g;
    if (seen) continue;
    if (g->busy) {
      kp_guard_busy(objs[i], g);
      kp_guard_leave(out_guards, count);
      return -1;
    }
    *g = (kp_guard_t){true, PyThread_get_thread_ident(), activity, Py_TYPE(objs[i])->tp_name};
    out_guards[count++] = g;
  }
  return count;
}

void kp_guard_leave(kp_guard_t **guards, int count) {
  for (int i = 0; i < count; i++) guards[i]->busy = false;
}

/* ---- Parameter ------------------------------------------------------------------------------- */

PyObject *kp_param_wrap(kiln_nn_param_t *param, kp_owner_t *owner) {
  kp_param_t *p = PyObject_New(kp_param_t, &kp_param_type);
  if (!p) {
    if (!owner) kiln_nn_param_free(param);
    return NULL;
  }
  p->param = param;
  p->owner = owner ? (kp_owner_t *)Py_NewRef((PyObject *)owner) : NULL;
  p->guard = (kp_guard_t){0};
  return (PyObject *)p;
}

static void kp_param_dealloc(kp_param_t *p) {
  if (p->owner) Py_DECREF(p->owner);
  else kiln_nn_param_free(p->param);
  PyObject_Free(p);
}

static PyObject *kp_param_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"value", "name", NULL};
  PyObject *value;
  const char *name = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|z:Parameter", names, &value, &name)) return NULL;
  kiln_tensor_t *t = kp_tensor_arg(value, "value");
  if (!t) return NULL;
  kiln_nn_param_t *param = NULL;
  kiln_status_t status = kiln_nn_param_create(name, t, &param);
  if (status != KILN_OK) return kp_raise(status);
  return kp_param_wrap(param, NULL);
}

static PyObject *kp_param_get_name(kp_param_t *p, void *c) { return PyUnicode_FromString(kiln_nn_param_name(p->param)); }
static PyObject *kp_param_get_value(kp_param_t *p, void *c) {
  return kp_tensor_wrap(kiln_tensor_retain(kiln_nn_param_value(p->param)));
}
static PyObject *kp_param_get_grad(kp_param_t *p, void *c) {
  if (kp_guard_check((PyObject *)p) < 0) return NULL;
  kiln_tensor_t *g = kiln_nn_param_grad(p->param);
  if (!g) Py_RETURN_NONE;
  return kp_tensor_wrap(kiln_tensor_retain(g));
}
static PyObject *kp_param_get_shape(kp_param_t *p, void *c) {
  kiln_tensor_t *v = kiln_nn_param_value(p->param);
  return kp_shape_tuple(kiln_tensor_ndim(v), kiln_tensor_shape(v));
}
static PyObject *kp_param_get_device(kp_param_t *p, void *c) {
  return kp_device_object(kiln_tensor_device(kiln_nn_param_value(p->param)));
}

static PyObject *kp_param_zero_grad(kp_param_t *p, PyObject *unused) {
  if (kp_guard_check((PyObject *)p) < 0) return NULL;
  kiln_nn_param_zero_grad(p->param);
  Py_RETURN_NONE;
}

static PyObject *kp_param_init_uniform(kp_param_t *p, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"fan_in", "seed", NULL};
  long long fan_in;
  unsigned long long seed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|K:init_uniform", names, &fan_in, &seed) ||
      kp_guard_check((PyObject *)p) < 0)
    return NULL;
  kiln_status_t status = kiln_nn_param_init_uniform(p->param, fan_in, seed);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_param_repr(kp_param_t *p) {
  PyObject *shape = kp_param_get_shape(p, NULL);
  if (!shape) return NULL;
  PyObject *r = PyUnicode_FromFormat("kiln.nn.Parameter('%s', shape=%R, device='%s')", kiln_nn_param_name(p->param),
                                     shape, kiln_device_selector(kiln_tensor_device(kiln_nn_param_value(p->param))));
  Py_DECREF(shape);
  return r;
}

static PyObject *kp_param_to(kp_param_t *p, PyObject *arg) {
  kiln_device_t *device;
  if (kp_guard_check((PyObject *)p) < 0 || kp_device_arg(arg, &device) < 0) return NULL;
  if (p->owner)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "parameter '%s' belongs to a layer or model: move that (layer.to(device))",
                        kiln_nn_param_name(p->param));
  kiln_status_t status = kiln_nn_param_to(p->param, device);
  if (status != KILN_OK) return kp_raise(status);
  return Py_NewRef((PyObject *)p);
}

static PyMethodDef kp_param_methods[] = {
    {"to", (PyCFunction)kp_param_to, METH_O,
     "to(device)\n--\n\nMove the value to `device` (a copy; the gradient is dropped) and return the parameter."},
    {"zero_grad", (PyCFunction)kp_param_zero_grad, METH_NOARGS,
     "zero_grad()\n--\n\nDrop the gradient (it reads as zero, as PyTorch's set_to_none)."},
    {"init_uniform", (PyCFunction)(void (*)(void))kp_param_init_uniform, METH_VARARGS | METH_KEYWORDS,
     "init_uniform(fan_in, seed=0)\n--\n\nPyTorch's default initialisation of a layer, in place: uniform in "
     "[-1/sqrt(fan_in), 1/sqrt(fan_in)), the same numbers on every device for a seed."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kp_param_getset[] = {
    {"name", (getter)kp_param_get_name, NULL, "'1.weight' inside a model, as PyTorch's state_dict names it", NULL},
    {"value", (getter)kp_param_get_value, NULL, "the value: the same tensor for the parameter's life (updated in place)",
     NULL},
    {"grad", (getter)kp_param_get_grad, NULL, "the gradient the last backward pass left, or None", NULL},
    {"shape", (getter)kp_param_get_shape, NULL, "the value's shape", NULL},
    {"device", (getter)kp_param_get_device, NULL, "the value's device", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kp_param_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn.Parameter",
    .tp_basicsize = sizeof(kp_param_t),
    .tp_dealloc = (destructor)kp_param_dealloc,
    .tp_repr = (reprfunc)kp_param_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Parameter(value, name=None)\n--\n\nA trainable float32 tensor (value, contiguous) and the gradient a "
              "backward pass left for it (grad, None until then).",
    .tp_methods = kp_param_methods,
    .tp_getset = kp_param_getset,
    .tp_new = kp_param_new,
};

/* ---- Tape ---------------------------------------------------------------------------------------- */

int kp_tape_arg(PyObject *arg, kiln_nn_tape_t **out) {
  if (!arg || arg == Py_None) {
    *out = NULL;
    return 0;
  }
  if (!Py_IS_TYPE(arg, &kp_tape_type)) {
    PyErr_Format(PyExc_TypeError, "tape must be a kiln.nn.Tape or None, not %.100s", Py_TYPE(arg)->tp_name);
    return -1;
  }
  *out = ((kp_tape_t *)arg)->tape;
  return 0;
}

/* Once per recording: a model run on one tape many times is kept once. */
static int kp_tape_keep_object(kp_tape_t *t, PyObject *obj) {
  for (Py_ssize_t i = PyList_GET_SIZE(t->watched); i-- > 0;)
    if (PyList_GET_ITEM(t->watched, i) == obj) return 0;
  return PyList_Append(t->watched, obj);
}

int kp_tape_keep(PyObject *tape_arg, kp_owner_t *owner) {
  if (!tape_arg || !Py_IS_TYPE(tape_arg, &kp_tape_type)) return 0;
  return kp_tape_keep_object((kp_tape_t *)tape_arg, (PyObject *)owner);
}

/* Whether a call is inside anything the record points at (its parameters
 * would change under the backward pass). */
static int kp_tape_check(kp_tape_t *t) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(t->watched); i++)
    if (kp_guard_check(PyList_GET_ITEM(t->watched, i)) < 0) return -1;
  return 0;
}

static void kp_tape_dealloc(kp_tape_t *t) {
  kiln_nn_tape_free(t->tape);
  Py_XDECREF(t->watched);
  PyObject_Free(t);
}

static PyObject *kp_tape_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  if ((args && PyTuple_GET_SIZE(args)) || (kwargs && PyDict_GET_SIZE(kwargs)))
    return PyErr_Format(PyExc_TypeError, "Tape() takes no arguments");
  kiln_nn_tape_t *tape = NULL;
  kiln_status_t status = kiln_nn_tape_create(&tape);
  if (status != KILN_OK) return kp_raise(status);
  kp_tape_t *t = PyObject_New(kp_tape_t, type);
  if (!t) {
    kiln_nn_tape_free(tape);
    return NULL;
  }
  t->tape = tape;
  t->watched = PyList_New(0);
  if (!t->watched) {
    Py_DECREF(t);
    return NULL;
  }
  return (PyObject *)t;
}

static void kp_tape_forget(kp_tape_t *t) {
  if (PyList_GET_SIZE(t->watched)) PyList_SetSlice(t->watched, 0, PyList_GET_SIZE(t->watched), NULL);
}

void kp_tape_end(kp_tape_t *t) {
  kiln_nn_tape_clear(t->tape);
  kp_tape_forget(t);
}

int kp_tape_watch_param(kp_tape_t *t, PyObject *param, kiln_tensor_t **out_value) {
  /* Kept before the C tape records the parameter's address. */
  if (kp_tape_keep_object(t, param) < 0) return -1;
  kiln_status_t status = kiln_nn_tape_watch(t->tape, ((kp_param_t *)param)->param, out_value);
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  return 0;
}

static PyObject *kp_tape_watch(kp_tape_t *t, PyObject *arg) {
  if (!Py_IS_TYPE(arg, &kp_param_type))
    return PyErr_Format(PyExc_TypeError, "watch() takes a kiln.nn.Parameter, not %.100s", Py_TYPE(arg)->tp_name);
  kiln_tensor_t *value = NULL;
  if (kp_guard_check(arg) < 0 || kp_tape_watch_param(t, arg, &value) < 0) return NULL;
  return kp_tensor_wrap(kiln_tensor_retain(value));
}

static PyObject *kp_tape_backward(kp_tape_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"y", "dy", NULL};
  PyObject *y, *dy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:backward", names, &y, &dy)) return NULL;
  kiln_tensor_t *ty = kp_tensor_arg(y, "y"), *tdy = NULL;
  if (!ty) return NULL;
  if (dy != Py_None && !(tdy = kp_tensor_arg(dy, "dy"))) return NULL;
  if (kp_tape_check(t) < 0) return NULL;
  kiln_status_t status = kiln_nn_tape_backward(t->tape, ty, tdy);
  /* A refused backward (y not on this tape, dy of another shape) keeps the
   * record, and so what it points at (until clear() or the next pass). */
  if (status == KILN_OK) kp_tape_forget(t);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_tape_clear(kp_tape_t *t, PyObject *unused) {
  kp_tape_end(t);
  Py_RETURN_NONE;
}

static Py_ssize_t kp_tape_len(PyObject *o) { return (Py_ssize_t)kiln_nn_tape_size(((kp_tape_t *)o)->tape); }

static PyObject *kp_tape_enter(PyObject *self, PyObject *unused) { return Py_NewRef(self); }
static PyObject *kp_tape_exit(kp_tape_t *t, PyObject *args) {
  /* Leaving a `with` block drops a record no backward pass consumed. */
  kp_tape_end(t);
  Py_RETURN_FALSE;
}

/* The differentiable operations. */

static PyObject *kp_tape_unary_op(kp_tape_t *t, kiln_unary_op_t op, PyObject *x) {
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *out = NULL;
  if (!tx) return NULL;
  return kp_result(kiln_nn_tape_unary(t->tape, op, tx, &out), &out);
}

#define KP_TAPE_UNARY(NAME, name) \
  static PyObject *kp_tape_##name(kp_tape_t *t, PyObject *x) { return kp_tape_unary_op(t, KILN_UNARY_##NAME, x); }
KILN_UNARY_OPS(KP_TAPE_UNARY)

static PyObject *kp_tape_binary_op(kp_tape_t *t, kiln_binary_op_t op, PyObject *a, PyObject *b) {
  kiln_tensor_t *out = NULL;
  double v;
  int r;
  if (KP_IS_TENSOR(a) && KP_IS_TENSOR(b))
    return kp_result(kiln_nn_tape_binary(t->tape, op, KP_TENSOR(a), KP_TENSOR(b), &out), &out);
  if (KP_IS_TENSOR(a)) {
    if ((r = kp_scalar(b, &v)) <= 0) goto bad;
    return kp_result(kiln_nn_tape_binary_scalar(t->tape, op, KP_TENSOR(a), v, &out), &out);
  }
  if (KP_IS_TENSOR(b)) {
    if ((r = kp_scalar(a, &v)) <= 0) goto bad;
    kiln_tensor_t *tb = KP_TENSOR(b), *tmp = NULL;
    kiln_status_t status;
    switch (op) {
    case KILN_BINARY_SUB: /* v - b = -b + v */
      status = kiln_nn_tape_unary(t->tape, KILN_UNARY_NEG, tb, &tmp);
      if (status != KILN_OK) return kp_raise(status);
      status = kiln_nn_tape_binary_scalar(t->tape, KILN_BINARY_ADD, tmp, v, &out);
      kiln_tensor_release(tmp);
      return kp_result(status, &out);
    case KILN_BINARY_DIV: /* a constant tensor of v, over b */
      status = kiln_tensor_full(kiln_tensor_device(tb), kiln_tensor_dtype(tb), kiln_tensor_ndim(tb),
                                kiln_tensor_shape(tb), v, &tmp);
      if (status != KILN_OK) return kp_raise(status);
      status = kiln_nn_tape_binary(t->tape, op, tmp, tb, &out);
      kiln_tensor_release(tmp);
      return kp_result(status, &out);
    default:
      return kp_result(kiln_nn_tape_binary_scalar(t->tape, op, tb, v, &out), &out);
    }
  }
  r = 0;
bad:
  if (r < 0) return NULL;
  return PyErr_Format(PyExc_TypeError, "tape operands must be kiln tensors (or one number), not %.100s and %.100s",
                      Py_TYPE(a)->tp_name, Py_TYPE(b)->tp_name);
}

#define KP_TAPE_BINARY(NAME, name)                                                                   \
  static PyObject *kp_tape_##name(kp_tape_t *t, PyObject *const *args, Py_ssize_t nargs) {            \
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, #name "() takes two operands");             \
    return kp_tape_binary_op(t, KILN_BINARY_##NAME, args[0], args[1]);                               \
  }
KILN_BINARY_OPS(KP_TAPE_BINARY)

static PyObject *kp_tape_matmul(kp_tape_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"a", "b", "transpose_a", "transpose_b", NULL};
  PyObject *a, *b;
  int ta = 0, tb = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|pp:matmul", names, &a, &b, &ta, &tb)) return NULL;
  kiln_tensor_t *x = kp_tensor_arg(a, "a"), *y = x ? kp_tensor_arg(b, "b") : NULL, *out = NULL;
  if (!y) return NULL;
  return kp_result(kiln_nn_tape_matmul(t->tape, x, y, ta != 0, tb != 0, &out), &out);
}

static PyObject *kp_tape_linear(kp_tape_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "weight", "bias", NULL};
  PyObject *x, *w, *b = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:linear", names, &x, &w, &b)) return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *tw = tx ? kp_tensor_arg(w, "weight") : NULL, *tb = NULL, *out = NULL;
  if (!tw) return NULL;
  if (b != Py_None && !(tb = kp_tensor_arg(b, "bias"))) return NULL;
  return kp_result(kiln_nn_tape_linear(t->tape, tx, tw, tb, &out), &out);
}

static PyObject *kp_tape_reduce(kp_tape_t *t, PyObject *args, PyObject *kwargs, bool mean) {
  static char *names[] = {"a", "axis", "keepdims", NULL};
  PyObject *a, *axis_arg = Py_None;
  int keepdims = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, mean ? "O|Op:mean" : "O|Op:sum", names, &a, &axis_arg, &keepdims))
    return NULL;
  kiln_tensor_t *ta = kp_tensor_arg(a, "a"), *out = NULL;
  int axis;
  if (!ta || kp_axis_arg(axis_arg, &axis) < 0) return NULL;
  return kp_result(mean ? kiln_nn_tape_mean(t->tape, ta, axis, keepdims != 0, &out)
                        : kiln_nn_tape_sum(t->tape, ta, axis, keepdims != 0, &out),
                   &out);
}
static PyObject *kp_tape_sum(kp_tape_t *t, PyObject *a, PyObject *k) { return kp_tape_reduce(t, a, k, false); }
static PyObject *kp_tape_mean(kp_tape_t *t, PyObject *a, PyObject *k) { return kp_tape_reduce(t, a, k, true); }

static PyObject *kp_tape_softmax(kp_tape_t *t, PyObject *a) {
  kiln_tensor_t *ta = kp_tensor_arg(a, "a"), *out = NULL;
  if (!ta) return NULL;
  return kp_result(kiln_nn_tape_softmax(t->tape, ta, &out), &out);
}

static PyObject *kp_tape_log_softmax(kp_tape_t *t, PyObject *a) {
  kiln_tensor_t *ta = kp_tensor_arg(a, "a"), *out = NULL;
  if (!ta) return NULL;
  return kp_result(kiln_nn_tape_log_softmax(t->tape, ta, &out), &out);
}

static PyObject *kp_tape_cross_entropy(kp_tape_t *t, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "cross_entropy(logits, labels) takes two tensors");
  kiln_tensor_t *l = kp_tensor_arg(args[0], "logits"), *y = l ? kp_tensor_arg(args[1], "labels") : NULL, *out = NULL;
  if (!y) return NULL;
  return kp_result(kiln_nn_tape_cross_entropy(t->tape, l, y, &out), &out);
}

static PyObject *kp_tape_conv2d(kp_tape_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "weight", "bias", "stride", "padding", "dilation", NULL};
  PyObject *x, *w, *b = Py_None, *stride = NULL, *padding = NULL, *dilation = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OOOO:conv2d", names, &x, &w, &b, &stride, &padding, &dilation))
    return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *tw = tx ? kp_tensor_arg(w, "weight") : NULL, *tb = NULL, *out = NULL;
  if (!tw) return NULL;
  if (b != Py_None && !(tb = kp_tensor_arg(b, "bias"))) return NULL;
  kiln_conv2d_params_t p = kiln_conv2d_params_default();
  if (kp_pair_arg(stride, 1, p.stride, "stride") < 0 || kp_pair_arg(padding, 0, p.padding, "padding") < 0 ||
      kp_pair_arg(dilation, 1, p.dilation, "dilation") < 0)
    return NULL;
  return kp_result(kiln_nn_tape_conv2d(t->tape, tx, tw, tb, &p, &out), &out);
}

static PyObject *kp_tape_max_pool2d(kp_tape_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "kernel_size", "stride", "padding", NULL};
  PyObject *x, *kernel, *stride = NULL, *padding = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:max_pool2d", names, &x, &kernel, &stride, &padding)) return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *out = NULL;
  if (!tx) return NULL;
  kiln_pool2d_params_t p;
  if (kp_pair_arg(kernel, 1, p.kernel, "kernel_size") < 0 || kp_pair_arg(stride, 0, p.stride, "stride") < 0 ||
      kp_pair_arg(padding, 0, p.padding, "padding") < 0)
    return NULL;
  return kp_result(kiln_nn_tape_max_pool2d(t->tape, tx, &p, &out), &out);
}

static PyObject *kp_tape_reshape(kp_tape_t *t, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "reshape(x, shape) takes two arguments");
  kiln_tensor_t *tx = kp_tensor_arg(args[0], "x"), *out = NULL;
  int64_t shape[KILN_MAX_DIMS];
  int ndim = tx ? kp_shape_arg(args[1], shape, "shape") : -1;
  if (ndim < 0) return NULL;
  return kp_result(kiln_nn_tape_reshape(t->tape, tx, ndim, shape, &out), &out);
}

static PyObject *kp_tape_index_select(kp_tape_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "dim", "index", NULL};
  PyObject *x, *index;
  int dim;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiO:index_select", names, &x, &dim, &index)) return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *ti = tx ? kp_tensor_arg(index, "index") : NULL, *out = NULL;
  if (!ti) return NULL;
  return kp_result(kiln_nn_tape_index_select(t->tape, tx, dim, ti, &out), &out);
}

#define KP_TAPE_KW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS
#define KP_TAPE_FAST(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL

static PyMethodDef kp_tape_methods[] = {
    {"watch", (PyCFunction)kp_tape_watch, METH_O,
     "watch(param)\n--\n\nMake a Parameter carry a gradient in this recording; returns its value to compute with."},
    {"backward", KP_TAPE_KW(kp_tape_backward),
     "backward(y, dy=None)\n--\n\nThe backward pass from y (dy None means 1, for a one-element y such as a loss): "
     "adds each watched parameter's gradient to .grad, then clears the record. Enqueues; does not block."},
    {"clear", (PyCFunction)kp_tape_clear, METH_NOARGS, "clear()\n--\n\nForget the record without a backward pass."},
#define KP_TAPE_UNARY_ENTRY(NAME, name) {#name, (PyCFunction)kp_tape_##name, METH_O, #name "(x)\n--\n\nkiln." #name ", recorded."},
    KILN_UNARY_OPS(KP_TAPE_UNARY_ENTRY)
#undef KP_TAPE_UNARY_ENTRY
#define KP_TAPE_BINARY_ENTRY(NAME, name) {#name, KP_TAPE_FAST(kp_tape_##name), #name "(a, b)\n--\n\nkiln." #name " with broadcasting (either side may be a number), recorded."},
    KILN_BINARY_OPS(KP_TAPE_BINARY_ENTRY)
#undef KP_TAPE_BINARY_ENTRY
    {"matmul", KP_TAPE_KW(kp_tape_matmul), "matmul(a, b, transpose_a=False, transpose_b=False)\n--\n\nRecorded matmul."},
    {"linear", KP_TAPE_KW(kp_tape_linear),
     "linear(x, weight, bias=None)\n--\n\nx @ weight.T + bias, as torch.nn.functional.linear, recorded."},
    {"sum", KP_TAPE_KW(kp_tape_sum), "sum(a, axis=None, keepdims=False)\n--\n\nRecorded sum."},
    {"mean", KP_TAPE_KW(kp_tape_mean), "mean(a, axis=None, keepdims=False)\n--\n\nRecorded mean."},
    {"softmax", (PyCFunction)kp_tape_softmax, METH_O, "softmax(a)\n--\n\nRecorded softmax along the last axis."},
    {"log_softmax", (PyCFunction)kp_tape_log_softmax, METH_O, "log_softmax(a)\n--\n\nRecorded log-softmax."},
    {"cross_entropy", KP_TAPE_FAST(kp_tape_cross_entropy),
     "cross_entropy(logits, labels)\n--\n\nThe recorded mean cross-entropy loss (labels int32, a constant)."},
    {"conv2d", KP_TAPE_KW(kp_tape_conv2d),
     "conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1)\n--\n\nRecorded convolution."},
    {"max_pool2d", KP_TAPE_KW(kp_tape_max_pool2d),
     "max_pool2d(x, kernel_size, stride=None, padding=0)\n--\n\nRecorded max pooling."},
    {"reshape", KP_TAPE_FAST(kp_tape_reshape), "reshape(x, shape)\n--\n\nRecorded reshape (a view)."},
    {"index_select", KP_TAPE_KW(kp_tape_index_select),
     "index_select(x, dim, index)\n--\n\nRecorded x.index_select(dim, index) (index an int32/int64 tensor, a "
     "constant): the gradient adds dy's slices at the indices, repeated ones adding up (an embedding's)."},
    {"__enter__", (PyCFunction)kp_tape_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)kp_tape_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods kp_tape_sequence = {.sq_length = kp_tape_len};

PyTypeObject kp_tape_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn.Tape",
    .tp_basicsize = sizeof(kp_tape_t),
    .tp_dealloc = (destructor)kp_tape_dealloc,
    .tp_as_sequence = &kp_tape_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Tape()\n--\n\nA reverse-mode tape: its operations compute as kiln's do and record what the backward "
              "pass needs when an input carries a gradient (a watched parameter, or a result of a recorded op). "
              "len(tape) is the number of operations recorded. As a context manager it clears what a backward pass "
              "did not consume.",
    .tp_methods = kp_tape_methods,
    .tp_new = kp_tape_new,
};

/* ---- functions ------------------------------------------------------------------------------------ */

static PyObject *kp_seed_derive(PyObject *self, PyObject *args) {
  unsigned long long seed, index;
  if (!PyArg_ParseTuple(args, "KK:seed_derive", &seed, &index)) return NULL;
  return PyLong_FromUnsignedLongLong(kiln_nn_seed_derive(seed, index));
}

static PyObject *kp_providers_used(PyObject *self, PyObject *unused) {
  size_t n = kiln_provider_uses(NULL, 0);
  kiln_provider_use_t *uses = PyMem_Calloc(n + 1, sizeof *uses);
  if (!uses) return PyErr_NoMemory();
  n = kiln_provider_uses(uses, n);
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    PyObject *item = Py_BuildValue("(ssK)", uses[i].op, uses[i].provider, (unsigned long long)uses[i].calls);
    if (!item) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
  }
  PyMem_Free(uses);
  return list;
}

static PyObject *kp_providers_reset(PyObject *self, PyObject *unused) {
  kiln_provider_uses_reset();
  Py_RETURN_NONE;
}

static PyObject *kp_lr_cosine(PyObject *self, PyObject *args) {
  double base;
  unsigned long long epoch, epochs;
  if (!PyArg_ParseTuple(args, "dKK:lr_cosine", &base, &epoch, &epochs)) return NULL;
  return PyFloat_FromDouble(kiln_nn_lr_cosine(base, epoch, epochs));
}

PyMethodDef kp_nn_train_functions[] = {
    {"seed_derive", kp_seed_derive, METH_VARARGS,
     "seed_derive(seed, index)\n--\n\nThe seed of item `index` of a family drawn from `seed` (SplitMix64)."},
    {"providers_used", kp_providers_used, METH_NOARGS,
     "providers_used()\n--\n\n[(op, provider, calls)] of the kiln operations libkiln-nn enqueued from this thread."},
    {"providers_reset", kp_providers_reset, METH_NOARGS, "providers_reset()\n--\n\nCount providers afresh."},
    {"lr_cosine", kp_lr_cosine, METH_VARARGS,
     "lr_cosine(base_lr, epoch, epochs)\n--\n\nCosine annealing (CosineAnnealingLR, eta_min 0) per epoch."},
    {NULL, NULL, 0, NULL},
};
