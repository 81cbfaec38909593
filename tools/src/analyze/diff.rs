//! `cushim diff A B`: what changed between two runs, per device: the peaks, and the
//! allocation sites whose live bytes at the peak and at the end grew, shrank, appeared or
//! vanished, largest change first.
//!
//! Invariant: sites are compared by their name (first program frame, see `frames`), so a
//! cushim file and a PyTorch file of the same program compare site by site; a device
//! present in one input only is compared against nothing.
//!
//! Pairing devices: two files with one device each (two ranks, one GPU each: rank 0 on
//! GPU 0, rank 1 on GPU 1) are compared device to device whatever their numbers, since
//! that is what the user compares; otherwise devices are paired by number.
//! [`Pairing::ByNumber`] asks for numbers always.

use crate::analyze::model::{Device, Snapshot};
use crate::analyze::sites::{by_site, SiteRow};
use crate::analyze::summary::mib;
use crate::analyze::timeline::{peaks_and_end, start_of, state_after, Peaks};
use crate::analyze::units::signed_mib2;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One site's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub site: String,
    pub a: u64,
    pub b: u64,
}

impl Change {
    pub fn delta(&self) -> i128 {
        i128::from(self.b) - i128::from(self.a)
    }
    pub fn verdict(&self) -> &'static str {
        match (self.a, self.b) {
            (0, _) => "appeared",
            (_, 0) => "vanished",
            (a, b) if b > a => "grew",
            _ => "shrank",
        }
    }
}

/// One device's comparison.
#[derive(Debug, Clone)]
pub struct DeviceDiff {
    pub ordinal: i64,
    /// The device of B compared with `ordinal` of A, when it has another number.
    pub b_ordinal: Option<i64>,
    pub a: Peaks,
    pub b: Peaks,
    pub at_peak: Vec<Change>,
    pub at_end: Vec<Change>,
}

struct Side {
    peaks: Peaks,
    at_peak: Vec<SiteRow>,
    at_end: Vec<SiteRow>,
}

fn side(snap: &Snapshot, dev: Option<&Device>, depth: usize) -> Side {
    let Some(dev) = dev else {
        return Side {
            peaks: Peaks::default(),
            at_peak: Vec::new(),
            at_end: Vec::new(),
        };
    };
    let st = start_of(snap, dev);
    let (p, at_end) = peaks_and_end(dev, &st);
    let at_peak = state_after(dev, &st, p.allocated_at);
    Side {
        peaks: p,
        at_peak: by_site(&snap.stacks, at_peak.allocated.values(), depth),
        at_end: by_site(&snap.stacks, at_end.allocated.values(), depth),
    }
}

fn changes(a: &[SiteRow], b: &[SiteRow]) -> Vec<Change> {
    let mut m: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for r in a {
        m.entry(&r.site).or_default().0 = r.bytes;
    }
    for r in b {
        m.entry(&r.site).or_default().1 = r.bytes;
    }
    let mut out: Vec<Change> = m
        .into_iter()
        .filter(|(_, (a, b))| a != b)
        .map(|(s, (a, b))| Change {
            site: s.to_string(),
            a,
            b,
        })
        .collect();
    out.sort_by(|x, y| {
        y.delta()
            .abs()
            .cmp(&x.delta().abs())
            .then_with(|| x.site.cmp(&y.site))
    });
    out
}

/// How the devices of two files are paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pairing {
    /// One device each: those two; otherwise by number.
    #[default]
    Auto,
    /// Device N with device N.
    ByNumber,
}

fn only_device(s: &Snapshot) -> Option<&Device> {
    let mut used = s.devices.iter().filter(|d| !d.is_empty());
    let one = used.next()?;
    used.next().is_none().then_some(one)
}

/// Compare `a` with `b`, sites named with `depth` frames, devices paired as the user
/// means ([`Pairing::Auto`]).
pub fn diff(a: &Snapshot, b: &Snapshot, depth: usize) -> Vec<DeviceDiff> {
    diff_paired(a, b, depth, Pairing::Auto)
}

/// Compare `a` with `b`, devices paired by `pairing`.
pub fn diff_paired(a: &Snapshot, b: &Snapshot, depth: usize, pairing: Pairing) -> Vec<DeviceDiff> {
    if pairing == Pairing::Auto {
        if let (Some(da), Some(db)) = (only_device(a), only_device(b)) {
            let sa = side(a, Some(da), depth);
            let sb = side(b, Some(db), depth);
            return vec![DeviceDiff {
                ordinal: da.ordinal,
                b_ordinal: (db.ordinal != da.ordinal).then_some(db.ordinal),
                a: sa.peaks,
                b: sb.peaks,
                at_peak: changes(&sa.at_peak, &sb.at_peak),
                at_end: changes(&sa.at_end, &sb.at_end),
            }];
        }
    }
    let mut ords: Vec<i64> = a
        .devices
        .iter()
        .chain(b.devices.iter())
        .filter(|d| !d.is_empty())
        .map(|d| d.ordinal)
        .collect();
    ords.sort_unstable();
    ords.dedup();
    ords.into_iter()
        .map(|o| {
            let sa = side(a, a.device(o), depth);
            let sb = side(b, b.device(o), depth);
            DeviceDiff {
                ordinal: o,
                b_ordinal: None,
                a: sa.peaks,
                b: sb.peaks,
                at_peak: changes(&sa.at_peak, &sb.at_peak),
                at_end: changes(&sa.at_end, &sb.at_end),
            }
        })
        .collect()
}

/// The text `cushim diff` prints (at most `top` sites per list).
pub fn render(diffs: &[DeviceDiff], top: usize) -> String {
    let mut out = String::new();
    if diffs.is_empty() {
        out.push_str("no device memory in either input\n");
    }
    for d in diffs {
        match d.b_ordinal {
            None => {
                let _ = writeln!(out, "device {}:", d.ordinal);
            }
            Some(b) => {
                let _ = writeln!(
                    out,
                    "device {} (A) vs device {b} (B): each file has one device, so they are \
                     compared (--by-number pairs devices by number):",
                    d.ordinal
                );
            }
        }
        let _ = writeln!(
            out,
            "  peak allocated: {} -> {} ({})",
            mib(d.a.allocated),
            mib(d.b.allocated),
            signed_mib2(i128::from(d.b.allocated) - i128::from(d.a.allocated))
        );
        let _ = writeln!(
            out,
            "  peak reserved:  {} -> {} ({})",
            mib(d.a.reserved),
            mib(d.b.reserved),
            signed_mib2(i128::from(d.b.reserved) - i128::from(d.a.reserved))
        );
        for (title, list) in [("at the peak", &d.at_peak), ("at the end", &d.at_end)] {
            if list.is_empty() {
                let _ = writeln!(out, "  live bytes per site {title}: no change");
                continue;
            }
            let _ = writeln!(out, "  live bytes per site {title}:");
            for c in list.iter().take(top) {
                let _ = writeln!(
                    out,
                    "    {:>9} {:>14}  {} -> {}  {}",
                    c.verdict(),
                    signed_mib2(c.delta()),
                    mib(c.a),
                    mib(c.b),
                    c.site
                );
            }
        }
    }
    out
}
