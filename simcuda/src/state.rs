//! Process state: configuration, devices (heap, ledger, primary context, streams), driver
//! initialisation and the per-thread current context. Invariant: `State` is created once and
//! never moves, so a `CUcontext` is the stable address of its device's `Ctx`; a thread's
//! current context is a device ordinal + 1 (0 = none).

use crate::config::Config;
use crate::error::*;
use crate::memory::Heap;
use crate::stream::Stream;
use once_cell::sync::{Lazy, OnceCell};
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Current and peak bytes with live object counts, all lock-free so the exit report never
/// waits on a lock.
#[derive(Default)]
pub struct Ledger {
    pub capacity: u64,
    pub in_use: AtomicU64,
    pub peak: AtomicU64,
    pub live_allocations: AtomicU64,
    pub live_physical_handles: AtomicU64,
    pub live_reservations: AtomicU64,
    /// The device this ledger is shared as, between processes, under `SIMCUDA_SHARED=1`
    /// (see `shared`); `None`: this process's own capacity.
    pub shared_device: Option<usize>,
}

impl Ledger {
    fn new(capacity: u64, ordinal: usize) -> Ledger {
        let shared = crate::shared::SHARED.is_some() && ordinal < crate::shared::MAX_DEVICES;
        Ledger {
            capacity,
            shared_device: shared.then_some(ordinal),
            ..Ledger::default()
        }
    }

    /// Take `bytes` of capacity, or fail without changing anything.
    pub fn try_charge(&self, bytes: u64) -> bool {
        if let (Some(dev), Some(sh)) = (self.shared_device, crate::shared::SHARED.as_ref()) {
            if !sh.try_charge(dev, bytes, self.capacity) {
                return false;
            }
            let prev = self.in_use.fetch_add(bytes, Ordering::AcqRel);
            self.peak.fetch_max(prev + bytes, Ordering::AcqRel);
            return true;
        }
        let ok = self
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(bytes).filter(|n| *n <= self.capacity)
            });
        match ok {
            Ok(prev) => {
                self.peak.fetch_max(prev + bytes, Ordering::AcqRel);
                true
            }
            Err(_) => false,
        }
    }

    /// Give back `bytes` taken by `try_charge`.
    pub fn release(&self, bytes: u64) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
        if let (Some(dev), Some(sh)) = (self.shared_device, crate::shared::SHARED.as_ref()) {
            sh.release(dev, bytes);
        }
    }

    /// Bytes still free (on a shared device: what no live process holds).
    pub fn free(&self) -> u64 {
        if let (Some(dev), Some(sh)) = (self.shared_device, crate::shared::SHARED.as_ref()) {
            return self.capacity.saturating_sub(sh.used(dev));
        }
        self.capacity
            .saturating_sub(self.in_use.load(Ordering::Acquire))
    }
}

/// A context handle's target: a device's primary context.
pub struct Ctx {
    pub device: usize,
}

/// One simulated GPU.
pub struct Device {
    pub ordinal: usize,
    pub heap: Mutex<Heap>,
    pub ledger: Ledger,
    pub ctx: Box<Ctx>,
    pub primary_refs: AtomicU32,
    /// The runtime retained the primary context already.
    pub runtime_retained: AtomicBool,
    /// Work items queued on any stream of this device and not yet completed.
    pub pending: AtomicU64,
    pub legacy: OnceCell<Arc<Stream>>,
    /// Every stream of this device whose worker is still running.
    pub streams: Mutex<Vec<Arc<Stream>>>,
}

/// The process state.
pub struct State {
    pub config: Config,
    pub devices: Vec<Device>,
}

static STATE: Lazy<Result<State, CUresult>> = Lazy::new(|| {
    let config = Config::from_env();
    let mut devices = Vec::with_capacity(config.devices);
    for ordinal in 0..config.devices {
        let heap = Heap::new(config.mem_bytes).map_err(|e| {
            eprintln!("simcuda: reserving device {ordinal} memory: {e}");
            OUT_OF_MEMORY
        })?;
        devices.push(Device {
            ordinal,
            heap: Mutex::new(heap),
            ledger: Ledger::new(config.mem_bytes, ordinal),
            ctx: Box::new(Ctx { device: ordinal }),
            primary_refs: AtomicU32::new(0),
            runtime_retained: AtomicBool::new(false),
            pending: AtomicU64::new(0),
            legacy: OnceCell::new(),
            streams: Mutex::new(Vec::new()),
        });
    }
    Ok(State { config, devices })
});

static INITIALIZED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static RUNTIME_DEVICE: Cell<usize> = const { Cell::new(0) };
    /// The first [`STACK_SLOTS`] pushed contexts: plain values without a destructor, so
    /// they answer from exit handlers and thread-exit destructors, as a driver does.
    static CTX_STACK: Cell<[usize; STACK_SLOTS]> = const { Cell::new([0; STACK_SLOTS]) };
    static CTX_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Deeper pushes (a destructor-bearing Vec, reached with `try_with`).
    static CTX_SPILL: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Context stack entries kept in destructor-free thread-local storage.
const STACK_SLOTS: usize = 32;

/// `cuCtxPushCurrent_v2`: make `ctx` current, remembering the previous one.
///
/// Policy: every per-thread value here lives in thread-local storage without a destructor
/// (plain `Cell`s), so every entry point answers from exit handlers and thread-exit
/// destructors; only a push deeper than [`STACK_SLOTS`] needs storage the C library may
/// already have destroyed, and then fails with `CUDA_ERROR_OUT_OF_MEMORY` instead of
/// panicking.
pub fn push_current(ctx: *mut Ctx) -> Result<(), CUresult> {
    if ctx.is_null() {
        return Err(INVALID_CONTEXT);
    }
    let prev = CURRENT.with(Cell::get);
    set_current(ctx)?;
    let depth = CTX_DEPTH.with(Cell::get);
    if depth < STACK_SLOTS {
        CTX_STACK.with(|s| {
            let mut a = s.get();
            a[depth] = prev;
            s.set(a);
        });
    } else if CTX_SPILL.try_with(|s| s.borrow_mut().push(prev)).is_err() {
        CURRENT.with(|c| c.set(prev));
        return Err(OUT_OF_MEMORY);
    }
    CTX_DEPTH.with(|d| d.set(depth + 1));
    Ok(())
}

/// The context pushed over by the last push (0 when none).
fn pop_pushed() -> usize {
    let depth = CTX_DEPTH.with(Cell::get);
    if depth == 0 {
        return 0;
    }
    CTX_DEPTH.with(|d| d.set(depth - 1));
    if depth - 1 < STACK_SLOTS {
        CTX_STACK.with(|s| s.get()[depth - 1])
    } else {
        CTX_SPILL
            .try_with(|s| s.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}

/// `cuCtxPopCurrent_v2`: the current context, replaced by the one pushed over.
pub fn pop_current() -> Result<*mut Ctx, CUresult> {
    let cur = current_ctx()?;
    if cur.is_null() {
        return Err(INVALID_CONTEXT);
    }
    let prev = pop_pushed();
    CURRENT.with(|c| c.set(prev));
    Ok(cur)
}

/// The process state, created on first use.
pub fn state() -> Result<&'static State, CUresult> {
    STATE.as_ref().map_err(|e| *e)
}

/// The state, if it was ever created (for the exit report).
pub fn state_if_created() -> Option<&'static State> {
    Lazy::get(&STATE).and_then(|s| s.as_ref().ok())
}

/// Device `ordinal`.
pub fn device(ordinal: usize) -> Result<&'static Device, CUresult> {
    state()?.devices.get(ordinal).ok_or(INVALID_DEVICE)
}

/// `cuInit`.
pub fn init(flags: u32) -> Result<(), CUresult> {
    if flags != 0 {
        return Err(INVALID_VALUE);
    }
    let st = state()?;
    if st.devices.is_empty() {
        return Err(NO_DEVICE);
    }
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// The state, once `cuInit` (or the runtime) initialised the driver.
pub fn initialized() -> Result<&'static State, CUresult> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(NOT_INITIALIZED);
    }
    state()
}

/// A device ordinal the driver accepts.
pub fn driver_device(dev: i32) -> Result<&'static Device, CUresult> {
    let st = initialized()?;
    usize::try_from(dev)
        .ok()
        .and_then(|d| st.devices.get(d))
        .ok_or(INVALID_DEVICE)
}

/// The device of the calling thread's current context (driver rules).
pub fn current_device() -> Result<&'static Device, CUresult> {
    let st = initialized()?;
    match CURRENT.with(Cell::get) {
        0 => Err(INVALID_CONTEXT),
        n => st.devices.get(n - 1).ok_or(INVALID_CONTEXT),
    }
}

/// The current context handle, or NULL.
pub fn current_ctx() -> Result<*mut Ctx, CUresult> {
    let st = initialized()?;
    Ok(match CURRENT.with(Cell::get) {
        0 => std::ptr::null_mut(),
        n => st
            .devices
            .get(n - 1)
            .map_or(std::ptr::null_mut(), ctx_handle),
    })
}

/// The handle of a device's primary context.
pub fn ctx_handle(d: &Device) -> *mut Ctx {
    &*d.ctx as *const Ctx as *mut Ctx
}

/// `cuCtxSetCurrent`: NULL unbinds; anything but a primary context handle is invalid.
pub fn set_current(ctx: *mut Ctx) -> Result<(), CUresult> {
    let st = initialized()?;
    if ctx.is_null() {
        CURRENT.with(|c| c.set(0));
        return Ok(());
    }
    let d = st
        .devices
        .iter()
        .find(|d| ctx_handle(d) == ctx)
        .ok_or(INVALID_CONTEXT)?;
    CURRENT.with(|c| c.set(d.ordinal + 1));
    Ok(())
}

/// The runtime's device for this thread: the current context's device, else the thread's
/// runtime device, whose primary context is retained (once) and made current, as cudart does.
pub fn runtime_device() -> Result<&'static Device, CUresult> {
    let st = state()?;
    if st.devices.is_empty() {
        return Err(NO_DEVICE);
    }
    INITIALIZED.store(true, Ordering::Release);
    let cur = CURRENT.with(Cell::get);
    if cur != 0 {
        return st.devices.get(cur - 1).ok_or(INVALID_CONTEXT);
    }
    let d = st
        .devices
        .get(RUNTIME_DEVICE.with(Cell::get))
        .ok_or(INVALID_DEVICE)?;
    activate(d);
    Ok(d)
}

fn activate(d: &Device) {
    if !d.runtime_retained.swap(true, Ordering::AcqRel) {
        d.primary_refs.fetch_add(1, Ordering::AcqRel);
    }
    CURRENT.with(|c| c.set(d.ordinal + 1));
}

/// `cudaSetDevice`.
pub fn runtime_set_device(dev: i32) -> Result<(), CUresult> {
    let st = state()?;
    if st.devices.is_empty() {
        return Err(NO_DEVICE);
    }
    let d = usize::try_from(dev)
        .ok()
        .and_then(|i| st.devices.get(i))
        .ok_or(INVALID_DEVICE)?;
    INITIALIZED.store(true, Ordering::Release);
    RUNTIME_DEVICE.with(|r| r.set(d.ordinal));
    activate(d);
    Ok(())
}

/// Number of devices.
pub fn device_count() -> Result<usize, CUresult> {
    Ok(state()?.devices.len())
}
