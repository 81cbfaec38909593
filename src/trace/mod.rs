//! Allocation history: events, the bounded ring, native stacks.

pub mod event;
