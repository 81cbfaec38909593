//! A library loaded after the first symbolization still resolves: by its exported symbol
//! names and module (the DWARF symbolizer's module list is taken at its first use, so file
//! and line come only from libraries loaded before that).

mod common;
use common::snapshot_support as support;

use cushim::config::history::Unwinder;
use cushim::trace::stack::{capture, SkipRange};
use cushim::trace::symbolize::Symbolizer;

extern "C" fn walk_dwarf(_fp: usize, buf: *mut u64, n: usize) -> usize {
    // SAFETY (test): the C side passes a buffer of n words.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf, n) };
    capture(buf, Unwinder::Dwarf, &SkipRange::NONE)
}

#[test]
fn frames_of_a_library_loaded_after_first_symbolization_resolve_by_symbol_and_module() {
    // First symbolization: fixes the symbolizer's module list without the library.
    let mut warm = Symbolizer::new();
    let _ = warm.resolve(walk_dwarf as *const () as u64 + 1);

    let (_, outer) = support::load_trace_fp("late-load", "libtrace_late.so");
    let mut buf = [0u64; 64];
    // SAFETY (test): the library's function writes at most 64 entries.
    let n = unsafe { outer(walk_dwarf, buf.as_mut_ptr(), buf.len()) };
    let mut sym = Symbolizer::new();
    let mut ids = Vec::new();
    sym.resolve_stack(&buf[..n], &mut ids);
    let frames: Vec<_> = ids
        .iter()
        .map(|&i| sym.frames()[i as usize].clone())
        .collect();
    let middle = frames
        .iter()
        .find(|f| f.name.contains("trace_fp_middle"))
        .unwrap_or_else(|| panic!("{frames:#?}"));
    assert!(
        middle.filename.ends_with("trace_fp.c") || middle.filename.ends_with("libtrace_late.so"),
        "{middle:?}"
    );
}
