//! The layout of a device when its trace began: each segment live then, at its address,
//! and the blocks inside it in address order (allocated, pending a free, or a free gap),
//! so a replay starts from the recorded layout instead of re-allocating the live blocks
//! (which packs them and loses the gaps a cache has after a while).
//!
//! Policy: the segments at the start are the segments at the end with the trace's segment
//! events undone newest first (a `segment_alloc` removes one, a `segment_free` puts it
//! back; expandable segments' map/unmap are left as they end, and such a segment is seeded
//! by its blocks only). A block live at the start (`timeline::start`) lies in the segment
//! that contains its address; what a segment's blocks leave uncovered is a free gap. A
//! live block outside every start segment (an inconsistent input) is left to the caller.

use crate::analyze::model::{Device, Event};
use crate::analyze::timeline::Start;
use cushim::trace::event::Action;
use std::collections::BTreeMap;

/// What a piece of a segment held when the trace began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    Allocated,
    Pending,
    Free,
}

/// One segment live when the trace began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSegment {
    pub address: u64,
    pub size: u64,
    pub stream: u64,
    pub expandable: bool,
    /// `(address, size, piece)` in address order, covering the segment.
    pub pieces: Vec<(u64, u64, Piece)>,
}

/// The segment events' part of [`layout_at_start`], fed the trace oldest first an event at
/// a time (so that it shares one walk with other analyses). Undoing the segment events
/// newest first leaves, at each address, what the oldest of its events says: a
/// `segment_alloc` that it was not there, a `segment_free` that it was, at that size; so
/// the forward walk keeps each address's oldest segment event.
#[derive(Debug, Default)]
pub struct StartSegments {
    /// Address -> its oldest segment event: `None` an allocation, else the freed segment's
    /// (size, stream, expandable).
    oldest: std::collections::HashMap<u64, Option<(u64, u64, bool)>>,
}

impl StartSegments {
    #[inline]
    pub fn step(&mut self, ev: &Event) {
        match ev.action {
            Action::SegmentAlloc => {
                self.oldest.entry(ev.addr).or_insert(None);
            }
            Action::SegmentFree => {
                self.oldest
                    .entry(ev.addr)
                    .or_insert(Some((ev.size, ev.stream, false)));
            }
            _ => {}
        }
    }

    /// The layout at the start (as [`layout_at_start`] gives it) once every event was fed.
    pub fn finish(self, dev: &Device, st: &Start) -> (Vec<SeedSegment>, Vec<(u64, u64, bool)>) {
        // address -> (size, stream, expandable)
        let mut segs: BTreeMap<u64, (u64, u64, bool)> = dev
            .segments
            .iter()
            .map(|s| (s.address, (s.total_size, s.stream, s.expandable)))
            .collect();
        for (a, oldest) in self.oldest {
            match oldest {
                None => segs.remove(&a),
                Some(s) => segs.insert(a, s),
            };
        }
        layout(segs, st)
    }
}

/// The recorded layout when `dev`'s trace began, and the live blocks that lie in no start
/// segment (`(address, size, pending)`).
pub fn layout_at_start(dev: &Device, st: &Start) -> (Vec<SeedSegment>, Vec<(u64, u64, bool)>) {
    let mut w = StartSegments::default();
    dev.events
        .for_each_slice(|evs| evs.iter().for_each(|e| w.step(e)));
    w.finish(dev, st)
}

/// Carve the start segments `segs` into the blocks live at `st`.
fn layout(
    segs: BTreeMap<u64, (u64, u64, bool)>,
    st: &Start,
) -> (Vec<SeedSegment>, Vec<(u64, u64, bool)>) {
    let mut blocks: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    for (&a, l) in &st.state.allocated {
        blocks.insert(a, (l.size, false));
    }
    for (&a, l) in &st.state.pending {
        blocks.insert(a, (l.size, true));
    }
    let mut out = Vec::with_capacity(segs.len());
    let mut outside = Vec::new();
    for (&address, &(size, stream, expandable)) in &segs {
        let end = address.saturating_add(size);
        let mut pieces = Vec::new();
        let mut at = address;
        let inside: Vec<(u64, (u64, bool))> =
            blocks.range(address..end).map(|(&a, &b)| (a, b)).collect();
        for (a, (bsize, pending)) in inside {
            blocks.remove(&a);
            if a < at || a.saturating_add(bsize) > end {
                outside.push((a, bsize, pending));
                continue;
            }
            if a > at {
                pieces.push((at, a - at, Piece::Free));
            }
            let p = if pending {
                Piece::Pending
            } else {
                Piece::Allocated
            };
            pieces.push((a, bsize, p));
            at = a + bsize;
        }
        if at < end {
            pieces.push((at, end - at, Piece::Free));
        }
        out.push(SeedSegment {
            address,
            size,
            stream,
            expandable,
            pieces,
        });
    }
    outside.extend(blocks.into_iter().map(|(a, (s, p))| (a, s, p)));
    outside.sort_unstable();
    (out, outside)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::model::Segment;

    fn ev(action: Action, addr: u64, size: u64) -> Event {
        Event {
            action,
            addr,
            size,
            stream: 7,
            stack: 0,
        }
    }

    #[test]
    fn the_forward_walk_finds_the_segments_that_undoing_the_trace_newest_first_finds() {
        const M: u64 = 1 << 20;
        let dev = Device {
            ordinal: 0,
            segments: vec![Segment {
                address: 0xa000_0000,
                total_size: 2 * M,
                stream: 0,
                expandable: false,
                kind: None,
                pool: (0, 0),
                blocks: Vec::new(),
            }],
            events: vec![
                // Freed before any allocation of it: live at the start, at the freed size
                // (not the size of the later allocation at that address).
                ev(Action::SegmentFree, 0xb000_0000, 4 * M),
                ev(Action::SegmentAlloc, 0xb000_0000, 8 * M),
                // Allocated first: not live at the start, whatever follows.
                ev(Action::SegmentAlloc, 0xc000_0000, 2 * M),
                ev(Action::SegmentFree, 0xc000_0000, 2 * M),
                // Freed, then made again: live at the start.
                ev(Action::SegmentFree, 0xd000_0000, 6 * M),
                ev(Action::SegmentAlloc, 0xd000_0000, 6 * M),
                ev(Action::Alloc, 0xb000_0000, M),
            ]
            .into(),
        };
        let st = Start::default();
        let (forward, outside) = layout_at_start(&dev, &st);
        // The definition: the end segments with the segment events undone newest first.
        let mut segs: BTreeMap<u64, (u64, u64, bool)> = BTreeMap::new();
        segs.insert(0xa000_0000, (2 * M, 0, false));
        for e in dev.events.iter().rev() {
            match e.action {
                Action::SegmentAlloc => {
                    segs.remove(&e.addr);
                }
                Action::SegmentFree => {
                    segs.insert(e.addr, (e.size, e.stream, false));
                }
                _ => {}
            }
        }
        let (undone, _) = layout(segs, &st);
        assert_eq!(forward, undone);
        let at: Vec<(u64, u64)> = forward.iter().map(|s| (s.address, s.size)).collect();
        assert_eq!(
            at,
            vec![
                (0xa000_0000, 2 * M),
                (0xb000_0000, 4 * M),
                (0xd000_0000, 6 * M)
            ]
        );
        assert!(outside.is_empty());
    }
}
