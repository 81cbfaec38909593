//! `SIMCUDA_SHARED=1`: processes on one machine share each simulated device's capacity, as
//! processes share a real GPU. The ledger is a small file in `/dev/shm` (one per user, and per
//! `SIMCUDA_SHARED_KEY` when set, so tests running side by side do not share one GPU), mapped
//! `MAP_SHARED`: a table of per-process entries, each the owner's pid, its start time and the
//! bytes it holds on each device.
//!
//! Invariants: an entry is only ever written by its owner, under an exclusive `flock` of the
//! file (which the kernel drops when a process dies, so a process killed mid-call never
//! leaves the ledger locked); a charge succeeds only if the bytes of every live entry plus the
//! new ones fit the capacity. Why entries and not one counter: a process killed mid-call
//! (or one that never reaches its exit handlers) would leave its bytes charged for ever; an
//! entry whose process is gone (no such pid, a zombie, or a pid reused by a younger process)
//! counts nothing and is cleared by whoever notices. Liveness is checked only when a charge
//! would fail and when the free memory is asked for, so a charge that fits costs one lock.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Devices a ledger entry has room for (devices beyond it are not shared).
pub const MAX_DEVICES: usize = 16;
/// Processes the ledger has room for.
const SLOTS: usize = 256;
const MAGIC: u64 = 0x5349_4d43_5544_4131; // "SIMCUDA1"

#[repr(C)]
struct Entry {
    pid: AtomicU64,
    start: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
struct Table {
    magic: AtomicU64,
    entries: [Entry; SLOTS],
}

/// This process's view of the shared ledger.
pub struct Shared {
    file: File,
    table: &'static Table,
}

/// The shared ledger, when `SIMCUDA_SHARED=1` and it could be opened (an error is reported
/// once on stderr and the process falls back to its own capacity).
pub fn open_from_env() -> Option<Shared> {
    if !std::env::var("SIMCUDA_SHARED").is_ok_and(|v| v.trim() == "1") {
        return None;
    }
    let path = path();
    match open(&path) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!(
                "simcuda: SIMCUDA_SHARED=1 but the ledger {} cannot be used ({e}); devices are not shared",
                path.display()
            );
            None
        }
    }
}

/// Where the ledger lives: `/dev/shm/simcuda-shared-uid<UID>[-<KEY>]`.
pub fn path() -> std::path::PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let key: String = std::env::var("SIMCUDA_SHARED_KEY")
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let name = if key.is_empty() {
        format!("simcuda-shared-uid{uid}")
    } else {
        format!("simcuda-shared-uid{uid}-{key}")
    };
    dir.join(name)
}

fn open(path: &std::path::Path) -> std::io::Result<Shared> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    let size = std::mem::size_of::<Table>();
    let s = Shared::lock_file(&file)?;
    let len = file.metadata()?.len();
    if len < size as u64 {
        file.set_len(size as u64)?;
    }
    drop(s);
    // SAFETY: a shared read-write mapping of a file at least `size` bytes long; it is never
    // unmapped, so the 'static reference stays valid; every field is an atomic.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: see above; `Table` is plain atomics, valid for any bit pattern (zero included).
    let table: &'static Table = unsafe { &*(p as *const Table) };
    let shared = Shared { file, table };
    {
        let _g = shared.lock()?;
        if table.magic.load(Ordering::Acquire) != MAGIC {
            for e in &table.entries {
                clear(e);
            }
            table.magic.store(MAGIC, Ordering::Release);
        }
    }
    Ok(shared)
}

fn clear(e: &Entry) {
    for u in &e.used {
        u.store(0, Ordering::Relaxed);
    }
    e.start.store(0, Ordering::Relaxed);
    e.pid.store(0, Ordering::Release);
}

/// Held exclusive lock of the ledger file.
struct Locked<'a>(&'a File);

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking a descriptor we own.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// (pid, start time) of this process.
fn me() -> (u64, u64) {
    let pid = std::process::id();
    (u64::from(pid), start_time(pid).unwrap_or(0))
}

/// A process's start time (clock ticks after boot, `/proc/PID/stat` field 22) and whether it
/// is a zombie; `None` when it does not exist.
fn stat(pid: u32) -> Option<(u64, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    // Field 3 is the state; the start time is field 22, so 19 fields after it.
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state == "Z" || state == "X"))
}

fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(s, _)| s)
}

/// Whether the owner of an entry still runs.
fn alive(pid: u64, start: u64) -> bool {
    let Ok(p) = u32::try_from(pid) else {
        return false;
    };
    match stat(p) {
        Some((s, zombie)) => !zombie && (start == 0 || s == start),
        None => {
            // No /proc: fall back to a signal-0 probe.
            // SAFETY: kill with signal 0 only checks that the process exists.
            let r = unsafe { libc::kill(p as libc::pid_t, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

impl Shared {
    fn lock_file(file: &File) -> std::io::Result<Locked<'_>> {
        loop {
            // SAFETY: locking a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Locked(file));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    fn lock(&self) -> std::io::Result<Locked<'_>> {
        Shared::lock_file(&self.file)
    }

    /// This process's entry, claimed if needed (under the lock).
    fn mine(&self) -> Option<&Entry> {
        let (pid, start) = me();
        let entries = &self.table.entries;
        if let Some(e) = entries.iter().find(|e| {
            e.pid.load(Ordering::Acquire) == pid && e.start.load(Ordering::Acquire) == start
        }) {
            return Some(e);
        }
        let free = entries
            .iter()
            .find(|e| e.pid.load(Ordering::Acquire) == 0)
            .or_else(|| {
                self.sweep();
                entries.iter().find(|e| e.pid.load(Ordering::Acquire) == 0)
            })?;
        clear(free);
        free.start.store(start, Ordering::Relaxed);
        free.pid.store(pid, Ordering::Release);
        Some(free)
    }

    /// Clear the entries of processes that are gone (under the lock).
    fn sweep(&self) {
        let (me_pid, me_start) = me();
        for e in &self.table.entries {
            let pid = e.pid.load(Ordering::Acquire);
            let start = e.start.load(Ordering::Acquire);
            if pid != 0 && !(pid == me_pid && start == me_start) && !alive(pid, start) {
                clear(e);
            }
        }
    }

    fn total(&self, dev: usize) -> u64 {
        self.table
            .entries
            .iter()
            .filter(|e| e.pid.load(Ordering::Acquire) != 0)
            .map(|e| e.used[dev].load(Ordering::Acquire))
            .fold(0u64, u64::saturating_add)
    }

    /// Take `bytes` on device `dev` if every live process's bytes plus these fit `capacity`.
    pub fn try_charge(&self, dev: usize, bytes: u64, capacity: u64) -> bool {
        if dev >= MAX_DEVICES {
            return true;
        }
        let Ok(_g) = self.lock() else {
            return false;
        };
        let Some(mine) = self.mine() else {
            return false;
        };
        let fits = |t: u64| t.checked_add(bytes).is_some_and(|n| n <= capacity);
        if !fits(self.total(dev)) {
            self.sweep();
            if !fits(self.total(dev)) {
                return false;
            }
        }
        mine.used[dev].fetch_add(bytes, Ordering::AcqRel);
        true
    }

    /// Give back `bytes` taken on device `dev`.
    pub fn release(&self, dev: usize, bytes: u64) {
        if dev >= MAX_DEVICES {
            return;
        }
        let Ok(_g) = self.lock() else {
            return;
        };
        if let Some(mine) = self.mine() {
            let _ = mine.used[dev].fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
        }
    }

    /// Bytes every live process holds on device `dev`.
    pub fn used(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        let Ok(_g) = self.lock() else {
            return 0;
        };
        self.sweep();
        self.total(dev)
    }
}

/// The process's shared ledger, opened at first use.
pub static SHARED: once_cell::sync::Lazy<Option<Shared>> =
    once_cell::sync::Lazy::new(open_from_env);
