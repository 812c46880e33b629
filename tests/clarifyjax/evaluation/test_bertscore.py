"""clarifyjax.evaluation.bertscore against the `bert-score` package (0.3.13) itself, within 1e-5 on P, R and F:
the real all-MiniLM-L6-v2 folder at two layers, idf on and off, one and several references, a
rescaling baseline; a tiny random RoBERTa (prefix space, negative cosines) made here."""
from __future__ import annotations

import numpy as np
import pytest

from clarifyjax.core import traces
from clarifyjax.evaluation.bertscore import BertScoreModel, bertscore, default_layer, read_baseline
from helpers.env import require
from helpers.bert_score_package import package_score, tiny_roberta_folder, write_baseline

pytestmark = pytest.mark.reference

CANDIDATES = [
    "Is it okay to lie to a friend to protect their feelings?",
    "The cat sat on the mat.",
    "",  # empty: P = R = F = 0 (raw)
    "hello",
    "   Stealing bread to feed a starving child is understandable but still illegal.   ",
    "the the the the",
    "Should I tell my boss that my coworker is taking credit for my work, even if it might "
    "hurt our friendship and make the office atmosphere worse for everyone involved? " * 3,
    "No.",
    "Yes, it is fine.",
]
REFERENCES = [
    "Would it be acceptable to deceive a friend so they are not hurt?",
    "A cat was sitting on a mat.",
    "Nothing to compare.",
    "hello",
    "Taking food to feed a hungry kid is wrong but forgivable.",
    " ",  # empty reference
    "Is it right to report a colleague who takes credit for my work?",
    "Absolutely not, never do that.",
    "Yes, it is fine.",
]
MORE = ["A second reference for the first candidate.", "the cat is on the mat", "", "hi there",
        "Stealing is wrong.", "the", "Tell your boss.", "no", "That is fine."]


def assert_close(ours, theirs, tol=1e-5):
    for name, a, b in zip("PRF", ours, theirs):
        assert a.shape == b.shape and a.dtype == np.float32, (name, a.shape, b.shape)
        err = float(np.max(np.abs(a - b)))
        assert err <= tol, f"{name}: max |ours - package| = {err}"


@pytest.mark.slow  # the package loads torch and the model for each of its four calls
@pytest.mark.parametrize("layer,idf", [(3, False), (6, True)])
def test_equals_the_package_on_minilm(minilm, tmp_path, layer, idf):
    ours = bertscore(CANDIDATES, REFERENCES, model=minilm, layer=layer, idf=idf)
    assert_close(ours, package_score(CANDIDATES, REFERENCES, minilm, layer, idf=idf))
    assert ours[2][2] == 0 and ours[0][5] == 0  # the empty candidate, the empty reference
    assert ours[2][8] == pytest.approx(1.0, abs=1e-6)  # identical texts

    # Several references per candidate (each of P, R, F the best), rescaled by a baseline file,
    # with the other idf setting: both layers see idf on and off.
    idf = not idf
    baseline = write_baseline(tmp_path / "baseline.tsv", 6, seed=layer)
    groups = [[a, b] for a, b in zip(REFERENCES, MORE)]
    ours = bertscore(CANDIDATES, groups, model=minilm, layer=layer, idf=idf, baseline=baseline)
    theirs = package_score(CANDIDATES, groups, minilm, layer, idf=idf, lang="en",
                           rescale_with_baseline=True, baseline_path=str(baseline))
    assert_close(ours, theirs)


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    require("torch")
    return tiny_roberta_folder(tmp_path_factory.mktemp("bertscore_roberta"))


@pytest.mark.parametrize("layer,idf", [(0, False), (3, True)])
def test_equals_the_package_on_a_tiny_roberta(roberta, layer, idf):
    """Prefix space, <s> and </s> in the matching, and the package's zero floor on best matches
    (its padding): at layer 0 this random model has tokens whose every cosine is negative."""
    from clarifyjax.models.tiny import tiny_corpus

    texts = tiny_corpus(200)[:60]
    cands = texts[:30] + ["", "hello"]
    refs = [texts[30 + i].split()[0] if i % 3 == 0 else texts[30 + i] for i in range(30)] + ["x", ""]
    ours = bertscore(cands, refs, model=roberta, layer=layer, idf=idf, batch_size=4)
    assert_close(ours, package_score(cands, refs, roberta, layer, idf=idf, batch_size=4))

    model = BertScoreModel.from_folder(roberta)
    assert model.encode(["Hello world"])[0] != [t for t in [model.tokenizer.encode("Hello world").ids]][0]
    assert model.encode(["  "])[0] == [model.cls_id, model.sep_id]


def test_padding_floor_is_exercised(roberta, monkeypatch):
    """Without the package's zero floor the tiny RoBERTa's layer-0 precision differs: the test
    above reaches that branch."""
    import clarifyjax.evaluation.bertscore as bertscore_module
    from clarifyjax.models.tiny import tiny_corpus

    texts = tiny_corpus(200)[:60]
    cands, refs = texts[:30], [texts[30 + i].split()[0] if i % 3 == 0 else texts[30 + i] for i in range(30)]
    with_floor = bertscore(cands, refs, model=roberta, layer=0, batch_size=4)[0]
    monkeypatch.setattr(bertscore_module, "_floors", lambda c, r, b: (np.zeros(len(c), bool),) * 2)
    without = bertscore(cands, refs, model=roberta, layer=0, batch_size=4)[0]
    assert np.max(np.abs(with_floor - without)) > 1e-3


def test_shapes_repeat_and_compile_once(roberta):
    model = BertScoreModel.from_folder(roberta)
    cands = ["a b c", "the cat", "x y"] * 10
    bertscore(cands, cands[::-1], model=model, layer=2)
    before = traces.count()
    bertscore(cands[::-1], cands, model=model, layer=2)
    assert traces.count() == before


def test_default_layers_and_errors(roberta, tmp_path):
    assert default_layer("bert-base-uncased") == 9 and default_layer("roberta-large") == 17
    assert default_layer("/models/roberta-base") == 10 and default_layer("my-model") is None
    with pytest.raises(ValueError, match="no default BERTScore layer.*give layer="):
        bertscore(["a"], ["b"], model=roberta)
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 3\]"):
        bertscore(["a"], ["b"], model=roberta, layer=4)
    with pytest.raises(ValueError, match="one entry .* per candidate: 2 candidates, got 1"):
        bertscore(["a", "b"], ["b"], model=roberta, layer=1)
    with pytest.raises(ValueError, match=r"references\[0\] is an empty list"):
        bertscore(["a"], [[]], model=roberta, layer=1)
    with pytest.raises(TypeError, match=r"candidates\[1\] is int"):
        bertscore(["a", 3], ["b", "c"], model=roberta, layer=1)
    bad = tmp_path / "b.tsv"
    bad.write_text("LAYER,P,R,F\n0,0.1,0.2,x\n")
    with pytest.raises(ValueError, match="b.tsv: the row of layer 0"):
        read_baseline(bad, 0)
    with pytest.raises(ValueError, match="no row for layer 3"):
        read_baseline(bad, 3)
    assert [len(x) for x in bertscore([], [], model=roberta, layer=1)] == [0, 0, 0]
