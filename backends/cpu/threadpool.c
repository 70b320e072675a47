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

  /* The job, written by the caller before `generation` is bumped. */
  kiln_cpu_task_fn fn;
  void *ctx;
  int64_t n;
  int chunks;
  bool stop;

  _Alignas(64) _Atomic uint32_t generation; /* futex: a new job (or stop) */
  _Atomic uint32_t generation_sleepers;
  _Alignas(64) _Atomic uint32_t pending; /* futex: helpers yet to acknowledge the job */
  _Atomic uint32_t pending_sleepers;
};

/* The pool whose job the calling thread is running, so that a kernel calling
 * parallel_for from inside a task runs inline instead of deadlocking. */
static _Thread_local kiln_cpu_pool_t *tl_running_pool;

typedef struct helper_arg_t {
  kiln_cpu_pool_t *pool;
  int index;
} helper_arg_t;

static void run_chunk(kiln_cpu_pool_t *pool, int chunk) {
  int64_t begin = pool->n * chunk / pool->chunks;
  int64_t end = pool->n * (chunk + 1) / pool->chunks;
  if (begin < end) pool->fn(pool->ctx, begin, end, chunk);
}

static void *helper_main(void *arg) {
  helper_arg_t a = *(helper_arg_t *)arg;
  free(arg);
  kiln_cpu_pool_t *pool = a.pool;
  tl_running_pool = pool;
  uint32_t seen = 0;
  for (;;) {
    seen = kiln_cpu_wait_change(&pool->generation, seen, &pool->generation_sleepers);
    if (pool->stop) return NULL;
    if (a.index < pool->chunks) run_chunk(pool, a.index);
    /* Every helper acknowledges every job, so the caller never rewrites the
     * job while a helper may still read it. */
    if (atomic_fetch_sub(&pool->pending, 1) == 1) kiln_cpu_wake(&pool->pending, &pool->pending_sleepers);
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
  atomic_init(&pool->pending, 0);
  atomic_init(&pool->pending_sleepers, 0);
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
    pool->stop = true;
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
  if (chunks <= 1) {
    fn(ctx, 0, n, 0);
    return;
  }

  pthread_mutex_lock(&pool->turn);
  tl_running_pool = pool;
  pool->fn = fn;
  pool->ctx = ctx;
  pool->n = n;
  pool->chunks = chunks;
  uint32_t helpers = (uint32_t)pool->threads - 1;
  atomic_store(&pool->pending, helpers);
  atomic_fetch_add(&pool->generation, 1);
  kiln_cpu_wake(&pool->generation, &pool->generation_sleepers);

  run_chunk(pool, 0);

  for (uint32_t left = atomic_load_explicit(&pool->pending, memory_order_acquire); left != 0;
       left = atomic_load_explicit(&pool->pending, memory_order_acquire))
    kiln_cpu_wait_change(&pool->pending, left, &pool->pending_sleepers);
  tl_running_pool = NULL;
  pthread_mutex_unlock(&pool->turn);
}
