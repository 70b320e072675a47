/* kernels/kop.h: the kernel-facing op record: one struct that every GPU kernel takes, laid out alike by gcc, nvcc and OpenCL C. */
#ifndef KILN_KERNELS_KOP_H
#define KILN_KERNELS_KOP_H

/*
 * The core resolves an op into a kiln_op_t (runtime/backend.h); a GPU
 * backend turns it into this record with one helper (kiln_backend_kop_fill,
 * plus the operand addresses its dialect needs) and launches a kernel that
 * takes the record whole: by value on CUDA, as one struct argument after the
 * operands' buffers on OpenCL. No backend copies an op's fields into kernel
 * arguments one by one; only a planner (GEMM tiling, a reduction's split,
 * a convolution's rounds) writes the `plan` part of a copy.
 *
 * The same text compiles as C11 (gcc, the host), CUDA C++ (nvcc, the
 * kernels; g++ under the test driver's shim) and OpenCL C 1.2, so it keeps
 * to what the three lay out identically: fixed-width members through the
 * kiln_* types below, every struct a multiple of 8 bytes with explicit
 * padding, no bool, no enum, no pointer. The layout is checked in the test
 * suite (tests/kop_layout): offsets of every member of KILN_KOP_LAYOUT as
 * gcc, nvcc and each OpenCL device's compiler place them.
 *
 * The op's parameters (`u`) are the very union the core fills: kiln_op_t
 * holds a kiln_kop_params_t, so filling the record copies it whole. Fields
 * a kernel does not need cost nothing but the copy.
 */

#if defined(__OPENCL_VERSION__)
typedef long kiln_i64;
typedef ulong kiln_u64;
typedef int kiln_i32;
typedef uint kiln_u32;
typedef float kiln_f32;
#if defined(KILN_CL_HAVE_FP64)
typedef double kiln_f64;
#else
typedef ulong kiln_f64; /* the bits of a double; read only where fp64 exists */
#endif
#else
#include <stdint.h>
typedef int64_t kiln_i64;
typedef uint64_t kiln_u64;
typedef int32_t kiln_i32;
typedef uint32_t kiln_u32;
typedef float kiln_f32;
typedef double kiln_f64;
#endif

/* Dimensions of a view the kernels walk (the core's KILN_MAX_DIMS, checked). */
#define KILN_KOP_MAX_DIMS 8
/* Inputs of an op at most (the update kinds' fourth: the 16-bit copy). */
#define KILN_KOP_MAX_IN 4
/* The dtype codes (kiln_dtype_t) kernels compare operands' `dtype` with
 * (runtime/backend.h checks them against the enum). */
#define KILN_KOP_DT_I32 1
#define KILN_KOP_DT_F16 2
#define KILN_KOP_DT_BF16 3
#define KILN_KOP_DT_I64 5

/* ---- the op's parameters, as the core resolves them ----------------------- */

/* A scalar operand, converted once by the core to what the kernels use:
 * f32 is (float)value (the f32, f16 and bf16 formulas compute with it);
 * i32 is value truncated toward zero, NaN -> 0 and out of range -> the
 * nearest limit (the rule of every kiln backend); `bits` is the value in
 * the op's dtype by the cast rule (kernels/dtype_convert.h), its storage
 * bits in the low bytes: FILL of every dtype and the integer formulas use
 * it (`(IT)bits`), so no kernel converts from f64 (which an OpenCL device
 * without fp64 cannot). */
typedef struct kiln_scalar_t {
  kiln_f64 value;
  kiln_f32 f32;
  kiln_i32 i32;
  kiln_u64 bits;
} kiln_scalar_t;

/* Each kind's parameters; runtime/backend.h says what each means. Flags are
 * kiln_i32 (0 or 1), enumerations kiln_i32 holding the enum's value. */
typedef union kiln_kop_params_t {
  struct { kiln_scalar_t value; } fill;
  struct { kiln_f64 start, step; } arange;
  struct {
    kiln_u64 seed;
    kiln_f32 a, b;
    kiln_i32 normal;
    kiln_i32 pad_;
  } random;
  struct { kiln_i32 op; kiln_i32 pad_; } unary;        /* kiln_unary_op_t */
  struct {
    kiln_scalar_t scalar;
    kiln_i32 op;                                         /* kiln_binary_op_t */
    kiln_i32 pad_;
  } binary;
  struct {
    kiln_i64 batch, m, n, k;
    kiln_i64 lda, ldb, ldc;
    kiln_i64 stride_a, stride_b, stride_c;
    kiln_i32 trans_a, trans_b;
  } matmul;
  struct {
    kiln_i64 outer, len, inner;
    kiln_i32 op;                                         /* kiln_reduce_op_t */
    kiln_i32 pad_;
  } reduce;
  struct { kiln_i64 rows, cols; kiln_i32 log; kiln_i32 pad_; } softmax;
  struct { kiln_i64 n, c; } cross_entropy;
  struct {
    kiln_i64 n, c, h, w, k, r, s, p, q;
    kiln_i32 stride[2], pad[2], dil[2];
    kiln_i32 has_bias;
    kiln_i32 pad_;
  } conv2d;
  struct {
    kiln_i64 n, c, h, w, p, q;
    kiln_i32 window[2], stride[2], pad[2]; /* `kernel` is an OpenCL C keyword */
  } pooling;
  struct {
    kiln_f32 alpha;
    kiln_f32 lr, momentum, dampening, weight_decay;
    kiln_f32 beta1, beta2, eps, bias1, bias2;
    kiln_f32 keep1, keep2, step_size, sqrt_bias2;
    kiln_i32 nesterov;
    kiln_i32 has_buf; /* SGD: in[1] is the momentum buffer */
    kiln_i32 copy;    /* SGD, ADAM: in[3] (f16 or bf16) gets out's new value, rounded */
    kiln_i32 pad_;
  } update;
  struct {
    kiln_scalar_t alpha;           /* INDEX_ADD's factor, in the dtype (kiln_scalar_t's rule) */
    kiln_i64 outer, len, inner, m; /* x [outer, len, inner]; the index's m entries */
    kiln_i32 copy;                 /* INDEX_ADD: store src's element instead of adding (index_copy) */
    kiln_i32 pad_;
  } index;
} kiln_kop_params_t;

/* ---- the record -------------------------------------------------------------- */

/* One operand. `addr`: CUDA, the device address of the view's first
 * element (offset already applied); OpenCL, 0 (the buffer is the kernel's
 * argument of the operand's position, and `offset` counts elements from its
 * start). strides: an elementwise kind's inputs are walked by out's `shape`
 * with these strides (0 where broadcast); other kinds' operands are
 * contiguous unless the kind says otherwise. */
typedef struct kiln_kop_operand_t {
  kiln_u64 addr;
  kiln_i64 offset;
  kiln_i64 strides[KILN_KOP_MAX_DIMS];
  kiln_i32 dtype; /* kiln_dtype_t */
  kiln_i32 pad_;
} kiln_kop_operand_t;

/* What a planner adds to a copy of the record before each launch: the
 * GEMM's operands and tiling, a reduction's split, a convolution round's
 * images. Kernels outside a planner never read it. */
typedef union kiln_kop_plan_t {
  struct {
    kiln_u64 a, b, c;            /* CUDA addresses */
    kiln_i64 a_off, b_off, c_off; /* OpenCL element offsets */
    kiln_i64 m, n, k;
    kiln_i64 lda, ldb, ldc;
    kiln_i64 stride_a, stride_b, stride_c;
    kiln_i64 batch;
    kiln_i32 trans_a, trans_b;
    kiln_i32 c_vec;              /* CUDA: C is 16-byte aligned with lda-like multiples of 4 */
    kiln_i32 pad_;
  } gemm;
  struct {
    kiln_u64 parts;              /* CUDA address of the partial results */
    kiln_i64 chunk, chunks;      /* the reduced axis split into chunks */
    kiln_i64 rows;               /* rows the pass covers */
    kiln_i32 width;              /* columns kernel: columns per block */
    kiln_i32 pad_;
  } reduce;
  struct {
    kiln_u64 in, out, aux;       /* CUDA addresses of this round's operands */
    kiln_i64 in_off, out_off, aux_off; /* OpenCL element offsets */
    kiln_i64 images;             /* images in this round */
    kiln_i64 first;              /* the round's first image */
    kiln_i64 per;                /* images per slice of a round (OpenCL conv2d_backward_weight's packed GEMM) */
  } round;
  kiln_u64 words[18];
} kiln_kop_plan_t;

typedef struct kiln_kop_t {
  kiln_kop_operand_t out;
  kiln_kop_operand_t in[KILN_KOP_MAX_IN];
  kiln_i64 shape[KILN_KOP_MAX_DIMS]; /* out's (elementwise kinds: merged) */
  kiln_i64 n;                        /* elements of out */
  kiln_i32 kind;                     /* kiln_op_kind_t */
  kiln_i32 n_in;
  kiln_i32 ndim;                     /* 0 when every operand is one contiguous run (the core's `flat`) */
  kiln_i32 pad_;
  kiln_kop_params_t u;
  kiln_kop_plan_t plan;
} kiln_kop_t;

/* Every member whose offset the three compilers must agree on, as
 * X(member designator): the layout check expands it in each dialect. */
#define KILN_KOP_LAYOUT(X)                                                                          \
  X(out.addr) X(out.offset) X(out.strides) X(out.dtype) X(in[1].addr) X(in[2].strides[7])           \
  X(in[2].dtype) X(shape) X(n) X(kind) X(n_in) X(ndim) X(u) X(u.fill.value.f32)                      \
  X(u.fill.value.i32) X(u.fill.value.bits) X(u.arange.step) X(u.random.seed) X(u.random.a) X(u.random.b)                \
  X(u.random.normal) X(u.unary.op) X(u.binary.scalar.f32) X(u.binary.scalar.i32) X(u.binary.scalar.bits) X(u.binary.op)    \
  X(u.matmul.batch) X(u.matmul.stride_c) X(u.matmul.trans_a) X(u.matmul.trans_b)                   \
  X(u.reduce.inner) X(u.reduce.op) X(u.softmax.cols) X(u.softmax.log) X(u.cross_entropy.c)         \
  X(u.conv2d.q) X(u.conv2d.stride) X(u.conv2d.pad) X(u.conv2d.dil) X(u.conv2d.has_bias)             \
  X(u.pooling.q) X(u.pooling.window) X(u.pooling.pad) X(u.update.alpha) X(u.update.sqrt_bias2)     \
  X(u.update.nesterov) X(u.update.has_buf) X(u.update.copy) X(in[3].dtype) X(u.index.alpha.bits)  \
  X(u.index.outer) X(u.index.copy)                                                                  \
  X(plan) X(plan.gemm.c_off) X(plan.gemm.batch) X(plan.gemm.trans_b)                               \
  X(plan.gemm.c_vec) X(plan.reduce.parts) X(plan.reduce.rows) X(plan.reduce.width)                 \
  X(plan.round.aux_off) X(plan.round.first) X(plan.round.per)

#endif /* KILN_KERNELS_KOP_H */
