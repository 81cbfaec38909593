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
//! they are at most the size of the shared tree itself.
//!
//! Invariant: sharing changes no value (the tree equals the one read without it), only
//! how many copies of it exist.

use cushim::snapshot::value::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One item of a node's sharing key: a scalar, or a shared node by identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Atom {
    None,
    Bool(bool),
    Int(i64),
    Float(u64),
    /// A shared string or node, by address (kept alive by the tables).
    Node(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Dict(Vec<(Atom, Atom)>),
    List(Vec<Atom>),
    Tuple(Vec<Atom>),
}

/// The tables of shared nodes.
#[derive(Default)]
pub struct Share {
    strings: HashSet<Arc<str>>,
    nodes: HashMap<Key, Value>,
    /// Addresses of the containers in `nodes` (whose values hold them alive).
    shared: HashSet<usize>,
}

impl Share {
    /// The shared string equal to `s`.
    pub fn string(&mut self, s: &str) -> Value {
        if let Some(a) = self.strings.get(s) {
            return Value::Str(a.clone());
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(a.clone());
        Value::Str(a)
    }

    fn atom(&self, v: &Value) -> Option<Atom> {
        Some(match v {
            Value::None => Atom::None,
            Value::Bool(b) => Atom::Bool(*b),
            Value::Int(i) => Atom::Int(*i),
            Value::Float(f) => Atom::Float(f.to_bits()),
            // Strings come from `string`, so equal ones are one node.
            Value::Str(s) => Atom::Node(Arc::as_ptr(s) as *const u8 as usize),
            Value::List(l) | Value::Tuple(l) => {
                let p = Arc::as_ptr(l) as *const u8 as usize;
                self.shared.contains(&p).then_some(Atom::Node(p))?
            }
            Value::Dict(d) => {
                let p = Arc::as_ptr(d) as *const u8 as usize;
                self.shared.contains(&p).then_some(Atom::Node(p))?
            }
            Value::Events(_) => return None,
        })
    }

    fn key(&self, v: &Value) -> Option<Key> {
        match v {
            Value::Dict(d) => {
                if v.get("action").is_some() {
                    return None;
                }
                d.iter()
                    .map(|(k, x)| Some((self.atom(k)?, self.atom(x)?)))
                    .collect::<Option<Vec<_>>>()
                    .map(Key::Dict)
            }
            Value::List(l) => l
                .iter()
                .map(|x| self.atom(x))
                .collect::<Option<Vec<_>>>()
                .map(Key::List),
            Value::Tuple(l) => l
                .iter()
                .map(|x| self.atom(x))
                .collect::<Option<Vec<_>>>()
                .map(Key::Tuple),
            _ => None,
        }
    }

    /// `v` (a dict, list or tuple just completed), or the shared node equal to it.
    pub fn node(&mut self, v: Value) -> Value {
        let Some(key) = self.key(&v) else { return v };
        if let Some(s) = self.nodes.get(&key) {
            return s.clone();
        }
        let p = match &v {
            Value::List(l) | Value::Tuple(l) => Arc::as_ptr(l) as *const u8 as usize,
            Value::Dict(d) => Arc::as_ptr(d) as *const u8 as usize,
            _ => return v,
        };
        self.shared.insert(p);
        self.nodes.insert(key, v.clone());
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
