//! The documentation stays true to the tree, checked as an ordinary test: no tracker
//! references (code, tests and docs name behaviour, not issue numbers nobody here can
//! follow), every relative link in a Markdown file reaches a file that exists, and README and
//! BENCHMARKS.md stay short enough to read (README at most 250 lines, a manual lives in
//! `docs/`; BENCHMARKS.md at most 400, today's figures only: history is what git is for).

use std::path::{Path, PathBuf};

use regex::Regex;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file of the source tree with one of `exts`, outside build output, git's own files
/// and vendored data.
fn files(exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                let rel = path.strip_prefix(root()).unwrap_or(&path);
                let skip = name.starts_with('.')
                    || name == "target"
                    || name == "node_modules"
                    || rel == Path::new("tests/data");
                if !skip {
                    stack.push(path);
                }
            } else if exts.iter().any(|e| name.ends_with(e)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn no_file_names_a_tracker_issue() {
    let re = Regex::new(r"(?-u:\b)[Ii]ssues? #?[0-9]+(?-u:\b)|(?-u:\b)item [0-9]+ of issue")
        .expect("a valid pattern");
    let mut found = Vec::new();
    for f in files(&[".rs", ".md", ".c", ".h", ".py", ".sh", ".toml"]) {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(m) = re.find(line) {
                found.push(format!("{}:{}: {}", rel(&f), n + 1, m.as_str()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "name the behaviour instead of the tracker:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_relative_link_in_the_docs_reaches_a_file() {
    let link = Regex::new(r"\]\(([^)# \t\n]+)(?:#[^)]*)?\)").expect("a valid pattern");
    let mut broken = Vec::new();
    let mut links = 0;
    for f in files(&[".md"]) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for c in link.captures_iter(&text) {
            let target = &c[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            links += 1;
            let dir = f.parent().unwrap_or(Path::new("."));
            if !dir.join(target).exists() {
                broken.push(format!("{}: {target}", rel(&f)));
            }
        }
    }
    assert!(links > 10, "only {links} links read: is the pattern right?");
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}

#[test]
fn readme_and_benchmarks_stay_short() {
    for (file, max) in [("README.md", 250), ("BENCHMARKS.md", 400)] {
        let text = std::fs::read_to_string(root().join(file)).expect("the file");
        let lines = text.lines().count();
        assert!(
            lines <= max,
            "{file} has {lines} lines, more than {max}: move a manual to docs/"
        );
    }
}

#[test]
fn the_readme_quick_start_is_exactly_two_commands() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let start = text.find("## Quick start").expect("a Quick start section");
    let block = text[start..]
        .split("```")
        .nth(1)
        .expect("a code block in Quick start");
    let commands: Vec<&str> = block
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo build --release && ./target/release/cushim demo",
            "cargo test --workspace"
        ]
    );
    let ci = std::fs::read_to_string(root().join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == commands[1]),
        ".ci/run must run exactly the README's test command"
    );
}
