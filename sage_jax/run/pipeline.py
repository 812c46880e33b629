"""`sage-jax run`: questions -> paraphrases -> answers (per model) -> rules of thumb -> scores -> report.

`Run` runs the stages (each resumable, `sage_jax.run.stages`; what each writes under ``out/`` is
above `Run`), with the resolved config.yaml and the prompts beside them. Several models share one
paraphrase stage; process i of n (`hosts`) takes questions i, i + n, ..."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from collections.abc import Callable, Sequence

import jax

from clarifyjax.config.loader import ConfigError, dump_config
from clarifyjax.files.textfiles import atomic_write_bytes, check_output_folder, text_problem
from clarifyjax.text.generator import Sampling, TokenCounter
from sage_jax.run import presets, prompts, report
from sage_jax.run.config import GeneratorConfig, SageRunConfig
from sage_jax.run.stages import Stage, StageError, Task, read_jsonl
from clarifyjax.files.tables import DataError, read_rows, resolve_data_path, text_cell
from clarifyjax.decoding.local_lm import LocalLM
from sage_jax.run.generators import OpenAIGenerator, RecordedGenerator, read_api_key
from clarifyjax.evaluation.bertscore import check_layer, load_model
from sage_jax.parascore import filter_paraphrases

STAGES = ("paraphrase", "answer", "rot", "score", "report")
PARAPHRASER = "paraphraser"  # the model field of paraphrase rows


@dataclasses.dataclass
class SourceQuestion:
    question_id: str
    question: str
    paraphrases: list[str] | None = None  # paraphrase.source: file
    scores: list[float] | None = None
    guide: str | None = None  # guide_column: the rule of thumb a guided model is given
    guides: list[str] | None = None  # paraphrase.source file: each paraphrase's own row's rule of thumb


# The rule of thumb of a guided model (guide_column) is read from every row, as the reference's
# improve.py prompts each row with its own `imp_rot`: with paraphrase.source file each paraphrase
# gets its row's; a generated paraphrase has no row, so the rows of a question must then agree.
def read_source_questions(cfg: SageRunConfig) -> list[SourceQuestion]:
    """The questions file: one question per id (a long-format file's repeated ids are one question,
    its paraphrase column the paraphrases when paraphrase.source is file); first `limit`."""
    header, rows = read_rows(resolve_data_path(cfg.questions, "questions"))
    from_file = cfg.paraphrase.source == "file"
    need = [cfg.question_id_column, cfg.question_column]
    if from_file:
        need.append(cfg.paraphrase.paraphrase_column)
    if cfg.guide_column:
        need.append(cfg.guide_column)
    missing = [c for c in need if c not in header]
    if missing:
        raise DataError(f"{cfg.questions}: missing column{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(repr, missing))} (the file has: {', '.join(header)})")
    by_id: dict[str, SourceQuestion] = {}
    for line, row in rows:
        cell = {c: text_cell(row, c, f"{cfg.questions}:{line}").strip() for c in need}
        qid, text = cell[cfg.question_id_column], cell[cfg.question_column]
        if not qid or not text:
            column = cfg.question_id_column if not qid else cfg.question_column
            raise DataError(f"{cfg.questions}:{line}: empty {column!r}")
        _check_text(cfg, line, cfg.question_column, text)
        guide = _guide(cfg, cell, line) if cfg.guide_column else None
        q = by_id.get(qid)
        if q is None:
            if cfg.limit is not None and len(by_id) == cfg.limit:
                continue
            q = by_id[qid] = SourceQuestion(qid, text, [] if from_file else None, [] if from_file else None, guide,
                                            [] if from_file and guide is not None else None)
        elif q.question != text:
            raise DataError(f"{cfg.questions}:{line}: question id {qid!r} has another question text than "
                            "its first row; two questions share one id")
        elif guide is not None and not from_file and guide != q.guide:
            raise DataError(f"{cfg.questions}:{line}: question id {qid!r} has another {cfg.guide_column!r} than "
                            "its first row; generated paraphrases are each given the question's one rule of "
                            "thumb (with paraphrase.source file each paraphrase gets its own row's)")
        if from_file:
            q.paraphrases.append(_check_text(cfg, line, cfg.paraphrase.paraphrase_column,
                                             cell[cfg.paraphrase.paraphrase_column]))
            q.scores.append(_score(row))
            if q.guides is not None:
                q.guides.append(guide)
    if not by_id:
        raise DataError(f"{cfg.questions}: no questions")
    return list(by_id.values())


def _score(row) -> float | None:
    """A paraphrase's ParaScore; None (which JSON holds) for a file of paraphrases without one."""
    try:
        score = float(row.get("score") or "nan")
    except ValueError:
        score = float("nan")
    return score if score == score and abs(score) != float("inf") else None


def _guide(cfg: SageRunConfig, cell: dict, line: int) -> str:
    guide = cell[cfg.guide_column]
    if not guide:
        raise DataError(f"{cfg.questions}:{line}: empty {cfg.guide_column!r} (guide_column: every question needs "
                        "the rule of thumb its guided models are given)")
    return guide


def _check_text(cfg: SageRunConfig, line: int, column: str, text: str) -> str:
    """`text` of the questions file's `column` at `line`, which a model will be prompted with:
    DataError when it is empty, invisible or not encodable (`textfiles.text_problem`)."""
    problem = text_problem(text)
    if problem is not None:
        raise DataError(f"{cfg.questions}:{line}: {column!r} {problem}; each one is sent to the "
                        "models as it is")
    return text


def process_share(cfg: SageRunConfig) -> tuple[int, int]:
    if cfg.hosts.process_index is not None:
        return cfg.hosts.process_index, cfg.hosts.process_count
    return jax.process_index(), jax.process_count()


@dataclasses.dataclass(frozen=True)
class TotalLength:
    """A row's sampling when its stage caps prompt + new tokens together (transformers'
    `max_length`, the reference's paraphrase call): the generator counts the prompt's tokens; one
    that cannot count (an endpoint) gets `fallback` new tokens."""

    sampling: Sampling
    total: int
    fallback: int

    def __call__(self, generator, task) -> Sampling | str:
        if not isinstance(generator, TokenCounter):
            return dataclasses.replace(self.sampling, max_new_tokens=self.fallback)
        try:
            tokens = generator.count_tokens(task.prompt)
        except ValueError as e:
            return f"prompt cannot be encoded: {e}"
        if tokens >= self.total:
            return f"prompt of {tokens} tokens leaves no room under max_total_tokens {self.total}"
        return dataclasses.replace(self.sampling, max_new_tokens=self.total - tokens)


def sampling(cfg: Sampling, fallback: int = 512) -> Sampling | TotalLength:
    """A stage's sampling from its resolved settings (`presets.resolve`: nothing left to a default
    but what an endpoint is not sent); a max_total_tokens becomes each prompt's max_new_tokens."""
    s = dataclasses.replace(cfg, max_total_tokens=None)
    return TotalLength(s, cfg.max_total_tokens, fallback) if cfg.max_total_tokens else s


class Generators:
    """Each distinct generator config built once (a local paraphraser that also writes the RoTs is
    loaded once)."""

    def __init__(self, build: Callable[..., object] | None = None):
        self._build = build or build_generator
        self._made: dict = {}

    def __call__(self, cfg: GeneratorConfig, batch_size: int, prompt_of=None):
        key = (cfg, batch_size, prompt_of if cfg.kind == "file" else None)
        if key not in self._made:
            self._made[key] = self._build(cfg, batch_size, prompt_of)
        return self._made[key]


def build_generator(cfg: GeneratorConfig, batch_size: int, prompt_of=None):
    """The generator a config names; `prompt_of(row)`: the prompt a recorded file's row answers."""
    if cfg.kind == "openai":
        return OpenAIGenerator(base_url=cfg.base_url, model=cfg.model, api=cfg.api, api_key_env=cfg.api_key_env,
                               concurrency=cfg.concurrency, timeout_s=cfg.timeout_s, max_retries=cfg.max_retries,
                               accepts=cfg.accepts)
    if cfg.kind == "callable":
        raise ConfigError(f"generator kind callable ({cfg.model}) is a Python function given to sage_jax.score; a "
                          "config file names local, openai or file generators")
    if cfg.kind == "file":
        return RecordedGenerator(resolve_data_path(cfg.model), column=cfg.column, prompt_of=prompt_of)
    return LocalLM(cfg.model, dtype=cfg.dtype, chat_template=cfg.chat_template, batch_size=batch_size,
                   raw_bos=True if cfg.bos is None else cfg.bos)


def check_generator(cfg: GeneratorConfig | None, at: str) -> None:
    """Cheap checks before any work: files and folders exist, the API key's variable is set."""
    if cfg is None:
        return
    if cfg.kind == "local" and not Path(cfg.model).is_dir():
        raise ConfigError(f"{at}.model: {cfg.model}: no such folder")
    if cfg.kind == "file":
        resolve_data_path(cfg.model, f"{at}.model")
    if cfg.kind == "openai":
        try:
            read_api_key(cfg.api_key_env)
        except Exception as e:
            raise ConfigError(f"{at}.{e}") from None


@dataclasses.dataclass(frozen=True)
class AnswerPromptOf:
    """The answer prompt a recorded file's row answered (its `paraphrased` column)."""

    chat: bool
    system: str = prompts.ANSWER_CHAT_SYSTEM
    column: str = "paraphrased"
    guide_column: str | None = None  # a guided model's rule of thumb

    def __call__(self, row) -> object:
        rot = row[self.guide_column].strip() if self.guide_column else None
        return prompts.answer_prompt(row[self.column].strip(), self.chat, self.system, rot)


def rot_prompt_of(row) -> str:
    """The RoT prompt a recorded file's row answered (its paraphrase and answer)."""
    return prompts.rot_prompt(row["paraphrased"].strip(), row["model_output"].strip())


# What the stages write under out/:
#     paraphrase  stages/paraphrase/p<i>of<n>/rows.jsonl   one row per question: its kept paraphrases
#     answer      stages/answer/<model>/p<i>of<n>/...       one row per (question, paraphrase, sample)
#     rot         stages/rot/<model>/p<i>of<n>/...          one row per answered row
#     score       report/<model>.answers.csv, scores.json   every process's rows merged
#     report      report/table1.md, table1.csv, <model>.per_question.csv, summary.json, PNG
# Beside them config.yaml (the resolved config: every setting the preset or a model's
# generation_config.json filled in, as `presets.resolve` gives it; it loads back as a config that
# runs the same) and prompts/ (every template). Every output row names its question, paraphrase,
# model, sample, attempt and prompt. Several models share one paraphrase stage and are answered one
# after the other. Process i of n (`hosts`) takes questions i, i + n, ...; the score stage merges
# every process's rows.
class Run:
    """One `sage-jax run`: the resolved config, the output folder and the stages."""

    def __init__(self, cfg: SageRunConfig, *, generators: Generators | None = None, screen=None, embedder=None):
        """generators, embedder, and `screen(question, generation, exclude, reference) ->
        parascore.Screened` (the paraphrase filter): built from the config when None (tests pass
        their own). `self.cfg` is `cfg` resolved (`presets.resolve`)."""
        self.given, self.cfg, self.out = cfg, presets.resolve(cfg), Path(cfg.out)
        self.embedder = embedder
        self.preset = presets.PRESETS[cfg.preset]
        self.reference = self.preset.parsing == "reference"
        self.generators = generators or Generators()
        self._screen = screen
        self.index, self.count = process_share(cfg)
        self.share = f"p{self.index}of{self.count}"

    def check(self, stages: Sequence[str]) -> None:
        """Bad input before long work: the questions file (read whole), every generator the asked
        stages use (paths, the API key's variable), ParaScore's and the embedder's folders."""
        check_output_folder(self.out, option="out", error=ConfigError)
        self.questions()
        cfg = self.cfg
        if "paraphrase" in stages and cfg.paraphrase.source == "generate":
            check_generator(cfg.paraphrase.generator, "paraphrase.generator")
            if self._screen is None and not Path(cfg.paraphrase.scorer.model or "").is_dir():
                raise ConfigError(f"paraphrase.scorer.model: {cfg.paraphrase.scorer.model or '(not set)'}: not a "
                                  "folder; ParaScore needs a BERT folder (SaGE uses bert-base-uncased)")
            if self._screen is None:
                try:
                    check_layer(cfg.paraphrase.scorer.model, cfg.paraphrase.scorer.layer)
                except ValueError as e:
                    raise ConfigError(f"paraphrase.scorer.layer: {e}") from e
        for i, target in enumerate(cfg.models):
            if "answer" in stages:
                check_generator(target.generator, f"models[{i}].generator")
        if "rot" in stages:
            check_generator(cfg.rot.generator, "rot.generator")
        if "score" in stages:
            self.score_folders()

    def score_folders(self) -> dict:
        """The scoring models' folders (`presets.model_folder`; a name not found is a ConfigError)."""
        s = self.cfg.score
        return {"embedder": None if self.embedder is not None else presets.model_folder(s.embedder, "score.embedder"),
                "bertscore_model": presets.model_folder(s.bertscore_model, "score.bertscore_model")
                if s.bertscore else None}

    # ------------------------------------------------------------------ records

    def save_records(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.out / "config.yaml", dump_config(self.cfg).encode())
        for name, text in prompts.templates(self.preset.paraphrase_template, self.preset.chat_system).items():
            (self.out / "prompts").mkdir(exist_ok=True)
            atomic_write_bytes(self.out / "prompts" / name, text.encode())

    def questions(self) -> list[SourceQuestion]:
        return read_source_questions(self.cfg)[self.index::self.count]

    def _stage(self, name: str, folder: Path, tasks, fingerprint: dict, settings) -> Stage:
        return Stage(name, folder, tasks, fingerprint={"stage": name, **fingerprint}, seed=self.cfg.seed,
                     max_attempts=settings.max_attempts, batch_size=settings.batch_size)

    # ------------------------------------------------------------------ paraphrase

    def threshold(self) -> float:
        t = self.cfg.paraphrase.threshold
        return self.preset.parascore_threshold if t is None else t

    def screen(self):
        """The paraphrase filter (`parascore.filter_paraphrases` on the scorer's BERT folder, loaded once)."""
        if self._screen is None:
            s = self.cfg.paraphrase.scorer
            model = load_model(s.model)
            self._screen = lambda question, generation, exclude, reference: filter_paraphrases(
                question, generation, model=model, layer=s.layer, threshold=self.threshold(), gamma=s.gamma,
                omega=s.omega, exclude=exclude, reference=reference)
        return self._screen

    def _paraphrase_judge(self, tasks, texts, previous):
        """Each row's candidates screened (numbered lines, copies of the question and repeats of
        anything kept before dropped, ParaScore at the threshold; the paper's preset is strict;
        preset code parses and keeps as the reference did), added to what earlier attempts kept,
        up to `count`."""
        want, threshold, inclusive = self.cfg.paraphrase.count, self.threshold(), self.preset.parascore_inclusive
        out = []
        for task, text, prev in zip(tasks, texts, previous):
            kept = list(prev["kept"]) if prev else []
            screened = self.screen()(task.context["question"], text, [k["text"] for k in kept], self.reference)
            passing = [p for p in screened.kept if prompts.passes(p.score, threshold, inclusive)]
            kept += [{"text": p.text, "parascore": p.score} for p in passing[:max(0, want - len(kept))]]
            ok = len(kept) >= want
            reason = None if ok else (f"{len(kept)} of {want} paraphrases passed ParaScore "
                                      f"{'>=' if inclusive else '>'} {threshold:g} "
                                      f"({len(screened.kept) + len(screened.rejected)} new candidates)")
            out.append({"ok": ok, "reason": reason, "kept": kept,
                        "rejected": [[c, why] for c, why in screened.rejected]})
        return out

    def paraphrase(self) -> list[dict]:
        cfg = self.cfg.paraphrase
        questions = self.questions()
        folder = self.out / "stages" / "paraphrase" / self.share
        if cfg.source == "file":
            rows = [{"question_id": q.question_id, "paraphrase_index": -1, "model": PARAPHRASER, "sample": 0,
                     "attempt": 0, "prompt": None, "output": None, "status": "ok", "reason": None,
                     "question": q.question, "guide": q.guide,
                     "kept": [{"text": t, "parascore": s, **({"guide": q.guides[i]} if q.guides else {})}
                              for i, (t, s) in enumerate(zip(q.paraphrases, q.scores))]}
                    for q in questions]
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(folder / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
            return rows
        tasks = [Task((q.question_id, -1, PARAPHRASER, 0),
                      prompts.paraphrase_prompt(self.preset.paraphrase_template, q.question),
                      {"question_id": q.question_id, "question": q.question, "guide": q.guide})
                 for q in questions]
        s = sampling(cfg.sampling, self.preset.paraphrase_max_new_tokens)
        stage = self._stage("paraphrase", folder, tasks, {
            "questions": [(q.question_id, q.question) for q in questions], "generator": cfg.generator,
            "scorer": cfg.scorer, "sampling": s, "count": cfg.count, "threshold": self.threshold(),
            "template": self.preset.paraphrase_template, "seed": self.cfg.seed}, cfg)
        return stage.run(lambda: self.generators(cfg.generator, cfg.batch_size), self._paraphrase_judge,
                         n=1, sampling=s, quiet=self.cfg.quiet)

    def finished_rows(self, stage: str, model: str | None = None, share: str | None = None) -> list[dict]:
        folder = self.out / "stages" / stage / (model or "") / (share or self.share)
        path = folder / "rows.jsonl"
        if not path.exists():
            raise StageError(f"stage {stage}{f' ({model})' if model else ''} has not finished for process "
                             f"{share or self.share} ({path} is missing); run it first (--stages {stage})")
        return read_jsonl(path)

    # ------------------------------------------------------------------ answer, rot

    def _text_stage(self, name: str, target, tasks, generator_cfg: GeneratorConfig, settings, s: Sampling,
                    parse, field: str, prompt_of) -> list[dict]:
        """An answer or rot stage: one text per row, checked by `parse` (a recorded file's texts are
        taken as they are, stripped: they were parsed when they were written)."""
        recorded = generator_cfg.kind == "file"

        def judge(tasks, texts, previous):
            out = []
            for text in texts:
                value, reason = (text.strip(), None if text.strip() else f"empty {field}") if recorded else parse(text)
                out.append({"ok": reason is None, "reason": reason, field: value})
            return out

        stage = self._stage(name, self.out / "stages" / name / target.name / self.share, tasks, {
            "tasks": [(t.key, t.prompt) for t in tasks], "generator": generator_cfg, "sampling": s,
            "seed": self.cfg.seed}, settings)
        return stage.run(lambda: self.generators(generator_cfg, settings.batch_size, prompt_of), judge, sampling=s,
                         quiet=self.cfg.quiet, describe=f" ({target.name})")

    def answer(self, target) -> list[dict]:
        settings = self.cfg.answer
        tasks = []
        for row in self.finished_rows("paraphrase"):
            if row["status"] != "ok":
                continue
            for i, k in enumerate(row["kept"][:self.cfg.paraphrase.count]):
                for sample in range(settings.samples):
                    prompt = prompts.answer_prompt(k["text"], target.chat, self.preset.chat_system,
                                                   k.get("guide", row.get("guide")) if target.guided else None)
                    tasks.append(Task((row["question_id"], i, target.name, sample), prompt,
                                      {"question_id": row["question_id"], "question": row["question"],
                                       "paraphrase": k["text"], "parascore": k["parascore"], "sample": sample}))
        s = sampling(target.sampling)  # resolved: the shared answer sampling, the target's own, the preset's
        whole = target.chat or target.generator.kind == "callable"  # a function's reply is kept whole, as the library's
        parse = prompts.parse_chat_answer if whole else (lambda text: prompts.parse_answer(text, self.reference))
        return self._text_stage("answer", target, tasks, target.generator, settings, s, parse, "answer",
                                AnswerPromptOf(target.chat, self.preset.chat_system, target.generator.prompt_column,
                                               self.cfg.guide_column if target.guided else None))

    def rot(self, target) -> list[dict]:
        settings = self.cfg.rot
        tasks = [Task((r["question_id"], r["paraphrase_index"], target.name, r["sample"]),
                      prompts.rot_prompt(r["paraphrase"], r["answer"]),
                      {"question_id": r["question_id"], "question": r["question"], "paraphrase": r["paraphrase"],
                       "parascore": r["parascore"], "sample": r["sample"]})
                 for r in self.finished_rows("answer", target.name) if r["status"] == "ok"]
        s = sampling(settings.sampling)
        return self._text_stage("rot", target, tasks, settings.generator, settings, s,
                                lambda text: prompts.parse_rot(text, self.reference), "rot", rot_prompt_of)

    # ------------------------------------------------------------------ all

    def run(self, stages: Sequence[str] = STAGES) -> dict | None:
        self.save_records()
        if "paraphrase" in stages:
            self.paraphrase()
        for target in self.cfg.models:
            if "answer" in stages:
                self.answer(target)
            if "rot" in stages and self.cfg.rot.generator is not None:
                self.rot(target)
        if self.index != 0 or not ({"score", "report"} & set(stages)):
            return None
        return report.score_and_report(self, stages)
