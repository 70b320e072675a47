/* nn/layers.c: the layers (linear, conv2d, max_pool2d, relu, flatten): their parameters, initialisation and forward pass on the tape. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* ---- making layers ------------------------------------------------------------- */

static kiln_status_t layer_new(kiln_nn__layer_kind_t kind, kiln_nn_layer_t **out) {
  kiln_nn_layer_t *layer = calloc(1, sizeof *layer);
  if (!layer) return kiln_set_error(KILN_OUT_OF_MEMORY, "cannot allocate a layer");
  layer->kind = kind;
  *out = layer;
  return KILN_OK;
}

/* A parameter of `shape` drawn as kiln_nn_param_init_uniform would, straight
 * into its value (no copy at creation). */
static kiln_status_t make_param(kiln_device_t *device, const char *name, int ndim, const int64_t *shape, int64_t fan_in,
                                uint64_t seed, kiln_nn_param_t **out) {
  const float bound = 1.0f / sqrtf((float)fan_in);
  kiln_tensor_t *value = NULL;
  kiln_status_t status = kiln_tensor_uniform(device, ndim, shape, seed, -bound, bound, &value);
  if (status != KILN_OK) return status;
  status = kiln_nn_param_create(name, value, out);
  kiln_tensor_release(value);
  return status;
}

static kiln_status_t add_weights(kiln_nn_layer_t *layer, kiln_device_t *device, int ndim, const int64_t *shape,
                                 bool bias, uint64_t seed) {
  kiln_status_t status =
      make_param(device, "weight", ndim, shape, layer->fan_in, kiln_nn_seed_derive(seed, 0), &layer->params[0]);
  if (status == KILN_OK) layer->param_count = 1;
  if (status == KILN_OK && bias) {
    status = make_param(device, "bias", 1, shape, layer->fan_in, kiln_nn_seed_derive(seed, 1), &layer->params[1]);
    if (status == KILN_OK) layer->param_count = 2;
  }
  return status;
}

kiln_status_t kiln_nn_linear_create(kiln_device_t *device, int64_t in, int64_t out, bool bias, uint64_t seed,
                                    kiln_nn_layer_t **out_layer) {
  static const char call[] = "kiln_nn_linear_create";
  if (!device || !out_layer)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !device ? "device" : "out_layer");
  if (in < 1 || out < 1)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: sizes in %lld, out %lld; both must be >= 1", call, (long long)in,
                          (long long)out);
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = layer_new(KILN_NN__LINEAR, &layer);
  if (status != KILN_OK) return status;
  layer->fan_in = in;
  snprintf(layer->text, sizeof layer->text, "linear(%lld, %lld%s)", (long long)in, (long long)out,
           bias ? "" : ", no bias");
  const int64_t shape[2] = {out, in};
  status = add_weights(layer, device, 2, shape, bias, seed);
  if (status != KILN_OK) {
    kiln_nn_layer_free(layer);
    return kiln_wrap_error(status, "%s", call);
  }
  *out_layer = layer;
  return KILN_OK;
}

kiln_status_t kiln_nn_conv2d_create(kiln_device_t *device, int64_t in_channels, int64_t out_channels, int64_t kernel_h,
                                    int64_t kernel_w, const kiln_conv2d_params_t *params, bool bias, uint64_t seed,
                                    kiln_nn_layer_t **out_layer) {
  static const char call[] = "kiln_nn_conv2d_create";
  if (!device || !out_layer)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !device ? "device" : "out_layer");
  if (in_channels < 1 || out_channels < 1 || kernel_h < 1 || kernel_w < 1)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: channels %lld -> %lld, kernel %lldx%lld; each must be >= 1", call,
                          (long long)in_channels, (long long)out_channels, (long long)kernel_h, (long long)kernel_w);
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = layer_new(KILN_NN__CONV2D, &layer);
  if (status != KILN_OK) return status;
  layer->conv = params ? *params : kiln_conv2d_params_default();
  layer->fan_in = in_channels * kernel_h * kernel_w;
  int n = snprintf(layer->text, sizeof layer->text, "conv2d(%lld, %lld, %lldx%lld", (long long)in_channels,
                   (long long)out_channels, (long long)kernel_h, (long long)kernel_w);
  const kiln_conv2d_params_t *c = &layer->conv;
  if (c->padding[0] || c->padding[1])
    n += snprintf(layer->text + n, sizeof layer->text - (size_t)n,
                  c->padding[0] == c->padding[1] ? ", pad %d" : ", pad %dx%d", c->padding[0], c->padding[1]);
  if (c->stride[0] != 1 || c->stride[1] != 1)
    n += snprintf(layer->text + n, sizeof layer->text - (size_t)n, ", stride %dx%d", c->stride[0], c->stride[1]);
  snprintf(layer->text + n, sizeof layer->text - (size_t)n, "%s)", bias ? "" : ", no bias");
  const int64_t shape[4] = {out_channels, in_channels, kernel_h, kernel_w};
  status = add_weights(layer, device, 4, shape, bias, seed);
  if (status != KILN_OK) {
    kiln_nn_layer_free(layer);
    return kiln_wrap_error(status, "%s", call);
  }
  *out_layer = layer;
  return KILN_OK;
}

kiln_status_t kiln_nn_max_pool2d_create(const kiln_pool2d_params_t *params, kiln_nn_layer_t **out_layer) {
  if (!params || !out_layer)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_max_pool2d_create: %s is NULL", !params ? "params" : "out_layer");
  if (params->kernel[0] < 1 || params->kernel[1] < 1)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_max_pool2d_create: kernel %dx%d; each size must be >= 1",
                          params->kernel[0], params->kernel[1]);
  kiln_nn_layer_t *layer = NULL;
  kiln_status_t status = layer_new(KILN_NN__MAX_POOL2D, &layer);
  if (status != KILN_OK) return status;
  layer->pool = *params;
  snprintf(layer->text, sizeof layer->text, "max_pool2d(%dx%d)", params->kernel[0], params->kernel[1]);
  *out_layer = layer;
  return KILN_OK;
}

kiln_status_t kiln_nn_activation_create(kiln_unary_op_t op, kiln_nn_layer_t **out_layer) {
  static const char *const names[KILN_UNARY_COUNT_] = {
#define NAME_(NAME, name) #name,
      KILN_UNARY_OPS(NAME_)
#undef NAME_
  };
  if (!out_layer) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_activation_create: out_layer is NULL");
  if ((unsigned)op >= KILN_UNARY_COUNT_)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_activation_create: op %d is not a kiln_unary_op_t", (int)op);
  kiln_status_t status = layer_new(KILN_NN__ACTIVATION, out_layer);
  if (status != KILN_OK) return status;
  (*out_layer)->activation = op;
  snprintf((*out_layer)->text, sizeof (*out_layer)->text, "%s", names[op]);
  return KILN_OK;
}

kiln_status_t kiln_nn_relu_create(kiln_nn_layer_t **out_layer) {
  if (!out_layer) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_relu_create: out_layer is NULL");
  return kiln_nn_activation_create(KILN_UNARY_RELU, out_layer);
}

kiln_status_t kiln_nn_flatten_create(kiln_nn_layer_t **out_layer) {
  if (!out_layer) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_flatten_create: out_layer is NULL");
  kiln_status_t status = layer_new(KILN_NN__FLATTEN, out_layer);
  if (status == KILN_OK) snprintf((*out_layer)->text, sizeof (*out_layer)->text, "flatten");
  return status;
}

kiln_status_t kiln_nn_layer_to(kiln_nn_layer_t *layer, kiln_device_t *device) {
  if (!layer) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_layer_to: layer is NULL");
  return kiln_nn__params_to(layer->params, layer->param_count, device, "kiln_nn_layer_to");
}

void kiln_nn_layer_free(kiln_nn_layer_t *layer) {
  if (!layer) return;
  for (size_t i = 0; i < layer->param_count; i++) kiln_nn_param_free(layer->params[i]);
  free(layer);
}

const char *kiln_nn_layer_describe(const kiln_nn_layer_t *layer) { return layer ? layer->text : ""; }

size_t kiln_nn_layer_param_count(const kiln_nn_layer_t *layer) { return layer ? layer->param_count : 0; }

kiln_nn_param_t *kiln_nn_layer_param(const kiln_nn_layer_t *layer, size_t i) {
  return layer && i < layer->param_count ? layer->params[i] : NULL;
}

kiln_status_t kiln_nn__layer_reset(kiln_nn_layer_t *layer, uint64_t seed_weight, uint64_t seed_bias) {
  kiln_status_t status = KILN_OK;
  for (size_t i = 0; i < layer->param_count && status == KILN_OK; i++)
    status = kiln_nn_param_init_uniform(layer->params[i], layer->fan_in, i == 0 ? seed_weight : seed_bias);
  return status;
}

/* ---- the forward pass ------------------------------------------------------------- */

kiln_status_t kiln_nn_layer_forward(kiln_nn_layer_t *layer, kiln_nn_tape_t *tape, kiln_tensor_t *x,
                                    kiln_tensor_t **out) {
  if (!layer || !x || !out)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_layer_forward: %s is NULL",
                          !layer ? "layer" : !x ? "x" : "out");
  kiln_tensor_t *w = NULL, *b = NULL;
  kiln_status_t status = KILN_OK;
  if (layer->param_count > 0) status = kiln_nn_tape_watch(tape, layer->params[0], &w);
  if (status == KILN_OK && layer->param_count > 1) status = kiln_nn_tape_watch(tape, layer->params[1], &b);
  if (status != KILN_OK) return status;
  switch (layer->kind) {
  case KILN_NN__LINEAR: status = kiln_nn_tape_linear(tape, x, w, b, out); break;
  case KILN_NN__CONV2D: status = kiln_nn_tape_conv2d(tape, x, w, b, &layer->conv, out); break;
  case KILN_NN__MAX_POOL2D: status = kiln_nn_tape_max_pool2d(tape, x, &layer->pool, out); break;
  case KILN_NN__ACTIVATION: status = kiln_nn_tape_unary(tape, layer->activation, x, out); break;
  case KILN_NN__FLATTEN: {
    const int64_t *shape = kiln_tensor_shape(x);
    int64_t flat[2] = {kiln_tensor_ndim(x) > 0 ? shape[0] : 1, -1};
    status = kiln_nn_tape_reshape(tape, x, 2, flat, out);
    break;
  }
  }
  if (status != KILN_OK) return kiln_wrap_error(status, "layer %s", layer->text);
  return KILN_OK;
}
