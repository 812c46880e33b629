"""The two T5-large PPO presets against docs/fidelity.md and against the original's behaviour.

* the table of docs/fidelity.md is parsed and every row checked against both resolved presets
  (a config key: its value; a "fixed:" row: the code's behaviour), and every setting in which the
  presets differ has a row: the document cannot drift from the files;
* the NLI rules: argmax (``nli_threshold: null``, the original's) and a threshold disagree on a
  hand-made probability row; each preset picks the one its row says, from YAML and the CLI;
* answer sampling (temperature, top-k, top-p, length), the NLI premise and fusion situation
  periods, the judgment length and the empty-fusion policy reach the reward pipeline as each
  preset says (stub models that record what they are given); our `filter_logits` at the presets'
  answer settings equals transformers' warpers in transformers 4.9.1's order;
* Adam with the presets' epsilon equals `torch.optim.Adam(lr=1e-5, eps=1e-5)`, the original's;
* a vocabulary in which "-1" is not one piece: the original's lookup
  (`convert_tokens_to_ids("-1")`) silently gives <unk>; ours refuses with a clear error.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from clarifyjax.reward import nli

from clarifyjax.rl import ppo

from clarifyjax.rl import rollout
from clarifyjax.text import formats
from clarifyjax.config import load_config
from clarifyjax.decoding.seq2seq import GeneratedText
from clarifyjax.text.generator import Sampling
from helpers.env import REPO_ROOT, require
from helpers.tiny_models import tiny_spm_folder
from helpers import markdown_table

DOC = REPO_ROOT / "docs" / "fidelity.md"
PRESETS = {"original": REPO_ROOT / "clarifyjax" / "presets" / "ppo_t5_large_original.yaml",
           "ours": REPO_ROOT / "clarifyjax" / "presets" / "ppo_t5_large.yaml"}
COLUMNS = ("setting", "paper", "original code (file:line)", "`_original` preset", "our default",
           "why")
# Keys that name the run rather than configure it.
NOT_SETTINGS = {"run.name", "run.output_dir"}


@pytest.fixture(scope="module")
def presets():
    return {name: load_config(path) for name, path in PRESETS.items()}


def table_rows(path: Path | None = None) -> list[dict[str, str]]:
    """The rows of the first table in `path` (default: docs/fidelity.md; the SaGE table after it is
    tests/sage_jax/test_fidelity.py's), as {column: cell}."""
    return markdown_table.table_rows((path or DOC).read_text(encoding="utf-8").splitlines(), 0, COLUMNS)


def _literals(cell: str) -> list:
    return [yaml.safe_load(v) for v in re.findall(r"`([^`]*)`", cell)]


def _resolved(cfg, key: str):
    value = cfg
    for part in key.split("."):
        assert hasattr(value, part), f"docs/fidelity.md names {key!r}, which is not a config key"
        value = getattr(value, part)
    return list(value) if isinstance(value, tuple) else value


def _leaves(cfg, at=""):
    import dataclasses

    for f in dataclasses.fields(cfg):
        key, value = f"{at}.{f.name}" if at else f.name, getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, key)
        else:
            yield key, value


# --------------------------------------------------------------------------- fixed behaviours


def _whitening_divisor():
    x = np.array([[1.0, 2.0, 4.0, 9.0]], np.float32)
    out = np.asarray(ppo.masked_whiten(x, np.ones_like(x)))
    return "std" if abs(out.std() - 1) < 1e-3 else "other"


def _reward_padding():
    """"zero" when one PPO update computes the same advantages, returns and losses for a batch
    with 3 more padding columns: reward whitening wrote nothing into the padding and GAE stopped
    at each question's end (the original's advantages changed with the padding)."""
    import jax
    import jax.numpy as jnp
    import optax

    rng = np.random.default_rng(0)
    lengths = np.array([5, 3, 2, 4])
    mask = (np.arange(5)[None] < lengths[:, None]).astype(np.float32)
    logprobs, ref, values = (rng.normal(-1, 0.5, (4, 5)).astype(np.float32) * mask
                             for _ in range(3))
    tx = optax.sgd(0.0)
    update = jax.jit(ppo.make_ppo_update(lambda p, mb: mb.logprobs + p,
                                         lambda p, mb: mb.values + p, tx, tx))
    state = ppo.init_ppo_state(jnp.zeros(()), jnp.zeros(()), tx, tx)
    seen = []
    for extra in (0, 3):
        def pad(x, extra=extra):
            return jnp.asarray(np.pad(x, ((0, 0), (0, extra))))
        rollout = ppo.Rollout(pad(np.ones((4, 5), np.int32)), pad(mask), pad(mask.astype(np.int32)),
                              pad(mask), pad(logprobs), pad(ref), pad(values),
                              jnp.asarray([1.0, -0.5, 0.25, 2.0]))
        metrics = update(state, rollout, jax.random.key(0))[1]
        seen.append([float(metrics[k]) for k in ("advantages_raw_mean", "advantages_raw_std",
                                                 "returns_mean", "policy_loss", "value_loss")])
    return "zero" if np.allclose(seen[0], seen[1], rtol=1e-6, atol=1e-7) else "leaked"


def _whitening_scope():
    source = inspect.getsource(ppo._ppo_step)  # make_ppo_update's step
    once = source.index("_advantages(rollout, mask") < source.index("_epochs(")
    return "batch" if once and source.count("_advantages(") == 1 else "minibatch"


def _prefix_in_judge_and_fusion():
    judged = formats.judge_input("question: lying to a friend")
    fused = formats.fusion_input("question: lying to a friend", "Why?", "to save a life")
    leaked = "question:" in judged or "question:" in fused
    return "leaked" if leaked else "stripped"


def _class_token_not_one_piece(root):
    from clarifyjax.reward.judge import class_token_ids
    from clarifyjax.models.safetensors_io import CheckpointError
    from clarifyjax.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tiny_spm_folder(root, minus_one=False))
    try:
        class_token_ids(tok, "<class>", ("-1", "0", "1"), vocab_size=tok.vocab_size)
    except CheckpointError:
        return "refused"
    return "accepted"


def _failed_step():
    """"stops" when the PPO loop catches no error (a failing step ends the run), "skipped" when
    it catches one and goes on, as the original's `except RuntimeError: continue`."""
    from clarifyjax.training import loops

    source = inspect.getsource(loops.train_ppo)
    return "skipped" if re.search(r"\bexcept\b", source) else "stops"


def _reward_output_spaces():
    """"kept" when the answer, the fused situation and the judgment text reach the next model as
    the models wrote them (" ." and " 's" stay), "cleaned" when transformers' clean-up ran on them
    (the original's 4.9.1 decodes: reward.py:122, 174, model/delphi.py:108)."""
    from clarifyjax.reward.pipeline import RewardPipeline

    answerer = _StubSeq2Seq(lambda t: "they were in danger .")
    fusion = _StubSeq2Seq(lambda t: "a fused situation .")
    judge = _StubJudge(judgment="it 's wrong .")
    pipeline = RewardPipeline(answerer, fusion, judge, _StubNLI(), load_config(PRESETS["original"]).rewards.pipeline)
    pipeline(["question: lying to a friend"], ["Why ?"], rng=0)
    seen = answerer.calls[0][0] + fusion.calls[0][0] + judge.inputs[-1]
    kept = [any(text in t for t in seen) for text in ("it 's wrong .", "they were in danger .",
                                                      "a fused situation .")]
    assert any(("it's wrong." in t or "in danger." in t or "situation." in t) for t in seen) != all(kept)
    return "kept" if all(kept) else "cleaned"


FIXED = {"whitening divisor": lambda root: _whitening_divisor(),
         "reward whitening at padding": lambda root: _reward_padding(),
         "whitening and GAE scope": lambda root: _whitening_scope(),
         "min question tokens": lambda root: rollout.MIN_QUESTION_TOKENS,
         "policy prefix in judge and fusion inputs": lambda root: _prefix_in_judge_and_fusion(),
         "class token not one piece": _class_token_not_one_piece,
         "spaces of the reward models' texts": lambda root: _reward_output_spaces(),
         "a step that raises": lambda root: _failed_step()}


def test_every_row_of_the_table_matches_both_presets(presets, tmp_path_factory):
    rows = table_rows()
    assert len(rows) >= 40
    covered, fixed_seen = set(), set()
    for row in rows:
        setting = row["setting"]
        for name, column in (("original", "`_original` preset"), ("ours", "our default")):
            values = _literals(row[column])
            if setting.startswith("fixed:"):
                behaviour = setting.split(":", 1)[1].strip()
                assert behaviour in FIXED, f"no check for the fixed row {behaviour!r}"
                fixed_seen.add(behaviour)
                assert values == [FIXED[behaviour](tmp_path_factory)], (setting, column)
                continue
            keys = re.findall(r"`([^`]+)`", setting)
            assert keys, f"row {setting!r} names no config key"
            if len(values) == 1:
                values = values * len(keys)
            assert len(values) == len(keys), (setting, column, values)
            for key, value in zip(keys, values):
                got = _resolved(presets[name], key)
                assert got == value, f"{key}: docs/fidelity.md says {value!r} for {name}, " \
                                     f"{PRESETS[name].name} resolves to {got!r}"
                covered.add(key)
    assert fixed_seen == set(FIXED)
    # every setting in which the two presets differ has its row
    ours = dict(_leaves(presets["ours"]))
    differ = {k for k, v in _leaves(presets["original"]) if v != ours[k]} - NOT_SETTINGS
    assert differ <= covered, f"settings that differ without a row: {sorted(differ - covered)}"


def test_readme_links_the_fidelity_table():
    assert "docs/fidelity.md" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the NLI rule

LABELS = ("contradiction", "entailment", "neutral")
# argmax: neutral -> keep; P(ent) + P(contra) = 0.55 >= 0.5 -> drop
DISAGREEING_ROW = np.array([[0.30, 0.25, 0.45]], np.float32)


def test_nli_rules_disagree_and_each_preset_picks_its_own(presets):
    drop_columns = np.array([name in ("contradiction", "entailment") for name in LABELS])
    assert nli.keep_answers(DISAGREEING_ROW, drop_columns, None).tolist() == [True]
    assert nli.keep_answers(DISAGREEING_ROW, drop_columns, 0.5).tolist() == [False]
    said = {row["setting"]: row for row in table_rows()}["`rewards.nli_threshold`"]
    for name, column in (("original", "`_original` preset"), ("ours", "our default")):
        threshold = presets[name].rewards.nli_threshold
        assert _literals(said[column]) == [threshold]
        expected = [True] if threshold is None else [bool(0.55 < threshold)]
        assert nli.keep_answers(DISAGREEING_ROW, drop_columns, threshold).tolist() == expected


def _score_args(*extra):
    from clarifyjax import cli

    return cli.parse_args(["score-questions", "--situations", "s", "--questions", "q",
                           "--out", "o", *map(str, extra)])


def test_argmax_rule_from_yaml_and_the_cli(tmp_path):
    from clarifyjax.config.score import reward_config

    original = PRESETS["original"]
    assert reward_config(_score_args("--config", original)).nli_threshold is None
    with_threshold = tmp_path / "rewards.yaml"
    with_threshold.write_text("answerer: a\nfusion: f\njudge: {model: j}\nnli: n\n"
                              "nli_threshold: 0.5\n")
    assert reward_config(_score_args("--config", with_threshold)).nli_threshold == 0.5
    for back in (["--nli-threshold", "argmax"], ["nli_threshold=null"]):
        assert reward_config(_score_args("--config", with_threshold, *back)).nli_threshold is None
    assert reward_config(_score_args("--config", original, "--nli-threshold",
                                     "0.7")).nli_threshold == 0.7
    null_yaml = tmp_path / "null.yaml"
    null_yaml.write_text(with_threshold.read_text().replace("0.5", "null"))
    assert reward_config(_score_args("--config", null_yaml)).nli_threshold is None


# --------------------------------------------------------------------------- the pipeline


class _StubSeq2Seq:
    """Records each call's texts and `Sampling`; answers with `reply(text)`."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def generate(self, texts, sampling=Sampling(), *, rng=None, power_of_two_rows=False):
        self.calls.append((list(texts), sampling))
        out = [self.reply(t) for t in texts]
        return GeneratedText(out, np.zeros((len(out), sampling.max_new_tokens), np.int32), 0)


class _StubJudge:
    truncated_inputs = 0

    def __init__(self, judgment="it's wrong"):
        self.judgment_samplings, self.inputs, self.judgment = [], [], judgment

    def judgment_text(self, texts, sampling=None):
        self.judgment_samplings.append(sampling)
        return [self.judgment] * len(texts)

    def class_probabilities(self, texts, *, allow_empty=False):
        inputs = [formats.judge_input(t, allow_empty=allow_empty) for t in texts]
        self.inputs.append(inputs)
        weights = np.array([[1.0 + len(t) % 3, 1.0 + len(t) % 5, 1.0 + len(t) % 7] for t in inputs])
        return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


class _StubNLI:
    def __init__(self):
        self.premises = []

    def __call__(self, premises, hypotheses):
        self.premises += list(premises)
        return nli.NLIResult(keep=np.ones(len(premises), bool),
                             probabilities=np.zeros((len(premises), 3), np.float32), labels=LABELS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_reward_pipeline_runs_each_preset_as_its_rows_say(presets, name):
    """Answer sampling, judgment length, NLI premise, fusion situation and an empty fusion, on
    two questions about a situation without a final period (the second fuses to nothing)."""
    from clarifyjax.reward.pipeline import RewardPipeline

    cfg = presets[name].rewards
    answerer = _StubSeq2Seq(lambda t: "they were in danger")
    fusion = _StubSeq2Seq(lambda t: "" if "QUESTION: Where?" in t else "a fused situation.")
    judge, nli_stub = _StubJudge(), _StubNLI()
    pipeline = RewardPipeline(answerer, fusion, judge, nli_stub, cfg.pipeline)
    out = pipeline(["question: lying to a friend"] * 2, ["Why?", "Where?"], rng=0)

    assert answerer.calls[0][1] == Sampling(max_new_tokens=cfg.answer_max_length,
                                            temperature=cfg.answer_temperature,
                                            top_k=cfg.answer_top_k, top_p=cfg.answer_top_p)
    assert judge.judgment_samplings == [Sampling(max_new_tokens=cfg.judgment_max_length)]
    period = "." if cfg.nli_premise_period else ""
    assert set(nli_stub.premises) == {"lying to a friend" + period}
    fusion_period = "." if cfg.fusion_situation_period else ""
    assert all(t.startswith(f"merge: SITUATION: lying to a friend{fusion_period} QUESTION: ")
               for t in fusion.calls[0][0])
    judged = judge.inputs[-1]
    if cfg.empty_fusion == "judge":  # the original judges "" and the pair stays valid
        assert "[moral_single]: " in judged and out.valid.tolist() == [True, True]
    else:
        assert "[moral_single]: " not in judged and out.valid.tolist() == [True, False]
        assert out.raw_reward[1] == cfg.dropped_reward
    np.testing.assert_allclose(out.raw_reward[0], out.jsd[0])


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_answer_sampling_filter_equals_transformers_warpers(presets, name):
    """Our filter at each preset's answer settings keeps the tokens, with the logits, that
    transformers' temperature -> top-k -> top-p warpers keep (4.9.1's order)."""
    torch = require("torch")
    logits_process = require("transformers.generation.logits_process")
    from clarifyjax.decoding import filter_logits

    cfg = presets[name].rewards
    warpers = [logits_process.TemperatureLogitsWarper(cfg.answer_temperature)]
    if cfg.answer_top_k:
        warpers.append(logits_process.TopKLogitsWarper(cfg.answer_top_k))
    if cfg.answer_top_p < 1:
        warpers.append(logits_process.TopPLogitsWarper(cfg.answer_top_p))
    logits = np.random.default_rng(0).normal(0, 3, (6, 32128)).astype(np.float32)
    ref = torch.from_numpy(logits.copy())
    for warper in warpers:
        ref = warper(None, ref)
    ours = np.asarray(filter_logits(logits, temperature=cfg.answer_temperature,
                                    top_k=cfg.answer_top_k, top_p=cfg.answer_top_p))
    ref = ref.numpy()
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(ref))
    kept = np.isfinite(ref)
    assert 0 < kept.sum(-1).min() and kept.sum(-1).max() <= (cfg.answer_top_k or 32128)
    np.testing.assert_allclose(ours[kept], ref[kept], rtol=1e-6)


# --------------------------------------------------------------------------- Adam


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_adam_steps_equal_the_originals_torch_adam(presets, name):
    """Three steps with gradients of 1e-6 (where eps dominates the denominator): each preset's
    optimizer equals `torch.optim.Adam(params, lr=1e-5, eps=1e-5)` (main.py:380); optax's default
    eps 1e-8 would not."""
    torch = require("torch")
    import jax.numpy as jnp
    import optax

    from clarifyjax.training import programs

    cfg = presets[name].optimizer
    grads = [np.full(4, 1e-6, np.float32) * (k + 1) for k in range(3)]
    param = torch.nn.Parameter(torch.zeros(4))  # at 0 float32 resolves steps of 1e-6
    adam = torch.optim.Adam([param], lr=1e-5, eps=1e-5)
    tx = programs.make_optimizer(cfg, total_steps=10)
    ours = jnp.zeros(4)
    state = tx.init(ours)
    for g in grads:
        param.grad = torch.from_numpy(g.copy())
        adam.step()
        updates, state = tx.update(jnp.asarray(g), state, ours)
        ours = optax.apply_updates(ours, updates)
    np.testing.assert_allclose(np.asarray(ours), param.detach().numpy(), rtol=1e-5)
    default = programs.make_optimizer(type(cfg)(name="adam", lr=1e-5, max_grad_norm=0.0), 10)
    moved, state = jnp.zeros(4), default.init(jnp.zeros(4))
    for g in grads:
        updates, state = default.update(jnp.asarray(g), state, moved)
        moved = optax.apply_updates(moved, updates)
    assert abs(float(moved[0])) > 5 * abs(float(ours[0]))  # eps 1e-8: far larger steps


# --------------------------------------------------------------------------- class tokens


@pytest.mark.reference
def test_minus_one_not_one_piece_is_refused_where_the_original_read_unk(tmp_path_factory):
    """A SentencePiece vocabulary without the piece "-1": HF's `convert_tokens_to_ids("-1")`
    (model/delphi.py:71) returns the <unk> id, so the original would read P(<unk>) as P(bad);
    `delphi.class_token_ids` refuses, naming the token, its pieces and the prefix."""
    transformers = require("transformers")
    from clarifyjax.reward.judge import class_token_ids
    from clarifyjax.models.safetensors_io import CheckpointError
    from clarifyjax.text.tokenizer import Tokenizer

    folder = tiny_spm_folder(tmp_path_factory, minus_one=False)
    hf = transformers.T5TokenizerFast.from_pretrained(str(folder), extra_ids=0)
    assert hf.convert_tokens_to_ids("-1") == hf.unk_token_id
    assert len(hf("-1", add_special_tokens=False).input_ids) > 1  # "-1" is several pieces
    tok = Tokenizer.from_pretrained(folder)
    with pytest.raises(CheckpointError, match=r"class token '-1' is not one vocabulary id of the "
                                              r"judge's tokenizer after the prefix '<class>'"):
        class_token_ids(tok, "<class>", ("-1", "0", "1"), vocab_size=tok.vocab_size,
                        source=str(folder))
    # the same vocabulary with "-1" as a piece is accepted
    with_piece = Tokenizer.from_pretrained(tiny_spm_folder(tmp_path_factory))
    _, ids = class_token_ids(with_piece, "<class>", ("-1", "0", "1"),
                             vocab_size=with_piece.vocab_size)
    assert len(set(ids)) == 3 and with_piece.unk_id not in ids
