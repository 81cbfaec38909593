//! The allocator engine in-process, over `ReplayDevice` (host bookkeeping,
//! no memory behind the addresses): cached pair cost, threads, fragmentation.
//!
//! Invariant: the allocator is cushim's real `CachingAllocator` with a configuration parsed
//! from the same `CUSHIM_ALLOC_CONF` syntax users write; peaks come from its own statistics.

use crate::replay_device::{NoFaults, ReplayDevice};
use cushim::alloc::CachingAllocator;
use cushim::config::alloc::parse as parse_alloc;
use cushim::config::history::parse as parse_history;
use cushim::trace::event::{EventSink, NullSink};
use cushim::trace::ring::TraceRing;
use std::hint::black_box;
use std::sync::Arc;

const GIB: u64 = 1 << 30;

/// An allocator over a 1-device, 80 GiB fake device. `history`: a `CUSHIM_HISTORY` value
/// whose ring records the events (None: history off).
pub fn allocator(conf: &str, history: Option<&str>) -> Result<CachingAllocator, String> {
    let (conf, errors) = parse_alloc(conf);
    if let Some(e) = errors.first() {
        return Err(format!("allocator configuration: {e}"));
    }
    let hist = match history {
        Some(h) => Some(parse_history(h).map_err(|e| format!("history configuration: {e}"))?),
        None => None,
    };
    let dev = Arc::new(ReplayDevice::<NoFaults>::new(1, 80 * GIB));
    let make = |_d: i32| -> Box<dyn EventSink> {
        match &hist {
            Some(h) => Box::new(TraceRing::for_device(h)),
            None => Box::new(NullSink),
        }
    };
    Ok(CachingAllocator::new(dev, conf, &make))
}

/// `iters` cached malloc+free pairs of `size` bytes on device 0, stream 0. Returns the
/// number of failed calls (0 expected).
pub fn pairs(a: &CachingAllocator, size: u64, iters: u64) -> u64 {
    let mut failed = 0;
    for _ in 0..iters {
        match a.malloc(0, black_box(size), 0, 0) {
            Ok(p) => {
                if a.free(black_box(p), 0, 0).is_err() {
                    failed += 1;
                }
            }
            Err(_) => failed += 1,
        }
    }
    failed
}

/// Baseline: `iters` glibc malloc+free pairs of `size` bytes (the first byte touched).
pub fn glibc_pairs(size: u64, iters: u64) {
    for _ in 0..iters {
        // SAFETY: malloc/free of a block we own; the write stays within the block's size
        // (size >= 1) and happens only when malloc succeeded.
        unsafe {
            let p = libc::malloc(black_box(size as usize)) as *mut u8;
            if !p.is_null() {
                p.write_volatile(1);
            }
            libc::free(black_box(p) as *mut libc::c_void);
        }
    }
}

/// Pairs per second of `threads` threads doing `per_thread` pairs each concurrently.
pub fn threaded_pairs_per_s(
    a: &CachingAllocator,
    size: u64,
    threads: usize,
    per_thread: u64,
) -> f64 {
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| pairs(a, size, per_thread));
        }
    });
    (threads as u64 * per_thread) as f64 / start.elapsed().as_secs_f64()
}

/// Peak reserved and peak allocated bytes of device 0, from the allocator's statistics.
pub fn peaks(a: &CachingAllocator) -> Result<(u64, u64), String> {
    let s = a.stats(0);
    let get = |k: &str| {
        s.get(k)
            .map(|v| (*v).max(0) as u64)
            .ok_or_else(|| format!("statistic {k} missing"))
    };
    Ok((
        get("reserved_bytes.all.peak")?,
        get("allocated_bytes.all.peak")?,
    ))
}

fn must(a: &CachingAllocator, size: u64) -> Result<u64, String> {
    a.malloc(0, size, 0, 0)
        .map_err(|e| format!("malloc({size}): {e}"))
}

fn release(a: &CachingAllocator, p: u64) -> Result<(), String> {
    a.free(p, 0, 0).map_err(|e| format!("free: {e}"))
}

/// The seed scenario: n1 x s1, free all, n2 x s2, free all.
pub fn two_phase(
    a: &CachingAllocator,
    n1: usize,
    s1: u64,
    n2: usize,
    s2: u64,
) -> Result<(), String> {
    let v: Vec<u64> = (0..n1).map(|_| must(a, s1)).collect::<Result<_, _>>()?;
    v.into_iter().try_for_each(|p| release(a, p))?;
    let v: Vec<u64> = (0..n2).map(|_| must(a, s2)).collect::<Result<_, _>>()?;
    v.into_iter().try_for_each(|p| release(a, p))
}

/// A synthetic serving trace (the same shape as `examples/bench_frag.c serving`): 48 weight
/// tensors of 1..12 MiB, then `requests` requests, up to 8 live, each holding a KV cache per
/// layer sized by its sequence length, with per-step activations sized by the batch.
pub fn serving(a: &CachingAllocator, requests: usize) -> Result<(), String> {
    const KIB: u64 = 1024;
    const LAYERS: usize = 8;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut weights = Vec::new();
    for _ in 0..48 {
        let size = (1 + next() % 12) * (1 << 20) + (next() % 512) * KIB;
        weights.push(must(a, size)?);
    }
    struct Req {
        kv: Vec<u64>,
        kv_size: u64,
        steps_left: u32,
    }
    let mut live: Vec<Req> = Vec::new();
    let mut started = 0;
    while started < requests || !live.is_empty() {
        while live.len() < 8 && started < requests && (next() % 3 != 0 || live.is_empty()) {
            let kv_size = (16 + next() % 2048) * 2 * KIB;
            let kv = (0..LAYERS)
                .map(|_| must(a, kv_size))
                .collect::<Result<_, _>>()?;
            live.push(Req {
                kv,
                kv_size,
                steps_left: 1 + (next() % 24) as u32,
            });
            started += 1;
        }
        let tokens: u64 = live.iter().map(|r| r.kv_size / (2 * KIB)).sum();
        let mut acts = Vec::new();
        for l in 0..LAYERS as u64 {
            acts.push(must(a, tokens * (1 + l % 3) * 256 + 512)?);
            let tmp = must(a, 4 * KIB + (next() % 256) * KIB)?;
            release(a, tmp)?;
        }
        acts.into_iter().rev().try_for_each(|p| release(a, p))?;
        let mut i = 0;
        while i < live.len() {
            live[i].steps_left -= 1;
            if live[i].steps_left > 0 {
                i += 1;
                continue;
            }
            let r = live.swap_remove(i);
            r.kv.into_iter().try_for_each(|p| release(a, p))?;
        }
    }
    weights.into_iter().try_for_each(|p| release(a, p))
}

/// Trace events one cached pair records with `history` on (counted from the ring).
pub fn events_per_pair(history: &str) -> Result<f64, String> {
    let a = allocator("", Some(history))?;
    pairs(&a, 512, 1); // warm: the first pair also allocates a segment
    let before: usize = a.snapshot().iter().map(|d| d.events.len()).sum();
    let n = 100;
    if pairs(&a, 512, n) != 0 {
        return Err("a cached pair failed".into());
    }
    let after: usize = a.snapshot().iter().map(|d| d.events.len()).sum();
    Ok((after - before) as f64 / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_scenario_peaks_follow_the_design_with_and_without_expandable() {
        let a = allocator("", None).unwrap();
        two_phase(&a, 8, 16 << 20, 4, 32 << 20).unwrap();
        assert_eq!(peaks(&a).unwrap(), (256 << 20, 128 << 20));
        let e = allocator("expandable_segments:True", None).unwrap();
        two_phase(&e, 8, 16 << 20, 4, 32 << 20).unwrap();
        assert_eq!(peaks(&e).unwrap().0, 128 << 20);
    }

    #[test]
    fn cached_pairs_succeed_and_history_records_events_per_pair() {
        let a = allocator("", None).unwrap();
        assert_eq!(pairs(&a, 512, 1000), 0);
        let k = events_per_pair("enabled=all,stacks=none").unwrap();
        assert!(k >= 2.0, "{k}");
    }
}
