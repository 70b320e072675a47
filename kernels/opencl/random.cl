/* kernels/opencl/random.cl: (being written) */
