//! The caching allocator (see the policy comment in `caching.rs`).

pub mod info;
