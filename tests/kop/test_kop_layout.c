/* tests/kop/test_kop_layout.c: kernels/kop.h laid out alike by gcc, nvcc and every OpenCL device's compiler. */
/*
 *   test_kop_layout [--ptx LAYOUT.ptx] [--opencl KOP.h]
 *
 * The host's layout (this file, compiled by the C compiler that builds the
 * backends) is the reference: sizeof(kiln_kop_t), then the offset of each
 * member KILN_KOP_LAYOUT lists. --ptx: tests/kop/layout.cu compiled by nvcc
 * to PTX, whose `kiln_kop_layout` initializer holds the same list as nvcc
 * placed it. --opencl: kop.h's text, built into a one-work-item kernel that
 * writes the list on every device of every platform the ICD loader finds
 * (PoCL and Oclgrind in the suite), once with double members typed double
 * (where the device has fp64) and once as their bits. Exit 0 when every
 * layout given matches, 1 on any difference (each printed), 77 when
 * --opencl finds no device at all.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_KOP_TEST_OPENCL
#include <CL/cl.h>
#endif

#include "kernels/kop.h"

#define KOP_NAME_(m) #m,
#define KOP_OFFSET_(m) (unsigned long long)offsetof(kiln_kop_t, m),
static const char *const names[] = {"sizeof(kiln_kop_t)", KILN_KOP_LAYOUT(KOP_NAME_)};
static const unsigned long long host[] = {(unsigned long long)sizeof(kiln_kop_t), KILN_KOP_LAYOUT(KOP_OFFSET_)};
enum { COUNT = sizeof host / sizeof host[0] };

/* Differences from the host's layout, printed; the count. */
static int compare(const char *who, const unsigned long long *got, size_t got_count) {
  if (got_count != COUNT) {
    printf("%s: %zu entries, the host has %d\n", who, got_count, COUNT);
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < COUNT; i++) {
    if (got[i] != host[i]) {
      printf("%s: %s at %llu, the host has it at %llu\n", who, names[i], got[i], host[i]);
      bad++;
    }
  }
  if (!bad) printf("%s: all %d entries match the host's\n", who, COUNT);
  return bad;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  size_t got;
  while (text && (got = fread(text + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (len + 1 == cap) {
      char *grown = realloc(text, cap *= 2);
      if (!grown) free(text);
      text = grown;
    }
  }
  fclose(f);
  if (text) text[len] = '\0';
  return text;
}

/* The bytes of `.global .align 8 .b8 kiln_kop_layout[N] = {b0, b1, ...};`
 * as little-endian 64-bit words; ptxas leaves trailing zero bytes out of the
 * braces, so N counts them. */
static int check_ptx(const char *path) {
  char *ptx = read_text(path);
  if (!ptx) {
    printf("cannot read %s\n", path);
    return 1;
  }
  int bad = 1;
  const char *at = strstr(ptx, "kiln_kop_layout[");
  const char *open = at ? strchr(at, '{') : NULL;
  if (!open) {
    printf("%s holds no kiln_kop_layout initializer\n", path);
  } else {
    unsigned long long words[COUNT + 1] = {0};
    const size_t declared = strtoul(at + strlen("kiln_kop_layout["), NULL, 10);
    size_t bytes = 0;
    const char *p = open + 1;
    for (;;) {
      char *end;
      unsigned long v = strtoul(p, &end, 10);
      if (end == p) break;
      if (bytes < sizeof words) words[bytes / 8] |= (unsigned long long)(v & 0xff) << (8 * (bytes % 8));
      bytes++;
      p = end;
      while (*p == ',' || *p == ' ') p++;
    }
    bad = compare("nvcc", words, (bytes > declared ? bytes : declared) / 8);
  }
  free(ptx);
  return bad;
}

#ifdef KILN_KOP_TEST_OPENCL
static const char *const kernel_text =
    "\n#define KOP_OFFSET_(m) out[i++] = (ulong)__builtin_offsetof(kiln_kop_t, m);\n"
    "__kernel void kop_layout(__global ulong *out) {\n"
    "  int i = 0;\n"
    "  out[i++] = (ulong)sizeof(kiln_kop_t);\n"
    "  KILN_KOP_LAYOUT(KOP_OFFSET_)\n"
    "}\n";
static const char *const fp64_text =
    "#if defined(cl_khr_fp64)\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#define KILN_CL_HAVE_FP64 1\n#endif\n";

static int run_on_device(cl_device_id device, const char *label, const char *kop_h, int fp64) {
  cl_int err;
  cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    printf("%s: clCreateContext failed (%d)\n", label, err);
    return 1;
  }
  const char *parts[3] = {fp64 ? fp64_text : "", kop_h, kernel_text};
  cl_program program = clCreateProgramWithSource(context, 3, parts, NULL, &err);
  int bad = 1;
  if (err == CL_SUCCESS) err = clBuildProgram(program, 1, &device, "", NULL, NULL);
  if (err != CL_SUCCESS) {
    char log[4096] = "";
    clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
    printf("%s: the program does not build (%d): %s\n", label, err, log);
  } else {
    cl_kernel kernel = clCreateKernel(program, "kop_layout", &err);
    cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
    cl_mem mem = clCreateBuffer(context, CL_MEM_WRITE_ONLY, sizeof host, NULL, &err);
    cl_ulong got[COUNT];
    size_t one = 1;
    err = clSetKernelArg(kernel, 0, sizeof mem, &mem);
    if (err == CL_SUCCESS) err = clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &one, &one, 0, NULL, NULL);
    if (err == CL_SUCCESS) err = clEnqueueReadBuffer(queue, mem, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
      printf("%s: the kernel did not run (%d)\n", label, err);
    } else {
      unsigned long long words[COUNT];
      for (int i = 0; i < COUNT; i++) words[i] = got[i];
      char who[512];
      snprintf(who, sizeof who, "%s%s", label, fp64 ? " (fp64)" : " (no fp64)");
      bad = compare(who, words, COUNT);
    }
    clReleaseMemObject(mem);
    clReleaseCommandQueue(queue);
    clReleaseKernel(kernel);
  }
  clReleaseProgram(program);
  clReleaseContext(context);
  return bad;
}

/* -1: no device anywhere. */
static int check_opencl(const char *kop_path) {
  char *kop_h = read_text(kop_path);
  if (!kop_h) {
    printf("cannot read %s\n", kop_path);
    return 1;
  }
  cl_platform_id platforms[16];
  cl_uint platform_count = 0;
  if (clGetPlatformIDs(16, platforms, &platform_count) != CL_SUCCESS) platform_count = 0;
  int bad = 0, devices_seen = 0;
  for (cl_uint p = 0; p < platform_count && p < 16; p++) {
    char platform_name[256] = "";
    clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof platform_name, platform_name, NULL);
    cl_device_id devices[16];
    cl_uint device_count = 0;
    if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 16, devices, &device_count) != CL_SUCCESS) continue;
    for (cl_uint d = 0; d < device_count && d < 16; d++) {
      char device_name[256] = "", label[600];
      clGetDeviceInfo(devices[d], CL_DEVICE_NAME, sizeof device_name, device_name, NULL);
      snprintf(label, sizeof label, "OpenCL %s / %s", platform_name, device_name);
      devices_seen++;
      bad += run_on_device(devices[d], label, kop_h, 1);
      bad += run_on_device(devices[d], label, kop_h, 0);
    }
  }
  free(kop_h);
  return devices_seen ? bad : -1;
}
#endif

int main(int argc, char **argv) {
  int bad = 0;
  printf("host: sizeof(kiln_kop_t) = %llu, %d entries\n", host[0], COUNT);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--ptx") == 0 && i + 1 < argc) {
      bad += check_ptx(argv[++i]);
    } else if (strcmp(argv[i], "--opencl") == 0 && i + 1 < argc) {
#ifdef KILN_KOP_TEST_OPENCL
      const int got = check_opencl(argv[++i]);
      if (got < 0) {
        printf("no OpenCL device: nothing to compare\n");
        return 77;
      }
      bad += got;
#else
      printf("--opencl: built without OpenCL\n");
      return 1;
#endif
    } else {
      printf("usage: test_kop_layout [--ptx LAYOUT.ptx] [--opencl KOP.h]\n");
      return 1;
    }
  }
  return bad ? 1 : 0;
}
