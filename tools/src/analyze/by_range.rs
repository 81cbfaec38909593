//! Bytes by NVTX range path (`cushim summary --by range`): which phase of the program made
//! the memory, which phase held the most at the peak, and what outlived its phase.
//!
//! Reads the trace entries' `user_metadata` (the range path the shim records, see
//! `trace::range`) from the snapshot tree itself. Walks each device's trace: an `alloc` is
//! live until the program frees it (`free_requested`, or `free_completed` when the request
//! was not recorded: the bytes the program holds, as `memory_allocated` counts them),
//! charged to the path it was made in (`(no range)` when it carries none). Per path: bytes
//! allocated in all, the most it held live at once, what it held at the device's peak, and
//! what is still live at the end of the trace. A trace that starts after the program did
//! (ring overwrite) sees frees of blocks it never saw made; those are ignored.

use cushim::snapshot::value::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// The path of an entry made outside every range.
pub const NO_RANGE: &str = "(no range)";

/// Bytes of one range path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeBytes {
    pub allocs: u64,
    pub allocated: u64,
    pub peak: u64,
    pub at_peak: u64,
    pub live_at_end: u64,
}

/// One device's bytes by range path.
#[derive(Debug, Clone, Default)]
pub struct DeviceRanges {
    pub device: usize,
    /// The device's peak of live bytes in the trace.
    pub peak: u64,
    pub paths: BTreeMap<String, RangeBytes>,
}

fn entries(trace: &Value) -> Vec<Value> {
    match trace {
        Value::Events(list) => (0..list.len()).map(|i| list.entry(i)).collect(),
        v => v.as_seq().map(|s| s.to_vec()).unwrap_or_default(),
    }
}

/// Bytes by range path of every device with a trace.
pub fn by_range(snapshot: &Value) -> Result<Vec<DeviceRanges>, String> {
    let traces = snapshot
        .get("device_traces")
        .and_then(Value::as_seq)
        .ok_or("expected a snapshot with device_traces (a list of lists)")?;
    let mut out = Vec::new();
    for (d, trace) in traces.iter().enumerate() {
        let evs = entries(trace);
        if evs.is_empty() {
            continue;
        }
        let mut dev = DeviceRanges {
            device: d,
            ..DeviceRanges::default()
        };
        let mut live: HashMap<u64, (u64, String)> = HashMap::new();
        let mut per_path: HashMap<String, u64> = HashMap::new();
        let mut total = 0u64;
        for (n, e) in evs.iter().enumerate() {
            let action = e.get("action").and_then(Value::as_str).unwrap_or("");
            let addr = e.get("addr").and_then(Value::as_i64).unwrap_or(0) as u64;
            let size = e
                .get("size")
                .and_then(Value::as_i64)
                .filter(|s| *s >= 0)
                .ok_or_else(|| format!("device_traces[{d}][{n}].size: expected a size"))?
                as u64;
            if action == "alloc" {
                let path = e
                    .get("user_metadata")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .unwrap_or(NO_RANGE)
                    .to_string();
                let r = dev.paths.entry(path.clone()).or_default();
                r.allocs += 1;
                r.allocated += size;
                let held = per_path.entry(path.clone()).or_default();
                *held += size;
                r.peak = r.peak.max(*held);
                if let Some((old, old_path)) = live.insert(addr, (size, path)) {
                    // An address reused without a free we saw: drop the old block.
                    total -= old;
                    if let Some(h) = per_path.get_mut(&old_path) {
                        *h -= old;
                    }
                }
                total += size;
                if total > dev.peak {
                    dev.peak = total;
                    for (p, r) in dev.paths.iter_mut() {
                        r.at_peak = per_path.get(p).copied().unwrap_or(0);
                    }
                }
            } else if action == "free_requested" || action == "free_completed" {
                if let Some((sz, path)) = live.remove(&addr) {
                    total -= sz;
                    if let Some(h) = per_path.get_mut(&path) {
                        *h -= sz;
                    }
                }
            }
        }
        for (sz, path) in live.values() {
            if let Some(r) = dev.paths.get_mut(path) {
                r.live_at_end += sz;
            }
        }
        out.push(dev);
    }
    Ok(out)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// The table `cushim summary --by range` prints.
pub fn render(devs: &[DeviceRanges]) -> String {
    let mut s = String::new();
    if devs.is_empty() {
        s.push_str("no trace entries: record history (CUSHIM_HISTORY) to see bytes by range\n");
    }
    for dev in devs {
        let _ = writeln!(s, "device {}: peak {} live", dev.device, mib(dev.peak));
        if let Some((p, _)) = dev
            .paths
            .iter()
            .filter(|(_, r)| r.at_peak > 0)
            .max_by_key(|(_, r)| r.at_peak)
        {
            let _ = writeln!(s, "  held the most at the peak: {p}");
        }
        let _ = writeln!(
            s,
            "  {:>12} {:>12} {:>12} {:>12} {:>7}  range",
            "at peak", "peak", "live at end", "allocated", "allocs"
        );
        let mut rows: Vec<_> = dev.paths.iter().collect();
        rows.sort_by(|a, b| b.1.at_peak.cmp(&a.1.at_peak).then(a.0.cmp(b.0)));
        for (p, r) in rows {
            let _ = writeln!(
                s,
                "  {:>12} {:>12} {:>12} {:>12} {:>7}  {p}",
                mib(r.at_peak),
                mib(r.peak),
                mib(r.live_at_end),
                mib(r.allocated),
                r.allocs
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(entries: serde_json::Value) -> Value {
        Value::from_json(&serde_json::json!({ "segments": [], "device_traces": [entries] }))
    }

    #[test]
    fn bytes_are_charged_to_the_path_they_were_made_in_until_freed() {
        let s = snap(serde_json::json!([
            {"action": "alloc", "addr": 1, "size": 10, "user_metadata": "a"},
            {"action": "alloc", "addr": 2, "size": 30, "user_metadata": "a/b"},
            {"action": "free_requested", "addr": 2, "size": 30},
            {"action": "free_completed", "addr": 2, "size": 30},
            {"action": "alloc", "addr": 3, "size": 5},
        ]));
        let d = &by_range(&s).unwrap()[0];
        assert_eq!(d.peak, 40);
        let ab = &d.paths["a/b"];
        assert_eq!(
            (ab.allocated, ab.peak, ab.at_peak, ab.live_at_end),
            (30, 30, 30, 0)
        );
        let a = &d.paths["a"];
        assert_eq!((a.at_peak, a.live_at_end), (10, 10));
        assert_eq!(d.paths[NO_RANGE].live_at_end, 5);
        assert!(render(std::slice::from_ref(d)).contains("held the most at the peak: a/b"));
    }

    #[test]
    fn a_trace_without_sizes_is_an_error_naming_the_entry() {
        let s = snap(serde_json::json!([{"action": "alloc", "addr": 1}]));
        let e = by_range(&s).unwrap_err();
        assert!(e.contains("device_traces[0][0].size"), "{e}");
    }
}
