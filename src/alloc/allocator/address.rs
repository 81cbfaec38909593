//! Address queries (`cuMemGetAddressRange`, `cuPointerGetAttribute`'s range attributes)
//! answered for the program's allocations, not the cache's segments.
//!
//! Policy: without the cache, each `cudaMalloc` is its own driver allocation, and the
//! driver answers a query on any address inside it with that allocation's start and size;
//! on a freed one, with `CUDA_ERROR_NOT_FOUND`. Under the cache several allocations share
//! one segment, so the driver would answer with the segment: a program that clears "the
//! whole allocation" through that range clobbers its neighbours. So the cache answers for
//! its own memory: inside a block handed to the program, that block's start and its
//! requested size rounded up to 512 bytes (what the driver's granule gives for a plain
//! allocation; never more than the block); inside cache memory the program does not hold
//! (a cached, pending or unmapped block), "not allocated"; elsewhere, "not ours" (the
//! driver answers).

use super::{settled, CachingAllocator, DeviceState};
use crate::alloc::block::State;
use crate::alloc::rounding::round_up;
use crate::device::DevPtr;

/// The driver's allocation granule for a plain allocation, as the cache reports it.
const GRANULE: u64 = 512;

/// What the cache knows about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressRange {
    /// Inside an allocation the program holds: its start and size.
    Allocated { base: DevPtr, size: u64 },
    /// Inside memory of the cache that the program does not hold.
    NotAllocated,
    /// Not memory of the cache.
    NotOurs,
}

impl CachingAllocator {
    /// The allocation holding `ptr` (module policy).
    pub fn address_range(&self, ptr: DevPtr) -> AddressRange {
        for st in &self.states {
            let g = settled(st);
            if let Some(r) = g.address_range(ptr) {
                return r;
            }
        }
        AddressRange::NotOurs
    }
}

impl DeviceState {
    /// `None` when `ptr` is not in this device's segments or reservations.
    fn address_range(&self, ptr: DevPtr) -> Option<AddressRange> {
        let head = self.head_of_span_containing(ptr)?;
        let mut cur = Some(head);
        while let Some(id) = cur {
            let b = &self.blocks[id];
            if ptr >= b.addr && ptr < b.end() {
                return Some(match b.state {
                    State::Allocated => AddressRange::Allocated {
                        base: b.addr,
                        size: round_up(b.requested.max(1), GRANULE).min(b.size),
                    },
                    State::Free | State::Pending | State::Unmapped => AddressRange::NotAllocated,
                });
            }
            cur = b.next;
        }
        Some(AddressRange::NotAllocated)
    }
}
