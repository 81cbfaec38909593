//! Driver access: the driver functions the shim itself calls (`entry`) and the engine's
//! `Device` over them (`device`).

pub mod device;
pub mod entry;
