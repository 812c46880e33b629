"""The config of `sage-jax run` (YAML + ``key=value`` overrides, read by `clarifyjax.config.loader`):
``preset`` (`sage_jax.run.presets`), ``questions``, ``out``, ``limit``, ``seed``, the
``paraphrase`` source and generator, the ``models`` under test, the ``rot`` generator and
``score`` settings (the preset sage_jax/presets/run_local.yaml is a whole one). Every number has a range; an
unknown key or a bad value is one line naming the key and the file (or the override). Nothing
here imports JAX."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import ClassVar, Literal
from collections.abc import Sequence

from clarifyjax.config.loader import ConfigError, build_root, read_yaml
from clarifyjax.text.generator import Sampling

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# The request arguments `sage-jax run` may send to an OpenAI-compatible endpoint (besides model and
# prompt / messages); `GeneratorConfig.accepts` lists those a target accepts.
REQUEST_ARGUMENTS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n")
# Those of them in OpenAI's documented chat-completions request body (platform.openai.com API
# reference, "Create chat completion"): top_k is not, and OpenAI answers an argument it does not
# know with 400 "Unrecognized request argument supplied" (not retried).
OPENAI_CHAT_ARGUMENTS = ("max_tokens", "temperature", "top_p", "seed", "stop", "n")


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """Where texts come from. local: `model` is a causal LM folder; openai: `model` is the
    endpoint's model name at `base_url`; file: `model` is a long-format file and `column` the
    column of its texts (model_output for answers, rot for rules of thumb), `prompt_column` the
    column of the question each answer was given (paraphrased; question for files that asked the
    question itself, as the temperature files); callable: a Python function that `sage_jax.score`
    registers under the name `model` (not for config files).

    bos (local): add the tokenizer's special tokens (BOS) to a raw prompt; None: the preset's.
    accepts (openai): the request arguments the endpoint accepts, of `REQUEST_ARGUMENTS`; only
    these are ever sent. None: `OPENAI_CHAT_ARGUMENTS` for api chat, all of them for api
    completions (vLLM and `clarifyjax serve` take top_k). A run's config.yaml records what it
    sent (preset code narrows a chat target's to temperature, as the reference's GPT call).
    generation_config (openai, api completions): the model's folder, or any folder holding its
    generation_config.json; presets code and paper sample the endpoint at that file's temperature
    and top-p, as transformers' `generate` would the local model (None: 1.0 and 1.0).
    timeout_s (openai, callable): how long a request may go unanswered, or a function call run; a
    Retry-After longer than it fails the request at once (`generators`)."""

    kind: Literal["local", "openai", "file", "callable"] = "local"
    model: str = ""
    base_url: str | None = None
    api: Literal["completions", "chat"] = "completions"
    api_key_env: str | None = None  # the NAME of the variable holding the key, never the key
    concurrency: int = 8
    timeout_s: float = 120.0
    max_retries: int = 5
    chat_template: Literal["model", "vicuna_v1.1"] = "model"  # local: how chat prompts are rendered
    dtype: Literal["float32", "bfloat16"] = "float32"
    column: str = "model_output"
    prompt_column: str = "paraphrased"  # file: the column of the text each row answered
    bos: bool | None = None
    accepts: tuple[str, ...] | None = None
    generation_config: str | None = None

    _bounds: ClassVar = {"concurrency": "[1, 1024]", "timeout_s": "(0, 86400]", "max_retries": "[0, 100]"}

    def check(self, at: str) -> None:
        if not self.model.strip():
            raise ConfigError(f"{at}.model: must name the model (a folder, an endpoint's model, or a file)",
                              key=f"{at}.model")
        if self.kind == "openai" and not (self.base_url or "").strip():
            raise ConfigError(f"{at}.base_url: an openai generator needs the endpoint's URL "
                              "(e.g. http://127.0.0.1:8000/v1)", key=f"{at}.base_url")
        if self.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ConfigError(f"{at}.api_key_env: must be the name of an environment variable, got a value "
                              "that is not one (the key itself belongs in the environment)",
                              key=f"{at}.api_key_env")
        if self.generation_config is not None and not (self.kind == "openai" and self.api == "completions"):
            raise ConfigError(f"{at}.generation_config: only for an openai generator with api completions (a local "
                              "model's own generation_config.json is read; a chat call is sent its own temperature)",
                              key=f"{at}.generation_config")
        if self.generation_config is not None and not Path(self.generation_config).is_dir():
            raise ConfigError(f"{at}.generation_config: {self.generation_config}: not a folder (give the model's "
                              "folder, or one holding its generation_config.json)", key=f"{at}.generation_config")
        unknown = [a for a in self.accepts or () if a not in REQUEST_ARGUMENTS]
        if unknown:
            raise ConfigError(f"{at}.accepts: {unknown[0]!r} is not a request argument sage-jax run sends; list "
                              f"those of {', '.join(REQUEST_ARGUMENTS)} that the endpoint accepts",
                              key=f"{at}.accepts")


@dataclasses.dataclass(frozen=True)
class ScorerConfig:
    """ParaScore's model (bert-base-uncased in SaGE) and settings (sage_jax.parascore)."""

    model: str = ""
    layer: int | None = None
    gamma: float = 0.35
    omega: float = 0.05

    _bounds: ClassVar = {"layer": "[0, 1000]", "gamma": "(0, 1]", "omega": "[0, 10]"}


@dataclasses.dataclass(frozen=True)
class ParaphraseConfig:
    source: Literal["generate", "file"] = "generate"
    paraphrase_column: str = "paraphrased"  # source: file
    generator: GeneratorConfig | None = None
    scorer: ScorerConfig = ScorerConfig()
    sampling: Sampling = Sampling()
    count: int = 5
    threshold: float | None = None  # None: the preset's (code 0.6, paper 0.8)
    max_attempts: int = 5
    batch_size: int = 8

    _bounds: ClassVar = {"count": "[2, 100]", "threshold": "[-10, 10]", "max_attempts": "[1, 1000]",
                         "batch_size": "[1, 4096]"}

    def check(self, at: str) -> None:
        if self.source == "generate" and self.generator is None:
            raise ConfigError(f"{at}.generator: paraphrase.source generate needs a generator",
                              key=f"{at}.generator")
        if self.source == "generate" and self.generator.kind == "file":
            raise ConfigError(f"{at}.generator.kind: paraphrases of a file are read with "
                              f"{at}.source: file (the questions file's paraphrase column)",
                              key=f"{at}.generator.kind")


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """One model under test."""

    name: str = ""
    generator: GeneratorConfig = GeneratorConfig()
    sampling: Sampling = Sampling()
    chat: bool = False  # send the reference's chat messages (its GPT prompt) instead of the raw prompt
    guided: bool = False  # answer with improve.py's prompt holding the question's rule of thumb (guide_column)

    def check(self, at: str) -> None:
        if not MODEL_NAME.match(self.name):
            raise ConfigError(f"{at}.name: {self.name!r} must be 1-100 letters, digits, '.', '_' or '-' "
                              "(it names the output files)", key=f"{at}.name")


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """The answer and RoT stages' shared settings."""

    generator: GeneratorConfig | None = None  # rot only: the RoT writer (answers use each model's)
    sampling: Sampling = Sampling()
    samples: int = 1
    max_attempts: int = 5
    batch_size: int = 16

    _bounds: ClassVar = {"samples": "[1, 100]", "max_attempts": "[1, 1000]", "batch_size": "[1, 4096]"}


@dataclasses.dataclass(frozen=True)
class ScoreConfig:
    """The scoring models: a folder, a Hugging Face name found in the local cache, or
    all-MiniLM-L6-v2 (the offline package). None: the preset's (code: the reference's
    sentence-transformers/stsb-distilroberta-base-v2, and bert-base-uncased at layer 9 for
    BERTScore; ours: all-MiniLM-L6-v2 for both); a BERTScore layer left None with a model given is
    bert-score's default layer for it, else its last. ``lexical_tokenizer``: BLEU / ROUGE-L on the
    reference's tokens (English; a warning names the questions they cannot read) or on
    `sage_jax.lexical.unicode_tokens` (every script)."""

    embedder: str | None = None
    alpha: float = 10.0
    blend_weight: float = 0.8
    bertscore: bool = True
    bertscore_model: str | None = None
    bertscore_layer: int | None = None
    lexical: bool = True
    lexical_tokenizer: Literal["reference", "unicode"] = "reference"  # BLEU / ROUGE-L tokens
    batch_size: int = 64

    _bounds: ClassVar = {"alpha": "(0, 1e6]", "blend_weight": "[0, 1]", "batch_size": "[1, 4096]",
                         "bertscore_layer": "[0, 1000]"}


@dataclasses.dataclass(frozen=True)
class HostsConfig:
    """Multi-host runs: process i of n takes questions i, i + n, ... (None: from jax.distributed)."""

    process_index: int | None = None
    process_count: int | None = None

    _bounds: ClassVar = {"process_index": ">= 0", "process_count": ">= 1"}

    def check(self, at: str) -> None:
        if (self.process_index is None) != (self.process_count is None):
            raise ConfigError(f"{at}: set both process_index and process_count, or neither", key=at)
        if self.process_index is not None and self.process_index >= self.process_count:
            raise ConfigError(f"{at}.process_index: {self.process_index} must be below process_count "
                              f"{self.process_count}", key=f"{at}.process_index")


@dataclasses.dataclass(frozen=True)
class SageRunConfig:
    questions: str = ""
    out: str = ""
    preset: Literal["ours", "code", "paper"] = "ours"
    question_id_column: str = "question_id"
    question_column: str = "question"
    guide_column: str | None = None  # a rule of thumb per question, for targets with guided: true
    limit: int | None = None
    seed: int = 0
    quiet: bool = False
    paraphrase: ParaphraseConfig = ParaphraseConfig()
    models: tuple[TargetConfig, ...] = ()
    answer: StageConfig = StageConfig()
    rot: StageConfig = StageConfig()
    score: ScoreConfig = ScoreConfig()
    hosts: HostsConfig = HostsConfig()

    _bounds: ClassVar = {"limit": ">= 1", "seed": "[0, 4294967295]"}

    def check(self, at: str) -> None:
        for key in ("questions", "out"):
            if not getattr(self, key).strip():
                raise ConfigError(f"{key}: must name a {'file' if key == 'questions' else 'folder'}", key=key)
        if not self.models:
            raise ConfigError("models: name at least one model under test", key="models")
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"models: {twice[0]!r} is named twice; each model needs its own name", key="models")
        guided = [i for i, m in enumerate(self.models) if m.guided]
        if guided and not (self.guide_column or "").strip():
            raise ConfigError(f"models[{guided[0]}].guided: a guided model needs guide_column, the questions "
                              "file's column of rules of thumb", key=f"models[{guided[0]}].guided")


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> SageRunConfig:
    """The config of `path` with overrides applied. Paths are as in every config of the project:
    data files (`questions`, a recorded generator's file) are found by
    `clarifyjax.files.tables.resolve_data_path` (the working folder, else the data folder: --data-dir),
    folders relative to the working folder."""
    return build_root(SageRunConfig, read_yaml(path), overrides, source=str(path))
