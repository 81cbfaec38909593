//! Snapshot dump cost: build the value tree, encode it, write it crash-safely.
//!
//! Invariant: the input is what a real dump sees: events whose stacks were captured for
//! real (32 frames, from 256 distinct call paths of this program, which has line tables),
//! symbolized at dump time; the dump runs the same steps as the shim's (build, encode,
//! `write_atomic` with its fsync) and its size is the file's size on disk.

use cushim::alloc::info::{BlockInfo, BlockState, SegmentInfo};
use cushim::config::history::{parse, HistoryConf, Unwinder};
use cushim::snapshot::model::{DeviceState, SnapshotInput};
use cushim::snapshot::output::write_atomic;
use cushim::snapshot::{build::build, encode, Format};
use cushim::trace::event::{Action, StackId, TraceEvent};
use cushim::trace::intern::StackTable;
use cushim::trace::stack::{capture_id, SkipRange};
use std::hint::black_box;
use std::path::Path;

/// Distinct stacks in a generated snapshot.
pub const DISTINCT_STACKS: u32 = 256;

// Not inlined (nor are the paths), so each captured return address symbolizes to exactly
// one frame and a 32-frame stack shows as 32 frames in the snapshot.
#[inline(never)]
fn step(level: usize, frames: usize, pattern: u32, out: &mut Vec<StackId>) {
    if level == 0 {
        out.push(capture_id(frames, Unwinder::Dwarf, &SkipRange::NONE));
    } else if (pattern >> (level % 8)) & 1 == 1 {
        path_a(level - 1, frames, pattern, out);
    } else {
        path_b(level - 1, frames, pattern, out);
    }
}

#[inline(never)]
fn path_a(level: usize, frames: usize, pattern: u32, out: &mut Vec<StackId>) {
    step(black_box(level), frames, pattern, out);
    black_box(level);
}

#[inline(never)]
fn path_b(level: usize, frames: usize, pattern: u32, out: &mut Vec<StackId>) {
    step(black_box(level), frames, pattern, out);
    black_box(level);
}

/// Capture `DISTINCT_STACKS` real stacks of `frames` frames each.
pub fn real_stacks(frames: usize) -> Vec<StackId> {
    let mut ids = Vec::new();
    for p in 0..DISTINCT_STACKS {
        path_a(frames, frames, p, &mut ids);
    }
    ids
}

/// A snapshot input of `n_events` events (alloc, free_requested, free_completed cycles in
/// one 64 MiB segment that is left cached and free) with stacks of `frames` frames.
pub fn input(n_events: usize, frames: usize) -> SnapshotInput {
    let stacks = real_stacks(frames);
    let base = 0x7f00_0000_0000u64;
    let seg_size = 64u64 << 20;
    let mut events = Vec::with_capacity(n_events);
    let t0 = 1_700_000_000_000_000i64;
    for i in 0..n_events {
        let k = (i / 3) as u64;
        let size = 512 * (1 + (k * 2654435761) % 4096);
        let addr = base + (k * 512) % (seg_size - size).max(512);
        let action = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted][i % 3];
        events.push(TraceEvent {
            action,
            device: 0,
            addr,
            size,
            stream: 0,
            time_us: t0 + i as i64,
            stack: stacks[(k % stacks.len() as u64) as usize],
            device_free: 0,
            range: 0,
        });
    }
    let segment = SegmentInfo {
        device: 0,
        address: base,
        total_size: seg_size,
        stream: 0,
        is_large: true,
        is_expandable: false,
        pool_id: (0, 0),
        stack: stacks[0],
        blocks: vec![BlockInfo {
            address: base,
            size: seg_size,
            requested_size: 0,
            state: BlockState::Inactive,
            stack: 0,
        }],
    };
    SnapshotInput {
        devices: vec![DeviceState {
            device: 0,
            segments: vec![segment],
            events,
        }],
        host: None,
        allocator_settings: serde_json::json!({"expandable_segments": false}),
        stats: serde_json::json!({}),
        history: parse("enabled=all,context=all,stacks=native")
            .unwrap_or_else(|_| HistoryConf::off()),
        cmdline: vec!["cushim-bench".to_string()],
        ..SnapshotInput::default()
    }
}

/// One dump of `input` to `path` in `format`; returns the bytes on disk.
pub fn dump(input: &SnapshotInput, format: Format, path: &Path) -> Result<u64, String> {
    let v = build(input, StackTable::global());
    let bytes = encode(&v, format)?;
    write_atomic(path, &bytes)?;
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("stat {}: {e}", path.display()))
}

/// The extension of `format`.
pub fn ext(format: Format) -> &'static str {
    match format {
        Format::Pickle => "pickle",
        Format::Msgpack => "msgpack",
        Format::Json => "json",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::reader::read_file;

    #[test]
    fn a_generated_dump_reads_back_with_every_event_and_named_frames() {
        let input = input(300, 32);
        let dir = std::env::temp_dir().join(format!("cushim-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.pickle");
        let bytes = dump(&input, Format::Pickle, &path).unwrap();
        assert!(bytes > 0);
        let v = read_file(&path).unwrap();
        let trace = v.get("device_traces").unwrap().as_seq().unwrap()[0]
            .as_seq()
            .unwrap()
            .to_vec();
        assert_eq!(trace.len(), 300);
        let frames = trace[0].get("frames").unwrap().as_seq().unwrap();
        // 32 return addresses; the unwinder's own top frames may add inlined frames.
        assert!((32..=40).contains(&frames.len()), "{}", frames.len());
        assert!(frames.iter().any(|f| f
            .get("name")
            .and_then(|n| n.as_str())
            .is_some_and(|n| n.contains("path_"))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
