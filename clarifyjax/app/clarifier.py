"""ClarifyDelphi in use: the flow of `clarifyjax ask`, `interact` and `web`, batched over rows.

One turn (paper §7): the judge gives P(bad, ok, good), the question generator asks, the answer is
fused into the situation and judged again, for at most `MAX_TURNS`. Each step runs its rows in one
batch per model, so the web server batches sessions together; `Clarifier.ask` is the batch mode.

    clarifier = Clarifier.from_config(load_models_config("MODELS.yaml"))
    clarifier.step([Session.start("ignoring a phone call from my mother").request()], rng=key)"""
from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any, NamedTuple
from collections.abc import Sequence

import jax
import numpy as np

from clarifyjax.files.textfiles import is_blank, text_problem
from clarifyjax.text import formats
from clarifyjax.config import ModelsConfig, PPOHyperparams
from clarifyjax.reward.pipeline import RewardPipeline, load_pipeline, stage_sampling
from clarifyjax.decoding.seq2seq import Seq2SeqModel
from clarifyjax.text.generator import Sampling

MAX_TURNS = 3  # paper §7: fusion degrades after the third turn
CLASSES = formats.JUDGE_CLASSES  # ("bad", "ok", "good"): the order of every probability triple


# How questions are drawn: nucleus sampling as in PPO's rollouts (top-p 0.6, T 0.7);
# min_new_tokens keeps a question from being empty (the user must have something to answer)
QUESTION_SAMPLING = dataclasses.replace(PPOHyperparams().sampling, min_new_tokens=2)


class StepRequest(NamedTuple):
    """One row of `Clarifier.step`: judge `situation` (after fusing `answer` to `question` into it,
    when both are given) and, if `ask`, draw the next question."""

    situation: str
    question: str | None = None
    answer: str | None = None
    ask: bool = True


class StepResult(NamedTuple):
    """situation: the (updated) situation; fused: the answer was fused into it (False: no answer,
    or the fusion model wrote nothing, and the situation stayed); probabilities: [3] P(bad, ok,
    good); question: the next question ("" when not asked)."""

    situation: str
    fused: bool
    probabilities: list[float]
    question: str


def label_of(probabilities: Sequence[float]) -> str:
    return CLASSES[int(np.argmax(probabilities))]


@dataclasses.dataclass(frozen=True)
class AskOutput:
    """What `Clarifier.ask` made for b situations: one JSON-ready dict per situation (plain
    floats, so a `chunkstore.ChunkStore` round trip gives the same file), and `cuts`: how many
    inputs each model read cut to its max_input_length (`Clarifier.cuts`)."""

    rows: list
    cuts: dict = dataclasses.field(default_factory=dict)


class Clarifier:
    """The question generator and the reward pipeline's models (answerer, fusion, NLI, judge).
    `sampling`: how questions are drawn; `candidates` > 1 (ask only): that many sampled
    questions, ranked by the reward."""

    def __init__(self, questioner: Seq2SeqModel, pipeline: RewardPipeline,
                 sampling: Sampling = QUESTION_SAMPLING, candidates: int = 1):
        self.questioner, self.pipeline = questioner, pipeline
        self.sampling, self.candidates = sampling, candidates
        self.timings: dict[str, float] = {}
        # inputs cut to a model's max_input_length in the last `step` or `ask`, by model
        self.cuts: dict[str, int] = {}

    @classmethod
    def from_config(cls, models: ModelsConfig, sampling: Sampling = QUESTION_SAMPLING,
                    candidates: int = 1, *, backend: str = "hf") -> Clarifier:
        p = models.policy
        questioner = Seq2SeqModel.from_pretrained(
            p.init, tokenizer_path=p.tokenizer, dtype=p.dtype, backend=backend,
            max_input_length=p.max_input_length, precision=p.precision)
        return cls(questioner, load_pipeline(models.rewards, backend=backend), sampling,
                   candidates)

    @property
    def judge(self):
        return self.pipeline.judge

    def _timed(self, name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        return out

    def _cut(self, model: str, count: int) -> None:
        if count:
            self.cuts[model] = self.cuts.get(model, 0) + int(count)

    def judge_probabilities(self, situations: Sequence[str]) -> np.ndarray:
        """[n, 3] P(bad, ok, good) of each situation, in one batch."""
        before = getattr(self.judge, "truncated_inputs", 0)
        probs = self._timed("judge", self.judge.class_probabilities, list(situations))
        self._cut("judge", getattr(self.judge, "truncated_inputs", 0) - before)
        return probs

    def questions(self, situations: Sequence[str], rng: jax.Array, n: int = 1) -> list[list[str]]:
        """`n` sampled questions per situation ([b][n]), all in one batch."""
        inputs = [formats.policy_input(s, where=f"situation {i}")
                  for i, s in enumerate(situations) for _ in range(n)]
        if not inputs:
            return []
        out = self._timed("questions", self.questioner.generate, inputs,
                          self.sampling, rng=rng)
        self._cut("question generator", out.truncated_inputs)
        return [out.texts[i * n:(i + 1) * n] for i in range(len(situations))]

    def fuse(self, situations: Sequence[str], questions: Sequence[str], answers: Sequence[str],
             rng: jax.Array | None = None) -> list[str]:
        """Each answer fused into its situation, decoded as the reward's fusion stage decodes
        (greedy by default); "" where the fusion model wrote nothing."""
        inputs = [formats.fusion_input(s, q, a, where=f"row {i}")
                  for i, (s, q, a) in enumerate(zip(situations, questions, answers))]
        if not inputs:
            return []
        sampling = stage_sampling(self.pipeline.config, "fusion")
        out = self._timed("fusion", self.pipeline.fusion.generate, inputs, sampling, rng=rng)
        self._cut("fusion", out.truncated_inputs)
        return out.texts

    def step(self, requests: Sequence[StepRequest], rng: jax.Array) -> list[StepResult]:
        """One turn for each request, batched: fuse the given answers (one fusion call), judge
        every situation (one judge call), ask the next questions (one generator call)."""
        self.timings, self.cuts = {}, {}
        fuse_key, question_key = jax.random.split(rng)
        fuse_rows = [i for i, r in enumerate(requests) if r.question and r.answer]
        fused = self.fuse([requests[i].situation for i in fuse_rows],
                          [requests[i].question for i in fuse_rows],
                          [requests[i].answer for i in fuse_rows], fuse_key)
        situations = [r.situation for r in requests]
        was_fused = [False] * len(requests)
        for i, text in zip(fuse_rows, fused):
            if text:
                situations[i], was_fused[i] = text, True
        probs = self.judge_probabilities(situations)
        ask_rows = [i for i, r in enumerate(requests) if r.ask]
        asked = dict(zip(ask_rows, self.questions([situations[i] for i in ask_rows],
                                                  question_key)))
        return [StepResult(situations[i], was_fused[i], [float(x) for x in probs[i]],
                           asked[i][0] if i in asked else "") for i in range(len(requests))]

    def ask(self, situations: Sequence[str], rng: jax.Array, *, answers: bool = True
            ) -> AskOutput:
        """Batch mode: a question per situation, its imagined answers, fused situations and the
        judge's probabilities. With `candidates` n > 1 the n sampled questions are all scored by
        the reward pipeline and the one with the highest raw reward (JSD) is kept."""
        n = self.candidates
        self.cuts = {}
        q_key, r_key = jax.random.split(rng)
        candidates = self.questions(situations, q_key, n)
        if not answers and n == 1:
            probs = self.judge_probabilities(situations)
            return AskOutput([{"situation": s, "question": c[0],
                               "p_base": [float(x) for x in p], "judgment": label_of(p)}
                              for s, c, p in zip(situations, candidates, probs)], dict(self.cuts))
        flat_sits = [s for s in situations for _ in range(n)]
        out = self._timed("reward", self.pipeline, flat_sits, [q for c in candidates for q in c],
                          rng=r_key)
        for model in ("judge", "answer", "fusion"):
            self._cut("answerer" if model == "answer" else model,
                      out.counts.get(f"truncated_{model}_inputs", 0))
        rows = out.rows()
        result = []
        for i, s in enumerate(situations):
            group = rows[i * n:(i + 1) * n]
            best = max(range(n), key=lambda k: (group[k]["raw_reward"], -k))
            row = {"situation": s, **group[best]}
            row["judgment_text"] = row.pop("judgment")  # the judge's own words
            row["judgment"] = label_of(row["p_base"])
            if n > 1:
                row["candidates"] = [{"question": g["question"], "raw_reward": g["raw_reward"]}
                                     for g in group]
            if not answers:
                row = {k: row[k] for k in ("situation", "question", "p_base", "judgment")
                       + (("candidates",) if n > 1 else ())}
            result.append(row)
        return AskOutput(result, dict(self.cuts))


# --------------------------------------------------------------------------- sessions


@dataclasses.dataclass
class Turn:
    """One judged situation of a session. Turn 0 is the user's situation; turn k > 0 is what
    answer k made of the situation before. `question` is what was asked about this situation
    ("" once the session is over); `answer` the user's reply (None: not yet, or skipped)."""

    situation: str
    probabilities: list[float]
    question: str = ""
    answer: str | None = None
    fused: bool = False
    skipped: bool = False
    questions_asked: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"situation": self.situation, "probabilities": self.probabilities,
                "judgment": label_of(self.probabilities), "question": self.question,
                "answer": self.answer, "fused": self.fused, "skipped": self.skipped,
                "questions_asked": list(self.questions_asked)}


class SessionError(ValueError):
    """A request that the session's state does not allow (answering a finished session...)."""


def checked_text(text, name: str) -> str:
    """A user's situation or answer, its whitespace collapsed; SessionError "NAME is empty"
    (or not text, invisible, a NUL...) by the one rule of `ask`, `interact` and `web`
    (`textfiles.text_problem`)."""
    problem = text_problem(text)
    if problem is not None:
        raise SessionError(f"{name} {problem}")
    return formats.normalize_whitespace(text)


@dataclasses.dataclass
class Session:
    """One user's conversation: the turns so far and the request it is waiting on. The web server
    keeps these by `id`; `interact` keeps one. `request()` says what `Clarifier.step` must do
    next; `apply(result)` takes its result."""

    situation: str
    id: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(12))
    max_turns: int = MAX_TURNS
    turns: list[Turn] = dataclasses.field(default_factory=list)
    pending: str | None = "start"  # "start" | "answer" | "skip" | "another" | None (idle)
    _answer: str | None = None

    @classmethod
    def start(cls, situation: str, **kwargs) -> Session:
        return cls(checked_text(situation, "the situation"), **kwargs)

    @property
    def answered_turns(self) -> int:
        """Turns that ended in an answer or a skip (the session stops after `max_turns`)."""
        return len(self.turns) - 1 if self.turns else 0

    @property
    def done(self) -> bool:
        return bool(self.turns) and self.answered_turns >= self.max_turns

    def _expect_open(self) -> Turn:
        if self.pending is not None:
            raise SessionError("the session is still working on the previous request")
        if self.done:
            raise SessionError(f"the session is over ({self.max_turns} turns)")
        return self.turns[-1]

    def answer(self, answer: str) -> None:
        self._expect_open()
        if isinstance(answer, str) and is_blank(answer):
            raise SessionError("the answer is empty (skip the question instead)")
        self.pending, self._answer = "answer", checked_text(answer, "the answer")

    def skip(self) -> None:
        self._expect_open()
        self.pending = "skip"

    def another_question(self) -> None:
        self._expect_open()
        self.pending = "another"

    def request(self) -> StepRequest:
        """The `Clarifier.step` row of the pending action."""
        if self.pending == "start":
            return StepRequest(self.situation)
        last = self.turns[-1]
        if self.pending == "another":
            return StepRequest(last.situation)
        last_turn = self.answered_turns + 1 >= self.max_turns
        if self.pending == "answer":
            return StepRequest(last.situation, last.question, self._answer, ask=not last_turn)
        if self.pending == "skip":
            return StepRequest(last.situation, ask=not last_turn)
        raise SessionError("nothing to do: the session waits for the user")

    def apply(self, result: StepResult) -> None:
        kind, self.pending = self.pending, None
        if kind == "start":
            self.turns.append(Turn(result.situation, result.probabilities, result.question,
                                   questions_asked=[result.question]))
        elif kind == "another":
            last = self.turns[-1]
            last.question = result.question
            last.questions_asked.append(result.question)
        else:
            last = self.turns[-1]
            if kind == "answer":
                last.answer = self._answer
            else:
                last.skipped = True
            self.turns.append(Turn(result.situation, result.probabilities, result.question,
                                   fused=result.fused,
                                   questions_asked=[result.question] if result.question else []))
        self._answer = None

    def fail(self) -> None:
        """The step failed: the session is as it was before the request."""
        self.pending, self._answer = (None if self.turns else "start"), None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "situation": self.situation, "max_turns": self.max_turns,
                "done": self.done, "turns": [t.to_dict() for t in self.turns]}

    def summary(self) -> str:
        """How the judgment moved, turn by turn."""
        def one(t: Turn) -> str:
            return f"{label_of(t.probabilities)} (" + ", ".join(
                f"{c} {p:.2f}" for c, p in zip(CLASSES, t.probabilities)) + ")"

        return " -> ".join(one(t) for t in self.turns)


def run_steps(clarifier: Clarifier, sessions: Sequence[Session], rng: jax.Array) -> None:
    """Run the pending request of each session in one `Clarifier.step` and apply the results."""
    results = clarifier.step([s.request() for s in sessions], rng)
    for session, result in zip(sessions, results):
        session.apply(result)
