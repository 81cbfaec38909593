//! Build the demo's workload (`examples/demo.c`) at build time, so that `cushim demo` needs no
//! C compiler where it runs: the executable is embedded in the `cushim` binary and written
//! to the demo's temporary directory when it runs.
//!
//! Policy: the workload is linked dynamically to `libcudart.so.12`, as a CUDA program is, so
//! that at run time it binds to whatever provides that name first on the library path
//! (simcuda's layout for the demo). To link it here without simcuda's library (a cdylib of
//! another package, which a build script cannot depend on), a stub `libcudart.so` with the
//! SONAME `libcudart.so.12` defines every `cuda*` function the source calls; only its name
//! ends up in the executable. Without a C compiler the build still succeeds and `cushim
//! demo` says it was built without its workload (`CUSHIM_DEMO_EXE` is then empty).

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
