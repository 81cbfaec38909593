//! Reads the whole-run event log (`CUSHIM_LOG`; format in `docs/LOG-FORMAT.md`; every chunk
//! kind is decoded by the engine's `trace::log::codec`, the codec the shim writes with), as
//! a stream: one chunk in memory at a time, so a log of any length reads in memory bounded
//! by the largest chunk (plus what the visitor keeps).
//!
//! Policy: a log is read by content (it starts with `trace::log::format::MAGIC`). Chunks are
//! taken in order while each is whole and its checksum matches; the first that is not (a
//! torn tail after a kill, or damage) ends the reading, and what it was is reported in
//! [`LogInfo::problem`]: the events before it are the clean prefix, nothing after it is
//! guessed at. A chunk whose checksum matches but whose content does not decode is an
//! error (the file is not one this reader understands; the visitor may have had the
//! events before the bad record). A missing or damaged header is an
//! error. Every length is checked before use: no input makes the reader panic or allocate
//! more than the largest chunk a writer makes.
//!
//! A reader that walks the events several times (the analyses) keeps where each events
//! chunk is ([`LogVisitor::events_chunk`]) and reads it again with [`read_chunk_at`], which
//! checks it as the first reading did.

use std::io::Read;

use cushim::trace::event::TraceEvent;
use cushim::trace::log::codec::{
    decode_count, decode_events, decode_frames, decode_header, decode_marks, decode_ranges,
    decode_stacks, RangeMark,
};
use cushim::trace::log::format::{crc, kind, CHUNK_HEAD, MAGIC, MAX_PAYLOAD};

/// One symbolized frame of the log's frame table.
pub use cushim::trace::log::codec::LogFrame;

/// What a log says besides its events.
#[derive(Debug, Default)]
pub struct LogInfo {
    /// The header chunk (JSON).
    pub header: serde_json::Value,
    /// The format version the header names (1 when it names none).
    pub version: u32,
    /// Events the writer could not take (written in the log by the shim).
    pub dropped: u64,
    /// Whether the log was closed cleanly (an `END` chunk).
    pub ended: bool,
    /// Events read.
    pub events: u64,
    /// Why reading stopped before the end of the file (torn tail, damaged chunk).
    pub problem: Option<String>,
}

/// Receives a log's content as it is read.
pub trait LogVisitor {
    fn event(&mut self, ev: TraceEvent);
    fn frame(&mut self, id: u64, frame: LogFrame);
    /// Stack `id`'s frames, innermost first (frame ids).
    fn stack(&mut self, id: u32, frames: Vec<u64>);
    /// NVTX range `id`'s rendered path (`outer/inner`; a domain's ranges as `domain:name`).
    fn range(&mut self, _id: u32, _path: String) {}
    /// An NVTX range start or end (version 3), its path named by [`LogVisitor::range`]
    /// before it.
    fn range_mark(&mut self, _mark: RangeMark) {}
    /// An events chunk starts at byte `at` of the file (its head; `len` payload bytes);
    /// its events follow through [`LogVisitor::event`].
    fn events_chunk(&mut self, _at: u64, _len: u32) {}
}

/// Whether `bytes` start as a log.
pub fn is_log(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Read a log from its bytes.
pub fn read_log(bytes: &[u8], v: &mut dyn LogVisitor) -> Result<LogInfo, String> {
    read_log_from(bytes, v)
}

/// Fill `buf` from `r` as far as the input goes; returns the bytes read (less than asked
/// only at the end of the input).
fn fill(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, String> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading at byte {n}: {e}")),
        }
    }
    Ok(n)
}

/// The kind, payload length and checksum a chunk head says, or why it cannot be a whole
/// chunk (a length no writer makes).
fn check(head: &[u8; CHUNK_HEAD], pos: u64) -> Result<(u8, usize, u32), String> {
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let sum = u32::from_le_bytes([head[5], head[6], head[7], head[8]]);
    if len > MAX_PAYLOAD {
        return Err(format!(
            "damaged chunk at byte {pos}: length {len} is more than any writer makes"
        ));
    }
    Ok((head[0], len, sum))
}

/// Read a log from `r` (a file is read through a `BufReader`), one chunk at a time.
pub fn read_log_from(mut r: impl Read, v: &mut dyn LogVisitor) -> Result<LogInfo, String> {
    let mut magic = [0u8; 8];
    let n = fill(&mut r, &mut magic)?;
    if !is_log(&magic[..n]) {
        return Err("not a cushim event log (bad magic bytes)".into());
    }
    let mut info = LogInfo::default();
    let mut pos = MAGIC.len() as u64;
    let mut first = true;
    let mut payload: Vec<u8> = Vec::new();
    loop {
        let mut head = [0u8; CHUNK_HEAD];
        let got = fill(&mut r, &mut head)?;
        if got == 0 {
            break;
        }
        if got < CHUNK_HEAD {
            info.problem = Some(format!(
                "torn tail: {got} bytes at byte {pos} are less than a chunk head"
            ));
            break;
        }
        let (k, len, sum) = match check(&head, pos) {
            Ok(c) => c,
            Err(p) => {
                info.problem = Some(p);
                break;
            }
        };
        payload.resize(len, 0);
        let got = fill(&mut r, &mut payload)?;
        if got < len {
            info.problem = Some(format!(
                "torn tail: the chunk at byte {pos} wants {len} bytes, {got} are there"
            ));
            break;
        }
        let payload = &payload[..];
        if crc(k, payload) != sum {
            info.problem = Some(format!(
                "damaged chunk at byte {pos}: checksum mismatch (reading stopped there)"
            ));
            break;
        }
        if first {
            if k != kind::HEADER {
                return Err(format!("the first chunk is of kind {k}, not a header"));
            }
            let (header, version) = decode_header(payload)?;
            info.header = header;
            info.version = version;
            first = false;
            pos += (CHUNK_HEAD + len) as u64;
            continue;
        }
        let at = |e: String| format!("chunk at byte {pos}: {e}");
        match k {
            kind::EVENTS => {
                // Straight from the payload to the visitor: no copy of the chunk's events.
                v.events_chunk(pos, len as u32);
                info.events += decode_events(payload, info.version, |e| v.event(e)).map_err(at)?;
            }
            kind::FRAMES => {
                decode_frames(payload, |id, f| v.frame(id, f)).map_err(at)?;
            }
            kind::STACKS => {
                decode_stacks(payload, |id, frames| v.stack(id, frames)).map_err(at)?;
            }
            kind::RANGES => {
                decode_ranges(payload, |id, path| v.range(id, path)).map_err(at)?;
            }
            kind::MARKS => {
                decode_marks(payload, |m| v.range_mark(m)).map_err(at)?;
            }
            kind::DROPPED => {
                info.dropped = decode_count(payload).map_err(at)?;
            }
            kind::END => info.ended = true,
            kind::HEADER => return Err(at("a second header".into())),
            other => return Err(at(format!("unknown chunk kind {other}"))),
        }
        pos += (CHUNK_HEAD + len) as u64;
    }
    if first {
        return Err(match info.problem {
            Some(p) => format!("no whole header: {p}"),
            None => "no header".into(),
        });
    }
    Ok(info)
}

/// The payload of the events chunk whose head is at byte `at` of `file` (`len` bytes, as
/// [`LogVisitor::events_chunk`] gave them), read with its head into `buf` and checked
/// again (the file may have been changed since).
pub fn read_chunk_at<'b>(
    file: &std::fs::File,
    at: u64,
    len: u32,
    buf: &'b mut Vec<u8>,
) -> Result<&'b [u8], String> {
    use std::os::unix::fs::FileExt;
    let again = |e: std::io::Error| format!("reading the chunk at byte {at} again: {e}");
    // Head and payload in one read.
    buf.resize(CHUNK_HEAD + len as usize, 0);
    file.read_exact_at(buf, at).map_err(again)?;
    let mut head = [0u8; CHUNK_HEAD];
    head.copy_from_slice(&buf[..CHUNK_HEAD]);
    let payload = &buf[CHUNK_HEAD..];
    let (k, l, sum) = check(&head, at)?;
    if k != kind::EVENTS || l != len as usize || crc(k, payload) != sum {
        return Err(format!(
            "the chunk at byte {at} changed since it was first read (the file was rewritten)"
        ));
    }
    Ok(payload)
}
