"""What `clarifyjax ask`, `interact` and `web` share on the command line: MODELS.yaml (with its
``KEY=VALUE`` overrides), how questions are drawn, and the models loaded from them, with every
error a one-line `ConfigError` naming the file and key. Imports no JAX until models are loaded,
so that ``--help`` stays fast (as `clarifyjax.config.score` for score-questions)."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from clarifyjax.config.loader import ConfigError, parse_overrides
from clarifyjax.core.ranges import number_type
from clarifyjax.files.presets import config_type
from clarifyjax.config import load_models_config
from clarifyjax.app.clarifier import QUESTION_SAMPLING, Clarifier
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.text.formats import TextFormatError


def add_models_options(p: argparse.ArgumentParser, *, candidates: bool = False) -> None:
    """MODELS.yaml, its KEY=VALUE overrides, the question sampling and the seed."""
    p.add_argument("models", type=config_type(), metavar="MODELS.yaml",
                   help="policy: (the question generator) and rewards: (answerer, fusion, nli, "
                        "judge) in a PPO run config's format; a whole PPO run config (a file or a "
                        "preset's name) works too")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                   help="MODELS.yaml overrides, e.g. rewards.fusion_max_length=48")
    q = p.add_argument_group("questions")
    q.add_argument("--top-p", type=number_type(float, "(0, 1]"), default=0.6,
                   help="nucleus sampling of the questions (0.6, as in PPO)")
    q.add_argument("--temperature", type=number_type(float, "> 0"), default=0.7)
    q.add_argument("--max-question-length", type=number_type(int, "[2, 512]"), default=30,
                   help="tokens")
    if candidates:
        q.add_argument("--candidates", type=number_type(int, "[1, 64]"), default=1,
                       help="sample N questions per situation and keep the one with the highest "
                            "reward (JSD of the imagined answers' judgments)")
    p.add_argument("--seed", type=number_type(int, f"[0, {2**32 - 1}]"), default=0)


def load_models(args: argparse.Namespace):
    """The `config.ModelsConfig` of MODELS.yaml, its folders checked; before any model loads."""
    cfg = load_models_config(args.models, parse_overrides(args.overrides))
    r = cfg.rewards
    folders = {"policy.init": cfg.policy.init, "rewards.answerer.init": r.answerer.init,
               "rewards.fusion.init": r.fusion.init, "rewards.judge.model.init": r.judge.model.init,
               "rewards.nli.init": None if r.nli is None else r.nli.init}
    for key, folder in folders.items():
        if key != "rewards.nli.init" and folder is None:
            raise ConfigError(f"{args.models}: {key} is not set; every model must be a trained "
                              "folder", key=key)
        if folder is not None and not Path(folder).is_dir():
            raise ConfigError(f"{args.models}: {key} {folder}: " + (
                "not a folder" if Path(folder).exists() else "no such folder"), key=key)
    return cfg


def load_clarifier(args: argparse.Namespace, cfg):
    """The `clarify.Clarifier` of `cfg` with the command line's question sampling."""
    sampling = dataclasses.replace(QUESTION_SAMPLING, temperature=args.temperature,
                                   top_p=args.top_p, max_new_tokens=args.max_question_length)
    try:
        return Clarifier.from_config(cfg, sampling, getattr(args, "candidates", 1))
    except (CheckpointError, ConfigError, TextFormatError):
        raise
    except ValueError as e:  # e.g. a max_input_length beyond a model's positions
        raise ConfigError(f"the models of {args.models} do not fit: {e}") from e

