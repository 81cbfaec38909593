//! Out-of-memory events, told as the user who opens the snapshot needs them: what was asked
//! for and from where, what the device and the cache held at that moment, what kind of
//! memory was live (categories) and where it came from (sites), and why the request failed:
//! the device was full, or the cache held enough free bytes but in pieces too small.
//!
//! A recorded `oom` entry (PyTorch's, and cushim's own) carries the request's size and, in
//! its address field, the bytes the driver reported free on the device; PyTorch records it
//! after releasing its cached segments and retrying, so the state before the entry is the
//! state that failed.
//!
//! Invariant: every figure comes from the recording; the state is the one the trace's walk
//! gives after the events before the `oom` entry, so the allocated bytes here equal
//! `summary --by category --at EVENT` of the same moment.

use crate::analyze::category::{categorize, Moment};
use crate::analyze::frames::site;
use crate::analyze::model::{Device, Snapshot};
use crate::analyze::sites::{by_site, SiteRow};
use crate::analyze::timeline::{start_of, state_after};
use crate::analyze::units::mib2;
use cushim::trace::event::Action;
use serde_json::{json, Value};

/// How many categories and sites an out-of-memory lists.
const TOP: usize = 5;

/// One recorded out-of-memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Oom {
    pub device: i64,
    /// The `oom` entry's index in the device's trace (the moment is before it).
    pub event: usize,
    pub events: usize,
    /// The request that failed, as the allocator rounded it.
    pub requested: u64,
    pub stream: u64,
    /// The request's allocation site.
    pub site: String,
    /// Bytes the driver reported free on the device.
    pub device_free: u64,
    /// The cache at that moment.
    pub allocated: u64,
    pub reserved: u64,
    pub pending_free: u64,
    /// The largest categories live then, `(name, bytes)`, largest first.
    pub categories: Vec<(String, u64)>,
    /// The largest sites live then.
    pub sites: Vec<SiteRow>,
}

impl Oom {
    /// Free bytes inside the cache's segments (reserved, neither allocated nor waiting for
    /// a stream's work before they can be reused).
    pub fn cache_free(&self) -> u64 {
        self.reserved
            .saturating_sub(self.allocated)
            .saturating_sub(self.pending_free)
    }

    /// The device's size as this moment shows it: what the cache reserved plus what the
    /// driver reported free (less than the card's size by the context and other processes).
    pub fn device_seen(&self) -> u64 {
        self.reserved.saturating_add(self.device_free)
    }

    /// Why the request failed, in one sentence.
    pub fn why(&self) -> String {
        if self.cache_free() >= self.requested {
            format!(
                "the cache held {} free, more than the request, but in pieces smaller than \
                 it: fragmentation (expandable_segments:True or a max_split_size_mb setting \
                 may fit it; `cushim fit` tries them)",
                mib2(self.cache_free())
            )
        } else {
            format!(
                "the device was full: {} more free device memory would have served it (the \
                 request less the driver's free bytes; the cache's free pieces are smaller)",
                mib2(self.requested.saturating_sub(self.device_free))
            )
        }
    }
}

/// Every out-of-memory recorded in `dev`'s trace, in order.
pub fn ooms(snap: &Snapshot, dev: &Device) -> Result<Vec<Oom>, String> {
    let at: Vec<(usize, u64, u64, u64, u32)> = dev
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Oom)
        .map(|(i, e)| (i, e.size, e.addr, e.stream, e.stack))
        .collect();
    if at.is_empty() {
        return Ok(Vec::new());
    }
    let start = start_of(snap, dev);
    let mut out = Vec::with_capacity(at.len());
    for (i, requested, device_free, stream, stack) in at {
        let state = state_after(dev, &start, i);
        let cats = categorize(snap, dev, &[], Moment::After(i))?;
        let mut categories: Vec<(String, u64)> =
            cats.rows.into_iter().filter(|r| r.1 > 0).collect();
        categories.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        categories.truncate(TOP);
        let mut sites = by_site(&snap.stacks, state.allocated.values(), 1);
        sites.truncate(TOP);
        out.push(Oom {
            device: dev.ordinal,
            event: i,
            events: dev.events.len(),
            requested,
            stream,
            site: site(&snap.stacks, stack, 1),
            device_free,
            allocated: state.allocated_bytes,
            reserved: state.reserved,
            pending_free: state.pending_bytes,
            categories,
            sites,
        });
    }
    Ok(out)
}

/// Every device's out-of-memory events.
pub fn all(snap: &Snapshot) -> Result<Vec<Oom>, String> {
    let mut out = Vec::new();
    for d in snap.devices.iter().filter(|d| !d.events.is_empty()) {
        out.extend(ooms(snap, d)?);
    }
    Ok(out)
}

/// The text `summary` prints, one block per device that ran out of memory.
pub fn render(ooms: &[Oom], file: &str) -> String {
    let mut out = String::new();
    let mut devices: Vec<i64> = ooms.iter().map(|o| o.device).collect();
    devices.dedup();
    for d in devices {
        let of: Vec<&Oom> = ooms.iter().filter(|o| o.device == d).collect();
        let times = if of.len() == 1 { "time" } else { "times" };
        out.push_str(&format!(
            "device {d}: ran out of memory {} {times}\n",
            of.len()
        ));
        for o in &of {
            out.push_str(&format!(
                "  at event {} of {}: a request of {} from {} (stream {:#x}) failed\n",
                o.event,
                o.events,
                mib2(o.requested),
                o.site,
                o.stream
            ));
            out.push_str(&format!(
                "    the driver reported {} free on a device of about {} (reserved + free)\n",
                mib2(o.device_free),
                mib2(o.device_seen())
            ));
            out.push_str(&format!(
                "    the cache held {} reserved: {} allocated, {} free inside its segments, {} \
                 waiting for streams\n",
                mib2(o.reserved),
                mib2(o.allocated),
                mib2(o.cache_free()),
                mib2(o.pending_free)
            ));
            out.push_str(&format!("    why: {}\n", o.why()));
            if !o.categories.is_empty() {
                let cats: Vec<String> = o
                    .categories
                    .iter()
                    .map(|(c, b)| format!("{c} {}", mib2(*b)))
                    .collect();
                out.push_str(&format!("    live by category: {}\n", cats.join(", ")));
            }
            if !o.sites.is_empty() {
                out.push_str("    live by site:\n");
            }
            for r in &o.sites {
                out.push_str(&format!(
                    "      {:>13}  {:>6} blocks  {}\n",
                    mib2(r.bytes),
                    r.count,
                    r.site
                ));
            }
        }
        if let Some(o) = of.first() {
            out.push_str(&format!(
                "  which settings fit this device: cushim fit {file} --device-memory {}\n",
                o.device_seen()
            ));
        }
    }
    out
}

/// One out-of-memory in `summary --json`.
pub fn to_json(o: &Oom) -> Value {
    json!({
        "event": o.event,
        "requested_bytes": o.requested,
        "stream": o.stream,
        "site": o.site,
        "device_free_bytes": o.device_free,
        "allocated_bytes": o.allocated,
        "reserved_bytes": o.reserved,
        "cache_free_bytes": o.cache_free(),
        "pending_free_bytes": o.pending_free,
        "fragmentation": o.cache_free() >= o.requested,
        "categories": o.categories.iter()
            .map(|(c, b)| json!({"category": c, "bytes": b})).collect::<Vec<_>>(),
        "sites": o.sites.iter()
            .map(|r| json!({"site": r.site, "bytes": r.bytes, "blocks": r.count}))
            .collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom(requested: u64, reserved: u64, allocated: u64, device_free: u64) -> Oom {
        Oom {
            device: 0,
            event: 3,
            events: 4,
            requested,
            stream: 0,
            site: "f (a.py:1)".into(),
            device_free,
            allocated,
            reserved,
            pending_free: 0,
            categories: Vec::new(),
            sites: Vec::new(),
        }
    }

    #[test]
    fn a_request_the_cache_had_free_bytes_for_is_fragmentation() {
        let m = 1u64 << 20;
        let o = oom(30 * m, 100 * m, 60 * m, 2 * m);
        assert_eq!(o.cache_free(), 40 * m);
        assert!(o.why().contains("fragmentation"), "{}", o.why());
        assert_eq!(to_json(&o)["fragmentation"], true);
    }

    #[test]
    fn a_request_beyond_the_cache_and_the_device_names_the_bytes_missing() {
        let m = 1u64 << 20;
        let o = oom(50 * m, 100 * m, 90 * m, 8 * m);
        assert_eq!(o.device_seen(), 108 * m);
        assert!(o.why().contains("42.00 MiB more"), "{}", o.why());
    }
}
