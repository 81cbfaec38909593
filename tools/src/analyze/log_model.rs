//! A whole-run event log (`snapshot::log_reader`) as the [`Snapshot`] model every analysis
//! reads: its events per device (and pinned host memory), its stacks and frames, the
//! recorded settings and device memory. Like the other logs it has no end state
//! (`has_state: false`): the analyses rebuild the state from the events.
//!
//! A reading that stopped early (torn tail, damaged chunk) or a log that counts dropped
//! events is modelled from what it holds, and one line on stderr says so.

use crate::analyze::model::{Device, Event, Frame, Snapshot, Stacks};
use crate::snapshot::log_reader::{read_log, LogFrame, LogVisitor};
use cushim::trace::event::{TraceEvent, NO_STACK};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

#[derive(Default)]
struct Builder {
    devices: BTreeMap<i32, Vec<Event>>,
    frames: HashMap<u64, LogFrame>,
    /// Log stack id -> model list index.
    list_of: HashMap<u32, u32>,
    lists: Vec<Vec<u64>>,
}

impl Builder {
    fn list(&mut self, id: u32) -> u32 {
        if id == NO_STACK {
            return 0;
        }
        let next = self.lists.len() as u32 + 1;
        let lists = &mut self.lists;
        *self.list_of.entry(id).or_insert_with(|| {
            lists.push(Vec::new());
            next
        })
    }
}

impl LogVisitor for Builder {
    fn event(&mut self, ev: TraceEvent) {
        let stack = self.list(ev.stack);
        self.devices.entry(ev.device).or_default().push(Event {
            action: ev.action,
            addr: ev.addr,
            size: ev.size,
            stream: ev.stream,
            stack,
        });
    }

    fn frame(&mut self, id: u64, frame: LogFrame) {
        self.frames.insert(id, frame);
    }

    fn stack(&mut self, id: u32, frames: Vec<u64>) {
        let i = self.list(id) as usize;
        if let Some(l) = self.lists.get_mut(i - 1) {
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

/// Model a log's bytes.
pub fn from_log(bytes: &[u8]) -> Result<Snapshot, String> {
    let mut b = Builder::default();
    let info = read_log(bytes, &mut b)?;
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
    let mut lists: Vec<Box<[u32]>> = vec![Box::new([])];
    for l in &b.lists {
        lists.push(l.iter().filter_map(|f| index.get(f).copied()).collect());
    }
    let mut devices = Vec::new();
    let mut host = None;
    for (ordinal, events) in b.devices {
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
    Ok(Snapshot {
        kind: "cushim event log",
        devices,
        host,
        settings: settings(h),
        device_total,
        has_state: false,
        stacks: Stacks { frames, lists },
        cushim: None,
    })
}
