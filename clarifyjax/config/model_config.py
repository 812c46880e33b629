"""The model sections of run configs: `ModelConfig` (a Hugging Face folder or a `TinyModelSpec`)
and, per PPO role, the `ModelConfig` keys that role never reads (refused at load time).

Split from `clarifyjax.config` (which re-exports these names); standard library + configlib only.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from clarifyjax.config.loader import ConfigError

DTypeName = Literal["float32", "bfloat16", "float16"]
PrecisionName = Literal["default", "high", "highest"]  # `clarifyjax.models.state.PRECISIONS`


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
    """A small random model for CPU runs and tests (names as in Hugging Face's T5Config).

    For an encoder (judge kind "encoder"): d_model = hidden_size, d_ff = intermediate_size,
    num_layers = layers, num_heads = heads; the decoder fields are ignored.
    """

    vocab_size: int = 2000
    d_model: int = 64
    d_ff: int = 128
    num_layers: int = 2
    num_decoder_layers: int | None = None  # None: same as num_layers
    num_heads: int = 4
    d_kv: int | None = None  # None: d_model // num_heads
    feed_forward_proj: Literal["relu", "gated-gelu"] = "gated-gelu"
    tie_word_embeddings: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128

    _bounds: ClassVar = {name: ">= 1" for name in (
        "vocab_size", "d_model", "d_ff", "num_layers", "num_decoder_layers", "num_heads", "d_kv",
        "relative_attention_num_buckets", "relative_attention_max_distance")}

    def check(self, at: str) -> None:
        if self.d_kv is None and self.d_model % self.num_heads:
            raise ConfigError(f"{at}: d_model {self.d_model} is not divisible by num_heads "
                              f"{self.num_heads}; set d_kv")

    def t5_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `clarifyjax.models.t5.T5Config`."""
        kwargs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        kwargs["d_kv"] = self.d_kv if self.d_kv is not None else self.d_model // self.num_heads
        return kwargs

    def encoder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `clarifyjax.models.encoder.EncoderConfig`."""
        return {"vocab_size": self.vocab_size, "hidden_size": self.d_model,
                "num_layers": self.num_layers, "num_heads": self.num_heads,
                "intermediate_size": self.d_ff}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One model: a Hugging Face folder (``init``, safetensors) or a tiny random one (``tiny``).

    ``tokenizer``: a folder with ``spiece.model`` or ``tokenizer.json``; null = the ``init`` folder.
    Lengths are in tokens; inputs and targets longer than them are truncated. ``precision``: of
    the model's matmuls, "default" (JAX's: bfloat16 passes on TPU, TF32 on recent GPUs, whatever
    ``dtype`` says), "high" or "highest" (float32 products, as PyTorch in float32). In a PPO run each
    role reads only some keys (`PPO_UNUSED_MODEL_KEYS`); the others are refused there.
    """

    init: str | None = None
    tiny: TinyModelSpec | None = None
    tokenizer: str | None = None
    dtype: DTypeName = "float32"  # compute
    param_dtype: DTypeName = "float32"  # storage
    precision: PrecisionName = "default"  # of every matmul
    max_input_length: int = 128
    max_target_length: int = 64
    dropout_rate: float | None = None  # None: the checkpoint's (or 0 for a tiny model)

    _shorthand: ClassVar = "init"  # a bare string in YAML means {init: <string>}
    _bounds: ClassVar = {"max_input_length": ">= 2", "max_target_length": ">= 2",
                         "dropout_rate": "[0, 1)"}

    def check(self, at: str) -> None:
        if (self.init is None) == (self.tiny is None):
            raise ConfigError(f"{at}: give exactly one of 'init' (a model folder) and 'tiny' "
                              f"(a random model spec); got init={self.init!r}, "
                              f"tiny={'set' if self.tiny else None}")

    def check_tokenizer(self, at: str) -> None:
        """For the roles that tokenize with their own tokenizer (SFT model, PPO policy)."""
        if self.init is None and self.tokenizer is None:
            raise ConfigError(f"{at}.tokenizer: a tiny model needs a tokenizer folder",
                              key=f"{at}.tokenizer")

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer if self.tokenizer is not None else str(self.init)


_NO_DROPOUT = "PPO runs every model without dropout"
_FIXED = "a reward model must be a trained folder (init)"
_IN_DTYPE = "a reward model is stored in its dtype"
_LENGTHS = ("tokenizer", "max_input_length", "max_target_length")
# Per PPO role, the `ModelConfig` keys that `loops.train_ppo` / `loops.build_reward_fn` never read,
# with the reason (and the key that does the job, if any). They are refused at load time.
PPO_UNUSED_MODEL_KEYS: dict[str, dict[str, str]] = {
    "policy": {"max_target_length": "questions are ppo.sampling.max_new_tokens tokens long",
               "dropout_rate": _NO_DROPOUT},
    "reference": {**dict.fromkeys(_LENGTHS, "the reference scores the policy's own tokens"),
                  "dropout_rate": _NO_DROPOUT},
    "value.model": {**dict.fromkeys(_LENGTHS, "the value model reads the policy's own tokens"),
                    "dropout_rate": _NO_DROPOUT},
    "rewards.answerer": {"tiny": _FIXED, "param_dtype": _IN_DTYPE, "dropout_rate": _NO_DROPOUT,
                         "max_target_length": "answers are rewards.answer_max_length tokens"},
    "rewards.fusion": {"tiny": _FIXED, "param_dtype": _IN_DTYPE, "dropout_rate": _NO_DROPOUT,
                       "max_target_length": "fusions are rewards.fusion_max_length tokens"},
    "rewards.judge.model": {"tiny": _FIXED, "param_dtype": _IN_DTYPE, "dropout_rate": _NO_DROPOUT,
                            "tokenizer": "the judge reads its own folder's tokenizer",
                            "max_target_length": "the judge reads one class token"},
    "rewards.nli": {"tiny": _FIXED, "param_dtype": _IN_DTYPE, "dropout_rate": _NO_DROPOUT,
                    "tokenizer": "the NLI filter reads its own folder's tokenizer.json",
                    "max_target_length": "an NLI classifier generates nothing"},
}
