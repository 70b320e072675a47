/* runtime/cache.c: the on-disk cache: verified blobs (compiled kernels) and the tuning results of `fastest`. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <dirent.h>
#include <signal.h>
#include <time.h>
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
static const char blob_magic[8] = {'K', 'I', 'L', 'N', 'B', 'L', 'O', 'B'};
#define KILN_BLOB_VERSION 1u
#define KILN_TUNING_HEADER "kiln-tuning 1"

static _Atomic uint64_t stat_hits, stat_misses, stat_stores, stat_corrupt,
    stat_failures;

static uint64_t fnv1a(const void *data, size_t size) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static void count_one(_Atomic uint64_t *counter) { atomic_fetch_add_explicit(counter, 1, memory_order_relaxed); }

/* malloc'ed "<dir>/<a>/<b>" (b may be NULL). */
static char *path_join(const char *dir, const char *a, const char *b) {
  size_t n = strlen(dir) + strlen(a) + (b ? strlen(b) : 0) + 3;
  char *out = malloc(n);
  if (!out) return NULL;
  if (b) snprintf(out, n, "%s/%s/%s", dir, a, b);
  else snprintf(out, n, "%s/%s", dir, a);
  return out;
}

/* mkdir -p; existing folders are fine. */
static bool mkdirs(const char *path) {
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

static bool write_all(int fd, const void *data, size_t size) {
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
static bool write_atomically(const char *final, const void *const *parts, const size_t *sizes, size_t count) {
  size_t n = strlen(final) + 64;
  char *tmp = malloc(n);
  if (!tmp) return false;
  snprintf(tmp, n, "%s.tmp.%ld.%ld", final, (long)getpid(), (long)syscall(SYS_gettid));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t i = 0; ok && i < count; i++) ok = write_all(fd, parts[i], sizes[i]);
  if (fd >= 0 && close(fd) != 0) ok = false;
  if (ok && rename(tmp, final) != 0) ok = false;
  if (!ok && fd >= 0) unlink(tmp);
  free(tmp);
  return ok;
}

static const char *cache_root(void) { return kiln__rt.config.cache_dir; }

/* "<dir>/kernels/<16 hex digits>" for a key. */
static char *blob_path(const char *dir, const char *key) {
  char name[17];
  snprintf(name, sizeof name, "%016llx", (unsigned long long)fnv1a(key, strlen(key)));
  return path_join(dir, "kernels", name);
}

static kiln_status_t blob_miss(const char *key) {
  count_one(&stat_misses);
  return kiln__set_error(KILN_NOT_FOUND, "no cache entry for \"%.200s\"", key);
}

static kiln_status_t blob_corrupt(const char *path, const char *why) {
  count_one(&stat_corrupt);
  kiln__log(KILN_LOG_WARN, "cache entry %s ignored: %s; it will be rebuilt", path, why);
  return kiln__set_error(KILN_NOT_FOUND, "cache entry %s is invalid (%s); rebuild and store it again", path, why);
}

/* Read exactly `size` bytes at `offset`; false on a short read or an error. */
static bool read_at(int fd, void *out, size_t size, off_t offset) {
  char *p = out;
  while (size) {
    ssize_t n = pread(fd, p, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= (size_t)n;
    offset += n;
  }
  return true;
}

/* Open a cache file for reading without ever blocking: a FIFO or a device
 * node put there (by accident or malice) would otherwise hang the open or
 * the read. Anything but a regular file is counted, removed so that the next
 * store can replace it, and treated as absent. -1 when absent or refused. */
static int open_regular(const char *path, struct stat *out_st) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return -1;
  if (fstat(fd, out_st) != 0) {
    close(fd);
    return -1;
  }
  if (!S_ISREG(out_st->st_mode)) {
    close(fd);
    count_one(&stat_corrupt);
    kiln__log(KILN_LOG_WARN, "cache file %s is not a regular file; removed, it will be rewritten", path);
    if (unlink(path) != 0 && S_ISDIR(out_st->st_mode)) rmdir(path);
    return -1;
  }
  return fd;
}

kiln_status_t kiln__cache_load(const char *key, void **out_data, size_t *out_size) {
  if (!key || !out_data || !out_size)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "cache_load: key, out_data or out_size is NULL");
  const char *dir = cache_root();
  if (!dir) return blob_miss(key);
  char *path = blob_path(dir, key);
  if (!path) return kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory building a cache path");

  kiln_status_t status;
  void *data = NULL;
  char *stored_key = NULL;
  struct stat st;
  int fd = open_regular(path, &st);
  if (fd < 0) {
    status = blob_miss(key);
    goto done;
  }
  /* The header first, and the payload read only once the header says it
   * fits the file: a huge corrupt entry costs a few bytes of reading. */
  const uint64_t size = (uint64_t)st.st_size;
  const size_t key_len = strlen(key);
  unsigned char head[sizeof blob_magic + 4 + 4];
  uint32_t version, stored_key_len;
  uint64_t payload_size, checksum;
  if (size < sizeof head || !read_at(fd, head, sizeof head, 0)) {
    status = blob_corrupt(path, "file shorter than its header");
    goto done;
  }
  memcpy(&version, head + 8, 4);
  memcpy(&stored_key_len, head + 12, 4);
  if (memcmp(head, blob_magic, sizeof blob_magic) != 0) {
    status = blob_corrupt(path, "bad magic");
    goto done;
  }
  if (version != KILN_BLOB_VERSION) {
    status = blob_corrupt(path, "written by another cache format version");
    goto done;
  }
  if (stored_key_len != key_len || size - sizeof head < (uint64_t)key_len + 16) {
    /* A hash collision or a stale entry under the same name. */
    status = blob_corrupt(path, "stored key differs");
    goto done;
  }
  stored_key = malloc(key_len + 16);
  if (!stored_key) {
    status = kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory reading cache entry %s", path);
    goto done;
  }
  if (!read_at(fd, stored_key, key_len + 16, (off_t)sizeof head) || memcmp(stored_key, key, key_len) != 0) {
    status = blob_corrupt(path, "stored key differs");
    goto done;
  }
  memcpy(&payload_size, stored_key + key_len, 8);
  memcpy(&checksum, stored_key + key_len + 8, 8);
  const uint64_t offset = sizeof head + key_len + 16;
  if (payload_size != size - offset) {
    status = blob_corrupt(path, "payload size differs from the file (truncated?)");
    goto done;
  }
  data = malloc(payload_size ? (size_t)payload_size : 1);
  if (!data) {
    status = kiln__set_error(KILN_OUT_OF_MEMORY, "out of host memory loading cache entry %s (%llu bytes)", path,
                             (unsigned long long)payload_size);
    goto done;
  }
  if (!read_at(fd, data, (size_t)payload_size, (off_t)offset)) {
    status = blob_corrupt(path, "file shorter than its header says (truncated?)");
    goto done;
  }
  if (fnv1a(data, (size_t)payload_size) != checksum) {
    status = blob_corrupt(path, "checksum mismatch");
    goto done;
  }
  *out_data = data;
  *out_size = (size_t)payload_size;
  data = NULL;
  count_one(&stat_hits);
  status = KILN_OK;

done:
  if (fd >= 0) close(fd);
  free(data);
  free(stored_key);
  free(path);
  return status;
}

/* ---- temporaries of writers that died ------------------------------------------ */

/* Entries scanned and time spent at most by one sweep: start-up must stay fast
 * whatever the cache holds. */
#define SWEEP_MAX_ENTRIES 4096
#define SWEEP_MAX_NS (20 * 1000 * 1000)

/* Whether `name` is "<entry>.tmp.<pid>.<tid>" of a process that no longer
 * exists. */
static bool stale_temporary(const char *name) {
  const char *tag = strstr(name, ".tmp.");
  if (!tag) return false;
  char *end = NULL;
  errno = 0;
  long pid = strtol(tag + 5, &end, 10);
  if (errno || end == tag + 5 || *end != '.' || pid <= 0) return false;
  if (pid == (long)getpid()) return false;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sweep_folder(const char *folder, uint64_t deadline, int *budget) {
  DIR *d = opendir(folder);
  if (!d) return;
  struct dirent *e;
  while (*budget > 0 && (e = readdir(d)) != NULL && now_ns() < deadline) {
    (*budget)--;
    if (!stale_temporary(e->d_name)) continue;
    char *path = path_join(folder, e->d_name, NULL);
    if (path && unlink(path) == 0) kiln__log(KILN_LOG_INFO, "removed %s, left by a writer that died", path);
    free(path);
  }
  closedir(d);
}

void kiln__cache_sweep(void) {
  const char *dir = cache_root();
  if (!dir) return;
  uint64_t deadline = now_ns() + SWEEP_MAX_NS;
  /* The root first, on a budget of its own: it holds a handful of entries
   * (the tuning table's temporaries among them), and a kernels folder of
   * thousands must not use up the sweep before the root is reached. */
  int root_budget = 64;
  sweep_folder(dir, deadline, &root_budget);
  int budget = SWEEP_MAX_ENTRIES;
  char *kernels = path_join(dir, "kernels", NULL);
  if (kernels) sweep_folder(kernels, deadline, &budget);
  free(kernels);
}

void kiln__cache_store(const char *key, const void *data, size_t size) {
  const char *dir = cache_root();
  if (!dir || !key || (!data && size)) return;
  char *folder = path_join(dir, "kernels", NULL);
  char *path = blob_path(dir, key);
  bool ok = folder && path && mkdirs(folder);
  if (ok) {
    uint32_t version = KILN_BLOB_VERSION;
    uint32_t key_len = (uint32_t)strlen(key);
    uint64_t payload_size = size;
    uint64_t checksum = fnv1a(data, size);
    const void *parts[] = {blob_magic, &version, &key_len, key, &payload_size, &checksum, data};
    size_t sizes[] = {sizeof blob_magic, 4, 4, key_len, 8, 8, size};
    ok = write_atomically(path, parts, sizes, 7);
  }
  if (ok) {
    count_one(&stat_stores);
  } else {
    /* A read-only or full disk costs speed, not correctness. */
    count_one(&stat_failures);
    kiln__log(KILN_LOG_WARN, "could not store cache entry %s; running uncached", path ? path : "(no memory)");
  }
  free(folder);
  free(path);
}

void kiln__cache_evict(const char *key) {
  const char *dir = cache_root();
  if (!dir || !key) return;
  char *path = blob_path(dir, key);
  /* A missing file is fine: the entry is gone either way. */
  if (path && unlink(path) == 0) kiln__log(KILN_LOG_INFO, "evicted cache entry %s", path);
  free(path);
}

/* ---- tuning results ----------------------------------------------------------- */

/* tuning.tsv: the header line, then "key<TAB>provider" per line: the table
 * a start reads. Why each winner won (the measured medians) is appended to
 * tuning.log beside it, for people. */

typedef struct tuning_entry_t {
  char *key;
  char provider[32];
} tuning_entry_t;

static pthread_mutex_t tuning_lock = PTHREAD_MUTEX_INITIALIZER;
static tuning_entry_t *tuning;
static size_t tuning_count, tuning_capacity;
/* Open addressing over the keys' hashes: entry index + 1, 0 for empty. */
static size_t *tuning_slots;
static size_t tuning_slot_count; /* a power of two, at least twice tuning_count */
static bool tuning_loaded;

static void tuning_clear(void) {
  for (size_t i = 0; i < tuning_count; i++) free(tuning[i].key);
  free(tuning);
  free(tuning_slots);
  tuning = NULL;
  tuning_slots = NULL;
  tuning_count = tuning_capacity = tuning_slot_count = 0;
}

/* The slot holding `key`, or the empty slot where it would go. */
static size_t *tuning_slot(const char *key, size_t key_len) {
  size_t mask = tuning_slot_count - 1;
  for (size_t i = (size_t)fnv1a(key, key_len) & mask;; i = (i + 1) & mask) {
    size_t *slot = &tuning_slots[i];
    if (!*slot) return slot;
    const char *k = tuning[*slot - 1].key;
    if (strlen(k) == key_len && !memcmp(k, key, key_len)) return slot;
  }
}

static bool tuning_index_grow(void) {
  size_t count = tuning_slot_count ? tuning_slot_count * 2 : 64;
  size_t *slots = calloc(count, sizeof *slots);
  if (!slots) return false;
  free(tuning_slots);
  tuning_slots = slots;
  tuning_slot_count = count;
  for (size_t i = 0; i < tuning_count; i++) *tuning_slot(tuning[i].key, strlen(tuning[i].key)) = i + 1;
  return true;
}

static bool tuning_put(const char *key, size_t key_len, const char *provider, size_t provider_len) {
  if (provider_len == 0 || provider_len >= sizeof tuning[0].provider) return false;
  if ((tuning_count + 1) * 2 > tuning_slot_count && !tuning_index_grow()) return false;
  size_t *slot = tuning_slot(key, key_len);
  tuning_entry_t *entry;
  if (*slot) {
    entry = &tuning[*slot - 1];
  } else {
    if (tuning_count == tuning_capacity) {
      size_t capacity = tuning_capacity ? tuning_capacity * 2 : 16;
      tuning_entry_t *grown = realloc(tuning, capacity * sizeof *grown);
      if (!grown) return false;
      tuning = grown;
      tuning_capacity = capacity;
    }
    char *copy = strndup(key, key_len);
    if (!copy) return false;
    entry = &tuning[tuning_count++];
    entry->key = copy;
    *slot = tuning_count;
  }
  memcpy(entry->provider, provider, provider_len);
  entry->provider[provider_len] = '\0';
  return true;
}

/* Read tuning.tsv once. A file that does not parse line for line is dropped
 * whole: a half-trusted tuning table could pick a provider for the wrong
 * shape. The next store writes a clean one. */
static void tuning_load_locked(void) {
  if (tuning_loaded) return;
  tuning_loaded = true;
  const char *dir = cache_root();
  if (!dir) return;
  char *path = path_join(dir, "tuning.tsv", NULL);
  if (!path) return;
  struct stat st;
  int fd = open_regular(path, &st);
  FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
  if (!f) {
    if (fd >= 0) close(fd);
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
    /* Only a name a backend could list: anything else means damage. */
    const char *provider = tab + 1;
    ok = kiln__provider_find(provider) != KILN_PROVIDER_NONE &&
         tuning_put(line, (size_t)(tab - line), provider, strlen(provider));
  }
  if (first) ok = false; /* an empty file lacks even the header */
  free(line);
  fclose(f);
  if (!ok) {
    tuning_clear();
    count_one(&stat_corrupt);
    kiln__log(KILN_LOG_WARN, "tuning file %s is malformed and was ignored; it will be rewritten", path);
  }
  free(path);
}

kiln_status_t kiln__tuning_lookup(const char *key, char *out_provider, size_t size) {
  if (!key || !out_provider || !size)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "tuning lookup: key or out_provider is NULL");
  pthread_mutex_lock(&tuning_lock);
  tuning_load_locked();
  bool found = false;
  if (tuning_count) {
    size_t *slot = tuning_slot(key, strlen(key));
    if (*slot) {
      snprintf(out_provider, size, "%s", tuning[*slot - 1].provider);
      found = true;
    }
  }
  pthread_mutex_unlock(&tuning_lock);
  if (!found) {
    /* An ordinary miss (the caller measures next): the thread's last error
     * stays what it was. */
    count_one(&stat_misses);
    return KILN_NOT_FOUND;
  }
  count_one(&stat_hits);
  return KILN_OK;
}

/* tuning.log grows by a line per measurement; past this it starts afresh
 * (the previous one kept as tuning.log.old). */
#define TUNING_LOG_MAX ((off_t)1 << 20)

/* Append "key -> provider: reason" to tuning.log; failures only cost the
 * record. */
static void tuning_log_append(const char *dir, const char *key, const char *provider, const char *reason) {
  char *path = path_join(dir, "tuning.log", NULL);
  char *old = path_join(dir, "tuning.log.old", NULL);
  if (path && old) {
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size > TUNING_LOG_MAX) rename(path, old);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) {
      char line[2048];
      int n = snprintf(line, sizeof line, "%s -> %s: %.*s\n", key, provider, (int)strcspn(reason, "\n"), reason);
      if (n > 0) {
        size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
        line[len - 1] = '\n';
        if (write(fd, line, len) < 0) kiln__log(KILN_LOG_DEBUG, "could not append to %s", path);
      }
      close(fd);
    }
  }
  free(path);
  free(old);
}

void kiln__tuning_store(const char *key, const char *provider, const char *reason) {
  /* Tabs and newlines would break the line format; such keys stay unstored. */
  if (!key || !key[0] || strpbrk(key, "\t\n") || !provider || !provider[0] || strpbrk(provider, "\t\n")) return;
  pthread_mutex_lock(&tuning_lock);
  tuning_load_locked();
  bool ok = tuning_put(key, strlen(key), provider, strlen(provider));
  const char *dir = cache_root();
  if (ok && dir) {
    /* Rewrite the whole file: the table is small and the rename keeps it whole. */
    size_t total = strlen(KILN_TUNING_HEADER) + 2;
    for (size_t i = 0; i < tuning_count; i++) total += strlen(tuning[i].key) + strlen(tuning[i].provider) + 2;
    char *text = malloc(total);
    char *path = path_join(dir, "tuning.tsv", NULL);
    ok = text && path && mkdirs(dir);
    if (ok) {
      size_t used = (size_t)snprintf(text, total, "%s\n", KILN_TUNING_HEADER);
      for (size_t i = 0; i < tuning_count; i++)
        used += (size_t)snprintf(text + used, total - used, "%s\t%s\n", tuning[i].key, tuning[i].provider);
      const void *parts[] = {text};
      size_t sizes[] = {used};
      ok = write_atomically(path, parts, sizes, 1);
    }
    free(text);
    free(path);
    if (ok) count_one(&stat_stores);
    else count_one(&stat_failures);
    if (ok && reason && reason[0]) tuning_log_append(dir, key, provider, reason);
  }
  pthread_mutex_unlock(&tuning_lock);
}

void kiln__cache_reset(void) {
  pthread_mutex_lock(&tuning_lock);
  tuning_clear();
  tuning_loaded = false;
  pthread_mutex_unlock(&tuning_lock);
  /* The counters are "since start": a new start counts afresh. */
  atomic_store(&stat_hits, 0);
  atomic_store(&stat_misses, 0);
  atomic_store(&stat_stores, 0);
  atomic_store(&stat_corrupt, 0);
  atomic_store(&stat_failures, 0);
}

kiln_status_t kiln_cache_stats(kiln_cache_stats_t *out_stats) {
  if (!out_stats) return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_cache_stats: out_stats is NULL");
  out_stats->hits = atomic_load(&stat_hits);
  out_stats->misses = atomic_load(&stat_misses);
  out_stats->stores = atomic_load(&stat_stores);
  out_stats->corrupt = atomic_load(&stat_corrupt);
  out_stats->failures = atomic_load(&stat_failures);
  return KILN_OK;
}
