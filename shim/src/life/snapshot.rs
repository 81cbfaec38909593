//! Building and writing one snapshot from the live allocator (the glue between the engine's
//! `alloc::CachingAllocator::snapshot` and `snapshot::{build, output}`).
//!
//! Invariant: the allocator's locks are held only while `snapshot()` copies each device's
//! state; symbolization, encoding and file I/O happen after, without any lock.

use std::path::PathBuf;

use cushim::alloc::observed::Kind;
use cushim::snapshot::build::build;
use cushim::snapshot::model::{DeviceState, SnapshotInput};
use cushim::snapshot::output::{expand, write_snapshot, TemplateVars};
use cushim::trace::intern::StackTable;

use crate::life::shim::Shim;

/// Merge observed events into a device's events, oldest first (stable: equal times keep
/// the cache's events first).
fn merge(
    into: &mut Vec<cushim::trace::event::TraceEvent>,
    more: Vec<cushim::trace::event::TraceEvent>,
) {
    if more.is_empty() {
        return;
    }
    into.extend(more);
    into.sort_by_key(|e| e.time_us);
}

/// Sleep-mode segments (observed as one block each) get the sleep cache's blocks, with
/// their states and stacks, as the main cache's segments have theirs.
fn sleep_blocks(
    arena: &cushim::sleep::SleepArena,
    dev: i32,
    segs: &mut [cushim::alloc::observed::ObservedSegment],
) {
    let blocks = arena.segment_blocks(dev);
    for seg in segs
        .iter_mut()
        .filter(|o| o.kind == Kind::Sleep.name() || o.kind == Kind::Paused.name())
    {
        if let Ok(i) = blocks.binary_search_by_key(&seg.info.address, |b| b.0) {
            seg.info.stack = blocks[i].1;
            seg.info.blocks.clone_from(&blocks[i].2);
        }
    }
}

/// Write a snapshot to the path `template` expands to (with dump sequence number `seq`).
pub fn write(s: &Shim, template: &str, seq: u64) -> Result<PathBuf, String> {
    let path = PathBuf::from(expand(template, &TemplateVars::current(seq)));
    let mut input = SnapshotInput {
        allocator_settings: s.alloc.conf().settings_json(),
        history: s.history.conf.clone(),
        cmdline: std::env::args().collect(),
        annotations: cushim::trace::annotations::entries(),
        ..SnapshotInput::default()
    };
    // In a `fork` child the dump asks the driver nothing (`fork.rs`).
    let forked = crate::life::forked::in_forked_child();
    let devices = if forked {
        s.alloc.snapshot_without_device_calls()
    } else {
        s.alloc.snapshot()
    };
    for d in devices {
        if d.device < 0 {
            if s.history.conf.record_host {
                input.host = Some((d.segments, d.events));
            }
        } else {
            input.devices.push(DeviceState {
                device: d.device,
                segments: d.segments,
                events: d.events,
            });
        }
    }
    for dev in (0..s.alloc.device_count() as i32).chain([-1]) {
        let (mut segs, mut evs) = s.observed.snapshot(dev);
        if let Some(arena) = crate::life::sleep::arena().filter(|_| dev >= 0) {
            sleep_blocks(arena, dev, &mut segs);
            merge(&mut evs, arena.events(dev));
        }
        input.observed.extend(segs);
        if dev < 0 {
            if let Some(h) = input.host.as_mut() {
                merge(&mut h.1, evs);
            } else if s.history.conf.record_host {
                input.host = Some((Vec::new(), evs));
            }
        } else if let Some(d) = input.devices.iter_mut().find(|d| d.device == dev) {
            merge(&mut d.events, evs);
        }
    }
    input.extra = serde_json::json!({
        "mode": crate::life::mode::mode_name(),
        "memory": crate::life::unexplained::memory_json(s),
    });
    input.stats = crate::life::stats::stats_json(s);
    let v = build(&input, StackTable::global());
    // Every error of `write_snapshot` names the path already.
    let (_, warning) = write_snapshot(&v, &path)?;
    if let Some(w) = warning {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| eprintln!("cushim: {w}"));
    }
    Ok(path)
}
