//! Free-block pools: cached, mapped, reusable blocks ordered by (stream, size, address), one
//! pool for small blocks and one for large blocks.
//!
//! Invariant: a block is in a pool exactly while its state is `Free`, under the key taken
//! from its stream, size and address at insertion (callers remove before changing them).

use std::collections::BTreeMap;

use super::block::BlockId;
use crate::device::{DevPtr, Stream};

/// One best-fit pool.
#[derive(Debug, Default)]
pub struct Pool {
    set: BTreeMap<(Stream, u64, DevPtr), BlockId>,
    /// Number of lookups so far (the garbage collector's clock).
    pub lookups: u64,
}

impl Pool {
    pub fn insert(&mut self, stream: Stream, size: u64, addr: DevPtr, id: BlockId) {
        self.set.insert((stream, size, addr), id);
    }

    pub fn remove(&mut self, stream: Stream, size: u64, addr: DevPtr) -> bool {
        self.set.remove(&(stream, size, addr)).is_some()
    }

    /// The smallest block of `stream` with at least `size` bytes (lowest address on ties).
    pub fn best_fit(&self, stream: Stream, size: u64) -> Option<(u64, BlockId)> {
        let ((s, sz, _), id) = self.set.range((stream, size, 0)..).next()?;
        (*s == stream).then_some((*sz, *id))
    }

    /// The largest blocks of `stream`, largest first.
    pub fn largest_first(&self, stream: Stream) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.set
            .range((stream, 0, 0)..=(stream, u64::MAX, u64::MAX))
            .rev()
            .map(|((_, sz, _), id)| (*sz, *id))
    }

    /// Every block id, in key order.
    pub fn ids(&self) -> Vec<BlockId> {
        self.set.values().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    pub fn clear(&mut self) {
        self.set.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_is_smallest_sufficient_block_of_the_same_stream() {
        let mut p = Pool::default();
        p.insert(0, 4096, 100, 1);
        p.insert(0, 2048, 200, 2);
        p.insert(0, 2048, 50, 3);
        p.insert(7, 1024, 10, 4);
        assert_eq!(p.best_fit(0, 1024), Some((2048, 3)));
        assert_eq!(p.best_fit(0, 3000), Some((4096, 1)));
        assert_eq!(p.best_fit(0, 5000), None);
        assert_eq!(p.best_fit(7, 2048), None);
        assert_eq!(p.best_fit(3, 1), None);
        assert_eq!(p.largest_first(0).next(), Some((4096, 1)));
    }
}
