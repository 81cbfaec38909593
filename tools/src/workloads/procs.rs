//! Real processes on simcuda: the C benchmark programs (`examples/bench_*.c`) compiled
//! against simcuda's headers and run with and without `LD_PRELOAD=libcushim.so`.
//!
//! Invariant: every run gets a clean environment (no inherited `CUSHIM_*`, `SIMCUDA_*` or
//! `LD_PRELOAD`), simcuda first on `LD_LIBRARY_PATH`, a deadline after which it is killed,
//! and its figures are parsed from what the program printed, never assumed.

use crate::artifacts;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the shim, simcuda and the compiled programs are.
pub struct ProcEnv {
    pub dir: PathBuf,
    pub layout: PathBuf,
    pub shim: PathBuf,
    pub bins: PathBuf,
}

impl ProcEnv {
    /// The built files in `dir` (a cargo output directory such as `target/release`).
    pub fn new(dir: &Path) -> Result<ProcEnv, String> {
        let shim = dir.join(artifacts::SHIM_LIB);
        if !artifacts::simcuda_include_dir()
            .join("cuda_runtime.h")
            .exists()
        {
            return Err("simcuda/include/cuda_runtime.h missing (simcuda not merged yet)".into());
        }
        let layout = artifacts::sim_layout(dir).map_err(|e| format!("simcuda layout: {e}"))?;
        // A figure measured on a library older than its sources would describe other code:
        // refuse it, naming the build to run (cargo's lock is held while a bench runs, so
        // the bench cannot build it itself).
        for (lib, sources) in [
            (shim.clone(), &["shim/src", "src"][..]),
            (dir.join(artifacts::SIMCUDA_LIB), &["simcuda/src"][..]),
        ] {
            if let Some(newer) = newer_source(&lib, sources) {
                return Err(format!(
                    "{} is older than {}: run `cargo build --release -p cushim-shim -p simcuda` (or the profile of {}) first",
                    lib.display(),
                    newer.display(),
                    dir.display()
                ));
            }
        }
        let bins = dir.join("bench-bin");
        std::fs::create_dir_all(&bins).map_err(|e| format!("creating {}: {e}", bins.display()))?;
        Ok(ProcEnv {
            dir: dir.to_path_buf(),
            layout,
            shim,
            bins,
        })
    }

    /// Compile `examples/<name>.c` (with `-O2`, `-ldl`) into the bench-bin directory.
    pub fn compile(&self, name: &str) -> Result<PathBuf, String> {
        let src = artifacts::source_root()
            .join("examples")
            .join(format!("{name}.c"));
        let out = self.bins.join(name);
        artifacts::compile_c(&src, &out, &self.layout, &["-O2", "-ldl"])
            .map_err(|e| format!("compiling {name}: {e}"))?;
        Ok(out)
    }

    /// Run `exe args` on simcuda (with the shim when `shim`), extra `env`, killed after
    /// `limit`. Returns stdout; a non-zero exit is an error carrying stderr.
    pub fn run(
        &self,
        exe: &Path,
        args: &[&str],
        shim: bool,
        env: &[(&str, &str)],
        limit: Duration,
    ) -> Result<String, String> {
        if shim && !self.shim.exists() {
            return Err(format!("{} not built", self.shim.display()));
        }
        let mut cmd = Command::new(exe);
        cmd.args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("CUSHIM_") || k.starts_with("SIMCUDA_") || k == "LD_PRELOAD" {
                cmd.env_remove(k);
            }
        }
        cmd.env("LD_LIBRARY_PATH", &self.layout);
        if shim {
            cmd.env("LD_PRELOAD", &self.shim);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let dir = self.bins.join(format!("run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let out_path = dir.join("stdout");
        let err_path = dir.join("stderr");
        let open = |p: &Path| {
            std::fs::File::create(p).map_err(|e| format!("creating {}: {e}", p.display()))
        };
        cmd.stdout(Stdio::from(open(&out_path)?))
            .stderr(Stdio::from(open(&err_path)?));
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", exe.display()))?;
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if start.elapsed() > limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{} timed out after {limit:?}", exe.display()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(format!("waiting for {}: {e}", exe.display())),
            }
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        if !status.success() {
            return Err(format!(
                "{} {} exited with {status}: {}",
                exe.display(),
                args.join(" "),
                stderr.lines().last().unwrap_or("")
            ));
        }
        Ok(stdout)
    }
}

/// The value of `key=` in a line of `key=value` words.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// One `bench ...` line of bench_alloc.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub kind: String,
    pub size: u64,
    pub threads: u32,
    pub ns_per_pair: f64,
    pub pairs_per_s: f64,
}

/// Every `bench` line of bench_alloc's output.
pub fn pairs(out: &str) -> Vec<Pair> {
    out.lines()
        .filter(|l| l.starts_with("bench "))
        .filter_map(|l| {
            Some(Pair {
                kind: field(l, "kind")?.to_string(),
                size: field(l, "size")?.parse().ok()?,
                threads: field(l, "threads")?.parse().ok()?,
                ns_per_pair: field(l, "ns_per_pair")?.parse().ok()?,
                pairs_per_s: field(l, "pairs_per_s")?.parse().ok()?,
            })
        })
        .collect()
}

/// The pair of `kind` at `size` in `ps`.
pub fn find<'a>(ps: &'a [Pair], kind: &str, size: u64) -> Option<&'a Pair> {
    ps.iter().find(|p| p.kind == kind && p.size == size)
}

/// The shim's device allocation count from bench_alloc's `shim` line (`None` when the
/// shim was not loaded).
pub fn shim_allocs(out: &str) -> Option<i64> {
    let l = out.lines().find(|l| l.starts_with("shim "))?;
    if field(l, "loaded")? != "1" {
        return None;
    }
    field(l, "device_allocs")?.parse().ok()
}

/// The number of runtime pairs the whole bench_alloc run made (its `shim` line).
pub fn runtime_pairs(out: &str) -> Option<u64> {
    let l = out.lines().find(|l| l.starts_with("shim "))?;
    field(l, "runtime_pairs")?.parse().ok()
}

/// Driver calls simcuda counted in a `SIMCUDA_REPORT` file: (all calls, calls that order
/// streams: event record/query/synchronize, stream waits, capture-status queries).
pub fn report_calls(path: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let calls = v.get("calls")?.as_object()?;
    let mut all = 0;
    let mut ordering = 0;
    for (name, n) in calls {
        let n = n.as_u64().unwrap_or(0);
        all += n;
        if name.starts_with("cuEventRecord")
            || name.starts_with("cuEventQuery")
            || name.starts_with("cuEventSynchronize")
            || name.starts_with("cuStreamWaitEvent")
            || name.starts_with("cuStreamIsCapturing")
        {
            ordering += n;
        }
    }
    Some((all, ordering))
}

/// bench_frag's result: (peak allocated, peak reserved) bytes.
pub fn frag(out: &str) -> Option<(u64, u64)> {
    let l = out.lines().find(|l| l.starts_with("frag "))?;
    Some((
        field(l, "peak_allocated")?.parse().ok()?,
        field(l, "peak_reserved")?.parse().ok()?,
    ))
}

/// A source file under `folders` (relative to the source tree) modified after `lib` was
/// built, if any; `None` when `lib` is missing (reported where it is run) or the sources are
/// not there (an installed `cushim`).
fn newer_source(lib: &Path, folders: &[&str]) -> Option<PathBuf> {
    let built = std::fs::metadata(lib).and_then(|m| m.modified()).ok()?;
    let mut stack: Vec<PathBuf> = folders
        .iter()
        .map(|f| artifacts::source_root().join(f))
        .collect();
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs")
                && meta.modified().is_ok_and(|m| m > built)
            {
                return Some(path);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "bench kind=glibc size=512 threads=1 pairs=100 ns_per_pair=12.5 pairs_per_s=80000000\n\
                       bench kind=runtime size=1048576 threads=2 pairs=10 ns_per_pair=300.0 pairs_per_s=6666666\n\
                       shim loaded=1 device_allocs=2\n";

    #[test]
    fn bench_alloc_lines_parse_into_pairs() {
        let ps = pairs(OUT);
        assert_eq!(ps.len(), 2);
        let rt = find(&ps, "runtime", 1 << 20).unwrap();
        assert_eq!((rt.threads, rt.ns_per_pair), (2, 300.0));
        assert!(find(&ps, "driver", 512).is_none());
    }

    #[test]
    fn shim_line_counts_only_when_the_shim_is_loaded() {
        assert_eq!(shim_allocs(OUT), Some(2));
        assert_eq!(shim_allocs("shim loaded=0 device_allocs=0\n"), None);
    }

    #[test]
    fn frag_line_gives_allocated_and_reserved() {
        let out = "frag scenario=seed peak_allocated=134217728 peak_reserved=268435456 ratio=2.000 allocs=12\n";
        assert_eq!(frag(out), Some((134217728, 268435456)));
        assert_eq!(frag("nothing\n"), None);
    }
}
