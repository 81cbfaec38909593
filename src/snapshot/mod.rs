//! Memory snapshots in the formats PyTorch's viewers read.
