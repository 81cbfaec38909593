//! Expandable segments: one virtual reservation per (stream, pool kind) on this device,
//! grown and shrunk by mapping physical pages.
//!
//! Invariant: a reservation's block chain covers the whole reservation; bytes with a page
//! behind them are in `Free`/`Allocated`/`Pending` blocks, bytes without one are in
//! `Unmapped` blocks, and every page boundary is a multiple of the granularity. A page is
//! unmapped only when a single `Free` block covers it whole (so its pending frees completed)
//! and after the reservation's stream was synchronized. A growth either maps everything it
//! planned or leaves no page of its own mapped or created.
//!
//! Growth (in our words): among the runs of free and unmapped blocks big enough for the
//! request, the start needing the fewest new mapped bytes wins (lowest address on ties).
//! The shortfall, rounded to the granularity, is mapped as pages of at most 2 MiB (small
//! pool) or 20 MiB (large pool) with a smaller last page. Before creating physical memory,
//! whole free pages are taken out of holes in the reservations of the growth's own stream
//! when that stream is idle (unmapped there, mapped where the growth needs them: a handle
//! can be mapped anywhere). Pages of a busy or another stream's reservation are taken only
//! when the growth fails without them (creating memory failed or would exceed the allowed
//! fraction), after synchronizing their stream: the step before out-of-memory, not a first
//! choice.
//!
//! PyTorch's own plan, which the offline replay models (`AllocConf::expandable_fixed_pages`):
//! every page is exactly 2 MiB (small pool) or 20 MiB (large pool), at a multiple of that
//! size from the reservation's base, so a growth maps its shortfall rounded up to whole
//! pages; pages are never taken from another hole or reservation (PyTorch unmaps free
//! pages only when it releases its cache, and maps new ones for every growth).
//!
//! A growth maps its pages one by one, then sets access (read-write for this device and
//! its peers) with one call per run of pages side by side, not one per page: the access
//! call is the dearest of the three, and CUDA takes a range holding several mappings (as
//! PyTorch's expandable segments do, one call over the growth's range).

use std::collections::BTreeMap;
use std::io::Write;

use super::block::{Block, BlockId, State};
use super::caching::{Ctx, DeviceState};
use super::release_retry::{report_once, Unreleased, IMMEDIATE_TRIES};
use super::rounding::round_up;
use crate::device::{DevPtr, PhysHandle, Stream};
use crate::trace::event::{Action, StackId};

/// Largest page of the small pool.
pub const SMALL_PAGE: u64 = 2 << 20;
/// Largest page of the large pool.
pub const LARGE_PAGE: u64 = 20 << 20;

/// One mapped physical page.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Page {
    pub size: u64,
    pub handle: PhysHandle,
    pub stack: StackId,
}

/// One virtual reservation.
pub(crate) struct Reservation {
    pub base: DevPtr,
    pub size: u64,
    pub stream: Stream,
    pub large: bool,
    pub head: BlockId,
    pub pages: BTreeMap<DevPtr, Page>,
}

/// The expandable-segment state of one device.
pub struct Expandable {
    wanted: bool,
    /// PyTorch's page plan (`AllocConf::expandable_fixed_pages`).
    fixed: bool,
    off: bool,
    pub(crate) list: Vec<Reservation>,
    gran: u64,
    /// Handles unmapped but not yet released (`release_retry.rs`).
    pub(crate) unreleased: Unreleased,
}

impl Expandable {
    pub fn new(wanted: bool, fixed: bool) -> Expandable {
        Expandable {
            wanted,
            fixed,
            off: false,
            list: Vec::new(),
            gran: 0,
            unreleased: Unreleased::default(),
        }
    }

    /// Whether growth goes through reservations.
    pub fn enabled(&self) -> bool {
        self.wanted && !self.off
    }
}

/// A range to map: (address, length, end of the unmapped block holding it).
type MapRange = (u64, u64, u64);

/// One planned mapping of a growth.
struct Planned {
    addr: DevPtr,
    size: u64,
    /// A page taken from a hole (reservation index, address), or `None` for a new one.
    donor: Option<(u32, DevPtr)>,
}

/// Fill `ranges` with pages: a donor page that fits the room (the smallest one covering the
/// rest of the range, else the largest one within it), otherwise a new page of at most
/// `max_page` bytes.
fn plan_pages(
    ranges: &[MapRange],
    mut donors: Vec<(u32, DevPtr, u64)>,
    max_page: u64,
) -> Vec<Planned> {
    let mut plan = Vec::new();
    for &(from, len, room_end) in ranges {
        let mut cursor = from;
        let need_end = from + len;
        while cursor < need_end {
            let need = need_end - cursor;
            let room = room_end - cursor;
            let covering = donors
                .iter()
                .enumerate()
                .filter(|(_, d)| d.2 <= room && d.2 >= need)
                .min_by_key(|(_, d)| d.2)
                .map(|(i, _)| i);
            let pick = covering.or_else(|| {
                donors
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| d.2 <= need)
                    .max_by_key(|(_, d)| d.2)
                    .map(|(i, _)| i)
            });
            let (size, donor) = match pick {
                Some(i) => {
                    let (d, a, s) = donors.swap_remove(i);
                    (s, Some((d, a)))
                }
                None => (need.min(max_page), None),
            };
            plan.push(Planned {
                addr: cursor,
                size,
                donor,
            });
            cursor += size;
        }
    }
    plan
}

impl DeviceState {
    fn max_page(&self, large: bool) -> u64 {
        round_up(if large { LARGE_PAGE } else { SMALL_PAGE }, self.exp.gran)
    }

    /// The reservation for (stream, pool kind), made on first use. `None` means expandable
    /// segments are unavailable here (reported once; ordinary segments from now on).
    pub(crate) fn ensure_reservation(
        &mut self,
        ctx: &Ctx,
        stream: Stream,
        large: bool,
    ) -> Option<u32> {
        if let Some(i) = self
            .exp
            .list
            .iter()
            .position(|r| r.stream == stream && r.large == large)
        {
            return Some(i as u32);
        }
        let why = if !ctx.device.vmm_supported(self.dev) {
            Some("the device does not support virtual memory management".to_string())
        } else {
            let gran = ctx.device.granularity(self.dev).max(1);
            self.exp.gran = gran;
            let total = self.total_memory(ctx.device);
            let size = round_up(total + total / 8, gran);
            let reserved = if total == 0 {
                Err(crate::device::DeviceError::Driver(0))
            } else {
                ctx.device.reserve(self.dev, size)
            };
            match reserved {
                Ok(base) => {
                    let mut b = Block::new(base, size, stream, large, State::Unmapped);
                    let idx = self.exp.list.len() as u32;
                    b.res = Some(idx);
                    let head = self.blocks.insert(b);
                    self.exp.list.push(Reservation {
                        base,
                        size,
                        stream,
                        large,
                        head,
                        pages: BTreeMap::new(),
                    });
                    return Some(idx);
                }
                Err(e) if total == 0 => Some(format!("the device size is unknown ({e})")),
                Err(e) => Some(format!(
                    "reserving {size} bytes of address space failed ({e})"
                )),
            }
        };
        if let Some(why) = why {
            let _ = writeln!(
                std::io::stderr(),
                "cushim: expandable segments unavailable on device {}: {why}; using ordinary segments",
                self.dev
            );
        }
        self.exp.off = true;
        None
    }

    /// The block of reservation `r` containing `addr` (inside the reservation).
    fn block_at(&self, r: u32, addr: DevPtr) -> BlockId {
        self.blocks
            .find(addr)
            .unwrap_or(self.exp.list[r as usize].head)
    }

    /// Turn `[addr, addr+len)`, inside the single block `id` (state `Free` or `Unmapped`),
    /// into state `to`, splitting and re-merging as needed.
    fn carve(&mut self, id: BlockId, addr: DevPtr, len: u64, to: State) {
        let from = self.blocks[id].state;
        if from == State::Free {
            self.pool_remove(id);
        }
        let mut mid = id;
        let mut pieces = Vec::with_capacity(2);
        if addr > self.blocks[id].addr {
            mid = self.blocks.split(id, addr - self.blocks[id].addr);
            pieces.push(id);
        }
        if self.blocks[mid].size > len {
            let tail = self.blocks.split(mid, len);
            pieces.push(tail);
        }
        if from == State::Free {
            for p in pieces {
                self.pool_insert(p);
            }
        }
        self.blocks[mid].state = to;
        if to == State::Free {
            self.merge_and_pool(mid);
        } else {
            let mut m = mid;
            if let Some(p) = self.blocks[m].prev {
                if self.blocks[p].state == State::Unmapped {
                    self.blocks.absorb_next(p);
                    m = p;
                }
            }
            if let Some(n) = self.blocks[m].next {
                if self.blocks[n].state == State::Unmapped {
                    self.blocks.absorb_next(m);
                }
            }
        }
    }

    /// Whole free pages of reservation `r`, excluding those overlapping `[lo, hi)`.
    fn free_pages(&self, r: u32, lo: u64, hi: u64) -> Vec<(DevPtr, u64)> {
        let res = &self.exp.list[r as usize];
        let mut out = Vec::new();
        for (&pa, p) in &res.pages {
            if pa < hi && pa + p.size > lo {
                continue;
            }
            let Some(id) = self.blocks.find(pa) else {
                continue;
            };
            let b = &self.blocks[id];
            if b.state == State::Free && pa + p.size <= b.end() {
                out.push((pa, p.size));
            }
        }
        out
    }

    /// Unmap one whole free page of `r` (the stream must already be synchronized); the
    /// handle is returned still alive. Records `segment_unmap`.
    fn unmap_page(&mut self, ctx: &Ctx, r: u32, addr: DevPtr) -> Option<PhysHandle> {
        let page = *self.exp.list[r as usize].pages.get(&addr)?;
        if let Err(e) = ctx.device.unmap(self.dev, addr, page.size) {
            report_once("cuMemUnmap", self.dev, &e);
            return None;
        }
        self.exp.list[r as usize].pages.remove(&addr);
        let id = self.block_at(r, addr);
        self.carve(id, addr, page.size, State::Unmapped);
        let (large, stream) = {
            let res = &self.exp.list[r as usize];
            (res.large, res.stream)
        };
        self.stats.reserved_bytes.update(large, -(page.size as i64));
        self.stats.segment.update(large, -1);
        self.stats.num_device_free += 1;
        self.record(Action::SegmentUnmap, addr, page.size, stream, page.stack);
        Some(page.handle)
    }

    /// Runs of consecutive `Free`/`Unmapped` blocks of `r` that hold some unmapped space and
    /// at least `rounded` bytes, as (addr, end, state) lists.
    fn runs(&self, r: u32, rounded: u64) -> Vec<Vec<(u64, u64, State)>> {
        let res = &self.exp.list[r as usize];
        // Every unmapped block starts at the reservation base or where a page ends.
        let mut seeds: Vec<DevPtr> = vec![res.base];
        seeds.extend(res.pages.iter().map(|(&a, p)| a + p.size));
        let mut runs: Vec<Vec<(u64, u64, State)>> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for at in seeds {
            if at >= res.base + res.size {
                continue;
            }
            let Some(id) = self.blocks.find(at) else {
                continue;
            };
            if self.blocks[id].state != State::Unmapped {
                continue;
            }
            let mut first = id;
            while let Some(p) = self.blocks[first].prev {
                if !matches!(self.blocks[p].state, State::Free | State::Unmapped) {
                    break;
                }
                first = p;
            }
            if !seen.insert(self.blocks[first].addr) {
                continue;
            }
            let mut run = Vec::new();
            let mut cur = Some(first);
            while let Some(c) = cur {
                let b = &self.blocks[c];
                if !matches!(b.state, State::Free | State::Unmapped) {
                    break;
                }
                run.push((b.addr, b.end(), b.state));
                cur = b.next;
            }
            if run[run.len() - 1].1 - run[0].0 >= rounded {
                runs.push(run);
            }
        }
        runs
    }

    /// Choose where a request of `rounded` bytes goes in `r` and plan its pages: the start
    /// needing the fewest new physical bytes wins, then the fewest mapped bytes, then the
    /// lowest address. `donors` are the device's whole free pages.
    fn plan(
        &self,
        r: u32,
        rounded: u64,
        donors: &[(u32, DevPtr, u64)],
    ) -> Option<(u64, Vec<Planned>)> {
        let gran = self.exp.gran;
        let max_page = self.max_page(self.exp.list[r as usize].large);
        let mut best: Option<((u64, u64, u64), Vec<Planned>)> = None;
        for run in self.runs(r, rounded) {
            let (lo, hi) = (run[0].0, run[run.len() - 1].1);
            let mut starts: Vec<u64> = run.iter().map(|x| x.0).collect();
            starts.extend(
                run.iter()
                    .filter(|x| x.2 == State::Free && x.1 >= lo + rounded)
                    .map(|x| x.1 - rounded),
            );
            for start in starts {
                let end = start + rounded;
                if start < lo || end > hi {
                    continue;
                }
                // Cushim's pages start at any granule; PyTorch's at whole pages from the
                // reservation's base.
                let (unit, base) = if self.exp.fixed {
                    (max_page, self.exp.list[r as usize].base)
                } else {
                    (gran, 0)
                };
                let ranges: Vec<MapRange> = run
                    .iter()
                    .filter(|&&(a, e, s)| s == State::Unmapped && a < end && e > start)
                    .map(|&(a, e, _)| {
                        let from = (base + (start.max(a) - base) / unit * unit).max(a);
                        let to = (base + round_up(end.min(e) - base, unit)).min(e);
                        (from, to - from, e)
                    })
                    .collect();
                let usable: Vec<(u32, DevPtr, u64)> = donors
                    .iter()
                    .copied()
                    .filter(|&(d, a, sz)| !(d == r && a < end && a + sz > start))
                    .collect();
                let plan = plan_pages(&ranges, usable, max_page);
                let new: u64 = plan
                    .iter()
                    .filter(|p| p.donor.is_none())
                    .map(|p| p.size)
                    .sum();
                let mapped: u64 = plan.iter().map(|p| p.size).sum();
                let score = (new, mapped, start);
                let better = match &best {
                    None => true,
                    Some((bs, _)) => score < *bs,
                };
                if better {
                    best = Some((score, plan));
                }
            }
        }
        best.map(|((_, _, start), plan)| (start, plan))
    }

    /// Grow reservation `r` so that a free block starts at the chosen address with at least
    /// `rounded` bytes; returns that block (not in a pool), or `None` (out of memory, with
    /// everything this growth did undone).
    pub(crate) fn expandable_grow(
        &mut self,
        ctx: &Ctx,
        r: u32,
        rounded: u64,
        stack: StackId,
    ) -> Option<BlockId> {
        // Without memory pressure, only pages of the growth's own stream, and only while
        // that stream is idle (nothing queued can touch them: no CPU wait). Taking a page
        // from a busy stream means synchronizing it, and another stream's pages are memory
        // it will likely want back (with two streams in turn, every switch moved pages and
        // synchronized a stream: BENCHMARKS.md, "Measurements behind design choices"). So
        // those are taken only when the growth fails without them (creating memory failed
        // or would exceed the allowed fraction), own stream's first.
        if self.exp.fixed {
            return self.grow_with(ctx, r, rounded, stack, &[], false);
        }
        let stream = self.exp.list[r as usize].stream;
        let same = |d: u32| self.exp.list[d as usize].stream == stream;
        let mut all: Vec<(u32, DevPtr, u64)> = Vec::new();
        for d in 0..self.exp.list.len() as u32 {
            all.extend(
                self.free_pages(d, 0, 0)
                    .into_iter()
                    .map(|(a, size)| (d, a, size)),
            );
        }
        // The stream is asked whether it is idle only when it has free pages to give.
        let idle = || {
            !ctx.device.stream_is_capturing(self.dev, stream)
                && ctx.device.stream_idle(self.dev, stream).unwrap_or(false)
        };
        let own: Vec<(u32, DevPtr, u64)> = if all.iter().any(|p| same(p.0)) && idle() {
            all.iter().copied().filter(|p| same(p.0)).collect()
        } else {
            Vec::new()
        };
        if let Some(id) = self.grow_with(ctx, r, rounded, stack, &own, false) {
            return Some(id);
        }
        if all.len() == own.len() {
            return None;
        }
        // Own stream's pages first: `plan` prefers, among equal new bytes, the fewest mapped
        // bytes; order the donors so that the own stream's come first.
        all.sort_by_key(|&(d, _, _)| self.exp.list[d as usize].stream != stream);
        self.grow_with(ctx, r, rounded, stack, &all, true)
    }

    /// [`Self::expandable_grow`] taking pages only from `donors`; with `sync`, each donor
    /// reservation's stream is synchronized first (without, the donors are idle already).
    fn grow_with(
        &mut self,
        ctx: &Ctx,
        r: u32,
        rounded: u64,
        stack: StackId,
        donors: &[(u32, DevPtr, u64)],
        sync: bool,
    ) -> Option<BlockId> {
        let (start, plan) = self.plan(r, rounded, donors)?;
        let large = self.exp.list[r as usize].large;
        // Moved pages keep the reservation constant; only new pages count against the limit.
        let new_bytes: u64 = plan
            .iter()
            .filter(|p| p.donor.is_none())
            .map(|p| p.size)
            .sum();
        if new_bytes > 0 && !self.within_fraction(ctx, new_bytes) {
            return None;
        }
        // 1. Create the new physical pages.
        let mut handles: Vec<Option<PhysHandle>> = Vec::with_capacity(plan.len());
        let mut failed = false;
        for p in &plan {
            if p.donor.is_some() {
                handles.push(None);
                continue;
            }
            match ctx.device.create_physical(self.dev, p.size) {
                Ok(h) => handles.push(Some(h)),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            for h in handles.into_iter().flatten() {
                self.exp.unreleased.release(ctx, self.dev, h);
            }
            return None;
        }
        // 2. Take the donor pages out of their holes (after synchronizing their streams).
        let mut synced: Vec<u32> = Vec::new();
        for (i, p) in plan.iter().enumerate() {
            let Some((d, a)) = p.donor else { continue };
            if sync && !synced.contains(&d) {
                if !self.sync_reservation(ctx, d) {
                    failed = true;
                    break;
                }
                synced.push(d);
            }
            match self.unmap_page(ctx, d, a) {
                Some(h) => handles[i] = Some(h),
                None => {
                    failed = true;
                    break;
                }
            }
        }
        // 3. Map everything at the target, then make each run of pages side by side
        // accessible with one call.
        let mut mapped = 0;
        if !failed {
            for (i, p) in plan.iter().enumerate() {
                let Some(h) = handles[i] else { break };
                if ctx.device.map(self.dev, p.addr, p.size, h).is_err() {
                    failed = true;
                    break;
                }
                mapped += 1;
            }
        }
        if !failed {
            let mut i = 0;
            while i < plan.len() {
                let from = plan[i].addr;
                let mut end = from + plan[i].size;
                i += 1;
                while i < plan.len() && plan[i].addr == end {
                    end += plan[i].size;
                    i += 1;
                }
                if ctx.device.set_access(self.dev, from, end - from).is_err() {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            for p in plan.iter().take(mapped) {
                // A handle still mapped cannot be released: retry a transient failure.
                for _ in 0..IMMEDIATE_TRIES {
                    if ctx.device.unmap(self.dev, p.addr, p.size).is_ok() {
                        break;
                    }
                }
            }
            for h in handles.into_iter().flatten() {
                self.exp.unreleased.release(ctx, self.dev, h);
            }
            return None;
        }
        // 4. Bookkeeping of the new mappings.
        let stream = self.exp.list[r as usize].stream;
        for (i, p) in plan.iter().enumerate() {
            let Some(handle) = handles[i] else { continue };
            self.exp.list[r as usize].pages.insert(
                p.addr,
                Page {
                    size: p.size,
                    handle,
                    stack,
                },
            );
            let id = self.block_at(r, p.addr);
            self.carve(id, p.addr, p.size, State::Free);
            self.stats.reserved_bytes.update(large, p.size as i64);
            self.stats.segment.update(large, 1);
            self.stats.num_device_alloc += 1;
            self.record(Action::SegmentMap, p.addr, p.size, stream, stack);
        }
        // 5. The free block starting at `start`.
        let mut id = self.block_at(r, start);
        self.pool_remove(id);
        if self.blocks[id].addr < start {
            let off = start - self.blocks[id].addr;
            let tail = self.blocks.split(id, off);
            self.pool_insert(id);
            id = tail;
        }
        debug_assert!(self.blocks[id].state == State::Free && self.blocks[id].size >= rounded);
        Some(id)
    }

    /// Wait for the work queued on reservation `r`'s stream (the whole device if that
    /// stream is gone), so that none of it can touch a page about to be unmapped.
    fn sync_reservation(&self, ctx: &Ctx, r: u32) -> bool {
        let s = self.exp.list[r as usize].stream;
        ctx.device.synchronize_stream(self.dev, s).is_ok()
            || ctx.device.synchronize_device(self.dev).is_ok()
    }

    /// Unmap and release whole free pages, in address order, until `target` bytes (all of
    /// them with `u64::MAX`). Returns the bytes released. Handles whose release failed
    /// before are released first; a page whose unmap fails stays mapped and cached and is
    /// tried again in this pass (up to `IMMEDIATE_TRIES` rounds), then in the next one
    /// (`release_retry.rs`).
    fn release_pages(&mut self, ctx: &Ctx, target: u64) -> u64 {
        self.exp.unreleased.retry(ctx, self.dev);
        let mut released = 0;
        for r in 0..self.exp.list.len() as u32 {
            if released >= target {
                break;
            }
            let mut pages = self.free_pages(r, 0, 0);
            if pages.is_empty() {
                continue;
            }
            if !self.sync_reservation(ctx, r) {
                continue;
            }
            for _ in 0..IMMEDIATE_TRIES {
                let mut failed = Vec::new();
                for (a, size) in pages {
                    if released >= target {
                        break;
                    }
                    match self.unmap_page(ctx, r, a) {
                        Some(h) => {
                            self.exp.unreleased.release(ctx, self.dev, h);
                            released += size;
                        }
                        None => failed.push((a, size)),
                    }
                }
                if failed.is_empty() || released >= target {
                    break;
                }
                pages = failed;
            }
        }
        released
    }

    /// Release every whole free page (`empty_cache`, out-of-memory retry).
    pub(crate) fn expandable_release_free(&mut self, ctx: &Ctx) {
        self.release_pages(ctx, u64::MAX);
    }

    /// Garbage collection: release whole free pages worth `target` bytes.
    pub(crate) fn expandable_gc(&mut self, ctx: &Ctx, target: u64) {
        self.release_pages(ctx, target);
    }

    /// Give every reservation back (device reset). If a page could not be released, every
    /// reservation stays (block indices refer to them) and is reused afterwards.
    pub(crate) fn expandable_release_reservations(&mut self, ctx: &Ctx) {
        self.release_pages(ctx, u64::MAX);
        if self.exp.list.iter().any(|r| !r.pages.is_empty()) {
            return;
        }
        for res in std::mem::take(&mut self.exp.list) {
            // Only the single unmapped block covering the reservation is left.
            let mut cur = Some(res.head);
            while let Some(id) = cur {
                cur = self.blocks[id].next;
                self.blocks.remove(id);
            }
            let _ = ctx.device.release_reservation(self.dev, res.base, res.size);
        }
    }
}
