/* backends/cpu/sync.h: spin-then-sleep waiting on 32-bit atomic words (futex), shared by the CPU queues and thread pool. */
#ifndef KILN_CPU_SYNC_H
#define KILN_CPU_SYNC_H

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a waiter spins before it sleeps in the kernel: long enough to catch
 * the next command of a busy producer or the end of a short kernel, short
 * enough that an idle thread costs nothing measurable. */
#define KILN_CPU_SPIN_NS 50000

/* After this much of the spin, a spinner also yields its CPU now and then:
 * when the thread it waits for shares that CPU (a busy machine, or the
 * scheduler placing a woken worker beside its producer), the change can only
 * come once the spinner steps aside, and without yielding each wait would
 * cost a whole spin. With the CPU to itself, sched_yield returns at once. */
#define KILN_CPU_SPIN_YIELD_NS 2000

static inline uint64_t kiln_cpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void kiln_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Sleep while *word == expected (returns at once if it differs). */
static inline void kiln_cpu_futex_wait(_Atomic uint32_t *word, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static inline void kiln_cpu_futex_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Spin for up to KILN_CPU_SPIN_NS while *word == expected. Returns the value
 * seen last: != expected when it changed during the spin. */
/* One step of a spin that began at `start` (ns): false once it should stop
 * and sleep. Call it every 64 iterations or so. */
static inline bool kiln_cpu_spin_step(uint64_t start) {
  const uint64_t now = kiln_cpu_now_ns();
  if (now - start > KILN_CPU_SPIN_NS) return false;
  if (now - start > KILN_CPU_SPIN_YIELD_NS) sched_yield();
  return true;
}

static inline uint32_t kiln_cpu_spin_while(_Atomic uint32_t *word, uint32_t expected) {
  uint32_t v = atomic_load_explicit(word, memory_order_acquire);
  if (v != expected) return v;
  const uint64_t start = kiln_cpu_now_ns();
  for (unsigned i = 1;; i++) {
    kiln_cpu_relax();
    v = atomic_load_explicit(word, memory_order_acquire);
    if (v != expected) return v;
    if ((i & 63) == 0 && !kiln_cpu_spin_step(start)) return v;
  }
}

/* Block until *word != expected: spin, then sleep. `sleepers` counts the
 * threads that may be asleep on `word`, so that wakers call into the kernel
 * only when someone sleeps (they check it after changing *word). */
static inline uint32_t kiln_cpu_wait_change(_Atomic uint32_t *word, uint32_t expected,
                                            _Atomic uint32_t *sleepers) {
  uint32_t v = kiln_cpu_spin_while(word, expected);
  while (v == expected) {
    atomic_fetch_add(sleepers, 1);
    v = atomic_load(word);
    if (v == expected) kiln_cpu_futex_wait(word, expected);
    atomic_fetch_sub(sleepers, 1);
    v = atomic_load_explicit(word, memory_order_acquire);
  }
  return v;
}

/* The waker's half: call after changing *word (with a seq_cst store/RMW). */
static inline void kiln_cpu_wake(_Atomic uint32_t *word, _Atomic uint32_t *sleepers) {
  if (atomic_load(sleepers) != 0) kiln_cpu_futex_wake_all(word);
}

#endif /* KILN_CPU_SYNC_H */
