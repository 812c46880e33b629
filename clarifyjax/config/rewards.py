"""The reward pipeline's settings, as a run config's sections: the judge (`JudgeConfig`), the
pipeline's own settings (`PipelineConfig`), the reward models (`RewardConfig`, a PPO run's
``rewards:`` and `score-questions`' config) and the reward normalizer (`NormalizerConfig`).

They are declared here, below `clarifyjax.reward`, which consumes them; `clarifyjax.config`
re-exports them.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal
from collections.abc import Mapping

from clarifyjax.config.loader import ConfigError, refuse_changed
from clarifyjax.config.model_config import PPO_UNUSED_MODEL_KEYS, ModelConfig

# The NLI filter's default decision, for every entry point (`nli.NLIFilter`, `PipelineConfig` and
# so `RewardConfig` and `clarifyjax score-questions`): None = drop an answer when the classifier's
# argmax label is entailment or contradiction (the paper's "answers the situation entails or
# contradicts"); a number t = drop when P(ent) + P(contra) >= t. It lives here, below nli.py,
# which imports it.
NLI_THRESHOLD: float | None = None


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
        if self.kind == "t5":  # `judge.load_judge` passes each kind only its own options
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

    nli_threshold: float | None = NLI_THRESHOLD
    nli_premise_period: bool = True
    dropped_answer: Literal["zero_reward", "resample", "blank"] = "zero_reward"
    resample_k: int = 2
    answer_max_length: int = 32
    answer_temperature: float = 0.0
    answer_top_k: int = 0
    answer_top_p: float = 1.0
    resample_temperature: float | None = None
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


def refuse_unused_model_keys(root, roles: Mapping[str, Mapping[str, str]], at: str = "") -> None:
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
    nli: ModelConfig | None = None

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
        refuse_unused_model_keys(self, _REWARD_ROLES, at)


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
        if self.fit:  # `ppo_eval.fit_normalizer` replaces gain and bias
            refuse_changed(self, at, dict.fromkeys(("gain", "bias"),
                                                   f"{at}.fit is true, so they are refitted"))
        else:
            refuse_changed(self, at, {"fit_batches": f"{at}.fit is false"})
