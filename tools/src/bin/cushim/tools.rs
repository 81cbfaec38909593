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

/// A variable of another process's initial environment (`None` when unreadable or unset).
pub(crate) fn environ_var(pid: i32, name: &str) -> Option<Option<String>> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    Some(
        bytes
            .split(|&b| b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .find_map(|kv| kv.strip_prefix(&prefix).map(str::to_string)),
    )
}

/// The one child of `pid` (a `cushim run` wrapper) that loaded the shim.
pub(crate) fn child_with_shim(pid: i32) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    let with: Vec<i32> = text
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/maps"))
                .is_ok_and(|m| m.contains(cushim_tools::artifacts::SHIM_LIB))
        })
        .collect();
    match with[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// `cushim dump PID [--signal S]`: only a process that loaded the shim is signalled; the
/// signal is `--signal`, else the process's own `CUSHIM_DUMP_SIGNAL`, else ours, else USR1.
pub fn dump(pid: i32, signal: Option<&str>) -> Result<i32, String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("process {pid}: cannot read /proc/{pid}/maps: {e}"))?;
    if !maps.contains(cushim_tools::artifacts::SHIM_LIB) {
        // `cushim run`'s pid is the one a user sees: its program is the child that loaded
        // the shim.
        if let Some(child) = child_with_shim(pid) {
            return dump(child, signal);
        }
        return Err(format!(
            "process {pid} has not loaded {}; not sending it a signal",
            cushim_tools::artifacts::SHIM_LIB
        ));
    }
    let theirs = environ_var(pid, "CUSHIM_DUMP_SIGNAL");
    let text = match (signal, &theirs) {
        (Some(s), _) => s.to_string(),
        (None, Some(Some(s))) => s.clone(),
        (None, _) => std::env::var("CUSHIM_DUMP_SIGNAL").unwrap_or_else(|_| "USR1".into()),
    };
    let parsed = cushim::config::signal::parse_dump_signal(&text)
        .map_err(|e| format!("--signal/CUSHIM_DUMP_SIGNAL: {e}"))?;
    let Some(sig) = parsed else {
        return Err(format!(
            "live dumps are off for process {pid} (CUSHIM_DUMP_SIGNAL={text})"
        ));
    };
    if signal.is_none() {
        if let Some(None) = environ_var(pid, "CUSHIM_SNAPSHOT") {
            return Err(format!(
                "process {pid} has no CUSHIM_SNAPSHOT, so it writes no live snapshot; not sending it a signal"
            ));
        }
    }
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(format!(
            "sending {} to {pid}: {}",
            cushim::config::signal::name(sig),
            std::io::Error::last_os_error()
        ));
    }
    Ok(0)
}
