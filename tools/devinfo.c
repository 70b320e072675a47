/* tools/devinfo.c: the devinfo command: lists kiln's devices and backends as a table, key/value lines or JSON, and checks them. */
#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kiln/kiln.h"

/* `-v` and `--json` list the providers of every operation kind kiln has
 * (kiln_op_name); a device lists at most this many. */
#define DEVINFO_MAX_OPS 64

enum { DEVINFO_EXIT_OK = 0, DEVINFO_EXIT_CHECK_FAILED = 1, DEVINFO_EXIT_START_FAILED = 2 };

/* One device as devinfo sees it: the device (NULL when it could not be
 * opened), its info, or the error that kept us from reading it. */
typedef struct devinfo_entry_t {
  kiln_device_t *device;
  kiln_device_info_t info;
  bool ok;
  char error[1024];
  int same_card_as; /* index of the first device on another backend with the same identity, or -1 */
} devinfo_entry_t;

static void devinfo_usage(FILE *out) {
  fputs("usage: devinfo [-v | --json | --check] [--help] [--version]\n"
        "\n"
        "Lists the compute devices kiln can use and the state of each backend.\n"
        "\n"
        "  (no option)  one line per device: '*' marks the default device; the first\n"
        "               column is the selector that picks exactly that device and can be\n"
        "               pasted into KILN_DEVICE; CU is its compute units (cores of a CPU,\n"
        "               SMs of an NVIDIA GPU, CUs of an AMD one). Then each backend: its\n"
        "               state, version, devices, providers, and why it is unavailable.\n"
        "  -v, --verbose  every property of every device as 'key: value' lines\n"
        "  --json       one JSON document with the backends and every device property\n"
        "  --check      run a small computation on every device, compare it with the\n"
        "               same computed on the host, and print PASS or FAIL with the\n"
        "               reason; exit 1 if any failed\n"
        "  -h, --help   this text\n"
        "  --version    kiln's version\n"
        "\n"
        "The environment chooses what kiln loads and shows: KILN_BACKEND, KILN_DEVICE,\n"
        "KILN_CPU_DEVICES, KILN_BACKEND_PATH, KILN_POLICY, KILN_PROVIDER (see\n"
        "docs/environment.md).\n"
        "\n"
        "Exit status: 0 listed (or every check passed), 1 a check failed or there was\n"
        "no device to check, 2 bad usage or kiln failed to start.\n",
        out);
}

/* ---- identity ------------------------------------------------------------ */

/* UUIDs come as "GPU-1a2b..." from CUDA and as bare hex from OpenCL: compare
 * the hex digits only, lower-cased. */
static void devinfo_normalize_id(const char *in, char *out, size_t size) {
  size_t n = 0;
  if (!in) in = "";
  if (!strncmp(in, "GPU-", 4)) in += 4;
  for (; *in && n + 1 < size; in++) {
    if (isxdigit((unsigned char)*in)) out[n++] = (char)tolower((unsigned char)*in);
  }
  out[n] = 0;
}

/* An all-zero UUID is what some drivers report when they do not know it. */
static bool devinfo_id_usable(const char *normalized) {
  if (!normalized[0]) return false;
  for (const char *p = normalized; *p; p++) {
    if (*p != '0') return true;
  }
  return false;
}

static bool devinfo_same_card(const kiln_device_info_t *a, const kiln_device_info_t *b) {
  char x[80], y[80];
  devinfo_normalize_id(a->uuid, x, sizeof x);
  devinfo_normalize_id(b->uuid, y, sizeof y);
  if (devinfo_id_usable(x) && devinfo_id_usable(y)) return strcmp(x, y) == 0;
  if (a->pci_bus_id && b->pci_bus_id && a->pci_bus_id[0] && b->pci_bus_id[0]) {
    /* "0000:3B:00.0" and "0000:3b:00.0" name the same slot. */
    return strcasecmp(a->pci_bus_id, b->pci_bus_id) == 0;
  }
  return false;
}

static void devinfo_link_identities(devinfo_entry_t *entries, size_t count) {
  for (size_t i = 0; i < count; i++) {
    entries[i].same_card_as = -1;
    if (!entries[i].ok) continue;
    for (size_t j = 0; j < count; j++) {
      if (j == i || !entries[j].ok) continue;
      if (!strcmp(entries[i].info.backend, entries[j].info.backend)) continue;
      if (devinfo_same_card(&entries[i].info, &entries[j].info)) {
        entries[i].same_card_as = (int)j;
        break;
      }
    }
  }
}

static const char *devinfo_identity(const kiln_device_info_t *info) {
  if (info->uuid && info->uuid[0]) return info->uuid;
  if (info->pci_bus_id && info->pci_bus_id[0]) return info->pci_bus_id;
  return "";
}

/* ---- gathering ------------------------------------------------------------ */

static void devinfo_copy_error(char *out, size_t size, const char *what, kiln_status_t status) {
  snprintf(out, size, "%s failed (%s): %s", what, kiln_status_name(status), kiln_last_error());
}

static devinfo_entry_t *devinfo_gather(size_t count) {
  devinfo_entry_t *entries = calloc(count ? count : 1, sizeof *entries);
  if (!entries) return NULL;
  for (size_t i = 0; i < count; i++) {
    devinfo_entry_t *e = &entries[i];
    kiln_status_t status = kiln_device_get(i, &e->device);
    if (status != KILN_OK) {
      e->device = NULL;
      devinfo_copy_error(e->error, sizeof e->error, "kiln_device_get", status);
      continue;
    }
    status = kiln_device_info(e->device, &e->info);
    if (status != KILN_OK) {
      devinfo_copy_error(e->error, sizeof e->error, "kiln_device_info", status);
      continue;
    }
    e->ok = true;
  }
  devinfo_link_identities(entries, count);
  return entries;
}

static const char *devinfo_str(const char *s) { return s ? s : ""; }

/* Names come from drivers: control characters would break the table's lines. */
static void devinfo_printable(const char *in, char *out, size_t size) {
  size_t n = 0;
  for (; in && *in && n + 1 < size; in++) out[n++] = iscntrl((unsigned char)*in) ? '?' : *in;
  out[n] = 0;
}

static void devinfo_format_bytes(uint64_t bytes, char *out, size_t size) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = (double)bytes;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < sizeof units / sizeof units[0]) {
    value /= 1024.0;
    unit++;
  }
  if (bytes == 0) {
    snprintf(out, size, "-");
  } else if (unit == 0) {
    snprintf(out, size, "%" PRIu64 " B", bytes);
  } else {
    snprintf(out, size, "%.1f %s", value, units[unit]);
  }
}

/* Why no device is visible: the likely causes, in the user's terms. */
static void devinfo_say_no_device(FILE *out) {
  const char *device = getenv("KILN_DEVICE");
  const char *backend = getenv("KILN_BACKEND");
  fputs("No device: kiln found no visible compute device.\n", out);
  if (device && *device) fprintf(out, "  KILN_DEVICE='%s' may exclude every device; unset it to see them all.\n", device);
  if (backend && *backend) fprintf(out, "  KILN_BACKEND='%s' restricts the backends loaded.\n", backend);
}

/* ---- backends ------------------------------------------------------------- */

/* One backend as devinfo shows it: each thing said once, in its own field. */
typedef struct devinfo_backend_t {
  kiln_backend_info_t info;
  bool ok;
  char error[512];     /* kiln_backend_info failed */
  char reason[1024];   /* why it is unavailable or shows no device, in the user's terms; "" when loaded */
  const char *plugin;  /* the plugin file kiln loaded or failed to load; "" when built in or not found */
  bool builtin;
  size_t visible;      /* of its devices, how many KILN_DEVICE leaves visible */
  char selectors[256]; /* "opencl:0, opencl:1" */
  char providers[256]; /* "native, clblast": every provider of any op on its visible devices */
} devinfo_backend_t;

/* "needed: cannot open shared object file: ..." is the loader saying that a
 * library the plugin links is missing, not the plugin (which was found). */
static void devinfo_explain_reason(const kiln_backend_info_t *b, char *out, size_t size) {
  const char *reason = devinfo_str(b->reason);
  const char *tail = strstr(reason, ": cannot open shared object file");
  if (tail && !memchr(reason, ' ', (size_t)(tail - reason))) {
    int len = (int)(tail - reason);
    if (!strncmp(reason, "libcuda.so", 10)) {
      snprintf(out, size, "no NVIDIA driver: %.*s not found (the driver installs it; without an NVIDIA GPU this "
               "is expected)", len, reason);
    } else if (!strncmp(reason, "libOpenCL.so", 12)) {
      snprintf(out, size, "no OpenCL ICD loader: %.*s not found (on Debian: apt install ocl-icd-libopencl1)", len,
               reason);
    } else {
      snprintf(out, size, "%.*s not found: the plugin needs it (%s)", len, reason, reason);
    }
    return;
  }
  if (!reason[0] && b->state == KILN_BACKEND_NO_DEVICE && b->device_count > 0) {
    snprintf(out, size, "its %zu device%s hidden by KILN_DEVICE", b->device_count,
             b->device_count == 1 ? " is" : "s are");
    return;
  }
  snprintf(out, size, "%s", reason[0] || b->state == KILN_BACKEND_LOADED ? reason : "no reason given");
}

/* Adds each of the comma-separated `list` to `out` (", "-joined) once. */
static void devinfo_add_names(char *out, size_t size, const char *list) {
  while (list && *list) {
    const char *comma = strchr(list, ',');
    size_t len = comma ? (size_t)(comma - list) : strlen(list);
    bool seen = false;
    for (const char *p = out; *p && !seen;) {
      const char *sep = strstr(p, ", ");
      size_t n = sep ? (size_t)(sep - p) : strlen(p);
      seen = n == len && !strncmp(p, list, len);
      p = sep ? sep + 2 : p + n;
    }
    size_t used = strlen(out);
    if (!seen && len) snprintf(out + used, size - used, "%s%.*s", used ? ", " : "", (int)len, list);
    list = comma ? comma + 1 : NULL;
  }
}

static void devinfo_backend_gather(size_t index, const devinfo_entry_t *entries, size_t count, devinfo_backend_t *out) {
  memset(out, 0, sizeof *out);
  kiln_status_t status = kiln_backend_info(index, &out->info);
  if (status != KILN_OK) {
    devinfo_copy_error(out->error, sizeof out->error, "kiln_backend_info", status);
    return;
  }
  out->ok = true;
  const kiln_backend_info_t *b = &out->info;
  devinfo_explain_reason(b, out->reason, sizeof out->reason);
  const char *path = devinfo_str(b->path);
  out->builtin = !strcmp(path, "builtin");
  /* Not found: the reason lists every path tried; there is no plugin to show. */
  bool not_found = !strncmp(devinfo_str(b->reason), "plugin libkiln-", 15) && strstr(b->reason, " not found; tried: ");
  out->plugin = out->builtin || not_found ? "" : path;
  for (size_t i = 0; i < count; i++) {
    if (!entries[i].ok || strcmp(devinfo_str(entries[i].info.backend), devinfo_str(b->name))) continue;
    out->visible++;
    devinfo_add_names(out->selectors, sizeof out->selectors, entries[i].info.selector);
    for (size_t o = 0; kiln_op_name(o); o++)
      devinfo_add_names(out->providers, sizeof out->providers, kiln_device_providers(entries[i].device, kiln_op_name(o)));
  }
}

static void devinfo_print_backends(FILE *out, const devinfo_entry_t *entries, size_t count) {
  size_t n = 0;
  kiln_status_t status = kiln_backend_count(&n);
  if (status != KILN_OK) {
    fprintf(out, "backends: kiln_backend_count failed (%s): %s\n", kiln_status_name(status), kiln_last_error());
    return;
  }
  fputs("\nBackends:\n", out);
  if (n == 0) fputs("  (none considered: check KILN_BACKEND)\n", out);
  for (size_t i = 0; i < n; i++) {
    devinfo_backend_t v;
    devinfo_backend_gather(i, entries, count, &v);
    if (!v.ok) {
      fprintf(out, "  #%zu: %s\n", i, v.error);
      continue;
    }
    const kiln_backend_info_t *b = &v.info;
    /* The first line says the state and, when it is not loaded, why; the
     * lines below it are labelled, one thing each. */
    if (v.reason[0]) {
      fprintf(out, "  %-7s %-12s %s\n", devinfo_str(b->name), kiln_backend_state_name(b->state), v.reason);
    } else {
      fprintf(out, "  %-7s %s\n", devinfo_str(b->name), kiln_backend_state_name(b->state));
    }
    const char *indent = "                      ";
    const char *version = devinfo_str(b->version);
    if (version[0]) fprintf(out, "%sversion: %s\n", indent, version);
    if (b->state != KILN_BACKEND_UNAVAILABLE && b->state != KILN_BACKEND_ABI_MISMATCH) {
      fprintf(out, "%sdevices: %zu found", indent, b->device_count);
      if (v.visible != b->device_count) fprintf(out, ", %zu visible", v.visible);
      if (v.selectors[0]) fprintf(out, " (%s)", v.selectors);
      if (v.providers[0]) fprintf(out, "; providers: %s", v.providers);
      fputc('\n', out);
    }
    if (v.builtin) fprintf(out, "%sbuilt into libkiln\n", indent);
    else if (v.plugin[0]) fprintf(out, "%splugin: %s\n", indent, v.plugin);
  }
}

/* ---- table ---------------------------------------------------------------- */

/* Devices of type CPU are this machine's processor, whichever backend drives
 * them (kiln's own, PoCL, KILN_CPU_DEVICES splitting it): they share its
 * memory and cores, which the table cannot show by itself. */
static void devinfo_say_shared_cpu(const devinfo_entry_t *entries, size_t count) {
  size_t cpus = 0, seen = 0;
  for (size_t i = 0; i < count; i++) cpus += entries[i].ok && entries[i].info.type == KILN_DEVICE_CPU;
  if (cpus < 2) return;
  char list[512] = "";
  for (size_t i = 0; i < count; i++) {
    if (!entries[i].ok || entries[i].info.type != KILN_DEVICE_CPU) continue;
    size_t used = strlen(list);
    const char *sep = seen == 0 ? "" : seen + 1 == cpus ? " and " : ", ";
    snprintf(list + used, sizeof list - used, "%s%s", sep, devinfo_str(entries[i].info.selector));
    seen++;
  }
  printf("%s are %s this machine's processor: they share its memory and cores (work on one slows the %s).\n",
         list, cpus == 2 ? "both" : "all", cpus == 2 ? "other" : "others");
}

static int devinfo_table(devinfo_entry_t *entries, size_t count) {
  if (count == 0) {
    devinfo_say_no_device(stdout);
  } else {
    /* Column widths follow the longest selector and name, so the table stays
     * aligned whatever the drivers call their devices. IDENTITY appears only
     * when a device has one. */
    int sel_w = (int)strlen("SELECTOR"), name_w = (int)strlen("NAME");
    bool identities = false;
    for (size_t i = 0; i < count; i++) {
      if (!entries[i].ok) continue;
      int sw = (int)strlen(devinfo_str(entries[i].info.selector));
      int nw = (int)strlen(devinfo_str(entries[i].info.name));
      if (sw > sel_w) sel_w = sw;
      if (nw > name_w) name_w = nw;
      identities = identities || devinfo_identity(&entries[i].info)[0];
    }
    if (name_w > 48) name_w = 48;
    printf("  %-*s %-7s %-11s %-*s %10s %5s%s\n", sel_w, "SELECTOR", "BACKEND", "TYPE", name_w, "NAME", "MEMORY",
           "CU", identities ? "  IDENTITY" : "");
    for (size_t i = 0; i < count; i++) {
      const devinfo_entry_t *e = &entries[i];
      if (!e->ok) {
        printf("  #%zu: %s\n", i, e->error);
        continue;
      }
      char memory[32], name[256];
      devinfo_format_bytes(e->info.memory_bytes, memory, sizeof memory);
      devinfo_printable(e->info.name, name, sizeof name);
      char identity[256] = "";
      if (e->same_card_as >= 0) {
        snprintf(identity, sizeof identity, "  same card as %s (%s)", entries[e->same_card_as].info.selector,
                 devinfo_identity(&e->info));
      } else if (identities) {
        snprintf(identity, sizeof identity, "  %s", devinfo_identity(&e->info));
      }
      printf("%c %-*s %-7s %-11s %-*.*s %10s %5" PRIu32 "%s\n", e->info.is_default ? '*' : ' ', sel_w,
             devinfo_str(e->info.selector), devinfo_str(e->info.backend), kiln_device_type_name(e->info.type),
             name_w, name_w, name, memory, e->info.compute_units, identity);
    }
    printf("* marks the default device; paste a SELECTOR into KILN_DEVICE to pick that device.\n");
    printf("CU: compute units (cores of a CPU device, SMs of an NVIDIA GPU, CUs of an AMD one).\n");
    if (identities)
      printf("IDENTITY: the card's UUID or PCI bus id; two rows with the same one are one card seen through two "
             "backends.\n");
    devinfo_say_shared_cpu(entries, count);
  }
  devinfo_print_backends(stdout, entries, count);
  return DEVINFO_EXIT_OK;
}

/* ---- verbose -------------------------------------------------------------- */

/* A value spanning lines (a build log, several warnings) keeps its lines
 * indented under its key, so every line of -v still belongs to one device. */
static void devinfo_kv(const char *key, const char *value) {
  printf("  %s: ", key);
  for (const char *p = value; *p; p++) {
    if (*p == '\n') {
      fputs("\n      ", stdout);
    } else {
      putchar(*p);
    }
  }
  putchar('\n');
}

static void devinfo_kv_u64(const char *key, uint64_t value) { printf("  %s: %" PRIu64 "\n", key, value); }

static void devinfo_kv_bool(const char *key, bool value) { devinfo_kv(key, value ? "yes" : "no"); }

static int devinfo_verbose(devinfo_entry_t *entries, size_t count) {
  if (count == 0) devinfo_say_no_device(stdout);
  for (size_t i = 0; i < count; i++) {
    const devinfo_entry_t *e = &entries[i];
    if (i) putchar('\n');
    if (!e->ok) {
      printf("device %zu:\n  error: %s\n", i, e->error);
      continue;
    }
    const kiln_device_info_t *d = &e->info;
    printf("device %" PRIu32 ": %s%s\n", d->index, devinfo_str(d->selector), d->is_default ? " (default)" : "");
    devinfo_kv_u64("index", d->index);
    devinfo_kv("selector", devinfo_str(d->selector));
    devinfo_kv("backend", devinfo_str(d->backend));
    devinfo_kv_u64("backend_index", d->backend_index);
    devinfo_kv("type", kiln_device_type_name(d->type));
    devinfo_kv("name", devinfo_str(d->name));
    devinfo_kv("vendor", devinfo_str(d->vendor));
    devinfo_kv("driver_version", devinfo_str(d->driver_version));
    devinfo_kv("runtime_version", devinfo_str(d->runtime_version));
    devinfo_kv("platform", devinfo_str(d->platform));
    devinfo_kv("uuid", devinfo_str(d->uuid));
    devinfo_kv("pci_bus_id", devinfo_str(d->pci_bus_id));
    if (e->same_card_as >= 0) devinfo_kv("same_card_as", entries[e->same_card_as].info.selector);
    char human[32];
    devinfo_format_bytes(d->memory_bytes, human, sizeof human);
    printf("  memory: %" PRIu64 " bytes (%s)\n", d->memory_bytes, human);
    devinfo_format_bytes(d->memory_free_bytes, human, sizeof human);
    printf("  memory_free: %" PRIu64 " bytes (%s)%s\n", d->memory_free_bytes, human,
           d->memory_free_is_estimate ? " (estimate)" : "");
    devinfo_format_bytes(d->max_alloc_bytes, human, sizeof human);
    printf("  max_alloc: %" PRIu64 " bytes (%s)\n", d->max_alloc_bytes, human);
    devinfo_format_bytes(d->local_memory_bytes, human, sizeof human);
    printf("  local_memory: %" PRIu64 " bytes (%s)\n", d->local_memory_bytes, human);
    devinfo_kv_u64("compute_units", d->compute_units);
    devinfo_kv_u64("max_work_group_size", d->max_work_group_size);
    devinfo_kv("compute_capability", devinfo_str(d->compute_capability));
    devinfo_kv_bool("fp16", d->fp16);
    devinfo_kv_bool("fp64", d->fp64);
    /* How the device serves each dtype: native, emulated, unsupported. */
    printf("  dtypes:");
    for (int t = 0; t < KILN_DTYPE_COUNT_; t++)
      printf("%s %s %s", t ? "," : "", kiln_dtype_name((kiln_dtype_t)t),
             kiln_dtype_support_name(kiln_device_dtype_support(e->device, (kiln_dtype_t)t)));
    printf("\n");
    devinfo_kv_bool("default", d->is_default);
    size_t props = kiln_device_property_count(e->device);
    bool provider_shown[DEVINFO_MAX_OPS] = {false};
    for (size_t p = 0; p < props; p++) {
      const char *key = NULL, *value = NULL;
      kiln_status_t status = kiln_device_property(e->device, p, &key, &value);
      if (status != KILN_OK) {
        printf("  property %zu: error (%s): %s\n", p, kiln_status_name(status), kiln_last_error());
        continue;
      }
      devinfo_kv(devinfo_str(key), devinfo_str(value));
      /* A backend may list providers among its properties already. */
      for (size_t o = 0; o < DEVINFO_MAX_OPS && kiln_op_name(o); o++) {
        if (key && !strncmp(key, "providers.", 10) && !strcmp(key + 10, kiln_op_name(o))) provider_shown[o] = true;
      }
    }
    for (size_t o = 0; o < DEVINFO_MAX_OPS && kiln_op_name(o); o++) {
      if (provider_shown[o]) continue;
      const char *providers = kiln_device_providers(e->device, kiln_op_name(o));
      printf("  providers.%s: %s\n", kiln_op_name(o), providers ? providers : "(unknown op)");
    }
  }
  devinfo_print_backends(stdout, entries, count);
  return DEVINFO_EXIT_OK;
}

/* ---- JSON ----------------------------------------------------------------- */

/* A JSON string: quotes, backslashes and control characters escaped; bytes
 * that are not valid UTF-8 become U+FFFD so the document always parses. */
static void devinfo_json_string(FILE *out, const char *s) {
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  fputc('"', out);
  while (*p) {
    unsigned char c = *p;
    if (c == '"' || c == '\\') {
      fputc('\\', out);
      fputc(c, out);
      p++;
    } else if (c == '\n') {
      fputs("\\n", out);
      p++;
    } else if (c == '\r') {
      fputs("\\r", out);
      p++;
    } else if (c == '\t') {
      fputs("\\t", out);
      p++;
    } else if (c < 0x20 || c == 0x7f) {
      fprintf(out, "\\u%04x", c);
      p++;
    } else if (c < 0x80) {
      fputc(c, out);
      p++;
    } else {
      int len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
      bool valid = len > 0 && !(c == 0xc0 || c == 0xc1) && c <= 0xf4;
      for (int k = 1; valid && k < len; k++) {
        if ((p[k] & 0xc0) != 0x80) valid = false;
      }
      if (valid) {
        fwrite(p, 1, (size_t)len, out);
        p += len;
      } else {
        fputs("\\ufffd", out);
        p++;
      }
    }
  }
  fputc('"', out);
}

static void devinfo_json_key(FILE *out, const char *key) {
  devinfo_json_string(out, key);
  fputs(": ", out);
}

static void devinfo_json_backends(FILE *out, const devinfo_entry_t *entries, size_t count) {
  size_t n = 0;
  fputs("  \"backends\": [", out);
  if (kiln_backend_count(&n) != KILN_OK) n = 0;
  for (size_t i = 0; i < n; i++) {
    devinfo_backend_t v;
    devinfo_backend_gather(i, entries, count, &v);
    fputs(i ? ",\n    {" : "\n    {", out);
    if (!v.ok) {
      devinfo_json_key(out, "error");
      devinfo_json_string(out, v.error);
      fputc('}', out);
      continue;
    }
    const kiln_backend_info_t *b = &v.info;
    devinfo_json_key(out, "name");
    devinfo_json_string(out, b->name);
    fputs(", ", out);
    devinfo_json_key(out, "status");
    devinfo_json_string(out, kiln_backend_state_name(b->state));
    fputs(", ", out);
    devinfo_json_key(out, "version");
    devinfo_json_string(out, b->version);
    fprintf(out, ", \"device_count\": %zu, \"visible_device_count\": %zu, ", b->device_count, v.visible);
    devinfo_json_key(out, "providers");
    fputc('[', out);
    /* v.providers is "native, clblast": one JSON string per name. */
    size_t at = 0;
    while (v.providers[at]) {
      size_t len = strcspn(v.providers + at, ",");
      char name[64];
      if (len >= sizeof name) len = sizeof name - 1;
      memcpy(name, v.providers + at, len);
      name[len] = '\0';
      if (at) fputs(", ", out);
      devinfo_json_string(out, name);
      at += strcspn(v.providers + at, ",");
      while (v.providers[at] == ',' || v.providers[at] == ' ') at++;
    }
    fputs("], ", out);
    devinfo_json_key(out, "reason");
    devinfo_json_string(out, v.reason);
    fputs(", ", out);
    devinfo_json_key(out, "path");
    devinfo_json_string(out, v.plugin);
    fprintf(out, ", \"builtin\": %s}", v.builtin ? "true" : "false");
  }
  fputs(n ? "\n  ],\n" : "],\n", out);
}

/* A property value that is a plain decimal integer ("2", "49152") is written
 * as a JSON number; everything else stays a string. */
static bool devinfo_is_integer(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 18 || (s[0] == '0' && n > 1)) return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/* Properties as one JSON object. A key a backend reports twice (several
 * "warning" lines, say) is merged into one value joined by newlines, because
 * duplicate keys make JSON that parsers disagree on. */
static void devinfo_json_properties(FILE *out, const kiln_device_t *device) {
  size_t count = kiln_device_property_count(device);
  const char **keys = calloc(count ? count : 1, sizeof *keys);
  const char **values = calloc(count ? count : 1, sizeof *values);
  fputs("\"properties\": {", out);
  if (!keys || !values) {
    free(keys);
    free(values);
    fputs("}", out);
    return;
  }
  for (size_t i = 0; i < count; i++) {
    if (kiln_device_property(device, i, &keys[i], &values[i]) != KILN_OK) keys[i] = NULL;
  }
  bool first = true;
  for (size_t i = 0; i < count; i++) {
    if (!keys[i]) continue;
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = keys[j] && !strcmp(keys[j], keys[i]);
    if (seen) continue;
    if (!first) fputs(", ", out);
    first = false;
    devinfo_json_key(out, keys[i]);
    /* Join repeated values by writing the JSON string by hand, piece by piece. */
    size_t total = 0;
    for (size_t j = i; j < count; j++) {
      if (keys[j] && !strcmp(keys[j], keys[i])) total += strlen(devinfo_str(values[j])) + 1;
    }
    char *joined = malloc(total + 1);
    if (!joined) {
      devinfo_json_string(out, values[i]);
      continue;
    }
    joined[0] = 0;
    size_t used = 0;
    for (size_t j = i; j < count; j++) {
      if (!keys[j] || strcmp(keys[j], keys[i])) continue;
      if (used) joined[used++] = '\n';
      size_t len = strlen(devinfo_str(values[j]));
      memcpy(joined + used, devinfo_str(values[j]), len);
      used += len;
      joined[used] = 0;
    }
    if (devinfo_is_integer(joined)) {
      fputs(joined, out);
    } else {
      devinfo_json_string(out, joined);
    }
    free(joined);
  }
  fputs("}", out);
  free(keys);
  free(values);
}

static int devinfo_json(devinfo_entry_t *entries, size_t count) {
  FILE *out = stdout;
  fputs("{\n  \"version\": ", out);
  devinfo_json_string(out, kiln_version());
  fputs(",\n  \"default\": ", out);
  int default_index = -1;
  for (size_t i = 0; i < count && default_index < 0; i++) {
    if (entries[i].ok && entries[i].info.is_default) default_index = (int)i;
  }
  if (default_index >= 0) {
    fprintf(out, "%d", default_index);
  } else {
    fputs("null", out);
  }
  fputs(",\n", out);
  devinfo_json_backends(out, entries, count);
  fputs("  \"devices\": [", out);
  for (size_t i = 0; i < count; i++) {
    const devinfo_entry_t *e = &entries[i];
    fputs(i ? ",\n    {" : "\n    {", out);
    fprintf(out, "\"index\": %zu, ", i);
    if (!e->ok) {
      devinfo_json_key(out, "error");
      devinfo_json_string(out, e->error);
      fputs(", \"is_default\": false}", out);
      continue;
    }
    const kiln_device_info_t *d = &e->info;
#define DEVINFO_JSON_STR_(key, value) \
  do {                                \
    devinfo_json_key(out, key);       \
    devinfo_json_string(out, value);  \
    fputs(", ", out);                 \
  } while (0)
    DEVINFO_JSON_STR_("selector", d->selector);
    DEVINFO_JSON_STR_("backend", d->backend);
    fprintf(out, "\"backend_index\": %" PRIu32 ", ", d->backend_index);
    DEVINFO_JSON_STR_("type", kiln_device_type_name(d->type));
    DEVINFO_JSON_STR_("name", d->name);
    DEVINFO_JSON_STR_("vendor", d->vendor);
    DEVINFO_JSON_STR_("driver_version", d->driver_version);
    DEVINFO_JSON_STR_("runtime_version", d->runtime_version);
    DEVINFO_JSON_STR_("platform", d->platform);
    DEVINFO_JSON_STR_("uuid", d->uuid);
    DEVINFO_JSON_STR_("pci_bus_id", d->pci_bus_id);
    DEVINFO_JSON_STR_("compute_capability", d->compute_capability);
#undef DEVINFO_JSON_STR_
    fputs("\"same_card_as\": ", out);
    if (e->same_card_as >= 0) {
      devinfo_json_string(out, entries[e->same_card_as].info.selector);
    } else {
      fputs("null", out);
    }
    fprintf(out,
            ", \"memory_bytes\": %" PRIu64 ", \"memory_free_bytes\": %" PRIu64
            ", \"memory_free_is_estimate\": %s, \"max_alloc_bytes\": %" PRIu64
            ", \"local_memory_bytes\": %" PRIu64 ", \"compute_units\": %" PRIu32
            ", \"max_work_group_size\": %" PRIu32 ", \"fp16\": %s, \"fp64\": %s, \"is_default\": %s,\n     ",
            d->memory_bytes, d->memory_free_bytes, d->memory_free_is_estimate ? "true" : "false",
            d->max_alloc_bytes, d->local_memory_bytes, d->compute_units, d->max_work_group_size,
            d->fp16 ? "true" : "false", d->fp64 ? "true" : "false", d->is_default ? "true" : "false");
    devinfo_json_properties(out, e->device);
    fputs(",\n     \"dtypes\": {", out);
    for (int t = 0; t < KILN_DTYPE_COUNT_; t++) {
      if (t) fputs(", ", out);
      devinfo_json_key(out, kiln_dtype_name((kiln_dtype_t)t));
      devinfo_json_string(out, kiln_dtype_support_name(kiln_device_dtype_support(e->device, (kiln_dtype_t)t)));
    }
    fputs("},\n     \"providers\": {", out);
    for (size_t o = 0; kiln_op_name(o); o++) {
      const char *providers = kiln_device_providers(e->device, kiln_op_name(o));
      if (o) fputs(", ", out);
      devinfo_json_key(out, kiln_op_name(o));
      if (providers) {
        devinfo_json_string(out, providers);
      } else {
        fputs("null", out);
      }
    }
    fputs("}}", out);
  }
  fputs(count ? "\n  ]\n}\n" : "]\n}\n", out);
  return DEVINFO_EXIT_OK;
}

/* ---- check ---------------------------------------------------------------- */

static int devinfo_check(devinfo_entry_t *entries, size_t count) {
  if (count == 0) {
    devinfo_say_no_device(stdout);
    printf("FAIL: there is no device to check\n");
    return DEVINFO_EXIT_CHECK_FAILED;
  }
  size_t failed = 0;
  for (size_t i = 0; i < count; i++) {
    devinfo_entry_t *e = &entries[i];
    if (!e->device) {
      printf("#%zu: FAIL: %s\n", i, e->error);
      failed++;
      continue;
    }
    const char *label = e->ok ? kiln_device_name(e->device) : kiln_device_selector(e->device);
    /* The line is printed whole once the check is done, so that a note on
     * stderr meanwhile (a first build of OpenCL kernels) does not split it. */
    kiln_status_t status = kiln_device_check(e->device);
    printf("%s: ", devinfo_str(label));
    if (status == KILN_OK) {
      printf("PASS\n");
    } else {
      printf("FAIL: %s: %s\n", kiln_status_name(status), kiln_last_error());
      failed++;
    }
    fflush(stdout);
  }
  printf("%zu of %zu device%s passed\n", count - failed, count, count == 1 ? "" : "s");
  return failed ? DEVINFO_EXIT_CHECK_FAILED : DEVINFO_EXIT_OK;
}

/* ---- the first build ------------------------------------------------------ */

/* The first computation on an OpenCL device compiles kiln's kernels (up to
 * tens of seconds on PoCL), and kiln says so only in its log. devinfo listens
 * at info level for the line that starts a build and tells its user, once
 * per device, why it waits; every other line goes out only at the level the
 * user asked for (KILN_LOG), as kiln would print it. */
static kiln_log_level_t devinfo_user_level = KILN_LOG_OFF;
static char devinfo_announced[16][160];
static size_t devinfo_announced_count;

static const char *devinfo_level_text(kiln_log_level_t level) {
  switch (level) {
    case KILN_LOG_ERROR: return "error";
    case KILN_LOG_WARN: return "warn";
    case KILN_LOG_INFO: return "info";
    case KILN_LOG_DEBUG: return "debug";
    default: return "off";
  }
}

static void devinfo_log(kiln_log_level_t level, const char *message, void *user) {
  const char *mark = strstr(message, ": building OpenCL kernels: ");
  if (mark && (size_t)(mark - message) < sizeof devinfo_announced[0]) {
    int len = (int)(mark - message);
    bool seen = false;
    for (size_t i = 0; i < devinfo_announced_count && !seen; i++)
      seen = (int)strlen(devinfo_announced[i]) == len && !strncmp(devinfo_announced[i], message, (size_t)len);
    if (!seen) {
      if (devinfo_announced_count < sizeof devinfo_announced / sizeof devinfo_announced[0])
        snprintf(devinfo_announced[devinfo_announced_count++], sizeof devinfo_announced[0], "%.*s", len, message);
      fprintf(stderr, "%s: building OpenCL kernels for %.*s (first run; cached afterwards)\n", (const char *)user,
              len, message);
    }
  }
  if (level <= devinfo_user_level) fprintf(stderr, "kiln: %s: %s\n", devinfo_level_text(level), message);
}

/* ---- main ----------------------------------------------------------------- */

typedef enum devinfo_mode_t { DEVINFO_TABLE, DEVINFO_VERBOSE, DEVINFO_JSON, DEVINFO_CHECK } devinfo_mode_t;

int main(int argc, char **argv) {
  devinfo_mode_t mode = DEVINFO_TABLE;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    devinfo_mode_t next;
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      devinfo_usage(stdout);
      return DEVINFO_EXIT_OK;
    } else if (!strcmp(arg, "--version")) {
      printf("devinfo (kiln %s)\n", kiln_version());
      return DEVINFO_EXIT_OK;
    } else if (!strcmp(arg, "-v") || !strcmp(arg, "--verbose")) {
      next = DEVINFO_VERBOSE;
    } else if (!strcmp(arg, "--json")) {
      next = DEVINFO_JSON;
    } else if (!strcmp(arg, "--check")) {
      next = DEVINFO_CHECK;
    } else {
      fprintf(stderr, "devinfo: unknown option '%s'\n\n", arg);
      devinfo_usage(stderr);
      return DEVINFO_EXIT_START_FAILED;
    }
    if (mode != DEVINFO_TABLE && mode != next) {
      fprintf(stderr, "devinfo: choose one of -v, --json and --check (got '%s' after another)\n", arg);
      return DEVINFO_EXIT_START_FAILED;
    }
    mode = next;
  }

  kiln_status_t status = kiln_ensure_initialized();
  size_t count = 0;
  if (status == KILN_OK) status = kiln_device_count(&count);
  if (status != KILN_OK) {
    fprintf(stderr, "devinfo: kiln failed to start (%s): %s\n", kiln_status_name(status), kiln_last_error());
    return DEVINFO_EXIT_START_FAILED;
  }

  devinfo_user_level = kiln_log_level();
  if (devinfo_user_level < KILN_LOG_INFO) kiln_log_set_level(KILN_LOG_INFO);
  kiln_log_set_callback(devinfo_log, "devinfo");

  devinfo_entry_t *entries = devinfo_gather(count);
  if (!entries) {
    fprintf(stderr, "devinfo: out of host memory listing %zu devices\n", count);
    return DEVINFO_EXIT_START_FAILED;
  }
  int rc = DEVINFO_EXIT_OK;
  switch (mode) {
    case DEVINFO_TABLE: rc = devinfo_table(entries, count); break;
    case DEVINFO_VERBOSE: rc = devinfo_verbose(entries, count); break;
    case DEVINFO_JSON: rc = devinfo_json(entries, count); break;
    case DEVINFO_CHECK: rc = devinfo_check(entries, count); break;
  }
  fflush(stdout);
  free(entries);
  kiln_deinitialize();
  return rc;
}
