/* tests/test_selector.c: the KILN_DEVICE grammar: which devices valid selectors accept, and the errors of bad ones. */
#include "common.h"
#include "runtime/internal.h"

/* A machine to match against: backend, type, backend index. */
static const struct {
  const char *backend;
  kiln_device_type_t type;
  uint32_t index;
} kt_devices[] = {
    {"cuda", KILN_DEVICE_GPU, 0},    /* bit 0 */
    {"cuda", KILN_DEVICE_GPU, 1},    /* bit 1 */
    {"opencl", KILN_DEVICE_GPU, 0},  /* bit 2 */
    {"opencl", KILN_DEVICE_CPU, 1},  /* bit 3 */
    {"opencl", KILN_DEVICE_ACCELERATOR, 2}, /* bit 4 */
    {"cpu", KILN_DEVICE_CPU, 0},     /* bit 5 */
    {"cpu", KILN_DEVICE_CPU, 1},     /* bit 6 */
};
#define KT_ALL 0x7fu

/* A valid selector and the set of kt_devices it accepts (bit i = device i). */
static const struct {
  const char *text;
  unsigned accepted;
  size_t terms;
} kt_valid[] = {
    {"*:*", KT_ALL, 1},
    {"cuda:0", 0x01, 1},
    {"cuda:1", 0x02, 1},
    {"cuda:*", 0x03, 1},
    {"opencl:gpu", 0x04, 1},
    {"opencl:cpu", 0x08, 1},
    {"opencl:accelerator", 0x10, 1},
    {"*:gpu", 0x07, 1},
    {"*:cpu", 0x68, 1},
    {"*:0", 0x25, 1},
    {"cpu:1", 0x40, 1},
    {"cuda:0,1", 0x03, 2},
    {"opencl:gpu,cpu", 0x0c, 2},
    {"cuda:0;opencl:2", 0x11, 2},
    {"!opencl:cpu", KT_ALL & ~0x08u, 1},
    {"!cuda:*;!cpu:1", 0x3c, 2},
    {"*:*;!opencl:cpu", KT_ALL & ~0x08u, 2},
    {"opencl:*;!opencl:1", 0x14, 2},
    {"!opencl:1;opencl:*", 0x14, 2},       /* discards win wherever they stand */
    {"opencl:1;!opencl:cpu", 0x00, 2},     /* accepted and discarded: discarded */
    {"nosuch:*", 0x00, 1},
    {"!nosuch:*", KT_ALL, 1},
    {"cuda:7", 0x00, 1},
    {"*:gpu;!cuda:1", 0x05, 2},
    {"cpu:0,1,0", 0x60, 3},
};

START_TEST(test_valid) {
  kiln__selector_t sel;
  const char *text = kt_valid[_i].text;
  ck_assert_msg(kiln__selector_parse(text, &sel) == KILN_OK, "%s: %s", text, kiln_last_error());
  ck_assert_uint_eq(sel.count, kt_valid[_i].terms);
  unsigned accepted = 0;
  for (size_t d = 0; d < sizeof kt_devices / sizeof kt_devices[0]; d++)
    if (kiln__selector_accepts(&sel, kt_devices[d].backend, kt_devices[d].type, kt_devices[d].index))
      accepted |= 1u << d;
  ck_assert_msg(accepted == kt_valid[_i].accepted, "%s accepts 0x%02x, expected 0x%02x", text, accepted,
                kt_valid[_i].accepted);
}
END_TEST

/* An invalid selector and a fragment of its message. */
static const struct {
  const char *text, *needle;
} kt_invalid[] = {
    {"", "the selector is empty"},
    {"opencl", "Incomplete selector 'opencl': try 'opencl:*'"},
    {"!opencl", "Incomplete selector '!opencl': try '!opencl:*'"},
    {"cuda:", "Incomplete selector 'cuda:': try 'cuda:*'"},
    {"cuda:0:1", "too many colons in 'cuda:0:1'"},
    {"[opencl:gpu][opencl:0]", "too many colons"},
    {"opencl:gpux", "unknown device 'gpux' in 'opencl:gpux'; use *, cpu, gpu, accelerator or an index"},
    {"opencl:-1", "unknown device '-1' in 'opencl:-1'"},
    {"cuda:0,", "empty device in 'cuda:0,'"},
    {"cuda:,0", "empty device in 'cuda:,0'"},
    {"cuda:0;;cpu:0", "empty term"},
    {"cuda:0;", "empty term"},
    {";cuda:0", "empty term"},
    {":0", "no backend before ':' in ':0'; try '*:0'"},
    {"!", "'!' names no backend"},
    {"OpenCL:gpu", "'OpenCL' in 'OpenCL:gpu' is not a backend name"},
    {"cu da:0", "is not a backend name"},
    {"cuda:99999999999", "device index 99999999999 in 'cuda:99999999999' is too large"},
    {"cuda:0 ", "unknown device '0 '"},
    /* A bare type is meant for every backend: the hint must say so. */
    {"gpu", "Incomplete selector 'gpu': try '*:gpu'"},
    {"!accelerator", "Incomplete selector '!accelerator': try '!*:accelerator'"},
    {"cpu", "try 'cpu:*' (the cpu backend's devices) or '*:cpu' (every cpu device"},
    {"0", "try '*:0'"},
};

START_TEST(test_invalid) {
  kiln__selector_t sel;
  sel.count = 12345;
  KT_FAILS(kiln__selector_parse(kt_invalid[_i].text, &sel), KILN_INVALID_ARGUMENT, kt_invalid[_i].needle);
  /* The output is left alone on failure. */
  ck_assert_uint_eq(sel.count, 12345);
}
END_TEST

/* With the backends kiln knows (what KILN_DEVICE is checked against): a term
 * naming another backend, or a bare word that is neither a backend nor a
 * type, is an error that lists the backends; a hint never leads to a
 * selector that would select nothing. */
static const struct {
  const char *text, *needle;
} kt_unknown[] = {
    {"bogus", "'bogus' is neither a backend nor a device type; a term is backend:devices with backend one of cuda, "
              "opencl, cpu or '*'"},
    {"bogus:*", "unknown backend 'bogus' in 'bogus:*'; the backends are cuda, opencl, cpu"},
    {"opencl:gpu;!rocm:0", "unknown backend 'rocm' in '!rocm:0'"},
    {"Gpu", "'Gpu' is neither a backend nor a device type"},
    {"gpu", "try '*:gpu'"},
    {"opencl", "Incomplete selector 'opencl': try 'opencl:*'"},
};

START_TEST(test_unknown_backend) {
  kiln__selector_t sel;
  KT_FAILS(kiln__selector_parse_known(kt_unknown[_i].text, "cuda,opencl,cpu", &sel), KILN_INVALID_ARGUMENT,
           kt_unknown[_i].needle);
  ck_assert_msg(strstr(kiln_last_error(), "bogus:*") == NULL || !strcmp(kt_unknown[_i].text, "bogus:*"),
                "a hint leads to bogus:*: %s", kiln_last_error());
  /* Known names and '*' pass. */
  KT_OK(kiln__selector_parse_known("cuda:0;opencl:gpu;!cpu:1;*:accelerator", "cuda,opencl,cpu", &sel));
  ck_assert_uint_eq(sel.count, 4);
}
END_TEST

/* The same through KILN_DEVICE: the backends are the default ones and those
 * of KILN_BACKEND. */
START_TEST(test_unknown_backend_in_environment) {
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_DEVICE", "bogus", 1);
  KT_FAILS(kiln_ensure_initialized(), KILN_INVALID_ARGUMENT,
           "KILN_DEVICE=\"bogus\" is not a device selector: 'bogus' is neither a backend nor a device type");
  ck_assert_ptr_nonnull(strstr(kiln_last_error(), "cuda, opencl, cpu"));
  kiln_deinitialize();
  setenv("KILN_DEVICE", "bogus:*", 1);
  KT_FAILS(kiln_ensure_initialized(), KILN_INVALID_ARGUMENT, "unknown backend 'bogus' in 'bogus:*'");
  kiln_deinitialize();
  setenv("KILN_DEVICE", "gpu", 1);
  KT_FAILS(kiln_ensure_initialized(), KILN_INVALID_ARGUMENT, "try '*:gpu'");
  kiln_deinitialize();
  /* A plugin named in KILN_BACKEND is a backend KILN_DEVICE may name. */
  setenv("KILN_BACKEND", "cpu,stub", 1);
  setenv("KILN_DEVICE", "stub:*;cpu:*", 1);
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_eq(count, 2);
  kiln_deinitialize();
  unsetenv("KILN_DEVICE");
  unsetenv("KILN_BACKEND");
}
END_TEST

START_TEST(test_grammar_in_messages) {
  kiln__selector_t sel;
  KT_FAILS(kiln__selector_parse("", &sel), KILN_INVALID_ARGUMENT, "terms joined by ';'");
  KT_FAILS(kiln__selector_parse(NULL, &sel), KILN_INVALID_ARGUMENT, "NULL");
  ck_assert(!kiln__selector_accepts(NULL, "cpu", KILN_DEVICE_CPU, 0));
}
END_TEST

START_TEST(test_too_many_terms) {
  char text[1024] = "cpu:0";
  for (int i = 1; i < 33; i++) {
    char term[16];
    snprintf(term, sizeof term, ",%d", i);
    strcat(text, term);
  }
  kiln__selector_t sel;
  KT_FAILS(kiln__selector_parse(text, &sel), KILN_INVALID_ARGUMENT, "more than 32 devices");
  text[strlen(text) - 3] = '\0'; /* 32 devices fit */
  KT_OK(kiln__selector_parse(text, &sel));
  ck_assert_uint_eq(sel.count, 32);
}
END_TEST

/* The selector applied by the registry: KILN_DEVICE hides the other devices,
 * and kiln_device_find takes single terms. */
START_TEST(test_device_filter) {
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_CPU_DEVICES", "3", 1);
  setenv("KILN_DEVICE", "cpu:*;!cpu:1", 1);
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_eq(count, 2);
  kiln_device_t *d0, *d1, *found;
  KT_OK(kiln_device_get(0, &d0));
  KT_OK(kiln_device_get(1, &d1));
  ck_assert_str_eq(kiln_device_selector(d0), "cpu:0");
  ck_assert_str_eq(kiln_device_selector(d1), "cpu:2");
  kiln_device_info_t info;
  KT_OK(kiln_device_info(d1, &info));
  ck_assert_uint_eq(info.index, 1);
  ck_assert_uint_eq(info.backend_index, 2);
  ck_assert(!info.is_default);
  KT_OK(kiln_device_info(d0, &info));
  ck_assert(info.is_default);
  KT_OK(kiln_device_find("cpu:2", &found));
  ck_assert_ptr_eq(found, d1);
  KT_OK(kiln_device_find("cpu", &found));
  ck_assert_ptr_eq(found, d0);
  KT_OK(kiln_device_find("*:cpu", &found));
  ck_assert_ptr_eq(found, d0);
  KT_FAILS(kiln_device_find("cpu:1", &found), KILN_NOT_FOUND, "no visible device matches; visible: cpu:0, cpu:2");
  KT_FAILS(kiln_device_find("gpu", &found), KILN_NOT_FOUND, "visible: cpu:0, cpu:2");
  KT_FAILS(kiln_device_find("cpu:0;cpu:2", &found), KILN_INVALID_ARGUMENT, "give one term");
  KT_FAILS(kiln_device_find("!cpu:0", &found), KILN_INVALID_ARGUMENT, "give one term");
  KT_FAILS(kiln_device_find("cpu:0:0", &found), KILN_INVALID_ARGUMENT, "too many colons");
  KT_FAILS(kiln_device_get(2, &found), KILN_NOT_FOUND, "there are 2 visible devices");
  /* No GPU here: try_gpu falls back to the first CPU device. */
  ck_assert_ptr_eq(kiln_try_gpu(0), d0);
  ck_assert_ptr_eq(kiln_try_gpu(5), d0);
  kiln_device_t *all[4];
  size_t n = 0;
  KT_OK(kiln_try_all_gpus(all, 4, &n));
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_eq(all[0], d0);
  KT_OK(kiln_try_all_gpus(NULL, 0, &n));
  ck_assert_uint_eq(n, 1);
  kiln_deinitialize();

  /* A selector that hides every device is an error that lists the devices
   * there are, and every later call repeats it. */
  setenv("KILN_DEVICE", "cuda:*", 1);
  KT_FAILS(kiln_device_count(&count), KILN_NOT_FOUND,
           "KILN_DEVICE=\"cuda:*\" leaves no device visible; the devices found are: cpu:0 to cpu:2");
  KT_FAILS(kiln_device_default(&found), KILN_NOT_FOUND, "leaves no device visible");
  kiln_deinitialize();
  setenv("KILN_DEVICE", "!cpu:*", 1);
  KT_FAILS(kiln_ensure_initialized(), KILN_NOT_FOUND, "KILN_DEVICE=\"!cpu:*\" leaves no device visible");
  kiln_deinitialize();
  /* Through the API, the message names the field. */
  unsetenv("KILN_DEVICE");
  kiln_config_t config;
  kiln_config_initialize(&config);
  config.device = "cpu:7";
  KT_FAILS(kiln_initialize(&config), KILN_NOT_FOUND, "kiln_config_t.device=\"cpu:7\" leaves no device visible");
  kiln_deinitialize();
  unsetenv("KILN_DEVICE");
  unsetenv("KILN_CPU_DEVICES");
  unsetenv("KILN_BACKEND");
}
END_TEST

static Suite *selector_suite(void) {
  Suite *s = suite_create("selector");
  TCase *tc = tcase_create("grammar");
  tcase_add_loop_test(tc, test_valid, 0, (int)(sizeof kt_valid / sizeof kt_valid[0]));
  tcase_add_loop_test(tc, test_invalid, 0, (int)(sizeof kt_invalid / sizeof kt_invalid[0]));
  tcase_add_test(tc, test_grammar_in_messages);
  tcase_add_test(tc, test_too_many_terms);
  tcase_add_loop_test(tc, test_unknown_backend, 0, (int)(sizeof kt_unknown / sizeof kt_unknown[0]));
  suite_add_tcase(s, tc);
  TCase *devices = tcase_create("devices");
  tcase_add_test(devices, test_device_filter);
  tcase_add_test(devices, test_unknown_backend_in_environment);
  suite_add_tcase(s, devices);
  return s;
}

int main(void) {
  kt_private_cache_dir();
  return kt_run_suite(selector_suite());
}
