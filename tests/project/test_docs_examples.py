"""The API reference's examples run: every docstring example of the pure-math modules runs with
doctest, every public function and class of those modules has one, and the site (mkdocs.yml and
docs/api/) names every module of the reference. No site build here: `make docs` builds it."""
from __future__ import annotations

import ast
import doctest
import importlib
import io
import re
import sys
from pathlib import Path

import pytest
import yaml

from helpers.env import REPO_ROOT

# The modules research code imports for their math alone: each public name shows a runnable example.
PURE_MATH = ("clarifyjax.rl.ppo_math", "clarifyjax.reward.jsd", "sage_jax.metric",
             "clarifyjax.evaluation.answer_spans")
# Every module with a page of the API reference (docs/api/*.md, `::: module`).
API_MODULES = (*PURE_MATH, "clarifyjax.rl.ppo", "clarifyjax.models.hf", "clarifyjax.decoding",
               "sage_jax.run.library", "clarifyjax.config")
# The guide's pages the site carries beside the reference.
GUIDE_PAGES = ("usage.md", "architecture.md", "fidelity.md", "reliability.md", "ppo.md")
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def module_path(name: str) -> Path:
    return REPO_ROOT / (name.replace(".", "/") + ".py")


def docstrings(path: Path) -> dict[str, tuple[str | None, int]]:
    """qualified name -> (docstring or None, line) of every function and class of the module,
    methods included."""
    found = {}

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[prefix + node.name] = (ast.get_docstring(node, clean=True), node.lineno)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(path.read_text(), str(path)).body, "")
    return found


def without_example(path: Path) -> list[str]:
    """The public top-level functions and classes whose docstring shows no `>>>` example."""
    return [name for name, (doc, _) in docstrings(path).items()
            if "." not in name and not name.startswith("_") and ">>>" not in (doc or "")]


def run_examples(module_name: str, path: Path) -> tuple[int, int, str]:
    """(examples run, failures, doctest's report) of every docstring of the module, each run in a
    copy of the module's namespace (its imports: `jnp`, `np`), as a reader on its page would."""
    module = importlib.import_module(module_name)
    parser, out = doctest.DocTestParser(), io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for name, (doc, line) in docstrings(path).items():
        if doc and ">>>" in doc:
            test = parser.get_doctest(doc, dict(vars(module)), f"{module_name}.{name}", str(path), line)
            runner.run(test, out=out.write)
    result = runner.summarize(verbose=False)
    return result.attempted, result.failed, out.getvalue()


@pytest.mark.parametrize("module_name", PURE_MATH)
def test_every_public_name_has_an_example_that_runs(module_name):
    path = module_path(module_name)
    missing = without_example(path)
    assert not missing, f"{path.relative_to(REPO_ROOT)}: add a `>>>` example to {missing}"
    attempted, failed, report = run_examples(module_name, path)
    assert attempted > 0 and not failed, report


def test_the_example_checks_see_what_they_should(tmp_path, monkeypatch):
    """A public name without an example is named; a wrong expected output is a failure."""
    (tmp_path / "shown.py").write_text(
        'def f(x):\n    """Twice.\n\n    Examples:\n      >>> f(2)\n      5"""\n    return 2 * x\n\n\n'
        'class C:\n    """No example."""\n\n\ndef _private():\n    pass\n')
    assert without_example(tmp_path / "shown.py") == ["C"]
    monkeypatch.syspath_prepend(tmp_path)
    try:
        attempted, failed, report = run_examples("shown", tmp_path / "shown.py")
    finally:
        sys.modules.pop("shown", None)
    assert (attempted, failed) == (1, 1) and "Expected:\n    5\nGot:\n    4" in report


def nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return [p for item in nav for p in nav_pages(item)]


def test_the_site_names_every_module_of_the_reference():
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())
    docs = REPO_ROOT / config["docs_dir"]
    pages = nav_pages(config["nav"])
    assert set(GUIDE_PAGES) <= set(pages), f"mkdocs.yml's nav lacks {set(GUIDE_PAGES) - set(pages)}"
    missing_files = [p for p in pages if not (docs / p).is_file()]
    assert not missing_files, f"mkdocs.yml's nav names pages that do not exist: {missing_files}"
    shown = {m for p in pages if p.startswith("api/")
             for m in re.findall(r"^::: ([\w.]+)", (docs / p).read_text(), re.MULTILINE)}
    assert set(API_MODULES) <= shown, f"no API page (`::: module` in the nav's api/ pages) for " \
                                      f"{sorted(set(API_MODULES) - shown)}"
