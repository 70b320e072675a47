/* nn/nn_internal.h: what libkiln-nn's files share and its tests and fuzz targets reach; never installed. */
#ifndef KILN_NN_INTERNAL_H
#define KILN_NN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/nn.h"

/* ---- dataset.c: IDX files ------------------------------------------------------
 * IDX: two zero bytes, a type byte (0x08: unsigned bytes, the only one read),
 * the number of dimensions, each dimension as a big-endian uint32, then the
 * values. Images have 3 dimensions [N, rows, cols], labels 1 [N]. */

typedef struct kiln_nn__idx_t {
  uint32_t ndim;
  uint32_t dims[3];
  uint8_t *data; /* malloc'ed, the product of dims bytes */
  size_t size;
} kiln_nn__idx_t;

/* Parse an uncompressed IDX file of `ndim` dimensions held in memory; `name`
 * and `hint` go into the message (hint: what to do; may be NULL). KILN_IO for
 * any fault of the bytes. On success the caller frees out->data. */
kiln_status_t kiln_nn__idx_parse_memory(const void *bytes, size_t size, uint32_t ndim, const char *name,
                                        const char *hint, kiln_nn__idx_t *out);

/* ---- loader.c: the shuffle ---------------------------------------------------------
 * SplitMix64 (Steele, Lea, Flood 2014): the generator behind every order. */
static inline uint64_t kiln_nn__splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

#endif /* KILN_NN_INTERNAL_H */
