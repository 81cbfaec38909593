//! Any input file to the [`Snapshot`] model: snapshots (ours in pickle, msgpack or JSON, and
//! PyTorch's pickles), the shim's whole-run event log (`analyze::log_model`), RMM's logging CSV, and plain `alloc_time free_time size` logs.
//!
//! Invariant: the kind is decided from the content, never the name; every error names the
//! file and says what is wrong (`FILE: line 7: ...`); logs give events only (no end state),
//! on device 0, with each block's id standing in for its address.

use crate::analyze::load::Loader;
use crate::analyze::model::{Device, Event, Snapshot};
use crate::analyze::walk::Walked;
use crate::snapshot::reader::{read_pickle_file_with, read_pickle_with};
use crate::snapshot::sniff::{describe, file_kind, kind, name_error, not_snapshot, Kind, HEAD};
use cushim::snapshot::Format;
use cushim::trace::event::Action;
use std::path::Path;

type R<T> = Result<T, String>;

/// Read and model `path`. A pickle (protocol 2+: it starts with PROTO) is streamed from the
/// file, trace entries becoming events as they are read; other kinds are read whole.
pub fn read(path: &Path) -> R<Snapshot> {
    let at = |e: String| name_error(path, &e);
    match file_kind(path).map_err(at)? {
        Kind::Log => crate::analyze::log_model::from_log_file(path).map_err(at),
        Kind::Pickle => {
            let mut loader = Loader::new();
            let (v, len) = read_pickle_file_with(path, &mut loader).map_err(at)?;
            loader.model(&v, len).map_err(at)
        }
        Kind::Compressed(_) => read_compressed(path).map_err(at),
        k @ (Kind::Json | Kind::Msgpack) => read_streamed(path, k == Kind::Json).map_err(at),
        _ => {
            let bytes = std::fs::read(path).map_err(|e| at(e.to_string()))?;
            from_bytes(&bytes).map_err(at)
        }
    }
}

/// [`read`], and for a log each device's walk (`analyze::walk`, in the order of the
/// model's devices), made while the log was read (`log_model::from_log_file_walked`);
/// `None` for other inputs, which the caller walks.
pub fn read_walked(path: &Path) -> R<(Snapshot, Option<Vec<Walked>>)> {
    match file_kind(path).map_err(|e| name_error(path, &e))? {
        Kind::Log => crate::analyze::log_model::from_log_file_walked(path)
            .map(|(s, w)| (s, Some(w)))
            .map_err(|e| name_error(path, &e)),
        _ => Ok((read(path)?, None)),
    }
}

/// Counts the bytes read through it (the decompressed length, known only at the end).
struct Counting<R> {
    inner: R,
    n: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: std::io::Read> std::io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n.set(self.n.get() + k as u64);
        Ok(k)
    }
}

/// A gzip or zstd file, decompressed as it is read: a pickle, JSON or msgpack snapshot
/// inside is streamed as from a plain file (never whole in memory); anything else (a log,
/// CSV, not a snapshot) is read whole once decompressed.
fn read_compressed(path: &Path) -> R<Snapshot> {
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    // Progress counts the file's (compressed) bytes, against its length.
    let src = crate::snapshot::progress::Progress::new(f, &path.display().to_string(), len);
    let src = Box::new(std::io::BufReader::with_capacity(1 << 20, src));
    let (mut r, _) = crate::snapshot::sniff::decompressing(src)?;
    let head = r.fill_buf().map_err(|e| e.to_string())?;
    let head = head[..head.len().min(HEAD)].to_vec();
    let k = kind(&head);
    // Budgets that scale with the input use the decompressed length where it is known
    // only at the end; a compressed file is taken to hold at most this many times its size.
    const RATIO: u64 = 64;
    let budget = usize::try_from(len.saturating_mul(RATIO)).unwrap_or(usize::MAX);
    let mut loader = Loader::new();
    if k == Kind::Pickle {
        let (v, read) = crate::snapshot::reader::read_pickle_stream_with(r, budget, &mut loader)?;
        return loader.model(&v, read);
    }
    if let k @ (Kind::Json | Kind::Msgpack) = k {
        let json = k == Kind::Json;
        let n = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let src = Counting {
            inner: r,
            n: n.clone(),
        };
        let v = if json {
            crate::snapshot::stream::read_json(src, Some(&mut loader))
        } else {
            crate::snapshot::stream::read_msgpack(src, Some(&mut loader))
        };
        // As for a plain file: bracketed text that is not JSON is not a snapshot.
        let named = head
            .windows(8)
            .any(|w| w == b"segments" || w == b"device_t");
        let v = v.map_err(|e| {
            if json && !named && is_syntax(&e) {
                not_snapshot(describe(&head))
            } else {
                e
            }
        })?;
        return loader.model(&v, usize::try_from(n.get()).unwrap_or(usize::MAX));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut r, &mut bytes).map_err(|e| e.to_string())?;
    from_bytes(&bytes)
}

/// A JSON (`json`) or msgpack snapshot streamed from `path` (trace entries become events
/// as they are read, so the file is never in memory whole).
fn read_streamed(path: &Path, json: bool) -> R<Snapshot> {
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    // Parsed as one mapped slice (`snapshot::mapped`): the pages behind the parse point
    // are given back as it goes, so memory stays a window of the file.
    let map = crate::snapshot::mapped::Mapped::open(&f)?;
    let head = map.bytes()[..map.bytes().len().min(HEAD)].to_vec();
    let mut progress = crate::snapshot::progress::Progress::new(
        std::io::empty(),
        &path.display().to_string(),
        len,
    );
    let mut reached = |pos: usize| {
        map.release_before(pos);
        progress.at(pos as u64);
    };
    let format = if json { Format::Json } else { Format::Msgpack };
    let mut loader = Loader::new();
    let v = crate::snapshot::stream::read_slice(
        format,
        map.bytes(),
        Some(&mut loader),
        false,
        Some(&mut reached),
    );
    let v = v.map_err(|e| {
        // Text starting with a bracket that is not JSON is not a snapshot; a damaged
        // snapshot (it names its keys near the start) keeps the precise error.
        let named = head
            .windows(8)
            .any(|w| w == b"segments" || w == b"device_t");
        if json && !named && is_syntax(&e) {
            not_snapshot(describe(&head))
        } else {
            e
        }
    })?;
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    loader.model(&v, len)
}

/// Whether a JSON error says the text is not JSON at all (not that it nests too deep).
fn is_syntax(e: &str) -> bool {
    e.starts_with("JSON") && !e.contains("recursion limit") && !e.contains("nests deeper")
}

/// Model input bytes of any supported kind.
pub fn from_bytes(bytes: &[u8]) -> R<Snapshot> {
    let json = match kind(&bytes[..bytes.len().min(HEAD)]) {
        Kind::Log => return crate::analyze::log_model::from_log(bytes),
        Kind::Empty => return Err("empty file".into()),
        Kind::RmmCsv => return rmm_csv(bytes),
        Kind::PlainLog => return plain_log(bytes),
        Kind::Pickle => {
            // Stream: trace entries become compact events as they are read.
            let mut loader = Loader::new();
            let v = read_pickle_with(bytes, &mut loader)?;
            return loader.model(&v, bytes.len());
        }
        Kind::Json => true,
        Kind::Msgpack => false,
        Kind::Compressed(_) | Kind::Other => return Err(not_snapshot(describe(bytes))),
    };
    // The same stream readers as a file's (same tree, same errors).
    let format = if json { Format::Json } else { Format::Msgpack };
    let mut loader = Loader::new();
    let v = crate::snapshot::stream::read_slice(format, bytes, Some(&mut loader), false, None);
    let v = v.map_err(|e| {
        // Text starting with a bracket that is not JSON is not a snapshot; a damaged
        // snapshot (it names its keys near the start) keeps the precise JSON error.
        let head = &bytes[..bytes.len().min(HEAD)];
        let named = head
            .windows(8)
            .any(|w| w == b"segments" || w == b"device_t");
        if json && !named && is_syntax(&e) {
            not_snapshot(describe(bytes))
        } else {
            e
        }
    })?;
    loader.model(&v, bytes.len())
}

fn text(bytes: &[u8]) -> R<&str> {
    std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 text at byte {}", e.valid_up_to()))
}

fn log_snapshot(kind: &'static str, events: Vec<Event>) -> Snapshot {
    Snapshot {
        kind,
        devices: vec![Device {
            ordinal: 0,
            segments: Vec::new(),
            events: events.into(),
        }],
        host: None,
        settings: None,
        device_total: None,
        has_state: false,
        stacks: Default::default(),
        cushim: None,
    }
}

fn int(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// RMM's `logging_resource_adaptor` CSV: `Thread,Time,Action,Pointer,Size,Stream`, actions
/// `allocate`, `free`, `allocate failure`. RMM frees at once (no pending state), so a free
/// is a `free_completed`.
fn rmm_csv(bytes: &[u8]) -> R<Snapshot> {
    let mut events = Vec::new();
    for (n, line) in text(bytes)?.lines().enumerate().skip(1) {
        let at = || format!("line {}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 5 {
            return Err(format!(
                "{}: expected 6 fields Thread,Time,Action,Pointer,Size,Stream",
                at()
            ));
        }
        let action = match f[2].trim() {
            "allocate" => Action::Alloc,
            "free" => Action::FreeCompleted,
            "allocate failure" => Action::Oom,
            other => return Err(format!("{}: unknown action {other:?}", at())),
        };
        let addr = int(f[3]).ok_or_else(|| format!("{}: bad pointer {:?}", at(), f[3]))?;
        let size = int(f[4]).ok_or_else(|| format!("{}: bad size {:?}", at(), f[4]))?;
        let stream = f.get(5).and_then(|s| int(s)).unwrap_or(0);
        events.push(Event {
            action,
            addr,
            size,
            stream,
            stack: 0,
        });
    }
    Ok(log_snapshot("RMM log", events))
}

/// Lines of `alloc_time free_time size` (allocatorSim's input): one block each, freed at
/// `free_time` (a negative or missing free time: never freed). Events are ordered by time,
/// frees before allocations at the same time (the memory is free when the next asks).
fn plain_log(bytes: &[u8]) -> R<Snapshot> {
    let mut timed: Vec<(f64, u8, usize, Event)> = Vec::new();
    for (n, line) in text(bytes)?.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| -> R<f64> {
            let s = f
                .get(i)
                .ok_or_else(|| format!("line {}: expected alloc_time free_time size", n + 1))?;
            s.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("line {}: {s:?} is not a number", n + 1))
        };
        let (t0, t1, size) = (num(0)?, num(1)?, num(2)?);
        if !(0.0..=9.0e18).contains(&size) {
            return Err(format!("line {}: size {size} out of range", n + 1));
        }
        let addr = (timed.len() as u64 + 1) << 12;
        let ev = |action| Event {
            action,
            addr,
            size: size as u64,
            stream: 0,
            stack: 0,
        };
        timed.push((t0, 1, n, ev(Action::Alloc)));
        if t1 >= 0.0 {
            if t1 < t0 {
                return Err(format!(
                    "line {}: freed at {t1} before allocated at {t0}",
                    n + 1
                ));
            }
            // A block freed when it was allocated still comes after its allocation.
            let order = if t1 == t0 { 2 } else { 0 };
            timed.push((t1, order, n, ev(Action::FreeCompleted)));
        }
    }
    timed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    Ok(log_snapshot(
        "alloc/free log",
        timed.into_iter().map(|t| t.3).collect(),
    ))
}
