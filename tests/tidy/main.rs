//! The tree's own rules as tests: layering between folders, documentation true to the tree.

#[path = "../common/mod.rs"]
mod common;

mod harness;
mod tidy_docs;
mod tidy_layering;
