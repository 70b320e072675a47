/* runtime/device.c: a device's life (its op table, memory pool and queues) and the public device and backend queries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

/* Keys of the per-op providers properties, one per op kind. */
static const char *const provider_keys[KILN_OP_COUNT] = {
#define PROVIDER_KEY_(NAME, name, launch) "providers." #name,
    KILN_OP_KINDS(PROVIDER_KEY_)
#undef PROVIDER_KEY_
};

/* ---- attach / detach ------------------------------------------------------------ */

static _Atomic uint64_t next_serial = 1;

/* The device's op table: for each kind, the backend's rows that can serve it
 * here (supports(device, NULL)), native first, then the others in the
 * backend's order; and their names for listings. */
static kiln_status_t op_table_build(kiln_device_t *device) {
  const kiln_backend_iface_t *iface = device->iface;
  for (int k = 0; k < KILN_OP_COUNT; k++) {
    uint32_t n = 0;
    for (size_t r = 0; iface->ops[r].run; r++) n += iface->ops[r].kind == (kiln_op_kind_t)k;
    kiln__op_row_t *rows = calloc(n ? n : 1, sizeof *rows);
    if (!rows)
      return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory building the op table of %s",
                             device->display_name);
    uint32_t used = 0;
    /* Two passes: native, then vendors. */
    for (int pass = 0; pass < 2; pass++) {
      for (size_t r = 0; iface->ops[r].run; r++) {
        const kiln_op_entry_t *e = &iface->ops[r];
        if (e->kind != (kiln_op_kind_t)k) continue;
        bool native = !strcmp(e->provider, KILN_PROVIDER_NATIVE_NAME);
        if (native != (pass == 0)) continue;
        if (!native && e->supports && !e->supports(device->ctx, device->impl, e, NULL)) continue;
        rows[used].entry = e;
        rows[used].provider = kiln__provider_intern(e->provider);
        atomic_init(&rows[used].disabled, false);
        used++;
      }
    }
    device->rows[k] = rows;
    device->row_count[k] = used;
    size_t at = 0;
    device->providers_text[k][0] = '\0';
    for (uint32_t i = 0; i < used; i++) {
      int w = snprintf(device->providers_text[k] + at, sizeof device->providers_text[k] - at, "%s%s", i ? "," : "",
                       rows[i].entry->provider);
      if (w < 0 || (size_t)w >= sizeof device->providers_text[k] - at) break;
      at += (size_t)w;
    }
  }
  return KILN_OK;
}

static void op_table_free(kiln_device_t *device) {
  for (int k = 0; k < KILN_OP_COUNT; k++) {
    free(device->rows[k]);
    device->rows[k] = NULL;
    device->row_count[k] = 0;
  }
}

kiln_status_t kiln__device_attach(kiln_device_t *device) {
  if (!device) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln__device_attach: device is NULL");
  device->serial = atomic_fetch_add_explicit(&next_serial, 1, memory_order_relaxed);
  atomic_init(&device->override_warned, 0);
  /* What the device serves is asked once: every op checks it. */
  device->dtypes_served = 0;
  for (int d = 0; d < KILN_DTYPE_COUNT_; d++)
    if (kiln__device_dtype_support(device, (kiln_dtype_t)d) != KILN_DTYPE_UNSUPPORTED) device->dtypes_served |= 1u << d;
  kiln_status_t status = op_table_build(device);
  if (status != KILN_OK) {
    op_table_free(device);
    return status;
  }
  kiln__pool_init(device, kiln__queue_done_since);
  status = kiln__queues_attach(device);
  if (status != KILN_OK) {
    kiln__queues_detach(device);
    kiln__pool_destroy(device);
    op_table_free(device);
  }
  return status;
}

void kiln__device_detach(kiln_device_t *device) {
  if (!device || !device->default_queue) return;
  kiln__device_finish_all(device);
  kiln__queues_detach(device);
  kiln__pool_destroy(device);
  op_table_free(device);
}

/* Whether a handle is one of the devices kiln lists now: a stale handle from
 * before kiln_deinitialize is refused instead of dereferenced. */
static bool device_known(const kiln_device_t *device) {
  for (size_t i = 0; i < kiln__rt.device_count; i++)
    if (kiln__rt.devices[i] == device) return true;
  return false;
}

static kiln_status_t device_check_arg(const char *call, const kiln_device_t *device) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!device) return kiln__set_error(KILN_INVALID_ARGUMENT, "%s: device is NULL; get one from kiln_device_get", call);
  if (!device_known(device))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "%s: %p is not a device of this kiln (released by kiln_deinitialize?); get one "
                           "from kiln_device_get",
                           call, (const void *)device);
  return KILN_OK;
}

/* "cpu:0, opencl:0" for messages. */
static void visible_list(char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < kiln__rt.device_count && used < size; i++) {
    int n = snprintf(out + used, size - used, "%s%s", i ? ", " : "", kiln__rt.devices[i]->selector);
    if (n < 0) break;
    used += (size_t)n;
  }
  if (!kiln__rt.device_count) snprintf(out, size, "none (check KILN_BACKEND and KILN_DEVICE)");
}

kiln_status_t kiln_device_count(size_t *out_count) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!out_count) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_count: out_count is NULL");
  *out_count = kiln__rt.device_count;
  return KILN_OK;
}

kiln_status_t kiln_device_get(size_t index, kiln_device_t **out_device) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!out_device) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_get: out_device is NULL");
  if (index >= kiln__rt.device_count)
    return kiln__set_error(KILN_NOT_FOUND, "kiln_device_get(%zu): there are %zu visible devices; use an index below %zu "
                           "(kiln_device_count)",
                           index, kiln__rt.device_count, kiln__rt.device_count);
  *out_device = kiln__rt.devices[index];
  return KILN_OK;
}

kiln_status_t kiln_device_default(kiln_device_t **out_device) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!out_device) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_default: out_device is NULL");
  if (!kiln__rt.default_device)
    return kiln__set_error(KILN_NOT_FOUND,
                           "no device is visible: KILN_BACKEND and KILN_DEVICE excluded every device; run "
                           "devinfo to see what exists");
  *out_device = kiln__rt.default_device;
  return KILN_OK;
}

kiln_status_t kiln_device_find(const char *selector, kiln_device_t **out_device) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!selector || !out_device)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_find: selector (%p) or out_device (%p) is NULL",
                           (const void *)selector, (void *)out_device);
  /* A bare word is shorthand: a type ("gpu", "accelerator") for every
   * backend, else a backend ("cpu", "opencl") with any device, the same
   * readings KILN_DEVICE's hints give ('*:gpu', 'opencl:*'). */
  char text[96];
  if (!strchr(selector, ':') && !strchr(selector, ';') && selector[0] && selector[0] != '!' &&
      strlen(selector) < 40) {
    if (!strcmp(selector, "gpu") || !strcmp(selector, "accelerator"))
      snprintf(text, sizeof text, "*:%s", selector);
    else
      snprintf(text, sizeof text, "%s:*", selector);
  } else {
    if (strlen(selector) >= sizeof text)
      return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_find: selector \"%.40s...\" is too long for one "
                             "term; use backend:device, e.g. \"cuda:0\"", selector);
    strcpy(text, selector);
  }
  kiln__selector_t parsed;
  status = kiln__selector_parse(text, &parsed);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_device_find(\"%s\")", selector);
  if (parsed.count != 1 || parsed.terms[0].discard)
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_device_find(\"%s\"): give one term that names one device, such as \"cuda:0\", "
                           "\"opencl:gpu\" or \"cpu\" (no ';', ',' or '!')",
                           selector);
  for (size_t i = 0; i < kiln__rt.device_count; i++) {
    kiln_device_t *d = kiln__rt.devices[i];
    if (kiln__selector_accepts(&parsed, d->backend->name, d->desc.type, d->backend_index)) {
      *out_device = d;
      return KILN_OK;
    }
  }
  char list[1024];
  visible_list(list, sizeof list);
  const char *backend = parsed.terms[0].backend;
  bool known = !strcmp(backend, "*");
  for (size_t i = 0; i < kiln__rt.backend_count && !known; i++) known = !strcmp(kiln__rt.backends[i].name, backend);
  if (!known) {
    char names[512];
    size_t used = 0;
    names[0] = '\0';
    for (size_t i = 0; i < kiln__rt.backend_count && used < sizeof names; i++) {
      int n = snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", kiln__rt.backends[i].name);
      if (n < 0) break;
      used += (size_t)n;
    }
    return kiln__set_error(KILN_NOT_FOUND,
                           "kiln_device_find(\"%s\"): kiln has no backend '%s' (its backends: %s); visible devices: "
                           "%s", selector, backend, names, list);
  }
  return kiln__set_error(KILN_NOT_FOUND, "kiln_device_find(\"%s\"): no visible device matches; visible: %s", selector,
                         list);
}

kiln_device_t *kiln_try_gpu(size_t i) {
  if (kiln__ensure() != KILN_OK) return NULL;
  size_t seen = 0;
  for (size_t d = 0; d < kiln__rt.device_count; d++) {
    if (kiln__rt.devices[d]->desc.type != KILN_DEVICE_GPU) continue;
    if (seen++ == i) return kiln__rt.devices[d];
  }
  for (size_t d = 0; d < kiln__rt.device_count; d++)
    if (kiln__rt.devices[d]->desc.type == KILN_DEVICE_CPU) return kiln__rt.devices[d];
  return kiln__rt.default_device;
}

kiln_status_t kiln_try_all_gpus(kiln_device_t **out_devices, size_t capacity, size_t *out_count) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!out_count || (!out_devices && capacity))
    return kiln__set_error(KILN_INVALID_ARGUMENT,
                           "kiln_try_all_gpus: out_count (%p) is NULL, or out_devices is NULL with capacity %zu",
                           (void *)out_count, capacity);
  size_t n = 0;
  for (size_t d = 0; d < kiln__rt.device_count; d++) {
    if (kiln__rt.devices[d]->desc.type != KILN_DEVICE_GPU) continue;
    if (n < capacity) out_devices[n] = kiln__rt.devices[d];
    n++;
  }
  if (n == 0) {
    kiln_device_t *cpu = kiln_try_gpu(0);
    if (!cpu)
      return kiln__set_error(KILN_NOT_FOUND, "kiln_try_all_gpus: no GPU and no CPU device is visible; check "
                             "KILN_BACKEND and KILN_DEVICE");
    if (capacity) out_devices[0] = cpu;
    n = 1;
  }
  *out_count = n;
  return KILN_OK;
}

kiln_device_t *kiln_device_retain(kiln_device_t *device) { return device; }

void kiln_device_release(kiln_device_t *device) { (void)device; }

kiln_status_t kiln_device_info(const kiln_device_t *device, kiln_device_info_t *out_info) {
  kiln_status_t status = device_check_arg("kiln_device_info", device);
  if (status != KILN_OK) return status;
  if (!out_info) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_info: out_info is NULL");
  const kiln_backend_device_desc_t *desc = &device->desc;
  kiln_device_info_t info;
  memset(&info, 0, sizeof info);
  info.index = device->index;
  info.selector = device->selector;
  info.backend = device->backend->name;
  info.backend_index = device->backend_index;
  info.type = desc->type;
  info.name = desc->name;
  info.vendor = desc->vendor;
  info.driver_version = desc->driver_version;
  info.runtime_version = desc->runtime_version;
  info.platform = desc->platform;
  info.uuid = desc->uuid;
  info.pci_bus_id = desc->pci_bus_id;
  info.memory_bytes = desc->memory_bytes;
  info.memory_free_bytes = desc->memory_bytes;
  info.memory_free_is_estimate = true;
  if (device->iface->device_memory_free) {
    uint64_t free_bytes = 0;
    if (device->iface->device_memory_free(device->ctx, device->impl, &free_bytes) == KILN_OK) {
      info.memory_free_bytes = free_bytes;
      info.memory_free_is_estimate = desc->memory_free_is_estimate;
    } else {
      /* The query failing is no reason to fail the whole info call. */
      kiln_clear_error();
    }
  }
  info.max_alloc_bytes = desc->max_alloc_bytes;
  info.local_memory_bytes = desc->local_memory_bytes;
  info.compute_units = desc->compute_units;
  info.max_work_group_size = desc->max_work_group_size;
  info.compute_capability = desc->compute_capability;
  info.fp16 = desc->fp16;
  info.fp64 = desc->fp64;
  info.is_default = device->is_default;
  *out_info = info;
  return KILN_OK;
}

const char *kiln_device_selector(const kiln_device_t *device) { return device ? device->selector : ""; }

const char *kiln_device_name(const kiln_device_t *device) { return device ? device->display_name : "(no device)"; }

/* Op kinds with a provider beyond native: each is one "providers.<op>"
 * property after the backend's own (kiln_device_providers lists any kind). */
static bool has_vendor_provider(const kiln_device_t *device, int kind) { return device->row_count[kind] > 1; }

size_t kiln_device_property_count(const kiln_device_t *device) {
  if (!device || kiln__ensure() != KILN_OK || !device_known(device)) return 0;
  size_t n = device->desc.property_count;
  for (int k = 0; k < KILN_OP_COUNT; k++) n += has_vendor_provider(device, k);
  return n;
}

kiln_status_t kiln_device_property(const kiln_device_t *device, size_t i, const char **out_key,
                                   const char **out_value) {
  kiln_status_t status = device_check_arg("kiln_device_property", device);
  if (status != KILN_OK) return status;
  if (!out_key || !out_value)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_property: out_key (%p) or out_value (%p) is NULL",
                           (void *)out_key, (void *)out_value);
  if (i < device->desc.property_count) {
    *out_key = device->desc.properties[i].key;
    *out_value = device->desc.properties[i].value;
    return KILN_OK;
  }
  size_t j = i - device->desc.property_count;
  for (int k = 0; k < KILN_OP_COUNT; k++) {
    if (!has_vendor_provider(device, k)) continue;
    if (j-- == 0) {
      *out_key = provider_keys[k];
      *out_value = device->providers_text[k];
      return KILN_OK;
    }
  }
  return kiln__set_error(KILN_NOT_FOUND, "kiln_device_property(%s, %zu): the device has %zu properties", device->selector,
                         i, kiln_device_property_count(device));
}

const char *kiln_device_providers(const kiln_device_t *device, const char *op) {
  if (!device || !op || kiln__ensure() != KILN_OK || !device_known(device)) return NULL;
  int kind = kiln__op_kind_lookup(op);
  if (kind < 0) return NULL;
  return device->providers_text[kind];
}

kiln_status_t kiln_device_memory_stats(const kiln_device_t *device, kiln_memory_stats_t *out_stats) {
  kiln_status_t status = device_check_arg("kiln_device_memory_stats", device);
  if (status != KILN_OK) return status;
  if (!out_stats) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_memory_stats: out_stats is NULL");
  kiln__pool_t *pool = (kiln__pool_t *)&device->pool;
  pthread_mutex_lock(&pool->lock);
  out_stats->in_use_bytes = pool->live_bytes;
  out_stats->pooled_bytes = pool->pooled_bytes;
  out_stats->peak_bytes = pool->peak_bytes;
  out_stats->allocations = pool->allocations;
  pthread_mutex_unlock(&pool->lock);
  return KILN_OK;
}

kiln_status_t kiln_device_memory_reset_peak(kiln_device_t *device) {
  kiln_status_t status = device_check_arg("kiln_device_memory_reset_peak", device);
  if (status != KILN_OK) return status;
  pthread_mutex_lock(&device->pool.lock);
  device->pool.peak_bytes = device->pool.live_bytes;
  pthread_mutex_unlock(&device->pool.lock);
  return KILN_OK;
}

const char *kiln_device_type_name(kiln_device_type_t type) {
  switch (type) {
    case KILN_DEVICE_CPU: return "cpu";
    case KILN_DEVICE_GPU: return "gpu";
    case KILN_DEVICE_ACCELERATOR: return "accelerator";
    case KILN_DEVICE_OTHER: return "other";
  }
  return "other";
}

kiln_status_t kiln_backend_count(size_t *out_count) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!out_count) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_backend_count: out_count is NULL");
  *out_count = kiln__rt.backend_count;
  return KILN_OK;
}

kiln_status_t kiln_backend_info(size_t index, kiln_backend_info_t *out_info) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!out_info) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_backend_info: out_info is NULL");
  if (index >= kiln__rt.backend_count)
    return kiln__set_error(KILN_NOT_FOUND, "kiln_backend_info(%zu): kiln considered %zu backends; use an index below %zu",
                           index, kiln__rt.backend_count, kiln__rt.backend_count);
  *out_info = kiln__rt.backends[index].info;
  return KILN_OK;
}

const char *kiln_backend_state_name(kiln_backend_state_t state) {
  switch (state) {
    case KILN_BACKEND_LOADED: return "loaded";
    case KILN_BACKEND_NO_DEVICE: return "no device";
    case KILN_BACKEND_UNAVAILABLE: return "unavailable";
    case KILN_BACKEND_ABI_MISMATCH: return "abi mismatch";
  }
  return "unknown";
}
