/* kernels/opencl/prelude.cl: (being written) */
