//! Which layers the shim intercepts (`CUSHIM_INTERCEPT=runtime|driver|all`, default `all`)
//! and the per-thread re-entry guard.
//!
//! Invariants: the mode is read once, with `getenv` (no allocation, safe inside `dlsym`), and
//! never changes afterwards; a bad value is named in one line on stderr and the default is
//! kept; `CUSHIM_DISABLE` turns both layers off (nothing is substituted anywhere). While a
//! thread is inside the shim ([`Inside`]: a driver hook handling a call, a runtime export
//! calling into the real runtime, the shim's start-up), the driver hooks and the `dlsym` /
//! `cuGetProcAddress` substitutions on that thread pass straight to the real driver: one
//! program call is intercepted once, never twice, and the shim's own driver calls always
//! reach the real driver (the engine's go through the driver's own `cuGetProcAddress`,
//! `driver/entry.rs`, which never hands out a shim function). A runtime export's cached path touches no
//! thread-local state.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

/// An interception layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// The exported `cuda*` functions (a dynamically linked runtime).
    Runtime,
    /// The `cu*` driver hooks, also handed out by `dlsym` and `cuGetProcAddress`.
    Driver,
}

const UNREAD: u8 = 0;
const RUNTIME: u8 = 1;
const DRIVER: u8 = 2;
const ALL: u8 = RUNTIME | DRIVER;
/// Neither layer (`CUSHIM_DISABLE`): nonzero so it reads as "already read".
const OFF: u8 = 4;

static MODE: AtomicU8 = AtomicU8::new(UNREAD);

/// Parse a `CUSHIM_INTERCEPT` value; `None` when it is not one of the three words.
pub fn parse_mode(v: &[u8]) -> Option<u8> {
    match v.trim_ascii() {
        b"runtime" => Some(RUNTIME),
        b"driver" => Some(DRIVER),
        b"all" | b"" => Some(ALL),
        _ => None,
    }
}

/// The value of environment variable `name`, if set.
fn env(name: &std::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv with a NUL-terminated name; the result is read at once, before any
    // other environment call on this thread.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: a non-null getenv result is a NUL-terminated string in the environment.
    (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
}

fn read_mode() -> u8 {
    // CUSHIM_DISABLE (as `state::disabled_by_env`): a pure pass-through, nothing substituted.
    if env(c"CUSHIM_DISABLE").is_some_and(|v| !v.is_empty() && v != b"0") {
        return OFF;
    }
    let Some(v) = env(c"CUSHIM_INTERCEPT") else {
        return ALL;
    };
    parse_mode(v).unwrap_or_else(|| {
        eprintln!(
            "cushim: CUSHIM_INTERCEPT={}: expected runtime, driver or all; using all",
            String::from_utf8_lossy(v)
        );
        ALL
    })
}

#[inline]
fn mode() -> u8 {
    let m = MODE.load(Ordering::Relaxed);
    if m != UNREAD {
        return m;
    }
    mode_first()
}

#[cold]
fn mode_first() -> u8 {
    let m = read_mode();
    // Two threads may race here; both read the same environment, so either store wins.
    MODE.store(m, Ordering::Relaxed);
    m
}

/// Whether `layer` is intercepted in this process.
#[inline]
pub fn enabled(layer: Layer) -> bool {
    let bit = match layer {
        Layer::Runtime => RUNTIME,
        Layer::Driver => DRIVER,
    };
    mode() & bit != 0
}

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Marks the calling thread as inside the shim until dropped.
pub struct Inside(());

impl Inside {
    /// Enter the shim on this thread (nesting is allowed).
    pub fn enter() -> Inside {
        DEPTH.with(|d| d.set(d.get().saturating_add(1)));
        Inside(())
    }

    /// Enter the shim for a runtime export: only when the runtime layer is intercepted, so
    /// with `CUSHIM_INTERCEPT=driver` the driver hooks still see what the real runtime does.
    pub fn enter_runtime() -> Option<Inside> {
        enabled(Layer::Runtime).then(Inside::enter)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Whether the calling thread is inside a shim export.
pub fn inside() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_to_their_layers_and_garbage_is_refused() {
        assert_eq!(parse_mode(b"runtime"), Some(RUNTIME));
        assert_eq!(parse_mode(b" driver\n"), Some(DRIVER));
        assert_eq!(parse_mode(b"all"), Some(ALL));
        assert_eq!(parse_mode(b""), Some(ALL));
        assert_eq!(parse_mode(b"drivers"), None);
        assert_eq!(parse_mode(b"Runtime"), None);
    }

    #[test]
    fn inside_nests_and_unwinds() {
        assert!(!inside());
        {
            let _a = Inside::enter();
            let _b = Inside::enter();
            assert!(inside());
        }
        assert!(!inside());
    }
}
