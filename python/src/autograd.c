/* python/src/autograd.c: autograd on tensors (requires_grad, loss.backward(), .grad, no_grad) over libkiln-nn's tape: one implicit tape records the ops on tensors that require grad. */
#include "kilnpy.h"

#ifndef KILNPY_NO_NN
#include "kilnnn.h"

/* ---- the implicit tape -----------------------------------------------------------------------
 * PyTorch records a graph as ops run; kiln records them on libkiln-nn's tape
 * (the one tape mechanism; nothing is differentiated in Python). One tape
 * serves the process, used under the GIL:
 * - a leaf that requires grad (x.requires_grad_()) holds a kiln.nn.Parameter
 *   over its own kiln tensor: the tape watches it at its first use in a
 *   recording, and backward() adds its gradient there (x.grad);
 * - an op with such an operand, while grad mode is on, runs as the tape op
 *   (kiln_nn_tape_<op>); its result carries a gradient when the tape says so
 *   (kiln_nn_tape_carries) and remembers the recording it belongs to;
 * - backward() runs the tape's backward pass and ends the recording; so does
 *   the death of the last Python tensor of a recording that was never
 *   differentiated (an evaluation without no_grad), so the record never
 *   outgrows what Python still holds. Results of an ended recording are
 *   refused as operands in grad mode (PyTorch's "backward through the graph
 *   a second time"): detach() them.
 * Costs nothing when no tensor requires grad: kp_ag_wanted reads two fields. */

static PyObject *kp_ag_tape_obj; /* a kiln.nn.Tape, made at the first recording */
static bool kp_ag_enabled = true;
static uint64_t kp_ag_recording = 1; /* the current recording; tensors of older ones are stale */
static Py_ssize_t kp_ag_live;        /* Python tensors of the current recording */

static const char kp_ag_ops[] =
    "+, -, *, / (tensors and numbers), x ** 2, @, matmul, exp, log, sqrt, abs, neg, relu, sigmoid, tanh, "
    "sum and mean (dim=, keepdim=), softmax, log_softmax, cross_entropy, linear, conv2d, max_pool2d, "
    "reshape/view/flatten/squeeze/unsqueeze, clone, float/half/bfloat16/astype, index_select and x[index_tensor], "
    "and kiln.nn's layers";

static void kp_ag_end_recording(void) {
  if (kp_ag_tape_obj) kp_tape_end((kp_tape_t *)kp_ag_tape_obj);
  kp_ag_recording++;
  kp_ag_live = 0;
}

/* The implicit tape, made at the first recording; 0 or -1. */
static int kp_ag_tape_ready(void) {
  if (!kp_ag_tape_obj) kp_ag_tape_obj = PyObject_CallNoArgs((PyObject *)&kp_tape_type);
  return kp_ag_tape_obj ? 0 : -1;
}

bool kp_ag_requires_grad(PyObject *obj) {
  if (!KP_IS_TENSOR(obj)) return false;
  kp_tensor_t *t = (kp_tensor_t *)obj;
  return t->ag_param || t->ag_recording == kp_ag_recording;
}

static int kp_ag_stale(kp_tensor_t *t) {
  if (!t->ag_recording || t->ag_recording == kp_ag_recording) return 0;
  PyErr_SetString(PyExc_RuntimeError,
                  "this tensor was computed in a recording that backward() has ended (kiln frees the record at "
                  "backward, as PyTorch does without retain_graph): use x.detach() to take it as a constant, or "
                  "compute it again");
  return -1;
}

int kp_ag_wanted(PyObject *a, PyObject *b) {
  if (!kp_ag_enabled) return 0;
  int want = 0;
  PyObject *ops[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    if (!ops[i] || !KP_IS_TENSOR(ops[i])) continue;
    kp_tensor_t *t = (kp_tensor_t *)ops[i];
    if (!t->ag_param && !t->ag_recording) continue;
    if (kp_ag_stale(t) < 0) return -1;
    want = 1;
  }
  return want && kp_ag_tape_ready() < 0 ? -1 : want;
}

int kp_ag_refuse(PyObject *obj, const char *op) {
  if (!kp_ag_enabled || !kp_ag_requires_grad(obj)) return 0;
  PyErr_Format(PyExc_RuntimeError,
               "%s of a tensor that requires grad: kiln has no gradient for it, so it would silently cut the "
               "gradient's path. Use x.detach() (or kiln.no_grad()) to mean a constant. kiln records: %s",
               op, kp_ag_ops);
  return -1;
}

kiln_nn_tape_t *kp_ag_tape(void) { return ((kp_tape_t *)kp_ag_tape_obj)->tape; }

kiln_tensor_t *kp_ag_in(PyObject *obj) {
  if (!obj || !KP_IS_TENSOR(obj)) return NULL;
  kp_tensor_t *t = (kp_tensor_t *)obj;
  kiln_tensor_t *value = NULL;
  /* Watching fails only without memory: the leaf then counts as a constant,
   * and the op's result says so (requires_grad False). */
  if (t->ag_param && kp_ag_tape_obj && kp_tape_watch_param((kp_tape_t *)kp_ag_tape_obj, t->ag_param, &value) < 0)
    PyErr_Clear();
  return t->tensor;
}

PyObject *kp_ag_result(int rec, kiln_status_t status, kiln_tensor_t **out) {
  if (status != KILN_OK) return kp_raise(status);
  /* Only a recorded op's result is looked up (the newest entry: found first). */
  bool carries = rec && kp_ag_tape_obj && kiln_nn_tape_carries(kp_ag_tape(), *out);
  PyObject *r = kp_tensor_wrap(*out);
  if (r && carries) {
    ((kp_tensor_t *)r)->ag_recording = kp_ag_recording;
    kp_ag_live++;
  }
  return r;
}

void kp_ag_forget(kp_tensor_t *t) {
  Py_CLEAR(t->ag_param);
  if (t->ag_recording == kp_ag_recording && --kp_ag_live == 0) kp_ag_end_recording();
  t->ag_recording = 0;
}

PyObject *kp_ag_layer_tape(PyObject *x) {
  int want = kp_ag_wanted(x, NULL);
  if (want < 0) return NULL;
  if (!kp_ag_enabled) return Py_None;
  if (kp_ag_tape_ready() < 0) return NULL;
  if (want) kp_ag_in(x);
  return kp_ag_tape_obj;
}

/* ---- tensor attributes and methods ------------------------------------------------------------ */

static int kp_ag_set_requires_grad(kp_tensor_t *t, PyObject *value, void *c) {
  if (!value) {
    PyErr_SetString(PyExc_AttributeError, "requires_grad cannot be deleted");
    return -1;
  }
  int want = PyObject_IsTrue(value);
  if (want < 0) return -1;
  if (t->ag_recording) {
    if (want && t->ag_recording == kp_ag_recording) return 0;
    PyErr_SetString(PyExc_RuntimeError, "you can only change requires_grad of leaf tensors: this one is the result "
                    "of a recorded op; use y = x.detach() and then y.requires_grad_()");
    return -1;
  }
  if (!want) {
    Py_CLEAR(t->ag_param);
    return 0;
  }
  if (t->ag_param) return 0;
  kiln_dtype_t dtype = kiln_tensor_dtype(t->tensor);
  if (dtype != KILN_F32) {
    kp_raise_msg(KILN_DTYPE_MISMATCH, "only float32 tensors can require grad in kiln (kiln.nn keeps f32 master "
                 "weights and trains bf16/f16 through a model's precision): this one is %s; use "
                 "x.float().requires_grad_()", kiln_dtype_long_name(dtype));
    return -1;
  }
  if (!kiln_tensor_is_contiguous(t->tensor)) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "a tensor that requires grad must be contiguous (it becomes a kiln.nn "
                 "Parameter): use x.contiguous().requires_grad_()");
    return -1;
  }
  kiln_nn_param_t *param = NULL;
  kiln_status_t status = kiln_nn_param_create(NULL, t->tensor, &param);
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  t->ag_param = kp_param_wrap(param, NULL);
  return t->ag_param ? 0 : -1;
}

static PyObject *kp_ag_get_requires_grad(kp_tensor_t *t, void *c) { return PyBool_FromLong(kp_ag_requires_grad((PyObject *)t)); }

static PyObject *kp_ag_get_is_leaf(kp_tensor_t *t, void *c) { return PyBool_FromLong(!t->ag_recording); }

/* torch's x.data: the same memory as a tensor that requires no grad (x.detach()). */
static PyObject *kp_ag_get_data(kp_tensor_t *t, void *c) { return kp_tensor_wrap(kiln_tensor_retain(t->tensor)); }

static PyObject *kp_ag_get_grad(kp_tensor_t *t, void *c) {
  if (!t->ag_param) Py_RETURN_NONE;
  kiln_tensor_t *g = kiln_nn_param_grad(((kp_param_t *)t->ag_param)->param);
  if (!g) Py_RETURN_NONE;
  return kp_tensor_wrap(kiln_tensor_retain(g));
}

static int kp_ag_set_grad(kp_tensor_t *t, PyObject *value, void *c) {
  if (value && value != Py_None) {
    PyErr_SetString(PyExc_TypeError, "kiln keeps a gradient where backward() adds it: x.grad can only be set to None "
                    "(as optimizer.zero_grad() does)");
    return -1;
  }
  if (t->ag_param) kiln_nn_param_zero_grad(((kp_param_t *)t->ag_param)->param);
  return 0;
}

static PyObject *kp_ag_requires_grad_(kp_tensor_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"requires_grad", NULL};
  PyObject *flag = Py_True;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:requires_grad_", names, &flag) ||
      kp_ag_set_requires_grad(t, flag, NULL) < 0)
    return NULL;
  return Py_NewRef((PyObject *)t);
}

static PyObject *kp_ag_backward(kp_tensor_t *t, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"gradient", "retain_graph", "create_graph", NULL};
  PyObject *gradient = Py_None, *retain = Py_None;
  int create = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOp:backward", names, &gradient, &retain, &create)) return NULL;
  if ((retain != Py_None && PyObject_IsTrue(retain)) || create)
    return PyErr_Format(PyExc_NotImplementedError, "backward(%s=True): kiln's tape frees the record at backward and "
                        "records no gradient of a gradient; compute the forward again for a second backward",
                        create ? "create_graph" : "retain_graph");
  if (kp_ag_stale(t) < 0) return NULL;
  if (t->ag_param)
    return PyErr_Format(PyExc_RuntimeError,
                        "backward() of a leaf: its gradient with respect to itself is `gradient` (or 1); kiln "
                        "differentiates results of recorded ops (compute the loss from this tensor first)");
  if (t->ag_recording != kp_ag_recording || !kp_ag_tape_obj)
    return PyErr_Format(PyExc_RuntimeError,
                        "this tensor does not require grad, so backward() has nothing to differentiate: none of the "
                        "ops that made it had an operand that requires grad (set requires_grad=True on the leaves, "
                        "e.g. the parameters), or it was computed under kiln.no_grad()");
  kiln_tensor_t *dy = NULL;
  if (gradient != Py_None && !(dy = kp_tensor_arg(gradient, "gradient"))) return NULL;
  kiln_status_t status = kiln_nn_tape_backward(kp_ag_tape(), t->tensor, dy);
  kp_ag_end_recording();
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

PyMethodDef kp_autograd_methods[] = {
    {"backward", (PyCFunction)(void (*)(void))kp_ag_backward, METH_VARARGS | METH_KEYWORDS,
     "backward(gradient=None)\n--\n\nAdd d(self)/d(leaf) to the .grad of every leaf that requires grad and that self "
     "depends on (gradient: d(loss)/d(self), needed unless self has one element), and end the recording. Enqueued; "
     "does not block."},
    {"requires_grad_", (PyCFunction)(void (*)(void))kp_ag_requires_grad_, METH_VARARGS | METH_KEYWORDS,
     "requires_grad_(requires_grad=True)\n--\n\nMake this float32 leaf record the ops that use it, for backward(); "
     "returns self."},
    {NULL, NULL, 0, NULL},
};

PyGetSetDef kp_autograd_getset[] = {
    {"requires_grad", (getter)kp_ag_get_requires_grad, (setter)kp_ag_set_requires_grad,
     "whether ops on this tensor are recorded for backward()", NULL},
    {"grad", (getter)kp_ag_get_grad, (setter)kp_ag_set_grad,
     "the gradient backward() added to this leaf (None before, and after x.grad = None)", NULL},
    {"is_leaf", (getter)kp_ag_get_is_leaf, NULL, "False for the result of a recorded op", NULL},
    {"data", (getter)kp_ag_get_data, NULL, "the same memory as a tensor that requires no grad (x.detach())", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* The kiln.nn.Parameter behind a leaf that requires grad (borrowed), for optimizers; NULL otherwise. */
PyObject *kp_ag_param_of(PyObject *obj) { return KP_IS_TENSOR(obj) ? ((kp_tensor_t *)obj)->ag_param : NULL; }

/* A tensor over a kiln.nn.Parameter's value that requires grad: backward()
 * adds to that parameter's gradient (kiln.nn.Module reads its Parameters so). */
static PyObject *kp_ag_fn_param_tensor(PyObject *self, PyObject *arg) {
  if (!Py_IS_TYPE(arg, &kp_param_type))
    return PyErr_Format(PyExc_TypeError, "_param_tensor() takes a kiln.nn.Parameter, not %.100s", Py_TYPE(arg)->tp_name);
  PyObject *t = kp_tensor_wrap(kiln_tensor_retain(kiln_nn_param_value(((kp_param_t *)arg)->param)));
  if (t) ((kp_tensor_t *)t)->ag_param = Py_NewRef(arg);
  return t;
}

static PyObject *kp_ag_fn_set_enabled(PyObject *self, PyObject *arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0) return NULL;
  PyObject *previous = PyBool_FromLong(kp_ag_enabled);
  kp_ag_enabled = on;
  return previous;
}

static PyObject *kp_ag_fn_is_enabled(PyObject *self, PyObject *unused) { return PyBool_FromLong(kp_ag_enabled); }

static PyObject *kp_ag_fn_record_size(PyObject *self, PyObject *unused) {
  return PyLong_FromSize_t(kp_ag_tape_obj ? kiln_nn_tape_size(kp_ag_tape()) : 0);
}

#else /* KILNPY_NO_NN: no tape, so nothing requires grad */

bool kp_ag_requires_grad(PyObject *obj) { return false; }
int kp_ag_refuse(PyObject *obj, const char *op) { return 0; }
void kp_ag_forget(kp_tensor_t *t) { t->ag_param = NULL; t->ag_recording = 0; }
PyObject *kp_ag_param_of(PyObject *obj) { return NULL; }

static PyObject *kp_ag_unavailable(void) {
  return PyErr_Format(PyExc_RuntimeError, "kiln was built without libkiln-nn, which records gradients: build kiln with "
                      "zlib and json-c (meson setup -Dnn=enabled) and reinstall the package");
}

static PyObject *kp_ag_get_false(PyObject *t, void *c) { Py_RETURN_FALSE; }
static PyObject *kp_ag_get_true(PyObject *t, void *c) { Py_RETURN_TRUE; }
static PyObject *kp_ag_get_none(PyObject *t, void *c) { Py_RETURN_NONE; }
static PyObject *kp_ag_get_data(PyObject *t, void *c) { return kp_tensor_wrap(kiln_tensor_retain(KP_TENSOR(t))); }
static int kp_ag_set_unavailable(PyObject *t, PyObject *v, void *c) {
  kp_ag_unavailable();
  return -1;
}
static PyObject *kp_ag_method_unavailable(PyObject *t, PyObject *a, PyObject *k) { return kp_ag_unavailable(); }

PyMethodDef kp_autograd_methods[] = {
    {"backward", (PyCFunction)(void (*)(void))kp_ag_method_unavailable, METH_VARARGS | METH_KEYWORDS, NULL},
    {"requires_grad_", (PyCFunction)(void (*)(void))kp_ag_method_unavailable, METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL, NULL, 0, NULL},
};

PyGetSetDef kp_autograd_getset[] = {
    {"requires_grad", kp_ag_get_false, kp_ag_set_unavailable, NULL, NULL},
    {"grad", kp_ag_get_none, kp_ag_set_unavailable, NULL, NULL},
    {"is_leaf", kp_ag_get_true, NULL, NULL, NULL},
    {"data", kp_ag_get_data, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *kp_ag_fn_set_enabled(PyObject *self, PyObject *arg) { Py_RETURN_FALSE; }
static PyObject *kp_ag_fn_param_tensor(PyObject *self, PyObject *arg) { return kp_ag_unavailable(); }
static PyObject *kp_ag_fn_is_enabled(PyObject *self, PyObject *unused) { Py_RETURN_FALSE; }
static PyObject *kp_ag_fn_record_size(PyObject *self, PyObject *unused) { return PyLong_FromLong(0); }

#endif

PyMethodDef kp_autograd_functions[] = {
    {"_set_grad_enabled", kp_ag_fn_set_enabled, METH_O,
     "_set_grad_enabled(on)\n--\n\nTurn recording on or off; returns the previous state (kiln.no_grad uses it)."},
    {"is_grad_enabled", kp_ag_fn_is_enabled, METH_NOARGS,
     "is_grad_enabled()\n--\n\nWhether ops on tensors that require grad are recorded (False inside kiln.no_grad())."},
    {"_param_tensor", kp_ag_fn_param_tensor, METH_O,
     "_param_tensor(parameter)\n--\n\nA tensor over the Parameter's value that requires grad (kiln.nn.Module uses it)."},
    {"_autograd_record_size", kp_ag_fn_record_size, METH_NOARGS,
     "_autograd_record_size()\n--\n\nOps the implicit tape holds now (tests use it)."},
    {NULL, NULL, 0, NULL},
};

int kp_module_init_autograd(PyObject *module) {
  PyObject *dict = kp_tensor_type.tp_dict;
  for (PyMethodDef *def = kp_autograd_methods; def->ml_name; def++) {
    PyObject *descr = PyDescr_NewMethod(&kp_tensor_type, def);
    int rc = descr ? PyDict_SetItemString(dict, def->ml_name, descr) : -1;
    Py_XDECREF(descr);
    if (rc < 0) return -1;
  }
  for (PyGetSetDef *def = kp_autograd_getset; def->name; def++) {
    PyObject *descr = PyDescr_NewGetSet(&kp_tensor_type, def);
    int rc = descr ? PyDict_SetItemString(dict, def->name, descr) : -1;
    Py_XDECREF(descr);
    if (rc < 0) return -1;
  }
  PyType_Modified(&kp_tensor_type);
  return PyModule_AddFunctions(module, kp_autograd_functions);
}
