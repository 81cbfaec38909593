//! The generic snapshot value tree: what every writer writes and the reader returns.
//!
//! Invariant: a `Value` holds only the types PyTorch's viewers accept (None, bool, int64,
//! float, str, list, tuple, dict). Containers and strings are reference-counted, so a
//! sub-tree used in many places (a frame, a stack's frame list, a key) exists once in
//! memory; writers that can (pickle) write it once and refer to it afterwards.

use crate::snapshot::events::EventList;
use serde::ser::{SerializeMap, SerializeSeq};
use std::sync::Arc;

/// One node of a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Arc<str>),
    List(Arc<Vec<Value>>),
    Tuple(Arc<Vec<Value>>),
    Dict(Arc<Vec<(Value, Value)>>),
    /// A list of trace entries kept compact (see [`EventList`]); it means the same as the
    /// list of dicts [`EventList::to_list`] returns. Only the builder makes these; use
    /// [`Value::expanded`] before inspecting a built tree with `as_seq`/`get`.
    Events(Arc<EventList>),
}

impl Value {
    /// A string value.
    pub fn str(s: &str) -> Value {
        Value::Str(Arc::from(s))
    }

    /// An integer from an unsigned quantity, saturating at `i64::MAX`.
    pub fn uint(n: u64) -> Value {
        Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }

    pub fn list(items: Vec<Value>) -> Value {
        Value::List(Arc::new(items))
    }

    pub fn dict(items: Vec<(Value, Value)>) -> Value {
        Value::Dict(Arc::new(items))
    }

    /// The value under string key `key` of a dict (the last one, should a key repeat).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(d) => d
                .iter()
                .rev()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    /// Items of a list or tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(l) | Value::Tuple(l) => Some(l),
            _ => None,
        }
    }

    /// Entries of a dict.
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// The same tree with every [`Value::Events`] turned into its plain list of dicts.
    /// Shares every sub-tree that contains none (cheap on trees the reader made).
    pub fn expanded(&self) -> Value {
        self.expand_inner().unwrap_or_else(|| self.clone())
    }

    fn expand_inner(&self) -> Option<Value> {
        match self {
            Value::Events(e) => Some(e.to_list()),
            Value::List(items) | Value::Tuple(items) => {
                let changed: Vec<Option<Value>> = items.iter().map(Value::expand_inner).collect();
                if changed.iter().all(Option::is_none) {
                    return None;
                }
                let new: Vec<Value> = changed
                    .into_iter()
                    .zip(items.iter())
                    .map(|(c, old)| c.unwrap_or_else(|| old.clone()))
                    .collect();
                Some(match self {
                    Value::Tuple(_) => Value::Tuple(Arc::new(new)),
                    _ => Value::list(new),
                })
            }
            Value::Dict(entries) => {
                let changed: Vec<Option<Value>> =
                    entries.iter().map(|(_, v)| v.expand_inner()).collect();
                if changed.iter().all(Option::is_none) {
                    return None;
                }
                Some(Value::dict(
                    changed
                        .into_iter()
                        .zip(entries.iter())
                        .map(|(c, (k, v))| (k.clone(), c.unwrap_or_else(|| v.clone())))
                        .collect(),
                ))
            }
            _ => None,
        }
    }

    /// From JSON (objects become dicts with string keys; integers beyond int64 saturate).
    pub fn from_json(j: &serde_json::Value) -> Value {
        match j {
            serde_json::Value::Null => Value::None,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Value::Int(i),
                (None, Some(u)) => Value::uint(u),
                _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::str(s),
            serde_json::Value::Array(a) => Value::list(a.iter().map(Value::from_json).collect()),
            serde_json::Value::Object(o) => Value::dict(
                o.iter()
                    .map(|(k, v)| (Value::str(k), Value::from_json(v)))
                    .collect(),
            ),
        }
    }
}

impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::None => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(t) => s.serialize_str(t),
            Value::List(items) | Value::Tuple(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items.iter() {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Value::Events(list) => {
                let mut seq = s.serialize_seq(Some(list.len()))?;
                for i in 0..list.len() {
                    seq.serialize_element(&EntryRef(list, i))?;
                }
                seq.end()
            }
            Value::Dict(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries.iter() {
                    match k {
                        Value::Str(_) => map.serialize_entry(k, v)?,
                        other => map.serialize_entry(&key_text(other), v)?,
                    }
                }
                map.end()
            }
        }
    }
}

/// Entry `i` of an event list, serialized as its dict.
struct EntryRef<'a>(&'a EventList, usize);

impl serde::Serialize for EntryRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.pair_count(self.1)))?;
        for (k, v) in self.0.pairs(self.1) {
            map.serialize_entry(k, &v)?;
        }
        map.end()
    }
}

/// A non-string dict key as text (JSON and msgpack maps here use string keys).
fn key_text(k: &Value) -> String {
    match k {
        Value::None => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Str(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}

/// Shared strings for keys and other repeated text, so each exists once per snapshot.
#[derive(Debug, Default)]
pub struct Strings(std::collections::HashMap<Box<str>, Value>);

impl Strings {
    pub fn get(&mut self, s: &str) -> Value {
        if let Some(v) = self.0.get(s) {
            return v.clone();
        }
        let v = Value::str(s);
        self.0.insert(s.into(), v.clone());
        v
    }
}
