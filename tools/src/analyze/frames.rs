//! Which frame of a stack is the program's: the site a block is attributed to.
//!
//! Policy: a stack is innermost first; the site is the innermost **program** frame: a
//! Python frame of the program, or a native frame of the program's own code. Everything
//! between the program and the memory is machinery and never a site while a program frame
//! exists: the allocator, the CUDA runtime and driver and their Python bindings, a
//! framework's C++ (`at::`, `c10::`, `torch::`), the interpreter and its call machinery
//! (CPython's `_PyEval_*`/`cfunction_call`, libffi, ctypes, pybind11), cushim's own crates.
//! A framework's own Python code (`torch/nn/modules/...`) is library code: skipped while
//! the program has a frame in the stack (the caller of `torch.empty` is the answer), the
//! site when nothing of the program is there. A stack of nothing but machinery keeps its
//! innermost frame, so no block is ever left without a site. The frames that only start a
//! process or thread (`_start`, `__libc_start_main`, ...) are never a site.
//!
//! C++ names are classified after demangling, by their qualified name: the return type a
//! demangler puts first (`void at::cuda::blas::gemm_and_bias<float>(...)`,
//! `_object* torch::autograd::...`), template arguments and the parameter list are taken
//! off first ([`qualified_name`]), so one rule covers every spelling. An unsymbolized
//! native frame (`libffi.so.8+0x6f79`) is classified by its module.
//!
//! The rules are one table, [`RULES`], each with the reason it exists; the first rule that
//! matches decides; a frame no rule matches is the program's.
//!
//! Installed Python packages (`site-packages`, `dist-packages`) are decided by what their
//! line tells the user, not by where they are installed. A package whose functions are
//! generic tensor operations, called the same way from any model (`torch`, `einops`'
//! `rearrange`, `opt_einsum`, `xformers.ops`, `flash_attn`'s interface), is library: its
//! own line is the same for every tensor, the caller's line says which tensor it is. A
//! package that defines the model's layers (`transformers`' `modeling_bert.py`, `timm`,
//! `diffusers`) is the program's: its line names the layer that made the tensor
//! (`modeling_bert.py:286`, the attention scores), which the program's own line
//! (`model(batch)`) cannot. So no rule names `site-packages`; library packages are listed.

use crate::analyze::entry_marks::{is_mark, suffix};
use crate::analyze::model::{Frame, Stacks};

/// What a frame is to the site finder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The program's own code (Python or native): a site.
    Program,
    /// A framework's own Python code: a site only when the program has no frame.
    Library,
    /// Between the program and the memory: a site only when nothing else is in the stack.
    Machinery,
    /// Starts a process or thread: never a site while anything else is in the stack.
    Start,
}

/// What a rule looks at.
#[derive(Debug, Clone, Copy)]
pub enum Test {
    /// The C++ qualified name (after [`qualified_name`]) starts with this.
    Qualified(&'static str),
    /// The frame's name (a C symbol) is exactly this.
    Symbol(&'static str),
    /// The frame's name (a C symbol) starts with this.
    SymbolPrefix(&'static str),
    /// The frame's file path, or the module of an unsymbolized `module+0x...` frame,
    /// contains this.
    Path(&'static str),
}

/// One classification rule: what it matches, what that makes the frame, and why.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub test: Test,
    pub class: Class,
    pub reason: &'static str,
}

const fn rule(test: Test, class: Class, reason: &'static str) -> Rule {
    Rule {
        test,
        class,
        reason,
    }
}

use Class::{Library, Machinery, Start};
use Test::{Path, Qualified, Symbol, SymbolPrefix};

/// The classification table, first match wins (Python frames are decided by [`classify`]
/// before it: a `.py` file is the program unless a `Path` rule makes it a library).
pub const RULES: &[Rule] = &[
    // Process and thread start.
    rule(
        Symbol("_start"),
        Start,
        "the ELF entry point: runs before main",
    ),
    rule(
        Symbol("__libc_start_main"),
        Start,
        "glibc's start: calls main",
    ),
    rule(
        Symbol("__libc_start_main_impl"),
        Start,
        "glibc's start: calls main",
    ),
    rule(
        Symbol("__libc_start_call_main"),
        Start,
        "glibc's start: calls main",
    ),
    rule(
        Symbol("start_thread"),
        Start,
        "glibc's thread start: calls the thread function",
    ),
    rule(
        Symbol("execute_native_thread_routine"),
        Start,
        "libstdc++: starts a std::thread",
    ),
    rule(Symbol("clone"), Start, "the thread's first frame"),
    rule(Symbol("clone3"), Start, "the thread's first frame"),
    rule(
        Symbol("Py_BytesMain"),
        Start,
        "CPython's main: starts the interpreter",
    ),
    rule(
        Symbol("Py_RunMain"),
        Start,
        "CPython's main: starts the interpreter",
    ),
    rule(
        SymbolPrefix("pymain_"),
        Start,
        "CPython's main: starts the interpreter",
    ),
    // Frameworks' Python code.
    rule(
        Path("/torch/"),
        Library,
        "PyTorch's Python package: the program called it",
    ),
    rule(
        Path("/numba/cuda/cudadrv/"),
        Library,
        "numba's driver layer: the program called it",
    ),
    rule(
        Path("/cuda/bindings/"),
        Library,
        "NVIDIA's cuda.bindings: a driver wrapper",
    ),
    rule(
        Path("/cuda/cudart.py"),
        Library,
        "NVIDIA's cuda-python runtime wrapper",
    ),
    rule(
        Path("/cupy/cuda/"),
        Library,
        "CuPy's memory layer: the program called it",
    ),
    rule(
        Path("/ctypes/__init__.py"),
        Library,
        "ctypes' call wrappers",
    ),
    rule(
        Path("/einops/"),
        Library,
        "einops: generic tensor rearrangements; the caller's line says which tensor",
    ),
    rule(
        Path("/opt_einsum/"),
        Library,
        "opt_einsum: a generic contraction; the caller's line says which tensor",
    ),
    rule(
        Path("/xformers/ops/"),
        Library,
        "xformers' attention operators: generic ops; the caller's line says which layer",
    ),
    rule(
        Path("/flash_attn/flash_attn_interface.py"),
        Library,
        "flash-attention's entry points: a generic op; the caller's line says which layer",
    ),
    // PyTorch's C++ (demangled, qualified names).
    rule(
        Qualified("torch::autograd::generated::"),
        Library,
        "an autograd node's backward (MeanBackward0::apply): the autograd engine runs it on \
         its own thread, with no Python frame, so it names a backward allocation",
    ),
    rule(
        Qualified("torch::"),
        Machinery,
        "PyTorch's C++: unwinding, autograd, bindings",
    ),
    rule(
        Qualified("c10::"),
        Machinery,
        "PyTorch's core: the caching allocator itself",
    ),
    rule(
        Qualified("at::"),
        Machinery,
        "ATen: operator dispatch and kernels",
    ),
    rule(Qualified("caffe2::"), Machinery, "PyTorch's legacy core"),
    rule(
        Qualified("pybind11::"),
        Machinery,
        "pybind11: C++ called from Python",
    ),
    rule(
        SymbolPrefix("THP"),
        Machinery,
        "PyTorch's Python bindings (THPVariable_...)",
    ),
    rule(
        Qualified("std::unique_ptr<void, std::function"),
        Machinery,
        "a deleter wrapper",
    ),
    rule(Qualified("std::function"), Machinery, "a callable wrapper"),
    rule(Qualified("std::__invoke"), Machinery, "a callable wrapper"),
    rule(
        Qualified("rmm::mr::"),
        Machinery,
        "RMM's memory resources: an allocator",
    ),
    // CUDA runtime and driver.
    rule(
        SymbolPrefix("cudaMalloc"),
        Machinery,
        "the CUDA runtime's allocation API",
    ),
    rule(
        SymbolPrefix("cudaFree"),
        Machinery,
        "the CUDA runtime's free API",
    ),
    rule(
        SymbolPrefix("cuMem"),
        Machinery,
        "the CUDA driver's memory API",
    ),
    rule(
        SymbolPrefix("__cudart"),
        Machinery,
        "the static CUDA runtime's internals",
    ),
    rule(
        Qualified("cudart::"),
        Machinery,
        "the CUDA runtime's internals",
    ),
    rule(Path("libcudart"), Machinery, "the CUDA runtime"),
    rule(Path("libcuda.so"), Machinery, "the CUDA driver"),
    rule(
        Path("cydriver"),
        Machinery,
        "cuda.bindings' Cython driver calls",
    ),
    rule(
        Path("cyruntime"),
        Machinery,
        "cuda.bindings' Cython runtime calls",
    ),
    // cushim and simcuda.
    rule(Qualified("cushim::"), Machinery, "cushim's engine"),
    rule(Qualified("cushim_shim::"), Machinery, "cushim's shim"),
    rule(Qualified("simcuda::"), Machinery, "the simulated driver"),
    rule(Path("libcushim"), Machinery, "cushim's shim"),
    rule(Path("libsimcuda"), Machinery, "the simulated driver"),
    // Frameworks' native libraries, unsymbolized or by file.
    rule(Path("libtorch"), Machinery, "PyTorch's C++ libraries"),
    rule(Path("libc10"), Machinery, "PyTorch's core library"),
    rule(Path("/c10/"), Machinery, "PyTorch's core sources"),
    rule(Path("/aten/src/"), Machinery, "ATen's sources"),
    rule(Path("/torch/csrc/"), Machinery, "PyTorch's C++ sources"),
    // The Python interpreter and its call machinery.
    rule(
        SymbolPrefix("_Py"),
        Machinery,
        "CPython internals (_PyEval_EvalFrameDefault, ...)",
    ),
    rule(
        SymbolPrefix("Py"),
        Machinery,
        "CPython's C API (PyObject_Call, ...)",
    ),
    rule(
        SymbolPrefix("cfunction_"),
        Machinery,
        "CPython: calling a builtin function",
    ),
    rule(
        SymbolPrefix("method_vectorcall"),
        Machinery,
        "CPython: calling a method",
    ),
    rule(
        SymbolPrefix("vectorcall"),
        Machinery,
        "CPython: the vectorcall protocol",
    ),
    rule(
        SymbolPrefix("slot_"),
        Machinery,
        "CPython: a type slot (slot_tp_call, slot_nb_multiply: `a * b` on a tensor)",
    ),
    rule(
        SymbolPrefix("builtin_exec"),
        Machinery,
        "CPython: the exec builtin",
    ),
    rule(Symbol("run_mod"), Machinery, "CPython: running a module"),
    rule(
        Symbol("run_eval_code_obj"),
        Machinery,
        "CPython: running a module's code",
    ),
    rule(
        Symbol("_start_user_main"),
        Start,
        "a C runtime's start: calls main",
    ),
    rule(
        Symbol("call_function"),
        Machinery,
        "CPython: the evaluation loop's call",
    ),
    rule(
        Symbol("function_code_fastcall"),
        Machinery,
        "CPython: calling a function",
    ),
    rule(
        Symbol("object_vacall"),
        Machinery,
        "CPython: calling an object",
    ),
    rule(
        SymbolPrefix("ffi_call"),
        Machinery,
        "libffi: how ctypes calls C",
    ),
    rule(
        SymbolPrefix("_ctypes_"),
        Machinery,
        "ctypes' call machinery",
    ),
    rule(
        SymbolPrefix("_call_function_pointer"),
        Machinery,
        "ctypes' call machinery",
    ),
    rule(
        SymbolPrefix("PyCFuncPtr"),
        Machinery,
        "ctypes' function pointer object",
    ),
    rule(Path("libffi"), Machinery, "libffi: how ctypes calls C"),
    rule(Path("_ctypes"), Machinery, "ctypes' extension module"),
    rule(Path("libpython"), Machinery, "the Python interpreter"),
    rule(
        Path("/Python/"),
        Machinery,
        "CPython's sources (Python/ceval.c, ...)",
    ),
    rule(
        Path("/Objects/"),
        Machinery,
        "CPython's sources (Objects/call.c, ...)",
    ),
    rule(
        Path("/Modules/"),
        Machinery,
        "CPython's sources (Modules/main.c, ...)",
    ),
    rule(
        Path("python3"),
        Machinery,
        "the Python interpreter's executable",
    ),
    rule(
        Path("python2"),
        Machinery,
        "the Python interpreter's executable",
    ),
    rule(
        Symbol("??"),
        Machinery,
        "an unknown frame says nothing of the program",
    ),
];

/// The qualified name of a demangled C++ symbol: return type, template arguments and
/// parameter list taken off (`void at::native::f<float>(int) const` -> `at::native::f`).
/// A plain C symbol comes back unchanged.
pub fn qualified_name(name: &str) -> String {
    let name = name.trim().replace("(anonymous namespace)", "{anon}");
    // Template arguments (balanced `<...>`), except in `operator<` and friends.
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    let mut skip_to = 0usize;
    for (i, c) in name.char_indices() {
        if i < skip_to {
            continue;
        }
        if name[..i].ends_with("operator") && matches!(c, '<' | '>' | '(' | '-') {
            // `operator<`, `operator<<`, `operator()`, `operator->`: part of the name.
            let rest = &name[i..];
            let two = rest.starts_with("()")
                || (rest.len() > 1 && c != '(' && matches!(rest.as_bytes()[1], b'<' | b'>' | b'='));
            let len = if two { 2 } else { 1 };
            if depth == 0 {
                out.push_str(&rest[..len]);
            }
            skip_to = i + len;
            continue;
        }
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            '(' if depth == 0 => break,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    // The return type, if any, is everything before the last space outside the name.
    let q = out.trim();
    let q = q.rsplit(' ').next().unwrap_or(q);
    q.trim_start_matches(['*', '&']).to_string()
}

/// The frame the loader puts between a trace entry's frames and its `forward_frames`.
pub const FORWARD_MARK: &str = "(forward pass of this backward allocation)";

/// The module of an unsymbolized frame named `module+0xoffset`.
fn module_of(name: &str) -> Option<&str> {
    let (m, off) = name.rsplit_once("+0x")?;
    (!m.is_empty() && off.bytes().all(|c| c.is_ascii_hexdigit())).then_some(m)
}

/// Whether `f` is a Python frame (its file is Python source).
pub fn is_python(f: &Frame) -> bool {
    let file = f.file.trim();
    file.ends_with(".py") || file.ends_with(".pyx") || file.ends_with(".pyw")
}

/// The first rule that matches `f`, if any.
pub fn rule_for(f: &Frame) -> Option<&'static Rule> {
    let name = f.name.trim();
    let python = is_python(f);
    let qualified = if python {
        String::new()
    } else {
        qualified_name(name)
    };
    let module = module_of(name);
    // Paths recorded on Windows (`...\site-packages\torch\functional.py`) match the same
    // rules as POSIX ones.
    let file: std::borrow::Cow<str> = if f.file.contains('\\') {
        f.file.replace('\\', "/").into()
    } else {
        f.file.as_ref().into()
    };
    RULES.iter().find(|r| match r.test {
        // Python frames are matched by their file only: a Python function may be named
        // anything (`run_model`, `PyTorchModel`).
        Symbol(s) => !python && name == s,
        SymbolPrefix(p) => !python && name.starts_with(p),
        Qualified(p) => !python && qualified.starts_with(p),
        Path(p) => {
            // Library rules name frameworks' Python files; the others, native code.
            (r.class == Library) == python
                && (file.contains(p) || module.is_some_and(|m| m.contains(p)))
        }
    })
}

/// What `f` is (the first matching rule's class; the program's when none matches). A raw
/// address with no module (`0x7f...`) is machinery: it says nothing of the program.
pub fn classify(f: &Frame) -> Class {
    if let Some(r) = rule_for(f) {
        return r.class;
    }
    let name = f.name.trim();
    if name.is_empty()
        || (name.starts_with("0x") && name[2..].bytes().all(|c| c.is_ascii_hexdigit()))
    {
        return Class::Machinery;
    }
    Class::Program
}

/// Whether `f` is machinery between the program and the memory (not a site while the
/// program has a frame in the stack).
pub fn is_machinery(f: &Frame) -> bool {
    classify(f) != Class::Program
}

/// The frames of stack `id` that can be sites, innermost first: its program frames; when
/// it has none, its library frames; when it has none of those either, its innermost
/// frame (so a recorded stack is never without a site).
pub fn program_frames(stacks: &Stacks, id: u32) -> Vec<&Frame> {
    site_frames(stacks, id).0
}

/// [`program_frames`], and whether they come from the forward pass recorded with a
/// backward allocation (PyTorch's `forward_frames`, after a [`FORWARD_MARK`] frame): the
/// stack's own program frames first, then the forward pass's, then the library frames of
/// each, then the stack's innermost machinery.
fn site_frames(stacks: &Stacks, id: u32) -> (Vec<&Frame>, bool) {
    // The marks of a compiled region or a private pool are not frames (`entry_marks`).
    let frames: Vec<&Frame> = stacks.frames_of(id).filter(|f| !is_mark(f)).collect();
    let (own, fwd) = match frames.iter().position(|f| &*f.name == FORWARD_MARK) {
        Some(m) => (&frames[..m], &frames[m + 1..]),
        None => (&frames[..], &[][..]),
    };
    fn classed<'a>(part: &[&'a Frame]) -> Vec<(&'a Frame, Class)> {
        let mut all: Vec<(&Frame, Class)> = part.iter().map(|f| (*f, classify(f))).collect();
        // What lies outside the first start frame started the thread or process (often
        // libc frames symbolized as whatever export precedes them): never the program's.
        if let Some(s) = all.iter().position(|(_, c)| *c == Class::Start) {
            all.truncate(s + 1);
        }
        all
    }
    let (own, fwd) = (classed(own), classed(fwd));
    for want in [Class::Program, Class::Library] {
        for (part, forward) in [(&own, false), (&fwd, true)] {
            let v: Vec<&Frame> = part
                .iter()
                .filter(|(_, c)| *c == want)
                .map(|(f, _)| *f)
                .collect();
            if !v.is_empty() {
                return (v, forward);
            }
        }
    }
    let v = own
        .iter()
        .find(|(_, c)| *c == Class::Machinery)
        .or(own.first())
        .map(|(f, _)| vec![*f])
        .unwrap_or_default();
    (v, false)
}

/// `name (file:line)` of a frame.
pub fn describe(f: &Frame) -> String {
    format!("{} ({}:{})", f.name, f.file, f.line)
}

/// The site of stack `id`: its first program frame and `depth - 1` program callers,
/// innermost first, joined by ` <- `, after `backward of ` when they are the forward pass
/// of a backward allocation; `<no stack>` when nothing was recorded. Then the compiled
/// region and private pool the allocation was in, when PyTorch recorded them
/// ([`suffix`]).
pub fn site(stacks: &Stacks, id: u32, depth: usize) -> String {
    format!(
        "{}{}",
        site_of_frames(stacks, id, depth),
        suffix(stacks, id)
    )
}

fn site_of_frames(stacks: &Stacks, id: u32, depth: usize) -> String {
    let (frames, forward) = site_frames(stacks, id);
    if frames.is_empty() {
        return "<no stack>".to_string();
    }
    let s = frames
        .iter()
        .take(depth.max(1))
        .map(|f| describe(f))
        .collect::<Vec<_>>()
        .join(" <- ");
    if forward {
        format!("backward of {s}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fr(name: &str, file: &str, line: i64) -> Frame {
        Frame {
            name: name.into(),
            file: file.into(),
            line,
        }
    }

    fn stacks(frames: Vec<Frame>) -> Stacks {
        let n = frames.len() as u32;
        Stacks {
            frames,
            lists: vec![Box::new([]), (0..n).collect()],
        }
    }

    #[test]
    fn qualified_names_lose_return_types_templates_and_parameters() {
        let q = |s| qualified_name(s);
        assert_eq!(
            q("void at::cuda::blas::gemm_and_bias<float>(bool, bool, long, float const*)"),
            "at::cuda::blas::gemm_and_bias"
        );
        assert_eq!(
            q("bool at::native::_resize_output_check<long>(at::Tensor const&, c10::ArrayRef<long>)"),
            "at::native::_resize_output_check"
        );
        assert_eq!(
            q("_object* torch::autograd::THPVariable_mm(_object*, _object*, _object*)"),
            "torch::autograd::THPVariable_mm"
        );
        assert_eq!(
            q("std::vector<int, std::allocator<int> >::operator[](unsigned long) const"),
            "std::vector::operator[]"
        );
        assert_eq!(q("c10::(anonymous namespace)::f()"), "c10::{anon}::f");
        assert_eq!(q("cfunction_call"), "cfunction_call");
        assert_eq!(q("main"), "main");
        assert_eq!(q("f\u{fffd}x<\u{fffd}>(\u{fffd})"), "f\u{fffd}x");
        assert_eq!(q("operator\u{fffd}"), "operator\u{fffd}");
        assert_eq!(q("a::operator<<(int)"), "a::operator<<");
    }

    #[test]
    fn every_rule_has_a_reason() {
        assert!(RULES.iter().all(|r| r.reason.len() > 8));
    }

    #[test]
    fn cpp_names_with_return_types_are_machinery() {
        for n in [
            "void at::cuda::blas::gemm_and_bias<float>(bool, bool)",
            "bool at::native::_resize_output(at::Tensor const&)",
            "_object* torch::autograd::THPVariable_addmm(_object*, _object*)",
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char)",
            "pybind11::cpp_function::dispatcher(_object*, _object*, _object*)",
        ] {
            assert_eq!(classify(&fr(n, "??", 0)), Class::Machinery, "{n}");
        }
    }

    #[test]
    fn interpreter_and_ffi_frames_are_machinery_and_python_frames_the_program() {
        for (n, f) in [
            ("cfunction_call", ""),
            ("_PyEval_EvalFrameDefault", "/usr/src/python/Python/ceval.c"),
            ("_PyFunction_Vectorcall", "??"),
            ("PyObject_Call", "??"),
            ("libffi.so.8+0x6f79", "??"),
            ("ffi_call_unix64", "??"),
            ("_ctypes.cpython-311-x86_64-linux-gnu.so+0x1234", "??"),
            ("cydriver.cpython-311-x86_64-linux-gnu.so+0xc969", "??"),
            ("python3.11+0x1d2f3", "??"),
            ("0x7f0000001234", "??"),
        ] {
            assert_eq!(classify(&fr(n, f, 0)), Class::Machinery, "{n}");
        }
        assert_eq!(
            classify(&fr(
                "forward",
                "/x/transformers/models/bert/modeling_bert.py",
                286
            )),
            Class::Program
        );
        // A Python function is named anything; its file decides.
        assert_eq!(classify(&fr("PyModel", "/home/u/m.py", 3)), Class::Program);
        assert_eq!(
            classify(&fr(
                "forward",
                "/x/site-packages/torch/nn/modules/linear.py",
                116
            )),
            Class::Library
        );
        assert_eq!(
            classify(&fr("fill_blocks", "/home/u/kernels.c", 12)),
            Class::Program
        );
    }

    #[test]
    fn the_site_is_the_innermost_program_frame_and_depth_counts_program_frames() {
        let s = stacks(vec![
            fr("cudaMalloc", "??", 0),
            fr("libffi.so.8+0x6f79", "??", 0),
            fr("_ctypes_callproc", "??", 0),
            fr("cfunction_call", "", 0),
            fr("_PyEval_EvalFrameDefault", "??", 0),
            fr("forward", "/x/torch/nn/modules/linear.py", 116),
            fr("train_step", "/home/u/train.py", 42),
            fr("_PyEval_EvalFrameDefault", "??", 0),
            fr("main", "/home/u/train.py", 90),
            fr("Py_BytesMain", "??", 0),
            fr("__libc_start_main", "??", 0),
        ]);
        assert_eq!(site(&s, 1, 1), "train_step (/home/u/train.py:42)");
        assert_eq!(
            site(&s, 1, 2),
            "train_step (/home/u/train.py:42) <- main (/home/u/train.py:90)"
        );
    }

    #[test]
    fn a_stack_of_machinery_keeps_a_site() {
        let s = stacks(vec![
            fr("forward", "/x/torch/nn/modules/linear.py", 116),
            fr("_PyEval_EvalFrameDefault", "??", 0),
        ]);
        assert_eq!(
            site(&s, 1, 1),
            "forward (/x/torch/nn/modules/linear.py:116)"
        );
        let s = stacks(vec![fr("cudaMalloc", "??", 0), fr("_start", "??", 0)]);
        assert_eq!(site(&s, 1, 1), "cudaMalloc (??:0)");
        assert_eq!(site(&s, 0, 1), "<no stack>");
    }

    #[test]
    fn installed_tensor_op_packages_are_library_and_model_packages_the_program() {
        let sp = "/opt/conda/lib/python3.11/site-packages";
        for f in [
            format!("{sp}/einops/einops.py"),
            format!("{sp}/opt_einsum/contract.py"),
            format!("{sp}/xformers/ops/fmha/__init__.py"),
            format!("{sp}/flash_attn/flash_attn_interface.py"),
        ] {
            assert_eq!(classify(&fr("apply", &f, 1)), Class::Library, "{f}");
        }
        for f in [
            format!("{sp}/transformers/models/bert/modeling_bert.py"),
            "/usr/lib/python3/dist-packages/timm/models/vit.py".to_string(),
        ] {
            assert_eq!(classify(&fr("forward", &f, 1)), Class::Program, "{f}");
        }
        // The site of a rearrange in a BERT layer is the layer's line, not einops'.
        let s = stacks(vec![
            fr("cudaMalloc", "??", 0),
            fr("_apply_recipe", &format!("{sp}/einops/einops.py"), 237),
            fr("rearrange", &format!("{sp}/einops/einops.py"), 591),
            fr(
                "forward",
                &format!("{sp}/transformers/models/bert/modeling_bert.py"),
                286,
            ),
            fr("train", "/home/u/train.py", 40),
        ]);
        assert_eq!(
            site(&s, 1, 1),
            format!("forward ({sp}/transformers/models/bert/modeling_bert.py:286)")
        );
    }

    /// The shape of a backward allocation in a real PyTorch 2.x snapshot: the autograd
    /// engine's thread, no Python frame, and glibc frames past the thread's start
    /// symbolized as unrelated exports.
    #[test]
    fn a_backward_allocation_is_named_by_its_autograd_node_not_its_threads_start() {
        let s = stacks(vec![
            fr("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp", 0),
            fr("at::_ops::div_Scalar::call(at::Tensor const&, c10::Scalar const&)", "??", 0),
            fr("torch::autograd::generated::MeanBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", "??", 0),
            fr("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
            fr("execute_native_thread_routine", "thread48.o", 0),
            fr("pthread_condattr_setpshared", "??", 0),
            fr("__xmknodat", "??", 0),
        ]);
        assert!(
            site(&s, 1, 1).starts_with("torch::autograd::generated::MeanBackward0::apply("),
            "{}",
            site(&s, 1, 1)
        );
        // A framework's file recorded on Windows is the framework's.
        assert_eq!(
            classify(&fr(
                "einsum",
                "D:\\v\\site-packages\\torch\\functional.py",
                373
            )),
            Class::Library
        );
        // CPython's type slots (`a * b` on a tensor) are the interpreter's, not the program's.
        assert_eq!(classify(&fr("slot_nb_multiply", "??", 0)), Class::Machinery);
    }
}
