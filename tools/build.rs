//! The `cushim` binary's build script. Two things are built here so that an installed
//! `cushim` needs nothing beside it (`cargo install`, a wheel built by `pip install .`):
//!
//! 1. The demo's workload (`examples/demo.c`), so that `cushim demo` needs no C compiler where
//!    it runs: the executable is embedded in the `cushim` binary and written to the demo's
//!    temporary directory when it runs. It is linked dynamically to `libcudart.so.12`, as a
//!    CUDA program is, so that at run time it binds to whatever provides that name first on
//!    the library path (simcuda's layout for the demo). To link it here without simcuda's
//!    library, a stub `libcudart.so` with the SONAME `libcudart.so.12` defines every `cuda*`
//!    function the source calls; only its name ends up in the executable. Without a C
//!    compiler the build still succeeds and `cushim demo` says it was built without its
//!    workload (`CUSHIM_DEMO_EXE` is then empty).
//! 2. The shim (`libcushim.so`) and simcuda (`libsimcuda.so`), embedded in the binary
//!    (`CUSHIM_EMBED_SHIM`, `CUSHIM_EMBED_SIMCUDA`; empty files when not embedded). Cargo
//!    cannot make a cdylib of another package a build input on stable, so they are built by
//!    a nested `cargo build --release -p cushim-shim -p simcuda` of this workspace, in a
//!    target directory of its own (`<target>/cushim-embedded`: the outer build holds its own
//!    directory's lock, so sharing it would deadlock; keeping it under the outer target makes
//!    the next release build incremental). The nested cargo inherits the outer jobserver, so
//!    `-j` still bounds the whole build.
//!
//!    Policy: embedded in release builds (what `cargo install`, maturin and pip build), not
//!    in dev builds, where the tests use the libraries of the same build tree and a second,
//!    release, compile of the engine would double every edit's cost. `CUSHIM_EMBED_LIBS=1`
//!    forces it, `=0` turns it off. A source without the workspace beside it (the crate
//!    alone) builds without them, with a warning; `cushim` then looks for them as before.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    let src = root.join("examples").join("demo.c");
    let include = root.join("simcuda").join("include");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let exe = out.join("cushim-demo");
    match build_demo(&src, &include, &out, &exe) {
        Ok(()) => println!("cargo:rustc-env=CUSHIM_DEMO_EXE={}", exe.display()),
        Err(e) => {
            println!("cargo:warning=cushim demo is built without its workload: {e}");
            let empty = out.join("cushim-demo.missing");
            if let Err(e) = std::fs::write(&empty, b"") {
                panic!("writing {}: {e}", empty.display());
            }
            println!("cargo:rustc-env=CUSHIM_DEMO_EXE={}", empty.display());
        }
    }
    let (shim, simcuda) = match embedded_libraries(&root, &out) {
        Ok(Some(libs)) => libs,
        Ok(None) => (empty_file(&out, "shim"), empty_file(&out, "simcuda")),
        Err(e) => panic!("building the shim and simcuda to embed in cushim: {e}"),
    };
    println!("cargo:rustc-env=CUSHIM_EMBED_SHIM={}", shim.display());
    println!("cargo:rustc-env=CUSHIM_EMBED_SIMCUDA={}", simcuda.display());
    match content_tag(&[&shim, &simcuda]) {
        Ok(tag) => println!("cargo:rustc-env=CUSHIM_EMBED_TAG={tag}"),
        Err(e) => panic!("{e}"),
    }
}

/// A name for the embedded pair, from their contents (FNV-1a, 64 bits, over both files), so
/// that each build's copies get their own cache directory. It only names: `cushim` checks a
/// cached copy against the embedded bytes themselves.
fn content_tag(files: &[&Path]) -> Result<String, String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in files {
        let bytes = std::fs::read(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        for b in bytes.iter().chain(&(bytes.len() as u64).to_le_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(format!("{h:016x}"))
}

/// An empty file under `out` standing for a library that is not embedded.
fn empty_file(out: &Path, what: &str) -> PathBuf {
    let p = out.join(format!("{what}.not-embedded"));
    if let Err(e) = std::fs::write(&p, b"") {
        panic!("writing {}: {e}", p.display());
    }
    p
}

/// Whether this build embeds the libraries: `CUSHIM_EMBED_LIBS` when set, else a release
/// build.
fn embedding_wanted() -> Result<bool, String> {
    println!("cargo:rerun-if-env-changed=CUSHIM_EMBED_LIBS");
    match std::env::var("CUSHIM_EMBED_LIBS").as_deref() {
        Ok("1") => Ok(true),
        Ok("0") => Ok(false),
        Ok(v) => Err(format!("CUSHIM_EMBED_LIBS={v}: expected 0 or 1")),
        Err(_) => Ok(std::env::var("PROFILE").is_ok_and(|p| p == "release")),
    }
}

/// The outer build's target directory (the ancestor of `out` cargo tagged with
/// CACHEDIR.TAG), where the nested build keeps its own directory.
fn nested_target_dir(out: &Path) -> PathBuf {
    out.ancestors()
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map(|t| t.join("cushim-embedded"))
        .unwrap_or_else(|| out.join("cushim-embedded"))
}

/// Build the shim and simcuda (release) and copy them into `out`; their paths, or None when
/// this build does not embed them.
fn embedded_libraries(root: &Path, out: &Path) -> Result<Option<(PathBuf, PathBuf)>, String> {
    if !embedding_wanted()? {
        return Ok(None);
    }
    let forced = std::env::var("CUSHIM_EMBED_LIBS").is_ok_and(|v| v == "1");
    let workspace = root.join("Cargo.toml");
    if !root.join("shim").join("Cargo.toml").is_file()
        || !root.join("simcuda").join("Cargo.toml").is_file()
    {
        let msg = format!(
            "no shim/ and simcuda/ beside {}: cushim is built without the shim and simcuda \
             embedded (it looks for them next to itself, in ../lib/cushim, or CUSHIM_LIB)",
            workspace.display()
        );
        if forced {
            return Err(msg);
        }
        println!("cargo:warning={msg}");
        return Ok(None);
    }
    for input in [
        "src",
        "shim",
        "simcuda",
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }
    let target = std::env::var("TARGET").map_err(|e| format!("TARGET: {e}"))?;
    let dir = nested_target_dir(out);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "-p", "cushim-shim", "-p", "simcuda"])
        .arg("--manifest-path")
        .arg(&workspace)
        .args(["--target", &target])
        .env("CARGO_TARGET_DIR", &dir)
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env("CUSHIM_EMBED_LIBS", "0");
    run(&mut cmd)?;
    let built = dir.join(&target).join("release");
    let copy = |name: &str| -> Result<PathBuf, String> {
        let (from, to) = (built.join(name), out.join(name));
        std::fs::copy(&from, &to)
            .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
        Ok(to)
    };
    let shim = copy("libcushim.so")?;
    let simcuda = copy("libsimcuda.so")?;
    Ok(Some((shim, simcuda)))
}

/// The `cuda*` functions a C source calls: each identifier starting with `cuda` followed
/// (after blanks) by `(`.
fn called_cuda_functions(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut names = Vec::new();
    let mut i = 0;
    while let Some(pos) = text[i..].find("cuda") {
        let start = i + pos;
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        let after = text[end..].trim_start();
        let boundary = start == 0 || !ident(bytes[start - 1]);
        if boundary && after.starts_with('(') {
            names.push(text[start..end].to_string());
        }
        i = end.max(start + 4);
    }
    names.sort();
    names.dedup();
    names
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("running {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn build_demo(src: &Path, include: &Path, out: &Path, exe: &Path) -> Result<(), String> {
    let text =
        std::fs::read_to_string(src).map_err(|e| format!("reading {}: {e}", src.display()))?;
    let stub_dir = out.join("cudart-stub");
    std::fs::create_dir_all(&stub_dir)
        .map_err(|e| format!("creating {}: {e}", stub_dir.display()))?;
    let stub_src = stub_dir.join("stub.c");
    let stub: String = called_cuda_functions(&text)
        .iter()
        .map(|f| format!("void {f}(void) {{}}\n"))
        .collect();
    std::fs::write(&stub_src, stub).map_err(|e| format!("writing {}: {e}", stub_src.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    run(Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o"])
        .arg(stub_dir.join("libcudart.so"))
        .arg(&stub_src))?;
    run(Command::new(&cc)
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-Wall",
            "-pthread",
            "-I",
        ])
        .arg(include)
        .arg(src)
        .arg("-o")
        .arg(exe)
        .arg("-L")
        .arg(&stub_dir)
        .arg("-lcudart"))
}
