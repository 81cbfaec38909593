//! Symbol lookup: the `dlsym` override and the `cuGetProcAddress` wrappers.

pub mod dlsym;
pub mod procaddr;
pub mod runtime_hooks;
