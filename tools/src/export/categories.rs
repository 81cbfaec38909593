//! The category of each exported allocation: the one `cushim summary --by category` counts
//! its bytes in, from the same classifier (`analyze::category`), never a second copy of
//! its rules.
//!
//! Policy: the classifier of a device needs its whole trace before the first answer (an
//! allocation's category depends on the phase around it and on whether it is freed in its
//! own phase run), so it is built first, from the input's model: a snapshot's, or a log's
//! (`analyze::log_model`: the events stay in the file and are read again). What it holds
//! is bounded by the phase runs and one bit per event, never the events. The export's walk
//! then asks for each event in order; the rows of frees carry the category of the block
//! they free (the walk's tracker keeps it beside the block's site).
//!
//! A log's event names its stack and its NVTX range path apart; the model joins them into
//! one stack (the frames, then the range path's mark) through the log's stack map, which
//! is how the classifier sees a log's ranges: the same lookup is made here.

use crate::analyze::category::{classifier, names, CatId, Classifier};
use crate::analyze::category_rules::UserRule;
use crate::analyze::event_list::{EventList, StackMap};
use crate::analyze::model::Snapshot;
use crate::analyze::timeline::Start;
use cushim::trace::event::Action;
use parquet::data_type::ByteArray;

/// Each device's classifier and how many of its events were asked about.
pub struct Categories<'m> {
    devices: Vec<(i32, Classifier<'m>, usize)>,
    /// A log's stack map (log stack and range path -> the model's stack).
    stack_map: Option<&'m StackMap>,
    names: Vec<ByteArray>,
}

impl<'m> Categories<'m> {
    /// The classifiers of every device of `model`, the user's rules before the built-in ones.
    pub fn new(model: &'m Snapshot, user: &'m [UserRule]) -> Categories<'m> {
        let mut devices = Vec::new();
        let mut stack_map = None;
        for dev in model.devices.iter().chain(model.host.iter()) {
            if let EventList::Log(l) = &dev.events {
                stack_map = Some(&l.log.stacks);
            }
            devices.push((dev.ordinal as i32, classifier(model, dev, user), 0));
        }
        Categories {
            devices,
            stack_map,
            names: names(user)
                .iter()
                .map(|n| ByteArray::from(n.as_bytes().to_vec()))
                .collect(),
        }
    }

    /// No classifiers: every answer is `None` (a writer that shows no categories).
    pub fn none() -> Categories<'m> {
        Categories {
            devices: Vec::new(),
            stack_map: None,
            names: Vec::new(),
        }
    }

    /// The trace's start on `device` (the blocks live before its first event).
    pub fn start(&self, device: i32) -> Option<&Start> {
        self.devices
            .iter()
            .find(|d| d.0 == device)
            .map(|d| &d.1.start)
    }

    /// The next event of `device` (with its input's stack id and range path id): the
    /// category of the block it allocates, for an allocation; `None` otherwise.
    pub fn next(&mut self, device: i32, action: Action, stack: u32, range: u32) -> Option<CatId> {
        let list = match self.stack_map {
            Some(m) => m.get_in(stack, range).unwrap_or(0),
            None => stack,
        };
        let (_, c, seen) = self.devices.iter_mut().find(|d| d.0 == device)?;
        let i = *seen;
        *seen += 1;
        (action == Action::Alloc).then(|| c.category(i as u32, list))
    }

    /// The category of a block live before the trace began, with stack `stack`.
    pub fn before(&mut self, device: i32, stack: u32) -> Option<CatId> {
        let (_, c, _) = self.devices.iter_mut().find(|d| d.0 == device)?;
        Some(c.category(crate::analyze::category::BEFORE, stack))
    }

    /// A category's name, as the summary prints it.
    pub fn name(&self, cat: CatId) -> Option<&ByteArray> {
        self.names.get(cat as usize)
    }
}
