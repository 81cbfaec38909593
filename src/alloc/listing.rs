//! The allocator's segment listing (`SegmentInfo`), as snapshots and tests read it.
//!
//! Invariant: the listing is taken under the device's lock and describes exactly the state
//! after the last recorded event: one entry per ordinary segment and per contiguous mapped
//! range of a reservation, blocks contiguous and summing to the segment's size.

use super::block::State;
use super::caching::DeviceState;
use super::info::{BlockInfo, BlockState, SegmentInfo};

impl DeviceState {
    /// Every segment, ordinary ones in address order first, then expandable ranges.
    pub(crate) fn segments_info(&self) -> Vec<SegmentInfo> {
        let mut out = Vec::with_capacity(self.segments.len());
        for (&addr, seg) in &self.segments {
            let mut blocks = Vec::new();
            let mut cur = Some(seg.head);
            while let Some(id) = cur {
                let b = &self.blocks[id];
                let state = match b.state {
                    State::Allocated => BlockState::ActiveAllocated,
                    State::Pending => BlockState::ActivePendingFree,
                    State::Free | State::Unmapped => BlockState::Inactive,
                };
                let active = state != BlockState::Inactive;
                blocks.push(BlockInfo {
                    address: b.addr,
                    size: b.size,
                    requested_size: if active { b.requested } else { 0 },
                    state,
                    stack: if active { b.stack } else { 0 },
                });
                cur = b.next;
            }
            out.push(SegmentInfo {
                device: self.dev,
                address: addr,
                total_size: seg.size,
                stream: seg.stream,
                is_large: seg.large,
                is_expandable: false,
                pool_id: (0, 0),
                stack: seg.stack,
                blocks,
            });
        }
        self.expandable_segments(&mut out);
        out
    }
}
