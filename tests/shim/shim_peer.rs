//! Peer access reaches expandable segments: with two simulated devices, device 1's access
//! to device 0's expandable pages is none before `cudaDeviceEnablePeerAccess` /
//! `cuCtxEnablePeerAccess`, read-write after (pages mapped before and after enabling), and
//! none again after disabling. Only the shim puts `cudaMalloc` memory in mapped pages, so
//! the same program without it fails; the report proves the shim mapped them.
use crate::common;

fn run(case: &str, shim: bool) -> (std::process::Output, serde_json::Value) {
    let exe = common::compile("shim_peer", &["-lcuda"]);
    let dir = common::scratch(&format!("shim-peer-{case}-{shim}"));
    let report = dir.join("report.json");
    let mut cmd = common::cmd(&exe, shim);
    cmd.arg(case)
        .env("SIMCUDA_DEVICES", "2")
        .env("CUSHIM_ALLOC_CONF", "expandable_segments:True")
        .env("SIMCUDA_REPORT", &report);
    let out = common::run(&mut cmd);
    let r = if shim {
        common::read_report(&report)
    } else {
        serde_json::Value::Null
    };
    (out, r)
}

fn peer_access_reaches_expandable_pages(case: &str) {
    let (out, r) = run(case, true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("PASS {case}")),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(r["calls"]["cuMemMap"].as_u64().unwrap_or(0) >= 2, "{r}");
    assert_eq!(r["calls"]["cuMemAlloc_v2"].as_u64().unwrap_or(0), 0, "{r}");
    let (bare, _) = run(case, false);
    assert!(
        !bare.status.success(),
        "without the shim cudaMalloc is no mapping"
    );
}

#[test]
fn runtime_peer_access_reaches_expandable_pages_mapped_before_and_after() {
    peer_access_reaches_expandable_pages("runtime");
}

#[test]
fn driver_peer_access_reaches_expandable_pages_mapped_before_and_after() {
    peer_access_reaches_expandable_pages("driver");
}
