/* bench/peer_opencl.c: the OpenCL peers on kiln's own OpenCL devices: raw OpenCL (tiny kernel, transfers) and CLBlast. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <clblast_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

struct bench_cl_t {
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
  cl_program tiny_program;
  cl_kernel tiny_kernel;
  cl_mem tiny[3];
  char name[256];
};

static int bench_cl_fail(const char *call, cl_int err) {
  bench_set_error("%s failed with OpenCL error %d", call, (int)err);
  return -1;
}

/* The raw device kiln calls `device`: same platform and device name, counting
 * duplicates in order; else the backend's own index across platforms. */
static int bench_cl_find(const bench_device_t *device, cl_platform_id *out_platform, cl_device_id *out_device) {
  cl_platform_id platforms[16];
  cl_uint nplat = 0;
  cl_int err = clGetPlatformIDs(16, platforms, &nplat);
  if (err != CL_SUCCESS) return bench_cl_fail("clGetPlatformIDs", err);
  int seen = 0;
  uint32_t flat = 0;
  cl_platform_id by_index_p = NULL;
  cl_device_id by_index_d = NULL;
  for (cl_uint p = 0; p < nplat && p < 16; p++) {
    char pname[256] = "";
    clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
    cl_device_id devs[32];
    cl_uint ndev = 0;
    if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 32, devs, &ndev) != CL_SUCCESS) continue;
    for (cl_uint d = 0; d < ndev && d < 32; d++, flat++) {
      char dname[256] = "";
      clGetDeviceInfo(devs[d], CL_DEVICE_NAME, sizeof dname, dname, NULL);
      if (flat == device->info.backend_index) {
        by_index_p = platforms[p];
        by_index_d = devs[d];
      }
      if (!strcmp(pname, device->info.platform) && !strcmp(dname, device->info.name) &&
          seen++ == device->cl_occurrence) {
        *out_platform = platforms[p];
        *out_device = devs[d];
        return 0;
      }
    }
  }
  if (by_index_d) {
    *out_platform = by_index_p;
    *out_device = by_index_d;
    return 0;
  }
  bench_set_error("no raw OpenCL device matches kiln's %s (platform '%s', device '%s')", device->info.selector,
                  device->info.platform, device->info.name);
  return -1;
}

static void bench_cl_destroy(bench_cl_t *cl);

/* One context per device for the whole run: CLBlast compiles its kernels once
 * per context, and the peers should not pay that again in every section. */
#define BENCH_CL_MAX 16
static struct {
  const bench_device_t *device;
  bench_cl_t *cl;
} bench_cl_open_list[BENCH_CL_MAX];

int bench_cl_open(const bench_device_t *device, bench_cl_t **out) {
  for (int i = 0; i < BENCH_CL_MAX; i++)
    if (bench_cl_open_list[i].device == device && bench_cl_open_list[i].cl) {
      *out = bench_cl_open_list[i].cl;
      return 0;
    }
  bench_cl_t *cl = calloc(1, sizeof *cl);
  if (!cl) {
    bench_set_error("out of host memory");
    return -1;
  }
  cl_int err = CL_SUCCESS;
  if (bench_cl_find(device, &cl->platform, &cl->device) != 0) goto fail;
  clGetDeviceInfo(cl->device, CL_DEVICE_NAME, sizeof cl->name, cl->name, NULL);
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)cl->platform, 0};
  cl->context = clCreateContext(props, 1, &cl->device, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    bench_cl_fail("clCreateContext", err);
    goto fail;
  }
  cl->queue = clCreateCommandQueue(cl->context, cl->device, 0, &err);
  if (err != CL_SUCCESS) {
    bench_cl_fail("clCreateCommandQueue", err);
    goto fail;
  }
  *out = cl;
  for (int i = 0; i < BENCH_CL_MAX; i++)
    if (!bench_cl_open_list[i].cl) {
      bench_cl_open_list[i].device = device;
      bench_cl_open_list[i].cl = cl;
      break;
    }
  return 0;
fail:
  bench_cl_destroy(cl);
  return -1;
}

void bench_cl_close(bench_cl_t *cl) {
  for (int i = 0; i < BENCH_CL_MAX; i++)
    if (bench_cl_open_list[i].cl == cl) return; /* kept for the rest of the run */
  bench_cl_destroy(cl);
}

void bench_cl_close_all(void) {
  for (int i = 0; i < BENCH_CL_MAX; i++) {
    bench_cl_destroy(bench_cl_open_list[i].cl);
    bench_cl_open_list[i].cl = NULL;
    bench_cl_open_list[i].device = NULL;
  }
}

static void bench_cl_destroy(bench_cl_t *cl) {
  if (!cl) return;
  for (int i = 0; i < 3; i++)
    if (cl->tiny[i]) clReleaseMemObject(cl->tiny[i]);
  if (cl->tiny_kernel) clReleaseKernel(cl->tiny_kernel);
  if (cl->tiny_program) clReleaseProgram(cl->tiny_program);
  if (cl->queue) {
    clFinish(cl->queue);
    clReleaseCommandQueue(cl->queue);
  }
  if (cl->context) clReleaseContext(cl->context);
  free(cl);
}

/* ---- CLBlast ------------------------------------------------------------------ */

typedef struct bench_clblast_ctx_t {
  bench_cl_t *cl;
  size_t n;
  cl_mem a, b, c;
} bench_clblast_ctx_t;

static int bench_clblast_run(void *ctx, long iters) {
  bench_clblast_ctx_t *g = ctx;
  for (long i = 0; i < iters; i++) {
    CLBlastStatusCode st = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, g->n, g->n, g->n,
                                        1.0f, g->a, 0, g->n, g->b, 0, g->n, 0.0f, g->c, 0, g->n, &g->cl->queue, NULL);
    if (st != CLBlastSuccess) {
      bench_set_error("CLBlastSgemm(%zu^3) on %s returned CLBlast status %d", g->n, g->cl->name, (int)st);
      return -1;
    }
  }
  /* CLBlast's event does not cover its helper kernels: the host waits. */
  cl_int err = clFinish(g->cl->queue);
  return err == CL_SUCCESS ? 0 : bench_cl_fail("clFinish after CLBlastSgemm", err);
}

int bench_cl_clblast_sgemm(const bench_options_t *opts, bench_cl_t *cl, int n, bench_stats_t *out) {
  size_t count = (size_t)n * (size_t)n, bytes = count * sizeof(float);
  float *host = malloc(bytes);
  if (!host) {
    bench_set_error("out of host memory for a %dx%d matrix", n, n);
    return -1;
  }
  for (size_t i = 0; i < count; i++) host[i] = (float)((i * 7919u) % 1000u) / 500.0f - 1.0f;
  bench_clblast_ctx_t g = {cl, (size_t)n, NULL, NULL, NULL};
  cl_int err = CL_SUCCESS;
  int rc = -1;
  g.a = clCreateBuffer(cl->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, host, &err);
  if (err == CL_SUCCESS) g.b = clCreateBuffer(cl->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, host, &err);
  if (err == CL_SUCCESS) g.c = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
  if (err != CL_SUCCESS) bench_cl_fail("clCreateBuffer", err);
  else rc = bench_measure(opts, bench_clblast_run, &g, out);
  if (g.a) clReleaseMemObject(g.a);
  if (g.b) clReleaseMemObject(g.b);
  if (g.c) clReleaseMemObject(g.c);
  free(host);
  return rc;
}

/* ---- a tiny kernel --------------------------------------------------------------- */

static const char bench_tiny_source[] =
    "__kernel void bench_add(__global const float *a, __global const float *b, __global float *c) {\n"
    "  size_t i = get_global_id(0);\n"
    "  c[i] = a[i] + b[i];\n"
    "}\n";

static int bench_cl_tiny_prepare(bench_cl_t *cl) {
  if (cl->tiny_kernel) return 0;
  cl_int err;
  const char *src = bench_tiny_source;
  cl->tiny_program = clCreateProgramWithSource(cl->context, 1, &src, NULL, &err);
  if (err != CL_SUCCESS) return bench_cl_fail("clCreateProgramWithSource", err);
  err = clBuildProgram(cl->tiny_program, 1, &cl->device, "", NULL, NULL);
  if (err != CL_SUCCESS) return bench_cl_fail("clBuildProgram (the tiny add kernel)", err);
  cl->tiny_kernel = clCreateKernel(cl->tiny_program, "bench_add", &err);
  if (err != CL_SUCCESS) return bench_cl_fail("clCreateKernel", err);
  float ones[16];
  for (int i = 0; i < 16; i++) ones[i] = (float)i;
  for (int i = 0; i < 3; i++) {
    cl->tiny[i] = clCreateBuffer(cl->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof ones, ones, &err);
    if (err != CL_SUCCESS) return bench_cl_fail("clCreateBuffer", err);
    err = clSetKernelArg(cl->tiny_kernel, (cl_uint)i, sizeof(cl_mem), &cl->tiny[i]);
    if (err != CL_SUCCESS) return bench_cl_fail("clSetKernelArg", err);
  }
  return 0;
}

static int bench_cl_launch(bench_cl_t *cl) {
  size_t global = 16;
  cl_int err = clEnqueueNDRangeKernel(cl->queue, cl->tiny_kernel, 1, NULL, &global, NULL, 0, NULL, NULL);
  return err == CL_SUCCESS ? 0 : bench_cl_fail("clEnqueueNDRangeKernel", err);
}

static int bench_cl_wait_run(void *ctx, long iters) {
  bench_cl_t *cl = ctx;
  for (long i = 0; i < iters; i++) {
    if (bench_cl_launch(cl) != 0) return -1;
    cl_int err = clFinish(cl->queue);
    if (err != CL_SUCCESS) return bench_cl_fail("clFinish", err);
  }
  return 0;
}

int bench_cl_tiny(const bench_options_t *opts, bench_cl_t *cl, long n, bench_stats_t *out_enqueue,
                  bench_stats_t *out_sustained, bench_stats_t *out_wait) {
  if (bench_cl_tiny_prepare(cl) != 0) return -1;
  if (bench_cl_wait_run(cl, 10) != 0) return -1;
  int reps = opts->reps;
  double *enq = calloc((size_t)reps, sizeof *enq), *sus = calloc((size_t)reps, sizeof *sus);
  if (!enq || !sus) {
    free(enq);
    free(sus);
    bench_set_error("out of host memory");
    return -1;
  }
  int rc = 0;
  for (int r = 0; r < reps && rc == 0; r++) {
    double t0 = bench_now();
    for (long i = 0; i < n && rc == 0; i++) rc = bench_cl_launch(cl);
    double t1 = bench_now();
    cl_int err = clFinish(cl->queue);
    double t2 = bench_now();
    if (err != CL_SUCCESS) rc = bench_cl_fail("clFinish", err);
    enq[r] = (t1 - t0) / (double)n;
    sus[r] = (t2 - t0) / (double)n;
  }
  if (rc == 0) {
    bench_stats_of(enq, reps, out_enqueue);
    bench_stats_of(sus, reps, out_sustained);
    out_enqueue->iters = out_sustained->iters = n;
    rc = bench_measure(opts, bench_cl_wait_run, cl, out_wait);
  }
  free(enq);
  free(sus);
  return rc;
}

/* ---- transfers -------------------------------------------------------------------- */

typedef struct bench_cl_xfer_t {
  bench_cl_t *cl;
  cl_mem buf;
  void *host;
  size_t bytes;
  bool to_device;
} bench_cl_xfer_t;

static int bench_cl_xfer_run(void *ctx, long iters) {
  bench_cl_xfer_t *x = ctx;
  for (long i = 0; i < iters; i++) {
    cl_int err = x->to_device ? clEnqueueWriteBuffer(x->cl->queue, x->buf, CL_TRUE, 0, x->bytes, x->host, 0, NULL, NULL)
                              : clEnqueueReadBuffer(x->cl->queue, x->buf, CL_TRUE, 0, x->bytes, x->host, 0, NULL, NULL);
    if (err != CL_SUCCESS) return bench_cl_fail(x->to_device ? "clEnqueueWriteBuffer" : "clEnqueueReadBuffer", err);
  }
  return 0;
}

int bench_cl_transfer(const bench_options_t *opts, bench_cl_t *cl, size_t bytes, bool to_device, bench_stats_t *out) {
  bench_cl_xfer_t x = {cl, NULL, malloc(bytes), bytes, to_device};
  if (!x.host) {
    bench_set_error("out of host memory for %zu bytes", bytes);
    return -1;
  }
  memset(x.host, 3, bytes);
  cl_int err;
  x.buf = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
  int rc = -1;
  if (err != CL_SUCCESS) bench_cl_fail("clCreateBuffer", err);
  else rc = bench_measure(opts, bench_cl_xfer_run, &x, out);
  if (x.buf) clReleaseMemObject(x.buf);
  free(x.host);
  return rc;
}
