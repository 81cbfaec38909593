//! `cushim summary`: a text digest of a snapshot (ours or PyTorch's), from the one model
//! (`analyze::model`) every analysis reads.
//!
//! Invariant: figures come only from the input: current values from `segments`, peaks from
//! the trace walked forward from its reconstructed start (`analyze::timeline`), so a peak
//! covers the recorded window and is never below the current value. "Allocated" counts
//! blocks the program holds; blocks it freed that wait for other streams ("pending free")
//! are reported apart, as PyTorch's `allocated_bytes` does. Blocks are attributed to the
//! program's first frame (`analyze::frames`). Devices with nothing on them are left out.
//!
//! Structure: [`device_summary`] computes one [`DeviceSummary`]; [`write_device`] prints
//! it section by section (add a section there); [`ranks`] prints the per-rank table;
//! `analyze::kinds` adds the observed kinds and the unexplained memory after each device.

use crate::analyze::load::from_value;
use crate::analyze::model::{BlockState, Device, Snapshot};
use crate::analyze::recorded_stats::{recorded_peaks, PeakSource};
use crate::analyze::sites::{by_site, tree, Node};
use crate::analyze::timeline::{end_state, State};
use crate::analyze::walk::{walk, Walked};
use cushim::snapshot::value::Value;
use std::fmt::Write;

/// How much to show.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Frames per site: the program's first frame and `depth - 1` callers.
    pub depth: usize,
    /// Also print the top-down tree of live bytes.
    pub tree: bool,
    /// Rows per list.
    pub top: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            depth: 1,
            tree: false,
            top: 5,
        }
    }
}

/// Per-device figures.
#[derive(Debug, Clone, Default)]
pub struct DeviceSummary {
    pub segments: usize,
    pub reserved: u64,
    /// Bytes in blocks the program holds.
    pub allocated: u64,
    /// Bytes in blocks freed by the program and waiting for other streams' work.
    pub pending: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Where the peaks come from (`analyze::recorded_stats`).
    pub peak_source: PeakSource,
    pub largest_free_block: u64,
    /// `(pool, segments, reserved, allocated)` of each private pool (PyTorch's
    /// `segment_pool_id` other than `(0, 0)`: a CUDA graph's or a `torch.cuda.MemPool`'s),
    /// by pool id.
    pub pools: Vec<((i64, i64), usize, u64, u64)>,
    /// `(site, live bytes, live count)` of allocated blocks, sorted by bytes descending.
    pub sites: Vec<(String, u64, u64)>,
    /// The same at the trace's peak of allocated bytes (as `report` shows them), with the
    /// event it followed; empty without a trace.
    pub peak_sites: Vec<(String, u64, u64)>,
    pub peak_at: usize,
    /// The top-down tree of allocated bytes.
    pub tree: Node,
    /// Events that contradict the recorded state.
    pub inconsistent: u64,
    /// Whether the input records segments (a log records allocations only).
    pub reserved_known: bool,
    /// Whether the input lists its segments (a log has only events).
    pub segments_known: bool,
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

/// Figures of one device (or of pinned host memory).
pub fn device_summary(snap: &Snapshot, dev: &Device, opts: &Options) -> DeviceSummary {
    device_summary_walked(snap, dev, opts, &walk(snap, dev), None)
}

/// [`device_summary`] from the device's [`Walked`] (and its state at the peak, when the
/// caller has it), when the caller walked the trace already.
pub fn device_summary_walked(
    snap: &Snapshot,
    dev: &Device,
    opts: &Options,
    w: &Walked,
    at_peak: Option<&State>,
) -> DeviceSummary {
    let st = &w.start;
    let p = w.peaks;
    let end: std::borrow::Cow<State> = if snap.has_state {
        std::borrow::Cow::Owned(end_state(dev))
    } else {
        std::borrow::Cow::Borrowed(&w.end)
    };
    // The recorded statistics cover the whole run (a trace, its window; no trace at all
    // with history off): they give the peaks when the snapshot has them.
    let (peak_allocated, peak_reserved, peak_source) = match recorded_peaks(snap, dev.ordinal) {
        Some((a, r)) => (
            a.max(end.allocated_bytes),
            r.max(end.reserved),
            PeakSource::Stats,
        ),
        // The walk's peak is in the trace's sizes (PyTorch records the request), the
        // segments' end state in block sizes (a large block keeps up to 1 MiB past its
        // request): with a trace, the peak is compared with the walk's own end, so that
        // it is the moment's allocated bytes that `--by category` splits.
        None if !dev.events.is_empty() => (
            p.allocated.max(w.end.allocated_bytes),
            p.reserved.max(end.reserved),
            PeakSource::Trace,
        ),
        None => (
            p.allocated.max(end.allocated_bytes),
            p.reserved.max(end.reserved),
            PeakSource::Segments,
        ),
    };
    let largest_free_block = dev
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::Inactive)
        .map(|b| b.size)
        .max()
        .unwrap_or(0);
    let sites = by_site(&snap.stacks, end.allocated.values(), opts.depth)
        .into_iter()
        .map(|r| (r.site, r.bytes, r.count))
        .collect();
    let peak_sites = if dev.events.is_empty() {
        Vec::new()
    } else {
        let walked_at;
        let at = match at_peak {
            Some(a) => a,
            None => {
                walked_at = w.at_peak(dev);
                &walked_at
            }
        };
        by_site(&snap.stacks, at.allocated.values(), opts.depth)
            .into_iter()
            .map(|r| (r.site, r.bytes, r.count))
            .collect()
    };
    let mut pools: Vec<((i64, i64), usize, u64, u64)> = Vec::new();
    for seg in dev.segments.iter().filter(|s| s.pool != (0, 0)) {
        let allocated: u64 = seg
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Allocated)
            .map(|b| b.size)
            .sum();
        match pools.iter_mut().find(|p| p.0 == seg.pool) {
            Some(p) => {
                p.1 += 1;
                p.2 += seg.total_size;
                p.3 += allocated;
            }
            None => pools.push((seg.pool, 1, seg.total_size, allocated)),
        }
    }
    pools.sort_by_key(|p| p.0);
    DeviceSummary {
        pools,
        peak_sites,
        peak_at: p.allocated_at,
        segments: dev.segments.len(),
        reserved: end.reserved,
        allocated: end.allocated_bytes,
        pending: end.pending_bytes,
        peak_reserved,
        peak_allocated,
        peak_source,
        largest_free_block,
        sites,
        tree: if opts.tree {
            tree(&snap.stacks, end.allocated.values(), opts.depth.max(4))
        } else {
            Node::default()
        },
        inconsistent: st.inconsistent,
        reserved_known: snap.reserved_known(dev),
        segments_known: snap.has_state,
    }
}

pub(crate) use crate::analyze::units::mib2 as mib;

fn write_tree(out: &mut String, n: &Node, indent: usize, total: u64, top: usize) {
    for c in n.children.iter().take(top) {
        let share = if total == 0 {
            0.0
        } else {
            c.bytes as f64 * 100.0 / total as f64
        };
        let _ = writeln!(
            out,
            "    {:indent$}{:>12} {:>5.1}%  {}",
            "",
            mib(c.bytes),
            share,
            c.frame,
            indent = indent
        );
        write_tree(out, c, indent + 2, total, top);
    }
}

/// Print one device's summary.
pub fn write_device(out: &mut String, title: &str, s: &DeviceSummary, opts: &Options) {
    let _ = writeln!(out, "{title}:");
    let _ = writeln!(
        out,
        "  allocated: {} (peak {}, {})",
        mib(s.allocated),
        mib(s.peak_allocated),
        s.peak_source.describe()
    );
    if s.pending > 0 {
        let _ = writeln!(
            out,
            "  pending free: {} (freed, waiting for other streams)",
            mib(s.pending)
        );
    }
    if s.reserved_known {
        let _ = writeln!(
            out,
            "  reserved:  {} (peak {}, {})",
            mib(s.reserved),
            mib(s.peak_reserved),
            s.peak_source.describe()
        );
        let cached = s.reserved.saturating_sub(s.allocated);
        let _ = writeln!(
            out,
            "  fragmentation: {:.1}% of reserved memory is held by the cache but not \
             allocated ({} free inside segments{})",
            s.fragmentation() * 100.0,
            mib(cached),
            if s.pending > 0 {
                format!(", {} of it pending free", mib(s.pending))
            } else {
                String::new()
            }
        );
        if s.segments_known {
            let _ = writeln!(out, "  segments: {}", s.segments);
            let _ = writeln!(out, "  largest free block: {}", mib(s.largest_free_block));
        }
        if !s.pools.is_empty() {
            let _ = writeln!(
                out,
                "  private pools (CUDA graphs, torch.cuda.MemPool; their cached memory serves \
                 only their own allocations):"
            );
            for ((a, b), n, reserved, allocated) in &s.pools {
                let _ = writeln!(
                    out,
                    "    pool ({a}, {b}): {} reserved in {n} segments, {} allocated",
                    mib(*reserved),
                    mib(*allocated)
                );
            }
        }
    } else {
        let _ = writeln!(
            out,
            "  reserved:  not recorded (an allocation log without segments; `cushim replay` estimates it)"
        );
    }
    if s.inconsistent > 0 {
        let _ = writeln!(
            out,
            "  note: {} trace events contradict the recorded state",
            s.inconsistent
        );
    }
    if s.sites.is_empty() {
        return;
    }
    if !s.peak_sites.is_empty() {
        let _ = writeln!(
            out,
            "  top allocation sites at the trace's peak allocated (after event {}), as `report` \
             shows them:",
            s.peak_at
        );
        for (name, bytes, count) in s.peak_sites.iter().take(opts.top) {
            let _ = writeln!(out, "    {:>12}  {count:>7} blocks  {name}", mib(*bytes));
        }
    }
    let _ = writeln!(
        out,
        "  top allocation sites by live bytes (live at the end):"
    );
    for (name, bytes, count) in s.sites.iter().take(opts.top) {
        let _ = writeln!(out, "    {:>12}  {count:>7} blocks  {name}", mib(*bytes));
    }
    let mut by_count: Vec<&(String, u64, u64)> = s.sites.iter().collect();
    by_count.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let _ = writeln!(out, "  top allocation sites by count (live at the end):");
    for (name, bytes, count) in by_count.into_iter().take(opts.top) {
        let _ = writeln!(out, "    {count:>7} blocks  {:>12}  {name}", mib(*bytes));
    }
    if opts.tree && !s.tree.children.is_empty() {
        let _ = writeln!(
            out,
            "  live bytes at the end, top-down (outermost caller first):"
        );
        write_tree(out, &s.tree, 0, s.allocated, opts.top);
    }
}

/// Summaries of the devices with anything on them, by ordinal.
pub fn summaries(snap: &Snapshot, opts: &Options) -> Vec<(i64, DeviceSummary)> {
    snap.devices
        .iter()
        .filter(|d| !d.is_empty())
        .map(|d| (d.ordinal, device_summary(snap, d, opts)))
        .collect()
}

/// The summary of the snapshot's pinned host memory (`host_segments`, `host_traces`), when
/// it has any: shown apart from the devices (`--json`: as device -1), never added to them.
pub fn host_summary(snap: &Snapshot, opts: &Options) -> Option<DeviceSummary> {
    let h = snap.host.as_ref().filter(|h| !h.is_empty())?;
    Some(device_summary(snap, h, opts))
}

/// The text `cushim summary` prints for one input.
pub fn render(snap: &Snapshot, opts: &Options) -> String {
    render_summaries(snap, &summaries(snap, opts), opts)
}

/// [`render`] given the [`Walked`] trace and the state at the peak of the devices the
/// caller walked already (by ordinal); the others are walked here.
pub fn render_walked(snap: &Snapshot, opts: &Options, walked: &[(i64, &Walked, &State)]) -> String {
    let devs: Vec<(i64, DeviceSummary)> = snap
        .devices
        .iter()
        .filter(|d| !d.is_empty())
        .map(|d| {
            let s = match walked.iter().find(|w| w.0 == d.ordinal) {
                Some((_, w, at)) => device_summary_walked(snap, d, opts, w, Some(at)),
                None => device_summary(snap, d, opts),
            };
            (d.ordinal, s)
        })
        .collect();
    render_summaries(snap, &devs, opts)
}

/// [`render`] given the input's [`summaries`] (computed once for [`ranks`] and this).
pub fn render_summaries(snap: &Snapshot, devs: &[(i64, DeviceSummary)], opts: &Options) -> String {
    let mut out = String::new();
    if devs.is_empty() {
        out.push_str("no device memory in this snapshot\n");
    }
    let top = kinds_tree(snap);
    for (d, s) in devs {
        write_device(&mut out, &format!("device {d}"), s, opts);
        if let Some(dev) = snap.device(*d) {
            write_kinds(&mut out, &top, dev, *d);
        }
    }
    if let Some(h) = snap.host.as_ref().filter(|h| !h.is_empty()) {
        write_device(
            &mut out,
            "pinned host memory",
            &device_summary(snap, h, opts),
            opts,
        );
        write_kinds(&mut out, &top, h, -1);
    }
    out
}

/// The part of the snapshot tree `analyze::kinds` reads: its `cushim` section.
fn kinds_tree(snap: &Snapshot) -> Value {
    let cushim = snap.cushim.clone().map(|c| (Value::str("cushim"), c));
    Value::dict(cushim.into_iter().collect())
}

/// `analyze::kinds`' lines for one device, given its segments' kinds and sizes.
fn write_kinds(out: &mut String, top: &Value, dev: &Device, ordinal: i64) {
    let segs: Vec<Value> = dev
        .segments
        .iter()
        .map(|s| {
            let mut e = vec![(Value::str("total_size"), Value::uint(s.total_size))];
            if let Some(k) = &s.kind {
                e.push((Value::str("kind"), Value::Str(k.clone())));
            }
            Value::dict(e)
        })
        .collect();
    let refs: Vec<&Value> = segs.iter().collect();
    crate::analyze::kinds::write_extra(out, top, &refs, ordinal);
}

/// The per-rank table of several inputs (one per rank, with its [`summaries`]): per file and
/// device the peaks, then the spread of the peaks (min, max, max - min, and which file has
/// the largest).
pub fn ranks(inputs: &[(&str, &[(i64, DeviceSummary)])]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:>6} {:>16} {:>16} {:>16}",
        "file", "device", "peak allocated", "peak reserved", "reserved now"
    );
    let mut peaks_a: Vec<(u64, &str)> = Vec::new();
    let mut peaks_r: Vec<(u64, &str)> = Vec::new();
    for &(name, devs) in inputs {
        for (d, s) in devs {
            let _ = writeln!(
                out,
                "{:<40} {:>6} {:>16} {:>16} {:>16}",
                name,
                d,
                mib(s.peak_allocated),
                mib(s.peak_reserved),
                mib(s.reserved)
            );
            peaks_a.push((s.peak_allocated, name));
            peaks_r.push((s.peak_reserved, name));
        }
    }
    for (what, v) in [("peak allocated", &peaks_a), ("peak reserved", &peaks_r)] {
        let (Some(min), Some(max)) = (v.iter().min(), v.iter().max()) else {
            continue;
        };
        let _ = writeln!(
            out,
            "spread of {what}: min {} max {} (max - min {}, largest in {})",
            mib(min.0),
            mib(max.0),
            mib(max.0 - min.0),
            max.1
        );
    }
    out
}

/// Summaries per device of a snapshot tree.
pub fn devices(v: &Value) -> Result<Vec<(i64, DeviceSummary)>, String> {
    Ok(summaries(&from_value(v)?, &Options::default()))
}

/// The text `cushim summary` prints for a snapshot tree.
pub fn summary(v: &Value) -> Result<String, String> {
    Ok(render(&from_value(v)?, &Options::default()))
}
