//! Runtime calls looked up through a library handle (`dlsym(dlopen("libcudart.so.12"),
//! "cudaMalloc")`, Python's ctypes) get the shim's exports: allocations are cached and
//! recorded, and the snapshot is written at exit, as for a linked program.
use crate::common;

fn run(shim: bool, dir: &std::path::Path) -> (String, serde_json::Value) {
    let exe = common::compile("runtime_dlsym", &["-ldl"]);
    let report = dir.join(format!("report-{shim}.json"));
    let mut cmd = common::cmd(&exe, shim);
    let out = common::run_ok(
        cmd.env("SIMCUDA_REPORT", &report)
            .env("CUSHIM_SNAPSHOT", dir.join("snap.pickle"))
            .env("CUSHIM_HISTORY", "enabled=all,stacks=native"),
    );
    (out, common::read_report(&report))
}

#[test]
fn a_runtime_looked_up_through_a_library_handle_gets_the_shims_exports() {
    let dir = common::scratch("runtime-dlsym");
    let (bare, bare_report) = run(false, &dir);
    assert!(bare.contains("module=cuda"), "{bare}");
    assert_eq!(bare_report["calls"]["cudaMalloc"], 40);
    let (out, report) = run(true, &dir);
    assert!(
        out.contains("module=shim") && out.contains("result=ok"),
        "{out}"
    );
    // Same codes for the foreign free, both from cudaFree and the last error.
    let (b, s) = (common::kv(&bare), common::kv(&out));
    assert_eq!(s["bad_free"], b["bad_free"]);
    assert_eq!(s["last_error"], b["last_error"]);
    assert_eq!(report["calls"]["cudaMalloc"], 0, "{report}");
    let device_allocs = report["calls"]["cuMemAlloc_v2"].as_u64().unwrap_or(0);
    assert!(device_allocs > 0 && device_allocs < 40, "{report}");
    let v = common::load_snapshot(&dir.join("snap.pickle"));
    let allocs = v["device_traces"][0]
        .as_array()
        .expect("device_traces[0]")
        .iter()
        .filter(|t| t["action"] == "alloc")
        .count();
    assert_eq!(allocs, 40);
}

#[test]
fn python_ctypes_calls_into_the_runtime_reach_the_shim() {
    let dir = common::scratch("runtime-ctypes");
    let report = dir.join("report.json");
    let lib = common::sim_lib_dir().join("libcudart.so.12");
    let script = format!(
        "import ctypes\n\
         rt = ctypes.CDLL({lib:?})\n\
         p = ctypes.c_void_p()\n\
         for i in range(20):\n\
         \x20   assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0\n\
         \x20   assert rt.cudaFree(p) == 0\n\
         print('result=ok')\n",
        lib = lib.display().to_string()
    );
    let mut cmd = common::shim_cmd(std::path::Path::new("python3"));
    let out = common::run_ok(
        cmd.args(["-c", &script])
            .env("SIMCUDA_REPORT", &report)
            .env("CUSHIM_SNAPSHOT", dir.join("snap.pickle")),
    );
    assert!(out.contains("result=ok"), "{out}");
    let r = common::read_report(&report);
    assert_eq!(r["calls"]["cudaMalloc"], 0, "{r}");
    assert_eq!(
        r["calls"]["cuMemAlloc_v2"], 1,
        "one device allocation, reused: {r}"
    );
    assert!(dir.join("snap.pickle").exists(), "a snapshot at exit");
}
