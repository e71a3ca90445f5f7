"""The README's Python example runs as written."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def python_blocks():
    text = README.read_text()
    section = text.split("## Use from Python", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_has_a_python_example():
    assert len(python_blocks()) >= 1


def test_readme_python_example_runs():
    for code in python_blocks():
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
