/* tests/nn/write_sample.c: writes the safetensors file check_kiln_file.py reads with Python, NumPy, PyTorch and the reference library. */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/nn.h"

/* The values are formulas the script recomputes: value i of a tensor is
 * start + step * i (f32) or i - 5 (i32). */
int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: write_sample OUT.safetensors\n");
    return 2;
  }
  kiln_device_t *cpu = NULL;
  if (kiln_device_find("cpu", &cpu) != KILN_OK) goto fail;
  int64_t s[3][4] = {{2, 3}, {4}, {2, 1, 2, 2}};
  int ndim[3] = {2, 1, 4};
  float start[3] = {-1.5f, 0.25f, 100.0f}, step[3] = {0.5f, -2.0f, 0.125f};
  const char *names[4] = {"layer.weight", "layer.bias", "conv.weight", "labels"};
  kiln_nn_named_tensor_t tensors[4];
  for (int k = 0; k < 3; k++) {
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = start[k] + step[k] * (float)i;
    tensors[k].name = names[k];
    if (kiln_tensor_from_host(cpu, KILN_F32, ndim[k], s[k], v, &tensors[k].tensor) != KILN_OK) goto fail;
  }
  int32_t ids[7];
  for (int i = 0; i < 7; i++) ids[i] = i - 5;
  int64_t s7 = 7;
  tensors[3].name = names[3];
  if (kiln_tensor_from_host(cpu, KILN_I32, 1, &s7, ids, &tensors[3].tensor) != KILN_OK) goto fail;
  kiln_nn_metadata_t meta[1] = {{"format", "pt"}};
  if (kiln_nn_safetensors_save(argv[1], tensors, 4, meta, 1) != KILN_OK) goto fail;
  for (int k = 0; k < 4; k++) kiln_tensor_release(tensors[k].tensor);
  kiln_deinitialize();
  return 0;
fail:
  fprintf(stderr, "write_sample: %s\n", kiln_last_error());
  return 1;
}
