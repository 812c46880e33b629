"""Run configurations: nested frozen dataclasses read from YAML, overridable as ``a.b.c=value``.

Two kinds of run, told apart by the top-level key ``kind``:

* ``kind: sft`` -> `SFTConfig`: supervised fine-tuning of one seq2seq model (``task`` picks the
  question generator, the wh-conditioned generator, the answerer, the fusion model or a judge);
* ``kind: ppo`` -> `PPOConfig`: ClarifyDelphi's PPO (policy, value, reference, reward models).

    cfg = load_config("configs/ppo_tiny.yaml", ["ppo.batch_size=8", "run.steps=20"])
    log(config_to_dict(cfg))                 # plain nested dicts/lists, YAML/JSON-ready

A YAML file may start from another one with ``base: other.yaml`` (path relative to the file);
mappings are merged key by key, anything else is replaced. Values are coerced to the declared field
types (``lr: 1e-5`` is a float although YAML reads it as a string); an unknown key or a value of the
wrong type raises `ConfigError` naming the key, the file (or the override) and what was expected.
A `ModelConfig` may be written as a bare string, shorthand for ``{init: <string>}``.

The generic machinery (YAML ``base:`` chains, overrides, coercion, bound checks, dumping) lives
in `clarifyjax.config.loader`; its public names are re-exported here. Each setting is declared once,
with its default and its range: a section that a lower module consumes is that module's own frozen
dataclass (``mesh:`` is `sharding.MeshConfig`; ``ppo:`` extends `ppo.PPOConfig`), and the reward
pipeline's settings (`PipelineConfig`) are declared here, below `clarifyjax.reward.pipeline`.
Importing this module therefore imports JAX (through those two modules); configlib does not.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Optional, Sequence, Union

from clarifyjax.rl import ppo
from clarifyjax.config.model_config import (PPO_UNUSED_MODEL_KEYS, DTypeName, ModelConfig,
                                      TinyModelSpec)
from clarifyjax.config.loader import (ConfigError, build_root, check_increasing, config_to_dict,
                                  dump_config, parse_overrides, read_yaml, refuse_changed,
                                  save_config)
from clarifyjax.core.sharding import MeshConfig as MeshLayout  # the ``mesh:`` section

__all__ = [
    "ConfigError", "config_to_dict", "dump_config", "parse_overrides", "save_config",
    "load_config", "config_from_dict", "Config", "KINDS", "DTypeName", "SHARED_DELTA_CLARIFY",
    "RunConfig", "MeshLayout", "TinyModelSpec", "ModelConfig", "OptimizerConfig", "SFTDataConfig",
    "PPODataConfig", "JudgeConfig", "PipelineConfig", "RewardConfig", "NormalizerConfig",
    "PPOHyperparams", "ValueConfig", "SFTConfig", "PPOConfig", "NLI_THRESHOLD",
    "ModelsConfig", "load_models_config", "CLASSIFIER_TASKS",
]

SHARED_DELTA_CLARIFY = "../shared/data/delta-clarify"
# The NLI filter's default decision, for every entry point (`nli.NLIFilter`, `PipelineConfig` and
# so `RewardConfig` and `clarifyjax score-questions`): None = drop an answer when the classifier's
# argmax label is entailment or contradiction (the paper's "answers the situation entails or
# contradicts"); a number t = drop when P(ent) + P(contra) >= t. It lives here, below nli.py,
# which imports it.
NLI_THRESHOLD: Optional[float] = None


# --------------------------------------------------------------------------- sections
# Each section declares `_bounds` for every numeric field (field -> ">= 1", "> 0", "[0, 1)",
# "finite", ...; None values pass; floats must be finite too) and may declare a `check(at)` for
# rules that involve several fields; `configlib.check_tree` runs both at load time. A key that a
# context does not read is refused there (`configlib.refuse_changed`) rather than ignored.


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Bookkeeping of a run. Every ``*_every`` is in steps; 0 turns it off.

    Conventions for the loops: checkpoints go to ``{directory}/checkpoints`` (orbax), metrics to
    ``{directory}/metrics.jsonl`` and TensorBoard files, the final model as a Hugging Face folder
    to ``{directory}/final``. ``output_dir: null`` means ``runs/{name}``.
    """

    name: str = "run"
    output_dir: Optional[str] = None
    seed: int = 0
    steps: int = 1000
    eval_every: int = 500
    save_every: int = 500
    log_every: int = 10
    sample_every: int = 100
    max_to_keep: int = 3
    async_checkpointing: bool = True

    _bounds: ClassVar = {"seed": "[0, 2147483647]", "steps": ">= 1", "eval_every": ">= 0",
                         "save_every": ">= 0", "log_every": ">= 0", "sample_every": ">= 0",
                         "max_to_keep": ">= 1"}

    @property
    def directory(self) -> str:
        return self.output_dir if self.output_dir else os.path.join("runs", self.name)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """optax optimizer and learning-rate schedule.

    ``schedule``: constant, or linear / cosine decay to 0 at the last step; all after
    ``warmup_steps`` of linear warm-up. ``grad_accum`` micro-batches make one update (the
    data batch size is per micro-batch). ``max_grad_norm`` 0 = no clipping.
    """

    name: Literal["adamw", "adafactor", "adam"] = "adamw"
    lr: float = 1e-4
    warmup_steps: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_accum: int = 1
    label_smoothing: float = 0.0
    max_grad_norm: float = 1.0

    _bounds: ClassVar = {"lr": "> 0", "warmup_steps": ">= 0", "weight_decay": ">= 0",
                         "b1": "[0, 1)", "b2": "[0, 1)", "eps": "> 0", "grad_accum": ">= 1",
                         "label_smoothing": "[0, 1)", "max_grad_norm": ">= 0"}

    def check(self, at: str) -> None:
        if self.name == "adafactor":  # `sft.make_optimizer` gives optax.adafactor none of them
            refuse_changed(self, at, dict.fromkeys(
                ("b1", "b2", "eps"), "adafactor has no Adam moments (optimizer.name adam/adamw)"))
        if self.name == "adam":
            refuse_changed(self, at, {"weight_decay": "adam has no weight decay; use adamw"})


@dataclasses.dataclass(frozen=True)
class SFTDataConfig:
    """Where the (input, target) pairs of an SFT run come from, and how they are batched.

    Relative paths are read from the working directory, else from the repository root; a path
    that exists in neither stops the run (`clarifyjax.data.resolve_data_path`: no fallback).
    ``dev_path: null``: a seeded split of ``train_path`` (grouped by situation, so that no dev
    situation is seen in training), ``dev_fraction`` of the groups. ``train_fraction`` keeps that
    share of the training situations (a seeded sample of whole groups: the data-size ablation;
    null: all), ``train_rows`` then N train pairs (a seeded sample), ``dev_rows`` the first N dev
    pairs. ``batch_size`` is global (all hosts). ``length_buckets``: padded lengths of batches (empty: powers of two), capped by the
    model's maximum lengths. Judge files are (text, class) tables; ``text_column`` /
    ``label_column`` name their columns (labels 1/0/-1 or good/ok/bad). ``judge_source: silver``
    derives judge pairs from sc_dev_questions_gpt.tsv instead (`clarifyjax.data.silver_judge_rows`).
    Discriminator files are (situation, question, label) tables made by `clarifyjax
    discriminator-data` (`clarifyjax.data.discriminator`).
    """

    train_path: str = f"{SHARED_DELTA_CLARIFY}/train.tsv"
    dev_path: Optional[str] = f"{SHARED_DELTA_CLARIFY}/dev.tsv"
    dev_fraction: float = 0.1
    split_seed: int = 0
    train_rows: Optional[int] = None
    train_fraction: Optional[float] = None
    dev_rows: Optional[int] = None
    batch_size: int = 32
    eval_batch_size: int = 64
    length_buckets: tuple[int, ...] = ()
    shuffle: bool = True
    text_column: str = "text"
    label_column: str = "class"
    judge_source: Literal["table", "silver"] = "table"

    _bounds: ClassVar = {"dev_fraction": "(0, 1)", "split_seed": "[0, 2147483647]",
                         "train_rows": ">= 1", "train_fraction": "(0, 1)", "dev_rows": ">= 1",
                         "batch_size": ">= 1",
                         "eval_batch_size": ">= 1"}

    def check(self, at: str) -> None:
        check_increasing(self.length_buckets, f"{at}.length_buckets")

    def check_task(self, task: str, at: str) -> None:
        """Refuse the keys that `data.load_sft_pairs` does not read for this task and split."""
        unused = {}
        if self.dev_path is not None:
            unused["dev_fraction"] = f"{at}.dev_path is set, so nothing is split off"
            if self.train_rows is None and self.train_fraction is None:
                unused["split_seed"] = (f"{at}.dev_path is set and {at}.train_rows and "
                                        f"{at}.train_fraction are null, so nothing is split or "
                                        "sampled")
        if task != "judge":
            unused.update(dict.fromkeys(("judge_source", "text_column", "label_column"),
                                        f"only task 'judge' reads it (task is {task!r})"))
        elif self.judge_source == "silver":
            unused.update(dict.fromkeys(("text_column", "label_column"),
                                        "silver judgments have fixed columns"))
        refuse_changed(self, at, unused)


@dataclasses.dataclass(frozen=True)
class PPODataConfig:
    """Situations for PPO: the unique situations of ``train_path`` (rollouts) and of ``dev_path``
    (evaluation, the first ``dev_situations`` of them; null = all)."""

    train_path: str = f"{SHARED_DELTA_CLARIFY}/train.tsv"
    dev_path: Optional[str] = f"{SHARED_DELTA_CLARIFY}/dev.tsv"
    dev_situations: Optional[int] = 500
    eval_batch_size: int = 64
    length_buckets: tuple[int, ...] = ()
    shuffle: bool = True

    _bounds: ClassVar = {"dev_situations": ">= 1", "eval_batch_size": ">= 1"}

    def check(self, at: str) -> None:
        check_increasing(self.length_buckets, f"{at}.length_buckets")
        if self.dev_path is None:
            refuse_changed(self, at, {"dev_situations": f"{at}.dev_path is null"})


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """The moral judge: a T5 read through its class tokens (Delphi), or an encoder classifier.

    ``kind: t5``: the input is ``input_prefix + text``; ``class_prefix`` is teacher-forced and the
    next token's logits over ``class_tokens`` (in the order bad, ok, good) are normalized.
    ``kind: encoder``: a sequence classifier; ``encoder_labels`` are its label names for bad, ok,
    good (looked up in the checkpoint's id2label).
    """

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    kind: Literal["t5", "encoder"] = "t5"
    input_prefix: str = "[moral_single]: "
    class_prefix: str = "<class>"
    class_tokens: tuple[str, ...] = ("-1", "0", "1")
    encoder_labels: tuple[str, ...] = ("bad", "ok", "good")

    def check(self, at: str) -> None:
        for name in ("class_tokens", "encoder_labels"):
            value = getattr(self, name)
            if len(value) != 3 or len(set(value)) != 3:
                raise ConfigError(f"{at}.{name}: need 3 distinct entries (bad, ok, good), got "
                                  f"{list(value)}", key=f"{at}.{name}")
        if self.kind == "t5":  # `delphi.load_judge` passes each kind only its own options
            refuse_changed(self, at, {"encoder_labels": f"{at}.kind is t5"})
        else:
            refuse_changed(self, at, dict.fromkeys(("class_prefix", "class_tokens"),
                                                   f"{at}.kind is encoder"))


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """The settings of `clarifyjax.reward.pipeline.RewardPipeline`, declared once: a PPO run's
    ``rewards:`` section and `clarifyjax score-questions` are both a `RewardConfig`, which is these
    plus the models.

    ``nli_threshold``: as `NLI_THRESHOLD` (null: argmax). ``nli_premise_period``: the NLI
    premise is the situation ending in "." (`text.ensure_period`), as the original's was.
    ``dropped_answer`` (an answer the NLI filter dropped, or an empty one): ``zero_reward`` gives
    the question a reward of ``dropped_reward`` (0: no defeasibility shown; before
    normalization), ``resample`` draws up to ``resample_k`` new answers (at
    ``resample_temperature``, null: `resampling_temperature`; top-p ``resample_top_p``) before
    falling back to zero_reward, ``blank`` fuses an empty answer as the original did.
    Temperatures of 0 decode greedily; ``answer_top_k`` 0 and ``*_top_p`` 1 are off; lengths
    are new tokens (``judgment_max_length``: the judge's judgment text). The fusion model reads
    the situation ending in "." when ``fusion_situation_period`` (as in its training data; the
    original passed it as it was). ``empty_fusion``: a pair with an empty fused situation is
    ``invalid`` (reward ``dropped_reward``), or the judge reads the empty text (``judge``, the
    original). A question is cut to ``max_question_words`` words; ``use_judgment_text: false``
    leaves the judge's judgment out of the answer generator's input. docs/fidelity.md compares
    each setting with the original code.
    """

    nli_threshold: Optional[float] = NLI_THRESHOLD
    nli_premise_period: bool = True
    dropped_answer: Literal["zero_reward", "resample", "blank"] = "zero_reward"
    resample_k: int = 2
    answer_max_length: int = 32
    answer_temperature: float = 0.0
    answer_top_k: int = 0
    answer_top_p: float = 1.0
    resample_temperature: Optional[float] = None
    resample_top_p: float = 1.0
    fusion_max_length: int = 64
    fusion_temperature: float = 0.0
    fusion_situation_period: bool = True
    empty_fusion: Literal["invalid", "judge"] = "invalid"
    judgment_max_length: int = 32
    use_judgment_text: bool = True
    max_question_words: int = 64
    dropped_reward: float = 0.0

    _bounds: ClassVar = {
        "nli_threshold": "(0, 1]", "resample_k": ">= 1", "answer_max_length": ">= 2",
        "answer_temperature": ">= 0", "answer_top_k": ">= 0", "answer_top_p": "(0, 1]",
        "resample_temperature": "> 0", "resample_top_p": "(0, 1]", "fusion_max_length": ">= 2",
        "fusion_temperature": ">= 0", "judgment_max_length": ">= 2", "max_question_words": ">= 1",
        "dropped_reward": "finite"}

    @property
    def resampling_temperature(self) -> float:
        """What resampling draws at: ``resample_temperature``, else the answer temperature, or
        1.0 when answers are greedy (resampling a greedy answer would give it again)."""
        if self.resample_temperature is not None:
            return self.resample_temperature
        return self.answer_temperature or 1.0

    def check(self, at: str) -> None:
        under = f"{at}." if at else ""  # at "": the root (score-questions' RewardConfig)
        if self.dropped_answer != "resample":
            refuse_changed(self, at, dict.fromkeys(
                ("resample_k", "resample_temperature", "resample_top_p"),
                f"{under}dropped_answer is not resample"))
        if self.answer_temperature == 0:
            refuse_changed(self, at, dict.fromkeys(
                ("answer_top_k", "answer_top_p"), f"{under}answer_temperature is 0 (greedy)"))


def _refuse_unused_model_keys(root, roles: Mapping[str, Mapping[str, str]], at: str = "") -> None:
    """For each role (a dotted path below `root`, which is at `at`), refuse the `ModelConfig`
    keys it never reads (`refuse_changed`)."""
    for role, unused in roles.items():
        section = root
        for part in role.split("."):
            section = getattr(section, part) if section is not None else None
        if section is not None:
            refuse_changed(section, f"{at}.{role}" if at else role, unused)


# Per reward model, the `ModelConfig` keys that the reward pipeline never reads.
_REWARD_ROLES = {role.split(".", 1)[1]: unused for role, unused in PPO_UNUSED_MODEL_KEYS.items()
                 if role.startswith("rewards.")}


@dataclasses.dataclass(frozen=True)
class RewardConfig(PipelineConfig):
    """The reward models and the pipeline's settings (`PipelineConfig`, in the same mapping).

    ``nli: null`` turns the NLI filter off.
    """

    answerer: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    fusion: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    judge: JudgeConfig = dataclasses.field(default_factory=JudgeConfig)
    nli: Optional[ModelConfig] = None

    @property
    def pipeline(self) -> PipelineConfig:
        """The pipeline's settings alone."""
        return PipelineConfig(**{f.name: getattr(self, f.name)
                                 for f in dataclasses.fields(PipelineConfig)})

    def check(self, at: str) -> None:
        super().check(at)
        under = f"{at}." if at else ""
        if self.nli is None:
            refuse_changed(self, at, dict.fromkeys(("nli_threshold", "nli_premise_period"),
                                                   f"{under}nli is null (no filter)"))
        if (self.empty_fusion == "judge" and self.judge.kind == "encoder"
                and not self.judge.input_prefix):
            raise ConfigError(f"{under}empty_fusion: 'judge' gives the judge an empty text, and "
                              f"a classifier judge without {under}judge.input_prefix has nothing "
                              "to read; use 'invalid'", key=f"{under}empty_fusion")
        _refuse_unused_model_keys(self, _REWARD_ROLES, at)


@dataclasses.dataclass(frozen=True)
class NormalizerConfig:
    """reward = gain * jsd + bias. The defaults are ClarifyDelphi's, measured for Delphi; with
    ``fit: true`` they are refitted to mean 0, std 1 on ``fit_batches`` rollout batches before
    training (and stored in checkpoints)."""

    gain: float = 4.0725
    bias: float = -0.45726
    fit: bool = True
    fit_batches: int = 8

    # gain > 0: a zero or negative gain flattens or inverts the reward (`RewardNormalizer.from_dict`
    # refuses the same in checkpoints).
    _bounds: ClassVar = {"gain": "> 0", "bias": "finite", "fit_batches": ">= 1"}

    def check(self, at: str) -> None:
        if self.fit:  # `train._fit_normalizer` replaces gain and bias
            refuse_changed(self, at, dict.fromkeys(("gain", "bias"),
                                                   f"{at}.fit is true, so they are refitted"))
        else:
            refuse_changed(self, at, {"fit_batches": f"{at}.fit is false"})


@dataclasses.dataclass(frozen=True)
class PPOHyperparams(ppo.PPOConfig):
    """PPO as in ClarifyDelphi (DESIGN §4): the update's own settings (epochs, minibatches, clip,
    value_clip, vf_coef, gamma, lam, whiten_*: declared with their defaults and ranges by
    `ppo.PPOConfig`, which this section is, so the update takes it as it is), plus the loop's.
    ``batch_size`` situations per step (global); ``epochs`` passes over the batch, each split into
    ``minibatches``. The learning rate is the run's ``optimizer.lr``. ``top_k`` 0 = off; ``top_p``
    1.0 = off. ``value_clip: null``: an unclipped value loss. There is no entropy bonus (the
    original had none). ``kl_target`` / ``kl_horizon`` need ``adaptive_kl``."""

    batch_size: int = 64
    # the KL penalty's coefficient (`ppo.FixedKL`, or `ppo.AdaptiveKL` from it)
    kl_coef: float = 0.15
    adaptive_kl: bool = False
    kl_target: float = 6.0
    kl_horizon: int = 10000
    # sampling the questions (the rollout sampler)
    temperature: float = 0.7
    top_p: float = 0.6
    top_k: int = 0
    max_question_length: int = 30

    _bounds: ClassVar = {
        **ppo.PPOConfig._bounds, "batch_size": ">= 1", "kl_coef": ">= 0", "kl_target": "> 0",
        "kl_horizon": ">= 1", "temperature": "> 0", "top_p": "(0, 1]", "top_k": ">= 0",
        "max_question_length": ">= 2"}

    def check(self, at: str) -> None:
        if self.batch_size % self.minibatches:
            raise ConfigError(f"{at}.minibatches = {self.minibatches} does not divide "
                              f"{at}.batch_size = {self.batch_size}", key=f"{at}.minibatches")
        if not self.adaptive_kl:
            refuse_changed(self, at, dict.fromkeys(("kl_target", "kl_horizon"),
                                                   f"{at}.adaptive_kl is false"))


@dataclasses.dataclass(frozen=True)
class ValueConfig:
    """The value model: a separate T5 with a scalar head on every decoder position.

    ``model: null`` starts from the policy's initial weights (plus a new head), as the original
    did. (A head on the policy's own trunk is not available: `ppo.make_ppo_update` gives the value
    function only the value parameters.)
    """

    model: Optional[ModelConfig] = None


# --------------------------------------------------------------------------- the two run kinds


# SFT tasks trained as an encoder sequence classifier over (situation, question) pairs (the
# target is a class id) rather than as a T5: `train.train_sft` builds `programs.build_classifier`.
CLASSIFIER_TASKS = ("discriminator",)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning of one model on one task's (input, target) pairs: a seq2seq T5, or
    for the tasks in `CLASSIFIER_TASKS` (the discriminator) a Hugging Face sequence classifier
    (DeBERTa-v2/v3, BERT, RoBERTa: ``model.init``) trained with cross-entropy on its classes."""

    kind: Literal["sft"] = "sft"
    task: Literal["question", "wh_question", "answerer", "fusion", "judge",
                  "discriminator"] = "question"
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    mesh: MeshLayout = dataclasses.field(default_factory=MeshLayout)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: SFTDataConfig = dataclasses.field(default_factory=SFTDataConfig)

    def check(self, at: str) -> None:
        if self.task in CLASSIFIER_TASKS:  # `programs.build_classifier` reads the folder alone
            why = f"task is {self.task!r}, trained as an encoder classifier from model.init"
            if self.model.tiny is not None:
                raise ConfigError(f"model.tiny: {why} (a DeBERTa / BERT / RoBERTa "
                                  "sequence-classification folder); give model.init",
                                  key="model.tiny")
            refuse_changed(self.model, "model", {
                "tokenizer": f"{why}, which reads that folder's tokenizer.json",
                "max_target_length": f"{why}: the target is a class id",
                "dropout_rate": f"{why}, which has no dropout"})
        else:
            self.model.check_tokenizer("model")
        self.data.check_task(self.task, "data")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """ClarifyDelphi's PPO run. ``reference: null`` = a frozen copy of the initial policy. One
    optimizer updates the policy and the value model together, as in the original."""

    kind: Literal["ppo"] = "ppo"
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    mesh: MeshLayout = dataclasses.field(default_factory=MeshLayout)
    policy: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    value: ValueConfig = dataclasses.field(default_factory=ValueConfig)
    reference: Optional[ModelConfig] = None
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    normalizer: NormalizerConfig = dataclasses.field(default_factory=NormalizerConfig)
    ppo: PPOHyperparams = dataclasses.field(default_factory=PPOHyperparams)
    # the original's Adam (main.py: lr 1e-5, eps 1e-5, no clipping); docs/fidelity.md
    optimizer: OptimizerConfig = dataclasses.field(
        default_factory=lambda: OptimizerConfig(name="adam", lr=1e-5, eps=1e-5,
                                                max_grad_norm=0.0))
    data: PPODataConfig = dataclasses.field(default_factory=PPODataConfig)

    def check(self, at: str) -> None:
        self.policy.check_tokenizer("policy")
        # (the reward models' keys: RewardConfig.check, as score-questions reads that section too)
        _refuse_unused_model_keys(self, {role: unused for role, unused in
                                         PPO_UNUSED_MODEL_KEYS.items()
                                         if not role.startswith("rewards.")})
        refuse_changed(self.optimizer, "optimizer", dict.fromkeys(
            ("grad_accum", "label_smoothing"), "the PPO loop has one batch per update and no "
            "label loss"))


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
    """The models of `clarifyjax ask`, `interact` and `web` (MODELS.yaml): a PPO run config's
    ``policy:`` (the question generator, a trained folder) and ``rewards:`` sections, in the same
    format, so that a PPO run config (``kind: ppo``) serves as MODELS.yaml too
    (`load_models_config`)."""

    policy: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)

    def check(self, at: str) -> None:
        if self.policy.init is None:
            raise ConfigError("policy.init: the question generator must be a trained folder (a "
                              "random 'tiny' model asks nothing)", key="policy.init")
        _refuse_unused_model_keys(self, {"policy": PPO_UNUSED_MODEL_KEYS["policy"]})


def load_models_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> ModelsConfig:
    """MODELS.yaml: a mapping of ``policy:`` and ``rewards:``, or a whole PPO run config (checked
    as one; its ``policy:`` and ``rewards:`` are read). Raises ConfigError as `load_config`."""
    raw = read_yaml(path)
    source = str(Path(path))
    if isinstance(raw, Mapping) and "kind" in raw:
        cfg = config_from_dict(raw, overrides, source=source)
        if not isinstance(cfg, PPOConfig):
            raise ConfigError(f"{source}: a kind {cfg.kind!r} config names no question generator "
                              "and reward models; give a PPO run config or a mapping of policy: "
                              "and rewards:")
        raw, overrides = {"policy": config_to_dict(cfg.policy),
                          "rewards": config_to_dict(cfg.rewards)}, ()
    return build_root(ModelsConfig, raw, overrides, source=source)


Config = Union[SFTConfig, PPOConfig]
KINDS: dict[str, type] = {"sft": SFTConfig, "ppo": PPOConfig}


# --------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML run config, apply ``a.b.c=value`` overrides, coerce and check every value.

    Raises:
      ConfigError: missing file, YAML syntax error (with line), unknown ``kind``, unknown key
        (naming it, the file and the valid keys at that level), bad value (naming the key, the
        value and the expected type), or an inconsistent setting.
    """
    return config_from_dict(read_yaml(path), overrides, source=str(Path(path)))


def config_from_dict(raw: Mapping[str, Any], overrides: Sequence[str] = (), *,
                     source: str = "<dict>") -> Config:
    """Build a config from nested plain values (as `config_to_dict` returns) plus overrides."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    kind = raw.get("kind")
    for item in overrides:  # an override may change the kind itself
        if item.partition("=")[0].strip() == "kind":
            kind = item.partition("=")[2].strip()
    if kind not in KINDS:
        raise ConfigError(f"{source}: top-level key 'kind' must be one of {sorted(KINDS)}, "
                          f"got {kind!r}")
    return build_root(KINDS[kind], raw, overrides, source=source)
