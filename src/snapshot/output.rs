//! Snapshot files: output path templates and crash-safe, symlink-safe writing.
//!
//! Invariant: a snapshot file appears complete or not at all: bytes go to a new temporary
//! file in the target's directory (`files::temp_file`: a random name, created with
//! O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, another name tried on a clash),
//! are fsynced, then renamed over the target. Only a new name, a regular file or a symlink
//! to one may be replaced (`target.rs`: devices, FIFOs, directories are refused); a symlink
//! is replaced, never followed. Every error names the path and the step that failed; nothing panics.

use crate::snapshot::value::Value;
use crate::snapshot::{encode_to, Format};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Values substituted into a path template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateVars {
    pub pid: u32,
    pub rank: u64,
    pub seq: u64,
    pub unix_time: u64,
}

impl TemplateVars {
    /// This process's pid, rank and the current time, with dump number `seq`.
    pub fn current(seq: u64) -> TemplateVars {
        TemplateVars {
            pid: std::process::id(),
            rank: rank_from_env(),
            seq,
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// The process's rank: `RANK`, `OMPI_COMM_WORLD_RANK`, `SLURM_PROCID` or `PMI_RANK`
/// (first one set and numeric), else 0.
pub fn rank_from_env() -> u64 {
    ["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Expand `%p` (pid), `%r` (rank), `%n` (dump sequence number), `%t` (Unix time) and `%%`.
/// Any other `%x` is kept as written.
pub fn expand(template: &str, vars: &TemplateVars) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('p') => out.push_str(&vars.pid.to_string()),
            Some('r') => out.push_str(&vars.rank.to_string()),
            Some('n') => out.push_str(&vars.seq.to_string()),
            Some('t') => out.push_str(&vars.unix_time.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

static DUMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The path of the next dump from `template`: `%n` counts dumps of this process from 0.
pub fn next_path(template: &str) -> PathBuf {
    let seq = DUMP_SEQ.fetch_add(1, Ordering::Relaxed);
    PathBuf::from(expand(template, &TemplateVars::current(seq)))
}

/// Write `bytes` to `path` atomically (see the module invariant).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    write_atomic_with(path, |w| w.write_all(bytes).map_err(|e| e.to_string()))
}

/// Write to `path` atomically, the contents produced by `fill` into a buffered writer.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> Result<(), String>,
) -> Result<(), String> {
    crate::files::target::check_replaceable(path)
        .map_err(|e| format!("writing snapshot {}: {e}", path.display()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (mut f, tmp) = crate::files::temp_file::create_beside(path)
        .map_err(|e| format!("writing snapshot {}: {e}", path.display()))?;
    let mut buf = std::io::BufWriter::with_capacity(1 << 20, &mut f);
    let filled = fill(&mut buf).and_then(|()| buf.flush().map_err(|e| e.to_string()));
    drop(buf);
    let result = filled
        .map_err(|e| format!("writing {}: {e}", tmp.display()))
        .and_then(|()| {
            f.sync_all()
                .map_err(|e| format!("fsync {}: {e}", tmp.display()))
        })
        .and_then(|()| {
            drop(f);
            std::fs::rename(&tmp, path)
                .map_err(|e| format!("renaming {} to {}: {e}", tmp.display(), path.display()))
        });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("writing snapshot {}: {e}", path.display()));
    }
    // Make the rename durable; failure here loses nothing already visible.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Encode `v` for `path` (format from `CUSHIM_SNAPSHOT_FORMAT` or the extension) and write
/// it atomically. Returns the format used and a warning about a bad format variable.
pub fn write_snapshot(v: &Value, path: &Path) -> Result<(Format, Option<String>), String> {
    let (format, warning) = Format::for_path(path);
    write_atomic_with(path, |w| encode_to(v, format, w))?;
    Ok((format, warning))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_every_placeholder() {
        let v = TemplateVars {
            pid: 42,
            rank: 3,
            seq: 7,
            unix_time: 1_700_000_000,
        };
        assert_eq!(
            expand("snap-%p-%r-%n-%t.pickle", &v),
            "snap-42-3-7-1700000000.pickle"
        );
        assert_eq!(expand("100%%-%x-%", &v), "100%-%x-%");
        assert_eq!(expand("plain", &v), "plain");
    }
}
