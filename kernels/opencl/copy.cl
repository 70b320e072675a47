/* kernels/opencl/copy.cl: (being written) */
