//! `cushim replay`: a recorded trace through the real engine (the caching allocator over a
//! fake device) under the recorded settings and others, to answer "what would this setting
//! have done?".
//!
//! Policy: each device's trace is replayed on its own fake device of the recorded size
//! (unlimited when the input does not record it; then no replay can run out of memory and
//! `garbage_collection_threshold`, a fraction of the device, never triggers). Blocks live
//! before the trace began (see `timeline`) are allocated first, in address order. An
//! `alloc` is a `malloc` on its recorded stream; a block goes back to the cache when its
//! free completed (`free_completed`: when the recorded allocator could reuse it). Peak
//! allocated is counted as the recorded row counts it, and as PyTorch's `allocated_bytes`
//! does: a block stops being allocated when the program frees it (`free_requested`), though
//! the cache cannot reuse it before the free completes; each block counts the size the
//! engine rounds its request to (under the replayed settings). Recorded segment events are not
//! replayed: the engine makes its own. What the replay cannot know is listed with the table
//! ([`Replay::notes`]): which blocks existed before the trace, when pending frees would
//! have completed under other settings, and memory the program reserved outside the cache.

use crate::analyze::model::{Device, Snapshot};
use crate::analyze::timeline::{peaks, start_of, Start};
use cushim::alloc::rounding::round_size;
use cushim::alloc::CachingAllocator;
use cushim::config::alloc::parse;
use cushim::trace::event::{Action, NullSink};
use cushim_testsupport::fake_device::FakeDevice;
use std::collections::HashMap;
use std::sync::Arc;

/// Device memory for inputs that do not record the device's size: 256 GiB, beyond any GPU
/// made so far. It also bounds what a crafted request costs the replay: the engine keeps
/// host-side records per mapped page of expandable segments (tens of MB for a TiB), and
/// the fake device's expandable path overflows past its 16 TiB address span.
const UNLIMITED: u64 = 256 << 30;

/// One configuration's figures on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What the column is (`recorded`, `replay: <conf>`).
    pub label: String,
    /// `None` when not known (the recorded column of a log: it has no segments).
    pub peak_reserved: Option<u64>,
    pub peak_allocated: u64,
    /// Device allocation calls (cudaMalloc, or physical pages for expandable segments);
    /// `None` when not known (the recorded column of a log).
    pub device_allocs: Option<u64>,
    pub ooms: u64,
}

impl Row {
    /// `1 - peak allocated / peak reserved` (0 when nothing was reserved).
    pub fn fragmentation(&self) -> Option<f64> {
        match self.peak_reserved? {
            0 => Some(0.0),
            r => Some(1.0 - self.peak_allocated as f64 / r as f64),
        }
    }
}

/// The replay of one device.
#[derive(Debug, Clone)]
pub struct DeviceReplay {
    pub ordinal: i64,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

/// The replay of an input.
#[derive(Debug, Clone)]
pub struct Replay {
    pub devices: Vec<DeviceReplay>,
    pub notes: Vec<String>,
}

/// The configurations replayed when none is given: PyTorch's defaults, expandable
/// segments, `max_split_size_mb` at a few sizes, and the garbage collection threshold.
pub fn default_confs() -> Vec<String> {
    [
        "",
        "expandable_segments:True",
        "max_split_size_mb:32",
        "max_split_size_mb:128",
        "max_split_size_mb:512",
        "garbage_collection_threshold:0.6",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// The note about a configuration the engine cannot replay faithfully.
pub const NO_FIXED_PAGES: &str = "PyTorch's expandable segments (fixed 2/20 MiB pages) are not \
    modelled: the engine maps cushim's own page plan; the expandable_segments row is cushim's";

fn recorded_row(snap: &Snapshot, dev: &Device, st: &Start) -> Row {
    let p = peaks(dev, st);
    let allocs = dev
        .events
        .iter()
        .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
        .count() as u64;
    Row {
        label: "recorded".into(),
        peak_reserved: snap.has_state.then_some(p.reserved),
        peak_allocated: p.allocated,
        device_allocs: snap.has_state.then_some(allocs),
        ooms: p.ooms,
    }
}

/// The blocks live before `dev`'s trace began, as (recorded address, size, pending), in
/// address order: what each replay allocates first.
fn live_before(st: &Start) -> Vec<(u64, u64, bool)> {
    let mut before: Vec<(u64, u64, bool)> = st
        .state
        .allocated
        .iter()
        .map(|(&addr, l)| (addr, l.size, false))
        .chain(
            st.state
                .pending
                .iter()
                .map(|(&addr, l)| (addr, l.size, true)),
        )
        .collect();
    before.sort_unstable();
    before
}

/// Replay `dev` under `conf`, starting from the blocks live `before` its trace.
fn replay_device(
    snap: &Snapshot,
    dev: &Device,
    before: &[(u64, u64, bool)],
    conf: &str,
    label: String,
) -> Result<Row, String> {
    let (c, errs) = parse(conf);
    if let Some(e) = errs.first() {
        return Err(format!("--conf {conf:?}: {e}"));
    }
    let capacity = snap.device_total.map_or(UNLIMITED, |t| t.min(UNLIMITED));
    let fake = Arc::new(FakeDevice::new(1, capacity));
    let rounded = {
        let c = c.clone();
        move |size: u64| round_size(size, &c)
    };
    let a = CachingAllocator::new(fake.clone(), c, &|_| Box::new(NullSink));
    // Recorded address -> the engine's pointer, the bytes it counts, whether pending.
    let mut ptrs: HashMap<u64, (u64, u64, bool)> = HashMap::new();
    let mut allocated = 0u64;
    let mut ooms = 0u64;
    // A request beyond the whole device cannot succeed on it; such sizes (from a corrupt
    // or crafted input) never reach the engine.
    let malloc = |size: u64, stream: u64| {
        if size > capacity {
            Err(cushim::alloc::AllocError::OutOfMemory)
        } else {
            a.malloc(0, size, stream, 0)
        }
    };
    for &(addr, size, pending) in before {
        match malloc(size, 0) {
            Ok(p) => {
                let n = rounded(size);
                if !pending {
                    allocated += n;
                }
                ptrs.insert(addr, (p, n, pending));
            }
            Err(_) => ooms += 1,
        }
    }
    let mut peak_allocated = allocated;
    for ev in &dev.events {
        match ev.action {
            Action::Alloc => match malloc(ev.size, ev.stream) {
                Ok(p) => {
                    let n = rounded(ev.size);
                    allocated += n;
                    if let Some((old, m, pending)) = ptrs.insert(ev.addr, (p, n, false)) {
                        // The recording reused an address we still hold: a free was lost.
                        let _ = a.free(old, 0, 0);
                        if !pending {
                            allocated = allocated.saturating_sub(m);
                        }
                    }
                    peak_allocated = peak_allocated.max(allocated);
                }
                Err(_) => ooms += 1,
            },
            // Without requests in the trace (older PyTorch, logs) the completed free is
            // the program's free too.
            Action::FreeRequested | Action::FreeCompleted => {
                let done = ev.action == Action::FreeCompleted;
                let Some(e) = ptrs.get_mut(&ev.addr) else {
                    continue;
                };
                if !e.2 {
                    allocated = allocated.saturating_sub(e.1);
                    e.2 = true;
                }
                if done {
                    let _ = a.free(e.0, 0, 0);
                    ptrs.remove(&ev.addr);
                }
            }
            _ => {}
        }
    }
    let stats = a.stats(0);
    let stat = |k: &str| stats.get(k).copied().unwrap_or(0).max(0) as u64;
    let counters = fake.counters();
    Ok(Row {
        label,
        peak_reserved: Some(stat("reserved_bytes.all.peak")),
        peak_allocated,
        device_allocs: Some(counters.malloc + counters.create_physical),
        ooms,
    })
}

/// Replay every device of `snap` under the recorded settings (when recorded) and `confs`.
pub fn replay(snap: &Snapshot, confs: &[String]) -> Result<Replay, String> {
    let mut notes = Vec::new();
    match &snap.settings {
        Some(s) => notes.push(format!("recorded settings: {:?}", s)),
        None => notes.push("the input records no allocator settings: the recorded row is replayed under PyTorch's defaults".into()),
    }
    match snap.device_total {
        Some(t) if t > UNLIMITED => notes.push(format!(
            "the device's recorded size ({t} bytes) is beyond what the replay models: it runs on 256 GiB"
        )),
        Some(t) => notes.push(format!(
            "replays run on a device of the recorded size, {t} bytes"
        )),
        None => notes.push("the device's size is not recorded: replays run on a 256 GiB device (no OOMs below that; garbage_collection_threshold never triggers)".into()),
    }
    notes.push(NO_FIXED_PAGES.into());
    let mut devices = Vec::new();
    for dev in snap.devices.iter().filter(|d| !d.events.is_empty()) {
        let st = start_of(snap, dev);
        let mut dnotes = Vec::new();
        let before = st.state.allocated.len() + st.state.pending.len();
        if before > 0 {
            let bytes = st.state.allocated_bytes + st.state.pending_bytes;
            dnotes.push(format!(
                "{before} blocks ({bytes} bytes) were live before the trace began (inferred from the segments by undoing the trace); their allocation order and sites are not known"
            ));
        }
        if st.inconsistent > 0 {
            dnotes.push(format!(
                "{} events contradict the recorded state and were skipped",
                st.inconsistent
            ));
        }
        if st.requests {
            dnotes.push("blocks return to the cache when their recorded free completed; under other settings frees might complete at other times".into());
        }
        let mut rows = vec![recorded_row(snap, dev, &st)];
        let before = live_before(&st);
        let recorded_conf = snap.settings.clone().unwrap_or_default();
        rows.push(replay_device(
            snap,
            dev,
            &before,
            &recorded_conf,
            format!("replay: recorded ({})", shown(&recorded_conf)),
        )?);
        for c in confs {
            rows.push(replay_device(
                snap,
                dev,
                &before,
                c,
                format!("replay: {}", shown(c)),
            )?);
        }
        devices.push(DeviceReplay {
            ordinal: dev.ordinal,
            rows,
            notes: dnotes,
        });
    }
    Ok(Replay { devices, notes })
}

fn shown(conf: &str) -> &str {
    if conf.is_empty() {
        "PyTorch defaults"
    } else {
        conf
    }
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

/// The text `cushim replay` prints.
pub fn render(r: &Replay) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for d in &r.devices {
        let _ = writeln!(out, "device {}:", d.ordinal);
        let _ = writeln!(
            out,
            "  {:<48} {:>14} {:>15} {:>8} {:>12} {:>5}",
            "settings", "peak reserved", "peak allocated", "frag", "device allocs", "OOMs"
        );
        for row in &d.rows {
            let allocs = row
                .device_allocs
                .map_or_else(|| "-".to_string(), |n| n.to_string());
            let reserved = row.peak_reserved.map_or_else(|| "-".to_string(), mib);
            let frag = row
                .fragmentation()
                .map_or_else(|| "-".to_string(), |f| format!("{:.1}%", f * 100.0));
            let _ = writeln!(
                out,
                "  {:<48} {:>10} MiB {:>11} MiB {:>8} {:>12} {:>5}",
                row.label,
                reserved,
                mib(row.peak_allocated),
                frag,
                allocs,
                row.ooms
            );
        }
        for n in &d.notes {
            let _ = writeln!(out, "  note: {n}");
        }
    }
    if r.devices.is_empty() {
        out.push_str("no device trace to replay in this input\n");
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}
