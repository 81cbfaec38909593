//! Reading snapshots: any of the engine's formats (pickle, msgpack, JSON) and PyTorch's
//! pickle into one [`cushim::snapshot::value::Value`] tree (`reader`, with the pickle memo in
//! `memo`), and `convert` between formats.
//!
//! Invariant: this is the format layer; the analyses in `crate::analyze` read through it and
//! it never imports them.

pub mod convert;
pub mod from_log;
pub mod log_reader;
pub mod mapped;
mod memo;
pub mod progress;
pub mod reader;
pub mod share;
pub mod sniff;
pub mod stream;
