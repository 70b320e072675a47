/* backends/cpu/queue.c: asynchronous CPU queues (a command ring consumed by one worker thread each), events and transfers. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/sync.h"

/* Commands in flight per queue before a producer waits for the worker. Slots
 * are touched only when used, so a quiet queue costs little memory. */
#define KILN_CPU_RING_SLOTS 1024u

typedef enum cmd_kind_t {
  CMD_OP,
  CMD_MEMCPY, /* write, read and buffer copy alike */
  CMD_FILL,
  CMD_RECORD,
  CMD_WAIT,
  CMD_STOP,
} cmd_kind_t;

typedef struct cmd_t {
  cmd_kind_t kind;
  kiln_cpu_kernel_fn kernel; /* CMD_OP */
  union {
    kiln_op_t op;
    struct {
      void *dst;
      const void *src;
      size_t size;
    } copy;
    struct {
      void *dst;
      size_t size;
      uint32_t pattern;
      uint32_t pattern_size;
    } fill;
    kiln_backend_event_t *event;
  } u;
} cmd_t;

struct kiln_backend_queue_t {
  kiln_backend_device_t *device;
  pthread_t worker;
  cmd_t *ring;

  /* Producers (any thread) take turns; cached_head spares them a read of the
   * worker's cache line on every enqueue. */
  pthread_mutex_t producer_lock;
  uint32_t cached_head;

  /* Commands enqueued so far (written by producers, read by the worker). */
  _Alignas(64) _Atomic uint32_t tail;
  _Atomic uint32_t tail_sleepers; /* the worker, when it sleeps */
  /* Commands completed so far (written by the worker). */
  _Alignas(64) _Atomic uint32_t head;
  /* Threads asleep until head reaches a target (finish, blocking transfers,
   * a producer facing a full ring), and the smallest target among them: the
   * worker makes the wake-up system call only when head reaches it, not on
   * every command. Sleepers sleep on wake_gen, which the worker bumps (under
   * wait_lock, after resetting wake_at) before it wakes them; each woken
   * sleeper registers its target again. */
  _Atomic uint32_t head_sleepers;
  /* Who runs commands: the worker, or a thread in a blocking read that runs
   * a short pending tail itself (run_pending_here); 1 while one of them is. */
  _Atomic uint32_t consuming;
  _Atomic uint32_t wake_at;
  _Atomic uint32_t wake_gen;
  pthread_mutex_t wait_lock;

  /* The first asynchronous error since the last finish. */
  _Alignas(64) pthread_mutex_t error_lock;
  kiln_status_t error;
  char error_message[512];
};

/* ---- events ------------------------------------------------------------------ */

static void event_unref(kiln_backend_event_t *event) {
  if (event && atomic_fetch_sub(&event->refs, 1) == 1) free(event);
}

static void event_signal(kiln_backend_event_t *event) {
  event->ns = kiln_cpu_now_ns();
  atomic_store(&event->done, 1);
  kiln_cpu_wake(&event->done, &event->sleepers);
}

static void event_block(kiln_backend_event_t *event) {
  kiln_cpu_wait_change(&event->done, 0, &event->sleepers);
}

/* ---- the worker -------------------------------------------------------------- */

/* Record the first asynchronous error for queue_finish (worker side). The
 * kernels themselves cannot fail once enqueued (op_run checked them, and
 * they fall back to allocation-free paths when memory is short), so only a
 * broken command reaches this. */
__attribute__((format(printf, 3, 4))) static void queue_fail(kiln_backend_queue_t *q, kiln_status_t status,
                                                             const char *fmt, ...) {
  pthread_mutex_lock(&q->error_lock);
  if (q->error == KILN_OK) {
    q->error = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->error_message, sizeof q->error_message, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&q->error_lock);
}

static void fill_pattern(const cmd_t *c) {
  char *dst = c->u.fill.dst;
  const size_t size = c->u.fill.size;
  switch (c->u.fill.pattern_size) {
  case 1: memset(dst, (int)(c->u.fill.pattern & 0xff), size); break;
  case 2: {
    uint16_t v = (uint16_t)c->u.fill.pattern;
    for (size_t i = 0; i + 2 <= size; i += 2) memcpy(dst + i, &v, 2);
    break;
  }
  default: {
    uint32_t v = c->u.fill.pattern;
    for (size_t i = 0; i + 4 <= size; i += 4) memcpy(dst + i, &v, 4);
    break;
  }
  }
}

/* Copies and fills this large are split over the device's thread pool: one core
 * cannot keep enough cache misses in flight to reach the memory bandwidth,
 * and the page faults of memory touched for the first time (a fresh buffer)
 * are taken on every core at once. */
#define KILN_CPU_PARALLEL_COPY_BYTES ((size_t)2 << 20)
/* Each thread's share starts on a multiple of this. */
#define KILN_CPU_COPY_BLOCK ((size_t)64 << 10)

typedef struct copy_job_t {
  const cmd_t *cmd;
} copy_job_t;

static void copy_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const cmd_t *c = ((const copy_job_t *)ctx)->cmd;
  const size_t lo = (size_t)begin * KILN_CPU_COPY_BLOCK;
  size_t hi = (size_t)end * KILN_CPU_COPY_BLOCK;
  if (hi > c->u.copy.size) hi = c->u.copy.size;
  if (lo < hi) memcpy((char *)c->u.copy.dst + lo, (const char *)c->u.copy.src + lo, hi - lo);
}

static void run_memcpy(kiln_backend_queue_t *q, const cmd_t *c) {
  const size_t size = c->u.copy.size;
  if (size == 0) return;
  const uintptr_t d = (uintptr_t)c->u.copy.dst, s = (uintptr_t)c->u.copy.src;
  const bool overlap = d < s + size && s < d + size;
  if (overlap || size < KILN_CPU_PARALLEL_COPY_BYTES || q->device->par.threads < 2) {
    memmove(c->u.copy.dst, c->u.copy.src, size);
    return;
  }
  copy_job_t job = {c};
  const int64_t blocks = (int64_t)((size + KILN_CPU_COPY_BLOCK - 1) / KILN_CPU_COPY_BLOCK);
  kiln_cpu_parallel_for(&q->device->par, blocks, (int64_t)(KILN_CPU_PARALLEL_COPY_BYTES / 2 / KILN_CPU_COPY_BLOCK),
                        copy_task, &job);
}

static void fill_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const cmd_t *c = ((const copy_job_t *)ctx)->cmd;
  cmd_t part = *c;
  const size_t lo = (size_t)begin * KILN_CPU_COPY_BLOCK;
  size_t hi = (size_t)end * KILN_CPU_COPY_BLOCK;
  if (hi > c->u.fill.size) hi = c->u.fill.size;
  if (lo >= hi) return;
  part.u.fill.dst = (char *)c->u.fill.dst + lo;
  part.u.fill.size = hi - lo;
  fill_pattern(&part);
}

static void run_fill(kiln_backend_queue_t *q, const cmd_t *c) {
  const size_t size = c->u.fill.size;
  if (size < KILN_CPU_PARALLEL_COPY_BYTES || q->device->par.threads < 2) {
    fill_pattern(c);
    return;
  }
  /* Blocks are multiples of 4 bytes, so every share starts on a whole pattern. */
  copy_job_t job = {c};
  const int64_t blocks = (int64_t)((size + KILN_CPU_COPY_BLOCK - 1) / KILN_CPU_COPY_BLOCK);
  kiln_cpu_parallel_for(&q->device->par, blocks, (int64_t)(KILN_CPU_PARALLEL_COPY_BYTES / 2 / KILN_CPU_COPY_BLOCK),
                        fill_task, &job);
}

/* Element 0 of a view. */
static void *view_ptr(const kiln_view_t *view) {
  return (char *)view->buffer->data + view->offset * kiln_backend_dtype_size(view->dtype);
}

static void run_op(kiln_backend_queue_t *q, const cmd_t *c) {
  const kiln_op_t *op = &c->u.op;
  const void *in[KILN_KOP_MAX_IN] = {NULL, NULL, NULL, NULL};
  for (int i = 0; i < op->n_in && i < KILN_KOP_MAX_IN; i++)
    if (op->in[i].buffer) in[i] = view_ptr(&op->in[i]);
  c->kernel(&q->device->par, op, view_ptr(&op->out), in);
}

/* Returns false on CMD_STOP. */
static bool execute(kiln_backend_queue_t *q, cmd_t *c) {
  switch (c->kind) {
  case CMD_OP: run_op(q, c); break;
  case CMD_MEMCPY: run_memcpy(q, c); break;
  case CMD_FILL: run_fill(q, c); break;
  case CMD_RECORD:
    event_signal(c->u.event);
    event_unref(c->u.event);
    break;
  case CMD_WAIT:
    event_block(c->u.event);
    event_unref(c->u.event);
    break;
  case CMD_STOP: return false;
  default:
    queue_fail(q, KILN_INTERNAL, "cpu:%zu queue: unknown command kind %d in the ring (a bug in kiln; please report it)",
               q->device->index, (int)c->kind);
    break;
  }
  return true;
}

/* Whether head has reached `target` (both count commands, modulo 2^32). */
static inline bool head_reached(uint32_t head, uint32_t target) { return (int32_t)(head - target) >= 0; }

/* The worker's half: wake the sleepers once head reaches the smallest target. */
static inline void wake_head_sleepers(kiln_backend_queue_t *q, uint32_t head) {
  if (atomic_load(&q->head_sleepers) == 0 || !head_reached(head, atomic_load(&q->wake_at))) return;
  pthread_mutex_lock(&q->wait_lock);
  const bool wake = atomic_load(&q->head_sleepers) != 0 && head_reached(head, atomic_load(&q->wake_at));
  if (wake) {
    /* No target until the woken sleepers register theirs again. */
    atomic_store(&q->wake_at, head + INT32_MAX);
    atomic_fetch_add(&q->wake_gen, 1);
  }
  pthread_mutex_unlock(&q->wait_lock);
  if (wake) kiln_cpu_futex_wake_all(&q->wake_gen);
}

/* Block until head reaches `target`. With `spin`, first spin for a while
 * (the wait may be short); without, sleep at once (a producer facing a full
 * ring waits for hundreds of commands, and spinning would take a core from
 * the worker and the thread pool on a small machine). */
static void wait_head(kiln_backend_queue_t *q, uint32_t target, bool spin) {
  uint32_t head = atomic_load_explicit(&q->head, memory_order_acquire);
  if (head_reached(head, target)) return;
  if (spin) {
    const uint64_t start = kiln_cpu_now_ns();
    for (unsigned i = 1; !head_reached(head, target); i++) {
      kiln_cpu_relax();
      head = atomic_load_explicit(&q->head, memory_order_acquire);
      if ((i & 63) == 0 && !kiln_cpu_spin_step(start)) break;
    }
    if (head_reached(head, target)) return;
  }
  pthread_mutex_lock(&q->wait_lock);
  for (;;) {
    /* Register (seq_cst), then look at head again: either this sees the
     * worker's latest head or the worker sees this registration. */
    if (atomic_fetch_add(&q->head_sleepers, 1) == 0 || !head_reached(target, atomic_load(&q->wake_at)))
      atomic_store(&q->wake_at, target);
    const uint32_t gen = atomic_load(&q->wake_gen);
    head = atomic_load(&q->head);
    if (head_reached(head, target)) {
      atomic_fetch_sub(&q->head_sleepers, 1);
      break;
    }
    pthread_mutex_unlock(&q->wait_lock);
    kiln_cpu_futex_wait(&q->wake_gen, gen);
    pthread_mutex_lock(&q->wait_lock);
    atomic_fetch_sub(&q->head_sleepers, 1);
  }
  pthread_mutex_unlock(&q->wait_lock);
}

static void *worker_main(void *arg) {
  kiln_backend_queue_t *q = arg;
  for (;;) {
    uint32_t head = atomic_load_explicit(&q->head, memory_order_acquire);
    uint32_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    if (tail == head) {
      kiln_cpu_wait_change(&q->tail, head, &q->tail_sleepers);
      continue;
    }
    if (atomic_exchange(&q->consuming, 1) != 0) {
      /* A reading thread runs a few commands itself: a moment. */
      kiln_cpu_relax();
      continue;
    }
    head = atomic_load_explicit(&q->head, memory_order_acquire);
    tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    bool more = true;
    while (head != tail && more) {
      more = execute(q, &q->ring[head & (KILN_CPU_RING_SLOTS - 1)]);
      head++;
      atomic_store(&q->head, head);
      wake_head_sleepers(q, head);
    }
    atomic_store(&q->consuming, 0);
    if (!more) return NULL;
  }
}

/* ---- producers --------------------------------------------------------------- */

/* Reserve the next slot (taking the producer lock) and return it; the caller
 * fills it and calls publish. Blocks while the ring is full. */
static cmd_t *reserve(kiln_backend_queue_t *q, uint32_t *out_seq) {
  pthread_mutex_lock(&q->producer_lock);
  uint32_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
  if (tail - q->cached_head >= KILN_CPU_RING_SLOTS) {
    q->cached_head = atomic_load_explicit(&q->head, memory_order_acquire);
    if (tail - q->cached_head >= KILN_CPU_RING_SLOTS) {
      /* Full: sleep until the worker has drained half the ring, so that the
       * producer wakes once per KILN_CPU_RING_SLOTS / 2 commands instead of
       * taking turns with the worker command by command. */
      wait_head(q, tail - KILN_CPU_RING_SLOTS / 2, false);
      q->cached_head = atomic_load_explicit(&q->head, memory_order_acquire);
    }
  }
  *out_seq = tail;
  return &q->ring[tail & (KILN_CPU_RING_SLOTS - 1)];
}

static void publish(kiln_backend_queue_t *q, uint32_t seq) {
  atomic_store(&q->tail, seq + 1);
  kiln_cpu_wake(&q->tail, &q->tail_sleepers);
  pthread_mutex_unlock(&q->producer_lock);
}

/* Block until command `seq` completed. */
static void wait_done(kiln_backend_queue_t *q, uint32_t seq) { wait_head(q, seq + 1, true); }

kiln_status_t kiln_cpu_queue_create(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                                    kiln_backend_queue_t **out_queue) {
  kiln_backend_queue_t *q = aligned_alloc(64, (sizeof *q + 63) / 64 * 64);
  if (!q) goto oom;
  memset(q, 0, sizeof *q);
  q->device = device;
  q->ring = aligned_alloc(64, sizeof(cmd_t) * KILN_CPU_RING_SLOTS);
  if (!q->ring) {
    free(q);
    goto oom;
  }
  pthread_mutex_init(&q->producer_lock, NULL);
  pthread_mutex_init(&q->error_lock, NULL);
  pthread_mutex_init(&q->wait_lock, NULL);
  atomic_init(&q->tail, 0);
  atomic_init(&q->head, 0);
  atomic_init(&q->tail_sleepers, 0);
  atomic_init(&q->head_sleepers, 0);
  atomic_init(&q->wake_at, INT32_MAX);
  atomic_init(&q->wake_gen, 0);
  atomic_init(&q->consuming, 0);

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setaffinity_np(&attr, sizeof device->cpus, &device->cpus);
  int rc = pthread_create(&q->worker, &attr, worker_main, q);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    pthread_mutex_destroy(&q->producer_lock);
    pthread_mutex_destroy(&q->error_lock);
    pthread_mutex_destroy(&q->wait_lock);
    free(q->ring);
    free(q);
    return ctx->host.set_error(KILN_OUT_OF_RESOURCES,
                                   "cannot start the worker thread of a queue on cpu:%zu (pthread_create: %s); "
                                   "release unused queues or raise the process's thread limit",
                                   device->index, strerror(rc));
  }
  *out_queue = q;
  return KILN_OK;
oom:
  return ctx->host.set_error(KILN_OUT_OF_MEMORY,
                                 "cannot allocate a queue on cpu:%zu (%zu bytes for its command ring); free memory",
                                 device->index, sizeof(cmd_t) * KILN_CPU_RING_SLOTS);
}

void kiln_cpu_queue_destroy(kiln_backend_context_t *ctx, kiln_backend_queue_t *q) {
  if (!q) return;
  uint32_t seq;
  cmd_t *c = reserve(q, &seq);
  c->kind = CMD_STOP;
  publish(q, seq);
  pthread_join(q->worker, NULL);
  pthread_mutex_destroy(&q->producer_lock);
  pthread_mutex_destroy(&q->error_lock);
  pthread_mutex_destroy(&q->wait_lock);
  free(q->ring);
  free(q);
}

kiln_status_t kiln_cpu_queue_finish(kiln_backend_context_t *ctx, kiln_backend_queue_t *q) {
  wait_done(q, atomic_load(&q->tail) - 1);
  pthread_mutex_lock(&q->error_lock);
  kiln_status_t status = q->error;
  char message[sizeof q->error_message];
  memcpy(message, q->error_message, sizeof message);
  q->error = KILN_OK;
  q->error_message[0] = '\0';
  pthread_mutex_unlock(&q->error_lock);
  if (status != KILN_OK) return ctx->host.set_error(status, "%s", message);
  return KILN_OK;
}

kiln_status_t kiln_cpu_queue_record(kiln_backend_context_t *ctx, kiln_backend_queue_t *q,
                                    kiln_backend_event_t **out_event) {
  kiln_backend_event_t *event = malloc(sizeof *event);
  if (!event)
    return ctx->host.set_error(KILN_OUT_OF_MEMORY, "cannot allocate an event (%zu bytes) on cpu:%zu",
                                   sizeof *event, q->device->index);
  atomic_init(&event->refs, 2); /* the caller's and the queue's */
  atomic_init(&event->done, 0);
  atomic_init(&event->sleepers, 0);
  event->ns = 0;
  uint32_t seq;
  cmd_t *c = reserve(q, &seq);
  c->kind = CMD_RECORD;
  c->u.event = event;
  publish(q, seq);
  *out_event = event;
  return KILN_OK;
}

kiln_status_t kiln_cpu_queue_wait(kiln_backend_context_t *ctx, kiln_backend_queue_t *q, kiln_backend_event_t *event) {
  /* Already reached: nothing to order. */
  if (atomic_load_explicit(&event->done, memory_order_acquire)) return KILN_OK;
  atomic_fetch_add(&event->refs, 1);
  uint32_t seq;
  cmd_t *c = reserve(q, &seq);
  c->kind = CMD_WAIT;
  c->u.event = event;
  publish(q, seq);
  return KILN_OK;
}

kiln_status_t kiln_cpu_event_wait(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  event_block(event);
  return KILN_OK;
}

kiln_status_t kiln_cpu_event_query(kiln_backend_context_t *ctx, kiln_backend_event_t *event) {
  return atomic_load_explicit(&event->done, memory_order_acquire) ? KILN_OK : KILN_NOT_READY;
}

kiln_status_t kiln_cpu_event_elapsed(kiln_backend_context_t *ctx, kiln_backend_event_t *start, kiln_backend_event_t *end,
                                     double *out_ms) {
  if (!atomic_load_explicit(&start->done, memory_order_acquire) ||
      !atomic_load_explicit(&end->done, memory_order_acquire))
    return ctx->host.set_error(KILN_NOT_READY,
                                   "event_elapsed: the %s event has not completed yet; wait on both events first",
                                   atomic_load(&start->done) ? "end" : "start");
  *out_ms = ((double)end->ns - (double)start->ns) / 1e6;
  return KILN_OK;
}

void kiln_cpu_event_release(kiln_backend_context_t *ctx, kiln_backend_event_t *event) { event_unref(event); }

/* ---- transfers --------------------------------------------------------------- */

/* A blocking copy this small is done by the calling thread itself, after
 * running what little is pending (run_pending_here): the worker would add a
 * hand-off each way (two wake-ups on a busy machine) to a memcpy of a few
 * bytes. The producer lock keeps the copy in the queue's order: nothing is
 * enqueued meanwhile. */
#define KILN_CPU_INLINE_COPY_BYTES 4096u

/* At most this many pending commands are run by a reading thread itself. */
#define KILN_CPU_INLINE_PENDING 8u

/* With the producer lock held: run what is pending on this thread when it
 * is short and holds only ops, copies, fills and event records (never a
 * wait on another queue, never the stop), if the worker is not running
 * commands right now. True when the queue is then empty. */
static bool run_pending_here(kiln_backend_queue_t *q, uint32_t tail) {
  uint32_t head = atomic_load_explicit(&q->head, memory_order_acquire);
  if (head == tail) return true;
  if (tail - head > KILN_CPU_INLINE_PENDING || atomic_exchange(&q->consuming, 1) != 0) return false;
  head = atomic_load_explicit(&q->head, memory_order_acquire);
  bool ok = true;
  for (uint32_t i = head; i != tail && ok; i++) {
    const cmd_kind_t kind = q->ring[i & (KILN_CPU_RING_SLOTS - 1)].kind;
    ok = kind == CMD_OP || kind == CMD_MEMCPY || kind == CMD_FILL || kind == CMD_RECORD;
  }
  for (; ok && head != tail; head++) {
    execute(q, &q->ring[head & (KILN_CPU_RING_SLOTS - 1)]);
    atomic_store(&q->head, head + 1);
    wake_head_sleepers(q, head + 1);
  }
  atomic_store(&q->consuming, 0);
  return ok;
}

static kiln_status_t enqueue_memcpy(kiln_backend_queue_t *q, void *dst, const void *src, size_t size, bool blocking) {
  if (blocking && size <= KILN_CPU_INLINE_COPY_BYTES) {
    pthread_mutex_lock(&q->producer_lock);
    if (run_pending_here(q, atomic_load_explicit(&q->tail, memory_order_relaxed))) {
      memcpy(dst, src, size);
      pthread_mutex_unlock(&q->producer_lock);
      return KILN_OK;
    }
    pthread_mutex_unlock(&q->producer_lock);
  }
  uint32_t seq;
  cmd_t *c = reserve(q, &seq);
  c->kind = CMD_MEMCPY;
  c->u.copy.dst = dst;
  c->u.copy.src = src;
  c->u.copy.size = size;
  publish(q, seq);
  if (blocking) wait_done(q, seq);
  return KILN_OK;
}

kiln_status_t kiln_cpu_buffer_write(kiln_backend_context_t *ctx, kiln_backend_queue_t *q, kiln_backend_buffer_t *buffer,
                                    size_t offset, const void *host, size_t size, bool blocking) {
  return enqueue_memcpy(q, (char *)buffer->data + offset, host, size, blocking);
}

kiln_status_t kiln_cpu_buffer_read(kiln_backend_context_t *ctx, kiln_backend_queue_t *q, kiln_backend_buffer_t *buffer,
                                   size_t offset, void *host, size_t size, bool blocking) {
  return enqueue_memcpy(q, host, (const char *)buffer->data + offset, size, blocking);
}

kiln_status_t kiln_cpu_buffer_copy(kiln_backend_context_t *ctx, kiln_backend_queue_t *q, kiln_backend_buffer_t *src,
                                   size_t src_offset, kiln_backend_buffer_t *dst, size_t dst_offset, size_t size) {
  return enqueue_memcpy(q, (char *)dst->data + dst_offset, (const char *)src->data + src_offset, size, false);
}

kiln_status_t kiln_cpu_buffer_fill(kiln_backend_context_t *ctx, kiln_backend_queue_t *q, kiln_backend_buffer_t *buffer,
                                   size_t offset, size_t size, const void *pattern, size_t pattern_size) {
  uint32_t value = 0;
  if (pattern_size == 1) value = *(const uint8_t *)pattern;
  else if (pattern_size == 2) value = *(const uint16_t *)pattern;
  else memcpy(&value, pattern, 4);
  uint32_t seq;
  cmd_t *c = reserve(q, &seq);
  c->kind = CMD_FILL;
  c->u.fill.dst = (char *)buffer->data + offset;
  c->u.fill.size = size;
  c->u.fill.pattern = value;
  c->u.fill.pattern_size = (uint32_t)pattern_size;
  publish(q, seq);
  return KILN_OK;
}

kiln_status_t kiln_cpu_op_run(kiln_backend_context_t *ctx, kiln_backend_queue_t *q, const kiln_op_entry_t *entry,
                              const kiln_op_t *op) {
  uint32_t seq;
  cmd_t *c = reserve(q, &seq);
  c->kind = CMD_OP;
  c->kernel = ((const kiln_cpu_kernel_t *)entry->impl)->fn;
  /* Copy only the views in use: most ops are small and the ring slot crosses
   * to the worker's core. */
  memcpy(&c->u.op, op, offsetof(kiln_op_t, in));
  for (int i = 0; i < op->n_in && i < KILN_KOP_MAX_IN; i++) c->u.op.in[i] = op->in[i];
  c->u.op.u = op->u;
  publish(q, seq);
  return KILN_OK;
}
