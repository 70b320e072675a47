/* backends/builtin.c: the backends compiled into libkiln and the default backend order, which the core reads (it names no backend itself). */
#include "runtime/backend.h"

const kiln_backend_iface_t *kiln_cpu_backend_entry(void);

const kiln_backend_builtin_t kiln_backend_builtins[] = {
    {"cpu", kiln_cpu_backend_entry},
    {NULL, NULL},
};

/* Vendor APIs first: a GPU reached through CUDA and OpenCL is listed once per
 * backend, and CUDA's comes first for the same card. */
const char kiln_backend_default_order[] = "cuda,opencl,cpu";
