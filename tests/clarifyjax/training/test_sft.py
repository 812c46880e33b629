"""Supervised fine-tuning: the pure step (clarifyjax.training.sft) against numpy written here, and the SFT
loop (clarifyjax.training.loops.train_sft, `clarifyjax train`) on δ-CLARIFY: the dev loss must fall, bad
input must fail clearly."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from clarifyjax.training import programs

from clarifyjax.training import sft
from clarifyjax.models.t5 import T5, T5Config
from clarifyjax.models.state import split_model
from helpers.env import REPO_ROOT, shared_data

V = 37


def _tiny_t5(seed=0, dropout=0.0):
    config = T5Config(vocab_size=V, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                      dropout_rate=dropout)
    return T5(config, rngs=nnx.Rngs(seed))


def _batch(rng, b, s, t):
    in_len = rng.integers(2, s + 1, size=b)
    out_len = rng.integers(1, t + 1, size=b)
    in_mask = (np.arange(s)[None] < in_len[:, None]).astype(np.int32)
    out_mask = (np.arange(t)[None] < out_len[:, None]).astype(np.int32)
    return {"input_ids": (rng.integers(2, V, (b, s)) * in_mask).astype(np.int32),
            "input_mask": in_mask,
            "target_ids": (rng.integers(2, V, (b, t)) * out_mask).astype(np.int32),
            "target_mask": out_mask,
            "example_mask": np.ones(b, np.int32)}


# ----------------------------------------------------------------------------- the loss


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_losses_against_numpy(smoothing):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (4, 6, V)).astype(np.float32)
    targets = rng.integers(0, V, (4, 6))
    mask = (np.arange(6)[None] < np.array([6, 3, 1, 0])[:, None]).astype(np.float32)
    logits[mask == 0] = np.nan  # garbage on padding must not leak into the sums
    out = jax.jit(sft.token_losses, static_argnums=3)(logits, targets, mask, smoothing)

    logp = _np_log_softmax(np.nan_to_num(logits, nan=0.0).astype(np.float64))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    # smoothed target q = (1 - eps) onehot + eps / V: cross-entropy -sum_v q_v log p_v
    q = (1 - smoothing) * np.eye(V)[targets] + smoothing / V
    ce = -(q * logp).sum(-1)
    np.testing.assert_allclose(float(out["nll_sum"]), (nll * mask).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(out["loss_sum"]), (ce * mask).sum(), rtol=1e-5)
    assert float(out["tokens"]) == mask.sum() == 10
    correct = (np.nan_to_num(logits, nan=0.0).argmax(-1) == targets) * mask
    assert float(out["correct"]) == correct.sum()
    if smoothing == 0.0:  # optax's reference on the valid tokens only
        ref = optax.softmax_cross_entropy_with_integer_labels(
            jnp.asarray(np.nan_to_num(logits)[mask > 0]), jnp.asarray(targets[mask > 0]))
        np.testing.assert_allclose(float(out["loss_sum"]), float(ref.sum()), rtol=1e-5)


# ----------------------------------------------------------------------------- schedules


def test_learning_rate_schedules_by_hand():
    kw = dict(lr=1e-3, warmup_steps=4, total_steps=14)
    steps = np.arange(16)
    warm = np.minimum(1.0, (steps + 1) / 4)
    progress = np.clip((steps - 4) / 10, 0, 1)
    expected = {"constant": 1e-3 * warm,
                "linear": 1e-3 * warm * (1 - progress),
                "cosine": 1e-3 * warm * 0.5 * (1 + np.cos(np.pi * progress))}
    for name, ref in expected.items():
        got = np.asarray(programs.learning_rate(steps, schedule=name, **kw))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-10)  # float32
    assert float(programs.learning_rate(0, lr=0.1, warmup_steps=0, total_steps=5)) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="schedule 'exp'"):
        programs.learning_rate(0, schedule="exp", **kw)


def test_make_optimizer_variants():
    from clarifyjax.config import OptimizerConfig

    params = {"w": jnp.ones((3, 4)), "b": jnp.ones((4,))}
    grads = {"w": jnp.full((3, 4), 0.5), "b": jnp.full((4,), 0.5)}
    for name in ("adamw", "adam", "adafactor"):
        cfg = OptimizerConfig(name=name, lr=0.1, weight_decay=0.0 if name == "adam" else 0.1,
                              warmup_steps=2, schedule="linear", max_grad_norm=1.0)
        tx = programs.make_optimizer(cfg, total_steps=10)
        updates, _ = tx.update(grads, tx.init(params), params)
        assert all(np.all(np.isfinite(u)) and np.any(u != 0) for u in jax.tree.leaves(updates))
    # adamw: first step of Adam moves by lr_0 = 0.1 * 1/2 (warm-up) against the clipped gradient,
    # plus decoupled decay on the matrix only
    cfg = OptimizerConfig(name="adamw", lr=0.1, weight_decay=0.1, warmup_steps=2,
                          schedule="constant", max_grad_norm=0.0)
    tx = programs.make_optimizer(cfg, total_steps=10)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.05 * (1.0 + 0.1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(updates["b"]), -0.05, rtol=1e-5)
    with pytest.raises(ValueError, match="'adam' has no weight decay"):
        programs.make_optimizer(OptimizerConfig(name="adam", weight_decay=0.1), 10)


# ----------------------------------------------------------------------------- the step


@pytest.mark.slow  # compiles two training steps: ~30 s
def test_grad_accumulation_equals_the_whole_batch():
    """Two micro-batches of 4 give the update of one batch of 8 (token-weighted means), a padding
    row (example_mask 0) counts for nothing, and the loss is the model's teacher-forced NLL."""
    model = _tiny_t5()
    graphdef, params = split_model(model)
    tx = optax.sgd(0.5)
    step = jax.jit(sft.make_train_step(graphdef, tx))
    whole = _batch(np.random.default_rng(1), 8, 7, 5)
    whole["example_mask"][-1] = 0  # a padding row, as eval_batches makes
    whole["target_ids"][-1] = 3  # with garbage targets
    state = sft.init_state(params, tx, seed=0)
    s1, m1 = step(state, {k: v[None] for k, v in whole.items()})
    halves = [{k: v[:4] for k, v in whole.items()}, {k: v[4:] for k, v in whole.items()}]
    s2, m2 = step(state, sft.stack_micro_batches(halves))
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(s1.params), jax.tree.leaves(params)))
    assert moved > 1e-3  # the step did something
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-6)
    assert int(s1.step) == 1

    # the loss: the token mean of -log p(target) over the 7 real rows of the model's own forward
    from clarifyjax.models.t5 import shift_right

    forward = jax.jit(lambda p, x, m, y: nnx.merge(graphdef, p)(x, m, shift_right(y, 0)))
    logits = forward(params, whole["input_ids"], whole["input_mask"], whole["target_ids"])
    logp = _np_log_softmax(np.asarray(logits, np.float64))
    nll = -np.take_along_axis(logp, whole["target_ids"][..., None], -1)[..., 0]
    m = whole["target_mask"] * whole["example_mask"][:, None]
    assert float(m1["tokens"]) == m.sum() < whole["target_mask"].sum()
    np.testing.assert_allclose(float(m1["loss"]), (nll * m).sum() / m.sum(), rtol=1e-5)


def test_stack_micro_batches_pads_to_the_widest():
    rng = np.random.default_rng(2)
    a, b = _batch(rng, 2, 4, 3), _batch(rng, 2, 6, 5)
    out = sft.stack_micro_batches([a, b])
    assert out["input_ids"].shape == (2, 2, 6) and out["target_mask"].shape == (2, 2, 5)
    assert out["example_mask"].shape == (2, 2)
    np.testing.assert_array_equal(out["input_ids"][0, :, :4], a["input_ids"])
    assert not out["input_mask"][0, :, 4:].any() and not out["target_mask"][0, :, 3:].any()


@pytest.mark.slow  # compiles training steps with dropout: ~23 s
def test_dropout_step_uses_and_advances_the_rng():
    model = _tiny_t5(dropout=0.3)
    graphdef, params = split_model(model)
    tx = optax.sgd(0.1)
    step = jax.jit(sft.make_train_step(graphdef, tx, dropout=True, label_smoothing=0.1))
    batch = {k: v[None] for k, v in _batch(np.random.default_rng(3), 4, 5, 4).items()}
    s0 = sft.init_state(params, tx, seed=0)
    s1, m1 = step(s0, batch)
    s2, m2 = step(s1._replace(params=s0.params), batch)  # same params, next dropout mask
    assert not np.array_equal(np.asarray(s0.rng), np.asarray(s1.rng))
    assert float(m1["loss"]) != float(m2["loss"])
    s1b, m1b = step(s0, batch)  # and deterministic for a given key
    assert float(m1b["loss"]) == float(m1["loss"])


def test_generation_metrics():
    refs = ["what did you say to him?", "why did you do it?"]
    perfect = sft.generation_metrics(refs, refs)
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["rouge_l"] == pytest.approx(100.0)
    disjoint = sft.generation_metrics(["alpha beta gamma delta", "one two three four"], refs)
    assert disjoint["bleu"] < 1.0 and disjoint["rouge_l"] == 0.0
    assert (perfect["exact_match"], disjoint["exact_match"]) == (100.0, 0.0)
    half = sft.generation_metrics(["relevant", " irrelevant  "], ["irrelevant", "irrelevant"])
    assert half["exact_match"] == 50.0  # whitespace-normalized
    # ROUGE-L F of one pair by hand: LCS("what did you say" , "what you say to him") = 3
    one = sft.generation_metrics(["what did you say"], ["what you say to him"])
    p, r = 3 / 4, 3 / 5
    assert one["rouge_l"] == pytest.approx(100 * 2 * p * r / (p + r), rel=1e-6)
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        sft.generation_metrics(refs, refs[:1])


# ----------------------------------------------------------------------------- the loop


def _sft_overrides(tmp_path, spm, overrides=()) -> list[str]:
    """The loop's run: a 1+1-layer T5 (d_model 32), one length bucket, a constant learning rate;
    `overrides` (key=value) replace or add keys. The CLI test trains the same model with the same
    optimizer on the same padded shapes, so that its processes load the loop test's compiled
    programs (model init, training step) from the run's compile cache instead of compiling them."""
    items = dict(item.split("=", 1) for item in [
        f"run.output_dir={tmp_path / 'run'}", f"model.tokenizer={spm}",
        "model.tiny.vocab_size=608", "model.tiny.d_model=32", "model.tiny.d_ff=64",
        "model.tiny.num_layers=1", "model.tiny.num_heads=4", "model.max_input_length=32",
        "model.max_target_length=24",
        f"data.train_path={shared_data('delta-clarify/train.tsv')}",
        f"data.dev_path={shared_data('delta-clarify/dev.tsv')}",
        "data.train_rows=2000", "data.dev_rows=128", "data.batch_size=32",
        "data.eval_batch_size=64", "data.length_buckets=[32]", "run.log_every=10",
        "optimizer.schedule=constant", "optimizer.lr=5e-3", "optimizer.warmup_steps=5",
        *overrides])
    return [f"{k}={v}" for k, v in items.items()]


def _sft_config(tmp_path, spm, overrides=()):
    from clarifyjax.config import load_config

    return load_config(REPO_ROOT / "clarifyjax/presets/sft_question_tiny.yaml",
                       _sft_overrides(tmp_path, spm, overrides))


@pytest.mark.slow
def test_sft_on_2000_rows_lowers_the_dev_loss(tmp_path_factory, tmp_path):
    """80 steps of batch 32 over 2,000 rows of train.tsv (tiny T5: 1 + 1 layers, d_model 32,
    SentencePiece 600; constant learning rate 5e-3); dev = the first 128 rows of dev.tsv.

    Required: the dev loss (token NLL) at most half the random start's and below 5.0 nats (the
    uniform distribution's is log(608) = 6.4); token accuracy above 15%. Measured on CPU:
    17.9 -> 4.14 nats, accuracy 0.01 -> 0.24, ROUGE-L 1.7 -> 23.1 (2 + 2 layers: 18.4 -> 4.15,
    0 -> 0.26)."""
    from helpers.tiny_models import tiny_spm_folder
    from clarifyjax.training.loops import train_sft

    spm = tiny_spm_folder(tmp_path_factory, vocab_size=600)
    cfg = _sft_config(tmp_path, spm, ["run.steps=80", "run.eval_every=80", "run.save_every=80"])
    from clarifyjax.core import traces

    before = traces.count("sft_step")
    result = train_sft(cfg, tensorboard=False, progress=False)
    assert traces.count("sft_step") - before == 1  # 80 steps, one length bucket: one compile
    first, last = result["first_eval"], result["eval"]
    print("dev before", first, "after", last)
    assert last["eval/loss"] < 0.5 * first["eval/loss"]
    assert last["eval/loss"] < 5.0 < math.log(608)
    assert last["eval/accuracy"] > 0.15
    assert 0.0 <= last["eval/bleu"] <= 100.0 and 0.0 <= last["eval/rouge_l"] <= 100.0
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    train_losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(train_losses) == 8 and train_losses[-1] < train_losses[0]
    # the export reads back as a Hugging Face folder with its tokenizer
    from clarifyjax.models.hf import load_t5

    config, _ = load_t5(result["final"])
    assert config.d_model == 32 and (tmp_path / "run" / "final" / "spiece.model").exists()


def test_sft_bad_inputs_fail_clearly(tmp_path_factory, tmp_path):
    from helpers.tiny_models import tiny_spm_folder
    from clarifyjax.config import ConfigError
    from clarifyjax.files.tables import DataError
    from clarifyjax.training.loops import train_sft

    spm = tiny_spm_folder(tmp_path_factory, vocab_size=600)
    with pytest.raises(ConfigError, match="unknown key 'optimizer.learning_rate'"):
        _sft_config(tmp_path, spm, ["optimizer.learning_rate=1e-3"])
    bad = tmp_path / "no_question.tsv"
    bad.write_text("id\tsource\tsituation\n0\tx\tlying to a friend\n")
    cfg = _sft_config(tmp_path, spm, [f"data.train_path={bad}"])
    with pytest.raises(DataError, match=r"no_question.tsv: missing column\(s\) \['question'\]"):
        train_sft(cfg, tensorboard=False, progress=False)
    cfg = _sft_config(tmp_path, spm, ["model.tiny.vocab_size=100"])
    with pytest.raises(ConfigError, match="tokenizer .* has 60[0-9] tokens but the model's "
                                          "vocab_size is 100"):
        train_sft(cfg, tensorboard=False, progress=False)


@pytest.mark.e2e
@pytest.mark.child
def test_cli_train_rejects_unknown_keys(capsys):
    """`clarifyjax train CONFIG key=value`: an unknown key is a one-line error with exit status 2,
    before any model is built (with or without --dry-run). The first case runs the real command
    (`python -m clarifyjax`, its exit status); the others call the same entry point in-process
    (`clarifyjax.cli.main`, whose return value is that status)."""
    import subprocess
    import sys

    from clarifyjax.cli import main

    proc = subprocess.run([sys.executable, "-m", "clarifyjax", "train",
                           REPO_ROOT / "clarifyjax/presets/sft_question_tiny.yaml", "run.steps=2", "optimizer.bogus=1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "clarifyjax train: error:" in proc.stderr
    assert "unknown key 'optimizer.bogus'; valid keys under 'optimizer': name, lr" in proc.stderr

    def cli(*args):
        capsys.readouterr()
        status = main(["train", *args])
        return status, capsys.readouterr().err

    status, err = cli(str(REPO_ROOT / "clarifyjax/presets/sft_question_tiny.yaml"), "optimizer.bogus=1", "--dry-run")
    assert status == 2 and "unknown key 'optimizer.bogus'" in err
    status, err = cli("clarifyjax/presets/no_such.yaml")
    assert status == 2 and "config file not found: clarifyjax/presets/no_such.yaml" in err


@pytest.mark.e2e
@pytest.mark.child
@pytest.mark.slow
def test_cli_train_runs_exports_and_resumes(tmp_path_factory, tmp_path):
    """`clarifyjax train clarifyjax/presets/sft_question_tiny.yaml key=value ...`: 2 steps, export, then the
    same command with run.steps=3 continues from the step-2 checkpoint (data position included).
    (The model and shapes of the loop test above: its compiled programs are reused.)"""
    import subprocess
    import sys

    from helpers.tiny_models import tiny_spm_folder

    spm = tiny_spm_folder(tmp_path_factory, vocab_size=600)
    args = [str(REPO_ROOT / "clarifyjax/presets/sft_question_tiny.yaml"), *_sft_overrides(tmp_path, spm, [
        "data.train_rows=64", "data.dev_rows=16", "run.steps=2", "run.eval_every=0",
        "run.log_every=1", "optimizer.warmup_steps=2"])]
    proc = subprocess.run([sys.executable, "-m", "clarifyjax", "train", *args, "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    assert (tmp_path / "run" / "config.yaml").exists()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    extra = json.loads((tmp_path / "run" / "checkpoints" / "2" / "extra" / "metadata").read_text())
    assert extra["data"]["epoch"] == 1 and extra["data"]["index"] == 0  # 64 rows = 2 batches

    # the same command with more steps resumes from the checkpoint of step 2
    more = [a if not a.startswith("run.steps=") else "run.steps=3" for a in args]
    proc = subprocess.run([sys.executable, "-m", "clarifyjax", "train", *more, "--no-progress",
                           "--no-tensorboard"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]  # a run from scratch would log 1, 2 again
    assert (tmp_path / "run" / "checkpoints" / "3").is_dir()
