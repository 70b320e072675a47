/* bench/peer_opencl_none.c: the OpenCL peers when kiln-bench is built without OpenCL headers: each call says so. */
#include <stddef.h>

#include "bench.h"

struct bench_cl_t {
  int unused;
};

static int bench_cl_absent(void) {
  bench_set_error("kiln-bench was built without OpenCL and CLBlast (meson found no 'OpenCL' or 'clblast' dependency)");
  return -1;
}

int bench_cl_open(const bench_device_t *device, bench_cl_t **out) {
  *out = NULL;
  return bench_cl_absent();
}

void bench_cl_close(bench_cl_t *cl) { (void)cl; }

void bench_cl_close_all(void) {}

int bench_cl_clblast_sgemm(const bench_options_t *opts, bench_cl_t *cl, int n, bench_stats_t *out) {
  return bench_cl_absent();
}

int bench_cl_tiny(const bench_options_t *opts, bench_cl_t *cl, long n, bench_stats_t *out_enqueue,
                  bench_stats_t *out_sustained, bench_stats_t *out_wait) {
  return bench_cl_absent();
}

int bench_cl_transfer(const bench_options_t *opts, bench_cl_t *cl, size_t bytes, bool to_device, bench_stats_t *out) {
  return bench_cl_absent();
}
