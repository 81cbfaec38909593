//! `CUSHIM_HISTORY`: the semantics of `torch.cuda.memory._record_memory_history`.
//!
//! Invariant: a `HistoryConf` is always self-consistent: unset or unparsable means
//! everything off (no history, no stacks); `enabled=all` without further keys gives
//! PyTorch's defaults (`context=all`, `stacks=all`, a large `max_entries`).
//!
//! Syntax: comma-separated `key=value` pairs (`key:value` is accepted too). Keys:
//! `enabled=none|state|all`, `context=none|state|alloc|all`, `stacks=none|python|native|all`
//! (`all`: Python frames merged into native ones, `trace::python`), `max_entries=N`, `skip_actions=a;b` (actions separated by `;` or
//! `|`, never `,`, which separates keys), `record_host=true|false`,
//! `record_cuda=true|false`, `unwinder=dwarf|fp`, `max_frames=N`, `max_stacks=N` (the cap
//! on distinct interned stacks, `trace::intern`).

use crate::action::Action;

/// `max_entries` when not given. PyTorch uses `sys.maxsize`; a ring that large can never be
/// pre-sized, so cushim keeps the newest million events (about 48 MB of ring).
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

/// `max_frames` when not given.
pub const DEFAULT_MAX_FRAMES: usize = 64;

/// `max_stacks` when not given: distinct stacks kept for the life of the process. At most
/// `max_frames` 8-byte frames plus about 40 bytes of index each, so 2^17 stacks of 64
/// frames are at most about 72 MB (typical stacks of 10-30 frames: 15-35 MB). Programs
/// rarely have more than a few thousand call sites; one that generates stacks without end
/// (recursion of varying depth, JIT code) keeps its first 2^17 and counts the rest as dropped.
pub const DEFAULT_MAX_STACKS: usize = 1 << 17;

/// The upper bound accepted for `max_stacks` (stack ids are 32-bit).
pub const MAX_MAX_STACKS: usize = u32::MAX as usize - 1;

/// The upper bound accepted for `max_frames`.
pub const MAX_MAX_FRAMES: usize = 1024;

/// What is recorded into the ring (`enabled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enabled {
    /// Nothing.
    None,
    /// No trace events; blocks still carry the stack of their allocation.
    State,
    /// Trace events and block stacks.
    All,
}

/// Which stacks are kept (`context`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// No stacks anywhere.
    None,
    /// Stacks on the live state (blocks and segments) only; trace entries carry no frames.
    State,
    /// Stacks on state and on `alloc`-type trace entries.
    Alloc,
    /// Stacks on everything, frees included.
    All,
}

/// Stack unwinder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwinder {
    /// DWARF CFI via the `backtrace` crate (works without frame pointers).
    Dwarf,
    /// Walk the frame-pointer chain (cheap; needs `-fno-omit-frame-pointer`).
    Fp,
}

/// Parsed `CUSHIM_HISTORY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConf {
    pub enabled: Enabled,
    pub context: Context,
    /// Stacks captured at all (`stacks=native|python|all`).
    pub native_stacks: bool,
    /// Python frames merged in where the interpreter runs (`stacks=python|all`), when the
    /// allocating thread runs Python code and holds the GIL (`trace::python`).
    pub python_stacks: bool,
    /// Native frames kept (all but `stacks=python`).
    pub native_frames: bool,
    pub max_entries: usize,
    /// Bit set of [`Action::bit`] values not recorded.
    pub skip_actions: u16,
    pub record_host: bool,
    pub record_cuda: bool,
    pub unwinder: Unwinder,
    pub max_frames: usize,
    /// Cap on distinct interned stacks (`trace::intern`'s policy).
    pub max_stacks: usize,
}

impl HistoryConf {
    /// Everything off: the allocator alone.
    pub fn off() -> HistoryConf {
        HistoryConf {
            enabled: Enabled::None,
            context: Context::None,
            native_stacks: false,
            python_stacks: false,
            native_frames: true,
            max_entries: DEFAULT_MAX_ENTRIES,
            skip_actions: 0,
            record_host: false,
            record_cuda: false,
            unwinder: Unwinder::Dwarf,
            max_frames: DEFAULT_MAX_FRAMES,
            max_stacks: DEFAULT_MAX_STACKS,
        }
    }

    /// Read `CUSHIM_HISTORY`. Unset or empty: off. A parse error prints one `cushim:` line
    /// on stderr and turns recording off.
    pub fn from_env() -> HistoryConf {
        match std::env::var("CUSHIM_HISTORY") {
            Ok(s) if !s.trim().is_empty() => match parse(&s) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("cushim: CUSHIM_HISTORY: {e}; history recording is off");
                    HistoryConf::off()
                }
            },
            _ => HistoryConf::off(),
        }
    }

    /// Trace events go into the ring.
    pub fn records_history(&self) -> bool {
        self.enabled == Enabled::All
    }

    /// Anything at all (history or state stacks) is on.
    pub fn any(&self) -> bool {
        self.enabled != Enabled::None
    }

    /// A stack is captured at malloc (blocks carry the stack of their allocation).
    pub fn alloc_stacks(&self) -> bool {
        self.enabled != Enabled::None && self.native_stacks && self.context != Context::None
    }

    /// A stack is captured at free too (`context=all`, with history on).
    pub fn free_stacks(&self) -> bool {
        self.records_history() && self.native_stacks && self.context == Context::All
    }

    /// Whether trace entries of `action` carry frames in a snapshot.
    pub fn trace_frames_for(&self, action: Action) -> bool {
        if !self.native_stacks {
            return false;
        }
        match self.context {
            Context::None | Context::State => false,
            Context::Alloc => matches!(
                action,
                Action::Alloc | Action::SegmentAlloc | Action::SegmentMap
            ),
            Context::All => true,
        }
    }

    /// Whether the live state (blocks and segments) carries frames in a snapshot.
    pub fn state_frames(&self) -> bool {
        self.alloc_stacks()
    }

    /// Whether `action` is recorded (not in `skip_actions`).
    pub fn records(&self, action: Action) -> bool {
        self.records_history() && self.skip_actions & action.bit() == 0
    }
}

impl Default for HistoryConf {
    fn default() -> Self {
        HistoryConf::off()
    }
}

fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("{key}={v}: expected true or false")),
    }
}

fn parse_count(key: &str, v: &str, max: usize) -> Result<usize, String> {
    let n: usize = v
        .parse()
        .map_err(|_| format!("{key}={v}: expected a positive integer"))?;
    if n == 0 || n > max {
        return Err(format!("{key}={v}: expected 1..={max}"));
    }
    Ok(n)
}

/// Parse a `CUSHIM_HISTORY` value (see the module comment for the syntax).
pub fn parse(s: &str) -> Result<HistoryConf, String> {
    let mut c = HistoryConf::off();
    let mut context: Option<Context> = None;
    let mut stacks: Option<bool> = None;
    let mut kinds: Option<(bool, bool)> = None;
    let mut record_cuda: Option<bool> = None;
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .or_else(|| item.split_once(':'))
            .ok_or_else(|| format!("`{item}`: expected key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        match key {
            "enabled" => {
                c.enabled = match value {
                    "none" | "None" | "false" | "False" => Enabled::None,
                    "state" => Enabled::State,
                    "all" | "true" | "True" => Enabled::All,
                    _ => return Err(format!("enabled={value}: expected none, state or all")),
                }
            }
            "context" => {
                context = Some(match value {
                    "none" | "None" => Context::None,
                    "state" => Context::State,
                    "alloc" => Context::Alloc,
                    "all" => Context::All,
                    _ => {
                        return Err(format!(
                            "context={value}: expected none, state, alloc or all"
                        ))
                    }
                })
            }
            "stacks" => {
                // (captured, python frames, native frames)
                let (on, py, native) = match value {
                    "none" | "None" => (false, false, true),
                    "python" => (true, true, false),
                    "native" | "cpp" => (true, false, true),
                    "all" => (true, true, true),
                    _ => {
                        return Err(format!(
                            "stacks={value}: expected none, python, native or all"
                        ))
                    }
                };
                stacks = Some(on);
                kinds = Some((py, native));
            }
            "max_entries" => c.max_entries = parse_count(key, value, usize::MAX)?,
            "max_frames" => c.max_frames = parse_count(key, value, MAX_MAX_FRAMES)?,
            "max_stacks" => c.max_stacks = parse_count(key, value, MAX_MAX_STACKS)?,
            "skip_actions" => {
                c.skip_actions = 0;
                for name in value
                    .split([';', '|'])
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                {
                    let a = Action::from_name(name).ok_or_else(|| {
                        let all: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
                        format!(
                            "skip_actions: unknown action `{name}` (one of {})",
                            all.join(", ")
                        )
                    })?;
                    c.skip_actions |= a.bit();
                }
            }
            "record_host" => c.record_host = parse_bool(key, value)?,
            "record_cuda" => record_cuda = Some(parse_bool(key, value)?),
            "unwinder" => {
                c.unwinder = match value {
                    "dwarf" => Unwinder::Dwarf,
                    "fp" => Unwinder::Fp,
                    _ => return Err(format!("unwinder={value}: expected dwarf or fp")),
                }
            }
            _ => {
                return Err(format!(
                    "unknown key `{key}` (enabled, context, stacks, max_entries, skip_actions, \
                     record_host, record_cuda, unwinder, max_frames, max_stacks)"
                ))
            }
        }
    }
    // PyTorch's defaults: with recording on, context=all and stacks on unless said otherwise.
    let on = c.enabled != Enabled::None;
    c.context = context.unwrap_or(if on { Context::All } else { Context::None });
    c.native_stacks = stacks.unwrap_or(on);
    // PyTorch's default is `all`: Python frames where there are any, and native frames.
    (c.python_stacks, c.native_frames) = kinds.unwrap_or((c.native_stacks, true));
    c.record_cuda = record_cuda.unwrap_or(on);
    if !on {
        c = HistoryConf {
            max_entries: c.max_entries,
            ..HistoryConf::off()
        };
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_none_means_everything_off() {
        let c = parse("enabled=none,context=all").unwrap();
        assert!(!c.any() && !c.records_history() && !c.alloc_stacks());
        assert_eq!(HistoryConf::off(), HistoryConf::default());
    }

    #[test]
    fn enabled_all_gives_pytorch_defaults() {
        let c = parse("enabled=all").unwrap();
        assert_eq!(c.context, Context::All);
        assert!(c.native_stacks && c.record_cuda && !c.record_host);
        assert_eq!(c.max_entries, DEFAULT_MAX_ENTRIES);
        assert_eq!(c.max_frames, DEFAULT_MAX_FRAMES);
        assert!(c.free_stacks() && c.trace_frames_for(Action::FreeCompleted));
    }

    #[test]
    fn full_design_example_parses() {
        let c = parse(
            "enabled=all,context=all,stacks=native,max_entries=100000,\
             skip_actions=free_requested,record_host=true,record_cuda=true",
        )
        .unwrap();
        assert_eq!(c.max_entries, 100_000);
        assert!(!c.records(Action::FreeRequested) && c.records(Action::Alloc));
        assert!(c.record_host);
    }

    #[test]
    fn skip_actions_accepts_semicolon_and_pipe() {
        let c = parse("enabled=all,skip_actions=alloc;oom|segment_map").unwrap();
        for a in [Action::Alloc, Action::Oom, Action::SegmentMap] {
            assert!(!c.records(a), "{a:?}");
        }
        assert!(c.records(Action::SegmentAlloc));
    }

    #[test]
    fn context_controls_which_entries_carry_frames() {
        let s = parse("enabled=all,context=state").unwrap();
        assert!(s.alloc_stacks() && !s.free_stacks() && !s.trace_frames_for(Action::Alloc));
        let a = parse("enabled=all,context=alloc").unwrap();
        assert!(a.trace_frames_for(Action::Alloc) && !a.trace_frames_for(Action::FreeRequested));
        assert!(!a.free_stacks());
        let n = parse("enabled=all,stacks=none").unwrap();
        assert!(!n.alloc_stacks() && !n.trace_frames_for(Action::Alloc));
    }

    #[test]
    fn stacks_python_native_and_all_select_the_frames_kept() {
        let f = |v: &str| {
            let c = parse(&format!("enabled=all,stacks={v}")).unwrap();
            (c.native_stacks, c.python_stacks, c.native_frames)
        };
        assert_eq!(f("all"), (true, true, true));
        assert_eq!(f("python"), (true, true, false));
        assert_eq!(f("native"), (true, false, true));
        assert_eq!(f("none"), (false, false, true));
        let d = parse("enabled=all").unwrap();
        assert!(
            d.python_stacks && d.native_frames,
            "PyTorch's default is all"
        );
        assert!(parse("enabled=all,stacks=pythons").is_err());
    }

    #[test]
    fn enabled_state_records_no_history_but_keeps_block_stacks() {
        let c = parse("enabled=state,stacks=all").unwrap();
        assert!(!c.records_history() && !c.records(Action::Alloc));
        assert!(c.alloc_stacks() && c.state_frames());
    }

    #[test]
    fn errors_name_the_bad_key_or_value() {
        assert!(parse("enabled=maybe")
            .unwrap_err()
            .contains("enabled=maybe"));
        assert!(parse("colour=red").unwrap_err().contains("colour"));
        assert!(parse("enabled=all,skip_actions=alloc,frob").is_err());
        assert!(parse("enabled=all,skip_actions=bogus")
            .unwrap_err()
            .contains("bogus"));
        assert!(parse("enabled=all,max_entries=0").is_err());
        assert!(parse("enabled=all,max_frames=x").is_err());
        assert!(parse("enabled=all,unwinder=guess").is_err());
    }

    #[test]
    fn unwinder_and_max_frames_parse() {
        let c = parse("enabled=all,unwinder=fp,max_frames=16").unwrap();
        assert_eq!((c.unwinder, c.max_frames), (Unwinder::Fp, 16));
    }
}
