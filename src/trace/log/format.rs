//! The log's framing and primitive encodings (the full description, for other tools, is
//! `docs/LOG-FORMAT.md`; this file and that one change together, with [`VERSION`]).
//!
//! A log is [`MAGIC`] then chunks. A chunk is `kind: u8`, `len: u32 LE`, `crc: u32 LE`
//! (CRC-32 of the kind byte and the payload), then `len` payload bytes. Each chunk is
//! written with one `write(2)` to a file opened `O_APPEND`, so a reader sees whole chunks
//! and at most one torn one at the end; the checksum tells a torn or damaged chunk from a
//! whole one, and a reader stops there (the chunks before it are the clean prefix).
//!
//! Why chunks decode on their own (the delta base resets at each chunk): the fatal-signal
//! path writes its chunk without knowing the writer thread's state, and a damaged chunk
//! costs only its own events.

/// The first bytes of every log.
pub const MAGIC: &[u8; 8] = b"CUSHLOG\x01";
/// The format version, in the header chunk (the magic bytes stay those of version 1).
/// Version 2 added NVTX range paths: the `RANGES` chunk and [`flag::RANGE`]; version 3 the
/// `MARKS` chunk (range starts and ends). A reader reads every older version.
pub const VERSION: u32 = 3;
/// Bytes before a chunk's payload.
pub const CHUNK_HEAD: usize = 9;
/// The largest payload a writer makes (a reader refuses more: a corrupt length).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Chunk kinds.
pub mod kind {
    /// JSON: version, pid, rank, devices and their memory, settings, clock origin.
    pub const HEADER: u8 = 1;
    /// Events (`codec::EventEncoder`).
    pub const EVENTS: u8 = 2;
    /// Frames: id, name, file, line (`codec::put_frame`).
    pub const FRAMES: u8 = 3;
    /// Stacks: id, frame ids, innermost first (`codec::put_stack`).
    pub const STACKS: u8 = 4;
    /// Events the writer could not take (varint count).
    pub const DROPPED: u8 = 5;
    /// A clean end: varint count of events written.
    pub const END: u8 = 6;
    /// NVTX range paths (version 2): range id, rendered path.
    pub const RANGES: u8 = 7;
    /// NVTX range starts and ends (version 3; `codec::MarkEncoder`).
    pub const MARKS: u8 = 8;
}

/// Event record flags (the first byte's high bits; the low 4 bits are the action).
pub mod flag {
    /// A zigzag varint device ordinal follows (else: the previous event's device).
    pub const DEVICE: u8 = 0x10;
    /// A varint stream follows (else: the previous event's stream).
    pub const STREAM: u8 = 0x20;
    /// A varint stack id follows (else: no stack).
    pub const STACK: u8 = 0x40;
    /// Version 1: a varint of free device bytes follows (set on OOM events only). Version
    /// 2 writes the free bytes on every OOM event without a flag, and uses this bit as
    /// [`RANGE`].
    pub const DEVICE_FREE: u8 = 0x80;
    /// Version 2: a varint NVTX range id follows (else: the previous event's range).
    pub const RANGE: u8 = 0x80;
}

/// The most bytes one event record takes.
pub const MAX_EVENT_BYTES: usize = 1 + 5 + 10 + 5 + 5 + 10 + 10 + 10 + 10;

/// Append an unsigned LEB128 varint to `out` at `pos`; returns the new position. The caller
/// makes sure 10 bytes fit.
#[inline]
pub fn put_varint(out: &mut [u8], mut pos: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        out[pos] = (v as u8) | 0x80;
        pos += 1;
        v >>= 7;
    }
    out[pos] = v as u8;
    pos + 1
}

#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A bounds-checked cursor over a payload; every read fails cleanly at the end.
pub struct Cursor<'a> {
    pub bytes: &'a [u8],
    pub pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8, String> {
        match self.bytes.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.cut()),
        }
    }

    #[cold]
    fn cut(&self) -> String {
        format!("record cut at byte {}", self.pos)
    }

    #[inline]
    pub fn varint(&mut self) -> Result<u64, String> {
        // Most values of a record fit in one byte: that path is inlined, the rest is not.
        if let Some(&b) = self.bytes.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        self.varint_long()
    }

    fn varint_long(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(format!("varint too long at byte {}", self.pos));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(format!("varint too long at byte {}", self.pos))
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| format!("{n} bytes wanted at byte {}: past the end", self.pos))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn string(&mut self) -> Result<String, String> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| "string length out of range".to_string())?;
        Ok(String::from_utf8_lossy(self.bytes(n)?).into_owned())
    }
}

/// Frame a payload as a chunk into `out` (cleared first).
pub fn chunk(kind: u8, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc(kind, payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The checksum of a chunk.
pub fn crc(kind: u8, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind]);
    h.update(payload);
    h.finalize()
}

/// Write a chunk's head for `payload` into `head` (no allocation: the fatal-signal path).
pub fn chunk_head(kind: u8, payload: &[u8], head: &mut [u8; CHUNK_HEAD]) {
    head[0] = kind;
    head[1..5].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    head[5..9].copy_from_slice(&crc(kind, payload).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_zigzag_round_trip() {
        let mut buf = [0u8; 10];
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let n = put_varint(&mut buf, 0, v);
            let mut c = Cursor::new(&buf[..n]);
            assert_eq!(c.varint(), Ok(v));
            assert!(c.at_end());
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }
}
