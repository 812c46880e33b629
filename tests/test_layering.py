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
    "foundation": ("clarifyjax", "clarifyjax.models", "clarifyjax.sharding",
                   "clarifyjax.distributed", "clarifyjax.text", "clarifyjax.metrics_log",
                   "clarifyjax.optim", "clarifyjax.buckets", "clarifyjax.ranges", "clarifyjax.traces",
                   "clarifyjax.textfiles"),
    # Arrays in, arrays out: jax, optax and numpy only (research code pastes these).
    "pure math": ("clarifyjax.ppo", "clarifyjax.reward", "clarifyjax.answer_spans",
                  "sage_jax.metric"),
    # Models: jax, flax, numpy, their own files and the foundation.
    "models": ("clarifyjax.models.safetensors_io", "clarifyjax.models.t5_layers",
               "clarifyjax.models.t5", "clarifyjax.models.encoder",
               "clarifyjax.models.encoder_params", "clarifyjax.models.t5_params",
               "clarifyjax.models.hf", "clarifyjax.models.causal_lm",
               "clarifyjax.models.causal_lm_params",
               "clarifyjax.models.deberta", "clarifyjax.models.deberta_params",
               "clarifyjax.models.tiny", "clarifyjax.models.value", "clarifyjax.models.params"),
    # Building blocks over the models: configs, tokenizers, decoding, files, data formats.
    "building blocks": ("clarifyjax.tables", "clarifyjax.configlib", "clarifyjax.config_models", "clarifyjax.config",
                        "clarifyjax.tokenizer", "clarifyjax.decoding",
                        "clarifyjax.child_result", "clarifyjax.chunkstore", "sage_jax.lexical",
                        "clarifyjax.textgen", "clarifyjax.serving", "clarifyjax.discriminator",
                        "clarifyjax.bertscore", "sage_jax.prompts"),
    # Components: the models' roles (seq2seq, judge, NLI filter, rollouts, SFT step), data,
    # checkpoints, the reward settings of score-questions.
    "components": ("clarifyjax.data", "clarifyjax.text_inputs", "clarifyjax.score_config",
                   "clarifyjax.seq2seq", "clarifyjax.delphi", "clarifyjax.nli", "clarifyjax.policy",
                   "clarifyjax.rollout", "clarifyjax.sft", "clarifyjax.checkpointing",
                   "clarifyjax.run_record", "clarifyjax.llm", "clarifyjax.openai_server",
                   "clarifyjax.eval_config", "clarifyjax.eval_metrics",
                   "clarifyjax.stage_cache", "clarifyjax.eval_report", "clarifyjax.qa_metric",
                   "sage_jax.data", "sage_jax.embed", "sage_jax.report", "sage_jax.parascore",
                   "sage_jax.generators", "sage_jax.run_config", "sage_jax.stages"),
    # Pipelines: the composed reward, the training programs and loops, the dry run.
    "pipelines": ("clarifyjax.reward_pipeline", "clarifyjax.memory_plan", "clarifyjax.programs",
                  "clarifyjax.train", "clarifyjax.dryrun", "sage_jax", "clarifyjax.generation_job",
                  "clarifyjax.clarify", "clarifyjax.clarify_options", "clarifyjax.baselines",
                  "clarifyjax.evaluation", "sage_jax.scoring", "sage_jax.pipeline",
                  "sage_jax.run_report"),
    # Commands: nothing imports them (but the demo, which runs the others).
    "commands": ("clarifyjax.cli", "clarifyjax.__main__", "clarifyjax.demo", "sage_jax.cli",
                 "clarifyjax.ask", "clarifyjax.interact", "clarifyjax.web"),
}

# Same-layer imports that are part of the design (importer, imported).
SAME_LAYER: set[tuple[str, str]] = {
    ("clarifyjax.models.t5", "clarifyjax.models.t5_layers"),
    ("clarifyjax.models.hf", "clarifyjax.models.t5"),
    ("clarifyjax.models.hf", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.hf", "clarifyjax.models.encoder"),
    ("clarifyjax.models.hf", "clarifyjax.models.encoder_params"),
    ("clarifyjax.models.hf", "clarifyjax.models.t5_params"),
    ("clarifyjax.models.hf", "clarifyjax.models.causal_lm"),
    ("clarifyjax.models.t5", "clarifyjax.models.params"),
    ("clarifyjax.models.causal_lm", "clarifyjax.models.params"),
    ("clarifyjax.models.hf", "clarifyjax.models.causal_lm_params"),
    ("clarifyjax.models.causal_lm_params", "clarifyjax.models.causal_lm"),
    ("clarifyjax.models.causal_lm_params", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.t5_params", "clarifyjax.models.t5"),
    ("clarifyjax.models.t5_params", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.encoder", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.encoder_params", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.encoder_params", "clarifyjax.models.encoder"),
    ("clarifyjax.models.deberta", "clarifyjax.models.encoder"),
    ("clarifyjax.models.deberta_params", "clarifyjax.models.deberta"),
    ("clarifyjax.models.deberta_params", "clarifyjax.models.encoder"),
    ("clarifyjax.models.deberta_params", "clarifyjax.models.safetensors_io"),
    ("clarifyjax.models.deberta_params", "clarifyjax.models.t5_params"),
    ("clarifyjax.models.hf", "clarifyjax.models.deberta"),
    ("clarifyjax.models.hf", "clarifyjax.models.deberta_params"),
    ("clarifyjax.config_models", "clarifyjax.configlib"),
    ("clarifyjax.config", "clarifyjax.configlib"),
    ("clarifyjax.config", "clarifyjax.config_models"),
    ("clarifyjax.text_inputs", "clarifyjax.data"),
    ("clarifyjax.discriminator", "clarifyjax.tables"),
    ("clarifyjax.delphi", "clarifyjax.seq2seq"),
    ("clarifyjax.rollout", "clarifyjax.policy"),
    ("clarifyjax.models.value", "clarifyjax.models.t5"),
    ("clarifyjax.models.value", "clarifyjax.models.t5_layers"),
    ("clarifyjax.train", "clarifyjax.programs"),
    ("clarifyjax.train", "clarifyjax.reward_pipeline"),
    ("clarifyjax.dryrun", "clarifyjax.programs"),
    ("clarifyjax.dryrun", "clarifyjax.memory_plan"),
    ("clarifyjax.__main__", "clarifyjax.cli"),
    ("clarifyjax.baselines", "clarifyjax.reward_pipeline"),
    ("clarifyjax.eval_report", "clarifyjax.eval_metrics"),
    ("clarifyjax.evaluation", "clarifyjax.reward_pipeline"),
    ("clarifyjax.evaluation", "clarifyjax.baselines"),
    ("clarifyjax.demo", "sage_jax.cli"),
    ("clarifyjax.clarify", "clarifyjax.reward_pipeline"),
    ("clarifyjax.clarify_options", "clarifyjax.clarify"),
    # cli registers the commands that live in their own modules; they use its registry and helpers
    ("clarifyjax.cli", "clarifyjax.ask"),
    ("clarifyjax.cli", "clarifyjax.interact"),
    ("clarifyjax.cli", "clarifyjax.web"),
    ("clarifyjax.ask", "clarifyjax.cli"),
    ("clarifyjax.interact", "clarifyjax.cli"),
    ("clarifyjax.web", "clarifyjax.cli"),
    ("sage_jax.pipeline", "sage_jax.run_report"),
    ("sage_jax.run_report", "sage_jax.scoring"),
    ("sage_jax.lexical", "clarifyjax.bertscore"),
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
