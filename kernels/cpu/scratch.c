/* kernels/cpu/scratch.c: memory a CPU kernel keeps per thread from one op to the next, so that large ops do not fault in fresh pages each time. */
#include <pthread.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_native.h"

/* Kept blocks larger than this are not kept: allocated and freed per op. */
#define KILN_CPU_SCRATCH_KEEP ((size_t)64 << 20)
#define KILN_CPU_SCRATCH_ALIGN 64

typedef struct scratch_t {
  size_t bytes;
  _Alignas(KILN_CPU_SCRATCH_ALIGN) unsigned char data[];
} scratch_t;

static pthread_key_t keys[KILN_CPU_SCRATCH_SLOTS];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static bool keys_made;

static void make_keys(void) {
  for (int i = 0; i < KILN_CPU_SCRATCH_SLOTS; i++)
    if (pthread_key_create(&keys[i], free) != 0) {
      while (i-- > 0) pthread_key_delete(keys[i]);
      return;
    }
  keys_made = true;
}

static void *fresh(size_t bytes, void **own) {
  void *mem = aligned_alloc(KILN_CPU_SCRATCH_ALIGN,
                            (bytes + KILN_CPU_SCRATCH_ALIGN - 1) / KILN_CPU_SCRATCH_ALIGN * KILN_CPU_SCRATCH_ALIGN);
  *own = mem;
  return mem;
}

void *kiln_cpu_scratch(kiln_cpu_scratch_slot_t slot, size_t bytes, void **own) {
  *own = NULL;
  pthread_once(&keys_once, make_keys);
  if (!keys_made || bytes > KILN_CPU_SCRATCH_KEEP) return fresh(bytes, own);
  scratch_t *kept = pthread_getspecific(keys[slot]);
  if (kept && kept->bytes >= bytes) return kept->data;
  /* Too small: replaced (free before allocating, so that the two never
   * sit in memory together). */
  (void)pthread_setspecific(keys[slot], NULL);
  free(kept);
  const size_t total = (sizeof(scratch_t) + bytes + KILN_CPU_SCRATCH_ALIGN - 1) / KILN_CPU_SCRATCH_ALIGN *
                       KILN_CPU_SCRATCH_ALIGN;
  kept = aligned_alloc(KILN_CPU_SCRATCH_ALIGN, total);
  if (!kept) return NULL;
  kept->bytes = bytes;
  if (pthread_setspecific(keys[slot], kept) != 0) *own = kept;
  return kept->data;
}
