//! Reads snapshots: our pickle, msgpack and JSON, and PyTorch's own snapshot pickles
//! (protocols 0-5, the opcodes of plain data), into a [`Value`] tree.
//!
//! Invariant: the pickle reader accepts only plain-data opcodes (no GLOBAL/REDUCE/BUILD:
//! nothing is ever imported or called); an object fetched from the memo is the same shared
//! node wherever it appears, so a snapshot with shared frame lists stays small in memory.
//!
//! Hostile input (snapshots are files people send each other): every length is checked
//! against the bytes left before anything is allocated; nesting deeper than [`MAX_DEPTH`]
//! is refused (so no later recursive walk or drop can overflow the stack); a memo lookup
//! does not depend on what the stack holds, and the memo of a streamed trace is a few runs
//! ([`crate::snapshot::memo`]); and copying a shared container to mutate it (which no
//! real pickle does) is budgeted by the input's length, so the tree held in memory is at
//! most a constant factor of the file. [`expanded_nodes`] tells how large a tree becomes
//! with shared nodes written out (the check before writing JSON or msgpack).

use crate::snapshot::memo::{Memo, Slot};
use cushim::snapshot::value::Value;
use cushim::snapshot::Format;
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

/// Read a snapshot file, by content (a pickle starts with PROTO 0x80; JSON with `{`),
/// falling back to msgpack, through any gzip and zstd layers.
/// JSON and msgpack are read as a stream (a plain file as one mapped slice whose pages
/// are given back behind the parse point, `snapshot::mapped`), repeated strings, frames and frame lists made one
/// node each (`snapshot::share`), so neither the text nor a tree of its every copy is ever
/// in memory; a compressed pickle is read as it is decompressed; a plain pickle whole.
pub fn read_file(path: &std::path::Path) -> Result<Value, String> {
    let reading = |e: String| format!("reading {}: {e}", path.display());
    let named = |e: String| crate::snapshot::sniff::name_error(path, &e);
    let f = std::fs::File::open(path).map_err(|e| reading(e.to_string()))?;
    let len = f.metadata().map_err(|e| reading(e.to_string()))?.len();
    let r = std::io::BufReader::with_capacity(1 << 20, f);
    let (mut d, layers) = crate::snapshot::sniff::decompressing(Box::new(r)).map_err(reading)?;
    let head = std::io::BufRead::fill_buf(&mut d).map_err(|e| reading(e.to_string()))?;
    let head = head[..head.len().min(4096)].to_vec();
    use crate::snapshot::sniff::{describe, kind, not_snapshot, Kind};
    match kind(&head) {
        Kind::Pickle if layers == 0 => {
            drop(d);
            let bytes = std::fs::read(path).map_err(|e| reading(e.to_string()))?;
            read_bytes(&bytes).map_err(named)
        }
        Kind::Pickle => {
            // Copying shared containers is budgeted as for a file 64 times the compressed one.
            let budget = usize::try_from(len.saturating_mul(64)).unwrap_or(usize::MAX);
            let src = Source::Stream {
                r: d,
                buf: Vec::new(),
            };
            reader(src, usize::MAX, budget, None).run().map_err(named)
        }
        k @ (Kind::Json | Kind::Msgpack) if layers == 0 => {
            drop(d);
            let f = std::fs::File::open(path).map_err(|e| reading(e.to_string()))?;
            let map = crate::snapshot::mapped::Mapped::open(&f).map_err(reading)?;
            let mut reached = |pos: usize| map.release_before(pos);
            let format = if k == Kind::Json {
                Format::Json
            } else {
                Format::Msgpack
            };
            crate::snapshot::stream::read_slice(format, map.bytes(), None, true, Some(&mut reached))
                .map_err(named)
        }
        Kind::Json => crate::snapshot::stream::read_json_shared(d).map_err(named),
        Kind::Msgpack => crate::snapshot::stream::read_msgpack_shared(d).map_err(named),
        _ => Err(named(not_snapshot(describe(&head)))),
    }
}

/// Decode snapshot bytes in any supported format (detected from the content).
pub fn read_bytes(bytes: &[u8]) -> Result<Value, String> {
    use crate::snapshot::sniff::{describe, kind, not_snapshot, Kind};
    match kind(&bytes[..bytes.len().min(crate::snapshot::sniff::HEAD)]) {
        Kind::Pickle => read_pickle(bytes),
        Kind::Json => {
            let j: serde_json::Value =
                serde_json::from_slice(bytes).map_err(|e| format!("JSON: {e}"))?;
            check_depth(&j, "JSON")?;
            Ok(restore_tuples(Value::from_json(&j)))
        }
        Kind::Msgpack => {
            let j = read_msgpack_value(bytes)?;
            check_depth(&j, "msgpack")?;
            Ok(restore_tuples(Value::from_json(&j)))
        }
        _ => Err(not_snapshot(describe(bytes))),
    }
}

/// One msgpack value that must fill the input exactly: msgpack is the fallback format, so
/// arbitrary bytes (a text file starts with a positive fixint) would otherwise read as a
/// number followed by ignored garbage.
fn read_msgpack_value(bytes: &[u8]) -> Result<serde_json::Value, String> {
    use serde::Deserialize;
    let mut cur = std::io::Cursor::new(bytes);
    let j = {
        let mut de = rmp_serde::Deserializer::new(&mut cur);
        serde_json::Value::deserialize(&mut de).map_err(|e| format!("msgpack: {e}"))?
    };
    let used = cur.position();
    if used != bytes.len() as u64 {
        return Err(format!(
            "msgpack: {} bytes after the first value (at byte {used}): not one msgpack snapshot",
            bytes.len() as u64 - used
        ));
    }
    Ok(j)
}

/// Refuse a tree nested deeper than [`MAX_DEPTH`] (the parsers stop far deeper, at 128 and
/// 1024 levels; the recursion here stops at the limit).
fn check_depth(j: &serde_json::Value, what: &str) -> Result<(), String> {
    fn deeper(j: &serde_json::Value, left: u32) -> bool {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match j {
            serde_json::Value::Array(a) => Box::new(a.iter()),
            serde_json::Value::Object(o) => Box::new(o.values()),
            _ => return false,
        };
        if left == 0 {
            return true;
        }
        children.into_iter().any(|c| deeper(c, left - 1))
    }
    if deeper(j, MAX_DEPTH) {
        return Err(format!("{what} nests deeper than {MAX_DEPTH} levels"));
    }
    Ok(())
}

/// JSON and msgpack have no tuples: turn the schema's tuple (`segment_pool_id`) back into
/// one, so a converted snapshot is the same as the original.
pub(crate) fn restore_tuples(mut v: Value) -> Value {
    let Value::Dict(top) = &mut v else { return v };
    for (k, segs) in Arc::make_mut(top).iter_mut() {
        if !matches!(k.as_str(), Some("segments" | "host_segments")) {
            continue;
        }
        let Value::List(segs) = segs else { continue };
        for seg in Arc::make_mut(segs).iter_mut() {
            let Value::Dict(seg) = seg else { continue };
            for (k, pool) in Arc::make_mut(seg).iter_mut() {
                if k.as_str() == Some("segment_pool_id") {
                    if let Value::List(items) = pool {
                        *pool = Value::Tuple(items.clone());
                    }
                }
            }
        }
    }
    v
}

pub use crate::snapshot::sniff::snapshot_format as detect;

/// Dicts up to this size are checked for repeated keys on insertion.
const DEDUP_SCAN: usize = 16;

/// The deepest nesting accepted: a snapshot is 8 levels deep (top dict, segments, segment,
/// blocks, block, frames, frame, value); the margin is for other plain data.
pub const MAX_DEPTH: u32 = 64;

struct Item {
    v: Value,
    /// Memo slots that name this (still mutable) object.
    memo: Vec<u32>,
    /// Levels of nesting in `v` (0 for a scalar).
    depth: u32,
    /// For a list that so far holds only entries the hook took (`v` is empty): the first
    /// one's integer and how many follow it consecutively (see [`Hook`]).
    taken: Option<(i64, u64)>,
}

/// A consumer that takes entries out of the tree as the stream is read (so millions of
/// small dicts never exist at once).
pub trait Hook {
    /// Called with every completed dict as it leaves the stack; returns what takes its
    /// place (everywhere: in its container and in the memo). An integer returned means the
    /// consumer took the dict: a list that holds only such integers, consecutive, keeps
    /// just the first and the count (16 bytes, not 24 per entry).
    fn dict(&mut self, v: Value) -> Value;
    /// A list holding only the taken entries `first..first + n`, leaving the stack: what
    /// takes its place.
    fn taken_list(&mut self, first: i64, n: u64) -> Value;
}

/// The hook as the reader holds it.
pub type DictHook<'h> = &'h mut dyn Hook;

/// Where pickle bytes come from: memory, or a file streamed through a buffer (so a 1 GB
/// file is never in memory whole). `len` is known up front either way, and every length
/// is checked against what is left before anything is read or allocated.
enum Source<'a> {
    Slice(&'a [u8]),
    Stream {
        r: Box<dyn std::io::BufRead + 'a>,
        buf: Vec<u8>,
    },
}

struct Reader<'a, 'h> {
    hook: Option<DictHook<'h>>,
    src: Source<'a>,
    len: usize,
    pos: usize,
    stack: Vec<Item>,
    marks: Vec<usize>,
    memo: Memo,
    /// Slots assigned so far (MEMOIZE takes the next one, as `len(memo)` in Python).
    memo_count: u32,
    /// Elements that copying shared containers may still cost (see the module comment).
    copy_budget: usize,
    /// Whether the last object(s) finished were all entries the hook took.
    last_taken: bool,
}

impl Reader<'_, '_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let pos = self.pos;
        let end = pos.checked_add(n).filter(|&e| e <= self.len);
        let end = end.ok_or_else(|| format!("truncated pickle at byte {pos}"))?;
        self.pos = end;
        match &mut self.src {
            Source::Slice(b) => Ok(&b[pos..end]),
            Source::Stream { r, buf } => {
                buf.clear();
                let avail = r
                    .fill_buf()
                    .map_err(|e| format!("reading byte {pos}: {e}"))?;
                if avail.len() >= n {
                    buf.extend_from_slice(&avail[..n]);
                    r.consume(n);
                } else {
                    // Grown as the bytes arrive, never to a length the input claims
                    // (a stream of unknown length checks nothing up front).
                    let got = r
                        .by_ref()
                        .take(n as u64)
                        .read_to_end(buf)
                        .map_err(|e| format!("reading bytes {pos}..{end}: {e}"))?;
                    if got < n {
                        return Err(format!("truncated pickle at byte {}", pos + got));
                    }
                }
                Ok(&buf[..])
            }
        }
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn le<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn line_bytes(&mut self) -> Result<&'_ [u8], String> {
        let pos = self.pos;
        match &mut self.src {
            Source::Slice(b) => {
                let rest = &b[pos..];
                let n = rest
                    .iter()
                    .position(|&c| c == b'\n')
                    .ok_or("unterminated text opcode")?;
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            Source::Stream { r, buf } => {
                buf.clear();
                let n = r
                    .read_until(b'\n', buf)
                    .map_err(|e| format!("reading byte {pos}: {e}"))?;
                self.pos += n;
                if buf.pop() != Some(b'\n') || self.pos > self.len {
                    return Err("unterminated text opcode".into());
                }
                Ok(&buf[..])
            }
        }
    }
    fn line(&mut self) -> Result<String, String> {
        Ok(String::from_utf8_lossy(self.line_bytes()?).into_owned())
    }
    fn push(&mut self, v: Value) {
        self.push_at(v, 0);
    }
    fn push_at(&mut self, v: Value, depth: u32) {
        self.stack.push(Item {
            v,
            memo: Vec::new(),
            depth,
            taken: None,
        });
    }
    /// Pop the top object; it is complete now, so the memo slots naming it get it.
    fn pop(&mut self) -> Result<Value, String> {
        Ok(self.pop_item()?.0)
    }
    fn pop_item(&mut self) -> Result<(Value, u32), String> {
        let it = self.stack.pop().ok_or("pickle stack underflow")?;
        Ok(self.finish(it))
    }
    /// An object leaving the stack: the hook sees it (a dict) and the memo slots naming it
    /// get what takes its place.
    fn finish(&mut self, mut it: Item) -> (Value, u32) {
        self.last_taken = false;
        if let (Some(hook), Value::Dict(_)) = (self.hook.as_mut(), &it.v) {
            it.v = hook.dict(std::mem::replace(&mut it.v, Value::None));
            if !matches!(it.v, Value::Dict(_)) {
                it.depth = 0;
            }
            self.last_taken = matches!(it.v, Value::Int(_));
        } else if let (Some(hook), Some((first, n))) = (self.hook.as_mut(), it.taken) {
            it.v = hook.taken_list(first, n);
        }
        for slot in it.memo {
            self.memo.insert(slot, Slot::Done(it.v.clone(), it.depth));
        }
        (it.v, it.depth)
    }
    /// Pop everything above the last MARK, with the deepest nesting among them.
    fn pop_mark_depth(&mut self) -> Result<(Vec<Value>, u32), String> {
        let m = self.marks.pop().ok_or("pickle: no MARK")?;
        if m > self.stack.len() {
            return Err("pickle: MARK above stack".into());
        }
        // Finished in stream order (first pushed, first seen by the hook), so a hook that
        // numbers what it sees numbers a batch of trace entries in their order.
        let items: Vec<Item> = self.stack.drain(m..).collect();
        let mut out = Vec::with_capacity(items.len());
        let mut depth = 0;
        let mut all_taken = true;
        for it in items {
            let (v, d) = self.finish(it);
            all_taken &= self.last_taken;
            depth = depth.max(d);
            out.push(v);
        }
        self.last_taken = all_taken;
        Ok((out, depth))
    }
    /// A container holding children `child_depth` deep, refused past [`MAX_DEPTH`].
    fn nest(&self, child_depth: u32) -> Result<u32, String> {
        let d = child_depth + 1;
        if d > MAX_DEPTH {
            return Err(format!(
                "pickle nests deeper than {MAX_DEPTH} levels at byte {}",
                self.pos
            ));
        }
        Ok(d)
    }
    /// Charge `n` copied elements to the copy budget.
    fn charge_copy(&mut self, n: usize) -> Result<(), String> {
        self.copy_budget = self.copy_budget.checked_sub(n).ok_or_else(|| {
            format!(
                "pickle copies shared containers beyond what its size justifies (byte {})",
                self.pos
            )
        })?;
        Ok(())
    }
    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let m = self.marks.pop().ok_or("pickle: no MARK")?;
        if m > self.stack.len() {
            return Err("pickle: MARK above stack".into());
        }
        let items: Vec<Item> = self.stack.drain(m..).collect();
        Ok(items.into_iter().map(|it| self.finish(it).0).collect())
    }
    fn put(&mut self, slot: u32) -> Result<(), String> {
        self.memo_count = self.memo_count.max(slot.saturating_add(1));
        let index = self.stack.len().wrapping_sub(1);
        let top = self.stack.last_mut().ok_or("pickle: PUT on empty stack")?;
        match &top.v {
            Value::List(_) | Value::Dict(_) => {
                top.memo.push(slot);
                self.memo.insert(slot, Slot::Open(index));
            }
            v => {
                let entry = Slot::Done(v.clone(), top.depth);
                self.memo.insert(slot, entry);
            }
        }
        Ok(())
    }
    fn get(&mut self, slot: u32) -> Result<(), String> {
        let unset = || format!("pickle: memo slot {slot} unset");
        let (v, depth) = match self.memo.get(slot) {
            Some(Slot::Done(v, d)) => (v, d),
            Some(Slot::Open(i)) => {
                self.materialize(i);
                let it = self.stack.get(i).ok_or_else(unset)?;
                (it.v.clone(), it.depth)
            }
            None => return Err(unset()),
        };
        self.push_at(v, depth);
        Ok(())
    }
    /// The top item, its nesting raised to hold children `child_depth` deep, and the
    /// copy of its container paid for if it is shared.
    fn top_for_insert(&mut self, child_depth: u32, added: usize) -> Result<&mut Value, String> {
        let depth = self.nest(child_depth)?;
        let shared = match self.stack.last() {
            Some(Item {
                v: Value::List(l), ..
            }) => (Arc::strong_count(l) > 1).then(|| l.len()),
            Some(Item {
                v: Value::Dict(d), ..
            }) => (Arc::strong_count(d) > 1).then(|| d.len()),
            _ => None,
        };
        self.charge_copy(shared.unwrap_or(0).saturating_add(added))?;
        let top = self.stack.last_mut().ok_or("pickle: empty stack")?;
        top.depth = top.depth.max(depth);
        Ok(&mut top.v)
    }
    /// Write out the taken entries of the list at stack index `i` as the integers they
    /// are (before anything else sees or joins its contents).
    fn materialize(&mut self, i: usize) {
        let Some(it) = self.stack.get_mut(i) else {
            return;
        };
        if let (Some((first, n)), Value::List(l)) = (it.taken.take(), &mut it.v) {
            let l = Arc::make_mut(l);
            let mut all = Vec::with_capacity(l.len().saturating_add(n as usize));
            all.extend((0..n).map(|j| Value::Int(first.saturating_add(j as i64))));
            all.append(l);
            *l = all;
        }
    }
    /// `taken`: every item is an entry the hook took (an integer).
    fn extend_list(
        &mut self,
        items: Vec<Value>,
        child_depth: u32,
        taken: bool,
    ) -> Result<(), String> {
        let top = self.stack.len().wrapping_sub(1);
        self.top_for_insert(child_depth, 0)?;
        let Some(it) = self.stack.get_mut(top) else {
            return Err("pickle: empty stack".into());
        };
        let Value::List(l) = &mut it.v else {
            return Err("pickle: APPEND(S) onto a non-list".into());
        };
        // A run of taken entries continues while the list holds nothing else.
        let consecutive = |from: i64| {
            items
                .iter()
                .enumerate()
                .all(|(j, v)| matches!(v, Value::Int(k) if Some(*k) == from.checked_add(j as i64)))
        };
        if taken && l.is_empty() && Arc::strong_count(l) == 1 && !items.is_empty() {
            match it.taken {
                None => {
                    if let Some(Value::Int(first)) = items.first() {
                        if consecutive(*first) {
                            it.taken = Some((*first, items.len() as u64));
                            return Ok(());
                        }
                    }
                }
                Some((first, n)) => {
                    let next = first.saturating_add(n as i64);
                    if consecutive(next) {
                        it.taken = Some((first, n + items.len() as u64));
                        return Ok(());
                    }
                }
            }
        }
        self.materialize(top);
        match self.stack.get_mut(top).map(|it| &mut it.v) {
            Some(Value::List(l)) => {
                Arc::make_mut(l).extend(items);
                Ok(())
            }
            _ => Err("pickle: APPEND(S) onto a non-list".into()),
        }
    }
    fn extend_dict(&mut self, items: Vec<Value>, child_depth: u32) -> Result<(), String> {
        if items.len() % 2 != 0 {
            return Err("pickle: odd SETITEMS".into());
        }
        match self.top_for_insert(child_depth, 0)? {
            Value::Dict(d) => {
                let d = Arc::make_mut(d);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    // A pickled dict never repeats a key; a crafted one may. Small dicts
                    // replace in place; in large ones (where a scan per item would be
                    // quadratic) the repeat is appended and `Value::get` finds the last.
                    let existing = if d.len() <= DEDUP_SCAN {
                        d.iter_mut().find(|(ek, _)| *ek == k)
                    } else {
                        None
                    };
                    match existing {
                        Some(e) => e.1 = v,
                        None => d.push((k, v)),
                    }
                }
                Ok(())
            }
            _ => Err("pickle: SETITEM(S) onto a non-dict".into()),
        }
    }
    fn long(bytes: &[u8]) -> Result<Value, String> {
        if bytes.is_empty() {
            return Ok(Value::Int(0));
        }
        // An unsigned 64-bit value (a C++ `size_t(-1)`, as PyTorch writes a frame's
        // unknown line) takes nine bytes, the last zero: kept as its 64 bits.
        if bytes.len() == 9 && bytes[8] == 0 {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[..8]);
            return Ok(Value::Int(u64::from_le_bytes(a) as i64));
        }
        if bytes.len() > 8 {
            return Err("pickle: integer beyond 64 bits".into());
        }
        let fill = if bytes[bytes.len() - 1] & 0x80 != 0 {
            0xff
        } else {
            0
        };
        let mut a = [fill; 8];
        a[..bytes.len()].copy_from_slice(bytes);
        Ok(Value::Int(i64::from_le_bytes(a)))
    }
    fn text(bytes: &[u8]) -> Value {
        Value::Str(Arc::from(String::from_utf8_lossy(bytes).as_ref()))
    }

    fn run(&mut self) -> Result<Value, String> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if p > 5 {
                        return Err(format!("pickle protocol {p} unsupported"));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: length only, contents follow inline
                }
                b'.' => return self.pop(),
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.push(Value::Int(i64::from(v)))
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(i64::from(v)))
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.push(Value::Int(i64::from(v)))
                }
                0x8a => {
                    let n = self.u8()? as usize;
                    let v = Self::long(self.take(n)?)?;
                    self.push(v)
                }
                0x8b => {
                    let n = i32::from_le_bytes(self.le()?);
                    let n = usize::try_from(n).map_err(|_| "pickle: negative LONG4")?;
                    let v = Self::long(self.take(n)?)?;
                    self.push(v)
                }
                b'I' => {
                    let l = self.line()?;
                    let v = match l.as_str() {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        s => Value::Int(s.parse().map_err(|_| format!("pickle INT {s}"))?),
                    };
                    self.push(v)
                }
                b'L' => {
                    let l = self.line()?;
                    let s = l.trim_end_matches('L');
                    self.push(Value::Int(
                        s.parse().map_err(|_| format!("pickle LONG {s}"))?,
                    ))
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.le()?);
                    self.push(Value::Float(v))
                }
                b'F' => {
                    let l = self.line()?;
                    self.push(Value::Float(
                        l.parse().map_err(|_| format!("pickle FLOAT {l}"))?,
                    ))
                }
                0x8c | b'C' => {
                    let n = self.u8()? as usize;
                    let v = Self::text(self.take(n)?);
                    self.push(v)
                }
                b'X' | b'B' => {
                    let n = u32::from_le_bytes(self.le()?) as usize;
                    let v = Self::text(self.take(n)?);
                    self.push(v)
                }
                0x8d | 0x8e => {
                    let n = usize::try_from(u64::from_le_bytes(self.le()?))
                        .map_err(|_| "pickle: string too long")?;
                    let v = Self::text(self.take(n)?);
                    self.push(v)
                }
                b'V' => {
                    let l = raw_unicode_escape(self.line_bytes()?);
                    self.push(Value::str(&l))
                }
                b']' => self.push(Value::list(Vec::new())),
                b'}' => self.push(Value::dict(Vec::new())),
                b')' => self.push(Value::Tuple(Arc::new(Vec::new()))),
                b'(' => self.marks.push(self.stack.len()),
                b'l' => {
                    let (items, d) = self.pop_mark_depth()?;
                    let d = self.nest(d)?;
                    self.push_at(Value::list(items), d)
                }
                b'd' => {
                    let (items, d) = self.pop_mark_depth()?;
                    self.push(Value::dict(Vec::new()));
                    self.extend_dict(items, d)?
                }
                b't' => {
                    let (items, d) = self.pop_mark_depth()?;
                    let d = self.nest(d)?;
                    self.push_at(Value::Tuple(Arc::new(items)), d)
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    let mut d = 0;
                    for _ in 0..n {
                        let (v, vd) = self.pop_item()?;
                        d = d.max(vd);
                        items.push(v);
                    }
                    items.reverse();
                    let d = self.nest(d)?;
                    self.push_at(Value::Tuple(Arc::new(items)), d)
                }
                b'a' => {
                    let (v, d) = self.pop_item()?;
                    let taken = self.last_taken;
                    self.extend_list(vec![v], d, taken)?
                }
                b'e' => {
                    let (items, d) = self.pop_mark_depth()?;
                    let taken = self.last_taken;
                    self.extend_list(items, d, taken)?
                }
                b's' => {
                    let (v, vd) = self.pop_item()?;
                    let (k, kd) = self.pop_item()?;
                    self.extend_dict(vec![k, v], vd.max(kd))?
                }
                b'u' => {
                    let (items, d) = self.pop_mark_depth()?;
                    self.extend_dict(items, d)?
                }
                0x94 => {
                    let slot = self.memo_count;
                    self.put(slot)?
                }
                b'q' => {
                    let s = self.u8()?;
                    self.put(u32::from(s))?
                }
                b'r' => {
                    let s = u32::from_le_bytes(self.le()?);
                    self.put(s)?
                }
                b'p' => {
                    let l = self.line()?;
                    self.put(l.parse().map_err(|_| format!("pickle PUT {l}"))?)?
                }
                b'h' => {
                    let s = self.u8()?;
                    self.get(u32::from(s))?
                }
                b'j' => {
                    let s = u32::from_le_bytes(self.le()?);
                    self.get(s)?
                }
                b'g' => {
                    let l = self.line()?;
                    self.get(l.parse().map_err(|_| format!("pickle GET {l}"))?)?
                }
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    self.materialize(self.stack.len().wrapping_sub(1));
                    let top = self.stack.last().ok_or("pickle: DUP on empty stack")?;
                    let (v, d) = (top.v.clone(), top.depth);
                    self.push_at(v, d)
                }
                0x96 => {
                    // BYTEARRAY8 (protocol 5): bytes, read as the other byte strings are.
                    let n = usize::try_from(u64::from_le_bytes(self.le()?))
                        .map_err(|_| "pickle: bytearray too long")?;
                    let v = Self::text(self.take(n)?);
                    self.push(v)
                }
                b'c' | 0x93 | b'R' | b'b' | 0x81 | 0x92 | b'i' | b'o' => {
                    // GLOBAL, STACK_GLOBAL, REDUCE, BUILD, NEWOBJ(_EX), INST, OBJ: a
                    // pickle of Python objects (torch.save, numpy, ...), never a snapshot.
                    return Err(crate::snapshot::sniff::not_snapshot(format!(
                        "a pickle of Python objects: opcode {op:#04x} at byte {} builds \
                         objects, not plain data as in a memory snapshot",
                        self.pos - 1
                    )));
                }
                other => {
                    return Err(format!(
                        "pickle opcode {other:#04x} at byte {} is not plain data",
                        self.pos - 1
                    ))
                }
            }
        }
    }
}

/// Protocol 0's `raw-unicode-escape`: latin-1 bytes with `\uXXXX` / `\UXXXXXXXX` escapes.
fn raw_unicode_escape(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() && (b[i + 1] == b'u' || b[i + 1] == b'U') {
            let n = if b[i + 1] == b'u' { 4 } else { 8 };
            let hex = b
                .get(i + 2..i + 2 + n)
                .and_then(|h| std::str::from_utf8(h).ok());
            if let Some(c) = hex
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32)
            {
                out.push(c);
                i += 2 + n;
                continue;
            }
        }
        out.push(char::from(b[i]));
        i += 1;
    }
    out
}

/// Decode a pickle of plain data.
pub fn read_pickle(bytes: &[u8]) -> Result<Value, String> {
    read_pickle_inner(bytes, None)
}

/// Decode a pickle of plain data, passing every completed dict through `hook` as the
/// stream is read (so a consumer can keep a compact form of millions of small dicts
/// instead of the dicts themselves).
pub fn read_pickle_with(bytes: &[u8], hook: DictHook<'_>) -> Result<Value, String> {
    read_pickle_inner(bytes, Some(hook))
}

fn read_pickle_inner(bytes: &[u8], hook: Option<DictHook<'_>>) -> Result<Value, String> {
    run(Source::Slice(bytes), bytes.len(), hook)
}

/// [`read_pickle_with`] streaming from the file at `path` (never holding it whole); returns
/// the value and the file's length.
pub fn read_pickle_file_with(
    path: &std::path::Path,
    hook: DictHook<'_>,
) -> Result<(Value, usize), String> {
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let len = usize::try_from(len).map_err(|_| "file too large".to_string())?;
    let src = Source::Stream {
        r: Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            crate::snapshot::progress::Progress::new(f, &path.display().to_string(), len as u64),
        )),
        buf: Vec::new(),
    };
    Ok((run(src, len, Some(hook))?, len))
}

/// [`read_pickle_with`] streaming from `r`, of unknown length (a decompressing reader):
/// lengths in the pickle are checked against the bytes that actually arrive, and copying
/// shared containers is budgeted as for an input of `budget_len` bytes. Returns the value
/// and the number of bytes read.
pub fn read_pickle_stream_with(
    r: Box<dyn std::io::BufRead + '_>,
    budget_len: usize,
    hook: DictHook<'_>,
) -> Result<(Value, usize), String> {
    let src = Source::Stream { r, buf: Vec::new() };
    let mut reader = reader(src, usize::MAX, budget_len, Some(hook));
    let v = reader.run()?;
    Ok((v, reader.pos))
}

fn reader<'a, 'h>(
    src: Source<'a>,
    len: usize,
    budget_len: usize,
    hook: Option<DictHook<'h>>,
) -> Reader<'a, 'h> {
    Reader {
        hook,
        src,
        len,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        memo_count: 0,
        copy_budget: budget_len / 4 + 4096,
        last_taken: false,
    }
}

fn run(src: Source<'_>, len: usize, hook: Option<DictHook<'_>>) -> Result<Value, String> {
    reader(src, len, len, hook).run()
}

/// Nodes of `v` with every shared node counted wherever it appears (what a JSON or msgpack
/// writer writes), saturating at `limit`. Shared nodes are counted once each by identity, so
/// this takes time in the tree's stored size, not its written size.
pub fn expanded_nodes(v: &Value, limit: u64) -> u64 {
    fn walk(v: &Value, seen: &mut HashMap<usize, u64>, limit: u64) -> u64 {
        let (key, items): (usize, Vec<&Value>) = match v {
            Value::List(l) | Value::Tuple(l) => (Arc::as_ptr(l) as usize, l.iter().collect()),
            Value::Dict(d) => (
                Arc::as_ptr(d) as usize,
                d.iter().flat_map(|(k, v)| [k, v]).collect(),
            ),
            Value::Events(e) => return (e.len() as u64).saturating_mul(16).min(limit),
            _ => return 1,
        };
        if let Some(&n) = seen.get(&key) {
            return n;
        }
        let mut n: u64 = 1;
        for it in items {
            n = n.saturating_add(walk(it, seen, limit)).min(limit);
        }
        seen.insert(key, n);
        n
    }
    walk(v, &mut HashMap::new(), limit)
}
