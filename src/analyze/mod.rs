//! Answers from snapshots (heaptrack/bytehound style): one reader turns any input into one
//! model of a snapshot ([`model`], filled by [`load`] from a snapshot tree and by [`input`]
//! from any file), and independent analyses read that model: [`timeline`] (the state at
//! the start of the trace and the walk forward), [`frames`] (which frame is the program's),
//! [`sites`] (live bytes per allocation site), [`replay`] (the trace through the real engine
//! under other settings), [`diff`] (two runs side by side) and [`report`] (one HTML page).
//!
//! Invariant: nothing here runs in the shim; every input error is one `Err(String)` that
//! says what is wrong and where, never a panic, and the model is at most a constant factor
//! of the input's size.

pub mod by_range;
pub mod diff;
pub mod frames;
pub mod input;
pub mod load;
pub mod model;
pub mod replay;
pub mod report;
pub mod segments_at;
pub mod sites;
pub mod timeline;
