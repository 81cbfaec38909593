//! What a file a user hands the tools is, by its content: compressed (gzip, zstd: read
//! through transparently), a snapshot, or something else, named in one line.
//!
//! Policy: the name of a file never decides anything (a `.pickle` may be gzip, a `.gz` may
//! be plain). A file that is not a snapshot is refused as `FILE is not a snapshot (found
//! WHAT)`, WHAT saying what it looks like (an ELF file, a zip archive, CSV with header ...,
//! a dict with keys ...), so the user sees at once they passed the wrong file; a file that
//! is a snapshot but damaged keeps its precise error (`FILE: truncated pickle at byte N`).
//! A compressed input is decompressed as it is read ([`decompressing`]: the readers take
//! the decompressed bytes as a stream, so memory is what the model needs, not the
//! decompressed file); [`decompress`] unwraps bytes already in memory.
//!
//! One detection for every reader: [`kind`] names what the first bytes are (a whole-run
//! log, a compression, a pickle, JSON or msgpack snapshot, RMM's CSV, a plain
//! `alloc_time free_time size` log, nothing, or something else), in that order of
//! precedence; the readers (`snapshot::reader`, `analyze::input`, the export, `--by range`)
//! all ask it rather than look at the bytes themselves.

use cushim::snapshot::Format;
use std::io::Read;
use std::path::Path;

/// How [`not_snapshot`] errors start, so [`name_error`] can word them.
const NOT_A_SNAPSHOT: &str = "not a snapshot (found ";

/// The error for content that is not a snapshot; `found` says what it is.
pub fn not_snapshot(found: impl std::fmt::Display) -> String {
    format!("{NOT_A_SNAPSHOT}{found})")
}

/// Whether `e` is a [`not_snapshot`] error.
pub fn is_not_snapshot(e: &str) -> bool {
    e.starts_with(NOT_A_SNAPSHOT)
}

/// `e`, an error reading `path`, as one line naming the file: `FILE is not a snapshot
/// (found ...)` or `FILE: e`.
pub fn name_error(path: &Path, e: &str) -> String {
    if is_not_snapshot(e) {
        format!("{} is {e}", path.display())
    } else {
        format!("{}: {e}", path.display())
    }
}

/// A compression a file may be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Zstd,
}

/// The compression of bytes starting with `head`, by magic number.
pub fn compression(head: &[u8]) -> Option<Compression> {
    if head.starts_with(&[0x1f, 0x8b]) {
        Some(Compression::Gzip)
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(Compression::Zstd)
    } else {
        None
    }
}

/// `bytes` decompressed when they are gzip or zstd (nested compressions too), else as
/// they are.
pub fn decompress(mut bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    // A compressed file inside a compressed file is unwrapped as well, a few levels deep.
    for _ in 0..4 {
        let mut out = Vec::new();
        match compression(&bytes) {
            None => return Ok(bytes),
            Some(Compression::Gzip) => {
                flate2::read::MultiGzDecoder::new(&bytes[..])
                    .read_to_end(&mut out)
                    .map_err(|e| format!("gzip: {e}"))?;
            }
            Some(Compression::Zstd) => {
                let mut d = ruzstd::decoding::StreamingDecoder::new(&bytes[..])
                    .map_err(|e| format!("zstd: {e}"))?;
                d.read_to_end(&mut out).map_err(|e| format!("zstd: {e}"))?;
            }
        }
        bytes = out;
    }
    Err("compressed more than four times over".into())
}

/// A decompressed reading buffer size (the decoders' output is read in pieces this big).
const BUF: usize = 1 << 20;

/// `r` with its gzip and zstd layers (nested ones too, by content) taken off as it is
/// read, and how many there were; the bytes are never all in memory.
pub fn decompressing<'a>(
    mut r: Box<dyn std::io::BufRead + 'a>,
) -> Result<(Box<dyn std::io::BufRead + 'a>, usize), String> {
    for layers in 0..5 {
        let head = r.fill_buf().map_err(|e| e.to_string())?;
        let Some(c) = compression(head) else {
            return Ok((r, layers));
        };
        if layers == 4 {
            break;
        }
        r = match c {
            Compression::Gzip => Box::new(std::io::BufReader::with_capacity(
                BUF,
                flate2::bufread::MultiGzDecoder::new(r),
            )),
            Compression::Zstd => {
                let d =
                    ruzstd::decoding::StreamingDecoder::new(r).map_err(|e| format!("zstd: {e}"))?;
                Box::new(std::io::BufReader::with_capacity(BUF, d))
            }
        };
    }
    Err("compressed more than four times over".into())
}

/// Read `path` whole, decompressed.
pub fn read_decompressed(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    decompress(bytes)
}

/// What input bytes are, by their first bytes (a few KiB are enough: [`HEAD`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// cushim's whole-run event log (its magic).
    Log,
    /// Compressed: what is inside is known once decompressed.
    Compressed(Compression),
    /// Only whitespace (or nothing).
    Empty,
    /// RMM's `logging_resource_adaptor` CSV (`Thread,Time,Action,...`).
    RmmCsv,
    /// Lines of three numbers, `alloc_time free_time size`.
    PlainLog,
    /// A snapshot: its first non-blank byte is pickle's PROTO.
    Pickle,
    /// A snapshot: its first non-blank byte opens JSON (`{`, `[`).
    Json,
    /// A snapshot: it starts with a msgpack map.
    Msgpack,
    /// None of these ([`describe`] says what it looks like).
    Other,
}

/// How many first bytes [`kind`] and [`describe`] look at.
pub const HEAD: usize = 4096;

/// What bytes starting with `head` are.
pub fn kind(head: &[u8]) -> Kind {
    if head.starts_with(cushim::trace::log::format::MAGIC) {
        return Kind::Log;
    }
    if let Some(c) = compression(head) {
        return Kind::Compressed(c);
    }
    if head.iter().all(|b| b.is_ascii_whitespace()) {
        return Kind::Empty;
    }
    if let Some(line) = first_text_line(head) {
        if line.to_ascii_lowercase().starts_with("thread,time,action") {
            return Kind::RmmCsv;
        }
        if is_plain_log_line(line) {
            return Kind::PlainLog;
        }
    }
    match snapshot_format(head) {
        Format::Pickle => Kind::Pickle,
        Format::Json => Kind::Json,
        Format::Msgpack if starts_msgpack_map(head) => Kind::Msgpack,
        Format::Msgpack => Kind::Other,
    }
}

/// The first [`HEAD`] bytes of the file at `path` (fewer when it is shorter).
pub fn file_head(path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut head = Vec::with_capacity(HEAD);
    f.take(HEAD as u64)
        .read_to_end(&mut head)
        .map_err(|e| e.to_string())?;
    Ok(head)
}

/// What the file at `path` is, by its first bytes (not decompressed).
pub fn file_kind(path: &Path) -> Result<Kind, String> {
    file_head(path).map(|h| kind(&h))
}

/// Whether the file at `path` is a whole-run log (an unreadable file is not).
pub fn is_log_file(path: &Path) -> bool {
    file_kind(path).is_ok_and(|k| k == Kind::Log)
}

/// The snapshot format of bytes, by their first non-blank byte: pickle's PROTO, JSON's
/// bracket, else msgpack (the fallback; [`starts_msgpack_map`] tells whether it can be).
pub fn snapshot_format(bytes: &[u8]) -> Format {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    match first {
        Some(0x80) => Format::Pickle,
        Some(b'{') | Some(b'[') => Format::Json,
        _ => Format::Msgpack,
    }
}

/// The first non-blank, non-comment line, if the bytes start as text.
pub fn first_text_line(bytes: &[u8]) -> Option<&str> {
    let head = &bytes[..bytes.len().min(HEAD)];
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
    };
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
}

/// Whether `l` is a line of a plain `alloc_time free_time size` log.
fn is_plain_log_line(l: &str) -> bool {
    let f: Vec<&str> = l.split_whitespace().collect();
    f.len() == 3 && f.iter().all(|x| x.parse::<f64>().is_ok())
}

/// Whether the first byte of `bytes` can start a msgpack snapshot (a map).
pub fn starts_msgpack_map(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(0x81..=0x8f | 0xde | 0xdf))
}

/// What bytes that are not a snapshot look like, in a few words.
pub fn describe(bytes: &[u8]) -> String {
    const MAGIC: &[(&[u8], &str)] = &[
        (b"\x7fELF", "an ELF executable or library"),
        (
            b"PK\x03\x04",
            "a zip archive: torch.save writes these; a memory snapshot is the pickle \
             torch.cuda.memory._dump_snapshot writes",
        ),
        (b"\x89PNG", "a PNG image"),
        (b"%PDF", "a PDF document"),
        (b"SQLite format 3", "an SQLite database"),
        (b"\x93NUMPY", "a NumPy array file"),
    ];
    if let Some((_, what)) = MAGIC.iter().find(|(m, _)| bytes.starts_with(m)) {
        return (*what).to_string();
    }
    let head = &bytes[..bytes.len().min(4096)];
    let text = match std::str::from_utf8(head) {
        Ok(t) => Some(t),
        Err(e) if e.valid_up_to() + 4 >= head.len() && e.valid_up_to() > 0 => {
            std::str::from_utf8(&head[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    let printable = |t: &str| {
        t.chars()
            .all(|c| !c.is_control() || c.is_ascii_whitespace())
    };
    match text {
        Some(t) if printable(t) => {
            let mut lines = t.lines().map(str::trim).filter(|l| !l.is_empty());
            let line = lines.next().unwrap_or("");
            let cut: String = line.chars().take(60).collect();
            let more = if cut.len() < line.len() { "..." } else { "" };
            // CSV: the first two lines have the same number of commas (one at least).
            let commas = |l: &str| l.matches(',').count();
            let csv = commas(line) > 0 && lines.next().is_some_and(|l| commas(l) == commas(line));
            if csv {
                format!("CSV with header {cut:?}{more}, not RMM's Thread,Time,Action,... log")
            } else {
                format!("text starting {cut:?}{more}")
            }
        }
        _ => {
            let b: Vec<String> = bytes.iter().take(4).map(|b| format!("{b:02x}")).collect();
            format!("binary data starting with bytes {}", b.join(" "))
        }
    }
}

/// What a decoded top-level value that is not a snapshot dict is: `keys` are its keys
/// when it is a dict.
pub fn describe_dict(keys: &[&str]) -> String {
    if keys.contains(&"traceEvents") {
        return "a Chrome trace (a dict with traceEvents): a profiler's trace, not a memory \
                snapshot"
            .into();
    }
    let mut shown: Vec<&str> = keys.iter().take(6).copied().collect();
    if keys.len() > 6 {
        shown.push("...");
    }
    if keys.is_empty() {
        "an empty dict".into()
    } else {
        format!("a dict with keys {}", shown.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn gzip_and_zstd_are_read_through_and_plain_bytes_pass_unchanged() {
        let data = b"\x80\x04}\x94.".to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(compression(&gz), Some(Compression::Gzip));
        assert_eq!(decompress(gz).unwrap(), data);
        let zst = ruzstd::encoding::compress_to_vec(
            &data[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert_eq!(compression(&zst), Some(Compression::Zstd));
        assert_eq!(decompress(zst).unwrap(), data);
        assert_eq!(decompress(data.clone()).unwrap(), data);
        assert!(decompress(vec![0x1f, 0x8b, 1, 2]).is_err());
    }

    #[test]
    fn other_files_are_described() {
        assert!(describe(b"\x7fELF\x02\x01").contains("ELF"));
        assert!(describe(b"a,b,c\n1,2,3\n").contains("CSV with header \"a,b,c\""));
        assert!(describe(b"hello world\n").contains("text starting \"hello world\""));
        assert!(describe(&[0x00, 0xff, 0x13, 0x37, 9]).contains("00 ff 13 37"));
        assert!(describe_dict(&["traceEvents", "displayTimeUnit"]).contains("Chrome trace"));
        assert_eq!(
            describe_dict(&["name", "version"]),
            "a dict with keys name, version"
        );
        let e = not_snapshot("x");
        assert_eq!(
            name_error(Path::new("f"), &e),
            "f is not a snapshot (found x)"
        );
        assert_eq!(name_error(Path::new("f"), "bad"), "f: bad");
    }
}
