//! The device-side ledger at exit (`SIMCUDA_REPORT=path`): registered with `atexit` when the
//! library loads, so it is written by whichever thread calls `exit()`. Invariant: writing
//! reads only atomics (never a lock a running stream worker could hold) and happens once.
//! Per device it shows the primary context's reference count and whether the runtime started
//! (retained it), so a test can tell who created a context.
//!
//! Work still queued at exit (a stream-ordered free, a copy) runs on the stream workers while
//! `exit` runs, so a ledger read at once would depend on how far they got. The report first
//! lets them finish, watching only each device's atomic count of queued items, for at most
//! [`SETTLE`] (a stream held forever by a host function must not hang the exit), and says
//! how many items were still queued when it was written.

use crate::api::{count_of, NAMES};
use crate::state::{state_if_created, Ledger};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};

static WRITTEN: AtomicBool = AtomicBool::new(false);

extern "C" fn at_exit() {
    if WRITTEN.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(path) = std::env::var("SIMCUDA_REPORT") else {
        return;
    };
    let left = settle();
    let mut report = render();
    report["pending_items_at_exit"] = json!(left);
    let text = report.to_string();
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("simcuda: writing report {path}: {e}");
    }
}

/// How long the report waits at exit for queued stream work to finish.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Wait (polling atomics only) until no device has queued work, or [`SETTLE`] passed; the
/// number of items still queued.
fn settle() -> u64 {
    let Some(st) = state_if_created() else {
        return 0;
    };
    let queued = || -> u64 {
        st.devices
            .iter()
            .map(|d| d.pending.load(Ordering::Acquire))
            .sum()
    };
    let deadline = std::time::Instant::now() + SETTLE;
    let mut left = queued();
    while left > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
        left = queued();
    }
    left
}

fn load(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::Acquire)
}

fn device_json(ordinal: usize, l: &Ledger, ctx: (u32, bool)) -> Value {
    json!({
        "primary_ctx_refs": ctx.0,
        "runtime_started": ctx.1,
        "ordinal": ordinal,
        "capacity_bytes": l.capacity,
        "bytes_in_use": load(&l.in_use),
        "peak_bytes_in_use": load(&l.peak),
        "live_allocations": load(&l.live_allocations),
        "live_physical_handles": load(&l.live_physical_handles),
        "live_reservations": load(&l.live_reservations),
    })
}

/// The report as JSON.
pub fn render() -> Value {
    let devices: Vec<Value> = match state_if_created() {
        Some(st) => st
            .devices
            .iter()
            .map(|d| {
                let ctx = (
                    d.primary_refs.load(Ordering::Acquire),
                    d.runtime_retained.load(Ordering::Acquire),
                );
                device_json(d.ordinal, &d.ledger, ctx)
            })
            .collect(),
        None => {
            let cfg = crate::config::Config::from_env();
            (0..cfg.devices)
                .map(|i| {
                    device_json(
                        i,
                        &Ledger {
                            capacity: cfg.mem_bytes,
                            ..Ledger::default()
                        },
                        (0, false),
                    )
                })
                .collect()
        }
    };
    let h = &*crate::host::LEDGER;
    let mut calls = Map::new();
    for (i, name) in NAMES.iter().enumerate() {
        calls.insert((*name).to_string(), json!(count_of(i)));
    }
    json!({
        "devices": devices,
        "host": {
            "bytes_in_use": load(&h.in_use),
            "peak_bytes_in_use": load(&h.peak),
            "live_allocations": load(&h.live_allocations),
        },
        "calls": calls,
        "modelled_ns": crate::latency::modelled_ns(),
    })
}

extern "C" fn on_load() {
    if std::env::var_os("SIMCUDA_REPORT").is_some() {
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { libc::atexit(at_exit) };
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
