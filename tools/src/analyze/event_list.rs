//! One device's trace as the analyses walk it: held in memory (a snapshot's trace, which
//! the snapshot already held), or read again from a whole-run event log on every walk.
//!
//! Policy: a log's events are never all in memory. A log of a long run holds hundreds of
//! millions of events (32 bytes each in the model: gigabytes), so the model keeps only
//! where each events chunk is in the file and how many of this device's events it holds;
//! every walk (forward, backward, from any point) decodes one chunk at a time from the
//! file, kept open, so memory stays bounded by a chunk whatever the log's length. The
//! chunks were checked when the log was first read; one that reads differently later (the
//! file was rewritten under us) ends the walk with one line on stderr, never a panic.
//!
//! A walk costs about what decoding the log costs, so analyses that need the same events
//! share one walk ([`EventList::for_each_slice`] hands each decoded chunk, a slice in a
//! buffer reused from chunk to chunk, to every analysis the caller feeds), decoded on a
//! thread of its own ahead of them (`analyze::decode_ahead`); threads that each walk the
//! trace for their own analyses at once ([`EventList::fan_out`]) count as one pass.
//!
//! While the walks of a log take over a second and stderr is a terminal, a progress line
//! names the walk and how far it is (as `snapshot::progress` does for the first reading),
//! redrawn at most four times a second and cleared when the model is dropped.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::analyze::model::Event;
use crate::snapshot::log_reader::read_chunk_at;
use cushim::trace::event::NO_STACK;
use cushim::trace::log::codec::decode_events;

/// Where one events chunk is, and how many of a device's events it holds.
#[derive(Debug, Clone, Copy)]
pub struct ChunkRef {
    pub at: u64,
    pub len: u32,
    pub events: u32,
}

/// Log stack ids to model stack-list indices.
#[derive(Debug, Default)]
pub struct StackMap {
    /// Dense ids (the shim numbers its stacks from 0 up).
    dense: Vec<u32>,
    sparse: HashMap<u32, u32>,
    /// (stack id, NVTX range path id) -> the list of that stack with the range path's mark
    /// (`analyze::log_model`: what the categories and steps read a log's ranges from).
    ranged: HashMap<(u32, u32), u32>,
}

/// Ids below this go in the dense table.
const DENSE_IDS: u32 = 1 << 20;

impl StackMap {
    /// Whether any event was made inside an NVTX range.
    pub fn any_ranged(&self) -> bool {
        !self.ranged.is_empty()
    }

    /// The list index of `id`, if assigned (0 for no stack).
    #[inline]
    pub fn get(&self, id: u32) -> Option<u32> {
        if id == NO_STACK {
            return Some(0);
        }
        match self.dense.get(id as usize) {
            Some(&l) if l != 0 => Some(l),
            Some(_) => None,
            None if id < DENSE_IDS => None,
            None => self.sparse.get(&id).copied(),
        }
    }

    /// The list index of stack `id` made inside NVTX range path `range` (0: none).
    #[inline]
    pub fn get_in(&self, id: u32, range: u32) -> Option<u32> {
        if range == 0 {
            return self.get(id);
        }
        self.ranged
            .get(&(id, range))
            .copied()
            .or_else(|| self.get(id))
    }

    /// The list index of stack `id` inside range path `range`, if assigned.
    pub fn ranged(&self, id: u32, range: u32) -> Option<u32> {
        self.ranged.get(&(id, range)).copied()
    }

    pub fn insert_ranged(&mut self, id: u32, range: u32, list: u32) {
        self.ranged.insert((id, range), list);
    }

    pub fn insert(&mut self, id: u32, list: u32) {
        if id < DENSE_IDS {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, 0);
            }
            self.dense[i] = list;
        } else {
            self.sparse.insert(id, list);
        }
    }
}

/// The open log the walks read.
#[derive(Debug)]
pub struct LogFile {
    pub file: std::fs::File,
    pub name: String,
    pub stacks: StackMap,
    /// The log's format version.
    pub version: u32,
    /// Whether a walk failed already (said once).
    failed: AtomicBool,
    /// Walks started; progress lines (see the module docs).
    walks: AtomicU64,
    tty: bool,
    start: Instant,
    /// Milliseconds after `start` of the last progress line (0: none yet).
    shown_ms: AtomicU64,
}

impl LogFile {
    /// A progress line for chunk `i` of `n` of walk `walk`, if it is time for one.
    fn progress(&self, walk: u64, i: usize, n: usize) {
        if !self.tty {
            return;
        }
        let ms = self.start.elapsed().as_millis() as u64;
        let last = self.shown_ms.load(Ordering::Relaxed);
        if ms < 1000 || (last != 0 && ms < last + 250) {
            return;
        }
        self.shown_ms.store(ms, Ordering::Relaxed);
        let pct = (i * 100).checked_div(n).unwrap_or(100);
        let _ = write!(
            std::io::stderr(),
            "\rcushim: analysing {}: pass {walk}, {pct}%\x1b[K",
            self.name
        );
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        if self.shown_ms.load(Ordering::Relaxed) != 0 {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

impl LogFile {
    pub fn new(file: std::fs::File, name: String, stacks: StackMap, version: u32) -> LogFile {
        LogFile {
            file,
            name,
            stacks,
            version,
            failed: AtomicBool::new(false),
            walks: AtomicU64::new(0),
            tty: std::io::stderr().is_terminal(),
            start: Instant::now(),
            shown_ms: AtomicU64::new(0),
        }
    }
}

/// One device's events in a log.
#[derive(Debug, Clone)]
pub struct LogEvents {
    pub log: Arc<LogFile>,
    pub device: i32,
    pub chunks: Arc<[ChunkRef]>,
    pub len: usize,
}

/// A device's trace, oldest first.
#[derive(Debug, Clone)]
pub enum EventList {
    Mem(Vec<Event>),
    Log(LogEvents),
}

impl Default for EventList {
    fn default() -> Self {
        EventList::Mem(Vec::new())
    }
}

impl PartialEq for EventList {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (EventList::Mem(a), EventList::Mem(b)) => a == b,
            (EventList::Log(a), EventList::Log(b)) => {
                Arc::ptr_eq(&a.log, &b.log) && a.device == b.device
            }
            _ => self.len() == other.len() && self.iter().eq(other.iter()),
        }
    }
}

impl From<Vec<Event>> for EventList {
    fn from(v: Vec<Event>) -> Self {
        EventList::Mem(v)
    }
}

impl EventList {
    pub fn len(&self) -> usize {
        match self {
            EventList::Mem(v) => v.len(),
            EventList::Log(l) => l.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The events, oldest first (by value: a log's are decoded as the walk goes).
    pub fn iter(&self) -> Iter<'_> {
        match self {
            EventList::Mem(v) => Iter::Mem(v.iter()),
            EventList::Log(l) => Iter::Log(LogIter {
                dec: ChunkDecoder::new(l),
                lo: 0,
                hi: l.chunks.len(),
                front: Vec::new(),
                fi: 0,
                fe: 0,
                back: Vec::new(),
                bs: 0,
                be: 0,
                left: l.len,
            }),
        }
    }

    /// The events in memory, read from the log when they are not (for small inputs and
    /// tests that edit a trace).
    pub fn to_mut(&mut self) -> &mut Vec<Event> {
        if let EventList::Log(_) = self {
            *self = EventList::Mem(self.iter().collect());
        }
        match self {
            EventList::Mem(v) => v,
            EventList::Log(_) => unreachable!("made a Mem just above"),
        }
    }

    pub fn push(&mut self, e: Event) {
        self.to_mut().push(e);
    }

    pub fn pop(&mut self) -> Option<Event> {
        self.to_mut().pop()
    }

    pub fn clear(&mut self) {
        *self = EventList::Mem(Vec::new());
    }
}

impl<'a> IntoIterator for &'a EventList {
    type Item = Event;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// A walk over an [`EventList`].
pub enum Iter<'a> {
    Mem(std::slice::Iter<'a, Event>),
    Log(LogIter<'a>),
}

impl Iterator for Iter<'_> {
    type Item = Event;
    #[inline]
    fn next(&mut self) -> Option<Event> {
        match self {
            Iter::Mem(i) => i.next().copied(),
            Iter::Log(l) => l.next(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.len();
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Event> {
        match self {
            Iter::Mem(i) => i.next_back().copied(),
            Iter::Log(l) => l.next_back(),
        }
    }
}

impl ExactSizeIterator for Iter<'_> {
    fn len(&self) -> usize {
        match self {
            Iter::Mem(i) => i.len(),
            Iter::Log(l) => l.left,
        }
    }
}

/// Decodes one device's events of a log's chunks into buffers it reuses (no allocation
/// per chunk once they have grown), for the walks.
struct ChunkDecoder<'a> {
    src: &'a LogEvents,
    /// Which walk of the log this is, and the chunks it decoded (for the progress line).
    walk: u64,
    loaded: usize,
    /// A walker that leaves the progress line to another walker of the same pass.
    quiet: bool,
    buf: Vec<u8>,
}

impl<'a> ChunkDecoder<'a> {
    fn new(src: &'a LogEvents) -> Self {
        Self::in_pass(
            src,
            src.log.walks.fetch_add(1, Ordering::Relaxed) + 1,
            false,
        )
    }

    /// A decoder for walk `walk` of the log, one of several of that pass when `quiet`.
    fn in_pass(src: &'a LogEvents, walk: u64, quiet: bool) -> Self {
        ChunkDecoder {
            src,
            walk,
            loaded: 0,
            quiet,
            buf: Vec::new(),
        }
    }

    /// Decode chunk `i`'s events of this device into `out` (cleared first); false (said
    /// once) when it cannot be read.
    fn load(&mut self, i: usize, out: &mut Vec<Event>) -> bool {
        let c = self.src.chunks[i];
        let log = &*self.src.log;
        let n = self.src.chunks.len();
        self.loaded += 1;
        if !self.quiet {
            log.progress(self.walk, self.loaded, n);
        }
        out.clear();
        out.reserve(c.events as usize);
        let dev = self.src.device;
        let stacks = &log.stacks;
        let r = read_chunk_at(&log.file, c.at, c.len, &mut self.buf).and_then(|payload| {
            decode_events(payload, log.version, |e| {
                if e.device == dev {
                    let stack = stacks.get_in(e.stack, e.range).unwrap_or(0);
                    out.push(crate::analyze::log_model::model_event(&e, stack));
                }
            })
        });
        match r {
            Ok(_) if out.len() == c.events as usize => true,
            Ok(_) => self.fail(&format!(
                "the chunk at byte {} changed since it was first read",
                c.at
            )),
            Err(e) => self.fail(&e),
        }
    }

    fn fail(&self, e: &str) -> bool {
        if !self.src.log.failed.swap(true, Ordering::Relaxed) {
            eprintln!(
                "cushim: {}: {e}; the analysis stops at the events read so far",
                self.src.log.name
            );
        }
        false
    }
}

impl EventList {
    /// Walk the events oldest first, a slice at a time, handing each slice to `f`: a log
    /// is decoded once for every analysis `f` feeds (one pass instead of one per
    /// analysis), into a buffer reused from chunk to chunk. A log that cannot be read any
    /// further ends the walk (said once on stderr), as [`EventList::iter`] does.
    pub fn for_each_slice(&self, mut f: impl FnMut(&[Event])) {
        self.for_each_slice_while(|evs| {
            f(evs);
            true
        })
    }

    /// [`EventList::for_each_slice`] that stops after the slice for which `f` returns
    /// false (a log's later chunks are not decoded, but for the few decoded ahead).
    pub fn for_each_slice_while(&self, mut f: impl FnMut(&[Event]) -> bool) {
        match self {
            EventList::Mem(v) => {
                f(v);
            }
            EventList::Log(l) => {
                let mut d = ChunkDecoder::new(l);
                crate::analyze::decode_ahead::ahead(
                    l.chunks.len(),
                    move |i, out| d.load(i, out),
                    f,
                );
            }
        }
    }

    /// [`EventList::for_each_slice`] over the first `n` events only (a log's later chunks
    /// are not decoded, but for the few decoded ahead).
    pub fn for_each_slice_upto(&self, n: usize, mut f: impl FnMut(&[Event])) {
        let mut left = n;
        if left == 0 {
            return;
        }
        self.for_each_slice_while(|evs| {
            let k = left.min(evs.len());
            f(&evs[..k]);
            left -= k;
            left > 0
        });
    }

    /// Whether this trace is read from a log file none of whose events was made inside an
    /// NVTX range (false for a trace held in memory: not known here).
    pub fn log_without_ranges(&self) -> bool {
        matches!(self, EventList::Log(l) if !l.log.stacks.any_ranged())
    }

    /// Walk the events oldest first with `walkers` walkers, each on its own thread, where
    /// it makes its state (`init(walker)`) and is fed every slice in order by `f` (as
    /// [`EventList::for_each_slice`] feeds one); each walker decodes a log for itself (see
    /// below). The states back in walker order.
    pub fn fan_out<S: Send>(
        &self,
        walkers: usize,
        init: impl Fn(usize) -> S + Sync,
        f: impl Fn(&mut S, &[Event]) + Sync,
    ) -> Vec<S> {
        let (init, f) = (&init, &f);
        let walk = match self {
            EventList::Mem(_) => 0,
            EventList::Log(l) => l.log.walks.fetch_add(1, Ordering::Relaxed) + 1,
        };
        std::thread::scope(|s| {
            let walkers: Vec<_> = (0..walkers)
                .map(|w| {
                    s.spawn(move || {
                        let mut st = init(w);
                        match self {
                            EventList::Mem(v) => f(&mut st, v),
                            // Each walker decodes the log for itself, on its own thread:
                            // measured on two cores, one decoding handed across cores costs
                            // more than the decoding it saves (the walkers read every chunk
                            // from the other core's cache, and the decoding thread takes
                            // turns with them). The first walker's decoding draws the
                            // progress line.
                            EventList::Log(l) => {
                                let mut d = ChunkDecoder::in_pass(l, walk, w > 0);
                                let mut evs = Vec::new();
                                for i in 0..l.chunks.len() {
                                    if !d.load(i, &mut evs) {
                                        break;
                                    }
                                    f(&mut st, &evs);
                                }
                            }
                        }
                        st
                    })
                })
                .collect();
            walkers
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }
}

/// A walk over a log's events: chunks `lo..hi` not yet decoded, the decoded ones at both
/// ends being consumed (`front[fi..fe]` and `back[bs..be]`).
pub struct LogIter<'a> {
    dec: ChunkDecoder<'a>,
    lo: usize,
    hi: usize,
    front: Vec<Event>,
    fi: usize,
    fe: usize,
    back: Vec<Event>,
    bs: usize,
    be: usize,
    left: usize,
}

impl LogIter<'_> {
    fn stop(&mut self) -> Option<Event> {
        self.lo = self.hi;
        self.left = 0;
        (self.fi, self.fe, self.bs, self.be) = (0, 0, 0, 0);
        None
    }

    #[inline]
    fn next(&mut self) -> Option<Event> {
        loop {
            if self.fi < self.fe {
                let e = self.front[self.fi];
                self.fi += 1;
                self.left -= 1;
                return Some(e);
            }
            if self.lo < self.hi {
                let i = self.lo;
                self.lo += 1;
                if !self.dec.load(i, &mut self.front) {
                    return self.stop();
                }
                (self.fi, self.fe) = (0, self.front.len());
                continue;
            }
            // The last chunk, already decoded from the back: take it from its front.
            if self.bs < self.be {
                let e = self.back[self.bs];
                self.bs += 1;
                self.left -= 1;
                return Some(e);
            }
            return None;
        }
    }

    #[inline]
    fn next_back(&mut self) -> Option<Event> {
        loop {
            if self.bs < self.be {
                self.be -= 1;
                self.left -= 1;
                return Some(self.back[self.be]);
            }
            if self.lo < self.hi {
                self.hi -= 1;
                let i = self.hi;
                if !self.dec.load(i, &mut self.back) {
                    return self.stop();
                }
                (self.bs, self.be) = (0, self.back.len());
                continue;
            }
            // The first chunk, already decoded from the front: take it from its back.
            if self.fi < self.fe {
                self.fe -= 1;
                self.left -= 1;
                return Some(self.front[self.fe]);
            }
            return None;
        }
    }
}
