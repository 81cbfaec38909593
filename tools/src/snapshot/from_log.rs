//! A snapshot of one moment of a whole-run event log (`cushim snapshot LOG --at/--peak/--end`),
//! in PyTorch's layout so memory_viz opens it.
//!
//! Policy: the state at the moment is rebuilt by applying the log's events in order, with
//! the rules every walk of the tools shares (`crate::state`): a segment event adds or
//! removes a segment (the address range it names); an allocated block is
//! `active_allocated`, a pending one `active_pending_free`. `--peak` is the peak active
//! (allocated and pending bytes, all devices together). Each segment's blocks tile it: the live blocks, with the gaps between them as
//! `inactive` blocks. A block's size is the size its events carry (the requested size, as
//! PyTorch records it), so a block's rounding slack shows as part of the inactive gap
//! after it. An expandable segment appears as one segment per run of mapped pages side by
//! side (same device and stream), as PyTorch shows its mapped prefix: a block may span
//! pages, and a segment per page would cut it. A segment's pool (`small`/`large`) is not in
//! the log: a segment (or each page of an expandable one) of at most 2 MiB whose live blocks
//! are all at most 1 MiB is `small` (PyTorch's small pool: requests up to 1 MiB, 2 MiB
//! segments and pages), any other `large`.
//! The trace holds
//! the `events` events before the moment, per device, each made inside an NVTX range with
//! that range's path as its `user_metadata` (as the live snapshot writes it), and the last
//! `events` NVTX range starts and ends up to the moment as `external_annotations` (logs of
//! version 3 carry them).
//!
//! The log is streamed (one chunk in memory at a time): the state, the last `events`
//! events of each device and the stack tables are all that is kept, so any moment of a log
//! of any length is written in memory bounded by the state at that moment. `--peak` reads
//! the log twice (first to find the moment).

use crate::snapshot::log_reader::{read_log_from, LogFrame, LogInfo, LogVisitor};
use crate::state::{Block, Memory, Segments};
use cushim::snapshot::value::{Strings, Value};
use cushim::trace::event::{Action, TraceEvent, NO_STACK};
use cushim::trace::log::codec::RangeMark;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;

/// Which moment of the log.
#[derive(Debug, Clone, Copy)]
pub enum Moment {
    /// Seconds after the log's clock origin.
    At(f64),
    /// The event after which the most bytes were held by blocks, allocated or pending (the
    /// peak active of `crate::state`, all devices together).
    Peak,
    /// After the last event.
    End,
}

/// Where a walk stops applying events.
#[derive(Clone, Copy)]
enum Stop {
    /// After this many events.
    Count(u64),
    /// Before the first event later than this time (microseconds since the epoch).
    After(i64),
    Never,
}

/// One streamed pass over the log: the state up to the moment, the last events before it.
struct Walk {
    stop: Stop,
    stopped: bool,
    /// Events applied.
    applied: u64,
    time_us: Option<i64>,
    st: State,
    /// The peak active bytes (`crate::state`: allocated and pending, all devices), and
    /// after how many events it was first reached.
    peak: (u64, u64),
    keep: usize,
    /// Per device (index = ordinal), the last `keep` events applied.
    traces: Vec<VecDeque<TraceEvent>>,
    /// Devices seen in the whole log (1 + the largest ordinal).
    ndev: usize,
    frames: HashMap<u64, LogFrame>,
    stacks: HashMap<u32, Vec<u64>>,
    /// NVTX range paths.
    ranges: HashMap<u32, String>,
    /// The last `keep` NVTX range starts and ends (version 3 logs), as read: the marks of a
    /// round come before its events, so those after the moment are dropped at the end.
    marks: VecDeque<RangeMark>,
}

impl Walk {
    fn new(stop: Stop, keep: usize) -> Walk {
        Walk {
            stop,
            stopped: false,
            applied: 0,
            time_us: None,
            st: State::default(),
            peak: (0, 0),
            keep,
            traces: Vec::new(),
            ndev: 0,
            frames: HashMap::new(),
            stacks: HashMap::new(),
            ranges: HashMap::new(),
            marks: VecDeque::new(),
        }
    }
}

impl LogVisitor for Walk {
    fn event(&mut self, ev: TraceEvent) {
        let dev = usize::try_from(ev.device).ok();
        if let Some(d) = dev {
            self.ndev = self.ndev.max(d.saturating_add(1));
        }
        if !self.stopped {
            self.stopped = match self.stop {
                Stop::Count(n) => self.applied >= n,
                Stop::After(t) => ev.time_us > t,
                Stop::Never => false,
            };
        }
        if self.stopped {
            return;
        }
        self.st.apply(&ev);
        self.applied += 1;
        self.time_us = Some(ev.time_us);
        if self.st.active > self.peak.0 {
            self.peak = (self.st.active, self.applied);
        }
        if let (Some(d), true) = (dev, self.keep > 0) {
            if self.traces.len() <= d {
                self.traces.resize_with(d + 1, VecDeque::new);
            }
            let t = &mut self.traces[d];
            if t.len() == self.keep {
                t.pop_front();
            }
            t.push_back(ev);
        }
    }
    fn frame(&mut self, id: u64, frame: LogFrame) {
        self.frames.insert(id, frame);
    }
    fn stack(&mut self, id: u32, frames: Vec<u64>) {
        self.stacks.insert(id, frames);
    }
    fn range(&mut self, id: u32, path: String) {
        self.ranges.insert(id, path);
    }
    fn range_mark(&mut self, mark: RangeMark) {
        if self.stopped || self.keep == 0 {
            return;
        }
        if let Stop::After(t) = self.stop {
            if mark.time_us > t {
                return;
            }
        }
        if self.marks.len() == self.keep {
            self.marks.pop_front();
        }
        self.marks.push_back(mark);
    }
}

/// One streamed pass over the log at `path`.
fn walk(path: &Path, mut w: Walk) -> Result<(Walk, LogInfo), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("opening it: {e}"))?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let name = path.display().to_string();
    let src = std::io::BufReader::with_capacity(
        1 << 20,
        crate::snapshot::progress::Progress::new(file, &name, len),
    );
    let info = read_log_from(src, &mut w)?;
    Ok((w, info))
}

#[derive(Clone, Copy)]
struct Seg {
    size: u64,
    stream: u64,
    stack: u32,
    expandable: bool,
}

/// The segments to show: each ordinary segment, and each run of expandable pages side by
/// side on one device and stream as one segment (the first page's stack).
/// The fourth field is the run's largest page (the segment's size for an ordinary one).
fn runs_of_pages(segs: &BTreeMap<(i32, u64), Seg>) -> Vec<(i32, u64, Seg, u64)> {
    let mut out: Vec<(i32, u64, Seg, u64)> = Vec::with_capacity(segs.len());
    for (&(dev, addr), seg) in segs {
        if let Some((pdev, paddr, prev, page)) = out.last_mut() {
            if seg.expandable
                && prev.expandable
                && *pdev == dev
                && prev.stream == seg.stream
                && paddr.checked_add(prev.size) == Some(addr)
            {
                prev.size += seg.size;
                *page = (*page).max(seg.size);
                continue;
            }
        }
        out.push((dev, addr, *seg, seg.size));
    }
    out
}

#[derive(Clone, Copy)]
struct Blk {
    size: u64,
    stack: u32,
}

impl Block for Blk {
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
}

/// One device's blocks and segments.
#[derive(Default)]
struct DevState {
    mem: Memory<Blk>,
    segs: Segments<Seg>,
}

/// Every device's state (the rules: `crate::state`), and the active bytes of all of them
/// together (what the peak active counts).
#[derive(Default)]
struct State {
    devs: Vec<(i32, DevState)>,
    active: u64,
}

impl State {
    fn apply(&mut self, e: &TraceEvent) {
        let k = match self.devs.iter().position(|d| d.0 == e.device) {
            Some(k) => k,
            None => {
                self.devs.push((e.device, DevState::default()));
                self.devs.len() - 1
            }
        };
        let d = &mut self.devs[k].1;
        let was = d.mem.active_bytes();
        d.mem.apply(e.action, e.addr, e.size, || Blk {
            size: e.size,
            stack: e.stack,
        });
        d.segs.apply(e.action, e.addr, || Seg {
            size: e.size,
            stream: e.stream,
            stack: e.stack,
            expandable: e.action == Action::SegmentMap,
        });
        self.active = self.active.saturating_sub(was) + d.mem.active_bytes();
    }

    /// Every segment by (device, address).
    fn segments(&self) -> BTreeMap<(i32, u64), Seg> {
        let mut out = BTreeMap::new();
        for (dev, d) in &self.devs {
            for (a, s) in &d.segs.by_addr {
                out.insert((*dev, *a), *s);
            }
        }
        out
    }

    /// Every live block by (device, address), with whether it is pending.
    fn blocks(&self) -> BTreeMap<(i32, u64), (Blk, bool)> {
        let mut out = BTreeMap::new();
        for (dev, d) in &self.devs {
            for (pending, map) in [(false, &d.mem.allocated), (true, &d.mem.pending)] {
                for (a, b) in map {
                    out.insert((*dev, *a), (*b, pending));
                }
            }
        }
        out
    }
}

/// What `write` made.
pub struct Made {
    pub value: Value,
    /// Events applied (the moment is after this many events).
    pub at_event: usize,
    pub time_us: i64,
    pub info: LogInfo,
}

/// The snapshot of `moment` in the log at `path`, with up to `events` trace events per
/// device.
pub fn snapshot_of(path: &Path, moment: Moment, events: usize) -> Result<Made, String> {
    let stop = match moment {
        Moment::End => Stop::Never,
        Moment::At(s) => {
            // The origin is in the header: a first pass is not needed for it, but the
            // header is read with the events; read the header alone first.
            let origin = header_origin(path)?;
            Stop::After(origin.saturating_add((s * 1e6) as i64))
        }
        Moment::Peak => {
            let (w, _) = walk(path, Walk::new(Stop::Never, 0))?;
            Stop::Count(w.peak.1)
        }
    };
    let (all, info) = walk(path, Walk::new(stop, events))?;
    let origin = info.header["clock_origin_us"].as_i64().unwrap_or(0);
    // A moment after the last event is not in the log: refused rather than answered with
    // the state at its end (the user asked for another moment than they would get).
    if let Moment::At(secs) = moment {
        let last = all.time_us.unwrap_or(origin).saturating_sub(origin) as f64 / 1e6;
        if !all.stopped || secs < 0.0 {
            return Err(format!(
                "{}: --at {secs}: past the log's end (its events run from 0 to {last:.6} s \
                 after the run's start)",
                path.display()
            ));
        }
    }
    let n = all.applied as usize;
    let (segs, live) = (all.st.segments(), all.st.blocks());
    let mut s = Strings::default();
    let mut lists: HashMap<u32, Value> = HashMap::new();
    let frame_of = |s: &mut Strings, id: u32, lists: &mut HashMap<u32, Value>| -> Value {
        if id == NO_STACK {
            return Value::list(Vec::new());
        }
        if let Some(v) = lists.get(&id) {
            return v.clone();
        }
        let frames = all.stacks.get(&id).map_or(&[][..], |v| &v[..]);
        let items = frames
            .iter()
            .filter_map(|f| all.frames.get(f))
            .map(|f| {
                Value::dict(vec![
                    (s.get("name"), Value::str(&f.name)),
                    (s.get("filename"), s.get(&f.file)),
                    (s.get("line"), Value::uint(f.line)),
                ])
            })
            .collect();
        let v = Value::list(items);
        lists.insert(id, v.clone());
        v
    };
    let mut segments = Vec::new();
    for (dev, addr, seg, page) in runs_of_pages(&segs) {
        if dev < 0 {
            continue;
        }
        let end = addr.saturating_add(seg.size);
        let mut blocks = Vec::new();
        let (mut at, mut allocated, mut active) = (addr, 0u64, 0u64);
        let mut small_blocks = true;
        for (&(_, baddr), &(b, pending)) in live.range((dev, addr)..(dev, end)) {
            small_blocks &= b.size <= 1 << 20;
            if baddr < at {
                continue;
            }
            if baddr > at {
                blocks.push(block(
                    &mut s,
                    at,
                    baddr - at,
                    "inactive",
                    Value::list(Vec::new()),
                ));
            }
            let size = b.size.min(end - baddr);
            let state = if pending {
                "active_pending_free"
            } else {
                "active_allocated"
            };
            active += size;
            if !pending {
                allocated += size;
            }
            let frames = frame_of(&mut s, b.stack, &mut lists);
            blocks.push(block(&mut s, baddr, size, state, frames));
            at = baddr + size;
        }
        if at < end {
            blocks.push(block(
                &mut s,
                at,
                end - at,
                "inactive",
                Value::list(Vec::new()),
            ));
        }
        let frames = frame_of(&mut s, seg.stack, &mut lists);
        let small = page <= 2 << 20 && small_blocks;
        let kind = if small { "small" } else { "large" };
        segments.push(Value::dict(vec![
            (s.get("device"), Value::Int(i64::from(dev))),
            (s.get("address"), Value::uint(addr)),
            (s.get("total_size"), Value::uint(seg.size)),
            (s.get("allocated_size"), Value::uint(allocated)),
            (s.get("active_size"), Value::uint(active)),
            (s.get("requested_size"), Value::uint(active)),
            (s.get("stream"), Value::uint(seg.stream)),
            (s.get("segment_type"), s.get(kind)),
            (
                s.get("segment_pool_id"),
                Value::Tuple(std::sync::Arc::new(vec![Value::uint(0), Value::uint(0)])),
            ),
            (s.get("is_expandable"), Value::Bool(seg.expandable)),
            (s.get("frames"), frames),
            (s.get("blocks"), Value::list(blocks)),
        ]));
    }
    let mut traces: Vec<Vec<Value>> = vec![Vec::new(); all.ndev];
    for (d, t) in all.traces.iter().enumerate() {
        for e in t {
            let frames = frame_of(&mut s, e.stack, &mut lists);
            let mut entry = vec![
                (s.get("action"), s.get(e.action.name())),
                (s.get("addr"), Value::uint(e.addr)),
                (s.get("size"), Value::uint(e.size)),
                (s.get("stream"), Value::uint(e.stream)),
                (s.get("time_us"), Value::Int(e.time_us)),
                (s.get("frames"), frames),
            ];
            if e.action == Action::Oom {
                entry.push((s.get("device_free"), Value::uint(e.device_free)));
            }
            // As the live snapshot writes it: the entry's NVTX range path.
            if let Some(p) = all.ranges.get(&e.range) {
                entry.push((s.get("user_metadata"), s.get(p)));
            }
            traces[d].push(Value::dict(entry));
        }
    }
    let traces = traces.into_iter().map(Value::list).collect();
    let time_us = all.time_us.unwrap_or(origin);
    let mut top = vec![
        (s.get("segments"), Value::list(segments)),
        (s.get("device_traces"), Value::list(traces)),
        (
            s.get("allocator_settings"),
            Value::from_json(&info.header["allocator_settings"]),
        ),
    ];
    // As the live snapshot writes them: each range start and end up to the moment, with
    // its level's name and its path.
    let limit = match all.stop {
        Stop::Count(_) if all.stopped => time_us,
        Stop::After(t) => t,
        _ => i64::MAX,
    };
    let annotations: Vec<Value> = all
        .marks
        .iter()
        .filter(|m| m.time_us <= limit)
        .filter_map(|m| {
            let path = all.ranges.get(&m.path)?;
            let name = path
                .rsplit(cushim::trace::range::SEPARATOR)
                .next()
                .unwrap_or(path);
            Some(Value::dict(vec![
                (s.get("stage"), s.get(if m.start { "START" } else { "END" })),
                (s.get("name"), s.get(name)),
                (s.get("device"), Value::Int(i64::from(m.device))),
                (s.get("time_us"), Value::Int(m.time_us)),
                (s.get("range"), s.get(path)),
            ]))
        })
        .collect();
    if !annotations.is_empty() {
        top.push((s.get("external_annotations"), Value::list(annotations)));
    }
    let value = Value::dict(top);
    Ok(Made {
        value,
        at_event: n,
        time_us,
        info,
    })
}

/// The clock origin in the header of the log at `path` (read alone: the header is the
/// first chunk).
fn header_origin(path: &Path) -> Result<i64, String> {
    struct Header;
    impl LogVisitor for Header {
        fn event(&mut self, _ev: TraceEvent) {}
        fn frame(&mut self, _id: u64, _frame: LogFrame) {}
        fn stack(&mut self, _id: u32, _frames: Vec<u64>) {}
    }
    let file = std::fs::File::open(path).map_err(|e| format!("opening it: {e}"))?;
    // The header chunk is at most one payload long: read only that much.
    let head = std::io::Read::take(
        file,
        (cushim::trace::log::format::MAGIC.len()
            + cushim::trace::log::format::CHUNK_HEAD
            + cushim::trace::log::format::MAX_PAYLOAD) as u64,
    );
    let info = read_log_from(std::io::BufReader::new(head), &mut Header)?;
    Ok(info.header["clock_origin_us"].as_i64().unwrap_or(0))
}

fn block(s: &mut Strings, address: u64, size: u64, state: &str, frames: Value) -> Value {
    Value::dict(vec![
        (s.get("address"), Value::uint(address)),
        (s.get("size"), Value::uint(size)),
        (s.get("requested_size"), Value::uint(size)),
        (s.get("state"), s.get(state)),
        (s.get("frames"), frames),
    ])
}
