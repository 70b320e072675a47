/* nn/tape.c: the reverse-mode tape's record: the forward operations, each run through kiln's public API and recorded with what its backward needs. */
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* The ops' names in messages and dumps: KILN_PROVIDER's. */
static const char *const unary_names[KILN_UNARY_COUNT_] = {
#define NAME_(NAME, name) #name,
    KILN_UNARY_OPS(NAME_)
#undef NAME_
};
static const char *const binary_names[KILN_BINARY_COUNT_] = {
#define NAME_(NAME, name) #name,
    KILN_BINARY_OPS(NAME_)
#undef NAME_
};

/* ---- the tape object ------------------------------------------------------------- */

kiln_status_t kiln_nn_tape_create(kiln_nn_tape_t **out_tape) {
  if (!out_tape) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_tape_create: out_tape is NULL");
  kiln_nn_tape_t *tape = calloc(1, sizeof *tape);
  if (!tape) return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_tape_create: cannot allocate a tape");
  *out_tape = tape;
  return KILN_OK;
}

void kiln_nn__entry_release(kiln_nn__entry_t *e) {
  kiln_tensor_release(e->out);
  for (int i = 0; i < e->n_in; i++) kiln_tensor_release(e->in[i].saved);
  memset(e, 0, sizeof *e);
}

void kiln_nn_tape_clear(kiln_nn_tape_t *tape) {
  if (!tape) return;
  for (size_t i = 0; i < tape->count; i++) kiln_nn__entry_release(&tape->entries[i]);
  tape->count = 0;
  tape->param_count = 0;
}

void kiln_nn_tape_free(kiln_nn_tape_t *tape) {
  if (!tape) return;
  kiln_nn_tape_clear(tape);
  free(tape->entries);
  free(tape->params);
  free(tape->grads);
  free(tape);
}

size_t kiln_nn_tape_size(const kiln_nn_tape_t *tape) { return tape ? tape->count : 0; }

kiln_status_t kiln_nn_tape_watch(kiln_nn_tape_t *tape, kiln_nn_param_t *param, kiln_tensor_t **out_value) {
  if (!param || !out_value)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_tape_watch: %s is NULL", !param ? "param" : "out_value");
  if (tape) {
    for (size_t i = 0; i < tape->param_count; i++)
      if (tape->params[i] == param) {
        *out_value = param->low ? param->low : param->value;
        return KILN_OK;
      }
    if (tape->param_count == tape->param_capacity) {
      size_t cap = tape->param_capacity ? tape->param_capacity * 2 : 16;
      kiln_nn_param_t **grown = realloc(tape->params, cap * sizeof *grown);
      if (!grown) return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_tape_watch: cannot grow the tape's parameter list");
      tape->params = grown;
      tape->param_capacity = cap;
    }
    tape->params[tape->param_count++] = param;
  }
  /* A model in low precision computes with the step's copy of the value; its
   * gradient arrives in that dtype and is the parameter's all the same. */
  *out_value = param->low ? param->low : param->value;
  return KILN_OK;
}

const char *kiln_nn__tape_op_name(const kiln_nn__entry_t *e) {
  switch (e->op) {
  case KILN_NN__T_UNARY: return unary_names[e->sub];
  case KILN_NN__T_BINARY: return binary_names[e->sub];
  case KILN_NN__T_BINARY_SCALAR: return "binary_scalar";
  case KILN_NN__T_MATMUL: return "matmul";
  case KILN_NN__T_LINEAR: return "linear";
  case KILN_NN__T_SUM: return "sum";
  case KILN_NN__T_MEAN: return "mean";
  case KILN_NN__T_SOFTMAX: return e->sub ? "log_softmax" : "softmax";
  case KILN_NN__T_CROSS_ENTROPY: return "cross_entropy";
  case KILN_NN__T_CONV2D: return "conv2d";
  case KILN_NN__T_MAX_POOL2D: return "max_pool2d";
  case KILN_NN__T_RESHAPE: return "reshape";
  case KILN_NN__T_CAST: return "cast";
  case KILN_NN__T_INDEX_SELECT: return "index_select";
  }
  return "?";
}

/* ---- recording -------------------------------------------------------------------- */

/* Where `t` comes from in this recording: a result (newest first, as inputs
 * are usually recent), a watched parameter, or neither. */
static kiln_nn__source_t find_source(const kiln_nn_tape_t *tape, const kiln_tensor_t *t, size_t *out_index) {
  if (!t) return KILN_NN__CONSTANT;
  for (size_t i = tape->count; i-- > 0;)
    if (tape->entries[i].out == t) {
      *out_index = i;
      return KILN_NN__RESULT;
    }
  for (size_t i = 0; i < tape->param_count; i++)
    if (tape->params[i]->value == t || (tape->params[i]->low && tape->params[i]->low == t)) {
      *out_index = i;
      return KILN_NN__PARAM;
    }
  return KILN_NN__CONSTANT;
}

bool kiln_nn_tape_carries(const kiln_nn_tape_t *tape, const kiln_tensor_t *t) {
  size_t index;
  return tape && find_source(tape, t, &index) != KILN_NN__CONSTANT;
}

/* An entry being built: its inputs resolved; `needed` false when none of
 * them carries a gradient, in which case nothing is recorded. */
typedef struct pending_t {
  kiln_nn__entry_t e;
  bool needed;
} pending_t;

static void pending_begin(pending_t *p, const kiln_nn_tape_t *tape, kiln_nn__tape_op_t op,
                          const kiln_tensor_t *const *inputs, int n_in) {
  memset(p, 0, sizeof *p);
  p->e.op = op;
  p->e.n_in = n_in;
  if (!tape) return;
  for (int i = 0; i < n_in; i++) {
    kiln_nn__input_t *in = &p->e.in[i];
    in->source = find_source(tape, inputs[i], &in->index);
    if (in->source != KILN_NN__CONSTANT) p->needed = true;
    if (inputs[i]) {
      in->ndim = kiln_tensor_ndim(inputs[i]);
      if (in->ndim) memcpy(in->shape, kiln_tensor_shape(inputs[i]), (size_t)in->ndim * sizeof(int64_t));
    }
  }
}

/* Whether input i carries a gradient. */
static bool carries(const pending_t *p, int i) { return p->e.in[i].source != KILN_NN__CONSTANT; }

/* Keep input i's tensor for the backward pass. */
static void save(pending_t *p, int i, const kiln_tensor_t *t) {
  if (p->needed) p->e.in[i].saved = kiln_tensor_retain((kiln_tensor_t *)t);
}

/* Append the entry with `out` as its result; on failure release what it
 * saved. Does nothing when no input carries a gradient. */
static kiln_status_t pending_commit(kiln_nn_tape_t *tape, pending_t *p, kiln_tensor_t *out) {
  if (!tape || !p->needed) return KILN_OK;
  if (tape->count == tape->capacity) {
    size_t cap = tape->capacity ? tape->capacity * 2 : 32;
    kiln_nn__entry_t *grown = realloc(tape->entries, cap * sizeof *grown);
    if (!grown) {
      kiln_nn__entry_release(&p->e);
      return kiln_set_error(KILN_OUT_OF_MEMORY, "the tape cannot grow to %zu operations", cap);
    }
    tape->entries = grown;
    tape->capacity = cap;
  }
  p->e.out = kiln_tensor_retain(out);
  tape->entries[tape->count++] = p->e;
  return KILN_OK;
}

/* Finish a tape op: commit, or undo the result on any failure, naming the op. */
static kiln_status_t finish(kiln_nn_tape_t *tape, pending_t *p, const char *call, kiln_status_t status,
                            kiln_tensor_t *result, kiln_tensor_t **out) {
  if (status == KILN_OK) status = pending_commit(tape, p, result);
  else kiln_nn__entry_release(&p->e);
  if (status != KILN_OK) {
    kiln_tensor_release(result);
    return kiln_wrap_error(status, "%s", call);
  }
  *out = result;
  return KILN_OK;
}

static kiln_status_t need(const char *call, const void *a, const char *name_a, kiln_tensor_t **out) {
  if (!a) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, name_a);
  if (!out) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: out is NULL", call);
  return KILN_OK;
}

/* ---- the operations --------------------------------------------------------------- */

kiln_status_t kiln_nn_tape_unary(kiln_nn_tape_t *tape, kiln_unary_op_t op, kiln_tensor_t *x, kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_unary";
  kiln_status_t status = need(call, x, "x", out);
  if (status != KILN_OK) return status;
  if ((unsigned)op >= KILN_UNARY_COUNT_)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: op %d is not a kiln_unary_op_t", call, (int)op);
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_UNARY, (const kiln_tensor_t *const[]){x}, 1);
  p.e.sub = op;
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_unary(op, x, &y);
  if (status == KILN_OK) {
    save(&p, 0, x); /* f'(x) */
  }
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_binary(kiln_nn_tape_t *tape, kiln_binary_op_t op, kiln_tensor_t *a, kiln_tensor_t *b,
                                  kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_binary";
  kiln_status_t status = need(call, a, "a", out);
  if (status == KILN_OK) status = need(call, b, "b", out);
  if (status != KILN_OK) return status;
  if ((unsigned)op >= KILN_BINARY_COUNT_)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: op %d is not a kiln_binary_op_t", call, (int)op);
  pending_t p;
  /* eq's result is a constant: nothing to record. */
  pending_begin(&p, op == KILN_BINARY_EQ ? NULL : tape, KILN_NN__T_BINARY, (const kiln_tensor_t *const[]){a, b}, 2);
  p.e.sub = op;
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_binary(op, a, b, &y);
  if (status == KILN_OK) {
    /* What each derivative reads: mul the other operand, div both, maximum
     * and minimum `a` (compared with the result). */
    if (op == KILN_BINARY_MUL) {
      if (carries(&p, 0)) save(&p, 1, b);
      if (carries(&p, 1)) save(&p, 0, a);
    } else if (op == KILN_BINARY_DIV) {
      save(&p, 1, b);
      if (carries(&p, 1)) save(&p, 0, a);
    } else if (op == KILN_BINARY_MAXIMUM || op == KILN_BINARY_MINIMUM) {
      save(&p, 0, a);
    }
  }
  return finish(op == KILN_BINARY_EQ ? NULL : tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_binary_scalar(kiln_nn_tape_t *tape, kiln_binary_op_t op, kiln_tensor_t *a, double scalar,
                                         kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_binary_scalar";
  kiln_status_t status = need(call, a, "a", out);
  if (status != KILN_OK) return status;
  if ((unsigned)op >= KILN_BINARY_COUNT_)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: op %d is not a kiln_binary_op_t", call, (int)op);
  pending_t p;
  pending_begin(&p, op == KILN_BINARY_EQ ? NULL : tape, KILN_NN__T_BINARY_SCALAR, (const kiln_tensor_t *const[]){a}, 1);
  p.e.sub = op;
  p.e.scalar = scalar;
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_binary_scalar(op, a, scalar, &y);
  if (status == KILN_OK) {
    if (op == KILN_BINARY_MAXIMUM || op == KILN_BINARY_MINIMUM) save(&p, 0, a);
  }
  return finish(op == KILN_BINARY_EQ ? NULL : tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_matmul(kiln_nn_tape_t *tape, kiln_tensor_t *a, kiln_tensor_t *b, bool trans_a, bool trans_b,
                                  kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_matmul";
  kiln_status_t status = need(call, a, "a", out);
  if (status == KILN_OK) status = need(call, b, "b", out);
  if (status != KILN_OK) return status;
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_MATMUL, (const kiln_tensor_t *const[]){a, b}, 2);
  p.e.flag_a = trans_a;
  p.e.flag_b = trans_b;
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_matmul(a, b, trans_a, trans_b, &y);
  if (status == KILN_OK) {
    if (carries(&p, 0)) save(&p, 1, b);
    if (carries(&p, 1)) save(&p, 0, a);
  }
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_linear(kiln_nn_tape_t *tape, kiln_tensor_t *x, kiln_tensor_t *weight, kiln_tensor_t *bias,
                                  kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_linear";
  kiln_status_t status = need(call, x, "x", out);
  if (status == KILN_OK) status = need(call, weight, "weight", out);
  if (status != KILN_OK) return status;
  if (kiln_tensor_ndim(x) != 2 || kiln_tensor_ndim(weight) != 2 || (bias && kiln_tensor_ndim(bias) != 1))
    return kiln_set_error(KILN_SHAPE_MISMATCH,
                          "%s: x has %d dims, weight %d and bias %d; pass x [N, in], weight [out, in], bias [out] "
                          "(flatten x first: kiln_nn_tape_reshape or a flatten layer)",
                          call, kiln_tensor_ndim(x), kiln_tensor_ndim(weight), bias ? kiln_tensor_ndim(bias) : 1);
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_LINEAR, (const kiln_tensor_t *const[]){x, weight, bias}, 3);
  kiln_tensor_t *xw = NULL, *y = NULL;
  status = kiln_tensor_matmul(x, weight, false, true, &xw);
  if (status == KILN_OK) {
    if (bias) {
      status = kiln_tensor_add(xw, bias, &y);
      kiln_tensor_release(xw);
    } else {
      y = xw;
    }
  }
  if (status == KILN_OK) {
    if (carries(&p, 1)) save(&p, 0, x);      /* dW = dy^T x */
    if (carries(&p, 0)) save(&p, 1, weight); /* dx = dy W */
  }
  return finish(tape, &p, call, status, y, out);
}

static kiln_status_t reduce_op(kiln_nn_tape_t *tape, bool mean, kiln_tensor_t *a, int axis, bool keepdim,
                               kiln_tensor_t **out) {
  const char *call = mean ? "kiln_nn_tape_mean" : "kiln_nn_tape_sum";
  kiln_status_t status = need(call, a, "a", out);
  if (status != KILN_OK) return status;
  pending_t p;
  pending_begin(&p, tape, mean ? KILN_NN__T_MEAN : KILN_NN__T_SUM, (const kiln_tensor_t *const[]){a}, 1);
  p.e.axis = axis;
  p.e.flag_a = keepdim;
  kiln_tensor_t *y = NULL;
  status = mean ? kiln_tensor_mean(a, axis, keepdim, &y) : kiln_tensor_sum(a, axis, keepdim, &y);
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_sum(kiln_nn_tape_t *tape, kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out) {
  return reduce_op(tape, false, a, axis, keepdim, out);
}

kiln_status_t kiln_nn_tape_mean(kiln_nn_tape_t *tape, kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out) {
  return reduce_op(tape, true, a, axis, keepdim, out);
}

static kiln_status_t softmax_op(kiln_nn_tape_t *tape, bool log, kiln_tensor_t *a, kiln_tensor_t **out) {
  const char *call = log ? "kiln_nn_tape_log_softmax" : "kiln_nn_tape_softmax";
  kiln_status_t status = need(call, a, "a", out);
  if (status != KILN_OK) return status;
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_SOFTMAX, (const kiln_tensor_t *const[]){a}, 1);
  p.e.sub = log;
  kiln_tensor_t *y = NULL;
  status = log ? kiln_tensor_log_softmax(a, &y) : kiln_tensor_softmax(a, &y);
  /* The backward reads the result, which the entry keeps as its identity. */
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_softmax(kiln_nn_tape_t *tape, kiln_tensor_t *a, kiln_tensor_t **out) {
  return softmax_op(tape, false, a, out);
}

kiln_status_t kiln_nn_tape_log_softmax(kiln_nn_tape_t *tape, kiln_tensor_t *a, kiln_tensor_t **out) {
  return softmax_op(tape, true, a, out);
}

kiln_status_t kiln_nn_tape_cross_entropy(kiln_nn_tape_t *tape, kiln_tensor_t *logits, const kiln_tensor_t *labels,
                                         kiln_tensor_t **out_loss) {
  static const char call[] = "kiln_nn_tape_cross_entropy";
  kiln_status_t status = need(call, logits, "logits", out_loss);
  if (status == KILN_OK) status = need(call, labels, "labels", out_loss);
  if (status != KILN_OK) return status;
  pending_t p;
  /* Labels are integers: a constant whatever their origin. */
  pending_begin(&p, tape, KILN_NN__T_CROSS_ENTROPY, (const kiln_tensor_t *const[]){logits, NULL}, 2);
  kiln_tensor_t *loss = NULL;
  status = kiln_tensor_cross_entropy(logits, labels, &loss);
  if (status == KILN_OK) {
    save(&p, 0, logits);
    save(&p, 1, labels);
  }
  return finish(tape, &p, call, status, loss, out_loss);
}

kiln_status_t kiln_nn_tape_conv2d(kiln_nn_tape_t *tape, kiln_tensor_t *x, kiln_tensor_t *weight, kiln_tensor_t *bias,
                                  const kiln_conv2d_params_t *params, kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_conv2d";
  kiln_status_t status = need(call, x, "x", out);
  if (status == KILN_OK) status = need(call, weight, "weight", out);
  if (status != KILN_OK) return status;
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_CONV2D, (const kiln_tensor_t *const[]){x, weight, bias}, 3);
  p.e.p.conv = params ? *params : kiln_conv2d_params_default();
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_conv2d(x, weight, bias, params, &y);
  if (status == KILN_OK) {
    if (carries(&p, 1)) save(&p, 0, x);
    if (carries(&p, 0)) save(&p, 1, weight);
  }
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_max_pool2d(kiln_nn_tape_t *tape, kiln_tensor_t *x, const kiln_pool2d_params_t *params,
                                      kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_max_pool2d";
  kiln_status_t status = need(call, x, "x", out);
  if (status == KILN_OK) status = need(call, params, "params", out);
  if (status != KILN_OK) return status;
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_MAX_POOL2D, (const kiln_tensor_t *const[]){x}, 1);
  p.e.p.pool = *params;
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_max_pool2d(x, params, &y);
  if (status == KILN_OK) {
    save(&p, 0, x);
  }
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_reshape(kiln_nn_tape_t *tape, kiln_tensor_t *x, int ndim, const int64_t *shape,
                                   kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_reshape";
  kiln_status_t status = need(call, x, "x", out);
  if (status != KILN_OK) return status;
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_RESHAPE, (const kiln_tensor_t *const[]){x}, 1);
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_reshape(x, ndim, shape, &y);
  /* A view of a recorded result is a new tensor, and so a new identity. */
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_index_select(kiln_nn_tape_t *tape, kiln_tensor_t *x, int axis, const kiln_tensor_t *index,
                                        kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_index_select";
  kiln_status_t status = need(call, x, "x", out);
  if (status != KILN_OK) return status;
  if (!index) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: index is NULL", call);
  pending_t p;
  /* index is a constant: the gradient goes to x alone. */
  pending_begin(&p, tape, KILN_NN__T_INDEX_SELECT, (const kiln_tensor_t *const[]){x}, 1);
  p.e.axis = axis;
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_index_select(x, axis, index, &y);
  if (status == KILN_OK) save(&p, 0, index); /* the backward's scatter (slot 0 holds the index, not x) */
  return finish(tape, &p, call, status, y, out);
}

kiln_status_t kiln_nn_tape_cast(kiln_nn_tape_t *tape, kiln_tensor_t *x, kiln_dtype_t dtype, kiln_tensor_t **out) {
  static const char call[] = "kiln_nn_tape_cast";
  kiln_status_t status = need(call, x, "x", out);
  if (status != KILN_OK) return status;
  pending_t p;
  pending_begin(&p, tape, KILN_NN__T_CAST, (const kiln_tensor_t *const[]){x}, 1);
  p.e.sub = (int)kiln_tensor_dtype(x);
  kiln_tensor_t *y = NULL;
  status = kiln_tensor_cast(x, dtype, &y);
  return finish(tape, &p, call, status, y, out);
}
