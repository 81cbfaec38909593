//! The per-thread default stream's stream-ordered allocation entry points
//! (`cudaMallocAsync_ptsz`, `cudaFreeAsync_ptsz`, `cuMemAllocAsync_ptsz`,
//! `cuMemFreeAsync_ptsz`) are served by the cache like their plain twins, and the pool ones
//! (`cudaMallocFromPoolAsync_ptsz`, `cuMemAllocFromPoolAsync_ptsz`) reach CUDA's pool: a
//! program built with per-thread default stream semantics gets the same results as without
//! the shim, with fewer device allocations.
use crate::common;

fn exe() -> std::path::PathBuf {
    common::compile(
        "shim_ptsz_async",
        &["-lcuda", "-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
    )
}

/// The program's results, without the line that tells the shim's statistics.
fn results(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| !l.starts_with("shim_allocations="))
        .collect()
}

#[test]
fn per_thread_stream_ordered_allocations_are_cached_with_the_same_results() {
    let bare = common::run_ok(&mut common::sim_cmd(&exe()));
    let report = common::scratch("ptsz-alloc").join("report.json");
    let out = common::run_ok(common::shim_cmd(&exe()).env("SIMCUDA_REPORT", &report));
    assert_eq!(results(&out), results(&bare), "{out}");
    let kv = common::kv(&out);
    // 16 runtime blocks and one driver block, through their _ptsz entry points.
    assert_eq!(common::num(&kv, "shim_allocations"), 17, "{out}");
    let r = common::read_report(&report);
    assert_eq!(
        r["calls"]["cudaMallocAsync_ptsz"].as_u64().unwrap_or(0),
        0,
        "the cache served every runtime block: {}",
        r["calls"]
    );
    assert_eq!(
        r["calls"]["cuMemAllocAsync_ptsz"].as_u64().unwrap_or(0),
        0,
        "{}",
        r["calls"]
    );
    let device_allocs = r["calls"]["cuMemAlloc_v2"].as_u64().unwrap_or(0);
    assert!(
        (1..17).contains(&device_allocs),
        "fewer device allocations than blocks: {}",
        r["calls"]
    );
    // The pool allocations reached CUDA's pools through their _ptsz names.
    assert_eq!(
        r["calls"]["cudaMallocFromPoolAsync_ptsz"], 1,
        "{}",
        r["calls"]
    );
    assert_eq!(
        r["calls"]["cuMemAllocFromPoolAsync_ptsz"], 1,
        "{}",
        r["calls"]
    );
}
