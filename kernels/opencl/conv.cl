/* kernels/opencl/conv.cl: (being written) */
