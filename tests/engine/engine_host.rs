//! The pinned host cache: flag combinations kept apart, power-of-two buckets, reuse without
//! new host allocations, its own statistics, free errors.

use crate::common::engine_support;
use std::sync::Arc;

use cushim::alloc::{CachingAllocator, FreeError};
use cushim_testsupport::fake_device::FakeDevice;

/// An allocator over a 1 GiB fake device.
fn setup(conf: &str) -> (Arc<FakeDevice>, CachingAllocator) {
    engine_support::setup(conf, 1 << 30)
}

#[test]
fn flag_combinations_never_share_blocks() {
    let (dev, a) = setup("");
    let wc = a.host_alloc(4096, 4, 0).unwrap();
    a.host_free(wc, 0).unwrap();
    let plain = a.host_alloc(4096, 0, 0).unwrap();
    assert_ne!(
        plain, wc,
        "a write-combined block never serves a default request"
    );
    let mapped = a.host_alloc(4096, 2 | 1, 0).unwrap();
    assert_ne!(mapped, wc);
    assert_eq!(a.host_alloc(4096, 4, 0).unwrap(), wc);
    assert_eq!(dev.counters().host_alloc, 3);
}

#[test]
fn power_of_two_buckets_serve_any_size_within_them() {
    let (dev, a) = setup("");
    let p = a.host_alloc(3000, 0, 0).unwrap();
    a.host_free(p, 0).unwrap();
    assert_eq!(a.host_alloc(4000, 0, 0).unwrap(), p);
    let q = a.host_alloc(5000, 0, 0).unwrap();
    assert_ne!(q, p, "8 KiB bucket");
    assert_eq!(dev.counters().host_alloc, 2);
    let s = a.host_stats();
    assert_eq!(s["allocated_bytes.current"], 4096 + 8192);
    assert_eq!(s["reserved_bytes.current"], 4096 + 8192);
    assert_eq!(s["num_host_alloc"], 2);
    assert_eq!(s["allocation.peak"], 2);
}

#[test]
fn reuse_waits_for_the_devices_unless_free_sync_is_none() {
    let (dev, a) = setup("");
    let p = a.host_alloc(1 << 20, 0, 0).unwrap();
    a.host_free(p, 0).unwrap();
    assert_eq!(a.host_alloc(1 << 20, 0, 0).unwrap(), p);
    assert_eq!(
        dev.counters().sync_device,
        1,
        "one synchronization covered the pending block"
    );
    let (dev, a) = setup("free_sync:none");
    let p = a.host_alloc(1 << 20, 0, 0).unwrap();
    a.host_free(p, 0).unwrap();
    assert_eq!(a.host_alloc(1 << 20, 0, 0).unwrap(), p);
    assert_eq!(dev.counters().sync_device, 0);
}

#[test]
fn host_free_rejects_foreign_and_double_frees() {
    let (dev, a) = setup("");
    assert_eq!(a.host_free(0x1234, 0), Err(FreeError::NotOurs));
    let p = a.host_alloc(100, 0, 0).unwrap();
    a.host_free(p, 0).unwrap();
    assert_eq!(a.host_free(p, 0), Err(FreeError::InvalidValue));
    a.empty_cache();
    assert_eq!(dev.live_host(), 0);
    assert_eq!(a.host_stats()["reserved_bytes.current"], 0);
    assert_eq!(a.host_stats()["num_host_free"], 1);
}

#[test]
fn host_segments_appear_last_in_the_snapshot() {
    let (_dev, a) = setup("");
    let p = a.host_alloc(100, 0, 0).unwrap();
    let snap = a.snapshot();
    let host = snap.last().unwrap();
    assert_eq!(host.device, -1);
    assert_eq!(host.segments.len(), 1);
    assert_eq!(host.segments[0].address, p);
    assert_eq!(host.segments[0].blocks[0].requested_size, 100);
}
