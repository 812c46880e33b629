"""Run configs: the generic loader (`loader`), model sections (`model_config`), the
run schema (`schema`), and the configs of `score-questions` (`score`) and `evaluate` (`evaluate`).

The run schema is re-exported here: `from clarifyjax.config import load_config`."""
from __future__ import annotations

from clarifyjax.config.schema import (  # noqa: F401  (the package's public API)
    ConfigError, config_to_dict, dump_config, parse_overrides, save_config, load_config,
    config_from_dict, Config, KINDS, DTypeName, SHARED_DELTA_CLARIFY, RunConfig,
    MeshLayout, TinyModelSpec, ModelConfig, OptimizerConfig, SFTDataConfig, PPODataConfig,
    JudgeConfig, PipelineConfig, RewardConfig, NormalizerConfig, PPOHyperparams, PolicyConfig, ValueConfig,
    SFTConfig, PPOConfig, NLI_THRESHOLD, ModelsConfig, load_models_config, CLASSIFIER_TASKS,
)

__all__ = [
    "ConfigError", "config_to_dict", "dump_config", "parse_overrides", "save_config", "load_config",
    "config_from_dict", "Config", "KINDS", "DTypeName", "SHARED_DELTA_CLARIFY", "RunConfig",
    "MeshLayout", "TinyModelSpec", "ModelConfig", "OptimizerConfig", "SFTDataConfig", "PPODataConfig",
    "JudgeConfig", "PipelineConfig", "RewardConfig", "NormalizerConfig", "PPOHyperparams", "PolicyConfig",
    "ValueConfig",
    "SFTConfig", "PPOConfig", "NLI_THRESHOLD", "ModelsConfig", "load_models_config", "CLASSIFIER_TASKS",
]
