/* runtime/dispatch.c: choosing the provider of each operation (policy, overrides, measured `fastest`) and enqueuing it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/internal.h"

static _Thread_local int kiln_last = -1;
/* check.c computes its reference with NATIVE whatever the policy says. */
static _Thread_local int kiln_forced = KILN_PROVIDER_NONE;

const char *kiln_last_provider(void) { return kiln_last < 0 ? "" : kiln__provider_name((kiln_provider_t)kiln_last); }

void kiln__dispatch_force(int provider) { kiln_forced = provider; }

/* ---- the in-process table of `fastest` winners ---------------------------------- */

typedef struct kiln_winner_t {
  char *key;
  kiln_provider_t provider;
} kiln_winner_t;

static pthread_mutex_t kiln_winners_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_winner_t *kiln_winners;
static size_t kiln_winner_count, kiln_winner_capacity;

void kiln__dispatch_reset(void) {
  pthread_mutex_lock(&kiln_winners_lock);
  for (size_t i = 0; i < kiln_winner_count; i++) free(kiln_winners[i].key);
  free(kiln_winners);
  kiln_winners = NULL;
  kiln_winner_count = kiln_winner_capacity = 0;
  pthread_mutex_unlock(&kiln_winners_lock);
}

static bool kiln_winner_find(const char *key, kiln_provider_t *out) {
  bool found = false;
  pthread_mutex_lock(&kiln_winners_lock);
  for (size_t i = 0; i < kiln_winner_count; i++) {
    if (!strcmp(kiln_winners[i].key, key)) {
      *out = kiln_winners[i].provider;
      found = true;
      break;
    }
  }
  pthread_mutex_unlock(&kiln_winners_lock);
  return found;
}

static void kiln_winner_put(const char *key, kiln_provider_t provider) {
  pthread_mutex_lock(&kiln_winners_lock);
  if (kiln_winner_count == kiln_winner_capacity) {
    size_t capacity = kiln_winner_capacity ? kiln_winner_capacity * 2 : 32;
    kiln_winner_t *grown = realloc(kiln_winners, capacity * sizeof *grown);
    if (!grown) goto out; /* only forgets: the tuning store still has it */
    kiln_winners = grown;
    kiln_winner_capacity = capacity;
  }
  char *copy = strdup(key);
  if (copy) kiln_winners[kiln_winner_count++] = (kiln_winner_t){copy, provider};
out:
  pthread_mutex_unlock(&kiln_winners_lock);
}

/* ---- describing an op -------------------------------------------------------------- */

/* The dtype whose providers serve the op: the input's where there is one. */
static kiln_dtype_t kiln_op_dtype(const kiln_op_t *op) {
  switch (op->kind) {
    case KILN_OP_FILL:
    case KILN_OP_ARANGE:
    case KILN_OP_RANDOM: return op->out.dtype;
    default: return op->in[0].dtype;
  }
}

/* The shape part of keys (for_key: with matmul's transposes, which change
 * the winner) and of log lines. */
static void kiln_op_signature(const kiln_op_t *op, bool for_key, char *out, size_t size) {
  int n = 0;
  switch (op->kind) {
    case KILN_OP_MATMUL:
      if (op->u.matmul.batch > 1)
        n = snprintf(out, size, "%lldx", (long long)op->u.matmul.batch);
      snprintf(out + n, size - (size_t)n, "%lldx%lldx%lld%s%s", (long long)op->u.matmul.m, (long long)op->u.matmul.n,
               (long long)op->u.matmul.k, !for_key ? "" : op->u.matmul.trans_a ? "t" : "n",
               !for_key ? "" : op->u.matmul.trans_b ? "t" : "n");
      return;
    case KILN_OP_CONV2D:
      snprintf(out, size, "%lldx%lldx%lldx%lld*%lldx%lldx%lld/s%dx%d/p%dx%d/d%dx%d%s", (long long)op->u.conv2d.n,
               (long long)op->u.conv2d.c, (long long)op->u.conv2d.h, (long long)op->u.conv2d.w,
               (long long)op->u.conv2d.k, (long long)op->u.conv2d.r, (long long)op->u.conv2d.s, op->u.conv2d.stride[0],
               op->u.conv2d.stride[1], op->u.conv2d.pad[0], op->u.conv2d.pad[1], op->u.conv2d.dil[0],
               op->u.conv2d.dil[1], op->u.conv2d.has_bias ? "+b" : "");
      return;
    default: break;
  }
  out[0] = '\0';
  for (int i = 0; i < op->out.ndim && (size_t)n < size; i++)
    n += snprintf(out + n, size - (size_t)n, "%s%lld", i ? "x" : "", (long long)op->out.shape[i]);
  if (op->out.ndim == 0) snprintf(out, size, "scalar");
}

static double kiln_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Run once and wait: KILN_OK with the wall time, or the provider's refusal. */
static kiln_status_t kiln_time_run(kiln_queue_t *queue, kiln_provider_t provider, const kiln_op_t *op, double *out_ms) {
  const kiln_backend_iface_t *iface = queue->device->iface;
  double t0 = kiln_now_ms();
  kiln_status_t status = iface->op_run(queue->impl, provider, op);
  if (status == KILN_OK) status = iface->queue_finish(queue->impl);
  *out_ms = kiln_now_ms() - t0;
  return status;
}

/* Measure every candidate of `mask`: a warm-up run, then the best of three
 * runs timed on the host clock around run + finish (a vendor's events may not
 * cover the helper kernels it launches). The op's output is rewritten by each
 * run, which is harmless: the inputs never alias it. */
static kiln_status_t kiln_measure(kiln_queue_t *queue, const kiln_op_t *op, uint32_t mask, const char *key,
                                  kiln_provider_t *out_winner) {
  kiln_device_t *device = queue->device;
  /* Earlier work must not be counted against the first candidate. */
  kiln_status_t status = device->iface->queue_finish(queue->impl);
  if (status != KILN_OK) return status;
  double best = 0;
  int winner = -1;
  char report[256] = "";
  size_t used = 0;
  for (int p = 0; p < KILN_PROVIDER_COUNT; p++) {
    if (!(mask & (1u << p))) continue;
    double ms = 0, fastest = 0;
    status = kiln_time_run(queue, (kiln_provider_t)p, op, &ms);
    for (int r = 0; r < 3 && status == KILN_OK; r++) {
      status = kiln_time_run(queue, (kiln_provider_t)p, op, &ms);
      if (r == 0 || ms < fastest) fastest = ms;
    }
    if (status != KILN_OK) {
      /* A candidate that cannot run this op simply drops out. */
      kiln__log(KILN_LOG_DEBUG, "fastest %s: %s dropped out: %s", key, kiln__provider_name((kiln_provider_t)p),
                kiln_last_error());
      kiln_clear_error();
      continue;
    }
    if (used < sizeof report)
      used += (size_t)snprintf(report + used, sizeof report - used, "%s%s %.4f ms", used ? ", " : "",
                               kiln__provider_name((kiln_provider_t)p), fastest);
    if (winner < 0 || fastest < best) {
      best = fastest;
      winner = p;
    }
  }
  if (winner < 0) winner = KILN_PROVIDER_NATIVE;
  kiln__log(KILN_LOG_INFO, "fastest %s -> %s (%s)", key, kiln__provider_name((kiln_provider_t)winner), report);
  *out_winner = (kiln_provider_t)winner;
  return KILN_OK;
}

/* ---- dispatch ----------------------------------------------------------------------- */

kiln_status_t kiln__dispatch(kiln_queue_t *queue, kiln_op_t *op) {
  kiln_device_t *device = queue->device;
  const kiln_backend_iface_t *iface = device->iface;
  kiln_dtype_t dtype = kiln_op_dtype(op);
  uint32_t mask = 0;
  if (dtype == KILN_F32) mask = device->provider_mask[op->kind][0];
  else if (dtype == KILN_I32) mask = device->provider_mask[op->kind][1];
  if (mask == 0)
    return kiln__set_error(KILN_DTYPE_MISMATCH,
                           "%s on %s is not supported by %s; use f32%s", kiln__op_kind_name(op->kind),
                           kiln_dtype_name(dtype), device->display_name,
                           device->provider_mask[op->kind][1] ? " or i32" : "");
  kiln_policy_t policy = (kiln_policy_t)atomic_load_explicit(&kiln__rt.policy, memory_order_relaxed);
  int override = atomic_load_explicit(&kiln__rt.overrides[op->kind], memory_order_relaxed);
  if (kiln_forced != KILN_PROVIDER_NONE) override = kiln_forced;
  const char *why = NULL;
  kiln_provider_t provider = KILN_PROVIDER_NATIVE;

  if (override >= 0 && (mask & (1u << override))) {
    provider = (kiln_provider_t)override;
    why = "override";
  } else if ((mask & (mask - 1)) == 0 || policy == KILN_POLICY_PORTABLE) {
    /* One candidate (native), or kiln's own kernels by choice. */
    provider = KILN_PROVIDER_NATIVE;
  } else if (policy == KILN_POLICY_VENDOR) {
    for (int p = 0; p < KILN_PROVIDER_COUNT; p++) {
      if (p != KILN_PROVIDER_NATIVE && (mask & (1u << p))) {
        provider = (kiln_provider_t)p;
        break;
      }
    }
  } else {
    char signature[160], key[768];
    kiln_op_signature(op, true, signature, sizeof signature);
    snprintf(key, sizeof key, "%s|%s|%s|%s|%s|%s", iface->name, device->desc.name,
             device->desc.uuid[0] ? device->desc.uuid : device->desc.driver_version, kiln__op_kind_name(op->kind),
             kiln_dtype_name(dtype), signature);
    if (!kiln_winner_find(key, &provider)) {
      if (kiln__tuning_lookup(key, &provider) != KILN_OK || !(mask & (1u << provider))) {
        kiln_clear_error();
        kiln_status_t status = kiln_measure(queue, op, mask, key, &provider);
        if (status != KILN_OK) return kiln__wrap_error(status, "measuring %s for policy fastest", key);
        kiln__tuning_store(key, provider);
      }
      kiln_winner_put(key, provider);
    }
  }

  kiln_status_t status = iface->op_run(queue->impl, provider, op);
  if (status == KILN_UNSUPPORTED && provider != KILN_PROVIDER_NATIVE) {
    /* A vendor library that cannot take these arguments: kiln's own can. */
    kiln__log(KILN_LOG_DEBUG, "%s: %s declined (%s); running native", kiln__op_kind_name(op->kind),
              kiln__provider_name(provider), kiln_last_error());
    kiln_clear_error();
    provider = KILN_PROVIDER_NATIVE;
    status = iface->op_run(queue->impl, provider, op);
  }
  if (status != KILN_OK)
    return kiln__wrap_error(status, "running %s (%s) with provider %s on %s", kiln__op_kind_name(op->kind),
                            kiln_dtype_name(dtype), kiln__provider_name(provider), device->display_name);
  kiln_last = (int)provider;
  if (kiln__log_enabled(KILN_LOG_DEBUG)) {
    char signature[160];
    kiln_op_signature(op, false, signature, sizeof signature);
    kiln__log(KILN_LOG_DEBUG, "%s %s [%s] on %s -> %s (%s%s)", kiln__op_kind_name(op->kind), kiln_dtype_name(dtype),
              signature, device->selector, kiln__provider_name(provider), why ? why : "policy ",
              why ? "" : kiln_policy_name(policy));
  }
  return KILN_OK;
}
