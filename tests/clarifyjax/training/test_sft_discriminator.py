"""The discriminator trained as an encoder classifier by the supervised trainer (issue 14):
clarifyjax/presets/sft_discriminator_tiny.yaml on a tiny random DeBERTa-v3-like
`DebertaV2ForSequenceClassification` (made here by `models.tiny`), on (situation, question,
label) rows that `discriminator_rows` builds from δ-CLARIFY train.tsv (hard negatives from seeded
random embeddings: the nearest "similar" situations are arbitrary, which is enough for a loop test).

* the training loss falls and the dev metrics (class accuracy, majority-class rate) are logged;
* the exported final/ folder reads back (`hf.load_classifier`) with the trained model's logits, and
  PyTorch `transformers` reads the same folder to the same logits (independent reference);
* on 8 fake CPU devices (data 2 x fsdp 2 x model 2, FSDP rules) the run's losses equal the
  1-device run's (tolerance 1e-4; float32 sums in another order);
* a run stopped and resumed continues as the uninterrupted one;
* a folder that is not a sequence classifier, and a tiny T5 spec, are one-line ConfigErrors
  naming the key;
* BERT and RoBERTa classifiers export too (read back by us and by transformers).
"""
from __future__ import annotations

import functools
import json
import shutil
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from clarifyjax.config import ConfigError, load_config
from helpers.children import run_with_fake_devices
from helpers.discriminator_runs import CONFIG, STEPS, tiny_config

from helpers.env import require, shared_data

DISCRIMINATOR_LABELS = ("irrelevant", "relevant")


def write_rows(out_dir, situations: int = 60, seed: int = 0):
    """train.tsv / dev.tsv of discriminator rows from the first `situations` δ-CLARIFY train
    situations (dev: the last fifth of the situations)."""
    from clarifyjax.data import discriminator
    from clarifyjax.files.tables import read_table

    table = read_table(shared_data("delta-clarify/train.tsv"), ("situation", "question"))
    names, questions = discriminator.gold_questions(table)
    names, questions = names[:situations], questions[:situations]
    embeddings = np.random.default_rng(seed).normal(size=(len(names), 16))
    cut = len(names) * 4 // 5
    paths = {}
    for split, part in (("train", slice(0, cut)), ("dev", slice(cut, None))):
        rows = discriminator.discriminator_rows(names[part], questions[part], embeddings[part])
        paths[split] = out_dir / f"{split}.tsv"
        paths[split].write_bytes(discriminator.rows_tsv(rows))
    return paths


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from helpers.tiny_models import tiny_deberta_classifier_folder

    folder = tiny_deberta_classifier_folder(tmp_path_factory)
    rows = write_rows(tmp_path_factory.mktemp("discriminator_rows"))
    return folder, rows


def logits(model, ids, mask) -> np.ndarray:
    """`model(ids, mask)` in float32 at matmul precision "highest", jitted: classifiers of one
    architecture share the compiled program (an eager call would compile every op)."""
    graphdef, state = nnx.split(model)
    with jax.default_matmul_precision("highest"):
        return np.asarray(_forward(graphdef, state, np.asarray(ids), np.asarray(mask)))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state)(ids, mask)


def losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [r["train/loss"] for r in rows if "train/loss" in r]


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):
    from clarifyjax.training.loops import train_sft

    folder, rows = setup
    run_dir = tmp_path_factory.mktemp("discriminator_run")
    result = train_sft(tiny_config(folder, rows, run_dir), tensorboard=False, progress=False)
    return run_dir, result


@pytest.fixture(scope="module")
def six_steps(setup, tmp_path_factory):
    """A 6-step run on one device, evaluated at step 6 and saved at step 3: the reference of the
    sharded run and the uninterrupted run of the resume test."""
    from clarifyjax.training.loops import train_sft

    folder, rows = setup
    run_dir = tmp_path_factory.mktemp("discriminator_six_steps")
    result = train_sft(tiny_config(folder, rows, run_dir, "run.steps=6", "run.eval_every=6",
                                   "run.save_every=3"), tensorboard=False, progress=False,
                       export=False)
    return run_dir, result


def test_tiny_discriminator_trains_and_logs_accuracy_beside_the_majority_rate(trained):
    """64 train pairs, batch 16, 30 steps at lr 3e-3 (4 epochs of memorising): the mean loss of
    the last 5 steps must be 0.05 below the first 5 steps' (measured: 0.70 -> 0.53)."""
    run_dir, result = trained
    train = losses(run_dir)
    assert len(train) == STEPS
    assert np.mean(train[-5:]) < np.mean(train[:5]) - 0.05, train
    last = result["eval"]
    assert set(last) == {"eval/loss", "eval/accuracy", "eval/majority_rate"}
    assert 0.0 <= last["eval/accuracy"] <= 1.0
    assert 0.5 <= last["eval/majority_rate"] <= 0.6  # the rows are balanced (up to neighbours)
    assert result["first_eval"]["eval/majority_rate"] == last["eval/majority_rate"]


@pytest.mark.reference
def test_export_reads_back_with_the_trained_logits(trained, setup):
    """final/ through `hf.load_classifier` and through transformers gives the trained model's
    logits on padded pairs (tolerance 1e-4; measured 2e-8 between ours and transformers)."""

    from clarifyjax.models.hf import load_classifier, load_encoder_tokenizer

    run_dir, result = trained
    final = run_dir / "final"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {
        p.name for p in final.iterdir()}
    tokenizer = load_encoder_tokenizer(final, 64)
    pairs = [("lying to my boss about being sick", "Why did you lie?"),
             ("helping a friend move", "Is it far?"), ("eating the last cookie", "Whose?")]
    encodings = tokenizer.encode_batch(pairs)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(pairs), width), np.int32)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, :len(e.ids)], mask[i, :len(e.ids)] = e.ids, 1
    trained_logits = logits(result["model"], ids, mask)
    reloaded = logits(load_classifier(final), ids, mask)
    np.testing.assert_allclose(reloaded, trained_logits, atol=1e-4)
    original = logits(load_classifier(setup[0]), ids, mask)
    assert np.abs(original - trained_logits).max() > 1e-3  # training moved the weights

    torch, transformers = require("torch"), require("transformers")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(final)).eval()
    assert model.config.id2label == {0: "irrelevant", 1: "relevant"}
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(reloaded, ref, atol=1e-4)


SHARDED = textwrap.dedent("""
    import json
    from pathlib import Path
    import jax
    from clarifyjax.files.child_result import write_result
    from clarifyjax.config import load_config
    from clarifyjax.training.loops import train_sft
    from helpers.discriminator_runs import tiny_config

    assert jax.device_count() == 8
    folder, train, dev, run_dir = ARGS
    cfg = tiny_config(folder, {"train": train, "dev": dev}, run_dir, "run.steps=6",
                      "run.eval_every=6", "run.save_every=6", "mesh.data=2", "mesh.fsdp=2",
                      "mesh.model=2", "mesh.rules=fsdp")
    result = train_sft(cfg, tensorboard=False, progress=False, export=False)
    rows = [json.loads(l) for l in open(Path(run_dir) / "metrics.jsonl")]
    spec = result["model"].encoder.layers[0].attention.query.kernel[...].sharding.spec
    write_result({"losses": [r["train/loss"] for r in rows if "train/loss" in r],
                  "eval": result["eval"], "query_spec": [str(a) for a in spec]})
""")


@pytest.mark.child
@pytest.mark.slow  # a child with 8 fake devices compiling the step: ~20-40 s on 2 busy cores
def test_sharded_run_equals_one_device(setup, six_steps, tmp_path):
    folder, rows = setup
    one_dir, one = six_steps
    single = losses(one_dir)
    args = [str(folder), str(rows["train"]), str(rows["dev"]), str(tmp_path / "eight")]
    child = run_with_fake_devices(f"ARGS = {args!r}\n" + SHARDED, 8)
    assert child["query_spec"][0] == "fsdp", child  # the parameters really are split
    np.testing.assert_allclose(child["losses"], single, atol=1e-4)
    np.testing.assert_allclose(child["eval"]["eval/loss"], one["eval"]["eval/loss"], atol=1e-4)
    assert child["eval"]["eval/accuracy"] == one["eval"]["eval/accuracy"]


def test_a_folder_that_is_not_a_classifier_names_the_key(setup, tmp_path):
    from clarifyjax.training.loops import train_sft

    folder, rows = setup
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    config = json.loads((bare / "config.json").read_text())
    # (without id2label it would be a two-label classifier, as transformers reads it)
    config["architectures"] = ["DebertaV2Model"]
    (bare / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"^model\.init: .*not a sequence-classification") as e:
        train_sft(tiny_config(bare, rows, tmp_path / "run"), tensorboard=False, progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before any run state
    with pytest.raises(ConfigError, match=r"model\.tiny: task is 'discriminator'"):
        load_config(CONFIG, ["model.init=null", "model.tiny.d_model=32"])
    with pytest.raises(ConfigError, match=r"model\.max_target_length = 8 is not used"):
        load_config(CONFIG, ["model.max_target_length=8"])


@pytest.mark.slow  # a run, a kill and a resume: ~45 s
def test_resume_continues_as_the_uninterrupted_run(setup, six_steps, tmp_path):
    """Stopped after 3 steps (checkpoint) and restarted for 6: steps 4-6 have the losses of an
    uninterrupted 6-step run (the classifier's state, RNG and data position come back)."""
    from clarifyjax.training.loops import train_sft

    folder, rows = setup
    straight, _ = six_steps

    def run(run_dir, steps):
        return train_sft(tiny_config(folder, rows, run_dir, f"run.steps={steps}",
                                     "run.eval_every=0", "run.save_every=3"),
                         tensorboard=False, progress=False, export=False)

    run(tmp_path / "resumed", 3)
    assert run(tmp_path / "resumed", 6)["step"] == 6
    np.testing.assert_allclose(losses(tmp_path / "resumed"), losses(straight), rtol=0,
                               atol=1e-6)


@pytest.mark.reference
@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_bert_and_roberta_classifiers_export_too(model_type, tmp_path_factory, tmp_path):
    """The other families' export (`hf.save_sequence_classifier`): a tiny random BERT / RoBERTa
    classifier read, written and read again gives the same logits, and transformers reads the
    written folder to them (tolerance 1e-4)."""
    from helpers.tiny_models import tiny_classifier_folder

    from clarifyjax.models.hf import load_classifier, save_sequence_classifier

    folder = tiny_classifier_folder(tmp_path_factory, DISCRIMINATOR_LABELS, model_type=model_type)
    model = load_classifier(folder)
    save_sequence_classifier(model, tmp_path / "out", folder)
    ids = np.array([[2, 40, 41, 42, 3, 50, 51, 3], [2, 60, 61, 3, 70, 3, 0, 0]], np.int32)
    if model_type == "roberta":
        ids = np.where(ids == 0, 1, ids)  # RoBERTa's pad id
    mask = (np.arange(8)[None] < np.array([[8], [6]])).astype(np.int32)
    before = logits(model, ids, mask)
    after = logits(load_classifier(tmp_path / "out"), ids, mask)
    np.testing.assert_allclose(after, before, atol=1e-5)
    torch, transformers = require("torch"), require("transformers")
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "out"))
    with torch.no_grad():
        expected = ref.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(after, expected, atol=1e-4)
