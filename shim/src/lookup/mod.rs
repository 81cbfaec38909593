//! Symbol lookup: the `dlsym` override and the `cuGetProcAddress` wrappers, both answering
//! from the one table of hooked symbols (`table`).

pub mod dlsym;
pub mod procaddr;
pub mod table;
