//! Allocations the program made that the cache does not serve, recorded as they happened:
//! every allocation in observing mode (`CUSHIM_MODE=observe`), and in cache mode the
//! families the cache never serves (virtual memory, managed, pitched, pools, host
//! registration).
//!
//! Policy: each live allocation is one segment holding one block of exactly its size (the
//! driver's range, not a cache's), so the viewer draws it as it draws a cached run; its
//! trace is `segment_alloc`+`alloc` when made and `free_requested`+`free_completed`+
//! `segment_free` when freed. A virtual-memory mapping is a segment at the mapped address
//! (`segment_map`+`alloc` / `free_requested`+`free_completed`+`segment_unmap`), while the
//! physical allocation behind it (`cuMemCreate`) is what occupies device memory, so the
//! bytes a device's records *explain* count live physical handles, never mappings (one
//! handle may be mapped twice), and a handle lives until it is released and unmapped
//! everywhere, as CUDA documents. Address reservations hold no memory: listed, not drawn.
//! A sleep-mode segment (`sleep`, `paused`) is recorded and forgotten silently: the sleep
//! cache records its segment and block events itself (`crate::sleep::arena`), and the
//! snapshot takes its blocks from there; only its pause and resume are recorded here.
//!
//! Invariant: one lock per call (the device's table, or the host's), taken after the real
//! call's stack was captured; the address map is the one lookup an observed call pays.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::addr_hash::AddrMap;
use super::info::{BlockInfo, BlockState, SegmentInfo};
use crate::trace::event::{Action, EventSink, StackId, TraceEvent};

/// What kind of allocation a record is (kept in the snapshot's segment as `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `cudaMalloc` / `cuMemAlloc_v2`.
    Malloc,
    /// `cudaMallocAsync` / `cuMemAllocAsync`.
    MallocAsync,
    /// `cudaMallocManaged` / `cuMemAllocManaged`.
    Managed,
    /// `cudaMalloc` / `cuMemAlloc_v2` served by sleep mode's arena (`crate::sleep`).
    Sleep,
    /// A sleep-mode allocation while paused: its address is kept, its device memory is not
    /// (so it counts toward no device figure).
    Paused,
    /// `cudaMallocPitch` / `cuMemAllocPitch_v2`.
    Pitched,
    /// `cudaMalloc3D`.
    Malloc3D,
    /// `cudaMallocFromPoolAsync` / `cuMemAllocFromPoolAsync`.
    Pool,
    /// A `cuMemMap` of a `cuMemCreate` handle.
    VmmMap,
    /// Pinned host memory (`cudaHostAlloc`, `cuMemHostAlloc`, ...).
    Pinned,
    /// `cudaHostRegister` / `cuMemHostRegister_v2`.
    HostRegister,
}

impl Kind {
    /// The name written as the segment's `kind`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc",
            Kind::MallocAsync => "malloc_async",
            Kind::Managed => "managed",
            Kind::Pitched => "pitched",
            Kind::Malloc3D => "malloc_3d",
            Kind::Pool => "pool",
            Kind::VmmMap => "vmm",
            Kind::Pinned => "pinned",
            Kind::HostRegister => "host_register",
            Kind::Sleep => "sleep",
            Kind::Paused => "paused",
        }
    }
}

/// One live observed allocation (or mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub size: u64,
    pub kind: Kind,
    /// The call's flags (managed attach flags, host flags, VMM handle for a mapping...).
    pub flags: u64,
    pub stream: u64,
    /// Stack of the call that made it.
    pub stack: StackId,
}

/// One observed segment as the snapshot writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedSegment {
    pub info: SegmentInfo,
    pub kind: &'static str,
    pub flags: u64,
}

/// A `cuMemCreate` handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Physical {
    pub size: u64,
    pub flags: u64,
    pub stack: StackId,
    pub released: bool,
    pub maps: u32,
}

struct Table {
    device: i32,
    live: AddrMap<Record>,
    phys: AddrMap<Physical>,
    reservations: AddrMap<(u64, StackId)>,
    sink: Box<dyn EventSink>,
    on: bool,
    /// Bytes of live records other than mappings.
    bytes: u64,
    phys_bytes: u64,
}

impl Table {
    fn new(device: i32, sink: Box<dyn EventSink>) -> Table {
        Table {
            device,
            live: AddrMap::default(),
            phys: AddrMap::default(),
            reservations: AddrMap::default(),
            on: sink.enabled(),
            sink,
            bytes: 0,
            phys_bytes: 0,
        }
    }

    fn emit(&mut self, action: Action, addr: u64, r: &Record, stack: StackId) {
        if self.on {
            self.sink.record(TraceEvent::now(
                action,
                self.device,
                addr,
                r.size,
                r.stream,
                stack,
            ));
        }
    }

    fn insert(&mut self, addr: u64, r: Record) {
        let silent = sleep_kind(r.kind);
        let first = if r.kind == Kind::VmmMap {
            Action::SegmentMap
        } else {
            if counted(r.kind) {
                self.bytes += r.size;
            }
            Action::SegmentAlloc
        };
        if !silent {
            self.emit(first, addr, &r, r.stack);
            self.emit(Action::Alloc, addr, &r, r.stack);
        }
        if let Some(old) = self.live.insert(addr, r) {
            // The driver handed out an address we still held: a free we never saw (made
            // before the shim, or through a path it does not intercept).
            if counted(old.kind) {
                self.bytes -= old.size;
            }
        }
    }

    fn remove(&mut self, addr: u64, stack: StackId) -> Option<Record> {
        let r = self.live.remove(&addr)?;
        let last = if r.kind == Kind::VmmMap {
            Action::SegmentUnmap
        } else {
            if counted(r.kind) {
                self.bytes -= r.size;
            }
            Action::SegmentFree
        };
        if !sleep_kind(r.kind) {
            self.emit(Action::FreeRequested, addr, &r, stack);
            self.emit(Action::FreeCompleted, addr, &r, stack);
            self.emit(last, addr, &r, stack);
        }
        Some(r)
    }

    /// Drop handle `h` if it was released and is mapped nowhere.
    fn settle_phys(&mut self, h: u64) {
        if let Some(p) = self.phys.get(&h) {
            if p.released && p.maps == 0 {
                self.phys_bytes -= p.size;
                self.phys.remove(&h);
            }
        }
    }
}

/// Whether a record is a sleep-mode segment (whose cache records its own events).
fn sleep_kind(kind: Kind) -> bool {
    kind == Kind::Sleep || kind == Kind::Paused
}

/// Whether a record's bytes are device (or host) memory held now: not a mapping (its
/// handle counts) and not a paused sleep-mode allocation.
fn counted(kind: Kind) -> bool {
    kind != Kind::VmmMap && kind != Kind::Paused
}

/// Every observed allocation of a process: one table per device and one for host memory.
pub struct ObservedTable {
    devs: Vec<Mutex<Table>>,
    host: Mutex<Table>,
}

/// A device's live physical handles `(handle, state)` and reservations `(address, size)`.
pub type VmmListing = (Vec<(u64, Physical)>, Vec<(u64, u64)>);

/// What a device's observed records explain, for the unexplained-memory figure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explained {
    /// Bytes of live allocations other than mappings, by kind name.
    pub by_kind: Vec<(&'static str, u64)>,
    /// Bytes of live `cuMemCreate` handles.
    pub physical: u64,
}

impl Explained {
    pub fn total(&self) -> u64 {
        self.by_kind.iter().map(|k| k.1).sum::<u64>() + self.physical
    }
}

/// `m`, locked (a panic while it was held leaves the table as it was: still usable).
fn locked(m: &Mutex<Table>) -> MutexGuard<'_, Table> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every table's lock, held across `fork` (see [`ObservedTable::hold_for_fork`]); dropping
/// it releases them.
pub struct ObservedHold<'a> {
    _held: Vec<MutexGuard<'a, Table>>,
}

impl ObservedTable {
    /// Take every table's lock, devices in ordinal order then the host's (before `fork`, so
    /// the child inherits tables no thread is inside). A table's lock is a leaf: nothing
    /// else is locked while one is held, and at most one is held at a time, so this may come
    /// anywhere in the fork order. The locks are std mutexes (futexes): a child unlocking
    /// one touches no global state a vanished parent thread could have held.
    pub fn hold_for_fork(&self) -> ObservedHold<'_> {
        ObservedHold {
            _held: self
                .devs
                .iter()
                .chain([&self.host])
                .map(|m| locked(m))
                .collect(),
        }
    }

    /// Tables for `devices` devices; `make_sink(d)` as for the caching allocator (`-1`: host).
    pub fn new(devices: usize, make_sink: &dyn Fn(i32) -> Box<dyn EventSink>) -> ObservedTable {
        ObservedTable {
            devs: (0..devices.max(1) as i32)
                .map(|d| Mutex::new(Table::new(d, make_sink(d))))
                .collect(),
            host: Mutex::new(Table::new(-1, make_sink(-1))),
        }
    }

    fn table(&self, dev: i32) -> &Mutex<Table> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devs.get(d))
            .unwrap_or(&self.host)
    }

    /// The tables to search for an address freed on `hint` first, then the others.
    fn search(&self, hint: i32) -> impl Iterator<Item = &Mutex<Table>> {
        let first = usize::try_from(hint).ok().filter(|&d| d < self.devs.len());
        first.map(|d| &self.devs[d]).into_iter().chain(
            self.devs
                .iter()
                .enumerate()
                .filter(move |(i, _)| Some(*i) != first)
                .map(|(_, t)| t),
        )
    }

    /// Record an allocation at `addr` on device `dev` (`-1`: host memory).
    pub fn alloc(&self, dev: i32, addr: u64, r: Record) {
        locked(self.table(dev)).insert(addr, r);
    }

    /// Whether a device allocation at `addr` is recorded (searching `hint` first): a free's
    /// stack is worth capturing only then (the tables' locks are leaves, so the capture,
    /// which interns, happens between this and [`Self::free`], never under a lock).
    pub fn holds(&self, addr: u64, hint: i32) -> bool {
        self.search(hint)
            .any(|t| locked(t).live.contains_key(&addr))
    }

    /// Whether a host allocation at `addr` is recorded.
    pub fn holds_host(&self, addr: u64) -> bool {
        locked(&self.host).live.contains_key(&addr)
    }

    /// Forget the device allocation at `addr` (searching `hint` first); `None` if unknown.
    pub fn free(&self, addr: u64, hint: i32, stack: StackId) -> Option<(i32, Record)> {
        self.search(hint).find_map(|t| {
            let mut t = locked(t);
            let d = t.device;
            t.remove(addr, stack).map(|r| (d, r))
        })
    }

    /// Forget the host allocation at `addr`.
    pub fn host_free(&self, addr: u64, stack: StackId) -> Option<Record> {
        locked(&self.host).remove(addr, stack)
    }

    /// Change the kind of the allocation at `addr` on `dev` (a sleep-mode pause or resume),
    /// recording `action` for it with `stack`.
    pub fn set_kind(&self, dev: i32, addr: u64, kind: Kind, action: Action, stack: StackId) {
        let mut t = locked(self.table(dev));
        let Some(r) = t.live.get(&addr).copied() else {
            return;
        };
        if counted(r.kind) && !counted(kind) {
            t.bytes -= r.size;
        } else if !counted(r.kind) && counted(kind) {
            t.bytes += r.size;
        }
        t.live.insert(addr, Record { kind, ..r });
        t.emit(action, addr, &r, stack);
    }

    /// Put back a record whose real free failed (no events: the free never happened).
    pub fn restore(&self, dev: i32, addr: u64, r: Record) {
        let mut t = locked(self.table(dev));
        if counted(r.kind) {
            t.bytes += r.size;
        }
        t.live.insert(addr, r);
    }

    /// `cudaDeviceReset` of `dev`: every allocation of the device is gone (free events
    /// recorded with `stack`). VMM handles and mappings stay, as simcuda keeps them.
    pub fn device_reset(&self, dev: i32, stack: StackId) {
        if dev < 0 {
            return;
        }
        let mut t = locked(self.table(dev));
        let addrs: Vec<u64> = t
            .live
            .iter()
            .filter(|(_, r)| r.kind != Kind::VmmMap)
            .map(|(&a, _)| a)
            .collect();
        for a in addrs {
            t.remove(a, stack);
        }
    }

    /// `cuMemCreate` made handle `h` on `dev`.
    pub fn create(&self, dev: i32, h: u64, size: u64, flags: u64, stack: StackId) {
        let mut t = locked(self.table(dev));
        let p = Physical {
            size,
            flags,
            stack,
            released: false,
            maps: 0,
        };
        t.phys_bytes += size;
        if let Some(old) = t.phys.insert(h, p) {
            t.phys_bytes -= old.size;
        }
    }

    /// `cuMemRelease(h)`.
    pub fn release(&self, h: u64) {
        for t in &self.devs {
            let mut t = locked(t);
            if let Some(p) = t.phys.get_mut(&h) {
                p.released = true;
                t.settle_phys(h);
                return;
            }
        }
    }

    /// `cuMemMap(addr, size, _, h)`: a mapping segment on the handle's device. The segment's
    /// stack is the map's; the handle's creation stack is kept for its block.
    pub fn map(&self, addr: u64, size: u64, h: u64, stack: StackId) {
        for t in &self.devs {
            let mut t = locked(t);
            if let Some(p) = t.phys.get_mut(&h) {
                p.maps += 1;
                let r = Record {
                    size,
                    kind: Kind::VmmMap,
                    flags: h,
                    stream: 0,
                    stack,
                };
                t.insert(addr, r);
                return;
            }
        }
    }

    /// `cuMemUnmap(addr, size)`: every mapping starting in the range goes.
    pub fn unmap(&self, addr: u64, size: u64, stack: StackId) {
        for t in &self.devs {
            let mut t = locked(t);
            let starts: Vec<u64> = t
                .live
                .iter()
                .filter(|(&a, r)| r.kind == Kind::VmmMap && a >= addr && a < addr + size)
                .map(|(&a, _)| a)
                .collect();
            for a in starts {
                if let Some(r) = t.remove(a, stack) {
                    if let Some(p) = t.phys.get_mut(&r.flags) {
                        p.maps = p.maps.saturating_sub(1);
                    }
                    t.settle_phys(r.flags);
                }
            }
        }
    }

    /// `cuMemAddressReserve` on `dev`.
    pub fn reserve(&self, dev: i32, addr: u64, size: u64, stack: StackId) {
        locked(self.table(dev))
            .reservations
            .insert(addr, (size, stack));
    }

    /// `cuMemAddressFree(addr)`.
    pub fn address_free(&self, addr: u64) {
        for t in &self.devs {
            if locked(t).reservations.remove(&addr).is_some() {
                return;
            }
        }
    }

    /// The segments of device `dev` (`-1`: host) and its events, oldest first.
    pub fn snapshot(&self, dev: i32) -> (Vec<ObservedSegment>, Vec<TraceEvent>) {
        let t = locked(self.table(dev));
        let mut segs: Vec<ObservedSegment> = t
            .live
            .iter()
            .map(|(&addr, r)| {
                let block_stack = match r.kind {
                    Kind::VmmMap => t.phys.get(&r.flags).map_or(r.stack, |p| p.stack),
                    _ => r.stack,
                };
                ObservedSegment {
                    info: SegmentInfo {
                        device: t.device,
                        address: addr,
                        total_size: r.size,
                        stream: r.stream,
                        is_large: r.size > super::rounding::SMALL_SIZE,
                        is_expandable: r.kind == Kind::VmmMap,
                        pool_id: (0, 0),
                        stack: r.stack,
                        blocks: vec![BlockInfo {
                            address: addr,
                            size: r.size,
                            requested_size: r.size,
                            state: BlockState::ActiveAllocated,
                            stack: block_stack,
                        }],
                    },
                    kind: r.kind.name(),
                    flags: r.flags,
                }
            })
            .collect();
        segs.sort_by_key(|s| s.info.address);
        (segs, t.sink.events())
    }

    /// What device `dev`'s records explain.
    pub fn explained(&self, dev: i32) -> Explained {
        let t = locked(self.table(dev));
        let mut by_kind: Vec<(&'static str, u64)> = Vec::new();
        for r in t.live.values().filter(|r| counted(r.kind)) {
            match by_kind.iter_mut().find(|k| k.0 == r.kind.name()) {
                Some(k) => k.1 += r.size,
                None => by_kind.push((r.kind.name(), r.size)),
            }
        }
        by_kind.sort_unstable();
        debug_assert_eq!(by_kind.iter().map(|k| k.1).sum::<u64>(), t.bytes);
        Explained {
            by_kind,
            physical: t.phys_bytes,
        }
    }

    /// Device `dev`'s live physical handles and reservations, for the snapshot's `cushim`
    /// key: `(handle, size, flags, mapped count, released)` and `(address, size)`.
    pub fn vmm(&self, dev: i32) -> VmmListing {
        let t = locked(self.table(dev));
        let mut p: Vec<(u64, Physical)> = t.phys.iter().map(|(&h, p)| (h, *p)).collect();
        p.sort_by_key(|x| x.0);
        let mut r: Vec<(u64, u64)> = t.reservations.iter().map(|(&a, s)| (a, s.0)).collect();
        r.sort_unstable();
        (p, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::history::parse;
    use crate::trace::ring::TraceRing;

    fn table(history: &str) -> ObservedTable {
        let conf = parse(history).expect("history");
        ObservedTable::new(2, &|d| {
            if d < 0 {
                Box::new(TraceRing::for_host(&conf))
            } else {
                Box::new(TraceRing::for_device(&conf))
            }
        })
    }

    fn rec(size: u64, kind: Kind) -> Record {
        Record {
            size,
            kind,
            flags: 0,
            stream: 0,
            stack: 0,
        }
    }

    #[test]
    fn each_allocation_is_one_segment_of_one_block_with_pytorch_events() {
        let t = table("enabled=all");
        t.alloc(1, 0x1000, rec(3000, Kind::Malloc));
        t.alloc(1, 0x9000, rec(512, Kind::Managed));
        let (segs, evs) = t.snapshot(1);
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].info.total_size, 3000);
        assert_eq!(segs[0].info.blocks.len(), 1);
        assert_eq!(segs[0].info.blocks[0].size, 3000);
        assert_eq!(segs[1].kind, "managed");
        let acts: Vec<Action> = evs.iter().map(|e| e.action).collect();
        use Action::*;
        assert_eq!(acts, [SegmentAlloc, Alloc, SegmentAlloc, Alloc]);
        assert_eq!(t.free(0x1000, 0, 0).map(|x| x.0), Some(1));
        let (segs, evs) = t.snapshot(1);
        assert_eq!(segs.len(), 1);
        let acts: Vec<Action> = evs.iter().skip(4).map(|e| e.action).collect();
        assert_eq!(acts, [FreeRequested, FreeCompleted, SegmentFree]);
        assert!(t.free(0x1000, 1, 0).is_none());
        assert_eq!(t.explained(1).total(), 512);
    }

    #[test]
    fn physical_memory_is_explained_until_released_and_unmapped() {
        let t = table("enabled=all");
        t.create(0, 77, 4 << 20, 0, 0);
        t.reserve(0, 0x10_0000_0000, 64 << 20, 0);
        t.map(0x10_0000_0000, 4 << 20, 77, 0);
        t.map(0x10_0040_0000, 4 << 20, 77, 0);
        assert_eq!(t.explained(0).physical, 4 << 20);
        assert_eq!(t.snapshot(0).0.len(), 2);
        t.release(77);
        assert_eq!(t.explained(0).physical, 4 << 20, "still mapped");
        t.unmap(0x10_0000_0000, 8 << 20, 0);
        assert_eq!(t.explained(0).physical, 0);
        assert!(t.snapshot(0).0.is_empty());
        let acts: Vec<Action> = t.snapshot(0).1.iter().map(|e| e.action).collect();
        assert_eq!(acts.iter().filter(|a| **a == Action::SegmentMap).count(), 2);
        assert_eq!(
            acts.iter().filter(|a| **a == Action::SegmentUnmap).count(),
            2
        );
        assert_eq!(t.vmm(0).1.len(), 1);
        t.address_free(0x10_0000_0000);
        assert!(t.vmm(0).1.is_empty());
    }

    #[test]
    fn a_device_reset_frees_the_devices_allocations_but_not_its_mappings() {
        let t = table("enabled=all");
        t.alloc(0, 0x1000, rec(512, Kind::Managed));
        t.alloc(1, 0x9000, rec(512, Kind::Malloc));
        t.create(0, 5, 2 << 20, 0, 0);
        t.map(0x10_0000_0000, 2 << 20, 5, 0);
        t.device_reset(0, 0);
        let (segs, evs) = t.snapshot(0);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].kind, "vmm");
        assert_eq!(evs.last().map(|e| e.action), Some(Action::SegmentFree));
        assert_eq!(t.snapshot(1).0.len(), 1, "other devices keep theirs");
        assert_eq!(t.explained(0).total(), 2 << 20);
    }

    #[test]
    fn without_history_segments_are_kept_and_no_event_is() {
        let t = table("enabled=state");
        t.alloc(0, 0x2000, rec(100, Kind::Pool));
        t.alloc(-1, 0x3000, rec(100, Kind::HostRegister));
        assert_eq!(t.snapshot(0).0.len(), 1);
        assert!(t.snapshot(0).1.is_empty());
        assert_eq!(t.snapshot(-1).0[0].kind, "host_register");
        assert!(t.host_free(0x3000, 0).is_some());
    }
}
