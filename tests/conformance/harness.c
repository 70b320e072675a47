/* tests/conformance/harness.c: the conformance machinery: inputs, running a case everywhere, comparing, the tally. */
/*
 * Each case is run once on cpu:0 with kiln's own kernels (policy portable, no
 * overrides): the reference. Then, on every device under test, once per
 * provider the device lists for the row's op (kiln_device_providers), with
 * that provider forced through kiln_set_providers. Results must match the
 * reference within the row's tolerance; where the reference call fails (a
 * dtype the op does not take, an empty axis for max), the device must fail
 * with the same status. A row that documents its exact values (cast) also
 * checks the reference against them, computed on the host. A forced provider
 * that declines a case (the core runs native instead) must be covered by a
 * declared gap (gaps.c).
 */
#include <stdarg.h>

#include "harness.h"
#include "kernels/dtype_convert.h"

/* ---- devices and the tally -------------------------------------------------- */

kiln_device_t *kt_ref;
kiln_device_t *kt_devs[KT_MAX_DEVICES];
size_t kt_ndev;
bool kt_small;
static unsigned long kt_checks; /* comparisons made, for the summary */
/* Comparisons per device and provider name, for the summary. */
static struct {
  char provider[40];
  unsigned long count;
} kt_tally[KT_MAX_DEVICES][16];
/* Cases a forced provider declined where a gap of gaps.c says it may. */
static unsigned long kt_declined[KT_MAX_DEVICES];

static void kt_count(size_t device, const char *provider) {
  if (strcmp(provider, "unsupported") != 0) kt_checks++;
  for (int i = 0; i < 16; i++) {
    if (!kt_tally[device][i].provider[0])
      snprintf(kt_tally[device][i].provider, sizeof kt_tally[device][i].provider, "%s", provider);
    if (!strcmp(kt_tally[device][i].provider, provider)) {
      kt_tally[device][i].count++;
      return;
    }
  }
}

unsigned long kt_comparisons(void) { return kt_checks; }

void kt_summary_print(void) {
  printf("conformance: %lu comparisons against %s\n", kt_checks, kiln_device_name(kt_ref));
  for (size_t d = 0; d < kt_ndev; d++) {
    printf("  %s:", kiln_device_name(kt_devs[d]));
    for (int i = 0; i < 16 && kt_tally[d][i].provider[0]; i++)
      printf(" %s %lu", kt_tally[d][i].provider, kt_tally[d][i].count);
    printf("; declined (declared): %lu\n", kt_declined[d]);
  }
}

/* The backend of device `d` under test, as kiln_device_info names it. */
static const char *kt_backend_of(size_t d) {
  static char names[KT_MAX_DEVICES][32];
  if (!names[d][0]) {
    kiln_device_info_t info;
    KT_OK(kiln_device_info(kt_devs[d], &info));
    snprintf(names[d], sizeof names[d], "%s", info.backend);
  }
  return names[d];
}

/* ---- tolerances ------------------------------------------------------------------- */

const kt_tol_t kt_exact = {0, 0, 0, false};

/* Elementwise transcendental f32 ops: a few ulps (OpenCL allows 3-5 for exp,
 * log, tanh; CUDA 1-2), plus a tiny absolute slack for results near zero. */
kt_tol_t kt_ulps(int ulps) {
  kt_tol_t t = {0, 1e-7, ulps, false};
  return t;
}

/* Sums of `k` products or terms of magnitude about `scale`: relative 1e-4,
 * absolute growing with sqrt(k) (the rounding of a long sum in another order). */
kt_tol_t kt_sum_tol(int64_t k, double scale) {
  kt_tol_t t = {1e-4, 1e-5 * sqrt((double)(k > 1 ? k : 1)) * scale, 4, false};
  return t;
}

static int64_t kt_ordered(float f) {
  int32_t i;
  memcpy(&i, &f, sizeof i);
  return i < 0 ? (int64_t)INT32_MIN - (int64_t)i : (int64_t)i;
}

static bool kt_close(float got, float want, kt_tol_t tol) {
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
  if (tol.bits) return memcmp(&got, &want, sizeof got) == 0;
  if (got == want) return true;
  if (isinf(got) || isinf(want)) return false;
  if (fabs((double)got - (double)want) <= tol.atol + tol.rtol * fabs((double)want)) return true;
  int64_t d = kt_ordered(got) - kt_ordered(want);
  return tol.ulps > 0 && (d < 0 ? -d : d) <= tol.ulps;
}

/* f64 results: the same rule in double (ulps counted in double). */
static int64_t kt_ordered_f64(double x) {
  int64_t i;
  memcpy(&i, &x, sizeof i);
  return i < 0 ? INT64_MIN - i : i;
}

static bool kt_close_f64(double got, double want, kt_tol_t tol) {
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
  if (tol.bits) return memcmp(&got, &want, sizeof got) == 0;
  if (got == want) return true;
  if (isinf(got) || isinf(want)) return false;
  if (fabs(got - want) <= tol.atol + tol.rtol * fabs(want)) return true;
  const int64_t d = kt_ordered_f64(got) - kt_ordered_f64(want);
  return tol.ulps > 0 && (d < 0 ? -d : d) <= tol.ulps;
}

static float kt_half_to_f32(kiln_dtype_t dtype, uint16_t bits) {
  return dtype == KILN_F16 ? kiln_dc_f16_to_f32(bits) : kiln_dc_bf16_to_f32(bits);
}

/* f16 and bf16 results, computed in f32 and rounded once: exact where the
 * row is exact; otherwise one unit of the 16-bit type (an f32 result a few
 * f32 ulps apart rounds to a neighbour near a tie), or the row's relative
 * tolerance, at least the type's own (f16 1e-3, bf16 8e-3: one rounding to
 * 11 and 8 significant bits) for sums in another order. */
static bool kt_close_16(kiln_dtype_t dtype, uint16_t got, uint16_t want, kt_tol_t tol) {
  const float g = kt_half_to_f32(dtype, got), w = kt_half_to_f32(dtype, want);
  if (isnan(g) || isnan(w)) return isnan(g) && isnan(w);
  if (got == want) return true;
  if (tol.bits || (tol.rtol == 0 && tol.atol == 0 && tol.ulps == 0)) return false;
  if (isinf(g) || isinf(w)) return false;
  const int32_t og = (got & 0x8000u) ? -(int32_t)(got & 0x7fffu) : (int32_t)got;
  const int32_t ow = (want & 0x8000u) ? -(int32_t)(want & 0x7fffu) : (int32_t)want;
  if (og - ow <= 1 && ow - og <= 1) return true;
  const double rtol = tol.rtol > (dtype == KILN_F16 ? 1e-3 : 8e-3) ? tol.rtol : (dtype == KILN_F16 ? 1e-3 : 8e-3);
  return fabs((double)g - (double)w) <= tol.atol + rtol * fabs((double)w);
}

static void kt_tol_text(kiln_dtype_t dtype, kt_tol_t tol, char *out, size_t size) {
  if (dtype != KILN_I32 && tol.bits)
    snprintf(out, size, "exact to the bit");
  else if (dtype == KILN_I32 || (tol.rtol == 0 && tol.atol == 0 && tol.ulps == 0))
    snprintf(out, size, "exact");
  else
    snprintf(out, size, "rtol %g, atol %g, %d ulps", tol.rtol, tol.atol, tol.ulps);
}
/* ---- inputs ----------------------------------------------------------------------- */

static uint32_t kt_hash(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32 | seed);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 32;
  return (uint32_t)x;
}


int64_t kt_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

void kt_fill(const kt_in_t *in, void *data, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = kt_hash(in->seed, (uint64_t)i);
    float *f = (float *)data + i;
    int32_t *v = (int32_t *)data + i;
    switch (in->gen) {
      case KT_UNSET:
      case KT_SIGNED: *f = (float)((int32_t)(h % 8192) - 4096) / 4096.0f; break;
      case KT_WIDE: *f = (float)((int32_t)(h % 8192) - 4096) / 1024.0f; break;
      case KT_POSITIVE: *f = (float)(1 + h % 256) / 64.0f; break;
      case KT_BIG: *f = (float)((int32_t)(h % 20001) - 10000) / 100.0f; break;
      case KT_NEAR_100: *f = 100.0f + (float)(h % 3500) / 1000.0f; break;
      case KT_STEPS: *f = (float)((int32_t)(h % 7) - 3); break;
      case KT_INT: *v = (int32_t)(h % 101) - 50; break;
      case KT_INT_EDGE: {
        static const int32_t planted[] = {INT32_MIN, INT32_MAX, -1, 0, 1, INT32_MIN + 1};
        *v = i < 6 ? planted[i] : (int32_t)h;
        break;
      }
      case KT_INT_DIV: {
        static const int32_t planted[] = {INT32_MIN, -1, 7, 0, -7, 2};
        *v = i < 6 ? planted[i] : (int32_t)(h % 11) - 5;
        break;
      }
      case KT_LABELS: *v = (int32_t)(h % (uint32_t)(in->hi > 0 ? in->hi : 1)); break;
      case KT_CAST_F32: {
        /* The most telling first, for the small shapes. 2^31 is the first
         * value past INT_MAX, -2^31 is INT_MIN itself and -2147483904 the next
         * float below it; 2147483520 is the largest float below 2^31;
         * 16777217.0f is stored as 16777216. */
        static const float planted[] = {
            NAN, -0.0f, 2.5f, -2.5f, 3e9f, -INFINITY, 2147483648.0f, INFINITY, -3e9f, -2147483648.0f,
            -2147483904.0f, 2147483520.0f, 0.5f, -0.5f, 1.5f, -1.5f, 0.99999994f, -0.99999994f, 1e-40f,
            -1e-40f, FLT_MAX, -FLT_MAX, 16777217.0f, 1e20f, -1e20f, -7.75f,
        };
        if (i < KT_COUNT(planted)) {
          *f = planted[i];
        } else if (h % 3 == 0) {
          *f = (float)((int32_t)(h % 8192) - 4096) / 16.0f;
        } else if (h % 3 == 1) {
          *f = (float)(int32_t)kt_hash(in->seed + 1, (uint64_t)i) * 1.75f;
        } else {
          uint32_t bits = kt_hash(in->seed + 2, (uint64_t)i);
          memcpy(f, &bits, sizeof *f);
        }
        break;
      }
      case KT_CAST_I32: {
        /* 2^24 + 1 and 2^24 + 3 round to even (16777216, 16777220); INT_MAX
         * and 2^31 - 64 (a tie) round up to 2^31; 2^25 + 3 rounds to 2^25 + 4. */
        static const int32_t planted[] = {
            INT32_MIN, INT32_MAX, 16777217, -16777217, 16777216, 16777215, 16777219, -16777219,
            33554435, 2147483584, 2147483520, -2147483584, -1, 0, 1, INT32_MIN + 1,
        };
        if (i < KT_COUNT(planted))
          *v = planted[i];
        else
          *v = h % 2 ? (int32_t)kt_hash(in->seed + 1, (uint64_t)i) : (int32_t)(h % 2001) - 1000;
        break;
      }
    }
  }
}

/* The 4-byte dtype an input's values are drawn in: f32 for the floats, i32
 * for the integers and bool (converted by the cast rule afterwards). */
static kiln_dtype_t kt_drawn_dtype(kiln_dtype_t dtype) {
  return kiln_dtype_class(dtype) == KILN_DTYPE_CLASS_FLOAT ? KILN_F32 : KILN_I32;
}

/* Make the input on `dev`; *out is the tensor the op receives. Values of the
 * dtypes other than f32 and i32 are drawn in one of those and converted on
 * the reference (kiln_tensor_cast), then copied to `dev`: every device sees
 * the same bits. */
kiln_status_t kt_make(kiln_device_t *dev, const kt_in_t *in, kiln_tensor_t **out) {
  int64_t n = kt_numel(in->ndim, in->shape);
  void *data = malloc((size_t)(n > 0 ? n : 1) * 4);
  if (!data) return KILN_OUT_OF_MEMORY;
  kt_in_t drawn = *in;
  drawn.dtype = kt_drawn_dtype(in->dtype);
  kt_fill(&drawn, data, n);
  int64_t storage[KILN_MAX_DIMS];
  int perm[KILN_MAX_DIMS];
  const bool view = in->view && in->ndim >= 2;
  for (int i = 0; i < in->ndim; i++) {
    storage[i] = view ? in->shape[in->ndim - 1 - i] : in->shape[i];
    perm[i] = in->ndim - 1 - i;
  }
  kiln_tensor_t *base = NULL;
  kiln_status_t status;
  if (drawn.dtype == in->dtype) {
    status = kiln_tensor_from_host(dev, in->dtype, in->ndim, storage, data, &base);
  } else {
    kiln_tensor_t *raw = NULL, *cast = NULL;
    status = kiln_tensor_from_host(kt_ref, drawn.dtype, in->ndim, storage, data, &raw);
    if (status == KILN_OK) status = kiln_tensor_cast(raw, in->dtype, &cast);
    if (status == KILN_OK && dev != kt_ref) status = kiln_tensor_to(cast, dev, &base);
    else if (status == KILN_OK) base = kiln_tensor_retain(cast);
    kiln_tensor_release(raw);
    kiln_tensor_release(cast);
  }
  free(data);
  if (status != KILN_OK || !view) {
    *out = status == KILN_OK ? base : NULL;
    return status;
  }
  status = kiln_tensor_permute(base, perm, out);
  kiln_tensor_release(base);
  return status;
}

void kt_shape_text(int ndim, const int64_t *shape, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  used += (size_t)snprintf(out, size, "[");
  for (int i = 0; i < ndim && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? "x" : "", (long long)shape[i]);
  if (used < size) snprintf(out + used, size - used, "]");
}

void kt_in_text(const kt_in_t *in, char *out, size_t size) {
  char s[128];
  kt_shape_text(in->ndim, in->shape, s, sizeof s);
  snprintf(out, size, "%s %s%s", kiln_dtype_name(in->dtype), s, in->view ? " (permuted view)" : "");
}

kt_in_t kt_in(kiln_dtype_t dtype, kt_gen_t gen, uint32_t seed, int ndim, const int64_t *shape, bool view) {
  kt_in_t in;
  memset(&in, 0, sizeof in);
  in.dtype = dtype;
  in.gen = gen;
  in.seed = seed;
  in.ndim = ndim;
  for (int i = 0; i < ndim; i++) in.shape[i] = shape[i];
  in.view = view && ndim >= 2;
  return in;
}
/* ---- the machinery: run, read back, compare, tally ---------------------------------- */

static kiln_status_t kt_run(kiln_device_t *dev, const kt_case_t *c, kiln_tensor_t **out) {
  kiln_tensor_t *in[KT_MAX_IN] = {NULL};
  kiln_status_t status = KILN_OK;
  kiln_device_t *where = c->row->inputs == KT_ON_REF ? kt_ref : dev;
  for (int i = 0; i < c->n_in && status == KILN_OK; i++) status = kt_make(where, &c->in[i], &in[i]);
  if (status == KILN_OK) status = c->row->run(c, dev, in, out);
  for (int i = 0; i < KT_MAX_IN; i++) kiln_tensor_release(in[i]);
  return status;
}

/* Read `t` back into `r` (r->status set by the caller on entry). */
static void kt_result_read(kiln_tensor_t *t, kt_result_t *r) {
  if (r->status == KILN_OK) {
    r->dtype = kiln_tensor_dtype(t);
    r->ndim = kiln_tensor_ndim(t);
    memcpy(r->shape, kiln_tensor_shape(t), sizeof(int64_t) * (size_t)r->ndim);
    r->numel = kiln_tensor_numel(t);
    r->device = kiln_tensor_device(t);
    size_t bytes = (size_t)r->numel * kiln_dtype_size(r->dtype);
    r->data = malloc(bytes ? bytes : 1);
    r->status = r->data ? kiln_tensor_read(t, r->data, bytes) : KILN_OUT_OF_MEMORY;
  }
  if (r->status != KILN_OK) snprintf(r->message, sizeof r->message, "%s", kiln_last_error());
}

static void kt_result_get(kiln_device_t *dev, const kt_case_t *c, kt_result_t *r) {
  memset(r, 0, sizeof *r);
  kiln_clear_error();
  kiln_tensor_t *t = NULL;
  r->status = kt_run(dev, c, &t);
  snprintf(r->ran, sizeof r->ran, "%s", kiln_last_provider());
  kt_result_read(t, r);
  kiln_tensor_release(t);
}

static void kt_result_free(kt_result_t *r) {
  free(r->data);
  r->data = NULL;
}

int kt_failures;
char kt_first_failure[2048];

void kt_fail(const char *fmt, ...) {
  char text[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  fprintf(stderr, "FAIL: %s\n", text);
  if (kt_failures++ == 0) snprintf(kt_first_failure, sizeof kt_first_failure, "%s", text);
}

static void kt_index_text(const kt_result_t *r, int64_t flat, char *out, size_t size) {
  int64_t idx[KILN_MAX_DIMS];
  for (int i = r->ndim - 1; i >= 0; i--) {
    idx[i] = r->shape[i] ? flat % r->shape[i] : 0;
    flat = r->shape[i] ? flat / r->shape[i] : 0;
  }
  size_t used = (size_t)snprintf(out, size, "(");
  for (int i = 0; i < r->ndim && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? ", " : "", (long long)idx[i]);
  if (used < size) snprintf(out + used, size - used, ")");
}

/* Compare one device/provider result with what is expected (the reference's,
 * or for the reference itself the documented values: `against` says which). */
static void kt_compare(const kt_case_t *c, kiln_device_t *dev, const char *provider, const char *against,
                       const kt_result_t *want, const kt_result_t *got) {
  const char *where = kiln_device_name(dev);
  if (want->status != KILN_OK) {
    if (got->status != want->status)
      kt_fail("%s on %s, provider %s: got %s (%s), but %s says %s (%s)", c->label, where, provider,
              kiln_status_name(got->status), got->message, against, kiln_status_name(want->status), want->message);
    return;
  }
  if (got->status != KILN_OK) {
    kt_fail("%s on %s, provider %s: failed with %s: %s", c->label, where, provider, kiln_status_name(got->status),
            got->message);
    return;
  }
  kiln_device_t *expected_device = c->row->result == KT_ON_REF ? kt_ref : dev;
  if (got->device != expected_device) {
    kt_fail("%s on %s, provider %s: the result lives on %s, expected %s", c->label, where, provider,
            kiln_device_name(got->device), kiln_device_name(expected_device));
    return;
  }
  char ws[160], gs[160];
  kt_shape_text(want->ndim, want->shape, ws, sizeof ws);
  kt_shape_text(got->ndim, got->shape, gs, sizeof gs);
  if (got->dtype != want->dtype || strcmp(ws, gs) != 0) {
    kt_fail("%s on %s, provider %s: result is %s %s, expected %s %s (%s)", c->label, where, provider,
            kiln_dtype_name(got->dtype), gs, kiln_dtype_name(want->dtype), ws, against);
    return;
  }
  kt_tol_t tolerance = c->row->tol(c);
  char tol[96];
  kt_tol_text(want->dtype, tolerance, tol, sizeof tol);
  for (int64_t i = 0; i < want->numel; i++) {
    bool ok;
    char gv[48], wv[48];
    if (want->dtype == KILN_I32) {
      int32_t g = ((const int32_t *)got->data)[i], w = ((const int32_t *)want->data)[i];
      ok = g == w;
      snprintf(gv, sizeof gv, "%d", (int)g);
      snprintf(wv, sizeof wv, "%d", (int)w);
    } else if (want->dtype == KILN_I64) {
      int64_t g = ((const int64_t *)got->data)[i], w = ((const int64_t *)want->data)[i];
      ok = g == w;
      snprintf(gv, sizeof gv, "%lld", (long long)g);
      snprintf(wv, sizeof wv, "%lld", (long long)w);
    } else if (want->dtype == KILN_BOOL || want->dtype == KILN_U8 || want->dtype == KILN_I8) {
      const int g = ((const uint8_t *)got->data)[i], w = ((const uint8_t *)want->data)[i];
      ok = g == w;
      snprintf(gv, sizeof gv, "%d", g);
      snprintf(wv, sizeof wv, "%d", w);
    } else if (want->dtype == KILN_I16) {
      const int g = ((const int16_t *)got->data)[i], w = ((const int16_t *)want->data)[i];
      ok = g == w;
      snprintf(gv, sizeof gv, "%d", g);
      snprintf(wv, sizeof wv, "%d", w);
    } else if (want->dtype == KILN_F64) {
      const double g = ((const double *)got->data)[i], w = ((const double *)want->data)[i];
      ok = kt_close_f64(g, w, tolerance);
      snprintf(gv, sizeof gv, "%.17g", g);
      snprintf(wv, sizeof wv, "%.17g", w);
    } else if (want->dtype == KILN_F16 || want->dtype == KILN_BF16) {
      const uint16_t g = ((const uint16_t *)got->data)[i], w = ((const uint16_t *)want->data)[i];
      ok = kt_close_16(want->dtype, g, w, tolerance);
      snprintf(gv, sizeof gv, "%.6g (0x%04x)", (double)kt_half_to_f32(want->dtype, g), g);
      snprintf(wv, sizeof wv, "%.6g (0x%04x)", (double)kt_half_to_f32(want->dtype, w), w);
    } else {
      float g = ((const float *)got->data)[i], w = ((const float *)want->data)[i];
      ok = kt_close(g, w, tolerance);
      snprintf(gv, sizeof gv, "%.9g", (double)g);
      snprintf(wv, sizeof wv, "%.9g", (double)w);
    }
    if (!ok) {
      char at[160];
      kt_index_text(want, i, at, sizeof at);
      kt_fail("%s on %s, provider %s (ran %s), shape %s: first mismatch at element %lld %s: got %s, expected %s "
              "(%s; tolerance %s)",
              c->label, where, provider, got->ran, ws, (long long)i, at, gv, wv, against, tol);
      return;
    }
  }
}

/* A row with documented values: check the reference itself against them. */
static void kt_check_expected(const kt_case_t *c, const kt_result_t *ref) {
  if (ref->status != KILN_OK) {
    kt_fail("%s on %s, provider native: the reference failed with %s: %s", c->label, kiln_device_name(kt_ref),
            kiln_status_name(ref->status), ref->message);
    return;
  }
  kt_result_t in[KT_MAX_IN], expected;
  memset(in, 0, sizeof in);
  memset(&expected, 0, sizeof expected);
  bool made = true;
  for (int i = 0; i < c->n_in && made; i++) {
    kiln_tensor_t *t = NULL;
    in[i].status = kt_make(kt_ref, &c->in[i], &t);
    kt_result_read(t, &in[i]);
    kiln_tensor_release(t);
    made = in[i].status == KILN_OK;
    if (!made)
      kt_fail("%s: making input %d on %s failed with %s: %s", c->label, i, kiln_device_name(kt_ref),
              kiln_status_name(in[i].status), in[i].message);
  }
  if (made) {
    c->row->expect(c, in, &expected);
    expected.device = kt_ref;
    kt_compare(c, kt_ref, "native", "the documented values", &expected, ref);
  }
  for (int i = 0; i < KT_MAX_IN; i++) kt_result_free(&in[i]);
  kt_result_free(&expected);
}

/* Run a case on the reference, then on every device with every provider. */
void kt_check(const kt_case_t *c) {
  kt_result_t want;
  KT_OK(kiln_set_providers(""));
  kt_result_get(kt_ref, c, &want);
  /* Every kind has a native kernel on every backend: the reference cannot
   * lack one (it would make the comparisons below vacuous). */
  if (want.status == KILN_UNSUPPORTED)
    kt_fail("%s on %s, provider native: the reference has no kernel: %s", c->label, kiln_device_name(kt_ref),
            want.message);
  if (c->must_fail && want.status == KILN_OK)
    kt_fail("%s on %s, provider native: succeeded, but its arguments are invalid and it must fail", c->label,
            kiln_device_name(kt_ref));
  if (c->row->expect && !c->must_fail) kt_check_expected(c, &want);
  for (size_t d = 0; d < kt_ndev; d++) {
    const char *list = kiln_device_providers(kt_devs[d], c->row->op);
    ck_assert_msg(list != NULL, "kiln_device_providers does not know the op \"%s\"", c->row->op);
    if (!list[0]) {
      /* The device has no kernel for this op in any dtype: skipped, as
       * ggml's test-backend-ops does, and listed in the summary. */
      kt_count(d, "unsupported");
      continue;
    }
    /* A result of a dtype the device does not serve (the sum of i32 is
     * i64): the device refuses it before dispatch, once, with
     * KILN_UNSUPPORTED, whatever the providers. */
    bool unserved = want.status == KILN_OK && kiln_device_dtype_support(kt_devs[d], want.dtype) == KILN_DTYPE_UNSUPPORTED;
    for (int i = 0; i < c->n_in; i++)
      unserved = unserved || (want.status == KILN_OK &&
                              kiln_device_dtype_support(kt_devs[d], c->in[i].dtype) == KILN_DTYPE_UNSUPPORTED);
    if (unserved) {
      kt_result_t got;
      kt_result_get(kt_devs[d], c, &got);
      kt_count(d, "unsupported");
      if (got.status != KILN_UNSUPPORTED)
        kt_fail("%s on %s: got %s (%s), but the device does not serve an operand's or the result's dtype (result %s): "
                "expected %s",
                c->label,
                kiln_device_name(kt_devs[d]), kiln_status_name(got.status), got.message, kiln_dtype_name(want.dtype),
                kiln_status_name(KILN_UNSUPPORTED));
      kt_result_free(&got);
      continue;
    }
    char providers[128];
    snprintf(providers, sizeof providers, "%s", list);
    char *save = NULL;
    for (char *p = strtok_r(providers, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
      char override[96];
      snprintf(override, sizeof override, "%s=%s", c->row->op, p);
      KT_OK(kiln_set_providers(override));
      kt_result_t got;
      kt_result_get(kt_devs[d], c, &got);
      /* A provider may decline particular arguments (the core then runs
       * native): the summary shows how often, as "provider>native". An
       * empty result enqueues nothing, so says nothing about it. */
      char tally[40];
      bool other = got.status == KILN_OK && got.numel > 0 && got.ran[0] && strcmp(got.ran, p) != 0;
      snprintf(tally, sizeof tally, "%s%s%s", p, other ? ">" : "", other ? got.ran : "");
      kt_count(d, tally);
      if (other) {
        /* A decline must be declared (gaps.c): otherwise a provider that
         * stops taking a case would go unnoticed, its cases run by native. */
        if (kt_gap_find(kt_backend_of(d), p, c))
          kt_declined[d]++;
        else
          kt_fail("%s on %s, provider %s: the provider declined the case (%s ran it) and no gap declares it "
                  "(row \"%s\"): fix the provider's supports(), or declare the gap with its reason in "
                  "tests/conformance/gaps.c",
                  c->label, kiln_device_name(kt_devs[d]), p, got.ran, c->row->name);
      }
      kt_compare(c, kt_devs[d], p, "cpu:0 native", &want, &got);
      kt_result_free(&got);
    }
  }
  KT_OK(kiln_set_providers(""));
  kt_result_free(&want);
}

/* A case of `row` with nothing set yet. */
kt_case_t kt_case(const kt_row_t *row) {
  kt_case_t c;
  memset(&c, 0, sizeof c);
  c.row = row;
  return c;
}

/* ---- shapes and tolerance rules shared by rows ---------------------------------------- */

bool kt_skip(const kt_shape_t *s) { return kt_small && s->large; }

/* Shapes for elementwise ops: 0-d, empty, one element, primes, larger than a
 * work-group, and permuted views. */
const kt_shape_t kt_elementwise_shapes[] = {
    {0, {0}, false, false},         {1, {0}, false, false},         {1, {1}, false, false},
    {1, {7}, false, false},         {2, {3, 0}, false, false},      {2, {3, 5}, true, false},
    {3, {2, 3, 4}, true, false},    {1, {257}, false, true},        {2, {13, 257}, false, true},
    {2, {13, 257}, true, true},     {4, {2, 3, 5, 7}, true, true},  {1, {262147}, false, true},
    {-1, {0}, false, false},
};

/* Rows of softmax and its gradient: empty rows and columns, wide and tall. */
const kt_shape_t kt_softmax_shapes[] = {
    {0, {0}, false, false},     {1, {1}, false, false},      {1, {7}, false, false},
    {2, {3, 0}, false, false},  {2, {0, 5}, false, false},   {2, {4, 5}, true, false},
    {3, {2, 3, 4}, false, false}, {2, {13, 257}, false, true}, {2, {4, 1237}, false, true},
    {2, {257, 13}, true, true}, {2, {3, 9973}, false, true}, {-1, {0}, false, false},
};

kt_tol_t kt_tol_exact(const kt_case_t *c) {
  (void)c;
  return kt_exact;
}

kt_tol_t kt_tol_bits(const kt_case_t *c) {
  (void)c;
  kt_tol_t t = kt_exact;
  t.bits = true;
  return t;
}

/* The row's ulps, or exact when it names none. */
kt_tol_t kt_tol_row_ulps(const kt_case_t *c) { return c->row->ulps ? kt_ulps(c->row->ulps) : kt_exact; }

/* The shape of a creation result (or of a reduction's target) from a shape list entry. */
void kt_case_shape(kt_case_t *c, const kt_shape_t *s) {
  c->ndim = s->ndim;
  for (int i = 0; i < s->ndim; i++) c->shape[i] = s->s[i];
}

/* An f32 or i32 result of `ndim` dims of `shape`, values to be written. */
void kt_result_alloc(kt_result_t *out, kiln_dtype_t dtype, int ndim, const int64_t *shape) {
  out->status = KILN_OK;
  out->dtype = dtype;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
  out->numel = kt_numel(ndim, shape);
  /* At least 4 bytes an element (the f32 and i32 rows write that), 8 for f64 and i64. */
  const size_t es = kiln_dtype_size(dtype) > 4 ? kiln_dtype_size(dtype) : 4;
  out->data = calloc((size_t)(out->numel > 0 ? out->numel : 1), es);
  ck_assert_ptr_nonnull(out->data);
}
