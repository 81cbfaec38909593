//! A whole-run event log (`snapshot::log_reader`) as the [`Snapshot`] model every analysis
//! reads: its events per device (and pinned host memory), its stacks and frames, the
//! recorded settings and device memory. Like the other logs it has no end state
//! (`has_state: false`): the analyses rebuild the state from the events.
//!
//! Policy: a log file is read once, as a stream, to learn its stacks, frames and where
//! each device's events are; the events themselves stay in the file and every walk of an
//! analysis reads them again (`analyze::event_list`), so a log of any length is analysed
//! in bounded memory. A log given as bytes (small inputs) is modelled in memory.
//!
//! A reading that stopped early (torn tail, damaged chunk) or a log that counts dropped
//! events is modelled from what it holds, and one line on stderr says so.

use crate::analyze::category_rules::RANGE_MARK;
use crate::analyze::event_list::{ChunkRef, EventList, LogEvents, LogFile, StackMap};
use crate::analyze::model::{Device, Event, Frame, Snapshot, Stacks};
use crate::snapshot::log_reader::{read_log, read_log_from, LogFrame, LogInfo, LogVisitor};
use cushim::trace::event::TraceEvent;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

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
        let d = &mut self.devices[i].1;
        d.len += 1;
        if self.keep {
            d.held.push(Event {
                action: ev.action,
                addr: ev.addr,
                size: ev.size,
                stream: ev.stream,
                stack,
            });
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
    let mut b = Builder::default();
    let info = read_log_from(src, &mut b)?;
    Ok(model(b, &info, Some((again, name))))
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
