//! The runtime's and the driver's stream-taking entry points, exported as stubs: each checks
//! its stream (or, for a `_ptsz`/`_ptds` entry point, counts the call) and jumps to the real
//! function of its name. The driver's are there for programs linked with `-lcuda` and for
//! `dlsym` on a driver handle (bindings that load the driver themselves); a runtime gets its
//! driver functions from `cuGetProcAddress`, whose stubs are in `pools.rs`. The driver's list
//! is every submitting or capturing entry point of `tests/data/cuda12-stream-entry-points.txt`
//! and every per-thread name of `cuda.h` that the shim does not hook otherwise.
//!
//! Argument slots follow the System V x86-64 ABI: a `dim3` by value takes two integer
//! registers; a structure over 16 bytes (`cudaPitchedPtr`, `cudaExtent`) goes on the stack
//! and takes none. Entry points whose signature changed across versions, or whose stream is
//! behind a pointer or in an array, count their first call (`always`). The shim's own hooks
//! of allocation and capture entry points are not here (they call
//! `note_stream`/`note_ptds`).

use super::Slot;
use crate::real::driver::Hook;

macro_rules! exported_stubs {
    ($by_symbol:ident, $slots:ident; $($name:ident => $routine:ident,)*) => {
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
        pub fn $by_symbol(name: &[u8]) -> Option<Hook> {
            $(if name == stringify!($name).as_bytes() {
                return Some(Hook { hook: $name as *const () as usize, real: &$name::SLOT.real });
            })*
            None
        }

        /// Every stub's slot (tests).
        #[cfg(test)]
        pub fn $slots() -> Vec<&'static Slot> {
            vec![$(&$name::SLOT),*]
        }
    };
}

exported_stubs! {
    by_symbol, slots;
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
    cudaMemPrefetchAsync_v2 => arg4,
    cudaGraphInstantiateWithParams => field2_8,
    cudaGLMapBufferObjectAsync => arg2,
    cudaGLUnmapBufferObjectAsync => arg1,
    // The stream is in an array of launch parameters, or behind a pointer: the first call.
    cudaLaunchCooperativeKernelMultiDevice => always,
    cudaEGLStreamConsumerAcquireFrame => always,
    cudaEGLStreamConsumerReleaseFrame => always,
    cudaEGLStreamProducerPresentFrame => always,
    cudaEGLStreamProducerReturnFrame => always,
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
    cudaMemPrefetchAsync_v2_ptsz => always,
    cudaStreamCopyAttributes_ptsz => always,
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

exported_stubs! {
    driver_by_symbol, driver_slots;
    // Legacy names: the stream argument's slot (a structure field, or the first call where
    // the stream is behind a pointer or in an array); per-thread names: every call counts.
    cuEGLStreamConsumerAcquireFrame => always,
    cuEGLStreamConsumerReleaseFrame => always,
    cuEGLStreamProducerPresentFrame => always,
    cuEGLStreamProducerReturnFrame => always,
    cuEventRecord => arg1,
    cuEventRecordWithFlags => arg1,
    cuEventRecordWithFlags_ptsz => always,
    cuEventRecord_ptsz => always,
    cuGLMapBufferObjectAsync => arg3,
    cuGLMapBufferObjectAsync_v2 => arg3,
    cuGLMapBufferObjectAsync_v2_ptsz => always,
    cuGLMapBufferObject_v2_ptds => always,
    cuGLUnmapBufferObjectAsync => arg1,
    cuGraphInstantiateWithParams => field2_8,
    cuGraphInstantiateWithParams_ptsz => always,
    cuGraphLaunch => arg1,
    cuGraphLaunch_ptsz => always,
    cuGraphUpload => arg1,
    cuGraphUpload_ptsz => always,
    cuGraphicsMapResources => arg2,
    cuGraphicsMapResources_ptsz => always,
    cuGraphicsUnmapResources => arg2,
    cuGraphicsUnmapResources_ptsz => always,
    cuLaunchCooperativeKernel => arg8,
    cuLaunchCooperativeKernelMultiDevice => always,
    cuLaunchCooperativeKernel_ptsz => always,
    cuLaunchGridAsync => arg3,
    cuLaunchHostFunc => arg0,
    cuLaunchHostFunc_ptsz => always,
    cuLaunchKernel => arg8,
    cuLaunchKernelEx => field0_32,
    cuLaunchKernelEx_ptsz => always,
    cuLaunchKernel_ptsz => always,
    cuMemBatchDecompressAsync => arg4,
    cuMemBatchDecompressAsync_ptsz => always,
    cuMemMapArrayAsync => arg2,
    cuMemMapArrayAsync_ptsz => always,
    cuMemPrefetchAsync => arg3,
    cuMemPrefetchAsync_ptsz => always,
    cuMemPrefetchAsync_v2 => arg4,
    cuMemPrefetchAsync_v2_ptsz => always,
    cuMemcpy2DAsync => arg1,
    cuMemcpy2DAsync_v2 => arg1,
    cuMemcpy2DAsync_v2_ptsz => always,
    cuMemcpy2DUnaligned_v2_ptds => always,
    cuMemcpy2D_v2_ptds => always,
    cuMemcpy3DAsync => arg1,
    cuMemcpy3DAsync_v2 => arg1,
    cuMemcpy3DAsync_v2_ptsz => always,
    cuMemcpy3DBatchAsync => arg4,
    cuMemcpy3DBatchAsync_ptsz => always,
    cuMemcpy3DPeerAsync => arg1,
    cuMemcpy3DPeerAsync_ptsz => always,
    cuMemcpy3DPeer_ptds => always,
    cuMemcpy3D_v2_ptds => always,
    cuMemcpyAsync => arg3,
    cuMemcpyAsync_ptsz => always,
    cuMemcpyAtoA_v2_ptds => always,
    cuMemcpyAtoD_v2_ptds => always,
    cuMemcpyAtoHAsync => arg4,
    cuMemcpyAtoHAsync_v2 => arg4,
    cuMemcpyAtoHAsync_v2_ptsz => always,
    cuMemcpyAtoH_v2_ptds => always,
    cuMemcpyBatchAsync => arg8,
    cuMemcpyBatchAsync_ptsz => always,
    cuMemcpyDtoA_v2_ptds => always,
    cuMemcpyDtoDAsync => arg3,
    cuMemcpyDtoDAsync_v2 => arg3,
    cuMemcpyDtoDAsync_v2_ptsz => always,
    cuMemcpyDtoD_v2_ptds => always,
    cuMemcpyDtoHAsync => arg3,
    cuMemcpyDtoHAsync_v2 => arg3,
    cuMemcpyDtoHAsync_v2_ptsz => always,
    cuMemcpyDtoH_v2_ptds => always,
    cuMemcpyHtoAAsync => arg4,
    cuMemcpyHtoAAsync_v2 => arg4,
    cuMemcpyHtoAAsync_v2_ptsz => always,
    cuMemcpyHtoA_v2_ptds => always,
    cuMemcpyHtoDAsync => arg3,
    cuMemcpyHtoDAsync_v2 => arg3,
    cuMemcpyHtoDAsync_v2_ptsz => always,
    cuMemcpyHtoD_v2_ptds => always,
    cuMemcpyPeerAsync => arg5,
    cuMemcpyPeerAsync_ptsz => always,
    cuMemcpyPeer_ptds => always,
    cuMemcpy_ptds => always,
    cuMemsetD16Async => arg3,
    cuMemsetD16Async_ptsz => always,
    cuMemsetD16_v2_ptds => always,
    cuMemsetD2D16Async => arg5,
    cuMemsetD2D16Async_ptsz => always,
    cuMemsetD2D16_v2_ptds => always,
    cuMemsetD2D32Async => arg5,
    cuMemsetD2D32Async_ptsz => always,
    cuMemsetD2D32_v2_ptds => always,
    cuMemsetD2D8Async => arg5,
    cuMemsetD2D8Async_ptsz => always,
    cuMemsetD2D8_v2_ptds => always,
    cuMemsetD32Async => arg3,
    cuMemsetD32Async_ptsz => always,
    cuMemsetD32_v2_ptds => always,
    cuMemsetD8Async => arg3,
    cuMemsetD8Async_ptsz => always,
    cuMemsetD8_v2_ptds => always,
    cuSignalExternalSemaphoresAsync => arg3,
    cuSignalExternalSemaphoresAsync_ptsz => always,
    cuStreamAddCallback => arg0,
    cuStreamAddCallback_ptsz => always,
    cuStreamAttachMemAsync => arg0,
    cuStreamAttachMemAsync_ptsz => always,
    cuStreamBatchMemOp => arg0,
    cuStreamBatchMemOp_ptsz => always,
    cuStreamBatchMemOp_v2 => arg0,
    cuStreamBatchMemOp_v2_ptsz => always,
    cuStreamBeginCapture => arg0,
    cuStreamBeginCaptureToGraph => arg0,
    cuStreamBeginCaptureToGraph_ptsz => always,
    cuStreamBeginCapture_ptsz => always,
    cuStreamCopyAttributes_ptsz => always,
    cuStreamGetAttribute_ptsz => always,
    cuStreamGetCaptureInfo_v2_ptsz => always,
    cuStreamGetCaptureInfo_v3_ptsz => always,
    cuStreamGetCtx_ptsz => always,
    cuStreamGetCtx_v2_ptsz => always,
    cuStreamGetDevice_ptsz => always,
    cuStreamGetFlags_ptsz => always,
    cuStreamGetId_ptsz => always,
    cuStreamGetPriority_ptsz => always,
    cuStreamIsCapturing_ptsz => always,
    cuStreamQuery_ptsz => always,
    cuStreamSetAttribute_ptsz => always,
    cuStreamSynchronize_ptsz => always,
    cuStreamUpdateCaptureDependencies => arg0,
    cuStreamUpdateCaptureDependencies_ptsz => always,
    cuStreamUpdateCaptureDependencies_v2 => arg0,
    cuStreamUpdateCaptureDependencies_v2_ptsz => always,
    cuStreamWaitEvent => arg0,
    cuStreamWaitEvent_ptsz => always,
    cuStreamWaitValue32 => arg0,
    cuStreamWaitValue32_ptsz => always,
    cuStreamWaitValue32_v2 => arg0,
    cuStreamWaitValue32_v2_ptsz => always,
    cuStreamWaitValue64 => arg0,
    cuStreamWaitValue64_ptsz => always,
    cuStreamWaitValue64_v2 => arg0,
    cuStreamWaitValue64_v2_ptsz => always,
    cuStreamWriteValue32 => arg0,
    cuStreamWriteValue32_ptsz => always,
    cuStreamWriteValue32_v2 => arg0,
    cuStreamWriteValue32_v2_ptsz => always,
    cuStreamWriteValue64 => arg0,
    cuStreamWriteValue64_ptsz => always,
    cuStreamWriteValue64_v2 => arg0,
    cuStreamWriteValue64_v2_ptsz => always,
    cuWaitExternalSemaphoresAsync => arg3,
    cuWaitExternalSemaphoresAsync_ptsz => always,
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

    #[test]
    fn every_driver_stub_is_found_by_its_exact_name_and_is_not_a_runtime_name() {
        let slots = driver_slots();
        assert!(slots.len() > 100);
        for s in slots {
            let name = s.real.name().to_bytes();
            let h = driver_by_symbol(name).expect("a stub");
            assert_eq!(h.real.name().to_bytes(), name);
            assert!(by_symbol(name).is_none(), "a runtime name");
        }
        assert!(driver_by_symbol(b"cuLaunchKernel").is_some());
        assert!(driver_by_symbol(b"cuMemcpyHtoDAsync_v2_ptsz").is_some());
        assert!(
            driver_by_symbol(b"cuMemAlloc_v2").is_none(),
            "no stream: not a stub"
        );
        assert!(driver_by_symbol(b"cuLaunchKernel_v2").is_none());
    }
}
