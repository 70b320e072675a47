/* nn/fuzz/fuzz_safetensors.c: libFuzzer target: any bytes through kiln_nn_safetensors_load_memory onto cpu:0. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/nn.h"

static kiln_device_t *cpu;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  /* The CPU backend alone: plugins would only slow each run. */
  setenv("KILN_BACKEND", "cpu", 1);
  if (kiln_device_find("cpu", &cpu) != KILN_OK) {
    fprintf(stderr, "fuzz_safetensors: %s\n", kiln_last_error());
    abort();
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kiln_nn_safetensors_t *file = NULL;
  if (kiln_nn_safetensors_load_memory(data, size, cpu, &file) == KILN_OK) {
    /* Whatever loaded must be whole: every tensor there and readable. */
    for (size_t i = 0; i < kiln_nn_safetensors_count(file); i++) {
      kiln_tensor_t *t = kiln_nn_safetensors_tensor(file, i);
      if (!t || !kiln_nn_safetensors_name(file, i)) abort();
      if (kiln_tensor_numel(t) == 1) {
        double v;
        if (kiln_tensor_item(t, &v) != KILN_OK) abort();
      }
    }
    kiln_nn_safetensors_free(file);
  }
  return 0;
}
