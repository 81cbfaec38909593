//! `cushim replay`: a recorded trace through the real engine (the caching allocator over a
//! fake device) under the recorded settings and others, to answer "what would this setting
//! have done?".
//!
//! Policy: each device's trace is replayed on its own fake device, of the size
//! `device_size` chooses (given, recorded, or inferred from the trace's release-and-retry
//! and out-of-memory entries; the reason is printed). The replay starts from the recorded
//! layout when the trace began (`seed`): each segment then live is created at its size and
//! carved into its blocks and free gaps in address order, so the cache holds the same gaps
//! the recording had; a block that cannot be placed so under a setting (a segment beyond
//! its `max_split_size`) is allocated where the engine puts it. An `alloc` is a `malloc`
//! on its recorded stream; a block goes back to the cache when its free completed
//! (`free_completed`: when the recorded allocator could reuse it). A recorded failed
//! request (`oom`) is requested again and counted when it fails again (when it succeeds,
//! on a larger device, it is given back at once: the program never held it). Peak
//! allocated is counted as the recorded row counts it, and as PyTorch's
//! `allocated_bytes` does: a block stops being allocated when the program frees it
//! (`free_requested`), though the cache cannot reuse it before the free completes; each
//! block counts the size the engine rounds its request to (under the replayed settings).
//! Recorded segment events are not replayed (the engine makes its own), except the
//! program's own cache releases: a run of segment frees that no release-and-retry and no
//! out-of-memory explains (`torch.cuda.empty_cache()`) empties the replayed cache at the
//! same moment, under every configuration (it is the program's call, not a setting's). The device
//! allocations and segment frees it made while seeding are not counted, so each column
//! compares the trace's own. What the replay cannot know is listed with the table
//! ([`Replay::notes`]).
//!
//! Passes: the trace is walked once for what the replays need first (the device size's
//! evidence, the start layout, the recorded row: `analyze::walk`), then once more for all
//! the configurations together, each fed every event in turn; the configurations are
//! shared out among the available cores (one thread each, seeded and replayed there, each
//! decoding the log for itself: `EventList::fan_out`). A configuration whose settings act
//! on the trace as an earlier one's on the same device size is replayed once, as the
//! engine is deterministic: the same settings once parsed (the recorded settings are often
//! PyTorch's defaults, written out), or the same but for a `max_split_size_mb` that no block
//! of the trace can reach (`Seed::split_limit_inert`). A `garbage_collection_threshold`
//! trial whose settings without it are replayed too is replayed after them, and only if
//! their reserved memory passed its threshold (else collection never acted: the same
//! replay). Notes name the rows so copied. The replays of one thread share one numbering of
//! the recorded addresses (`analyze::replay_slots`).

use crate::analyze::device_size::{choose, Evidence};
use crate::analyze::model::{Device, Event, Snapshot};
use crate::analyze::pytorch_pages::{parse_conf as parse, recorded_conf};
use crate::analyze::replay_slots::Slots;
use crate::analyze::seed::{Piece, SeedSegment};
use crate::analyze::timeline::Peaks;
use crate::analyze::units::mib1;
use crate::analyze::walk::{walks_of, Walked};
use crate::replay_device::{NoFaults, ReplayDevice};
use cushim::alloc::rounding::{round_size, segment_size, LARGE_BUFFER};
use cushim::alloc::{gc_threshold, AddrMap, CachingAllocator};
use cushim::config::alloc::AllocConf;
use cushim::trace::event::{Action, NullSink};
use std::sync::Arc;

/// The largest device a replay models (`device_size::UNLIMITED`, 256 GiB). It also bounds
/// what a crafted request costs the replay: the engine keeps host-side records per mapped
/// page of expandable segments (tens of MB for a TiB), and the fake device's expandable
/// path overflows past its 16 TiB address span.
const UNLIMITED: u64 = crate::analyze::device_size::UNLIMITED;

/// The size of every small-pool segment (PyTorch's `kSmallBuffer`).
const SMALL_SEGMENT: u64 = 2 << 20;

/// The largest small-pool request (PyTorch's `kSmallSize`).
const SMALL_SIZE: u64 = 1 << 20;

/// What the user asked of a replay beyond the configurations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// `--device-memory`: the device size to replay on.
    pub device_memory: Option<u64>,
}

/// One configuration's figures on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What the column is (`recorded`, `replay: <conf>`).
    pub label: String,
    /// `None` when not known (the recorded column of a log: it has no segments).
    pub peak_reserved: Option<u64>,
    pub peak_allocated: u64,
    /// Device allocation calls (cudaMalloc, or physical pages for expandable segments);
    /// `None` when not known (the recorded column of a log).
    pub device_allocs: Option<u64>,
    /// Segments given back to the device (cache released to make room, `empty_cache`,
    /// garbage collection); `None` when not known.
    pub segment_frees: Option<u64>,
    pub ooms: u64,
}

impl Row {
    /// `1 - peak allocated / peak reserved` (0 when nothing was reserved).
    pub fn fragmentation(&self) -> Option<f64> {
        match self.peak_reserved? {
            0 => Some(0.0),
            r => Some(1.0 - self.peak_allocated as f64 / r as f64),
        }
    }
}

/// The replay of one device.
#[derive(Debug, Clone)]
pub struct DeviceReplay {
    pub ordinal: i64,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

/// The replay of an input.
#[derive(Debug, Clone)]
pub struct Replay {
    pub devices: Vec<DeviceReplay>,
    pub notes: Vec<String>,
}

/// The configurations replayed when none is given: PyTorch's defaults, expandable
/// segments, `max_split_size_mb` at a few sizes, and the garbage collection threshold.
pub fn default_confs() -> Vec<String> {
    [
        "",
        "expandable_segments:True",
        "pytorch_expandable_segments:True",
        "max_split_size_mb:32",
        "max_split_size_mb:128",
        "max_split_size_mb:512",
        "garbage_collection_threshold:0.6",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// What "peak allocated" means in every row (the definition `summary` and `demo` use).
pub const PEAK_ALLOCATED: &str = "peak allocated: the most bytes at once in blocks the program \
    held (PyTorch's allocated_bytes.all.peak, as summary and demo print it), over the trace";

/// The note about the two expandable-segment plans.
pub const NO_FIXED_PAGES: &str = "expandable_segments:True is cushim's page plan (pages sized \
    to the need, moved between holes); pytorch_expandable_segments:True is PyTorch's (fixed \
    2 MiB small-pool and 20 MiB large-pool pages, one reservation per stream and pool, pages \
    given back only when the cache is released); a PyTorch snapshot recorded with expandable \
    segments replays its recorded row under PyTorch's";

/// The recorded column: its peaks, and the device allocations counted in the same walk.
fn recorded_row(snap: &Snapshot, p: &Peaks, allocs: u64, e: &Evidence) -> Row {
    Row {
        label: "recorded".into(),
        peak_reserved: snap.has_state.then_some(p.reserved),
        peak_allocated: p.allocated,
        device_allocs: snap.has_state.then_some(allocs),
        segment_frees: snap.has_state.then_some(e.segment_frees),
        ooms: p.ooms,
    }
}

/// What a replay starts from: the recorded layout, and the live blocks outside it; the
/// indices of the events at which the program emptied the cache; and the largest request
/// the trace makes.
struct Seed {
    segments: Vec<SeedSegment>,
    outside: Vec<(u64, u64, bool)>,
    releases: Vec<usize>,
    largest_request: u64,
}

impl Seed {
    fn of(w: &Walked) -> Seed {
        let (segments, outside) = w.start_layout.clone();
        Seed {
            segments,
            outside,
            releases: w.releases.clone(),
            largest_request: w.largest_request,
        }
    }

    /// An upper bound on every block a replay under `c` (without expandable segments) can
    /// hold: every block lies in one segment, and each segment is made for one request of
    /// at most the largest size the replay asks for (the trace's requests, the seeded
    /// segments and blocks), at the segment size the engine gives a request of that size
    /// or less. That size is not monotonic (a request just under 10 MiB gets a 20 MiB
    /// segment, one of 10 MiB its own size), hence the maximum over both.
    fn largest_block(&self, c: &AllocConf) -> u64 {
        let seeded = self.segments.iter().map(|s| s.size);
        let outside = self.outside.iter().map(|o| o.1);
        let most = seeded.chain(outside).fold(self.largest_request, u64::max);
        let rounded = round_size(most, c);
        if rounded <= SMALL_SIZE {
            SMALL_SEGMENT
        } else {
            segment_size(rounded).max(LARGE_BUFFER)
        }
    }

    /// Whether `max_split_size_mb` cannot act on this trace under `c`: no block can reach
    /// it (`largest_block`), so no request is oversize, no block is refused as one and
    /// every split is made as without it (`alloc::caching`'s `oversize_refuses` and
    /// `splits`, `release_oversize`). Only without expandable segments, whose
    /// reservations grow past any request.
    fn split_limit_inert(&self, c: &AllocConf) -> bool {
        c.max_split_size != u64::MAX
            && !c.expandable_segments
            && self.largest_block(c) < c.max_split_size
    }

    /// The settings a replay under `c` depends on, on this trace: `c` without the text it
    /// was parsed from and without a `max_split_size_mb` that cannot act on it
    /// ([`Self::split_limit_inert`]). Two trials whose settings are equal so replay the
    /// same, event for event: the engine is deterministic.
    fn acting(&self, mut c: AllocConf) -> AllocConf {
        c.raw.clear();
        if self.split_limit_inert(&c) {
            let d = AllocConf::default();
            c.max_split_size = d.max_split_size;
            c.max_non_split_rounding_size = d.max_non_split_rounding_size;
        }
        c
    }
}

/// What a replay keeps of a recorded block: the engine's pointer in its place, the bytes it
/// counts, whether its free was requested.
type Held = (u64, u64, bool);

/// One configuration's replay of one device, fed the trace an event at a time
/// ([`Run::step`]), so that every configuration is replayed in one walk of the trace.
struct Run {
    a: CachingAllocator,
    conf: AllocConf,
    capacity: u64,
    /// Recorded address -> the engine's pointer, the bytes it counts, whether pending: the
    /// blocks the seeding laid out, until [`Run::adopt`] moves them to `held`.
    ptrs: AddrMap<Held>,
    /// The same per live recorded address, by its slot (`analyze::replay_slots`).
    held: Vec<Option<Held>>,
    allocated: u64,
    peak_allocated: u64,
    ooms: u64,
    /// The device allocations and frees the seeding made.
    seeded: (u64, u64),
    /// The program's cache releases (event indices, ascending), the next one's place in
    /// them, and the index of the next event.
    releases: Vec<usize>,
    next_release: usize,
    at: usize,
    /// The first request that failed: the event's index (`None`: while laying out the
    /// blocks live when the trace began) and its size.
    first_oom: Option<(Option<usize>, u64)>,
}

impl Run {
    /// A request beyond the whole device cannot succeed on it; such sizes (from a corrupt
    /// or crafted input) never reach the engine.
    fn malloc(&self, size: u64, stream: u64) -> Result<u64, cushim::alloc::AllocError> {
        if size > self.capacity {
            Err(cushim::alloc::AllocError::OutOfMemory)
        } else {
            self.a.malloc(0, size, stream, 0)
        }
    }

    /// Successful device allocations and frees (the engine's counts, as PyTorch's
    /// num_device_alloc/free: a failed attempt is not one).
    fn device_calls(&self) -> (u64, u64) {
        let st = self.a.stats(0);
        let n = |k: &str| st.get(k).copied().unwrap_or(0).max(0) as u64;
        (n("num_device_alloc"), n("num_device_free"))
    }

    /// A replay under `conf` on a device of `capacity` bytes, seeded with `seed`.
    fn new(seed: &Seed, capacity: u64, conf: &str) -> Result<Run, String> {
        let (c, errs) = parse(conf);
        if let Some(e) = errs.first() {
            return Err(format!("--conf {conf:?}: {e}"));
        }
        let capacity = capacity.min(UNLIMITED);
        let fake = Arc::new(ReplayDevice::<NoFaults>::new(1, capacity));
        // Device allocations fall in address, as the driver mostly gives them: PyTorch's
        // best fit breaks ties by address (see `ReplayDevice::set_descending`).
        fake.set_descending();
        let a = CachingAllocator::new(fake, c.clone(), &|_| Box::new(NullSink));
        let mut run = Run {
            a,
            conf: c,
            capacity,
            ptrs: AddrMap::default(),
            held: Vec::new(),
            allocated: 0,
            peak_allocated: 0,
            ooms: 0,
            seeded: (0, 0),
            releases: seed.releases.clone(),
            next_release: 0,
            at: 0,
            first_oom: None,
        };
        // Seeding: per segment, create it whole, give it back to the cache, then take its
        // pieces in address order (each split from the front of what is left); the free
        // gaps are held until every segment is carved, so no later piece lands in one.
        let mut gaps: Vec<u64> = Vec::new();
        let hold = |run: &mut Run, gaps: &mut Vec<u64>, addr: u64, size: u64, piece, p| match piece
        {
            Piece::Free => gaps.push(p),
            Piece::Allocated | Piece::Pending => {
                let n = round_size(size, &run.conf);
                let pending = piece == Piece::Pending;
                if !pending {
                    run.allocated += n;
                }
                run.ptrs.insert(addr, (p, n, pending));
            }
        };
        for seg in &seed.segments {
            let whole = [(seg.address, seg.size, Piece::Free)];
            let pieces: &[(u64, u64, Piece)] = if seg.pieces.is_empty() {
                &whole
            } else {
                &seg.pieces
            };
            // A small-pool segment (2 MiB of blocks of 1 MiB at most) is made by its first
            // block; a large one by a request of its size. No large segment is 2 MiB (a
            // request above 1 MiB gets 20 MiB, one above 10 MiB its own size), so a 2 MiB
            // segment is a small one, whatever its pieces: its free gaps are taken in
            // small requests (1 MiB at most), or they would be served from the large pool.
            let small = !seg.expandable && seg.size == SMALL_SEGMENT;
            let split: Vec<(u64, u64, Piece)>;
            let pieces: &[(u64, u64, Piece)] = if small {
                split = pieces
                    .iter()
                    .flat_map(|&(a, n, p)| {
                        let step = if p == Piece::Free { 1 << 20 } else { n.max(1) };
                        (0..n.div_ceil(step)).map(move |k| {
                            let at = k * step;
                            (a + at, step.min(n - at), p)
                        })
                    })
                    .collect();
                &split
            } else {
                pieces
            };
            if !small && pieces.len() > 1 && !seg.expandable {
                if let Ok(p) = run.malloc(seg.size, seg.stream) {
                    let _ = run.a.free(p, 0, 0);
                }
            }
            // A large-pool block keeps the tail of its free block when what would be left
            // is a small size (PyTorch splits a large block only when more than 1 MiB is
            // left); the trace records the request, so such a block shows as the request
            // and a gap of 1 MiB at most. Taken alone, that gap would be a small request,
            // served from a new small-pool segment: the block is taken with its tail.
            let large = !small && !seg.expandable;
            let mut i = 0;
            while i < pieces.len() {
                let (addr, size, piece) = pieces[i];
                i += 1;
                if seg.expandable && piece == Piece::Free {
                    continue;
                }
                let mut take = size;
                if let Some(&(_, tail, Piece::Free)) = pieces.get(i) {
                    if large && piece != Piece::Free && tail <= SMALL_SIZE {
                        take += tail;
                        i += 1;
                    }
                }
                match run.malloc(take, seg.stream) {
                    Ok(p) => hold(&mut run, &mut gaps, addr, size, piece, p),
                    Err(_) if piece != Piece::Free => {
                        run.ooms += 1;
                        run.first_oom.get_or_insert((None, size));
                    }
                    Err(_) => {}
                }
            }
        }
        for &(addr, size, pending) in &seed.outside {
            let piece = if pending {
                Piece::Pending
            } else {
                Piece::Allocated
            };
            match run.malloc(size, 0) {
                Ok(p) => hold(&mut run, &mut gaps, addr, size, piece, p),
                Err(_) => {
                    run.ooms += 1;
                    run.first_oom.get_or_insert((None, size));
                }
            }
        }
        for g in gaps {
            let _ = run.a.free(g, 0, 0);
        }
        run.seeded = run.device_calls();
        run.peak_allocated = run.allocated;
        Ok(run)
    }

    /// The seeded blocks, each in its address's slot of `slots`.
    fn adopt(&mut self, slots: &mut Slots) {
        for (addr, h) in std::mem::take(&mut self.ptrs) {
            let k = slots.assign(addr) as usize;
            if self.held.len() <= k {
                self.held.resize(k + 1, None);
            }
            self.held[k] = Some(h);
        }
    }

    /// Replay one recorded event, whose address has slot `slot` (`replay_slots::NONE`
    /// when it is not an allocation or a free of a live address); `held` has a place for
    /// every slot.
    #[inline]
    fn step(&mut self, ev: &Event, slot: u32) {
        let i = self.at;
        self.at += 1;
        if self.releases.get(self.next_release) == Some(&i) {
            self.next_release += 1;
            self.a.empty_cache();
        }
        match ev.action {
            Action::Alloc => match self.malloc(ev.size, ev.stream) {
                Ok(p) => {
                    let n = round_size(ev.size, &self.conf);
                    self.allocated += n;
                    let cell = self.held.get_mut(slot as usize);
                    if let Some((old, m, pending)) = cell.and_then(|c| c.replace((p, n, false))) {
                        // The recording reused an address we still hold: a free was lost.
                        let _ = self.a.free(old, 0, 0);
                        if !pending {
                            self.allocated = self.allocated.saturating_sub(m);
                        }
                    }
                    self.peak_allocated = self.peak_allocated.max(self.allocated);
                }
                Err(_) => self.failed(i, ev.size),
            },
            // A request that failed in the recording: asked again; on a device where it
            // fits, given back at once (the program never held it).
            Action::Oom => match self.malloc(ev.size, ev.stream) {
                Ok(p) => {
                    let _ = self.a.free(p, 0, 0);
                }
                Err(_) => self.failed(i, ev.size),
            },
            // Without requests in the trace (older PyTorch, logs) the completed free is
            // the program's free too.
            Action::FreeRequested => {
                if let Some(Some(e)) = self.held.get_mut(slot as usize) {
                    if !e.2 {
                        self.allocated = self.allocated.saturating_sub(e.1);
                        e.2 = true;
                    }
                }
            }
            Action::FreeCompleted => {
                if let Some((p, n, pending)) =
                    self.held.get_mut(slot as usize).and_then(Option::take)
                {
                    if !pending {
                        self.allocated = self.allocated.saturating_sub(n);
                    }
                    let _ = self.a.free(p, 0, 0);
                }
            }
            _ => {}
        }
    }

    fn failed(&mut self, i: usize, size: u64) {
        self.ooms += 1;
        self.first_oom.get_or_insert((Some(i), size));
    }

    fn peak_reserved(&self) -> u64 {
        let stats = self.a.stats(0);
        stats
            .get("reserved_bytes.all.peak")
            .copied()
            .unwrap_or(0)
            .max(0) as u64
    }

    fn row(&self, label: String) -> Row {
        let end = self.device_calls();
        Row {
            label,
            peak_reserved: Some(self.peak_reserved()),
            peak_allocated: self.peak_allocated,
            device_allocs: Some(end.0.saturating_sub(self.seeded.0)),
            segment_frees: Some(end.1.saturating_sub(self.seeded.1)),
            ooms: self.ooms,
        }
    }
}

/// Replay `dev` under each of `confs` on a device of `capacity` bytes from `seed`: every
/// configuration in one walk of the trace (a log is decoded once per core, not once per
/// configuration), the configurations shared out among the available cores.
/// Rows in the order of `confs`.
fn replay_all(
    dev: &Device,
    seed: &Seed,
    capacity: u64,
    confs: &[(String, String)],
) -> Result<Vec<Outcome>, String> {
    let trials: Vec<Trial> = confs
        .iter()
        .map(|(c, l)| Trial {
            conf: c.clone(),
            label: l.clone(),
            capacity,
        })
        .collect();
    run_trials(dev, seed, &trials)
}

/// The replays one thread runs together, the slots of their recorded addresses, and the
/// slots of the chunk being replayed.
struct Group {
    slots: Slots,
    runs: Vec<(usize, Run)>,
    chunk_slots: Vec<u32>,
}

/// One replay to run: a configuration, its row's label, and the device size.
#[derive(Debug, Clone)]
pub struct Trial {
    pub conf: String,
    pub label: String,
    pub capacity: u64,
}

/// What one [`Trial`] gave: its row, and its first failed request (the event's index,
/// `None` while laying out the blocks live when the trace began; and the request's size).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub row: Row,
    pub first_oom: Option<(Option<usize>, u64)>,
    /// Whether the trial's `max_split_size_mb` could not act (`Seed::split_limit_inert`):
    /// its row is the replay without it.
    pub inert_split: bool,
    /// When the trial's garbage collection could not act (its row is the replay without
    /// it): that replay's peak reserved bytes, and the threshold they stayed within.
    pub inert_gc: Option<(u64, u64)>,
}

/// The replays `trials` of `dev` from `w`'s start layout, each on its own device size,
/// all in one pass over the trace (shared out among the cores); outcomes in order.
pub fn trials(dev: &Device, w: &Walked, trials: &[Trial]) -> Result<Vec<Outcome>, String> {
    run_trials(dev, &Seed::of(w), trials)
}

fn run_trials(dev: &Device, seed: &Seed, trials: &[Trial]) -> Result<Vec<Outcome>, String> {
    // Every configuration is checked first, so the error is the first bad one's.
    for t in trials {
        if let Some(e) = parse(&t.conf).1.first() {
            return Err(format!("--conf {:?}: {e}", t.conf));
        }
    }
    // A trial the same as an earlier one (the same settings once parsed, on the same
    // device size: the recorded settings are often PyTorch's defaults, written out; a
    // `max_split_size_mb` no block reaches) is not replayed again: the engine is
    // deterministic, so it would give the same outcome.
    let parsed: Vec<AllocConf> = trials.iter().map(|t| parse(&t.conf).0).collect();
    let inert_split: Vec<bool> = parsed.iter().map(|c| seed.split_limit_inert(c)).collect();
    let keys: Vec<_> = trials
        .iter()
        .zip(parsed)
        .map(|(t, c)| (seed.acting(c), t.capacity.min(UNLIMITED)))
        .collect();
    let first: Vec<usize> = (0..trials.len())
        .map(|i| keys[..i].iter().position(|k| *k == keys[i]).unwrap_or(i))
        .collect();
    let unique: Vec<usize> = (0..trials.len()).filter(|&i| first[i] == i).collect();
    // A trial that collects garbage (`garbage_collection_threshold`) whose settings without
    // it are replayed too waits for that replay: collection acts only when reserved memory
    // passes the threshold, so where the replay without it never passed it, the two are
    // the same replay. Only the others are replayed, after.
    let without_gc = |i: usize| -> Option<usize> {
        let (c, capacity) = &keys[i];
        if c.garbage_collection_threshold <= 0.0 {
            return None;
        }
        let mut plain = c.clone();
        plain.garbage_collection_threshold = 0.0;
        unique
            .iter()
            .copied()
            .find(|&j| keys[j].0 == plain && keys[j].1 == *capacity)
    };
    let shadow: Vec<Option<usize>> = (0..trials.len()).map(without_gc).collect();
    let mut ran: Vec<Option<Run>> = (0..trials.len()).map(|_| None).collect();
    let now: Vec<usize> = unique
        .iter()
        .copied()
        .filter(|&i| shadow[i].is_none())
        .collect();
    replay_group(dev, seed, trials, &now, &mut ran)?;
    let mut inert_gc: Vec<Option<(u64, u64)>> = vec![None; trials.len()];
    let mut later = Vec::new();
    for &i in &unique {
        let Some(r) = shadow[i].and_then(|j| ran[j].as_ref()) else {
            continue;
        };
        let peak = r.peak_reserved();
        match gc_threshold(&keys[i].0, r.a.total_memory(0)) {
            Some(t) if peak > t => later.push(i),
            t => inert_gc[i] = Some((peak, t.unwrap_or(u64::MAX))),
        }
    }
    replay_group(dev, seed, trials, &later, &mut ran)?;
    let mut out: Vec<Outcome> = Vec::with_capacity(trials.len());
    for (i, t) in trials.iter().enumerate() {
        let k = first[i];
        let from = match (inert_gc[k], shadow[k]) {
            (Some(_), Some(j)) => j,
            _ => k,
        };
        let Some(r) = &ran[from] else {
            return Err(format!("the replay under {:?} did not finish", t.conf));
        };
        out.push(Outcome {
            row: r.row(t.label.clone()),
            first_oom: r.first_oom,
            inert_split: inert_split[i],
            inert_gc: inert_gc[k],
        });
    }
    Ok(out)
}

/// Replay the trials `which` of `trials` in one pass over the trace, into `ran` (by trial).
fn replay_group(
    dev: &Device,
    seed: &Seed,
    trials: &[Trial],
    which: &[usize],
    ran: &mut [Option<Run>],
) -> Result<(), String> {
    if which.is_empty() {
        return Ok(());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let groups = cores.min(which.len()).max(1);
    // One decoding of the trace for every group; each group's configurations are seeded
    // and replayed on the group's own thread (the engine's locks and its thread tracking
    // expect one thread, as the shim's hot path mostly sees).
    let done = dev.events.fan_out(
        groups,
        |g| -> Result<Group, String> {
            let mut runs = which
                .iter()
                .skip(g)
                .step_by(groups)
                .map(|&i| Ok((i, Run::new(seed, trials[i].capacity, &trials[i].conf)?)))
                .collect::<Result<Vec<_>, String>>()?;
            let mut slots = Slots::default();
            for (_, r) in runs.iter_mut() {
                r.adopt(&mut slots);
            }
            Ok(Group {
                slots,
                runs,
                chunk_slots: Vec::new(),
            })
        },
        |group, evs| {
            let Ok(g) = group else { return };
            g.slots.of_chunk(evs, &mut g.chunk_slots);
            let n = g.slots.len();
            for (_, r) in g.runs.iter_mut() {
                r.held.resize(n, None);
                for (ev, &k) in evs.iter().zip(&g.chunk_slots) {
                    r.step(ev, k);
                }
            }
        },
    );
    for g in done {
        for (i, r) in g?.runs {
            ran[i] = Some(r);
        }
    }
    Ok(())
}

/// Replay every device of `snap` under the recorded settings (when recorded) and `confs`.
pub fn replay(snap: &Snapshot, confs: &[String]) -> Result<Replay, String> {
    replay_with(snap, confs, &Options::default(), None)
}

/// [`replay`] with the user's [`Options`], and each device's walk when the reader made them
/// (`input::read_walked`, one per device of `snap` in order); else the traces are walked here.
///
/// An input without any device trace is an error: a replay of nothing would print an
/// empty table and succeed, which a script would take for a passing replay.
pub fn replay_with(
    snap: &Snapshot,
    confs: &[String],
    opts: &Options,
    walks: Option<&[Walked]>,
) -> Result<Replay, String> {
    no_trace(snap)?;
    let walks = walks_of(snap, walks);
    let walked: Vec<&Walked> = snap
        .devices
        .iter()
        .zip(walks.iter())
        .filter(|(d, _)| !d.events.is_empty())
        .map(|(_, w)| w)
        .collect();
    replay_walked(snap, confs, opts, &walked)
}

/// [`replay_with`] given each replayed device's [`Walked`] (one per device with a trace, in
/// order), when the caller walked the traces already.
pub fn replay_walked(
    snap: &Snapshot,
    confs: &[String],
    opts: &Options,
    walked: &[&Walked],
) -> Result<Replay, String> {
    let mut notes = Vec::new();
    match &snap.settings {
        Some(s) => notes.push(format!("recorded settings: {:?}", s)),
        None => notes.push("the input records no allocator settings: the recorded row is replayed under PyTorch's defaults".into()),
    }
    notes.push(NO_FIXED_PAGES.into());
    notes.push(PEAK_ALLOCATED.into());
    let mut devices = Vec::new();
    let devs = snap.devices.iter().filter(|d| !d.events.is_empty());
    for (dev, w) in devs.zip(walked.iter()) {
        let st = &w.start;
        let ev = &w.evidence;
        let size = choose(opts.device_memory, snap.device_total, ev);
        let mut dnotes = vec![format!("device memory: {}", size.why)];
        let before = st.state.allocated.len() + st.state.pending.len();
        let seed = Seed::of(w);
        let segments = &seed.segments;
        if before > 0 || !segments.is_empty() {
            let bytes = st.state.allocated_bytes + st.state.pending_bytes;
            let gaps: usize = segments
                .iter()
                .map(|s| s.pieces.iter().filter(|p| p.2 == Piece::Free).count())
                .sum();
            dnotes.push(format!(
                "{before} blocks ({bytes} bytes) were live before the trace began (inferred from the segments by undoing the trace); the replays start from that layout: {} segments with {gaps} free gaps at their recorded offsets; those blocks' allocation order and sites are not known",
                segments.len()
            ));
        }
        if ev.segment_frees > 0 || ev.ooms > 0 {
            dnotes.push(format!(
                "the recording freed {} segments ({} times releasing its cache to retry a failed device allocation, {} times releasing it at the program's request, replayed at those moments) and ran out of memory {} times",
                ev.segment_frees, ev.retries, ev.explicit_releases, ev.ooms
            ));
        }
        if st.inconsistent > 0 {
            dnotes.push(format!(
                "{} events contradict the recorded state and were skipped",
                st.inconsistent
            ));
        }
        if st.requests {
            dnotes.push("blocks return to the cache when their recorded free completed; under other settings frees might complete at other times".into());
        }
        let mut rows = vec![recorded_row(snap, &w.peaks, w.segment_allocs, ev)];
        let recorded_conf = recorded_settings(snap);
        let mut all = vec![(
            recorded_conf.clone(),
            format!("replay: recorded ({})", shown(&recorded_conf)),
        )];
        all.extend(
            confs
                .iter()
                .map(|c| (c.clone(), format!("replay: {}", shown(c)))),
        );
        let outcomes = replay_all(dev, &seed, size.bytes, &all)?;
        let inert: Vec<&str> = all
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.inert_split)
            .map(|((c, _), _)| c.as_str())
            .collect();
        if !inert.is_empty() {
            dnotes.push(format!(
                "{} cannot act on this trace: no block reaches the limit (the largest \
                 request is {}; no segment the replay makes exceeds {}), so each row is the \
                 replay without it",
                inert.join(", "),
                mib1(seed.largest_request),
                mib1(seed.largest_block(&AllocConf::default()))
            ));
        }
        for ((c, _), o) in all.iter().zip(&outcomes) {
            if let Some((peak, threshold)) = o.inert_gc {
                let note = format!(
                    "{c} cannot act on this trace: reserved memory peaked at {} without it, \
                     within its threshold of {}, so its row is the replay without it",
                    mib1(peak),
                    mib1(threshold)
                );
                if !dnotes.contains(&note) {
                    dnotes.push(note);
                }
            }
        }
        rows.extend(outcomes.into_iter().map(|o| o.row));
        devices.push(DeviceReplay {
            ordinal: dev.ordinal,
            rows,
            notes: dnotes,
        });
    }
    Ok(Replay { devices, notes })
}

/// The configuration the recorded row replays under: the recorded settings, a PyTorch
/// snapshot's expandable segments being PyTorch's (`pytorch_pages`).
pub fn recorded_settings(snap: &Snapshot) -> String {
    let pytorch = snap.cushim.is_none() && snap.has_state;
    recorded_conf(&snap.settings.clone().unwrap_or_default(), pytorch)
}

/// The error for an input with no device trace, if it has none.
pub fn no_trace(snap: &Snapshot) -> Result<(), String> {
    if snap.devices.iter().any(|d| !d.events.is_empty()) {
        return Ok(());
    }
    let segments: usize = snap.devices.iter().map(|d| d.segments.len()).sum();
    Err(format!(
        "no allocation trace to replay: the input has {segments} segments but no trace entries \
         (record with torch.cuda.memory._record_memory_history(), or CUSHIM_HISTORY)"
    ))
}

fn shown(conf: &str) -> &str {
    if conf.is_empty() {
        "PyTorch defaults"
    } else {
        conf
    }
}

/// The text `cushim replay` prints.
pub fn render(r: &Replay) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for d in &r.devices {
        let _ = writeln!(out, "device {}:", d.ordinal);
        let width = d
            .rows
            .iter()
            .map(|r| r.label.chars().count())
            .max()
            .unwrap_or(0)
            .max(8);
        let _ = writeln!(
            out,
            "  {:<width$} {:>9} {:>14} {:>15} {:>8} {:>13} {:>5}",
            "settings",
            "seg frees",
            "peak reserved",
            "peak allocated",
            "frag",
            "device allocs",
            "OOMs"
        );
        for row in &d.rows {
            let allocs = row
                .device_allocs
                .map_or_else(|| "-".to_string(), |n| n.to_string());
            let reserved = row.peak_reserved.map_or_else(|| "-".to_string(), mib1);
            let frag = row
                .fragmentation()
                .map_or_else(|| "-".to_string(), |f| format!("{:.1}%", f * 100.0));
            let seg_frees = row
                .segment_frees
                .map_or_else(|| "-".to_string(), |n| n.to_string());
            let _ = writeln!(
                out,
                "  {:<width$} {:>9} {:>14} {:>15} {:>8} {:>13} {:>5}",
                row.label,
                seg_frees,
                reserved,
                mib1(row.peak_allocated),
                frag,
                allocs,
                row.ooms
            );
        }
        for n in &d.notes {
            let _ = writeln!(out, "  note: {n}");
        }
    }
    if r.devices.is_empty() {
        out.push_str("no device trace to replay in this input\n");
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// The JSON `cushim replay --json` prints (`docs/json/replay.schema.json`): the same rows
/// and notes as the text.
pub fn json(r: &Replay, file: &str) -> serde_json::Value {
    use serde_json::json;
    json!({
        "schema_version": 1,
        "command": "replay",
        "file": file,
        "devices": r.devices.iter().map(|d| json!({
            "device": d.ordinal,
            "rows": d.rows.iter().map(|row| json!({
                "label": row.label,
                "recorded": row.label == "recorded",
                "peak_reserved_bytes": row.peak_reserved,
                "peak_allocated_bytes": row.peak_allocated,
                "fragmentation": row.fragmentation(),
                "device_allocs": row.device_allocs,
                "segment_frees": row.segment_frees,
                "ooms": row.ooms,
            })).collect::<Vec<_>>(),
            "notes": d.notes,
        })).collect::<Vec<_>>(),
        "notes": r.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// The committed public snapshots, and those of the folder `CUSHIM_REAL_SNAPSHOTS`
    /// names, if set (to check the rule on more real files than the tree can hold).
    fn real_files() -> Vec<PathBuf> {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/real");
        let mut dirs = vec![here];
        dirs.extend(std::env::var_os("CUSHIM_REAL_SNAPSHOTS").map(PathBuf::from));
        let mut files: Vec<PathBuf> = dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().contains(".pickle"))
            .collect();
        files.sort();
        files
    }

    /// One replay of `conf`, alone (nothing to share it with, so nothing deduplicated).
    fn alone(dev: &Device, seed: &Seed, capacity: u64, conf: &str) -> Row {
        let t = Trial {
            conf: conf.into(),
            label: conf.into(),
            capacity,
        };
        let mut out = run_trials(dev, seed, &[t]).expect("replay");
        out.remove(0).row
    }

    /// Each device trace of [`real_files`]: the file, the device, its seed and the device
    /// size its replays run on.
    fn each_real_trace(mut f: impl FnMut(&Path, &Device, &Seed, u64)) {
        for file in real_files() {
            let snap = crate::analyze::input::read(&file).expect("a committed snapshot reads");
            for dev in snap.devices.iter().filter(|d| !d.events.is_empty()) {
                let w = crate::analyze::walk::walk(&snap, dev);
                let capacity = choose(None, snap.device_total, &w.evidence).bytes;
                f(&file, dev, &Seed::of(&w), capacity);
            }
        }
    }

    fn figures(r: &Row) -> (Option<u64>, u64, Option<u64>, Option<u64>, u64) {
        (
            r.peak_reserved,
            r.peak_allocated,
            r.device_allocs,
            r.segment_frees,
            r.ooms,
        )
    }

    #[test]
    fn a_split_limit_no_block_reaches_replays_exactly_as_without_it_on_real_snapshots() {
        let (mut inert, mut acting) = (0, 0);
        each_real_trace(|f, dev, seed, capacity| {
            let plain = alone(dev, seed, capacity, "");
            for mb in [20, 32, 128, 512, 4096] {
                let conf = format!("max_split_size_mb:{mb}");
                let c = parse(&conf).0;
                if !seed.split_limit_inert(&c) {
                    acting += 1;
                    assert_ne!(seed.acting(c), seed.acting(parse("").0));
                    continue;
                }
                inert += 1;
                let forced = alone(dev, seed, capacity, &conf);
                assert_eq!(
                    figures(&forced),
                    figures(&plain),
                    "{}: device {}: {conf} replayed apart differs from the replay without it",
                    f.display(),
                    dev.ordinal
                );
            }
        });
        assert!(inert > 0 && acting > 0, "inert {inert}, acting {acting}");
    }

    #[test]
    fn a_garbage_collection_threshold_never_passed_gives_the_replay_without_it_on_real_snapshots() {
        let (mut inert, mut acting) = (0, 0);
        each_real_trace(|f, dev, seed, capacity| {
            for t in ["0.05", "0.6", "0.95"] {
                let conf = format!("garbage_collection_threshold:{t}");
                let both: Vec<Trial> = ["", conf.as_str()]
                    .iter()
                    .map(|c| Trial {
                        conf: c.to_string(),
                        label: c.to_string(),
                        capacity,
                    })
                    .collect();
                let out = run_trials(dev, seed, &both).expect("replay");
                match out[1].inert_gc {
                    Some(_) => inert += 1,
                    None => acting += 1,
                }
                assert_eq!(
                    figures(&out[1].row),
                    figures(&alone(dev, seed, capacity, &conf)),
                    "{}: device {}: {conf} beside the defaults differs from its replay alone",
                    f.display(),
                    dev.ordinal
                );
            }
        });
        assert!(inert > 0 && acting > 0, "inert {inert}, acting {acting}");
    }

    #[test]
    fn settings_written_out_as_the_defaults_are_replayed_once_with_the_defaults() {
        let seed = Seed {
            segments: Vec::new(),
            outside: Vec::new(),
            releases: Vec::new(),
            largest_request: 8 << 20,
        };
        let plain = seed.acting(parse("").0);
        assert_eq!(seed.acting(parse("expandable_segments:False").0), plain);
        // The largest segment a request of 8 MiB gets is 20 MiB.
        assert_eq!(seed.largest_block(&parse("").0), 20 << 20);
        assert_eq!(seed.acting(parse("max_split_size_mb:21").0), plain);
        assert_ne!(seed.acting(parse("max_split_size_mb:20").0), plain);
        // Expandable segments grow past any request: the limit may act there.
        let exp = seed.acting(parse("expandable_segments:True").0);
        assert_ne!(
            seed.acting(parse("expandable_segments:True,max_split_size_mb:512").0),
            exp
        );
        let big = Seed {
            largest_request: 100 << 20,
            ..seed
        };
        assert_ne!(big.acting(parse("max_split_size_mb:32").0), plain);
    }
}
