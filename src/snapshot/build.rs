//! Builds the snapshot value tree from a [`SnapshotInput`].
//!
//! Invariant: every distinct return address is symbolized once, every distinct frame is
//! one shared dict, and every distinct stack is one shared frame list, so a snapshot's
//! size grows with its events, not with events x frames. A stack starts at the program's
//! call site: frames of a linked-in CUDA runtime above it are dropped
//! (`trace::runtime_frames`). Segments and blocks are written
//! exactly as the allocator reported them (contiguous blocks summing to `total_size`).

use crate::alloc::info::SegmentInfo;
use crate::alloc::observed::ObservedSegment;
use crate::config::history::HistoryConf;
use crate::snapshot::events::{EventKeys, EventList};
use crate::snapshot::model::SnapshotInput;
use crate::snapshot::value::{Strings, Value};
use crate::trace::event::{StackId, TraceEvent, NO_STACK};
use crate::trace::intern::StackTable;
use crate::trace::module_epochs;
use crate::trace::range::NO_RANGE;
use crate::trace::runtime_frames::leading_runtime_frames;
use crate::trace::symbolize::Symbolizer;
use std::collections::HashMap;
use std::sync::Arc;

/// Shared frames and frame lists of one snapshot.
struct Frames<'a> {
    table: &'a StackTable,
    sym: Symbolizer,
    frame_values: Vec<Option<Value>>,
    lists: HashMap<StackId, Value>,
    empty: Value,
    ips: Vec<u64>,
    ids: Vec<u32>,
}

impl Frames<'_> {
    /// Resolve every address of `stacks` in address order, so each module's debug info is
    /// loaded once (the symbolizer keeps only a few modules' debug info at a time).
    fn prefetch(&mut self, stacks: impl Iterator<Item = StackId>) {
        let mut ids: Vec<StackId> = stacks.filter(|&s| s != NO_STACK).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut ips = Vec::new();
        for id in ids {
            self.table.with(id, |f| ips.extend_from_slice(f));
        }
        ips.retain(|&ip| !module_epochs::is_tag(ip));
        ips.sort_unstable();
        ips.dedup();
        for ip in ips {
            self.sym.resolve(ip);
        }
    }

    fn list(&mut self, s: &mut Strings, stack: StackId) -> Value {
        if stack == NO_STACK {
            return self.empty.clone();
        }
        if let Some(v) = self.lists.get(&stack) {
            return v.clone();
        }
        self.ips.clear();
        let ips = &mut self.ips;
        self.table.with(stack, |f| ips.extend_from_slice(f));
        let epoch = module_epochs::split_tag(ips);
        module_epochs::mark_unloaded(ips, epoch);
        self.ids.clear();
        self.sym.resolve_stack(&self.ips, &mut self.ids);
        let frames = self.sym.frames();
        let skip =
            leading_runtime_frames(self.ids.iter().map(|&i| frames[i as usize].name.as_str()));
        let mut items = Vec::with_capacity(self.ids.len() - skip);
        for &id in &self.ids[skip..] {
            let id = id as usize;
            if self.frame_values.len() <= id {
                self.frame_values.resize(id + 1, None);
            }
            let v = match &self.frame_values[id] {
                Some(v) => v.clone(),
                None => {
                    let f = &self.sym.frames()[id];
                    let v = Value::dict(vec![
                        (s.get("name"), Value::str(&f.name)),
                        (s.get("filename"), s.get(&f.filename)),
                        (s.get("line"), Value::uint(f.line)),
                    ]);
                    self.frame_values[id] = Some(v.clone());
                    v
                }
            };
            items.push(v);
        }
        let v = Value::list(items);
        self.lists.insert(stack, v.clone());
        v
    }
}

struct Builder<'a> {
    s: Strings,
    keys: Option<EventKeys>,
    frames: Frames<'a>,
    history: &'a HistoryConf,
}

impl Builder<'_> {
    fn state_frames(&mut self, stack: StackId) -> Value {
        let stack = if self.history.state_frames() {
            stack
        } else {
            NO_STACK
        };
        self.frames.list(&mut self.s, stack)
    }

    fn segment(&mut self, seg: &SegmentInfo, what: Option<(&str, u64)>) -> Value {
        let blocks = seg
            .blocks
            .iter()
            .map(|b| {
                let frames = self.state_frames(b.stack);
                Value::dict(vec![
                    (self.s.get("address"), Value::uint(b.address)),
                    (self.s.get("size"), Value::uint(b.size)),
                    (self.s.get("requested_size"), Value::uint(b.requested_size)),
                    (self.s.get("state"), self.s.get(b.state.name())),
                    (self.s.get("frames"), frames),
                ])
            })
            .collect();
        let frames = self.state_frames(seg.stack);
        let kind = if seg.is_large { "large" } else { "small" };
        let mut entries = vec![
            (self.s.get("device"), Value::Int(i64::from(seg.device))),
            (self.s.get("address"), Value::uint(seg.address)),
            (self.s.get("total_size"), Value::uint(seg.total_size)),
            (
                self.s.get("allocated_size"),
                Value::uint(seg.allocated_size()),
            ),
            (self.s.get("active_size"), Value::uint(seg.active_size())),
            (
                self.s.get("requested_size"),
                Value::uint(seg.requested_size()),
            ),
            (self.s.get("stream"), Value::uint(seg.stream)),
            (self.s.get("segment_type"), self.s.get(kind)),
            (
                self.s.get("segment_pool_id"),
                Value::Tuple(Arc::new(vec![
                    Value::uint(seg.pool_id.0),
                    Value::uint(seg.pool_id.1),
                ])),
            ),
            (self.s.get("is_expandable"), Value::Bool(seg.is_expandable)),
            (self.s.get("frames"), frames),
            (self.s.get("blocks"), Value::list(blocks)),
        ];
        if let Some((kind, flags)) = what {
            entries.push((self.s.get("kind"), self.s.get(kind)));
            entries.push((self.s.get("flags"), Value::uint(flags)));
        }
        Value::dict(entries)
    }

    /// Cached segments, and observed ones with their kind and flags, by device and address.
    fn segments<'s>(
        &mut self,
        segs: impl Iterator<Item = &'s SegmentInfo>,
        observed: impl Iterator<Item = &'s ObservedSegment>,
    ) -> Value {
        let mut v: Vec<(&SegmentInfo, Option<(&str, u64)>)> = segs
            .map(|s| (s, None))
            .chain(observed.map(|o| (&o.info, Some((o.kind, o.flags)))))
            .collect();
        v.sort_by_key(|s| (s.0.device, s.0.address));
        Value::list(v.into_iter().map(|(s, w)| self.segment(s, w)).collect())
    }

    /// The trace as a compact [`EventList`]: stacks filtered by `context`, each distinct
    /// stack's frame list built once.
    fn trace(&mut self, mut evs: Vec<TraceEvent>) -> Value {
        let mut lists = HashMap::new();
        let mut ranges = HashMap::new();
        for ev in &mut evs {
            if ev.range != NO_RANGE && !ranges.contains_key(&ev.range) {
                if let Some(p) = crate::trace::range::path(ev.range) {
                    ranges.insert(ev.range, self.s.get(&p));
                }
            }
            if !self.history.trace_frames_for(ev.action) {
                ev.stack = NO_STACK;
            }
            if ev.stack != NO_STACK && !lists.contains_key(&ev.stack) {
                let l = self.frames.list(&mut self.s, ev.stack);
                lists.insert(ev.stack, l);
            }
        }
        let keys = self
            .keys
            .get_or_insert_with(|| EventKeys::new(&mut self.s))
            .clone();
        let empty = self.frames.empty.clone();
        Value::Events(Arc::new(
            EventList::new(evs, lists, empty, keys).with_ranges(ranges),
        ))
    }
}

/// Build the snapshot of `input`, resolving stack ids through `stacks`.
pub fn build(input: &SnapshotInput, stacks: &StackTable) -> Value {
    module_epochs::note_loaded();
    let mut b = Builder {
        s: Strings::default(),
        keys: None,
        frames: Frames {
            table: stacks,
            sym: Symbolizer::new(),
            frame_values: Vec::new(),
            lists: HashMap::new(),
            empty: Value::list(Vec::new()),
            ips: Vec::new(),
            ids: Vec::new(),
        },
        history: &input.history,
    };
    let all_segments = input
        .devices
        .iter()
        .flat_map(|d| d.segments.iter())
        .chain(input.host.iter().flat_map(|h| h.0.iter()))
        .chain(input.observed.iter().map(|o| &o.info));
    let all_events = input
        .devices
        .iter()
        .flat_map(|d| d.events.iter())
        .chain(input.host.iter().flat_map(|h| h.1.iter()));
    let state = input.history.state_frames();
    b.frames.prefetch(
        all_segments
            .filter(|_| state)
            .flat_map(|s| std::iter::once(s.stack).chain(s.blocks.iter().map(|b| b.stack)))
            .chain(
                all_events
                    .filter(|e| input.history.trace_frames_for(e.action))
                    .map(|e| e.stack),
            ),
    );
    let segments = b.segments(
        input.devices.iter().flat_map(|d| d.segments.iter()),
        input.observed.iter().filter(|o| o.info.device >= 0),
    );
    let ndev = input
        .devices
        .iter()
        .map(|d| usize::try_from(d.device).map_or(0, |o| o + 1))
        .max()
        .unwrap_or(0);
    let mut per_device: Vec<Vec<TraceEvent>> = vec![Vec::new(); ndev];
    for d in &input.devices {
        if let Ok(o) = usize::try_from(d.device) {
            per_device[o].extend_from_slice(&d.events);
        }
    }
    let device_traces = Value::list(per_device.into_iter().map(|evs| b.trace(evs)).collect());
    let mut top = vec![
        (b.s.get("segments"), segments),
        (b.s.get("device_traces"), device_traces),
        (
            b.s.get("allocator_settings"),
            Value::from_json(&input.allocator_settings),
        ),
    ];
    if !input.annotations.is_empty() {
        // Each distinct path rendered once (a loop opens the same few ranges many times).
        let mut paths: std::collections::HashMap<u32, Value> = Default::default();
        let list = input
            .annotations
            .iter()
            .map(|a| {
                let stage = b.s.get(if a.start { "START" } else { "END" });
                let name = crate::trace::range::level_name(a.domain, a.name);
                let path = paths
                    .entry(a.path)
                    .or_insert_with(|| {
                        b.s.get(&crate::trace::range::path(a.path).unwrap_or_default())
                    })
                    .clone();
                Value::dict(vec![
                    (b.s.get("stage"), stage),
                    (b.s.get("name"), b.s.get(&name)),
                    (b.s.get("device"), Value::Int(i64::from(a.device))),
                    (b.s.get("time_us"), Value::Int(a.time_us)),
                    (b.s.get("range"), path),
                ])
            })
            .collect();
        top.push((b.s.get("external_annotations"), Value::list(list)));
    }
    if let Some((segs, evs)) = &input.host {
        let hs = b.segments(
            segs.iter(),
            input.observed.iter().filter(|o| o.info.device < 0),
        );
        let ht = b.trace(evs.clone());
        top.push((b.s.get("host_segments"), hs));
        top.push((b.s.get("host_traces"), ht));
    }
    let h = &input.history;
    let mut cushim = serde_json::json!({
        "version": crate::version::VERSION,
        "commit": crate::version::COMMIT,
        "cmdline": input.cmdline,
        "stats": input.stats,
        "history": {
            "enabled": format!("{:?}", h.enabled).to_lowercase(),
            "context": format!("{:?}", h.context).to_lowercase(),
            "stacks": match (h.native_stacks, h.python_stacks, h.native_frames) {
                (false, _, _) => "none",
                (true, false, _) => "native",
                (true, true, false) => "python",
                (true, true, true) => "all",
            },
            "max_entries": h.max_entries,
            "unwinder": format!("{:?}", h.unwinder).to_lowercase(),
            "max_frames": h.max_frames,
            "max_stacks": h.max_stacks,
        },
        // The interned-stack table's bound (trace::intern): stacks stored, and captures
        // recorded without frames because the table was full.
        "stacks": {
            "interned": stacks.len(),
            "dropped": stacks.dropped(),
            "max_stacks": stacks.limit(),
        },
    });
    if let (Some(c), Some(extra)) = (cushim.as_object_mut(), input.extra.as_object()) {
        c.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    top.push((b.s.get("cushim"), Value::from_json(&cushim)));
    Value::dict(top)
}
