"""Old module paths of the flat layout (before the subpackages), kept importable for one release.

`import clarifyjax.tokenizer` (or `from clarifyjax.llm import LocalLM`) still works: a finder on
`sys.meta_path` answers each old name below with the module at its new path (the same module
object, not a copy) and warns with a `DeprecationWarning` that names the new path. Installed by
`clarifyjax/__init__.py` and `sage_jax/__init__.py`; remove after the next release.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED: dict[str, str] = {
    "clarifyjax.answer_spans": "clarifyjax.evaluation.answer_spans",
    "clarifyjax.ask": "clarifyjax.app.ask",
    "clarifyjax.baselines": "clarifyjax.evaluation.baselines",
    "clarifyjax.bertscore": "clarifyjax.evaluation.bertscore",
    "clarifyjax.buckets": "clarifyjax.core.buckets",
    "clarifyjax.checkpointing": "clarifyjax.training.checkpointing",
    "clarifyjax.child_result": "clarifyjax.files.child_result",
    "clarifyjax.chunkstore": "clarifyjax.files.chunkstore",
    "clarifyjax.clarify": "clarifyjax.app.clarifier",
    "clarifyjax.clarify_options": "clarifyjax.app.options",
    "clarifyjax.config_models": "clarifyjax.config.model_config",
    "clarifyjax.configlib": "clarifyjax.config.loader",
    "clarifyjax.delphi": "clarifyjax.reward.judge",
    "clarifyjax.discriminator": "clarifyjax.data.discriminator",
    "clarifyjax.distributed": "clarifyjax.core.distributed",
    "clarifyjax.dryrun": "clarifyjax.training.dryrun",
    "clarifyjax.eval_config": "clarifyjax.config.evaluate",
    "clarifyjax.eval_metrics": "clarifyjax.evaluation.metrics",
    "clarifyjax.eval_report": "clarifyjax.evaluation.report",
    "clarifyjax.generation_job": "clarifyjax.serve.batch_job",
    "clarifyjax.interact": "clarifyjax.app.interact",
    "clarifyjax.llm": "clarifyjax.decoding.local_lm",
    "clarifyjax.memory_plan": "clarifyjax.training.memory_plan",
    "clarifyjax.metrics_log": "clarifyjax.core.metrics_log",
    "clarifyjax.models.causal_lm_params": "clarifyjax.models.hf.causal_lm_map",
    "clarifyjax.models.deberta_params": "clarifyjax.models.hf.deberta_map",
    "clarifyjax.models.encoder_params": "clarifyjax.models.hf.encoder_map",
    "clarifyjax.models.params": "clarifyjax.models.state",
    "clarifyjax.models.value": "clarifyjax.rl.value",
    "clarifyjax.models.t5_params": "clarifyjax.models.hf.t5_map",
    "clarifyjax.nli": "clarifyjax.reward.nli",
    "clarifyjax.openai_server": "clarifyjax.serve.openai_api",
    "clarifyjax.optim": "clarifyjax.training.programs",
    "clarifyjax.policy": "clarifyjax.rl.policy",
    "clarifyjax.ppo": "clarifyjax.rl.ppo",
    "clarifyjax.programs": "clarifyjax.training.programs",
    "clarifyjax.qa_metric": "clarifyjax.evaluation.qa_metric",
    "clarifyjax.ranges": "clarifyjax.core.ranges",
    "clarifyjax.reward_pipeline": "clarifyjax.reward.pipeline",
    "clarifyjax.rollout": "clarifyjax.rl.rollout",
    "clarifyjax.run_record": "clarifyjax.training.run_record",
    "clarifyjax.score_config": "clarifyjax.config.score",
    "clarifyjax.seq2seq": "clarifyjax.decoding.seq2seq",
    "clarifyjax.serving": "clarifyjax.serve.http_server",
    "clarifyjax.sft": "clarifyjax.training.sft",
    "clarifyjax.sharding": "clarifyjax.core.sharding",
    "clarifyjax.stage_cache": "clarifyjax.evaluation.stage_cache",
    "clarifyjax.tables": "clarifyjax.files.tables",
    "clarifyjax.text_inputs": "clarifyjax.data.situations",
    "clarifyjax.textfiles": "clarifyjax.files.textfiles",
    "clarifyjax.textgen": "clarifyjax.text.generator",
    "clarifyjax.tokenizer": "clarifyjax.text.tokenizer",
    "clarifyjax.traces": "clarifyjax.core.traces",
    "clarifyjax.train": "clarifyjax.training.loops",
    "clarifyjax.web": "clarifyjax.app.web",
    "sage_jax.embed": "clarifyjax.models.embedder",
    "sage_jax.generators": "sage_jax.run.generators",
    "sage_jax.pipeline": "sage_jax.run.pipeline",
    "sage_jax.prompts": "sage_jax.run.prompts",
    "sage_jax.run_config": "sage_jax.run.config",
    "sage_jax.run_report": "sage_jax.run.report",
    "sage_jax.stages": "sage_jax.run.stages",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as its new module (with a DeprecationWarning)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None  # the default module, replaced in exec_module

    def exec_module(self, module) -> None:
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}; the old path is deprecated and will be "
                      "removed in the next release", DeprecationWarning, stacklevel=2)
        # The import system returns whatever sys.modules holds for the name after exec_module.
        sys.modules[module.__name__] = importlib.import_module(new)


def install() -> None:
    """Put the finder on `sys.meta_path` once (idempotent)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
