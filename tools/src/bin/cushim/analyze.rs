//! `cushim summary`, `replay` and `diff`: the analyses of `cushim_tools::analyze` on files.

use std::path::{Path, PathBuf};

use cushim_tools::analyze::model::Snapshot;
use cushim_tools::analyze::summary::{host_summary, ranks, render_summaries, summaries, Options};
use cushim_tools::analyze::{by_range, category, diff, input, json, oom, replay, report, steps};

pub fn summary(files: &[PathBuf], depth: usize, tree: bool, as_json: bool) -> Result<i32, String> {
    let opts = Options {
        depth: depth.max(1),
        tree,
        ..Options::default()
    };
    let mut all = Vec::new();
    for f in files {
        let snap = input::read(f)?;
        let devs = summaries(&snap, &opts);
        // The loop's steps, so the summary names the step that peaked (the JSON lists
        // them all; the text names one, so only that one is kept).
        let detail = if as_json {
            steps::Detail::ALL
        } else {
            steps::Detail {
                rows: 0,
                sites: false,
            }
        };
        let st: Vec<steps::Steps> = snap
            .devices
            .iter()
            .filter(|d| !d.events.is_empty() && d.events.len() <= steps::SUMMARY_MAX_EVENTS)
            .map(|d| steps::steps_kept(&snap, d, &[], opts.depth, detail))
            .collect();
        let ooms = oom::all(&snap).map_err(|e| format!("{}: {e}", f.display()))?;
        all.push((f.display().to_string(), snap, devs, st, ooms));
    }
    if as_json {
        // Pinned host memory as device -1, as `--by category --json` gives it.
        let rows: Vec<_> = all
            .into_iter()
            .map(|(name, snap, mut devs, st, ooms)| {
                devs.extend(host_summary(&snap, &opts).map(|h| (-1, h)));
                (name, devs, st, ooms)
            })
            .collect();
        println!("{}", json::summary(&rows));
        return Ok(0);
    }
    let step_lines = |st: &[steps::Steps]| {
        for s in st {
            if let Some(line) = steps::peak_line(s) {
                println!("device {} {line}", s.device);
            }
        }
    };
    if let [(name, snap, devs, st, ooms)] = &all[..] {
        print!("{}", render_summaries(snap, devs, &opts));
        step_lines(st);
        print!("{}", oom::render(ooms, name));
        return Ok(0);
    }
    let table: Vec<(&str, &[_])> = all
        .iter()
        .map(|(name, _, devs, _, _)| (name.as_str(), devs.as_slice()))
        .collect();
    print!("{}", ranks(&table));
    for (name, snap, devs, st, ooms) in &all {
        println!("\n== {name}");
        print!("{}", render_summaries(snap, devs, &opts));
        step_lines(st);
        print!("{}", oom::render(ooms, name));
    }
    Ok(0)
}

pub fn replay(file: &Path, confs: &[String], device_memory: Option<&str>) -> Result<i32, String> {
    print!("{}", replay::render(&replayed(file, confs, device_memory)?));
    Ok(0)
}

/// `file` replayed under `confs` (PyTorch's defaults and the usual settings when none are
/// given), for `cushim replay` and its `--json`.
pub fn replayed(
    file: &Path,
    confs: &[String],
    device_memory: Option<&str>,
) -> Result<replay::Replay, String> {
    let opts = replay::Options {
        device_memory: device_memory
            .map(cushim_tools::analyze::device_size::parse_size)
            .transpose()?,
    };
    let (snap, walks) = input::read_walked(file)?;
    let confs = if confs.is_empty() {
        replay::default_confs()
    } else {
        confs.to_vec()
    };
    replay::replay_with(&snap, &confs, &opts, walks.as_deref())
        .map_err(|e| format!("{}: {e}", file.display()))
}

pub fn diff(
    a: &Path,
    b: &Path,
    depth: usize,
    top: usize,
    by_number: bool,
    as_json: bool,
) -> Result<i32, String> {
    // The two files are independent: read them on two threads (a 1M-event pickle takes
    // about as long to read as the whole diff takes after it).
    let (ra, rb) = std::thread::scope(|s| {
        let other = s.spawn(|| input::read(b));
        let first = input::read(a);
        let second = other
            .join()
            .unwrap_or_else(|_| Err(format!("{}: reading it failed", b.display())));
        (first, second)
    });
    let (sa, sb) = (ra?, rb?);
    let pairing = if by_number {
        diff::Pairing::ByNumber
    } else {
        diff::Pairing::Auto
    };
    let diffs = diff::diff_paired(&sa, &sb, depth.max(1), pairing);
    let cats = category::diff_categories(&sa, &sb, &diffs);
    if as_json {
        println!("{}", json::diff(&diffs, &cats));
        return Ok(0);
    }
    print!("{}", diff::render(&diffs, top.max(1)));
    print!("{}", category::render_diff(&cats));
    Ok(0)
}

/// Bytes by range path for the report: read from the snapshot tree, or the log, a second
/// time (the model keeps neither paths nor times); none for inputs that are neither, and
/// none, with one line saying why, when the trace cannot be read by range.
fn report_ranges(file: &Path, snap: &Snapshot) -> Vec<by_range::DeviceRanges> {
    let ranges = if cushim_tools::snapshot::sniff::is_log_file(file) {
        // A log none of whose events was made inside a range has only "(no range)", which
        // the report does not show: not read again.
        let unranged = snap
            .devices
            .iter()
            .chain(&snap.host)
            .all(|d| d.events.log_without_ranges());
        if unranged {
            return Vec::new();
        }
        by_range::by_range_log(file)
    } else {
        let Ok(v) = cushim_tools::snapshot::reader::read_file(file) else {
            return Vec::new();
        };
        by_range::by_range(&v)
    };
    ranges.unwrap_or_else(|e| {
        eprintln!(
            "cushim: {}: no bytes by range in the report: {e}",
            file.display()
        );
        Vec::new()
    })
}

pub fn report(file: &Path, out: &Path) -> Result<i32, String> {
    let (snap, walks) = input::read_walked(file)?;
    let ranges = report_ranges(file, &snap);
    let html = report::report(
        &snap,
        &file.display().to_string(),
        &ranges,
        walks.as_deref(),
    )
    .map_err(|e| format!("{}: {e}", file.display()))?;
    cushim::snapshot::output::write_atomic_with(out, |w| {
        w.write_all(html.as_bytes())
            .map_err(|e| format!("writing {}: {e}", out.display()))
    })?;
    eprintln!("cushim: wrote {}", out.display());
    Ok(0)
}
