//! Allocation history: events, the bounded ring, native and Python stacks (capture, interning,
//! symbolization).
//!
//! Invariant: the hot path (capture, intern, record) stores raw return addresses and ids
//! only; names, files and lines are produced at dump time by `symbolize`.

pub mod annotations;
pub mod clock;
pub mod event;
pub mod intern;
pub mod log;
pub mod module_epochs;
pub mod python;
pub mod range;
pub mod ring;
pub mod runtime_frames;
pub mod self_mem;
pub mod stack;
pub mod symbolize;
pub mod thread_stack;
pub mod unwind_dwarf;
pub mod unwind_fp;
