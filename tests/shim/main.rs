//! The shim under `LD_PRELOAD`: C (and Python, cudarc) programs run on simcuda with and
//! without it, and what each run shows (simcuda's report, snapshots, logs, statistics).
//! Every test here must fail with the do-nothing stand-in in the shim's place unless named
//! for the shim's absence (`shim_mutation.rs`). One module per area; one test binary.

#[path = "../common/mod.rs"]
mod common;

mod cudarc_client;
mod driver_api;
mod driver_dlsym;
mod driver_static;
mod memory_viz_compat;
mod numba_cuda;
mod shim_address_queries;
mod shim_alloc;
mod shim_cache_cap;
mod shim_capture;
mod shim_cuda13;
mod shim_driver_entry;
mod shim_end;
mod shim_end_python;
mod shim_expandable;
mod shim_failopen;
mod shim_fork;
mod shim_ipc;
mod shim_ipc_expandable;
mod shim_ipc_private;
mod shim_log;
mod shim_no_runtime_start;
mod shim_nvtx;
mod shim_observe;
mod shim_peer;
mod shim_ptsz_alloc;
mod shim_python;
mod shim_release_faults;
mod shim_runtime_dlsym;
mod shim_sleep;
mod shim_snapshot;
mod shim_special_files;
mod shim_stacked;
mod shim_streams;
mod shim_stress;
mod shim_threads;
mod smoke_build;
mod trace_dlclose;
