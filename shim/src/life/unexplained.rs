//! The memory nobody allocated through an API: at each dump, per device, what the driver
//! says is used (total minus free), what the process's records explain (the cache's reserved
//! bytes plus every observed allocation and live physical handle), and the difference
//! (contexts, modules, library internals, and allocations made before the shim started or
//! through paths it does not intercept).
//!
//! Invariant: a device whose primary context is not active is not asked (asking would
//! create a context, which itself takes device memory), nor is any device in a `fork` child
//! (`fork.rs`); its entry says so. Runs on the
//! dumping thread, outside every allocator lock; the driver calls go straight to the real
//! driver (`driver/entry.rs`).

use cudarc::driver::sys as cu;

use crate::driver::entry as drv;
use serde_json::{json, Value};

use crate::life::shim::Shim;

/// `(free, total)` of device `dev`, if its primary context is active.
fn driver_info(dev: i32) -> Option<(u64, u64)> {
    if crate::life::forked::in_forked_child() {
        return None;
    }
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: valid out-pointers; `dev` is an ordinal below the device count.
    let r = unsafe { drv::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) };
    if r != drv::SUCCESS || active == 0 {
        return None;
    }
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the primary context exists (active), so retaining it
    // creates nothing; every push is popped and every retain released below.
    unsafe {
        if drv::cuDevicePrimaryCtxRetain(&mut ctx, dev) != drv::SUCCESS {
            return None;
        }
        let mut out = None;
        if drv::cuCtxPushCurrent_v2(ctx) == drv::SUCCESS {
            let (mut free, mut total) = (0usize, 0usize);
            if drv::cuMemGetInfo_v2(&mut free, &mut total) == drv::SUCCESS {
                out = Some((free as u64, total as u64));
            }
            let mut old: cu::CUcontext = std::ptr::null_mut();
            let _ = drv::cuCtxPopCurrent_v2(&mut old);
        }
        let _ = drv::cuDevicePrimaryCtxRelease_v2(dev);
        out
    }
}

/// The `memory` list of the snapshot's `cushim` key: one entry per device.
pub fn memory_json(s: &Shim) -> Value {
    let observing = crate::life::mode::observing();
    let devices: Vec<Value> = (0..s.alloc.device_count() as i32)
        .map(|d| {
            let cached = if observing {
                0
            } else {
                let st = s.alloc.stats(d);
                st.get("reserved_bytes.all.current")
                    .copied()
                    .unwrap_or(0)
                    .max(0) as u64
            };
            let obs = s.observed.explained(d);
            let explained = cached + obs.total();
            let mut by_kind = serde_json::Map::new();
            if !observing {
                by_kind.insert("cached".into(), json!(cached));
            }
            for (k, b) in &obs.by_kind {
                by_kind.insert((*k).into(), json!(b));
            }
            if obs.physical > 0 {
                by_kind.insert("vmm_physical".into(), json!(obs.physical));
            }
            let (phys, res) = s.observed.vmm(d);
            let mut v = json!({
                "device": d,
                "explained": explained,
                "explained_by": by_kind,
                "vmm_physical": phys.iter().map(|(h, p)| json!({
                    "handle": h, "size": p.size, "flags": p.flags,
                    "mapped": p.maps, "released": p.released,
                })).collect::<Vec<_>>(),
                "vmm_reservations": res.iter().map(|(a, n)| json!({"address": a, "size": n}))
                    .collect::<Vec<_>>(),
            });
            match driver_info(d) {
                Some((free, total)) => {
                    let used = total.saturating_sub(free);
                    v["total"] = json!(total);
                    v["free"] = json!(free);
                    v["driver_used"] = json!(used);
                    v["unexplained"] = json!(used as i64 - explained as i64);
                }
                None => v["driver_used"] = Value::Null,
            }
            v
        })
        .collect();
    Value::Array(devices)
}
