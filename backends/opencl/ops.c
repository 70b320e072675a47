/* backends/opencl/ops.c: which providers run each op on OpenCL, and the native provider (being written). */
#include "backends/opencl/opencl_backend.h"

uint32_t kiln_cl_op_providers(kiln_backend_device_t *device, kiln_op_kind_t kind, kiln_dtype_t dtype) {
  (void)device;
  (void)kind;
  (void)dtype;
  return 0;
}

kiln_status_t kiln_cl_op_run(kiln_backend_queue_t *queue, kiln_provider_t provider, const kiln_op_t *op) {
  (void)queue;
  (void)provider;
  return kiln_cl_error(KILN_UNSUPPORTED, "OpenCL op %d: the native kernels are being written", (int)op->kind);
}
