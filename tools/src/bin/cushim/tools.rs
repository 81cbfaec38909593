//! `cushim convert` and `dump`: snapshot tools over the engine's reader/writers.

use std::path::Path;

use cushim::snapshot::json;
use cushim_tools::snapshot::reader;
use serde_json::Value;

/// Read a snapshot in any supported format as JSON data.
pub fn read_snapshot_json(path: &Path) -> Result<Value, String> {
    let v =
        reader::read_file(path).map_err(|e| format!("reading snapshot {}: {e}", path.display()))?;
    let bytes = json::to_bytes(&v)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("snapshot {} as JSON: {e}", path.display()))
}

pub fn convert(input: &Path, output: &Path) -> Result<i32, String> {
    cushim_tools::snapshot::convert::convert(input, output, None).map_err(|e| {
        format!(
            "converting {} to {}: {e}",
            input.display(),
            output.display()
        )
    })?;
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
