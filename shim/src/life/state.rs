//! The shim's process-wide state, built lazily on the first intercepted call.
//!
//! Invariants: initialization runs once; a call that arrives on the initializing thread while
//! it is still initializing (re-entry) sees no state and passes through to the real function;
//! when `CUSHIM_DISABLE=1`, or no driver can be initialized, every export is a pure
//! pass-through for the life of the process.
//!
//! The built value and what reads it without building it are `shim.rs` (re-exported here
//! for the exports). Start-up also registers what the modules below `life/` call back into
//! (fail open's drain, the per-thread stream note, the end of the program): each before the
//! state is published, so each finds the state whenever it would have found it by name.

use std::cell::Cell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cushim::alloc::observed::ObservedTable;
use cushim::alloc::CachingAllocator;
use cushim::config::alloc::AllocConf;
use cushim::trace::event::EventSink;

use crate::driver::device::CudaDevice;
use crate::ffi::intercept::{enabled, inside, Layer};
use crate::life::history::History;
use crate::life::shim::STATE;
pub use crate::life::shim::{alloc_device, current_device, get_if_ready, Shim};

thread_local! {
    static INITIALIZING: Cell<bool> = const { Cell::new(false) };
}

/// Whether `CUSHIM_DISABLE` asks for pure pass-through.
pub fn disabled_by_env() -> bool {
    std::env::var("CUSHIM_DISABLE").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The shim, or `None` when calls must pass through to the real functions.
#[inline]
pub fn get() -> Option<&'static Shim> {
    if let Some(s) = STATE.get() {
        return s.as_ref();
    }
    get_first()
}

/// [`get`] before the state is built: build it, unless this thread is building it.
#[cold]
fn get_first() -> Option<&'static Shim> {
    if INITIALIZING.with(|f| f.get()) {
        return None;
    }
    INITIALIZING.with(|f| f.set(true));
    // A start-up that fails inside the shim leaves a pass-through shim (fail open).
    let s = STATE.get_or_init(|| {
        std::panic::catch_unwind(init).unwrap_or_else(|_| {
            eprintln!("cushim: internal error while starting; passing every call through to CUDA");
            None
        })
    });
    INITIALIZING.with(|f| f.set(false));
    if let Some(s) = s {
        // A per-thread default stream used while the state was being published.
        crate::per_thread::apply(&s.alloc);
    }
    s.as_ref()
}

static RUNTIME_STARTED: AtomicBool = AtomicBool::new(false);

/// Policy: the shim starts the real runtime only because the program called it. A runtime
/// export the shim serves from its cache (the first `cudaMalloc`) would have initialized the
/// real runtime (primary context retained and current on the calling thread), so the first
/// such call lets the real runtime do so (`cudaFree(NULL)`, the context-init idiom), once per
/// process. A program that only loads the runtime, or only uses the driver API, gets no
/// runtime start and no context from the shim: on a GPU a primary context costs hundreds of
/// MB, and the program may work in contexts of its own. One relaxed load on the hot path.
#[inline]
pub fn start_runtime() {
    if !RUNTIME_STARTED.load(Ordering::Relaxed) {
        start_runtime_first();
    }
}

#[cold]
fn start_runtime_first() {
    if RUNTIME_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    // Observing: the program's device calls are exactly its own (the real functions it calls
    // start the runtime themselves).
    if crate::life::mode::observing() {
        return;
    }
    let null = std::ptr::null_mut();
    let _ = crate::call_real!(cudaFree(null));
}

fn init() -> Option<Shim> {
    if disabled_by_env() {
        return None;
    }
    // The shim's own start-up is never intercepted by the driver hooks when the runtime
    // layer is. It starts neither the runtime nor a context: see [`start_runtime`].
    let _inside = crate::ffi::intercept::Inside::enter_runtime();
    crate::ffi::failopen::inject(crate::ffi::failopen::Point::Init);
    crate::ffi::failopen::on_failure(drain_after_failure);
    crate::per_thread::on_first_use(tell_per_thread_use);
    let device = match CudaDevice::new() {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("cushim: {e}; passing every call through to CUDA");
            return None;
        }
    };
    let conf = AllocConf::from_env();
    let history = History::from_env();
    // Range starts and ends are kept for snapshots with history, and for the log.
    if history.conf.records_history() || crate::life::log::requested() {
        cushim::trace::annotations::enable(
            history.conf.max_entries,
            crate::life::shim::annotation_device,
        );
    }
    crate::life::sleep::start(&conf, device.clone(), &|dev| make_sink(&history, dev));
    if crate::life::sleep::on() {
        crate::life::sleep_requests::install();
    }
    let alloc = CachingAllocator::new(device, conf, &|dev| make_sink(&history, dev));
    crate::per_thread::apply(&alloc);
    let observed = ObservedTable::new(alloc.device_count(), &|dev| make_sink(&history, dev));
    let shim = Shim {
        alloc,
        history,
        observed,
    };
    crate::life::ending::on_end(end_of_program);
    crate::life::dump::install();
    crate::life::log::start(&shim);
    crate::life::fork::install();
    Some(shim)
}

/// The event sink for device `dev` (`-1`: pinned host memory), logging every event when
/// `CUSHIM_LOG` is set.
fn make_sink(history: &History, dev: i32) -> Box<dyn EventSink> {
    crate::life::log::wrap(history.ring_sink(dev))
}

/// What the ending thread does when an ending signal ends the program (registered with
/// `ending` at start-up): the snapshots owed, then the event log's end.
fn end_of_program(when: &str) {
    crate::life::dump::final_dumps(when);
    crate::life::log::finish();
}

/// After a free served by the cache while caching is off: the memory the cache no longer
/// needs goes back to CUDA, where the program's own allocations now come from (a cache
/// that kept it would leave the program less memory than without the shim). `SUCCESS`.
#[cold]
pub fn drained(s: &Shim) -> c_int {
    let _ = catch_unwind(AssertUnwindSafe(|| s.alloc.empty_cache()));
    crate::ffi::SUCCESS
}

/// After the first internal failure (registered with `ffi::failopen` at start-up): drain the
/// cache if the state is built.
fn drain_after_failure() {
    if let Some(s) = get_if_ready() {
        drained(s);
    }
}

/// A per-thread default stream was used for the first time (registered with `per_thread` at
/// start-up): tell the allocator if the state is built.
fn tell_per_thread_use() {
    if let Some(s) = get_if_ready() {
        s.alloc.per_thread_streams_used();
    }
}

/// The shim for a runtime export, or `None` when the call must pass through (runtime layer
/// not intercepted, shim disabled or not initializable).
#[inline]
pub fn runtime_state() -> Option<&'static Shim> {
    if !enabled(Layer::Runtime) {
        return None;
    }
    let s = get()?;
    start_runtime();
    Some(s)
}

/// The shim for a driver hook, or `None` when the call must pass through (driver layer not
/// intercepted, called from inside the shim, shim disabled or not initializable).
pub fn driver_state() -> Option<&'static Shim> {
    if !enabled(Layer::Driver) || inside() {
        return None;
    }
    get()
}
