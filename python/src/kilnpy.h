/* python/src/kilnpy.h: what the files of the kiln Python extension (kiln._kiln) share: object layouts, types, helpers. */
#ifndef KILNPY_H
#define KILNPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdbool.h>
#include <stdint.h>

#include <kiln/kiln.h>

/* ---- objects --------------------------------------------------------------------------
 * Devices belong to kiln (they live until the process ends), so a Device
 * object only points at one; there is one Device object per kiln device, so
 * `is` compares them. A Tensor holds one reference to a kiln tensor. A DType
 * is one of the singletons kiln.float32, kiln.bfloat16, kiln.bool, ... (one
 * per kiln dtype). */

typedef struct kp_device_t {
  PyObject_HEAD
  kiln_device_t *device;
  PyObject *selector; /* str, e.g. "cpu:0" */
  PyObject *backend;  /* str */
  PyObject *type;     /* str: "cpu", "gpu", ... */
  PyObject *name;     /* str */
  Py_ssize_t index;   /* position in kiln.devices() */
  PyObject *dlpack;   /* (device_type, device_id) tuple, or NULL when the backend has no DLPack */
} kp_device_t;

typedef struct kp_tensor_t {
  PyObject_HEAD
  kiln_tensor_t *tensor;
  PyObject *weakrefs;
  /* Made by kiln.from_dlpack over a producer's memory, which kiln's queues
   * had not touched then: exporting it again is not expected to wait for the
   * device, so __dlpack__ keeps the GIL for it (see dlpack.c). */
  bool imported;
  /* Autograd (autograd.c): a leaf that requires grad holds the
   * kiln.nn.Parameter over its tensor; a result of a recorded op, the
   * recording it belongs to (0: none). */
  PyObject *ag_param;
  uint64_t ag_recording;
} kp_tensor_t;

typedef struct kp_dtype_t {
  PyObject_HEAD
  kiln_dtype_t dtype;
  const char *name;  /* "float32" */
  const char *short_name; /* "f32" */
} kp_dtype_t;

extern PyTypeObject kp_device_type;
extern PyTypeObject kp_tensor_type;
extern PyTypeObject kp_dtype_type;
extern kp_dtype_t kp_dtypes[KILN_DTYPE_COUNT_]; /* indexed by kiln_dtype_t */

#define KP_IS_TENSOR(o) Py_IS_TYPE((o), &kp_tensor_type)
#define KP_TENSOR(o) (((kp_tensor_t *)(o))->tensor)

/* ---- errors (module.c) ----------------------------------------------------------------- */

/* Raise the kiln.Error subclass of `status` with kiln_last_error() as its
 * message; returns NULL. */
PyObject *kp_raise(kiln_status_t status);
/* Raise the subclass of `status` with a message of our own; returns NULL. */
PyObject *kp_raise_msg(kiln_status_t status, const char *fmt, ...);
/* The exception class of a status (borrowed). */
PyObject *kp_error_class(kiln_status_t status);

/* ---- devices (device.c) ---------------------------------------------------------------- */

/* The one Device object of a kiln device (a new reference), NULL with an
 * exception set on failure. */
PyObject *kp_device_object(kiln_device_t *device);
/* Resolve a device argument: None (the default device), a Device, a selector
 * string ("cpu:0", "opencl:gpu"), or an int (an index into kiln.devices()).
 * Returns 0, or -1 with an exception set. */
int kp_device_arg(PyObject *arg, kiln_device_t **out);
int kp_module_init_devices(PyObject *module);

/* ---- tensors (tensor.c) and conversions (convert.c) ---------------------------------------------------------------- */

/* A Tensor object taking over the caller's reference to `t` (released on
 * failure too). Returns NULL with an exception set on failure. */
PyObject *kp_tensor_wrap(kiln_tensor_t *t);
/* kp_tensor_wrap of *out for a status-returning call: raises on failure.
 * `out` is a pointer so that the call filling it is evaluated first. */
static inline PyObject *kp_result(kiln_status_t status, kiln_tensor_t **out) {
  if (status != KILN_OK) return kp_raise(status);
  return kp_tensor_wrap(*out);
}
/* The kiln tensor of a Tensor argument (borrowed); NULL with a TypeError
 * naming `what` otherwise. */
kiln_tensor_t *kp_tensor_arg(PyObject *obj, const char *what);
/* A dtype argument: a DType, a name ("float64", "f64"), a NumPy dtype or
 * scalar type, a PyTorch dtype, Python's float (float32), int (int32) or bool.
 * NULL or None gives `fallback`. */
int kp_dtype_arg(PyObject *arg, kiln_dtype_t fallback, kiln_dtype_t *out);
PyObject *kp_dtype_object(kiln_dtype_t dtype); /* borrowed */
/* The buffer protocol's format character of a dtype ('f', 'q', '?', 'e');
 * '\0' for bfloat16, which has none. */
char kp_dtype_format(kiln_dtype_t dtype);
/* A shape argument: an int or a sequence of ints. Returns ndim or -1. */
int kp_shape_arg(PyObject *arg, int64_t shape[KILN_MAX_DIMS], const char *what);
/* The one converter of the int arguments that kiln keeps in 32 bits (axis,
 * stride, padding, kernel size, permutation, classes ...): an int (or an
 * object with __index__) in [low, high], else OverflowError naming `what`
 * and the value (a TypeError for a non-int). Never wraps. 0 or -1. */
int kp_int_arg(PyObject *obj, const char *what, long long low, long long high, long long *out);
int kp_int32_arg(PyObject *obj, const char *what, int32_t *out);
/* A sequence of at most `max` such ints (each named "what[i]"); returns the
 * count or -1. */
int kp_int32_seq_arg(PyObject *arg, const char *what, int max, int32_t *out);
/* v as the shortest decimal text that reads back as v ("1099511627776",
 * "1e+300", "0.1"), for messages; returns buf. */
const char *kp_double_text(double v, char buf[32]);
/* The shape of a tensor as a tuple. */
PyObject *kp_shape_tuple(int ndim, const int64_t *shape);
/* A Python number (int, float, bool, NumPy scalar) as a double; returns 1
 * when `obj` is one, 0 when it is not (no exception), -1 on error. */
int kp_scalar(PyObject *obj, double *out);
/* Copy a tensor to a new NumPy array of its dtype, or of `dtype` (blocks,
 * without the GIL). bfloat16, which NumPy lacks, converts only when `dtype`
 * is given (exactly, through float32); without it, a TypeError naming
 * astype(kiln.float32). */
PyObject *kp_tensor_to_numpy(kiln_tensor_t *t, PyObject *dtype);
/* The values as nested lists of bool, int or float (blocks, without the GIL). */
PyObject *kp_tensor_to_list(kiln_tensor_t *t);
/* The one value of a one-element tensor: bool, int or float, exact. */
PyObject *kp_tensor_item_object(kiln_tensor_t *t);
/* A new tensor on `device` holding a copy of `data` (nested lists, numbers,
 * objects with the buffer protocol, or anything numpy.asarray takes). */
PyObject *kp_tensor_from_object(PyObject *data, kiln_device_t *device, PyObject *dtype_arg);
int kp_module_init_tensor(PyObject *module);
/* numpy, imported on first need (borrowed), NULL with ImportError set. */
PyObject *kp_numpy(void);

/* ---- operations (ops.c) ----------------------------------------------------------------- */

extern PyMethodDef kp_ops_methods[];
/* Axis argument of the reductions: None means every axis. */
int kp_axis_arg(PyObject *arg, int *out);
/* The conv2d and pooling pairs (int or 2-sequence). */
int kp_pair_arg(PyObject *arg, int32_t fallback, int32_t out[2], const char *what);
/* The binary operation behind the operators, with NumPy's broadcasting and
 * Python scalars on either side. Returns NotImplemented for other operands. */
PyObject *kp_binary(kiln_binary_op_t op, PyObject *a, PyObject *b);
PyObject *kp_matmul(PyObject *a, PyObject *b, bool trans_a, bool trans_b);
/* The differentiable single-operand operations every spelling shares (the
 * implicit tape records them when x requires grad): x is a Tensor. */
PyObject *kp_unary(kiln_unary_op_t op, PyObject *x, kiln_tensor_t **out);
PyObject *kp_softmax(PyObject *x, bool log);
PyObject *kp_reshape(PyObject *x, int ndim, const int64_t *shape);
PyObject *kp_cast(PyObject *x, kiln_dtype_t dtype);

/* ---- PyTorch's spellings (methods.c) -------------------------------------------------------- */

/* The sizes of a creation or view call from args[first:]: ints as varargs or
 * one tuple/list; with out_dtype, NumPy's (shape, dtype) pair too. A float or
 * another non-int is a TypeError naming the keyword-only parameters of
 * `call`. Returns ndim or -1. */
int kp_size_args(PyObject *args, Py_ssize_t first, const char *call, int64_t shape[KILN_MAX_DIMS],
                 PyObject **out_dtype);
/* Comparison operators into bool tensors (kiln_tensor_compare). */
PyObject *kp_compare(PyObject *a, PyObject *b, int pyop);
PyObject *kp_nb_power(PyObject *a, PyObject *b, PyObject *mod);
PyObject *kp_nb_iadd(PyObject *a, PyObject *b);
PyObject *kp_nb_isub(PyObject *a, PyObject *b);
PyObject *kp_nb_imul(PyObject *a, PyObject *b);
PyObject *kp_nb_idiv(PyObject *a, PyObject *b);
PyObject *kp_nb_and(PyObject *a, PyObject *b);
PyObject *kp_nb_or(PyObject *a, PyObject *b);
PyObject *kp_nb_xor(PyObject *a, PyObject *b);
PyObject *kp_nb_invert(PyObject *a);
PyObject *kp_nb_index(PyObject *a);
/* The Tensor methods and module functions of methods.c, added after the type
 * is ready (they replace tensor.c's NumPy-only forms). */
int kp_module_init_methods(PyObject *module);

/* A value a creation or an assignment writes into `dtype` must fit it (no
 * silent saturation): 0, or -1 with OverflowError naming the value and the
 * dtype's range (ops.c). */
int kp_value_fits(double v, kiln_dtype_t dtype, const char *call, const char *what);

/* Basic indexing and assignment through views (indexing.c). */
extern PyMappingMethods kp_tensor_mapping;
/* index_select, index_add_, index_copy_, index_put_ (indexing.c), added to the tensor type with the rest. */
extern PyMethodDef kp_tensor_index_methods[];

/* ---- DLPack (dlpack.c) ------------------------------------------------------------------- */

PyObject *kp_tensor_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kp_tensor_dlpack_device(PyObject *self, PyObject *unused);
extern PyMethodDef kp_dlpack_methods[];
/* Interned names and the (1, 0) version tuple; 0 or -1. */
int kp_dlpack_init(void);

/* ---- autograd on tensors (autograd.c) ---------------------------------------------------------
 * An op on tensors that require grad, in grad mode, runs as libkiln-nn's tape
 * op on the implicit tape. Each differentiable entry point does:
 *
 *   int rec = kp_ag_wanted(a, b);
 *   return KP_AG_OP(rec, kiln_nn_tape_x(kp_ag_tape(), kp_ag_in(a), ..., &out),
 *                   kiln_tensor_x(KP_TENSOR(a), ..., &out), &out);
 *
 * and an entry point kiln cannot differentiate calls kp_ag_refuse first, so
 * no op silently cuts a gradient's path. Without libkiln-nn (KILNPY_NO_NN)
 * nothing requires grad and KP_AG compiles the tape call away. */
bool kp_ag_requires_grad(PyObject *obj);
/* -1 with RuntimeError naming `op` when obj requires grad in grad mode. */
int kp_ag_refuse(PyObject *obj, const char *op);
/* A tensor's autograd state is dropped (its dealloc). */
void kp_ag_forget(kp_tensor_t *t);
/* The kiln.nn.Parameter behind a leaf that requires grad (borrowed), or NULL. */
PyObject *kp_ag_param_of(PyObject *obj);
int kp_module_init_autograd(PyObject *module);
#ifndef KILNPY_NO_NN
#include <kiln/nn.h>
/* 1: record (the implicit tape exists then); 0: run the plain op; -1: error
 * (a stale operand). a or b may be NULL or non-tensors. */
int kp_ag_wanted(PyObject *a, PyObject *b);
kiln_nn_tape_t *kp_ag_tape(void);
/* An operand's kiln tensor; a leaf that requires grad is watched. */
kiln_tensor_t *kp_ag_in(PyObject *obj);
/* kp_result of an op; when `rec` (it ran on the implicit tape), the result
 * is marked if it carries a gradient. */
PyObject *kp_ag_result(int rec, kiln_status_t status, kiln_tensor_t **out);
/* The tape a kiln.nn layer or model called without one records on: the
 * implicit tape in grad mode (x watched when it is a leaf that requires
 * grad), else None (borrowed); NULL on error. */
PyObject *kp_ag_layer_tape(PyObject *x);
#define KP_AG(call) (call)
#else
static inline PyObject *kp_ag_result(int rec, kiln_status_t status, kiln_tensor_t **out) { return kp_result(status, out); }
static inline int kp_ag_wanted(PyObject *a, PyObject *b) { return 0; }
static inline kiln_tensor_t *kp_ag_in(PyObject *obj) { return KP_TENSOR(obj); }
#define KP_AG(call) KILN_UNSUPPORTED
#endif
/* The one shape of a differentiable entry point: `rec`, a variable holding
 * kp_ag_wanted's answer (it is read more than once); the tape's call when 1,
 * the plain one when 0, NULL when -1 (its error is set). Both fill *out. */
#define KP_AG_OP(rec, tape_call, plain_call, out) \
  ((rec) < 0 ? NULL : kp_ag_result((rec), (rec) ? KP_AG(tape_call) : (plain_call), (out)))

/* ---- libkiln-nn (nn_data.c, nn_train.c) ---------------------------------------------------- */

#ifndef KILNPY_NO_NN
int kp_module_init_nn(PyObject *module);
#endif

/* ---- small helpers ------------------------------------------------------------------------- */

/* Run `expr` (a blocking kiln call) without the GIL. */
#define KP_NOGIL(expr)                                                                                              \
  do {                                                                                                              \
    Py_BEGIN_ALLOW_THREADS expr;                                                                                    \
    Py_END_ALLOW_THREADS                                                                                            \
  } while (0)

#endif /* KILNPY_H */
