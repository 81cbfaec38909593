//! The shim's signal handlers side by side with the program's: `sigaction` and `signal` are
//! interposed so that, for the few signals the shim handles, the program keeps its own
//! disposition exactly as if the shim were absent.
//!
//! Policy: for a signal the shim handles (the dump signal, and the ending signals TERM, INT,
//! HUP and QUIT when a snapshot is armed), the kernel always runs [`on_signal`]; what the
//! program asked for (before the shim armed the signal, or after, through `sigaction` or
//! `signal`) is kept here and is what `sigaction` reports back to it. The kernel action we
//! install carries the program's mask and its `SA_RESTART`/`SA_NODEFER`/`SA_ONSTACK`, so
//! its handler runs under the conditions it asked for; `SA_RESETHAND` is emulated here.
//! On delivery the shim's part runs first (only async-signal-safe work: a byte written to a
//! pipe, see `dump.rs` and `ending.rs`), then the program's disposition: its handler is
//! called; `SIG_IGN` ignores; `SIG_DFL` is what the shim's part decides (the dump signal:
//! nothing; an ending signal: the exit snapshot is written on the ending thread, which then
//! restores `SIG_DFL` and raises the signal again, so the program ends exactly as without
//! the shim). Signals the shim does not handle go straight to libc.
//!
//! Why interpose rather than only chain to the handler found at arming time: a program (or
//! Python, or a launcher's library) that installs its handler after the shim armed the
//! signal would otherwise silently remove the shim's, and the snapshot would be lost.
//!
//! Invariant: each slot's lock is taken only with every signal blocked on the taking thread,
//! and the handler takes it too, so neither can interrupt the other on one thread.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use once_cell::sync::OnceCell;

/// What the shim does with a signal before the program's disposition.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Role {
    /// Not handled: `sigaction` passes straight to libc.
    None = 0,
    /// The live-dump signal: a dump request; `SIG_DFL`/`SIG_IGN` then do nothing.
    Dump = 1,
    /// An ending signal: with `SIG_DFL`, the exit snapshot and then the default action.
    End = 2,
    /// A crash (SEGV, BUS, ABRT): the event log's queue is written out first; with
    /// `SIG_DFL`, the default action follows (the faulting instruction runs again, or a
    /// signal sent by a process is raised again).
    Fatal = 3,
    /// The sleep-request signal (`cushim pause`/`resume`): wakes the request thread;
    /// `SIG_DFL`/`SIG_IGN` then do nothing.
    Sleep = 4,
}

/// What each role does on delivery (index: the role), registered by the module that arms
/// signals with that role, before it arms them ([`on`]). Read in the handler: one atomic
/// load each, async-signal safe.
static HANDLERS: [OnceCell<fn(c_int)>; 5] = [const { OnceCell::new() }; 5];

/// Register what `role` does on delivery (the dump request, the ending request, the log's
/// flush); only async-signal-safe work. Once per role; later calls are ignored.
pub fn on(role: Role, handler: fn(c_int)) {
    let _ = HANDLERS[role as usize].set(handler);
}

/// Run `role`'s part for `sig`, if registered.
fn run(role: Role, sig: c_int) {
    if let Some(h) = HANDLERS[role as usize].get() {
        h(sig);
    }
}

/// The crash signals whose last events the log keeps.
pub const FATAL: [c_int; 3] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT];

/// Arm the crash signals (when the event log is on).
pub fn arm_fatal() {
    for sig in FATAL {
        if let Err(e) = arm(sig, Role::Fatal) {
            eprintln!("cushim: the event log will not be flushed on signal {sig}: {e}");
        }
    }
}

struct Slot {
    role: AtomicU8,
    lock: AtomicBool,
    /// What the program asked for (guarded by `lock`).
    prog: UnsafeCell<libc::sigaction>,
}

// SAFETY: `prog` is only read or written under `lock` (module invariant).
unsafe impl Sync for Slot {}

const NSIG: usize = 65;

static SLOTS: [Slot; NSIG] = [const {
    Slot {
        role: AtomicU8::new(0),
        lock: AtomicBool::new(false),
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags and an empty mask.
        prog: UnsafeCell::new(unsafe { std::mem::zeroed() }),
    }
}; NSIG];

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;

static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);
static REAL_SIGNAL: AtomicUsize = AtomicUsize::new(0);

fn resolve(cache: &AtomicUsize, name: &CStr) -> usize {
    let p = cache.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    cache.store(p, Ordering::Release);
    p
}

/// libc's `sigaction`, bypassing the interposer.
///
/// # Safety
/// As `sigaction(2)`: `act` and `old` are NULL or valid.
pub unsafe fn real_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let p = resolve(&REAL_SIGACTION, c"sigaction");
    if p == 0 {
        // SAFETY: errno is thread-local and always writable.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: `p` is libc's sigaction, whose type is `SigactionFn`.
    let f: SigactionFn = unsafe { std::mem::transmute::<usize, SigactionFn>(p) };
    // SAFETY: the caller's pointers, as sigaction(2) takes them.
    unsafe { f(sig, act, old) }
}

fn slot(sig: c_int) -> Option<&'static Slot> {
    usize::try_from(sig).ok().and_then(|i| SLOTS.get(i))
}

/// Blocks every signal on this thread and holds a slot's lock; both undone on drop.
struct Locked {
    slot: &'static Slot,
    mask: libc::sigset_t,
}

impl Locked {
    fn take(slot: &'static Slot) -> Locked {
        let mask = cushim::quiet_thread::block_all_signals();
        Locked::spin(slot);
        Locked { slot, mask }
    }

    fn spin(slot: &Slot) {
        while slot
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    fn prog(&mut self) -> &mut libc::sigaction {
        // SAFETY: we hold the slot's lock (module invariant), and the reference does not
        // outlive `self`.
        unsafe { &mut *self.slot.prog.get() }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        self.slot.lock.store(false, Ordering::Release);
        cushim::quiet_thread::restore_signals(&self.mask);
    }
}

/// The kernel action that runs [`on_signal`] with the program's mask and flags.
fn kernel_action(prog: &libc::sigaction) -> libc::sigaction {
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_signal as *const () as usize;
    act.sa_mask = prog.sa_mask;
    act.sa_flags = libc::SA_SIGINFO
        | (prog.sa_flags & (libc::SA_RESTART | libc::SA_NODEFER | libc::SA_ONSTACK));
    // A program that does not handle the signal never sees a system call interrupted by
    // it (ignored, or killed by it): the shim's part must not make its reads fail with
    // EINTR either (a `cushim pause` request would otherwise end a program blocked in
    // `fgets`).
    if prog.sa_sigaction == libc::SIG_DFL || prog.sa_sigaction == libc::SIG_IGN {
        act.sa_flags |= libc::SA_RESTART;
    }
    act
}

/// Handle `sig` with `role` from now on. The program's current disposition is kept and runs
/// after the shim's part. Fails when libc's `sigaction` does.
pub fn arm(sig: c_int, role: Role) -> Result<(), String> {
    let s = slot(sig).ok_or_else(|| format!("signal {sig} out of range"))?;
    let mut held = Locked::take(s);
    if s.role.load(Ordering::Acquire) != Role::None as u8 {
        s.role.store(role as u8, Ordering::Release);
        return Ok(());
    }
    // SAFETY: reading the current action into the slot we hold.
    if unsafe { real_sigaction(sig, std::ptr::null(), held.prog()) } != 0 {
        return Err(format!(
            "sigaction({sig}): {}",
            std::io::Error::last_os_error()
        ));
    }
    let act = kernel_action(held.prog());
    s.role.store(role as u8, Ordering::Release);
    // SAFETY: a fully initialised action for a catchable signal.
    if unsafe { real_sigaction(sig, &act, std::ptr::null_mut()) } != 0 {
        s.role.store(Role::None as u8, Ordering::Release);
        return Err(format!(
            "sigaction({sig}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Put the program's disposition back in the kernel and stop handling `sig` (before the
/// shim re-raises an ending signal: the signal then does what the program asked for).
pub fn disarm(sig: c_int) {
    let Some(s) = slot(sig) else { return };
    let mut held = Locked::take(s);
    if s.role.swap(Role::None as u8, Ordering::AcqRel) == Role::None as u8 {
        return;
    }
    let prog = *held.prog();
    // SAFETY: restoring the action the program asked for.
    unsafe { real_sigaction(sig, &prog, std::ptr::null_mut()) };
}

/// What the program's disposition for a signal is, as seen when it was delivered.
enum Disposition {
    Default,
    Ignore,
    Handler { addr: usize, siginfo: bool },
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: errno is thread-local; saved and restored around everything below.
    let errno = unsafe { *libc::__errno_location() };
    let Some(s) = slot(sig) else { return };
    let role = s.role.load(Ordering::Acquire);
    // The request first, so that an ending signal arriving in this handler finds it.
    if role == Role::Dump as u8 {
        run(Role::Dump, sig);
    }
    if role == Role::Sleep as u8 {
        run(Role::Sleep, sig);
    }
    let disposition = {
        // With every signal blocked while the lock is held (as everywhere), a nested
        // delivery (SA_NODEFER) never spins on a lock its own thread holds.
        let mut held = Locked::take(s);
        let prog = held.prog();
        let h = prog.sa_sigaction;
        let d = if h == libc::SIG_DFL {
            Disposition::Default
        } else if h == libc::SIG_IGN {
            Disposition::Ignore
        } else {
            Disposition::Handler {
                addr: h,
                siginfo: prog.sa_flags & libc::SA_SIGINFO != 0,
            }
        };
        if prog.sa_flags & libc::SA_RESETHAND as c_int != 0 {
            prog.sa_sigaction = libc::SIG_DFL;
            prog.sa_flags &= !(libc::SA_RESETHAND as c_int);
        }
        d
    };
    if role == Role::Fatal as u8 {
        run(Role::Fatal, sig);
    }
    match disposition {
        Disposition::Handler { addr, siginfo } => {
            // SAFETY: the program installed this function for this signal with these flags;
            // calling it is what the kernel would have done.
            unsafe {
                if siginfo {
                    let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                        std::mem::transmute(addr);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(c_int) = std::mem::transmute(addr);
                    f(sig);
                }
            }
        }
        Disposition::Default if role == Role::End as u8 => run(Role::End, sig),
        Disposition::Default if role == Role::Fatal as u8 => {
            disarm(sig);
            // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
            let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
            if sent {
                // Sent by a process (or raise/abort): raise it again; it is delivered, with
                // the default action, when this handler returns.
                // SAFETY: raise(3) is async-signal safe.
                unsafe { libc::raise(sig) };
            }
        }
        _ => {}
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The interposed `sigaction`.
#[no_mangle]
pub extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let handled = slot(sig).filter(|s| s.role.load(Ordering::Acquire) != Role::None as u8);
    let Some(s) = handled else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real_sigaction(sig, act, old) };
    };
    let mut held = Locked::take(s);
    if !old.is_null() {
        // SAFETY: the caller passed a valid out-pointer (sigaction's contract).
        unsafe { *old = *held.prog() };
    }
    if !act.is_null() {
        // SAFETY: the caller passed a valid action (sigaction's contract).
        let new = unsafe { *act };
        *held.prog() = new;
        if s.role.load(Ordering::Acquire) != Role::None as u8 {
            let k = kernel_action(&new);
            // SAFETY: a fully initialised action for a signal the shim handles.
            unsafe { real_sigaction(sig, &k, std::ptr::null_mut()) };
        } else {
            // Disarmed meanwhile: the program's action goes to the kernel as is.
            // SAFETY: the caller's action.
            return unsafe { real_sigaction(sig, act, std::ptr::null_mut()) };
        }
    }
    0
}

/// The interposed `signal` (glibc's BSD semantics: `SA_RESTART`, the signal blocked in its
/// handler).
#[no_mangle]
pub extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let handled = slot(sig).is_some_and(|s| s.role.load(Ordering::Acquire) != Role::None as u8);
    if !handled {
        let p = resolve(&REAL_SIGNAL, c"signal");
        if p == 0 {
            return libc::SIG_ERR;
        }
        // SAFETY: `p` is libc's `signal`, whose type is `SignalFn`.
        let f: SignalFn = unsafe { std::mem::transmute::<usize, SignalFn>(p) };
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { f(sig, handler) };
    }
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    if sigaction(sig, &act, &mut old) != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// `bsd_signal` is `signal` under another name.
#[no_mangle]
pub extern "C" fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    signal(sig, handler)
}
