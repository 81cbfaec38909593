//! simcuda installed under NVIDIA's library names is one library with one process state,
//! whichever name a program or loader opens.
use crate::common;

#[test]
fn every_nvidia_library_name_opens_the_same_simcuda_state() {
    let exe = common::compile("sim_dlopen", &["-ldl"]);
    let out = common::run_ok(&mut common::sim_cmd(&exe));
    assert!(out.contains("PASS dlopen"), "{out}");
}

#[test]
fn libsimcuda_has_the_runtime_soname() {
    let lib = common::build_dir().join(common::artifacts::SIMCUDA_LIB);
    let out = std::process::Command::new("readelf")
        .arg("-d")
        .arg(&lib)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libcudart.so.12]"), "{text}");
}
