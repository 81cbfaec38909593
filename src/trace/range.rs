//! NVTX range paths: which phase of the program a thread is in when it allocates.
//!
//! A range path is the list of a thread's open NVTX ranges, outermost first, each a name in a
//! domain (the default domain, or one the program created). Paths are interned as a tree:
//! node `(parent, domain, name)` gets a [`RangeId`] once, for the life of the process, so an
//! event carries one `u32` and the dump renders `parent/.../name` once per distinct path.
//!
//! Policy (cost): each thread keeps its stack of open ranges, its current path id and its
//! recent lookups in one thread-local, so a push or a pop looks the thread up once (in
//! `libcushim.so` every thread-local lookup is a call into the dynamic linker); a push takes
//! the table's one lock only when the child node (or the name) is not among the thread's
//! recent lookups (small direct-mapped caches), a pop only when it closes a range under
//! another, and recording an event reads the current path from that thread-local's `Cell`
//! without a borrow. The rare paths (a cache miss, a thread named by another, a range closed
//! under others) are kept out of line. A program that never opens a range pays that one read
//! per recorded event and nothing else. Not for signal handlers.
//!
//! Policy (semantics, as NVTX defines them): push/pop nest per thread and per domain (a
//! domain's pop closes that domain's innermost open range, even when another domain's range
//! was opened after it; the paths above it are then re-derived). Start/end ranges join the
//! starting thread's path until ended on that thread; an end called on another thread is
//! accepted and forgotten (the starting thread keeps the range open), because a thread's
//! stack belongs to that thread alone. Names are stored as given; a domain's ranges appear as
//! `domain:name`. The table is bounded by the program's distinct paths; it is never pruned.
//!
//! Policy (thread and category names, where they mean something): a thread the program
//! names (`nvtxNameOsThread*`) roots its paths at a `[name]` level, so its allocations
//! outside every range are told apart from other threads' and its ranges from same-named
//! ones elsewhere; naming the calling thread re-roots its open ranges at once, naming
//! another thread takes effect at that thread's next push or start (a thread reads one
//! atomic counter per push to notice). A range opened with a named category
//! (`nvtx*NameCategory*`, per domain) is the level `name [category]`: categories group
//! ranges, so two categories' ranges of one name are two paths. Unnamed categories and
//! threads change nothing.

use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// An interned range path. `0` means "no open range".
pub type RangeId = u32;

/// No open range.
pub const NO_RANGE: RangeId = 0;

/// An interned name (range message or domain name). `0` is the default domain.
pub type NameId = u32;

/// The default (unnamed) domain.
pub const DEFAULT_DOMAIN: NameId = 0;

/// Separator between the levels of a rendered path.
pub const SEPARATOR: &str = "/";

/// The pseudo-domain of a thread-name level (rendered `[name]`).
const THREAD_LEVEL: NameId = NameId::MAX;

#[derive(Default)]
struct Table {
    /// Name `i + 1`.
    names: Vec<Box<str>>,
    by_name: HashMap<Box<str>, NameId>,
    /// Node `i + 1`: `(parent, domain, name)`.
    nodes: Vec<(RangeId, NameId, NameId)>,
    by_node: HashMap<(RangeId, NameId, NameId), RangeId>,
    /// Named categories: `(domain, category)` to the name.
    categories: HashMap<(NameId, u32), NameId>,
    /// `(name, category name)` to the name of the level `name [category]`.
    qualified: HashMap<(NameId, NameId), NameId>,
    /// Threads named by another thread (OS thread id to name), not yet applied.
    pending_threads: HashMap<u64, NameId>,
}

impl Table {
    fn name(&mut self, s: &str) -> NameId {
        if let Some(&id) = self.by_name.get(s) {
            return id;
        }
        self.names.push(s.into());
        let id = self.names.len() as NameId;
        self.by_name.insert(s.into(), id);
        id
    }

    fn child(&mut self, parent: RangeId, domain: NameId, name: NameId) -> RangeId {
        let key = (parent, domain, name);
        if let Some(&id) = self.by_node.get(&key) {
            return id;
        }
        self.nodes.push(key);
        let id = self.nodes.len() as RangeId;
        self.by_node.insert(key, id);
        id
    }

    /// The name of `name`'s level under `category` of `domain` (itself when the category
    /// has no name).
    fn categorized(&mut self, domain: NameId, category: u32, name: NameId) -> NameId {
        let Some(&cat) = self.categories.get(&(domain, category)) else {
            return name;
        };
        if let Some(&q) = self.qualified.get(&(name, cat)) {
            return q;
        }
        let text = format!("{} [{}]", self.name_str(name), self.name_str(cat));
        let q = self.name(&text);
        self.qualified.insert((name, cat), q);
        q
    }

    fn name_str(&self, id: NameId) -> &str {
        id.checked_sub(1)
            .and_then(|i| self.names.get(i as usize))
            .map_or("", |s| s)
    }

    fn render(&self, mut id: RangeId) -> Option<String> {
        let mut levels = Vec::new();
        while id != NO_RANGE {
            let &(parent, domain, name) = self.nodes.get(id as usize - 1)?;
            levels.push(if domain == DEFAULT_DOMAIN {
                self.name_str(name).to_string()
            } else if domain == THREAD_LEVEL {
                format!("[{}]", self.name_str(name))
            } else {
                format!("{}:{}", self.name_str(domain), self.name_str(name))
            });
            id = parent;
        }
        levels.reverse();
        Some(levels.join(SEPARATOR))
    }
}

static TABLE: Lazy<Mutex<Table>> = Lazy::new(Mutex::default);
/// Bumped when a thread is named by another, so each thread checks once for its own name.
static THREADS_NAMED: AtomicU64 = AtomicU64::new(0);
/// Whether any category has a name (until then a push never looks categories up).
static CATEGORIES_NAMED: AtomicBool = AtomicBool::new(false);

/// One open range of a thread.
#[derive(Clone, Copy)]
struct Open {
    domain: NameId,
    name: NameId,
    /// The start/end range id; `0` for a pushed range.
    started: u64,
    node: RangeId,
}

/// Slots of a thread's caches of recent lookups (a power of two).
const RECENT: usize = 32;

/// A name in a thread's cache: `(hash, the name's bytes as given, id)`.
type RecentName = (u64, Box<[u8]>, NameId);

/// A thread's open ranges and recent lookups, behind the one borrow a call takes.
struct Ranges {
    /// Open ranges, outermost first.
    open: Vec<Open>,
    /// The thread's root: `NO_RANGE`, or its `[name]` level once named.
    base: RangeId,
    /// The `THREADS_NAMED` count this thread last checked its name against.
    names_seen: u64,
    /// Recent `(parent, domain, name) -> child` lookups, direct-mapped by a hash, so a
    /// repeated push takes no lock (a miss asks the table).
    nodes: [(RangeId, NameId, NameId, RangeId); RECENT],
    /// Recent name-bytes -> id lookups, direct-mapped the same way (empty until the first).
    names: Vec<RecentName>,
}

/// A thread's whole range state in one thread-local, so a push, a pop or an event's read of
/// the current path looks the thread up once.
struct ThreadRanges {
    /// The current path, read by every recorded event without a borrow.
    current: Cell<RangeId>,
    ranges: RefCell<Ranges>,
}

thread_local! {
    static THREAD: ThreadRanges = const {
        ThreadRanges {
            current: Cell::new(NO_RANGE),
            ranges: RefCell::new(Ranges {
                open: Vec::new(),
                base: NO_RANGE,
                names_seen: 0,
                nodes: [(0, 0, 0, NO_RANGE); RECENT],
                names: Vec::new(),
            }),
        }
    };
}

/// Run `f` on the calling thread's ranges and current path: `None` in a thread that is
/// exiting (or if `f` called back in here, which nothing does).
#[inline]
fn with_thread<R>(f: impl FnOnce(&mut Ranges, &Cell<RangeId>) -> R) -> Option<R> {
    THREAD
        .try_with(|t| {
            let mut r = t.ranges.try_borrow_mut().ok()?;
            Some(f(&mut r, &t.current))
        })
        .ok()
        .flatten()
}

fn slot(h: u64) -> usize {
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59) as usize % RECENT
}

/// A hash of a name's bytes, eight at a time (it only picks a cache slot).
#[inline]
fn name_hash(b: &[u8]) -> u64 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mut chunks = b.chunks_exact(8);
    let mut h = b.len() as u64;
    for c in &mut chunks {
        let w = c.iter().rev().fold(0u64, |w, &x| w << 8 | u64::from(x));
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let w = rest.iter().fold(0u64, |w, &x| w << 8 | u64::from(x));
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    h
}

impl Ranges {
    /// The child node `(parent, domain, name)`, from the cache or the table.
    #[inline(always)]
    fn child(&mut self, parent: RangeId, domain: NameId, name: NameId) -> RangeId {
        let h = slot(u64::from(parent) << 40 ^ u64::from(domain) << 20 ^ u64::from(name));
        let (p, d, n, node) = self.nodes[h];
        if node != NO_RANGE && (p, d, n) == (parent, domain, name) {
            return node;
        }
        self.child_miss(h, parent, domain, name)
    }

    #[cold]
    #[inline(never)]
    fn child_miss(&mut self, h: usize, parent: RangeId, domain: NameId, name: NameId) -> RangeId {
        let node = TABLE.lock().child(parent, domain, name);
        self.nodes[h] = (parent, domain, name, node);
        node
    }

    /// The id of the name whose bytes are `b` (UTF-8, invalid sequences replaced, checked
    /// only on a miss), from the cache or the table.
    #[inline(always)]
    fn name(&mut self, b: &[u8]) -> NameId {
        let h = name_hash(b);
        let at = slot(h);
        if let Some((k, n, id)) = self.names.get(at) {
            if *id != 0 && *k == h && **n == *b {
                return *id;
            }
        }
        self.name_miss(at, h, b)
    }

    #[cold]
    #[inline(never)]
    fn name_miss(&mut self, at: usize, h: u64, b: &[u8]) -> NameId {
        let id = TABLE.lock().name(&String::from_utf8_lossy(b));
        if self.names.len() < RECENT {
            self.names.resize(RECENT, (0, Box::default(), 0));
        }
        self.names[at] = (h, b.into(), id);
        id
    }

    /// Apply a name another thread gave this one, if one came since the last check.
    #[inline(always)]
    fn check_thread_name(&mut self, current: &Cell<RangeId>) {
        let named = THREADS_NAMED.load(Ordering::Relaxed);
        if named != self.names_seen {
            self.take_thread_name(named, current);
        }
    }

    #[cold]
    #[inline(never)]
    fn take_thread_name(&mut self, named: u64, current: &Cell<RangeId>) {
        self.names_seen = named;
        let mut t = TABLE.lock();
        if let Some(name) = t.pending_threads.remove(&own_tid()) {
            self.root_at(&mut t, name, current);
        }
    }

    /// Root the thread's paths at the level `[name]`: its open ranges are re-derived on top
    /// of it.
    fn root_at(&mut self, t: &mut Table, name: NameId, current: &Cell<RangeId>) {
        self.base = t.child(NO_RANGE, THREAD_LEVEL, name);
        self.rederive(t, 0, current);
    }

    /// Re-derive the paths of the open ranges from index `from` up, and the current path.
    fn rederive(&mut self, t: &mut Table, from: usize, current: &Cell<RangeId>) {
        let mut parent = from.checked_sub(1).map_or(self.base, |i| self.open[i].node);
        for o in self.open[from..].iter_mut() {
            o.node = t.child(parent, o.domain, o.name);
            parent = o.node;
        }
        current.set(parent);
    }

    /// Close the open range at `at`, under others: the paths above it are re-derived.
    #[cold]
    #[inline(never)]
    fn close_under(&mut self, at: usize, current: &Cell<RangeId>) -> Open {
        let gone = self.open.remove(at);
        self.rederive(&mut TABLE.lock(), at, current);
        gone
    }

    /// Push `o`; its zero-based level among the open ranges of its domain.
    #[inline(always)]
    fn push(&mut self, o: Open, current: &Cell<RangeId>) -> i32 {
        let level = self.open.iter().filter(|x| x.domain == o.domain).count() as i32;
        self.open.push(o);
        current.set(o.node);
        level
    }

    /// Close the innermost open range `which` accepts: its level among the open ranges of
    /// `domain` below it, and the range; `None` when none was open.
    #[inline(always)]
    fn close(
        &mut self,
        which: impl Fn(&Open) -> bool,
        domain: NameId,
        current: &Cell<RangeId>,
    ) -> Option<(i32, Open)> {
        let at = self.open.iter().rposition(which)?;
        let level = self.open[..at]
            .iter()
            .filter(|o| o.domain == domain)
            .count() as i32;
        if at + 1 < self.open.len() {
            return Some((level, self.close_under(at, current)));
        }
        let gone = self.open.pop()?;
        current.set(self.open.last().map_or(self.base, |o| o.node));
        Some((level, gone))
    }
}

/// The calling thread's OS thread id (what `nvtxNameOsThread*` names threads by).
fn own_tid() -> u64 {
    // SAFETY: gettid has no preconditions and cannot fail.
    (unsafe { libc::gettid() }) as u64
}

/// Name OS thread `tid` `name` (`nvtxNameOsThread*`): the calling thread at once, another
/// at its next push or start.
pub fn name_thread(tid: u64, name: &str) {
    let id = intern_name(name);
    if tid == own_tid() {
        let mut t = TABLE.lock();
        let _ = with_thread(|r, current| r.root_at(&mut t, id, current));
    } else {
        TABLE.lock().pending_threads.insert(tid, id);
        THREADS_NAMED.fetch_add(1, Ordering::Release);
    }
}

/// Name `category` of `domain` (`nvtx*NameCategory*`).
pub fn name_category(domain: NameId, category: u32, name: &str) {
    let mut t = TABLE.lock();
    let n = t.name(name);
    t.categories.insert((domain, category), n);
    CATEGORIES_NAMED.store(true, Ordering::Release);
}

/// The level name of range `name` opened with `category` in `domain`: `name [category]`
/// when the category is named, else `name`.
pub fn categorized(domain: NameId, category: u32, name: NameId) -> NameId {
    if category == 0 || !CATEGORIES_NAMED.load(Ordering::Acquire) {
        return name;
    }
    TABLE.lock().categorized(domain, category, name)
}

/// The calling thread's current range path (`NO_RANGE` outside every range, and in a
/// thread that is exiting).
#[inline]
pub fn current() -> RangeId {
    THREAD.try_with(|t| t.current.get()).unwrap_or(NO_RANGE)
}

/// Intern a name (a registered string, a domain's name).
pub fn intern_name(s: &str) -> NameId {
    TABLE.lock().name(s)
}

/// The name `id` was interned from.
pub fn name_of(id: NameId) -> String {
    TABLE.lock().name_str(id).to_string()
}

/// Open a range in `domain` on the calling thread, named by what `name` finds (with the
/// thread's caches at hand). Returns its zero-based level among the thread's open ranges of
/// that domain, `-1` if the thread is exiting.
#[inline]
fn enter(domain: NameId, started: u64, name: impl FnOnce(&mut Ranges) -> NameId) -> i32 {
    let opened = with_thread(|r, current| {
        r.check_thread_name(current);
        let name = name(r);
        let node = r.child(current.get(), domain, name);
        let o = Open {
            domain,
            name,
            started,
            node,
        };
        (r.push(o, current), o)
    });
    let Some((level, o)) = opened else {
        return -1;
    };
    if crate::trace::annotations::on() {
        crate::trace::annotations::record(true, o.domain, o.name, o.node);
    }
    level
}

/// Open a range named `name` (already interned) in `domain` on the calling thread; `started`
/// is its start/end id, `0` for a push. Returns the zero-based level of the new range among
/// the thread's open ranges of that domain (what `nvtxRangePush` returns), `-1` if the
/// thread is exiting.
pub fn open(domain: NameId, name: NameId, started: u64) -> i32 {
    enter(domain, started, |_| name)
}

/// Open a range named by the string `name`.
pub fn open_str(domain: NameId, name: &str, started: u64) -> i32 {
    enter(domain, started, |r| r.name(name.as_bytes()))
}

/// Open a range named by the bytes `name` (a C string's, UTF-8 checked only the first time
/// the thread sees them).
pub fn open_bytes(domain: NameId, name: &[u8], started: u64) -> i32 {
    enter(domain, started, |r| r.name(name))
}

/// Open a range named by the string `name` with `category` of `domain` (see
/// [`categorized`]).
pub fn open_str_categorized(domain: NameId, category: u32, name: &str, started: u64) -> i32 {
    enter(domain, started, |r| {
        categorized(domain, category, r.name(name.as_bytes()))
    })
}

/// Close the calling thread's innermost pushed range of `domain`. Returns the level it was
/// at (what `nvtxRangePop` returns), `-1` when none was open.
pub fn pop(domain: NameId) -> i32 {
    close(|o| o.domain == domain && o.started == 0, domain)
}

/// Close the start/end range `started` if the calling thread opened it.
pub fn end(started: u64) {
    if started != 0 {
        close(|o| o.started == started, DEFAULT_DOMAIN);
    }
}

#[inline]
fn close(which: impl Fn(&Open) -> bool, domain: NameId) -> i32 {
    let Some((level, gone)) = with_thread(|r, current| r.close(which, domain, current)).flatten()
    else {
        return -1;
    };
    if crate::trace::annotations::on() {
        crate::trace::annotations::record(false, gone.domain, gone.name, gone.node);
    }
    level
}

/// The path table's lock, held across `fork` (see the shim's `fork.rs`); dropping it
/// releases it. A leaf lock: nothing else is taken while it is held.
pub struct ForkHold {
    _held: parking_lot::MutexGuard<'static, Table>,
}

/// Take the path table's lock until the returned hold is dropped.
pub fn hold_for_fork() -> ForkHold {
    ForkHold {
        _held: TABLE.lock(),
    }
}

/// The text of one level: `name`, or `domain:name` outside the default domain.
pub fn level_name(domain: NameId, name: NameId) -> String {
    let t = TABLE.lock();
    if domain == DEFAULT_DOMAIN {
        t.name_str(name).to_string()
    } else if domain == THREAD_LEVEL {
        format!("[{}]", t.name_str(name))
    } else {
        format!("{}:{}", t.name_str(domain), t.name_str(name))
    }
}

/// The rendered path of `id` (`domain:name` levels joined by [`SEPARATOR`]), `None` for
/// `NO_RANGE` or an id this process never made.
pub fn path(id: RangeId) -> Option<String> {
    if id == NO_RANGE {
        return None;
    }
    TABLE.lock().render(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_pushes_make_a_path_and_pops_unwind_it() {
        std::thread::spawn(|| {
            assert_eq!(current(), NO_RANGE);
            assert_eq!(open_str(DEFAULT_DOMAIN, "step", 0), 0);
            assert_eq!(open_str(DEFAULT_DOMAIN, "forward", 0), 1);
            let fwd = current();
            assert_eq!(path(fwd).as_deref(), Some("step/forward"));
            assert_eq!(pop(DEFAULT_DOMAIN), 1);
            assert_eq!(path(current()).as_deref(), Some("step"));
            assert_eq!(open_str(DEFAULT_DOMAIN, "forward", 0), 1);
            assert_eq!(current(), fwd, "the same path interns to the same id");
            assert_eq!(pop(DEFAULT_DOMAIN), 1);
            assert_eq!(pop(DEFAULT_DOMAIN), 0);
            assert_eq!(pop(DEFAULT_DOMAIN), -1);
            assert_eq!(current(), NO_RANGE);
            open_str(DEFAULT_DOMAIN, "", 0);
            assert_eq!(path(current()).as_deref(), Some(""), "an unnamed range");
            pop(DEFAULT_DOMAIN);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_domain_pop_closes_that_domains_range_under_another() {
        std::thread::spawn(|| {
            let d = intern_name("dom");
            open_str(DEFAULT_DOMAIN, "outer", 0);
            assert_eq!(open_str(d, "mid", 0), 0);
            open_str(DEFAULT_DOMAIN, "inner", 0);
            assert_eq!(path(current()).as_deref(), Some("outer/dom:mid/inner"));
            assert_eq!(pop(d), 0);
            assert_eq!(path(current()).as_deref(), Some("outer/inner"));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_name_given_as_bytes_is_the_same_name_and_invalid_utf8_is_replaced() {
        std::thread::spawn(|| {
            open_bytes(DEFAULT_DOMAIN, b"fwd", 0);
            let by_bytes = current();
            pop(DEFAULT_DOMAIN);
            open_str(DEFAULT_DOMAIN, "fwd", 0);
            assert_eq!(current(), by_bytes);
            pop(DEFAULT_DOMAIN);
            open_bytes(DEFAULT_DOMAIN, b"a\xffb", 0);
            assert_eq!(path(current()).as_deref(), Some("a\u{fffd}b"));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn names_that_share_a_cache_slot_or_a_prefix_stay_distinct() {
        std::thread::spawn(|| {
            // More names than the cache has slots, of lengths across the eight-byte words
            // the cache hashes by: each must come back as itself, cached or not.
            let names: Vec<String> = (0..3 * RECENT)
                .map(|i| format!("{}{i}", "n".repeat(i % 19)))
                .collect();
            for _ in 0..2 {
                for n in &names {
                    open_bytes(DEFAULT_DOMAIN, n.as_bytes(), 0);
                    assert_eq!(path(current()).as_deref(), Some(n.as_str()));
                    pop(DEFAULT_DOMAIN);
                }
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_named_thread_roots_its_paths_at_its_name() {
        std::thread::spawn(|| {
            open_str(DEFAULT_DOMAIN, "outer", 0);
            name_thread(own_tid(), "loader");
            assert_eq!(path(current()).as_deref(), Some("[loader]/outer"));
            pop(DEFAULT_DOMAIN);
            assert_eq!(path(current()).as_deref(), Some("[loader]"));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_named_by_another_takes_the_name_at_its_next_push() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(own_tid()).unwrap();
            go_rx.recv().unwrap();
            assert_eq!(current(), NO_RANGE, "not before a push");
            open_str(DEFAULT_DOMAIN, "work", 0);
            path(current())
        });
        name_thread(rx.recv().unwrap(), "worker-7");
        go_tx.send(()).unwrap();
        assert_eq!(t.join().unwrap().as_deref(), Some("[worker-7]/work"));
    }

    #[test]
    fn a_named_category_qualifies_its_ranges_level() {
        std::thread::spawn(|| {
            let d = intern_name("catdom");
            name_category(d, 3, "io");
            let n = intern_name("load");
            open(d, categorized(d, 3, n), 0);
            assert_eq!(path(current()).as_deref(), Some("catdom:load [io]"));
            pop(d);
            open(d, categorized(d, 4, n), 0);
            assert_eq!(
                path(current()).as_deref(),
                Some("catdom:load"),
                "unnamed category"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn start_end_ranges_join_the_path_until_ended() {
        std::thread::spawn(|| {
            open_str(DEFAULT_DOMAIN, "a", 0);
            open_str(DEFAULT_DOMAIN, "req", 77);
            open_str(DEFAULT_DOMAIN, "b", 0);
            assert_eq!(path(current()).as_deref(), Some("a/req/b"));
            end(77);
            assert_eq!(path(current()).as_deref(), Some("a/b"));
        })
        .join()
        .unwrap();
    }
}
