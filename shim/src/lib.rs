//! libcushim.so: the LD_PRELOAD boundary.
