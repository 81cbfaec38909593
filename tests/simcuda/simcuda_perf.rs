//! The cost of a `cuMemAlloc_v2` + `cuMemFree_v2` pair on simcuda (no latency model): a
//! measurement, not a check (speed targets belong in BENCHMARKS.md, never in a test's pass or
//! fail), so it runs only when asked: `cargo test --test simcuda -- simcuda_perf::
//! --ignored --nocapture`. The figure is the program's CPU time per pair (`CLOCK_THREAD_CPUTIME_ID`),
//! so a busy machine does not inflate it.
use crate::common;

#[test]
#[ignore = "a measurement: run with --ignored --nocapture and record the figure in BENCHMARKS.md"]
fn alloc_free_pair_cost_is_measured() {
    let exe = common::compile("sim_perf", &["-O2"]);
    let out = common::run_ok(common::sim_cmd(&exe).args(["200000", "4096"]));
    let ns: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_pair: "))
        .expect("a ns_per_pair line")
        .trim()
        .parse()
        .expect("ns_per_pair is a number");
    println!("simcuda cuMemAlloc_v2+cuMemFree_v2: {ns:.1} ns of CPU time per pair");
    assert!(ns > 0.0, "{ns} ns per pair");
}
