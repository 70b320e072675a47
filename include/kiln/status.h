/* kiln/status.h: status codes and the per-thread error message. */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* Every status code, once: X(NAME, value, "short description").
 * The X-macro keeps the enum, kiln_status_name() and the docs in step. */
#define KILN_STATUS_MAP(X)                                                          \
  X(OK, 0, "success")                                                               \
  X(INVALID_ARGUMENT, 1, "an argument is NULL, out of range or malformed")          \
  X(OUT_OF_MEMORY, 2, "host or device memory is exhausted")                         \
  X(DEVICE_MISMATCH, 3, "operands live on different devices")                       \
  X(SHAPE_MISMATCH, 4, "operand shapes are incompatible")                           \
  X(DTYPE_MISMATCH, 5, "operand dtypes are incompatible or unsupported")            \
  X(NOT_FOUND, 6, "no such device, backend, provider or entry")                     \
  X(UNAVAILABLE, 7, "a backend, library or device cannot be used on this machine")  \
  X(UNSUPPORTED, 8, "the operation is not supported here")                          \
  X(ABI_MISMATCH, 9, "a plugin was built for another backend ABI version")          \
  X(BUILD_FAILED, 10, "a kernel failed to compile")                                 \
  X(DEVICE_LOST, 11, "the device failed or was lost")                               \
  X(OUT_OF_RESOURCES, 12, "the device lacks resources to launch the work")          \
  X(IO, 13, "a file could not be read or written")                                  \
  X(NOT_READY, 14, "the work has not completed yet")                                \
  X(INTERNAL, 15, "an internal error in kiln or a vendor library")                  \
  X(INDEX_OUT_OF_RANGE, 16, "an index or label is outside the range it selects from")

/* Status of every fallible call; KILN_OK (0) is success. */
typedef enum kiln_status_t {
#define KILN_STATUS_ENUM_(name, value, text) KILN_##name = value,
  KILN_STATUS_MAP(KILN_STATUS_ENUM_)
#undef KILN_STATUS_ENUM_
} kiln_status_t;

/* The codes also go by KILN_ERROR_<NAME> where that reads better at a call site. */
#define KILN_ERROR_INVALID_ARGUMENT KILN_INVALID_ARGUMENT
#define KILN_ERROR_OUT_OF_MEMORY KILN_OUT_OF_MEMORY
#define KILN_ERROR_DEVICE_MISMATCH KILN_DEVICE_MISMATCH
#define KILN_ERROR_SHAPE_MISMATCH KILN_SHAPE_MISMATCH
#define KILN_ERROR_DTYPE_MISMATCH KILN_DTYPE_MISMATCH
#define KILN_ERROR_NOT_FOUND KILN_NOT_FOUND
#define KILN_ERROR_UNAVAILABLE KILN_UNAVAILABLE
#define KILN_ERROR_UNSUPPORTED KILN_UNSUPPORTED

/* The enum name of a status without the prefix ("DEVICE_MISMATCH"), or
 * "UNKNOWN". Static storage; never NULL; never fails. */
const char *kiln_status_name(kiln_status_t status);

/* A one-line description of a status code. Static storage; never NULL. */
const char *kiln_status_describe(kiln_status_t status);

/* The message of the last error returned to the calling thread: what failed,
 * with which values, and what to do. The string belongs to the thread and stays
 * valid until that thread's next kiln call that fails. Returns "" when no call
 * of this thread has failed. Never blocks. */
const char *kiln_last_error(void);

/* The status of the last failed call on this thread (KILN_OK if none). */
kiln_status_t kiln_last_status(void);

/* Forget the calling thread's last error. */
void kiln_clear_error(void);

#if defined(__GNUC__)
#define KILN_PRINTF_(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define KILN_PRINTF_(fmt, args)
#endif

/* Set the calling thread's message (printf-style, cut at 2047 bytes) and
 * status, as kiln's own calls do, and return `status`. For libraries built on
 * kiln's public API (libkiln-nn) and for applications, so that their errors
 * reach the caller through the same kiln_last_error(). A status outside
 * KILN_STATUS_MAP is recorded as KILN_INTERNAL. Never blocks. */
kiln_status_t kiln_set_error(kiln_status_t status, const char *fmt, ...) KILN_PRINTF_(2, 3);

/* Prefix the calling thread's message with "context: " (the context printf-
 * style) and set its status; returns `status`. Use it to add what the caller
 * was doing to the message of a kiln call that failed. Never blocks. */
kiln_status_t kiln_wrap_error(kiln_status_t status, const char *fmt, ...) KILN_PRINTF_(2, 3);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_STATUS_H */
