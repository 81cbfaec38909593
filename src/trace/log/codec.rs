//! The log's codec: every chunk kind's payload encoded and decoded here, once, for the
//! shim's writer and the offline reader (`format.rs` for the framing and the primitives;
//! `docs/LOG-FORMAT.md` describes the same bytes for other tools).
//!
//! - `HEADER`: JSON ([`header_payload`], [`decode_header`]).
//! - `EVENTS`: event records, delta and varint encoded ([`EventEncoder`],
//!   [`decode_events`]). A record: one byte (action in the low 4 bits, `format::flag` bits
//!   above), then the optional device (zigzag varint), stream (varint), stack (varint) and
//!   NVTX range (varint, version 2) the flags announce, then the time (zigzag varint,
//!   microseconds after the previous event of the chunk; the first is after 0), the address
//!   (zigzag varint, the difference from the previous event's address), the size (varint:
//!   `size / 512 * 2` when a multiple of 512, else `size * 2 + 1`), and on OOM events the
//!   free device bytes. The delta base (time, address, device 0, stream 0, range 0) resets
//!   at each chunk. Version 1 (read, no longer written) had no range: its `0x80` flag
//!   announced the free device bytes, which only OOM events carried.
//! - `MARKS` (version 3): range starts and ends, records of their own chunk so event chunks
//!   and their readers are unchanged ([`MarkEncoder`], [`decode_marks`]): a record is one
//!   byte (bit 0: an end, else a start), the device (zigzag varint), the range's path id
//!   (varint: the path with the range's own level, as `RANGES` names it, the id the events
//!   made inside it carry), and the time (zigzag varint, microseconds after the previous
//!   mark of the chunk; the first is after 0).
//! - `FRAMES`, `STACKS`, `RANGES`: the tables events name ([`put_frame`], [`put_stack`],
//!   [`put_range`] and their decoders).
//! - `DROPPED`, `END`: one varint count ([`put_count`], [`decode_count`]).
//!
//! Invariant: what the crash path uses (events, marks, counts, and `format::chunk_head`)
//! writes into a caller's fixed buffer and never allocates, so a fatal-signal handler can
//! use it. The tables are written by the writer thread only, into growing buffers.

use crate::trace::event::{Action, TraceEvent, NO_STACK};
use crate::trace::log::format::{
    flag, put_varint, unzigzag, zigzag, Cursor, MAX_EVENT_BYTES, VERSION,
};

/// A range start or end as the log records it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RangeMark {
    /// A start (else an end).
    pub start: bool,
    /// The device the shim would allocate on for the thread (as the snapshot's annotations).
    pub device: i32,
    /// The range's path, its own level included.
    pub path: crate::trace::range::RangeId,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
}

/// The most bytes one mark record takes.
pub const MAX_MARK_BYTES: usize = 1 + 10 + 5 + 10;

/// The delta base of one marks chunk.
#[derive(Debug, Default, Clone, Copy)]
pub struct MarkEncoder {
    time: i64,
}

impl MarkEncoder {
    /// Append `m` to `out` at `pos` when [`MAX_MARK_BYTES`] fit; returns the new position,
    /// or `None` when the buffer is full.
    #[inline]
    pub fn put(&mut self, m: &RangeMark, out: &mut [u8], pos: usize) -> Option<usize> {
        if out.len().saturating_sub(pos) < MAX_MARK_BYTES {
            return None;
        }
        out[pos] = u8::from(!m.start);
        let mut p = put_varint(out, pos + 1, zigzag(i64::from(m.device)));
        p = put_varint(out, p, u64::from(m.path));
        p = put_varint(out, p, zigzag(m.time_us.wrapping_sub(self.time)));
        self.time = m.time_us;
        Some(p)
    }
}

/// Decode the marks of one `MARKS` chunk's payload, calling `each`. Returns the number of
/// marks; errors name the record.
pub fn decode_marks(payload: &[u8], mut each: impl FnMut(RangeMark)) -> Result<u64, String> {
    let mut c = Cursor::new(payload);
    let mut time = 0i64;
    let mut i = 0u64;
    while !c.at_end() {
        let at = |e: String| format!("mark {i} of the chunk: {e}");
        let head = c.u8().map_err(at)?;
        if head > 1 {
            return Err(at(format!("unknown mark kind {head}")));
        }
        let d = unzigzag(c.varint().map_err(at)?);
        let device = i32::try_from(d).map_err(|_| at(format!("device {d} out of range")))?;
        let p = c.varint().map_err(at)?;
        let path = u32::try_from(p).map_err(|_| at(format!("range {p} out of range")))?;
        time = time.wrapping_add(unzigzag(c.varint().map_err(at)?));
        each(RangeMark {
            start: head == 0,
            device,
            path,
            time_us: time,
        });
        i += 1;
    }
    Ok(i)
}

/// The delta base of one chunk.
#[derive(Debug, Default, Clone, Copy)]
pub struct EventEncoder {
    time: i64,
    addr: u64,
    device: i32,
    stream: u64,
    range: u32,
}

/// Encode a size (see the module docs).
#[inline]
pub fn size_code(size: u64) -> u64 {
    if size % 512 == 0 {
        (size / 512) << 1
    } else {
        (size << 1) | 1
    }
}

/// Decode a size code.
#[inline]
pub fn size_of_code(code: u64) -> u64 {
    if code & 1 == 0 {
        (code >> 1).wrapping_mul(512)
    } else {
        code >> 1
    }
}

impl EventEncoder {
    /// Start a chunk.
    pub fn new() -> EventEncoder {
        EventEncoder::default()
    }

    /// Append `ev` to `out` at `pos` when [`MAX_EVENT_BYTES`] fit; returns the new position,
    /// or `None` when the buffer is full (the event is not written). Always inlined: the
    /// log writer calls it once per event, and its body is a few stores.
    #[inline(always)]
    pub fn put(&mut self, ev: &TraceEvent, out: &mut [u8], pos: usize) -> Option<usize> {
        if out.len().saturating_sub(pos) < MAX_EVENT_BYTES {
            return None;
        }
        let mut head = ev.action as u8;
        if ev.device != self.device {
            head |= flag::DEVICE;
        }
        if ev.stream != self.stream {
            head |= flag::STREAM;
        }
        if ev.stack != NO_STACK {
            head |= flag::STACK;
        }
        if ev.range != self.range {
            head |= flag::RANGE;
        }
        out[pos] = head;
        let mut p = pos + 1;
        if head & flag::DEVICE != 0 {
            p = put_varint(out, p, zigzag(ev.device as i64));
        }
        if head & flag::STREAM != 0 {
            p = put_varint(out, p, ev.stream);
        }
        if head & flag::STACK != 0 {
            p = put_varint(out, p, ev.stack as u64);
        }
        if head & flag::RANGE != 0 {
            p = put_varint(out, p, u64::from(ev.range));
        }
        p = put_varint(out, p, zigzag(ev.time_us.wrapping_sub(self.time)));
        p = put_varint(out, p, zigzag(ev.addr.wrapping_sub(self.addr) as i64));
        p = put_varint(out, p, size_code(ev.size));
        if ev.action == Action::Oom {
            p = put_varint(out, p, ev.device_free);
        }
        *self = EventEncoder::after(ev);
        Some(p)
    }

    /// The base after `ev`: what [`EventEncoder::put`] leaves once it has written `ev`.
    #[inline]
    pub fn after(ev: &TraceEvent) -> EventEncoder {
        EventEncoder {
            time: ev.time_us,
            addr: ev.addr,
            device: ev.device,
            stream: ev.stream,
            range: ev.range,
        }
    }

    /// Decode the record at the start of `bytes` (of the current version), written by an
    /// encoder whose base was this one: the event and the record's length. `None` when the
    /// record is cut or malformed. Allocates nothing (the crash path uses it), and leaves
    /// the base as it was: the caller moves on with [`EventEncoder::after`].
    #[inline]
    pub fn decode_next(&self, bytes: &[u8]) -> Option<(TraceEvent, usize)> {
        if bytes.is_empty() {
            return None;
        }
        let mut pos = 0;
        let ev = decode_record(bytes, &mut pos, false, &self.base_event()).ok()?;
        Some((ev, pos))
    }

    /// The base as the event a record is decoded after (only the fields records are
    /// relative to are the base's; the others any record sets).
    fn base_event(&self) -> TraceEvent {
        TraceEvent {
            action: Action::Alloc,
            device: self.device,
            addr: self.addr,
            size: 0,
            stream: self.stream,
            time_us: self.time,
            stack: NO_STACK,
            device_free: 0,
            range: self.range,
        }
    }
}

/// Decode the events of one chunk's payload (records up to its end) of a log of format
/// `version`, calling `each`. Returns the number of events. Errors name the record; events
/// decoded before an error were passed to `each`.
///
/// Why it is shaped so (the tools decode every event of a log, tens of millions): a record
/// decodes with plain bounds-checked reads that fail as a two-word [`Bad`], and no error
/// text is made until a record fails; the delta base is the previous event itself.
#[inline]
pub fn decode_events(
    payload: &[u8],
    version: u32,
    mut each: impl FnMut(TraceEvent),
) -> Result<u64, String> {
    let v1 = version < 2;
    // Each chunk starts from a zero base (range 0 is `NO_RANGE`).
    let mut prev = EventEncoder::new().base_event();
    let mut pos = 0;
    let mut i = 0u64;
    while pos < payload.len() {
        match decode_record(payload, &mut pos, v1, &prev) {
            Ok(ev) => {
                prev = ev;
                each(ev);
            }
            Err(bad) => return Err(format!("event {i} of the chunk: {}", bad.text(payload))),
        }
        i += 1;
    }
    Ok(i)
}

/// Why a record did not decode (made into text only then, by [`Bad::text`]).
#[derive(Debug, Clone, Copy)]
enum Bad {
    /// The varint starting at this byte is cut or too long.
    Varint(usize),
    Action(u8),
    Device(i64),
    Stack(u64),
    Range(u64),
}

impl Bad {
    #[cold]
    fn text(self, payload: &[u8]) -> String {
        match self {
            Bad::Varint(at) => Cursor {
                bytes: payload,
                pos: at,
            }
            .varint()
            .err()
            .unwrap_or_else(|| format!("bad varint at byte {at}")),
            Bad::Action(a) => format!("unknown action {a}"),
            Bad::Device(d) => format!("device {d} out of range"),
            Bad::Stack(s) => format!("stack {s} out of range"),
            Bad::Range(r) => format!("range {r} out of range"),
        }
    }
}

/// The varint at `*pos` (advanced past it). One-byte values, most of a record's, take
/// the inlined path.
#[inline(always)]
fn varint_at(b: &[u8], pos: &mut usize) -> Result<u64, Bad> {
    match b.get(*pos) {
        Some(&x) if x < 0x80 => {
            *pos += 1;
            Ok(u64::from(x))
        }
        _ => varint_long_at(b, pos),
    }
}

#[inline(never)]
fn varint_long_at(b: &[u8], pos: &mut usize) -> Result<u64, Bad> {
    let mut v = 0u64;
    for k in 0..10 {
        let Some(&x) = b.get(*pos + k) else {
            return Err(Bad::Varint(*pos));
        };
        if k == 9 && x > 1 {
            return Err(Bad::Varint(*pos));
        }
        v |= u64::from(x & 0x7f) << (7 * k);
        if x < 0x80 {
            *pos += k + 1;
            return Ok(v);
        }
    }
    Err(Bad::Varint(*pos))
}

/// The record at `*pos` (advanced past it), after `prev` (the delta base).
#[inline(always)]
fn decode_record(
    b: &[u8],
    pos: &mut usize,
    v1: bool,
    prev: &TraceEvent,
) -> Result<TraceEvent, Bad> {
    let head = b[*pos];
    *pos += 1;
    let action = *Action::ALL
        .get((head & 0x0f) as usize)
        .ok_or(Bad::Action(head & 0x0f))?;
    let mut ev = *prev;
    ev.action = action;
    if head & flag::DEVICE != 0 {
        let d = unzigzag(varint_at(b, pos)?);
        ev.device = i32::try_from(d).map_err(|_| Bad::Device(d))?;
    }
    if head & flag::STREAM != 0 {
        ev.stream = varint_at(b, pos)?;
    }
    ev.stack = if head & flag::STACK != 0 {
        let s = varint_at(b, pos)?;
        u32::try_from(s).map_err(|_| Bad::Stack(s))?
    } else {
        NO_STACK
    };
    if !v1 && head & flag::RANGE != 0 {
        let r = varint_at(b, pos)?;
        ev.range = u32::try_from(r).map_err(|_| Bad::Range(r))?;
    }
    ev.time_us = prev.time_us.wrapping_add(unzigzag(varint_at(b, pos)?));
    ev.addr = prev.addr.wrapping_add(unzigzag(varint_at(b, pos)?) as u64);
    ev.size = size_of_code(varint_at(b, pos)?);
    let free_follows = if v1 {
        head & flag::DEVICE_FREE != 0
    } else {
        action == Action::Oom
    };
    ev.device_free = if free_follows { varint_at(b, pos)? } else { 0 };
    Ok(ev)
}

/// One symbolized frame of the log's frame table (`FRAMES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFrame {
    pub name: String,
    pub file: String,
    pub line: u64,
}

/// Append a varint to a growing payload (the writer thread's tables; not the crash path).
pub fn push_varint(out: &mut Vec<u8>, v: u64) {
    let mut b = [0u8; 10];
    let n = put_varint(&mut b, 0, v);
    out.extend_from_slice(&b[..n]);
}

/// Append a string (varint length, then its UTF-8 bytes) to a growing payload.
pub fn push_string(out: &mut Vec<u8>, s: &str) {
    push_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Append a `FRAMES` record: frame id, name, file, line.
pub fn put_frame(out: &mut Vec<u8>, id: u64, name: &str, file: &str, line: u64) {
    push_varint(out, id);
    push_string(out, name);
    push_string(out, file);
    push_varint(out, line);
}

/// Decode the records of one `FRAMES` payload, calling `each` with the id and the frame.
/// Returns the number of frames; frames decoded before an error were passed to `each`.
pub fn decode_frames(payload: &[u8], mut each: impl FnMut(u64, LogFrame)) -> Result<u64, String> {
    let mut c = Cursor::new(payload);
    let mut n = 0;
    while !c.at_end() {
        let id = c.varint()?;
        let name = c.string()?;
        let file = c.string()?;
        let line = c.varint()?;
        each(id, LogFrame { name, file, line });
        n += 1;
    }
    Ok(n)
}

/// Append a `STACKS` record: stack id, frame count, frame ids (innermost first).
pub fn put_stack(out: &mut Vec<u8>, id: u32, frames: &[u32]) {
    push_varint(out, u64::from(id));
    push_varint(out, frames.len() as u64);
    for &f in frames {
        push_varint(out, u64::from(f));
    }
}

/// Decode the records of one `STACKS` payload, calling `each` with the id and the frame
/// ids. A count larger than the bytes left is refused before anything is allocated for it.
pub fn decode_stacks(payload: &[u8], mut each: impl FnMut(u32, Vec<u64>)) -> Result<u64, String> {
    let mut c = Cursor::new(payload);
    let mut count = 0;
    while !c.at_end() {
        let id = c.varint()?;
        let id = u32::try_from(id).map_err(|_| format!("stack id {id}"))?;
        let n = c.varint()?;
        if n > (payload.len() - c.pos) as u64 {
            return Err(format!("stack {id} claims {n} frames"));
        }
        let mut frames = Vec::with_capacity(n as usize);
        for _ in 0..n {
            frames.push(c.varint()?);
        }
        each(id, frames);
        count += 1;
    }
    Ok(count)
}

/// Append a `RANGES` record: range id, rendered path.
pub fn put_range(out: &mut Vec<u8>, id: u32, path: &str) {
    push_varint(out, u64::from(id));
    push_string(out, path);
}

/// Decode the records of one `RANGES` payload, calling `each` with the id and the path.
pub fn decode_ranges(payload: &[u8], mut each: impl FnMut(u32, String)) -> Result<u64, String> {
    let mut c = Cursor::new(payload);
    let mut n = 0;
    while !c.at_end() {
        let id = c.varint()?;
        let id = u32::try_from(id).map_err(|_| format!("range id {id}"))?;
        each(id, c.string()?);
        n += 1;
    }
    Ok(n)
}

/// The payload of a `DROPPED` (events dropped so far) or `END` (events written) chunk: one
/// varint, written into a fixed buffer (no allocation); returns its length.
pub fn put_count(out: &mut [u8; 10], n: u64) -> usize {
    put_varint(out, 0, n)
}

/// The count of a `DROPPED` or `END` payload (bytes after the varint are ignored).
pub fn decode_count(payload: &[u8]) -> Result<u64, String> {
    Cursor::new(payload).varint()
}

/// The payload of the `HEADER` chunk: the header as JSON.
pub fn header_payload(header: &serde_json::Value) -> Vec<u8> {
    header.to_string().into_bytes()
}

/// Decode a `HEADER` payload: the header and the format version it names (1 when it
/// names none). A version newer than this reader's is refused.
pub fn decode_header(payload: &[u8]) -> Result<(serde_json::Value, u32), String> {
    let header: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("the header is not JSON: {e}"))?;
    let version = header["version"].as_u64().unwrap_or(1);
    if version > u64::from(VERSION) {
        return Err(format!(
            "format version {version}: written by a newer cushim (this one reads up to {VERSION})"
        ));
    }
    Ok((header, version as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_a_chunk() {
        let evs: Vec<TraceEvent> = (0..100u64)
            .map(|i| TraceEvent {
                action: Action::ALL[(i % 9) as usize],
                device: (i % 3) as i32 - 1,
                addr: 0x7f00_0000_0000 + (i * 7919 % 1000) * 512,
                size: if i % 2 == 0 { i * 512 } else { i * 3 + 1 },
                stream: i % 4,
                time_us: 1_700_000_000_000_000 + (i as i64) * 13 - (i as i64 % 5),
                stack: (i % 5) as u32,
                device_free: if i % 9 == 7 { 12345 } else { 0 },
                range: (i % 7 / 3) as u32,
            })
            .collect();
        let mut buf = vec![0u8; 1 << 16];
        let mut enc = EventEncoder::new();
        let mut pos = 0;
        for e in &evs {
            pos = enc.put(e, &mut buf, pos).expect("room");
        }
        let mut back = Vec::new();
        decode_events(&buf[..pos], crate::trace::log::format::VERSION, |e| {
            back.push(e)
        })
        .expect("decodes");
        assert_eq!(back, evs);
    }

    #[test]
    fn a_record_decodes_alone_against_the_base_it_was_encoded_after() {
        let evs: Vec<TraceEvent> = (0..50u64)
            .map(|i| TraceEvent {
                action: Action::ALL[(i % 9) as usize],
                device: (i % 3) as i32,
                addr: 0x7f00_0000_0000 + (i * 7919 % 1000) * 512,
                size: i * 1000 + 1,
                stream: i % 2,
                time_us: 1_700_000_000_000_000 + (i as i64) * 3,
                stack: (i % 4) as u32,
                device_free: 0,
                range: (i % 5) as u32,
            })
            .collect();
        let mut buf = vec![0u8; 1 << 12];
        let mut enc = EventEncoder::new();
        let mut ends = Vec::new();
        let mut pos = 0;
        for e in &evs {
            pos = enc.put(e, &mut buf, pos).expect("room");
            ends.push(pos);
        }
        let mut base = EventEncoder::new();
        let mut at = 0;
        for (e, end) in evs.iter().zip(ends) {
            let (back, len) = base.decode_next(&buf[at..pos]).expect("decodes");
            assert_eq!((&back, at + len), (e, end));
            base = EventEncoder::after(&back);
            at += len;
        }
        assert!(
            base.decode_next(&buf[at..pos]).is_none(),
            "nothing after the last"
        );
        assert!(EventEncoder::new()
            .decode_next(&[flag::STACK, 0x80])
            .is_none());
    }

    #[test]
    fn extreme_fields_round_trip_through_a_chunk() {
        let evs: Vec<TraceEvent> = [u64::MAX, 0, 1 << 63, 511, 512, u64::MAX - 511]
            .iter()
            .enumerate()
            .map(|(i, &v)| TraceEvent {
                action: if i == 2 { Action::Oom } else { Action::Alloc },
                device: if i % 2 == 0 { i32::MIN } else { i32::MAX },
                addr: v,
                size: v >> 1,
                stream: v,
                time_us: if i % 2 == 0 { i64::MIN } else { i64::MAX },
                stack: if i == 1 {
                    NO_STACK
                } else {
                    u32::MAX - i as u32
                },
                device_free: if i == 2 { u64::MAX } else { 0 },
                range: u32::MAX - i as u32,
            })
            .collect();
        let mut buf = vec![0u8; 1 << 12];
        let mut enc = EventEncoder::new();
        let mut pos = 0;
        for e in &evs {
            pos = enc.put(e, &mut buf, pos).expect("room");
        }
        let mut back = Vec::new();
        let n = decode_events(&buf[..pos], VERSION, |e| back.push(e)).expect("decodes");
        assert_eq!((n, back), (evs.len() as u64, evs));
    }

    #[test]
    fn a_bad_record_is_named_with_what_is_wrong_after_the_good_ones() {
        let good = TraceEvent {
            action: Action::Alloc,
            device: 0,
            addr: 4096,
            size: 512,
            stream: 0,
            time_us: 10,
            stack: NO_STACK,
            device_free: 0,
            range: 0,
        };
        let mut buf = vec![0u8; 256];
        let pos = EventEncoder::new().put(&good, &mut buf, 0).expect("room");
        let decode = |bad: &[u8]| {
            let mut chunk = buf[..pos].to_vec();
            chunk.extend_from_slice(bad);
            let mut seen = Vec::new();
            let e = decode_events(&chunk, VERSION, |e| seen.push(e)).unwrap_err();
            assert_eq!(seen, [good], "the good record first");
            e
        };
        // A stack id's varint cut at the end of the payload.
        let e = decode(&[flag::STACK, 0x80]);
        assert!(
            e.starts_with("event 1 of the chunk: record cut at byte"),
            "{e}"
        );
        // Eleven varint bytes.
        let e = decode(&[
            flag::STACK,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            1,
        ]);
        assert!(e.contains("event 1 of the chunk: varint too long"), "{e}");
        assert!(decode(&[0x0f]).contains("unknown action 15"));
        let e = decode(&[flag::STACK, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0]);
        assert!(e.contains("stack 4294967296 out of range"), "{e}");
        let e = decode(&[flag::DEVICE, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0]);
        assert!(e.contains("device 2147483648 out of range"), "{e}");
        let e = decode(&[flag::RANGE, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0]);
        assert!(e.contains("range 4294967296 out of range"), "{e}");
    }

    #[test]
    fn range_marks_round_trip_through_a_chunk() {
        let marks: Vec<RangeMark> = (0..50i64)
            .map(|i| RangeMark {
                start: i % 2 == 0,
                device: (i % 3) as i32 - 1,
                path: (i * 37 % 300) as u32,
                time_us: 1_700_000_000_000_000 + i * 11 - (i % 4),
            })
            .collect();
        let mut buf = vec![0u8; 1 << 12];
        let mut enc = MarkEncoder::default();
        let mut pos = 0;
        for m in &marks {
            pos = enc.put(m, &mut buf, pos).expect("room");
        }
        let mut back = Vec::new();
        assert_eq!(decode_marks(&buf[..pos], |m| back.push(m)), Ok(50));
        assert_eq!(back, marks);
        assert!(decode_marks(&[7], |_| {})
            .unwrap_err()
            .contains("unknown mark kind"));
    }

    #[test]
    fn a_version_1_record_reads_its_free_device_bytes_and_no_range() {
        // Version 1: an oom record with 0x80 (free bytes follow): time 5, address +4096,
        // size 1 MiB (code 4096), 777 bytes free; then an alloc without flags.
        let mut b = vec![Action::Oom as u8 | flag::DEVICE_FREE];
        let mut put = |v: u64| {
            let mut t = [0u8; 10];
            let n = put_varint(&mut t, 0, v);
            b.extend_from_slice(&t[..n]);
        };
        put(zigzag(5));
        put(zigzag(4096));
        put(size_code(1 << 20));
        put(777);
        let mut b2 = b.clone();
        b2.push(Action::Alloc as u8);
        b2.extend_from_slice(&[0, 0, 2]);
        let mut back = Vec::new();
        decode_events(&b2, 1, |e| back.push(e)).expect("a version-1 chunk decodes");
        assert_eq!(back.len(), 2);
        assert_eq!(
            (back[0].action, back[0].device_free, back[0].range),
            (Action::Oom, 777, 0)
        );
        assert_eq!(
            (back[1].action, back[1].size, back[1].range),
            (Action::Alloc, 512, 0)
        );
    }

    #[test]
    fn frames_round_trip_and_are_the_documented_bytes() {
        let frames = [
            (0u64, "main", "prog.c", 12u64),
            (1, "", "", 0),
            (300, "caf\u{e9}::\u{1f600}", "/a/b.rs", 1 << 40),
        ];
        let mut out = Vec::new();
        for (id, name, file, line) in frames {
            put_frame(&mut out, id, name, file, line);
        }
        let mut back = Vec::new();
        assert_eq!(decode_frames(&out, |id, f| back.push((id, f))), Ok(3));
        let want: Vec<(u64, LogFrame)> = frames
            .iter()
            .map(|&(id, n, f, l)| {
                let frame = LogFrame {
                    name: n.into(),
                    file: f.into(),
                    line: l,
                };
                (id, frame)
            })
            .collect();
        assert_eq!(back, want);
        // id 3, "f", "a.c", line 200: varint, length-prefixed strings, varint.
        let mut one = Vec::new();
        put_frame(&mut one, 3, "f", "a.c", 200);
        assert_eq!(one, [3, 1, b'f', 3, b'a', b'.', b'c', 0xc8, 0x01]);
        assert!(decode_frames(&one[..4], |_, _| {}).is_err());
    }

    #[test]
    fn stacks_round_trip_and_are_the_documented_bytes() {
        let stacks: [(u32, &[u32]); 3] = [(1, &[0, 1, 2]), (2, &[]), (u32::MAX, &[200, 7])];
        let mut out = Vec::new();
        for (id, f) in stacks {
            put_stack(&mut out, id, f);
        }
        let mut back = Vec::new();
        assert_eq!(decode_stacks(&out, |id, f| back.push((id, f))), Ok(3));
        let want: Vec<(u32, Vec<u64>)> = stacks
            .iter()
            .map(|(id, f)| (*id, f.iter().map(|&x| u64::from(x)).collect()))
            .collect();
        assert_eq!(back, want);
        // Stack 5 of frames 1 and 128: id, count, frame ids.
        let mut one = Vec::new();
        put_stack(&mut one, 5, &[1, 128]);
        assert_eq!(one, [5, 2, 1, 0x80, 0x01]);
        let e = decode_stacks(&[5, 100, 1], |_, _| {}).unwrap_err();
        assert!(e.contains("claims 100 frames"), "{e}");
    }

    #[test]
    fn ranges_round_trip_and_are_the_documented_bytes() {
        let ranges = [(1u32, "train/step"), (2, "dom:fwd"), (1000, "")];
        let mut out = Vec::new();
        for (id, p) in ranges {
            put_range(&mut out, id, p);
        }
        let mut back = Vec::new();
        assert_eq!(decode_ranges(&out, |id, p| back.push((id, p))), Ok(3));
        let want: Vec<(u32, String)> = ranges.iter().map(|&(i, p)| (i, p.into())).collect();
        assert_eq!(back, want);
        let mut one = Vec::new();
        put_range(&mut one, 2, "a/b");
        assert_eq!(one, [2, 3, b'a', b'/', b'b']);
        let mut big = Vec::new();
        push_varint(&mut big, u64::from(u32::MAX) + 1);
        push_string(&mut big, "x");
        assert!(decode_ranges(&big, |_, _| {})
            .unwrap_err()
            .contains("range id"));
    }

    #[test]
    fn counts_round_trip_without_allocating() {
        for n in [0u64, 1, 127, 128, u64::MAX] {
            let mut b = [0u8; 10];
            let len = put_count(&mut b, n);
            assert_eq!(decode_count(&b[..len]), Ok(n));
        }
        assert!(decode_count(&[]).is_err());
    }

    #[test]
    fn the_header_round_trips_and_a_newer_version_is_refused() {
        let h = serde_json::json!({"format": "cushim event log", "version": VERSION, "pid": 7});
        let (back, version) = decode_header(&header_payload(&h)).expect("decodes");
        assert_eq!((back, version), (h, VERSION));
        let (_, old) = decode_header(br#"{"pid":1}"#).expect("no version reads as 1");
        assert_eq!(old, 1);
        let newer = serde_json::json!({ "version": VERSION + 1 });
        let e = decode_header(&header_payload(&newer)).unwrap_err();
        assert!(e.contains("newer cushim"), "{e}");
        assert!(decode_header(b"{").unwrap_err().contains("not JSON"));
    }
}
