/* tests/conformance/gaps.c: the cases each backend's vendor providers decline on purpose, and why. */
/*
 * IREE's CTS keeps a list of expected failures per backend; this is kiln's
 * list of declared declines. Conformance forces each provider of a device in
 * turn (kiln_set_providers) and reads which one ran (kiln_last_provider). A
 * provider whose supports() declines a case leaves it to `native`: the
 * comparison passes, but says nothing about the provider. So every decline
 * must be covered by a gap here, or the row's test fails, naming the device,
 * the provider, the row and the case.
 *
 * To add one: a row {backend, provider, row name (as the group files spell
 * it), label substring or NULL, predicate or NULL, reason}; a backend or
 * provider of NULL matches any (a decline the core itself makes). The label
 * substring and the predicate, where given, must both match; neither: every
 * case of the row. The reason says why, in the terms of the provider's
 * supports(). A gap covers at most: it does not require the decline (a gap
 * may depend on the machine, such as the CPU's vector ISA, or on a vendor
 * library the machine lacks). Where a decline is a bug, fix the provider
 * instead. The summary prints "declined (declared): N" per device.
 */
#include "harness.h"

/* matmul's inner dimension (A's columns, or its rows when transposed). */
static bool kt_matmul_k_is_0(const kt_case_t *c) {
  const kt_in_t *a = &c->in[0];
  return a->ndim >= 2 && a->shape[c->trans_a ? a->ndim - 2 : a->ndim - 1] == 0;
}

/* conv2d_backward_weight's cases kiln_cpu_conv2d_backward_weight_direct
 * takes (kernels/cpu/conv_backward.c), where the CPU has AVX2 or AVX-512:
 * unit column stride, S <= 64 (KILN_CPU_CONV_SIMD_MAX_S), K <= 32
 * (KILN_CONV_BWD_DIRECT_MAX_K), and some output. in[0] is x [N,C,H,W],
 * in[1] dy [N,K,P,Q]. */
static bool kt_conv_dw_direct(const kt_case_t *c) {
  const int64_t *dy = c->in[1].shape;
  return c->in[1].ndim == 4 && c->conv.stride[1] == 1 && c->shape[3] <= 64 && dy[1] <= 32 &&
         dy[0] * dy[2] * dy[3] > 0;
}

/* conv2d_backward_input with no output channel (w [0,C,R,S]): dx is zeros. */
static bool kt_conv_dx_k_is_0(const kt_case_t *c) { return c->in[1].ndim == 4 && c->in[1].shape[0] == 0; }

/* conv2d_backward_weight of no image (x [0,C,H,W]): dw is zeros. */
static bool kt_conv_dw_n_is_0(const kt_case_t *c) { return c->in[0].ndim == 4 && c->in[0].shape[0] == 0; }

/* A matmul of f16 or bf16 operands; of any dtype but f32. */
static bool kt_matmul_16bit(const kt_case_t *c) { return c->in[0].dtype == KILN_F16 || c->in[0].dtype == KILN_BF16; }
static bool kt_matmul_not_f32(const kt_case_t *c) { return c->in[0].dtype != KILN_F32; }

static const kt_gap_t kt_gaps[] = {
    /* runtime/ops.c, kiln_tensor_matmul: every backend, every provider */
    {NULL, NULL, "matmul", NULL, kt_matmul_k_is_0,
     "the sum of no products: the core writes zeros (a fill) for an inner dimension of 0 and calls no matmul "
     "provider (CLBlast would refuse it anyway)"},
    /* backends/cpu/ops.c, blas_supports */
    {"cpu", "blas", "conv2d", NULL, NULL,
     "where kiln's AVX-512 GEMM tile is the CPU's best (kiln_cpu_conv2d_native_preferred), native's forward is "
     "the faster on every shape, and blas declines so that the core runs native under every policy"},
    {"cpu", "blas", "conv2d_backward_weight", NULL, kt_conv_dw_direct,
     "the direct weight gradient (AVX2 or AVX-512, unit column stride, S <= 64, K <= 32) beats im2col + GEMM, "
     "and blas declines those shapes (kiln_cpu_conv2d_backward_weight_direct)"},
    /* backends/cpu/ops.c: blas has no 16-bit GEMM */
    {"cpu", "blas", "matmul", NULL, kt_matmul_16bit,
     "a CBLAS has no f16 or bf16 GEMM: blas declines them, and native widens them to f32, sums in f32 and rounds "
     "once"},
    /* backends/opencl/clblast.c, kiln_cl_clblast_supports */
    {"opencl", "clblast", "matmul", NULL, kt_matmul_not_f32,
     "kiln calls CLBlastSgemm only: f64, f16 and bf16 run native's gemm_dtypes.cl (CLBlast's Hgemm would sum in "
     "half and needs cl_khr_fp16, which PoCL lacks; its Dgemm is not wired yet)"},
    /* backends/cuda/cudnn.c, kiln_cuda_cudnn_supports: empty dimensions are native's (cuDNN refuses them) */
    {"cuda", "cudnn", "conv2d_backward_input", NULL, kt_conv_dx_k_is_0,
     "cuDNN takes no empty dimension; dx of a convolution with no output channel (K = 0) is zeros, native's"},
    {"cuda", "cudnn", "conv2d_backward_weight", NULL, kt_conv_dw_n_is_0,
     "cuDNN takes no empty dimension; dw of a batch of no image (N = 0) is zeros, native's"},
};

const kt_gap_t *kt_gap_find(const char *backend, const char *provider, const kt_case_t *c) {
  for (size_t i = 0; i < sizeof kt_gaps / sizeof kt_gaps[0]; i++) {
    const kt_gap_t *g = &kt_gaps[i];
    if ((g->backend && strcmp(g->backend, backend) != 0) || (g->provider && strcmp(g->provider, provider) != 0) ||
        strcmp(g->row, c->row->name) != 0)
      continue;
    if ((!g->label || strstr(c->label, g->label)) && (!g->covers || g->covers(c))) return g;
  }
  return NULL;
}

const kt_gap_t *kt_gap_at(size_t i) { return i < sizeof kt_gaps / sizeof kt_gaps[0] ? &kt_gaps[i] : NULL; }
