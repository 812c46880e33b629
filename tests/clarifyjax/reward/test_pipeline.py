"""`RewardPipeline` end to end on tiny random models and 64 situations of δ-CLARIFY dev.tsv.

Models (clarifyjax/models/tiny.py): answerer, fusion and judge are tiny random T5s sharing a
Delphi-like SentencePiece vocabulary; the NLI filter a tiny random RoBERTa with WaNLI's labels.
What is checked against an independent computation:
* each stage's output equals the same model called alone on inputs built here with `text.*`
  (answers, NLI decisions, judge probabilities within 1e-5; the row padding must not matter);
* the JSD equals scipy's `jensenshannon(p, q, base=2) ** 2` within 1e-6, the Table-4 numbers
  equal numpy recomputations;
* the same seed gives the same output, and a repeated batch shape traces no stage again;
* the dropped-answer policies, with a deterministic stub NLI filter, do what they promise;
* sharded over a process's own devices (`sharding.process_mesh`, as `train.build_reward_fn` loads
  each process's reward models), in a child interpreter with 8 fake CPU devices: every parameter
  lies on the mesh with the sharding its logical axes ask for, each device holding only its slice
  (FSDP rules on data=2 x fsdp=2 x model=2: a device holds 25% of a T5's bytes and 30% of an
  encoder's, whose embeddings' sizes the model axis may not divide), and the sharded pipeline
  gives this module's unsharded outputs on the same 64 rows (the same texts; probabilities and
  rewards within 1e-5), as does a sharded encoder judge. The unsharded side is computed here,
  once, for all the tests: only the sharded side needs the child.
`process_sizes` itself is checked in test_sharding_sizes.py.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import textwrap

import numpy as np
import pytest

from helpers.children import run_with_fake_devices
from helpers.tiny_models import tiny_classifier_folder, tiny_nli_folder, tiny_t5_folder
from helpers.env import require, shared_data
from clarifyjax.text import formats
from clarifyjax.reward.judge import ClassifierJudge, Judge
from clarifyjax.decoding.seq2seq import Seq2SeqModel
from clarifyjax.text.generator import Sampling
from clarifyjax.reward.nli import NLIFilter, NLIResult
from clarifyjax.reward.jsd import RewardNormalizer
from clarifyjax.reward.pipeline import PipelineConfig, RewardPipeline, stage_sampling

B = 64
CONFIG = PipelineConfig(answer_max_length=10, fusion_max_length=14, judgment_max_length=6)
STAGES = ("judgment", "answers", "nli", "fusion", "judge")


def dev_rows(n: int) -> tuple[list[str], list[str]]:
    with open(shared_data("delta-clarify/dev.tsv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:n]
    return [r["situation"] for r in rows], [r["question"] for r in rows]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    # initializer_factor 3: generators whose outputs depend on their inputs (see clarifyjax/models/tiny.py)
    return {"answerer": tiny_t5_folder(tmp_path_factory, seed=21, initializer_factor=3.0),
            "fusion": tiny_t5_folder(tmp_path_factory, family="v1.1", seed=12,
                                     initializer_factor=3.0),
            "judge": tiny_t5_folder(tmp_path_factory, seed=13),
            "nli": tiny_nli_folder(tmp_path_factory, seed=14),
            "classifier": tiny_classifier_folder(tmp_path_factory, seed=15)}


@pytest.fixture(scope="module")
def models(folders):
    answerer = Seq2SeqModel.from_pretrained(folders["answerer"])
    fusion = Seq2SeqModel.from_pretrained(folders["fusion"])
    judge = Judge.from_pretrained(folders["judge"], judgment=Sampling(max_new_tokens=6))
    nli = NLIFilter.from_pretrained(folders["nli"], batch_size=128)
    return answerer, fusion, judge, nli


@pytest.fixture(scope="module")
def classifier_judge(folders):
    return ClassifierJudge.from_pretrained(folders["classifier"])


@pytest.fixture(scope="module")
def run(models):
    """Two calls with the same seed on the same 64 rows: (pipeline, first, second, traces after
    the first call)."""
    pipeline = RewardPipeline(*models, config=CONFIG)
    situations, questions = dev_rows(B)
    first = pipeline(situations, questions, rng=0)
    traces_after_first = dict(pipeline.traces)
    second = pipeline(situations, questions, rng=0)
    return pipeline, first, second, traces_after_first


@pytest.mark.reference
def test_shapes_and_counts(run):
    _, out, _, _ = run
    assert out.reward.shape == out.jsd.shape == out.valid.shape == (B,)
    for p in (out.p_base, out.p_weak, out.p_strong):
        assert p.shape == (B, 3) and np.allclose(p.sum(-1), 1, atol=1e-5)
    assert out.dropped.shape == out.answered.shape == (B, 2)
    assert all(len(x) == B for x in (out.weak_answers, out.strong_answers, out.weak_situations,
                                     out.strong_situations, out.judgments))
    c = out.counts
    assert c["questions"] == B and c["answers"] == 2 * B and c["empty_questions"] == 0
    assert c["dropped"] == int(out.dropped.sum()) == c["nli_dropped"] + c["empty_answers"]
    # with these seeds the random NLI model drops some answers (~1 in 6), not all
    assert 0 < c["dropped"] < 2 * B
    assert c["invalid_pairs"] == B - int(out.valid.sum())
    # zero_reward: a pair with a dropped answer is not valid and gets 0
    np.testing.assert_array_equal(out.valid, out.answered.all(1))
    assert not out.valid[out.dropped.any(1)].any()
    np.testing.assert_array_equal(out.raw_reward, np.where(out.valid, out.jsd, 0.0))
    np.testing.assert_array_equal(out.reward, out.raw_reward)  # no normalizer


@pytest.mark.reference
def test_stages_equal_the_models_called_alone(run, models):
    """Each stage's output equals the model called here on inputs built with `text.*` (same
    batch composition, so same shapes: no new compile, and equal to float32 rounding)."""
    answerer, fusion, judge, nli = models
    _, out, _, _ = run
    situations, questions = dev_rows(B)
    judgments = judge.judgment_text(situations)
    assert out.judgments == judgments
    inputs = [formats.answer_input(s, q, kind, j) for kind in ("weakener", "strengthener")
              for s, q, j in zip(situations, questions, judgments)]
    answers = answerer.generate(inputs, stage_sampling(CONFIG, "answers")).texts
    assert out.weak_answers + out.strong_answers == answers
    premises = situations + situations
    nonempty = [i for i, a in enumerate(answers) if a]
    keep = np.zeros(2 * B, bool)
    pairs = [formats.nli_pair(premises[i], answers[i], period=CONFIG.nli_premise_period)
             for i in nonempty]
    keep[nonempty] = nli([p for p, _ in pairs], [h for _, h in pairs]).keep
    np.testing.assert_array_equal(out.dropped, ~keep.reshape(2, B).T)
    blanked = [a if k else "" for a, k in zip(answers, keep)]
    fused = fusion.generate([formats.fusion_input(s, q, a) for s, q, a in
                             zip(premises, questions + questions, blanked)],
                            stage_sampling(CONFIG, "fusion")).texts
    assert out.weak_situations + out.strong_situations == fused
    assert all(fused)  # so the judge saw exactly these texts
    probs = judge.class_probabilities(situations + fused)
    np.testing.assert_allclose(np.concatenate([out.p_base, out.p_weak, out.p_strong]), probs,
                               atol=1e-6)


@pytest.mark.reference
def test_jsd_and_table4_against_numpy(run):
    scipy_distance = require("scipy.spatial.distance")
    _, out, _, _ = run
    ref = np.array([scipy_distance.jensenshannon(p, q, base=2) ** 2
                    for p, q in zip(out.p_weak, out.p_strong)])
    np.testing.assert_allclose(out.jsd, ref, atol=1e-6)
    summary = out.table4()
    assert summary["pairs"] == out.valid.sum()
    np.testing.assert_allclose(summary["avg_jsd"], ref[out.valid].mean(), atol=1e-6)
    counted = out.answered & out.valid[:, None]
    base = out.p_base.argmax(-1)
    flips = np.stack([out.p_weak.argmax(-1) != base, out.p_strong.argmax(-1) != base], 1)
    np.testing.assert_allclose(summary["judgment_flips"], flips[counted].mean(), atol=1e-6)


@pytest.mark.reference
def test_same_seed_same_output_and_no_retrace(run):
    pipeline, first, second, traces_after_first = run
    for field in dataclasses.fields(first):
        a, b = getattr(first, field.name), getattr(second, field.name)
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=field.name)
        else:
            assert a == b, field.name
    assert dict(pipeline.traces) == traces_after_first  # the second call compiled nothing
    for stage in STAGES:  # each stage is one call, traced at most once (0 if already cached)
        assert traces_after_first.get(stage, 0) <= 1, (stage, traces_after_first)
    assert set(pipeline.timings) == set(STAGES)


# ------------------------------------------------------------------------------- policies


class StubNLI:
    """Keeps an answer iff its length in characters is odd: deterministic, no model."""

    def __call__(self, premises, hypotheses):
        keep = np.array([len(h) % 2 == 1 for h in hypotheses])
        return NLIResult(keep=keep, probabilities=np.zeros((len(keep), 3), np.float32),
                         labels=("contradiction", "entailment", "neutral"))


@pytest.fixture(scope="module")
def policy_runs(models):
    answerer, fusion, judge, _ = models
    situations, questions = dev_rows(B)
    out = {}
    for policy in ("zero_reward", "blank", "resample"):
        config = dataclasses.replace(CONFIG, dropped_answer=policy, resample_k=2)
        pipeline = RewardPipeline(answerer, fusion, judge, StubNLI(), config,
                                  normalizer=RewardNormalizer(gain=2.0, bias=-0.5))
        out[policy] = pipeline(situations, questions, rng=7)
    return out


@pytest.mark.reference
def test_zero_reward_and_blank_differ_only_in_the_reward_of_dropped_pairs(policy_runs):
    zero, blank = policy_runs["zero_reward"], policy_runs["blank"]
    np.testing.assert_array_equal(zero.dropped, blank.dropped)
    assert zero.dropped.any() and not zero.dropped.all()
    np.testing.assert_allclose(zero.jsd, blank.jsd, atol=1e-7)
    assert zero.weak_situations == blank.weak_situations
    hit = zero.dropped.any(1)
    np.testing.assert_array_equal(zero.raw_reward, np.where(hit, 0.0, zero.jsd))
    np.testing.assert_array_equal(blank.raw_reward, np.where(blank.valid, blank.jsd, 0.0))
    assert (blank.valid & hit).any()  # blank: a pair with a dropped answer keeps its JSD
    fused_both = [bool(w) and bool(s)
                  for w, s in zip(blank.weak_situations, blank.strong_situations)]
    np.testing.assert_array_equal(blank.valid, fused_both)
    np.testing.assert_allclose(zero.reward, 2.0 * zero.raw_reward - 0.5, atol=1e-6)
    # the answers dropped by the stub have even length; blank fusion means an empty ANSWER field
    assert all(len(a) % 2 == 0 for a, d in zip(zero.weak_answers, zero.dropped[:, 0]) if d and a)


@pytest.mark.reference
def test_resample_redraws_only_dropped_answers(policy_runs):
    zero, resample = policy_runs["zero_reward"], policy_runs["resample"]
    c = resample.counts
    first_dropped = c["nli_dropped"] + c["empty_answers"]
    assert first_dropped == int(zero.dropped.sum())
    assert c["resampled"] >= first_dropped and c["recovered"] > 0
    assert c["dropped"] == first_dropped - c["recovered"] == int(resample.dropped.sum())
    kept_first = ~zero.dropped
    for kind, col in (("weak_answers", 0), ("strong_answers", 1)):
        a, b = getattr(zero, kind), getattr(resample, kind)
        assert all(a[i] == b[i] for i in np.flatnonzero(kept_first[:, col]))
    # every answer kept at the end passes the filter
    assert all(len(a) % 2 == 1 for a, d in zip(resample.weak_answers, resample.dropped[:, 0])
               if not d)
    assert resample.valid.sum() > zero.valid.sum()


@pytest.mark.reference
def test_empty_and_long_questions_are_counted(models):
    """A 500-word question cut at 16 words (the others have at most 14), of a word that is one
    token: its inputs stay in the length buckets compiled already (cut at the default 64 words,
    they would compile the answer and fusion stages again)."""
    answerer, fusion, judge, _ = models
    situations, questions = dev_rows(B)
    questions[3] = "   "
    questions[5] = " ".join(["the"] * 500)
    config = dataclasses.replace(CONFIG, max_question_words=16)
    assert max(len(q.split()) for i, q in enumerate(questions) if i != 5) < 16
    pipeline = RewardPipeline(answerer, fusion, judge, None, config)
    out = pipeline(situations, questions, rng=0)
    assert out.counts["empty_questions"] == 1 and out.counts["truncated_questions"] == 1
    assert out.counts["answers"] == 2 * (B - 1)
    assert not out.valid[3] and out.raw_reward[3] == 0.0 and out.weak_answers[3] == ""
    np.testing.assert_array_equal(out.p_weak[3], out.p_base[3])
    assert len(out.questions[5].split()) == config.max_question_words
    assert out.counts["nli_dropped"] == 0  # no filter: only empty answers can be dropped


@pytest.mark.reference
def test_bad_input_raises(models):
    pipeline = RewardPipeline(*models, config=CONFIG)
    with pytest.raises(formats.TextFormatError, match="row 1: field 'situation' is empty"):
        pipeline(["fine", "question: "], ["why?", "why?"], rng=0)
    with pytest.raises(ValueError, match="2 situations but 1 questions"):
        pipeline(["a", "b"], ["why?"], rng=0)
    with pytest.raises(ValueError, match="dropped_answer must be one of"):
        RewardPipeline(*models, config=PipelineConfig(dropped_answer="ignore"))
    with pytest.raises(ValueError, match="answer_max_length = 1: must be >= 2"):
        RewardPipeline(*models, config=PipelineConfig(answer_max_length=1))
    sampling = RewardPipeline(*models, config=dataclasses.replace(CONFIG, answer_temperature=0.7))
    with pytest.raises(ValueError, match="samples; pass rng"):
        sampling(["a"], ["why?"])


@pytest.mark.reference
def test_classifier_judge_behind_the_same_interface(models, classifier_judge):
    answerer, fusion, _, nli = models
    judge = classifier_judge
    situations, questions = dev_rows(B)  # the same rows: most stage shapes are compiled already
    out = RewardPipeline(answerer, fusion, judge, nli, CONFIG)(situations, questions, rng=0)
    assert set(out.judgments) <= {"it's bad", "it's okay", "it's good"}
    np.testing.assert_allclose(judge.class_probabilities(situations), out.p_base, atol=1e-6)
    assert np.isfinite(out.reward).all() and out.valid.any()


def test_reward_config_is_the_pipeline_config():
    """A `rewards:` section is a PipelineConfig plus the models; resampling a greedy answer draws
    at temperature 1 (the one place that says so: `PipelineConfig.resampling_temperature`)."""
    from clarifyjax.config import RewardConfig

    cfg = RewardConfig(dropped_answer="resample", answer_temperature=0.0, resample_k=3).pipeline
    assert type(cfg) is PipelineConfig
    assert cfg.dropped_answer == "resample" and cfg.resample_k == 3
    assert cfg.resampling_temperature == 1.0 and stage_sampling(cfg, "answers").greedy
    assert dataclasses.replace(cfg, answer_temperature=0.5).resampling_temperature == 0.5
    assert stage_sampling(dataclasses.replace(cfg, resample_temperature=0.3),
                          "resample").temperature == 0.3


# ------------------------------------------------------------------------------- sharded

SHARDED_CHILD = r"""
import json
import numpy as np
from flax import nnx
from clarifyjax.core import sharding
from clarifyjax.files.child_result import write_result
from clarifyjax.reward.judge import ClassifierJudge
from clarifyjax.reward.pipeline import PipelineConfig, RewardPipeline

F, (situations, questions), config = json.loads(FOLDERS), json.loads(ROWS), json.loads(CONFIG)
mesh = sharding.process_mesh({"data": 2, "fsdp": 2, "model": 2})
rules = sharding.FSDP_RULES
sharded = RewardPipeline.from_folders(
    answerer=F["answerer"], fusion=F["fusion"], judge=F["judge"], nli=F["nli"],
    config=PipelineConfig(**config), nli_batch_size=128, mesh=mesh, rules=rules)

def placement(model):
    expected = dict(nnx.to_flat_state(sharding.model_shardings(nnx.state(model), mesh, rules)))
    wrong, split, total, per_device = [], 0, 0, 0
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        x = var.get_value()
        want = expected[path].get_value()
        if x.sharding != want:
            wrong.append(f"{path}: {x.sharding} != {want}")
        shard = x.addressable_shards[0].data
        total += x.nbytes
        per_device += shard.nbytes
        split += shard.shape != x.shape
        if any(want.spec) != (shard.shape != x.shape):
            wrong.append(f"{path}: spec {want.spec} but shard {shard.shape} of {x.shape}")
    return {"wrong": wrong[:5], "split": int(split), "share": per_device / total}

models = {"answerer": sharded.answerer.model, "fusion": sharded.fusion.model,
          "judge": sharded.judge.seq2seq.model,
          "nli": nnx.merge(sharded.nli._graphdef, sharded.nli._state)}
result = {name: placement(m) for name, m in models.items()}
result["mesh_devices"] = sorted(d.id for d in mesh.devices.flat)
result["mesh_shape"] = dict(mesh.shape)

out = sharded(situations, questions, rng=0)
result["output"] = {k: getattr(out, k) for k in TEXTS}
result["output"].update({k: np.asarray(getattr(out, k)).tolist() for k in ARRAYS})

cj = ClassifierJudge.from_pretrained(F["classifier"], mesh=mesh, rules=rules)
result["classifier"] = placement(cj.model)
result["classifier_probabilities"] = cj.class_probabilities(situations[:13]).tolist()
write_result(result)
"""
TEXTS = ("judgments", "weak_answers", "strong_answers", "weak_situations", "strong_situations")
ARRAYS = ("reward", "jsd", "p_base", "p_weak", "p_strong", "dropped")


@pytest.fixture(scope="module")
def sharded_child(folders):
    """The child's sharded pipeline and classifier judge: placements and outputs."""
    values = dict(FOLDERS={k: str(v) for k, v in folders.items()}, ROWS=dev_rows(B),
                  CONFIG=dataclasses.asdict(CONFIG))
    code = "".join(f"{k} = {json.dumps(json.dumps(v))}\n" for k, v in values.items())
    code += f"TEXTS, ARRAYS = {TEXTS!r}, {ARRAYS!r}\n"
    return run_with_fake_devices(code + textwrap.dedent(SHARDED_CHILD), 8, timeout=600)


@pytest.mark.reference
@pytest.mark.child
@pytest.mark.slow  # the child loads and runs the sharded pipeline: ~25 s
@pytest.mark.parametrize("name", ["answerer", "fusion", "judge", "nli", "classifier"])
def test_every_parameter_sharded_on_the_process_mesh(sharded_child, name):
    assert sharded_child["mesh_shape"] == {"data": 2, "fsdp": 2, "model": 2}
    assert sharded_child["mesh_devices"] == list(range(8))
    got = sharded_child[name]
    assert got["wrong"] == []
    assert got["split"] > 0
    # embed over fsdp and mlp/heads/vocab over model: a quarter of the matrices, whole norms
    assert got["share"] <= (0.3 if name in ("answerer", "fusion", "judge") else 0.35), got


@pytest.mark.reference
@pytest.mark.child
@pytest.mark.slow
def test_sharded_pipeline_gives_the_same_rewards(sharded_child, run, classifier_judge):
    """The sharded pipeline's output equals this module's unsharded one (`run`: the same
    folders, config, rows and seed), and the sharded classifier judge the unsharded one."""
    _, plain, _, _ = run
    sharded = sharded_child["output"]
    for field in TEXTS:
        assert sharded[field] == getattr(plain, field), field
    assert plain.dropped.sum() > 0
    np.testing.assert_array_equal(sharded["dropped"], plain.dropped)
    diff = max(float(np.abs(np.asarray(sharded[k]) - getattr(plain, k)).max())
               for k in ARRAYS if k != "dropped")
    assert diff < 1e-5, diff
    texts = dev_rows(B)[0][:13]  # 13 rows: not a multiple of the mesh's 4 row shards
    plain_probabilities = classifier_judge.class_probabilities(texts)
    diff = np.abs(np.asarray(sharded_child["classifier_probabilities"]) - plain_probabilities)
    assert diff.max() < 1e-5, diff.max()
