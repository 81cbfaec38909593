//! The interned-stack table is bounded: with history on and
//! `max_entries=100000`, a program with 2^23 distinct call stacks recording 10 M events keeps
//! its memory flat: the table stops at `max_stacks` (default 2^17), every capture it could not
//! store is counted, and the snapshot says so (`cushim.stacks`).
//!
//! The bound asserted: RSS grows by less than 96 MiB over the run. What is kept: the ring,
//! 100000 events of 48 bytes (4.8 MB), and 2^17 stacks of 16 frames (16 MiB of frames plus
//! their index); without the cap the same run stores 2^23 stacks, over 1 GiB of frames alone.
//! One test in this file, so no other test's memory moves the figure.
use cushim::config::history::{parse, DEFAULT_MAX_STACKS};
use cushim::snapshot::build::build;
use cushim::snapshot::model::{DeviceState, SnapshotInput};
use cushim::trace::event::{Action, EventSink, TraceEvent, NO_STACK};
use cushim::trace::intern::StackTable;
use cushim::trace::ring::TraceRing;

const FRAMES: usize = 16;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

/// Record `events` events whose stacks cycle through `distinct` different stacks; returns
/// the RSS growth and the table.
fn run(distinct: u64, events: u64) -> (u64, StackTable, TraceRing) {
    let conf = parse("enabled=all,context=all,stacks=native,max_entries=100000").expect("conf");
    assert_eq!(conf.max_stacks, DEFAULT_MAX_STACKS);
    let table = StackTable::with_limit(conf.max_stacks);
    let mut ring = TraceRing::for_device(&conf);
    let before = rss_bytes();
    let mut frames = [0u64; FRAMES];
    for (k, f) in frames.iter_mut().enumerate() {
        *f = 0x40_0000 + 0x100 * k as u64;
    }
    for i in 0..events {
        let s = i % distinct;
        // Distinct stacks differ in their innermost frames, as recursion of varying depth
        // or many call sites would.
        frames[0] = 0x7f00_0000_0000 + s;
        frames[1] = 0x7f00_1000_0000 + (s >> 7);
        let stack = table.intern(&frames);
        ring.record(TraceEvent {
            action: if i % 2 == 0 {
                Action::Alloc
            } else {
                Action::FreeCompleted
            },
            device: 0,
            addr: 0x1000 * (i % 4096),
            size: 512,
            stream: 0,
            time_us: i as i64,
            stack,
            device_free: 0,
            range: 0,
        });
    }
    let grown = rss_bytes().saturating_sub(before);
    (grown, table, ring)
}

#[test]
fn two_to_the_23_distinct_stacks_and_10m_events_keep_rss_under_96_mib_and_count_the_dropped() {
    let (distinct, events) = (1u64 << 23, 10_000_000u64);
    let (grown, table, ring) = run(distinct, events);
    println!(
        "RSS grew by {} KiB; {} stacks kept, {} captures dropped",
        grown >> 10,
        table.len(),
        table.dropped()
    );
    assert!(grown < 96 << 20, "RSS grew by {grown} bytes");
    assert_eq!(table.len(), DEFAULT_MAX_STACKS);
    // Stored: the first 2^17 stacks, found again when the cycle of 2^23 restarts; every other
    // capture was of a stack the full table could not take.
    let kept_captures = 2 * DEFAULT_MAX_STACKS as u64;
    assert_eq!(table.dropped(), events - kept_captures);
    let evs = ring.events();
    assert_eq!(evs.len(), 100_000);
    assert!(evs.iter().all(|e| e.stack == NO_STACK));

    // The snapshot reports the bound and what was dropped.
    let input = SnapshotInput {
        devices: vec![DeviceState {
            device: 0,
            segments: Vec::new(),
            events: evs[..10].to_vec(),
        }],
        history: parse("enabled=all").expect("conf"),
        ..SnapshotInput::default()
    };
    let v = build(&input, &table);
    let mut json = Vec::new();
    cushim::snapshot::json::write_to(&v, &mut json).expect("json");
    let j: serde_json::Value = serde_json::from_slice(&json).expect("parse");
    let s = &j["cushim"]["stacks"];
    assert_eq!(s["interned"], DEFAULT_MAX_STACKS as u64, "{s}");
    assert_eq!(s["dropped"], events - kept_captures, "{s}");
    assert_eq!(s["max_stacks"], DEFAULT_MAX_STACKS as u64, "{s}");
}
