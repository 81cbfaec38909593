//! The cost of a `cuMemAlloc_v2` + `cuMemFree_v2` pair on simcuda (no latency model). The
//! figure is printed; only a very loose bound is asserted, since timing targets belong in
//! benchmarks (run with `--nocapture` to see it). The figure is the program's CPU time per
//! pair (`CLOCK_THREAD_CPUTIME_ID`), so a busy machine does not inflate it: the bound catches
//! an allocator gone linear in its population, not a slow scheduler.
mod common;

#[test]
fn alloc_free_pair_is_cheap() {
    let exe = common::compile("sim_perf", &["-O2"]);
    let out = common::run_ok(common::sim_cmd(&exe).args(["200000", "4096"]));
    let ns: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_pair: "))
        .expect("a ns_per_pair line")
        .trim()
        .parse()
        .unwrap();
    println!("simcuda cuMemAlloc_v2+cuMemFree_v2: {ns:.1} ns of CPU time per pair");
    assert!(ns < 50_000.0, "{ns} ns per pair");
}
