/* backends/cuda/vendor_api.h: the parts of cuBLAS's and cuDNN's C APIs the plugin calls, declared here so that it builds without their headers. */
#ifndef KILN_BACKENDS_CUDA_VENDOR_API_H
#define KILN_BACKENDS_CUDA_VENDOR_API_H

/* cuDNN ships apart from the CUDA toolkit (a tarball, a distribution
 * package, the nvidia-cudnn-cu13 wheel), and cuBLAS may be installed without
 * its headers; both are loaded with dlopen at run time and are optional
 * there. So the plugin needs neither header to build: it declares the types,
 * constants and function types it uses, in its own names (kiln_cudnn_*,
 * KILN_CUDNN_*), and the build checks them against the real headers where
 * those are found (tests/cuda/vendor_abi_check.c, compiled with
 * _Static_asserts: a constant or a struct layout that differs fails the
 * build).
 *
 * Every handle and descriptor is a pointer to an opaque struct in the
 * vendors' headers; a void * has the same representation and calling
 * convention. The enums are int-sized. The values are those of cuBLAS 12/13
 * and of cuDNN 9's legacy ("descriptor") API, which kiln uses (see cudnn.c
 * for why); kiln checks at load that the library is cuDNN 9. */

#include <stddef.h>

#include <cuda.h>

/* ---- cuBLAS (cublas_api.h, library_types.h) ---------------------------------- */

typedef int kiln_cublas_status_t;    /* cublasStatus_t; 0 is CUBLAS_STATUS_SUCCESS */
typedef void *kiln_cublas_handle_t;  /* cublasHandle_t */
#define KILN_CUBLAS_OP_N 0           /* cublasOperation_t */
#define KILN_CUBLAS_OP_T 1
#define KILN_CUBLAS_DEFAULT_MATH 0   /* cublasMath_t */
#define KILN_CUBLAS_TF32_TENSOR_OP_MATH 3
#define KILN_CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION 16 /* a cublasMath_t flag */
#define KILN_CUDA_R_16F 2            /* cudaDataType (library_types.h) */
#define KILN_CUDA_R_16BF 14
#define KILN_CUBLAS_COMPUTE_32F 68   /* cublasComputeType_t */
#define KILN_CUBLAS_GEMM_DEFAULT (-1) /* cublasGemmAlgo_t */
#define KILN_LIBRARY_MAJOR_VERSION 0 /* libraryPropertyType */
#define KILN_LIBRARY_MINOR_VERSION 1
#define KILN_LIBRARY_PATCH_LEVEL 2

typedef kiln_cublas_status_t (*kiln_cublas_create_fn)(kiln_cublas_handle_t *);
typedef kiln_cublas_status_t (*kiln_cublas_destroy_fn)(kiln_cublas_handle_t);
typedef kiln_cublas_status_t (*kiln_cublas_set_stream_fn)(kiln_cublas_handle_t, CUstream);
typedef kiln_cublas_status_t (*kiln_cublas_set_math_mode_fn)(kiln_cublas_handle_t, int);
typedef kiln_cublas_status_t (*kiln_cublas_get_property_fn)(int, int *);
typedef kiln_cublas_status_t (*kiln_cublas_sgemm_fn)(kiln_cublas_handle_t, int, int, int, int, int, const float *,
                                                     const float *, int, const float *, int, const float *, float *,
                                                     int);
typedef kiln_cublas_status_t (*kiln_cublas_sgemm_strided_batched_fn)(kiln_cublas_handle_t, int, int, int, int, int,
                                                                     const float *, const float *, int, long long,
                                                                     const float *, int, long long, const float *,
                                                                     float *, int, long long, int);
typedef kiln_cublas_status_t (*kiln_cublas_dgemm_fn)(kiln_cublas_handle_t, int, int, int, int, int, const double *,
                                                     const double *, int, const double *, int, const double *,
                                                     double *, int);
typedef kiln_cublas_status_t (*kiln_cublas_dgemm_strided_batched_fn)(kiln_cublas_handle_t, int, int, int, int, int,
                                                                     const double *, const double *, int, long long,
                                                                     const double *, int, long long, const double *,
                                                                     double *, int, long long, int);
/* cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B,
 * Btype, ldb, beta, C, Ctype, ldc, computeType, algo): the data types are
 * cudaDataType, the compute type cublasComputeType_t, algo cublasGemmAlgo_t. */
typedef kiln_cublas_status_t (*kiln_cublas_gemm_ex_fn)(kiln_cublas_handle_t, int, int, int, int, int, const void *alpha,
                                                       const void *a, int a_type, int lda, const void *b, int b_type,
                                                       int ldb, const void *beta, void *c, int c_type, int ldc,
                                                       int compute_type, int algo);
/* cublasGemmStridedBatchedEx: cublasGemmEx with a long long stride after
 * each leading dimension and the batch count before the compute type. */
typedef kiln_cublas_status_t (*kiln_cublas_gemm_strided_batched_ex_fn)(
    kiln_cublas_handle_t, int, int, int, int, int, const void *alpha, const void *a, int a_type, int lda,
    long long stride_a, const void *b, int b_type, int ldb, long long stride_b, const void *beta, void *c, int c_type,
    int ldc, long long stride_c, int batch, int compute_type, int algo);

/* ---- cuDNN 9 (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h) ------------------------ */

typedef int kiln_cudnn_status_t; /* cudnnStatus_t; 0 is CUDNN_STATUS_SUCCESS */
typedef void *kiln_cudnn_handle_t;
typedef void *kiln_cudnn_tensor_t;  /* cudnnTensorDescriptor_t */
typedef void *kiln_cudnn_filter_t;  /* cudnnFilterDescriptor_t */
typedef void *kiln_cudnn_conv_t;    /* cudnnConvolutionDescriptor_t */
typedef void *kiln_cudnn_pooling_t; /* cudnnPoolingDescriptor_t */

/* cudnnStatus_t values kiln tells apart (the rest by their thousands). */
#define KILN_CUDNN_STATUS_SUCCESS 0
#define KILN_CUDNN_STATUS_NOT_INITIALIZED 1001
#define KILN_CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH 1002
#define KILN_CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED 1008
#define KILN_CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER 3005
#define KILN_CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE 3009
#define KILN_CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED 4003
#define KILN_CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED 4004

#define KILN_CUDNN_TENSOR_NCHW 0        /* cudnnTensorFormat_t */
#define KILN_CUDNN_DATA_FLOAT 0         /* cudnnDataType_t */
#define KILN_CUDNN_DATA_DOUBLE 1
#define KILN_CUDNN_DATA_HALF 2
#define KILN_CUDNN_DATA_BFLOAT16 9
#define KILN_CUDNN_CROSS_CORRELATION 1  /* cudnnConvolutionMode_t */
#define KILN_CUDNN_DEFAULT_MATH 0       /* cudnnMathType_t */
#define KILN_CUDNN_TENSOR_OP_MATH 1
#define KILN_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION 2
#define KILN_CUDNN_FMA_MATH 3
#define KILN_CUDNN_POOLING_MAX 0        /* cudnnPoolingMode_t */
#define KILN_CUDNN_PROPAGATE_NAN 1      /* cudnnNanPropagation_t */
#define KILN_CUDNN_CONVOLUTION_FWD_ALGO_COUNT 8
#define KILN_CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT 6
#define KILN_CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT 7
#define KILN_CUDNN_DETERMINISTIC 1      /* cudnnDeterminism_t */
#define KILN_CUDNN_SOFTMAX_ACCURATE 1   /* cudnnSoftmaxAlgorithm_t */
#define KILN_CUDNN_SOFTMAX_LOG 2
#define KILN_CUDNN_SOFTMAX_MODE_INSTANCE 0 /* cudnnSoftmaxMode_t */

/* cudnnConvolutionFwdAlgoPerf_t; cudnnConvolutionBwdDataAlgoPerf_t and
 * cudnnConvolutionBwdFilterAlgoPerf_t have the same layout, their algo
 * fields being their own enums. */
typedef struct kiln_cudnn_fwd_perf_t {
  int algo;             /* cudnnConvolutionFwdAlgo_t */
  kiln_cudnn_status_t status;
  float time;
  size_t memory;
  int determinism;      /* cudnnDeterminism_t */
  int math_type;        /* cudnnMathType_t */
  int reserved[3];
} kiln_cudnn_fwd_perf_t;
typedef kiln_cudnn_fwd_perf_t kiln_cudnn_bwd_data_perf_t;
typedef kiln_cudnn_fwd_perf_t kiln_cudnn_bwd_filter_perf_t;

typedef size_t (*kiln_cudnn_get_version_fn)(void);
typedef kiln_cudnn_status_t (*kiln_cudnn_version_check_fn)(void);
typedef const char *(*kiln_cudnn_error_string_fn)(kiln_cudnn_status_t);
typedef kiln_cudnn_status_t (*kiln_cudnn_create_fn)(kiln_cudnn_handle_t *);
typedef kiln_cudnn_status_t (*kiln_cudnn_destroy_fn)(kiln_cudnn_handle_t);
typedef kiln_cudnn_status_t (*kiln_cudnn_set_stream_fn)(kiln_cudnn_handle_t, CUstream);
typedef kiln_cudnn_status_t (*kiln_cudnn_create_desc_fn)(void **);
typedef kiln_cudnn_status_t (*kiln_cudnn_destroy_desc_fn)(void *);
typedef kiln_cudnn_status_t (*kiln_cudnn_set_tensor_4d_fn)(kiln_cudnn_tensor_t, int format, int data_type, int, int,
                                                           int, int);
typedef kiln_cudnn_status_t (*kiln_cudnn_set_filter_4d_fn)(kiln_cudnn_filter_t, int data_type, int format, int, int,
                                                           int, int);
typedef kiln_cudnn_status_t (*kiln_cudnn_set_conv_2d_fn)(kiln_cudnn_conv_t, int pad_h, int pad_w, int u, int v,
                                                         int dilation_h, int dilation_w, int mode, int compute_type);
typedef kiln_cudnn_status_t (*kiln_cudnn_set_conv_math_fn)(kiln_cudnn_conv_t, int math_type);
typedef kiln_cudnn_status_t (*kiln_cudnn_conv_output_dim_fn)(kiln_cudnn_conv_t, kiln_cudnn_tensor_t,
                                                             kiln_cudnn_filter_t, int *, int *, int *, int *);
typedef kiln_cudnn_status_t (*kiln_cudnn_conv_algorithm_fn)(kiln_cudnn_handle_t, kiln_cudnn_tensor_t,
                                                            kiln_cudnn_filter_t, kiln_cudnn_conv_t,
                                                            kiln_cudnn_tensor_t, int requested, int *returned,
                                                            kiln_cudnn_fwd_perf_t *);
typedef kiln_cudnn_status_t (*kiln_cudnn_conv_workspace_fn)(kiln_cudnn_handle_t, kiln_cudnn_tensor_t,
                                                            kiln_cudnn_filter_t, kiln_cudnn_conv_t,
                                                            kiln_cudnn_tensor_t, int algo, size_t *);
typedef kiln_cudnn_status_t (*kiln_cudnn_conv_forward_fn)(kiln_cudnn_handle_t, const void *alpha,
                                                          kiln_cudnn_tensor_t, const void *x, kiln_cudnn_filter_t,
                                                          const void *w, kiln_cudnn_conv_t, int algo,
                                                          void *workspace, size_t workspace_size, const void *beta,
                                                          kiln_cudnn_tensor_t, void *y);
/* cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wDesc, dyDesc, convDesc, dxDesc, ...),
 * cudnnGetConvolutionBackwardDataWorkspaceSize, cudnnConvolutionBackwardData. */
typedef kiln_cudnn_status_t (*kiln_cudnn_bwd_data_algorithm_fn)(kiln_cudnn_handle_t, kiln_cudnn_filter_t,
                                                                kiln_cudnn_tensor_t, kiln_cudnn_conv_t,
                                                                kiln_cudnn_tensor_t, int requested, int *returned,
                                                                kiln_cudnn_bwd_data_perf_t *);
typedef kiln_cudnn_status_t (*kiln_cudnn_bwd_data_workspace_fn)(kiln_cudnn_handle_t, kiln_cudnn_filter_t,
                                                                kiln_cudnn_tensor_t, kiln_cudnn_conv_t,
                                                                kiln_cudnn_tensor_t, int algo, size_t *);
typedef kiln_cudnn_status_t (*kiln_cudnn_bwd_data_fn)(kiln_cudnn_handle_t, const void *alpha, kiln_cudnn_filter_t,
                                                      const void *w, kiln_cudnn_tensor_t, const void *dy,
                                                      kiln_cudnn_conv_t, int algo, void *workspace,
                                                      size_t workspace_size, const void *beta, kiln_cudnn_tensor_t,
                                                      void *dx);
/* cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, xDesc, dyDesc, convDesc, dwDesc, ...),
 * cudnnGetConvolutionBackwardFilterWorkspaceSize, cudnnConvolutionBackwardFilter. */
typedef kiln_cudnn_status_t (*kiln_cudnn_bwd_filter_algorithm_fn)(kiln_cudnn_handle_t, kiln_cudnn_tensor_t,
                                                                  kiln_cudnn_tensor_t, kiln_cudnn_conv_t,
                                                                  kiln_cudnn_filter_t, int requested, int *returned,
                                                                  kiln_cudnn_bwd_filter_perf_t *);
typedef kiln_cudnn_status_t (*kiln_cudnn_bwd_filter_workspace_fn)(kiln_cudnn_handle_t, kiln_cudnn_tensor_t,
                                                                  kiln_cudnn_tensor_t, kiln_cudnn_conv_t,
                                                                  kiln_cudnn_filter_t, int algo, size_t *);
typedef kiln_cudnn_status_t (*kiln_cudnn_bwd_filter_fn)(kiln_cudnn_handle_t, const void *alpha, kiln_cudnn_tensor_t,
                                                        const void *x, kiln_cudnn_tensor_t, const void *dy,
                                                        kiln_cudnn_conv_t, int algo, void *workspace,
                                                        size_t workspace_size, const void *beta, kiln_cudnn_filter_t,
                                                        void *dw);
/* cudnnSoftmaxBackward(handle, algorithm, mode, alpha, yDesc, y, dyDesc, dy, beta, dxDesc, dx). */
typedef kiln_cudnn_status_t (*kiln_cudnn_softmax_backward_fn)(kiln_cudnn_handle_t, int algorithm, int mode,
                                                              const void *alpha, kiln_cudnn_tensor_t, const void *y,
                                                              kiln_cudnn_tensor_t, const void *dy, const void *beta,
                                                              kiln_cudnn_tensor_t, void *dx);
typedef kiln_cudnn_status_t (*kiln_cudnn_set_pooling_2d_fn)(kiln_cudnn_pooling_t, int mode, int nan_propagation,
                                                         int window_h, int window_w, int pad_v, int pad_h,
                                                         int stride_v, int stride_h);
typedef kiln_cudnn_status_t (*kiln_cudnn_pooling_output_dim_fn)(kiln_cudnn_pooling_t, kiln_cudnn_tensor_t, int *, int *,
                                                             int *, int *);
typedef kiln_cudnn_status_t (*kiln_cudnn_pooling_forward_fn)(kiln_cudnn_handle_t, kiln_cudnn_pooling_t,
                                                          const void *alpha, kiln_cudnn_tensor_t, const void *x,
                                                          const void *beta, kiln_cudnn_tensor_t, void *y);

#endif /* KILN_BACKENDS_CUDA_VENDOR_API_H */
