/* nn/safetensors.c: reading safetensors files: the header parsed by json-c and checked as the reference loader does, tensors loaded onto a device. */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nn_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian: a big-endian host needs byte swapping in nn/safetensors*.c"
#endif

/* ---- sources: a file read with pread, or bytes in memory ------------------------- */

typedef struct kiln_nn_st_source_t {
  int fd; /* -1: memory */
  const uint8_t *mem;
  uint64_t size;
  const char *name; /* the path, or "<memory>" */
} kiln_nn_st_source_t;

static kiln_status_t kiln_nn_st_fail(const kiln_nn_st_source_t *src, kiln_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kiln_status_t kiln_nn_st_fail(const kiln_nn_st_source_t *src, kiln_status_t status, const char *fmt, ...) {
  char problem[1536];
  va_list args;
  va_start(args, fmt);
  vsnprintf(problem, sizeof problem, fmt, args);
  va_end(args);
  return kiln_set_error(status, "%s: %s", src->name, problem);
}

/* Exactly `size` bytes at `offset`; the caller checked the range. */
static kiln_status_t kiln_nn_st_read(const kiln_nn_st_source_t *src, uint64_t offset, void *dst, size_t size) {
  if (src->fd < 0) {
    if (size) memcpy(dst, src->mem + offset, size);
    return KILN_OK;
  }
  size_t done = 0;
  while (done < size) {
    ssize_t got = pread(src->fd, (uint8_t *)dst + done, size - done, (off_t)(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return kiln_nn_st_fail(src, KILN_IO, "cannot read %zu bytes at offset %llu: %s", size - done,
                             (unsigned long long)(offset + done), got < 0 ? strerror(errno) : "the file got shorter");
    done += (size_t)got;
  }
  return KILN_OK;
}

/* ---- the header --------------------------------------------------------------------- */

#define KILN_NN_ST_MAX_HEADER 100000000ull

typedef struct kiln_nn_st_entry_t {
  const char *name; /* owned by the JSON tree */
  kiln_dtype_t dtype;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  uint64_t begin, end; /* in the data section */
} kiln_nn_st_entry_t;

typedef struct kiln_nn_st_header_t {
  json_object *root;
  kiln_nn_st_entry_t *entries; /* in the header's order */
  size_t count;
  json_object *metadata; /* borrowed from root; NULL when absent */
  uint64_t data_start;   /* 8 + header length */
  uint64_t data_size;
} kiln_nn_st_header_t;

static void kiln_nn_st_header_free(kiln_nn_st_header_t *h) {
  json_object_put(h->root);
  free(h->entries);
  memset(h, 0, sizeof *h);
}

/* Every dtype of the format, so that one kiln lacks is named as such and not
 * taken for garbage. */
static const char *const kiln_nn_st_known_dtypes[] = {
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "E8M0",
    "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64", "C64",
};

/* json-c holds a JSON null as a NULL pointer. */
static const char *kiln_nn_json_type(json_object *o) { return json_type_to_name(json_object_get_type(o)); }

/* A JSON integer in [0, INT64_MAX]; json-c clamps larger literals to
 * UINT64_MAX, which this refuses with the rest. */
static bool kiln_nn_json_uint(json_object *o, uint64_t *out) {
  if (!o || !json_object_is_type(o, json_type_int)) return false;
  if (json_object_get_int64(o) < 0) return false;
  uint64_t v = json_object_get_uint64(o);
  if (v > (uint64_t)INT64_MAX) return false;
  *out = v;
  return true;
}

static void kiln_nn_st_shape_text(const kiln_nn_st_entry_t *e, char *text, size_t size) {
  size_t used = (size_t)snprintf(text, size, "[");
  for (int d = 0; d < e->ndim && used < size; d++)
    used += (size_t)snprintf(text + used, size - used, "%s%lld", d ? ", " : "", (long long)e->shape[d]);
  if (used < size) snprintf(text + used, size - used, "]");
}

/* One tensor's entry: fields present with the right types, a dtype kiln has,
 * a shape whose byte size fits and matches its offsets. */
static kiln_status_t kiln_nn_st_entry(const kiln_nn_st_source_t *src, const char *name, json_object *info,
                                      kiln_nn_st_entry_t *e) {
  e->name = name;
  if (!json_object_is_type(info, json_type_object))
    return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\" is a JSON %s, not an object with dtype, shape and data_offsets",
                           name, kiln_nn_json_type(info));
  json_object *dtype = NULL, *shape = NULL, *offsets = NULL;
  bool has_dtype = json_object_object_get_ex(info, "dtype", &dtype);
  bool has_shape = json_object_object_get_ex(info, "shape", &shape);
  bool has_offsets = json_object_object_get_ex(info, "data_offsets", &offsets);
  if (!json_object_is_type(dtype, json_type_string))
    return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": \"dtype\" is %s, not a string", name,
                           has_dtype ? kiln_nn_json_type(dtype) : "missing");
  if (!json_object_is_type(shape, json_type_array))
    return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": \"shape\" is %s, not an array", name,
                           has_shape ? kiln_nn_json_type(shape) : "missing");
  if (!json_object_is_type(offsets, json_type_array) || json_object_array_length(offsets) != 2)
    return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": \"data_offsets\" is %s, not an array [begin, end]", name,
                           json_object_is_type(offsets, json_type_array) ? "an array of another length"
                           : has_offsets                                 ? kiln_nn_json_type(offsets)
                                                                         : "missing");
  const char *dt = json_object_get_string(dtype);
  bool known = false;
  for (size_t k = 0; k < sizeof kiln_nn__st_dtypes / sizeof kiln_nn__st_dtypes[0]; k++)
    if (!strcmp(dt, kiln_nn__st_dtypes[k].name)) {
      e->dtype = kiln_nn__st_dtypes[k].dtype;
      known = true;
    }
  if (!known) {
    for (size_t k = 0; k < sizeof kiln_nn_st_known_dtypes / sizeof *kiln_nn_st_known_dtypes; k++)
      if (!strcmp(dt, kiln_nn_st_known_dtypes[k]))
        return kiln_nn_st_fail(src, KILN_UNSUPPORTED,
                               "tensor \"%s\" has dtype %s, which kiln does not have (it reads BOOL, U8, I8, I16, I32, "
                               "I64, F16, BF16, F32 and F64); convert it before saving (e.g. tensor.float() or "
                               "tensor.to(torch.int64) in PyTorch)",
                               name, dt);
    return kiln_nn_st_fail(src, KILN_IO,
                           "tensor \"%s\" has dtype \"%.64s\", which is no safetensors dtype (F32, I32, F16, BF16, F64, "
                           "I64, U8, BOOL ...)",
                           name, dt);
  }
  size_t ndim = json_object_array_length(shape);
  if (ndim > KILN_MAX_DIMS)
    return kiln_nn_st_fail(src, KILN_UNSUPPORTED, "tensor \"%s\" has %zu dimensions; kiln tensors have at most %d", name,
                           ndim, KILN_MAX_DIMS);
  e->ndim = (int)ndim;
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t d = 0; d < ndim; d++) {
    json_object *dim = json_object_array_get_idx(shape, d);
    uint64_t v = 0;
    if (!kiln_nn_json_uint(dim, &v))
      return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": shape[%zu] is %s, not an integer in [0, 2^63)", name, d,
                             json_object_is_type(dim, json_type_int) ? "out of range" : kiln_nn_json_type(dim));
    e->shape[d] = (int64_t)v;
    if (__builtin_mul_overflow(numel, v, &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  char shape_text[256];
  kiln_nn_st_shape_text(e, shape_text, sizeof shape_text);
  if (overflow || __builtin_mul_overflow(numel, (uint64_t)kiln_dtype_size(e->dtype), &nbytes))
    return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": the byte size of shape %s overflows 64 bits", name, shape_text);
  for (int k = 0; k < 2; k++) {
    json_object *v = json_object_array_get_idx(offsets, (size_t)k);
    if (!kiln_nn_json_uint(v, k ? &e->end : &e->begin))
      return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": data_offsets[%d] is %s, not an integer in [0, 2^63)", name, k,
                             json_object_is_type(v, json_type_int) ? "out of range" : kiln_nn_json_type(v));
  }
  if (e->end < e->begin)
    return kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": data_offsets [%llu, %llu] end before they begin", name,
                           (unsigned long long)e->begin, (unsigned long long)e->end);
  if (e->end - e->begin != nbytes)
    return kiln_nn_st_fail(src, KILN_IO,
                           "tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes, but shape %s of %s needs %llu", name,
                           (unsigned long long)e->begin, (unsigned long long)e->end,
                           (unsigned long long)(e->end - e->begin), shape_text, dt, (unsigned long long)nbytes);
  return KILN_OK;
}

static int kiln_nn_st_by_offset(const void *a, const void *b) {
  const kiln_nn_st_entry_t *x = *(const kiln_nn_st_entry_t *const *)a, *y = *(const kiln_nn_st_entry_t *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* The data section must be the tensors' bytes end to end, as the reference
 * loader requires: no overlap, no gap, nothing after the last one. */
static kiln_status_t kiln_nn_st_check_layout(const kiln_nn_st_source_t *src, kiln_nn_st_header_t *h) {
  if (h->count == 0) {
    if (h->data_size != 0)
      return kiln_nn_st_fail(src, KILN_IO, "the header lists no tensor, yet %llu bytes of data follow it",
                             (unsigned long long)h->data_size);
    return KILN_OK;
  }
  const kiln_nn_st_entry_t **sorted = malloc(h->count * sizeof *sorted);
  if (!sorted) return kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate the index of %zu tensors", h->count);
  for (size_t i = 0; i < h->count; i++) sorted[i] = &h->entries[i];
  qsort(sorted, h->count, sizeof *sorted, kiln_nn_st_by_offset);
  kiln_status_t status = KILN_OK;
  uint64_t at = 0;
  for (size_t i = 0; i < h->count && status == KILN_OK; i++) {
    const kiln_nn_st_entry_t *e = sorted[i];
    if (e->end > h->data_size)
      status = kiln_nn_st_fail(src, KILN_IO,
                               "tensor \"%s\": data_offsets [%llu, %llu] run past the end of the data section (%llu "
                               "bytes): the file is truncated or its offsets are wrong",
                               e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                               (unsigned long long)h->data_size);
    else if (e->begin < at)
      status = kiln_nn_st_fail(src, KILN_IO, "tensor \"%s\": data_offsets [%llu, %llu] overlap tensor \"%s\" (ending at %llu)",
                               e->name, (unsigned long long)e->begin, (unsigned long long)e->end, sorted[i - 1]->name,
                               (unsigned long long)at);
    else if (e->begin > at)
      status = kiln_nn_st_fail(src, KILN_IO,
                               "tensor \"%s\": data_offsets [%llu, %llu] leave a gap of %llu bytes before it; the data "
                               "must be contiguous",
                               e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                               (unsigned long long)(e->begin - at));
    at = e->end;
  }
  if (status == KILN_OK && at != h->data_size)
    status = kiln_nn_st_fail(src, KILN_IO, "%llu bytes follow the last tensor's data (the tensors cover %llu of %llu)",
                             (unsigned long long)(h->data_size - at), (unsigned long long)at,
                             (unsigned long long)h->data_size);
  free(sorted);
  return status;
}

static int kiln_nn_hex4(const char *p) {
  int v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v << 4 | d;
  }
  return v;
}

/* What json-c lets through in strings and the reference loader (serde_json)
 * refuses: a raw control byte, a lone UTF-16 surrogate escape (json-c turns it
 * into bytes that are no UTF-8). And what a C string cannot hold: an escaped
 * NUL, which would cut a name short ("a\u0000b" read as "a"). The grammar
 * itself is json-c's to check; this only walks the strings. */
static kiln_status_t kiln_nn_st_scan_strings(const kiln_nn_st_source_t *src, const char *text, size_t n) {
  bool inside = false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)text[i];
    if (!inside) {
      inside = c == '"';
      continue;
    }
    if (c == '"') {
      inside = false;
    } else if (c < 0x20) {
      return kiln_nn_st_fail(src, KILN_IO, "the header holds the raw control byte 0x%02x in a string, at offset %zu",
                             c, i);
    } else if (c == '\\' && i + 1 < n) {
      int cp = text[i + 1] == 'u' && i + 5 < n ? kiln_nn_hex4(text + i + 2) : -1;
      if (cp < 0) {
        i++; /* a one-character escape, or a malformed one json-c reports */
        continue;
      }
      if (cp == 0)
        return kiln_nn_st_fail(src, KILN_IO,
                               "the header holds \\u0000 (a NUL) in a string, at offset %zu; kiln's names and "
                               "metadata are C strings and cannot hold it",
                               i);
      int low = cp >= 0xd800 && cp <= 0xdbff && i + 11 < n && text[i + 6] == '\\' && text[i + 7] == 'u'
                    ? kiln_nn_hex4(text + i + 8)
                    : -1;
      if (cp >= 0xd800 && cp <= 0xdbff && low >= 0xdc00 && low <= 0xdfff) {
        i += 11; /* a surrogate pair: one character past U+FFFF */
      } else if (cp >= 0xd800 && cp <= 0xdfff) {
        return kiln_nn_st_fail(src, KILN_IO,
                               "the header holds a lone UTF-16 surrogate \\u%04x in a string, at offset %zu; it is no "
                               "Unicode character",
                               (unsigned)cp, i);
      } else {
        i += 5;
      }
    }
  }
  return KILN_OK;
}

/* A tensor name or metadata key as kiln writes them: UTF-8 without control
 * characters. */
static kiln_status_t kiln_nn_st_check_name(const kiln_nn_st_source_t *src, const char *what, const char *name) {
  if (!kiln_nn__utf8_valid(name)) return kiln_nn_st_fail(src, KILN_IO, "%s is not valid UTF-8", what);
  size_t at = kiln_nn__control_char(name);
  if (name[at])
    return kiln_nn_st_fail(src, KILN_IO, "%s \"%.*s...\" holds the control character U+%04X at byte %zu", what, (int)at,
                           name, (unsigned)(unsigned char)name[at], at);
  return KILN_OK;
}

static kiln_status_t kiln_nn_st_parse(const kiln_nn_st_source_t *src, kiln_nn_st_header_t *h) {
  memset(h, 0, sizeof *h);
  uint8_t len_bytes[8];
  if (src->size < 8)
    return kiln_nn_st_fail(src, KILN_IO, "truncated: %llu bytes, shorter than the 8-byte header length",
                           (unsigned long long)src->size);
  kiln_status_t status = kiln_nn_st_read(src, 0, len_bytes, 8);
  if (status != KILN_OK) return status;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len_bytes[i];
  if (n > KILN_NN_ST_MAX_HEADER)
    return kiln_nn_st_fail(src, KILN_IO,
                           "header length %llu is over the format's limit of 100,000,000 bytes; this is no "
                           "safetensors file, or a damaged one",
                           (unsigned long long)n);
  if (n > src->size - 8)
    return kiln_nn_st_fail(src, KILN_IO, "header length %llu runs past the end of the file (%llu bytes follow the length)",
                           (unsigned long long)n, (unsigned long long)(src->size - 8));
  if (n < 2) return kiln_nn_st_fail(src, KILN_IO, "header length %llu cannot hold a JSON object", (unsigned long long)n);
  char *text = malloc((size_t)n);
  if (!text) return kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate %llu bytes for the header", (unsigned long long)n);
  status = kiln_nn_st_read(src, 8, text, (size_t)n);
  if (status != KILN_OK) {
    free(text);
    return status;
  }
  h->data_start = 8 + n;
  h->data_size = src->size - h->data_start;
  const char *nul = memchr(text, 0, (size_t)n);
  if (text[0] != '{') {
    status = kiln_nn_st_fail(src, KILN_IO, "the header does not start with '{' (byte 0x%02x)", (unsigned char)text[0]);
  } else if (nul) {
    status = kiln_nn_st_fail(src, KILN_IO, "the header holds a NUL byte at offset %zu", (size_t)(nul - text));
  } else if ((status = kiln_nn_st_scan_strings(src, text, (size_t)n)) != KILN_OK) {
    /* reported */
  } else {
    json_tokener *tok = json_tokener_new_ex(8);
    if (!tok) {
      status = kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate a JSON parser");
    } else {
      json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8 | JSON_TOKENER_ALLOW_TRAILING_CHARS);
      h->root = json_tokener_parse_ex(tok, text, (int)n);
      enum json_tokener_error jerr = json_tokener_get_error(tok);
      size_t end = json_tokener_get_parse_end(tok);
      if (!h->root && jerr == json_tokener_continue)
        status = kiln_nn_st_fail(src, KILN_IO, "the header's JSON ends early (after %llu bytes)", (unsigned long long)n);
      else if (!h->root)
        status = kiln_nn_st_fail(src, KILN_IO, "the header is not valid JSON: %s at byte %zu", json_tokener_error_desc(jerr),
                                 end);
      for (size_t i = end; status == KILN_OK && i < n; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\n' && text[i] != '\r')
          status = kiln_nn_st_fail(src, KILN_IO, "the header has byte 0x%02x after its JSON object, at offset %zu",
                                   (unsigned char)text[i], i);
      json_tokener_free(tok);
    }
  }
  free(text);
  if (status == KILN_OK && !json_object_is_type(h->root, json_type_object))
    status = kiln_nn_st_fail(src, KILN_IO, "the header is a JSON %s, not an object", kiln_nn_json_type(h->root));
  if (status == KILN_OK) {
    size_t fields = (size_t)json_object_object_length(h->root);
    h->entries = calloc(fields ? fields : 1, sizeof *h->entries);
    if (!h->entries) status = kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate %zu tensor entries", fields);
  }
  if (status == KILN_OK) {
    json_object_object_foreach(h->root, key, value) {
      status = kiln_nn_st_check_name(src, "a tensor name", key);
      if (status != KILN_OK) break;
      if (!strcmp(key, "__metadata__")) {
        if (!json_object_is_type(value, json_type_object)) {
          status = kiln_nn_st_fail(src, KILN_IO, "\"__metadata__\" is a JSON %s, not an object of strings",
                                   kiln_nn_json_type(value));
          break;
        }
        json_object_object_foreach(value, mkey, mvalue) {
          status = kiln_nn_st_check_name(src, "a \"__metadata__\" key", mkey);
          if (status != KILN_OK) break;
          if (!json_object_is_type(mvalue, json_type_string)) {
            status = kiln_nn_st_fail(src, KILN_IO, "\"__metadata__\" entry \"%s\" is a JSON %s, not a string", mkey,
                                     kiln_nn_json_type(mvalue));
            break;
          }
          const char *text_value = json_object_get_string(mvalue);
          if ((size_t)json_object_get_string_len(mvalue) != strlen(text_value) || !kiln_nn__utf8_valid(text_value)) {
            status = kiln_nn_st_fail(src, KILN_IO, "\"__metadata__\" entry \"%s\" is not a valid UTF-8 C string", mkey);
            break;
          }
        }
        if (status != KILN_OK) break;
        h->metadata = value;
        continue;
      }
      status = kiln_nn_st_entry(src, key, value, &h->entries[h->count]);
      if (status != KILN_OK) break;
      h->count++;
    }
  }
  if (status == KILN_OK) status = kiln_nn_st_check_layout(src, h);
  if (status != KILN_OK) kiln_nn_st_header_free(h);
  return status;
}

/* ---- loading ------------------------------------------------------------------------ */

struct kiln_nn_safetensors_t {
  size_t count;
  char **names;
  kiln_tensor_t **tensors;
  size_t metadata_count;
  char **keys;
  char **values;
};

void kiln_nn_safetensors_free(kiln_nn_safetensors_t *file) {
  if (!file) return;
  for (size_t i = 0; i < file->count; i++) {
    free(file->names[i]);
    kiln_tensor_release(file->tensors[i]);
  }
  for (size_t i = 0; i < file->metadata_count; i++) {
    free(file->keys[i]);
    free(file->values[i]);
  }
  free(file->names);
  free(file->tensors);
  free(file->keys);
  free(file->values);
  free(file);
}

static kiln_status_t kiln_nn_st_load(const kiln_nn_st_source_t *src, kiln_device_t *device,
                                     kiln_nn_safetensors_t **out_file) {
  kiln_nn_st_header_t h;
  kiln_status_t status = kiln_nn_st_parse(src, &h);
  if (status != KILN_OK) return status;
  kiln_nn_safetensors_t *file = calloc(1, sizeof *file);
  size_t meta = h.metadata ? (size_t)json_object_object_length(h.metadata) : 0;
  if (file) {
    file->names = calloc(h.count ? h.count : 1, sizeof *file->names);
    file->tensors = calloc(h.count ? h.count : 1, sizeof *file->tensors);
    file->keys = calloc(meta ? meta : 1, sizeof *file->keys);
    file->values = calloc(meta ? meta : 1, sizeof *file->values);
  }
  if (!file || !file->names || !file->tensors || !file->keys || !file->values)
    status = kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate the list of %zu tensors", h.count);
  if (status == KILN_OK && h.metadata) {
    json_object_object_foreach(h.metadata, mkey, mvalue) {
      file->keys[file->metadata_count] = strdup(mkey);
      file->values[file->metadata_count] = strdup(json_object_get_string(mvalue));
      file->metadata_count++;
      if (!file->keys[file->metadata_count - 1] || !file->values[file->metadata_count - 1]) {
        status = kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot copy the metadata");
        break;
      }
    }
  }
  void *host = NULL;
  size_t host_size = 0;
  for (size_t i = 0; i < h.count && status == KILN_OK; i++) {
    const kiln_nn_st_entry_t *e = &h.entries[i];
    size_t bytes = (size_t)(e->end - e->begin);
    if (bytes > host_size) {
      void *bigger = realloc(host, bytes);
      if (!bigger) {
        status = kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate %zu bytes to read tensor \"%s\"", bytes, e->name);
        break;
      }
      host = bigger;
      host_size = bytes;
    }
    status = kiln_nn_st_read(src, h.data_start + e->begin, host, bytes);
    if (status != KILN_OK) break;
    file->names[i] = strdup(e->name);
    if (!file->names[i]) {
      status = kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot copy the name of tensor %zu", i);
      break;
    }
    file->count = i + 1;
    static const char empty[4];
    status = kiln_tensor_from_host(device, e->dtype, e->ndim, e->shape, bytes ? host : empty, &file->tensors[i]);
    if (status != KILN_OK) status = kiln_wrap_error(status, "%s: tensor \"%s\" to %s", src->name, e->name, kiln_device_name(device));
  }
  free(host);
  kiln_nn_st_header_free(&h);
  if (status != KILN_OK) {
    kiln_nn_safetensors_free(file);
    return status;
  }
  *out_file = file;
  return KILN_OK;
}

/* Open a regular file for reading; KILN_NOT_FOUND when it is absent. */
static kiln_status_t kiln_nn_st_open(const char *path, kiln_nn_st_source_t *src) {
  *src = (kiln_nn_st_source_t){.fd = -1, .name = path};
  /* O_NONBLOCK: opening a FIFO without a writer must not wait for one. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return kiln_nn_st_fail(src, errno == ENOENT ? KILN_NOT_FOUND : KILN_IO, "cannot open it: %s", strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_nn_st_fail(src, KILN_IO, "is not a regular file");
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int err = errno;
    close(fd);
    return kiln_nn_st_fail(src, KILN_IO, "cannot make its reads blocking: %s", strerror(err));
  }
  src->fd = fd;
  src->size = (uint64_t)st.st_size;
  return KILN_OK;
}

kiln_status_t kiln_nn_safetensors_load(const char *path, kiln_device_t *device, kiln_nn_safetensors_t **out_file) {
  if (!path || !device || !out_file)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_load: %s is NULL",
                          !path ? "path" : !device ? "device" : "out_file");
  kiln_nn_st_source_t src;
  kiln_status_t status = kiln_nn_st_open(path, &src);
  if (status != KILN_OK) return status;
  status = kiln_nn_st_load(&src, device, out_file);
  close(src.fd);
  return status;
}

kiln_status_t kiln_nn_safetensors_load_memory(const void *data, size_t size, kiln_device_t *device,
                                              kiln_nn_safetensors_t **out_file) {
  if ((!data && size) || !device || !out_file)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_load_memory: %s is NULL",
                          !device ? "device" : !out_file ? "out_file" : "data");
  kiln_nn_st_source_t src = {.fd = -1, .mem = data, .size = size, .name = "<memory>"};
  return kiln_nn_st_load(&src, device, out_file);
}

size_t kiln_nn_safetensors_count(const kiln_nn_safetensors_t *file) { return file ? file->count : 0; }

const char *kiln_nn_safetensors_name(const kiln_nn_safetensors_t *file, size_t i) {
  return file && i < file->count ? file->names[i] : NULL;
}

kiln_tensor_t *kiln_nn_safetensors_tensor(const kiln_nn_safetensors_t *file, size_t i) {
  return file && i < file->count ? file->tensors[i] : NULL;
}

kiln_status_t kiln_nn_safetensors_find(const kiln_nn_safetensors_t *file, const char *name, kiln_tensor_t **out_tensor) {
  if (!file || !name || !out_tensor)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_find: %s is NULL",
                          !file ? "file" : !name ? "name" : "out_tensor");
  for (size_t i = 0; i < file->count; i++) {
    if (!strcmp(file->names[i], name)) {
      *out_tensor = file->tensors[i];
      return KILN_OK;
    }
  }
  return kiln_set_error(KILN_NOT_FOUND, "kiln_nn_safetensors_find: no tensor \"%s\" among the file's %zu", name,
                        file->count);
}

size_t kiln_nn_safetensors_metadata_count(const kiln_nn_safetensors_t *file) { return file ? file->metadata_count : 0; }

kiln_status_t kiln_nn_safetensors_metadata(const kiln_nn_safetensors_t *file, size_t i, const char **out_key,
                                           const char **out_value) {
  if (!file || !out_key || !out_value)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_metadata: %s is NULL",
                          !file ? "file" : !out_key ? "out_key" : "out_value");
  if (i >= file->metadata_count)
    return kiln_set_error(KILN_NOT_FOUND, "kiln_nn_safetensors_metadata: entry %zu of %zu", i, file->metadata_count);
  *out_key = file->keys[i];
  *out_value = file->values[i];
  return KILN_OK;
}

const char *kiln_nn_safetensors_metadata_value(const kiln_nn_safetensors_t *file, const char *key) {
  if (!file || !key) return NULL;
  for (size_t i = 0; i < file->metadata_count; i++)
    if (!strcmp(file->keys[i], key)) return file->values[i];
  return NULL;
}

/* ---- loading into existing tensors ------------------------------------------------ */

static void kiln_nn_tensor_shape_text(const kiln_tensor_t *t, char *text, size_t size) {
  kiln_nn_st_entry_t e = {.ndim = kiln_tensor_ndim(t)};
  memcpy(e.shape, kiln_tensor_shape(t), (size_t)e.ndim * sizeof *e.shape);
  kiln_nn_st_shape_text(&e, text, size);
}

/* Every asked-for tensor present, alike in dtype and shape, contiguous. */
static kiln_status_t kiln_nn_st_match(const kiln_nn_st_source_t *src, const kiln_nn_st_header_t *h,
                                      const kiln_nn_named_tensor_t *tensors, size_t count, bool strict,
                                      size_t *out_entry) {
  bool *used = calloc(h->count ? h->count : 1, sizeof *used);
  if (!used) return kiln_nn_st_fail(src, KILN_OUT_OF_MEMORY, "cannot allocate the match of %zu tensors", h->count);
  kiln_status_t status = KILN_OK;
  for (size_t i = 0; i < count && status == KILN_OK; i++) {
    const char *name = tensors[i].name;
    kiln_tensor_t *t = tensors[i].tensor;
    size_t j = 0;
    while (j < h->count && strcmp(h->entries[j].name, name)) j++;
    if (j == h->count) {
      char some[512] = "";
      size_t used_chars = 0;
      for (size_t k = 0; k < h->count && k < 6 && used_chars < sizeof some; k++)
        used_chars += (size_t)snprintf(some + used_chars, sizeof some - used_chars, "%s\"%.60s\"", k ? ", " : "",
                                       h->entries[k].name);
      status = kiln_nn_st_fail(src, KILN_NOT_FOUND, "no tensor \"%s\" in the file; it holds %zu: %s%s", name, h->count,
                               h->count ? some : "none", h->count > 6 ? ", ..." : "");
      break;
    }
    const kiln_nn_st_entry_t *e = &h->entries[j];
    char file_shape[256], tensor_shape[256];
    kiln_nn_st_shape_text(e, file_shape, sizeof file_shape);
    kiln_nn_tensor_shape_text(t, tensor_shape, sizeof tensor_shape);
    bool same_shape = kiln_tensor_ndim(t) == e->ndim &&
                      !memcmp(kiln_tensor_shape(t), e->shape, (size_t)e->ndim * sizeof *e->shape);
    if (kiln_tensor_dtype(t) != e->dtype)
      status = kiln_nn_st_fail(src, KILN_DTYPE_MISMATCH,
                               "tensor \"%s\": the file holds %s %s, the tensor to load into is %s %s; nothing is "
                               "converted on loading: save the checkpoint as %s (in PyTorch: {k: v.to(torch.%s) for k, "
                               "v in state_dict.items()}), or read it with kiln_nn_safetensors_load and convert with "
                               "kiln_tensor_cast",
                               name, kiln_nn__st_dtype_name(e->dtype), file_shape,
                               kiln_dtype_name(kiln_tensor_dtype(t)), tensor_shape,
                               kiln_nn__st_dtype_name(kiln_tensor_dtype(t)),
                               kiln_dtype_long_name(kiln_tensor_dtype(t)));
    else if (!same_shape)
      status = kiln_nn_st_fail(src, KILN_SHAPE_MISMATCH,
                               "tensor \"%s\": the file holds %s %s, the tensor to load into is %s %s", name,
                               kiln_nn__st_dtype_name(e->dtype), file_shape, kiln_dtype_name(kiln_tensor_dtype(t)),
                               tensor_shape);
    else if (!kiln_tensor_is_contiguous(t))
      status = kiln_nn_st_fail(src, KILN_INVALID_ARGUMENT,
                               "tensor \"%s\" is a non-contiguous view; load into the contiguous tensor it views", name);
    used[j] = true;
    out_entry[i] = j;
  }
  for (size_t j = 0; strict && status == KILN_OK && j < h->count; j++)
    if (!used[j])
      status = kiln_nn_st_fail(src, KILN_INVALID_ARGUMENT,
                               "the file's tensor \"%s\" was not asked for; pass strict = false to leave it out",
                               h->entries[j].name);
  free(used);
  return status;
}

kiln_status_t kiln_nn_safetensors_load_into(const char *path, const kiln_nn_named_tensor_t *tensors, size_t count,
                                            bool strict) {
  if (!path || (!tensors && count))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_load_into: %s is NULL", !path ? "path" : "tensors");
  for (size_t i = 0; i < count; i++)
    if (!tensors[i].name || !tensors[i].tensor)
      return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_safetensors_load_into: tensors[%zu].%s is NULL", i,
                            !tensors[i].name ? "name" : "tensor");
  kiln_nn_st_source_t src;
  kiln_status_t status = kiln_nn_st_open(path, &src);
  if (status != KILN_OK) return status;
  kiln_nn_st_header_t h;
  status = kiln_nn_st_parse(&src, &h);
  if (status != KILN_OK) {
    close(src.fd);
    return status;
  }
  size_t *entry = calloc(count ? count : 1, sizeof *entry);
  if (!entry) status = kiln_nn_st_fail(&src, KILN_OUT_OF_MEMORY, "cannot allocate the match of %zu tensors", count);
  if (status == KILN_OK) status = kiln_nn_st_match(&src, &h, tensors, count, strict, entry);
  void *host = NULL;
  size_t host_size = 0;
  for (size_t i = 0; i < count && status == KILN_OK; i++) {
    const kiln_nn_st_entry_t *e = &h.entries[entry[i]];
    kiln_tensor_t *t = tensors[i].tensor;
    size_t bytes = (size_t)(e->end - e->begin);
    if (bytes == 0) continue;
    if (bytes > host_size) {
      void *bigger = realloc(host, bytes);
      if (!bigger) {
        status = kiln_nn_st_fail(&src, KILN_OUT_OF_MEMORY, "cannot allocate %zu bytes to read tensor \"%s\"", bytes,
                                 e->name);
        break;
      }
      host = bigger;
      host_size = bytes;
    }
    status = kiln_nn_st_read(&src, h.data_start + e->begin, host, bytes);
    if (status != KILN_OK) break;
    kiln_device_t *device = kiln_tensor_device(t);
    status = kiln_buffer_write(kiln_device_current_queue(device), kiln_tensor_buffer(t), kiln_tensor_offset_bytes(t),
                               host, bytes, true, 0, NULL, NULL);
    if (status != KILN_OK)
      status = kiln_wrap_error(status, "%s: tensor \"%s\" to %s", path, e->name, kiln_device_name(device));
  }
  free(host);
  free(entry);
  kiln_nn_st_header_free(&h);
  close(src.fd);
  return status;
}
