//! Driver access: the driver functions the shim itself calls (`entry`) and the engine's
//! `Device` over them (`device`), and the peer pairs its new mappings are granted to
//! (`peers`).

pub mod device;
pub mod entry;
pub mod peers;
