//! The shim's runtime exports by exact name, for the `dlsym` override: a program that looks
//! the runtime up through a library handle (`dlsym(dlopen("libcudart.so.12"), "cudaMalloc")`,
//! Python's `ctypes.CDLL(path).cudaMalloc`) bypasses `LD_PRELOAD`, so it is handed the same
//! export a linked call reaches. Invariant: only the names the shim exports, matched exactly;
//! each forwards to the real function of its name ([`crate::real::runtime::fns`]).

use crate::exports::driver::Hook;
use crate::real::runtime::fns;

macro_rules! runtime_hooks {
    ($($name:ident => $path:path,)*) => {
        /// The runtime export named exactly `name`, with the real function it stands for.
        pub fn by_symbol(name: &[u8]) -> Option<Hook> {
            $(if name == stringify!($name).as_bytes() {
                return Some(Hook { hook: $path as *const () as usize, real: &fns::$name });
            })*
            None
        }
    };
}

runtime_hooks! {
    cudaMalloc => crate::exports::runtime::cudaMalloc,
    cudaMallocAsync => crate::exports::runtime::cudaMallocAsync,
    cudaFree => crate::exports::runtime::cudaFree,
    cudaFreeAsync => crate::exports::runtime::cudaFreeAsync,
    cudaMallocHost => crate::exports::runtime::cudaMallocHost,
    cudaHostAlloc => crate::exports::runtime::cudaHostAlloc,
    cudaFreeHost => crate::exports::runtime::cudaFreeHost,
    cudaMemGetInfo => crate::exports::runtime::cudaMemGetInfo,
    cudaStreamCreate => crate::exports::stream::cudaStreamCreate,
    cudaStreamCreateWithFlags => crate::exports::stream::cudaStreamCreateWithFlags,
    cudaStreamCreateWithPriority => crate::exports::stream::cudaStreamCreateWithPriority,
    cudaStreamDestroy => crate::exports::stream::cudaStreamDestroy,
    cudaDeviceReset => crate::exports::stream::cudaDeviceReset,
    cudaGetLastError => crate::ffi::lasterror::cudaGetLastError,
    cudaPeekAtLastError => crate::ffi::lasterror::cudaPeekAtLastError,
    cudaIpcGetMemHandle => crate::exports::ipc::cudaIpcGetMemHandle,
    cudaIpcOpenMemHandle => crate::exports::ipc::cudaIpcOpenMemHandle,
    cudaIpcCloseMemHandle => crate::exports::ipc::cudaIpcCloseMemHandle,
    cudaDeviceEnablePeerAccess => crate::exports::peer::cudaDeviceEnablePeerAccess,
    cudaDeviceDisablePeerAccess => crate::exports::peer::cudaDeviceDisablePeerAccess,
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
