//! Size and speed: identical stacks are written once, so a snapshot grows with its events,
//! not with events x frames. The 1,000,000-event measurement is `#[ignore]`d; run it with
//! `cargo test --release -p cushim --test engine -- snapshot_scale:: --ignored --nocapture`.

use crate::common::snapshot_support as support;

use cushim::alloc::info::{BlockInfo, BlockState, SegmentInfo};
use cushim::snapshot::build::build;
use cushim::snapshot::model::{DeviceState, SnapshotInput};
use cushim::snapshot::{encode, Format};
use cushim::trace::event::{Action, StackId};
use cushim::trace::intern::StackTable;
use std::time::Instant;
use support::*;

/// `n` events (alloc / free_requested / free_completed cycles on one block) from `stacks`
/// distinct call sites, the block ending free.
fn input(n: usize, stacks: &[StackId]) -> SnapshotInput {
    let mut e = Events::new();
    e.push(Action::SegmentAlloc, A, 2 * MIB, stacks[0]);
    let acts = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted];
    let mut i = 0;
    while e.v.len() + 3 <= n || e.v.len() % 3 != 1 {
        e.push(acts[i % 3], A, 512 * KIB, stacks[(i / 3) % stacks.len()]);
        i += 1;
    }
    let seg = SegmentInfo {
        device: 0,
        address: A,
        total_size: 2 * MIB,
        stream: 0,
        is_large: false,
        is_expandable: false,
        pool_id: (0, 0),
        stack: stacks[0],
        blocks: vec![BlockInfo {
            address: A,
            size: 2 * MIB,
            requested_size: 0,
            state: BlockState::Inactive,
            stack: 0,
        }],
    };
    SnapshotInput {
        devices: vec![DeviceState {
            device: 0,
            segments: vec![seg],
            events: e.v,
        }],
        history: cushim::config::history::parse("enabled=all").unwrap(),
        allocator_settings: serde_json::json!({}),
        ..Default::default()
    }
}

#[test]
fn hundred_thousand_events_from_one_call_site_stay_under_10_mb() {
    let stack = deep_site(30, 64);
    let frames = StackTable::global().get(stack).unwrap().len();
    assert!(frames >= 30, "a deep stack ({frames} frames)");
    let v = build(&input(100_000, &[stack]), StackTable::global());
    let bytes = encode(&v, Format::Pickle).unwrap();
    println!(
        "100,000 events from one {frames}-frame stack: {} bytes of pickle",
        bytes.len()
    );
    assert!(bytes.len() < 10 << 20, "{} bytes", bytes.len());
    // Without sharing the frames alone would take far more than that.
    let unshared = encode(&v, Format::Json).unwrap().len();
    assert!(
        unshared > 5 * bytes.len(),
        "json {unshared} vs pickle {}",
        bytes.len()
    );
    let dir = scratch("scale-100k");
    let path = dir.join("s.pickle");
    std::fs::write(&path, &bytes).unwrap();
    let (ok, out) = python_check(&path, &["--expect-frame", "deep_site", "--check-batches"]);
    assert!(ok, "{out}");
    assert!(out.contains("\"distinct_trace_frame_lists\": 1"), "{out}");
}

fn vm_hwm_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
#[ignore]
fn measure_one_million_events_with_32_frame_stacks() {
    let stacks: Vec<StackId> = (0..64).map(|i| deep_site(30 + i % 2, 32)).collect();
    let inp = input(1_000_000, &stacks);
    let before = vm_hwm_kib();
    let t0 = Instant::now();
    let v = build(&inp, StackTable::global());
    let t1 = Instant::now();
    let dir = scratch("scale-1m");
    let path = dir.join("s.pickle");
    cushim::snapshot::output::write_snapshot(&v, &path).unwrap();
    let t2 = Instant::now();
    let size = std::fs::metadata(&path).unwrap().len();
    println!(
        "1,000,000 events, 32-frame stacks: build {:.2}s, pickle streamed to disk + fsync {:.2}s, \
         total {:.2}s, file {:.1} MB, peak RSS growth {:.1} MB",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        (t2 - t0).as_secs_f64(),
        size as f64 / 1e6,
        (vm_hwm_kib().saturating_sub(before)) as f64 / 1e3,
    );
    let bytes = std::fs::read(&path).unwrap();
    let t = Instant::now();
    let back = cushim_tools::snapshot::reader::read_bytes(&bytes).unwrap();
    println!("read back in {:.2}s", t.elapsed().as_secs_f64());
    assert_eq!(
        back.get("device_traces").unwrap().as_seq().unwrap()[0]
            .as_seq()
            .unwrap()
            .len(),
        inp.devices[0].events.len()
    );
    // The times are printed, not asserted: a speed target belongs in a benchmark, and a
    // wall-clock bound fails on a busy machine. The size does not depend on the machine.
    assert!(bytes.len() <= 150_000_000);
}
