//! The JSON writer (serde_json): the same tree as the pickle, with shared nodes expanded.
//!
//! Invariant: output parses with any JSON parser to the snapshot's content; dict keys are
//! strings, integers are int64.

use crate::snapshot::value::Value;

/// Encode `v` as JSON.
pub fn to_bytes(v: &Value) -> Result<Vec<u8>, String> {
    serde_json::to_vec(v).map_err(|e| format!("encoding JSON: {e}"))
}

/// Stream `v` as JSON into `w`.
pub fn write_to(v: &Value, w: &mut dyn std::io::Write) -> Result<(), String> {
    serde_json::to_writer(w, v).map_err(|e| format!("encoding JSON: {e}"))
}
