//! `cushim summary`, `replay` and `diff`: the analyses of `cushim_tools::analyze` on files.

use std::path::{Path, PathBuf};

use cushim_tools::analyze::summary::{ranks, render, render_summaries, summaries, Options};
use cushim_tools::analyze::{by_range, diff, input, replay, report};

pub fn summary(files: &[PathBuf], depth: usize, tree: bool) -> Result<i32, String> {
    let opts = Options {
        depth: depth.max(1),
        tree,
        ..Options::default()
    };
    if let [one] = files {
        print!("{}", render(&input::read(one)?, &opts));
        return Ok(0);
    }
    let mut all = Vec::new();
    for f in files {
        let snap = input::read(f)?;
        let devs = summaries(&snap, &opts);
        all.push((f.display().to_string(), snap, devs));
    }
    let table: Vec<(&str, &[_])> = all
        .iter()
        .map(|(name, _, devs)| (name.as_str(), devs.as_slice()))
        .collect();
    print!("{}", ranks(&table));
    for (name, snap, devs) in &all {
        println!("\n== {name}");
        print!("{}", render_summaries(snap, devs, &opts));
    }
    Ok(0)
}

pub fn replay(file: &Path, confs: &[String], device_memory: Option<&str>) -> Result<i32, String> {
    let opts = replay::Options {
        device_memory: device_memory
            .map(cushim_tools::analyze::device_size::parse_size)
            .transpose()?,
    };
    let snap = input::read(file)?;
    let confs = if confs.is_empty() {
        replay::default_confs()
    } else {
        confs.to_vec()
    };
    let r = replay::replay_with(&snap, &confs, &opts)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    print!("{}", replay::render(&r));
    Ok(0)
}

pub fn diff(a: &Path, b: &Path, depth: usize, top: usize, by_number: bool) -> Result<i32, String> {
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
    print!(
        "{}",
        diff::render(
            &diff::diff_paired(&sa, &sb, depth.max(1), pairing),
            top.max(1)
        )
    );
    Ok(0)
}

/// Bytes by range path for the report: read from the snapshot tree, or the log, a second
/// time (the model keeps neither paths nor times); none for inputs that are neither, and
/// none, with one line saying why, when the trace cannot be read by range.
fn report_ranges(file: &Path) -> Vec<by_range::DeviceRanges> {
    let ranges = if by_range::is_log_file(file) {
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
    let snap = input::read(file)?;
    let ranges = report_ranges(file);
    let html = report::report(&snap, &file.display().to_string(), &ranges)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    cushim::snapshot::output::write_atomic_with(out, |w| {
        w.write_all(html.as_bytes())
            .map_err(|e| format!("writing {}: {e}", out.display()))
    })?;
    eprintln!("cushim: wrote {}", out.display());
    Ok(0)
}
