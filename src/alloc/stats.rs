//! Allocator statistics with PyTorch's key names (`allocated_bytes.all.current`, ...).
//!
//! Invariant: `current` is the sum of all updates, `allocated`/`freed` the sums of the
//! positive/negative ones, and `peak` the largest `current` since the last peak reset. The
//! `all` entry of a [`StatArray`] always equals `small_pool + large_pool`.
//!
//! `allocated` and `freed` only ever grow, and wrap modulo 2^64 instead of overflowing (as
//! PyTorch's `int64_t` counters do in practice): an expandable growth maps one page at a time
//! and puts the growing free block back in its pool at each, so a 38 TiB request on a 64 TiB
//! (fake) device adds about (2M pages)^2 / 2 x 20 MiB to `inactive_split_bytes.allocated`,
//! past `i64::MAX`, and a debug build panicked there. Not saturating: on this hot path a
//! saturating add costs a large share of a cached cudaMalloc+cudaFree pair (BENCHMARKS.md,
//! "Measurements behind design choices"), and `current`/`peak` (what users read) are exact
//! either way.

use std::collections::BTreeMap;

/// One counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    pub fn update(&mut self, amount: i64) {
        self.current += amount;
        if amount > 0 {
            self.allocated = self.allocated.wrapping_add(amount);
        } else {
            self.freed = self.freed.wrapping_sub(amount);
        }
        self.peak = self.peak.max(self.current);
    }

    /// `update(amount)` for an amount known to be >= 0, without the sign test.
    #[inline(always)]
    pub fn add(&mut self, amount: i64) {
        debug_assert!(amount >= 0);
        self.current += amount;
        self.allocated = self.allocated.wrapping_add(amount);
        // A branch, not a `max`: in steady state the peak is not exceeded and nothing is
        // stored.
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    /// `update(-amount)` for an amount known to be >= 0: a decrease never raises the peak.
    #[inline(always)]
    pub fn sub(&mut self, amount: i64) {
        debug_assert!(amount >= 0);
        self.current -= amount;
        self.freed = self.freed.wrapping_add(amount);
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// `sub(amount)` then `add(amount)`: only the sums move.
    #[inline(always)]
    fn out_and_back(&mut self, amount: i64) {
        self.allocated = self.allocated.wrapping_add(amount);
        self.freed = self.freed.wrapping_add(amount);
    }

    fn put(&self, out: &mut BTreeMap<String, i64>, prefix: &str) {
        out.insert(format!("{prefix}.current"), self.current);
        out.insert(format!("{prefix}.peak"), self.peak);
        out.insert(format!("{prefix}.allocated"), self.allocated);
        out.insert(format!("{prefix}.freed"), self.freed);
    }
}

/// A counter split by pool: `all`, `small_pool`, `large_pool`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray {
    pub all: Stat,
    pub small: Stat,
    pub large: Stat,
}

impl StatArray {
    pub fn update(&mut self, large: bool, amount: i64) {
        self.all.update(amount);
        if large {
            self.large.update(amount);
        } else {
            self.small.update(amount);
        }
    }

    /// The pool's own counter (selected without a branch on the hot path).
    #[inline(always)]
    fn pool(&mut self, large: bool) -> &mut Stat {
        if large {
            &mut self.large
        } else {
            &mut self.small
        }
    }

    /// `update(large, amount)` for `amount >= 0`.
    #[inline(always)]
    pub fn add(&mut self, large: bool, amount: i64) {
        self.all.add(amount);
        self.pool(large).add(amount);
    }

    /// `update(large, -amount)` for `amount >= 0`.
    #[inline(always)]
    pub fn sub(&mut self, large: bool, amount: i64) {
        self.all.sub(amount);
        self.pool(large).sub(amount);
    }

    /// `sub(large, amount)` then `add(large, amount)`, for `amount >= 0`: only the sums move
    /// (the current value comes back to where it was, which never exceeds the peak).
    #[inline(always)]
    pub fn sub_then_add(&mut self, large: bool, amount: i64) {
        debug_assert!(amount >= 0);
        self.all.out_and_back(amount);
        self.pool(large).out_and_back(amount);
    }

    fn reset_peak(&mut self) {
        self.all.reset_peak();
        self.small.reset_peak();
        self.large.reset_peak();
    }

    fn put(&self, out: &mut BTreeMap<String, i64>, name: &str) {
        self.all.put(out, &format!("{name}.all"));
        self.small.put(out, &format!("{name}.small_pool"));
        self.large.put(out, &format!("{name}.large_pool"));
    }
}

/// Every statistic of one device allocator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    pub num_sync_all_streams: i64,
    /// Segments and expandable pages released to keep cached bytes under the cap.
    pub num_cache_cap_releases: i64,
}

impl DeviceStats {
    pub fn reset_peaks(&mut self) {
        for a in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            a.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// The flat `key -> value` map PyTorch's `memory_stats()` returns.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        self.allocation.put(&mut m, "allocation");
        self.segment.put(&mut m, "segment");
        self.active.put(&mut m, "active");
        self.inactive_split.put(&mut m, "inactive_split");
        self.allocated_bytes.put(&mut m, "allocated_bytes");
        self.reserved_bytes.put(&mut m, "reserved_bytes");
        self.active_bytes.put(&mut m, "active_bytes");
        self.inactive_split_bytes
            .put(&mut m, "inactive_split_bytes");
        self.requested_bytes.put(&mut m, "requested_bytes");
        self.oversize_allocations
            .put(&mut m, "oversize_allocations");
        self.oversize_segments.put(&mut m, "oversize_segments");
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_cache_cap_releases".into(), self.num_cache_cap_releases);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_totals_wrap_without_panicking_while_current_and_peak_stay_exact() {
        // Each way of moving a counter, from totals one step below the wrap.
        let near = || {
            let mut a = StatArray::default();
            for s in [&mut a.all, &mut a.large] {
                s.allocated = i64::MAX;
                s.freed = i64::MAX;
            }
            a
        };
        type Move = fn(&mut StatArray);
        const MIN1: i64 = i64::MIN + 1;
        // (what, the move, then: allocated, freed, current)
        let moves: [(&str, Move, i64, i64, i64); 5] = [
            ("add", |a| a.add(true, 2), MIN1, i64::MAX, 2),
            ("sub", |a| a.sub(true, 2), i64::MAX, MIN1, -2),
            ("update+", |a| a.update(true, 2), MIN1, i64::MAX, 2),
            ("update-", |a| a.update(true, -2), i64::MAX, MIN1, -2),
            ("sub_then_add", |a| a.sub_then_add(true, 2), MIN1, MIN1, 0),
        ];
        for (name, m, alloc, freed, current) in moves {
            let mut a = near();
            m(&mut a);
            for s in [a.all, a.large] {
                assert_eq!((s.allocated, s.freed), (alloc, freed), "{name}");
                assert_eq!(s.current, current, "{name}");
                assert_eq!(s.peak, current.max(0), "{name}");
            }
            assert_eq!(a.small, Stat::default(), "{name}");
        }
    }

    #[test]
    fn stat_tracks_current_peak_and_totals() {
        let mut s = Stat::default();
        s.update(10);
        s.update(-4);
        s.update(2);
        assert_eq!((s.current, s.peak, s.allocated, s.freed), (8, 10, 12, 4));
        s.reset_peak();
        assert_eq!(s.peak, 8);
    }

    #[test]
    fn add_and_sub_equal_update_with_the_signed_amount() {
        let (mut a, mut b) = (StatArray::default(), StatArray::default());
        for (large, n) in [
            (true, 10),
            (false, 3),
            (true, -4),
            (false, -3),
            (true, 0),
            (true, 7),
        ] {
            a.update(large, n);
            if n >= 0 {
                b.add(large, n);
            } else {
                b.sub(large, -n);
            }
            assert_eq!(a, b);
        }
    }

    #[test]
    fn map_uses_pytorch_key_names() {
        let mut d = DeviceStats::default();
        d.allocated_bytes.update(true, 4096);
        let m = d.to_map();
        assert_eq!(m["allocated_bytes.all.current"], 4096);
        assert_eq!(m["allocated_bytes.large_pool.peak"], 4096);
        assert_eq!(m["allocated_bytes.small_pool.current"], 0);
        assert!(m.contains_key("oversize_segments.current"));
        assert!(m.contains_key("num_device_free"));
    }
}
