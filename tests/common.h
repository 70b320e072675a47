/* tests/common.h: helpers shared by the Check suites: a private cache directory, env setup, exact asserts. */
#ifndef KILN_TESTS_COMMON_H
#define KILN_TESTS_COMMON_H

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln.h"

/* Assert a kiln call succeeded, printing kiln's message when not. */
#define KT_OK(call)                                                                       \
  do {                                                                                    \
    kiln_status_t kt_status_ = (call);                                                    \
    ck_assert_msg(kt_status_ == KILN_OK, "%s -> %s: %s", #call, kiln_status_name(kt_status_), \
                  kiln_last_error());                                                     \
  } while (0)

/* Assert a kiln call failed with `code` and that its message contains `needle`. */
#define KT_FAILS(call, code, needle)                                                      \
  do {                                                                                    \
    kiln_status_t kt_status_ = (call);                                                    \
    ck_assert_msg(kt_status_ == (code), "%s -> %s, expected %s: %s", #call,               \
                  kiln_status_name(kt_status_), kiln_status_name(code), kiln_last_error()); \
    ck_assert_msg(strstr(kiln_last_error(), (needle)) != NULL,                            \
                  "%s: message \"%s\" lacks \"%s\"", #call, kiln_last_error(), (needle)); \
  } while (0)

static char kt_cache_dir_[4096];
/* The process that created kt_cache_dir_: children forked by a suite (Check's
 * fork mode, or a test's own fork) inherit the atexit handler and must not
 * remove the directory their parent still uses. */
static pid_t kt_cache_owner_;

static inline void kt_remove_tree_(const char *path) {
  DIR *dir = opendir(path);
  if (dir) {
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
      if (!strcmp(entry->d_name, ".") || !strcmp(entry->d_name, "..")) continue;
      char child[4096];
      /* A path too long to name is left alone rather than cut short. */
      if (snprintf(child, sizeof child, "%s/%s", path, entry->d_name) >= (int)sizeof child) continue;
      struct stat st;
      if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode)) {
        chmod(child, 0700);
        kt_remove_tree_(child);
      } else {
        unlink(child);
      }
    }
    closedir(dir);
  }
  rmdir(path);
}

static inline void kt_cleanup_cache_dir_(void) {
  if (kt_cache_dir_[0] && getpid() == kt_cache_owner_) kt_remove_tree_(kt_cache_dir_);
}

/* Point KILN_CACHE_DIR at a fresh temporary directory (under $TMPDIR or /tmp)
 * removed at exit, whatever the caller's environment says: a test writes
 * nothing outside its own folder and passes when run twice in a row with any
 * KILN_CACHE_DIR. Call first thing in main(), before kiln starts. Returns the
 * directory, NULL when none could be made. */
static inline const char *kt_private_cache_dir(void) {
  const char *tmp = getenv("TMPDIR");
  if (snprintf(kt_cache_dir_, sizeof kt_cache_dir_, "%s/kiln-test-XXXXXX", tmp && *tmp ? tmp : "/tmp") >=
          (int)sizeof kt_cache_dir_ ||
      !mkdtemp(kt_cache_dir_)) {
    kt_cache_dir_[0] = 0;
    unsetenv("KILN_CACHE_DIR");
    return NULL;
  }
  kt_cache_owner_ = getpid();
  setenv("KILN_CACHE_DIR", kt_cache_dir_, 1);
  atexit(kt_cleanup_cache_dir_);
  return kt_cache_dir_;
}

/* Run a suite with CK_NORK-safe defaults; returns the process exit code. */
static inline int kt_run_suite(Suite *suite) {
  SRunner *runner = srunner_create(suite);
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed == 0 ? 0 : 1;
}

#endif /* KILN_TESTS_COMMON_H */
