/* nn/optim.c: optimizers (SGD with momentum, Adam): state on the parameters' device, one fused kiln update per parameter and step. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

typedef enum optimizer_kind_t { OPT_SGD, OPT_ADAM } optimizer_kind_t;

typedef struct slot_t {
  kiln_nn_param_t *param;
  kiln_tensor_t *a, *b; /* SGD: momentum buffer (NULL without momentum); Adam: m, v */
  int64_t step;         /* updates so far (SGD: the first one starts the momentum buffer) */
} slot_t;

struct kiln_nn_optimizer_t {
  optimizer_kind_t kind;
  kiln_sgd_params_t sgd;
  kiln_adam_params_t adam;
  slot_t *slots;
  size_t count;
  char text[160]; /* kiln_nn_optimizer_describe (room for every figure at its widest) */
};

/* The kernels compute in f32: a value must stay finite there, and one that
 * must be > 0 must not round to 0. */
static bool finite_at_least(double v, double low, bool open) {
  return isfinite(v) && fabs(v) <= FLT_MAX && (open ? v > low && (float)v > 0 : v >= low);
}

#define KILN_NN_F32_RANGE "representable as a finite f32 (at most 3.4e+38)"

static kiln_status_t check_sgd(const kiln_sgd_params_t *o) {
  static const char call[] = "kiln_nn_sgd_create";
  if (!finite_at_least(o->lr, 0, true)) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: lr %g; it must be > 0 and " KILN_NN_F32_RANGE, call, o->lr);
  if (!finite_at_least(o->momentum, 0, false))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: momentum %g; it must be >= 0 and " KILN_NN_F32_RANGE, call, o->momentum);
  if (!(o->dampening >= 0 && o->dampening <= 1))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: dampening %g; it must lie in [0, 1]", call, o->dampening);
  if (!finite_at_least(o->weight_decay, 0, false))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: weight_decay %g; it must be >= 0 and " KILN_NN_F32_RANGE, call, o->weight_decay);
  if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: nesterov needs momentum > 0 and dampening 0 (momentum %g, dampening %g)",
                          call, o->momentum, o->dampening);
  return KILN_OK;
}

static kiln_status_t check_adam(const kiln_adam_params_t *o) {
  static const char call[] = "kiln_nn_adam_create";
  if (!finite_at_least(o->lr, 0, true)) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: lr %g; it must be > 0 and " KILN_NN_F32_RANGE, call, o->lr);
  if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: betas (%g, %g); each must lie in [0, 1)", call, o->beta1, o->beta2);
  if (!finite_at_least(o->eps, 0, true)) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: eps %g; it must be > 0 and " KILN_NN_F32_RANGE, call, o->eps);
  if (!finite_at_least(o->weight_decay, 0, false))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: weight_decay %g; it must be >= 0 and " KILN_NN_F32_RANGE, call, o->weight_decay);
  return KILN_OK;
}

/* "SGD(lr 0.1, momentum 0.9)", "Adam(lr 0.001, betas 0.9 0.999, eps 1e-08)". */
static void describe(kiln_nn_optimizer_t *opt) {
  char *t = opt->text;
  const size_t size = sizeof opt->text;
  int n;
  double weight_decay;
  if (opt->kind == OPT_SGD) {
    const kiln_sgd_params_t *o = &opt->sgd;
    n = snprintf(t, size, "SGD(lr %g", o->lr);
    if (o->momentum > 0)
      n += snprintf(t + n, size - (size_t)n, ", momentum %g%s", o->momentum, o->nesterov ? ", nesterov" : "");
    weight_decay = o->weight_decay;
  } else {
    const kiln_adam_params_t *o = &opt->adam;
    n = snprintf(t, size, "Adam(lr %g, betas %g %g, eps %g", o->lr, o->beta1, o->beta2, o->eps);
    weight_decay = o->weight_decay;
  }
  if (weight_decay > 0) n += snprintf(t + n, size - (size_t)n, ", weight decay %g", weight_decay);
  snprintf(t + n, size - (size_t)n, ")");
}

static kiln_status_t zeros_like(const kiln_tensor_t *t, kiln_tensor_t **out) {
  kiln_status_t status = kiln_tensor_zeros(kiln_tensor_device(t), KILN_F32, kiln_tensor_ndim(t), kiln_tensor_shape(t), out);
  return status;
}

static kiln_status_t create(optimizer_kind_t kind, kiln_nn_param_t *const *params, size_t count, const char *call,
                            kiln_nn_optimizer_t **out) {
  if ((!params && count) || !out)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !out ? "out_optimizer" : "params");
  for (size_t i = 0; i < count; i++)
    if (!params[i]) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: params[%zu] is NULL", call, i);
  kiln_nn_optimizer_t *opt = calloc(1, sizeof *opt);
  slot_t *slots = calloc(count ? count : 1, sizeof *slots);
  if (!opt || !slots) {
    free(opt);
    free(slots);
    return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate an optimizer for %zu parameters", call, count);
  }
  opt->kind = kind;
  opt->slots = slots;
  opt->count = count;
  for (size_t i = 0; i < count; i++) slots[i].param = params[i];
  *out = opt;
  return KILN_OK;
}

/* The state tensors, allocated now so that every step allocates nothing. */
static kiln_status_t allocate_state(kiln_nn_optimizer_t *opt, int per_param, const char *call) {
  for (size_t i = 0; i < opt->count; i++) {
    kiln_tensor_t *value = opt->slots[i].param->value;
    kiln_status_t status = per_param > 0 ? zeros_like(value, &opt->slots[i].a) : KILN_OK;
    if (status == KILN_OK && per_param > 1) status = zeros_like(value, &opt->slots[i].b);
    if (status != KILN_OK) return kiln_wrap_error(status, "%s: the state of '%s'", call, opt->slots[i].param->name);
  }
  return KILN_OK;
}

kiln_status_t kiln_nn_sgd_create(kiln_nn_param_t *const *params, size_t count, const kiln_sgd_params_t *options,
                                 kiln_nn_optimizer_t **out_optimizer) {
  static const char call[] = "kiln_nn_sgd_create";
  if (!options) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: options is NULL", call);
  kiln_status_t status = check_sgd(options);
  kiln_nn_optimizer_t *opt = NULL;
  if (status == KILN_OK) status = create(OPT_SGD, params, count, call, &opt);
  if (status != KILN_OK) return status;
  opt->sgd = *options;
  status = allocate_state(opt, options->momentum > 0 ? 1 : 0, call);
  if (status != KILN_OK) {
    kiln_nn_optimizer_free(opt);
    return status;
  }
  describe(opt);
  *out_optimizer = opt;
  return KILN_OK;
}

kiln_status_t kiln_nn_adam_create(kiln_nn_param_t *const *params, size_t count, const kiln_adam_params_t *options,
                                  kiln_nn_optimizer_t **out_optimizer) {
  static const char call[] = "kiln_nn_adam_create";
  if (!options) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: options is NULL", call);
  kiln_status_t status = check_adam(options);
  kiln_nn_optimizer_t *opt = NULL;
  if (status == KILN_OK) status = create(OPT_ADAM, params, count, call, &opt);
  if (status != KILN_OK) return status;
  opt->adam = *options;
  status = allocate_state(opt, 2, call);
  if (status != KILN_OK) {
    kiln_nn_optimizer_free(opt);
    return status;
  }
  describe(opt);
  *out_optimizer = opt;
  return KILN_OK;
}

kiln_status_t kiln_nn_optimizer_create_preset(const char *name, kiln_nn_model_t *model,
                                              kiln_nn_optimizer_t **out_optimizer) {
  static const char call[] = "kiln_nn_optimizer_create_preset";
  if (!name || !model)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !name ? "name" : "model");
  size_t count = 0;
  kiln_nn_param_t *const *params = kiln_nn_model_params(model, &count);
  if (!strcmp(name, "mlp")) {
    const kiln_sgd_params_t sgd = {.lr = 0.05, .momentum = 0.9};
    return kiln_nn_sgd_create(params, count, &sgd, out_optimizer);
  }
  if (!strcmp(name, "lenet")) {
    const kiln_adam_params_t adam = {.lr = 0.002, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    return kiln_nn_adam_create(params, count, &adam, out_optimizer);
  }
  return kiln_set_error(KILN_NOT_FOUND, "%s: no preset '%s'; the presets are mlp and lenet", call, name);
}

void kiln_nn_optimizer_free(kiln_nn_optimizer_t *optimizer) {
  if (!optimizer) return;
  for (size_t i = 0; i < optimizer->count; i++) {
    kiln_tensor_release(optimizer->slots[i].a);
    kiln_tensor_release(optimizer->slots[i].b);
  }
  free(optimizer->slots);
  free(optimizer);
}

kiln_status_t kiln_nn_optimizer_step(kiln_nn_optimizer_t *optimizer) {
  if (!optimizer) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_optimizer_step: optimizer is NULL");
  for (size_t i = 0; i < optimizer->count; i++) {
    slot_t *s = &optimizer->slots[i];
    kiln_nn_param_t *p = s->param;
    if (!p->grad) continue;
    kiln_status_t status = KILN_OK;
    /* A low-precision step: the update reads the 16-bit gradient as it is
     * and rounds the new f32 master value into the parameter's 16-bit copy
     * in the same pass (the master value and the state stay f32), so the
     * next forward casts nothing. */
    kiln_tensor_t *copy = p->low && kiln_tensor_dtype(p->low) != KILN_F32 ? p->low : NULL;
    p->low_current = false;
    if (optimizer->kind == OPT_SGD) {
      /* torch.optim.SGD starts a momentum buffer as the gradient itself,
       * whatever the dampening. */
      kiln_sgd_params_t sgd = optimizer->sgd;
      sgd.first_step = s->step == 0;
      status = kiln_tensor_sgd_update_mixed(p->value, p->grad, s->a, copy, &sgd);
    } else {
      status = kiln_tensor_adam_update_mixed(p->value, p->grad, s->a, s->b, copy, s->step + 1, &optimizer->adam);
    }
    if (status == KILN_OK) {
      s->step++;
      p->low_current = copy != NULL;
    }
    if (status != KILN_OK)
      return kiln_wrap_error(status, "kiln_nn_optimizer_step: %s of '%s'", optimizer->text, p->name);
  }
  return KILN_OK;
}

void kiln_nn_optimizer_zero_grad(kiln_nn_optimizer_t *optimizer) {
  if (!optimizer) return;
  for (size_t i = 0; i < optimizer->count; i++) kiln_nn_param_zero_grad(optimizer->slots[i].param);
}

double kiln_nn_optimizer_lr(const kiln_nn_optimizer_t *optimizer) {
  if (!optimizer) return 0;
  return optimizer->kind == OPT_SGD ? optimizer->sgd.lr : optimizer->adam.lr;
}

double kiln_nn_lr_cosine(double base_lr, uint64_t epoch, uint64_t epochs) {
  const double pi = 3.14159265358979323846;
  if (epochs == 0) return base_lr;
  return base_lr * 0.5 * (1.0 + cos(pi * (double)epoch / (double)epochs));
}

const char *kiln_nn_optimizer_describe(const kiln_nn_optimizer_t *optimizer) { return optimizer ? optimizer->text : ""; }

kiln_status_t kiln_nn_optimizer_set_lr(kiln_nn_optimizer_t *optimizer, double lr) {
  if (!optimizer) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_optimizer_set_lr: optimizer is NULL");
  if (!finite_at_least(lr, 0, true))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_optimizer_set_lr: lr %g; it must be > 0 and " KILN_NN_F32_RANGE, lr);
  optimizer->sgd.lr = lr;
  optimizer->adam.lr = lr;
  describe(optimizer);
  return KILN_OK;
}

size_t kiln_nn__optimizer_params(const kiln_nn_optimizer_t *optimizer, kiln_nn_param_t **out, size_t capacity) {
  size_t n = 0;
  for (size_t i = 0; optimizer && i < optimizer->count; i++)
    if (n < capacity) out[n++] = optimizer->slots[i].param;
  return optimizer ? optimizer->count : 0;
}
