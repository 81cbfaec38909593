//! The one table that says what kind of memory an allocation is (`cushim summary --by
//! category`), and the user's own rules (`--category NAME=REGEX`).
//!
//! Policy: an allocation's category is decided, first match wins, by
//! 1. being live when the trace began: "before the recording / no stack" (its allocation
//!    was not seen; kept as its own line, never spread over the others);
//! 2. the user's rules, in the order given, over the allocation's own frames
//!    (`name file:line`) and its NVTX range path / `user_metadata`;
//! 3. the private pool it came from (a CUDA graph's or a `MemPool`'s);
//! 4. having no frame and no range path at all: "before the recording / no stack" too
//!    (nothing tells what it is);
//! 5. [`FRAME_RULES`]: frame patterns that name the memory whatever the phase
//!    (compiled code, communication, library workspaces, parameters, gradients, optimizer
//!    state);
//! 6. the phase it was made in and whether it outlived that phase ([`by_phase`]): made in
//!    the forward pass and freed in it, a forward temporary, else an activation kept for
//!    the backward pass; made in the backward pass and freed in it, a backward temporary,
//!    else a gradient; made in the optimizer's step and freed in it, an optimizer
//!    temporary, else optimizer state;
//! 7. else "unclassified" (made outside the forward, backward and optimizer phases).
//!
//! The phase of an event comes from [`PHASE_RULES`] over its own frames (not the forward
//! frames PyTorch adds to a backward allocation) and its range path; an event with no clue
//! takes the phase around it (`analyze::category`). Patterns match demangled C++ names and
//! Python files by substring (paths recorded on Windows with `\` match as `/`), so one
//! rule covers every spelling and every install prefix.

use crate::analyze::model::Frame;

/// A built-in category. The order is the order of the text output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
    ForwardTemporaries,
    BackwardTemporaries,
    OptimizerTemporaries,
    Workspaces,
    Communication,
    GraphPools,
    Compiled,
    PinnedHost,
    Unclassified,
    BeforeOrNoStack,
}

impl Category {
    pub const ALL: [Category; 14] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::ForwardTemporaries,
        Category::BackwardTemporaries,
        Category::OptimizerTemporaries,
        Category::Workspaces,
        Category::Communication,
        Category::GraphPools,
        Category::Compiled,
        Category::PinnedHost,
        Category::Unclassified,
        Category::BeforeOrNoStack,
    ];

    /// The name shown in the text and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameters => "parameters and buffers",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer state",
            Category::Activations => "activations kept for backward",
            Category::ForwardTemporaries => "forward temporaries",
            Category::BackwardTemporaries => "backward temporaries",
            Category::OptimizerTemporaries => "optimizer temporaries",
            Category::Workspaces => "library workspaces",
            Category::Communication => "communication",
            Category::GraphPools => "CUDA-graph private pools",
            Category::Compiled => "compiled code",
            Category::PinnedHost => "pinned host memory",
            Category::Unclassified => "unclassified",
            Category::BeforeOrNoStack => "before the recording / no stack",
        }
    }
}

/// A phase of a training or inference loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
    Outside,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Outside => "outside",
        }
    }
}

/// What a rule looks at.
#[derive(Debug, Clone, Copy)]
pub enum Test {
    /// The frame's name contains this.
    Name(&'static str),
    /// The frame's name contains this, ignoring ASCII case.
    NameNoCase(&'static str),
    /// The frame's file contains this.
    File(&'static str),
    /// The frame's file contains the first and its name is exactly the second.
    FileAndName(&'static str, &'static str),
    /// A path element of the range path (`outer/inner`) contains this, ignoring ASCII case.
    Range(&'static str),
}

/// One frame rule: what it matches, the category it gives, and why.
#[derive(Debug, Clone, Copy)]
pub struct FrameRule {
    pub test: Test,
    pub category: Category,
    pub reason: &'static str,
}

/// One phase rule: what it matches, the phase it gives, and why.
#[derive(Debug, Clone, Copy)]
pub struct PhaseRule {
    pub test: Test,
    pub phase: Phase,
    pub reason: &'static str,
}

const fn fr(test: Test, category: Category, reason: &'static str) -> FrameRule {
    FrameRule {
        test,
        category,
        reason,
    }
}

const fn pr(test: Test, phase: Phase, reason: &'static str) -> PhaseRule {
    PhaseRule {
        test,
        phase,
        reason,
    }
}

use Category as C;
use Test::{File, FileAndName, Name, NameNoCase, Range};

/// Frame patterns that decide a category, first match wins (any own frame may match).
pub const FRAME_RULES: &[FrameRule] = &[
    fr(
        File("torch/_inductor/"),
        C::Compiled,
        "Inductor's runtime and generated wrappers allocate the buffers of compiled graphs",
    ),
    fr(
        File("torchinductor_"),
        C::Compiled,
        "Inductor's generated code (a module under /tmp/torchinductor_<user>/)",
    ),
    fr(
        File("/triton/"),
        C::Compiled,
        "Triton's launcher and autotuner allocate for compiled kernels",
    ),
    fr(
        Name("CompiledFunction"),
        C::Compiled,
        "AOTAutograd's compiled forward and backward (torch.compile)",
    ),
    fr(
        Name(crate::analyze::fx_nodes::FX_TAG),
        C::Compiled,
        "PyTorch named the FX node of a torch.compile graph that made the allocation",
    ),
    fr(
        Name("(torch.compile region)"),
        C::Compiled,
        "PyTorch recorded a compile_context: the allocation ran in a compiled region",
    ),
    fr(
        NameNoCase("nccl"),
        C::Communication,
        "NCCL and its PyTorch process group allocate communication buffers",
    ),
    fr(
        Name("c10d::"),
        C::Communication,
        "PyTorch's distributed C++ (c10d): collectives' buffers",
    ),
    fr(
        Name("ProcessGroup"),
        C::Communication,
        "a process group's collectives (Gloo, NCCL, MPI, UCC)",
    ),
    fr(
        File("torch/distributed/"),
        C::Communication,
        "torch.distributed's Python side: collectives, FSDP's flat buffers",
    ),
    fr(
        NameNoCase("workspace"),
        C::Workspaces,
        "cuBLAS, cuBLASLt and cuDNN workspaces are allocated by functions named for them \
         (getCUDABlasLtWorkspace, cudnn's Workspace)",
    ),
    fr(
        Name("getCurrentCUDABlasHandle"),
        C::Workspaces,
        "the cuBLAS handle's first use sets its workspace",
    ),
    fr(
        Name("getCurrentCUDABlasLtHandle"),
        C::Workspaces,
        "the cuBLASLt handle's first use sets its workspace",
    ),
    fr(
        Name("cublasLt"),
        C::Workspaces,
        "an allocation inside cuBLASLt is its workspace",
    ),
    fr(
        File("torch/nn/parameter.py"),
        C::Parameters,
        "nn.Parameter creation",
    ),
    fr(
        FileAndName("torch/nn/modules/module.py", "_apply"),
        C::Parameters,
        "Module.to()/.cuda()/.half() move parameters and buffers through _apply",
    ),
    fr(
        FileAndName("torch/nn/modules/module.py", "_load_from_state_dict"),
        C::Parameters,
        "loading a state dict copies into parameters and buffers",
    ),
    fr(
        Name("load_state_dict"),
        C::Parameters,
        "loading a state dict (a module's or a framework's)",
    ),
    fr(
        Name("reset_parameters"),
        C::Parameters,
        "a layer initialising its parameters",
    ),
    fr(
        File("torch/nn/init.py"),
        C::Parameters,
        "nn.init initialises parameters",
    ),
    fr(
        FileAndName("torch/nn/modules/", "__init__"),
        C::Parameters,
        "a torch.nn layer's constructor allocates its parameters and buffers (made on the \
         device with device=... or under torch.device)",
    ),
    fr(
        Name("from_pretrained"),
        C::Parameters,
        "Hugging Face models load their weights in from_pretrained",
    ),
    fr(
        Name("AccumulateGrad"),
        C::Gradients,
        "the autograd engine's AccumulateGrad node writes a parameter's .grad",
    ),
    fr(
        FileAndName("torch/optim/", "_init_group"),
        C::OptimizerState,
        "torch.optim's optimizers create their state (exp_avg, exp_avg_sq, momentum) lazily \
         in _init_group",
    ),
    fr(
        FileAndName("torch/optim/", "_init_state"),
        C::OptimizerState,
        "an optimizer creating its state",
    ),
];

/// Clues to the phase an event ran in, first match wins (any own frame, or the range path).
pub const PHASE_RULES: &[PhaseRule] = &[
    pr(
        Name(ENGINE),
        Phase::Backward,
        "the autograd engine runs the backward pass (on its own threads)",
    ),
    pr(
        Name("torch::autograd::generated::"),
        Phase::Backward,
        "an autograd node's backward function (MmBackward0::apply)",
    ),
    pr(
        FileAndName("torch/autograd/__init__.py", "backward"),
        Phase::Backward,
        "torch.autograd.backward",
    ),
    pr(
        FileAndName("torch/_tensor.py", "backward"),
        Phase::Backward,
        "Tensor.backward()",
    ),
    pr(
        Range("backward"),
        Phase::Backward,
        "an NVTX range or record_function named for the backward pass",
    ),
    pr(
        File("torch/optim/"),
        Phase::Optimizer,
        "torch.optim: the optimizer's step (and its wrapper around a custom optimizer)",
    ),
    pr(
        FileAndName("optim", "step"),
        Phase::Optimizer,
        "a step function in an optimizer's own file (a hand-written optimizer)",
    ),
    pr(
        Range("optim"),
        Phase::Optimizer,
        "an NVTX range or record_function named for the optimizer",
    ),
    pr(
        FileAndName("torch/nn/modules/module.py", "_call_impl"),
        Phase::Forward,
        "a module's __call__: the forward pass",
    ),
    pr(
        Range("forward"),
        Phase::Forward,
        "an NVTX range or record_function named for the forward pass",
    ),
];

/// The mark frame that holds an allocation's range path (a cushim snapshot's NVTX path, a
/// PyTorch snapshot's `user_metadata`), as `file`.
pub const RANGE_MARK: &str = "(range path)";

/// Whether `test` matches frame `f` (a range mark only for a `Range` test, and only a
/// range mark).
pub fn matches(test: Test, f: &Frame) -> bool {
    let range = &*f.name == RANGE_MARK;
    let file: std::borrow::Cow<str> = if f.file.contains('\\') {
        f.file.replace('\\', "/").into()
    } else {
        f.file.as_ref().into()
    };
    match test {
        Range(p) => {
            range
                && f.file
                    .split('/')
                    .any(|part| part.to_ascii_lowercase().contains(p))
        }
        _ if range => false,
        Name(p) => f.name.contains(p),
        NameNoCase(p) => f
            .name
            .to_ascii_lowercase()
            .contains(&p.to_ascii_lowercase()),
        File(p) => file.contains(p),
        FileAndName(p, n) => file.contains(p) && &*f.name == n,
    }
}

/// The category of the first frame rule any of `frames` matches.
pub fn frame_category<'a>(frames: impl Iterator<Item = &'a Frame> + Clone) -> Option<Category> {
    FRAME_RULES
        .iter()
        .find(|r| frames.clone().any(|f| matches(r.test, f)))
        .map(|r| r.category)
}

/// The phase the first phase rule `frames` match gives, with two exceptions the rule order
/// alone gets wrong:
/// - an autograd graph torn down outside the autograd engine (a `deleteNode` frame and no
///   engine frame: the program dropped the last reference to a graph it never ran
///   backward on) is no clue: its backward nodes' frames free what they saved, but no
///   backward pass runs;
/// - a forward or backward clue nested inside the optimizer's step (a frame closer to the
///   allocation than the optimizer's) wins: an optimizer stepped with a closure (Lightning's
///   automatic optimization, LBFGS, SAM) runs the forward and backward passes inside
///   `optimizer.step(closure)`, and their memory is the forward's and the backward's; the
///   closure's other code (no clue of its own) is no clue either.
pub fn phase_clue<'a>(frames: impl Iterator<Item = &'a Frame> + Clone) -> Option<Phase> {
    if graph_teardown(frames.clone()) {
        return None;
    }
    let phase = PHASE_RULES
        .iter()
        .find(|r| frames.clone().any(|f| matches(r.test, f)))
        .map(|r| r.phase)?;
    if phase != Phase::Optimizer {
        return Some(phase);
    }
    let optimizer = |f: &Frame| {
        PHASE_RULES
            .iter()
            .any(|r| r.phase == Phase::Optimizer && matches(r.test, f))
    };
    let inside = frames.clone().take_while(|f| !optimizer(f));
    let nested = PHASE_RULES
        .iter()
        .filter(|r| r.phase != Phase::Optimizer)
        .find(|r| inside.clone().any(|f| matches(r.test, f)))
        .map(|r| r.phase);
    match nested {
        Some(p) => Some(p),
        // The closure's own code (the loss, moving a batch): no clue, the phase around it.
        None if inside.clone().any(is_closure) => None,
        None => Some(phase),
    }
}

/// A Python frame of the closure an optimizer's step calls (Lightning's `closure` and
/// `_wrap_closure`; the name PyTorch's documentation gives LBFGS's).
fn is_closure(f: &Frame) -> bool {
    &*f.name != RANGE_MARK && f.file.ends_with(".py") && f.name.contains("closure")
}

/// Whether `frames` tear an autograd graph down outside the autograd engine (a
/// `deleteNode` frame, no engine frame): the program dropped a graph it never ran backward
/// on, and the graph's nodes free the tensors they saved for that backward.
pub fn graph_teardown<'a>(frames: impl Iterator<Item = &'a Frame> + Clone) -> bool {
    let is = |t: Test| frames.clone().any(|f| matches(t, f));
    is(Name(GRAPH_TEARDOWN)) && !is(Name(ENGINE))
}

/// The autograd engine's frames: a backward pass running.
const ENGINE: &str = "torch::autograd::Engine::";

/// The frame that deletes an autograd graph's node when its last reference goes.
const GRAPH_TEARDOWN: &str = "torch::autograd::deleteNode";

/// The category of an allocation made in `phase`, by whether it outlived that phase.
pub fn by_phase(phase: Phase, outlived: bool) -> Category {
    match (phase, outlived) {
        (Phase::Forward, false) => C::ForwardTemporaries,
        (Phase::Forward, true) => C::Activations,
        (Phase::Backward, false) => C::BackwardTemporaries,
        (Phase::Backward, true) => C::Gradients,
        (Phase::Optimizer, false) => C::OptimizerTemporaries,
        (Phase::Optimizer, true) => C::OptimizerState,
        (Phase::Outside, _) => C::Unclassified,
    }
}

/// A user's rule: `NAME=REGEX`.
#[derive(Debug, Clone)]
pub struct UserRule {
    pub name: String,
    pub regex: regex::Regex,
}

/// Parse every `--category` rule given, in order (the first error, one line).
pub fn parse_user_rules(rules: &[String]) -> Result<Vec<UserRule>, String> {
    rules.iter().map(|r| parse_user_rule(r)).collect()
}

/// Parse `NAME=REGEX` (one line of error saying what is wrong).
pub fn parse_user_rule(s: &str) -> Result<UserRule, String> {
    let Some((name, re)) = s.split_once('=') else {
        return Err(format!(
            "--category {s:?}: expected NAME=REGEX (a category name, '=', a regular expression)"
        ));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("--category {s:?}: the category name is empty"));
    }
    if re.is_empty() {
        return Err(format!("--category {s:?}: the regular expression is empty"));
    }
    let regex = regex::Regex::new(re).map_err(|e| {
        let first = e
            .to_string()
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string();
        format!("--category {s:?}: not a regular expression: {first}")
    })?;
    Ok(UserRule {
        name: name.to_string(),
        regex,
    })
}

/// The text a user rule is matched against for frame `f`: `name file:line`, or, for a
/// range mark, the range path itself.
pub fn user_text(f: &Frame) -> String {
    if &*f.name == RANGE_MARK {
        f.file.to_string()
    } else {
        format!("{} {}:{}", f.name, f.file, f.line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn frame(name: &str, file: &str) -> Frame {
        Frame {
            name: Arc::from(name),
            file: Arc::from(file),
            line: 1,
        }
    }

    #[test]
    fn a_bad_user_rule_is_one_line_that_names_it() {
        let e = parse_user_rule("kv=(").unwrap_err();
        assert!(
            e.starts_with("--category \"kv=(\": not a regular expression"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        assert!(parse_user_rule("novalue").is_err());
        assert!(parse_user_rule("=x").is_err());
        assert!(parse_user_rule("kv=cache").is_ok());
    }

    #[test]
    fn optimizer_state_and_gradients_are_named_by_their_frames() {
        let f = [frame(
            "_init_group",
            "/x/site-packages/torch/optim/adamw.py",
        )];
        assert_eq!(frame_category(f.iter()), Some(Category::OptimizerState));
        let g = [frame(
            "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)",
            "??",
        )];
        assert_eq!(frame_category(g.iter()), Some(Category::Gradients));
        let w = [frame("C:\\py\\Lib\\torch\\nn\\modules\\module.py", "x")];
        assert_eq!(frame_category(w.iter()), None);
        let win = [frame(
            "_apply",
            "C:\\py\\Lib\\torch\\nn\\modules\\module.py",
        )];
        assert_eq!(frame_category(win.iter()), Some(Category::Parameters));
    }

    #[test]
    fn range_paths_give_phases_and_frames_do_not_match_range_tests() {
        let r = [frame(RANGE_MARK, "train/iteration/Backward pass")];
        assert_eq!(phase_clue(r.iter()), Some(Phase::Backward));
        let f = [frame("backward_helper", "backward.py")];
        assert_eq!(phase_clue(f.iter()), None);
    }
}
