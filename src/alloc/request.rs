//! `Request`: one allocation request as the malloc sequence carries it down, from the
//! program's size to the block that serves it.
//!
//! Policy: the request is built once per path by [`Request::new`] (the size rounded as
//! PyTorch rounds it, and the pool it is served from), and every step below reads that
//! value, so no step can round again or pick the other pool. Plain `Copy` data, passed by
//! reference. Where it is built: on the cached path (the deferred block) inside `malloc`,
//! and otherwise at the head of the out-of-line full sequence, which takes the program's
//! three values; a request built before that call would have to be written to memory for
//! it on every cached malloc as well (BENCHMARKS.md, "Measurements behind design choices").

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
