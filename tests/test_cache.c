/* tests/test_cache.c: the on-disk blob cache and tuning store: round trips, corruption, read-only dirs, concurrent writers. */
#include <fcntl.h>
#include <sys/wait.h>

#include "common.h"
#include "runtime/internal.h"

static char kt_root[4096];

/* Start kiln (CPU only) with its cache in a folder below the private one
 * (made first, in case a test removed it). */
static const char *kt_start(const char *name) {
  mkdir(kt_root, 0700);
  static char dir[4200];
  snprintf(dir, sizeof dir, "%s/%s", kt_root, name);
  setenv("KILN_CACHE_DIR", dir, 1);
  setenv("KILN_BACKEND", "cpu", 1);
  ck_assert_msg(kiln_ensure_initialized() == KILN_OK, "%s", kiln_last_error());
  ck_assert_str_eq(kiln_cache_dir(), dir);
  return dir;
}

static kiln_cache_stats_t kt_stats(void) {
  kiln_cache_stats_t s;
  KT_OK(kiln_cache_stats(&s));
  return s;
}

/* The file a key is stored in: <dir>/kernels/<16 hex digits of FNV-1a 64>. */
static void kt_blob_path(const char *dir, const char *key, char *out, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  snprintf(out, size, "%s/kernels/%016llx", dir, (unsigned long long)h);
}

static long kt_file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

START_TEST(test_round_trip) {
  const char *dir = kt_start("round");
  kiln_cache_stats_t s0 = kt_stats();
  void *data = NULL;
  size_t size = 0;
  KT_FAILS(kiln__cache_load("platform|device|driver|hash|opts", &data, &size), KILN_NOT_FOUND, "no cache entry");
  ck_assert_uint_eq(kt_stats().misses, s0.misses + 1);

  const char payload[] = "compiled kernel binary \x01\x02\x00 with a zero";
  kiln__cache_store("platform|device|driver|hash|opts", payload, sizeof payload);
  ck_assert_uint_eq(kt_stats().stores, s0.stores + 1);
  KT_OK(kiln__cache_load("platform|device|driver|hash|opts", &data, &size));
  ck_assert_uint_eq(size, sizeof payload);
  ck_assert_mem_eq(data, payload, sizeof payload);
  free(data);
  ck_assert_uint_eq(kt_stats().hits, s0.hits + 1);

  /* The file has the documented name, and no temporary is left behind. */
  char path[4400];
  kt_blob_path(dir, "platform|device|driver|hash|opts", path, sizeof path);
  ck_assert_int_gt(kt_file_size(path), (long)sizeof payload);
  char kernels[4300];
  snprintf(kernels, sizeof kernels, "%s/kernels", dir);
  DIR *d = opendir(kernels);
  ck_assert_ptr_nonnull(d);
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') files++;
  closedir(d);
  ck_assert_int_eq(files, 1);

  /* An empty payload is an entry too; a rewrite replaces the old one. */
  kiln__cache_store("empty", "", 0);
  KT_OK(kiln__cache_load("empty", &data, &size));
  ck_assert_uint_eq(size, 0);
  free(data);
  kiln__cache_store("platform|device|driver|hash|opts", "v2", 2);
  KT_OK(kiln__cache_load("platform|device|driver|hash|opts", &data, &size));
  ck_assert_uint_eq(size, 2);
  ck_assert_mem_eq(data, "v2", 2);
  free(data);
  kiln_deinitialize();
}
END_TEST

/* Damage an entry in one way and check that it is refused and counted. */
static void kt_damaged(const char *name, void (*damage)(const char *path)) {
  const char *dir = kt_start(name);
  const char payload[] = "0123456789abcdef0123456789abcdef";
  kiln__cache_store("key-one", payload, sizeof payload);
  char path[4400];
  kt_blob_path(dir, "key-one", path, sizeof path);
  damage(path);
  kiln_cache_stats_t s0 = kt_stats();
  void *data = (void *)0x1;
  size_t size = 77;
  KT_FAILS(kiln__cache_load("key-one", &data, &size), KILN_NOT_FOUND, "is invalid");
  ck_assert_ptr_eq(data, (void *)0x1);
  ck_assert_uint_eq(size, 77);
  ck_assert_uint_eq(kt_stats().corrupt, s0.corrupt + 1);
  ck_assert_uint_eq(kt_stats().hits, s0.hits);
  /* Storing again repairs it. */
  kiln__cache_store("key-one", payload, sizeof payload);
  KT_OK(kiln__cache_load("key-one", &data, &size));
  ck_assert_uint_eq(size, sizeof payload);
  free(data);
  kiln_deinitialize();
}

static void kt_truncate(const char *path) { ck_assert_int_eq(truncate(path, kt_file_size(path) - 5), 0); }
static void kt_truncate_header(const char *path) { ck_assert_int_eq(truncate(path, 6), 0); }
static void kt_flip_payload(const char *path) {
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  off_t end = lseek(fd, 0, SEEK_END);
  unsigned char byte;
  ck_assert_int_eq(pread(fd, &byte, 1, end - 3), 1);
  byte ^= 0x40;
  ck_assert_int_eq(pwrite(fd, &byte, 1, end - 3), 1);
  close(fd);
}
static void kt_bad_magic(const char *path) {
  int fd = open(path, O_RDWR);
  ck_assert_int_eq(pwrite(fd, "JUNK", 4, 0), 4);
  close(fd);
}
static void kt_bad_version(const char *path) {
  int fd = open(path, O_RDWR);
  uint32_t version = 77;
  ck_assert_int_eq(pwrite(fd, &version, 4, 8), 4);
  close(fd);
}
static void kt_other_key(const char *path) {
  /* Same length, another key: what a hash collision looks like on disk. */
  int fd = open(path, O_RDWR);
  ck_assert_int_eq(pwrite(fd, "KEY", 3, 16), 3);
  close(fd);
}
static void kt_appended(const char *path) {
  int fd = open(path, O_WRONLY | O_APPEND);
  ck_assert_int_eq(write(fd, "extra", 5), 5);
  close(fd);
}

START_TEST(test_truncated) { kt_damaged("truncated", kt_truncate); }
END_TEST
START_TEST(test_truncated_header) { kt_damaged("short", kt_truncate_header); }
END_TEST
START_TEST(test_checksum) { kt_damaged("checksum", kt_flip_payload); }
END_TEST
START_TEST(test_magic) { kt_damaged("magic", kt_bad_magic); }
END_TEST
START_TEST(test_version) { kt_damaged("version", kt_bad_version); }
END_TEST
START_TEST(test_key_differs) { kt_damaged("key", kt_other_key); }
END_TEST
START_TEST(test_trailing_bytes) { kt_damaged("trailing", kt_appended); }
END_TEST

START_TEST(test_unwritable_dir) {
  /* A cache folder below a regular file cannot be created, not even by
   * root: kiln runs uncached and counts the failures. */
  char file[4200];
  mkdir(kt_root, 0700);
  snprintf(file, sizeof file, "%s/plainfile", kt_root);
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  kt_start("plainfile/cache");
  kiln_cache_stats_t s0 = kt_stats();
  kiln__cache_store("k", "data", 4);
  kiln__tuning_store("dev|matmul|f32|64x64x64", "blas", NULL);
  kiln_cache_stats_t s1 = kt_stats();
  ck_assert_uint_eq(s1.failures, s0.failures + 2);
  ck_assert_uint_eq(s1.stores, s0.stores);
  void *data;
  size_t size;
  KT_FAILS(kiln__cache_load("k", &data, &size), KILN_NOT_FOUND, "no cache entry");
  /* The tuning result still holds for this run, in memory. */
  char p[32];
  KT_OK(kiln__tuning_lookup("dev|matmul|f32|64x64x64", p, sizeof p));
  ck_assert_str_eq(p, "blas");
  kiln_deinitialize();
}
END_TEST

START_TEST(test_no_cache_dir) {
  unsetenv("KILN_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  setenv("KILN_BACKEND", "cpu", 1);
  KT_OK(kiln_ensure_initialized());
  ck_assert_ptr_null(kiln_cache_dir());
  kiln__cache_store("k", "data", 4);
  kiln_cache_stats_t s = kt_stats();
  ck_assert_uint_eq(s.stores, 0);
  ck_assert_uint_eq(s.failures, 0);
  void *data;
  size_t size;
  KT_FAILS(kiln__cache_load("k", &data, &size), KILN_NOT_FOUND, "no cache entry");
  ck_assert_uint_eq(kt_stats().misses, 1);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_two_writers) {
  const char *dir = kt_start("race");
  static char payload[256 * 1024];
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (char)(i * 7 + 3);
  /* Both children store the same entry many times at once; every store must
   * succeed and the entry must stay whole throughout. */
  pid_t children[2];
  for (int c = 0; c < 2; c++) {
    children[c] = fork();
    ck_assert_int_ge(children[c], 0);
    if (children[c] == 0) {
      int bad = 0;
      for (int round = 0; round < 40; round++) {
        kiln_cache_stats_t before;
        kiln_cache_stats(&before);
        kiln__cache_store("shared-entry", payload, sizeof payload);
        kiln_cache_stats_t after;
        kiln_cache_stats(&after);
        if (after.stores != before.stores + 1 || after.failures != before.failures) bad = 1;
        void *data;
        size_t size;
        if (kiln__cache_load("shared-entry", &data, &size) != KILN_OK) bad = 1;
        else {
          if (size != sizeof payload || memcmp(data, payload, size)) bad = 1;
          free(data);
        }
      }
      _exit(bad);
    }
  }
  for (int c = 0; c < 2; c++) {
    int status = 0;
    ck_assert_int_eq(waitpid(children[c], &status, 0), children[c]);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d saw a failed store or a bad entry", c);
  }
  void *data;
  size_t size;
  KT_OK(kiln__cache_load("shared-entry", &data, &size));
  ck_assert_uint_eq(size, sizeof payload);
  ck_assert_mem_eq(data, payload, size);
  free(data);
  /* Nothing but the entry itself is left in the folder. */
  char kernels[4300];
  snprintf(kernels, sizeof kernels, "%s/kernels", dir);
  DIR *d = opendir(kernels);
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') files++;
  closedir(d);
  ck_assert_int_eq(files, 1);
  kiln_deinitialize();
}
END_TEST

static void kt_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static char *kt_read_file(const char *path) {
  static char text[8192];
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

/* A miss is ordinary: KILN_NOT_FOUND, nothing written to *out, and the
 * thread's last error left as it was (an earlier one survives). */
static void kt_tuning_miss(const char *key) {
  kiln_clear_error();
  char p[32] = "untouched";
  ck_assert_int_eq(kiln__tuning_lookup(key, p, sizeof p), KILN_NOT_FOUND);
  ck_assert_str_eq(p, "untouched");
  ck_assert_str_eq(kiln_last_error(), "");
  ck_assert_int_eq(kiln_last_status(), KILN_OK);

  ck_assert_int_eq(kiln_cache_stats(NULL), KILN_INVALID_ARGUMENT);
  char earlier[256];
  snprintf(earlier, sizeof earlier, "%s", kiln_last_error());
  ck_assert_int_eq(kiln__tuning_lookup(key, p, sizeof p), KILN_NOT_FOUND);
  ck_assert_str_eq(kiln_last_error(), earlier);
  ck_assert_int_eq(kiln_last_status(), KILN_INVALID_ARGUMENT);
  kiln_clear_error();
}

START_TEST(test_tuning_round_trip) {
  const char *dir = kt_start("tuning");
  char path[4300];
  snprintf(path, sizeof path, "%s/tuning.tsv", dir);
  char p[32];
  kt_tuning_miss("cpu:0|matmul|f32|128x128x128");
  ck_assert_uint_eq(kt_stats().misses, 2);
  /* Bad arguments are errors, with a message. */
  KT_FAILS(kiln__tuning_lookup(NULL, p, sizeof p), KILN_INVALID_ARGUMENT, "key or out_provider is NULL");
  KT_FAILS(kiln__tuning_lookup("k", NULL, 0), KILN_INVALID_ARGUMENT, "key or out_provider is NULL");
  kiln__tuning_store("cpu:0|matmul|f32|128x128x128", "blas", NULL);
  kiln__tuning_store("cpu:0|conv2d|f32|1x3x8x8", "native", NULL);
  kiln__tuning_store("cpu:0|matmul|f32|128x128x128", "native", NULL); /* replaces */
  ck_assert_str_eq(kt_read_file(path),
                   "kiln-tuning 1\ncpu:0|matmul|f32|128x128x128\tnative\ncpu:0|conv2d|f32|1x3x8x8\tnative\n");
  kiln_deinitialize();

  /* A new start reads the file back. */
  kt_start("tuning");
  KT_OK(kiln__tuning_lookup("cpu:0|conv2d|f32|1x3x8x8", p, sizeof p));
  ck_assert_str_eq(p, "native");
  KT_OK(kiln__tuning_lookup("cpu:0|matmul|f32|128x128x128", p, sizeof p));
  ck_assert_str_eq(p, "native");
  ck_assert_uint_eq(kt_stats().hits, 2);
  ck_assert_uint_eq(kt_stats().corrupt, 0);
  kiln_deinitialize();
}
END_TEST

/* Malformed tuning files: each is ignored whole, counted, and rewritten by
 * the next store. */
static const char *const kt_bad_tuning[] = {
    "",
    "kiln-tuning 2\nk\tnative\n",
    "kiln-tuning 1\nk native\n",
    "kiln-tuning 1\nk\tfastest\n",
    "kiln-tuning 1\ngood\tblas\nbad\n",
    "kiln-tuning 1\n\tblas\n",
    "kiln-tuning 1\nk\tblas\textra\n",
    "\x7f" "ELF garbage",
};

START_TEST(test_tuning_corrupt) {
  char name[32];
  snprintf(name, sizeof name, "tuning-bad-%d", _i);
  const char *dir = kt_start(name);
  char path[4300];
  snprintf(path, sizeof path, "%s/tuning.tsv", dir);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  kt_write_file(path, kt_bad_tuning[_i]);
  kt_tuning_miss("good");
  ck_assert_uint_eq(kt_stats().corrupt, 1);
  /* Counted once, not at every lookup. */
  kt_tuning_miss("k");
  ck_assert_uint_eq(kt_stats().corrupt, 1);
  kiln__tuning_store("fresh", "cudnn", NULL);
  ck_assert_str_eq(kt_read_file(path), "kiln-tuning 1\nfresh\tcudnn\n");
  kiln_deinitialize();
}
END_TEST

START_TEST(test_stats_argument) {
  KT_FAILS(kiln_cache_stats(NULL), KILN_INVALID_ARGUMENT, "out_stats is NULL");
}
END_TEST

/* Faults of the machine, each a regression test. */

/* A FIFO where an entry or tuning.tsv should be hangs nothing: it is counted,
 * removed, and the cache works on (the store writes a real file). */
START_TEST(test_fifo_entries) {
  const char *dir = kt_start("fifo");
  char path[4400], kernels[4300];
  snprintf(kernels, sizeof kernels, "%s/kernels", dir);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  ck_assert_int_eq(mkdir(kernels, 0700), 0);
  kt_blob_path(dir, "fifo-key", path, sizeof path);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  kiln_cache_stats_t s0 = kt_stats();
  void *data = NULL;
  size_t size = 0;
  KT_FAILS(kiln__cache_load("fifo-key", &data, &size), KILN_NOT_FOUND, "no cache entry");
  ck_assert_uint_eq(kt_stats().corrupt, s0.corrupt + 1);
  kiln__cache_store("fifo-key", "abc", 3);
  KT_OK(kiln__cache_load("fifo-key", &data, &size));
  ck_assert_uint_eq(size, 3);
  free(data);

  char tuning[4400];
  snprintf(tuning, sizeof tuning, "%s/tuning.tsv", dir);
  kiln_deinitialize();
  ck_assert_int_eq(mkfifo(tuning, 0600), 0);
  kt_start("fifo");
  char p[32] = "";
  ck_assert_int_eq(kiln__tuning_lookup("k", p, sizeof p), KILN_NOT_FOUND);
  ck_assert_uint_eq(kt_stats().corrupt, 1);
  kiln__tuning_store("k", "native", NULL);
  ck_assert_str_eq(kt_read_file(tuning), "kiln-tuning 1\nk\tnative\n");
  kiln_deinitialize();
}
END_TEST

/* A huge corrupt entry is refused from its header: a sparse terabyte whose
 * header is right but whose size is not is never read whole. */
START_TEST(test_huge_entry_header_first) {
  const char *dir = kt_start("huge");
  kiln__cache_store("huge-key", "x", 1);
  char path[4400];
  kt_blob_path(dir, "huge-key", path, sizeof path);
  ck_assert_int_eq(truncate(path, (off_t)1 << 40), 0);
  kiln_cache_stats_t s0 = kt_stats();
  void *data = NULL;
  size_t size = 0;
  KT_FAILS(kiln__cache_load("huge-key", &data, &size), KILN_NOT_FOUND, "payload size differs from the file");
  ck_assert_uint_eq(kt_stats().corrupt, s0.corrupt + 1);
  unlink(path);
  kiln_deinitialize();
}
END_TEST

/* Temporaries of writers killed mid-store are swept at the next start;
 * those of a live writer stay. */
START_TEST(test_stale_temporaries_swept) {
  const char *dir = kt_start("sweep");
  kiln__cache_store("sweep-key", "x", 1);
  char entry[4400];
  kt_blob_path(dir, "sweep-key", entry, sizeof entry);
  kiln_deinitialize();
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) _exit(0);
  ck_assert_int_eq(waitpid(child, NULL, 0), child);
  char dead[4500], live[4500], tuning_tmp[4500];
  snprintf(dead, sizeof dead, "%s.tmp.%ld.%ld", entry, (long)child, (long)child);
  snprintf(live, sizeof live, "%s.tmp.%ld.%ld", entry, (long)getppid(), 7L);
  snprintf(tuning_tmp, sizeof tuning_tmp, "%s/tuning.tsv.tmp.%ld.%ld", dir, (long)child, (long)child);
  kt_write_file(dead, "half");
  kt_write_file(live, "in progress");
  kt_write_file(tuning_tmp, "half");
  kt_start("sweep");
  ck_assert_int_eq(access(dead, F_OK), -1);
  ck_assert_int_eq(access(tuning_tmp, F_OK), -1);
  ck_assert_int_eq(access(live, F_OK), 0);
  ck_assert_int_eq(access(entry, F_OK), 0);
  unlink(live);
  kiln_deinitialize();
}
END_TEST

/* A tuning-table temporary of a killed writer is swept even when the kernels
 * folder holds more entries than one sweep scans. */
START_TEST(test_stale_tuning_temporary_swept_past_many_kernels) {
  const char *dir = kt_start("sweep-many");
  kiln__cache_store("sweep-many-key", "x", 1); /* makes <dir>/kernels */
  kiln_deinitialize();
  char path[4500];
  for (int i = 0; i < 5000; i++) {
    snprintf(path, sizeof path, "%s/kernels/%016x", dir, 0x10000u + (unsigned)i);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
  }
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) _exit(0);
  ck_assert_int_eq(waitpid(child, NULL, 0), child);
  char tuning_tmp[4500];
  snprintf(tuning_tmp, sizeof tuning_tmp, "%s/tuning.tsv.tmp.%ld.%ld", dir, (long)child, (long)child);
  kt_write_file(tuning_tmp, "kiln-tuning 1\nhalf");
  kt_start("sweep-many");
  ck_assert_msg(access(tuning_tmp, F_OK) == -1, "%s, left by a dead writer, is still there", tuning_tmp);
  kiln_deinitialize();
  for (int i = 0; i < 5000; i++) {
    snprintf(path, sizeof path, "%s/kernels/%016x", dir, 0x10000u + (unsigned)i);
    unlink(path);
  }
}
END_TEST

/* An entry that loaded but proved unusable is evicted on request. */
START_TEST(test_evict) {
  const char *dir = kt_start("evict");
  kiln__cache_store("evict-key", "abc", 3);
  char path[4400];
  kt_blob_path(dir, "evict-key", path, sizeof path);
  ck_assert_int_eq(access(path, F_OK), 0);
  kiln__cache_evict("evict-key");
  ck_assert_int_eq(access(path, F_OK), -1);
  kiln__cache_evict("evict-key"); /* gone already: harmless */
  kiln_deinitialize();
}
END_TEST

static Suite *cache_suite(void) {
  Suite *s = suite_create("cache");
  TCase *blobs = tcase_create("blobs");
  tcase_add_test(blobs, test_round_trip);
  tcase_add_test(blobs, test_truncated);
  tcase_add_test(blobs, test_truncated_header);
  tcase_add_test(blobs, test_checksum);
  tcase_add_test(blobs, test_magic);
  tcase_add_test(blobs, test_version);
  tcase_add_test(blobs, test_key_differs);
  tcase_add_test(blobs, test_trailing_bytes);
  tcase_add_test(blobs, test_unwritable_dir);
  tcase_add_test(blobs, test_no_cache_dir);
  tcase_add_test(blobs, test_two_writers);
  tcase_add_test(blobs, test_stats_argument);
  tcase_add_test(blobs, test_fifo_entries);
  tcase_add_test(blobs, test_huge_entry_header_first);
  tcase_add_test(blobs, test_stale_temporaries_swept);
  tcase_add_test(blobs, test_stale_tuning_temporary_swept_past_many_kernels);
  tcase_add_test(blobs, test_evict);
  suite_add_tcase(s, blobs);
  TCase *tuning = tcase_create("tuning");
  tcase_add_test(tuning, test_tuning_round_trip);
  tcase_add_loop_test(tuning, test_tuning_corrupt, 0, (int)(sizeof kt_bad_tuning / sizeof kt_bad_tuning[0]));
  suite_add_tcase(s, tuning);
  return s;
}

int main(void) {
  const char *root = kt_private_cache_dir();
  if (!root) {
    fprintf(stderr, "test_cache: cannot create a temporary directory\n");
    return 1;
  }
  snprintf(kt_root, sizeof kt_root, "%s", root);
  return kt_run_suite(cache_suite());
}
