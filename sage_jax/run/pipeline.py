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
from clarifyjax.files.textfiles import atomic_write_bytes, check_output_folder
from clarifyjax.text.generator import Sampling, TokenCounter
from sage_jax.run import presets, prompts, report
from sage_jax.run.config import GeneratorConfig, SageRunConfig
from sage_jax.run.stages import Stage, StageError, Task, read_jsonl
from sage_jax.run.questions import SourceQuestion, read_source_questions
from clarifyjax.files.tables import DataError, resolve_data_path
from clarifyjax.decoding.local_lm import LocalLM
from sage_jax.run.generators import OpenAIGenerator, RecordedGenerator, read_api_key
from clarifyjax.evaluation.bertscore import check_layer, check_model_folder, load_model
from clarifyjax.core.commands import one_line
from clarifyjax.models.embedder import check_embedder_folder
from clarifyjax.models.hf import check_causal_lm_folder
from clarifyjax.text.tokenizer import CausalTokenizer
from sage_jax.parascore import filter_paraphrases

STAGES = ("paraphrase", "answer", "rot", "score", "report")
PARAPHRASER = "paraphraser"  # the model field of paraphrase rows


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
    """Checks before any work: a local folder read as `LocalLM` reads it but for its weights
    (config.json, generation_config.json, every tensor's name and shape in the safetensors
    headers, the tokenizer), a file exists, the API key's variable is set."""
    if cfg is None:
        return
    if cfg.kind == "local" and not Path(cfg.model).is_dir():
        raise ConfigError(f"{at}.model: {cfg.model}: no such folder")
    if cfg.kind == "local":
        try:
            check_causal_lm_folder(cfg.model, dtype=cfg.dtype)
            CausalTokenizer(cfg.model)
        except (OSError, ValueError) as e:  # CheckpointError: a ValueError naming the file and field
            text = one_line(str(e))
            raise ConfigError(f"{at}.model: {text if cfg.model in text else f'{cfg.model}: {text}'}") from None
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

    def __init__(self, cfg: SageRunConfig, *, generators: Generators | None = None, screen=None, embedder=None,
                 questions_file: bytes | None = None):
        """generators, embedder, and `screen(question, generation, exclude, reference) ->
        parascore.Screened` (the paraphrase filter): built from the config when None (tests pass
        their own). `self.cfg` is `cfg` resolved (`presets.resolve`). `questions_file`: the bytes
        of a questions file the caller derives (sage_jax.score's questions.csv), read from here and
        written to `cfg.questions` only once every check has passed."""
        self.given, self.cfg, self.out = cfg, presets.resolve(cfg), Path(cfg.out)
        self.questions_file = questions_file
        self.embedder = embedder
        self.preset = presets.PRESETS[cfg.preset]
        self.reference = self.preset.parsing == "reference"
        self.generators = generators or Generators()
        self._screen = screen
        self.index, self.count = process_share(cfg)
        self.share = f"p{self.index}of{self.count}"

    def check(self, stages: Sequence[str]) -> None:
        """Bad input before the first answer and before anything is written: the questions file
        (read whole), every generator the asked stages use (a local folder but for its weights, a
        recorded file read whole, the API key's variable), ParaScore's folder, the embedder's and
        BERTScore's but for weights, and what `out` holds of an earlier start (`check_rerun`)."""
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
                self._check_recorded(target.generator, cfg.answer, self.answer_prompt_of(target),
                                     f"models[{i}].generator")
        if "rot" in stages:
            check_generator(cfg.rot.generator, "rot.generator")
            self._check_recorded(cfg.rot.generator, cfg.rot, rot_prompt_of, "rot.generator")
        if "score" in stages:
            self.check_scoring_models()
        self.check_rerun()

    def _check_recorded(self, cfg: GeneratorConfig | None, settings, prompt_of, at: str) -> None:
        """A recorded generator's file read whole as its stage reads it (its text column, each
        row's prompt); the generator built is the one the stage uses."""
        if cfg is not None and cfg.kind == "file":
            try:
                self.generators(cfg, settings.batch_size, prompt_of)
            except DataError as e:
                raise DataError(f"{at}: {e}") from None

    def check_scoring_models(self) -> None:
        """The scoring models' folders (`score_folders`), each read but for its weights."""
        folders, layer = self.score_folders(), self.cfg.score.bertscore_layer
        checks = {"embedder": check_embedder_folder,
                  "bertscore_model": lambda folder: check_model_folder(folder, layer)}
        for key, check in checks.items():
            try:
                if folders[key] is not None:
                    check(folders[key])
            except (OSError, ValueError) as e:
                raise ConfigError(f"score.{key}: {one_line(str(e))}", key=f"score.{key}") from None

    def score_folders(self) -> dict:
        """The scoring models' folders (`presets.model_folder`; a name not found is a ConfigError)."""
        s = self.cfg.score
        return {"embedder": None if self.embedder is not None else presets.model_folder(s.embedder, "score.embedder"),
                "bertscore_model": presets.model_folder(s.bertscore_model, "score.bertscore_model")
                if s.bertscore else None}

    # ------------------------------------------------------------------ records

    def save_records(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.questions_file is not None:
            atomic_write_bytes(Path(self.cfg.questions), self.questions_file)
        atomic_write_bytes(self.out / "config.yaml", dump_config(self.cfg).encode())
        for name, text in prompts.templates(self.preset.paraphrase_template, self.preset.chat_system).items():
            (self.out / "prompts").mkdir(exist_ok=True)
            atomic_write_bytes(self.out / "prompts" / name, text.encode())

    def questions(self) -> list[SourceQuestion]:
        return read_source_questions(self.cfg, self.questions_file)[self.index::self.count]

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

    def file_paraphrases(self) -> list[dict]:
        """The paraphrase rows of paraphrase.source file: the questions file's, one row per question."""
        return [{"question_id": q.question_id, "paraphrase_index": -1, "model": PARAPHRASER, "sample": 0,
                 "attempt": 0, "prompt": None, "output": None, "status": "ok", "reason": None,
                 "question": q.question, "guide": q.guide,
                 "kept": [{"text": t, "parascore": s, **({"guide": q.guides[i]} if q.guides else {})}
                          for i, (t, s) in enumerate(zip(q.paraphrases, q.scores))]}
                for q in self.questions()]

    def paraphrase_stage(self) -> Stage:
        cfg, questions = self.cfg.paraphrase, self.questions()
        tasks = [Task((q.question_id, -1, PARAPHRASER, 0),
                      prompts.paraphrase_prompt(self.preset.paraphrase_template, q.question),
                      {"question_id": q.question_id, "question": q.question, "guide": q.guide})
                 for q in questions]
        return self._stage("paraphrase", self.out / "stages" / "paraphrase" / self.share, tasks, {
            "questions": [(q.question_id, q.question) for q in questions], "generator": cfg.generator,
            "scorer": cfg.scorer, "sampling": self.paraphrase_sampling(), "count": cfg.count,
            "threshold": self.threshold(), "template": self.preset.paraphrase_template, "seed": self.cfg.seed}, cfg)

    def paraphrase_sampling(self):
        return sampling(self.cfg.paraphrase.sampling, self.preset.paraphrase_max_new_tokens)

    def paraphrase(self) -> list[dict]:
        cfg = self.cfg.paraphrase
        if cfg.source == "file":
            rows = self.file_paraphrases()
            atomic_write_bytes(self.out / "stages" / "paraphrase" / self.share / "rows.jsonl",
                               "".join(json.dumps(r) + "\n" for r in rows).encode())
            return rows
        return self.paraphrase_stage().run(lambda: self.generators(cfg.generator, cfg.batch_size),
                                           self._paraphrase_judge, n=1, sampling=self.paraphrase_sampling(),
                                           quiet=self.cfg.quiet)

    def finished_rows(self, stage: str, model: str | None = None, share: str | None = None) -> list[dict]:
        folder = self.out / "stages" / stage / (model or "") / (share or self.share)
        path = folder / "rows.jsonl"
        if not path.exists():
            raise StageError(f"stage {stage}{f' ({model})' if model else ''} has not finished for process "
                             f"{share or self.share} ({path} is missing); run it first (--stages {stage})")
        return read_jsonl(path)

    # ------------------------------------------------------------------ answer, rot

    def _text_stage(self, name: str, target, tasks, generator_cfg: GeneratorConfig, settings, s: Sampling) -> Stage:
        return self._stage(name, self.out / "stages" / name / target.name / self.share, tasks, {
            "tasks": [(t.key, t.prompt) for t in tasks], "generator": generator_cfg, "sampling": s,
            "seed": self.cfg.seed}, settings)

    def _run_text_stage(self, stage: Stage, target, generator_cfg: GeneratorConfig, settings, s: Sampling,
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

        return stage.run(lambda: self.generators(generator_cfg, settings.batch_size, prompt_of), judge, sampling=s,
                         quiet=self.cfg.quiet, describe=f" ({target.name})")

    def answer_stage(self, target) -> Stage:
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
        # resolved: the shared answer sampling, the target's own, the preset's
        return self._text_stage("answer", target, tasks, target.generator, settings, sampling(target.sampling))

    def answer(self, target) -> list[dict]:
        whole = target.chat or target.generator.kind == "callable"  # a function's reply is kept whole, as the library's
        parse = prompts.parse_chat_answer if whole else (lambda text: prompts.parse_answer(text, self.reference))
        return self._run_text_stage(self.answer_stage(target), target, target.generator, self.cfg.answer,
                                    sampling(target.sampling), parse, "answer", self.answer_prompt_of(target))

    def answer_prompt_of(self, target) -> AnswerPromptOf:
        """The answer prompt each row of a target's recorded file answered."""
        return AnswerPromptOf(target.chat, self.preset.chat_system, target.generator.prompt_column,
                              self.cfg.guide_column if target.guided else None)

    def rot_stage(self, target) -> Stage:
        tasks = [Task((r["question_id"], r["paraphrase_index"], target.name, r["sample"]),
                      prompts.rot_prompt(r["paraphrase"], r["answer"]),
                      {"question_id": r["question_id"], "question": r["question"], "paraphrase": r["paraphrase"],
                       "parascore": r["parascore"], "sample": r["sample"]})
                 for r in self.finished_rows("answer", target.name) if r["status"] == "ok"]
        return self._text_stage("rot", target, tasks, self.cfg.rot.generator, self.cfg.rot,
                                sampling(self.cfg.rot.sampling))

    def rot(self, target) -> list[dict]:
        settings = self.cfg.rot
        return self._run_text_stage(self.rot_stage(target), target, settings.generator, settings,
                                    sampling(settings.sampling), lambda text: prompts.parse_rot(text, self.reference),
                                    "rot", rot_prompt_of)

    # ------------------------------------------------------------------ all

    def check_rerun(self) -> None:
        """What an earlier start left in `out` (this process's share), against this config, before
        anything is written: every stage folder must be this run's (`Stage.check`: the settings
        it recorded, the batches this run would schedule), the paraphrase rows of a file source
        this questions file's. A ConfigError otherwise, so a refused rerun changes nothing."""
        paraphrased = self.out / "stages" / "paraphrase" / self.share / "rows.jsonl"
        if self.cfg.paraphrase.source == "generate":
            self.paraphrase_stage().check(error=ConfigError)
        elif paraphrased.exists() and read_jsonl(paraphrased) != json.loads(json.dumps(self.file_paraphrases())):
            raise ConfigError(f"{paraphrased.parent}: holds the paraphrase rows of another questions file, limit "
                              "or paraphrase column; use another out folder or remove it")
        if not paraphrased.exists():
            return  # no later stage has started
        for target in self.cfg.models:
            self.answer_stage(target).check(error=ConfigError)
            answered = self.out / "stages" / "answer" / target.name / self.share / "rows.jsonl"
            if self.cfg.rot.generator is not None and answered.exists():
                self.rot_stage(target).check(error=ConfigError)

    def run(self, stages: Sequence[str] = STAGES) -> dict | None:
        self.check_rerun()
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
