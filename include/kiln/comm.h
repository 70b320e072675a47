/* kiln/comm.h: collectives on kiln tensors across processes and hosts (libkiln-comm, over MPI). */
#ifndef KILN_COMM_H
#define KILN_COMM_H

/* Not included by kiln.h: this header belongs to libkiln-comm, a library of
 * its own (pkg-config: kiln-comm), built only where MPI is found, so that
 * libkiln itself never depends on MPI. A build without MPI has neither the
 * library nor this header installed; `meson setup` says why
 * (docs/distributed.md).
 *
 * The rules of every call here:
 * - Every rank of the communicator calls the same collectives in the same
 *   order with the same dtype, element count, operation and root. Each call
 *   first exchanges a fingerprint (operation, dtype, element count, root,
 *   sequence number) with the other ranks; where they disagree, every rank
 *   returns KILN_INVALID_ARGUMENT with a message naming the ranks and what each
 *   called ("rank 0 called allreduce(sum, f32, 1024) #3; rank 1 called
 *   broadcast(f32, 512, root 0) #3"), and nothing is transferred.
 * - Each call blocks: it waits for the work already enqueued on the tensors'
 *   devices (as kiln_tensor_read does), runs the collective, and writes the
 *   result back (through the device's current queue; later kiln operations
 *   on it see the result). Queue-ordered, asynchronous collectives are a
 *   follow-up.
 * - Tensors live on any device and have any dtype. CPU tensors are passed to
 *   MPI without copies; the others are staged through host memory from
 *   kiln_host_allocate (page-locked where the device has it). Tensors written
 *   (the in-place ones, outputs, recv) must be contiguous, else
 *   KILN_INVALID_ARGUMENT naming kiln_tensor_contiguous.
 * - A rank that does not arrive within KILN_COMM_TIMEOUT seconds (default
 *   120) makes the call return KILN_UNAVAILABLE naming the ranks waited for
 *   (the fingerprints travel by non-blocking MPI, tested until the
 *   deadline). Once every rank arrived, the data moves by MPI's blocking
 *   collective (Open MPI's non-blocking ones are many times slower); a rank
 *   that dies then ends the job (mpirun's default). An MPI error (where Open
 *   MPI reports one rather than ending the job) is KILN_UNAVAILABLE with
 *   MPI's message and the call. After a timeout or an MPI error the
 *   communicator is broken: every later call on it returns KILN_UNAVAILABLE
 *   saying why; destroy it and end the job.
 * - A communicator is used by one thread at a time (MPI needs every rank to
 *   issue the collectives in one order, which two threads of one rank would
 *   not keep). Different communicators may be used from different threads
 *   only where MPI gave MPI_THREAD_MULTIPLE (kiln asks for SERIALIZED). */

#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef struct kiln_comm_t kiln_comm_t;

/* The reductions of allreduce and reduce_scatter. Sum, max and min of every
 * dtype; bool sums as logical or (as kiln_tensor_cast would store the sum),
 * max is or, min is and. f16 and bf16 reduce in f32 at each step, rounded once
 * to their dtype (kernels/dtype_convert.h). Mean is the sum divided by the
 * number of ranks, for the float dtypes only (an integer mean is refused with
 * KILN_DTYPE_MISMATCH: cast to f32 first). */
typedef enum kiln_comm_reduce_t {
  KILN_COMM_SUM = 0,
  KILN_COMM_MEAN = 1,
  KILN_COMM_MAX = 2,
  KILN_COMM_MIN = 3,
} kiln_comm_reduce_t;

/* "sum", "mean", "max", "min"; "?" for another value. Static storage. */
const char *kiln_comm_reduce_name(kiln_comm_reduce_t op);

/* ---- communicators ----------------------------------------------------- */

/* A communicator over every process of the MPI job (MPI_COMM_WORLD, which
 * libkiln-comm duplicates). Calls MPI_Init_thread asking for
 * MPI_THREAD_SERIALIZED when MPI is not initialised yet (kiln calls MPI from
 * the calling thread only; SERIALIZED lets the application call from any one
 * thread at a time without paying for MULTIPLE's locks); an application that
 * initialised MPI itself keeps the level it chose. Reads KILN_COMM_TIMEOUT
 * and KILN_COMM_ENGINE (docs/environment.md): a malformed value, or
 * KILN_COMM_ENGINE=nccl where NCCL cannot serve, is KILN_INVALID_ARGUMENT or
 * KILN_UNAVAILABLE with the reason. Collective: every rank calls it. The
 * caller owns *out_comm (kiln_comm_destroy). Blocks. */
kiln_status_t kiln_comm_create_world(kiln_comm_t **out_comm);

/* A communicator of the ranks of `comm` that pass the same `color` (>= 0),
 * ranked by `key` then by their rank in `comm` (MPI_Comm_split). Collective
 * over `comm`, fingerprinted like the others. The caller owns *out_comm. */
kiln_status_t kiln_comm_split(kiln_comm_t *comm, int color, int key, kiln_comm_t **out_comm);

/* Free the communicator. The last communicator destroyed finalises MPI when
 * kiln_comm_create_world initialised it (never when the application did).
 * NULL is a no-op. Blocks while MPI finalises. */
void kiln_comm_destroy(kiln_comm_t *comm);

/* This process's rank in the communicator, and the number of ranks. */
int kiln_comm_rank(const kiln_comm_t *comm);
int kiln_comm_size(const kiln_comm_t *comm);

/* The engine moving the data: "mpi". Static storage. */
const char *kiln_comm_engine(const kiln_comm_t *comm);
/* Why that engine: KILN_COMM_ENGINE's value and what was found of the others
 * ("auto: mpi; nccl not chosen: libnccl.so.2 not found (...)"). Owned by the
 * communicator. */
const char *kiln_comm_engine_reason(const kiln_comm_t *comm);

/* ---- collectives ------------------------------------------------------- */

/* Reduce `tensor` over every rank, in place: afterwards every rank holds the
 * same values. KILN_DTYPE_MISMATCH for mean of a non-float dtype. */
kiln_status_t kiln_comm_allreduce(kiln_comm_t *comm, kiln_tensor_t *tensor, kiln_comm_reduce_t op);

/* Copy rank `root`'s `tensor` into every other rank's `tensor`, in place. */
kiln_status_t kiln_comm_broadcast(kiln_comm_t *comm, kiln_tensor_t *tensor, int root);

/* Every rank's `input` (n elements each), concatenated in rank order into
 * every rank's `output` (size * n elements, `input`'s dtype, any shape). */
kiln_status_t kiln_comm_allgather(kiln_comm_t *comm, const kiln_tensor_t *input, kiln_tensor_t *output);

/* The reduction of every rank's `input` (size * n elements), of which rank r
 * receives elements [r*n, (r+1)*n) in `output` (n elements, `input`'s dtype). */
kiln_status_t kiln_comm_reduce_scatter(kiln_comm_t *comm, const kiln_tensor_t *input, kiln_tensor_t *output,
                                       kiln_comm_reduce_t op);

/* Return once every rank called it. */
kiln_status_t kiln_comm_barrier(kiln_comm_t *comm);

/* Point to point: `tensor` to rank `peer`, which calls kiln_comm_recv with a
 * tensor of the same dtype and element count. Messages between two ranks
 * arrive in the order sent; the pair is fingerprinted like a collective (both
 * sides see a dtype or count that differs). Each blocks until its side is
 * done. */
kiln_status_t kiln_comm_send(kiln_comm_t *comm, const kiln_tensor_t *tensor, int peer);
kiln_status_t kiln_comm_recv(kiln_comm_t *comm, kiln_tensor_t *tensor, int peer);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* KILN_COMM_H */
