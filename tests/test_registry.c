/* tests/test_registry.c: plugin loading: the stub used end to end, ABI and loader refusals, missing plugins, defaults. */
#include <dlfcn.h>
#include <fcntl.h>

#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "runtime/internal.h"

static void kt_env(const char *backend) {
  unsetenv("KILN_DEVICE");
  unsetenv("KILN_CPU_DEVICES");
  if (backend) setenv("KILN_BACKEND", backend, 1);
  else unsetenv("KILN_BACKEND");
}

static bool kt_ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && !strcmp(s + n - m, tail);
}

/* The stub's call counter, read from the very file kiln loaded (dlopen of a
 * loaded file returns the same handle, so the counts are kiln's). */
static long kt_stub_calls(const char *path, const char *slot) {
  void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(handle != NULL, "%s is not loaded: %s", path, dlerror());
  long (*calls)(const char *) = NULL;
  void *symbol = dlsym(handle, "kiln_stub_calls");
  memcpy(&calls, &symbol, sizeof calls);
  ck_assert_ptr_nonnull(symbol);
  long n = calls(slot);
  dlclose(handle); /* drops only this extra reference */
  return n;
}

START_TEST(test_stub_used) {
  kt_env("stub,cpu");
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_ge(count, 2);

  /* An accelerator ranks before the CPU: the stub's device comes first. */
  kiln_device_t *stub = NULL;
  KT_OK(kiln_device_get(0, &stub));
  kiln_device_t *found = NULL;
  KT_OK(kiln_device_find("stub:0", &found));
  ck_assert_ptr_eq(found, stub);
  kiln_device_t *def = NULL;
  KT_OK(kiln_device_default(&def));
  ck_assert_ptr_eq(def, stub);
  ck_assert_str_eq(kiln_device_selector(stub), "stub:0");
  ck_assert_str_eq(kiln_device_name(stub), "stub:0 (kiln stub device)");

  kiln_device_info_t info;
  KT_OK(kiln_device_info(stub, &info));
  ck_assert_uint_eq(info.index, 0);
  ck_assert_str_eq(info.selector, "stub:0");
  ck_assert_str_eq(info.backend, "stub");
  ck_assert_uint_eq(info.backend_index, 0);
  ck_assert_int_eq(info.type, KILN_DEVICE_ACCELERATOR);
  ck_assert_str_eq(kiln_device_type_name(info.type), "accelerator");
  ck_assert_str_eq(info.name, "kiln stub device");
  ck_assert_str_eq(info.uuid, "stub-0000");
  ck_assert_uint_eq(info.memory_bytes, 1ull << 30);
  /* No device_memory_free slot: the total, marked as an estimate. */
  ck_assert_uint_eq(info.memory_free_bytes, 1ull << 30);
  ck_assert(info.memory_free_is_estimate);
  ck_assert(info.is_default);

  /* Its own property, and no providers entries: it has native kernels only. */
  ck_assert_uint_eq(kiln_device_property_count(stub), 1);
  const char *key, *value;
  KT_OK(kiln_device_property(stub, 0, &key, &value));
  ck_assert_str_eq(key, "stub_note");
  ck_assert_str_eq(value, "test backend on host memory");
  KT_FAILS(kiln_device_property(stub, 1, &key, &value), KILN_NOT_FOUND, "the device has 1 properties");
  ck_assert_str_eq(kiln_device_providers(stub, "fill"), "native");
  ck_assert_str_eq(kiln_device_providers(stub, "copy"), "native");
  ck_assert_str_eq(kiln_device_providers(stub, "matmul"), "");
  ck_assert_ptr_null(kiln_device_providers(stub, "gemm"));

  kiln_backend_info_t b;
  KT_OK(kiln_backend_count(&count));
  ck_assert_uint_eq(count, 2);
  KT_OK(kiln_backend_info(0, &b));
  ck_assert_str_eq(b.name, "stub");
  ck_assert_int_eq(b.state, KILN_BACKEND_LOADED);
  ck_assert_str_eq(kiln_backend_state_name(b.state), "loaded");
  ck_assert_str_eq(b.reason, "");
  ck_assert_str_eq(b.version, "stub 1.0");
  ck_assert_uint_eq(b.device_count, 1);
  ck_assert_msg(kt_ends_with(b.path, "/libkiln-stub.so"), "path %s", b.path);
  char path[1024];
  snprintf(path, sizeof path, "%s", b.path);
  KT_OK(kiln_backend_info(1, &b));
  ck_assert_str_eq(b.name, "cpu");
  ck_assert_str_eq(b.path, "builtin");
  ck_assert_int_eq(b.state, KILN_BACKEND_LOADED);
  KT_FAILS(kiln_backend_info(2, &b), KILN_NOT_FOUND, "kiln considered 2 backends");

  /* A buffer round-trips through the stub, and the stub saw the calls. */
  long allocs = kt_stub_calls(path, "buffer_allocate");
  kiln_buffer_t *buffer = NULL;
  KT_OK(kiln_buffer_create(stub, 64, &buffer));
  ck_assert_ptr_eq(kiln_buffer_device(buffer), stub);
  float in[16], out[16];
  for (int i = 0; i < 16; i++) in[i] = (float)i * 1.5f - 3.0f;
  memset(out, 0, sizeof out);
  kiln_queue_t *queue = kiln_device_default_queue(stub);
  ck_assert_ptr_nonnull(queue);
  KT_OK(kiln_buffer_write(queue, buffer, 0, in, sizeof in, true, 0, NULL, NULL));
  KT_OK(kiln_buffer_read(queue, buffer, 0, out, sizeof out, true, 0, NULL, NULL));
  ck_assert_mem_eq(out, in, sizeof in);
  kiln_buffer_release(buffer);
  ck_assert_int_eq(kt_stub_calls(path, "initialize"), 1);
  ck_assert_int_eq(kt_stub_calls(path, "device_describe"), 1);
  ck_assert_int_ge(kt_stub_calls(path, "queue_create"), 1);
  ck_assert_int_ge(kt_stub_calls(path, "buffer_allocate"), allocs + 1);
  ck_assert_int_ge(kt_stub_calls(path, "buffer_write"), 1);
  ck_assert_int_ge(kt_stub_calls(path, "buffer_read"), 1);
  ck_assert_int_eq(kt_stub_calls(path, "no_such_slot"), -1);

  /* kiln_deinitialize frees everything and deinitializes the backend, but
   * keeps the plugin mapped; a second start initializes it again. */
  kiln_deinitialize();
  ck_assert_int_eq(kt_stub_calls(path, "deinitialize"), 1);
  ck_assert_int_eq(kt_stub_calls(path, "buffer_allocate"), kt_stub_calls(path, "buffer_free"));
  ck_assert_int_eq(kt_stub_calls(path, "queue_create"), kt_stub_calls(path, "queue_destroy"));
  KT_OK(kiln_device_find("stub:0", &found));
  ck_assert_int_eq(kt_stub_calls(path, "initialize"), 2);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_build_tree_search) {
  /* Without KILN_BACKEND_PATH a kiln running from the build tree finds the
   * stub among the build tree's test plugins. */
  kt_env("stub,cpu");
  unsetenv("KILN_BACKEND_PATH");
  kiln_device_t *found = NULL;
  KT_OK(kiln_device_find("stub:0", &found));
  kiln_backend_info_t b;
  KT_OK(kiln_backend_info(0, &b));
  ck_assert_msg(kt_ends_with(b.path, "/tests/libkiln-stub.so"), "path %s", b.path);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_device_filter_and_order) {
  kt_env("cpu,stub");
  setenv("KILN_CPU_DEVICES", "2", 1);
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_eq(count, 3);
  /* Type rank first (accelerator before CPU) even though cpu has priority. */
  const char *expected[] = {"stub:0", "cpu:0", "cpu:1"};
  for (size_t i = 0; i < 3; i++) {
    kiln_device_t *d;
    KT_OK(kiln_device_get(i, &d));
    ck_assert_str_eq(kiln_device_selector(d), expected[i]);
  }
  kiln_deinitialize();
  setenv("KILN_DEVICE", "!stub:*", 1);
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_eq(count, 2);
  kiln_backend_info_t b;
  KT_OK(kiln_backend_info(1, &b));
  ck_assert_str_eq(b.name, "stub");
  ck_assert_int_eq(b.state, KILN_BACKEND_NO_DEVICE);
  ck_assert_uint_eq(b.device_count, 1);
  kiln_device_t *d;
  KT_OK(kiln_device_default(&d));
  ck_assert_str_eq(kiln_device_selector(d), "cpu:0");
  kiln_deinitialize();
  kt_env(NULL);
}
END_TEST

/* Load `backends` the way the default list is loaded (not explicit) into a
 * private runtime, so that a refused plugin is recorded instead of failing. */
static kiln__runtime_t kt_rt;
static void kt_load_quietly(const char *backends) {
  kiln_config_t api;
  kiln_config_initialize(&api);
  api.backend = backends;
  memset(&kt_rt, 0, sizeof kt_rt);
  KT_OK(kiln__config_load(&api, &kt_rt.config));
  kt_rt.config.backends_explicit = false;
  KT_OK(kiln__registry_load(&kt_rt));
}
static void kt_unload_quietly(void) {
  kiln__registry_unload(&kt_rt);
  kiln__config_free(&kt_rt.config);
}

START_TEST(test_bad_abi) {
  kt_env("badabi,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_ABI_MISMATCH, "backend 'badabi' named in KILN_BACKEND cannot be used");
  char want[160];
  snprintf(want, sizeof want,
           "libkiln-badabi.so was built for backend ABI 999, this libkiln speaks %u; rebuild the plugin against this kiln",
           KILN_BACKEND_ABI_VERSION);
  KT_FAILS(kiln_ensure_initialized(), KILN_ABI_MISMATCH, want);
  kiln_deinitialize();

  kt_load_quietly("badabi,cpu");
  kiln__backend_t *b = &kt_rt.backends[0];
  ck_assert_int_eq(b->info.state, KILN_BACKEND_ABI_MISMATCH);
  ck_assert_str_eq(kiln_backend_state_name(b->info.state), "abi mismatch");
  snprintf(want, sizeof want, "was built for backend ABI 999, this libkiln speaks %u", KILN_BACKEND_ABI_VERSION);
  ck_assert_msg(strstr(b->info.reason, want) != NULL, "%s", b->info.reason);
  ck_assert(kt_ends_with(b->info.path, "/libkiln-badabi.so"));
  ck_assert_uint_eq(b->info.device_count, 0);
  ck_assert_int_eq(kt_rt.backends[1].info.state, KILN_BACKEND_LOADED);
  ck_assert_uint_ge(kt_rt.device_count, 1);
  ck_assert_str_eq(kt_rt.devices[0]->selector, "cpu:0");
  kt_unload_quietly();
  kt_env(NULL);
}
END_TEST

START_TEST(test_missing_dependency) {
  kt_env("needsmissing");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "backend 'needsmissing' named in KILN_BACKEND cannot be used");
  /* The loader's own message, naming the library that is missing. */
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "libkiln-test-absent.so.1");
  kiln_deinitialize();

  kt_load_quietly("needsmissing,cpu");
  kiln__backend_t *b = &kt_rt.backends[0];
  ck_assert_int_eq(b->info.state, KILN_BACKEND_UNAVAILABLE);
  ck_assert_msg(strstr(b->info.reason, "libkiln-test-absent.so.1: cannot open shared object file") != NULL, "%s",
                b->info.reason);
  ck_assert(kt_ends_with(b->info.path, "/libkiln-needsmissing.so"));
  ck_assert_int_eq(kt_rt.backends[1].info.state, KILN_BACKEND_LOADED);
  kt_unload_quietly();
  kt_env(NULL);
}
END_TEST

START_TEST(test_no_such_backend) {
  kt_env("nosuch");
  const char *search = getenv("KILN_BACKEND_PATH");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE,
           "backend 'nosuch' named in KILN_BACKEND cannot be used: plugin libkiln-nosuch.so not found; tried: ");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "set KILN_BACKEND_PATH to the folder that holds it");
  if (search && *search && !strchr(search, ':')) {
    char tried[4200];
    snprintf(tried, sizeof tried, "%s/libkiln-nosuch.so", search);
    KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, tried);
  }
  size_t count;
  KT_FAILS(kiln_device_count(&count), KILN_UNAVAILABLE, "libkiln-nosuch.so not found");
  kiln_deinitialize();

  /* Every folder of KILN_BACKEND_PATH is tried, in order. */
  setenv("KILN_BACKEND_PATH", "/nonexistent/one:/nonexistent/two", 1);
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE,
           "tried: /nonexistent/one/libkiln-nosuch.so, /nonexistent/two/libkiln-nosuch.so");
  kiln_deinitialize();
  kt_env(NULL);
}
END_TEST

START_TEST(test_default_is_quiet) {
  /* The default list falls back quietly: missing plugins are recorded for
   * devinfo, the start succeeds, and nothing is printed. */
  kt_env(NULL);
  unsetenv("KILN_LOG");
  char log_path[4200];
  snprintf(log_path, sizeof log_path, "%s/stderr.txt", getenv("KILN_CACHE_DIR"));
  mkdir(getenv("KILN_CACHE_DIR"), 0700);
  fflush(stderr);
  int saved = dup(2);
  int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(fd, 0);
  dup2(fd, 2);
  kiln_status_t status = kiln_ensure_initialized();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  ck_assert_msg(status == KILN_OK, "%s", kiln_last_error());
  /* Vendor runtimes (an OpenCL ICD, say) may write there themselves; kiln
   * itself must not have. */
  FILE *f = fopen(log_path, "r");
  ck_assert_ptr_nonnull(f);
  char text[4096];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  ck_assert_msg(strstr(text, "kiln:") == NULL, "kiln printed: %s", text);

  size_t count = 0;
  KT_OK(kiln_backend_count(&count));
  ck_assert_uint_eq(count, 3);
  const char *names[] = {"cuda", "opencl", "cpu"};
  for (size_t i = 0; i < 3; i++) {
    kiln_backend_info_t b;
    KT_OK(kiln_backend_info(i, &b));
    ck_assert_str_eq(b.name, names[i]);
    if (b.state == KILN_BACKEND_UNAVAILABLE || b.state == KILN_BACKEND_ABI_MISMATCH ||
        (b.state == KILN_BACKEND_NO_DEVICE && b.device_count == 0)) {
      ck_assert_msg(b.reason[0] != '\0', "%s is %s without a reason", b.name, kiln_backend_state_name(b.state));
      ck_assert(b.path[0] != '\0');
    } else {
      ck_assert_str_eq(b.reason, "");
    }
  }
  kiln_backend_info_t cpu;
  KT_OK(kiln_backend_info(2, &cpu));
  ck_assert_int_eq(cpu.state, KILN_BACKEND_LOADED);
  kiln_device_t *d = kiln_try_gpu(0);
  ck_assert_ptr_nonnull(d);
  kiln_deinitialize();

  /* A plugin that is not there at all, in the default (quiet) mode. */
  kt_load_quietly("nosuch,cpu");
  ck_assert_int_eq(kt_rt.backends[0].info.state, KILN_BACKEND_UNAVAILABLE);
  ck_assert_msg(strstr(kt_rt.backends[0].info.reason, "libkiln-nosuch.so not found; tried: ") != NULL, "%s",
                kt_rt.backends[0].info.reason);
  kt_unload_quietly();
}
END_TEST

/* Backends compiled into the test that start with zero devices: "noisy"
 * says why through the thread's message, as a plugin whose driver sees no
 * device does; "silent" says nothing; "wrongabi" speaks another ABI. */
static const kiln_host_t *kt_empty_host;
static kiln_status_t kt_empty_init_noisy(const kiln_host_t *host, kiln_backend_context_t **out_ctx) {
  kt_empty_host = host;
  *out_ctx = NULL;
  host->set_error(KILN_UNAVAILABLE, "driver present, no noisy device (check the cable)");
  return KILN_OK;
}
static kiln_status_t kt_empty_init_silent(const kiln_host_t *host, kiln_backend_context_t **out_ctx) {
  kt_empty_host = host;
  *out_ctx = NULL;
  return KILN_OK;
}
typedef kiln_backend_context_t kt_ctx_t;
static size_t kt_empty_count(kt_ctx_t *c) { return 0; }
static kiln_status_t kt_empty_describe(kt_ctx_t *c, size_t i, kiln_backend_device_desc_t *d) { return KILN_INTERNAL; }
static kiln_status_t kt_empty_alloc(kt_ctx_t *c, kiln_backend_device_t *d, size_t n, kiln_backend_buffer_t **o) {
  return KILN_INTERNAL;
}
static void kt_empty_free(kt_ctx_t *c, kiln_backend_device_t *d, kiln_backend_buffer_t *b) {}
static kiln_status_t kt_empty_qcreate(kt_ctx_t *c, kiln_backend_device_t *d, kiln_backend_queue_t **o) {
  return KILN_INTERNAL;
}
static void kt_empty_qdestroy(kt_ctx_t *c, kiln_backend_queue_t *q) {}
static kiln_status_t kt_empty_qfinish(kt_ctx_t *c, kiln_backend_queue_t *q) { return KILN_INTERNAL; }
static kiln_status_t kt_empty_qrecord(kt_ctx_t *c, kiln_backend_queue_t *q, kiln_backend_event_t **o) {
  return KILN_INTERNAL;
}
static kiln_status_t kt_empty_qwait(kt_ctx_t *c, kiln_backend_queue_t *q, kiln_backend_event_t *e) {
  return KILN_INTERNAL;
}
static kiln_status_t kt_empty_event(kt_ctx_t *c, kiln_backend_event_t *e) { return KILN_INTERNAL; }
static kiln_status_t kt_empty_elapsed(kt_ctx_t *c, kiln_backend_event_t *a, kiln_backend_event_t *b, double *o) {
  return KILN_INTERNAL;
}
static void kt_empty_erelease(kt_ctx_t *c, kiln_backend_event_t *e) {}
static kiln_status_t kt_empty_write(kt_ctx_t *c, kiln_backend_queue_t *q, kiln_backend_buffer_t *b, size_t off,
                                    const void *h, size_t n, bool blocking) {
  return KILN_INTERNAL;
}
static kiln_status_t kt_empty_read(kt_ctx_t *c, kiln_backend_queue_t *q, kiln_backend_buffer_t *b, size_t off,
                                   void *h, size_t n, bool blocking) {
  return KILN_INTERNAL;
}
static kiln_status_t kt_empty_fill(kt_ctx_t *c, kiln_backend_queue_t *q, kiln_backend_buffer_t *b, size_t off,
                                   size_t n, const void *pattern, size_t pattern_size) {
  return KILN_INTERNAL;
}
static const kiln_op_entry_t kt_empty_ops[] = {KILN_OP_TABLE_END};

#define KT_EMPTY_IFACE(NAME, ABI, INIT)                                                                     \
  {                                                                                                        \
    .abi_version = (ABI), .size = sizeof(kiln_backend_iface_t), .name = (NAME), .version = "empty 1",      \
    .initialize = (INIT), .device_count = kt_empty_count, .device_describe = kt_empty_describe,            \
    .buffer_allocate = kt_empty_alloc, .buffer_free = kt_empty_free, .queue_create = kt_empty_qcreate,     \
    .queue_destroy = kt_empty_qdestroy, .queue_finish = kt_empty_qfinish, .queue_record = kt_empty_qrecord, \
    .queue_wait = kt_empty_qwait, .event_wait = kt_empty_event, .event_query = kt_empty_event,             \
    .event_elapsed = kt_empty_elapsed, .event_release = kt_empty_erelease, .buffer_write = kt_empty_write, \
    .buffer_read = kt_empty_read, .buffer_fill = kt_empty_fill, .ops = kt_empty_ops,                       \
  }
static const kiln_backend_iface_t kt_noisy_iface = KT_EMPTY_IFACE("noisy", KILN_BACKEND_ABI_VERSION, kt_empty_init_noisy);
static const kiln_backend_iface_t kt_silent_iface =
    KT_EMPTY_IFACE("silent", KILN_BACKEND_ABI_VERSION, kt_empty_init_silent);
static const kiln_backend_iface_t kt_wrongabi_iface = KT_EMPTY_IFACE("wrongabi", 7u, kt_empty_init_silent);
static const kiln_backend_iface_t *kt_noisy_entry(void) { return &kt_noisy_iface; }
static const kiln_backend_iface_t *kt_silent_entry(void) { return &kt_silent_iface; }
static const kiln_backend_iface_t *kt_wrongabi_entry(void) { return &kt_wrongabi_iface; }

START_TEST(test_zero_devices_keep_reason) {
  KT_OK(kiln__registry_add_builtin("noisy", kt_noisy_entry));
  KT_OK(kiln__registry_add_builtin("silent", kt_silent_entry));
  KT_OK(kiln__registry_add_builtin("wrongabi", kt_wrongabi_entry));
  KT_FAILS(kiln__registry_add_builtin("No-Such", kt_silent_entry), KILN_INVALID_ARGUMENT, "is not a backend name");
  KT_FAILS(kiln__registry_add_builtin("x", NULL), KILN_INVALID_ARGUMENT, "entry is NULL");

  /* Named explicitly, a backend without a usable device is an error that
   * gives its reason: running on another device instead would be wrong. */
  kt_env("noisy,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE,
           "backend 'noisy' named in KILN_BACKEND cannot be used: driver present, no noisy device (check the cable)");
  kiln_deinitialize();
  kt_env("silent,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE,
           "backend 'silent' named in KILN_BACKEND cannot be used: the backend loaded but found no device");
  kiln_deinitialize();

  /* The unset default falls back quietly, and each backend keeps its
   * reason: the plugin's message, which does not linger as the thread's
   * error after a successful start. */
  KT_OK(kiln__registry_add_builtin("cuda", kt_noisy_entry));
  KT_OK(kiln__registry_add_builtin("opencl", kt_silent_entry));
  kt_env(NULL);
  kiln_clear_error();
  KT_OK(kiln_ensure_initialized());
  ck_assert_str_eq(kiln_last_error(), "");
  kiln_backend_info_t b;
  KT_OK(kiln_backend_info(0, &b));
  ck_assert_str_eq(b.name, "cuda");
  ck_assert_int_eq(b.state, KILN_BACKEND_NO_DEVICE);
  ck_assert_uint_eq(b.device_count, 0);
  ck_assert_str_eq(b.reason, "driver present, no noisy device (check the cable)");
  ck_assert_str_eq(b.path, "builtin");
  ck_assert_str_eq(b.version, "empty 1");
  KT_OK(kiln_backend_info(1, &b));
  ck_assert_str_eq(b.name, "opencl");
  ck_assert_int_eq(b.state, KILN_BACKEND_NO_DEVICE);
  ck_assert_str_eq(b.reason, "the backend loaded but found no device");
  KT_OK(kiln_backend_info(2, &b));
  ck_assert_int_eq(b.state, KILN_BACKEND_LOADED);
  ck_assert_str_eq(b.reason, "");
  kiln_device_t *d;
  KT_OK(kiln_device_default(&d));
  ck_assert_str_eq(kiln_device_selector(d), "cpu:0");
  kiln_deinitialize();

  /* Devices hidden by KILN_DEVICE are not "found no device": no reason, and
   * devinfo says they were hidden. (cpu:0 stays visible: a selector that
   * hides every device is an error, see test_selector.) */
  kt_env("cpu,stub");
  setenv("KILN_DEVICE", "!stub:0", 1);
  KT_OK(kiln_ensure_initialized());
  KT_OK(kiln_backend_info(1, &b));
  ck_assert_int_eq(b.state, KILN_BACKEND_NO_DEVICE);
  ck_assert_uint_eq(b.device_count, 1);
  ck_assert_str_eq(b.reason, "");
  kiln_deinitialize();

  kt_env("wrongabi,cpu");
  char want[120];
  snprintf(want, sizeof want, "the built-in wrongabi backend was built for backend ABI 7, this libkiln speaks %u",
           KILN_BACKEND_ABI_VERSION);
  KT_FAILS(kiln_ensure_initialized(), KILN_ABI_MISMATCH, want);
  kiln_deinitialize();
  kt_env(NULL);
}
END_TEST

/* The interface table grows at its end only: a table shorter than the
 * required slots is too old and refused; one longer than the core's (a newer
 * plugin with slots this core does not know) is taken, its extra slots unread.
 * And the op table's own rules. */
static kiln_status_t kt_row_run(kiln_backend_context_t *ctx, kiln_backend_queue_t *q, const kiln_op_entry_t *e,
                                const kiln_op_t *op) {
  return KILN_INTERNAL;
}
static const kiln_op_entry_t kt_vendor_only_ops[] = {
    {KILN_OP_MATMUL, "blas", NULL, kt_row_run, NULL},
    KILN_OP_TABLE_END,
};
static const kiln_op_entry_t kt_bad_name_ops[] = {
    {KILN_OP_FILL, "Not A Name", NULL, kt_row_run, NULL},
    KILN_OP_TABLE_END,
};
typedef struct kt_newer_iface_t {
  kiln_backend_iface_t base;
  void (*slot_from_the_future)(void);
  void *another;
} kt_newer_iface_t;
static kiln_backend_iface_t kt_short_iface = KT_EMPTY_IFACE("short", KILN_BACKEND_ABI_VERSION, kt_empty_init_silent);
static kt_newer_iface_t kt_newer_iface = {KT_EMPTY_IFACE("newer", KILN_BACKEND_ABI_VERSION, kt_empty_init_noisy),
                                          NULL, NULL};
static kiln_backend_iface_t kt_vendor_only_iface =
    KT_EMPTY_IFACE("vendoronly", KILN_BACKEND_ABI_VERSION, kt_empty_init_silent);
static kiln_backend_iface_t kt_bad_name_iface = KT_EMPTY_IFACE("badname", KILN_BACKEND_ABI_VERSION, kt_empty_init_silent);
static const kiln_backend_iface_t *kt_short_entry(void) {
  kt_short_iface.size = (uint32_t)offsetof(kiln_backend_iface_t, buffer_fill);
  return &kt_short_iface;
}
static const kiln_backend_iface_t *kt_newer_entry(void) {
  kt_newer_iface.base.size = sizeof kt_newer_iface;
  return &kt_newer_iface.base;
}
static const kiln_backend_iface_t *kt_vendor_only_entry(void) {
  kt_vendor_only_iface.ops = kt_vendor_only_ops;
  return &kt_vendor_only_iface;
}
static const kiln_backend_iface_t *kt_bad_name_entry(void) {
  kt_bad_name_iface.ops = kt_bad_name_ops;
  return &kt_bad_name_iface;
}

START_TEST(test_table_versions) {
  KT_OK(kiln__registry_add_builtin("short", kt_short_entry));
  KT_OK(kiln__registry_add_builtin("newer", kt_newer_entry));
  KT_OK(kiln__registry_add_builtin("vendoronly", kt_vendor_only_entry));
  KT_OK(kiln__registry_add_builtin("badname", kt_bad_name_entry));
  kt_env("short,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_ABI_MISMATCH, "less than the");
  KT_FAILS(kiln_ensure_initialized(), KILN_ABI_MISMATCH, "it is too old: rebuild it against this kiln");
  kiln_deinitialize();

  /* Adopted and started: it fails only for having no device. */
  kt_env("newer,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE,
           "backend 'newer' named in KILN_BACKEND cannot be used: driver present, no noisy device");
  kiln_deinitialize();

  kt_env("vendoronly,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_ABI_MISMATCH, "offers blas for op matmul but no native row");
  kiln_deinitialize();
  kt_env("badname,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_ABI_MISMATCH, "op table row 0 (fill) has an invalid provider name");
  kiln_deinitialize();
  kt_env(NULL);
}
END_TEST

START_TEST(test_bad_arguments) {
  kt_env("cpu");
  kiln_device_t *d;
  KT_FAILS(kiln_device_get(0, NULL), KILN_INVALID_ARGUMENT, "out_device is NULL");
  KT_FAILS(kiln_device_find(NULL, &d), KILN_INVALID_ARGUMENT, "is NULL");
  KT_FAILS(kiln_device_info(NULL, NULL), KILN_INVALID_ARGUMENT, "device is NULL");
  KT_FAILS(kiln_device_info((kiln_device_t *)&d, NULL), KILN_INVALID_ARGUMENT, "is not a device of this kiln");
  KT_FAILS(kiln_backend_count(NULL), KILN_INVALID_ARGUMENT, "out_count is NULL");
  KT_FAILS(kiln_backend_info(0, NULL), KILN_INVALID_ARGUMENT, "out_info is NULL");
  KT_FAILS(kiln_try_all_gpus(NULL, 3, &(size_t){0}), KILN_INVALID_ARGUMENT, "out_devices is NULL with capacity 3");
  ck_assert_uint_eq(kiln_device_property_count(NULL), 0);
  ck_assert_ptr_null(kiln_device_providers(NULL, "matmul"));
  ck_assert_str_eq(kiln_device_selector(NULL), "");
  KT_OK(kiln_device_get(0, &d));
  ck_assert_ptr_eq(kiln_device_retain(d), d);
  kiln_device_release(d);
  kiln_device_release(NULL);
  ck_assert_str_eq(kiln_device_type_name(KILN_DEVICE_GPU), "gpu");
  ck_assert_str_eq(kiln_device_type_name(KILN_DEVICE_CPU), "cpu");
  ck_assert_str_eq(kiln_device_type_name(KILN_DEVICE_OTHER), "other");
  ck_assert_str_eq(kiln_backend_state_name(KILN_BACKEND_NO_DEVICE), "no device");
  ck_assert_str_eq(kiln_backend_state_name(KILN_BACKEND_UNAVAILABLE), "unavailable");
  kiln_deinitialize();
}
END_TEST

/* Broken plugin files are reported, never fatal and never passed over: a
 * copy cut short as an interrupted install leaves it (dlopen would map its
 * segments past the end and die of SIGBUS), dangling links and loops named
 * like a plugin, and a KILN_BACKEND_PATH folder too long to search, which the
 * message lists among the paths tried. */
static char *kt_make_dir(void) {
  static char dir[512];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kiln-plugins-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  return dir;
}

static void kt_copy_truncated(const char *from, const char *to, double fraction) {
  FILE *in = fopen(from, "rb");
  ck_assert_ptr_nonnull(in);
  fseek(in, 0, SEEK_END);
  long size = ftell(in);
  fseek(in, 0, SEEK_SET);
  long keep = (long)(size * fraction);
  char *data = malloc((size_t)keep);
  ck_assert_ptr_nonnull(data);
  ck_assert_int_eq(fread(data, 1, (size_t)keep, in), (size_t)keep);
  fclose(in);
  FILE *out = fopen(to, "wb");
  ck_assert_ptr_nonnull(out);
  ck_assert_int_eq(fwrite(data, 1, (size_t)keep, out), (size_t)keep);
  fclose(out);
  free(data);
}

START_TEST(test_broken_plugin_files) {
  /* Where the stub plugin lives. */
  kt_env("stub,cpu");
  KT_OK(kiln_ensure_initialized());
  kiln_backend_info_t b;
  KT_OK(kiln_backend_info(0, &b));
  char stub[1024], search[4096];
  snprintf(stub, sizeof stub, "%s", b.path);
  kiln_deinitialize();
  const char *saved = getenv("KILN_BACKEND_PATH");
  char *dir = kt_make_dir();
  snprintf(search, sizeof search, "%s:%s", dir, saved ? saved : "");
  setenv("KILN_BACKEND_PATH", search, 1);
  char path[1024];

  snprintf(path, sizeof path, "%s/libkiln-trunc.so", dir);
  kt_copy_truncated(stub, path, 0.5);
  kt_env("trunc,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "libkiln-trunc.so: truncated: loadable segment");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "reinstall the plugin");
  kiln_deinitialize();
  unlink(path);
  /* With KILN_BACKEND unset, a truncated default plugin is skipped with the
   * reason, and kiln runs on. */
  snprintf(path, sizeof path, "%s/libkiln-cuda.so", dir);
  kt_copy_truncated(stub, path, 0.02);
  kt_env(NULL);
  KT_OK(kiln_ensure_initialized());
  KT_OK(kiln_backend_info(0, &b));
  ck_assert_str_eq(b.name, "cuda");
  ck_assert_int_eq(b.state, KILN_BACKEND_UNAVAILABLE);
  ck_assert_msg(strstr(b.reason, "truncated") != NULL, "%s", b.reason);
  kiln_deinitialize();
  unlink(path);

  /* A dangling link named like the stub, ahead of the real one. */
  snprintf(path, sizeof path, "%s/libkiln-stub.so", dir);
  ck_assert_int_eq(symlink("/nonexistent/libkiln-stub.so", path), 0);
  kt_env("stub,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "a symbolic link to a file that does not exist");
  kiln_deinitialize();
  unlink(path);
  ck_assert_int_eq(symlink(path, path), 0);
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "a loop of symbolic links");
  kiln_deinitialize();
  unlink(path);
  ck_assert_int_eq(mkdir(path, 0700), 0);
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "not a regular file");
  kiln_deinitialize();
  rmdir(path);
  rmdir(dir);

  /* A folder too long to search is named among the paths tried. */
  char *long_dir = malloc(5000);
  ck_assert_ptr_nonnull(long_dir);
  long_dir[0] = '/';
  memset(long_dir + 1, 'a', 4998);
  long_dir[4999] = '\0';
  setenv("KILN_BACKEND_PATH", long_dir, 1);
  kt_env("nosuch,cpu");
  KT_FAILS(kiln_ensure_initialized(), KILN_UNAVAILABLE, "(a path over 4095 bytes, not searched)");
  kiln_deinitialize();
  free(long_dir);
  if (saved) setenv("KILN_BACKEND_PATH", saved, 1);
  kt_env(NULL);
}
END_TEST

/* Devices are never dropped for lack of room: 64 CPU devices beside another
 * backend's are all listed. */
START_TEST(test_many_devices) {
  kt_env("stub,cpu");
  setenv("KILN_CPU_DEVICES", "64", 1);
  size_t count = 0;
  KT_OK(kiln_device_count(&count));
  ck_assert_uint_eq(count, 65);
  kiln_device_t *last = NULL;
  KT_OK(kiln_device_find("cpu:63", &last));
  kiln_backend_info_t b;
  KT_OK(kiln_backend_info(1, &b));
  ck_assert_uint_eq(b.device_count, 64);
  kiln_deinitialize();
  kt_env(NULL);
}
END_TEST

static Suite *registry_suite(void) {
  Suite *s = suite_create("registry");
  TCase *tc = tcase_create("plugins");
  tcase_add_test(tc, test_stub_used);
  tcase_add_test(tc, test_build_tree_search);
  tcase_add_test(tc, test_device_filter_and_order);
  tcase_add_test(tc, test_bad_abi);
  tcase_add_test(tc, test_missing_dependency);
  tcase_add_test(tc, test_no_such_backend);
  tcase_add_test(tc, test_default_is_quiet);
  tcase_add_test(tc, test_zero_devices_keep_reason);
  tcase_add_test(tc, test_bad_arguments);
  tcase_add_test(tc, test_table_versions);
  tcase_add_test(tc, test_broken_plugin_files);
  tcase_add_test(tc, test_many_devices);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  kt_private_cache_dir();
  return kt_run_suite(registry_suite());
}
