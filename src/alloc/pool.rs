//! Free-block pools: cached, mapped, reusable blocks ordered by (stream, size, address), one
//! pool for small blocks and one for large blocks.
//!
//! Invariant: a block is in a pool exactly while its state is `Free`, under the key taken
//! from its stream, size and address at insertion (callers remove before changing them).
//! The entries are kept in key order in one of two stores holding the same set: a sorted
//! vector while the pool is small, a B-tree once it outgrows [`SPILL`] entries (and again a
//! vector once it shrinks below [`UNSPILL`]). Which store holds them never changes a result.
//!
//! Why two stores: a cached malloc+free pair removes and inserts two or three entries of a
//! pool that usually holds a handful, and `BTreeMap`'s generic node code was a large share
//! of the pair there (BENCHMARKS.md, "Measurements behind design choices"); a binary search
//! and a short `memmove` in a vector cost a fraction of that. Large pools keep the tree's
//! logarithmic inserts, so a program with many thousands of cached fragments pays no
//! linear shifting.

use std::cell::Cell;
use std::collections::BTreeMap;

use super::block::BlockId;
use crate::device::{DevPtr, Stream};

/// Above this many entries the pool moves to the B-tree.
const SPILL: usize = 64;
/// Below this many entries a B-tree pool moves back to the vector.
const UNSPILL: usize = 16;

type Key = (Stream, u64, DevPtr);

#[derive(Debug)]
enum Store {
    /// Sorted by key, no duplicate keys.
    Vec(Vec<(Key, BlockId)>),
    Tree(BTreeMap<Key, BlockId>),
}

impl Default for Store {
    fn default() -> Store {
        Store::Vec(Vec::new())
    }
}

/// One best-fit pool.
#[derive(Debug, Default)]
pub struct Pool {
    store: Store,
    /// Number of lookups so far (the garbage collector's clock).
    pub lookups: u64,
    /// Bumped by every insertion and removal: equal versions mean equal contents.
    version: u64,
    /// The last [`Pool::would_pick`] question, with the version it was asked at, and its
    /// answer. A cached pair asks the same question of an unchanged pool every time; the
    /// answer depends on nothing else, so it is reused instead of searched again.
    memo: Cell<Option<(Question, u64, bool)>>,
}

/// What [`Pool::would_pick`] is asked: stream, size, candidate, gone entry.
type Question = (Stream, u64, (u64, DevPtr), Option<(u64, DevPtr)>);

/// Index of the first vector entry whose key is not below `key`.
#[inline]
fn lower_bound(v: &[(Key, BlockId)], key: &Key) -> usize {
    v.partition_point(|(k, _)| k < key)
}

impl Pool {
    pub fn insert(&mut self, stream: Stream, size: u64, addr: DevPtr, id: BlockId) {
        self.version += 1;
        let key = (stream, size, addr);
        match &mut self.store {
            Store::Vec(v) => {
                let i = lower_bound(v, &key);
                if v.get(i).is_some_and(|(k, _)| *k == key) {
                    v[i].1 = id;
                    return;
                }
                if v.len() >= SPILL {
                    let mut t: BTreeMap<Key, BlockId> = v.drain(..).collect();
                    t.insert(key, id);
                    self.store = Store::Tree(t);
                } else if i == v.len() {
                    v.push((key, id));
                } else {
                    v.insert(i, (key, id));
                }
            }
            Store::Tree(t) => {
                t.insert(key, id);
            }
        }
    }

    pub fn remove(&mut self, stream: Stream, size: u64, addr: DevPtr) -> bool {
        self.version += 1;
        let key = (stream, size, addr);
        match &mut self.store {
            Store::Vec(v) => {
                let i = lower_bound(v, &key);
                if v.get(i).is_some_and(|(k, _)| *k == key) {
                    // The last entry (often the only one) needs no shift.
                    if i + 1 == v.len() {
                        v.pop();
                    } else {
                        v.remove(i);
                    }
                    true
                } else {
                    false
                }
            }
            Store::Tree(t) => {
                let found = t.remove(&key).is_some();
                if t.len() < UNSPILL {
                    let v: Vec<(Key, BlockId)> = std::mem::take(t).into_iter().collect();
                    self.store = Store::Vec(v);
                }
                found
            }
        }
    }

    /// The smallest block of `stream` with at least `size` bytes (lowest address on ties).
    pub fn best_fit(&self, stream: Stream, size: u64) -> Option<(u64, BlockId)> {
        let ((s, sz, _), id) = match &self.store {
            Store::Vec(v) => {
                let (k, id) = v.get(lower_bound(v, &(stream, size, 0)))?;
                (*k, *id)
            }
            Store::Tree(t) => {
                let (k, id) = t.range((stream, size, 0)..).next()?;
                (*k, *id)
            }
        };
        (s == stream).then_some((sz, id))
    }

    /// Whether [`Self::best_fit`]`(stream, size)` would answer the block keyed
    /// `(stream, cand_size, cand_addr)` if that key were inserted (it is not in the pool)
    /// and the entry keyed `(stream, gone_size, gone_addr)` removed, when `gone` is given.
    /// Lets the deferred merge ask what the merged pool would answer without building it.
    #[inline]
    pub fn would_pick(
        &self,
        stream: Stream,
        size: u64,
        cand: (u64, DevPtr),
        gone: Option<(u64, DevPtr)>,
    ) -> bool {
        let question = (stream, size, cand, gone);
        if let Some((q, version, answer)) = self.memo.get() {
            if version == self.version && q == question {
                return answer;
            }
        }
        let answer = self.would_pick_search(stream, size, cand, gone);
        self.memo.set(Some((question, self.version, answer)));
        answer
    }

    fn would_pick_search(
        &self,
        stream: Stream,
        size: u64,
        (cand_size, cand_addr): (u64, DevPtr),
        gone: Option<(u64, DevPtr)>,
    ) -> bool {
        let gone = gone.map(|(sz, a)| (stream, sz, a));
        // Keys are unique, so the gone entry is skipped at most once.
        fn first_but(mut keys: impl Iterator<Item = Key>, gone: Option<Key>) -> Option<Key> {
            match keys.next() {
                Some(k) if Some(k) == gone => keys.next(),
                other => other,
            }
        }
        let first = match &self.store {
            Store::Vec(v) => first_but(
                v[lower_bound(v, &(stream, size, 0))..]
                    .iter()
                    .map(|(k, _)| *k),
                gone,
            ),
            Store::Tree(t) => first_but(t.range((stream, size, 0)..).map(|(k, _)| *k), gone),
        };
        match first {
            None => true,
            Some((s, sz, a)) => s != stream || (sz, a) > (cand_size, cand_addr),
        }
    }

    /// The largest blocks of `stream`, largest first.
    pub fn largest_first(&self, stream: Stream) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        let (vec_part, tree_part) = match &self.store {
            Store::Vec(v) => {
                let lo = v.partition_point(|((s, _, _), _)| *s < stream);
                let hi = v.partition_point(|((s, _, _), _)| *s <= stream);
                (Some(v[lo..hi].iter().rev()), None)
            }
            Store::Tree(t) => (
                None,
                Some(t.range((stream, 0, 0)..=(stream, u64::MAX, u64::MAX)).rev()),
            ),
        };
        vec_part
            .into_iter()
            .flatten()
            .map(|((_, sz, _), id)| (*sz, *id))
            .chain(
                tree_part
                    .into_iter()
                    .flatten()
                    .map(|((_, sz, _), id)| (*sz, *id)),
            )
    }

    /// Every block id, in key order.
    pub fn ids(&self) -> Vec<BlockId> {
        match &self.store {
            Store::Vec(v) => v.iter().map(|(_, id)| *id).collect(),
            Store::Tree(t) => t.values().copied().collect(),
        }
    }

    pub fn len(&self) -> usize {
        match &self.store {
            Store::Vec(v) => v.len(),
            Store::Tree(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.version += 1;
        self.store = Store::default();
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

    /// `would_pick` answers what `best_fit` answers on the pool with the candidate
    /// inserted and the gone entry removed, on random pools in both stores.
    #[test]
    fn would_pick_agrees_with_best_fit_on_the_modified_pool() {
        let mut rng = fastrand::Rng::with_seed(9);
        for round in 0..400 {
            let mut p = Pool::default();
            let n = if round % 2 == 0 { 6 } else { 80 };
            let mut keys = Vec::new();
            for i in 0..n {
                let k = (rng.u64(0..2), rng.u64(1..8) * 512, i * 4096 + 512);
                p.insert(k.0, k.1, k.2, i as BlockId);
                keys.push(k);
            }
            let stream = rng.u64(0..2);
            let size = rng.u64(1..8) * 512;
            // The deferred merge only asks about candidates big enough for the request.
            let cand = (size + rng.u64(0..6) * 512, rng.u64(0..n + 1) * 4096 + 1024);
            let gone = keys
                .iter()
                .filter(|k| k.0 == stream)
                .nth(rng.usize(0..3))
                .map(|k| (k.1, k.2));
            let mut q = Pool::default();
            for (i, k) in keys.iter().enumerate() {
                if Some((k.1, k.2)) != gone || k.0 != stream {
                    q.insert(k.0, k.1, k.2, i as BlockId);
                }
            }
            q.insert(stream, cand.0, cand.1, BlockId::MAX);
            let want = q.best_fit(stream, size).map(|(_, id)| id) == Some(BlockId::MAX);
            assert_eq!(
                p.would_pick(stream, size, cand, gone),
                want,
                "round {round}"
            );
        }
    }

    /// A remembered answer is never reused once the pool has changed.
    #[test]
    fn would_pick_forgets_its_answer_when_the_pool_changes() {
        let mut p = Pool::default();
        p.insert(0, 8192, 0x10000, 1);
        // Candidate of 4096 bytes at 0x20000: nothing smaller in the way.
        assert!(p.would_pick(0, 1024, (4096, 0x20000), None));
        assert!(p.would_pick(0, 1024, (4096, 0x20000), None));
        p.insert(0, 2048, 0x30000, 2);
        assert!(!p.would_pick(0, 1024, (4096, 0x20000), None));
        p.remove(0, 2048, 0x30000);
        assert!(p.would_pick(0, 1024, (4096, 0x20000), None));
        // A different question on the same pool is answered afresh.
        assert!(!p.would_pick(0, 1024, (16384, 0x20000), None));
    }

    /// The vector and the tree store give the same answers as a plain ordered map, across
    /// spills and unspills, for a random mix of inserts, removes and queries.
    #[test]
    fn both_stores_agree_with_an_ordered_map_across_spills() {
        let mut p = Pool::default();
        let mut model: BTreeMap<Key, BlockId> = BTreeMap::new();
        let mut rng = fastrand::Rng::with_seed(6);
        let mut spilled = false;
        let mut unspilled = false;
        for step in 0..20_000u32 {
            let stream = rng.u64(0..3);
            let size = rng.u64(1..40) * 512;
            let addr = rng.u64(0..64) * 4096;
            // Grow for a while, then shrink, then mix, so both thresholds are crossed.
            let grow = match step / 2000 {
                0 | 2 | 4 => 85,
                1 | 3 => 10,
                _ => 50,
            };
            if rng.u32(0..100) < grow {
                p.insert(stream, size, addr, step);
                model.insert((stream, size, addr), step);
            } else if let Some((&k, _)) = model.range((stream, size, 0)..).next() {
                assert!(p.remove(k.0, k.1, k.2));
                model.remove(&k);
            } else {
                assert!(!p.remove(stream, size, addr));
            }
            match p.store {
                Store::Tree(_) => spilled = true,
                Store::Vec(_) if spilled => unspilled = true,
                Store::Vec(_) => {}
            }
            assert_eq!(p.len(), model.len());
            let want = model
                .range((stream, size, 0)..)
                .next()
                .filter(|((s, _, _), _)| *s == stream)
                .map(|((_, sz, _), id)| (*sz, *id));
            assert_eq!(p.best_fit(stream, size), want);
            if step % 97 == 0 {
                let want: Vec<(u64, BlockId)> = model
                    .range((stream, 0, 0)..=(stream, u64::MAX, u64::MAX))
                    .rev()
                    .map(|((_, sz, _), id)| (*sz, *id))
                    .collect();
                assert_eq!(p.largest_first(stream).collect::<Vec<_>>(), want);
                assert_eq!(p.ids(), model.values().copied().collect::<Vec<_>>());
            }
        }
        assert!(
            spilled && unspilled,
            "spilled {spilled} unspilled {unspilled}"
        );
    }
}
