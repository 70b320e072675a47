/* python/src/module.c: the kiln._kiln module: its exceptions (kiln.Error and one subclass per status), settings, policy and start-up. */
#include "kilnpy.h"

#include <stdarg.h>
#include <stdio.h>

/* ---- exceptions ------------------------------------------------------------------------
 * kiln.Error derives from RuntimeError (as PyTorch's device errors do); each
 * status has a subclass that also derives from the built-in exception a
 * Python user would catch for it. Every instance carries .status (the kiln
 * code), .status_name ("DEVICE_MISMATCH") and kiln's message as its text. */

#define KP_STATUS_SLOTS 17
static PyObject *kp_error_base;
static PyObject *kp_errors[KP_STATUS_SLOTS];

typedef struct kp_error_spec_t {
  kiln_status_t status;
  const char *class_name; /* NULL: derived from the status name */
  PyObject **builtin;     /* a second base, or NULL */
} kp_error_spec_t;

static const kp_error_spec_t kp_error_specs[] = {
    {KILN_INVALID_ARGUMENT, NULL, &PyExc_ValueError},
    {KILN_OUT_OF_MEMORY, NULL, &PyExc_MemoryError},
    {KILN_DEVICE_MISMATCH, NULL, NULL},
    {KILN_SHAPE_MISMATCH, NULL, &PyExc_ValueError},
    {KILN_DTYPE_MISMATCH, "DtypeMismatchError", &PyExc_TypeError},
    {KILN_NOT_FOUND, NULL, &PyExc_LookupError},
    {KILN_UNAVAILABLE, NULL, NULL},
    {KILN_UNSUPPORTED, NULL, &PyExc_NotImplementedError},
    {KILN_ABI_MISMATCH, "AbiMismatchError", NULL},
    {KILN_BUILD_FAILED, NULL, NULL},
    {KILN_DEVICE_LOST, NULL, NULL},
    {KILN_OUT_OF_RESOURCES, NULL, NULL},
    {KILN_IO, "IOError", &PyExc_OSError},
    {KILN_NOT_READY, NULL, NULL},
    {KILN_INTERNAL, NULL, NULL},
    {KILN_INDEX_OUT_OF_RANGE, "IndexOutOfRangeError", &PyExc_IndexError},
};

/* "DEVICE_MISMATCH" -> "DeviceMismatchError". */
static void kp_class_name(const char *status_name, char *out, size_t size) {
  size_t n = 0;
  bool upper = true;
  for (const char *p = status_name; *p && n + 6 < size; p++) {
    if (*p == '_') {
      upper = true;
      continue;
    }
    out[n++] = upper ? *p : (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    upper = false;
  }
  snprintf(out + n, size - n, "Error");
}

static int kp_errors_init(PyObject *module) {
  PyObject *dict = Py_BuildValue("{s:O,s:s,s:s}", "status", Py_None, "status_name", "", "__module__", "kiln");
  if (!dict) return -1;
  kp_error_base = PyErr_NewExceptionWithDoc(
      "kiln.Error",
      "An error kiln returned. .status is kiln's status code (an int), .status_name its name "
      "(\"DEVICE_MISMATCH\"), and the text is kiln's message: what failed, the values involved, what to do.",
      PyExc_RuntimeError, dict);
  Py_DECREF(dict);
  if (!kp_error_base || PyModule_AddObjectRef(module, "Error", kp_error_base) < 0) return -1;
  for (size_t i = 0; i < sizeof kp_error_specs / sizeof kp_error_specs[0]; i++) {
    const kp_error_spec_t *s = &kp_error_specs[i];
    char short_name[64], qualified[80], doc[200];
    if (s->class_name) snprintf(short_name, sizeof short_name, "%s", s->class_name);
    else kp_class_name(kiln_status_name(s->status), short_name, sizeof short_name);
    snprintf(qualified, sizeof qualified, "kiln.%s", short_name);
    snprintf(doc, sizeof doc, "kiln status %s (%d): %s.", kiln_status_name(s->status), (int)s->status,
             kiln_status_describe(s->status));
    PyObject *bases = s->builtin ? PyTuple_Pack(2, kp_error_base, *s->builtin) : PyTuple_Pack(1, kp_error_base);
    PyObject *attrs = Py_BuildValue("{s:i,s:s,s:s}", "status", (int)s->status, "status_name",
                                    kiln_status_name(s->status), "__module__", "kiln");
    PyObject *cls = bases && attrs ? PyErr_NewExceptionWithDoc(qualified, doc, bases, attrs) : NULL;
    Py_XDECREF(bases);
    Py_XDECREF(attrs);
    if (!cls) return -1;
    kp_errors[s->status] = cls;
    if (PyModule_AddObjectRef(module, short_name, cls) < 0) return -1;
  }
  return 0;
}

PyObject *kp_error_class(kiln_status_t status) {
  if ((int)status > 0 && (int)status < KP_STATUS_SLOTS && kp_errors[status]) return kp_errors[status];
  return kp_error_base;
}

static PyObject *kp_raise_text(kiln_status_t status, PyObject *text) {
  if (!text) return NULL;
  PyObject *cls = kp_error_class(status);
  PyObject *exc = PyObject_CallOneArg(cls, text);
  Py_DECREF(text);
  if (!exc) return NULL;
  if (cls == kp_error_base) {
    /* A code outside the table: keep it on the instance. */
    PyObject *code = PyLong_FromLong((long)status);
    if (code) PyObject_SetAttrString(exc, "status", code);
    Py_XDECREF(code);
    PyErr_Clear();
  }
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

PyObject *kp_raise(kiln_status_t status) {
  const char *message = kiln_last_error();
  if (!message || !*message) message = kiln_status_describe(status);
  if (status == KILN_DEVICE_MISMATCH)
    /* kiln's message names the C call that fixes it; say the Python one too. */
    return kp_raise_text(status, PyUnicode_FromFormat("%s (from Python: b.to(a.device), or .to(device) on whichever "
                                                      "operand should move)", message));
  return kp_raise_text(status, PyUnicode_DecodeUTF8(message, (Py_ssize_t)strlen(message), "replace"));
}

PyObject *kp_raise_msg(kiln_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  PyObject *text = PyUnicode_FromFormatV(fmt, ap);
  va_end(ap);
  return kp_raise_text(status, text);
}

/* ---- settings ---------------------------------------------------------------------------- */

static PyObject *kp_initialize(PyObject *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"backend", "device", "policy", "provider", "cache_dir", "backend_path", "log",
                          "cpu_devices", NULL};
  kiln_config_t config;
  kiln_config_initialize(&config);
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$zzzzzzzi:initialize", names, &config.backend, &config.device,
                                   &config.policy, &config.provider, &config.cache_dir, &config.backend_path,
                                   &config.log, &config.cpu_devices))
    return NULL;
  kiln_status_t status;
  KP_NOGIL(status = kiln_initialize(&config));
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_policy(PyObject *self, PyObject *unused) {
  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_OK) return kp_raise(status);
  return PyUnicode_FromString(kiln_policy_name(kiln_policy()));
}

static PyObject *kp_set_policy(PyObject *self, PyObject *arg) {
  const char *name = PyUnicode_AsUTF8(arg);
  if (!name) return NULL;
  static const kiln_policy_t all[] = {KILN_POLICY_VENDOR, KILN_POLICY_PORTABLE, KILN_POLICY_FASTEST};
  for (size_t i = 0; i < 3; i++) {
    if (strcmp(name, kiln_policy_name(all[i])) != 0) continue;
    kiln_status_t status = kiln_set_policy(all[i]);
    if (status != KILN_OK) return kp_raise(status);
    Py_RETURN_NONE;
  }
  return kp_raise_msg(KILN_INVALID_ARGUMENT, "set_policy: unknown policy '%s'; use 'vendor', 'portable' or 'fastest'",
                      name);
}

static PyObject *kp_set_providers(PyObject *self, PyObject *arg) {
  const char *text = PyUnicode_AsUTF8(arg);
  if (!text) return NULL;
  kiln_status_t status = kiln_set_providers(text);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_last_provider(PyObject *self, PyObject *unused) {
  return PyUnicode_FromString(kiln_last_provider());
}

static PyObject *kp_op_names(PyObject *self, PyObject *unused) {
  PyObject *list = PyList_New(0);
  for (size_t i = 0; list && kiln_op_name(i); i++) {
    PyObject *s = PyUnicode_FromString(kiln_op_name(i));
    if (!s || PyList_Append(list, s) < 0) Py_CLEAR(list);
    Py_XDECREF(s);
  }
  return list;
}

static PyObject *kp_set_log_level(PyObject *self, PyObject *arg) {
  static const char *const levels[] = {"off", "error", "warn", "info", "debug"};
  const char *name = PyUnicode_AsUTF8(arg);
  if (!name) return NULL;
  for (int i = 0; i < 5; i++) {
    if (!strcmp(name, levels[i])) {
      kiln_log_set_level((kiln_log_level_t)i);
      Py_RETURN_NONE;
    }
  }
  return kp_raise_msg(KILN_INVALID_ARGUMENT, "set_log_level: unknown level '%s'; use off, error, warn, info or debug",
                      name);
}

static PyObject *kp_cache_dir(PyObject *self, PyObject *unused) {
  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_OK) return kp_raise(status);
  const char *dir = kiln_cache_dir();
  if (!dir) Py_RETURN_NONE;
  return PyUnicode_DecodeFSDefault(dir);
}

static PyObject *kp_trace_start(PyObject *self, PyObject *arg) {
  PyObject *bytes = NULL;
  if (!PyUnicode_FSConverter(arg, &bytes)) return NULL;
  kiln_status_t status = kiln_trace_start(PyBytes_AS_STRING(bytes));
  Py_DECREF(bytes);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_trace_stop(PyObject *self, PyObject *unused) {
  kiln_status_t status;
  /* Waits for the traced work and writes the file. */
  Py_BEGIN_ALLOW_THREADS
  status = kiln_trace_stop();
  Py_END_ALLOW_THREADS
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_trace_summary(PyObject *self, PyObject *unused) {
  size_t length = 0;
  kiln_status_t status = kiln_trace_summary(NULL, 0, &length);
  if (status != KILN_OK) return kp_raise(status);
  char *text = PyMem_Malloc(length + 1);
  if (!text) return PyErr_NoMemory();
  status = kiln_trace_summary(text, length + 1, &length);
  PyObject *result = status == KILN_OK ? PyUnicode_FromString(text) : kp_raise(status);
  PyMem_Free(text);
  return result;
}

static PyObject *kp_trace_clock_ns(PyObject *self, PyObject *unused) {
  return PyLong_FromLongLong((long long)kiln_trace_clock_ns());
}

/* _trace_span(category, name, start_ns, bytes, detail): kiln_trace_span. */
static PyObject *kp_trace_span(PyObject *self, PyObject *args) {
  const char *category = NULL, *name = NULL, *detail = NULL;
  long long start = 0;
  unsigned long long bytes = 0;
  if (!PyArg_ParseTuple(args, "ssLKz", &category, &name, &start, &bytes, &detail)) return NULL;
  kiln_status_t status = kiln_trace_span(category, name, (int64_t)start, (uint64_t)bytes, detail);
  if (status != KILN_OK) return kp_raise(status);
  Py_RETURN_NONE;
}

static PyObject *kp_clear_error(PyObject *self, PyObject *unused) {
  kiln_clear_error();
  Py_RETURN_NONE;
}

static PyMethodDef kp_module_methods[] = {
    {"initialize", (PyCFunction)(void (*)(void))kp_initialize, METH_VARARGS | METH_KEYWORDS,
     "initialize(*, backend=None, device=None, policy=None, provider=None, cache_dir=None, backend_path=None, "
     "log=None, cpu_devices=-1)\n--\n\nStart kiln with explicit settings (the KILN_* variables as arguments; None "
     "leaves a setting to its variable). Optional, and only before any other call that touches devices."},
    {"policy", kp_policy, METH_NOARGS, "policy()\n--\n\nThe provider policy in force: 'vendor', 'portable' or 'fastest'."},
    {"set_policy", kp_set_policy, METH_O, "set_policy(name)\n--\n\nSet the provider policy for the whole process."},
    {"set_providers", kp_set_providers, METH_O,
     "set_providers(overrides)\n--\n\nPer-operation provider overrides as KILN_PROVIDER writes them "
     "('matmul=blas,conv2d=native'; '' clears them)."},
    {"last_provider", kp_last_provider, METH_NOARGS,
     "last_provider()\n--\n\nThe provider that ran the last operation this thread enqueued ('native', 'blas', ...)."},
    {"op_names", kp_op_names, METH_NOARGS, "op_names()\n--\n\nThe operation names KILN_PROVIDER and Device.providers take."},
    {"set_log_level", kp_set_log_level, METH_O,
     "set_log_level(level)\n--\n\n'off', 'error', 'warn', 'info' or 'debug' (kiln logs to stderr)."},
    {"cache_dir", kp_cache_dir, METH_NOARGS, "cache_dir()\n--\n\nThe kernel and tuning cache folder in force, or None."},
    {"_trace_start", kp_trace_start, METH_O, NULL},
    {"_trace_stop", kp_trace_stop, METH_NOARGS, NULL},
    {"trace_summary", kp_trace_summary, METH_NOARGS,
     "trace_summary()\n--\n\nThe summary of the trace recording now, or else of the last one (kiln.trace): time "
     "per op and provider, the ten longest ops, copies, each queue's idle time."},
    {"_trace_clock_ns", kp_trace_clock_ns, METH_NOARGS, NULL},
    {"_trace_span", kp_trace_span, METH_VARARGS, NULL},
    {"_clear_error", kp_clear_error, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kp_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kiln._kiln",
    .m_doc = "The C extension under the kiln package: kiln's public C API for Python.",
    .m_size = -1,
    .m_methods = kp_module_methods,
};

PyMODINIT_FUNC PyInit__kiln(void) {
  PyObject *module = PyModule_Create(&kp_module_def);
  if (!module) return NULL;
  if (PyModule_AddFunctions(module, kp_ops_methods) < 0 || PyModule_AddFunctions(module, kp_dlpack_methods) < 0)
    goto fail;
  if (kp_errors_init(module) < 0 || kp_dlpack_init() < 0) goto fail;
  if (kp_module_init_devices(module) < 0) goto fail;
  if (kp_module_init_tensor(module) < 0 || kp_module_init_methods(module) < 0 || kp_module_init_autograd(module) < 0)
    goto fail;
#ifndef KILNPY_NO_NN
  if (kp_module_init_nn(module) < 0) goto fail;
  if (PyModule_AddIntConstant(module, "HAS_NN", 1) < 0) goto fail;
#else
  if (PyModule_AddIntConstant(module, "HAS_NN", 0) < 0) goto fail;
#endif
  if (PyModule_AddStringConstant(module, "kiln_version", kiln_version()) < 0) goto fail;
  if (PyModule_AddIntConstant(module, "ALL_AXES", KILN_ALL_AXES) < 0) goto fail;
  return module;
fail:
  Py_DECREF(module);
  return NULL;
}
