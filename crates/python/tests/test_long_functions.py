"""tools/long-functions.py, the check `.ci/run` makes that no Python
function outside tests runs over 100 lines (issue 27), on a small tree:
it names a 101-line function, with its file and line, passes one of
exactly 100, and leaves tests/ folders alone."""

from __future__ import annotations

import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools", "long-functions.py")


def function(name: str, lines: int) -> str:
    """A function whose definition spans ``lines`` lines."""
    return f"def {name}():\n" + "    x = 0\n" * (lines - 2) + "    return x\n"


def run(root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOOL, str(root)], capture_output=True, text=True, timeout=60)


def test_a_function_over_100_lines_fails_and_is_named(tmp_path):
    pkg = tmp_path / "crates" / "demo"
    (pkg / "tests").mkdir(parents=True)
    (tmp_path / "tools").mkdir()
    (pkg / "ok.py").write_text(function("exactly_100", 100))
    (pkg / "long.py").write_text("\n\nclass C:\n" + "".join("    " + line + "\n" for line in function("method", 101).splitlines()))
    (pkg / "tests" / "test_x.py").write_text(function("long_test", 300))
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines() == [os.path.join("crates", "demo", "long.py") + ":4: C.method: 101 lines"]

    (pkg / "long.py").unlink()
    p = run(tmp_path)
    assert (p.returncode, p.stdout) == (0, ""), p.stdout + p.stderr
