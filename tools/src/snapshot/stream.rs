//! JSON and msgpack snapshots read as a stream, like pickles: the value tree is built as
//! the parser goes (no intermediate `serde_json::Value`), and each completed dict is handed
//! to the reader's [`Hook`](crate::snapshot::reader::Hook), so trace entries become compact
//! events as they are read and a million of them never exist as dicts at once.
//!
//! Invariant: the tree is the one [`crate::snapshot::reader::read_bytes`] gives for the
//! same bytes (nesting deeper than [`MAX_DEPTH`] is refused; the schema's tuple is
//! restored); a list holding only consecutive entries the hook took is handed back as the
//! hook's run (`taken_list`), as the pickle reader does.

use crate::snapshot::reader::{restore_tuples, DictHook, MAX_DEPTH};
use crate::snapshot::share::Share;
use cushim::snapshot::value::Value;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::io::Read;

struct Ctx<'h> {
    hook: Option<DictHook<'h>>,
    /// Repeated strings, frames and frame lists made one node each (`snapshot::share`).
    share: Option<Share>,
    /// Whether the value just completed was a dict the hook took.
    last_taken: bool,
}

struct Node<'a, 'h> {
    ctx: &'a mut Ctx<'h>,
    depth: u32,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Node<'_, '_> {
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

impl<'de> Visitor<'de> for Node<'_, '_> {
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
                Some(share) => share.node(Value::list(items)),
                None => Value::list(items),
            }),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let depth = self.nest()?;
        let mut items = Vec::new();
        while let Some(k) = map.next_key_seed(Node {
            ctx: &mut *self.ctx,
            depth,
        })? {
            let v = map.next_value_seed(Node {
                ctx: &mut *self.ctx,
                depth,
            })?;
            items.push((k, v));
        }
        let v = Value::dict(items);
        // Shared first (a trace entry never is): the hook then meets each distinct frame
        // list once by identity, as it does in a pickle, instead of comparing the frames
        // every entry spells out again.
        let v = match (self.ctx.hook.is_some(), self.ctx.share.as_mut()) {
            (true, Some(share)) => share.node(v),
            _ => v,
        };
        let (v, taken) = match self.ctx.hook.as_mut() {
            Some(h) => {
                let r = h.dict(v);
                let taken = matches!(r, Value::Int(_));
                (r, taken)
            }
            None => match self.ctx.share.as_mut() {
                Some(share) => (share.node(v), false),
                None => (v, false),
            },
        };
        self.ctx.last_taken = taken;
        Ok(v)
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

impl<'h> Ctx<'h> {
    fn new(hook: Option<DictHook<'h>>, share: Option<Share>) -> Self {
        Ctx {
            hook,
            share,
            last_taken: false,
        }
    }
}

fn json(r: impl Read, mut ctx: Ctx<'_>) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(r));
    let v = Node {
        ctx: &mut ctx,
        depth: 0,
    }
    .deserialize(&mut de)
    .map_err(|e| format!("JSON: {e}"))?;
    de.end().map_err(|e| format!("JSON: {e}"))?;
    Ok(restore_tuples(v))
}

fn msgpack(r: impl Read, mut ctx: Ctx<'_>) -> Result<Value, String> {
    let mut r = std::io::BufReader::new(r);
    let v = {
        let mut de = rmp_serde::Deserializer::new(&mut r);
        Node {
            ctx: &mut ctx,
            depth: 0,
        }
        .deserialize(&mut de)
        .map_err(|e| format!("msgpack: {e}"))?
    };
    let mut more = [0u8; 1];
    if r.read(&mut more).map_err(|e| format!("msgpack: {e}"))? != 0 {
        return Err("msgpack: bytes after the first value: not one msgpack snapshot".into());
    }
    Ok(restore_tuples(v))
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
    }
}
