//! `cushim convert IN OUT`: re-encode a snapshot in another format.
//!
//! Invariant: the output holds the same tree as the input (shared nodes stay shared in
//! pickle output); the output is written atomically like any snapshot.

use crate::snapshot::output::write_atomic_with;
use crate::snapshot::reader::read_file;
use crate::snapshot::{encode_to, Format};
use std::path::Path;

/// Convert `input` to `output` in `format` (`None`: from `output`'s extension, else pickle).
pub fn convert(input: &Path, output: &Path, format: Option<Format>) -> Result<Format, String> {
    let v = read_file(input)?;
    let format = format
        .or_else(|| Format::from_extension(output))
        .unwrap_or(Format::Pickle);
    write_atomic_with(output, |w| encode_to(&v, format, w))?;
    Ok(format)
}
