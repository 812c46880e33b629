"""`clarifyjax.reward.nli.NLIFilter` and `SequenceClassifier` against Hugging Face's PyTorch
`RobertaForSequenceClassification` / `BertForSequenceClassification` on the same random weights.

The tiny models are made here: random configs whose weights are redrawn with std 0.2, saved by
`save_pretrained` (safetensors), plus a WordLevel tokenizer trained with the `tokenizers` library
on dev.tsv situations, with the model family's special tokens and pair template.
Tolerance: logits within 1e-4 absolute (measured ~1e-6).
"""
from __future__ import annotations

import csv
import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers.env import require, shared_data
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.models.hf import load_sequence_classifier
from clarifyjax.models.tiny import random_classifier
from clarifyjax.reward.nli import NLIFilter

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("full_float32_matmuls")]

TOL = 1e-4
WANLI_LABELS = {0: "contradiction", 1: "entailment", 2: "neutral"}  # roberta-large-wanli's order


def dev_rows(n: int) -> list[dict]:
    with open(shared_data("delta-clarify/dev.tsv"), newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))[:n]


def build_tokenizer(model_type: str, corpus: list[str]):
    """WordLevel tokenizer with RoBERTa (<s> A </s></s> B </s>) or BERT ([CLS] A [SEP] B [SEP])
    special tokens; the specials get ids 0..3 in the order listed."""
    tk = require("tokenizers")
    from tokenizers import models, normalizers, pre_tokenizers, processors, trainers

    if model_type == "roberta":
        specials = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0 1 2 3, as RoBERTa
        bos, pad, eos, unk = specials
        pair = f"{bos} $A {eos} {eos} $B {eos}"
        single = f"{bos} $A {eos}"
    else:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        pad, unk, bos, eos = specials
        pair = f"{bos} $A {eos} $B:1 {eos}:1"
        single = f"{bos} $A {eos}"
    tokenizer = tk.Tokenizer(models.WordLevel(unk_token=unk))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials,
                                                                   min_frequency=2))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair,
        special_tokens=[(bos, tokenizer.token_to_id(bos)), (eos, tokenizer.token_to_id(eos))])
    return tokenizer


def make_classifier(tmp_path, model_type: str, labels=WANLI_LABELS, seed: int = 0):
    """A tiny random HF classifier folder with tokenizer.json; returns (folder, torch model, tok)."""
    require("torch")
    require("transformers")
    rows = dev_rows(400)
    tokenizer = build_tokenizer(model_type, [r["situation"] for r in rows] +
                                [r["question"] for r in rows])
    model = random_classifier([labels[i] for i in range(len(labels))], model_type=model_type,
                              seed=seed, vocab_size=tokenizer.get_vocab_size(),
                              intermediate_size=48, max_position_embeddings=160)
    center_logits(model, tokenizer, rows[:40], model_type)
    folder = tmp_path / model_type
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    assert (folder / "model.safetensors").exists()
    return folder, model, tokenizer


def center_logits(model, tokenizer, rows, model_type: str) -> None:
    """Shift the output bias so each class wins on some dev pairs (random heads tend to favour
    one class everywhere, which would leave the keep/drop decision untested)."""
    torch = require("torch")
    logits = np.stack([torch_logits(model, tokenizer, r["situation"], r["question"], model_type)
                       for r in rows])
    out = model.classifier.out_proj if model_type == "roberta" else model.classifier
    with torch.no_grad():
        out.bias -= torch.tensor(np.median(logits, axis=0))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """make_classifier, built once per (model_type, labels) for this module (read-only use)."""
    made: dict = {}

    def get(model_type: str, labels=WANLI_LABELS):
        key = (model_type, tuple(sorted(labels.items())))
        if key not in made:
            made[key] = make_classifier(tmp_path_factory.mktemp(model_type), model_type, labels)
        return made[key]

    return get


def torch_logits(model, tokenizer, premise: str, hypothesis: str, model_type: str) -> np.ndarray:
    """The reference: one unpadded pair at a time, as the original filter ran it."""
    torch = require("torch")
    enc = tokenizer.encode(premise, hypothesis)
    kwargs = dict(input_ids=torch.tensor([enc.ids]),
                  attention_mask=torch.tensor([enc.attention_mask]))
    if model_type == "bert":
        kwargs["token_type_ids"] = torch.tensor([enc.type_ids])
    with torch.no_grad():
        return model(**kwargs).logits[0].numpy()


@pytest.mark.parametrize("model_type", ["roberta", "bert"])
def test_logits_match_pytorch_sequence_classifier(classifier, model_type):
    folder, reference, tokenizer = classifier(model_type)
    ours = load_sequence_classifier(folder)
    assert ours.config.labels == ("contradiction", "entailment", "neutral")
    rows = dev_rows(6)
    encs = [tokenizer.encode(r["situation"], r["question"]) for r in rows]
    length = max(len(e.ids) for e in encs)
    pad = ours.config.pad_token_id
    ids = np.array([e.ids + [pad] * (length - len(e.ids)) for e in encs])
    mask = np.array([e.attention_mask + [0] * (length - len(e.ids)) for e in encs])
    types = np.array([e.type_ids + [0] * (length - len(e.ids)) for e in encs])
    if model_type == "bert":
        assert types.max() == 1  # the pair template marks the hypothesis
    torch = require("torch")
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if model_type == "bert":
        kwargs["token_type_ids"] = torch.tensor(types)
    with torch.no_grad():
        expected = reference(**kwargs).logits.numpy()
    forward = nnx.jit(lambda m, *args: m(*args))  # one program, not each primitive eagerly
    got = np.asarray(forward(ours, jnp.asarray(ids), jnp.asarray(mask),
                             jnp.asarray(types) if model_type == "bert" else None))
    err = np.abs(got - expected).max()
    print(f"{model_type} classifier: max |ours - torch| logits = {err:.2e}")
    assert got.shape == (6, 3) and err < TOL


@pytest.mark.parametrize("model_type", ["roberta", "bert"])
def test_filter_probabilities_and_decisions(classifier, model_type):
    folder, reference, tokenizer = classifier(model_type)
    nli = NLIFilter.from_pretrained(folder, batch_size=8, max_length=64)
    rows = dev_rows(24)
    premises = [r["situation"] for r in rows]
    hypotheses = [r["question"] for r in rows]
    result = nli(premises, hypotheses)
    assert result.labels == ("contradiction", "entailment", "neutral")
    assert result.probabilities.shape == (24, 3) and result.keep.shape == (24,)
    assert result.keep.dtype == bool
    # Probabilities = softmax of the PyTorch logits, pair by pair (bucketing + order restored).
    logits = np.stack([torch_logits(reference, tokenizer, p, h, model_type)
                       for p, h in zip(premises, hypotheses)])
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(result.probabilities, expected, atol=TOL)
    # Keep exactly the pairs whose argmax label is neutral (drop entailment and contradiction).
    argmax = expected.argmax(-1)
    assert len(set(argmax.tolist())) >= 2, "random model too uniform to test the decision"
    np.testing.assert_array_equal(result.keep, argmax == 2)
    assert result.predicted == [WANLI_LABELS[i] for i in argmax]
    # With a threshold the summed probability of the drop labels decides.
    model = load_sequence_classifier(folder)
    soft = NLIFilter(model, nli.tokenizer, threshold=0.5, max_length=64)
    np.testing.assert_array_equal(soft.decide(result.probabilities), expected[:, :2].sum(-1) < 0.5)
    # Only contradiction dropped, names matched case-insensitively.
    only = NLIFilter(model, nli.tokenizer, drop_labels=("CONTRADICTION",), max_length=64)
    np.testing.assert_array_equal(only.decide(result.probabilities), argmax != 0)


def test_compiles_once_per_bucket_shape(classifier):
    """The rows and batch size of the roberta filter test: the same bucket shapes, so the
    programs load from the compile cache (a trace still counts)."""
    folder, _, _ = classifier("roberta")
    nli = NLIFilter.from_pretrained(folder, batch_size=8, max_length=64)
    rows = dev_rows(24)
    premises, hypotheses = [r["situation"] for r in rows], [r["question"] for r in rows]
    first = nli(premises, hypotheses)
    traces = dict(nli.traces)
    assert traces and all(count == 1 for count in traces.values())
    assert len(traces) < -(-24 // 8), "no two batches shared a bucket shape"
    again = nli(premises[::-1], hypotheses[::-1])
    assert dict(nli.traces) == traces
    np.testing.assert_allclose(again.probabilities[::-1], first.probabilities, atol=1e-6)


def test_truncation_and_bad_inputs(classifier, tmp_path):
    folder, _, _ = classifier("roberta")
    nli = NLIFilter.from_pretrained(folder, max_length=32)
    long_answer = " ".join(r["situation"] for r in dev_rows(50))  # 500+ words
    # with 7 dev pairs, one [8, 32] batch: the filter tests' shape, loaded from the compile cache
    rows = dev_rows(7)
    result = nli(["a short situation."] + [r["situation"] for r in rows],
                 [long_answer] + [r["question"] for r in rows])
    assert result.probabilities.shape == (8, 3)
    assert np.isclose(result.probabilities[0].sum(), 1.0, atol=1e-5)
    assert max(nli.traces)[1] == 32  # truncated to max_length
    empty = nli([], [])
    assert empty.probabilities.shape == (0, 3) and empty.keep.shape == (0,)
    with pytest.raises(ValueError, match="2 premises but 1 hypotheses"):
        nli(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="single string"):
        nli("a", "b")
    with pytest.raises(TypeError, match=r"hypotheses\[0\] is int"):
        nli(["a"], [3])
    with pytest.raises(ValueError, match="max_length 500"):
        NLIFilter.from_pretrained(folder, max_length=500)
    # A tokenizer that can emit ids beyond the embedding table (jax would clamp them silently).
    folder = shutil.copytree(folder, tmp_path / "copy")
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = 50
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"tokenizer\.json has \d+ tokens.*only 50 rows"):
        NLIFilter.from_pretrained(folder)


def test_unexpected_labels_are_a_clear_error(classifier):
    generic = {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    folder, _, _ = classifier("roberta", labels=generic)
    with pytest.raises(CheckpointError) as e:
        NLIFilter.from_pretrained(folder)
    message = str(e.value)
    assert "config.json" in message
    assert "['LABEL_0', 'LABEL_1', 'LABEL_2']" in message  # the model's labels
    assert "entailment" in message and "contradiction" in message  # the expected ones
    # Naming the model's own labels works.
    nli = NLIFilter.from_pretrained(folder, drop_labels=("label_0",))
    assert nli.drop_columns.tolist() == [True, False, False]
