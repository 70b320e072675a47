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

static const char *const kernel_names[KILN_CUDA_KERNEL_COUNT] = {
#define KILN_CUDA_NAME_(name) [KILN_CUDA_K_##name] = "kiln_" #name,
  KILN_CUDA_FIXED_KERNELS(KILN_CUDA_NAME_)
#undef KILN_CUDA_NAME_
#define KILN_UNARY_F32(NAME, expr) [KILN_CUDA_K_unary_f32_##NAME] = "kiln_unary_f32_" #NAME,
#define KILN_UNARY_I32(NAME, expr) [KILN_CUDA_K_unary_i32_##NAME] = "kiln_unary_i32_" #NAME,
#define KILN_BINARY_F32(NAME, expr)                                                                   \
  [KILN_CUDA_K_binary_f32_##NAME] = "kiln_binary_f32_" #NAME,                                          \
  [KILN_CUDA_K_binary_scalar_f32_##NAME] = "kiln_binary_scalar_f32_" #NAME,
#define KILN_BINARY_I32(NAME, expr)                                                                   \
  [KILN_CUDA_K_binary_i32_##NAME] = "kiln_binary_i32_" #NAME,                                          \
  [KILN_CUDA_K_binary_scalar_i32_##NAME] = "kiln_binary_scalar_i32_" #NAME,
#define KILN_UNARY_GRAD_F32(NAME, expr) [KILN_CUDA_K_unary_grad_f32_##NAME] = "kiln_unary_grad_f32_" #NAME,
#include "kernels/ops.def"
};

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
  for (int k = 0; k < KILN_CUDA_KERNEL_COUNT; k++) {
    r = cuModuleGetFunction(&device->kernels[k], device->module, kernel_names[k]);
    if (r != CUDA_SUCCESS) {
      kiln_cuda_check(ctx, r, "cuModuleGetFunction(%s) on cuda:%d", kernel_names[k], device->ordinal);
      snprintf(device->module_error, sizeof device->module_error, "%s", ctx->host.last_error());
      (void)cuModuleUnload(device->module);
      device->module = NULL;
      return;
    }
  }
}

void kiln_cuda_module_unload(kiln_backend_device_t *device) {
  if (device->module) (void)cuModuleUnload(device->module);
  device->module = NULL;
}

unsigned kiln_cuda_grid_for(const kiln_backend_device_t *device, int64_t n) {
  int64_t blocks = (n + KILN_CUDA_BLOCK - 1) / KILN_CUDA_BLOCK;
  if (blocks > device->max_grid) blocks = device->max_grid;
  if (blocks < 1) blocks = 1;
  return (unsigned)blocks;
}

kiln_status_t kiln_cuda_launch(kiln_backend_queue_t *queue, kiln_cuda_kernel_t kernel, unsigned grid_x,
                               unsigned grid_y, unsigned grid_z, unsigned block, void *args) {
  /* One pointer to the argument struct: nothing is allocated per launch. */
  void *params[1] = {args};
  CUresult r = cuLaunchKernel(queue->device->kernels[kernel], grid_x, grid_y, grid_z, block, 1, 1, 0, queue->stream,
                              params, NULL);
  if (r != CUDA_SUCCESS)
    return kiln_cuda_check(queue->device->ctx, r, "cuLaunchKernel(%s, grid %ux%ux%u, block %u) on cuda:%d",
                           kernel_names[kernel], grid_x, grid_y, grid_z, block, queue->device->ordinal);
  return KILN_OK;
}
