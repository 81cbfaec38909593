//! libcushim.so: the LD_PRELOAD boundary of cushim.
//!
//! Only the C ABI lives here: exported `cuda*` symbols decode their arguments, call the
//! engine (`cushim` crate) and map results to CUDA error codes; `driver` implements the
//! engine's `Device` over the real driver; `dump` writes snapshots at exit and on a signal.
//! No policy lives here, and no panic crosses the C boundary (`ffi::guard`).

// The exports are C entry points called with CUDA's pointer contracts; marking them `unsafe fn`
// would change nothing for their C callers. Each dereference sits in a small `unsafe` block
// that says why it is sound.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod driver;
pub mod exports;
pub mod ffi;
pub mod ipc;
pub mod life;
pub mod lookup;
pub mod observe;
pub mod per_thread;
pub mod real;
