//! simcuda's inter-process memory handles: a second process opens an exported allocation and
//! sees (and writes) the exporter's bytes; handles are per allocation and per generation.
use crate::common;

fn exe() -> std::path::PathBuf {
    common::compile("sim_ipc", &["-lcuda"])
}

#[test]
fn a_second_process_sees_and_writes_the_exporters_bytes() {
    let out = common::run_ok(common::sim_cmd(&exe()).arg("export"));
    assert!(
        out.contains("imported ok") && out.contains("PASS export"),
        "{out}"
    );
}

#[test]
fn handles_are_per_allocation_and_generation_and_only_for_device_memory() {
    let out = common::run_ok(common::sim_cmd(&exe()).arg("handles"));
    assert!(out.contains("PASS handles"), "{out}");
}
