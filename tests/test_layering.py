"""The packages' one-way dependency rule (docs/architecture.md, "Layers"), read from the source.

Every module of clarifyjax/ and sage_jax/ is placed in a layer below. A module may import modules
of lower layers, and of its own layer only where SAME_LAYER names the pair; never anything above
it. Imports inside functions count too: a lazy import is still a dependency. A new module must be
placed here, so the rule cannot erode unnoticed.

There are no exceptions: any import against the rule fails.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO_ROOT

PACKAGES = ("clarifyjax", "sage_jax")

# Lowest first.
LAYERS: dict[str, tuple[str, ...]] = {
    # Import nothing of the packages: anyone may import them.
    "foundation": ("clarifyjax", "clarifyjax.models", "clarifyjax.core.sharding",
                   "clarifyjax.core.distributed", "clarifyjax.text.formats", "clarifyjax.core.metrics_log",
                   "clarifyjax.training.optim", "clarifyjax.core.buckets", "clarifyjax.core.ranges", "clarifyjax.core.traces",
                   "clarifyjax.files.textfiles"),
    # Arrays in, arrays out: jax, optax and numpy only (research code pastes these).
    "pure math": ("clarifyjax.rl.ppo", "clarifyjax.reward.jsd", "clarifyjax.evaluation.answer_spans",
                  "sage_jax.metric"),
    # Models: jax, flax, numpy, their own files and the foundation.
    "models": ("clarifyjax.models.safetensors_io", "clarifyjax.models.t5_layers",
               "clarifyjax.models.t5", "clarifyjax.models.encoder",
               "clarifyjax.models.hf.encoder_map", "clarifyjax.models.hf.t5_map",
               "clarifyjax.models.hf", "clarifyjax.models.causal_lm",
               "clarifyjax.models.hf.causal_lm_map",
               "clarifyjax.models.deberta", "clarifyjax.models.hf.deberta_map",
               "clarifyjax.models.tiny", "clarifyjax.models.value", "clarifyjax.models.state"),
    # Building blocks over the models: configs, tokenizers, decoding, files, data formats.
    "building blocks": ("clarifyjax.files.tables", "clarifyjax.config.loader", "clarifyjax.config.model_config", "clarifyjax.config",
                        "clarifyjax.text.tokenizer", "clarifyjax.decoding",
                        "clarifyjax.files.child_result", "clarifyjax.files.chunkstore", "sage_jax.lexical",
                        "clarifyjax.text.generator", "clarifyjax.serve.http_server", "clarifyjax.data.discriminator",
                        "clarifyjax.evaluation.bertscore", "sage_jax.run.prompts"),
    # Components: the models' roles (seq2seq, judge, NLI filter, rollouts, SFT step), data,
    # checkpoints, the reward settings of score-questions.
    "components": ("clarifyjax.data", "clarifyjax.data.situations", "clarifyjax.config.score",
                   "clarifyjax.decoding.seq2seq", "clarifyjax.reward.judge", "clarifyjax.reward.nli", "clarifyjax.rl.policy",
                   "clarifyjax.rl.rollout", "clarifyjax.training.sft", "clarifyjax.training.checkpointing",
                   "clarifyjax.training.run_record", "clarifyjax.decoding.local_lm", "clarifyjax.serve.openai_api",
                   "clarifyjax.config.evaluate", "clarifyjax.evaluation.metrics",
                   "clarifyjax.evaluation.stage_cache", "clarifyjax.evaluation.report", "clarifyjax.evaluation.qa_metric",
                   "sage_jax.data", "clarifyjax.models.embedder", "sage_jax.report", "sage_jax.parascore",
                   "sage_jax.run.generators", "sage_jax.run.config", "sage_jax.run.stages"),
    # Pipelines: the composed reward, the training programs and loops, the dry run.
    "pipelines": ("clarifyjax.reward.pipeline", "clarifyjax.training.memory_plan", "clarifyjax.training.programs",
                  "clarifyjax.training.loops", "clarifyjax.training.dryrun", "sage_jax", "clarifyjax.serve.batch_job",
                  "clarifyjax.app.clarifier", "clarifyjax.app.options", "clarifyjax.evaluation.baselines",
                  "clarifyjax.evaluation.evaluate", "sage_jax.scoring", "sage_jax.run.pipeline",
                  "sage_jax.run.report"),
    # Commands: nothing imports them (but the demo, which runs the others).
    "commands": ("clarifyjax.cli", "clarifyjax.__main__", "clarifyjax.demo", "sage_jax.cli",
                 "clarifyjax.app.ask", "clarifyjax.app.interact", "clarifyjax.app.web"),
}

# Same-layer imports that are part of the design (importer, imported).
SAME_LAYER: set[tuple[str, str]] = {
    ("clarifyjax.models.t5", "clarifyjax.models.t5_layers"),
    ("clarifyjax.models.hf", "clarifyjax.models.t5"),
    ("clarifyjax.models.hf", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.hf", "clarifyjax.models.encoder"),
    ("clarifyjax.models.hf", "clarifyjax.models.hf.encoder_map"),
    ("clarifyjax.models.hf", "clarifyjax.models.hf.t5_map"),
    ("clarifyjax.models.hf", "clarifyjax.models.causal_lm"),
    ("clarifyjax.models.t5", "clarifyjax.models.state"),
    ("clarifyjax.models.causal_lm", "clarifyjax.models.state"),
    ("clarifyjax.models.hf", "clarifyjax.models.hf.causal_lm_map"),
    ("clarifyjax.models.hf.causal_lm_map", "clarifyjax.models.causal_lm"),
    ("clarifyjax.models.hf.causal_lm_map", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.hf.t5_map", "clarifyjax.models.t5"),
    ("clarifyjax.models.hf.t5_map", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.encoder", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.hf.encoder_map", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.hf.encoder_map", "clarifyjax.models.encoder"),
    ("clarifyjax.models.deberta", "clarifyjax.models.encoder"),
    ("clarifyjax.models.hf.deberta_map", "clarifyjax.models.deberta"),
    ("clarifyjax.models.hf.deberta_map", "clarifyjax.models.encoder"),
    ("clarifyjax.models.hf.deberta_map", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.hf.deberta_map", "clarifyjax.models.hf.t5_map"),
    ("clarifyjax.models.hf", "clarifyjax.models.deberta"),
    ("clarifyjax.models.hf", "clarifyjax.models.hf.deberta_map"),
    ("clarifyjax.config.model_config", "clarifyjax.config.loader"),
    ("clarifyjax.config", "clarifyjax.config.loader"),
    ("clarifyjax.config", "clarifyjax.config.model_config"),
    ("clarifyjax.data.situations", "clarifyjax.data"),
    ("clarifyjax.data.discriminator", "clarifyjax.files.tables"),
    ("clarifyjax.reward.judge", "clarifyjax.decoding.seq2seq"),
    ("clarifyjax.rl.rollout", "clarifyjax.rl.policy"),
    ("clarifyjax.models.value", "clarifyjax.models.t5"),
    ("clarifyjax.models.value", "clarifyjax.models.t5_layers"),
    ("clarifyjax.training.loops", "clarifyjax.training.programs"),
    ("clarifyjax.training.loops", "clarifyjax.reward.pipeline"),
    ("clarifyjax.training.dryrun", "clarifyjax.training.programs"),
    ("clarifyjax.training.dryrun", "clarifyjax.training.memory_plan"),
    ("clarifyjax.__main__", "clarifyjax.cli"),
    ("clarifyjax.evaluation.baselines", "clarifyjax.reward.pipeline"),
    ("clarifyjax.evaluation.report", "clarifyjax.evaluation.metrics"),
    ("clarifyjax.evaluation.evaluate", "clarifyjax.reward.pipeline"),
    ("clarifyjax.evaluation.evaluate", "clarifyjax.evaluation.baselines"),
    ("clarifyjax.demo", "sage_jax.cli"),
    ("clarifyjax.app.clarifier", "clarifyjax.reward.pipeline"),
    ("clarifyjax.app.options", "clarifyjax.app.clarifier"),
    # cli registers the commands that live in their own modules; they use its registry and helpers
    ("clarifyjax.cli", "clarifyjax.app.ask"),
    ("clarifyjax.cli", "clarifyjax.app.interact"),
    ("clarifyjax.cli", "clarifyjax.app.web"),
    ("clarifyjax.app.ask", "clarifyjax.cli"),
    ("clarifyjax.app.interact", "clarifyjax.cli"),
    ("clarifyjax.app.web", "clarifyjax.cli"),
    ("sage_jax.run.pipeline", "sage_jax.run.report"),
    ("sage_jax.run.report", "sage_jax.scoring"),
    ("sage_jax.lexical", "clarifyjax.evaluation.bertscore"),
}


PURE_MATH_IMPORTS = {"jax", "optax", "numpy", "math", "typing", "dataclasses", "functools",
                     "__future__", "collections", "enum"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO_ROOT / pkg).rglob("*.py"))}


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


def violations() -> set[tuple[str, str]]:
    modules = all_modules()
    layer = {m: i for i, names in enumerate(LAYERS.values()) for m in names}
    wrong = set()
    for name, path in modules.items():
        for target in imports_of(path, set(modules)):
            if target.split(".")[0] not in PACKAGES or target == name:
                continue
            if layer[target] > layer[name] or (layer[target] == layer[name]
                                               and (name, target) not in SAME_LAYER):
                wrong.add((name, target))
    return wrong


def test_every_module_is_placed_in_a_layer():
    placed = {m for names in LAYERS.values() for m in names}
    modules = set(all_modules())
    assert not modules - placed, f"place these in LAYERS: {sorted(modules - placed)}"
    assert not placed - modules, f"LAYERS names modules that do not exist: {sorted(placed - modules)}"


def test_imports_point_down():
    layer_name = {m: n for n, names in LAYERS.items() for m in names}
    new = sorted(violations())
    assert not new, "imports against the layering:\n  " + "\n  ".join(
        f"{a} ({layer_name[a]}) imports {b} ({layer_name[b]})" for a, b in new)


def test_same_layer_pairs_exist():
    modules = all_modules()
    stale = sorted(pair for pair in SAME_LAYER
                   if pair[1] not in imports_of(modules[pair[0]], set(modules)))
    assert not stale, f"SAME_LAYER names imports that are gone: {stale}"


@pytest.mark.parametrize("name", LAYERS["pure math"])
def test_pure_math_imports_jax_optax_numpy_only(name):
    imported = {m.split(".")[0] for m in imports_of(all_modules()[name], set())}
    assert imported <= PURE_MATH_IMPORTS, sorted(imported - PURE_MATH_IMPORTS)


def test_the_packages_never_reach_into_launch_or_tests():
    for name, path in all_modules().items():
        tree = ast.parse(path.read_text())
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str)}
        assert not strings & {"launch", "tests"}, f"{name} builds a path into launch/ or tests/"
        imported = {m.split(".")[0] for m in imports_of(path, set())}
        assert not imported & {"launch", "tests", "helpers", "conftest", "benchmarks"}, \
            f"{name} imports test or launch code: {sorted(imported)}"
