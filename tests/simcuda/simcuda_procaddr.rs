//! simcuda's `cuGetProcAddress_v2` answers every request NVIDIA's static runtime 12.9, 13.2
//! and 13.5 make (the lists in tests/data, measured; copies of the project's shared data).
use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

/// One answer: (name, version, flags, rc, status, symbol).
type Row = (String, i32, u64, i32, i32, String);

/// Every entry of a request list with its answer, and the program's whole output.
fn answers_for(list: &str) -> (Vec<Row>, String) {
    let exe = common::compile("sim_procaddr", &["-ldl"]);
    let out = common::run_ok(common::sim_cmd(&exe).arg(list_path(list)));
    let rows = out
        .lines()
        .filter(|l| l.contains(" -> "))
        .map(|l| {
            let (lhs, rhs) = l.split_once(" -> ").unwrap();
            let l: Vec<&str> = lhs.split_whitespace().collect();
            let r: Vec<&str> = rhs.split_whitespace().collect();
            (
                l[0].trim_matches('"').to_string(),
                l[1].parse().unwrap(),
                l[2].parse().unwrap(),
                r[0].parse().unwrap(),
                r[1].parse().unwrap(),
                r[2].to_string(),
            )
        })
        .collect();
    (rows, out)
}

/// The 12.9 list's answers.
fn answers() -> &'static (Vec<Row>, String) {
    static A: OnceLock<(Vec<Row>, String)> = OnceLock::new();
    A.get_or_init(|| answers_for("12.9"))
}

/// What NVIDIA's static runtime `version` asks `cuGetProcAddress_v2` for at start-up.
fn list_path(version: &str) -> PathBuf {
    common::artifacts::source_root()
        .join("tests")
        .join("data")
        .join(format!("cudart-{version}-static-getprocaddress.txt"))
}

/// Every answer is consistent: a found entry point is the function of that name, else
/// CUDA_ERROR_NOT_FOUND with NULL and a status saying why.
fn check_consistent(rows: &[Row]) {
    for (name, version, flags, rc, status, sym) in rows {
        if *rc == 0 {
            assert_eq!(*status, 0, "{name} {version} {flags}");
            assert!(
                sym.starts_with(name.as_str()),
                "{name} {version} {flags} gave {sym}"
            );
        } else {
            assert_eq!(*rc, 500, "{name} {version} {flags}");
            assert_eq!(
                sym, "-",
                "{name} {version} {flags}: not found must give NULL"
            );
            assert!(*status == 1 || *status == 2, "{name}: status {status}");
        }
    }
}

#[test]
fn every_entry_of_the_cuda_13_lists_is_answered_and_allocation_entry_points_resolve_as_in_12_9() {
    let alloc = |rows: &[Row]| -> Vec<String> {
        let mut v: Vec<String> = rows
            .iter()
            .filter(|r| r.0.starts_with("cuMem") && r.3 == 0)
            .filter(|r| r.0.contains("Alloc") || r.0.contains("Free") || r.0 == "cuMemGetInfo")
            .map(|r| format!("{} {} {} {}", r.0, r.1, r.2, r.5))
            .collect();
        v.sort();
        v
    };
    let base = alloc(&answers().0);
    assert!(base.len() >= 8, "{base:?}");
    for (version, n) in [("13.2", 474), ("13.5", 481)] {
        let (rows, out) = answers_for(version);
        assert_eq!(rows.len(), n, "{version}: {out}");
        assert!(out.contains("PASS procaddr"), "{out}");
        check_consistent(&rows);
        assert_eq!(alloc(&rows), base, "{version}");
    }
}

fn symbol(name: &str, version: i32, flags: u64) -> String {
    let (rows, _) = answers();
    let r = rows
        .iter()
        .find(|r| r.0 == name && r.1 == version && r.2 == flags)
        .unwrap_or_else(|| panic!("{name} {version} {flags} not in the list"));
    r.5.clone()
}

#[test]
fn every_entry_of_the_static_runtime_list_is_answered() {
    let (rows, out) = answers();
    assert_eq!(rows.len(), 419, "{out}");
    assert!(out.contains("PASS procaddr"), "{out}");
    check_consistent(rows);
}

#[test]
fn versioned_names_resolve_to_the_v2_entry_points() {
    assert_eq!(symbol("cuMemAlloc", 3020, 0), "cuMemAlloc_v2");
    assert_eq!(symbol("cuMemFree", 3020, 0), "cuMemFree_v2");
    assert_eq!(symbol("cuMemGetInfo", 3020, 0), "cuMemGetInfo_v2");
    assert_eq!(symbol("cuDeviceTotalMem", 3020, 0), "cuDeviceTotalMem_v2");
    assert_eq!(symbol("cuStreamDestroy", 4000, 0), "cuStreamDestroy_v2");
    assert_eq!(symbol("cuEventDestroy", 4000, 0), "cuEventDestroy_v2");
    assert_eq!(symbol("cuGetProcAddress", 11030, 0), "cuGetProcAddress");
    assert_eq!(symbol("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2");
    assert_eq!(
        symbol("cuStreamBeginCapture", 10000, 0),
        "cuStreamBeginCapture"
    );
    assert_eq!(
        symbol("cuStreamBeginCapture", 10010, 0),
        "cuStreamBeginCapture_v2"
    );
}

#[test]
fn per_thread_flag_resolves_to_ptsz_and_ptds_variants() {
    assert_eq!(symbol("cuMemAllocAsync", 11020, 2), "cuMemAllocAsync_ptsz");
    assert_eq!(symbol("cuMemAllocAsync", 11020, 0), "cuMemAllocAsync");
    assert_eq!(symbol("cuMemFreeAsync", 11020, 2), "cuMemFreeAsync_ptsz");
    assert_eq!(
        symbol("cuStreamSynchronize", 7000, 2),
        "cuStreamSynchronize_ptsz"
    );
    assert_eq!(symbol("cuMemcpyHtoD", 7000, 2), "cuMemcpyHtoD_v2_ptds");
    assert_eq!(
        symbol("cuLaunchHostFunc", 10000, 2),
        "cuLaunchHostFunc_ptsz"
    );
    assert_eq!(
        symbol("cuStreamBeginCapture", 10010, 2),
        "cuStreamBeginCapture_v2_ptsz"
    );
}

#[test]
fn unimplemented_entry_points_are_not_found_with_null() {
    for (name, v) in [
        ("", 0),
        ("cuModuleLoad", 2000),
        ("cuGraphCreate", 10000),
        ("cuCtxCreate", 3020),
    ] {
        assert_eq!(symbol(name, v, 0), "-", "{name}");
    }
    let (rows, _) = answers();
    let found: HashMap<&str, usize> =
        rows.iter()
            .filter(|r| r.3 == 0)
            .fold(HashMap::new(), |mut m, r| {
                *m.entry(r.0.as_str()).or_default() += 1;
                m
            });
    assert!(
        found.len() >= 40,
        "only {} names implemented: {found:?}",
        found.len()
    );
}
