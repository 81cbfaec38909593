//! libcushim.so: the LD_PRELOAD boundary of cushim.
//!
//! The C ABI lives here: exported `cuda*`/`cu*` symbols decode their arguments, call the
//! engine (`cushim` crate) and map results to CUDA error codes; `driver` implements the
//! engine's `Device` over the real driver; `life` builds the shim's state and ends it. The
//! allocator's policy is the engine's; what lives here is the policy of being an interposer
//! (what to forward, when to fail open, how to share a block with another process, how peer
//! access reaches expandable segments), each stated at the head of the folder or file that
//! carries it (`ffi/failopen.rs`, `observe/`, `ipc/`, `exports/peer.rs`). No panic crosses the
//! C boundary (`ffi::guard`).
//!
//! Folders, top to bottom, import one way only: `lookup` → `exports` → `ipc`, `observe` →
//! `life` → `per_thread`, `driver` → `real` → `ffi` (checked by `tests/tidy/tidy_layering.rs`).

// The exports are C entry points called with CUDA's pointer contracts; marking them `unsafe fn`
// would change nothing for their C callers. Each dereference sits in a small `unsafe` block
// that says why it is sound.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod driver;
pub mod exports;
pub mod ffi;
pub mod ipc;
pub mod life;
pub mod lookup;
pub mod observe;
pub mod per_thread;
pub mod real;
