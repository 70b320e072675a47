/* tests/opencl/test_opencl.c: the OpenCL backend's suite: properties, transfers and copies across devices, events, the program cache, build and allocation failures. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>

#include "../common.h"
#include "runtime/backend.h"

/* The plugin's test exports (backends/opencl/program.c). */
typedef struct {
  uint64_t builds_from_source, builds_from_binary, cache_rejected;
} cl_counters_t;
typedef void (*counters_fn)(cl_counters_t *out);
typedef kiln_status_t (*build_fn)(size_t device_index, const char *program_name);

/* The loaded plugin's exports; kiln must be initialised. */
static void plugin_exports(counters_fn *out_counters, build_fn *out_build) {
  KT_OK(kiln_ensure_initialized());
  size_t count = 0;
  KT_OK(kiln_backend_count(&count));
  void *handle = NULL;
  for (size_t i = 0; i < count && !handle; i++) {
    kiln_backend_info_t info;
    KT_OK(kiln_backend_info(i, &info));
    if (!strcmp(info.name, "opencl") && info.path && info.path[0])
      handle = dlopen(info.path, RTLD_NOW | RTLD_NOLOAD);
  }
  ck_assert_msg(handle != NULL, "the OpenCL plugin is not loaded");
  *out_counters = (counters_fn)dlsym(handle, "kiln_cl_debug_counters");
  *out_build = (build_fn)dlsym(handle, "kiln_cl_debug_program_build");
  ck_assert_msg(*out_counters && *out_build, "the OpenCL plugin lacks its test exports");
  dlclose(handle); /* drops the reference NOLOAD took; the core keeps its own */
}

/* The OpenCL devices kiln sees, in order. */
static size_t opencl_devices(kiln_device_t **out, size_t capacity) {
  KT_OK(kiln_ensure_initialized());
  size_t count = 0, n = 0;
  KT_OK(kiln_device_count(&count));
  for (size_t i = 0; i < count && n < capacity; i++) {
    kiln_device_t *d = NULL;
    KT_OK(kiln_device_get(i, &d));
    kiln_device_info_t info;
    KT_OK(kiln_device_info(d, &info));
    if (!strcmp(info.backend, "opencl"))
      out[n++] = d;
    else
      kiln_device_release(d);
  }
  return n;
}

static void release_all(kiln_device_t **devices, size_t n) {
  for (size_t i = 0; i < n; i++) kiln_device_release(devices[i]);
}

static uint32_t backend_index_of(kiln_device_t *device) {
  kiln_device_info_t info;
  KT_OK(kiln_device_info(device, &info));
  return info.backend_index;
}

static const char *property(kiln_device_t *device, const char *key) {
  for (size_t i = 0; i < kiln_device_property_count(device); i++) {
    const char *k = NULL, *v = NULL;
    KT_OK(kiln_device_property(device, i, &k, &v));
    if (!strcmp(k, key)) return v;
  }
  return NULL;
}

START_TEST(test_properties) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  ck_assert_uint_gt(n, 0);
  for (size_t i = 0; i < n; i++) {
    kiln_device_info_t info;
    KT_OK(kiln_device_info(devices[i], &info));
    char selector[32];
    snprintf(selector, sizeof selector, "opencl:%u", info.backend_index);
    ck_assert_str_eq(info.selector, selector);
    ck_assert_msg(info.name[0] && info.platform[0] && info.runtime_version[0] && info.driver_version[0],
                  "%s: name '%s', platform '%s', runtime '%s', driver '%s'", selector, info.name, info.platform,
                  info.runtime_version, info.driver_version);
    ck_assert_uint_gt(info.memory_bytes, 0);
    ck_assert_uint_gt(info.max_alloc_bytes, 0);
    ck_assert_uint_le(info.max_alloc_bytes, info.memory_bytes);
    ck_assert_uint_ge(info.compute_units, 1);
    ck_assert_uint_ge(info.max_work_group_size, 1);
    ck_assert_msg(info.memory_free_is_estimate, "OpenCL cannot know free memory: it must be marked an estimate");
    ck_assert_uint_le(info.memory_free_bytes, info.memory_bytes);
    ck_assert_msg(info.type == KILN_DEVICE_CPU || info.type == KILN_DEVICE_GPU || info.type == KILN_DEVICE_ACCELERATOR ||
                      info.type == KILN_DEVICE_OTHER,
                  "type %d", (int)info.type);
    if (strstr(info.platform, "Oclgrind")) ck_assert_int_eq(info.type, KILN_DEVICE_OTHER);
    if (strstr(info.platform, "Portable Computing Language")) ck_assert_int_eq(info.type, KILN_DEVICE_CPU);
    const char *c_version = property(devices[i], "opencl_c_version");
    ck_assert_msg(c_version && !strncmp(c_version, "OpenCL C ", 9), "%s: opencl_c_version '%s'", selector,
                  c_version ? c_version : "(missing)");
    const char *providers = property(devices[i], "providers");
    ck_assert_msg(providers && !strncmp(providers, "native", 6), "providers '%s'", providers ? providers : "(missing)");
    ck_assert_ptr_nonnull(property(devices[i], "clblast"));
    /* NVIDIA's UUID in CUDA's form, so the card matches its CUDA twin. */
    if (info.uuid[0] && strstr(info.vendor, "NVIDIA")) ck_assert_msg(!strncmp(info.uuid, "GPU-", 4), "uuid %s", info.uuid);
    if (info.pci_bus_id[0]) ck_assert_uint_eq(strlen(info.pci_bus_id), 12);
    kiln_device_t *found = NULL;
    KT_OK(kiln_device_find(selector, &found));
    ck_assert_ptr_eq(found, devices[i]);
    kiln_device_release(found);
  }
  release_all(devices, n);
}
END_TEST

/* Bytes whose every position differs, so a shifted copy cannot pass. */
static void pattern(unsigned char *p, size_t n, unsigned seed) {
  uint32_t x = seed * 2654435761u + 1u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (unsigned char)(x >> 24);
  }
}

START_TEST(test_buffers) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  for (size_t d = 0; d < n; d++) {
    kiln_queue_t *q = kiln_device_default_queue(devices[d]);
    const size_t size = 1000003;
    unsigned char *in = malloc(size), *out = malloc(size);
    pattern(in, size, (unsigned)d + 1);
    kiln_buffer_t *a = NULL, *b = NULL, *empty = NULL;
    KT_OK(kiln_buffer_create(devices[d], size, &a));
    KT_OK(kiln_buffer_create(devices[d], size, &b));
    KT_OK(kiln_buffer_create(devices[d], 0, &empty));
    KT_OK(kiln_buffer_write(q, a, 0, in, size, false, 0, NULL, NULL));
    KT_OK(kiln_buffer_copy(q, a, 0, b, 0, size, 0, NULL, NULL));
    /* A fill over part of b, at an offset that is not a multiple of 4 bytes
     * of the buffer's start but is of the pattern's size. */
    const uint32_t word = 0xA5C3E1F7u;
    KT_OK(kiln_buffer_fill(q, b, 4096, 8000, &word, 4, 0, NULL, NULL));
    const unsigned char byte = 0x5A;
    KT_OK(kiln_buffer_fill(q, b, 20001, 333, &byte, 1, 0, NULL, NULL));
    /* An unaligned copy within the same buffer pair. */
    KT_OK(kiln_buffer_copy(q, a, 7, b, 100001, 50001, 0, NULL, NULL));
    KT_OK(kiln_buffer_read(q, b, 0, out, size, true, 0, NULL, NULL));
    for (size_t i = 0; i < size; i++) {
      unsigned char want = in[i];
      if (i >= 4096 && i < 4096 + 8000) want = ((const unsigned char *)&word)[(i - 4096) % 4];
      if (i >= 20001 && i < 20001 + 333) want = byte;
      if (i >= 100001 && i < 100001 + 50001) want = in[i - 100001 + 7];
      if (out[i] != want) ck_abort_msg("opencl:%u: byte %zu is %u, expected %u", backend_index_of(devices[d]), i,
                                       out[i], want);
    }
    kiln_buffer_release(a);
    kiln_buffer_release(b);
    kiln_buffer_release(empty);
    free(in);
    free(out);
  }
  release_all(devices, n);
}
END_TEST

/* src -> dst, offsets included, checked byte for byte. The size spans more
 * than one staging chunk of the plugin (8 MiB). */
static void check_copy(kiln_device_t *from, kiln_device_t *to, size_t size) {
  unsigned char *in = malloc(size), *out = malloc(size);
  ck_assert_ptr_nonnull(in);
  ck_assert_ptr_nonnull(out);
  pattern(in, size, 77);
  kiln_buffer_t *src = NULL, *dst = NULL;
  KT_OK(kiln_buffer_create(from, size + 64, &src));
  KT_OK(kiln_buffer_create(to, size + 64, &dst));
  kiln_queue_t *qs = kiln_device_default_queue(from), *qd = kiln_device_default_queue(to);
  KT_OK(kiln_buffer_write(qs, src, 13, in, size, false, 0, NULL, NULL));
  kiln_event_t *written = NULL;
  KT_OK(kiln_queue_record(qs, &written));
  /* The destination queue waits for the source's write: the core's and the
   * plugin's ordering across devices, not a blocking write, make this right. */
  KT_OK(kiln_buffer_copy(qd, src, 13, dst, 29, size, 1, &written, NULL));
  KT_OK(kiln_buffer_read(qd, dst, 29, out, size, true, 0, NULL, NULL));
  ck_assert_msg(memcmp(in, out, size) == 0, "%s -> %s: data differ", kiln_device_selector(from),
                kiln_device_selector(to));
  kiln_event_release(written);
  kiln_buffer_release(src);
  kiln_buffer_release(dst);
  free(in);
  free(out);
}

START_TEST(test_copy_with_cpu) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  kiln_device_t *cpu = NULL;
  KT_OK(kiln_device_find("cpu:0", &cpu));
  for (size_t d = 0; d < n; d++) {
    kiln_device_info_t info;
    KT_OK(kiln_device_info(devices[d], &info));
    const size_t size = strstr(info.platform, "Oclgrind") ? (3u << 20) + 5 : (9u << 20) + 5;
    check_copy(devices[d], cpu, size);
    check_copy(cpu, devices[d], size);
  }
  kiln_device_release(cpu);
  release_all(devices, n);
}
END_TEST

START_TEST(test_copy_between_platforms) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  kiln_device_t *pocl = NULL, *oclgrind = NULL;
  for (size_t d = 0; d < n; d++) {
    kiln_device_info_t info;
    KT_OK(kiln_device_info(devices[d], &info));
    if (!pocl && strstr(info.platform, "Portable Computing Language")) pocl = devices[d];
    if (!oclgrind && strstr(info.platform, "Oclgrind")) oclgrind = devices[d];
  }
  if (!pocl || !oclgrind) {
    printf("test_copy_between_platforms: skipped: PoCL and Oclgrind are not both visible (run with OCL_ICD_VENDORS "
           "registering both, as the opencl-two-platforms test does)\n");
  } else {
    check_copy(pocl, oclgrind, (9u << 20) + 3);
    check_copy(oclgrind, pocl, (9u << 20) + 3);
  }
  release_all(devices, n);
}
END_TEST

START_TEST(test_events) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  for (size_t d = 0; d < n; d++) {
    kiln_queue_t *q = NULL, *other = NULL;
    KT_OK(kiln_queue_create(devices[d], &q));
    KT_OK(kiln_queue_create(devices[d], &other));
    kiln_buffer_t *b = NULL;
    KT_OK(kiln_buffer_create(devices[d], 1 << 20, &b));
    kiln_event_t *start = NULL, *end = NULL;
    KT_OK(kiln_queue_record(q, &start));
    const uint32_t v = 7;
    KT_OK(kiln_buffer_fill(q, b, 0, 1 << 20, &v, 4, 0, NULL, NULL));
    KT_OK(kiln_queue_record(q, &end));
    /* Another queue of the device ordered after the fill, without a host wait. */
    uint32_t got[4] = {0};
    KT_OK(kiln_queue_wait(other, end));
    KT_OK(kiln_buffer_read(other, b, (1 << 20) - 16, got, 16, true, 0, NULL, NULL));
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(got[i], 7);
    KT_OK(kiln_event_wait(end));
    KT_OK(kiln_event_query(end));
    double ms = -1;
    KT_OK(kiln_event_elapsed(start, end, &ms));
    ck_assert_msg(ms >= 0.0, "elapsed %f ms", ms);
    KT_OK(kiln_queue_finish(q));
    KT_OK(kiln_queue_finish(other));
    kiln_event_release(start);
    kiln_event_release(end);
    kiln_buffer_release(b);
    kiln_queue_release(q);
    kiln_queue_release(other);
  }
  release_all(devices, n);
}
END_TEST

START_TEST(test_allocation_too_large) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  for (size_t d = 0; d < n; d++) {
    kiln_device_info_t info;
    KT_OK(kiln_device_info(devices[d], &info));
    kiln_buffer_t *b = NULL;
    KT_FAILS(kiln_buffer_create(devices[d], (size_t)info.max_alloc_bytes + 4096, &b), KILN_OUT_OF_MEMORY,
             info.selector);
    ck_assert_msg(strstr(kiln_last_error(), "bytes") != NULL, "message without the size: %s", kiln_last_error());
    KT_FAILS(kiln_buffer_create(devices[d], (size_t)info.memory_bytes * 2, &b), KILN_OUT_OF_MEMORY, info.selector);
    /* The device still works after refusing. */
    KT_OK(kiln_buffer_create(devices[d], 4096, &b));
    kiln_buffer_release(b);
  }
  release_all(devices, n);
}
END_TEST

/* ---- the program cache -------------------------------------------------------
 * Each test runs in its own process (Check forks) with its own cache
 * directory, and restarts kiln to see a second process's view: plugins stay
 * loaded across kiln_deinitialize; their counters are the current start's
 * (the plugin's context's), read before and after each build. */

static void fresh_cache_dir(const char *name, char *out, size_t size) {
  snprintf(out, size, "%s/%s-%d", getenv("KILN_CACHE_DIR"), name, (int)getpid());
  kt_remove_tree_(out);
  ck_assert_int_eq(mkdir(out, 0700), 0);
  setenv("KILN_CACHE_DIR", out, 1);
}

/* Build `program` on opencl:0 in a fresh start of kiln; returns the change of
 * the plugin's counters and (optionally) of the cache's. */
/* The backend index of the first OpenCL device in kiln's order, the one
 * build_once() builds for. */
static uint32_t first_opencl_index(void) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  ck_assert_uint_gt(n, 0);
  uint32_t index = backend_index_of(devices[0]);
  release_all(devices, n);
  return index;
}

static kiln_status_t build_once(const char *program, cl_counters_t *out_delta, kiln_cache_stats_t *out_stats) {
  kiln_deinitialize();
  counters_fn counters;
  build_fn build;
  plugin_exports(&counters, &build);
  cl_counters_t before, after;
  kiln_cache_stats_t s0, s1;
  counters(&before);
  KT_OK(kiln_cache_stats(&s0));
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  ck_assert_uint_gt(n, 0);
  kiln_status_t status = build(backend_index_of(devices[0]), program);
  release_all(devices, n);
  counters(&after);
  KT_OK(kiln_cache_stats(&s1));
  out_delta->builds_from_source = after.builds_from_source - before.builds_from_source;
  out_delta->builds_from_binary = after.builds_from_binary - before.builds_from_binary;
  out_delta->cache_rejected = after.cache_rejected - before.cache_rejected;
  if (out_stats) {
    out_stats->hits = s1.hits - s0.hits;
    out_stats->misses = s1.misses - s0.misses;
    out_stats->stores = s1.stores - s0.stores;
    out_stats->corrupt = s1.corrupt - s0.corrupt;
    out_stats->failures = s1.failures - s0.failures;
  }
  return status;
}

START_TEST(test_cache_warm_start) {
  char dir[4096];
  fresh_cache_dir("warm", dir, sizeof dir);
  cl_counters_t delta;
  kiln_cache_stats_t stats;
  KT_OK(build_once("copy", &delta, &stats));
  ck_assert_uint_eq(delta.builds_from_source, 1);
  ck_assert_uint_eq(delta.builds_from_binary, 0);
  ck_assert_uint_ge(stats.stores, 1);
  /* A second start finds the binary and compiles nothing. */
  KT_OK(build_once("copy", &delta, &stats));
  ck_assert_uint_eq(delta.builds_from_source, 0);
  ck_assert_uint_eq(delta.builds_from_binary, 1);
  ck_assert_uint_eq(delta.cache_rejected, 0);
  ck_assert_uint_ge(stats.hits, 1);
  /* Another program is another entry. */
  KT_OK(build_once("gemm", &delta, NULL));
  ck_assert_uint_eq(delta.builds_from_source, 1);
  kiln_deinitialize();
}
END_TEST

/* Truncate (or flip a byte of) every file under dir. */
static size_t damage_files(const char *dir, bool truncate_them) {
  size_t damaged = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(path, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      damaged += damage_files(path, truncate_them);
    } else if (S_ISREG(st.st_mode) && st.st_size > 16 && !strstr(e->d_name, "tuning")) {
      if (truncate_them) {
        ck_assert_int_eq(truncate(path, st.st_size / 2), 0);
      } else {
        FILE *f = fopen(path, "r+b");
        ck_assert_ptr_nonnull(f);
        fseek(f, st.st_size - 9, SEEK_SET);
        int c = fgetc(f);
        fseek(f, st.st_size - 9, SEEK_SET);
        fputc(c ^ 0x5A, f);
        fclose(f);
      }
      damaged++;
    }
  }
  closedir(d);
  return damaged;
}

static void check_damaged_entry_rebuilt(bool truncate_them) {
  char dir[4096];
  fresh_cache_dir(truncate_them ? "truncated" : "corrupt", dir, sizeof dir);
  cl_counters_t delta;
  kiln_cache_stats_t stats;
  KT_OK(build_once("copy", &delta, NULL));
  ck_assert_uint_eq(delta.builds_from_source, 1);
  kiln_deinitialize();
  ck_assert_uint_ge(damage_files(dir, truncate_them), 1);
  /* Never trusted: rebuilt from source, and stored again. */
  KT_OK(build_once("copy", &delta, &stats));
  ck_assert_uint_eq(delta.builds_from_source, 1);
  ck_assert_uint_eq(delta.builds_from_binary, 0);
  ck_assert_uint_ge(stats.corrupt, 1);
  ck_assert_uint_ge(stats.stores, 1);
  KT_OK(build_once("copy", &delta, NULL));
  ck_assert_uint_eq(delta.builds_from_source, 0);
  ck_assert_uint_eq(delta.builds_from_binary, 1);
  kiln_deinitialize();
}

START_TEST(test_cache_truncated_entry) { check_damaged_entry_rebuilt(true); }
END_TEST

START_TEST(test_cache_corrupt_entry) { check_damaged_entry_rebuilt(false); }
END_TEST

/* ---- a cached binary without the kernels it should have ---------------------- */

typedef struct blob_t {
  char *key;
  unsigned char *payload;
  uint64_t size;
} blob_t;

static uint64_t blob_fnv1a(const void *data, size_t size) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* The cache's blob layout (runtime/cache.c): magic, version, key length, key,
 * payload size, FNV-1a of the payload, payload. */
static bool blob_read(const char *path, blob_t *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char magic[8];
  uint32_t version = 0, key_len = 0;
  uint64_t checksum = 0;
  bool ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, "KILNBLOB", 8) && fread(&version, 4, 1, f) == 1 &&
            fread(&key_len, 4, 1, f) == 1 && key_len < 65536;
  out->key = ok ? calloc(1, key_len + 1) : NULL;
  ok = ok && out->key && fread(out->key, 1, key_len, f) == key_len && fread(&out->size, 8, 1, f) == 1 &&
       fread(&checksum, 8, 1, f) == 1 && out->size < ((uint64_t)1 << 30);
  out->payload = ok ? malloc(out->size ? out->size : 1) : NULL;
  ok = ok && out->payload && fread(out->payload, 1, out->size, f) == out->size;
  fclose(f);
  return ok;
}

static void blob_write(const char *path, const char *key, const unsigned char *payload, uint64_t size) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  const uint32_t version = 1, key_len = (uint32_t)strlen(key);
  const uint64_t checksum = blob_fnv1a(payload, size);
  fwrite("KILNBLOB", 1, 8, f);
  fwrite(&version, 4, 1, f);
  fwrite(&key_len, 4, 1, f);
  fwrite(key, 1, key_len, f);
  fwrite(&size, 8, 1, f);
  fwrite(&checksum, 8, 1, f);
  fwrite(payload, 1, size, f);
  ck_assert_int_eq(fclose(f), 0);
}

/* The entry of `program` in the cache's kernels folder: its path. */
static bool find_entry(const char *dir, const char *program, char *out_path, size_t size) {
  char kernels[4200], needle[64];
  snprintf(kernels, sizeof kernels, "%s/kernels", dir);
  snprintf(needle, sizeof needle, "|program=%s|", program);
  DIR *d = opendir(kernels);
  if (!d) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (snprintf(out_path, size, "%s/%s", kernels, e->d_name) >= (int)size) continue;
    blob_t b = {0};
    found = blob_read(out_path, &b) && strstr(b.key, needle);
    free(b.key);
    free(b.payload);
  }
  closedir(d);
  return found;
}

/* A binary the driver accepts but that lacks the kernels its program should
 * have (here: the elementwise program's binary under the copy program's key,
 * with a valid checksum) is evicted and rebuilt from source once: it used to
 * fail every later run with CL_INVALID_KERNEL_NAME. */
START_TEST(test_cache_binary_without_kernel) {
  char dir[4096];
  fresh_cache_dir("nokernel", dir, sizeof dir);
  cl_counters_t delta;
  KT_OK(build_once("copy", &delta, NULL));
  KT_OK(build_once("elementwise", &delta, NULL));
  kiln_deinitialize();
  char copy_path[4400], other_path[4400];
  ck_assert(find_entry(dir, "copy", copy_path, sizeof copy_path));
  ck_assert(find_entry(dir, "elementwise", other_path, sizeof other_path));
  blob_t copy = {0}, other = {0};
  ck_assert(blob_read(copy_path, &copy));
  ck_assert(blob_read(other_path, &other));
  blob_write(copy_path, copy.key, other.payload, other.size);

  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  ck_assert_uint_gt(n, 0);
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_full(devices[0], KILN_F32, 1, (const int64_t[]){5}, 2.5, &t));
  float host[5] = {0};
  KT_OK(kiln_tensor_read(t, host, sizeof host));
  for (int i = 0; i < 5; i++) ck_assert_float_eq(host[i], 2.5f);
  kiln_tensor_release(t);
  release_all(devices, n);
  /* Rebuilt and stored again: the next start takes the good binary. */
  blob_t fixed = {0};
  ck_assert(blob_read(copy_path, &fixed));
  ck_assert_str_eq(fixed.key, copy.key);
  ck_assert(fixed.size != other.size || memcmp(fixed.payload, other.payload, other.size) != 0);
  KT_OK(build_once("copy", &delta, NULL));
  ck_assert_uint_eq(delta.builds_from_source, 0);
  ck_assert_uint_eq(delta.builds_from_binary, 1);
  kiln_deinitialize();
  free(copy.key);
  free(copy.payload);
  free(other.key);
  free(other.payload);
  free(fixed.key);
  free(fixed.payload);
}
END_TEST

/* An event outlives its queue: waiting on it after the queue was released is
 * legal (the wait used to flush the freed queue: SEGV in clFlush). */
START_TEST(test_event_outlives_queue) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  ck_assert_uint_gt(n, 0);
  for (size_t d = 0; d < n; d++) {
    kiln_queue_t *q = NULL;
    KT_OK(kiln_queue_create(devices[d], &q));
    kiln_event_t *event = NULL;
    KT_OK(kiln_queue_record(q, &event));
    kiln_queue_release(q);
    /* Waited on by another queue of the same device and of every other. */
    for (size_t w = 0; w < n; w++) KT_OK(kiln_queue_wait(kiln_device_default_queue(devices[w]), event));
    KT_OK(kiln_event_wait(event));
    ck_assert_int_eq(kiln_event_query(event), KILN_OK);
    for (size_t w = 0; w < n; w++) KT_OK(kiln_queue_finish(kiln_device_default_queue(devices[w])));
    kiln_event_release(event);
  }
  release_all(devices, n);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_cache_read_only) {
  char dir[4096];
  fresh_cache_dir("readonly", dir, sizeof dir);
  ck_assert_int_eq(chmod(dir, 0500), 0);
  /* As root, permissions do not stop writes: then only "it works" holds. */
  const bool enforced = access(dir, W_OK) != 0;
  cl_counters_t delta;
  kiln_cache_stats_t stats;
  KT_OK(build_once("copy", &delta, &stats));
  ck_assert_uint_eq(delta.builds_from_source, 1);
  KT_OK(build_once("copy", &delta, &stats));
  if (enforced) {
    /* Uncached: every start builds again, and the store failures are counted. */
    ck_assert_uint_eq(delta.builds_from_source, 1);
    ck_assert_uint_eq(delta.builds_from_binary, 0);
    ck_assert_uint_ge(stats.failures, 1);
  } else {
    printf("test_cache_read_only: running as root, chmod 0500 does not stop writes; checked that builds succeed\n");
  }
  kiln_deinitialize();
  chmod(dir, 0700);
}
END_TEST

START_TEST(test_cache_two_processes) {
  char dir[4096];
  fresh_cache_dir("race", dir, sizeof dir);
  kiln_deinitialize();
  /* Two processes build and store the same entries at once; both must
   * succeed, and a third start must find a valid binary. */
  pid_t pids[2];
  for (int i = 0; i < 2; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      counters_fn counters;
      build_fn build;
      plugin_exports(&counters, &build);
      const uint32_t first = first_opencl_index();
      kiln_status_t s1 = build(first, "copy"), s2 = build(first, "elementwise");
      _exit(s1 == KILN_OK && s2 == KILN_OK ? 0 : 1);
    }
  }
  for (int i = 0; i < 2; i++) {
    int status = 0;
    ck_assert_int_eq(waitpid(pids[i], &status, 0), pids[i]);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "builder %d failed (status %d)", i, status);
  }
  cl_counters_t delta;
  KT_OK(build_once("copy", &delta, NULL));
  ck_assert_uint_eq(delta.builds_from_source, 0);
  ck_assert_uint_eq(delta.builds_from_binary, 1);
  KT_OK(build_once("elementwise", &delta, NULL));
  ck_assert_uint_eq(delta.builds_from_source, 0);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_build_failure_has_log) {
  char dir[4096];
  fresh_cache_dir("buildfail", dir, sizeof dir);
  /* An OpenCL C version no compiler knows, after kiln's own -cl-std: PoCL
   * refuses the option (CL_INVALID_BUILD_OPTIONS), clang-based compilers
   * fail the build (CL_BUILD_PROGRAM_FAILURE); both write a log. */
  setenv("KILN_OPENCL_BUILD_OPTIONS", "-cl-std=CL9.9", 1);
  cl_counters_t delta;
  kiln_status_t status = build_once("copy", &delta, NULL);
  ck_assert_msg(status == KILN_BUILD_FAILED, "status %s: %s", kiln_status_name(status), kiln_last_error());
  const char *message = kiln_last_error();
  const char *log = strstr(message, "build log:\n");
  ck_assert_msg(log && strstr(log, "CL9.9") && !strstr(log, "gave no log"), "message: %s", message);
  ck_assert_msg(strstr(message, "'copy'") != NULL, "the message does not name the program: %s", message);
  /* Kept: the next use fails the same way at once, without a second build. */
  counters_fn counters;
  build_fn build;
  plugin_exports(&counters, &build);
  cl_counters_t before, after;
  counters(&before);
  ck_assert_int_eq(build(first_opencl_index(), "copy"), KILN_BUILD_FAILED);
  counters(&after);
  ck_assert_uint_eq(after.builds_from_source, before.builds_from_source);
  unsetenv("KILN_OPENCL_BUILD_OPTIONS");
  kiln_deinitialize();
}
END_TEST

/* ---- an operation end to end (needs the native kernels of ops.c) ---------- */

START_TEST(test_add_runs) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  for (size_t d = 0; d < n; d++) {
    float a[37], b[37], out[37];
    for (int i = 0; i < 37; i++) {
      a[i] = (float)i * 0.5f;
      b[i] = 100.0f - (float)i;
    }
    const int64_t shape[1] = {37};
    kiln_tensor_t *ta = NULL, *tb = NULL, *tc = NULL;
    KT_OK(kiln_tensor_from_host(devices[d], KILN_F32, 1, shape, a, &ta));
    KT_OK(kiln_tensor_from_host(devices[d], KILN_F32, 1, shape, b, &tb));
    KT_OK(kiln_tensor_binary(KILN_BINARY_ADD, ta, tb, &tc));
    KT_OK(kiln_tensor_read(tc, out, sizeof out));
    for (int i = 0; i < 37; i++) ck_assert_float_eq(out[i], a[i] + b[i]);
    kiln_tensor_release(ta);
    kiln_tensor_release(tb);
    kiln_tensor_release(tc);
  }
  release_all(devices, n);
}
END_TEST

/* CAST both ways, from a transposed view (the strided walk) and from a
 * contiguous tensor (the flat path): f32 -> i32 truncates toward zero, NaN
 * becomes 0, out of range saturates; i32 -> f32 rounds to nearest even. */
START_TEST(test_cast_runs) {
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  const float f[8] = {1.5f, -1.5f, NAN, 3e9f, -3e9f, -0.7f, 2147483520.0f, 123456.9f};
  const int32_t f_as_i[8] = {1, -1, 0, INT32_MAX, INT32_MIN, 0, 2147483520, 123456};
  /* 16777217 and -16777219 are ties between two floats: the even one wins. */
  const int32_t i[8] = {16777217, -16777219, INT32_MAX, INT32_MIN, 0, -5, 33554435, 7};
  const float i_as_f[8] = {16777216.0f, -16777220.0f, 2147483648.0f, -2147483648.0f, 0.0f, -5.0f, 33554436.0f, 7.0f};
  const int64_t shape[2] = {2, 4};
  for (size_t d = 0; d < n; d++) {
    kiln_tensor_t *tf = NULL, *ti = NULL, *tf_t = NULL, *ti_t = NULL, *out = NULL;
    KT_OK(kiln_tensor_from_host(devices[d], KILN_F32, 2, shape, f, &tf));
    KT_OK(kiln_tensor_from_host(devices[d], KILN_I32, 2, shape, i, &ti));
    KT_OK(kiln_tensor_transpose(tf, 0, 1, &tf_t));
    KT_OK(kiln_tensor_transpose(ti, 0, 1, &ti_t));
    int32_t got_i[8];
    float got_f[8];
    KT_OK(kiln_tensor_cast(tf, KILN_I32, &out));
    KT_OK(kiln_tensor_read(out, got_i, sizeof got_i));
    kiln_tensor_release(out);
    for (int k = 0; k < 8; k++) ck_assert_msg(got_i[k] == f_as_i[k], "%s: (i32)%g is %d, expected %d",
                                              kiln_device_selector(devices[d]), (double)f[k], got_i[k], f_as_i[k]);
    KT_OK(kiln_tensor_cast(tf_t, KILN_I32, &out));
    KT_OK(kiln_tensor_read(out, got_i, sizeof got_i));
    kiln_tensor_release(out);
    /* out[r][c] of the [4, 2] transpose is in[c][r]. */
    for (int k = 0; k < 8; k++) ck_assert_int_eq(got_i[k], f_as_i[(k % 2) * 4 + k / 2]);
    KT_OK(kiln_tensor_cast(ti, KILN_F32, &out));
    KT_OK(kiln_tensor_read(out, got_f, sizeof got_f));
    kiln_tensor_release(out);
    for (int k = 0; k < 8; k++) ck_assert_msg(got_f[k] == i_as_f[k], "%s: (f32)%d is %.1f, expected %.1f",
                                              kiln_device_selector(devices[d]), i[k], (double)got_f[k],
                                              (double)i_as_f[k]);
    KT_OK(kiln_tensor_cast(ti_t, KILN_F32, &out));
    KT_OK(kiln_tensor_read(out, got_f, sizeof got_f));
    kiln_tensor_release(out);
    for (int k = 0; k < 8; k++) ck_assert_float_eq(got_f[k], i_as_f[(k % 2) * 4 + k / 2]);
    kiln_tensor_release(tf_t);
    kiln_tensor_release(ti_t);
    kiln_tensor_release(tf);
    kiln_tensor_release(ti);
  }
  release_all(devices, n);
}
END_TEST

/* ---- the plugin's interface, driven directly ---------------------------------
 * The slots the core reaches only on some machines (pinned staging is for
 * copies between two plugins, e.g. CUDA <-> OpenCL), called through the entry
 * point with a host table of the test's own. kiln itself is not started. */

static kiln_status_t direct_set_error(kiln_status_t status, const char *fmt, ...) {
  (void)fmt;
  return status;
}
static const char *direct_last_error(void) { return ""; }
static void direct_log(kiln_log_level_t level, const char *fmt, ...) { (void)level, (void)fmt; }
static kiln_log_level_t direct_log_level(void) { return KILN_LOG_OFF; }

static const kiln_backend_iface_t *direct_plugin(void) {
  const char *path = getenv("KILN_BACKEND_PATH");
  ck_assert_ptr_nonnull(path);
  char dirs[4096];
  snprintf(dirs, sizeof dirs, "%s", path);
  for (char *dir = strtok(dirs, ":"); dir; dir = strtok(NULL, ":")) {
    char file[4200];
    snprintf(file, sizeof file, "%s/libkiln-opencl.so", dir);
    void *handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!handle) continue;
    kiln_backend_entry_fn entry = (kiln_backend_entry_fn)dlsym(handle, KILN_BACKEND_ENTRY_SYMBOL);
    ck_assert_ptr_nonnull(entry);
    return entry();
  }
  ck_abort_msg("libkiln-opencl.so not found in KILN_BACKEND_PATH=%s", path);
  return NULL;
}

START_TEST(test_interface_direct) {
  const kiln_backend_iface_t *cl = direct_plugin();
  ck_assert_uint_eq(cl->abi_version, KILN_BACKEND_ABI_VERSION);
  ck_assert_uint_eq(cl->size, sizeof(kiln_backend_iface_t));
  ck_assert_str_eq(cl->name, "opencl");
  /* The table of operations: a native row for every kind, up to the row
   * that ends it (run NULL). */
  for (int kind = 0; kind < KILN_OP_COUNT; kind++) {
    bool native = false;
    for (const kiln_op_entry_t *row = cl->ops; row->run; row++)
      if ((int)row->kind == kind && !strcmp(row->provider, KILN_PROVIDER_NATIVE_NAME)) native = true;
    ck_assert_msg(native, "no native row for %s", kiln_backend_op_kind_name((kiln_op_kind_t)kind));
  }
  kiln_host_t host = {.size = sizeof(kiln_host_t), .set_error = direct_set_error, .last_error = direct_last_error,
                      .log = direct_log, .log_level = direct_log_level};
  kiln_backend_context_t *ctx = NULL;
  ck_assert_int_eq(cl->initialize(&host, &ctx), KILN_OK);
  ck_assert_ptr_nonnull(ctx);
  const size_t count = cl->device_count(ctx);
  ck_assert_uint_gt(count, 0);
  kiln_backend_device_desc_t *desc = calloc(count, sizeof *desc);
  kiln_backend_queue_t **queues = calloc(count, sizeof *queues);
  kiln_backend_buffer_t **buffers = calloc(count, sizeof *buffers);
  const size_t size = (1u << 20) + 12;
  unsigned char *expect = malloc(size), *got = malloc(size);
  pattern(expect, size, 5);
  for (size_t i = 0; i < count; i++) {
    ck_assert_int_eq(cl->device_describe(ctx, i, &desc[i]), KILN_OK);
    /* An OpenCL CPU device is listed after the host's own cpu backend. */
    ck_assert_int_eq(desc[i].order, desc[i].type == KILN_DEVICE_CPU ? 1 : 0);
    /* A vendor row (clblast) serves the device exactly when the device's
     * "providers" property names it. */
    const char *providers = "";
    for (size_t p = 0; p < desc[i].property_count; p++)
      if (!strcmp(desc[i].properties[p].key, "providers")) providers = desc[i].properties[p].value;
    for (const kiln_op_entry_t *row = cl->ops; row->run; row++)
      if (row->supports)
        ck_assert_msg(row->supports(ctx, desc[i].impl, row, NULL) == (strstr(providers, row->provider) != NULL),
                      "opencl:%zu: row '%s' of %s against providers '%s'", i, row->provider,
                      kiln_backend_op_kind_name(row->kind), providers);
    ck_assert_int_eq(cl->queue_create(ctx, desc[i].impl, &queues[i]), KILN_OK);
    ck_assert_int_eq(cl->buffer_allocate(ctx, desc[i].impl, size, &buffers[i]), KILN_OK);
    kiln_backend_buffer_t *empty = NULL;
    ck_assert_int_eq(cl->buffer_allocate(ctx, desc[i].impl, 0, &empty), KILN_OK);
    cl->buffer_free(ctx, desc[i].impl, empty);
    /* Pinned staging, written by the host, then sent and read back. */
    unsigned char *pinned = NULL;
    ck_assert_int_eq(cl->host_allocate(ctx, desc[i].impl, size, (void **)&pinned), KILN_OK);
    memcpy(pinned, expect, size);
    ck_assert_int_eq(cl->buffer_write(ctx, queues[i], buffers[i], 0, pinned, size, false), KILN_OK);
    /* A 4-byte pattern at an offset OpenCL's fill cannot take (2 mod 4). */
    const uint32_t word = 0x01020304u;
    ck_assert_int_eq(cl->buffer_fill(ctx, queues[i], buffers[i], 1002, 400, &word, 4), KILN_OK);
    for (size_t j = 0; j < 400; j++) expect[1002 + j] = ((const unsigned char *)&word)[j % 4];
    kiln_backend_event_t *start = NULL, *end = NULL;
    ck_assert_int_eq(cl->queue_record(ctx, queues[i], &start), KILN_OK);
    ck_assert_int_eq(cl->buffer_read(ctx, queues[i], buffers[i], 0, got, size, false), KILN_OK);
    ck_assert_int_eq(cl->queue_record(ctx, queues[i], &end), KILN_OK);
    ck_assert_int_eq(cl->queue_finish(ctx, queues[i]), KILN_OK);
    ck_assert_int_eq(cl->event_query(ctx, end), KILN_OK);
    double ms = -1;
    ck_assert_int_eq(cl->event_elapsed(ctx, start, end, &ms), KILN_OK);
    ck_assert(ms >= 0);
    ck_assert_msg(memcmp(expect, got, size) == 0, "opencl:%zu: pinned write, fill and read differ", i);
    cl->event_release(ctx, start);
    cl->event_release(ctx, end);
    cl->host_free(ctx, desc[i].impl, pinned);
    /* Too large for the device: refused up front. */
    kiln_backend_buffer_t *huge = NULL;
    ck_assert_int_eq(cl->buffer_allocate(ctx, desc[i].impl, (size_t)desc[i].max_alloc_bytes + 1, &huge),
                     KILN_OUT_OF_MEMORY);
  }
  /* Device to device through the plugin's own copy (staged across contexts). */
  for (size_t i = 0; i + 1 < count; i++) {
    ck_assert_int_eq(cl->buffer_copy(ctx, queues[i + 1], buffers[i], 3, buffers[i + 1], 5, size - 8), KILN_OK);
    ck_assert_int_eq(cl->buffer_read(ctx, queues[i + 1], buffers[i + 1], 5, got, size - 8, true), KILN_OK);
    ck_assert_msg(memcmp(expect + 3, got, size - 8) == 0, "opencl:%zu -> opencl:%zu differ", i, i + 1);
  }
  for (size_t i = 0; i < count; i++) {
    cl->buffer_free(ctx, desc[i].impl, buffers[i]);
    cl->queue_destroy(ctx, queues[i]);
  }
  cl->deinitialize(ctx);
  free(desc);
  free(queues);
  free(buffers);
  free(expect);
  free(got);
}
END_TEST

/* ---- enumeration that meets a failing platform -------------------------- */

static char log_seen[4096];

static void capture_log(kiln_log_level_t level, const char *message, void *user) {
  (void)level, (void)user;
  size_t used = strlen(log_seen);
  snprintf(log_seen + used, sizeof log_seen - used, "%s\n", message);
}

START_TEST(test_broken_platform_skipped) {
  if (!getenv("KILN_TEST_BROKEN_PLATFORM")) {
    printf("test_broken_platform_skipped: skipped: needs OCL_ICD_VENDORS with the broken test platform (the "
           "opencl-broken-platform test sets it)\n");
    return;
  }
  kiln_log_set_callback(capture_log, NULL);
  kiln_log_set_level(KILN_LOG_WARN);
  kiln_device_t *devices[16];
  size_t n = opencl_devices(devices, 16);
  /* The system's devices are all there, and the skip was said, with the
   * platform's name and OpenCL's error. */
  ck_assert_uint_ge(n, 1);
  ck_assert_msg(strstr(log_seen, "kiln broken test platform") && strstr(log_seen, "CL_OUT_OF_HOST_MEMORY"),
                "log: %s", log_seen);
  size_t count = 0;
  KT_OK(kiln_backend_count(&count));
  for (size_t i = 0; i < count; i++) {
    kiln_backend_info_t info;
    KT_OK(kiln_backend_info(i, &info));
    if (!strcmp(info.name, "opencl")) ck_assert_int_eq(info.state, KILN_BACKEND_LOADED);
  }
  release_all(devices, n);
  kiln_log_set_callback(NULL, NULL);
}
END_TEST

/* Whether kiln sees an OpenCL device, asked in a child so this process starts
 * kiln fresh in every test. */
static bool opencl_visible(char *why, size_t size) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    char reason[512] = "no OpenCL device is visible";
    kiln_status_t status = kiln_ensure_initialized();
    size_t count = 0, found = 0;
    if (status == KILN_OK && kiln_backend_count(&count) == KILN_OK) {
      for (size_t i = 0; i < count; i++) {
        kiln_backend_info_t info;
        if (kiln_backend_info(i, &info) != KILN_OK || strcmp(info.name, "opencl")) continue;
        if (info.state == KILN_BACKEND_LOADED) found = 1;
        snprintf(reason, sizeof reason, "the OpenCL backend is %s: %s", kiln_backend_state_name(info.state),
                 info.reason && info.reason[0] ? info.reason : "no reason given");
      }
    } else {
      snprintf(reason, sizeof reason, "kiln did not start: %s", kiln_last_error());
    }
    if (write(fds[1], reason, strlen(reason) + 1) < 0) _exit(2);
    _exit(found ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], why, size - 1);
  why[got > 0 ? got : 0] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* OCL_ICD_VENDORS naming an empty directory: the loader finds no platform.
 * The backend must load with no device and say so, not fail kiln. */
/* Without an OpenCL platform: named in KILN_BACKEND, the backend is an error
 * that says why (running on the CPU instead would be the wrong device);
 * left to the default, it is skipped quietly with the same reason. */
static int check_no_platform(void) {
  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_UNAVAILABLE || !strstr(kiln_last_error(), "backend 'opencl' named in KILN_BACKEND cannot be used") ||
      !strstr(kiln_last_error(), "no OpenCL platform")) {
    printf("FAIL: KILN_BACKEND=%s without an OpenCL platform gave %s: %s\n", getenv("KILN_BACKEND"),
           kiln_status_name(status), kiln_last_error());
    return 1;
  }
  printf("ok: named, it is an error: %s\n", kiln_last_error());
  kiln_deinitialize();
  unsetenv("KILN_BACKEND");
  status = kiln_ensure_initialized();
  if (status != KILN_OK) {
    printf("FAIL: kiln did not start from the default backends without an OpenCL platform: %s\n", kiln_last_error());
    return 1;
  }
  size_t count = 0;
  if (kiln_backend_count(&count) != KILN_OK) return 1;
  for (size_t i = 0; i < count; i++) {
    kiln_backend_info_t info;
    if (kiln_backend_info(i, &info) != KILN_OK || strcmp(info.name, "opencl")) continue;
    const bool ok = info.state == KILN_BACKEND_NO_DEVICE && info.reason && strstr(info.reason, "no OpenCL platform");
    printf("%s: by default, opencl is %s: %s\n", ok ? "ok" : "FAIL", kiln_backend_state_name(info.state),
           info.reason ? info.reason : "(no reason)");
    kiln_deinitialize();
    return ok ? 0 : 1;
  }
  printf("FAIL: no opencl backend among kiln's default backends\n");
  return 1;
}

int main(void) {
  const char *cache_dir = kt_private_cache_dir();
  /* PoCL keeps its own kernel cache (under $HOME by default): keep it in the
   * private directory too, so the suite writes nothing outside it. */
  if (cache_dir && !getenv("POCL_CACHE_DIR")) {
    char pocl[4200];
    snprintf(pocl, sizeof pocl, "%s/pocl", cache_dir);
    setenv("POCL_CACHE_DIR", pocl, 1);
  }
  if (getenv("KILN_TEST_NO_PLATFORM")) return check_no_platform();
  char why[512];
  if (!opencl_visible(why, sizeof why)) {
    printf("skipped: %s\n", why);
    return 77;
  }
  Suite *suite = suite_create("opencl");
  TCase *devices = tcase_create("devices");
  tcase_set_timeout(devices, 300);
  tcase_add_test(devices, test_properties);
  tcase_add_test(devices, test_buffers);
  tcase_add_test(devices, test_copy_with_cpu);
  tcase_add_test(devices, test_copy_between_platforms);
  tcase_add_test(devices, test_events);
  tcase_add_test(devices, test_allocation_too_large);
  tcase_add_test(devices, test_interface_direct);
  tcase_add_test(devices, test_event_outlives_queue);
  suite_add_tcase(suite, devices);
  TCase *platforms = tcase_create("platforms");
  tcase_add_test(platforms, test_broken_platform_skipped);
  suite_add_tcase(suite, platforms);
  TCase *cache = tcase_create("cache");
  tcase_set_timeout(cache, 300);
  tcase_add_test(cache, test_cache_warm_start);
  tcase_add_test(cache, test_cache_truncated_entry);
  tcase_add_test(cache, test_cache_corrupt_entry);
  tcase_add_test(cache, test_cache_read_only);
  tcase_add_test(cache, test_cache_two_processes);
  tcase_add_test(cache, test_build_failure_has_log);
  tcase_add_test(cache, test_cache_binary_without_kernel);
  suite_add_tcase(suite, cache);
  TCase *ops = tcase_create("ops");
  tcase_set_timeout(ops, 300);
  tcase_add_test(ops, test_add_runs);
  tcase_add_test(ops, test_cast_runs);
  suite_add_tcase(suite, ops);
  return kt_run_suite(suite);
}
