/* python/src/kilnnn.h: what the kiln.nn files of the extension share: object layouts over libkiln-nn and the owner objects that keep borrowed handles valid. */
#ifndef KILNPY_NN_H
#define KILNPY_NN_H

#include "kilnpy.h"

#include <kiln/nn.h>

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
  uint64_t last_epoch;
  size_t last_index;
} kp_loader_t;

/* A parameter: owned (owner NULL: freed with the object) or borrowed from a
 * layer or model (owner keeps it alive). */
typedef struct kp_param_t {
  PyObject_HEAD
  kiln_nn_param_t *param;
  kp_owner_t *owner;
} kp_param_t;

typedef struct kp_tape_t {
  PyObject_HEAD
  kiln_nn_tape_t *tape;
  PyObject *watched; /* list: the parameters of this recording, kept alive until backward or clear */
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
} kp_optim_t;

extern PyTypeObject kp_dataset_type, kp_loader_type, kp_param_type, kp_tape_type, kp_layer_type, kp_model_type,
    kp_optim_type;
extern PyMethodDef kp_nn_data_functions[], kp_nn_train_functions[], kp_nn_model_functions[];

/* A Parameter object over `param`, borrowed from `owner` (NULL: owned). */
PyObject *kp_param_wrap(kiln_nn_param_t *param, kp_owner_t *owner);
/* The kiln tape of a tape argument: a Tape, or None for no tape (NULL). */
int kp_tape_arg(PyObject *arg, kiln_nn_tape_t **out);
PyObject *kp_layer_wrap(kiln_nn_layer_t *layer, kp_owner_t *owner, bool in_model);

#endif /* KILNPY_NN_H */
