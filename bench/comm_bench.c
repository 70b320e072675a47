/* bench/comm_bench.c: kiln-bench-comm, allreduce of kiln tensors through libkiln-comm against MPI_Allreduce on the same memory, run under mpirun (docs/benchmarks.md). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/comm.h"
#include "kiln/dlpack.h"
#include "kiln/kiln.h"

/* Usage: mpirun -np 2 kiln-bench-comm [--quick] [--max-bytes N]
 * Each rank allreduces (sum, f32) a tensor on its default device (KILN_DEVICE
 * per rank); the peer is MPI_Allreduce called directly on that tensor's own
 * memory where it is a CPU tensor (a host buffer of the same size
 * elsewhere). Times are the slowest rank's, the best of the rounds; the two
 * are measured alternately so drift hits both. Bus bandwidth is nccl-tests':
 * bytes / time x 2(n-1)/n. */

typedef struct bench_t {
  kiln_comm_t *comm;
  kiln_tensor_t *tensor;
  void *host; /* the tensor's memory (CPU) or a buffer of its size */
  int count;
} bench_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds per call, the slowest rank's, of `iters` calls. */
static double measure(bench_t *b, bool kiln, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  for (int i = 0; i < iters; i++) {
    if (kiln) {
      if (kiln_comm_allreduce(b->comm, b->tensor, KILN_COMM_SUM) != KILN_OK) {
        fprintf(stderr, "kiln_comm_allreduce: %s\n", kiln_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    } else {
      MPI_Allreduce(MPI_IN_PLACE, b->host, b->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  }
  double t = (now_s() - t0) / iters, slowest = 0;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

int main(int argc, char **argv) {
  bool quick = false;
  size_t max_bytes = (size_t)64 << 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      quick = true;
      max_bytes = (size_t)1 << 20;
    } else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) {
      max_bytes = strtoull(argv[++i], NULL, 10);
    } else {
      fprintf(stderr, "usage: mpirun -np N kiln-bench-comm [--quick] [--max-bytes N]\n");
      return 2;
    }
  }
  bench_t b = {0};
  if (kiln_comm_create_world(&b.comm) != KILN_OK) {
    fprintf(stderr, "kiln_comm_create_world: %s\n", kiln_last_error());
    return 1;
  }
  int rank = kiln_comm_rank(b.comm), size = kiln_comm_size(b.comm);
  kiln_device_t *device = NULL;
  if (kiln_device_default(&device) != KILN_OK) {
    fprintf(stderr, "rank %d: no device: %s\n", rank, kiln_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Every rank's device, printed by rank 0. */
  char mine[128], *all = calloc((size_t)size, sizeof mine);
  snprintf(mine, sizeof mine, "%s (%s)", kiln_device_selector(device), kiln_device_name(device));
  MPI_Gather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("kiln-bench-comm: %d ranks, engine %s; allreduce(sum, f32) in place\n", size, kiln_comm_engine(b.comm));
    for (int r = 0; r < size; r++) printf("  rank %d on %s\n", r, all + (size_t)r * sizeof mine);
    printf("%12s %12s %12s %14s %14s %8s\n", "bytes", "kiln us", "MPI us", "kiln busbw GB/s", "MPI busbw GB/s",
           "ratio");
  }
  free(all);
  double bus = size > 1 ? 2.0 * (size - 1) / size : 1.0;
  int rounds = quick ? 2 : 5;
  for (size_t bytes = 8; bytes <= max_bytes; bytes *= 2) {
    b.count = (int)(bytes / 4);
    int64_t n = b.count;
    if (kiln_tensor_zeros(device, KILN_F32, 1, &n, &b.tensor) != KILN_OK) {
      fprintf(stderr, "rank %d: %s\n", rank, kiln_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    DLManagedTensor *managed = NULL;
    DLDevice dl;
    bool cpu = kiln_device_dlpack(device, &dl) == KILN_OK && dl.device_type == kDLCPU &&
               kiln_tensor_to_dlpack(b.tensor, &managed) == KILN_OK;
    b.host = cpu ? (char *)managed->dl_tensor.data + managed->dl_tensor.byte_offset : calloc(1, bytes);
    /* Calls per sample: about 20 ms of MPI's time, rank 0's count for all. */
    double once = measure(&b, false, 3);
    int iters = (int)(0.02 / (once > 1e-7 ? once : 1e-7));
    iters = iters < 3 ? 3 : iters > 20000 ? 20000 : iters;
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    measure(&b, true, 3);
    double best_kiln = 1e30, best_mpi = 1e30;
    for (int r = 0; r < rounds; r++) {
      double tm = measure(&b, false, iters), tk = measure(&b, true, iters);
      if (tm < best_mpi) best_mpi = tm;
      if (tk < best_kiln) best_kiln = tk;
    }
    if (rank == 0)
      printf("%12zu %12.2f %12.2f %14.3f %14.3f %8.2f\n", bytes, best_kiln * 1e6, best_mpi * 1e6,
             (double)bytes / best_kiln * bus / 1e9, (double)bytes / best_mpi * bus / 1e9, best_mpi / best_kiln);
    fflush(stdout);
    if (managed) managed->deleter(managed);
    else free(b.host);
    kiln_tensor_release(b.tensor);
  }
  kiln_comm_destroy(b.comm);
  kiln_deinitialize();
  return 0;
}
