//! What PyTorch records about an allocation besides its frames, shown with its site:
//! the torch.compile region it ran in (a trace entry's `compile_context`) and the private
//! memory pool it came from (a trace entry's `pool_id`, a segment's `segment_pool_id`).
//!
//! Policy: these are kept as mark frames at the end of the allocation's interned stack
//! (name [`COMPILE_MARK`] or [`POOL_MARK`], the value in `file`), so an event stays 32
//! bytes and allocations that differ only in them are distinct sites: `summary`, `report`
//! and `diff` rows are split by compiled region and by pool, as PyTorch's memory_viz shows
//! `Compile context: ...` and `pool_id (a, b)` on each allocation. A mark is never a site
//! frame (`analyze::frames` leaves them out). What is not shown, and why:
//! - the default pool `(0, 0)`: every allocation outside a private pool is in it;
//! - an empty `compile_context` or PyTorch's `N/A` (no compiled region was running);
//! - a trace entry's range path (`user_metadata`): kept as a mark too
//!   (`analyze::category_rules::RANGE_MARK`) for the categories and steps, but not shown in
//!   a site (`summary --by range` groups by it);
//! - a trace entry's `internal_metadata`: PyTorch's own bookkeeping for the entry (it
//!   writes the key only when its allocator filled it), not something the program named;
//!   `convert` carries it, nothing here reads it.

use crate::analyze::model::{Frame, Stacks};

/// The mark frame holding a trace entry's `compile_context`.
pub const COMPILE_MARK: &str = "(torch.compile region)";
/// The mark frame holding a private pool id, `file` `(a, b)`.
pub const POOL_MARK: &str = "(private memory pool)";

/// Whether `f` is a mark frame (not a frame of the program's stack).
pub fn is_mark(f: &Frame) -> bool {
    let n = &*f.name;
    n == COMPILE_MARK || n == POOL_MARK || n == crate::analyze::category_rules::RANGE_MARK
}

/// The compiled region a trace entry names, if any (`None` for empty or `N/A`).
pub fn compile_region(context: Option<&str>) -> Option<&str> {
    context
        .map(str::trim)
        .filter(|c| !c.is_empty() && *c != "N/A")
}

/// The pool id as a mark's text, when it is a private pool's.
pub fn private_pool(pool: (i64, i64)) -> Option<String> {
    (pool != (0, 0)).then(|| format!("({}, {})", pool.0, pool.1))
}

/// The words a site gets from stack `id`'s marks: ` [compiled region X]`,
/// ` [private pool (a, b)]`, both, or nothing.
pub fn suffix(stacks: &Stacks, id: u32) -> String {
    let mut s = String::new();
    for f in stacks.frames_of(id).filter(|f| is_mark(f)) {
        if &*f.name == COMPILE_MARK {
            s.push_str(&format!(" [compiled region {}]", f.file));
        } else if &*f.name == POOL_MARK {
            s.push_str(&format!(" [private pool {}]", f.file));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_named_regions_and_private_pools_are_marked() {
        assert_eq!(compile_region(Some("N/A")), None);
        assert_eq!(compile_region(Some("")), None);
        assert_eq!(compile_region(None), None);
        assert_eq!(
            compile_region(Some("Torch-Compiled Region: 0/1")),
            Some("Torch-Compiled Region: 0/1")
        );
        assert_eq!(private_pool((0, 0)), None);
        assert_eq!(private_pool((1, 7)).as_deref(), Some("(1, 7)"));
    }
}
