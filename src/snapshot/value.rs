//! The generic snapshot value tree: what every writer writes and the reader returns.
//!
//! Invariant: a `Value` holds only the types PyTorch's viewers accept (None, bool, int64,
//! float, str, list, tuple, dict). Containers and strings are reference-counted, so a
//! sub-tree used in many places (a frame, a stack's frame list, a key) exists once in
//! memory; writers that can (pickle) write it once and refer to it afterwards.

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

    /// The value under string key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(d) => d
                .iter()
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
