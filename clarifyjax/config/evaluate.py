"""The config of `clarifyjax evaluate` (``kind: evaluate``): which systems, which data, which metric
models, each declared once with its default and range (clarifyjax/presets/evaluate/paper.yaml is the paper's).

System kinds (paper §5): ``ppo`` and ``t5`` sample a question; ``why`` asks the wh-conditioned
generator for a "why" question; ``wh``, ``pipeline``, ``pipeline-nli`` and ``discriminator`` pick
among its candidates (one per ``generation.wh_starts``): the first, the highest defeasibility reward
without / with the NLI filter, or the one the classifier finds most relevant."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import ClassVar, Literal
from collections.abc import Sequence

from clarifyjax.config import SHARED_DELTA_CLARIFY, RewardConfig
from clarifyjax.config.schema import MOVED_TO_SAMPLING, refuse_unused_sampling
from clarifyjax.config.loader import ConfigError, build_root, check_tree, read_yaml, refuse_changed
from clarifyjax.files.tables import DataError, resolve_data_path
from clarifyjax.files.textfiles import check_output_folder
from clarifyjax.text.generator import Sampling

SYSTEM_KINDS = ("ppo", "t5", "wh", "pipeline", "pipeline-nli", "why", "discriminator")
CANDIDATE_KINDS = ("wh", "pipeline", "pipeline-nli", "discriminator")
# The paper's footnote lists 12 starts; "why" and "does" (the most frequent other first words of
# δ-CLARIFY's questions) are most likely the two its text leaves out.
WH_STARTS = ("what", "how", "who", "do", "are", "did", "is", "where", "have", "was", "when",
             "would", "why", "does")


@dataclasses.dataclass(frozen=True)
class SystemConfig:
    """One question generator under evaluation. ``model``: its T5 folder (the policy for ``ppo``
    and ``t5``, the wh-conditioned generator for the other kinds); ``classifier``: the
    discriminator's (situation, question) classifier folder (``discriminator`` only);
    ``data_fraction``: the share of the training situations its model saw (the data-size
    ablation's x axis; null: not in the ablation)."""

    name: str = ""
    kind: Literal["ppo", "t5", "wh", "pipeline", "pipeline-nli", "why", "discriminator"] = "t5"
    model: str = ""
    classifier: str | None = None
    data_fraction: float | None = None

    _bounds: ClassVar = {"data_fraction": "(0, 1]"}

    def check(self, at: str) -> None:
        if not self.name.strip() or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"{at}.name: a non-empty name without '/' or a leading '.' is "
                              f"needed (it names the system's cache folder), got {self.name!r}",
                              key=f"{at}.name")
        if not self.model.strip():
            raise ConfigError(f"{at}.model: the question generator's folder is missing",
                              key=f"{at}.model")
        if self.kind == "discriminator" and not self.classifier:
            raise ConfigError(f"{at}.classifier: a discriminator system needs its classifier "
                              "folder", key=f"{at}.classifier")
        if self.kind != "discriminator":
            refuse_changed(self, at, {"classifier": f"{at}.kind is {self.kind}"})


@dataclasses.dataclass(frozen=True)
class EvalDataConfig:
    """The δ-CLARIFY-format file (columns situation, question): its unique situations, the first
    ``situations`` of them (null: all), each with its gold questions. ``batch_size`` situations
    make one chunk of every stage (the unit of the cache)."""

    situations_path: str = f"{SHARED_DELTA_CLARIFY}/test.tsv"
    situations: int | None = None
    batch_size: int = 32

    _bounds: ClassVar = {"situations": ">= 1", "batch_size": ">= 1"}


# The paper: nucleus sampling, top-p 0.6; the original's sampling left `transformers`' default
# top-k of 50 in force, hence the default here (0 turns it off)
GENERATION_SAMPLING = Sampling(max_new_tokens=32, temperature=1.0, top_k=50, top_p=0.6)


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How every system samples its questions: ``sampling`` (a section given in part keeps the
    other defaults). ``greedy: true`` decodes greedily instead, up to ``sampling.max_new_tokens``.
    ``wh_starts``: the wh-conditioned candidates' question starts. ``seed``: the key of every
    sampling stage."""

    sampling: Sampling = GENERATION_SAMPLING
    greedy: bool = False
    wh_starts: tuple[str, ...] = WH_STARTS
    seed: int = 0

    _bounds: ClassVar = {"seed": "[0, 2147483647]"}
    _moved: ClassVar = MOVED_TO_SAMPLING

    def __post_init__(self):
        object.__setattr__(self, "sampling", self.sampling.with_defaults(GENERATION_SAMPLING))

    def check(self, at: str) -> None:
        starts = [s.strip() for s in self.wh_starts]
        if not starts or any(not s or " " in s for s in starts) or len(set(starts)) != len(starts):
            raise ConfigError(f"{at}.wh_starts: need distinct one-word starts, got "
                              f"{list(self.wh_starts)}", key=f"{at}.wh_starts")
        refuse_unused_sampling(self.sampling, f"{at}.sampling", "the question samplers")
        if self.greedy:
            for name in ("temperature", "top_p", "top_k"):
                value, default = getattr(self.sampling, name), getattr(GENERATION_SAMPLING, name)
                if value != default:
                    raise ConfigError(f"{at}.sampling.{name} = {value!r} is not used: {at}.greedy "
                                      f"is true; remove it or set it to its default {default}",
                                      key=f"{at}.sampling.{name}")


@dataclasses.dataclass(frozen=True)
class Table4Config:
    """Judgment flips (the paper does not define one exactly): ``base``: an answer's updated
    situation changes the judge's argmax class from the base situation's (share of the answers
    kept and fused); ``pair``: the weakener's and the strengthener's argmax classes differ (share
    of the valid pairs). Both are computed; ``flip`` is the one the table shows."""

    flip: Literal["base", "pair"] = "base"


@dataclasses.dataclass(frozen=True)
class InformativenessConfig:
    """The extractive QA model (a ``...ForQuestionAnswering`` folder): a question is unanswerable
    when the best span is the CLS position. ``qa: null`` leaves the metric out."""

    qa: str | None = None
    max_length: int = 384
    batch_size: int = 64

    _bounds: ClassVar = {"max_length": ">= 8", "batch_size": ">= 1"}


@dataclasses.dataclass(frozen=True)
class BERTScoreConfig:
    """`clarifyjax.evaluation.bertscore` over each question and its situation's gold questions (the max
    F1). ``model: null`` leaves the metric out; ``layer`` null: the model's default layer."""

    model: str | None = None
    layer: int | None = None
    idf: bool = False
    baseline: str | None = None
    batch_size: int = 64

    _bounds: ClassVar = {"layer": ">= 0", "batch_size": ">= 1"}


@dataclasses.dataclass(frozen=True)
class Table3Config:
    """Update generation with and without the intermediate question (paper Table 3) on a
    δ-SOCIAL-format file (JSONL or a table with Hypothesis, Update, UpdateType; the silver
    sc_dev_questions_gpt.tsv also has the question, ``question_column``). References are grouped
    per (Hypothesis, UpdateType). ``answerer``: the generator given the question;
    ``answerer_no_question``: one trained without it (null: the same ``answerer`` with the
    question left out of its input). ``path: null`` leaves the table out."""

    path: str | None = None
    answerer: str | None = None
    answerer_no_question: str | None = None
    question_column: str = "question_davinci"
    groups: int | None = None
    max_length: int = 32
    max_input_length: int = 128

    _bounds: ClassVar = {"groups": ">= 1", "max_length": ">= 2", "max_input_length": ">= 2"}

    def check(self, at: str) -> None:
        if self.path is not None and not self.answerer:
            raise ConfigError(f"{at}.answerer: table3.path is set but no answerer folder",
                              key=f"{at}.answerer")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """`clarifyjax evaluate`'s config. ``rewards``: the reward pipeline (the PPO run's
    ``rewards:`` section) that ranks the pipeline candidates and judges every system for
    Table 4 (with its NLI filter when ``nli`` is set; ``pipeline-nli`` needs one)."""

    kind: Literal["evaluate"] = "evaluate"
    out: str = "runs/evaluate"
    data: EvalDataConfig = dataclasses.field(default_factory=EvalDataConfig)
    generation: GenerationConfig = dataclasses.field(default_factory=GenerationConfig)
    systems: tuple[SystemConfig, ...] = ()
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    table4: Table4Config = dataclasses.field(default_factory=Table4Config)
    informativeness: InformativenessConfig = dataclasses.field(
        default_factory=InformativenessConfig)
    bertscore: BERTScoreConfig = dataclasses.field(default_factory=BERTScoreConfig)
    table3: Table3Config = dataclasses.field(default_factory=Table3Config)

    def check(self, at: str) -> None:
        if not self.systems:
            raise ConfigError("systems: name at least one system", key="systems")
        names = [s.name for s in self.systems]
        for i, system in enumerate(self.systems):
            check_tree(system, f"systems[{i}]")
            if names.count(system.name) > 1:
                raise ConfigError(f"systems[{i}].name: {system.name!r} is used twice",
                                  key=f"systems[{i}].name")
            if system.kind == "pipeline-nli" and self.rewards.nli is None:
                raise ConfigError(f"systems[{i}]: a pipeline-nli system needs rewards.nli (the "
                                  "NLI filter's folder)", key="rewards.nli")
        for role in ("answerer", "fusion"):
            if getattr(self.rewards, role).init is None:
                raise ConfigError(f"rewards.{role}.init: the reward models must be trained "
                                  "folders", key=f"rewards.{role}.init")
        if self.rewards.judge.model.init is None:
            raise ConfigError("rewards.judge.model.init: the judge must be a trained folder",
                              key="rewards.judge.model.init")


def load_eval_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> EvalConfig:
    """Read ``kind: evaluate`` YAML with ``a.b.c=value`` overrides; relative folders stay as
    written (read from the working directory).

    Raises:
      ConfigError: as `clarifyjax.config.load_config`, naming the key and the file.
    """
    return eval_config_from_dict(read_yaml(path), overrides, source=str(Path(path)))


def eval_config_from_dict(raw, overrides: Sequence[str] = (), *, source: str = "<dict>"
                          ) -> EvalConfig:
    """`EvalConfig` from nested plain values plus overrides (as `load_eval_config`)."""
    if raw.get("kind", "evaluate") != "evaluate":
        raise ConfigError(f"{source}: top-level key 'kind' must be 'evaluate' for clarifyjax "
                          f"evaluate, got {raw.get('kind')!r}")
    return build_root(EvalConfig, raw, overrides, source=source)


def eval_model_folders(cfg: EvalConfig) -> dict[str, str]:
    """key -> folder of every model the config names (None values left out)."""
    folders = {}
    for i, system in enumerate(cfg.systems):
        folders[f"systems[{i}].model"] = system.model
        folders[f"systems[{i}].classifier"] = system.classifier
    r = cfg.rewards
    folders.update({"rewards.answerer.init": r.answerer.init, "rewards.fusion.init": r.fusion.init,
                    "rewards.judge.model.init": r.judge.model.init,
                    "rewards.nli.init": r.nli.init if r.nli is not None else None,
                    "informativeness.qa": cfg.informativeness.qa,
                    "bertscore.model": cfg.bertscore.model,
                    "table3.answerer": cfg.table3.answerer if cfg.table3.path else None,
                    "table3.answerer_no_question": (cfg.table3.answerer_no_question
                                                    if cfg.table3.path else None)})
    return {k: v for k, v in folders.items() if v is not None}


def check_eval_inputs(cfg: EvalConfig, source: str = "the config") -> None:
    """Before any model loads: `out` can be a folder, and every model folder and data file the
    config names exists.

    Raises:
      ConfigError: naming the key, the path and `source`.
    """
    try:  # a file, /dev/null or a read-only place: before any model loads
        check_output_folder(cfg.out, option="out", error=ConfigError)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}", key="out") from None
    for key, folder in eval_model_folders(cfg).items():
        if not Path(folder).is_dir():
            raise ConfigError(f"{source}: {key}: {folder}: "
                              + ("not a folder" if Path(folder).exists() else "no such folder"),
                              key=key)
    for key, path in (("data.situations_path", cfg.data.situations_path),
                      ("table3.path", cfg.table3.path)):
        if path is not None:
            try:
                resolve_data_path(path, key)
            except DataError as e:
                raise ConfigError(f"{source}: {e}", key=key) from None
