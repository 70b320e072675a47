/* runtime/cache.c: the on-disk cache: verified blobs (compiled kernels) and the tuning results of `fastest`. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/internal.h"

/* Blob file layout (host byte order: the cache is per machine):
 *   8 bytes  magic "KILNBLOB"
 *   4 bytes  format version
 *   4 bytes  key length, then the key
 *   8 bytes  payload size
 *   8 bytes  FNV-1a 64 of the payload
 *   payload
 * Every field is checked on load; any doubt is a miss, never a trusted blob. */
static const char kiln_blob_magic[8] = {'K', 'I', 'L', 'N', 'B', 'L', 'O', 'B'};
#define KILN_BLOB_VERSION 1u
#define KILN_TUNING_HEADER "kiln-tuning 1"

static _Atomic uint64_t kiln_cache_hits, kiln_cache_misses, kiln_cache_stores, kiln_cache_corrupt,
    kiln_cache_failures;

static uint64_t kiln_fnv1a(const void *data, size_t size) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static void kiln_count(_Atomic uint64_t *counter) { atomic_fetch_add_explicit(counter, 1, memory_order_relaxed); }

/* malloc'ed "<dir>/<a>/<b>" (b may be NULL). */
static char *kiln_path(const char *dir, const char *a, const char *b) {
  size_t n = strlen(dir) + strlen(a) + (b ? strlen(b) : 0) + 3;
  char *out = malloc(n);
  if (!out) return NULL;
  if (b) snprintf(out, n, "%s/%s/%s", dir, a, b);
  else snprintf(out, n, "%s/%s", dir, a);
  return out;
}

/* mkdir -p; existing folders are fine. */
static bool kiln_mkdirs(const char *path) {
  char *copy = strdup(path);
  if (!copy) return false;
  bool ok = true;
  for (char *p = copy + 1; ok; p++) {
    if (*p == '/' || *p == '\0') {
      char saved = *p;
      *p = '\0';
      if (mkdir(copy, 0755) != 0 && errno != EEXIST) ok = false;
      *p = saved;
      if (!saved) break;
    }
  }
  if (ok) {
    struct stat st;
    ok = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
  }
  free(copy);
  return ok;
}

static bool kiln_write_all(int fd, const void *data, size_t size) {
  const char *p = data;
  while (size) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= (size_t)n;
  }
  return true;
}

/* Write `parts` to `final` through "<final>.tmp.<pid>.<tid>" and a rename, so
 * that a reader sees the old file or the whole new one, never a half, and two
 * writers never share a temporary. */
static bool kiln_write_atomically(const char *final, const void *const *parts, const size_t *sizes, size_t count) {
  size_t n = strlen(final) + 64;
  char *tmp = malloc(n);
  if (!tmp) return false;
  snprintf(tmp, n, "%s.tmp.%ld.%ld", final, (long)getpid(), (long)syscall(SYS_gettid));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t i = 0; ok && i < count; i++) ok = kiln_write_all(fd, parts[i], sizes[i]);
  if (fd >= 0 && close(fd) != 0) ok = false;
  if (ok && rename(tmp, final) != 0) ok = false;
  if (!ok && fd >= 0) unlink(tmp);
  free(tmp);
  return ok;
}

static const char *kiln_cache_root(void) { return kiln__rt.config.cache_dir; }

/* "<dir>/kernels/<16 hex digits>" for a key. */
static char *kiln_blob_path(const char *dir, const char *key) {
  char name[17];
  snprintf(name, sizeof name, "%016llx", (unsigned long long)kiln_fnv1a(key, strlen(key)));
  return kiln_path(dir, "kernels", name);
}

static kiln_status_t kiln_blob_miss(const char *key) {
  kiln_count(&kiln_cache_misses);
  return kiln__set_error(KILN_NOT_FOUND, "no cache entry for \"%.200s\"", key);
}

static kiln_status_t kiln_blob_corrupt(const char *path, const char *why) {
  kiln_count(&kiln_cache_corrupt);
  kiln__log(KILN_LOG_WARN, "cache entry %s ignored: %s; it will be rebuilt", path, why);
  return kiln__set_error(KILN_NOT_FOUND, "cache entry %s is invalid (%s); rebuild and store it again", path, why);
}

kiln_status_t kiln__cache_load(const char *key, void **out_data, size_t *out_size) {
  if (!key || !out_data || !out_size)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "cache_load: key, out_data or out_size is NULL");
  const char *dir = kiln_cache_root();
  if (!dir) return kiln_blob_miss(key);
  char *path = kiln_blob_path(dir, key);
  if (!path) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory building a cache path");

  kiln_status_t status;
  unsigned char *file = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    status = kiln_blob_miss(key);
    goto done;
  }
  size_t size = (size_t)st.st_size;
  file = malloc(size ? size : 1);
  if (!file) {
    status = kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory reading cache entry %s (%zu bytes)", path, size);
    goto done;
  }
  size_t got = 0;
  while (got < size) {
    ssize_t n = read(fd, file + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  size_t key_len = strlen(key);
  size_t header = sizeof kiln_blob_magic + 4 + 4;
  uint32_t version, stored_key_len;
  uint64_t payload_size, checksum;
  if (got != size || size < header) {
    status = kiln_blob_corrupt(path, "file shorter than its header");
    goto done;
  }
  memcpy(&version, file + 8, 4);
  memcpy(&stored_key_len, file + 12, 4);
  if (memcmp(file, kiln_blob_magic, sizeof kiln_blob_magic) != 0) {
    status = kiln_blob_corrupt(path, "bad magic");
    goto done;
  }
  if (version != KILN_BLOB_VERSION) {
    status = kiln_blob_corrupt(path, "written by another cache format version");
    goto done;
  }
  if (stored_key_len != key_len || size - header < key_len + 16 || memcmp(file + header, key, key_len) != 0) {
    /* A hash collision or a stale entry under the same name. */
    status = kiln_blob_corrupt(path, "stored key differs");
    goto done;
  }
  memcpy(&payload_size, file + header + key_len, 8);
  memcpy(&checksum, file + header + key_len + 8, 8);
  size_t offset = header + key_len + 16;
  if (payload_size != size - offset) {
    status = kiln_blob_corrupt(path, "payload size differs from the file (truncated?)");
    goto done;
  }
  if (kiln_fnv1a(file + offset, (size_t)payload_size) != checksum) {
    status = kiln_blob_corrupt(path, "checksum mismatch");
    goto done;
  }
  void *data = malloc(payload_size ? (size_t)payload_size : 1);
  if (!data) {
    status = kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory loading cache entry %s", path);
    goto done;
  }
  memcpy(data, file + offset, (size_t)payload_size);
  *out_data = data;
  *out_size = (size_t)payload_size;
  kiln_count(&kiln_cache_hits);
  status = KILN_OK;

done:
  if (fd >= 0) close(fd);
  free(file);
  free(path);
  return status;
}

void kiln__cache_store(const char *key, const void *data, size_t size) {
  const char *dir = kiln_cache_root();
  if (!dir || !key || (!data && size)) return;
  char *folder = kiln_path(dir, "kernels", NULL);
  char *path = kiln_blob_path(dir, key);
  bool ok = folder && path && kiln_mkdirs(folder);
  if (ok) {
    uint32_t version = KILN_BLOB_VERSION;
    uint32_t key_len = (uint32_t)strlen(key);
    uint64_t payload_size = size;
    uint64_t checksum = kiln_fnv1a(data, size);
    const void *parts[] = {kiln_blob_magic, &version, &key_len, key, &payload_size, &checksum, data};
    size_t sizes[] = {sizeof kiln_blob_magic, 4, 4, key_len, 8, 8, size};
    ok = kiln_write_atomically(path, parts, sizes, 7);
  }
  if (ok) {
    kiln_count(&kiln_cache_stores);
  } else {
    /* A read-only or full disk costs speed, not correctness. */
    kiln_count(&kiln_cache_failures);
    kiln__log(KILN_LOG_WARN, "could not store cache entry %s; running uncached", path ? path : "(no memory)");
  }
  free(folder);
  free(path);
}

/* ---- tuning results ----------------------------------------------------------- */

typedef struct kiln_tuning_entry_t {
  char *key;
  kiln_provider_t provider;
} kiln_tuning_entry_t;

static pthread_mutex_t kiln_tuning_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_tuning_entry_t *kiln_tuning;
static size_t kiln_tuning_count, kiln_tuning_capacity;
static bool kiln_tuning_loaded;

static void kiln_tuning_clear(void) {
  for (size_t i = 0; i < kiln_tuning_count; i++) free(kiln_tuning[i].key);
  free(kiln_tuning);
  kiln_tuning = NULL;
  kiln_tuning_count = kiln_tuning_capacity = 0;
}

static bool kiln_tuning_put(const char *key, size_t key_len, kiln_provider_t provider) {
  for (size_t i = 0; i < kiln_tuning_count; i++) {
    if (strlen(kiln_tuning[i].key) == key_len && !memcmp(kiln_tuning[i].key, key, key_len)) {
      kiln_tuning[i].provider = provider;
      return true;
    }
  }
  if (kiln_tuning_count == kiln_tuning_capacity) {
    size_t capacity = kiln_tuning_capacity ? kiln_tuning_capacity * 2 : 16;
    kiln_tuning_entry_t *grown = realloc(kiln_tuning, capacity * sizeof *grown);
    if (!grown) return false;
    kiln_tuning = grown;
    kiln_tuning_capacity = capacity;
  }
  char *copy = strndup(key, key_len);
  if (!copy) return false;
  kiln_tuning[kiln_tuning_count].key = copy;
  kiln_tuning[kiln_tuning_count].provider = provider;
  kiln_tuning_count++;
  return true;
}

/* Read tuning.tsv once. A file that does not parse line for line is dropped
 * whole: a half-trusted tuning table could pick a provider for the wrong
 * shape. The next store writes a clean one. */
static void kiln_tuning_load_locked(void) {
  if (kiln_tuning_loaded) return;
  kiln_tuning_loaded = true;
  const char *dir = kiln_cache_root();
  if (!dir) return;
  char *path = kiln_path(dir, "tuning.tsv", NULL);
  if (!path) return;
  FILE *f = fopen(path, "re");
  if (!f) {
    free(path);
    return;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  bool ok = true, first = true;
  while (ok && (len = getline(&line, &cap, f)) >= 0) {
    if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
    if (first) {
      ok = !strcmp(line, KILN_TUNING_HEADER);
      first = false;
      continue;
    }
    char *tab = strchr(line, '\t');
    if (!tab || tab == line || strchr(tab + 1, '\t')) {
      ok = false;
      break;
    }
    int provider = -1;
    for (int p = 0; p < KILN_PROVIDER_COUNT; p++)
      if (!strcmp(tab + 1, kiln__provider_name((kiln_provider_t)p))) provider = p;
    ok = provider >= 0 && kiln_tuning_put(line, (size_t)(tab - line), (kiln_provider_t)provider);
  }
  if (first) ok = false; /* an empty file lacks even the header */
  free(line);
  fclose(f);
  if (!ok) {
    kiln_tuning_clear();
    kiln_count(&kiln_cache_corrupt);
    kiln__log(KILN_LOG_WARN, "tuning file %s is malformed and was ignored; it will be rewritten", path);
  }
  free(path);
}

kiln_status_t kiln__tuning_lookup(const char *key, kiln_provider_t *out_provider) {
  if (!key || !out_provider)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "tuning lookup: key or out_provider is NULL");
  pthread_mutex_lock(&kiln_tuning_lock);
  kiln_tuning_load_locked();
  int found = -1;
  for (size_t i = 0; i < kiln_tuning_count && found < 0; i++)
    if (!strcmp(kiln_tuning[i].key, key)) found = (int)kiln_tuning[i].provider;
  pthread_mutex_unlock(&kiln_tuning_lock);
  if (found < 0) {
    /* An ordinary miss (the caller measures next): the thread's last error
     * stays what it was. */
    kiln_count(&kiln_cache_misses);
    return KILN_NOT_FOUND;
  }
  kiln_count(&kiln_cache_hits);
  *out_provider = (kiln_provider_t)found;
  return KILN_OK;
}

void kiln__tuning_store(const char *key, kiln_provider_t provider) {
  /* Tabs and newlines would break the line format; such keys stay in memory
   * only for this run. */
  if (!key || !key[0] || strpbrk(key, "\t\n") || (int)provider < 0 || provider >= KILN_PROVIDER_COUNT) return;
  pthread_mutex_lock(&kiln_tuning_lock);
  kiln_tuning_load_locked();
  bool ok = kiln_tuning_put(key, strlen(key), provider);
  const char *dir = kiln_cache_root();
  if (ok && dir) {
    /* Rewrite the whole file: the table is small and the rename keeps it whole. */
    size_t total = strlen(KILN_TUNING_HEADER) + 2;
    for (size_t i = 0; i < kiln_tuning_count; i++)
      total += strlen(kiln_tuning[i].key) + strlen(kiln__provider_name(kiln_tuning[i].provider)) + 2;
    char *text = malloc(total);
    char *path = kiln_path(dir, "tuning.tsv", NULL);
    ok = text && path && kiln_mkdirs(dir);
    if (ok) {
      size_t used = (size_t)snprintf(text, total, "%s\n", KILN_TUNING_HEADER);
      for (size_t i = 0; i < kiln_tuning_count; i++)
        used += (size_t)snprintf(text + used, total - used, "%s\t%s\n", kiln_tuning[i].key,
                                 kiln__provider_name(kiln_tuning[i].provider));
      const void *parts[] = {text};
      size_t sizes[] = {used};
      ok = kiln_write_atomically(path, parts, sizes, 1);
    }
    free(text);
    free(path);
    if (ok) kiln_count(&kiln_cache_stores);
    else kiln_count(&kiln_cache_failures);
  }
  pthread_mutex_unlock(&kiln_tuning_lock);
}

void kiln__cache_reset(void) {
  pthread_mutex_lock(&kiln_tuning_lock);
  kiln_tuning_clear();
  kiln_tuning_loaded = false;
  pthread_mutex_unlock(&kiln_tuning_lock);
  /* The counters are "since start": a new start counts afresh. */
  atomic_store(&kiln_cache_hits, 0);
  atomic_store(&kiln_cache_misses, 0);
  atomic_store(&kiln_cache_stores, 0);
  atomic_store(&kiln_cache_corrupt, 0);
  atomic_store(&kiln_cache_failures, 0);
}

kiln_status_t kiln_cache_stats(kiln_cache_stats_t *out_stats) {
  if (!out_stats) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_cache_stats: out_stats is NULL");
  out_stats->hits = atomic_load(&kiln_cache_hits);
  out_stats->misses = atomic_load(&kiln_cache_misses);
  out_stats->stores = atomic_load(&kiln_cache_stores);
  out_stats->corrupt = atomic_load(&kiln_cache_corrupt);
  out_stats->failures = atomic_load(&kiln_cache_failures);
  return KILN_OK;
}
