/* kiln/runtime.h: version, settings (the environment variables as an API), logging, cache statistics. */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

/* "0.1.0": the version of the library actually linked. Static storage. */
const char *kiln_version(void);

/* How operations choose among providers (KILN_POLICY). */
typedef enum kiln_policy_t {
  KILN_POLICY_VENDOR = 0,   /* tuned vendor libraries where present (default) */
  KILN_POLICY_PORTABLE = 1, /* kiln's own kernels only */
  KILN_POLICY_FASTEST = 2,  /* measure each candidate once per op, shape, device; remember on disk */
} kiln_policy_t;

typedef enum kiln_log_level_t {
  KILN_LOG_OFF = 0,
  KILN_LOG_ERROR = 1,
  KILN_LOG_WARN = 2,
  KILN_LOG_INFO = 3,
  KILN_LOG_DEBUG = 4,
} kiln_log_level_t;

/* The settings the environment variables carry, for programs that do not want
 * variables. A NULL string (or a negative number) means "take it from the
 * environment variable, else the default". Strings use the same grammar as the
 * variables (docs/environment.md). */
typedef struct kiln_config_t {
  const char *backend;      /* KILN_BACKEND: "cuda,opencl,cpu" */
  const char *device;       /* KILN_DEVICE: "opencl:gpu;!cuda:1" */
  const char *policy;       /* KILN_POLICY: "vendor" | "portable" | "fastest" */
  const char *provider;     /* KILN_PROVIDER: "matmul=blas,conv2d=native" */
  const char *cache_dir;    /* KILN_CACHE_DIR */
  const char *backend_path; /* KILN_BACKEND_PATH: directories separated by ':' */
  const char *log;          /* KILN_LOG: "error" | "warn" | "info" | "debug" */
  int cpu_devices;          /* KILN_CPU_DEVICES: 1..64; < 0 means unset */
} kiln_config_t;

/* Fill a config with "unset" everywhere (NULL strings, cpu_devices = -1). */
void kiln_config_initialize(kiln_config_t *config);

/* Start kiln with explicit settings. Optional: every other call starts kiln on
 * first use from the environment alone. Must come before any other call that
 * touches devices; a second call, or a call after kiln started, returns
 * KILN_INVALID_ARGUMENT. A malformed setting returns KILN_INVALID_ARGUMENT with
 * a message quoting it and showing the grammar; a backend named explicitly that
 * cannot load returns KILN_UNAVAILABLE with the loader's reason. Blocks while
 * backends load. Thread-safe. */
kiln_status_t kiln_initialize(const kiln_config_t *config);

/* Start kiln from the environment if it has not started; returns the status of
 * that start (the same status on every later call). Every API call that needs
 * devices does this implicitly. Thread-safe. */
kiln_status_t kiln_ensure_initialized(void);

/* Wait for all work, free every pooled buffer, and release kiln's global state
 * so that leak checkers see a clean exit. Handles still held by the application
 * become invalid. Plugins stay loaded (their threads may still exist). After
 * this call kiln may be initialised again. Not thread-safe with other calls. */
void kiln_deinitialize(void);

/* The policy in force (after parsing KILN_POLICY or the config). */
kiln_policy_t kiln_policy(void);

/* Set the policy for the rest of the process (all threads). */
kiln_status_t kiln_set_policy(kiln_policy_t policy);

/* Replace the provider overrides with a KILN_PROVIDER-style string
 * ("matmul=blas,conv2d=native"; "" clears them). KILN_INVALID_ARGUMENT with the
 * grammar for a malformed string or an unknown op or provider name. */
kiln_status_t kiln_set_providers(const char *overrides);

/* "vendor", "portable", "fastest". Static storage. */
const char *kiln_policy_name(kiln_policy_t policy);

/* Log sink. Called from any thread, possibly concurrently; must not call kiln.
 * The message has no trailing newline. */
typedef void (*kiln_log_fn)(kiln_log_level_t level, const char *message, void *user);

/* Install a log sink (NULL restores the default, which writes to stderr only
 * when KILN_LOG or kiln_log_set_level asked for messages). */
void kiln_log_set_callback(kiln_log_fn fn, void *user);

/* Set the level; messages above it are dropped. Default: KILN_LOG_OFF unless
 * KILN_LOG says otherwise. */
void kiln_log_set_level(kiln_log_level_t level);
kiln_log_level_t kiln_log_level(void);

/* Counters of the on-disk cache (compiled kernels and tuning results), for
 * tests and tools. Process-wide totals since start. */
typedef struct kiln_cache_stats_t {
  uint64_t hits;      /* entries found valid and used */
  uint64_t misses;    /* entries absent */
  uint64_t stores;    /* entries written */
  uint64_t corrupt;   /* entries found truncated, corrupt or stale, and ignored */
  uint64_t failures;  /* stores that could not be written (e.g. read-only directory) */
} kiln_cache_stats_t;

/* Copy the counters out. Never fails for a non-NULL argument. */
kiln_status_t kiln_cache_stats(kiln_cache_stats_t *out_stats);

/* The cache directory in force (KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 * $HOME/.cache/kiln), or NULL when none can be determined. Static storage owned
 * by kiln, valid until kiln_deinitialize. */
const char *kiln_cache_dir(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_RUNTIME_H */
