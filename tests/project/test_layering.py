"""The packages' one-way dependency rule (docs/architecture.md, "Layers"), read from the source.

Each subpackage of clarifyjax/ (and sage_jax's three parts) is one unit of the table below, lowest
first. A module may import modules of its own unit and of units below it, never of a unit above.
There are no per-module exceptions. Imports inside functions count too: a lazy import is still a
dependency. On top of the layers, no module depends on itself through others (no import cycle,
lazy imports included), no module imports another's private names, and the pure-math modules use
jax, optax and numpy only (and one another), so that research code can paste them.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers.env import REPO_ROOT

PACKAGES = ("clarifyjax", "sage_jax")

# Lowest first: the units, each a subpackage (or sage_jax's top-level modules, or a command).
LAYERS: tuple[str, ...] = (
    "clarifyjax.core",        # meshes, multi-host start, buckets, ranges, traces, logging, registry, CPU kernels
    "clarifyjax.files",       # a user's files: text, tables, chunks, child results
    "clarifyjax.models",      # T5, encoders, DeBERTa, causal LMs, embedder; checkpoint folders (hf/)
    "clarifyjax.text",        # tokenizers, the models' input formats, the text-generator interface
    "clarifyjax.decoding",    # generate and score, the seq2seq runner, LocalLM
    "clarifyjax.rl",          # PPO math, policy and value functions, value model, rollouts
    "clarifyjax.config",      # run configs: loader, schema, reward sections, score/evaluate configs
    "clarifyjax.data",        # training data: pairs, batches, discriminator rows, situations
    "clarifyjax.reward",      # JSD, judge, NLI filter, the reward pipeline, score-questions
    "clarifyjax.training",    # optimizer, SFT, builders, programs, loops, dry run, checkpoints
    "clarifyjax.evaluation",  # evaluate, baselines, metrics, report, QA metric, BERTScore
    "clarifyjax.serve",       # HTTP plumbing, the OpenAI-compatible server, batch generation
    "clarifyjax.app",         # the clarifier, ask, interact, web
    "sage_jax",               # SaGE: the metric, data, lexical baselines, ParaScore, scoring
    "sage_jax.run",           # sage-jax run: config, presets, generators, stages, pipeline, report, library
    "sage_jax.experiments",   # sage-jax experiment: the SaGE paper's experiments, their statistics
    "sage_jax.harness_tasks",  # lm-evaluation-harness tasks: sage_moral (YAML, hooks, scoring per question)
    "sage_jax.cli",           # sage-jax score / run
    "clarifyjax",             # the clarifyjax command (cli, __main__) and make demo (demo)
)

# Arrays in, arrays out: research code pastes these (jax, optax and numpy only, and each other).
PURE_MATH = ("clarifyjax.rl.ppo", "clarifyjax.rl.ppo_math", "clarifyjax.rl.algorithms",
             "clarifyjax.reward.jsd",
             "clarifyjax.evaluation.answer_spans", "sage_jax.metric")
PURE_MATH_IMPORTS = {"jax", "optax", "numpy", "math", "typing", "dataclasses", "functools",
                     "__future__", "collections", "enum"}


# A package whose `__init__` re-exports from above its own unit ranks that `__init__` there:
# `sage_jax.score` is the reference library's function, which runs the pipeline (sage_jax.run).
FACADES = {"sage_jax": "sage_jax.run"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO_ROOT / pkg).rglob("*.py"))}


def unit_of(module: str) -> str:
    """The longest unit of LAYERS that is `module` or a package above it (a facade: its rank)."""
    if module in FACADES:
        return FACADES[module]
    units = [u for u in LAYERS if module == u or module.startswith(u + ".")]
    return max(units, key=len)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every module `path` imports, at any depth of the file (`from pkg import sub` is pkg.sub
    when that is one of `known`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                         else node.module for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    """module -> the package modules it imports."""
    modules = all_modules()
    return {name: {t for t in imports_of(path, set(modules)) if t in modules and t != name}
            for name, path in modules.items()}


def violations(edges: dict[str, set[str]] | None = None) -> set[tuple[str, str]]:
    rank = {u: i for i, u in enumerate(LAYERS)}
    return {(a, b) for a, targets in (edges or graph()).items() for b in targets
            if rank[unit_of(b)] > rank[unit_of(a)]}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_unit_and_every_unit_exists():
    modules = set(all_modules())
    for unit in LAYERS:
        assert unit in modules, f"LAYERS names a unit that does not exist: {unit}"
    # every module falls in a unit (unit_of raises on none), and every subpackage is a unit
    packages = {module_name(p.parent / "__init__.py") for pkg in PACKAGES
                for p in (REPO_ROOT / pkg).rglob("__init__.py")}
    units = {unit_of(m) for m in modules}
    nested = {"clarifyjax.models.hf"}  # the checkpoint maps, inside the models unit
    assert packages - nested <= set(LAYERS), f"make these units: {sorted(packages - set(LAYERS))}"
    assert units == set(LAYERS)


def test_imports_point_down():
    wrong = sorted(violations())
    assert not wrong, "imports against the layering:\n  " + "\n  ".join(
        f"{a} ({unit_of(a)}) imports {b} ({unit_of(b)})" for a, b in wrong)


def test_the_rule_catches_an_upward_import():
    """The checks themselves: a model importing the reward pipeline, and a cycle, are reported."""
    real = graph()
    fake = {**real, "clarifyjax.models.t5": real["clarifyjax.models.t5"] | {"clarifyjax.reward.pipeline"}}
    assert violations(fake) - violations(real) == {("clarifyjax.models.t5", "clarifyjax.reward.pipeline")}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_lazy_imports_included():
    found = cycles(graph())
    assert not found, "import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in found)


def test_only_the_commands_import_sage_jax():
    users = sorted(a for a, targets in graph().items() if a.startswith("clarifyjax")
                   and any(t.startswith("sage_jax") for t in targets))
    assert users == ["clarifyjax.demo"], users


@pytest.mark.parametrize("name", PURE_MATH)
def test_pure_math_imports_jax_optax_numpy_only(name):
    modules = all_modules()
    imported = {m.split(".")[0] for m in imports_of(modules[name], set(modules))
                if m not in PURE_MATH}  # another pure-math module is pasted along with it
    assert imported <= PURE_MATH_IMPORTS, sorted(imported - PURE_MATH_IMPORTS)


def private_uses(path: Path, modules: dict[str, Path]) -> list[str]:
    """`from m import _x` and `alias._x` where m / alias is another module of the packages."""
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    uses.append(f"from {node.module} import {a.name}")
                if f"{node.module}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            uses.append(f"{aliases[node.value.id]}.{node.attr}")
    return uses


def test_no_module_uses_a_private_name_of_another():
    modules = all_modules()
    wrong = {name: uses for name, path in modules.items() if (uses := private_uses(path, modules))}
    assert not wrong, wrong


def test_the_packages_never_reach_into_launch_or_tests():
    for name, path in all_modules().items():
        tree = ast.parse(path.read_text())
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str)}
        assert not strings & {"launch", "tests"}, f"{name} builds a path into launch/ or tests/"
        imported = {m.split(".")[0] for m in imports_of(path, set())}
        assert not imported & {"launch", "tests", "helpers", "conftest", "benchmarks"}, \
            f"{name} imports test or launch code: {sorted(imported)}"
