//! The history ring: the newest `max_entries` trace events of one allocator.
//!
//! Invariant: `events()` returns exactly the newest `min(recorded, max_entries)` events that
//! passed the filters (`enabled`, `record_cuda`/`record_host`, `skip_actions`), oldest first;
//! entries whose action carries no frames under `context` have their stack cleared. Once the
//! ring has reached `max_entries`, `record` never allocates (it overwrites the oldest slot).

use crate::config::history::HistoryConf;
use crate::trace::event::{Action, EventSink, TraceEvent, NO_STACK};
use crate::trace::range::NO_RANGE;

/// Bit set of actions whose trace entries keep their stack.
fn frame_mask(conf: &HistoryConf) -> u16 {
    Action::ALL
        .iter()
        .filter(|a| conf.trace_frames_for(**a))
        .fold(0, |m, a| m | a.bit())
}

/// A bounded ring of trace events; an [`EventSink`].
#[derive(Debug, Clone)]
pub struct TraceRing {
    on: bool,
    skip: u16,
    keep_stack: u16,
    max: usize,
    buf: Vec<TraceEvent>,
    /// Index of the oldest event once `buf.len() == max`.
    head: usize,
}

/// Slots reserved at the first event: warm-up growth beyond this doubles up to `max`.
const INITIAL_SLOTS: usize = 4096;

impl TraceRing {
    /// The ring of a device allocator (records when history is on and `record_cuda`).
    pub fn for_device(conf: &HistoryConf) -> TraceRing {
        TraceRing::with(conf, conf.record_cuda)
    }

    /// The ring of the pinned-host allocator (records when history is on and `record_host`).
    pub fn for_host(conf: &HistoryConf) -> TraceRing {
        TraceRing::with(conf, conf.record_host)
    }

    fn with(conf: &HistoryConf, this_kind: bool) -> TraceRing {
        TraceRing {
            on: conf.records_history() && this_kind,
            skip: conf.skip_actions,
            keep_stack: frame_mask(conf),
            max: conf.max_entries.max(1),
            buf: Vec::new(),
            head: 0,
        }
    }

    /// Number of events held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// No events held.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Drop every event (keeps the storage).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
    }

    /// Copy the events, oldest first, into `out` (which is cleared first). Lets a live dump
    /// copy under the allocator's lock into storage it reuses.
    pub fn copy_into(&self, out: &mut Vec<TraceEvent>) {
        out.clear();
        out.reserve(self.buf.len());
        out.extend_from_slice(&self.buf[self.head..]);
        out.extend_from_slice(&self.buf[..self.head]);
    }
}

impl EventSink for TraceRing {
    fn enabled(&self) -> bool {
        self.on
    }

    fn record(&mut self, mut ev: TraceEvent) {
        if !self.on || self.skip & ev.action.bit() != 0 {
            return;
        }
        if self.keep_stack & ev.action.bit() == 0 {
            ev.stack = NO_STACK;
        }
        if ev.range == NO_RANGE {
            ev.range = crate::trace::range::current();
        }
        if self.buf.len() < self.max {
            if self.buf.capacity() == self.buf.len() {
                let grow = self
                    .buf
                    .len()
                    .max(INITIAL_SLOTS)
                    .min(self.max - self.buf.len());
                self.buf.reserve_exact(grow);
            }
            self.buf.push(ev);
        } else {
            self.buf[self.head] = ev;
            self.head += 1;
            if self.head == self.max {
                self.head = 0;
            }
        }
    }

    fn events(&self) -> Vec<TraceEvent> {
        let mut v = Vec::new();
        self.copy_into(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::history::parse;

    fn ev(action: Action, addr: u64) -> TraceEvent {
        TraceEvent {
            action,
            device: 0,
            addr,
            size: 512,
            stream: 0,
            time_us: addr as i64,
            stack: 7,
            device_free: 0,
            range: 0,
        }
    }

    #[test]
    fn max_entries_keeps_exactly_the_newest_n_oldest_first() {
        let mut r = TraceRing::for_device(&parse("enabled=all,max_entries=5").unwrap());
        for i in 0..13 {
            r.record(ev(Action::Alloc, i));
        }
        let addrs: Vec<u64> = r.events().iter().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![8, 9, 10, 11, 12]);
    }

    #[test]
    fn fewer_events_than_max_are_all_kept() {
        let mut r = TraceRing::for_device(&parse("enabled=all,max_entries=100").unwrap());
        for i in 0..3 {
            r.record(ev(Action::Alloc, i));
        }
        assert_eq!(
            r.events().iter().map(|e| e.addr).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn full_ring_overwrites_without_reallocating() {
        let mut r = TraceRing::for_device(&parse("enabled=all,max_entries=10000").unwrap());
        for i in 0..10_000 {
            r.record(ev(Action::Alloc, i));
        }
        let (ptr, cap) = (r.buf.as_ptr(), r.buf.capacity());
        assert_eq!(cap, 10_000);
        for i in 0..50_000 {
            r.record(ev(Action::FreeRequested, i));
        }
        assert_eq!((r.buf.as_ptr(), r.buf.capacity()), (ptr, cap));
        assert_eq!(r.events().last().unwrap().addr, 49_999);
    }

    #[test]
    fn skip_actions_are_not_recorded() {
        let mut r =
            TraceRing::for_device(&parse("enabled=all,skip_actions=free_requested|oom").unwrap());
        for a in Action::ALL {
            r.record(ev(a, 1));
        }
        let got: Vec<Action> = r.events().iter().map(|e| e.action).collect();
        assert_eq!(got.len(), Action::ALL.len() - 2);
        assert!(!got.contains(&Action::FreeRequested) && !got.contains(&Action::Oom));
    }

    #[test]
    fn enabled_state_and_none_record_nothing() {
        for s in ["enabled=state", "enabled=none", ""] {
            let mut r = TraceRing::for_device(&parse(s).unwrap());
            assert!(!r.enabled());
            r.record(ev(Action::Alloc, 1));
            assert!(r.events().is_empty(), "{s}");
        }
    }

    #[test]
    fn record_host_and_record_cuda_gate_their_rings() {
        let c = parse("enabled=all,record_cuda=false").unwrap();
        assert!(!TraceRing::for_device(&c).enabled());
        assert!(!TraceRing::for_host(&c).enabled());
        let c = parse("enabled=all,record_host=true").unwrap();
        assert!(TraceRing::for_device(&c).enabled() && TraceRing::for_host(&c).enabled());
    }

    #[test]
    fn context_alloc_clears_stacks_of_free_entries() {
        let mut r = TraceRing::for_device(&parse("enabled=all,context=alloc").unwrap());
        r.record(ev(Action::Alloc, 1));
        r.record(ev(Action::FreeCompleted, 1));
        let e = r.events();
        assert_eq!((e[0].stack, e[1].stack), (7, NO_STACK));
        let mut r = TraceRing::for_device(&parse("enabled=all,context=state").unwrap());
        r.record(ev(Action::Alloc, 1));
        assert_eq!(r.events()[0].stack, NO_STACK);
    }
}
