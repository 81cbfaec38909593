//! Live bytes per allocation site, flat (one row per site) or as a top-down tree.
//!
//! Invariant: rows are sorted by bytes descending, then by name, so output is stable; a
//! block allocated before the trace began is marked so (its site is the best stack known,
//! see `timeline`).

use crate::analyze::frames::{describe, describe_function, program_frames, site};
use crate::analyze::model::Stacks;
use crate::analyze::timeline::Live;
use std::collections::HashMap;

/// One site's live blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteRow {
    pub site: String,
    pub bytes: u64,
    pub count: u64,
}

fn label(stacks: &Stacks, l: &Live, depth: usize) -> String {
    let s = site(stacks, l.stack, depth);
    if l.before_trace {
        format!("{s} [live before the trace began]")
    } else {
        s
    }
}

/// Group `blocks` by site (first program frame and `depth - 1` callers).
pub fn by_site<'a>(
    stacks: &Stacks,
    blocks: impl Iterator<Item = &'a Live>,
    depth: usize,
) -> Vec<SiteRow> {
    // Many blocks share a stack: name each (stack, before) once.
    let mut names: HashMap<(u32, bool), String> = HashMap::new();
    let mut acc: HashMap<String, (u64, u64)> = HashMap::new();
    for l in blocks {
        let name = names
            .entry((l.stack, l.before_trace))
            .or_insert_with(|| label(stacks, l, depth));
        let e = acc.entry(name.clone()).or_default();
        e.0 = e.0.saturating_add(l.size);
        e.1 += 1;
    }
    let mut rows: Vec<SiteRow> = acc
        .into_iter()
        .map(|(site, (bytes, count))| SiteRow { site, bytes, count })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    rows
}

/// A node of the top-down tree: a frame, the bytes live below it, its callees.
#[derive(Debug, Clone, Default)]
pub struct Node {
    pub frame: String,
    pub bytes: u64,
    pub children: Vec<Node>,
    /// The source lines merged into this node (a tree by function, [`tree_by_function`]).
    pub lines: Vec<i64>,
}

/// The top-down tree of `blocks`: outermost program frame at the root, `depth` levels,
/// one node per calling line.
pub fn tree<'a>(stacks: &Stacks, blocks: impl Iterator<Item = &'a Live>, depth: usize) -> Node {
    tree_keyed(stacks, blocks, depth, false)
}

/// The top-down tree of `blocks` with one node per function (`name (file)`), the lines
/// it was called from merged into it (`lines`): a flame graph's shape.
pub fn tree_by_function<'a>(
    stacks: &Stacks,
    blocks: impl Iterator<Item = &'a Live>,
    depth: usize,
) -> Node {
    tree_keyed(stacks, blocks, depth, true)
}

fn tree_keyed<'a>(
    stacks: &Stacks,
    blocks: impl Iterator<Item = &'a Live>,
    depth: usize,
    by_function: bool,
) -> Node {
    let mut per_stack: HashMap<u32, u64> = HashMap::new();
    for l in blocks {
        *per_stack.entry(l.stack).or_default() += l.size;
    }
    let mut root = Node {
        frame: "all".into(),
        ..Default::default()
    };
    for (stack, bytes) in per_stack {
        root.bytes += bytes;
        let frames = program_frames(stacks, stack);
        let mut path: Vec<(String, i64)> = frames
            .iter()
            .rev()
            .map(|f| {
                let key = if by_function {
                    describe_function(f)
                } else {
                    describe(f)
                };
                (key, f.line)
            })
            .collect();
        if path.is_empty() {
            path.push(("<no stack>".into(), 0));
        }
        let mut node = &mut root;
        for (f, line) in path.into_iter().take(depth.max(1)) {
            let i = match node.children.iter().position(|c| c.frame == f) {
                Some(i) => i,
                None => {
                    node.children.push(Node {
                        frame: f,
                        ..Default::default()
                    });
                    node.children.len() - 1
                }
            };
            node = &mut node.children[i];
            node.bytes += bytes;
            if by_function && !node.lines.contains(&line) {
                node.lines.push(line);
            }
        }
    }
    sort(&mut root);
    root
}

fn sort(n: &mut Node) {
    n.lines.sort_unstable();
    n.children
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.frame.cmp(&b.frame)));
    n.children.iter_mut().for_each(sort);
}
