/* kernels/opencl/update.cl: the fused updates in place (ACCUMULATE, SGD_UPDATE, ADAM_UPDATE, with f16/bf16 gradients and mixed precision's 16-bit copy) and a loss scaler's UNSCALE: one pass over contiguous tensors each. */
/* kiln-kinds: accumulate sgd_update adam_update unscale */
/*
 * The core hands these over flat: every operand one contiguous run of n
 * floats, none overlapping another. Each element is read once and written
 * once, so a pass costs what its memory traffic costs: accumulate moves as
 * much as a plain add, SGD with momentum two floats more, Adam four.
 *
 * Work-item i takes the eight floats from 8*i (vload8 / vstore8: any
 * alignment), and work-item 0 also the last n % 8 one by one. Explicit
 * vectors, because a compiler that vectorises across work-items (PoCL) does
 * not do so through the grid-stride loop, and the scalar loop it leaves runs
 * at a fraction of the memory's speed; GPUs read eight floats a work-item
 * just as well. The host launches (n + 7) / 8 work-items.
 */

#define KILN_UPDATE_W 8

/* The body of an update at element (or eight-wide vector) index i, for
 * scalars (T float, suffix s) and vectors (T float8, suffix v). */
#define KILN_LOAD_s(ptr, i) (ptr)[i]
#define KILN_STORE_s(v, ptr, i) ((ptr)[i] = (v))
#define KILN_LOAD_v(ptr, i) vload8((i), (ptr))
#define KILN_STORE_v(v, ptr, i) vstore8((v), (i), (ptr))

/* Every element once: the vector body over the whole vectors, the scalar
 * body over the tail. BODY(T, S, i) is a macro of the element type, the
 * load/store suffix and the index. */
#define KILN_UPDATE_LOOP(n, BODY)                                                                  \
  do {                                                                                             \
    const long vectors_ = (n) / KILN_UPDATE_W;                                                     \
    KILN_FOR_EACH(i_, vectors_) { BODY(float8, v, i_); }                                           \
    if (get_global_id(0) == 0)                                                                     \
      for (long i_ = vectors_ * KILN_UPDATE_W; i_ < (n); i_++) { BODY(float, s, i_); }             \
  } while (0)

/* p += alpha * g. */
#define KILN_ACCUMULATE_BODY(T, S, i) \
  KILN_STORE_##S(KILN_LOAD_##S(p, i) + alpha * KILN_LOAD_##S(g, i), p, i)

KILN_CL_KERNEL(accumulate_f32_f32) {
  __global float *p = KILN_CL_OUT(float);
  __global const float *g = KILN_CL_IN(float, 0);
  const float alpha = op.u.update.alpha;
  KILN_UPDATE_LOOP(op.n, KILN_ACCUMULATE_BODY);
}

/* The gradient's loads: f32 as it is, f16 and bf16 widened exactly (GD its
 * dtype, S the scalar or vector suffix). */
#define KILN_GLOAD_f32_s(p, i) (p)[i]
#define KILN_GLOAD_f32_v(p, i) vload8((i), (p))
#define KILN_GLOAD_f16_s(p, i) KILN_CL_TO_F32_f16((p)[i])
#define KILN_GLOAD_bf16_s(p, i) KILN_CL_TO_F32_bf16((p)[i])
#define KILN_GLOAD_f16_v(p, i) kiln_upd_widen8_f16(vload8((i), (p)))
#define KILN_GLOAD_bf16_v(p, i) kiln_upd_widen8_bf16(vload8((i), (p)))
#define KILN_GTYPE_f32 float
#define KILN_GTYPE_f16 ushort
#define KILN_GTYPE_bf16 ushort

#define KILN_UPD_WIDEN8_(d)                                                                        \
  KILN_FN float8 kiln_upd_widen8_##d(const ushort8 h) {                                            \
    return (float8)(KILN_CL_TO_F32_##d(h.s0), KILN_CL_TO_F32_##d(h.s1), KILN_CL_TO_F32_##d(h.s2),  \
                    KILN_CL_TO_F32_##d(h.s3), KILN_CL_TO_F32_##d(h.s4), KILN_CL_TO_F32_##d(h.s5),  \
                    KILN_CL_TO_F32_##d(h.s6), KILN_CL_TO_F32_##d(h.s7));                           \
  }
KILN_UPD_WIDEN8_(f16)
KILN_UPD_WIDEN8_(bf16)

/* The 16-bit copy of the updated parameters (in[3] when op.u.update.copy),
 * rounded to nearest even: bf16 when `bf` is 1, f16 otherwise. */
KILN_FN ushort kiln_upd_narrow(const float x, const int bf) {
  return bf ? KILN_CL_FROM_F32_bf16(x) : KILN_CL_FROM_F32_f16(x);
}
KILN_FN void kiln_upd_copy_s(const float x, __global ushort *c, const long i, const int bf) {
  c[i] = kiln_upd_narrow(x, bf);
}
KILN_FN void kiln_upd_copy_v(const float8 x, __global ushort *c, const long i, const int bf) {
  vstore8((ushort8)(kiln_upd_narrow(x.s0, bf), kiln_upd_narrow(x.s1, bf), kiln_upd_narrow(x.s2, bf),
                    kiln_upd_narrow(x.s3, bf), kiln_upd_narrow(x.s4, bf), kiln_upd_narrow(x.s5, bf),
                    kiln_upd_narrow(x.s6, bf), kiln_upd_narrow(x.s7, bf)),
          i, c);
}

/* The new parameter `np` stored, and into the copy when there is one. */
#define KILN_UPD_STORE(T, S, np, i)                                                                \
  do {                                                                                             \
    const T np_ = (np);                                                                            \
    KILN_STORE_##S(np_, p, i);                                                                     \
    if (cp) kiln_upd_copy_##S(np_, cp, i, copy_bf);                                                \
  } while (0)

/* The loop of KILN_UPDATE_LOOP with the gradient's dtype passed to BODY. */
#define KILN_UPDATE_LOOP_G(n, BODY, GD)                                                            \
  do {                                                                                             \
    const long vectors_ = (n) / KILN_UPDATE_W;                                                     \
    KILN_FOR_EACH(i_, vectors_) { BODY(float8, v, i_, GD); }                                       \
    if (get_global_id(0) == 0)                                                                     \
      for (long i_ = vectors_ * KILN_UPDATE_W; i_ < (n); i_++) { BODY(float, s, i_, GD); }         \
  } while (0)

/* The operands every SGD and ADAM kernel starts with. */
#define KILN_UPD_OPERANDS(GD)                                                                      \
  __global float *p = KILN_CL_OUT(float);                                                          \
  __global const KILN_GTYPE_##GD *grad = KILN_CL_IN(KILN_GTYPE_##GD, 0);                           \
  __global ushort *cp = op.u.update.copy ? KILN_CL_IN(ushort, 3) : (__global ushort *)0;           \
  const int copy_bf = op.in[3].dtype == KILN_KOP_DT_BF16

/* g = grad + weight_decay * p; with a buffer (op.u.update.has_buf, in[1]),
 * buf = momentum * buf + (1 - dampening) * g, else buf = g; p -= lr *
 * (nesterov ? g + momentum * buf : buf). */
#define KILN_SGD_BODY(T, S, i, GD)                                                                 \
  do {                                                                                             \
    const T w = KILN_LOAD_##S(p, i);                                                               \
    KILN_UPD_STORE(T, S, w - lr * (KILN_GLOAD_##GD##_##S(grad, i) + weight_decay * w), i);         \
  } while (0)

#define KILN_SGD_MOMENTUM_BODY(T, S, i, GD)                                                        \
  do {                                                                                             \
    const T w = KILN_LOAD_##S(p, i);                                                               \
    const T g = KILN_GLOAD_##GD##_##S(grad, i) + weight_decay * w;                                 \
    const T b = momentum * KILN_LOAD_##S(buf, i) + keep * g;                                       \
    KILN_STORE_##S(b, buf, i);                                                                     \
    KILN_UPD_STORE(T, S, w - lr * (nesterov ? g + momentum * b : b), i);                           \
  } while (0)

#define KILN_SGD_KERNEL_(GD)                                                                       \
  KILN_CL_KERNEL(sgd_update_##GD##_f32) {                                                          \
    KILN_UPD_OPERANDS(GD);                                                                         \
    const long n = op.n;                                                                           \
    const float lr = op.u.update.lr, weight_decay = op.u.update.weight_decay;                      \
    if (!op.u.update.has_buf) {                                                                    \
      KILN_UPDATE_LOOP_G(n, KILN_SGD_BODY, GD);                                                    \
      return;                                                                                      \
    }                                                                                              \
    __global float *buf = KILN_CL_IN(float, 1);                                                    \
    const float momentum = op.u.update.momentum, keep = 1.0f - op.u.update.dampening;              \
    const int nesterov = op.u.update.nesterov;                                                     \
    KILN_UPDATE_LOOP_G(n, KILN_SGD_MOMENTUM_BODY, GD);                                             \
  }
KILN_SGD_KERNEL_(f32)
KILN_SGD_KERNEL_(f16)
KILN_SGD_KERNEL_(bf16)

/* g = grad + weight_decay * p; m = beta1 m + keep1 g; v = beta2 v + keep2 g^2;
 * p -= step_size * (m / (sqrt(v) / sqrt_bias2 + eps)): torch.optim.Adam's order,
 * with keep1 = 1 - beta1, keep2 = 1 - beta2, step_size = lr / bias1 and
 * sqrt_bias2 = sqrt(bias2) folded by the host in double (1 - beta of the float
 * beta would be off by up to 1.3e-5 relative). */
#define KILN_ADAM_BODY(T, S, i, GD)                                                                \
  do {                                                                                             \
    const T w = KILN_LOAD_##S(p, i);                                                               \
    const T g = KILN_GLOAD_##GD##_##S(grad, i) + weight_decay * w;                                 \
    const T mi = beta1 * KILN_LOAD_##S(m, i) + keep1 * g;                                          \
    const T vi = beta2 * KILN_LOAD_##S(v, i) + keep2 * (g * g);                                    \
    KILN_STORE_##S(mi, m, i);                                                                      \
    KILN_STORE_##S(vi, v, i);                                                                      \
    KILN_UPD_STORE(T, S, w - step_size * (mi / (sqrt(vi) / sqrt_bias2 + eps)), i);                 \
  } while (0)

#define KILN_ADAM_KERNEL_(GD)                                                                      \
  KILN_CL_KERNEL(adam_update_##GD##_f32) {                                                         \
    KILN_UPD_OPERANDS(GD);                                                                         \
    __global float *m = KILN_CL_IN(float, 1), *v = KILN_CL_IN(float, 2);                           \
    const float beta1 = op.u.update.beta1, beta2 = op.u.update.beta2, keep1 = op.u.update.keep1;   \
    const float keep2 = op.u.update.keep2, eps = op.u.update.eps;                                  \
    const float weight_decay = op.u.update.weight_decay;                                           \
    const float step_size = op.u.update.step_size, sqrt_bias2 = op.u.update.sqrt_bias2;            \
    KILN_UPDATE_LOOP_G(op.n, KILN_ADAM_BODY, GD);                                                  \
  }
KILN_ADAM_KERNEL_(f32)
KILN_ADAM_KERNEL_(f16)
KILN_ADAM_KERNEL_(bf16)

/* UNSCALE: out = grad * alpha in f32; the flag in[1] (one f32) set to 1.0
 * when an element of grad is an infinity or a NaN (every exponent bit set),
 * by an atomic exchange of its bits, so that many work-items may set it. */
#define KILN_UNSCALE_KERNEL_(GD)                                                                   \
  KILN_CL_KERNEL(unscale_##GD##_f32) {                                                             \
    __global float *out = KILN_CL_OUT(float);                                                      \
    __global const KILN_GTYPE_##GD *grad = KILN_CL_IN(KILN_GTYPE_##GD, 0);                         \
    const float scale = op.u.update.alpha;                                                         \
    int bad = 0;                                                                                   \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      const float x = KILN_GLOAD_##GD##_s(grad, i);                                                \
      bad |= (as_uint(x) & 0x7f800000u) == 0x7f800000u;                                            \
      out[i] = x * scale;                                                                          \
    }                                                                                              \
    if (bad) atomic_xchg((volatile __global int *)KILN_CL_IN(int, 1), 0x3f800000);                 \
  }
KILN_UNSCALE_KERNEL_(f32)
KILN_UNSCALE_KERNEL_(f16)
KILN_UNSCALE_KERNEL_(bf16)
