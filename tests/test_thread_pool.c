/* tests/test_thread_pool.c: the CPU backend's thread pool: every item once, inline nesting, callers taking turns, many short jobs; run under ThreadSanitizer in CI. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common.h"
#include "backends/cpu/thread_pool.h"

typedef struct count_job_t {
  _Atomic int *hits;
  _Atomic int max_thread;
} count_job_t;

static void count_task(void *ctx, int64_t begin, int64_t end, int thread) {
  count_job_t *job = ctx;
  for (int64_t i = begin; i < end; i++) atomic_fetch_add_explicit(&job->hits[i], 1, memory_order_relaxed);
  int seen = atomic_load(&job->max_thread);
  while (thread > seen && !atomic_compare_exchange_weak(&job->max_thread, &seen, thread)) {
  }
}

/* Every item of [0, n) is visited exactly once, whatever the split. */
static void check_once(kiln_cpu_thread_pool_t *tp, int64_t n, int64_t grain, int threads) {
  _Atomic int *hits = calloc((size_t)(n ? n : 1), sizeof *hits);
  ck_assert_ptr_nonnull(hits);
  count_job_t job = {hits, 0};
  kiln_cpu_thread_pool_run(tp, n, grain, count_task, &job);
  for (int64_t i = 0; i < n; i++) ck_assert_msg(atomic_load(&hits[i]) == 1, "item %lld visited %d times (n %lld, grain %lld)",
                                                (long long)i, atomic_load(&hits[i]), (long long)n, (long long)grain);
  ck_assert_int_lt(atomic_load(&job.max_thread), threads);
  free(hits);
}

START_TEST(test_every_item_once) {
  kiln_cpu_thread_pool_t *tp = kiln_cpu_thread_pool_create(4, NULL);
  ck_assert_ptr_nonnull(tp);
  ck_assert_int_eq(kiln_cpu_thread_pool_threads(tp), 4);
  static const int64_t sizes[] = {0, 1, 2, 3, 7, 64, 1000, 4099, 65537};
  static const int64_t grains[] = {1, 3, 100, 1 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++) check_once(tp, sizes[s], grains[g], 4);
  kiln_cpu_thread_pool_destroy(tp);
}
END_TEST

/* A parallel-for called from inside a task runs inline on that thread. */
typedef struct nested_job_t {
  kiln_cpu_thread_pool_t *tp;
  _Atomic int *hits;
} nested_job_t;

static void inner_task(void *ctx, int64_t begin, int64_t end, int thread) {
  _Atomic int *hits = ctx;
  for (int64_t i = begin; i < end; i++) atomic_fetch_add(&hits[i], 1);
}

static void outer_task(void *ctx, int64_t begin, int64_t end, int thread) {
  nested_job_t *job = ctx;
  for (int64_t i = begin; i < end; i++) kiln_cpu_thread_pool_run(job->tp, 16, 1, inner_task, job->hits + i * 16);
}

START_TEST(test_nested_runs_inline) {
  kiln_cpu_thread_pool_t *tp = kiln_cpu_thread_pool_create(3, NULL);
  ck_assert_ptr_nonnull(tp);
  _Atomic int hits[64 * 16];
  for (size_t i = 0; i < 64 * 16; i++) atomic_init(&hits[i], 0);
  nested_job_t job = {tp, hits};
  kiln_cpu_thread_pool_run(tp, 64, 1, outer_task, &job);
  for (size_t i = 0; i < 64 * 16; i++) ck_assert_int_eq(atomic_load(&hits[i]), 1);
  kiln_cpu_thread_pool_destroy(tp);
}
END_TEST

/* Two callers (two queues' workers of one device) take turns; many short
 * jobs in a row, as tiny ops produce them. */
typedef struct caller_t {
  kiln_cpu_thread_pool_t *tp;
  int rounds;
  int64_t total;
} caller_t;

static void sum_task(void *ctx, int64_t begin, int64_t end, int thread) {
  _Atomic int64_t *sum = ctx;
  int64_t local = 0;
  for (int64_t i = begin; i < end; i++) local += i;
  atomic_fetch_add(sum, local);
}

static void *caller_main(void *arg) {
  caller_t *c = arg;
  for (int r = 0; r < c->rounds; r++) {
    _Atomic int64_t sum = 0;
    kiln_cpu_thread_pool_run(c->tp, 1000, 10, sum_task, (void *)&sum);
    c->total += atomic_load(&sum);
  }
  return NULL;
}

START_TEST(test_callers_take_turns) {
  kiln_cpu_thread_pool_t *tp = kiln_cpu_thread_pool_create(2, NULL);
  ck_assert_ptr_nonnull(tp);
  caller_t callers[3] = {{tp, 300, 0}, {tp, 300, 0}, {tp, 300, 0}};
  pthread_t threads[3];
  for (int i = 0; i < 3; i++) ck_assert_int_eq(pthread_create(&threads[i], NULL, caller_main, &callers[i]), 0);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(pthread_join(threads[i], NULL), 0);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(callers[i].total, (int64_t)300 * (999 * 1000 / 2));
  kiln_cpu_thread_pool_destroy(tp);
}
END_TEST

/* One thread runs everything inline; a pool destroyed right after creation
 * (helpers that never ran a job) stops cleanly. */
START_TEST(test_one_thread_and_quick_destroy) {
  kiln_cpu_thread_pool_t *one = kiln_cpu_thread_pool_create(1, NULL);
  ck_assert_ptr_nonnull(one);
  check_once(one, 5000, 1, 1);
  kiln_cpu_thread_pool_destroy(one);
  for (int i = 0; i < 20; i++) {
    kiln_cpu_thread_pool_t *tp = kiln_cpu_thread_pool_create(4, NULL);
    ck_assert_ptr_nonnull(tp);
    kiln_cpu_thread_pool_destroy(tp);
  }
  kiln_cpu_thread_pool_destroy(NULL);
}
END_TEST

static Suite *thread_pool_suite(void) {
  Suite *s = suite_create("thread_pool");
  TCase *tc = tcase_create("thread_pool");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_every_item_once);
  tcase_add_test(tc, test_nested_runs_inline);
  tcase_add_test(tc, test_callers_take_turns);
  tcase_add_test(tc, test_one_thread_and_quick_destroy);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  kt_private_cache_dir();
  return kt_run_suite(thread_pool_suite());
}
