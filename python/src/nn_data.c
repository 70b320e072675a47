/* python/src/nn_data.c: kiln.nn's data half over libkiln-nn: data sets (Fashion-MNIST, IDX, arrays), the batch loader, safetensors files. */
#include "kilnnn.h"

#include <stdlib.h>
#include <string.h>

/* ---- Dataset ------------------------------------------------------------------------ */

static void kp_dataset_dealloc(kp_dataset_t *d) {
  kiln_nn_dataset_free(d->dataset);
  PyObject_Free(d);
}

PyObject *kp_dataset_wrap(kiln_nn_dataset_t *ds) {
  kp_dataset_t *d = PyObject_New(kp_dataset_t, &kp_dataset_type);
  if (!d) {
    kiln_nn_dataset_free(ds);
    return NULL;
  }
  d->dataset = ds;
  return (PyObject *)d;
}

static int kp_split_arg(const char *split, kiln_nn_split_t *out) {
  if (!strcmp(split, "train")) *out = KILN_NN_TRAIN;
  else if (!strcmp(split, "test") || !strcmp(split, "t10k")) *out = KILN_NN_TEST;
  else {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "split '%s': use 'train' or 'test'", split);
    return -1;
  }
  return 0;
}

static PyObject *kp_fashion_mnist(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"split", "dir", NULL};
  const char *split = "train";
  PyObject *dir_arg = Py_None, *dir_bytes = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|sO:FashionMNIST", names, &split, &dir_arg)) return NULL;
  kiln_nn_split_t s;
  if (kp_split_arg(split, &s) < 0) return NULL;
  if (dir_arg != Py_None && !PyUnicode_FSConverter(dir_arg, &dir_bytes)) return NULL;
  const char *dir = dir_bytes ? PyBytes_AS_STRING(dir_bytes) : NULL;
  kiln_nn_dataset_t *ds = NULL;
  kiln_status_t status;
  KP_NOGIL(status = kiln_nn_dataset_load_fashion_mnist(dir, s, &ds));
  Py_XDECREF(dir_bytes);
  if (status != KILN_OK) return kp_raise(status);
  return kp_dataset_wrap(ds);
}

static PyObject *kp_load_idx(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"images", "labels", "classes", NULL};
  PyObject *images = NULL, *labels = NULL, *classes_arg;
  long long classes;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O:load_idx", names, PyUnicode_FSConverter, &images,
                                   PyUnicode_FSConverter, &labels, &classes_arg))
    return NULL;
  if (kp_int_arg(classes_arg, "classes", 0, UINT32_MAX, &classes) < 0) {
    Py_DECREF(images);
    Py_DECREF(labels);
    return NULL;
  }
  kiln_nn_dataset_t *ds = NULL;
  kiln_status_t status;
  KP_NOGIL(status = kiln_nn_dataset_load_idx(PyBytes_AS_STRING(images), PyBytes_AS_STRING(labels), (uint32_t)classes,
                                             &ds));
  Py_DECREF(images);
  Py_DECREF(labels);
  if (status != KILN_OK) return kp_raise(status);
  return kp_dataset_wrap(ds);
}

/* Dataset.from_arrays(pixels [N, rows, cols] uint8, labels [N], classes). */
static PyObject *kp_dataset_from_arrays(PyObject *cls, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"pixels", "labels", "classes", NULL};
  PyObject *pixels, *labels, *classes_arg;
  long long classes;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:from_arrays", names, &pixels, &labels, &classes_arg) ||
      kp_int_arg(classes_arg, "classes", 0, UINT32_MAX, &classes) < 0)
    return NULL;
  Py_buffer pv, lv;
  if (PyObject_GetBuffer(pixels, &pv, PyBUF_ND | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
  if (PyObject_GetBuffer(labels, &lv, PyBUF_ND | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
    PyBuffer_Release(&pv);
    return NULL;
  }
  PyObject *result = NULL;
  if (pv.itemsize != 1 || lv.itemsize != 1 || pv.ndim != 3 || lv.ndim != 1 || pv.shape[0] != lv.shape[0]) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "from_arrays: pixels must be bytes of shape [N, rows, cols] (uint8) and "
                 "labels bytes of shape [N] (uint8) with the same N");
  } else {
    kiln_nn_dataset_t *ds = NULL;
    kiln_status_t status = kiln_nn_dataset_create((size_t)pv.shape[0], (uint32_t)pv.shape[1], (uint32_t)pv.shape[2],
                                                  (uint32_t)classes, pv.buf, lv.buf, &ds);
    result = status == KILN_OK ? kp_dataset_wrap(ds) : kp_raise(status);
  }
  PyBuffer_Release(&pv);
  PyBuffer_Release(&lv);
  return result;
}

static int kp_dataset_info(kp_dataset_t *d, kiln_nn_dataset_info_t *info) {
  kiln_status_t status = kiln_nn_dataset_info(d->dataset, info);
  if (status != KILN_OK) {
    kp_raise(status);
    return -1;
  }
  return 0;
}

static Py_ssize_t kp_dataset_len(PyObject *o) {
  kiln_nn_dataset_info_t info;
  if (kp_dataset_info((kp_dataset_t *)o, &info) < 0) return -1;
  return (Py_ssize_t)info.count;
}

static PyObject *kp_dataset_get_info(kp_dataset_t *d, void *which) {
  kiln_nn_dataset_info_t info;
  if (kp_dataset_info(d, &info) < 0) return NULL;
  switch ((intptr_t)which) {
  case 0: return PyLong_FromSize_t(info.count);
  case 1: return Py_BuildValue("(II)", info.rows, info.cols);
  default: return PyLong_FromUnsignedLong(info.classes);
  }
}

static int kp_layout_arg(const char *layout, kiln_nn_layout_t *out) {
  if (!strcmp(layout, "nchw")) *out = KILN_NN_NCHW;
  else if (!strcmp(layout, "flat")) *out = KILN_NN_FLAT;
  else {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "layout '%s': use 'nchw' ([N, 1, rows, cols]) or 'flat' ([N, rows * cols])",
                 layout);
    return -1;
  }
  return 0;
}

static PyObject *kp_dataset_upload(kp_dataset_t *d, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"device", "layout", NULL};
  PyObject *device_arg = Py_None;
  const char *layout = "nchw";
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Os:upload", names, &device_arg, &layout)) return NULL;
  kiln_device_t *device;
  kiln_nn_layout_t l;
  if (kp_device_arg(device_arg, &device) < 0 || kp_layout_arg(layout, &l) < 0) return NULL;
  kiln_tensor_t *images = NULL, *labels = NULL;
  kiln_status_t status;
  KP_NOGIL(status = kiln_nn_dataset_upload(d->dataset, device, l, &images, &labels));
  if (status != KILN_OK) return kp_raise(status);
  PyObject *a = kp_tensor_wrap(images), *b = kp_tensor_wrap(labels);
  if (!a || !b) {
    Py_XDECREF(a);
    Py_XDECREF(b);
    return NULL;
  }
  return Py_BuildValue("(NN)", a, b);
}

/* The bytes as read, copied into new NumPy arrays: pixels uint8 [N, rows, cols], labels uint8 [N]. */
static PyObject *kp_dataset_arrays(kp_dataset_t *d, PyObject *unused) {
  kiln_nn_dataset_info_t info;
  if (kp_dataset_info(d, &info) < 0) return NULL;
  PyObject *np = kp_numpy();
  if (!np) return NULL;
  Py_ssize_t image = (Py_ssize_t)info.rows * info.cols;
  PyObject *pix = PyBytes_FromStringAndSize((const char *)kiln_nn_dataset_pixels(d->dataset),
                                            (Py_ssize_t)info.count * image);
  PyObject *lab = PyBytes_FromStringAndSize((const char *)kiln_nn_dataset_labels(d->dataset), (Py_ssize_t)info.count);
  PyObject *a = pix ? PyObject_CallMethod(np, "frombuffer", "Os", pix, "uint8") : NULL;
  PyObject *b = lab ? PyObject_CallMethod(np, "frombuffer", "Os", lab, "uint8") : NULL;
  Py_XDECREF(pix);
  Py_XDECREF(lab);
  PyObject *a3 = a ? PyObject_CallMethod(a, "reshape", "(nII)", (Py_ssize_t)info.count, info.rows, info.cols) : NULL;
  Py_XDECREF(a);
  if (!a3 || !b) {
    Py_XDECREF(a3);
    Py_XDECREF(b);
    return NULL;
  }
  return Py_BuildValue("(NN)", a3, b);
}

static PyObject *kp_dataset_repr(kp_dataset_t *d) {
  kiln_nn_dataset_info_t info;
  if (kp_dataset_info(d, &info) < 0) return NULL;
  return PyUnicode_FromFormat("kiln.nn.Dataset(%zu images of %ux%u, %u classes)", info.count, info.rows, info.cols,
                              info.classes);
}

static PyMethodDef kp_dataset_methods[] = {
    {"upload", (PyCFunction)(void (*)(void))kp_dataset_upload, METH_VARARGS | METH_KEYWORDS,
     "upload(device=None, layout='nchw')\n--\n\nThe whole set on a device: (images float32 scaled to [0, 1], labels "
     "int32). layout 'nchw' gives [N, 1, rows, cols], 'flat' [N, rows * cols]. Blocks until the data arrived."},
    {"arrays", (PyCFunction)kp_dataset_arrays, METH_NOARGS,
     "arrays()\n--\n\n(pixels uint8 [N, rows, cols], labels uint8 [N]) as NumPy arrays (copies)."},
    {"from_arrays", (PyCFunction)(void (*)(void))kp_dataset_from_arrays, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "from_arrays(pixels, labels, classes)\n--\n\nA data set from uint8 arrays [N, rows, cols] and [N] (copied)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kp_dataset_getset[] = {
    {"count", (getter)kp_dataset_get_info, NULL, "the number of images", (void *)0},
    {"image_shape", (getter)kp_dataset_get_info, NULL, "(rows, cols)", (void *)1},
    {"classes", (getter)kp_dataset_get_info, NULL, "labels lie in [0, classes)", (void *)2},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods kp_dataset_sequence = {.sq_length = kp_dataset_len};

PyTypeObject kp_dataset_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn.Dataset",
    .tp_basicsize = sizeof(kp_dataset_t),
    .tp_dealloc = (destructor)kp_dataset_dealloc,
    .tp_repr = (reprfunc)kp_dataset_repr,
    .tp_as_sequence = &kp_dataset_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Images of one channel (8-bit pixels) and an integer label each, in host memory. "
              "kiln.nn.FashionMNIST('train') reads Debian's Fashion-MNIST.",
    .tp_methods = kp_dataset_methods,
    .tp_getset = kp_dataset_getset,
};

/* ---- Loader -------------------------------------------------------------------------------- */

static void kp_loader_dealloc(kp_loader_t *l) {
  if (l->loader) {
    kiln_nn_loader_t *loader = l->loader;
    KP_NOGIL(kiln_nn_loader_free(loader)); /* waits for its uploads */
  }
  Py_XDECREF(l->dataset);
  PyObject_Free(l);
}

static PyObject *kp_loader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"dataset", "device", "batch_size", "shuffle", "seed", "drop_last", "prefetch", "layout", NULL};
  kiln_nn_loader_options_t o;
  kiln_nn_loader_options_initialize(&o);
  PyObject *dataset, *device_arg = Py_None;
  Py_ssize_t batch = (Py_ssize_t)o.batch_size;
  int shuffle = o.shuffle, drop_last = o.drop_last, prefetch = o.prefetch;
  unsigned long long seed = o.seed;
  const char *layout = "nchw";
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|O$npKpps:Loader", names, &kp_dataset_type, &dataset, &device_arg,
                                   &batch, &shuffle, &seed, &drop_last, &prefetch, &layout))
    return NULL;
  kiln_device_t *device;
  if (kp_device_arg(device_arg, &device) < 0 || kp_layout_arg(layout, &o.layout) < 0) return NULL;
  if (batch < 1) return kp_raise_msg(KILN_INVALID_ARGUMENT, "Loader: batch_size %zd must be at least 1", batch);
  o.batch_size = (size_t)batch;
  o.shuffle = shuffle != 0;
  o.seed = seed;
  o.drop_last = drop_last != 0;
  o.prefetch = prefetch != 0;
  kiln_nn_loader_t *loader = NULL;
  kiln_status_t status = kiln_nn_loader_create(((kp_dataset_t *)dataset)->dataset, device, &o, &loader);
  if (status != KILN_OK) return kp_raise(status);
  kp_loader_t *l = PyObject_New(kp_loader_t, type);
  if (!l) {
    kiln_nn_loader_free(loader);
    return NULL;
  }
  l->loader = loader;
  l->dataset = Py_NewRef(dataset);
  l->last_epoch = 0;
  l->last_index = 0;
  l->guard = (kp_guard_t){0};
  return (PyObject *)l;
}

static PyObject *kp_loader_iter(PyObject *self) { return Py_NewRef(self); }

/* The next batch as (images, labels); StopIteration at the end of an epoch
 * (the next iteration starts the next epoch). */
static PyObject *kp_loader_next(kp_loader_t *l) {
  kiln_nn_batch_t batch;
  kiln_status_t status;
  kp_guard_t *guards[1];
  PyObject *self = (PyObject *)l;
  int held = kp_guard_enter(&self, 1, "iteration (next batch)", guards);
  if (held < 0) return NULL;
  KP_NOGIL(status = kiln_nn_loader_next(l->loader, &batch));
  kp_guard_leave(guards, held);
  if (status != KILN_OK) return kp_raise(status);
  if (batch.count == 0) return NULL; /* StopIteration */
  l->last_epoch = batch.epoch;
  l->last_index = batch.index;
  PyObject *images = kp_tensor_wrap(kiln_tensor_retain(batch.images));
  PyObject *labels = images ? kp_tensor_wrap(kiln_tensor_retain(batch.labels)) : NULL;
  if (!labels) {
    Py_XDECREF(images);
    return NULL;
  }
  return Py_BuildValue("(NN)", images, labels);
}

static Py_ssize_t kp_loader_len(PyObject *o) {
  return (Py_ssize_t)kiln_nn_loader_batch_count(((kp_loader_t *)o)->loader);
}

static PyObject *kp_loader_reset(kp_loader_t *l, PyObject *arg) {
  unsigned long long epoch = PyLong_AsUnsignedLongLong(arg);
  if (epoch == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  kiln_status_t status;
  kp_guard_t *guards[1];
  PyObject *self = (PyObject *)l;
  int held = kp_guard_enter(&self, 1, "Loader.reset", guards);
  if (held < 0) return NULL;
  KP_NOGIL(status = kiln_nn_loader_reset(l->loader, epoch));
  kp_guard_leave(guards, held);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_loader_get(kp_loader_t *l, void *which) {
  return PyLong_FromUnsignedLongLong(which ? (unsigned long long)l->last_index : l->last_epoch);
}

static PyMethodDef kp_loader_methods[] = {
    {"reset", (PyCFunction)kp_loader_reset, METH_O,
     "reset(epoch)\n--\n\nStart again at the beginning of `epoch` (each epoch's order depends on (seed, epoch) alone)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kp_loader_getset[] = {
    {"epoch", (getter)kp_loader_get, NULL, "the epoch of the last batch handed out", NULL},
    {"index", (getter)kp_loader_get, NULL, "the index of the last batch in its epoch", (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods kp_loader_sequence = {.sq_length = kp_loader_len};

PyTypeObject kp_loader_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.nn.Loader",
    .tp_basicsize = sizeof(kp_loader_t),
    .tp_dealloc = (destructor)kp_loader_dealloc,
    .tp_as_sequence = &kp_loader_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Loader(dataset, device=None, *, batch_size=100, shuffle=True, seed=0, drop_last=False, prefetch=True, "
              "layout='nchw')\n--\n\nBatches of a data set on one device. `for images, labels in loader:` runs one "
              "epoch (the next loop the next epoch); with prefetch the next batch is uploaded while the current step "
              "runs. The batch tensors belong to the loader and are refilled by a later batch: .copy() what must "
              "outlive the step.",
    .tp_iter = kp_loader_iter,
    .tp_iternext = (iternextfunc)kp_loader_next,
    .tp_methods = kp_loader_methods,
    .tp_getset = kp_loader_getset,
    .tp_new = kp_loader_new,
};

/* ---- safetensors ---------------------------------------------------------------------------- */

/* The UTF-8 of a str that C takes as a NUL-terminated string: a NUL inside
 * would cut it there (a name "a\0b" saved as "a"), so it is refused with a
 * ValueError naming the string. NULL with an exception otherwise. */
static const char *kp_c_string(PyObject *str, const char *call, const char *what) {
  Py_ssize_t size;
  const char *utf8 = PyUnicode_AsUTF8AndSize(str, &size);
  if (!utf8) return NULL;
  if (strlen(utf8) != (size_t)size) {
    kp_raise_msg(KILN_INVALID_ARGUMENT, "%s: the %s %R holds a NUL character, which a safetensors file cannot keep; "
                 "remove it", call, what, str);
    return NULL;
  }
  return utf8;
}

static PyObject *kp_save_safetensors(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"path", "tensors", "metadata", NULL};
  PyObject *path = NULL, *tensors, *metadata = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O!|O:save_safetensors", names, PyUnicode_FSConverter, &path,
                                   &PyDict_Type, &tensors, &metadata))
    return NULL;
  Py_ssize_t n = PyDict_GET_SIZE(tensors), m = 0;
  if (metadata != Py_None) {
    if (!PyDict_Check(metadata)) {
      Py_DECREF(path);
      return PyErr_Format(PyExc_TypeError, "save_safetensors: metadata must be a dict of str to str");
    }
    m = PyDict_GET_SIZE(metadata);
  }
  kiln_nn_named_tensor_t *named = PyMem_Calloc((size_t)n + 1, sizeof *named);
  kiln_nn_metadata_t *meta = PyMem_Calloc((size_t)m + 1, sizeof *meta);
  PyObject *result = NULL;
  if (!named || !meta) {
    PyErr_NoMemory();
    goto done;
  }
  Py_ssize_t pos = 0, i = 0;
  PyObject *key, *value;
  while (PyDict_Next(tensors, &pos, &key, &value)) {
    if (!PyUnicode_Check(key)) {
      PyErr_Format(PyExc_TypeError, "save_safetensors: tensor names must be str");
      goto done;
    }
    named[i].name = kp_c_string(key, "save_safetensors", "tensor name");
    if (!named[i].name) goto done;
    named[i].tensor = kp_tensor_arg(value, "every value of tensors");
    if (!named[i].name || !named[i].tensor) goto done;
    i++;
  }
  pos = 0;
  i = 0;
  while (m && PyDict_Next(metadata, &pos, &key, &value)) {
    if (!PyUnicode_Check(key) || !PyUnicode_Check(value)) {
      PyErr_Format(PyExc_TypeError, "save_safetensors: metadata must map str to str");
      goto done;
    }
    meta[i].key = kp_c_string(key, "save_safetensors", "metadata key");
    meta[i].value = meta[i].key ? kp_c_string(value, "save_safetensors", "metadata value") : NULL;
    if (!meta[i].key || !meta[i].value) goto done;
    i++;
  }
  kiln_status_t status;
  const char *p = PyBytes_AS_STRING(path);
  KP_NOGIL(status = kiln_nn_safetensors_save(p, named, (size_t)n, meta, (size_t)m));
  if (status != KILN_OK) kp_raise(status);
  else result = Py_NewRef(Py_None);
done:
  PyMem_Free(named);
  PyMem_Free(meta);
  Py_DECREF(path);
  return result;
}

static PyObject *kp_load_safetensors(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"source", "device", "metadata", NULL};
  PyObject *source, *device_arg = Py_None;
  int with_metadata = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$p:load_safetensors", names, &source, &device_arg, &with_metadata))
    return NULL;
  kiln_device_t *device;
  if (kp_device_arg(device_arg, &device) < 0) return NULL;
  kiln_nn_safetensors_t *file = NULL;
  kiln_status_t status;
  if (PyBytes_Check(source) || PyByteArray_Check(source) || PyMemoryView_Check(source)) {
    Py_buffer view;
    if (PyObject_GetBuffer(source, &view, PyBUF_SIMPLE) < 0) return NULL;
    KP_NOGIL(status = kiln_nn_safetensors_load_memory(view.buf, (size_t)view.len, device, &file));
    PyBuffer_Release(&view);
  } else {
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(source, &path)) return NULL;
    const char *p = PyBytes_AS_STRING(path);
    KP_NOGIL(status = kiln_nn_safetensors_load(p, device, &file));
    Py_DECREF(path);
  }
  if (status != KILN_OK) return kp_raise(status);
  PyObject *dict = PyDict_New(), *meta = with_metadata ? PyDict_New() : NULL;
  size_t n = kiln_nn_safetensors_count(file);
  for (size_t i = 0; dict && i < n; i++) {
    PyObject *t = kp_tensor_wrap(kiln_tensor_retain(kiln_nn_safetensors_tensor(file, i)));
    if (!t || PyDict_SetItemString(dict, kiln_nn_safetensors_name(file, i), t) < 0) Py_CLEAR(dict);
    Py_XDECREF(t);
  }
  size_t mc = kiln_nn_safetensors_metadata_count(file);
  for (size_t i = 0; meta && i < mc; i++) {
    const char *k, *v;
    if (kiln_nn_safetensors_metadata(file, i, &k, &v) != KILN_OK) continue;
    PyObject *value = PyUnicode_FromString(v);
    if (!value || PyDict_SetItemString(meta, k, value) < 0) Py_CLEAR(meta);
    Py_XDECREF(value);
  }
  kiln_nn_safetensors_free(file);
  if (!with_metadata) return dict;
  if (!dict || !meta) {
    Py_XDECREF(dict);
    Py_XDECREF(meta);
    return NULL;
  }
  return Py_BuildValue("(NN)", dict, meta);
}

static PyObject *kp_load_safetensors_into(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"path", "tensors", "strict", NULL};
  PyObject *path = NULL, *tensors;
  int strict = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O!|p:load_safetensors_into", names, PyUnicode_FSConverter, &path,
                                   &PyDict_Type, &tensors, &strict))
    return NULL;
  Py_ssize_t n = PyDict_GET_SIZE(tensors), pos = 0, i = 0;
  kiln_nn_named_tensor_t *named = PyMem_Calloc((size_t)n + 1, sizeof *named);
  PyObject *key, *value, *result = NULL;
  if (!named) {
    PyErr_NoMemory();
    goto done;
  }
  while (PyDict_Next(tensors, &pos, &key, &value)) {
    named[i].name = PyUnicode_Check(key) ? kp_c_string(key, "load_safetensors_into", "tensor name") : NULL;
    if (!named[i].name) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "load_safetensors_into: tensor names must be str");
      goto done;
    }
    if (!(named[i].tensor = kp_tensor_arg(value, "every value of tensors"))) goto done;
    i++;
  }
  kiln_status_t status;
  const char *p = PyBytes_AS_STRING(path);
  KP_NOGIL(status = kiln_nn_safetensors_load_into(p, named, (size_t)n, strict != 0));
  if (status != KILN_OK) kp_raise(status);
  else result = Py_NewRef(Py_None);
done:
  PyMem_Free(named);
  Py_DECREF(path);
  return result;
}

/* ---- small functions ---------------------------------------------------------------------------- */

static PyObject *kp_label_name(PyObject *self, PyObject *arg) {
  int32_t label;
  if (kp_int32_arg(arg, "label", &label) < 0) return NULL;
  const char *name = kiln_nn_fashion_mnist_label_name(label);
  if (!name) return kp_raise_msg(KILN_INVALID_ARGUMENT, "Fashion-MNIST has labels 0 to 9, not %d", (int)label);
  return PyUnicode_FromString(name);
}

static PyObject *kp_shuffle_order(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"seed", "epoch", "count", "shuffle", NULL};
  unsigned long long seed, epoch;
  Py_ssize_t count;
  int shuffle = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKn|p:shuffle_order", names, &seed, &epoch, &count, &shuffle))
    return NULL;
  if (count < 0) return kp_raise_msg(KILN_INVALID_ARGUMENT, "shuffle_order: count %zd is negative", count);
  size_t *order = PyMem_Malloc(((size_t)count + 1) * sizeof *order);
  if (!order) return PyErr_NoMemory();
  kiln_status_t status = kiln_nn_shuffle_order(seed, epoch, shuffle != 0, (size_t)count, order);
  if (status != KILN_OK) {
    PyMem_Free(order);
    return kp_raise(status);
  }
  PyObject *list = PyList_New(count);
  for (Py_ssize_t i = 0; list && i < count; i++) {
    PyObject *v = PyLong_FromSize_t(order[i]);
    if (!v) Py_CLEAR(list);
    else PyList_SET_ITEM(list, i, v);
  }
  PyMem_Free(order);
  return list;
}

PyMethodDef kp_nn_data_functions[] = {
    {"FashionMNIST", (PyCFunction)(void (*)(void))kp_fashion_mnist, METH_VARARGS | METH_KEYWORDS,
     "FashionMNIST(split='train', dir=None)\n--\n\nOne split ('train': 60,000 images, 'test': 10,000) of "
     "Fashion-MNIST, read from Debian's dataset-fashion-mnist (or $KILN_DATA_DIR/fashion-mnist, or `dir`). Blocks "
     "while it reads (about 0.3 s for the training split)."},
    {"load_idx", (PyCFunction)(void (*)(void))kp_load_idx, METH_VARARGS | METH_KEYWORDS,
     "load_idx(images, labels, classes)\n--\n\nA data set from any pair of IDX files (gzipped or not)."},
    {"save_safetensors", (PyCFunction)(void (*)(void))kp_save_safetensors, METH_VARARGS | METH_KEYWORDS,
     "save_safetensors(path, tensors, metadata=None)\n--\n\nWrite {name: tensor} (and {str: str} metadata) as a "
     "safetensors file that safetensors.torch.load_file opens. Blocks."},
    {"load_safetensors", (PyCFunction)(void (*)(void))kp_load_safetensors, METH_VARARGS | METH_KEYWORDS,
     "load_safetensors(source, device=None, *, metadata=False)\n--\n\nEvery tensor of a safetensors file (a path, "
     "or the file's bytes) as {name: tensor} on a device, in the file's order; with metadata=True, "
     "(tensors, metadata). Blocks."},
    {"load_safetensors_into", (PyCFunction)(void (*)(void))kp_load_safetensors_into, METH_VARARGS | METH_KEYWORDS,
     "load_safetensors_into(path, tensors, strict=True)\n--\n\nRead a file's tensors into existing tensors by name "
     "(same dtype and shape, checked first); strict refuses tensors of the file not asked for. Blocks."},
    {"fashion_mnist_label_name", kp_label_name, METH_O,
     "fashion_mnist_label_name(label)\n--\n\n'T-shirt/top', 'Trouser', ... 'Ankle boot'."},
    {"shuffle_order", (PyCFunction)(void (*)(void))kp_shuffle_order, METH_VARARGS | METH_KEYWORDS,
     "shuffle_order(seed, epoch, count, shuffle=True)\n--\n\nThe order of data set indices a loader with this seed "
     "uses in `epoch`."},
    {NULL, NULL, 0, NULL},
};
