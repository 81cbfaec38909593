//! Address queries answer for the allocation, not the cache's segment (issue 14, item 3): the
//! same program prints the same ranges with and without the shim, with and without
//! expandable segments, and clearing an allocation through its reported range leaves its
//! neighbour intact.
mod common;

#[test]
fn mem_get_address_range_reports_each_cached_block_as_the_driver_reports_an_allocation() {
    let exe = common::compile("shim_address_range", &[]);
    let without = common::run_ok(&mut common::sim_cmd(&exe));
    let kv = common::kv(&without);
    assert_eq!(common::num(&kv, "b_mid_base_off"), 0, "{without}");
    assert_eq!(common::num(&kv, "b_mid_size"), 4 << 20, "{without}");
    assert_eq!(common::num(&kv, "a_bytes_clobbered"), 0, "{without}");
    assert_ne!(common::num(&kv, "b_freed_rc"), 0, "{without}");
    let with = common::run_ok(&mut common::shim_cmd(&exe));
    assert_eq!(with, without, "with the shim");
    let expandable =
        common::run_ok(common::shim_cmd(&exe).env("CUSHIM_ALLOC_CONF", "expandable_segments:True"));
    assert_eq!(expandable, without, "with the shim and expandable segments");
}
