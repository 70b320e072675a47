/* backends/opencl/program.c: the embedded kernel programs, built per device on first use and cached as binaries; kernel lookup and launches. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/opencl/opencl_backend.h"

static const struct {
  const char *name;
  const unsigned char *source;
  const size_t *size;
} programs[KILN_CL_PROGRAM_COUNT] = {
#define KILN_CL_PROGRAM_ENTRY_(name) [KILN_CL_PROGRAM_##name] = {#name, kiln_cl_source_##name, &kiln_cl_source_##name##_size},
  KILN_CL_PROGRAMS(KILN_CL_PROGRAM_ENTRY_)
#undef KILN_CL_PROGRAM_ENTRY_
};

void kiln_cl_counters_read(const kiln_backend_context_t *ctx, kiln_cl_counters_t *out_counters) {
  out_counters->builds_from_source = atomic_load(&ctx->builds_from_source);
  out_counters->builds_from_binary = atomic_load(&ctx->builds_from_binary);
  out_counters->cache_rejected = atomic_load(&ctx->cache_rejected);
}

/* ---- the test exports ------------------------------------------------------------
 * The tests reach the plugin by dlsym, without the context the core holds: the
 * exports act on the context initialized last among those alive. This list is
 * the plugin's one process global, and nothing but the exports reads it. */

static pthread_mutex_t debug_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_backend_context_t *debug_contexts; /* newest first */

void kiln_cl_debug_register(kiln_backend_context_t *ctx) {
  pthread_mutex_lock(&debug_lock);
  ctx->debug_next = debug_contexts;
  debug_contexts = ctx;
  pthread_mutex_unlock(&debug_lock);
}

void kiln_cl_debug_unregister(kiln_backend_context_t *ctx) {
  pthread_mutex_lock(&debug_lock);
  kiln_backend_context_t **at = &debug_contexts;
  while (*at && *at != ctx) at = &(*at)->debug_next;
  if (*at) *at = ctx->debug_next;
  ctx->debug_next = NULL;
  pthread_mutex_unlock(&debug_lock);
}

KILN_PLUGIN_EXPORT void kiln_cl_debug_counters(kiln_cl_counters_t *out);
KILN_PLUGIN_EXPORT void kiln_cl_debug_counters(kiln_cl_counters_t *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&debug_lock);
  if (debug_contexts) kiln_cl_counters_read(debug_contexts, out);
  pthread_mutex_unlock(&debug_lock);
}

/* 64-bit FNV-1a, continued from `hash`. */
static uint64_t fnv1a(uint64_t hash, const void *data, size_t size) {
  const unsigned char *p = data;
  for (size_t i = 0; i < size; i++) {
    hash ^= p[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

void kiln_cl_build_options(const kiln_backend_device_t *device, char *out, size_t out_size) {
  /* OpenCL C 1.2 everywhere; optional features only as -D flags the kernels
   * test. No -cl-fast-relaxed-math nor -cl-mad-enable: results must match
   * the CPU backend's within the conformance tolerances on every driver. */
  /* Oclgrind interprets the LLVM its own clang emits, and its interpreter
   * lacks intrinsics the optimiser introduces (llvm.abs.i32 for the i32 abs
   * formula): on Oclgrind, unoptimised code. */
  int n = snprintf(out, out_size, "-cl-std=CL1.2 -DKILN_CL_FP64=%d -DKILN_CL_FP16=%d -DKILN_CL_ROW_RUNS=%d%s",
                   device->fp64 ? 1 : 0, device->fp16 ? 1 : 0, device->is_cpu || device->local_mem_is_global ? 1 : 0,
                   device->vendor == KILN_CL_VENDOR_OCLGRIND ? " -cl-opt-disable" : "");
  const char *extra = getenv("KILN_OPENCL_BUILD_OPTIONS");
  if (extra && *extra && n > 0 && (size_t)n < out_size) snprintf(out + n, out_size - (size_t)n, " %s", extra);
}

/* The build log of the device, trimmed to what a message can carry: the head,
 * where the first error usually is. malloc'ed; "" when there is none. */
static char *build_log(cl_program program, cl_device_id device) {
  size_t size = 0;
  if (clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) != CL_SUCCESS || size == 0)
    return calloc(1, 1);
  char *log = malloc(size + 1);
  if (!log) return NULL;
  if (clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, log, NULL) != CL_SUCCESS) size = 0;
  log[size] = '\0';
  size_t len = strlen(log);
  while (len && (log[len - 1] == '\n' || log[len - 1] == ' ')) log[--len] = '\0';
  const size_t limit = 1200;
  if (len > limit) strcpy(log + limit - 30, "\n[... build log trimmed]");
  return log;
}

/* Keep a failed build (its message) so later launches fail the same way. */
static kiln_status_t build_failed(kiln_backend_device_t *device, kiln_cl_program_state_t *state,
                                  kiln_status_t status) {
  state->build_status = status;
  free(state->build_error);
  state->build_error = strdup(kiln_cl_last_error(device->ctx));
  return status;
}

/* The program's binary for the device, into the cache; failures only cost
 * the next process a build. */
static void store_binary(const kiln_host_t *host, cl_program program, const char *key) {
  if (!host->cache_store) return;
  size_t size = 0;
  if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS || size == 0) return;
  unsigned char *binary = malloc(size);
  if (!binary) return;
  unsigned char *binaries[1] = {binary};
  if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof binaries, binaries, NULL) == CL_SUCCESS)
    host->cache_store(key, binary, size);
  free(binary);
}

/* A cached binary, built; NULL when absent or when the driver refuses it. */
static cl_program load_binary(kiln_backend_device_t *device, const char *name, const char *key, const char *options) {
  kiln_backend_context_t *ctx = device->ctx;
  void *data = NULL;
  size_t size = 0;
  if (!ctx->host.cache_load || ctx->host.cache_load(key, &data, &size) != KILN_OK || !data) return NULL;
  const unsigned char *binaries[1] = {data};
  cl_int binary_status = CL_SUCCESS, err = CL_SUCCESS;
  cl_program program =
      clCreateProgramWithBinary(device->context, 1, &device->device, &size, binaries, &binary_status, &err);
  free(data);
  if (err == CL_SUCCESS && binary_status == CL_SUCCESS && program)
    err = clBuildProgram(program, 1, &device->device, options, NULL, NULL);
  else if (err == CL_SUCCESS)
    err = binary_status != CL_SUCCESS ? binary_status : CL_INVALID_BINARY;
  if (err != CL_SUCCESS) {
    /* A stale or foreign binary that passed the cache's checksum (another
     * driver build, same version string): dropped from the cache, rebuilt,
     * never trusted. */
    atomic_fetch_add(&ctx->cache_rejected, 1);
    if (ctx->host.cache_evict) ctx->host.cache_evict(key);
    if (ctx->host.log)
      ctx->host.log(KILN_LOG_INFO, "opencl:%zu: the cached binary of program '%s' was refused (%s); rebuilding",
                    device->index, name, kiln_cl_error_name(err));
    if (program) (void)clReleaseProgram(program);
    return NULL;
  }
  atomic_fetch_add(&ctx->builds_from_binary, 1);
  if (ctx->host.log)
    ctx->host.log(KILN_LOG_DEBUG, "opencl:%zu: program '%s' loaded from the kernel cache", device->index, name);
  return program;
}

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Build the program: from the cache's binary when `use_cache` and there is
 * one the driver takes, else from source (storing the binary). */
static kiln_status_t program_build_locked(kiln_backend_device_t *device, kiln_cl_program_t which, bool use_cache) {
  kiln_backend_context_t *ctx = device->ctx;
  kiln_cl_program_state_t *state = &device->programs[which];
  const char *name = programs[which].name;
  const char *source = (const char *)programs[which].source;
  const size_t source_size = *programs[which].size;
  char options[1024];
  kiln_cl_build_options(device, options, sizeof options);

  uint64_t hash = fnv1a(1469598103934665603ull, source, source_size);
  hash = fnv1a(hash, "\0", 1);
  hash = fnv1a(hash, options, strlen(options));
  char *key = malloc(strlen(device->cache_identity) + strlen(options) + 128);
  if (!key)
    return build_failed(device, state, kiln_cl_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory building a program"));
  sprintf(key, "%s|program=%s|source=%016llx|options=%s", device->cache_identity, name, (unsigned long long)hash,
          options);

  cl_program program = use_cache ? load_binary(device, name, key, options) : NULL;
  if (program) {
    state->program = program;
    state->build_status = KILN_OK;
    free(state->cache_key);
    state->cache_key = key;
    return KILN_OK;
  }

  cl_int err = CL_SUCCESS;
  size_t length = source_size;
  program = clCreateProgramWithSource(device->context, 1, &source, &length, &err);
  if (err != CL_SUCCESS || !program) {
    free(key);
    return build_failed(device, state,
                        kiln_cl_check(ctx, err != CL_SUCCESS ? err : CL_INVALID_PROGRAM,
                                      "clCreateProgramWithSource(program '%s') on opencl:%zu", name, device->index));
  }
  atomic_fetch_add(&ctx->builds_from_source, 1);
  /* A build from source takes seconds (PoCL compiles through LLVM), the
   * first run on a device builds every program it uses, and a program is
   * silent meanwhile: say so at info. devinfo and the examples watch for
   * "building OpenCL kernels" to tell their user why they wait. */
  if (ctx->host.log)
    ctx->host.log(KILN_LOG_INFO,
                  "opencl:%zu (%s): building OpenCL kernels: program '%s' from source with options \"%s\" (not in "
                  "the kernel cache yet; later runs load the cached binary)",
                  device->index, device->desc.name, name, options);
  double started = seconds_now();
  err = clBuildProgram(program, 1, &device->device, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    char *log = build_log(program, device->device);
    (void)clReleaseProgram(program);
    free(key);
    kiln_status_t status = kiln_cl_error(
        ctx, KILN_BUILD_FAILED,
        "building the OpenCL program '%s' for opencl:%zu (%s, %s) with options \"%s\" failed: %s (%d); build log:\n%s",
        name, device->index, device->desc.name, device->desc.driver_version, options, kiln_cl_error_name(err), (int)err,
        log && log[0] ? log : "(the driver gave no log)");
    free(log);
    return build_failed(device, state, status);
  }
  if (ctx->host.log)
    ctx->host.log(KILN_LOG_INFO, "opencl:%zu: program '%s' built in %.2f s", device->index, name,
                  seconds_now() - started);
  store_binary(&ctx->host, program, key);
  free(key);
  state->program = program;
  state->build_status = KILN_OK;
  return KILN_OK;
}

static kiln_status_t program_get_locked(kiln_backend_device_t *device, kiln_cl_program_t which) {
  kiln_cl_program_state_t *state = &device->programs[which];
  if (state->program) return KILN_OK;
  if (state->build_status != KILN_OK)
    return kiln_cl_error(device->ctx, state->build_status, "%s",
                         state->build_error ? state->build_error : "an earlier build failed");
  return program_build_locked(device, which, true);
}

/* A binary the driver accepted but that lacks a kernel kiln asks for (a
 * damaged or foreign entry that passed every check): evicted, and the program
 * built once from source. Kernels created from the old program keep it alive
 * through their own reference. */
static kiln_status_t program_rebuild_from_source_locked(kiln_backend_device_t *device, kiln_cl_program_t which) {
  kiln_backend_context_t *ctx = device->ctx;
  kiln_cl_program_state_t *state = &device->programs[which];
  atomic_fetch_add(&ctx->cache_rejected, 1);
  if (ctx->host.cache_evict) ctx->host.cache_evict(state->cache_key);
  if (ctx->host.log)
    ctx->host.log(KILN_LOG_INFO, "opencl:%zu: the cached binary of program '%s' lacks a kernel; evicted, rebuilding "
                  "from source", device->index, programs[which].name);
  free(state->cache_key);
  state->cache_key = NULL;
  (void)clReleaseProgram(state->program);
  state->program = NULL;
  return program_build_locked(device, which, false);
}

kiln_status_t kiln_cl_program_get(kiln_backend_device_t *device, kiln_cl_program_t program, cl_program *out_program) {
  pthread_mutex_lock(&device->program_lock);
  kiln_status_t status = program_get_locked(device, program);
  if (status == KILN_OK) *out_program = device->programs[program].program;
  pthread_mutex_unlock(&device->program_lock);
  return status;
}

kiln_status_t kiln_cl_kernel_get(kiln_backend_device_t *device, kiln_cl_program_t program, const char *name,
                                 const kiln_cl_kernel_entry_t **out_entry) {
  pthread_mutex_lock(&device->program_lock);
  kiln_status_t status = program_get_locked(device, program);
  kiln_cl_program_state_t *state = &device->programs[program];
  if (status == KILN_OK) {
    for (size_t i = 0; i < state->kernel_count; i++)
      if (!strcmp(state->kernels[i].name, name)) {
        *out_entry = &state->kernels[i];
        pthread_mutex_unlock(&device->program_lock);
        return KILN_OK;
      }
    if (state->kernel_count == KILN_CL_MAX_KERNELS_PER_PROGRAM) {
      status = kiln_cl_error(device->ctx, KILN_INTERNAL,
                             "program '%s' on opencl:%zu: more than %d kernels asked for; raise "
                             "KILN_CL_MAX_KERNELS_PER_PROGRAM",
                             programs[program].name, device->index, KILN_CL_MAX_KERNELS_PER_PROGRAM);
    } else {
      cl_int err = CL_SUCCESS;
      cl_kernel kernel = clCreateKernel(state->program, name, &err);
      if ((err == CL_INVALID_KERNEL_NAME || err == CL_INVALID_PROGRAM_EXECUTABLE) && state->cache_key) {
        kernel = NULL;
        status = program_rebuild_from_source_locked(device, program);
        err = status == KILN_OK ? CL_SUCCESS : err;
        if (status == KILN_OK) kernel = clCreateKernel(state->program, name, &err);
      }
      if (status != KILN_OK) {
        /* The rebuild's own message stands. */
      } else if (err == CL_INVALID_KERNEL_NAME) {
        status = kiln_cl_error(device->ctx, KILN_UNSUPPORTED,
                               "the OpenCL backend has no kernel '%s' (program '%s', opencl:%zu): this op is not "
                               "implemented for these dtypes on OpenCL; run it on another device",
                               name, programs[program].name, device->index);
      } else if (strlen(name) >= sizeof state->kernels[0].name) {
        (void)clReleaseKernel(kernel);
        status = kiln_cl_error(device->ctx, KILN_INTERNAL, "OpenCL kernel name '%s' is too long", name);
      } else if (err != CL_SUCCESS || !kernel) {
        status = kiln_cl_check(device->ctx, err != CL_SUCCESS ? err : CL_INVALID_KERNEL,
                               "clCreateKernel(\"%s\") of program '%s' on opencl:%zu", name, programs[program].name,
                               device->index);
      } else {
        kiln_cl_kernel_entry_t *entry = &state->kernels[state->kernel_count];
        strcpy(entry->name, name);
        entry->kernel = kernel;
        size_t wg = 0;
        if (clGetKernelWorkGroupInfo(kernel, device->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) !=
                CL_SUCCESS ||
            wg == 0)
          wg = device->max_work_group_size;
        entry->work_group_size = wg;
        state->kernel_count++;
        *out_entry = entry;
      }
    }
  }
  pthread_mutex_unlock(&device->program_lock);
  return status;
}

static cl_int set_arg(cl_kernel kernel, cl_uint index, const kiln_cl_arg_t *arg) {
  switch (arg->kind) {
  case KILN_CL_ARG_MEM: return clSetKernelArg(kernel, index, sizeof(cl_mem), &arg->v.mem);
  case KILN_CL_ARG_KOP: return clSetKernelArg(kernel, index, sizeof(kiln_kop_t), arg->v.kop);
  }
  return CL_INVALID_ARG_VALUE;
}

kiln_status_t kiln_cl_launch(kiln_backend_queue_t *queue, kiln_cl_program_t program, const char *kernel,
                             cl_uint work_dim, const size_t *global, const size_t *local, size_t arg_count,
                             const kiln_cl_arg_t *args) {
  const kiln_cl_kernel_entry_t *entry = NULL;
  kiln_status_t status = kiln_cl_kernel_get(queue->device, program, kernel, &entry);
  if (status != KILN_OK) return status;
  return kiln_cl_launch_entry(queue, entry, work_dim, global, local, arg_count, args);
}

kiln_status_t kiln_cl_launch_entry(kiln_backend_queue_t *queue, const kiln_cl_kernel_entry_t *entry,
                                   cl_uint work_dim, const size_t *global, const size_t *local, size_t arg_count,
                                   const kiln_cl_arg_t *args) {
  /* An empty range is no work (and an error to OpenCL 1.2). */
  for (cl_uint d = 0; d < work_dim; d++)
    if (global[d] == 0) return KILN_OK;
  kiln_backend_device_t *device = queue->device;
  const char *kernel = entry->name;

  pthread_mutex_lock(&device->launch_lock);
  cl_int err = CL_SUCCESS;
  size_t bad_arg = 0;
  for (size_t i = 0; i < arg_count && err == CL_SUCCESS; i++) {
    err = set_arg(entry->kernel, (cl_uint)i, &args[i]);
    bad_arg = i;
  }
  if (err != CL_SUCCESS) {
    pthread_mutex_unlock(&device->launch_lock);
    return kiln_cl_check(device->ctx, err, "clSetKernelArg(%s, argument %zu) on opencl:%zu", kernel, bad_arg,
                         device->index);
  }
  err = clEnqueueNDRangeKernel(queue->queue, entry->kernel, work_dim, NULL, global, local, 0, NULL, NULL);
  pthread_mutex_unlock(&device->launch_lock);
  if (err != CL_SUCCESS) {
    char range[160];
    snprintf(range, sizeof range, "global %zu", global[0]);
    for (cl_uint d = 1; d < work_dim; d++)
      snprintf(range + strlen(range), sizeof range - strlen(range), "x%zu", global[d]);
    if (local) {
      snprintf(range + strlen(range), sizeof range - strlen(range), ", local %zu", local[0]);
      for (cl_uint d = 1; d < work_dim; d++)
        snprintf(range + strlen(range), sizeof range - strlen(range), "x%zu", local[d]);
    }
    return kiln_cl_check(device->ctx, err,
                         "clEnqueueNDRangeKernel(%s, %s; kernel work-group limit %zu, device %zu) on opencl:%zu (%s)",
                         kernel, range, entry->work_group_size, device->max_work_group_size, device->index,
                         device->desc.name);
  }
  return KILN_OK;
}

/* ---- the kernels of op kinds ---------------------------------------------------- */

/* The program whose source names `kind` on its "kiln-kinds:" line (the
 * kernel file's own list of the kinds it serves), or -1. */
static int program_of_kind(const char *kind) {
  const size_t len = strlen(kind);
  for (int p = 0; p < KILN_CL_PROGRAM_COUNT; p++) {
    const char *line = strstr((const char *)programs[p].source, "kiln-kinds:");
    if (!line) continue;
    const char *end = strchr(line, '\n');
    for (const char *at = line + 11; at && (!end || at < end); at = strchr(at, ' ')) {
      while (*at == ' ') at++;
      if (!strncmp(at, kind, len) && (at[len] == ' ' || at[len] == '\n' || at[len] == '*')) return p;
      if (!*at) break;
    }
  }
  return -1;
}

kiln_status_t kiln_cl_op_kernel(kiln_backend_device_t *device, const kiln_op_t *op,
                                const kiln_cl_kernel_entry_t **out_entry) {
  int formula_index;
  const char *formula = kiln_backend_formula_name(op, &formula_index);
  const uint32_t f = (uint32_t)formula_index;
  const uint32_t in_dtype = op->n_in > 0 ? (uint32_t)op->in[0].dtype + 1u : 0u;
  const uint32_t key = ((uint32_t)op->kind + 1u) | (f & 0xffu) << 8 | (in_dtype & 0xffu) << 16 |
                       ((uint32_t)op->out.dtype & 0xffu) << 24;
  uint32_t slot = (key * 2654435761u) >> 24; /* 256 slots */
  pthread_mutex_lock(&device->program_lock);
  for (uint32_t probe = 0; probe < KILN_CL_OP_KERNEL_SLOTS; probe++, slot = (slot + 1) % KILN_CL_OP_KERNEL_SLOTS) {
    const kiln_cl_op_kernel_t *at = &device->op_kernels[slot];
    if (at->key == key) {
      *out_entry = at->entry;
      pthread_mutex_unlock(&device->program_lock);
      return KILN_OK;
    }
    if (at->key == 0) break;
  }
  pthread_mutex_unlock(&device->program_lock);

  /* First use on this device: by name. */
  const char *kind = kiln_backend_op_kind_name(op->kind);
  char name[64];
  int n = snprintf(name, sizeof name, "%s", kind);
  if (formula) n += snprintf(name + n, sizeof name - (size_t)n, "_%s", formula);
  if (op->n_in > 0)
    n += snprintf(name + n, sizeof name - (size_t)n, "_%s", kiln_backend_dtype_name(op->in[0].dtype));
  snprintf(name + n, sizeof name - (size_t)n, "_%s", kiln_backend_dtype_name(op->out.dtype));
  const int program = program_of_kind(kind);
  if (program < 0)
    return kiln_cl_error(device->ctx, KILN_UNSUPPORTED,
                         "the OpenCL backend has no kernel '%s': no kernels/opencl file lists the kind '%s'", name,
                         kind);
  const kiln_cl_kernel_entry_t *entry = NULL;
  kiln_status_t status = kiln_cl_kernel_get(device, (kiln_cl_program_t)program, name, &entry);
  if (status != KILN_OK) return status;
  pthread_mutex_lock(&device->program_lock);
  slot = (key * 2654435761u) >> 24;
  for (uint32_t probe = 0; probe < KILN_CL_OP_KERNEL_SLOTS; probe++, slot = (slot + 1) % KILN_CL_OP_KERNEL_SLOTS) {
    kiln_cl_op_kernel_t *at = &device->op_kernels[slot];
    if (at->key == key) break; /* another thread got here first */
    if (at->key == 0) {
      at->entry = entry;
      at->key = key;
      break;
    }
  }
  pthread_mutex_unlock(&device->program_lock);
  *out_entry = entry;
  return KILN_OK;
}

void kiln_cl_programs_release(kiln_backend_device_t *device) {
  memset(device->op_kernels, 0, sizeof device->op_kernels);
  for (int p = 0; p < KILN_CL_PROGRAM_COUNT; p++) {
    kiln_cl_program_state_t *state = &device->programs[p];
    for (size_t i = 0; i < state->kernel_count; i++) (void)clReleaseKernel(state->kernels[i].kernel);
    if (state->program) (void)clReleaseProgram(state->program);
    free(state->build_error);
    free(state->cache_key);
    memset(state, 0, sizeof *state);
  }
}

/* For the tests: build one program of one device as its first launch would.
 * The context stays alive while the test uses it (the test's kiln holds it),
 * so the build runs outside debug_lock. */
KILN_PLUGIN_EXPORT kiln_status_t kiln_cl_debug_program_build(size_t device_index, const char *program_name);
KILN_PLUGIN_EXPORT kiln_status_t kiln_cl_debug_program_build(size_t device_index, const char *program_name) {
  pthread_mutex_lock(&debug_lock);
  kiln_backend_context_t *ctx = debug_contexts;
  pthread_mutex_unlock(&debug_lock);
  if (!ctx) return KILN_NOT_FOUND; /* no context to set a message through */
  if (device_index >= ctx->device_count)
    return kiln_cl_error(ctx, KILN_NOT_FOUND, "opencl:%zu does not exist (%zu OpenCL devices)", device_index,
                         ctx->device_count);
  for (int p = 0; p < KILN_CL_PROGRAM_COUNT; p++) {
    if (!program_name || strcmp(programs[p].name, program_name)) continue;
    cl_program program;
    return kiln_cl_program_get(&ctx->devices[device_index], (kiln_cl_program_t)p, &program);
  }
  return kiln_cl_error(ctx, KILN_NOT_FOUND, "no OpenCL program named '%s'", program_name ? program_name : "(null)");
}

/* For the tests: the bytes of scratch a round of batches may take (0: the
 * default). */
KILN_PLUGIN_EXPORT void kiln_cl_debug_scratch_budget(size_t bytes);
KILN_PLUGIN_EXPORT void kiln_cl_debug_scratch_budget(size_t bytes) {
  pthread_mutex_lock(&debug_lock);
  if (debug_contexts) atomic_store(&debug_contexts->scratch_budget, bytes);
  pthread_mutex_unlock(&debug_lock);
}

/* For the tests: the GEMM path every device takes (0: its own choice, 1:
 * packed, 2: tiled where the device can run it). */
KILN_PLUGIN_EXPORT void kiln_cl_debug_gemm_path(int path);
KILN_PLUGIN_EXPORT void kiln_cl_debug_gemm_path(int path) {
  pthread_mutex_lock(&debug_lock);
  if (debug_contexts) atomic_store(&debug_contexts->gemm_path, path);
  pthread_mutex_unlock(&debug_lock);
}
