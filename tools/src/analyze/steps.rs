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
//! the last optimizer (or backward) phase are not a step. A step is `[from, to)` in events;
//! its moments are "after N events", as everywhere in the analyses.

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
    pub steps: Vec<Step>,
}

impl Steps {
    /// The index of the step with the highest peak (the first of equals).
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
    for (i, ev) in dev.events.iter().enumerate() {
        let path = snap
            .stacks
            .frames_of(ev.stack)
            .find(|f| &*f.name == RANGE_MARK)
            .map(|f| f.file.clone());
        if let Some((w, n)) = path.as_deref().and_then(iteration_number) {
            if last != Some(n) {
                starts.push(i);
                last = Some(n);
                word = w;
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
    let mut at: Vec<usize> = Vec::new();
    for (i, ev) in dev.events.iter().enumerate() {
        if ev.action == cushim::trace::event::Action::Alloc {
            keys.push((ev.size, ev.stack));
            at.push(i);
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
    let n = dev.events.len();
    let starts: Vec<usize> = (s..m).step_by(p).map(|k| at[k]).collect();
    let bounds = starts
        .iter()
        .enumerate()
        .map(|(k, &b)| (b, starts.get(k + 1).copied().unwrap_or(n)))
        .collect();
    Some((
        format!("the allocation pattern repeats every {p} allocations"),
        bounds,
    ))
}

/// The steps of `dev` (none found: an empty list).
pub fn steps(snap: &Snapshot, dev: &Device, user: &[UserRule], depth: usize) -> Steps {
    let mut c = classifier(snap, dev, user);
    let n = dev.events.len();
    let found = from_numbered(snap, dev)
        .or_else(|| from_phases(&c, n))
        .or_else(|| from_repetition(dev));
    let Some((source, bounds)) = found else {
        return Steps {
            device: dev.ordinal,
            ..Default::default()
        };
    };
    let names = names(user);
    let start = c.start.clone();
    // Walk 1: each step's peak and its categories.
    let mut w = Walker::new(&start, names.len(), |b, s| c.category(b, s));
    let mut out: Vec<Step> = bounds
        .iter()
        .map(|&(from, to)| Step {
            from,
            to,
            peak_after: from,
            ..Default::default()
        })
        .collect();
    let mut k = 0usize;
    let mut i = 0usize;
    let mut totals_at: Vec<Vec<u64>> = vec![Vec::new(); out.len()];
    let note = |out: &mut [Step], totals_at: &mut [Vec<u64>], k: usize, i: usize, w: &Walker| {
        if let Some(st) = out.get_mut(k) {
            if i >= st.from && i <= st.to && (w.bytes() > st.peak || totals_at[k].is_empty()) {
                st.peak = w.bytes();
                st.peak_after = i;
                totals_at[k] = w.totals.clone();
            }
        }
    };
    note(&mut out, &mut totals_at, 0, 0, &w);
    dev.events.for_each_slice(|evs| {
        for ev in evs {
            w.step(ev, i, |b, s| c.category(b, s));
            i += 1;
            while out.get(k).is_some_and(|st| i > st.to) {
                k += 1;
            }
            if out.get(k).is_some_and(|st| i == st.from) {
                totals_at[k].clear();
                out[k].peak = 0;
            }
            note(&mut out, &mut totals_at, k, i, &w);
        }
    });
    for (st, t) in out.iter_mut().zip(&totals_at) {
        let mut cats: Vec<(String, u64)> = names
            .iter()
            .cloned()
            .zip(t.iter().copied())
            .filter(|r| r.1 > 0)
            .collect();
        cats.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        st.categories = cats;
    }
    // Walk 2: the sites at each peak, the growth at each end.
    let mut w = Walker::new(&start, names.len(), |b, s| c.category(b, s));
    let mut peaks: Vec<(usize, usize)> = out
        .iter()
        .enumerate()
        .map(|(k, s)| (s.peak_after, k))
        .collect();
    peaks.sort();
    let mut ends: Vec<(usize, usize)> = out.iter().enumerate().map(|(k, s)| (s.to, k)).collect();
    ends.sort();
    let (mut pi, mut ei) = (0usize, 0usize);
    let mut i = 0usize;
    let stacks = &snap.stacks;
    let mut visit = |i: usize, w: &Walker, out: &mut [Step]| {
        while peaks.get(pi).is_some_and(|p| p.0 == i) {
            let k = peaks[pi].1;
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
            out[k].sites = by_site(stacks, live.iter(), depth)
                .into_iter()
                .take(5)
                .map(|r| (r.site, r.bytes))
                .collect();
            pi += 1;
        }
        while ends.get(ei).is_some_and(|e| e.0 == i) {
            let k = ends[ei].1;
            let prev_end = if k == 0 { out[k].from } else { out[k - 1].to };
            out[k].growth = w
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
    dev.events.for_each_slice(|evs| {
        for ev in evs {
            w.step(ev, i, |b, s| c.category(b, s));
            i += 1;
            visit(i, &w, &mut out);
        }
    });
    Steps {
        device: dev.ordinal,
        source,
        steps: out,
    }
}

use crate::analyze::units::mib2 as mib;

/// One line naming the step that peaked, for `summary`.
pub fn peak_line(s: &Steps) -> Option<String> {
    let k = s.peak_step()?;
    let st = &s.steps[k];
    Some(format!(
        "steps: {} found ({}); the peak was in step {} of {}: {} after event {}",
        s.steps.len(),
        s.source,
        k + 1,
        s.steps.len(),
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
    for (k, st) in s.steps.iter().enumerate() {
        let top = st
            .categories
            .first()
            .map(|c| format!("{} {}", c.0, mib(c.1)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:>5}  {:>21}  {:>14}  {:>14}  {top}",
            k + 1,
            format!("{}..{}", st.from, st.to),
            mib(st.peak),
            mib(st.growth)
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
}
