//! `cushim summary`: a text digest of a snapshot (ours or PyTorch's).
//!
//! Invariant: figures come only from the snapshot: current values from `segments`, peaks
//! from replaying `device_traces` backwards from the current state (so a peak covers the
//! recorded window and is never below the current value).

use crate::snapshot::value::Value;
use std::collections::HashMap;
use std::fmt::Write;

/// Per-device figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSummary {
    pub segments: usize,
    pub reserved: u64,
    /// Bytes in active blocks (allocated or pending free), as the viewer draws them.
    pub allocated: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub largest_free_block: u64,
    /// `(site, live bytes, live count)`, sorted by bytes descending.
    pub sites: Vec<(String, u64, u64)>,
}

impl DeviceSummary {
    /// `1 - allocated / reserved` (0 when nothing is reserved).
    pub fn fragmentation(&self) -> f64 {
        if self.reserved == 0 {
            0.0
        } else {
            1.0 - self.allocated as f64 / self.reserved as f64
        }
    }
}

fn u(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_i64).map_or(0, |i| i.max(0) as u64)
}

fn site(frames: Option<&Value>) -> String {
    let first = frames.and_then(Value::as_seq).and_then(|f| f.first());
    match first {
        Some(f) => {
            let name = f.get("name").and_then(Value::as_str).unwrap_or("?");
            let file = f.get("filename").and_then(Value::as_str).unwrap_or("?");
            format!("{name} ({file}:{})", u(f.get("line")))
        }
        None => "<no stack>".to_string(),
    }
}

/// Figures of one device (or of pinned host memory) from its segments and trace.
pub fn device_summary(segments: &[&Value], trace: &[Value]) -> DeviceSummary {
    let mut s = DeviceSummary {
        segments: segments.len(),
        ..Default::default()
    };
    let mut live: HashMap<i64, u64> = HashMap::new();
    let mut sites: HashMap<String, (u64, u64)> = HashMap::new();
    for seg in segments {
        s.reserved += u(seg.get("total_size"));
        for b in seg.get("blocks").and_then(Value::as_seq).unwrap_or(&[]) {
            let size = u(b.get("size"));
            match b.get("state").and_then(Value::as_str) {
                Some("inactive") => s.largest_free_block = s.largest_free_block.max(size),
                Some(_) => {
                    // Active: allocated, or freed with work possibly still using it.
                    s.allocated += size;
                    live.insert(b.get("address").and_then(Value::as_i64).unwrap_or(0), size);
                    let e = sites.entry(site(b.get("frames"))).or_default();
                    e.0 += size;
                    e.1 += 1;
                }
                None => {}
            }
        }
    }
    let (mut alloc, mut res) = (s.allocated as i128, s.reserved as i128);
    let (mut peak_a, mut peak_r) = (alloc, res);
    for ev in trace.iter().rev() {
        let addr = ev.get("addr").and_then(Value::as_i64).unwrap_or(0);
        let size = u(ev.get("size")) as i128;
        match ev.get("action").and_then(Value::as_str).unwrap_or("") {
            "alloc" => alloc -= live.remove(&addr).map_or(size, i128::from),
            "free_completed" => {
                live.insert(addr, size as u64);
                alloc += size
            }
            "segment_alloc" | "segment_map" => res -= size,
            "segment_free" | "segment_unmap" => res += size,
            _ => {}
        }
        peak_a = peak_a.max(alloc);
        peak_r = peak_r.max(res);
    }
    s.peak_allocated = peak_a.max(0) as u64;
    s.peak_reserved = peak_r.max(0) as u64;
    s.sites = sites.into_iter().map(|(k, (b, c))| (k, b, c)).collect();
    s.sites
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    s
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

fn write_device(out: &mut String, title: &str, s: &DeviceSummary) {
    let _ = writeln!(out, "{title}:");
    let _ = writeln!(
        out,
        "  allocated: {} (peak {})",
        mib(s.allocated),
        mib(s.peak_allocated)
    );
    let _ = writeln!(
        out,
        "  reserved:  {} (peak {})",
        mib(s.reserved),
        mib(s.peak_reserved)
    );
    let _ = writeln!(out, "  fragmentation: {:.1}%", s.fragmentation() * 100.0);
    let _ = writeln!(out, "  segments: {}", s.segments);
    let _ = writeln!(out, "  largest free block: {}", mib(s.largest_free_block));
    if s.sites.is_empty() {
        return;
    }
    let _ = writeln!(out, "  top allocation sites by live bytes:");
    for (name, bytes, count) in s.sites.iter().take(5) {
        let _ = writeln!(out, "    {:>12}  {count:>7} blocks  {name}", mib(*bytes));
    }
    let mut by_count: Vec<&(String, u64, u64)> = s.sites.iter().collect();
    by_count.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let _ = writeln!(out, "  top allocation sites by count:");
    for (name, bytes, count) in by_count.into_iter().take(5) {
        let _ = writeln!(out, "    {count:>7} blocks  {:>12}  {name}", mib(*bytes));
    }
}

/// Summaries per device ordinal (segments' devices and `device_traces` indices).
pub fn devices(v: &Value) -> Vec<(i64, DeviceSummary)> {
    let v = &v.expanded();
    let segs = v.get("segments").and_then(Value::as_seq).unwrap_or(&[]);
    let traces = v
        .get("device_traces")
        .and_then(Value::as_seq)
        .unwrap_or(&[]);
    let mut ords: Vec<i64> = segs
        .iter()
        .filter_map(|s| s.get("device")?.as_i64())
        .collect();
    ords.extend(0..traces.len() as i64);
    ords.sort_unstable();
    ords.dedup();
    ords.into_iter()
        .map(|d| {
            let mine: Vec<&Value> = segs
                .iter()
                .filter(|s| s.get("device").and_then(Value::as_i64) == Some(d))
                .collect();
            let trace = usize::try_from(d)
                .ok()
                .and_then(|i| traces.get(i))
                .and_then(Value::as_seq)
                .unwrap_or(&[]);
            (d, device_summary(&mine, trace))
        })
        .collect()
}

/// The text `cushim summary` prints.
pub fn summary(v: &Value) -> String {
    let v = &v.expanded();
    let mut out = String::new();
    let devs = devices(v);
    if devs.is_empty() {
        out.push_str("no device memory in this snapshot\n");
    }
    let segs = v.get("segments").and_then(Value::as_seq).unwrap_or(&[]);
    for (d, s) in &devs {
        write_device(&mut out, &format!("device {d}"), s);
        let mine: Vec<&Value> = segs
            .iter()
            .filter(|s| s.get("device").and_then(Value::as_i64) == Some(*d))
            .collect();
        crate::snapshot::kinds::write_extra(&mut out, v, &mine, *d);
    }
    if let Some(hs) = v.get("host_segments").and_then(Value::as_seq) {
        let hs: Vec<&Value> = hs.iter().collect();
        let ht = v.get("host_traces").and_then(Value::as_seq).unwrap_or(&[]);
        write_device(&mut out, "pinned host memory", &device_summary(&hs, ht));
        crate::snapshot::kinds::write_extra(&mut out, v, &hs, -1);
    }
    out
}
