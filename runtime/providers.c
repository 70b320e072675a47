/* runtime/providers.c: provider names interned to small ids, so that choosing an op's provider compares integers. */
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"

/* Names are added, never removed: an id stays valid for the whole process,
 * across kiln_deinitialize and a new start. Entries are written once under
 * the lock and published by the count, so readers need no lock. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char names[KILN__MAX_PROVIDERS][32];
static _Atomic int count;
static pthread_once_t seeded = PTHREAD_ONCE_INIT;

static bool well_formed(const char *name) {
  size_t len = name ? strlen(name) : 0;
  if (len == 0 || len >= sizeof names[0]) return false;
  return strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") == len;
}

static int find_locked(const char *name, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return i;
  return KILN_PROVIDER_NONE;
}

static int intern(const char *name) {
  if (!well_formed(name)) return KILN_PROVIDER_NONE;
  pthread_mutex_lock(&lock);
  int n = atomic_load_explicit(&count, memory_order_relaxed);
  int id = find_locked(name, n);
  if (id == KILN_PROVIDER_NONE && n < KILN__MAX_PROVIDERS) {
    snprintf(names[n], sizeof names[n], "%s", name);
    atomic_store_explicit(&count, n + 1, memory_order_release);
    id = n;
  }
  pthread_mutex_unlock(&lock);
  return id;
}

/* The names of backend.h first, in its order: native is id 0. */
static void seed(void) {
  static const char *const known[] = {KILN_BACKEND_KNOWN_PROVIDERS};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) intern(known[i]);
}

int kiln__provider_intern(const char *name) {
  pthread_once(&seeded, seed);
  return intern(name);
}

int kiln__provider_find(const char *name) {
  pthread_once(&seeded, seed);
  if (!well_formed(name)) return KILN_PROVIDER_NONE;
  int n = atomic_load_explicit(&count, memory_order_acquire);
  return find_locked(name, n);
}

const char *kiln__provider_name(int id) {
  pthread_once(&seeded, seed);
  if (id < 0 || id >= atomic_load_explicit(&count, memory_order_acquire)) return "unknown";
  return names[id];
}

void kiln__provider_list(char *out, size_t size) {
  pthread_once(&seeded, seed);
  int n = atomic_load_explicit(&count, memory_order_acquire);
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; i < n && used < size; i++) {
    int w = snprintf(out + used, size - used, "%s%s", i ? ", " : "", names[i]);
    if (w < 0) break;
    used += (size_t)w;
  }
}
