/* backends/cpu/sync.h: spin-then-sleep waiting on 32-bit atomic words (futex), shared by the CPU queues and thread pool. */
#ifndef KILN_CPU_SYNC_H
#define KILN_CPU_SYNC_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a waiter spins before it sleeps in the kernel: long enough to catch
 * the next command of a busy producer or the end of a short kernel, short
 * enough that an idle thread costs nothing measurable. */
#define KILN_CPU_SPIN_NS 50000

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
static inline uint32_t kiln_cpu_spin_while(_Atomic uint32_t *word, uint32_t expected) {
  uint32_t v = atomic_load_explicit(word, memory_order_acquire);
  if (v != expected) return v;
  uint64_t deadline = kiln_cpu_now_ns() + KILN_CPU_SPIN_NS;
  for (unsigned i = 1;; i++) {
    kiln_cpu_relax();
    v = atomic_load_explicit(word, memory_order_acquire);
    if (v != expected) return v;
    if ((i & 63) == 0 && kiln_cpu_now_ns() > deadline) return v;
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
