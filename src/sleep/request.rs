//! Requests from outside the process (`cushim pause PID [TAG]`, `cushim resume PID [TAG]`):
//! the command writes a request file and sends [`SIGNAL`]; the shim's request thread reads
//! it, serves it and writes the answer file (the bytes paused or resumed, or the CUDA error
//! code), which the command waits for.
//!
//! Policy: the files live in a directory private to the user (`/tmp/cushim-sleep-UID`,
//! mode 0700, refused when another user owns it or others may write it), named by the target
//! pid, written to a temporary name and renamed, so a reader never sees half a request and
//! no other user can ask a process to pause. The signal is `SIGURG`, whose default action is
//! to do nothing: a process that never armed it (no shim, sleep mode off) is unharmed by it.
//! A stray `SIGURG` finds no request and changes nothing.

use std::path::{Path, PathBuf};

use super::arena::Mode;

/// The signal that tells a process a request is waiting.
pub const SIGNAL: i32 = libc::SIGURG;

/// A request: pause (with a mode) or resume a tag (`None`: every tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Pause(Option<String>, Mode),
    Resume(Option<String>),
}

/// An answer: bytes changed, or the CUDA error code.
pub type Answer = Result<u64, i32>;

/// The private directory of the current user's requests, created if missing.
pub fn dir() -> Result<PathBuf, String> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let d = std::env::temp_dir().join(format!("cushim-sleep-{uid}"));
    match std::fs::create_dir(&d) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", d.display())),
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = std::fs::symlink_metadata(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    if !m.is_dir() || m.uid() != uid {
        return Err(format!("{} is not a directory of this user", d.display()));
    }
    if m.mode() & 0o077 != 0 {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("making {} private: {e}", d.display()))?;
    }
    Ok(d)
}

/// The request file of process `pid`.
pub fn request_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.request"))
}

/// The answer file of process `pid`.
pub fn answer_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.answer"))
}

/// Write `text` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("renaming to {}: {e}", path.display()))
}

impl Request {
    /// One line: `pause TAG discard|backup` or `resume TAG`, `*` for every tag (a tag is
    /// written hex-encoded, so any bytes survive).
    pub fn to_line(&self) -> String {
        let tag = |t: &Option<String>| match t {
            None => "*".to_string(),
            Some(t) => t.bytes().map(|b| format!("{b:02x}")).collect(),
        };
        match self {
            Request::Pause(t, m) => format!("pause {} {}\n", tag(t), m.name()),
            Request::Resume(t) => format!("resume {}\n", tag(t)),
        }
    }

    /// The request of a line written by [`Request::to_line`].
    pub fn parse(line: &str) -> Option<Request> {
        let mut w = line.split_whitespace();
        let verb = w.next()?;
        let tag = match w.next()? {
            "*" => None,
            hex => {
                if hex.len() % 2 != 0 {
                    return None;
                }
                let bytes: Option<Vec<u8>> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect();
                Some(String::from_utf8(bytes?).ok()?)
            }
        };
        match (verb, w.next()) {
            ("pause", Some("discard")) => Some(Request::Pause(tag, Mode::Discard)),
            ("pause", Some("backup")) => Some(Request::Pause(tag, Mode::Backup)),
            ("resume", None) => Some(Request::Resume(tag)),
            _ => None,
        }
    }
}

/// One line: `ok BYTES` or `error CODE`.
pub fn answer_line(a: &Answer) -> String {
    match a {
        Ok(b) => format!("ok {b}\n"),
        Err(c) => format!("error {c}\n"),
    }
}

/// The answer of a line written by [`answer_line`].
pub fn parse_answer(line: &str) -> Option<Answer> {
    let mut w = line.split_whitespace();
    match (w.next()?, w.next()?) {
        ("ok", n) => n.parse().ok().map(Ok),
        ("error", c) => c.parse().ok().map(Err),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_survive_their_lines() {
        for r in [
            Request::Pause(Some("kv cache/ü".into()), Mode::Backup),
            Request::Pause(None, Mode::Discard),
            Request::Resume(Some("weights".into())),
            Request::Resume(None),
        ] {
            assert_eq!(Request::parse(&r.to_line()), Some(r));
        }
        assert_eq!(Request::parse("pause zz backup"), None);
        assert_eq!(parse_answer(&answer_line(&Ok(5))), Some(Ok(5)));
        assert_eq!(parse_answer(&answer_line(&Err(2))), Some(Err(2)));
    }
}
