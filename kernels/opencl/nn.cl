/* kernels/opencl/nn.cl: (being written) */
