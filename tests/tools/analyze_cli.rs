//! `cushim summary`, `replay`, `diff` and `convert` as a user runs them: the answers they
//! give on real recordings (the shim over simcuda, PyTorch-shaped pickles, logs), and one
//! clear error line naming the file for hostile input.
use crate::common;
use crate::common::analyze_support as support;

use common::cli::{cushim, ok, write};

use cushim::snapshot::Format;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// A snapshot of `tests/c/<prog>.c` run under the shim on simcuda with `args`.
fn record(dir: &Path, prog: &str, args: &[&str], expandable: bool, name: &str) -> PathBuf {
    let exe = common::compile(prog, &["-O1", "-g", "-fno-omit-frame-pointer"]);
    let snap = dir.join(name);
    let mut c = Command::new(common::cushim_bin());
    c.args(["run", "--sim", "--snapshot"]).arg(&snap);
    if expandable {
        c.arg("--expandable");
    }
    c.arg("--").arg(&exe).args(args);
    common::run_ok(&mut c);
    assert!(snap.exists(), "{} was not written", snap.display());
    snap
}

/// The figures of the row labelled `label` (prefix) in replay output, in MiB and counts.
fn row(out: &str, label: &str) -> Vec<String> {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no row {label:?} in\n{out}"));
    line[label.len()..]
        .split_whitespace()
        .filter(|w| *w != "MiB")
        .map(String::from)
        .collect()
}

fn last_cols(r: &[String], n: usize) -> Vec<String> {
    r[r.len() - n..].to_vec()
}

#[test]
fn replay_of_the_seed_scenario_reproduces_its_peaks_and_shows_expandable_halving_them() {
    let dir = common::scratch("analyze-replay-seed");
    let snap = record(&dir, "shim_frag", &["forward"], false, "seed.pickle");
    let out = ok(
        &[
            "replay",
            "--conf",
            "",
            "--conf",
            "expandable_segments:True",
            "--conf",
            "pytorch_expandable_segments:True",
        ],
        &[&snap],
    );
    // peak reserved, peak allocated, frag, device allocs, OOMs
    let recorded = last_cols(&row(&out, "recorded"), 5);
    let replayed = last_cols(&row(&out, "replay: recorded"), 5);
    assert_eq!(
        recorded[..2],
        replayed[..2],
        "recorded peaks reproduced\n{out}"
    );
    assert_eq!(recorded[0], "256.0", "{out}");
    assert_eq!(recorded[1], "128.0", "{out}");
    let ordinary = last_cols(&row(&out, "replay: PyTorch defaults"), 5);
    let expandable = last_cols(&row(&out, "replay: expandable_segments:True"), 5);
    assert_eq!(ordinary[0], "256.0", "{out}");
    assert_eq!(expandable[0], "128.0", "{out}");
    assert!(
        out.contains("pytorch_expandable_segments:True is PyTorch's (fixed 2 MiB small-pool"),
        "says which page plan each expandable row is\n{out}"
    );
    // PyTorch's page plan is a row of its own, holding the same blocks.
    let pytorch = last_cols(&row(&out, "replay: pytorch_expandable_segments:True"), 5);
    assert_eq!(pytorch[1], ordinary[1], "{out}");

    // The same recording made with expandable segments replays to its own peaks.
    let exp = record(&dir, "shim_frag", &["forward"], true, "seed-exp.json");
    let out = ok(&["replay", "--conf", ""], &[&exp]);
    let recorded = last_cols(&row(&out, "recorded"), 5);
    let replayed = last_cols(&row(&out, "replay: recorded"), 5);
    assert_eq!(recorded[..2], replayed[..2], "{out}");
    assert_eq!(recorded[0], "128.0", "{out}");
}

#[test]
fn replay_reads_pytorch_pickles_with_a_wrapped_ring_and_logs() {
    let dir = common::scratch("analyze-replay-inputs");
    // Older PyTorch: no time_us, no allocator_settings; the trace starts after the 8 MiB
    // block was allocated (the ring wrapped), so that block is inferred from the segments.
    let Some(old) = torch_pickle(
        "del s['allocator_settings']\n\
         s['device_traces'][0] = [dict((k, v) for k, v in e.items() if k != 'time_us') for e in trace[2:]]",
    ) else {
        common::skip::skip("the PyTorch pickle part", "python3 is not installed");
        return;
    };
    let old = write(&dir, "old.pickle", &old);
    let out = ok(&["replay"], &[&old]);
    assert!(
        out.contains("1 blocks (8388608 bytes) were live before the trace began"),
        "{out}"
    );
    assert!(out.contains("records no allocator settings"), "{out}");
    let recorded = last_cols(&row(&out, "recorded"), 5);
    assert_eq!(
        recorded[1], "14.0",
        "8 + 4 + 2 MiB allocated at the peak\n{out}"
    );
    for conf in ["max_split_size_mb:32", "garbage_collection_threshold:0.6"] {
        row(&out, &format!("replay: {conf}"));
    }

    let csv = write(&dir, "rmm.csv", &rmm_csv());
    let out = ok(&["replay", "--conf", ""], &[&csv]);
    let r = last_cols(&row(&out, "replay: PyTorch defaults"), 5);
    assert_eq!(
        r[1], "9.0",
        "1 + 8 MiB at the peak (the 4 MiB block was freed)\n{out}"
    );
    assert_eq!(
        last_cols(&row(&out, "recorded"), 5)[0],
        "-",
        "a log records no reserve\n{out}"
    );
    let log = write(&dir, "sim.log", &plain_log());
    let out = ok(&["replay", "--conf", ""], &[&log]);
    let r = last_cols(&row(&out, "recorded"), 5);
    assert_eq!(r[1], "14.0", "2 + 4 + 8 MiB at time 4\n{out}");
}

#[test]
fn replay_runs_on_the_recorded_device_size_and_counts_ooms() {
    let dir = common::scratch("analyze-replay-oom");
    // Recorded on a 64 MiB device (cushim.memory[].total); two 40 MiB blocks cannot both
    // be live there, whatever the settings.
    let m = 1u64 << 20;
    let snap = serde_json::json!({
        "segments": [],
        "device_traces": [[
            {"action": "alloc", "addr": 4096, "size": 40 * m, "stream": 0},
            {"action": "alloc", "addr": 8192, "size": 40 * m, "stream": 0},
        ]],
        "cushim": {"memory": [{"device": 0, "total": 64 * m, "explained": 0}]},
    });
    let f = write(&dir, "small-device.json", snap.to_string().as_bytes());
    let out = ok(
        &["replay", "--conf", "", "--conf", "expandable_segments:True"],
        &[&f],
    );
    assert!(
        out.contains(&format!("({} bytes), the size the file records", 64 * m)),
        "{out}"
    );
    for label in [
        "replay: PyTorch defaults",
        "replay: expandable_segments:True",
    ] {
        let r = last_cols(&row(&out, label), 5);
        assert_eq!(r[4], "1", "{label}: one OOM\n{out}");
    }
}

#[test]
fn diff_names_the_site_that_grew_between_two_runs() {
    let dir = common::scratch("analyze-diff");
    let a = record(&dir, "analyze_grow", &["0"], false, "a.pickle");
    let b = record(&dir, "analyze_grow", &["6"], false, "b.json");
    let out = ok(&["diff"], &[&a, &b]);
    let first = out
        .lines()
        .skip_while(|l| !l.contains("at the peak:"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        first.contains("grew") && first.contains("+24.00 MiB") && first.contains("activations"),
        "the grown site comes first\n{out}"
    );
    assert!(
        !out.contains("weights"),
        "the unchanged site is not listed\n{out}"
    );
    assert!(
        out.contains("peak allocated: 48.00 MiB -> 72.00 MiB"),
        "{out}"
    );
    // Reversed, the site shrank.
    let out = ok(&["diff"], &[&b, &a]);
    assert!(
        out.contains("shrank") && out.contains("-24.00 MiB"),
        "{out}"
    );
}

#[test]
fn summary_of_a_pytorch_pickle_names_program_frames_and_pending_blocks() {
    let dir = common::scratch("analyze-summary-torch");
    let Some(t) = torch_pickle("") else {
        common::skip::skip("the PyTorch pickle summary", "python3 is not installed");
        return;
    };
    let f = write(&dir, "rank0.pickle", &t);
    let out = ok(&["summary"], &[&f]);
    assert!(!out.contains("unwind"), "{out}");
    assert!(out.contains("train_step (/home/u/train.py:42)"), "{out}");
    assert!(out.contains("load_batch (/home/u/data.py:7)"), "{out}");
    assert!(
        out.contains("allocated: 12.00 MiB"),
        "pending excluded\n{out}"
    );
    assert!(out.contains("pending free: 2.00 MiB"), "{out}");
    assert!(
        !out.contains("device 1"),
        "an empty device is left out\n{out}"
    );
    let out = ok(&["summary", "--depth", "2", "--tree"], &[&f]);
    assert!(
        out.contains("train_step (/home/u/train.py:42) <- main (/home/u/train.py:90)"),
        "{out}"
    );
    assert!(out.contains("top-down"), "{out}");

    // Per rank: rank 1 allocated 8 MiB more at its peak.
    let t1 = torch_pickle(
        "seg['blocks'][3]['state'] = 'active_allocated'\n\
         s['device_traces'][0].append({'action': 'alloc', 'addr': base + 14 * MIB, 'size': 6 * MIB, 'stream': 0, 'time_us': 6, 'frames': ft})",
    )
    .unwrap();
    let f1 = write(&dir, "rank1.pickle", &t1);
    let out = ok(&["summary"], &[&f, &f1]);
    assert!(
        out.contains("spread of peak allocated: min 14.00 MiB max 18.00 MiB"),
        "{out}"
    );
    assert!(
        out.contains("largest in") && out.contains("rank1.pickle"),
        "{out}"
    );
}

/// Every command, on every crafted file: exit status 2, one line on stderr naming the file.
#[test]
fn every_command_refuses_hostile_files_with_one_line_naming_the_file() {
    let dir = common::scratch("analyze-hostile-cli");
    let good = write(&dir, "good.pickle", &seed_scenario("", Format::Pickle));
    let mut deep = vec![0x80, 2];
    deep.extend(std::iter::repeat(b']').take(10_000));
    deep.extend(std::iter::repeat(b'a').take(9_999));
    deep.push(b'.');
    let mut huge = vec![0x80, 4, 0x8d];
    huge.extend((5u64 << 30).to_le_bytes());
    let seed = seed_scenario("", Format::Pickle);
    let cases = [
        write(&dir, "deep.pickle", &deep),
        write(&dir, "huge-string.pickle", &huge),
        write(&dir, "truncated.pickle", &seed[..seed.len() / 2]),
        write(&dir, "memo.pickle", &[0x80, 2, b'h', 9, b'.']),
        write(
            &dir,
            "wrong-type.json",
            br#"{"segments": [{"total_size": "big"}]}"#,
        ),
    ];
    for bad in &cases {
        let name = bad.file_name().unwrap().to_string_lossy().into_owned();
        let out_json = dir.join("out.json");
        let runs: Vec<(&str, Vec<&Path>, Vec<&str>)> = vec![
            ("summary", vec![bad.as_path()], vec!["summary"]),
            ("replay", vec![bad.as_path()], vec!["replay"]),
            ("diff", vec![good.as_path(), bad.as_path()], vec!["diff"]),
            (
                "convert",
                vec![bad.as_path(), out_json.as_path()],
                vec!["convert"],
            ),
        ];
        for (cmd, files, args) in runs {
            if cmd == "convert" && name == "wrong-type.json" {
                continue; // plain data converts: convert does not interpret the schema
            }
            let out = cushim(&args, &files);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} {name}: {err}");
            assert_eq!(err.lines().count(), 1, "{cmd} {name}: one line\n{err}");
            assert!(
                err.starts_with("cushim: ") && err.contains(&name),
                "{cmd} {name}: {err}"
            );
            assert!(!err.contains("panicked"), "{cmd} {name}: {err}");
        }
    }
}

#[test]
fn replay_counts_a_block_pending_a_free_as_no_longer_allocated() {
    // A (8 MiB) is freed by the program, then B (8 MiB) is allocated before A's free
    // completes: allocated peaks at 8 MiB (PyTorch's allocated_bytes), not 16.
    let dir = common::scratch("analyze-replay-pending");
    let (s, m) = (1u64 << 40, 1u64 << 20);
    let ev = |a: &str, addr: u64, size: u64| {
        format!(r#"{{"action": "{a}", "addr": {addr}, "size": {size}, "stream": 0, "frames": []}}"#)
    };
    let trace = [
        ev("segment_alloc", s, 32 * m),
        ev("alloc", s, 8 * m),
        ev("free_requested", s, 8 * m),
        ev("alloc", s + 8 * m, 8 * m),
        ev("free_completed", s, 8 * m),
        ev("free_requested", s + 8 * m, 8 * m),
        ev("free_completed", s + 8 * m, 8 * m),
    ]
    .join(", ");
    let json = format!(
        r#"{{"segments": [{{"device": 0, "address": {s}, "total_size": {t}, "stream": 0,
            "blocks": [{{"address": {s}, "size": {t}, "state": "inactive"}}]}}],
            "device_traces": [[{trace}]]}}"#,
        t = 32 * m
    );
    let f = write(&dir, "pending.json", json.as_bytes());
    let out = ok(&["replay", "--conf", ""], &[&f]);
    assert_eq!(last_cols(&row(&out, "recorded"), 5)[1], "8.0", "{out}");
    for label in ["replay: recorded", "replay: "] {
        assert_eq!(last_cols(&row(&out, label), 5)[1], "8.0", "{label}\n{out}");
    }
}

#[test]
fn a_logs_walk_made_while_it_is_read_is_the_walk_of_its_model() {
    use cushim_tools::analyze::{input, walk};
    let dir = common::scratch("analyze-walk-while-reading");
    let exe = common::compile("shim_end", &[]);
    let log = dir.join("loop.log");
    // 3000 pairs: over 9000 events, so the timeline's columns are merged several times.
    common::run_ok(
        Command::new(common::cushim_bin())
            .args([
                "run",
                "--sim",
                "--history",
                "enabled=all,stacks=native",
                "--log",
            ])
            .arg(&log)
            .arg("--")
            .arg(&exe)
            .args(["3000", "loop"])
            .env("SHIM_END_EXIT", "1"),
    );
    let (snap, walks) = input::read_walked(&log).expect("reading the log");
    let walks = walks.expect("a log is walked while it is read");
    assert_eq!(walks.len(), snap.devices.len());
    assert!(!walks.is_empty());
    let facts = |w: &walk::Walked| {
        let mut live: Vec<_> = w.end.allocated.iter().map(|(a, l)| (*a, *l)).collect();
        live.sort_by_key(|e| e.0);
        format!(
            "{:?} {:?} {:?} {} {} {:?} {} {:?} {:?} {} {} {} {} {:?} {}",
            w.peaks,
            w.evidence,
            w.start_layout,
            w.segment_allocs,
            w.segment_frees,
            w.timeline,
            w.per,
            w.ooms,
            w.releases,
            w.largest_request,
            w.end.allocated_bytes,
            w.end.pending_bytes,
            w.end.reserved,
            live,
            w.start.requests,
        )
    };
    for (d, w) in snap.devices.iter().zip(&walks) {
        assert!(
            w.per > 1 && w.timeline.len() <= walk::BUCKETS + 1,
            "{}",
            w.per
        );
        assert_eq!(
            facts(w),
            facts(&walk::walk(&snap, d)),
            "device {}",
            d.ordinal
        );
    }
}
