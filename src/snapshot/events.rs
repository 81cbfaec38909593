//! A trace list kept as compact typed records: one device's (or the pinned host's) trace
//! entries inside a snapshot tree, without a dict per entry in memory.
//!
//! Invariant: entry `i` means exactly the dict `{action, addr | device_free, size, stream,
//! time_us, frames[, user_metadata]}` that [`EventList::entry`] returns; its `frames` is the one shared list
//! of its stack (or the shared empty list), keys and action names are shared strings. A
//! million entries cost 48 bytes each here, not a dict each; writers stream them.

use crate::snapshot::value::{Strings, Value};
use crate::trace::event::{Action, StackId, TraceEvent, NO_STACK};
use crate::trace::range::{RangeId, NO_RANGE};
use std::collections::HashMap;

/// The shared key and action-name strings of trace entries.
#[derive(Debug, Clone)]
pub struct EventKeys {
    pub action: Value,
    pub addr: Value,
    pub device_free: Value,
    pub size: Value,
    pub stream: Value,
    pub time_us: Value,
    pub frames: Value,
    /// The entry's NVTX range path (present only on entries made inside a range).
    pub user_metadata: Value,
    pub actions: Vec<Value>,
}

impl EventKeys {
    pub fn new(s: &mut Strings) -> EventKeys {
        EventKeys {
            action: s.get("action"),
            addr: s.get("addr"),
            device_free: s.get("device_free"),
            size: s.get("size"),
            stream: s.get("stream"),
            time_us: s.get("time_us"),
            frames: s.get("frames"),
            user_metadata: s.get("user_metadata"),
            actions: Action::ALL.iter().map(|a| s.get(a.name())).collect(),
        }
    }
}

/// Trace entries, oldest first, with their frame lists.
#[derive(Debug, Clone)]
pub struct EventList {
    events: Vec<TraceEvent>,
    lists: HashMap<StackId, Value>,
    empty: Value,
    keys: EventKeys,
    /// Rendered range paths of the entries' `range` ids (see [`EventList::with_ranges`]).
    ranges: HashMap<RangeId, Value>,
}

impl PartialEq for EventList {
    fn eq(&self, other: &EventList) -> bool {
        self.len() == other.len() && (0..self.len()).all(|i| self.entry(i) == other.entry(i))
    }
}

impl EventList {
    /// `events` whose stacks (already filtered: `NO_STACK` where no frames are wanted) all
    /// have a list in `lists`.
    pub fn new(
        events: Vec<TraceEvent>,
        lists: HashMap<StackId, Value>,
        empty: Value,
        keys: EventKeys,
    ) -> EventList {
        EventList {
            events,
            lists,
            empty,
            keys,
            ranges: HashMap::new(),
        }
    }

    /// The same list whose entries with a `range` in `ranges` carry that path as their
    /// `user_metadata` (entries with another range, or none, carry no `user_metadata`).
    pub fn with_ranges(mut self, ranges: HashMap<RangeId, Value>) -> EventList {
        self.ranges = ranges;
        self
    }

    /// The `user_metadata` of entry `i`, if any.
    pub fn metadata_of(&self, i: usize) -> Option<&Value> {
        match self.events[i].range {
            NO_RANGE => None,
            r => self.ranges.get(&r),
        }
    }

    /// The number of `(key, value)` pairs of entry `i`.
    pub fn pair_count(&self, i: usize) -> usize {
        6 + usize::from(self.metadata_of(i).is_some())
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn keys(&self) -> &EventKeys {
        &self.keys
    }

    /// The typed record of entry `i`.
    pub fn event(&self, i: usize) -> &TraceEvent {
        &self.events[i]
    }

    /// The frame list of entry `i`.
    pub fn frames_of(&self, i: usize) -> &Value {
        let st = self.events[i].stack;
        if st == NO_STACK {
            return &self.empty;
        }
        self.lists.get(&st).unwrap_or(&self.empty)
    }

    /// The `(key, value)` pairs of entry `i`, in snapshot order.
    pub fn pairs(&self, i: usize) -> impl Iterator<Item = (&Value, Value)> {
        let meta = self
            .metadata_of(i)
            .map(|m| (&self.keys.user_metadata, m.clone()));
        self.fixed_pairs(i).into_iter().chain(meta)
    }

    /// The pairs every entry has.
    fn fixed_pairs(&self, i: usize) -> [(&Value, Value); 6] {
        let e = &self.events[i];
        let k = &self.keys;
        let (addr_key, addr) = if e.action == Action::Oom {
            (&k.device_free, e.device_free)
        } else {
            (&k.addr, e.addr)
        };
        [
            (&k.action, k.actions[e.action as usize].clone()),
            (addr_key, Value::uint(addr)),
            (&k.size, Value::uint(e.size)),
            (&k.stream, Value::uint(e.stream)),
            (&k.time_us, Value::Int(e.time_us)),
            (&k.frames, self.frames_of(i).clone()),
        ]
    }

    /// Entry `i` as a dict.
    pub fn entry(&self, i: usize) -> Value {
        Value::dict(self.pairs(i).map(|(k, v)| (k.clone(), v)).collect())
    }

    /// All entries as dicts (a plain list).
    pub fn to_list(&self) -> Value {
        Value::list((0..self.len()).map(|i| self.entry(i)).collect())
    }
}
