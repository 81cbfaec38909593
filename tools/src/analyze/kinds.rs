//! `cushim summary`'s lines on what the memory is: segments grouped by kind (observed
//! allocations carry `kind`: `managed`, `vmm`, `pool`, ...; segments without one are the
//! cache's, `cached`), and, per device, the driver's used memory against what the
//! snapshot's records explain (`cushim.memory`), with the unexplained rest.
//!
//! Invariant: only the snapshot is read; a snapshot without these keys (PyTorch's own, or
//! an older cushim's) prints nothing here.

use crate::analyze::summary::mib;
use cushim::snapshot::value::Value;
use std::fmt::Write;

fn u(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_i64).map_or(0, |i| i.max(0) as u64)
}

/// `(kind, bytes, segments)` of `segments`, largest first; empty when no segment has a
/// `kind` (nothing observed: the kind lines would only repeat `reserved`).
pub fn by_kind(segments: &[&Value]) -> Vec<(String, u64, u64)> {
    if !segments.iter().any(|s| s.get("kind").is_some()) {
        return Vec::new();
    }
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for s in segments {
        let kind = s.get("kind").and_then(Value::as_str).unwrap_or("cached");
        let size = u(s.get("total_size"));
        match out.iter_mut().find(|k| k.0 == kind) {
            Some(k) => {
                k.1 += size;
                k.2 += 1;
            }
            None => out.push((kind.to_string(), size, 1)),
        }
    }
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// The kind lines and, for a device (`device >= 0`), the unexplained-memory lines.
pub fn write_extra(out: &mut String, v: &Value, segments: &[&Value], device: i64) {
    let kinds = by_kind(segments);
    if !kinds.is_empty() {
        let _ = writeln!(out, "  by kind:");
        for (k, bytes, n) in &kinds {
            let _ = writeln!(out, "    {:>12}  {n:>7} segments  {k}", mib(*bytes));
        }
    }
    if device < 0 {
        return;
    }
    let mem = v
        .get("cushim")
        .and_then(|c| c.get("memory"))
        .and_then(Value::as_seq)
        .and_then(|m| {
            m.iter()
                .find(|e| e.get("device").and_then(Value::as_i64) == Some(device))
        });
    let Some(m) = mem else {
        return;
    };
    let explained = u(m.get("explained"));
    match m.get("driver_used").and_then(Value::as_i64) {
        Some(used) => {
            let unexplained = m.get("unexplained").and_then(Value::as_i64).unwrap_or(0);
            let _ = writeln!(
                out,
                "  driver used: {} = explained {} + unexplained {}{} ({unexplained} bytes)",
                mib(used.max(0) as u64),
                mib(explained),
                if unexplained < 0 { "-" } else { "" },
                mib(unexplained.unsigned_abs()),
            );
        }
        None => {
            let _ = writeln!(
                out,
                "  explained: {} (driver not asked: no active context)",
                mib(explained)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(kind: Option<&str>, size: u64) -> Value {
        let s = &mut cushim::snapshot::value::Strings::default();
        let mut e = vec![(s.get("total_size"), Value::uint(size))];
        if let Some(k) = kind {
            e.push((s.get("kind"), s.get(k)));
        }
        Value::dict(e)
    }

    #[test]
    fn kinds_group_observed_segments_and_call_the_rest_cached() {
        let a = seg(Some("managed"), 100);
        let b = seg(None, 1000);
        let c = seg(Some("managed"), 50);
        let k = by_kind(&[&a, &b, &c]);
        assert_eq!(
            k,
            vec![
                ("cached".to_string(), 1000, 1),
                ("managed".to_string(), 150, 2)
            ]
        );
        assert!(by_kind(&[&b]).is_empty());
    }
}
