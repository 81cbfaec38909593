//! `FakeDevice`: the bookkeeping device of `cushim replay` ([`ReplayDevice`]) with fault
//! injection, for the engine's tests and benchmarks.
//!
//! Policy: fault injection is test-only, so it lives here and not in the shipped tools: a
//! plan is armed per call kind ([`Op`]) as "fail `count` calls starting with the `nth` next
//! one"; a later arming of the same kind replaces the earlier one, and a plan is forgotten
//! once its calls have failed. A failed call still counts in [`Counters`].

use std::collections::HashMap;

use cushim_tools::replay_device::{ArmFaults, Faults, ReplayDevice};
pub use cushim_tools::replay_device::{Counters, Op};

/// The fake device set: a [`ReplayDevice`] whose calls fail as armed (`fail_nth`,
/// `fail_calls`).
pub type FakeDevice = ReplayDevice<Injected>;

/// Armed faults: per call kind, (calls before the first failing one + 1, failing calls left).
#[derive(Debug, Default)]
pub struct Injected {
    plans: HashMap<Op, (u64, u64)>,
}

impl ArmFaults for Injected {
    fn arm(&mut self, op: Op, nth: u64, count: u64) {
        self.plans.insert(op, (nth, count));
    }
}

impl Faults for Injected {
    fn fault(&mut self, op: Op) -> bool {
        let Some((nth, count)) = self.plans.get_mut(&op) else {
            return false;
        };
        if *nth > 1 {
            *nth -= 1;
            return false;
        }
        *count -= 1;
        if *count == 0 {
            self.plans.remove(&op);
        }
        true
    }
}
