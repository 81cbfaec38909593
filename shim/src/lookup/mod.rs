//! Symbol lookup: the `dlsym` override and the `cuGetProcAddress` wrappers, both answering
//! from the one table of hooked symbols (`table`).

pub mod dlsym;
pub mod procaddr;
pub mod table;
// Test-only: the committed list of stream-taking entry points checked against the hooks of
// every route (this top layer sees both the table and the per-thread stubs).
#[cfg(test)]
mod stream_entry_points;
