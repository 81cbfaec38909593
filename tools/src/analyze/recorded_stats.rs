//! The allocator's own statistics a snapshot carries (`cushim.stats.devices[d]`, PyTorch's
//! key names), read for the figures a trace cannot give: the peaks of a run recorded with
//! history off, or whose trace covers only its last part.
//!
//! Policy: "peak allocated" is one figure everywhere (`demo`, `summary`, `report`,
//! `replay`'s recorded row): PyTorch's `allocated_bytes.all.peak`, the most bytes at once in
//! blocks the program holds (block sizes as rounded by the allocator; a block freed by the
//! program is no longer allocated, even while its free waits for other streams). It is
//! taken from the recorded statistics when the snapshot has them (they cover the whole
//! run), else from the trace walked forward (the recorded window only); [`PeakSource`]
//! says which, and the output names it.

use crate::analyze::model::Snapshot;

/// Where a peak figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeakSource {
    /// The allocator's statistics (`allocated_bytes.all.peak`): the whole run.
    #[default]
    Stats,
    /// The trace walked forward: the recorded window.
    Trace,
    /// No trace and no statistics: the segments at the snapshot's own moment, all there is
    /// (an earlier, higher peak would not show).
    Segments,
}

impl PeakSource {
    /// How the output names the figure's source.
    pub fn describe(self) -> &'static str {
        match self {
            PeakSource::Stats => "allocator statistics, whole run",
            PeakSource::Trace => "from the trace",
            PeakSource::Segments => "no trace: the snapshot's own moment",
        }
    }
}

/// Recorded peaks of one device: `(allocated_bytes.all.peak, reserved_bytes.all.peak)`.
pub fn recorded_peaks(snap: &Snapshot, ordinal: i64) -> Option<(u64, u64)> {
    let stats = snap.cushim.as_ref()?.get("stats")?;
    let dev = if ordinal < 0 {
        stats.get("host")?
    } else {
        stats
            .get("devices")?
            .as_seq()?
            .get(usize::try_from(ordinal).ok()?)?
    };
    let int = |k: &str| {
        dev.get(k)
            .and_then(|v| v.as_i64())
            .and_then(|i| u64::try_from(i).ok())
    };
    let a = int("allocated_bytes.all.peak").or_else(|| int("allocated_bytes.peak"))?;
    let r = int("reserved_bytes.all.peak")
        .or_else(|| int("reserved_bytes.peak"))
        .unwrap_or(0);
    Some((a, r))
}
