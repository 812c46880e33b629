"""clarifyjax.text.tokenizer: both backends against SentencePiece itself, on δ-CLARIFY.

A unigram SentencePiece model (vocab 2,000; pad/eos/unk = 0/1/2 as in T5) is trained once per
module on the situations and questions of train.tsv. The reference for encoding is written here
with `sentencepiece` directly: pieces, cut to max_length - 1, EOS, pad.
"""
from __future__ import annotations

import io
import os

import numpy as np
import pytest

from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.core.buckets import bucket_length
from clarifyjax.text.tokenizer import Tokenizer
from helpers.env import require, shared_data

MAX_LENGTH = 16  # truncates roughly one dev situation in seven (with EOS)
PAD, EOS, UNK = 0, 1, 2


def read_column(path, column: str) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    index = header.index(column)
    return [line.split("\t")[index] for line in lines[1:]]


@pytest.fixture(scope="module")
def spm_folder(tmp_path_factory):
    spm = require("sentencepiece")
    train = shared_data("delta-clarify/train.tsv")
    lines = [t for t in read_column(train, "situation") + read_column(train, "question") if t.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=2000, model_type="unigram",
        pad_id=PAD, eos_id=EOS, unk_id=UNK, bos_id=-1, num_threads=2, minloglevel=2)
    folder = tmp_path_factory.mktemp("spm")
    (folder / "spiece.model").write_bytes(model.getvalue())
    return folder


@pytest.fixture(scope="module")
def sp(spm_folder):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(spm_folder / "spiece.model"))


@pytest.fixture(scope="module")
def dev_situations() -> list[str]:
    return read_column(shared_data("delta-clarify/dev.tsv"), "situation")[:1000]


@pytest.fixture(scope="module")
def hf(spm_folder) -> Tokenizer:
    return Tokenizer.from_pretrained(spm_folder, backend="hf")


@pytest.fixture(scope="module")
def tf_text(spm_folder) -> Tokenizer:
    require("tensorflow_text")
    return Tokenizer.from_pretrained(spm_folder, backend="tf_text")


def reference_encode(sp, texts, max_length):
    """Plain sentencepiece + numpy: the independent reference."""
    ids = np.full((len(texts), max_length), PAD, np.int32)
    mask = np.zeros((len(texts), max_length), np.int32)
    truncated = 0
    for i, pieces in enumerate(sp.encode(texts)):
        if len(pieces) + 1 > max_length:
            pieces, truncated = pieces[: max_length - 1], truncated + 1
        row = pieces + [EOS]
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return ids, mask, truncated


# ------------------------------------------------------------------------------- agreement

@pytest.mark.reference
def test_hf_backend_equals_sentencepiece(hf, sp, dev_situations):
    assert (hf.pad_id, hf.eos_id, hf.unk_id, hf.vocab_size) == (PAD, EOS, UNK, 2000)
    ids, mask, stats = hf.encode_batch_with_stats(dev_situations, MAX_LENGTH)
    ref_ids, ref_mask, ref_truncated = reference_encode(sp, dev_situations, MAX_LENGTH)
    assert ids.dtype == mask.dtype == np.int32 and ids.shape == (1000, MAX_LENGTH)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(mask, ref_mask)
    assert 50 < stats.truncated == ref_truncated < 500  # the test really exercises truncation
    assert stats.lengths.tolist() == [len(p) + 1 for p in sp.encode(dev_situations)]
    # decoding: spm's own decode of the kept pieces
    kept = [row[m.astype(bool)][:-1].tolist() for row, m in zip(ids, mask)]
    assert hf.decode_batch(ids) == sp.decode(kept)


@pytest.mark.reference
def test_tf_text_backend_equals_hf(hf, tf_text, dev_situations):
    assert (tf_text.pad_id, tf_text.eos_id, tf_text.unk_id, tf_text.vocab_size) == \
        (hf.pad_id, hf.eos_id, hf.unk_id, hf.vocab_size)
    hf_ids, hf_mask, hf_stats = hf.encode_batch_with_stats(dev_situations, MAX_LENGTH)
    tf_ids, tf_mask, tf_stats = tf_text.encode_batch_with_stats(dev_situations, MAX_LENGTH)
    np.testing.assert_array_equal(tf_ids, hf_ids)
    np.testing.assert_array_equal(tf_mask, hf_mask)
    assert tf_stats.truncated_rows == hf_stats.truncated_rows and tf_stats.truncated > 50
    np.testing.assert_array_equal(tf_stats.lengths, hf_stats.lengths)
    assert tf_text.decode_batch(tf_ids) == hf.decode_batch(hf_ids)


@pytest.mark.reference
@pytest.mark.parametrize("backend", ["hf", "tf_text"])
def test_untruncated_texts_decode_back(backend, hf, request, dev_situations):
    tok = hf if backend == "hf" else request.getfixturevalue("tf_text")
    ids, _, stats = tok.encode_batch_with_stats(dev_situations, 64)
    assert stats.truncated == 0
    decoded = tok.decode_batch(ids)
    # SentencePiece's nmt_nfkc normalization collapses runs of spaces; nothing else changes here
    assert decoded == [" ".join(t.split()) for t in dev_situations]


@pytest.mark.reference
def test_hf_backend_from_tokenizer_json_only(hf, spm_folder, tmp_path, dev_situations):
    hf._tok.save_pretrained(str(tmp_path / "converted"))
    only_json = tmp_path / "only_json"
    only_json.mkdir()
    (only_json / "tokenizer.json").write_bytes((tmp_path / "converted" / "tokenizer.json").read_bytes())
    tok = Tokenizer.from_pretrained(only_json)
    assert (tok.pad_id, tok.eos_id, tok.vocab_size) == (PAD, EOS, 2000)
    for a, b in zip(tok.encode_batch(dev_situations[:200], MAX_LENGTH),
                    hf.encode_batch(dev_situations[:200], MAX_LENGTH)):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------- truncation and padding

@pytest.mark.reference
def test_truncation_is_counted_per_call_and_in_total(spm_folder, sp):
    tok = Tokenizer.from_pretrained(spm_folder)
    long_text = "trying to forgive people who hurt me a long time ago at school and at work"
    n = len(sp.encode(long_text)) + 1
    ids, mask, stats = tok.encode_batch_with_stats(["short one", long_text], 8)
    assert stats.truncated_rows == (1,) and stats.truncated == 1 and stats.lengths[1] == n > 8
    assert ids[1].tolist() == sp.encode(long_text)[:7] + [EOS] and mask[1].sum() == 8
    tok.encode_batch([long_text, long_text, "short"], 8)
    assert tok.truncation_count == 3
    _, _, stats = tok.encode_batch_with_stats([long_text], n)  # exactly fits: not truncated
    assert stats.truncated == 0 and tok.truncation_count == 3


@pytest.mark.reference
def test_padding_widths(hf, sp):
    texts = ["trying to forgive people", "x"]
    ids, mask = hf.encode_batch(texts, 10, pad_to=24)
    assert ids.shape == mask.shape == (2, 24) and (ids[mask == 0] == PAD).all()
    ids, mask = hf.encode_batch(texts, 100, pad_to="bucket")
    assert ids.shape == (2, 16) and mask.sum(1).tolist() == [len(p) + 1 for p in sp.encode(texts)]
    ids, mask = hf.encode_batch([], 10)
    assert ids.shape == (0, 10)
    with pytest.raises(ValueError, match="pad_to must be"):
        hf.encode_batch(texts, 10, pad_to=8)
    with pytest.raises(ValueError, match="max_length must be >= 2"):
        hf.encode_batch(texts, 1)


def test_bucket_length():
    assert [bucket_length(n) for n in (0, 1, 16, 17, 100, 512, 513, 1500)] == \
        [16, 16, 16, 32, 128, 512, 1024, 1536]
    assert bucket_length(5, buckets=(4, 8)) == 8
    with pytest.raises(ValueError, match="increasing"):
        bucket_length(5, buckets=(8, 4))


# ---------------------------------------------------------------------------- decoding rules

@pytest.mark.reference
def test_decode_stops_at_eos_and_drops_special_ids(hf, sp):
    pieces = sp.encode("trying to forgive people")
    row = [PAD] + pieces[:2] + [UNK] + pieces[2:] + [EOS] + pieces + [PAD]
    out_of_vocab = pieces + [2000, 32127, PAD]
    ids = np.array([row, out_of_vocab + [PAD] * (len(row) - len(out_of_vocab))])
    assert hf.decode_batch(ids) == ["trying to forgive people"] * 2
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        hf.decode_batch(np.array(pieces))


@pytest.mark.reference
def test_tf_text_decodes_like_hf_on_edge_rows(hf, tf_text, sp):
    pieces = sp.encode("trying to forgive people")
    ids = np.array([[EOS] + pieces + [PAD], pieces + [UNK, 2000], [PAD] * (len(pieces) + 2)])
    assert tf_text.decode_batch(ids) == hf.decode_batch(ids) == ["", "trying to forgive people", ""]


# --------------------------------------------------------------------------------- bad input

@pytest.mark.reference
@pytest.mark.parametrize("backend", ["hf", "tf_text"])
def test_empty_text_is_an_error_naming_its_index(backend, hf, request):
    tok = hf if backend == "hf" else request.getfixturevalue("tf_text")
    with pytest.raises(ValueError, match="text 2 of the batch is empty"):
        tok.encode_batch(["a situation", "another", ""], 16)
    with pytest.raises(ValueError, match="text 1 of the batch is empty"):
        tok.encode_batch(["a situation", " \t "], 16)
    ids, mask = tok.encode_batch(["a situation", ""], 16, allow_empty=True)
    assert ids[1].tolist() == [EOS] + [PAD] * 15 and mask[1].sum() == 1


@pytest.mark.reference
def test_non_text_input_is_a_type_error(hf):
    with pytest.raises(TypeError, match="single string"):
        hf.encode_batch("a situation", 16)
    with pytest.raises(TypeError, match="text 1 of the batch is a int"):
        hf.encode_batch(["a situation", 3], 16)


def test_missing_or_empty_folder_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "no_such_tokenizer"
    with pytest.raises(CheckpointError, match="no_such_tokenizer"):
        Tokenizer.from_pretrained(missing)
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=f"{empty}.*neither tokenizer.json nor spiece.model"):
        Tokenizer.from_pretrained(empty)
    with pytest.raises(CheckpointError, match=f"{empty}: no spiece.model"):
        Tokenizer.from_pretrained(empty, backend="tf_text")
    with pytest.raises(ValueError, match="unknown tokenizer backend 'sp'"):
        Tokenizer.from_pretrained(empty, backend="sp")


def test_a_tokenizer_file_transformers_cannot_read_is_one_line_naming_the_folder(tmp_path):
    require("transformers")
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    with pytest.raises(CheckpointError, match=rf"^{tmp_path}: no tokenizer transformers can read \(KeyError: "):
        Tokenizer.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------ saving

@pytest.mark.reference
def test_save_pretrained_makes_a_self_contained_folder(hf, spm_folder, tmp_path, dev_situations):
    target = hf.save_pretrained(tmp_path / "model_folder")
    assert sorted(os.listdir(target)) == ["spiece.model"]  # no temporary files left behind
    assert (target / "spiece.model").read_bytes() == (spm_folder / "spiece.model").read_bytes()
    reloaded = Tokenizer.from_pretrained(target)
    for a, b in zip(reloaded.encode_batch(dev_situations[:100], MAX_LENGTH),
                    hf.encode_batch(dev_situations[:100], MAX_LENGTH)):
        np.testing.assert_array_equal(a, b)
    hf.save_pretrained(spm_folder)  # saving onto its own folder is a no-op
    assert sorted(os.listdir(spm_folder)) == ["spiece.model"]
