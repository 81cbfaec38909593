//! `cushim fit`: the smallest device on which a recorded trace replays without running out
//! of memory, under the recorded settings and other configurations; and, given a device
//! size, which configurations fit it and where each that does not first fails.
//!
//! Policy: the answer is searched over the replay itself (`replay::trials`), at 2 MiB
//! steps, all configurations of a device in lockstep (one pass over the trace per round,
//! the configurations shared out among the cores). A configuration's search starts from
//! two sizes it already knows: below its peak allocated nothing fits (every byte counted
//! there was on the device at once), and at its peak reserved on an unlimited device it
//! fits (checked; when it does not, as `garbage_collection_threshold` makes likely, the
//! upper size doubles its distance until it does). Between them, bisection, keeping a
//! failing size below and a passing size above, ends with a size that passes and 2 MiB
//! less that fails: replayed, never assumed, except below the peak allocated, where no
//! device fits. Fitting is not always monotonic (a
//! smaller device makes the cache release earlier, which can pack better), so a few larger
//! sizes are replayed too and any that fails is reported, never hidden. The recorded
//! settings are the recorded row's (`replay::recorded_settings`).
//!
//! A failure is described by what the recording shows at the failing event: the request's
//! size and allocation site, and what the program held then, by site.

use crate::analyze::device_size::UNLIMITED;
use crate::analyze::frames::site;
use crate::analyze::model::{Device, Snapshot};
use crate::analyze::replay::{self, recorded_settings, Trial};
use crate::analyze::sites::{by_site, SiteRow};
use crate::analyze::timeline::state_after;
use crate::analyze::walk::{walks_of, Walked};

/// The search's step: device sizes are multiples of it.
pub const STEP: u64 = 2 << 20;

/// Larger sizes replayed after the search, to find where fitting is not monotonic.
const PROBES: u64 = 4;

/// Where a replay first ran out of memory, as the recording shows that moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The failing event's index in the device's trace; `None` while laying out the
    /// blocks live when the trace began.
    pub event: Option<usize>,
    /// The request's size.
    pub size: u64,
    /// The request's allocation site.
    pub site: String,
    /// Bytes the program held then, and the largest sites among them.
    pub live_bytes: u64,
    pub live: Vec<SiteRow>,
}

/// One configuration's answer on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfFit {
    pub name: String,
    pub recorded: bool,
    /// The smallest device (a multiple of [`STEP`]) on which the trace replays without an
    /// out-of-memory; `None` when it does not even on the largest device modelled.
    pub min_device_bytes: Option<u64>,
    /// Larger sizes that were replayed and failed (fitting is not monotonic there).
    pub larger_failing: Vec<u64>,
    /// Replays this configuration's search took.
    pub replays: u64,
    /// On the device size given: `None` when none was given, else whether it fits, and
    /// where it first fails when it does not.
    pub at_size: Option<Result<(), Failure>>,
}

/// One device's answers.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFit {
    pub ordinal: i64,
    pub peak_allocated: u64,
    /// The recorded peak reserved (`None` for a log, which has no segments).
    pub recorded_peak_reserved: Option<u64>,
    pub confs: Vec<ConfFit>,
}

/// The answer for an input.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub device_memory: Option<u64>,
    pub devices: Vec<DeviceFit>,
}

impl Fit {
    /// Whether the recorded settings fit the given size on every device (`None` when no
    /// size was given).
    pub fn recorded_fits(&self) -> Option<bool> {
        self.device_memory?;
        Some(self.devices.iter().all(|d| {
            d.confs
                .iter()
                .filter(|c| c.recorded)
                .all(|c| matches!(c.at_size, Some(Ok(()))))
        }))
    }
}

fn down(b: u64) -> u64 {
    b / STEP * STEP
}

fn up(b: u64) -> u64 {
    b.div_ceil(STEP) * STEP
}

/// The search's state for one configuration.
struct Search {
    /// A size known to fail (`None`: nothing below was tried: below peak allocated).
    lo: u64,
    /// A size known to pass, once one is.
    hi: Option<u64>,
    /// The size to try next and whether the search is over.
    next: Option<u64>,
    /// The size at which the unlimited replay peaked (the first upper guess).
    guess: u64,
    never: bool,
    replays: u64,
}

/// Search every configuration of `confs` (`(configuration, name, recorded)`) on `dev`.
fn search_device(
    snap: &Snapshot,
    dev: &Device,
    w: &Walked,
    confs: &[(String, String, bool)],
    size: Option<u64>,
) -> Result<DeviceFit, String> {
    let trial = |i: usize, capacity: u64| Trial {
        conf: confs[i].0.clone(),
        label: confs[i].1.clone(),
        capacity,
    };
    // Round 0: unlimited, for each configuration's peaks.
    let first: Vec<Trial> = (0..confs.len()).map(|i| trial(i, UNLIMITED)).collect();
    let unlimited = replay::trials(dev, w, &first)?;
    let mut s: Vec<Search> = unlimited
        .iter()
        .map(|o| {
            let never = o.row.ooms > 0;
            // A trace that never reserved anything fits on any device.
            if !never && o.row.peak_reserved == Some(0) {
                return Search {
                    lo: 0,
                    hi: Some(0),
                    next: None,
                    guess: 0,
                    never,
                    replays: 1,
                };
            }
            let lo = down(o.row.peak_allocated.saturating_sub(1));
            let guess = up(o.row.peak_reserved.unwrap_or(0)).max(lo + STEP);
            Search {
                lo,
                hi: None,
                next: (!never).then_some(guess),
                guess,
                never,
                replays: 1,
            }
        })
        .collect();
    // Bisection, every configuration that is not done in one pass per round.
    loop {
        let active: Vec<usize> = (0..s.len()).filter(|&i| s[i].next.is_some()).collect();
        if active.is_empty() {
            break;
        }
        let ts: Vec<Trial> = active
            .iter()
            .map(|&i| trial(i, s[i].next.unwrap_or(UNLIMITED)))
            .collect();
        let out = replay::trials(dev, w, &ts)?;
        for (&i, o) in active.iter().zip(&out) {
            let c = &mut s[i];
            c.replays += 1;
            let tried = c.next.unwrap_or(UNLIMITED);
            let below = c.lo;
            if o.row.ooms == 0 {
                c.hi = Some(tried);
            } else {
                c.lo = tried;
            }
            c.next = match c.hi {
                // Not yet a passing size: double the distance above the last failing one.
                None if tried >= UNLIMITED => {
                    c.never = true;
                    None
                }
                None => Some(up(tried + tried.saturating_sub(below).max(STEP)).min(UNLIMITED)),
                Some(hi) if hi - c.lo > STEP => Some(c.lo + (hi - c.lo) / STEP / 2 * STEP),
                Some(_) => None,
            };
        }
    }
    // Probes above the smallest size found: any that fails is reported.
    let mut probes: Vec<(usize, u64)> = Vec::new();
    for (i, c) in s.iter().enumerate() {
        let Some(min) = c.hi else { continue };
        let top = c.guess.max(min);
        let mut sizes = vec![min + STEP];
        for k in 1..=PROBES {
            sizes.push(up(min + (top - min) * k / PROBES));
        }
        sizes.sort_unstable();
        sizes.dedup();
        probes.extend(sizes.into_iter().filter(|&z| z > min).map(|z| (i, z)));
    }
    let mut larger: Vec<Vec<u64>> = vec![Vec::new(); s.len()];
    if !probes.is_empty() {
        let ts: Vec<Trial> = probes.iter().map(|&(i, z)| trial(i, z)).collect();
        for (&(i, z), o) in probes.iter().zip(replay::trials(dev, w, &ts)?) {
            s[i].replays += 1;
            if o.row.ooms > 0 {
                larger[i].push(z);
            }
        }
    }
    // The size given.
    let mut at_size: Vec<Option<Result<(), Failure>>> = vec![None; s.len()];
    if let Some(z) = size {
        let ts: Vec<Trial> = (0..confs.len()).map(|i| trial(i, z)).collect();
        for (i, o) in replay::trials(dev, w, &ts)?.into_iter().enumerate() {
            at_size[i] = Some(match o.first_oom {
                None if o.row.ooms == 0 => Ok(()),
                first => Err(failure(snap, dev, w, first.unwrap_or((None, 0)))),
            });
        }
    }
    let confs = confs
        .iter()
        .zip(s)
        .zip(larger)
        .zip(at_size)
        .map(
            |((((_, name, recorded), c), larger_failing), at_size)| ConfFit {
                name: name.clone(),
                recorded: *recorded,
                min_device_bytes: if c.never { None } else { c.hi },
                larger_failing,
                replays: c.replays,
                at_size,
            },
        )
        .collect();
    Ok(DeviceFit {
        ordinal: dev.ordinal,
        peak_allocated: w.peaks.allocated,
        recorded_peak_reserved: snap.has_state.then_some(w.peaks.reserved),
        confs,
    })
}

/// What the recording shows at a failing event.
fn failure(
    snap: &Snapshot,
    dev: &Device,
    w: &Walked,
    (event, size): (Option<usize>, u64),
) -> Failure {
    let (state, stack) = match event {
        Some(i) => (
            state_after(dev, &w.start, i),
            dev.events.iter().nth(i).map_or(0, |e| e.stack),
        ),
        None => (w.start.state.clone(), 0),
    };
    let site = match event {
        Some(_) => site(&snap.stacks, stack, 1),
        None => "a block live before the trace began".to_string(),
    };
    let mut live = by_site(&snap.stacks, state.allocated.values(), 1);
    live.truncate(5);
    Failure {
        event,
        size,
        site,
        live_bytes: state.allocated_bytes,
        live,
    }
}

/// The configurations `fit` tries: the recorded settings first, then `confs` (or
/// `replay`'s defaults), as `(configuration, name, recorded)`.
pub fn configurations(snap: &Snapshot, confs: &[String]) -> Vec<(String, String, bool)> {
    let rec = recorded_settings(snap);
    let mut out = vec![(rec.clone(), format!("recorded ({})", shown(&rec)), true)];
    let others = if confs.is_empty() {
        replay::default_confs()
    } else {
        confs.to_vec()
    };
    out.extend(others.into_iter().map(|c| {
        let name = shown(&c).to_string();
        (c, name, false)
    }));
    out
}

fn shown(conf: &str) -> &str {
    if conf.is_empty() {
        "PyTorch defaults"
    } else {
        conf
    }
}

/// Fit every device of `snap` with a trace; `walks`: each device's walk when the reader
/// made them (`input::read_walked`, one per device of `snap` in order), else each trace is
/// walked here.
pub fn fit(
    snap: &Snapshot,
    confs: &[String],
    size: Option<u64>,
    walks: Option<&[Walked]>,
) -> Result<Fit, String> {
    replay::no_trace(snap)?;
    let all = configurations(snap, confs);
    let walks = walks_of(snap, walks);
    let mut devices = Vec::new();
    for (dev, w) in snap.devices.iter().zip(walks.iter()) {
        if !dev.events.is_empty() {
            devices.push(search_device(snap, dev, w, &all, size)?);
        }
    }
    Ok(Fit {
        device_memory: size,
        devices,
    })
}

use crate::analyze::units::mib1 as mib;

/// The text `cushim fit` prints.
pub fn render(f: &Fit) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for d in &f.devices {
        let _ = write!(
            out,
            "device {}: peak allocated {}",
            d.ordinal,
            mib(d.peak_allocated)
        );
        if let Some(r) = d.recorded_peak_reserved {
            let _ = write!(out, ", recorded peak reserved {}", mib(r));
        }
        out.push('\n');
        let width = d
            .confs
            .iter()
            .map(|c| c.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(8);
        let _ = write!(out, "  {:<width$} {:>18}", "settings", "smallest device");
        if let Some(z) = f.device_memory {
            let _ = write!(out, "  on {}", mib(z));
        }
        out.push('\n');
        for c in &d.confs {
            let min = c
                .min_device_bytes
                .map_or_else(|| "does not fit".to_string(), mib);
            let _ = write!(out, "  {:<width$} {:>18}", c.name, min);
            match &c.at_size {
                Some(Ok(())) => out.push_str("  fits"),
                Some(Err(_)) => out.push_str("  does not fit"),
                None => {}
            }
            out.push('\n');
        }
        for c in &d.confs {
            if !c.larger_failing.is_empty() {
                let sizes: Vec<String> = c.larger_failing.iter().map(|&b| mib(b)).collect();
                let _ = writeln!(
                    out,
                    "  note: {}: fits on {} but not on the larger {} (a smaller device \
                     releases the cache earlier, which can pack better)",
                    c.name,
                    c.min_device_bytes.map_or_else(String::new, mib),
                    sizes.join(", ")
                );
            }
            if let Some(Err(e)) = &c.at_size {
                let at = e.event.map_or_else(
                    || "while laying out the blocks live when the trace began".to_string(),
                    |i| format!("at event {i}"),
                );
                let _ = writeln!(
                    out,
                    "  {}: first out-of-memory {at}: a request of {} at {}; the program held {} then{}",
                    c.name,
                    mib(e.size),
                    e.site,
                    mib(e.live_bytes),
                    if e.live.is_empty() { "" } else { ", largest sites:" }
                );
                for r in &e.live {
                    let _ = writeln!(
                        out,
                        "      {:>12} {:>6} blocks  {}",
                        mib(r.bytes),
                        r.count,
                        r.site
                    );
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "note: the smallest device memory on which the whole trace replays without an \
         out-of-memory, searched at {} steps over the replay: it passes there and fails on {} \
         less (replayed, or below the peak allocated, where nothing fits){}",
        mib(STEP),
        mib(STEP),
        match f.recorded_fits() {
            Some(true) => "; the recorded settings fit the size given (exit status 0)",
            Some(false) => "; the recorded settings do not fit the size given (exit status 1)",
            None => "",
        }
    );
    out
}

/// The JSON `cushim fit --json` prints (`docs/json/fit.schema.json`).
pub fn json(f: &Fit, file: &str) -> serde_json::Value {
    use serde_json::json;
    let conf = |c: &ConfFit| {
        let at = c.at_size.as_ref().map(|r| match r {
            Ok(()) => json!({ "fits": true }),
            Err(e) => json!({
                "fits": false,
                "first_failure": {
                    "event_index": e.event,
                    "request_bytes": e.size,
                    "site": e.site,
                    "live_bytes": e.live_bytes,
                    "live_by_site": e.live.iter().map(|r| json!({
                        "site": r.site, "bytes": r.bytes, "blocks": r.count
                    })).collect::<Vec<_>>(),
                }
            }),
        });
        json!({
            "name": c.name,
            "recorded": c.recorded,
            "min_device_bytes": c.min_device_bytes,
            "larger_failing_bytes": c.larger_failing,
            "replays": c.replays,
            "at_device_memory": at,
        })
    };
    // Across devices, a configuration needs the largest of its devices' sizes (one
    // device size for all, as GPUs of one machine are).
    let names: Vec<(String, bool)> = f
        .devices
        .first()
        .map(|d| {
            d.confs
                .iter()
                .map(|c| (c.name.clone(), c.recorded))
                .collect()
        })
        .unwrap_or_default();
    let top: Vec<serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, (name, recorded))| {
            let per: Vec<Option<u64>> = f
                .devices
                .iter()
                .map(|d| d.confs.get(i).and_then(|c| c.min_device_bytes))
                .collect();
            let min = if per.iter().all(Option::is_some) {
                per.iter().flatten().max().copied()
            } else {
                None
            };
            let fits = f.device_memory.map(|_| {
                f.devices.iter().all(|d| {
                    matches!(
                        d.confs.get(i).and_then(|c| c.at_size.as_ref()),
                        Some(Ok(()))
                    )
                })
            });
            json!({ "name": name, "recorded": recorded, "min_device_bytes": min, "fits": fits })
        })
        .collect();
    json!({
        "schema_version": 1,
        "command": "fit",
        "file": file,
        "step_bytes": STEP,
        "device_memory_bytes": f.device_memory,
        "recorded_fits": f.recorded_fits(),
        "configurations": top,
        "devices": f.devices.iter().map(|d| json!({
            "device": d.ordinal,
            "peak_allocated_bytes": d.peak_allocated,
            "recorded_peak_reserved_bytes": d.recorded_peak_reserved,
            "configurations": d.confs.iter().map(conf).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
