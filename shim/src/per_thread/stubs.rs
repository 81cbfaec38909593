//! The runtime's stream-taking entry points, exported as stubs: each checks its stream (or,
//! for a `_ptsz`/`_ptds` entry point, counts the call) and jumps to the real function of
//! its name. Argument slots follow the System V x86-64 ABI: a `dim3` by value takes two
//! integer registers; a structure over 16 bytes (`cudaPitchedPtr`, `cudaExtent`) goes on
//! the stack and takes none. Entry points whose signature changed across runtime versions
//! count their first call (`always`). The shim's own hooks of allocation and capture entry
//! points are not here (they call `note_stream`/`note_ptds`).

use super::Slot;
use crate::real::driver::Hook;

macro_rules! runtime_stubs {
    ($($name:ident => $routine:ident,)*) => {
        $(
            #[allow(non_snake_case)]
            mod $name {
                pub static SLOT: super::Slot = super::Slot::new(
                    match std::ffi::CStr::from_bytes_with_nul(
                        concat!(stringify!($name), "\0").as_bytes(),
                    ) {
                        Ok(n) => n,
                        Err(_) => panic!("a symbol name"),
                    },
                );
            }

            /// A stub: see the module's head.
            ///
            /// # Safety
            /// As the runtime function of this name.
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "lea rax, [rip + {slot}]",
                    "jmp {routine}",
                    slot = sym $name::SLOT,
                    routine = sym super::tails::$routine,
                )
            }
        )*

        /// The stub exported under exactly `name`, with the real function it stands for.
        pub fn by_symbol(name: &[u8]) -> Option<Hook> {
            $(if name == stringify!($name).as_bytes() {
                return Some(Hook { hook: $name as *const () as usize, real: &$name::SLOT.real });
            })*
            None
        }

        /// Every stub's slot (tests).
        #[cfg(test)]
        pub fn slots() -> Vec<&'static Slot> {
            vec![$(&$name::SLOT),*]
        }
    };
}

runtime_stubs! {
    // Legacy entry points: the stream argument's slot.
    cudaMemcpyAsync => arg4,
    cudaMemcpy2DAsync => arg7,
    cudaMemcpy3DAsync => arg1,
    cudaMemcpy3DPeerAsync => arg1,
    cudaMemcpyPeerAsync => arg5,
    cudaMemcpyToSymbolAsync => arg5,
    cudaMemcpyFromSymbolAsync => arg5,
    cudaMemcpyToArrayAsync => arg6,
    cudaMemcpyFromArrayAsync => arg6,
    cudaMemcpy2DToArrayAsync => arg8,
    cudaMemcpy2DFromArrayAsync => arg8,
    cudaMemcpyBatchAsync => always,
    cudaMemcpy3DBatchAsync => always,
    cudaMemsetAsync => arg3,
    cudaMemset2DAsync => arg5,
    cudaMemset3DAsync => arg1,
    cudaMemPrefetchAsync => always,
    cudaLaunchKernel => arg7,
    cudaLaunchCooperativeKernel => arg7,
    cudaLaunchKernelExC => field0_32,
    cudaLaunchHostFunc => arg0,
    cudaStreamAddCallback => arg0,
    cudaEventRecord => arg1,
    cudaEventRecordWithFlags => arg1,
    cudaStreamWaitEvent => arg0,
    cudaStreamSynchronize => arg0,
    cudaStreamQuery => arg0,
    cudaStreamAttachMemAsync => arg0,
    cudaGraphLaunch => arg1,
    cudaGraphUpload => arg1,
    cudaSignalExternalSemaphoresAsync => arg3,
    cudaSignalExternalSemaphoresAsync_v2 => arg3,
    cudaWaitExternalSemaphoresAsync => arg3,
    cudaWaitExternalSemaphoresAsync_v2 => arg3,
    cudaGraphicsMapResources => arg2,
    cudaGraphicsUnmapResources => arg2,
    cudaStreamBeginCaptureToGraph => arg0,
    cudaStreamIsCapturing => arg0,
    cudaStreamGetCaptureInfo => arg0,
    cudaStreamGetCaptureInfo_v2 => arg0,
    cudaStreamGetCaptureInfo_v3 => arg0,
    cudaStreamUpdateCaptureDependencies => arg0,
    cudaStreamUpdateCaptureDependencies_v2 => arg0,
    // Per-thread entry points (nvcc --default-stream per-thread): every call counts.
    cudaMemcpy_ptds => always,
    cudaMemcpyToSymbol_ptds => always,
    cudaMemcpyFromSymbol_ptds => always,
    cudaMemcpy2D_ptds => always,
    cudaMemcpyToArray_ptds => always,
    cudaMemcpy2DToArray_ptds => always,
    cudaMemcpyFromArray_ptds => always,
    cudaMemcpy2DFromArray_ptds => always,
    cudaMemcpyArrayToArray_ptds => always,
    cudaMemcpy2DArrayToArray_ptds => always,
    cudaMemcpy3D_ptds => always,
    cudaMemcpy3DPeer_ptds => always,
    cudaMemset_ptds => always,
    cudaMemset2D_ptds => always,
    cudaMemset3D_ptds => always,
    cudaMemcpyAsync_ptsz => always,
    cudaMemcpyToSymbolAsync_ptsz => always,
    cudaMemcpyFromSymbolAsync_ptsz => always,
    cudaMemcpy2DAsync_ptsz => always,
    cudaMemcpyToArrayAsync_ptsz => always,
    cudaMemcpy2DToArrayAsync_ptsz => always,
    cudaMemcpyFromArrayAsync_ptsz => always,
    cudaMemcpy2DFromArrayAsync_ptsz => always,
    cudaMemcpy3DAsync_ptsz => always,
    cudaMemcpy3DPeerAsync_ptsz => always,
    cudaMemcpyBatchAsync_ptsz => always,
    cudaMemcpy3DBatchAsync_ptsz => always,
    cudaMemsetAsync_ptsz => always,
    cudaMemset2DAsync_ptsz => always,
    cudaMemset3DAsync_ptsz => always,
    cudaMemPrefetchAsync_ptsz => always,
    cudaStreamQuery_ptsz => always,
    cudaStreamGetFlags_ptsz => always,
    cudaStreamGetId_ptsz => always,
    cudaStreamGetPriority_ptsz => always,
    cudaStreamGetDevice_ptsz => always,
    cudaStreamGetAttribute_ptsz => always,
    cudaStreamSetAttribute_ptsz => always,
    cudaEventRecord_ptsz => always,
    cudaEventRecordWithFlags_ptsz => always,
    cudaStreamWaitEvent_ptsz => always,
    cudaStreamAddCallback_ptsz => always,
    cudaStreamAttachMemAsync_ptsz => always,
    cudaStreamSynchronize_ptsz => always,
    cudaLaunchKernel_ptsz => always,
    cudaLaunchKernelExC_ptsz => always,
    cudaLaunchCooperativeKernel_ptsz => always,
    cudaLaunchHostFunc_ptsz => always,
    cudaSignalExternalSemaphoresAsync_ptsz => always,
    cudaSignalExternalSemaphoresAsync_v2_ptsz => always,
    cudaWaitExternalSemaphoresAsync_ptsz => always,
    cudaWaitExternalSemaphoresAsync_v2_ptsz => always,
    cudaGraphLaunch_ptsz => always,
    cudaGraphUpload_ptsz => always,
    cudaGraphInstantiateWithParams_ptsz => always,
    cudaStreamBeginCaptureToGraph_ptsz => always,
    cudaStreamIsCapturing_ptsz => always,
    cudaStreamGetCaptureInfo_ptsz => always,
    cudaStreamGetCaptureInfo_v2_ptsz => always,
    cudaStreamGetCaptureInfo_v3_ptsz => always,
    cudaStreamUpdateCaptureDependencies_ptsz => always,
    cudaStreamUpdateCaptureDependencies_v2_ptsz => always,
    cudaGraphicsMapResources_ptsz => always,
    cudaGraphicsUnmapResources_ptsz => always,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stub_is_found_by_its_exact_name_and_forwards_to_that_name() {
        let slots = slots();
        assert!(slots.len() > 100);
        for s in slots {
            let name = s.real.name().to_bytes();
            let h = by_symbol(name).expect("a stub");
            assert_eq!(h.real.name().to_bytes(), name);
        }
        assert!(by_symbol(b"cudaMemcpy").is_none(), "no stream: not a stub");
        assert!(by_symbol(b"cudaMemcpyAsync_v2").is_none());
    }
}
