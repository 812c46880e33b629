"""Issue 26, item 1: sequence-classifier folders as the installed transformers saves them.

transformers 5 writes no `id2label`, `label2id` or `num_labels` into config.json when the labels
are its defaults (two labels, LABEL_0 and LABEL_1), and reads such a folder as two labels. Every
loader of a classifier folder (`load_classifier`, the per-family loaders, the NLI filter, the
classifier judge, the discriminator baseline, the discriminator's training start, the memory plan)
must read it that way too: here each reads BERT, RoBERTa and DeBERTa-v3-like folders
(`type_vocab_size: 0`) saved by `save_pretrained` with default and non-default labels, and matches
PyTorch's logits (the dry run's `check_classifier_folder` reads them too). Folders that are not
classifiers, and malformed label fields, are refused with one line naming the file and the field.
"""
from __future__ import annotations

import functools
import json
import re
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from helpers.encoder_builders import randomize
from helpers.env import require, shared_data
from clarifyjax.models import tiny
from clarifyjax.models.hf import (check_classifier_folder, load_classifier,
                                  load_deberta_sequence_classifier, load_question_answering,
                                  load_sequence_classifier)
from clarifyjax.models.safetensors_io import CheckpointError

pytestmark = pytest.mark.reference

FAMILIES = ("bert", "roberta", "deberta")
LABELINGS = {
    "default": {},  # transformers writes no label field at all
    "three": {"num_labels": 3},  # default names, written as id2label
    "nli": {"id2label": {0: "entailment", 1: "neutral", 2: "contradiction"}},
    "judge": {"id2label": {0: "good", 1: "bad", 2: "ok"}},
}
TEXTS = ["Is it okay to lie to a friend?", "Helping a neighbour move house.", "x",
         "Skipping work to watch a movie with my kids because they were sad."]
TOL = 2e-4


def _config(family: str, vocab_size: int, labels: dict):
    transformers = require("transformers")
    if "id2label" in labels:
        labels = dict(labels, label2id={v: k for k, v in labels["id2label"].items()})
    sizes = dict(vocab_size=vocab_size, **labels)
    if family == "deberta":
        return transformers.DebertaV2Config(**sizes, **tiny.TINY_DEBERTA_V3)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=64, **sizes)
    if family == "roberta":
        return transformers.RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                          type_vocab_size=1, **common)
    return transformers.BertConfig(pad_token_id=0, type_vocab_size=2, **common)


class Folders:
    """Classifier folders saved by transformers' `save_pretrained`, made on first use."""

    def __init__(self, root):
        self.root, self.made, self.tokenizers = root, {}, {}

    def tokenizer(self, family: str):
        kind = "roberta" if family == "roberta" else "bert"
        if kind not in self.tokenizers:
            self.tokenizers[kind] = tiny.tiny_bpe_tokenizer(kind)
        return self.tokenizers[kind]

    def __call__(self, family: str, labeling: str = "default", head: str = "classifier"):
        key = (family, labeling, head)
        if key not in self.made:
            transformers = require("transformers")
            tokenizer = self.tokenizer(family)
            config = _config(family, tokenizer.get_vocab_size(), LABELINGS[labeling])
            prefix = {"bert": "Bert", "roberta": "Roberta", "deberta": "DebertaV2"}[family]
            suffix = {"classifier": "ForSequenceClassification", "bare": "Model",
                      "qa": "ForQuestionAnswering"}[head]
            require("torch").manual_seed(len(self.made))
            model = randomize(getattr(transformers, prefix + suffix)(config), len(self.made))
            folder = self.root.mktemp(f"{family}_{labeling}_{head}")
            model.save_pretrained(str(folder))
            tokenizer.save(str(folder / "tokenizer.json"))
            self.made[key] = folder, model
        return self.made[key]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    require("tokenizers")
    shared_data("delta-clarify/train.tsv")  # the tokenizers' corpus
    return Folders(tmp_path_factory)


def _batch(tokenizer, texts=TEXTS):
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(texts), width), np.int32)
    mask = np.zeros((len(texts), width), np.int32)
    for i, e in enumerate(encodings):
        ids[i, :len(e.ids)], mask[i, :len(e.ids)] = e.ids, 1
    return ids, mask


@functools.partial(jax.jit, static_argnums=0)
def _run(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state)(ids, mask, 0 * ids)


def _logits(model, ids, mask) -> np.ndarray:
    """Our model's output on [b, s] ids and mask, jitted once per architecture (eager ops would
    compile one by one)."""
    return jax.tree.map(np.asarray, _run(*nnx.split(model), ids, mask))


def _torch_logits(model, ids, mask) -> np.ndarray:
    torch = require("torch")
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()


def _specific_loader(family: str):
    return load_deberta_sequence_classifier if family == "deberta" else load_sequence_classifier


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_loads_default_labels_as_transformers_reads_them(folders, family):
    folder, torch_model = folders(family, "default")
    written = json.loads((folder / "config.json").read_text())
    # the case of the issue: nothing about labels is written, and transformers reads two
    assert not {"id2label", "label2id", "num_labels"} & set(written), written
    assert torch_model.config.num_labels == 2
    if family == "deberta":
        assert written["type_vocab_size"] == 0
    ids, mask = _batch(folders.tokenizer(family))
    reference = _torch_logits(torch_model, ids, mask)
    assert reference.shape == (len(TEXTS), 2) and np.ptp(reference) > 0.1
    for load in (load_classifier, _specific_loader(family)):
        model = load(folder)
        assert model.config.labels == ("LABEL_0", "LABEL_1")
        np.testing.assert_allclose(_logits(model, ids, mask), reference, atol=TOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_loader_reads_other_labels(folders, family):
    """Named labels and three default names (written as id2label) read in id order by both
    loaders, the judge's included (once the judge's labels are named)."""
    from clarifyjax.reward.judge import load_judge

    for labeling in ("nli", "judge", "three"):
        folder, torch_model = folders(family, labeling)
        expected = tuple(torch_model.config.id2label[i] for i in range(3))
        load = _specific_loader(family) if labeling == "nli" else load_classifier
        assert load(folder).config.labels == expected
    with pytest.raises(CheckpointError, match=r"id2label has labels \['LABEL_0', 'LABEL_1', "
                                              r"'LABEL_2'\]; a judge needs exactly 3 labels"):
        load_judge(folder, max_input_length=32)
    judge = load_judge(folder, encoder_labels=("LABEL_2", "LABEL_1", "LABEL_0"),
                       max_input_length=32)
    assert judge.columns.tolist() == [2, 1, 0]


@pytest.mark.parametrize("family", ["bert", "deberta"])  # with and without token types
def test_nli_filter_reads_default_labels(folders, family):
    from clarifyjax.reward.nli import NLIFilter

    folder, torch_model = folders(family, "default")
    nli = NLIFilter.from_pretrained(folder, drop_labels=("LABEL_0",), max_length=32)
    assert nli.labels == ("LABEL_0", "LABEL_1") and nli.use_token_types == (family == "bert")
    probs = nli.probabilities(TEXTS, TEXTS[::-1])
    encodings = nli.tokenizer.encode_batch(list(zip(TEXTS, TEXTS[::-1])))
    torch = require("torch")
    for row, e in zip(probs, encodings):
        kwargs = {"input_ids": torch.tensor([e.ids])}
        if family == "bert":  # the only family with segment embeddings
            kwargs["token_type_ids"] = torch.tensor([e.type_ids])
        with torch.no_grad():
            want = torch_model(**kwargs).logits.softmax(-1)[0].numpy()
        np.testing.assert_allclose(row, want, atol=TOL, rtol=0)
    with pytest.raises(CheckpointError, match=r"config\.json: the model's labels \['LABEL_0', "
                                              r"'LABEL_1'\].*\['entailment'"):
        NLIFilter.from_pretrained(folders(family, "default")[0])


def test_classifier_judge_of_deberta(folders):
    from clarifyjax.reward.judge import ClassifierJudge, load_judge

    folder, torch_model = folders("deberta", "judge")
    judge = load_judge(folder, max_input_length=32)
    assert isinstance(judge, ClassifierJudge)
    ids, mask = _batch(judge.tokenizer)
    want = _torch_logits(torch_model, ids, mask)
    want = np.exp(want - want.max(-1, keepdims=True))
    want = (want / want.sum(-1, keepdims=True))[:, [1, 2, 0]]  # (good, bad, ok) -> bad, ok, good
    np.testing.assert_allclose(judge.class_probabilities(TEXTS), want, atol=TOL, rtol=0)


def test_discriminator_and_its_training_start_read_default_labels(folders):
    from clarifyjax.config import ModelConfig
    from clarifyjax.evaluation.baselines import Discriminator
    from clarifyjax.training.builders import build_classifier

    folder, torch_model = folders("deberta", "default")
    discriminator = Discriminator(folder, relevant_label="LABEL_1", max_length=32)
    assert discriminator.column == 1 and discriminator.classifier.labels == ("LABEL_0", "LABEL_1")
    with pytest.raises(CheckpointError, match=r"config\.json: id2label \['LABEL_0', 'LABEL_1'\] "
                                              r"has no 'relevant' label"):
        Discriminator(folder)
    assert check_classifier_folder(folder).labels == ("LABEL_0", "LABEL_1")  # the dry run's check
    model, tokenizer = build_classifier(ModelConfig(init=str(folder), max_input_length=32),
                                        mesh=None, rules=None)
    assert model.config.labels == ("LABEL_0", "LABEL_1") and model.config.type_vocab_size == 0
    assert tokenizer.get_vocab_size() == torch_model.config.vocab_size


def test_memory_plan_and_qa_loader_read_deberta_v3_folders(folders):
    from clarifyjax.training import memory_plan

    for labeling in ("default", "three"):
        folder, torch_model = folders("deberta", labeling)
        hf = (folder / "config.json").read_text()
        flat = memory_plan.abstract_state("encoder", json.dumps(json.loads(hf), sort_keys=True),
                                          "float32")
        ours = sum(int(np.prod(v.get_value().shape)) for _, v in flat)
        assert ours == sum(p.numel() for p in torch_model.parameters())
    folder, torch_model = folders("deberta", "default", head="qa")
    model = load_question_answering(folder)
    ids, mask = _batch(folders.tokenizer("deberta"))
    start, end = _logits(model, ids, mask)
    torch = require("torch")
    with torch.no_grad():
        out = torch_model(input_ids=torch.tensor(ids, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long))
    np.testing.assert_allclose(start, out.start_logits.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(end, out.end_logits.numpy(), atol=TOL, rtol=0)


# --------------------------------------------------------------------------- refused folders

# (a change to a classifier's config.json, the text its one-line refusal must hold)
BAD_LABEL_FIELDS = [
    ({"id2label": {}}, "field 'id2label' must be a non-empty object"),
    ({"id2label": ["a", "b"]}, "field 'id2label' must be a non-empty object"),
    ({"id2label": {"a": "x", "b": "y"}}, r"field 'id2label' has keys \['a', 'b'\]"),
    ({"id2label": {"0": "a", "2": "b"}}, r"field 'id2label' must have ids 0\.\.n-1, got \[0, 2\]"),
    ({"id2label": {"1": "a"}}, r"field 'id2label' must have ids 0\.\.n-1, got \[1\]"),
    ({"num_labels": 0}, "field 'num_labels' is 0"),
    ({"num_labels": -2}, "field 'num_labels' is -2"),
    ({"num_labels": "two"}, "field 'num_labels' is 'two'"),
    ({"num_labels": True}, "field 'num_labels' is True"),
    ({"num_labels": 2.5}, "field 'num_labels' is 2.5"),
    ({"architectures": "BertForSequenceClassification"}, "field 'architectures' must be a list"),
    ({"architectures": [3]}, "field 'architectures' must be a list"),
    ({"architectures": ["DebertaV2ForMaskedLM"]}, "field 'architectures' is .*not a sequence-"),
]


@pytest.mark.parametrize("family", ["roberta", "deberta"])
def test_bad_label_fields_are_refused_naming_file_and_field(folders, family, tmp_path):
    source = folders(family, "default")[0]
    for change, message in BAD_LABEL_FIELDS:
        folder = tmp_path / f"bad{BAD_LABEL_FIELDS.index((change, message))}"
        shutil.copytree(source, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointError) as e:
            load_classifier(folder)
        text = str(e.value)
        assert "\n" not in text and str(folder / "config.json") in text, text
        assert re.search(message, text), (change, text)


@pytest.mark.parametrize("family", FAMILIES)
def test_folders_without_a_classification_head_are_refused(folders, family):
    for head, name in (("bare", "Model"), ("qa", "ForQuestionAnswering")):
        folder = folders(family, "default", head=head)[0]
        with pytest.raises(CheckpointError, match=r"field 'architectures' is \['\w+" + name
                                                  + r"'\]: not a sequence-classification"):
            load_classifier(folder)
