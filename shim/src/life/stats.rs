//! Memory statistics as one JSON document (for the C API and the snapshot's `cushim` key).

use crate::life::shim::Shim;

/// `{"devices": [stats of device 0, ...], "host": {pinned stats}}`.
pub fn stats_json(s: &Shim) -> serde_json::Value {
    let n = s.alloc.device_count();
    let devices: Vec<serde_json::Value> = (0..n as i32)
        .map(|d| serde_json::to_value(s.alloc.stats(d)).unwrap_or_default())
        .collect();
    serde_json::json!({
        "devices": devices,
        "host": serde_json::to_value(s.alloc.host_stats()).unwrap_or_default(),
    })
}
