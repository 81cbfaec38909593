//! Device attributes (`cuDeviceGetAttribute`, `cudaDeviceGetAttribute`): every attribute
//! CUDA 12.9's `CUdevice_attribute` defines (1 ..= 143), answered as an H100 SXM-class device
//! (compute capability 9.0, 132 SMs) would answer, so a client's start-up (NVIDIA's runtime
//! asks for nearly all of them, numba-cuda and cudarc for many) sees a real device.
//! Policy: values are a real H100's where simcuda's behaviour does not differ; where it does,
//! the value says what simcuda does (virtual memory management and its POSIX descriptor
//! export follow `SIMCUDA_VMM`; pageable
//! memory is not device-accessible; no NVSwitch multicast, MPS, NUMA or Windows handles).
//! Anything outside 1 ..= 143 is `CUDA_ERROR_INVALID_VALUE`, as in the driver.

use libc::c_int;

/// One past the last attribute CUDA 12.9 defines (`CU_DEVICE_ATTRIBUTE_MAX`).
pub const ATTRIBUTE_MAX: c_int = 144;

/// The value of attribute `attr` on device `ordinal`, `None` when CUDA defines no such
/// attribute. `vmm`: virtual memory management enabled.
pub fn value(attr: c_int, ordinal: usize, vmm: bool) -> Option<c_int> {
    let ord = ordinal as c_int;
    Some(match attr {
        1..=3 => 1024,       // threads per block, block dims x, y
        4 => 64,             // block dim z
        5 => i32::MAX,       // grid dim x
        6 | 7 => 65535,      // grid dims y, z
        8 => 49152,          // shared memory per block
        9 => 65536,          // constant memory
        10 => 32,            // warp size
        11 => i32::MAX,      // max pitch
        12 => 65536,         // registers per block
        13 => 1_980_000,     // clock rate, kHz
        14 => 512,           // texture alignment
        15 => 1,             // GPU overlap
        16 => 132,           // multiprocessors
        17 | 18 => 0,        // kernel exec timeout, integrated
        19 => 1,             // can map host memory
        20 => 0,             // compute mode: default
        21 | 22 => 131072,   // texture 1D, 2D width
        23 => 65536,         // texture 2D height
        24..=26 => 16384,    // texture 3D
        27 | 28 => 32768,    // texture 2D layered width, height
        29 => 2048,          // texture 2D layered layers
        30 => 512,           // surface alignment
        31 | 32 => 1,        // concurrent kernels, ECC
        33 => ord + 1,       // PCI bus id
        34 | 35 => 0,        // PCI device id, TCC
        36 => 2_619_000,     // memory clock, kHz
        37 => 5120,          // memory bus width
        38 => 50 << 20,      // L2 size
        39 => 2048,          // threads per SM
        40 => 2,             // async engines
        41 => 1,             // unified addressing
        42 => 32768,         // texture 1D layered width
        43 => 2048,          // texture 1D layered layers
        44 => 1,             // can texture-2D gather
        45 | 46 => 32768,    // texture 2D gather
        47 | 48 => 8192,     // texture 3D alternate width, height
        49 => 32768,         // texture 3D alternate depth
        50 => 0,             // PCI domain
        51 => 32,            // texture pitch alignment
        52 | 53 => 32768,    // cubemap, layered cubemap width
        54 => 2046,          // layered cubemap layers
        55 => 32768,         // surface 1D
        56 => 131072,        // surface 2D width
        57 => 65536,         // surface 2D height
        58..=60 => 16384,    // surface 3D
        61 => 32768,         // surface 1D layered width
        62 => 2048,          // surface 1D layered layers
        63 | 64 => 32768,    // surface 2D layered width, height
        65 => 2048,          // surface 2D layered layers
        66 | 67 => 32768,    // surface cubemap, layered
        68 => 2046,          // surface cubemap layered layers
        69 => 1 << 28,       // texture 1D linear width (deprecated)
        70 => 131072,        // texture 2D linear width
        71 => 65000,         // texture 2D linear height
        72 => 2_097_120,     // texture 2D linear pitch
        73 | 74 => 32768,    // texture 2D mipmapped
        75 => 9,             // compute capability major
        76 => 0,             // compute capability minor
        77 => 32768,         // texture 1D mipmapped width
        78..=80 => 1,        // stream priorities, global and local L1 caching
        81 => 233_472,       // shared memory per SM
        82 => 65536,         // registers per SM
        83 => 1,             // managed memory
        84 => 0,             // multi-GPU board
        85 => ord,           // multi-GPU board group id
        86 => 0,             // host native atomics (PCIe host)
        87 => 2,             // single:double performance ratio
        88 => 0,             // pageable memory access
        89..=91 => 1, // concurrent managed access, preemption, host pointer for registered memory
        92..=96 => 1, // stream mem ops v1, cooperative launches
        97 => 232_448, // shared memory per block, opt-in
        98 => 0,      // flush remote writes
        99 => 1,      // host register
        100 | 101 => 0, // pageable via host page tables, direct managed access from host
        102 => vmm as c_int, // virtual memory management
        103 => vmm as c_int, // POSIX fd export of VMM handles (a memfd)
        104 | 105 => 0, // Win32 handles
        106 => 32,    // blocks per SM
        107 => 0,     // generic compression: simcuda does not compress
        108 => 32_505_856, // max persisting L2
        109 => 134_213_632, // max access policy window
        110 => 0,     // GPUDirect RDMA with VMM: no RDMA here
        111 => 1024,  // reserved shared memory per block
        112..=115 => 1, // sparse arrays, read-only host register, timeline semaphores, memory pools
        116 => 0,     // GPUDirect RDMA: no RDMA here
        117 | 118 => 0, // RDMA flush options, writes ordering: no RDMA here
        119 => 0,     // mempool IPC handle types: none in simcuda
        120..=123 => 1, // cluster launch, deferred mapping, 64-bit mem ops, wait NOR
        124 | 125 => 0, // dma_buf, IPC events: not in simcuda
        126 => 4,     // memory sync domains
        127 => 1,     // tensor maps
        128 => 0,     // fabric handles
        129 => 1,     // unified function pointers
        130 => 0,     // NUMA config: none
        131 => -1,    // NUMA id
        132 | 133 => 0, // multicast, MPS
        134 => -1,    // host NUMA id: no NUMA
        135..=138 => 0, // D3D12 CIG, decompression, Vulkan CIG
        139 => 0x2330_10DE, // PCI device and vendor id (H100 SXM5, NVIDIA)
        140 => 0x16C1_10DE, // PCI subsystem and vendor id
        141..=143 => 0, // host NUMA VMM, pools, multinode IPC
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attribute_of_cuda_12_9_has_a_value_and_nothing_else_does() {
        for a in 1..ATTRIBUTE_MAX {
            assert!(value(a, 0, true).is_some(), "attribute {a}");
        }
        for a in [0, ATTRIBUTE_MAX, -1, 1000] {
            assert_eq!(value(a, 0, true), None, "attribute {a}");
        }
        assert_eq!(value(102, 0, false), Some(0));
        assert_eq!(value(33, 1, true), Some(2));
    }
}
