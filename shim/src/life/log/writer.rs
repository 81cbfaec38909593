//! The event log's writer thread: it wakes every [`FLUSH_MS`] ms, or when a ring has taken
//! a quarter of its size, takes what the rings hold at that moment, interns stacks into
//! frame and stack tables (symbolized here, off the allocating threads) and writes the
//! events in chunks of up to [`CHUNK_BYTES`]: one ring's finished blocks copied as they
//! are, the events of several rings merged by time (`event_ring.rs`); and the log's
//! close ([`finish`]: at exit, from the library's destructor after every `atexit` handler,
//! and on an ending signal), which drains the rings and writes `END`.
//!
//! Invariant: events leave a ring only once their chunk is written, and each chunk is
//! written holding the gate (`GATE`), so the crash path, once it holds the gate, finds in
//! the rings exactly the events not yet in the file. Every stack and range id published
//! before a round's events is written before them (`write_tables`), so a reader meets a
//! stack's or range's record before the first event that names it. The writer state is a
//! leaked box: a fork child installs its own and never locks or drops its parent's (whose
//! thread does not exist in the child and may have held its lock at the fork).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{fence, AtomicPtr, Ordering};
use std::time::Duration;

use cushim::trace::intern::StackTable;
use cushim::trace::log::codec::{
    put_count, put_frame, put_range, put_stack, MarkEncoder, RangeMark,
};
use cushim::trace::log::format::{self, kind, CHUNK_HEAD};
use cushim::trace::module_epochs;
use cushim::trace::range::path as range_path;
use cushim::trace::runtime_frames::leading_runtime_frames;
use cushim::trace::symbolize::Symbolizer;
use parking_lot::Mutex;

use super::event_ring::{self, fill_from_one, fill_merged, Span};
use super::ring::Ring;
use super::shared::{
    CHUNK_BYTES, DRAINING, DROPPED, FD, FLUSH_MS, GATE, IDLE, IN_CHILD, MARKS, MAX_RANGE,
    MAX_STACK, ON, RANGES_DONE, ROOM, STACKS_DONE, THREAD, WAITING, WRITER_TID, WRITING,
};

/// The writer state (a leaked box: a fork child replaces it with its own, and never drops
/// its parent's).
static WRITER: AtomicPtr<Mutex<Writer>> = AtomicPtr::new(std::ptr::null_mut());

/// Install a fresh writer state (the log just opened; a fork child's replaces its parent's,
/// which is leaked, never dropped or locked).
pub(super) fn install_new_writer() {
    let w = Box::new(Mutex::new(Writer {
        sym: Symbolizer::new(),
        stacks_written: Vec::new(),
        ranges_written: Vec::new(),
        frames_written: 0,
        events_written: 0,
        dropped_written: 0,
        payload: vec![0u8; CHUNK_BYTES],
        chunk: vec![0u8; CHUNK_HEAD + CHUNK_BYTES],
        side: Vec::new(),
        out: Vec::new(),
        range_ids: Vec::new(),
        ips: Vec::new(),
        ids: Vec::new(),
        spans: Vec::new(),
        ended: false,
    }));
    WRITER.store(Box::into_raw(w), Ordering::Release);
}

/// The writer state, once the log is open.
fn writer() -> Option<&'static Mutex<Writer>> {
    let w = WRITER.load(Ordering::Acquire);
    // SAFETY: writer states stored here are leaked boxes: they live for ever.
    (!w.is_null()).then(|| unsafe { &*w })
}

/// The writer thread's state: the file, the stacks and frames already written.
struct Writer {
    sym: Symbolizer,
    stacks_written: Vec<bool>,
    ranges_written: Vec<bool>,
    frames_written: usize,
    events_written: u64,
    dropped_written: u64,
    payload: Vec<u8>,
    /// An events chunk, head and payload, encoded in place and written with one `write`.
    chunk: Vec<u8>,
    side: Vec<u8>,
    out: Vec<u8>,
    range_ids: Vec<u32>,
    ips: Vec<u64>,
    ids: Vec<u32>,
    /// The rings' events this round takes: from each ring's tail to its head at the start.
    spans: Vec<Span>,
    ended: bool,
}

pub(super) fn write_all(fd: c_int, mut bytes: &[u8]) -> Result<(), String> {
    while !bytes.is_empty() {
        // SAFETY: writing from a valid slice to our own descriptor.
        let n = unsafe { libc::write(fd, bytes.as_ptr() as *const c_void, bytes.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.to_string());
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

pub(super) fn writer_thread() {
    THREAD.store(
        Box::into_raw(Box::new(std::thread::current())),
        Ordering::Release,
    );
    // SAFETY: gettid has no preconditions.
    WRITER_TID.store(
        unsafe { libc::syscall(libc::SYS_gettid) } as i32,
        Ordering::Release,
    );
    loop {
        let step = std::panic::catch_unwind(|| match writer() {
            Some(w) => {
                let mut w = w.lock();
                if w.ended {
                    None
                } else {
                    Some(w.drain())
                }
            }
            None => None,
        });
        match step {
            // Until the timer, or until a ring has taken a quarter of its size (or is
            // full): a wake-up that came during the round ends this wait at once.
            Ok(Some(_)) => std::thread::park_timeout(Duration::from_millis(FLUSH_MS)),
            Ok(None) => return,
            Err(_) => {
                // Nobody drains the rings any more: the allocating threads must not wait
                // for room; what they record from now on is counted as dropped.
                DRAINING.store(false, Ordering::Release);
                eprintln!("cushim: internal error in the event log's writer; the log stops here");
                return;
            }
        }
    }
}

impl Writer {
    /// Write every event the rings hold now (one round); returns the number written.
    fn drain(&mut self) -> u64 {
        let fd = FD.load(Ordering::Acquire);
        // The round's ends first: the stack and range ids these events name were published
        // (`MAX_STACK`, `MAX_RANGE`) before the events, so the tables written next hold them.
        let mut spans = std::mem::take(&mut self.spans);
        spans.clear();
        // Where each starts is read holding the gate, below (`Span::catch_up`).
        event_ring::each(|ring| spans.push(ring.span_to_head()));
        let marks_end = MARKS.get().map(|r| r.head());
        self.write_tables(fd);
        if let (Some(ring), Some(end)) = (MARKS.get(), marks_end) {
            self.write_marks(fd, ring, end);
        }
        let mut total = 0;
        let mut copied_finished = false;
        loop {
            // One chunk under the gate (see `GATE`): the crash path may have written some
            // of these events since the last chunk, so each ring's tail is read again.
            if GATE
                .compare_exchange(IDLE, WRITING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                break;
            }
            spans.retain_mut(|s| {
                // SAFETY: this thread holds the gate.
                unsafe { s.catch_up() };
                s.waiting()
            });
            // A block still being filled waits for the next round when this one copied a
            // finished block (see `event_ring.rs`).
            let finished = match spans.as_slice() {
                [one] => Some(one.next_is_finished()),
                _ => None,
            };
            if spans.is_empty() || (copied_finished && finished == Some(false)) {
                GATE.store(IDLE, Ordering::Release);
                break;
            }
            copied_finished |= finished == Some(true);
            let out = &mut self.chunk[CHUNK_HEAD..];
            let (len, n) = match spans.as_mut_slice() {
                [one] => fill_from_one(one, out),
                many => fill_merged(many, out),
            };
            if n == 0 {
                // Events wait and none decodes: only memory corruption does this. The
                // writer stops (its caller says so, and recording threads stop waiting).
                GATE.store(IDLE, Ordering::Release);
                panic!("an event in the log's ring does not decode");
            }
            let (head, payload) = self.chunk.split_at_mut(CHUNK_HEAD);
            let mut h = [0u8; CHUNK_HEAD];
            format::chunk_head(kind::EVENTS, &payload[..len], &mut h);
            head.copy_from_slice(&h);
            if let Err(e) = write_all(fd, &self.chunk[..CHUNK_HEAD + len]) {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| eprintln!("cushim: writing the event log: {e}"));
            }
            for span in &spans {
                // SAFETY: this thread holds the gate and the chunk is written.
                unsafe { span.ring().consumed(span) };
            }
            GATE.store(IDLE, Ordering::Release);
            wake_waiting();
            total += n;
        }
        self.spans = spans;
        let dropped = DROPPED.load(Ordering::Relaxed);
        if dropped != self.dropped_written {
            let mut b = [0u8; 10];
            let len = put_count(&mut b, dropped);
            format::chunk(kind::DROPPED, &b[..len], &mut self.out);
            let _ = write_all(fd, &self.out);
            self.dropped_written = dropped;
        }
        self.events_written += total;
        total
    }

    /// The marks before `end` not yet in the file, as `MARKS` chunks (under the gate).
    fn write_marks(&mut self, fd: c_int, ring: &'static Ring<RangeMark>, end: u64) {
        loop {
            if GATE
                .compare_exchange(IDLE, WRITING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return;
            }
            let mut i = ring.tail();
            if i >= end {
                GATE.store(IDLE, Ordering::Release);
                return;
            }
            let mut enc = MarkEncoder::default();
            let mut len = 0;
            while i < end {
                // SAFETY: this thread holds the gate and tail <= i < head.
                let m = unsafe { ring.get(i) };
                match enc.put(&m, &mut self.payload, len) {
                    Some(p) => len = p,
                    None => break,
                }
                i += 1;
            }
            format::chunk(kind::MARKS, &self.payload[..len], &mut self.out);
            let _ = write_all(fd, &self.out);
            ring.consumed(i);
            GATE.store(IDLE, Ordering::Release);
        }
    }

    /// Every stack and range path recorded so far that is not in the file yet, whether or
    /// not an event written yet names it: the crash path waits for this (see
    /// `crash.rs`).
    fn write_tables(&mut self, fd: c_int) {
        let stacks = MAX_STACK.load(Ordering::Acquire);
        let done = STACKS_DONE.load(Ordering::Acquire);
        if stacks > done {
            let ids: Vec<u32> = (done + 1..=stacks).collect();
            self.write_stacks(fd, &ids);
            STACKS_DONE.store(stacks, Ordering::Release);
        }
        let ranges = MAX_RANGE.load(Ordering::Acquire);
        let done = RANGES_DONE.load(Ordering::Acquire);
        if ranges > done {
            self.range_ids.clear();
            self.range_ids.extend(done + 1..=ranges);
            self.write_ranges(fd);
            RANGES_DONE.store(ranges, Ordering::Release);
        }
    }

    fn range_written(&self, id: u32) -> bool {
        self.ranges_written
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The NVTX range paths of the pending events not written yet (`range_ids`).
    fn write_ranges(&mut self, fd: c_int) {
        if self.range_ids.is_empty() {
            return;
        }
        let mut ids = std::mem::take(&mut self.range_ids);
        ids.sort_unstable();
        ids.dedup();
        self.side.clear();
        for &id in &ids {
            if self.range_written(id) {
                continue;
            }
            let i = id as usize;
            if self.ranges_written.len() <= i {
                self.ranges_written.resize(i + 1, false);
            }
            self.ranges_written[i] = true;
            put_range(&mut self.side, id, &range_path(id).unwrap_or_default());
        }
        ids.clear();
        self.range_ids = ids;
        if !self.side.is_empty() {
            format::chunk(kind::RANGES, &self.side, &mut self.out);
            let _ = write_all(fd, &self.out);
        }
    }

    /// Frames and stacks not written yet, for `ids`.
    fn write_stacks(&mut self, fd: c_int, ids: &[u32]) {
        let table = StackTable::global();
        let mut stacks = Vec::new();
        let mut nstacks = 0u64;
        for &id in ids {
            let i = id as usize;
            if self.stacks_written.get(i).copied().unwrap_or(false) {
                continue;
            }
            if self.stacks_written.len() <= i {
                self.stacks_written.resize(i + 1, false);
            }
            self.stacks_written[i] = true;
            self.ips.clear();
            let ips = &mut self.ips;
            table.with(id, |f| ips.extend_from_slice(f));
            let epoch = module_epochs::split_tag(&mut self.ips);
            module_epochs::mark_unloaded(&mut self.ips, epoch);
            self.ids.clear();
            self.sym.resolve_stack(&self.ips, &mut self.ids);
            let frames = self.sym.frames();
            let skip =
                leading_runtime_frames(self.ids.iter().map(|&f| frames[f as usize].name.as_str()));
            put_stack(&mut stacks, id, &self.ids[skip..]);
            nstacks += 1;
        }
        if nstacks == 0 {
            return;
        }
        let frames = self.sym.frames();
        if frames.len() > self.frames_written {
            self.side.clear();
            for (i, f) in frames.iter().enumerate().skip(self.frames_written) {
                put_frame(&mut self.side, i as u64, &f.name, &f.filename, f.line);
            }
            self.frames_written = frames.len();
            format::chunk(kind::FRAMES, &self.side, &mut self.out);
            let _ = write_all(fd, &self.out);
        }
        format::chunk(kind::STACKS, &stacks, &mut self.out);
        let _ = write_all(fd, &self.out);
    }
}

/// Wake the recording threads waiting for room, if any (see `sink.rs`: the fence orders
/// the tails just stored before the load of `WAITING`).
pub(super) fn wake_waiting() {
    fence(Ordering::SeqCst);
    if WAITING.load(Ordering::SeqCst) != 0 {
        ROOM.fetch_add(1, Ordering::Release);
        cushim::alloc::devlock::wake_all(&ROOM);
    }
}

/// Drain the queue and close the log with an `END` chunk (at exit, on an ending signal).
pub fn finish() {
    // A fork child that has not started its own log never locks the writer: the parent's
    // writer thread may have held that lock at the fork, and in the child nothing would
    // ever release it.
    if IN_CHILD.load(Ordering::Acquire) {
        return;
    }
    let Some(w) = writer() else { return };
    let mut w = w.lock();
    if w.ended {
        return;
    }
    while w.drain() > 0 || marks_pending() {}
    DRAINING.store(false, Ordering::Release);
    ON.store(false, Ordering::Release);
    // Events pushed between the drain and `ON` going off.
    while w.drain() > 0 {}
    let mut b = [0u8; 10];
    let n = put_count(&mut b, w.events_written);
    format::chunk(kind::END, &b[..n], &mut w.out);
    let fd = FD.load(Ordering::Acquire);
    let _ = write_all(fd, &w.out);
    // SAFETY: fsync of our own descriptor.
    unsafe { libc::fsync(fd) };
    w.ended = true;
}

/// Whether the marks' ring holds marks not yet in the file.
fn marks_pending() -> bool {
    MARKS.get().is_some_and(|r| r.tail() < r.head())
}

/// The log is closed by the library's destructor, which `exit` runs after every `atexit`
/// handler (the program's, whenever registered, and the exit snapshot's), so the events
/// those make are in the log too.
extern "C" fn at_unload() {
    if crate::life::ending::pending() {
        crate::life::ending::wait_for_end();
    }
    finish();
}

#[used]
#[link_section = ".fini_array"]
static AT_UNLOAD: extern "C" fn() = at_unload;
