/* tests/test_static_link.c: a program linked statically against libkiln loads a plugin and lists its device. */
#include "common.h"

START_TEST(test_stub_through_backend_path) {
  setenv("KILN_BACKEND", "stub,cpu", 1);
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_ge(count, 2);
  kiln_device_t *stub = NULL;
  KT_OK(kiln_device_find("stub:0", &stub));
  kiln_device_info_t info;
  KT_OK(kiln_device_info(stub, &info));
  ck_assert_str_eq(info.selector, "stub:0");
  ck_assert_str_eq(info.name, "kiln stub device");
  ck_assert_int_eq(info.type, KILN_DEVICE_ACCELERATOR);

  kiln_backend_info_t b;
  KT_OK(kiln_backend_info(0, &b));
  ck_assert_str_eq(b.name, "stub");
  ck_assert_int_eq(b.state, KILN_BACKEND_LOADED);
  /* Found in the first folder of KILN_BACKEND_PATH, where the tests' plugins are. */
  const char *search = getenv("KILN_BACKEND_PATH");
  if (search && *search) {
    char expected[4200];
    size_t len = strcspn(search, ":");
    snprintf(expected, sizeof expected, "%.*s/libkiln-stub.so", (int)len, search);
    ck_assert_str_eq(b.path, expected);
  }

  /* The device is listed in the visible order, with a pasteable selector. */
  bool listed = false;
  for (size_t i = 0; i < count; i++) {
    kiln_device_t *d;
    KT_OK(kiln_device_get(i, &d));
    listed = listed || !strcmp(kiln_device_selector(d), "stub:0");
  }
  ck_assert(listed);
  kiln_deinitialize();
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  const char *search = getenv("KILN_BACKEND_PATH");
  if (!search || !*search) {
    /* Run by hand outside `meson test`: the build-tree search still finds the stub. */
    fprintf(stderr, "test_static_link: KILN_BACKEND_PATH unset; relying on the build-tree search\n");
  }
  Suite *s = suite_create("static_link");
  TCase *tc = tcase_create("plugins");
  tcase_add_test(tc, test_stub_through_backend_path);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
