/* runtime/dtype.c: the dtypes from their one list (include/kiln/tensor.h): names, sizes, DLPack codes, the promotion table, per-device support. */
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"

typedef struct dtype_row_t {
  const char *name, *long_name;
  size_t size;
  uint8_t dl_code, dl_bits;
  kiln_dtype_class_t cls;
} dtype_row_t;

static const dtype_row_t dtype_rows[KILN_DTYPE_COUNT_] = {
#define KILN_DTYPE_ROW_(E, name, long_name, size, dl_code, dl_bits, cls) \
  [KILN_##E] = {name, long_name, size, dl_code, dl_bits, KILN_DTYPE_CLASS_##cls},
    KILN_DTYPES(KILN_DTYPE_ROW_)
#undef KILN_DTYPE_ROW_
};

static bool dtype_known(kiln_dtype_t dtype) { return (unsigned)dtype < KILN_DTYPE_COUNT_; }

const char *kiln_dtype_name(kiln_dtype_t dtype) { return dtype_known(dtype) ? dtype_rows[dtype].name : "?"; }

const char *kiln_dtype_long_name(kiln_dtype_t dtype) {
  return dtype_known(dtype) ? dtype_rows[dtype].long_name : "?";
}

size_t kiln_dtype_size(kiln_dtype_t dtype) { return dtype_known(dtype) ? dtype_rows[dtype].size : 0; }

kiln_dtype_class_t kiln_dtype_class(kiln_dtype_t dtype) {
  return dtype_known(dtype) ? dtype_rows[dtype].cls : KILN_DTYPE_CLASS_BOOL;
}

/* Every name, both forms, for messages. */
static void dtype_names_text(char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (int d = 0; d < KILN_DTYPE_COUNT_ && used < size; d++) {
    const dtype_row_t *r = &dtype_rows[d];
    bool same = strcmp(r->name, r->long_name) == 0;
    used += (size_t)snprintf(out + used, size - used, "%s%s%s%s", d ? ", " : "", r->name, same ? "" : "/",
                             same ? "" : r->long_name);
  }
}

kiln_status_t kiln_dtype_from_name(const char *name, kiln_dtype_t *out_dtype) {
  if (!out_dtype)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_dtype_from_name: out_dtype is NULL; pass a kiln_dtype_t *");
  for (int d = 0; name && d < KILN_DTYPE_COUNT_; d++) {
    if (strcmp(name, dtype_rows[d].name) == 0 || strcmp(name, dtype_rows[d].long_name) == 0) {
      *out_dtype = (kiln_dtype_t)d;
      return KILN_OK;
    }
  }
  char names[256];
  dtype_names_text(names, sizeof names);
  return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_dtype_from_name: \"%s\" is not a dtype kiln has; use one of %s",
                         name ? name : "(null)", names);
}

bool kiln__dtype_to_dlpack(kiln_dtype_t dtype, uint8_t *out_code, uint8_t *out_bits) {
  if (!dtype_known(dtype)) return false;
  *out_code = dtype_rows[dtype].dl_code;
  *out_bits = dtype_rows[dtype].dl_bits;
  return true;
}

bool kiln__dtype_from_dlpack(uint8_t code, uint8_t bits, kiln_dtype_t *out_dtype) {
  for (int d = 0; d < KILN_DTYPE_COUNT_; d++) {
    if (dtype_rows[d].dl_code == code && dtype_rows[d].dl_bits == bits) {
      *out_dtype = (kiln_dtype_t)d;
      return true;
    }
  }
  return false;
}

/* ---- promotion -------------------------------------------------------------------
 * The one table (docs/dtypes.md shows it): result[a][b], symmetric. The Array
 * API lattice within a kind; PyTorch's choice across kinds (bool with x is x,
 * integer with float is the float). */
static const kiln_dtype_t promotion[KILN_DTYPE_COUNT_][KILN_DTYPE_COUNT_] = {
/*   b:   f32   i32   f16   bf16  f64   i64   i8    u8    i16   bool  */
  [KILN_F32] = {KILN_F32, KILN_F32, KILN_F32, KILN_F32, KILN_F64, KILN_F32, KILN_F32, KILN_F32, KILN_F32, KILN_F32},
  [KILN_I32] = {KILN_F32, KILN_I32, KILN_F16, KILN_BF16, KILN_F64, KILN_I64, KILN_I32, KILN_I32, KILN_I32, KILN_I32},
  [KILN_F16] = {KILN_F32, KILN_F16, KILN_F16, KILN_F32, KILN_F64, KILN_F16, KILN_F16, KILN_F16, KILN_F16, KILN_F16},
  [KILN_BF16] = {KILN_F32, KILN_BF16, KILN_F32, KILN_BF16, KILN_F64, KILN_BF16, KILN_BF16, KILN_BF16, KILN_BF16, KILN_BF16},
  [KILN_F64] = {KILN_F64, KILN_F64, KILN_F64, KILN_F64, KILN_F64, KILN_F64, KILN_F64, KILN_F64, KILN_F64, KILN_F64},
  [KILN_I64] = {KILN_F32, KILN_I64, KILN_F16, KILN_BF16, KILN_F64, KILN_I64, KILN_I64, KILN_I64, KILN_I64, KILN_I64},
  [KILN_I8] = {KILN_F32, KILN_I32, KILN_F16, KILN_BF16, KILN_F64, KILN_I64, KILN_I8, KILN_I16, KILN_I16, KILN_I8},
  [KILN_U8] = {KILN_F32, KILN_I32, KILN_F16, KILN_BF16, KILN_F64, KILN_I64, KILN_I16, KILN_U8, KILN_I16, KILN_U8},
  [KILN_I16] = {KILN_F32, KILN_I32, KILN_F16, KILN_BF16, KILN_F64, KILN_I64, KILN_I16, KILN_I16, KILN_I16, KILN_I16},
  [KILN_BOOL] = {KILN_F32, KILN_I32, KILN_F16, KILN_BF16, KILN_F64, KILN_I64, KILN_I8, KILN_U8, KILN_I16, KILN_BOOL},
};

kiln_status_t kiln_result_dtype(kiln_dtype_t a, kiln_dtype_t b, kiln_dtype_t *out_dtype) {
  if (!out_dtype)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_result_dtype: out_dtype is NULL; pass a kiln_dtype_t *");
  if (!dtype_known(a) || !dtype_known(b))
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_result_dtype: dtype %d is not a kiln_dtype_t; use KILN_F32 ... KILN_BOOL",
                           (int)(dtype_known(a) ? b : a));
  *out_dtype = promotion[a][b];
  return KILN_OK;
}

/* ---- what each device serves ------------------------------------------------------- */

const char *kiln_dtype_support_name(kiln_dtype_support_t support) {
  switch (support) {
  case KILN_DTYPE_NATIVE: return "native";
  case KILN_DTYPE_EMULATED: return "emulated";
  default: return "unsupported";
  }
}

kiln_dtype_support_t kiln__device_dtype_support(const kiln_device_t *device, kiln_dtype_t dtype) {
  if (!dtype_known(dtype)) return KILN_DTYPE_UNSUPPORTED;
  if (device->iface->dtype_support) return (kiln_dtype_support_t)device->iface->dtype_support(device->ctx, device->impl, dtype);
  /* A backend that does not say: the f32 and i32 kernels every backend has. */
  return dtype == KILN_F32 || dtype == KILN_I32 ? KILN_DTYPE_NATIVE : KILN_DTYPE_UNSUPPORTED;
}

kiln_dtype_support_t kiln_device_dtype_support(const kiln_device_t *device, kiln_dtype_t dtype) {
  if (!device || kiln__ensure() != KILN_OK) return KILN_DTYPE_UNSUPPORTED;
  return kiln__device_dtype_support(device, dtype);
}
