/* tests/cuda/emulator/stream.c: streams, each a worker thread running its commands in order, and events recorded and waited for on them. */
/*
 * Work is asynchronous, as on a GPU: a call validates its arguments at once
 * (so the caller gets the CUresult a driver would give), queues a command
 * and returns; the stream's worker runs the commands in order. Streams run
 * concurrently with each other and with the caller, so a missing
 * synchronisation in the plugin shows as wrong data here too. The NULL
 * (legacy default) stream runs its work in the caller, after the context's
 * blocking streams have drained.
 */
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

struct CUstream_st *fc_streams;

static bool is_default_stream(CUstream stream) {
  return stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

/* Run one command where it is due; returns what it returned, or nothing
 * when the context has already faulted. */
static CUresult run_command(fc_command_t *command) {
  pthread_mutex_lock(&fc_lock);
  const bool dead = command->ctx->sticky != CUDA_SUCCESS;
  pthread_mutex_unlock(&fc_lock);
  if (dead && command->touches_memory) return CUDA_SUCCESS;
  return command->run(command);
}

static void *worker_main(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&fc_lock);
  for (;;) {
    while (!s->head && !s->closing) pthread_cond_wait(&s->wake, &fc_lock);
    fc_command_t *command = s->head;
    if (!command) break; /* closing, and nothing left */
    s->head = command->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&fc_lock);
    const CUresult r = run_command(command);
    pthread_mutex_lock(&fc_lock);
    /* A fault makes the context unusable: every later call returns it. */
    if (r != CUDA_SUCCESS && command->ctx->sticky == CUDA_SUCCESS) command->ctx->sticky = r;
    s->completed = command->seq;
    free(command);
    pthread_cond_broadcast(&fc_done);
  }
  pthread_mutex_unlock(&fc_lock);
  return NULL;
}

bool fc_stream_check(CUstream stream, struct CUctx_st *ctx, const char *call, CUresult *out_result) {
  if (is_default_stream(stream)) return true;
  pthread_mutex_lock(&fc_lock);
  const bool live = fc_handle_is(stream, FC_KIND_STREAM) && !stream->closing;
  const bool same = live && stream->ctx == ctx;
  pthread_mutex_unlock(&fc_lock);
  if (!live) {
    *out_result = fc_reject(CUDA_ERROR_INVALID_HANDLE, call, "%p is not a live stream (destroyed already?)",
                            (void *)stream);
    return false;
  }
  if (!same) {
    *out_result = fc_reject(CUDA_ERROR_INVALID_CONTEXT, call,
                            "the stream belongs to the context of device %d, but the current context is device %d's",
                            stream->ctx->device->ordinal, ctx->device->ordinal);
    return false;
  }
  return true;
}

/* Wait, with fc_lock held, until the context's streams (the blocking ones
 * only, when blocking_only) have run what was queued on them. */
static void drain_locked(struct CUctx_st *ctx, bool blocking_only) {
again:
  for (struct CUstream_st *s = fc_streams; s; s = s->next_live) {
    if (s->ctx != ctx || (blocking_only && (s->flags & CU_STREAM_NON_BLOCKING))) continue;
    if (s->completed < s->submitted) {
      pthread_cond_wait(&fc_done, &fc_lock);
      goto again; /* the list may have changed meanwhile */
    }
  }
}

void fc_context_drain(struct CUctx_st *ctx) {
  pthread_mutex_lock(&fc_lock);
  drain_locked(ctx, false);
  pthread_mutex_unlock(&fc_lock);
}

CUresult fc_stream_enqueue(CUstream stream, struct CUctx_st *ctx, fc_command_t *command) {
  command->next = NULL;
  if (is_default_stream(stream)) {
    command->ctx = ctx;
    pthread_mutex_lock(&fc_lock);
    drain_locked(ctx, true);
    pthread_mutex_unlock(&fc_lock);
    const CUresult r = run_command(command);
    pthread_mutex_lock(&fc_lock);
    if (r != CUDA_SUCCESS && ctx->sticky == CUDA_SUCCESS) ctx->sticky = r;
    pthread_cond_broadcast(&fc_done);
    pthread_mutex_unlock(&fc_lock);
    free(command);
    return r;
  }
  command->ctx = stream->ctx;
  pthread_mutex_lock(&fc_lock);
  command->seq = ++stream->submitted;
  if (stream->tail)
    stream->tail->next = command;
  else
    stream->head = command;
  stream->tail = command;
  pthread_cond_signal(&stream->wake);
  pthread_mutex_unlock(&fc_lock);
  return CUDA_SUCCESS;
}

void fc_stream_drain(CUstream stream, struct CUctx_st *ctx) {
  pthread_mutex_lock(&fc_lock);
  if (is_default_stream(stream)) {
    drain_locked(ctx, true);
  } else {
    const uint64_t target = stream->submitted;
    while (stream->completed < target) pthread_cond_wait(&fc_done, &fc_lock);
  }
  pthread_mutex_unlock(&fc_lock);
}

size_t fc_live_streams(const struct CUctx_st *ctx) {
  size_t count = 0;
  pthread_mutex_lock(&fc_lock);
  for (struct CUstream_st *s = fc_streams; s; s = s->next_live) count += s->ctx == ctx;
  pthread_mutex_unlock(&fc_lock);
  return count;
}

size_t fc_live_events(const struct CUctx_st *ctx) {
  pthread_mutex_lock(&fc_lock);
  const size_t count = ctx->live_events;
  pthread_mutex_unlock(&fc_lock);
  return count;
}

/* ---- streams ------------------------------------------------------------------------------ */

/* End the worker (after it ran what was queued) and free the stream. */
static void stream_destroy(struct CUstream_st *s) {
  pthread_mutex_lock(&fc_lock);
  s->closing = true;
  fc_handle_remove(s);
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&fc_lock);
  pthread_join(s->worker, NULL);
  pthread_mutex_lock(&fc_lock);
  for (struct CUstream_st **link = &fc_streams; *link; link = &(*link)->next_live)
    if (*link == s) {
      *link = s->next_live;
      break;
    }
  pthread_mutex_unlock(&fc_lock);
  pthread_cond_destroy(&s->wake);
  free(s);
}

static void destroy_stream_of(void *handle, void *ctx) {
  struct CUstream_st *s = handle;
  if (s->ctx == ctx) stream_destroy(s);
}

void fc_context_streams_destroy(struct CUctx_st *ctx) { fc_handles_each(FC_KIND_STREAM, destroy_stream_of, ctx); }

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuStreamCreate", &r);
  if (!ctx) return r;
  if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate", "phStream is NULL or Flags 0x%x unknown", Flags);
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  s->kind = FC_KIND_STREAM;
  s->ctx = ctx;
  s->flags = Flags;
  pthread_cond_init(&s->wake, NULL);
  if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
    pthread_cond_destroy(&s->wake);
    free(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&fc_lock);
  fc_handle_add(s);
  s->next_live = fc_streams;
  fc_streams = s;
  pthread_mutex_unlock(&fc_lock);
  *phStream = s;
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuStreamDestroy", &r);
  if (!ctx) return r;
  if (is_default_stream(hStream))
    return fc_reject(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy", "the default stream cannot be destroyed");
  if (!fc_stream_check(hStream, ctx, "cuStreamDestroy", &r)) return r;
  /* The driver returns at once and finishes the stream's work later; here
   * the worker finishes it first, then ends. */
  stream_destroy(hStream);
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuStreamSynchronize", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuStreamSynchronize", &r)) return r;
  fc_stream_drain(hStream, ctx);
  pthread_mutex_lock(&fc_lock);
  r = ctx->sticky; /* a fault in the work just waited for surfaces here */
  pthread_mutex_unlock(&fc_lock);
  return r;
}

CUresult cuCtxSynchronize(void) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuCtxSynchronize", &r);
  if (!ctx) return r;
  fc_context_drain(ctx);
  pthread_mutex_lock(&fc_lock);
  r = ctx->sticky;
  pthread_mutex_unlock(&fc_lock);
  return r;
}

/* ---- events -------------------------------------------------------------------------------- */

static bool event_ok(CUevent event, const char *call, CUresult *out_result) {
  pthread_mutex_lock(&fc_lock);
  const bool ok = fc_handle_is(event, FC_KIND_EVENT);
  pthread_mutex_unlock(&fc_lock);
  if (!ok) *out_result = fc_reject(CUDA_ERROR_INVALID_HANDLE, call, "%p is not a live event", (void *)event);
  return ok;
}

/* Drop one reference; fc_lock held. */
static void event_unref(struct CUevent_st *e) {
  if (--e->refs == 0) free(e);
}

static void destroy_event_of(void *handle, void *ctx) {
  struct CUevent_st *e = handle;
  pthread_mutex_lock(&fc_lock);
  if (e->ctx == ctx && fc_handle_is(e, FC_KIND_EVENT)) {
    fc_handle_remove(e);
    e->ctx->live_events--;
    event_unref(e);
  }
  pthread_mutex_unlock(&fc_lock);
}

void fc_context_events_destroy(struct CUctx_st *ctx) { fc_handles_each(FC_KIND_EVENT, destroy_event_of, ctx); }

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuEventCreate", &r);
  if (!ctx) return r;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!phEvent || (Flags & ~known) ||
      ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
    return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuEventCreate", "phEvent is NULL or Flags 0x%x invalid", Flags);
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  e->kind = FC_KIND_EVENT;
  e->ctx = ctx;
  e->flags = Flags;
  e->refs = 1;
  pthread_mutex_lock(&fc_lock);
  fc_handle_add(e);
  ctx->live_events++;
  pthread_mutex_unlock(&fc_lock);
  *phEvent = e;
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) {
  CUresult r;
  if (!fc_require_context("cuEventDestroy", &r)) return r;
  if (!event_ok(hEvent, "cuEventDestroy", &r)) return r;
  /* Safe while a record is pending: the event lives until it has run. */
  pthread_mutex_lock(&fc_lock);
  fc_handle_remove(hEvent);
  hEvent->ctx->live_events--;
  event_unref(hEvent);
  pthread_mutex_unlock(&fc_lock);
  return CUDA_SUCCESS;
}

typedef struct event_command_t {
  fc_command_t base;
  struct CUevent_st *event;
  uint64_t generation;
} event_command_t;

static CUresult run_record(fc_command_t *command) {
  event_command_t *c = (event_command_t *)command;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  pthread_mutex_lock(&fc_lock);
  if (c->generation > c->event->completed) {
    c->event->completed = c->generation;
    c->event->when = now;
  }
  event_unref(c->event);
  pthread_cond_broadcast(&fc_done);
  pthread_mutex_unlock(&fc_lock);
  return CUDA_SUCCESS;
}

static CUresult run_wait(fc_command_t *command) {
  event_command_t *c = (event_command_t *)command;
  pthread_mutex_lock(&fc_lock);
  while (c->event->completed < c->generation) pthread_cond_wait(&fc_done, &fc_lock);
  event_unref(c->event);
  pthread_mutex_unlock(&fc_lock);
  return CUDA_SUCCESS;
}

static CUresult enqueue_event_command(CUstream stream, struct CUctx_st *ctx, struct CUevent_st *e, uint64_t generation,
                                      fc_command_fn run) {
  event_command_t *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->base.run = run;
  c->event = e;
  c->generation = generation;
  return fc_stream_enqueue(stream, ctx, &c->base);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuEventRecord", &r);
  if (!ctx) return r;
  if (!event_ok(hEvent, "cuEventRecord", &r) || !fc_stream_check(hStream, ctx, "cuEventRecord", &r)) return r;
  if (hEvent->ctx != ctx)
    return fc_reject(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord",
                     "the event belongs to the context of device %d, the stream to device %d's",
                     hEvent->ctx->device->ordinal, ctx->device->ordinal);
  pthread_mutex_lock(&fc_lock);
  const uint64_t generation = ++hEvent->recorded;
  hEvent->refs++;
  pthread_mutex_unlock(&fc_lock);
  return enqueue_event_command(hStream, ctx, hEvent, generation, run_record);
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuStreamWaitEvent", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuStreamWaitEvent", &r) || !event_ok(hEvent, "cuStreamWaitEvent", &r)) return r;
  if (Flags != 0) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent", "Flags must be 0, got %u", Flags);
  /* The event may belong to another context (device): that is allowed. It
   * waits for the latest record made before this call; none: no wait. */
  pthread_mutex_lock(&fc_lock);
  const uint64_t generation = hEvent->recorded;
  if (generation) hEvent->refs++;
  pthread_mutex_unlock(&fc_lock);
  if (!generation) return CUDA_SUCCESS;
  return enqueue_event_command(hStream, ctx, hEvent, generation, run_wait);
}

CUresult cuEventQuery(CUevent hEvent) {
  CUresult r;
  if (!fc_require_context("cuEventQuery", &r)) return r;
  if (!event_ok(hEvent, "cuEventQuery", &r)) return r;
  pthread_mutex_lock(&fc_lock);
  const bool done = hEvent->completed >= hEvent->recorded;
  pthread_mutex_unlock(&fc_lock);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
  CUresult r;
  if (!fc_require_context("cuEventSynchronize", &r)) return r;
  if (!event_ok(hEvent, "cuEventSynchronize", &r)) return r;
  pthread_mutex_lock(&fc_lock);
  const uint64_t target = hEvent->recorded;
  while (hEvent->completed < target) pthread_cond_wait(&fc_done, &fc_lock);
  r = hEvent->ctx->sticky;
  pthread_mutex_unlock(&fc_lock);
  return r;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
  CUresult r;
  if (!fc_require_context("cuEventElapsedTime", &r)) return r;
  if (!event_ok(hStart, "cuEventElapsedTime", &r) || !event_ok(hEnd, "cuEventElapsedTime", &r)) return r;
  if (!pMilliseconds) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuEventElapsedTime", "pMilliseconds is NULL");
  if ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING)
    return fc_reject(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime", "an event was created with CU_EVENT_DISABLE_TIMING");
  pthread_mutex_lock(&fc_lock);
  const bool recorded = hStart->recorded && hEnd->recorded;
  const bool done = hStart->completed >= hStart->recorded && hEnd->completed >= hEnd->recorded;
  const double ms = (double)(hEnd->when.tv_sec - hStart->when.tv_sec) * 1e3 +
                    (double)(hEnd->when.tv_nsec - hStart->when.tv_nsec) / 1e6;
  pthread_mutex_unlock(&fc_lock);
  if (!recorded)
    return fc_reject(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime", "an event was never recorded");
  if (!done) return CUDA_ERROR_NOT_READY; /* not a misuse: the caller waits and asks again */
  *pMilliseconds = (float)ms;
  return CUDA_SUCCESS;
}

/* ---- scratch addition: host functions in stream order ---- */

typedef struct host_fn_command_t {
  fc_command_t base;
  CUhostFn fn;
  void *data;
} host_fn_command_t;

static CUresult run_host_fn(fc_command_t *command) {
  host_fn_command_t *c = (host_fn_command_t *)command;
  c->fn(c->data);
  return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
  CUresult r;
  struct CUctx_st *ctx = fc_require_context("cuLaunchHostFunc", &r);
  if (!ctx) return r;
  if (!fc_stream_check(hStream, ctx, "cuLaunchHostFunc", &r)) return r;
  if (!fn) return fc_reject(CUDA_ERROR_INVALID_VALUE, "cuLaunchHostFunc", "fn is NULL");
  host_fn_command_t *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->base.run = run_host_fn;
  c->fn = fn;
  c->data = userData;
  return fc_stream_enqueue(hStream, ctx, &c->base);
}
