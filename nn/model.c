/* nn/model.c: sequential models: layers in order, their parameters named as PyTorch names them, checkpoints, and kiln-train's two presets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

struct kiln_nn_model_t {
  kiln_nn_layer_t **layers;
  size_t layer_count, layer_capacity;
  kiln_nn_param_t **params; /* every layer's, in order */
  size_t param_count, param_capacity;
  kiln_device_t *device;
  kiln_dtype_t precision; /* of the forward and backward: f32, bf16 or f16 */
};

kiln_status_t kiln_nn_model_create(kiln_nn_model_t **out_model) {
  if (!out_model) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_model_create: out_model is NULL");
  kiln_nn_model_t *model = calloc(1, sizeof *model);
  if (!model) return kiln_set_error(KILN_OUT_OF_MEMORY, "kiln_nn_model_create: cannot allocate a model");
  model->precision = KILN_F32;
  *out_model = model;
  return KILN_OK;
}

void kiln_nn_model_free(kiln_nn_model_t *model) {
  if (!model) return;
  for (size_t i = 0; i < model->layer_count; i++) kiln_nn_layer_free(model->layers[i]);
  free(model->layers);
  free(model->params);
  free(model);
}

static bool grow(void **array, size_t *capacity, size_t need, size_t item) {
  if (need <= *capacity) return true;
  size_t cap = *capacity ? *capacity * 2 : 8;
  while (cap < need) cap *= 2;
  void *grown = realloc(*array, cap * item);
  if (!grown) return false;
  *array = grown;
  *capacity = cap;
  return true;
}

kiln_status_t kiln_nn_model_add(kiln_nn_model_t *model, kiln_nn_layer_t *layer) {
  static const char call[] = "kiln_nn_model_add";
  if (!model || !layer) {
    kiln_nn_layer_free(layer);
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !model ? "model" : "layer");
  }
  kiln_device_t *device = layer->param_count ? kiln_tensor_device(layer->params[0]->value) : NULL;
  if (device && model->device && device != model->device) {
    kiln_status_t status = kiln_set_error(
        KILN_DEVICE_MISMATCH, "%s: layer %zu, %s, lives on %s but the model's parameters on %s; create it on %s", call,
        model->layer_count, layer->text, kiln_device_name(device), kiln_device_name(model->device),
        kiln_device_selector(model->device));
    kiln_nn_layer_free(layer);
    return status;
  }
  if (!grow((void **)&model->layers, &model->layer_capacity, model->layer_count + 1, sizeof *model->layers) ||
      !grow((void **)&model->params, &model->param_capacity, model->param_count + layer->param_count,
            sizeof *model->params)) {
    kiln_nn_layer_free(layer);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: cannot grow the model", call);
  }
  /* torch.nn.Sequential's state_dict names: "<position>.weight". */
  for (size_t i = 0; i < layer->param_count; i++) {
    char name[64];
    snprintf(name, sizeof name, "%zu.%s", model->layer_count, i == 0 ? "weight" : "bias");
    kiln_status_t status = kiln_nn__param_rename(layer->params[i], name);
    if (status != KILN_OK) {
      kiln_nn_layer_free(layer);
      return status;
    }
  }
  for (size_t i = 0; i < layer->param_count; i++) model->params[model->param_count++] = layer->params[i];
  model->layers[model->layer_count++] = layer;
  if (device) model->device = device;
  return KILN_OK;
}

size_t kiln_nn_model_layer_count(const kiln_nn_model_t *model) { return model ? model->layer_count : 0; }

kiln_nn_layer_t *kiln_nn_model_layer(const kiln_nn_model_t *model, size_t i) {
  return model && i < model->layer_count ? model->layers[i] : NULL;
}

kiln_nn_param_t *const *kiln_nn_model_params(const kiln_nn_model_t *model, size_t *out_count) {
  if (out_count) *out_count = model ? model->param_count : 0;
  return model ? model->params : NULL;
}

kiln_status_t kiln_nn_model_to(kiln_nn_model_t *model, kiln_device_t *device) {
  if (!model) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_model_to: model is NULL");
  if (device && model->precision != KILN_F32 &&
      kiln_device_dtype_support(device, model->precision) == KILN_DTYPE_UNSUPPORTED)
    return kiln_set_error(KILN_UNSUPPORTED, "kiln_nn_model_to: %s has no %s kernels for this model's precision; set "
                          "it to f32 first (kiln_nn_model_set_precision)", kiln_device_name(device),
                          kiln_dtype_name(model->precision));
  kiln_status_t status = kiln_nn__params_to(model->params, model->param_count, device, "kiln_nn_model_to");
  if (status == KILN_OK && model->param_count) model->device = device;
  return status;
}

kiln_device_t *kiln_nn_model_device(const kiln_nn_model_t *model) { return model ? model->device : NULL; }

kiln_status_t kiln_nn_model_set_precision(kiln_nn_model_t *model, kiln_dtype_t precision) {
  static const char call[] = "kiln_nn_model_set_precision";
  if (!model) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: model is NULL", call);
  if (precision != KILN_F32 && precision != KILN_BF16 && precision != KILN_F16)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: precision %s; a model computes in f32, bf16 or f16", call,
                          kiln_dtype_name(precision));
  if (precision != KILN_F32 && model->device &&
      kiln_device_dtype_support(model->device, precision) == KILN_DTYPE_UNSUPPORTED)
    return kiln_set_error(KILN_UNSUPPORTED, "%s: %s has no %s kernels (kiln_device_dtype_support); train there in f32",
                          call, kiln_device_name(model->device), kiln_dtype_name(precision));
  model->precision = precision;
  if (precision == KILN_F32)
    for (size_t i = 0; i < model->param_count; i++) {
      kiln_tensor_release(model->params[i]->low);
      model->params[i]->low = NULL;
    }
  return KILN_OK;
}

kiln_dtype_t kiln_nn_model_precision(const kiln_nn_model_t *model) {
  return model ? model->precision : KILN_F32;
}

/* The step's low-precision copy of every parameter: cast once from the f32
 * master value, after the update that came before this forward, unless that
 * update wrote the copy itself (kiln_tensor_*_update_mixed). */
static kiln_status_t refresh_low(kiln_nn_model_t *model) {
  for (size_t i = 0; i < model->param_count; i++) {
    kiln_nn_param_t *p = model->params[i];
    /* The step's fused update already rounded the new value into the copy. */
    if (p->low_current && p->low && kiln_tensor_dtype(p->low) == model->precision) {
      p->low_current = false;
      continue;
    }
    p->low_current = false;
    kiln_tensor_t *low = NULL;
    kiln_status_t status = kiln_tensor_cast(p->value, model->precision, &low);
    if (status != KILN_OK)
      return kiln_wrap_error(status, "the %s copy of parameter '%s'", kiln_dtype_name(model->precision), p->name);
    kiln_tensor_release(p->low);
    p->low = low;
  }
  return KILN_OK;
}

kiln_status_t kiln_nn_model_forward(kiln_nn_model_t *model, kiln_nn_tape_t *tape, kiln_tensor_t *x,
                                    kiln_tensor_t **out) {
  if (!model || !x || !out)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_model_forward: %s is NULL", !model ? "model" : !x ? "x" : "out");
  const kiln_dtype_t low = kiln_nn_model_precision(model);
  kiln_tensor_t *cur = NULL;
  if (low != KILN_F32) {
    kiln_status_t status = refresh_low(model);
    /* The input too (a constant: no gradient reaches a batch). */
    if (status == KILN_OK) status = kiln_tensor_cast(x, low, &cur);
    if (status != KILN_OK) return kiln_wrap_error(status, "kiln_nn_model_forward in %s", kiln_dtype_name(low));
  } else {
    cur = kiln_tensor_retain(x);
  }
  for (size_t i = 0; i < model->layer_count; i++) {
    kiln_tensor_t *next = NULL;
    kiln_status_t status = kiln_nn_layer_forward(model->layers[i], tape, cur, &next);
    /* The tape keeps what its backward needs; the rest returns to the pool. */
    kiln_tensor_release(cur);
    if (status != KILN_OK) return kiln_wrap_error(status, "kiln_nn_model_forward: layer %zu", i);
    cur = next;
  }
  *out = cur;
  return KILN_OK;
}

kiln_status_t kiln_nn_model_reset_parameters(kiln_nn_model_t *model, uint64_t seed) {
  if (!model) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_model_reset_parameters: model is NULL");
  size_t k = 0;
  for (size_t i = 0; i < model->layer_count; i++) {
    kiln_nn_layer_t *layer = model->layers[i];
    if (!layer->param_count) continue;
    kiln_status_t status = kiln_nn__layer_reset(layer, kiln_nn_seed_derive(seed, k), kiln_nn_seed_derive(seed, k + 1));
    if (status != KILN_OK) return kiln_wrap_error(status, "kiln_nn_model_reset_parameters: layer %zu", i);
    k += layer->param_count;
  }
  return KILN_OK;
}

/* ---- checkpoints ----------------------------------------------------------------- */

static kiln_status_t named(const kiln_nn_model_t *model, kiln_nn_named_tensor_t **out) {
  kiln_nn_named_tensor_t *list = calloc(model->param_count ? model->param_count : 1, sizeof *list);
  if (!list) return kiln_set_error(KILN_OUT_OF_MEMORY, "cannot list %zu parameters", model->param_count);
  for (size_t i = 0; i < model->param_count; i++) list[i] = (kiln_nn_named_tensor_t){model->params[i]->name,
                                                                                      model->params[i]->value};
  *out = list;
  return KILN_OK;
}

kiln_status_t kiln_nn_model_save(const kiln_nn_model_t *model, const char *path) {
  if (!model || !path)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_model_save: %s is NULL", !model ? "model" : "path");
  kiln_nn_named_tensor_t *list = NULL;
  kiln_status_t status = named(model, &list);
  /* A diverged model never overwrites a checkpoint. */
  if (status == KILN_OK)
    status = kiln_nn__safetensors_save("kiln_nn_model_save", path, list, model->param_count, NULL, 0, true);
  free(list);
  return status;
}

kiln_status_t kiln_nn_model_load(kiln_nn_model_t *model, const char *path) {
  if (!model || !path)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_model_load: %s is NULL", !model ? "model" : "path");
  kiln_nn_named_tensor_t *list = NULL;
  kiln_status_t status = named(model, &list);
  if (status == KILN_OK) status = kiln_nn_safetensors_load_into(path, list, model->param_count, true);
  free(list);
  /* New values: the next forward casts them afresh. */
  for (size_t i = 0; i < model->param_count; i++) model->params[i]->low_current = false;
  return status;
}

/* ---- presets ---------------------------------------------------------------------- */

/* One layer of a preset: a kind and its sizes. */
typedef struct preset_layer_t {
  kiln_nn__layer_kind_t kind;
  int64_t a, b, k, pad; /* linear: in, out; conv2d: in, out, kernel, padding; max_pool2d: kernel */
} preset_layer_t;

static const preset_layer_t preset_mlp[] = {
    {KILN_NN__FLATTEN, 0, 0, 0, 0},
    {KILN_NN__LINEAR, 784, 1000, 0, 0},
    {KILN_NN__ACTIVATION, 0, 0, 0, 0},
    {KILN_NN__LINEAR, 1000, 10, 0, 0},
};

static const preset_layer_t preset_lenet[] = {
    {KILN_NN__CONV2D, 1, 6, 5, 2},     {KILN_NN__ACTIVATION, 0, 0, 0, 0},    {KILN_NN__MAX_POOL2D, 0, 0, 2, 0},
    {KILN_NN__CONV2D, 6, 16, 5, 0},    {KILN_NN__ACTIVATION, 0, 0, 0, 0},    {KILN_NN__MAX_POOL2D, 0, 0, 2, 0},
    {KILN_NN__FLATTEN, 0, 0, 0, 0},    {KILN_NN__LINEAR, 400, 120, 0, 0}, {KILN_NN__ACTIVATION, 0, 0, 0, 0},
    {KILN_NN__LINEAR, 120, 84, 0, 0},  {KILN_NN__ACTIVATION, 0, 0, 0, 0},    {KILN_NN__LINEAR, 84, 10, 0, 0},
};

static kiln_status_t preset_layer(kiln_device_t *device, const preset_layer_t *p, kiln_nn_layer_t **out) {
  switch (p->kind) {
  case KILN_NN__LINEAR: return kiln_nn_linear_create(device, p->a, p->b, true, 0, out);
  case KILN_NN__CONV2D: {
    kiln_conv2d_params_t c = kiln_conv2d_params_default();
    c.padding[0] = c.padding[1] = (int32_t)p->pad;
    return kiln_nn_conv2d_create(device, p->a, p->b, p->k, p->k, &c, true, 0, out);
  }
  case KILN_NN__MAX_POOL2D: {
    kiln_pool2d_params_t q = {{(int32_t)p->k, (int32_t)p->k}, {0, 0}, {0, 0}};
    return kiln_nn_max_pool2d_create(&q, out);
  }
  case KILN_NN__ACTIVATION: return kiln_nn_relu_create(out); /* the presets' activation */
  case KILN_NN__FLATTEN: return kiln_nn_flatten_create(out);
  }
  return kiln_set_error(KILN_INTERNAL, "preset layer kind %d", (int)p->kind);
}

kiln_status_t kiln_nn_model_create_preset(const char *name, kiln_device_t *device, uint64_t seed,
                                          kiln_nn_model_t **out_model) {
  static const char call[] = "kiln_nn_model_create_preset";
  if (!name || !device || !out_model)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call,
                          !name ? "name" : !device ? "device" : "out_model");
  const preset_layer_t *layers;
  size_t count;
  if (!strcmp(name, "mlp")) {
    layers = preset_mlp;
    count = sizeof preset_mlp / sizeof *preset_mlp;
  } else if (!strcmp(name, "lenet")) {
    layers = preset_lenet;
    count = sizeof preset_lenet / sizeof *preset_lenet;
  } else {
    return kiln_set_error(KILN_NOT_FOUND, "%s: no preset '%s'; the presets are mlp and lenet", call, name);
  }
  kiln_nn_model_t *model = NULL;
  kiln_status_t status = kiln_nn_model_create(&model);
  for (size_t i = 0; i < count && status == KILN_OK; i++) {
    kiln_nn_layer_t *layer = NULL;
    status = preset_layer(device, &layers[i], &layer);
    if (status == KILN_OK) status = kiln_nn_model_add(model, layer);
  }
  /* The seed-0 draws at creation are replaced: one seed for the whole model. */
  if (status == KILN_OK) status = kiln_nn_model_reset_parameters(model, seed);
  if (status != KILN_OK) {
    kiln_nn_model_free(model);
    return kiln_wrap_error(status, "%s(%s)", call, name);
  }
  *out_model = model;
  return KILN_OK;
}
