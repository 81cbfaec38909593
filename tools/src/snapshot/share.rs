//! Sharing repeated nodes of a tree read from JSON or msgpack, as pickle's memo shares
//! them: equal strings, equal frame dicts and equal frame lists become one node each while
//! the stream is read, so a JSON snapshot whose every trace entry spells out its 30-frame
//! stack is held (and written back as pickle) at the size of the pickle PyTorch would write.
//!
//! Policy: a string is always shared; a dict is shared when all its values are strings,
//! numbers, booleans, None or nodes already shared, and it is not a trace entry (no
//! `action` key: entries differ by address and time, and a table of them would double the
//! memory they take); a list or tuple is shared under the same condition on its items
//! (a frame list is its shared frames). The tables hold one entry per distinct node, so
//! they are at most the size of the shared tree itself. A container is looked up by a hash
//! of its items before it is boxed, so a repeat costs no key and no allocation.
//!
//! The tables hash with aHash (keyed at random per process, so crafted input cannot aim
//! at collisions), several times faster than std's SipHash on the millions of short keys
//! and frame names a JSON snapshot repeats.
//!
//! Invariant: sharing changes no value (the tree equals the one read without it), only
//! how many copies of it exist.

use cushim::snapshot::value::Value;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// What kind of container a node is, part of its key.
#[derive(Clone, Copy, Hash)]
enum Kind {
    Dict,
    List,
    Tuple,
}

/// Slots in the cache of recent strings in front of `strings` (a power of two).
const FRONT: usize = 4096;

/// The tables of shared nodes.
#[derive(Default)]
pub struct Share {
    /// Recent strings by a cheap hash of their length and a few of their bytes, each
    /// checked byte for byte: most strings of a snapshot (keys, file and function names)
    /// are found here without hashing them whole. Filled on first use.
    front: Vec<Option<Arc<str>>>,
    strings: HashSet<Arc<str>>,
    /// Shared containers by the hash of their kind and items (each item a scalar or a
    /// shared node by address). A node whose hash is taken by a different one (two 64-bit
    /// keyed hashes agreeing) is left unshared: still the same value, one more copy.
    nodes: HashMap<u64, Value>,
    /// Addresses of the containers in `nodes` (whose values hold them alive).
    shared: HashSet<usize>,
    /// Flat dicts (a frame: strings and scalars) by the hash of their text, each checked
    /// item by item: a repeated frame is found before any of its strings is looked up.
    flat: HashMap<u64, Value>,
    hasher: ahash::RandomState,
}

/// An item of a dict as the parser gave it: a string still in the input's text, or a value.
pub enum Raw<'a> {
    Text(&'a str),
    Val(Value),
}

/// Whether `a` (an item of a kept flat dict) equals `r`.
fn eq_raw(a: &Value, r: &Raw<'_>) -> bool {
    match (a, r) {
        (Value::Str(x), Raw::Text(y)) => **x == **y,
        (Value::Str(x), Raw::Val(Value::Str(y))) => **x == **y,
        (a, Raw::Val(b)) => same(a, b),
        _ => false,
    }
}

/// The slot of `b` in the front cache: its length and its first, middle and last eight
/// bytes, mixed (strings that differ elsewhere share a slot and take turns in it).
fn front_slot(b: &[u8]) -> usize {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        let part = &b[i..b.len().min(i + 8)];
        w[..part.len()].copy_from_slice(part);
        u64::from_le_bytes(w)
    };
    let n = b.len();
    let mut x = n as u64;
    x = (x ^ word(0)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if n > 8 {
        x = (x ^ word(n - 8)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x = (x ^ word(n / 2 - 4)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    (x >> 52) as usize & (FRONT - 1)
}

/// The address of a container's items, which names it while it lives.
fn addr(v: &Value) -> Option<usize> {
    match v {
        Value::List(l) | Value::Tuple(l) => Some(Arc::as_ptr(l) as *const u8 as usize),
        Value::Dict(d) => Some(Arc::as_ptr(d) as *const u8 as usize),
        Value::Str(s) => Some(Arc::as_ptr(s) as *const u8 as usize),
        _ => None,
    }
}

/// Whether `a` (an item of a shared node, kept alive by the tables) and `b` are the same
/// item: equal scalars, or the same node (an address held alive names one node only).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::None, Value::None) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Str(x), Value::Str(y)) => Arc::ptr_eq(x, y),
        (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => Arc::ptr_eq(x, y),
        (Value::Dict(x), Value::Dict(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

impl Share {
    /// The shared string equal to `s`.
    pub fn string(&mut self, s: &str) -> Value {
        if self.front.is_empty() {
            self.front = vec![None; FRONT];
        }
        let slot = front_slot(s.as_bytes());
        if let Some(a) = &self.front[slot] {
            if **a == *s {
                return Value::Str(a.clone());
            }
        }
        let a = match self.strings.get(s) {
            Some(a) => a.clone(),
            None => {
                let a: Arc<str> = Arc::from(s);
                self.strings.insert(a.clone());
                a
            }
        };
        self.front[slot] = Some(a.clone());
        Value::Str(a)
    }

    /// Feed one item into a node's hash; false when it is not a scalar or a shared node.
    fn item(&self, v: &Value, h: &mut impl Hasher) -> bool {
        match v {
            Value::None => 0u8.hash(h),
            Value::Bool(b) => (1u8, *b).hash(h),
            Value::Int(i) => (2u8, *i).hash(h),
            Value::Float(f) => (3u8, f.to_bits()).hash(h),
            // Strings come from `string`, so equal ones are one node.
            Value::Str(_) => (4u8, addr(v)).hash(h),
            Value::List(_) | Value::Tuple(_) | Value::Dict(_) => {
                let p = addr(v);
                if !p.is_some_and(|p| self.shared.contains(&p)) {
                    return false;
                }
                (5u8, p).hash(h)
            }
            Value::Events(_) => return false,
        }
        true
    }

    /// A dict of `items` just read, as [`Share::dict`]; a flat one (no containers, no
    /// `action` key) is first looked up by its text.
    pub fn raw_dict(&mut self, items: Vec<(Raw<'_>, Raw<'_>)>) -> Value {
        let key = self.flat_key(&items);
        if let Some(key) = key {
            if let Some(Value::Dict(d)) = self.flat.get(&key) {
                if d.len() == items.len()
                    && d.iter()
                        .zip(&items)
                        .all(|((a, b), (c, e))| eq_raw(a, c) && eq_raw(b, e))
                {
                    return Value::Dict(d.clone());
                }
            }
        }
        let items = items
            .into_iter()
            .map(|(k, v)| (self.value(k), self.value(v)))
            .collect();
        let v = self.dict(items);
        if let (Some(key), Value::Dict(_)) = (key, &v) {
            self.flat.entry(key).or_insert_with(|| v.clone());
        }
        v
    }

    /// A raw item as a value, its text shared.
    fn value(&mut self, r: Raw<'_>) -> Value {
        match r {
            Raw::Text(s) => self.string(s),
            Raw::Val(v) => v,
        }
    }

    /// The hash of a flat dict's text; `None` for a dict holding a container or a trace
    /// entry (never shared).
    fn flat_key(&self, items: &[(Raw<'_>, Raw<'_>)]) -> Option<u64> {
        let mut h = self.hasher.build_hasher();
        for (k, v) in items {
            for r in [k, v] {
                match r {
                    Raw::Text(s) => (4u8, *s).hash(&mut h),
                    Raw::Val(Value::Str(s)) => (4u8, &**s).hash(&mut h),
                    Raw::Val(Value::None) => 0u8.hash(&mut h),
                    Raw::Val(Value::Bool(b)) => (1u8, *b).hash(&mut h),
                    Raw::Val(Value::Int(i)) => (2u8, *i).hash(&mut h),
                    Raw::Val(Value::Float(f)) => (3u8, f.to_bits()).hash(&mut h),
                    Raw::Val(_) => return None,
                }
            }
            let action = match k {
                Raw::Text(s) => *s == "action",
                Raw::Val(Value::Str(s)) => &**s == "action",
                _ => false,
            };
            if action {
                return None;
            }
        }
        Some(h.finish())
    }

    /// A dict of `items` just completed: the shared one equal to it, or a new one (shared
    /// from now on if it may be).
    pub fn dict(&mut self, items: Vec<(Value, Value)>) -> Value {
        let is_entry = items
            .iter()
            .any(|(k, _)| matches!(k, Value::Str(s) if &**s == "action"));
        if is_entry {
            return Value::dict(items);
        }
        let mut h = self.hasher.build_hasher();
        Kind::Dict.hash(&mut h);
        let ok = items
            .iter()
            .all(|(k, v)| self.item(k, &mut h) && self.item(v, &mut h));
        let key = h.finish();
        if ok {
            if let Some(Value::Dict(d)) = self.nodes.get(&key) {
                if d.len() == items.len()
                    && d.iter()
                        .zip(&items)
                        .all(|((a, b), (c, e))| same(a, c) && same(b, e))
                {
                    return Value::Dict(d.clone());
                }
            }
        }
        self.keep(ok, key, Value::dict(items))
    }

    /// A list (or, `tuple`, a tuple) of `items` just completed, shared as [`Share::dict`].
    pub fn list(&mut self, items: Vec<Value>, tuple: bool) -> Value {
        let mut h = self.hasher.build_hasher();
        let kind = if tuple { Kind::Tuple } else { Kind::List };
        kind.hash(&mut h);
        let ok = items.iter().all(|v| self.item(v, &mut h));
        let key = h.finish();
        if ok {
            match (self.nodes.get(&key), tuple) {
                (Some(Value::List(l)), false) | (Some(Value::Tuple(l)), true)
                    if l.len() == items.len() && l.iter().zip(&items).all(|(a, b)| same(a, b)) =>
                {
                    return if tuple {
                        Value::Tuple(l.clone())
                    } else {
                        Value::List(l.clone())
                    };
                }
                _ => {}
            }
        }
        let v = if tuple {
            Value::Tuple(Arc::new(items))
        } else {
            Value::list(items)
        };
        self.keep(ok, key, v)
    }

    /// `v` (a dict, list or tuple just completed), or the shared node equal to it.
    pub fn node(&mut self, v: Value) -> Value {
        match v {
            Value::Dict(d) => self.dict(Arc::unwrap_or_clone(d)),
            Value::List(l) => self.list(Arc::unwrap_or_clone(l), false),
            Value::Tuple(l) => self.list(Arc::unwrap_or_clone(l), true),
            v => v,
        }
    }

    /// A new node `v` whose items are all shareable (`ok`) is shared under `key`, unless
    /// another node has that key.
    fn keep(&mut self, ok: bool, key: u64, v: Value) -> Value {
        if ok && !self.nodes.contains_key(&key) {
            if let Some(p) = addr(&v) {
                self.shared.insert(p);
                self.nodes.insert(key, v.clone());
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_frames_and_frame_lists_become_one_node_and_trace_entries_stay_apart() {
        let mut s = Share::default();
        let frame = |s: &mut Share| {
            let d = Value::dict(vec![
                (s.string("name"), s.string("f")),
                (s.string("line"), Value::Int(3)),
            ]);
            s.node(d)
        };
        let (a, b) = (frame(&mut s), frame(&mut s));
        let (Value::Dict(x), Value::Dict(y)) = (&a, &b) else {
            panic!("dicts")
        };
        assert!(Arc::ptr_eq(x, y));
        let la = s.node(Value::list(vec![a.clone(), a.clone()]));
        let lb = s.node(Value::list(vec![b.clone(), b]));
        let (Value::List(x), Value::List(y)) = (&la, &lb) else {
            panic!("lists")
        };
        assert!(Arc::ptr_eq(x, y));
        let entry = |s: &mut Share| {
            let d = Value::dict(vec![(s.string("action"), s.string("alloc"))]);
            s.node(d)
        };
        let (e1, e2) = (entry(&mut s), entry(&mut s));
        let (Value::Dict(x), Value::Dict(y)) = (&e1, &e2) else {
            panic!("dicts")
        };
        assert!(!Arc::ptr_eq(x, y));
        assert_eq!(e1, e2);
        // A list holding an unshared node is not shared.
        let l1 = s.node(Value::list(vec![e1]));
        let l2 = s.node(Value::list(vec![e2]));
        let (Value::List(x), Value::List(y)) = (&l1, &l2) else {
            panic!("lists")
        };
        assert!(!Arc::ptr_eq(x, y));
    }
}
