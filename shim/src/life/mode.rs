//! The shim's mode: `CUSHIM_MODE=observe|cache` (default `cache`; what each mode does is the
//! policy at the head of `observe/mod.rs`).
//!
//! Invariants: the mode is read once with `getenv` and never changes; a bad value is named in
//! one line and `cache` kept.

use std::sync::atomic::{AtomicU8, Ordering};

const UNREAD: u8 = 0;
const CACHE: u8 = 1;
const OBSERVE: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNREAD);

/// Parse a `CUSHIM_MODE` value.
pub fn parse_mode(v: &[u8]) -> Option<bool> {
    match v.trim_ascii() {
        b"observe" => Some(true),
        b"cache" | b"" => Some(false),
        _ => None,
    }
}

#[cold]
fn read_mode() -> u8 {
    // SAFETY: getenv with a NUL-terminated name; the value is read at once.
    let p = unsafe { libc::getenv(c"CUSHIM_MODE".as_ptr()) };
    if p.is_null() {
        MODE.store(CACHE, Ordering::Relaxed);
        return CACHE;
    }
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
    let m = match parse_mode(v) {
        Some(true) => OBSERVE,
        Some(false) => CACHE,
        None => {
            eprintln!(
                "cushim: CUSHIM_MODE={}: expected cache or observe; using cache",
                String::from_utf8_lossy(v)
            );
            CACHE
        }
    };
    MODE.store(m, Ordering::Relaxed);
    m
}

/// Whether the process runs in observing mode.
#[inline]
pub fn observing() -> bool {
    let m = MODE.load(Ordering::Relaxed);
    let m = if m == UNREAD { read_mode() } else { m };
    m == OBSERVE
}

/// The mode's name, for the snapshot.
pub fn mode_name() -> &'static str {
    if observing() {
        "observe"
    } else {
        "cache"
    }
}
