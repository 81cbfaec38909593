//! Named latency profiles (`SIMCUDA_LATENCY=cuda`): per-call figures of a real CUDA driver,
//! each with where it comes from, for `latency` to charge. A profile is a *model*: where
//! NVIDIA or a measurement publishes a figure it is used; where none is published the figure
//! is chosen, and said to be chosen.
//!
//! Policy for chosen figures: the profile exists to check that a program is never slower
//! with the shim than without it, so a chosen figure errs against the shim: the calls a
//! cache saves (allocation, free, the free's device synchronization) get the *low* end of
//! what is plausible, and the calls it adds (event record, stream wait, stream query,
//! capture status, context and capture-mode queries, virtual memory calls) the *high* end.
//! `scripts/gpu-check.sh` measures the same calls on a GPU (its `latency` step), so a lent GPU
//! can check each figure; `docs/latency-profile.md` lists them with their sources.

/// One profile.
pub struct Profile {
    pub name: &'static str,
    /// Flat figures, ns, by exported entry-point name.
    pub flat: &'static [(&'static str, u64)],
    /// Entry points charged by size instead (`latency::sized`).
    pub sized: &'static [&'static str],
    /// Allocation tiers: (largest size in bytes, ns); the last tier covers every larger size.
    pub alloc_tiers: &'static [(usize, u64)],
    /// A device synchronization, added to every sized free (`cudaFree`/`cuMemFree`
    /// synchronize the device).
    pub free_sync_ns: u64,
}

impl Profile {
    /// The modelled cost of allocating (or freeing) `bytes`.
    pub fn alloc_ns(&self, bytes: usize) -> u64 {
        self.alloc_tiers
            .iter()
            .find(|&&(max, _)| bytes <= max)
            .or(self.alloc_tiers.last())
            .map_or(0, |&(_, ns)| ns)
    }
}

const US: u64 = 1_000;

/// A device synchronization on an idle device: no figure published; chosen low (a
/// synchronization the program would make without the shim is what a cache saves).
const SYNC: u64 = US;

/// CUDA on a discrete GPU, as published where published.
///
/// Sources:
/// - [V] "Memory Allocation Overhead", cs.virginia.edu/~mwb7w/cuda_support/
///   memory_management_overhead.html (measured): cudaMalloc "slightly less than 1
///   microsecond for memory sizes less than 256 bytes", "a significant increase between 2 KB
///   and 4 KB, and then a relatively constant overhead of about 50 microseconds up to 512 KB",
///   more above; cudaMallocHost "approximately 2,300 microseconds per call until around 1 MB".
/// - [N] NVIDIA, "Using the NVIDIA CUDA Stream-Ordered Memory Allocator, Part 1" (developer
///   blog, 2021): cudaFree "has to wait for" earlier work, "so it synchronizes the device
///   before freeing the memory"; the driver API reference of `cuMemFree`: "this API may perform
///   implicit synchronization" for memory not from a stream-ordered pool.
/// - none: no published per-call figure was found; chosen by the policy above.
pub const CUDA: Profile = Profile {
    name: "cuda",
    flat: &[
        // Synchronization: none published; chosen low (1 µs, an idle device).
        ("cuCtxSynchronize", SYNC),
        ("cudaDeviceSynchronize", SYNC),
        ("cuStreamSynchronize", SYNC),
        ("cuStreamSynchronize_ptsz", SYNC),
        ("cudaStreamSynchronize", SYNC),
        ("cudaStreamSynchronize_ptsz", SYNC),
        ("cuEventSynchronize", SYNC),
        ("cudaEventSynchronize", SYNC),
        // Event record and stream wait: none published; chosen high (2 µs each, the order of
        // a command pushed to the GPU's queue).
        ("cuEventRecord", 2 * US),
        ("cuEventRecord_ptsz", 2 * US),
        ("cudaEventRecord", 2 * US),
        ("cudaEventRecord_ptsz", 2 * US),
        ("cuStreamWaitEvent", 2 * US),
        ("cuStreamWaitEvent_ptsz", 2 * US),
        ("cudaStreamWaitEvent", 2 * US),
        ("cudaStreamWaitEvent_ptsz", 2 * US),
        // Queries (a read of the GPU's progress): none published; chosen high (1 µs).
        ("cuStreamQuery", US),
        ("cuStreamQuery_ptsz", US),
        ("cudaStreamQuery", US),
        ("cudaStreamQuery_ptsz", US),
        ("cuEventQuery", US),
        ("cudaEventQuery", US),
        // Capture status (host-side state): none published; chosen high (0.5 µs).
        ("cuStreamIsCapturing", US / 2),
        ("cuStreamIsCapturing_ptsz", US / 2),
        ("cudaStreamIsCapturing", US / 2),
        ("cudaStreamIsCapturing_ptsz", US / 2),
        // Thread-local driver state: none published; chosen high (0.1 µs).
        ("cuCtxGetCurrent", US / 10),
        ("cuCtxSetCurrent", US / 10),
        ("cuThreadExchangeStreamCaptureMode", US / 10),
        ("cudaThreadExchangeStreamCaptureMode", US / 10),
        // Event creation and destruction: none published; chosen high (2 µs).
        ("cuEventCreate", 2 * US),
        ("cudaEventCreate", 2 * US),
        ("cudaEventCreateWithFlags", 2 * US),
        ("cuEventDestroy", 2 * US),
        ("cuEventDestroy_v2", 2 * US),
        ("cudaEventDestroy", 2 * US),
        // Virtual memory management: none published per call; chosen high. Creating and
        // releasing physical memory as a cudaMalloc of the 512 KB tier [V] (50 µs); reserving,
        // mapping, unmapping and freeing a range 10 µs; setting access (page tables) 50 µs.
        ("cuMemCreate", 50 * US),
        ("cuMemRelease", 50 * US),
        ("cuMemAddressReserve", 10 * US),
        ("cuMemAddressFree", 10 * US),
        ("cuMemMap", 10 * US),
        ("cuMemUnmap", 10 * US),
        ("cuMemSetAccess", 50 * US),
        // Pinned host memory [V]: 2,300 µs per allocation; its free has no published figure
        // and is modelled at the allocation's.
        ("cudaMallocHost", 2_300 * US),
        ("cudaHostAlloc", 2_300 * US),
        ("cuMemHostAlloc", 2_300 * US),
        ("cuMemAllocHost_v2", 2_300 * US),
        ("cudaFreeHost", 2_300 * US),
        ("cuMemFreeHost", 2_300 * US),
    ],
    sized: &["cudaMalloc", "cuMemAlloc_v2", "cudaFree", "cuMemFree_v2"],
    // [V]: below 1 µs up to 256 B, rising between 2 KB and 4 KB to about 50 µs up to 512 KB,
    // more above (the low end, 50 µs, is kept there). A free has no published figure and is
    // modelled at its allocation's, plus the device synchronization [N].
    alloc_tiers: &[(2048, US), (usize::MAX, 50 * US)],
    free_sync_ns: SYNC,
};

/// Every profile, by name.
pub const ALL: &[&Profile] = &[&CUDA];

/// The profile called `name`.
pub fn by_name(name: &str) -> Option<&'static Profile> {
    ALL.iter().copied().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_figure_names_an_entry_point() {
        for p in ALL {
            let names = p
                .flat
                .iter()
                .map(|&(n, _)| n)
                .chain(p.sized.iter().copied());
            for name in names {
                assert!(
                    crate::api::by_name(name).is_some(),
                    "{name} in profile {}",
                    p.name
                );
            }
        }
    }

    #[test]
    fn allocation_tiers_follow_the_size() {
        assert_eq!(CUDA.alloc_ns(512), US);
        assert_eq!(CUDA.alloc_ns(1 << 20), 50 * US);
        assert_eq!(CUDA.alloc_ns(64 << 20), 50 * US);
    }
}
