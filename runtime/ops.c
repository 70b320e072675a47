/* runtime/ops.c: the tensor operations: validation, result shapes, broadcasting and operand layout, then dispatch. */
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"

/* ---- what the op table says about dtypes --------------------------------------- */

/* Every op of tensor.h must have a float formula, and every comparison a
 * row: a missing one leaves its enumerator undeclared below and the build
 * fails here. */
enum {
#define KILN_UNARY_FLOAT(NAME, expr) kiln_unary_float_##NAME = 1,
#define KILN_BINARY_FLOAT(NAME, expr) kiln_binary_float_##NAME = 1,
#define KILN_COMPARE(NAME, expr) kiln_compare_row_##NAME = 1,
#include "kernels/ops.def"
  kiln_ops_def_float_end_
};
#define KILN_CHECK_UNARY_(NAME, name) \
  _Static_assert(kiln_unary_float_##NAME, "unary " #name " has no float formula in kernels/ops.def");
KILN_UNARY_OPS(KILN_CHECK_UNARY_)
#undef KILN_CHECK_UNARY_
#define KILN_CHECK_BINARY_(NAME, name) \
  _Static_assert(kiln_binary_float_##NAME, "binary " #name " has no float formula in kernels/ops.def");
KILN_BINARY_OPS(KILN_CHECK_BINARY_)
#undef KILN_CHECK_BINARY_
#define KILN_CHECK_COMPARE_(NAME, name) \
  _Static_assert(kiln_compare_row_##NAME, "comparison " #name " has no row in kernels/ops.def");
KILN_COMPARE_OPS(KILN_CHECK_COMPARE_)
#undef KILN_CHECK_COMPARE_

/* The dtypes each op takes, from the families that have its row: every
 * float dtype, and the integers where it has an integer formula. */
static const uint32_t unary_dtypes[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_FLOAT(NAME, expr) [KILN_UNARY_##NAME] = KILN__DT_FLOAT,
#include "kernels/ops.def"
};
static const bool unary_int[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_INT(NAME, expr) [KILN_UNARY_##NAME] = true,
#include "kernels/ops.def"
};
static const bool binary_int[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_INT(NAME, expr) [KILN_BINARY_##NAME] = true,
#include "kernels/ops.def"
};

static uint32_t unary_takes(kiln_unary_op_t op) {
  return unary_dtypes[op] | (unary_int[op] ? KILN__DT_INTEGER : 0u);
}
static uint32_t binary_takes(kiln_binary_op_t op) { return KILN__DT_FLOAT | (binary_int[op] ? KILN__DT_INTEGER : 0u); }

static const char *const unary_names[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_NAME_(NAME, name) [KILN_UNARY_##NAME] = #name,
    KILN_UNARY_OPS(KILN_UNARY_NAME_)
#undef KILN_UNARY_NAME_
};

static const char *const binary_names[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_NAME_(NAME, name) [KILN_BINARY_##NAME] = #name,
    KILN_BINARY_OPS(KILN_BINARY_NAME_)
#undef KILN_BINARY_NAME_
};


/* ---- shared checks ---------------------------------------------------------------- */

void kiln__shape_text(int ndim, const int64_t *shape, char *out, size_t size) {
  size_t used = (size_t)snprintf(out, size, "[");
  for (int i = 0; i < ndim && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (used < size) snprintf(out + used, size - used, "]");
}

kiln_status_t kiln__op_need(const char *call, const char *name, const kiln_tensor_t *t) {
  if (!t)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL; pass a tensor from a kiln_tensor_* call", call, name);
  return KILN_OK;
}

kiln_status_t kiln__op_need_out(const char *call, kiln_tensor_t **out) {
  if (!out) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: out is NULL; pass the address of a kiln_tensor_t *", call);
  return KILN_OK;
}

kiln_status_t kiln__op_same_device(const char *call, const char *na, const kiln_tensor_t *a, const char *nb,
                                      const kiln_tensor_t *b) {
  kiln_device_t *da = a->buffer->device, *db = b->buffer->device;
  if (da == db) return KILN_OK;
  return kiln__set_error(KILN_DEVICE_MISMATCH,
                         "%s: operands live on different devices: %s on %s, %s on %s; kiln never copies implicitly: "
                         "move one first with kiln_tensor_to(%s, kiln_tensor_device(%s), &%s2)",
                         call, na, da->display_name, nb, db->display_name, nb, na, nb);
}

void kiln__dtypes_text(uint32_t allowed, char *out, size_t size) {
  size_t used = 0;
  int count = 0, total = 0;
  for (int d = 0; d < KILN_DTYPE_COUNT_; d++) total += (allowed >> d) & 1u;
  out[0] = '\0';
  for (int d = 0; d < KILN_DTYPE_COUNT_ && used < size; d++) {
    if (!((allowed >> d) & 1u)) continue;
    const char *sep = count == 0 ? "" : count == total - 1 ? " or " : ", ";
    used += (size_t)snprintf(out + used, size - used, "%s%s", sep, kiln_dtype_name((kiln_dtype_t)d));
    count++;
  }
}

kiln_status_t kiln__op_need_dtypes(const char *call, const char *what, const char *name, const kiln_tensor_t *t,
                                   uint32_t allowed) {
  if ((unsigned)t->dtype < KILN_DTYPE_COUNT_ && ((allowed >> (unsigned)t->dtype) & 1u)) return KILN_OK;
  /* The cast that makes it valid: to f32 where the op takes floats and t is
   * not one; to i32 (else i64) where it takes integers only; otherwise to
   * the first dtype it takes. */
  kiln_dtype_t to = KILN_F32;
  if (!(allowed & KILN__DT(F32))) {
    if (allowed & KILN__DT(I32)) to = KILN_I32;
    else if (allowed & KILN__DT(I64)) to = KILN_I64;
    else
      for (int d = 0; d < KILN_DTYPE_COUNT_; d++)
        if ((allowed >> d) & 1u) {
          to = (kiln_dtype_t)d;
          break;
        }
  } else if (kiln_dtype_class(t->dtype) != KILN_DTYPE_CLASS_FLOAT && (allowed & KILN__DT(I32))) {
    to = KILN_I32;
  }
  char takes[96];
  kiln__dtypes_text(allowed, takes, sizeof takes);
  /* The example names the operand when there is one ("a"), a placeholder
   * when the check covers several ("a and b"). */
  const char *operand = strchr(name, ' ') ? "x" : name;
  char upper[8];
  const char *short_name = kiln_dtype_name(to);
  size_t n = 0;
  for (; short_name[n] && n + 1 < sizeof upper; n++)
    upper[n] = (char)(short_name[n] >= 'a' && short_name[n] <= 'z' ? short_name[n] - 'a' + 'A' : short_name[n]);
  upper[n] = '\0';
  return kiln__set_error(KILN_DTYPE_MISMATCH,
                         "%s: %s does not support dtype %s (%s); use %s: cast to %s first "
                         "(kiln_tensor_cast(%s, KILN_%s, &%s2))",
                         call, what, kiln_dtype_name(t->dtype), name, takes, kiln_dtype_name(to), operand, upper, operand);
}

kiln_status_t kiln__op_same_dtype(const char *call, const char *what, const char *na, const kiln_tensor_t *a,
                                  const char *nb, const kiln_tensor_t *b) {
  if (a->dtype == b->dtype) return KILN_OK;
  const char *name = kiln_dtype_name(a->dtype);
  char upper[8];
  size_t n = 0;
  for (; name[n] && n + 1 < sizeof upper; n++)
    upper[n] = (char)(name[n] >= 'a' && name[n] <= 'z' ? name[n] - 'a' + 'A' : name[n]);
  upper[n] = '\0';
  return kiln__set_error(KILN_DTYPE_MISMATCH,
                         "%s: %s is %s but %s is %s; %s takes operands of one dtype: cast %s to %s first "
                         "(kiln_tensor_cast(%s, KILN_%s, &%s2))",
                         call, na, name, nb, kiln_dtype_name(b->dtype), what, nb, name, nb, upper, nb);
}

kiln_status_t kiln__op_need_dtype(const char *call, const char *what, const char *name, const kiln_tensor_t *t,
                                  bool i32_ok) {
  return kiln__op_need_dtypes(call, what, name, t, i32_ok ? KILN__DT(F32) | KILN__DT(I32) : KILN__DT(F32));
}

/* A contiguous version of t (itself retained when it already is). */
kiln_status_t kiln__op_dense(const char *call, const kiln_tensor_t *t, kiln_tensor_t **out) {
  kiln_status_t status = kiln_tensor_contiguous((kiln_tensor_t *)t, out);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}

static int64_t numel_of(int ndim, const int64_t *shape) { return kiln__numel(ndim, shape); }

/* ---- elementwise ----------------------------------------------------------------------- */

static kiln_status_t unary(const char *call, kiln_unary_op_t uop, const kiln_tensor_t *a, kiln_tensor_t **out) {
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status != KILN_OK) return status;
  if ((unsigned)uop >= KILN_UNARY_COUNT_)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: op %d is not a kiln_unary_op_t; use KILN_UNARY_NEG ... KILN_UNARY_TANH",
                           call, (int)uop);
  status = kiln__op_need_dtypes(call, unary_names[uop], "a", a, unary_takes(uop));
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_UNARY;
  op.n_in = 1;
  op.u.unary.op = uop;
  kiln__tensor_view(a, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {a};
  return kiln__op_enqueue(call, a->buffer->device, &op, a->dtype, a->ndim, a->shape, inputs, out);
}

/* View `t` as `ndim` dims of `shape`, stride 0 where it broadcasts. */
void kiln__broadcast_view(const kiln_tensor_t *t, int ndim, const int64_t *shape, kiln_view_t *view) {
  kiln__tensor_view(t, view);
  int lead = ndim - t->ndim;
  for (int i = ndim - 1; i >= 0; i--) {
    int j = i - lead;
    view->shape[i] = shape[i];
    view->strides[i] = (j >= 0 && t->shape[j] == shape[i] && shape[i] != 1) ? t->strides[j] : 0;
  }
  view->ndim = ndim;
}

/* The shape `count` operands broadcast to, NumPy's rule: shapes align at
 * their last dimension and are compared from there, so the mismatch named
 * is the last one, in each operand's own numbering. */
static kiln_status_t broadcast_shape(const char *call, int count, const char *const *names,
                                     const kiln_tensor_t *const *t, int *out_ndim, int64_t *shape) {
  int ndim = 0;
  for (int i = 0; i < count; i++)
    if (t[i]->ndim > ndim) ndim = t[i]->ndim;
  for (int d = ndim - 1; d >= 0; d--) {
    int64_t size = 1;
    int from = -1; /* the operand that set `size` */
    for (int i = 0; i < count; i++) {
      const int j = d - (ndim - t[i]->ndim);
      const int64_t s = j >= 0 ? t[i]->shape[j] : 1;
      if (s == 1) continue;
      if (from >= 0 && s != size) {
        char ta[128], tb[128];
        kiln__shape_text(t[from]->ndim, t[from]->shape, ta, sizeof ta);
        kiln__shape_text(t[i]->ndim, t[i]->shape, tb, sizeof tb);
        return kiln__set_error(KILN_SHAPE_MISMATCH,
                               "%s: shapes %s and %s do not broadcast: aligned at their last dimension, %s's "
                               "dimension %d (size %lld) meets %s's dimension %d (size %lld); sizes must match or "
                               "be 1",
                               call, ta, tb, names[from], d - (ndim - t[from]->ndim), (long long)size, names[i], j,
                               (long long)s);
      }
      size = s;
      from = i;
    }
    shape[d] = size;
  }
  *out_ndim = ndim;
  return KILN_OK;
}

/* a and b converted to `dtype` where they are not of it (*ca, *cb NULL
 * where they are); released by the caller. */
static kiln_status_t promote_pair(const char *call, const kiln_tensor_t *a, const kiln_tensor_t *b, kiln_dtype_t dtype,
                                  kiln_tensor_t **ca, kiln_tensor_t **cb) {
  kiln_status_t status = KILN_OK;
  *ca = *cb = NULL;
  if (a->dtype != dtype) status = kiln_tensor_cast(a, dtype, ca);
  if (status == KILN_OK && b->dtype != dtype) status = kiln_tensor_cast(b, dtype, cb);
  if (status == KILN_OK) return KILN_OK;
  kiln_tensor_release(*ca);
  *ca = NULL;
  return kiln__wrap_error(status, "%s: promoting %s and %s to %s", call, kiln_dtype_name(a->dtype),
                          kiln_dtype_name(b->dtype), kiln_dtype_name(dtype));
}

static kiln_status_t binary(const char *call, kiln_binary_op_t bop, const kiln_tensor_t *a, const kiln_tensor_t *b,
                            kiln_tensor_t **out);

/* Operands of two dtypes: both converted to kiln_result_dtype (the one
 * promotion table) by kiln_tensor_cast, then the op of one dtype. The op's
 * dtype is checked first, so nothing is enqueued for an op that cannot run. */
static kiln_status_t binary_promoted(const char *call, kiln_binary_op_t bop, const kiln_tensor_t *a,
                                     const kiln_tensor_t *b, kiln_tensor_t **out) {
  kiln_dtype_t dtype;
  kiln_status_t status = kiln_result_dtype(a->dtype, b->dtype, &dtype);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  if (!((binary_takes(bop) >> (unsigned)dtype) & 1u)) {
    char takes[96];
    kiln__dtypes_text(binary_takes(bop), takes, sizeof takes);
    return kiln__set_error(KILN_DTYPE_MISMATCH,
                           "%s: %s does not support dtype %s: %s of %s and %s promotes to %s; use %s: cast both to "
                           "%s first (kiln_tensor_cast)",
                           call, binary_names[bop], kiln_dtype_name(dtype), binary_names[bop], kiln_dtype_name(a->dtype),
                           kiln_dtype_name(b->dtype), kiln_dtype_name(dtype), takes,
                           kiln_dtype_class(dtype) == KILN_DTYPE_CLASS_FLOAT ? "f32" : "i32");
  }
  kiln_tensor_t *ca, *cb;
  status = promote_pair(call, a, b, dtype, &ca, &cb);
  if (status == KILN_OK) status = binary(call, bop, ca ? ca : a, cb ? cb : b, out);
  kiln_tensor_release(ca);
  kiln_tensor_release(cb);
  return status;
}

static kiln_status_t binary(const char *call, kiln_binary_op_t bop, const kiln_tensor_t *a, const kiln_tensor_t *b,
                                 kiln_tensor_t **out) {
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need(call, "b", b);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status != KILN_OK) return status;
  if ((unsigned)bop >= KILN_BINARY_COUNT_)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: op %d is not a kiln_binary_op_t; use KILN_BINARY_ADD ... KILN_BINARY_MINIMUM", call,
                           (int)bop);
  status = kiln__op_same_device(call, "a", a, "b", b);
  if (status != KILN_OK) return status;
  const char *const names[2] = {"a", "b"};
  const kiln_tensor_t *const inputs[2] = {a, b};
  int ndim = 0;
  int64_t shape[KILN_MAX_DIMS];
  status = broadcast_shape(call, 2, names, inputs, &ndim, shape);
  if (status != KILN_OK) return status;
  if (a->dtype != b->dtype) return binary_promoted(call, bop, a, b, out);
  status = kiln__op_need_dtypes(call, binary_names[bop], "a and b", a, binary_takes(bop));
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_BINARY;
  op.n_in = 2;
  op.u.binary.op = bop;
  
  kiln__broadcast_view(a, ndim, shape, &op.in[0]);
  kiln__broadcast_view(b, ndim, shape, &op.in[1]);
  return kiln__op_enqueue(call, a->buffer->device, &op, a->dtype, ndim, shape, inputs, out);
}

static kiln_status_t binary_scalar(const char *call, kiln_binary_op_t bop, const kiln_tensor_t *a, double scalar,
                                        kiln_tensor_t **out) {
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status != KILN_OK) return status;
  if ((unsigned)bop >= KILN_BINARY_COUNT_)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: op %d is not a kiln_binary_op_t; use KILN_BINARY_ADD ... KILN_BINARY_MINIMUM", call,
                           (int)bop);
  status = kiln__op_need_dtypes(call, binary_names[bop], "a", a, binary_takes(bop));
  if (status != KILN_OK) return status;
  kiln_op_t op;
  op.kind = KILN_OP_BINARY_SCALAR;
  op.n_in = 1;
  op.u.binary.op = bop;
  op.u.binary.scalar = kiln__scalar(scalar, a->dtype);
  kiln__tensor_view(a, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {a};
  return kiln__op_enqueue(call, a->buffer->device, &op, a->dtype, a->ndim, a->shape, inputs, out);
}

kiln_status_t kiln_tensor_where(const kiln_tensor_t *cond, const kiln_tensor_t *a, const kiln_tensor_t *b,
                                kiln_tensor_t **out) {
  const char *call = "kiln_tensor_where";
  kiln_status_t status = kiln__op_need(call, "cond", cond);
  if (status == KILN_OK) status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need(call, "b", b);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_same_device(call, "cond", cond, "a", a);
  if (status == KILN_OK) status = kiln__op_same_device(call, "a", a, "b", b);
  if (status != KILN_OK) return status;
  const char *const names[3] = {"cond", "a", "b"};
  const kiln_tensor_t *const inputs[3] = {cond, a, b};
  int ndim = 0;
  int64_t shape[KILN_MAX_DIMS];
  status = broadcast_shape(call, 3, names, inputs, &ndim, shape);
  if (status != KILN_OK) return status;
  if (a->dtype != b->dtype) {
    /* a and b of two dtypes: both promoted, as a binary op's operands. */
    kiln_dtype_t dtype;
    status = kiln_result_dtype(a->dtype, b->dtype, &dtype);
    if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
    kiln_tensor_t *ca, *cb;
    status = promote_pair(call, a, b, dtype, &ca, &cb);
    if (status == KILN_OK) status = kiln_tensor_where(cond, ca ? ca : a, cb ? cb : b, out);
    kiln_tensor_release(ca);
    kiln_tensor_release(cb);
    return status;
  }
  kiln_op_t op;
  memset(&op.u, 0, sizeof op.u);
  op.kind = KILN_OP_WHERE;
  op.n_in = 3;
  for (int i = 0; i < 3; i++) kiln__broadcast_view(inputs[i], ndim, shape, &op.in[i]);
  return kiln__op_enqueue(call, a->buffer->device, &op, a->dtype, ndim, shape, inputs, out);
}

static kiln_status_t compare(const char *call, kiln_compare_op_t cop, const kiln_tensor_t *a, const kiln_tensor_t *b,
                             kiln_tensor_t **out) {
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need(call, "b", b);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status != KILN_OK) return status;
  if ((unsigned)cop >= KILN_COMPARE_COUNT_)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: op %d is not a kiln_compare_op_t; use KILN_COMPARE_EQUAL ... KILN_COMPARE_LOGICAL_XOR", call,
                           (int)cop);
  status = kiln__op_same_device(call, "a", a, "b", b);
  if (status != KILN_OK) return status;
  const char *const names[2] = {"a", "b"};
  const kiln_tensor_t *const inputs[2] = {a, b};
  int ndim = 0;
  int64_t shape[KILN_MAX_DIMS];
  status = broadcast_shape(call, 2, names, inputs, &ndim, shape);
  if (status != KILN_OK) return status;
  if (a->dtype != b->dtype) {
    kiln_dtype_t dtype;
    status = kiln_result_dtype(a->dtype, b->dtype, &dtype);
    if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
    kiln_tensor_t *ca, *cb;
    status = promote_pair(call, a, b, dtype, &ca, &cb);
    if (status == KILN_OK) status = compare(call, cop, ca ? ca : a, cb ? cb : b, out);
    kiln_tensor_release(ca);
    kiln_tensor_release(cb);
    return status;
  }
  kiln_op_t op;
  memset(&op.u, 0, sizeof op.u);
  op.kind = KILN_OP_COMPARE;
  op.n_in = 2;
  op.u.binary.op = cop;
  kiln__broadcast_view(a, ndim, shape, &op.in[0]);
  kiln__broadcast_view(b, ndim, shape, &op.in[1]);
  return kiln__op_enqueue(call, a->buffer->device, &op, KILN_BOOL, ndim, shape, inputs, out);
}

kiln_status_t kiln_tensor_compare(kiln_compare_op_t op, const kiln_tensor_t *a, const kiln_tensor_t *b,
                                  kiln_tensor_t **out) {
  return compare("kiln_tensor_compare", op, a, b, out);
}

#define KILN_COMPARE_DEF_(NAME, name)                                                                     \
  kiln_status_t kiln_tensor_##name(const kiln_tensor_t *a, const kiln_tensor_t *b, kiln_tensor_t **out) { \
    return compare("kiln_tensor_" #name, KILN_COMPARE_##NAME, a, b, out);                                 \
  }
KILN_COMPARE_OPS(KILN_COMPARE_DEF_)
#undef KILN_COMPARE_DEF_

kiln_status_t kiln_tensor_logical_not(const kiln_tensor_t *a, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_logical_not";
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status != KILN_OK) return status;
  /* a == 0, the zero a 0-d tensor of a's dtype broadcast over a. */
  kiln_tensor_t *zero = NULL;
  status = kiln_tensor_zeros(a->buffer->device, a->dtype, 0, NULL, &zero);
  if (status == KILN_OK) status = compare(call, KILN_COMPARE_EQUAL, a, zero, out);
  else status = kiln__wrap_error(status, "%s", call);
  kiln_tensor_release(zero);
  return status;
}

kiln_status_t kiln_tensor_unary(kiln_unary_op_t op, const kiln_tensor_t *a, kiln_tensor_t **out) {
  return unary("kiln_tensor_unary", op, a, out);
}

kiln_status_t kiln_tensor_binary(kiln_binary_op_t op, const kiln_tensor_t *a, const kiln_tensor_t *b,
                                 kiln_tensor_t **out) {
  return binary("kiln_tensor_binary", op, a, b, out);
}

kiln_status_t kiln_tensor_binary_scalar(kiln_binary_op_t op, const kiln_tensor_t *a, double scalar,
                                        kiln_tensor_t **out) {
  return binary_scalar("kiln_tensor_binary_scalar", op, a, scalar, out);
}

#define KILN_UNARY_DEF_(NAME, name)                                                   \
  kiln_status_t kiln_tensor_##name(const kiln_tensor_t *a, kiln_tensor_t **out) {     \
    return unary("kiln_tensor_" #name, KILN_UNARY_##NAME, a, out);               \
  }
KILN_UNARY_OPS(KILN_UNARY_DEF_)
#undef KILN_UNARY_DEF_

#define KILN_BINARY_DEF_(NAME, name)                                                                      \
  kiln_status_t kiln_tensor_##name(const kiln_tensor_t *a, const kiln_tensor_t *b, kiln_tensor_t **out) { \
    return binary("kiln_tensor_" #name, KILN_BINARY_##NAME, a, b, out);                              \
  }                                                                                                       \
  kiln_status_t kiln_tensor_##name##_scalar(const kiln_tensor_t *a, double scalar, kiln_tensor_t **out) { \
    return binary_scalar("kiln_tensor_" #name "_scalar", KILN_BINARY_##NAME, a, scalar, out);        \
  }
KILN_BINARY_OPS(KILN_BINARY_DEF_)
#undef KILN_BINARY_DEF_

/* ---- cast ---------------------------------------------------------------------------------- */

kiln_status_t kiln_tensor_cast(const kiln_tensor_t *a, kiln_dtype_t dtype, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_cast";
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status != KILN_OK) return status;
  if (kiln_dtype_size(dtype) == 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: dtype %d is not a kiln_dtype_t; use KILN_F32 ... KILN_BOOL", call,
                           (int)dtype);
  kiln_op_t op;
  op.kind = a->dtype == dtype ? KILN_OP_COPY : KILN_OP_CAST;
  op.n_in = 1;
  kiln__tensor_view(a, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {a};
  return kiln__op_enqueue(call, a->buffer->device, &op, dtype, a->ndim, a->shape, inputs, out);
}

/* ---- matmul ------------------------------------------------------------------------------ */

/* How BLAS reads one operand: its last two dims as row-major storage with a
 * leading dimension, or as the transpose of such storage. */
typedef struct mm_side_t {
  kiln_tensor_t *dense; /* a contiguous copy when neither stride is 1; else NULL */
  const kiln_tensor_t *t;
  bool trans;
  int64_t ld, batch_stride;
} mm_side_t;

static kiln_status_t mm_side(const char *call, const kiln_tensor_t *t, bool trans, mm_side_t *side) {
  int n = t->ndim;
  int64_t r = t->shape[n - 2], c = t->shape[n - 1], sr = t->strides[n - 2], sc = t->strides[n - 1];
  side->dense = NULL;
  side->t = t;
  side->trans = trans;
  if ((sc == 1 || c <= 1) && (r <= 1 || sr >= (c > 1 ? c : 1))) {
    side->ld = r <= 1 ? (c > 1 ? c : 1) : sr;
  } else if ((sr == 1 || r <= 1) && (c <= 1 || sc >= (r > 1 ? r : 1))) {
    /* Column-major storage is the row-major transpose: flip the flag. */
    side->trans = !trans;
    side->ld = c <= 1 ? (r > 1 ? r : 1) : sc;
  } else {
    kiln_status_t status = kiln__op_dense(call, t, &side->dense);
    if (status != KILN_OK) return status;
    side->t = side->dense;
    side->ld = c > 1 ? c : 1;
    n = side->t->ndim;
  }
  side->batch_stride = (n == 3 && side->t->shape[0] > 1) ? side->t->strides[0] : 0;
  return KILN_OK;
}

/* Operands of two float dtypes: both converted to kiln_result_dtype (f16
 * with bf16 gives f32, anything with f64 gives f64) by kiln_tensor_cast, as
 * binary ops promote, then the product in that dtype. */
static kiln_status_t matmul_promoted(const char *call, const kiln_tensor_t *a, const kiln_tensor_t *b, bool trans_a,
                                     bool trans_b, kiln_tensor_t **out) {
  kiln_dtype_t dtype;
  kiln_status_t status = kiln_result_dtype(a->dtype, b->dtype, &dtype);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  kiln_tensor_t *ca = NULL, *cb = NULL;
  if (a->dtype != dtype) status = kiln_tensor_cast(a, dtype, &ca);
  if (status == KILN_OK && b->dtype != dtype) status = kiln_tensor_cast(b, dtype, &cb);
  if (status == KILN_OK) status = kiln_tensor_matmul(ca ? ca : a, cb ? cb : b, trans_a, trans_b, out);
  else status = kiln__wrap_error(status, "%s: promoting %s and %s to %s", call, kiln_dtype_name(a->dtype),
                                 kiln_dtype_name(b->dtype), kiln_dtype_name(dtype));
  kiln_tensor_release(ca);
  kiln_tensor_release(cb);
  return status;
}

kiln_status_t kiln_tensor_matmul(const kiln_tensor_t *a, const kiln_tensor_t *b, bool trans_a, bool trans_b,
                                 kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_matmul";
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need(call, "b", b);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_same_device(call, "a", a, "b", b);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "matmul", "a", a, KILN__DT_FLOAT);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "matmul", "b", b, KILN__DT_FLOAT);
  if (status != KILN_OK) return status;
  if (a->dtype != b->dtype) return matmul_promoted(call, a, b, trans_a, trans_b, out);
  const kiln_dtype_t dtype = a->dtype;
  if (a->ndim < 2 || a->ndim > 3 || b->ndim < 2 || b->ndim > 3)
    return kiln__set_error(KILN_SHAPE_MISMATCH,
                           "%s: a has %d dimensions and b has %d; each must be [M,K] or [B,M,K] (2 or 3 dimensions)",
                           call, a->ndim, b->ndim);
  int64_t ba = a->ndim == 3 ? a->shape[0] : 1, bb = b->ndim == 3 ? b->shape[0] : 1;
  int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
  int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  int64_t m = trans_a ? ac : ar, k = trans_a ? ar : ac;
  int64_t k2 = trans_b ? bc : br, n = trans_b ? br : bc;
  char ta[128], tb[128];
  if (k != k2 || (a->ndim == 3 && b->ndim == 3 && ba != bb && ba != 1 && bb != 1)) {
    kiln__shape_text(a->ndim, a->shape, ta, sizeof ta);
    kiln__shape_text(b->ndim, b->shape, tb, sizeof tb);
    if (k != k2)
      return kiln__set_error(KILN_SHAPE_MISMATCH,
                             "%s: inner dimensions differ: op(a) is %lld x %lld and op(b) is %lld x %lld (a %s%s, b "
                             "%s%s); the columns of op(a) must equal the rows of op(b)",
                             call, (long long)m, (long long)k, (long long)k2, (long long)n, ta,
                             trans_a ? " transposed" : "", tb, trans_b ? " transposed" : "");
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: batch sizes differ: a %s, b %s; use equal batches or a 2-D operand",
                           call, ta, tb);
  }
  /* A batch of zero broadcast against anything is a batch of zero. */
  int64_t batch = (ba == 0 || bb == 0) ? 0 : ba > bb ? ba : bb;
  bool batched = a->ndim == 3 || b->ndim == 3;
  int64_t shape[3];
  int ndim = 0;
  if (batched) shape[ndim++] = batch;
  shape[ndim++] = m;
  shape[ndim++] = n;
  kiln_device_t *device = a->buffer->device;
  kiln_op_t op;
  if (k == 0) {
    /* The sum of no products: zeros, without bothering a GEMM. */
    op.kind = KILN_OP_FILL;
    op.n_in = 0;
    op.u.fill.value = kiln__scalar(0.0, dtype);
    return kiln__op_enqueue(call, device, &op, dtype, ndim, shape, NULL, out);
  }
  if (numel_of(ndim, shape) == 0) return kiln__op_enqueue(call, device, &op, dtype, ndim, shape, NULL, out);
  mm_side_t sa, sb;
  status = mm_side(call, a, trans_a, &sa);
  if (status != KILN_OK) return status;
  status = mm_side(call, b, trans_b, &sb);
  if (status != KILN_OK) {
    kiln_tensor_release(sa.dense);
    return status;
  }
  op.kind = KILN_OP_MATMUL;
  op.n_in = 2;
  kiln__tensor_view(sa.t, &op.in[0]);
  kiln__tensor_view(sb.t, &op.in[1]);
  op.u.matmul.batch = batch;
  op.u.matmul.m = m;
  op.u.matmul.n = n;
  op.u.matmul.k = k;
  op.u.matmul.trans_a = sa.trans;
  op.u.matmul.trans_b = sb.trans;
  op.u.matmul.lda = sa.ld;
  op.u.matmul.ldb = sb.ld;
  op.u.matmul.ldc = n;
  op.u.matmul.stride_a = sa.batch_stride;
  op.u.matmul.stride_b = sb.batch_stride;
  op.u.matmul.stride_c = m * n;
  const kiln_tensor_t *inputs[2] = {sa.t, sb.t};
  status = kiln__op_enqueue(call, device, &op, dtype, ndim, shape, inputs, out);
  kiln_tensor_release(sa.dense);
  kiln_tensor_release(sb.dense);
  return status;
}

/* ---- reductions ----------------------------------------------------------------------------- */

static kiln_status_t reduce(const char *call, kiln_reduce_op_t rop, const kiln_tensor_t *a, int axis, bool keepdim,
                                 kiln_tensor_t **out) {
  static const char *const names[] = {"sum", "mean", "max", "argmax", "norm"};
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status != KILN_OK) return status;
  /* sum takes every dtype, max and argmax every number (a bool is cast
   * first), mean and norm the floats. */
  static const uint32_t takes[] = {KILN__DT_ALL, KILN__DT_FLOAT, KILN__DT_NUMERIC, KILN__DT_NUMERIC, KILN__DT_FLOAT};
  status = kiln__op_need_dtypes(call, names[rop], "a", a, takes[rop]);
  if (status != KILN_OK) return status;
  int n = a->ndim;
  bool all = axis == KILN_ALL_AXES || (n == 0 && (axis == 0 || axis == -1));
  int ax = axis < 0 ? axis + n : axis;
  if (!all && (ax < 0 || ax >= n))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: axis %d is out of range for a tensor of %d dimensions; use an axis in [-%d, %d) or "
                           "KILN_ALL_AXES",
                           call, axis, n, n, n);
  int64_t outer = 1, len = 1, inner = 1;
  int64_t shape[KILN_MAX_DIMS];
  int ndim = 0;
  if (all) {
    len = numel_of(n, a->shape);
    if (keepdim)
      for (int i = 0; i < n; i++) shape[ndim++] = 1;
  } else {
    for (int i = 0; i < ax; i++) outer = kiln__mul_sat(outer, a->shape[i]);
    len = a->shape[ax];
    for (int i = ax + 1; i < n; i++) inner = kiln__mul_sat(inner, a->shape[i]);
    for (int i = 0; i < n; i++) {
      if (i != ax) shape[ndim++] = a->shape[i];
      else if (keepdim) shape[ndim++] = 1;
    }
  }
  if (len == 0 && (rop == KILN_REDUCE_MAX || rop == KILN_REDUCE_ARGMAX))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: the reduced axis is empty (size 0), so there is no %s; reduce a non-empty axis", call,
                           names[rop]);
  /* The result: argmax's indices are i32; the sum of integers or bools is
   * i64 (the Array API's and PyTorch's rule: no overflow at 2^31); the rest
   * keep a's dtype. */
  kiln_dtype_t dtype = a->dtype;
  if (rop == KILN_REDUCE_ARGMAX) dtype = KILN_I32;
  else if (rop == KILN_REDUCE_SUM && kiln_dtype_class(a->dtype) != KILN_DTYPE_CLASS_FLOAT) dtype = KILN_I64;
  kiln_op_t op;
  op.kind = KILN_OP_REDUCE;
  op.n_in = 1;
  op.u.reduce.op = rop;
  op.u.reduce.outer = outer;
  op.u.reduce.len = len;
  op.u.reduce.inner = inner;
  if (numel_of(ndim, shape) == 0) return kiln__op_enqueue(call, a->buffer->device, &op, dtype, ndim, shape, NULL, out);
  kiln_tensor_t *dense = NULL;
  status = kiln__op_dense(call, a, &dense);
  if (status != KILN_OK) return status;
  kiln__tensor_view(dense, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {dense};
  /* len == 0 still runs: the sum of nothing is 0 and its mean NaN. */
  status = kiln__op_enqueue(call, a->buffer->device, &op, dtype, ndim, shape, inputs, out);
  kiln_tensor_release(dense);
  return status;
}

kiln_status_t kiln_tensor_sum(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out) {
  return reduce("kiln_tensor_sum", KILN_REDUCE_SUM, a, axis, keepdim, out);
}
kiln_status_t kiln_tensor_mean(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out) {
  return reduce("kiln_tensor_mean", KILN_REDUCE_MEAN, a, axis, keepdim, out);
}
kiln_status_t kiln_tensor_max(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out) {
  return reduce("kiln_tensor_max", KILN_REDUCE_MAX, a, axis, keepdim, out);
}
kiln_status_t kiln_tensor_argmax(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out) {
  return reduce("kiln_tensor_argmax", KILN_REDUCE_ARGMAX, a, axis, keepdim, out);
}
kiln_status_t kiln_tensor_norm(const kiln_tensor_t *a, kiln_tensor_t **out) {
  return reduce("kiln_tensor_norm", KILN_REDUCE_NORM, a, KILN_ALL_AXES, false, out);
}

/* ---- neural-network operations ------------------------------------------------------------------ */

static kiln_status_t softmax(const char *call, bool log, const kiln_tensor_t *a, kiln_tensor_t **out) {
  kiln_status_t status = kiln__op_need(call, "a", a);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_need_dtype(call, log ? "log_softmax" : "softmax", "a", a, false);
  if (status != KILN_OK) return status;
  int64_t numel = numel_of(a->ndim, a->shape);
  int64_t cols = a->ndim ? a->shape[a->ndim - 1] : 1;
  kiln_op_t op;
  op.kind = KILN_OP_SOFTMAX;
  op.n_in = 1;
  op.u.softmax.cols = cols;
  op.u.softmax.rows = cols ? numel / cols : 0;
  op.u.softmax.log = log;
  if (numel == 0) return kiln__op_enqueue(call, a->buffer->device, &op, KILN_F32, a->ndim, a->shape, NULL, out);
  kiln_tensor_t *dense = NULL;
  status = kiln__op_dense(call, a, &dense);
  if (status != KILN_OK) return status;
  kiln__tensor_view(dense, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {dense};
  status = kiln__op_enqueue(call, a->buffer->device, &op, KILN_F32, a->ndim, a->shape, inputs, out);
  kiln_tensor_release(dense);
  return status;
}

kiln_status_t kiln_tensor_softmax(const kiln_tensor_t *a, kiln_tensor_t **out) {
  return softmax("kiln_tensor_softmax", false, a, out);
}

kiln_status_t kiln_tensor_log_softmax(const kiln_tensor_t *a, kiln_tensor_t **out) {
  return softmax("kiln_tensor_log_softmax", true, a, out);
}

kiln_status_t kiln_tensor_cross_entropy(const kiln_tensor_t *logits, const kiln_tensor_t *labels, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_cross_entropy";
  kiln_status_t status = kiln__op_need(call, "logits", logits);
  if (status == KILN_OK) status = kiln__op_need(call, "labels", labels);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_same_device(call, "logits", logits, "labels", labels);
  if (status != KILN_OK) return status;
  if (logits->dtype != KILN_F32 || labels->dtype != KILN_I32)
    return kiln__set_error(KILN_DTYPE_MISMATCH, "%s: logits are %s and labels %s; pass f32 logits and i32 labels", call,
                           kiln_dtype_name(logits->dtype), kiln_dtype_name(labels->dtype));
  if (logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0]) {
    char tl[128], tb[128];
    kiln__shape_text(logits->ndim, logits->shape, tl, sizeof tl);
    kiln__shape_text(labels->ndim, labels->shape, tb, sizeof tb);
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: logits %s and labels %s; pass logits [N, C] and labels [N]", call,
                           tl, tb);
  }
  if (logits->shape[1] == 0 && logits->shape[0] > 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: logits have 0 classes for %lld samples; pass at least one class",
                           call, (long long)logits->shape[0]);
  kiln_tensor_t *dl = NULL, *db = NULL, *report = NULL;
  kiln_device_t *device = logits->buffer->device;
  kiln_queue_t *queue = kiln_device_current_queue(device);
  status = kiln__op_dense(call, logits, &dl);
  if (status == KILN_OK) status = kiln__op_dense(call, labels, &db);
  /* Labels live on the device: the op itself reports the first one out of
   * range, and the core reads that report at the queue's next
   * synchronisation (runtime/checks.c), as CUDA reports a device assert. */
  if (status == KILN_OK) status = kiln__tensor_alloc(device, queue, KILN_I32, 1, (const int64_t[]){2}, &report);
  if (status == KILN_OK) {
    kiln_op_t op;
    op.kind = KILN_OP_CROSS_ENTROPY;
    op.n_in = 3;
    op.u.cross_entropy.n = logits->shape[0];
    op.u.cross_entropy.c = logits->shape[1];
    kiln__tensor_view(dl, &op.in[0]);
    kiln__tensor_view(db, &op.in[1]);
    kiln__tensor_view(report, &op.in[2]);
    const kiln_tensor_t *inputs[3] = {dl, db, report};
    status = kiln__op_enqueue(call, device, &op, KILN_F32, 0, NULL, inputs, out);
    if (status == KILN_OK) {
      char rule[160];
      snprintf(rule, sizeof rule, "every label must name one of the %lld classes (the op's result is NaN)",
               (long long)logits->shape[1]);
      status = kiln__check_add(queue, report, call, "label", 0, logits->shape[1], rule);
      if (status != KILN_OK) {
        kiln_tensor_release(*out);
        *out = NULL;
      }
    }
  }
  kiln_tensor_release(dl);
  kiln_tensor_release(db);
  kiln_tensor_release(report);
  return status;
}

kiln_conv2d_params_t kiln_conv2d_params_default(void) {
  kiln_conv2d_params_t p = {{1, 1}, {0, 0}, {1, 1}};
  return p;
}

/* Output size of a window sweep; -1 when no window fits (a window whose
 * dilated extent overflows fits nothing). */
void kiln__pooling_op_sizes(kiln_op_t *op, const kiln_tensor_t *x, int64_t P, int64_t Q, const kiln_pool2d_params_t *p) {
  op->u.pooling.n = x->shape[0];
  op->u.pooling.c = x->shape[1];
  op->u.pooling.h = x->shape[2];
  op->u.pooling.w = x->shape[3];
  op->u.pooling.p = P;
  op->u.pooling.q = Q;
  for (int i = 0; i < 2; i++) {
    op->u.pooling.window[i] = p->kernel[i];
    op->u.pooling.stride[i] = p->stride[i];
    op->u.pooling.pad[i] = p->padding[i];
  }
}

int64_t kiln__window_out(int64_t in, int64_t pad, int64_t dil, int64_t kernel, int64_t stride) {
  int64_t reach, padded, span;
  if (__builtin_mul_overflow(dil, kernel - 1, &reach) || __builtin_add_overflow(in, 2 * pad, &padded) ||
      __builtin_sub_overflow(padded, reach + 1, &span))
    return -1;
  return span < 0 ? -1 : span / stride + 1;
}

kiln_status_t kiln_tensor_conv2d(const kiln_tensor_t *x, const kiln_tensor_t *weight, const kiln_tensor_t *bias,
                                 const kiln_conv2d_params_t *params, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_conv2d";
  kiln_status_t status = kiln__op_need(call, "x", x);
  if (status == KILN_OK) status = kiln__op_need(call, "weight", weight);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK) status = kiln__op_same_device(call, "x", x, "weight", weight);
  if (status == KILN_OK && bias) status = kiln__op_same_device(call, "x", x, "bias", bias);
  if (status == KILN_OK) status = kiln__op_need_dtypes(call, "conv2d", "x", x, KILN__DT_FLOAT);
  if (status == KILN_OK) status = kiln__op_same_dtype(call, "conv2d", "x", x, "weight", weight);
  if (status == KILN_OK && bias) status = kiln__op_same_dtype(call, "conv2d", "x", x, "bias", bias);
  if (status != KILN_OK) return status;
  const kiln_dtype_t dtype = x->dtype;
  kiln_conv2d_params_t p = params ? *params : kiln_conv2d_params_default();
  for (int i = 0; i < 2; i++)
    if (p.stride[i] < 1 || p.padding[i] < 0 || p.dilation[i] < 1)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "%s: stride (%d, %d), padding (%d, %d), dilation (%d, %d): strides and dilations must be "
                             ">= 1 and paddings >= 0",
                             call, p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0], p.dilation[1]);
  char tx[128], tw[128];
  kiln__shape_text(x->ndim, x->shape, tx, sizeof tx);
  kiln__shape_text(weight->ndim, weight->shape, tw, sizeof tw);
  if (x->ndim != 4 || weight->ndim != 4)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: x %s and weight %s; pass x [N, C, H, W] and weight [K, C, R, S]",
                           call, tx, tw);
  if (x->shape[1] != weight->shape[1])
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: x has %lld channels but weight expects %lld (x %s, weight %s)", call,
                           (long long)x->shape[1], (long long)weight->shape[1], tx, tw);
  if (weight->shape[1] < 1 || weight->shape[2] < 1 || weight->shape[3] < 1)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: weight %s has an empty channel or window dimension; C, R, S must be >= 1",
                           call, tw);
  if (bias && (bias->ndim != 1 || bias->shape[0] != weight->shape[0]))
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: bias must be [%lld] (one per output channel of weight %s)", call,
                           (long long)weight->shape[0], tw);
  int64_t P = kiln__window_out(x->shape[2], p.padding[0], p.dilation[0], weight->shape[2], p.stride[0]);
  int64_t Q = kiln__window_out(x->shape[3], p.padding[1], p.dilation[1], weight->shape[3], p.stride[1]);
  if (P < 1 || Q < 1)
    return kiln__set_error(KILN_SHAPE_MISMATCH,
                           "%s: the %lldx%lld window (dilation %dx%d) does not fit x %s with padding %dx%d: the output "
                           "would have no positions; pad more or use a smaller kernel",
                           call, (long long)weight->shape[2], (long long)weight->shape[3], p.dilation[0], p.dilation[1],
                           tx, p.padding[0], p.padding[1]);
  int64_t shape[4] = {x->shape[0], weight->shape[0], P, Q};
  kiln_op_t op;
  op.kind = KILN_OP_CONV2D;
  op.n_in = bias ? 3 : 2;
  op.u.conv2d.n = x->shape[0];
  op.u.conv2d.c = x->shape[1];
  op.u.conv2d.h = x->shape[2];
  op.u.conv2d.w = x->shape[3];
  op.u.conv2d.k = weight->shape[0];
  op.u.conv2d.r = weight->shape[2];
  op.u.conv2d.s = weight->shape[3];
  op.u.conv2d.p = P;
  op.u.conv2d.q = Q;
  for (int i = 0; i < 2; i++) {
    op.u.conv2d.stride[i] = p.stride[i];
    op.u.conv2d.pad[i] = p.padding[i];
    op.u.conv2d.dil[i] = p.dilation[i];
  }
  op.u.conv2d.has_bias = bias != NULL;
  if (numel_of(4, shape) == 0) return kiln__op_enqueue(call, x->buffer->device, &op, dtype, 4, shape, NULL, out);
  kiln_tensor_t *dx = NULL, *dw = NULL, *dbias = NULL;
  status = kiln__op_dense(call, x, &dx);
  if (status == KILN_OK) status = kiln__op_dense(call, weight, &dw);
  if (status == KILN_OK && bias) status = kiln__op_dense(call, bias, &dbias);
  if (status == KILN_OK) {
    kiln__tensor_view(dx, &op.in[0]);
    kiln__tensor_view(dw, &op.in[1]);
    if (dbias) kiln__tensor_view(dbias, &op.in[2]);
    const kiln_tensor_t *inputs[3] = {dx, dw, dbias};
    status = kiln__op_enqueue(call, x->buffer->device, &op, dtype, 4, shape, inputs, out);
  }
  kiln_tensor_release(dx);
  kiln_tensor_release(dw);
  kiln_tensor_release(dbias);
  return status;
}

kiln_status_t kiln_tensor_max_pool2d(const kiln_tensor_t *x, const kiln_pool2d_params_t *params, kiln_tensor_t **out) {
  static const char call[] = "kiln_tensor_max_pool2d";
  kiln_status_t status = kiln__op_need(call, "x", x);
  if (status == KILN_OK) status = kiln__op_need_out(call, out);
  if (status == KILN_OK)
    status = kiln__op_need_dtypes(call, "max_pool2d", "x", x, KILN__DT_FLOAT32ISH);
  if (status != KILN_OK) return status;
  if (!params)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: params is NULL; pass the kernel size (and stride, padding)", call);
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
  if (x->ndim != 4)
    return kiln__set_error(KILN_SHAPE_MISMATCH, "%s: x %s; pass x [N, C, H, W]", call, tx);
  int64_t P = kiln__window_out(x->shape[2], p.padding[0], 1, p.kernel[0], p.stride[0]);
  int64_t Q = kiln__window_out(x->shape[3], p.padding[1], 1, p.kernel[1], p.stride[1]);
  if (P < 1 || Q < 1)
    return kiln__set_error(KILN_SHAPE_MISMATCH,
                           "%s: the %dx%d window does not fit x %s with padding %dx%d; use a smaller kernel", call,
                           p.kernel[0], p.kernel[1], tx, p.padding[0], p.padding[1]);
  int64_t shape[4] = {x->shape[0], x->shape[1], P, Q};
  kiln_op_t op;
  op.kind = KILN_OP_MAX_POOL2D;
  op.n_in = 1;
  kiln__pooling_op_sizes(&op, x, P, Q, &p);
  if (numel_of(4, shape) == 0) return kiln__op_enqueue(call, x->buffer->device, &op, x->dtype, 4, shape, NULL, out);
  kiln_tensor_t *dx = NULL;
  status = kiln__op_dense(call, x, &dx);
  if (status != KILN_OK) return status;
  kiln__tensor_view(dx, &op.in[0]);
  const kiln_tensor_t *inputs[1] = {dx};
  status = kiln__op_enqueue(call, x->buffer->device, &op, x->dtype, 4, shape, inputs, out);
  kiln_tensor_release(dx);
  return status;
}
