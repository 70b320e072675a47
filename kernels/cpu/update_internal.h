/* kernels/cpu/update_internal.h: the in-place updates' arguments and their per-ISA loops (private to kernels/cpu). */
#ifndef KILN_CPU_UPDATE_INTERNAL_H
#define KILN_CPU_UPDATE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

/* One update's operands and the scalars derived from its op once per call. */
typedef struct kiln_cpu_update_args_t {
  float *param;
  const float *grad;
  float *s1, *s2; /* SGD's momentum buffer (NULL: none); ADAM's m and v */
  float alpha;                                  /* ACCUMULATE */
  float lr, momentum, damp1, wd;                /* SGD (damp1 = 1 - dampening); wd also ADAM's */
  bool nesterov;
  float beta1, beta2, omb1, omb2, step_size, sqrt_b2, eps; /* ADAM (omb = 1 - beta) */
} kiln_cpu_update_args_t;

/* The loops over elements [begin, end) for one ISA. */
typedef void (*kiln_cpu_update_loop_fn)(const kiln_cpu_update_args_t *u, int64_t begin, int64_t end);
typedef struct kiln_cpu_update_isa_t {
  kiln_cpu_update_loop_fn accumulate, sgd, adam;
} kiln_cpu_update_isa_t;

#if defined(KILN_HAVE_AVX512_KERNEL)
extern const kiln_cpu_update_isa_t kiln_cpu_update_avx512;
#endif
#if defined(KILN_HAVE_AVX2_KERNEL)
extern const kiln_cpu_update_isa_t kiln_cpu_update_avx2;
#endif

#endif /* KILN_CPU_UPDATE_INTERNAL_H */
