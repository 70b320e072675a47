/* runtime/ops_index.c: indexing by a tensor of indices: index_select (a gather along one axis) and index_add (its gradient, a scatter-add in place), with the device's report of an index out of range. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"

#define KILN__DT_INDEX (KILN__DT(I32) | KILN__DT(I64))
/* INDEX_ADD's dtypes: those it has a sum for. */
#define KILN__DT_INDEX_ADD (KILN__DT(F32) | KILN__DT(F64) | KILN__DT(F16) | KILN__DT(BF16) | KILN__DT(I32) | KILN__DT(I64))

/* x, its axis and index checked; the axis resolved (negative counts from the
 * end) and x viewed as [outer, len, inner] along it. */
static kiln_status_t index_common(const char *call, const kiln_tensor_t *x, int axis, const kiln_tensor_t *index,
                                  int *out_axis, kiln_kop_params_t *u) {
  kiln_status_t status = kiln__op_need(call, "x", x);
  if (status == KILN_OK) status = kiln__op_need(call, "index", index);
  if (status == KILN_OK) status = kiln__op_same_device(call, "x", x, "index", index);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "indexing", "index", index, KILN__DT_INDEX);
  if (status != KILN_OK) return status;
  if (index->ndim != 1) {
    char ts[96];
    kiln__shape_text(index->ndim, index->shape, ts, sizeof ts);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: index is %s; pass a 1-D tensor of indices (kiln_tensor_reshape "
                           "of a larger one, and of the result after)", call, ts);
  }
  if (x->ndim == 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: x is 0-d and has no axis to index; reshape it to [1] first",
                           call);
  if (axis < -x->ndim || axis >= x->ndim)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: axis %d is out of range for a tensor of %d dimensions; use an "
                           "axis in [-%d, %d)", call, axis, x->ndim, x->ndim, x->ndim);
  const int ax = axis < 0 ? axis + x->ndim : axis;
  memset(u, 0, sizeof *u);
  u->index.outer = 1;
  u->index.inner = 1;
  for (int d = 0; d < ax; d++) u->index.outer *= x->shape[d];
  for (int d = ax + 1; d < x->ndim; d++) u->index.inner *= x->shape[d];
  u->index.len = x->shape[ax];
  u->index.m = index->shape[0];
  *out_axis = ax;
  return KILN_OK;
}

/* The report the op writes (i32 [2], -1 until an index is out of range) and
 * the check that reads it at the queue's next synchronisation. */
static kiln_status_t report_make(kiln_device_t *device, kiln_tensor_t **out) {
  return kiln_tensor_full(device, KILN_I32, 1, (const int64_t[]){2}, -1.0, out);
}

static kiln_status_t report_check(const char *call, kiln_queue_t *queue, kiln_tensor_t *report, int64_t len,
                                  const char *consequence) {
  char rule[200];
  snprintf(rule, sizeof rule, "an index must be in [-%lld, %lld) (negative ones count from the end); %s",
           (long long)len, (long long)len, consequence);
  return kiln__check_add(queue, report, call, "index", -len, len, rule);
}

kiln_status_t kiln_tensor_index_select(const kiln_tensor_t *x, int axis, const kiln_tensor_t *index,
                                       kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_index_select";
  kiln_op_t op;
  int ax = 0;
  kiln_status_t status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = index_common(call, x, axis, index, &ax, &op.u);
  if (status != KILN_OK) return status;
  int64_t shape[KILN_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[ax] = op.u.index.m;
  kiln_device_t *device = x->buffer->device;
  kiln_queue_t *queue = kiln_device_current_queue(device);
  kiln_tensor_t *dx = NULL, *di = NULL, *report = NULL;
  status = kiln__op_dense(call, x, &dx);
  if (status == KILN_OK) status = kiln__op_dense(call, index, &di);
  if (status == KILN_OK) status = report_make(device, &report);
  if (status == KILN_OK) {
    op.kind = KILN_OP_GATHER;
    op.n_in = 3;
    kiln__tensor_view(dx, &op.in[0]);
    kiln__tensor_view(di, &op.in[1]);
    kiln__tensor_view(report, &op.in[2]);
    const kiln_tensor_t *inputs[3] = {dx, di, report};
    status = kiln__op_enqueue(call, device, &op, x->dtype, x->ndim, shape, inputs, out);
    /* An empty result reads nothing: no check. */
    if (status == KILN_OK && kiln_tensor_numel(*out) > 0) {
      status = report_check(call, queue, report, op.u.index.len, "its slice reads as zeros");
      if (status != KILN_OK) {
        kiln_tensor_release(*out);
        *out = NULL;
      }
    }
  }
  kiln_tensor_release(dx);
  kiln_tensor_release(di);
  kiln_tensor_release(report);
  return status;
}

/* INDEX_ADD: x[..., index[j], ...] += alpha * src[..., j, ...], or with
 * `copy` = src[..., j, ...]. */
static kiln_status_t index_update(const char *call, kiln_tensor_t *x, int axis, const kiln_tensor_t *index,
                                  const kiln_tensor_t *src, double alpha, bool copy) {
  kiln_op_t op;
  int ax = 0;
  kiln_status_t status = index_common(call, x, axis, index, &ax, &op.u);
  if (status == KILN_OK) status = kiln__op_need(call, "src", src);
  if (status == KILN_OK) status = kiln__op_same_device(call, "x", x, "src", src);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, copy ? "index_copy" : "index_add", "x", x, KILN__DT_INDEX_ADD);
  if (status != KILN_OK) return status;
  if (src->dtype != x->dtype)
    return kiln__set_error(KILN_DTYPE_MISMATCH, "%s: x is %s and src %s; pass src of x's dtype (kiln_tensor_cast)",
                           call, kiln_dtype_name(x->dtype), kiln_dtype_name(src->dtype));
  bool shape_ok = src->ndim == x->ndim;
  for (int d = 0; shape_ok && d < x->ndim; d++) shape_ok = src->shape[d] == (d == ax ? op.u.index.m : x->shape[d]);
  if (!shape_ok) {
    char tx[96], ts[96];
    kiln__shape_text(x->ndim, x->shape, tx, sizeof tx);
    kiln__shape_text(src->ndim, src->shape, ts, sizeof ts);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: x %s, src %s, %lld indices along axis %d; src must be x's shape "
                           "with %lld along that axis", call, tx, ts, (long long)op.u.index.m, ax,
                           (long long)op.u.index.m);
  }
  if (!kiln_tensor_is_contiguous(x))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: x is a strided view; index_add writes in place and takes a "
                           "contiguous tensor (kiln_tensor_contiguous, then copy back)", call);
  const bool integral = kiln_dtype_class(x->dtype) != KILN_DTYPE_CLASS_FLOAT;
  if (!isfinite(alpha) || (integral && alpha != floor(alpha)))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: alpha = %g; pass a finite number%s", call, alpha,
                           integral ? ", and a whole one for an integer x" : "");
  if ((status = kiln__buffer_check_writable(call, "x", x->buffer)) != KILN_OK) return status;
  /* x must not share memory with what the op reads. */
  if (x->buffer == src->buffer || x->buffer == index->buffer)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: x shares memory with %s; pass a separate tensor (a copy: "
                           "kiln_tensor_contiguous of a clone)", call, x->buffer == src->buffer ? "src" : "index");
  if (kiln_tensor_numel(src) == 0 || kiln_tensor_numel(x) == 0) return KILN_OK;
  kiln_device_t *device = x->buffer->device;
  kiln_queue_t *queue = kiln_device_current_queue(device);
  kiln_tensor_t *ds = NULL, *di = NULL, *report = NULL;
  status = kiln__op_dense(call, src, &ds);
  if (status == KILN_OK) status = kiln__op_dense(call, index, &di);
  if (status == KILN_OK) status = report_make(device, &report);
  if (status == KILN_OK) {
    op.kind = KILN_OP_INDEX_ADD;
    op.n_in = 3;
    op.u.index.alpha = kiln__scalar(alpha, x->dtype);
    op.u.index.copy = copy;
    kiln__tensor_view(ds, &op.in[0]);
    kiln__tensor_view(di, &op.in[1]);
    kiln__tensor_view(report, &op.in[2]);
    const kiln_tensor_t *inputs[3] = {ds, di, report};
    status = kiln__op_enqueue_into(call, &op, x, inputs);
    if (status == KILN_OK)
      status = report_check(call, queue, report, op.u.index.len,
                            copy ? "its slice of src was not stored" : "its slice of src was not added");
  }
  kiln_tensor_release(ds);
  kiln_tensor_release(di);
  kiln_tensor_release(report);
  return status;
}

kiln_status_t kiln_tensor_index_add(kiln_tensor_t *x, int axis, const kiln_tensor_t *index, const kiln_tensor_t *src,
                                    double alpha) {
  return index_update("kiln_tensor_index_add", x, axis, index, src, alpha, false);
}

kiln_status_t kiln_tensor_index_copy(kiln_tensor_t *x, int axis, const kiln_tensor_t *index, const kiln_tensor_t *src) {
  return index_update("kiln_tensor_index_copy", x, axis, index, src, 1.0, true);
}
