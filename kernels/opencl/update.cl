/* kernels/opencl/update.cl: the fused updates in place (ACCUMULATE, SGD_UPDATE, ADAM_UPDATE): one pass over contiguous f32 tensors each. */
/* kiln-kinds: accumulate sgd_update adam_update */
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

/* g = grad + weight_decay * p; with a buffer, buf = momentum * buf +
 * (1 - dampening) * g, else buf = g; p -= lr * (nesterov ? g + momentum *
 * buf : buf). */
#define KILN_SGD_BODY(T, S, i)                                                                     \
  do {                                                                                             \
    const T w = KILN_LOAD_##S(p, i);                                                               \
    KILN_STORE_##S(w - lr * (KILN_LOAD_##S(grad, i) + weight_decay * w), p, i);                    \
  } while (0)

#define KILN_SGD_MOMENTUM_BODY(T, S, i)                                                            \
  do {                                                                                             \
    const T w = KILN_LOAD_##S(p, i);                                                               \
    const T g = KILN_LOAD_##S(grad, i) + weight_decay * w;                                         \
    const T b = momentum * KILN_LOAD_##S(buf, i) + keep * g;                                       \
    KILN_STORE_##S(b, buf, i);                                                                     \
    KILN_STORE_##S(w - lr * (nesterov ? g + momentum * b : b), p, i);                              \
  } while (0)

/* The momentum buffer is in[1] when op.n_in is 2. */
KILN_CL_KERNEL(sgd_update_f32_f32) {
  __global float *p = KILN_CL_OUT(float);
  __global const float *grad = KILN_CL_IN(float, 0);
  const long n = op.n;
  const float lr = op.u.update.lr, weight_decay = op.u.update.weight_decay;
  if (op.n_in < 2) {
    KILN_UPDATE_LOOP(n, KILN_SGD_BODY);
    return;
  }
  __global float *buf = KILN_CL_IN(float, 1);
  const float momentum = op.u.update.momentum, keep = 1.0f - op.u.update.dampening;
  const int nesterov = op.u.update.nesterov;
  KILN_UPDATE_LOOP(n, KILN_SGD_MOMENTUM_BODY);
}

/* g = grad + weight_decay * p; m = beta1 m + keep1 g; v = beta2 v + keep2 g^2;
 * p -= step_size * (m / (sqrt(v) / sqrt_bias2 + eps)): torch.optim.Adam's order,
 * with keep1 = 1 - beta1, keep2 = 1 - beta2, step_size = lr / bias1 and
 * sqrt_bias2 = sqrt(bias2) folded by the host in double (1 - beta of the float
 * beta would be off by up to 1.3e-5 relative). */
#define KILN_ADAM_BODY(T, S, i)                                                                    \
  do {                                                                                             \
    const T w = KILN_LOAD_##S(p, i);                                                               \
    const T g = KILN_LOAD_##S(grad, i) + weight_decay * w;                                         \
    const T mi = beta1 * KILN_LOAD_##S(m, i) + keep1 * g;                                          \
    const T vi = beta2 * KILN_LOAD_##S(v, i) + keep2 * (g * g);                                    \
    KILN_STORE_##S(mi, m, i);                                                                      \
    KILN_STORE_##S(vi, v, i);                                                                      \
    KILN_STORE_##S(w - step_size * (mi / (sqrt(vi) / sqrt_bias2 + eps)), p, i);                    \
  } while (0)

KILN_CL_KERNEL(adam_update_f32_f32) {
  __global float *p = KILN_CL_OUT(float);
  __global const float *grad = KILN_CL_IN(float, 0);
  __global float *m = KILN_CL_IN(float, 1), *v = KILN_CL_IN(float, 2);
  const float beta1 = op.u.update.beta1, beta2 = op.u.update.beta2, keep1 = op.u.update.keep1;
  const float keep2 = op.u.update.keep2, eps = op.u.update.eps, weight_decay = op.u.update.weight_decay;
  const float step_size = op.u.update.step_size, sqrt_bias2 = op.u.update.sqrt_bias2;
  KILN_UPDATE_LOOP(op.n, KILN_ADAM_BODY);
}
