/* examples/kiln_train.c: kiln-train: train an MLP or a LeNet-shaped CNN on Fashion-MNIST on the default device (or KILN_DEVICE), with libkiln-nn. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kiln/nn.h>

typedef struct train_args_t {
  const char *model;
  const char *device;
  const char *save;
  const char *save_init;
  const char *trace; /* --trace FILE: Trace Event Format JSON of the training */
  const char *precision; /* --precision f32|bf16|f16 */
  long epochs;
  long batch;
  long limit;     /* training images used; 0: all */
  long losses;    /* print the first N step losses of epoch 1 */
  unsigned long long seed;
  double lr;      /* 0: the preset's */
  int progress;   /* -1 auto (a terminal), 0 off, 1 on */
} train_args_t;

static void usage(FILE *f) {
  fputs("usage: kiln-train [--model mlp|lenet] [--epochs N] [--batch B] [--seed S] [--lr X]\n"
        "                  [--device SELECTOR] [--limit N] [--losses N] [--save FILE] [--save-init FILE]\n"
        "                  [--trace FILE] [--precision f32|bf16|f16] [--progress|--no-progress]\n"
        "\n"
        "Trains on Fashion-MNIST (Debian's dataset-fashion-mnist, or $KILN_DATA_DIR/fashion-mnist) on the\n"
        "default device (KILN_DEVICE chooses it; --device overrides), and prints per epoch the mean loss,\n"
        "the training and test accuracy, the seconds and images per second, and which provider ran each\n"
        "operation. A progress bar goes to stderr when it is a terminal.\n"
        "\n"
        "  --model M      mlp: 784-1000-10, ReLU, SGD lr 0.05 momentum 0.9 (default); lenet: two\n"
        "                 conv+pool stages and three linear layers, Adam lr 0.002; the rate is annealed\n"
        "                 once per epoch by a cosine over the run\n"
        "  --epochs N     passes over the training set (default 10)\n"
        "  --batch B      images per step (default 100)\n"
        "  --seed S       initialisation and shuffle (default 42): the same seed gives the same network\n"
        "                 and the same first losses on every device\n"
        "  --lr X         learning rate instead of the preset's\n"
        "  --device SEL   a selector such as cpu:0 or opencl:0 (see devinfo)\n"
        "  --limit N      train on the first N images only\n"
        "  --losses N     print the first N step losses of the first epoch (to compare devices)\n"
        "  --save FILE    write the trained parameters as safetensors (PyTorch's Sequential names)\n"
        "  --save-init FILE  the same for the parameters before training\n"
        "  --precision P  f32 (default); bf16 or f16: mixed precision, with the forward and backward\n"
        "                 (activations, matmul, conv) in P, the loss in f32, and f32 master weights and\n"
        "                 optimizer state (checkpoints hold them); f16 scales the loss dynamically\n"
        "                 (PyTorch's GradScaler: from 2^16, a step with an inf/NaN gradient skipped and\n"
        "                 the scale halved, doubled after 2000 clean steps) and reports the steps skipped\n"
        "  --trace FILE   record every op, copy and allocation of the training and evaluation as Trace\n"
        "                 Event Format JSON (open it in ui.perfetto.dev or chrome://tracing), and print\n"
        "                 where the time went at the end (docs/trace.md)\n"
        "\n"
        "Ctrl-C (SIGINT) stops after the step under way, saves --save FILE and exits with status 130; a\n"
        "second Ctrl-C exits at once. A loss that becomes NaN or infinite stops the run with an error\n"
        "naming the step (lower --lr), and nothing is saved.\n",
        f);
}

/* Whole numbers: digits only (no sign, no space, nothing after), in range. */
static int parse_long(const char *flag, const char *text, long min, long *out) {
  char *end;
  errno = 0;
  long v = *text >= '0' && *text <= '9' ? strtol(text, &end, 10) : -1;
  if (v < 0 || errno || *end || v < min) {
    fprintf(stderr, "kiln-train: %s takes a whole number >= %ld (at most %ld), not '%s'\n", flag, min, LONG_MAX, text);
    return -1;
  }
  *out = v;
  return 0;
}

/* A seed: decimal, or hexadecimal after 0x; all of 64 bits, nothing more. */
static int parse_seed(const char *text, unsigned long long *out) {
  bool hex = text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  const char *digits = hex ? text + 2 : text;
  bool ok = hex ? isxdigit((unsigned char)*digits) : *digits >= '0' && *digits <= '9';
  char *end = NULL;
  errno = 0;
  unsigned long long v = ok ? strtoull(digits, &end, hex ? 16 : 10) : 0;
  if (!ok || errno || *end) {
    fprintf(stderr, "kiln-train: --seed takes a whole number in [0, 2^64) (decimal, or hexadecimal after 0x), not '%s'\n",
            text);
    return -1;
  }
  *out = v;
  return 0;
}

/* A rate: a finite decimal number > 0, nothing after it. */
static int parse_rate(const char *text, double *out) {
  char *end = NULL;
  errno = 0;
  bool ok = (*text >= '0' && *text <= '9') || *text == '.';
  double v = ok ? strtod(text, &end) : 0;
  if (!ok || errno || *end || !isfinite(v) || !(v > 0)) {
    fprintf(stderr, "kiln-train: --lr takes a finite number > 0, not '%s'\n", text);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, train_args_t *a) {
  *a = (train_args_t){"mlp", NULL, NULL, NULL, NULL, "f32", 10, 100, 0, 0, 42, 0, -1};
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(s, "--progress") || !strcmp(s, "--no-progress")) {
      a->progress = !strcmp(s, "--progress");
      continue; /* a flag: no value follows */
    } else if (!v) {
      fprintf(stderr, "kiln-train: unknown or incomplete argument '%s'\n\n", s);
      usage(stderr);
      return -1;
    } else if (!strcmp(s, "--model")) {
      a->model = v;
    } else if (!strcmp(s, "--device")) {
      a->device = v;
    } else if (!strcmp(s, "--save")) {
      a->save = v;
    } else if (!strcmp(s, "--save-init")) {
      a->save_init = v;
    } else if (!strcmp(s, "--trace")) {
      a->trace = v;
    } else if (!strcmp(s, "--precision")) {
      if (strcmp(v, "f32") && strcmp(v, "bf16") && strcmp(v, "f16")) {
        fprintf(stderr, "kiln-train: --precision takes f32, bf16 or f16, not '%s'\n", v);
        return -1;
      }
      a->precision = v;
    } else if (!strcmp(s, "--epochs")) {
      if (parse_long(s, v, 1, &a->epochs)) return -1;
    } else if (!strcmp(s, "--batch")) {
      if (parse_long(s, v, 1, &a->batch)) return -1;
    } else if (!strcmp(s, "--limit")) {
      if (parse_long(s, v, 1, &a->limit)) return -1;
    } else if (!strcmp(s, "--losses")) {
      if (parse_long(s, v, 1, &a->losses)) return -1;
    } else if (!strcmp(s, "--seed")) {
      if (parse_seed(v, &a->seed)) return -1;
    } else if (!strcmp(s, "--lr")) {
      if (parse_rate(v, &a->lr)) return -1;
    } else {
      fprintf(stderr, "kiln-train: unknown argument '%s'\n\n", s);
      usage(stderr);
      return -1;
    }
    i++;
  }
  if (strcmp(a->model, "mlp") && strcmp(a->model, "lenet")) {
    fprintf(stderr, "kiln-train: --model is mlp or lenet, not '%s'\n", a->model);
    return -1;
  }
  return 0;
}

/* The folder a file will be written in must exist and take new files: found
 * out before training, not after every epoch. */
static int check_writable(const char *flag, const char *path) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    fprintf(stderr, "kiln-train: %s %s: it is a folder; name a file in it\n", flag, path);
    return -1;
  }
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  int found = stat(dir, &st);
  if (found != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "kiln-train: %s %s: the folder %s %s\n", flag, path, dir,
            found == 0 ? "is not a folder" : errno == ENOENT ? "does not exist; create it first" : strerror(errno));
    return -1;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    fprintf(stderr, "kiln-train: %s %s: cannot write in the folder %s: %s\n", flag, path, dir, strerror(errno));
    return -1;
  }
  return 0;
}

/* SIGINT: the first asks training to stop after the step under way (the
 * parameters are then saved); a second ends the process at once. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
  (void)sig;
  if (interrupted) _exit(130);
  interrupted = 1;
}

static int fail(const char *what) {
  fprintf(stderr, "kiln-train: %s: %s\n", what, kiln_last_error());
  return 1;
}

/* "[#########.........] 300/600  loss 0.5123  acc 0.812  41,200 img/s" on one line of stderr. */
static void progress_bar(const kiln_nn_progress_t *p, void *user) {
  (void)user;
  const int width = 30;
  int done = p->steps ? (int)((double)p->step / (double)p->steps * width) : width;
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
  bar[width] = '\0';
  double rate = p->seconds > 0 ? (double)p->images / p->seconds : 0;
  fprintf(stderr, "\r  epoch %llu [%s] %zu/%zu  loss %.4f  acc %.3f  %.0f img/s ", (unsigned long long)p->epoch + 1,
          bar, p->step, p->steps, p->loss, p->accuracy, rate);
  fflush(stderr);
}

/* "matmul=blas add=native ..." from the counts the core kept on this thread. */
static void print_providers(void) {
  kiln_provider_use_t uses[64];
  size_t n = kiln_provider_uses(uses, 64);
  if (n > 64) n = 64;
  fputs("  providers:", stdout);
  for (size_t i = 0; i < n; i++) {
    /* One op under several providers (the fastest policy per shape) shows each. */
    printf(" %s=%s", uses[i].op, uses[i].provider[0] ? uses[i].provider : "?");
  }
  fputc('\n', stdout);
}

/* The first `limit` images of a data set, as a new one. */
static kiln_status_t subset(const kiln_nn_dataset_t *ds, size_t limit, kiln_nn_dataset_t **out) {
  kiln_nn_dataset_info_t info;
  kiln_status_t status = kiln_nn_dataset_info(ds, &info);
  if (status != KILN_OK) return status;
  if (limit > info.count) limit = info.count;
  return kiln_nn_dataset_create(limit, info.rows, info.cols, info.classes, kiln_nn_dataset_pixels(ds),
                                kiln_nn_dataset_labels(ds), out);
}

int main(int argc, char **argv) {
  train_args_t a;
  if (parse_args(argc, argv, &a) != 0) return 2;
  if ((a.save && check_writable("--save", a.save)) || (a.save_init && check_writable("--save-init", a.save_init)))
    return 2;
  bool bar = a.progress < 0 ? isatty(STDERR_FILENO) : a.progress == 1;

  kiln_device_t *device = NULL;
  if ((a.device ? kiln_device_find(a.device, &device) : kiln_device_default(&device)) != KILN_OK)
    return fail("choosing the device");
  kiln_nn_dataset_t *train = NULL, *test = NULL;
  if (kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TRAIN, &train) != KILN_OK) return fail("loading the training set");
  if (kiln_nn_dataset_load_fashion_mnist(NULL, KILN_NN_TEST, &test) != KILN_OK) return fail("loading the test set");
  if (a.limit) {
    kiln_nn_dataset_t *part = NULL;
    if (subset(train, (size_t)a.limit, &part) != KILN_OK) return fail("taking a subset");
    kiln_nn_dataset_free(train);
    train = part;
  }

  kiln_nn_model_t *model = NULL;
  kiln_nn_optimizer_t *opt = NULL;
  if (kiln_nn_model_create_preset(a.model, device, a.seed, &model) != KILN_OK) return fail("creating the model");
  if (kiln_nn_optimizer_create_preset(a.model, model, &opt) != KILN_OK) return fail("creating the optimizer");
  if (a.lr > 0 && kiln_nn_optimizer_set_lr(opt, a.lr) != KILN_OK) return fail("--lr");
  const kiln_dtype_t precision = !strcmp(a.precision, "bf16") ? KILN_BF16 : !strcmp(a.precision, "f16") ? KILN_F16 : KILN_F32;
  if (kiln_nn_model_set_precision(model, precision) != KILN_OK) return fail("--precision");
  /* f16's range is narrow: its gradients need the loss scaled; bf16's is f32's. */
  kiln_nn_grad_scaler_t *scaler = NULL;
  if (precision == KILN_F16 && kiln_nn_grad_scaler_create(NULL, &scaler) != KILN_OK) return fail("creating the loss scaler");
  if (a.save_init && kiln_nn_model_save(model, a.save_init) != KILN_OK) return fail("--save-init");

  kiln_nn_loader_options_t lo;
  kiln_nn_loader_options_initialize(&lo);
  lo.batch_size = (size_t)a.batch;
  lo.seed = a.seed;
  kiln_nn_loader_t *train_loader = NULL, *test_loader = NULL;
  if (kiln_nn_loader_create(train, device, &lo, &train_loader) != KILN_OK) return fail("creating the training loader");
  lo.shuffle = false;
  lo.batch_size = 1000;
  if (kiln_nn_loader_create(test, device, &lo, &test_loader) != KILN_OK) return fail("creating the test loader");

  kiln_nn_dataset_info_t info;
  kiln_nn_dataset_info(train, &info);
  float *losses = NULL;
  int rc = 0;
  size_t epoch_steps = kiln_nn_loader_batch_count(train_loader);
  if ((unsigned long)a.losses > epoch_steps) {
    fprintf(stderr, "kiln-train: --losses %ld is more than the %zu steps of an epoch (%zu images in batches of %ld)\n",
            a.losses, epoch_steps, info.count, a.batch);
    rc = 2;
    goto done;
  }
  size_t nparams = 0;
  kiln_nn_param_t *const *params = kiln_nn_model_params(model, &nparams);
  long long weights = 0;
  for (size_t i = 0; i < nparams; i++) weights += kiln_tensor_numel(kiln_nn_param_value(params[i]));
  printf("kiln-train: %s on %s, policy %s\n", a.model, kiln_device_name(device), kiln_policy_name(kiln_policy()));
  printf("  model:");
  for (size_t i = 0; i < kiln_nn_model_layer_count(model); i++)
    printf("%s %s", i ? "," : "", kiln_nn_layer_describe(kiln_nn_model_layer(model, i)));
  printf(" (%lld parameters)\n  %s, batch %ld, %zu training images, seed %llu, precision %s%s\n", weights,
         kiln_nn_optimizer_describe(opt), a.batch, info.count, a.seed, a.precision,
         scaler ? " (loss scale 65536, dynamic)" : precision != KILN_F32 ? " (no loss scaling)" : "");
  fflush(stdout);

  losses = a.losses ? calloc((size_t)a.losses, sizeof(float)) : NULL;
  const double base_lr = kiln_nn_optimizer_lr(opt);
  size_t trained = 0; /* steps over all epochs */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  if (a.trace && kiln_trace_start(a.trace) != KILN_OK) {
    rc = fail("--trace");
    goto done;
  }
  for (long epoch = 0; epoch < a.epochs && rc == 0 && !interrupted; epoch++) {
    /* The recipe anneals the rate once per epoch, as PyTorch's CosineAnnealingLR
     * (always > 0 before the last epoch ends). */
    if (kiln_nn_optimizer_set_lr(opt, kiln_nn_lr_cosine(base_lr, (uint64_t)epoch, (uint64_t)a.epochs)) != KILN_OK) {
      rc = fail("setting the learning rate");
      break;
    }
    kiln_provider_uses_reset();
    kiln_nn_train_options_t to;
    kiln_nn_train_options_initialize(&to);
    to.stop = &interrupted;
    to.scaler = scaler;
    if (bar) {
      to.report_every = 20;
      to.progress = progress_bar;
    }
    if (epoch == 0 && losses) {
      to.step_losses = losses;
      to.step_loss_count = (size_t)a.losses;
    }
    kiln_nn_epoch_stats_t st;
    double test_loss = 0, test_acc = 0;
    if (kiln_nn_train_epoch(model, opt, train_loader, &to, &st) != KILN_OK) {
      rc = fail("training");
      break;
    }
    if (bar) fputs("\r\033[K", stderr);
    trained += st.steps;
    if (interrupted) {
      printf("interrupted in epoch %ld/%ld after %zu of its steps\n", epoch + 1, a.epochs, st.steps);
      rc = 130;
      break;
    }
    if (kiln_nn_evaluate(model, test_loader, &test_loss, &test_acc) != KILN_OK) {
      rc = fail("evaluating");
      break;
    }
    printf("epoch %ld/%ld  loss %.4f  train %.4f  test %.4f  %.2f s  %.0f images/s", epoch + 1, a.epochs, st.loss,
           st.accuracy, test_acc, st.seconds, st.images_per_s);
    if (scaler) printf("  skipped %zu  scale %g", st.skipped, kiln_nn_grad_scaler_scale(scaler));
    fputc('\n', stdout);
    print_providers();
    if (epoch == 0 && losses) {
      printf("  first %ld losses:", a.losses);
      for (long i = 0; i < a.losses && (size_t)i < st.steps; i++) printf(" %.9g", (double)losses[i]);
      fputc('\n', stdout);
    }
    fflush(stdout);
  }
  if (interrupted) rc = 130;
  if (rc == 0) {
    kiln_nn_grad_scaler_state_t ss = {0};
    if (scaler) kiln_nn_grad_scaler_state(scaler, &ss);
    printf("precision %s: %llu of %zu steps skipped by the loss scaler%s", a.precision, (unsigned long long)ss.skipped,
           trained, scaler ? "" : " (none: no scaler)");
    if (scaler) printf(", final scale %g", ss.scale);
    fputc('\n', stdout);
  }
  if (a.trace && kiln_trace_active()) {
    size_t length = 0;
    char *text = NULL;
    if (kiln_trace_stop() != KILN_OK) {
      rc = fail("writing the trace");
    } else if (kiln_trace_summary(NULL, 0, &length) == KILN_OK && (text = malloc(length + 1)) &&
               kiln_trace_summary(text, length + 1, &length) == KILN_OK) {
      printf("trace written to %s\n%s", a.trace, text);
    }
    free(text);
  }
  /* Interrupted: what was trained is saved (atomically, as always), unless
   * nothing was; the status is the shell's for SIGINT. */
  if (a.save && (rc == 0 || (rc == 130 && trained > 0))) {
    if (kiln_nn_model_save(model, a.save) != KILN_OK) rc = fail("saving");
    else printf("saved %s\n", a.save);
  }
done:
  free(losses);
  kiln_nn_loader_free(train_loader);
  kiln_nn_loader_free(test_loader);
  kiln_nn_grad_scaler_free(scaler);
  kiln_nn_optimizer_free(opt);
  kiln_nn_model_free(model);
  kiln_nn_dataset_free(train);
  kiln_nn_dataset_free(test);
  kiln_deinitialize();
  return rc;
}
