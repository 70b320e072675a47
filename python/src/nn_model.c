/* python/src/nn_model.c: kiln.nn's layers, Sequential models, optimizers and the training loop over libkiln-nn, and the kiln.nn module's assembly. */
#include "kilnnn.h"

#include <math.h>

/* ---- Layer -------------------------------------------------------------------------------- */

static void kp_free_layer(void *p) { kiln_nn_layer_free(p); }
static void kp_free_model(void *p) { kiln_nn_model_free(p); }

PyObject *kp_layer_wrap(kiln_nn_layer_t *layer, kp_owner_t *owner, bool in_model) {
  kp_layer_t *l = PyObject_New(kp_layer_t, &kp_layer_type);
  if (!l) return NULL;
  l->layer = layer;
  l->owner = (kp_owner_t *)Py_NewRef((PyObject *)owner);
  l->in_model = in_model;
  return (PyObject *)l;
}

/* A new layer object owning `layer`. */
static PyObject *kp_layer_own(kiln_status_t status, kiln_nn_layer_t *layer) {
  if (status != KILN_OK) return kp_raise(status);
  kp_owner_t *owner = kp_owner_new(layer, kp_free_layer);
  if (!owner) return NULL;
  PyObject *l = kp_layer_wrap(layer, owner, false);
  Py_DECREF(owner);
  return l;
}

/* A layer whose add to a model failed was freed by libkiln-nn. */
static int kp_layer_alive(kp_layer_t *l) {
  if (l->layer) return 0;
  kp_raise_msg(KILN_INVALID_ARGUMENT, "this layer was freed when adding it to a model failed; make a new one");
  return -1;
}

static void kp_layer_dealloc(kp_layer_t *l) {
  Py_XDECREF(l->owner);
  PyObject_Free(l);
}

static PyObject *kp_layer_forward(kp_layer_t *l, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "tape", NULL};
  PyObject *x, *tape_arg = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:forward", names, &x, &tape_arg)) return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *out = NULL;
  kiln_nn_tape_t *tape;
  const bool implicit = !tape_arg;
  /* No tape given: autograd's (kiln.no_grad() turns it off), as a torch module records. */
  if (!tx || (!tape_arg && !(tape_arg = kp_ag_layer_tape(x))) || kp_tape_arg(tape_arg, &tape) < 0 ||
      kp_layer_alive(l) < 0 || kp_guard_check((PyObject *)l) < 0 || kp_tape_keep(tape_arg, l->owner) < 0)
    return NULL;
  return kp_ag_result(implicit && tape, kiln_nn_layer_forward(l->layer, tape, tx, &out), &out);
}

static PyObject *kp_layer_parameters(kp_layer_t *l, PyObject *unused) {
  if (kp_layer_alive(l) < 0) return NULL;
  size_t n = kiln_nn_layer_param_count(l->layer);
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    PyObject *p = kp_param_wrap(kiln_nn_layer_param(l->layer, i), l->owner);
    if (!p) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, p);
  }
  return list;
}

static PyObject *kp_layer_repr(kp_layer_t *l) {
  if (!l->layer) return PyUnicode_FromString("kiln.nn.Layer(<freed>)");
  return PyUnicode_FromFormat("kiln.nn.Layer(%s)", kiln_nn_layer_describe(l->layer));
}

/* layer.to(device): the parameters move, the object stays (torch's module.to). */
static PyObject *kp_layer_to(kp_layer_t *l, PyObject *arg) {
  kiln_device_t *device;
  if (kp_layer_alive(l) < 0 || kp_guard_check((PyObject *)l) < 0 || kp_device_arg(arg, &device) < 0) return NULL;
  if (l->in_model)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "this layer belongs to a Sequential, whose parameters live on one "
                        "device: move the model (model.to(device))");
  kiln_status_t status = kiln_nn_layer_to(l->layer, device);
  if (status != KILN_OK) return kp_raise(status);
  return Py_NewRef((PyObject *)l);
}

static PyMethodDef kp_layer_methods[] = {
    {"to", (PyCFunction)kp_layer_to, METH_O,
     "to(device)\n--\n\nMove the parameters to `device` (copies; gradients dropped) and return the layer. Make the "
     "optimizer after, as in PyTorch."},
    {"forward", (PyCFunction)(void (*)(void))kp_layer_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(x, tape=None)\n--\n\nlayer(x): recorded on `tape` when given (the layer watches its own parameters)."},
    {"parameters", (PyCFunction)kp_layer_parameters, METH_NOARGS, "parameters()\n--\n\n[weight, bias] (or [])."},
    {NULL, NULL, 0, NULL},
};

static PyObject *kp_layer_describe(kp_layer_t *l, void *c) {
  if (kp_layer_alive(l) < 0) return NULL;
  return PyUnicode_FromString(kiln_nn_layer_describe(l->layer)); }

/* layer.weight / layer.bias: the parameter, or None when the layer has none. */
static PyObject *kp_layer_get_param(kp_layer_t *l, void *which) {
  if (kp_layer_alive(l) < 0) return NULL;
  size_t n = kiln_nn_layer_param_count(l->layer), want = (size_t)(intptr_t)which;
  if (want >= n) Py_RETURN_NONE;
  return kp_param_wrap(kiln_nn_layer_param(l->layer, want), l->owner);
}

static PyGetSetDef kp_layer_getset[] = {
    {"weight", (getter)kp_layer_get_param, NULL, "the weight Parameter, or None", (void *)0},
    {"bias", (getter)kp_layer_get_param, NULL, "the bias Parameter, or None", (void *)1},
    {"description", (getter)kp_layer_describe, NULL, "'linear(784, 1000)', 'relu' ...", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kp_layer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn.Layer",
    .tp_basicsize = sizeof(kp_layer_t),
    .tp_dealloc = (destructor)kp_layer_dealloc,
    .tp_repr = (reprfunc)kp_layer_repr,
    .tp_call = (ternaryfunc)kp_layer_forward,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A layer: kiln.nn.Linear, Conv2d, MaxPool2d, ReLU, Flatten. layer(x, tape=None) runs it.",
    .tp_methods = kp_layer_methods,
    .tp_getset = kp_layer_getset,
};

static PyObject *kp_linear(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"in_features", "out_features", "bias", "device", "seed", NULL};
  long long in, out;
  int bias = 1;
  PyObject *device_arg = Py_None;
  unsigned long long seed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LL|p$OK:Linear", names, &in, &out, &bias, &device_arg, &seed))
    return NULL;
  kiln_device_t *device;
  if (kp_device_arg(device_arg, &device) < 0) return NULL;
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = kiln_nn_linear_create(device, in, out, bias != 0, seed, &layer);
  return kp_layer_own(status, layer);
}

static PyObject *kp_conv2d(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "bias",
                          "device", "seed", NULL};
  long long in, out;
  PyObject *kernel, *stride = NULL, *padding = NULL, *dilation = NULL, *device_arg = Py_None;
  int bias = 1;
  unsigned long long seed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLO|OOOp$OK:Conv2d", names, &in, &out, &kernel, &stride, &padding,
                                   &dilation, &bias, &device_arg, &seed))
    return NULL;
  int32_t k[2];
  kiln_conv2d_params_t p = kiln_conv2d_params_default();
  kiln_device_t *device;
  if (kp_pair_arg(kernel, 1, k, "kernel_size") < 0 || kp_pair_arg(stride, 1, p.stride, "stride") < 0 ||
      kp_pair_arg(padding, 0, p.padding, "padding") < 0 || kp_pair_arg(dilation, 1, p.dilation, "dilation") < 0 ||
      kp_device_arg(device_arg, &device) < 0)
    return NULL;
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = kiln_nn_conv2d_create(device, in, out, k[0], k[1], &p, bias != 0, seed, &layer);
  return kp_layer_own(status, layer);
}

static PyObject *kp_max_pool2d_layer(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"kernel_size", "stride", "padding", NULL};
  PyObject *kernel, *stride = NULL, *padding = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:MaxPool2d", names, &kernel, &stride, &padding)) return NULL;
  kiln_pool2d_params_t p;
  if (kp_pair_arg(kernel, 1, p.kernel, "kernel_size") < 0 || kp_pair_arg(stride, 0, p.stride, "stride") < 0 ||
      kp_pair_arg(padding, 0, p.padding, "padding") < 0)
    return NULL;
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = kiln_nn_max_pool2d_create(&p, &layer);
  return kp_layer_own(status, layer);
}

static PyObject *kp_relu_layer(PyObject *self, PyObject *unused) {
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = kiln_nn_relu_create(&layer);
  return kp_layer_own(status, layer);
}

static PyObject *kp_sigmoid_layer(PyObject *self, PyObject *unused) {
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = kiln_nn_activation_create(KILN_UNARY_SIGMOID, &layer);
  return kp_layer_own(status, layer);
}

static PyObject *kp_tanh_layer(PyObject *self, PyObject *unused) {
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = kiln_nn_activation_create(KILN_UNARY_TANH, &layer);
  return kp_layer_own(status, layer);
}

static PyObject *kp_flatten_layer(PyObject *self, PyObject *unused) {
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = kiln_nn_flatten_create(&layer);
  return kp_layer_own(status, layer);
}

/* ---- Sequential ------------------------------------------------------------------------------ */

static kp_model_t *kp_model_alloc(PyTypeObject *type, kiln_nn_model_t *model) {
  kp_owner_t *owner = kp_owner_new(model, kp_free_model);
  if (!owner) return NULL;
  kp_model_t *m = PyObject_New(kp_model_t, type);
  if (!m) {
    Py_DECREF(owner);
    return NULL;
  }
  m->model = model;
  m->owner = owner;
  m->layers = PyList_New(0);
  if (!m->layers) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}

static PyObject *kp_model_add(kp_model_t *m, PyObject *arg) {
  if (!Py_IS_TYPE(arg, &kp_layer_type))
    return PyErr_Format(PyExc_TypeError, "add() takes a kiln.nn layer, not %.100s", Py_TYPE(arg)->tp_name);
  kp_layer_t *l = (kp_layer_t *)arg;
  if (kp_layer_alive(l) < 0 || kp_guard_check((PyObject *)m) < 0) return NULL;
  if (l->in_model)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "the layer %s belongs to a model already; make a new one",
                        kiln_nn_layer_describe(l->layer));
  /* The model takes the layer even when adding fails. */
  kiln_status_t status = kiln_nn_model_add(m->model, l->layer);
  kp_owner_transfer(l->owner, m->owner);
  l->in_model = true;
  if (status != KILN_OK) {
    l->layer = NULL; /* freed by the failed add */
    return kp_raise(status);
  }
  if (PyList_Append(m->layers, arg) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *kp_model_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  if (kwargs && PyDict_GET_SIZE(kwargs)) return PyErr_Format(PyExc_TypeError, "Sequential(*layers) takes no keywords");
  kiln_nn_model_t *model = NULL;
  kiln_status_t status = kiln_nn_model_create(&model);
  if (status != KILN_OK) return kp_raise(status);
  kp_model_t *m = kp_model_alloc(type, model);
  if (!m) return NULL;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) {
    PyObject *r = kp_model_add(m, PyTuple_GET_ITEM(args, i));
    if (!r) {
      Py_DECREF(m);
      return NULL;
    }
    Py_DECREF(r);
  }
  return (PyObject *)m;
}

static void kp_model_dealloc(kp_model_t *m) {
  Py_XDECREF(m->layers);
  Py_XDECREF(m->owner);
  PyObject_Free(m);
}

static PyObject *kp_model_preset(PyObject *cls, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"name", "device", "seed", NULL};
  const char *name;
  PyObject *device_arg = Py_None;
  unsigned long long seed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|O$K:preset", names, &name, &device_arg, &seed)) return NULL;
  kiln_device_t *device;
  if (kp_device_arg(device_arg, &device) < 0) return NULL;
  kiln_nn_model_t *model = NULL;
  kiln_status_t status = kiln_nn_model_create_preset(name, device, seed, &model);
  if (status != KILN_OK) return kp_raise(status);
  kp_model_t *m = kp_model_alloc(&kp_model_type, model);
  if (!m) return NULL;
  for (size_t i = 0; i < kiln_nn_model_layer_count(model); i++) {
    PyObject *l = kp_layer_wrap(kiln_nn_model_layer(model, i), m->owner, true);
    if (!l || PyList_Append(m->layers, l) < 0) {
      Py_XDECREF(l);
      Py_DECREF(m);
      return NULL;
    }
    Py_DECREF(l);
  }
  return (PyObject *)m;
}

static PyObject *kp_model_forward(kp_model_t *m, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"x", "tape", NULL};
  PyObject *x, *tape_arg = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:forward", names, &x, &tape_arg)) return NULL;
  kiln_tensor_t *tx = kp_tensor_arg(x, "x"), *out = NULL;
  kiln_nn_tape_t *tape;
  const bool implicit = !tape_arg;
  if (!tx || (!tape_arg && !(tape_arg = kp_ag_layer_tape(x))) || kp_tape_arg(tape_arg, &tape) < 0 ||
      kp_guard_check((PyObject *)m) < 0 || kp_tape_keep(tape_arg, m->owner) < 0)
    return NULL;
  return kp_ag_result(implicit && tape, kiln_nn_model_forward(m->model, tape, tx, &out), &out);
}

static PyObject *kp_model_parameters(kp_model_t *m, PyObject *unused) {
  size_t n = 0;
  kiln_nn_param_t *const *params = kiln_nn_model_params(m->model, &n);
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    PyObject *p = kp_param_wrap(params[i], m->owner);
    if (!p) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, p);
  }
  return list;
}

static PyObject *kp_model_state_dict(kp_model_t *m, PyObject *unused) {
  size_t n = 0;
  kiln_nn_param_t *const *params = kiln_nn_model_params(m->model, &n);
  PyObject *dict = PyDict_New();
  for (size_t i = 0; dict && i < n; i++) {
    PyObject *t = kp_tensor_wrap(kiln_tensor_retain(kiln_nn_param_value(params[i])));
    if (!t || PyDict_SetItemString(dict, kiln_nn_param_name(params[i]), t) < 0) Py_CLEAR(dict);
    Py_XDECREF(t);
  }
  return dict;
}

static PyObject *kp_model_get_device(kp_model_t *m, void *c) {
  kiln_device_t *d = kiln_nn_model_device(m->model);
  if (!d) Py_RETURN_NONE;
  return kp_device_object(d);
}

static PyObject *kp_model_path_call(kp_model_t *m, PyObject *arg, bool save) {
  PyObject *path = NULL;
  if (!PyUnicode_FSConverter(arg, &path)) return NULL;
  const char *p = PyBytes_AS_STRING(path);
  kp_guard_t *guards[1];
  PyObject *self = (PyObject *)m;
  int held = kp_guard_enter(&self, 1, save ? "Sequential.save" : "Sequential.load", guards);
  if (held < 0) {
    Py_DECREF(path);
    return NULL;
  }
  kiln_status_t status;
  KP_NOGIL(status = save ? kiln_nn_model_save(m->model, p) : kiln_nn_model_load(m->model, p));
  kp_guard_leave(guards, held);
  Py_DECREF(path);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}
static PyObject *kp_model_save(kp_model_t *m, PyObject *arg) { return kp_model_path_call(m, arg, true); }
static PyObject *kp_model_load(kp_model_t *m, PyObject *arg) { return kp_model_path_call(m, arg, false); }

static PyObject *kp_model_reset_parameters(kp_model_t *m, PyObject *arg) {
  unsigned long long seed = PyLong_AsUnsignedLongLongMask(arg);
  if (seed == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (kp_guard_check((PyObject *)m) < 0) return NULL;
  kiln_status_t status = kiln_nn_model_reset_parameters(m->model, seed);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static Py_ssize_t kp_model_len(PyObject *o) { return PyList_GET_SIZE(((kp_model_t *)o)->layers); }

static PyObject *kp_model_item(PyObject *o, Py_ssize_t i) {
  PyObject *layers = ((kp_model_t *)o)->layers;
  if (i < 0 || i >= PyList_GET_SIZE(layers)) {
    PyErr_SetString(PyExc_IndexError, "model index out of range");
    return NULL;
  }
  return Py_NewRef(PyList_GET_ITEM(layers, i));
}

static PyObject *kp_model_repr(kp_model_t *m) {
  PyObject *parts = PyList_New(0);
  for (Py_ssize_t i = 0; parts && i < PyList_GET_SIZE(m->layers); i++) {
    kp_layer_t *l = (kp_layer_t *)PyList_GET_ITEM(m->layers, i);
    PyObject *s = PyUnicode_FromFormat("  (%zd): %s", i, kiln_nn_layer_describe(l->layer));
    if (!s || PyList_Append(parts, s) < 0) Py_CLEAR(parts);
    Py_XDECREF(s);
  }
  if (!parts) return NULL;
  PyObject *sep = PyUnicode_FromString("\n");
  PyObject *body = sep ? PyUnicode_Join(sep, parts) : NULL;
  Py_XDECREF(sep);
  Py_DECREF(parts);
  if (!body) return NULL;
  PyObject *r = PyUnicode_FromFormat("kiln.nn.Sequential(\n%U\n)", body);
  Py_DECREF(body);
  return r;
}

static PyObject *kp_model_to(kp_model_t *m, PyObject *arg) {
  kiln_device_t *device;
  if (kp_guard_check((PyObject *)m) < 0 || kp_device_arg(arg, &device) < 0) return NULL;
  kiln_status_t status = kiln_nn_model_to(m->model, device);
  if (status != KILN_OK) return kp_raise(status);
  return Py_NewRef((PyObject *)m);
}

static PyMethodDef kp_model_methods[] = {
    {"to", (PyCFunction)kp_model_to, METH_O,
     "to(device)\n--\n\nMove every parameter to `device` (copies; gradients dropped) and return the model. Make the "
     "optimizer after, as in PyTorch."},
    {"add", (PyCFunction)kp_model_add, METH_O, "add(layer)\n--\n\nAppend a layer; the model owns it from now on."},
    {"forward", (PyCFunction)(void (*)(void))kp_model_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(x, tape=None)\n--\n\nmodel(x): the layers in order, recorded on `tape` when given."},
    {"parameters", (PyCFunction)kp_model_parameters, METH_NOARGS, "parameters()\n--\n\nEvery parameter, in order."},
    {"state_dict", (PyCFunction)kp_model_state_dict, METH_NOARGS,
     "state_dict()\n--\n\n{'0.weight': tensor, ...} as a torch.nn.Sequential names them (the live values, not copies)."},
    {"save", (PyCFunction)kp_model_save, METH_O,
     "save(path)\n--\n\nThe parameters as safetensors, which torch.nn.Sequential.load_state_dict takes. Blocks."},
    {"load", (PyCFunction)kp_model_load, METH_O,
     "load(path)\n--\n\nRead the parameters from a safetensors file (by name, strict). Blocks."},
    {"reset_parameters", (PyCFunction)kp_model_reset_parameters, METH_O,
     "reset_parameters(seed)\n--\n\nDraw every parameter again from `seed` (the same numbers on every device)."},
    {"preset", (PyCFunction)(void (*)(void))kp_model_preset, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "preset(name, device=None, *, seed=0)\n--\n\nkiln-train's models: 'mlp' (flatten, linear(784, 1000), relu, "
     "linear(1000, 10)) or 'lenet'."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kp_model_getset[] = {
    {"device", (getter)kp_model_get_device, NULL, "the device of the parameters (None without any)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods kp_model_sequence = {.sq_length = kp_model_len, .sq_item = kp_model_item};

PyTypeObject kp_model_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn.Sequential",
    .tp_basicsize = sizeof(kp_model_t),
    .tp_dealloc = (destructor)kp_model_dealloc,
    .tp_repr = (reprfunc)kp_model_repr,
    .tp_as_sequence = &kp_model_sequence,
    .tp_call = (ternaryfunc)kp_model_forward,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sequential(*layers)\n--\n\nLayers run in order, as torch.nn.Sequential; the model owns them, and "
              "names its parameters as that Sequential's state_dict ('0.weight'). model(x, tape=None) runs it.",
    .tp_methods = kp_model_methods,
    .tp_getset = kp_model_getset,
    .tp_new = kp_model_new,
};

/* ---- optimizers -------------------------------------------------------------------------------- */

static void kp_optim_dealloc(kp_optim_t *o) {
  kiln_nn_optimizer_free(o->optimizer);
  Py_XDECREF(o->keep);
  PyObject_Free(o);
}

/* The parameters of a Sequential or of an iterable of Parameters, and what
 * keeps them alive. */
static kiln_nn_param_t **kp_params_arg(PyObject *arg, size_t *out_count, PyObject **out_keep) {
  if (Py_IS_TYPE(arg, &kp_model_type)) {
    size_t n = 0;
    kiln_nn_param_t *const *params = kiln_nn_model_params(((kp_model_t *)arg)->model, &n);
    kiln_nn_param_t **copy = PyMem_Malloc((n + 1) * sizeof *copy);
    if (!copy) {
      PyErr_NoMemory();
      return NULL;
    }
    for (size_t i = 0; i < n; i++) copy[i] = params[i];
    *out_count = n;
    *out_keep = Py_NewRef(arg);
    return copy;
  }
  /* A new tuple (PySequence_Tuple would return a caller's tuple itself): its items are replaced below. */
  PyObject *list = PySequence_List(arg);
  PyObject *seq = list ? PyList_AsTuple(list) : NULL;
  Py_XDECREF(list);
  if (!seq) return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(seq);
  kiln_nn_param_t **params = PyMem_Malloc(((size_t)n + 1) * sizeof *params);
  if (!params) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *p = PyTuple_GET_ITEM(seq, i);
    /* A tensor that requires grad (torch's model.parameters()) is its kiln.nn.Parameter. */
    PyObject *behind = kp_ag_param_of(p);
    if (behind) {
      Py_INCREF(behind);
      PyTuple_SET_ITEM(seq, i, behind); /* seq is our own new tuple: the parameter is what must live */
      Py_DECREF(p);
      p = behind;
    }
    if (!Py_IS_TYPE(p, &kp_param_type)) {
      PyMem_Free(params);
      Py_DECREF(seq);
      PyErr_Format(PyExc_TypeError, "params must be a kiln.nn.Sequential, kiln.nn.Parameter objects or tensors that "
                   "require grad, not %.100s%s", Py_TYPE(p)->tp_name,
                   KP_IS_TENSOR(p) ? " that does not require grad (x.requires_grad_())" : "");
      return NULL;
    }
    params[i] = ((kp_param_t *)p)->param;
  }
  *out_count = (size_t)n;
  *out_keep = seq;
  return params;
}

static PyObject *kp_optim_wrap(kiln_status_t status, kiln_nn_optimizer_t *opt, PyObject *keep) {
  if (status != KILN_OK) {
    Py_XDECREF(keep);
    return kp_raise(status);
  }
  kp_optim_t *o = PyObject_New(kp_optim_t, &kp_optim_type);
  if (!o) {
    kiln_nn_optimizer_free(opt);
    Py_XDECREF(keep);
    return NULL;
  }
  o->optimizer = opt;
  o->keep = keep;
  o->own_guard = (kp_guard_t){0};
  o->guard_source = NULL;
  /* Parameters of one model (the model itself, or its parameters()) share
   * its guard: training the model marks the optimizer too, and back. Looked
   * up through a kept object at each use, so a layer added to a model later
   * follows it. */
  if (Py_IS_TYPE(keep, &kp_model_type)) {
    o->guard_source = keep;
  } else if (PyTuple_Check(keep) && PyTuple_GET_SIZE(keep) > 0) {
    kp_guard_t *first = kp_guard_of(PyTuple_GET_ITEM(keep, 0));
    bool one = true;
    for (Py_ssize_t i = 1; one && i < PyTuple_GET_SIZE(keep); i++) one = kp_guard_of(PyTuple_GET_ITEM(keep, i)) == first;
    if (one) o->guard_source = PyTuple_GET_ITEM(keep, 0);
  }
  return (PyObject *)o;
}

/* A hyperparameter of an optimizer, checked here whatever libkiln-nn takes:
 * within its bounds, finite, and a float that keeps its value's magnitude
 * (the update kernels compute in f32: lr 1e300 would be inf there, 1e-50
 * zero, and every step would then fail or do nothing). 0, or -1 with a
 * ValueError naming the argument and its value. */
static int kp_hyper_check(const char *call, const char *name, double v, double low, bool low_open, double high,
                          bool high_open) {
  char text[32], low_text[32], high_text[32];
  bool in_range = isfinite(v) && (low_open ? v > low : v >= low) && (high_open ? v < high : v <= high);
  if (!in_range) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s: %s = %s; it must be finite and lie in %s%s, %s%s", call, name,
                 kp_double_text(v, text), low_open ? "(" : "[", kp_double_text(low, low_text),
                 kp_double_text(high, high_text), high_open ? ")" : "]");
    return -1;
  }
  float as_float = (float)v;
  if (!isfinite(as_float) || (v != 0 && as_float == 0)) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s: %s = %s is beyond what a float32 holds (the updates compute in float32); use a "
                 "magnitude between 1e-38 and 3e38", call, name, kp_double_text(v, text));
    return -1;
  }
  return 0;
}

static int kp_sgd_check(const char *call, const kiln_sgd_params_t *p) {
  if (kp_hyper_check(call, "lr", p->lr, 0, true, INFINITY, true) < 0 ||
      kp_hyper_check(call, "momentum", p->momentum, 0, false, INFINITY, true) < 0 ||
      kp_hyper_check(call, "dampening", p->dampening, 0, false, 1, false) < 0 ||
      kp_hyper_check(call, "weight_decay", p->weight_decay, 0, false, INFINITY, true) < 0)
    return -1;
  if (p->nesterov && (p->momentum <= 0 || p->dampening != 0)) {
    char m[32], d[32];
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s: nesterov needs momentum > 0 and dampening 0 (momentum %s, dampening %s)", call,
                 kp_double_text(p->momentum, m), kp_double_text(p->dampening, d));
    return -1;
  }
  return 0;
}

static int kp_adam_check(const char *call, const kiln_adam_params_t *p) {
  return kp_hyper_check(call, "lr", p->lr, 0, true, INFINITY, true) < 0 ||
                 kp_hyper_check(call, "betas[0]", p->beta1, 0, false, 1, true) < 0 ||
                 kp_hyper_check(call, "betas[1]", p->beta2, 0, false, 1, true) < 0 ||
                 kp_hyper_check(call, "eps", p->eps, 0, true, INFINITY, true) < 0 ||
                 kp_hyper_check(call, "weight_decay", p->weight_decay, 0, false, INFINITY, true) < 0
             ? -1
             : 0;
}

static PyObject *kp_sgd(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"params", "lr", "momentum", "dampening", "weight_decay", "nesterov", NULL};
  PyObject *params_arg;
  kiln_sgd_params_t p = {0};
  int nesterov = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Od|dddp:SGD", names, &params_arg, &p.lr, &p.momentum, &p.dampening,
                                   &p.weight_decay, &nesterov))
    return NULL;
  p.nesterov = nesterov != 0;
  if (kp_sgd_check("SGD", &p) < 0) return NULL;
  size_t n;
  PyObject *keep = NULL;
  kiln_nn_param_t **params = kp_params_arg(params_arg, &n, &keep);
  if (!params) return NULL;
  kiln_nn_optimizer_t *opt = NULL;
  kiln_status_t status = kiln_nn_sgd_create(params, n, &p, &opt);
  PyMem_Free(params);
  return kp_optim_wrap(status, opt, keep);
}

static PyObject *kp_adam(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"params", "lr", "betas", "eps", "weight_decay", NULL};
  PyObject *params_arg;
  kiln_adam_params_t p = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|d(dd)dd:Adam", names, &params_arg, &p.lr, &p.beta1, &p.beta2,
                                   &p.eps, &p.weight_decay))
    return NULL;
  if (kp_adam_check("Adam", &p) < 0) return NULL;
  size_t n;
  PyObject *keep = NULL;
  kiln_nn_param_t **params = kp_params_arg(params_arg, &n, &keep);
  if (!params) return NULL;
  kiln_nn_optimizer_t *opt = NULL;
  kiln_status_t status = kiln_nn_adam_create(params, n, &p, &opt);
  PyMem_Free(params);
  return kp_optim_wrap(status, opt, keep);
}

static PyObject *kp_optimizer_preset(PyObject *self, PyObject *args) {
  const char *name;
  PyObject *model;
  if (!PyArg_ParseTuple(args, "sO!:optimizer_preset", &name, &kp_model_type, &model)) return NULL;
  kiln_nn_optimizer_t *opt = NULL;
  kiln_status_t status = kiln_nn_optimizer_create_preset(name, ((kp_model_t *)model)->model, &opt);
  return kp_optim_wrap(status, opt, status == KILN_OK ? Py_NewRef(model) : NULL);
}

/* An optimizer over parameters that do not share one guard checks each. */
static int kp_optim_check_params(kp_optim_t *o) {
  if (!o->guard_source && PyTuple_Check(o->keep))
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o->keep); i++)
      if (kp_guard_check(PyTuple_GET_ITEM(o->keep, i)) < 0) return -1;
  return 0;
}

static int kp_optim_check(kp_optim_t *o) {
  return kp_guard_check((PyObject *)o) < 0 ? -1 : kp_optim_check_params(o);
}

static PyObject *kp_optim_step(kp_optim_t *o, PyObject *unused) {
  if (kp_optim_check(o) < 0) return NULL;
  kiln_status_t status = kiln_nn_optimizer_step(o->optimizer);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_optim_zero_grad(kp_optim_t *o, PyObject *unused) {
  if (kp_optim_check(o) < 0) return NULL;
  kiln_nn_optimizer_zero_grad(o->optimizer);
  Py_RETURN_NONE;
}

static PyObject *kp_optim_get_lr(kp_optim_t *o, void *c) { return PyFloat_FromDouble(kiln_nn_optimizer_lr(o->optimizer)); }

static int kp_optim_set_lr(kp_optim_t *o, PyObject *value, void *c) {
  if (!value) {
    PyErr_SetString(PyExc_AttributeError, "lr cannot be deleted");
    return -1;
  }
  double lr = PyFloat_AsDouble(value);
  if (lr == -1.0 && PyErr_Occurred()) return -1;
  if (kp_hyper_check("Optimizer.lr", "lr", lr, 0, true, INFINITY, true) < 0 || kp_optim_check(o) < 0) return -1;
  kiln_status_t status = kiln_nn_optimizer_set_lr(o->optimizer, lr);
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  return 0;
}

static PyObject *kp_optim_repr(kp_optim_t *o) {
  return PyUnicode_FromFormat("kiln.nn.Optimizer(%s)", kiln_nn_optimizer_describe(o->optimizer));
}

static PyMethodDef kp_optim_methods[] = {
    {"step", (PyCFunction)kp_optim_step, METH_NOARGS,
     "step()\n--\n\nUpdate every parameter that has a gradient, in place (one fused kiln operation each). Enqueues."},
    {"zero_grad", (PyCFunction)kp_optim_zero_grad, METH_NOARGS, "zero_grad()\n--\n\nDrop every parameter's gradient."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kp_optim_getset[] = {
    {"lr", (getter)kp_optim_get_lr, (setter)kp_optim_set_lr, "the learning rate (settable, for a schedule)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kp_optim_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn.Optimizer",
    .tp_basicsize = sizeof(kp_optim_t),
    .tp_dealloc = (destructor)kp_optim_dealloc,
    .tp_repr = (reprfunc)kp_optim_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An optimizer over a list of parameters: kiln.nn.SGD(...) or kiln.nn.Adam(...).",
    .tp_methods = kp_optim_methods,
    .tp_getset = kp_optim_getset,
};

/* ---- the training loop ------------------------------------------------------------------------------ */

typedef struct kp_progress_ctx_t {
  PyObject *fn;
  PyObject *type, *value, *tb; /* the first exception the callback raised */
} kp_progress_ctx_t;

static void kp_progress_cb(const kiln_nn_progress_t *p, void *user) {
  kp_progress_ctx_t *ctx = user;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (!ctx->type) {
    PyObject *info = Py_BuildValue("{s:K,s:n,s:n,s:n,s:d,s:d,s:d}", "epoch", (unsigned long long)p->epoch, "step",
                                   (Py_ssize_t)p->step, "steps", (Py_ssize_t)p->steps, "images", (Py_ssize_t)p->images,
                                   "loss", p->loss, "accuracy", p->accuracy, "seconds", p->seconds);
    PyObject *r = info ? PyObject_CallOneArg(ctx->fn, info) : NULL;
    Py_XDECREF(info);
    if (!r) PyErr_Fetch(&ctx->type, &ctx->value, &ctx->tb);
    Py_XDECREF(r);
  }
  PyGILState_Release(gil);
}

static PyObject *kp_train_epoch(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"model", "optimizer", "loader", "report_every", "progress", "max_steps", "step_losses", NULL};
  PyObject *model, *optim, *loader, *progress = Py_None;
  Py_ssize_t report_every = 0, max_steps = 0, step_losses = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!|$nOnn:train_epoch", names, &kp_model_type, &model,
                                   &kp_optim_type, &optim, &kp_loader_type, &loader, &report_every, &progress,
                                   &max_steps, &step_losses))
    return NULL;
  if (report_every < 0 || max_steps < 0 || step_losses < 0)
    return kp_raise_msg(KILN_INVALID_ARGUMENT, "train_epoch: report_every, max_steps and step_losses must be >= 0");
  kiln_nn_train_options_t o;
  kiln_nn_train_options_initialize(&o);
  kp_progress_ctx_t ctx = {0};
  o.report_every = (size_t)report_every;
  o.max_steps = (size_t)max_steps;
  if (progress != Py_None) {
    if (!PyCallable_Check(progress)) return PyErr_Format(PyExc_TypeError, "train_epoch: progress must be callable");
    ctx.fn = progress;
    o.progress = kp_progress_cb;
    o.user = &ctx;
  }
  float *losses = NULL;
  if (step_losses > 0) {
    losses = PyMem_Calloc((size_t)step_losses, sizeof *losses);
    if (!losses) return PyErr_NoMemory();
    o.step_losses = losses;
    o.step_loss_count = (size_t)step_losses;
  }
  kiln_nn_epoch_stats_t st;
  kiln_status_t status;
  kp_guard_t *guards[3];
  PyObject *used[3] = {model, optim, loader};
  int held = kp_optim_check_params((kp_optim_t *)optim) < 0 ? -1 : kp_guard_enter(used, 3, "train_epoch", guards);
  if (held < 0) {
    PyMem_Free(losses);
    return NULL;
  }
  KP_NOGIL(status = kiln_nn_train_epoch(((kp_model_t *)model)->model, ((kp_optim_t *)optim)->optimizer,
                                        ((kp_loader_t *)loader)->loader, &o, &st));
  kp_guard_leave(guards, held);
  if (ctx.type) {
    PyMem_Free(losses);
    PyErr_Restore(ctx.type, ctx.value, ctx.tb);
    return NULL;
  }
  if (status != KILN_OK) {
    PyMem_Free(losses);
    return kp_raise(status);
  }
  PyObject *result = Py_BuildValue("{s:K,s:n,s:n,s:d,s:d,s:d,s:d}", "epoch", (unsigned long long)st.epoch, "steps",
                                   (Py_ssize_t)st.steps, "images", (Py_ssize_t)st.images, "loss", st.loss, "accuracy",
                                   st.accuracy, "seconds", st.seconds, "images_per_s", st.images_per_s);
  if (result && losses) {
    size_t kept = st.steps < (size_t)step_losses ? st.steps : (size_t)step_losses;
    PyObject *list = PyList_New((Py_ssize_t)kept);
    for (size_t i = 0; list && i < kept; i++) {
      PyObject *v = PyFloat_FromDouble(losses[i]);
      if (!v) Py_CLEAR(list);
      else PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    if (!list || PyDict_SetItemString(result, "step_losses", list) < 0) Py_CLEAR(result);
    Py_XDECREF(list);
  }
  PyMem_Free(losses);
  return result;
}

static PyObject *kp_evaluate(PyObject *self, PyObject *args) {
  PyObject *model, *loader;
  if (!PyArg_ParseTuple(args, "O!O!:evaluate", &kp_model_type, &model, &kp_loader_type, &loader)) return NULL;
  double loss = 0, accuracy = 0;
  kiln_status_t status;
  kp_guard_t *guards[2];
  PyObject *used[2] = {model, loader};
  int held = kp_guard_enter(used, 2, "evaluate", guards);
  if (held < 0) return NULL;
  KP_NOGIL(status = kiln_nn_evaluate(((kp_model_t *)model)->model, ((kp_loader_t *)loader)->loader, &loss, &accuracy));
  kp_guard_leave(guards, held);
  if (status != KILN_OK) return kp_raise(status);
  return Py_BuildValue("(dd)", loss, accuracy);
}

PyMethodDef kp_nn_model_functions[] = {
    {"Linear", (PyCFunction)(void (*)(void))kp_linear, METH_VARARGS | METH_KEYWORDS,
     "Linear(in_features, out_features, bias=True, *, device=None, seed=0)\n--\n\nA dense layer [N, in] -> [N, out], "
     "initialised as PyTorch's from `seed`."},
    {"Conv2d", (PyCFunction)(void (*)(void))kp_conv2d, METH_VARARGS | METH_KEYWORDS,
     "Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True, *, device=None, "
     "seed=0)\n--\n\nA convolution layer [N, C, H, W] -> [N, K, P, Q]."},
    {"MaxPool2d", (PyCFunction)(void (*)(void))kp_max_pool2d_layer, METH_VARARGS | METH_KEYWORDS,
     "MaxPool2d(kernel_size, stride=None, padding=0)\n--\n\nA max-pooling layer."},
    {"ReLU", kp_relu_layer, METH_NOARGS, "ReLU()\n--\n\nA ReLU layer."},
    {"Sigmoid", kp_sigmoid_layer, METH_NOARGS, "Sigmoid()\n--\n\nA sigmoid layer (torch.nn.Sigmoid)."},
    {"Tanh", kp_tanh_layer, METH_NOARGS, "Tanh()\n--\n\nA tanh layer (torch.nn.Tanh)."},
    {"Flatten", kp_flatten_layer, METH_NOARGS, "Flatten()\n--\n\n[N, ...] -> [N, rest], a view."},
    {"SGD", (PyCFunction)(void (*)(void))kp_sgd, METH_VARARGS | METH_KEYWORDS,
     "SGD(params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)\n--\n\nSGD as "
     "torch.optim.SGD; params is a Sequential or a list of Parameters."},
    {"Adam", (PyCFunction)(void (*)(void))kp_adam, METH_VARARGS | METH_KEYWORDS,
     "Adam(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0)\n--\n\nAdam as torch.optim.Adam."},
    {"optimizer_preset", kp_optimizer_preset, METH_VARARGS,
     "optimizer_preset(name, model)\n--\n\nkiln-train's optimizer for a preset: 'mlp' SGD(lr 0.05, momentum 0.9), "
     "'lenet' Adam(lr 0.002)."},
    {"train_epoch", (PyCFunction)(void (*)(void))kp_train_epoch, METH_VARARGS | METH_KEYWORDS,
     "train_epoch(model, optimizer, loader, *, report_every=0, progress=None, max_steps=0, step_losses=0)\n--\n\n"
     "One epoch of a classifier (forward with a tape, cross-entropy, backward, step) run in C without the GIL. "
     "progress(dict) is called every report_every steps; step_losses=n keeps the first n losses. Returns a dict: "
     "epoch, steps, images, loss, accuracy, seconds, images_per_s (and step_losses)."},
    {"evaluate", kp_evaluate, METH_VARARGS,
     "evaluate(model, loader)\n--\n\n(mean loss, accuracy) over one epoch of a loader without shuffle. Blocks."},
    {NULL, NULL, 0, NULL},
};

/* ---- the kiln.nn part of the module -------------------------------------------------------------------- */

static struct PyModuleDef kp_nn_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kiln._kiln.nn",
    .m_doc = "libkiln-nn for Python: data sets, the batch loader, safetensors, the tape, layers, optimizers.",
    .m_size = -1,
};

int kp_module_init_nn(PyObject *module) {
  PyTypeObject *types[] = {&kp_owner_type, &kp_dataset_type, &kp_loader_type, &kp_param_type,
                           &kp_tape_type,  &kp_layer_type,   &kp_model_type,  &kp_optim_type};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (PyType_Ready(types[i]) < 0) return -1;
  PyObject *nn = PyModule_Create(&kp_nn_module_def);
  if (!nn) return -1;
  if (PyModule_AddFunctions(nn, kp_nn_data_functions) < 0 || PyModule_AddFunctions(nn, kp_nn_train_functions) < 0 ||
      PyModule_AddFunctions(nn, kp_nn_model_functions) < 0 ||
      PyModule_AddObjectRef(nn, "Dataset", (PyObject *)&kp_dataset_type) < 0 ||
      PyModule_AddObjectRef(nn, "Loader", (PyObject *)&kp_loader_type) < 0 ||
      PyModule_AddObjectRef(nn, "Parameter", (PyObject *)&kp_param_type) < 0 ||
      PyModule_AddObjectRef(nn, "Tape", (PyObject *)&kp_tape_type) < 0 ||
      PyModule_AddObjectRef(nn, "Layer", (PyObject *)&kp_layer_type) < 0 ||
      PyModule_AddObjectRef(nn, "Sequential", (PyObject *)&kp_model_type) < 0 ||
      PyModule_AddObjectRef(nn, "Optimizer", (PyObject *)&kp_optim_type) < 0 ||
      PyModule_AddStringConstant(nn, "FASHION_MNIST_DIR", KILN_NN_FASHION_MNIST_DIR) < 0) {
    Py_DECREF(nn);
    return -1;
  }
  return PyModule_AddObject(module, "nn", nn) < 0 ? (Py_DECREF(nn), -1) : 0;
}
