//! The iterations of a training or inference loop in a device's trace, and per step its
//! peak, what was live at it (by category and by site) and its growth: the bytes live at
//! its end that were not live at the previous step's end (at the first step's start, for
//! the first), the growth that becomes an out-of-memory after a thousand steps.
//!
//! Policy: steps are found, first that applies:
//! 1. from range paths (NVTX ranges, `user_metadata`, PyTorch's record_function annotations)
//!    that number their iterations (`iteration 3`, `step_12`, `batch#4`, `ProfilerStep#5`):
//!    a step is the events of one number;
//! 2. from the phases (`analyze::category`, from frames and range paths): a step ends where
//!    an optimizer phase ends; without one, where a backward phase ends; without either, a
//!    step starts where each forward phase starts (an inference loop; one forward pass is
//!    one step);
//! 3. only when nothing gives a phase: from the repetition of the allocation pattern: the
//!    shortest period with which the sequence of allocations (size and stack) repeats, 90%
//!    of them alike, at least twice (in a single pass over a model that is the period of
//!    its layers, which is why phases come first).
//!
//! Two instances of one range path with no number between them cannot be told apart from
//! the paths alone (the model keeps no times), so rule 2 or 3 decides them. The events after
//! the last optimizer (or backward) phase are not a step; when the trace's peak lies among
//! them (a step cut short by an out-of-memory), the line naming the peak step says so. A
//! step is `[from, to)` in events; its moments are "after N events", as everywhere in the
//! analyses.

use crate::analyze::category::{classifier, names, Classifier, Walker, BEFORE};
use crate::analyze::category_rules::{Phase, UserRule, RANGE_MARK};
use crate::analyze::model::{Device, Snapshot};
use crate::analyze::sites::by_site;
use crate::analyze::timeline::Live;

/// The longest trace plain `summary` looks for steps in: finding them costs six walks and
/// 4 bytes an event (a whole-run log of 100 million events would take 400 MB, where the
/// summary itself stays under 10 MiB); `summary --by category` finds them in any trace.
pub const SUMMARY_MAX_EVENTS: usize = 20_000_000;

/// One step.
#[derive(Debug, Clone, Default)]
pub struct Step {
    /// Its number (from 1) among all the steps found.
    pub number: usize,
    pub from: usize,
    pub to: usize,
    pub peak: u64,
    /// The moment of the peak (after this many events).
    pub peak_after: usize,
    /// `(category, bytes)` live at the peak, non-zero only, largest first.
    pub categories: Vec<(String, u64)>,
    /// `(site, bytes)` live at the peak, largest first (at most 5).
    pub sites: Vec<(String, u64)>,
    pub growth: u64,
}

/// The steps of one device.
#[derive(Debug, Clone, Default)]
pub struct Steps {
    pub device: i64,
    /// How they were found.
    pub source: String,
    /// How many steps were found (`steps` may keep fewer: [`Detail`]).
    pub found: usize,
    /// The steps kept, in order.
    pub steps: Vec<Step>,
    /// The highest bytes after the last step's end, and after which event: the events of a
    /// step the trace ends in before it completes (an out-of-memory in its forward pass).
    pub unfinished: Option<(u64, usize)>,
}

impl Steps {
    /// The index in `steps` of the step with the highest peak (the first of equals; it is
    /// always kept).
    pub fn peak_step(&self) -> Option<usize> {
        let max = self.steps.iter().map(|s| s.peak).max()?;
        self.steps.iter().position(|s| s.peak == max)
    }
}

/// The number in a range path's iteration element (`iteration 3`), if any.
fn iteration_number(path: &str) -> Option<(String, u64)> {
    for part in path.split('/') {
        let l = part.to_ascii_lowercase();
        // `profilerstep`: the profiler's own `ProfilerStep#N` record_function.
        for word in [
            "iteration",
            "iter",
            "profilerstep",
            "step",
            "batch",
            "epoch",
        ] {
            if let Some(rest) = l.strip_prefix(word) {
                let digits: String = rest
                    .trim_start_matches([' ', '_', '#', '-', ':'])
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect();
                if let Ok(n) = digits.parse() {
                    let word = if word == "profilerstep" {
                        "ProfilerStep#"
                    } else {
                        word
                    };
                    return Some((format!("{word} N").replace("# ", "#"), n));
                }
            }
        }
    }
    None
}

/// Step bounds from numbered iteration ranges.
fn from_numbered(snap: &Snapshot, dev: &Device) -> Option<(String, Vec<(usize, usize)>)> {
    let mut starts: Vec<usize> = Vec::new();
    let mut last: Option<u64> = None;
    let mut word = String::new();
    // Each stack's numbered iteration, read once per stack (none: the walk is not needed).
    let numbered: Vec<Option<(String, u64)>> = (0..snap.stacks.lists.len())
        .map(|l| {
            snap.stacks
                .frames_of(l as u32)
                .find(|f| &*f.name == RANGE_MARK)
                .and_then(|f| iteration_number(&f.file))
        })
        .collect();
    if numbered.iter().all(Option::is_none) {
        return None;
    }
    for (i, ev) in dev.events.iter().enumerate() {
        if let Some(Some((w, n))) = numbered.get(ev.stack as usize) {
            if last != Some(*n) {
                starts.push(i);
                last = Some(*n);
                word = w.clone();
            }
        }
    }
    if starts.len() < 2 {
        return None;
    }
    let n = dev.events.len();
    let bounds = starts
        .iter()
        .enumerate()
        .map(|(k, &s)| (s, starts.get(k + 1).copied().unwrap_or(n)))
        .collect();
    Some((format!("numbered ranges ({word})"), bounds))
}

/// Step bounds from the phases.
fn from_phases(c: &Classifier, n: usize) -> Option<(String, Vec<(usize, usize)>)> {
    let runs: Vec<(Phase, usize, usize)> = c
        .run_phase
        .iter()
        .enumerate()
        .map(|(k, &(p, first))| (p, first, c.run_phase.get(k + 1).map_or(n, |r| r.1)))
        .collect();
    for (phase, what) in [
        (Phase::Optimizer, "the optimizer's steps"),
        (Phase::Backward, "the backward passes"),
    ] {
        let ends: Vec<usize> = runs.iter().filter(|r| r.0 == phase).map(|r| r.2).collect();
        if ends.is_empty() {
            continue;
        }
        let mut from = 0;
        let bounds = ends
            .iter()
            .map(|&e| {
                let b = (from, e);
                from = e;
                b
            })
            .collect();
        return Some((format!("phases: a step ends with each of {what}"), bounds));
    }
    let starts: Vec<usize> = runs
        .iter()
        .filter(|r| r.0 == Phase::Forward)
        .map(|r| r.1)
        .collect();
    if !starts.is_empty() {
        let bounds = starts
            .iter()
            .enumerate()
            .map(|(k, &s)| (s, starts.get(k + 1).copied().unwrap_or(n)))
            .collect();
        return Some((
            "phases: a step starts with each forward pass".to_string(),
            bounds,
        ));
    }
    None
}

/// Step bounds from the repetition of the allocation pattern.
fn from_repetition(dev: &Device) -> Option<(String, Vec<(usize, usize)>)> {
    let mut keys: Vec<(u64, u32)> = Vec::new();
    // Event indices as u32, as block ids are (`category::Walker`).
    let mut at: Vec<u32> = Vec::new();
    for (i, ev) in dev.events.iter().enumerate() {
        if ev.action == cushim::trace::event::Action::Alloc {
            keys.push((ev.size, ev.stack));
            at.push(i as u32);
        }
    }
    let m = keys.len();
    let mut best: Option<(usize, usize)> = None; // (period, start)
    for s in 0..m.min(32) {
        let cands = (s + 1..m).filter(|&j| keys[j] == keys[s]).take(32);
        for j in cands {
            let p = j - s;
            if best.is_some_and(|b| b.0 <= p) {
                break;
            }
            if (m - s) / p < 2 {
                break;
            }
            let total = m - s - p;
            let stride = (total / 20_000).max(1);
            let (mut same, mut seen) = (0usize, 0usize);
            let mut i = s;
            while i + p < m {
                seen += 1;
                if keys[i] == keys[i + p] {
                    same += 1;
                }
                i += stride;
            }
            if seen > 0 && same * 10 >= seen * 9 {
                best = Some((p, s));
                break;
            }
        }
    }
    let (p, s) = best?;
    drop(keys);
    let n = dev.events.len();
    let mut bounds: Vec<(usize, usize)> = Vec::with_capacity((m - s).div_ceil(p));
    let mut from: Option<usize> = None;
    for b in (s..m).step_by(p).map(|k| at[k] as usize) {
        if let Some(a) = from {
            bounds.push((a, b));
        }
        from = Some(b);
    }
    bounds.extend(from.map(|a| (a, n)));
    Some((
        format!("the allocation pattern repeats every {p} allocations"),
        bounds,
    ))
}

/// How much of each step [`steps_kept`] keeps: the rows are the first `rows` steps and the
/// step that peaked (the others are counted, their peaks compared, nothing more kept).
#[derive(Debug, Clone, Copy)]
pub struct Detail {
    /// Steps kept in full, from the first.
    pub rows: usize,
    /// Whether each kept step's sites at its peak are found (only the JSON lists them).
    pub sites: bool,
}

impl Detail {
    /// Every step, with its sites (the JSON outputs, `summary --by category`).
    pub const ALL: Detail = Detail {
        rows: usize::MAX,
        sites: true,
    };
}

/// The steps of `dev` (none found: an empty list), every one kept.
pub fn steps(snap: &Snapshot, dev: &Device, user: &[UserRule], depth: usize) -> Steps {
    steps_kept(snap, dev, user, depth, Detail::ALL)
}

/// The steps of `dev`, keeping what `detail` says: a trace may have millions of steps (an
/// allocation pattern that repeats every allocation), and a step kept costs a few hundred
/// bytes and a look at its live blocks, where a step only counted costs 16 bytes.
pub fn steps_kept(
    snap: &Snapshot,
    dev: &Device,
    user: &[UserRule],
    depth: usize,
    detail: Detail,
) -> Steps {
    let mut c = classifier(snap, dev, user);
    steps_by(&mut c, snap, dev, user, depth, detail)
}

/// [`steps_kept`] with `dev`'s classifier built already.
pub fn steps_by(
    c: &mut Classifier,
    snap: &Snapshot,
    dev: &Device,
    user: &[UserRule],
    depth: usize,
    detail: Detail,
) -> Steps {
    let n = dev.events.len();
    let found = from_numbered(snap, dev)
        .or_else(|| from_phases(c, n))
        .or_else(|| from_repetition(dev));
    let Some((source, bounds)) = found else {
        return Steps {
            device: dev.ordinal,
            ..Default::default()
        };
    };
    let names = names(user);
    let start = c.start.clone();
    // Walk 1: each step's peak; the categories at the peak of the kept ones (the first
    // `rows`, and the highest, first of equals, known only at the end: its totals are
    // carried along while it leads).
    let mut w = Walker::new(&start, names.len(), |b, s| c.category(b, s));
    let mut peaks: Vec<(u64, usize)> = bounds.iter().map(|&(from, _)| (0, from)).collect();
    let mut cats_of: Vec<Vec<(String, u64)>> = Vec::new();
    let categories = |t: &[u64]| -> Vec<(String, u64)> {
        let mut cats: Vec<(String, u64)> = names
            .iter()
            .cloned()
            .zip(t.iter().copied())
            .filter(|r| r.1 > 0)
            .collect();
        cats.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        cats
    };
    // The current step's totals at its peak (empty: none noted yet), and the leader's.
    let mut cur: Vec<u64> = Vec::new();
    let mut lead: Option<(usize, Vec<u64>)> = None;
    let mut k = 0usize;
    // Step `k` is over: keep its categories if it is a row, or it leads.
    let mut close = |k: usize, cur: &mut Vec<u64>, peaks: &[(u64, usize)]| {
        if k < detail.rows {
            cats_of.push(categories(cur));
        }
        if lead
            .as_ref()
            .map_or(true, |(l, _)| peaks[k].0 > peaks[*l].0)
        {
            match &mut lead {
                Some((l, t)) => {
                    *l = k;
                    t.clear();
                    t.extend_from_slice(cur);
                }
                None => lead = Some((k, cur.clone())),
            }
        }
        cur.clear();
    };
    let note = |peaks: &mut [(u64, usize)], cur: &mut Vec<u64>, k: usize, i: usize, w: &Walker| {
        let Some(&(from, to)) = bounds.get(k) else {
            return;
        };
        if i >= from && i <= to && (w.bytes() > peaks[k].0 || cur.is_empty()) {
            peaks[k] = (w.bytes(), i);
            cur.clear();
            cur.extend_from_slice(&w.totals);
        }
    };
    note(&mut peaks, &mut cur, 0, 0, &w);
    let mut unfinished: Option<(u64, usize)> = None;
    w.walk(dev, c, n, |i, w| {
        while bounds.get(k).is_some_and(|b| i > b.1) {
            close(k, &mut cur, &peaks);
            k += 1;
        }
        if bounds.get(k).is_some_and(|b| i == b.0) {
            cur.clear();
            peaks[k].0 = 0;
        }
        note(&mut peaks, &mut cur, k, i, w);
        if k == bounds.len() && unfinished.map_or(true, |u: (u64, usize)| w.bytes() > u.0) {
            unfinished = Some((w.bytes(), i));
        }
    });
    while k < bounds.len() {
        close(k, &mut cur, &peaks);
        k += 1;
    }
    let lead = lead.map(|(l, t)| (l, categories(&t)));
    let kept: Vec<usize> = (0..bounds.len().min(detail.rows))
        .chain(lead.as_ref().map(|l| l.0).filter(|&l| l >= detail.rows))
        .collect();
    let mut out: Vec<Step> = kept
        .iter()
        .map(|&k| Step {
            number: k + 1,
            from: bounds[k].0,
            to: bounds[k].1,
            peak: peaks[k].0,
            peak_after: peaks[k].1,
            categories: match &lead {
                Some((l, t)) if *l == k => t.clone(),
                _ => cats_of.get(k).cloned().unwrap_or_default(),
            },
            ..Default::default()
        })
        .collect();
    drop(cats_of);
    drop(peaks);
    // Walk 2: the sites at each kept step's peak, the growth at each kept step's end.
    let mut w = Walker::new(&start, names.len(), |b, s| c.category(b, s));
    let mut at_peak: Vec<(usize, usize)> = if detail.sites {
        out.iter()
            .enumerate()
            .map(|(j, s)| (s.peak_after, j))
            .collect()
    } else {
        Vec::new()
    };
    at_peak.sort();
    let mut ends: Vec<(usize, usize)> = out.iter().enumerate().map(|(j, s)| (s.to, j)).collect();
    ends.sort();
    let (mut pi, mut ei) = (0usize, 0usize);
    let stacks = &snap.stacks;
    let mut visit = |i: usize, w: &Walker, out: &mut [Step]| {
        while at_peak.get(pi).is_some_and(|p| p.0 == i) {
            let j = at_peak[pi].1;
            let live: Vec<Live> = w
                .mem
                .allocated
                .values()
                .map(|b| Live {
                    size: b.size,
                    stack: b.stack,
                    before_trace: b.id == BEFORE,
                })
                .collect();
            out[j].sites = by_site(stacks, live.iter(), depth)
                .into_iter()
                .take(5)
                .map(|r| (r.site, r.bytes))
                .collect();
            pi += 1;
        }
        while ends.get(ei).is_some_and(|e| e.0 == i) {
            let j = ends[ei].1;
            let k = out[j].number - 1;
            let prev_end = if k == 0 { bounds[k].0 } else { bounds[k - 1].1 };
            out[j].growth = w
                .mem
                .allocated
                .values()
                .filter(|b| b.id != BEFORE && (b.id as usize) >= prev_end)
                .map(|b| b.size)
                .sum();
            ei += 1;
        }
    };
    visit(0, &w, &mut out);
    // The walk stops after the last moment it is needed for.
    let last = at_peak
        .last()
        .map(|p| p.0)
        .max(ends.last().map(|e| e.0))
        .unwrap_or(0);
    w.walk(dev, c, last, |i, w| visit(i, w, &mut out));
    Steps {
        device: dev.ordinal,
        source,
        found: bounds.len(),
        steps: out,
        unfinished,
    }
}

use crate::analyze::units::mib2 as mib;

/// One line naming the step that peaked, for `summary`.
pub fn peak_line(s: &Steps) -> Option<String> {
    let k = s.peak_step()?;
    let st = &s.steps[k];
    if let Some((bytes, after)) = s.unfinished.filter(|u| u.0 > st.peak) {
        return Some(format!(
            "steps: {} found ({}); the peak came after the last of them, in the unfinished \
             step the trace ends in: {} after event {} (the highest step, {}, peaked at {})",
            s.found,
            s.source,
            mib(bytes),
            after,
            st.number,
            mib(st.peak)
        ));
    }
    Some(format!(
        "steps: {} found ({}); the peak was in step {} of {}: {} after event {}",
        s.found,
        s.source,
        st.number,
        s.found,
        mib(st.peak),
        st.peak_after
    ))
}

/// The steps' table.
pub fn render(s: &Steps) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let Some(line) = peak_line(s) else {
        let _ = writeln!(
            out,
            "  steps: none found (no numbered iteration ranges, no optimizer, backward or \
             forward phases, no repeating allocation pattern)"
        );
        return out;
    };
    let _ = writeln!(out, "  {line}");
    let _ = writeln!(
        out,
        "  {:>5}  {:>21}  {:>14}  {:>14}  largest category at the peak",
        "step", "events", "peak", "growth"
    );
    let mut next = 1;
    for st in &s.steps {
        if st.number != next {
            let _ = writeln!(out, "  {:>5}", "...");
        }
        next = st.number + 1;
        let top = st
            .categories
            .first()
            .map(|c| format!("{} {}", c.0, mib(c.1)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:>5}  {:>21}  {:>14}  {:>14}  {top}",
            st.number,
            format!("{}..{}", st.from, st.to),
            mib(st.peak),
            mib(st.growth)
        );
    }
    if s.found > s.steps.len() {
        let _ = writeln!(
            out,
            "  ({} steps not listed: `cushim summary --by category` lists every step)",
            s.found - s.steps.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_iteration_ranges_are_read_from_any_path_element() {
        assert_eq!(
            iteration_number("train/iteration 3/forward"),
            Some(("iteration N".into(), 3))
        );
        assert_eq!(iteration_number("step_12"), Some(("step N".into(), 12)));
        assert_eq!(iteration_number("train/iteration"), None);
    }

    #[test]
    fn steps_past_the_kept_rows_are_counted_and_the_one_that_peaked_is_kept_as_in_the_full_list() {
        use crate::analyze::model::Event;
        use cushim::trace::event::Action;
        const M: u64 = 1 << 20;
        // 100 steps of one allocation and its free (the pattern repeats every allocation);
        // step 71 allocates the most.
        let events: Vec<Event> = (0..100u64)
            .flat_map(|k| {
                let size = if k == 70 { 7 * M } else { M };
                [Action::Alloc, Action::FreeCompleted].map(|action| Event {
                    action,
                    addr: 0x1000,
                    size,
                    stream: 0,
                    stack: 0,
                })
            })
            .collect();
        let mut snap = Snapshot::default();
        snap.devices.push(Device {
            ordinal: 0,
            events: events.into(),
            ..Default::default()
        });
        let dev = &snap.devices[0];
        let all = steps(&snap, dev, &[], 1);
        let kept = steps_kept(
            &snap,
            dev,
            &[],
            1,
            Detail {
                rows: 3,
                sites: false,
            },
        );
        assert_eq!((all.found, all.steps.len()), (100, 100));
        assert_eq!((kept.found, kept.steps.len()), (100, 4));
        let numbers: Vec<usize> = kept.steps.iter().map(|s| s.number).collect();
        assert_eq!(numbers, [1, 2, 3, 71]);
        for st in &kept.steps {
            let full = &all.steps[st.number - 1];
            assert_eq!(
                (st.from, st.to, st.peak, st.peak_after, st.growth),
                (full.from, full.to, full.peak, full.peak_after, full.growth)
            );
            assert_eq!(st.categories, full.categories);
            assert!(st.sites.is_empty() && !full.sites.is_empty());
        }
        assert_eq!(peak_line(&kept), peak_line(&all));
        assert_eq!(kept.steps[3].peak, 7 * M);
        let table = render(&kept);
        assert!(table.contains("  ...\n"), "{table}");
        assert!(table.contains("(96 steps not listed"), "{table}");
    }
}
