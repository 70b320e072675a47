/* backends/cuda/vendor.c: finding and opening the vendor libraries (cuBLAS, cuDNN) at run time: KILN_CUDA_VENDOR_LIBS and the folders searched. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

/* The folders of the toolkit kiln was built with, and of the cuDNN the build
 * found (a wheel's, CUDNN_PATH's, ...); "" when the build found none. */
#ifndef KILN_CUDA_TOOLKIT_LIBDIR
#define KILN_CUDA_TOOLKIT_LIBDIR ""
#endif
#ifndef KILN_CUDNN_BUILD_LIBDIR
#define KILN_CUDNN_BUILD_LIBDIR ""
#endif

const char *kiln_cuda_dlerror(void) {
  /* dlerror() is NULL when the loader has nothing to say (a prior call
   * consumed it): never print "(null)". */
  const char *e = dlerror();
  return e && *e ? e : "the dynamic loader gave no reason";
}

kiln_status_t kiln_cuda_vendor_libs_parse(kiln_backend_context_t *ctx, const char *value) {
  static const struct { const char *name; unsigned bit; } known[] = {
      {"cublas", KILN_CUDA_VENDOR_CUBLAS},
      {"cudnn", KILN_CUDA_VENDOR_CUDNN},
  };
  ctx->vendor_libs = KILN_CUDA_VENDOR_CUBLAS | KILN_CUDA_VENDOR_CUDNN;
  snprintf(ctx->vendor_libs_text, sizeof ctx->vendor_libs_text, "%s", value ? value : "");
  if (!value || !*value) return KILN_OK;
  if (!strcmp(value, "none")) {
    ctx->vendor_libs = 0;
    return KILN_OK;
  }
  unsigned allowed = 0;
  for (const char *item = value;;) {
    const size_t n = strcspn(item, ",");
    unsigned bit = 0;
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
      if (n == strlen(known[k].name) && !strncmp(item, known[k].name, n)) bit = known[k].bit;
    if (!bit)
      return kiln_cuda_error(ctx, KILN_INVALID_ARGUMENT,
                             "KILN_CUDA_VENDOR_LIBS='%s' is not valid: use a comma-separated list of cublas and "
                             "cudnn (the vendor libraries the CUDA backend may load), or none",
                             value);
    allowed |= bit;
    if (!item[n]) break;
    item += n + 1;
  }
  ctx->vendor_libs = allowed;
  return KILN_OK;
}

bool kiln_cuda_vendor_wanted(const kiln_backend_context_t *ctx, unsigned which, char *out_reason, size_t reason_size) {
  if (ctx->vendor_libs & which) return true;
  snprintf(out_reason, reason_size, "not loaded: KILN_CUDA_VENDOR_LIBS='%s' leaves %s out", ctx->vendor_libs_text,
           which == KILN_CUDA_VENDOR_CUDNN ? "cudnn" : "cublas");
  return false;
}

/* Append `what` to the list of places tried, once, as far as it fits. */
static void tried_add(char *tried, size_t size, const char *what) {
  if (strstr(tried, what)) return;
  size_t used = strlen(tried);
  const char *parts[2] = {used ? ", " : "", what};
  for (int p = 0; p < 2; p++)
    for (const char *c = parts[p]; *c && used + 1 < size; c++) tried[used++] = *c;
  tried[used] = '\0';
}

/* dlopen `dir/name` (or `name` alone, for the loader's own search). */
static void *try_open(const char *dir, const char *name, char *first_error, size_t error_size, char *tried,
                      size_t tried_size) {
  char path[1024];
  if (dir)
    snprintf(path, sizeof path, "%s/%s", dir, name);
  else
    snprintf(path, sizeof path, "%s", name);
  void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library) return library;
  if (!first_error[0]) snprintf(first_error, error_size, "%s", kiln_cuda_dlerror());
  tried_add(tried, tried_size, dir ? path : "the loader's search (LD_LIBRARY_PATH, ld.so.cache)");
  return NULL;
}

void *kiln_cuda_vendor_open(unsigned which, const char *const *names, size_t name_count, char *out_path,
                            size_t path_size, char *out_reason, size_t reason_size) {
  char first_error[512] = "", tried[768] = "";
  void *library = NULL;
  /* 1. cuDNN's own variables: the folder of an unpacked tarball or a wheel
   *    (…/site-packages/nvidia/cudnn), whose libraries are in lib/ (lib64/
   *    in some layouts). They name a cuDNN on purpose, so they come first. */
  if (which == KILN_CUDA_VENDOR_CUDNN) {
    static const char *const vars[] = {"CUDNN_PATH", "CUDNN_HOME"};
    for (size_t v = 0; v < 2 && !library; v++) {
      const char *root = getenv(vars[v]);
      if (!root || !*root) continue;
      /* "." last: the variable may name the library folder itself. */
      static const char *const subdirs[] = {"lib", "lib64", "lib/x86_64-linux-gnu", "."};
      for (size_t s = 0; s < 4 && !library; s++) {
        char dir[768];
        if (!strcmp(subdirs[s], "."))
          snprintf(dir, sizeof dir, "%s", root);
        else
          snprintf(dir, sizeof dir, "%s/%s", root, subdirs[s]);
        for (size_t i = 0; i < name_count && !library; i++)
          library = try_open(dir, names[i], first_error, sizeof first_error, tried, sizeof tried);
      }
    }
  }
  /* 2. The loader's own search: LD_LIBRARY_PATH, then ld.so.cache (a
   *    distribution package, a toolkit registered with ldconfig). */
  for (size_t i = 0; i < name_count && !library; i++)
    library = try_open(NULL, names[i], first_error, sizeof first_error, tried, sizeof tried);
  /* 3. The toolkit CUDA_PATH or CUDA_HOME names; 4. the folders the build
   *    found (the cuDNN it saw, the toolkit it was built with). */
  const char *roots[] = {getenv("CUDA_PATH"), getenv("CUDA_HOME")};
  for (size_t r = 0; r < 2 && !library; r++) {
    if (!roots[r] || !*roots[r]) continue;
    char dir[768];
    snprintf(dir, sizeof dir, "%s/lib64", roots[r]);
    for (size_t i = 0; i < name_count && !library; i++)
      library = try_open(dir, names[i], first_error, sizeof first_error, tried, sizeof tried);
  }
  const char *built[] = {which == KILN_CUDA_VENDOR_CUDNN ? KILN_CUDNN_BUILD_LIBDIR : "", KILN_CUDA_TOOLKIT_LIBDIR};
  for (size_t b = 0; b < 2 && !library; b++) {
    if (!built[b][0]) continue;
    for (size_t i = 0; i < name_count && !library; i++)
      library = try_open(built[b], names[i], first_error, sizeof first_error, tried, sizeof tried);
  }
  if (!library) {
    snprintf(out_reason, reason_size, "%s (tried %s)", first_error[0] ? first_error : "not found", tried);
    return NULL;
  }
  /* Which file it is (the loader's search may have picked any): devinfo
   * shows it, and kiln-bench loads the same one for its peer. */
  struct link_map *map = NULL;
  if (dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0])
    snprintf(out_path, path_size, "%s", map->l_name);
  else
    snprintf(out_path, path_size, "%s", names[0]);
  return library;
}

bool kiln_cuda_vendor_sym(void *library, const char *symbol, void *out_fn, size_t fn_size) {
  void *p = dlsym(library, symbol);
  if (!p) return false;
  /* dlsym returns void *; copying the bytes avoids an object-to-function
   * pointer cast, which ISO C leaves undefined. */
  memcpy(out_fn, &p, fn_size < sizeof p ? fn_size : sizeof p);
  return true;
}
