/* nn/nn_internal.h: what libkiln-nn's files share and its tests and fuzz targets reach; never installed. */
#ifndef KILN_NN_INTERNAL_H
#define KILN_NN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/nn.h"

/* ---- dataset.c: IDX files ------------------------------------------------------
 * IDX: two zero bytes, a type byte (0x08: unsigned bytes, the only one read),
 * the number of dimensions, each dimension as a big-endian uint32, then the
 * values. Images have 3 dimensions [N, rows, cols], labels 1 [N]. */

typedef struct kiln_nn__idx_t {
  uint32_t ndim;
  uint32_t dims[3];
  uint8_t *data; /* malloc'ed, the product of dims bytes */
  size_t size;
} kiln_nn__idx_t;

/* Parse an uncompressed IDX file of `ndim` dimensions held in memory; `name`
 * and `hint` go into the message (hint: what to do; may be NULL). KILN_IO for
 * any fault of the bytes. On success the caller frees out->data. */
kiln_status_t kiln_nn__idx_parse_memory(const void *bytes, size_t size, uint32_t ndim, const char *name,
                                        const char *hint, kiln_nn__idx_t *out);

/* ---- loader.c: the shuffle ---------------------------------------------------------
 * SplitMix64 (Steele, Lea, Flood 2014): the generator behind every order. */
static inline uint64_t kiln_nn__splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}


/* ---- safetensors: the dtype names ---------------------------------------------------
 * The format's name of each kiln dtype, and its rank in the reference
 * writer's Dtype enum (which orders the tensors of a file it writes). */
static const struct {
  kiln_dtype_t dtype;
  const char *name;
  int rank;
} kiln_nn__st_dtypes[] = {
    {KILN_BOOL, "BOOL", 0}, {KILN_U8, "U8", 1},    {KILN_I8, "I8", 2},    {KILN_I16, "I16", 3}, {KILN_F16, "F16", 4},
    {KILN_BF16, "BF16", 5}, {KILN_I32, "I32", 6},  {KILN_F32, "F32", 7},  {KILN_F64, "F64", 8}, {KILN_I64, "I64", 9},
};

/* "F32", "BF16", ...; "?" for a dtype the format lacks. */
static inline const char *kiln_nn__st_dtype_name(kiln_dtype_t dtype) {
  for (size_t i = 0; i < sizeof kiln_nn__st_dtypes / sizeof kiln_nn__st_dtypes[0]; i++)
    if (kiln_nn__st_dtypes[i].dtype == dtype) return kiln_nn__st_dtypes[i].name;
  return "?";
}

static inline int kiln_nn__st_dtype_rank(kiln_dtype_t dtype) {
  for (size_t i = 0; i < sizeof kiln_nn__st_dtypes / sizeof kiln_nn__st_dtypes[0]; i++)
    if (kiln_nn__st_dtypes[i].dtype == dtype) return kiln_nn__st_dtypes[i].rank;
  return -1;
}

/* ---- safetensors_save.c: names, and the save behind kiln_nn_model_save --------------- */

/* Well-formed UTF-8: no overlongs, no surrogates, nothing past U+10FFFF. */
bool kiln_nn__utf8_valid(const char *text);
/* The offset of the first control character (below 0x20, or 0x7f) in `text`;
 * strlen(text) when there is none. */
size_t kiln_nn__control_char(const char *text);
/* kiln_nn_safetensors_save, which with `finite` also refuses (KILN_INVALID_ARGUMENT,
 * nothing written) an f32 tensor holding a NaN or an infinity; `call` names
 * the public function in messages. */
kiln_status_t kiln_nn__safetensors_save(const char *call, const char *path, const kiln_nn_named_tensor_t *tensors,
                                        size_t count, const kiln_nn_metadata_t *metadata, size_t metadata_count,
                                        bool finite);

/* ---- param.c: parameters and the provider counts ----------------------------------- */

struct kiln_nn_param_t {
  char *name;
  kiln_tensor_t *value;  /* f32, contiguous, the same tensor for the parameter's life */
  kiln_tensor_t *low;    /* the value cast to a model's low precision for this step (NULL at f32) */
  bool low_current;      /* the optimizer's step wrote `low` with the value it left: the next forward
                          * needs no cast (consumed there) */
  kiln_tensor_t *grad;   /* NULL: zero */
  bool grad_exclusive;   /* grad is referenced by nothing else: it may be accumulated into in place */
};


/* Add a gradient contribution to param->grad, taking the caller's reference
 * to g. `exclusive`: nothing else references g's memory, so it may be adopted
 * and later accumulated into. The first contribution is adopted; a later one
 * is added in place with kiln_tensor_accumulate when param->grad is exclusive
 * and contiguous, else out of place (kiln_tensor_add). */
kiln_status_t kiln_nn__param_add_grad(kiln_nn_param_t *param, kiln_tensor_t *g, bool exclusive);

/* Replace the parameter's name (copied). KILN_OUT_OF_MEMORY. */
kiln_status_t kiln_nn__param_rename(kiln_nn_param_t *param, const char *name);

/* ---- tape.c / tape_backward.c: the record --------------------------------------------- */

typedef enum kiln_nn__tape_op_t {
  KILN_NN__T_UNARY,
  KILN_NN__T_BINARY,
  KILN_NN__T_BINARY_SCALAR,
  KILN_NN__T_MATMUL,
  KILN_NN__T_LINEAR,
  KILN_NN__T_SUM,
  KILN_NN__T_MEAN,
  KILN_NN__T_SOFTMAX,
  KILN_NN__T_CROSS_ENTROPY,
  KILN_NN__T_CONV2D,
  KILN_NN__T_MAX_POOL2D,
  KILN_NN__T_RESHAPE,
  KILN_NN__T_CAST,
  KILN_NN__T_INDEX_SELECT,
} kiln_nn__tape_op_t;

/* Where an input of a recorded op came from. */
typedef enum kiln_nn__source_t {
  KILN_NN__CONSTANT = 0, /* carries no gradient */
  KILN_NN__RESULT = 1,   /* the result of record entry `index` */
  KILN_NN__PARAM = 2,    /* watched parameter `index` of the tape */
} kiln_nn__source_t;

typedef struct kiln_nn__input_t {
  kiln_nn__source_t source;
  size_t index;
  kiln_tensor_t *saved; /* retained when the backward needs the tensor itself */
  int ndim;             /* its shape, for gradients summed or reshaped back to it */
  int64_t shape[KILN_MAX_DIMS];
} kiln_nn__input_t;

typedef struct kiln_nn__entry_t {
  kiln_nn__tape_op_t op;
  int sub;              /* the unary or binary op; softmax: 1 for log_softmax; cast: the input's dtype */
  bool flag_a, flag_b;  /* matmul: trans_a, trans_b; sum/mean: keepdim */
  int axis;             /* sum/mean; index_select */
  double scalar;        /* binary_scalar */
  kiln_tensor_t *out;   /* retained: the result's identity, and its value where the backward needs it */
  int n_in;
  kiln_nn__input_t in[3];
  union {
    kiln_conv2d_params_t conv;
    kiln_pool2d_params_t pool;
  } p;
} kiln_nn__entry_t;

/* A gradient during the backward pass: NULL with `one` set is the implicit 1
 * the pass starts from. */
typedef struct kiln_nn__grad_t {
  kiln_tensor_t *t;
  bool one;
  bool exclusive;
} kiln_nn__grad_t;

struct kiln_nn_tape_t {
  kiln_nn__entry_t *entries;
  size_t count, capacity;
  kiln_nn_param_t **params; /* watched in this recording */
  size_t param_count, param_capacity;
  kiln_nn__grad_t *grads;   /* backward scratch, one per entry */
  size_t grad_capacity;
};

/* Release what entry e holds and zero it. */
void kiln_nn__entry_release(kiln_nn__entry_t *e);

/* The name of a tape op for messages ("linear", "conv2d" ...). */
const char *kiln_nn__tape_op_name(const kiln_nn__entry_t *e);


/* ---- optim.c ----------------------------------------------------------------------- */

/* The optimizer's parameters, up to `capacity` of them into out; returns how
 * many it has. */
size_t kiln_nn__optimizer_params(const kiln_nn_optimizer_t *optimizer, kiln_nn_param_t **out, size_t capacity);

/* ---- layers.c, model.c ------------------------------------------------------------ */

typedef enum kiln_nn__layer_kind_t {
  KILN_NN__LINEAR,
  KILN_NN__CONV2D,
  KILN_NN__MAX_POOL2D,
  KILN_NN__ACTIVATION,
  KILN_NN__FLATTEN,
} kiln_nn__layer_kind_t;

struct kiln_nn_layer_t {
  kiln_nn__layer_kind_t kind;
  char text[192];               /* kiln_nn_layer_describe (room for every size at its widest) */
  kiln_nn_param_t *params[2];   /* weight, bias */
  size_t param_count;
  int64_t fan_in;               /* inputs per output: the initialisation's bound */
  kiln_conv2d_params_t conv;
  kiln_pool2d_params_t pool;
  kiln_unary_op_t activation;   /* KILN_NN__ACTIVATION's op */
};

/* Move the values of `count` parameters to `device` (kiln_nn_param_to for
 * each, all or none): `call` names the public function in messages. */
kiln_status_t kiln_nn__params_to(kiln_nn_param_t *const *params, size_t count, kiln_device_t *device,
                                 const char *call);

/* Draw the layer's weight and bias again (kiln_nn_param_init_uniform). */
kiln_status_t kiln_nn__layer_reset(kiln_nn_layer_t *layer, uint64_t seed_weight, uint64_t seed_bias);

#endif /* KILN_NN_INTERNAL_H */
