//! The artifacts the integration tests rely on build and lay out.
use crate::common;

#[test]
fn shim_and_simcuda_build_and_lay_out_as_cuda_libraries() {
    assert!(common::shim_path().exists());
    for name in common::artifacts::SIM_NAMES {
        assert!(common::sim_lib_dir().join(name).exists(), "{name} missing");
    }
}
