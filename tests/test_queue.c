/* tests/test_queue.c: queues and events: query, wait, elapsed, ordering across queues and threads, the per-thread current queue. */
#include <pthread.h>

#include "common.h"
#include "runtime/internal.h"

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu", &device));
  return device;
}

enum { KT_BIG = 1 << 20, KT_STEPS = 40 };

/* On the calling thread's current queue: ones, plus 1 KT_STEPS times. Every
 * element ends at KT_STEPS + 1 once the queue ran it all. */
static kiln_tensor_t *kt_chain(kiln_device_t *d) {
  int64_t shape[1] = {KT_BIG};
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_ones(d, KILN_F32, 1, shape, &t));
  for (int i = 0; i < KT_STEPS; i++) {
    kiln_tensor_t *next = NULL;
    KT_OK(kiln_tensor_add_scalar(t, 1.0, &next));
    kiln_tensor_release(t);
    t = next;
  }
  return t;
}

static void kt_expect_all(const float *values, size_t n, float want) {
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(values[i] == want, "element %zu is %g, expected %g", i, (double)values[i], (double)want);
}

START_TEST(test_events) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  kiln_event_t *start = NULL, *end = NULL;
  KT_OK(kiln_queue_record(q, &start));
  kiln_tensor_t *t = kt_chain(d);
  KT_OK(kiln_queue_record(q, &end));
  KT_OK(kiln_event_wait(end));
  KT_OK(kiln_event_query(end));
  KT_OK(kiln_event_query(start)); /* earlier on the same in-order queue */
  double ms = -1;
  KT_OK(kiln_event_elapsed(start, end, &ms));
  ck_assert(ms >= 0.0);
  /* Waiting on a completed event again is fine. */
  KT_OK(kiln_event_wait(start));

  kiln_queue_t *q2 = NULL;
  kiln_event_t *other = NULL;
  KT_OK(kiln_queue_create(d, &q2));
  KT_OK(kiln_queue_record(q2, &other));
  KT_FAILS(kiln_event_elapsed(start, other, &ms), KILN_INVALID_ARGUMENT, "different queues");
  KT_FAILS(kiln_event_elapsed(start, NULL, &ms), KILN_INVALID_ARGUMENT, "end is NULL");
  KT_FAILS(kiln_event_wait(NULL), KILN_INVALID_ARGUMENT, "kiln_event_wait: event is NULL");
  KT_FAILS(kiln_event_query(NULL), KILN_INVALID_ARGUMENT, "kiln_event_query: event is NULL");
  KT_FAILS(kiln_queue_record(q, NULL), KILN_INVALID_ARGUMENT, "out_event is NULL");

  ck_assert_ptr_eq(kiln_event_retain(end), end);
  kiln_event_release(end);
  kiln_event_release(end);
  kiln_event_release(start);
  kiln_event_release(other);
  kiln_event_release(NULL);
  kiln_queue_release(q2);
  kiln_tensor_release(t);
}
END_TEST

START_TEST(test_query_not_ready) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = NULL, *blocker = NULL;
  KT_OK(kiln_queue_create(d, &q));
  KT_OK(kiln_queue_create(d, &blocker));
  /* q waits on an event of `blocker`, which is itself held back by the
   * chain: q's marker cannot complete before the chain did. */
  KT_OK(kiln_device_set_current_queue(d, blocker));
  kiln_tensor_t *t = kt_chain(d);
  kiln_event_t *gate = NULL, *marker = NULL;
  KT_OK(kiln_queue_record(blocker, &gate));
  KT_OK(kiln_queue_wait(q, gate));
  KT_OK(kiln_queue_record(q, &marker));
  kiln_status_t first = kiln_event_query(marker);
  ck_assert(first == KILN_OK || first == KILN_NOT_READY);
  KT_OK(kiln_event_wait(marker));
  KT_OK(kiln_event_query(marker));
  KT_OK(kiln_event_query(gate));
  kiln_event_release(gate);
  kiln_event_release(marker);
  kiln_tensor_release(t);
  KT_OK(kiln_device_set_current_queue(d, NULL));
  kiln_queue_release(q);
  kiln_queue_release(blocker);
}
END_TEST

START_TEST(test_order_two_queues) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q1 = NULL, *q2 = NULL;
  KT_OK(kiln_queue_create(d, &q1));
  KT_OK(kiln_queue_create(d, &q2));
  ck_assert_uint_ne(q1->id, 0);
  ck_assert_uint_ne(q1->id, q2->id);
  ck_assert_ptr_eq(kiln_queue_device(q1), d);

  KT_OK(kiln_device_set_current_queue(d, q1));
  ck_assert_ptr_eq(kiln_device_current_queue(d), q1);
  kiln_tensor_t *t = kt_chain(d);
  kiln_event_t *done = NULL;
  KT_OK(kiln_queue_record(q1, &done));

  /* Read on q2, ordered after q1's work by the event alone. */
  KT_OK(kiln_device_set_current_queue(d, q2));
  KT_OK(kiln_queue_wait(q2, done));
  static float values[KT_BIG];
  KT_OK(kiln_tensor_read(t, values, sizeof values));
  kt_expect_all(values, KT_BIG, (float)(KT_STEPS + 1));

  /* A wait list on a transfer works the same way. */
  KT_OK(kiln_device_set_current_queue(d, q1));
  kiln_tensor_t *u = kt_chain(d);
  kiln_event_t *done2 = NULL;
  KT_OK(kiln_queue_record(q1, &done2));
  memset(values, 0, sizeof values);
  KT_OK(kiln_buffer_read(q2, kiln_tensor_buffer(u), 0, values, sizeof values, true, 1, &done2, NULL));
  kt_expect_all(values, KT_BIG, (float)(KT_STEPS + 1));

  KT_OK(kiln_device_set_current_queue(d, NULL));
  ck_assert_ptr_eq(kiln_device_current_queue(d), kiln_device_default_queue(d));
  kiln_event_release(done);
  kiln_event_release(done2);
  kiln_tensor_release(t);
  kiln_tensor_release(u);
  kiln_queue_release(q1);
  kiln_queue_release(q2);
}
END_TEST

/* Two threads: the producer runs the chain on its own queue and hands over
 * the tensor with an event; the consumer orders its queue after it. */
typedef struct kt_handoff_t {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  kiln_device_t *device;
  kiln_tensor_t *tensor;
  kiln_event_t *event;
  kiln_queue_t *producer_current, *consumer_current;
} kt_handoff_t;

static void *kt_producer(void *arg) {
  kt_handoff_t *h = arg;
  kiln_queue_t *q = NULL;
  if (kiln_queue_create(h->device, &q) != KILN_OK) return NULL;
  kiln_device_set_current_queue(h->device, q);
  kiln_tensor_t *t = kt_chain(h->device);
  kiln_event_t *e = NULL;
  kiln_queue_record(q, &e);
  pthread_mutex_lock(&h->lock);
  h->tensor = t;
  h->event = e;
  h->producer_current = kiln_device_current_queue(h->device);
  pthread_cond_broadcast(&h->cond);
  pthread_mutex_unlock(&h->lock);
  kiln_device_set_current_queue(h->device, NULL);
  kiln_queue_release(q);
  return NULL;
}

static void *kt_consumer(void *arg) {
  kt_handoff_t *h = arg;
  kiln_queue_t *q = NULL;
  if (kiln_queue_create(h->device, &q) != KILN_OK) return NULL;
  kiln_device_set_current_queue(h->device, q);
  pthread_mutex_lock(&h->lock);
  while (!h->event) pthread_cond_wait(&h->cond, &h->lock);
  pthread_mutex_unlock(&h->lock);
  h->consumer_current = kiln_device_current_queue(h->device);
  kiln_queue_wait(q, h->event);
  static float values[KT_BIG];
  if (kiln_tensor_read(h->tensor, values, sizeof values) == KILN_OK) kt_expect_all(values, KT_BIG, KT_STEPS + 1.0f);
  else ck_abort_msg("read failed: %s", kiln_last_error());
  kiln_device_set_current_queue(h->device, NULL);
  kiln_queue_release(q);
  return NULL;
}

START_TEST(test_order_two_threads) {
  kt_handoff_t h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, kt_cpu(), NULL, NULL, NULL, NULL};
  pthread_t producer, consumer;
  pthread_create(&consumer, NULL, kt_consumer, &h);
  pthread_create(&producer, NULL, kt_producer, &h);
  pthread_join(producer, NULL);
  pthread_join(consumer, NULL);
  ck_assert_ptr_nonnull(h.event);
  /* Each thread saw its own current queue, and this thread kept the default. */
  ck_assert_ptr_ne(h.producer_current, h.consumer_current);
  ck_assert_ptr_ne(h.producer_current, kiln_device_default_queue(h.device));
  ck_assert_ptr_eq(kiln_device_current_queue(h.device), kiln_device_default_queue(h.device));
  kiln_event_release(h.event);
  kiln_tensor_release(h.tensor);
}
END_TEST

static void *kt_read_current(void *arg) {
  return kiln_device_current_queue((kiln_device_t *)arg);
}

START_TEST(test_current_queue_per_thread) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *def = kiln_device_default_queue(d);
  ck_assert_ptr_nonnull(def);
  ck_assert_ptr_eq(kiln_device_current_queue(d), def);
  kiln_queue_t *q = NULL;
  KT_OK(kiln_queue_create(d, &q));
  KT_OK(kiln_device_set_current_queue(d, q));
  ck_assert_ptr_eq(kiln_device_current_queue(d), q);
  pthread_t other;
  void *seen = NULL;
  pthread_create(&other, NULL, kt_read_current, d);
  pthread_join(other, &seen);
  ck_assert_ptr_eq(seen, def);
  /* Results go to the current queue's order: create and read back on it. */
  int64_t shape[1] = {3};
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_full(d, KILN_I32, 1, shape, 7, &t));
  int32_t got[3];
  KT_OK(kiln_tensor_read(t, got, sizeof got));
  ck_assert_int_eq(got[0], 7);
  ck_assert_int_eq(got[2], 7);
  /* The thread's reference keeps the queue alive after the caller's release. */
  kiln_queue_release(q);
  ck_assert_ptr_eq(kiln_device_current_queue(d), q);
  KT_OK(kiln_device_set_current_queue(d, NULL));
  ck_assert_ptr_eq(kiln_device_current_queue(d), def);
  KT_FAILS(kiln_device_set_current_queue(NULL, NULL), KILN_INVALID_ARGUMENT, "device is NULL");
  KT_FAILS(kiln_queue_create(d, NULL), KILN_INVALID_ARGUMENT, "out_queue is NULL");
  KT_FAILS(kiln_queue_finish(NULL), KILN_INVALID_ARGUMENT, "kiln_queue_finish: queue is NULL");
  KT_FAILS(kiln_queue_wait(def, NULL), KILN_INVALID_ARGUMENT, "event is NULL");
  kiln_tensor_release(t);
}
END_TEST

START_TEST(test_release_finishes) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = NULL;
  KT_OK(kiln_queue_create(d, &q));
  KT_OK(kiln_device_set_current_queue(d, q));
  kiln_tensor_t *t = kt_chain(d);
  KT_OK(kiln_device_set_current_queue(d, NULL));
  /* The last reference: the release waits for the chain. */
  kiln_queue_release(q);
  static float values[KT_BIG];
  KT_OK(kiln_buffer_read(kiln_device_default_queue(d), kiln_tensor_buffer(t), 0, values, sizeof values, true, 0,
                         NULL, NULL));
  kt_expect_all(values, KT_BIG, (float)(KT_STEPS + 1));
  kiln_tensor_release(t);
  KT_OK(kiln_queue_finish(kiln_device_default_queue(d)));
}
END_TEST

START_TEST(test_restart) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = NULL;
  KT_OK(kiln_queue_create(d, &q));
  KT_OK(kiln_device_set_current_queue(d, q));
  kiln_queue_release(q);
  /* Deinitialising destroys queues the thread still named; a new start
   * begins from the default queue again. */
  kiln_deinitialize();
  d = kt_cpu();
  ck_assert_ptr_eq(kiln_device_current_queue(d), kiln_device_default_queue(d));
  int64_t shape[1] = {4};
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_arange(d, KILN_I32, 0, 4, 1, &t));
  int32_t got[4];
  KT_OK(kiln_tensor_read(t, got, sizeof got));
  ck_assert_int_eq(got[3], 3);
  (void)shape;
  kiln_tensor_release(t);
}
END_TEST

/* Back-pressure: 20,000 tiny updates and adds enqueued without a wait on each
 * device of the backends in KILN_TEST_QUEUE_BACKENDS (tests/meson.build: cpu,
 * and opencl where its plugin is built; the cuda-emulated suite runs it for
 * CUDA; cpu when unset): the operations in flight never
 * exceed KILN__QUEUE_DEPTH, the bound is reached (the queue is not drained
 * at every step), and every operation ran, in order. */
START_TEST(test_back_pressure_bounds_work_in_flight) {
  const char *backends = getenv("KILN_TEST_QUEUE_BACKENDS");
  setenv("KILN_BACKEND", backends && *backends ? backends : "cpu", 1);
  KT_OK(kiln_ensure_initialized());
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_msg(count > 0 || !backends, "no device of %s", backends);
  const int64_t shape[1] = {16};
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *d = NULL;
    KT_OK(kiln_device_get(i, &d));
    enum { N = 20000 };
    kiln_queue_t *queue = kiln_device_current_queue(d);
    kiln_tensor_t *acc = NULL, *ones = NULL, *last = NULL;
    KT_OK(kiln_tensor_zeros(d, KILN_F32, 1, shape, &acc));
    KT_OK(kiln_tensor_ones(d, KILN_F32, 1, shape, &ones));
    KT_OK(kiln_queue_finish(queue));
    ck_assert_uint_eq(kiln__queue_in_flight(queue), 0);
    uint64_t worst = 0;
    for (int k = 0; k < N; k++) {
      if (k % 2 == 0) {
        KT_OK(kiln_tensor_accumulate(acc, 1.0, ones));
      } else {
        kiln_tensor_release(last);
        last = NULL;
        KT_OK(kiln_tensor_add(acc, ones, &last));
      }
      const uint64_t in_flight = kiln__queue_in_flight(queue);
      if (in_flight > worst) worst = in_flight;
    }
    printf("%s: at most %llu of %d operations in flight (bound %u)\n", kiln_device_name(d), (unsigned long long)worst,
           N, KILN__QUEUE_DEPTH);
    ck_assert_msg(worst <= KILN__QUEUE_DEPTH, "%s: %llu operations in flight, more than the bound %u",
                  kiln_device_name(d), (unsigned long long)worst, KILN__QUEUE_DEPTH);
    ck_assert_msg(worst > KILN__QUEUE_DEPTH / 2, "%s: at most %llu operations in flight: the queue was drained",
                  kiln_device_name(d), (unsigned long long)worst);
    float got[16], sum[16];
    KT_OK(kiln_tensor_read(acc, got, sizeof got));
    KT_OK(kiln_tensor_read(last, sum, sizeof sum));
    kt_expect_all(got, 16, (float)(N / 2));
    kt_expect_all(sum, 16, (float)(N / 2 + 1));
    KT_OK(kiln_queue_finish(queue));
    ck_assert_uint_eq(kiln__queue_in_flight(queue), 0);
    kiln_tensor_release(acc);
    kiln_tensor_release(ones);
    kiln_tensor_release(last);
  }
  kiln_deinitialize();
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  Suite *s = suite_create("queue");
  TCase *tc = tcase_create("queue");
  tcase_add_test(tc, test_events);
  tcase_add_test(tc, test_query_not_ready);
  tcase_add_test(tc, test_order_two_queues);
  tcase_add_test(tc, test_order_two_threads);
  tcase_add_test(tc, test_current_queue_per_thread);
  tcase_add_test(tc, test_release_finishes);
  tcase_add_test(tc, test_restart);
  suite_add_tcase(s, tc);
  TCase *pressure = tcase_create("back-pressure");
  tcase_set_timeout(pressure, 300);
  tcase_add_test(pressure, test_back_pressure_bounds_work_in_flight);
  suite_add_tcase(s, pressure);
  return kt_run_suite(s);
}
