/* tests/cuda/emulator/fiber.c: a block of CUDA threads as cooperative fibers: __syncthreads and warp collectives are real synchronisation points, and what a GPU leaves undefined about them is reported as a fault. */
/*
 * One OS thread (a stream's worker) runs a grid block after block; within a
 * block, each CUDA thread is a fiber with its own stack. A fiber runs until
 * it reaches __syncthreads, a warp collective (shuffle, vote, __syncwarp),
 * or the end of the kernel; the scheduler then runs the next runnable fiber,
 * and makes the waiting ones runnable again only when everyone they wait for
 * has arrived. Nothing is skipped: a thread that reads shared memory another
 * thread writes after the barrier it forgot reads the old value here too.
 *
 * Stricter than a GPU, like compute-sanitizer's synccheck: the launch fails
 * (CUDA_ERROR_LAUNCH_FAILED, with the threads named) when threads of a block
 * wait at different __syncthreads, when some wait at one while others have
 * returned, when a warp collective's mask names a lane that exited, does not
 * exist or is elsewhere, when lanes of one mask disagree about the
 * collective, when a shuffle reads a lane outside its mask, and on deadlock.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda.h"

/* x86-64 switches fibers with the few instructions below; elsewhere (and
 * with CET shadow stacks, which a hand-made switch would break, or when
 * FAKECUDA_UCONTEXT is defined) glibc's ucontext does it, about thirty
 * times slower (a system call per switch). */
#if defined(__x86_64__) && !(defined(__CET__) && (__CET__ & 2)) && !defined(FAKECUDA_UCONTEXT)
#define FC_ASM_SWITCH 1
#else
#define FC_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define FC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FC_ASAN 1
#endif
#endif
#ifndef FC_ASAN
#define FC_ASAN 0
#endif
#if FC_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define FC_TSAN 1
#include <sanitizer/tsan_interface.h>
#else
#define FC_TSAN 0
#endif

#define FC_FIBER_STACK ((size_t)256 << 10)

enum { FIBER_RUNNABLE, FIBER_BARRIER, FIBER_WARP, FIBER_DONE, FIBER_FAULT };
enum { COLLECTIVE_SHFL, COLLECTIVE_VOTE };

typedef struct fiber_t {
#if FC_ASM_SWITCH
  void *sp;
#else
  ucontext_t context;
#endif
  unsigned char *stack; /* the usable stack; a guard page lies below it */
  fakecuda_dim3 idx;
  unsigned tid;
  int state;
  /* At a barrier: where, and its reduction. */
  const char *bar_file;
  int bar_line, bar_op, bar_pred, bar_result;
  /* In a warp collective: which one, with what. */
  unsigned long long warp_round; /* collectives this lane has finished */
  unsigned coll_mask;
  int coll_kind, coll_mode, coll_arg, coll_width;
#if FC_ASAN
  void *fake_stack;
#endif
#if FC_TSAN
  void *tsan_fiber;
#endif
} fiber_t;

typedef struct runner_t {
  fiber_t *fibers;
  unsigned capacity; /* fibers with a stack */
  unsigned count;    /* threads of the block running */
  fiber_t *current;
#if FC_ASM_SWITCH
  void *sp;
#else
  ucontext_t context;
#endif
#if FC_ASAN
  void *fake_stack;
  const void *stack_bottom;
  size_t stack_size;
#endif
#if FC_TSAN
  void *tsan_fiber;
#endif
  const fakecuda_kernel_t *kernel;
  void *const *params;
  fakecuda_dim3 block_idx, block_dim, grid_dim;
  unsigned *queue; /* runnable fibers, a ring of `capacity` */
  unsigned head, queued;
  unsigned alive, at_barrier;
  /* Values deposited in warp collectives, double-buffered by round: a lane
   * can be at most one collective ahead of a lane of its mask. */
  uint64_t slots[FC_MAX_THREADS_PER_BLOCK / FC_WARP][2][FC_WARP];
  CUresult fault;
  char message[512];
} runner_t;

static _Thread_local runner_t *runner;
static pthread_key_t runner_key;
static pthread_once_t runner_once = PTHREAD_ONCE_INIT;

/* ---- switching ------------------------------------------------------------------------------ */

__attribute__((visibility("hidden"))) void fakecuda__fiber_main(void);

#if FC_ASM_SWITCH
/* fakecuda__switch(save, to): push the callee-saved registers and the SSE
 * and x87 control words, store the stack pointer in *save, load `to`, pop
 * the same from there, return into the other fiber. A fresh fiber's stack
 * holds a frame that returns into fakecuda__fiber_entry. */
__attribute__((visibility("hidden"))) void fakecuda__switch(void **save, void *to);
__attribute__((visibility("hidden"))) void fakecuda__fiber_entry(void);
__asm__(".text\n"
        ".globl fakecuda__switch\n"
        ".hidden fakecuda__switch\n"
        ".type fakecuda__switch, @function\n"
        "fakecuda__switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size fakecuda__switch, .-fakecuda__switch\n"
        ".globl fakecuda__fiber_entry\n"
        ".hidden fakecuda__fiber_entry\n"
        ".type fakecuda__fiber_entry, @function\n"
        "fakecuda__fiber_entry:\n"
        "  call fakecuda__fiber_main\n"
        "  ud2\n"
        ".size fakecuda__fiber_entry, .-fakecuda__fiber_entry\n");

static void prepare(fiber_t *f) {
  /* After the switch pops six registers and the control words and returns
   * into fakecuda__fiber_entry, the stack pointer is 16-byte aligned, as the
   * call there needs. */
  uintptr_t top = ((uintptr_t)f->stack + FC_FIBER_STACK) & ~(uintptr_t)15;
  uintptr_t *sp = (uintptr_t *)top;
  *--sp = (uintptr_t)fakecuda__fiber_entry;
  for (int i = 0; i < 6; i++) *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
  /* The default MXCSR (exceptions masked, round to nearest), then the
   * default x87 control word. */
  const uint32_t control[2] = {0x1f80u, 0x037fu};
  *--sp = 0;
  memcpy(sp, control, sizeof control);
  f->sp = sp;
}
#define FC_SWITCH(from, to) fakecuda__switch(&(from)->sp, (to)->sp)
#else
static void prepare(fiber_t *f) {
  getcontext(&f->context);
  f->context.uc_stack.ss_sp = f->stack;
  f->context.uc_stack.ss_size = FC_FIBER_STACK;
  f->context.uc_link = NULL;
  makecontext(&f->context, fakecuda__fiber_main, 0);
}
#define FC_SWITCH(from, to) swapcontext(&(from)->context, &(to)->context)
#endif

/* Scheduler -> fiber; returns when the fiber yields. */
static void enter_fiber(runner_t *r, fiber_t *f) {
  r->current = f;
#if FC_ASAN
  __sanitizer_start_switch_fiber(&r->fake_stack, f->stack, FC_FIBER_STACK);
#endif
#if FC_TSAN
  __tsan_switch_to_fiber(f->tsan_fiber, 0);
#endif
  FC_SWITCH(r, f);
#if FC_ASAN
  __sanitizer_finish_switch_fiber(r->fake_stack, NULL, NULL);
#endif
}

/* Fiber -> scheduler; returns when the scheduler runs the fiber again (never
 * for a finished or faulted one). */
static void leave_fiber(runner_t *r, fiber_t *f, bool finished) {
#if FC_ASAN
  __sanitizer_start_switch_fiber(finished ? NULL : &f->fake_stack, r->stack_bottom, r->stack_size);
#else
  (void)finished;
#endif
#if FC_TSAN
  __tsan_switch_to_fiber(r->tsan_fiber, 0);
#endif
  FC_SWITCH(f, r);
#if FC_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, NULL, NULL);
#endif
}

void fakecuda__fiber_main(void) {
  runner_t *r = runner;
  fiber_t *f = r->current;
#if FC_ASAN
  __sanitizer_finish_switch_fiber(NULL, &r->stack_bottom, &r->stack_size);
#endif
  r->kernel->invoke(r->params);
  f->state = FIBER_DONE;
  leave_fiber(r, f, true);
  abort(); /* a finished fiber is never resumed */
}

/* ---- runners: one per OS thread that runs kernels --------------------------------------------- */

static void runner_free(void *arg) {
  runner_t *r = arg;
  if (!r) return;
  for (unsigned i = 0; i < r->capacity; i++)
    munmap(r->fibers[i].stack - sysconf(_SC_PAGESIZE), FC_FIBER_STACK + (size_t)sysconf(_SC_PAGESIZE));
  free(r->fibers);
  free(r->queue);
  free(r);
}

static void runner_key_create(void) { pthread_key_create(&runner_key, runner_free); }

static runner_t *runner_get(void) {
  if (runner) return runner;
  pthread_once(&runner_once, runner_key_create);
  runner_t *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->fibers = calloc(FC_MAX_THREADS_PER_BLOCK, sizeof *r->fibers);
  r->queue = calloc(FC_MAX_THREADS_PER_BLOCK, sizeof *r->queue);
  if (!r->fibers || !r->queue) {
    runner_free(r);
    return NULL;
  }
  pthread_setspecific(runner_key, r);
  runner = r;
  return r;
}

/* Stacks for n fibers, each with a guard page below it. */
static bool runner_reserve(runner_t *r, unsigned n) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  while (r->capacity < n) {
    unsigned char *base = mmap(NULL, FC_FIBER_STACK + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) return false;
    if (mprotect(base, page, PROT_NONE) != 0) {
      munmap(base, FC_FIBER_STACK + page);
      return false;
    }
    r->fibers[r->capacity++].stack = base + page;
  }
  return true;
}

/* ---- the block scheduler ------------------------------------------------------------------------- */

static void push(runner_t *r, unsigned tid) {
  r->queue[(r->head + r->queued++) % r->capacity] = tid;
  r->fibers[tid].state = FIBER_RUNNABLE;
}

static void fail(runner_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(runner_t *r, const char *fmt, ...) {
  if (r->fault != CUDA_SUCCESS) return;
  r->fault = CUDA_ERROR_LAUNCH_FAILED;
  va_list args;
  va_start(args, fmt);
  int n = snprintf(r->message, sizeof r->message, "block (%u,%u,%u): ", r->block_idx.x, r->block_idx.y,
                   r->block_idx.z);
  if (n > 0 && (size_t)n < sizeof r->message) vsnprintf(r->message + n, sizeof r->message - (size_t)n, fmt, args);
  va_end(args);
}

static void release_barrier(runner_t *r) {
  const fiber_t *first = &r->fibers[0];
  int count = 0;
  for (unsigned t = 0; t < r->count; t++) {
    const fiber_t *f = &r->fibers[t];
    if (f->bar_line != first->bar_line || strcmp(f->bar_file, first->bar_file) != 0 || f->bar_op != first->bar_op) {
      fail(r, "threads wait at different __syncthreads: thread %u at %s:%d, thread %u at %s:%d (divergent barrier)",
           first->tid, first->bar_file, first->bar_line, f->tid, f->bar_file, f->bar_line);
      return;
    }
    count += f->bar_pred;
  }
  const int result = first->bar_op == 1 ? count : first->bar_op == 2 ? count == (int)r->count : count > 0;
  r->at_barrier = 0;
  for (unsigned t = 0; t < r->count; t++) {
    r->fibers[t].bar_result = result;
    push(r, t);
  }
}

static const char *collective_name(int kind) { return kind == COLLECTIVE_SHFL ? "a shuffle" : "a vote/__syncwarp"; }

/* Lane `lane` of warp `warp` arrived at a collective: release the mask's
 * lanes when all have. */
static void warp_arrived(runner_t *r, unsigned warp, unsigned lane) {
  const fiber_t *f = &r->fibers[warp * FC_WARP + lane];
  const unsigned mask = f->coll_mask;
  const unsigned lanes = r->count - warp * FC_WARP < FC_WARP ? r->count - warp * FC_WARP : FC_WARP;
  if (!(mask >> lane & 1u)) {
    fail(r, "thread %u (warp %u lane %u) calls %s with mask 0x%08x, which leaves out the lane itself", f->tid, warp,
         lane, collective_name(f->coll_kind), mask);
    return;
  }
  for (unsigned j = 0; j < FC_WARP; j++) {
    if (!(mask >> j & 1u)) continue;
    if (j >= lanes) {
      fail(r, "thread %u calls %s with mask 0x%08x, naming lane %u, but warp %u has %u thread(s) (block of %u)",
           f->tid, collective_name(f->coll_kind), mask, j, warp, lanes, r->count);
      return;
    }
    const fiber_t *g = &r->fibers[warp * FC_WARP + j];
    if (g->state == FIBER_DONE) {
      fail(r, "thread %u calls %s with mask 0x%08x, naming lane %u (thread %u), which has returned", f->tid,
           collective_name(f->coll_kind), mask, j, g->tid);
      return;
    }
    if (g->state != FIBER_WARP) return; /* not there yet */
    if (g->warp_round != f->warp_round || g->coll_mask != mask || g->coll_kind != f->coll_kind) {
      fail(r, "lanes of warp %u disagree: thread %u is at its collective #%llu (%s, mask 0x%08x), thread %u at #%llu "
           "(%s, mask 0x%08x)",
           warp, f->tid, f->warp_round + 1, collective_name(f->coll_kind), mask, g->tid, g->warp_round + 1,
           collective_name(g->coll_kind), g->coll_mask);
      return;
    }
  }
  for (unsigned j = 0; j < FC_WARP; j++)
    if (mask >> j & 1u) push(r, warp * FC_WARP + j);
}

/* Nothing can run, yet threads wait: say who waits for whom. */
static void deadlock(runner_t *r) {
  for (unsigned t = 0; t < r->count; t++) {
    const fiber_t *f = &r->fibers[t];
    if (f->state != FIBER_WARP) continue;
    const unsigned warp = t / FC_WARP;
    for (unsigned j = 0; j < FC_WARP; j++) {
      if (!(f->coll_mask >> j & 1u)) continue;
      const fiber_t *g = &r->fibers[warp * FC_WARP + j];
      if (g->state == FIBER_BARRIER) {
        fail(r, "deadlock: thread %u waits in %s (mask 0x%08x) for thread %u, which waits at __syncthreads (%s:%d)",
             f->tid, collective_name(f->coll_kind), f->coll_mask, g->tid, g->bar_file, g->bar_line);
        return;
      }
    }
  }
  fail(r, "deadlock: %u thread(s) wait and none can go on", r->alive);
}

static CUresult run_block(runner_t *r, unsigned n) {
  const fakecuda_dim3 b = r->block_dim;
  r->count = n;
  r->head = r->queued = 0;
  r->alive = n;
  r->at_barrier = 0;
  for (unsigned t = 0; t < n; t++) {
    fiber_t *f = &r->fibers[t];
    f->tid = t;
    f->idx = (fakecuda_dim3){t % b.x, t / b.x % b.y, t / (b.x * b.y)};
    f->warp_round = 0;
#if FC_ASAN
    /* Frames a faulted or finished fiber left behind are poisoned. */
    __asan_unpoison_memory_region(f->stack, FC_FIBER_STACK);
#endif
#if FC_TSAN
    f->tsan_fiber = __tsan_create_fiber(0);
#endif
    prepare(f);
    push(r, t);
  }
  while (r->alive > 0 && r->fault == CUDA_SUCCESS) {
    if (r->queued == 0) {
      deadlock(r);
      break;
    }
    const unsigned t = r->queue[r->head];
    r->head = (r->head + 1) % r->capacity;
    r->queued--;
    fiber_t *f = &r->fibers[t];
    enter_fiber(r, f);
    switch (f->state) {
    case FIBER_DONE:
      r->alive--;
      for (unsigned w = 0; w < n && r->at_barrier > 0; w++) {
        const fiber_t *g = &r->fibers[w];
        if (g->state != FIBER_BARRIER) continue;
        fail(r, "thread %u returned while %u thread(s) wait at __syncthreads (thread %u at %s:%d): a barrier not "
             "every thread reaches",
             t, r->at_barrier, g->tid, g->bar_file, g->bar_line);
        break;
      }
      break;
    case FIBER_BARRIER:
      if (r->alive < n) {
        fail(r, "thread %u waits at __syncthreads (%s:%d) after %u thread(s) of the block returned: a barrier not "
             "every thread reaches",
             t, f->bar_file, f->bar_line, n - r->alive);
        break;
      }
      if (++r->at_barrier == r->alive) release_barrier(r);
      break;
    case FIBER_WARP: warp_arrived(r, t / FC_WARP, t % FC_WARP); break;
    default: break; /* FIBER_FAULT: r->fault is set */
    }
  }
#if FC_TSAN
  for (unsigned t = 0; t < n; t++) __tsan_destroy_fiber(r->fibers[t].tsan_fiber);
#endif
  return r->fault;
}

CUresult fc_run_grid(const fakecuda_kernel_t *kernel, void *const *params, fakecuda_dim3 grid, fakecuda_dim3 block,
                     char *out_message, size_t message_size) {
  runner_t *r = runner_get();
  const unsigned n = block.x * block.y * block.z;
  if (!r || !runner_reserve(r, n)) {
    snprintf(out_message, message_size, "no host memory for the stacks of %u fibers", n);
    return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  }
#if FC_TSAN
  r->tsan_fiber = __tsan_get_current_fiber();
#endif
  r->kernel = kernel;
  r->params = params;
  r->grid_dim = grid;
  r->block_dim = block;
  r->fault = CUDA_SUCCESS;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        r->block_idx = (fakecuda_dim3){x, y, z};
        const CUresult result = run_block(r, n);
        atomic_fetch_add(&fc_stat_blocks, 1);
        atomic_fetch_add(&fc_stat_threads, n);
        if (result != CUDA_SUCCESS) {
          snprintf(out_message, message_size, "%s", r->message);
          r->current = NULL;
          return result;
        }
      }
  r->current = NULL;
  return CUDA_SUCCESS;
}

/* ---- what kernel code calls (cuda_shim.h) ------------------------------------------------------- */

static runner_t *in_kernel(const char *what) {
  runner_t *r = runner;
  if (!r || !r->current) {
    fprintf(stderr, "kiln-fakecuda: %s called outside a kernel\n", what);
    abort();
  }
  return r;
}

const fakecuda_dim3 *fakecuda__thread_idx(void) { return &in_kernel("threadIdx")->current->idx; }
const fakecuda_dim3 *fakecuda__block_idx(void) { return &in_kernel("blockIdx")->block_idx; }
const fakecuda_dim3 *fakecuda__block_dim(void) { return &in_kernel("blockDim")->block_dim; }
const fakecuda_dim3 *fakecuda__grid_dim(void) { return &in_kernel("gridDim")->grid_dim; }

int fakecuda__syncthreads(int op, int pred, const char *file, int line) {
  runner_t *r = in_kernel("__syncthreads");
  fiber_t *f = r->current;
  f->state = FIBER_BARRIER;
  f->bar_file = file;
  f->bar_line = line;
  f->bar_op = op;
  f->bar_pred = pred;
  leave_fiber(r, f, false);
  return f->bar_result;
}

/* Deposit value, wait for the mask's lanes, return the fiber. */
static fiber_t *collective(runner_t *r, int kind, unsigned mask, uint64_t value) {
  fiber_t *f = r->current;
  const unsigned lane = f->tid % FC_WARP, warp = f->tid / FC_WARP;
  f->coll_kind = kind;
  f->coll_mask = mask;
  r->slots[warp][f->warp_round & 1u][lane] = value;
  f->state = FIBER_WARP;
  leave_fiber(r, f, false);
  return f;
}

uint64_t fakecuda__shfl(unsigned mask, uint64_t value, int mode, int arg, int width) {
  runner_t *r = in_kernel("a warp shuffle");
  fiber_t *f = r->current;
  if (width < 1 || width > FC_WARP || (width & (width - 1)))
    fakecuda__fault(CUDA_ERROR_LAUNCH_FAILED, "a shuffle's width must be a power of two up to 32");
  f->coll_mode = mode;
  f->coll_arg = arg;
  f->coll_width = width;
  collective(r, COLLECTIVE_SHFL, mask, value);
  const int lane = (int)(f->tid % FC_WARP), base = lane / width * width;
  int src;
  switch (mode) {
  case FAKECUDA_SHFL_UP: src = lane - base >= arg ? lane - arg : lane; break;
  case FAKECUDA_SHFL_DOWN: src = lane - base + arg < width ? lane + arg : lane; break;
  case FAKECUDA_SHFL_XOR: src = (lane ^ arg) / width * width > base ? lane : (lane ^ arg) & (FC_WARP - 1); break;
  default: src = base + ((arg % width) + width) % width; break;
  }
  if (!(mask >> src & 1u)) {
    char why[160];
    snprintf(why, sizeof why, "thread %u's shuffle reads lane %d, which is not in its mask 0x%08x (undefined)", f->tid,
             src, mask);
    fakecuda__fault(CUDA_ERROR_LAUNCH_FAILED, why);
  }
  const uint64_t out = r->slots[f->tid / FC_WARP][f->warp_round & 1u][src];
  f->warp_round++;
  return out;
}

unsigned fakecuda__vote(unsigned mask, int pred) {
  runner_t *r = in_kernel("a warp vote");
  fiber_t *f = collective(r, COLLECTIVE_VOTE, mask, (uint64_t)(pred != 0));
  unsigned ballot = 0;
  for (unsigned j = 0; j < FC_WARP; j++)
    if (mask >> j & 1u && r->slots[f->tid / FC_WARP][f->warp_round & 1u][j]) ballot |= 1u << j;
  f->warp_round++;
  return ballot;
}

unsigned fakecuda__activemask(void) {
  runner_t *r = in_kernel("__activemask");
  const unsigned warp = r->current->tid / FC_WARP;
  unsigned mask = 0;
  for (unsigned j = 0; j < FC_WARP && warp * FC_WARP + j < r->count; j++)
    if (r->fibers[warp * FC_WARP + j].state != FIBER_DONE) mask |= 1u << j;
  return mask;
}

void fakecuda__fault(int result, const char *message) {
  runner_t *r = in_kernel("a fault");
  fiber_t *f = r->current;
  if (r->fault == CUDA_SUCCESS) {
    r->fault = (CUresult)result;
    snprintf(r->message, sizeof r->message, "block (%u,%u,%u) thread (%u,%u,%u): %s", r->block_idx.x, r->block_idx.y,
             r->block_idx.z, f->idx.x, f->idx.y, f->idx.z, message);
  }
  f->state = FIBER_FAULT;
  leave_fiber(r, f, true);
  abort(); /* a faulted fiber is never resumed */
}
