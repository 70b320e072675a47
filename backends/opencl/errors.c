/* backends/opencl/errors.c: the OpenCL plugin's one translator from cl_int and CLBlast status codes to kiln codes and messages. */
#include <stdarg.h>
#include <stdio.h>

#include "backends/opencl/opencl_backend.h"

/* Messages go to the core (host->set_error), which keeps the calling
 * thread's; the plugin keeps no copy and reads it back through
 * host->last_error. */
kiln_status_t kiln_cl_error(kiln_backend_context_t *ctx, kiln_status_t status, const char *fmt, ...) {
  char message[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  if (ctx && ctx->host.set_error) return ctx->host.set_error(status, "%s", message);
  return status;
}

const char *kiln_cl_last_error(const kiln_backend_context_t *ctx) {
  const char *message = ctx && ctx->host.last_error ? ctx->host.last_error() : NULL;
  return message ? message : "";
}

/* Every code of the OpenCL headers up to 3.0 and the extensions an ICD may
 * return, by number: the headers hide the newer ones behind
 * CL_TARGET_OPENCL_VERSION, and a 1.2 plugin may still meet them. */
#define KILN_CL_ERRORS(X)                                                                                   \
  X(0, CL_SUCCESS) X(-1, CL_DEVICE_NOT_FOUND) X(-2, CL_DEVICE_NOT_AVAILABLE) X(-3, CL_COMPILER_NOT_AVAILABLE) \
  X(-4, CL_MEM_OBJECT_ALLOCATION_FAILURE) X(-5, CL_OUT_OF_RESOURCES) X(-6, CL_OUT_OF_HOST_MEMORY)           \
  X(-7, CL_PROFILING_INFO_NOT_AVAILABLE) X(-8, CL_MEM_COPY_OVERLAP) X(-9, CL_IMAGE_FORMAT_MISMATCH)         \
  X(-10, CL_IMAGE_FORMAT_NOT_SUPPORTED) X(-11, CL_BUILD_PROGRAM_FAILURE) X(-12, CL_MAP_FAILURE)             \
  X(-13, CL_MISALIGNED_SUB_BUFFER_OFFSET) X(-14, CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)              \
  X(-15, CL_COMPILE_PROGRAM_FAILURE) X(-16, CL_LINKER_NOT_AVAILABLE) X(-17, CL_LINK_PROGRAM_FAILURE)        \
  X(-18, CL_DEVICE_PARTITION_FAILED) X(-19, CL_KERNEL_ARG_INFO_NOT_AVAILABLE) X(-30, CL_INVALID_VALUE)      \
  X(-31, CL_INVALID_DEVICE_TYPE) X(-32, CL_INVALID_PLATFORM) X(-33, CL_INVALID_DEVICE)                      \
  X(-34, CL_INVALID_CONTEXT) X(-35, CL_INVALID_QUEUE_PROPERTIES) X(-36, CL_INVALID_COMMAND_QUEUE)           \
  X(-37, CL_INVALID_HOST_PTR) X(-38, CL_INVALID_MEM_OBJECT) X(-39, CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)      \
  X(-40, CL_INVALID_IMAGE_SIZE) X(-41, CL_INVALID_SAMPLER) X(-42, CL_INVALID_BINARY)                        \
  X(-43, CL_INVALID_BUILD_OPTIONS) X(-44, CL_INVALID_PROGRAM) X(-45, CL_INVALID_PROGRAM_EXECUTABLE)         \
  X(-46, CL_INVALID_KERNEL_NAME) X(-47, CL_INVALID_KERNEL_DEFINITION) X(-48, CL_INVALID_KERNEL)             \
  X(-49, CL_INVALID_ARG_INDEX) X(-50, CL_INVALID_ARG_VALUE) X(-51, CL_INVALID_ARG_SIZE)                     \
  X(-52, CL_INVALID_KERNEL_ARGS) X(-53, CL_INVALID_WORK_DIMENSION) X(-54, CL_INVALID_WORK_GROUP_SIZE)       \
  X(-55, CL_INVALID_WORK_ITEM_SIZE) X(-56, CL_INVALID_GLOBAL_OFFSET) X(-57, CL_INVALID_EVENT_WAIT_LIST)     \
  X(-58, CL_INVALID_EVENT) X(-59, CL_INVALID_OPERATION) X(-60, CL_INVALID_GL_OBJECT)                        \
  X(-61, CL_INVALID_BUFFER_SIZE) X(-62, CL_INVALID_MIP_LEVEL) X(-63, CL_INVALID_GLOBAL_WORK_SIZE)           \
  X(-64, CL_INVALID_PROPERTY) X(-65, CL_INVALID_IMAGE_DESCRIPTOR) X(-66, CL_INVALID_COMPILER_OPTIONS)       \
  X(-67, CL_INVALID_LINKER_OPTIONS) X(-68, CL_INVALID_DEVICE_PARTITION_COUNT) X(-69, CL_INVALID_PIPE_SIZE)  \
  X(-70, CL_INVALID_DEVICE_QUEUE) X(-71, CL_INVALID_SPEC_ID) X(-72, CL_MAX_SIZE_RESTRICTION_EXCEEDED)       \
  X(-1000, CL_INVALID_GL_SHAREGROUP_REFERENCE_KHR) X(-1001, CL_PLATFORM_NOT_FOUND_KHR)                      \
  X(-1002, CL_INVALID_D3D10_DEVICE_KHR) X(-1003, CL_INVALID_D3D10_RESOURCE_KHR)                             \
  X(-1004, CL_D3D10_RESOURCE_ALREADY_ACQUIRED_KHR) X(-1005, CL_D3D10_RESOURCE_NOT_ACQUIRED_KHR)             \
  X(-1057, CL_DEVICE_PARTITION_FAILED_EXT) X(-1058, CL_INVALID_PARTITION_COUNT_EXT)                         \
  X(-1059, CL_INVALID_PARTITION_NAME_EXT) X(-1092, CL_EGL_RESOURCE_NOT_ACQUIRED_KHR)                        \
  X(-1093, CL_INVALID_EGL_OBJECT_KHR) X(-1094, CL_INVALID_ACCELERATOR_INTEL)                                \
  X(-1095, CL_INVALID_ACCELERATOR_TYPE_INTEL) X(-1096, CL_INVALID_ACCELERATOR_DESCRIPTOR_INTEL)             \
  X(-1097, CL_ACCELERATOR_TYPE_NOT_SUPPORTED_INTEL) X(-1098, CL_INVALID_VA_API_MEDIA_ADAPTER_INTEL)         \
  X(-1099, CL_INVALID_VA_API_MEDIA_SURFACE_INTEL) X(-1100, CL_VA_API_MEDIA_SURFACE_ALREADY_ACQUIRED_INTEL)  \
  X(-1101, CL_VA_API_MEDIA_SURFACE_NOT_ACQUIRED_INTEL) X(-1108, CL_COMMAND_TERMINATED_ITSELF_WITH_FAILURE_ARM) \
  X(-1121, CL_CONTEXT_TERMINATED_KHR) X(-1138, CL_INVALID_COMMAND_BUFFER_KHR)                               \
  X(-1139, CL_INVALID_SYNC_POINT_WAIT_LIST_KHR) X(-1140, CL_INCOMPATIBLE_COMMAND_QUEUE_KHR)                 \
  X(-1141, CL_INVALID_MUTABLE_COMMAND_KHR) X(-1142, CL_INVALID_SEMAPHORE_KHR)                               \
  X(-9999, CL_NV_ILLEGAL_BUFFER_ACTION)

const char *kiln_cl_error_name(cl_int err) {
  switch (err) {
#define KILN_CL_ERROR_NAME_(value, name) \
  case value: return #name;
    KILN_CL_ERRORS(KILN_CL_ERROR_NAME_)
#undef KILN_CL_ERROR_NAME_
  default: return "unknown cl_int";
  }
}

kiln_status_t kiln_cl_status_of(cl_int err) {
  switch (err) {
  case CL_SUCCESS: return KILN_OK;
  case CL_MEM_OBJECT_ALLOCATION_FAILURE:
  case CL_OUT_OF_HOST_MEMORY:
  case CL_INVALID_BUFFER_SIZE: return KILN_OUT_OF_MEMORY;
  case CL_OUT_OF_RESOURCES:
  case CL_INVALID_WORK_GROUP_SIZE:
  case CL_INVALID_WORK_ITEM_SIZE:
  case CL_INVALID_GLOBAL_WORK_SIZE:
  case -72: /* CL_MAX_SIZE_RESTRICTION_EXCEEDED */ return KILN_OUT_OF_RESOURCES;
  case CL_DEVICE_NOT_FOUND:
  case CL_DEVICE_NOT_AVAILABLE:
  case CL_COMPILER_NOT_AVAILABLE:
  case CL_LINKER_NOT_AVAILABLE:
  case -1001: /* CL_PLATFORM_NOT_FOUND_KHR */ return KILN_UNAVAILABLE;
  case CL_BUILD_PROGRAM_FAILURE:
  case CL_COMPILE_PROGRAM_FAILURE:
  case CL_LINK_PROGRAM_FAILURE:
  case CL_INVALID_BINARY:
  case CL_INVALID_BUILD_OPTIONS:
  case CL_INVALID_COMPILER_OPTIONS:
  case CL_INVALID_LINKER_OPTIONS:
  case CL_INVALID_PROGRAM_EXECUTABLE:
  case CL_INVALID_KERNEL_NAME:
  case CL_INVALID_KERNEL_DEFINITION: return KILN_BUILD_FAILED;
  case CL_PROFILING_INFO_NOT_AVAILABLE: return KILN_NOT_READY;
  case CL_INVALID_PROPERTY:
  case CL_INVALID_QUEUE_PROPERTIES:
  case CL_IMAGE_FORMAT_NOT_SUPPORTED: return KILN_UNSUPPORTED;
  /* A command failed on the device; the context may be unusable after it. */
  case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST:
  case -1108: /* CL_COMMAND_TERMINATED_ITSELF_WITH_FAILURE_ARM */
  case -1121: /* CL_CONTEXT_TERMINATED_KHR */ return KILN_DEVICE_LOST;
  case CL_INVALID_VALUE:
  case CL_INVALID_ARG_VALUE:
  case CL_INVALID_ARG_SIZE:
  case CL_INVALID_ARG_INDEX:
  case CL_INVALID_KERNEL_ARGS: return KILN_INVALID_ARGUMENT;
  default: return KILN_INTERNAL;
  }
}

/* What a user can do about each kind of failure. */
static const char *advice_for(kiln_status_t status) {
  switch (status) {
  case KILN_OUT_OF_MEMORY: return "free device memory (release tensors) or use smaller ones";
  case KILN_OUT_OF_RESOURCES: return "the device's limits do not allow this launch: use smaller shapes, or report the "
                                     "shape and device to kiln's maintainers";
  case KILN_UNAVAILABLE: return "check the OpenCL installation with clinfo; kiln's other backends still work";
  case KILN_BUILD_FAILED: return "the kernel does not compile for this device (see the log); check "
                                 "KILN_OPENCL_BUILD_OPTIONS and the driver";
  case KILN_DEVICE_LOST: return "the device's context may be unusable: restart the program; if it repeats, run "
                                "it under Oclgrind and report the operation";
  case KILN_UNSUPPORTED: return "this device or driver does not offer the feature";
  case KILN_NOT_READY: return "the work has not completed yet; wait for it first";
  default: return "this is a bug in kiln's OpenCL backend or the driver: please report it with the call";
  }
}

kiln_status_t kiln_cl_check(kiln_backend_context_t *ctx, cl_int err, const char *call_fmt, ...) {
  if (err == CL_SUCCESS) return KILN_OK;
  char call[768] = "an OpenCL call";
  if (call_fmt) {
    va_list args;
    va_start(args, call_fmt);
    vsnprintf(call, sizeof call, call_fmt, args);
    va_end(args);
  }
  kiln_status_t status = kiln_cl_status_of(err);
  return kiln_cl_error(ctx, status, "%s failed: %s (%d); %s", call, kiln_cl_error_name(err), (int)err,
                       advice_for(status));
}

/* ---- CLBlast's status codes (clblast_c.h's CLBlastStatusCode) --------------- */

const char *kiln_cl_clblast_status_name(int status) {
  switch (status) {
  case -1024: return "CLBlastNotImplemented";
  case -1022: return "CLBlastInvalidMatrixA";
  case -1021: return "CLBlastInvalidMatrixB";
  case -1020: return "CLBlastInvalidMatrixC";
  case -1019: return "CLBlastInvalidVectorX";
  case -1018: return "CLBlastInvalidVectorY";
  case -1017: return "CLBlastInvalidDimension";
  case -1016: return "CLBlastInvalidLeadDimA";
  case -1015: return "CLBlastInvalidLeadDimB";
  case -1014: return "CLBlastInvalidLeadDimC";
  case -1013: return "CLBlastInvalidIncrementX";
  case -1012: return "CLBlastInvalidIncrementY";
  case -1011: return "CLBlastInsufficientMemoryA";
  case -1010: return "CLBlastInsufficientMemoryB";
  case -1009: return "CLBlastInsufficientMemoryC";
  case -1008: return "CLBlastInsufficientMemoryX";
  case -1007: return "CLBlastInsufficientMemoryY";
  case -2050: return "CLBlastInsufficientMemoryTemp";
  case -2049: return "CLBlastInvalidBatchCount";
  case -2048: return "CLBlastInvalidOverrideKernel";
  case -2047: return "CLBlastMissingOverrideParameter";
  case -2046: return "CLBlastInvalidLocalMemUsage";
  case -2045: return "CLBlastNoHalfPrecision";
  case -2044: return "CLBlastNoDoublePrecision";
  case -2043: return "CLBlastInvalidVectorScalar";
  case -2042: return "CLBlastInsufficientMemoryScalar";
  case -2041: return "CLBlastDatabaseError";
  case -2040: return "CLBlastUnknownError";
  case -2039: return "CLBlastUnexpectedError";
  /* The rest are OpenCL's own codes, passed through. */
  default: return kiln_cl_error_name((cl_int)status);
  }
}

kiln_status_t kiln_cl_clblast_check(kiln_backend_context_t *ctx, int status, const char *call_fmt, ...) {
  if (status == 0) return KILN_OK;
  kiln_status_t code;
  if (status > -1000) {
    code = kiln_cl_status_of((cl_int)status);
  } else {
    switch (status) {
    case -2050: case -2046: code = KILN_OUT_OF_RESOURCES; break;
    /* Arguments CLBlast refuses are ones the native kernels still run. */
    case -1024: case -1017: case -1016: case -1015: case -1014: case -1011: case -1010: case -1009:
    case -2049: case -2045: case -2044: case -2041: code = KILN_UNSUPPORTED; break;
    case -2048: case -2047: code = KILN_INVALID_ARGUMENT; break;
    default: code = KILN_INTERNAL; break;
    }
  }
  char call[768] = "a CLBlast call";
  if (call_fmt) {
    va_list args;
    va_start(args, call_fmt);
    vsnprintf(call, sizeof call, call_fmt, args);
    va_end(args);
  }
  return kiln_cl_error(ctx, code, "%s failed: %s (%d); %s", call, kiln_cl_clblast_status_name(status), status,
                       code == KILN_UNSUPPORTED ? "the native provider runs these arguments" : advice_for(code));
}
