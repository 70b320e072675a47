/* runtime/registry.c: loads the backends KILN_BACKEND names, enumerates, filters and orders their devices. */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
static bool fmt_fits(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fmt_fits(char *out, size_t size, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(out, size, fmt, args);
  va_end(args);
  return n >= 0 && (size_t)n < size;
}

typedef struct candidates_t {
  char paths[KILN_MAX_CANDIDATES][PATH_MAX];
  bool too_long[KILN_MAX_CANDIDATES]; /* paths[i] is a note naming a folder whose path was too long */
  size_t count;
} candidates_t;

static void candidate_add(candidates_t *c, const char *dir, const char *file) {
  if (!dir[0] || c->count == KILN_MAX_CANDIDATES) return;
  char path[PATH_MAX];
  int n = snprintf(path, sizeof path, "%s/%s", dir, file);
  if (n < 0 || (size_t)n >= sizeof path) {
    /* Listed among the paths tried, so that the message says why a folder
     * the user named was not searched. */
    snprintf(c->paths[c->count], sizeof c->paths[c->count], "%.60s... (a path over %d bytes, not searched)", dir,
             PATH_MAX - 1);
    c->too_long[c->count++] = true;
    return;
  }
  for (size_t i = 0; i < c->count; i++)
    if (!strcmp(c->paths[i], path)) return;
  c->too_long[c->count] = false;
  memcpy(c->paths[c->count++], path, (size_t)n + 1);
}

/* The file that holds this code: libkiln.so when linked dynamically, the
 * executable when linked statically. Resolved to a real path so that the
 * build-tree check compares like with like. */
static bool self_path(char *out, size_t size) {
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

static void plugin_candidates(const kiln__runtime_t *rt, const char *name, candidates_t *out) {
  char file[64];
  snprintf(file, sizeof file, "libkiln-%s.so", name);
  out->count = 0;

  if (rt->config.backend_path) {
    const char *p = rt->config.backend_path;
    while (*p) {
      const char *colon = strchr(p, ':');
      size_t len = colon ? (size_t)(colon - p) : strlen(p);
      if (len >= PATH_MAX) {
        char dir[PATH_MAX];
        memcpy(dir, p, PATH_MAX - 1);
        dir[PATH_MAX - 1] = '\0';
        candidate_add(out, dir, file);
      } else if (len > 0) {
        char dir[PATH_MAX];
        memcpy(dir, p, len);
        dir[len] = '\0';
        candidate_add(out, dir, file);
      }
      if (!colon) break;
      p = colon + 1;
    }
  }

  char self[PATH_MAX];
  bool have_self = self_path(self, sizeof self);
  if (have_self) {
    char dir[PATH_MAX];
    strcpy(dir, self);
    char *slash = strrchr(dir, '/');
    if (slash) {
      strcpy(slash, "/kiln");
      candidate_add(out, dir, file);
    }
  }

  candidate_add(out, KILN_PLUGIN_INSTALL_DIR, file);

  /* The build tree is searched only by a libkiln that runs from it, so an
   * installed kiln never picks up stale plugins of an old build. */
  char root[PATH_MAX];
  if (have_self && KILN_BUILD_ROOT[0] && realpath(KILN_BUILD_ROOT, root)) {
    size_t len = strlen(root);
    if (!strncmp(self, root, len) && self[len] == '/') {
      char dir[PATH_MAX];
      if (fmt_fits(dir, sizeof dir, "%s/backends/%s", root, name)) candidate_add(out, dir, file);
      if (fmt_fits(dir, sizeof dir, "%s/tests", root)) candidate_add(out, dir, file);
    }
  }
}

/* Backends compiled into the program by tests, by name; they come before the
 * built-in list (backends/builtin.c) and plugins of the same name. */
#define MAX_TEST_BUILTINS 8
static struct {
  char name[32];
  kiln_backend_entry_fn entry;
} test_builtins[MAX_TEST_BUILTINS];
static size_t test_builtin_count;

kiln_status_t kiln__registry_add_builtin(const char *name, kiln_backend_entry_fn entry) {
  if (!name || !entry)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_add_builtin: %s is NULL", name ? "entry" : "name");
  size_t len = strlen(name);
  if (len == 0 || len >= sizeof test_builtins[0].name || strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_add_builtin: \"%.64s\" is not a backend name "
                           "([a-z0-9_]+, at most %zu characters)", name, sizeof test_builtins[0].name - 1);
  for (size_t i = 0; i < test_builtin_count; i++) {
    if (!strcmp(test_builtins[i].name, name)) {
      test_builtins[i].entry = entry;
      return KILN_OK;
    }
  }
  if (test_builtin_count == MAX_TEST_BUILTINS)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_add_builtin: at most %d built-in backends",
                           MAX_TEST_BUILTINS);
  memcpy(test_builtins[test_builtin_count].name, name, len + 1);
  test_builtins[test_builtin_count].entry = entry;
  test_builtin_count++;
  return KILN_OK;
}

static kiln_backend_entry_fn builtin_find(const char *name) {
  for (size_t i = 0; i < test_builtin_count; i++)
    if (!strcmp(test_builtins[i].name, name)) return test_builtins[i].entry;
  for (const kiln_backend_builtin_t *b = kiln_backend_builtins; b->name; b++)
    if (!strcmp(b->name, name)) return b->entry;
  return NULL;
}

static void backend_fail(kiln__backend_t *b, kiln_backend_state_t state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void backend_fail(kiln__backend_t *b, kiln_backend_state_t state, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(b->reason, sizeof b->reason, fmt, args);
  va_end(args);
  b->info.state = state;
  b->loaded = false;
}

/* The slots a backend must fill; the others have defaults in the core. */
static const char *missing_slot(const kiln_backend_iface_t *i) {
#define REQUIRE_(slot) \
  if (!i->slot) return #slot;
  REQUIRE_(name) REQUIRE_(initialize) REQUIRE_(device_count) REQUIRE_(device_describe)
  REQUIRE_(buffer_allocate) REQUIRE_(buffer_free) REQUIRE_(queue_create)
  REQUIRE_(queue_destroy) REQUIRE_(queue_finish) REQUIRE_(queue_record)
  REQUIRE_(queue_wait) REQUIRE_(event_wait) REQUIRE_(event_query)
  REQUIRE_(event_elapsed) REQUIRE_(event_release) REQUIRE_(buffer_write)
  REQUIRE_(buffer_read) REQUIRE_(buffer_fill) REQUIRE_(ops)
#undef REQUIRE_
  return NULL;
}

/* The smallest table the core accepts: every slot up to the op table. */
#define MIN_IFACE_SIZE (offsetof(kiln_backend_iface_t, ops) + sizeof(void *))
/* Rows a table may have at most (a missing end row must not run away). */
#define MAX_OP_ROWS 4096

/* Take a backend's table: the ABI check, then a copy at the core's size (the
 * slots a shorter table lacks stay NULL: their defaults), then the required
 * slots and the op table's rows (native for every kind). On success the
 * backend is marked loaded. */
static void backend_adopt(kiln__backend_t *b, const kiln_backend_iface_t *iface, const char *origin) {
  if (!iface) {
    backend_fail(b, KILN_BACKEND_ABI_MISMATCH, "%s: %s() returned no interface; rebuild it against this kiln", origin,
                 KILN_BACKEND_ENTRY_SYMBOL);
    return;
  }
  if (iface->abi_version != KILN_BACKEND_ABI_VERSION) {
    backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                 "%s was built for backend ABI %u, this libkiln speaks %u; rebuild the plugin against this kiln (it "
                 "is too %s)",
                 origin, iface->abi_version, KILN_BACKEND_ABI_VERSION,
                 iface->abi_version < KILN_BACKEND_ABI_VERSION ? "old" : "new");
    return;
  }
  if (iface->size < MIN_IFACE_SIZE) {
    backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                 "%s has an interface table of %u bytes, less than the %zu of backend ABI %u's required slots; it is "
                 "too old: rebuild it against this kiln",
                 origin, iface->size, (size_t)MIN_IFACE_SIZE, KILN_BACKEND_ABI_VERSION);
    return;
  }
  memset(&b->iface, 0, sizeof b->iface);
  memcpy(&b->iface, iface, iface->size < sizeof b->iface ? iface->size : sizeof b->iface);
  const char *missing = missing_slot(&b->iface);
  if (missing) {
    backend_fail(b, KILN_BACKEND_ABI_MISMATCH, "%s leaves the required slot %s empty; rebuild it against this kiln",
                 origin, missing);
    return;
  }
  /* A kind a backend lists rows for must have a native one among them (a
   * backend may lack a kind altogether: then the core says so). */
  bool native[KILN_OP_COUNT] = {false};
  const char *vendor[KILN_OP_COUNT] = {NULL};
  for (size_t r = 0;; r++) {
    const kiln_op_entry_t *e = &b->iface.ops[r];
    if (!e->run) break; /* KILN_OP_TABLE_END */
    if (r == MAX_OP_ROWS) {
      backend_fail(b, KILN_BACKEND_ABI_MISMATCH, "%s: its op table has no end row within %d rows; end it with "
                   "KILN_OP_TABLE_END and rebuild it against this kiln", origin, MAX_OP_ROWS);
      return;
    }
    if ((unsigned)e->kind >= KILN_OP_COUNT) continue; /* a newer op kind this core does not know */
    if (!e->provider || kiln__provider_intern(e->provider) == KILN_PROVIDER_NONE) {
      backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                   "%s: op table row %zu (%s) has an invalid provider name; rebuild it against this kiln", origin, r,
                   kiln_backend_op_kind_name(e->kind));
      return;
    }
    if (!strcmp(e->provider, KILN_PROVIDER_NATIVE_NAME)) native[e->kind] = true;
    else vendor[e->kind] = e->provider;
  }
  for (int k = 0; k < KILN_OP_COUNT; k++) {
    if (vendor[k] && !native[k]) {
      backend_fail(b, KILN_BACKEND_ABI_MISMATCH,
                   "%s offers %s for op %s but no native row; kiln's own kernels must serve every op a backend "
                   "runs; rebuild it against this kiln", origin, vendor[k], kiln_backend_op_kind_name((kiln_op_kind_t)k));
      return;
    }
  }
  b->loaded = true;
}

/* Whether a plugin file can be handed to dlopen: a regular file (through
 * its links), and, when it is ELF, one whose program headers and loadable
 * segments lie inside it. A file cut short by an interrupted install keeps a
 * valid header, and dlopen maps its segments past the end: the process dies
 * of SIGBUS at the first touch. Anything else that is wrong with the file
 * dlopen reports itself. */
static bool plugin_file_sane(const char *path, char *why, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP)
      snprintf(why, size, "a loop of symbolic links; point it at the plugin file or remove it");
    else if (errno == ENOENT)
      snprintf(why, size, "a symbolic link to a file that does not exist; point it at the plugin or remove it");
    else
      snprintf(why, size, "cannot be opened (%s)", strerror(errno));
    return false;
  }
  bool ok = true;
  struct stat st;
  unsigned char ident[EI_NIDENT];
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(why, size, "not a regular file; put the plugin library there");
    ok = false;
  } else if (pread(fd, ident, sizeof ident, 0) == (ssize_t)sizeof ident && !memcmp(ident, ELFMAG, SELFMAG) &&
             ident[EI_CLASS] == ELFCLASS64) {
    const uint64_t file_size = (uint64_t)st.st_size;
    Elf64_Ehdr eh;
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh) {
      snprintf(why, size, "truncated: the ELF header is cut short (%llu bytes); reinstall the plugin",
               (unsigned long long)file_size);
      ok = false;
    } else if (eh.e_phentsize != sizeof(Elf64_Phdr) ||
               (uint64_t)eh.e_phoff + (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr) > file_size) {
      snprintf(why, size, "truncated or damaged: its program headers lie past its end (%llu bytes); reinstall the "
               "plugin", (unsigned long long)file_size);
      ok = false;
    } else {
      for (unsigned i = 0; i < eh.e_phnum && ok; i++) {
        Elf64_Phdr ph;
        if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) != (ssize_t)sizeof ph) {
          snprintf(why, size, "cannot read program header %u; reinstall the plugin", i);
          ok = false;
        } else if (ph.p_type == PT_LOAD && (ph.p_offset > file_size || ph.p_filesz > file_size - ph.p_offset)) {
          snprintf(why, size, "truncated: loadable segment %u ends at byte %llu but the file has %llu bytes (an "
                   "interrupted install?); reinstall the plugin", i,
                   (unsigned long long)(ph.p_offset + ph.p_filesz), (unsigned long long)file_size);
          ok = false;
        }
      }
    }
  }
  close(fd);
  return ok;
}

/* Find, dlopen and adopt one plugin. */
static void plugin_open(kiln__runtime_t *rt, kiln__backend_t *b) {
  candidates_t *candidates = malloc(sizeof *candidates);
  if (!candidates) {
    backend_fail(b, KILN_BACKEND_UNAVAILABLE, "out of host memory searching for the plugin");
    return;
  }
  plugin_candidates(rt, b->name, candidates);
  /* The first name that exists is the plugin, even a broken one (a dangling
   * symbolic link, a loop): it is reported, never silently passed over. */
  const char *found = NULL;
  struct stat st;
  for (size_t i = 0; i < candidates->count && !found; i++)
    if (!candidates->too_long[i] && lstat(candidates->paths[i], &st) == 0) found = candidates->paths[i];

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
    fmt_fits(b->path, sizeof b->path, "%s", candidates->count ? candidates->paths[candidates->count - 1] : "");
    backend_fail(b, KILN_BACKEND_UNAVAILABLE,
                 "plugin libkiln-%s.so not found; tried: %s; set KILN_BACKEND_PATH to the folder that holds it",
                 b->name, candidates->count ? tried : "(no folder to search)");
    free(candidates);
    return;
  }
  if (!fmt_fits(b->path, sizeof b->path, "%s", found)) {
    backend_fail(b, KILN_BACKEND_UNAVAILABLE, "the plugin's path is longer than %zu bytes; move it to a "
                 "shorter KILN_BACKEND_PATH", sizeof b->path - 1);
    free(candidates);
    return;
  }
  free(candidates);

  char why[512];
  if (!plugin_file_sane(b->path, why, sizeof why)) {
    backend_fail(b, KILN_BACKEND_UNAVAILABLE, "%s: %s", b->path, why);
    return;
  }
  dlerror();
  void *handle = dlopen(b->path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *loader = dlerror();
    backend_fail(b, KILN_BACKEND_UNAVAILABLE, "%s", loader ? loader : "dlopen failed without a message");
    return;
  }
  b->dl_handle = handle;
  kiln_backend_entry_fn entry;
  void *symbol = dlsym(handle, KILN_BACKEND_ENTRY_SYMBOL);
  memcpy(&entry, &symbol, sizeof entry);
  if (!entry) {
    backend_fail(b, KILN_BACKEND_ABI_MISMATCH, "%s does not export %s(); it is not a kiln backend plugin", b->path,
                 KILN_BACKEND_ENTRY_SYMBOL);
    return;
  }
  backend_adopt(b, entry(), b->path);
}

static int type_rank(kiln_device_type_t type) {
  switch (type) {
    case KILN_DEVICE_GPU: return 0;
    case KILN_DEVICE_ACCELERATOR: return 1;
    case KILN_DEVICE_CPU: return 2;
    case KILN_DEVICE_OTHER: return 3; /* simulators (Oclgrind), unknown kinds: never the default over the CPU */
  }
  return 3;
}

/* Device order: type, then (while KILN_BACKEND is unset) the backend's own
 * order hint, then backend priority (config order), then the backend's own
 * order. The hint keeps a device reached through an extra layer (an OpenCL
 * CPU device beside the host's native backend) listed and selectable, but not
 * the default; a user who names backends decides by their order alone. */
static bool device_before(const kiln_device_t *a, size_t a_prio, const kiln_device_t *b, size_t b_prio,
                          bool use_hint) {
  int ra = type_rank(a->desc.type), rb = type_rank(b->desc.type);
  if (ra != rb) return ra < rb;
  if (use_hint && a->desc.order != b->desc.order) return a->desc.order < b->desc.order;
  if (a_prio != b_prio) return a_prio < b_prio;
  return a->backend_index < b->backend_index;
}

/* Append a device to rt->devices, growing the table as backends report. */
static kiln_status_t device_push(kiln__runtime_t *rt, size_t **prio_of, size_t *capacity, kiln_device_t *d,
                                 size_t priority) {
  if (rt->device_count == *capacity) {
    size_t grown = *capacity ? *capacity * 2 : 16;
    kiln_device_t **devices = realloc(rt->devices, grown * sizeof *devices);
    if (!devices) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory listing %zu devices", grown);
    rt->devices = devices;
    size_t *prios = realloc(*prio_of, grown * sizeof *prios);
    if (!prios) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory listing %zu devices", grown);
    *prio_of = prios;
    *capacity = grown;
  }
  (*prio_of)[rt->device_count] = priority;
  rt->devices[rt->device_count++] = d;
  return KILN_OK;
}

/* Describe every device of a loaded backend and add those KILN_DEVICE keeps
 * to rt->devices (unsorted). */
static kiln_status_t backend_devices(kiln__runtime_t *rt, kiln__backend_t *b, size_t priority,
                                     const kiln__selector_t *selector, size_t **prio_of, size_t *capacity) {
  size_t count = b->iface.device_count(b->ctx);
  b->info.device_count = count;
  size_t visible = 0;
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *d = calloc(1, sizeof *d);
    if (!d) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory describing %s device %zu", b->name, i);
    d->backend = b;
    d->iface = &b->iface;
    d->ctx = b->ctx;
    d->backend_index = (uint32_t)i;
    kiln_status_t status = b->iface.device_describe(b->ctx, i, &d->desc);
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
    fmt_fits(d->selector, sizeof d->selector, "%s:%zu", b->name, i);
    fmt_fits(d->display_name, sizeof d->display_name, "%s (%.256s)", d->selector, d->desc.name);
    status = device_push(rt, prio_of, capacity, d, priority);
    if (status != KILN_OK) {
      free(d);
      return status;
    }
    visible++;
  }
  b->info.state = visible ? KILN_BACKEND_LOADED : KILN_BACKEND_NO_DEVICE;
  return KILN_OK;
}

static void backend_info_fill(kiln__backend_t *b) {
  b->info.name = b->name;
  b->info.reason = b->reason;
  b->info.path = b->path;
  const char *version = b->loaded && b->iface.version_text ? b->iface.version_text(b->ctx) : NULL;
  if (!version && b->loaded) version = b->iface.version;
  b->info.version = version ? version : "";
}

static void backend_deinitialize(kiln__backend_t *b) {
  if (b->loaded && b->iface.deinitialize) b->iface.deinitialize(b->ctx);
  b->loaded = false;
  b->ctx = NULL;
}

/* Undo a partial load: free the devices (already detached), deinitialize the
 * backends. */
static void registry_discard(kiln__runtime_t *rt) {
  for (size_t j = 0; j < rt->device_count; j++) free(rt->devices[j]);
  free(rt->devices);
  rt->devices = NULL;
  rt->device_count = 0;
  rt->default_device = NULL;
  for (size_t j = 0; j < rt->backend_count; j++) backend_deinitialize(&rt->backends[j]);
  rt->backend_count = 0;
}

static const char *host_setting(const char *variable) {
  if (variable && !strcmp(variable, "KILN_CPU_DEVICES")) return kiln__rt.config.cpu_devices_text;
  return NULL;
}

/* Load one backend named in KILN_BACKEND: built in or a plugin, then
 * initialize it. */
static void backend_load(kiln__runtime_t *rt, kiln__backend_t *b) {
  kiln_backend_entry_fn builtin = builtin_find(b->name);
  if (builtin) {
    snprintf(b->path, sizeof b->path, "builtin");
    char origin[96];
    snprintf(origin, sizeof origin, "the built-in %s backend", b->name);
    backend_adopt(b, builtin(), origin);
  } else {
    plugin_open(rt, b);
  }
  if (!b->loaded) return;
  /* What a backend that starts with zero devices says about it ("driver
   * present, no CUDA device"): it returns KILN_OK and leaves the why as the
   * thread's message, which becomes the reason devinfo shows. */
  kiln_clear_error();
  kiln_status_t init = b->iface.initialize(&rt->host, &b->ctx);
  const char *message = kiln_last_error();
  if (init != KILN_OK) {
    b->ctx = NULL;
    backend_fail(b, KILN_BACKEND_UNAVAILABLE, "%s", message[0] ? message : kiln_status_describe(init));
  } else {
    snprintf(b->reason, sizeof b->reason, "%s", message);
  }
  kiln_clear_error();
}

/* KILN_DEVICE kept none of the devices found: an error, since a program would
 * otherwise start with nothing to run on. The message lists what there is. */
static kiln_status_t no_visible_device(const kiln__runtime_t *rt) {
  const char *env = getenv("KILN_DEVICE");
  const char *source = env && !strcmp(env, rt->config.device_selector) ? "KILN_DEVICE" : "kiln_config_t.device";
  char found[1024];
  size_t used = 0;
  found[0] = '\0';
  for (size_t i = 0; i < rt->backend_count && used < sizeof found; i++) {
    const kiln__backend_t *b = &rt->backends[i];
    size_t n = b->info.device_count;
    int w;
    if (!b->loaded)
      w = snprintf(found + used, sizeof found - used, "%s%s unavailable", used ? "; " : "", b->name);
    else if (n == 1)
      w = snprintf(found + used, sizeof found - used, "%s%s:0", used ? "; " : "", b->name);
    else if (n > 1)
      w = snprintf(found + used, sizeof found - used, "%s%s:0 to %s:%zu", used ? "; " : "", b->name, b->name, n - 1);
    else
      w = snprintf(found + used, sizeof found - used, "%s%s has no device", used ? "; " : "", b->name);
    if (w < 0) break;
    used += (size_t)w;
  }
  return kiln__set_error(KILN_NOT_FOUND,
                         "%s=\"%s\" leaves no device visible; the devices found are: %s. Choose among them (devinfo "
                         "with %s unset prints each device's selector) or unset %s",
                         source, rt->config.device_selector, found, source, source);
}

kiln_status_t kiln__registry_load(kiln__runtime_t *rt) {
  if (!rt) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__registry_load: rt is NULL");
  rt->host.size = sizeof rt->host;
  rt->host.set_error = kiln__set_error;
  rt->host.last_error = kiln_last_error;
  rt->host.log = kiln__log;
  rt->host.log_level = kiln_log_level;
  rt->host.cache_load = kiln__cache_load;
  rt->host.cache_store = kiln__cache_store;
  rt->host.cache_evict = kiln__cache_evict;
  rt->host.setting = host_setting;

  kiln__selector_t selector;
  bool filtered = rt->config.device_selector != NULL;
  if (filtered && kiln__selector_parse(rt->config.device_selector, &selector) != KILN_OK)
    return kiln__wrap_error(KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"%s\"", rt->config.device_selector);

  size_t *prio_of = NULL, capacity = 0;
  rt->backend_count = 0;
  rt->device_count = 0;
  rt->devices = NULL;
  rt->default_device = NULL;
  kiln_status_t status = KILN_OK;

  for (size_t i = 0; i < rt->config.backend_count && i < KILN_MAX_BACKENDS; i++) {
    kiln__backend_t *b = &rt->backends[rt->backend_count++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", rt->config.backends[i]);
    b->info.state = KILN_BACKEND_UNAVAILABLE;
    backend_load(rt, b);
    if (b->loaded) {
      status = backend_devices(rt, b, i, filtered ? &selector : NULL, &prio_of, &capacity);
      if (status != KILN_OK) break;
      if (b->info.device_count == 0 && !b->reason[0])
        snprintf(b->reason, sizeof b->reason, "the backend loaded but found no device");
      else if (b->info.device_count > 0)
        b->reason[0] = '\0';
    }
    backend_info_fill(b);

    bool usable = b->loaded && b->info.device_count > 0;
    if (b->loaded) {
      kiln__log(KILN_LOG_INFO, "backend %s: %s, %zu device(s), from %s%s%s", b->name,
                kiln_backend_state_name(b->info.state), b->info.device_count, b->path, b->reason[0] ? ": " : "",
                b->reason);
    }
    if (!usable && rt->config.backends_explicit) {
      /* Named by the user: running quietly without it would run on the wrong
       * device. Only the unset default falls back. */
      status = kiln__set_error(b->info.state == KILN_BACKEND_ABI_MISMATCH ? KILN_ABI_MISMATCH : KILN_UNAVAILABLE,
                               "backend '%s' named in KILN_BACKEND cannot be used: %s", b->name, b->reason);
      break;
    }
    if (!b->loaded)
      kiln__log(KILN_LOG_INFO, "backend %s %s: %s", b->name, kiln_backend_state_name(b->info.state), b->reason);
  }

  if (status == KILN_OK && filtered && rt->device_count == 0) status = no_visible_device(rt);
  if (status != KILN_OK) {
    /* Keep the message across the clean-up, which may log or reset errors. */
    char message[2048];
    snprintf(message, sizeof message, "%s", kiln_last_error());
    free(prio_of);
    registry_discard(rt);
    return kiln__set_error(status, "%s", message);
  }

  /* Stable insertion sort keeps equal keys in enumeration order. */
  for (size_t i = 1; i < rt->device_count; i++) {
    kiln_device_t *d = rt->devices[i];
    size_t prio = prio_of[i];
    size_t j = i;
    while (j > 0 && device_before(d, prio, rt->devices[j - 1], prio_of[j - 1], !rt->config.backends_explicit)) {
      rt->devices[j] = rt->devices[j - 1];
      prio_of[j] = prio_of[j - 1];
      j--;
    }
    rt->devices[j] = d;
    prio_of[j] = prio;
  }
  free(prio_of);

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
      registry_discard(rt);
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
  /* Plugins stay mapped (never dlclose'd): their threads may outlive us. */
  registry_discard(rt);
}
