/* tests/cuda/emulator/kernels.cpp: kiln's CUDA kernels (kernels/cuda/kiln.cu, unchanged) and the test driver's own test kernels built for the host under the shim, and the launch table that resolves kernel names. */
#include "cuda_shim.h"

#include "kiln.cu"

/* The test driver's own test kernels (test_fakecuda.c launches them). */
#include "selftest.cu"

/* FAKECUDA_KERNEL_LIST: every entry point of both as nvcc and ptxas see
 * them (gen_kernel_table.py), sorted by name. */
#include "fakecuda_kernels.inc"

#include <cstddef>
#include <tuple>
#include <utility>

namespace {

/* What the host build knows of a kernel from its type alone: its parameters'
 * sizes and alignments, and how to call it with cuLaunchKernel's
 * kernelParams (one pointer per parameter, to a copy of its value). */
template <typename F> struct kernel_sig;
template <typename... A> struct kernel_sig<void(A...)> {
  static constexpr unsigned count = sizeof...(A);
  template <unsigned I> using arg = typename std::decay<typename std::tuple_element<I, std::tuple<A...>>::type>::type;
  /* One extra element so that a kernel without parameters has an array too. */
  static constexpr unsigned sizes[] = {static_cast<unsigned>(sizeof(typename std::decay<A>::type))..., 0u};
  static constexpr unsigned aligns[] = {static_cast<unsigned>(alignof(typename std::decay<A>::type))..., 0u};

  template <void (*K)(A...), std::size_t... I> static void call(void *const *params, std::index_sequence<I...>) {
    K(*static_cast<const typename std::decay<A>::type *>(params[I])...);
  }
  template <void (*K)(A...)> static void invoke(void *const *params) {
    call<K>(params, std::index_sequence_for<A...>{});
  }
};

/* The GPU's layout of every parameter (from the PTX) must be the host's: that
 * is what makes the plugin's argument structs, laid out by gcc, mean the same
 * to the kernels nvcc compiled. */
#define FAKECUDA_CHECK_KERNEL_(NAME, THREADS, SMEM, REGS, STACK, NPARAMS)                          \
  static_assert(kernel_sig<decltype(NAME)>::count == (NPARAMS),                                    \
                #NAME ": the host build and the PTX disagree on the number of parameters");
#define FAKECUDA_CHECK_PARAM_(NAME, INDEX, SIZE, ALIGN)                                            \
  static_assert(sizeof(kernel_sig<decltype(NAME)>::arg<INDEX>) == (SIZE),                           \
                #NAME ": parameter " #INDEX " has another size on the host than in the PTX");       \
  static_assert(alignof(kernel_sig<decltype(NAME)>::arg<INDEX>) == (ALIGN),                         \
                #NAME ": parameter " #INDEX " has another alignment on the host than in the PTX");
FAKECUDA_KERNEL_LIST(FAKECUDA_CHECK_KERNEL_, FAKECUDA_CHECK_PARAM_)

} // namespace

#define FAKECUDA_ROW_(NAME, THREADS, SMEM, REGS, STACK, NPARAMS)                                    \
  {#NAME,   &kernel_sig<decltype(NAME)>::invoke<NAME>, (NPARAMS), kernel_sig<decltype(NAME)>::sizes,      \
   kernel_sig<decltype(NAME)>::aligns, (THREADS), (SMEM), (REGS), (STACK)},
#define FAKECUDA_NO_PARAM_(NAME, INDEX, SIZE, ALIGN)

extern "C" const fakecuda_kernel_t fakecuda__kernels[] = {FAKECUDA_KERNEL_LIST(FAKECUDA_ROW_, FAKECUDA_NO_PARAM_)};
extern "C" const unsigned fakecuda__kernel_count = sizeof fakecuda__kernels / sizeof fakecuda__kernels[0];
