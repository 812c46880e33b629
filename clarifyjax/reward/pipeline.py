"""ClarifyDelphi's reward, composed: judgment -> answers -> NLI filter -> fusion -> judge -> JSD.

`RewardPipeline` runs each model stage as one jitted call over bucketed rows, so a repeated batch
size compiles each stage once (`traces` counts them); its stages and the handling of dropped
answers are listed above it. Its settings are `config.PipelineConfig`; `load_pipeline` builds it
from a run's `RewardConfig`, for training and `clarifyjax score-questions` alike."""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any
from collections.abc import Sequence

import jax
import numpy as np


from clarifyjax.core import traces
from clarifyjax.reward import jsd
from clarifyjax.reward.judge import load_judge
from clarifyjax.text import formats
from clarifyjax.config import PipelineConfig
from clarifyjax.config.loader import check_tree, ConfigError
from clarifyjax.decoding.seq2seq import Seq2SeqModel
from clarifyjax.text.generator import Sampling
from clarifyjax.reward.nli import NLIFilter

DROPPED_POLICIES = ("zero_reward", "resample", "blank")
COUNT_KEYS = ("questions", "empty_questions", "truncated_questions", "answers", "empty_answers",
              "nli_dropped", "resampled", "recovered", "dropped", "empty_fusions", "invalid_pairs",
              "truncated_judge_inputs", "truncated_answer_inputs", "truncated_fusion_inputs")


def check_config(config: PipelineConfig) -> PipelineConfig:
    """`config`, checked as the config loader checks a ``rewards:`` section (for a config built in
    code): the policy name, each number's range and the cross-field rules."""
    if config.dropped_answer not in DROPPED_POLICIES:
        raise ValueError(f"PipelineConfig.dropped_answer must be one of {DROPPED_POLICIES}, "
                         f"got {config.dropped_answer!r}")
    check_tree(config, "PipelineConfig")
    return config


def stage_sampling(config: PipelineConfig, stage: str) -> Sampling:
    """How the "answers", "resample", "fusion" or "judgment" stage decodes (temperature 0:
    greedy; the judge's judgment text is always greedy)."""
    if stage == "answers":
        return Sampling(max_new_tokens=config.answer_max_length,
                        temperature=config.answer_temperature, top_k=config.answer_top_k,
                        top_p=config.answer_top_p)
    if stage == "resample":
        return Sampling(max_new_tokens=config.answer_max_length,
                        temperature=config.resampling_temperature, top_k=config.answer_top_k,
                        top_p=config.resample_top_p)
    if stage == "fusion":
        return Sampling(max_new_tokens=config.fusion_max_length,
                        temperature=config.fusion_temperature)
    if stage == "judgment":
        return Sampling(max_new_tokens=config.judgment_max_length)
    raise ValueError(f"no sampling stage {stage!r}")


@dataclasses.dataclass(frozen=True)
class RewardOutput:
    """What `RewardPipeline.__call__` computed for b questions.

    reward [b] float32: `normalizer(raw_reward)`; raw_reward [b]: the JSD where `valid`, else
    `dropped_reward`; jsd [b]: JSD_2(p_weak, p_strong) of what was fused and judged (rows with an
    empty question: 0); valid [b] bool: the reward is the JSD; p_base, p_weak, p_strong [b, 3]
    (bad, ok, good) of the base and updated situations (rows with an empty question: p_base);
    dropped [b, 2] bool: the (weakener, strengthener) answer was dropped (after resampling);
    answered [b, 2] bool: the answer exists and was fused into a non-empty situation.
    Texts are lists of b strings ("" where nothing was made). counts: see `RewardPipeline`.
    """

    reward: np.ndarray
    raw_reward: np.ndarray
    jsd: np.ndarray
    valid: np.ndarray
    p_base: np.ndarray
    p_weak: np.ndarray
    p_strong: np.ndarray
    dropped: np.ndarray
    answered: np.ndarray
    questions: list[str]
    judgments: list[str]
    weak_answers: list[str]
    strong_answers: list[str]
    weak_situations: list[str]
    strong_situations: list[str]
    counts: dict[str, int]

    def table4(self) -> dict[str, float]:
        """The paper's Table 4: average JSD over valid pairs, and the share of answers (kept and
        fused) whose updated situation flips the judge's argmax against the base situation."""
        flips_valid = self.answered & self.valid[:, None]
        p_updated = np.stack([self.p_weak, self.p_strong], axis=1)
        return {"avg_jsd": float(jsd.average_jsd(self.p_weak, self.p_strong, self.valid)),
                "judgment_flips": float(jsd.flip_rate(self.p_base, p_updated, flips_valid)),
                "pairs": int(self.valid.sum()), "answers": int(flips_valid.sum())}

    def rows(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per question."""
        out = []
        for i in range(len(self.reward)):
            out.append({
                "question": self.questions[i], "reward": float(self.reward[i]),
                "raw_reward": float(self.raw_reward[i]), "jsd": float(self.jsd[i]),
                "valid": bool(self.valid[i]), "judgment": self.judgments[i],
                "weak_answer": self.weak_answers[i], "strong_answer": self.strong_answers[i],
                "weak_dropped": bool(self.dropped[i, 0]),
                "strong_dropped": bool(self.dropped[i, 1]),
                "weak_situation": self.weak_situations[i],
                "strong_situation": self.strong_situations[i],
                "p_base": [float(x) for x in self.p_base[i]],
                "p_weak": [float(x) for x in self.p_weak[i]],
                "p_strong": [float(x) for x in self.p_strong[i]]})
        return out


def _string(value, field: str, row: int) -> str:
    if not isinstance(value, str):
        raise formats.TextFormatError(f"row {row}: field {field!r} must be a string, got "
                                      f"{type(value).__name__}")
    return formats.normalize_whitespace(value)


def _trace_total(nli) -> int:
    """Compilations so far of the jitted functions the stages run (the NLI filter counts its own,
    per instance and shape)."""
    return traces.count() + (sum(nli.traces.values()) if hasattr(nli, "traces") else 0)


def _as_key(rng) -> jax.Array | None:
    if rng is None or isinstance(rng, jax.Array):
        return rng
    return jax.random.key(int(rng))


# Stages for b (situation, question) pairs (paper §3.2-3.3): the judge's judgment text of each
# situation (greedy; the answerer's input); a weakener and a strengthener answer per question (2b
# inputs in one batch); the NLI filter drops answers the situation entails or contradicts; fusion
# (2b inputs); the judge on the b base and 2b updated situations; the JSD, then the normalizer.
# A dropped answer (filtered, or empty) follows `PipelineConfig.dropped_answer`:
#   zero_reward  the pair's raw reward is `dropped_reward` (0: no defeasibility shown), before
#                normalization; its fused situations are still computed (blank answer) and reported;
#   resample     up to `resample_k` rounds of new answers for the dropped ones only, then as
#                zero_reward for those still dropped;
#   blank        the original: the answer is blanked and still fused; the reward is the JSD.
# An empty fused situation makes its pair invalid (`dropped_reward`), or with `empty_fusion: judge`
# the judge reads the empty text, as the original did. An empty question gives its row
# `dropped_reward` without model calls; one longer than `max_question_words` words is cut there.
# All are counted; docs/fidelity.md compares every setting with the original code.
class RewardPipeline:
    """answerer, fusion: `Seq2SeqModel`s; judge: a `judge.Judge` or `judge.ClassifierJudge`;
    nli: a `nli.NLIFilter` (or anything with `__call__(premises, hypotheses) -> .keep [n]`), or
    None for no filter.

    After each call: `traces` (Counter) counts jit traces per stage over the pipeline's life;
    `timings` (dict) the seconds of each stage of the last call.
    Counts in `RewardOutput.counts`: questions, empty_questions, truncated_questions, answers
    (generated in the first pass), empty_answers, nli_dropped (first pass, by NLI), resampled
    (answers drawn again), recovered (dropped answers replaced by kept ones), dropped (answers
    dropped at the end, all fused blank), empty_fusions, invalid_pairs
    (rows whose reward is `dropped_reward`), truncated_{judge,answer,fusion}_inputs.
    """

    def __init__(self, answerer: Seq2SeqModel, fusion: Seq2SeqModel, judge, nli=None,
                 config: PipelineConfig = PipelineConfig(),
                 normalizer: jsd.RewardNormalizer | None = None):
        """config: the settings (a `RewardConfig` gives its `.pipeline`); normalizer: None gives
        the raw JSD as the reward."""
        self.answerer, self.fusion, self.judge, self.nli = answerer, fusion, judge, nli
        self.config, self.normalizer = check_config(config), normalizer
        self.traces: collections.Counter = collections.Counter()
        self.timings: dict[str, float] = {}

    @classmethod
    def from_folders(cls, *, answerer, fusion, judge, nli=None,
                     config: PipelineConfig = PipelineConfig(), normalizer=None,
                     backend: str = "hf",
                     dtype: str = "float32", max_input_length: int = 128, batch_multiple: int = 8,
                     nli_batch_size: int = 128,
                     judge_options: dict | None = None, mesh=None,
                     rules=None) -> RewardPipeline:
        """Load the four models from Hugging Face folders (`nli` None: no filter; else an
        `NLIFilter` with `config.nli_threshold`).

        nli_batch_size: pairs per NLI forward; 2 x the questions per call keeps it one call.
        judge_options: keyword arguments of `load_judge` (kind, class_prefix, ...).
        mesh, rules: a `sharding.process_mesh` and logical axis rules: every model is read
          straight into its shards there, and each stage's rows are split over its data x fsdp
          devices.
        """
        _check_judge_options(judge_options)
        common = dict(backend=backend, dtype=dtype, max_input_length=max_input_length,
                      batch_multiple=batch_multiple, mesh=mesh, rules=rules)
        return cls(Seq2SeqModel.from_pretrained(answerer, **common),
                   Seq2SeqModel.from_pretrained(fusion, **common),
                   load_judge(judge, **{**common, **(judge_options or {})}),
                   None if nli is None else NLIFilter.from_pretrained(
                       nli, threshold=config.nli_threshold, dtype=dtype,
                       max_length=max_input_length,
                       batch_size=nli_batch_size, mesh=mesh, rules=rules),
                   config, normalizer)

    def _stage(self, name: str, fn, *args, **kwargs):
        before, t0 = _trace_total(self.nli), time.perf_counter()
        out = fn(*args, **kwargs)
        self.traces[name] += _trace_total(self.nli) - before
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        return out

    def _keep(self, premises: list[str], answers: list[str], counts, first: bool) -> np.ndarray:
        """[n] bool: the answer is non-empty and (with a filter) the NLI model keeps it."""
        keep = np.array([bool(a) for a in answers], bool)
        if first:
            counts["empty_answers"] += int((~keep).sum())
        nonempty = np.flatnonzero(keep)
        if self.nli is not None and nonempty.size:
            period = self.config.nli_premise_period
            pairs = [formats.nli_pair(premises[i], answers[i], period=period,
                                      where=f"answer {i}") for i in nonempty]
            result = self._stage("nli", self.nli, [p for p, _ in pairs], [h for _, h in pairs])
            kept = np.asarray(result.keep, bool)
            keep[nonempty] = kept
            if first:
                counts["nli_dropped"] += int((~kept).sum())
        return keep

    def __call__(self, situations: Sequence[str], questions: Sequence[str],
                 rng: jax.Array | int | None = None) -> RewardOutput:
        """Rewards of b questions about b situations (the policy prefix may be on either).

        rng: a key (or an int seed); needed when any stage samples (temperatures > 0, resample).
        Raises text.TextFormatError for an empty situation (naming its row), ValueError for
        lengths that differ.
        """
        self.timings = {}
        sits, qs, counts = self._prepare(situations, questions)
        b = len(sits)
        active = np.flatnonzero([bool(q) for q in qs])
        counts["empty_questions"] = b - active.size
        keys = self._keys(rng)
        # 1. judgment text of the base situations
        judgments = self._judgments(sits, active, counts)
        # 2, 3. weakener and strengthener answers (rows [0, n) weak, [n, 2n) strong), NLI filter
        premises = [sits[i] for i in active] * 2
        answers, keep = self._answers(sits, qs, judgments, active, premises, keys, counts)
        # 4. fusion of every answer into its situation
        fused, fused_ok = self._fuse(premises, qs, answers, keep, active, keys[1], counts)
        # 5. the judge on base + weak + strong situations in one batch
        before = self.judge.truncated_inputs
        if self.config.empty_fusion == "judge":  # the original: judge "" too
            probs = self._stage("judge", self.judge.class_probabilities, sits + fused,
                                allow_empty=True)
        else:  # an empty fusion's pair is invalid: judge its situation in its place
            judged = [t if ok else p for t, ok, p in zip(fused, fused_ok, premises)]
            probs = self._stage("judge", self.judge.class_probabilities, sits + judged)
        counts["truncated_judge_inputs"] += self.judge.truncated_inputs - before
        # 6. the reward
        return self._output(probs, qs, judgments, answers, keep, fused, fused_ok, active, counts)

    def _prepare(self, situations, questions) -> tuple[list[str], list[str], collections.Counter]:
        """Situations without the policy prefix (an empty one is an error naming its row), and
        questions cut to `max_question_words` (counted)."""
        cfg = self.config
        situations, questions = list(situations), list(questions)
        if len(situations) != len(questions):
            raise ValueError(f"RewardPipeline: {len(situations)} situations but {len(questions)} "
                             "questions")
        counts: collections.Counter = collections.Counter({k: 0 for k in COUNT_KEYS})
        counts["questions"] = len(situations)
        sits = []
        for i, s in enumerate(situations):
            s = formats.strip_policy_prefix(_string(s, "situation", i))
            if not s:
                raise formats.TextFormatError(f"row {i}: field 'situation' is empty")
            sits.append(s)
        qs = []
        for i, q in enumerate(questions):
            words = _string(q, "question", i).split(" ")
            if len(words) > cfg.max_question_words:
                words, counts["truncated_questions"] = (words[: cfg.max_question_words],
                                                        counts["truncated_questions"] + 1)
            qs.append(" ".join(words).strip())
        return sits, qs, counts

    def _keys(self, rng) -> list:
        """One key per sampling stage: answers, fusion, then each resampling round."""
        cfg = self.config
        key = _as_key(rng)
        needs_rng = (cfg.answer_temperature > 0 or cfg.fusion_temperature > 0
                     or cfg.dropped_answer == "resample")
        if needs_rng and key is None:
            raise ValueError("RewardPipeline: this configuration samples; pass rng")
        n = 2 + cfg.resample_k
        return list(jax.random.split(key, n)) if key is not None else [None] * n

    def _judgments(self, sits, active, counts) -> list[str]:
        """The judge's judgment text of each base situation ("" where not asked for)."""
        judgments = [""] * len(sits)
        if self.config.use_judgment_text and active.size:
            before = self.judge.truncated_inputs
            act_sits = [sits[i] for i in active]
            for i, j in zip(active, self._stage("judgment", self.judge.judgment_text, act_sits,
                                                stage_sampling(self.config, "judgment"))):
                judgments[i] = j
            counts["truncated_judge_inputs"] += self.judge.truncated_inputs - before
        return judgments

    def _answers(self, sits, qs, judgments, active, premises, keys, counts):
        """Weakener and strengthener answers ([2n], weak first) and which the NLI filter keeps,
        after resampling what it dropped when so configured."""
        cfg = self.config
        answer_inputs = [formats.answer_input(sits[i], qs[i], kind, judgments[i], where=f"row {i}")
                         for kind in formats.UPDATE_TYPES for i in active]
        answers = self._stage("answers", self.answerer.generate, answer_inputs,
                              stage_sampling(cfg, "answers"), rng=keys[0])
        counts["truncated_answer_inputs"] += answers.truncated_inputs
        answers = list(answers.texts)
        counts["answers"] = len(answers)
        keep = self._keep(premises, answers, counts, first=True)
        first_dropped = int((~keep).sum())
        if cfg.dropped_answer == "resample":
            for round_ in range(cfg.resample_k):
                todo = np.flatnonzero(~keep)
                if not todo.size:
                    break
                redo = self._stage("resample", self.answerer.generate,
                                   [answer_inputs[i] for i in todo],
                                   stage_sampling(cfg, "resample"),
                                   rng=keys[2 + round_], power_of_two_rows=True)
                counts["resampled"] += todo.size
                for i, a in zip(todo, redo.texts):
                    answers[i] = a
                keep[todo] = self._keep([premises[i] for i in todo], redo.texts, counts,
                                        first=False)
            counts["recovered"] = first_dropped - int((~keep).sum())
        counts["dropped"] = int((~keep).sum())
        return answers, keep

    def _fuse(self, premises, qs, answers, keep, active, key, counts):
        """Every answer (a dropped one blank) fused into its situation: texts [2n], and which
        are non-empty."""
        n = active.size
        fused_answers = [a if k else "" for a, k in zip(answers, keep)]
        period = self.config.fusion_situation_period
        fusion_inputs = [formats.fusion_input(premises[r], qs[active[r % n]], fused_answers[r],
                                              period=period, where=f"row {active[r % n]}")
                         for r in range(2 * n)]
        fused = self._stage("fusion", self.fusion.generate, fusion_inputs,
                            stage_sampling(self.config, "fusion"), rng=key)
        counts["truncated_fusion_inputs"] += fused.truncated_inputs
        fused_ok = np.array([bool(t) for t in fused.texts], bool)
        counts["empty_fusions"] = int((~fused_ok).sum())
        return list(fused.texts), fused_ok

    def _output(self, probs, qs, judgments, answers, keep, fused, fused_ok, active, counts
                ) -> RewardOutput:
        """The reward of each row from the judge's [b + 2n, 3] probabilities."""
        cfg, b, n = self.config, len(qs), active.size
        p_base = probs[:b]
        p_weak, p_strong = p_base.copy(), p_base.copy()
        p_weak[active], p_strong[active] = probs[b: b + n], probs[b + n:]
        dropped = np.zeros((b, 2), bool)
        dropped[active] = (~keep).reshape(2, n).T
        answered = np.zeros((b, 2), bool)
        answered[active] = (keep & fused_ok).reshape(2, n).T
        valid = np.zeros(b, bool)
        pair_ok = np.ones(n, bool)
        if cfg.empty_fusion != "judge":
            pair_ok &= fused_ok.reshape(2, n).all(0)
        if cfg.dropped_answer != "blank":
            pair_ok &= keep.reshape(2, n).all(0)
        valid[active] = pair_ok
        counts["invalid_pairs"] = int(b - valid.sum())
        divergence = np.asarray(jsd.jsd(p_weak, p_strong, axis=-1), np.float32)
        raw = np.asarray(jsd.defeasibility_reward(p_weak, p_strong, valid,
                                                  cfg.dropped_reward), np.float32)
        reward = raw if self.normalizer is None else np.asarray(self.normalizer(raw), np.float32)

        def spread(values: list[str], part: int) -> list[str]:
            out = [""] * b
            for r, i in enumerate(active):
                out[i] = values[part * n + r]
            return out

        situations = [t if ok else "" for t, ok in zip(fused, fused_ok)]
        return RewardOutput(
            reward=reward, raw_reward=raw, jsd=divergence, valid=valid, p_base=p_base, p_weak=p_weak,
            p_strong=p_strong, dropped=dropped, answered=answered, questions=qs,
            judgments=judgments, weak_answers=spread(answers, 0),
            strong_answers=spread(answers, 1), weak_situations=spread(situations, 0),
            strong_situations=spread(situations, 1),
            counts={k: int(v) for k, v in sorted(counts.items())})


def _check_judge_options(judge_options) -> None:
    """The judgment text's length is the pipeline's setting (it passes it on every call): a
    `judgment` judge option would be ignored."""
    if judge_options and "judgment" in judge_options:
        raise ValueError("judge_options: 'judgment' is the pipeline's judgment_max_length "
                         "(PipelineConfig), not a judge option")


def load_pipeline(rewards, *, normalizer: jsd.RewardNormalizer | None = None,
                  mesh=None, rules=None, backend: str = "hf", nli_batch_size: int = 64,
                  judge_options: dict | None = None) -> RewardPipeline:
    """The pipeline of a `clarifyjax.config.RewardConfig` (a PPO run's ``rewards:`` section, or
    what `clarifyjax score-questions` builds): its four models, read from their folders, and its
    `PipelineConfig`. mesh, rules: as `RewardPipeline.from_folders`. judge_options: more keyword
    arguments of `load_judge` (class_step, judgment).

    Raises:
      ConfigError: a model that is not a trained folder (``init``; a loaded config has one).
    """
    _check_judge_options(judge_options)

    def folder(m, key):
        if m.init is None:
            raise ConfigError(f"{key}.init: the reward models must be trained folders (a random "
                              "'tiny' model is not a reward model)")
        return m.init

    def seq2seq(m, key):
        return Seq2SeqModel.from_pretrained(
            folder(m, key), tokenizer_path=m.tokenizer, dtype=m.dtype, backend=backend,
            max_input_length=m.max_input_length, mesh=mesh, rules=rules, precision=m.precision)

    j = rewards.judge
    judge = load_judge(folder(j.model, "judge.model"), kind=j.kind, dtype=j.model.dtype,
                       backend=backend, max_input_length=j.model.max_input_length,
                       input_prefix=j.input_prefix, class_prefix=j.class_prefix,
                       class_tokens=j.class_tokens, encoder_labels=j.encoder_labels,
                       mesh=mesh, rules=rules, precision=j.model.precision,
                       **(judge_options or {}))
    nli = None if rewards.nli is None else NLIFilter.from_pretrained(
        folder(rewards.nli, "nli"), threshold=rewards.nli_threshold, dtype=rewards.nli.dtype,
        max_length=rewards.nli.max_input_length, batch_size=nli_batch_size, mesh=mesh,
        rules=rules, precision=rewards.nli.precision)
    return RewardPipeline(seq2seq(rewards.answerer, "answerer"), seq2seq(rewards.fusion, "fusion"),
                          judge, nli, rewards.pipeline, normalizer)


def concat_outputs(outputs: Sequence[RewardOutput]) -> RewardOutput:
    """One `RewardOutput` of several calls' rows, in order (counts summed)."""
    if not outputs:
        raise ValueError("concat_outputs: no outputs")
    values = {}
    for field in dataclasses.fields(RewardOutput):
        parts = [getattr(o, field.name) for o in outputs]
        if field.name == "counts":
            total: collections.Counter = collections.Counter()
            for p in parts:
                total.update(p)
            values["counts"] = {k: int(v) for k, v in sorted(total.items())}
        elif isinstance(parts[0], np.ndarray):
            values[field.name] = np.concatenate(parts)
        else:
            values[field.name] = [x for p in parts for x in p]
    return RewardOutput(**values)
