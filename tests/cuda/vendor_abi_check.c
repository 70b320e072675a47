/* tests/cuda/vendor_abi_check.c: backends/cuda/vendor_api.h against the real cuBLAS and cuDNN headers, where the build found them: a constant or a layout that differs fails to compile. */
#include <stddef.h>
#include <stdio.h>

#include "backends/cuda/vendor_api.h"

#define SAME_(a, b) _Static_assert((long long)(a) == (long long)(b), #a " differs from " #b)

#ifdef KILN_CHECK_CUBLAS
#include <cublas_api.h>
SAME_(KILN_CUBLAS_OP_N, CUBLAS_OP_N);
SAME_(KILN_CUBLAS_OP_T, CUBLAS_OP_T);
SAME_(KILN_CUBLAS_DEFAULT_MATH, CUBLAS_DEFAULT_MATH);
SAME_(KILN_CUBLAS_TF32_TENSOR_OP_MATH, CUBLAS_TF32_TENSOR_OP_MATH);
SAME_(KILN_CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
SAME_(KILN_CUDA_R_16F, CUDA_R_16F);
SAME_(KILN_CUDA_R_16BF, CUDA_R_16BF);
SAME_(KILN_CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F);
SAME_(KILN_CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT);
SAME_(KILN_LIBRARY_MAJOR_VERSION, MAJOR_VERSION);
SAME_(KILN_LIBRARY_MINOR_VERSION, MINOR_VERSION);
SAME_(KILN_LIBRARY_PATCH_LEVEL, PATCH_LEVEL);
SAME_(sizeof(kiln_cublas_status_t), sizeof(cublasStatus_t));
SAME_(sizeof(kiln_cublas_handle_t), sizeof(cublasHandle_t));
SAME_(sizeof(int), sizeof(cublasOperation_t));
SAME_(sizeof(int), sizeof(cublasMath_t));
SAME_(sizeof(int), sizeof(libraryPropertyType));
SAME_(sizeof(int), sizeof(cudaDataType));
SAME_(sizeof(int), sizeof(cublasComputeType_t));
SAME_(sizeof(int), sizeof(cublasGemmAlgo_t));
#endif

#ifdef KILN_CHECK_CUDNN
/* The legacy API is marked deprecated; the check reads it all the same. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cudnn.h>
SAME_(CUDNN_MAJOR, 9);
SAME_(KILN_CUDNN_STATUS_SUCCESS, CUDNN_STATUS_SUCCESS);
SAME_(KILN_CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_NOT_INITIALIZED);
SAME_(KILN_CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH);
SAME_(KILN_CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED);
SAME_(KILN_CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER);
SAME_(KILN_CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE);
SAME_(KILN_CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED);
SAME_(KILN_CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED,
      CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED);
SAME_(KILN_CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NCHW);
SAME_(KILN_CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT);
SAME_(KILN_CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE);
SAME_(KILN_CUDNN_DATA_HALF, CUDNN_DATA_HALF);
SAME_(KILN_CUDNN_DATA_BFLOAT16, CUDNN_DATA_BFLOAT16);
SAME_(sizeof(int), sizeof(cudnnDataType_t));
SAME_(KILN_CUDNN_CROSS_CORRELATION, CUDNN_CROSS_CORRELATION);
SAME_(KILN_CUDNN_DEFAULT_MATH, CUDNN_DEFAULT_MATH);
SAME_(KILN_CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH);
SAME_(KILN_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
SAME_(KILN_CUDNN_FMA_MATH, CUDNN_FMA_MATH);
SAME_(KILN_CUDNN_POOLING_MAX, CUDNN_POOLING_MAX);
SAME_(KILN_CUDNN_PROPAGATE_NAN, CUDNN_PROPAGATE_NAN);
SAME_(KILN_CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
SAME_(sizeof(kiln_cudnn_status_t), sizeof(cudnnStatus_t));
SAME_(sizeof(int), sizeof(cudnnConvolutionFwdAlgo_t));
SAME_(sizeof(int), sizeof(cudnnMathType_t));
SAME_(sizeof(int), sizeof(cudnnDeterminism_t));
SAME_(sizeof(kiln_cudnn_handle_t), sizeof(cudnnHandle_t));
SAME_(sizeof(kiln_cudnn_fwd_perf_t), sizeof(cudnnConvolutionFwdAlgoPerf_t));
SAME_(offsetof(kiln_cudnn_fwd_perf_t, algo), offsetof(cudnnConvolutionFwdAlgoPerf_t, algo));
SAME_(offsetof(kiln_cudnn_fwd_perf_t, status), offsetof(cudnnConvolutionFwdAlgoPerf_t, status));
SAME_(offsetof(kiln_cudnn_fwd_perf_t, time), offsetof(cudnnConvolutionFwdAlgoPerf_t, time));
SAME_(offsetof(kiln_cudnn_fwd_perf_t, memory), offsetof(cudnnConvolutionFwdAlgoPerf_t, memory));
SAME_(offsetof(kiln_cudnn_fwd_perf_t, determinism), offsetof(cudnnConvolutionFwdAlgoPerf_t, determinism));
SAME_(offsetof(kiln_cudnn_fwd_perf_t, math_type), offsetof(cudnnConvolutionFwdAlgoPerf_t, mathType));
SAME_(KILN_CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
SAME_(KILN_CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
SAME_(KILN_CUDNN_DETERMINISTIC, CUDNN_DETERMINISTIC);
SAME_(KILN_CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_ACCURATE);
SAME_(KILN_CUDNN_SOFTMAX_LOG, CUDNN_SOFTMAX_LOG);
SAME_(KILN_CUDNN_SOFTMAX_MODE_INSTANCE, CUDNN_SOFTMAX_MODE_INSTANCE);
SAME_(sizeof(int), sizeof(cudnnConvolutionBwdDataAlgo_t));
SAME_(sizeof(int), sizeof(cudnnConvolutionBwdFilterAlgo_t));
SAME_(sizeof(int), sizeof(cudnnSoftmaxAlgorithm_t));
SAME_(sizeof(int), sizeof(cudnnSoftmaxMode_t));
/* The backward perf structs, declared as the forward's layout. */
#define SAME_PERF_(T)                                                                              \
  SAME_(sizeof(kiln_cudnn_fwd_perf_t), sizeof(T));                                                 \
  SAME_(offsetof(kiln_cudnn_fwd_perf_t, algo), offsetof(T, algo));                                 \
  SAME_(offsetof(kiln_cudnn_fwd_perf_t, status), offsetof(T, status));                             \
  SAME_(offsetof(kiln_cudnn_fwd_perf_t, time), offsetof(T, time));                                 \
  SAME_(offsetof(kiln_cudnn_fwd_perf_t, memory), offsetof(T, memory));                             \
  SAME_(offsetof(kiln_cudnn_fwd_perf_t, determinism), offsetof(T, determinism));                   \
  SAME_(offsetof(kiln_cudnn_fwd_perf_t, math_type), offsetof(T, mathType))
SAME_PERF_(cudnnConvolutionBwdDataAlgoPerf_t);
SAME_PERF_(cudnnConvolutionBwdFilterAlgoPerf_t);
#pragma GCC diagnostic pop
#endif

int main(void) {
#if defined(KILN_CHECK_CUBLAS) || defined(KILN_CHECK_CUDNN)
  printf("vendor_api.h matches the headers found:%s%s\n",
#ifdef KILN_CHECK_CUBLAS
         " cublas_api.h",
#else
         "",
#endif
#ifdef KILN_CHECK_CUDNN
         " cudnn.h"
#else
         ""
#endif
  );
  return 0;
#else
  printf("SKIP: no cuBLAS or cuDNN header was found to check vendor_api.h against\n");
  return 77;
#endif
}
