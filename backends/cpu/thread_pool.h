/* backends/cpu/thread_pool.h: the CPU backend's thread pool, one per CPU device. */
#ifndef KILN_CPU_THREAD_POOL_H
#define KILN_CPU_THREAD_POOL_H

#include <stdint.h>

#include "kernels/cpu/cpu_kernels.h" /* kiln_cpu_task_fn */

typedef struct kiln_cpu_thread_pool_t kiln_cpu_thread_pool_t;

/* Create a thread pool of `threads` threads in all (the calling thread of
 * parallel_for counts as one, so threads - 1 helpers are started), optionally
 * pinned to the given CPU ids (NULL: not pinned). Returns NULL on failure. */
kiln_cpu_thread_pool_t *kiln_cpu_thread_pool_create(int threads, const int *cpu_ids);
void kiln_cpu_thread_pool_destroy(kiln_cpu_thread_pool_t *tp);
int kiln_cpu_thread_pool_threads(const kiln_cpu_thread_pool_t *tp);

/* Run fn over [0, n) split into at most `threads` contiguous chunks of at
 * least `grain` items (grain >= 1); the caller runs one chunk itself. Blocks
 * until every chunk is done. With n <= grain or one thread, fn(ctx, 0, n, 0)
 * runs inline. Not reentrant: one parallel_for per thread pool at a time (the CPU
 * device's queue workers take turns through a lock inside). */
void kiln_cpu_thread_pool_run(kiln_cpu_thread_pool_t *tp, int64_t n, int64_t grain, kiln_cpu_task_fn fn, void *ctx);

/* The same as the parallel-for kernels are given (kiln_cpu_par_t, `team` is
 * the thread pool). */
void kiln_cpu_thread_pool_par(void *team, int64_t n, int64_t grain, kiln_cpu_task_fn fn, void *ctx);

#endif /* KILN_CPU_THREAD_POOL_H */
