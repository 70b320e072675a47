/* python/src/device.c: kiln.Device (one object per kiln device), device lookup (devices, device, try_gpu, try_all_gpus), backends and synchronize. */
#include "kilnpy.h"

#include <kiln/dlpack.h>

/* One Device object per kiln device, made on first need. Devices live until
 * the process ends (the extension never deinitialises kiln). */
#define KP_MAX_DEVICES 256
static kiln_device_t *kp_device_keys[KP_MAX_DEVICES];
static PyObject *kp_device_objects[KP_MAX_DEVICES];
static size_t kp_device_known;

static PyObject *kp_device_make(kiln_device_t *device) {
  kiln_device_info_t info;
  kiln_status_t status = kiln_device_info(device, &info);
  if (status != KILN_OK) return kp_raise(status);
  kp_device_t *d = PyObject_New(kp_device_t, &kp_device_type);
  if (!d) return NULL;
  d->device = device;
  d->index = (Py_ssize_t)info.index;
  d->selector = PyUnicode_FromString(info.selector);
  d->backend = PyUnicode_FromString(info.backend);
  d->type = PyUnicode_FromString(kiln_device_type_name(info.type));
  d->name = PyUnicode_FromString(info.name);
  d->dlpack = NULL;
  DLDevice dl;
  if (kiln_device_dlpack(device, &dl) == KILN_OK) d->dlpack = Py_BuildValue("(ii)", (int)dl.device_type, dl.device_id);
  else kiln_clear_error();
  if (!d->selector || !d->backend || !d->type || !d->name) {
    Py_DECREF(d);
    return NULL;
  }
  return (PyObject *)d;
}

PyObject *kp_device_object(kiln_device_t *device) {
  for (size_t i = 0; i < kp_device_known; i++)
    if (kp_device_keys[i] == device) return Py_NewRef(kp_device_objects[i]);
  PyObject *obj = kp_device_make(device);
  if (!obj) return NULL;
  if (kp_device_known < KP_MAX_DEVICES) {
    kp_device_keys[kp_device_known] = device;
    kp_device_objects[kp_device_known++] = Py_NewRef(obj);
  }
  return obj;
}

int kp_device_arg(PyObject *arg, kiln_device_t **out) {
  kiln_status_t status;
  if (!arg || arg == Py_None) {
    status = kiln_device_default(out);
  } else if (Py_IS_TYPE(arg, &kp_device_type)) {
    *out = ((kp_device_t *)arg)->device;
    return 0;
  } else if (PyUnicode_Check(arg)) {
    const char *selector = PyUnicode_AsUTF8(arg);
    if (!selector) return -1;
    status = kiln_device_find(selector, out);
  } else if (PyLong_Check(arg)) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0) {
      kp_raise_msg(KILN_NOT_FOUND, "device index %zd is negative; kiln.devices() lists the devices", i);
      return -1;
    }
    status = kiln_device_get((size_t)i, out);
  } else {
    PyErr_Format(PyExc_TypeError,
                 "device must be a kiln.Device, a selector string such as 'cpu:0' or 'opencl:gpu', an index into "
                 "kiln.devices(), or None for the default device, not %.100s",
                 Py_TYPE(arg)->tp_name);
    return -1;
  }
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  return 0;
}

/* ---- the Device type ------------------------------------------------------------------- */

static void kp_device_dealloc(kp_device_t *d) {
  Py_XDECREF(d->selector);
  Py_XDECREF(d->backend);
  Py_XDECREF(d->type);
  Py_XDECREF(d->name);
  Py_XDECREF(d->dlpack);
  PyObject_Free(d);
}

static PyObject *kp_device_repr(kp_device_t *d) { return PyUnicode_FromFormat("device('%U')", d->selector); }
static PyObject *kp_device_str(kp_device_t *d) { return Py_NewRef(d->selector); }

/* Equal to itself and to its selector string, so `t.device == 'cpu:0'` reads naturally. */
static PyObject *kp_device_richcompare(PyObject *a, PyObject *b, int op) {
  if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  int equal;
  if (Py_IS_TYPE(b, &kp_device_type)) equal = a == b;
  else if (PyUnicode_Check(b)) equal = PyUnicode_Compare(((kp_device_t *)a)->selector, b) == 0;
  else Py_RETURN_NOTIMPLEMENTED;
  if (PyErr_Occurred()) return NULL;
  return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static Py_hash_t kp_device_hash(kp_device_t *d) { return PyObject_Hash(d->selector); }

static PyObject *kp_device_info(kp_device_t *d, PyObject *unused) {
  kiln_device_info_t info;
  kiln_status_t status = kiln_device_info(d->device, &info);
  if (status != KILN_OK) return kp_raise(status);
  PyObject *dict = Py_BuildValue(
      "{s:n,s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:K,s:K,s:O,s:K,s:K,s:I,s:I,s:s,s:O,s:O,s:O}", "index",
      (Py_ssize_t)info.index, "selector", info.selector, "backend", info.backend, "backend_index",
      (unsigned)info.backend_index, "type", kiln_device_type_name(info.type), "name", info.name, "vendor", info.vendor,
      "driver_version", info.driver_version, "runtime_version", info.runtime_version, "platform", info.platform,
      "uuid", info.uuid, "pci_bus_id", info.pci_bus_id, "memory_bytes", (unsigned long long)info.memory_bytes,
      "memory_free_bytes", (unsigned long long)info.memory_free_bytes, "memory_free_is_estimate",
      info.memory_free_is_estimate ? Py_True : Py_False, "max_alloc_bytes", (unsigned long long)info.max_alloc_bytes,
      "local_memory_bytes", (unsigned long long)info.local_memory_bytes, "compute_units", (unsigned)info.compute_units,
      "max_work_group_size", (unsigned)info.max_work_group_size, "compute_capability", info.compute_capability, "fp16",
      info.fp16 ? Py_True : Py_False, "fp64", info.fp64 ? Py_True : Py_False, "is_default",
      info.is_default ? Py_True : Py_False);
  if (!dict) return NULL;
  size_t count = kiln_device_property_count(d->device);
  for (size_t i = 0; i < count; i++) {
    const char *key, *value;
    if (kiln_device_property(d->device, i, &key, &value) != KILN_OK) continue;
    PyObject *v = PyUnicode_FromString(value);
    if (!v || PyDict_SetItemString(dict, key, v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(dict);
      return NULL;
    }
    Py_DECREF(v);
  }
  return dict;
}

static PyObject *kp_device_memory_stats(kp_device_t *d, PyObject *unused) {
  kiln_memory_stats_t st;
  kiln_status_t status = kiln_device_memory_stats(d->device, &st);
  if (status != KILN_OK) return kp_raise(status);
  return Py_BuildValue("{s:K,s:K,s:K,s:K}", "in_use_bytes", (unsigned long long)st.in_use_bytes, "pooled_bytes",
                       (unsigned long long)st.pooled_bytes, "peak_bytes", (unsigned long long)st.peak_bytes,
                       "allocations", (unsigned long long)st.allocations);
}

static PyObject *kp_device_reset_peak(kp_device_t *d, PyObject *unused) {
  kiln_status_t status = kiln_device_memory_reset_peak(d->device);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_device_providers(kp_device_t *d, PyObject *arg) {
  const char *op = PyUnicode_AsUTF8(arg);
  if (!op) return NULL;
  const char *list = kiln_device_providers(d->device, op);
  if (!list) return kp_raise_msg(KILN_NOT_FOUND, "providers: unknown operation '%s' (kiln.op_names() lists them)", op);
  PyObject *text = PyUnicode_FromString(list);
  if (!text) return NULL;
  PyObject *sep = PyUnicode_FromString(",");
  PyObject *parts = sep ? PyUnicode_Split(text, sep, -1) : NULL;
  Py_XDECREF(sep);
  Py_DECREF(text);
  return parts;
}

static PyObject *kp_device_synchronize(kp_device_t *d, PyObject *unused) {
  kiln_status_t status;
  KP_NOGIL(status = kiln_queue_finish(kiln_device_current_queue(d->device)));
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_device_check(kp_device_t *d, PyObject *unused) {
  kiln_status_t status;
  KP_NOGIL(status = kiln_device_check(d->device));
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_device_get_dlpack(kp_device_t *d, void *closure) {
  if (!d->dlpack) Py_RETURN_NONE;
  return Py_NewRef(d->dlpack);
}

static PyObject *kp_device_reduce(kp_device_t *d, PyObject *unused) {
  /* Pickles as kiln.device(selector). */
  PyObject *mod = PyImport_ImportModule("kiln");
  if (!mod) return NULL;
  PyObject *fn = PyObject_GetAttrString(mod, "device");
  Py_DECREF(mod);
  if (!fn) return NULL;
  return Py_BuildValue("(N(O))", fn, d->selector);
}

static PyMethodDef kp_device_methods[] = {
    {"info", (PyCFunction)kp_device_info, METH_NOARGS,
     "info()\n--\n\nEvery property as a dict (free memory queried now); devinfo -v shows the same."},
    {"memory_stats", (PyCFunction)kp_device_memory_stats, METH_NOARGS,
     "memory_stats()\n--\n\nkiln's memory use on the device: in_use_bytes, pooled_bytes, peak_bytes, allocations."},
    {"reset_peak_memory", (PyCFunction)kp_device_reset_peak, METH_NOARGS,
     "reset_peak_memory()\n--\n\nStart peak_bytes afresh."},
    {"providers", (PyCFunction)kp_device_providers, METH_O,
     "providers(op)\n--\n\nThe providers of an operation on this device, 'native' first: ['native', 'blas']."},
    {"synchronize", (PyCFunction)kp_device_synchronize, METH_NOARGS,
     "synchronize()\n--\n\nWait until the work enqueued on this device's current queue is done (blocks, without "
     "the GIL); raises the first asynchronous error it met."},
    {"check", (PyCFunction)kp_device_check, METH_NOARGS,
     "check()\n--\n\nRun a small computation here and compare with the CPU (devinfo --check); raises on a difference."},
    {"__reduce__", (PyCFunction)kp_device_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef kp_device_members[] = {
    {"selector", T_OBJECT_EX, offsetof(kp_device_t, selector), READONLY,
     "the selector that picks exactly this device in KILN_DEVICE ('cpu:0', 'opencl:1', 'cuda:0')"},
    {"backend", T_OBJECT_EX, offsetof(kp_device_t, backend), READONLY, "'cpu', 'opencl' or 'cuda'"},
    {"type", T_OBJECT_EX, offsetof(kp_device_t, type), READONLY, "'cpu', 'gpu', 'accelerator' or 'other'"},
    {"name", T_OBJECT_EX, offsetof(kp_device_t, name), READONLY, "the device's own name"},
    {"index", T_PYSSIZET, offsetof(kp_device_t, index), READONLY, "position in kiln.devices()"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef kp_device_getset[] = {
    {"dlpack", (getter)kp_device_get_dlpack, NULL, "(DLPack device type, id), or None when the backend has no DLPack",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kp_device_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.Device",
    .tp_basicsize = sizeof(kp_device_t),
    .tp_dealloc = (destructor)kp_device_dealloc,
    .tp_repr = (reprfunc)kp_device_repr,
    .tp_str = (reprfunc)kp_device_str,
    .tp_hash = (hashfunc)kp_device_hash,
    .tp_richcompare = kp_device_richcompare,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compute device as kiln sees it: the CPU, or a GPU through CUDA or OpenCL. Get one from "
              "kiln.device('cpu:0'), kiln.try_gpu(i), kiln.devices(); there is one object per device.",
    .tp_methods = kp_device_methods,
    .tp_members = kp_device_members,
    .tp_getset = kp_device_getset,
};

/* ---- module functions ---------------------------------------------------------------------- */

static PyObject *kp_devices(PyObject *self, PyObject *unused) {
  size_t count = 0;
  kiln_status_t status = kiln_device_count(&count);
  if (status != KILN_OK) return kp_raise(status);
  PyObject *list = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; list && i < count; i++) {
    kiln_device_t *d = NULL;
    status = kiln_device_get(i, &d);
    PyObject *obj = status == KILN_OK ? kp_device_object(d) : kp_raise(status);
    if (!obj) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, obj);
  }
  return list;
}

static PyObject *kp_device_fn(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs > 1) return PyErr_Format(PyExc_TypeError, "device() takes at most one argument (%zd given)", nargs);
  kiln_device_t *d;
  if (kp_device_arg(nargs ? args[0] : NULL, &d) < 0) return NULL;
  return kp_device_object(d);
}

static PyObject *kp_default_device(PyObject *self, PyObject *unused) { return kp_device_fn(self, NULL, 0); }

static PyObject *kp_try_gpu(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs > 1) return PyErr_Format(PyExc_TypeError, "try_gpu() takes at most one argument (%zd given)", nargs);
  Py_ssize_t i = 0;
  if (nargs) {
    i = PyLong_AsSsize_t(args[0]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) return PyErr_Format(PyExc_ValueError, "try_gpu(%zd): the GPU number must be >= 0", i);
  }
  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_OK) return kp_raise(status);
  kiln_device_t *d = kiln_try_gpu((size_t)i);
  if (!d) return kp_raise_msg(KILN_NOT_FOUND, "try_gpu(%zd): no device is visible (check KILN_DEVICE)", i);
  return kp_device_object(d);
}

static PyObject *kp_try_all_gpus(PyObject *self, PyObject *unused) {
  size_t count = 0;
  kiln_status_t status = kiln_try_all_gpus(NULL, 0, &count);
  if (status != KILN_OK) return kp_raise(status);
  kiln_device_t *devs[KP_MAX_DEVICES];
  if (count > KP_MAX_DEVICES) count = KP_MAX_DEVICES;
  status = kiln_try_all_gpus(devs, count, &count);
  if (status != KILN_OK) return kp_raise(status);
  PyObject *list = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; list && i < count; i++) {
    PyObject *obj = kp_device_object(devs[i]);
    if (!obj) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, obj);
  }
  return list;
}

static PyObject *kp_num_gpus(PyObject *self, PyObject *unused) {
  size_t count = 0;
  kiln_status_t status = kiln_device_count(&count);
  if (status != KILN_OK) return kp_raise(status);
  long gpus = 0;
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *d;
    kiln_device_info_t info;
    if (kiln_device_get(i, &d) == KILN_OK && kiln_device_info(d, &info) == KILN_OK && info.type == KILN_DEVICE_GPU)
      gpus++;
  }
  return PyLong_FromLong(gpus);
}

static PyObject *kp_backends(PyObject *self, PyObject *unused) {
  size_t count = 0;
  kiln_status_t status = kiln_backend_count(&count);
  if (status != KILN_OK) return kp_raise(status);
  PyObject *list = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; list && i < count; i++) {
    kiln_backend_info_t info;
    status = kiln_backend_info(i, &info);
    PyObject *obj = status != KILN_OK
                        ? kp_raise(status)
                        : Py_BuildValue("{s:s,s:s,s:s,s:s,s:s,s:n}", "name", info.name, "state",
                                        kiln_backend_state_name(info.state), "reason", info.reason, "path", info.path,
                                        "version", info.version, "device_count", (Py_ssize_t)info.device_count);
    if (!obj) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, obj);
  }
  return list;
}

static PyObject *kp_synchronize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs > 1) return PyErr_Format(PyExc_TypeError, "synchronize() takes at most one argument (%zd given)", nargs);
  if (nargs == 1 && args[0] != Py_None) {
    kiln_device_t *d;
    if (kp_device_arg(args[0], &d) < 0) return NULL;
    PyObject *obj = kp_device_object(d);
    if (!obj) return NULL;
    PyObject *r = kp_device_synchronize((kp_device_t *)obj, NULL);
    Py_DECREF(obj);
    return r;
  }
  /* Every visible device. */
  size_t count = 0;
  kiln_status_t status = kiln_device_count(&count);
  if (status != KILN_OK) return kp_raise(status);
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *d;
    status = kiln_device_get(i, &d);
    if (status == KILN_OK) KP_NOGIL(status = kiln_queue_finish(kiln_device_current_queue(d)));
    if (status != KILN_OK) return kp_raise(status);
  }
  Py_RETURN_NONE;
}

static PyMethodDef kp_device_functions[] = {
    {"devices", kp_devices, METH_NOARGS,
     "devices()\n--\n\nEvery visible device, in kiln's order: GPUs first, then by backend priority."},
    {"device", (PyCFunction)(void (*)(void))kp_device_fn, METH_FASTCALL,
     "device(spec=None)\n--\n\nThe device a selector names ('cpu:0', 'opencl:gpu', 'cuda:1'), an index into "
     "kiln.devices(), a Device (returned as is), or None for the default device."},
    {"default_device", kp_default_device, METH_NOARGS,
     "default_device()\n--\n\nThe default device: the first visible one (GPUs before the CPU)."},
    {"try_gpu", (PyCFunction)(void (*)(void))kp_try_gpu, METH_FASTCALL,
     "try_gpu(i=0)\n--\n\nGPU i if it exists, else the CPU (the chapter's try_gpu)."},
    {"try_all_gpus", kp_try_all_gpus, METH_NOARGS,
     "try_all_gpus()\n--\n\nEvery GPU, or [the CPU] when there is none (the chapter's try_all_gpus)."},
    {"num_gpus", kp_num_gpus, METH_NOARGS, "num_gpus()\n--\n\nHow many visible devices are GPUs."},
    {"backends", kp_backends, METH_NOARGS,
     "backends()\n--\n\nWhat became of each backend: name, state ('loaded', 'no device', 'unavailable', "
     "'abi mismatch'), reason, path, version, device_count."},
    {"synchronize", (PyCFunction)(void (*)(void))kp_synchronize, METH_FASTCALL,
     "synchronize(device=None)\n--\n\nWait for the work enqueued on a device (every device when None); blocks "
     "without the GIL."},
    {NULL, NULL, 0, NULL},
};

int kp_module_init_devices(PyObject *module) {
  if (PyType_Ready(&kp_device_type) < 0) return -1;
  if (PyModule_AddObjectRef(module, "Device", (PyObject *)&kp_device_type) < 0) return -1;
  return PyModule_AddFunctions(module, kp_device_functions);
}
