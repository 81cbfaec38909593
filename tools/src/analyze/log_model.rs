//! A whole-run event log (`snapshot::log_reader`) as the [`Snapshot`] model every analysis
//! reads: its events per device (and pinned host memory), its stacks and frames, the
//! recorded settings and device memory. Like the other logs it has no end state
//! (`has_state: false`): the analyses rebuild the state from the events.
//!
//! Policy: a log file is read once, as a stream, to learn its stacks, frames and where
//! each device's events are; the events themselves stay in the file and every walk of an
//! analysis reads them again (`analyze::event_list`), so a log of any length is analysed
//! in bounded memory. The commands that walk every trace first (`replay`, `report`) have
//! that walk made during the reading ([`from_log_file_walked`]): the events the reader
//! decodes go in batches to a thread that walks them. A log given as bytes (small inputs)
//! is modelled in memory.
//!
//! A reading that stopped early (torn tail, damaged chunk) or a log that counts dropped
//! events is modelled from what it holds, and one line on stderr says so.

use crate::analyze::category_rules::RANGE_MARK;
use crate::analyze::event_list::{ChunkRef, EventList, LogEvents, LogFile, StackMap};
use crate::analyze::model::{Device, Event, Frame, Snapshot, Stacks};
use crate::analyze::timeline::Start;
use crate::analyze::walk::{walk, WalkStream, Walked};
use crate::snapshot::log_reader::{read_log, read_log_from, LogFrame, LogInfo, LogVisitor};
use cushim::trace::event::{Action, TraceEvent};
use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::Arc;

/// Events handed to the walking thread at a time (about 320 KiB: the hand-off costs
/// little per event, and the batch stays in the caches between the two cores).
const BATCH: usize = 8192;

/// Batches on their way to the walking thread at most (the reader waits beyond that).
const IN_FLIGHT: usize = 4;

/// The reader's side of the walk while reading: each device's batch being filled, the
/// way to the walking thread, and the emptied batches coming back to be filled again.
struct Feed {
    to_walker: SyncSender<(i32, Vec<Event>)>,
    emptied: Receiver<Vec<Event>>,
    /// By position in `Builder::devices`.
    batches: Vec<Vec<Event>>,
}

impl Feed {
    #[inline]
    fn push(&mut self, at: usize, ordinal: i32, e: Event) -> Result<(), ()> {
        if self.batches.len() <= at {
            self.batches.resize_with(at + 1, Vec::new);
        }
        let b = &mut self.batches[at];
        b.push(e);
        if b.len() < BATCH {
            return Ok(());
        }
        let fresh = self
            .emptied
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(BATCH));
        let full = std::mem::replace(b, fresh);
        self.to_walker.send((ordinal, full)).map_err(|_| ())
    }

    /// Send what is left (devices in `ordinals`' order, each in its order).
    fn flush(mut self, ordinals: &[i32]) {
        for (b, &o) in self.batches.drain(..).zip(ordinals) {
            if !b.is_empty() && self.to_walker.send((o, b)).is_err() {
                return;
            }
        }
    }
}

/// The walking thread: each device's walk (`analyze::walk`) fed its batches in order, the
/// emptied batches sent back.
fn walk_batches(
    batches: Receiver<(i32, Vec<Event>)>,
    emptied: Sender<Vec<Event>>,
) -> Vec<(i32, WalkStream)> {
    let mut walks: Vec<(i32, WalkStream)> = Vec::new();
    for (ordinal, mut evs) in batches {
        let at = match walks.iter().position(|(o, _)| *o == ordinal) {
            Some(i) => i,
            None => {
                // A log has no state before its events: its walk starts from nothing, as
                // `timeline::start_of` starts it.
                walks.push((ordinal, WalkStream::new(Start::default())));
                walks.len() - 1
            }
        };
        let w = &mut walks[at].1;
        evs.iter().for_each(|e| w.step(e));
        evs.clear();
        let _ = emptied.send(evs);
    }
    walks
}

/// An event of the log as the model holds it, its stack `stack` (a list index): an
/// out-of-memory's address is the driver's free memory. The one conversion, for the
/// reader and for every later walk (`event_list`).
#[inline]
pub(crate) fn model_event(ev: &TraceEvent, stack: u32) -> Event {
    Event {
        action: ev.action,
        addr: if ev.action == Action::Oom {
            ev.device_free
        } else {
            ev.addr
        },
        size: ev.size,
        stream: ev.stream,
        stack,
    }
}

/// One device's events: where they are, or (a log given as bytes) the events.
#[derive(Default)]
struct DevEvents {
    chunks: Vec<ChunkRef>,
    len: usize,
    held: Vec<Event>,
}

#[derive(Default)]
struct Builder {
    /// Whether events are kept in memory (else only where they are).
    keep: bool,
    /// By ordinal, in the order first seen (sorted when modelled); `last` is the index of
    /// the device of the last event (consecutive events are mostly on one device).
    devices: Vec<(i32, DevEvents)>,
    last: usize,
    chunk: (u64, u32),
    frames: HashMap<u64, LogFrame>,
    /// Log stack id -> model list index.
    list_of: StackMap,
    lists: Vec<Vec<u64>>,
    /// NVTX range path id -> path.
    ranges: HashMap<u32, String>,
    /// Lists of a stack inside a range path: (list index, stack id, range path id), filled
    /// when modelled (the stack's frames, then the path's mark).
    ranged: Vec<(u32, u32, u32)>,
    /// Where the events go to be walked while the log is read, if they are.
    feed: Option<Feed>,
}

impl Builder {
    fn list(&mut self, id: u32) -> u32 {
        if let Some(l) = self.list_of.get(id) {
            return l;
        }
        self.lists.push(Vec::new());
        let l = self.lists.len() as u32;
        self.list_of.insert(id, l);
        l
    }
}

impl Builder {
    /// The list of stack `id` made inside range path `range`.
    fn list_in(&mut self, id: u32, range: u32) -> u32 {
        if range == 0 {
            return self.list(id);
        }
        if let Some(l) = self.list_of.ranged(id, range) {
            return l;
        }
        self.lists.push(Vec::new());
        let l = self.lists.len() as u32;
        self.list_of.insert_ranged(id, range, l);
        self.ranged.push((l, id, range));
        l
    }
}

impl LogVisitor for Builder {
    fn range(&mut self, id: u32, path: String) {
        self.ranges.insert(id, path);
    }

    fn events_chunk(&mut self, at: u64, len: u32) {
        self.chunk = (at, len);
    }

    fn event(&mut self, ev: TraceEvent) {
        let stack = self.list_in(ev.stack, ev.range);
        let (at, len) = self.chunk;
        let i = match self.devices.get(self.last) {
            Some((o, _)) if *o == ev.device => self.last,
            _ => match self.devices.iter().position(|(o, _)| *o == ev.device) {
                Some(i) => i,
                None => {
                    self.devices.push((ev.device, DevEvents::default()));
                    self.devices.len() - 1
                }
            },
        };
        self.last = i;
        // Pinned host memory (device -1) is not one of the model's devices: not walked.
        if let Some(f) = self.feed.as_mut().filter(|_| ev.device >= 0) {
            if f.push(i, ev.device, model_event(&ev, stack)).is_err() {
                // The walking thread is gone: the caller walks the model instead.
                self.feed = None;
            }
        }
        let d = &mut self.devices[i].1;
        d.len += 1;
        if self.keep {
            d.held.push(model_event(&ev, stack));
        } else {
            match d.chunks.last_mut() {
                Some(c) if c.at == at => c.events += 1,
                _ => d.chunks.push(ChunkRef { at, len, events: 1 }),
            }
        }
    }

    fn frame(&mut self, id: u64, frame: LogFrame) {
        self.frames.insert(id, frame);
    }

    fn stack(&mut self, id: u32, frames: Vec<u64>) {
        let i = self.list(id) as usize;
        if let Some(l) = self.lists.get_mut(i.wrapping_sub(1)) {
            *l = frames;
        }
    }
}

/// The recorded allocator settings as a configuration string (as `load.rs` reads a
/// snapshot's `allocator_settings`).
fn settings(h: &serde_json::Value) -> Option<String> {
    let s = h.get("allocator_settings")?;
    let mut parts = Vec::new();
    if let Some(raw) = s["PYTORCH_CUDA_ALLOC_CONF"].as_str() {
        if !raw.trim().is_empty() {
            parts.push(raw.trim().to_string());
        }
    }
    if let Some(n) = s["max_split_size"].as_i64().filter(|&n| n > 0) {
        parts.push(format!("max_split_size_mb:{}", (n as u64) >> 20));
    }
    if let Some(f) = s["garbage_collection_threshold"]
        .as_f64()
        .filter(|&f| f > 0.0 && f < 1.0)
    {
        parts.push(format!("garbage_collection_threshold:{f}"));
    }
    if let Some(b) = s["expandable_segments"].as_bool() {
        parts.push(format!(
            "expandable_segments:{}",
            if b { "True" } else { "False" }
        ));
    }
    Some(parts.join(","))
}

/// Model a log's bytes (held in memory: for small inputs).
pub fn from_log(bytes: &[u8]) -> Result<Snapshot, String> {
    let mut b = Builder {
        keep: true,
        ..Default::default()
    };
    let info = read_log(bytes, &mut b)?;
    Ok(model(b, &info, None))
}

/// Model the log at `path`, streamed: its events stay in the file (see the module docs).
pub fn from_log_file(path: &Path) -> Result<Snapshot, String> {
    read_file(path, Builder::default())
}

/// [`from_log_file`], and each device's walk (`analyze::walk`, in the order of the
/// model's devices), made while the log is read: the reader hands the events it decodes
/// to a second thread that walks them, so the walk costs no decoding of its own and runs
/// beside the reading instead of after it.
pub fn from_log_file_walked(path: &Path) -> Result<(Snapshot, Vec<Walked>), String> {
    let (to_walker, batches) = sync_channel(IN_FLIGHT);
    let (emptied_tx, emptied) = channel();
    let (snap, mut walks) = std::thread::scope(|s| {
        let walker = s.spawn(move || walk_batches(batches, emptied_tx));
        let b = Builder {
            feed: Some(Feed {
                to_walker,
                emptied,
                batches: Vec::new(),
            }),
            ..Default::default()
        };
        let snap = read_file(path, b);
        // `read_file` dropped the feed (the walking thread's input) before returning.
        let walks = walker.join().unwrap_or_default();
        (snap, walks)
    });
    let snap = snap?;
    let walked = snap
        .devices
        .iter()
        .map(
            |d| match walks.iter().position(|(o, _)| i64::from(*o) == d.ordinal) {
                Some(i) => walks.swap_remove(i).1.finish(d),
                None => walk(&snap, d),
            },
        )
        .collect();
    Ok((snap, walked))
}

fn read_file(path: &Path, mut b: Builder) -> Result<Snapshot, String> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let again = file
        .try_clone()
        .map_err(|e| format!("opening it again: {e}"))?;
    let src = std::io::BufReader::with_capacity(
        1 << 20,
        crate::snapshot::progress::Progress::new(file, &name, len),
    );
    let info = read_log_from(src, &mut b);
    if let Some(f) = b.feed.take() {
        let ordinals: Vec<i32> = b.devices.iter().map(|d| d.0).collect();
        f.flush(&ordinals);
    }
    Ok(model(b, &info?, Some((again, name))))
}

fn model(mut b: Builder, info: &LogInfo, file: Option<(std::fs::File, String)>) -> Snapshot {
    if let Some(p) = &info.problem {
        eprintln!(
            "cushim: the log ends early ({p}); using the {} events before it",
            info.events
        );
    }
    if info.dropped > 0 {
        eprintln!(
            "cushim: the log records {} events dropped (the log was closed or its writer was not running)",
            info.dropped
        );
    }
    // Frames: log ids -> model indices, in id order.
    let mut ids: Vec<u64> = b.frames.keys().copied().collect();
    ids.sort_unstable();
    let index: HashMap<u64, u32> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, i as u32))
        .collect();
    let frames: Vec<Frame> = ids
        .iter()
        .map(|id| {
            let f = &b.frames[id];
            Frame {
                name: Arc::from(f.name.as_str()),
                file: Arc::from(f.file.as_str()),
                line: f.line as i64,
            }
        })
        .collect();
    let mut frames = frames;
    let mut lists: Vec<Box<[u32]>> = vec![Box::new([])];
    for l in &b.lists {
        lists.push(l.iter().filter_map(|f| index.get(f).copied()).collect());
    }
    // A stack made inside an NVTX range: its frames, then the range path's mark (as a
    // snapshot's `user_metadata` is read, `analyze::load`), for the categories and steps.
    let mut marks: HashMap<u32, u32> = HashMap::new();
    for &(l, id, range) in &b.ranged {
        let Some(path) = b
            .ranges
            .get(&range)
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
        else {
            continue;
        };
        let mark = *marks.entry(range).or_insert_with(|| {
            frames.push(Frame {
                name: Arc::from(RANGE_MARK),
                file: Arc::from(path),
                line: 0,
            });
            frames.len() as u32 - 1
        });
        let base = b.list_of.get(id).and_then(|k| lists.get(k as usize));
        let mut v: Vec<u32> = base.map(|k| k.to_vec()).unwrap_or_default();
        v.push(mark);
        if let Some(slot) = lists.get_mut(l as usize) {
            *slot = v.into_boxed_slice();
        }
    }
    let log = file.map(|(f, name)| {
        Arc::new(LogFile::new(
            f,
            name,
            std::mem::take(&mut b.list_of),
            info.version,
        ))
    });
    let mut devices = Vec::new();
    let mut host = None;
    b.devices.sort_by_key(|d| d.0);
    for (ordinal, d) in b.devices {
        let events = match &log {
            Some(log) => EventList::Log(LogEvents {
                log: log.clone(),
                device: ordinal,
                chunks: d.chunks.into(),
                len: d.len,
            }),
            None => EventList::Mem(d.held),
        };
        let d = Device {
            ordinal: ordinal as i64,
            segments: Vec::new(),
            events,
        };
        if ordinal < 0 {
            host = Some(d);
        } else {
            devices.push(d);
        }
    }
    let h = &info.header;
    let device_total = h["memory"]
        .as_array()
        .and_then(|m| m.iter().filter_map(|d| d["total"].as_u64()).max());
    Snapshot {
        kind: "cushim event log",
        devices,
        host,
        settings: settings(h),
        device_total,
        has_state: false,
        stacks: Stacks { frames, lists },
        cushim: None,
    }
}
