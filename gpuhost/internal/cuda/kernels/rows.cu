// rows.cu: kernels of the CUDA device's row and structured ops (F2).
