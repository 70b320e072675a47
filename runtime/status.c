/* runtime/status.c: status names and the per-thread error message every failing call leaves behind. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"

/* Long enough for a loader message plus the paths tried or a kernel build log
 * excerpt; longer messages are cut, never overflowed. */
#define KILN_ERROR_CAPACITY 2048

static _Thread_local char error_message[KILN_ERROR_CAPACITY];
static _Thread_local kiln_status_t error_status = KILN_OK;

const char *kiln_status_name(kiln_status_t status) {
  switch (status) {
#define KILN_STATUS_NAME_(name, value, text) \
  case KILN_##name:                          \
    return #name;
    KILN_STATUS_MAP(KILN_STATUS_NAME_)
#undef KILN_STATUS_NAME_
  }
  return "UNKNOWN";
}

const char *kiln_status_describe(kiln_status_t status) {
  switch (status) {
#define KILN_STATUS_TEXT_(name, value, text) \
  case KILN_##name:                          \
    return text;
    KILN_STATUS_MAP(KILN_STATUS_TEXT_)
#undef KILN_STATUS_TEXT_
  }
  return "unknown status code";
}

kiln_status_t kiln__set_error(kiln_status_t status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, args);
  va_end(args);
  error_status = status;
  return status;
}

kiln_status_t kiln__wrap_error(kiln_status_t status, const char *fmt, ...) {
  /* Format the context into a scratch buffer first: the old message is the
   * tail of the new one, so it cannot be written in place. */
  char old[KILN_ERROR_CAPACITY];
  memcpy(old, error_message, sizeof old);
  old[sizeof old - 1] = '\0';
  char context[KILN_ERROR_CAPACITY];
  va_list args;
  va_start(args, fmt);
  vsnprintf(context, sizeof context, fmt, args);
  va_end(args);
  /* Joined by hand: a message too long for the buffer is cut at its end. */
  size_t used = 0;
  const char *parts[3] = {context, old[0] ? ": " : "", old};
  for (int i = 0; i < 3; i++) {
    size_t len = strlen(parts[i]);
    if (len > sizeof error_message - 1 - used) len = sizeof error_message - 1 - used;
    memcpy(error_message + used, parts[i], len);
    used += len;
  }
  error_message[used] = '\0';
  error_status = status;
  return status;
}

const char *kiln_last_error(void) { return error_message; }

kiln_status_t kiln_last_status(void) { return error_status; }

void kiln_clear_error(void) {
  error_message[0] = '\0';
  error_status = KILN_OK;
}
