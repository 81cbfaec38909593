//! A plain-data view of the allocator's segments and blocks, for snapshots, tests and the
//! C API. Produced by the allocator under its lock; consumed by `snapshot` without it.
//!
//! Invariant: the blocks of a `SegmentInfo` are sorted by address, contiguous, and their
//! sizes sum to `total_size`.

use crate::trace::event::StackId;

/// State of a block, as PyTorch's snapshot names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Handed to the program.
    ActiveAllocated,
    /// Freed by the program, not yet reusable (work queued before the free may still use it).
    ActivePendingFree,
    /// Cached and free.
    Inactive,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub address: u64,
    pub size: u64,
    /// The size the program asked for (0 for free blocks).
    pub requested_size: u64,
    pub state: BlockState,
    /// Stack of the allocation that made the block what it is (0 if none).
    pub stack: StackId,
}

/// One segment: a `cuMemAlloc` range, or one contiguous mapped range of an expandable
/// reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Device ordinal, `-1` for pinned host memory.
    pub device: i32,
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    /// Large pool (> 1 MiB requests) or small pool.
    pub is_large: bool,
    pub is_expandable: bool,
    /// Memory pool id (PyTorch's `segment_pool_id`); `(0, 0)` for the default pool.
    pub pool_id: (u64, u64),
    /// Stack of the allocation that created the segment.
    pub stack: StackId,
    pub blocks: Vec<BlockInfo>,
}

impl SegmentInfo {
    /// Bytes in `ActiveAllocated` blocks.
    pub fn allocated_size(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum()
    }

    /// Bytes in active (allocated or pending-free) blocks.
    pub fn active_size(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| b.size)
            .sum()
    }

    /// Requested bytes of active blocks.
    pub fn requested_size(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| b.requested_size)
            .sum()
    }
}
