/* python/src/dlpack.c: the DLPack protocol for kiln tensors: __dlpack__ / __dlpack_device__ (export) and kiln.from_dlpack (import), both forms, without copies. */
#include "kilnpy.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/dlpack.h>

/* Capsule names of the protocol: a producer hands out "dltensor" (DLPack
 * 0.x) or "dltensor_versioned" (1.x); the consumer renames it "used_..." so
 * the capsule's destructor leaves the tensor alone. */
static const char kp_name_legacy[] = "dltensor";
static const char kp_name_versioned[] = "dltensor_versioned";
static const char kp_name_legacy_used[] = "used_dltensor";
static const char kp_name_versioned_used[] = "used_dltensor_versioned";

static PyObject *kp_str_dlpack, *kp_str_max_version, *kp_kwnames_max_version, *kp_max_version_1_0;

/* ---- export ---------------------------------------------------------------------------- */

/* What an exported capsule holds: kiln's managed tensor behind one of ours,
 * so that the tensor is handed back exactly once whatever the consumer does.
 * The protocol says a consumer renames the capsule "used_..." and calls the
 * deleter when done, and the capsule's destructor calls it for a capsule
 * nobody took. Some consumers call the deleter and leave the name (PyTorch
 * does when its import fails: an OpenCL tensor): the destructor must not call
 * it again, nor read the wrapper after it was freed. So the wrapper lives
 * until both sides let go, whichever is last (state, atomically: the deleter
 * ran, the capsule is gone), and a second call of the deleter while the
 * capsule lives does nothing. */
enum { KP_EXPORT_DELETED = 1u, KP_EXPORT_CAPSULE_GONE = 2u };

typedef struct kp_export_t {
  union {
    DLManagedTensor legacy;
    DLManagedTensorVersioned versioned;
  } m; /* first: the capsule's pointer is the wrapper's */
  DLManagedTensor *inner_legacy;
  DLManagedTensorVersioned *inner_versioned;
  atomic_uint state;
} kp_export_t;

static void kp_export_deleter(kp_export_t *e) {
  unsigned prev = atomic_fetch_or(&e->state, KP_EXPORT_DELETED);
  if (prev & KP_EXPORT_DELETED) return; /* called twice: the tensor went back the first time */
  if (e->inner_legacy) e->inner_legacy->deleter(e->inner_legacy);
  if (e->inner_versioned) e->inner_versioned->deleter(e->inner_versioned);
  if (prev & KP_EXPORT_CAPSULE_GONE) free(e);
}

static void kp_export_deleter_legacy(DLManagedTensor *self) {
  if (self) kp_export_deleter(self->manager_ctx);
}
static void kp_export_deleter_versioned(DLManagedTensorVersioned *self) {
  if (self) kp_export_deleter(self->manager_ctx);
}

static void kp_capsule_destructor(PyObject *capsule) {
  /* Called by the capsule's dealloc, perhaps with an exception pending. */
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  const char *name = PyCapsule_GetName(capsule);
  kp_export_t *e = PyCapsule_GetPointer(capsule, name);
  PyErr_Clear();
  if (e) {
    bool consumed = name && (!strcmp(name, kp_name_legacy_used) || !strcmp(name, kp_name_versioned_used));
    unsigned prev = atomic_fetch_or(&e->state, KP_EXPORT_CAPSULE_GONE);
    if (prev & KP_EXPORT_DELETED) free(e); /* the consumer handed it back already */
    else if (!consumed) kp_export_deleter(e); /* nobody took it: hand it back now (frees e) */
    /* else the consumer owns it; its deleter call frees e. */
  }
  PyErr_Restore(type, value, tb);
}

static kp_export_t *kp_export_alloc(void) {
  kp_export_t *e = calloc(1, sizeof *e);
  if (e) atomic_init(&e->state, 0u);
  return e;
}

static PyObject *kp_buffer_error(kiln_status_t status) {
  /* The protocol's consumers expect BufferError; kiln's error is its cause. */
  kp_raise(status);
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject *msg = value ? PyObject_Str(value) : NULL;
  PyErr_SetObject(PyExc_BufferError, msg ? msg : Py_None);
  Py_XDECREF(msg);
  PyObject *t2, *v2, *tb2;
  PyErr_Fetch(&t2, &v2, &tb2);
  PyErr_NormalizeException(&t2, &v2, &tb2);
  if (v2 && value) PyException_SetCause(v2, Py_NewRef(value));
  PyErr_Restore(t2, v2, tb2);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return NULL;
}

static int kp_version_arg(PyObject *arg, bool *out_versioned) {
  *out_versioned = false;
  if (!arg || arg == Py_None) return 0;
  if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 2) {
    PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple or None");
    return -1;
  }
  long major = PyLong_AsLong(PyTuple_GET_ITEM(arg, 0));
  if (major == -1 && PyErr_Occurred()) return -1;
  *out_versioned = major >= 1;
  return 0;
}

PyObject *kp_tensor_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *stream = NULL, *max_version = NULL, *dl_device = NULL, *copy = NULL;
  if (nargs > 1) return PyErr_Format(PyExc_TypeError, "__dlpack__ takes keyword arguments (stream, max_version, dl_device, copy)");
  if (nargs == 1) stream = args[0];
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
    if (PyUnicode_CompareWithASCIIString(key, "stream") == 0) stream = value;
    else if (PyUnicode_CompareWithASCIIString(key, "max_version") == 0) max_version = value;
    else if (PyUnicode_CompareWithASCIIString(key, "dl_device") == 0) dl_device = value;
    else if (PyUnicode_CompareWithASCIIString(key, "copy") == 0) copy = value;
    else return PyErr_Format(PyExc_TypeError, "__dlpack__() got an unexpected keyword argument '%U'", key);
  }
  (void)stream; /* the export waits for the tensor's work, so any consumer stream may use it at once */
  bool versioned;
  if (kp_version_arg(max_version, &versioned) < 0) return NULL;
  kiln_tensor_t *t = KP_TENSOR(self), *held = NULL;
  bool copied = false;
  if (dl_device && dl_device != Py_None) {
    kiln_device_t *device = kiln_tensor_device(t);
    PyObject *obj = kp_device_object(device);
    if (!obj) return NULL;
    PyObject *mine = ((kp_device_t *)obj)->dlpack;
    int same = mine ? PyObject_RichCompareBool(mine, dl_device, Py_EQ) : 0;
    Py_DECREF(obj);
    if (same < 0) return NULL;
    if (!same) {
      long type = PyTuple_Check(dl_device) && PyTuple_GET_SIZE(dl_device) == 2 ? PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 0)) : -1;
      if (type == -1 && PyErr_Occurred()) return NULL;
      if (copy == Py_False || type != kDLCPU)
        return PyErr_Format(PyExc_BufferError, "__dlpack__: the tensor lives on %s; dl_device %R would need a copy%s",
                            kiln_device_name(device), dl_device,
                            copy == Py_False ? " and copy=False forbids it" : " kiln makes to the CPU only");
      kiln_device_t *cpu;
      kiln_status_t status = kiln_device_find("cpu", &cpu);
      if (status == KILN_OK) status = kiln_tensor_copy(t, cpu, &held);
      if (status != KILN_OK) return kp_buffer_error(status);
      t = held;
      copied = true;
    }
  }
  if (copy == Py_True && !copied) {
    kiln_status_t status = kiln_tensor_copy(t, kiln_tensor_device(t), &held);
    if (status != KILN_OK) return kp_buffer_error(status);
    t = held;
    copied = true;
  }
  /* The export waits for the work enqueued on the tensor's device, so it
   * runs without the GIL; except for a tensor that came in through DLPack
   * and was not copied here, whose memory kiln's queues have normally not
   * touched: there the wait is nothing and dropping the GIL would be most of
   * the call's cost (a round trip NumPy -> kiln -> NumPy stays under a
   * microsecond). Holding it is safe: kiln's threads never need it. */
  bool quick = ((kp_tensor_t *)self)->imported && !held;
  kp_export_t *e = kp_export_alloc();
  if (!e) {
    kiln_tensor_release(held);
    return PyErr_NoMemory();
  }
  kiln_status_t status;
  if (versioned) {
    DLManagedTensorVersioned *m = NULL;
    if (quick) status = kiln_tensor_to_dlpack_versioned(t, &m);
    else KP_NOGIL(status = kiln_tensor_to_dlpack_versioned(t, &m));
    if (status == KILN_OK) {
      e->inner_versioned = m;
      e->m.versioned.version = m->version;
      e->m.versioned.flags = m->flags | (copied ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
      e->m.versioned.dl_tensor = m->dl_tensor;
      e->m.versioned.manager_ctx = e;
      e->m.versioned.deleter = kp_export_deleter_versioned;
    }
  } else {
    DLManagedTensor *m = NULL;
    if (quick) status = kiln_tensor_to_dlpack(t, &m);
    else KP_NOGIL(status = kiln_tensor_to_dlpack(t, &m));
    if (status == KILN_OK) {
      e->inner_legacy = m;
      e->m.legacy.dl_tensor = m->dl_tensor;
      e->m.legacy.manager_ctx = e;
      e->m.legacy.deleter = kp_export_deleter_legacy;
    }
  }
  kiln_tensor_release(held);
  if (status != KILN_OK) {
    free(e);
    return kp_buffer_error(status);
  }
  PyObject *capsule = PyCapsule_New(e, versioned ? kp_name_versioned : kp_name_legacy, kp_capsule_destructor);
  if (!capsule) {
    atomic_store(&e->state, KP_EXPORT_CAPSULE_GONE);
    kp_export_deleter(e);
  }
  return capsule;
}

PyObject *kp_tensor_dlpack_device(PyObject *self, PyObject *unused) {
  PyObject *obj = kp_device_object(kiln_tensor_device(KP_TENSOR(self)));
  if (!obj) return NULL;
  PyObject *dl = ((kp_device_t *)obj)->dlpack;
  if (dl) {
    Py_INCREF(dl);
    Py_DECREF(obj);
    return dl;
  }
  Py_DECREF(obj);
  DLDevice d;
  kiln_status_t status = kiln_device_dlpack(kiln_tensor_device(KP_TENSOR(self)), &d);
  if (status != KILN_OK) return kp_buffer_error(status);
  return Py_BuildValue("(ii)", (int)d.device_type, d.device_id);
}

/* ---- import ------------------------------------------------------------------------------
 * kiln calls the deleter of what it imported once no tensor views it any
 * more. A producer's deleter may touch Python objects (NumPy's drops a
 * reference to the array), so kiln gets a wrapper whose deleter takes the
 * GIL around the producer's. */

typedef struct kp_import_t {
  union {
    DLManagedTensor legacy;
    DLManagedTensorVersioned versioned;
  } m;
  DLManagedTensor *inner_legacy;
  DLManagedTensorVersioned *inner_versioned;
} kp_import_t;

static int kp_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

/* Wrappers are recycled (under the GIL): an import costs no allocation of ours. */
#define KP_IMPORT_FREE_MAX 64
static kp_import_t *kp_import_free_list[KP_IMPORT_FREE_MAX];
static int kp_import_free_count;

static kp_import_t *kp_import_alloc(void) {
  kp_import_t *w = kp_import_free_count ? kp_import_free_list[--kp_import_free_count] : malloc(sizeof *w);
  if (w) memset(w, 0, sizeof *w);
  return w;
}

static void kp_import_recycle(kp_import_t *w) {
  if (kp_import_free_count < KP_IMPORT_FREE_MAX) kp_import_free_list[kp_import_free_count++] = w;
  else free(w);
}

static void kp_import_release(kp_import_t *w) {
  if (!Py_IsInitialized() || (kp_finalizing() && !PyGILState_Check())) {
    /* Python is gone: the producer's memory goes with the process. */
    free(w);
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  if (w->inner_legacy && w->inner_legacy->deleter) w->inner_legacy->deleter(w->inner_legacy);
  if (w->inner_versioned && w->inner_versioned->deleter) w->inner_versioned->deleter(w->inner_versioned);
  kp_import_recycle(w);
  PyGILState_Release(gil);
}

static void kp_import_deleter_legacy(DLManagedTensor *self) { kp_import_release(self->manager_ctx); }
static void kp_import_deleter_versioned(DLManagedTensorVersioned *self) { kp_import_release(self->manager_ctx); }

/* Import the capsule's tensor; renames the capsule once kiln owns it. */
static PyObject *kp_consume_capsule(PyObject *capsule) {
  const char *name = PyCapsule_GetName(capsule);
  if (!name && PyErr_Occurred()) return NULL;
  bool versioned;
  if (name && !strcmp(name, kp_name_versioned)) versioned = true;
  else if (name && !strcmp(name, kp_name_legacy)) versioned = false;
  else if (name && (!strcmp(name, kp_name_legacy_used) || !strcmp(name, kp_name_versioned_used)))
    return PyErr_Format(PyExc_ValueError, "from_dlpack: this DLPack capsule was consumed already (a capsule gives its "
                        "tensor to one consumer only)");
  else
    return PyErr_Format(PyExc_TypeError, "from_dlpack: a capsule named '%s' is not a DLPack tensor ('dltensor' or "
                        "'dltensor_versioned')", name ? name : "(null)");
  void *p = PyCapsule_GetPointer(capsule, name);
  if (!p) return NULL;
  kp_import_t *w = kp_import_alloc();
  if (!w) return PyErr_NoMemory();
  kiln_tensor_t *t = NULL;
  kiln_status_t status;
  if (versioned) {
    DLManagedTensorVersioned *inner = p;
    w->inner_versioned = inner;
    w->m.versioned.version = inner->version;
    w->m.versioned.flags = inner->flags;
    w->m.versioned.dl_tensor = inner->dl_tensor;
    w->m.versioned.manager_ctx = w;
    w->m.versioned.deleter = kp_import_deleter_versioned;
    status = kiln_tensor_from_dlpack_versioned(&w->m.versioned, &t);
  } else {
    DLManagedTensor *inner = p;
    w->inner_legacy = inner;
    w->m.legacy.dl_tensor = inner->dl_tensor;
    w->m.legacy.manager_ctx = w;
    w->m.legacy.deleter = kp_import_deleter_legacy;
    status = kiln_tensor_from_dlpack(&w->m.legacy, &t);
  }
  if (status != KILN_OK) {
    /* The capsule keeps the tensor; its destructor hands it back. */
    kp_import_recycle(w);
    return kp_raise(status);
  }
  if (PyCapsule_SetName(capsule, versioned ? kp_name_versioned_used : kp_name_legacy_used) < 0) {
    kiln_tensor_release(t);
    return NULL;
  }
  PyObject *result = kp_tensor_wrap(t);
  if (result) ((kp_tensor_t *)result)->imported = true;
  return result;
}

/* Which producer types take max_version (DLPack 1.x, NumPy 2, PyTorch 2) and
 * which do not (NumPy 1.x, PyTorch 1.x): learnt once per type, so that an
 * old producer costs one TypeError in the process, not one per call. The
 * type's __dlpack__ is kept too, so a call skips the attribute lookup. */
#define KP_PRODUCER_TYPES 16
typedef struct kp_producer_t {
  PyTypeObject *type;
  PyObject *method; /* type.__dlpack__, called with the object first */
  bool versioned;
} kp_producer_t;
static kp_producer_t kp_producers[KP_PRODUCER_TYPES];
static int kp_producer_count;

static const kp_producer_t *kp_producer_lookup(PyTypeObject *tp) {
  for (int i = 0; i < kp_producer_count; i++)
    if (kp_producers[i].type == tp) return &kp_producers[i];
  return NULL;
}

static void kp_producer_learn(PyTypeObject *tp, bool versioned) {
  if (kp_producer_count >= KP_PRODUCER_TYPES || kp_producer_lookup(tp)) return;
  /* Only a __dlpack__ the type itself defines (not one an instance sets). */
  PyObject *method = _PyType_Lookup(tp, kp_str_dlpack);
  if (!method) return;
  kp_producer_t *p = &kp_producers[kp_producer_count++];
  p->type = (PyTypeObject *)Py_NewRef((PyObject *)tp);
  p->method = Py_NewRef(method);
  p->versioned = versioned;
}

static PyObject *kp_call_dlpack(PyObject *x, bool with_version) {
  PyObject *args[2] = {x, kp_max_version_1_0};
  return PyObject_VectorcallMethod(kp_str_dlpack, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                   with_version ? kp_kwnames_max_version : NULL);
}

static PyObject *kp_capsule_of(PyObject *x) {
  PyTypeObject *tp = Py_TYPE(x);
  const kp_producer_t *known = kp_producer_lookup(tp);
  if (known) {
    PyObject *args[2] = {x, kp_max_version_1_0};
    return PyObject_Vectorcall(known->method, args, 1, known->versioned ? kp_kwnames_max_version : NULL);
  }
  PyObject *capsule = kp_call_dlpack(x, true);
  if (capsule) {
    kp_producer_learn(tp, true);
    return capsule;
  }
  if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
  /* An older producer: __dlpack__ has no max_version. */
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  capsule = kp_call_dlpack(x, false);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (!capsule) return NULL;
  kp_producer_learn(tp, false);
  return capsule;
}

static PyObject *kp_from_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  if (nargs != 1) return PyErr_Format(PyExc_TypeError, "from_dlpack(x, *, device=None, copy=None) takes one object");
  PyObject *x = args[0], *device_arg = NULL, *copy = NULL;
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_CompareWithASCIIString(key, "device") == 0) device_arg = args[nargs + i];
    else if (PyUnicode_CompareWithASCIIString(key, "copy") == 0) copy = args[nargs + i];
    else return PyErr_Format(PyExc_TypeError, "from_dlpack() got an unexpected keyword argument '%U'", key);
  }
  PyObject *result;
  if (KP_IS_TENSOR(x)) {
    result = kp_tensor_wrap(kiln_tensor_retain(KP_TENSOR(x)));
  } else if (PyCapsule_CheckExact(x)) {
    result = kp_consume_capsule(x);
  } else {
    PyObject *capsule = kp_capsule_of(x);
    if (!capsule) {
      if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError, "from_dlpack: a %.100s has no __dlpack__ method (kiln.tensor(x) copies "
                            "other data)", Py_TYPE(x)->tp_name);
      }
      return NULL;
    }
    if (!PyCapsule_CheckExact(capsule)) {
      Py_DECREF(capsule);
      return PyErr_Format(PyExc_TypeError, "from_dlpack: %.100s.__dlpack__ returned no capsule", Py_TYPE(x)->tp_name);
    }
    result = kp_consume_capsule(capsule);
    Py_DECREF(capsule);
  }
  if (!result) return NULL;
  if ((!device_arg || device_arg == Py_None) && copy != Py_True) return result;
  kiln_tensor_t *t = KP_TENSOR(result), *out = NULL;
  kiln_device_t *device = kiln_tensor_device(t);
  if (device_arg && device_arg != Py_None && kp_device_arg(device_arg, &device) < 0) {
    Py_DECREF(result);
    return NULL;
  }
  if (device == kiln_tensor_device(t) && copy != Py_True) return result;
  if (copy == Py_False) {
    PyObject *dev = kp_device_object(kiln_tensor_device(t));
    Py_DECREF(result);
    PyErr_Format(PyExc_BufferError, "from_dlpack: the data lives on %S; another device needs a copy, which copy=False "
                 "forbids", dev);
    Py_XDECREF(dev);
    return NULL;
  }
  kiln_status_t status = kiln_tensor_copy(t, device, &out);
  Py_DECREF(result);
  return kp_result(status, &out);
}

PyMethodDef kp_dlpack_methods[] = {
    {"from_dlpack", (PyCFunction)(void (*)(void))kp_from_dlpack, METH_FASTCALL | METH_KEYWORDS,
     "from_dlpack(x, *, device=None, copy=None)\n--\n\nA kiln tensor sharing the memory of `x`, any object with "
     "__dlpack__ (a NumPy array, a PyTorch or CuPy tensor) or a DLPack capsule, without a copy. Writes through "
     "either side are seen by the other. With `device` (another device) or copy=True it copies instead. A CUDA "
     "producer's pending work must be complete first (torch.cuda.synchronize())."},
    {NULL, NULL, 0, NULL},
};

int kp_dlpack_init(void) {
  kp_str_dlpack = PyUnicode_InternFromString("__dlpack__");
  kp_str_max_version = PyUnicode_InternFromString("max_version");
  kp_kwnames_max_version = kp_str_max_version ? PyTuple_Pack(1, kp_str_max_version) : NULL;
  kp_max_version_1_0 = Py_BuildValue("(II)", KILN_DLPACK_MAJOR, KILN_DLPACK_MINOR);
  return kp_str_dlpack && kp_kwnames_max_version && kp_max_version_1_0 ? 0 : -1;
}
