/* nn/param.c: parameters (a value, its gradient), seeds and initialisation, and the per-thread count of which provider ran each op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* ---- parameters ------------------------------------------------------------------- */

static char *copy_name(const char *name) {
  size_t n = name ? strlen(name) : 0;
  char *s = malloc(n + 1);
  if (s) {
    if (n) memcpy(s, name, n);
    s[n] = '\0';
  }
  return s;
}

kiln_status_t kiln_nn_param_create(const char *name, kiln_tensor_t *value, kiln_nn_param_t **out_param) {
  static const char call[] = "kiln_nn_param_create";
  if (!value || !out_param)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !value ? "value" : "out_param");
  if (kiln_tensor_dtype(value) != KILN_F32)
    return kiln_set_error(KILN_DTYPE_MISMATCH, "%s: the value of '%s' is %s; parameters are f32 (kiln_tensor_cast makes one)",
                          call, name ? name : "", kiln_dtype_name(kiln_tensor_dtype(value)));
  if (!kiln_tensor_is_contiguous(value))
    return kiln_set_error(KILN_INVALID_ARGUMENT,
                          "%s: the value of '%s' is a non-contiguous view; pass kiln_tensor_contiguous(value)", call,
                          name ? name : "");
  kiln_nn_param_t *p = calloc(1, sizeof *p);
  char *copy = copy_name(name);
  if (!p || !copy) {
    free(p);
    free(copy);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate the parameter '%s'", call, name ? name : "");
  }
  p->name = copy;
  p->value = kiln_tensor_retain(value);
  *out_param = p;
  return KILN_OK;
}

void kiln_nn_param_free(kiln_nn_param_t *param) {
  if (!param) return;
  kiln_tensor_release(param->value);
  kiln_tensor_release(param->low);
  kiln_tensor_release(param->grad);
  free(param->name);
  free(param);
}

const char *kiln_nn_param_name(const kiln_nn_param_t *param) { return param ? param->name : NULL; }
kiln_tensor_t *kiln_nn_param_value(const kiln_nn_param_t *param) { return param ? param->value : NULL; }
kiln_tensor_t *kiln_nn_param_grad(const kiln_nn_param_t *param) { return param ? param->grad : NULL; }

void kiln_nn_param_zero_grad(kiln_nn_param_t *param) {
  if (!param) return;
  kiln_tensor_release(param->grad);
  param->grad = NULL;
  param->grad_exclusive = false;
}

kiln_status_t kiln_nn__params_to(kiln_nn_param_t *const *params, size_t count, kiln_device_t *device,
                                 const char *call) {
  if (!device) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: device is NULL", call);
  enum { BATCH = 64 };
  /* Every value is copied first, so a failure leaves all of them where they were. */
  kiln_tensor_t *stack[BATCH], **moved = count <= BATCH ? stack : calloc(count, sizeof *moved);
  if (!moved) return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate %zu pointers", call, count);
  kiln_status_t status = KILN_OK;
  size_t done = 0;
  while (done < count && status == KILN_OK) {
    status = kiln_tensor_to(params[done]->value, device, &moved[done]);
    if (status == KILN_OK) done++;
  }
  for (size_t i = 0; i < done; i++) {
    if (status != KILN_OK) {
      kiln_tensor_release(moved[i]);
      continue;
    }
    kiln_nn_param_t *p = params[i];
    if (moved[i] == p->value) {
      kiln_tensor_release(moved[i]);
      continue;
    }
    kiln_tensor_release(p->value);
    p->value = moved[i];
    kiln_tensor_release(p->low);
    p->low = NULL;
    p->low_current = false;
    kiln_nn_param_zero_grad(p);
  }
  if (moved != stack) free(moved);
  return status;
}

kiln_status_t kiln_nn_param_to(kiln_nn_param_t *param, kiln_device_t *device) {
  if (!param) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_param_to: param is NULL");
  return kiln_nn__params_to(&param, 1, device, "kiln_nn_param_to");
}

kiln_status_t kiln_nn__param_rename(kiln_nn_param_t *param, const char *name) {
  char *copy = copy_name(name);
  if (!copy) return kiln_set_error(KILN_OUT_OF_MEMORY, "cannot allocate the parameter name '%s'", name);
  free(param->name);
  param->name = copy;
  return KILN_OK;
}

kiln_status_t kiln_nn__param_add_grad(kiln_nn_param_t *param, kiln_tensor_t *g, bool exclusive) {
  if (!param->grad) {
    param->grad = g;
    /* In place needs kiln_tensor_accumulate, which is f32 only: a 16-bit
     * gradient of a low-precision step is summed out of place. */
    param->grad_exclusive = exclusive && kiln_tensor_is_contiguous(g) && kiln_tensor_dtype(g) == KILN_F32;
    return KILN_OK;
  }
  kiln_status_t status;
  if (param->grad_exclusive) {
    status = kiln_tensor_accumulate(param->grad, 1.0, g);
    kiln_tensor_release(g);
  } else {
    /* Shared memory must not be written: a new sum, which then is ours alone. */
    kiln_tensor_t *sum = NULL;
    status = kiln_tensor_add(param->grad, g, &sum);
    kiln_tensor_release(g);
    if (status == KILN_OK) {
      kiln_tensor_release(param->grad);
      param->grad = sum;
      param->grad_exclusive = true;
    }
  }
  if (status != KILN_OK) return kiln_wrap_error(status, "adding the gradient of parameter '%s'", param->name);
  return KILN_OK;
}

/* ---- seeds and initialisation ------------------------------------------------------- */

uint64_t kiln_nn_seed_derive(uint64_t seed, uint64_t index) {
  /* Two rounds: the seed's stream, then the index mixed in, so that nearby
   * seeds and nearby indices give unrelated keys. */
  uint64_t state = seed;
  uint64_t a = kiln_nn__splitmix64(&state);
  state = a ^ (index * 0xd1b54a32d192ed03ull);
  return kiln_nn__splitmix64(&state);
}

kiln_status_t kiln_nn_param_init_uniform(kiln_nn_param_t *param, int64_t fan_in, uint64_t seed) {
  static const char call[] = "kiln_nn_param_init_uniform";
  if (!param) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: param is NULL", call);
  if (fan_in < 1)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: fan_in %lld for '%s'; pass the inputs per output (>= 1)", call,
                          (long long)fan_in, param->name);
  const float bound = (float)(1.0 / sqrt((double)fan_in));
  kiln_tensor_t *v = param->value, *drawn = NULL;
  param->low_current = false; /* a new value: the next forward casts it afresh */
  kiln_status_t status =
      kiln_tensor_uniform(kiln_tensor_device(v), kiln_tensor_ndim(v), kiln_tensor_shape(v), seed, -bound, bound, &drawn);
  if (status == KILN_OK) {
    /* Into the value itself: a model's parameters keep their identity (an
     * optimizer and a tape may hold them). A copy over the same bytes. */
    kiln_queue_t *queue = kiln_device_current_queue(kiln_tensor_device(v));
    size_t bytes = (size_t)kiln_tensor_numel(v) * sizeof(float);
    status = kiln_buffer_copy(queue, kiln_tensor_buffer(drawn), kiln_tensor_offset_bytes(drawn), kiln_tensor_buffer(v),
                              kiln_tensor_offset_bytes(v), bytes, 0, NULL, NULL);
  }
  kiln_tensor_release(drawn);
  if (status != KILN_OK) return kiln_wrap_error(status, "%s: '%s'", call, param->name);
  return KILN_OK;
}
