//! The exported C ABI, one file per API family. Each export decodes its C arguments, calls
//! the engine or the real function and maps the result to a CUDA error code.

pub mod address;
pub mod capi;
pub mod capture;
pub mod dlclose;
pub mod driver;
pub mod fallback;
pub mod families;
pub mod ipc;
pub mod lasterror;
pub mod nvtx;
pub mod ordered;
pub mod peer;
pub mod runtime;
pub mod sleep;
pub mod stream;
pub mod vmm;
