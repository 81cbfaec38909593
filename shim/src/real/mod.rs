//! The real-function slots: the real runtime and driver functions behind the exports.

pub mod driver;
pub mod runtime;
pub mod slots;
