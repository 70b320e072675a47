/* comm/comm_internal.h: the communicator's struct and what comm.c (its life, the fingerprints, waiting) gives collectives.c. */
#ifndef KILN_COMM_INTERNAL_H
#define KILN_COMM_INTERNAL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "kiln/comm.h"

/* What a call is, for the fingerprint and its messages. */
typedef enum kiln_comm_kind_t {
  KILN_COMM_KIND_ALLREDUCE,
  KILN_COMM_KIND_BROADCAST,
  KILN_COMM_KIND_ALLGATHER,
  KILN_COMM_KIND_REDUCE_SCATTER,
  KILN_COMM_KIND_BARRIER,
  KILN_COMM_KIND_SPLIT,
  KILN_COMM_KIND_SEND,
  KILN_COMM_KIND_RECV,
} kiln_comm_kind_t;

/* Exchanged before every call; ranks that disagree on any field fail. Plain
 * integers of fixed width, sent as bytes (every rank runs this same code). */
typedef struct kiln_comm_fingerprint_t {
  int32_t kind;   /* kiln_comm_kind_t */
  int32_t reduce; /* kiln_comm_reduce_t, or -1 */
  int32_t dtype;  /* kiln_dtype_t, or -1 */
  int32_t root;   /* broadcast's root; send's or recv's peer; else -1 */
  int64_t count;  /* elements of the input */
  uint64_t seq;   /* the communicator's call number (per peer for send/recv) */
} kiln_comm_fingerprint_t;

struct kiln_comm_t {
  MPI_Comm data; /* the collectives' data */
  MPI_Comm ctrl; /* the fingerprints, apart so they never meet data messages */
  int rank, size;
  uint64_t seq;          /* collectives issued */
  uint64_t *sent_to;     /* [size]: sends issued to each rank */
  uint64_t *recvd_from;  /* [size]: receives issued from each rank */
  double timeout_s;      /* KILN_COMM_TIMEOUT */
  MPI_Op half_ops[2][3]; /* [f16, bf16][sum, max, min]: reduce in f32 */
  char engine_reason[256];
  bool broken;
  char broken_why[512];
};

/* Exchange `mine` with every rank (or, for send/recv, with mine.root) and
 * compare: KILN_INVALID_ARGUMENT with every rank's call where they differ,
 * KILN_UNAVAILABLE naming the ranks that did not arrive in time. Counts the
 * call (seq). Every rank calls it at the start of a call. */
kiln_status_t kiln__comm_agree(kiln_comm_t *comm, kiln_comm_fingerprint_t mine);

/* Wait for `count` requests, polling until KILN_COMM_TIMEOUT: the call's
 * status, its message naming `what` (an MPI error, or the timeout). */
kiln_status_t kiln__comm_wait(kiln_comm_t *comm, int count, MPI_Request *requests, const char *what);

/* An MPI error as a kiln status (KILN_UNAVAILABLE), naming the MPI call and
 * MPI's text; breaks the communicator. */
kiln_status_t kiln__comm_mpi_error(kiln_comm_t *comm, int err, const char *call, const char *what);

/* Create comm->half_ops (collectives.c); MPI must be initialised. */
kiln_status_t kiln__comm_half_ops_create(kiln_comm_t *comm);

/* "allreduce(sum, f32, 1024) #3" into buf. */
void kiln__comm_describe(const kiln_comm_fingerprint_t *fp, char *buf, size_t size);

#endif /* KILN_COMM_INTERNAL_H */
