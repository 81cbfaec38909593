//! PyTorch's record_function annotations as range paths: the phases a PyTorch snapshot
//! names itself, used like cushim's NVTX range paths by `summary --by range`, the
//! categories' phase rules and the step detection.
//!
//! What PyTorch records: while memory history is on, a callback on every `USER_SCOPE`
//! `RecordFunction` (`torch.profiler.record_function("forward")`, the profiler's
//! `ProfilerStep#N`, an optimizer's `Optimizer.step#AdamW.step`, `Optimizer.zero_grad#...`)
//! records its start and its end in the caching allocator (`recordAnnotation`). PyTorch
//! 2.5 and later write them as the snapshot's `external_annotations`, one dict per start or
//! end: `name`, `stage` (`START` or `END`), `device` and `time_us` (the trace entries'
//! clock). PyTorch 2.4 wrote them into the device's trace itself as entries with
//! `action: "user_defined"` whose one frame is `{name: NAME, filename: "START" | "END",
//! line: 0}`. (cushim's own `external_annotations` carry a `range`, the NVTX path, and are
//! read as that path; these have none.)
//!
//! Policy: the annotations open on a device at a moment nest in the order they started;
//! the path is their names joined with `/` (`ProfilerStep#3/forward`), so an iteration's
//! number and its phase are both in it, as in an NVTX path. An end closes the latest open
//! annotation of its name and every one opened inside it (a callback that never ended);
//! an end with no open start (its start overwritten in the ring) is ignored. A trace entry
//! takes the path open at its `time_us`; a start or end in the same microsecond as the
//! entry counts as before it (the entries of one microsecond cannot be ordered against a
//! separate list). PyTorch 2.4's inline entries are exact: they are in the trace's order
//! (while a pickle is streamed the devices' traces are read one after the other, so an
//! annotation still open at the end of one device's trace would reach into the next's).
//! An entry that already has a path (`user_metadata`, an NVTX path) keeps it.

use cushim::snapshot::value::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// The annotations open at one moment, outermost first.
#[derive(Debug, Default, Clone)]
pub struct Nesting {
    open: Vec<String>,
    path: Option<Arc<str>>,
}

impl Nesting {
    /// Applies a start (`start`) or end of `name`; returns the path that started or ended
    /// (`None` for an end with no open start).
    pub fn apply(&mut self, name: &str, start: bool) -> Option<String> {
        let changed = if start {
            self.open.push(name.to_string());
            self.open.join("/")
        } else {
            let k = self.open.iter().rposition(|n| n == name)?;
            let p = self.open[..=k].join("/");
            self.open.truncate(k);
            p
        };
        self.path = (!self.open.is_empty()).then(|| Arc::from(self.open.join("/")));
        Some(changed)
    }

    /// The path open now.
    pub fn path(&self) -> Option<&Arc<str>> {
        self.path.as_ref()
    }
}

/// One device's annotations in time order.
#[derive(Debug, Default, Clone)]
pub struct Timeline {
    /// From each time on, the path open (`None`: outside every annotation).
    changes: Vec<(i64, Option<Arc<str>>)>,
    /// Each path's starts (`true`) and ends, with their times.
    pub marks: Vec<(String, bool, i64)>,
}

impl Timeline {
    /// The path open at `t`.
    pub fn path_at(&self, t: i64) -> Option<&Arc<str>> {
        let k = self.changes.partition_point(|c| c.0 <= t).checked_sub(1)?;
        self.changes[k].1.as_ref()
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// A PyTorch 2.4 inline annotation: `(name, is_start)` when `e` is a `user_defined` trace
/// entry whose frame says `START` or `END`.
pub fn inline(e: &Value) -> Option<(String, bool)> {
    if e.get("action").and_then(Value::as_str) != Some("user_defined") {
        return None;
    }
    let f = e.get("frames")?.as_seq()?.first()?;
    let start = match f.get("filename").and_then(Value::as_str)? {
        "START" => true,
        "END" => false,
        _ => return None,
    };
    Some((f.get("name").and_then(Value::as_str)?.to_string(), start))
}

/// Each device's timeline from the snapshot's `external_annotations` that are PyTorch's
/// (a `name` and a `stage`, no `range`); empty when there are none. An annotation without a
/// `device` is device 0's (PyTorch always writes one).
pub fn timelines(snapshot: &Value) -> HashMap<i64, Timeline> {
    let mut by_dev: HashMap<i64, Vec<(i64, &str, bool)>> = HashMap::new();
    let Some(list) = snapshot.get("external_annotations").and_then(Value::as_seq) else {
        return HashMap::new();
    };
    for a in list {
        if a.get("range").is_some() {
            continue;
        }
        let (Some(name), Some(stage), Some(t)) = (
            a.get("name").and_then(Value::as_str),
            a.get("stage").and_then(Value::as_str),
            a.get("time_us").and_then(Value::as_i64),
        ) else {
            continue;
        };
        let start = match stage {
            "START" => true,
            "END" => false,
            _ => continue,
        };
        let d = a.get("device").and_then(Value::as_i64).unwrap_or(0);
        by_dev.entry(d).or_default().push((t, name, start));
    }
    by_dev
        .into_iter()
        .map(|(d, mut marks)| {
            // Recorded in order per device; sorted (stably) in case devices interleave.
            marks.sort_by_key(|m| m.0);
            let mut tl = Timeline::default();
            let mut n = Nesting::default();
            for (t, name, start) in marks {
                if let Some(p) = n.apply(name, start) {
                    tl.marks.push((p, start, t));
                    tl.changes.push((t, n.path().cloned()));
                }
            }
            (d, tl)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(j: serde_json::Value) -> Value {
        Value::from_json(&j)
    }

    #[test]
    fn nested_record_functions_make_one_path_and_an_end_closes_its_own() {
        let v = tree(serde_json::json!({"external_annotations": [
            {"name": "ProfilerStep#1", "stage": "START", "device": 0, "time_us": 10},
            {"name": "forward", "stage": "START", "device": 0, "time_us": 20},
            {"name": "forward", "stage": "END", "device": 0, "time_us": 30},
            {"name": "ProfilerStep#1", "stage": "END", "device": 0, "time_us": 40},
            {"name": "other", "stage": "START", "device": 1, "time_us": 5}
        ]}));
        let t = timelines(&v);
        let d0 = &t[&0];
        assert_eq!(d0.path_at(5), None);
        assert_eq!(d0.path_at(15).map(|p| &**p), Some("ProfilerStep#1"));
        assert_eq!(d0.path_at(25).map(|p| &**p), Some("ProfilerStep#1/forward"));
        assert_eq!(d0.path_at(35).map(|p| &**p), Some("ProfilerStep#1"));
        assert_eq!(d0.path_at(45), None);
        assert_eq!(t[&1].path_at(6).map(|p| &**p), Some("other"));
        assert_eq!(d0.marks.len(), 4);
    }

    #[test]
    fn an_end_without_its_start_changes_nothing() {
        let mut n = Nesting::default();
        assert_eq!(n.apply("a", false), None);
        n.apply("a", true);
        n.apply("b", true);
        assert_eq!(n.apply("a", false).as_deref(), Some("a"));
        assert!(n.path().is_none());
    }

    #[test]
    fn cushims_own_range_annotations_are_not_read_as_pytorchs() {
        let v = tree(serde_json::json!({"external_annotations": [
            {"name": "a", "stage": "START", "range": "a", "time_us": 1}
        ]}));
        assert!(timelines(&v).is_empty());
    }
}
