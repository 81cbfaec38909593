//! `CUSHIM_ALLOC_CONF`: PyTorch's `PYTORCH_CUDA_ALLOC_CONF` keys and syntax, plus shim keys.
