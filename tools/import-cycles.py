#!/usr/bin/env python3
"""Import circles between the files of each workspace crate (issue 27).

An edge A -> B means a file of module A names module B through a
`crate::`, `super::` or `self::` path outside comments and `mod tests`
(an edge to an enclosing module does not count: a child naming its parent
is the module tree, not a circle). Prints each strongly connected set of
two or more modules; exits 1 when one is found in a crate not named with
--allow (circles known and not yet broken).

Usage: tools/import-cycles.py [--allow CRATE]... [ROOT]
"""
import argparse
import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")


def crates(root):
    for base in ("crates", "tools"):
        d = os.path.join(root, base)
        for name in sorted(os.listdir(d)):
            src = os.path.join(d, name, "src")
            if os.path.isdir(src):
                yield name, src


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def code(path):
    text = open(path, encoding="utf-8").read()
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    return re.sub(r"//[^\n]*", "", text)


def edges_of(src):
    files = {}
    for dirpath, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(dirpath, n)
                files[module_of(src, p)] = p
    edges = {m: set() for m in files}
    for m, path in files.items():
        is_dir = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
        for hit in PATH.finditer(code(path)):
            kind, parts = hit.group(1), hit.group(2).split("::")[1:]
            if kind == "crate":
                base = ()
            elif kind == "self":
                base = m
            else:
                base = (m if is_dir else m[:-1])[:-1]
                while parts and parts[0] == "super":
                    base, parts = base[:-1], parts[1:]
            target, best = base, None
            for p in parts:
                target = target + (p,)
                if target in files:
                    best = target
            if best and best != m and m[: len(best)] != best:
                edges[m].add(best)
    return edges


def circles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
            if len(comp) > 1:
                out.append(sorted("/".join(x) or "lib" for x in comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allow", action="append", default=[], help="a crate whose circles are known")
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    a = ap.parse_args()
    bad = 0
    for name, src in crates(a.root):
        for c in circles(edges_of(src)):
            known = name in a.allow
            print(f"{name}: {' <-> '.join(c)}{' (known)' if known else ''}")
            bad += 0 if known else 1
    print(f"import-cycles: {bad} circle(s) outside the allowed crates")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
