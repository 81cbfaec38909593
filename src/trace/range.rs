//! NVTX range paths: which phase of the program a thread is in when it allocates.
//!
//! A range path is the list of a thread's open NVTX ranges, outermost first, each a name in a
//! domain (the default domain, or one the program created). Paths are interned as a tree:
//! node `(parent, domain, name)` gets a [`RangeId`] once, for the life of the process, so an
//! event carries one `u32` and the dump renders `parent/.../name` once per distinct path.
//!
//! Policy (cost): each thread keeps its own stack of open ranges and its current path id in
//! thread-locals; a push takes the table's one lock only when the child node (or the name)
//! is not among the thread's recent lookups (a small direct-mapped cache), a pop only when
//! it closes a range under another domain's, and recording an event reads one thread-local
//! `Cell`. A program that never opens a
//! range pays that one read per recorded event and nothing else. Not for signal handlers.
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

thread_local! {
    static CURRENT: Cell<RangeId> = const { Cell::new(NO_RANGE) };
    static OPEN: RefCell<Vec<Open>> = const { RefCell::new(Vec::new()) };
    /// The thread's root: `NO_RANGE`, or its `[name]` level once named.
    static BASE: Cell<RangeId> = const { Cell::new(NO_RANGE) };
    /// The `THREADS_NAMED` count this thread last checked its name against.
    static NAMES_SEEN: Cell<u64> = const { Cell::new(0) };
}

fn base() -> RangeId {
    BASE.try_with(Cell::get).unwrap_or(NO_RANGE)
}

/// The calling thread's OS thread id (what `nvtxNameOsThread*` names threads by).
fn own_tid() -> u64 {
    // SAFETY: gettid has no preconditions and cannot fail.
    (unsafe { libc::gettid() }) as u64
}

/// Root the calling thread's paths at the level `[name]`: its open ranges are re-derived
/// on top of it.
fn root_at(name: NameId) {
    let mut t = TABLE.lock();
    let root = t.child(NO_RANGE, THREAD_LEVEL, name);
    let _ = BASE.try_with(|b| b.set(root));
    let _ = OPEN.try_with(|open| {
        let mut open = open.borrow_mut();
        let mut parent = root;
        for o in open.iter_mut() {
            o.node = t.child(parent, o.domain, o.name);
            parent = o.node;
        }
        CURRENT.with(|c| c.set(parent));
    });
}

/// Name OS thread `tid` `name` (`nvtxNameOsThread*`): the calling thread at once, another
/// at its next push or start.
pub fn name_thread(tid: u64, name: &str) {
    let id = intern_name(name);
    if tid == own_tid() {
        root_at(id);
    } else {
        TABLE.lock().pending_threads.insert(tid, id);
        THREADS_NAMED.fetch_add(1, Ordering::Release);
    }
}

/// Apply a name another thread gave this one, if one came since the last check.
#[inline]
fn check_thread_name() {
    let named = THREADS_NAMED.load(Ordering::Relaxed);
    if named == 0 || NAMES_SEEN.try_with(Cell::get).unwrap_or(named) == named {
        return;
    }
    let _ = NAMES_SEEN.try_with(|s| s.set(named));
    let mine = TABLE.lock().pending_threads.remove(&own_tid());
    if let Some(name) = mine {
        root_at(name);
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
    CURRENT.try_with(Cell::get).unwrap_or(NO_RANGE)
}

/// Slots of a thread's cache of recent lookups (a power of two).
const RECENT: usize = 32;

/// A thread's recent lookups, so a repeated push takes no lock: `(parent, domain, name) ->
/// child` and name string -> id, each direct-mapped by a hash (a miss asks the table).
struct Recent {
    nodes: [(RangeId, NameId, NameId, RangeId); RECENT],
    /// `(hash, the name's bytes as given, id)`.
    names: Vec<(u64, Box<[u8]>, NameId)>,
}

thread_local! {
    static RECENT_LOOKUPS: RefCell<Recent> = const {
        RefCell::new(Recent {
            nodes: [(0, 0, 0, NO_RANGE); RECENT],
            names: Vec::new(),
        })
    };
}

fn slot(h: u64) -> usize {
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59) as usize % RECENT
}

/// The child node `(parent, domain, name)`, from the thread's cache or the table.
fn child(parent: RangeId, domain: NameId, name: NameId) -> RangeId {
    let h = slot(u64::from(parent) << 40 ^ u64::from(domain) << 20 ^ u64::from(name));
    let hit = RECENT_LOOKUPS
        .try_with(|r| {
            let (p, d, n, node) = r.borrow().nodes[h];
            (node != NO_RANGE && (p, d, n) == (parent, domain, name)).then_some(node)
        })
        .ok()
        .flatten();
    if let Some(node) = hit {
        return node;
    }
    let node = TABLE.lock().child(parent, domain, name);
    let _ = RECENT_LOOKUPS.try_with(|r| r.borrow_mut().nodes[h] = (parent, domain, name, node));
    node
}

/// The id of name `s`, from the thread's cache or the table.
fn recent_name(s: &str) -> NameId {
    recent_name_bytes(s.as_bytes())
}

/// The id of the name whose bytes are `b` (UTF-8, invalid sequences replaced, checked only
/// on a miss), from the thread's cache or the table.
fn recent_name_bytes(b: &[u8]) -> NameId {
    let h = b.iter().fold(b.len() as u64, |h, &c| {
        (h.rotate_left(5) ^ u64::from(c)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
    });
    let at = slot(h);
    let hit = RECENT_LOOKUPS
        .try_with(|r| {
            r.borrow()
                .names
                .get(at)
                .filter(|(k, n, id)| *id != 0 && *k == h && &**n == b)
                .map(|e| e.2)
        })
        .ok()
        .flatten();
    if let Some(id) = hit {
        return id;
    }
    let id = TABLE.lock().name(&String::from_utf8_lossy(b));
    let _ = RECENT_LOOKUPS.try_with(|r| {
        let mut r = r.borrow_mut();
        if r.names.len() < RECENT {
            r.names.resize(RECENT, (0, Box::from(&b""[..]), 0));
        }
        r.names[at] = (h, b.into(), id);
    });
    id
}

/// Intern a name (a registered string, a domain's name).
pub fn intern_name(s: &str) -> NameId {
    TABLE.lock().name(s)
}

/// The name `id` was interned from.
pub fn name_of(id: NameId) -> String {
    TABLE.lock().name_str(id).to_string()
}

/// Open a range named `name` (already interned) in `domain` on the calling thread; `started`
/// is its start/end id, `0` for a push. Returns the zero-based level of the new range among
/// the thread's open ranges of that domain (what `nvtxRangePush` returns), `-1` if the
/// thread is exiting.
pub fn open(domain: NameId, name: NameId, started: u64) -> i32 {
    check_thread_name();
    let node = child(current(), domain, name);
    enter(Open {
        domain,
        name,
        started,
        node,
    })
}

fn enter(o: Open) -> i32 {
    if crate::trace::annotations::on() {
        crate::trace::annotations::record(true, o.domain, o.name, o.node);
    }
    OPEN.try_with(|open| {
        let mut open = open.borrow_mut();
        open.push(o);
        CURRENT.with(|c| c.set(o.node));
        open.iter().filter(|x| x.domain == o.domain).count() as i32 - 1
    })
    .unwrap_or(-1)
}

/// Open a range named by the string `name`.
pub fn open_str(domain: NameId, name: &str, started: u64) -> i32 {
    check_thread_name();
    let parent = current();
    let name = recent_name(name);
    let node = child(parent, domain, name);
    enter(Open {
        domain,
        name,
        started,
        node,
    })
}

/// Open a range named by the bytes `name` (a C string's, UTF-8 checked only the first time
/// the thread sees them).
pub fn open_bytes(domain: NameId, name: &[u8], started: u64) -> i32 {
    check_thread_name();
    let parent = current();
    let name = recent_name_bytes(name);
    let node = child(parent, domain, name);
    enter(Open {
        domain,
        name,
        started,
        node,
    })
}

/// Open a range named by the string `name` with `category` of `domain` (see
/// [`categorized`]).
pub fn open_str_categorized(domain: NameId, category: u32, name: &str, started: u64) -> i32 {
    check_thread_name();
    let parent = current();
    let name = categorized(domain, category, recent_name(name));
    let node = child(parent, domain, name);
    enter(Open {
        domain,
        name,
        started,
        node,
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

fn close(which: impl Fn(&Open) -> bool, domain: NameId) -> i32 {
    OPEN.try_with(|open| {
        let mut open = open.borrow_mut();
        let Some(at) = open.iter().rposition(&which) else {
            return -1;
        };
        let level = open[..at].iter().filter(|o| o.domain == domain).count() as i32;
        let gone = open.remove(at);
        if crate::trace::annotations::on() {
            crate::trace::annotations::record(false, gone.domain, gone.name, gone.node);
        }
        if at < open.len() {
            // A range closed under others: re-derive the paths above it.
            let mut t = TABLE.lock();
            let mut parent = at.checked_sub(1).map_or_else(base, |i| open[i].node);
            for o in open[at..].iter_mut() {
                o.node = t.child(parent, o.domain, o.name);
                parent = o.node;
            }
        }
        CURRENT.with(|c| c.set(open.last().map_or_else(base, |o| o.node)));
        level
    })
    .unwrap_or(-1)
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
