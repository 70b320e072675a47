/* kernels/opencl/reduce.cl: (being written) */
