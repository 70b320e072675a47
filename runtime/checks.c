/* runtime/checks.c: checks that only the device can make (a label outside its range), reported at the queue's next synchronisation. */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/internal.h"

/* One pending check: an op wrote `report` (i32 [2]: the first bad position or
 * -1, and the value found there) on the queue that holds this record. */
struct kiln__check_t {
  struct kiln__check_t *next;
  kiln_tensor_t *report;
  const char *call; /* static storage */
  const char *what; /* "label": static storage */
  int64_t low, limit; /* valid values are [low, limit) */
  char rule[200];     /* the message's end */
};

kiln_status_t kiln__check_add(kiln_queue_t *queue, kiln_tensor_t *report, const char *call, const char *what,
                              int64_t low, int64_t limit, const char *rule) {
  kiln__check_t *check = malloc(sizeof *check);
  if (!check)
    return kiln__set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes to record the check of its %ss; free "
                           "host memory", call, sizeof *check, what);
  kiln_tensor_retain(report);
  check->report = report;
  check->call = call;
  check->what = what;
  check->low = low;
  check->limit = limit;
  snprintf(check->rule, sizeof check->rule, "%s", rule);
  check->next = atomic_load_explicit(&queue->checks, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&queue->checks, &check->next, check, memory_order_release,
                                                memory_order_relaxed)) {
  }
  return KILN_OK;
}

/* The queue's pending checks, oldest first, taken off the queue. */
static kiln__check_t *take_all(kiln_queue_t *queue) {
  kiln__check_t *newest = atomic_exchange_explicit(&queue->checks, NULL, memory_order_acquire);
  kiln__check_t *oldest = NULL;
  while (newest) {
    kiln__check_t *next = newest->next;
    newest->next = oldest;
    oldest = newest;
    newest = next;
  }
  return oldest;
}

static void check_free(kiln__check_t *check) {
  kiln_tensor_release(check->report);
  free(check);
}

kiln_status_t kiln__checks_run(kiln_queue_t *queue) {
  /* Most synchronisations find nothing to do: one atomic load. */
  if (!atomic_load_explicit(&queue->checks, memory_order_relaxed)) return KILN_OK;
  kiln__check_t *check = take_all(queue);
  kiln_status_t first = KILN_OK;
  while (check) {
    kiln__check_t *next = check->next;
    if (first == KILN_OK) {
      int32_t found[2] = {-1, 0};
      /* The read is itself a synchronisation, but this queue's list is empty
       * now, so it checks nothing. */
      kiln_status_t status = kiln_buffer_read(queue, check->report->buffer, kiln_tensor_offset_bytes(check->report),
                                              found, sizeof found, true, 0, NULL, NULL);
      if (status != KILN_OK) {
        first = kiln__wrap_error(status, "reading the %s check of %s", check->what, check->call);
      } else if (found[0] >= 0) {
        first = kiln__set_error(KILN_INDEX_OUT_OF_RANGE, "%s: %s %d at position %d is outside [%lld, %lld); %s",
                                check->call, check->what, found[1], found[0], (long long)check->low,
                                (long long)check->limit, check->rule);
      }
    }
    check_free(check);
    check = next;
  }
  return first;
}

void kiln__checks_drop(kiln_queue_t *queue) {
  kiln__check_t *check = take_all(queue);
  while (check) {
    kiln__check_t *next = check->next;
    check_free(check);
    check = next;
  }
}
