//! What the shim records: the parsed `CUSHIM_HISTORY`, one trace ring per device (and one for
//! pinned memory when `record_host`), and stack capture at the program's call site.
//!
//! Invariants: with history unset nothing is captured and every sink is a `NullSink`; a stack
//! is captured before the allocator's lock is taken (never under it), skipping the frames of
//! libcushim.so itself so the first frame is the program's call site.

use cushim::config::history::HistoryConf;
use cushim::trace::event::{EventSink, NullSink, StackId, NO_STACK};
use cushim::trace::intern::StackTable;
use cushim::trace::python::capture_id;
use cushim::trace::ring::TraceRing;
use cushim::trace::stack::SkipRange;

/// History configuration plus what capture needs.
pub struct History {
    pub conf: HistoryConf,
    skip: SkipRange,
}

impl History {
    pub fn from_env() -> History {
        let conf = HistoryConf::from_env();
        StackTable::global().set_limit(conf.max_stacks);
        cushim::trace::module_epochs::set_tracking(conf.alloc_stacks() || conf.free_stacks());
        if conf.records_history() {
            cushim::trace::annotations::enable(conf.max_entries, annotation_device);
        }
        History {
            conf,
            skip: SkipRange::of_module_containing(History::from_env as *const () as usize),
        }
    }

    /// The event sink for device `dev` (`-1`: pinned host memory), logging every event
    /// when `CUSHIM_LOG` is set.
    pub fn make_sink(&self, dev: i32) -> Box<dyn EventSink> {
        crate::life::log_writer::wrap(self.ring_sink(dev))
    }

    fn ring_sink(&self, dev: i32) -> Box<dyn EventSink> {
        let c = &self.conf;
        if dev < 0 {
            if c.record_host && c.records_history() {
                return Box::new(TraceRing::for_host(c));
            }
            return Box::new(NullSink);
        }
        if c.record_cuda && c.records_history() {
            Box::new(TraceRing::for_device(c))
        } else {
            Box::new(NullSink)
        }
    }

    /// The stack of an allocation call, if recorded.
    #[inline]
    pub fn alloc_stack(&self) -> StackId {
        if self.conf.alloc_stacks() {
            capture_id(&self.conf, &self.skip)
        } else {
            NO_STACK
        }
    }

    /// The stack of a free call, if recorded.
    #[inline]
    pub fn free_stack(&self) -> StackId {
        if self.conf.free_stacks() {
            capture_id(&self.conf, &self.skip)
        } else {
            NO_STACK
        }
    }
}

/// The device an NVTX range start or end is recorded on: the one the shim allocates on for
/// the calling thread (0 before the shim's state exists).
pub fn annotation_device() -> i32 {
    crate::life::state::get_if_ready().map_or(0, crate::life::state::alloc_device)
}
