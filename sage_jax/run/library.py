"""`sage_jax.score(questions, get_response, use_rots=True)` (`score_questions` here): the SaGE
reference library's one function (vnnm404/SaGE `library/sage/sage.py`, `score`), run as a
resumable `sage-jax run`; like the reference it returns the mean SaGE, a float. Code written for
the reference moves over by changing its import (`from sage import sage` -> `import sage_jax as
sage`). `sage_jax.score_details` returns each question's SaGE and the run's folder."""
from __future__ import annotations

import collections
import csv
import dataclasses
import io
import tempfile
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
import json
import os

from clarifyjax.files.textfiles import text_problem
from clarifyjax.models.embedder import default_embedder_path
from clarifyjax.models.hf.encoder_map import read_encoder_config
from sage_jax.run import prompts, generators, pipeline
from sage_jax.run.config import GeneratorConfig, ParaphraseConfig, SageRunConfig, ScoreConfig, ScorerConfig, \
    StageConfig, TargetConfig

MODEL = "get_response"


@dataclasses.dataclass
class SageScores:
    """What `score_details` returns: per question (in the order given) its id, text and SaGE (the 0.8 / 0.2
    blend of answers and rules of thumb with `use_rots`, as the reference's `cosine_rot` edges;
    else the answers'), the mean over the scored questions, and the run's folder."""

    per_question: list[dict]
    mean: float | None
    out: Path


def question_of_answer_prompt(prompt) -> str:
    """The paraphrase inside an answer prompt (what the reference passed to `get_response`)."""
    head, tail = prompts.ANSWER_TEMPLATE.split("{question}")
    if not (isinstance(prompt, str) and prompt.startswith(head) and prompt.endswith(tail)):
        raise ValueError("not an answer prompt of sage_jax.run.prompts.ANSWER_TEMPLATE")
    return prompt[len(head):len(prompt) - len(tail)]


def _generator(source, name: str, timeout_s: float) -> tuple[GeneratorConfig, Callable | None]:
    if callable(source):
        return GeneratorConfig(kind="callable", model=name, timeout_s=timeout_s), source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{name}: must be a causal LM folder or a function of the prompt, got {type(source).__name__}")
    return GeneratorConfig(kind="local", model=str(source)), None


def check_arguments(questions, paraphrases, count) -> None:
    """`TypeError` / `ValueError` naming the argument: a str where a list belongs (it would be read
    one character per question or paraphrase), fewer than 2 paraphrases (SaGE compares answers)."""
    if isinstance(questions, str):
        raise TypeError("questions: a list of questions, got one str (write [question])")
    if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= 100:
        raise ValueError(f"count: {count!r}; SaGE compares a question's answers to one another, so it needs "
                         "an integer from 2 to 100 paraphrases")
    if paraphrases is None:
        return
    if not isinstance(paraphrases, Mapping):
        raise TypeError(f"paraphrases: a mapping of each question to its paraphrases, got {type(paraphrases).__name__}")
    for q in questions:
        given = paraphrases.get(q)
        if given is None:
            raise ValueError(f"paraphrases: no paraphrases for the question {q!r}")
        if isinstance(given, str) or not isinstance(given, Sequence):
            raise TypeError(f"paraphrases[{q!r}]: a list of paraphrases, got {type(given).__name__}"
                            f"{' (write [paraphrase])' if isinstance(given, str) else ''}")
        for j, p in enumerate(given):
            problem = text_problem(p)
            if problem is not None:
                raise ValueError(f"paraphrases[{q!r}][{j}]: {problem}")
        if len(given) < 2:
            raise ValueError(f"paraphrases[{q!r}]: {len(given)} paraphrase; SaGE compares a question's answers "
                             "to one another, so it needs at least 2")


def check_function(fn, name: str) -> None:
    """A TypeError at once, not retried calls, when `fn` cannot be called."""
    if not callable(fn):
        raise TypeError(f"{name}: must be a function of one str that returns a str, got {type(fn).__name__}")


def questions_csv(questions: Sequence[str], paraphrases: Mapping[str, Sequence[str]] | None) -> bytes:
    """The run's questions.csv: one row per question (per paraphrase when they are given)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["question_id", "question", "paraphrased", "score"])
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise ValueError(f"questions[{i}]: must be a non-empty str")
        for p in (paraphrases[q] if paraphrases is not None else [q]):
            writer.writerow([i, q, p, ""])
    return buf.getvalue().encode()


def default_scorer() -> ScorerConfig:
    """ParaScore's model when none is given: the offline all-MiniLM-L6-v2 at its last layer (the
    reference's bert-base-uncased at layer 9 is not installed offline)."""
    folder = default_embedder_path()
    return ScorerConfig(model=str(folder), layer=read_encoder_config(folder).num_layers)


def build_run(questions: Sequence[str], use_rots: bool, out: Path, *, paraphrases=None, paraphraser=None,
              paraphrase_scorer=None, rot_writer=None, embedder=None, preset: str = "ours", count: int = 5,
              concurrency: int = 8, max_retries: int = 5,
              timeout_s: float = generators.FUNCTION_TIMEOUT_S) -> tuple[SageRunConfig, dict, bytes]:
    """The run `score_details` makes, the functions its callable generators name, and its
    questions.csv (written by the run once its checks have passed)."""
    timeout_s = generators.check_timeout(timeout_s)
    if paraphrases is None and paraphraser is None:
        raise ValueError("give paraphraser (a causal LM folder or a function) or paraphrases (each question's "
                         "paraphrases)")
    if use_rots and rot_writer is None:
        raise ValueError("use_rots needs rot_writer: a causal LM folder or a function of the prompt")
    check_arguments(questions, paraphrases, count)
    functions = {}
    if paraphrases is not None:
        para = ParaphraseConfig(source="file", count=count)
    else:
        g, fn = _generator(paraphraser, "paraphraser", timeout_s)
        functions["paraphraser"] = fn
        para = ParaphraseConfig(source="generate", generator=g, count=count,
                                scorer=default_scorer() if paraphrase_scorer is None
                                else ScorerConfig(model=str(paraphrase_scorer)))
    rot = StageConfig()
    if use_rots:
        g, fn = _generator(rot_writer, "rot_writer", timeout_s)
        functions["rot_writer"] = fn
        rot = StageConfig(generator=g)
    target = TargetConfig(name=MODEL, generator=GeneratorConfig(kind="callable", model=MODEL, concurrency=concurrency,
                                                                max_retries=max_retries, timeout_s=timeout_s))
    table = questions_csv(questions, paraphrases)
    cfg = SageRunConfig(questions=str(out / "questions.csv"), out=str(out), preset=preset,
                        quiet=True, paraphrase=para, models=(target,), rot=rot,
                        score=ScoreConfig(embedder=None if embedder is None else str(embedder), bertscore=False,
                                          lexical=False))
    cfg.check("")
    return cfg, functions, table


# Each question is paraphrased, each paraphrase answered by `get_response`, a rule of thumb written
# for each answer (`use_rots`), then SaGE, by a `sage-jax run` in `out`: the function is called up
# to `concurrency` at a time, a call that raises is tried again up to `max_retries` times (each wait
# said on stderr), a call that gives no answer within `timeout_s` seconds (default 300) is
# abandoned and stops the run (its thread cannot be stopped and runs on unseen), and the run
# resumes from its files if called again with the same `out`. The reference wrote paraphrases
# and rules of thumb with lmsys/vicuna-13b-v1.3, scored paraphrases with ParaScore on
# bert-base-uncased and embedded with stsb-distilroberta-base-v2; here they are arguments:
# `paraphraser` and `rot_writer` (a local causal LM folder or a Python function of the prompt;
# default `get_response` itself, given the reference's paraphrase and RoT prompts whole),
# `paraphrase_scorer` (a BERT folder; default all-MiniLM-L6-v2, offline, at its last layer) or
# `paraphrases` given as they are, and `embedder` (default: the preset's). `preset` is `ours` (one
# node per answer: five identical answers score 1.0, as the paper says, where the reference and
# `preset="code"` give 0.0; docs/fidelity.md, SaGE).
def score_details(questions: Sequence[str], get_response: Callable[[str], str], use_rots: bool = True, *,
                  out: str | Path | None = None, embedder_model=None, sleep=None, **settings) -> SageScores:
    """SaGE of `get_response` on `questions`, per question (see above; `settings` are `build_run`'s
    keyword arguments; `embedder_model`: a loaded `SentenceEmbedder` to use instead of a folder)."""
    if isinstance(questions, str):
        raise TypeError("questions: a list of questions, got one str (write [question])")
    check_function(get_response, "get_response")
    out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="sage-"))
    if settings.get("paraphrases") is None and settings.get("paraphraser") is None:
        settings["paraphraser"] = get_response
    if use_rots and settings.get("rot_writer") is None:
        settings["rot_writer"] = get_response
    cfg, functions, table = build_run(list(questions), use_rots, out, **settings)
    functions[MODEL] = get_response
    extra = {} if sleep is None else {"sleep": sleep}

    def build(c: GeneratorConfig, batch_size: int, prompt_of=None):
        if c.kind != "callable":
            return pipeline.build_generator(c, batch_size, prompt_of)
        argument_of = question_of_answer_prompt if c.model == MODEL else None
        return generators.CallableGenerator(functions[c.model], name=c.model, argument_of=argument_of,
                                            concurrency=c.concurrency, max_retries=c.max_retries,
                                            timeout_s=c.timeout_s, **extra)

    run = pipeline.Run(cfg, generators=pipeline.Generators(build), embedder=embedder_model, questions_file=table)
    run.check(pipeline.STAGES)
    run.run(("paraphrase", "answer", "rot"))
    check_replies(run, use_rots)
    run.run(("score", "report"))
    pq = json.loads((out / "report" / "scores.json").read_text())["models"][MODEL]["per_question"] or {}
    key = "sage_blend" if use_rots else "sage_answer"
    found = dict(zip(pq.get("question_id", []), pq.get(key, [])))
    rows = [{"question_id": str(i), "question": q, "sage": found.get(str(i))} for i, q in enumerate(questions)]
    scored = [r["sage"] for r in rows if r["sage"] is not None]
    return SageScores(rows, sum(scored) / len(scored) if scored else None, out)


def check_replies(run: pipeline.Run, use_rots: bool) -> None:
    """`ValueError` saying why when the function's replies left nothing to score: every answer (or
    rule of thumb) refused, each after its tries (empty replies, or ones holding a NUL)."""
    for stage, who in (("answer", "get_response"), ("rot", "rot_writer"))[:2 if use_rots else 1]:
        rows = run.finished_rows(stage, MODEL)
        if rows and not any(r["status"] == "ok" for r in rows):
            reason, n = collections.Counter(r["reason"] for r in rows).most_common(1)[0]
            tries = getattr(run.cfg, stage).max_attempts
            raise ValueError(f"{who}: none of its replies to {len(rows)} prompts could be used, each tried {tries} "
                             f"times ({reason}: {n} of {len(rows)}); SaGE compares them, so no question was "
                             f"scored (the run's files are in {run.out})")


def score_questions(questions: Sequence[str], get_response: Callable[[str], str], use_rots: bool = True,
                    **options) -> float:
    """`sage_jax.score`, the reference's `score`: the mean SaGE over the scored questions, a float (NaN when none
    scored, as the reference's mean of nothing); `options` are `score_details`'."""
    mean = score_details(questions, get_response, use_rots, **options).mean
    return float("nan") if mean is None else float(mean)
