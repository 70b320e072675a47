/* backends/cpu/threadpool.c: the per-device thread pool that runs large CPU kernels in parallel. */
#include "backends/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backends/cpu/sync.h"

struct kiln_cpu_pool_t {
  int threads;
  pthread_t *helpers; /* threads - 1 of them */
  int helpers_started;
  /* Queue workers of one device take turns: one parallel_for at a time. */
  pthread_mutex_t turn;

  /* The job, written by the caller before `claim` and `generation` announce it. */
  kiln_cpu_task_fn fn;
  void *ctx;
  int64_t n;
  /* Read by helpers that may not have taken part in the last job, so nothing
   * else orders it with destroy's write. */
  _Atomic bool stop;

  _Alignas(64) _Atomic uint32_t generation; /* futex: a new job (or stop) */
  _Atomic uint32_t generation_sleepers;
  /* Chunks are claimed, not assigned: (generation << 32) | (chunks << 16) |
   * next. Whoever is running takes the next chunk, the caller included, so
   * a helper that the scheduler has not run yet (a busy machine) delays no
   * one: the others take its chunks. The word names its job, so a helper
   * that wakes late cannot claim a chunk of the next one by mistake. */
  _Alignas(64) _Atomic uint64_t claim;
  _Alignas(64) _Atomic uint32_t done; /* futex: chunks finished */
  _Atomic uint32_t done_sleepers;
};

/* The pool whose job the calling thread is running, so that a kernel calling
 * parallel_for from inside a task runs inline instead of deadlocking. */
static _Thread_local kiln_cpu_pool_t *tl_running_pool;

typedef struct helper_arg_t {
  kiln_cpu_pool_t *pool;
  int index;
} helper_arg_t;

static inline uint64_t claim_word(uint32_t generation, int chunks, int next) {
  return ((uint64_t)generation << 32) | ((uint64_t)(uint32_t)chunks << 16) | (uint64_t)(uint32_t)next;
}

/* Claim the next chunk of job `generation`; -1 when none is left (or the job
 * is another one by now). */
static int claim_chunk(kiln_cpu_pool_t *pool, uint32_t generation) {
  uint64_t cur = atomic_load_explicit(&pool->claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(cur >> 32) != generation) return -1;
    const int chunks = (int)((cur >> 16) & 0xffff), next = (int)(cur & 0xffff);
    if (next >= chunks) return -1;
    if (atomic_compare_exchange_weak_explicit(&pool->claim, &cur, cur + 1, memory_order_acq_rel,
                                              memory_order_acquire))
      return next;
  }
}

/* Run chunks of job `generation` while any is left. */
static void run_chunks(kiln_cpu_pool_t *pool, uint32_t generation, int chunks) {
  for (int c; (c = claim_chunk(pool, generation)) >= 0;) {
    /* The job cannot change before this chunk is counted done. */
    const int64_t begin = pool->n * c / chunks, end = pool->n * (c + 1) / chunks;
    if (begin < end) pool->fn(pool->ctx, begin, end, c);
    if (atomic_fetch_add(&pool->done, 1) + 1 == (uint32_t)chunks) kiln_cpu_wake(&pool->done, &pool->done_sleepers);
  }
}

static void *helper_main(void *arg) {
  helper_arg_t a = *(helper_arg_t *)arg;
  free(arg);
  kiln_cpu_pool_t *pool = a.pool;
  tl_running_pool = pool;
  uint32_t seen = 0;
  for (;;) {
    seen = kiln_cpu_wait_change(&pool->generation, seen, &pool->generation_sleepers);
    if (atomic_load(&pool->stop)) return NULL;
    const uint64_t cur = atomic_load_explicit(&pool->claim, memory_order_acquire);
    if ((uint32_t)(cur >> 32) == seen) run_chunks(pool, seen, (int)((cur >> 16) & 0xffff));
  }
}

kiln_cpu_pool_t *kiln_cpu_pool_create(int threads, const int *cpu_ids) {
  if (threads < 1) threads = 1;
  kiln_cpu_pool_t *pool = calloc(1, sizeof *pool);
  if (!pool) return NULL;
  pool->threads = threads;
  pthread_mutex_init(&pool->turn, NULL);
  atomic_init(&pool->generation, 0);
  atomic_init(&pool->generation_sleepers, 0);
  atomic_init(&pool->stop, false);
  atomic_init(&pool->claim, 0);
  atomic_init(&pool->done, 0);
  atomic_init(&pool->done_sleepers, 0);
  if (threads == 1) return pool;

  pool->helpers = calloc((size_t)threads - 1, sizeof *pool->helpers);
  if (!pool->helpers) {
    kiln_cpu_pool_destroy(pool);
    return NULL;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  /* Helpers may run anywhere in the device's share of the machine; the
   * scheduler spreads them over it. */
  if (cpu_ids) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < threads; i++) CPU_SET(cpu_ids[i], &set);
    pthread_attr_setaffinity_np(&attr, sizeof set, &set);
  }
  for (int i = 1; i < threads; i++) {
    helper_arg_t *arg = malloc(sizeof *arg);
    if (arg) {
      arg->pool = pool;
      arg->index = i;
    }
    if (!arg || pthread_create(&pool->helpers[i - 1], &attr, helper_main, arg) != 0) {
      free(arg);
      pthread_attr_destroy(&attr);
      kiln_cpu_pool_destroy(pool);
      return NULL;
    }
    pool->helpers_started++;
  }
  pthread_attr_destroy(&attr);
  return pool;
}

void kiln_cpu_pool_destroy(kiln_cpu_pool_t *pool) {
  if (!pool) return;
  if (pool->helpers_started > 0) {
    pthread_mutex_lock(&pool->turn);
    atomic_store(&pool->stop, true);
    atomic_fetch_add(&pool->generation, 1);
    kiln_cpu_futex_wake_all(&pool->generation);
    pthread_mutex_unlock(&pool->turn);
    for (int i = 0; i < pool->helpers_started; i++) pthread_join(pool->helpers[i], NULL);
  }
  free(pool->helpers);
  pthread_mutex_destroy(&pool->turn);
  free(pool);
}

int kiln_cpu_pool_threads(const kiln_cpu_pool_t *pool) { return pool ? pool->threads : 1; }

void kiln_cpu_parallel_for(kiln_cpu_pool_t *pool, int64_t n, int64_t grain, kiln_cpu_task_fn fn,
                           void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (!pool || pool->threads == 1 || n <= grain || tl_running_pool != NULL) {
    fn(ctx, 0, n, 0);
    return;
  }
  int64_t max_chunks = n / grain;
  int chunks = max_chunks < pool->threads ? (int)max_chunks : pool->threads;
  if (chunks > 0xffff) chunks = 0xffff;
  if (chunks <= 1) {
    fn(ctx, 0, n, 0);
    return;
  }

  pthread_mutex_lock(&pool->turn);
  tl_running_pool = pool;
  pool->fn = fn;
  pool->ctx = ctx;
  pool->n = n;
  atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
  const uint32_t generation = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1;
  atomic_store(&pool->claim, claim_word(generation, chunks, 0));
  atomic_store(&pool->generation, generation);
  kiln_cpu_wake(&pool->generation, &pool->generation_sleepers);

  run_chunks(pool, generation, chunks);

  for (uint32_t finished = atomic_load_explicit(&pool->done, memory_order_acquire); finished != (uint32_t)chunks;
       finished = atomic_load_explicit(&pool->done, memory_order_acquire))
    kiln_cpu_wait_change(&pool->done, finished, &pool->done_sleepers);
  tl_running_pool = NULL;
  pthread_mutex_unlock(&pool->turn);
}
