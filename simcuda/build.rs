//! Give libsimcuda.so the SONAME `libcudart.so.12`, so a program linked with `-lcudart`
//! against the sim layout records `libcudart.so.12` as NVIDIA's runtime does (the loader
//! still loads one copy whichever name, `libcuda.so.1` included, is opened).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudart.so.12");
    println!("cargo:rerun-if-changed=build.rs");
}
