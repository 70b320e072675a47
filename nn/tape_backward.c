/* nn/tape_backward.c: the tape's backward pass: each recorded op's gradient through kiln's public gradient operations, delivered to its inputs. */
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* The walk's state: the tape and the gradient of the entry being processed. */
typedef struct walk_t {
  kiln_nn_tape_t *tape;
  kiln_nn__entry_t *e;
  kiln_nn__grad_t g;
} walk_t;

static bool carries(const kiln_nn__entry_t *e, int i) { return i < e->n_in && e->in[i].source != KILN_NN__CONSTANT; }

/* Hand gradient `t` (the caller's reference, taken) to the source of input i.
 * `exclusive`: nothing else references t's memory. */
static kiln_status_t deliver(walk_t *w, int i, kiln_tensor_t *t, bool exclusive) {
  const kiln_nn__input_t *in = &w->e->in[i];
  if (in->source == KILN_NN__PARAM) return kiln_nn__param_add_grad(w->tape->params[in->index], t, exclusive);
  kiln_nn__grad_t *slot = &w->tape->grads[in->index];
  if (!slot->t) {
    slot->t = t;
    /* In place needs kiln_tensor_accumulate, which is f32 only. */
    slot->exclusive = exclusive && kiln_tensor_is_contiguous(t) && kiln_tensor_dtype(t) == KILN_F32;
    return KILN_OK;
  }
  /* A result used twice: its gradients add up. */
  kiln_status_t status;
  if (slot->exclusive) {
    status = kiln_tensor_accumulate(slot->t, 1.0, t);
    kiln_tensor_release(t);
  } else {
    kiln_tensor_t *sum = NULL;
    status = kiln_tensor_add(slot->t, t, &sum);
    kiln_tensor_release(t);
    if (status == KILN_OK) {
      kiln_tensor_release(slot->t);
      slot->t = sum;
      slot->exclusive = true;
    }
  }
  return status;
}

static bool same_shape(const kiln_tensor_t *t, int ndim, const int64_t *shape) {
  if (kiln_tensor_ndim(t) != ndim) return false;
  return ndim == 0 || !memcmp(kiln_tensor_shape(t), shape, (size_t)ndim * sizeof(int64_t));
}

/* Deliver `t` to input i summed back to the input's shape (a broadcast
 * operand). `t` is the caller's reference, taken. */
static kiln_status_t give(walk_t *w, int i, kiln_tensor_t *t, bool exclusive) {
  const kiln_nn__input_t *in = &w->e->in[i];
  if (same_shape(t, in->ndim, in->shape)) return deliver(w, i, t, exclusive);
  kiln_tensor_t *summed = NULL;
  kiln_status_t status = kiln_tensor_sum_to(t, in->ndim, in->shape, &summed);
  kiln_tensor_release(t);
  if (status != KILN_OK) return status;
  return deliver(w, i, summed, true);
}

/* The incoming gradient as a tensor (the implicit 1 made real). Borrowed. */
static kiln_status_t upstream(walk_t *w, kiln_tensor_t **out) {
  if (!w->g.t) {
    kiln_tensor_t *y = w->e->out;
    kiln_status_t status =
        kiln_tensor_ones(kiln_tensor_device(y), KILN_F32, kiln_tensor_ndim(y), kiln_tensor_shape(y), &w->g.t);
    if (status != KILN_OK) return status;
    w->g.exclusive = true;
    w->g.one = false;
  }
  *out = w->g.t;
  return KILN_OK;
}

/* The upstream gradient itself, passed on to `uses` inputs: shared unless one. */
static kiln_tensor_t *pass_on(walk_t *w, int uses, bool *out_exclusive) {
  *out_exclusive = w->g.exclusive && uses == 1;
  return kiln_tensor_retain(w->g.t);
}

/* ---- one op each ----------------------------------------------------------------- */

static kiln_status_t back_binary(walk_t *w, kiln_tensor_t *g) {
  kiln_nn__entry_t *e = w->e;
  const bool ca = carries(e, 0), cb = carries(e, 1);
  kiln_tensor_t *ga = NULL, *gb = NULL;
  bool ea = true, eb = true;
  kiln_status_t status = KILN_OK;
  switch ((kiln_binary_op_t)e->sub) {
  case KILN_BINARY_ADD:
  case KILN_BINARY_SUB: {
    const int uses = ca + (cb && e->sub == KILN_BINARY_ADD);
    if (ca) ga = pass_on(w, uses, &ea);
    if (cb && e->sub == KILN_BINARY_ADD) gb = pass_on(w, uses, &eb);
    if (cb && e->sub == KILN_BINARY_SUB) status = kiln_tensor_neg(g, &gb);
    break;
  }
  case KILN_BINARY_MUL:
    if (ca) status = kiln_tensor_mul(g, e->in[1].saved, &ga);
    if (status == KILN_OK && cb) status = kiln_tensor_mul(g, e->in[0].saved, &gb);
    break;
  case KILN_BINARY_DIV: {
    /* da = g / b; db = -(g / b) * (a / b) = -da * y. */
    kiln_tensor_t *q = NULL, *qy = NULL;
    status = kiln_tensor_div(g, e->in[1].saved, &q);
    if (status == KILN_OK && cb) {
      status = kiln_tensor_mul(q, e->out, &qy);
      if (status == KILN_OK) status = kiln_tensor_neg(qy, &gb);
      kiln_tensor_release(qy);
    }
    if (ca) ga = q;
    else kiln_tensor_release(q);
    break;
  }
  case KILN_BINARY_MAXIMUM:
  case KILN_BINARY_MINIMUM: {
    /* The winner takes the gradient; `a` on a tie. */
    kiln_tensor_t *mask = NULL, *to_a = NULL;
    status = kiln_tensor_eq(e->in[0].saved, e->out, &mask);
    if (status == KILN_OK) status = kiln_tensor_mul(g, mask, &to_a);
    if (status == KILN_OK && cb) status = kiln_tensor_sub(g, to_a, &gb);
    kiln_tensor_release(mask);
    if (ca) ga = to_a;
    else kiln_tensor_release(to_a);
    break;
  }
  default: break; /* eq is never recorded */
  }
  if (status == KILN_OK && ga) {
    status = give(w, 0, ga, ea);
    ga = NULL;
  }
  if (status == KILN_OK && gb) {
    status = give(w, 1, gb, eb);
    gb = NULL;
  }
  kiln_tensor_release(ga);
  kiln_tensor_release(gb);
  return status;
}

static kiln_status_t back_binary_scalar(walk_t *w, kiln_tensor_t *g) {
  kiln_nn__entry_t *e = w->e;
  kiln_tensor_t *ga = NULL;
  bool exclusive = true;
  kiln_status_t status = KILN_OK;
  switch ((kiln_binary_op_t)e->sub) {
  case KILN_BINARY_ADD:
  case KILN_BINARY_SUB: ga = pass_on(w, 1, &exclusive); break;
  case KILN_BINARY_MUL:
  case KILN_BINARY_DIV:
    status = kiln_tensor_binary_scalar((kiln_binary_op_t)e->sub, g, e->scalar, &ga);
    break;
  case KILN_BINARY_MAXIMUM:
  case KILN_BINARY_MINIMUM: {
    kiln_tensor_t *mask = NULL;
    status = kiln_tensor_eq(e->in[0].saved, e->out, &mask);
    if (status == KILN_OK) status = kiln_tensor_mul(g, mask, &ga);
    kiln_tensor_release(mask);
    break;
  }
  default: break;
  }
  if (status != KILN_OK || !ga) return status;
  return deliver(w, 0, ga, exclusive);
}

/* A gradient of a batched product summed over the batch when its operand was 2-D. */
static kiln_status_t matmul_give(walk_t *w, int i, kiln_tensor_t *t) {
  if (w->e->in[i].ndim == 2 && kiln_tensor_ndim(t) == 3) {
    kiln_tensor_t *summed = NULL;
    kiln_status_t status = kiln_tensor_sum(t, 0, false, &summed);
    kiln_tensor_release(t);
    if (status != KILN_OK) return status;
    t = summed;
  }
  return give(w, i, t, true);
}

static kiln_status_t back_matmul(walk_t *w, kiln_tensor_t *g) {
  kiln_nn__entry_t *e = w->e;
  const bool ta = e->flag_a, tb = e->flag_b;
  kiln_status_t status = KILN_OK;
  if (carries(e, 0)) {
    /* d op(a) = g op(b)^T; a = op(a)^T when transposed. */
    kiln_tensor_t *da = NULL, *b = e->in[1].saved;
    status = !ta ? kiln_tensor_matmul(g, b, false, !tb, &da) : kiln_tensor_matmul(b, g, tb, true, &da);
    if (status == KILN_OK) {
      status = matmul_give(w, 0, da);
    }
  }
  if (status == KILN_OK && carries(e, 1)) {
    kiln_tensor_t *db = NULL, *a = e->in[0].saved;
    status = !tb ? kiln_tensor_matmul(a, g, !ta, false, &db) : kiln_tensor_matmul(g, a, true, ta, &db);
    if (status == KILN_OK) {
      status = matmul_give(w, 1, db);
    }
  }
  return status;
}

static kiln_status_t back_linear(walk_t *w, kiln_tensor_t *g) {
  kiln_nn__entry_t *e = w->e;
  kiln_status_t status = KILN_OK;
  if (carries(e, 2)) {
    kiln_tensor_t *db = NULL;
    const kiln_nn__input_t *b = &e->in[2];
    status = b->shape[0] == kiln_tensor_shape(g)[1] ? kiln_tensor_sum(g, 0, false, &db)
                                                     : kiln_tensor_sum_to(g, b->ndim, b->shape, &db);
    if (status == KILN_OK) {
      status = deliver(w, 2, db, true);
    }
  }
  if (status == KILN_OK && carries(e, 1)) {
    kiln_tensor_t *dw = NULL; /* [out, in] = g^T x */
    status = kiln_tensor_matmul(g, e->in[0].saved, true, false, &dw);
    if (status == KILN_OK) {
      status = deliver(w, 1, dw, true);
    }
  }
  if (status == KILN_OK && carries(e, 0)) {
    kiln_tensor_t *dx = NULL; /* [N, in] = g W */
    status = kiln_tensor_matmul(g, e->in[1].saved, false, false, &dx);
    if (status == KILN_OK) {
      status = deliver(w, 0, dx, true);
    }
  }
  return status;
}

static kiln_status_t back_reduce(walk_t *w, kiln_tensor_t *g) {
  kiln_nn__entry_t *e = w->e;
  const kiln_nn__input_t *in = &e->in[0];
  kiln_status_t status = KILN_OK;
  kiln_tensor_t *scaled = NULL, *kept = NULL, *spread = NULL;
  int64_t kept_shape[KILN_MAX_DIMS];
  double count = 1;
  int axis = e->axis;
  if (axis == KILN_ALL_AXES) {
    for (int d = 0; d < in->ndim; d++) {
      kept_shape[d] = 1;
      count *= (double)in->shape[d];
    }
  } else {
    if (axis < 0) axis += in->ndim;
    for (int d = 0; d < in->ndim; d++) kept_shape[d] = d == axis ? 1 : in->shape[d];
    count = (double)in->shape[axis];
  }
  if (e->op == KILN_NN__T_MEAN) {
    status = kiln_tensor_div_scalar(g, count, &scaled);
  } else {
    scaled = kiln_tensor_retain(g);
  }
  /* Back to the kept-dims shape (a view), then spread over the reduced axes. */
  if (status == KILN_OK) status = kiln_tensor_reshape(scaled, in->ndim, kept_shape, &kept);
  if (status == KILN_OK) status = kiln_tensor_broadcast_to(kept, in->ndim, in->shape, &spread);
  kiln_tensor_release(scaled);
  kiln_tensor_release(kept);
  if (status != KILN_OK) return status;
  return deliver(w, 0, spread, true);
}

/* kiln_tensor_unary_backward, whose kernels are f32: a 16-bit x and dy of a
 * low-precision model are widened, the derivative taken in f32 and the result
 * rounded once back to x's dtype (exact for relu, whose gradient is dy or 0). */
static kiln_status_t unary_backward(kiln_unary_op_t op, const kiln_tensor_t *x, const kiln_tensor_t *dy,
                                    kiln_tensor_t **out) {
  const kiln_dtype_t dtype = kiln_tensor_dtype(x);
  if (dtype != KILN_F16 && dtype != KILN_BF16) return kiln_tensor_unary_backward(op, x, dy, out);
  kiln_tensor_t *x32 = NULL, *dy32 = NULL, *dx32 = NULL;
  kiln_status_t status = kiln_tensor_cast(x, KILN_F32, &x32);
  if (status == KILN_OK) status = kiln_tensor_cast(dy, KILN_F32, &dy32);
  if (status == KILN_OK) status = kiln_tensor_unary_backward(op, x32, dy32, &dx32);
  if (status == KILN_OK) status = kiln_tensor_cast(dx32, dtype, out);
  kiln_tensor_release(x32);
  kiln_tensor_release(dy32);
  kiln_tensor_release(dx32);
  return status;
}

/* kiln_tensor_conv2d_backward_bias, f32 only: a 16-bit dy is widened, summed
 * in f32 and the sum rounded once back to dy's dtype. */
static kiln_status_t conv2d_backward_bias(const kiln_tensor_t *dy, kiln_tensor_t **out) {
  const kiln_dtype_t dtype = kiln_tensor_dtype(dy);
  if (dtype != KILN_F16 && dtype != KILN_BF16) return kiln_tensor_conv2d_backward_bias(dy, out);
  kiln_tensor_t *dy32 = NULL, *db32 = NULL;
  kiln_status_t status = kiln_tensor_cast(dy, KILN_F32, &dy32);
  if (status == KILN_OK) status = kiln_tensor_conv2d_backward_bias(dy32, &db32);
  if (status == KILN_OK) status = kiln_tensor_cast(db32, dtype, out);
  kiln_tensor_release(dy32);
  kiln_tensor_release(db32);
  return status;
}

/* Run the backward of w->e with its gradient w->g. */
static kiln_status_t back_entry(walk_t *w) {
  kiln_nn__entry_t *e = w->e;
  kiln_tensor_t *g = NULL, *dx = NULL;
  kiln_status_t status;
  if (e->op == KILN_NN__T_CROSS_ENTROPY) {
    /* The implicit 1 needs no tensor: the fused kernel takes NULL for it. */
    status = kiln_tensor_cross_entropy_backward(e->in[0].saved, e->in[1].saved, w->g.t, &dx);
    if (status != KILN_OK) return status;
    return deliver(w, 0, dx, true);
  }
  status = upstream(w, &g);
  if (status != KILN_OK) return status;
  switch (e->op) {
  case KILN_NN__T_UNARY:
    status = unary_backward((kiln_unary_op_t)e->sub, e->in[0].saved, g, &dx);
    if (status == KILN_OK) {
      status = deliver(w, 0, dx, true);
    }
    return status;
  case KILN_NN__T_BINARY: return back_binary(w, g);
  case KILN_NN__T_BINARY_SCALAR: return back_binary_scalar(w, g);
  case KILN_NN__T_MATMUL: return back_matmul(w, g);
  case KILN_NN__T_LINEAR: return back_linear(w, g);
  case KILN_NN__T_SUM:
  case KILN_NN__T_MEAN: return back_reduce(w, g);
  case KILN_NN__T_SOFTMAX:
    status = kiln_tensor_softmax_backward(e->out, g, e->sub != 0, &dx);
    if (status == KILN_OK) {
      status = deliver(w, 0, dx, true);
    }
    return status;
  case KILN_NN__T_CONV2D:
    if (carries(e, 2)) {
      status = conv2d_backward_bias(g, &dx);
      if (status == KILN_OK) {
        status = deliver(w, 2, dx, true);
      }
    }
    if (status == KILN_OK && carries(e, 1)) {
      const kiln_nn__input_t *wt = &e->in[1];
      status = kiln_tensor_conv2d_backward_weight(e->in[0].saved, g, wt->shape, &e->p.conv, &dx);
      if (status == KILN_OK) {
        status = deliver(w, 1, dx, true);
      }
    }
    if (status == KILN_OK && carries(e, 0)) {
      status = kiln_tensor_conv2d_backward_input(g, e->in[1].saved, e->in[0].shape, &e->p.conv, &dx);
      if (status == KILN_OK) {
        status = deliver(w, 0, dx, true);
      }
    }
    return status;
  case KILN_NN__T_MAX_POOL2D:
    status = kiln_tensor_max_pool2d_backward(e->in[0].saved, g, &e->p.pool, &dx);
    if (status == KILN_OK) {
      status = deliver(w, 0, dx, true);
    }
    return status;
  case KILN_NN__T_RESHAPE: {
    /* A view of g: as exclusive as g, once our reference to g is gone. */
    status = kiln_tensor_reshape(g, e->in[0].ndim, e->in[0].shape, &dx);
    if (status == KILN_OK) status = deliver(w, 0, dx, w->g.exclusive);
    return status;
  }
  case KILN_NN__T_CAST: {
    /* The gradient goes back in the input's dtype (torch.autocast's rule):
     * an f32 loss gradient rounds once into f16 or bf16 here. */
    status = kiln_tensor_cast(g, (kiln_dtype_t)e->sub, &dx);
    if (status == KILN_OK) status = deliver(w, 0, dx, true);
    return status;
  }
  case KILN_NN__T_INDEX_SELECT: {
    /* dx: zeros of x's shape, dy's slices added at the indices (repeated
     * ones adding up): kiln_tensor_index_add, in x's dtype. */
    const kiln_nn__input_t *in = &e->in[0];
    status = kiln_tensor_zeros(kiln_tensor_device(g), kiln_tensor_dtype(g), in->ndim, in->shape, &dx);
    if (status == KILN_OK) status = kiln_tensor_index_add(dx, e->axis, in->saved, g, 1.0);
    if (status == KILN_OK) status = deliver(w, 0, dx, true);
    else kiln_tensor_release(dx);
    return status;
  }
  case KILN_NN__T_CROSS_ENTROPY: break;
  }
  return KILN_OK;
}

/* ---- the pass --------------------------------------------------------------------- */

kiln_status_t kiln_nn_tape_backward(kiln_nn_tape_t *tape, kiln_tensor_t *y, const kiln_tensor_t *dy) {
  static const char call[] = "kiln_nn_tape_backward";
  if (!tape || !y) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !tape ? "tape" : "y");
  size_t k = tape->count;
  for (size_t i = tape->count; i-- > 0;)
    if (tape->entries[i].out == y) {
      k = i;
      break;
    }
  if (k == tape->count)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "%s: y is not a result recorded on this tape (%zu ops recorded): it carries no gradient (no "
                          "watched parameter reaches it) or the record was cleared by an earlier backward pass",
                          call, tape->count);
  if (!dy && kiln_tensor_numel(y) != 1)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "%s: y has %lld elements and dy is NULL; pass dy of y's shape (NULL means 1 for one element)",
                          call, (long long)kiln_tensor_numel(y));
  if (dy && !same_shape(dy, kiln_tensor_ndim(y), kiln_tensor_shape(y)))
    return kiln_set_error(KILN_SHAPE_MISMATCH, "%s: dy has %d dims and %lld elements, y %d and %lld; pass dy of y's shape",
                          call, kiln_tensor_ndim(dy), (long long)kiln_tensor_numel(dy), kiln_tensor_ndim(y),
                          (long long)kiln_tensor_numel(y));
  if (dy && kiln_tensor_dtype(dy) != kiln_tensor_dtype(y))
    return kiln_set_error(KILN_DTYPE_MISMATCH, "%s: dy is %s and y %s; pass dy of y's dtype (kiln_tensor_cast)", call,
                          kiln_dtype_name(kiln_tensor_dtype(dy)), kiln_dtype_name(kiln_tensor_dtype(y)));
  if (dy && kiln_tensor_device(dy) != kiln_tensor_device(y))
    return kiln_set_error(KILN_DEVICE_MISMATCH, "%s: dy lives on %s and y on %s; move dy there first (kiln_tensor_to)",
                          call, kiln_device_selector(kiln_tensor_device(dy)), kiln_device_selector(kiln_tensor_device(y)));
  if (tape->grad_capacity < k + 1) {
    size_t cap = tape->capacity > k + 1 ? tape->capacity : k + 1;
    kiln_nn__grad_t *grown = realloc(tape->grads, cap * sizeof *grown);
    if (!grown) return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate %zu gradient slots", call, cap);
    tape->grads = grown;
    tape->grad_capacity = cap;
  }
  for (size_t i = 0; i <= k; i++) tape->grads[i] = (kiln_nn__grad_t){NULL, false, false};
  tape->grads[k] = dy ? (kiln_nn__grad_t){kiln_tensor_retain((kiln_tensor_t *)dy), false, false}
                      : (kiln_nn__grad_t){NULL, true, false};
  /* Ops recorded after y do not lead to it. */
  for (size_t i = k + 1; i < tape->count; i++) kiln_nn__entry_release(&tape->entries[i]);

  kiln_status_t status = KILN_OK;
  size_t failed = 0;
  const char *failed_op = "";
  for (size_t i = k + 1; i-- > 0;) {
    walk_t w = {tape, &tape->entries[i], tape->grads[i]};
    tape->grads[i] = (kiln_nn__grad_t){NULL, false, false};
    if (status == KILN_OK && (w.g.t || w.g.one)) {
      status = back_entry(&w);
      if (status != KILN_OK) {
        failed = i;
        failed_op = kiln_nn__tape_op_name(w.e);
      }
    }
    /* Consumed: what the entry held goes back to the pool now. */
    kiln_tensor_release(w.g.t);
    kiln_nn__entry_release(w.e);
  }
  tape->count = 0;
  tape->param_count = 0;
  if (status != KILN_OK)
    return kiln_wrap_error(status, "%s: the gradient of %s (op %zu of %zu recorded)", call, failed_op, failed + 1,
                           k + 1);
  return KILN_OK;
}
