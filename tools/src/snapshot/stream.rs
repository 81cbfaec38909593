//! JSON and msgpack snapshots read as a stream, like pickles: the value tree is built as
//! the parser goes (no intermediate `serde_json::Value`), and each completed dict is handed
//! to the reader's [`Hook`](crate::snapshot::reader::Hook), so trace entries become compact
//! events as they are read and a million of them never exist as dicts at once.
//!
//! Invariant: the tree is the one [`crate::snapshot::reader::read_bytes`] gives for the
//! same bytes (nesting deeper than [`MAX_DEPTH`] is refused; the schema's tuple is
//! restored); a list holding only consecutive entries the hook took is handed back as the
//! hook's run (`taken_list`), as the pickle reader does.
//!
//! Speed: a file is parsed as one slice (`snapshot::mapped`), so serde_json scans strings
//! in place and hands them over borrowed, and their address tells how far the parse has
//! got (for the progress line and for giving back the pages behind it); a stream
//! (decompressed on the fly) goes through serde_json's reader, a byte at a time.

use crate::snapshot::reader::{restore_tuples, DictHook, MAX_DEPTH};
use crate::snapshot::share::{Raw, Share};
use cushim::snapshot::value::Value;
use cushim::snapshot::Format;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::io::Read;

/// Told the offset the parse has reached, about every [`TELL_STEP`] bytes.
pub type Reached<'w> = &'w mut dyn FnMut(usize);

/// How often (in bytes of input) the parse point is told.
const TELL_STEP: usize = 1 << 20;

struct Ctx<'h, 'w> {
    hook: Option<DictHook<'h>>,
    /// Repeated strings, frames and frame lists made one node each (`snapshot::share`).
    share: Option<Share>,
    /// Whether the value just completed was a dict the hook took.
    last_taken: bool,
    watch: Option<Watch<'w>>,
}

/// The input slice's address range, to tell from a borrowed string where the parse is.
struct Watch<'w> {
    base: usize,
    end: usize,
    next: usize,
    reached: Reached<'w>,
}

impl Watch<'_> {
    fn at(&mut self, addr: usize) {
        if addr >= self.next && addr < self.end {
            (self.reached)(addr - self.base);
            self.next = addr.saturating_add(TELL_STEP);
        }
    }
}

struct Node<'a, 'h, 'w> {
    ctx: &'a mut Ctx<'h, 'w>,
    depth: u32,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_, '_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Node<'_, '_, '_> {
    fn leaf(self, v: Value) -> Value {
        self.ctx.last_taken = false;
        v
    }
    fn string(self, s: &str) -> Value {
        let v = match self.ctx.share.as_mut() {
            Some(share) => share.string(s),
            None => Value::str(s),
        };
        self.leaf(v)
    }
    fn nest<E: de::Error>(&self) -> Result<u32, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format!("nests deeper than {MAX_DEPTH} levels")));
        }
        Ok(self.depth + 1)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("plain data")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(self.leaf(Value::None))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(self.leaf(Value::None))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(self.leaf(Value::Bool(b)))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(self.leaf(Value::Int(i)))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(self.leaf(Value::uint(u)))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        Ok(self.leaf(Value::Float(f)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(self.string(s))
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Value, E> {
        if let Some(w) = self.ctx.watch.as_mut() {
            w.at(s.as_ptr() as usize);
        }
        Ok(self.string(s))
    }
    fn visit_bytes<E>(self, b: &[u8]) -> Result<Value, E> {
        Ok(self.string(&String::from_utf8_lossy(b)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let depth = self.nest()?;
        let mut items: Vec<Value> = Vec::new();
        // A run of consecutive taken entries not yet written into `items`.
        let mut run: Option<(i64, u64)> = None;
        while let Some(v) = seq.next_element_seed(Node {
            ctx: &mut *self.ctx,
            depth,
        })? {
            let taken = self.ctx.last_taken;
            match (v, run) {
                (Value::Int(k), None) if taken && items.is_empty() => run = Some((k, 1)),
                (Value::Int(k), Some((first, n)))
                    if taken && k == first.saturating_add(n as i64) =>
                {
                    run = Some((first, n + 1))
                }
                (v, r) => {
                    if let Some((first, n)) = r {
                        items.extend((0..n as i64).map(|i| Value::Int(first + i)));
                    }
                    run = None;
                    items.push(v);
                }
            }
        }
        self.ctx.last_taken = false;
        match (run, self.ctx.hook.as_mut()) {
            (Some((first, n)), Some(h)) => Ok(h.taken_list(first, n)),
            (Some((first, n)), None) => Ok(Value::list(
                (0..n as i64).map(|i| Value::Int(first + i)).collect(),
            )),
            (None, _) => Ok(match self.ctx.share.as_mut() {
                Some(share) => share.list(items, false),
                None => Value::list(items),
            }),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let depth = self.nest()?;
        let mut items = Vec::new();
        while let Some(k) = map.next_key_seed(Item(Node {
            ctx: &mut *self.ctx,
            depth,
        }))? {
            let v = map.next_value_seed(Item(Node {
                ctx: &mut *self.ctx,
                depth,
            }))?;
            items.push((k, v));
        }
        // Shared first (a trace entry never is): the hook then meets each distinct frame
        // list once by identity, as it does in a pickle, instead of comparing the frames
        // every entry spells out again.
        let v = match self.ctx.share.as_mut() {
            Some(share) => share.raw_dict(items),
            None => Value::dict(
                items
                    .into_iter()
                    .map(|(k, v)| (unshared(k), unshared(v)))
                    .collect(),
            ),
        };
        let (v, taken) = match self.ctx.hook.as_mut() {
            Some(h) => {
                let r = h.dict(v);
                let taken = matches!(r, Value::Int(_));
                (r, taken)
            }
            None => (v, false),
        };
        self.ctx.last_taken = taken;
        Ok(v)
    }
}

fn unshared(r: Raw<'_>) -> Value {
    match r {
        Raw::Text(s) => Value::str(s),
        Raw::Val(v) => v,
    }
}

/// A dict's key or value: a borrowed string is kept as the input's text (so a repeated
/// frame is found by its text, `Share::raw_dict`); anything else is read as a [`Node`].
struct Item<'a, 'h, 'w>(Node<'a, 'h, 'w>);

impl<'de> DeserializeSeed<'de> for Item<'_, '_, '_> {
    type Value = Raw<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Raw<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Item<'_, '_, '_> {
    type Value = Raw<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.expecting(f)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Raw<'de>, E> {
        self.0.visit_unit().map(Raw::Val)
    }
    fn visit_none<E: de::Error>(self) -> Result<Raw<'de>, E> {
        self.0.visit_none().map(Raw::Val)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw<'de>, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Raw<'de>, E> {
        self.0.visit_bool(b).map(Raw::Val)
    }
    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Raw<'de>, E> {
        self.0.visit_i64(i).map(Raw::Val)
    }
    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Raw<'de>, E> {
        self.0.visit_u64(u).map(Raw::Val)
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Raw<'de>, E> {
        self.0.visit_f64(f).map(Raw::Val)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Raw<'de>, E> {
        self.0.visit_str(s).map(Raw::Val)
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Raw<'de>, E> {
        self.0.ctx.last_taken = false;
        if let Some(w) = self.0.ctx.watch.as_mut() {
            w.at(s.as_ptr() as usize);
        }
        Ok(Raw::Text(s))
    }
    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Raw<'de>, E> {
        self.0.visit_bytes(b).map(Raw::Val)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Raw<'de>, A::Error> {
        self.0.visit_seq(seq).map(Raw::Val)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Raw<'de>, A::Error> {
        self.0.visit_map(map).map(Raw::Val)
    }
}

/// Read one JSON value from `r`, dicts handed to `hook` as they complete.
pub fn read_json(r: impl Read, hook: Option<DictHook<'_>>) -> Result<Value, String> {
    // With a hook, repeated strings, frames and frame lists are shared as they are read
    // (`snapshot::share`): a JSON snapshot spells out every entry's stack, which the
    // hook would otherwise compare frame by frame (JSON read at 7x a pickle's time).
    let share = hook.is_some().then(Share::default);
    json(r, Ctx::new(hook, share))
}

/// Read one JSON value from `r` whole, repeated strings, frames and frame lists shared
/// (`snapshot::share`): the tree `convert` writes back out.
pub fn read_json_shared(r: impl Read) -> Result<Value, String> {
    json(r, Ctx::new(None, Some(Share::default())))
}

/// Read one msgpack value from `r`, which it must fill, dicts handed to `hook`.
pub fn read_msgpack(r: impl Read, hook: Option<DictHook<'_>>) -> Result<Value, String> {
    let share = hook.is_some().then(Share::default);
    msgpack(r, Ctx::new(hook, share))
}

/// [`read_json_shared`] for msgpack.
pub fn read_msgpack_shared(r: impl Read) -> Result<Value, String> {
    msgpack(r, Ctx::new(None, Some(Share::default())))
}

/// Read the JSON or msgpack value that fills `bytes` (a whole file, mapped or in memory):
/// the same tree and errors as the readers above, several times faster. Dicts go to `hook`
/// as they complete; repeated nodes are shared when there is a hook or `shared` asks;
/// `reached` is told the offset the parse has got to, now and then.
pub fn read_slice(
    format: Format,
    bytes: &[u8],
    hook: Option<DictHook<'_>>,
    shared: bool,
    reached: Option<Reached<'_>>,
) -> Result<Value, String> {
    let share = (shared || hook.is_some()).then(Share::default);
    let mut ctx = Ctx::new(hook, share);
    if format != Format::Msgpack {
        let base = bytes.as_ptr() as usize;
        ctx.watch = reached.map(|reached| Watch {
            base,
            end: base + bytes.len(),
            next: base,
            reached,
        });
        let mut de = serde_json::Deserializer::from_slice(bytes);
        return finish_json(&mut de, ctx);
    }
    let mut src = Told {
        rest: bytes,
        len: bytes.len(),
        next: 0,
        reached,
    };
    let v = msgpack_value(&mut src, ctx)?;
    if !src.rest.is_empty() {
        return Err(after_msgpack());
    }
    Ok(v)
}

/// A slice read as a stream, telling how far it has been read.
struct Told<'a, 'w> {
    rest: &'a [u8],
    len: usize,
    next: usize,
    reached: Option<Reached<'w>>,
}

impl Read for Told<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.rest.read(buf)?;
        let pos = self.len - self.rest.len();
        if pos >= self.next {
            if let Some(f) = self.reached.as_mut() {
                f(pos);
            }
            self.next = pos.saturating_add(TELL_STEP);
        }
        Ok(n)
    }
}

impl<'h> Ctx<'h, '_> {
    fn new(hook: Option<DictHook<'h>>, share: Option<Share>) -> Self {
        Ctx {
            hook,
            share,
            last_taken: false,
            watch: None,
        }
    }
}

fn json(r: impl Read, ctx: Ctx<'_, '_>) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(r));
    finish_json(&mut de, ctx)
}

fn finish_json<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
    mut ctx: Ctx<'_, '_>,
) -> Result<Value, String> {
    let v = Node {
        ctx: &mut ctx,
        depth: 0,
    }
    .deserialize(&mut *de)
    .map_err(|e| format!("JSON: {e}"))?;
    de.end().map_err(|e| format!("JSON: {e}"))?;
    Ok(restore_tuples(v))
}

fn msgpack_value(r: &mut impl Read, mut ctx: Ctx<'_, '_>) -> Result<Value, String> {
    let v = {
        let mut de = rmp_serde::Deserializer::new(r);
        Node {
            ctx: &mut ctx,
            depth: 0,
        }
        .deserialize(&mut de)
        .map_err(|e| format!("msgpack: {e}"))?
    };
    Ok(restore_tuples(v))
}

fn after_msgpack() -> String {
    "msgpack: bytes after the first value: not one msgpack snapshot".into()
}

fn msgpack(r: impl Read, ctx: Ctx<'_, '_>) -> Result<Value, String> {
    let mut r = std::io::BufReader::new(r);
    let v = msgpack_value(&mut r, ctx)?;
    let mut more = [0u8; 1];
    if r.read(&mut more).map_err(|e| format!("msgpack: {e}"))? != 0 {
        return Err(after_msgpack());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::reader::read_bytes;

    #[test]
    fn streamed_trees_equal_the_whole_read_ones() {
        // Keys in sorted order: the whole read goes through serde_json's sorted map.
        let j = br#"{"device_traces": [[{"action": "alloc", "addr": 1, "size": 2}]],
                     "segments": [{"blocks": [], "segment_pool_id": [0, 1]}],
                     "x": [1, 2.5, null, true, "s"]}"#;
        assert_eq!(read_json(&j[..], None).unwrap(), read_bytes(j).unwrap());
        let v = read_bytes(j).unwrap();
        let m = rmp_serde::to_vec(&v).unwrap();
        assert_eq!(read_msgpack(&m[..], None).unwrap(), v);
        let mut extra = m.clone();
        extra.push(0);
        assert!(read_msgpack(&extra[..], None).is_err());
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(read_json(deep.as_bytes(), None).is_err());
        assert_eq!(read_json_shared(&j[..]).unwrap(), read_bytes(j).unwrap());
        assert_eq!(read_msgpack_shared(&m[..]).unwrap(), v);
        assert_eq!(
            read_slice(Format::Json, j, None, false, None).unwrap(),
            read_bytes(j).unwrap()
        );
        assert_eq!(
            read_slice(Format::Msgpack, &m, None, true, None).unwrap(),
            v
        );
        assert!(read_slice(Format::Msgpack, &extra, None, false, None).is_err());
        assert!(read_slice(Format::Json, deep.as_bytes(), None, false, None).is_err());
    }

    #[test]
    fn a_sliced_parse_tells_how_far_it_has_got() {
        let pad = "x".repeat(3 * TELL_STEP);
        let j = format!(r#"{{"a": "{pad}", "b": "y"}}"#);
        let mut seen = Vec::new();
        let v = read_slice(
            Format::Json,
            j.as_bytes(),
            None,
            false,
            Some(&mut |p| seen.push(p)),
        )
        .unwrap();
        assert_eq!(v.get("b"), Some(&Value::str("y")));
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert!(seen.last().is_some_and(|&p| p > 3 * TELL_STEP), "{seen:?}");
    }
}
