//! The whole-run event log (`CUSHIM_LOG`): its on-disk format (`format`, documented in
//! `docs/LOG-FORMAT.md`) and the encoder the shim's writer thread and its fatal-signal path
//! use (`encode`), and its file, created as safely as a snapshot (`file`). Reading a log is offline work (`snapshot::log_reader`).

pub mod encode;
pub mod file;
pub mod format;
