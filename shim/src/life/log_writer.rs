//! The whole-run event log (`CUSHIM_LOG=path-template`): every recorded event, and each
//! distinct stack once, streamed to an append-only file (format: `cushim::trace::log`,
//! `docs/LOG-FORMAT.md`).
//!
//! Policy:
//! - The allocating thread only pushes the event (plain data) into a fixed-size lock-free
//!   queue ([`QUEUE_EVENTS`] slots, allocated once): no I/O, no allocation, no lock of its
//!   own. A thread of the shim's own (`cushim-log`) drains it, interns stacks into frame and
//!   stack tables (symbolized there, off the allocating threads) and writes chunks, at least
//!   every [`FLUSH_MS`] ms.
//! - When the disk cannot keep up and the queue is full, the allocating thread waits for
//!   room (yielding), because a log with a hole cannot be replayed: a missing free or
//!   segment event corrupts every state rebuilt after it. Memory stays bounded whatever the
//!   disk does. Only when no writer can ever drain the queue (it failed to start, or the log
//!   was closed at exit) are events dropped instead, counted, and the count written to the
//!   log (a `DROPPED` chunk) so nothing is lost silently.
//! - At exit (from the library's destructor, after every `atexit` handler) and on an ending
//!   signal, [`finish`] drains the queue and writes an `END` chunk.
//!   On SIGSEGV, SIGBUS and SIGABRT, [`flush_from_signal`] writes what the queue still holds
//!   with `write(2)` from a static buffer (no lock, no allocation), then the signal's action
//!   proceeds; a batch the writer thread had taken out of the queue but not yet written is
//!   taken over and written too (`GATE`). Stacks first seen in that last moment are not in
//!   the log after a crash (their events are, with their stack ids unresolved).
//! - A `fork` child does not write to its parent's log: logging stops in the child.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use cushim::trace::event::{EventSink, TraceEvent, NO_STACK};
use cushim::trace::intern::StackTable;
use cushim::trace::log::encode::EventEncoder;
use cushim::trace::log::format::{self, kind, put_varint, CHUNK_HEAD, MAGIC, VERSION};
use cushim::trace::module_epochs;
use cushim::trace::runtime_frames::leading_runtime_frames;
use cushim::trace::symbolize::Symbolizer;
use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::life::state::Shim;

/// Queue slots: about 8 MiB of events.
pub const QUEUE_EVENTS: usize = 1 << 17;
/// The longest an event waits in the queue while the program runs.
pub const FLUSH_MS: u64 = 20;
/// One events chunk's payload.
const CHUNK_BYTES: usize = 64 << 10;

static TEMPLATE: OnceCell<Option<String>> = OnceCell::new();
static QUEUE: OnceCell<ArrayQueue<TraceEvent>> = OnceCell::new();
/// Whether events go to the queue (set once the file is open; cleared in a fork child).
static ON: AtomicBool = AtomicBool::new(false);
/// Whether a writer drains the queue (else a full queue drops).
static DRAINING: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static FD: AtomicI32 = AtomicI32::new(-1);
static WRITER: OnceCell<Mutex<Writer>> = OnceCell::new();
static THREAD: OnceCell<std::thread::Thread> = OnceCell::new();

fn template() -> Option<&'static str> {
    TEMPLATE
        .get_or_init(|| std::env::var("CUSHIM_LOG").ok().filter(|s| !s.is_empty()))
        .as_deref()
}

/// Whether `CUSHIM_LOG` asks for a log.
pub fn requested() -> bool {
    template().is_some()
}

/// The sink that logs every event, then records it in `inner` as before.
pub struct LogSink {
    inner: Box<dyn EventSink>,
}

/// Wrap a device's sink when a log is asked for.
pub fn wrap(inner: Box<dyn EventSink>) -> Box<dyn EventSink> {
    if !requested() {
        return inner;
    }
    QUEUE.get_or_init(|| ArrayQueue::new(QUEUE_EVENTS));
    Box::new(LogSink { inner })
}

impl EventSink for LogSink {
    fn enabled(&self) -> bool {
        true
    }

    #[inline]
    fn record(&mut self, ev: TraceEvent) {
        push(ev);
        self.inner.record(ev);
    }

    fn events(&self) -> Vec<TraceEvent> {
        self.inner.events()
    }
}

#[inline]
fn push(ev: TraceEvent) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let Some(q) = QUEUE.get() else { return };
    let mut ev = ev;
    loop {
        match q.push(ev) {
            // The writer wakes on its own every FLUSH_MS (the queue holds far more than a
            // program records in that time); only a full queue wakes it early.
            Ok(()) => return,
            Err(back) => {
                if !DRAINING.load(Ordering::Acquire) {
                    DROPPED.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                ev = back;
                if let Some(t) = THREAD.get() {
                    t.unpark();
                }
                std::thread::yield_now();
            }
        }
    }
}

/// The writer thread's state: the file, the stacks and frames already written.
struct Writer {
    sym: Symbolizer,
    stacks_written: Vec<bool>,
    frames_written: usize,
    events_written: u64,
    dropped_written: u64,
    payload: Vec<u8>,
    side: Vec<u8>,
    out: Vec<u8>,
    stack_ids: Vec<u32>,
    ips: Vec<u64>,
    ids: Vec<u32>,
    ended: bool,
}

/// Open the log and start its writer (from the shim's start-up, with its state built).
pub fn start(s: &Shim) {
    let Some(t) = template() else { return };
    if let Err(e) = open_and_spawn(s, t) {
        eprintln!("cushim: no event log: {e}");
        return;
    }
    crate::life::ending::install();
    crate::life::sigchain::arm_fatal();
}

fn open_and_spawn(s: &Shim, template: &str) -> Result<(), String> {
    use cushim::snapshot::output::{expand, TemplateVars};
    let path = expand(template, &TemplateVars::current(0));
    let cpath = std::ffi::CString::new(path.clone())
        .map_err(|_| format!("{path}: a NUL byte in the path"))?;
    // SAFETY: a NUL-terminated path; flags and mode as open(2) takes them.
    let fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return Err(format!(
            "opening {path}: {}",
            std::io::Error::last_os_error()
        ));
    }
    FD.store(fd, Ordering::Release);
    let header = serde_json::json!({
        "format": "cushim event log",
        "version": VERSION,
        "pid": std::process::id(),
        "rank": cushim::snapshot::output::rank_from_env(),
        "cmdline": std::env::args().collect::<Vec<_>>(),
        "clock": "microseconds since the Unix epoch",
        "clock_origin_us": cushim::trace::event::now_us(),
        "mode": crate::observe::mode_name(),
        "allocator_settings": s.alloc.conf().settings_json(),
        "env": {
            "CUSHIM_HISTORY": std::env::var("CUSHIM_HISTORY").ok(),
            "CUSHIM_ALLOC_CONF": std::env::var("CUSHIM_ALLOC_CONF").ok(),
            "PYTORCH_CUDA_ALLOC_CONF": std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok(),
        },
        "device_count": s.alloc.device_count(),
        "memory": crate::observe::unexplained::memory_json(s),
    });
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(MAGIC);
    let mut chunk = Vec::new();
    format::chunk(kind::HEADER, header.to_string().as_bytes(), &mut chunk);
    out.extend_from_slice(&chunk);
    write_all(fd, &out).map_err(|e| format!("writing {path}: {e}"))?;
    let _ = WRITER.set(Mutex::new(Writer {
        sym: Symbolizer::new(),
        stacks_written: Vec::new(),
        frames_written: 0,
        events_written: 0,
        dropped_written: 0,
        payload: vec![0u8; CHUNK_BYTES],
        side: Vec::new(),
        out: Vec::new(),
        stack_ids: Vec::new(),
        ips: Vec::new(),
        ids: Vec::new(),
        ended: false,
    }));
    QUEUE.get_or_init(|| ArrayQueue::new(QUEUE_EVENTS));
    ON.store(true, Ordering::Release);
    DRAINING.store(true, Ordering::Release);
    let spawned = crate::life::dump::spawn_quiet("cushim-log", writer_thread);
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
    let _ = THREAD.set(std::thread::current());
    loop {
        let step = std::panic::catch_unwind(|| match WRITER.get() {
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
            Ok(Some(0)) => std::thread::park_timeout(Duration::from_millis(FLUSH_MS)),
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(_) => {
                // Nobody drains the queue any more: the allocating threads must not wait
                // for room; what they record from now on is counted as dropped.
                DRAINING.store(false, Ordering::Release);
                eprintln!("cushim: internal error in the event log's writer; the log stops here");
                return;
            }
        }
    }
}

impl Writer {
    /// Write everything the queue holds now; returns the number of events written.
    fn drain(&mut self) -> u64 {
        let Some(q) = QUEUE.get() else { return 0 };
        let fd = FD.load(Ordering::Acquire);
        let mut total = 0;
        loop {
            // Take a batch out of the queue through the gate (see `Gate`): a crash on
            // another thread can take it over until it is written.
            if GATE
                .compare_exchange(IDLE, HOLDING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                break;
            }
            let mut n = 0;
            while n < BATCH {
                if GATE
                    .compare_exchange(HOLDING, POPPING, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return total;
                }
                let got = q.pop();
                if let Some(ev) = got {
                    // SAFETY: slots are written only by this thread while the gate is POPPING,
                    // and read by the crash path only after it took the gate from HOLDING.
                    unsafe { (*HELD.0.get())[n] = ev };
                    n += 1;
                    HELD_LEN.store(n, Ordering::Release);
                }
                GATE.store(HOLDING, Ordering::Release);
                if got.is_none() {
                    break;
                }
            }
            if GATE
                .compare_exchange(HOLDING, WRITING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return total;
            }
            if n == 0 {
                GATE.store(IDLE, Ordering::Release);
                break;
            }
            let mut enc = EventEncoder::new();
            let mut pos = 0;
            self.stack_ids.clear();
            for i in 0..n {
                // SAFETY: the gate is WRITING: only this thread touches the batch.
                let ev = unsafe { (*HELD.0.get())[i] };
                let p = match enc.put(&ev, &mut self.payload, pos) {
                    Some(p) => p,
                    None => {
                        // The chunk is full: this event starts the next one.
                        self.flush_events(fd, pos);
                        enc = EventEncoder::new();
                        enc.put(&ev, &mut self.payload, 0).unwrap_or(0)
                    }
                };
                pos = p;
                if ev.stack != NO_STACK {
                    self.stack_ids.push(ev.stack);
                }
            }
            if pos > 0 {
                self.flush_events(fd, pos);
            }
            HELD_LEN.store(0, Ordering::Release);
            GATE.store(IDLE, Ordering::Release);
            total += n as u64;
        }
        let dropped = DROPPED.load(Ordering::Relaxed);
        if dropped != self.dropped_written {
            let mut b = [0u8; 10];
            let len = put_varint(&mut b, 0, dropped);
            format::chunk(kind::DROPPED, &b[..len], &mut self.out);
            let _ = write_all(fd, &self.out);
            self.dropped_written = dropped;
        }
        self.events_written += total;
        total
    }

    /// Write the stacks of the pending events, then their chunk (`payload[..len]`).
    fn flush_events(&mut self, fd: c_int, len: usize) {
        let mut ids = std::mem::take(&mut self.stack_ids);
        ids.sort_unstable();
        ids.dedup();
        self.write_stacks(fd, &ids);
        self.stack_ids = ids;
        self.stack_ids.clear();
        format::chunk(kind::EVENTS, &self.payload[..len], &mut self.out);
        if let Err(e) = write_all(fd, &self.out) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| eprintln!("cushim: writing the event log: {e}"));
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
            push_varint(&mut stacks, id as u64);
            push_varint(&mut stacks, (self.ids.len() - skip) as u64);
            for &f in &self.ids[skip..] {
                push_varint(&mut stacks, f as u64);
            }
            nstacks += 1;
        }
        if nstacks == 0 {
            return;
        }
        let frames = self.sym.frames();
        if frames.len() > self.frames_written {
            self.side.clear();
            for (i, f) in frames.iter().enumerate().skip(self.frames_written) {
                push_varint(&mut self.side, i as u64);
                push_string(&mut self.side, &f.name);
                push_string(&mut self.side, &f.filename);
                push_varint(&mut self.side, f.line);
            }
            self.frames_written = frames.len();
            format::chunk(kind::FRAMES, &self.side, &mut self.out);
            let _ = write_all(fd, &self.out);
        }
        format::chunk(kind::STACKS, &stacks, &mut self.out);
        let _ = write_all(fd, &self.out);
    }
}

fn push_varint(out: &mut Vec<u8>, v: u64) {
    let mut b = [0u8; 10];
    let n = put_varint(&mut b, 0, v);
    out.extend_from_slice(&b[..n]);
}

fn push_string(out: &mut Vec<u8>, s: &str) {
    push_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Drain the queue and close the log with an `END` chunk (at exit, on an ending signal).
pub fn finish() {
    let Some(w) = WRITER.get() else { return };
    let mut w = w.lock();
    if w.ended {
        return;
    }
    w.drain();
    DRAINING.store(false, Ordering::Release);
    ON.store(false, Ordering::Release);
    // Events pushed between the drain and `ON` going off.
    w.drain();
    let mut b = [0u8; 10];
    let n = put_varint(&mut b, 0, w.events_written);
    format::chunk(kind::END, &b[..n], &mut w.out);
    let fd = FD.load(Ordering::Acquire);
    let _ = write_all(fd, &w.out);
    // SAFETY: fsync of our own descriptor.
    unsafe { libc::fsync(fd) };
    w.ended = true;
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

/// In a `fork` child: the writer thread does not exist and the file is the parent's.
pub fn after_fork_in_child() {
    ON.store(false, Ordering::Release);
    DRAINING.store(false, Ordering::Release);
}

/// The gate between the writer thread and the crash path over the batch the writer has
/// taken out of the queue but not yet written: IDLE (no batch), HOLDING (a batch, the
/// writer between pops), POPPING (the writer inside one pop), WRITING (the writer is
/// writing it out), STOLEN (the crash path took the batch and writes it itself). The crash
/// path waits out POPPING and WRITING (the writer runs on, on its own thread, and leaves
/// them within a pop or a write), takes the batch from HOLDING, or the gate from IDLE, and
/// opens it again when done (a handler of the program's may keep the program running).
const IDLE: u8 = 0;
const HOLDING: u8 = 1;
const POPPING: u8 = 2;
const WRITING: u8 = 3;
const STOLEN: u8 = 4;
static GATE: AtomicU8 = AtomicU8::new(IDLE);
/// Events in a batch.
const BATCH: usize = 2048;
struct Held(std::cell::UnsafeCell<[TraceEvent; BATCH]>);
// SAFETY: accessed only under the gate's protocol (above).
unsafe impl Sync for Held {}
const NO_EVENT: TraceEvent = TraceEvent {
    action: cushim::trace::event::Action::Alloc,
    device: 0,
    addr: 0,
    size: 0,
    stream: 0,
    time_us: 0,
    stack: NO_STACK,
    device_free: 0,
    range: 0,
};
static HELD: Held = Held(std::cell::UnsafeCell::new([NO_EVENT; BATCH]));
static HELD_LEN: AtomicUsize = AtomicUsize::new(0);

/// Serializes the fatal-signal flushes (taken with a compare-exchange: a second crashing
/// thread does not wait in its handler).
static FATAL_BUSY: AtomicBool = AtomicBool::new(false);
/// The fatal path's chunk buffer (head, then payload), used only while `FATAL_BUSY` is held.
static mut FATAL_CHUNK: [u8; CHUNK_HEAD + CHUNK_BYTES] = [0; CHUNK_HEAD + CHUNK_BYTES];

/// From a SIGSEGV/SIGBUS/SIGABRT handler: write what the queue holds, with `write(2)` only.
pub fn flush_from_signal() {
    if !ON.load(Ordering::Acquire) {
        return;
    }
    let Some(q) = QUEUE.get() else { return };
    if FATAL_BUSY
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let fd = FD.load(Ordering::Acquire);
    // Take the writer's batch (or close the gate), waiting out a pop or a write in progress;
    // bounded, in case the crash is on the writer thread itself.
    let mut stolen = false;
    let mut held = 0;
    for _ in 0..50_000_000u64 {
        match GATE.compare_exchange(HOLDING, STOLEN, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                stolen = true;
                held = HELD_LEN.load(Ordering::Acquire);
                break;
            }
            Err(IDLE) => {
                if GATE
                    .compare_exchange(IDLE, STOLEN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    stolen = true;
                    break;
                }
            }
            Err(STOLEN) => break,
            Err(_) => std::hint::spin_loop(),
        }
    }
    let mut i = 0;
    // SAFETY: with the gate STOLEN the writer does not touch the batch.
    let mut from_batch = || {
        if i < held {
            i += 1;
            Some(unsafe { (*HELD.0.get())[i - 1] })
        } else {
            None
        }
    };
    write_from_signal(fd, &mut from_batch);
    write_from_signal(fd, &mut || q.pop());
    if stolen {
        HELD_LEN.store(0, Ordering::Release);
        GATE.store(IDLE, Ordering::Release);
    }
    FATAL_BUSY.store(false, Ordering::Release);
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
        let total = CHUNK_HEAD + pos;
        let mut off = 0;
        while off < total {
            // SAFETY: write(2) from our static buffer: async-signal safe.
            let n =
                unsafe { libc::write(fd, buf[off..total].as_ptr() as *const c_void, total - off) };
            if n <= 0 {
                break;
            }
            off += n as usize;
        }
    }
}
