"""`clarifyjax evaluate`: every system's questions for the situations of a δ-CLARIFY-format file,
then the paper's automatic results (`config.evaluate` describes the config, `report` the files).

Each stage (`Evaluation` lists them) is cached per system and chunk of situations in OUT/cache,
and sampling keys are `fold_in(key(seed), chunk index)`, so a run resumed after a kill writes
what an uninterrupted run writes."""
from __future__ import annotations

import dataclasses
import time
import zlib
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np
import jax

from clarifyjax.text import formats
from clarifyjax.core.buckets import equal_chunks
from clarifyjax.config.loader import config_to_dict
from clarifyjax.config.evaluate import EvalConfig, SystemConfig
from clarifyjax.decoding.seq2seq import Seq2SeqModel
from clarifyjax.text.generator import Sampling
from clarifyjax.evaluation.stage_cache import StageCache, model_fingerprint
from clarifyjax.files.tables import DataError, read_table
from clarifyjax.reward.pipeline import RewardPipeline, load_pipeline
from clarifyjax.evaluation.baselines import (
    Discriminator, QuestionSampler, WhCandidates, best_candidates, candidate_rewards,
)
from clarifyjax.evaluation.qa_metric import load_unanswerable
from clarifyjax.evaluation.bertscore import bertscore
from clarifyjax.evaluation.report import write_report


@dataclasses.dataclass
class SystemOutput:
    """One system's saved records, one per situation, per stage."""

    system: SystemConfig
    questions: list[str]
    judgments: list[dict]
    unanswerable: list[bool] | None = None
    bertscore: list[float] | None = None
    candidates: list[list[str]] | None = None
    candidate_scores: list[list[float]] | None = None


def read_situations(path, limit: int | None) -> tuple[list[str], list[list[str]]]:
    """The unique situations of a δ-CLARIFY-format file (first `limit`), each with its gold
    questions (in file order)."""
    table = read_table(path, ("situation", "question"))
    gold: dict[str, list[str]] = {}
    for row in table.rows:
        situation = formats.normalize_whitespace(row["situation"])
        gold.setdefault(situation, []).append(formats.normalize_whitespace(row["question"]))
    situations = list(gold)[:limit] if limit is not None else list(gold)
    if not situations:
        raise DataError(f"{table.path}: no situations")
    return situations, [gold[s] for s in situations]


def read_update_groups(path, question_column: str, limit: int | None) -> list[dict]:
    """δ-SOCIAL rows (Hypothesis, Update, UpdateType and, when the file has it, the question)
    grouped per (Hypothesis, UpdateType), in order of first appearance: hypothesis, update_type,
    question (the group's first, "" without the column) and references."""
    table = read_table(path, ("Hypothesis", "Update", "UpdateType"))
    has_question = question_column in table.columns
    groups: dict[tuple[str, str], dict] = {}
    for i, row in enumerate(table.rows):
        hypothesis = formats.normalize_whitespace(row["Hypothesis"])
        kind = formats.normalize_whitespace(row["UpdateType"]).lower()
        if kind not in formats.UPDATE_TYPES:
            raise DataError(f"{table.where(i)}: column 'UpdateType' must be one of "
                            f"{formats.UPDATE_TYPES}, got {row['UpdateType']!r}")
        group = groups.setdefault((hypothesis, kind), {
            "hypothesis": hypothesis, "update_type": kind, "question": "", "references": []})
        group["references"].append(formats.normalize_whitespace(row["Update"]))
        question = formats.normalize_whitespace(row.get(question_column, "") or "")
        if has_question and not group["question"] and question:
            group["question"] = question
    out = list(groups.values())
    return out[:limit] if limit is not None else out


def _key(seed: int, label: str, index: int):
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), zlib.crc32(
        label.encode()) & 0x7FFFFFFF), index)


class Models:
    """Each model loaded once, when first needed."""

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self._loaded: dict[tuple, object] = {}

    def _get(self, key: tuple, load: Callable[[], object]):
        if key not in self._loaded:
            self._loaded[key] = load()
        return self._loaded[key]

    def seq2seq(self, folder: str, max_input_length: int = 128):
        return self._get(("seq2seq", folder, max_input_length), lambda: Seq2SeqModel.from_pretrained(
            folder, max_input_length=max_input_length))

    def reward(self, with_nli: bool):
        full = self._get(("reward",), lambda: load_pipeline(self.cfg.rewards))
        if with_nli or full.nli is None:
            return full
        return self._get(("reward-no-nli",), lambda: RewardPipeline(
            full.answerer, full.fusion, full.judge, None, full.config))

    def discriminator(self, folder: str):
        return self._get(("discriminator", folder), lambda: Discriminator(folder))

    def qa(self, folder: str):
        cfg = self.cfg.informativeness
        return self._get(("qa", folder), lambda: load_unanswerable(
            folder, max_length=cfg.max_length, batch_size=cfg.batch_size))


class Evaluation:
    """One `clarifyjax evaluate` run; `run()` returns the results and writes nothing itself
    (`report.write_report` does).

    Stages, each cached per system and chunk: ``questions`` (ppo, t5, why) or ``candidates``
    (shared by systems of one model) then ``candidate_rewards`` (pipeline, pipeline-nli) or
    ``relevance`` (discriminator); ``judgments`` (the judge on the base and both updated
    situations: Table 4); ``answers`` (the QA model: informativeness); ``bertscore`` (F1, the max
    over gold questions); ``updates`` (Table 3, with and without the question). Models load only
    when a stage has a chunk left to compute."""

    def __init__(self, cfg: EvalConfig, *, say: Callable[[str], None] = print):
        self.cfg, self.say = cfg, say
        self.cache = StageCache(Path(cfg.out) / "cache")
        self.models = Models(cfg)
        self.situations, self.gold = read_situations(cfg.data.situations_path,
                                                     cfg.data.situations)
        self.chunks = equal_chunks(len(self.situations), cfg.data.batch_size)
        self._fingerprints: dict[tuple, str] = {}

    # ------------------------------------------------------------------ helpers

    def depends(self, folders: Sequence[str | None], **options) -> str:
        key = (tuple(folders), repr(sorted(options.items())))
        if key not in self._fingerprints:
            self._fingerprints[key] = model_fingerprint(folders, options)
        return self._fingerprints[key]

    def sampling(self) -> Sampling:
        g = self.cfg.generation
        if g.greedy:
            return Sampling(max_new_tokens=g.sampling.max_new_tokens,
                            min_new_tokens=g.sampling.min_new_tokens)
        return g.sampling

    def per_chunk(self, stage: str, label: str, depends: str, inputs: Sequence,
                  compute: Callable[[int, list], list]) -> list:
        """Records of every chunk of `inputs` (one per situation), cached."""
        out = []
        for i, chunk in enumerate(self.chunks):
            part = list(inputs[chunk])
            out += self.cache.chunk(stage, label, depends, i, part,
                                    lambda i=i, part=part: compute(i, part))
        return out

    # ------------------------------------------------------------------ questions

    def _generation_options(self) -> dict:
        return config_to_dict(self.cfg.generation)

    def sampled_questions(self, system: SystemConfig) -> list[str]:
        g = self.cfg.generation
        options = {**self._generation_options(), "kind": system.kind}
        if system.kind == "why":
            options["wh_starts"] = ["why"]

        def compute(i, situations):
            model = self.models.seq2seq(system.model)
            if system.kind == "why":
                texts = [c[0] for c in WhCandidates(model, self.sampling(), ("why",))(
                    situations, rng=_key(g.seed, "why", i))]
            else:
                texts = QuestionSampler(model, self.sampling())(
                    situations, rng=_key(g.seed, "questions", i))
            return [{"situation": s, "question": q} for s, q in zip(situations, texts)]

        records = self.per_chunk("questions", system.name, self.depends([system.model], **options),
                                 self.situations, compute)
        return [r["question"] for r in records]

    def candidates(self, model: str) -> list[list[str]]:
        g = self.cfg.generation
        depends = self.depends([model], **self._generation_options())

        def compute(i, situations):
            generator = WhCandidates(self.models.seq2seq(model), self.sampling(), g.wh_starts)
            found = generator(situations, rng=_key(g.seed, "candidates", i))
            return [{"situation": s, "candidates": c} for s, c in zip(situations, found)]

        records = self.per_chunk("candidates", f"wh-{depends[:12]}", depends, self.situations,
                                 compute)
        return [r["candidates"] for r in records]

    def candidate_scores(self, system: SystemConfig, candidates: list[list[str]]
                         ) -> list[list[float]]:
        inputs = [[s, c] for s, c in zip(self.situations, candidates)]
        if system.kind == "discriminator":
            depends = self.depends([system.classifier])

            def compute(i, part):
                disc = self.models.discriminator(system.classifier)
                scores = disc.scores([s for s, _ in part], [c for _, c in part])
                return [{"situation": s, "scores": [float(x) for x in row]}
                        for (s, _), row in zip(part, scores)]

            stage, label = "relevance", system.name
        else:
            with_nli = system.kind == "pipeline-nli"
            depends = self.depends(self._reward_folders(with_nli), **self._reward_options(
                with_nli))

            def compute(i, part):
                pipeline = self.models.reward(with_nli)
                scores = candidate_rewards(pipeline, [s for s, _ in part], [c for _, c in part],
                                           rng=_key(self.cfg.generation.seed, "rewards", i))
                return [{"situation": s, "scores": [float(x) for x in row]}
                        for (s, _), row in zip(part, scores)]

            stage, label = "candidate_rewards", f"{system.kind}-{depends[:12]}"
        # inputs include the candidates: other candidates are another key
        records = self.per_chunk(stage, label, depends, inputs, compute)
        return [r["scores"] for r in records]

    # ------------------------------------------------------------------ metrics

    def _reward_folders(self, with_nli: bool) -> list[str | None]:
        r = self.cfg.rewards
        return [r.answerer.init, r.fusion.init, r.judge.model.init,
                r.nli.init if (with_nli and r.nli is not None) else None]

    def _reward_options(self, with_nli: bool) -> dict:
        options = config_to_dict(self.cfg.rewards)
        if not with_nli:
            options["nli"] = None
        return options

    def judgments(self, system: SystemConfig, questions: list[str]) -> list[dict]:
        depends = self.depends(self._reward_folders(True), **self._reward_options(True))
        inputs = [[s, q] for s, q in zip(self.situations, questions)]

        def compute(i, part):
            pipeline = self.models.reward(True)
            out = pipeline([s for s, _ in part], [q for _, q in part],
                           rng=_key(self.cfg.generation.seed, "judgments", i))
            rows = out.rows()
            for r, answered in zip(rows, out.answered):
                r["answered"] = [bool(a) for a in answered]
            return rows

        return self.per_chunk("judgments", system.name, depends, inputs, compute)

    def unanswerable(self, system: SystemConfig, questions: list[str]) -> list[bool] | None:
        folder = self.cfg.informativeness.qa
        if folder is None:
            return None
        depends = self.depends([folder], **config_to_dict(self.cfg.informativeness))
        inputs = [[s, q] for s, q in zip(self.situations, questions)]

        def compute(i, part):
            flags = self.models.qa(folder)([s for s, _ in part], [q for _, q in part])
            return [{"unanswerable": bool(f)} for f in flags]

        records = self.per_chunk("answers", system.name, depends, inputs, compute)
        return [r["unanswerable"] for r in records]

    def bertscores(self, system: SystemConfig, questions: list[str]) -> list[float] | None:
        cfg = self.cfg.bertscore
        if cfg.model is None:
            return None
        depends = self.depends([cfg.model], **config_to_dict(cfg))
        inputs = [[q, g] for q, g in zip(questions, self.gold)]

        def compute(i, part):
            f1 = bertscore_f1([q for q, _ in part], [golds for _, golds in part], cfg)
            return [{"f1": float(f)} for f in f1]

        records = self.per_chunk("bertscore", system.name, depends, inputs, compute)
        return [r["f1"] for r in records]

    def updates(self) -> list[dict] | None:
        cfg = self.cfg.table3
        if cfg.path is None:
            return None
        groups = read_update_groups(cfg.path, cfg.question_column, cfg.groups)
        if not any(g["question"] for g in groups):
            raise DataError(f"{cfg.path}: no column {cfg.question_column!r} with questions "
                            "(table3.question_column): updates with the question need one")
        chunks = equal_chunks(len(groups), self.cfg.data.batch_size)
        results = {}
        for setting, folder in (("with_question", cfg.answerer),
                                ("without_question", cfg.answerer_no_question or cfg.answerer)):
            depends = self.depends([folder], setting=setting, **config_to_dict(cfg))
            texts = []
            for i, chunk in enumerate(chunks):
                part = groups[chunk]
                inputs = [[g["hypothesis"], g["update_type"], g["question"]] for g in part]

                def compute(part=part, setting=setting, folder=folder):
                    model = self.models.seq2seq(folder, cfg.max_input_length)
                    sources = [update_input(g, setting == "with_question") for g in part]
                    made = model.generate(sources, Sampling(max_new_tokens=cfg.max_length)).texts
                    return [{"update": u} for u in made]

                texts += [r["update"] for r in self.cache.chunk(
                    "updates", setting, depends, i, inputs, compute)]
            results[setting] = texts
        return [{**g, "with_question": w, "without_question": wo}
                for g, w, wo in zip(groups, results["with_question"],
                                    results["without_question"])]

    # ------------------------------------------------------------------ the run

    def system_output(self, system: SystemConfig) -> SystemOutput:
        candidates = scores = None
        if system.kind in ("ppo", "t5", "why"):
            questions = self.sampled_questions(system)
        else:
            candidates = self.candidates(system.model)
            scores = self.candidate_scores(system, candidates)
            questions = best_candidates(candidates, scores)
        return SystemOutput(system, questions, self.judgments(system, questions),
                            self.unanswerable(system, questions),
                            self.bertscores(system, questions), candidates, scores)

    def run(self) -> dict:
        t0 = time.perf_counter()
        outputs = []
        for system in self.cfg.systems:
            self.say(f"[evaluate] {system.name} ({system.kind}): {len(self.situations)} "
                     "situations")
            outputs.append(self.system_output(system))
        updates = self.updates()
        return {"outputs": outputs, "updates": updates, "seconds": time.perf_counter() - t0,
                "computed": dict(self.cache.computed), "reused": dict(self.cache.reused)}


def update_input(group: dict, with_question: bool) -> str:
    """The answer generator's input for a δ-SOCIAL group, with or without its question."""
    if with_question:
        return formats.answer_sft_example(group["hypothesis"], group["update_type"],
                                          group["question"], "-")[0]
    return formats.answer_input_without_question(group["hypothesis"], group["update_type"])


def bertscore_f1(candidates: list[str], references: list[list[str]], cfg) -> np.ndarray:
    """[n] BERTScore F1 of each candidate: the max over its references (`clarifyjax.evaluation.bertscore`,
    the bert-score package's rule for several references)."""
    _, _, f1 = bertscore(candidates, references, model=cfg.model, layer=cfg.layer, idf=cfg.idf,
                         baseline=cfg.baseline, batch_size=cfg.batch_size)
    return np.asarray(f1, np.float64)


def evaluate(cfg: EvalConfig, *, say: Callable[[str], None] = print) -> dict:
    """Run every stage (resuming from the cache) and write the report; returns the summary."""
    run = Evaluation(cfg, say=say).run()
    summary = write_report(cfg, run)
    for row in summary["systems"]:  # a system that asks one question of everything is named
        say(f"[evaluate] {row['system']}: raw reward {row['reward_raw']:.4f}, paired gain over "
            f"{row['gain_over']} {row['raw_gain']:+.4f} +- {row['raw_gain_se']:.4f} SE; "
            f"{row['distinct_questions']} distinct questions; the most common, {row['top_question']!r}, "
            f"asked of {row['top_question_share']:.0f}% of the situations (the five most common "
            f"{row['top5_share']:.0f}%), distinct-2 {row['distinct_2']:.3f}")
    say(f"[evaluate] chunks computed {run['computed']}, read from the cache {run['reused']} "
        f"({run['seconds']:.0f} s)")
    return summary
