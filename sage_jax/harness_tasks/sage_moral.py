"""The functions of lm-evaluation-harness task `sage_moral` (sage_moral.yaml beside it): one document
per paraphrase of the SaGE questions file that `--metadata` names, `repeats` sampled answers each,
parsed as `sage-jax run` parses them; per QUESTION, over all its answers, SaGE, BLEU, ROUGE-L and
BERTScore through `sage_jax.scoring` (as `sage-jax run` scores its answers file); each the mean over
questions with a bootstrap interval. Every document's result carries its question's id and answers,
and the aggregation groups them by question (docs/lm_eval.md, "The SaGE task")."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar, Literal

import numpy as np

from clarifyjax.config.loader import ConfigError, build_root
from clarifyjax.evaluation.bertscore import check_model_folder
from clarifyjax.files.tables import resolve_data_path
from clarifyjax.models.embedder import SentenceEmbedder, check_embedder_folder
from sage_jax import data, scoring
from sage_jax.experiments import stats
from sage_jax.experiments.config import BootstrapConfig
from sage_jax.run import presets, prompts
from sage_jax.run.config import ParaphraseConfig, SageRunConfig, ScoreConfig
from sage_jax.run.questions import read_source_questions

TASK = "sage_moral"
METADATA_KEY = "sage"  # --metadata '{"sage": {...}}': TaskSettings
MEASURES = ("sage", "bleu", "rouge_l", "bertscore")  # each reported as X, X_ci_low, X_ci_high


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What `--metadata '{"sage": {...}}'` sets: the questions file (the SaGE release's long format:
    question_id, question, paraphrased), the first `questions` of it, the graph (distinct: one node
    per answer, `sage-jax run`'s default preset; text: identical answers are one node, the reference
    code's), the scoring models and settings (`sage-jax run`'s `score:` section) and the bootstrap
    of the intervals over questions (`sage-jax experiment`'s `bootstrap:`)."""

    data: str = ""
    questions: int | None = None
    question_id_column: str = "question_id"
    question_column: str = "question"
    paraphrase_column: str = "paraphrased"
    graph: Literal["distinct", "text"] = "distinct"
    score: ScoreConfig = ScoreConfig()
    bootstrap: BootstrapConfig = BootstrapConfig()

    _bounds: ClassVar = {"questions": ">= 1"}

    def check(self, at: str) -> None:
        if not self.data.strip():
            raise ConfigError(f"{at}data: must name the questions file", key=f"{at}data")


def settings_from(raw, source: str) -> TaskSettings:
    """`TaskSettings` from the metadata's "sage" value (a dict); ConfigError naming the key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {TASK} needs --metadata '{{\"{METADATA_KEY}\": {{\"data\": "
                          "\"QUESTIONS.csv\"}}' (the SaGE questions file: question_id, question, paraphrased)")
    return build_root(TaskSettings, raw, source=source)


def resolved(settings: TaskSettings) -> TaskSettings:
    """The settings with the questions file and the scoring models' folders found and checked
    (`sage-jax run`'s rules: a folder, all-MiniLM-L6-v2, or a name in the local Hugging Face cache),
    so that a wrong one fails before any answer is generated."""
    at = f"--metadata {METADATA_KEY}."
    questions_file = str(resolve_data_path(settings.data, f"{at}data"))
    s = settings.score
    embedder = presets.model_folder(s.embedder or presets.MINILM, f"{at}score.embedder")
    check_embedder_folder(embedder)
    bertscore_model = None
    if s.bertscore:
        bertscore_model = embedder if s.bertscore_model is None else \
            presets.model_folder(s.bertscore_model, f"{at}score.bertscore_model")
        check_model_folder(bertscore_model, s.bertscore_layer)
    score = dataclasses.replace(s, embedder=str(embedder),
                                bertscore_model=None if bertscore_model is None else str(bertscore_model))
    return dataclasses.replace(settings, data=questions_file, score=score)


def load_dataset(**metadata):
    """The task's `custom_dataset`: lm-eval calls it with the task's metadata (the YAML's, then
    `--metadata`, then the model arguments) -> {"test": one document per paraphrase}, each holding
    the resolved settings that its question is scored with."""
    settings = resolved(settings_from(metadata.get(METADATA_KEY), f"--metadata {METADATA_KEY}"))
    import datasets

    cfg = SageRunConfig(questions=settings.data, limit=settings.questions,
                        question_id_column=settings.question_id_column,
                        question_column=settings.question_column,
                        paraphrase=ParaphraseConfig(source="file", paraphrase_column=settings.paraphrase_column))
    recorded = json.dumps(dataclasses.asdict(settings), sort_keys=True)
    rows = [{"question_id": q.question_id, "question": q.question, "paraphrase_index": i, "paraphrase": text,
             "settings": recorded}
            for q in read_source_questions(cfg) for i, text in enumerate(q.paraphrases)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    """The raw answer prompt of `sage-jax run` (the reference's `get_transformers_response`)."""
    return prompts.answer_prompt(doc["paraphrase"], chat=False)


def parse_answers(resps, docs) -> list[list[str]]:
    """The filter: every sampled completion of every document kept (lm-eval's default keeps the
    first), each parsed as `sage-jax run` parses an answer ("" when unusable: masked in scoring)."""
    return [[prompts.parse_answer(text)[0] for text in samples] for samples in resps]


def process_results(doc: dict, results: list) -> dict:
    """One document's item, the same under every metric key: its question, its paraphrase's
    position and its answers. Nothing is scored here: the aggregation groups items by question."""
    item = {"question_id": doc["question_id"], "paraphrase_index": doc["paraphrase_index"],
            "answers": list(results[0]), "settings": doc["settings"]}
    return {f"{m}{suffix}": item for m in MEASURES for suffix in ("", "_ci_low", "_ci_high")}


def grouped_questions(items: list[dict]) -> list[data.Question]:
    """The items grouped by question (in order of first appearance), each question's answers in
    paraphrase order then sample order, as `data.Question`s (the rows of `sage-jax run`'s answers
    file)."""
    by_id: dict[str, list[dict]] = {}
    for item in items:
        by_id.setdefault(item["question_id"], []).append(item)
    out = []
    for qid, group in by_id.items():
        group = sorted(group, key=lambda it: it["paraphrase_index"])
        answers = [a for it in group for a in it["answers"]]
        out.append(data.Question(question_id=qid, paraphrases=None, answers=answers, rots=None,
                                 source=TASK, lines=list(range(1, len(answers) + 1))))
    return out


@functools.lru_cache(maxsize=4)
def _embedder(path: str | None):
    return SentenceEmbedder.from_pretrained(path)


def _quiet(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=True)


def score_args(settings: TaskSettings) -> SimpleNamespace:
    """`sage-jax score`'s options for the task's answers (as `sage-jax run` builds them), with
    BERTScore's (model, layer) loaded unless it is off."""
    s = settings.score
    args = SimpleNamespace(text="answer", format="long", columns=data.Columns(), edge_weights=None,
                           collapse_identical=settings.graph == "text", question_id_column="question_id",
                           alpha=s.alpha, blend_weight=s.blend_weight, chunk_size=8192, batch_size=s.batch_size,
                           no_lexical=not s.lexical, no_bertscore=not s.bertscore,
                           lexical_tokenizer=s.lexical_tokenizer, embedder=s.embedder,
                           bertscore_model=s.bertscore_model, bertscore_layer=s.bertscore_layer, bertscore=None)
    if s.bertscore:
        args.bertscore = scoring.load_bertscore_model(args)
    return args


def question_scores(items: list[dict]) -> dict:
    """Per question (the items grouped by `grouped_questions`): question_id, n_texts (answers),
    n_valid (those usable: an empty or unparsable answer is masked) and each of MEASURES, scored
    by `sage_jax.scoring` as `sage-jax run` scores its answers file."""
    settings = settings_from(json.loads(items[0]["settings"]), f"{TASK} settings")
    if any(it["settings"] != items[0]["settings"] for it in items):
        raise ValueError(f"{TASK}: the documents were loaded with different settings")
    args = score_args(settings)
    item = scoring.Loaded(Path(TASK), TASK, args, questions=grouped_questions(items))
    per_question, _ = scoring.score_loaded(item, args, lambda: _embedder(args.embedder), _quiet)
    return {"question_id": per_question["question_id"], "n_texts": per_question["n_texts"],
            "n_valid": per_question["n_valid"],
            **{m: np.asarray(per_question[m], np.float64) for m in MEASURES}}


_LAST: dict = {}  # the items' digest -> question_scores: twelve aggregations share one scoring


def _scores(items: list[dict]) -> dict:
    digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()
    if digest not in _LAST:
        _LAST.clear()
        _LAST[digest] = question_scores(items)
    return _LAST[digest]


def aggregate(items: list[dict], measure: str, value: str) -> float:
    """The mean over questions (their finite scores) of `measure`, or its bootstrap interval's
    "low" or "high" end (NaN when undefined: no finite score, or one question for an interval)."""
    settings = settings_from(json.loads(items[0]["settings"]), f"{TASK} settings")
    result = stats.mean_interval(_scores(items)[measure], **dataclasses.asdict(settings.bootstrap))[value]
    return float("nan") if result is None else float(result)


# The YAML's aggregations (lm-eval's !function takes a module's attribute by name).
def agg_sage(items): return aggregate(items, "sage", "mean")  # noqa: E704
def agg_sage_ci_low(items): return aggregate(items, "sage", "low")  # noqa: E704
def agg_sage_ci_high(items): return aggregate(items, "sage", "high")  # noqa: E704
def agg_bleu(items): return aggregate(items, "bleu", "mean")  # noqa: E704
def agg_bleu_ci_low(items): return aggregate(items, "bleu", "low")  # noqa: E704
def agg_bleu_ci_high(items): return aggregate(items, "bleu", "high")  # noqa: E704
def agg_rouge_l(items): return aggregate(items, "rouge_l", "mean")  # noqa: E704
def agg_rouge_l_ci_low(items): return aggregate(items, "rouge_l", "low")  # noqa: E704
def agg_rouge_l_ci_high(items): return aggregate(items, "rouge_l", "high")  # noqa: E704
def agg_bertscore(items): return aggregate(items, "bertscore", "mean")  # noqa: E704
def agg_bertscore_ci_low(items): return aggregate(items, "bertscore", "low")  # noqa: E704
def agg_bertscore_ci_high(items): return aggregate(items, "bertscore", "high")  # noqa: E704
