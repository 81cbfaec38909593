//! Link flags of libsimcuda.so.
//!
//! - SONAME `libcudart.so.12`, so a program linked with `-lcudart` against the sim layout
//!   records `libcudart.so.12` as NVIDIA's runtime does (the loader still loads one copy
//!   whichever name, `libcuda.so.1` included, is opened).
//! - `-Bsymbolic-functions`: simcuda's references to its own functions (the entry points
//!   `cuGetProcAddress` hands out, the runtime's calls into the driver) bind to itself at
//!   link time, as a real `libcuda` does. Without it they go through the GOT, so a preloaded
//!   interposer (cushim) would be handed back its own hooks as "the driver's functions",
//!   and a hook forwarding to them would recurse.
//! - `cudart.map`: a version node `libcudart.so.12` in `.gnu.version_d`, which the CUDA 13
//!   install renames and puts on the `cuda*` exports (see the workspace's
//!   `testsupport/src/sim13.rs`).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudart.so.12");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/cudart.map");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cudart.map");
}
