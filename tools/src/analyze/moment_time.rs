//! `--at SECONDS` (`cushim summary --by category --at 12.5s`): the moment SECONDS after a
//! device's first trace entry, as a count of trace events.
//!
//! Policy: the model keeps no times (an event is 32 bytes without them), so the times are
//! read from the snapshot's own trace entries (`time_us`), counted as the model counts them
//! (entries whose action it does not know are skipped). The moment is after every entry
//! recorded at or before the first entry's time plus SECONDS. A whole-run log is not read
//! here (`cushim snapshot LOG --at SECONDS` writes that moment as a snapshot, which this
//! reads); an input whose entries carry no times is an error that says so.

use cushim::snapshot::value::Value;
use cushim::trace::event::Action;

/// Parse `12.5s` as microseconds; `None` when `s` is not seconds.
pub fn parse_seconds(s: &str) -> Option<u64> {
    let n = s.trim().strip_suffix('s')?.trim().parse::<f64>().ok()?;
    (n.is_finite() && n >= 0.0).then(|| (n * 1e6).round() as u64)
}

/// The trace entries of device trace `trace` (a list, or the reader's compact events).
fn entries(trace: &Value) -> Vec<Value> {
    match trace {
        Value::Events(list) => (0..list.len()).map(|i| list.entry(i)).collect(),
        v => v.as_seq().map(|s| s.to_vec()).unwrap_or_default(),
    }
}

/// The number of trace events of device `ordinal` recorded within `micros` of its first.
pub fn events_within(snapshot: &Value, ordinal: i64, micros: u64) -> Result<usize, String> {
    let traces = snapshot
        .get("device_traces")
        .and_then(Value::as_seq)
        .ok_or("--at SECONDS: the input has no device_traces to read times from")?;
    let trace = usize::try_from(ordinal)
        .ok()
        .and_then(|d| traces.get(d))
        .ok_or_else(|| format!("--at SECONDS: device {ordinal} has no trace"))?;
    let mut first: Option<i64> = None;
    let mut count = 0usize;
    for e in entries(trace) {
        let name = e.get("action").and_then(Value::as_str);
        let name = name.map(|a| if a == "free" { "free_completed" } else { a });
        if name.and_then(Action::from_name).is_none() {
            continue;
        }
        let Some(t) = e.get("time_us").and_then(Value::as_i64) else {
            return Err(format!(
                "--at SECONDS: device {ordinal}'s trace entry {count} has no time_us"
            ));
        };
        let t0 = *first.get_or_insert(t);
        if t.saturating_sub(t0) as u64 > micros {
            break;
        }
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_a_number_with_an_s() {
        assert_eq!(parse_seconds("1.5s"), Some(1_500_000));
        assert_eq!(parse_seconds("0s"), Some(0));
        assert_eq!(parse_seconds("12"), None);
        assert_eq!(parse_seconds("-1s"), None);
    }
}
