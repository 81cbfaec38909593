//! Memory snapshots in the formats PyTorch's viewers read: the value tree (`value`), what
//! it is built from (`model`, `build`), writers (`pickle`, `msgpack`, `json`), and safe file
//! output with path templates (`output`). The reader lives in the tools crate
//! (`cushim_tools::snapshot`).
//!
//! Invariant: the three formats carry the same content; the format of a file comes from
//! `CUSHIM_SNAPSHOT_FORMAT` if set, else from its extension, else pickle.
//!
//! A dump from the shim: under each allocator's lock copy its `Vec<SegmentInfo>` and
//! `TraceRing::copy_into` its events (nothing else happens under the lock); then, outside
//! every lock, fill a [`model::SnapshotInput`] and call
//! `dump(&input, &output::next_path(template))`, printing an `Err` as one `cushim:` line.

pub mod build;
pub mod events;
pub mod json;
pub mod model;
pub mod msgpack;
pub mod output;
pub mod pickle;
pub mod value;

use std::path::Path;
use value::Value;

/// A snapshot file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Pickle,
    Msgpack,
    Json,
}

impl Format {
    /// Parse a format name (`pickle`/`pkl`, `msgpack`/`mp`, `json`).
    pub fn parse(name: &str) -> Option<Format> {
        match name.trim().to_ascii_lowercase().as_str() {
            "pickle" | "pkl" => Some(Format::Pickle),
            "msgpack" | "mp" | "mpk" => Some(Format::Msgpack),
            "json" => Some(Format::Json),
            _ => None,
        }
    }

    /// The format named by a path's extension, if any.
    pub fn from_extension(path: &Path) -> Option<Format> {
        path.extension()
            .and_then(|e| e.to_str())
            .and_then(Format::parse)
    }

    /// `CUSHIM_SNAPSHOT_FORMAT` if set and valid, else the extension, else pickle. An
    /// invalid variable is reported in the `Err` (the caller prints it once) and ignored.
    pub fn for_path(path: &Path) -> (Format, Option<String>) {
        let by_ext = Format::from_extension(path).unwrap_or(Format::Pickle);
        match std::env::var("CUSHIM_SNAPSHOT_FORMAT") {
            Ok(s) if !s.trim().is_empty() => match Format::parse(&s) {
                Some(f) => (f, None),
                None => (
                    by_ext,
                    Some(format!(
                        "CUSHIM_SNAPSHOT_FORMAT={s}: expected pickle, msgpack or json"
                    )),
                ),
            },
            _ => (by_ext, None),
        }
    }
}

/// Encode a snapshot in `format`.
pub fn encode(v: &Value, format: Format) -> Result<Vec<u8>, String> {
    match format {
        Format::Pickle => Ok(pickle::to_bytes(v)),
        Format::Msgpack => msgpack::to_bytes(v),
        Format::Json => json::to_bytes(v),
    }
}

/// Stream a snapshot in `format` into `w` (JSON and msgpack expand shared frames, so a
/// long history with deep stacks is far larger in them than in pickle).
pub fn encode_to(v: &Value, format: Format, w: &mut dyn std::io::Write) -> Result<(), String> {
    match format {
        Format::Pickle => pickle::write_to(v, w).map_err(|e| format!("writing pickle: {e}")),
        Format::Msgpack => msgpack::write_to(v, w),
        Format::Json => json::write_to(v, w),
    }
}

/// Build the snapshot of `input` (stacks from the global table) and write it to `path`
/// (format from `CUSHIM_SNAPSHOT_FORMAT` or the extension), atomically. Returns the format
/// and a warning to print about a bad `CUSHIM_SNAPSHOT_FORMAT`.
pub fn dump(input: &model::SnapshotInput, path: &Path) -> Result<(Format, Option<String>), String> {
    let v = build::build(input, crate::trace::intern::StackTable::global());
    output::write_snapshot(&v, path)
}
