//! The whole-run event log (`CUSHIM_LOG=path-template`): every recorded event, and each
//! distinct stack once, streamed to an append-only file (every chunk encoded by
//! `cushim::trace::log::codec`; the format in `docs/LOG-FORMAT.md`).
//!
//! Policy:
//! - The file is created as a snapshot's is (`cushim::trace::log::file`, `docs/EVENT-LOG.md`):
//!   new, 0600, never through a link; a FIFO, device or directory at its path is left alone
//!   and the program runs on without a log (one line); a previous file is kept as `PATH.N`.
//! - The allocating thread only copies the event (plain data) into its sink's ring
//!   (`log_ring`: one single-producer ring per sink, allocated once): no I/O, no
//!   allocation, no lock and no read-modify-write of its own. A thread of the shim's own
//!   (`cushim-log`) wakes every [`FLUSH_MS`] ms, or when a ring has taken a quarter of its
//!   size more events, takes everything the rings hold at that moment
//!   (merged by time across sinks), interns stacks into frame and stack tables (symbolized
//!   there, off the allocating threads) and writes it in chunks of up to [`CHUNK_BYTES`].
//!   So a busy program pays one wake-up and about one `write(2)` per thousands of events.
//! - When the disk cannot keep up and a ring is full, the allocating thread waits for
//!   room (yielding), because a log with a hole cannot be replayed: a missing free or
//!   segment event corrupts every state rebuilt after it. Memory stays bounded whatever the
//!   disk does. Only when no writer can ever drain the rings (it failed to start, or the log
//!   was closed at exit) are events dropped instead, counted, and the count written to the
//!   log (a `DROPPED` chunk) so nothing is lost silently.
//! - At exit (from the library's destructor, after every `atexit` handler) and on an ending
//!   signal, [`finish`] drains the rings and writes an `END` chunk.
//!   On SIGSEGV, SIGBUS and SIGABRT, [`flush_from_signal`] writes what the rings still hold
//!   with `write(2)` from a static buffer (no lock, no allocation), then the signal's action
//!   proceeds. Events leave a ring only once written, and the writer writes a chunk holding
//!   the gate (`GATE`), so the crash path, once it holds the gate, finds in the rings
//!   exactly the events not yet in the file. The stacks and range paths those events name
//!   are written first, by the writer thread (see [`flush_from_signal`]: the crash path
//!   only waits for it, so it stays async-signal-safe).
//! - NVTX range starts and ends (when history records them, or a log is asked for) go to a
//!   ring of their own from the range annotations' hook (under that module's lock, which
//!   serializes its producers), and are written as `MARKS` chunks before each round's
//!   events; the range paths they name are written first, as for events.
//! - A `fork` child writes a log of its own, from its first recorded event on, when the
//!   template has `%p` (the child's pid makes a new name); without `%p` its log would be
//!   its parent's file, so it does not log and its first event says so on stderr, once.
//!   Why at the first event and not in the fork handler: the handler runs inside `fork`,
//!   where only async-signal-safe calls are allowed, and a log needs a file and a writer
//!   thread. It only resets atomics: the rings' unwritten events are the parent's (its
//!   writer writes them to its log), so the child's rings start empty. The event is
//!   recorded after `fork` returned, where the child runs ordinary code as any program that
//!   forks without exec does (Python's multiprocessing: POSIX promises only
//!   async-signal-safe calls there, glibc makes `malloc` and thread creation work by
//!   resetting its own locks at the fork, and the shim's locks are held across the fork by
//!   `fork.rs`); the event's thread then opens the child's file, writes its header (the
//!   parent's, with the child's pid, `parent_pid` and a new clock origin) and starts a new
//!   writer thread with a new writer state. The parent's writer state is left alone, never
//!   locked or dropped: its thread does not exist in the child and may have held its lock
//!   at the fork. Nothing the child does touches the parent's file.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering,
};
use std::time::Duration;

use cushim::trace::annotations::Annotation;
use cushim::trace::event::{EventSink, TraceEvent, NO_STACK};
use cushim::trace::intern::StackTable;
use cushim::trace::log::codec::{
    header_payload, put_count, put_frame, put_range, put_stack, EventEncoder, MarkEncoder,
    RangeMark,
};
use cushim::trace::log::format::{self, kind, CHUNK_HEAD, MAGIC, VERSION};
use cushim::trace::module_epochs;
use cushim::trace::range::{path as range_path, NO_RANGE};
use cushim::trace::runtime_frames::leading_runtime_frames;
use cushim::trace::symbolize::Symbolizer;
use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::life::log_ring::{self, Producer, Pushed, Ring};
use crate::life::shim::Shim;

/// The longest an event waits in its ring while the program runs.
pub const FLUSH_MS: u64 = 20;
/// One events chunk's payload.
const CHUNK_BYTES: usize = 64 << 10;

static TEMPLATE: OnceCell<Option<String>> = OnceCell::new();
/// Whether events go to the rings (set once the file is open; cleared in a fork child).
static ON: AtomicBool = AtomicBool::new(false);
/// Whether a writer drains the rings (else a full ring drops).
static DRAINING: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static FD: AtomicI32 = AtomicI32::new(-1);
/// The writer state (a leaked box: a fork child replaces it with its own, and never drops
/// its parent's).
static WRITER: AtomicPtr<Mutex<Writer>> = AtomicPtr::new(std::ptr::null_mut());
/// The writer thread's handle (a leaked box, replaced in a fork child that logs).
static THREAD: AtomicPtr<std::thread::Thread> = AtomicPtr::new(std::ptr::null_mut());
/// The parent's header, which a fork child's log starts from.
static HEADER: OnceCell<serde_json::Value> = OnceCell::new();
/// The writer thread's kernel thread id (0 until it runs).
static WRITER_TID: AtomicI32 = AtomicI32::new(0);
/// The largest stack id and NVTX range id recorded so far (ids are handed out in order, so
/// every id an event in a ring names is at most these).
static MAX_STACK: AtomicU32 = AtomicU32::new(0);
static MAX_RANGE: AtomicU32 = AtomicU32::new(0);
/// Every stack (range) id up to this one is in the file.
static STACKS_DONE: AtomicU32 = AtomicU32::new(0);
static RANGES_DONE: AtomicU32 = AtomicU32::new(0);

fn template() -> Option<&'static str> {
    TEMPLATE
        .get_or_init(|| std::env::var("CUSHIM_LOG").ok().filter(|s| !s.is_empty()))
        .as_deref()
}

/// Whether `CUSHIM_LOG` asks for a log.
pub fn requested() -> bool {
    template().is_some()
}

/// Slots of the range marks' ring.
const MARK_SLOTS: u64 = 1 << 12;
/// The range marks' ring (made when the log starts).
static MARKS: OnceCell<&'static Ring<RangeMark>> = OnceCell::new();

/// The range annotations' hook (called under their lock): the start or end into the
/// marks' ring.
fn push_mark(a: &Annotation) {
    if !logging() {
        return;
    }
    let Some(ring) = MARKS.get() else { return };
    if a.path != NO_RANGE && a.path > MAX_RANGE.load(Ordering::Relaxed) {
        MAX_RANGE.fetch_max(a.path, Ordering::AcqRel);
    }
    let m = RangeMark {
        start: a.start,
        device: a.device,
        path: a.path,
        time_us: a.time_us,
    };
    loop {
        // SAFETY: the annotations' lock serializes every call of this hook, its only
        // producer.
        match unsafe { ring.push_serialized(&m) } {
            Pushed::Done => return,
            Pushed::Wake => return wake_writer(),
            Pushed::Full => {
                if !DRAINING.load(Ordering::Acquire) {
                    DROPPED.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                wake_writer();
                std::thread::yield_now();
            }
        }
    }
}

/// The sink that logs every event, then records it in `inner` as before.
pub struct LogSink {
    inner: Box<dyn EventSink>,
    /// This sink's ring (`None`: every ring is taken; its events count as dropped).
    ring: Option<Producer>,
}

/// Wrap a device's sink when a log is asked for.
pub fn wrap(inner: Box<dyn EventSink>) -> Box<dyn EventSink> {
    if !requested() {
        return inner;
    }
    let ring = log_ring::register().map(Producer::new);
    Box::new(LogSink { inner, ring })
}

impl EventSink for LogSink {
    fn enabled(&self) -> bool {
        true
    }

    #[inline]
    fn record(&mut self, mut ev: TraceEvent) {
        // The recording thread's NVTX range path (one thread-local read), as the ring takes it.
        if ev.range == NO_RANGE {
            ev.range = cushim::trace::range::current();
        }
        // A load of a line that is written only when a new id appears.
        if ev.stack != NO_STACK && ev.stack > MAX_STACK.load(Ordering::Relaxed) {
            MAX_STACK.fetch_max(ev.stack, Ordering::AcqRel);
        }
        if ev.range != NO_RANGE && ev.range > MAX_RANGE.load(Ordering::Relaxed) {
            MAX_RANGE.fetch_max(ev.range, Ordering::AcqRel);
        }
        self.push(&ev);
        self.inner.record(ev);
    }

    fn events(&self) -> Vec<TraceEvent> {
        self.inner.events()
    }
}

impl LogSink {
    #[inline]
    fn push(&mut self, ev: &TraceEvent) {
        if !logging() {
            return;
        }
        let Some(ring) = self.ring.as_mut() else {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match ring.push(ev) {
            Pushed::Done => {}
            Pushed::Wake => wake_writer(),
            Pushed::Full => wait_and_push(ring, ev),
        }
    }
}

/// Whether events go to the log now (in a fork child, the first one starts its own log).
#[inline]
fn logging() -> bool {
    ON.load(Ordering::Relaxed) || (CHILD.load(Ordering::Relaxed) != CHILD_NONE && start_in_child())
}

/// Wake the writer thread (an atomic swap when it is awake, a futex call when it sleeps).
#[inline]
fn wake_writer() {
    let t = THREAD.load(Ordering::Acquire);
    if !t.is_null() {
        // SAFETY: thread handles stored here are leaked boxes: they live for ever.
        unsafe { (*t).unpark() };
    }
}

/// The writer state, once the log is open.
fn writer() -> Option<&'static Mutex<Writer>> {
    let w = WRITER.load(Ordering::Acquire);
    // SAFETY: writer states stored here are leaked boxes: they live for ever.
    (!w.is_null()).then(|| unsafe { &*w })
}

/// A full ring: wait for the writer to make room, or count the event dropped when no
/// writer will.
#[cold]
fn wait_and_push(ring: &mut Producer, ev: &TraceEvent) {
    loop {
        if !DRAINING.load(Ordering::Acquire) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        wake_writer();
        std::thread::yield_now();
        match ring.push(ev) {
            Pushed::Full => {}
            _ => return,
        }
    }
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
    side: Vec<u8>,
    out: Vec<u8>,
    range_ids: Vec<u32>,
    ips: Vec<u64>,
    ids: Vec<u32>,
    /// The rings' events this round takes: from each ring's tail to its head at the start.
    fronts: Vec<Front>,
    ended: bool,
}

/// A ring's events still to write in this round.
struct Front {
    ring: &'static Ring,
    pos: u64,
    end: u64,
}

/// Open the log and start its writer (from the shim's start-up, with its state built).
pub fn start(s: &Shim) {
    let Some(t) = template() else { return };
    if let Err(e) = open_and_spawn(s, t) {
        eprintln!("cushim: no event log: {e}");
        return;
    }
    crate::life::ending::install(crate::life::dump::dump_signal());
    crate::life::sigchain::on(crate::life::sigchain::Role::Fatal, |_| flush_from_signal());
    crate::life::sigchain::arm_fatal();
}

fn open_and_spawn(s: &Shim, template: &str) -> Result<(), String> {
    let header = serde_json::json!({
        "format": "cushim event log",
        "version": VERSION,
        "pid": std::process::id(),
        "rank": cushim::snapshot::output::rank_from_env(),
        "cmdline": std::env::args().collect::<Vec<_>>(),
        "clock": "microseconds since the Unix epoch",
        "clock_origin_us": cushim::trace::event::now_us(),
        "mode": crate::life::mode::mode_name(),
        "allocator_settings": s.alloc.conf().settings_json(),
        "env": {
            "CUSHIM_HISTORY": std::env::var("CUSHIM_HISTORY").ok(),
            "CUSHIM_ALLOC_CONF": std::env::var("CUSHIM_ALLOC_CONF").ok(),
            "PYTORCH_CUDA_ALLOC_CONF": std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok(),
        },
        "device_count": s.alloc.device_count(),
        "memory": crate::life::unexplained::memory_json(s),
    });
    let _ = MARKS.set(Ring::leaked(MARK_SLOTS));
    open_log(template, &header)?;
    let _ = HEADER.set(header);
    // With the writer running: the starts and ends kept so far may be more than the marks'
    // ring holds.
    cushim::trace::annotations::set_log_hook(push_mark);
    Ok(())
}

/// Open the file `template` names, write `header`, and start a writer thread with a fresh
/// writer state.
fn open_log(template: &str, header: &serde_json::Value) -> Result<(), String> {
    use cushim::snapshot::output::{expand, TemplateVars};
    use std::os::fd::IntoRawFd;
    let path = expand(template, &TemplateVars::current(0));
    use cushim::trace::log::file::{create, Previous};
    let previous = match std::env::var("CUSHIM_LOG_REPLACE").as_deref() {
        Ok("1") => Previous::Replace,
        _ => Previous::Keep,
    };
    let created = create(std::path::Path::new(&path), previous)?;
    if let Some(kept) = &created.kept {
        say(&format!(
            "cushim: event log {path}: the previous file there is kept as {}\n",
            kept.display()
        ));
    }
    let fd = created.file.into_raw_fd();
    FD.store(fd, Ordering::Release);
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(MAGIC);
    let mut chunk = Vec::new();
    format::chunk(kind::HEADER, &header_payload(header), &mut chunk);
    out.extend_from_slice(&chunk);
    write_all(fd, &out).map_err(|e| format!("writing {path}: {e}"))?;
    let w = Box::new(Mutex::new(Writer {
        sym: Symbolizer::new(),
        stacks_written: Vec::new(),
        ranges_written: Vec::new(),
        frames_written: 0,
        events_written: 0,
        dropped_written: 0,
        payload: vec![0u8; CHUNK_BYTES],
        side: Vec::new(),
        out: Vec::new(),
        range_ids: Vec::new(),
        ips: Vec::new(),
        ids: Vec::new(),
        fronts: Vec::new(),
        ended: false,
    }));
    WRITER.store(Box::into_raw(w), Ordering::Release);
    ON.store(true, Ordering::Release);
    DRAINING.store(true, Ordering::Release);
    let spawned = crate::life::quiet_thread::spawn_quiet("cushim-log", writer_thread);
    if let Err(e) = spawned {
        DRAINING.store(false, Ordering::Release);
        return Err(e);
    }
    Ok(())
}

fn write_all(fd: c_int, mut bytes: &[u8]) -> Result<(), String> {
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

fn writer_thread() {
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
        let mut fronts = std::mem::take(&mut self.fronts);
        fronts.clear();
        log_ring::each(|ring| {
            let end = ring.head();
            fronts.push(Front {
                ring,
                pos: ring.tail(),
                end,
            });
        });
        let marks_end = MARKS.get().map(|r| r.head());
        self.write_tables(fd);
        if let (Some(ring), Some(end)) = (MARKS.get(), marks_end) {
            self.write_marks(fd, ring, end);
        }
        let mut total = 0;
        loop {
            // One chunk under the gate (see `GATE`): the crash path may have written some
            // of these events since the last chunk, so each ring's tail is read again.
            if GATE
                .compare_exchange(IDLE, WRITING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                break;
            }
            fronts.retain_mut(|f| {
                f.pos = f.pos.max(f.ring.tail());
                f.pos < f.end
            });
            if fronts.is_empty() {
                GATE.store(IDLE, Ordering::Release);
                break;
            }
            let (len, n) = self.encode_chunk(&mut fronts);
            format::chunk(kind::EVENTS, &self.payload[..len], &mut self.out);
            if let Err(e) = write_all(fd, &self.out) {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| eprintln!("cushim: writing the event log: {e}"));
            }
            for f in &fronts {
                f.ring.consumed(f.pos);
            }
            GATE.store(IDLE, Ordering::Release);
            total += n;
        }
        self.fronts = fronts;
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

    /// Encode the fronts' events, oldest first across rings, into one chunk's payload, up to
    /// [`CHUNK_BYTES`]; returns the payload's length and the events in it.
    fn encode_chunk(&mut self, fronts: &mut [Front]) -> (usize, u64) {
        let mut enc = EventEncoder::new();
        let mut len = 0;
        let mut n = 0u64;
        if let [f] = fronts {
            while f.pos < f.end {
                // SAFETY: this thread holds the gate and tail <= pos < head.
                let ev = unsafe { f.ring.get(f.pos) };
                match enc.put(&ev, &mut self.payload, len) {
                    Some(p) => len = p,
                    None => break,
                }
                f.pos += 1;
                n += 1;
            }
            return (len, n);
        }
        loop {
            let mut best: Option<(usize, TraceEvent)> = None;
            for (i, f) in fronts.iter().enumerate() {
                if f.pos < f.end {
                    // SAFETY: as above.
                    let ev = unsafe { f.ring.get(f.pos) };
                    if best.map_or(true, |(_, b)| ev.time_us < b.time_us) {
                        best = Some((i, ev));
                    }
                }
            }
            let Some((i, ev)) = best else { break };
            match enc.put(&ev, &mut self.payload, len) {
                Some(p) => len = p,
                None => break,
            }
            fronts[i].pos += 1;
            n += 1;
        }
        (len, n)
    }

    /// Every stack and range path recorded so far that is not in the file yet, whether or
    /// not an event written yet names it: the crash path waits for this (see
    /// [`flush_from_signal`]).
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

/// In a `fork` child (its fork handler: async-signal-safe, atomics only): the writer
/// thread does not exist and the file is the parent's; the unwritten events in the rings
/// are the parent's. The child's first recorded event starts its own log
/// ([`start_in_child`]).
pub fn after_fork_in_child() {
    let was_on = ON.swap(false, Ordering::AcqRel);
    DRAINING.store(false, Ordering::Release);
    IN_CHILD.store(true, Ordering::Release);
    if !was_on {
        CHILD.store(CHILD_NONE, Ordering::Release);
        return;
    }
    log_ring::each(|r| r.forget());
    if let Some(m) = MARKS.get() {
        m.forget();
    }
    THREAD.store(std::ptr::null_mut(), Ordering::Release);
    WRITER_TID.store(0, Ordering::Release);
    GATE.store(IDLE, Ordering::Release);
    FATAL_BUSY.store(false, Ordering::Release);
    STACKS_DONE.store(0, Ordering::Release);
    RANGES_DONE.store(0, Ordering::Release);
    DROPPED.store(0, Ordering::Release);
    CHILD.store(CHILD_PENDING, Ordering::Release);
}

/// Set in a fork child until it has a log of its own: the file and writer are the parent's.
static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// A fork child of a logging process: its own log is not started (`CHILD_PENDING`), is
/// being started by one of its threads (`CHILD_STARTING`), or there is nothing to do.
static CHILD: AtomicU8 = AtomicU8::new(CHILD_NONE);
const CHILD_NONE: u8 = 0;
const CHILD_PENDING: u8 = 1;
const CHILD_STARTING: u8 = 2;

/// From a fork child's recorded event: start the child's own log (once; a thread that
/// records meanwhile waits for it). Returns whether the log is on.
#[cold]
fn start_in_child() -> bool {
    match CHILD.compare_exchange(
        CHILD_PENDING,
        CHILD_STARTING,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            let on = std::panic::catch_unwind(open_child_log).unwrap_or(false);
            CHILD.store(CHILD_NONE, Ordering::Release);
            on
        }
        Err(CHILD_STARTING) => {
            while CHILD.load(Ordering::Acquire) == CHILD_STARTING {
                std::thread::yield_now();
            }
            ON.load(Ordering::Acquire)
        }
        Err(_) => ON.load(Ordering::Acquire),
    }
}

/// The fork child's own log: a new file (the template's `%p`), the parent's header with the
/// child's pid, a new writer thread.
fn open_child_log() -> bool {
    let (Some(template), Some(parent)) = (template(), HEADER.get()) else {
        return false;
    };
    let pid = std::process::id();
    if !template.contains("%p") {
        say(&format!(
            "cushim: pid {pid} is a fork child: it does not write an event log, because CUSHIM_LOG has no %p (its log would be its parent's file); its parent's log goes on\n"
        ));
        return false;
    }
    // The parent's descriptor: the parent writes it, the child has no use for it.
    // SAFETY: closing this process's copy of a descriptor it owns.
    unsafe { libc::close(FD.swap(-1, Ordering::AcqRel)) };
    let mut header = parent.clone();
    header["parent_pid"] = header["pid"].clone();
    header["pid"] = pid.into();
    header["clock_origin_us"] = cushim::trace::event::now_us().into();
    match open_log(template, &header) {
        Ok(()) => {
            IN_CHILD.store(false, Ordering::Release);
            true
        }
        Err(e) => {
            say(&format!(
                "cushim: pid {pid} is a fork child: no event log of its own: {e}\n"
            ));
            false
        }
    }
}

/// One line on stderr with `write(2)` (no lock another thread of the parent may have held
/// at the fork: Rust's stderr lock).
fn say(line: &str) {
    // SAFETY: writing a valid slice to stderr.
    unsafe { libc::write(2, line.as_ptr() as *const c_void, line.len()) };
}

/// The gate between the writer thread and the crash path over the rings' unwritten events:
/// IDLE (nobody consumes), WRITING (the writer is encoding and writing one chunk; it
/// advances the rings' tails once the chunk is written), STOLEN (the crash path writes
/// what the rings hold itself). The crash path waits out WRITING (the writer runs on, on
/// its own thread, and leaves it within one chunk's write), takes the gate from IDLE, and
/// opens it again when done (a handler of the program's may keep the program running).
const IDLE: u8 = 0;
const WRITING: u8 = 1;
const STOLEN: u8 = 2;
static GATE: AtomicU8 = AtomicU8::new(IDLE);

/// Serializes the fatal-signal flushes (taken with a compare-exchange: a second crashing
/// thread does not wait in its handler).
static FATAL_BUSY: AtomicBool = AtomicBool::new(false);
/// The fatal path's chunk buffer (head, then payload), used only while `FATAL_BUSY` is held.
static mut FATAL_CHUNK: [u8; CHUNK_HEAD + CHUNK_BYTES] = [0; CHUNK_HEAD + CHUNK_BYTES];

/// From a SIGSEGV/SIGBUS/SIGABRT handler: write what the rings hold, with `write(2)` only.
pub fn flush_from_signal() {
    if !ON.load(Ordering::Acquire) {
        return;
    }
    if FATAL_BUSY
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let fd = FD.load(Ordering::Acquire);
    wait_for_tables();
    // Take the gate, waiting out a chunk the writer is writing; not on the writer thread
    // itself (it cannot finish its chunk while it is here: its tails are not advanced, so
    // the chunk's events are still in the rings), and bounded, in case the writer is stuck.
    // SAFETY: gettid has no preconditions; async-signal-safe.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut stolen = false;
    if WRITER_TID.load(Ordering::Acquire) != me {
        for _ in 0..50_000_000u64 {
            match GATE.compare_exchange(IDLE, STOLEN, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    stolen = true;
                    break;
                }
                Err(STOLEN) => break,
                Err(_) => std::hint::spin_loop(),
            }
        }
    }
    if let Some(ring) = MARKS.get() {
        let (mut i, end) = (ring.tail(), ring.head());
        write_marks_from_signal(fd, &mut || {
            // SAFETY: with the gate STOLEN (or the writer stopped) nobody else consumes,
            // and tail <= i < head.
            (i < end).then(|| {
                i += 1;
                unsafe { ring.get(i - 1) }
            })
        });
        if stolen {
            ring.consumed(end);
        }
    }
    log_ring::each(|ring| {
        let (mut i, end) = (ring.tail(), ring.head());
        // SAFETY: with the gate STOLEN (or the writer stopped) nobody else consumes, and
        // tail <= i < head.
        write_from_signal(fd, &mut || {
            (i < end).then(|| {
                i += 1;
                unsafe { ring.get(i - 1) }
            })
        });
        if stolen {
            ring.consumed(end);
        }
    });
    if stolen {
        GATE.store(IDLE, Ordering::Release);
    }
    FATAL_BUSY.store(false, Ordering::Release);
}

/// The longest the crash path waits for the writer thread to write the stack and range
/// tables (it symbolizes: the first stacks load debug information).
const TABLES_WAIT_MS: u64 = 10_000;

/// From the crash path, before it writes the queued events: wait until the writer thread
/// has written every stack and range path recorded so far, so the events written next have
/// their stacks in the file.
///
/// Why this is sound in a signal handler: this thread only loads atomics, calls
/// `syscall(gettid)` and `nanosleep` (both async-signal-safe) and takes no lock; the
/// symbolizing, allocating and locking happen on the writer thread, which keeps running
/// while this one waits. The wait is bounded: if the crashed thread holds a lock the writer
/// needs (the stack table's, or malloc's after heap corruption), the writer stalls and the
/// events are written after [`TABLES_WAIT_MS`] without those stacks. A crash on the writer
/// thread itself does not wait (it cannot write while it is here).
fn wait_for_tables() {
    // SAFETY: gettid has no preconditions; async-signal-safe.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    if !DRAINING.load(Ordering::Acquire) || WRITER_TID.load(Ordering::Acquire) == me {
        return;
    }
    let stacks = MAX_STACK.load(Ordering::Acquire);
    let ranges = MAX_RANGE.load(Ordering::Acquire);
    let nap = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    for _ in 0..TABLES_WAIT_MS {
        if STACKS_DONE.load(Ordering::Acquire) >= stacks
            && RANGES_DONE.load(Ordering::Acquire) >= ranges
        {
            return;
        }
        // SAFETY: nanosleep with a valid request and no remainder; async-signal-safe.
        unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
    }
}

/// Encode the events `next` gives into chunks in the static buffer and `write(2)` them.
fn write_from_signal(fd: c_int, next: &mut dyn FnMut() -> Option<TraceEvent>) {
    // SAFETY: FATAL_BUSY gives this thread sole use of the static buffer.
    let buf = unsafe { &mut *std::ptr::addr_of_mut!(FATAL_CHUNK) };
    loop {
        let (head, payload) = buf.split_at_mut(CHUNK_HEAD);
        let mut enc = EventEncoder::new();
        let mut pos = 0;
        // MAX_EVENT_BYTES is far below the 4096 bytes left: `put` always succeeds.
        while pos < CHUNK_BYTES - 4096 {
            let Some(ev) = next() else { break };
            if let Some(p) = enc.put(&ev, payload, pos) {
                pos = p;
            }
        }
        if pos == 0 {
            break;
        }
        let mut h = [0u8; CHUNK_HEAD];
        format::chunk_head(kind::EVENTS, &payload[..pos], &mut h);
        head.copy_from_slice(&h);
        write_from_static(fd, &buf[..CHUNK_HEAD + pos]);
    }
}

/// Encode the marks `next` gives into `MARKS` chunks in the static buffer and `write(2)`
/// them (the fatal-signal path).
fn write_marks_from_signal(fd: c_int, next: &mut dyn FnMut() -> Option<RangeMark>) {
    // SAFETY: FATAL_BUSY gives this thread sole use of the static buffer.
    let buf = unsafe { &mut *std::ptr::addr_of_mut!(FATAL_CHUNK) };
    loop {
        let (head, payload) = buf.split_at_mut(CHUNK_HEAD);
        let mut enc = MarkEncoder::default();
        let mut pos = 0;
        while pos < CHUNK_BYTES - 4096 {
            let Some(m) = next() else { break };
            if let Some(p) = enc.put(&m, payload, pos) {
                pos = p;
            }
        }
        if pos == 0 {
            break;
        }
        let mut h = [0u8; CHUNK_HEAD];
        format::chunk_head(kind::MARKS, &payload[..pos], &mut h);
        head.copy_from_slice(&h);
        write_from_static(fd, &buf[..CHUNK_HEAD + pos]);
    }
}

/// `write(2)` all of `bytes` (async-signal-safe; gives up on an error).
fn write_from_static(fd: c_int, bytes: &[u8]) {
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: write(2) from a valid slice: async-signal safe.
        let n = unsafe {
            libc::write(
                fd,
                bytes[off..].as_ptr() as *const c_void,
                bytes.len() - off,
            )
        };
        if n <= 0 {
            break;
        }
        off += n as usize;
    }
}
