//! The shim's runtime exports by exact name, for the `dlsym` override: a program that looks
//! the runtime up through a library handle (`dlsym(dlopen("libcudart.so.12"), "cudaMalloc")`,
//! Python's `ctypes.CDLL(path).cudaMalloc`) bypasses `LD_PRELOAD`, so it is handed the same
//! export a linked call reaches. Invariant: only the names the shim exports, matched exactly;
//! each forwards to the real function of its name ([`crate::real::fns`]).

use crate::exports_driver::Hook;
use crate::real::fns;

macro_rules! runtime_hooks {
    ($($name:ident => $path:path,)*) => {
        /// The runtime export named exactly `name`, with the real function it stands for.
        pub fn by_symbol(name: &[u8]) -> Option<Hook> {
            $(if name == stringify!($name).as_bytes() {
                return Some(Hook { hook: $path as *const () as usize, real: &fns::$name });
            })*
            crate::per_thread::runtime_hook(name)
        }
    };
}

runtime_hooks! {
    cudaMalloc => crate::exports_runtime::cudaMalloc,
    cudaMallocAsync => crate::exports_runtime::cudaMallocAsync,
    cudaFree => crate::exports_runtime::cudaFree,
    cudaFreeAsync => crate::exports_runtime::cudaFreeAsync,
    cudaMallocHost => crate::exports_runtime::cudaMallocHost,
    cudaHostAlloc => crate::exports_runtime::cudaHostAlloc,
    cudaFreeHost => crate::exports_runtime::cudaFreeHost,
    cudaMemGetInfo => crate::exports_runtime::cudaMemGetInfo,
    cudaStreamCreate => crate::exports_stream::cudaStreamCreate,
    cudaStreamCreateWithFlags => crate::exports_stream::cudaStreamCreateWithFlags,
    cudaStreamCreateWithPriority => crate::exports_stream::cudaStreamCreateWithPriority,
    cudaStreamDestroy => crate::exports_stream::cudaStreamDestroy,
    cudaDeviceReset => crate::exports_stream::cudaDeviceReset,
    cudaGetLastError => crate::lasterror::cudaGetLastError,
    cudaPeekAtLastError => crate::lasterror::cudaPeekAtLastError,
    cudaIpcGetMemHandle => crate::exports_ipc::cudaIpcGetMemHandle,
    cudaIpcOpenMemHandle => crate::exports_ipc::cudaIpcOpenMemHandle,
    cudaIpcCloseMemHandle => crate::exports_ipc::cudaIpcCloseMemHandle,
    cudaDeviceEnablePeerAccess => crate::peer::cudaDeviceEnablePeerAccess,
    cudaDeviceDisablePeerAccess => crate::peer::cudaDeviceDisablePeerAccess,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exact_runtime_export_names_have_hooks() {
        for n in [
            "cudaMalloc",
            "cudaFreeHost",
            "cudaGetLastError",
            "cudaDeviceReset",
        ] {
            let h = by_symbol(n.as_bytes()).expect(n);
            assert_eq!(h.real.name().to_bytes(), n.as_bytes());
        }
        for n in [
            "cudaMalloc_v2",
            "cudaMallocManaged",
            "cudaMallocPitch",
            "cudaMemcpy",
            "cuda",
            "",
        ] {
            assert!(by_symbol(n.as_bytes()).is_none(), "{n}");
        }
    }
}
