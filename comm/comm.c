/* comm/comm.c: a communicator's life (MPI start and end, split, the engine choice), the fingerprint exchange and waiting with a deadline. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "kiln/trace.h"

/* MPI is process-wide: kiln finalises it only if kiln initialised it, once
 * the last of its communicators is destroyed. */
static atomic_int live_comms;
static atomic_bool kiln_initialised_mpi;

#define DEFAULT_TIMEOUT_S 120.0

const char *kiln_comm_reduce_name(kiln_comm_reduce_t op) {
  switch (op) {
    case KILN_COMM_SUM: return "sum";
    case KILN_COMM_MEAN: return "mean";
    case KILN_COMM_MAX: return "max";
    case KILN_COMM_MIN: return "min";
  }
  return "?";
}

static const char *kind_name(int32_t kind) {
  switch ((kiln_comm_kind_t)kind) {
    case KILN_COMM_KIND_ALLREDUCE: return "allreduce";
    case KILN_COMM_KIND_BROADCAST: return "broadcast";
    case KILN_COMM_KIND_ALLGATHER: return "allgather";
    case KILN_COMM_KIND_REDUCE_SCATTER: return "reduce_scatter";
    case KILN_COMM_KIND_BARRIER: return "barrier";
    case KILN_COMM_KIND_SPLIT: return "split";
    case KILN_COMM_KIND_SEND: return "send";
    case KILN_COMM_KIND_RECV: return "recv";
  }
  return "?";
}

void kiln__comm_describe(const kiln_comm_fingerprint_t *fp, char *buf, size_t size) {
  const char *dtype = fp->dtype >= 0 ? kiln_dtype_name((kiln_dtype_t)fp->dtype) : "";
  long long count = (long long)fp->count;
  unsigned long long seq = (unsigned long long)fp->seq;
  switch ((kiln_comm_kind_t)fp->kind) {
    case KILN_COMM_KIND_ALLREDUCE:
    case KILN_COMM_KIND_REDUCE_SCATTER:
      snprintf(buf, size, "%s(%s, %s, %lld) #%llu", kind_name(fp->kind),
               kiln_comm_reduce_name((kiln_comm_reduce_t)fp->reduce), dtype, count, seq);
      break;
    case KILN_COMM_KIND_BROADCAST:
      snprintf(buf, size, "broadcast(%s, %lld, root %d) #%llu", dtype, count, (int)fp->root, seq);
      break;
    case KILN_COMM_KIND_ALLGATHER:
      snprintf(buf, size, "allgather(%s, %lld) #%llu", dtype, count, seq);
      break;
    case KILN_COMM_KIND_SEND:
      snprintf(buf, size, "send(%s, %lld, to rank %d) #%llu", dtype, count, (int)fp->root, seq);
      break;
    case KILN_COMM_KIND_RECV:
      snprintf(buf, size, "recv(%s, %lld, from rank %d) #%llu", dtype, count, (int)fp->root, seq);
      break;
    default:
      snprintf(buf, size, "%s() #%llu", kind_name(fp->kind), seq);
      break;
  }
}

/* ---- errors and waiting --------------------------------------------------------- */

static kiln_status_t comm_break(kiln_comm_t *comm, kiln_status_t status, const char *fmt, ...) KILN_PRINTF_(3, 4);
static kiln_status_t comm_break(kiln_comm_t *comm, kiln_status_t status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(comm->broken_why, sizeof comm->broken_why, fmt, args);
  va_end(args);
  comm->broken = true;
  return kiln_set_error(status, "%s", comm->broken_why);
}

kiln_status_t kiln__comm_mpi_error(kiln_comm_t *comm, int err, const char *call, const char *what) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", err);
  return comm_break(comm, KILN_UNAVAILABLE, "%s on rank %d: %s failed: %s (a rank may have died); "
                    "the communicator is unusable now: destroy it and end the job",
                    what, comm->rank, call, text);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Poll until every request completed or the deadline passed. MPI moves a
 * non-blocking collective forward only inside MPI_Test, so the loop keeps
 * testing: spinning first (small collectives' latency), yielding the core
 * after 1 ms (ranks may share cores), and sleeping between tests only after
 * a second without completion (a rank that is late, not a large message).
 * On a timeout `pending` (if not NULL) gets 1 for each request still open. */
static int poll_all(kiln_comm_t *comm, int count, MPI_Request *requests, int *pending, bool *out_timed_out) {
  double start = now_s(), deadline = start + comm->timeout_s;
  *out_timed_out = false;
  for (unsigned long spins = 0;; spins++) {
    int open = 0;
    for (int i = 0; i < count; i++) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      int err = MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE);
      if (err != MPI_SUCCESS) return err;
      if (!flag) open++;
    }
    if (open == 0) return MPI_SUCCESS;
    if ((spins & 63) == 0) {
      double t = now_s();
      if (t > deadline) {
        *out_timed_out = true;
        for (int i = 0; pending && i < count; i++) pending[i] = requests[i] != MPI_REQUEST_NULL;
        return MPI_SUCCESS;
      }
      if (t - start > 1.0) {
        struct timespec pause = {0, 50000};
        nanosleep(&pause, NULL);
      } else if (t - start > 0.001) {
        sched_yield();
      }
    }
  }
}

kiln_status_t kiln__comm_wait(kiln_comm_t *comm, int count, MPI_Request *requests, const char *what) {
  bool timed_out = false;
  int err = poll_all(comm, count, requests, NULL, &timed_out);
  if (err != MPI_SUCCESS) return kiln__comm_mpi_error(comm, err, "MPI_Test", what);
  if (timed_out)
    return comm_break(comm, KILN_UNAVAILABLE,
                      "%s did not complete within KILN_COMM_TIMEOUT=%g s on rank %d, though every rank had "
                      "arrived (their fingerprints matched): a rank died or stalled during it; the "
                      "communicator is unusable now: destroy it and end the job",
                      what, comm->timeout_s, comm->rank);
  return KILN_OK;
}

/* ---- the fingerprint ------------------------------------------------------------ */

static bool fingerprint_equal(const kiln_comm_fingerprint_t *a, const kiln_comm_fingerprint_t *b) {
  return a->kind == b->kind && a->reduce == b->reduce && a->dtype == b->dtype && a->root == b->root &&
         a->count == b->count && a->seq == b->seq;
}

/* Every rank's call, ranks that called the same grouped, in rank order of
 * their first member: "rank 0 called ...; ranks 1, 2 called ...". */
static void describe_all(const kiln_comm_fingerprint_t *fps, int size, char *buf, size_t cap) {
  size_t used = 0;
  bool *done = calloc((size_t)size, sizeof *done);
  int groups = 0;
  buf[0] = '\0';
  for (int r = 0; r < size && done; r++) {
    if (done[r]) continue;
    if (++groups > 8) {
      snprintf(buf + used, cap - used, "; and other calls on the remaining ranks");
      break;
    }
    char call[160], ranks[256];
    int n = 0;
    size_t rl = 0;
    for (int q = r; q < size; q++) {
      if (done[q] || !fingerprint_equal(&fps[r], &fps[q])) continue;
      done[q] = true;
      if (n < 16 && rl < sizeof ranks)
        rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, "%s%d", n ? ", " : "", q);
      else if (n == 16 && rl < sizeof ranks)
        rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, ", ...");
      n++;
    }
    kiln__comm_describe(&fps[r], call, sizeof call);
    int w = snprintf(buf + used, cap - used, "%s%s %s called %s", groups > 1 ? "; " : "",
                     n > 1 ? "ranks" : "rank", ranks, call);
    if (w < 0 || (size_t)w >= cap - used) break;
    used += (size_t)w;
  }
  free(done);
}

/* One exchange with `peers` (count of them): send `mine` to each, receive
 * each one's into theirs[i]; KILN_UNAVAILABLE naming the peers whose
 * fingerprint did not arrive in time. */
static kiln_status_t exchange(kiln_comm_t *comm, const kiln_comm_fingerprint_t *mine, const char *what,
                              const int *peers, int count, int tag, kiln_comm_fingerprint_t *theirs) {
  MPI_Request *requests = malloc(2 * (size_t)count * sizeof *requests);
  int *pending = malloc(2 * (size_t)count * sizeof *pending);
  if (!requests || !pending) {
    free(requests);
    free(pending);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: no host memory for %d requests", what, 2 * count);
  }
  const char *failed_call = NULL;
  int err = MPI_SUCCESS;
  for (int i = 0; i < 2 * count; i++) requests[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < count && err == MPI_SUCCESS; i++) {
    err = MPI_Irecv(&theirs[i], (int)sizeof *theirs, MPI_BYTE, peers[i], tag, comm->ctrl, &requests[i]);
    failed_call = "MPI_Irecv";
  }
  for (int i = 0; i < count && err == MPI_SUCCESS; i++) {
    err = MPI_Isend(mine, (int)sizeof *mine, MPI_BYTE, peers[i], tag, comm->ctrl, &requests[count + i]);
    failed_call = "MPI_Isend";
  }
  bool timed_out = false;
  if (err == MPI_SUCCESS) {
    err = poll_all(comm, 2 * count, requests, pending, &timed_out);
    failed_call = "MPI_Test";
  }
  kiln_status_t status = KILN_OK;
  if (err != MPI_SUCCESS) {
    status = kiln__comm_mpi_error(comm, err, failed_call, what);
  } else if (timed_out) {
    char ranks[512];
    size_t used = 0;
    int missing = 0;
    ranks[0] = '\0';
    for (int i = 0; i < count; i++) {
      if (!pending[i]) continue;
      if (used < sizeof ranks - 16)
        used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", missing ? ", " : "", peers[i]);
      missing++;
    }
    if (missing == 0) snprintf(ranks, sizeof ranks, "(every rank's call arrived; its own could not be delivered)");
    status = comm_break(comm, KILN_UNAVAILABLE,
                        "%s on rank %d: %s %s did not make the matching call within KILN_COMM_TIMEOUT=%g s "
                        "(it skipped the call, stalled or died); the communicator is unusable now: destroy it "
                        "and end the job",
                        what, comm->rank, missing > 1 ? "ranks" : "rank", ranks, comm->timeout_s);
  }
  /* A fingerprint that arrives after this call gave up must not land in
   * memory freed by then: the open requests are cancelled. */
  for (int i = 0; i < 2 * count; i++) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&requests[i]);
    MPI_Request_free(&requests[i]);
  }
  free(requests);
  free(pending);
  return status;
}

kiln_status_t kiln__comm_agree(kiln_comm_t *comm, kiln_comm_fingerprint_t mine) {
  char what[160];
  bool p2p = mine.kind == KILN_COMM_KIND_SEND || mine.kind == KILN_COMM_KIND_RECV;
  if (p2p)
    mine.seq = mine.kind == KILN_COMM_KIND_SEND ? comm->sent_to[mine.root]++ : comm->recvd_from[mine.root]++;
  else
    mine.seq = comm->seq++;
  kiln__comm_describe(&mine, what, sizeof what);
  if (comm->broken)
    return kiln_set_error(KILN_UNAVAILABLE, "%s: the communicator broke earlier: %s", what, comm->broken_why);

  if (p2p) {
    kiln_comm_fingerprint_t theirs;
    int peer = mine.root;
    kiln_status_t status = exchange(comm, &mine, what, &peer, 1, 1, &theirs);
    if (status != KILN_OK) return status;
    bool match = theirs.kind == (mine.kind == KILN_COMM_KIND_SEND ? KILN_COMM_KIND_RECV : KILN_COMM_KIND_SEND) &&
                 theirs.dtype == mine.dtype && theirs.count == mine.count && theirs.seq == mine.seq &&
                 theirs.root == comm->rank;
    if (match) return KILN_OK;
    char other[160];
    kiln__comm_describe(&theirs, other, sizeof other);
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "point-to-point calls differ: rank %d called %s; rank %d called %s; a send needs a recv "
                          "of the same dtype and element count on its peer, in the same order",
                          comm->rank, what, peer, other);
  }

  if (comm->size == 1) return KILN_OK;
  kiln_comm_fingerprint_t *all = malloc((size_t)comm->size * sizeof *all);
  int *peers = malloc((size_t)comm->size * sizeof *peers);
  if (!all || !peers) {
    free(all);
    free(peers);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: no host memory for %d fingerprints", what, comm->size);
  }
  int n = 0;
  for (int r = 0; r < comm->size; r++)
    if (r != comm->rank) peers[n++] = r;
  kiln_status_t status = exchange(comm, &mine, what, peers, n, 0, all + 1);
  if (status == KILN_OK) {
    /* Back into rank order: all[r] is rank r's call. */
    memmove(all, all + 1, (size_t)comm->rank * sizeof *all);
    all[comm->rank] = mine;
    bool same = true;
    for (int r = 0; r < comm->size; r++) same = same && fingerprint_equal(&all[r], &mine);
    if (!same) {
      char calls[1600];
      describe_all(all, comm->size, calls, sizeof calls);
      status = kiln_set_error(KILN_INVALID_ARGUMENT,
                              "collectives differ across ranks: %s; every rank must make the same calls "
                              "(operation, dtype, element count, root) in the same order",
                              calls);
    }
  }
  free(all);
  free(peers);
  return status;
}

/* ---- life ----------------------------------------------------------------------- */

static kiln_status_t read_timeout(double *out_s) {
  const char *text = getenv("KILN_COMM_TIMEOUT");
  *out_s = DEFAULT_TIMEOUT_S;
  if (!text || !*text) return KILN_OK;
  char *end = NULL;
  errno = 0;
  double value = strtod(text, &end);
  if (errno || end == text || *end || !isfinite(value) || value <= 0)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "KILN_COMM_TIMEOUT=\"%s\" is not a number of seconds above 0; use e.g. 120 or 0.5",
                          text);
  *out_s = value;
  return KILN_OK;
}

/* KILN_COMM_ENGINE: auto (the default), mpi or nccl. NCCL is looked for as
 * the CUDA backend finds cuBLAS (the loader's search); kiln has no NCCL
 * engine yet, so it is reported and never chosen. */
static kiln_status_t choose_engine(char *reason, size_t size) {
  const char *text = getenv("KILN_COMM_ENGINE");
  if (!text || !*text) text = "auto";
  if (strcmp(text, "auto") && strcmp(text, "mpi") && strcmp(text, "nccl"))
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "KILN_COMM_ENGINE=\"%s\" is not an engine; use one of: auto, mpi, nccl", text);
  if (!strcmp(text, "mpi")) {
    snprintf(reason, size, "mpi: KILN_COMM_ENGINE=mpi");
    return KILN_OK;
  }
  char nccl[200];
  void *handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle) {
    snprintf(nccl, sizeof nccl, "libnccl.so.2 loads, but kiln's NCCL engine (CUDA tensors on every rank) is not "
                                "built yet");
    dlclose(handle);
  } else {
    const char *why = dlerror();
    snprintf(nccl, sizeof nccl, "libnccl.so.2 not found (%s)", why ? why : "no reason given");
  }
  if (!strcmp(text, "nccl"))
    return kiln_set_error(KILN_UNAVAILABLE,
                          "KILN_COMM_ENGINE=nccl, but NCCL cannot serve here: %s; use KILN_COMM_ENGINE=mpi or auto",
                          nccl);
  snprintf(reason, size, "auto: mpi; nccl not chosen: %s", nccl);
  return KILN_OK;
}

static void comm_free(kiln_comm_t *comm) {
  if (!comm) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    for (int d = 0; d < 2; d++)
      for (int o = 0; o < 3; o++)
        if (comm->half_ops[d][o] != MPI_OP_NULL) MPI_Op_free(&comm->half_ops[d][o]);
    if (comm->data != MPI_COMM_NULL) MPI_Comm_free(&comm->data);
    if (comm->ctrl != MPI_COMM_NULL) MPI_Comm_free(&comm->ctrl);
  }
  free(comm->sent_to);
  free(comm->recvd_from);
  free(comm);
}

/* A communicator over two duplicates of `parent` (MPI errors returned, not
 * fatal). */
static kiln_status_t comm_make(MPI_Comm parent, const char *engine_reason, double timeout_s,
                               kiln_comm_t **out_comm) {
  kiln_comm_t *comm = calloc(1, sizeof *comm);
  if (!comm) return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_comm: no host memory for a communicator");
  comm->data = comm->ctrl = MPI_COMM_NULL;
  for (int d = 0; d < 2; d++)
    for (int o = 0; o < 3; o++) comm->half_ops[d][o] = MPI_OP_NULL;
  comm->timeout_s = timeout_s;
  snprintf(comm->engine_reason, sizeof comm->engine_reason, "%s", engine_reason);
  const char *call = "MPI_Comm_dup";
  int err = MPI_Comm_dup(parent, &comm->data);
  if (err == MPI_SUCCESS) err = MPI_Comm_dup(parent, &comm->ctrl);
  if (err == MPI_SUCCESS) {
    call = "MPI_Comm_set_errhandler";
    err = MPI_Comm_set_errhandler(comm->data, MPI_ERRORS_RETURN);
  }
  if (err == MPI_SUCCESS) err = MPI_Comm_set_errhandler(comm->ctrl, MPI_ERRORS_RETURN);
  if (err == MPI_SUCCESS) {
    call = "MPI_Comm_rank";
    err = MPI_Comm_rank(comm->data, &comm->rank);
  }
  if (err == MPI_SUCCESS) err = MPI_Comm_size(comm->data, &comm->size);
  if (err != MPI_SUCCESS) {
    kiln_status_t status = kiln__comm_mpi_error(comm, err, call, "creating a communicator");
    comm_free(comm);
    return status;
  }
  comm->sent_to = calloc((size_t)comm->size, sizeof *comm->sent_to);
  comm->recvd_from = calloc((size_t)comm->size, sizeof *comm->recvd_from);
  if (!comm->sent_to || !comm->recvd_from) {
    comm_free(comm);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_comm: no host memory for a communicator");
  }
  kiln_status_t status = kiln__comm_half_ops_create(comm);
  if (status != KILN_OK) {
    comm_free(comm);
    return status;
  }
  atomic_fetch_add(&live_comms, 1);
  *out_comm = comm;
  return KILN_OK;
}

static void finalize_if_ours(void) {
  if (atomic_load(&live_comms) == 0 && atomic_exchange(&kiln_initialised_mpi, false)) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

kiln_status_t kiln_comm_create_world(kiln_comm_t **out_comm) {
  if (!out_comm) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_comm_create_world: out_comm is NULL");
  double timeout_s;
  char reason[256];
  kiln_status_t status = read_timeout(&timeout_s);
  if (status == KILN_OK) status = choose_engine(reason, sizeof reason);
  if (status != KILN_OK) return status;

  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    return kiln_set_error(KILN_UNAVAILABLE,
                          "kiln_comm_create_world: MPI was finalised already in this process, and MPI cannot "
                          "start twice; create communicators before MPI_Finalize (or destroying the last one)");
  if (!initialized) {
    int provided = 0;
    int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (err != MPI_SUCCESS)
      return kiln_set_error(KILN_UNAVAILABLE,
                            "kiln_comm_create_world: MPI_Init_thread failed (error %d); run the program under "
                            "mpirun (docs/distributed.md)",
                            err);
    atomic_store(&kiln_initialised_mpi, true);
  }
  status = comm_make(MPI_COMM_WORLD, reason, timeout_s, out_comm);
  if (status != KILN_OK) finalize_if_ours();
  return status;
}

kiln_status_t kiln_comm_split(kiln_comm_t *comm, int color, int key, kiln_comm_t **out_comm) {
  if (!comm || !out_comm)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_comm_split: %s is NULL", comm ? "out_comm" : "comm");
  if (color < 0)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_comm_split: color %d is negative; use a color >= 0",
                          color);
  kiln_comm_fingerprint_t fp = {KILN_COMM_KIND_SPLIT, -1, -1, -1, 0, 0};
  kiln_status_t status = kiln__comm_agree(comm, fp);
  if (status != KILN_OK) return status;
  MPI_Comm part = MPI_COMM_NULL;
  int err = MPI_Comm_split(comm->data, color, key, &part);
  if (err != MPI_SUCCESS) return kiln__comm_mpi_error(comm, err, "MPI_Comm_split", "split");
  status = comm_make(part, comm->engine_reason, comm->timeout_s, out_comm);
  MPI_Comm_free(&part);
  return status;
}

void kiln_comm_destroy(kiln_comm_t *comm) {
  if (!comm) return;
  comm_free(comm);
  atomic_fetch_sub(&live_comms, 1);
  finalize_if_ours();
}

int kiln_comm_rank(const kiln_comm_t *comm) { return comm ? comm->rank : -1; }
int kiln_comm_size(const kiln_comm_t *comm) { return comm ? comm->size : 0; }
const char *kiln_comm_engine(const kiln_comm_t *comm) { return "mpi"; }
const char *kiln_comm_engine_reason(const kiln_comm_t *comm) { return comm ? comm->engine_reason : ""; }

kiln_status_t kiln_comm_barrier(kiln_comm_t *comm) {
  if (!comm) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_comm_barrier: comm is NULL");
  /* The fingerprint exchange reaches every rank from every rank: a barrier. */
  kiln_comm_fingerprint_t fp = {KILN_COMM_KIND_BARRIER, -1, -1, -1, 0, 0};
  const int64_t t0 = kiln_trace_active() ? kiln_trace_clock_ns() : -1;
  kiln_status_t status = kiln__comm_agree(comm, fp);
  if (t0 >= 0) {
    char detail[64];
    snprintf(detail, sizeof detail, "rank %d of %d%s%s", comm->rank, comm->size, status == KILN_OK ? "" : ", failed: ",
             status == KILN_OK ? "" : kiln_status_name(status));
    (void)kiln_trace_span("collective", "barrier", t0, 0, detail);
  }
  return status;
}
