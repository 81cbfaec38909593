//! Streams: each runs its queued work in order on its own worker thread. Ordering rules as in
//! CUDA: work on the legacy default stream first waits for all earlier work on the device's
//! blocking streams (which includes per-thread default streams), and work on a blocking stream
//! first waits for earlier legacy work; non-blocking streams (flag 1) wait for nothing.
//! Invariant: an item only depends on items submitted before it, so waits never cycle;
//! `completed` only grows; `Device::pending` counts queued-but-unfinished items.

use crate::capture::Capture;
use crate::error::*;
use crate::state::{device, Device};
use once_cell::sync::Lazy;
use parking_lot::{Condvar, Mutex};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `cudaStreamNonBlocking` / `CU_STREAM_NON_BLOCKING`.
pub const NON_BLOCKING: u32 = 1;
/// `CU_STREAM_LEGACY` / `cudaStreamLegacy`.
pub const LEGACY_HANDLE: usize = 1;
/// `CU_STREAM_PER_THREAD` / `cudaStreamPerThread`.
pub const PER_THREAD_HANDLE: usize = 2;

/// Work run on a stream's worker.
pub type Job = Box<dyn FnOnce() + Send>;

/// What kind of stream this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Legacy,
    PerThread,
    User,
}

struct Item {
    seq: u64,
    deps: Vec<(Arc<Stream>, u64)>,
    job: Option<Job>,
}

pub(crate) struct Inner {
    queue: VecDeque<Item>,
    submitted: u64,
    completed: u64,
    closing: bool,
    pub(crate) capture: Option<Capture>,
}

/// One stream.
pub struct Stream {
    pub device: usize,
    pub flags: u32,
    pub priority: i32,
    pub kind: Kind,
    pub(crate) inner: Mutex<Inner>,
    work: Condvar,
    progress: Condvar,
}

/// User stream handles (their `Arc` addresses) to streams.
static HANDLES: Lazy<Mutex<HashMap<usize, Arc<Stream>>>> = Lazy::new(|| Mutex::new(HashMap::new()));

impl Stream {
    fn spawn(d: &Device, flags: u32, priority: i32, kind: Kind) -> Result<Arc<Stream>, CUresult> {
        let s = Arc::new(Stream {
            device: d.ordinal,
            flags,
            priority,
            kind,
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                submitted: 0,
                completed: 0,
                closing: false,
                capture: None,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let worker = Arc::clone(&s);
        std::thread::Builder::new()
            .name(format!("simcuda-stream-{}", d.ordinal))
            .spawn(move || worker.run())
            .map_err(|e| {
                eprintln!("simcuda: starting a stream worker: {e}");
                OUT_OF_MEMORY
            })?;
        d.streams.lock().push(Arc::clone(&s));
        Ok(s)
    }

    fn run(self: Arc<Self>) {
        loop {
            let item = {
                let mut g = self.inner.lock();
                loop {
                    if let Some(it) = g.queue.pop_front() {
                        break it;
                    }
                    if g.closing {
                        drop(g);
                        if let Ok(d) = device(self.device) {
                            d.streams.lock().retain(|s| !Arc::ptr_eq(s, &self));
                        }
                        return;
                    }
                    self.work.wait(&mut g);
                }
            };
            for (s, n) in &item.deps {
                s.wait_for(*n);
            }
            if let Some(job) = item.job {
                job();
            }
            self.inner.lock().completed = item.seq;
            self.progress.notify_all();
            if let Ok(d) = device(self.device) {
                d.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Whether work on this stream synchronises with the legacy stream.
    pub fn is_blocking(&self) -> bool {
        self.kind != Kind::Legacy && self.flags & NON_BLOCKING == 0
    }

    /// (submitted, completed).
    pub fn position(&self) -> (u64, u64) {
        let g = self.inner.lock();
        (g.submitted, g.completed)
    }

    /// Block until item `seq` completed.
    pub fn wait_for(&self, seq: u64) {
        let mut g = self.inner.lock();
        while g.completed < seq {
            self.progress.wait(&mut g);
        }
    }

    /// Block until everything submitted so far completed.
    pub fn wait_all(&self) {
        let (sub, _) = self.position();
        self.wait_for(sub);
    }

    /// Queue `job` (or a marker, for events); returns its sequence number, or 0 when the
    /// stream is capturing and the work went into the capture instead.
    pub fn enqueue(self: &Arc<Self>, job: Option<Job>) -> Result<u64, CUresult> {
        self.enqueue_after(job, None)
    }

    /// `enqueue`, also waiting for item `after.1` of stream `after.0` (cuStreamWaitEvent).
    pub fn enqueue_after(
        self: &Arc<Self>,
        job: Option<Job>,
        after: Option<(Arc<Stream>, u64)>,
    ) -> Result<u64, CUresult> {
        {
            let mut g = self.inner.lock();
            if let Some(c) = g.capture.as_mut() {
                if c.invalidated {
                    return Err(STREAM_CAPTURE_INVALIDATED);
                }
                c.nodes += 1;
                return Ok(0);
            }
        }
        let d = device(self.device)?;
        let mut deps: Vec<(Arc<Stream>, u64)> = after.into_iter().collect();
        if self.kind == Kind::Legacy {
            let streams = d.streams.lock();
            for s in streams.iter().filter(|s| s.is_blocking()) {
                let mut g = s.inner.lock();
                if let Some(c) = g.capture.as_mut() {
                    c.invalidated = true;
                    return Err(STREAM_CAPTURE_IMPLICIT);
                }
                if g.submitted > g.completed {
                    deps.push((Arc::clone(s), g.submitted));
                }
            }
        } else if self.is_blocking() {
            if let Some(l) = d.legacy.get() {
                let (sub, comp) = l.position();
                if sub > comp {
                    deps.push((Arc::clone(l), sub));
                }
            }
        }
        d.pending.fetch_add(1, Ordering::AcqRel);
        let mut g = self.inner.lock();
        g.submitted += 1;
        let seq = g.submitted;
        g.queue.push_back(Item { seq, deps, job });
        drop(g);
        self.work.notify_one();
        Ok(seq)
    }

    fn close(&self) {
        self.inner.lock().closing = true;
        self.work.notify_all();
    }

    /// The C handle of this stream.
    pub fn handle(self: &Arc<Self>) -> usize {
        match self.kind {
            Kind::Legacy => 0,
            Kind::PerThread => PER_THREAD_HANDLE,
            Kind::User => Arc::as_ptr(self) as usize,
        }
    }
}

/// The legacy default stream of `d`, started on first use.
pub fn legacy(d: &Device) -> Result<Arc<Stream>, CUresult> {
    d.legacy
        .get_or_try_init(|| Stream::spawn(d, 0, 0, Kind::Legacy))
        .cloned()
}

struct PerThreadSlot(Arc<Stream>);

impl Drop for PerThreadSlot {
    fn drop(&mut self) {
        self.0.close();
    }
}

thread_local! {
    static PER_THREAD: RefCell<Vec<Option<PerThreadSlot>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's per-thread default stream on `d`. Once the thread's local storage
/// is destroyed (an exit handler, a thread-exit destructor) it is the legacy stream: work
/// queued there is ordered after everything, which is what a thread that is ending needs.
pub fn per_thread(d: &Device) -> Result<Arc<Stream>, CUresult> {
    PER_THREAD
        .try_with(|pt| per_thread_in(pt, d))
        .unwrap_or_else(|_| legacy(d))
}

fn per_thread_in(
    pt: &RefCell<Vec<Option<PerThreadSlot>>>,
    d: &Device,
) -> Result<Arc<Stream>, CUresult> {
    {
        let mut pt = pt.borrow_mut();
        if pt.len() <= d.ordinal {
            pt.resize_with(d.ordinal + 1, || None);
        }
        if let Some(slot) = &pt[d.ordinal] {
            return Ok(Arc::clone(&slot.0));
        }
        let s = Stream::spawn(d, 0, 0, Kind::PerThread)?;
        pt[d.ordinal] = Some(PerThreadSlot(Arc::clone(&s)));
        Ok(s)
    }
}

/// Create a user stream on `d`.
pub fn create(d: &Device, flags: u32, priority: i32) -> Result<usize, CUresult> {
    if flags & !NON_BLOCKING != 0 {
        return Err(INVALID_VALUE);
    }
    let s = Stream::spawn(d, flags, priority.clamp(-5, 0), Kind::User)?;
    let h = Arc::as_ptr(&s) as usize;
    HANDLES.lock().insert(h, s);
    Ok(h)
}

/// Destroy a user stream: its queued work still completes, then its worker exits.
pub fn destroy(handle: usize) -> Result<(), CUresult> {
    let s = HANDLES.lock().remove(&handle).ok_or(INVALID_HANDLE)?;
    if let Some(c) = s.inner.lock().capture.take() {
        crate::capture::forget(&c);
    }
    s.close();
    Ok(())
}

/// Resolve a C stream handle on the current device `d`; `per_thread_default` makes 0 mean
/// the per-thread stream (the `_ptsz` / `_ptds` entry points).
pub fn resolve(
    d: &Device,
    handle: usize,
    per_thread_default: bool,
) -> Result<Arc<Stream>, CUresult> {
    match handle {
        0 if per_thread_default => per_thread(d),
        0 | LEGACY_HANDLE => legacy(d),
        PER_THREAD_HANDLE => per_thread(d),
        h => HANDLES.lock().get(&h).cloned().ok_or(INVALID_HANDLE),
    }
}

/// Wait for all work queued so far on every stream of `d`.
pub fn sync_device(d: &Device) {
    if d.pending.load(Ordering::Acquire) == 0 {
        return;
    }
    let streams: Vec<Arc<Stream>> = d.streams.lock().clone();
    for s in streams {
        s.wait_all();
    }
}

/// Run `job` in order on `s` and wait for it; runs inline when the device is idle and
/// nothing captures (the result is the same, without a thread hop).
pub fn run_sync(s: &Arc<Stream>, job: Job) -> Result<(), CUresult> {
    let d = device(s.device)?;
    if d.pending.load(Ordering::Acquire) == 0 && !crate::capture::any_active() {
        job();
        return Ok(());
    }
    let seq = s.enqueue(Some(job))?;
    if seq > 0 {
        s.wait_for(seq);
    }
    Ok(())
}

/// Run a stream-ordered job on `s` without waiting.
pub fn run_async(s: &Arc<Stream>, job: Job) -> Result<(), CUresult> {
    s.enqueue(Some(job)).map(|_| ())
}

/// `cuStreamSynchronize`.
pub fn synchronize(s: &Arc<Stream>) -> Result<(), CUresult> {
    crate::capture::check_stream_sync(s)?;
    s.wait_all();
    Ok(())
}

/// `cuStreamQuery`.
pub fn query(s: &Arc<Stream>) -> Result<(), CUresult> {
    crate::capture::check_stream_sync(s)?;
    let (sub, comp) = s.position();
    if comp >= sub {
        Ok(())
    } else {
        Err(NOT_READY)
    }
}

/// A host function queued in stream order.
pub fn host_func(
    s: &Arc<Stream>,
    f: Option<unsafe extern "C" fn(*mut libc::c_void)>,
    data: *mut libc::c_void,
) -> Result<(), CUresult> {
    let f = f.ok_or(INVALID_VALUE)?;
    let data = data as usize;
    run_async(
        s,
        Box::new(move || {
            // SAFETY: the program gave us this function and argument to call once in stream
            // order, which is what CUDA does with them.
            unsafe { f(data as *mut libc::c_void) }
        }),
    )
}
