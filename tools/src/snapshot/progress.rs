//! A progress line on stderr while a large file is read: `cushim: reading FILE: 45% of
//! 2.1 GB`, redrawn in place, then cleared.
//!
//! Policy: only when stderr is a terminal (a pipe or a log file gets nothing), and only
//! once the read has taken over a second (short reads print nothing); redrawn at most
//! four times a second. The count is the bytes the reader has taken from the file.

use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// A reader that reports its progress through `len` bytes of `name`.
pub struct Progress<R> {
    inner: R,
    name: String,
    len: u64,
    done: u64,
    start: Instant,
    last: Option<Instant>,
    tty: bool,
}

impl<R: Read> Progress<R> {
    pub fn new(inner: R, name: &str, len: u64) -> Self {
        Progress {
            inner,
            name: name.to_string(),
            len,
            done: 0,
            start: Instant::now(),
            last: None,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// The reader has taken `done` bytes (for input not read through this reader).
    pub fn at(&mut self, done: u64) {
        self.done = done;
        if self.tty {
            self.report();
        }
    }

    fn report(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.start) < Duration::from_secs(1)
            || self
                .last
                .is_some_and(|l| now.duration_since(l) < Duration::from_millis(250))
        {
            return;
        }
        self.last = Some(now);
        let pct = if self.len == 0 {
            100.0
        } else {
            self.done as f64 * 100.0 / self.len as f64
        };
        let _ = write!(
            std::io::stderr(),
            "\rcushim: reading {}: {pct:.0}% of {:.1} GB",
            self.name,
            self.len as f64 / 1e9
        );
    }
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        if self.tty {
            self.report();
        }
        Ok(n)
    }
}

impl<R> Drop for Progress<R> {
    fn drop(&mut self) {
        if self.last.is_some() {
            // Clear the line so the next output starts clean.
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}
