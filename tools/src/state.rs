//! The one set of rules that turns allocator events into memory state: which blocks are
//! allocated, which wait for their free to complete, how many bytes segments reserve, and
//! what each peak counts. Every walk of the tools applies events through here: the
//! analyses' timeline (`summary`, `report`, `replay`'s recorded row), the categories and
//! steps, `snapshot LOG` and the export; what each keeps beside the state (a block's stack,
//! category or site; a segment's row) is the block or segment type it gives.
//!
//! The rules, forward:
//! - `alloc` makes a block **allocated** at its address (one already there is replaced:
//!   its bytes leave, it is the one the event displaced).
//! - `free_requested` moves the allocated block at the address to **pending**: the program
//!   freed it, the allocator still waits for other streams' use to finish. Pending bytes
//!   are not allocated bytes (PyTorch's `allocated_bytes` counts them neither). A request
//!   for an address not allocated changes nothing.
//! - `free_completed` ends the block at the address: the pending one if there is one, else
//!   the allocated one (a trace without `free_requested`, older PyTorch or another tool's
//!   log, frees at `free_completed` directly). One for an unknown address changes nothing.
//! - `segment_alloc`/`segment_map` add their size to the **reserved** bytes and
//!   `segment_free`/`segment_unmap` take it away (an expandable segment's mapping is
//!   reserved memory like a segment); [`Segments`] keeps the segments themselves by address
//!   for the walks that show them.
//! - `oom`, `snapshot`, `pause`, `resume` change no state.
//!
//! Backward ([`Memory::undo`], to find the state at a trace's start from a snapshot's end
//! state): the same rules reversed; a free undone makes its block live again with the
//! event's size and stack, pending when the trace marks frees with `free_requested`.
//!
//! The peaks, named for what they count:
//! - **peak allocated**: the most bytes in allocated blocks after any event (pending ones
//!   excluded), and the first event after which it was reached: `summary`'s and `report`'s
//!   peak, the moment the categories and the flame graph show.
//! - **peak active**: the most bytes in allocated and pending blocks together (the memory
//!   the program's blocks still hold), all devices together: `snapshot LOG --peak`.
//! - **peak reserved**: the most bytes in segments.
//!
//! Why one place: each walk had its own copy of these rules, and they drifted (one counted
//! pending bytes as allocated, one let a free of a pending block through); the figures of
//! one input must agree whichever command shows them. Counts never underflow: an event
//! that contradicts the state (a free of an unknown block) changes nothing, and the walks
//! that care count it.

use cushim::alloc::AddrMap;
use cushim::trace::event::Action;
use std::collections::BTreeMap;

/// What a walk keeps per block: at least its size (cloned only when a block moves to
/// pending: the walks' blocks are a few words).
pub trait Block: Clone {
    fn size(&self) -> u64;
}

/// What an event did to the blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change<T> {
    /// Nothing (an event that is not a block's, or one that contradicts the state).
    None,
    /// A block was allocated; `replaced` is the allocated block it displaced, if any.
    Allocated { replaced: Option<T> },
    /// The allocated block moved to pending.
    Requested(T),
    /// The block ended; `pending` says whether it was pending (else allocated).
    Completed { block: T, pending: bool },
}

impl<T> Change<T> {
    /// The block that left the allocated blocks, if one did.
    pub fn left_allocated(self) -> Option<T> {
        match self {
            Change::Allocated { replaced } => replaced,
            Change::Requested(b) => Some(b),
            Change::Completed { block, pending } => (!pending).then_some(block),
            Change::None => None,
        }
    }
}

/// The memory of one device at one moment: its allocated and pending blocks by address,
/// their bytes, and the reserved bytes.
#[derive(Debug, Clone)]
pub struct Memory<T> {
    /// Keyed by address, with the engine's address hasher (the walks look blocks up once
    /// or twice per event).
    pub allocated: AddrMap<T>,
    pub pending: AddrMap<T>,
    pub allocated_bytes: u64,
    pub pending_bytes: u64,
    pub reserved: u64,
}

impl<T> Default for Memory<T> {
    fn default() -> Self {
        Memory {
            allocated: AddrMap::default(),
            pending: AddrMap::default(),
            allocated_bytes: 0,
            pending_bytes: 0,
            reserved: 0,
        }
    }
}

impl<T: Block> Memory<T> {
    /// Bytes of allocated and pending blocks (what peak active counts).
    #[inline]
    pub fn active_bytes(&self) -> u64 {
        self.allocated_bytes.saturating_add(self.pending_bytes)
    }

    /// Put `b` at `addr`, allocated or `pending`; the block it replaced, if any.
    #[inline]
    pub fn add(&mut self, pending: bool, addr: u64, b: T) -> Option<T> {
        let (map, bytes) = if pending {
            (&mut self.pending, &mut self.pending_bytes)
        } else {
            (&mut self.allocated, &mut self.allocated_bytes)
        };
        let size = b.size();
        let old = map.insert(addr, b);
        if let Some(o) = &old {
            *bytes = bytes.saturating_sub(o.size());
        }
        *bytes = bytes.saturating_add(size);
        old
    }

    /// Take the allocated or `pending` block at `addr`.
    #[inline]
    pub fn take(&mut self, pending: bool, addr: u64) -> Option<T> {
        let (map, bytes) = if pending {
            (&mut self.pending, &mut self.pending_bytes)
        } else {
            (&mut self.allocated, &mut self.allocated_bytes)
        };
        let b = map.remove(&addr)?;
        *bytes = bytes.saturating_sub(b.size());
        Some(b)
    }

    /// Apply one event forward (the rules at the head of this file); `make` gives an
    /// allocation's block.
    #[inline]
    pub fn apply(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        make: impl FnOnce() -> T,
    ) -> Change<T> {
        match action {
            Action::Alloc => Change::Allocated {
                replaced: self.add(false, addr, make()),
            },
            Action::FreeRequested => match self.take(false, addr) {
                Some(b) => {
                    self.add(true, addr, b.clone());
                    Change::Requested(b)
                }
                None => Change::None,
            },
            Action::FreeCompleted => {
                if let Some(block) = self.take(true, addr) {
                    return Change::Completed {
                        block,
                        pending: true,
                    };
                }
                match self.take(false, addr) {
                    Some(block) => Change::Completed {
                        block,
                        pending: false,
                    },
                    None => Change::None,
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                self.reserved = self.reserved.saturating_add(size);
                Change::None
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.reserved = self.reserved.saturating_sub(size);
                Change::None
            }
            Action::Oom | Action::Snapshot | Action::Pause | Action::Resume => Change::None,
        }
    }

    /// Undo one event (newest first, from a later state); `before` gives the block a free
    /// makes live again, `requests` whether the trace marks frees with `free_requested`.
    /// Returns whether the event agreed with the state (an allocation of a block not there,
    /// a segment bigger than the reserved bytes, do not).
    pub fn undo(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        requests: bool,
        before: impl FnOnce() -> T,
    ) -> bool {
        match action {
            Action::Alloc => self.take(false, addr).is_some() || self.take(true, addr).is_some(),
            Action::FreeRequested => {
                let b = self.take(true, addr).unwrap_or_else(before);
                self.add(false, addr, b);
                true
            }
            Action::FreeCompleted => {
                self.add(requests, addr, before());
                true
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                let ok = self.reserved >= size;
                self.reserved = self.reserved.saturating_sub(size);
                ok
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.reserved = self.reserved.saturating_add(size);
                true
            }
            Action::Oom | Action::Snapshot | Action::Pause | Action::Resume => true,
        }
    }
}

/// Segments (and expandable mappings) by address, for the walks that show them: made by
/// `segment_alloc`/`segment_map`, ended by `segment_free`/`segment_unmap` at their address.
#[derive(Debug, Clone)]
pub struct Segments<S> {
    pub by_addr: BTreeMap<u64, S>,
}

impl<S> Default for Segments<S> {
    fn default() -> Self {
        Segments {
            by_addr: BTreeMap::new(),
        }
    }
}

impl<S> Segments<S> {
    /// Apply one event: a segment event adds (`make`) or ends one; the one it ended (or
    /// replaced) is handed back.
    pub fn apply(&mut self, action: Action, addr: u64, make: impl FnOnce() -> S) -> Option<S> {
        match action {
            Action::SegmentAlloc | Action::SegmentMap => self.by_addr.insert(addr, make()),
            Action::SegmentFree | Action::SegmentUnmap => self.by_addr.remove(&addr),
            _ => None,
        }
    }

    /// The segment starting at or before `addr` whose `size` covers it.
    pub fn containing(&self, addr: u64, size: impl Fn(&S) -> u64) -> Option<(u64, &S)> {
        let (&a, s) = self.by_addr.range(..=addr).next_back()?;
        (addr < a.saturating_add(size(s))).then_some((a, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct B(u64);
    impl Block for B {
        fn size(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_requested_free_is_pending_not_allocated_until_it_completes() {
        let mut m = Memory::<B>::default();
        m.apply(Action::SegmentAlloc, 0, 100, || B(0));
        m.apply(Action::Alloc, 8, 10, || B(10));
        assert_eq!(
            (m.allocated_bytes, m.pending_bytes, m.reserved),
            (10, 0, 100)
        );
        assert_eq!(
            m.apply(Action::FreeRequested, 8, 10, || B(10)),
            Change::Requested(B(10))
        );
        assert_eq!(
            (m.allocated_bytes, m.pending_bytes, m.active_bytes()),
            (0, 10, 10)
        );
        let c = m.apply(Action::FreeCompleted, 8, 10, || B(10));
        assert_eq!(c.left_allocated(), None);
        assert_eq!((m.allocated_bytes, m.pending_bytes), (0, 0));
        // Without a request, the completion frees the allocated block.
        m.apply(Action::Alloc, 16, 4, || B(4));
        let c = m.apply(Action::FreeCompleted, 16, 4, || B(4));
        assert_eq!(c.left_allocated(), Some(B(4)));
        // A free of an unknown block changes nothing.
        assert_eq!(m.apply(Action::FreeCompleted, 99, 4, || B(4)), Change::None);
        assert_eq!(m.allocated_bytes, 0);
    }

    #[test]
    fn undoing_a_walk_gives_back_the_state_it_started_from() {
        let evs = [
            (Action::SegmentAlloc, 0, 100),
            (Action::Alloc, 8, 10),
            (Action::Alloc, 32, 5),
            (Action::FreeRequested, 8, 10),
            (Action::FreeCompleted, 8, 10),
        ];
        let mut m = Memory::<B>::default();
        for (a, addr, size) in evs {
            m.apply(a, addr, size, || B(size));
        }
        for (a, addr, size) in evs.iter().rev() {
            assert!(m.undo(*a, *addr, *size, true, || B(*size)));
        }
        assert_eq!((m.allocated_bytes, m.pending_bytes, m.reserved), (0, 0, 0));
    }
}
