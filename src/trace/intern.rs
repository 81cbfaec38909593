//! Interned native stacks: identical stacks are stored once and named by a [`StackId`].
//!
//! Invariant: `intern(s)` returns the same non-zero id for equal non-empty slices `s` for
//! the life of the process, and `get(id)` returns exactly the slice that was interned.
//! A repeat `intern` of a known stack allocates nothing and takes one short lock at most
//! (none when it equals the calling thread's previous stack). Ids are never reused. Not
//! for signal handlers: it locks (the shim's signal handler only writes to a pipe).
//!
//! Bound (policy): the table holds at most `limit` distinct stacks (`CUSHIM_HISTORY`'s
//! `max_stacks`, default [`crate::config::history::DEFAULT_MAX_STACKS`]). Once full, a stack
//! not yet in it is not stored: its event is recorded without frames (`NO_STACK`) and
//! counted in [`StackTable::dropped`], which every snapshot reports (`cushim.stacks`).
//! Stacks already known keep their ids, so a program with a bounded set of call sites loses
//! nothing. Why stop rather than evict: an id is referenced from ring events and live blocks
//! under the allocator's locks, which interning must never take (it runs before them, and
//! `fork.rs` fixes that order); eviction would need per-event reference counts on the hot
//! path. Memory is then bounded by `limit * (max_frames * 8 + about 40)` bytes.

use crate::trace::event::{StackId, NO_STACK};
use once_cell::sync::Lazy;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A hasher for keys that already are hashes.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Hash of a stack (FxHash-style mixing; stacks are not attacker-controlled).
fn hash_frames(frames: &[u64]) -> u64 {
    let mut h: u64 = frames.len() as u64;
    for &f in frames {
        h = (h.rotate_left(5) ^ f).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    h
}

struct Inner {
    /// All frames of all stacks, back to back.
    arena: Vec<u64>,
    /// `(start, len, next id with the same hash)` of stack id `i + 1`.
    stacks: Vec<(usize, u32, StackId)>,
    /// Hash -> first id with that hash.
    by_hash: HashMap<u64, StackId, BuildHasherDefault<PassThrough>>,
    /// Most distinct stacks stored.
    limit: usize,
    /// Captures whose stack was new when the table was full.
    dropped: u64,
}

impl Default for Inner {
    fn default() -> Inner {
        Inner {
            arena: Vec::new(),
            stacks: Vec::new(),
            by_hash: HashMap::default(),
            limit: crate::config::history::DEFAULT_MAX_STACKS,
            dropped: 0,
        }
    }
}

impl Inner {
    fn slice(&self, id: StackId) -> Option<&[u64]> {
        let (start, len, _) = *self.stacks.get((id as usize).checked_sub(1)?)?;
        self.arena.get(start..start + len as usize)
    }

    fn find(&self, hash: u64, frames: &[u64]) -> Option<StackId> {
        let mut id = *self.by_hash.get(&hash)?;
        while id != NO_STACK {
            if self.slice(id) == Some(frames) {
                return Some(id);
            }
            id = self.stacks[id as usize - 1].2;
        }
        None
    }

    fn insert(&mut self, hash: u64, frames: &[u64]) -> StackId {
        if self.stacks.len() >= self.limit {
            self.dropped += 1;
            return NO_STACK;
        }
        let Ok(id) = StackId::try_from(self.stacks.len() + 1) else {
            self.dropped += 1;
            return NO_STACK; // 4 billion distinct stacks: stop interning, record none
        };
        let next = self.by_hash.insert(hash, id).unwrap_or(NO_STACK);
        let start = self.arena.len();
        self.arena.extend_from_slice(frames);
        self.stacks.push((start, frames.len() as u32, next));
        id
    }
}

/// The table's lock, held (see [`StackTable::hold_for_fork`]); dropping it releases it.
pub struct TableHold<'a> {
    _held: MutexGuard<'a, Inner>,
}

/// The table of interned stacks.
#[derive(Default)]
pub struct StackTable {
    inner: Mutex<Inner>,
}

thread_local! {
    /// The calling thread's last interned stack and its id (table address, id, frames).
    static LAST: RefCell<(usize, StackId, Vec<u64>)> = const { RefCell::new((0, NO_STACK, Vec::new())) };
}

static GLOBAL: Lazy<StackTable> = Lazy::new(StackTable::default);

impl StackTable {
    /// A new, empty table (tests; the process uses [`StackTable::global`]).
    pub fn new() -> StackTable {
        StackTable::default()
    }

    /// The process-wide table.
    pub fn global() -> &'static StackTable {
        &GLOBAL
    }

    /// The table's lock. A `std` mutex, not `parking_lot`'s: releasing it in a `fork` child
    /// whose parent had threads waiting must not touch parking_lot's global wait table, whose
    /// bucket locks another parent thread may have held at the fork. No poisoning: every
    /// critical section leaves the table consistent or panics before changing it.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold the table's lock (around `fork`: the child then finds it free and consistent).
    pub fn hold_for_fork(&self) -> TableHold<'_> {
        TableHold { _held: self.lock() }
    }

    /// The id of `frames` (innermost first), storing it if new. Empty: [`NO_STACK`].
    pub fn intern(&self, frames: &[u64]) -> StackId {
        if frames.is_empty() || frames.len() > u32::MAX as usize {
            return NO_STACK;
        }
        let me = self as *const StackTable as usize;
        let cached = LAST
            .try_with(|l| match l.try_borrow() {
                Ok(l) if l.0 == me && l.2 == frames => Some(l.1),
                _ => None,
            })
            .ok()
            .flatten();
        if let Some(id) = cached {
            return id;
        }
        let hash = hash_frames(frames);
        let id = {
            let mut inner = self.lock();
            match inner.find(hash, frames) {
                Some(id) => id,
                None => inner.insert(hash, frames),
            }
        };
        if id == NO_STACK {
            return id; // dropped: not cached, so each capture of it is counted
        }
        let _ = LAST.try_with(|l| {
            if let Ok(mut l) = l.try_borrow_mut() {
                l.0 = me;
                l.1 = id;
                l.2.clear();
                l.2.extend_from_slice(frames);
            }
        });
        id
    }

    /// The frames of `id`, innermost first.
    pub fn get(&self, id: StackId) -> Option<Vec<u64>> {
        self.with(id, |s| s.to_vec())
    }

    /// Run `f` on the frames of `id` under the table's lock (keep it short).
    pub fn with<R>(&self, id: StackId, f: impl FnOnce(&[u64]) -> R) -> Option<R> {
        let inner = self.lock();
        inner.slice(id).map(f)
    }

    /// A new, empty table holding at most `limit` distinct stacks.
    pub fn with_limit(limit: usize) -> StackTable {
        let t = StackTable::default();
        t.set_limit(limit);
        t
    }

    /// Set the cap on distinct stacks (stacks already stored stay).
    pub fn set_limit(&self, limit: usize) {
        self.lock().limit = limit;
    }

    /// The cap on distinct stacks.
    pub fn limit(&self) -> usize {
        self.lock().limit
    }

    /// Captures whose (new) stack was not stored because the table was full.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Number of distinct stacks.
    pub fn len(&self) -> usize {
        self.lock().stacks.len()
    }

    /// No stacks yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total frames stored (each distinct stack once).
    pub fn stored_frames(&self) -> usize {
        self.lock().arena.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_stacks_share_one_id_and_storage() {
        let t = StackTable::new();
        let a = t.intern(&[1, 2, 3]);
        let b = t.intern(&[4, 5]);
        // Another thread's cache is cold: the lookup goes through the table.
        let a2 = std::thread::scope(|s| s.spawn(|| t.intern(&[1, 2, 3])).join().unwrap());
        assert_eq!(a, a2);
        assert_ne!(a, b);
        assert_eq!(t.intern(&[1, 2, 3]), a);
        assert_eq!((t.len(), t.stored_frames()), (2, 5));
        assert_eq!(t.get(a).unwrap(), vec![1, 2, 3]);
        assert_eq!(t.get(b).unwrap(), vec![4, 5]);
    }

    #[test]
    fn empty_and_unknown_stacks() {
        let t = StackTable::new();
        assert_eq!(t.intern(&[]), NO_STACK);
        assert_eq!(t.get(NO_STACK), None);
        assert_eq!(t.get(99), None);
    }

    #[test]
    fn hash_collisions_are_told_apart_by_content() {
        let t = StackTable::new();
        let hash = 42;
        let mut inner = t.lock();
        let x = inner.insert(hash, &[10, 20]);
        let y = inner.insert(hash, &[30]);
        assert_ne!(x, y);
        assert_eq!(inner.find(hash, &[10, 20]), Some(x));
        assert_eq!(inner.find(hash, &[30]), Some(y));
        assert_eq!(inner.find(hash, &[40]), None);
    }

    #[test]
    fn concurrent_interning_agrees_on_ids() {
        let t = StackTable::new();
        let stacks: Vec<Vec<u64>> = (0..50u64)
            .map(|i| (0..=i % 7).map(|j| i * 100 + j).collect())
            .collect();
        let results: Vec<Vec<StackId>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|k| {
                    let (t, stacks) = (&t, &stacks);
                    s.spawn(move || {
                        (0..2000)
                            .map(|i| t.intern(&stacks[(i * (k + 1)) % 50]))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(t.len(), 50);
        for (k, r) in results.iter().enumerate() {
            for (i, id) in r.iter().enumerate() {
                assert_eq!(t.get(*id).unwrap(), stacks[(i * (k + 1)) % 50]);
            }
        }
    }

    #[test]
    fn a_full_table_keeps_known_stacks_and_counts_every_capture_of_a_new_one() {
        let t = StackTable::with_limit(2);
        let a = t.intern(&[1]);
        let b = t.intern(&[2]);
        assert_eq!(t.intern(&[3]), NO_STACK);
        assert_eq!(t.intern(&[3]), NO_STACK);
        assert_eq!(t.intern(&[4, 5]), NO_STACK);
        assert_eq!((t.intern(&[1]), t.intern(&[2])), (a, b));
        assert_eq!((t.len(), t.dropped(), t.stored_frames()), (2, 3, 2));
    }

    #[test]
    fn prefixes_are_distinct_stacks() {
        let t = StackTable::new();
        let long = t.intern(&[1, 2, 3]);
        let short = t.intern(&[1, 2]);
        assert_ne!(long, short);
        assert_eq!(t.get(short).unwrap(), vec![1, 2]);
    }
}
