/* backends/cuda/errors.c: the CUDA plugin's one translator from CUresult, cublasStatus_t and cudnnStatus_t to kiln codes and messages. */
#include <stdarg.h>
#include <stdio.h>

#include "backends/cuda/cuda_backend.h"

kiln_status_t kiln_cuda_error(kiln_backend_context_t *ctx, kiln_status_t status, const char *fmt, ...) {
  /* Formatted into storage of our own first: the arguments may include the
   * thread's current message, which set_error is about to overwrite. */
  char message[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  return ctx->host.set_error(status, "%s", message);
}

const char *kiln_cuda_result_name(CUresult result) {
  /* cuGetErrorName first (it knows codes newer than this file); the table
   * below answers when the driver cannot (the toolkit's link stub, a
   * half-installed driver). */
  const char *name = NULL;
  if (cuGetErrorName(result, &name) == CUDA_SUCCESS && name) return name;
  switch (result) {
#define KILN_CUDA_NAME_(NAME) \
  case NAME: return #NAME;
    KILN_CUDA_NAME_(CUDA_ERROR_ALREADY_ACQUIRED)
    KILN_CUDA_NAME_(CUDA_ERROR_ALREADY_MAPPED)
    KILN_CUDA_NAME_(CUDA_ERROR_ARRAY_IS_MAPPED)
    KILN_CUDA_NAME_(CUDA_ERROR_ASSERT)
    KILN_CUDA_NAME_(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER)
    KILN_CUDA_NAME_(CUDA_ERROR_CAPTURED_EVENT)
    KILN_CUDA_NAME_(CUDA_ERROR_CDP_NOT_SUPPORTED)
    KILN_CUDA_NAME_(CUDA_ERROR_CDP_VERSION_MISMATCH)
    KILN_CUDA_NAME_(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)
    KILN_CUDA_NAME_(CUDA_ERROR_CONTAINED)
    KILN_CUDA_NAME_(CUDA_ERROR_CONTEXT_ALREADY_CURRENT)
    KILN_CUDA_NAME_(CUDA_ERROR_CONTEXT_ALREADY_IN_USE)
    KILN_CUDA_NAME_(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    KILN_CUDA_NAME_(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE)
    KILN_CUDA_NAME_(CUDA_ERROR_DEINITIALIZED)
    KILN_CUDA_NAME_(CUDA_ERROR_DEVICE_NOT_LICENSED)
    KILN_CUDA_NAME_(CUDA_ERROR_DEVICE_UNAVAILABLE)
    KILN_CUDA_NAME_(CUDA_ERROR_ECC_UNCORRECTABLE)
    KILN_CUDA_NAME_(CUDA_ERROR_EXTERNAL_DEVICE)
    KILN_CUDA_NAME_(CUDA_ERROR_FILE_NOT_FOUND)
    KILN_CUDA_NAME_(CUDA_ERROR_FUNCTION_NOT_LOADED)
    KILN_CUDA_NAME_(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
    KILN_CUDA_NAME_(CUDA_ERROR_HARDWARE_STACK_ERROR)
    KILN_CUDA_NAME_(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
    KILN_CUDA_NAME_(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    KILN_CUDA_NAME_(CUDA_ERROR_ILLEGAL_ADDRESS)
    KILN_CUDA_NAME_(CUDA_ERROR_ILLEGAL_INSTRUCTION)
    KILN_CUDA_NAME_(CUDA_ERROR_ILLEGAL_STATE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_ADDRESS_SPACE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_CLUSTER_SIZE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_CONTEXT)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_DEVICE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_HANDLE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_IMAGE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_PC)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_PTX)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_RESOURCE_TYPE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_SOURCE)
    KILN_CUDA_NAME_(CUDA_ERROR_INVALID_VALUE)
    KILN_CUDA_NAME_(CUDA_ERROR_JIT_COMPILATION_DISABLED)
    KILN_CUDA_NAME_(CUDA_ERROR_JIT_COMPILER_NOT_FOUND)
    KILN_CUDA_NAME_(CUDA_ERROR_KEY_ROTATION)
    KILN_CUDA_NAME_(CUDA_ERROR_LAUNCH_FAILED)
    KILN_CUDA_NAME_(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING)
    KILN_CUDA_NAME_(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
    KILN_CUDA_NAME_(CUDA_ERROR_LAUNCH_TIMEOUT)
    KILN_CUDA_NAME_(CUDA_ERROR_LOSSY_QUERY)
    KILN_CUDA_NAME_(CUDA_ERROR_MAP_FAILED)
    KILN_CUDA_NAME_(CUDA_ERROR_MISALIGNED_ADDRESS)
    KILN_CUDA_NAME_(CUDA_ERROR_MPS_CLIENT_TERMINATED)
    KILN_CUDA_NAME_(CUDA_ERROR_MPS_CONNECTION_FAILED)
    KILN_CUDA_NAME_(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED)
    KILN_CUDA_NAME_(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED)
    KILN_CUDA_NAME_(CUDA_ERROR_MPS_RPC_FAILURE)
    KILN_CUDA_NAME_(CUDA_ERROR_MPS_SERVER_NOT_READY)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_FOUND)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_INITIALIZED)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_MAPPED)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_MAPPED_AS_ARRAY)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_MAPPED_AS_POINTER)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_PERMITTED)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_READY)
    KILN_CUDA_NAME_(CUDA_ERROR_NOT_SUPPORTED)
    KILN_CUDA_NAME_(CUDA_ERROR_NO_BINARY_FOR_GPU)
    KILN_CUDA_NAME_(CUDA_ERROR_NO_DEVICE)
    KILN_CUDA_NAME_(CUDA_ERROR_NVLINK_UNCORRECTABLE)
    KILN_CUDA_NAME_(CUDA_ERROR_OPERATING_SYSTEM)
    KILN_CUDA_NAME_(CUDA_ERROR_OUT_OF_MEMORY)
    KILN_CUDA_NAME_(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    KILN_CUDA_NAME_(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    KILN_CUDA_NAME_(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
    KILN_CUDA_NAME_(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE)
    KILN_CUDA_NAME_(CUDA_ERROR_PROFILER_ALREADY_STARTED)
    KILN_CUDA_NAME_(CUDA_ERROR_PROFILER_ALREADY_STOPPED)
    KILN_CUDA_NAME_(CUDA_ERROR_PROFILER_DISABLED)
    KILN_CUDA_NAME_(CUDA_ERROR_PROFILER_NOT_INITIALIZED)
    KILN_CUDA_NAME_(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED)
    KILN_CUDA_NAME_(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_MERGE)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    KILN_CUDA_NAME_(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    KILN_CUDA_NAME_(CUDA_ERROR_STUB_LIBRARY)
    KILN_CUDA_NAME_(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
    KILN_CUDA_NAME_(CUDA_ERROR_SYSTEM_NOT_READY)
    KILN_CUDA_NAME_(CUDA_ERROR_TENSOR_MEMORY_LEAK)
    KILN_CUDA_NAME_(CUDA_ERROR_TIMEOUT)
    KILN_CUDA_NAME_(CUDA_ERROR_TOO_MANY_PEERS)
    KILN_CUDA_NAME_(CUDA_ERROR_UNKNOWN)
    KILN_CUDA_NAME_(CUDA_ERROR_UNMAP_FAILED)
    KILN_CUDA_NAME_(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC)
    KILN_CUDA_NAME_(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY)
    KILN_CUDA_NAME_(CUDA_ERROR_UNSUPPORTED_LIMIT)
    KILN_CUDA_NAME_(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
#undef KILN_CUDA_NAME_
  default: return "unknown CUresult";
  }
}

kiln_status_t kiln_cuda_status_of(CUresult result) {
  switch (result) {
  case CUDA_SUCCESS: return KILN_OK;
  case CUDA_ERROR_OUT_OF_MEMORY: return KILN_OUT_OF_MEMORY;
  case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
  case CUDA_ERROR_TOO_MANY_PEERS:
  case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
  case CUDA_ERROR_INVALID_CLUSTER_SIZE: return KILN_OUT_OF_RESOURCES;
  case CUDA_ERROR_NOT_READY: return KILN_NOT_READY;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE:
  case CUDA_ERROR_NOT_INITIALIZED:
  case CUDA_ERROR_DEINITIALIZED:
  case CUDA_ERROR_STUB_LIBRARY:
  case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
  case CUDA_ERROR_DEVICE_UNAVAILABLE:
  case CUDA_ERROR_DEVICE_NOT_LICENSED:
  case CUDA_ERROR_SYSTEM_NOT_READY:
  case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
  case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
  case CUDA_ERROR_NO_BINARY_FOR_GPU:
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
  case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
  case CUDA_ERROR_JIT_COMPILATION_DISABLED:
  case CUDA_ERROR_MPS_CONNECTION_FAILED:
  case CUDA_ERROR_MPS_SERVER_NOT_READY:
  case CUDA_ERROR_MPS_MAX_CLIENTS_REACHED:
  case CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED:
  case CUDA_ERROR_NOT_PERMITTED: return KILN_UNAVAILABLE;
  case CUDA_ERROR_INVALID_IMAGE:
  case CUDA_ERROR_INVALID_PTX:
  case CUDA_ERROR_INVALID_SOURCE:
  case CUDA_ERROR_SHARED_OBJECT_INIT_FAILED: return KILN_BUILD_FAILED;
  case CUDA_ERROR_NOT_SUPPORTED:
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: return KILN_UNSUPPORTED;
  case CUDA_ERROR_NOT_FOUND:
  case CUDA_ERROR_FILE_NOT_FOUND: return KILN_NOT_FOUND;
  /* The context is unusable after these: every later call fails too. */
  case CUDA_ERROR_ILLEGAL_ADDRESS:
  case CUDA_ERROR_LAUNCH_FAILED:
  case CUDA_ERROR_LAUNCH_TIMEOUT:
  case CUDA_ERROR_ECC_UNCORRECTABLE:
  case CUDA_ERROR_NVLINK_UNCORRECTABLE:
  case CUDA_ERROR_HARDWARE_STACK_ERROR:
  case CUDA_ERROR_ILLEGAL_INSTRUCTION:
  case CUDA_ERROR_MISALIGNED_ADDRESS:
  case CUDA_ERROR_INVALID_ADDRESS_SPACE:
  case CUDA_ERROR_INVALID_PC:
  case CUDA_ERROR_ASSERT:
  case CUDA_ERROR_CONTEXT_IS_DESTROYED:
  case CUDA_ERROR_CONTAINED:
  case CUDA_ERROR_EXTERNAL_DEVICE:
  case CUDA_ERROR_MPS_RPC_FAILURE:
  case CUDA_ERROR_MPS_CLIENT_TERMINATED: return KILN_DEVICE_LOST;
  default: return KILN_INTERNAL;
  }
}

/* What a user can do about each kind of failure. */
static const char *advice_for(kiln_status_t status) {
  switch (status) {
  case KILN_OUT_OF_MEMORY: return "free device memory (release tensors) or use smaller ones";
  case KILN_OUT_OF_RESOURCES: return "use smaller shapes, or report the shape to kiln's maintainers";
  case KILN_UNAVAILABLE: return "check the NVIDIA driver with nvidia-smi; kiln's other backends still work";
  case KILN_BUILD_FAILED: return "the kernels in the plugin do not suit this driver or GPU; rebuild kiln with nvcc_archs "
                                 "covering it, or update the driver";
  case KILN_DEVICE_LOST: return "the device's context is unusable: restart the program; if it repeats, "
                                "run it under compute-sanitizer and report the operation";
  case KILN_UNSUPPORTED: return "this device or driver does not offer the feature";
  default: return "this is a bug in kiln's CUDA backend or the driver: please report it with the call";
  }
}

kiln_status_t kiln_cuda_check(kiln_backend_context_t *ctx, CUresult result, const char *call_fmt, ...) {
  if (result == CUDA_SUCCESS) return KILN_OK;
  char call[512] = "a CUDA call";
  if (call_fmt) {
    va_list args;
    va_start(args, call_fmt);
    vsnprintf(call, sizeof call, call_fmt, args);
    va_end(args);
  }
  const char *name = kiln_cuda_result_name(result), *text = NULL;
  if (cuGetErrorString(result, &text) != CUDA_SUCCESS || !text) text = "no description";
  kiln_status_t status = kiln_cuda_status_of(result);
  return kiln_cuda_error(ctx, status, "%s failed: %s (%d, %s); %s", call, name, (int)result, text,
                         advice_for(status));
}

static const char *cublas_status_name(int status) {
  switch (status) {
  case 0: return "CUBLAS_STATUS_SUCCESS";
  case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
  case 7: return "CUBLAS_STATUS_INVALID_VALUE";
  case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
  case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
  default: return "unknown cublasStatus_t";
  }
}

kiln_status_t kiln_cuda_cublas_check(kiln_backend_context_t *ctx, int status, const char *call_fmt, ...) {
  if (status == 0) return KILN_OK;
  kiln_status_t code;
  switch (status) {
  case 1: code = KILN_UNAVAILABLE; break;
  case 3: code = KILN_OUT_OF_MEMORY; break;
  /* Arguments cuBLAS refuses are ones the native kernels still run. */
  case 7: case 8: case 15: code = KILN_UNSUPPORTED; break;
  case 13: code = KILN_DEVICE_LOST; break;
  case 16: code = KILN_UNAVAILABLE; break;
  default: code = KILN_INTERNAL; break;
  }
  char call[512] = "a CUDA call";
  if (call_fmt) {
    va_list args;
    va_start(args, call_fmt);
    vsnprintf(call, sizeof call, call_fmt, args);
    va_end(args);
  }
  return kiln_cuda_error(ctx, code, "%s failed: %s (%d); %s", call, cublas_status_name(status), status,
                         code == KILN_UNSUPPORTED   ? "the native provider runs these arguments"
                         : code == KILN_UNAVAILABLE ? "cuBLAS cannot work on this device; the native provider runs "
                                                      "instead"
                                                    : advice_for(code));
}

kiln_status_t kiln_cuda_cudnn_check(kiln_backend_context_t *ctx, int status, const char *name, const char *call_fmt,
                                    ...) {
  if (status == 0) return KILN_OK;
  /* cuDNN 9 groups its codes by thousands: 1xxx not initialised / library
   * problems, 2xxx bad parameters, 3xxx not supported, 4xxx internal
   * (4003/4004 allocation), 5xxx execution failed. */
  kiln_status_t code;
  if (status == 4003 || status == 4004)
    code = KILN_OUT_OF_MEMORY;
  else if (status >= 1000 && status < 2000)
    code = KILN_UNAVAILABLE;
  else if (status >= 3005 && status <= 3009)
    /* An incompatible driver or CUDA runtime, a GPU cuDNN does not know, a
     * prerequisite or sub-library that does not load: cuDNN cannot work on
     * this device at all, whatever the arguments. */
    code = KILN_UNAVAILABLE;
  else if (status >= 2000 && status < 4000)
    code = KILN_UNSUPPORTED;
  else if (status >= 5000 && status < 6000)
    code = KILN_DEVICE_LOST;
  else
    code = KILN_INTERNAL;
  char call[512] = "a CUDA call";
  if (call_fmt) {
    va_list args;
    va_start(args, call_fmt);
    vsnprintf(call, sizeof call, call_fmt, args);
    va_end(args);
  }
  return kiln_cuda_error(ctx, code, "%s failed: %s (%d); %s", call, name ? name : "unknown cudnnStatus_t", status,
                         code == KILN_UNSUPPORTED   ? "the native provider runs these arguments"
                         : code == KILN_UNAVAILABLE ? "cuDNN cannot work on this device; the native provider runs "
                                                      "instead (check the cuDNN install: devinfo -v shows which)"
                                                    : advice_for(code));
}
