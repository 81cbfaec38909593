//! Bytes by NVTX range path (`cushim summary --by range`): which phase of the program made
//! the memory, which phase held the most at the peak, and what outlived its phase.
//!
//! Reads a snapshot's trace entries' `user_metadata` (the range path the shim records, see
//! `trace::range`) from the snapshot tree itself, or a whole-run log's events and their
//! range paths (`RANGES`), in two passes over the log: its range starts and ends first
//! (`MARKS`, log version 3), then its events. Walks each device's trace: an `alloc` is
//! live until the program frees it (`free_requested`, or `free_completed` when the request
//! was not recorded: the bytes the program holds, as `memory_allocated` counts them),
//! charged to the path it was made in (`(no range)` when it carries none). Per path: bytes
//! allocated in all, the most it held live at once, what it held at the device's peak, and
//! what is still live at the end of the trace. A trace that starts after the program did
//! (ring overwrite) sees frees of blocks it never saw made; those are ignored.
//!
//! Policy (outlived its range): an allocation outlived the range that made it when the
//! program had not freed it by the time that range instance ended: a buffer kept past its
//! phase, and, when a loop's iteration range makes one each time, a leak across iterations.
//! Instances come from the snapshot's `external_annotations` that carry a `range` (the path,
//! which the shim writes), or from the log's marks: each path's starts and ends, paired in
//! the order recorded. An
//! allocation at time `t` belongs to the last instance of its path started at or before `t`;
//! one whose instance is still open at the snapshot, or whose start the annotations no
//! longer hold (the newest are kept), is not judged. Times are microseconds: a free in the
//! same microsecond as the end counts as inside the range. Two threads in the same path at
//! once are one sequence of instances here (the annotations do not name threads), so an end
//! may be paired with the other thread's start. A log older than version 3 has no starts
//! and ends: "outlived" is then not known, as for a snapshot without them. Pinned host
//! memory (device -1 in a log) is not a device trace and is left out, as in snapshots.

use cushim::snapshot::value::Value;
use cushim::trace::event::Action;
use cushim::trace::event::TraceEvent;
use cushim::trace::log::codec::RangeMark;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::Path;

use crate::analyze::annotations;
use crate::snapshot::log_reader::{self, LogFrame, LogVisitor};

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
    /// Allocations not freed by the end of the range instance that made them, and bytes.
    pub outlived: u64,
    pub outlived_bytes: u64,
    /// Of those, still live at the end of the trace.
    pub outlived_live_at_end: u64,
}

/// One device's bytes by range path.
#[derive(Debug, Clone, Default)]
pub struct DeviceRanges {
    pub device: usize,
    /// The device's peak of live bytes in the trace.
    pub peak: u64,
    pub paths: BTreeMap<String, RangeBytes>,
    /// Whether the input has range starts and ends to judge "outlived" by.
    pub has_instances: bool,
}

/// A path, as a key: an index into the input's path names (a snapshot's strings, a log's
/// range ids).
type Key = u32;

/// Each range path's instances, `(start, end)` in microseconds (`None`: still open), in
/// start order.
type Instances = HashMap<Key, Vec<(i64, Option<i64>)>>;

/// A start (or end) of an instance of `key` at `t`.
fn add_instance(inst: &mut Instances, key: Key, start: bool, t: i64) {
    let v = inst.entry(key).or_default();
    if start {
        v.push((t, None));
    } else if let Some(open) = v.iter_mut().rev().find(|i| i.1.is_none()) {
        // The latest instance still open: a thread's own path cannot be open twice.
        open.1 = Some(t);
    }
}

/// When the instance of `key` that was open at `t` ended: `None` when it has not, or no
/// recorded instance had started by `t`.
fn end_of(inst: &Instances, key: Key, t: i64) -> Option<i64> {
    let v = inst.get(&key)?;
    let at = v.partition_point(|i| i.0 <= t).checked_sub(1)?;
    v[at].1
}

/// A block the program holds: its size, path, and when its range instance ended.
struct Live {
    size: u64,
    path: Key,
    range_end: Option<i64>,
}

/// One device's walk: what each path allocated and holds.
#[derive(Default)]
struct Tally {
    peak: u64,
    paths: HashMap<Key, RangeBytes>,
    held: HashMap<Key, u64>,
    live: HashMap<u64, Live>,
    total: u64,
}

impl Tally {
    fn alloc(&mut self, inst: &Instances, addr: u64, size: u64, path: Key, time: Option<i64>) {
        let range_end = time.and_then(|t| end_of(inst, path, t));
        let r = self.paths.entry(path).or_default();
        r.allocs += 1;
        r.allocated += size;
        let held = self.held.entry(path).or_default();
        *held += size;
        r.peak = r.peak.max(*held);
        let b = Live {
            size,
            path,
            range_end,
        };
        if let Some(old) = self.live.insert(addr, b) {
            // An address reused without a free we saw: the old block was gone by now.
            self.gone(old, time);
        }
        self.total += size;
        if self.total > self.peak {
            self.peak = self.total;
            for (p, r) in self.paths.iter_mut() {
                r.at_peak = self.held.get(p).copied().unwrap_or(0);
            }
        }
    }

    fn free(&mut self, addr: u64, time: Option<i64>) {
        if let Some(b) = self.live.remove(&addr) {
            self.gone(b, time);
        }
    }

    /// Block `b` stopped being live at `t` (freed, or its address reused).
    fn gone(&mut self, b: Live, t: Option<i64>) {
        self.total -= b.size;
        if let Some(h) = self.held.get_mut(&b.path) {
            *h -= b.size;
        }
        if let (Some(end), Some(t)) = (b.range_end, t) {
            if t > end {
                if let Some(r) = self.paths.get_mut(&b.path) {
                    r.outlived += 1;
                    r.outlived_bytes += b.size;
                }
            }
        }
    }

    /// The device's rows, each path named by `name`.
    fn finish(
        mut self,
        device: usize,
        has_instances: bool,
        name: &dyn Fn(Key) -> String,
    ) -> DeviceRanges {
        for b in self.live.values() {
            if let Some(r) = self.paths.get_mut(&b.path) {
                r.live_at_end += b.size;
                if b.range_end.is_some() {
                    r.outlived += 1;
                    r.outlived_bytes += b.size;
                    r.outlived_live_at_end += 1;
                }
            }
        }
        DeviceRanges {
            device,
            peak: self.peak,
            paths: self.paths.into_iter().map(|(k, r)| (name(k), r)).collect(),
            has_instances,
        }
    }
}

/// A snapshot's path strings as keys (`NO_RANGE` is key 0).
#[derive(Default)]
struct Names {
    names: Vec<String>,
    keys: HashMap<String, Key>,
}

impl Names {
    fn key(&mut self, s: &str) -> Key {
        if let Some(&k) = self.keys.get(s) {
            return k;
        }
        let k = self.names.len() as Key;
        self.names.push(s.to_string());
        self.keys.insert(s.to_string(), k);
        k
    }
}

fn entries(trace: &Value) -> Vec<Value> {
    match trace {
        Value::Events(list) => (0..list.len()).map(|i| list.entry(i)).collect(),
        v => v.as_seq().map(|s| s.to_vec()).unwrap_or_default(),
    }
}

/// Range instances from `external_annotations` entries that carry a `range`, and from
/// PyTorch's own (`analyze::annotations`: each path's starts and ends, per device).
fn instances(
    snapshot: &Value,
    names: &mut Names,
    timelines: &HashMap<i64, annotations::Timeline>,
) -> Instances {
    let mut out = Instances::new();
    for tl in timelines.values() {
        for (path, start, t) in &tl.marks {
            add_instance(&mut out, names.key(path), *start, *t);
        }
    }
    let Some(list) = snapshot.get("external_annotations").and_then(Value::as_seq) else {
        return out;
    };
    for a in list {
        let (Some(path), Some(stage), Some(t)) = (
            a.get("range").and_then(Value::as_str),
            a.get("stage").and_then(Value::as_str),
            a.get("time_us").and_then(Value::as_i64),
        ) else {
            continue;
        };
        match stage {
            "START" => add_instance(&mut out, names.key(path), true, t),
            "END" => add_instance(&mut out, names.key(path), false, t),
            _ => {}
        }
    }
    out
}

/// Bytes by range path of every device with a trace.
pub fn by_range(snapshot: &Value) -> Result<Vec<DeviceRanges>, String> {
    let traces = snapshot
        .get("device_traces")
        .and_then(Value::as_seq)
        .ok_or("expected a snapshot with device_traces (a list of lists)")?;
    let mut names = Names::default();
    names.key(NO_RANGE);
    let timelines = annotations::timelines(snapshot);
    let mut inst = instances(snapshot, &mut names, &timelines);
    // PyTorch 2.4's annotations are inline in the traces: their instances first, so an
    // allocation knows when its instance ends.
    for trace in traces {
        let mut nesting = annotations::Nesting::default();
        for e in entries(trace) {
            if let Some((name, start)) = annotations::inline(&e) {
                let time = e.get("time_us").and_then(Value::as_i64);
                if let (Some(p), Some(time)) = (nesting.apply(&name, start), time) {
                    add_instance(&mut inst, names.key(&p), start, time);
                }
            }
        }
    }
    let inst = inst;
    let mut tallies = Vec::new();
    for (d, trace) in traces.iter().enumerate() {
        let evs = entries(trace);
        if evs.is_empty() {
            continue;
        }
        let mut t = Tally::default();
        // PyTorch 2.4's annotations, inline in the trace.
        let mut nesting = annotations::Nesting::default();
        let timeline = timelines.get(&(d as i64));
        for (n, e) in evs.iter().enumerate() {
            if let Some((name, start)) = annotations::inline(e) {
                nesting.apply(&name, start);
                continue;
            }
            let action = e.get("action").and_then(Value::as_str).unwrap_or("");
            let addr = e.get("addr").and_then(Value::as_i64).unwrap_or(0) as u64;
            let time = e.get("time_us").and_then(Value::as_i64);
            let size = e
                .get("size")
                .and_then(Value::as_i64)
                .filter(|s| *s >= 0)
                .ok_or_else(|| format!("device_traces[{d}][{n}].size: expected a size"))?
                as u64;
            if action == "alloc" {
                let annotated = nesting
                    .path()
                    .or_else(|| timeline.and_then(|tl| tl.path_at(time?)))
                    .cloned();
                let path = e
                    .get("user_metadata")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .or(annotated.as_deref())
                    .unwrap_or(NO_RANGE);
                let key = names.key(path);
                t.alloc(&inst, addr, size, key, time);
            } else if action == "free_requested" || action == "free_completed" {
                t.free(addr, time);
            }
        }
        tallies.push((d, t));
    }
    let name = |k: Key| names.names[k as usize].clone();
    Ok(tallies
        .into_iter()
        .map(|(d, t)| t.finish(d, !inst.is_empty(), &name))
        .collect())
}

/// The first pass over a log: its range paths, and their instances from the marks.
#[derive(Default)]
struct LogRanges {
    paths: HashMap<u32, String>,
    inst: Instances,
}

impl LogVisitor for LogRanges {
    fn event(&mut self, _ev: TraceEvent) {}
    fn frame(&mut self, _id: u64, _frame: LogFrame) {}
    fn stack(&mut self, _id: u32, _frames: Vec<u64>) {}
    fn range(&mut self, id: u32, path: String) {
        self.paths.insert(id, path);
    }
    fn range_mark(&mut self, m: RangeMark) {
        add_instance(&mut self.inst, m.path, m.start, m.time_us);
    }
}

/// The second pass: each device's tally.
struct LogTallies<'a> {
    inst: &'a Instances,
    devices: BTreeMap<usize, Tally>,
}

impl LogVisitor for LogTallies<'_> {
    fn event(&mut self, ev: TraceEvent) {
        let Ok(d) = usize::try_from(ev.device) else {
            return;
        };
        let t = self.devices.entry(d).or_default();
        match ev.action {
            Action::Alloc => t.alloc(self.inst, ev.addr, ev.size, ev.range, Some(ev.time_us)),
            Action::FreeRequested | Action::FreeCompleted => t.free(ev.addr, Some(ev.time_us)),
            _ => {}
        }
    }
    fn frame(&mut self, _id: u64, _frame: LogFrame) {}
    fn stack(&mut self, _id: u32, _frames: Vec<u64>) {}
}

fn read_log(path: &Path, v: &mut dyn LogVisitor) -> Result<(), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("opening: {e}"))?;
    let info = log_reader::read_log_from(std::io::BufReader::with_capacity(1 << 20, f), v)?;
    if let Some(p) = info.problem {
        eprintln!("cushim: {}: {p}", path.display());
    }
    Ok(())
}

/// Bytes by range path of every device in the whole-run log at `path`.
pub fn by_range_log(path: &Path) -> Result<Vec<DeviceRanges>, String> {
    let mut first = LogRanges::default();
    read_log(path, &mut first)?;
    let mut second = LogTallies {
        inst: &first.inst,
        devices: BTreeMap::new(),
    };
    // The second pass says nothing the first did not: read it quietly.
    let f = std::fs::File::open(path).map_err(|e| format!("opening: {e}"))?;
    log_reader::read_log_from(std::io::BufReader::with_capacity(1 << 20, f), &mut second)?;
    let has_instances = !first.inst.is_empty();
    let name = |k: Key| {
        if k == cushim::trace::range::NO_RANGE {
            NO_RANGE.to_string()
        } else {
            first
                .paths
                .get(&k)
                .cloned()
                .unwrap_or_else(|| format!("(range {k}: path not in the log)"))
        }
    };
    Ok(second
        .devices
        .into_iter()
        .map(|(d, t)| t.finish(d, has_instances, &name))
        .collect())
}

/// Bytes by range path of a snapshot or a whole-run log (told apart by content).
pub fn by_range_file(path: &Path) -> Result<Vec<DeviceRanges>, String> {
    if crate::snapshot::sniff::is_log_file(path) {
        return by_range_log(path);
    }
    let snap = crate::snapshot::reader::read_file(path)?;
    by_range(&snap)
}

use crate::analyze::units::mib1 as mib;

/// The paths whose allocations outlived their range, most bytes first.
pub fn outliving(dev: &DeviceRanges) -> Vec<(&str, &RangeBytes)> {
    let mut v: Vec<_> = dev
        .paths
        .iter()
        .filter(|(_, r)| r.outlived > 0)
        .map(|(p, r)| (p.as_str(), r))
        .collect();
    v.sort_by(|a, b| {
        b.1.outlived_bytes
            .cmp(&a.1.outlived_bytes)
            .then(a.0.cmp(b.0))
    });
    v
}

/// The path that held the most at the device's peak.
pub fn most_at_peak(dev: &DeviceRanges) -> Option<&str> {
    dev.paths
        .iter()
        .filter(|(_, r)| r.at_peak > 0)
        .max_by_key(|(_, r)| r.at_peak)
        .map(|(p, _)| p.as_str())
}

/// One line on the allocations of a path that outlived its range.
pub fn outlived_line(path: &str, r: &RangeBytes) -> String {
    format!(
        "{} of {} allocations ({}) made in {path} outlived the range ({} still live at the end)",
        r.outlived,
        r.allocs,
        mib(r.outlived_bytes),
        r.outlived_live_at_end
    )
}

/// The table `cushim summary --by range` prints.
pub fn render(devs: &[DeviceRanges]) -> String {
    let mut s = String::new();
    if devs.is_empty() {
        s.push_str("no trace entries: record history (CUSHIM_HISTORY) to see bytes by range\n");
    }
    for dev in devs {
        let _ = writeln!(s, "device {}: peak {} live", dev.device, mib(dev.peak));
        if let Some(p) = most_at_peak(dev) {
            let _ = writeln!(s, "  held the most at the peak: {p}");
        }
        let _ = writeln!(
            s,
            "  {:>12} {:>12} {:>12} {:>12} {:>7} {:>12}  range",
            "at peak", "peak", "live at end", "allocated", "allocs", "outlived"
        );
        let mut rows: Vec<_> = dev.paths.iter().collect();
        rows.sort_by(|a, b| b.1.at_peak.cmp(&a.1.at_peak).then(a.0.cmp(b.0)));
        for (p, r) in rows {
            let _ = writeln!(
                s,
                "  {:>12} {:>12} {:>12} {:>12} {:>7} {:>12}  {p}",
                mib(r.at_peak),
                mib(r.peak),
                mib(r.live_at_end),
                mib(r.allocated),
                r.allocs,
                if dev.has_instances && p != NO_RANGE {
                    mib(r.outlived_bytes)
                } else {
                    "-".into()
                }
            );
        }
        if !dev.has_instances {
            s.push_str(
                "  outlived: not known (the input has no range starts and ends with paths)\n",
            );
        }
        let out = outliving(dev);
        if !out.is_empty() {
            s.push_str("  outlived the range that made them:\n");
            for (p, r) in out {
                let _ = writeln!(s, "    {}", outlived_line(p, r));
            }
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
    fn allocations_not_freed_by_their_ranges_end_outlived_it() {
        let ann = |stage: &str, t: i64, range: &str| serde_json::json!({"stage": stage, "name": range, "device": 0, "time_us": t, "range": range});
        let alloc = |addr: i64, t: i64, path: &str| serde_json::json!({"action": "alloc", "addr": addr, "size": 100, "time_us": t, "user_metadata": path});
        let free = |addr: i64, t: i64| serde_json::json!({"action": "free_requested", "addr": addr, "size": 100, "time_us": t});
        // Three iterations each leak one block and free one inside; the open "tail" range is
        // not judged; the block freed in the same microsecond as its range ended did not
        // outlive it.
        let s = Value::from_json(&serde_json::json!({
            "segments": [],
            "device_traces": [[
                alloc(1, 11, "iter"), alloc(2, 12, "iter"), free(2, 13),
                alloc(3, 21, "iter"), alloc(4, 22, "iter"), free(4, 30),
                alloc(5, 31, "iter"), alloc(6, 32, "iter"), free(6, 33),
                free(1, 45), alloc(7, 51, "tail"),
            ]],
            "external_annotations": [
                ann("START", 10, "iter"), ann("END", 14, "iter"),
                ann("START", 20, "iter"), ann("END", 30, "iter"),
                ann("START", 30, "iter"), ann("END", 34, "iter"),
                ann("START", 50, "tail"),
            ],
        }));
        let d = &by_range(&s).unwrap()[0];
        let it = &d.paths["iter"];
        assert_eq!(
            (it.outlived, it.outlived_bytes, it.outlived_live_at_end),
            (3, 300, 2),
            "blocks 1 (freed later), 3 and 5 (never freed)"
        );
        assert_eq!(d.paths["tail"].outlived, 0);
        let text = render(std::slice::from_ref(d));
        assert!(
            text.contains("3 of 6 allocations (0.0 MiB) made in iter outlived the range (2 still live at the end)"),
            "{text}"
        );
    }

    #[test]
    fn without_range_starts_and_ends_outlived_is_not_known() {
        let s = snap(serde_json::json!([
            {"action": "alloc", "addr": 1, "size": 10, "time_us": 5, "user_metadata": "a"},
        ]));
        let d = &by_range(&s).unwrap()[0];
        assert_eq!(d.paths["a"].outlived, 0);
        assert!(render(std::slice::from_ref(d)).contains("outlived: not known"));
    }

    #[test]
    fn a_trace_without_sizes_is_an_error_naming_the_entry() {
        let s = snap(serde_json::json!([{"action": "alloc", "addr": 1}]));
        let e = by_range(&s).unwrap_err();
        assert!(e.contains("device_traces[0][0].size"), "{e}");
    }
}
