/* runtime/registry.c: loads the backends KILN_BACKEND names, enumerates, filters and orders their devices. */
#include <dlfcn.h>
#include <stdarg.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/internal.h"

/* Where the build system says plugins are installed and where the build tree
 * is; a direct compile without them still searches KILN_BACKEND_PATH and the
 * folder beside libkiln. */
#ifndef KILN_PLUGIN_INSTALL_DIR
#define KILN_PLUGIN_INSTALL_DIR ""
#endif
#ifndef KILN_BUILD_ROOT
#define KILN_BUILD_ROOT ""
#endif

#define KILN_MAX_CANDIDATES 24

/* snprintf that says whether everything fit; a path cut short is skipped
 * rather than tried. */
static bool kiln_fmt(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool kiln_fmt(char *out, size_t size, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(out, size, fmt, args);
  va_end(args);
  return n >= 0 && (size_t)n < size;
}

typedef struct kiln_candidates_t {
  char paths[KILN_MAX_CANDIDATES][PATH_MAX];
  size_t count;
} kiln_candidates_t;

static void kiln_candidate_add(kiln_candidates_t *c, const char *dir, const char *file) {
  if (!dir[0] || c->count == KILN_MAX_CANDIDATES) return;
  char path[PATH_MAX];
  int n = snprintf(path, sizeof path, "%s/%s", dir, file);
  if (n < 0 || (size_t)n >= sizeof path) return;
  for (size_t i = 0; i < c->count; i++)
    if (!strcmp(c->paths[i], path)) return;
  memcpy(c->paths[c->count++], path, (size_t)n + 1);
}

/* The file that holds this code: libkiln.so when linked dynamically, the
 * executable when linked statically. Resolved to a real path so that the
 * build-tree check compares like with like. */
static bool kiln_self_path(char *out, size_t size) {
  Dl_info info;
  struct link_map *map = NULL;
  if (!dladdr1((void *)kiln__registry_load, &info, (void **)&map, RTLD_DL_LINKMAP)) return false;
  char resolved[PATH_MAX];
  /* The main program's link map has an empty name and dladdr reports argv[0],
   * which need not be a path; the kernel knows the real file. */
  if (!map || !map->l_name || !map->l_name[0] || !info.dli_fname || !strchr(info.dli_fname, '/')) {
    ssize_t n = readlink("/proc/self/exe", resolved, sizeof resolved - 1);
    if (n <= 0) return false;
    resolved[n] = '\0';
  } else if (!realpath(info.dli_fname, resolved)) {
    return false;
  }
  if (strlen(resolved) >= size) return false;
  strcpy(out, resolved);
  return true;
}

static void kiln_plugin_candidates(const kiln__runtime_t *rt, const char *name, kiln_candidates_t *out) {
  char file[64];
  snprintf(file, sizeof file, "libkiln-%s.so", name);
  out->count = 0;

  if (rt->config.backend_path) {
    const char *p = rt->config.backend_path;
    while (*p) {
      const char *colon = strchr(p, ':');
      size_t len = colon ? (size_t)(colon - p) : strlen(p);
      if (len > 0 && len < PATH_MAX) {
        char dir[PATH_MAX];
        memcpy(dir, p, len);
        dir[len] = '\0';
        kiln_candidate_add(out, dir, file);
      }
      if (!colon) break;
      p = colon + 1;
    }
  }

  char self[PATH_MAX];
  bool have_self = kiln_self_path(self, sizeof self);
  if (have_self) {
    char dir[PATH_MAX];
    strcpy(dir, self);
    char *slash = strrchr(dir, '/');
    if (slash) {
      strcpy(slash, "/kiln");
      kiln_candidate_add(out, dir, file);
    }
  }

  kiln_candidate_add(out, KILN_PLUGIN_INSTALL_DIR, file);

  /* The build tree is searched only by a libkiln that runs from it, so an
   * installed kiln never picks up stale plugins of an old build. */
  char root[PATH_MAX];
  if (have_self && KILN_BUILD_ROOT[0] && realpath(KILN_BUILD_ROOT, root)) {
    size_t len = strlen(root);
    if (!strncmp(self, root, len) && self[len] == '/') {
      char dir[PATH_MAX];
      if (kiln_fmt(dir, sizeof dir, "%s/backends/%s", root, name)) kiln_candidate_add(out, dir, file);
      if (kiln_fmt(dir, sizeof dir, "%s/tests", root)) kiln_candidate_add(out, dir, file);
    }
  }
}

/* Backends compiled into the program besides the CPU one, by name. */
#define KILN_MAX_BUILTINS 4
static struct {
  char name[32];
  kiln_backend_entry_fn entry;
} kiln_builtins[KILN_MAX_BUILTINS];
static size_t kiln_builtin_count;

kiln_status_t kiln__registry_add_builtin(const char *name, kiln_backend_entry_fn entry) {
  if (!name || !entry)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_add_builtin: %s is NULL", name ? "entry" : "name");
  size_t len = strlen(name);
  if (len == 0 || len >= sizeof kiln_builtins[0].name || strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_add_builtin: \"%.64s\" is not a backend name "
                           "([a-z0-9_]+, at most %zu characters)", name, sizeof kiln_builtins[0].name - 1);
  for (size_t i = 0; i < kiln_builtin_count; i++) {
    if (!strcmp(kiln_builtins[i].name, name)) {
      kiln_builtins[i].entry = entry;
      return KILN_OK;
    }
  }
  if (kiln_builtin_count == KILN_MAX_BUILTINS)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_add_builtin: at most %d built-in backends",
                           KILN_MAX_BUILTINS);
  memcpy(kiln_builtins[kiln_builtin_count].name, name, len + 1);
  kiln_builtins[kiln_builtin_count].entry = entry;
  kiln_builtin_count++;
  return KILN_OK;
}

static kiln_backend_entry_fn kiln_builtin_find(const char *name) {
  for (size_t i = 0; i < kiln_builtin_count; i++)
    if (!strcmp(kiln_builtins[i].name, name)) return kiln_builtins[i].entry;
  return NULL;
}

static void kiln_backend_fail(kiln__backend_t *b, kiln_backend_state_t state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kiln_backend_fail(kiln__backend_t *b, kiln_backend_state_t state, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(b->reason, sizeof b->reason, fmt, args);
  va_end(args);
  b->info.state = state;
  b->iface = NULL;
}

/* The slots a backend must fill; the others have defaults in the core. */
static const char *kiln_missing_slot(const kiln_backend_iface_t *i) {
#define KILN_REQUIRE_(slot) \
  if (!i->slot) return #slot;
  KILN_REQUIRE_(name) KILN_REQUIRE_(initialize) KILN_REQUIRE_(device_count) KILN_REQUIRE_(device_describe)
  KILN_REQUIRE_(buffer_allocate) KILN_REQUIRE_(buffer_free) KILN_REQUIRE_(queue_create)
  KILN_REQUIRE_(queue_destroy) KILN_REQUIRE_(queue_finish) KILN_REQUIRE_(queue_record)
  KILN_REQUIRE_(queue_wait) KILN_REQUIRE_(event_wait) KILN_REQUIRE_(event_query)
  KILN_REQUIRE_(event_elapsed) KILN_REQUIRE_(event_release) KILN_REQUIRE_(buffer_write)
  KILN_REQUIRE_(buffer_read) KILN_REQUIRE_(buffer_fill) KILN_REQUIRE_(op_providers) KILN_REQUIRE_(op_run)
#undef KILN_REQUIRE_
  return NULL;
}

/* Find, dlopen and check one plugin; on success b->iface is set. */
static void kiln_plugin_open(kiln__runtime_t *rt, kiln__backend_t *b) {
  kiln_candidates_t *candidates = malloc(sizeof *candidates);
  if (!candidates) {
    kiln_backend_fail(b, KILN_BACKEND_UNAVAILABLE, "out of host memory searching for the plugin");
    return;
  }
  kiln_plugin_candidates(rt, b->name, candidates);
  const char *found = NULL;
  for (size_t i = 0; i < candidates->count && !found; i++)
    if (access(candidates->paths[i], F_OK) == 0) found = candidates->paths[i];

  if (!found) {
    char tried[768];
    size_t used = 0;
    tried[0] = '\0';
    for (size_t i = 0; i < candidates->count && used < sizeof tried; i++) {
      int n = snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "", candidates->paths[i]);
      if (n < 0) break;
      used += (size_t)n;
    }
    if (used >= sizeof tried) used = sizeof tried - 1;
    kiln_fmt(b->path, sizeof b->path, "%s", candidates->count ? candidates->paths[candidates->count - 1] : "");
    kiln_backend_fail(b, KILN_BACKEND_UNAVAILABLE,
                      "plugin libkiln-%s.so not found; tried: %s; set KILN_BACKEND_PATH to the folder that "
                      "holds it",
                      b->name, candidates->count ? tried : "(no folder to search)");
    free(candidates);
    return;
  }
  if (!kiln_fmt(b->path, sizeof b->path, "%s", found)) {
    kiln_backend_fail(b, KILN_BACKEND_UNAVAILABLE, "the plugin's path is longer than %zu bytes; move it to a "
                      "shorter KILN_BACKEND_PATH", sizeof b->path - 1);
    free(candidates);
    return;
  }
  free(candidates);

  dlerror();
  void *handle = dlopen(b->path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    kiln_backend_fail(b, KILN_BACKEND_UNAVAILABLE, "%s", why ? why : "dlopen failed without a message");
    return;
  }
  b->dl_handle = handle;
  kiln_backend_entry_fn entry;
  void *symbol = dlsym(handle, KILN_BACKEND_ENTRY_SYMBOL);
  memcpy(&entry, &symbol, sizeof entry);
  if (!entry) {
    kiln_backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                      "%s does not export %s(); it is not a kiln backend plugin", b->path,
                      KILN_BACKEND_ENTRY_SYMBOL);
    return;
  }
  const kiln_backend_iface_t *iface = entry();
  if (!iface) {
    kiln_backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                      "%s: %s() returned no interface; rebuild the plugin against this kiln", b->path,
                      KILN_BACKEND_ENTRY_SYMBOL);
    return;
  }
  if (iface->abi_version != KILN_BACKEND_ABI_VERSION) {
    kiln_backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                      "%s was built for backend ABI %u, this libkiln speaks %u; rebuild the plugin against "
                      "this kiln",
                      b->path, iface->abi_version, KILN_BACKEND_ABI_VERSION);
    return;
  }
  b->iface = iface;
}

static int kiln_type_rank(kiln_device_type_t type) {
  switch (type) {
    case KILN_DEVICE_GPU: return 0;
    case KILN_DEVICE_ACCELERATOR: return 1;
    case KILN_DEVICE_CPU: return 2;
    case KILN_DEVICE_OTHER: return 3; /* simulators (Oclgrind), unknown kinds: never the default over the CPU */
  }
  return 3;
}

/* Device order: type, then backend priority (config order), then the
 * backend's own order. One exception while KILN_BACKEND is unset: among CPU
 * devices kiln's own cpu backend comes first. An OpenCL CPU device (PoCL)
 * drives the same cores through a JIT and slower kernels, so it should not
 * become the default on a machine without a GPU; it stays listed and
 * selectable ("opencl:cpu"). */
static bool kiln_device_before(const kiln_device_t *a, size_t a_prio, const kiln_device_t *b, size_t b_prio,
                               bool native_cpu_first) {
  int ra = kiln_type_rank(a->desc.type), rb = kiln_type_rank(b->desc.type);
  if (ra != rb) return ra < rb;
  if (native_cpu_first && a->desc.type == KILN_DEVICE_CPU) {
    bool na = !strcmp(a->iface->name, "cpu"), nb = !strcmp(b->iface->name, "cpu");
    if (na != nb) return na;
  }
  if (a_prio != b_prio) return a_prio < b_prio;
  return a->backend_index < b->backend_index;
}

static void kiln_fill_providers(kiln_device_t *d) {
  for (int k = 0; k < KILN_OP_COUNT; k++) {
    d->provider_mask[k][0] = d->iface->op_providers(d->impl, (kiln_op_kind_t)k, KILN_F32);
    d->provider_mask[k][1] = d->iface->op_providers(d->impl, (kiln_op_kind_t)k, KILN_I32);
    uint32_t mask = d->provider_mask[k][0] | d->provider_mask[k][1];
    /* native is always first, then the vendor libraries in table order. */
    size_t used = 0;
    d->providers_text[k][0] = '\0';
    for (int p = 0; p < KILN_PROVIDER_COUNT; p++) {
      if (!(mask & (1u << p))) continue;
      int n = snprintf(d->providers_text[k] + used, sizeof d->providers_text[k] - used, "%s%s", used ? "," : "",
                       kiln__provider_name((kiln_provider_t)p));
      if (n < 0 || (size_t)n >= sizeof d->providers_text[k] - used) break;
      used += (size_t)n;
    }
  }
}

/* Describe every device of a loaded backend and add those KILN_DEVICE keeps
 * to rt->devices (unsorted). */
static kiln_status_t kiln_backend_devices(kiln__runtime_t *rt, kiln__backend_t *b, size_t priority,
                                          const kiln__selector_t *selector, size_t *prio_of) {
  size_t count = b->iface->device_count();
  b->info.device_count = count;
  size_t visible = 0;
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *d = calloc(1, sizeof *d);
    if (!d) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory describing %s device %zu", b->name, i);
    d->backend = b;
    d->iface = b->iface;
    d->backend_index = (uint32_t)i;
    kiln_status_t status = b->iface->device_describe(i, &d->desc);
    if (status != KILN_OK) {
      /* One device that cannot be described must not hide the others. */
      kiln__log(KILN_LOG_WARN, "%s device %zu skipped: device_describe failed (%s): %s", b->name, i,
                kiln_status_name(status), kiln_last_error());
      kiln_clear_error();
      free(d);
      continue;
    }
    d->desc.name[sizeof d->desc.name - 1] = '\0';
    if (d->desc.property_count > KILN_BACKEND_MAX_PROPERTIES) d->desc.property_count = KILN_BACKEND_MAX_PROPERTIES;
    d->impl = d->desc.impl;
    if (selector && !kiln__selector_accepts(selector, b->name, d->desc.type, (uint32_t)i)) {
      kiln__log(KILN_LOG_DEBUG, "%s:%zu (%s) hidden by KILN_DEVICE", b->name, i, d->desc.name);
      free(d);
      continue;
    }
    if (rt->device_count == KILN_MAX_DEVICES) {
      kiln__log(KILN_LOG_WARN, "%s:%zu (%s) dropped: kiln handles at most %d devices", b->name, i, d->desc.name,
                KILN_MAX_DEVICES);
      free(d);
      continue;
    }
    kiln_fmt(d->selector, sizeof d->selector, "%s:%zu", b->name, i);
    kiln_fmt(d->display_name, sizeof d->display_name, "%s (%.256s)", d->selector, d->desc.name);
    kiln_fill_providers(d);
    prio_of[rt->device_count] = priority;
    rt->devices[rt->device_count++] = d;
    visible++;
  }
  b->info.state = visible ? KILN_BACKEND_LOADED : KILN_BACKEND_NO_DEVICE;
  return KILN_OK;
}

static void kiln_backend_info_fill(kiln__backend_t *b) {
  b->info.name = b->name;
  b->info.reason = b->reason;
  b->info.path = b->path;
  b->info.version = b->iface && b->iface->version ? b->iface->version : "";
}

/* Undo a partial load: free the devices (already detached), deinitialize the
 * backends. */
static void kiln_registry_discard(kiln__runtime_t *rt) {
  for (size_t j = 0; j < rt->device_count; j++) {
    free(rt->devices[j]);
    rt->devices[j] = NULL;
  }
  rt->device_count = 0;
  rt->default_device = NULL;
  for (size_t j = 0; j < rt->backend_count; j++) {
    kiln__backend_t *b = &rt->backends[j];
    if (b->iface && b->iface->deinitialize) b->iface->deinitialize();
    b->iface = NULL;
  }
  rt->backend_count = 0;
}

kiln_status_t kiln__registry_load(kiln__runtime_t *rt) {
  if (!rt) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_load: rt is NULL");
  rt->host.abi_version = KILN_BACKEND_ABI_VERSION;
  rt->host.set_error = kiln__set_error;
  rt->host.log = kiln__log;
  rt->host.log_level = kiln_log_level;
  rt->host.cache_load = kiln__cache_load;
  rt->host.cache_store = kiln__cache_store;
  rt->host.cpu_devices = rt->config.cpu_devices >= 1 ? rt->config.cpu_devices : 1;

  kiln__selector_t selector;
  bool filtered = rt->config.device_selector != NULL;
  if (filtered && kiln__selector_parse(rt->config.device_selector, &selector) != KILN_OK)
    return kiln__wrap_error(KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"%s\"", rt->config.device_selector);

  size_t prio_of[KILN_MAX_DEVICES];
  rt->backend_count = 0;
  rt->device_count = 0;
  rt->default_device = NULL;
  kiln_status_t status = KILN_OK;

  for (size_t i = 0; i < rt->config.backend_count && i < KILN_MAX_BACKENDS; i++) {
    kiln__backend_t *b = &rt->backends[rt->backend_count++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", rt->config.backends[i]);
    b->info.state = KILN_BACKEND_UNAVAILABLE;

    kiln_backend_entry_fn builtin = kiln_builtin_find(b->name);
    if (!strcmp(b->name, "cpu")) {
      snprintf(b->path, sizeof b->path, "builtin");
      b->iface = kiln_cpu_backend_entry();
      if (!b->iface) kiln_backend_fail(b, KILN_BACKEND_UNAVAILABLE, "the built-in CPU backend returned no interface");
    } else if (builtin) {
      snprintf(b->path, sizeof b->path, "builtin");
      b->iface = builtin();
      if (!b->iface)
        kiln_backend_fail(b, KILN_BACKEND_UNAVAILABLE, "the built-in %s backend returned no interface", b->name);
      else if (b->iface->abi_version != KILN_BACKEND_ABI_VERSION)
        kiln_backend_fail(b, KILN_BACKEND_ABI_MISMATCH, "the built-in %s backend speaks backend ABI %u, this "
                          "libkiln %u", b->name, b->iface->abi_version, KILN_BACKEND_ABI_VERSION);
    } else {
      kiln_plugin_open(rt, b);
    }

    if (b->iface) {
      const char *missing = kiln_missing_slot(b->iface);
      if (missing)
        kiln_backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                          "%s leaves the required slot %s empty; rebuild the plugin against this kiln", b->path,
                          missing);
    }
    /* What a backend that starts with zero devices says about it ("driver
     * present, no CUDA device"): it returns KILN_OK and leaves the why as the
     * thread's message, which becomes the reason devinfo shows. */
    char init_note[sizeof b->reason];
    init_note[0] = '\0';
    if (b->iface) {
      kiln_clear_error();
      kiln_status_t init = b->iface->initialize(&rt->host);
      const char *message = kiln_last_error();
      if (init != KILN_OK)
        kiln_backend_fail(b, KILN_BACKEND_UNAVAILABLE, "%s", message[0] ? message : kiln_status_describe(init));
      else
        snprintf(init_note, sizeof init_note, "%s", message);
      kiln_clear_error();
    }
    if (b->iface) {
      status = kiln_backend_devices(rt, b, i, filtered ? &selector : NULL, prio_of);
      if (status != KILN_OK) break;
      if (b->info.device_count == 0)
        snprintf(b->reason, sizeof b->reason, "%s",
                 init_note[0] ? init_note : "the backend loaded but found no device");
    }
    kiln_backend_info_fill(b);

    if (b->info.state == KILN_BACKEND_LOADED || b->info.state == KILN_BACKEND_NO_DEVICE) {
      kiln__log(KILN_LOG_INFO, "backend %s: %s, %zu device(s), from %s", b->name,
                kiln_backend_state_name(b->info.state), b->info.device_count, b->path);
    } else if (rt->config.backends_explicit) {
      /* Named by the user: failing quietly would run on the wrong device. */
      status = kiln__set_error(b->info.state == KILN_BACKEND_ABI_MISMATCH ? KILN_ABI_MISMATCH : KILN_UNAVAILABLE,
                               "backend '%s' named in KILN_BACKEND cannot be used: %s", b->name, b->reason);
      break;
    } else {
      kiln__log(KILN_LOG_INFO, "backend %s %s: %s", b->name, kiln_backend_state_name(b->info.state), b->reason);
    }
  }

  if (status != KILN_OK) {
    /* Keep the message across the clean-up, which may log or reset errors. */
    char message[2048];
    snprintf(message, sizeof message, "%s", kiln_last_error());
    kiln_registry_discard(rt);
    return kiln__set_error(status, "%s", message);
  }

  /* Stable insertion sort keeps equal keys in enumeration order. */
  for (size_t i = 1; i < rt->device_count; i++) {
    kiln_device_t *d = rt->devices[i];
    size_t prio = prio_of[i];
    size_t j = i;
    while (j > 0 && kiln_device_before(d, prio, rt->devices[j - 1], prio_of[j - 1], !rt->config.backends_explicit)) {
      rt->devices[j] = rt->devices[j - 1];
      prio_of[j] = prio_of[j - 1];
      j--;
    }
    rt->devices[j] = d;
    prio_of[j] = prio;
  }

  for (size_t i = 0; i < rt->device_count; i++) {
    kiln_device_t *d = rt->devices[i];
    d->index = (uint32_t)i;
    d->is_default = i == 0;
  }
  rt->default_device = rt->device_count ? rt->devices[0] : NULL;

  for (size_t i = 0; i < rt->device_count; i++) {
    status = kiln__device_attach(rt->devices[i]);
    if (status != KILN_OK) {
      kiln__wrap_error(status, "setting up %s", rt->devices[i]->display_name);
      char message[2048];
      snprintf(message, sizeof message, "%s", kiln_last_error());
      for (size_t j = 0; j < i; j++) kiln__device_detach(rt->devices[j]);
      kiln_registry_discard(rt);
      return kiln__set_error(status, "%s", message);
    }
  }
  for (size_t i = 0; i < rt->device_count; i++)
    kiln__log(KILN_LOG_DEBUG, "device %zu: %s%s", i, rt->devices[i]->display_name,
              rt->devices[i]->is_default ? " (default)" : "");
  return KILN_OK;
}

void kiln__registry_unload(kiln__runtime_t *rt) {
  if (!rt) return;
  for (size_t i = 0; i < rt->device_count; i++) kiln__device_detach(rt->devices[i]);
  for (size_t i = 0; i < rt->device_count; i++) {
    free(rt->devices[i]);
    rt->devices[i] = NULL;
  }
  rt->device_count = 0;
  rt->default_device = NULL;
  /* Plugins stay mapped (never dlclose'd): their threads may outlive us. */
  for (size_t i = 0; i < rt->backend_count; i++) {
    kiln__backend_t *b = &rt->backends[i];
    if (b->iface && b->iface->deinitialize) b->iface->deinitialize();
    b->iface = NULL;
  }
  rt->backend_count = 0;
}
