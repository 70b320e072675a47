/* nn/fuzz/fuzz_idx.c: libFuzzer target: any bytes through the IDX parser, as images and as labels. */
#include <stdint.h>
#include <stdlib.h>

#include "nn_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every accepted value is read, so a short buffer shows up under ASan. */
static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (uint32_t ndim = 1; ndim <= 3; ndim += 2) {
    kiln_nn__idx_t idx = {0};
    if (kiln_nn__idx_parse_memory(data, size, ndim, "fuzz", NULL, &idx) == KILN_OK) {
      /* Accepted: exactly header plus values, all of them readable. */
      if (size != 4 + 4 * (size_t)ndim + idx.size) abort();
      uint8_t sum = 0;
      for (size_t i = 0; i < idx.size; i++) sum += idx.data[i];
      sink = sum;
      free(idx.data);
    }
  }
  return 0;
}
