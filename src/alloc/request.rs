//! `Request`: one allocation request as the malloc sequence carries it down, from the
//! program's size to the block that serves it.
//!
//! Policy: the request is decided once, at the top of `malloc` (the size rounded as
//! PyTorch rounds it, and the pool it is served from), and every step below reads the same
//! value, so no step can round again or pick the other pool. Plain `Copy` data, passed by
//! reference: building it allocates nothing and the steps inline as before.

use super::rounding::{is_small, round_size};
use crate::config::alloc::AllocConf;
use crate::device::Stream;
use crate::trace::event::StackId;

/// One allocation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    /// The bytes the program asked for (what `requested_bytes` and the history record).
    pub size: u64,
    /// `size` rounded (`rounding::round_size`): what the serving block must hold.
    pub rounded: u64,
    /// Served from the large pool (else the small one).
    pub large: bool,
    /// The stream the block is allocated on.
    pub stream: Stream,
    /// The program's stack at the call (`NO_STACK` without history).
    pub stack: StackId,
}

impl Request {
    /// The request for `size` bytes on `stream` under `conf`'s rounding.
    #[inline]
    pub(crate) fn new(conf: &AllocConf, size: u64, stream: Stream, stack: StackId) -> Request {
        let rounded = round_size(size, conf);
        Request {
            size,
            rounded,
            large: !is_small(rounded),
            stream,
            stack,
        }
    }
}
