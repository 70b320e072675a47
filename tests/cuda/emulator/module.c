/* tests/cuda/emulator/module.c: modules from fatbins, kernel handles resolved to the host build of the kernels, and launches checked against the device's and the kernel's limits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

/* ---- fatbins -------------------------------------------------------------------------------- */

#define FC_FATBIN_MAGIC 0xBA55ED50u
#define FC_FATBIN_WRAPPER_MAGIC 0x466243b1u /* __fatBinC_Wrapper_t, what nvcc embeds for the runtime */
#define FC_FATBIN_PTX 1
#define FC_FATBIN_ELF 2

static uint32_t read32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static uint64_t read64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* Can the fatbin at image run on a device of compute capability major.minor:
 * SASS for sm_XY runs on X.Z with Z >= Y, PTX for compute_XY is compiled for
 * any cc >= XY. CUDA_SUCCESS, CUDA_ERROR_NO_BINARY_FOR_GPU, or (with a
 * message) CUDA_ERROR_INVALID_IMAGE. */
static CUresult check_fatbin(const unsigned char *image, int major, int minor, const char *call) {
  if (read32(image) == FC_FATBIN_WRAPPER_MAGIC) {
    const void *data;
    memcpy(&data, image + 8, sizeof data);
    image = data;
  }
  const uint32_t magic = read32(image);
  if (magic != FC_FATBIN_MAGIC) {
    if (!memcmp(image, "\x7f" "ELF", 4) || !memcmp(image, "//", 2) || !memcmp(image, ".version", 8))
      return fc_reject(CUDA_ERROR_NOT_SUPPORTED, call,
                       "the image is a cubin or PTX; the test driver loads fatbins only (nvcc -fatbin)");
    return fc_reject(CUDA_ERROR_INVALID_IMAGE, call, "the image starts with 0x%08x, not a fatbin's magic 0x%08x",
                     magic, FC_FATBIN_MAGIC);
  }
  const unsigned header = (unsigned)(image[6] | image[7] << 8);
  const uint64_t size = read64(image + 8);
  if (header < 16 || size > ((uint64_t)1 << 32))
    return fc_reject(CUDA_ERROR_INVALID_IMAGE, call, "fatbin header size %u, payload %llu bytes: not believable", header,
                     (unsigned long long)size);
  const int cc = major * 10 + minor;
  bool runs = false;
  for (uint64_t at = header; at < header + size;) {
    const unsigned char *entry = image + at;
    const unsigned kind = (unsigned)(entry[0] | entry[1] << 8);
    const uint32_t entry_header = read32(entry + 4);
    const uint64_t padded = read64(entry + 8);
    const uint32_t arch = read32(entry + 28);
    if (entry_header < 32 || entry_header + padded > header + size - at)
      return fc_reject(CUDA_ERROR_INVALID_IMAGE, call, "fatbin entry at offset %llu is truncated",
                       (unsigned long long)at);
    if (kind == FC_FATBIN_ELF && (int)arch / 10 == major && (int)arch % 10 <= minor) runs = true;
    if (kind == FC_FATBIN_PTX && (int)arch <= cc) runs = true;
    at += entry_header + padded;
  }
  return runs ? CUDA_SUCCESS : CUDA_ERROR_NO_BINARY_FOR_GPU;
}

/* ---- modules ---------------------------------------------------------------------------------- */

size_t fc_live_modules(const struct CUctx_st *ctx) {
  pthread_mutex_lock(&fc_lock);
  const size_t count = ctx->live_modules;
  pthread_mutex_unlock(&fc_lock);
  return count;
}

static CUresult load(CUmodule *module, const void *image, const char *call) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context(call, &r);
  if (!ctx) return r;
  if (!module || !image) return fc_reject(CUDA_ERROR_INVALID_VALUE, call, "module or image is NULL");
  r = check_fatbin(image, ctx->device->cc_major, ctx->device->cc_minor, call);
  if (r != CUDA_SUCCESS) return r; /* NO_BINARY_FOR_GPU is the driver's answer, not a misuse */
  /* Whatever the fatbin holds, its kernels are the host build's: the test
   * driver cannot read compressed entries, so it trusts that the fatbin and
   * the host build come from the same source (the build makes both). */
  struct CUmod_st *m = calloc(1, sizeof *m);
  struct CUfunc_st *functions = calloc(fakecuda__kernel_count ? fakecuda__kernel_count : 1, sizeof *functions);
  if (!m || !functions) {
    free(m);
    free(functions);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->kind = FC_KIND_MODULE;
  m->ctx = ctx;
  m->functions = functions;
  pthread_mutex_lock(&fc_lock);
  for (unsigned k = 0; k < fakecuda__kernel_count; k++) {
    functions[k].kind = FC_KIND_FUNCTION;
    functions[k].module = m;
    functions[k].kernel = &fakecuda__kernels[k];
    fc_handle_add(&functions[k]);
  }
  fc_handle_add(m);
  ctx->live_modules++;
  pthread_mutex_unlock(&fc_lock);
  *module = m;
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) { return load(module, image, "cuModuleLoadData"); }

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
  return load(module, fatCubin, "cuModuleLoadFatBinary");
}

/* Forget a module and its functions; false when it is not loaded. Launches
 * already queued hold the kernel, not the module. */
static bool unload(struct CUmod_st *m, const struct CUctx_st *only_of) {
  pthread_mutex_lock(&fc_lock);
  const bool ok = fc_handle_is(m, FC_KIND_MODULE) && (!only_of || m->ctx == only_of);
  if (ok) {
    for (unsigned k = 0; k < fakecuda__kernel_count; k++) fc_handle_remove(&m->functions[k]);
    fc_handle_remove(m);
    m->ctx->live_modules--;
  }
  pthread_mutex_unlock(&fc_lock);
  if (ok) {
    free(m->functions);
    free(m);
  }
  return ok;
}

static void unload_module_of(void *handle, void *ctx) { (void)unload(handle, ctx); }

void fc_context_modules_destroy(struct CUctx_st *ctx) { fc_handles_each(FC_KIND_MODULE, unload_module_of, ctx); }

CUresult cuModuleUnload(CUmodule hmod) {
  CUresult r;
  if (!fc_require_context("cuModuleUnload", &r)) return r;
  if (!unload(hmod, NULL))
    return fc_reject(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload", "%p is not a loaded module", (void *)hmod);
  return CUDA_SUCCESS;
}

static int compare_name(const void *key, const void *entry) {
  return strcmp(key, ((const fakecuda_kernel_t *)entry)->name);
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuModuleGetFunction", &r);
  if (!ctx) return r;
  if (!hfunc || !name) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction", "hfunc or name is NULL");
  pthread_mutex_lock(&fc_lock);
  const bool ok = fc_handle_is(hmod, FC_KIND_MODULE);
  const bool same = ok && hmod->ctx == ctx;
  pthread_mutex_unlock(&fc_lock);
  if (!ok) return fc_reject(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction", "%p is not a loaded module", (void *)hmod);
  if (!same)
    return fc_reject(CUDA_ERROR_INVALID_CONTEXT, "cuModuleGetFunction",
                     "the module was loaded in device %d's context, but the current context is device %d's",
                     hmod->ctx->device->ordinal, ctx->device->ordinal);
  const fakecuda_kernel_t *k =
      bsearch(name, fakecuda__kernels, fakecuda__kernel_count, sizeof fakecuda__kernels[0], compare_name);
  if (!k)
    return fc_reject(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction",
                     "no kernel '%s' in the module (the test driver has the %u entry points of "
                     "kernels/cuda/kiln.cu and its own selftest.cu)",
                     name, fakecuda__kernel_count);
  *hfunc = &hmod->functions[k - fakecuda__kernels];
  return CUDA_SUCCESS;
}

/* ---- launches ------------------------------------------------------------------------------------ */

/* Threads per block the kernel can take: its declared bound, and what its
 * registers allow (allocated per warp in units of 256). */
static unsigned max_threads_of(const fakecuda_kernel_t *k) {
  unsigned most = FC_MAX_THREADS_PER_BLOCK;
  if (k->max_threads && k->max_threads < most) most = k->max_threads;
  if (k->registers) {
    const unsigned per_warp = (k->registers * FC_WARP + 255u) / 256u * 256u;
    const unsigned by_registers = FC_REGISTERS_PER_BLOCK / per_warp * FC_WARP;
    if (by_registers < most) most = by_registers;
  }
  return most;
}

typedef struct launch_command_t {
  fc_command_t base;
  const fakecuda_kernel_t *kernel;
  fakecuda_dim3 grid, block;
  void *params[FAKECUDA_MAX_PARAMS];
  _Alignas(16) unsigned char values[]; /* the parameters' values, copied at the launch */
} launch_command_t;

static CUresult run_launch(fc_command_t *command) {
  launch_command_t *l = (launch_command_t *)command;
  const unsigned index = (unsigned)(l->kernel - fakecuda__kernels);
  atomic_fetch_add(&fc_stat_launches, 1);
  atomic_fetch_add(&fc_stat_kernel_launches[index], 1);
  char why[512];
  const CUresult r = fc_run_grid(l->kernel, l->params, l->grid, l->block, why, sizeof why);
  if (r != CUDA_SUCCESS)
    fc_complain("kernel %s (grid %ux%ux%u, block %ux%ux%u) faulted: %s: %s; the context is unusable from now on",
                l->kernel->name, l->grid.x, l->grid.y, l->grid.z, l->block.x, l->block.y, l->block.z,
                fc_result_name(r), why);
  return r;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
  static const char call[] = "cuLaunchKernel";
  CUresult r;
  struct CUctx_st *ctx = fc_require_context(call, &r);
  if (!ctx) return r;
  pthread_mutex_lock(&fc_lock);
  const bool live = fc_handle_is(f, FC_KIND_FUNCTION);
  const struct CUctx_st *owner = live ? f->module->ctx : NULL;
  pthread_mutex_unlock(&fc_lock);
  if (!live) return fc_reject(CUDA_ERROR_INVALID_HANDLE, call, "%p is not a function of a loaded module", (void *)f);
  const fakecuda_kernel_t *k = f->kernel;
  if (owner != ctx)
    return fc_reject(CUDA_ERROR_INVALID_CONTEXT, call,
                     "%s belongs to a module of device %d's context, but the current context is device %d's", k->name,
                     owner->device->ordinal, ctx->device->ordinal);
  if (!fc_stream_check(hStream, ctx, call, &r)) return r;

  /* The device's limits. */
  if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY || !blockDimZ)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, call, "%s: grid %ux%ux%u, block %ux%ux%u: no dimension may be 0",
                     k->name, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ);
  if (gridDimX > FC_MAX_GRID_X || gridDimY > FC_MAX_GRID_YZ || gridDimZ > FC_MAX_GRID_YZ)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, call, "%s: grid %ux%ux%u exceeds the device's %ux%ux%u", k->name,
                     gridDimX, gridDimY, gridDimZ, FC_MAX_GRID_X, FC_MAX_GRID_YZ, FC_MAX_GRID_YZ);
  const unsigned long long threads = (unsigned long long)blockDimX * blockDimY * blockDimZ;
  if (blockDimX > FC_MAX_BLOCK_X || blockDimY > FC_MAX_BLOCK_Y || blockDimZ > FC_MAX_BLOCK_Z ||
      threads > FC_MAX_THREADS_PER_BLOCK)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, call,
                     "%s: block %ux%ux%u exceeds the device's %ux%ux%u and %u threads per block", k->name, blockDimX,
                     blockDimY, blockDimZ, FC_MAX_BLOCK_X, FC_MAX_BLOCK_Y, FC_MAX_BLOCK_Z, FC_MAX_THREADS_PER_BLOCK);
  if ((unsigned long long)k->static_shared + sharedMemBytes > FC_SHARED_PER_BLOCK)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, call,
                     "%s: %u bytes of static and %u of dynamic shared memory exceed the %u a block may use",
                     k->name, k->static_shared, sharedMemBytes, FC_SHARED_PER_BLOCK);
  /* The kernel's own: __launch_bounds__ and registers (ptxas, sm_90). */
  if (threads > max_threads_of(k))
    return fc_reject(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, call,
                     "%s: block of %llu threads, but the kernel takes at most %u (launch bound %u, %u registers per "
                     "thread)",
                     k->name, threads, max_threads_of(k), k->max_threads, k->registers);
  if (extra)
    return fc_reject(CUDA_ERROR_NOT_SUPPORTED, call, "%s: the test driver takes kernelParams, not extra", k->name);
  if (k->param_count && !kernelParams)
    return fc_reject(CUDA_ERROR_INVALID_VALUE, call, "%s takes %u parameter(s), and kernelParams is NULL", k->name,
                     k->param_count);

  /* The values are copied now, as the driver does: the caller's argument
   * structs may be gone by the time the kernel runs. */
  size_t bytes = 0;
  for (unsigned i = 0; i < k->param_count; i++) bytes = (bytes + 15u) / 16u * 16u + k->param_size[i];
  launch_command_t *l = calloc(1, sizeof *l + bytes);
  if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
  l->base.run = run_launch;
  l->base.touches_memory = true;
  l->kernel = k;
  l->grid = (fakecuda_dim3){gridDimX, gridDimY, gridDimZ};
  l->block = (fakecuda_dim3){blockDimX, blockDimY, blockDimZ};
  size_t at = 0;
  for (unsigned i = 0; i < k->param_count; i++) {
    at = (at + 15u) / 16u * 16u;
    if (!kernelParams[i]) {
      free(l);
      return fc_reject(CUDA_ERROR_INVALID_VALUE, call, "%s: kernelParams[%u] is NULL", k->name, i);
    }
    memcpy(l->values + at, kernelParams[i], k->param_size[i]);
    l->params[i] = l->values + at;
    at += k->param_size[i];
  }
  return fc_stream_enqueue(hStream, ctx, &l->base);
}
