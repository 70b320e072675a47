/* backends/cpu/threadpool.h: the CPU backend's thread pool, one per CPU device. */
#ifndef KILN_CPU_THREADPOOL_H
#define KILN_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct kiln_cpu_pool_t kiln_cpu_pool_t;

/* fn runs over [begin, end) on thread `thread` (0 .. threads-1). */
typedef void (*kiln_cpu_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* Create a pool of `threads` threads in all (the calling thread of
 * parallel_for counts as one, so threads - 1 helpers are started), optionally
 * pinned to the given CPU ids (NULL: not pinned). Returns NULL on failure. */
kiln_cpu_pool_t *kiln_cpu_pool_create(int threads, const int *cpu_ids);
void kiln_cpu_pool_destroy(kiln_cpu_pool_t *pool);
int kiln_cpu_pool_threads(const kiln_cpu_pool_t *pool);

/* Run fn over [0, n) split into at most `threads` contiguous chunks of at
 * least `grain` items (grain >= 1); the caller runs one chunk itself. Blocks
 * until every chunk is done. With n <= grain or one thread, fn(ctx, 0, n, 0)
 * runs inline. Not reentrant: one parallel_for per pool at a time (the CPU
 * device's queue workers take turns through a lock inside). */
void kiln_cpu_parallel_for(kiln_cpu_pool_t *pool, int64_t n, int64_t grain, kiln_cpu_task_fn fn,
                           void *ctx);

#endif /* KILN_CPU_THREADPOOL_H */
