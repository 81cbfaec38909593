//! `fork` safety: `pthread_atfork` handlers that leave the child a usable shim.
//!
//! Policy: before `fork` the forking thread takes, in this fixed order, every lock the
//! shim's state has: the allocator's (each device's in ordinal order, then the pinned
//! host's), the sleep-mode cache's (it takes the range-path table's under it), the
//! interned-stack table's, the DWARF unwinder's module list, the module
//! epochs' registry (`trace/module_epochs.rs`), then the observed-allocation tables' (leaf
//! locks: `alloc/observed.rs`), then the NVTX handle table, range-path table and range
//! annotations (leaf locks: `life/nvtx_handles.rs`, `trace/range.rs`, `trace/annotations.rs`). That is the
//! order the rest of the shim nests them in (a stack is captured and interned before the
//! allocator's lock is taken, and never under it, so no thread holds a later lock while
//! waiting for an earlier one). After `fork` the parent releases them unchanged, so its
//! figures are those of its own calls; the child releases them too and so inherits a
//! consistent copy of the allocator and the history that no thread is inside. The child
//! keeps the parent's cache, history and settings: its snapshots (at exit, on demand, on the
//! dump signal, to its own `%p` name) show what it inherited and what it did since. The
//! dump thread does not exist in the child, so the child starts its own when live dumps
//! are armed.
//!
//! What the child may do with CUDA is CUDA's business: CUDA documents any use of a context
//! after `fork` (before `exec`) as undefined; the shim forwards whatever reaches the driver
//! and never hangs on a lock of its own.

use std::cell::RefCell;

use cushim::alloc::observed::ObservedHold;
use cushim::alloc::ForkHold;
use cushim::trace::intern::{StackTable, TableHold};
use cushim::trace::{annotations, module_epochs, range, unwind_dwarf};

use crate::life::shim;

/// What the forking thread holds between the prepare handler and the parent's or child's.
struct Held {
    alloc: ForkHold<'static>,
    sleep: Option<cushim::sleep::arena::ForkHold<'static>>,
    stacks: TableHold<'static>,
    unwinder: unwind_dwarf::ForkHold,
    modules: module_epochs::ForkHold,
    observed: ObservedHold<'static>,
    nvtx_handles: parking_lot::MutexGuard<'static, std::collections::HashMap<usize, u32>>,
    ranges: range::ForkHold,
    annotations: annotations::ForkHold,
}

thread_local! {
    /// The prepare, parent and child handlers of one `fork` run on the forking thread.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Register the handlers (once, when the shim's state is built).
pub fn install() {
    // SAFETY: registering plain extern "C" functions with no preconditions.
    let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if rc != 0 {
        eprintln!("cushim: pthread_atfork failed ({rc}); a fork while other threads allocate may hang the child");
    }
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        let Some(s) = shim::get_if_ready() else {
            return;
        };
        // Order: allocator, sleep-mode cache, stack table, module list, module epochs, observed tables, NVTX
        // handles, range paths, range annotations (module docs).
        let held = Held {
            alloc: s.alloc.hold_for_fork(),
            sleep: crate::life::sleep::arena().map(|a| a.hold_for_fork()),
            stacks: StackTable::global().hold_for_fork(),
            unwinder: unwind_dwarf::hold_for_fork(),
            modules: module_epochs::hold_for_fork(),
            observed: s.observed.hold_for_fork(),
            nvtx_handles: crate::life::nvtx_handles::hold_for_fork(),
            ranges: range::hold_for_fork(),
            annotations: annotations::hold_for_fork(),
        };
        let _ = HELD.try_with(|h| *h.borrow_mut() = Some(held));
    });
}

fn take_held() -> Option<Held> {
    HELD.try_with(|h| h.borrow_mut().take()).ok().flatten()
}

extern "C" fn parent() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(h) = take_held() {
            release(h, false);
        }
    });
}

extern "C" fn child() {
    crate::life::forked::mark_child();
    let _ = std::panic::catch_unwind(|| {
        if let Some(h) = take_held() {
            release(h, true);
        }
        crate::life::ending::after_fork_in_child();
        crate::life::log::after_fork_in_child();
        crate::life::dump::after_fork_in_child();
        crate::life::sleep_requests::after_fork_in_child();
    });
}

/// Release in the reverse order of taking.
fn release(h: Held, in_child: bool) {
    let Held {
        alloc,
        sleep,
        stacks,
        unwinder,
        modules,
        observed,
        nvtx_handles,
        ranges,
        annotations,
    } = h;
    drop(annotations);
    drop(ranges);
    drop(nvtx_handles);
    drop(observed);
    drop(modules);
    drop(unwinder);
    drop(stacks);
    drop(sleep);
    if in_child {
        alloc.release_in_child();
    } else {
        drop(alloc);
    }
}
