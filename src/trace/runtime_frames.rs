//! Frames of a CUDA runtime linked into the program, above its call site.
//!
//! With a dynamically linked runtime the shim catches `cudaMalloc` itself, and capture skips
//! the shim's own frames, so a stack starts at the program's call site. With a statically
//! linked runtime (nvcc's default) the shim catches the driver call the runtime makes, and
//! the runtime's own frames (`cudaMalloc`, `cudart::...`) sit inside the program binary
//! between the hook and the call site. Invariant: at dump time those leading frames are
//! dropped, recognised by name only (the runtime's exact entry-point names, or its internal
//! `cudart::`/`__cudart` namespaces), never a frame below the first non-runtime one, and
//! never the last frame of a stack.

/// Runtime entry points whose driver calls the shim hooks.
const ENTRY_POINTS: [&str; 12] = [
    "cudaMalloc",
    "cudaFree",
    "cudaMallocHost",
    "cudaHostAlloc",
    "cudaFreeHost",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaMallocAsync_ptsz",
    "cudaFreeAsync_ptsz",
    "cudaMemGetInfo",
    "cudaStreamCreate",
    "cudaStreamDestroy",
];

/// Whether a symbolized frame name belongs to a linked-in CUDA runtime.
pub fn is_runtime_frame(name: &str) -> bool {
    ENTRY_POINTS.contains(&name) || name.starts_with("cudart::") || name.starts_with("__cudart")
}

/// How many leading frames of a stack (innermost first) to drop: the run of runtime frames
/// at its top, keeping at least one frame.
pub fn leading_runtime_frames<'a>(names: impl IntoIterator<Item = &'a str>) -> usize {
    let mut n = 0usize;
    let mut total = 0usize;
    let mut in_run = true;
    for name in names {
        total += 1;
        if in_run && is_runtime_frame(name) {
            n += 1;
        } else {
            in_run = false;
        }
    }
    n.min(total.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_static_runtimes_entry_and_internal_frames_are_dropped_from_the_top() {
        let names = ["cudaHostAlloc", "cudaMallocHost", "load_weights", "main"];
        assert_eq!(leading_runtime_frames(names), 2);
        let names = [
            "cudart::cudaApiMalloc(void**, unsigned long)",
            "cudaMalloc",
            "f",
            "main",
        ];
        assert_eq!(leading_runtime_frames(names), 2);
    }

    #[test]
    fn program_frames_and_later_runtime_frames_are_kept() {
        assert_eq!(leading_runtime_frames(["cuda_alloc_helper", "main"]), 0);
        assert_eq!(leading_runtime_frames(["cudaMallocWrapper", "main"]), 0);
        assert_eq!(leading_runtime_frames(["f", "cudaMalloc", "main"]), 0);
    }

    #[test]
    fn a_stack_of_runtime_frames_only_keeps_its_last_frame() {
        assert_eq!(leading_runtime_frames(["cudaMalloc", "cudaFree"]), 1);
        assert_eq!(leading_runtime_frames([]), 0);
    }
}
