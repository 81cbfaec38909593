//! Everything the analyses learn from one device's trace in one forward walk: the start,
//! the peaks and the state at the end (`timeline`), the evidence for the device size
//! (`device_size`), the segments live when the trace began (`seed`), the device
//! allocations, the timeline's columns and the out-of-memory events (`report`).
//!
//! Policy: a log's trace is decoded from the file on every walk, and a walk costs about as
//! much as decoding; so `report` walks each trace once here and hands the result to the
//! replay and the summary instead of each walking it again (and `replay` walks it once
//! before its configurations, all of which share a second walk). What needs a moment
//! known only at the end (the state at the peak) is a second, partial walk.

use crate::analyze::device_size::{Evidence, EvidenceWalk};
use crate::analyze::model::{Device, Snapshot};
use crate::analyze::seed::{SeedSegment, StartSegments};
use crate::analyze::timeline::{start_of, state_after, PeakWalk, Peaks, Start, State};
use cushim::trace::event::Action;

/// Columns of the report's timeline.
pub const BUCKETS: usize = 800;

/// What one walk of a device's trace gives.
#[derive(Debug, Clone)]
pub struct Walked {
    pub start: Start,
    pub peaks: Peaks,
    /// The state after the whole trace (from `start`).
    pub end: State,
    pub evidence: Evidence,
    /// The segments live when the trace began, carved into the blocks then live, and the
    /// live blocks outside them (`seed::layout_at_start`).
    pub start_layout: (Vec<SeedSegment>, Vec<(u64, u64, bool)>),
    /// Segments allocated or mapped in the trace.
    pub segment_allocs: u64,
    /// Segments freed or unmapped in the trace.
    pub segment_frees: u64,
    /// Per column of [`BUCKETS`] (each a run of events): the most allocated and the most
    /// reserved; the first is the start.
    pub timeline: Vec<(u64, u64)>,
    /// Indices of the out-of-memory events.
    pub ooms: Vec<usize>,
    /// Indices of the events at which the program released the cache itself
    /// (`device_size::EvidenceWalk::finish_with_releases`).
    pub releases: Vec<usize>,
    /// The largest request in the trace (allocations and failed requests), in bytes.
    pub largest_request: u64,
}

impl Walked {
    /// The state after the event at which allocated memory first reached its peak.
    pub fn at_peak(&self, dev: &Device) -> State {
        state_after(dev, &self.start, self.peaks.allocated_at)
    }
}

/// Walk `dev`'s trace in `snap` once.
pub fn walk(snap: &Snapshot, dev: &Device) -> Walked {
    let start = start_of(snap, dev);
    let mut pw = PeakWalk::new(&start);
    let mut ew = EvidenceWalk::new(&start);
    let mut sw = StartSegments::default();
    let mut segment_allocs = 0u64;
    let mut segment_frees = 0u64;
    let n = dev.events.len();
    let per = n.max(1).div_ceil(BUCKETS).max(1);
    let mut timeline = vec![(pw.state.allocated_bytes, pw.state.reserved)];
    let mut ooms = Vec::new();
    let mut largest_request = 0u64;
    let mut cur = (0u64, 0u64);
    let mut i = 0usize;
    let mut next_column = per;
    dev.events.for_each_slice(|evs| {
        for ev in evs {
            pw.step(ev);
            ew.step(ev);
            sw.step(ev);
            match ev.action {
                Action::SegmentAlloc | Action::SegmentMap => segment_allocs += 1,
                Action::SegmentFree | Action::SegmentUnmap => segment_frees += 1,
                Action::Oom => {
                    ooms.push(i);
                    largest_request = largest_request.max(ev.size);
                }
                Action::Alloc => largest_request = largest_request.max(ev.size),
                _ => {}
            }
            cur.0 = cur.0.max(pw.state.allocated_bytes);
            cur.1 = cur.1.max(pw.state.reserved);
            i += 1;
            // `i % per == 0` without a division per event.
            if i == next_column || i == n {
                if i == next_column {
                    next_column += per;
                }
                timeline.push(cur);
                cur = (0, 0);
            }
        }
    });
    let start_layout = sw.finish(dev, &start);
    let (evidence, releases) = ew.finish_with_releases();
    Walked {
        peaks: pw.peaks,
        end: pw.state,
        evidence,
        releases,
        start_layout,
        segment_allocs,
        segment_frees,
        timeline,
        ooms,
        start,
        largest_request,
    }
}
