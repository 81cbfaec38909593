//! `cushim summary --by category`: what kind of memory each allocated byte is, at the peak,
//! the end or any event, per device, with the loop's steps.

use std::path::PathBuf;

use cushim_tools::analyze::category::{
    categorize, categorize_all, parse_moment, render, DeviceCategories, Moment,
};
use cushim_tools::analyze::category_rules::parse_user_rules;
use cushim_tools::analyze::model::Snapshot;
use cushim_tools::analyze::{input, json, moment_time, steps};

pub fn summary(
    files: &[PathBuf],
    at: &str,
    rules: &[String],
    depth: usize,
    as_json: bool,
) -> Result<i32, String> {
    let user = parse_user_rules(rules)?;
    let seconds = moment_time::parse_seconds(at);
    let moment = match seconds {
        Some(_) => Moment::After(0),
        None => parse_moment(at)?,
    };
    let mut all = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let snap = input::read(f)?;
        let devs = match seconds {
            None => categorize_all(&snap, &user, moment),
            Some(us) => by_seconds(f, &snap, &user, us),
        }
        .map_err(|e| format!("{name}: {e}"))?;
        let st: Vec<steps::Steps> = snap
            .devices
            .iter()
            .filter(|d| !d.events.is_empty())
            .map(|d| steps::steps(&snap, d, &user, depth.max(1)))
            .collect();
        if !as_json {
            if files.len() > 1 {
                println!("== {name}");
            }
            print!("{}", render(&devs, moment));
            for s in &st {
                println!("device {} steps:", s.device);
                print!("{}", steps::render(s));
            }
        }
        all.push((name, devs, st));
    }
    if as_json {
        println!("{}", json::categories(&all, at.trim()));
    }
    Ok(0)
}

/// Each device's categories `us` microseconds after its first trace event (times read from
/// the snapshot's trace entries: the model keeps none).
fn by_seconds(
    f: &std::path::Path,
    snap: &Snapshot,
    user: &[cushim_tools::analyze::category_rules::UserRule],
    us: u64,
) -> Result<Vec<DeviceCategories>, String> {
    if by_range_log(f) {
        return Err(
            "--at SECONDS reads a snapshot's times; for a whole-run log, write that moment \
             with `cushim snapshot LOG --at SECONDS -o moment.pickle` and read it"
                .to_string(),
        );
    }
    let v = cushim_tools::snapshot::reader::read_file(f)?;
    let mut out = Vec::new();
    for d in snap.devices.iter().filter(|d| !d.is_empty()) {
        let k = if d.events.is_empty() {
            0
        } else {
            moment_time::events_within(&v, d.ordinal, us)?
        };
        out.push(categorize(snap, d, user, Moment::After(k))?);
    }
    Ok(out)
}

fn by_range_log(f: &std::path::Path) -> bool {
    cushim_tools::snapshot::sniff::is_log_file(f)
}
