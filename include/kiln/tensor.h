/* kiln/tensor.h: tensors on a device and the operations on them. */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/device.h"
#include "kiln/queue.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef struct kiln_tensor_t kiln_tensor_t;

#define KILN_MAX_DIMS 8

/* Reduce over every axis (argument `axis` of the reductions). */
#define KILN_ALL_AXES 0x7fffffff

/* The dtypes, one row each, in the order of their enum values (the values
 * are ABI: new rows go at the end):
 * X(ENUM, short name, Array API / NumPy name, bytes, DLPack code, DLPack bits, class)
 * The short name appears in messages and GPU kernel names; DLPack codes are
 * kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6. Adding a dtype is
 * a row here and its conversions in kernels/dtype_convert.h. */
#define KILN_DTYPES(X)                                   \
  X(F32, "f32", "float32", 4, 2, 32, FLOAT)              \
  X(I32, "i32", "int32", 4, 0, 32, INT)                  \
  X(F16, "f16", "float16", 2, 2, 16, FLOAT)              \
  X(BF16, "bf16", "bfloat16", 2, 4, 16, FLOAT)           \
  X(F64, "f64", "float64", 8, 2, 64, FLOAT)              \
  X(I64, "i64", "int64", 8, 0, 64, INT)                  \
  X(I8, "i8", "int8", 1, 0, 8, INT)                      \
  X(U8, "u8", "uint8", 1, 1, 8, UINT)                    \
  X(I16, "i16", "int16", 2, 0, 16, INT)                  \
  X(BOOL, "bool", "bool", 1, 6, 8, BOOL)

typedef enum kiln_dtype_t {
#define KILN_DTYPE_ENUM_(E, name, long_name, size, dl_code, dl_bits, cls) KILN_##E,
  KILN_DTYPES(KILN_DTYPE_ENUM_)
#undef KILN_DTYPE_ENUM_
  KILN_DTYPE_COUNT_
} kiln_dtype_t;

/* What kind of number a dtype holds (the promotion lattice's categories). */
typedef enum kiln_dtype_class_t {
  KILN_DTYPE_CLASS_BOOL = 0,
  KILN_DTYPE_CLASS_INT = 1,  /* signed integers */
  KILN_DTYPE_CLASS_UINT = 2, /* unsigned integers */
  KILN_DTYPE_CLASS_FLOAT = 3,
} kiln_dtype_class_t;

/* "f32", "i32", "f16", "bf16", "f64", "i64", "i8", "u8", "i16", "bool"; "?"
 * for an unknown value. Static storage. */
const char *kiln_dtype_name(kiln_dtype_t dtype);
/* The Array API / NumPy name: "float32", "int64", "bfloat16", "bool", ...;
 * "?" for an unknown value. Static storage. */
const char *kiln_dtype_long_name(kiln_dtype_t dtype);
/* Bytes per element, 0 for an unknown value. */
size_t kiln_dtype_size(kiln_dtype_t dtype);
/* The class of a dtype; KILN_DTYPE_CLASS_BOOL for an unknown value. */
kiln_dtype_class_t kiln_dtype_class(kiln_dtype_t dtype);
/* The dtype named `name`, in either form ("f32" or "float32", "bool").
 * KILN_INVALID_ARGUMENT naming it and listing the names otherwise. */
kiln_status_t kiln_dtype_from_name(const char *name, kiln_dtype_t *out_dtype);

/* The dtype two operands of a binary operation are promoted to (the one
 * table of docs/dtypes.md): the Array API standard's type-promotion lattice,
 * bool < i8 < i16 < i32 < i64, u8 < i16 (so u8 with i8 is i16), f16 < f32 <
 * f64 and bf16 < f32 (so f16 with bf16 is f32), and where the standard
 * leaves mixed kinds undefined, PyTorch's choice: bool with anything is the
 * other, an integer with a float is that float. A C scalar operand
 * (kiln_tensor_*_scalar) never takes part: it is converted to the tensor's
 * dtype, so it never widens it. KILN_INVALID_ARGUMENT for a value that is
 * not a kiln_dtype_t. Never blocks. */
kiln_status_t kiln_result_dtype(kiln_dtype_t a, kiln_dtype_t b, kiln_dtype_t *out_dtype);

/* How a device serves a dtype: NATIVE, its own arithmetic; EMULATED, stored
 * in the dtype and computed through conversions to a wider one (f16 through
 * F16C on the CPU); UNSUPPORTED, storage only (empty, from_host, read,
 * copies between devices): every op of that dtype on that device fails with
 * KILN_UNSUPPORTED naming the device and the dtype. */
typedef enum kiln_dtype_support_t {
  KILN_DTYPE_UNSUPPORTED = 0,
  KILN_DTYPE_EMULATED = 1,
  KILN_DTYPE_NATIVE = 2,
} kiln_dtype_support_t;

/* How `device` serves `dtype` (what devinfo shows per device and dtype).
 * KILN_DTYPE_UNSUPPORTED for a NULL device or an unknown dtype. Never blocks. */
kiln_dtype_support_t kiln_device_dtype_support(const kiln_device_t *device, kiln_dtype_t dtype);
/* "native", "emulated", "unsupported". Static storage. */
const char *kiln_dtype_support_name(kiln_dtype_support_t support);

/* The operation lists, once. Names match the kernels' op table
 * (kernels/ops.def) and the op names of KILN_PROVIDER. */
#define KILN_UNARY_OPS(X) \
  X(NEG, neg) X(ABS, abs) X(EXP, exp) X(LOG, log) X(SQRT, sqrt) X(RELU, relu) X(SIGMOID, sigmoid) X(TANH, tanh)
#define KILN_BINARY_OPS(X) \
  X(ADD, add) X(SUB, sub) X(MUL, mul) X(DIV, div) X(MAXIMUM, maximum) X(MINIMUM, minimum) X(EQ, eq)

typedef enum kiln_unary_op_t {
#define KILN_UNARY_ENUM_(NAME, name) KILN_UNARY_##NAME,
  KILN_UNARY_OPS(KILN_UNARY_ENUM_)
#undef KILN_UNARY_ENUM_
  KILN_UNARY_COUNT_
} kiln_unary_op_t;

typedef enum kiln_binary_op_t {
#define KILN_BINARY_ENUM_(NAME, name) KILN_BINARY_##NAME,
  KILN_BINARY_OPS(KILN_BINARY_ENUM_)
#undef KILN_BINARY_ENUM_
  KILN_BINARY_COUNT_
} kiln_binary_op_t;

/* Comparisons and logical operations: (a, b) of one dtype -> bool. The
 * Array API's names. */
#define KILN_COMPARE_OPS(X)                                                                               \
  X(EQUAL, equal) X(NOT_EQUAL, not_equal) X(LESS, less) X(LESS_EQUAL, less_equal) X(GREATER, greater)     \
  X(GREATER_EQUAL, greater_equal) X(LOGICAL_AND, logical_and) X(LOGICAL_OR, logical_or)                   \
  X(LOGICAL_XOR, logical_xor)

typedef enum kiln_compare_op_t {
#define KILN_COMPARE_ENUM_(NAME, name) KILN_COMPARE_##NAME,
  KILN_COMPARE_OPS(KILN_COMPARE_ENUM_)
#undef KILN_COMPARE_ENUM_
  KILN_COMPARE_COUNT_
} kiln_compare_op_t;

/* Conventions for every function below:
 * - Operations are enqueued on the current queue of the operands' device
 *   (kiln_device_current_queue) and return at once; the result is a new tensor
 *   the caller owns (release it). Reading to the host is where the caller waits.
 * - Operands must live on one device, else KILN_DEVICE_MISMATCH with a message
 *   naming both devices and the kiln_tensor_to call that fixes it. kiln never
 *   copies between devices implicitly.
 * - Shapes are int64_t arrays of `ndim` (0..KILN_MAX_DIMS) non-negative sizes.
 *   A negative size, too many dims or a byte size that overflows size_t is
 *   KILN_INVALID_ARGUMENT; a device allocation that does not fit is
 *   KILN_OUT_OF_MEMORY. Nothing is written to *out on failure.
 * - Every handle is safe to use from any thread. */

/* ---- object ------------------------------------------------------------ */

kiln_tensor_t *kiln_tensor_retain(kiln_tensor_t *tensor);
/* Memory is recycled once enqueued work that uses it is done; never blocks. */
void kiln_tensor_release(kiln_tensor_t *tensor);

kiln_dtype_t kiln_tensor_dtype(const kiln_tensor_t *tensor);
int kiln_tensor_ndim(const kiln_tensor_t *tensor);
/* Arrays of ndim entries owned by the tensor. Strides are in elements. */
const int64_t *kiln_tensor_shape(const kiln_tensor_t *tensor);
const int64_t *kiln_tensor_strides(const kiln_tensor_t *tensor);
int64_t kiln_tensor_numel(const kiln_tensor_t *tensor);
kiln_device_t *kiln_tensor_device(const kiln_tensor_t *tensor);
/* The buffer under the tensor (borrowed) and the tensor's first element in it. */
kiln_buffer_t *kiln_tensor_buffer(const kiln_tensor_t *tensor);
size_t kiln_tensor_offset_bytes(const kiln_tensor_t *tensor);
bool kiln_tensor_is_contiguous(const kiln_tensor_t *tensor);

/* The provider ("native", "blas", "clblast", "cublas", "cudnn") that ran the
 * last operation the calling thread enqueued, "" if none. Static storage. */
const char *kiln_last_provider(void);

/* How many operations of one name one provider ran. */
typedef struct kiln_provider_use_t {
  const char *op;       /* a name of kiln_op_name: "matmul", "add", "cross_entropy", ...; static storage */
  const char *provider; /* "native", "blas", ...; static storage */
  uint64_t calls;
} kiln_provider_use_t;

/* Which provider ran each operation the calling thread enqueued since its
 * last kiln_provider_uses_reset (or since it began): one entry per (op name,
 * provider) pair that ran, in kiln_op_name order. Unary and binary ops are
 * counted under their own names ("relu", "add"), the other kinds under the
 * kind's. Writes at most `capacity` entries to out_uses (which may be NULL)
 * and returns how many pairs there are. Counting costs an increment per op;
 * it is always on. Never blocks, never fails. */
size_t kiln_provider_uses(kiln_provider_use_t *out_uses, size_t capacity);
/* Start the calling thread's counts afresh. */
void kiln_provider_uses_reset(void);

/* ---- creation ---------------------------------------------------------- */

kiln_status_t kiln_tensor_empty(kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                const int64_t *shape, kiln_tensor_t **out);
kiln_status_t kiln_tensor_zeros(kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                const int64_t *shape, kiln_tensor_t **out);
kiln_status_t kiln_tensor_ones(kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                               const int64_t *shape, kiln_tensor_t **out);
kiln_status_t kiln_tensor_full(kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                               const int64_t *shape, double value, kiln_tensor_t **out);
/* 1-D [start, stop) by step (step != 0), as NumPy's arange. */
kiln_status_t kiln_tensor_arange(kiln_device_t *device, kiln_dtype_t dtype, double start,
                                 double stop, double step, kiln_tensor_t **out);
/* A tensor holding a copy of `data` (numel * dtype size bytes, row-major). The
 * host memory may be reused as soon as the call returns (it blocks until the
 * data has left it). */
kiln_status_t kiln_tensor_from_host(kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                    const int64_t *shape, const void *data, kiln_tensor_t **out);
/* f32 uniform in [low, high) and normal(mean, stddev) from Philox4x32-10 with
 * key `seed`: element i draws from counter i, so the same seed gives the same
 * numbers, bit for bit, on every backend and device (normal's log, sqrt and
 * cos are kernels/philox.h's own, not the platform's). */
kiln_status_t kiln_tensor_uniform(kiln_device_t *device, int ndim, const int64_t *shape,
                                  uint64_t seed, float low, float high, kiln_tensor_t **out);
kiln_status_t kiln_tensor_normal(kiln_device_t *device, int ndim, const int64_t *shape,
                                 uint64_t seed, float mean, float stddev, kiln_tensor_t **out);
/* The same in any float dtype (f32, f64, f16, bf16), bit for bit the same
 * per dtype on every backend that serves it: f32 as above; f16 and bf16 the
 * f32 numbers rounded to nearest even (so a uniform may round up to `high`);
 * f64 from 53-bit uniforms of the same counters, computed in double
 * (kernels/philox.h defines each). The bounds are f32 values in every dtype.
 * Another dtype: KILN_DTYPE_MISMATCH; a device without kernels for it:
 * KILN_UNSUPPORTED. */
kiln_status_t kiln_tensor_uniform_dtype(kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                        const int64_t *shape, uint64_t seed, float low, float high,
                                        kiln_tensor_t **out);
kiln_status_t kiln_tensor_normal_dtype(kiln_device_t *device, kiln_dtype_t dtype, int ndim,
                                       const int64_t *shape, uint64_t seed, float mean, float stddev,
                                       kiln_tensor_t **out);

/* ---- movement ---------------------------------------------------------- */

/* Copy the tensor's elements, row-major, into host memory of `size` bytes
 * (must be at least numel * dtype size, else KILN_INVALID_ARGUMENT). Blocks
 * until the data arrived: this is where the caller waits for the device. */
kiln_status_t kiln_tensor_read(const kiln_tensor_t *tensor, void *host, size_t size);
/* The one value of a one-element tensor of any dtype, as a double (exact
 * except i64 beyond 2^53, rounded to nearest even). Blocks. */
kiln_status_t kiln_tensor_item(const kiln_tensor_t *tensor, double *out_value);

/* A new tensor on `device` holding the same values; always a new copy, even on
 * the same device. */
kiln_status_t kiln_tensor_copy(const kiln_tensor_t *tensor, kiln_device_t *device,
                               kiln_tensor_t **out);
/* `tensor` itself (retained) when it already lives on `device`, a copy
 * otherwise. */
kiln_status_t kiln_tensor_to(kiln_tensor_t *tensor, kiln_device_t *device, kiln_tensor_t **out);

/* A view with a new shape when the layout allows, else a contiguous copy. One
 * size may be -1 (inferred). KILN_SHAPE_MISMATCH when counts differ. */
kiln_status_t kiln_tensor_reshape(kiln_tensor_t *tensor, int ndim, const int64_t *shape,
                                  kiln_tensor_t **out);
/* Views sharing the tensor's memory. Negative dims count from the end. */
kiln_status_t kiln_tensor_transpose(kiln_tensor_t *tensor, int dim0, int dim1, kiln_tensor_t **out);
kiln_status_t kiln_tensor_permute(kiln_tensor_t *tensor, const int *perm, kiln_tensor_t **out);
/* `tensor` itself (retained) when contiguous, else a contiguous copy. */
kiln_status_t kiln_tensor_contiguous(kiln_tensor_t *tensor, kiln_tensor_t **out);
/* A view of the elements start, start + step, ... before stop along `dim`
 * (negative counts from the end), sharing the tensor's memory (the view keeps
 * it alive): Python's t[start:stop:step] on one axis, as offset and strides
 * only. start and stop count from the end when negative (once) and are then
 * clamped to [0, size]; stop <= start gives an empty view. step must be >= 1
 * (kiln's strides are never negative), else KILN_INVALID_ARGUMENT; so is a
 * dim out of range. Never blocks. */
kiln_status_t kiln_tensor_slice(kiln_tensor_t *tensor, int dim, int64_t start, int64_t stop, int64_t step,
                                kiln_tensor_t **out);
/* Write src's values into the existing tensor dst, which may be any view (a
 * slice, a permutation): src broadcasts to dst's shape (NumPy's rule) and is
 * converted to dst's dtype (kiln_tensor_cast's rule); a src sharing dst's
 * memory is read before anything is written. Enqueued on the device's
 * current queue; src and dst on one device (else KILN_DEVICE_MISMATCH).
 * KILN_SHAPE_MISMATCH when src does not broadcast to dst. Contiguous dst: one
 * copy; otherwise one copy per dense run of dst's innermost dims (a step in
 * the last dim makes every element a run). Returns at once. */
kiln_status_t kiln_tensor_copy_into(kiln_tensor_t *dst, const kiln_tensor_t *src);

/* ---- elementwise ------------------------------------------------------- */

/* Unary ops on f32; neg, abs and relu on i32 too. Every compute op refuses
 * a dtype it has no kernel for (today anything but f32 and i32) before
 * dispatch with KILN_DTYPE_MISMATCH naming the op, the dtype and the cast
 * that makes it valid ("sqrt of i64: cast to f32 first"). */
kiln_status_t kiln_tensor_unary(kiln_unary_op_t op, const kiln_tensor_t *a, kiln_tensor_t **out);
/* Binary ops with NumPy broadcasting. Operands of two dtypes are first
 * converted to kiln_result_dtype(a, b) (kiln_tensor_cast's rule). i32 division
 * truncates toward zero, and x / 0 is 0 for i32. eq is 1 where a == b and 0
 * elsewhere, in the operands' dtype (NaN equals nothing): with kiln_tensor_sum
 * it counts matches, as an accuracy needs. */
kiln_status_t kiln_tensor_binary(kiln_binary_op_t op, const kiln_tensor_t *a, const kiln_tensor_t *b,
                                 kiln_tensor_t **out);
/* a where cond is nonzero, else b, with NumPy broadcasting over the three
 * (torch.where, numpy.where): cond f32 or i32 (NaN counts as nonzero), a and
 * b of one dtype, the result's. */
kiln_status_t kiln_tensor_where(const kiln_tensor_t *cond, const kiln_tensor_t *a, const kiln_tensor_t *b,
                                kiln_tensor_t **out);
/* a (op) scalar, the scalar converted to a's dtype (a scalar never widens
 * the tensor's dtype; for an integer tensor a fraction is truncated, unlike
 * PyTorch, which would give a float result). */
kiln_status_t kiln_tensor_binary_scalar(kiln_binary_op_t op, const kiln_tensor_t *a, double scalar,
                                        kiln_tensor_t **out);

#define KILN_UNARY_DECL_(NAME, name) \
  kiln_status_t kiln_tensor_##name(const kiln_tensor_t *a, kiln_tensor_t **out);
KILN_UNARY_OPS(KILN_UNARY_DECL_)
#undef KILN_UNARY_DECL_
#define KILN_BINARY_DECL_(NAME, name)                                                      \
  kiln_status_t kiln_tensor_##name(const kiln_tensor_t *a, const kiln_tensor_t *b,         \
                                   kiln_tensor_t **out);                                   \
  kiln_status_t kiln_tensor_##name##_scalar(const kiln_tensor_t *a, double scalar,         \
                                            kiln_tensor_t **out);
KILN_BINARY_OPS(KILN_BINARY_DECL_)
#undef KILN_BINARY_DECL_

/* a (op) b elementwise into a bool tensor (1 where it holds), for every
 * dtype: operands of two dtypes are promoted first (kiln_result_dtype), and
 * broadcast as binary ops are. Floats compare as IEEE does (NaN is unequal
 * to everything, so not_equal holds for it); the logical operations take
 * nonzero as true (NaN is true). f16 and bf16 compare exactly (through
 * f32). */
kiln_status_t kiln_tensor_compare(kiln_compare_op_t op, const kiln_tensor_t *a, const kiln_tensor_t *b,
                                  kiln_tensor_t **out);
#define KILN_COMPARE_DECL_(NAME, name) \
  kiln_status_t kiln_tensor_##name(const kiln_tensor_t *a, const kiln_tensor_t *b, kiln_tensor_t **out);
KILN_COMPARE_OPS(KILN_COMPARE_DECL_)
#undef KILN_COMPARE_DECL_
/* a == 0 into a bool tensor (NaN is true, so not NaN's negation). */
kiln_status_t kiln_tensor_logical_not(const kiln_tensor_t *a, kiln_tensor_t **out);

/* The values of `a` converted to `dtype`, any dtype to any dtype, by one
 * rule on every device (bit-exact; kernels/dtype_convert.h):
 * - into f16 and bf16: round to nearest, ties to even, from the exact value
 *   (f64 and i64 are rounded once, never through f32); NaN stays a quiet
 *   NaN (sign and top payload bits kept), +-inf and -0 stay, subnormals are
 *   kept (and made where the value is that small); past the largest finite
 *   value (f16 65504) the result is +-inf;
 * - float into f32 / f64, and integer into any float: round to nearest,
 *   ties to even (i64 -> f32 rounds once);
 * - float into an integer: truncation toward zero; NaN becomes 0; a value
 *   beyond the integer's range becomes the nearest limit (-inf -> INT_MIN,
 *   300.0 -> u8 255, -1.5 -> u8 0);
 * - integer into a narrower integer: wraps modulo 2^bits (two's complement,
 *   as NumPy's astype and PyTorch's to: i32 300 -> u8 44, i16 -1 -> u8 255);
 * - anything into bool: value != 0 (NaN -> true, -0.0 -> false); bool into
 *   a number: 0 or 1.
 * To the same dtype it is a copy. Always a new contiguous tensor. Devices
 * without kernels for a dtype refuse it with KILN_UNSUPPORTED
 * (kiln_device_dtype_support). */
kiln_status_t kiln_tensor_cast(const kiln_tensor_t *a, kiln_dtype_t dtype, kiln_tensor_t **out);

/* ---- linear algebra ---------------------------------------------------- */

/* op(a) @ op(b), op = transpose of the last two dims when trans_* is set.
 * a: [M,K] or [B,M,K]; b: [K,N] or [B,K,N] (a 2-D operand broadcasts over the
 * batch). Float dtypes (f32, f64, f16, bf16; KILN_DTYPE_MISMATCH naming the
 * cast for others); operands of two float dtypes promote as binary ops do
 * (kiln_result_dtype). f16 and bf16 multiply and accumulate in f32 and round
 * once to the dtype. Result of that dtype, [M,N] or [B,M,N], contiguous. */
kiln_status_t kiln_tensor_matmul(const kiln_tensor_t *a, const kiln_tensor_t *b, bool trans_a,
                                 bool trans_b, kiln_tensor_t **out);

/* ---- reductions ----------------------------------------------------------
 * Along `axis` (negative counts from the end) or KILN_ALL_AXES; keepdim keeps
 * the reduced axis with size 1. sum takes every dtype: the sum of an
 * integer or bool tensor is i64 (wrapping modulo 2^64, accumulated in i64),
 * of a float tensor the same float (f16 and bf16 accumulated in f32, f64 in
 * f64). mean takes the floats and keeps the dtype; max every dtype but bool
 * (same dtype; NaN wins); argmax the same, returning i32 indices (first
 * maximum). A dtype an op does not take is KILN_DTYPE_MISMATCH naming the
 * cast to make. max/argmax of an empty axis is KILN_INVALID_ARGUMENT; the
 * sum of nothing is 0 and its mean NaN. */
kiln_status_t kiln_tensor_sum(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out);
kiln_status_t kiln_tensor_mean(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out);
kiln_status_t kiln_tensor_max(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out);
kiln_status_t kiln_tensor_argmax(const kiln_tensor_t *a, int axis, bool keepdim, kiln_tensor_t **out);
/* Frobenius norm, sqrt(sum(a*a)), over all elements: a 0-d tensor of a's
 * dtype, which is a float (f16 and bf16 computed in f32). */
kiln_status_t kiln_tensor_norm(const kiln_tensor_t *a, kiln_tensor_t **out);

/* ---- neural-network operations ----------------------------------------- */

/* Along the last axis, f32, numerically stable (max subtracted). */
kiln_status_t kiln_tensor_softmax(const kiln_tensor_t *a, kiln_tensor_t **out);
kiln_status_t kiln_tensor_log_softmax(const kiln_tensor_t *a, kiln_tensor_t **out);
/* Mean over N of -log_softmax(logits)[n, labels[n]]: logits f32 [N,C],
 * labels i32 [N]; a 0-d f32 tensor. The labels live on the device, so a
 * label outside [0, C) is found there without making the caller wait: the
 * loss is NaN, and the queue's next synchronisation (kiln_queue_finish, or a
 * blocking read such as kiln_tensor_read or kiln_tensor_item on that queue)
 * returns KILN_INDEX_OUT_OF_RANGE naming the first bad label and its
 * position, once (as PyTorch's IndexError; on CUDA, a device-side assert). */
kiln_status_t kiln_tensor_cross_entropy(const kiln_tensor_t *logits, const kiln_tensor_t *labels,
                                        kiln_tensor_t **out);

typedef struct kiln_conv2d_params_t {
  int32_t stride[2];   /* (h, w) >= 1 */
  int32_t padding[2];  /* (h, w) >= 0, zeros */
  int32_t dilation[2]; /* (h, w) >= 1 */
} kiln_conv2d_params_t;

/* Stride 1, padding 0, dilation 1. */
kiln_conv2d_params_t kiln_conv2d_params_default(void);

/* Cross-correlation as in deep-learning frameworks. x [N,C,H,W], weight
 * [K,C,R,S], bias [K] or NULL, all of one float dtype (f32, f64, f16, bf16;
 * f16/bf16 compute in f32 and round once); result of that dtype, [N,K,P,Q] with
 * P = (H + 2*pad_h - dil_h*(R-1) - 1) / stride_h + 1 (likewise Q). params NULL
 * means the defaults. KILN_SHAPE_MISMATCH when channels differ or the output
 * would be empty of positions (P or Q < 1). */
kiln_status_t kiln_tensor_conv2d(const kiln_tensor_t *x, const kiln_tensor_t *weight,
                                 const kiln_tensor_t *bias, const kiln_conv2d_params_t *params,
                                 kiln_tensor_t **out);

typedef struct kiln_pool2d_params_t {
  int32_t kernel[2];  /* (h, w) >= 1 */
  int32_t stride[2];  /* (h, w) >= 1; 0 means equal to kernel */
  int32_t padding[2]; /* (h, w) >= 0 and <= kernel/2; padded cells never win */
} kiln_pool2d_params_t;

/* Max pooling over [N,C,H,W] f32; result [N,C,P,Q] as for conv2d. */
kiln_status_t kiln_tensor_max_pool2d(const kiln_tensor_t *x, const kiln_pool2d_params_t *params,
                                     kiln_tensor_t **out);

/* ---- training: gradients ------------------------------------------------
 * The backward operations a reverse-mode tape needs, each the gradient of one
 * forward operation above. `dy` is the gradient of the loss with respect to
 * the forward result; the result is the gradient with respect to one input,
 * a new tensor like every other result. All f32; same rules as above. */

/* dy * f'(x) for the unary op (x its forward input; the derivatives are
 * written next to the formulas in kernels/ops.def). x and dy of one shape;
 * relu'(0) = 0, abs'(0) = 0. */
kiln_status_t kiln_tensor_unary_backward(kiln_unary_op_t op, const kiln_tensor_t *x, const kiln_tensor_t *dy,
                                         kiln_tensor_t **out_dx);

/* The sum of `a` over the axes along which `shape` (ndim dims) broadcasts to
 * a's shape, NumPy's rule read backwards: the gradient of a broadcast operand
 * of a binary op. Result of `shape`. KILN_SHAPE_MISMATCH when shape does not
 * broadcast to a's. Every dtype; the result keeps a's dtype (integers wrap
 * modulo 2^bits, a bool result is whether any term was true). */
kiln_status_t kiln_tensor_sum_to(const kiln_tensor_t *a, int ndim, const int64_t *shape, kiln_tensor_t **out);
/* `a` broadcast to `shape` (NumPy's rule) as a new contiguous tensor: a
 * reduced gradient spread back. Every dtype. */
kiln_status_t kiln_tensor_broadcast_to(const kiln_tensor_t *a, int ndim, const int64_t *shape, kiln_tensor_t **out);

/* softmax / log_softmax backward along the last axis, from the forward's
 * result y: softmax: dx = y * (dy - sum(dy * y)); log_softmax:
 * dx = dy - exp(y) * sum(dy). y and dy of one shape. */
kiln_status_t kiln_tensor_softmax_backward(const kiln_tensor_t *y, const kiln_tensor_t *dy, bool log,
                                           kiln_tensor_t **out_dx);
/* The gradient of kiln_tensor_cross_entropy (the mean over N) with respect to
 * the logits: (softmax(logits) - onehot(labels)) / N, times dloss when dloss
 * is given (a one-element f32 tensor on the same device; NULL means 1). A
 * label outside [0, C) gives a row of NaN. */
kiln_status_t kiln_tensor_cross_entropy_backward(const kiln_tensor_t *logits, const kiln_tensor_t *labels,
                                                 const kiln_tensor_t *dloss, kiln_tensor_t **out_dlogits);

/* conv2d's gradients, for the forward kiln_tensor_conv2d(x, weight, bias,
 * params) whose result had the shape of dy [N,K,P,Q]:
 * - input: dx [N,C,H,W] from dy and weight; x_shape gives N,C,H,W (P and Q
 *   must be what the forward made of them);
 * - weight: dw [K,C,R,S] from x and dy; w_shape gives K,C,R,S;
 * - bias: db [K], the sum of dy over N, P and Q.
 * params NULL means the defaults. KILN_SHAPE_MISMATCH when the shapes do not
 * belong to one forward convolution. */
kiln_status_t kiln_tensor_conv2d_backward_input(const kiln_tensor_t *dy, const kiln_tensor_t *weight,
                                                const int64_t x_shape[4], const kiln_conv2d_params_t *params,
                                                kiln_tensor_t **out_dx);
kiln_status_t kiln_tensor_conv2d_backward_weight(const kiln_tensor_t *x, const kiln_tensor_t *dy,
                                                 const int64_t w_shape[4], const kiln_conv2d_params_t *params,
                                                 kiln_tensor_t **out_dw);
kiln_status_t kiln_tensor_conv2d_backward_bias(const kiln_tensor_t *dy, kiln_tensor_t **out_db);

/* max_pool2d's gradient: dy [N,C,P,Q] routed to the element of x that won
 * each window (the first maximum in row-major order, as PyTorch does),
 * summed where windows overlap; dx has x's shape. */
kiln_status_t kiln_tensor_max_pool2d_backward(const kiln_tensor_t *x, const kiln_tensor_t *dy,
                                              const kiln_pool2d_params_t *params, kiln_tensor_t **out_dx);

/* ---- training: updates in place ----------------------------------------
 * These write into existing tensors instead of returning new ones: they
 * allocate nothing, and are enqueued on the tensors' device's current queue
 * in order with everything else (later reads see the update). Every tensor
 * involved is f32, contiguous, of one shape and on one device; the updated
 * ones must not be views sharing memory with another operand. One fused
 * kernel per call. */

/* a += alpha * b (gradient accumulation: alpha 1). */
kiln_status_t kiln_tensor_accumulate(kiln_tensor_t *a, double alpha, const kiln_tensor_t *b);

typedef struct kiln_sgd_params_t {
  double lr;           /* > 0 */
  double momentum;     /* >= 0; 0 needs no buffer */
  double dampening;    /* in [0, 1] */
  double weight_decay; /* >= 0: g += weight_decay * param (L2) */
  bool nesterov;       /* needs momentum > 0 and dampening 0 */
  bool first_step;     /* the buffer's first update: buf = g, whatever the dampening */
} kiln_sgd_params_t;

/* SGD as PyTorch's torch.optim.SGD, with a momentum buffer that starts at
 * zero: g = grad + wd * param; buf = momentum * buf + (1 - dampening) * g,
 * except on the buffer's first update (first_step), where torch sets buf = g;
 * param -= lr * (nesterov ? g + momentum * buf : buf) (buf = g without
 * momentum). momentum_buf may be NULL only when momentum is 0. Every
 * hyperparameter must also be finite as a float (the kernels compute in f32). */
kiln_status_t kiln_tensor_sgd_update(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *momentum_buf,
                                     const kiln_sgd_params_t *params);

typedef struct kiln_adam_params_t {
  double lr;           /* > 0 */
  double beta1, beta2; /* in [0, 1) */
  double eps;          /* > 0 */
  double weight_decay; /* >= 0: g += weight_decay * param (L2, as torch.optim.Adam) */
} kiln_adam_params_t;

/* Adam as torch.optim.Adam: m and v start at zero; `step` counts updates
 * from 1 (the bias corrections 1 - beta^step). m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g^2; param -= lr * (m / c1) / (sqrt(v / c2) + eps). */
kiln_status_t kiln_tensor_adam_update(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *m,
                                      kiln_tensor_t *v, int64_t step, const kiln_adam_params_t *params);

/* Mixed precision: both updates take grad in f32, f16 or bf16 (read exactly
 * into f32; param, the momentum buffer, m and v stay f32). The _mixed forms
 * also store param's new value, rounded to nearest even, into `copy` (f16 or
 * bf16, param's shape): the low-precision weights of the next forward, in
 * the same pass that reads the gradient and writes param (one kernel per
 * tensor, no cast after). copy NULL is the plain update. */
kiln_status_t kiln_tensor_sgd_update_mixed(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *momentum_buf,
                                           kiln_tensor_t *copy, const kiln_sgd_params_t *params);
kiln_status_t kiln_tensor_adam_update_mixed(kiln_tensor_t *param, const kiln_tensor_t *grad, kiln_tensor_t *m,
                                            kiln_tensor_t *v, kiln_tensor_t *copy, int64_t step,
                                            const kiln_adam_params_t *params);

/* ---- indexing by a tensor of indices ---------------------------------------------
 * index: a 1-D i32 or i64 tensor on x's device; an entry counts from the end
 * when negative (as NumPy's and PyTorch's advanced indexing); one outside
 * [-len, len) is reported at the queue's next synchronisation as
 * KILN_INDEX_OUT_OF_RANGE naming it (the device checks it, as CUDA's device
 * asserts), and reads as zeros / adds nothing meanwhile. */

/* The slices of x along `axis` at the indices: *out has x's shape with
 * len(index) along axis, out[..., j, ...] = x[..., index[j], ...]
 * (torch.index_select, numpy.take with an axis). Any dtype. */
kiln_status_t kiln_tensor_index_select(const kiln_tensor_t *x, int axis, const kiln_tensor_t *index,
                                       kiln_tensor_t **out);
/* In place: x[..., index[j], ...] += alpha * src[..., j, ...], repeated
 * indices accumulating in order of j (torch.Tensor.index_add_; the gradient
 * of index_select). src has x's dtype and shape but len(index) along axis;
 * x is contiguous; f32, f64, f16, bf16 (computed as their adds are), i32
 * and i64 (wrapping; alpha whole). The same sums on every backend. */
kiln_status_t kiln_tensor_index_add(kiln_tensor_t *x, int axis, const kiln_tensor_t *index, const kiln_tensor_t *src,
                                    double alpha);
/* In place: x[..., index[j], ...] = src[..., j, ...] (torch.Tensor.index_copy_;
 * what x[idx] = v is in Python): the last of repeated indices wins, on every
 * backend. src and x as index_add's. */
kiln_status_t kiln_tensor_index_copy(kiln_tensor_t *x, int axis, const kiln_tensor_t *index, const kiln_tensor_t *src);

/* A loss scaler's check and unscale in one pass over a gradient (torch's
 * _amp_foreach_non_finite_check_and_unscale_, for one tensor): *out = grad
 * * scale in f32 (grad f32, f16 or bf16, contiguous), and found_inf (one f32
 * element on grad's device) set to 1 when any element of grad is an
 * infinity or a NaN, left as it was otherwise. scale must be finite as a
 * float (1 / the loss scale). */
kiln_status_t kiln_tensor_unscale(const kiln_tensor_t *grad, double scale, kiln_tensor_t *found_inf,
                                  kiln_tensor_t **out);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_TENSOR_H */
