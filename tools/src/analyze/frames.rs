//! Which frame of a stack is the program's: the site a block is attributed to.
//!
//! Policy: a stack is innermost first; the site is the first frame that is not machinery
//! between the program and the memory, i.e. not the allocator, the CUDA runtime or driver,
//! a framework's allocator internals, or cushim's own. PyTorch's snapshots start every stack
//! with `torch::unwind::unwind()` and `c10::cuda::CUDACachingAllocator` frames, then ATen
//! (`at::`) operator dispatch; attributing to them would put every block at one "site", so
//! they are skipped. Python frames inside the `torch` package itself are skipped as well
//! (the caller of `torch.empty` is the answer, not `torch/nn/modules/linear.py`), but only
//! while a frame outside it follows: a stack of nothing but machinery keeps its innermost
//! frame, so no block is ever left without a site. At the other end, the frames that only
//! start a process or thread (`_start`, `__libc_start_main`, ...) are trimmed.

use crate::analyze::model::{Frame, Stacks};

/// Name prefixes of machinery frames (C++ namespaces, CUDA API symbols, cushim's crates).
const SKIP_NAME_PREFIXES: &[&str] = &[
    "torch::unwind::",
    "torch::CapturedTraceback",
    "torch::",
    "c10::",
    "at::",
    "cudaMalloc",
    "cudaFree",
    "cuMem",
    "__cudart",
    "cudart::",
    "cushim::",
    "cushim_shim::",
    "simcuda::",
    "rmm::mr::",
    "std::unique_ptr<void, std::function",
];

/// File path parts of machinery frames.
const SKIP_FILE_PARTS: &[&str] = &[
    "/torch/cuda/memory.py",
    "/torch/utils/_",
    "/torch/_ops.py",
    "/torch/_tensor.py",
    "/torch/nn/modules/",
    "/torch/nn/functional.py",
    "/torch/_refs/",
    "/torch/_prims",
    "/torch/autograd/",
    "/torch/optim/",
    "/c10/cuda/",
    "/aten/src/",
    "libcudart",
    "libcuda.so",
    "libc10",
    "libtorch",
    "libcushim",
    "libsimcuda",
];

/// Outermost frames that only start a process or thread (trimmed from the caller's end).
const START_FRAMES: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
];

/// Whether `f` is machinery between the program and the memory.
pub fn is_machinery(f: &Frame) -> bool {
    let name = f.name.trim_start();
    SKIP_NAME_PREFIXES.iter().any(|p| name.starts_with(p))
        || SKIP_FILE_PARTS.iter().any(|p| f.file.contains(p))
        || name == "??"
}

/// The frames of stack `id` from the program's first frame on, innermost first (the whole
/// stack when every frame is machinery).
pub fn program_frames(stacks: &Stacks, id: u32) -> Vec<&Frame> {
    let mut all: Vec<&Frame> = stacks.frames_of(id).collect();
    while all.len() > 1
        && all
            .last()
            .is_some_and(|f| START_FRAMES.contains(&f.name.trim()))
    {
        all.pop();
    }
    match all.iter().position(|f| !is_machinery(f)) {
        Some(p) => all[p..].to_vec(),
        None => all,
    }
}

/// `name (file:line)` of a frame.
pub fn describe(f: &Frame) -> String {
    format!("{} ({}:{})", f.name, f.file, f.line)
}

/// The site of stack `id`: its first program frame and `depth - 1` callers, innermost
/// first, joined by ` <- `; `<no stack>` when nothing was recorded.
pub fn site(stacks: &Stacks, id: u32, depth: usize) -> String {
    let frames = program_frames(stacks, id);
    if frames.is_empty() {
        return "<no stack>".to_string();
    }
    frames
        .iter()
        .take(depth.max(1))
        .map(|f| describe(f))
        .collect::<Vec<_>>()
        .join(" <- ")
}
