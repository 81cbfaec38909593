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
//! A thread's start is known by position as well as by name: the native frames outside the
//! innermost start frame (`start_thread`, `__clone`, the autograd engine's
//! `Engine::thread_main`) only started the process or thread, whatever a symbolizer named
//! them (PyTorch's unwinder names an unexported libc or libstdc++ function by the nearest
//! export before it: `pthread_condattr_setpshared`, `std::error_code::...`). So are the
//! frames just inside a thread's start that carry no source line and whose library is
//! unknown or the C runtime's, and, on a stack that reaches no start frame at all (a
//! thread whose start was not named), its outermost such frames. Python frames are never
//! dropped: PyTorch appends the Python frames it could not interleave after the native
//! ones, past `_start`.
//!
//! The interpreter is recognised by library where the frame names it (`libpython3.11.so`,
//! the `python3` executable, CPython's source tree) and by CPython's naming conventions
//! otherwise: its C API (`Py*`, `_Py*`) and the static functions of its number, call,
//! descriptor and evaluation protocols (`binary_op1`, `slot_nb_add`, `wrap_binaryfunc`,
//! `method_vectorcall_O`, `type_call`, `property_descr_get`, ...). Compilers' clone
//! suffixes (`.localalias`, `.llvm.123`, `.constprop.0`, ` [clone .part.0]`) are taken off a
//! name before any rule looks at it.
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
    /// Starts a process: never a site while anything else is in the stack; the native
    /// frames outside it are the process's start too.
    Start,
    /// Starts a thread, or is a thread's entry loop: never a site while anything else is in
    /// the stack; the native frames outside it, and the unknown ones just inside it, are
    /// the thread's start too.
    ThreadStart,
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
    /// The function's own name (the last component of the qualified name, namespaces taken
    /// off) starts with this: `(anonymous namespace)::THPFunction_apply` and
    /// `THPVariable_clear` alike.
    Function(&'static str),
    /// The qualified name starts with the first string and the function's own name is the
    /// second: `torch::autograd::generated::MeanBackward0::apply`.
    Member(&'static str, &'static str),
    /// CPython's naming conventions: a C symbol starting with this, on a frame that names
    /// no source file of its own (a frame that does, `gen_data (gen.c:12)`, is whoever
    /// wrote that file; CPython's own files are matched by `Path` rules).
    CPython(&'static str),
    /// The frame's file path, or the module of an unsymbolized `module+0x...` frame,
    /// contains this.
    Path(&'static str),
    /// [`Path`](Test::Path) for the Python interpreter's own files (its library, sources,
    /// headers and executable): the frames [`interpreter`] counts as the interpreter's.
    InterpreterPath(&'static str),
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

use Class::{Library, Machinery, Start, ThreadStart};
use Test::{CPython, Function, InterpreterPath, Member, Path, Qualified, Symbol, SymbolPrefix};

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
        ThreadStart,
        "glibc's thread start: calls the thread function",
    ),
    rule(
        Symbol("execute_native_thread_routine"),
        ThreadStart,
        "libstdc++: starts a std::thread",
    ),
    rule(
        Qualified("std::thread::_State_impl::_M_run"),
        ThreadStart,
        "libstdc++: a std::thread's body calls the thread function",
    ),
    rule(Symbol("clone"), ThreadStart, "the thread's first frame"),
    rule(Symbol("clone3"), ThreadStart, "the thread's first frame"),
    rule(Symbol("__clone"), ThreadStart, "the thread's first frame"),
    rule(Symbol("__clone3"), ThreadStart, "the thread's first frame"),
    rule(
        Symbol("thread_run"),
        ThreadStart,
        "CPython's threading module: starts a Python thread",
    ),
    rule(
        Symbol("pythread_wrapper"),
        ThreadStart,
        "CPython: starts a Python thread",
    ),
    rule(
        Qualified("torch::autograd::Engine::thread_main"),
        ThreadStart,
        "the autograd engine's worker loop: its callers (Engine::thread_init, the \
         libstdc++ and libc thread start, often misnamed) only started the worker thread; \
         on the calling thread (a CPU backward) the Python frames outside it are kept",
    ),
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
        Member("torch::autograd::generated::", "apply"),
        Library,
        "an autograd node's backward (MeanBackward0::apply): the autograd engine runs it on \
         its own thread, with no Python frame, so it names a backward allocation; the \
         formulas it calls (MeanBackward0_apply_functional, details::mean_backward) are \
         PyTorch's C++ below",
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
        Function("THP"),
        Machinery,
        "PyTorch's Python bindings (THPVariable_..., a custom autograd Function's \
         THPFunction_apply: its Python forward, or the caller, is the site)",
    ),
    rule(
        Function("THCP"),
        Machinery,
        "PyTorch's CUDA Python bindings (THCPModule_...)",
    ),
    rule(
        Qualified("std::"),
        Machinery,
        "the C++ standard library (callable and deleter wrappers, threads): never the \
         program's own code",
    ),
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
        CPython("cfunction_"),
        Machinery,
        "CPython: calling a builtin function",
    ),
    rule(
        CPython("method_"),
        Machinery,
        "CPython: calling a bound method or method descriptor (method_vectorcall_O)",
    ),
    rule(
        CPython("meth_"),
        Machinery,
        "CPython: a builtin method object",
    ),
    rule(
        CPython("vectorcall"),
        Machinery,
        "CPython: the vectorcall protocol",
    ),
    rule(
        CPython("slot_"),
        Machinery,
        "CPython: a type slot (slot_tp_call, slot_nb_multiply: `a * b` on a tensor)",
    ),
    rule(
        CPython("binary_op"),
        Machinery,
        "CPython's number protocol: `a / b` dispatches through binary_op1 to a type slot",
    ),
    rule(
        CPython("ternary_op"),
        Machinery,
        "CPython's number protocol: `a ** b`",
    ),
    rule(
        CPython("wrap_"),
        Machinery,
        "CPython: a slot wrapper (wrap_binaryfunc_l) calling a C type's slot",
    ),
    rule(
        CPython("wrapper"),
        Machinery,
        "CPython: a slot wrapper object (wrapper_call, wrapperdescr_call)",
    ),
    rule(
        CPython("type_call"),
        Machinery,
        "CPython: calling a type (`Tensor(...)`, a class's constructor)",
    ),
    rule(
        CPython("object_"),
        Machinery,
        "CPython: the object protocol (object_vacall, object_recursive_isinstance)",
    ),
    rule(
        CPython("do_call_core"),
        Machinery,
        "CPython: the evaluation loop's call with *args/**kwargs",
    ),
    rule(
        CPython("do_richcompare"),
        Machinery,
        "CPython: the comparison protocol",
    ),
    rule(
        CPython("property_"),
        Machinery,
        "CPython's descriptor protocol: a property's getter or setter",
    ),
    rule(
        CPython("descr_"),
        Machinery,
        "CPython's descriptor protocol",
    ),
    rule(
        CPython("getset_"),
        Machinery,
        "CPython's descriptor protocol: a C type's attribute",
    ),
    rule(
        CPython("member_"),
        Machinery,
        "CPython's descriptor protocol: a C type's member",
    ),
    rule(
        CPython("func_"),
        Machinery,
        "CPython: a function object's slots (func_descr_get)",
    ),
    rule(
        CPython("partial_"),
        Machinery,
        "CPython: calling a functools.partial",
    ),
    rule(CPython("gen_"), Machinery, "CPython: resuming a generator"),
    rule(
        CPython("context_run"),
        Machinery,
        "CPython: running in a contextvars context",
    ),
    rule(
        CPython("task_step"),
        Machinery,
        "CPython: an asyncio task's step",
    ),
    rule(CPython("pyrun_"), Machinery, "CPython: running a file"),
    rule(
        CPython("builtin_"),
        Machinery,
        "CPython: a builtin (exec, __build_class__)",
    ),
    rule(CPython("run_mod"), Machinery, "CPython: running a module"),
    rule(
        CPython("run_eval_code_obj"),
        Machinery,
        "CPython: running a module's code",
    ),
    rule(
        Symbol("_start_user_main"),
        Start,
        "a C runtime's start: calls main",
    ),
    rule(
        CPython("call_function"),
        Machinery,
        "CPython: the evaluation loop's call",
    ),
    rule(
        CPython("function_code_fastcall"),
        Machinery,
        "CPython: calling a function",
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
    rule(
        InterpreterPath("libpython"),
        Machinery,
        "the Python interpreter",
    ),
    rule(
        InterpreterPath("/Python/"),
        Machinery,
        "CPython's sources (Python/ceval.c, ...)",
    ),
    rule(
        InterpreterPath("/Objects/"),
        Machinery,
        "CPython's sources (Objects/call.c, ...)",
    ),
    rule(
        InterpreterPath("/Modules/"),
        Machinery,
        "CPython's sources (Modules/main.c, ...)",
    ),
    rule(
        InterpreterPath("/Include/cpython/"),
        Machinery,
        "CPython's headers (calls inlined from Include/cpython/abstract.h, ...)",
    ),
    rule(
        InterpreterPath("/Include/internal/pycore_"),
        Machinery,
        "CPython's internal headers (Include/internal/pycore_ceval.h, ...)",
    ),
    rule(
        InterpreterPath("/python-3."),
        Machinery,
        "a CPython source tree as conda builds it (python-3.10.16/...)",
    ),
    rule(
        InterpreterPath("/Python-3."),
        Machinery,
        "a CPython source tree as released (Python-3.12.1/...)",
    ),
    rule(
        InterpreterPath("python3"),
        Machinery,
        "the Python interpreter's executable",
    ),
    rule(
        InterpreterPath("python2"),
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

/// `name` without the suffix a compiler gives a clone or a local alias of a function
/// (`method_vectorcall.llvm.1227`, `Py_RunMain.localalias`, `vectorcall_maybe.constprop.0`,
/// `THPVariable_subclass_clear(THPVariable*) [clone .part.0]`).
pub fn base_symbol(name: &str) -> &str {
    let name = name.trim();
    let name = match name.find(" [clone ") {
        Some(i) => &name[..i],
        None => name,
    };
    const TAGS: [&str; 8] = [
        "localalias",
        "llvm",
        "constprop",
        "lto_priv",
        "part",
        "isra",
        "cold",
        "clone",
    ];
    // A C++ name's own dots are inside its parameter list or template arguments; a clone
    // suffix follows the whole name.
    let outer = name.find(['(', '<']).unwrap_or(name.len());
    match name[..outer].find('.') {
        Some(i) if TAGS.iter().any(|t| name[i + 1..].starts_with(t)) => &name[..i],
        _ => name,
    }
}

/// Whether `f` names no source file of its own (empty or `??`).
fn no_file(f: &Frame) -> bool {
    let file = f.file.trim();
    file.is_empty() || file == "??"
}

/// The first rule that matches `f`, if any.
pub fn rule_for(f: &Frame) -> Option<&'static Rule> {
    let python = is_python(f);
    let name = if python {
        f.name.trim()
    } else {
        base_symbol(&f.name)
    };
    let qualified = if python {
        String::new()
    } else {
        qualified_name(name)
    };
    let function = qualified.rsplit("::").next().unwrap_or("");
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
        Function(p) => !python && function.starts_with(p),
        Member(p, m) => !python && qualified.starts_with(p) && function == m,
        CPython(p) => !python && no_file(f) && name.starts_with(p),
        Qualified(p) => !python && qualified.starts_with(p),
        Path(p) | InterpreterPath(p) => {
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
    // Nothing but machinery: on a thread, the frame nearest its start names what the thread
    // was doing (`Engine::evaluate_function`: the autograd engine's own allocation, with
    // no node in the stack); elsewhere the innermost (the API that was called).
    let thread = own.iter().any(|(_, c)| *c == Class::ThreadStart);
    let mut machinery = own.iter().filter(|(_, c)| *c == Class::Machinery);
    let chosen = if thread {
        machinery.next_back()
    } else {
        machinery.next()
    };
    let v = chosen
        .or(own.first())
        .map(|(f, _)| vec![*f])
        .unwrap_or_default();
    (v, false)
}

/// Whether `f` is a native frame that says nothing of where it comes from: no rule knows
/// it, it has no source line, and its library is unknown or the C runtime's. Just inside a
/// thread's start, such a frame is the C runtime's thread start under another name.
fn anonymous_native(f: &Frame, class: Class) -> bool {
    if is_python(f) || f.line > 0 {
        return false;
    }
    let runtime = [
        "libc.so",
        "libc-",
        "libpthread",
        "libstdc++",
        "libgcc",
        "ld-linux",
    ];
    let unknown_library = no_file(f) || runtime.iter().any(|r| f.file.contains(r));
    unknown_library
        && (class == Class::Program || qualified_name(base_symbol(&f.name)).starts_with("std::"))
}

/// Whether `f` is the interpreter's: a Python frame, or a frame an interpreter rule
/// matches (CPython's C API, naming conventions, library or sources).
fn interpreter(f: &Frame) -> bool {
    if is_python(f) {
        return true;
    }
    rule_for(f).is_some_and(|r| match r.test {
        CPython(_) | InterpreterPath(_) => true,
        SymbolPrefix(p) => p == "_Py" || p == "Py",
        _ => false,
    })
}

/// A C function of the interpreter that no convention names (a static function of a
/// CPython version the table does not list) sits between the interpreter's own frames:
/// a run of plain C frames with no file and no line, the frame inside it the
/// interpreter's and the frame outside it a Python frame or the interpreter's, is the
/// interpreter's too. A program's C extension called from Python calls PyTorch or its own
/// code, not the interpreter, so it stays the program's.
fn interpreter_between(all: &mut [(&Frame, Class)]) {
    let plain = |f: &Frame, c: Class| {
        c == Class::Program
            && !is_python(f)
            && no_file(f)
            && f.line <= 0
            && base_symbol(&f.name)
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    let mut i = 1;
    while i < all.len() {
        if !plain(all[i].0, all[i].1) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j + 1 < all.len() && plain(all[j + 1].0, all[j + 1].1) {
            j += 1;
        }
        let inner = interpreter(all[i - 1].0) && !is_python(all[i - 1].0);
        let outer = all.get(j + 1).is_some_and(|(f, _)| interpreter(f));
        if inner && outer {
            for e in &mut all[i..=j] {
                e.1 = Class::Machinery;
            }
        }
        i = j + 1;
    }
}

/// The frames of one part of a stack with their classes, the frames that only started
/// the process or thread taken off or marked as a start (the policy at the head of this
/// file): native frames outside the innermost start frame go; on a thread, the anonymous
/// native frames just inside its start are a start; on a stack that reaches no start,
/// its outermost anonymous native frames are.
fn classed<'a>(part: &[&'a Frame]) -> Vec<(&'a Frame, Class)> {
    let mut all: Vec<(&Frame, Class)> = part.iter().map(|f| (*f, classify(f))).collect();
    interpreter_between(&mut all);
    let start = all
        .iter()
        .position(|(_, c)| matches!(c, Class::Start | Class::ThreadStart));
    // The run of anonymous native frames that ends at index `end` (exclusive) from the
    // outer side becomes part of the start.
    fn mark_inward(all: &mut [(&Frame, Class)], end: usize) {
        for (f, c) in all[..end].iter_mut().rev() {
            if !anonymous_native(f, *c) {
                break;
            }
            *c = Class::ThreadStart;
        }
    }
    match start {
        Some(s) => {
            // Python frames past it are kept: PyTorch appends the ones it could not
            // interleave after the native frames.
            let mut i = 0;
            all.retain(|(f, _)| {
                i += 1;
                i <= s + 1 || is_python(f)
            });
            if all[s].1 == Class::ThreadStart {
                mark_inward(&mut all, s);
            }
        }
        None => {
            if all.last().is_some_and(|(f, _)| !is_python(f)) {
                let n = all.len();
                mark_inward(&mut all, n);
            }
        }
    }
    all
}

/// `name (file:line)` of a frame; `name (file)` when its line is unknown, and the bare
/// name when its file is too (not `(??:0)`, which reads as an error). A native frame's
/// file is its source file, or its library when only that is known.
pub fn describe(f: &Frame) -> String {
    if no_file(f) {
        f.name.to_string()
    } else if f.line <= 0 {
        format!("{} ({})", f.name, f.file)
    } else {
        format!("{} ({}:{})", f.name, f.file, f.line)
    }
}

/// `name (file)` of a frame, its line left out (a tree by function); the bare name when
/// its file is unknown.
pub fn describe_function(f: &Frame) -> String {
    if no_file(f) {
        f.name.to_string()
    } else {
        format!("{} ({})", f.name, f.file)
    }
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
    fn cpython_frames_from_its_headers_and_source_tree_are_machinery() {
        // A conda Python built with debug information names its inlined call machinery
        // by header (public PyTorch snapshots show these as the innermost native frames).
        for (name, file) in [
            (
                "method_vectorcall",
                "/usr/local/src/conda/python-3.10.16/Include/internal/pycore_ceval.h",
            ),
            (
                "vectorcall_maybe.constprop.0",
                "/usr/local/src/conda/python-3.10.16/Include/cpython/abstract.h",
            ),
            (
                "_PyObject_FastCallDictTstate.localalias",
                "/usr/local/src/conda/python-3.10.16/Include/internal/pycore_ceval.h",
            ),
            ("slot_tp_call", "/build/Python-3.12.1/Objects/typeobject.c"),
            ("some_static_helper", "/build/Python-3.12.1/Parser/parser.c"),
        ] {
            assert!(is_machinery(&fr(name, file, 46)), "{name} {file}");
        }
        assert!(!is_machinery(&fr(
            "forward",
            "/x/site-packages/transformers/models/qwen2/modeling_qwen2.py",
            218
        )));
        assert!(!is_machinery(&fr(
            "load",
            "/work/myproj/Include/loader.c",
            3
        )));
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
        assert_eq!(site(&s, 1, 1), "cudaMalloc");
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

    const ALLOC: &str = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)";

    /// The autograd engine's worker thread as a real snapshot records it: the thread's
    /// start inside libstdc++ and libc misnamed by the symbolizer (nearest export).
    fn worker(node: &str, start: &[(&str, &str)]) -> Vec<Frame> {
        let mut v = vec![
            fr("torch::unwind::unwind()", "??", 0),
            fr(ALLOC, "CUDACachingAllocator.cpp", 0),
            fr("at::_ops::div_Scalar::call(at::Tensor const&, c10::Scalar const&)", "??", 0),
            fr(&format!("torch::autograd::generated::{node}_apply_functional(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"), "Functions.cpp", 0),
            fr(&format!("torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"), "??", 0),
            fr("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", "??", 0),
            fr("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)", "??", 0),
            fr("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
            fr("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", "??", 0),
            fr("torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", "", 0),
        ];
        v.extend(start.iter().map(|(n, f)| fr(n, f, 0)));
        v
    }

    #[test]
    fn frames_past_a_threads_start_are_never_sites_whatever_their_names() {
        let misnamed = [
            ("std::error_code::default_error_condition() const", "??"),
            ("pthread_condattr_setpshared", "??"),
            ("__clone", "??"),
        ];
        let s = stacks(worker("MeanBackward0", &misnamed));
        let got = site(&s, 1, 1);
        assert!(
            got.starts_with("torch::autograd::generated::MeanBackward0::apply("),
            "{got}"
        );
        // Known by position alone: the engine's loop not named, only the outermost clone.
        let mut v = worker("MeanBackward0", &misnamed);
        v.retain(|f| !f.name.contains("thread_main") && !f.name.contains("Engine::thread_init"));
        let s = stacks(v);
        assert!(
            site(&s, 1, 1).contains("MeanBackward0::apply("),
            "{}",
            site(&s, 1, 1)
        );
        // ... and with no start named at all: the outermost anonymous frames started it.
        let v: Vec<Frame> = worker("MeanBackward0", &misnamed[..2])
            .into_iter()
            .filter(|f| !f.name.contains("thread_main"))
            .collect();
        let s = stacks(v);
        let frames = program_frames(&s, 1);
        assert!(
            frames
                .iter()
                .all(|f| !f.name.contains("pthread_condattr") && !f.name.starts_with("std::")),
            "{frames:?}"
        );
        // A thread started through glibc's clone3 with sources: still the thread's start.
        let s = stacks(worker(
            "MulBackward0",
            &[
                ("std::error_code::default_error_condition() const", "??"),
                ("start_thread", "./nptl/pthread_create.c"),
                ("__clone3", "../sysdeps/unix/sysv/linux/x86_64/clone3.S"),
            ],
        ));
        assert!(
            site(&s, 1, 1).contains("MulBackward0::apply("),
            "{}",
            site(&s, 1, 1)
        );
        // A program's own thread function that names its file is the program's.
        let s = stacks(vec![
            fr("cudaMalloc", "??", 0),
            fr("worker", "/home/u/app.c", 12),
            fr("pthread_condattr_setpshared", "??", 0),
            fr("__clone", "??", 0),
        ]);
        assert_eq!(site(&s, 1, 1), "worker (/home/u/app.c:12)");
    }

    #[test]
    fn an_autograd_worker_allocation_is_named_by_its_node_or_its_forward_frames() {
        let mut v = worker(
            "MeanBackward0",
            &[
                ("execute_native_thread_routine", "thread48.o"),
                ("clone", "??"),
            ],
        );
        let s = stacks(v.clone());
        assert!(site(&s, 1, 1).starts_with("torch::autograd::generated::MeanBackward0::apply("));
        // With the forward pass PyTorch recorded, the forward's program line names it.
        v.push(fr(FORWARD_MARK, "", 0));
        v.push(fr("forward", "/home/u/model.py", 39));
        v.push(fr("train", "/home/u/train.py", 80));
        let s = stacks(v);
        assert_eq!(site(&s, 1, 1), "backward of forward (/home/u/model.py:39)");
        // A formula's helper is PyTorch's C++; the node that calls it names the allocation.
        assert_eq!(
            classify(&fr("torch::autograd::generated::details::div_tensor_other_backward(at::Tensor const&, at::Tensor const&, at::Tensor const&)", "", 0)),
            Class::Machinery
        );
        // No node in the stack (the engine casting a gradient): the engine's frame, never
        // the recorder's or the thread start's.
        let s = stacks(vec![
            fr("torch::unwind::unwind()", "??", 0),
            fr(ALLOC, "", 0),
            fr("void torch::autograd::validate_outputs_impl<torch::autograd::Engine>(...)", "??", 0),
            fr("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)", "??", 0),
            fr("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
            fr("std::error_code::default_error_condition() const", "??", 0),
            fr("pthread_condattr_setpshared", "??", 0),
            fr("__clone", "??", 0),
        ]);
        assert!(
            site(&s, 1, 1).starts_with("torch::autograd::Engine::evaluate_function("),
            "{}",
            site(&s, 1, 1)
        );
    }

    /// A CPU backward runs the engine's loop on the calling thread: the Python frames
    /// outside it are the program's, not a thread's start.
    #[test]
    fn the_engines_loop_on_the_calling_thread_keeps_the_programs_python_frames() {
        let s = stacks(vec![
            fr(ALLOC, "", 0),
            fr("torch::autograd::generated::MeanBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", "??", 0),
            fr("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)", "??", 0),
            fr("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
            fr("torch::autograd::Engine::execute_with_graph_task(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
            fr("THPEngine_run_backward(_object*, _object*, _object*)", "python_engine.cpp", 0),
            fr("cfunction_call", "", 0),
            fr("backward", "/x/site-packages/torch/autograd/__init__.py", 266),
            fr("_PyEval_EvalFrameDefault", "??", 0),
            fr("train", "/home/u/train.py", 40),
            fr("Py_BytesMain", "??", 0),
            fr("_start", "??", 0),
        ]);
        assert_eq!(site(&s, 1, 1), "train (/home/u/train.py:40)");
    }

    #[test]
    fn every_cpython_protocol_function_is_machinery_whatever_its_name() {
        for n in [
            "binary_op1",
            "binary_op",
            "ternary_op",
            "PyNumber_TrueDivide",
            "slot_nb_true_divide",
            "slot_tp_call",
            "wrap_binaryfunc_l",
            "wrapperdescr_call",
            "_PyObject_MakeTpCall.localalias",
            "_PyObject_VectorcallTstate.lto_priv.4",
            "method_vectorcall.llvm.12275804309777372242",
            "method_vectorcall_VARARGS_KEYWORDS",
            "vectorcall_maybe.constprop.0",
            "cfunction_call",
            "type_call",
            "property_descr_get",
            "do_call_core",
            "run_mod.llvm.9196888086361497952",
            "PyCMethod_New",
        ] {
            assert_eq!(classify(&fr(n, "", 0)), Class::Machinery, "{n}");
            assert_eq!(classify(&fr(n, "??", 0)), Class::Machinery, "{n}");
        }
        // A CPython function no convention names, between the interpreter's frames: the
        // interpreter's. A program's C extension called from Python stays the program's.
        let s = stacks(vec![
            fr(ALLOC, "", 0),
            fr(
                "torch::autograd::THPVariable_add(_object*, _object*, _object*)",
                "??",
                0,
            ),
            fr("slot_nb_add", "", 0),
            fr("fast_function", "", 0),
            fr("forward", "/home/u/model.py", 7),
        ]);
        assert_eq!(site(&s, 1, 1), "forward (/home/u/model.py:7)");
        let s = stacks(vec![
            fr(ALLOC, "", 0),
            fr("at::_ops::empty::call(c10::ArrayRef<long>)", "??", 0),
            fr("my_fused_op", "", 0),
            fr("cfunction_call", "", 0),
            fr("forward", "/home/u/model.py", 7),
        ]);
        assert_eq!(site(&s, 1, 1), "my_fused_op");
        // By library where the frame names it, whatever the function.
        for m in ["/usr/lib/libpython3.12.so.1.0", "/opt/conda/bin/python3.10"] {
            assert_eq!(
                classify(&fr("some_new_helper", m, 0)),
                Class::Machinery,
                "{m}"
            );
        }
        // A program's C function that names its own file is the program's, whatever its name.
        assert_eq!(
            classify(&fr("binary_op_kernel", "/home/u/ops.c", 7)),
            Class::Program
        );
        // The LLaMA shape: `a / b` on tensors, the model's line is the site.
        let s = stacks(vec![
            fr(ALLOC, "CUDACachingAllocator.cpp", 0),
            fr("torch::autograd::THPVariable_div(_object*, _object*, _object*)", "python_variable_methods.cpp", 0),
            fr("_object* torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_div>(_object*, _object*, _object*)", "python_variable_methods.cpp", 0),
            fr("method_vectorcall_VARARGS_KEYWORDS", "", 0),
            fr("vectorcall_maybe.constprop.0", "", 0),
            fr("slot_nb_true_divide", "", 0),
            fr("binary_op1", "", 0),
            fr("forward", "/w/lib/transformers/models/llama/modeling_llama.py", 330),
            fr("_PyEval_EvalFrameDefault", "??", 0),
            fr("main", "/w/run.py", 53),
        ]);
        assert_eq!(
            site(&s, 1, 1),
            "forward (/w/lib/transformers/models/llama/modeling_llama.py:330)"
        );
    }

    #[test]
    fn a_custom_autograd_functions_entry_is_machinery_and_python_frames_past_start_count() {
        assert_eq!(
            classify(&fr(
                "(anonymous namespace)::THPFunction_apply(_object*, _object*)",
                "python_function.cpp",
                0
            )),
            Class::Machinery
        );
        assert_eq!(
            classify(&fr(
                "THPVariable_subclass_clear(THPVariable*) [clone .part.0]",
                "python_variable.cpp",
                0
            )),
            Class::Machinery
        );
        // The Function's Python forward allocates: it is the site.
        let s = stacks(vec![
            fr(ALLOC, "", 0),
            fr(
                "torch::autograd::THPVariable_mul(_object*, _object*, _object*)",
                "??",
                0,
            ),
            fr("forward", "/home/u/fused.py", 21),
            fr("_PyEval_EvalFrameDefault", "??", 0),
            fr(
                "(anonymous namespace)::THPFunction_apply(_object*, _object*)",
                "python_function.cpp",
                0,
            ),
            fr("cfunction_call", "", 0),
            fr("apply", "/x/site-packages/torch/autograd/function.py", 576),
            fr("step", "/home/u/train.py", 9),
        ]);
        assert_eq!(site(&s, 1, 1), "forward (/home/u/fused.py:21)");
        // The Function is PyTorch's own (its forward is library code): the caller is the
        // site, even when PyTorch appended the outer Python frames past `_start`.
        let s = stacks(vec![
            fr(ALLOC, "", 0),
            fr(
                "pybind11::cpp_function::dispatcher(_object*, _object*, _object*)",
                "",
                0,
            ),
            fr(
                "broadcast_coalesced",
                "/x/site-packages/torch/nn/parallel/comm.py",
                66,
            ),
            fr("_PyEval_EvalFrameDefault", "??", 0),
            fr(
                "(anonymous namespace)::THPFunction_apply(_object*, _object*)",
                "python_function.cpp",
                0,
            ),
            fr(
                "forward",
                "/x/site-packages/torch/nn/parallel/_functions.py",
                23,
            ),
            fr("apply", "/x/site-packages/torch/autograd/function.py", 576),
            fr("_PyEval_EvalFrameDefault", "??", 0),
            fr("Py_BytesMain", "??", 0),
            fr("__libc_start_main", "??", 0),
            fr("_start", "??", 0),
            fr("train", "/home/u/trainers.py", 444),
            fr("main", "/home/u/start_train.py", 46),
        ]);
        assert_eq!(site(&s, 1, 1), "train (/home/u/trainers.py:444)");
        assert_eq!(
            site(&s, 1, 2),
            "train (/home/u/trainers.py:444) <- main (/home/u/start_train.py:46)"
        );
    }

    #[test]
    fn a_frame_with_no_file_or_line_prints_as_its_function_and_library() {
        assert_eq!(describe(&fr("binary_op1", "", 0)), "binary_op1");
        assert_eq!(describe(&fr("binary_op1", "??", 0)), "binary_op1");
        assert_eq!(
            describe(&fr("THPFunction_apply", "python_function.cpp", 0)),
            "THPFunction_apply (python_function.cpp)"
        );
        assert_eq!(
            describe(&fr("cudaMalloc", "/usr/lib/libcudart.so.12", 0)),
            "cudaMalloc (/usr/lib/libcudart.so.12)"
        );
        assert_eq!(describe(&fr("f", "/a.py", 3)), "f (/a.py:3)");
        assert_eq!(describe_function(&fr("binary_op1", "??", 0)), "binary_op1");
    }

    #[test]
    fn compiler_clone_suffixes_are_taken_off_before_the_rules() {
        assert_eq!(base_symbol("Py_RunMain.localalias"), "Py_RunMain");
        assert_eq!(
            base_symbol("method_vectorcall.llvm.1234"),
            "method_vectorcall"
        );
        assert_eq!(base_symbol("f(int) [clone .part.0]"), "f(int)");
        assert_eq!(
            base_symbol("a::b(std::vector<int>.x)"),
            "a::b(std::vector<int>.x)"
        );
        assert_eq!(base_symbol("libffi.so.8+0x6f79"), "libffi.so.8+0x6f79");
    }
}
