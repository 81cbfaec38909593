//! Answers from snapshots (heaptrack/bytehound style): one reader turns any input into one
//! model of a snapshot ([`model`], filled by [`load`] from a snapshot tree and by [`input`]
//! from any file), and independent analyses read that model: [`timeline`] (the state at
//! the start of the trace and the walk forward), [`frames`] (which frame is the program's),
//! [`sites`] (live bytes per allocation site), [`replay`] (the trace through the real engine
//! under other settings), [`diff`] (two runs side by side), [`report`] (one HTML page) and
//! [`summary`] with [`kinds`] (the text digest).
//!
//! Invariant: nothing here runs in the shim; the format layer (`crate::snapshot`) sits below
//! and never imports this folder; every input error is one `Err(String)` that
//! says what is wrong and where, never a panic, and the model is at most a constant factor
//! of the input's size.

pub mod annotations;
pub mod by_range;
pub mod category;
pub mod category_rules;
pub mod decode_ahead;
pub mod device_size;
pub mod diff;
pub mod entry_marks;
pub mod event_list;
pub mod fit;
pub mod frames;
pub mod fx_nodes;
pub mod input;
pub mod json;
pub mod kinds;
pub mod load;
pub mod log_model;
pub mod model;
pub mod moment_time;
pub mod oom;
pub mod pytorch_pages;
pub mod recorded_stats;
pub mod replay;
pub mod replay_slots;
pub mod report;
pub mod seed;
pub mod segments_at;
pub mod sites;
pub mod steps;
pub mod summary;
pub mod timeline;
pub mod units;
pub mod walk;
