#!/usr/bin/env python3
"""Python functions over 100 lines outside tests (issue 27).

Walks the Python files under crates/ and tools/ (skipping `tests/`
folders, `test_*.py`, virtual environments, `target/` and hidden folders)
and prints every function or method whose definition, decorators
included, spans more than --max lines (default 100), longest first;
a nested function counts on its own and inside its parent. Exits 1 when
one is found.

Usage: tools/long-functions.py [--max N] [ROOT]
"""
import argparse
import ast
import os
import sys

SKIP_DIRS = {"tests", "target", "node_modules", "__pycache__", "venv", ".venv"}


def python_files(root):
    for base in ("crates", "tools"):
        top = os.path.join(root, base)
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith(".") and not x.endswith("venv"))
            for name in sorted(files):
                if name.endswith(".py") and not name.startswith("test_") and name != "conftest.py":
                    yield os.path.join(d, name)


def functions(tree):
    """(qualified name, first line, lines) of every function in ``tree``."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                name = prefix + child.name
                out.append((name, first, child.end_lineno - first + 1))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=100, help="longest allowed function, lines")
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    a = ap.parse_args()
    root = os.path.realpath(a.root)
    long = []
    for path in python_files(root):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        for name, line, n in functions(tree):
            if n > a.max:
                long.append((n, os.path.relpath(path, root), line, name))
    for n, path, line, name in sorted(long, key=lambda x: (-x[0], x[1], x[2])):
        print(f"{path}:{line}: {name}: {n} lines")
    if long:
        print(f"{len(long)} function(s) over {a.max} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
