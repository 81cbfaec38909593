//! The segments as they were at one moment of the trace, and how full each was.
//!
//! Policy: the snapshot records the segments at the end only. Those at event `n` are found
//! as the trace's start is (see `timeline`): from the end, undo the segment events after
//! `n`, newest first. A `segment_alloc` after `n` did not exist yet; a `segment_free` after
//! `n` was there; `segment_map`/`segment_unmap` (expandable segments) grow or shrink the
//! segment that holds the address (the one starting at or below it). A segment's fill is
//! the bytes of the blocks live at `n` (allocated or pending a free: neither can be
//! reused) inside it; a live block outside every known segment is not drawn.

use crate::analyze::model::{Device, Event};
use crate::analyze::timeline::State;
use cushim::trace::event::Action;
use std::collections::BTreeMap;

/// One segment at a moment.
#[derive(Debug, Clone, PartialEq)]
pub struct SegFill {
    pub address: u64,
    pub size: u64,
    pub expandable: bool,
    /// Bytes of live blocks in it.
    pub used: u64,
}

/// The segments of `dev` after its first `n` events, filled by `state` (the blocks live
/// then), in address order.
pub fn segments_at(dev: &Device, state: &State, n: usize) -> Vec<SegFill> {
    let mut segs: BTreeMap<u64, (u64, bool)> = dev
        .segments
        .iter()
        .map(|s| (s.address, (s.total_size, s.expandable)))
        .collect();
    for ev in dev.events.iter().skip(n).rev() {
        let holder =
            |segs: &BTreeMap<u64, (u64, bool)>| segs.range(..=ev.addr).next_back().map(|(&a, _)| a);
        match ev.action {
            Action::SegmentAlloc => {
                segs.remove(&ev.addr);
            }
            Action::SegmentFree => {
                segs.insert(ev.addr, (ev.size, false));
            }
            Action::SegmentMap => {
                if let Some(a) = holder(&segs) {
                    if let Some(s) = segs.get_mut(&a) {
                        s.0 = s.0.saturating_sub(ev.size);
                        if s.0 == 0 {
                            segs.remove(&a);
                        }
                    }
                }
            }
            Action::SegmentUnmap => match holder(&segs).and_then(|a| segs.get_mut(&a)) {
                Some(s) if s.1 => s.0 = s.0.saturating_add(ev.size),
                _ => {
                    segs.insert(ev.addr, (ev.size, true));
                }
            },
            _ => {}
        }
    }
    fill(&segs, state)
}

/// The segments of a log's device as its events are applied, fed an event at a time (by a
/// caller that walks the trace for other things too): a whole-run log records every segment
/// from the run's start, so they are its segment events applied forward from none
/// (`segment_map` grows the segment holding the address, or starts one).
#[derive(Debug, Default)]
pub struct SegmentsForward {
    segs: BTreeMap<u64, (u64, bool)>,
}

impl SegmentsForward {
    #[inline]
    pub fn step(&mut self, ev: &Event) {
        let segs = &mut self.segs;
        let holder =
            |segs: &BTreeMap<u64, (u64, bool)>| segs.range(..=ev.addr).next_back().map(|(&a, _)| a);
        match ev.action {
            Action::SegmentAlloc => {
                segs.insert(ev.addr, (ev.size, false));
            }
            Action::SegmentFree => {
                segs.remove(&ev.addr);
            }
            Action::SegmentMap => match holder(segs) {
                Some(a) if segs.get(&a).is_some_and(|s| s.1 && a + s.0 == ev.addr) => {
                    if let Some(s) = segs.get_mut(&a) {
                        s.0 = s.0.saturating_add(ev.size);
                    }
                }
                _ => {
                    segs.insert(ev.addr, (ev.size, true));
                }
            },
            Action::SegmentUnmap => {
                if let Some(a) = holder(segs) {
                    if let Some(s) = segs.get_mut(&a) {
                        s.0 = s.0.saturating_sub(ev.size);
                        if s.0 == 0 {
                            segs.remove(&a);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// The segments so far, filled by `state`'s blocks.
    pub fn finish(&self, state: &State) -> Vec<SegFill> {
        fill(&self.segs, state)
    }
}

/// The segments `segs` (address -> size, expandable), filled by the blocks of `state`.
fn fill(segs: &BTreeMap<u64, (u64, bool)>, state: &State) -> Vec<SegFill> {
    let mut out: Vec<SegFill> = segs
        .iter()
        .map(|(&address, &(size, expandable))| SegFill {
            address,
            size,
            expandable,
            used: 0,
        })
        .collect();
    for (&addr, l) in state.allocated.iter().chain(state.pending.iter()) {
        let i = out.partition_point(|s| s.address <= addr);
        if let Some(s) = i.checked_sub(1).and_then(|i| out.get_mut(i)) {
            if addr - s.address < s.size {
                s.used = s.used.saturating_add(l.size);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::model::{Event, Segment, Snapshot};
    use crate::analyze::timeline::{peaks, start_of, state_after};

    const M: u64 = 1 << 20;

    fn ev(action: Action, addr: u64, size: u64) -> Event {
        Event {
            action,
            addr,
            size,
            stream: 0,
            stack: 0,
        }
    }

    #[test]
    fn the_peak_shows_a_full_segment_that_is_empty_at_the_end_and_one_freed_since() {
        let (a, b) = (1u64 << 40, 2u64 << 40);
        let dev = Device {
            ordinal: 0,
            // At the end: segment A with nothing live; B was freed.
            segments: vec![Segment {
                address: a,
                total_size: 32 * M,
                stream: 0,
                expandable: false,
                kind: None,
                pool: (0, 0),
                blocks: Vec::new(),
            }],
            events: vec![
                ev(Action::SegmentAlloc, a, 32 * M),
                ev(Action::Alloc, a, 24 * M),
                ev(Action::SegmentAlloc, b, 20 * M),
                ev(Action::Alloc, b, 20 * M),
                ev(Action::FreeRequested, b, 20 * M),
                ev(Action::FreeCompleted, b, 20 * M),
                ev(Action::SegmentFree, b, 20 * M),
                ev(Action::FreeRequested, a, 24 * M),
                ev(Action::FreeCompleted, a, 24 * M),
            ]
            .into(),
        };
        let snap = Snapshot {
            has_state: true,
            devices: vec![dev.clone()],
            ..Default::default()
        };
        let st = start_of(&snap, &dev);
        let p = peaks(&dev, &st);
        assert_eq!((p.allocated, p.allocated_at), (44 * M, 4));
        let at = segments_at(
            &dev,
            &state_after(&dev, &st, p.allocated_at),
            p.allocated_at,
        );
        let fill: Vec<(u64, u64, u64)> = at.iter().map(|s| (s.address, s.size, s.used)).collect();
        assert_eq!(fill, [(a, 32 * M, 24 * M), (b, 20 * M, 20 * M)]);
        let end = segments_at(
            &dev,
            &state_after(&dev, &st, dev.events.len()),
            dev.events.len(),
        );
        let fill: Vec<(u64, u64, u64)> = end.iter().map(|s| (s.address, s.size, s.used)).collect();
        assert_eq!(fill, [(a, 32 * M, 0)]);
    }
}
