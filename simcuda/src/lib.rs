//! libsimcuda.so: a simulated CUDA driver and runtime.
