/* kernels/opencl/elementwise.cl: (being written) */
