"""The config of `sage-jax experiment` (YAML + ``key=value`` overrides, on `clarifyjax.config.loader`):
one file per experiment of the SaGE paper, ``kind`` naming which (models: Table 1, temperature:
Figure 3, accuracy: Table 3 and Figure 4, agreement: Table 2, rot_prompt: Table 4); an example is
above `ExperimentConfig`. A section another kind would use is refused when set (it would be
ignored). Nothing here imports JAX."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar, Literal
from collections.abc import Sequence

from clarifyjax.config.loader import ConfigError, build_root, read_yaml
from sage_jax.run.config import (ParaphraseConfig, SageRunConfig, ScoreConfig, StageConfig, TargetConfig)

EXPERIMENT_KINDS = ("models", "temperature", "accuracy", "agreement", "rot_prompt")
# The sections each kind reads beside kind, out, run and bootstrap.
SECTIONS = {"models": {"models", "pairs"}, "temperature": {"temperature"},
            "accuracy": {"models", "benchmarks"}, "agreement": {"agreement", "models"},
            "rot_prompt": {"models", "guide_column"}}


@dataclasses.dataclass(frozen=True)
class BootstrapConfig:
    """The bootstrap of every interval (sage_jax.experiments.stats; scipy.stats.bootstrap's
    methods and defaults)."""

    resamples: int = 9999
    seed: int = 0
    confidence: float = 0.95
    method: Literal["BCa", "percentile", "basic"] = "BCa"

    _bounds: ClassVar = {"resamples": "[1, 10000000]", "seed": "[0, 4294967295]", "confidence": "(0, 1)"}


@dataclasses.dataclass(frozen=True)
class SharedRun:
    """The settings of `sage-jax run` (sage_jax.run.config.SageRunConfig) that every run of an
    experiment shares; the experiment adds the models and the output folder of each."""

    questions: str = ""
    preset: Literal["ours", "code", "paper"] = "ours"
    question_id_column: str = "question_id"
    question_column: str = "question"
    limit: int | None = None
    seed: int = 0
    quiet: bool = False
    paraphrase: ParaphraseConfig = ParaphraseConfig(source="file")
    answer: StageConfig = StageConfig()
    rot: StageConfig = StageConfig()
    score: ScoreConfig = ScoreConfig()

    _bounds: ClassVar = {"limit": ">= 1", "seed": "[0, 4294967295]"}

    def build(self, out: Path, models: Sequence[TargetConfig], **changes) -> SageRunConfig:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        cfg = SageRunConfig(**{**fields, "out": str(out), "models": tuple(models), **changes})
        cfg.check("run")
        return cfg


@dataclasses.dataclass(frozen=True)
class TemperatureConfig:
    """Figure 3: the model answers at each temperature, `paraphrase` (its five paraphrases) and
    `same` (the question itself asked `repeats` times). A file generator's `model` may hold
    `{temperature}` (the recorded answers, one file per temperature, as `q100_gpt_3.5_t_{T}.csv`)."""

    temperatures: tuple[float, ...] = (0.0, 0.5, 1.0)
    settings: tuple[Literal["paraphrase", "same"], ...] = ("paraphrase", "same")
    repeats: int = 5
    model: TargetConfig | None = None

    _bounds: ClassVar = {"repeats": "[2, 100]"}

    def check(self, at: str) -> None:
        if not self.temperatures or any(not 0 <= t <= 100 for t in self.temperatures):
            raise ConfigError(f"{at}.temperatures: give one or more temperatures in [0, 100]", key=f"{at}.temperatures")
        given = [float(t) for t in self.temperatures]
        twice = [t for i, t in enumerate(given) if t in given[:i]]
        if twice:  # one model, t<T>, per temperature
            raise ConfigError(f"{at}.temperatures: {twice[0]} is given twice", key=f"{at}.temperatures")
        if not self.settings or len(set(self.settings)) != len(self.settings):
            raise ConfigError(f"{at}.settings: name paraphrase and/or same, each once", key=f"{at}.settings")
        if self.model is None:
            raise ConfigError(f"{at}.model: name the model under test (name, generator, sampling)", key=f"{at}.model")
        if self.model.generator.kind == "file" and len(self.temperatures) > 1 and \
                "{temperature}" not in self.model.generator.model:
            raise ConfigError(f"{at}.model.generator.model: a file generator for several temperatures needs "
                              "{temperature} in its path (one recorded file per temperature)",
                              key=f"{at}.model.generator.model")


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """One accuracy benchmark (sage_jax.experiments.benchmarks): `task` on `file`, `sample`
    documents drawn by `seed` (null: all; the paper: 1,000 HellaSwag rows), `shots` few-shot
    examples from `fewshot_file` (null: the same file) drawn by `fewshot_seed` (lm-eval's 1234)."""

    task: Literal["truthfulqa_mc1", "truthfulqa_mc2", "hellaswag"] = "hellaswag"
    file: str = ""
    format: Literal["auto", "csv", "json"] = "auto"
    sample: int | None = None
    seed: int = 0
    shots: int = 0
    fewshot_file: str | None = None
    fewshot_seed: int = 1234
    max_length: int | None = None  # tokens of context + choice (null: the model's context length)
    batch_size: int = 32

    _bounds: ClassVar = {"sample": ">= 1", "seed": "[0, 4294967295]", "shots": "[0, 64]",
                         "fewshot_seed": "[0, 4294967295]", "max_length": "[2, 1048576]", "batch_size": "[1, 4096]"}

    def check(self, at: str) -> None:
        if not self.file.strip():
            raise ConfigError(f"{at}.file: name the benchmark's file", key=f"{at}.file")
        if self.task != "hellaswag" and (self.shots or self.fewshot_file):
            raise ConfigError(f"{at}.shots: lm-evaluation-harness keeps TruthfulQA at 0 shots (its prompt holds "
                              "its own six-question primer)", key=f"{at}.shots")


@dataclasses.dataclass(frozen=True)
class AgreementConfig:
    """Table 2: `labels`, a file of pairwise human labels (question id, the two answers, one
    column per rater holding Y, N or NA), against the per-question metrics of the run's answers."""

    labels: str = ""
    question_id_column: str = "question_id"
    raters: tuple[str, ...] = ()  # the rater columns (empty: every column but the id and the answers)
    answer_columns: tuple[str, ...] = ("model_output_1", "model_output_2")

    def check(self, at: str) -> None:
        if not self.labels.strip():
            raise ConfigError(f"{at}.labels: name the file of human labels", key=f"{at}.labels")


#     kind: models            # Table 1: models | temperature (Figure 3) | accuracy (Table 3, Figure 4)
#                             # | agreement (Table 2) | rot_prompt (Table 4)
#     out: runs/exp_models
#     run:                    # what every `sage-jax run` of the experiment shares (sage_jax.run.config)
#       questions: ../shared/data/sage-mcc/q100_gpt-3.5-turbo_rot.csv
#       paraphrase: {source: file}
#       rot: {generator: {kind: local, model: models/vicuna-13b-v1.3}}
#     models:                 # the models under test, as `sage-jax run`'s
#       - {name: llama-2-7b, generator: {kind: local, model: models/Llama-2-7b-chat-hf}}
#     bootstrap: {resamples: 9999, seed: 0, confidence: 0.95, method: BCa}
@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    kind: Literal["models", "temperature", "accuracy", "agreement", "rot_prompt"] = "models"
    out: str = ""
    run: SharedRun = SharedRun()
    bootstrap: BootstrapConfig = BootstrapConfig()
    models: tuple[TargetConfig, ...] = ()
    pairs: tuple[str, ...] = ()  # "a:b" model pairs to compare (empty: every pair)
    temperature: TemperatureConfig | None = None
    benchmarks: tuple[BenchmarkConfig, ...] = ()
    agreement: AgreementConfig | None = None
    guide_column: str = "imp_rot"  # rot_prompt: the questions file's rule of thumb per question

    def check(self, at: str) -> None:
        if not self.out.strip():
            raise ConfigError("out: must name a folder", key="out")
        if not self.run.questions.strip() and self.kind != "accuracy":  # accuracy: the benchmark's questions
            raise ConfigError("run.questions: must name the questions file", key="run.questions")
        default = ExperimentConfig()
        for name in set().union(*SECTIONS.values()) - SECTIONS[self.kind]:
            if getattr(self, name) != getattr(default, name):
                raise ConfigError(f"{name}: kind {self.kind} does not use this section (it is read by kind "
                                  f"{', '.join(k for k, v in SECTIONS.items() if name in v)})", key=name)
        if self.kind in ("temperature", "agreement") and getattr(self, self.kind) is None:
            raise ConfigError(f"{self.kind}: kind {self.kind} needs this section", key=self.kind)
        need = {"models": 1, "accuracy": 2, "rot_prompt": 1, "agreement": 1}.get(self.kind, 0)
        if len(self.models) < need:
            raise ConfigError(f"models: kind {self.kind} needs at least {need} model{'s' * (need > 1)}", key="models")
        if self.kind in ("rot_prompt", "agreement") and len(self.models) != 1:
            raise ConfigError(f"models: kind {self.kind} takes one model", key="models")
        if self.kind == "rot_prompt" and not self.guide_column.strip():
            raise ConfigError("guide_column: kind rot_prompt needs the questions file's column of rules of thumb",
                              key="guide_column")
        if self.kind == "accuracy":
            if not self.benchmarks:
                raise ConfigError("benchmarks: kind accuracy needs one or more benchmarks", key="benchmarks")
            named = [(b.task, b.shots) for b in self.benchmarks]
            for j, (task, shots) in enumerate(named):
                if (task, shots) in named[:j]:  # the results of each are kept under f"{task}_{shots}shot"
                    raise ConfigError(f"benchmarks[{j}]: task {task} at {shots} shots is benchmarks["
                                      f"{named.index((task, shots))}] too; their results would share one name "
                                      "(run an experiment per file)", key=f"benchmarks[{j}]")
            for i, m in enumerate(self.models):
                if m.generator.kind != "local":
                    raise ConfigError(f"models[{i}].generator.kind: accuracy scores each choice's log-likelihood, "
                                      "which needs a local model folder", key=f"models[{i}].generator.kind")
        names = [m.name for m in self.models]
        for i, pair in enumerate(self.pairs):
            a, _, b = pair.partition(":")
            if a not in names or b not in names or a == b:
                raise ConfigError(f"pairs[{i}]: {pair!r} must be two different model names as 'a:b' "
                                  f"(models: {', '.join(names)})", key=f"pairs[{i}]")


def load_experiment_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The experiment config of `path` with overrides applied (paths as in `sage-jax run`'s)."""
    return build_root(ExperimentConfig, read_yaml(path), overrides, source=str(path))
