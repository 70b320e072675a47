/* tests/cuda/emulator/selftest_args.h: the argument struct of the test driver's own test kernels (selftest.cu), shared with test_fakecuda.c. */
#ifndef KILN_FAKECUDA_SELFTEST_ARGS_H
#define KILN_FAKECUDA_SELFTEST_ARGS_H

#include <stdint.h>

/* Device pointers as uint64_t, as in kernels/cuda/kernels/kop.h. */
typedef struct fakecuda_test_args_t {
  uint64_t in, out, flag;
  int32_t n, pad_;
} fakecuda_test_args_t;

/* Values fakecuda_test_warp writes per lane, in this order. */
#define FAKECUDA_TEST_WARP_VALUES 9

#endif /* KILN_FAKECUDA_SELFTEST_ARGS_H */
