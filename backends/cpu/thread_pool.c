/* backends/cpu/thread_pool.c: the per-device thread pool that runs large CPU kernels in parallel. */
#include "backends/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backends/cpu/sync.h"

struct kiln_cpu_thread_pool_t {
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

/* The thread pool whose job the calling thread is running, so that a kernel calling
 * parallel_for from inside a task runs inline instead of deadlocking. */
static _Thread_local kiln_cpu_thread_pool_t *tl_running;

typedef struct helper_arg_t {
  kiln_cpu_thread_pool_t *tp;
  int index;
} helper_arg_t;

static inline uint64_t claim_word(uint32_t generation, int chunks, int next) {
  return ((uint64_t)generation << 32) | ((uint64_t)(uint32_t)chunks << 16) | (uint64_t)(uint32_t)next;
}

/* Claim the next chunk of job `generation`; -1 when none is left (or the job
 * is another one by now). */
static int claim_chunk(kiln_cpu_thread_pool_t *tp, uint32_t generation) {
  uint64_t cur = atomic_load_explicit(&tp->claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(cur >> 32) != generation) return -1;
    const int chunks = (int)((cur >> 16) & 0xffff), next = (int)(cur & 0xffff);
    if (next >= chunks) return -1;
    if (atomic_compare_exchange_weak_explicit(&tp->claim, &cur, cur + 1, memory_order_acq_rel,
                                              memory_order_acquire))
      return next;
  }
}

/* Run chunks of job `generation` while any is left. */
static void run_chunks(kiln_cpu_thread_pool_t *tp, uint32_t generation, int chunks) {
  for (int c; (c = claim_chunk(tp, generation)) >= 0;) {
    /* The job cannot change before this chunk is counted done. */
    const int64_t begin = tp->n * c / chunks, end = tp->n * (c + 1) / chunks;
    if (begin < end) tp->fn(tp->ctx, begin, end, c);
    if (atomic_fetch_add(&tp->done, 1) + 1 == (uint32_t)chunks) kiln_cpu_wake(&tp->done, &tp->done_sleepers);
  }
}

static void *helper_main(void *arg) {
  helper_arg_t a = *(helper_arg_t *)arg;
  free(arg);
  kiln_cpu_thread_pool_t *tp = a.tp;
  tl_running = tp;
  uint32_t seen = 0;
  for (;;) {
    seen = kiln_cpu_wait_change(&tp->generation, seen, &tp->generation_sleepers);
    if (atomic_load(&tp->stop)) return NULL;
    const uint64_t cur = atomic_load_explicit(&tp->claim, memory_order_acquire);
    if ((uint32_t)(cur >> 32) == seen) run_chunks(tp, seen, (int)((cur >> 16) & 0xffff));
  }
}

kiln_cpu_thread_pool_t *kiln_cpu_thread_pool_create(int threads, const int *cpu_ids) {
  if (threads < 1) threads = 1;
  kiln_cpu_thread_pool_t *tp = calloc(1, sizeof *tp);
  if (!tp) return NULL;
  tp->threads = threads;
  pthread_mutex_init(&tp->turn, NULL);
  atomic_init(&tp->generation, 0);
  atomic_init(&tp->generation_sleepers, 0);
  atomic_init(&tp->stop, false);
  atomic_init(&tp->claim, 0);
  atomic_init(&tp->done, 0);
  atomic_init(&tp->done_sleepers, 0);
  if (threads == 1) return tp;

  tp->helpers = calloc((size_t)threads - 1, sizeof *tp->helpers);
  if (!tp->helpers) {
    kiln_cpu_thread_pool_destroy(tp);
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
      arg->tp = tp;
      arg->index = i;
    }
    if (!arg || pthread_create(&tp->helpers[i - 1], &attr, helper_main, arg) != 0) {
      free(arg);
      pthread_attr_destroy(&attr);
      kiln_cpu_thread_pool_destroy(tp);
      return NULL;
    }
    tp->helpers_started++;
  }
  pthread_attr_destroy(&attr);
  return tp;
}

void kiln_cpu_thread_pool_destroy(kiln_cpu_thread_pool_t *tp) {
  if (!tp) return;
  if (tp->helpers_started > 0) {
    pthread_mutex_lock(&tp->turn);
    atomic_store(&tp->stop, true);
    atomic_fetch_add(&tp->generation, 1);
    kiln_cpu_futex_wake_all(&tp->generation);
    pthread_mutex_unlock(&tp->turn);
    for (int i = 0; i < tp->helpers_started; i++) pthread_join(tp->helpers[i], NULL);
  }
  free(tp->helpers);
  pthread_mutex_destroy(&tp->turn);
  free(tp);
}

int kiln_cpu_thread_pool_threads(const kiln_cpu_thread_pool_t *tp) { return tp ? tp->threads : 1; }

void kiln_cpu_thread_pool_par(void *team, int64_t n, int64_t grain, kiln_cpu_task_fn fn, void *ctx) {
  kiln_cpu_thread_pool_run(team, n, grain, fn, ctx);
}

void kiln_cpu_thread_pool_run(kiln_cpu_thread_pool_t *tp, int64_t n, int64_t grain, kiln_cpu_task_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (!tp || tp->threads == 1 || n <= grain || tl_running != NULL) {
    fn(ctx, 0, n, 0);
    return;
  }
  int64_t max_chunks = n / grain;
  int chunks = max_chunks < tp->threads ? (int)max_chunks : tp->threads;
  if (chunks > 0xffff) chunks = 0xffff;
  if (chunks <= 1) {
    fn(ctx, 0, n, 0);
    return;
  }

  pthread_mutex_lock(&tp->turn);
  tl_running = tp;
  tp->fn = fn;
  tp->ctx = ctx;
  tp->n = n;
  atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
  const uint32_t generation = atomic_load_explicit(&tp->generation, memory_order_relaxed) + 1;
  atomic_store(&tp->claim, claim_word(generation, chunks, 0));
  atomic_store(&tp->generation, generation);
  kiln_cpu_wake(&tp->generation, &tp->generation_sleepers);

  run_chunks(tp, generation, chunks);

  for (uint32_t finished = atomic_load_explicit(&tp->done, memory_order_acquire); finished != (uint32_t)chunks;
       finished = atomic_load_explicit(&tp->done, memory_order_acquire))
    kiln_cpu_wait_change(&tp->done, finished, &tp->done_sleepers);
  tl_running = NULL;
  pthread_mutex_unlock(&tp->turn);
}
