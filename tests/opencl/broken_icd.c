/* tests/opencl/broken_icd.c: a fake OpenCL platform whose device listing fails, registered beside PoCL to prove enumeration goes on. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl_icd.h>
#include <string.h>

/* An ICD platform object starts with the dispatch table pointer. */
struct _cl_platform_id {
  cl_icd_dispatch *dispatch;
};

static cl_icd_dispatch dispatch;
static struct _cl_platform_id platform = {&dispatch};

static cl_int CL_API_CALL broken_get_platform_info(cl_platform_id id, cl_platform_info name, size_t size, void *value,
                                                   size_t *size_ret) {
  const char *text;
  switch (name) {
  case CL_PLATFORM_NAME: text = "kiln broken test platform"; break;
  case CL_PLATFORM_VENDOR: text = "kiln tests"; break;
  case CL_PLATFORM_VERSION: text = "OpenCL 1.2 broken"; break;
  case CL_PLATFORM_PROFILE: text = "FULL_PROFILE"; break;
  case CL_PLATFORM_EXTENSIONS: text = "cl_khr_icd"; break;
  case 0x0920: /* CL_PLATFORM_ICD_SUFFIX_KHR */ text = "BROKEN"; break;
  default: return CL_INVALID_VALUE;
  }
  const size_t need = strlen(text) + 1;
  if (size_ret) *size_ret = need;
  if (value) {
    if (size < need) return CL_INVALID_VALUE;
    memcpy(value, text, need);
  }
  (void)id;
  return CL_SUCCESS;
}

/* The failure under test: the platform exists, its devices cannot be listed. */
static cl_int CL_API_CALL broken_get_device_ids(cl_platform_id id, cl_device_type type, cl_uint count,
                                                cl_device_id *devices, cl_uint *count_ret) {
  (void)id, (void)type, (void)count, (void)devices, (void)count_ret;
  return CL_OUT_OF_HOST_MEMORY;
}

static cl_int CL_API_CALL broken_icd_get_platform_ids(cl_uint count, cl_platform_id *platforms, cl_uint *count_ret) {
  dispatch.clGetPlatformInfo = broken_get_platform_info;
  dispatch.clGetDeviceIDs = broken_get_device_ids;
  if (count_ret) *count_ret = 1;
  if (platforms && count >= 1) platforms[0] = &platform;
  return CL_SUCCESS;
}

__attribute__((visibility("default"))) void *CL_API_CALL clGetExtensionFunctionAddress(const char *name);
__attribute__((visibility("default"))) void *CL_API_CALL clGetExtensionFunctionAddress(const char *name) {
  if (!strcmp(name, "clIcdGetPlatformIDsKHR")) return (void *)broken_icd_get_platform_ids;
  /* The loader asks for these too, to check the platform before using it. */
  if (!strcmp(name, "clGetPlatformInfo")) return (void *)broken_get_platform_info;
  return NULL;
}
