//! The stream-taking entry points of CUDA 12 (driver and runtime, with the interop headers),
//! committed in `tests/data/cuda12-stream-entry-points.txt`, and the routes on which the
//! shim has code in the path of each one.
//!
//! # Why this list exists
//!
//! Skipping idle streams in the GPU-side barrier (`src/alloc/barrier.rs`) is safe only if
//! the shim sees every submission to every stream, on every route a program can reach the
//! driver by: the runtime's exported symbols, the driver's exported symbols (a program
//! linked with `-lcuda`), `cuGetProcAddress` (statically linked runtimes, libraries) and
//! `dlsym` on a library handle (Python bindings). This file keeps the committed list true
//! to NVIDIA's headers (when `target/nvidia-wheels` holds them) and to the shim's own hook
//! tables, so the gap is a number, not a guess: each line says which routes the shim
//! hooks today. A skip needs `sym,gpa,dls` on every `submit` and `capture` line (and a
//! hook that tracks, where today's stubs only watch for the per-thread handle).
//!
//! Line format: `API NAME STREAM KIND ROUTES`. `STREAM` is where the stream is: `argN`
//! (by value, argument `N`), `fieldN` (in the structure argument `N` points to), `ptrN`
//! (argument `N` points to a stream), several joined by `+`. `KIND`: `submit` (queues
//! work), `capture` (starts or joins a capture), `other` (reads or sets stream state,
//! creates, waits on the CPU, destroys: queues nothing). `ROUTES`: the routes on which
//! the shim has a hook or a stub for the name (`sym` exported symbol, `gpa`
//! `cuGetProcAddress` of its base name in legacy mode, `dls` `dlsym` of the exact name on a
//! library handle), `-` for none. The per-thread symbols the headers make by macro (`__CUDA_API_PTSZ`) are not
//! lines of their own: they take their stream where their legacy name does.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use crate::lookup::table::{hooked_symbol, row, LEGACY_FLAG};
    use crate::per_thread::{driver_hook, runtime_hook, DRIVER};

    /// The CUDA version the list describes (the wheel's headers).
    const VERSION: std::ffi::c_int = 12090;

    fn list_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/cuda12-stream-entry-points.txt")
    }

    struct Line {
        api: String,
        name: String,
        stream: String,
        kind: String,
        routes: String,
    }

    fn committed() -> Vec<Line> {
        let text = std::fs::read_to_string(list_path()).expect("the committed list");
        text.lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                assert_eq!(f.len(), 5, "five fields: {l}");
                Line {
                    api: f[0].into(),
                    name: f[1].into(),
                    stream: f[2].into(),
                    kind: f[3].into(),
                    routes: f[4].into(),
                }
            })
            .collect()
    }

    /// The name a `cuGetProcAddress` request uses for driver symbol `name`.
    fn base(name: &str) -> &str {
        let n = name
            .strip_suffix("_ptsz")
            .or_else(|| name.strip_suffix("_ptds"))
            .unwrap_or(name);
        match n.rfind("_v") {
            Some(i) if n[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < n.len() => &n[..i],
            _ => n,
        }
    }

    /// Every function the shim's sources export one by one (`#[no_mangle]` on one of the three
    /// lines before it); the stubs' macro is read through its lookup instead.
    fn exported_by_source() -> BTreeSet<String> {
        fn walk(dir: &Path, out: &mut BTreeSet<String>) {
            let entries = std::fs::read_dir(dir).expect("the shim's sources");
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).expect("a source file");
                    let lines: Vec<&str> = text.lines().collect();
                    for (i, l) in lines.iter().enumerate() {
                        if l.trim() != "#[no_mangle]" {
                            continue;
                        }
                        for next in lines.iter().skip(i + 1).take(3) {
                            if let Some(at) = next.find("extern \"C\" fn ") {
                                let rest = &next[at + "extern \"C\" fn ".len()..];
                                let name: String = rest
                                    .chars()
                                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                                    .collect();
                                out.insert(name);
                                break;
                            }
                        }
                    }
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
        out
    }

    /// The routes on which the shim has a hook or a stub for `name`, given the names its
    /// sources export.
    fn routes(api: &str, name: &str, exports: &BTreeSet<String>) -> String {
        let mut r = Vec::new();
        let by_source = exports.contains(name);
        if api == "runtime" {
            let looked_up =
                row(name.as_bytes()).is_some() || runtime_hook(name.as_bytes()).is_some();
            if looked_up || by_source {
                r.push("sym");
            }
            if looked_up {
                r.push("dls");
            }
        } else {
            let exported = by_source
                || row(name.as_bytes()).is_some()
                || driver_hook(name.as_bytes()).is_some();
            if exported {
                r.push("sym");
            }
            let b = base(name);
            let stub = DRIVER
                .iter()
                .any(|e| e.0 == b && (e.1..e.2).contains(&VERSION));
            if stub || hooked_symbol(b.as_bytes(), VERSION, LEGACY_FLAG, 0).is_some() {
                r.push("gpa");
            }
            let per_thread = name.ends_with("_ptsz") || name.ends_with("_ptds");
            if row(name.as_bytes()).is_some()
                || driver_hook(name.as_bytes()).is_some()
                || per_thread
            {
                r.push("dls");
            }
        }
        if r.is_empty() {
            "-".into()
        } else {
            r.join(",")
        }
    }

    #[test]
    fn the_committed_routes_are_what_the_shim_hooks_today() {
        let exports = exported_by_source();
        assert!(exports.contains("cudaMalloc") && exports.contains("cuMemAlloc_v2"));
        let mut wrong = Vec::new();
        for l in committed() {
            let got = routes(&l.api, &l.name, &exports);
            if got != l.routes {
                wrong.push(format!(
                    "{} {}: listed {}, hooked {got}",
                    l.api, l.name, l.routes
                ));
            }
            assert!(
                ["submit", "capture", "other"].contains(&l.kind.as_str()),
                "{}: kind {}",
                l.name,
                l.kind
            );
        }
        assert!(wrong.is_empty(), "update the list:\n{}", wrong.join("\n"));
    }

    #[test]
    fn every_driver_stream_function_the_per_thread_stubs_place_is_listed() {
        let listed: BTreeSet<String> = committed().into_iter().map(|l| l.name).collect();
        for (name, ..) in DRIVER {
            // CUDA 13 entry points are not in CUDA 12's headers.
            if [
                "cuMemcpyWithAttributesAsync",
                "cuMemcpy3DWithAttributesAsync",
                "cuMemPrefetchBatchAsync",
                "cuMemDiscardBatchAsync",
                "cuMemDiscardAndPrefetchBatchAsync",
            ]
            .contains(name)
            {
                continue;
            }
            assert!(listed.contains(*name), "{name} is not in the list");
        }
    }

    #[test]
    fn the_list_is_every_stream_taking_entry_point_of_the_wheels_headers() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/nvidia-wheels/headers/nvidia/cuda_runtime/include");
        if !dir.join("cuda.h").exists() {
            eprintln!("skipped: no NVIDIA headers under {}", dir.display());
            return;
        }
        let mut found: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        let sets = [
            (
                "driver",
                "CUstream",
                "cuda.h",
                &["cuda.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h"][..],
            ),
            (
                "runtime",
                "cudaStream_t",
                "driver_types.h",
                &[
                    "cuda_runtime_api.h",
                    "cuda_gl_interop.h",
                    "cuda_egl_interop.h",
                    "cuda_vdpau_interop.h",
                ][..],
            ),
        ];
        for (api, ty, types, files) in sets {
            let read = |f: &str| {
                std::fs::read_to_string(dir.join(f))
                    .map(|t| tokens(&t))
                    .unwrap_or_else(|e| panic!("{f}: {e}"))
            };
            let holders = stream_structs(&read(types), ty);
            for f in files {
                for (name, at) in stream_functions(&read(f), ty, &holders) {
                    found.entry((api.to_string(), name)).or_default().insert(at);
                }
            }
        }
        let found: BTreeSet<String> = found
            .into_iter()
            .map(|((api, name), at)| {
                let at: Vec<String> = at.into_iter().collect();
                format!("{api} {name} {}", at.join("|"))
            })
            .collect();
        let listed: BTreeSet<String> = committed()
            .into_iter()
            .map(|l| format!("{} {} {}", l.api, l.name, l.stream))
            .collect();
        let missing: Vec<&String> = found.difference(&listed).collect();
        let extra: Vec<&String> = listed.difference(&found).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "not listed: {missing:#?}\nnot in the headers: {extra:#?}"
        );
    }

    /// The header's tokens (identifiers, numbers, single punctuation characters), comments
    /// and preprocessor lines removed.
    fn tokens(text: &str) -> Vec<String> {
        let mut clean = String::with_capacity(text.len());
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("/*") {
                rest = r.find("*/").map_or("", |i| &r[i + 2..]);
                clean.push(' ');
            } else if let Some(r) = rest.strip_prefix("//") {
                rest = r.find('\n').map_or("", |i| &r[i..]);
            } else {
                let c = rest.chars().next().unwrap_or(' ');
                clean.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        let mut out = Vec::new();
        let mut continued = false;
        for line in clean.lines() {
            let directive = continued || line.trim_start().starts_with('#');
            continued = directive && line.trim_end().ends_with('\\');
            if directive {
                continue;
            }
            let mut word = String::new();
            for c in line.chars() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    word.push(c);
                    continue;
                }
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                if !c.is_whitespace() {
                    out.push(c.to_string());
                }
            }
            if !word.is_empty() {
                out.push(word);
            }
        }
        out
    }

    fn is_ident(t: &str) -> bool {
        t.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
    }

    /// The index just past the group that opens at `i` (`(`/`{`).
    fn close(t: &[String], i: usize) -> usize {
        let (open, shut) = if t[i] == "(" { ("(", ")") } else { ("{", "}") };
        let mut depth = 0;
        for (j, x) in t.iter().enumerate().skip(i) {
            if x == open {
                depth += 1;
            } else if x == shut {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
        }
        t.len()
    }

    /// The names of structures with a member of type `ty` (tags, typedef names, aliases).
    fn stream_structs(t: &[String], ty: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut i = 0;
        while i < t.len() {
            if t[i] != "struct" {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            let mut tag = None;
            while j < t.len() && is_ident(&t[j]) {
                tag = Some(t[j].clone());
                j += 1;
            }
            if j >= t.len() || t[j] != "{" {
                i = j;
                continue;
            }
            let end = close(t, j);
            let body = &t[j + 1..end.saturating_sub(1)];
            let holds = body
                .windows(3)
                .any(|w| w[0] == ty && is_ident(&w[1]) && w[2] == ";");
            let mut k = end;
            let mut declared = Vec::new();
            while k < t.len() && t[k] != ";" {
                if is_ident(&t[k]) {
                    declared.push(t[k].clone());
                }
                k += 1;
            }
            if holds {
                names.extend(tag);
                names.extend(declared);
            }
            i = end;
        }
        // `typedef [struct] X Y;` aliases, to a fixed point.
        loop {
            let before = names.len();
            for w in t.windows(4) {
                if w[0] == "typedef" && names.contains(&w[1]) && is_ident(&w[2]) && w[3] == ";" {
                    names.insert(w[2].clone());
                }
            }
            for w in t.windows(5) {
                if w[0] == "typedef" && w[1] == "struct" && names.contains(&w[2]) && w[4] == ";" {
                    names.insert(w[3].clone());
                }
            }
            if names.len() == before {
                return names;
            }
        }
    }

    /// Every function declared `CUDAAPI`/`CUDARTAPI` with a parameter of type `ty`, a pointer
    /// to it, or a pointer to one of `holders`: its name and where the stream is.
    fn stream_functions(
        t: &[String],
        ty: &str,
        holders: &BTreeSet<String>,
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for i in 0..t.len().saturating_sub(2) {
            if !(t[i] == "CUDAAPI" || t[i] == "CUDARTAPI") || t[i + 2] != "(" {
                continue;
            }
            let end = close(t, i + 2);
            let params = &t[i + 3..end.saturating_sub(1)];
            let mut at = Vec::new();
            for (n, p) in split_params(params).iter().enumerate() {
                let words: Vec<&str> = p
                    .iter()
                    .map(String::as_str)
                    .filter(|w| !["const", "struct", "enum"].contains(w))
                    .collect();
                // The type: every token but the parameter's name.
                let Some((_, ty_words)) = words.split_last() else {
                    continue;
                };
                match ty_words {
                    [w] if *w == ty => at.push(format!("arg{n}")),
                    [w, "*"] if *w == ty => at.push(format!("ptr{n}")),
                    [w, "*"] if holders.contains(*w) => at.push(format!("field{n}")),
                    _ => {}
                }
            }
            if !at.is_empty() {
                out.push((t[i + 1].clone(), at.join("+")));
            }
        }
        out
    }

    /// Parameters split at top-level commas, default-value markers (`__dv(x)`) removed.
    fn split_params(params: &[String]) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new()];
        let mut depth = 0;
        let mut skip = 0;
        let mut i = 0;
        while i < params.len() {
            let p = &params[i];
            if p == "__dv" {
                skip = close(params, i + 1);
            }
            if i < skip {
                i += 1;
                continue;
            }
            match p.as_str() {
                "(" | "[" => depth += 1,
                ")" | "]" => depth -= 1,
                "," if depth == 0 => {
                    out.push(Vec::new());
                    i += 1;
                    continue;
                }
                _ => {}
            }
            if let Some(last) = out.last_mut() {
                last.push(p.clone());
            }
            i += 1;
        }
        out
    }
}
