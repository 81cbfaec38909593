#!/usr/bin/env python3
"""Import circles in a crate: which modules reach each other through module paths.

usage: scripts/import-circles.py SRC_DIR [--folders] [--edges]

Reads every `.rs` file under SRC_DIR, maps each module path it names (`crate::a::b`,
`super::a`, `super::super::a`, `self::a`; in `use` lines, `use` groups over several lines, and
paths written inline) to the longest module of the crate that path starts with, and prints
each strongly connected group of more than one module (modules that import each other,
directly or round a circle). `super::` and `self::` resolve from the module they are written
in, counting inline `mod name { ... }` blocks (so `use super::*` in a file's `mod tests` names
the file itself, not its parent). With --folders, the same over the top-level folders of
SRC_DIR (a file at the top is its own folder). With --edges, each circle is followed by the
imports inside it (`a -> b`), to show what to cut. Exits 1 when there is a circle.
`#[cfg(test)]` code counts like any other. Not followed: a bare path naming a child module
(`records::X` in its parent), which never imports back up, and paths built by macros.
"""
import os
import re
import sys


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main") and len(rel) == 1:
        return ()
    if rel[-1] == "mod":
        rel = rel[:-1]
    return tuple(rel)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def expand(group):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (enough for use trees)."""
    group = group.strip()
    m = re.match(r"^([\w:]*?)(?:::)?\{(.*)\}$", group, flags=re.S)
    if not m:
        return [group]
    prefix, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        if not p:
            continue
        for e in expand(p):
            out.append(prefix + "::" + e if prefix else e)
    return out


def inline_mods(text):
    """[(start, end, name)] of each inline `mod name { ... }` block (braces matched)."""
    out = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        out.append((m.end(), i, m.group(1)))
    return out


def refs(text, module):
    """Absolute module paths (tuples) named in `text`, the source of `module`."""
    text = strip_comments(text)
    blocks = inline_mods(text)
    found = []
    pattern = r"(?<![\w:])((?:crate|self|super)::(?:\{[^;]*\}|[\w:]+(?:::\{[^;]*\})?))"
    for m in re.finditer(pattern, text, flags=re.S):
        # The module this path is written in: the file's, plus the inline blocks around it.
        here = list(module)
        for start, end, name in sorted(blocks):
            if start <= m.start() < end:
                here.append(name)
        for path in expand(m.group(1)):
            path = re.split(r"\s+as\s+", path)[0].strip()
            segs = [s for s in path.split("::") if s]
            if not segs:
                continue
            if segs[0] == "crate":
                base, segs = [], segs[1:]
            else:
                base = list(here)
                while segs and segs[0] in ("self", "super"):
                    if segs[0] == "super":
                        if not base:
                            break
                        base.pop()
                    segs = segs[1:]
            segs = [s for s in segs if s not in ("self", "*")]
            found.append(tuple(base + segs))
    return found


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    folders = "--folders" in sys.argv[2:]
    show_edges = "--edges" in sys.argv[2:]
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(d, n)
                files[module_of(root, p)] = p
    mods = set(files)
    graph = {}
    for mod, path in files.items():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for r in refs(text, mod):
            target = None
            for k in range(len(r), 0, -1):
                if r[:k] in mods:
                    target = r[:k]
                    break
            if target is None or target == ():
                continue
            a, b = mod, target
            if folders:
                a, b = a[:1], b[:1]
            # A module naming its own descendants (a folder's mod.rs) is not an import back.
            if a == b or (not folders and b[: len(a)] == a):
                continue
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    circles = sccs(graph)
    def name(m):
        return "::".join(m) or "crate"

    for c in circles:
        print("circle: " + " <-> ".join(sorted(name(m) for m in c)))
        if show_edges:
            inside = set(c)
            for a in sorted(inside):
                for b in sorted(graph.get(a, ()) & inside):
                    print(f"  {name(a)} -> {name(b)}")
    if not circles:
        print(f"no import circle among {len(graph)} {'folders' if folders else 'modules'}")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
