/* tests/test_multidevice.c: two CPU devices (KILN_CPU_DEVICES=2): copies both ways, kiln_tensor_to, the mismatch error, concurrent queues. */
#include <pthread.h>

#include "common.h"

static kiln_device_t *kt_dev[2];

static void kt_devices(void) {
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_eq(count, 2);
  KT_OK(kiln_device_find("cpu:0", &kt_dev[0]));
  KT_OK(kiln_device_find("cpu:1", &kt_dev[1]));
  ck_assert_ptr_ne(kt_dev[0], kt_dev[1]);
  ck_assert_str_eq(kiln_device_selector(kt_dev[0]), "cpu:0");
  ck_assert_str_eq(kiln_device_selector(kt_dev[1]), "cpu:1");
}

START_TEST(test_buffer_copies_both_ways) {
  kt_devices();
  enum { N = 3 * 1024 * 1024 + 5 };
  static unsigned char in[N], out[N];
  for (size_t i = 0; i < N; i++) in[i] = (unsigned char)(i * 2654435761u >> 13);
  kiln_buffer_t *b0 = NULL, *b1 = NULL;
  KT_OK(kiln_buffer_create(kt_dev[0], N, &b0));
  KT_OK(kiln_buffer_create(kt_dev[1], N, &b1));
  kiln_queue_t *q0 = kiln_device_current_queue(kt_dev[0]), *q1 = kiln_device_current_queue(kt_dev[1]);
  /* Not blocking: the copy must order itself after the write on cpu:0. */
  KT_OK(kiln_buffer_write(q0, b0, 0, in, N, false, 0, NULL, NULL));
  kiln_event_t *copied = NULL;
  KT_OK(kiln_buffer_copy(q1, b0, 0, b1, 0, N, 0, NULL, &copied));
  KT_OK(kiln_event_wait(copied));
  kiln_event_release(copied);
  KT_OK(kiln_buffer_read(q1, b1, 0, out, N, true, 0, NULL, NULL));
  ck_assert_mem_eq(in, out, N);

  /* Back, at offsets, with a queue of cpu:0 as the destination's. */
  unsigned char zero = 0;
  KT_OK(kiln_buffer_fill(q0, b0, 0, N, &zero, 1, 0, NULL, NULL));
  KT_OK(kiln_buffer_copy(q0, b1, 1000, b0, 17, 500000, 0, NULL, NULL));
  KT_OK(kiln_buffer_read(q0, b0, 0, out, N, true, 0, NULL, NULL));
  static unsigned char want[N];
  memcpy(want + 17, in + 1000, 500000);
  ck_assert_mem_eq(out, want, N);

  /* A queue of the wrong device is refused with both names. */
  KT_FAILS(kiln_buffer_copy(q0, b0, 0, b1, 0, 16, 0, NULL, NULL), KILN_DEVICE_MISMATCH,
           "the buffer lives on cpu:1");
  kiln_buffer_release(b0);
  kiln_buffer_release(b1);
}
END_TEST

START_TEST(test_tensor_to_across) {
  kt_devices();
  kiln_tensor_t *a = NULL, *b = NULL, *back = NULL, *same = NULL;
  KT_OK(kiln_tensor_arange(kt_dev[0], KILN_F32, 0, 1000, 1, &a));
  KT_OK(kiln_tensor_to(a, kt_dev[1], &b));
  ck_assert_ptr_ne(b, a);
  ck_assert_ptr_eq(kiln_tensor_device(b), kt_dev[1]);
  KT_OK(kiln_tensor_to(b, kt_dev[1], &same));
  ck_assert_ptr_eq(same, b);
  kiln_tensor_release(same);
  static float got[1000];
  KT_OK(kiln_tensor_read(b, got, sizeof got));
  for (int i = 0; i < 1000; i++) ck_assert(got[i] == (float)i);

  /* A non-contiguous view goes across as its values, row-major. */
  kiln_tensor_t *m = NULL, *mt = NULL;
  KT_OK(kiln_tensor_reshape(b, 2, (const int64_t[]){10, 100}, &m));
  KT_OK(kiln_tensor_transpose(m, 0, 1, &mt));
  KT_OK(kiln_tensor_copy(mt, kt_dev[0], &back));
  ck_assert_ptr_eq(kiln_tensor_device(back), kt_dev[0]);
  ck_assert(kiln_tensor_is_contiguous(back));
  KT_OK(kiln_tensor_read(back, got, sizeof got));
  for (int i = 0; i < 100; i++)
    for (int j = 0; j < 10; j++) ck_assert(got[i * 10 + j] == (float)(j * 100 + i));
  kiln_tensor_release(back);
  kiln_tensor_release(mt);
  kiln_tensor_release(m);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
}
END_TEST

START_TEST(test_mismatch_message) {
  kt_devices();
  kiln_tensor_t *a = NULL, *b = NULL, *c = NULL;
  const int64_t shape[1] = {4};
  KT_OK(kiln_tensor_ones(kt_dev[0], KILN_F32, 1, shape, &a));
  KT_OK(kiln_tensor_ones(kt_dev[1], KILN_F32, 1, shape, &b));
  ck_assert_int_eq(kiln_tensor_add(a, b, &c), KILN_DEVICE_MISMATCH);
  ck_assert_ptr_null(c);
  char want[1024];
  snprintf(want, sizeof want,
           "kiln_tensor_add: operands live on different devices: a on %s, b on %s; kiln never copies implicitly: "
           "move one first with kiln_tensor_to(b, kiln_tensor_device(a), &b2)",
           kiln_device_name(kt_dev[0]), kiln_device_name(kt_dev[1]));
  ck_assert_str_eq(kiln_last_error(), want);
  ck_assert_int_eq(kiln_last_status(), KILN_DEVICE_MISMATCH);
  /* The fix the message names works. */
  kiln_tensor_t *b2 = NULL;
  KT_OK(kiln_tensor_to(b, kiln_tensor_device(a), &b2));
  KT_OK(kiln_tensor_add(a, b2, &c));
  double sum = 0;
  kiln_tensor_t *s = NULL;
  KT_OK(kiln_tensor_sum(c, KILN_ALL_AXES, false, &s));
  KT_OK(kiln_tensor_item(s, &sum));
  ck_assert(sum == 8.0);
  KT_FAILS(kiln_tensor_matmul(a, b, false, false, &c), KILN_DEVICE_MISMATCH, "kiln_tensor_matmul: operands live on");
  kiln_queue_t *q1 = NULL;
  KT_OK(kiln_queue_create(kt_dev[1], &q1));
  KT_FAILS(kiln_device_set_current_queue(kt_dev[0], q1), KILN_DEVICE_MISMATCH, "the queue belongs to cpu:1");
  kiln_queue_release(q1);
  kiln_tensor_release(s);
  kiln_tensor_release(b2);
  kiln_tensor_release(c);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
}
END_TEST

/* Each thread runs a chain on its own device; both run at once. */
typedef struct kt_job_t {
  kiln_device_t *device;
  float start;
  float result;
  kiln_status_t status;
} kt_job_t;

enum { KT_BIG = 1 << 20, KT_STEPS = 30 };

static void *kt_job(void *arg) {
  kt_job_t *job = arg;
  const int64_t shape[1] = {KT_BIG};
  kiln_tensor_t *t = NULL;
  job->status = kiln_tensor_full(job->device, KILN_F32, 1, shape, job->start, &t);
  for (int i = 0; i < KT_STEPS && job->status == KILN_OK; i++) {
    kiln_tensor_t *next = NULL;
    job->status = kiln_tensor_mul_scalar(t, 1.0, &next);
    if (job->status == KILN_OK) {
      kiln_tensor_release(t);
      t = next;
      job->status = kiln_tensor_add_scalar(t, 1.0, &next);
    }
    if (job->status == KILN_OK) {
      kiln_tensor_release(t);
      t = next;
    }
  }
  kiln_tensor_t *total = NULL;
  double v = 0;
  if (job->status == KILN_OK) job->status = kiln_tensor_max(t, KILN_ALL_AXES, false, &total);
  if (job->status == KILN_OK) job->status = kiln_tensor_item(total, &v);
  job->result = (float)v;
  kiln_tensor_release(total);
  kiln_tensor_release(t);
  return NULL;
}

START_TEST(test_concurrent_queues) {
  kt_devices();
  kt_job_t jobs[2] = {{kt_dev[0], 0.0f, 0, KILN_OK}, {kt_dev[1], 100.0f, 0, KILN_OK}};
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, kt_job, &jobs[i]);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(jobs[i].status == KILN_OK, "job %d: %s", i, kiln_status_name(jobs[i].status));
    ck_assert(jobs[i].result == jobs[i].start + KT_STEPS);
  }

  /* An event of cpu:0 orders work on cpu:1's queue (same backend). */
  const int64_t shape[1] = {KT_BIG};
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_full(kt_dev[0], KILN_F32, 1, shape, 5.0, &t));
  for (int i = 0; i < 10; i++) {
    kiln_tensor_t *next = NULL;
    KT_OK(kiln_tensor_add_scalar(t, 1.0, &next));
    kiln_tensor_release(t);
    t = next;
  }
  kiln_event_t *done = NULL;
  KT_OK(kiln_queue_record(kiln_device_current_queue(kt_dev[0]), &done));
  kiln_buffer_t *dst = NULL;
  KT_OK(kiln_buffer_create(kt_dev[1], (size_t)KT_BIG * 4, &dst));
  kiln_queue_t *q1 = kiln_device_current_queue(kt_dev[1]);
  KT_OK(kiln_queue_wait(q1, done));
  KT_OK(kiln_buffer_copy(q1, kiln_tensor_buffer(t), 0, dst, 0, (size_t)KT_BIG * 4, 0, NULL, NULL));
  static float got[KT_BIG];
  KT_OK(kiln_buffer_read(q1, dst, 0, got, sizeof got, true, 0, NULL, NULL));
  for (int i = 0; i < KT_BIG; i++) ck_assert(got[i] == 15.0f);
  kiln_event_release(done);
  kiln_buffer_release(dst);
  kiln_tensor_release(t);
  KT_OK(kiln_device_check(kt_dev[1]));
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_CPU_DEVICES", "2", 0);
  if (strcmp(getenv("KILN_CPU_DEVICES"), "2") != 0) {
    printf("test_multidevice needs KILN_CPU_DEVICES=2 (it is \"%s\"); skipped\n", getenv("KILN_CPU_DEVICES"));
    return 77;
  }
  unsetenv("KILN_DEVICE");
  Suite *s = suite_create("multidevice");
  TCase *tc = tcase_create("multidevice");
  tcase_add_test(tc, test_buffer_copies_both_ways);
  tcase_add_test(tc, test_tensor_to_across);
  tcase_add_test(tc, test_mismatch_message);
  tcase_add_test(tc, test_concurrent_queues);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
