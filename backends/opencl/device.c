/* backends/opencl/device.c: the OpenCL plugin's entry point: platform and device enumeration, one context per device, properties. */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/opencl/opencl_backend.h"

/* Vendor queries the 1.2 headers may lack (values from the Khronos registry). */
#ifndef CL_DEVICE_UUID_KHR
#define CL_DEVICE_UUID_KHR 0x106A
#endif
#ifndef CL_DEVICE_PCI_BUS_INFO_KHR
#define CL_DEVICE_PCI_BUS_INFO_KHR 0x410F
#endif
#ifndef CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV
#define CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#define CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#endif
#ifndef CL_DEVICE_PCI_BUS_ID_NV
#define CL_DEVICE_PCI_BUS_ID_NV 0x4008
#define CL_DEVICE_PCI_SLOT_ID_NV 0x4009
#endif
#ifndef CL_DEVICE_PCI_DOMAIN_ID_NV
#define CL_DEVICE_PCI_DOMAIN_ID_NV 0x400A
#endif
#ifndef CL_DEVICE_TOPOLOGY_AMD
#define CL_DEVICE_TOPOLOGY_AMD 0x4037
#endif
#ifndef CL_DEVICE_BOARD_NAME_AMD
#define CL_DEVICE_BOARD_NAME_AMD 0x4038
#endif
#ifndef CL_DEVICE_GLOBAL_FREE_MEMORY_AMD
#define CL_DEVICE_GLOBAL_FREE_MEMORY_AMD 0x4039
#endif

/* cl_khr_pci_bus_info's answer, and AMD's topology union (its PCIe member). */
typedef struct {
  cl_uint domain, bus, device, function;
} kiln_cl_pci_bus_info_t;
typedef union {
  struct { cl_uint type; cl_uint data[5]; } raw;
  struct { cl_uint type; cl_char unused[17]; cl_char bus, device, function; } pcie;
} kiln_cl_topology_amd_t;

/* A string query into out (always terminated; "" when the query fails). */
static void device_string(cl_device_id device, cl_device_info what, char *out, size_t size) {
  out[0] = '\0';
  if (clGetDeviceInfo(device, what, size, out, NULL) != CL_SUCCESS) out[0] = '\0';
  out[size - 1] = '\0';
  /* Drivers pad some strings with spaces (PoCL's extension list). */
  size_t n = strlen(out);
  while (n && out[n - 1] == ' ') out[--n] = '\0';
}

static void platform_string(cl_platform_id platform, cl_platform_info what, char *out, size_t size) {
  out[0] = '\0';
  if (clGetPlatformInfo(platform, what, size, out, NULL) != CL_SUCCESS) out[0] = '\0';
  out[size - 1] = '\0';
}

/* A fixed-size query; false when the driver does not answer it. */
static bool device_value(cl_device_id device, cl_device_info what, void *out, size_t size) {
  size_t got = 0;
  return clGetDeviceInfo(device, what, size, out, &got) == CL_SUCCESS && got == size;
}

/* The extension list holds `name` as a whole word. */
static bool has_extension(const char *extensions, const char *name) {
  size_t len = strlen(name);
  for (const char *at = strstr(extensions, name); at; at = strstr(at + 1, name))
    if ((at == extensions || at[-1] == ' ') && (at[len] == ' ' || at[len] == '\0')) return true;
  return false;
}

static kiln_cl_vendor_t vendor_of(const char *platform_name, const char *platform_vendor, const char *device_vendor) {
  /* The platform first: PoCL reports the CPU's vendor ("AuthenticAMD") for
   * its device, which is not AMD's OpenCL. */
  if (strstr(platform_name, "Portable Computing Language") || strstr(platform_name, "PoCL")) return KILN_CL_VENDOR_POCL;
  if (strstr(platform_name, "Oclgrind")) return KILN_CL_VENDOR_OCLGRIND;
  if (strstr(platform_vendor, "NVIDIA") || strstr(device_vendor, "NVIDIA")) return KILN_CL_VENDOR_NVIDIA;
  if (strstr(platform_vendor, "Advanced Micro Devices") || strstr(platform_vendor, "AMD") ||
      !strcmp(device_vendor, "AMD"))
    return KILN_CL_VENDOR_AMD;
  if (strstr(platform_vendor, "Intel") || strstr(device_vendor, "Intel")) return KILN_CL_VENDOR_INTEL;
  return KILN_CL_VENDOR_OTHER;
}

static void format_uuid(const unsigned char *u, bool nvidia, char *out, size_t size) {
  /* NVIDIA's form ("GPU-..."), the one CUDA reports, so devinfo can tell
   * that opencl:N and cuda:M are one card. */
  snprintf(out, size, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", nvidia ? "GPU-" : "",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* Identity: UUID and PCI bus id where the platform offers them. */
static void describe_identity(kiln_backend_device_t *d, const char *extensions) {
  kiln_backend_device_desc_t *desc = &d->desc;
  const bool nvidia = d->vendor == KILN_CL_VENDOR_NVIDIA;
  unsigned char uuid[16];
  if (has_extension(extensions, "cl_khr_device_uuid") && device_value(d->device, CL_DEVICE_UUID_KHR, uuid, sizeof uuid))
    format_uuid(uuid, nvidia, desc->uuid, sizeof desc->uuid);

  kiln_cl_pci_bus_info_t pci;
  if (has_extension(extensions, "cl_khr_pci_bus_info") &&
      device_value(d->device, CL_DEVICE_PCI_BUS_INFO_KHR, &pci, sizeof pci)) {
    snprintf(desc->pci_bus_id, sizeof desc->pci_bus_id, "%04x:%02x:%02x.%x", pci.domain, pci.bus, pci.device,
             pci.function);
  } else if (nvidia && has_extension(extensions, "cl_nv_device_attribute_query")) {
    cl_uint bus = 0, slot = 0, domain = 0;
    if (device_value(d->device, CL_DEVICE_PCI_BUS_ID_NV, &bus, sizeof bus) &&
        device_value(d->device, CL_DEVICE_PCI_SLOT_ID_NV, &slot, sizeof slot)) {
      (void)device_value(d->device, CL_DEVICE_PCI_DOMAIN_ID_NV, &domain, sizeof domain);
      /* The slot id packs device and function as PCI's devfn does. */
      snprintf(desc->pci_bus_id, sizeof desc->pci_bus_id, "%04x:%02x:%02x.%x", domain, bus, slot >> 3, slot & 7);
    }
  } else if (d->vendor == KILN_CL_VENDOR_AMD && has_extension(extensions, "cl_amd_device_attribute_query")) {
    kiln_cl_topology_amd_t topology;
    memset(&topology, 0, sizeof topology);
    if (device_value(d->device, CL_DEVICE_TOPOLOGY_AMD, &topology, sizeof topology) && topology.raw.type == 1)
      snprintf(desc->pci_bus_id, sizeof desc->pci_bus_id, "0000:%02x:%02x.%x", (unsigned char)topology.pcie.bus,
               (unsigned char)topology.pcie.device, (unsigned char)topology.pcie.function);
  }

  if (nvidia) {
    cl_uint major = 0, minor = 0;
    if (device_value(d->device, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, &major, sizeof major) &&
        device_value(d->device, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, &minor, sizeof minor))
      snprintf(desc->compute_capability, sizeof desc->compute_capability, "%u.%u", major, minor);
  }
}

/* The extensions devinfo -v shows: the ones kiln uses or that tell a user
 * what the device can do. */
static void interesting_extensions(const char *extensions, char *out, size_t size) {
  static const char *const names[] = {
    "cl_khr_fp64", "cl_khr_fp16", "cl_khr_subgroups", "cl_intel_subgroups", "cl_khr_int64_base_atomics",
    "cl_khr_global_int32_base_atomics", "cl_khr_device_uuid", "cl_khr_pci_bus_info", "cl_khr_spir",
    "cl_khr_il_program", "cl_nv_device_attribute_query", "cl_amd_device_attribute_query",
  };
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!has_extension(extensions, names[i]) || used >= size) continue;
    int n = snprintf(out + used, size - used, "%s%s", used ? " " : "", names[i]);
    if (n > 0) used += (size_t)n;
  }
  if (!out[0]) snprintf(out, size, "none of kiln's interest");
}

static void describe(kiln_backend_device_t *d, const char *platform_name, const char *platform_version) {
  kiln_backend_device_desc_t *desc = &d->desc;
  memset(desc, 0, sizeof *desc);
  desc->impl = d;
  char *extensions = malloc(16384);
  if (extensions) device_string(d->device, CL_DEVICE_EXTENSIONS, extensions, 16384);

  device_string(d->device, CL_DEVICE_NAME, desc->name, sizeof desc->name);
  if (!desc->name[0]) snprintf(desc->name, sizeof desc->name, "OpenCL device %zu", d->index);
  device_string(d->device, CL_DEVICE_VENDOR, desc->vendor, sizeof desc->vendor);
  device_string(d->device, CL_DRIVER_VERSION, desc->driver_version, sizeof desc->driver_version);
  snprintf(desc->runtime_version, sizeof desc->runtime_version, "%s", platform_version);
  snprintf(desc->platform, sizeof desc->platform, "%s", platform_name);

  /* Oclgrind claims every type at once: it is a simulator, "other" for
   * kiln's purposes, never "the GPU" a program should default to. */
  if (d->vendor == KILN_CL_VENDOR_OCLGRIND)
    desc->type = KILN_DEVICE_OTHER;
  else if (d->cl_type & CL_DEVICE_TYPE_GPU)
    desc->type = KILN_DEVICE_GPU;
  else if (d->cl_type & CL_DEVICE_TYPE_ACCELERATOR)
    desc->type = KILN_DEVICE_ACCELERATOR;
  else if (d->cl_type & CL_DEVICE_TYPE_CPU)
    desc->type = KILN_DEVICE_CPU;
  else
    desc->type = KILN_DEVICE_OTHER;
  /* A CPU reached through OpenCL (PoCL) is listed and selectable, but the
   * host's own cpu backend stays the default CPU device. */
  desc->order = desc->type == KILN_DEVICE_CPU ? 1 : 0;

  cl_ulong global = 0;
  (void)device_value(d->device, CL_DEVICE_GLOBAL_MEM_SIZE, &global, sizeof global);
  desc->memory_bytes = global;
  desc->max_alloc_bytes = d->max_alloc;
  desc->local_memory_bytes = d->local_mem_size;
  desc->compute_units = d->compute_units;
  desc->max_work_group_size = (uint32_t)(d->max_work_group_size > UINT32_MAX ? UINT32_MAX : d->max_work_group_size);
  desc->fp16 = d->fp16;
  desc->fp64 = d->fp64;
  /* OpenCL has no query for free memory (AMD's extension aside). */
  desc->memory_free_is_estimate = true;
  if (extensions) describe_identity(d, extensions);

  char text[512];
  device_string(d->device, CL_DEVICE_OPENCL_C_VERSION, text, sizeof text);
  if (!desc->compute_capability[0]) {
    /* Elsewhere the OpenCL C version says what kernels can use: "OpenCL C
     * 1.2" without the driver's suffix. */
    int words = 0;
    size_t n = 0;
    while (text[n] && !(text[n] == ' ' && ++words == 3)) n++;
    snprintf(desc->compute_capability, sizeof desc->compute_capability, "%.*s", (int)n, text);
  }
  kiln_backend_add_property(desc, "opencl_c_version", "%s", text);
  device_string(d->device, CL_DEVICE_VERSION, text, sizeof text);
  kiln_backend_add_property(desc, "device_version", "%s", text);
  if (extensions) {
    interesting_extensions(extensions, text, sizeof text);
    kiln_backend_add_property(desc, "extensions", "%s", text);
  }
  kiln_backend_add_property(desc, "providers", "native%s", kiln_cl_clblast_available(d->ctx) ? ",clblast" : "");
  kiln_backend_add_property(desc, "clblast", "%s", kiln_cl_clblast_state(d->ctx));
  kiln_backend_add_property(desc, "local_memory_type", "%s",
               d->local_mem_is_global ? "global (emulated: tiles in local memory buy nothing)" : "dedicated");
  kiln_backend_add_property(desc, "max_work_item_sizes", "%zux%zux%zu", d->max_work_item_sizes[0],
                            d->max_work_item_sizes[1],
               d->max_work_item_sizes[2]);
  kiln_backend_add_property(desc, "mem_base_addr_align_bytes", "%u", d->mem_base_addr_align);
  cl_uint width = 0;
  if (device_value(d->device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, &width, sizeof width))
    kiln_backend_add_property(desc, "preferred_vector_width_float", "%u", width);
  cl_uint clock = 0;
  if (device_value(d->device, CL_DEVICE_MAX_CLOCK_FREQUENCY, &clock, sizeof clock) && clock)
    kiln_backend_add_property(desc, "max_clock_mhz", "%u", clock);
  char options[1024];
  kiln_cl_build_options(d, options, sizeof options);
  kiln_backend_add_property(desc, "build_options", "%s", options);
  if (d->vendor == KILN_CL_VENDOR_AMD && extensions && has_extension(extensions, "cl_amd_device_attribute_query")) {
    char board[256];
    device_string(d->device, CL_DEVICE_BOARD_NAME_AMD, board, sizeof board);
    if (board[0]) kiln_backend_add_property(desc, "board_name", "%s", board);
  }
  if (d->vendor == KILN_CL_VENDOR_OCLGRIND)
    kiln_backend_add_property(desc, "note",
                              "Oclgrind simulates a device to check kernels (bounds, races, uninitialised reads): "
                              "correct but very slow; select it explicitly (KILN_DEVICE=opencl:%zu)",
                              d->index);
  free(extensions);
}

/* Everything a device needs before work reaches it; fills the limits kernels
 * are launched with. */
static kiln_status_t open_device(kiln_backend_device_t *d, cl_platform_id platform, cl_device_id device,
                                 const char *platform_name, const char *platform_vendor, const char *platform_version) {
  d->platform = platform;
  d->device = device;
  char device_vendor[128];
  device_string(device, CL_DEVICE_VENDOR, device_vendor, sizeof device_vendor);
  d->vendor = vendor_of(platform_name, platform_vendor, device_vendor);
  (void)device_value(device, CL_DEVICE_TYPE, &d->cl_type, sizeof d->cl_type);
  d->is_cpu = (d->cl_type & CL_DEVICE_TYPE_CPU) != 0 && d->vendor != KILN_CL_VENDOR_OCLGRIND;
  if (!device_value(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, &d->max_work_group_size, sizeof d->max_work_group_size) ||
      d->max_work_group_size == 0)
    d->max_work_group_size = 1;
  size_t items[3] = {1, 1, 1};
  cl_uint dims = 0;
  if (device_value(device, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, &dims, sizeof dims) && dims >= 3) {
    size_t all[16] = {0};
    if (dims <= 16 && clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_SIZES, dims * sizeof(size_t), all, NULL) ==
                          CL_SUCCESS)
      memcpy(items, all, sizeof items);
  }
  memcpy(d->max_work_item_sizes, items, sizeof items);
  cl_device_local_mem_type local_type = CL_LOCAL;
  (void)device_value(device, CL_DEVICE_LOCAL_MEM_TYPE, &local_type, sizeof local_type);
  d->local_mem_is_global = local_type == CL_GLOBAL;
  (void)device_value(device, CL_DEVICE_LOCAL_MEM_SIZE, &d->local_mem_size, sizeof d->local_mem_size);
  (void)device_value(device, CL_DEVICE_MAX_COMPUTE_UNITS, &d->compute_units, sizeof d->compute_units);
  if (d->compute_units == 0) d->compute_units = 1;
  cl_uint align_bits = 0;
  (void)device_value(device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, &align_bits, sizeof align_bits);
  d->mem_base_addr_align = align_bits / 8;
  (void)device_value(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, &d->max_alloc, sizeof d->max_alloc);
  (void)device_value(device, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, &d->cache_size, sizeof d->cache_size);
  char *extensions = malloc(16384);
  if (extensions) {
    device_string(device, CL_DEVICE_EXTENSIONS, extensions, 16384);
    d->fp16 = has_extension(extensions, "cl_khr_fp16");
    d->fp64 = has_extension(extensions, "cl_khr_fp64");
    free(extensions);
  }
  cl_device_fp_config fp64_config = 0;
  if (!d->fp64 && device_value(device, CL_DEVICE_DOUBLE_FP_CONFIG, &fp64_config, sizeof fp64_config))
    d->fp64 = fp64_config != 0;
  /* KILN_OPENCL_NO_FP64=1: every device taken as lacking fp64 (the tests
   * run the paths of such devices on PoCL, which has it). */
  const char *no_fp64 = getenv("KILN_OPENCL_NO_FP64");
  const bool fp64_hidden = no_fp64 && *no_fp64 && strcmp(no_fp64, "0") != 0;
  if (fp64_hidden) d->fp64 = false;

  char name[256], driver[128], device_version[256];
  device_string(device, CL_DEVICE_NAME, name, sizeof name);
  snprintf(d->fp64_why, sizeof d->fp64_why,
           "opencl:%zu (%.200s) lacks cl_khr_fp64%s, and kiln never computes f64 in a narrower type", d->index, name,
           fp64_hidden ? " (hidden by KILN_OPENCL_NO_FP64)" : "");
  device_string(device, CL_DRIVER_VERSION, driver, sizeof driver);
  device_string(device, CL_DEVICE_VERSION, device_version, sizeof device_version);
  /* What a compiled binary depends on: the platform and its version, the
   * device model, its driver. (program.c adds the source hash and options.) */
  snprintf(d->cache_identity, sizeof d->cache_identity, "opencl|%.120s|%.120s|%.120s|%.120s|%.120s|%.120s",
           platform_name, platform_version, name, device_vendor, driver, device_version);

  pthread_mutex_init(&d->program_lock, NULL);
  pthread_mutex_init(&d->launch_lock, NULL);

  cl_context_properties properties[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
  cl_int err = CL_SUCCESS;
  d->context = clCreateContext(properties, 1, &device, NULL, NULL, &err);
  if (err != CL_SUCCESS || !d->context) {
    d->context = NULL;
    return kiln_cl_check(d->ctx, err != CL_SUCCESS ? err : CL_INVALID_CONTEXT, "clCreateContext for '%s' (platform %s)",
                         name, platform_name);
  }
  d->internal_queue = clCreateCommandQueue(d->context, device, 0, &err);
  if (err != CL_SUCCESS || !d->internal_queue) {
    d->internal_queue = NULL;
    clReleaseContext(d->context);
    d->context = NULL;
    return kiln_cl_check(d->ctx, err != CL_SUCCESS ? err : CL_INVALID_COMMAND_QUEUE,
                         "clCreateCommandQueue for '%s' (platform %s)", name, platform_name);
  }
  describe(d, platform_name, platform_version);
  return KILN_OK;
}

static void close_device(kiln_backend_device_t *d) {
  kiln_cl_programs_release(d);
  if (d->internal_queue) {
    (void)clFinish(d->internal_queue);
    (void)clReleaseCommandQueue(d->internal_queue);
  }
  if (d->context) (void)clReleaseContext(d->context);
  d->internal_queue = NULL;
  d->context = NULL;
  pthread_mutex_destroy(&d->program_lock);
  pthread_mutex_destroy(&d->launch_lock);
}

static void cl_deinitialize(kiln_backend_context_t *ctx) {
  if (!ctx) return;
  kiln_cl_debug_unregister(ctx);
  kiln_cl_host_release_all(ctx);
  /* CLBlast keeps programs per context: drop them before the contexts go. */
  kiln_cl_clblast_unload(ctx);
  for (size_t i = 0; i < ctx->device_count; i++) close_device(&ctx->devices[i]);
  free(ctx->devices);
  pthread_mutex_destroy(&ctx->pinned_lock);
  free(ctx);
}

static void log_line(const kiln_backend_context_t *ctx, kiln_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_line(const kiln_backend_context_t *ctx, kiln_log_level_t level, const char *fmt, ...) {
  if (!ctx->host.log || !ctx->host.log_level || ctx->host.log_level() < level) return;
  char line[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(line, sizeof line, fmt, args);
  va_end(args);
  ctx->host.log(level, "%s", line);
}

/* The devices of one platform, or none with a log line when the platform
 * fails: one broken ICD must not hide the others. */
static cl_uint platform_devices(const kiln_backend_context_t *ctx, cl_platform_id platform, const char *platform_name,
                                cl_device_id **out_ids) {
  *out_ids = NULL;
  cl_uint count = 0;
  cl_int err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, NULL, &count);
  if (err == CL_DEVICE_NOT_FOUND || (err == CL_SUCCESS && count == 0)) {
    log_line(ctx, KILN_LOG_INFO, "opencl: platform '%s' has no device", platform_name);
    return 0;
  }
  if (err != CL_SUCCESS) {
    log_line(ctx, KILN_LOG_WARN, "opencl: platform '%s' skipped: clGetDeviceIDs failed: %s (%d)", platform_name,
             kiln_cl_error_name(err), (int)err);
    return 0;
  }
  cl_device_id *ids = calloc(count, sizeof *ids);
  if (!ids) return 0;
  err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, count, ids, &count);
  if (err != CL_SUCCESS) {
    log_line(ctx, KILN_LOG_WARN, "opencl: platform '%s' skipped: clGetDeviceIDs failed: %s (%d)", platform_name,
             kiln_cl_error_name(err), (int)err);
    free(ids);
    return 0;
  }
  *out_ids = ids;
  return count;
}

/* ---- versions ------------------------------------------------------------------
 * What devinfo shows as the backend's version: the ICD loader's, each
 * platform's and CLBlast's, as found at start-up (never a device count). */

/* ocl-icd's loader query (also answered by the Khronos loader), reached
 * through the extension mechanism. */
typedef cl_int (*kiln_cl_icd_loader_info_fn)(cl_uint param, size_t size, void *value, size_t *size_ret);
enum { KILN_CL_ICDL_VERSION = 2, KILN_CL_ICDL_NAME = 3 };

static void append(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t size, const char *fmt, ...) {
  size_t used = strlen(out);
  if (used + 1 >= size) return;
  va_list args;
  va_start(args, fmt);
  vsnprintf(out + used, size - used, fmt, args);
  va_end(args);
}

/* "OpenCL ICD Loader 2.3.1", or "" when the loader does not say. */
static void icd_loader_version(char *out, size_t size) {
  out[0] = '\0';
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  void *address = clGetExtensionFunctionAddress("clGetICDLoaderInfoOCLICD");
#pragma GCC diagnostic pop
  kiln_cl_icd_loader_info_fn info;
  memcpy(&info, &address, sizeof info);
  if (!info) return;
  char name[64] = "", version[64] = "";
  if (info(KILN_CL_ICDL_NAME, sizeof name, name, NULL) != CL_SUCCESS) name[0] = '\0';
  if (info(KILN_CL_ICDL_VERSION, sizeof version, version, NULL) != CL_SUCCESS) version[0] = '\0';
  name[sizeof name - 1] = version[sizeof version - 1] = '\0';
  if (version[0]) snprintf(out, size, "%s %s", name[0] ? name : "ICD loader", version);
}

/* A platform's version without its build details: PoCL appends them after
 * two spaces ("OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, ..."). */
static void platform_version_short(const char *version, char *out, size_t size) {
  const char *cut = strstr(version, "  ");
  size_t len = cut ? (size_t)(cut - version) : strlen(version);
  if (len > 48) len = 48;
  snprintf(out, size, "%.*s", (int)len, version);
}

/* CLBlast has no version call: its file's name carries it
 * (libclblast.so.1 -> libclblast.so.1.5.3). "" when it is not loaded. */
static void clblast_version(char *out, size_t size) {
  out[0] = '\0';
  void *handle = dlopen("libclblast.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!handle) handle = dlopen("libclblast.so", RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return;
  struct link_map *map = NULL;
  char real[PATH_MAX];
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && realpath(map->l_name, real)) {
    const char *base = strrchr(real, '/');
    const char *so = strstr(base ? base : real, ".so.");
    if (so && so[4]) snprintf(out, size, "%s", so + 4);
  }
  dlclose(handle);
}

/* The loader, then each platform's version, then CLBlast's, into
 * ctx->summary. */
static void describe_versions(kiln_backend_context_t *ctx, cl_platform_id *platforms, cl_uint platform_count) {
  char *out = ctx->summary;
  const size_t size = sizeof ctx->summary;
  char text[128];
  out[0] = '\0';
  icd_loader_version(text, sizeof text);
  append(out, size, "%s", text[0] ? text : "OpenCL ICD loader");
  if (!platform_count) append(out, size, "; no platform");
  for (cl_uint p = 0; p < platform_count; p++) {
    char version[256];
    platform_string(platforms[p], CL_PLATFORM_VERSION, version, sizeof version);
    platform_version_short(version, text, sizeof text);
    append(out, size, "%s%s", p ? ", " : platform_count == 1 ? "; platform " : "; platforms ", text);
  }
  if (kiln_cl_clblast_available(ctx)) {
    clblast_version(text, sizeof text);
    append(out, size, "; CLBlast %s", text[0] ? text : "(version unknown)");
  }
}

/* Open every device of every platform into ctx->devices. KILN_OK with no
 * device (and the reason as the thread's message) when there is none. */
static kiln_status_t open_devices(kiln_backend_context_t *ctx) {
  cl_uint platform_count = 0;
  cl_int err = clGetPlatformIDs(0, NULL, &platform_count);
  if (err == -1001 /* CL_PLATFORM_NOT_FOUND_KHR: the ICD loader found none */ || (err == CL_SUCCESS && !platform_count)) {
    /* Not an error: the backend works and has nothing to show. The message
     * becomes the reason devinfo gives for "no device". */
    const char *vendors = getenv("OCL_ICD_VENDORS");
    describe_versions(ctx, NULL, 0);
    kiln_cl_error(ctx, KILN_UNAVAILABLE,
                  "no OpenCL platform: the ICD loader (libOpenCL.so.1) found no driver registered in %s; install one "
                  "(PoCL for the CPU, or a GPU vendor's OpenCL driver); clinfo shows what the loader finds",
                  vendors && *vendors ? vendors : "/etc/OpenCL/vendors");
    return KILN_OK;
  }
  if (err != CL_SUCCESS)
    return kiln_cl_error(ctx, KILN_UNAVAILABLE,
                         "clGetPlatformIDs failed: %s (%d); check the OpenCL installation with clinfo",
                         kiln_cl_error_name(err), (int)err);
  cl_platform_id *platforms = calloc(platform_count, sizeof *platforms);
  if (!platforms)
    return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory listing %u OpenCL platforms", platform_count);
  err = clGetPlatformIDs(platform_count, platforms, &platform_count);
  if (err != CL_SUCCESS) {
    free(platforms);
    return kiln_cl_error(ctx, KILN_UNAVAILABLE,
                         "clGetPlatformIDs failed: %s (%d); check the OpenCL installation with clinfo",
                         kiln_cl_error_name(err), (int)err);
  }

  /* Two passes: count, then open, so device indices follow platform order. */
  cl_device_id **ids = calloc(platform_count, sizeof *ids);
  cl_uint *counts = calloc(platform_count, sizeof *counts);
  if (!ids || !counts) {
    free(platforms);
    free(ids);
    free(counts);
    return kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory listing OpenCL devices");
  }
  size_t total = 0;
  for (cl_uint p = 0; p < platform_count; p++) {
    char name[128];
    platform_string(platforms[p], CL_PLATFORM_NAME, name, sizeof name);
    counts[p] = platform_devices(ctx, platforms[p], name, &ids[p]);
    total += counts[p];
  }
  kiln_status_t status = KILN_OK;
  if (total) {
    ctx->devices = calloc(total, sizeof *ctx->devices);
    if (!ctx->devices)
      status = kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for %zu OpenCL devices", total);
  }
  size_t opened = 0;
  for (cl_uint p = 0; status == KILN_OK && p < platform_count; p++) {
    char name[128], vendor[128], version[128];
    platform_string(platforms[p], CL_PLATFORM_NAME, name, sizeof name);
    platform_string(platforms[p], CL_PLATFORM_VENDOR, vendor, sizeof vendor);
    platform_string(platforms[p], CL_PLATFORM_VERSION, version, sizeof version);
    for (cl_uint i = 0; i < counts[p]; i++) {
      kiln_backend_device_t *d = &ctx->devices[opened];
      d->ctx = ctx;
      d->index = opened;
      if (open_device(d, platforms[p], ids[p][i], name, vendor, version) != KILN_OK) {
        /* One device that cannot open must not hide the others. */
        log_line(ctx, KILN_LOG_WARN, "opencl: a device of platform '%s' skipped: %s", name, kiln_cl_last_error(ctx));
        pthread_mutex_destroy(&d->program_lock);
        pthread_mutex_destroy(&d->launch_lock);
        memset(d, 0, sizeof *d);
        continue;
      }
      opened++;
    }
  }
  describe_versions(ctx, platforms, platform_count);
  for (cl_uint p = 0; p < platform_count; p++) free(ids[p]);
  free(ids);
  free(counts);
  free(platforms);
  ctx->device_count = opened;
  if (status != KILN_OK) return status;
  if (!opened) {
    /* Not an error: platforms without devices. The message is kept for a core
     * that shows the reason of a backend with no device. */
    kiln_cl_error(ctx, KILN_UNAVAILABLE, "%u OpenCL platform%s found, but no usable device (clinfo lists them)",
                  platform_count, platform_count == 1 ? "" : "s");
  }
  return KILN_OK;
}

static kiln_status_t cl_initialize(const kiln_host_t *host, kiln_backend_context_t **out_ctx) {
  *out_ctx = NULL;
  kiln_backend_context_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return host->set_error(KILN_OUT_OF_MEMORY, "out of host memory for the OpenCL backend's context");
  /* The core's table as far as both know it: a longer one's new slots are
   * not ours to call, a shorter one's missing slots stay NULL. */
  memcpy(&ctx->host, host, host->size < sizeof ctx->host ? host->size : sizeof ctx->host);
  pthread_mutex_init(&ctx->pinned_lock, NULL);
  kiln_status_t status = kiln_cl_clblast_load(ctx);
  if (status == KILN_OK) status = open_devices(ctx);
  if (status != KILN_OK) {
    cl_deinitialize(ctx);
    return status;
  }
  log_line(ctx, KILN_LOG_INFO, "opencl: %s; %zu device%s; CLBlast %s", ctx->summary, ctx->device_count,
           ctx->device_count == 1 ? "" : "s", kiln_cl_clblast_state(ctx));
  kiln_cl_debug_register(ctx);
  *out_ctx = ctx;
  return KILN_OK;
}

static size_t cl_device_count(kiln_backend_context_t *ctx) { return ctx->device_count; }

static const char *cl_version_text(kiln_backend_context_t *ctx) { return ctx->summary; }

static kiln_status_t cl_device_describe(kiln_backend_context_t *ctx, size_t index,
                                        kiln_backend_device_desc_t *out_desc) {
  *out_desc = ctx->devices[index].desc;
  return KILN_OK;
}

static kiln_status_t cl_device_memory_free(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                           uint64_t *out_bytes) {
  /* AMD's extension answers in KiB (total free, largest free block). */
  size_t free_kib[2] = {0, 0};
  if (device->vendor == KILN_CL_VENDOR_AMD &&
      clGetDeviceInfo(device->device, CL_DEVICE_GLOBAL_FREE_MEMORY_AMD, sizeof free_kib, free_kib, NULL) == CL_SUCCESS &&
      free_kib[0]) {
    *out_bytes = (uint64_t)free_kib[0] * 1024u;
    return KILN_OK;
  }
  *out_bytes = device->desc.memory_bytes;
  return KILN_OK;
}

/* Every dtype computes: f16 and bf16 stored as their bits and computed in
 * f32 (emulated; no kernel uses half arithmetic), f64 only where the device
 * has cl_khr_fp64. */
static int32_t cl_dtype_support(kiln_backend_context_t *ctx, kiln_backend_device_t *device, kiln_dtype_t dtype) {
  (void)ctx;
  switch (dtype) {
  case KILN_F16:
  case KILN_BF16: return KILN_DTYPE_EMULATED;
  case KILN_F64: return device->fp64 ? KILN_DTYPE_NATIVE : KILN_DTYPE_UNSUPPORTED;
  default: return (unsigned)dtype < KILN_DTYPE_COUNT_ ? KILN_DTYPE_NATIVE : KILN_DTYPE_UNSUPPORTED;
  }
}

static const char *cl_dtype_unsupported_why(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                            kiln_dtype_t dtype) {
  (void)ctx;
  return dtype == KILN_F64 && !device->fp64 ? device->fp64_why : NULL;
}

static const kiln_backend_iface_t opencl_iface = {
  .abi_version = KILN_BACKEND_ABI_VERSION,
  .size = sizeof(kiln_backend_iface_t),
  .name = "opencl",
  /* The versions found (loader, platforms, CLBlast) are the context's:
   * version_text. The table is shared by every context. */
  .version = "",
  .initialize = cl_initialize,
  .deinitialize = cl_deinitialize,
  .device_count = cl_device_count,
  .device_describe = cl_device_describe,
  .device_memory_free = cl_device_memory_free,
  .buffer_allocate = kiln_cl_buffer_allocate,
  .buffer_free = kiln_cl_buffer_free,
  .buffer_host_pointer = NULL, /* OpenCL memory is reached through the queue only */
  .host_allocate = kiln_cl_host_allocate,
  .host_free = kiln_cl_host_free,
  .queue_create = kiln_cl_queue_create,
  .queue_destroy = kiln_cl_queue_destroy,
  .queue_finish = kiln_cl_queue_finish,
  .queue_record = kiln_cl_queue_record,
  .queue_wait = kiln_cl_queue_wait,
  .event_wait = kiln_cl_event_wait,
  .event_query = kiln_cl_event_query,
  .event_elapsed = kiln_cl_event_elapsed,
  .event_release = kiln_cl_event_release,
  .buffer_write = kiln_cl_buffer_write,
  .buffer_read = kiln_cl_buffer_read,
  .buffer_copy = kiln_cl_buffer_copy,
  .buffer_fill = kiln_cl_buffer_fill,
  .ops = kiln_cl_ops,
  .version_text = cl_version_text,
  .dlpack_device = kiln_cl_dlpack_device,
  .buffer_handle = kiln_cl_buffer_handle,
  .buffer_wrap = kiln_cl_buffer_wrap,
  .dtype_support = cl_dtype_support,
  .dtype_unsupported_why = cl_dtype_unsupported_why,
};

KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void);
KILN_PLUGIN_EXPORT const kiln_backend_iface_t *kiln_backend_entry(void) { return &opencl_iface; }
