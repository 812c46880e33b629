"""Run configurations: `SFTConfig` (``kind: sft``, one seq2seq model) and `PPOConfig` (``kind: ppo``,
ClarifyDelphi's PPO), nested frozen dataclasses read from YAML with ``a.b.c=value`` overrides.

    cfg = load_config("clarifyjax/presets/ppo_tiny.yaml", ["ppo.batch_size=8", "run.steps=20"])

Each setting is declared once: a section a lower module consumes is that module's dataclass
(``mesh:`` is `sharding.MeshConfig`, ``ppo:`` extends `ppo.PPOUpdateConfig`), so importing this
module imports JAX; `clarifyjax.config.loader` (the generic machinery) does not."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, ClassVar, Literal
from collections.abc import Mapping, Sequence

from clarifyjax.rl import ppo
from clarifyjax.config.model_config import (PPO_UNUSED_MODEL_KEYS, DTypeName, ModelConfig,
                                      TinyModelSpec)
from clarifyjax.config.loader import (ConfigError, build_root, check_increasing, config_to_dict,
                                  dump_config, parse_overrides, read_yaml, refuse_changed,
                                  save_config)
from clarifyjax.config.rewards import (NLI_THRESHOLD, JudgeConfig, NormalizerConfig,  # noqa: F401
                                       PipelineConfig, RewardConfig, refuse_unused_model_keys)
from clarifyjax.core.sharding import MeshConfig as MeshLayout  # the ``mesh:`` section
from clarifyjax.files.tables import DataError, resolve_data_path
from clarifyjax.text.generator import Sampling

__all__ = [
    "ConfigError", "config_to_dict", "dump_config", "parse_overrides", "save_config",
    "load_config", "config_from_dict", "Config", "KINDS", "DTypeName", "SHARED_DELTA_CLARIFY",
    "RunConfig", "MeshLayout", "TinyModelSpec", "ModelConfig", "OptimizerConfig", "SFTDataConfig",
    "PPODataConfig", "JudgeConfig", "PipelineConfig", "RewardConfig", "NormalizerConfig",
    "PPOHyperparams", "PolicyConfig", "ValueConfig", "SFTConfig", "PPOConfig", "NLI_THRESHOLD",
    "ModelsConfig", "load_models_config", "CLASSIFIER_TASKS",
]

SHARED_DELTA_CLARIFY = "delta-clarify"  # in the data folder (`clarifyjax.files.tables.data_dir`)

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
    output_dir: str | None = None
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

    Relative paths are read from the working directory, else from the data folder (--data-dir); a
    path that exists in neither stops the run (`clarifyjax.files.tables.resolve_data_path`: no fallback). ``dev_path:
    null``: a seeded split of ``train_path`` (grouped by situation, so that no dev situation is seen
    in training), ``dev_fraction`` of the groups. ``train_fraction`` keeps that share of the
    training situations (a seeded sample of whole groups: the data-size ablation; null: all),
    ``train_rows`` then N train pairs (a seeded sample), ``dev_rows`` the first N dev pairs.
    ``batch_size`` is global (all hosts). ``length_buckets``: padded lengths of batches (empty:
    powers of two), capped by the model's maximum lengths. Judge files are (text, class) tables;
    ``text_column`` / ``label_column`` name their columns (labels 1/0/-1 or good/ok/bad).
    ``judge_source: silver`` derives judge pairs from sc_dev_questions_gpt.tsv instead
    (`clarifyjax.data.silver_judge_rows`). Discriminator files are (situation, question, label)
    tables made by `clarifyjax discriminator-data` (`clarifyjax.data.discriminator`).
    """

    train_path: str = f"{SHARED_DELTA_CLARIFY}/train.tsv"
    dev_path: str | None = f"{SHARED_DELTA_CLARIFY}/dev.tsv"
    dev_fraction: float = 0.1
    split_seed: int = 0
    train_rows: int | None = None
    train_fraction: float | None = None
    dev_rows: int | None = None
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
        if self.train_rows is not None and self.train_rows < self.batch_size:
            raise ConfigError(f"{at}.train_rows: {self.train_rows} pairs are fewer than one batch "
                              f"({at}.batch_size = {self.batch_size})", key=f"{at}.train_rows")

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
    dev_path: str | None = f"{SHARED_DELTA_CLARIFY}/dev.tsv"
    dev_situations: int | None = 500
    eval_batch_size: int = 64
    length_buckets: tuple[int, ...] = ()
    shuffle: bool = True

    _bounds: ClassVar = {"dev_situations": ">= 1", "eval_batch_size": ">= 1"}

    def check(self, at: str) -> None:
        check_increasing(self.length_buckets, f"{at}.length_buckets")
        if self.dev_path is None:
            refuse_changed(self, at, {"dev_situations": f"{at}.dev_path is null"})


# The rollouts' sampling (the paper: nucleus sampling, top-p 0.6, temperature 0.7); questions of
# at most 30 new tokens
PPO_SAMPLING = Sampling(max_new_tokens=30, temperature=0.7, top_k=0, top_p=0.6)
# the keys a `Sampling` section replaced, for the one-line error an old config gets
MOVED_TO_SAMPLING = {"temperature": "sampling.temperature", "top_k": "sampling.top_k",
                     "top_p": "sampling.top_p", "max_question_length": "sampling.max_new_tokens"}


def refuse_unused_sampling(s: Sampling, at: str, reader: str) -> None:
    """Stop strings and max_total_tokens are `sage-jax run`'s: refused where `reader` (a seq2seq
    sampler) would ignore them."""
    for name, value in (("stop", s.stop), ("max_total_tokens", s.max_total_tokens)):
        if value not in ((), None):
            raise ConfigError(f"{at}.{name} = {value!r} is not used: {reader} have no {name}; "
                              "remove it", key=f"{at}.{name}")


@dataclasses.dataclass(frozen=True)
class PPOHyperparams(ppo.PPOUpdateConfig):
    """PPO as in ClarifyDelphi (docs/originals.md, ClarifyDelphi): the update's own settings (epochs, minibatches, clip,
    value_clip, vf_coef, gamma, lam, whiten_*: declared with their defaults and ranges by
    `ppo.PPOUpdateConfig`, which this section is, so the update takes it as it is), plus the loop's.
    ``batch_size`` situations per step (global); ``epochs`` passes over the batch, each split into
    ``minibatches``. The learning rate is the run's ``optimizer.lr``. ``sampling``: how the
    rollouts sample the questions (a section given in part keeps the other defaults;
    ``min_new_tokens`` null: `rollout.MIN_QUESTION_TOKENS`). ``value_clip: null``: an unclipped
    value loss. ``entropy_coef`` 0: no entropy bonus (the original had none). ``kl_target`` /
    ``kl_horizon`` need ``adaptive_kl``."""

    batch_size: int = 64
    # the KL penalty's coefficient (`ppo.FixedKL`, or `ppo.AdaptiveKL` from it); for grpo, the
    # beta of its k3 KL loss term
    kl_coef: float = 0.15
    adaptive_kl: bool = False
    kl_target: float = 6.0
    kl_horizon: int = 10000
    # sampling the questions (the rollout sampler)
    sampling: Sampling = PPO_SAMPLING
    # questions sampled per situation in a rollout batch (`batch_size` counts questions); with
    # more than one, each question's reward is paid relative to the mean of its situation's others
    # (a leave-one-out baseline), so that the situation's own difficulty cancels out; rloo and
    # grpo (`algorithm`) need at least 2, their group
    samples_per_situation: int = 1
    # the dev evaluation: 0 = one greedy question per situation; k = k questions sampled as in
    # training, each situation scored by their mean (the quantity PPO raises)
    eval_samples: int = 0
    # when it runs: before_training (step 0, then after every run.eval_every-th update and the
    # last) or after_first_update (after updates 1, 1 + eval_every, 1 + 2 eval_every, ...: the
    # original's `step_num % eval_interval == 0` on 0-based step numbers, checked after each one)
    eval_schedule: Literal["before_training", "after_first_update"] = "before_training"
    # the text the reward models read: questions decoded with transformers' clean_up_tokenization
    # (" ?" -> "?", as the original's batch_decode(clean_up_tokenization_spaces=True)), and the
    # situations as the data file gives them ("source") or decoded back from the policy's input
    # ids ("decoded", the original's `query/text`), cleaned up likewise when the first is true
    clean_up_tokenization_spaces: bool = False
    reward_situations: Literal["source", "decoded"] = "source"
    # which distribution the PPO ratio, the KL penalty and the entropy are of: "model" (temperature
    # 1, untruncated: the original's, though its rollouts sample at 0.7 with top-p 0.6) or
    # "sampling" (the rollouts' own: their temperature; needs top_k 0 and top_p 1, see docs/ppo.md)
    logprobs: Literal["model", "sampling"] = "model"

    _bounds: ClassVar = {
        **ppo.PPOUpdateConfig._bounds, "batch_size": ">= 1", "kl_coef": ">= 0", "kl_target": "> 0",
        "kl_horizon": ">= 1", "samples_per_situation": ">= 1", "eval_samples": ">= 0"}
    _moved: ClassVar = MOVED_TO_SAMPLING

    def __post_init__(self):
        object.__setattr__(self, "sampling", self.sampling.with_defaults(PPO_SAMPLING))

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the log-probs the update reads (``logprobs``)."""
        return float(self.sampling.temperature) if self.logprobs == "sampling" else 1.0

    def check(self, at: str) -> None:
        s = self.sampling
        if s.temperature == 0:
            raise ConfigError(f"{at}.sampling.temperature = 0 (greedy): the rollouts must sample; "
                              "give a temperature > 0", key=f"{at}.sampling.temperature")
        if s.max_new_tokens < 2:
            raise ConfigError(f"{at}.sampling.max_new_tokens = {s.max_new_tokens}: must be >= 2",
                              key=f"{at}.sampling.max_new_tokens")
        refuse_unused_sampling(s, f"{at}.sampling", "the rollouts")
        if self.batch_size % self.minibatches:
            raise ConfigError(f"{at}.minibatches = {self.minibatches} does not divide "
                              f"{at}.batch_size = {self.batch_size}", key=f"{at}.minibatches")
        if self.batch_size % self.samples_per_situation:
            raise ConfigError(f"{at}.samples_per_situation = {self.samples_per_situation} does not "
                              f"divide {at}.batch_size = {self.batch_size} (questions per step)",
                              key=f"{at}.samples_per_situation")
        if self.logprobs == "sampling" and (s.top_k or s.top_p < 1.0):
            raise ConfigError(f"{at}.logprobs = sampling needs untruncated rollouts, but "
                              f"{at}.sampling has top_k {s.top_k}, top_p {s.top_p}: give top_k 0 "
                              "and top_p 1.0", key=f"{at}.logprobs")
        if not self.adaptive_kl:
            refuse_changed(self, at, dict.fromkeys(("kl_target", "kl_horizon"),
                                                   f"{at}.adaptive_kl is false"))
        if self.algorithm != "ppo":
            no_value = f"{at}.algorithm = {self.algorithm} has no value model and no GAE"
            unused = dict.fromkeys(("value_clip", "vf_coef", "gamma", "lam", "whiten_rewards"),
                                   no_value)
            if self.algorithm == "grpo":  # its group-normalised advantages are not whitened again
                unused["whiten_advantages"] = f"{at}.algorithm = grpo normalises by the group's std"
            refuse_changed(self, at, unused)
        if self.algorithm != "ppo" and self.samples_per_situation < 2:
            raise ConfigError(f"{at}.algorithm = {self.algorithm} needs {at}.samples_per_situation "
                              f">= 2 (its baseline is the other samples of the situation), got "
                              f"{self.samples_per_situation}", key=f"{at}.samples_per_situation")


@dataclasses.dataclass(frozen=True)
class PolicyConfig(ModelConfig):
    """A PPO run's question policy: a `ModelConfig` (a T5, or a decoder-only folder, told apart
    by its config.json ``model_type``) and a decoder-only policy's prompt (`rl.prompts`, needed by
    it, refused for a T5): ``prompt_format`` chat (the folder's chat template around one user
    message, ``prompt_template``) or plain (the template as it is); a template holds
    ``{situation}``, null is `rl.prompts.DEFAULT_TEMPLATES`'s."""

    prompt_format: Literal["chat", "plain"] | None = None
    prompt_template: str | None = None

    def check(self, at: str) -> None:
        super().check(at)
        if self.prompt_format is None:
            refuse_changed(self, at, {"prompt_template": f"{at}.prompt_format is null (a T5)"})
        elif self.tiny is not None:
            raise ConfigError(f"{at}.prompt_format: a tiny random policy is a T5; a decoder-only "
                              f"policy is a folder ({at}.init)", key=f"{at}.prompt_format")
        if self.prompt_template is not None and "{situation}" not in self.prompt_template:
            raise ConfigError(f"{at}.prompt_template: {self.prompt_template!r} has no "
                              "{situation}", key=f"{at}.prompt_template")


@dataclasses.dataclass(frozen=True)
class ValueConfig:
    """The value model: a separate model of the policy's family with a scalar head on every
    response position (a T5, or a decoder-only trunk: `rl.value`). ``model: null`` starts from
    the policy's initial weights (plus a new head), as the original did. (A head on the policy's
    own trunk is not available: `ppo.make_ppo_update` gives the value function only the value
    parameters; docs/ppo.md says why.)"""

    model: ModelConfig | None = None
    # the scalar head's start: zero (ours: V = 0 until it learns, so it adds no noise to the
    # advantages), torch (the original's nn.Linear default, uniform +-1/sqrt(d)) or normal
    head_init: Literal["zero", "torch", "normal"] = "zero"


# --------------------------------------------------------------------------- the two run kinds


# SFT tasks trained as an encoder sequence classifier over (situation, question) pairs (the
# target is a class id) rather than as a T5: `loops.train_sft` builds `builders.build_classifier`.
CLASSIFIER_TASKS = ("discriminator",)


def _same_file(a: str, b: str) -> bool:
    """Whether two data paths name one file (as the run finds them; as written when not found)."""
    try:
        return resolve_data_path(a).resolve() == resolve_data_path(b).resolve()
    except DataError:
        return os.path.normpath(os.path.expanduser(a)) == os.path.normpath(os.path.expanduser(b))


def check_steps_and_files(cfg: SFTConfig | PPOConfig) -> None:
    """The cross-checks of every training run: a warm-up longer than the run never reaches the
    learning rate, and a dev file that is the train file evaluates on training data."""
    warmup, steps = cfg.optimizer.warmup_steps, cfg.run.steps
    if warmup > steps:
        raise ConfigError(f"optimizer.warmup_steps: {warmup} is more than run.steps {steps}; the learning rate "
                          "would never reach optimizer.lr", key="optimizer.warmup_steps")
    data = cfg.data
    if data.dev_path is not None and _same_file(data.train_path, data.dev_path):
        raise ConfigError(f"data.dev_path: {data.dev_path} is the same file as data.train_path "
                          f"({data.train_path}); the run would be evaluated on its training data", key="data.dev_path")


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
        if self.task in CLASSIFIER_TASKS:  # `builders.build_classifier` reads the folder alone
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
        check_steps_and_files(self)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """ClarifyDelphi's PPO run. ``reference: null`` = a frozen copy of the initial policy. One
    optimizer updates the policy and the value model together, as in the original."""

    kind: Literal["ppo"] = "ppo"
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    mesh: MeshLayout = dataclasses.field(default_factory=MeshLayout)
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    value: ValueConfig = dataclasses.field(default_factory=ValueConfig)
    reference: ModelConfig | None = None
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
        if self.ppo.algorithm != "ppo":
            refuse_changed(self.value, "value", dict.fromkeys(
                ("model", "head_init"), f"ppo.algorithm = {self.ppo.algorithm} has no value model"))
        # (the reward models' keys: RewardConfig.check, as score-questions reads that section too)
        refuse_unused_model_keys(self, {role: unused for role, unused in
                                         PPO_UNUSED_MODEL_KEYS.items()
                                         if not role.startswith("rewards.")})
        refuse_changed(self.optimizer, "optimizer", dict.fromkeys(
            ("grad_accum", "label_smoothing"), "the PPO loop has one batch per update and no "
            "label loss"))
        check_steps_and_files(self)


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
    """The models of `clarifyjax ask`, `interact` and `web` (MODELS.yaml): a PPO run config's
    ``policy:`` (the question generator, a trained folder) and ``rewards:`` sections, in the same
    format, so that a PPO run config (``kind: ppo``) serves as MODELS.yaml too
    (`load_models_config`)."""

    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)

    def check(self, at: str) -> None:
        refuse_changed(self.policy, "policy", dict.fromkeys(
            ("prompt_format", "prompt_template"), "ask, interact and web run a T5 question "
            "generator"))
        if self.policy.init is None:
            raise ConfigError("policy.init: the question generator must be a trained folder (a "
                              "random 'tiny' model asks nothing)", key="policy.init")
        refuse_unused_model_keys(self, {"policy": PPO_UNUSED_MODEL_KEYS["policy"]})


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


Config = SFTConfig | PPOConfig
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
