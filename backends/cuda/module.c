/* backends/cuda/module.c: the embedded fatbin: loading it per device, the kernel handles, launching, and which GPUs it covers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

/* The SASS architectures compiled in, "75,80,86,89,90"; PTX is added for the
 * last. Set by backends/cuda/meson.build from the nvcc_archs option. */
#ifndef KILN_CUDA_ARCHS
#error "KILN_CUDA_ARCHS must be defined by the build (the nvcc_archs option)"
#endif

void kiln_cuda_archs_parse(kiln_backend_context_t *ctx) {
  const char *s = KILN_CUDA_ARCHS;
  ctx->arch_count = 0;
  while (*s && ctx->arch_count < KILN_CUDA_MAX_ARCHS) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s) break;
    ctx->archs[ctx->arch_count++] = (int)v;
    s = *end ? end + 1 : end;
  }
  size_t used = 0;
  ctx->arch_text[0] = '\0';
  for (int i = 0; i < ctx->arch_count && used < sizeof ctx->arch_text; i++)
    used += (size_t)snprintf(ctx->arch_text + used, sizeof ctx->arch_text - used, "%ssm_%d", i ? "," : "",
                             ctx->archs[i]);
  if (ctx->arch_count && used < sizeof ctx->arch_text)
    snprintf(ctx->arch_text + used, sizeof ctx->arch_text - used, " + compute_%d PTX",
             ctx->archs[ctx->arch_count - 1]);
}

void kiln_cuda_coverage_warning(const kiln_backend_context_t *ctx, int major, int minor, char *out, size_t out_size) {
  const int *archs = ctx->archs;
  const int arch_count = ctx->arch_count;
  out[0] = '\0';
  const int cc = major * 10 + minor;
  /* SASS for sm_XY runs on X.Z with Z >= Y (same major); PTX for compute_XY
   * is JIT-compiled for any cc >= XY. */
  for (int i = 0; i < arch_count; i++)
    if (archs[i] / 10 == major && archs[i] % 10 <= minor) return;
  const int ptx = arch_count ? archs[arch_count - 1] : 0;
  if (arch_count && cc >= ptx)
    snprintf(out, out_size,
             "compute capability %d.%d is covered only by compute_%d PTX: the driver JIT-compiles kiln's kernels at "
             "first load (slow once, then cached by the driver); rebuild with nvcc_archs including %d for native code",
             major, minor, ptx, cc);
  else
    snprintf(out, out_size,
             "compute capability %d.%d is not covered by the kernels compiled in (%s): kiln's native kernels cannot "
             "run; rebuild with nvcc_archs including %d (CUDA 13 supports 75 and newer)",
             major, minor, ctx->arch_text, cc);
}

void kiln_cuda_module_load(kiln_backend_device_t *device) {
  kiln_backend_context_t *ctx = device->ctx;
  /* The caller made the device's context current. */
  CUresult r = cuModuleLoadData(&device->module, kiln_cuda_fatbin);
  if (r != CUDA_SUCCESS) {
    device->module = NULL;
    kiln_cuda_check(ctx, r, "cuModuleLoadData (kiln's fatbin, %zu bytes, %s) on cuda:%d (compute capability %d.%d)",
                    kiln_cuda_fatbin_size, ctx->arch_text, device->ordinal, device->cc_major, device->cc_minor);
    snprintf(device->module_error, sizeof device->module_error, "%s", ctx->host.last_error());
    return;
  }
  /* Kernels are looked up by name at their first use (kiln_cuda_kernel). */
}

void kiln_cuda_module_unload(kiln_backend_device_t *device) {
  if (device->module) (void)cuModuleUnload(device->module);
  device->module = NULL;
  memset(device->kernels, 0, sizeof device->kernels); /* their handles died with the module */
}

unsigned kiln_cuda_grid_for(const kiln_backend_device_t *device, int64_t n) {
  int64_t blocks = (n + KILN_CUDA_BLOCK - 1) / KILN_CUDA_BLOCK;
  if (blocks > device->max_grid) blocks = device->max_grid;
  if (blocks < 1) blocks = 1;
  return (unsigned)blocks;
}

/* ---- kernels by name, cached per device ------------------------------------------ */

/* Keys: a kind's kernel is (kind, formula, dtypes) with the top bit set; a
 * planner's kernel is its name's FNV-1a hash without it, the name compared
 * too. */
#define KIND_KEY_ ((uint64_t)1 << 63)

static uint64_t name_key(const char *name) {
  uint64_t h = 14695981039346656037ull;
  for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return h & ~KIND_KEY_;
}

/* The slot holding key (and name, for a planner's kernel), or the empty
 * slot where it belongs; NULL when the table is full. The lock is held. */
static kiln_cuda_function_t *probe(kiln_backend_device_t *device, uint64_t key, const char *name) {
  for (size_t i = 0; i < KILN_CUDA_KERNEL_SLOTS; i++) {
    kiln_cuda_function_t *slot = &device->kernels[(key + i) % KILN_CUDA_KERNEL_SLOTS];
    if (!slot->fn) return slot;
    if (slot->key == key && (!name || strcmp(slot->name, name) == 0)) return slot;
  }
  return NULL;
}

static kiln_status_t find(kiln_backend_device_t *device, uint64_t key, const char *name,
                          const kiln_cuda_function_t **out) {
  kiln_backend_context_t *ctx = device->ctx;
  kiln_status_t status = KILN_OK;
  pthread_mutex_lock(&device->kernel_lock);
  kiln_cuda_function_t *slot = probe(device, key, (key & KIND_KEY_) ? NULL : name);
  if (!slot) {
    status = kiln_cuda_error(ctx, KILN_OUT_OF_RESOURCES,
                             "cuda:%d holds %d kernels, no room for %s; raise KILN_CUDA_KERNEL_SLOTS",
                             device->ordinal, KILN_CUDA_KERNEL_SLOTS, name);
  } else if (!slot->fn) {
    CUfunction fn = NULL;
    const CUresult r = cuModuleGetFunction(&fn, device->module, name);
    if (r == CUDA_ERROR_NOT_FOUND)
      status = kiln_cuda_error(ctx, KILN_UNSUPPORTED,
                               "kiln's CUDA kernels have no %s (the op's kind for these dtypes): cuda:%d cannot "
                               "run it natively; use another dtype or backend",
                               name, device->ordinal);
    else
      status = kiln_cuda_check(ctx, r, "cuModuleGetFunction(%s) on cuda:%d", name, device->ordinal);
    if (status == KILN_OK) {
      snprintf(slot->name, sizeof slot->name, "%s", name);
      slot->key = key;
      slot->fn = fn;
    }
  }
  pthread_mutex_unlock(&device->kernel_lock);
  *out = status == KILN_OK ? slot : NULL;
  return status;
}

kiln_status_t kiln_cuda_kernel(kiln_backend_device_t *device, const char *name, const kiln_cuda_function_t **out) {
  return find(device, name_key(name), name, out);
}

kiln_status_t kiln_cuda_kind_kernel(kiln_backend_device_t *device, const kiln_op_t *op,
                                    const kiln_cuda_function_t **out) {
  int formula;
  const char *fname = kiln_backend_formula_name(op, &formula);
  const uint64_t in_dtype = op->n_in > 0 ? (uint64_t)op->in[0].dtype + 1 : 0;
  const uint64_t key = KIND_KEY_ | (uint64_t)op->kind | (uint64_t)formula << 8 | in_dtype << 16 |
                       (uint64_t)op->out.dtype << 24;
  /* The common case, a kernel met before, builds no name. */
  pthread_mutex_lock(&device->kernel_lock);
  const kiln_cuda_function_t *known = probe(device, key, NULL);
  pthread_mutex_unlock(&device->kernel_lock);
  if (known && known->fn) {
    *out = known;
    return KILN_OK;
  }
  char name[sizeof known->name];
  const char *kind = kiln_backend_op_kind_name(op->kind);
  const char *out_dtype = kiln_backend_dtype_name(op->out.dtype);
  if (op->kind == KILN_OP_CAST || op->kind == KILN_OP_WHERE)
    /* One kernel for every pair of dtypes, read from the record (kiln.cu). */
    snprintf(name, sizeof name, "kiln_%s", kind);
  else if (op->kind == KILN_OP_COMPARE)
    /* One kernel per formula for every dtype (kiln.cu). */
    snprintf(name, sizeof name, "kiln_%s_%s", kind, fname ? fname : "?");
  else if (op->n_in == 0)
    snprintf(name, sizeof name, "kiln_%s_%s", kind, out_dtype);
  else
    snprintf(name, sizeof name, "kiln_%s%s%s_%s_%s", kind, fname ? "_" : "", fname ? fname : "",
             kiln_backend_dtype_name(op->in[0].dtype), out_dtype);
  return find(device, key, name, out);
}

kiln_status_t kiln_cuda_launch(kiln_backend_queue_t *queue, const kiln_cuda_function_t *kernel, unsigned grid_x,
                               unsigned grid_y, unsigned grid_z, unsigned block, const kiln_kop_t *k) {
  /* One pointer to the record: nothing is allocated per launch. */
  void *params[1] = {(void *)k};
  CUresult r = cuLaunchKernel(kernel->fn, grid_x, grid_y, grid_z, block, 1, 1, 0, queue->stream, params, NULL);
  if (r != CUDA_SUCCESS)
    return kiln_cuda_check(queue->device->ctx, r, "cuLaunchKernel(%s, grid %ux%ux%u, block %u) on cuda:%d",
                           kernel->name, grid_x, grid_y, grid_z, block, queue->device->ordinal);
  return KILN_OK;
}

kiln_status_t kiln_cuda_launch_named(kiln_backend_queue_t *queue, const char *name, unsigned grid_x,
                                     unsigned grid_y, unsigned grid_z, unsigned block, const kiln_kop_t *k) {
  const kiln_cuda_function_t *kernel;
  kiln_status_t status = kiln_cuda_kernel(queue->device, name, &kernel);
  if (status == KILN_OK) status = kiln_cuda_launch(queue, kernel, grid_x, grid_y, grid_z, block, k);
  return status;
}

kiln_status_t kiln_cuda_launch_flat(kiln_backend_queue_t *queue, const char *name, int64_t n, const kiln_kop_t *k) {
  return kiln_cuda_launch_named(queue, name, kiln_cuda_grid_for(queue->device, n), 1, 1, KILN_CUDA_BLOCK, k);
}
