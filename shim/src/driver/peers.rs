//! The enabled peer pairs, and granting them each new expandable mapping (the policy, with
//! why, is at the head of `exports/peer.rs`, where the program's calls are carried out).
//!
//! Invariants: one bit matrix of atomic words (row P: the devices that may access P), so
//! the mapping path reads one word and allocates nothing when no peer is enabled; devices
//! past 63 are never recorded.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys as cu;

use crate::driver::entry as de;

/// Row `p`: bit `d` set when device `d` has peer access to device `p`.
static ACCESSORS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// The devices granted access to device `dev`'s pages besides `dev` itself (a bit mask).
pub fn accessors_of(dev: i32) -> u64 {
    usize::try_from(dev)
        .ok()
        .and_then(|d| ACCESSORS.get(d))
        .map_or(0, |w| w.load(Ordering::Acquire))
}

pub fn access_desc(dev: i32, flags: cu::CUmemAccess_flags) -> cu::CUmemAccessDesc {
    // SAFETY: plain C data for which all-zero is a valid value.
    let mut desc: cu::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    desc.location.type_ = cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = dev;
    desc.flags = flags;
    desc
}

/// Grant the devices with peer access to `dev` read-write access to the fresh mapping
/// `[ptr, ptr + size)` of `dev`'s memory (called with a context current).
pub fn grant_new_mapping(dev: i32, ptr: u64, size: u64) -> Result<(), i32> {
    let mask = accessors_of(dev);
    if mask == 0 {
        return Ok(());
    }
    let descs: Vec<cu::CUmemAccessDesc> = (0..64)
        .filter(|d| mask & (1u64 << d) != 0)
        .map(|d| access_desc(d, cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
        .collect();
    // SAFETY: a range the caller just mapped, descriptors of ours.
    let rc = unsafe { de::cuMemSetAccess(ptr, size as usize, descs.as_ptr(), descs.len()) };
    if rc == de::SUCCESS {
        Ok(())
    } else {
        Err(rc)
    }
}

/// Record that `from` may (or may no longer) access `to`; `false` when either is not a
/// device ordinal the matrix holds (nothing recorded).
pub fn record(from: i32, to: i32, enable: bool) -> bool {
    let (Ok(f), Ok(t)) = (usize::try_from(from), usize::try_from(to)) else {
        return false;
    };
    if f >= 64 || t >= 64 {
        return false;
    }
    if enable {
        ACCESSORS[t].fetch_or(1 << f, Ordering::AcqRel);
    } else {
        ACCESSORS[t].fetch_and(!(1 << f), Ordering::AcqRel);
    }
    true
}
