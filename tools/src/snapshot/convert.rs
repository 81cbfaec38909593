//! `cushim convert IN OUT`: re-encode a snapshot in another format.
//!
//! Invariant: the output holds the same tree as the input (shared nodes stay shared in
//! pickle output; a JSON or msgpack input's repeated frames and frame lists are read as
//! shared nodes, `snapshot::share`); the output is written atomically like any snapshot. JSON and msgpack
//! write shared nodes out in full, so an input whose written-out size is beyond what any
//! real snapshot of its length reaches (a crafted "billion laughs" of memo references) is
//! refused before anything is written.

use crate::snapshot::reader::{expanded_nodes, read_file};
use cushim::snapshot::output::write_atomic_with;
use cushim::snapshot::{encode_to, Format};
use std::path::Path;

/// Convert `input` to `output` in `format` (`None`: from `output`'s extension, else pickle).
pub fn convert(input: &Path, output: &Path, format: Option<Format>) -> Result<Format, String> {
    let v = read_file(input)?;
    let format = format
        .or_else(|| Format::from_extension(output))
        .unwrap_or(Format::Pickle);
    if format != Format::Pickle {
        // A real snapshot's shared frame list (~30 frames of ~7 nodes) is referenced by a
        // memo GET of 2-5 bytes: about 100 written nodes per input byte at most.
        let len = std::fs::metadata(input).map(|m| m.len()).unwrap_or(0);
        let limit = len.saturating_mul(1024).max(1 << 20);
        if expanded_nodes(&v, limit.saturating_add(1)) > limit {
            return Err(format!(
                "{}: written out in full, its shared nodes would exceed {limit} nodes                  (1024 per input byte): refusing a crafted or corrupt file",
                input.display()
            ));
        }
    }
    write_atomic_with(output, |w| encode_to(&v, format, w))?;
    Ok(format)
}
