//! Everything the analyses learn from one device's trace in one forward walk: the start,
//! the peaks and the state at the end (`timeline`), the evidence for the device size
//! (`device_size`), the segments live when the trace began (`seed`), the device
//! allocations, the timeline's columns and the out-of-memory events (`report`).
//!
//! Policy: a log's trace is decoded from the file on every walk, and a walk costs about as
//! much as decoding; so `report` walks each trace once here and hands the result to the
//! replay and the summary instead of each walking it again (and `replay` walks it once
//! before its configurations, all of which share a second walk). For a log, that walk is
//! made while the log is read ([`WalkStream`] fed by the reader, `log_model`), on a second
//! thread. What needs a moment known only at the end (the state at the peak) is a second,
//! partial walk.

use crate::analyze::device_size::{Evidence, EvidenceWalk};
use crate::analyze::model::{Device, Event, Snapshot};
use crate::analyze::seed::{SeedSegment, StartSegments};
use crate::analyze::timeline::{start_of, state_after, PeakWalk, Peaks, Start, State};
use cushim::trace::event::Action;
use std::borrow::Cow;

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
    /// Per column of at most [`BUCKETS`] (each a run of [`Walked::per`] events, the last
    /// one maybe shorter): the most allocated and the most reserved; the first is the start.
    pub timeline: Vec<(u64, u64)>,
    /// Events per column of the timeline (a power of two).
    pub per: usize,
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

/// Each device's walk of `snap`, one per device in order: `given` when the reader made
/// them (`input::read_walked`) for these devices, else walked here.
pub fn walks_of<'a>(snap: &Snapshot, given: Option<&'a [Walked]>) -> Cow<'a, [Walked]> {
    match given {
        Some(w) if w.len() == snap.devices.len() => Cow::Borrowed(w),
        _ => Cow::Owned(snap.devices.iter().map(|d| walk(snap, d)).collect()),
    }
}

/// Walk `dev`'s trace in `snap` once.
pub fn walk(snap: &Snapshot, dev: &Device) -> Walked {
    let mut w = WalkStream::new(start_of(snap, dev));
    dev.events
        .for_each_slice(|evs| evs.iter().for_each(|ev| w.step(ev)));
    w.finish(dev)
}

/// The walk fed one event at a time, for a reader that has the events before the device's
/// model is complete (a log's reader walks while it reads: `log_model`).
pub struct WalkStream {
    start: Start,
    pw: PeakWalk,
    ew: EvidenceWalk,
    sw: StartSegments,
    segment_allocs: u64,
    segment_frees: u64,
    columns: Columns,
    ooms: Vec<usize>,
    largest_request: u64,
    /// Whether a completed free was announced by a `free_requested` (`Start::requests`).
    requests: bool,
    i: usize,
}

impl WalkStream {
    pub fn new(start: Start) -> WalkStream {
        let pw = PeakWalk::new(&start);
        let columns = Columns::new((pw.state.allocated_bytes, pw.state.reserved));
        WalkStream {
            ew: EvidenceWalk::new(&start),
            pw,
            start,
            sw: StartSegments::default(),
            segment_allocs: 0,
            segment_frees: 0,
            columns,
            ooms: Vec::new(),
            largest_request: 0,
            requests: false,
            i: 0,
        }
    }

    #[inline]
    pub fn step(&mut self, ev: &Event) {
        self.pw.step(ev);
        self.ew.step(ev);
        self.sw.step(ev);
        match ev.action {
            Action::SegmentAlloc | Action::SegmentMap => self.segment_allocs += 1,
            Action::SegmentFree | Action::SegmentUnmap => self.segment_frees += 1,
            Action::Oom => {
                self.ooms.push(self.i);
                self.largest_request = self.largest_request.max(ev.size);
            }
            Action::Alloc => self.largest_request = self.largest_request.max(ev.size),
            Action::FreeRequested => self.requests = true,
            _ => {}
        }
        self.columns
            .step((self.pw.state.allocated_bytes, self.pw.state.reserved));
        self.i += 1;
    }

    /// The walk of `dev`, whose events were all stepped.
    pub fn finish(self, dev: &Device) -> Walked {
        let mut start = self.start;
        start.requests = self.requests;
        let start_layout = self.sw.finish(dev, &start);
        let (evidence, releases) = self.ew.finish_with_releases();
        let (timeline, per) = self.columns.finish();
        Walked {
            peaks: self.pw.peaks,
            end: self.pw.state,
            evidence,
            releases,
            start_layout,
            segment_allocs: self.segment_allocs,
            segment_frees: self.segment_frees,
            timeline,
            per,
            ooms: self.ooms,
            start,
            largest_request: self.largest_request,
        }
    }
}

/// The timeline's columns, built without knowing how many events will come: columns of
/// `per` events, `per` a power of two doubled (each pair of columns merged into one) when
/// a column beyond [`BUCKETS`] would start. So `per` ends as the smallest power of two
/// that fits the trace in [`BUCKETS`] columns, each the maximum over its run of events,
/// exactly as if `per` had been known from the start.
struct Columns {
    points: Vec<(u64, u64)>,
    per: usize,
    cur: (u64, u64),
    in_cur: usize,
}

impl Columns {
    fn new(start: (u64, u64)) -> Columns {
        let mut points = Vec::with_capacity(BUCKETS + 1);
        points.push(start);
        Columns {
            points,
            per: 1,
            cur: (0, 0),
            in_cur: 0,
        }
    }

    #[inline]
    fn step(&mut self, v: (u64, u64)) {
        if self.in_cur == 0 && self.points.len() == BUCKETS + 1 {
            self.halve();
        }
        self.cur = (self.cur.0.max(v.0), self.cur.1.max(v.1));
        self.in_cur += 1;
        if self.in_cur == self.per {
            self.points.push(self.cur);
            self.cur = (0, 0);
            self.in_cur = 0;
        }
    }

    /// Merge each pair of columns (the first point, the start, stays as it is).
    #[cold]
    fn halve(&mut self) {
        let cols = &mut self.points[1..];
        let n = cols.len() / 2;
        for k in 0..n {
            let (a, b) = (cols[2 * k], cols[2 * k + 1]);
            cols[k] = (a.0.max(b.0), a.1.max(b.1));
        }
        self.points.truncate(n + 1);
        self.per *= 2;
    }

    fn finish(mut self) -> (Vec<(u64, u64)>, usize) {
        if self.in_cur > 0 {
            self.points.push(self.cur);
        }
        (self.points, self.per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_columns_made_without_the_count_are_those_of_the_smallest_power_of_two_that_fits() {
        for n in [0usize, 1, 799, 800, 801, 1600, 1601, 3203, 6400, 100_003] {
            let v = |i: usize| ((i * 7919) % 1013) as u64;
            let mut c = Columns::new((5, 6));
            (0..n).for_each(|i| c.step((v(i), v(i) / 2)));
            let (points, per) = c.finish();
            let want_per = (0..)
                .map(|k| 1usize << k)
                .find(|p| n.div_ceil(*p) <= BUCKETS);
            assert_eq!(Some(per), want_per, "{n} events");
            let mut want = vec![(5, 6)];
            want.extend((0..n).step_by(per).map(|s| {
                (s..(s + per).min(n)).fold((0, 0), |m, i| (m.0.max(v(i)), m.1.max(v(i) / 2)))
            }));
            assert_eq!(points, want, "{n} events");
        }
    }
}
