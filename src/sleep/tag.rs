//! Which tag an allocation belongs to, in sleep mode: the innermost explicit tag the calling
//! thread pushed (`cushim_tag_push`), else the NVTX range path it allocates in, else
//! `default`. A pause names a tag: explicit tags match exactly; a range path matches its
//! whole path (`train/optimizer`) or any one of its levels (`optimizer`), so a program can
//! pause what a range allocated wherever it was nested.
//!
//! Policy: the explicit stack is per thread (as NVTX ranges are), and is read only by the
//! sleep-mode allocation path, never by the cache's.

use std::cell::RefCell;

/// The tag of memory allocated outside every tag and range.
pub const DEFAULT: &str = "default";

/// Deepest explicit nesting kept per thread (a push beyond fails).
pub const MAX_DEPTH: usize = 64;

thread_local! {
    static STACK: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Push an explicit tag for the calling thread; false when nested too deep or the tag is
/// empty.
pub fn push(tag: &str) -> bool {
    if tag.is_empty() {
        return false;
    }
    STACK
        .try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() >= MAX_DEPTH {
                return false;
            }
            s.push(tag.to_string());
            true
        })
        .unwrap_or(false)
}

/// Pop the calling thread's innermost explicit tag; false when none is open.
pub fn pop() -> bool {
    STACK
        .try_with(|s| s.borrow_mut().pop().is_some())
        .unwrap_or(false)
}

/// Call `f` with the calling thread's innermost explicit tag, borrowed (nothing is copied:
/// the sleep-mode cache's hot path compares it with the tags it knows).
pub fn with_explicit<R>(mut f: impl FnMut(Option<&str>) -> R) -> R {
    STACK
        .try_with(|s| f(s.borrow().last().map(String::as_str)))
        .unwrap_or_else(|_| f(None))
}

/// The tag for an allocation made now: the explicit one, else `range_path()` (the thread's
/// NVTX range path, when it has one), else [`DEFAULT`].
pub fn current(range_path: impl FnOnce() -> Option<String>) -> String {
    let explicit = STACK
        .try_with(|s| s.borrow().last().cloned())
        .ok()
        .flatten();
    explicit
        .or_else(range_path)
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| DEFAULT.to_string())
}

/// Whether memory tagged `have` is paused or resumed by a request naming `want` (`None`:
/// every tag).
pub fn matches(have: &str, want: Option<&str>) -> bool {
    match want {
        None => true,
        Some(w) => have == w || have.split('/').any(|level| level == w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_tags_nest_and_win_over_ranges_and_default_is_the_rest() {
        assert_eq!(current(|| None), DEFAULT);
        assert_eq!(current(|| Some("train/fwd".into())), "train/fwd");
        assert!(push("kv_cache"));
        assert!(push("inner"));
        assert_eq!(current(|| Some("train".into())), "inner");
        assert!(pop());
        assert_eq!(current(|| None), "kv_cache");
        assert!(pop());
        assert!(!pop());
        assert!(!push(""));
    }

    #[test]
    fn a_tag_matches_its_path_or_any_level_of_it() {
        assert!(matches("train/optimizer", Some("optimizer")));
        assert!(matches("train/optimizer", Some("train/optimizer")));
        assert!(!matches("train/optimizer", Some("opt")));
        assert!(matches("x", None));
    }
}
