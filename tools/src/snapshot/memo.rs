//! The pickle reader's memo: what each slot names, in memory that does not grow by a slot's
//! worth per trace entry.
//!
//! Policy: slots are dense in practice (MEMOIZE takes the next one; old picklers PUT
//! `len(memo)`), so they are kept in order, in parts that cover `[0, end)` back to back. A
//! part is either a vector of slots, or a run of consecutive slots naming consecutive small
//! integers (start, first integer, length: 16 bytes for any number of slots). Runs are what
//! a streamed trace leaves: the reader's dict hook turns each trace entry into `Int(index)`
//! and a pickler memoizes each entry dict in the next slot, so a million entries become one
//! run instead of a million 32-byte slots. The vector at the end is compacted into runs
//! when it has doubled since the last compaction (amortized O(1) per slot, whatever the
//! input). A slot far beyond the others (crafted) goes to a map, so no slot number makes a
//! vector grow by more than a few entries per opcode; the map also holds a slot inside a
//! run that was given another value (no real pickle does that), and is looked at first.
//!
//! Invariant: `parts[i + 1].start() == parts[i].start() + parts[i].len()`, `parts[0]`
//! starts at 0, and a slot in a `Slots` part that holds a value has no entry in `sparse`.

use cushim::snapshot::value::Value;
use std::collections::HashMap;

/// What a memo slot names: a finished object (with its nesting depth), or a container
/// still open on the stack (its index there), so a lookup is O(1) either way.
#[derive(Clone)]
pub(crate) enum Slot {
    Done(Value, u32),
    Open(usize),
}

enum Part {
    Slots {
        start: u32,
        v: Vec<Option<Slot>>,
    },
    /// Slot `start + i` names `Int(k0 + i)` (depth 0), for `i < len`.
    Ints {
        start: u32,
        k0: i64,
        len: u32,
    },
}

impl Part {
    fn start(&self) -> u32 {
        match self {
            Part::Slots { start, .. } | Part::Ints { start, .. } => *start,
        }
    }
    fn end(&self) -> u32 {
        match self {
            Part::Slots { start, v } => start + v.len() as u32,
            Part::Ints { start, len, .. } => start + len,
        }
    }
}

/// The largest gap a PUT may leave in the dense memo.
const MEMO_GAP: u32 = 4;
/// Runs shorter than this stay as slots (a part costs more than a few slots).
const MIN_RUN: usize = 4;
/// The tail vector's length that first triggers a compaction.
const FIRST_COMPACT: usize = 4096;

#[derive(Default)]
pub(crate) struct Memo {
    parts: Vec<Part>,
    sparse: HashMap<u32, Slot>,
    /// The tail vector's length at which to compact it next.
    compact_at: usize,
}

fn as_int(s: &Option<Slot>) -> Option<i64> {
    match s {
        Some(Slot::Done(Value::Int(k), 0)) => Some(*k),
        _ => None,
    }
}

impl Memo {
    fn end(&self) -> u32 {
        self.parts.last().map_or(0, Part::end)
    }

    /// The part holding `slot` (which must be below `end`).
    fn part_of(&self, slot: u32) -> usize {
        self.parts
            .partition_point(|p| p.start() <= slot)
            .saturating_sub(1)
    }

    pub(crate) fn insert(&mut self, slot: u32, e: Slot) {
        let end = self.end();
        if slot >= end {
            if slot - end > MEMO_GAP {
                self.sparse.insert(slot, e);
                return;
            }
            if !matches!(self.parts.last(), Some(Part::Slots { .. })) {
                self.parts.push(Part::Slots {
                    start: end,
                    v: Vec::new(),
                });
            }
            if let Some(Part::Slots { start, v }) = self.parts.last_mut() {
                v.resize_with((slot - *start) as usize, || None);
                v.push(Some(e));
                let n = v.len();
                self.sparse.remove(&slot);
                if n >= self.compact_at.max(FIRST_COMPACT) {
                    self.compact_tail();
                }
            }
            return;
        }
        let p = self.part_of(slot);
        match &mut self.parts[p] {
            Part::Slots { start, v } => {
                v[(slot - *start) as usize] = Some(e);
                self.sparse.remove(&slot);
            }
            Part::Ints { start, k0, .. } => {
                let k = *k0 + i64::from(slot - *start);
                if as_int(&Some(e.clone())) == Some(k) {
                    self.sparse.remove(&slot);
                } else {
                    self.sparse.insert(slot, e);
                }
            }
        }
    }

    pub(crate) fn get(&self, slot: u32) -> Option<Slot> {
        if let Some(s) = self.sparse.get(&slot) {
            return Some(s.clone());
        }
        if slot >= self.end() {
            return None;
        }
        match &self.parts[self.part_of(slot)] {
            Part::Slots { start, v } => v[(slot - start) as usize].clone(),
            Part::Ints { start, k0, .. } => {
                Some(Slot::Done(Value::Int(k0 + i64::from(slot - start)), 0))
            }
        }
    }

    /// Turn the runs of consecutive integers in the tail vector into `Ints` parts; what
    /// follows the last run (containers still open, entries of the batch being read) stays
    /// the tail.
    fn compact_tail(&mut self) {
        let Some(Part::Slots { start, v }) = self.parts.pop() else {
            return;
        };
        let mut out: Vec<Part> = Vec::new();
        let mut pending: Vec<Option<Slot>> = Vec::new();
        let mut pending_start = start;
        let mut i = 0;
        let push_ints = |out: &mut Vec<Part>, parts: &mut Vec<Part>, s: u32, k: i64, n: u32| {
            let prev = out.last_mut().or_else(|| parts.last_mut());
            if let Some(Part::Ints { k0, len, .. }) = prev {
                if *k0 + i64::from(*len) == k {
                    *len += n;
                    return;
                }
            }
            out.push(Part::Ints {
                start: s,
                k0: k,
                len: n,
            });
        };
        while i < v.len() {
            let mut j = i;
            if let Some(k) = as_int(&v[i]) {
                j = i + 1;
                while j < v.len() && as_int(&v[j]) == Some(k + (j - i) as i64) {
                    j += 1;
                }
                if j - i >= MIN_RUN {
                    if !pending.is_empty() {
                        out.push(Part::Slots {
                            start: pending_start,
                            v: std::mem::take(&mut pending),
                        });
                    }
                    push_ints(
                        &mut out,
                        &mut self.parts,
                        start + i as u32,
                        k,
                        (j - i) as u32,
                    );
                    i = j;
                    pending_start = start + i as u32;
                    continue;
                }
            }
            let stop = j.max(i + 1);
            pending.extend(v[i..stop].iter().cloned());
            i = stop;
        }
        self.parts.extend(out);
        let tail = pending.len();
        self.parts.push(Part::Slots {
            start: pending_start,
            v: pending,
        });
        self.compact_at = (2 * tail).max(FIRST_COMPACT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(m: &Memo, s: u32) -> Option<i64> {
        as_int(&m.get(s))
    }

    #[test]
    fn a_long_trace_of_integer_slots_becomes_a_few_runs_and_reads_back() {
        let mut m = Memo::default();
        m.insert(0, Slot::Open(0));
        m.insert(1, Slot::Done(Value::str("k"), 0));
        for s in 2..100_002u32 {
            m.insert(s, Slot::Open(3));
            m.insert(s, Slot::Done(Value::Int(i64::from(s) - 2), 0));
        }
        assert!(m.parts.len() <= 4, "{} parts", m.parts.len());
        assert!(matches!(m.get(0), Some(Slot::Open(0))));
        assert_eq!(
            m.get(1).map(|s| matches!(s, Slot::Done(Value::Str(_), 0))),
            Some(true)
        );
        for s in [2u32, 3, 5000, 99_999, 100_001] {
            assert_eq!(int(&m, s), Some(i64::from(s) - 2), "slot {s}");
        }
        assert!(m.get(100_002).is_none());
    }

    #[test]
    fn a_slot_inside_a_run_given_another_value_reads_the_new_value() {
        let mut m = Memo::default();
        for s in 0..10_000u32 {
            m.insert(s, Slot::Done(Value::Int(i64::from(s)), 0));
        }
        m.insert(500, Slot::Done(Value::str("x"), 0));
        assert!(matches!(m.get(500), Some(Slot::Done(Value::Str(_), 0))));
        assert_eq!(int(&m, 501), Some(501));
        m.insert(500, Slot::Done(Value::Int(500), 0));
        assert_eq!(int(&m, 500), Some(500));
    }

    #[test]
    fn a_far_slot_goes_to_the_map_and_a_later_dense_value_wins() {
        let mut m = Memo::default();
        m.insert(0, Slot::Done(Value::Int(7), 0));
        m.insert(1_000_000, Slot::Done(Value::Int(1), 0));
        assert_eq!(int(&m, 1_000_000), Some(1));
        assert!(m.get(500).is_none());
        for s in 1..=10u32 {
            m.insert(s, Slot::Done(Value::Int(100), 0));
        }
        assert_eq!(int(&m, 10), Some(100));
    }
}
