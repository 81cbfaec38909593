//! libsimcuda.so: a simulated CUDA driver and runtime on host memory.
//!
//! Invariant: one process state (`state`) serves every exported name, whichever of
//! `libcuda.so.1` / `libcudart.so.12` loaded the library; the runtime (`runtime_api`) is built
//! on the internal Rust functions, never on the exported `cu*` symbols.
//!
//! Environment (read once, at first use):
//! - `SIMCUDA_MEM_MB` (default 16384): per-device capacity; `cuMemAlloc` blocks (rounded to
//!   512 bytes) plus `cuMemCreate` physical memory count against it; `cuMemGetInfo` is exact.
//! - `SIMCUDA_SHARED=1`: processes on this machine share each device's capacity through a
//!   ledger in shared memory (`SIMCUDA_SHARED_KEY` names a separate one; see `shared`).
//! - `SIMCUDA_DEVICES` (default 1), `SIMCUDA_HOST_MEM_MB` (default 16384, pinned memory).
//! - `SIMCUDA_VMM=0`: no virtual memory management (attribute 102 is 0, `cuMemCreate` and
//!   `cuMemAddressReserve` return `CUDA_ERROR_NOT_SUPPORTED`).
//! - `SIMCUDA_FAIL=name@N|name@every:K|name@after:K[=CODE],...` (see `fault`).
//! - `SIMCUDA_LATENCY=cuda,virtual,name:50us,...`: a latency model (a named profile, per-call
//!   figures, a virtual clock), not a measurement (see `latency`, `profile`).
//! - `SIMCUDA_REPORT=path`: JSON ledger written at exit (see `report`).
//!
//! Known simplifications: captured work is recorded, not run, and graphs cannot be launched;
//! `cuMemAllocAsync` allocates at once and `cuMemFreeAsync` frees when the stream gets
//! there; synchronous `cudaMemset` waits for completion; `cudaDeviceReset` frees the
//! device's `cuMemAlloc` blocks but keeps streams, events and VMM objects.
//!
//! The internal decoders take the C caller's pointers as the C API defines them (NULL is
//! checked, the rest is the caller's contract), hence the crate-wide
//! `not_unsafe_ptr_arg_deref` allowance.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod after_fork;
pub mod api;
pub mod attributes;
pub mod capture;
pub mod config;
pub mod copy;
pub mod device_prop;
pub mod driver_api;
pub mod driver_mem_api;
pub mod error;
pub mod event;
pub mod families;
pub mod fault;
pub mod host;
pub mod ipc;
pub mod latency;
pub mod memory;
pub mod peer;
pub mod pointer_api;
pub mod procaddr;
pub mod profile;
pub mod report;
pub mod runtime_api;
pub mod runtime_mem_api;
pub mod runtime_ptsz_api;
pub mod shared;
pub mod state;
pub mod stream;
pub mod types;
pub mod uuid;
pub mod version;
pub mod vmm;
pub mod vmm_share;
