//! Reads the whole-run event log (`CUSHIM_LOG`; format in `trace::log` and
//! `docs/LOG-FORMAT.md`).
//!
//! Policy: a log is read by content (it starts with `trace::log::format::MAGIC`). Chunks are
//! taken in order while each is whole and its checksum matches; the first that is not (a
//! torn tail after a kill, or damage) ends the reading, and what it was is reported in
//! [`LogInfo::problem`]: the events before it are the clean prefix, nothing after it is
//! guessed at. A chunk whose checksum matches but whose content does not decode is an
//! error (the file is not one this reader understands). A missing or damaged header is an
//! error. Every length is checked before use: no input makes the reader panic or allocate
//! more than a constant factor of the file.

use cushim::trace::event::TraceEvent;
use cushim::trace::log::encode::decode_events;
use cushim::trace::log::format::{crc, kind, Cursor, CHUNK_HEAD, MAGIC, MAX_PAYLOAD};

/// One symbolized frame of the log's frame table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFrame {
    pub name: String,
    pub file: String,
    pub line: u64,
}

/// What a log says besides its events.
#[derive(Debug, Default)]
pub struct LogInfo {
    /// The header chunk (JSON).
    pub header: serde_json::Value,
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
}

/// Whether `bytes` start as a log.
pub fn is_log(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Read a log from its bytes.
pub fn read_log(bytes: &[u8], v: &mut dyn LogVisitor) -> Result<LogInfo, String> {
    if !is_log(bytes) {
        return Err("not a cushim event log (bad magic bytes)".into());
    }
    let mut info = LogInfo::default();
    let mut pos = MAGIC.len();
    let mut first = true;
    let mut pending: Vec<TraceEvent> = Vec::new();
    while pos < bytes.len() {
        let left = bytes.len() - pos;
        if left < CHUNK_HEAD {
            info.problem = Some(format!(
                "torn tail: {left} bytes at byte {pos} are less than a chunk head"
            ));
            break;
        }
        let k = bytes[pos];
        let len = u32::from_le_bytes([
            bytes[pos + 1],
            bytes[pos + 2],
            bytes[pos + 3],
            bytes[pos + 4],
        ]) as usize;
        let sum = u32::from_le_bytes([
            bytes[pos + 5],
            bytes[pos + 6],
            bytes[pos + 7],
            bytes[pos + 8],
        ]);
        if len > MAX_PAYLOAD {
            info.problem = Some(format!(
                "damaged chunk at byte {pos}: length {len} is more than any writer makes"
            ));
            break;
        }
        if left - CHUNK_HEAD < len {
            info.problem = Some(format!(
                "torn tail: the chunk at byte {pos} wants {len} bytes, {} are there",
                left - CHUNK_HEAD
            ));
            break;
        }
        let payload = &bytes[pos + CHUNK_HEAD..pos + CHUNK_HEAD + len];
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
            info.header = serde_json::from_slice(payload)
                .map_err(|e| format!("the header is not JSON: {e}"))?;
            first = false;
            pos += CHUNK_HEAD + len;
            continue;
        }
        let at = |e: String| format!("chunk at byte {pos}: {e}");
        match k {
            kind::EVENTS => {
                pending.clear();
                decode_events(payload, |e| pending.push(e)).map_err(at)?;
                info.events += pending.len() as u64;
                for e in pending.drain(..) {
                    v.event(e);
                }
            }
            kind::FRAMES => {
                let mut c = Cursor::new(payload);
                while !c.at_end() {
                    let id = c.varint().map_err(at)?;
                    let name = c.string().map_err(at)?;
                    let file = c.string().map_err(at)?;
                    let line = c.varint().map_err(at)?;
                    v.frame(id, LogFrame { name, file, line });
                }
            }
            kind::STACKS => {
                let mut c = Cursor::new(payload);
                while !c.at_end() {
                    let id = c.varint().map_err(at)?;
                    let id = u32::try_from(id).map_err(|_| at(format!("stack id {id}")))?;
                    let n = c.varint().map_err(at)?;
                    if n > (payload.len() - c.pos) as u64 {
                        return Err(at(format!("stack {id} claims {n} frames")));
                    }
                    let mut frames = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        frames.push(c.varint().map_err(at)?);
                    }
                    v.stack(id, frames);
                }
            }
            kind::DROPPED => {
                info.dropped = Cursor::new(payload).varint().map_err(at)?;
            }
            kind::END => info.ended = true,
            kind::HEADER => return Err(at("a second header".into())),
            other => return Err(at(format!("unknown chunk kind {other}"))),
        }
        pos += CHUNK_HEAD + len;
    }
    if first {
        return Err(match info.problem {
            Some(p) => format!("no whole header: {p}"),
            None => "no header".into(),
        });
    }
    Ok(info)
}
