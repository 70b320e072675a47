/* comm/collectives.c: the collectives and send/recv: kiln dtypes as MPI types, tensors as host memory (zero-copy on the CPU, staged elsewhere), f16/bf16 reductions in f32. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

#include "comm_internal.h"
#include "kernels/dtype_convert.h"
#include "kiln/dlpack.h"
#include "kiln/queue.h"
#include "kiln/trace.h"

/* ---- f16 and bf16: MPI has no such type; their bits travel as MPI_UINT16_T
 * and these operations reduce them in f32, rounding once per step. --------- */

#define HALF_OPS_(X) X(f16) X(bf16)
#define HALF_OP_FNS_(T)                                                                            \
  static void half_sum_##T(void *in, void *inout, int *len, MPI_Datatype *type) {                  \
    const uint16_t *a = in;                                                                        \
    uint16_t *b = inout;                                                                           \
    for (int i = 0; i < *len; i++)                                                                 \
      b[i] = kiln_dc_f64_to_##T((double)(kiln_dc_##T##_to_f32(a[i]) + kiln_dc_##T##_to_f32(b[i]))); \
  }                                                                                                \
  static void half_max_##T(void *in, void *inout, int *len, MPI_Datatype *type) {                  \
    const uint16_t *a = in;                                                                        \
    uint16_t *b = inout;                                                                           \
    for (int i = 0; i < *len; i++)                                                                 \
      if (kiln_dc_##T##_to_f32(a[i]) > kiln_dc_##T##_to_f32(b[i])) b[i] = a[i];                    \
  }                                                                                                \
  static void half_min_##T(void *in, void *inout, int *len, MPI_Datatype *type) {                  \
    const uint16_t *a = in;                                                                        \
    uint16_t *b = inout;                                                                           \
    for (int i = 0; i < *len; i++)                                                                 \
      if (kiln_dc_##T##_to_f32(a[i]) < kiln_dc_##T##_to_f32(b[i])) b[i] = a[i];                    \
  }
HALF_OPS_(HALF_OP_FNS_)

kiln_status_t kiln__comm_half_ops_create(kiln_comm_t *comm) {
  MPI_User_function *fns[2][3] = {{half_sum_f16, half_max_f16, half_min_f16},
                                  {half_sum_bf16, half_max_bf16, half_min_bf16}};
  for (int d = 0; d < 2; d++)
    for (int o = 0; o < 3; o++) {
      int err = MPI_Op_create(fns[d][o], 1, &comm->half_ops[d][o]);
      if (err != MPI_SUCCESS) return kiln__comm_mpi_error(comm, err, "MPI_Op_create", "creating a communicator");
    }
  return KILN_OK;
}

static MPI_Datatype mpi_type(kiln_dtype_t dtype) {
  switch (dtype) {
    case KILN_F32: return MPI_FLOAT;
    case KILN_F64: return MPI_DOUBLE;
    case KILN_I32: return MPI_INT32_T;
    case KILN_I64: return MPI_INT64_T;
    case KILN_I16: return MPI_INT16_T;
    case KILN_I8: return MPI_INT8_T;
    case KILN_U8: return MPI_UINT8_T;
    case KILN_BOOL: return MPI_C_BOOL;
    case KILN_F16:
    case KILN_BF16: return MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL;
  }
}

/* The MPI operation of a reduction on a dtype (mean sums; the division
 * follows). bool: sum and max are or, min is and (MPI defines no sum of
 * MPI_C_BOOL). */
static MPI_Op mpi_op(const kiln_comm_t *comm, kiln_dtype_t dtype, kiln_comm_reduce_t op) {
  int o = op == KILN_COMM_MAX ? 1 : op == KILN_COMM_MIN ? 2 : 0;
  if (dtype == KILN_F16) return comm->half_ops[0][o];
  if (dtype == KILN_BF16) return comm->half_ops[1][o];
  if (dtype == KILN_BOOL) return o == 2 ? MPI_LAND : MPI_LOR;
  return o == 1 ? MPI_MAX : o == 2 ? MPI_MIN : MPI_SUM;
}

/* Mean: the sum over `ranks`, divided in the dtype's own precision (f16 and
 * bf16 through double, rounded once). */
static void divide(void *data, kiln_dtype_t dtype, size_t count, int ranks) {
  switch (dtype) {
    case KILN_F32:
      for (size_t i = 0; i < count; i++) ((float *)data)[i] /= (float)ranks;
      break;
    case KILN_F64:
      for (size_t i = 0; i < count; i++) ((double *)data)[i] /= (double)ranks;
      break;
    case KILN_F16:
      for (size_t i = 0; i < count; i++) {
        uint16_t *h = (uint16_t *)data + i;
        *h = kiln_dc_f64_to_f16((double)kiln_dc_f16_to_f32(*h) / ranks);
      }
      break;
    case KILN_BF16:
      for (size_t i = 0; i < count; i++) {
        uint16_t *h = (uint16_t *)data + i;
        *h = kiln_dc_f64_to_bf16((double)kiln_dc_bf16_to_f32(*h) / ranks);
      }
      break;
    default: break;
  }
}

/* ---- tensors as host memory ---------------------------------------------------- */

/* A tensor's elements in host memory: the CPU backend's own memory through a
 * DLPack export (no copy; exporting waits for the tensor's queued work), else
 * a staging buffer from kiln_host_allocate filled by kiln_tensor_read (which
 * waits too). */
typedef struct host_view_t {
  void *ptr;
  size_t bytes;
  kiln_device_t *device;
  DLManagedTensor *managed; /* zero-copy */
  bool staged;
} host_view_t;

static bool is_cpu(kiln_device_t *device) {
  DLDevice dl;
  return kiln_device_dlpack(device, &dl) == KILN_OK && dl.device_type == kDLCPU;
}

/* `load`: the tensor's current values are needed (inputs, in-place). */
static kiln_status_t view_open(const kiln_tensor_t *tensor, bool load, host_view_t *view) {
  memset(view, 0, sizeof *view);
  view->device = kiln_tensor_device(tensor);
  view->bytes = (size_t)kiln_tensor_numel(tensor) * kiln_dtype_size(kiln_tensor_dtype(tensor));
  if (is_cpu(view->device) && kiln_tensor_is_contiguous(tensor)) {
    kiln_status_t status = kiln_tensor_to_dlpack((kiln_tensor_t *)tensor, &view->managed);
    if (status == KILN_OK) {
      view->ptr = (char *)view->managed->dl_tensor.data + view->managed->dl_tensor.byte_offset;
      return KILN_OK;
    }
    /* A dtype DLPack does not carry: staged like any other device's. */
    kiln_clear_error();
    view->managed = NULL;
  }
  kiln_status_t status = kiln_host_allocate(view->device, view->bytes, &view->ptr);
  if (status != KILN_OK) return status;
  view->staged = true;
  if (load && view->bytes) return kiln_tensor_read(tensor, view->ptr, view->bytes);
  return KILN_OK;
}

/* Write a staged result back into the tensor, through its device's current
 * queue (blocking), so later kiln work on that queue sees it. */
static kiln_status_t view_store(kiln_tensor_t *tensor, host_view_t *view) {
  if (!view->staged || view->bytes == 0) return KILN_OK;
  return kiln_buffer_write(kiln_device_current_queue(view->device), kiln_tensor_buffer(tensor),
                           kiln_tensor_offset_bytes(tensor), view->ptr, view->bytes, true, 0, NULL, NULL);
}

/* After a timeout MPI may still write the memory of the abandoned request:
 * it is kept (the export holds the tensor, the staging stays allocated) for
 * the rest of the process, which the error tells to end. */
static void view_close(const kiln_comm_t *comm, host_view_t *view) {
  if (comm->broken) return;
  if (view->managed) view->managed->deleter(view->managed);
  if (view->staged) kiln_host_free(view->device, view->ptr);
  memset(view, 0, sizeof *view);
}

/* ---- argument checks ------------------------------------------------------------ */

static kiln_status_t check_tensor(const char *call, const char *name, const kiln_tensor_t *tensor, bool written) {
  if (!tensor) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, name);
  if (mpi_type(kiln_tensor_dtype(tensor)) == MPI_DATATYPE_NULL)
    return kiln_set_error(KILN_DTYPE_MISMATCH, "%s: %s has dtype %d, which libkiln-comm does not know", call,
                          name, (int)kiln_tensor_dtype(tensor));
  if (kiln_tensor_numel(tensor) > INT_MAX)
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "%s: %s has %lld elements; libkiln-comm passes at most %d (MPI's int count) in one "
                          "call: split the tensor",
                          call, name, (long long)kiln_tensor_numel(tensor), INT_MAX);
  if (written && !kiln_tensor_is_contiguous(tensor))
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "%s: %s is a strided view, and results are written into contiguous tensors only; pass "
                          "kiln_tensor_contiguous(%s) and use that",
                          call, name, name);
  return KILN_OK;
}

static kiln_status_t check_reduce(const char *call, kiln_dtype_t dtype, kiln_comm_reduce_t op) {
  if ((int)op < 0 || op > KILN_COMM_MIN)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: reduction %d is not one of KILN_COMM_SUM, _MEAN, _MAX, _MIN",
                          call, (int)op);
  if (op == KILN_COMM_MEAN && kiln_dtype_class(dtype) != KILN_DTYPE_CLASS_FLOAT)
    return kiln_set_error(KILN_DTYPE_MISMATCH,
                          "%s: the mean of %s values is not a %s; reduce a kiln_tensor_cast to f32 (or sum and "
                          "divide)",
                          call, kiln_dtype_name(dtype), kiln_dtype_name(dtype));
  return KILN_OK;
}

static kiln_status_t check_comm(const char *call, kiln_comm_t *comm) {
  return comm ? KILN_OK : kiln_set_error(KILN_INVALID_ARGUMENT, "%s: comm is NULL", call);
}

/* The status of a collective's data phase. It runs as MPI's blocking
 * collective: the fingerprints just showed every rank arrived, and Open
 * MPI 4.1's blocking collectives (coll/tuned) are much faster than its
 * non-blocking ones (libnbc): allreduce of 1 MiB between two ranks of one
 * host, 0.23 ms against 5.5 ms. A rank that dies during it ends the job
 * (mpirun's default); a rank that never came is caught by the fingerprint's
 * deadline. */
static kiln_status_t done(kiln_comm_t *comm, int err, const char *call, const kiln_comm_fingerprint_t *fp) {
  if (err == MPI_SUCCESS) return KILN_OK;
  char what[160];
  kiln__comm_describe(fp, what, sizeof what);
  return kiln__comm_mpi_error(comm, err, call, what);
}

/* Send or receive: started, then waited for with the deadline. */
static kiln_status_t run(kiln_comm_t *comm, int err, MPI_Request *request, const char *call,
                         const kiln_comm_fingerprint_t *fp) {
  char what[160];
  kiln__comm_describe(fp, what, sizeof what);
  if (err != MPI_SUCCESS) return kiln__comm_mpi_error(comm, err, call, what);
  return kiln__comm_wait(comm, 1, request, what);
}

/* ---- the collectives ------------------------------------------------------------ */

/* The data phase's unit: large enough for MPI's full bandwidth, small
 * enough that copying the next chunk off the device overlaps this one's
 * transfer. */
#define CHUNK_BYTES ((size_t)4 << 20)

/* Allreduce of a device tensor through two staging buffers: while chunk k
 * crosses the network, chunk k+1 comes off the device and chunk k-1 goes
 * back. The device's current queue runs in order, so a read into a buffer
 * waits for the write that last used it without the host waiting. */
static kiln_status_t allreduce_staged(kiln_comm_t *comm, kiln_tensor_t *tensor, kiln_comm_reduce_t op,
                                      const kiln_comm_fingerprint_t *fp, size_t chunk) {
  kiln_dtype_t dtype = kiln_tensor_dtype(tensor);
  kiln_device_t *device = kiln_tensor_device(tensor);
  kiln_queue_t *queue = kiln_device_current_queue(device);
  kiln_buffer_t *buffer = kiln_tensor_buffer(tensor);
  size_t item = kiln_dtype_size(dtype), base = kiln_tensor_offset_bytes(tensor);
  size_t count = (size_t)kiln_tensor_numel(tensor);
  size_t chunks = (count + chunk - 1) / chunk;
  size_t staging = (count < chunk ? count : chunk) * item;
  void *bufs[2] = {NULL, NULL};
  kiln_event_t *read_done = NULL;
  kiln_status_t status = kiln_host_allocate(device, staging, &bufs[0]);
  if (status == KILN_OK && chunks > 1) status = kiln_host_allocate(device, staging, &bufs[1]);
  if (status == KILN_OK && count)
    status = kiln_buffer_read(queue, buffer, base, bufs[0], (chunk < count ? chunk : count) * item, false, 0, NULL,
                              &read_done);
  for (size_t k = 0; status == KILN_OK && k < chunks; k++) {
    size_t first = k * chunk, n = count - first < chunk ? count - first : chunk;
    void *data = bufs[k % 2];
    status = kiln_event_wait(read_done);
    kiln_event_release(read_done);
    read_done = NULL;
    if (status == KILN_OK && k + 1 < chunks) {
      size_t next = (k + 1) * chunk, m = count - next < chunk ? count - next : chunk;
      status = kiln_buffer_read(queue, buffer, base + next * item, bufs[(k + 1) % 2], m * item, false, 0, NULL,
                                &read_done);
    }
    if (status != KILN_OK) break;
    int err = MPI_Allreduce(MPI_IN_PLACE, data, (int)n, mpi_type(dtype), mpi_op(comm, dtype, op), comm->data);
    status = done(comm, err, "MPI_Allreduce", fp);
    if (status == KILN_OK && op == KILN_COMM_MEAN) divide(data, dtype, n, comm->size);
    if (status == KILN_OK)
      status = kiln_buffer_write(queue, buffer, base + first * item, data, n * item, false, 0, NULL, NULL);
  }
  kiln_event_release(read_done);
  /* The staging must outlive the copies that use it. */
  kiln_status_t finish = kiln_queue_finish(queue);
  if (status == KILN_OK) status = finish;
  if (!comm->broken) {
    kiln_host_free(device, bufs[0]);
    kiln_host_free(device, bufs[1]);
  }
  return status;
}

static kiln_status_t allreduce(kiln_comm_t *comm, kiln_tensor_t *tensor, kiln_comm_reduce_t op) {
  const char *call = "kiln_comm_allreduce";
  kiln_status_t status = check_comm(call, comm);
  if (status == KILN_OK) status = check_tensor(call, "tensor", tensor, true);
  if (status == KILN_OK) status = check_reduce(call, kiln_tensor_dtype(tensor), op);
  if (status != KILN_OK) return status;
  kiln_dtype_t dtype = kiln_tensor_dtype(tensor);
  int count = (int)kiln_tensor_numel(tensor);
  kiln_comm_fingerprint_t fp = {KILN_COMM_KIND_ALLREDUCE, (int32_t)op, (int32_t)dtype, -1, count, 0};
  status = kiln__comm_agree(comm, fp);
  if (status != KILN_OK) return status;
  fp.seq = comm->seq - 1;

  /* Zero-copy where the tensor's memory is the host's, else staged chunk by
   * chunk, and the chunking must match on every rank whatever its device:
   * it follows from the count and dtype only. */
  size_t item = kiln_dtype_size(dtype);
  size_t chunk = CHUNK_BYTES / item;
  host_view_t view;
  memset(&view, 0, sizeof view);
  if (is_cpu(kiln_tensor_device(tensor))) {
    status = view_open(tensor, true, &view);
    for (size_t first = 0; status == KILN_OK && first < (size_t)count; first += chunk) {
      size_t n = (size_t)count - first < chunk ? (size_t)count - first : chunk;
      void *data = (char *)view.ptr + first * item;
      int err = MPI_Allreduce(MPI_IN_PLACE, data, (int)n, mpi_type(dtype), mpi_op(comm, dtype, op), comm->data);
      status = done(comm, err, "MPI_Allreduce", &fp);
      if (status == KILN_OK && op == KILN_COMM_MEAN) divide(data, dtype, n, comm->size);
    }
    if (status == KILN_OK) status = view_store(tensor, &view);
    view_close(comm, &view);
    return status;
  }
  return allreduce_staged(comm, tensor, op, &fp, chunk);
}

static kiln_status_t broadcast(kiln_comm_t *comm, kiln_tensor_t *tensor, int root) {
  const char *call = "kiln_comm_broadcast";
  kiln_status_t status = check_comm(call, comm);
  if (status == KILN_OK) status = check_tensor(call, "tensor", tensor, true);
  if (status == KILN_OK && (root < 0 || root >= comm->size))
    status = kiln_set_error(KILN_INVALID_ARGUMENT, "%s: root %d is not a rank; the communicator has ranks 0..%d",
                            call, root, comm->size - 1);
  if (status != KILN_OK) return status;
  kiln_dtype_t dtype = kiln_tensor_dtype(tensor);
  int count = (int)kiln_tensor_numel(tensor);
  kiln_comm_fingerprint_t fp = {KILN_COMM_KIND_BROADCAST, -1, (int32_t)dtype, root, count, 0};
  status = kiln__comm_agree(comm, fp);
  if (status != KILN_OK) return status;
  fp.seq = comm->seq - 1;

  host_view_t view;
  status = view_open(tensor, comm->rank == root, &view);
  if (status == KILN_OK) {
    int err = MPI_Bcast(view.ptr, count, mpi_type(dtype), root, comm->data);
    status = done(comm, err, "MPI_Bcast", &fp);
  }
  if (status == KILN_OK && comm->rank != root) status = view_store(tensor, &view);
  view_close(comm, &view);
  return status;
}

static kiln_status_t allgather(kiln_comm_t *comm, const kiln_tensor_t *input, kiln_tensor_t *output) {
  const char *call = "kiln_comm_allgather";
  kiln_status_t status = check_comm(call, comm);
  if (status == KILN_OK) status = check_tensor(call, "input", input, false);
  if (status == KILN_OK) status = check_tensor(call, "output", output, true);
  if (status != KILN_OK) return status;
  kiln_dtype_t dtype = kiln_tensor_dtype(input);
  int64_t count = kiln_tensor_numel(input);
  if (kiln_tensor_dtype(output) != dtype)
    return kiln_set_error(KILN_DTYPE_MISMATCH, "%s: output is %s, input %s; they must match", call,
                          kiln_dtype_name(kiln_tensor_dtype(output)), kiln_dtype_name(dtype));
  if (kiln_tensor_numel(output) != count * comm->size)
    return kiln_set_error(KILN_SHAPE_MISMATCH,
                          "%s: output has %lld elements; it needs %d ranks x %lld input elements = %lld", call,
                          (long long)kiln_tensor_numel(output), comm->size, (long long)count,
                          (long long)(count * comm->size));
  kiln_comm_fingerprint_t fp = {KILN_COMM_KIND_ALLGATHER, -1, (int32_t)dtype, -1, count, 0};
  status = kiln__comm_agree(comm, fp);
  if (status != KILN_OK) return status;
  fp.seq = comm->seq - 1;

  host_view_t in, out;
  memset(&out, 0, sizeof out);
  status = view_open(input, true, &in);
  if (status == KILN_OK) status = view_open(output, false, &out);
  if (status == KILN_OK) {
    int err = MPI_Allgather(in.ptr, (int)count, mpi_type(dtype), out.ptr, (int)count, mpi_type(dtype), comm->data);
    status = done(comm, err, "MPI_Allgather", &fp);
  }
  if (status == KILN_OK) status = view_store(output, &out);
  view_close(comm, &in);
  view_close(comm, &out);
  return status;
}

static kiln_status_t reduce_scatter(kiln_comm_t *comm, const kiln_tensor_t *input, kiln_tensor_t *output,
                                     kiln_comm_reduce_t op) {
  const char *call = "kiln_comm_reduce_scatter";
  kiln_status_t status = check_comm(call, comm);
  if (status == KILN_OK) status = check_tensor(call, "input", input, false);
  if (status == KILN_OK) status = check_tensor(call, "output", output, true);
  if (status == KILN_OK) status = check_reduce(call, kiln_tensor_dtype(input), op);
  if (status != KILN_OK) return status;
  kiln_dtype_t dtype = kiln_tensor_dtype(input);
  int64_t count = kiln_tensor_numel(input);
  int64_t part = kiln_tensor_numel(output);
  if (kiln_tensor_dtype(output) != dtype)
    return kiln_set_error(KILN_DTYPE_MISMATCH, "%s: output is %s, input %s; they must match", call,
                          kiln_dtype_name(kiln_tensor_dtype(output)), kiln_dtype_name(dtype));
  if (part * comm->size != count)
    return kiln_set_error(KILN_SHAPE_MISMATCH,
                          "%s: input has %lld elements, output %lld; the input needs %d ranks x the output's "
                          "elements = %lld",
                          call, (long long)count, (long long)part, comm->size, (long long)(part * comm->size));
  kiln_comm_fingerprint_t fp = {KILN_COMM_KIND_REDUCE_SCATTER, (int32_t)op, (int32_t)dtype, -1, count, 0};
  status = kiln__comm_agree(comm, fp);
  if (status != KILN_OK) return status;
  fp.seq = comm->seq - 1;

  host_view_t in, out;
  memset(&out, 0, sizeof out);
  status = view_open(input, true, &in);
  if (status == KILN_OK) status = view_open(output, false, &out);
  if (status == KILN_OK) {
    int err = MPI_Reduce_scatter_block(in.ptr, out.ptr, (int)part, mpi_type(dtype), mpi_op(comm, dtype, op),
                                       comm->data);
    status = done(comm, err, "MPI_Reduce_scatter_block", &fp);
  }
  if (status == KILN_OK && op == KILN_COMM_MEAN) divide(out.ptr, dtype, (size_t)part, comm->size);
  if (status == KILN_OK) status = view_store(output, &out);
  view_close(comm, &in);
  view_close(comm, &out);
  return status;
}

/* ---- point to point ------------------------------------------------------------- */

static kiln_status_t p2p(kiln_comm_t *comm, kiln_tensor_t *tensor, int peer, bool send) {
  const char *call = send ? "kiln_comm_send" : "kiln_comm_recv";
  kiln_status_t status = check_comm(call, comm);
  if (status == KILN_OK) status = check_tensor(call, "tensor", tensor, !send);
  if (status == KILN_OK && (peer < 0 || peer >= comm->size || peer == comm->rank))
    status = kiln_set_error(KILN_INVALID_ARGUMENT,
                            "%s: peer %d is not another rank; this is rank %d of ranks 0..%d", call, peer,
                            comm->rank, comm->size - 1);
  if (status != KILN_OK) return status;
  kiln_dtype_t dtype = kiln_tensor_dtype(tensor);
  int count = (int)kiln_tensor_numel(tensor);
  kiln_comm_fingerprint_t fp = {send ? KILN_COMM_KIND_SEND : KILN_COMM_KIND_RECV, -1, (int32_t)dtype, peer, count, 0};
  status = kiln__comm_agree(comm, fp);
  if (status != KILN_OK) return status;
  fp.seq = (send ? comm->sent_to[peer] : comm->recvd_from[peer]) - 1;

  host_view_t view;
  status = view_open(tensor, send, &view);
  if (status == KILN_OK) {
    MPI_Request request = MPI_REQUEST_NULL;
    int err = send ? MPI_Isend(view.ptr, count, mpi_type(dtype), peer, 0, comm->data, &request)
                   : MPI_Irecv(view.ptr, count, mpi_type(dtype), peer, 0, comm->data, &request);
    status = run(comm, err, &request, send ? "MPI_Isend" : "MPI_Irecv", &fp);
  }
  if (status == KILN_OK && !send) status = view_store(tensor, &view);
  view_close(comm, &view);
  return status;
}

/* ---- the public calls: each one a span of the trace ------------------------------------ */

/* When a trace records, each call is a span of category "collective": its
 * name, dtype, element count, rank, and the bytes of its input; a failed
 * call says so in the detail. t0 < 0: no trace was recording at the call. */
static kiln_status_t traced(kiln_comm_t *comm, const char *name, int64_t t0, const kiln_tensor_t *tensor,
                            kiln_status_t status) {
  if (t0 < 0 || !comm || !tensor) return status;
  const kiln_dtype_t dtype = kiln_tensor_dtype(tensor);
  const int64_t count = kiln_tensor_numel(tensor);
  char detail[96];
  snprintf(detail, sizeof detail, "%s x %lld on %s, rank %d of %d%s%s", kiln_dtype_name(dtype), (long long)count,
           kiln_device_selector(kiln_tensor_device(tensor)), comm->rank, comm->size,
           status == KILN_OK ? "" : ", failed: ", status == KILN_OK ? "" : kiln_status_name(status));
  (void)kiln_trace_span("collective", name, t0, (uint64_t)count * kiln_dtype_size(dtype), detail);
  return status;
}

static int64_t trace_t0(void) { return kiln_trace_active() ? kiln_trace_clock_ns() : -1; }

kiln_status_t kiln_comm_allreduce(kiln_comm_t *comm, kiln_tensor_t *tensor, kiln_comm_reduce_t op) {
  const int64_t t0 = trace_t0();
  return traced(comm, "allreduce", t0, tensor, allreduce(comm, tensor, op));
}

kiln_status_t kiln_comm_broadcast(kiln_comm_t *comm, kiln_tensor_t *tensor, int root) {
  const int64_t t0 = trace_t0();
  return traced(comm, "broadcast", t0, tensor, broadcast(comm, tensor, root));
}

kiln_status_t kiln_comm_allgather(kiln_comm_t *comm, const kiln_tensor_t *input, kiln_tensor_t *output) {
  const int64_t t0 = trace_t0();
  return traced(comm, "allgather", t0, input, allgather(comm, input, output));
}

kiln_status_t kiln_comm_reduce_scatter(kiln_comm_t *comm, const kiln_tensor_t *input, kiln_tensor_t *output,
                                       kiln_comm_reduce_t op) {
  const int64_t t0 = trace_t0();
  return traced(comm, "reduce_scatter", t0, input, reduce_scatter(comm, input, output, op));
}

kiln_status_t kiln_comm_send(kiln_comm_t *comm, const kiln_tensor_t *tensor, int peer) {
  const int64_t t0 = trace_t0();
  return traced(comm, "send", t0, tensor, p2p(comm, (kiln_tensor_t *)tensor, peer, true));
}

kiln_status_t kiln_comm_recv(kiln_comm_t *comm, kiln_tensor_t *tensor, int peer) {
  const int64_t t0 = trace_t0();
  return traced(comm, "recv", t0, tensor, p2p(comm, tensor, peer, false));
}
