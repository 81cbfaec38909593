//! Latency model (`SIMCUDA_LATENCY`, e.g. `cuMemAlloc_v2:50us,cuMemFree_v2:30us`): each named
//! entry point waits that long before doing its work. This is a model so that demos and
//! benchmarks can show the cost of real allocation calls; it is not a measurement of any GPU.
//! Invariant: with the variable unset, `apply` costs one load of an initialised `Lazy`.

use crate::api::{by_name, COUNT};
use once_cell::sync::Lazy;
use std::time::{Duration, Instant};

static MODEL: Lazy<Option<Vec<u64>>> = Lazy::new(|| {
    let spec = std::env::var("SIMCUDA_LATENCY").ok()?;
    let mut ns = vec![0u64; COUNT];
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match parse(item) {
            Some((id, d)) => ns[id] = d,
            None => eprintln!("simcuda: SIMCUDA_LATENCY item {item:?} not understood; ignored"),
        }
    }
    Some(ns)
});

fn parse(item: &str) -> Option<(usize, u64)> {
    let (name, dur) = item.split_once(':')?;
    let id = by_name(name.trim())?;
    Some((id, duration_ns(dur.trim())?))
}

/// `50us`, `2ms`, `100ns`, `1s`.
fn duration_ns(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let num: u64 = num.parse().ok()?;
    let mult = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return None,
    };
    num.checked_mul(mult)
}

/// Wait the modelled time of entry point `id`: busy-wait below 200 µs, sleep above.
pub fn apply(id: usize) {
    let Some(model) = MODEL.as_ref() else { return };
    let ns = model[id];
    if ns == 0 {
        return;
    }
    let d = Duration::from_nanos(ns);
    if ns >= 200_000 {
        std::thread::sleep(d);
        return;
    }
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}
