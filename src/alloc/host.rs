//! The pinned host memory cache (`cudaHostAlloc`, `cudaMallocHost`, `cudaFreeHost`).
//!
//! Invariant: a cached block is handed out only for the same flag combination (portable 1,
//! mapped 2, write-combined 4) and power-of-two bucket it was made for, and only once no
//! queued device work can still read or write it: freed blocks wait (unless
//! `free_sync:none`) until the next cache miss synchronizes every device, once for all of
//! them. Every block is one host allocation; nothing is split or merged.

use std::collections::{BTreeMap, HashMap};

use super::info::{BlockInfo, BlockState, SegmentInfo};
use super::stats::Stat;
use super::{AllocError, FreeError};
use crate::config::alloc::FreeSync;
use crate::device::{DevPtr, Device, DeviceError};
use crate::trace::event::{now_us, Action, EventSink, StackId, TraceEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HState {
    Allocated,
    Pending,
    Free,
}

struct HostBlock {
    size: u64,
    requested: u64,
    flags: u32,
    state: HState,
    stack: StackId,
    seg_stack: StackId,
}

/// Host cache statistics (PyTorch's host allocator names).
#[derive(Debug, Clone, Default)]
pub struct HostStats {
    pub allocation: Stat,
    pub segment: Stat,
    pub allocated_bytes: Stat,
    pub reserved_bytes: Stat,
    pub num_host_alloc: i64,
    pub num_host_free: i64,
}

/// The locked pinned-memory cache.
pub struct HostCache {
    blocks: HashMap<DevPtr, HostBlock>,
    free: HashMap<(u32, u32), Vec<DevPtr>>,
    pending: Vec<DevPtr>,
    pub(crate) stats: HostStats,
    pub(crate) sink: Box<dyn EventSink>,
}

/// Power-of-two bucket size for a request.
pub fn bucket(size: u64) -> u64 {
    size.max(1).checked_next_power_of_two().unwrap_or(size)
}

impl HostCache {
    pub fn new(sink: Box<dyn EventSink>) -> HostCache {
        HostCache {
            blocks: HashMap::new(),
            free: HashMap::new(),
            pending: Vec::new(),
            stats: HostStats::default(),
            sink,
        }
    }

    fn record(&mut self, action: Action, addr: u64, size: u64, stack: StackId) {
        if self.sink.enabled() {
            self.sink.record(TraceEvent {
                action,
                device: -1,
                addr,
                size,
                stream: 0,
                time_us: now_us(),
                stack,
                device_free: 0,
                range: 0,
            });
        }
    }

    fn key(size: u64, flags: u32) -> (u32, u32) {
        (flags, size.trailing_zeros())
    }

    fn complete(&mut self, ptr: DevPtr) {
        if let Some(b) = self.blocks.get_mut(&ptr) {
            b.state = HState::Free;
            let (size, flags, stack) = (b.size, b.flags, b.stack);
            self.free
                .entry(Self::key(size, flags))
                .or_default()
                .push(ptr);
            self.record(Action::FreeCompleted, ptr, size, stack);
        }
    }

    /// Synchronize every device once and make every pending block reusable.
    fn drain_pending(&mut self, device: &dyn Device) {
        if self.pending.is_empty() {
            return;
        }
        for d in 0..device.device_count() {
            if device.synchronize_device(d as i32).is_err() {
                return;
            }
        }
        for p in std::mem::take(&mut self.pending) {
            self.complete(p);
        }
    }

    pub fn alloc(
        &mut self,
        device: &dyn Device,
        size: u64,
        flags: u32,
        stack: StackId,
    ) -> Result<DevPtr, AllocError> {
        if size == 0 {
            return Ok(0);
        }
        let bsize = bucket(size);
        let key = Self::key(bsize, flags);
        let mut hit = self.free.get_mut(&key).and_then(Vec::pop);
        if hit.is_none() && !self.pending.is_empty() {
            self.drain_pending(device);
            hit = self.free.get_mut(&key).and_then(Vec::pop);
        }
        let ptr = match hit {
            Some(p) => p,
            None => {
                let p = match device.host_alloc(bsize, flags) {
                    Ok(p) => p,
                    Err(DeviceError::OutOfMemory) => {
                        self.release_free(device);
                        device.host_alloc(bsize, flags).map_err(|e| match e {
                            DeviceError::OutOfMemory => AllocError::OutOfMemory,
                            other => AllocError::Device(other),
                        })?
                    }
                    Err(e) => return Err(AllocError::Device(e)),
                };
                self.blocks.insert(
                    p,
                    HostBlock {
                        size: bsize,
                        requested: 0,
                        flags,
                        state: HState::Free,
                        stack,
                        seg_stack: stack,
                    },
                );
                self.stats.segment.update(1);
                self.stats.reserved_bytes.update(bsize as i64);
                self.stats.num_host_alloc += 1;
                self.record(Action::SegmentAlloc, p, bsize, stack);
                p
            }
        };
        if let Some(b) = self.blocks.get_mut(&ptr) {
            b.state = HState::Allocated;
            b.requested = size;
            b.stack = stack;
        }
        self.stats.allocation.update(1);
        self.stats.allocated_bytes.update(bsize as i64);
        self.record(Action::Alloc, ptr, size, stack);
        Ok(ptr)
    }

    pub fn free(&mut self, mode: FreeSync, ptr: DevPtr, stack: StackId) -> Result<(), FreeError> {
        let Some(b) = self.blocks.get_mut(&ptr) else {
            return Err(FreeError::NotOurs);
        };
        if b.state != HState::Allocated {
            return Err(FreeError::InvalidValue);
        }
        let size = b.size;
        self.stats.allocation.update(-1);
        self.stats.allocated_bytes.update(-(size as i64));
        self.record(Action::FreeRequested, ptr, size, stack);
        if mode == FreeSync::None {
            self.complete(ptr);
        } else if let Some(b) = self.blocks.get_mut(&ptr) {
            b.state = HState::Pending;
            self.pending.push(ptr);
        }
        Ok(())
    }

    /// Give every cached free block back (`cuMemFreeHost`).
    pub fn release_free(&mut self, device: &dyn Device) {
        self.drain_pending(device);
        for (_, list) in self.free.iter_mut() {
            let mut keep = Vec::new();
            for p in list.drain(..) {
                if device.host_free(p).is_err() {
                    keep.push(p);
                    continue;
                }
                if let Some(b) = self.blocks.remove(&p) {
                    self.stats.segment.update(-1);
                    self.stats.reserved_bytes.update(-(b.size as i64));
                    self.stats.num_host_free += 1;
                    if self.sink.enabled() {
                        self.sink.record(TraceEvent {
                            action: Action::SegmentFree,
                            device: -1,
                            addr: p,
                            size: b.size,
                            stream: 0,
                            time_us: now_us(),
                            stack: b.seg_stack,
                            device_free: 0,
                            range: 0,
                        });
                    }
                }
            }
            *list = keep;
        }
    }

    /// Whether `ptr` is a block of this cache (any state).
    pub fn owns(&self, ptr: DevPtr) -> bool {
        self.blocks.contains_key(&ptr)
    }

    pub fn stats_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        let s = &self.stats;
        for (name, st) in [
            ("allocation", &s.allocation),
            ("segment", &s.segment),
            ("allocated_bytes", &s.allocated_bytes),
            ("reserved_bytes", &s.reserved_bytes),
        ] {
            m.insert(format!("{name}.current"), st.current);
            m.insert(format!("{name}.peak"), st.peak);
            m.insert(format!("{name}.allocated"), st.allocated);
            m.insert(format!("{name}.freed"), st.freed);
        }
        m.insert("num_host_alloc".into(), s.num_host_alloc);
        m.insert("num_host_free".into(), s.num_host_free);
        m
    }

    pub fn reset_peaks(&mut self) {
        let s = &mut self.stats;
        for st in [
            &mut s.allocation,
            &mut s.segment,
            &mut s.allocated_bytes,
            &mut s.reserved_bytes,
        ] {
            st.reset_peak();
        }
    }

    /// One segment per cached host block, in address order.
    pub fn segments_info(&self) -> Vec<SegmentInfo> {
        let mut v: Vec<SegmentInfo> = self
            .blocks
            .iter()
            .map(|(&addr, b)| {
                let state = match b.state {
                    HState::Allocated => BlockState::ActiveAllocated,
                    HState::Pending => BlockState::ActivePendingFree,
                    HState::Free => BlockState::Inactive,
                };
                let active = state != BlockState::Inactive;
                SegmentInfo {
                    device: -1,
                    address: addr,
                    total_size: b.size,
                    stream: 0,
                    is_large: b.size > super::rounding::SMALL_SIZE,
                    is_expandable: false,
                    pool_id: (0, 0),
                    stack: b.seg_stack,
                    blocks: vec![BlockInfo {
                        address: addr,
                        size: b.size,
                        requested_size: if active { b.requested } else { 0 },
                        state,
                        stack: if active { b.stack } else { 0 },
                    }],
                }
            })
            .collect();
        v.sort_by_key(|s| s.address);
        v
    }
}
