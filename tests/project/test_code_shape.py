"""The shape of the code: no file over 500 lines, no function over 80, and no public name defined
in two modules of the packages (one meaning per name: `from clarifyjax... import X` is always the
same X). Read from the source, as tests/project/test_layering.py reads the imports."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from helpers.env import REPO_ROOT

TREES = ("clarifyjax", "sage_jax", "tests", "benchmarks", "launch")
PACKAGES = ("clarifyjax", "sage_jax")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
# A command module's `python -m` entry point is `main` by convention (cli, demo, dryrun, sage's cli).
SHARED_BY_CONVENTION = {"main"}


def python_files(trees=TREES) -> list[Path]:
    return sorted(p for t in trees for p in (REPO_ROOT / t).rglob("*.py"))


def long_functions(path: Path, root: Path = REPO_ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def public_definitions(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_no_file_over_500_lines():
    long = [f"{p.relative_to(REPO_ROOT)} ({n} lines)" for p in python_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long, long


def test_no_function_over_80_lines():
    long = [f for p in python_files() for f in long_functions(p)]
    assert not long, long


def test_no_public_name_defined_in_two_modules():
    where = defaultdict(list)
    for p in python_files(PACKAGES):
        for name in public_definitions(p) - SHARED_BY_CONVENTION:
            where[name].append(str(p.relative_to(REPO_ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, twice


def test_the_checks_see_what_they_should(tmp_path):
    """The rules themselves: an 81-line function and a name defined twice are found."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n" + "    x = 1\n" * 80 + "\n\ndef g():\n" + "    x = 1\n" * 79
                 + "\nX = 1\nclass _P: ...\n")
    assert long_functions(f, tmp_path) == ["m.py:1 f (81 lines)"]
    assert public_definitions(f) == {"f", "g", "X"}
