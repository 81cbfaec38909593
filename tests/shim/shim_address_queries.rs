//! Address queries answer for the allocation, not the cache's segment: the
//! same program prints the same ranges with and without the shim, with and without
//! expandable segments, and clearing an allocation through its reported range leaves its
//! neighbour intact.
use crate::common;

#[test]
fn mem_get_address_range_reports_each_cached_block_as_the_driver_reports_an_allocation() {
    let exe = common::compile("shim_address_range", &[]);
    let without = common::run_ok(&mut common::sim_cmd(&exe));
    let kv = common::kv(&without);
    assert_eq!(common::num(&kv, "b_mid_base_off"), 0, "{without}");
    assert_eq!(common::num(&kv, "b_mid_size"), 4 << 20, "{without}");
    assert_eq!(common::num(&kv, "a_bytes_clobbered"), 0, "{without}");
    assert_ne!(common::num(&kv, "b_freed_rc"), 0, "{without}");
    for conf in ["", "expandable_segments:True"] {
        let dir = common::scratch(&format!("address-range-{}", conf.len()));
        let report = dir.join("report.json");
        let with = common::run_ok(
            common::shim_cmd(&exe)
                .env("CUSHIM_ALLOC_CONF", conf)
                .env("SIMCUDA_REPORT", &report),
        );
        assert_eq!(with, without, "with the shim, conf {conf:?}");
        // The blocks are the cache's and the ranges the shim's answer: neither the program's
        // cudaMalloc calls nor its address-range queries reached simcuda.
        let r = common::read_report(&report);
        for call in ["cudaMalloc", "cuMemGetAddressRange_v2"] {
            assert_eq!(r["calls"][call], 0, "conf {conf:?}: {call} reached simcuda");
        }
    }
}
