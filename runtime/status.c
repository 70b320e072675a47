/* runtime/status.c: status names and the per-thread error message every failing call leaves behind. */
#include <stdarg.h>
#include <stdbool.h>
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

static bool status_known(kiln_status_t status) {
  switch (status) {
#define KILN_STATUS_KNOWN_(name, value, text) case KILN_##name:
    KILN_STATUS_MAP(KILN_STATUS_KNOWN_)
#undef KILN_STATUS_KNOWN_
    return true;
  }
  return false;
}

static kiln_status_t set_error_v(kiln_status_t status, const char *fmt, va_list args) {
  vsnprintf(error_message, sizeof error_message, fmt, args);
  error_status = status;
  return status;
}

/* The old message is the tail of the new one, so the context is formatted
 * into a scratch buffer first; a message too long is cut at its end. */
static kiln_status_t wrap_error_v(kiln_status_t status, const char *fmt, va_list args) {
  char old[KILN_ERROR_CAPACITY];
  memcpy(old, error_message, sizeof old);
  old[sizeof old - 1] = '\0';
  char context[KILN_ERROR_CAPACITY];
  vsnprintf(context, sizeof context, fmt, args);
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

kiln_status_t kiln__set_error(kiln_status_t status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  set_error_v(status, fmt, args);
  va_end(args);
  return status;
}

kiln_status_t kiln__wrap_error(kiln_status_t status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  wrap_error_v(status, fmt, args);
  va_end(args);
  return status;
}

/* The public pair: the same, with codes from outside the table (a caller's
 * cast) recorded as KILN_INTERNAL so kiln_last_status stays a known code. */
kiln_status_t kiln_set_error(kiln_status_t status, const char *fmt, ...) {
  if (!status_known(status)) status = KILN_INTERNAL;
  if (!fmt) fmt = "";
  va_list args;
  va_start(args, fmt);
  set_error_v(status, fmt, args);
  va_end(args);
  return status;
}

kiln_status_t kiln_wrap_error(kiln_status_t status, const char *fmt, ...) {
  if (!status_known(status)) status = KILN_INTERNAL;
  if (!fmt) fmt = "";
  va_list args;
  va_start(args, fmt);
  wrap_error_v(status, fmt, args);
  va_end(args);
  return status;
}

const char *kiln_last_error(void) { return error_message; }

kiln_status_t kiln_last_status(void) { return error_status; }

void kiln_clear_error(void) {
  error_message[0] = '\0';
  error_status = KILN_OK;
}
