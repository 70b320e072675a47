/* runtime/ops_train.c: the training operations: gradients of the forward ops, and updates that write into existing tensors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"

/* Every unary op of tensor.h must have a derivative next to its formula: a
 * missing one leaves its enumerator undeclared below and the build fails. */
enum {
#define KILN_UNARY_GRAD_FLOAT(NAME, expr) kiln_unary_grad_##NAME = 1,
#include "kernels/ops.def"
  kiln_ops_def_grad_end_
};
#define CHECK_GRAD_(NAME, name) \
  _Static_assert(kiln_unary_grad_##NAME, "unary " #name " has no derivative in kernels/ops.def");
KILN_UNARY_OPS(CHECK_GRAD_)
#undef CHECK_GRAD_

static bool same_shape(const kiln_tensor_t *a, const kiln_tensor_t *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

/* "a has [2, 3] but b [3, 2]; ..." */
static kiln_status_t shapes_differ(const char *call, const char *na, const kiln_tensor_t *a, const char *nb,
                                   const kiln_tensor_t *b, const char *fix) {
  char ta[128], tb[128];
  kiln__shape_text(a->ndim, a->shape, ta, sizeof ta);
  kiln__shape_text(b->ndim, b->shape, tb, sizeof tb);
  return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: %s is %s but %s is %s; %s", call, na, ta, nb, tb, fix);
}

/* ---- unary ---------------------------------------------------------------------------- */

kiln_status_t kiln_tensor_unary_backward(kiln_unary_op_t uop, const kiln_tensor_t *x, const kiln_tensor_t *dy,
                                         kiln_tensor_t **out_dx) {
  static const char call[] = "kiln_tensor_unary_backward";
  kiln_status_t status = kiln__op_need(call, "x", x);
  if (status == KILN_OK) status = kiln__op_need(call, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_out(call, out_dx);
  if (status != KILN_OK) return status;
  if ((unsigned)uop >= KILN_UNARY_COUNT_)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: op %d is not a kiln_unary_op_t; use KILN_UNARY_NEG ... KILN_UNARY_TANH",
                           call, (int)uop);
  status = kiln__op_same_device(call, "x", x, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_dtype(call, "unary_backward", "x", x, false);
  if (status == KILN_OK) status = kiln__op_need_dtype(call, "unary_backward", "dy", dy, false);
  if (status != KILN_OK) return status;
  if (!same_shape(x, dy)) return shapes_differ(call, "x", x, "dy", dy, "pass the gradient of f(x), of x's shape");
  kiln_op_t op;
  op.kind = KILN_OP_UNARY_BACKWARD;
  op.n_in = 2;
  op.u.unary.op = uop;
  kiln__tensor_view(x, &op.in[0]);
  kiln__tensor_view(dy, &op.in[1]);
  const kiln_tensor_t *inputs[2] = {x, dy};
  return kiln__op_enqueue(call, x->buffer->device, &op, KILN_F32, x->ndim, x->shape, inputs, out_dx);
}

/* ---- sums to a broadcast shape, and back ---------------------------------------------------- */

/* Whether `shape` broadcasts to t's shape (right-aligned; each size equal or
 * 1; no more dims than t). */
static kiln_status_t check_broadcasts(const char *call, int ndim, const int64_t *shape, const kiln_tensor_t *t,
                                      const char *what) {
  char ts[128], tt[128];
  if (ndim < 0 || ndim > KILN_MAX_DIMS || (ndim > 0 && !shape))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: ndim %d with shape %p; pass 0..%d sizes", call, ndim,
                           (const void *)shape, KILN_MAX_DIMS);
  kiln__shape_text(ndim, shape, ts, sizeof ts);
  kiln__shape_text(t->ndim, t->shape, tt, sizeof tt);
  if (ndim > t->ndim)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: %s %s has more dimensions than %s; %s", call, what, ts, tt,
                           "a broadcast shape has at most as many");
  for (int i = 0; i < ndim; i++) {
    int64_t want = shape[ndim - 1 - i], have = t->shape[t->ndim - 1 - i];
    if (want < 0)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: size %lld of %s %s is negative", call, (long long)want, what,
                             ts);
    if (want != have && want != 1)
      return kiln__set_error(KILN_SHAPE_MISMATCH,
                             "%s: %s %s does not broadcast to %s (dimension %d: %lld vs %lld); sizes must match or be 1",
                             call, what, ts, tt, ndim - 1 - i, (long long)want, (long long)have);
  }
  return KILN_OK;
}

kiln_status_t kiln_tensor_sum_to(const kiln_tensor_t *a, int ndim, const int64_t *shape, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_sum_to";
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "sum_to", "a", a, KILN__DT_ALL);
  if (status == KILN_OK) status = check_broadcasts(call, ndim, shape, a, "shape");
  if (status != KILN_OK) return status;
  /* Group a's dims into runs that are all reduced or all kept (a dim of
   * size 1 is neither: it joins any run), then reduce the runs one by one
   * with REDUCE over [outer, len, inner], innermost first: at most as many
   * passes as there are reduced runs, each a well-tuned reduction. */
  int64_t sizes[KILN_MAX_DIMS];
  bool reduced[KILN_MAX_DIMS];
  int runs = 0;
  const int lead = a->ndim - ndim;
  for (int i = 0; i < a->ndim; i++) {
    int64_t extent = a->shape[i];
    bool r = i < lead || shape[i - lead] != extent;
    if (extent == 1) continue;
    if (runs > 0 && reduced[runs - 1] == r) {
      sizes[runs - 1] *= extent;
    } else {
      sizes[runs] = extent;
      reduced[runs] = r;
      runs++;
    }
  }
  kiln_tensor_t *cur = NULL;
  bool summed = false;
  status = kiln__op_dense(call, a, &cur);
  if (status != KILN_OK) return status;
  for (int g = runs - 1; g >= 0 && status == KILN_OK; g--) {
    if (!reduced[g]) continue;
    summed = true;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < g; i++) outer *= sizes[i];
    for (int i = g + 1; i < runs; i++) inner *= sizes[i];
    const int64_t view_shape[3] = {outer, sizes[g], inner}, result_shape[2] = {outer, inner};
    kiln_tensor_t *view = NULL, *next = NULL;
    status = kiln_tensor_reshape(cur, 3, view_shape, &view);
    if (status == KILN_OK) {
      kiln_op_t op;
      op.kind = KILN_OP_REDUCE;
      op.n_in = 1;
      op.u.reduce.op = KILN_REDUCE_SUM;
      op.u.reduce.outer = outer;
      op.u.reduce.len = sizes[g];
      op.u.reduce.inner = inner;
      kiln__tensor_view(view, &op.in[0]);
      const kiln_tensor_t *inputs[1] = {view};
      /* Out in a's dtype, unlike kiln_tensor_sum's i64 for integers: a
       * gradient keeps its operand's dtype (the kernel wraps the i64 sum). */
      status = kiln__op_enqueue(call, a->buffer->device, &op, a->dtype, 2, result_shape, inputs, &next);
    }
    kiln_tensor_release(view);
    kiln_tensor_release(cur);
    cur = next;
    sizes[g] = 1;
  }
  /* Nothing to sum: still a new tensor, never a view of a (an update of the
   * result must not write into a). */
  if (status == KILN_OK && !summed) {
    kiln_tensor_t *copy = NULL;
    status = kiln_tensor_copy(cur, a->buffer->device, &copy);
    kiln_tensor_release(cur);
    cur = copy;
  }
  if (status == KILN_OK) status = kiln_tensor_reshape(cur, ndim, shape, out);
  kiln_tensor_release(cur);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}

kiln_status_t kiln_tensor_broadcast_to(const kiln_tensor_t *a, int ndim, const int64_t *shape, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_broadcast_to";
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "broadcast_to", "a", a, KILN__DT_ALL);
  if (status != KILN_OK) return status;
  if (ndim < 0 || ndim > KILN_MAX_DIMS || (ndim > 0 && !shape))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: ndim %d with shape %p; pass 0..%d sizes", call, ndim,
                           (const void *)shape, KILN_MAX_DIMS);
  /* a's shape must broadcast to `shape`: the rule the other way round. */
  char ta[128], ts[128];
  kiln__shape_text(a->ndim, a->shape, ta, sizeof ta);
  kiln__shape_text(ndim, shape, ts, sizeof ts);
  if (a->ndim > ndim)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: a %s has more dimensions than the shape %s", call, ta, ts);
  for (int i = 0; i < a->ndim; i++) {
    int64_t have = a->shape[a->ndim - 1 - i], want = shape[ndim - 1 - i];
    if (have != want && have != 1)
      return kiln__set_error(KILN_SHAPE_MISMATCH,
                             "%s: a %s does not broadcast to %s (dimension %d: %lld vs %lld); sizes must match or be 1",
                             call, ta, ts, ndim - 1 - i, (long long)have, (long long)want);
  }
  status = kiln__shape_check(call, ndim, shape, a->dtype, NULL, NULL);
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_COPY;
  op.n_in = 1;
  kiln__broadcast_view(a, ndim, shape, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {a};
  return kiln__op_enqueue(call, a->buffer->device, &op, a->dtype, ndim, shape, inputs, out);
}

/* ---- softmax and cross-entropy ---------------------------------------------------------------- */

kiln_status_t kiln_tensor_softmax_backward(const kiln_tensor_t *y, const kiln_tensor_t *dy, bool log,
                                           kiln_tensor_t **out_dx) {
  static const char call[] = "kiln_tensor_softmax_backward";
  kiln_status_t status = kiln__op_need(call, "y", y);
  if (status == KILN_OK) status = kiln__op_need(call, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_out(call, out_dx);
  if (status == KILN_OK) status = kiln__op_same_device(call, "y", y, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_dtype(call, "softmax_backward", "y", y, false);
  if (status == KILN_OK) status = kiln__op_need_dtype(call, "softmax_backward", "dy", dy, false);
  if (status != KILN_OK) return status;
  if (!same_shape(y, dy)) return shapes_differ(call, "y", y, "dy", dy, "pass the forward's result and its gradient");
  const int64_t numel = kiln_tensor_numel(y), cols = y->ndim ? y->shape[y->ndim - 1] : 1;
  kiln_op_t op;
  op.kind = KILN_OP_SOFTMAX_BACKWARD;
  op.n_in = 2;
  op.u.softmax.cols = cols;
  op.u.softmax.rows = cols ? numel / cols : 0;
  op.u.softmax.log = log;
  if (numel == 0) return kiln__op_enqueue(call, y->buffer->device, &op, KILN_F32, y->ndim, y->shape, NULL, out_dx);
  kiln_tensor_t *dense_y = NULL, *dense_dy = NULL;
  status = kiln__op_dense(call, y, &dense_y);
  if (status == KILN_OK) status = kiln__op_dense(call, dy, &dense_dy);
  if (status == KILN_OK) {
    kiln__tensor_view(dense_y, &op.in[0]);
    kiln__tensor_view(dense_dy, &op.in[1]);
    const kiln_tensor_t *inputs[2] = {dense_y, dense_dy};
    status = kiln__op_enqueue(call, y->buffer->device, &op, KILN_F32, y->ndim, y->shape, inputs, out_dx);
  }
  kiln_tensor_release(dense_y);
  kiln_tensor_release(dense_dy);
  return status;
}

kiln_status_t kiln_tensor_cross_entropy_backward(const kiln_tensor_t *logits, const kiln_tensor_t *labels,
                                                 const kiln_tensor_t *dloss, kiln_tensor_t **out_dlogits) {
  static const char call[] = "kiln_tensor_cross_entropy_backward";
  kiln_status_t status = kiln__op_need(call, "logits", logits);
  if (status == KILN_OK) status = kiln__op_need(call, "labels", labels);
  if (status == KILN_OK) status = kiln__op_need_out(call, out_dlogits);
  if (status == KILN_OK) status = kiln__op_same_device(call, "logits", logits, "labels", labels);
  if (status == KILN_OK && dloss) status = kiln__op_same_device(call, "logits", logits, "dloss", dloss);
  if (status != KILN_OK) return status;
  if (logits->dtype != KILN_F32 || labels->dtype != KILN_I32 || (dloss && dloss->dtype != KILN_F32))
    return kiln__set_error(KILN_DTYPE_MISMATCH, "%s: logits are %s, labels %s%s%s; pass f32 logits, i32 labels and an "
                           "f32 dloss", call, kiln_dtype_name(logits->dtype), kiln_dtype_name(labels->dtype),
                           dloss ? ", dloss " : "", dloss ? kiln_dtype_name(dloss->dtype) : "");
  if (logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0]) {
    char tl[128], tb[128];
    kiln__shape_text(logits->ndim, logits->shape, tl, sizeof tl);
    kiln__shape_text(labels->ndim, labels->shape, tb, sizeof tb);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: logits %s and labels %s; pass logits [N, C] and labels [N]", call,
                           tl, tb);
  }
  if (dloss && kiln_tensor_numel(dloss) != 1)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: dloss has %lld elements; pass a one-element tensor (or NULL for 1)",
                           call, (long long)kiln_tensor_numel(dloss));
  kiln_op_t op;
  op.kind = KILN_OP_CROSS_ENTROPY_BACKWARD;
  op.n_in = dloss ? 3 : 2;
  op.u.cross_entropy.n = logits->shape[0];
  op.u.cross_entropy.c = logits->shape[1];
  if (kiln_tensor_numel(logits) == 0)
    return kiln__op_enqueue(call, logits->buffer->device, &op, KILN_F32, 2, logits->shape, NULL, out_dlogits);
  kiln_tensor_t *dl = NULL, *db = NULL, *dd = NULL;
  status = kiln__op_dense(call, logits, &dl);
  if (status == KILN_OK) status = kiln__op_dense(call, labels, &db);
  if (status == KILN_OK && dloss) status = kiln__op_dense(call, dloss, &dd);
  if (status == KILN_OK) {
    kiln__tensor_view(dl, &op.in[0]);
    kiln__tensor_view(db, &op.in[1]);
    if (dd) kiln__tensor_view(dd, &op.in[2]);
    const kiln_tensor_t *inputs[3] = {dl, db, dd};
    status = kiln__op_enqueue(call, logits->buffer->device, &op, KILN_F32, 2, logits->shape, inputs, out_dlogits);
  }
  kiln_tensor_release(dl);
  kiln_tensor_release(db);
  kiln_tensor_release(dd);
  return status;
}

/* ---- convolution and pooling ---------------------------------------------------------------- */

/* The sizes of one convolution from x [N,C,H,W], w [K,C,R,S] and params,
 * checked as the forward checks them, with P and Q. */
static kiln_status_t conv_geometry(const char *call, const int64_t x[4], const int64_t w[4],
                                   const kiln_conv2d_params_t *params, kiln_op_t *op) {
  kiln_conv2d_params_t p = params ? *params : kiln_conv2d_params_default();
  for (int i = 0; i < 2; i++)
    if (p.stride[i] < 1 || p.padding[i] < 0 || p.dilation[i] < 1)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: stride (%d, %d), padding (%d, %d), dilation (%d, %d): strides and dilations must be "
                             ">= 1 and paddings >= 0",
                             call, p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0], p.dilation[1]);
  char tx[128], tw[128];
  kiln__shape_text(4, x, tx, sizeof tx);
  kiln__shape_text(4, w, tw, sizeof tw);
  for (int i = 0; i < 4; i++)
    if (x[i] < 0 || w[i] < 0)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: x %s and weight %s: sizes must be >= 0", call, tx, tw);
  if (x[1] != w[1])
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: x has %lld channels but weight expects %lld (x %s, weight %s)", call,
                           (long long)x[1], (long long)w[1], tx, tw);
  if (w[1] < 1 || w[2] < 1 || w[3] < 1)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: weight %s has an empty channel or window dimension; C, R, S must be >= 1",
                           call, tw);
  int64_t P = kiln__window_out(x[2], p.padding[0], p.dilation[0], w[2], p.stride[0]);
  int64_t Q = kiln__window_out(x[3], p.padding[1], p.dilation[1], w[3], p.stride[1]);
  if (P < 1 || Q < 1)
    return kiln__set_error(KILN_SHAPE_MISMATCH,
                           "%s: the %lldx%lld window (dilation %dx%d) does not fit x %s with padding %dx%d", call,
                           (long long)w[2], (long long)w[3], p.dilation[0], p.dilation[1], tx, p.padding[0],
                           p.padding[1]);
  op->u.conv2d.n = x[0];
  op->u.conv2d.c = x[1];
  op->u.conv2d.h = x[2];
  op->u.conv2d.w = x[3];
  op->u.conv2d.k = w[0];
  op->u.conv2d.r = w[2];
  op->u.conv2d.s = w[3];
  op->u.conv2d.p = P;
  op->u.conv2d.q = Q;
  for (int i = 0; i < 2; i++) {
    op->u.conv2d.stride[i] = p.stride[i];
    op->u.conv2d.pad[i] = p.padding[i];
    op->u.conv2d.dil[i] = p.dilation[i];
  }
  op->u.conv2d.has_bias = false;
  return KILN_OK;
}

/* dy must be [N, K, P, Q] of the convolution in op. */
static kiln_status_t check_dy(const char *call, const kiln_tensor_t *dy, const kiln_op_t *op) {
  const int64_t want[4] = {op->u.conv2d.n, op->u.conv2d.k, op->u.conv2d.p, op->u.conv2d.q};
  if (dy->ndim == 4 && !memcmp(dy->shape, want, sizeof want)) return KILN_OK;
  char td[128], tw[128];
  kiln__shape_text(dy->ndim, dy->shape, td, sizeof td);
  kiln__shape_text(4, want, tw, sizeof tw);
  return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: dy is %s but the convolution's result is %s; pass the gradient of "
                         "that result", call, td, tw);
}

/* Run one backward conv kind with two inputs made contiguous. */
static kiln_status_t conv_run(const char *call, kiln_op_t *op, const kiln_tensor_t *a, const kiln_tensor_t *b,
                              const int64_t out_shape[4], kiln_tensor_t **out) {
  kiln_device_t *device = a->buffer->device;
  if (kiln__numel(4, out_shape) == 0) return kiln__op_enqueue(call, device, op, a->dtype, 4, out_shape, NULL, out);
  kiln_tensor_t *da = NULL, *db = NULL;
  kiln_status_t status = kiln__op_dense(call, a, &da);
  if (status == KILN_OK) status = kiln__op_dense(call, b, &db);
  if (status == KILN_OK) {
    op->n_in = 2;
    kiln__tensor_view(da, &op->in[0]);
    kiln__tensor_view(db, &op->in[1]);
    const kiln_tensor_t *inputs[2] = {da, db};
    status = kiln__op_enqueue(call, device, op, a->dtype, 4, out_shape, inputs, out);
  }
  kiln_tensor_release(da);
  kiln_tensor_release(db);
  return status;
}

kiln_status_t kiln_tensor_conv2d_backward_input(const kiln_tensor_t *dy, const kiln_tensor_t *weight,
                                                const int64_t x_shape[4], const kiln_conv2d_params_t *params,
                                                kiln_tensor_t **out_dx) {
  static const char call[] = "kiln_tensor_conv2d_backward_input";
  kiln_status_t status = kiln__op_need(call, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need(call, "weight", weight);
  if (status == KILN_OK) status = kiln__op_need_out(call, out_dx);
  if (status == KILN_OK && !x_shape)
    status = kiln__set_error(KILN_INVALID_ARGUMENT, "%s: x_shape is NULL; pass the forward input's [N, C, H, W]", call);
  if (status == KILN_OK) status = kiln__op_same_device(call, "dy", dy, "weight", weight);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "conv2d_backward_input", "dy", dy, KILN__DT_FLOAT32ISH);
  if (status == KILN_OK) status = kiln__op_same_dtype(call, "conv2d_backward_input", "dy", dy, "weight", weight);
  if (status != KILN_OK) return status;
  if (weight->ndim != 4) {
    char tw[128];
    kiln__shape_text(weight->ndim, weight->shape, tw, sizeof tw);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: weight %s; pass weight [K, C, R, S]", call, tw);
  }
  kiln_op_t op;
  op.kind = KILN_OP_CONV2D_BACKWARD_INPUT;
  status = conv_geometry(call, x_shape, weight->shape, params, &op);
  if (status == KILN_OK) status = check_dy(call, dy, &op);
  if (status == KILN_OK) status = kiln__shape_check(call, 4, x_shape, dy->dtype, NULL, NULL);
  if (status != KILN_OK) return status;
  return conv_run(call, &op, dy, weight, x_shape, out_dx);
}

kiln_status_t kiln_tensor_conv2d_backward_weight(const kiln_tensor_t *x, const kiln_tensor_t *dy,
                                                 const int64_t w_shape[4], const kiln_conv2d_params_t *params,
                                                 kiln_tensor_t **out_dw) {
  static const char call[] = "kiln_tensor_conv2d_backward_weight";
  kiln_status_t status = kiln__op_need(call, "x", x);
  if (status == KILN_OK) status = kiln__op_need(call, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_out(call, out_dw);
  if (status == KILN_OK && !w_shape)
    status = kiln__set_error(KILN_INVALID_ARGUMENT, "%s: w_shape is NULL; pass the weight's [K, C, R, S]", call);
  if (status == KILN_OK) status = kiln__op_same_device(call, "x", x, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "conv2d_backward_weight", "x", x, KILN__DT_FLOAT32ISH);
  if (status == KILN_OK) status = kiln__op_same_dtype(call, "conv2d_backward_weight", "x", x, "dy", dy);
  if (status != KILN_OK) return status;
  if (x->ndim != 4) {
    char tx[128];
    kiln__shape_text(x->ndim, x->shape, tx, sizeof tx);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: x %s; pass x [N, C, H, W]", call, tx);
  }
  kiln_op_t op;
  op.kind = KILN_OP_CONV2D_BACKWARD_WEIGHT;
  status = conv_geometry(call, x->shape, w_shape, params, &op);
  if (status == KILN_OK) status = check_dy(call, dy, &op);
  if (status == KILN_OK) status = kiln__shape_check(call, 4, w_shape, x->dtype, NULL, NULL);
  if (status != KILN_OK) return status;
  return conv_run(call, &op, x, dy, w_shape, out_dw);
}

kiln_status_t kiln_tensor_conv2d_backward_bias(const kiln_tensor_t *dy, kiln_tensor_t **out_db) {
  static const char call[] = "kiln_tensor_conv2d_backward_bias";
  kiln_status_t status = kiln__op_need(call, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_out(call, out_db);
  if (status == KILN_OK) status = kiln__op_need_dtype(call, "conv2d_backward_bias", "dy", dy, false);
  if (status != KILN_OK) return status;
  if (dy->ndim != 4) {
    char td[128];
    kiln__shape_text(dy->ndim, dy->shape, td, sizeof td);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: dy %s; pass the gradient of a conv2d result [N, K, P, Q]", call, td);
  }
  const int64_t keep[4] = {1, dy->shape[1], 1, 1};
  kiln_tensor_t *summed = NULL;
  status = kiln_tensor_sum_to(dy, 4, keep, &summed);
  if (status == KILN_OK) status = kiln_tensor_reshape(summed, 1, &dy->shape[1], out_db);
  kiln_tensor_release(summed);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}

kiln_status_t kiln_tensor_max_pool2d_backward(const kiln_tensor_t *x, const kiln_tensor_t *dy,
                                              const kiln_pool2d_params_t *params, kiln_tensor_t **out_dx) {
  static const char call[] = "kiln_tensor_max_pool2d_backward";
  kiln_status_t status = kiln__op_need(call, "x", x);
  if (status == KILN_OK) status = kiln__op_need(call, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_out(call, out_dx);
  if (status == KILN_OK) status = kiln__op_same_device(call, "x", x, "dy", dy);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "max_pool2d_backward", "x", x, KILN__DT_FLOAT32ISH);
  if (status == KILN_OK) status = kiln__op_same_dtype(call, "max_pool2d_backward", "x", x, "dy", dy);
  if (status != KILN_OK) return status;
  if (!params)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: params is NULL; pass the forward's kernel size (and stride, padding)",
                           call);
  kiln_pool2d_params_t p = *params;
  for (int i = 0; i < 2; i++) {
    if (p.stride[i] == 0) p.stride[i] = p.kernel[i];
    if (p.kernel[i] < 1 || p.stride[i] < 1 || p.padding[i] < 0 || p.padding[i] > p.kernel[i] / 2)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: kernel (%d, %d), stride (%d, %d), padding (%d, %d): kernels and strides must be >= 1 "
                             "and each padding within [0, kernel/2]",
                             call, params->kernel[0], params->kernel[1], params->stride[0], params->stride[1],
                             params->padding[0], params->padding[1]);
  }
  char tx[128];
  kiln__shape_text(x->ndim, x->shape, tx, sizeof tx);
  if (x->ndim != 4) return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: x %s; pass x [N, C, H, W]", call, tx);
  int64_t P = kiln__window_out(x->shape[2], p.padding[0], 1, p.kernel[0], p.stride[0]);
  int64_t Q = kiln__window_out(x->shape[3], p.padding[1], 1, p.kernel[1], p.stride[1]);
  if (P < 1 || Q < 1)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: the %dx%d window does not fit x %s with padding %dx%d", call,
                           p.kernel[0], p.kernel[1], tx, p.padding[0], p.padding[1]);
  const int64_t want[4] = {x->shape[0], x->shape[1], P, Q};
  if (dy->ndim != 4 || memcmp(dy->shape, want, sizeof want) != 0) {
    char td[128], tw[128];
    kiln__shape_text(dy->ndim, dy->shape, td, sizeof td);
    kiln__shape_text(4, want, tw, sizeof tw);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: dy is %s but the pooling's result is %s; pass the gradient of that "
                           "result", call, td, tw);
  }
  kiln_op_t op;
  op.kind = KILN_OP_MAX_POOL2D_BACKWARD;
  op.n_in = 2;
  kiln__pooling_op_sizes(&op, x, P, Q, &p);
  if (kiln_tensor_numel(x) == 0)
    return kiln__op_enqueue(call, x->buffer->device, &op, x->dtype, 4, x->shape, NULL, out_dx);
  kiln_tensor_t *dx_ = NULL, *ddy = NULL;
  status = kiln__op_dense(call, x, &dx_);
  if (status == KILN_OK) status = kiln__op_dense(call, dy, &ddy);
  if (status == KILN_OK) {
    kiln__tensor_view(dx_, &op.in[0]);
    kiln__tensor_view(ddy, &op.in[1]);
    const kiln_tensor_t *inputs[2] = {dx_, ddy};
    status = kiln__op_enqueue(call, x->buffer->device, &op, x->dtype, 4, x->shape, inputs, out_dx);
  }
  kiln_tensor_release(dx_);
  kiln_tensor_release(ddy);
  return status;
}

/* ---- updates in place ------------------------------------------------------------------------ */

/* The dtypes of an update's gradient and of a mixed-precision copy. */
#define KILN_UPDATE_GRAD_DTYPES (KILN__DT(F32) | KILN__DT(F16) | KILN__DT(BF16))
#define KILN_UPDATE_COPY_DTYPES (KILN__DT(F16) | KILN__DT(BF16))

/* Every tensor of an update: present, contiguous, one device and shape, and
 * no two sharing memory (the kernels read and write them in one pass); each
 * of a dtype in its mask (dtypes[i]; NULL: f32 for all). */
static kiln_status_t check_update_dtypes(const char *call, int count, const char *const *names,
                                         const kiln_tensor_t *const *tensors, const uint32_t *dtypes) {
  for (int i = 0; i < count; i++) {
    kiln_status_t status = kiln__op_need(call, names[i], tensors[i]);
    if (status != KILN_OK) return status;
  }
  for (int i = 0; i < count; i++) {
    const kiln_tensor_t *t = tensors[i];
    kiln_status_t status = kiln__op_need_dtypes(call, "an update", names[i], t, dtypes ? dtypes[i] : KILN__DT(F32));
    if (status == KILN_OK && i > 0) status = kiln__op_same_device(call, names[0], tensors[0], names[i], t);
    if (status != KILN_OK) return status;
    if (i > 0 && !same_shape(tensors[0], t))
      return shapes_differ(call, names[0], tensors[0], names[i], t, "an update takes tensors of one shape");
    /* the second operand is the one only read */
    if (i != 1 && (status = kiln__buffer_check_writable(call, names[i], t->buffer)) != KILN_OK) return status;
    if (!kiln_tensor_is_contiguous(t))
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: %s is a strided view; updates write in place and take contiguous tensors (pass the "
                             "tensor itself, or kiln_tensor_contiguous of it and use that)",
                             call, names[i]);
    const size_t begin = kiln_tensor_offset_bytes(t), end = begin + (size_t)kiln_tensor_numel(t) * kiln_dtype_size(t->dtype);
    for (int j = 0; j < i; j++) {
      const kiln_tensor_t *u = tensors[j];
      const size_t ub = kiln_tensor_offset_bytes(u), ue = ub + (size_t)kiln_tensor_numel(u) * kiln_dtype_size(u->dtype);
      if (u->buffer == t->buffer && begin < ue && ub < end && kiln_tensor_numel(t) > 0)
        return kiln__set_error(KILN_INVALID_ARGUMENT,
                               "%s: %s and %s share memory; an update needs separate tensors for each", call,
                               names[j], names[i]);
    }
  }
  return KILN_OK;
}

static kiln_status_t check_update(const char *call, int count, const char *const *names,
                                  const kiln_tensor_t *const *tensors) {
  return check_update_dtypes(call, count, names, tensors, NULL);
}

/* The operand slots of an SGD or ADAM op: the gradient in[0] of its dtype,
 * and with a copy, the copy in in[3] (n_in 4), the unused slots between
 * carrying the gradient's shape and strides without a buffer, so that the
 * core's merge of dimensions sees every operand alike. */
static void update_copy_slot(kiln_op_t *op, const kiln_tensor_t *copy, const kiln_tensor_t **inputs) {
  op->u.update.copy = copy != NULL;
  if (!copy) return;
  for (int i = op->n_in; i < 3; i++) {
    op->in[i] = op->in[0];
    op->in[i].buffer = NULL;
    inputs[i] = NULL;
  }
  kiln__tensor_view(copy, &op->in[3]);
  inputs[3] = copy;
  op->n_in = 4;
}

/* value within the bounds, and a finite float that keeps its sign (the
 * kernels compute in f32: 1e39 would be inf there, 1e-50 would be 0). */
static kiln_status_t need_finite(const char *call, const char *name, double value, double low, bool low_open,
                                 double high, bool high_open) {
  bool in_range = isfinite(value) && (low_open ? value > low : value >= low) && (high_open ? value < high : value <= high);
  if (!in_range)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s = %g is outside %s%g, %g%s", call, name, value,
                           low_open ? "(" : "[", low, high, high_open ? ")" : "]");
  const float as_float = (float)value;
  if (!isfinite(as_float) || (value != 0 && as_float == 0))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: %s = %g is beyond what a float holds (the kernels compute in f32); use a value of "
                           "magnitude between 1e-38 and 3e38",
                           call, name, value);
  return KILN_OK;
}

kiln_status_t kiln_tensor_accumulate(kiln_tensor_t *a, double alpha, const kiln_tensor_t *b) {
  static const char call[] = "kiln_tensor_accumulate";
  const char *const names[2] = {"a", "b"};
  const kiln_tensor_t *tensors[2] = {a, b};
  kiln_status_t status = check_update(call, 2, names, tensors);
  if (status == KILN_OK && !(isfinite(alpha) && isfinite((float)alpha)))
    status = kiln__set_error(KILN_INVALID_ARGUMENT, "%s: alpha = %g; pass a number finite as a float", call, alpha);
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_ACCUMULATE;
  op.n_in = 1;
  memset(&op.u.update, 0, sizeof op.u.update);
  op.u.update.alpha = (float)alpha;
  kiln__tensor_view(b, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {b};
  return kiln__op_enqueue_into(call, &op, a, inputs);
}

kiln_status_t kiln_tensor_sgd_update(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *momentum_buf,
                                     const kiln_sgd_params_t *params) {
  return kiln_tensor_sgd_update_mixed(param, grad, momentum_buf, NULL, params);
}

kiln_status_t kiln_tensor_sgd_update_mixed(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *momentum_buf,
                                           kiln_tensor_t *copy, const kiln_sgd_params_t *params) {
  const char *call = copy ? "kiln_tensor_sgd_update_mixed" : "kiln_tensor_sgd_update";
  if (!params) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: params is NULL; pass the learning rate and the rest", call);
  const kiln_sgd_params_t p = *params;
  kiln_status_t status = need_finite(call, "lr", p.lr, 0, true, INFINITY, true);
  if (status == KILN_OK) status = need_finite(call, "momentum", p.momentum, 0, false, INFINITY, true);
  if (status == KILN_OK) status = need_finite(call, "dampening", p.dampening, 0, false, 1, false);
  if (status == KILN_OK) status = need_finite(call, "weight_decay", p.weight_decay, 0, false, INFINITY, true);
  if (status == KILN_OK && p.nesterov && (p.momentum <= 0 || p.dampening != 0))
    status = kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: nesterov needs momentum > 0 and dampening 0 (got momentum %g, dampening %g)", call,
                             p.momentum, p.dampening);
  if (status == KILN_OK && p.momentum > 0 && !momentum_buf)
    status = kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: momentum_buf is NULL with momentum %g; pass a zero-initialised tensor of param's "
                             "shape (kiln_tensor_zeros)", call, p.momentum);
  if (status != KILN_OK) return status;
  const bool with_buffer = p.momentum > 0;
  const char *const names[4] = {"param", "grad", with_buffer ? "momentum_buf" : "copy", "copy"};
  const kiln_tensor_t *tensors[4] = {param, grad, with_buffer ? momentum_buf : copy, copy};
  const uint32_t dtypes[4] = {KILN__DT(F32), KILN_UPDATE_GRAD_DTYPES, with_buffer ? KILN__DT(F32) : KILN_UPDATE_COPY_DTYPES,
                              KILN_UPDATE_COPY_DTYPES};
  status = check_update_dtypes(call, (with_buffer ? 3 : 2) + (copy != NULL), names, tensors, dtypes);
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_SGD_UPDATE;
  op.n_in = with_buffer ? 2 : 1;
  memset(&op.u.update, 0, sizeof op.u.update);
  op.u.update.lr = (float)p.lr;
  op.u.update.momentum = (float)p.momentum;
  /* torch.optim.SGD's first step sets the buffer to g: with a zero buffer,
   * that is dampening 0. */
  op.u.update.dampening = p.first_step ? 0.0f : (float)p.dampening;
  op.u.update.weight_decay = (float)p.weight_decay;
  op.u.update.nesterov = p.nesterov;
  op.u.update.has_buf = with_buffer;
  kiln__tensor_view(grad, &op.in[0]);
  if (with_buffer) kiln__tensor_view(momentum_buf, &op.in[1]);
  const kiln_tensor_t *inputs[4] = {grad, with_buffer ? momentum_buf : NULL, NULL, NULL};
  update_copy_slot(&op, copy, inputs);
  return kiln__op_enqueue_into(call, &op, param, inputs);
}

kiln_status_t kiln_tensor_adam_update(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *m,
                                      kiln_tensor_t *v, int64_t step, const kiln_adam_params_t *params) {
  return kiln_tensor_adam_update_mixed(param, grad, m, v, NULL, step, params);
}

kiln_status_t kiln_tensor_adam_update_mixed(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *m,
                                            kiln_tensor_t *v, kiln_tensor_t *copy, int64_t step,
                                            const kiln_adam_params_t *params) {
  const char *call = copy ? "kiln_tensor_adam_update_mixed" : "kiln_tensor_adam_update";
  if (!params) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: params is NULL; pass the learning rate and the rest", call);
  const kiln_adam_params_t p = *params;
  kiln_status_t status = need_finite(call, "lr", p.lr, 0, true, INFINITY, true);
  if (status == KILN_OK) status = need_finite(call, "beta1", p.beta1, 0, false, 1, true);
  if (status == KILN_OK) status = need_finite(call, "beta2", p.beta2, 0, false, 1, true);
  if (status == KILN_OK) status = need_finite(call, "eps", p.eps, 0, true, INFINITY, true);
  if (status == KILN_OK) status = need_finite(call, "weight_decay", p.weight_decay, 0, false, INFINITY, true);
  if (status == KILN_OK && step < 1)
    status = kiln__set_error(KILN_INVALID_ARGUMENT, "%s: step = %lld; count updates from 1", call, (long long)step);
  if (status != KILN_OK) return status;
  const char *const names[5] = {"param", "grad", "m", "v", "copy"};
  const kiln_tensor_t *tensors[5] = {param, grad, m, v, copy};
  const uint32_t dtypes[5] = {KILN__DT(F32), KILN_UPDATE_GRAD_DTYPES, KILN__DT(F32), KILN__DT(F32),
                              KILN_UPDATE_COPY_DTYPES};
  status = check_update_dtypes(call, copy ? 5 : 4, names, tensors, dtypes);
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_ADAM_UPDATE;
  op.n_in = 3;
  memset(&op.u.update, 0, sizeof op.u.update);
  op.u.update.lr = (float)p.lr;
  op.u.update.beta1 = (float)p.beta1;
  op.u.update.beta2 = (float)p.beta2;
  op.u.update.eps = (float)p.eps;
  op.u.update.weight_decay = (float)p.weight_decay;
  /* The constants in double from the caller's values, rounded once, as
   * torch.optim.Adam folds them in Python: 1 - beta of the float beta would
   * be off by up to 1.3e-5 relative (beta2 = 0.999), and beta^step
   * underflows gracefully in double. */
  const double bias1 = 1.0 - pow(p.beta1, (double)step), bias2 = 1.0 - pow(p.beta2, (double)step);
  op.u.update.bias1 = (float)bias1;
  op.u.update.bias2 = (float)bias2;
  op.u.update.keep1 = (float)(1.0 - p.beta1);
  op.u.update.keep2 = (float)(1.0 - p.beta2);
  op.u.update.step_size = (float)(p.lr / bias1);
  op.u.update.sqrt_bias2 = (float)sqrt(bias2);
  kiln__tensor_view(grad, &op.in[0]);
  kiln__tensor_view(m, &op.in[1]);
  kiln__tensor_view(v, &op.in[2]);
  const kiln_tensor_t *inputs[4] = {grad, m, v, NULL};
  update_copy_slot(&op, copy, inputs);
  return kiln__op_enqueue_into(call, &op, param, inputs);
}

kiln_status_t kiln_tensor_unscale(const kiln_tensor_t *grad, double scale, kiln_tensor_t *found_inf,
                                  kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_unscale";
  kiln_status_t status = kiln__op_need(call, "grad", grad);
  if (status == KILN_OK) status = kiln__op_need(call, "found_inf", found_inf);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "unscale", "grad", grad, KILN_UPDATE_GRAD_DTYPES);
  if (status == KILN_OK) status = kiln__op_need_dtype(call, "unscale", "found_inf", found_inf, false);
  if (status == KILN_OK) status = kiln__op_same_device(call, "grad", grad, "found_inf", found_inf);
  if (status != KILN_OK) return status;
  if (kiln_tensor_numel(found_inf) != 1)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: found_inf has %lld elements; pass one f32 (kiln_tensor_zeros with ndim 0)", call,
                           (long long)kiln_tensor_numel(found_inf));
  if (!kiln_tensor_is_contiguous(grad))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: grad is a strided view; pass a contiguous tensor (kiln_tensor_contiguous)", call);
  if ((status = kiln__buffer_check_writable(call, "found_inf", found_inf->buffer)) != KILN_OK) return status;
  if (!(isfinite(scale) && isfinite((float)scale)))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: scale = %g; pass a number finite as a float", call, scale);
  kiln_op_t op;
  op.kind = KILN_OP_UNSCALE;
  op.n_in = 2;
  memset(&op.u.update, 0, sizeof op.u.update);
  op.u.update.alpha = (float)scale;
  kiln__tensor_view(grad, &op.in[0]);
  kiln__tensor_view(found_inf, &op.in[1]);
  const kiln_tensor_t *inputs[2] = {grad, found_inf};
  return kiln__op_enqueue(call, grad->buffer->device, &op, KILN_F32, grad->ndim, grad->shape, inputs, out);
}
