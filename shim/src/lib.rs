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

pub mod callsite;
pub mod capi;
pub mod capture;
pub mod dlclose;
pub mod dlsym;
pub mod driver;
pub mod driver_entry;
pub mod dump;
pub mod ending;
pub mod exports_address;
pub mod exports_capture;
pub mod exports_driver;
pub mod exports_families;
pub mod exports_ipc;
pub mod exports_runtime;
pub mod exports_stream;
pub mod exports_vmm;
pub mod failopen;
pub mod ffi;
pub mod fork;
pub mod history;
pub mod intercept;
pub mod ipc;
pub mod ipc_expandable;
pub mod ipc_records;
pub mod lasterror;
pub mod log_writer;
pub mod nvtx;
pub mod observe;
pub mod observe_driver;
pub mod observe_runtime;
pub mod peer;
pub mod per_thread;
pub mod procaddr;
pub mod real;
pub mod real_driver;
pub mod runtime_hooks;
pub mod sigchain;
pub mod snapshot;
pub mod state;
pub mod stats;
pub mod unexplained;
