//! A published Rust client, cudarc's safe API (`examples/cudarc_client.rs`: context, default
//! and second stream, `alloc_zeros`, htod/dtoh/dtod copies, events, a join), checks its data
//! on simcuda with and without the shim; under the shim simcuda sees fewer device
//! allocations than the program made (cached), and the snapshot names the example's
//! allocating functions.
use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

fn example() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = common::build_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(common::artifacts::source_root()).args([
            "build",
            "-p",
            "cushim",
            "--example",
            "cudarc_client",
        ]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build --example");
        assert!(
            status.success(),
            "building examples/cudarc_client.rs failed"
        );
        dir.join("examples").join("cudarc_client")
    })
}

fn run(shim: bool, dir: &std::path::Path) -> (String, serde_json::Value) {
    let report = dir.join(format!("report-{shim}.json"));
    let mut cmd = common::cmd(example(), shim);
    let out = common::run_ok(
        cmd.arg("8")
            .env("SIMCUDA_REPORT", &report)
            .env("CUSHIM_SNAPSHOT", dir.join("snap.pickle"))
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    assert!(out.contains("cudarc_client: OK steps=8"), "{out}");
    (out, common::read_report(&report))
}

fn calls(r: &serde_json::Value, name: &str) -> u64 {
    r["calls"][name].as_u64().unwrap_or(0)
}

#[test]
fn the_cudarc_client_checks_its_data_on_simcuda_without_the_shim() {
    let dir = common::scratch("cudarc-bare");
    let (_, r) = run(false, &dir);
    // 1 upload + 8 activations + 1 device copy, each a stream-ordered allocation.
    assert_eq!(calls(&r, "cuMemAllocAsync"), 10, "{r}");
    assert_eq!(r["devices"][0]["bytes_in_use"], 0, "everything freed: {r}");
}

#[test]
fn under_the_shim_the_cudarc_client_is_cached_and_the_snapshot_names_its_functions() {
    let dir = common::scratch("cudarc-shim");
    let (_, r) = run(true, &dir);
    assert_eq!(
        calls(&r, "cuMemAllocAsync"),
        0,
        "every allocation reached the cache: {r}"
    );
    let device = calls(&r, "cuMemAlloc_v2");
    assert!(
        (1..10).contains(&device),
        "{device} device allocations for 10: {r}"
    );
    let v = common::load_snapshot(&dir.join("snap.pickle"));
    let traces = v["device_traces"][0].as_array().expect("device_traces[0]");
    let named = |f: &str| {
        traces.iter().any(|t| {
            t["action"] == "alloc"
                && t["frames"].as_array().is_some_and(|fs| {
                    fs.iter().any(|fr| {
                        fr["name"].as_str().is_some_and(|n| n.ends_with(f))
                            && fr["filename"]
                                .as_str()
                                .is_some_and(|p| p.ends_with("cudarc_client.rs"))
                    })
                })
        })
    };
    assert!(
        named("cudarc_client::upload_weights"),
        "upload_weights in a stack"
    );
    assert!(
        named("cudarc_client::make_activation"),
        "make_activation in a stack"
    );
    let allocs = traces.iter().filter(|t| t["action"] == "alloc").count();
    assert_eq!(allocs, 10);
}
