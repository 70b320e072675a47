/* tests/nn/test_nn_safetensors_hostile.c: truncated and hostile safetensors files, each refused with its exact message, and thousands of mutated files that must never crash. */
#include "nn_test.h"

/* A file from a header and data bytes; the length field says `len`
 * (UINT64_MAX: the header's own length). */
static uint8_t *kt_st(const char *header, size_t header_len, uint64_t len, size_t data_len, size_t *out_size) {
  if (len == UINT64_MAX) len = header_len;
  size_t size = 8 + header_len + data_len;
  uint8_t *b = calloc(1, size);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(len >> (8 * i));
  memcpy(b + 8, header, header_len);
  for (size_t i = 0; i < data_len; i++) b[8 + header_len + i] = (uint8_t)i;
  *out_size = size;
  return b;
}

typedef struct kt_case_t {
  const char *header;
  size_t data_len;
  kiln_status_t status;
  const char *message; /* after "<memory>: "; a prefix when it ends in '*' */
} kt_case_t;

#define T(dtype, shape, b, e) "{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"

static const kt_case_t kt_cases[] = {
    {"[1,2]", 0, KILN_IO, "the header does not start with '{' (byte 0x5b)"},
    {"{\"a\":", 0, KILN_IO, "the header's JSON ends early (after 5 bytes)"},
    {"{\"a\" 1}", 0, KILN_IO, "the header is not valid JSON: *"},
    {"{\"a\":[1,2,]}", 0, KILN_IO, "the header is not valid JSON: unexpected character at byte 10"},
    {"{\"a\":\"\xff\"}", 0, KILN_IO, "the header is not valid JSON: invalid utf-8 string at byte 6"},
    {"{\"a\":[[[[[[[[[[1]]]]]]]]]]}", 0, KILN_IO, "the header is not valid JSON: nesting too deep at byte *"},
    {"{} x", 0, KILN_IO, "the header has byte 0x78 after its JSON object, at offset 3"},
    {"{\"a\":5}", 0, KILN_IO, "tensor \"a\" is a JSON int, not an object with dtype, shape and data_offsets"},
    {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, KILN_IO, "tensor \"a\": \"dtype\" is missing, not a string"},
    {"{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, KILN_IO, "tensor \"a\": \"dtype\" is int, not a string"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4, KILN_IO,
     "tensor \"a\": \"shape\" is string, not an array"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, KILN_IO,
     "tensor \"a\": \"data_offsets\" is missing, not an array [begin, end]"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, KILN_IO,
     "tensor \"a\": \"data_offsets\" is an array of another length, not an array [begin, end]"},
    {"{\"a\":" T("Q7", "[1]", "0", "4") "}", 4, KILN_IO,
     "tensor \"a\" has dtype \"Q7\", which is no safetensors dtype (F32, I32, F16, BF16, F64, I64, U8, BOOL ...)"},
    {"{\"a\":" T("U16", "[2]", "0", "4") "}", 4, KILN_UNSUPPORTED,
     "tensor \"a\" has dtype U16, which kiln does not have (it reads BOOL, U8, I8, I16, I32, I64, F16, BF16, F32 and "
     "F64); convert it before saving (e.g. tensor.float() or tensor.to(torch.int64) in PyTorch)"},
    /* Byte counts follow each dtype's size. */
    {"{\"a\":" T("F16", "[2]", "0", "6") "}", 6, KILN_IO,
     "tensor \"a\": data_offsets [0, 6] hold 6 bytes, but shape [2] of F16 needs 4"},
    {"{\"a\":" T("F64", "[1]", "0", "4") "}", 4, KILN_IO,
     "tensor \"a\": data_offsets [0, 4] hold 4 bytes, but shape [1] of F64 needs 8"},
    {"{\"a\":" T("BOOL", "[3]", "0", "3") ",\"b\":" T("BF16", "[2]", "3", "7") "}", 7, KILN_OK, ""},
    {"{\"a\":" T("F32", "[-1]", "0", "4") "}", 4, KILN_IO, "tensor \"a\": shape[0] is out of range, not an integer in [0, 2^63)"},
    {"{\"a\":" T("F32", "[1.5]", "0", "4") "}", 4, KILN_IO, "tensor \"a\": shape[0] is double, not an integer in [0, 2^63)"},
    {"{\"a\":" T("F32", "[null]", "0", "4") "}", 4, KILN_IO, "tensor \"a\": shape[0] is null, not an integer in [0, 2^63)"},
    {"{\"a\":" T("F32", "[4294967296,4294967296]", "0", "4") "}", 4, KILN_IO,
     "tensor \"a\": the byte size of shape [4294967296, 4294967296] overflows 64 bits"},
    {"{\"a\":" T("F32", "[4611686018427387904]", "0", "4") "}", 4, KILN_IO,
     "tensor \"a\": the byte size of shape [4611686018427387904] overflows 64 bits"},
    {"{\"a\":" T("F32", "[1,1,1,1,1,1,1,1,1]", "0", "4") "}", 4, KILN_UNSUPPORTED,
     "tensor \"a\" has 9 dimensions; kiln tensors have at most 8"},
    {"{\"a\":" T("F32", "[1]", "4", "0") "}", 4, KILN_IO, "tensor \"a\": data_offsets [4, 0] end before they begin"},
    {"{\"a\":" T("F32", "[1]", "0", "18446744073709551616") "}", 4, KILN_IO,
     "tensor \"a\": data_offsets[1] is out of range, not an integer in [0, 2^63)"},
    {"{\"a\":" T("F32", "[1]", "\"0\"", "4") "}", 4, KILN_IO,
     "tensor \"a\": data_offsets[0] is string, not an integer in [0, 2^63)"},
    {"{\"a\":" T("F32", "[2]", "0", "4") "}", 4, KILN_IO,
     "tensor \"a\": data_offsets [0, 4] hold 4 bytes, but shape [2] of F32 needs 8"},
    {"{\"a\":" T("F32", "[2]", "0", "8") "}", 4, KILN_IO,
     "tensor \"a\": data_offsets [0, 8] run past the end of the data section (4 bytes): the file is truncated or its "
     "offsets are wrong"},
    {"{\"a\":" T("I32", "[2305843009213693951]", "0", "9223372036854775804") "}", 4, KILN_IO,
     "tensor \"a\": data_offsets [0, 9223372036854775804] run past the end of the data section (4 bytes): the file is "
     "truncated or its offsets are wrong"},
    {"{\"a\":" T("F32", "[2]", "0", "8") ",\"b\":" T("F32", "[1]", "4", "8") "}", 8, KILN_IO,
     "tensor \"b\": data_offsets [4, 8] overlap tensor \"a\" (ending at 8)"},
    {"{\"a\":" T("F32", "[1]", "4", "8") "}", 8, KILN_IO,
     "tensor \"a\": data_offsets [4, 8] leave a gap of 4 bytes before it; the data must be contiguous"},
    {"{\"a\":" T("F32", "[1]", "0", "4") "}", 8, KILN_IO, "4 bytes follow the last tensor's data (the tensors cover 4 of 8)"},
    {"{}", 4, KILN_IO, "the header lists no tensor, yet 4 bytes of data follow it"},
    {"{\"__metadata__\":[1]}", 0, KILN_IO, "\"__metadata__\" is a JSON array, not an object of strings"},
    {"{\"__metadata__\":{\"k\":1}}", 0, KILN_IO, "\"__metadata__\" entry \"k\" is a JSON int, not a string"},
    /* What a C string cannot hold, what serde_json refuses and json-c lets
     * through, and names kiln's writer would not write. */
    {"{\"a\\u0000b\":" T("F32", "[1]", "0", "4") "}", 4, KILN_IO,
     "the header holds \\u0000 (a NUL) in a string, at offset 3; kiln's names and metadata are C strings and cannot "
     "hold it"},
    {"{\"__metadata__\\u0000x\":{\"k\":\"v\"}}", 0, KILN_IO,
     "the header holds \\u0000 (a NUL) in a string, at offset 14; kiln's names and metadata are C strings and cannot "
     "hold it"},
    {"{\"__metadata__\":{\"k\":\"v\\u0000w\"}}", 0, KILN_IO,
     "the header holds \\u0000 (a NUL) in a string, at offset 23; kiln's names and metadata are C strings and cannot "
     "hold it"},
    {"{\"a\x01\":" T("F32", "[1]", "0", "4") "}", 4, KILN_IO,
     "the header holds the raw control byte 0x01 in a string, at offset 3"},
    {"{\"__metadata__\":{\"k\":\"v\nw\"}}", 0, KILN_IO,
     "the header holds the raw control byte 0x0a in a string, at offset 23"},
    {"{\"\\ud800\":" T("F32", "[1]", "0", "4") "}", 4, KILN_IO,
     "the header holds a lone UTF-16 surrogate \\ud800 in a string, at offset 2; it is no Unicode character"},
    {"{\"\\ud800\\u0041\":" T("F32", "[1]", "0", "4") "}", 4, KILN_IO,
     "the header holds a lone UTF-16 surrogate \\ud800 in a string, at offset 2; it is no Unicode character"},
    {"{\"x\\uDC00\":" T("F32", "[1]", "0", "4") "}", 4, KILN_IO,
     "the header holds a lone UTF-16 surrogate \\udc00 in a string, at offset 3; it is no Unicode character"},
    {"{\"ab\\u0001\":" T("F32", "[1]", "0", "4") "}", 4, KILN_IO,
     "a tensor name \"ab...\" holds the control character U+0001 at byte 2"},
    {"{\"__metadata__\":{\"k\\u001f\":\"v\"}}", 0, KILN_IO,
     "a \"__metadata__\" key \"k...\" holds the control character U+001F at byte 1"},
    /* A surrogate pair is one character; an escaped newline in a value is text. */
    {"{\"\\ud83d\\ude00\":" T("F32", "[1]", "0", "4") "}", 4, KILN_OK, ""},
    {"{\"__metadata__\":{\"k\":\"v\\nw \\\\u0000\"}}", 0, KILN_OK, ""},
    {"{\"__metadata__\":{\"k\":\"v\"},\"a\":" T("F32", "[1]", "0", "4") "}    ", 4, KILN_OK, ""},
    {"{\"a\":" T("F32", "[0,3]", "0", "0") ",\"b\":" T("I32", "[]", "0", "4") "}", 4, KILN_OK, ""},
    {"{}", 0, KILN_OK, ""},
};

static void kt_check_case(const kt_case_t *c, const uint8_t *bytes, size_t size) {
  kiln_nn_safetensors_t *file = NULL;
  kiln_status_t got = kiln_nn_safetensors_load_memory(bytes, size, kt_nn_cpu(), &file);
  ck_assert_msg(got == c->status, "%s -> %s, expected %s: %s", c->header, kiln_status_name(got),
                kiln_status_name(c->status), kiln_last_error());
  if (got == KILN_OK) {
    kiln_nn_safetensors_free(file);
    return;
  }
  ck_assert_ptr_null(file);
  char expect[2048];
  snprintf(expect, sizeof expect, "<memory>: %s", c->message);
  size_t n = strlen(expect);
  if (expect[n - 1] == '*') ck_assert_msg(!strncmp(kiln_last_error(), expect, n - 1), "%s", kiln_last_error());
  else ck_assert_str_eq(kiln_last_error(), expect);
}

START_TEST(test_hostile_headers) {
  for (size_t i = 0; i < sizeof kt_cases / sizeof *kt_cases; i++) {
    size_t size = 0;
    uint8_t *b = kt_st(kt_cases[i].header, strlen(kt_cases[i].header), UINT64_MAX, kt_cases[i].data_len, &size);
    kt_check_case(&kt_cases[i], b, size);
    free(b);
  }
}
END_TEST

START_TEST(test_hostile_lengths) {
  kiln_nn_safetensors_t *file = NULL;
  kiln_device_t *cpu = kt_nn_cpu();
  const char *ok = "{\"a\":" T("F32", "[1]", "0", "4") "}";
  size_t size = 0;
  uint8_t *b = kt_st(ok, strlen(ok), 1ull << 63, 4, &size);
  ck_assert_int_eq(kiln_nn_safetensors_load_memory(b, size, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(),
                   "<memory>: header length 9223372036854775808 is over the format's limit of 100,000,000 bytes; this "
                   "is no safetensors file, or a damaged one");
  free(b);
  b = kt_st(ok, strlen(ok), 100000001, 4, &size);
  KT_FAILS(kiln_nn_safetensors_load_memory(b, size, cpu, &file), KILN_IO, "header length 100000001 is over");
  free(b);
  b = kt_st(ok, strlen(ok), UINT64_MAX - 3, 4, &size);
  KT_FAILS(kiln_nn_safetensors_load_memory(b, size, cpu, &file), KILN_IO, "header length 18446744073709551612 is over");
  free(b);
  b = kt_st(ok, strlen(ok), 200, 4, &size);
  char expect[8192];
  snprintf(expect, sizeof expect, "<memory>: header length 200 runs past the end of the file (%zu bytes follow the length)",
           size - 8);
  ck_assert_int_eq(kiln_nn_safetensors_load_memory(b, size, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  free(b);
  b = kt_st("{}", 2, 0, 0, &size);
  ck_assert_int_eq(kiln_nn_safetensors_load_memory(b, size, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), "<memory>: header length 0 cannot hold a JSON object");
  free(b);
  ck_assert_int_eq(kiln_nn_safetensors_load_memory("abcd", 4, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), "<memory>: truncated: 4 bytes, shorter than the 8-byte header length");
  b = kt_st("{}\0 ", 4, UINT64_MAX, 0, &size);
  ck_assert_int_eq(kiln_nn_safetensors_load_memory(b, size, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), "<memory>: the header holds a NUL byte at offset 2");
  free(b);
  KT_FAILS(kiln_nn_safetensors_load_memory(NULL, 8, cpu, &file), KILN_INVALID_ARGUMENT, "data is NULL");

  /* The same faults through a file, named by its path; a truncated file. */
  kt_nn_tmpdir();
  const char *path = kt_nn_path("cut.safetensors");
  b = kt_st(ok, strlen(ok), UINT64_MAX, 4, &size);
  kt_nn_write_file(path, b, size - 2);
  snprintf(expect, sizeof expect,
           "%s: tensor \"a\": data_offsets [0, 4] run past the end of the data section (2 bytes): the file is truncated "
           "or its offsets are wrong",
           path);
  ck_assert_int_eq(kiln_nn_safetensors_load(path, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  kt_nn_write_file(path, b, 20);
  snprintf(expect, sizeof expect, "%s: header length %zu runs past the end of the file (12 bytes follow the length)",
           path, strlen(ok));
  ck_assert_int_eq(kiln_nn_safetensors_load(path, cpu, &file), KILN_IO);
  ck_assert_str_eq(kiln_last_error(), expect);
  free(b);
  kt_nn_tmpdir_done();
}
END_TEST

/* Characters that change JSON's structure, for the mutations. */
static const char kt_json_chars[] = "{}[]\",:0123456789-.eE \\u";

/* Thousands of files derived from good ones by random edits, through the
 * reader on cpu:0: each is loaded or refused with a file error (KILN_IO,
 * KILN_UNSUPPORTED) and "<memory>: " in front, never a crash, a leak or an
 * out-of-bounds access (the sanitizer build runs this too). */
START_TEST(test_mutated_files) {
  size_t base_size[2];
  char path[4200];
  snprintf(path, sizeof path, "%s/reference.safetensors", getenv("KILN_NN_TEST_DATA"));
  uint8_t *bases[2];
  bases[0] = kt_nn_read_file(path, &base_size[0]);
  const char *small = "{\"__metadata__\":{\"k\":\"v\"},\"a\":" T("F32", "[2]", "0", "8") ",\"b\":" T("I32", "[1,1]", "8", "12") "}";
  bases[1] = kt_st(small, strlen(small), UINT64_MAX, 12, &base_size[1]);
  uint64_t state = 0x2545f4914f6cdd1dull;
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 3000; iter++) {
    int which = iter % 2;
    size_t cap = base_size[which] + 64, len = base_size[which];
    uint8_t *b = malloc(cap);
    memcpy(b, bases[which], len);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = header_len << 8 | b[i];
    int edits = 1 + (int)(kt_nn_rand(&state) % 3);
    for (int e = 0; e < edits; e++) {
      uint64_t r = kt_nn_rand(&state);
      /* Mostly inside the header, where the parser works. */
      size_t span = (r & 3) ? (size_t)header_len : len;
      size_t at = (r & 3) ? 8 + (size_t)((r >> 8) % span) : (size_t)((r >> 8) % len);
      if (at >= len) at = len - 1;
      switch ((r >> 4) % 7) {
      case 0: b[at] ^= (uint8_t)(1u << ((r >> 40) % 8)); break;
      case 1: b[at] = (uint8_t)kt_json_chars[(r >> 40) % (sizeof kt_json_chars - 1)]; break;
      case 2: b[(r >> 40) % 8] = (uint8_t)(r >> 48); break; /* the length field */
      case 3: len = at ? at : 1; break;
      case 4: { /* delete a run */
        size_t run = 1 + (size_t)((r >> 40) % 6);
        if (at + run < len) {
          memmove(b + at, b + at + run, len - at - run);
          len -= run;
        }
        break;
      }
      case 5: { /* repeat a run */
        size_t run = 1 + (size_t)((r >> 40) % 6);
        if (at + run <= len && len + run <= cap) {
          memmove(b + at + run, b + at, len - at);
          len += run;
        }
        break;
      }
      default: /* digits: the numbers in shapes and offsets */
        b[at] = (uint8_t)('0' + (r >> 40) % 10);
        break;
      }
    }
    kiln_nn_safetensors_t *file = NULL;
    kiln_status_t s = kiln_nn_safetensors_load_memory(b, len, kt_nn_cpu(), &file);
    if (s == KILN_OK) {
      for (size_t i = 0; i < kiln_nn_safetensors_count(file); i++)
        ck_assert_ptr_nonnull(kiln_nn_safetensors_tensor(file, i));
      kiln_nn_safetensors_free(file);
      accepted++;
    } else {
      ck_assert_msg(s == KILN_IO || s == KILN_UNSUPPORTED, "status %s: %s", kiln_status_name(s), kiln_last_error());
      ck_assert_msg(!strncmp(kiln_last_error(), "<memory>: ", 10), "%s", kiln_last_error());
      refused++;
    }
    free(b);
  }
  printf("test_mutated_files: %d loaded, %d refused\n", accepted, refused);
  ck_assert_int_gt(refused, 2000);
  free(bases[0]);
  free(bases[1]);
}
END_TEST

Suite *kt_hostile_suite(void);
Suite *kt_hostile_suite(void) {
  Suite *s = suite_create("nn_safetensors_hostile");
  TCase *tc = tcase_create("hostile");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_hostile_headers);
  tcase_add_test(tc, test_hostile_lengths);
  tcase_add_test(tc, test_mutated_files);
  suite_add_tcase(s, tc);
  return s;
}
