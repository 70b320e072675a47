/* nn/scaler.c: dynamic loss scaling for f16 training, with PyTorch's GradScaler semantics: scale the loss, unscale and check the gradients, skip a step that overflowed and halve the scale, double it after a run of clean steps. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

struct kiln_nn_grad_scaler_t {
  kiln_nn_grad_scaler_options_t o;
  double scale;
  uint64_t growth_tracker; /* clean steps since the scale last changed */
  uint64_t skipped;        /* steps skipped for a non-finite gradient */
  uint64_t steps;          /* steps taken (skipped ones included) */
};

void kiln_nn_grad_scaler_options_initialize(kiln_nn_grad_scaler_options_t *options) {
  if (!options) return;
  options->init_scale = 65536.0;
  options->growth_factor = 2.0;
  options->backoff_factor = 0.5;
  options->growth_interval = 2000;
}

static bool positive_f32(double v) { return isfinite(v) && v > 0 && v <= 3.4028234663852886e38; }

kiln_status_t kiln_nn_grad_scaler_create(const kiln_nn_grad_scaler_options_t *options,
                                         kiln_nn_grad_scaler_t **out_scaler) {
  static const char call[] = "kiln_nn_grad_scaler_create";
  if (!out_scaler) return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: out_scaler is NULL", call);
  kiln_nn_grad_scaler_options_t o;
  kiln_nn_grad_scaler_options_initialize(&o);
  if (options) o = *options;
  if (!positive_f32(o.init_scale))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: init_scale %g; it must be > 0 and a finite f32", call, o.init_scale);
  if (!(isfinite(o.growth_factor) && o.growth_factor > 1))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: growth_factor %g; it must be > 1 (PyTorch's default is 2)", call,
                          o.growth_factor);
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: backoff_factor %g; it must lie in (0, 1) (PyTorch's default is 0.5)",
                          call, o.backoff_factor);
  if (o.growth_interval < 1)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: growth_interval 0; it must be >= 1 (PyTorch's default is 2000)",
                          call);
  kiln_nn_grad_scaler_t *s = calloc(1, sizeof *s);
  if (!s) return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: cannot allocate a scaler", call);
  s->o = o;
  s->scale = o.init_scale;
  *out_scaler = s;
  return KILN_OK;
}

void kiln_nn_grad_scaler_free(kiln_nn_grad_scaler_t *scaler) { free(scaler); }

kiln_status_t kiln_nn_grad_scaler_state(const kiln_nn_grad_scaler_t *scaler, kiln_nn_grad_scaler_state_t *out_state) {
  if (!scaler || !out_state)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_grad_scaler_state: %s is NULL", !scaler ? "scaler" : "out_state");
  *out_state = (kiln_nn_grad_scaler_state_t){scaler->scale, scaler->growth_tracker, scaler->skipped, scaler->steps};
  return KILN_OK;
}

double kiln_nn_grad_scaler_scale(const kiln_nn_grad_scaler_t *scaler) { return scaler ? scaler->scale : 1.0; }

kiln_status_t kiln_nn_grad_scaler_set_scale(kiln_nn_grad_scaler_t *scaler, double scale) {
  if (!scaler) return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_grad_scaler_set_scale: scaler is NULL");
  if (!positive_f32(scale))
    return kiln_set_error(KILN_INVALID_ARGUMENT, "kiln_nn_grad_scaler_set_scale: scale %g; it must be > 0 and a finite f32",
                          scale);
  scaler->scale = scale;
  scaler->growth_tracker = 0;
  return KILN_OK;
}

kiln_status_t kiln_nn_grad_scaler_backward(const kiln_nn_grad_scaler_t *scaler, kiln_nn_tape_t *tape,
                                           kiln_tensor_t *loss) {
  static const char call[] = "kiln_nn_grad_scaler_backward";
  if (!scaler || !tape || !loss)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !scaler ? "scaler" : !tape ? "tape" : "loss");
  /* d(scale * loss) = scale: the seed of the pass, in the loss's dtype (f32),
   * so the scale multiplies every gradient before it rounds into 16 bits. */
  kiln_tensor_t *seed = NULL;
  kiln_status_t status = kiln_tensor_full(kiln_tensor_device(loss), kiln_tensor_dtype(loss), kiln_tensor_ndim(loss),
                                          kiln_tensor_shape(loss), scaler->scale, &seed);
  if (status == KILN_OK) status = kiln_nn_tape_backward(tape, loss, seed);
  kiln_tensor_release(seed);
  if (status != KILN_OK) return kiln_wrap_error(status, "%s (scale %g)", call, scaler->scale);
  return KILN_OK;
}

/* Every gradient into f32 times 1/scale, replacing the parameter's, and
 * `flag` set to 1 when any element is an infinity or a NaN: one pass per
 * tensor (kiln_tensor_unscale), as torch's
 * _amp_foreach_non_finite_check_and_unscale_. */
static kiln_status_t unscale_one(kiln_nn_param_t *p, double inv_scale, kiln_tensor_t *flag) {
  kiln_tensor_t *dense = NULL, *unscaled = NULL;
  kiln_status_t status = kiln_tensor_contiguous(p->grad, &dense);
  if (status == KILN_OK) status = kiln_tensor_unscale(dense, inv_scale, flag, &unscaled);
  if (status == KILN_OK) {
    kiln_tensor_release(p->grad);
    p->grad = unscaled;
    p->grad_exclusive = true;
    unscaled = NULL;
  }
  kiln_tensor_release(dense);
  if (status != KILN_OK) return kiln_wrap_error(status, "unscaling the gradient of '%s'", p->name);
  return KILN_OK;
}

kiln_status_t kiln_nn_grad_scaler_step(kiln_nn_grad_scaler_t *scaler, kiln_nn_optimizer_t *optimizer,
                                       bool *out_skipped) {
  static const char call[] = "kiln_nn_grad_scaler_step";
  if (!scaler || !optimizer)
    return kiln_set_error(KILN_INVALID_ARGUMENT, "%s: %s is NULL", call, !scaler ? "scaler" : "optimizer");
  size_t count = kiln_nn__optimizer_params(optimizer, NULL, 0);
  kiln_nn_param_t **params = count ? malloc(count * sizeof *params) : NULL;
  if (count && !params) return kiln_set_error(KILN_OUT_OF_MEMORY, "%s: cannot list %zu parameters", call, count);
  kiln_nn__optimizer_params(optimizer, params, count);
  kiln_status_t status = KILN_OK;
  kiln_tensor_t *flag = NULL;
  bool found_inf = false;
  for (size_t i = 0; i < count && status == KILN_OK; i++) {
    if (!params[i]->grad) continue;
    if (!flag) status = kiln_tensor_zeros(kiln_tensor_device(params[i]->grad), KILN_F32, 0, NULL, &flag);
    if (status == KILN_OK) status = unscale_one(params[i], 1.0 / scaler->scale, flag);
  }
  if (status == KILN_OK && flag) {
    /* The host decides whether to step: one read per step, as
     * GradScaler.step's found_inf check. */
    double v = 0;
    status = kiln_tensor_item(flag, &v);
    found_inf = status == KILN_OK && v != 0;
  }
  kiln_tensor_release(flag);
  free(params);
  if (status == KILN_OK && !found_inf) status = kiln_nn_optimizer_step(optimizer);
  if (status != KILN_OK) return kiln_wrap_error(status, "%s", call);
  /* GradScaler.update: back off and restart the count on an overflow, grow
   * after growth_interval clean steps in a row. */
  scaler->steps++;
  if (found_inf) {
    scaler->skipped++;
    scaler->scale *= scaler->o.backoff_factor;
    scaler->growth_tracker = 0;
  } else if (++scaler->growth_tracker >= scaler->o.growth_interval) {
    double grown = scaler->scale * scaler->o.growth_factor;
    /* torch keeps the old scale when the grown one is not finite in f32. */
    if (positive_f32(grown)) scaler->scale = grown;
    scaler->growth_tracker = 0;
  }
  if (out_skipped) *out_skipped = found_inf;
  return KILN_OK;
}
