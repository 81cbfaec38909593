//! `cushim export --trace out.json`: a whole-run log as a Chrome trace (the Trace Event
//! Format's JSON object form), which Perfetto's UI and trace processor, and
//! `chrome://tracing`, open.
//!
//! What it holds, per process (the log's pid, named `cushim rank R (pid P)`):
//! - a counter track per device, `device N memory`, with two series: `allocated` (bytes in
//!   blocks the program holds, as `cushim summary` counts them: a block leaves at its
//!   `free_requested`, or at its `free_completed` when no request came) and `reserved`
//!   (bytes in segments). A value is written at every event that changes it, so the
//!   counters' maximum is the summary's peak;
//! - NVTX ranges as async slices (`b`/`e`, category `nvtx`, one track per device: the log
//!   records the device a range was opened for, not the thread), named by their own
//!   level, the whole path in `args.path`; ranges may overlap (several threads), which
//!   async slices allow and nested `B`/`E` slices do not;
//! - out-of-memory events and segment allocations and releases as instant events.
//!
//! Clock: `ts` is microseconds since the Unix epoch (the clock the log records) minus
//! `baseTimeNanoseconds / 1000`, the object's top-level key PyTorch's profiler writes for
//! the same purpose: `baseTimeNanoseconds + ts * 1000` is nanoseconds since the epoch in
//! both, so the two align (see `docs/EXPORT.md`). The base is the first event's whole
//! second unless given.
//!
//! JSON rather than Perfetto's protobuf: no protobuf dependency, and PyTorch's profiler
//! writes this format, so the two are read by the same importer. Written as a stream (one
//! event at a time through a buffer) in bounded memory: the live blocks, one counter
//! value per device, the open ranges.

use crate::analyze::model::Frame;
use crate::export::source::{open, walk, Mark, Row, SegRow, Sink};
use cushim::trace::event::Action;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// One device's memory as the counters show it.
#[derive(Default)]
struct Memory {
    /// address -> (size, waiting for other streams)
    blocks: HashMap<u64, (u64, bool)>,
    allocated: u64,
    reserved: u64,
}

struct TraceSink<W: Write> {
    out: W,
    pid: i64,
    base_us: Option<i64>,
    memory: HashMap<i32, Memory>,
    /// Open ranges: (device, path id) -> the async ids of the starts not yet ended.
    open: HashMap<(i32, u32), Vec<u64>>,
    next_id: u64,
    /// Events written (for the comma).
    written: u64,
    /// The largest allocated value written per device.
    pub max_allocated: HashMap<i32, u64>,
}

fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

impl<W: Write> TraceSink<W> {
    fn put(&mut self, ev: serde_json::Value) -> Result<(), String> {
        let sep = if self.written == 0 { "\n" } else { ",\n" };
        self.written += 1;
        write!(self.out, "{sep}{ev}").map_err(|e| e.to_string())
    }

    fn ts(&mut self, time_us: i64) -> i64 {
        let base = *self
            .base_us
            .get_or_insert(time_us.div_euclid(1_000_000) * 1_000_000);
        time_us - base
    }

    fn counter(&mut self, device: i32, t: i64) -> Result<(), String> {
        let Some(m) = self.memory.get(&device) else {
            return Ok(());
        };
        let (allocated, reserved) = (m.allocated, m.reserved);
        let mx = self.max_allocated.entry(device).or_default();
        *mx = (*mx).max(allocated);
        let ts = self.ts(t);
        let name = if device < 0 {
            "pinned host memory".to_string()
        } else {
            format!("device {device} memory")
        };
        self.put(serde_json::json!({
            "ph": "C", "name": name, "pid": self.pid, "tid": 0, "ts": ts,
            "args": {"allocated": allocated, "reserved": reserved}
        }))
    }
}

impl<W: Write> Sink for TraceSink<W> {
    fn event(&mut self, r: &Row) -> Result<(), String> {
        let Some(t) = r.time_us else {
            return Ok(());
        };
        let m = self.memory.entry(r.device).or_default();
        let changed = match r.action {
            Action::Alloc => {
                if let Some((old, pending)) = m.blocks.insert(r.addr, (r.size, false)) {
                    if !pending {
                        m.allocated = m.allocated.saturating_sub(old);
                    }
                }
                m.allocated = m.allocated.saturating_add(r.size);
                true
            }
            Action::FreeRequested => match m.blocks.get_mut(&r.addr) {
                Some((size, pending)) if !*pending => {
                    *pending = true;
                    m.allocated = m.allocated.saturating_sub(*size);
                    true
                }
                _ => false,
            },
            Action::FreeCompleted => match m.blocks.remove(&r.addr) {
                Some((size, false)) => {
                    m.allocated = m.allocated.saturating_sub(size);
                    true
                }
                _ => false,
            },
            Action::SegmentAlloc | Action::SegmentMap => {
                m.reserved = m.reserved.saturating_add(r.size);
                true
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                m.reserved = m.reserved.saturating_sub(r.size);
                true
            }
            // Sleep mode's pause and resume keep the blocks allocated (their pages go and
            // come back): instants on the timeline, no counter change.
            Action::Oom | Action::Snapshot | Action::Pause | Action::Resume => false,
        };
        if changed {
            self.counter(r.device, t)?;
        }
        let instant = matches!(
            r.action,
            Action::Oom
                | Action::Pause
                | Action::Resume
                | Action::SegmentAlloc
                | Action::SegmentFree
                | Action::SegmentMap
                | Action::SegmentUnmap
        );
        if instant {
            let ts = self.ts(t);
            let mut args = serde_json::json!({
                "device": r.device, "address": format!("{:#x}", r.addr), "size": r.size,
                "stream": r.stream,
            });
            if let Some(f) = r.device_free {
                args["device_free"] = f.into();
            }
            if let Some(s) = r.site.and_then(|s| s.as_utf8().ok()) {
                args["site"] = s.into();
            }
            let name = if r.action == Action::Oom {
                "out of memory"
            } else {
                r.action.name()
            };
            self.put(serde_json::json!({
                "ph": "i", "s": "p", "cat": "memory", "name": name, "pid": self.pid,
                "tid": 0, "ts": ts, "args": args
            }))?;
        }
        Ok(())
    }

    fn stack(&mut self, _id: u32, _frames: &[&Frame]) -> Result<(), String> {
        Ok(())
    }

    fn segment(&mut self, _s: &SegRow) -> Result<(), String> {
        Ok(())
    }

    fn mark(&mut self, m: &Mark) -> Result<(), String> {
        let ts = self.ts(m.time_us);
        let name = m.path.rsplit('/').next().unwrap_or(m.path);
        let key = (m.device, m.path_id);
        let id = if m.start {
            self.next_id += 1;
            let id = self.next_id;
            self.open.entry(key).or_default().push(id);
            id
        } else {
            // An end closes the latest start of its path still open; one without a start
            // (the log began inside it) has nothing to close.
            match self.open.get_mut(&key).and_then(Vec::pop) {
                Some(id) => id,
                None => return Ok(()),
            }
        };
        self.put(serde_json::json!({
            "ph": if m.start { "b" } else { "e" }, "cat": "nvtx", "name": name,
            "id": format!("{id:#x}"), "pid": self.pid, "tid": format!("nvtx device {}", m.device),
            "ts": ts, "args": {"path": m.path, "device": m.device}
        }))
    }
}

/// What a trace export wrote: events, and per device the largest allocated value.
#[derive(Debug, Clone, Default)]
pub struct TraceWritten {
    pub events: u64,
    pub trace_events: u64,
    pub max_allocated: Vec<(i32, u64)>,
}

/// Export the log `input` as a Chrome trace at `output` (`base_ns`: the base of `ts`).
pub fn export(
    input: &Path,
    output: &Path,
    replace: bool,
    base_ns: Option<i64>,
) -> Result<TraceWritten, String> {
    let src = open(input)?;
    if !src.is_log() {
        return Err(format!(
            "{}: a snapshot's events carry no times the reader keeps; --trace reads a whole-run log (CUSHIM_LOG, cushim run --log)",
            src.name
        ));
    }
    if !replace && std::fs::symlink_metadata(output).is_ok() {
        return Err(format!(
            "{}: exists; give --replace to replace it",
            output.display()
        ));
    }
    let mut result = TraceWritten::default();
    let (file, tmp) = cushim::files::temp_file::create_beside(output)
        .map_err(|e| format!("writing {}: {e}", output.display()))?;
    let written = write_trace(
        &src,
        std::io::BufWriter::with_capacity(1 << 20, file),
        base_ns,
        &mut result,
    )
    .and_then(|f| f.sync_all().map_err(|e| format!("fsync: {e}")))
    .and_then(|()| {
        std::fs::rename(&tmp, output)
            .map_err(|e| format!("renaming {} into place: {e}", tmp.display()))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("writing {}: {e}", output.display()));
    }
    Ok(result)
}

fn write_trace(
    src: &crate::export::source::Input,
    w: std::io::BufWriter<std::fs::File>,
    base_ns: Option<i64>,
    result: &mut TraceWritten,
) -> Result<std::fs::File, String> {
    let rank = src.rank.unwrap_or(0);
    let pid = src.pid.unwrap_or(0);
    let mut sink = TraceSink {
        out: w,
        pid,
        base_us: base_ns.map(|b| b.div_euclid(1000)),
        memory: HashMap::new(),
        open: HashMap::new(),
        next_id: 0,
        written: 0,
        max_allocated: HashMap::new(),
    };
    write!(sink.out, "{{\"traceEvents\": [").map_err(|e| e.to_string())?;
    sink.put(serde_json::json!({
        "ph": "M", "name": "process_name", "pid": pid,
        "args": {"name": format!("cushim rank {rank} (pid {pid})")}
    }))?;
    let n = walk(src, &mut sink)?;
    if n == 0 {
        return Err(format!("{}: no events to export (an empty log)", src.name));
    }
    let base = sink.base_us.unwrap_or(0).saturating_mul(1000);
    write!(
        sink.out,
        "\n],\n\"displayTimeUnit\": \"ms\",\n\"baseTimeNanoseconds\": {base},\n\"otherData\": {{\"source\": {}, \"producer\": {}, \"clock\": \"ts + baseTimeNanoseconds / 1000 is microseconds since the Unix epoch\"}}\n}}\n",
        json_str(&src.name),
        json_str(&format!("cushim {}", cushim::version::LONG))
    )
    .map_err(|e| e.to_string())?;
    result.events = n;
    result.trace_events = sink.written;
    let mut mx: Vec<(i32, u64)> = sink.max_allocated.into_iter().collect();
    mx.sort_unstable();
    result.max_allocated = mx;
    sink.out.into_inner().map_err(|e| e.error().to_string())
}
