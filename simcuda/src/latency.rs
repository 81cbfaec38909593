//! Latency model (`SIMCUDA_LATENCY`): what each entry point costs, as a *model* of a real
//! driver, so that demos and benchmarks can show the cost of the calls a program makes. It is
//! not a measurement of any GPU.
//!
//! The setting is a comma-separated list of items, applied left to right:
//!
//! - a profile name (`cuda`): every entry point it lists gets its figure (`profile.rs` gives
//!   each figure with its source);
//! - `name:dur` (`cuMemAlloc_v2:50us`, units `ns`, `us`, `ms`, `s`): that entry point's
//!   figure, replacing the profile's;
//! - `virtual`: charge the modelled time to a clock instead of waiting it out.
//!
//! Every charge, waited or not, is added to the process's modelled clock
//! ([`modelled_ns`], exported as `simcuda_modelled_ns` and written by `SIMCUDA_REPORT`), so a
//! benchmark reads the time the model charges for a run whatever the load of the machine
//! running it. Charges of calls made on several threads at once add up (the model treats the
//! driver as serving one call at a time, the same with and without a shim). The clock counts
//! only charges: the simulated GPU's own work (stream workers) is not in it.
//!
//! Allocation and free of device memory are charged by size (the profile's tiers), so their
//! figure is added where the size is known ([`sized`]); a profile's free also charges a device
//! synchronization, since `cudaFree`/`cuMemFree` synchronize the device (simcuda's free does
//! synchronize; this is its modelled cost).
//!
//! Invariant: with the variable unset, `apply` and `sized` cost one load of an initialised
//! `Lazy`.

use crate::api::{by_name, Api, COUNT};
use crate::profile::{self, Profile};
use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Model {
    /// Flat figure per entry point, in ns.
    ns: Vec<u64>,
    /// The profile's size tiers for allocation and free, if a profile was named.
    profile: Option<&'static Profile>,
    /// Charge the clock only, never wait.
    virtual_clock: bool,
}

static MODEL: Lazy<Option<Model>> = Lazy::new(|| {
    let spec = std::env::var("SIMCUDA_LATENCY").ok()?;
    Some(parse_spec(&spec))
});

/// Modelled nanoseconds charged so far, on every thread.
static CLOCK: AtomicU64 = AtomicU64::new(0);

fn parse_spec(spec: &str) -> Model {
    let mut m = Model {
        ns: vec![0u64; COUNT],
        profile: None,
        virtual_clock: false,
    };
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "virtual" {
            m.virtual_clock = true;
        } else if let Some(p) = profile::by_name(item) {
            for &(name, ns) in p.flat {
                if let Some(id) = by_name(name) {
                    m.ns[id] = ns;
                }
            }
            m.profile = Some(p);
        } else {
            match parse(item) {
                Some((id, d)) => m.ns[id] = d,
                None => eprintln!("simcuda: SIMCUDA_LATENCY item {item:?} not understood; ignored"),
            }
        }
    }
    m
}

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

/// Modelled nanoseconds charged so far in this process.
pub fn modelled_ns() -> u64 {
    CLOCK.load(Ordering::Relaxed)
}

/// The modelled clock, for programs that read it around a loop (0 without a model).
#[no_mangle]
pub extern "C" fn simcuda_modelled_ns() -> u64 {
    modelled_ns()
}

fn charge(m: &Model, ns: u64) {
    if ns == 0 {
        return;
    }
    CLOCK.fetch_add(ns, Ordering::Relaxed);
    if m.virtual_clock {
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

/// Charge the modelled time of entry point `id`: busy-wait below 200 µs, sleep above (or
/// only count it, with `virtual`).
pub fn apply(id: usize) {
    let Some(model) = MODEL.as_ref() else { return };
    charge(model, model.ns[id]);
}

/// Charge the size-dependent part of an allocation (`free` false) or a free (`free` true)
/// of `bytes` by `api`, as the named profile's tiers give it (nothing without a profile, or
/// for an entry point the profile does not size).
pub fn sized(api: Api, bytes: usize, free: bool) {
    let Some(model) = MODEL.as_ref() else { return };
    let Some(p) = model.profile else { return };
    if !p.sized.contains(&crate::api::NAMES[api as usize]) {
        return;
    }
    let mut ns = p.alloc_ns(bytes);
    if free {
        ns += p.free_sync_ns;
    }
    charge(model, ns);
}

/// Charge a free by `api` of the block at `ptr` (its size looked up only under a profile;
/// nothing for a null or unknown pointer, which frees nothing).
pub fn free_of(api: Api, ptr: usize) {
    if ptr == 0 || !MODEL.as_ref().is_some_and(|m| m.profile.is_some()) {
        return;
    }
    if let Some((_, start, size)) = crate::memory::find(ptr) {
        if start == ptr {
            sized(api, size, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_then_an_override_replaces_the_profile_figure() {
        let m = parse_spec("cuda,cuEventRecord:7us,virtual");
        let rec = by_name("cuEventRecord").unwrap();
        let wait = by_name("cuStreamWaitEvent").unwrap();
        assert_eq!(m.ns[rec], 7_000);
        assert!(m.ns[wait] > 0, "the profile gives stream waits a figure");
        assert!(m.virtual_clock);
        assert!(m.profile.is_some());
    }

    #[test]
    fn an_unknown_item_is_ignored_and_the_rest_applies() {
        let m = parse_spec("nosuchprofile,cuMemAlloc_v2:3us");
        assert_eq!(m.ns[by_name("cuMemAlloc_v2").unwrap()], 3_000);
        assert!(m.profile.is_none());
        assert!(!m.virtual_clock);
    }
}
