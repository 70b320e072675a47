/* tests/comm/test_comm.c: libkiln-comm under mpirun: every collective and send/recv for every dtype against host references, the fingerprint mismatch message on both ranks, the timeout naming the missing rank. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype_convert.h"
#include "kiln/comm.h"
#include "kiln/kiln.h"

/* Run as `test_comm` by tests/comm/run.sh, under mpirun -np 2, each rank on
 * the device KILN_DEVICE leaves first (run.sh gives rank 1 PoCL in its second
 * run). Every rank checks its own results and the ranks agree on the exit
 * status at the end. */

static int rank_, failures_, checks_;

/* Under AddressSanitizer: Open MPI and PMIx unload their plugins at
 * MPI_Finalize, and LeakSanitizer then cannot name the allocations those
 * plugins keep until exit (thousands, each "<unknown module>"). Here dlclose
 * leaves every library loaded, so their leaks carry names that
 * tests/lsan.supp can suppress while kiln-comm's own stay reported. The
 * executable exports it (export_dynamic in tests/meson.build), so the MPI
 * libraries bind to it. */
#if defined(__SANITIZE_ADDRESS__)
int dlclose(void *handle);
__attribute__((visibility("default"))) int dlclose(void *handle) {
  (void)handle;
  return 0;
}
#endif


static void note(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  printf("[rank %d] ", rank_);
  vprintf(fmt, args);
  printf("\n");
  fflush(stdout);
  va_end(args);
}

#define CHECK(cond, ...)                                 \
  do {                                                   \
    checks_++;                                           \
    if (!(cond)) {                                       \
      failures_++;                                       \
      note("FAIL %s:%d: %s", __FILE__, __LINE__, #cond); \
      note(__VA_ARGS__);                                 \
    }                                                    \
  } while (0)

#define CHECK_OK(call)                                                                         \
  do {                                                                                         \
    kiln_status_t s_ = (call);                                                                 \
    CHECK(s_ == KILN_OK, "%s -> %s: %s", #call, kiln_status_name(s_), kiln_last_error()); \
  } while (0)

/* ---- host values in any dtype ------------------------------------------------ */

static void store(kiln_dtype_t dtype, void *data, size_t i, double v) {
  switch (dtype) {
    case KILN_F32: ((float *)data)[i] = (float)v; break;
    case KILN_F64: ((double *)data)[i] = v; break;
    case KILN_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case KILN_I64: ((int64_t *)data)[i] = (int64_t)v; break;
    case KILN_I16: ((int16_t *)data)[i] = (int16_t)v; break;
    case KILN_I8: ((int8_t *)data)[i] = (int8_t)v; break;
    case KILN_U8: ((uint8_t *)data)[i] = (uint8_t)v; break;
    case KILN_BOOL: ((uint8_t *)data)[i] = v != 0; break;
    case KILN_F16: ((uint16_t *)data)[i] = kiln_dc_f64_to_f16(v); break;
    case KILN_BF16: ((uint16_t *)data)[i] = kiln_dc_f64_to_bf16(v); break;
    default: break;
  }
}

static double load(kiln_dtype_t dtype, const void *data, size_t i) {
  switch (dtype) {
    case KILN_F32: return ((const float *)data)[i];
    case KILN_F64: return ((const double *)data)[i];
    case KILN_I32: return ((const int32_t *)data)[i];
    case KILN_I64: return (double)((const int64_t *)data)[i];
    case KILN_I16: return ((const int16_t *)data)[i];
    case KILN_I8: return ((const int8_t *)data)[i];
    case KILN_U8: return ((const uint8_t *)data)[i];
    case KILN_BOOL: return ((const uint8_t *)data)[i];
    case KILN_F16: return kiln_dc_f16_to_f32(((const uint16_t *)data)[i]);
    case KILN_BF16: return kiln_dc_bf16_to_f32(((const uint16_t *)data)[i]);
    default: return NAN;
  }
}

/* Rank r's element i: small values every dtype holds exactly, sums too. */
static double value(kiln_dtype_t dtype, int r, int64_t i) {
  switch (kiln_dtype_class(dtype)) {
    case KILN_DTYPE_CLASS_BOOL: return (i + r) % 3 == 0;
    case KILN_DTYPE_CLASS_UINT: return (double)(i % 7 + r * 3);
    case KILN_DTYPE_CLASS_INT: return (double)(i % 7 + r * 3 - 4);
    default: return (double)(i % 5) * 0.5 + r - 1.0;
  }
}

static kiln_tensor_t *make(kiln_device_t *device, kiln_dtype_t dtype, int64_t n, int r, int64_t first) {
  void *data = malloc((size_t)n * kiln_dtype_size(dtype) + 1);
  for (int64_t i = 0; i < n; i++) store(dtype, data, (size_t)i, value(dtype, r, first + i));
  kiln_tensor_t *t = NULL;
  CHECK_OK(kiln_tensor_from_host(device, dtype, 1, &n, data, &t));
  free(data);
  return t;
}

static kiln_tensor_t *make_empty(kiln_device_t *device, kiln_dtype_t dtype, int64_t n) {
  kiln_tensor_t *t = NULL;
  CHECK_OK(kiln_tensor_empty(device, dtype, 1, &n, &t));
  return t;
}

/* Compare a tensor with expected[i] (doubles, exact). */
static void expect(const char *what, kiln_dtype_t dtype, kiln_tensor_t *t, const double *expected, int64_t n) {
  size_t bytes = (size_t)n * kiln_dtype_size(dtype);
  void *data = malloc(bytes + 1);
  CHECK_OK(kiln_tensor_read(t, data, bytes));
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++)
    if (load(dtype, data, (size_t)i) != expected[i]) bad = i;
  CHECK(bad < 0, "%s %s: element %lld is %g, expected %g", what, kiln_dtype_name(dtype), (long long)bad,
        bad >= 0 ? load(dtype, data, (size_t)bad) : 0.0, bad >= 0 ? expected[bad] : 0.0);
  free(data);
}

/* The value a reduction of every rank's element i stores in `dtype`. */
static double reduced(kiln_dtype_t dtype, kiln_comm_reduce_t op, int size, int64_t i) {
  double acc = value(dtype, 0, i);
  for (int r = 1; r < size; r++) {
    double v = value(dtype, r, i);
    acc = op == KILN_COMM_MAX ? fmax(acc, v) : op == KILN_COMM_MIN ? fmin(acc, v) : acc + v;
  }
  if (op == KILN_COMM_MEAN) acc /= size;
  if (dtype == KILN_BOOL) return acc != 0;
  return acc;
}

/* ---- the collectives, one dtype --------------------------------------------- */

static void collectives(kiln_comm_t *comm, kiln_device_t *device, kiln_dtype_t dtype) {
  const int64_t n = 1000;
  int rank = kiln_comm_rank(comm), size = kiln_comm_size(comm);
  double *expected = malloc((size_t)(n * size) * sizeof *expected);
  bool is_float = kiln_dtype_class(dtype) == KILN_DTYPE_CLASS_FLOAT;

  kiln_comm_reduce_t ops[] = {KILN_COMM_SUM, KILN_COMM_MAX, KILN_COMM_MIN, KILN_COMM_MEAN};
  for (int o = 0; o < (is_float ? 4 : 3); o++) {
    kiln_tensor_t *t = make(device, dtype, n, rank, 0);
    CHECK_OK(kiln_comm_allreduce(comm, t, ops[o]));
    for (int64_t i = 0; i < n; i++) expected[i] = reduced(dtype, ops[o], size, i);
    char what[64];
    snprintf(what, sizeof what, "allreduce(%s)", kiln_comm_reduce_name(ops[o]));
    expect(what, dtype, t, expected, n);
    kiln_tensor_release(t);
  }

  for (int root = 0; root < size; root++) {
    kiln_tensor_t *t = make(device, dtype, n, rank, 0);
    CHECK_OK(kiln_comm_broadcast(comm, t, root));
    for (int64_t i = 0; i < n; i++) expected[i] = value(dtype, root, i);
    expect("broadcast", dtype, t, expected, n);
    kiln_tensor_release(t);
  }

  kiln_tensor_t *in = make(device, dtype, n, rank, 0);
  kiln_tensor_t *out = make_empty(device, dtype, n * size);
  CHECK_OK(kiln_comm_allgather(comm, in, out));
  for (int r = 0; r < size; r++)
    for (int64_t i = 0; i < n; i++) expected[r * n + i] = value(dtype, r, i);
  expect("allgather", dtype, out, expected, n * size);
  kiln_tensor_release(in);
  kiln_tensor_release(out);

  /* Rank r's input holds elements [0, size*n) of its sequence; rank q
   * receives the reduction of elements [q*n, (q+1)*n). */
  in = make(device, dtype, n * size, rank, 0);
  out = make_empty(device, dtype, n);
  CHECK_OK(kiln_comm_reduce_scatter(comm, in, out, KILN_COMM_SUM));
  for (int64_t i = 0; i < n; i++) expected[i] = reduced(dtype, KILN_COMM_SUM, size, rank * n + i);
  expect("reduce_scatter(sum)", dtype, out, expected, n);
  kiln_tensor_release(in);
  kiln_tensor_release(out);

  /* 0 -> 1, then 1 -> 0. */
  for (int from = 0; from < 2 && size >= 2; from++) {
    int to = 1 - from;
    if (rank == from) {
      kiln_tensor_t *t = make(device, dtype, n, rank, 0);
      CHECK_OK(kiln_comm_send(comm, t, to));
      kiln_tensor_release(t);
    } else if (rank == to) {
      kiln_tensor_t *t = make_empty(device, dtype, n);
      CHECK_OK(kiln_comm_recv(comm, t, from));
      for (int64_t i = 0; i < n; i++) expected[i] = value(dtype, from, i);
      expect("recv", dtype, t, expected, n);
      kiln_tensor_release(t);
    }
  }
  CHECK_OK(kiln_comm_barrier(comm));
  free(expected);
}

/* Past libkiln-comm's 4 MiB chunk: staged devices pipeline the chunks, the
 * CPU splits its calls the same way. */
static void chunked(kiln_comm_t *comm, kiln_device_t *device) {
  const int64_t n = (int64_t)3 << 19 | 1; /* 6 MiB + 4 B of f32 */
  int rank = kiln_comm_rank(comm), size = kiln_comm_size(comm);
  double *expected = malloc((size_t)n * sizeof *expected);
  kiln_comm_reduce_t ops[] = {KILN_COMM_SUM, KILN_COMM_MEAN};
  for (int o = 0; o < 2; o++) {
    kiln_tensor_t *t = make(device, KILN_F32, n, rank, 0);
    CHECK_OK(kiln_comm_allreduce(comm, t, ops[o]));
    for (int64_t i = 0; i < n; i++) expected[i] = reduced(KILN_F32, ops[o], size, i);
    expect(ops[o] == KILN_COMM_SUM ? "chunked allreduce(sum)" : "chunked allreduce(mean)", KILN_F32, t, expected, n);
    kiln_tensor_release(t);
  }
  free(expected);
}

/* ---- errors -------------------------------------------------------------------- */

static void local_refusals(kiln_comm_t *comm, kiln_device_t *device) {
  int64_t shape[2] = {4, 3};
  kiln_tensor_t *t = NULL, *view = NULL;
  CHECK_OK(kiln_tensor_zeros(device, KILN_F32, 2, shape, &t));
  CHECK_OK(kiln_tensor_transpose(t, 0, 1, &view));
  kiln_status_t s = kiln_comm_allreduce(comm, view, KILN_COMM_SUM);
  CHECK(s == KILN_INVALID_ARGUMENT && strstr(kiln_last_error(), "kiln_tensor_contiguous"),
        "strided allreduce -> %s: %s", kiln_status_name(s), kiln_last_error());
  kiln_tensor_release(view);
  kiln_tensor_release(t);
  kiln_tensor_t *i = make_empty(device, KILN_I32, 4);
  s = kiln_comm_allreduce(comm, i, KILN_COMM_MEAN);
  CHECK(s == KILN_DTYPE_MISMATCH && strstr(kiln_last_error(), "mean of i32"), "i32 mean -> %s: %s",
        kiln_status_name(s), kiln_last_error());
  s = kiln_comm_broadcast(comm, i, 7);
  CHECK(s == KILN_INVALID_ARGUMENT && strstr(kiln_last_error(), "root 7 is not a rank"), "root 7 -> %s: %s",
        kiln_status_name(s), kiln_last_error());
  kiln_tensor_release(i);

  /* The variables, refused before any communication. */
  kiln_comm_t *other = NULL;
  setenv("KILN_COMM_TIMEOUT", "soon", 1);
  s = kiln_comm_create_world(&other);
  CHECK(s == KILN_INVALID_ARGUMENT && strstr(kiln_last_error(), "KILN_COMM_TIMEOUT=\"soon\""), "timeout soon -> %s: %s",
        kiln_status_name(s), kiln_last_error());
  unsetenv("KILN_COMM_TIMEOUT");
  setenv("KILN_COMM_ENGINE", "nccl", 1);
  s = kiln_comm_create_world(&other);
  CHECK(s == KILN_UNAVAILABLE && strstr(kiln_last_error(), "libnccl.so.2"), "engine nccl -> %s: %s",
        kiln_status_name(s), kiln_last_error());
  setenv("KILN_COMM_ENGINE", "gloo", 1);
  s = kiln_comm_create_world(&other);
  CHECK(s == KILN_INVALID_ARGUMENT && strstr(kiln_last_error(), "use one of: auto, mpi, nccl"),
        "engine gloo -> %s: %s", kiln_status_name(s), kiln_last_error());
  unsetenv("KILN_COMM_ENGINE");
  CHECK(other == NULL, "a refused kiln_comm_create_world wrote *out_comm");
}

/* Rank 0 allreduces 1024 f32, rank 1 broadcasts 512: both ranks fail with
 * both calls named, and the communicator still works afterwards. */
static void mismatch(kiln_comm_t *world, kiln_device_t *device) {
  kiln_comm_t *comm = NULL;
  CHECK_OK(kiln_comm_split(world, 0, kiln_comm_rank(world), &comm));
  if (!comm) return;
  kiln_tensor_t *t = make(device, KILN_F32, rank_ == 0 ? 1024 : 512, rank_, 0);
  kiln_status_t s = rank_ == 0 ? kiln_comm_allreduce(comm, t, KILN_COMM_SUM) : kiln_comm_broadcast(comm, t, 0);
  const char *want = "rank 0 called allreduce(sum, f32, 1024) #0; rank 1 called broadcast(f32, 512, root 0) #0";
  CHECK(s == KILN_INVALID_ARGUMENT && strstr(kiln_last_error(), want), "mismatch -> %s: %s (want \"%s\")",
        kiln_status_name(s), kiln_last_error(), want);
  note("mismatch message: %s", kiln_last_error());
  CHECK_OK(kiln_comm_barrier(comm));
  kiln_tensor_release(t);
  kiln_comm_destroy(comm);
}

/* On a communicator with KILN_COMM_TIMEOUT=1.5, rank 1 skips an allreduce:
 * rank 0 is told, within the timeout, that rank 1 did not come. */
static void timeout(kiln_comm_t *world, kiln_device_t *device) {
  setenv("KILN_COMM_TIMEOUT", "1.5", 1);
  kiln_comm_t *comm = NULL;
  CHECK_OK(kiln_comm_create_world(&comm));
  unsetenv("KILN_COMM_TIMEOUT");
  if (!comm) return;
  if (rank_ == 0) {
    kiln_tensor_t *t = make(device, KILN_F32, 16, rank_, 0);
    kiln_status_t s = kiln_comm_allreduce(comm, t, KILN_COMM_SUM);
    const char *want = "allreduce(sum, f32, 16) #0 on rank 0: rank 1 did not make the matching call within "
                       "KILN_COMM_TIMEOUT=1.5 s";
    CHECK(s == KILN_UNAVAILABLE && strstr(kiln_last_error(), want), "timeout -> %s: %s (want \"%s\")",
          kiln_status_name(s), kiln_last_error(), want);
    note("timeout message: %s", kiln_last_error());
    s = kiln_comm_barrier(comm);
    CHECK(s == KILN_UNAVAILABLE && strstr(kiln_last_error(), "the communicator broke earlier"),
          "after the timeout -> %s: %s", kiln_status_name(s), kiln_last_error());
    kiln_tensor_release(t);
  }
  /* The world communicator is untouched by the other's timeout. */
  CHECK_OK(kiln_comm_barrier(world));
  kiln_comm_destroy(comm);
}

/* A trace records every collective as a span on the host track (category
 * "collective": name, dtype and count, rank, bytes), and the summary totals
 * them. Each rank writes its own file into a temporary folder. */
static void traced(kiln_comm_t *world, kiln_device_t *device) {
  const char *tmp = getenv("TMPDIR");
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/kiln-comm-trace-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp(%s) failed", dir);
    return;
  }
  snprintf(path, sizeof path, "%s/rank%d.json", dir, rank_);
  int64_t shape = 256;
  float host[256];
  for (int i = 0; i < 256; i++) host[i] = (float)i;
  kiln_tensor_t *t = NULL;
  CHECK_OK(kiln_tensor_from_host(device, KILN_F32, 1, &shape, host, &t));
  CHECK_OK(kiln_trace_start(path));
  CHECK_OK(kiln_comm_allreduce(world, t, KILN_COMM_SUM));
  CHECK_OK(kiln_comm_allreduce(world, t, KILN_COMM_MAX));
  CHECK_OK(kiln_comm_broadcast(world, t, 0));
  CHECK_OK(kiln_comm_barrier(world));
  CHECK_OK(kiln_trace_stop());
  kiln_tensor_release(t);
  char *text = NULL;
  FILE *f = fopen(path, "r");
  if (f) {
    text = calloc(1, 1 << 20);
    if (text) (void)fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
  }
  CHECK(text && strstr(text, "{\"name\":\"allreduce\",\"cat\":\"collective\",\"ph\":\"X\""),
        "no allreduce span in %s", path);
  CHECK(text && strstr(text, "{\"name\":\"barrier\",\"cat\":\"collective\""), "no barrier span in %s", path);
  char want[96];
  snprintf(want, sizeof want, "\"detail\":\"f32 x 256 on %s, rank %d of %d\",\"bytes\":1024,",
           kiln_device_selector(device), rank_, kiln_comm_size(world));
  CHECK(text && strstr(text, want), "no span with %s in %s", want, path);
  free(text);
  remove(path);
  remove(dir);
  size_t length = 0;
  char summary[8192];
  CHECK_OK(kiln_trace_summary(summary, sizeof summary, &length));
  unsigned long long count = 0, bytes = 0;
  double ms = 0;
  const char *row = strstr(summary, "collective   allreduce");
  CHECK(row && sscanf(row, "collective allreduce %llu %lf %llu", &count, &ms, &bytes) == 3 && count == 2 &&
            bytes == 2048,
        "the summary's allreduce row: %s", row ? row : summary);
}

int main(int argc, char **argv) {
  kiln_comm_t *world = NULL;
  kiln_status_t s = kiln_comm_create_world(&world);
  if (s != KILN_OK) {
    printf("kiln_comm_create_world: %s: %s\n", kiln_status_name(s), kiln_last_error());
    return 1;
  }
  rank_ = kiln_comm_rank(world);
  note("%d ranks; engine %s (%s)", kiln_comm_size(world), kiln_comm_engine(world), kiln_comm_engine_reason(world));

  /* Every rank needs its device; where one has none, all skip together. */
  kiln_device_t *device = NULL;
  s = kiln_device_default(&device);
  if (s != KILN_OK) note("no device: %s", kiln_last_error());
  int32_t have = s == KILN_OK;
  int64_t one = 1;
  kiln_device_t *cpu = NULL;
  kiln_tensor_t *flag = NULL;
  if (kiln_device_find("cpu:0", &cpu) != KILN_OK && device) cpu = device;
  if (!cpu || kiln_tensor_from_host(cpu, KILN_I32, 1, &one, &have, &flag) != KILN_OK ||
      kiln_comm_allreduce(world, flag, KILN_COMM_MIN) != KILN_OK || kiln_tensor_read(flag, &have, 4) != KILN_OK ||
      !have) {
    note("SKIP: a rank has no device for this pairing (%s)", kiln_last_error());
    kiln_tensor_release(flag);
    kiln_comm_destroy(world);
    return 77;
  }
  kiln_tensor_release(flag);
  note("device %s (%s)", kiln_device_selector(device), kiln_device_name(device));

  for (int d = 0; d < KILN_DTYPE_COUNT_; d++) collectives(world, device, (kiln_dtype_t)d);
  chunked(world, device);
  traced(world, device);
  local_refusals(world, device);
  if (kiln_comm_size(world) == 2) {
    mismatch(world, device);
    timeout(world, device);
  }

  /* One verdict for the job. */
  int32_t failed = failures_;
  kiln_tensor_t *total = NULL;
  s = kiln_tensor_from_host(device, KILN_I32, 1, &one, &failed, &total);
  if (s == KILN_OK) s = kiln_comm_allreduce(world, total, KILN_COMM_SUM);
  if (s == KILN_OK) s = kiln_tensor_read(total, &failed, 4);
  if (s != KILN_OK) failed = failures_ + 1;
  kiln_tensor_release(total);
  note("%d checks, %d failed here, %d failed in the job", checks_, failures_, (int)failed);
  kiln_comm_destroy(world);
  kiln_deinitialize();
  (void)argc;
  (void)argv;
  return failed ? 1 : 0;
}
