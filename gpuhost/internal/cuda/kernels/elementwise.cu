// elementwise.cu holds the elementwise kernels.
