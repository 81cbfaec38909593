//! The whole-run event log (`CUSHIM_LOG=path-template`): every recorded event, and each
//! distinct stack once, streamed to an append-only file (every chunk encoded by
//! `cushim::trace::log::codec`; the format in `docs/LOG-FORMAT.md`, the file's safety in
//! `docs/EVENT-LOG.md`).
//!
//! Policy, in short (each part states its own at its head, with why):
//! - The allocating thread only encodes the event into its sink's ring of bytes: no I/O,
//!   no allocation, no lock (`sink.rs`, `event_ring.rs`; range marks: `ring.rs`).
//! - A thread of the shim's own (`cushim-log`) writes what the rings hold, in rounds, with
//!   the stacks and range paths those events name before them; at exit and on an ending
//!   signal the log is drained and closed with `END` (`writer.rs`).
//! - The file is created as a snapshot's is, and whatever fails there the program runs on
//!   without a log, with one line saying why (`start.rs`, `open.rs`).
//! - A fork child never writes to its parent's log; with `%p` in the template it starts its
//!   own at its first event (`child.rs`).
//! - On SIGSEGV, SIGBUS and SIGABRT what the rings still hold is written with `write(2)`
//!   only, async-signal-safe (`crash.rs`).
//! - A full ring makes the allocating thread wait for the writer, because a log with a hole
//!   cannot be replayed; events are dropped, counted and the count written, only when no
//!   writer can ever drain the rings.
//!
//! The statics the parts share are named in one place, `shared.rs`.

mod child;
mod crash;
mod event_ring;
mod open;
mod ring;
mod shared;
mod sink;
mod start;
mod writer;

pub use child::after_fork_in_child;
pub use crash::flush_from_signal;
pub use shared::{requested, FLUSH_MS};
pub use sink::wrap;
pub use start::start;
pub use writer::finish;
