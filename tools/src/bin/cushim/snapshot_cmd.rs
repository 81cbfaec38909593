//! `cushim snapshot LOG (--at SECONDS | --peak | --end) [--events N] -o OUT`: a snapshot of
//! one moment of a whole-run event log (`cushim_tools::snapshot::from_log`).

use std::path::Path;

use cushim::snapshot::output::write_snapshot;
use cushim_tools::snapshot::from_log::{snapshot_of, Moment};

pub fn snapshot(log: &Path, moment: Moment, events: usize, out: &Path) -> Result<i32, String> {
    let made = snapshot_of(log, moment, events).map_err(|e| format!("{}: {e}", log.display()))?;
    if let Some(p) = &made.info.problem {
        eprintln!("cushim: {}: the log ends early ({p})", log.display());
    }
    write_snapshot(&made.value, out)?;
    let origin = made.info.header["clock_origin_us"].as_i64().unwrap_or(0);
    println!(
        "{}: after event {} of {} ({:.3} s into the run)",
        out.display(),
        made.at_event,
        made.info.events,
        (made.time_us - origin) as f64 / 1e6
    );
    Ok(0)
}
