//! The allocator's segment listing (`SegmentInfo`), as snapshots and tests read it.
//!
//! Invariant: the listing is taken under the device's lock and describes exactly the state
//! after the last recorded event: one entry per ordinary segment and per contiguous mapped
//! range of a reservation, blocks contiguous and summing to the segment's size.

use super::block::State;
use super::caching::DeviceState;
use super::info::{BlockInfo, BlockState, SegmentInfo};
use crate::device::DevPtr;

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

    /// One `SegmentInfo` per contiguous mapped range of every reservation.
    pub(crate) fn expandable_segments(&self, out: &mut Vec<SegmentInfo>) {
        for res in &self.exp.list {
            let mut cur = Some(res.head);
            let mut seg: Option<SegmentInfo> = None;
            while let Some(id) = cur {
                let b = &self.blocks[id];
                cur = b.next;
                let state = match b.state {
                    State::Unmapped => {
                        out.extend(seg.take());
                        continue;
                    }
                    State::Free => BlockState::Inactive,
                    State::Allocated => BlockState::ActiveAllocated,
                    State::Pending => BlockState::ActivePendingFree,
                };
                let s = seg.get_or_insert_with(|| SegmentInfo {
                    device: self.dev,
                    address: b.addr,
                    total_size: 0,
                    stream: res.stream,
                    is_large: res.large,
                    is_expandable: true,
                    pool_id: (0, 0),
                    stack: res
                        .pages
                        .range(..=b.addr)
                        .next_back()
                        .map(|(_, p)| p.stack)
                        .unwrap_or(0),
                    blocks: Vec::new(),
                });
                s.total_size += b.size;
                s.blocks.push(BlockInfo {
                    address: b.addr,
                    size: b.size,
                    requested_size: if state == BlockState::Inactive {
                        0
                    } else {
                        b.requested
                    },
                    state,
                    stack: if state == BlockState::Inactive {
                        0
                    } else {
                        b.stack
                    },
                });
            }
            out.extend(seg.take());
        }
    }

    /// Every mapped page of this device as (address, size), in reservation order.
    pub(crate) fn expandable_pages(&self) -> Vec<(DevPtr, u64)> {
        self.exp
            .list
            .iter()
            .flat_map(|r| r.pages.iter().map(|(&a, p)| (a, p.size)))
            .collect()
    }
}
