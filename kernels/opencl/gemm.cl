/* kernels/opencl/gemm.cl: (being written) */
