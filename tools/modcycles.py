#!/usr/bin/env python3
"""Import cycles between the modules of a Rust crate, read from its source text.

    python3 tools/modcycles.py [SRC_DIR] [--depth 1|2]

SRC_DIR defaults to ./src. A module is a top-level file or folder of SRC_DIR (depth 1), or a file
inside one of those folders (depth 2, cycles among siblings such as api/auth.rs <-> api/delegations.rs).
Edges come from `crate::a::b` paths (in `use` lines, grouped `use crate::{a, b}` and inline paths) and,
at depth 2, from `super::x` too. Code inside `#[cfg(test)]` items and comments is ignored.
Prints each cycle (a strongly connected group) with one source line per edge; exit status 1 when
there is any, 0 when the graph only points one way.
"""
import os, re, sys
from collections import defaultdict

def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)

def drop_test_items(text):
    """Blank out the item that follows each #[cfg(test)] (brace-matched), keeping line numbers."""
    out, i = list(text), 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        j = text.find("{", m.end())
        semi = text.find(";", m.end())
        if j < 0 or (0 <= semi < j):
            continue  # `#[cfg(test)] mod x;` : the file itself is a test module
        depth, k = 0, j
        while k < len(text):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                break
            k += 1
        for p in range(m.start(), min(k + 1, len(text))):
            if out[p] != "\n":
                out[p] = " "
    return "".join(out)

def test_files(src):
    """Files declared as `#[cfg(test)] mod x;` are test code."""
    found = set()
    for dp, _, fs in os.walk(src):
        for f in fs:
            if f.endswith(".rs"):
                t = open(os.path.join(dp, f), encoding="utf-8", errors="replace").read()
                for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", t):
                    base = dp if f in ("mod.rs", "lib.rs", "main.rs") else os.path.join(dp, f[:-3])
                    found.add(os.path.join(base, m.group(1) + ".rs"))
                    found.add(os.path.join(base, m.group(1), "mod.rs"))
    return found

def module_of(src, path, depth):
    parts = os.path.relpath(path, src).split(os.sep)
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "mod":
        parts = parts[:-1]
    return "::".join(parts[:depth]) if parts else ""

def paths_in(line):
    for m in re.finditer(r"\bcrate::\{([^}]*)\}", line):
        for item in m.group(1).split(","):
            yield [s for s in item.strip().split("::") if s]
    for m in re.finditer(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", line):
        yield m.group(1).split("::")

def sccs(nodes, adj):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out

def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    depth = 2 if "--depth" in sys.argv and sys.argv[sys.argv.index("--depth") + 1] == "2" else 1
    args = [a for a in args if a not in ("1", "2")]
    src = os.path.abspath(args[0] if args else "src")
    tests = test_files(src)
    edges = defaultdict(lambda: defaultdict(list))
    nodes = set()
    for dp, _, fs in os.walk(src):
        for f in sorted(fs):
            p = os.path.join(dp, f)
            if not f.endswith(".rs") or p in tests or f.endswith("_tests.rs") or f in ("main.rs", "lib.rs") and dp == src:
                continue
            a = module_of(src, p, depth)
            nodes.add(a)
            text = drop_test_items(strip_comments(open(p, encoding="utf-8", errors="replace").read()))
            here = os.path.relpath(p, os.path.dirname(src))
            for no, line in enumerate(text.split("\n"), 1):
                targets = [parts[:depth] for parts in paths_in(line)]
                if depth == 2:
                    parent = a.split("::")[0]
                    for m in re.finditer(r"\bsuper::([a-z_][a-z0-9_]*)", line):
                        if "::" in a:
                            targets.append([parent, m.group(1)])
                for t in targets:
                    b = "::".join(t)
                    if b and b != a and not a.startswith(b + "::") and not b.startswith(a + "::"):
                        if os.path.exists(os.path.join(src, *t) + ".rs") or os.path.isdir(os.path.join(src, *t)):
                            edges[a][b].append(f"{here}:{no}")
    adj = {a: set(bs) for a, bs in edges.items()}
    cycles = [c for c in sccs(nodes | set(adj), adj) if len(c) > 1]
    if not cycles:
        print(f"no import cycles among the {len(nodes)} modules of {os.path.relpath(src)} (depth {depth})")
        return 0
    for c in cycles:
        print(f"cycle of {len(c)} modules: {', '.join(c)}")
        members = set(c)
        for a in c:
            for b in sorted(edges[a]):
                if b in members:
                    locs = edges[a][b]
                    print(f"  {a} -> {b}  ({len(locs)}: {', '.join(locs[:3])}{' ...' if len(locs) > 3 else ''})")
    print(f"{len(cycles)} cycle(s)")
    return 1

if __name__ == "__main__":
    sys.exit(main())
