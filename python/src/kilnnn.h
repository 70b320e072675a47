/* python/src/kilnnn.h: what the kiln.nn files of the extension share: object layouts over libkiln-nn and the owner objects that keep borrowed handles valid. */
#ifndef KILNPY_NN_H
#define KILNPY_NN_H

#include "kilnpy.h"

#include <kiln/nn.h>

/* ---- one thread at a time ----------------------------------------------------------
 * The objects of kiln/nn.h are single-threaded. Under the GIL two Python
 * threads only meet inside one when a call lets the GIL go (train_epoch,
 * evaluate, a loader's next batch, save/load) or calls back into Python (the
 * progress callback). Such a call marks each object it uses with a guard for
 * its duration; any other use of a marked object, from another thread or
 * from the callback, raises RuntimeError naming the object, what uses it and
 * the thread, instead of racing. A model, its layers and the parameters
 * borrowed from them share one guard (their root owner's); an optimizer over
 * parameters of one model shares it too. */
typedef struct kp_guard_t {
  bool busy;
  unsigned long thread;  /* PyThread_get_thread_ident() of the user */
  const char *activity;  /* "train_epoch" */
  const char *type_name; /* the object it was marked through: "kiln.nn.Sequential" */
} kp_guard_t;

/* The guard of a kiln.nn object (Sequential, Layer, Parameter, Optimizer,
 * Loader, the owners behind them), NULL for any other object. */
kp_guard_t *kp_guard_of(PyObject *obj);
/* 0 when no call is inside `obj`, else -1 with the RuntimeError. */
int kp_guard_check(PyObject *obj);
/* Mark the `n` objects (NULL entries skipped) for `activity`: all, or none
 * and -1 with the RuntimeError of the first one in use. `out_guards` has room
 * for n; returns how many were marked (distinct guards), for kp_guard_leave. */
int kp_guard_enter(PyObject *const *objs, int n, const char *activity, kp_guard_t **out_guards);
void kp_guard_leave(kp_guard_t **guards, int count);

/* An owner frees one libkiln-nn object (a layer, a model, a parameter) when
 * the last Python object borrowing from it goes away. A layer added to a
 * model is freed by the model instead: its owner then keeps the model's
 * owner alive (parent) and frees nothing itself. No cycles: owners point
 * only upwards. */
typedef struct kp_owner_t {
  PyObject_HEAD
  void *ptr;
  void (*free_fn)(void *);
  PyObject *parent;
  kp_guard_t guard; /* used while no parent: a parent's root guard serves instead */
} kp_owner_t;

extern PyTypeObject kp_owner_type;
kp_owner_t *kp_owner_new(void *ptr, void (*free_fn)(void *));
/* From now on `owner` frees nothing and keeps `parent` alive. */
void kp_owner_transfer(kp_owner_t *owner, kp_owner_t *parent);

typedef struct kp_dataset_t {
  PyObject_HEAD
  kiln_nn_dataset_t *dataset;
} kp_dataset_t;

typedef struct kp_loader_t {
  PyObject_HEAD
  kiln_nn_loader_t *loader;
  PyObject *dataset; /* must outlive the loader */
  kp_guard_t guard;
  uint64_t last_epoch;
  size_t last_index;
} kp_loader_t;

/* A parameter: owned (owner NULL: freed with the object) or borrowed from a
 * layer or model (owner keeps it alive). */
typedef struct kp_param_t {
  PyObject_HEAD
  kiln_nn_param_t *param;
  kp_owner_t *owner;
  kp_guard_t guard; /* an owned parameter's; a borrowed one uses its owner's */
} kp_param_t;

typedef struct kp_tape_t {
  PyObject_HEAD
  kiln_nn_tape_t *tape;
  /* list: what this recording points at, kept alive until backward or
   * clear: the watched parameters and the owners of the layers and models
   * that ran on the tape (the C tape keeps their parameters' addresses). */
  PyObject *watched;
} kp_tape_t;

typedef struct kp_layer_t {
  PyObject_HEAD
  kiln_nn_layer_t *layer;
  kp_owner_t *owner; /* frees the layer, or (in a model) keeps the model alive */
  bool in_model;
} kp_layer_t;

typedef struct kp_model_t {
  PyObject_HEAD
  kiln_nn_model_t *model;
  kp_owner_t *owner;
  PyObject *layers; /* list of Layer objects, in order */
} kp_model_t;

typedef struct kp_optim_t {
  PyObject_HEAD
  kiln_nn_optimizer_t *optimizer;
  PyObject *keep; /* the parameters (or their owners): they must outlive the optimizer */
  kp_guard_t own_guard;
  PyObject *guard_source; /* borrowed from keep: the object whose guard the parameters share, or NULL (own_guard) */
} kp_optim_t;

extern PyTypeObject kp_dataset_type, kp_loader_type, kp_param_type, kp_tape_type, kp_layer_type, kp_model_type,
    kp_optim_type;
extern PyMethodDef kp_nn_data_functions[], kp_nn_train_functions[], kp_nn_model_functions[];

/* A Parameter object over `param`, borrowed from `owner` (NULL: owned). */
PyObject *kp_param_wrap(kiln_nn_param_t *param, kp_owner_t *owner);
/* Watch a kiln.nn.Parameter on the tape, keeping it alive as long as the
 * record (Tape.watch, and autograd's leaves); 0, or -1 with the error. */
int kp_tape_watch_param(kp_tape_t *t, PyObject *param, kiln_tensor_t **out_value);
/* Drop the record and what it kept alive (Tape.clear). */
void kp_tape_end(kp_tape_t *t);
/* The kiln tape of a tape argument: a Tape, or None for no tape (NULL). */
int kp_tape_arg(PyObject *arg, kiln_nn_tape_t **out);
/* A layer or model about to run on the tape `tape_arg` (None: no tape) has
 * `owner` keep its parameters alive as long as the record lasts; 0 or -1. */
int kp_tape_keep(PyObject *tape_arg, kp_owner_t *owner);
PyObject *kp_layer_wrap(kiln_nn_layer_t *layer, kp_owner_t *owner, bool in_model);

#endif /* KILNPY_NN_H */
