"""MODELS.yaml of tiny random models for `clarifyjax ask`, `interact` and `web` (test_ask,
test_interact, test_web): a question generator, an answerer, a fusion model, a judge and an NLI
filter, all drawn with `initializer_factor=3.0` so that their outputs depend on their inputs (a
judge whose probabilities move when the situation changes). Lengths are short, to keep the
tests fast. The fixture `models_yaml` (tests/clarifyjax/app/conftest.py) writes it."""
from __future__ import annotations

import yaml

from clarifyjax.app.clarifier import StepResult
from helpers.tiny_models import tiny_nli_folder, tiny_t5_folder

QUESTION_OPTIONS = ["--max-question-length", "8"]


def write_models_yaml(path, folders: dict) -> str:
    models = {"policy": {"init": str(folders["policy"]), "max_input_length": 48},
              "rewards": {"answerer": {"init": str(folders["answerer"]), "max_input_length": 64},
                          "fusion": {"init": str(folders["fusion"]), "max_input_length": 64},
                          "judge": {"model": {"init": str(folders["judge"]),
                                              "max_input_length": 64}},
                          "nli": {"init": str(folders["nli"]), "max_input_length": 64},
                          "answer_max_length": 8, "fusion_max_length": 12}}
    path.write_text(yaml.safe_dump(models), encoding="utf-8")
    return str(path)


def tiny_folders(root) -> dict:
    return dict(policy=tiny_t5_folder(root, seed=31, initializer_factor=3.0),
                answerer=tiny_t5_folder(root, seed=21, initializer_factor=3.0),
                fusion=tiny_t5_folder(root, family="v1.1", seed=12, initializer_factor=3.0),
                judge=tiny_t5_folder(root, seed=33, initializer_factor=3.0),
                nli=tiny_nli_folder(root, seed=14))


class FakeClarifier:
    """`step` echoes its rows: the situation gains the answer; questions are numbered."""

    def __init__(self):
        self.batches = []

    def step(self, requests, rng):
        self.batches.append(list(requests))
        out = []
        for r in requests:
            fused = bool(r.question and r.answer)
            situation = f"{r.situation} + {r.answer}" if fused else r.situation
            p = [len(situation) % 7 / 10, 0.2, 0.0]
            p[2] = 1 - p[0] - p[1]
            out.append(StepResult(situation, fused, p,
                                  f"q{sum(len(b) for b in self.batches)}" if r.ask else ""))
        return out
