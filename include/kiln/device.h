/* kiln/device.h: devices, backends, enumeration, properties and selection. */
#ifndef KILN_DEVICE_H
#define KILN_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef struct kiln_device_t kiln_device_t;

typedef enum kiln_device_type_t {
  KILN_DEVICE_CPU = 0,
  KILN_DEVICE_GPU = 1,
  KILN_DEVICE_ACCELERATOR = 2,
  KILN_DEVICE_OTHER = 3,
} kiln_device_type_t;

/* "cpu", "gpu", "accelerator", "other". Static storage. */
const char *kiln_device_type_name(kiln_device_type_t type);

/* Common properties of a device. Strings are owned by the device and live as
 * long as kiln is initialised. Values a backend cannot know are 0 or "". */
typedef struct kiln_device_info_t {
  uint32_t index;              /* position in kiln's visible device list */
  const char *selector;        /* "cpu:0", "opencl:1": pasteable into KILN_DEVICE */
  const char *backend;         /* "cpu", "opencl", "cuda" */
  uint32_t backend_index;      /* index among this backend's devices (before filtering) */
  kiln_device_type_t type;
  const char *name;            /* "NVIDIA H100 80GB HBM3", "pthread-haswell-AMD EPYC" */
  const char *vendor;
  const char *driver_version;
  const char *runtime_version; /* OpenCL platform version, CUDA driver API version */
  const char *platform;        /* OpenCL platform name; "" elsewhere */
  const char *uuid;            /* "GPU-xxxxxxxx-..." or hex; "" when unknown */
  const char *pci_bus_id;      /* "0000:3b:00.0"; "" when unknown */
  uint64_t memory_bytes;       /* total device memory */
  uint64_t memory_free_bytes;  /* free memory now (at query time) */
  bool memory_free_is_estimate;/* true when the backend cannot know free memory */
  uint64_t max_alloc_bytes;    /* largest single allocation */
  uint64_t local_memory_bytes; /* shared / local memory per block or work-group */
  uint32_t compute_units;      /* SMs, compute units, or CPU threads */
  uint32_t max_work_group_size;
  const char *compute_capability; /* "9.0" on CUDA, "OpenCL C 1.2" on OpenCL, "" on CPU */
  bool fp16;
  bool fp64;
  bool is_default;             /* the default device */
} kiln_device_info_t;

/* Enumerate the visible devices (after KILN_BACKEND and KILN_DEVICE), in the
 * stable order: GPUs before CPUs, then backend priority, then the backend's own
 * order. Starts kiln if needed (KILN_* errors of start-up are returned here).
 * Never blocks after start-up. Thread-safe. */
kiln_status_t kiln_device_count(size_t *out_count);

/* Device i of the visible list. The device is owned by kiln and lives until
 * kiln_deinitialize; retain/release are accepted and do nothing harmful.
 * KILN_NOT_FOUND with the count in the message when i is out of range. */
kiln_status_t kiln_device_get(size_t index, kiln_device_t **out_device);

/* The default device: the first visible one (GPUs before the CPU, CUDA before
 * OpenCL for the same card). Never fails once kiln started: the CPU is always
 * present unless KILN_DEVICE/KILN_BACKEND excluded every device, which is
 * KILN_NOT_FOUND. */
kiln_status_t kiln_device_default(kiln_device_t **out_device);

/* The device matching one selector term that names exactly one device
 * ("cuda:0", "opencl:gpu", "cpu"; the first match for a type term).
 * KILN_INVALID_ARGUMENT for a malformed term (the message shows the grammar);
 * KILN_NOT_FOUND when nothing visible matches (the message lists the devices). */
kiln_status_t kiln_device_find(const char *selector, kiln_device_t **out_device);

/* GPU i (counting GPUs only, across backends, in device order) if it exists,
 * else the default CPU device. Never NULL once kiln started. The chapter's
 * try_gpu(i). */
kiln_device_t *kiln_try_gpu(size_t i);

/* Every GPU, or the CPU device alone if there is none. Fills up to `capacity`
 * entries of out_devices and returns the number that exist in *out_count
 * (call with capacity 0 to size the array). */
kiln_status_t kiln_try_all_gpus(kiln_device_t **out_devices, size_t capacity, size_t *out_count);

/* Reference counting is accepted for symmetry; devices live until
 * kiln_deinitialize. */
kiln_device_t *kiln_device_retain(kiln_device_t *device);
void kiln_device_release(kiln_device_t *device);

/* Fill *out_info (free memory is queried now). */
kiln_status_t kiln_device_info(const kiln_device_t *device, kiln_device_info_t *out_info);

/* The selector string of a device ("cpu:0"): pasteable into KILN_DEVICE. */
const char *kiln_device_selector(const kiln_device_t *device);

/* Short human name for messages: "cpu:0 (AMD EPYC)". */
const char *kiln_device_name(const kiln_device_t *device);

/* Extra backend-specific properties as key/value strings, for `devinfo -v`:
 * e.g. "opencl_c_version", "compiled_architectures", "providers", "warning".
 * Returns KILN_NOT_FOUND when i >= the count. */
size_t kiln_device_property_count(const kiln_device_t *device);
kiln_status_t kiln_device_property(const kiln_device_t *device, size_t i, const char **out_key,
                                   const char **out_value);

/* Providers available on a device for an operation ("native", "blas",
 * "clblast", "cublas", "cudnn"), comma separated, "native" always first. Static
 * or device-owned storage. op is an operation name as in KILN_PROVIDER
 * ("matmul", "conv2d", "add" ...). NULL for an unknown op name. */
const char *kiln_device_providers(const kiln_device_t *device, const char *op);

/* Memory of a device as kiln uses it. */
typedef struct kiln_memory_stats_t {
  uint64_t in_use_bytes;  /* in buffers alive now (rounded up to the pool's size classes) */
  uint64_t pooled_bytes;  /* freed, kept for reuse */
  uint64_t peak_bytes;    /* the most in_use_bytes has been since start (or the last reset) */
  uint64_t allocations;   /* allocations from the device itself so far (not served by the pool) */
} kiln_memory_stats_t;

/* The device's memory statistics now; never blocks. */
kiln_status_t kiln_device_memory_stats(const kiln_device_t *device, kiln_memory_stats_t *out_stats);
/* Start peak_bytes afresh from in_use_bytes. */
kiln_status_t kiln_device_memory_reset_peak(kiln_device_t *device);

/* The operation names KILN_PROVIDER and kiln_device_providers take, by index
 * from 0: every kind ("fill", ..., "matmul", "conv2d", ...), then each unary
 * and binary op ("neg", ..., "add", ...), which share their kind's providers;
 * NULL past the last. Static storage; never blocks. */
const char *kiln_op_name(size_t index);

/* Run a small computation on the device and compare with the CPU reference.
 * Blocks. KILN_OK when it passed; otherwise the status and a message saying
 * what differed. devinfo --check. */
kiln_status_t kiln_device_check(kiln_device_t *device);

/* Backends: what KILN_BACKEND asked for (or the default list) and what became
 * of each. */
typedef enum kiln_backend_state_t {
  KILN_BACKEND_LOADED = 0,      /* loaded with at least one device */
  KILN_BACKEND_NO_DEVICE = 1,   /* loaded, but it found no device (or none visible) */
  KILN_BACKEND_UNAVAILABLE = 2, /* could not load: missing library, no platform, ... */
  KILN_BACKEND_ABI_MISMATCH = 3,/* plugin built for another ABI version */
} kiln_backend_state_t;

typedef struct kiln_backend_info_t {
  const char *name;         /* "cpu", "opencl", "cuda" */
  kiln_backend_state_t state;
  const char *reason;       /* "" when loaded; else why (the loader's own message) */
  const char *path;         /* the shared object loaded or tried last; "builtin" for cpu */
  const char *version;      /* backend's own version string, "" if unknown */
  size_t device_count;      /* devices it enumerated (before KILN_DEVICE filtering) */
} kiln_backend_info_t;

/* Number of backends kiln considered (loaded or not). Starts kiln if needed. */
kiln_status_t kiln_backend_count(size_t *out_count);

/* Information on backend i; strings owned by kiln until kiln_deinitialize. */
kiln_status_t kiln_backend_info(size_t index, kiln_backend_info_t *out_info);

/* "loaded", "no device", "unavailable", "abi mismatch". Static storage. */
const char *kiln_backend_state_name(kiln_backend_state_t state);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* KILN_DEVICE_H */
