// optim.cu holds the optimizer kernels.
