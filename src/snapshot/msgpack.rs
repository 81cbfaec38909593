//! The msgpack writer (rmp-serde): the same tree as the pickle, with shared nodes expanded.
//!
//! Invariant: dicts are msgpack maps with string keys, lists and tuples are arrays.

use crate::snapshot::value::Value;

/// Encode `v` as msgpack.
pub fn to_bytes(v: &Value) -> Result<Vec<u8>, String> {
    rmp_serde::to_vec(v).map_err(|e| format!("encoding msgpack: {e}"))
}

/// Stream `v` as msgpack into `w`.
pub fn write_to(v: &Value, w: &mut dyn std::io::Write) -> Result<(), String> {
    let mut w = w;
    rmp_serde::encode::write(&mut w, v).map_err(|e| format!("encoding msgpack: {e}"))
}
