//! libsimcuda.so: a simulated CUDA driver and runtime on host memory.
//!
//! Invariant: one process state (`state`) serves every exported name, whichever of
//! `libcuda.so.1` / `libcudart.so.12` loaded the library; the runtime (`runtime_api`) is built
//! on the internal Rust functions, never on the exported `cu*` symbols.
//!
//! The internal decoders take the C caller's pointers as the C API defines them (NULL is
//! checked, the rest is the caller's contract), hence the crate-wide
//! `not_unsafe_ptr_arg_deref` allowance.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod api;
pub mod capture;
pub mod config;
pub mod driver_api;
pub mod driver_mem_api;
pub mod error;
pub mod event;
pub mod fault;
pub mod host;
pub mod latency;
pub mod memory;
pub mod procaddr;
pub mod report;
pub mod runtime_api;
pub mod runtime_mem_api;
pub mod state;
pub mod stream;
pub mod types;
pub mod vmm;
