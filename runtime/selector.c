/* runtime/selector.c: the KILN_DEVICE grammar (oneAPI's ONEAPI_DEVICE_SELECTOR): parsing and matching. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

#define KILN_SELECTOR_GRAMMAR                                                                 \
  "a selector is terms joined by ';', each [!]backend:devices with backend a name or '*' and " \
  "devices a ',' list of *, cpu, gpu, accelerator or an index, e.g. \"opencl:gpu;!cuda:1\""

static bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/* One device of a term: "*", a type or an index. */
static kiln_status_t parse_device(const char *term, const char *dev, size_t len,
                                          kiln__selector_term_t *out) {
  if (len == 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "empty device in '%s'; %s", term, KILN_SELECTOR_GRAMMAR);
  if (len == 1 && dev[0] == '*') {
    out->kind = KILN__SEL_ALL;
    return KILN_OK;
  }
  static const struct {
    const char *name;
    kiln_device_type_t type;
  } types[] = {{"cpu", KILN_DEVICE_CPU}, {"gpu", KILN_DEVICE_GPU}, {"accelerator", KILN_DEVICE_ACCELERATOR}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    if (strlen(types[i].name) == len && !strncmp(types[i].name, dev, len)) {
      out->kind = KILN__SEL_TYPE;
      out->type = types[i].type;
      return KILN_OK;
    }
  }
  bool digits = true;
  for (size_t i = 0; i < len; i++) digits = digits && dev[i] >= '0' && dev[i] <= '9';
  if (digits) {
    uint64_t value = 0;
    for (size_t i = 0; i < len && value <= UINT32_MAX; i++) value = value * 10 + (uint64_t)(dev[i] - '0');
    /* Far beyond any machine: a typo, not a device. */
    if (value >= 1024u)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "device index %.*s in '%s' is too large; no backend has "
                             "that many devices (devinfo lists them)", (int)len, dev, term);
    out->kind = KILN__SEL_INDEX;
    out->index = (uint32_t)value;
    return KILN_OK;
  }
  return kiln__set_error(KILN_INVALID_ARGUMENT,
                         "unknown device '%.*s' in '%s'; use *, cpu, gpu, accelerator or an index", (int)len,
                         dev, term);
}

/* Whether `name` (len bytes) is one of the comma-separated `known` names. */
static bool known_backend(const char *known, const char *name, size_t len) {
  for (const char *p = known; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    if (n == len && !strncmp(p, name, len)) return true;
    if (!comma) break;
    p = comma + 1;
  }
  return false;
}

/* "cuda, opencl, cpu" from "cuda,opencl,cpu", for messages. */
static void known_list(const char *known, char *out, size_t size) {
  size_t used = 0;
  for (const char *p = known; p && *p && used + 3 < size; p++) {
    out[used++] = *p;
    if (*p == ',') out[used++] = ' ';
  }
  out[used] = '\0';
}

/* A term without ':'. oneAPI users write a backend alone ("opencl"); others a
 * type ("gpu"), meant for every backend. The hint must lead somewhere: a type
 * becomes '*:type', a backend 'backend:*', and a word that is neither is
 * refused with the backends that exist (when the caller knows them). */
static kiln_status_t bare_term(const char *term, const char *word, bool discard, const char *known) {
  const char *bang = discard ? "!" : "";
  size_t len = strlen(word);
  bool is_type = !strcmp(word, "gpu") || !strcmp(word, "accelerator") || !strcmp(word, "cpu");
  bool is_backend = known ? known_backend(known, word, len) : !is_type || !strcmp(word, "cpu");
  bool digits = len > 0;
  for (size_t i = 0; i < len; i++) digits = digits && word[i] >= '0' && word[i] <= '9';
  if (is_type && is_backend)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "Incomplete selector '%s': try '%s%s:*' (the %s backend's devices) or '%s*:%s' (every %s "
                           "device, through any backend)",
                           term, bang, word, word, bang, word, word);
  if (is_type)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "Incomplete selector '%s': try '%s*:%s'", term, bang, word);
  if (digits)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "Incomplete selector '%s': a term is backend:devices; try '%s*:%s' (device %s of every "
                           "backend) or a selector devinfo prints, such as 'cpu:%s'",
                           term, bang, word, word, word);
  if (is_backend)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "Incomplete selector '%s': try '%s%s:*'", term, bang, word);
  char names[256];
  known_list(known, names, sizeof names);
  return kiln__set_error(KILN_INVALID_ARGUMENT,
                         "'%s' is neither a backend nor a device type; a term is backend:devices with backend one "
                         "of %s or '*', e.g. '*:gpu' or 'opencl:*' (devinfo prints each device's term)",
                         word, names);
}

/* One ';'-separated term, which may expand to several entries. `known`: the
 * backend names a term may use, comma-separated, or NULL for any name. */
static kiln_status_t kiln_selector_term(const char *term, const char *known, kiln__selector_t *out) {
  if (!term[0])
    return kiln__set_error(KILN_INVALID_ARGUMENT, "empty term (two ';' in a row, or one at an end); %s",
                           KILN_SELECTOR_GRAMMAR);
  const char *p = term;
  bool discard = false;
  if (*p == '!') {
    discard = true;
    p++;
  }
  const char *colon = strchr(p, ':');
  if (!colon) {
    if (p[0]) return bare_term(term, p, discard, known);
    return kiln__set_error(KILN_INVALID_ARGUMENT, "'%s' names no backend; %s", term, KILN_SELECTOR_GRAMMAR);
  }
  if (strchr(colon + 1, ':'))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "too many colons in '%s'; a term is backend:devices, e.g. 'cuda:0' (devinfo "
                           "prints each device's term)",
                           term);
  size_t backend_len = (size_t)(colon - p);
  if (backend_len == 0)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "no backend before ':' in '%s'; try '*%s'", term, colon);
  kiln__selector_term_t base;
  memset(&base, 0, sizeof base);
  base.discard = discard;
  if (backend_len == 1 && p[0] == '*') {
    strcpy(base.backend, "*");
  } else {
    bool ok = backend_len < sizeof base.backend;
    for (size_t i = 0; ok && i < backend_len; i++) ok = name_char(p[i]);
    if (!ok)
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "'%.*s' in '%s' is not a backend name; use '*' or a name such as cpu, opencl, "
                             "cuda",
                             (int)backend_len, p, term);
    if (known && !known_backend(known, p, backend_len)) {
      char names[256];
      known_list(known, names, sizeof names);
      return kiln__set_error(KILN_INVALID_ARGUMENT,
                             "unknown backend '%.*s' in '%s'; the backends are %s (or '*' for any of them)",
                             (int)backend_len, p, term, names);
    }
    memcpy(base.backend, p, backend_len);
    base.backend[backend_len] = '\0';
  }
  const char *dev = colon + 1;
  if (!dev[0])
    return kiln__set_error(KILN_INVALID_ARGUMENT, "Incomplete selector '%s': try '%s*'", term, term);
  for (;;) {
    const char *comma = strchr(dev, ',');
    size_t len = comma ? (size_t)(comma - dev) : strlen(dev);
    kiln__selector_term_t entry = base;
    kiln_status_t status = parse_device(term, dev, len, &entry);
    if (status != KILN_OK) return status;
    if (out->count == sizeof out->terms / sizeof out->terms[0])
      return kiln__set_error(KILN_INVALID_ARGUMENT, "the selector has more than %zu devices in its terms; "
                             "use '*' or a type instead of listing indices",
                             sizeof out->terms / sizeof out->terms[0]);
    out->terms[out->count++] = entry;
    if (!comma) return KILN_OK;
    dev = comma + 1;
  }
}

kiln_status_t kiln__selector_parse(const char *text, kiln__selector_t *out) {
  return kiln__selector_parse_known(text, NULL, out);
}

kiln_status_t kiln__selector_parse_known(const char *text, const char *known, kiln__selector_t *out) {
  if (!text || !out)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__selector_parse: text (%p) or out (%p) is NULL",
                           (const void *)text, (void *)out);
  kiln__selector_t result;
  memset(&result, 0, sizeof result);
  if (!text[0]) return kiln__set_error(KILN_INVALID_ARGUMENT, "the selector is empty; %s", KILN_SELECTOR_GRAMMAR);
  char *copy = strdup(text);
  if (!copy) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory parsing a device selector");
  kiln_status_t status = KILN_OK;
  char *cursor = copy;
  for (;;) {
    char *semi = strchr(cursor, ';');
    if (semi) *semi = '\0';
    status = kiln_selector_term(cursor, known, &result);
    if (status != KILN_OK || !semi) break;
    cursor = semi + 1;
  }
  free(copy);
  if (status == KILN_OK) *out = result;
  return status;
}

static bool kiln_selector_term_matches(const kiln__selector_term_t *term, const char *backend,
                                       kiln_device_type_t type, uint32_t backend_index) {
  if (strcmp(term->backend, "*") && strcmp(term->backend, backend)) return false;
  switch (term->kind) {
    case KILN__SEL_ALL: return true;
    case KILN__SEL_TYPE: return term->type == type;
    case KILN__SEL_INDEX: return term->index == backend_index;
  }
  return false;
}

bool kiln__selector_accepts(const kiln__selector_t *selector, const char *backend, kiln_device_type_t type,
                            uint32_t backend_index) {
  if (!selector || !backend) return false;
  bool has_accept = false, accepted = false;
  for (size_t i = 0; i < selector->count; i++) {
    const kiln__selector_term_t *term = &selector->terms[i];
    bool match = kiln_selector_term_matches(term, backend, type, backend_index);
    if (term->discard) {
      if (match) return false; /* discards always win */
    } else {
      has_accept = true;
      accepted = accepted || match;
    }
  }
  return has_accept ? accepted : true;
}
