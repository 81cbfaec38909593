//! From a snapshot tree (ours in any format, or PyTorch's pickle) to the [`Snapshot`] model.
//!
//! Invariant: a known key holding the wrong type, a negative size or a block list that does
//! not fit its segment is an error naming where it is (`segments[3].blocks[2].size: ...`);
//! unknown keys and unknown trace actions are ignored (newer PyTorch versions add some).
//! Frames and frame lists shared in the tree (pickle memo) are interned by identity, so a
//! million events sharing one 32-frame stack cost one stack here too. With the input's
//! length given, the model's entries (segments, blocks, events) are limited to what that
//! many bytes can hold, so a crafted file that references one large list many times over
//! (cheap in pickle's memo) is refused instead of multiplied.

use crate::analyze::annotations::{self, Nesting};
use crate::analyze::category_rules::RANGE_MARK;
use crate::analyze::entry_marks::{compile_region, private_pool, COMPILE_MARK, POOL_MARK};
use crate::analyze::frames::FORWARD_MARK;
use crate::analyze::fx_nodes;
use crate::analyze::model::{Block, BlockState, Device, Event, Frame, Segment, Snapshot, Stacks};
use cushim::snapshot::value::Value;
use cushim::trace::event::Action;
use std::collections::HashMap;
use std::sync::Arc;

type R<T> = Result<T, String>;

fn kind(v: &Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::Int(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Str(_) => "a string",
        Value::List(_) | Value::Events(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Dict(_) => "a dict",
    }
}

fn want<T>(got: Option<T>, v: &Value, at: &dyn Fn() -> String, what: &str) -> R<T> {
    got.ok_or_else(|| format!("{}: expected {what}, found {}", at(), kind(v)))
}

/// An optional non-negative integer under `key` of dict `d`.
fn uint(d: &Value, key: &str, at: &dyn Fn() -> String) -> R<Option<u64>> {
    match d.get(key) {
        None | Some(Value::None) => Ok(None),
        Some(Value::Int(i)) => u64::try_from(*i)
            .map(Some)
            .map_err(|_| format!("{}.{key}: negative ({i})", at())),
        Some(Value::Bool(b)) => Ok(Some(u64::from(*b))),
        Some(v) => Err(format!(
            "{}.{key}: expected an integer, found {}",
            at(),
            kind(v)
        )),
    }
}

fn seq<'a>(d: &'a Value, key: &str, at: &dyn Fn() -> String) -> R<&'a [Value]> {
    match d.get(key) {
        None | Some(Value::None) => Ok(&[]),
        Some(v) => want(v.as_seq(), v, &|| format!("{}.{key}", at()), "a list"),
    }
}

fn text<'a>(d: &'a Value, key: &str, at: &dyn Fn() -> String) -> R<Option<&'a str>> {
    match d.get(key) {
        None | Some(Value::None) => Ok(None),
        Some(v) => want(v.as_str(), v, &|| format!("{}.{key}", at()), "a string").map(Some),
    }
}

/// A frame dict's node, kept alive while its address is a cache key.
type FrameNode = Arc<Vec<(Value, Value)>>;

/// Interns frames and stacks, by node identity first, by content otherwise.
#[derive(Default)]
struct Interner {
    stacks: Stacks,
    /// Shared nodes seen, by address, each kept alive here so its address cannot be reused
    /// by another node while this cache exists (an unshared node is interned by content).
    list_by_ptr: HashMap<usize, (u32, Arc<Vec<Value>>)>,
    list_by_content: HashMap<Box<[u32]>, u32>,
    frame_by_ptr: HashMap<usize, (u32, FrameNode)>,
    frame_by_content: HashMap<Frame, u32>,
    strings: HashMap<Arc<str>, Arc<str>>,
    ids: Vec<u32>,
    /// PyTorch 2.4's inline record_function annotations open so far (`analyze::annotations`).
    nesting: Nesting,
    /// Stacks with a range path appended, by (stack, path).
    ranged: HashMap<(u32, Arc<str>), u32>,
}

impl Interner {
    fn new() -> Self {
        let mut i = Interner::default();
        i.list_by_content.insert(Box::new([]), 0);
        i
    }

    fn string(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(a.clone(), a.clone());
        a
    }

    fn frame(&mut self, f: &Value, at: &dyn Fn() -> String) -> R<u32> {
        let Value::Dict(d) = f else {
            return Err(format!(
                "{}: expected a frame dict, found {}",
                at(),
                kind(f)
            ));
        };
        let ptr = Arc::as_ptr(d) as usize;
        if let Some((id, _)) = self.frame_by_ptr.get(&ptr) {
            return Ok(*id);
        }
        let name = text(f, "name", at)?.unwrap_or("??");
        let file = text(f, "filename", at)?.unwrap_or("??");
        let line = match f.get("line") {
            None | Some(Value::None) => 0,
            Some(Value::Int(i)) => *i,
            Some(v) => {
                return Err(format!(
                    "{}.line: expected an integer, found {}",
                    at(),
                    kind(v)
                ))
            }
        };
        let frame = Frame {
            name: self.string(name),
            file: self.string(file),
            line,
        };
        let id = match self.frame_by_content.get(&frame) {
            Some(&id) => id,
            None => {
                let id = self.stacks.frames.len() as u32;
                self.frame_by_content.insert(frame.clone(), id);
                self.stacks.frames.push(frame);
                id
            }
        };
        if Arc::strong_count(d) > 1 {
            self.frame_by_ptr.insert(ptr, (id, d.clone()));
        }
        Ok(id)
    }

    /// A trace entry's stack: its frames, and when it has PyTorch's `forward_frames` (the
    /// forward pass that made the autograd node of a backward allocation), those after a
    /// [`FORWARD_MARK`] frame, so a site can come from them (`analyze::frames`); then the
    /// marks of its compiled region and private pool (`analyze::entry_marks`).
    fn event_stack(&mut self, e: &Value, at: &dyn Fn() -> String) -> R<u32> {
        let own = self.stack(e, at)?;
        let fwd = match e.get("forward_frames") {
            Some(Value::List(l) | Value::Tuple(l)) if !l.is_empty() => Some(l.clone()),
            _ => None,
        };
        let region =
            compile_region(e.get("compile_context").and_then(Value::as_str)).map(str::to_string);
        let pool = match e.get("pool_id").and_then(Value::as_seq) {
            Some([Value::Int(a), Value::Int(b)]) => private_pool((*a, *b)),
            _ => None,
        };
        let range = e
            .get("user_metadata")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .or_else(|| self.nesting.path().map(|p| p.to_string()));
        if fwd.is_none() && region.is_none() && pool.is_none() && range.is_none() {
            return Ok(own);
        }
        let mut ids: Vec<u32> = self
            .stacks
            .lists
            .get(own as usize)
            .map(|l| l.to_vec())
            .unwrap_or_default();
        if let Some(fwd) = fwd {
            let mark = Frame {
                name: self.string(FORWARD_MARK),
                file: self.string(""),
                line: 0,
            };
            ids.push(self.frame_id(mark));
            for (i, f) in fwd.iter().enumerate() {
                ids.push(self.frame(f, &|| format!("{}.forward_frames[{i}]", at()))?);
            }
        }
        self.push_marks(&mut ids, region.as_deref(), pool.as_deref());
        if let Some(r) = range {
            // The range path (or PyTorch's `user_metadata`) the categories and steps read.
            let mark = Frame {
                name: self.string(RANGE_MARK),
                file: self.string(&r),
                line: 0,
            };
            ids.push(self.frame_id(mark));
        }
        Ok(self.list_id(ids))
    }

    /// The frame ids of stack `id` (none for an unknown id), to extend with marks.
    fn frames_of(&self, id: u32) -> Vec<u32> {
        self.stacks
            .lists
            .get(id as usize)
            .map(|l| l.to_vec())
            .unwrap_or_default()
    }

    /// Stack `id` with a private pool's mark appended (`pool` its text); `id` itself when
    /// there is none.
    fn pooled(&mut self, id: u32, pool: Option<&str>) -> u32 {
        if pool.is_none() {
            return id;
        }
        let mut ids = self.frames_of(id);
        self.push_marks(&mut ids, None, pool);
        self.list_id(ids)
    }

    /// Stack `id` with the range path `path` appended, unless it has one already.
    fn with_range(&mut self, id: u32, path: &Arc<str>) -> u32 {
        if let Some(&r) = self.ranged.get(&(id, path.clone())) {
            return r;
        }
        let mut ids = self.frames_of(id);
        let has = ids.iter().any(|&f| {
            self.stacks
                .frames
                .get(f as usize)
                .is_some_and(|f| &*f.name == RANGE_MARK)
        });
        let out = if has {
            id
        } else {
            let mark = Frame {
                name: self.string(RANGE_MARK),
                file: self.string(path),
                line: 0,
            };
            ids.push(self.frame_id(mark));
            self.list_id(ids)
        };
        self.ranged.insert((id, path.clone()), out);
        out
    }

    fn push_marks(&mut self, ids: &mut Vec<u32>, region: Option<&str>, pool: Option<&str>) {
        for (name, value) in [(COMPILE_MARK, region), (POOL_MARK, pool)] {
            if let Some(v) = value {
                let mark = Frame {
                    name: self.string(name),
                    file: self.string(v),
                    line: 0,
                };
                ids.push(self.frame_id(mark));
            }
        }
    }

    /// The id of the stack `ids`, interned by content.
    fn list_id(&mut self, ids: Vec<u32>) -> u32 {
        match self.list_by_content.get(&ids[..]) {
            Some(&id) => id,
            None => {
                let id = self.stacks.lists.len() as u32;
                let b: Box<[u32]> = ids.into_boxed_slice();
                self.list_by_content.insert(b.clone(), id);
                self.stacks.lists.push(b);
                id
            }
        }
    }

    /// The id of `frame`, interned by content.
    fn frame_id(&mut self, frame: Frame) -> u32 {
        match self.frame_by_content.get(&frame) {
            Some(&id) => id,
            None => {
                let id = self.stacks.frames.len() as u32;
                self.frame_by_content.insert(frame.clone(), id);
                self.stacks.frames.push(frame);
                id
            }
        }
    }

    fn stack(&mut self, owner: &Value, at: &dyn Fn() -> String) -> R<u32> {
        let frames = match owner.get("frames") {
            None | Some(Value::None) => return Ok(0),
            Some(v) => v,
        };
        let (Value::List(l) | Value::Tuple(l)) = frames else {
            return Err(format!(
                "{}.frames: expected a list, found {}",
                at(),
                kind(frames)
            ));
        };
        let ptr = Arc::as_ptr(l) as usize;
        if let Some((id, _)) = self.list_by_ptr.get(&ptr) {
            return Ok(*id);
        }
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        for (i, f) in l.iter().enumerate() {
            let id = self.frame(f, &|| format!("{}.frames[{i}]", at()))?;
            // A frame of compiled code with its FX node: the node's frame just inside it.
            let node = self
                .stacks
                .frames
                .get(id as usize)
                .and_then(|own| fx_nodes::node_frame(f, own));
            if let Some(node) = node {
                let n = self.frame_id(node);
                ids.push(n);
            }
            ids.push(id);
        }
        let id = match self.list_by_content.get(&ids[..]) {
            Some(&id) => id,
            None => {
                let id = self.stacks.lists.len() as u32;
                let b: Box<[u32]> = ids.clone().into_boxed_slice();
                self.list_by_content.insert(b.clone(), id);
                self.stacks.lists.push(b);
                id
            }
        };
        self.ids = ids;
        if Arc::strong_count(l) > 1 {
            self.list_by_ptr.insert(ptr, (id, l.clone()));
        }
        Ok(id)
    }
}

fn block_state(s: Option<&str>) -> BlockState {
    match s {
        Some("active_pending_free") | Some("active_awaiting_free") => BlockState::PendingFree,
        Some(s) if s.starts_with("active") => BlockState::Allocated,
        _ => BlockState::Inactive,
    }
}

fn segment(seg: &Value, at: &dyn Fn() -> String, i: &mut Interner) -> R<(i64, Segment)> {
    if !matches!(seg, Value::Dict(_)) {
        return Err(format!(
            "{}: expected a segment dict, found {}",
            at(),
            kind(seg)
        ));
    }
    let device = match seg.get("device") {
        None | Some(Value::None) => 0,
        Some(Value::Int(d)) => *d,
        Some(v) => {
            return Err(format!(
                "{}.device: expected an integer, found {}",
                at(),
                kind(v)
            ))
        }
    };
    let address = uint(seg, "address", at)?.unwrap_or(0);
    let total_size = uint(seg, "total_size", at)?.unwrap_or(0);
    let stream = uint(seg, "stream", at)?.unwrap_or(0);
    let expandable = match seg.get("is_expandable") {
        None | Some(Value::None) => false,
        Some(v) => want(
            v.as_bool(),
            v,
            &|| format!("{}.is_expandable", at()),
            "a bool",
        )?,
    };
    let pool = match seq(seg, "segment_pool_id", at)? {
        [Value::Int(a), Value::Int(b)] => (*a, *b),
        [] => (0, 0),
        other => {
            return Err(format!(
                "{}.segment_pool_id: expected two integers, found {} items",
                at(),
                other.len()
            ))
        }
    };
    // A private pool's blocks carry its mark: their sites say which pool holds them.
    let pool_mark = private_pool(pool);
    let mut blocks = Vec::new();
    let mut offset = address;
    let mut covered: u64 = 0;
    for (n, b) in seg_blocks(seg, at)?.iter().enumerate() {
        let at = || format!("{}.blocks[{n}]", at());
        if !matches!(b, Value::Dict(_)) {
            return Err(format!(
                "{}: expected a block dict, found {}",
                at(),
                kind(b)
            ));
        }
        let size = uint(b, "size", &at)?.unwrap_or(0);
        covered = covered.saturating_add(size);
        if covered > total_size {
            return Err(format!(
                "{}: blocks add up to more than the segment's total_size {total_size}",
                at()
            ));
        }
        let address = uint(b, "address", &at)?.unwrap_or(offset);
        offset = address.saturating_add(size);
        let state = block_state(text(b, "state", &at)?);
        let stack = i.stack(b, &at)?;
        let stack = i.pooled(stack, pool_mark.as_deref());
        blocks.push(Block {
            address,
            size,
            requested: uint(b, "requested_size", &at)?.unwrap_or(size),
            state,
            stack,
        });
    }
    let kind = text(seg, "kind", at)?.map(|k| i.string(k));
    Ok((
        device,
        Segment {
            address,
            total_size,
            stream,
            expandable,
            kind,
            pool,
            blocks,
        },
    ))
}

fn seg_blocks<'a>(seg: &'a Value, at: &dyn Fn() -> String) -> R<&'a [Value]> {
    seq(seg, "blocks", at)
}

fn event(e: &Value, at: &dyn Fn() -> String, i: &mut Interner) -> R<Option<Event>> {
    if !matches!(e, Value::Dict(_)) {
        return Err(format!(
            "{}: expected a trace entry dict, found {}",
            at(),
            kind(e)
        ));
    }
    // PyTorch before 2.1 wrote one `free` action where it now writes free_requested and
    // free_completed.
    let name = text(e, "action", at)?.map(|a| if a == "free" { "free_completed" } else { a });
    if let Some((n, start)) = annotations::inline(e) {
        i.nesting.apply(&n, start);
        return Ok(None);
    }
    let Some(action) = name.and_then(Action::from_name) else {
        return Ok(None);
    };
    // Checked though not kept (see `Event`): a wrong type here is a broken file.
    match e.get("time_us") {
        None | Some(Value::None) | Some(Value::Int(_)) => {}
        Some(v) => {
            return Err(format!(
                "{}.time_us: expected an integer, found {}",
                at(),
                kind(v)
            ))
        }
    }
    // An out-of-memory entry carries the driver's free memory as `device_free` in place of
    // an address (the model keeps it in `addr`, as the engine's own events do).
    let addr = match (action, uint(e, "device_free", at)?) {
        (Action::Oom, Some(free)) => free,
        _ => uint(e, "addr", at)?.unwrap_or(0),
    };
    Ok(Some(Event {
        action,
        addr,
        size: uint(e, "size", at)?.unwrap_or(0),
        stream: uint(e, "stream", at)?.unwrap_or(0),
        stack: i.event_stack(e, at)?,
    }))
}

/// PyTorch's `allocator_settings` (or ours) as a configuration string: the recorded
/// `PYTORCH_CUDA_ALLOC_CONF`, then the effective values of the keys that shape the cache
/// (they may have been set from Python rather than the environment); later keys win.
fn settings(v: &Value) -> R<Option<String>> {
    let Some(s) = v.get("allocator_settings") else {
        return Ok(None);
    };
    if !matches!(s, Value::Dict(_)) {
        return Err(format!(
            "allocator_settings: expected a dict, found {}",
            kind(s)
        ));
    }
    let mut parts: Vec<String> = Vec::new();
    if let Some(raw) = text(s, "PYTORCH_CUDA_ALLOC_CONF", &|| {
        "allocator_settings".into()
    })? {
        if !raw.trim().is_empty() {
            parts.push(raw.trim().to_string());
        }
    }
    match s.get("max_split_size") {
        Some(Value::Int(n)) if *n > 0 && *n < i64::MAX => {
            parts.push(format!("max_split_size_mb:{}", (*n as u64) >> 20))
        }
        _ => {}
    }
    match s.get("garbage_collection_threshold") {
        Some(Value::Float(f)) if *f > 0.0 && *f < 1.0 => {
            parts.push(format!("garbage_collection_threshold:{f}"))
        }
        _ => {}
    }
    if let Some(b) = s.get("expandable_segments").and_then(Value::as_bool) {
        parts.push(format!(
            "expandable_segments:{}",
            if b { "True" } else { "False" }
        ));
    }
    Ok(Some(merged(&parts)))
}

/// `parts` (each `key:value[,key:value...]`) as one configuration in which each key appears
/// once, at its first place, with its last value: the effective values PyTorch records
/// beside the environment's string restate keys the string already set.
fn merged(parts: &[String]) -> String {
    let mut keys: Vec<(String, String)> = Vec::new();
    for kv in parts.iter().flat_map(|p| top_level(p)) {
        let kv = kv.trim();
        if kv.is_empty() {
            continue;
        }
        let (k, v) = kv.split_once(':').unwrap_or((kv, ""));
        match keys.iter_mut().find(|(key, _)| key == k.trim()) {
            Some(e) => e.1 = v.trim().to_string(),
            None => keys.push((k.trim().to_string(), v.trim().to_string())),
        }
    }
    keys.iter()
        .map(|(k, v)| {
            if v.is_empty() {
                k.clone()
            } else {
                format!("{k}:{v}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The devices' total memory as the shim recorded it (`cushim.memory[].total`, asked of the
/// driver at the dump; the largest when devices differ); PyTorch's snapshots do not have it.
fn device_total(v: &Value) -> Option<u64> {
    v.get("cushim")?
        .get("memory")?
        .as_seq()?
        .iter()
        .filter_map(|m| m.get("total")?.as_i64())
        .filter_map(|t| u64::try_from(t).ok())
        .max()
}

/// `s` split at its commas outside brackets (`roundup_power2_divisions:[256:1,512:2]` is one
/// key).
fn top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[from..]);
    out
}

/// Bytes of pickle one entry (segment, block, trace entry) takes at least: a dict with a
/// handful of memoized keys and small values.
const MIN_ENTRY_BYTES: usize = 8;

/// Counts the model's entries against what the input can hold.
struct Budget(usize);

impl Budget {
    fn take(&mut self, n: usize, at: &dyn Fn() -> String) -> R<()> {
        self.0 = self.0.checked_sub(n).ok_or_else(|| {
            format!(
                "{}: more entries than a file of this size can hold (a list shared many times over?)",
                at()
            )
        })?;
        Ok(())
    }
}

/// The model of a snapshot tree.
pub fn from_value(v: &Value) -> R<Snapshot> {
    from_value_sized(v, usize::MAX)
}

/// The model of a snapshot tree read from `input_len` bytes.
pub fn from_value_sized(v: &Value, input_len: usize) -> R<Snapshot> {
    Loader::new().model(v, input_len)
}

/// Builds the model, optionally taking trace entries out of the tree while it is read.
///
/// Streaming: [`Loader::extract`], given to the pickle reader as its dict hook, turns each
/// completed trace entry (a dict with an `action` string) into its compact [`Event`] at
/// once and leaves `Int(index)` in its place, so a million entries never exist as dicts at
/// the same time. [`Loader::model`] then takes the events back by index.
pub struct Loader {
    i: Interner,
    extracted: Vec<Event>,
    /// Lists the reader kept as a run of taken entries: the placeholder list it put in the
    /// tree (known by identity, kept alive here so no other list can take its address),
    /// the first entry's index and the count.
    runs: Vec<(Arc<Vec<Value>>, i64, u64)>,
    /// Each extracted event's `time_us` ([`NO_TIME`] when it has none), to place it among
    /// PyTorch's `external_annotations`, which the pickle holds after the traces.
    times: Vec<i64>,
    error: Option<String>,
}

/// The time of an event that records none.
const NO_TIME: i64 = i64::MIN;

/// Whether trace entry `e` (a dict) becomes an event (see `event`).
fn kept(e: &Value) -> bool {
    match e.get("action").and_then(Value::as_str) {
        Some("free") => true,
        Some(a) => annotations::inline(e).is_none() && Action::from_name(a).is_some(),
        None => false,
    }
}

fn time_of(e: &Value) -> i64 {
    e.get("time_us").and_then(Value::as_i64).unwrap_or(NO_TIME)
}

impl crate::snapshot::reader::Hook for Loader {
    fn dict(&mut self, v: Value) -> Value {
        self.extract(v)
    }
    fn taken_list(&mut self, first: i64, n: u64) -> Value {
        let l = Arc::new(Vec::new());
        self.runs.push((l.clone(), first, n));
        Value::List(l)
    }
}

impl Default for Loader {
    fn default() -> Self {
        Loader::new()
    }
}

impl Loader {
    pub fn new() -> Loader {
        Loader {
            i: Interner::new(),
            extracted: Vec::new(),
            runs: Vec::new(),
            times: Vec::new(),
            error: None,
        }
    }

    /// The dict hook: a trace entry becomes `Int(index)` of its extracted event.
    pub fn extract(&mut self, v: Value) -> Value {
        if self.error.is_some() || !matches!(v.get("action"), Some(Value::Str(_))) {
            return v;
        }
        let k = self.extracted.len();
        match event(&v, &|| format!("trace entry {k}"), &mut self.i) {
            Ok(Some(ev)) => {
                self.extracted.push(ev);
                self.times.push(time_of(&v));
                Value::Int(k as i64)
            }
            // An action this version does not know: skipped, as `model` skips it.
            Ok(None) => Value::None,
            Err(e) => {
                self.error = Some(e);
                v
            }
        }
    }

    /// A trace entry: a dict, the index of one already extracted, or `None` for one skipped.
    fn entry(&mut self, e: &Value, at: &dyn Fn() -> String) -> R<Option<Event>> {
        match e {
            Value::Int(k) => usize::try_from(*k)
                .ok()
                .and_then(|k| self.extracted.get(k).copied())
                .map(Some)
                .ok_or_else(|| format!("{}: expected a trace entry dict, found an integer", at())),
            Value::None => Ok(None),
            e => event(e, at, &mut self.i),
        }
    }

    /// A device's events: the extracted ones moved out whole when the trace is exactly
    /// all of them in order (one device: the common case, no copy), else copied entry by
    /// entry.
    fn events(&mut self, entries: &[Value], d: usize) -> R<Vec<Event>> {
        let whole = entries.len() == self.extracted.len()
            && entries
                .iter()
                .enumerate()
                .all(|(n, e)| matches!(e, Value::Int(k) if *k == n as i64));
        if whole && !entries.is_empty() {
            return Ok(std::mem::take(&mut self.extracted));
        }
        let mut events = Vec::with_capacity(entries.len());
        for (n, e) in entries.iter().enumerate() {
            if let Some(ev) = self.entry(e, &|| format!("device_traces[{d}][{n}]"))? {
                events.push(ev);
            }
        }
        Ok(events)
    }

    /// The events of `trace` when it is a list the reader kept as a run of taken entries:
    /// moved out whole when it is all of them and referenced once, else copied.
    fn run_events(&mut self, trace: &Value) -> Option<(u64, R<Vec<Event>>)> {
        let Value::List(l) = trace else { return None };
        let &(ref held, first, n) = self.runs.iter().find(|r| Arc::ptr_eq(&r.0, l))?;
        let once = Arc::strong_count(held) == 2;
        let all = first == 0 && n == self.extracted.len() as u64;
        if once && all {
            return Some((n, Ok(std::mem::take(&mut self.extracted))));
        }
        let range = usize::try_from(first)
            .ok()
            .zip(usize::try_from(n).ok())
            .and_then(|(f, n)| self.extracted.get(f..f.checked_add(n)?));
        Some((
            n,
            range.map(<[Event]>::to_vec).ok_or_else(|| {
                "a trace's entries were read twice (a list shared through the pickle memo?)"
                    .to_string()
            }),
        ))
    }

    /// The `time_us` of each event `trace` holds, in its order (as `events` and
    /// `run_events` read them).
    fn trace_times(&self, trace: &Value) -> Vec<i64> {
        if let Value::List(l) = trace {
            if let Some(&(_, first, n)) = self.runs.iter().find(|r| Arc::ptr_eq(&r.0, l)) {
                let (f, n) = (first.max(0) as usize, n as usize);
                return self
                    .times
                    .get(f..f.saturating_add(n))
                    .map(<[i64]>::to_vec)
                    .unwrap_or_default();
            }
        }
        let built;
        let entries = match trace {
            Value::Events(e) => {
                built = e.to_list();
                built.as_seq().unwrap_or(&[])
            }
            t => t.as_seq().unwrap_or(&[]),
        };
        entries
            .iter()
            .filter_map(|e| match e {
                Value::Int(k) => Some(
                    usize::try_from(*k)
                        .ok()
                        .and_then(|k| self.times.get(k).copied())
                        .unwrap_or(NO_TIME),
                ),
                Value::Dict(_) if kept(e) => Some(time_of(e)),
                _ => None,
            })
            .collect()
    }

    /// Gives each event of `dev` without a range path the path of PyTorch's annotations
    /// open at its time (`analyze::annotations`).
    fn annotate(&mut self, dev: &mut Device, times: &[i64], tl: &annotations::Timeline) {
        if times.len() != dev.events.len() {
            return;
        }
        for (ev, &t) in dev.events.to_mut().iter_mut().zip(times) {
            if t == NO_TIME {
                continue;
            }
            if let Some(p) = tl.path_at(t) {
                ev.stack = self.i.with_range(ev.stack, p);
            }
        }
    }

    /// The model of `v` (read from `input_len` bytes).
    pub fn model(mut self, v: &Value, input_len: usize) -> R<Snapshot> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.model_inner(v, input_len)
    }

    fn model_inner(&mut self, v: &Value, input_len: usize) -> R<Snapshot> {
        let mut budget = Budget((input_len / MIN_ENTRY_BYTES).saturating_add(1024));
        let Value::Dict(top) = v else {
            return Err(crate::snapshot::sniff::not_snapshot(kind(v)));
        };
        // A snapshot has at least one of these; a dict with none of them is some other
        // data (a Chrome trace, a package.json, a pickled config).
        const SNAPSHOT_KEYS: [&str; 4] =
            ["segments", "device_traces", "host_segments", "host_traces"];
        if !SNAPSHOT_KEYS.iter().any(|k| v.get(k).is_some()) {
            let keys: Vec<&str> = top.iter().filter_map(|(k, _)| k.as_str()).collect();
            return Err(crate::snapshot::sniff::not_snapshot(
                crate::snapshot::sniff::describe_dict(&keys),
            ));
        }
        let mut devices: Vec<Device> = Vec::new();
        let mut index: HashMap<i64, usize> = HashMap::new();
        let mut dev_at = |devices: &mut Vec<Device>, d: i64| -> usize {
            *index.entry(d).or_insert_with(|| {
                devices.push(Device {
                    ordinal: d,
                    ..Default::default()
                });
                devices.len() - 1
            })
        };
        for (n, seg) in seq(v, "segments", &|| "snapshot".into())?
            .iter()
            .enumerate()
        {
            let at = || format!("segments[{n}]");
            budget.take(1 + seg_blocks(seg, &at).map_or(0, <[Value]>::len), &at)?;
            let (d, s) = segment(seg, &at, &mut self.i)?;
            let p = dev_at(&mut devices, d);
            devices[p].segments.push(s);
        }
        let timelines = annotations::timelines(v);
        let mut annotated: Vec<(usize, Vec<i64>)> = Vec::new();
        for (d, trace) in seq(v, "device_traces", &|| "snapshot".into())?
            .iter()
            .enumerate()
        {
            let at = || format!("device_traces[{d}]");
            if timelines.get(&(d as i64)).is_some_and(|t| !t.is_empty()) {
                annotated.push((d, self.trace_times(trace)));
            }
            if let Some((n, events)) = self.run_events(trace) {
                budget.take(n as usize, &at)?;
                let p = dev_at(&mut devices, d as i64);
                devices[p].events = events.map_err(|e| format!("{}: {e}", at()))?.into();
                continue;
            }
            let built;
            let trace = match trace {
                Value::Events(e) => {
                    built = e.to_list();
                    &built
                }
                t => t,
            };
            let entries = want(trace.as_seq(), trace, &at, "a list")?;
            if entries.is_empty() {
                continue;
            }
            budget.take(entries.len(), &at)?;
            let p = dev_at(&mut devices, d as i64);
            devices[p].events = self.events(entries, d)?.into();
        }
        self.times = Vec::new();
        for (d, times) in annotated {
            let (Some(tl), Some(dev)) = (
                timelines.get(&(d as i64)),
                devices.iter_mut().find(|x| x.ordinal == d as i64),
            ) else {
                continue;
            };
            self.annotate(dev, &times, tl);
        }
        devices.sort_by_key(|d| d.ordinal);
        let host = if v.get("host_segments").is_some() || v.get("host_traces").is_some() {
            let mut h = Device {
                ordinal: -1,
                ..Default::default()
            };
            for (n, seg) in seq(v, "host_segments", &|| "snapshot".into())?
                .iter()
                .enumerate()
            {
                let at = || format!("host_segments[{n}]");
                budget.take(1 + seg_blocks(seg, &at).map_or(0, <[Value]>::len), &at)?;
                h.segments.push(segment(seg, &at, &mut self.i)?.1);
            }
            if let Some((n, events)) = v.get("host_traces").and_then(|t| self.run_events(t)) {
                budget.take(n as usize, &|| "host_traces".into())?;
                h.events = events.map_err(|e| format!("host_traces: {e}"))?.into();
            }
            let built;
            let traces = match v.get("host_traces") {
                _ if !h.events.is_empty() => &[][..],
                Some(Value::Events(e)) => {
                    built = e.to_list();
                    built.as_seq().unwrap_or(&[])
                }
                _ => seq(v, "host_traces", &|| "snapshot".into())?,
            };
            budget.take(traces.len(), &|| "host_traces".into())?;
            for (n, e) in traces.iter().enumerate() {
                if let Some(ev) = self.entry(e, &|| format!("host_traces[{n}]"))? {
                    h.events.push(ev);
                }
            }
            Some(h)
        } else {
            None
        };
        Ok(Snapshot {
            kind: "snapshot",
            devices,
            host,
            settings: settings(v)?,
            device_total: device_total(v),
            has_state: true,
            stacks: std::mem::take(&mut self.i.stacks),
            cushim: v.get("cushim").cloned(),
        })
    }
}
