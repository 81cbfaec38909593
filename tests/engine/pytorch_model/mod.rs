//! An independent reference model of PyTorch's CUDA caching-allocator decisions, written
//! from PyTorch's published source (`c10/cuda/CUDACachingAllocator.cpp` and
//! `c10/core/AllocatorConfig.cpp`, the `ConfigTokenizer` versions) for the parity test
//! (`tests/engine/engine_parity.rs`, which says what is followed, function by function). One
//! device, no graphs, streams only through their pools (a block is freed on its own stream); its device is the documented `FakeDevice` contract.

use std::collections::{BTreeMap, BTreeSet};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

// PyTorch's constants (CUDACachingAllocator.cpp / CachingDeviceAllocator.h).
pub const K_MIN_BLOCK: u64 = 512;
pub const K_SMALL_SIZE: u64 = MIB;
pub const K_SMALL_BUFFER: u64 = 2 * MIB;
pub const K_LARGE_BUFFER: u64 = 20 * MIB;
pub const K_MIN_LARGE_ALLOC: u64 = 10 * MIB;
pub const K_ROUND_LARGE: u64 = 2 * MIB;

// ----------------------------------------------------------------------------- the config

/// The settings PyTorch's parser yields for the keys these traces use.
pub struct Settings {
    pub max_split: u64,
    pub max_non_split_rounding: u64,
    pub gc_threshold: f64,
    pub fraction: f64,
    pub divisions: [u64; 16],
}

pub fn parse_settings(conf: &str) -> Settings {
    let mut s = Settings {
        max_split: u64::MAX,
        max_non_split_rounding: K_LARGE_BUFFER,
        gc_threshold: 0.0,
        fraction: 1.0,
        divisions: [0; 16],
    };
    // Split at top-level commas (a list's commas are inside brackets).
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in conf.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&conf[start..]);
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        let (key, value) = item.split_once(':').unwrap();
        match key {
            "max_split_size_mb" => {
                let mb: u64 = value.parse().unwrap();
                assert!(mb >= 20, "PyTorch refuses max_split_size_mb below 20");
                s.max_split = mb * MIB;
            }
            "max_non_split_rounding_mb" => {
                s.max_non_split_rounding = value.parse::<u64>().unwrap() * MIB
            }
            "garbage_collection_threshold" => s.gc_threshold = value.parse().unwrap(),
            "per_process_memory_fraction" => s.fraction = value.parse().unwrap(),
            "roundup_power2_divisions" => {
                if let Some(list) = value.strip_prefix('[') {
                    // parseRoundUpPower2Divisions: the first boundary fills the intervals
                    // below it, each boundary sets its own, `>` fills after the last one.
                    let mut last_index = 0usize;
                    let mut first = true;
                    for entry in list.trim_end_matches(']').split(',') {
                        let (boundary, div) = entry.split_once(':').unwrap();
                        let div: u64 = div.parse().unwrap();
                        if boundary == ">" {
                            for d in s.divisions.iter_mut().skip(last_index + 1) {
                                *d = div;
                            }
                        } else {
                            let mb: u64 = boundary.parse().unwrap();
                            let index = (63 - mb.leading_zeros() as usize).min(15);
                            if first {
                                for d in s.divisions.iter_mut().take(index) {
                                    *d = div;
                                }
                                first = false;
                            }
                            s.divisions[index] = div;
                            last_index = index;
                        }
                    }
                } else {
                    s.divisions = [value.parse().unwrap(); 16];
                }
            }
            other => panic!("the model does not know {other}"),
        }
    }
    s
}

impl Settings {
    /// `AllocatorConfig::roundup_power2_divisions`: intervals from 1 MiB to 64 GiB.
    fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.leading_zeros() as i64;
        self.divisions[(log - 20).clamp(0, 15) as usize]
    }

    /// `round_size`.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < K_MIN_BLOCK {
            return K_MIN_BLOCK;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > K_MIN_BLOCK * divisions {
            next_division(size, divisions)
        } else {
            K_MIN_BLOCK * size.div_ceil(K_MIN_BLOCK)
        }
    }
}

/// `roundup_power2_next_division`.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let below = size & !(step - 1);
    if below == size {
        size
    } else {
        below + step
    }
}

/// `get_allocation_size`.
fn allocation_size(rounded: u64) -> u64 {
    if rounded <= K_SMALL_SIZE {
        K_SMALL_BUFFER
    } else if rounded < K_MIN_LARGE_ALLOC {
        K_LARGE_BUFFER
    } else {
        K_ROUND_LARGE * rounded.div_ceil(K_ROUND_LARGE)
    }
}

// ------------------------------------------------------------------------------ the model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegEvent {
    Alloc(u64, u64),
    Free(u64, u64),
}

struct ModelBlock {
    stream: u64,
    size: u64,
    small: bool,
    allocated: bool,
    prev: Option<u64>,
    next: Option<u64>,
    gc_count_base: u64,
}

/// A pool: the free blocks by (stream, size, address), PyTorch's `BlockComparatorSize`, and
/// its `get_free_blocks_call_count`.
#[derive(Default)]
struct ModelPool {
    blocks: BTreeSet<(u64, u64, u64)>,
    calls: u64,
}

pub struct Model {
    pub s: Settings,
    capacity: u64,
    // The device: bytes in use and the next address.
    used: u64,
    next_addr: u64,
    blocks: BTreeMap<u64, ModelBlock>,
    small: ModelPool,
    large: ModelPool,
    pub total_allocated_memory: u64,
    /// Segment events since the caller last cleared them.
    pub events: Vec<SegEvent>,
    /// Segments released by garbage collection (to check a trace reaches it).
    pub gc_released: u64,
}

impl Model {
    pub fn new(conf: &str, capacity: u64) -> Model {
        Model {
            s: parse_settings(conf),
            capacity,
            used: 0,
            next_addr: 1 << 44,
            blocks: BTreeMap::new(),
            small: ModelPool::default(),
            large: ModelPool::default(),
            total_allocated_memory: 0,
            events: Vec::new(),
            gc_released: 0,
        }
    }

    fn pool(&mut self, small: bool) -> &mut ModelPool {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn allowed_memory_maximum(&self) -> u64 {
        (self.capacity as f64 * self.s.fraction) as u64
    }

    /// `BlockPool::insert_into_blocks`.
    fn insert_into_blocks(&mut self, addr: u64) {
        let b = &self.blocks[&addr];
        let (key, small) = ((b.stream, b.size, addr), b.small);
        let calls = self.pool(small).calls;
        self.blocks.get_mut(&addr).unwrap().gc_count_base = calls;
        assert!(self.pool(small).blocks.insert(key));
    }

    fn remove_from_pool(&mut self, addr: u64) {
        let b = &self.blocks[&addr];
        let (key, small) = ((b.stream, b.size, addr), b.small);
        assert!(self.pool(small).blocks.remove(&key));
    }

    /// `malloc` of `orig` bytes on `stream`.
    pub fn malloc(&mut self, orig: u64, stream: u64) -> Option<u64> {
        let size = self.s.round_size(orig);
        let small = size <= K_SMALL_SIZE;
        let alloc_size = allocation_size(size);
        let mut block = self.get_free_block(small, size, stream);
        if block.is_none() {
            if self.s.gc_threshold > 0.0 {
                self.garbage_collect_cached_blocks();
            }
            block = self.alloc_block(small, alloc_size, stream);
            if block.is_none() && self.release_available_cached_blocks(small, size, stream) {
                block = self.alloc_block(small, alloc_size, stream);
            }
            if block.is_none() {
                self.release_cached_blocks();
                block = self.alloc_block(small, alloc_size, stream);
            }
        }
        let addr = block?;
        self.alloc_found_block(addr, size);
        Some(addr)
    }

    /// `get_free_block`: the pool's lower bound for (stream, size), which must be of the same
    /// stream; refused when oversize rules say so. The block leaves the pool.
    fn get_free_block(&mut self, small: bool, size: u64, stream: u64) -> Option<u64> {
        let (max_split, rounding) = (self.s.max_split, self.s.max_non_split_rounding);
        let gc = self.s.gc_threshold > 0.0;
        let pool = self.pool(small);
        if gc {
            pool.calls += 1;
        }
        let &(bstream, bsize, addr) = pool.blocks.range((stream, size, 0)..).next()?;
        if bstream != stream {
            return None;
        }
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(rounding) {
            return None;
        }
        pool.blocks.remove(&(stream, bsize, addr));
        Some(addr)
    }

    /// `alloc_block`: the fraction check, then the device. A new whole-segment block.
    fn alloc_block(&mut self, small: bool, size: u64, stream: u64) -> Option<u64> {
        if self.s.fraction < 1.0 || self.s.gc_threshold > 0.0 {
            // `set_fraction`: PyTorch refuses without calling the device.
            if self.total_allocated_memory + size > self.allowed_memory_maximum() {
                return None;
            }
        }
        if self.used + size > self.capacity {
            return None;
        }
        self.used += size;
        let addr = self.next_addr.div_ceil(2 * MIB) * (2 * MIB);
        self.next_addr = addr + size;
        self.total_allocated_memory += size;
        self.blocks.insert(
            addr,
            ModelBlock {
                stream,
                size,
                small,
                allocated: false,
                prev: None,
                next: None,
                gc_count_base: 0,
            },
        );
        self.events.push(SegEvent::Alloc(addr, size));
        Some(addr)
    }

    /// `release_block`: a whole free segment (in its pool) back to the device.
    fn release_block(&mut self, addr: u64) {
        self.remove_from_pool(addr);
        let b = self.blocks.remove(&addr).unwrap();
        assert!(b.prev.is_none() && b.next.is_none() && !b.allocated);
        self.used -= b.size;
        self.total_allocated_memory -= b.size;
        self.events.push(SegEvent::Free(addr, b.size));
    }

    /// `release_available_cached_blocks`: the stream's smallest oversize block big enough,
    /// else its largest ones until enough is released.
    fn release_available_cached_blocks(&mut self, small: bool, size: u64, stream: u64) -> bool {
        let max_split = self.s.max_split;
        if max_split == u64::MAX {
            return false;
        }
        let want = size.max(max_split);
        let pool = self.pool(small);
        if let Some(&(s, _, addr)) = pool.blocks.range((stream, want, 0)..).next() {
            if s == stream {
                self.release_block(addr);
                return true;
            }
        }
        let candidates: Vec<(u64, u64, u64)> = pool
            .blocks
            .range(..(stream, want, 0))
            .rev()
            .take_while(|&&(s, bsize, _)| s == stream && bsize >= max_split)
            .copied()
            .collect();
        let mut released = 0;
        for (_, bsize, addr) in candidates {
            if released >= want {
                break;
            }
            self.release_block(addr);
            released += bsize;
        }
        released >= want
    }

    /// `release_cached_blocks`: every whole free segment, large pool then small.
    pub fn release_cached_blocks(&mut self) {
        for small in [false, true] {
            let whole: Vec<u64> = self
                .pool(small)
                .blocks
                .iter()
                .map(|&(_, _, a)| a)
                .collect::<Vec<_>>()
                .into_iter()
                .filter(|a| self.blocks[a].prev.is_none() && self.blocks[a].next.is_none())
                .collect();
            for addr in whole {
                self.release_block(addr);
            }
        }
    }

    /// `garbage_collect_cached_blocks`.
    fn garbage_collect_cached_blocks(&mut self) {
        let gc_threshold = (self.s.gc_threshold * self.allowed_memory_maximum() as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return;
        }
        let target = self.total_allocated_memory - gc_threshold;
        let now = self.large.calls;
        let age = |m: &Model, a: u64| (now - m.blocks[&a].gc_count_base) as f64;
        let whole = |m: &Model, a: u64| m.blocks[&a].prev.is_none() && m.blocks[&a].next.is_none();
        let mut total_age = 0.0;
        let mut count = 0usize;
        for &(_, _, a) in &self.large.blocks {
            if whole(self, a) {
                total_age += age(self, a);
                count += 1;
            }
        }
        let mut reclaimed = 0;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age / count as f64;
            freed = false;
            let order: Vec<u64> = self.large.blocks.iter().map(|&(_, _, a)| a).collect();
            for a in order {
                if whole(self, a) && age(self, a) >= threshold {
                    freed = true;
                    reclaimed += self.blocks[&a].size;
                    total_age -= age(self, a);
                    count -= 1;
                    self.gc_released += 1;
                    self.release_block(a);
                }
            }
        }
    }

    /// `alloc_found_block`: split the tail off when `should_split`.
    fn alloc_found_block(&mut self, addr: u64, size: u64) {
        let (bsize, small, next, stream) = {
            let b = &self.blocks[&addr];
            (b.size, b.small, b.next, b.stream)
        };
        let remaining = bsize - size;
        let split = if small {
            remaining >= K_MIN_BLOCK
        } else {
            size < self.s.max_split && remaining > K_SMALL_SIZE
        };
        if split {
            let tail = addr + size;
            self.blocks.insert(
                tail,
                ModelBlock {
                    stream,
                    size: remaining,
                    small,
                    allocated: false,
                    prev: Some(addr),
                    next,
                    gc_count_base: 0,
                },
            );
            if let Some(n) = next {
                self.blocks.get_mut(&n).unwrap().prev = Some(tail);
            }
            let b = self.blocks.get_mut(&addr).unwrap();
            b.size = size;
            b.next = Some(tail);
            self.insert_into_blocks(tail);
        }
        self.blocks.get_mut(&addr).unwrap().allocated = true;
    }

    /// `free_block` with `try_merge_blocks` on both neighbours.
    pub fn free(&mut self, addr: u64) {
        self.blocks.get_mut(&addr).unwrap().allocated = false;
        let mut addr = addr;
        if let Some(p) = self.blocks[&addr].prev {
            if !self.blocks[&p].allocated {
                self.remove_from_pool(p);
                let b = self.blocks.remove(&addr).unwrap();
                let pb = self.blocks.get_mut(&p).unwrap();
                pb.size += b.size;
                pb.next = b.next;
                if let Some(n) = b.next {
                    self.blocks.get_mut(&n).unwrap().prev = Some(p);
                }
                addr = p;
            }
        }
        if let Some(n) = self.blocks[&addr].next {
            if !self.blocks[&n].allocated {
                self.remove_from_pool(n);
                let nb = self.blocks.remove(&n).unwrap();
                let b = self.blocks.get_mut(&addr).unwrap();
                b.size += nb.size;
                b.next = nb.next;
                if let Some(nn) = nb.next {
                    self.blocks.get_mut(&nn).unwrap().prev = Some(addr);
                }
            }
        }
        self.insert_into_blocks(addr);
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.blocks
            .values()
            .filter(|b| b.allocated)
            .map(|b| b.size)
            .sum()
    }
}
