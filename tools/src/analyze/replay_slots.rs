//! The recorded addresses of a trace numbered once for several replays of it.
//!
//! Policy: every replay of a trace keeps, per recorded block, what the engine gave it in
//! its place. Looked up by address in each replay, that is a hash lookup per event per
//! configuration, which cost as much as the engine's own work; the replays a thread runs
//! together see the same events, so the thread numbers each live recorded address once (a
//! slot) and every replay keeps its blocks in a table indexed by slot. An address gets its
//! slot at its allocation (or when seeding finds it live) and gives it back at its
//! completed free, for reuse by a later address; the slot of each event of a chunk is
//! found once, before the replays step through the chunk, so an event later in the chunk
//! may reuse a slot an earlier one gave back (each replay steps in order, so it has let
//! the slot go by then).

use crate::analyze::model::Event;
use cushim::alloc::AddrMap;
use cushim::trace::event::Action;

/// An event without a slot (not an allocation or a free of a known address).
pub const NONE: u32 = u32::MAX;

/// Recorded address -> slot, for the live addresses.
#[derive(Debug, Default)]
pub struct Slots {
    map: AddrMap<u32>,
    free: Vec<u32>,
    next: u32,
}

impl Slots {
    /// The slot of `addr`, given one if it has none.
    pub fn assign(&mut self, addr: u64) -> u32 {
        let (free, next) = (&mut self.free, &mut self.next);
        *self.map.entry(addr).or_insert_with(|| {
            free.pop().unwrap_or_else(|| {
                *next += 1;
                *next - 1
            })
        })
    }

    /// Slots in use or given back so far (a table indexed by slot needs this many).
    pub fn len(&self) -> usize {
        self.next as usize
    }

    pub fn is_empty(&self) -> bool {
        self.next == 0
    }

    /// The slot of each of `evs` into `out` (cleared first), in order: an allocation's
    /// address gets one, a completed free gives its address's back.
    pub fn of_chunk(&mut self, evs: &[Event], out: &mut Vec<u32>) {
        out.clear();
        out.reserve(evs.len());
        for ev in evs {
            out.push(match ev.action {
                Action::Alloc => self.assign(ev.addr),
                Action::FreeRequested => self.map.get(&ev.addr).copied().unwrap_or(NONE),
                Action::FreeCompleted => match self.map.remove(&ev.addr) {
                    Some(s) => {
                        self.free.push(s);
                        s
                    }
                    None => NONE,
                },
                _ => NONE,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: Action, addr: u64) -> Event {
        Event {
            action,
            addr,
            size: 512,
            stream: 0,
            stack: 0,
        }
    }

    #[test]
    fn a_freed_address_gives_its_slot_to_the_next_new_address() {
        let mut s = Slots::default();
        let mut out = Vec::new();
        let evs = [
            ev(Action::Alloc, 0x100),
            ev(Action::Alloc, 0x200),
            ev(Action::FreeRequested, 0x100),
            ev(Action::FreeCompleted, 0x100),
            ev(Action::Alloc, 0x300),
            ev(Action::FreeCompleted, 0x999),
            ev(Action::Alloc, 0x200),
        ];
        s.of_chunk(&evs, &mut out);
        assert_eq!(out, vec![0, 1, 0, 0, 0, NONE, 1]);
        assert_eq!(s.len(), 2);
    }
}
