/* runtime/runtime.c: start-up and shutdown of kiln's process-wide state (runtime/state.c), and the policy settings. */
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"
#include "runtime/trace.h"

enum { KILN_STATE_STOPPED = 0, KILN_STATE_STARTED = 1, KILN_STATE_FAILED = 2 };

static _Atomic int state_now = KILN_STATE_STOPPED;
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
/* A failed start is remembered so that every later call reports the same
 * cause instead of retrying (and logging) again and again. */
static kiln_status_t start_status;
static char start_message[2048];
/* Set on the thread that is starting kiln: a backend or the compute side
 * calling back into the API during start-up must not wait for itself. */
static _Thread_local bool starting;

/* Load settings and backends. Called with start_lock held. */
static kiln_status_t start_locked(const kiln_config_t *api) {
  memset(&kiln__rt, 0, sizeof kiln__rt);
  kiln_status_t status = kiln__config_load(api, &kiln__rt.config);
  if (status != KILN_OK) return status;
  /* KILN_LOG applies from here on, so that backend loading can be traced; a
   * level the application set itself is kept when KILN_LOG is unset, and
   * KILN_LOG=off is applied like any other level. */
  if (kiln__rt.config.log_level_set) kiln_log_set_level(kiln__rt.config.log_level);
  kiln__config_warn_unknown();
  kiln__cache_sweep();
  atomic_store(&kiln__rt.policy, (int)kiln__rt.config.policy);
  for (int k = 0; k < KILN_OP_COUNT; k++) atomic_store(&kiln__rt.overrides[k], kiln__rt.config.overrides[k]);

  starting = true;
  status = kiln__registry_load(&kiln__rt);
  starting = false;
  if (status != KILN_OK) {
    kiln__config_free(&kiln__rt.config);
    return status;
  }
  kiln__log(KILN_LOG_INFO, "kiln %s started: %zu device(s), default %s, policy %s, cache %s", kiln_version(),
            kiln__rt.device_count, kiln__rt.default_device ? kiln__rt.default_device->display_name : "none",
            kiln_policy_name((kiln_policy_t)kiln__rt.config.policy),
            kiln__rt.config.cache_dir ? kiln__rt.config.cache_dir : "none");
  /* KILN_TRACE records from here to kiln_deinitialize or the process's exit. */
  if (kiln__rt.config.trace_path) {
    status = kiln__trace_start(kiln__rt.config.trace_path, kiln__rt.config.trace_events);
    if (status != KILN_OK) {
      status = kiln__wrap_error(status, "KILN_TRACE=\"%s\"", kiln__rt.config.trace_path);
      kiln__registry_unload(&kiln__rt);
      kiln__config_free(&kiln__rt.config);
      return status;
    }
  }
  return KILN_OK;
}

kiln_status_t kiln__ensure(void) {
  int state = atomic_load_explicit(&state_now, memory_order_acquire);
  if (state == KILN_STATE_STARTED || starting) return KILN_OK;
  if (state == KILN_STATE_STOPPED) {
    pthread_mutex_lock(&start_lock);
    state = atomic_load_explicit(&state_now, memory_order_acquire);
    if (state == KILN_STATE_STOPPED) {
      kiln_status_t status = start_locked(NULL);
      if (status == KILN_OK) {
        state = KILN_STATE_STARTED;
      } else {
        start_status = status;
        snprintf(start_message, sizeof start_message, "%s", kiln_last_error());
        state = KILN_STATE_FAILED;
      }
      atomic_store_explicit(&state_now, state, memory_order_release);
    }
    pthread_mutex_unlock(&start_lock);
    if (state == KILN_STATE_STARTED) return KILN_OK;
  }
  return kiln__set_error(start_status, "kiln could not start: %s", start_message);
}

kiln_status_t kiln_initialize(const kiln_config_t *config) {
  pthread_mutex_lock(&start_lock);
  int state = atomic_load_explicit(&state_now, memory_order_acquire);
  if (state != KILN_STATE_STOPPED) {
    pthread_mutex_unlock(&start_lock);
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_initialize: kiln already %s; call kiln_initialize before any other kiln call, "
                           "or kiln_deinitialize first",
                           state == KILN_STATE_STARTED ? "started" : "failed to start from the environment");
  }
  kiln_status_t status = start_locked(config);
  /* An explicit start that failed leaves kiln stopped: the caller can fix
   * the settings and call again. */
  if (status == KILN_OK) atomic_store_explicit(&state_now, KILN_STATE_STARTED, memory_order_release);
  pthread_mutex_unlock(&start_lock);
  return status;
}

kiln_status_t kiln_ensure_initialized(void) { return kiln__ensure(); }

void kiln_deinitialize(void) {
  pthread_mutex_lock(&start_lock);
  int state = atomic_load_explicit(&state_now, memory_order_acquire);
  if (state == KILN_STATE_STARTED) {
    kiln__trace_shutdown();
    kiln__registry_unload(&kiln__rt);
    kiln__cache_reset();
    kiln__queue_forget_thread();
    kiln__config_free(&kiln__rt.config);
    memset(&kiln__rt, 0, sizeof kiln__rt);
  }
  /* The calling thread's recycled tensor structs: a leak checker run after
   * kiln_deinitialize sees nothing of kiln's left. */
  kiln__tensor_cache_drop();
  start_status = KILN_OK;
  start_message[0] = '\0';
  atomic_store_explicit(&state_now, KILN_STATE_STOPPED, memory_order_release);
  pthread_mutex_unlock(&start_lock);
}

kiln_policy_t kiln_policy(void) {
  if (kiln__ensure() != KILN_OK) return KILN_POLICY_VENDOR;
  return (kiln_policy_t)atomic_load_explicit(&kiln__rt.policy, memory_order_relaxed);
}

kiln_status_t kiln_set_policy(kiln_policy_t policy) {
  if ((int)policy < KILN_POLICY_VENDOR || policy > KILN_POLICY_FASTEST)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_set_policy(%d): not a policy; use KILN_POLICY_VENDOR, KILN_POLICY_PORTABLE or "
                           "KILN_POLICY_FASTEST",
                           (int)policy);
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  atomic_store_explicit(&kiln__rt.policy, (int)policy, memory_order_relaxed);
  return KILN_OK;
}

kiln_status_t kiln_set_providers(const char *overrides) {
  if (!overrides)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_set_providers: overrides is NULL; pass \"\" to clear them or pairs such as "
                           "\"matmul=blas,conv2d=native\"");
  int parsed[KILN_OP_COUNT];
  kiln_status_t status = kiln__parse_providers(overrides, parsed);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_set_providers(\"%s\")", overrides);
  status = kiln__ensure();
  if (status != KILN_OK) return status;
  for (int k = 0; k < KILN_OP_COUNT; k++)
    atomic_store_explicit(&kiln__rt.overrides[k], parsed[k], memory_order_relaxed);
  return KILN_OK;
}

const char *kiln_policy_name(kiln_policy_t policy) {
  switch (policy) {
    case KILN_POLICY_VENDOR: return "vendor";
    case KILN_POLICY_PORTABLE: return "portable";
    case KILN_POLICY_FASTEST: return "fastest";
  }
  return "unknown";
}

const char *kiln_cache_dir(void) {
  if (kiln__ensure() != KILN_OK) return NULL;
  return kiln__rt.config.cache_dir;
}
