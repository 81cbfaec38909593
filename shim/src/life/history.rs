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
        History {
            conf,
            skip: SkipRange::of_module_containing(History::from_env as *const () as usize),
        }
    }

    /// The trace ring for device `dev` (`-1`: pinned host memory), or a `NullSink` when
    /// nothing is recorded there (the start-up wraps it for the event log).
    pub fn ring_sink(&self, dev: i32) -> Box<dyn EventSink> {
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
