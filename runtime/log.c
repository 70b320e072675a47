/* runtime/log.c: the library's only output channel: KILN_LOG levels and an application-installed sink. */
#include <stdarg.h>
#include <stdio.h>

#include "runtime/internal.h"

_Atomic int kiln__log_level_value = KILN_LOG_OFF;

/* The sink and its user pointer change together; a mutex keeps a concurrent
 * log call from pairing the new function with the old pointer. */
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_log_fn sink;
static void *sink_user;

static const char *level_text(kiln_log_level_t level) {
  switch (level) {
    case KILN_LOG_ERROR: return "error";
    case KILN_LOG_WARN: return "warn";
    case KILN_LOG_INFO: return "info";
    case KILN_LOG_DEBUG: return "debug";
    case KILN_LOG_OFF: break;
  }
  return "off";
}

void kiln__log(kiln_log_level_t level, const char *fmt, ...) {
  if (level <= KILN_LOG_OFF || !kiln__log_enabled(level)) return;
  char message[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);

  pthread_mutex_lock(&sink_lock);
  kiln_log_fn fn = sink;
  void *user = sink_user;
  pthread_mutex_unlock(&sink_lock);
  if (fn) {
    fn(level, message, user);
    return;
  }
  /* One fprintf per message so that lines of concurrent threads do not mix. */
  fprintf(stderr, "kiln: %s: %s\n", level_text(level), message);
}

void kiln_log_set_callback(kiln_log_fn fn, void *user) {
  pthread_mutex_lock(&sink_lock);
  sink = fn;
  sink_user = fn ? user : NULL;
  pthread_mutex_unlock(&sink_lock);
}

void kiln_log_set_level(kiln_log_level_t level) {
  int value = (int)level;
  if (value < KILN_LOG_OFF) value = KILN_LOG_OFF;
  if (value > KILN_LOG_DEBUG) value = KILN_LOG_DEBUG;
  atomic_store_explicit(&kiln__log_level_value, value, memory_order_relaxed);
}

kiln_log_level_t kiln_log_level(void) {
  return (kiln_log_level_t)atomic_load_explicit(&kiln__log_level_value, memory_order_relaxed);
}
