//! Blocks: contiguous address ranges of a segment (or of an expandable reservation), kept in
//! an arena and linked to their address neighbours.
//!
//! Invariant: the blocks of one segment (or reservation) form a doubly linked chain in
//! address order with no gaps (`a.addr + a.size == a.next.addr`); a chain never crosses
//! segments. Ids of removed blocks are reused, so an id is valid only while its block lives.

use std::collections::BTreeMap;

use crate::device::{DevPtr, Stream};
use crate::trace::event::StackId;

/// Index of a block in the [`Arena`].
pub type BlockId = u32;

/// What a block is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Cached, mapped and reusable (in a pool).
    Free,
    /// Handed to the program.
    Allocated,
    /// Freed by the program; reusable once its pending-free batch completes.
    Pending,
    /// Address space of an expandable reservation with no physical memory behind it.
    Unmapped,
}

/// One block.
#[derive(Debug, Clone)]
pub struct Block {
    pub addr: DevPtr,
    pub size: u64,
    /// Bytes the program asked for (0 unless allocated or pending).
    pub requested: u64,
    /// The stream that owns the block (its pool key).
    pub stream: Stream,
    pub state: State,
    pub prev: Option<BlockId>,
    pub next: Option<BlockId>,
    /// Large pool (or large-pool reservation).
    pub large: bool,
    /// Index of the expandable reservation holding the block, if any.
    pub res: Option<u32>,
    /// Stack of the allocation that last used the block.
    pub stack: StackId,
    /// The pool's lookup count when the block entered it (garbage-collection age base).
    pub gc_base: u64,
    /// Whether the block was counted in `inactive_split` when it entered its pool.
    pub counted_split: bool,
    /// [`Arena::tick`] when the block last entered its pool (the cache cap's age: the
    /// smallest value among whole free segments is the one cached longest).
    pub cached_at: u64,
}

impl Block {
    pub fn new(addr: DevPtr, size: u64, stream: Stream, large: bool, state: State) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            state,
            prev: None,
            next: None,
            large,
            res: None,
            stack: 0,
            gc_base: 0,
            counted_split: false,
            cached_at: 0,
        }
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.addr + self.size
    }

    /// Whether the block shares its segment with other blocks.
    pub fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// Storage for blocks, with id reuse, and an address index of expandable-reservation blocks
/// (those with `res` set when inserted).
#[derive(Debug, Default)]
pub struct Arena {
    slots: Vec<Block>,
    vacant: Vec<BlockId>,
    index: BTreeMap<DevPtr, BlockId>,
    clock: u64,
}

impl Arena {
    /// A device-wide clock, one tick per pool insertion (see `Block::cached_at`).
    #[inline]
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub fn insert(&mut self, b: Block) -> BlockId {
        let (addr, indexed) = (b.addr, b.res.is_some());
        let id = if let Some(id) = self.vacant.pop() {
            self.slots[id as usize] = b;
            id
        } else {
            self.slots.push(b);
            (self.slots.len() - 1) as BlockId
        };
        if indexed {
            self.index.insert(addr, id);
        }
        id
    }

    /// Forget a block (its neighbours must already be relinked).
    pub fn remove(&mut self, id: BlockId) {
        let b = &self.slots[id as usize];
        if b.res.is_some() && self.index.get(&b.addr) == Some(&id) {
            self.index.remove(&b.addr);
        }
        self.vacant.push(id);
    }

    /// Remove every block.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.vacant.clear();
        self.index.clear();
    }

    /// The expandable-reservation block containing `addr`.
    pub fn find(&self, addr: DevPtr) -> Option<BlockId> {
        let (_, &id) = self.index.range(..=addr).next_back()?;
        (self.slots[id as usize].end() > addr).then_some(id)
    }

    /// Split `id` at `at` bytes from its start; the new block (returned) takes the tail and
    /// copies the head's stream, pool, reservation and state.
    pub fn split(&mut self, id: BlockId, at: u64) -> BlockId {
        let head = &self.slots[id as usize];
        debug_assert!(at > 0 && at < head.size);
        let mut tail = Block::new(
            head.addr + at,
            head.size - at,
            head.stream,
            head.large,
            head.state,
        );
        tail.res = head.res;
        tail.prev = Some(id);
        tail.next = head.next;
        let tail_id = self.insert(tail);
        if let Some(n) = self.slots[tail_id as usize].next {
            self.slots[n as usize].prev = Some(tail_id);
        }
        let head = &mut self.slots[id as usize];
        head.size = at;
        head.next = Some(tail_id);
        tail_id
    }

    /// Merge `next` (the address successor of `id`) into `id` and remove it.
    pub fn absorb_next(&mut self, id: BlockId) {
        let Some(n) = self.slots[id as usize].next else {
            return;
        };
        let (nsize, nnext) = {
            let nb = &self.slots[n as usize];
            (nb.size, nb.next)
        };
        let b = &mut self.slots[id as usize];
        b.size += nsize;
        b.next = nnext;
        if let Some(nn) = nnext {
            self.slots[nn as usize].prev = Some(id);
        }
        self.remove(n);
    }
}

impl std::ops::Index<BlockId> for Arena {
    type Output = Block;
    fn index(&self, id: BlockId) -> &Block {
        &self.slots[id as usize]
    }
}

impl std::ops::IndexMut<BlockId> for Arena {
    fn index_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.slots[id as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_absorb_keep_the_chain_contiguous() {
        let mut a = Arena::default();
        let id = a.insert(Block::new(4096, 8192, 0, true, State::Free));
        let t = a.split(id, 1024);
        assert_eq!(a[id].end(), a[t].addr);
        assert_eq!(a[t].size, 7168);
        assert_eq!(a[t].prev, Some(id));
        let t2 = a.split(t, 1024);
        assert_eq!(a[t2].prev, Some(t));
        a.absorb_next(id);
        assert_eq!(a[id].size, 2048);
        assert_eq!(a[id].next, Some(t2));
        assert_eq!(a[t2].prev, Some(id));
    }
}
