/* backends/cpu/device.c: the CPU backend's devices (the machine's cores split KILN_CPU_DEVICES ways), buffers and interface table. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "backends/cpu/cpu_backend.h"

/* ---- what the machine is -------------------------------------------------------- */

static void trim(char *s) {
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
  size_t lead = strspn(s, " \t");
  if (lead) memmove(s, s + lead, strlen(s + lead) + 1);
}

/* The value of the first "key<spaces>: value" line of a /proc file. */
static bool proc_field(const char *path, const char *key, char *out, size_t size) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char line[1024];
  bool found = false;
  const size_t klen = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, klen) != 0) continue;
    const char *p = line + klen;
    while (*p == ' ' || *p == '\t') p++;
    if (*p != ':') continue;
    snprintf(out, size, "%s", p + 1);
    trim(out);
    found = true;
    break;
  }
  fclose(f);
  return found;
}

static void read_cpu_identity(kiln_backend_context_t *ctx) {
  struct utsname u;
  bool have_uname = uname(&u) == 0;
  if (!proc_field("/proc/cpuinfo", "model name", ctx->model, sizeof ctx->model) || !ctx->model[0]) {
    /* Some architectures have no "model name" line. */
    if (!proc_field("/proc/cpuinfo", "Model", ctx->model, sizeof ctx->model) || !ctx->model[0])
      snprintf(ctx->model, sizeof ctx->model, "%s %s CPU", have_uname ? u.sysname : "unknown",
               have_uname ? u.machine : "");
  }
  char vendor_id[128] = "";
  if (proc_field("/proc/cpuinfo", "vendor_id", vendor_id, sizeof vendor_id) ||
      proc_field("/proc/cpuinfo", "CPU implementer", vendor_id, sizeof vendor_id)) {
    if (!strcmp(vendor_id, "AuthenticAMD"))
      snprintf(ctx->vendor, sizeof ctx->vendor, "AMD");
    else if (!strcmp(vendor_id, "GenuineIntel"))
      snprintf(ctx->vendor, sizeof ctx->vendor, "Intel");
    else
      snprintf(ctx->vendor, sizeof ctx->vendor, "%s", vendor_id);
  } else {
    snprintf(ctx->vendor, sizeof ctx->vendor, "unknown");
  }
}

static uint64_t physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return (uint64_t)pages * (uint64_t)page;
}

/* MemAvailable: what the kernel says can be allocated without swapping. */
static bool mem_available(uint64_t *out_bytes) {
  char value[128];
  if (!proc_field("/proc/meminfo", "MemAvailable", value, sizeof value)) return false;
  char *end = NULL;
  unsigned long long kb = strtoull(value, &end, 10);
  if (end == value) return false;
  *out_bytes = (uint64_t)kb * 1024u;
  return true;
}

static void isa_string(char *out, size_t size) {
  out[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  static const char *const names[] = {"sse4.2", "avx", "avx2", "fma", "avx512f"};
  const int have[] = {__builtin_cpu_supports("sse4.2"), __builtin_cpu_supports("avx"),
                      __builtin_cpu_supports("avx2"), __builtin_cpu_supports("fma"),
                      __builtin_cpu_supports("avx512f")};
  size_t used = 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!have[i]) continue;
    int n = snprintf(out + used, size - used, "%s%s", used ? " " : "", names[i]);
    if (n < 0 || (size_t)n >= size - used) break;
    used += (size_t)n;
  }
  if (!used) snprintf(out, size, "x86-64 baseline");
#elif defined(__aarch64__)
  snprintf(out, size, "aarch64 neon");
#else
  snprintf(out, size, "portable C");
#endif
}

/* "0-3,8,10-11" */
static void cpu_list(const int *ids, int n, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && ids[j + 1] == ids[j] + 1) j++;
    int w = j > i ? snprintf(out + used, size - used, "%s%d-%d", used ? "," : "", ids[i], ids[j])
                  : snprintf(out + used, size - used, "%s%d", used ? "," : "", ids[i]);
    if (w < 0 || (size_t)w >= size - used) break;
    used += (size_t)w;
    i = j + 1;
  }
}

/* ---- lifetime --------------------------------------------------------------------- */

static void cpu_deinitialize(kiln_backend_context_t *ctx) {
  if (!ctx) return;
  for (size_t i = 0; i < ctx->device_count; i++) kiln_cpu_thread_pool_destroy(ctx->devices[i].thread_pool);
  free(ctx->devices);
  free(ctx);
}

/* KILN_CPU_DEVICES as the core validated it (1 when unset). */
static int device_count_setting(const kiln_host_t *host) {
  const char *text = host->setting ? host->setting("KILN_CPU_DEVICES") : NULL;
  int count = text ? atoi(text) : 1;
  return count >= 1 ? count : 1;
}

static kiln_status_t cpu_initialize(const kiln_host_t *host, kiln_backend_context_t **out_ctx) {
  kiln_backend_context_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return host->set_error(KILN_OUT_OF_MEMORY, "cannot allocate the CPU backend's state");
  ctx->host = *host;
  cpu_set_t usable;
  CPU_ZERO(&usable);
  int ids[CPU_SETSIZE];
  int ncpu = 0;
  if (sched_getaffinity(0, sizeof usable, &usable) == 0) {
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &usable)) ids[ncpu++] = c;
  }
  if (ncpu == 0) {
    /* No affinity information: take the online CPUs, unpinned. */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    ncpu = online > 0 ? (int)(online < CPU_SETSIZE ? online : CPU_SETSIZE) : 1;
    for (int c = 0; c < ncpu; c++) ids[c] = c;
  }
  ctx->usable_cpus = ncpu;
  read_cpu_identity(ctx);

  const int count = device_count_setting(host);
  ctx->devices = calloc((size_t)count, sizeof *ctx->devices);
  if (!ctx->devices) {
    free(ctx);
    return host->set_error(KILN_OUT_OF_MEMORY, "cannot allocate %d CPU devices (%zu bytes each)", count,
                           sizeof *ctx->devices);
  }
  const uint64_t memory = physical_memory();
  for (int d = 0; d < count; d++) {
    kiln_backend_device_t *dev = &ctx->devices[d];
    dev->ctx = ctx;
    dev->index = (size_t)d;
    dev->memory_bytes = memory;
    /* Contiguous shares of the usable CPUs; with more devices than CPUs,
     * each device gets one thread and devices share CPUs. */
    int first, n;
    if (count <= ncpu) {
      first = (int)((int64_t)d * ncpu / count);
      n = (int)((int64_t)(d + 1) * ncpu / count) - first;
    } else {
      first = d % ncpu;
      n = 1;
    }
    dev->threads = n;
    CPU_ZERO(&dev->cpus);
    for (int i = 0; i < n; i++) {
      dev->cpu_ids[i] = ids[first + i];
      CPU_SET(ids[first + i], &dev->cpus);
    }
    dev->thread_pool = kiln_cpu_thread_pool_create(n, dev->cpu_ids);
    if (!dev->thread_pool) {
      ctx->device_count = (size_t)d;
      cpu_deinitialize(ctx);
      return host->set_error(KILN_OUT_OF_RESOURCES,
                             "cannot start the %d-thread thread pool of cpu:%d (out of memory or threads); "
                             "lower KILN_CPU_DEVICES or raise the process's thread limit",
                             n, d);
    }
    dev->par.parallel_for = kiln_cpu_thread_pool_par;
    dev->par.team = dev->thread_pool;
    dev->par.threads = n;
  }
  ctx->device_count = (size_t)count;
  *out_ctx = ctx;
  return KILN_OK;
}

static size_t cpu_device_count(kiln_backend_context_t *ctx) { return ctx->device_count; }

/* ---- description ----------------------------------------------------------------- */

static kiln_status_t cpu_device_describe(kiln_backend_context_t *ctx, size_t index, kiln_backend_device_desc_t *out_desc) {
  kiln_backend_device_t *dev = &ctx->devices[index];
  kiln_backend_device_desc_t *d = out_desc;
  memset(d, 0, sizeof *d);
  d->impl = dev;
  d->type = KILN_DEVICE_CPU;
  snprintf(d->name, sizeof d->name, "%s", ctx->model);
  snprintf(d->vendor, sizeof d->vendor, "%s", ctx->vendor);
  struct utsname u;
  if (uname(&u) == 0) snprintf(d->runtime_version, sizeof d->runtime_version, "%.40s %.80s", u.sysname, u.release);
  d->memory_bytes = dev->memory_bytes;
  d->max_alloc_bytes = dev->memory_bytes;
  long l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  d->local_memory_bytes = l1d > 0 ? (uint64_t)l1d : 0;
  d->compute_units = (uint32_t)dev->threads;
  d->fp16 = false;
  d->fp64 = true;
  d->memory_free_is_estimate = false;

  char buf[512];
  kiln_backend_add_property(d, "threads", "%d", dev->threads);
  cpu_list(dev->cpu_ids, dev->threads, buf, sizeof buf);
  kiln_backend_add_property(d, "cpu_ids", "%s", buf);
  isa_string(buf, sizeof buf);
  kiln_backend_add_property(d, "isa", "%s", buf);
  kiln_backend_add_property(d, "blas", "%s",
               kiln_cpu_blas_available() ? "yes (provider 'blas' for matmul and conv2d)"
                                         : "no (kiln was built without a CBLAS)");
  if (ctx->device_count > 1)
    kiln_backend_add_property(d, "memory_shared", "yes: the %zu CPU devices share the machine's physical memory",
                 ctx->device_count);
  else
    kiln_backend_add_property(d, "memory_shared", "yes: the CPU device's memory is the machine's physical memory");
  kiln_backend_add_property(d, "usable_cpus", "%d (sched_getaffinity), split among %zu CPU device%s", ctx->usable_cpus,
               ctx->device_count, ctx->device_count == 1 ? "" : "s");
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l1d > 0) kiln_backend_add_property(d, "l1d_cache_bytes", "%ld", l1d);
  if (l2 > 0) kiln_backend_add_property(d, "l2_cache_bytes", "%ld", l2);
  if (l3 > 0) kiln_backend_add_property(d, "l3_cache_bytes", "%ld", l3);
  kiln_backend_add_property(d, "queues", "asynchronous: one worker thread per queue");
  return KILN_OK;
}

static kiln_status_t cpu_device_memory_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                            uint64_t *out_bytes) {
  if (mem_available(out_bytes)) return KILN_OK;
  struct sysinfo si;
  if (sysinfo(&si) == 0) {
    *out_bytes = ((uint64_t)si.freeram + (uint64_t)si.bufferram) * si.mem_unit;
    return KILN_OK;
  }
  return ctx->host.set_error(KILN_UNAVAILABLE,
                                 "cannot read free memory: /proc/meminfo has no MemAvailable and sysinfo failed "
                                 "(%s)",
                                 strerror(errno));
}

/* ---- buffers ----------------------------------------------------------------------- */

static kiln_status_t cpu_buffer_allocate(kiln_backend_context_t *ctx, kiln_backend_device_t *device, size_t size,
                                         kiln_backend_buffer_t **out_buffer) {
  if (device->memory_bytes && (uint64_t)size > device->memory_bytes)
    return ctx->host.set_error(KILN_OUT_OF_MEMORY,
                                   "cannot allocate %zu bytes on cpu:%zu: the machine has %llu bytes of physical "
                                   "memory; allocate less (split the tensor)",
                                   size, device->index, (unsigned long long)device->memory_bytes);
  kiln_backend_buffer_t *buffer = malloc(sizeof *buffer);
  /* Round up so that size 0 still gets a distinct, aligned pointer. */
  size_t bytes = size == 0 ? 64 : (size + 63) / 64 * 64;
  void *data = buffer && bytes >= size ? aligned_alloc(64, bytes) : NULL;
  if (!data) {
    free(buffer);
    uint64_t avail = 0;
    char free_text[64] = "unknown";
    if (mem_available(&avail)) snprintf(free_text, sizeof free_text, "%llu", (unsigned long long)avail);
    return ctx->host.set_error(KILN_OUT_OF_MEMORY,
                                   "cannot allocate %zu bytes on cpu:%zu: the allocation failed (MemAvailable %s "
                                   "of %llu bytes of physical memory); free tensors or allocate less",
                                   size, device->index, free_text, (unsigned long long)device->memory_bytes);
  }
  buffer->data = data;
  buffer->size = size;
  buffer->device = device;
  buffer->wrapped = false;
  *out_buffer = buffer;
  return KILN_OK;
}

static void cpu_buffer_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_backend_buffer_t *buffer) {
  if (!buffer) return;
  if (!buffer->wrapped) free(buffer->data);
  free(buffer);
}

static void *cpu_buffer_host_pointer(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer) { return buffer->data; }

/* ---- DLPack: host memory, kDLCPU device 0 ------------------------------------------ */

static void cpu_dlpack_device(kiln_backend_context_t *ctx, kiln_backend_device_t *device, int32_t *out_type,
                              int32_t *out_id) {
  *out_type = 1; /* kDLCPU */
  *out_id = 0;
}

static void *cpu_buffer_handle(kiln_backend_context_t *ctx, kiln_backend_buffer_t *buffer) {
  return buffer->size ? buffer->data : NULL;
}

static kiln_status_t cpu_buffer_wrap(kiln_backend_context_t *ctx, kiln_backend_device_t *device, void *handle,
                                     size_t size, kiln_backend_buffer_t **out_buffer) {
  kiln_backend_buffer_t *buffer = malloc(sizeof *buffer);
  if (!buffer) return ctx->host.set_error(KILN_OUT_OF_MEMORY, "cannot allocate a buffer record on cpu:%zu", device->index);
  static char empty[64];
  buffer->data = handle ? handle : empty;
  buffer->size = size;
  buffer->device = device;
  buffer->wrapped = true;
  *out_buffer = buffer;
  return KILN_OK;
}

/* ---- the table ------------------------------------------------------------------------ */

#define KILN_CPU_STR_(x) #x
#define KILN_CPU_STR(x) KILN_CPU_STR_(x)
#define KILN_CPU_VERSION_TEXT \
  "kiln " KILN_CPU_STR(KILN_VERSION_MAJOR) "." KILN_CPU_STR(KILN_VERSION_MINOR) "." KILN_CPU_STR(KILN_VERSION_PATCH)

/* Every dtype is stored and converted (kernels/dtype_convert.h); f64, the
 * integers and bool are the CPU's own arithmetic, f16 and bf16 compute
 * through conversions to f32 (F16C where present; bf16 by bit shifts). */
static int32_t cpu_dtype_support(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_dtype_t dtype) {
  (void)ctx;
  (void)device;
  switch (dtype) {
  case KILN_F16:
  case KILN_BF16: return KILN_DTYPE_EMULATED;
  default: return (unsigned)dtype < KILN_DTYPE_COUNT_ ? KILN_DTYPE_NATIVE : KILN_DTYPE_UNSUPPORTED;
  }
}

static const kiln_backend_iface_t cpu_iface = {
    .abi_version = KILN_BACKEND_ABI_VERSION,
    .size = sizeof(kiln_backend_iface_t),
    .name = "cpu",
    .version = KILN_CPU_VERSION_TEXT, /* a version, as devinfo shows it: the CPU backend is kiln's own */
    .initialize = cpu_initialize,
    .deinitialize = cpu_deinitialize,
    .device_count = cpu_device_count,
    .device_describe = cpu_device_describe,
    .device_memory_free = cpu_device_memory_free,
    .buffer_allocate = cpu_buffer_allocate,
    .buffer_free = cpu_buffer_free,
    .buffer_host_pointer = cpu_buffer_host_pointer,
    .queue_create = kiln_cpu_queue_create,
    .queue_destroy = kiln_cpu_queue_destroy,
    .queue_finish = kiln_cpu_queue_finish,
    .queue_record = kiln_cpu_queue_record,
    .queue_wait = kiln_cpu_queue_wait,
    .event_wait = kiln_cpu_event_wait,
    .event_query = kiln_cpu_event_query,
    .event_elapsed = kiln_cpu_event_elapsed,
    .event_release = kiln_cpu_event_release,
    .buffer_write = kiln_cpu_buffer_write,
    .buffer_read = kiln_cpu_buffer_read,
    .buffer_copy = kiln_cpu_buffer_copy,
    .buffer_fill = kiln_cpu_buffer_fill,
    .ops = kiln_cpu_ops,
    .dlpack_device = cpu_dlpack_device,
    .buffer_handle = cpu_buffer_handle,
    .buffer_wrap = cpu_buffer_wrap,
    .dtype_support = cpu_dtype_support,
};

const kiln_backend_iface_t *kiln_cpu_backend_entry(void) { return &cpu_iface; }
