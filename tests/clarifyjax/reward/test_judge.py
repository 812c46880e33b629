"""The judge (`clarifyjax.reward.judge`) against the original's method on PyTorch, same weights.

T5 judge. The tiny tokenizer is Delphi-like (clarifyjax/models/tiny.py): "<" is not a piece, so the
class prefix "<class>" is `▁ <unk> class >` and "1", "0", "-1" are single pieces. The original
(allenai/clarifydelphi `DelphiScorer.score_batch`) runs HF greedy `generate(..., output_scores=
True, return_dict_in_generate=True)`, softmaxes `scores[4]` over the whole vocabulary, takes the
columns `convert_tokens_to_ids("1" / "0" / "-1")` and (in the reward) normalizes them. A random
model does not write the prefix by itself, so the reference forces it: `generate` starts from
`decoder_input_ids = [start, ▁, <unk>, class, >]` and its first score is the distribution at the
class step, conditioned on exactly the tokens Delphi would have generated. Ours teacher-forces the
same prefix in one jitted forward and softmaxes the three class logits.
Tolerance: 1e-5 absolute on the probabilities (float32 both sides).

Classifier judge: softmax of `RobertaForSequenceClassification` logits, columns reordered to
(bad, ok, good) by label name, within 1e-5.
"""
from __future__ import annotations

import csv

import numpy as np
import pytest

from helpers.tiny_models import tiny_classifier_folder, tiny_t5_folder
from helpers.env import require, shared_data
from clarifyjax.core import traces
from clarifyjax.reward.judge import DELPHI_CLASS_STEP, ClassifierJudge, Judge, load_judge
from clarifyjax.text.generator import Sampling
from clarifyjax.text.formats import parse_delphi_output
from clarifyjax.models.safetensors_io import CheckpointError

TOL = 1e-5
CLASS_TOKENS = ("-1", "0", "1")  # bad, ok, good


def dev_situations(n: int, offset: int = 0) -> list[str]:
    with open(shared_data("delta-clarify/dev.tsv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["situation"] for r in rows[offset: offset + n]]


@pytest.fixture(scope="module", params=["v1.0", "v1.1"])
def t5_judge(request, tmp_path_factory):
    """(folder, our Judge, torch model, HF tokenizer)."""
    transformers = require("transformers")
    folder = tiny_t5_folder(tmp_path_factory, family=request.param, seed=3)
    judge = Judge.from_pretrained(folder, class_step=DELPHI_CLASS_STEP, batch_multiple=8,
                                  judgment=Sampling(max_new_tokens=10))
    torch_model = transformers.T5ForConditionalGeneration.from_pretrained(str(folder)).eval()
    hf_tok = transformers.T5TokenizerFast.from_pretrained(str(folder), extra_ids=0)
    return folder, judge, torch_model, hf_tok


def original_class_probabilities(torch_model, hf_tok, texts, prefix_ids, step: int = 0):
    """The original's score_batch with the class prefix forced (see the module docstring).

    `step` picks which generated step's scores to read (0 = the one right after the prefix).
    """
    torch = require("torch")
    enc = hf_tok(["[moral_single]: " + t for t in texts], return_tensors="pt", padding=True)
    start = torch_model.config.decoder_start_token_id
    decoder = torch.tensor([[start] + list(prefix_ids)] * len(texts))
    with torch.no_grad():
        out = torch_model.generate(**enc, decoder_input_ids=decoder, do_sample=False,
                                   max_new_tokens=step + 1, min_new_tokens=step + 1,
                                   output_scores=True, return_dict_in_generate=True)
    probs = out["scores"][step].softmax(-1)
    columns = probs[:, hf_tok.convert_tokens_to_ids(list(CLASS_TOKENS))]  # bad, ok, good
    return (columns / columns.sum(-1, keepdim=True)).numpy()


@pytest.mark.reference
def test_prefix_and_class_ids_are_delphis(t5_judge):
    _, judge, _, hf_tok = t5_judge
    assert hf_tok.convert_ids_to_tokens(list(judge.prefix_ids)) == ["▁", "<unk>", "class", ">"]
    assert list(judge.class_ids) == hf_tok.convert_tokens_to_ids(list(CLASS_TOKENS))
    assert hf_tok.unk_token_id not in judge.class_ids


@pytest.mark.reference
def test_class_probabilities_equal_the_original_method(t5_judge):
    _, judge, torch_model, hf_tok = t5_judge
    texts = dev_situations(11)  # 11 rows: padded to 16, lengths differ within the bucket
    ours = judge.class_probabilities(texts)
    theirs = original_class_probabilities(torch_model, hf_tok, texts, judge.prefix_ids)
    assert ours.shape == (11, 3) and ours.dtype == np.float32
    np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0)
    # The comparison can fail: the rows differ from each other and from uniform, and reading one
    # step later (a wrong prefix length) gives clearly different numbers.
    assert np.ptp(ours, axis=0).max() > 1e-3 and np.abs(ours - 1 / 3).max() > 1e-2
    later = original_class_probabilities(torch_model, hf_tok, texts, judge.prefix_ids, step=1)
    assert np.abs(later - ours).max() > 1e-3


@pytest.mark.reference
def test_inputs_match_the_reference_tokenization(t5_judge):
    _, judge, _, hf_tok = t5_judge
    texts = dev_situations(5, offset=20)
    ids, mask, _ = judge.seq2seq.encode(judge.inputs(texts))
    ref = hf_tok(["[moral_single]: " + t for t in texts])["input_ids"]
    for row, m, r in zip(ids, mask, ref):
        assert row[: m.sum()].tolist() == r


@pytest.mark.reference
def test_batched_and_single_agree_and_shapes_compile_once(t5_judge):
    _, judge, _, _ = t5_judge
    texts = dev_situations(13, offset=40)
    judge.class_probabilities(texts[:10])  # 10 -> 16 rows
    before = traces.count("class_probabilities")
    batched = judge.class_probabilities(texts)  # 13 -> 16 rows, same length bucket
    assert traces.count("class_probabilities") == before
    single = np.concatenate([judge.class_probabilities([t]) for t in texts[:3]])
    np.testing.assert_allclose(batched[:3], single, atol=1e-6)


@pytest.mark.reference
def test_policy_prefix_is_stripped(t5_judge):
    _, judge, _, _ = t5_judge
    text = dev_situations(1)[0]
    np.testing.assert_allclose(judge.class_probabilities(["question: " + text]),
                               judge.class_probabilities([text]), atol=0)


@pytest.mark.reference
def test_judgment_text_is_greedy_decoding(t5_judge):
    _, judge, torch_model, hf_tok = t5_judge
    torch = require("torch")
    texts = dev_situations(4, offset=60)
    n = judge.judgment_sampling.max_new_tokens
    ours = judge.judgment_text(texts)
    enc = hf_tok(["[moral_single]: " + t for t in texts], return_tensors="pt", padding=True)
    with torch.no_grad():
        seq = torch_model.generate(**enc, do_sample=False, max_new_tokens=n)
    generated = judge.seq2seq.generate(judge.inputs(texts), judge.judgment_sampling).tokens
    for ours_row, ref_row in zip(generated, seq[:, 1:].numpy()):  # drop the start token
        k = min(len(ref_row), n)
        eos = np.flatnonzero(ref_row[:k] == 1)
        k = eos[0] + 1 if eos.size else k
        assert ours_row[:k].tolist() == ref_row[:k].tolist()
    ref_text = [parse_delphi_output(" ".join(hf_tok.decode(r, skip_special_tokens=True).split()),
                                    keep_unparsed=True)[1]
                for r in seq[:, 1:].numpy()]
    assert ours == ref_text


@pytest.mark.parametrize("decoded,expected", [
    ("<class>1</class> <text>it's good</text>", (1, "it's good")),
    ("<unk> class>-1<unk> /class> <unk> text>it's rude<unk> /text>", (-1, "it's rude")),
    ("class>0/class> text>it's okay/text>", (0, "it's okay")),  # <unk> dropped on decoding
    ("no structure here", (None, "no structure here")),
])
def test_parse_judgment(decoded, expected):
    assert parse_delphi_output(decoded, keep_unparsed=True) == expected


# ------------------------------------------------------------------------------- bad judges


@pytest.mark.reference
def test_vocabulary_without_a_class_token_fails_clearly(tmp_path_factory):
    folder = tiny_t5_folder(tmp_path_factory, seed=5, minus_one=False)
    with pytest.raises(CheckpointError, match=r"class token '-1' is not one vocabulary id"):
        Judge.from_pretrained(folder)


@pytest.mark.reference
def test_class_token_outside_the_vocabulary_fails_clearly(t5_judge):
    folder = t5_judge[0]
    with pytest.raises(CheckpointError, match=r"class token '<' is not in the judge's vocabulary"):
        Judge.from_pretrained(folder, class_tokens=("<", "0", "1"))
    with pytest.raises(CheckpointError, match="3 distinct"):
        Judge.from_pretrained(folder, class_tokens=("1", "0", "1"))


@pytest.mark.reference
def test_prefix_length_is_checked(t5_judge):
    with pytest.raises(CheckpointError, match=r"tokenizes to 4 ids .* decoder step 3"):
        Judge.from_pretrained(t5_judge[0], class_step=3)


@pytest.mark.reference
def test_empty_text_is_an_error(t5_judge):
    with pytest.raises(ValueError, match="judge text 1: field 'situation' is empty"):
        t5_judge[1].class_probabilities(["fine", "question:  "])


# ------------------------------------------------------------------------------- classifier judge


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    transformers = require("transformers")
    labels = ("good", "bad", "ok")  # not in (bad, ok, good) order: columns must be reordered
    folder = tiny_classifier_folder(tmp_path_factory, labels, seed=4)
    torch_model = transformers.RobertaForSequenceClassification.from_pretrained(str(folder)).eval()
    return folder, torch_model


@pytest.mark.reference
def test_classifier_judge_matches_pytorch(classifier):
    torch = require("torch")
    folder, torch_model = classifier
    judge = load_judge(folder)
    assert isinstance(judge, ClassifierJudge)
    texts = dev_situations(9, offset=80)
    ours = judge.class_probabilities(texts)
    ref = []
    for e in judge.tokenizer.encode_batch(texts):  # one at a time: no padding on the reference
        with torch.no_grad():
            logits = torch_model(input_ids=torch.tensor([e.ids])).logits
        ref.append(logits.softmax(-1)[0].numpy())
    ref = np.stack(ref)[:, [1, 2, 0]]  # (good, bad, ok) -> (bad, ok, good)
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)
    assert np.abs(ours - 1 / 3).max() > 1e-2
    names = {0: "it's bad", 1: "it's okay", 2: "it's good"}
    assert judge.judgment_text(texts) == [names[k] for k in ours.argmax(-1)]


@pytest.mark.reference
def test_classifier_with_other_labels_fails_clearly(tmp_path_factory):
    folder = tiny_classifier_folder(tmp_path_factory, ("positive", "negative", "neutral"))
    message = r"config.json.*'positive'.*named \['bad', 'ok', 'good'\]"
    with pytest.raises(CheckpointError, match=message):
        load_judge(folder)
    judge = load_judge(folder, encoder_labels=("negative", "neutral", "positive"))
    assert judge.class_probabilities(["x y"]).shape == (1, 3)


@pytest.mark.reference
def test_load_judge_dispatches_on_model_type(t5_judge, tmp_path):
    assert isinstance(load_judge(t5_judge[0]), Judge)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(CheckpointError, match="model_type 'gpt2'"):
        load_judge(tmp_path)


@pytest.mark.reference
def test_sampling_needs_an_rng(t5_judge):
    with pytest.raises(ValueError, match="needs an rng"):
        t5_judge[1].seq2seq.generate(["a"], Sampling(temperature=0.7))
