/* nn/safetensors_save.c: writing safetensors files as the reference writer lays them out, replaced atomically on disk. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nn_internal.h"

/* Well-formed UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF):
 * what the reference loader, a Rust str, accepts. */
bool kiln_nn__utf8_valid(const char *text) {
  const unsigned char *s = (const unsigned char *)text;
  while (*s) {
    unsigned char c = *s;
    int more;
    uint32_t cp;
    if (c < 0x80) {
      s++;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      more = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      more = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      more = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (int k = 1; k <= more; k++) {
      if ((s[k] & 0xc0) != 0x80) return false;
      cp = cp << 6 | (s[k] & 0x3f);
    }
    if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
      return false;
    s += more + 1;
  }
  return true;
}

size_t kiln_nn__control_char(const char *text) {
  size_t i = 0;
  while (text[i] && (unsigned char)text[i] >= 0x20 && text[i] != 0x7f) i++;
  return i;
}

/* The reference writer's order: dtype descending in its enum (I64, F64, F32,
 * I32, BF16, F16, I16, I8, U8, BOOL), then name. */
static int kiln_nn_st_save_order(const void *a, const void *b) {
  const kiln_nn_named_tensor_t *x = *(const kiln_nn_named_tensor_t *const *)a;
  const kiln_nn_named_tensor_t *y = *(const kiln_nn_named_tensor_t *const *)b;
  kiln_dtype_t dx = kiln_tensor_dtype(x->tensor), dy = kiln_tensor_dtype(y->tensor);
  if (dx != dy) return kiln_nn__st_dtype_rank(dy) - kiln_nn__st_dtype_rank(dx);
  return strcmp(x->name, y->name);
}

static int kiln_nn_st_by_name(const void *a, const void *b) {
  return strcmp((*(const kiln_nn_named_tensor_t *const *)a)->name, (*(const kiln_nn_named_tensor_t *const *)b)->name);
}

static kiln_status_t kiln_nn_st_save_check(const kiln_nn_named_tensor_t *tensors, size_t count,
                                           const kiln_nn_metadata_t *metadata, size_t metadata_count) {
  for (size_t i = 0; i < count; i++) {
    const char *name = tensors[i].name;
    kiln_tensor_t *t = tensors[i].tensor;
    if (!name || !t)
      return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_save: tensors[%zu].%s is NULL", i,
                            !name ? "name" : "tensor");
    if (!strcmp(name, "__metadata__"))
      return kiln_set_error(KILN_INVALID_ARGUMENT,
                            "kiln_nn_safetensors_save: tensors[%zu] is named \"__metadata__\", the format's metadata key; "
                            "rename it",
                            i);
    if (!kiln_nn__utf8_valid(name))
      return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_save: the name of tensors[%zu] is not valid UTF-8",
                            i);
    /* What kiln's reader refuses, its writer never writes. */
    size_t at = kiln_nn__control_char(name);
    if (name[at])
      return kiln_set_error(KILN_INVALID_ARGUMENT,
                            "kiln_nn_safetensors_save: the name of tensors[%zu] holds the control character U+%04X at "
                            "byte %zu; names are UTF-8 without control characters",
                            i, (unsigned)(unsigned char)name[at], at);
    kiln_dtype_t dtype = kiln_tensor_dtype(t);
    if (kiln_nn__st_dtype_rank(dtype) < 0)
      return kiln_set_error(KILN_UNSUPPORTED,
                            "kiln_nn_safetensors_save: tensor \"%s\" is %s, which safetensors has no name for; cast it "
                            "(kiln_tensor_cast)",
                            name, kiln_dtype_name(dtype));
  }
  for (size_t i = 0; i < metadata_count; i++) {
    const char *key = metadata[i].key, *value = metadata[i].value;
    if (!key || !value)
      return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_save: metadata[%zu].%s is NULL", i,
                            !key ? "key" : "value");
    if (!kiln_nn__utf8_valid(key) || !kiln_nn__utf8_valid(value))
      return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_save: metadata[%zu] (key \"%s\") is not valid UTF-8",
                            i, kiln_nn__utf8_valid(key) ? key : "?");
    size_t at = kiln_nn__control_char(key);
    if (key[at])
      return kiln_set_error(KILN_INVALID_ARGUMENT,
                            "kiln_nn_safetensors_save: metadata[%zu]'s key holds the control character U+%04X at byte "
                            "%zu; keys are UTF-8 without control characters",
                            i, (unsigned)(unsigned char)key[at], at);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(metadata[j].key, key))
        return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_save: metadata key \"%s\" appears twice", key);
  }
  return KILN_OK;
}

/* The header: __metadata__ first, then the tensors in `order` with their
 * offsets; json-c prints it compact, as serde_json does. */
static kiln_status_t kiln_nn_st_header_json(const kiln_nn_named_tensor_t *const *order, size_t count,
                                            const kiln_nn_metadata_t *metadata, size_t metadata_count,
                                            json_object **out_root) {
  json_object *root = json_object_new_object();
  bool ok = root != NULL;
  if (ok && metadata_count) {
    json_object *meta = json_object_new_object();
    ok = meta && !json_object_object_add(root, "__metadata__", meta);
    if (!ok) json_object_put(meta);
    for (size_t i = 0; ok && i < metadata_count; i++) {
      json_object *value = json_object_new_string(metadata[i].value);
      ok = value && !json_object_object_add(meta, metadata[i].key, value);
      if (!ok) json_object_put(value);
    }
  }
  uint64_t at = 0;
  for (size_t i = 0; ok && i < count; i++) {
    const kiln_tensor_t *t = order[i]->tensor;
    int ndim = kiln_tensor_ndim(t);
    const int64_t *shape = kiln_tensor_shape(t);
    uint64_t bytes = (uint64_t)kiln_tensor_numel(t) * kiln_dtype_size(kiln_tensor_dtype(t));
    json_object *info = json_object_new_object(), *dims = json_object_new_array(), *offsets = json_object_new_array();
    ok = info && dims && offsets;
    for (int d = 0; ok && d < ndim; d++) ok = !json_object_array_add(dims, json_object_new_int64(shape[d]));
    ok = ok && !json_object_array_add(offsets, json_object_new_int64((int64_t)at)) &&
         !json_object_array_add(offsets, json_object_new_int64((int64_t)(at + bytes)));
    ok = ok && !json_object_object_add(info, "dtype", json_object_new_string(kiln_nn__st_dtype_name(kiln_tensor_dtype(t))));
    if (ok && !json_object_object_add(info, "shape", dims)) dims = NULL;
    else ok = false;
    if (ok && !json_object_object_add(info, "data_offsets", offsets)) offsets = NULL;
    else ok = false;
    if (ok && !json_object_object_add(root, order[i]->name, info)) info = NULL;
    else ok = false;
    json_object_put(dims);
    json_object_put(offsets);
    json_object_put(info);
    at += bytes;
  }
  if (!ok) {
    json_object_put(root);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_safetensors_save: cannot build the JSON header");
  }
  *out_root = root;
  return KILN_OK;
}

static kiln_status_t kiln_nn_write_all(int fd, const void *data, size_t size, const char *path) {
  size_t done = 0;
  while (done < size) {
    ssize_t put = write(fd, (const uint8_t *)data + done, size - done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0)
      return kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot write %s: %s", path,
                            put < 0 ? strerror(errno) : "no progress");
    done += (size_t)put;
  }
  return KILN_OK;
}

/* The header, then each tensor read back from its device, into fd. */
/* The first NaN or infinity among n floats; n when there is none. */
static size_t kiln_nn_first_non_finite(const float *v, size_t n) {
  size_t i = 0;
  while (i < n && isfinite(v[i])) i++;
  return i;
}

static kiln_status_t kiln_nn_st_write(const char *call, int fd, const char *tmp, const char *path, const char *header,
                                      size_t header_len, const kiln_nn_named_tensor_t *const *order, size_t count,
                                      bool finite) {
  size_t padded = (header_len + 7) / 8 * 8;
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; i++) len_bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  kiln_status_t status = kiln_nn_write_all(fd, len_bytes, 8, tmp);
  if (status == KILN_OK) status = kiln_nn_write_all(fd, header, header_len, tmp);
  if (status == KILN_OK) status = kiln_nn_write_all(fd, "        ", padded - header_len, tmp);
  void *host = NULL;
  size_t host_size = 0;
  for (size_t i = 0; i < count && status == KILN_OK; i++) {
    const kiln_tensor_t *t = order[i]->tensor;
    size_t bytes = (size_t)kiln_tensor_numel(t) * kiln_dtype_size(kiln_tensor_dtype(t));
    if (bytes == 0) continue;
    if (bytes > host_size) {
      void *bigger = realloc(host, bytes);
      if (!bigger) {
        status = kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_safetensors_save: cannot allocate %zu bytes for tensor \"%s\"",
                                bytes, order[i]->name);
        break;
      }
      host = bigger;
      host_size = bytes;
    }
    status = kiln_tensor_read(t, host, bytes);
    if (status != KILN_OK) {
      status = kiln_wrap_error(status, "kiln_nn_safetensors_save: reading tensor \"%s\" from %s", order[i]->name,
                               kiln_device_name(kiln_tensor_device(t)));
      break;
    }
    size_t bad = finite && kiln_tensor_dtype(t) == KILN_F32 ? kiln_nn_first_non_finite(host, bytes / 4) : bytes / 4;
    if (bad < bytes / 4) {
      status = kiln_set_error(KILN_INVALID_ARGUMENT,
                              "%s: parameter \"%s\" holds %g at index %zu; a checkpoint of non-finite values is "
                              "refused and %s is left as it was (lower the learning rate if training diverged)",
                              call, order[i]->name, (double)((const float *)host)[bad], bad, path);
      break;
    }
    status = kiln_nn_write_all(fd, host, bytes, tmp);
  }
  free(host);
  if (status == KILN_OK && fsync(fd) != 0)
    status = kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot flush %s to disk: %s", tmp, strerror(errno));
  return status;
}

/* ---- replacing the file on disk ------------------------------------------------------
 * A save writes "<path>.tmp-<pid>-<serial>" beside the target, created
 * exclusively, and renames it over the target when complete. A process killed
 * before its rename leaves its temporary behind; the next save of the same
 * target removes those whose process no longer exists (the idea of the kernel
 * cache's sweep). A temporary of this process, or of one alive (or not ours to
 * signal), is left alone. */

/* Temporaries looked at by one sweep at most: a save stays quick whatever the
 * folder holds. */
#define KILN_NN_SWEEP_MAX_ENTRIES 4096

/* The folder of `path` ("." when it names none) into `dir`, and its last part. */
static const char *kiln_nn_split_path(const char *path, char *dir, size_t dir_size) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(dir, dir_size, ".");
    return path;
  }
  size_t len = slash == path ? 1 : (size_t)(slash - path);
  snprintf(dir, dir_size, "%.*s", (int)(len < dir_size ? len : dir_size - 1), path);
  return slash + 1;
}

/* Whether `name` is "<base>.tmp-<pid>-<serial>" of a process that is gone. */
static bool kiln_nn_stale_temporary(const char *name, const char *base, size_t base_len) {
  if (strncmp(name, base, base_len) || strncmp(name + base_len, ".tmp-", 5)) return false;
  const char *digits = name + base_len + 5;
  char *end = NULL;
  errno = 0;
  long pid = strtol(digits, &end, 10);
  if (errno || end == digits || *end != '-' || pid <= 0 || pid == (long)getpid()) return false;
  const char *serial = end + 1;
  if (!*serial || serial[strspn(serial, "0123456789")]) return false;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static void kiln_nn_sweep_temporaries(const char *dir, const char *base) {
  DIR *d = opendir(dir);
  if (!d) return;
  size_t base_len = strlen(base);
  int budget = KILN_NN_SWEEP_MAX_ENTRIES;
  struct dirent *e;
  while (budget-- > 0 && (e = readdir(d)) != NULL) {
    if (!kiln_nn_stale_temporary(e->d_name, base, base_len)) continue;
    /* Relative to the folder, so the name checked is the name removed. */
    unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

/* The file replaced keeps its mode, and its owner where this process may give
 * it (fchown is best effort: only root may give a file away). */
static kiln_status_t kiln_nn_keep_mode(int fd, const char *tmp, const char *path) {
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return KILN_OK;
  struct stat mine;
  if (fstat(fd, &mine) == 0 && (mine.st_uid != st.st_uid || mine.st_gid != st.st_gid) &&
      fchown(fd, st.st_uid, st.st_gid) != 0) {
    /* Best effort: the new file stays ours, as any file we create. */
  }
  if (fchmod(fd, st.st_mode & 07777) != 0)
    return kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot give %s the mode %04o of %s: %s", tmp,
                          (unsigned)(st.st_mode & 07777), path, strerror(errno));
  return KILN_OK;
}

/* The rename itself on disk: the folder's entry synced. */
static kiln_status_t kiln_nn_sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot open the folder %s to sync it: %s", dir,
                                    strerror(errno));
  kiln_status_t status = KILN_OK;
  /* EINVAL: a file system without directory sync; nothing more to do. */
  if (fsync(fd) != 0 && errno != EINVAL)
    status = kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot sync the folder %s: %s", dir, strerror(errno));
  close(fd);
  return status;
}

kiln_status_t kiln_nn_safetensors_save(const char *path, const kiln_nn_named_tensor_t *tensors, size_t count,
                                       const kiln_nn_metadata_t *metadata, size_t metadata_count) {
  return kiln_nn__safetensors_save("kiln_nn_safetensors_save", path, tensors, count, metadata, metadata_count, false);
}

kiln_status_t kiln_nn__safetensors_save(const char *call, const char *path, const kiln_nn_named_tensor_t *tensors,
                                        size_t count, const kiln_nn_metadata_t *metadata, size_t metadata_count,
                                        bool finite) {
  if (!path || (!tensors && count) || (!metadata && metadata_count))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call,
                          !path ? "path" : !tensors && count ? "tensors" : "metadata");
  kiln_status_t status = kiln_nn_st_save_check(tensors, count, metadata, metadata_count);
  if (status != KILN_OK) return status;
  const kiln_nn_named_tensor_t **order = malloc((count ? count : 1) * sizeof *order);
  if (!order) return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_safetensors_save: cannot allocate the order");
  for (size_t i = 0; i < count; i++) order[i] = &tensors[i];
  qsort(order, count, sizeof *order, kiln_nn_st_by_name);
  for (size_t i = 1; i < count; i++) {
    if (!strcmp(order[i - 1]->name, order[i]->name)) {
      status = kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_save: two tensors are named \"%s\"",
                              order[i]->name);
      free(order);
      return status;
    }
  }
  qsort(order, count, sizeof *order, kiln_nn_st_save_order);
  json_object *root = NULL;
  status = kiln_nn_st_header_json(order, count, metadata, metadata_count, &root);
  if (status != KILN_OK) {
    free(order);
    return status;
  }
  size_t header_len = 0;
  const char *header = json_object_to_json_string_length(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                                                         &header_len);

  /* A name of our own beside the target, created exclusively so that two
   * savers never share it; renamed over the target only when complete. */
  static atomic_uint serial;
  size_t tmp_size = strlen(path) + 64;
  char *tmp = malloc(tmp_size), *dir = malloc(tmp_size);
  int fd = -1;
  if (!tmp || !dir) {
    status = kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_safetensors_save: cannot allocate a path");
  } else {
    const char *base = kiln_nn_split_path(path, dir, tmp_size);
    kiln_nn_sweep_temporaries(dir, base);
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
      snprintf(tmp, tmp_size, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&serial, 1));
      fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0)
      status = kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot create %s: %s", tmp, strerror(errno));
  }
  if (status == KILN_OK && !header)
    status = kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_safetensors_save: cannot print the JSON header");
  if (status == KILN_OK) status = kiln_nn_keep_mode(fd, tmp, path);
  if (status == KILN_OK) status = kiln_nn_st_write(call, fd, tmp, path, header, header_len, order, count, finite);
  if (fd >= 0 && close(fd) != 0 && status == KILN_OK)
    status = kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot close %s: %s", tmp, strerror(errno));
  if (status == KILN_OK && rename(tmp, path) != 0)
    status = kiln_set_error(KILN_IO, "kiln_nn_safetensors_save: cannot rename %s to %s: %s", tmp, path, strerror(errno));
  if (status != KILN_OK && fd >= 0) unlink(tmp);
  if (status == KILN_OK) status = kiln_nn_sync_dir(dir);
  free(tmp);
  free(dir);
  json_object_put(root);
  free(order);
  return status;
}
