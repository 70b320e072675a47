/* runtime/dispatch.c: every validated operation's one path: allocate the result, complete the op, choose the row (policy, KILN_PROVIDER, measured `fastest`), run it, fall back. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/internal.h"
#include "kernels/dtype_convert.h"
#include "runtime/trace.h"

/* The provider that ran the calling thread's last op (static storage). */
static _Thread_local const char *last_provider = "";

const char *kiln_last_provider(void) { return last_provider; }

/* ---- which provider ran each op, counted per thread ------------------------------ */

/* Indexed like kiln_op_name: the kinds, then the unary ops, then the binary
 * ops (BINARY_SCALAR counts under its binary op). */
#define OP_NAME_COUNT (KILN_OP_COUNT + KILN_UNARY_COUNT_ + KILN_BINARY_COUNT_)

static _Thread_local uint64_t provider_calls[OP_NAME_COUNT][KILN__MAX_PROVIDERS];
static _Thread_local bool provider_calls_any;

static size_t op_name_index(const kiln_op_t *op) {
  switch (op->kind) {
  case KILN_OP_UNARY: return KILN_OP_COUNT + (size_t)op->u.unary.op;
  case KILN_OP_BINARY:
  case KILN_OP_BINARY_SCALAR: return KILN_OP_COUNT + KILN_UNARY_COUNT_ + (size_t)op->u.binary.op;
  default: return (size_t)op->kind;
  }
}

size_t kiln_provider_uses(kiln_provider_use_t *out_uses, size_t capacity) {
  size_t n = 0;
  if (!provider_calls_any) return 0;
  for (size_t op = 0; op < OP_NAME_COUNT; op++) {
    for (int p = 0; p < KILN__MAX_PROVIDERS; p++) {
      if (!provider_calls[op][p]) continue;
      if (out_uses && n < capacity)
        out_uses[n] = (kiln_provider_use_t){kiln_op_name(op), kiln__provider_name(p), provider_calls[op][p]};
      n++;
    }
  }
  return n;
}

void kiln_provider_uses_reset(void) {
  if (!provider_calls_any) return;
  memset(provider_calls, 0, sizeof provider_calls);
  provider_calls_any = false;
}

kiln_scalar_t kiln__scalar(double value, kiln_dtype_t dtype) {
  kiln_scalar_t s;
  s.value = value;
  s.bits = 0;
  switch (dtype) {
#define KILN_SCALAR_BITS_(E, name, T, carrier)   \
  case KILN_##E: {                               \
    const T x = kiln_dc_f64_to_##name(value);   \
    memcpy(&s.bits, &x, sizeof x);               \
    break;                                       \
  }
    KILN_DC_DTYPES(KILN_SCALAR_BITS_)
#undef KILN_SCALAR_BITS_
  default: break;
  }
  s.f32 = (float)value;
  if (value != value) s.i32 = 0;
  else if (value >= 2147483647.0) s.i32 = INT32_MAX;
  else if (value <= -2147483648.0) s.i32 = INT32_MIN;
  else s.i32 = (int32_t)value;
  return s;
}

/* ---- completing the op -------------------------------------------------------- */

/* Merge the dimensions of an elementwise op: extents of 1 dropped, and each
 * dimension fused into the one before wherever every operand is contiguous
 * across the two (broadcast strides of 0 fuse too). The result has at least
 * one dimension; `flat` says everything is one contiguous run. */
static void merge_dims(kiln_op_t *op) {
  kiln_view_t *views[1 + KILN_KOP_MAX_IN] = {&op->out, &op->in[0], &op->in[1], &op->in[2], &op->in[3]};
  const int n = 1 + op->n_in;
  int64_t shape[KILN_MAX_DIMS];
  int64_t strides[1 + KILN_KOP_MAX_IN][KILN_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < op->out.ndim; d++) {
    const int64_t extent = op->out.shape[d];
    if (extent == 1) continue;
    bool fuse = nd > 0;
    for (int v = 0; v < n && fuse; v++) fuse = strides[v][nd - 1] == views[v]->strides[d] * extent;
    if (fuse) {
      shape[nd - 1] *= extent;
      for (int v = 0; v < n; v++) strides[v][nd - 1] = views[v]->strides[d];
      continue;
    }
    shape[nd] = extent;
    for (int v = 0; v < n; v++) strides[v][nd] = views[v]->strides[d];
    nd++;
  }
  if (nd == 0) {
    /* One element (every extent 1, or 0-d). */
    shape[0] = 1;
    for (int v = 0; v < n; v++) strides[v][0] = 1;
    nd = 1;
  }
  bool flat = nd == 1;
  for (int v = 0; v < n; v++) {
    views[v]->ndim = nd;
    for (int d = 0; d < nd; d++) {
      views[v]->shape[d] = shape[d];
      views[v]->strides[d] = strides[v][d];
    }
    flat = flat && strides[v][0] == 1;
  }
  op->flat = flat;
}

/* ---- describing an op (keys of `fastest`, log lines) -------------------------------- */

/* The dtype the op computes in: the input's where there is one. */
static kiln_dtype_t op_dtype(const kiln_op_t *op) { return op->n_in > 0 ? op->in[0].dtype : op->out.dtype; }

/* The shape part of keys (for_key: with matmul's transposes, which change
 * the winner) and of log lines. */
static void op_signature(const kiln_op_t *op, bool for_key, char *out, size_t size) {
  int n = 0;
  switch (op->kind) {
    case KILN_OP_MATMUL:
      if (op->u.matmul.batch > 1) n = snprintf(out, size, "%lldx", (long long)op->u.matmul.batch);
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
  if (kiln_backend_op_is_elementwise(op->kind) && op->flat) {
    snprintf(out, size, "%lld", (long long)kiln_backend_view_numel(&op->out));
    return;
  }
  for (int i = 0; i < op->out.ndim && (size_t)n < size; i++)
    n += snprintf(out + n, size - (size_t)n, "%s%lld", i ? "x" : "", (long long)op->out.shape[i]);
  if (op->out.ndim == 0) snprintf(out, size, "scalar");
}

/* ---- `fastest`: measuring the candidates ---------------------------------------------- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Run once and wait: KILN_OK with the wall time, or the row's refusal. */
static kiln_status_t time_run(kiln_queue_t *queue, const kiln__op_row_t *row, const kiln_op_t *op, double *out_ms) {
  kiln_device_t *device = queue->device;
  double t0 = now_ms();
  kiln_status_t status = row->entry->run(device->ctx, queue->impl, row->entry, op);
  if (status == KILN_OK) status = device->iface->queue_finish(device->ctx, queue->impl);
  *out_ms = now_ms() - t0;
  return status;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define MEASURE_MAX_CANDIDATES 8
#define MEASURE_MIN_ROUNDS 5
#define MEASURE_MAX_ROUNDS 21
#define MEASURE_BUDGET_MS 250.0 /* rounds stop once this is spent (after the minimum) */
#define MEASURE_NOISE 0.05      /* medians closer than 5%: within noise, the policy's default stays */

/* Measure every candidate: one warm-up run each, then rounds in which each
 * runs once, in turn (so that a slow moment of a shared machine falls on all
 * of them), timed on the host clock around run + finish (a vendor's events
 * may not cover the helper kernels it launches). At least five rounds, more
 * while the budget lasts and the two best medians are not clearly apart. The
 * winner has the lowest median; when it beats `fallback` (the vendor policy's
 * choice) by less than the noise margin, `fallback` stays. The op's output is
 * rewritten by each run, which is harmless: inputs never alias it. */
static kiln_status_t measure(kiln_queue_t *queue, const kiln_op_t *op, kiln__op_row_t *const *rows, int count,
                             int fallback, const char *key, int *out_winner, char *reason, size_t reason_size) {
  kiln_device_t *device = queue->device;
  /* Earlier work must not be counted against the first candidate. */
  kiln_status_t status = device->iface->queue_finish(device->ctx, queue->impl);
  if (status != KILN_OK) return status;
  double samples[MEASURE_MAX_CANDIDATES][MEASURE_MAX_ROUNDS];
  bool alive[MEASURE_MAX_CANDIDATES];
  double spent = 0;
  for (int c = 0; c < count; c++) {
    double ms = 0;
    alive[c] = time_run(queue, rows[c], op, &ms) == KILN_OK;
    spent += ms;
    if (!alive[c]) {
      /* A candidate that cannot run this op simply drops out. */
      kiln__log(KILN_LOG_DEBUG, "fastest %s: %s dropped out: %s", key, rows[c]->entry->provider, kiln_last_error());
      kiln_clear_error();
    }
  }
  double medians[MEASURE_MAX_CANDIDATES] = {0};
  int rounds = 0;
  while (rounds < MEASURE_MAX_ROUNDS) {
    for (int i = 0; i < count; i++) {
      int c = (i + rounds) % count;
      if (!alive[c]) continue;
      double ms = 0;
      if (time_run(queue, rows[c], op, &ms) != KILN_OK) {
        kiln__log(KILN_LOG_DEBUG, "fastest %s: %s failed in round %d: %s", key, rows[c]->entry->provider, rounds,
                  kiln_last_error());
        kiln_clear_error();
        alive[c] = false;
        continue;
      }
      samples[c][rounds] = ms;
      spent += ms;
    }
    rounds++;
    if (rounds < MEASURE_MIN_ROUNDS) continue;
    /* The best two medians: stop when they are clearly apart or time is up. */
    double best = INFINITY, second = INFINITY;
    for (int c = 0; c < count; c++) {
      if (!alive[c]) continue;
      double sorted[MEASURE_MAX_ROUNDS];
      memcpy(sorted, samples[c], sizeof(double) * (size_t)rounds);
      qsort(sorted, (size_t)rounds, sizeof sorted[0], compare_doubles);
      medians[c] = rounds % 2 ? sorted[rounds / 2] : (sorted[rounds / 2 - 1] + sorted[rounds / 2]) / 2;
      if (medians[c] < best) {
        second = best;
        best = medians[c];
      } else if (medians[c] < second) {
        second = medians[c];
      }
    }
    if (spent >= MEASURE_BUDGET_MS || !(second < INFINITY) || second > best * (1 + 2 * MEASURE_NOISE)) break;
  }
  int winner = -1;
  for (int c = 0; c < count; c++)
    if (alive[c] && (winner < 0 || medians[c] < medians[winner])) winner = c;
  size_t used = 0;
  reason[0] = '\0';
  for (int c = 0; c < count && used < reason_size; c++) {
    int w = alive[c] ? snprintf(reason + used, reason_size - used, "%s%s %.4g ms", used ? ", " : "",
                                rows[c]->entry->provider, medians[c])
                     : snprintf(reason + used, reason_size - used, "%s%s failed", used ? ", " : "",
                                rows[c]->entry->provider);
    if (w < 0) break;
    used += (size_t)w;
  }
  const char *verdict;
  char why[96];
  if (winner < 0) {
    winner = 0; /* native: nothing ran; the op itself will say why */
    verdict = "no candidate ran";
  } else if (fallback >= 0 && fallback != winner && alive[fallback] &&
             medians[fallback] <= medians[winner] * (1 + MEASURE_NOISE)) {
    snprintf(why, sizeof why, "within %.0f%% of %s: kept the default", MEASURE_NOISE * 100,
             rows[winner]->entry->provider);
    winner = fallback;
    verdict = why;
  } else {
    double runner = INFINITY;
    for (int c = 0; c < count; c++)
      if (alive[c] && c != winner && medians[c] < runner) runner = medians[c];
    if (runner < INFINITY)
      snprintf(why, sizeof why, "faster by %.0f%%", (runner / medians[winner] - 1) * 100);
    else
      snprintf(why, sizeof why, "the only candidate that ran");
    verdict = why;
  }
  if (used < reason_size)
    snprintf(reason + used, reason_size - used, "; medians of %d rounds; %s %s", rounds, rows[winner]->entry->provider,
             verdict);
  kiln__log(KILN_LOG_INFO, "fastest %s -> %s (%s)", key, rows[winner]->entry->provider, reason);
  *out_winner = winner;
  return KILN_OK;
}

/* ---- choosing the row -------------------------------------------------------------- */

static bool row_serves(kiln_device_t *device, kiln__op_row_t *row, const kiln_op_t *op) {
  if (atomic_load_explicit(&row->disabled, memory_order_relaxed)) return false;
  const kiln_op_entry_t *e = row->entry;
  return !e->supports || e->supports(device->ctx, device->impl, e, op);
}

/* The first vendor row that serves the op, or the native row (index 0). */
static int vendor_choice(kiln_device_t *device, kiln__op_row_t *rows, uint32_t count, const kiln_op_t *op) {
  for (uint32_t i = 1; i < count; i++)
    if (row_serves(device, &rows[i], op)) return (int)i;
  return 0;
}

/* device->override_warned holds one bit per op kind. */
_Static_assert(KILN_OP_COUNT <= 32, "kiln_device_t.override_warned has one bit per op kind: widen it to 64 bits");

/* KILN_PROVIDER names a provider this device does not have for the op: say so
 * once per device and op kind, then let the policy choose. */
static void warn_missing_override(kiln_device_t *device, kiln_op_kind_t kind, int provider, kiln_policy_t policy) {
  uint32_t bit = 1u << kind;
  if (atomic_fetch_or_explicit(&device->override_warned, bit, memory_order_relaxed) & bit) return;
  kiln__log(KILN_LOG_WARN,
            "KILN_PROVIDER asks for provider '%s' for %s, but %s has no such provider for it (it has: %s); the "
            "policy chooses instead (%s)",
            kiln__provider_name(provider), kiln__op_kind_name(kind), device->display_name,
            device->providers_text[kind], kiln_policy_name(policy));
}

static kiln_status_t choose(kiln_queue_t *queue, kiln_op_t *op, int *out_row, const char **out_why) {
  kiln_device_t *device = queue->device;
  kiln__op_row_t *rows = device->rows[op->kind];
  const uint32_t count = device->row_count[op->kind];
  if (count == 0)
    return kiln__set_error(KILN_UNSUPPORTED, "%s is not supported on %s: its backend (%s) has no kernel for it",
                           kiln__op_kind_name(op->kind), device->display_name, device->iface->name);
  kiln_policy_t policy = (kiln_policy_t)atomic_load_explicit(&kiln__rt.policy, memory_order_relaxed);
  int override = atomic_load_explicit(&kiln__rt.overrides[op->kind], memory_order_relaxed);
  *out_why = NULL;
  *out_row = 0;
  if (override != KILN_PROVIDER_NONE) {
    for (uint32_t i = 0; i < count; i++) {
      if (rows[i].provider != override) continue;
      /* A forced vendor row that cannot take these arguments: native runs. */
      *out_row = row_serves(device, &rows[i], op) ? (int)i : 0;
      *out_why = "override";
      return KILN_OK;
    }
    warn_missing_override(device, op->kind, override, policy);
  }
  if (count == 1 || policy == KILN_POLICY_PORTABLE) return KILN_OK;
  if (policy == KILN_POLICY_VENDOR) {
    *out_row = vendor_choice(device, rows, count, op);
    return KILN_OK;
  }

  /* fastest */
  kiln__op_row_t *candidates[MEASURE_MAX_CANDIDATES];
  int index[MEASURE_MAX_CANDIDATES];
  int n = 0, fallback = -1;
  const int vendor = vendor_choice(device, rows, count, op);
  for (uint32_t i = 0; i < count && n < MEASURE_MAX_CANDIDATES; i++) {
    if (!row_serves(device, &rows[i], op)) continue;
    if ((int)i == vendor) fallback = n;
    index[n] = (int)i;
    candidates[n++] = &rows[i];
  }
  if (n <= 1) {
    *out_row = n ? index[0] : 0;
    return KILN_OK;
  }
  char signature[160], key[768], name[64];
  op_signature(op, true, signature, sizeof signature);
  snprintf(key, sizeof key, "%s|%s|%s|%s|%s|%s", device->iface->name, device->desc.name,
           device->desc.uuid[0] ? device->desc.uuid : device->desc.driver_version, kiln__op_kind_name(op->kind),
           kiln_dtype_name(op_dtype(op)), signature);
  *out_why = "measured";
  if (kiln__tuning_lookup(key, name, sizeof name) == KILN_OK) {
    for (int c = 0; c < n; c++) {
      if (!strcmp(candidates[c]->entry->provider, name)) {
        *out_row = index[c];
        return KILN_OK;
      }
    }
    /* The remembered winner is not a candidate now: measure again. */
  }
  char reason[512];
  int winner = 0;
  kiln_status_t status = measure(queue, op, candidates, n, fallback, key, &winner, reason, sizeof reason);
  if (status != KILN_OK) return kiln__wrap_error(status, "measuring %s for policy fastest", key);
  kiln__tuning_store(key, candidates[winner]->entry->provider, reason);
  *out_row = index[winner];
  return KILN_OK;
}

/* Run the chosen row; a vendor row that declines hands over to native, and
 * one whose library cannot work on this device is offered no more. */
static kiln_status_t run_row(kiln_queue_t *queue, kiln_op_t *op, int row, const char **out_provider,
                             const char **why) {
  kiln_device_t *device = queue->device;
  kiln__op_row_t *rows = device->rows[op->kind];
  kiln_status_t status = rows[row].entry->run(device->ctx, queue->impl, rows[row].entry, op);
  if (row != 0 && (status == KILN_UNSUPPORTED || status == KILN_UNAVAILABLE)) {
    if (status == KILN_UNAVAILABLE) {
      atomic_store_explicit(&rows[row].disabled, true, memory_order_relaxed);
      kiln__log(KILN_LOG_WARN, "%s: provider %s cannot work on %s and is no longer used there: %s",
                kiln__op_kind_name(op->kind), rows[row].entry->provider, device->display_name, kiln_last_error());
    } else {
      kiln__log(KILN_LOG_DEBUG, "%s: %s declined (%s); running native", kiln__op_kind_name(op->kind),
                rows[row].entry->provider, kiln_last_error());
    }
    kiln_clear_error();
    row = 0;
    *why = "fallback";
    status = rows[0].entry->run(device->ctx, queue->impl, rows[0].entry, op);
  }
  if (status != KILN_OK)
    return kiln__wrap_error(status, "running %s (%s) with provider %s on %s", kiln__op_kind_name(op->kind),
                            kiln_dtype_name(op_dtype(op)), rows[row].entry->provider, device->display_name);
  *out_provider = rows[row].entry->provider;
  if (rows[row].provider >= 0 && rows[row].provider < KILN__MAX_PROVIDERS) {
    provider_calls[op_name_index(op)][rows[row].provider]++;
    provider_calls_any = true;
  }
  return KILN_OK;
}

/* ---- the one path ------------------------------------------------------------------ */

/* Complete the op for its output view, choose and run the row, tag the
 * buffers. `out` is the tensor behind op->out. */
static kiln_status_t op_run(kiln_queue_t *queue, kiln_op_t *op, kiln_tensor_t *out, const kiln_tensor_t *const *inputs) {
  kiln_device_t *device = queue->device;
  const int64_t trace_t0 = KILN__TRACE_ON() ? kiln__trace_now() : 0;
  kiln__tensor_view(out, &op->out);
  op->flat = false;
  if (kiln_backend_op_is_elementwise(op->kind)) merge_dims(op);
  int row = 0;
  const char *why = NULL, *provider = NULL;
  kiln_status_t status = choose(queue, op, &row, &why);
  if (status == KILN_OK) status = run_row(queue, op, row, &provider, &why);
  if (status != KILN_OK) return status;
  if (trace_t0) {
    kiln_policy_t policy = (kiln_policy_t)atomic_load_explicit(&kiln__rt.policy, memory_order_relaxed);
    kiln__trace_op(queue, op, kiln_op_name(op_name_index(op)), out, inputs, provider,
                   why ? why : kiln_policy_name(policy), trace_t0);
  }
  last_provider = provider;
  kiln__queue_count_op(queue);
  kiln__buffer_touch(out->buffer, queue);
  for (int i = 0; i < op->n_in; i++)
    if (inputs && inputs[i]) kiln__buffer_touch(inputs[i]->buffer, queue);
  if (kiln__log_enabled(KILN_LOG_DEBUG)) {
    char signature[160];
    op_signature(op, false, signature, sizeof signature);
    kiln_policy_t policy = (kiln_policy_t)atomic_load_explicit(&kiln__rt.policy, memory_order_relaxed);
    kiln__log(KILN_LOG_DEBUG, "%s %s [%s] on %s -> %s (%s%s)", kiln__op_kind_name(op->kind),
              kiln_dtype_name(op_dtype(op)), signature, device->selector, provider, why ? why : "policy ",
              why ? "" : kiln_policy_name(policy));
  }
  return KILN_OK;
}

/* A device gets no op with an operand or result of a dtype it has no
 * kernels for (its backend's dtype_support; by default f32 and i32 only). */
static kiln_status_t device_serves(const char *call, kiln_device_t *device, const kiln_op_t *op, kiln_dtype_t dtype,
                                   const kiln_tensor_t *const *inputs) {
  /* Bits of device->dtypes_served, asked of the backend once at attach
   * (kiln_dtype_t values below 32). */
  kiln_dtype_t bad = dtype;
  _Static_assert(KILN_DTYPE_COUNT_ <= 32, "kiln_device_t.dtypes_served holds a bit per dtype");
  bool ok = (unsigned)dtype < KILN_DTYPE_COUNT_ && (device->dtypes_served >> (unsigned)dtype & 1u) != 0;
  /* Without inputs (creation, empty results) op's inputs are not read. */
  for (int i = 0; ok && inputs && i < op->n_in; i++) {
    bad = op->in[i].dtype;
    ok = (unsigned)bad < KILN_DTYPE_COUNT_ && (device->dtypes_served >> (unsigned)bad & 1u) != 0;
  }
  if (ok) return KILN_OK;
  const char *why = device->iface->dtype_unsupported_why && (unsigned)bad < KILN_DTYPE_COUNT_
                        ? device->iface->dtype_unsupported_why(device->ctx, device->impl, bad)
                        : NULL;
  if (why && *why)
    return kiln__set_error(KILN_UNSUPPORTED,
                           "%s: %s cannot compute %s (%s of %s): %s; only storage of %s works there (create, read, "
                           "copy between devices): compute on cpu:0 (kiln_tensor_to) or on a device that serves %s; "
                           "devinfo shows what each device serves",
                           call, device->display_name, kiln_dtype_name(bad), kiln__op_kind_name(op->kind),
                           kiln_dtype_name(bad), why, kiln_dtype_name(bad), kiln_dtype_name(bad));
  return kiln__set_error(KILN_UNSUPPORTED,
                         "%s: %s has no kernels for %s yet (%s of %s); only storage of %s works there (create, read, "
                         "copy between devices): compute on cpu:0 (kiln_tensor_to) or cast to f32 or i32 where the "
                         "data is; devinfo shows what each device serves",
                         call, device->display_name, kiln_dtype_name(bad), kiln__op_kind_name(op->kind),
                         kiln_dtype_name(bad), kiln_dtype_name(bad));
}

kiln_status_t kiln__op_enqueue(const char *call, kiln_device_t *device, kiln_op_t *op, kiln_dtype_t dtype, int ndim,
                               const int64_t *shape, const kiln_tensor_t *const *inputs, kiln_tensor_t **out) {
  kiln_status_t status = device_serves(call, device, op, dtype, inputs);
  if (status != KILN_OK) return status;
  kiln_queue_t *queue = kiln_device_current_queue(device);
  kiln_tensor_t *t = NULL;
  status = kiln__tensor_alloc(device, queue, dtype, ndim, shape, &t);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s", call);
  if (kiln_tensor_numel(t) > 0) {
    status = op_run(queue, op, t, inputs);
    if (status != KILN_OK) {
      kiln_tensor_release(t);
      return kiln__wrap_error(status, "%s", call);
    }
  }
  *out = t;
  return KILN_OK;
}

kiln_status_t kiln__op_enqueue_into(const char *call, kiln_op_t *op, kiln_tensor_t *target,
                                    const kiln_tensor_t *const *inputs) {
  kiln_status_t status = kiln__buffer_check_writable(call, "the tensor written", target->buffer);
  if (status != KILN_OK) return status;
  if (kiln_tensor_numel(target) == 0) return KILN_OK;
  kiln_queue_t *queue = kiln_device_current_queue(target->buffer->device);
  status = op_run(queue, op, target, inputs);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s", call);
}
