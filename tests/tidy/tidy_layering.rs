//! Layering is a test: inside each crate of the workspace, the top-level folders (a file at
//! the top is a folder of its own) import one another one way only, test code included. A
//! new import circle fails here the day it is written, instead of being found later by
//! whoever reads ARCHITECTURE.md and believes it.
//!
//! How imports are read: every module path a source file names (`crate::a::b`, `super::a`,
//! `self::a`, in `use` lines, `use` trees over several lines and paths written inline) is
//! mapped to the longest module of the crate it starts with; `super::` and `self::` resolve
//! from the module they are written in, counting inline `mod name { ... }` blocks (so
//! `use super::*` in a file's `mod tests` names the file itself). Not followed: a bare path
//! naming a child module (`records::X` in its parent), which never imports back up, and
//! paths built by macros. Comments are skipped.
//!
//! A circle that is there on purpose is in `ALLOWED`, with its reason in one line; an
//! allowed circle that no longer exists fails too, so the list never grows stale.
//!
//! Written here rather than taken from a crate: the check needs only module paths, not a
//! Rust parser (a `syn`-based walk would be heavier to build and still miss macro paths).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

/// Each crate's source folder, from the workspace root.
const CRATES: &[&str] = &["src", "shim/src", "tools/src", "simcuda/src"];

/// Circles between folders that are argued, not accidents: (crate folder, members sorted,
/// why).
const ALLOWED: &[(&str, &[&str], &str)] = &[
    (
        "simcuda/src",
        &[
            "api", "capture", "fault", "host", "ipc", "latency", "memory", "profile", "state",
            "stream", "vmm",
        ],
        "one simulated device: `state` holds every table of it, each part of the device \
         (memory, streams, capture, VMM, IPC, host memory) reads the others' tables through \
         it, and the fault and latency models (`profile` their costs) act inside every call",
    ),
    (
        "simcuda/src",
        &["copy", "driver_mem_api"],
        "the runtime's copies and the driver's are one implementation, reached from both APIs",
    ),
];

type Module = Vec<String>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, by its module path.
fn modules(dir: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.insert(module_of(dir, &path), path);
            }
        }
    }
    out
}

fn module_of(root: &Path, path: &Path) -> Module {
    let rel = path
        .strip_prefix(root)
        .expect("under the root")
        .with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return Vec::new();
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// `text` without `//` and `/* */` comments.
fn strip_comments(text: &str) -> String {
    let block = Regex::new(r"(?s)/\*.*?\*/").expect("a valid pattern");
    block
        .replace_all(text, "")
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `a::{b, c::{d, e}}` -> `[a::b, a::c::d, a::c::e]`.
fn expand(group: &str) -> Vec<String> {
    let group = group.trim();
    let Some(open) = group.find('{') else {
        return vec![group.to_owned()];
    };
    if !group.ends_with('}') {
        return vec![group.to_owned()];
    }
    let prefix = group[..open].trim_end_matches("::");
    let body = &group[open + 1..group.len() - 1];
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for ch in body.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    parts.push(cur);
    let mut out = Vec::new();
    for p in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        for e in expand(p) {
            out.push(if prefix.is_empty() {
                e
            } else {
                format!("{prefix}::{e}")
            });
        }
    }
    out
}

/// (start, end, name) of each inline `mod name { ... }` block, braces matched.
fn inline_mods(text: &str) -> Vec<(usize, usize, String)> {
    let re = Regex::new(r"(?-u:\b)mod[ \t\n]+([A-Za-z0-9_]+)[ \t\n]*\{").expect("a valid pattern");
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for c in re.captures_iter(text) {
        let whole = c.get(0).expect("the match");
        let (mut depth, mut i) = (0i32, whole.end() - 1);
        while i < bytes.len() {
            match bytes[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        out.push((whole.end(), i, c[1].to_owned()));
    }
    out
}

/// The absolute module paths named in `text`, the source of `module`.
fn refs(text: &str, module: &Module) -> Vec<Module> {
    let text = strip_comments(text);
    let blocks = inline_mods(&text);
    let re = Regex::new(
        r"(?s)(?:^|[^A-Za-z0-9_:])((?:crate|self|super)::(?:\{[^;]*\}|[A-Za-z0-9_]+(?:::[A-Za-z0-9_]+)*(?:::\{[^;]*\})?))",
    )
    .expect("a valid pattern");
    let as_re = Regex::new(r"[ \t\n]+as[ \t\n]+").expect("a valid pattern");
    let mut found = Vec::new();
    for c in re.captures_iter(&text) {
        let m = c.get(1).expect("the path");
        let mut here = module.clone();
        let mut around: Vec<_> = blocks
            .iter()
            .filter(|(s, e, _)| *s <= m.start() && m.start() < *e)
            .collect();
        around.sort();
        here.extend(around.into_iter().map(|(_, _, n)| n.clone()));
        for path in expand(m.as_str()) {
            let path = as_re.split(&path).next().unwrap_or("").trim().to_owned();
            let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            if segs.is_empty() {
                continue;
            }
            let mut base = if segs[0] == "crate" {
                segs.remove(0);
                Vec::new()
            } else {
                let mut base = here.clone();
                while let Some(&first) = segs.first() {
                    match first {
                        "self" => {}
                        "super" if base.is_empty() => break,
                        "super" => {
                            base.pop();
                        }
                        _ => break,
                    }
                    segs.remove(0);
                }
                base
            };
            base.extend(
                segs.into_iter()
                    .filter(|s| *s != "self" && *s != "*")
                    .map(str::to_owned),
            );
            found.push(base);
        }
    }
    found
}

/// The imports between top-level folders of the crate in `dir` (test code included).
fn folder_graph(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = modules(dir);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        for r in refs(&text, module) {
            let Some(target) = (1..=r.len())
                .rev()
                .map(|k| &r[..k])
                .find(|k| files.contains_key(*k))
            else {
                continue;
            };
            let (Some(a), Some(b)) = (module.first(), target.first()) else {
                continue;
            };
            if a != b {
                graph.entry(a.clone()).or_default().insert(b.clone());
                graph.entry(b.clone()).or_default();
            }
        }
    }
    graph
}

/// The strongly connected groups of more than one node (Tarjan's algorithm), each sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.graph[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out.sort();
    walk.out
}

/// The imports inside `circle`, to show what to cut.
fn edges_inside(graph: &BTreeMap<String, BTreeSet<String>>, circle: &[String]) -> String {
    let mut out = String::new();
    for a in circle {
        for b in graph[a].iter().filter(|b| circle.contains(b)) {
            out.push_str(&format!("\n    {a} -> {b}"));
        }
    }
    out
}

#[test]
fn the_folders_of_every_crate_import_one_way_except_the_argued_circles() {
    let mut problems = Vec::new();
    for krate in CRATES {
        let graph = folder_graph(&root().join(krate));
        assert!(
            graph.len() > 3,
            "{krate}: only {} folders read",
            graph.len()
        );
        let found = circles(&graph);
        for c in &found {
            let allowed = ALLOWED
                .iter()
                .any(|(k, members, _)| k == krate && members.iter().eq(c.iter()));
            if !allowed {
                problems.push(format!(
                    "{krate}: a new import circle {}; its imports:{}",
                    c.join(" <-> "),
                    edges_inside(&graph, c)
                ));
            }
        }
        for (k, members, _) in ALLOWED.iter().filter(|(k, ..)| k == krate) {
            if !found.iter().any(|c| members.iter().eq(c.iter())) {
                problems.push(format!(
                    "{k}: the allowed circle {} is gone: remove it from ALLOWED",
                    members.join(" <-> ")
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_circle_through_test_code_is_found() {
    // Two folders, one importing the other in its code and the other importing back only
    // in its tests: a circle all the same.
    let dir = std::env::temp_dir().join(format!("cushim-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("low")).expect("a scratch crate");
    std::fs::create_dir_all(dir.join("high")).expect("a scratch crate");
    std::fs::write(dir.join("lib.rs"), "mod low;\nmod high;\n").expect("writing");
    std::fs::write(dir.join("high/mod.rs"), "use crate::low::thing;\n").expect("writing");
    std::fs::write(
        dir.join("low/mod.rs"),
        "pub fn thing() {}\n#[cfg(test)]\nmod tests {\n    use super::super::high;\n}\n",
    )
    .expect("writing");
    let graph = folder_graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        circles(&graph),
        vec![vec!["high".to_owned(), "low".to_owned()]]
    );
}

#[test]
fn use_trees_and_aliases_expand_to_each_path() {
    assert_eq!(
        expand("crate::a::{b, c::{d, e as f}}"),
        ["crate::a::b", "crate::a::c::d", "crate::a::c::e as f"]
    );
    let m: Module = vec!["x".into()];
    let got = refs(
        "use super::y::{z, w as v};\n// use crate::ignored;\nfn f() { crate::q::r(); }",
        &m,
    );
    assert_eq!(got, vec![vec!["y", "z"], vec!["y", "w"], vec!["q", "r"]]);
}
