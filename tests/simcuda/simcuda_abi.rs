//! ABI fidelity: the C programs build against NVIDIA's own CUDA 12 headers (from the PyPI
//! wheels `nvidia-cuda-runtime-cu12` and `nvidia-cuda-nvcc-cu12`, downloaded once into the
//! target directory) and run linked to simcuda; and every constant, enum value and struct
//! layout simcuda's headers declare equals NVIDIA's. Skips visibly (`common::skip`) only when
//! the wheels cannot be downloaded, a failure under `CUSHIM_REQUIRE_ALL=1`.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// [`nvidia_includes`], or a visible skip (a failure under `CUSHIM_REQUIRE_ALL=1`) when the
/// wheels cannot be downloaded.
fn nvidia_includes_or_skip() -> Option<&'static (PathBuf, PathBuf)> {
    let inc = nvidia_includes();
    if inc.is_none() {
        common::skip::skip(
            "the NVIDIA-header ABI check",
            "could not download NVIDIA's CUDA wheels with pip (no registry reachable?)",
        );
    }
    inc
}

/// NVIDIA's include directories (runtime, nvcc), or `None` when the download failed.
fn nvidia_includes() -> Option<&'static (PathBuf, PathBuf)> {
    static INC: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    INC.get_or_init(|| {
        let target = common::build_dir().parent().unwrap().to_path_buf();
        let wheels = target.join("nvidia-wheels");
        let have = |prefix: &str| {
            std::fs::read_dir(&wheels).ok().and_then(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix) && p.extension().is_some_and(|e| e == "whl"))
            })
        };
        if have("nvidia_cuda_runtime_cu12").is_none() || have("nvidia_cuda_nvcc_cu12").is_none() {
            let st = Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "-q", "-d"])
                .arg(&wheels)
                .args(["nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12"])
                .status();
            if !st.is_ok_and(|s| s.success()) {
                return None;
            }
        }
        let out = wheels.join("headers");
        let runtime_inc = out.join("nvidia/cuda_runtime/include");
        let nvcc_inc = out.join("nvidia/cuda_nvcc/include");
        if runtime_inc.join("cuda_runtime_api.h").exists() && nvcc_inc.join("crt").exists() {
            return Some((runtime_inc, nvcc_inc));
        }
        for w in [have("nvidia_cuda_runtime_cu12")?, have("nvidia_cuda_nvcc_cu12")?] {
            let script = "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nfor n in z.namelist():\n    if '/include/' in n: z.extract(n, sys.argv[2])\n";
            let st = Command::new("python3").args(["-c", script]).arg(&w).arg(&out).status().unwrap();
            assert!(st.success(), "unzipping {}", w.display());
        }
        Some((out.join("nvidia/cuda_runtime/include"), out.join("nvidia/cuda_nvcc/include")))
    })
    .as_ref()
}

/// Compile `src` against NVIDIA's headers, linked to simcuda.
fn compile_nvidia(src: &Path, name: &str, inc: &(PathBuf, PathBuf), extra: &[&str]) -> PathBuf {
    let out = common::build_dir()
        .join("test-bin")
        .join(format!("{name}-nvidia-{}", std::process::id()));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let res = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-pthread", "-I"])
        .arg(&inc.0)
        .arg("-I")
        .arg(&inc.1)
        .arg(src)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(common::sim_lib_dir())
        .args(extra)
        .arg("-lcudart")
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "compiling {} against NVIDIA headers:\n{}",
        src.display(),
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

fn test_c(name: &str) -> PathBuf {
    common::artifacts::source_root()
        .join("tests")
        .join("c")
        .join(format!("{name}.c"))
}

fn run_cases(prog: &str, cases: &[&str], env: &[(&str, &str)]) {
    let Some(inc) = nvidia_includes_or_skip() else {
        return;
    };
    let exe = compile_nvidia(&test_c(prog), prog, inc, &[]);
    for case in cases {
        let mut cmd = common::sim_cmd(&exe);
        cmd.arg(case).envs(env.iter().copied());
        let out = common::run_ok(&mut cmd);
        assert!(out.contains(&format!("PASS {case}")), "{out}");
    }
}

#[test]
fn vector_add_built_with_nvidia_headers_runs_on_simcuda() {
    let Some(inc) = nvidia_includes_or_skip() else {
        return;
    };
    let src = common::artifacts::source_root()
        .join("examples")
        .join("vector_add.c");
    let exe = compile_nvidia(&src, "vector_add", inc, &[]);
    let out = common::run_ok(common::sim_cmd(&exe).arg("1000"));
    assert!(out.contains("vector_add: OK n=1000 sum=1498500"), "{out}");
}

#[test]
fn device_props_peers_and_vmm_sharing_built_with_nvidia_headers_agree_on_simcuda() {
    let Some(inc) = nvidia_includes() else { return };
    let exe = compile_nvidia(&test_c("sim_peer"), "sim_peer", inc, &["-lcuda"]);
    for case in ["props", "peer", "peer_async", "vmm_access", "vmm_share"] {
        let mut cmd = common::sim_cmd(&exe);
        cmd.arg(case).env("SIMCUDA_DEVICES", "2");
        let out = common::run_ok(&mut cmd);
        assert!(out.contains(&format!("PASS {case}")), "{out}");
    }
}

/// NVIDIA's deviceQuery / deviceQueryDrv samples (CUDA 12.9 tag, vendored in
/// `tests/data/cuda-samples` under their BSD-3-Clause licence), built with `c++` against
/// NVIDIA's headers and linked to simcuda; run on two simulated devices: their output.
fn device_query(inc: &(PathBuf, PathBuf), sample: &str, lib: &str) -> String {
    let dir = common::artifacts::source_root().join("tests/data/cuda-samples");
    let out = common::build_dir()
        .join("test-bin")
        .join(format!("{sample}-{}", std::process::id()));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let res = Command::new("c++")
        .args(["-O1", "-I"])
        .arg(&dir)
        .arg("-I")
        .arg(&inc.0)
        .arg("-I")
        .arg(&inc.1)
        .arg(dir.join(format!("{sample}.cpp")))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(common::sim_lib_dir())
        .arg(lib)
        .output()
        .expect("running c++");
    assert!(
        res.status.success(),
        "compiling {sample} against NVIDIA headers:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let mut cmd = common::sim_cmd(&out);
    cmd.env("SIMCUDA_DEVICES", "2");
    common::run_ok(&mut cmd)
}

/// The lines both samples print, whitespace collapsed and the few labels the two samples
/// spell differently made equal; `only_here` lists the lines (by prefix) one sample prints
/// and the other does not.
fn query_lines(out: &str, only_here: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .map(|l| {
            l.replace(
                "Maximum Texture Dimension Size (x,y,z)",
                "Max Texture Dimension Sizes",
            )
            .replace("), ", ") ")
            .replace("Peer-to-Peer (P2P) access", "Peer access")
        })
        .filter(|l| !l.is_empty() && !only_here.iter().any(|p| l.starts_with(p)))
        .collect();
    v.sort();
    v
}

#[test]
fn nvidia_device_query_samples_through_runtime_and_driver_agree_on_simcuda() {
    let Some(inc) = nvidia_includes_or_skip() else {
        return;
    };
    if Command::new("c++").arg("--version").output().is_err() {
        common::skip::skip("NVIDIA's deviceQuery samples", "no c++ compiler");
        return;
    }
    let rt = device_query(inc, "deviceQuery", "-lcudart");
    let drv = device_query(inc, "deviceQueryDrv", "-lcuda");
    for out in [&rt, &drv] {
        assert!(
            out.contains("Detected 2 CUDA Capable device(s)") && out.contains("Result = PASS"),
            "{out}"
        );
    }
    // What the runtime's cudaDeviceProp once got wrong while the driver answered right.
    for line in [
        "Device supports Unified Addressing (UVA): Yes",
        "Device supports Managed Memory: Yes",
        "Support host page-locked memory mapping: Yes",
        "Concurrent copy and kernel execution: Yes with 2 copy engine(s)",
        "> Peer access from simcuda Device 0 (GPU0) -> simcuda Device 1 (GPU1) : Yes",
    ] {
        assert!(
            query_lines(&rt, &[]).iter().any(|l| l == line),
            "{line}\n{rt}"
        );
    }
    let rt_lines = query_lines(
        &rt,
        &[
            "/",
            "CUDA Device Query (Runtime API)",
            "CUDA Driver Version / Runtime Version",
            "Total shared memory per multiprocessor",
            "deviceQuery, CUDA Driver = CUDART",
        ],
    );
    let drv_lines = query_lines(
        &drv,
        &[
            "/",
            "CUDA Device Query (Driver API)",
            "CUDA Driver Version:",
            "Concurrent kernel execution",
        ],
    );
    assert!(rt_lines.len() > 60, "{rt}");
    assert_eq!(
        rt_lines, drv_lines,
        "deviceQuery (runtime) and deviceQueryDrv (driver) differ"
    );
    // The lines only one of them prints still say what the attributes say.
    assert!(
        rt.contains("CUDA Driver Version / Runtime Version          12.9 / 12.9"),
        "{rt}"
    );
    assert!(
        drv.contains("CUDA Driver Version:                           12.9"),
        "{drv}"
    );
    assert!(
        rt.contains("Total shared memory per multiprocessor:        233472 bytes"),
        "{rt}"
    );
}

#[test]
fn runtime_program_built_with_nvidia_headers_runs_on_simcuda() {
    run_cases(
        "sim_runtime",
        &[
            "memcpy_memset_roundtrip",
            "device_properties",
            "pointer_attributes",
            "error_names_and_strings",
            "versions",
            "last_error_sticky",
        ],
        &[("SIMCUDA_MEM_MB", "1024")],
    );
}

#[test]
fn driver_program_built_with_nvidia_headers_runs_on_simcuda() {
    run_cases(
        "sim_driver",
        &[
            "memory_calls_need_a_context",
            "copies_and_sets",
            "address_range_of_interior_pointer",
            "primary_context_refcount",
        ],
        &[],
    );
}

#[test]
fn vmm_program_built_with_nvidia_headers_runs_on_simcuda() {
    run_cases(
        "sim_vmm",
        &["map_access_unmap_roundtrip", "bad_maps_are_rejected"],
        &[],
    );
}

#[test]
fn stream_and_capture_programs_built_with_nvidia_headers_run_on_simcuda() {
    run_cases(
        "sim_streams",
        &[
            "event_readiness",
            "driver_streams_and_host_funcs",
            "driver_async_copies_timing_and_context_stack",
        ],
        &[],
    );
    run_cases(
        "sim_capture",
        &[
            "malloc_in_global_capture_fails_and_invalidates",
            "relaxed_thread_mode_allows_malloc",
        ],
        &[],
    );
}

#[test]
fn client_facing_entry_points_built_with_nvidia_headers_run_on_simcuda() {
    let Some(inc) = nvidia_includes_or_skip() else {
        return;
    };
    let exe = compile_nvidia(
        &test_c("sim_clients"),
        "sim_clients",
        inc,
        &["-lcuda", "-ldl"],
    );
    for (case, env) in [
        ("uuid", &[("SIMCUDA_DEVICES", "2")][..]),
        ("attributes", &[]),
        ("pageable_htod_consumes_its_source", &[]),
        ("unified_copies", &[]),
    ] {
        let out = common::run_ok(common::sim_cmd(&exe).arg(case).envs(env.iter().copied()));
        assert!(out.contains(&format!("PASS {case}")), "{out}");
    }
    let ipc = compile_nvidia(&test_c("sim_ipc"), "sim_ipc", inc, &["-lcuda"]);
    let out = common::run_ok(common::sim_cmd(&ipc).arg("export"));
    assert!(
        out.contains("imported ok") && out.contains("PASS export"),
        "{out}"
    );
    // CUDA 12.9's headers define exactly the attributes simcuda answers.
    let out = common::run_ok(common::sim_cmd(&exe).arg("attributes"));
    assert!(out.contains("attributes=143"), "{out}");
}

#[test]
fn procaddr_program_built_with_nvidia_headers_runs_on_simcuda() {
    let Some(inc) = nvidia_includes_or_skip() else {
        return;
    };
    let exe = compile_nvidia(&test_c("sim_procaddr"), "sim_procaddr", inc, &["-ldl"]);
    let list =
        common::artifacts::source_root().join("tests/data/cudart-12.9-static-getprocaddress.txt");
    let out = common::run_ok(common::sim_cmd(&exe).arg(list));
    assert!(
        out.contains("entries: 419") && out.contains("PASS procaddr"),
        "{out}"
    );
}

/// Every value simcuda's headers declare, printed by a C program.
const ABI_PROBE: &str = r#"
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stddef.h>
#define V(x) printf("%s %lld\n", #x, (long long)(x));
#define S(t) printf("sizeof(%s) %zu\n", #t, sizeof(t));
#define O(t, f) printf("offsetof(%s,%s) %zu\n", #t, #f, offsetof(t, f));
/* every field of CUDA 12's cudaDeviceProp, in declaration order */
#define P(f) O(struct cudaDeviceProp, f)
int main(void) {
    V(CUDA_VERSION) V(CUDART_VERSION)
    V(CUDA_SUCCESS) V(CUDA_ERROR_INVALID_VALUE) V(CUDA_ERROR_OUT_OF_MEMORY) V(CUDA_ERROR_NOT_INITIALIZED)
    V(CUDA_ERROR_DEINITIALIZED) V(CUDA_ERROR_NO_DEVICE) V(CUDA_ERROR_INVALID_DEVICE) V(CUDA_ERROR_INVALID_CONTEXT)
    V(CUDA_ERROR_INVALID_HANDLE) V(CUDA_ERROR_ILLEGAL_STATE) V(CUDA_ERROR_NOT_FOUND) V(CUDA_ERROR_NOT_READY)
    V(CUDA_ERROR_ILLEGAL_ADDRESS) V(CUDA_ERROR_NOT_PERMITTED) V(CUDA_ERROR_NOT_SUPPORTED)
    V(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) V(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) V(CUDA_ERROR_STREAM_CAPTURE_MERGE)
    V(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED) V(CUDA_ERROR_STREAM_CAPTURE_UNJOINED) V(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
    V(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) V(CUDA_ERROR_CAPTURED_EVENT) V(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) V(CUDA_ERROR_UNKNOWN)
    V(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) V(CU_DEVICE_ATTRIBUTE_WARP_SIZE) V(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    V(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) V(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
    V(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) V(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    V(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED) V(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
    V(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) V(CU_DEVICE_ATTRIBUTE_MAX)
    V(CU_IPC_HANDLE_SIZE) V(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) S(CUipcMemHandle)
    V(CUDA_IPC_HANDLE_SIZE) V(cudaIpcMemLazyEnablePeerAccess) S(cudaIpcMemHandle_t)
    V(CU_STREAM_DEFAULT) V(CU_STREAM_NON_BLOCKING) V((size_t)CU_STREAM_LEGACY) V((size_t)CU_STREAM_PER_THREAD)
    V(CU_EVENT_DEFAULT) V(CU_EVENT_BLOCKING_SYNC) V(CU_EVENT_DISABLE_TIMING) V(CU_EVENT_INTERPROCESS)
    V(CU_MEMHOSTALLOC_PORTABLE) V(CU_MEMHOSTALLOC_DEVICEMAP) V(CU_MEMHOSTALLOC_WRITECOMBINED)
    V(CU_STREAM_CAPTURE_STATUS_NONE) V(CU_STREAM_CAPTURE_STATUS_ACTIVE) V(CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    V(CU_STREAM_CAPTURE_MODE_GLOBAL) V(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) V(CU_STREAM_CAPTURE_MODE_RELAXED)
    V(CU_GET_PROC_ADDRESS_DEFAULT) V(CU_GET_PROC_ADDRESS_LEGACY_STREAM) V(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
    V(CU_GET_PROC_ADDRESS_SUCCESS) V(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) V(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
    V(CU_MEM_HANDLE_TYPE_NONE) V(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) V(CU_MEM_HANDLE_TYPE_WIN32)
    V(CU_MEM_HANDLE_TYPE_WIN32_KMT) V(CU_MEM_HANDLE_TYPE_FABRIC) V(CU_MEM_HANDLE_TYPE_MAX)
    V(CU_MEM_ACCESS_FLAGS_PROT_NONE) V(CU_MEM_ACCESS_FLAGS_PROT_READ) V(CU_MEM_ACCESS_FLAGS_PROT_READWRITE) V(CU_MEM_ACCESS_FLAGS_PROT_MAX)
    V(CU_MEM_LOCATION_TYPE_INVALID) V(CU_MEM_LOCATION_TYPE_DEVICE) V(CU_MEM_LOCATION_TYPE_MAX)
    V(CU_MEM_ALLOCATION_TYPE_INVALID) V(CU_MEM_ALLOCATION_TYPE_PINNED) V(CU_MEM_ALLOCATION_TYPE_MAX)
    V(CU_MEM_ALLOC_GRANULARITY_MINIMUM) V(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    S(CUdeviceptr) S(CUdevice) S(CUmemGenericAllocationHandle) S(CUresult) S(CUuuid)
    S(CUmemLocation) S(CUmemAllocationProp) S(CUmemAccessDesc)
    O(CUmemAllocationProp, location) O(CUmemAllocationProp, win32HandleMetaData) O(CUmemAllocationProp, allocFlags)
    O(CUmemAccessDesc, flags)
    V(cudaSuccess) V(cudaErrorInvalidValue) V(cudaErrorMemoryAllocation) V(cudaErrorInitializationError)
    V(cudaErrorCudartUnloading) V(cudaErrorInvalidDevicePointer) V(cudaErrorInvalidMemcpyDirection) V(cudaErrorNoDevice)
    V(cudaErrorInvalidDevice) V(cudaErrorDeviceUninitialized) V(cudaErrorInvalidResourceHandle) V(cudaErrorIllegalState)
    V(cudaErrorSymbolNotFound) V(cudaErrorNotReady) V(cudaErrorIllegalAddress) V(cudaErrorNotPermitted) V(cudaErrorNotSupported)
    V(cudaErrorStreamCaptureUnsupported) V(cudaErrorStreamCaptureInvalidated) V(cudaErrorStreamCaptureMerge)
    V(cudaErrorStreamCaptureUnmatched) V(cudaErrorStreamCaptureUnjoined) V(cudaErrorStreamCaptureIsolation)
    V(cudaErrorStreamCaptureImplicit) V(cudaErrorCapturedEvent) V(cudaErrorStreamCaptureWrongThread) V(cudaErrorUnknown)
    V(cudaMemcpyHostToHost) V(cudaMemcpyHostToDevice) V(cudaMemcpyDeviceToHost) V(cudaMemcpyDeviceToDevice) V(cudaMemcpyDefault)
    V(cudaMemoryTypeUnregistered) V(cudaMemoryTypeHost) V(cudaMemoryTypeDevice) V(cudaMemoryTypeManaged)
    V(cudaStreamCaptureStatusNone) V(cudaStreamCaptureStatusActive) V(cudaStreamCaptureStatusInvalidated)
    V(cudaStreamCaptureModeGlobal) V(cudaStreamCaptureModeThreadLocal) V(cudaStreamCaptureModeRelaxed)
    V(cudaDevAttrMaxThreadsPerBlock) V(cudaDevAttrWarpSize) V(cudaDevAttrMultiProcessorCount)
    V(cudaDevAttrComputeCapabilityMajor) V(cudaDevAttrComputeCapabilityMinor) V(cudaDevAttrMemoryPoolsSupported)
    V((size_t)cudaStreamLegacy) V((size_t)cudaStreamPerThread) V(cudaStreamDefault) V(cudaStreamNonBlocking)
    V(cudaEventDefault) V(cudaEventBlockingSync) V(cudaEventDisableTiming) V(cudaEventInterprocess)
    V(cudaHostAllocDefault) V(cudaHostAllocPortable) V(cudaHostAllocMapped) V(cudaHostAllocWriteCombined)
    S(cudaError_t) S(cudaStream_t) S(cudaEvent_t) S(cudaUUID_t) S(struct cudaPointerAttributes) S(struct cudaDeviceProp)
    O(struct cudaPointerAttributes, device) O(struct cudaPointerAttributes, devicePointer) O(struct cudaPointerAttributes, hostPointer)
    P(name) P(uuid) P(luid) P(luidDeviceNodeMask) P(totalGlobalMem) P(sharedMemPerBlock)
    P(regsPerBlock) P(warpSize) P(memPitch) P(maxThreadsPerBlock) P(maxThreadsDim) P(maxGridSize)
    P(clockRate) P(totalConstMem) P(major) P(minor) P(textureAlignment) P(texturePitchAlignment)
    P(deviceOverlap) P(multiProcessorCount) P(kernelExecTimeoutEnabled) P(integrated)
    P(canMapHostMemory) P(computeMode) P(maxTexture1D) P(maxTexture1DMipmap) P(maxTexture1DLinear)
    P(maxTexture2D) P(maxTexture2DMipmap) P(maxTexture2DLinear) P(maxTexture2DGather)
    P(maxTexture3D) P(maxTexture3DAlt) P(maxTextureCubemap) P(maxTexture1DLayered)
    P(maxTexture2DLayered) P(maxTextureCubemapLayered) P(maxSurface1D) P(maxSurface2D)
    P(maxSurface3D) P(maxSurface1DLayered) P(maxSurface2DLayered) P(maxSurfaceCubemap)
    P(maxSurfaceCubemapLayered) P(surfaceAlignment) P(concurrentKernels) P(ECCEnabled) P(pciBusID)
    P(pciDeviceID) P(pciDomainID) P(tccDriver) P(asyncEngineCount) P(unifiedAddressing)
    P(memoryClockRate) P(memoryBusWidth) P(l2CacheSize) P(persistingL2CacheMaxSize)
    P(maxThreadsPerMultiProcessor) P(streamPrioritiesSupported) P(globalL1CacheSupported)
    P(localL1CacheSupported) P(sharedMemPerMultiprocessor) P(regsPerMultiprocessor) P(managedMemory)
    P(isMultiGpuBoard) P(multiGpuBoardGroupID) P(hostNativeAtomicSupported)
    P(singleToDoublePrecisionPerfRatio) P(pageableMemoryAccess) P(concurrentManagedAccess)
    P(computePreemptionSupported) P(canUseHostPointerForRegisteredMem) P(cooperativeLaunch)
    P(cooperativeMultiDeviceLaunch) P(sharedMemPerBlockOptin)
    P(pageableMemoryAccessUsesHostPageTables) P(directManagedMemAccessFromHost)
    P(maxBlocksPerMultiProcessor) P(accessPolicyMaxWindowSize) P(reservedSharedMemPerBlock)
    P(hostRegisterSupported) P(sparseCudaArraySupported) P(hostRegisterReadOnlySupported)
    P(timelineSemaphoreInteropSupported) P(memoryPoolsSupported) P(gpuDirectRDMASupported)
    P(gpuDirectRDMAFlushWritesOptions) P(gpuDirectRDMAWritesOrdering)
    P(memoryPoolSupportedHandleTypes) P(deferredMappingCudaArraySupported) P(ipcEventSupported)
    P(clusterLaunch) P(unifiedFunctionPointers) P(reserved)
    return 0;
}
"#;

fn probe(includes: &[&Path]) -> String {
    let dir = common::scratch(&format!("abi-probe-{}", includes.len()));
    let src = dir.join("probe.c");
    std::fs::write(&src, ABI_PROBE).unwrap();
    let exe = dir.join("probe");
    let mut cc = Command::new("cc");
    for i in includes {
        cc.arg("-I").arg(i);
    }
    let res = cc.arg(&src).arg("-o").arg(&exe).output().unwrap();
    assert!(
        res.status.success(),
        "probe with {includes:?}:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn declared_constants_and_layouts_equal_nvidia_headers() {
    let Some(inc) = nvidia_includes_or_skip() else {
        return;
    };
    let ours = probe(&[&common::artifacts::simcuda_include_dir()]);
    let theirs = probe(&[&inc.0, &inc.1]);
    assert!(ours.lines().count() > 150, "{ours}");
    for (a, b) in ours.lines().zip(theirs.lines()) {
        assert_eq!(a, b, "simcuda vs NVIDIA");
    }
    assert_eq!(ours.lines().count(), theirs.lines().count());
}

#[test]
fn per_thread_default_stream_builds_with_nvidia_headers_link_and_run_on_simcuda() {
    let Some(inc) = nvidia_includes_or_skip() else {
        return;
    };
    let ptds = ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"];
    // every _ptds / _ptsz name NVIDIA's headers select for these programs must link
    for prog in ["sim_driver", "sim_vmm", "sim_capture"] {
        compile_nvidia(&test_c(prog), &format!("{prog}-ptds"), inc, &ptds);
    }
    let streams = compile_nvidia(&test_c("sim_streams"), "sim_streams-ptds", inc, &ptds);
    for case in [
        "event_readiness",
        "driver_async_copies_timing_and_context_stack",
        "work_runs_in_stream_order",
    ] {
        let out = common::run_ok(common::sim_cmd(&streams).arg(case));
        assert!(out.contains(&format!("PASS {case}")), "{out}");
    }
    let exe = compile_nvidia(&test_c("sim_ptds"), "sim_ptds", inc, &ptds);
    let out = common::run_ok(&mut common::sim_cmd(&exe));
    assert!(out.contains("seen 0") && out.contains("PASS ptds"), "{out}");
}
