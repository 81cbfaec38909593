//! `cushim convert` and `dump`: snapshot tools over the engine's reader/writers.

use std::path::Path;

use cushim::snapshot::{json, Format};
use cushim_tools::snapshot::reader;
use serde_json::Value;

/// Read a snapshot in any supported format as JSON data.
pub fn read_snapshot_json(path: &Path) -> Result<Value, String> {
    let v =
        reader::read_file(path).map_err(|e| format!("reading snapshot {}: {e}", path.display()))?;
    let bytes = json::to_bytes(&v)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("snapshot {} as JSON: {e}", path.display()))
}

/// Convert by the output's extension; an extension that names no format is refused rather
/// than written as pickle under a misleading name.
pub fn convert(input: &Path, output: &Path) -> Result<i32, String> {
    let format = Format::from_extension(output).ok_or_else(|| {
        format!(
            "{}: unknown extension; name the output .pickle (or .pkl), .msgpack or .json",
            output.display()
        )
    })?;
    cushim_tools::snapshot::convert::convert(input, output, Some(format)).map_err(|e| {
        format!(
            "converting {} to {}: {e}",
            input.display(),
            output.display()
        )
    })?;
    let name = format!("{format:?}").to_ascii_lowercase();
    eprintln!("cushim: wrote {} ({name})", output.display());
    Ok(0)
}

pub fn dump(pid: i32, signal: i32) -> Result<i32, String> {
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(format!(
            "sending signal {signal} to {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(0)
}
