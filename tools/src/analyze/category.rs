//! What kind of memory each allocated byte is (`cushim summary --by category`): at the
//! peak, at the end, or after any event, every allocated byte of a device in exactly one
//! category (`analyze::category_rules` says which, and why).
//!
//! Invariant: the categories of a moment sum to that moment's allocated bytes exactly.
//! The walks here apply events with the rules of `crate::state` (blocks freed by the
//! program and waiting for other streams are not allocated), from the same start
//! (`timeline::start_of`), and charge each block's bytes to one category from the moment
//! it is allocated to the moment it leaves the allocated blocks.
//!
//! How: three walks of the trace. (1) Each event's phase clue (its own frames and range
//! path); an event with no clue takes the phase around it: the phase before it when the
//! next clue is the same, the forward pass between a forward and a backward (the loss), else
//! "outside". Consecutive events of one phase are one phase run (found as the trace
//! streams: only the runs are held). (2) Lifetimes: for each allocation, whether the event
//! that took it out of the allocated blocks is in its own phase run, so a block made in the
//! forward pass is known to be freed in it (a temporary) or not (kept for backward); a free
//! by an autograd graph's teardown (the graph dropped without a backward pass) counts as
//! "not": the graph had kept the block for backward.
//! (3) The moment walks themselves (and the export's rows), which know each block's
//! category when it is allocated. Each walk holds only the live blocks, the runs and one
//! bit per event (the lifetimes: 12.5 MB for 100 million events).

use crate::analyze::category_rules::{
    by_phase, frame_category, graph_teardown, phase_clue, user_text, Category, Phase, UserRule,
    RANGE_MARK,
};
use crate::analyze::entry_marks::POOL_MARK;
use crate::analyze::frames::FORWARD_MARK;
use crate::analyze::model::{Device, Event, Frame, Snapshot, Stacks};
use crate::analyze::timeline::{start_of, Start};
use crate::state::Memory;

/// The moment to categorise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// The first moment allocated memory reached its peak in the trace.
    Peak,
    /// After the whole trace.
    End,
    /// After the first N events.
    After(usize),
}

/// Parse `--at`: `peak`, `end` or an event count.
pub fn parse_moment(s: &str) -> Result<Moment, String> {
    match s.trim() {
        "peak" => Ok(Moment::Peak),
        "end" => Ok(Moment::End),
        t => t.parse::<usize>().map(Moment::After).map_err(|_| {
            format!(
                "--at {s:?}: expected peak, end, an event index (the moment after that many \
                 trace events) or seconds after the trace's first event (12.5s)"
            )
        }),
    }
}

/// A category's index: built-ins are their place in [`Category::ALL`], the user's rules
/// follow in their order.
pub type CatId = u16;

/// The block id of a block live when the trace began.
pub const BEFORE: u32 = u32::MAX;

/// The names of the categories, built-in then the user's.
pub fn names(user: &[UserRule]) -> Vec<String> {
    Category::ALL
        .iter()
        .map(|c| c.name().to_string())
        .chain(user.iter().map(|u| u.name.clone()))
        .collect()
}

fn id(c: Category) -> CatId {
    Category::ALL.iter().position(|x| *x == c).unwrap_or(0) as CatId
}

/// The own frames of a stack: before PyTorch's forward frames, marks included.
fn own_frames(stacks: &Stacks, stack: u32) -> Vec<&Frame> {
    let mut v: Vec<&Frame> = stacks.frames_of(stack).collect();
    if let Some(m) = v.iter().position(|f| &*f.name == FORWARD_MARK) {
        // The marks (compiled region, pool, range) follow the forward frames: keep them.
        let marks: Vec<&Frame> = v[m + 1..]
            .iter()
            .copied()
            .filter(|f| crate::analyze::entry_marks::is_mark(f))
            .collect();
        v.truncate(m);
        v.extend(marks);
    }
    v
}

/// What one stack says, computed once per stack.
#[derive(Debug, Clone, Copy)]
struct StackFacts {
    /// A category decided before the phase: a user rule, a private pool, no stack, a frame
    /// rule.
    fixed: Option<CatId>,
    phase: Option<Phase>,
    /// Whether its frames are an autograd graph's teardown (dropped without a backward
    /// pass): what it frees the graph had kept for backward.
    teardown: bool,
}

/// The classification of one device's blocks.
pub struct Classifier<'a> {
    stacks: &'a Stacks,
    user: &'a [UserRule],
    /// By stack id (a model list index; `None`: not yet computed).
    facts: Vec<Option<StackFacts>>,
    /// Per phase run: its phase and first event.
    pub run_phase: Vec<(Phase, usize)>,
    /// Per event, one bit: for an allocation, whether the event that took it out of the
    /// allocated blocks is in the allocation's own phase run (a temporary of its phase).
    /// A bit an event, not the run itself: what the categories need of the lifetimes.
    freed_in_run: Vec<u64>,
    pub start: Start,
    /// Whether any event of the trace has a frame or a range path.
    pub any_stack: bool,
    /// Whether the device is pinned host memory.
    host: bool,
}

impl<'a> Classifier<'a> {
    fn facts(&mut self, stack: u32) -> StackFacts {
        if let Some(Some(f)) = self.facts.get(stack as usize) {
            return *f;
        }
        let own = own_frames(self.stacks, stack);
        let user = self.user.iter().position(|r| {
            own.iter()
                .filter(|f| !crate::analyze::entry_marks::is_mark(f) || &*f.name == RANGE_MARK)
                .any(|f| r.regex.is_match(&user_text(f)))
        });
        let real = own
            .iter()
            .any(|f| !crate::analyze::entry_marks::is_mark(f) || &*f.name == RANGE_MARK);
        let fixed = if let Some(u) = user {
            Some((Category::ALL.len() + u) as CatId)
        } else if own.iter().any(|f| &*f.name == POOL_MARK) {
            Some(id(Category::GraphPools))
        } else if !real {
            Some(id(Category::BeforeOrNoStack))
        } else {
            frame_category(own.iter().copied()).map(id)
        };
        let f = StackFacts {
            fixed,
            phase: phase_clue(own.iter().copied()),
            teardown: graph_teardown(own.iter().copied()),
        };
        let i = stack as usize;
        if i >= self.facts.len() {
            self.facts.resize(i + 1, None);
        }
        self.facts[i] = Some(f);
        f
    }

    /// The phase run event `i` belongs to.
    pub fn run_of(&self, i: usize) -> u32 {
        self.run_phase
            .partition_point(|r| r.1 <= i)
            .saturating_sub(1) as u32
    }

    /// The category of block `block` (an event index, or [`BEFORE`]) with stack `stack`.
    pub fn category(&mut self, block: u32, stack: u32) -> CatId {
        if self.host {
            return id(Category::PinnedHost);
        }
        let f = self.facts(stack);
        if block == BEFORE {
            // Live since before the trace began: its own frames say what it is when they
            // can (a trace ring that overflowed keeps the stacks of the blocks whose
            // allocation fell out of it: the weights and optimizer state of a long run);
            // live across the trace's start, it outlived its phase.
            return match (f.fixed, f.phase) {
                (Some(c), _) => c,
                (None, Some(p)) => id(by_phase(p, true)),
                (None, None) => id(Category::BeforeOrNoStack),
            };
        }
        if let Some(c) = f.fixed {
            return c;
        }
        let run = self.run_of(block as usize);
        let phase = self
            .run_phase
            .get(run as usize)
            .map_or(Phase::Outside, |p| p.0);
        let b = block as usize;
        let temporary = self
            .freed_in_run
            .get(b / 64)
            .is_some_and(|w| w >> (b % 64) & 1 == 1);
        id(by_phase(phase, !temporary))
    }
}

/// One live block of a moment walk.
#[derive(Debug, Clone, Copy)]
pub struct Block {
    pub size: u64,
    /// The event index that allocated it, or [`BEFORE`].
    pub id: u32,
    pub stack: u32,
    pub cat: CatId,
}

impl crate::state::Block for Block {
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
}

/// A walk forward with the rules of `crate::state` (the timeline's), tracking each
/// allocated block's category and the bytes per category.
pub struct Walker {
    pub mem: Memory<Block>,
    pub totals: Vec<u64>,
    /// Bytes of the allocated blocks live since before the trace began that their frames
    /// do not classify (in "before the recording / no stack").
    pub before: u64,
}

impl Walker {
    /// The walker at the start of the trace (`cat` names each live block's category).
    pub fn new(start: &Start, n_cats: usize, mut cat: impl FnMut(u32, u32) -> CatId) -> Walker {
        let mut w = Walker {
            mem: Memory::default(),
            totals: vec![0; n_cats],
            before: 0,
        };
        for (pending, map) in [
            (false, &start.state.allocated),
            (true, &start.state.pending),
        ] {
            for (a, l) in map {
                let b = Block {
                    size: l.size,
                    id: BEFORE,
                    stack: l.stack,
                    cat: cat(BEFORE, l.stack),
                };
                if let Some(o) = w.mem.add(pending, *a, b) {
                    if !pending {
                        w.leave(&o);
                    }
                }
                if !pending {
                    w.enter(&b);
                }
            }
        }
        w
    }

    /// Allocated bytes.
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.mem.allocated_bytes
    }

    #[inline]
    fn enter(&mut self, b: &Block) {
        if b.id == BEFORE && b.cat == id(Category::BeforeOrNoStack) {
            self.before += b.size;
        }
        if let Some(t) = self.totals.get_mut(b.cat as usize) {
            *t += b.size;
        }
    }

    #[inline]
    fn leave(&mut self, b: &Block) {
        if b.id == BEFORE && b.cat == id(Category::BeforeOrNoStack) {
            self.before = self.before.saturating_sub(b.size);
        }
        if let Some(t) = self.totals.get_mut(b.cat as usize) {
            *t = t.saturating_sub(b.size);
        }
    }

    /// Apply the first `stop` events of `dev` (all of them, at most), each allocation
    /// classified by `c`, calling `after(i, self)` after each (`i`: the events applied so
    /// far); returns the events applied.
    pub fn walk(
        &mut self,
        dev: &Device,
        c: &mut Classifier,
        stop: usize,
        mut after: impl FnMut(usize, &Walker),
    ) -> usize {
        let mut i = 0usize;
        dev.events.for_each_slice_upto(stop, |evs| {
            for ev in evs {
                self.step(ev, i, |b, s| c.category(b, s));
                i += 1;
                after(i, self);
            }
        });
        i
    }

    /// Apply event `i`; returns the block that left the allocated blocks, if one did.
    #[inline]
    pub fn step(
        &mut self,
        ev: &Event,
        i: usize,
        cat: impl FnOnce(u32, u32) -> CatId,
    ) -> Option<Block> {
        let mut made = None;
        let change = self.mem.apply(ev.action, ev.addr, ev.size, || {
            let b = Block {
                size: ev.size,
                id: i as u32,
                stack: ev.stack,
                cat: cat(i as u32, ev.stack),
            };
            made = Some(b);
            b
        });
        let left = change.left_allocated();
        if let Some(o) = &left {
            self.leave(o);
        }
        if let Some(b) = &made {
            self.enter(b);
        }
        left
    }
}

/// Build the classifier of `dev`: the phase walk and the lifetime walk.
pub fn classifier<'a>(snap: &'a Snapshot, dev: &Device, user: &'a [UserRule]) -> Classifier<'a> {
    let start = start_of(snap, dev);
    let host = snap.host.as_ref().is_some_and(|h| std::ptr::eq(h, dev));
    let mut c = Classifier {
        stacks: &snap.stacks,
        user,
        facts: vec![None; snap.stacks.lists.len()],
        run_phase: Vec::new(),
        freed_in_run: Vec::new(),
        start,
        any_stack: false,
        host,
    };
    // (1) Phase clues, then the phase of the events without one, then runs. The events
    // between two clues (a gap) share one phase, decided when the clue after them comes:
    // so the runs are found as the trace streams, holding only the runs.
    let n = dev.events.len();
    let mut any_stack = false;
    let mut runs = Runs::default();
    dev.events.for_each_slice(|evs| {
        for ev in evs {
            if ev.stack != 0 {
                any_stack = true;
            }
            let clue = c.facts(ev.stack).phase;
            runs.push(clue);
        }
    });
    c.any_stack = any_stack;
    c.run_phase = runs.finish();
    // (2) Lifetimes: a bit per event, set for an allocation freed in its own run. A free
    // by an autograd graph's teardown is not: the graph kept the tensor for a backward
    // pass (that never came), so what the forward made is an activation kept for backward.
    let mut freed_in_run = vec![0u64; n.div_ceil(64)];
    let mut w = Walker::new(&c.start, 0, |_, _| 0);
    let mut i = 0usize;
    dev.events.for_each_slice(|evs| {
        for ev in evs {
            if let Some(b) = w.step(ev, i, |_, _| 0) {
                let by_teardown = c.facts(ev.stack).teardown;
                if b.id != BEFORE && c.run_of(b.id as usize) == c.run_of(i) && !by_teardown {
                    let k = b.id as usize;
                    if let Some(word) = freed_in_run.get_mut(k / 64) {
                        *word |= 1 << (k % 64);
                    }
                }
            }
            i += 1;
        }
    });
    c.freed_in_run = freed_in_run;
    c
}

/// The phase runs of a trace, found as its events' clues stream by: an event with no
/// clue takes the phase before it when the next clue is the same, the forward pass
/// between a forward and a backward clue (the loss), else "outside".
#[derive(Default)]
struct Runs {
    runs: Vec<(Phase, usize)>,
    /// Events seen.
    seen: usize,
    /// The last clue seen.
    before: Option<Phase>,
    /// The first event of the gap of events without a clue since it.
    gap: Option<usize>,
}

impl Runs {
    fn run(&mut self, p: Phase, first: usize) {
        if self.runs.last().map_or(true, |r| r.0 != p) {
            self.runs.push((p, first));
        }
    }

    /// Close the gap, if any, now that the next clue is known to be `next`.
    fn close_gap(&mut self, next: Option<Phase>) {
        if let Some(g) = self.gap.take() {
            let p = match (self.before, next) {
                (Some(a), Some(b)) if a == b => a,
                (Some(Phase::Forward), Some(Phase::Backward)) => Phase::Forward,
                _ => Phase::Outside,
            };
            self.run(p, g);
        }
    }

    fn push(&mut self, clue: Option<Phase>) {
        match clue {
            Some(p) => {
                self.close_gap(Some(p));
                self.run(p, self.seen);
                self.before = Some(p);
            }
            None => {
                self.gap.get_or_insert(self.seen);
            }
        }
        self.seen += 1;
    }

    fn finish(mut self) -> Vec<(Phase, usize)> {
        self.close_gap(None);
        self.runs
    }
}

/// The categories of one device at one moment.
#[derive(Debug, Clone)]
pub struct DeviceCategories {
    pub device: i64,
    /// Events applied (the moment is after this many events).
    pub after: usize,
    pub events: usize,
    /// Allocated bytes at the moment.
    pub allocated: u64,
    /// `(name, bytes)` of every category, in table order (user rules last).
    pub rows: Vec<(String, u64)>,
    /// Of "before the recording / no stack": the bytes of blocks live since before the
    /// trace began whose frames do not classify them (the rest were allocated in the trace
    /// without a stack).
    pub before_start: u64,
    /// Why everything is in "no stack", when it is.
    pub note: Option<String>,
    /// The phase runs: `(phase, first event, events)`.
    pub phases: Vec<(Phase, usize, usize)>,
}

impl DeviceCategories {
    /// Bytes of category `name`.
    pub fn bytes(&self, name: &str) -> u64 {
        self.rows.iter().find(|r| r.0 == name).map_or(0, |r| r.1)
    }
}

/// The categories of `dev` at `moment`.
pub fn categorize(
    snap: &Snapshot,
    dev: &Device,
    user: &[UserRule],
    moment: Moment,
) -> Result<DeviceCategories, String> {
    let n = dev.events.len();
    if let Moment::After(k) = moment {
        if k > n {
            return Err(format!(
                "--at {k}: device {} has {n} trace events (the moment is after that many)",
                dev.ordinal
            ));
        }
    }
    let mut c = classifier(snap, dev, user);
    categorize_by(&mut c, dev, user, moment)
}

/// [`categorize`] with `dev`'s classifier built already (`moment` checked against the
/// trace's length by the caller).
pub fn categorize_by(
    c: &mut Classifier,
    dev: &Device,
    user: &[UserRule],
    moment: Moment,
) -> Result<DeviceCategories, String> {
    Ok(moment_walk(c, dev, user, moment, 0).0)
}

/// The categories at the peak and over the trace ([`categorize`] and [`over_time`]) in
/// one walk, with `dev`'s classifier built already.
pub fn peak_and_over_time(
    c: &mut Classifier,
    dev: &Device,
    user: &[UserRule],
    columns: usize,
) -> (DeviceCategories, Vec<Vec<u64>>) {
    moment_walk(c, dev, user, Moment::Peak, columns.max(1))
}

/// The categories at `moment` and, when `columns` is not 0 (and `moment` is not an event
/// count), over the trace in that many columns.
fn moment_walk(
    c: &mut Classifier,
    dev: &Device,
    user: &[UserRule],
    moment: Moment,
    columns: usize,
) -> (DeviceCategories, Vec<Vec<u64>>) {
    let n = dev.events.len();
    let names = names(user);
    let start = c.start.clone();
    let mut w = Walker::new(&start, names.len(), |b, s| c.category(b, s));
    // The moment's totals.
    let mut best = (w.bytes(), 0usize, w.totals.clone(), w.before);
    let stop = match moment {
        Moment::After(k) => k,
        _ => n,
    };
    let per = if columns == 0 || n == 0 {
        0
    } else {
        n.div_ceil(columns).max(1)
    };
    let mut cols = if per > 0 {
        vec![w.totals.clone()]
    } else {
        Vec::new()
    };
    let i = w.walk(dev, c, stop, |i, w| {
        if moment == Moment::Peak && w.bytes() > best.0 {
            best = (w.bytes(), i, w.totals.clone(), w.before);
        }
        if per > 0 && (i % per == 0 || i == n) {
            cols.push(w.totals.clone());
        }
    });
    if moment != Moment::Peak {
        best = (w.bytes(), i, w.totals.clone(), w.before);
    }
    let (allocated, after, totals, before_start) = best;
    let note = (!c.any_stack && n > 0).then(|| {
        "the trace records no frames and no range paths (history without stacks, or a log \
         of another tool): nothing tells what its allocations are, so they are all under \
         \"before the recording / no stack\""
            .to_string()
    });
    let note = note.or_else(|| {
        (n == 0).then(|| "no trace: every block's allocation is before the recording".to_string())
    });
    let phases = c
        .run_phase
        .iter()
        .enumerate()
        .map(|(k, &(p, first))| {
            let end = c.run_phase.get(k + 1).map_or(n, |r| r.1);
            (p, first, end - first)
        })
        .collect();
    let d = DeviceCategories {
        device: dev.ordinal,
        after,
        events: n,
        allocated,
        rows: names.into_iter().zip(totals).collect(),
        before_start,
        note,
        phases,
    };
    (d, cols)
}

/// Every device's categories (pinned host memory last, as device -1).
pub fn categorize_all(
    snap: &Snapshot,
    user: &[UserRule],
    moment: Moment,
) -> Result<Vec<DeviceCategories>, String> {
    let mut out = Vec::new();
    for d in snap.devices.iter().filter(|d| !d.is_empty()) {
        out.push(categorize(snap, d, user, moment)?);
    }
    if let Some(h) = snap.host.as_ref().filter(|h| !h.is_empty()) {
        let mut c = categorize(snap, h, user, moment)?;
        c.device = -1;
        out.push(c);
    }
    Ok(out)
}

use crate::analyze::units::mib2 as mib;

/// The moment's words: `at the peak (after event N of M)`.
pub fn moment_words(moment: Moment, d: &DeviceCategories) -> String {
    if d.events == 0 {
        return "at the snapshot (no trace: its segments are the only moment)".to_string();
    }
    let what = match moment {
        Moment::Peak => "at the trace's peak allocated",
        Moment::End => "at the end",
        Moment::After(_) => "at the moment",
    };
    format!("{what} (after event {} of {})", d.after, d.events)
}

/// The text of `cushim summary --by category`.
pub fn render(devs: &[DeviceCategories], moment: Moment) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for d in devs {
        let name = if d.device < 0 {
            "pinned host memory".to_string()
        } else {
            format!("device {}", d.device)
        };
        let _ = writeln!(
            s,
            "{name}: {} allocated {}",
            mib(d.allocated),
            moment_words(moment, d)
        );
        for (cat, bytes) in d.rows.iter().filter(|r| r.1 > 0) {
            let share = if d.allocated == 0 {
                0.0
            } else {
                *bytes as f64 * 100.0 / d.allocated as f64
            };
            let _ = write!(s, "  {:>14}  {share:5.1}%  {cat}", mib(*bytes));
            if cat == Category::BeforeOrNoStack.name() {
                let _ = write!(
                    s,
                    " ({} live since before the trace began, {} allocated in it without a \
                     stack)",
                    mib(d.before_start),
                    mib(bytes.saturating_sub(d.before_start))
                );
            }
            s.push('\n');
        }
        if let Some(n) = &d.note {
            let _ = writeln!(s, "  note: {n}");
        }
        let shown: Vec<String> = d
            .phases
            .iter()
            .filter(|p| p.0 != Phase::Outside)
            .take(12)
            .map(|(p, first, len)| format!("{} {}..{}", p.name(), first, first + len))
            .collect();
        if !shown.is_empty() {
            let more = d.phases.iter().filter(|p| p.0 != Phase::Outside).count() - shown.len();
            let _ = write!(s, "  phases (events): {}", shown.join(", "));
            if more > 0 {
                let _ = write!(s, ", and {more} more");
            }
            s.push('\n');
        }
    }
    s
}

/// One compared device's categories at each run's peak: `(device of A, rows of A, rows
/// of B)`.
pub type DiffRows = (i64, Vec<(String, u64)>, Vec<(String, u64)>);

/// Each compared device's categories at its peak, A and B: `(device of A, rows of A, rows
/// of B)` (non-zero rows; a side without the device has none).
pub fn diff_categories(
    a: &Snapshot,
    b: &Snapshot,
    diffs: &[crate::analyze::diff::DeviceDiff],
) -> Vec<DiffRows> {
    let rows = |s: &Snapshot, ord: i64| -> Vec<(String, u64)> {
        s.device(ord)
            .filter(|d| !d.is_empty())
            .and_then(|d| categorize(s, d, &[], Moment::Peak).ok())
            .map(|c| c.rows.into_iter().filter(|r| r.1 > 0).collect())
            .unwrap_or_default()
    };
    diffs
        .iter()
        .map(|d| {
            (
                d.ordinal,
                rows(a, d.ordinal),
                rows(b, d.b_ordinal.unwrap_or(d.ordinal)),
            )
        })
        .collect()
}

/// The categories' section of `cushim diff`.
pub fn render_diff(cats: &[DiffRows]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for (dev, a, b) in cats {
        let _ = writeln!(s, "device {dev}: bytes per category at each run's peak:");
        for name in names(&[]) {
            let get = |v: &[(String, u64)]| v.iter().find(|r| r.0 == name).map_or(0, |r| r.1);
            let (x, y) = (get(a), get(b));
            if x == 0 && y == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "  {:>14} -> {:>14}  {:>18}  {name}",
                mib(x),
                mib(y),
                crate::analyze::units::signed_mib2(i128::from(y) - i128::from(x))
            );
        }
    }
    s
}

/// The categories over the trace: per column (`columns` runs of events, the last ending
/// with the trace), the bytes of each category after the column's last event; the first
/// column is the start. Empty without a trace.
pub fn over_time(
    snap: &Snapshot,
    dev: &Device,
    user: &[UserRule],
    columns: usize,
) -> Vec<Vec<u64>> {
    let n = dev.events.len();
    if n == 0 {
        return Vec::new();
    }
    let mut c = classifier(snap, dev, user);
    moment_walk(&mut c, dev, user, Moment::Peak, columns.max(1)).1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::model::Event;
    use cushim::trace::event::Action;
    use std::sync::Arc;

    const M: u64 = 1 << 20;

    fn frame(name: &str, file: &str) -> Frame {
        Frame {
            name: Arc::from(name),
            file: Arc::from(file),
            line: 1,
        }
    }

    /// A model whose stacks 1, 2, 3 are a forward, a backward and an optimizer frame.
    fn model(events: Vec<Event>) -> Snapshot {
        let mut snap = Snapshot::default();
        snap.stacks.frames = vec![
            frame("_call_impl", "/py/torch/nn/modules/module.py"),
            frame(
                "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
                "??",
            ),
            frame("step", "/py/torch/optim/adamw.py"),
        ];
        snap.stacks.lists.extend([
            vec![0u32].into_boxed_slice(),
            vec![1u32].into_boxed_slice(),
            vec![2u32].into_boxed_slice(),
        ]);
        snap.devices.push(Device {
            ordinal: 0,
            events: events.into(),
            ..Default::default()
        });
        snap
    }

    fn ev(action: Action, addr: u64, mib: u64, stack: u32) -> Event {
        Event {
            action,
            addr,
            size: mib * M,
            stream: 0,
            stack,
        }
    }

    fn step_events() -> Vec<Event> {
        use Action::{Alloc, FreeCompleted as Free};
        vec![
            ev(Alloc, 0x1000, 10, 1), // activation
            ev(Alloc, 0x2000, 5, 1),  // forward temporary
            ev(Free, 0x2000, 5, 1),
            ev(Alloc, 0x3000, 4, 2), // gradient
            ev(Alloc, 0x4000, 3, 2), // backward temporary
            ev(Free, 0x4000, 3, 2),
            ev(Free, 0x1000, 10, 2),
            ev(Alloc, 0x5000, 4, 3), // exp_avg
            ev(Alloc, 0x6000, 4, 3), // exp_avg_sq
            ev(Alloc, 0x7000, 1, 3), // optimizer temporary
            ev(Free, 0x7000, 1, 3),
        ]
    }

    #[test]
    fn a_training_steps_memory_is_split_by_the_phase_it_was_made_and_freed_in() {
        let snap = model(step_events());
        let dev = &snap.devices[0];
        let peak = categorize(&snap, dev, &[], Moment::Peak).expect("categories");
        // The peak: activation 10 + gradient 4 + backward temporary 3, after 5 events.
        assert_eq!((peak.allocated, peak.after), (17 * M, 5));
        assert_eq!(peak.bytes("activations kept for backward"), 10 * M);
        assert_eq!(peak.bytes("gradients"), 4 * M);
        assert_eq!(peak.bytes("backward temporaries"), 3 * M);
        let sum: u64 = peak.rows.iter().map(|r| r.1).sum();
        assert_eq!(sum, peak.allocated);
        // After the optimizer: Adam's two moments are twice the gradients.
        let end = categorize(&snap, dev, &[], Moment::End).expect("categories");
        assert_eq!(end.bytes("optimizer state"), 2 * end.bytes("gradients"));
        assert_eq!(end.allocated, 12 * M);
        // Every moment sums to its allocated bytes.
        for k in 0..=dev.events.len() {
            let c = categorize(&snap, dev, &[], Moment::After(k)).expect("categories");
            assert_eq!(
                c.rows.iter().map(|r| r.1).sum::<u64>(),
                c.allocated,
                "after {k}"
            );
        }
        assert!(categorize(&snap, dev, &[], Moment::After(99)).is_err());
    }

    #[test]
    fn a_trace_without_frames_is_all_no_stack_with_a_note() {
        let evs = step_events()
            .into_iter()
            .map(|mut e| {
                e.stack = 0;
                e
            })
            .collect();
        let snap = model(evs);
        let c = categorize(&snap, &snap.devices[0], &[], Moment::End).expect("categories");
        assert_eq!(c.bytes("before the recording / no stack"), c.allocated);
        assert!(c.note.as_deref().is_some_and(|n| n.contains("no frames")));
    }

    #[test]
    fn a_users_rule_comes_before_the_built_in_ones() {
        let snap = model(step_events());
        let rule =
            crate::analyze::category_rules::parse_user_rule("moments=adamw\\.py").expect("a rule");
        let c = categorize(&snap, &snap.devices[0], &[rule], Moment::End).expect("categories");
        assert_eq!(c.bytes("moments"), 8 * M);
        assert_eq!(c.bytes("optimizer state"), 0);
    }

    #[test]
    fn events_between_clues_take_the_phase_their_neighbours_agree_on_as_the_trace_streams() {
        use Phase::*;
        let mut r = Runs::default();
        // outside gap, F, gap, F (same: forward), gap, B (forward then backward: the loss is
        // forward), gap, O (disagree: outside), gap at the end (no next clue: outside).
        let clues = [
            None,
            Some(Forward),
            None,
            Some(Forward),
            None,
            None,
            Some(Backward),
            None,
            Some(Optimizer),
            None,
        ];
        for c in clues {
            r.push(c);
        }
        assert_eq!(
            r.finish(),
            vec![
                (Outside, 0),
                (Forward, 1),
                (Backward, 6),
                (Outside, 7),
                (Optimizer, 8),
                (Outside, 9)
            ]
        );
    }

    #[test]
    fn at_parses_peak_end_and_event_counts_and_nothing_else() {
        assert_eq!(parse_moment("peak"), Ok(Moment::Peak));
        assert_eq!(parse_moment("end"), Ok(Moment::End));
        assert_eq!(parse_moment("12"), Ok(Moment::After(12)));
        assert!(parse_moment("1.5s").is_err());
    }
}
