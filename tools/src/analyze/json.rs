//! `--json`: the machine-readable output of `summary`, `summary --by range|category` and
//! `diff`, one JSON object per command run (`docs/JSON.md`, schemas in `docs/json/`).
//!
//! Policy: every object carries `"schema_version"` ([`SCHEMA_VERSION`]) and `"command"`; a
//! change that removes or renames a field, or changes its meaning, bumps the version; new
//! fields may be added within a version. Bytes are integers (`*_bytes`), never rounded
//! MiB: the figures are the ones the text prints before it rounds them. Event moments are
//! "after N events", as in the text.

use serde_json::{json, Value};

use crate::analyze::by_range::DeviceRanges;
use crate::analyze::category::DeviceCategories;
use crate::analyze::diff::DeviceDiff;
use crate::analyze::oom::{self, Oom};
use crate::analyze::steps::Steps;
use crate::analyze::summary::DeviceSummary;

/// The version of every `--json` schema.
pub const SCHEMA_VERSION: u64 = 1;

fn head(command: &str) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("schema_version".into(), json!(SCHEMA_VERSION));
    m.insert("command".into(), json!(command));
    m
}

/// A step list as JSON.
pub fn steps(s: &Steps) -> Value {
    let list: Vec<Value> = s
        .steps
        .iter()
        .map(|st| {
            json!({
                "step": st.number,
                "from_event": st.from,
                "to_event": st.to,
                "peak_allocated_bytes": st.peak,
                "peak_after_event": st.peak_after,
                "growth_bytes": st.growth,
                "categories": st.categories.iter()
                    .map(|(c, b)| json!({"category": c, "bytes": b})).collect::<Vec<_>>(),
                "sites": st.sites.iter()
                    .map(|(c, b)| json!({"site": c, "bytes": b})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "source": if s.steps.is_empty() { Value::Null } else { json!(s.source) },
        "peak_step": s.peak_step().map(|k| k + 1),
        "steps": list,
    })
}

/// One file's summary: its name, its devices' summaries, its devices' steps.
pub type SummaryInput = (String, Vec<(i64, DeviceSummary)>, Vec<Steps>, Vec<Oom>);

/// `cushim summary --json`: per file, per device.
pub fn summary(files: &[SummaryInput]) -> Value {
    let mut devices = Vec::new();
    for (file, devs, steps_of, ooms) in files {
        for (ord, s) in devs {
            let st = steps_of.iter().find(|x| x.device == *ord);
            let sites = |v: &[(String, u64, u64)]| -> Vec<Value> {
                v.iter()
                    .map(|(site, bytes, blocks)| {
                        json!({"site": site, "bytes": bytes, "blocks": blocks})
                    })
                    .collect()
            };
            let mut d = json!({
                "file": file,
                "device": ord,
                "peak_allocated_bytes": s.peak_allocated,
                "peak_reserved_bytes": if s.reserved_known { json!(s.peak_reserved) } else { Value::Null },
                "peak_source": s.peak_source.describe(),
                "allocated_bytes": s.allocated,
                "reserved_bytes": if s.reserved_known { json!(s.reserved) } else { Value::Null },
                "pending_free_bytes": s.pending,
                "segments": if s.segments_known { json!(s.segments) } else { Value::Null },
                "largest_free_block_bytes": if s.segments_known { json!(s.largest_free_block) } else { Value::Null },
                "trace_peak_after_event": s.peak_at,
                "sites_at_peak": sites(&s.peak_sites),
                "sites_at_end": sites(&s.sites),
                "inconsistent_events": s.inconsistent,
                "out_of_memory": ooms.iter().filter(|o| o.device == *ord)
                    .map(oom::to_json).collect::<Vec<_>>(),
            });
            if let (Some(st), Some(m)) = (st, d.as_object_mut()) {
                if let Value::Object(o) = steps(st) {
                    m.insert("steps_source".into(), o["source"].clone());
                    m.insert("peak_step".into(), o["peak_step"].clone());
                    m.insert("steps".into(), o["steps"].clone());
                }
            }
            devices.push(d);
        }
    }
    let mut m = head("summary");
    m.insert("devices".into(), Value::Array(devices));
    Value::Object(m)
}

/// `cushim summary --by category --json`.
pub fn categories(files: &[(String, Vec<DeviceCategories>, Vec<Steps>)], moment: &str) -> Value {
    let mut devices = Vec::new();
    for (file, devs, steps_of) in files {
        for d in devs {
            let mut v = json!({
                "file": file,
                "device": d.device,
                "after_event": d.after,
                "events": d.events,
                "allocated_bytes": d.allocated,
                "before_recording_bytes": d.before_start,
                "categories": d.rows.iter().filter(|r| r.1 > 0)
                    .map(|(c, b)| json!({"category": c, "bytes": b})).collect::<Vec<_>>(),
                "note": d.note,
                "phases": d.phases.iter().map(|(p, first, len)| json!({
                    "phase": p.name(), "from_event": first, "to_event": first + len,
                })).collect::<Vec<_>>(),
            });
            if let (Some(st), Some(m)) = (
                steps_of.iter().find(|s| s.device == d.device),
                v.as_object_mut(),
            ) {
                if let Value::Object(o) = steps(st) {
                    m.insert("steps_source".into(), o["source"].clone());
                    m.insert("peak_step".into(), o["peak_step"].clone());
                    m.insert("steps".into(), o["steps"].clone());
                }
            }
            devices.push(v);
        }
    }
    let mut m = head("summary --by category");
    m.insert("moment".into(), json!(moment));
    m.insert("devices".into(), Value::Array(devices));
    Value::Object(m)
}

/// `cushim summary --by range --json`.
pub fn ranges(files: &[(String, Vec<DeviceRanges>)]) -> Value {
    let mut devices = Vec::new();
    for (file, devs) in files {
        for d in devs {
            devices.push(json!({
                "file": file,
                "device": d.device,
                "peak_live_bytes": d.peak,
                "judged_outlived": d.has_instances,
                "ranges": d.paths.iter().map(|(p, r)| json!({
                    "range": p,
                    "allocations": r.allocs,
                    "allocated_bytes": r.allocated,
                    "peak_bytes": r.peak,
                    "at_device_peak_bytes": r.at_peak,
                    "live_at_end_bytes": r.live_at_end,
                    "outlived": r.outlived,
                    "outlived_bytes": r.outlived_bytes,
                    "outlived_live_at_end": r.outlived_live_at_end,
                })).collect::<Vec<_>>(),
            }));
        }
    }
    let mut m = head("summary --by range");
    m.insert("devices".into(), Value::Array(devices));
    Value::Object(m)
}

/// `cushim diff --json`, with each side's categories at its peak per device (`(device of
/// A, rows of A, rows of B)`).
pub fn diff(diffs: &[DeviceDiff], categories: &[crate::analyze::category::DiffRows]) -> Value {
    let changes = |v: &[crate::analyze::diff::Change]| -> Vec<Value> {
        v.iter()
            .map(|c| {
                json!({"site": c.site, "a_bytes": c.a, "b_bytes": c.b,
                       "delta_bytes": c.delta() as i64, "verdict": c.verdict()})
            })
            .collect()
    };
    let devices: Vec<Value> = diffs
        .iter()
        .map(|d| {
            let cats = categories
                .iter()
                .find(|c| c.0 == d.ordinal)
                .map(|(_, a, b)| {
                    let mut names: Vec<&String> = a.iter().chain(b.iter()).map(|r| &r.0).collect();
                    names.dedup();
                    let get = |v: &[(String, u64)], n: &str| {
                        v.iter().find(|r| r.0 == n).map_or(0, |r| r.1)
                    };
                    let mut seen = std::collections::HashSet::new();
                    names
                        .into_iter()
                        .filter(|n| seen.insert(n.as_str()))
                        .map(|n| {
                            let (x, y) = (get(a, n), get(b, n));
                            json!({"category": n, "a_bytes": x, "b_bytes": y,
                                   "delta_bytes": y as i64 - x as i64})
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            json!({
                "device": d.ordinal,
                "b_device": d.b_ordinal.unwrap_or(d.ordinal),
                "a_peak_allocated_bytes": d.a.allocated,
                "b_peak_allocated_bytes": d.b.allocated,
                "a_peak_reserved_bytes": d.a.reserved,
                "b_peak_reserved_bytes": d.b.reserved,
                "categories_at_peak": cats,
                "sites_at_peak": changes(&d.at_peak),
                "sites_at_end": changes(&d.at_end),
            })
        })
        .collect();
    let mut m = head("diff");
    m.insert("devices".into(), Value::Array(devices));
    Value::Object(m)
}
