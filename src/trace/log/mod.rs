//! The whole-run event log (`CUSHIM_LOG`): its framing and primitives (`format`), the codec
//! of every chunk kind, which the shim's writer and the offline reader
//! (`cushim_tools::snapshot::log_reader`) both use (`codec`; `docs/LOG-FORMAT.md` describes
//! the same bytes), and its file, created as safely as a snapshot (`file`).

pub mod codec;
pub mod file;
pub mod format;
