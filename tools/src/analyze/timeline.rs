//! The state at the start of a device's trace, and the walk forward from it.
//!
//! Policy: the trace may begin after blocks were already live (the history ring wrapped,
//! or recording started late). The start is found as the viewer finds it: from the state at
//! the end (the segments), undo every event newest first. A block live at the start whose
//! allocation the trace did not see has no known allocation site: it keeps the stack of
//! the block (if it is still live at the end) or of the free that released it, and is
//! flagged `before_trace`. The rules that apply (and undo) an event, what is pending and
//! what each peak counts are `crate::state`'s, shared by every walk of the tools. Events
//! that contradict the state (an allocation undone that is not there) are counted, not
//! fatal.

use crate::analyze::model::{BlockState, Device, Event, Snapshot};
use crate::state::{Block, Memory};
use cushim::trace::event::Action;

/// One live block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Live {
    pub size: u64,
    pub stack: u32,
    /// Allocated before the trace began (its allocation site is not known).
    pub before_trace: bool,
}

impl Block for Live {
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
}

/// The memory of one device at one moment (the rules that change it: `crate::state`).
pub type State = Memory<Live>;

/// The state at the start of a device's trace, and how many events contradicted it.
#[derive(Debug, Clone, Default)]
pub struct Start {
    pub state: State,
    pub inconsistent: u64,
    /// Whether frees go through `free_requested` (else `free_completed` frees).
    pub requests: bool,
}

/// Whether `dev`'s trace marks frees with `free_requested`.
pub fn uses_requests(dev: &Device) -> bool {
    dev.events.iter().any(|e| e.action == Action::FreeRequested)
}

/// The state at the end: the segments as recorded.
pub fn end_state(dev: &Device) -> State {
    let mut s = State::default();
    for seg in &dev.segments {
        s.reserved = s.reserved.saturating_add(seg.total_size);
        for b in &seg.blocks {
            let l = Live {
                size: b.size,
                stack: b.stack,
                before_trace: false,
            };
            match b.state {
                BlockState::Allocated => {
                    s.add(false, b.address, l);
                }
                BlockState::PendingFree => {
                    s.add(true, b.address, l);
                }
                BlockState::Inactive => {}
            }
        }
    }
    s
}

/// The start of `dev`'s trace in `snap`: empty for a log (it has no end state to undo
/// from, and it records every block from its allocation), else [`start`].
pub fn start_of(snap: &Snapshot, dev: &Device) -> Start {
    if snap.has_state {
        start(dev)
    } else {
        Start {
            requests: uses_requests(dev),
            ..Default::default()
        }
    }
}

/// Undo `dev`'s events newest first from its end state (`Memory::undo`).
pub fn start(dev: &Device) -> Start {
    let requests = uses_requests(dev);
    let mut s = end_state(dev);
    let mut inconsistent = 0;
    for ev in dev.events.iter().rev() {
        let before = || Live {
            size: ev.size,
            stack: ev.stack,
            before_trace: true,
        };
        if !s.undo(ev.action, ev.addr, ev.size, requests, before) {
            inconsistent += 1;
        }
    }
    Start {
        state: s,
        inconsistent,
        requests,
    }
}

/// Apply one event to `s` (`Memory::apply`).
#[inline]
pub fn apply(s: &mut State, ev: &Event) {
    s.apply(ev.action, ev.addr, ev.size, || Live {
        size: ev.size,
        stack: ev.stack,
        before_trace: false,
    });
}

/// Peaks over a device's recorded window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Peaks {
    pub allocated: u64,
    pub reserved: u64,
    /// Events applied when allocated first reached its peak (0: at the start).
    pub allocated_at: usize,
    pub ooms: u64,
}

/// The walk of [`peaks`], fed an event at a time (so that it shares one walk of the trace
/// with other analyses); its state is the state at the end once every event was fed.
#[derive(Debug, Clone)]
pub struct PeakWalk {
    pub state: State,
    pub peaks: Peaks,
    n: usize,
}

impl PeakWalk {
    pub fn new(start: &Start) -> PeakWalk {
        let s = start.state.clone();
        PeakWalk {
            peaks: Peaks {
                allocated: s.allocated_bytes,
                reserved: s.reserved,
                allocated_at: 0,
                ooms: 0,
            },
            state: s,
            n: 0,
        }
    }

    #[inline]
    pub fn step(&mut self, ev: &Event) {
        let (s, p) = (&mut self.state, &mut self.peaks);
        apply(s, ev);
        self.n += 1;
        if ev.action == Action::Oom {
            p.ooms += 1;
        }
        if s.allocated_bytes > p.allocated {
            p.allocated = s.allocated_bytes;
            p.allocated_at = self.n;
        }
        p.reserved = p.reserved.max(s.reserved);
    }
}

/// Walk `dev`'s trace forward from `start` and find its peaks.
pub fn peaks(dev: &Device, start: &Start) -> Peaks {
    peaks_and_end(dev, start).0
}

/// [`peaks`], and the state after the whole trace, in one walk.
pub fn peaks_and_end(dev: &Device, start: &Start) -> (Peaks, State) {
    let mut w = PeakWalk::new(start);
    dev.events
        .for_each_slice(|evs| evs.iter().for_each(|e| w.step(e)));
    (w.peaks, w.state)
}

/// The state after the first `n` events of `dev`'s trace.
pub fn state_after(dev: &Device, start: &Start, n: usize) -> State {
    let mut s = start.state.clone();
    dev.events
        .for_each_slice_upto(n, |evs| evs.iter().for_each(|e| apply(&mut s, e)));
    s
}
