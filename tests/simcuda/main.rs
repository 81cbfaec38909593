//! simcuda, the simulated GPU, as CUDA documents the driver and runtime (no shim).
//! One module per area; one test binary.

#[path = "../common/mod.rs"]
mod common;

mod simcuda_abi;
mod simcuda_capture;
mod simcuda_clients;
mod simcuda_driver;
mod simcuda_exit;
mod simcuda_families;
mod simcuda_faults;
mod simcuda_ipc;
mod simcuda_layout;
mod simcuda_peer;
mod simcuda_perf;
mod simcuda_procaddr;
mod simcuda_runtime;
mod simcuda_streams;
mod simcuda_vmm;
