//! An input file's events, stacks, segments and NVTX range marks, handed one at a time to
//! the writers (Parquet tables, a Chrome trace).
//!
//! Policy: a whole-run log is read as a stream (`snapshot::log_reader`): one chunk in
//! memory at a time, plus what the rows need from the past: the stacks and their sites
//! (one string per distinct stack), the range paths, the live segments and the live
//! blocks' sites (bounded by the memory the run held at once, never by its length). A
//! snapshot is modelled whole (`analyze::input`, it is in memory anyway); its model keeps
//! no event times, pids or range paths, so those columns are null for snapshots.
//!
//! What a row says beyond the event: the **site** is the analyses' (`analyze::frames`:
//! the innermost program frame, depth 1, the string `cushim summary` prints): an
//! allocation's own; a free's is the site of the allocation it frees (so live bytes by
//! site are a sum over rows); a segment event's its own stack's. The **segment** is the
//! address of the segment (or expandable mapping) the block lies in, from the segment
//! events before it (a snapshot's end state when none did). The **pool** is the private
//! pool a snapshot's segment records (`segment_pool_id`, as `A,B`); logs record none.
//! The **category** is what `cushim summary --by category` counts the block in
//! (`export::categories`, the summary's classifier): an allocation's own, a free's that of
//! the allocation it frees; null for segment and other events. The classifier needs a
//! device's whole trace first, so a log is also modelled (`analyze::log_model`, the events
//! staying in the file) and read again; it holds one bit per event, not the events.

use crate::analyze::category::CatId;
use crate::analyze::category_rules::UserRule;
use crate::analyze::frames::site;
use crate::analyze::model::{BlockState, Frame, Snapshot, Stacks};
use crate::analyze::timeline::Start;
use crate::export::categories::Categories;
use crate::snapshot::log_reader::{read_log_from, LogFrame, LogVisitor};
use crate::state::{Block, Memory, Segments};
use cushim::trace::event::{Action, TraceEvent, NO_STACK};
use cushim::trace::log::codec::RangeMark;
use parquet::data_type::ByteArray;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// One event as the writers take it.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    /// The event's place among the input's events (all devices), from 0.
    pub seq: u64,
    pub device: i32,
    pub time_us: Option<i64>,
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: Option<&'a ByteArray>,
    pub segment: Option<u64>,
    pub site: Option<&'a ByteArray>,
    /// What the block is (`cushim summary --by category`'s name).
    pub category: Option<&'a ByteArray>,
    pub range: Option<&'a ByteArray>,
    /// The input's own stack id (0: none).
    pub stack_id: u32,
    /// Free device bytes, on out-of-memory events.
    pub device_free: Option<u64>,
}

/// One segment (or expandable mapping): from its creation to its release, or live at the
/// end.
#[derive(Debug, Clone, Default)]
pub struct SegRow {
    pub device: i32,
    pub address: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: Option<ByteArray>,
    pub kind: Option<ByteArray>,
    pub created_us: Option<i64>,
    pub freed_us: Option<i64>,
    /// Allocated bytes in it at the end (a snapshot's end state).
    pub allocated_at_end: Option<u64>,
}

/// An NVTX range start or end.
#[derive(Debug, Clone)]
pub struct Mark<'a> {
    pub start: bool,
    pub device: i32,
    pub path_id: u32,
    pub path: &'a str,
    pub time_us: i64,
}

/// What the rows go to. An error stops the walk (and is its result).
pub trait Sink {
    fn event(&mut self, r: &Row) -> Result<(), String>;
    /// Stack `id`'s frames, innermost first, before the first event that uses it.
    fn stack(&mut self, id: u32, frames: &[&Frame]) -> Result<(), String>;
    fn segment(&mut self, s: &SegRow) -> Result<(), String>;
    fn mark(&mut self, _m: &Mark) -> Result<(), String> {
        Ok(())
    }
    /// Whether the rows' categories are wanted (they cost walks of the trace beforehand),
    /// with the user's own rules first (`--category NAME=REGEX`, as `summary` takes them).
    fn categories(&self) -> Option<Vec<UserRule>> {
        None
    }
}

/// An input, opened: what it is and who wrote it.
pub struct Input {
    pub name: String,
    /// The rank its writer recorded (a log's header).
    pub rank: Option<i64>,
    pub pid: Option<i64>,
    body: Body,
}

enum Body {
    Log(std::path::PathBuf),
    Snapshot(Box<Snapshot>),
}

impl Input {
    /// Whether it is a whole-run log (it has event times).
    pub fn is_log(&self) -> bool {
        matches!(self.body, Body::Log(_))
    }
}

/// The header of the log at `path`, or `None` when it is not a log.
fn log_header(path: &Path) -> Result<Option<serde_json::Value>, String> {
    use cushim::trace::log::format::{kind, CHUNK_HEAD, MAX_PAYLOAD};
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut head = [0u8; 8 + CHUNK_HEAD];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if crate::snapshot::sniff::kind(&head[..n]) != crate::snapshot::sniff::Kind::Log {
        return Ok(None);
    }
    if n < head.len() || head[8] != kind::HEADER {
        return Err("not a whole cushim event log: no header chunk".into());
    }
    let len = u32::from_le_bytes([head[9], head[10], head[11], head[12]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(format!("damaged header: length {len}"));
    }
    let mut payload = vec![0u8; len];
    f.read_exact(&mut payload)
        .map_err(|e| format!("reading the header: {e}"))?;
    serde_json::from_slice(&payload)
        .map(Some)
        .map_err(|e| format!("the header is not JSON: {e}"))
}

/// Open `path`: a log's header is read (its events stay in the file); a snapshot is
/// modelled.
pub fn open(path: &Path) -> Result<Input, String> {
    let name = path.display().to_string();
    let at = |e: String| format!("{name}: {e}");
    if let Some(h) = log_header(path).map_err(at)? {
        return Ok(Input {
            rank: h["rank"].as_i64(),
            pid: h["pid"].as_i64(),
            body: Body::Log(path.to_path_buf()),
            name,
        });
    }
    let snap = crate::analyze::input::read(path)?;
    Ok(Input {
        name,
        rank: None,
        pid: None,
        body: Body::Snapshot(Box::new(snap)),
    })
}

/// A live block of a walk: its size and its allocation's site and category.
#[derive(Clone)]
struct SiteBlock {
    size: u64,
    site: Option<ByteArray>,
    cat: Option<CatId>,
}

impl Block for SiteBlock {
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
}

/// The live segments and blocks of a walk, per device, for the rows' segment and site
/// (the rules: `crate::state`).
#[derive(Default)]
struct Tracker {
    devs: Vec<(i32, Memory<SiteBlock>, Segments<SegRow>)>,
}

impl Tracker {
    fn dev(&self, device: i32) -> Option<&(i32, Memory<SiteBlock>, Segments<SegRow>)> {
        self.devs.iter().find(|d| d.0 == device)
    }

    fn segment_of(&self, device: i32, addr: u64) -> Option<&SegRow> {
        let (_, _, segs) = self.dev(device)?;
        segs.containing(addr, |s| s.size).map(|(_, s)| s)
    }

    fn dev_mut(&mut self, device: i32) -> &mut (i32, Memory<SiteBlock>, Segments<SegRow>) {
        let k = match self.devs.iter().position(|d| d.0 == device) {
            Some(k) => k,
            None => {
                self.devs
                    .push((device, Memory::default(), Segments::default()));
                self.devs.len() - 1
            }
        };
        &mut self.devs[k]
    }

    /// The blocks live before the trace began (a snapshot's start), so that their frees
    /// carry a site and a category.
    fn seed(
        &mut self,
        device: i32,
        start: &Start,
        mut site: impl FnMut(u32) -> ByteArray,
        mut cat: impl FnMut(u32) -> Option<CatId>,
    ) {
        let (_, mem, _) = self.dev_mut(device);
        for (pending, map) in [
            (false, &start.state.allocated),
            (true, &start.state.pending),
        ] {
            for (a, l) in map {
                mem.add(
                    pending,
                    *a,
                    SiteBlock {
                        size: l.size,
                        site: Some(site(l.stack)),
                        cat: cat(l.stack),
                    },
                );
            }
        }
    }

    /// Track `r` (its site is the block's, `cat` its category); a segment it releases is
    /// handed back.
    fn apply(&mut self, r: &Row, cat: Option<CatId>) -> Option<SegRow> {
        let (_, mem, segs) = self.dev_mut(r.device);
        mem.apply(r.action, r.addr, r.size, || SiteBlock {
            size: r.size,
            site: r.site.cloned(),
            cat,
        });
        let freed = matches!(r.action, Action::SegmentFree | Action::SegmentUnmap);
        let mut s = segs.apply(r.action, r.addr, || SegRow {
            device: r.device,
            address: r.addr,
            size: r.size,
            stream: r.stream,
            created_us: r.time_us,
            ..Default::default()
        })?;
        if !freed {
            return None;
        }
        s.freed_us = r.time_us;
        Some(s)
    }

    /// The block a free at `addr` frees (allocated or pending).
    fn block(&self, device: i32, addr: u64) -> Option<&SiteBlock> {
        let (_, mem, _) = self.dev(device)?;
        mem.allocated.get(&addr).or_else(|| mem.pending.get(&addr))
    }

    /// The site and category of the block a free at `addr` frees.
    fn freed(&self, device: i32, addr: u64) -> (Option<ByteArray>, Option<CatId>) {
        self.block(device, addr)
            .map_or((None, None), |b| (b.site.clone(), b.cat))
    }

    /// The segments still live, by device and address.
    fn into_live(mut self) -> Vec<SegRow> {
        self.devs.sort_by_key(|d| d.0);
        self.devs
            .into_iter()
            .flat_map(|d| d.2.by_addr.into_values())
            .collect()
    }
}

/// Interned strings: a site per stack, a path per range.
fn bytes(s: &str) -> ByteArray {
    ByteArray::from(s.as_bytes().to_vec())
}

/// The log's content as it streams, handed to the sink.
struct LogWalk<'s, 'm> {
    sink: &'s mut dyn Sink,
    cats: Categories<'m>,
    error: Option<String>,
    seq: u64,
    /// Log frame id -> index in `stacks.frames`.
    frame_of: HashMap<u64, u32>,
    /// Log stack id -> list index in `stacks.lists`.
    list_of: HashMap<u32, u32>,
    stacks: Stacks,
    sites: HashMap<u32, ByteArray>,
    ranges: HashMap<u32, (String, ByteArray)>,
    tracker: Tracker,
}

impl LogWalk<'_, '_> {
    fn fail(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }

    fn site_of(&mut self, id: u32) -> Option<ByteArray> {
        if id == NO_STACK {
            return Some(bytes("<no stack>"));
        }
        if let Some(s) = self.sites.get(&id) {
            return Some(s.clone());
        }
        let list = *self.list_of.get(&id)?;
        let s = bytes(&site(&self.stacks, list, 1));
        self.sites.insert(id, s.clone());
        Some(s)
    }
}

impl LogVisitor for LogWalk<'_, '_> {
    fn event(&mut self, ev: TraceEvent) {
        if self.error.is_some() {
            return;
        }
        let own = match ev.action {
            Action::Alloc | Action::SegmentAlloc | Action::SegmentMap | Action::Oom => {
                self.site_of(ev.stack)
            }
            _ if ev.stack != NO_STACK => self.site_of(ev.stack),
            _ => None,
        };
        let freed = matches!(ev.action, Action::FreeRequested | Action::FreeCompleted);
        let made = self.cats.next(ev.device, ev.action, ev.stack, ev.range);
        let (site, cat) = if freed {
            self.tracker.freed(ev.device, ev.addr)
        } else {
            (own, made)
        };
        let block = matches!(
            ev.action,
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted
        );
        let segment = if block {
            self.tracker
                .segment_of(ev.device, ev.addr)
                .map(|s| s.address)
        } else {
            None
        };
        let range = (ev.range != 0)
            .then(|| self.ranges.get(&ev.range).map(|r| &r.1))
            .flatten();
        let row = Row {
            seq: self.seq,
            device: ev.device,
            time_us: Some(ev.time_us),
            action: ev.action,
            addr: ev.addr,
            size: ev.size,
            stream: ev.stream,
            pool: None,
            segment,
            site: site.as_ref(),
            category: cat.and_then(|c| self.cats.name(c)),
            range,
            stack_id: ev.stack,
            device_free: (ev.action == Action::Oom).then_some(ev.device_free),
        };
        let r = self.sink.event(&row);
        let released = self.tracker.apply(&row, made);
        self.fail(r);
        self.seq += 1;
        if let Some(s) = released {
            let r = self.sink.segment(&s);
            self.fail(r);
        }
    }

    fn frame(&mut self, id: u64, frame: LogFrame) {
        let i = self.stacks.frames.len() as u32;
        self.stacks.frames.push(Frame {
            name: Arc::from(frame.name.as_str()),
            file: Arc::from(frame.file.as_str()),
            line: frame.line as i64,
        });
        self.frame_of.insert(id, i);
    }

    fn stack(&mut self, id: u32, frames: Vec<u64>) {
        let list: Box<[u32]> = frames
            .iter()
            .filter_map(|f| self.frame_of.get(f).copied())
            .collect();
        let l = self.stacks.lists.len() as u32;
        self.stacks.lists.push(list);
        self.list_of.insert(id, l);
        self.sites.remove(&id);
        if self.error.is_none() {
            let fr: Vec<&Frame> = self.stacks.frames_of(l).collect();
            let r = self.sink.stack(id, &fr);
            self.fail(r);
        }
    }

    fn range(&mut self, id: u32, path: String) {
        let b = bytes(&path);
        self.ranges.insert(id, (path, b));
    }

    fn range_mark(&mut self, m: RangeMark) {
        if self.error.is_some() {
            return;
        }
        let path = self.ranges.get(&m.path).map_or("", |r| r.0.as_str());
        let r = self.sink.mark(&Mark {
            start: m.start,
            device: m.device,
            path_id: m.path,
            path,
            time_us: m.time_us,
        });
        self.fail(r);
    }
}

/// Hand `input`'s content to `sink`; returns the events handed. A log that ends early
/// (torn tail) is handed up to its clean prefix, said on stderr.
pub fn walk(input: &Input, sink: &mut dyn Sink) -> Result<u64, String> {
    let at = |e: String| format!("{}: {e}", input.name);
    match &input.body {
        Body::Log(path) => {
            // The classifiers first (the log modelled, its events read again), then the rows.
            let user = sink.categories();
            let model = match user {
                Some(_) => Some(crate::analyze::log_model::from_log_file(path).map_err(at)?),
                None => None,
            };
            let file = std::fs::File::open(path).map_err(|e| at(e.to_string()))?;
            let cats = match (&model, &user) {
                (Some(m), Some(u)) => Categories::new(m, u),
                _ => Categories::none(),
            };
            let mut w = LogWalk {
                sink,
                cats,
                error: None,
                seq: 0,
                frame_of: HashMap::new(),
                list_of: HashMap::new(),
                stacks: Stacks::default(),
                sites: HashMap::new(),
                ranges: HashMap::new(),
                tracker: Tracker::default(),
            };
            let info = read_log_from(std::io::BufReader::with_capacity(1 << 20, file), &mut w)
                .map_err(at)?;
            if let Some(e) = w.error.take() {
                return Err(e);
            }
            // Said once: modelling the log (for the categories) already said it.
            if let (Some(p), None) = (&info.problem, &model) {
                eprintln!(
                    "cushim: {}: the log ends early ({p}); exported the {} events before it",
                    input.name, info.events
                );
            }
            let live = std::mem::take(&mut w.tracker).into_live();
            for s in &live {
                w.sink.segment(s)?;
            }
            Ok(w.seq)
        }
        Body::Snapshot(snap) => walk_snapshot(snap, sink),
    }
}

fn pool_text(p: (i64, i64)) -> ByteArray {
    bytes(&format!("{},{}", p.0, p.1))
}

fn walk_snapshot(snap: &Snapshot, sink: &mut dyn Sink) -> Result<u64, String> {
    for id in 1..snap.stacks.lists.len() as u32 {
        let fr: Vec<&Frame> = snap.stacks.frames_of(id).collect();
        sink.stack(id, &fr)?;
    }
    let mut sites: HashMap<u32, ByteArray> = HashMap::new();
    let user = sink.categories();
    let mut cats = match &user {
        Some(u) => Categories::new(snap, u),
        None => Categories::none(),
    };
    let mut seq = 0u64;
    for dev in snap.devices.iter().chain(snap.host.iter()) {
        let device = dev.ordinal as i32;
        // The end state's segments: the pool and segment of blocks no segment event made.
        let mut end: BTreeMap<u64, (u64, ByteArray)> = BTreeMap::new();
        for s in &dev.segments {
            end.insert(s.address, (s.total_size, pool_text(s.pool)));
        }
        let end_of = |addr: u64| {
            let (&a, (size, pool)) = end.range(..=addr).next_back()?;
            (addr < a.saturating_add(*size)).then_some((a, pool))
        };
        let mut tracker = Tracker::default();
        if let Some(start) = cats.start(device).cloned() {
            let site_of = |stack: u32| {
                sites
                    .entry(stack)
                    .or_insert_with(|| bytes(&site(&snap.stacks, stack, 1)))
                    .clone()
            };
            tracker.seed(device, &start, site_of, |stack| cats.before(device, stack));
        }
        let mut failed = None;
        dev.events.for_each_slice(|evs| {
            if failed.is_some() {
                return;
            }
            for e in evs {
                let own = sites
                    .entry(e.stack)
                    .or_insert_with(|| bytes(&site(&snap.stacks, e.stack, 1)))
                    .clone();
                let freed = matches!(e.action, Action::FreeRequested | Action::FreeCompleted);
                let made = cats.next(device, e.action, e.stack, 0);
                let (site, cat) = if freed {
                    tracker.freed(device, e.addr)
                } else {
                    (Some(own), made)
                };
                let block = matches!(
                    e.action,
                    Action::Alloc | Action::FreeRequested | Action::FreeCompleted
                );
                let end_seg = end_of(e.addr);
                let segment = if block {
                    tracker
                        .segment_of(device, e.addr)
                        .map(|s| s.address)
                        .or(end_seg.map(|s| s.0))
                } else {
                    None
                };
                let row = Row {
                    seq,
                    device,
                    time_us: None,
                    action: e.action,
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    pool: end_seg.map(|s| s.1),
                    segment,
                    site: site.as_ref(),
                    category: cat.and_then(|c| cats.name(c)),
                    range: None,
                    stack_id: e.stack,
                    device_free: None,
                };
                if let Err(x) = sink.event(&row) {
                    failed = Some(x);
                    return;
                }
                seq += 1;
                let freed_seg = tracker.apply(&row, made);
                if let Some(s) = freed_seg {
                    if let Err(x) = sink.segment(&s) {
                        failed = Some(x);
                        return;
                    }
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        for s in &dev.segments {
            let allocated = s
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::Allocated)
                .map(|b| b.size)
                .sum();
            sink.segment(&SegRow {
                device,
                address: s.address,
                size: s.total_size,
                stream: s.stream,
                pool: Some(pool_text(s.pool)),
                kind: s.kind.as_deref().map(bytes),
                created_us: None,
                freed_us: None,
                allocated_at_end: Some(allocated),
            })?;
        }
    }
    Ok(seq)
}
