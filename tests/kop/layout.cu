// tests/kop/layout.cu: kernels/kop.h's layout as nvcc places it, read back from the PTX by test_kop_layout.
#include <cstddef>

#include "kernels/kop.h"

// sizeof(kiln_kop_t), then the offset of each KILN_KOP_LAYOUT member, as a
// device global the PTX spells out in its initializer.
#define KILN_KOP_OFFSET_(m) (unsigned long long)offsetof(kiln_kop_t, m),
extern "C" __device__ unsigned long long kiln_kop_layout[] = {
    (unsigned long long)sizeof(kiln_kop_t), KILN_KOP_LAYOUT(KILN_KOP_OFFSET_)};
