//! The device memory a replay runs on: given (`--device-memory`), recorded in the file, or
//! inferred from what the recording shows of the device's limit; and the reason, which
//! `replay` prints.
//!
//! Policy, in order:
//! 1. `--device-memory SIZE`: the user knows best.
//! 2. The size the file records (`cushim.memory[].total`).
//! 3. A recorded out-of-memory: PyTorch's `oom` entry carries the free memory the driver
//!    reported (`device_free`); with the bytes reserved at that moment it is the memory the
//!    process could use.
//!    A recorded out-of-memory also says the device was full then, whatever the other
//!    evidence, so it wins over release-and-retry; `device_free` 0 is such a report.
//! 4. PyTorch's release-and-retry: when a device allocation fails, the allocator frees its
//!    cached segments (`segment_free` entries) and allocates again (`segment_alloc`). The
//!    failed attempt bounds the usable memory from above (reserved before the release plus
//!    the new segment), every segment held bounds it from below (the peak reserved). The
//!    replay runs at the middle of the tightest bounds, so both the failures and the
//!    successes of the recording happen again. An episode is the program's own
//!    `empty_cache` before an allocation, not a failure, and bounds nothing, when its
//!    bound is below the peak reserved, or when a segment it freed (whole, so one free
//!    block) on the request's stream and pool would have held the request that followed:
//!    PyTorch looks in its cache before it asks the device, so it would have served the
//!    request from that block and never released anything (a loop that calls
//!    `empty_cache` every iteration frees all it holds and allocates again at once).
//! 5. Otherwise 256 GiB, beyond any GPU so far (no replay runs out of memory).

use crate::analyze::model::{Device, Event};
use crate::analyze::timeline::Start;
use cushim::trace::event::Action;

/// Device memory for inputs that say nothing of the device's size.
pub const UNLIMITED: u64 = 256 << 30;

/// The device size chosen and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSize {
    pub bytes: u64,
    pub why: String,
}

/// What the trace shows of the device's limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The most bytes reserved at once (start included).
    pub peak_reserved: u64,
    /// Release-and-retry episodes seen, and the smallest reserved + new segment among them.
    pub retries: u64,
    pub retry_bound: Option<u64>,
    /// Segments freed in the trace, all told.
    pub segment_frees: u64,
    /// Recorded out-of-memory entries, and the largest reserved + reported free among them.
    pub ooms: u64,
    pub oom_capacity: Option<u64>,
    /// Runs of segment frees that no release-and-retry and no out-of-memory explains: the
    /// program's own cache releases (`torch.cuda.empty_cache()`), replayed at their moments.
    pub explicit_releases: u64,
}

/// One run of segment frees: where it began, what it bounds when an allocation followed,
/// and whether an out-of-memory ended it.
#[derive(Debug, Clone)]
struct FreeRun {
    at: usize,
    bound: Option<u64>,
    oom: bool,
    /// The largest segment the run freed, per stream and pool (small: 2 MiB segments), so
    /// the request that followed can be checked against what the cache held.
    freed: Vec<(u64, bool, u64)>,
    /// Whether a freed segment would have held the request that followed.
    served: bool,
}

/// PyTorch's small pool's segment size: requests of at most 1 MiB come from 2 MiB segments.
const SMALL_SEGMENT: u64 = 2 << 20;
const SMALL_REQUEST: u64 = 1 << 20;

/// The walk of [`evidence`], fed an event at a time (so that it shares one walk of the
/// trace with other analyses).
#[derive(Debug, Clone, Default)]
pub struct EvidenceWalk {
    e: Evidence,
    reserved: u64,
    /// Reserved before the current run of segment frees, if one is running.
    run_start: Option<u64>,
    /// The index of the event being walked.
    i: usize,
    runs: Vec<FreeRun>,
    /// A run ended by a segment allocation waits for that allocation's request (the next
    /// `alloc`) to tell whether the cache could have served it.
    awaiting_request: bool,
}

impl EvidenceWalk {
    pub fn new(st: &Start) -> EvidenceWalk {
        let reserved = st.state.reserved;
        EvidenceWalk {
            e: Evidence {
                peak_reserved: reserved,
                ..Default::default()
            },
            reserved,
            run_start: None,
            i: 0,
            runs: Vec::new(),
            awaiting_request: false,
        }
    }

    #[inline]
    pub fn step(&mut self, ev: &Event) {
        let e = &mut self.e;
        let i = self.i;
        self.i += 1;
        match ev.action {
            Action::SegmentFree | Action::SegmentUnmap => {
                e.segment_frees += u64::from(ev.action == Action::SegmentFree);
                if self.run_start.is_none() {
                    self.run_start = Some(self.reserved);
                    self.awaiting_request = false;
                    self.runs.push(FreeRun {
                        at: i,
                        bound: None,
                        oom: false,
                        freed: Vec::new(),
                        served: false,
                    });
                }
                if ev.action == Action::SegmentFree {
                    if let Some(run) = self.runs.last_mut() {
                        let small = ev.size == SMALL_SEGMENT;
                        match run
                            .freed
                            .iter_mut()
                            .find(|(st, sm, _)| *st == ev.stream && *sm == small)
                        {
                            Some(f) => f.2 = f.2.max(ev.size),
                            None => run.freed.push((ev.stream, small, ev.size)),
                        }
                    }
                }
                self.reserved = self.reserved.saturating_sub(ev.size);
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                if let Some(r) = self.run_start.take() {
                    if let Some(run) = self.runs.last_mut() {
                        run.bound = Some(r.saturating_add(ev.size));
                        self.awaiting_request = true;
                    }
                }
                self.reserved = self.reserved.saturating_add(ev.size);
                e.peak_reserved = e.peak_reserved.max(self.reserved);
            }
            Action::Oom => {
                if self.run_start.take().is_some() {
                    if let Some(run) = self.runs.last_mut() {
                        run.oom = true;
                    }
                }
                e.ooms += 1;
                // `addr` carries the free memory the driver reported (0: none left).
                let c = self.reserved.saturating_add(ev.addr);
                e.oom_capacity = Some(e.oom_capacity.map_or(c, |o: u64| o.max(c)));
            }
            Action::Alloc if self.awaiting_request => {
                self.awaiting_request = false;
                if let Some(run) = self.runs.last_mut() {
                    let small = ev.size <= SMALL_REQUEST;
                    run.served = run
                        .freed
                        .iter()
                        .any(|&(st, sm, size)| st == ev.stream && sm == small && size >= ev.size);
                }
                self.run_start = None;
            }
            _ => self.run_start = None,
        }
    }

    pub fn finish(self) -> Evidence {
        self.finish_with_releases().0
    }

    /// The evidence, and the indices of the events at which the program released the
    /// cache itself (the first segment free of each such run).
    pub fn finish_with_releases(self) -> (Evidence, Vec<usize>) {
        let mut e = self.e;
        let peak = e.peak_reserved;
        // A release-and-retry allocates past everything held before it (the device
        // refused the allocation): its bound is above the peak, and the cache held no
        // block for the request. Any other run of frees not ending in an out-of-memory is
        // the program's.
        let retry = |r: &FreeRun| !r.served && r.bound.is_some_and(|b| b > peak);
        let valid: Vec<u64> = self
            .runs
            .iter()
            .filter(|r| retry(r))
            .filter_map(|r| r.bound)
            .collect();
        let releases: Vec<usize> = self
            .runs
            .iter()
            .filter(|r| !retry(r) && !r.oom)
            .map(|r| r.at)
            .collect();
        e.retries = valid.len() as u64;
        e.retry_bound = valid.into_iter().min();
        e.explicit_releases = releases.len() as u64;
        (e, releases)
    }
}

/// Walk `dev`'s trace from `st` and collect the [`Evidence`].
pub fn evidence(dev: &Device, st: &Start) -> Evidence {
    let mut w = EvidenceWalk::new(st);
    dev.events
        .for_each_slice(|evs| evs.iter().for_each(|e| w.step(e)));
    w.finish()
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The device size for a replay of a device with evidence `e`: `given` by the user, else
/// `recorded` by the file, else inferred (see the module comment).
pub fn choose(given: Option<u64>, recorded: Option<u64>, e: &Evidence) -> DeviceSize {
    if let Some(b) = given {
        return DeviceSize {
            bytes: b,
            why: format!("{} ({b} bytes), as given by --device-memory", gib(b)),
        };
    }
    if let Some(b) = recorded {
        let b = b.min(UNLIMITED);
        return DeviceSize {
            bytes: b,
            why: format!("{} ({b} bytes), the size the file records", gib(b)),
        };
    }
    if let Some(c) = e.oom_capacity {
        let b = c.max(e.peak_reserved);
        return DeviceSize {
            bytes: b,
            why: format!(
                "{} ({b} bytes), inferred: at a recorded out-of-memory the driver reported \
                 the rest of it free while the cache held the rest",
                gib(b)
            ),
        };
    }
    if let Some(u) = e.retry_bound {
        let lo = e.peak_reserved;
        let mid = lo + (u - lo) / 2;
        let b = (mid & !((1 << 20) - 1)).max(lo);
        return DeviceSize {
            bytes: b,
            why: format!(
                "{} ({b} bytes), inferred: the recording released cached segments to retry a \
                 failed device allocation {} times, so the device held at least {} (peak \
                 reserved) and less than {}; the replay runs midway",
                gib(b),
                e.retries,
                gib(lo),
                gib(u)
            ),
        };
    }
    DeviceSize {
        bytes: UNLIMITED,
        why: "256 GiB (the largest modelled): the file records no device size and the trace \
              never reached the device's limit (no release-and-retry, no out-of-memory)"
            .into(),
    }
}

/// Parse a size such as `80GiB`, `81920MiB`, `40G`, `1024M` or a byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("--device-memory {s:?}: expected a size such as 80GiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("--device-memory {s:?}: unknown unit {u:?}")),
    };
    let b = n * mult as f64;
    if !(1.0..=(1u64 << 50) as f64).contains(&b) {
        return Err(format!("--device-memory {s:?}: out of range"));
    }
    Ok(b as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::model::Event;

    fn ev(action: Action, addr: u64, size: u64) -> Event {
        Event {
            action,
            addr,
            size,
            stream: 0,
            stack: 0,
        }
    }

    #[test]
    fn release_and_retry_bounds_the_device_and_empty_cache_does_not() {
        let g = 1u64 << 30;
        let dev = Device {
            ordinal: 0,
            segments: Vec::new(),
            events: vec![
                ev(Action::SegmentAlloc, 0, 6 * g),
                ev(Action::SegmentAlloc, 0, 2 * g),
                // Failed at 8 + 4 GiB: released 2 GiB, then 4 GiB fit.
                ev(Action::SegmentFree, 0, 2 * g),
                ev(Action::SegmentAlloc, 0, 4 * g),
                // The program's empty_cache then a small segment: bound 10 + 1 < peak? no:
                // 10 GiB reserved, frees 4, allocates 1: bound 11 GiB, above the peak.
            ]
            .into(),
        };
        let e = evidence(&dev, &Start::default());
        assert_eq!(
            (e.peak_reserved, e.retries, e.retry_bound),
            (10 * g, 1, Some(12 * g))
        );
        let d = choose(None, None, &e);
        assert_eq!(d.bytes, 11 * g);
        assert!(d.why.contains("inferred"), "{}", d.why);
        assert_eq!(choose(Some(5 * g), Some(g), &e).bytes, 5 * g);
        assert_eq!(choose(None, Some(g), &e).bytes, g);
        let none = evidence(&Device::default(), &Start::default());
        assert_eq!(choose(None, None, &none).bytes, UNLIMITED);
    }

    #[test]
    fn a_release_whose_freed_segment_held_the_next_request_is_the_programs_empty_cache() {
        let m = 1u64 << 20;
        // Each iteration: 26 MiB and 1 GiB segments, everything freed, then a 26 MiB
        // request: the freed 26 MiB segment would have held it, so PyTorch never asked the
        // device and released nothing of its own accord.
        let mut evs = Vec::new();
        for _ in 0..3 {
            evs.push(ev(Action::SegmentAlloc, 0, 26 * m));
            evs.push(ev(Action::Alloc, 0, 26 * m));
            evs.push(ev(Action::SegmentAlloc, 0, 1024 * m));
            evs.push(ev(Action::Alloc, 0, 1024 * m));
            evs.push(ev(Action::FreeCompleted, 0, 26 * m));
            evs.push(ev(Action::FreeCompleted, 0, 1024 * m));
            evs.push(ev(Action::SegmentFree, 0, 26 * m));
            evs.push(ev(Action::SegmentFree, 0, 1024 * m));
        }
        let dev = Device {
            ordinal: 0,
            segments: Vec::new(),
            events: evs.clone().into(),
        };
        let e = evidence(&dev, &Start::default());
        assert_eq!((e.retries, e.explicit_releases), (0, 3), "{e:?}");
        assert_eq!(choose(None, None, &e).bytes, UNLIMITED);
        // The same with a request no freed segment held (2 GiB): a release-and-retry.
        let mut retry = evs[..8].to_vec();
        retry.push(ev(Action::SegmentAlloc, 0, 2048 * m));
        retry.push(ev(Action::Alloc, 0, 2048 * m));
        let dev = Device {
            ordinal: 0,
            segments: Vec::new(),
            events: retry.into(),
        };
        let e = evidence(&dev, &Start::default());
        assert_eq!((e.retries, e.explicit_releases), (1, 0), "{e:?}");
    }

    #[test]
    fn a_recorded_oom_gives_reserved_plus_reported_free() {
        let g = 1u64 << 30;
        let dev = Device {
            ordinal: 0,
            segments: Vec::new(),
            events: vec![
                ev(Action::SegmentAlloc, 0, 3 * g),
                ev(Action::Oom, g, 2 * g),
            ]
            .into(),
        };
        let e = evidence(&dev, &Start::default());
        assert_eq!(choose(None, None, &e).bytes, 4 * g);
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("1024M").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
    }
}
