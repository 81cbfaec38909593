//! The allocator's actions, named as PyTorch's snapshot names them: the one vocabulary that
//! the history settings (`config::history`, which actions to record) and the recorded events
//! (`trace::event`) share.
//!
//! Invariant: a leaf module (it imports nothing from the crate), so `config` and `trace` both
//! build on it without importing each other in a circle.

/// Trace actions, named as PyTorch's snapshot names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    /// Sleep mode paused a block: its address is kept, its device memory released.
    Pause,
    /// Sleep mode mapped a paused block again.
    Resume,
}

impl Action {
    /// Every action, in declaration order.
    pub const ALL: [Action; 11] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
        Action::Snapshot,
        Action::Pause,
        Action::Resume,
    ];

    /// The name in a snapshot's `device_traces` (`"alloc"`, `"free_requested"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Pause => "pause",
            Action::Resume => "resume",
        }
    }

    /// Parse a snapshot action name.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }

    /// A bit for sets of actions (`skip_actions`).
    pub fn bit(self) -> u16 {
        1 << (self as u8)
    }
}
