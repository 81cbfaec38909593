//! Peer access between simulated devices (`SIMCUDA_DEVICES` above 1): `cuDeviceCanAccessPeer`
//! / `cudaDeviceCanAccessPeer`, `cuCtxEnablePeerAccess` / `cudaDeviceEnablePeerAccess` and
//! their disabling twins, `cuMemcpyPeer` / `cudaMemcpyPeer` and their stream-ordered forms
//! `cuMemcpyPeerAsync` / `cudaMemcpyPeerAsync` (and the per-thread-stream `_ptds` / `_ptsz`
//! names NVIDIA's headers select).
//!
//! Policy (why: both APIs must say the same thing, as CUDA's do, so a client or the shim sees
//! one answer whichever it asks):
//! - Every two distinct devices can access each other (an NVLink-connected node); a device
//!   and itself cannot be peers (CUDA answers 0).
//! - Peer access is a (current device, peer) pair: enabling it twice is
//!   `PEER_ACCESS_ALREADY_ENABLED` (704), disabling it when not enabled
//!   `PEER_ACCESS_NOT_ENABLED` (705), the device itself `INVALID_DEVICE`, flags other than 0
//!   `INVALID_VALUE`; in both APIs.
//! - It governs `cuMemAlloc` memory only, as in CUDA; virtual-memory mappings follow
//!   `cuMemSetAccess` alone. Peer copies work whether or not it is enabled (the driver stages
//!   them on a GPU); here device memory is host memory, so they are plain copies.
//! - An asynchronous peer copy is queued on the stream it names (0: the current context's
//!   default stream) and returns at once; it runs after the work queued before it on that
//!   stream, and work queued after it sees its result, as any stream-ordered copy.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, out, runtime, Api};
use crate::copy::copy_async;
use crate::driver_api::drv_stream;
use crate::driver_mem_api::copy_c;
use crate::error::*;
use crate::runtime_api::rt_stream;
use crate::state::{self, current_device, driver_device, runtime_device, Ctx, Device};
use libc::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

/// Row `d`: bit `p` set when device `d` has enabled access to device `p`.
static ENABLED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Whether `from` has peer access to `to` enabled.
pub fn enabled(from: usize, to: usize) -> bool {
    from < 64 && to < 64 && ENABLED[from].load(Ordering::Acquire) & (1 << to) != 0
}

fn can_access(dev: &Device, peer: &Device) -> c_int {
    c_int::from(dev.ordinal != peer.ordinal)
}

fn enable(dev: &Device, peer: &Device, flags: c_uint) -> Result<(), CUresult> {
    if flags != 0 {
        return Err(INVALID_VALUE);
    }
    if dev.ordinal == peer.ordinal {
        return Err(INVALID_DEVICE);
    }
    let bit = 1u64 << peer.ordinal;
    if ENABLED[dev.ordinal].fetch_or(bit, Ordering::AcqRel) & bit != 0 {
        return Err(PEER_ACCESS_ALREADY_ENABLED);
    }
    Ok(())
}

fn disable(dev: &Device, peer: &Device) -> Result<(), CUresult> {
    if dev.ordinal == peer.ordinal {
        return Err(INVALID_DEVICE);
    }
    let bit = 1u64 << peer.ordinal;
    if ENABLED[dev.ordinal].fetch_and(!bit, Ordering::AcqRel) & bit == 0 {
        return Err(PEER_ACCESS_NOT_ENABLED);
    }
    Ok(())
}

/// The device whose primary context `ctx` is.
fn ctx_device(ctx: *mut Ctx) -> Result<&'static Device, CUresult> {
    let st = state::initialized()?;
    st.devices
        .iter()
        .find(|d| state::ctx_handle(d) == ctx)
        .ok_or(INVALID_CONTEXT)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: c_int,
    peer: c_int,
) -> CUresult {
    driver(Api::cuDeviceCanAccessPeer, || {
        let (d, p) = (driver_device(dev)?, driver_device(peer)?);
        out(can, can_access(d, p))
    })
}

#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: *mut Ctx, flags: c_uint) -> CUresult {
    driver(Api::cuCtxEnablePeerAccess, || {
        enable(current_device()?, ctx_device(peer)?, flags)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: *mut Ctx) -> CUresult {
    driver(Api::cuCtxDisablePeerAccess, || {
        disable(current_device()?, ctx_device(peer)?)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeer(
    dst: u64,
    dst_ctx: *mut Ctx,
    src: u64,
    src_ctx: *mut Ctx,
    n: usize,
) -> CUresult {
    driver(Api::cuMemcpyPeer, || {
        ctx_device(dst_ctx)?;
        ctx_device(src_ctx)?;
        copy_c(dst as usize, src as usize, n, true, true, false)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeer_ptds(
    dst: u64,
    dst_ctx: *mut Ctx,
    src: u64,
    src_ctx: *mut Ctx,
    n: usize,
) -> CUresult {
    driver(Api::cuMemcpyPeer_ptds, || {
        ctx_device(dst_ctx)?;
        ctx_device(src_ctx)?;
        copy_c(dst as usize, src as usize, n, true, true, true)
    })
}

/// `cuMemcpyPeerAsync[_ptsz]`: both contexts checked, the copy queued on `h`.
fn peer_async_c(
    dst: u64,
    dst_ctx: *mut Ctx,
    src: u64,
    src_ctx: *mut Ctx,
    n: usize,
    h: *mut c_void,
    ptds: bool,
) -> Result<(), CUresult> {
    ctx_device(dst_ctx)?;
    ctx_device(src_ctx)?;
    let s = drv_stream(h, ptds)?;
    copy_async(&s, dst as usize, src as usize, n, true, true)
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: u64,
    dst_ctx: *mut Ctx,
    src: u64,
    src_ctx: *mut Ctx,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemcpyPeerAsync, || {
        peer_async_c(dst, dst_ctx, src, src_ctx, n, h, false)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync_ptsz(
    dst: u64,
    dst_ctx: *mut Ctx,
    src: u64,
    src_ctx: *mut Ctx,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemcpyPeerAsync_ptsz, || {
        peer_async_c(dst, dst_ctx, src, src_ctx, n, h, true)
    })
}

fn runtime_ordinal(dev: c_int) -> Result<&'static Device, CUresult> {
    state::device(usize::try_from(dev).map_err(|_| INVALID_DEVICE)?)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceCanAccessPeer(
    can: *mut c_int,
    dev: c_int,
    peer: c_int,
) -> CUresult {
    runtime(Api::cudaDeviceCanAccessPeer, || {
        let (d, p) = (runtime_ordinal(dev)?, runtime_ordinal(peer)?);
        out(can, can_access(d, p))
    })
}

#[no_mangle]
pub extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> CUresult {
    runtime(Api::cudaDeviceEnablePeerAccess, || {
        enable(runtime_device()?, runtime_ordinal(peer)?, flags)
    })
}

#[no_mangle]
pub extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> CUresult {
    runtime(Api::cudaDeviceDisablePeerAccess, || {
        disable(runtime_device()?, runtime_ordinal(peer)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeer(
    dst: *mut c_void,
    dst_dev: c_int,
    src: *const c_void,
    src_dev: c_int,
    n: usize,
) -> CUresult {
    runtime(Api::cudaMemcpyPeer, || {
        runtime_device()?;
        runtime_ordinal(dst_dev)?;
        runtime_ordinal(src_dev)?;
        copy_c(dst as usize, src as usize, n, true, true, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeerAsync(
    dst: *mut c_void,
    dst_dev: c_int,
    src: *const c_void,
    src_dev: c_int,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMemcpyPeerAsync, || {
        runtime_ordinal(dst_dev)?;
        runtime_ordinal(src_dev)?;
        let s = rt_stream(h)?;
        copy_async(&s, dst as usize, src as usize, n, true, true)
    })
}
