/* runtime/config.c: every KILN_* setting, merged from the API and the environment and validated in one place. */
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "runtime/internal.h"

#define KILN_BACKEND_GRAMMAR \
  "use backend names ([a-z0-9_]+) joined by ',' in priority order, each once, e.g. \"opencl,cpu\""
#define KILN_PROVIDER_GRAMMAR                                                                \
  "use op=provider pairs joined by ',', e.g. \"matmul=blas,conv2d=native\"; providers: native, " \
  "blas, clblast, cublas, cudnn"

/* ---- names ------------------------------------------------------------------- */

static const char *const op_kind_names[KILN_OP_COUNT] = {
#define KILN_OP_KIND_NAME_(NAME, name, launch) #name,
    KILN_OP_KINDS(KILN_OP_KIND_NAME_)
#undef KILN_OP_KIND_NAME_
};

/* The op names KILN_PROVIDER accepts: the kinds, then every unary and binary
 * op, which share their kind's kernels and therefore its provider. */
static const struct {
  const char *name;
  kiln_op_kind_t kind;
} op_names[] = {
#define KILN_OP_KIND_ENTRY_(NAME, name, launch) {#name, KILN_OP_##NAME},
    KILN_OP_KINDS(KILN_OP_KIND_ENTRY_)
#undef KILN_OP_KIND_ENTRY_
#define KILN_UNARY_ENTRY_(NAME, name) {#name, KILN_OP_UNARY},
    KILN_UNARY_OPS(KILN_UNARY_ENTRY_)
#undef KILN_UNARY_ENTRY_
#define KILN_BINARY_ENTRY_(NAME, name) {#name, KILN_OP_BINARY},
    KILN_BINARY_OPS(KILN_BINARY_ENTRY_)
#undef KILN_BINARY_ENTRY_
};

const char *kiln_op_name(size_t index) {
  return index < sizeof op_names / sizeof op_names[0] ? op_names[index].name : NULL;
}

const char *kiln__op_kind_name(kiln_op_kind_t kind) {
  if ((int)kind < 0 || kind >= KILN_OP_COUNT) return "unknown";
  return op_kind_names[kind];
}

/* The kind an op name of KILN_PROVIDER stands for, or -1. device.c uses it for
 * kiln_device_providers so that both accept the same names. */
int kiln__op_kind_lookup(const char *name) {
  for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
    if (!strcmp(op_names[i].name, name)) return (int)op_names[i].kind;
  return -1;
}

/* "fill, arange, ..., add, ..." for messages. */
static void op_name_list(char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < sizeof op_names / sizeof op_names[0] && used < size; i++) {
    int n = snprintf(out + used, size - used, "%s%s", i ? ", " : "", op_names[i].name);
    if (n < 0) break;
    used += (size_t)n;
  }
}

/* ---- KILN_PROVIDER ------------------------------------------------------------- */

kiln_status_t kiln__parse_providers(const char *text, int out_overrides[KILN_OP_COUNT]) {
  if (!text)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "provider overrides are NULL; %s, or \"\" to clear them",
                           KILN_PROVIDER_GRAMMAR);
  int overrides[KILN_OP_COUNT];
  const char *set_by[KILN_OP_COUNT];
  for (int k = 0; k < KILN_OP_COUNT; k++) {
    overrides[k] = KILN_PROVIDER_NONE;
    set_by[k] = NULL;
  }
  char *copy = strdup(text);
  if (!copy) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory copying provider overrides");
  kiln_status_t status = KILN_OK;
  /* "" clears every override; otherwise every item must be a pair. */
  if (copy[0]) {
    char *cursor = copy;
    for (;;) {
      char *comma = strchr(cursor, ',');
      if (comma) *comma = '\0';
      char *item = cursor;
      if (!item[0]) {
        status = kiln__set_error(KILN_INVALID_ARGUMENT, "empty item in \"%s\"; %s", text,
                                 KILN_PROVIDER_GRAMMAR);
        break;
      }
      char *eq = strchr(item, '=');
      if (!eq) {
        status = kiln__set_error(KILN_INVALID_ARGUMENT, "\"%s\" has no '='; %s", item,
                                 KILN_PROVIDER_GRAMMAR);
        break;
      }
      *eq = '\0';
      const char *op = item, *provider = eq + 1;
      int kind = kiln__op_kind_lookup(op);
      if (kind < 0) {
        char ops[512];
        op_name_list(ops, sizeof ops);
        status = kiln__set_error(KILN_INVALID_ARGUMENT, "unknown op \"%s\" in \"%s=%s\"; ops: %s", op,
                                 op, provider, ops);
        break;
      }
      int chosen = kiln__provider_find(provider);
      if (chosen == KILN_PROVIDER_NONE) {
        char known[512];
        kiln__provider_list(known, sizeof known);
        status = kiln__set_error(KILN_INVALID_ARGUMENT, "unknown provider \"%s\" in \"%s=%s\"; use one of: %s",
                                 provider, op, provider, known);
        break;
      }
      /* add and mul share the binary kernels: asking two providers for them
       * cannot be honoured, so say so instead of picking one. */
      if (overrides[kind] != KILN_PROVIDER_NONE && overrides[kind] != chosen) {
        status = kiln__set_error(KILN_INVALID_ARGUMENT,
                                 "\"%s\" and \"%s\" both set the provider of %s ops (%s, then %s); give "
                                 "it once",
                                 set_by[kind], op, op_kind_names[kind],
                                 kiln__provider_name(overrides[kind]), provider);
        break;
      }
      overrides[kind] = chosen;
      set_by[kind] = op;
      if (!comma) break;
      cursor = comma + 1;
    }
  }
  if (status == KILN_OK) memcpy(out_overrides, overrides, sizeof overrides);
  free(copy);
  return status;
}

/* ---- helpers ------------------------------------------------------------------- */

/* The API value when set, else the variable when set and not empty, else NULL.
 * *out_source names where it came from, for messages. */
static const char *setting_of(const char *api_value, const char *api_field, const char *variable,
                                const char **out_source) {
  /* An empty string counts as unset, in the API as in the environment. */
  if (api_value && api_value[0]) {
    *out_source = api_field;
    return api_value;
  }
  const char *env = getenv(variable);
  *out_source = variable;
  return env && env[0] ? env : NULL;
}

static bool is_name(const char *s, size_t len) {
  if (len == 0) return false;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

static kiln_status_t parse_backends(const char *source, const char *text, kiln__config_t *out) {
  out->backend_count = 0;
  const char *cursor = text;
  for (;;) {
    const char *comma = strchr(cursor, ',');
    size_t len = comma ? (size_t)(comma - cursor) : strlen(cursor);
    if (len == 0)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s=\"%s\" has an empty backend name; %s", source,
                             text, KILN_BACKEND_GRAMMAR);
    if (!is_name(cursor, len) || len >= sizeof out->backends[0])
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s=\"%s\": \"%.*s\" is not a backend name; %s",
                             source, text, (int)len, cursor, KILN_BACKEND_GRAMMAR);
    for (size_t i = 0; i < out->backend_count; i++)
      if (strlen(out->backends[i]) == len && !strncmp(out->backends[i], cursor, len))
        return kiln__set_error(KILN_INVALID_ARGUMENT, "%s=\"%s\" names \"%.*s\" twice; %s", source,
                               text, (int)len, cursor, KILN_BACKEND_GRAMMAR);
    if (out->backend_count == KILN_MAX_BACKENDS)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "%s=\"%s\" names more than %d backends; %s", source,
                             text, KILN_MAX_BACKENDS, KILN_BACKEND_GRAMMAR);
    memcpy(out->backends[out->backend_count], cursor, len);
    out->backends[out->backend_count][len] = '\0';
    out->backend_count++;
    if (!comma) return KILN_OK;
    cursor = comma + 1;
  }
}

static char *join_path(const char *base, const char *tail) {
  size_t n = strlen(base) + strlen(tail) + 2;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%s/%s", base, tail);
  return out;
}

static kiln_status_t oom(const char *what) {
  return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory copying %s", what);
}

/* ---- one parser per setting ------------------------------------------------------- */

/* Each parser gets the setting's value (the API's when set, else the
 * variable's; NULL when neither) and where it came from, for messages. */
typedef kiln_status_t (*setting_parse_fn)(const kiln_config_t *api, const char *source, const char *value,
                                          kiln__config_t *c);

static kiln_status_t parse_backend(const kiln_config_t *api, const char *source, const char *value,
                                   kiln__config_t *c) {
  c->backends_explicit = value != NULL;
  return parse_backends(source, value ? value : kiln_backend_default_order, c);
}

/* KILN_DEVICE: validated now, matched against devices by the registry. A term
 * may name the backends kiln would load by default and those of KILN_BACKEND
 * (parsed before it); any other name is a typo that would select nothing. */
static kiln_status_t parse_device(const kiln_config_t *api, const char *source, const char *value,
                                  kiln__config_t *c) {
  if (!value) return KILN_OK;
  char known[KILN_MAX_BACKENDS * 33 + 64];
  snprintf(known, sizeof known, "%s", kiln_backend_default_order);
  for (size_t i = 0; i < c->backend_count; i++) {
    char padded[40], haystack[sizeof known + 2];
    snprintf(padded, sizeof padded, ",%s,", c->backends[i]);
    snprintf(haystack, sizeof haystack, ",%s,", known);
    size_t used = strlen(known);
    if (!strstr(haystack, padded)) snprintf(known + used, sizeof known - used, ",%s", c->backends[i]);
  }
  kiln__selector_t selector;
  kiln_status_t status = kiln__selector_parse_known(value, known, &selector);
  if (status != KILN_OK) return kiln__wrap_error(status, "%s=\"%s\" is not a device selector", source, value);
  c->device_selector = strdup(value);
  return c->device_selector ? KILN_OK : oom("KILN_DEVICE");
}

static kiln_status_t parse_policy(const kiln_config_t *api, const char *source, const char *value,
                                  kiln__config_t *c) {
  if (!value) return KILN_OK;
  for (int p = KILN_POLICY_VENDOR; p <= KILN_POLICY_FASTEST; p++) {
    if (!strcmp(value, kiln_policy_name((kiln_policy_t)p))) {
      c->policy = (kiln_policy_t)p;
      return KILN_OK;
    }
  }
  return kiln__set_error(KILN_INVALID_ARGUMENT, "%s=\"%s\" is not a policy; use one of: vendor, portable, fastest",
                         source, value);
}

static kiln_status_t parse_provider(const kiln_config_t *api, const char *source, const char *value,
                                    kiln__config_t *c) {
  if (!value) return KILN_OK;
  kiln_status_t status = kiln__parse_providers(value, c->overrides);
  return status == KILN_OK ? KILN_OK : kiln__wrap_error(status, "%s=\"%s\"", source, value);
}

/* KILN_CACHE_DIR, else the XDG cache, else ~/.cache; no home means no cache. */
static kiln_status_t parse_cache_dir(const kiln_config_t *api, const char *source, const char *value,
                                     kiln__config_t *c) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  if (value) c->cache_dir = strdup(value);
  else if (xdg && xdg[0]) c->cache_dir = join_path(xdg, "kiln");
  else if (home && home[0]) c->cache_dir = join_path(home, ".cache/kiln");
  bool wanted = value || (xdg && xdg[0]) || (home && home[0]);
  return wanted && !c->cache_dir ? oom("the cache directory") : KILN_OK;
}

/* The API's int when set (>= 0), else the variable's text. */
static kiln_status_t parse_cpu_devices(const kiln_config_t *api, const char *source, const char *value,
                                       kiln__config_t *c) {
  if (api->cpu_devices >= 0) {
    if (api->cpu_devices < 1 || api->cpu_devices > KILN_MAX_CPU_DEVICES)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "kiln_config_t.cpu_devices=%d is out of range; use an integer from 1 to %d "
                             "(or -1 for the environment's value)",
                             api->cpu_devices, KILN_MAX_CPU_DEVICES);
    c->cpu_devices = api->cpu_devices;
  } else if (value) {
    char *end = NULL;
    errno = 0;
    long n = strtol(value, &end, 10);
    bool digits = value[0] >= '0' && value[0] <= '9';
    if (!digits || errno || *end || n < 1 || n > KILN_MAX_CPU_DEVICES)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "KILN_CPU_DEVICES=\"%s\" is not a device count; use an integer from 1 to %d", value,
                             KILN_MAX_CPU_DEVICES);
    c->cpu_devices = (int)n;
  }
  snprintf(c->cpu_devices_text, sizeof c->cpu_devices_text, "%d", c->cpu_devices);
  return KILN_OK;
}

/* KILN_BACKEND_PATH: directories, checked when plugins are searched. */
static kiln_status_t parse_backend_path(const kiln_config_t *api, const char *source, const char *value,
                                        kiln__config_t *c) {
  if (!value) return KILN_OK;
  c->backend_path = strdup(value);
  return c->backend_path ? KILN_OK : oom("KILN_BACKEND_PATH");
}

static kiln_status_t parse_log(const kiln_config_t *api, const char *source, const char *value, kiln__config_t *c) {
  if (!value) return KILN_OK;
  static const char *const levels[] = {"off", "error", "warn", "info", "debug"};
  /* KILN_LOG=DEBUG means what it says: levels are taken in any case. */
  for (int i = 0; i < 5; i++) {
    if (!strcasecmp(levels[i], value)) {
      c->log_level = (kiln_log_level_t)i;
      c->log_level_set = true;
      return KILN_OK;
    }
  }
  return kiln__set_error(KILN_INVALID_ARGUMENT, "%s=\"%s\" is not a log level; use one of: off, error, warn, info, debug",
                         source, value);
}

static kiln_status_t parse_trace(const kiln_config_t *api, const char *source, const char *value, kiln__config_t *c) {
  if (!value) return KILN_OK;
  c->trace_path = strdup(value);
  return c->trace_path ? KILN_OK : oom("KILN_TRACE");
}

/* Default: a 1-epoch LeNet run fits, and its JSON stays well under 100 MB
 * (about 700 bytes of JSON and 200 bytes of ring per op). */
#define KILN_TRACE_EVENTS_DEFAULT 100000
#define KILN_TRACE_EVENTS_MAX 100000000

static kiln_status_t parse_trace_events(const kiln_config_t *api, const char *source, const char *value,
                                        kiln__config_t *c) {
  c->trace_events = KILN_TRACE_EVENTS_DEFAULT;
  if (!value) return KILN_OK;
  char *end = NULL;
  errno = 0;
  long long n = strtoll(value, &end, 10);
  if (errno || end == value || *end || n < 16 || n > KILN_TRACE_EVENTS_MAX)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s=\"%s\" is not an event count; use an integer from 16 to %d (default %d)", source,
                           value, KILN_TRACE_EVENTS_MAX, KILN_TRACE_EVENTS_DEFAULT);
  c->trace_events = (size_t)n;
  return KILN_OK;
}

/* Every setting of kiln_config_t, in the order they are parsed (KILN_DEVICE
 * reads the backends KILN_BACKEND named). A new setting is one row here, one
 * parser above, and its field in kiln__config_t. */
#define NO_API_STRING SIZE_MAX
static const struct {
  const char *variable;
  const char *api_field;
  size_t api_offset; /* offsetof the const char * field in kiln_config_t, or NO_API_STRING */
  setting_parse_fn parse;
} settings[] = {
    {"KILN_BACKEND", "kiln_config_t.backend", offsetof(kiln_config_t, backend), parse_backend},
    {"KILN_DEVICE", "kiln_config_t.device", offsetof(kiln_config_t, device), parse_device},
    {"KILN_POLICY", "kiln_config_t.policy", offsetof(kiln_config_t, policy), parse_policy},
    {"KILN_PROVIDER", "kiln_config_t.provider", offsetof(kiln_config_t, provider), parse_provider},
    {"KILN_CACHE_DIR", "kiln_config_t.cache_dir", offsetof(kiln_config_t, cache_dir), parse_cache_dir},
    {"KILN_CPU_DEVICES", "kiln_config_t.cpu_devices", NO_API_STRING, parse_cpu_devices},
    {"KILN_BACKEND_PATH", "kiln_config_t.backend_path", offsetof(kiln_config_t, backend_path), parse_backend_path},
    {"KILN_LOG", "kiln_config_t.log", offsetof(kiln_config_t, log), parse_log},
    {"KILN_TRACE", "KILN_TRACE", NO_API_STRING, parse_trace},
    {"KILN_TRACE_EVENTS", "KILN_TRACE_EVENTS", NO_API_STRING, parse_trace_events},
};

/* ---- kiln__config_load ------------------------------------------------------------ */

kiln_status_t kiln__config_load(const kiln_config_t *api, kiln__config_t *out) {
  if (!out) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__config_load: out is NULL");
  kiln_config_t none;
  kiln_config_initialize(&none);
  if (!api) api = &none;

  kiln__config_t c;
  memset(&c, 0, sizeof c);
  c.policy = KILN_POLICY_VENDOR;
  c.log_level = KILN_LOG_OFF;
  c.cpu_devices = 1;
  for (int k = 0; k < KILN_OP_COUNT; k++) c.overrides[k] = KILN_PROVIDER_NONE;

  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    const char *api_value = NULL, *source = settings[i].variable;
    if (settings[i].api_offset != NO_API_STRING)
      memcpy(&api_value, (const char *)api + settings[i].api_offset, sizeof api_value);
    const char *value = setting_of(api_value, settings[i].api_field, settings[i].variable, &source);
    kiln_status_t status = settings[i].parse(api, source, value, &c);
    if (status != KILN_OK) {
      kiln__config_free(&c);
      return status;
    }
  }
  *out = c;
  return KILN_OK;
}

/* ---- unknown KILN_* variables ------------------------------------------------------ */

/* Every KILN_* variable that kiln's library, plugins and programs read, for
 * users to set (and the names a misspelling is matched against). A new one is
 * added here, or a user who sets it is warned that kiln ignores it:
 * `tests/test_scripts.sh variables` (run by test.sh) finds every
 * getenv("KILN_...") in the tree and fails on one missing here. */
static const char *const known_variables[] = {
    "KILN_BACKEND", "KILN_DEVICE", "KILN_POLICY", "KILN_PROVIDER", "KILN_CACHE_DIR", "KILN_CPU_DEVICES",
    "KILN_BACKEND_PATH", "KILN_LOG", "KILN_TRACE", "KILN_TRACE_EVENTS", "KILN_OPENCL_BUILD_OPTIONS", "KILN_OPENCL_NO_FP64", "KILN_CUDA_TF32", "KILN_CUDA_VENDOR_LIBS",
    "KILN_DATA_DIR", "KILN_COMM_TIMEOUT", "KILN_COMM_ENGINE", "KILN_BENCH_PYTHON", "KILN_BENCH_SCRIPTS", "KILN_BENCH_TRAIN_EPOCHS",
    "KILN_PYTHON_EXTENSION_DIR",
};
/* What kiln's own tests, benchmark and scripts pass to themselves: never
 * reported. Whole families, so that a new test variable needs no entry. */
static const char *const internal_prefixes[] = {
    "KILN_TEST_", "KILN_FAKE_", "KILN_FAKECUDA_", "KILN_GRAD_", "KILN_CONFORMANCE_", "KILN_NN_TEST_", "KILN_BENCH_CORETYPE_",
};
static const char *const internal_variables[] = {"KILN_WERROR", "KILN_ROOT"};

/* Levenshtein distance, for "did you mean"; names are short. */
static size_t edit_distance(const char *a, size_t la, const char *b) {
  size_t lb = strlen(b);
  size_t row[64];
  if (la >= 63 || lb >= 63) return SIZE_MAX;
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diagonal + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diagonal = up;
    }
  }
  return row[lb];
}

void kiln__config_warn_unknown(void) {
  if (!kiln__log_enabled(KILN_LOG_WARN)) return;
  for (char **entry = environ; entry && *entry; entry++) {
    const char *text = *entry;
    if (strncmp(text, "KILN_", 5)) continue;
    const char *eq = strchr(text, '=');
    size_t len = eq ? (size_t)(eq - text) : strlen(text);
    bool known = false;
    for (size_t i = 0; i < sizeof known_variables / sizeof known_variables[0] && !known; i++)
      known = strlen(known_variables[i]) == len && !strncmp(known_variables[i], text, len);
    for (size_t i = 0; i < sizeof internal_variables / sizeof internal_variables[0] && !known; i++)
      known = strlen(internal_variables[i]) == len && !strncmp(internal_variables[i], text, len);
    for (size_t i = 0; i < sizeof internal_prefixes / sizeof internal_prefixes[0] && !known; i++) {
      size_t n = strlen(internal_prefixes[i]);
      known = n < len && !strncmp(internal_prefixes[i], text, n);
    }
    if (known) continue;
    const char *closest = NULL;
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < sizeof known_variables / sizeof known_variables[0]; i++) {
      size_t d = edit_distance(text, len, known_variables[i]);
      if (d < best) {
        best = d;
        closest = known_variables[i];
      }
    }
    /* Beyond a slip or two of the part after KILN_, the closest name is a
     * guess, not a fix. */
    if (closest && best <= 1 + (len - 5) / 4) {
      kiln__log(KILN_LOG_WARN, "%.*s is set, but kiln reads no variable of that name; did you mean %s? "
                "(docs/environment.md lists them)", (int)len, text, closest);
    } else {
      kiln__log(KILN_LOG_WARN, "%.*s is set, but kiln reads no variable of that name; it reads KILN_BACKEND, "
                "KILN_DEVICE, KILN_POLICY, KILN_PROVIDER, KILN_CACHE_DIR, KILN_CPU_DEVICES, KILN_BACKEND_PATH, "
                "KILN_LOG and a few more (docs/environment.md lists them)", (int)len, text);
    }
  }
}

void kiln__config_free(kiln__config_t *config) {
  if (!config) return;
  free(config->device_selector);
  free(config->cache_dir);
  free(config->backend_path);
  free(config->trace_path);
  config->trace_path = NULL;
  config->device_selector = NULL;
  config->cache_dir = NULL;
  config->backend_path = NULL;
}

void kiln_config_initialize(kiln_config_t *config) {
  if (!config) return;
  memset(config, 0, sizeof *config);
  config->cpu_devices = -1;
}
