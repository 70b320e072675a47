/* runtime/check.c: kiln_device_check: a small matmul, add and softmax on a device, compared with the same computed on the host in double precision. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/internal.h"

enum { KILN_CHECK_M = 7, KILN_CHECK_K = 5, KILN_CHECK_N = 6 };

/* Fixed, exactly representable inputs of mixed sign. */
static void check_inputs(float *a, float *b, float *bias) {
  for (int i = 0; i < KILN_CHECK_M * KILN_CHECK_K; i++) a[i] = (float)((i * 7) % 11 - 5) * 0.25f;
  for (int i = 0; i < KILN_CHECK_K * KILN_CHECK_N; i++) b[i] = (float)((i * 5) % 9 - 4) * 0.125f;
  for (int i = 0; i < KILN_CHECK_N; i++) bias[i] = (float)(i - 2) * 0.5f;
}

/* The reference, on the host whatever devices are visible: the products and
 * sums are exact in float, softmax is computed in double. */
static void check_reference(float *out_mm, float *out_add, float *out_soft) {
  float a[KILN_CHECK_M * KILN_CHECK_K], b[KILN_CHECK_K * KILN_CHECK_N], bias[KILN_CHECK_N];
  check_inputs(a, b, bias);
  for (int i = 0; i < KILN_CHECK_M; i++) {
    double row_max = -INFINITY, total = 0;
    for (int j = 0; j < KILN_CHECK_N; j++) {
      double acc = 0;
      for (int l = 0; l < KILN_CHECK_K; l++) acc += (double)a[i * KILN_CHECK_K + l] * (double)b[l * KILN_CHECK_N + j];
      out_mm[i * KILN_CHECK_N + j] = (float)acc;
      out_add[i * KILN_CHECK_N + j] = (float)(acc + (double)bias[j]);
      if (acc + bias[j] > row_max) row_max = acc + bias[j];
    }
    for (int j = 0; j < KILN_CHECK_N; j++) total += exp((double)out_add[i * KILN_CHECK_N + j] - row_max);
    for (int j = 0; j < KILN_CHECK_N; j++)
      out_soft[i * KILN_CHECK_N + j] = (float)(exp((double)out_add[i * KILN_CHECK_N + j] - row_max) / total);
  }
}

/* softmax(a @ b + bias) on device; the three results are read to the host. */
static kiln_status_t check_run(kiln_device_t *device, float *out_mm, float *out_add, float *out_soft) {
  float a[KILN_CHECK_M * KILN_CHECK_K], b[KILN_CHECK_K * KILN_CHECK_N], bias[KILN_CHECK_N];
  check_inputs(a, b, bias);
  const int64_t sa[2] = {KILN_CHECK_M, KILN_CHECK_K}, sb[2] = {KILN_CHECK_K, KILN_CHECK_N}, sbias[1] = {KILN_CHECK_N};
  kiln_tensor_t *ta = NULL, *tb = NULL, *tbias = NULL, *mm = NULL, *sum = NULL, *soft = NULL;
  kiln_status_t status = kiln_tensor_from_host(device, KILN_F32, 2, sa, a, &ta);
  if (status == KILN_OK) status = kiln_tensor_from_host(device, KILN_F32, 2, sb, b, &tb);
  if (status == KILN_OK) status = kiln_tensor_from_host(device, KILN_F32, 1, sbias, bias, &tbias);
  if (status == KILN_OK) status = kiln_tensor_matmul(ta, tb, false, false, &mm);
  if (status == KILN_OK) status = kiln_tensor_add(mm, tbias, &sum);
  if (status == KILN_OK) status = kiln_tensor_softmax(sum, &soft);
  const size_t bytes = sizeof(float) * KILN_CHECK_M * KILN_CHECK_N;
  if (status == KILN_OK) status = kiln_tensor_read(mm, out_mm, bytes);
  if (status == KILN_OK) status = kiln_tensor_read(sum, out_add, bytes);
  if (status == KILN_OK) status = kiln_tensor_read(soft, out_soft, bytes);
  kiln_tensor_release(ta);
  kiln_tensor_release(tb);
  kiln_tensor_release(tbias);
  kiln_tensor_release(mm);
  kiln_tensor_release(sum);
  kiln_tensor_release(soft);
  return status;
}

/* The first element differing by more than the tolerance; -1 when none. */
static int check_compare(const float *got, const float *want, int n) {
  for (int i = 0; i < n; i++) {
    float tol = 1e-4f + 1e-4f * fabsf(want[i]);
    if (!(fabsf(got[i] - want[i]) <= tol)) return i;
  }
  return -1;
}

kiln_status_t kiln_device_check(kiln_device_t *device) {
  kiln_status_t status = kiln__ensure();
  if (status != KILN_OK) return status;
  if (!device)
    return kiln__set_error(KILN_INVALID_ARGUMENT, "kiln_device_check: device is NULL; pass a device from kiln_device_get");
  enum { N = KILN_CHECK_M * KILN_CHECK_N };
  float got[3][N], want[3][N];
  status = check_run(device, got[0], got[1], got[2]);
  if (status != KILN_OK) return kiln__wrap_error(status, "kiln_device_check(%s): running the check", device->display_name);
  check_reference(want[0], want[1], want[2]);
  static const char *const names[3] = {"matmul [7x5] @ [5x6]", "add of a broadcast bias", "softmax over rows"};
  for (int s = 0; s < 3; s++) {
    int at = check_compare(got[s], want[s], N);
    if (at >= 0)
      return kiln__set_error(KILN_INTERNAL,
                             "kiln_device_check(%s): %s differs from the reference computed on the host at element %d "
                             "(row %d, column %d): %.9g vs %.9g (tolerance 1e-4 absolute + 1e-4 relative); the "
                             "device's kernels or driver compute wrong results",
                             device->display_name, names[s], at, at / KILN_CHECK_N,
                             at % KILN_CHECK_N, (double)got[s][at], (double)want[s][at]);
  }
  return KILN_OK;
}
