"""Tiny random Hugging Face model folders with tokenizers trained in-process, for tests, benchmarks
and the demo: `tiny_spm_folder`, `tiny_t5_folder`, `tiny_classifier_folder`, `tiny_nli_folder`,
`tiny_deberta_classifier_folder`, `train_spm_model`. Each builder takes `root` (pytest's
`tmp_path_factory` or a directory), caches its folder per root and arguments, and returns one
that both `clarifyjax` loaders and transformers' `from_pretrained` read.

    folder = tiny_t5_folder(tmp_path_factory, family="v1.0", seed=1)"""
from __future__ import annotations

import csv
import hashlib
import io
import math
import shutil
from pathlib import Path
from collections.abc import Iterable, Sequence
import argparse

from clarifyjax.files.tables import DATA_ENV, DATA_OPTION, DataError, data_dir

PAD, EOS, UNK = 0, 1, 2
WANLI_LABELS = ("contradiction", "entailment", "neutral")  # roberta-large-wanli's id order
TINY_T5 = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=32,
               dropout_rate=0.0)
T5_FAMILIES = {
    "v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}
DELPHI_TARGETS = (("1", "it's good"), ("0", "it's okay"), ("-1", "it's bad"))

_CACHE: dict[tuple, Path] = {}


def _new_dir(root, name: str) -> Path:
    if hasattr(root, "mktemp"):  # pytest's TempPathFactory
        return Path(root.mktemp(name))
    folder = Path(root) / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _cached(kind: str, root, key: tuple, build) -> Path:
    base = root.getbasetemp() if hasattr(root, "getbasetemp") else Path(root)
    full_key = (kind, str(base)) + key
    if full_key not in _CACHE or not _CACHE[full_key].exists():
        _CACHE[full_key] = build()
    return _CACHE[full_key]


def shared_data_dir() -> Path:
    """The data folder (`clarifyjax.files.tables.data_dir`: ``$CLARIFYJAX_DATA``, else ../shared/data
    beside a checkout), holding delta-clarify/ and sage-mcc/."""
    folder = data_dir()
    if folder is None:
        raise DataError(f"no data folder: name the folder holding delta-clarify/ with {DATA_OPTION} or {DATA_ENV}")
    return folder


def tiny_corpus(n_rows: int | None = 3000) -> list[str]:
    """Situations and questions of the first `n_rows` rows (None: all) of δ-CLARIFY train.tsv."""
    path = shared_data_dir() / "delta-clarify" / "train.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the tiny tokenizers are trained on it (set "
                                f"{DATA_ENV} to the folder holding delta-clarify/)")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:n_rows]
    return [t for r in rows for t in (r["situation"], r["question"]) if t and t.strip()]


# --------------------------------------------------------------------------- SentencePiece


def train_spm_model(texts: Iterable[str], vocab_size: int, *, minus_one: bool = True,
                    **options) -> bytes:
    """A serialized SentencePiece unigram model with T5's pad/eos/unk = 0/1/2 and no bos, trained
    on `texts`; with `minus_one`, "-1" (Delphi's "bad" class) is added as one piece if training
    did not make it one. `options` go to `SentencePieceTrainer.train` (num_threads, ...)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buffer, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, pad_id=PAD, eos_id=EOS, unk_id=UNK,
        bos_id=-1, minloglevel=2, **options)
    proto = model_pb2.ModelProto()
    proto.ParseFromString(buffer.getvalue())
    if minus_one and not any(p.piece == "-1" for p in proto.pieces):
        piece = proto.pieces.add()
        piece.piece, piece.score = "-1", 0.0  # likelier than any learned piece
        piece.type = model_pb2.ModelProto.SentencePiece.NORMAL
    return proto.SerializeToString()


# Like T5's vocabulary this one has no "<", so Delphi's class prefix "<class>" tokenizes as
# `▁ <unk> class >` (Delphi reads the class at decoder step 4), and "1", "0" and "-1" are single
# pieces ("-1" is added as an ordinary piece so that both tokenizer backends agree; `minus_one=False`
# leaves it out: a judge vocabulary that lacks a class token).
def tiny_spm_folder(root, *, vocab_size: int = 600, minus_one: bool = True) -> Path:
    """A folder with `spiece.model` (vocabulary `vocab_size`, + 1 with `minus_one`)."""

    def build() -> Path:
        # Delphi's targets without "<", so that "<" stays out of the vocabulary as in T5's.
        targets = [f"class>{c}/class> text>{t}/text>" for c, t in DELPHI_TARGETS] * 100
        model = train_spm_model(tiny_corpus(3000 if vocab_size <= 1000 else None) + targets,
                                vocab_size, minus_one=minus_one, num_threads=1)
        folder = _new_dir(root, f"spm{vocab_size}{'' if minus_one else '_no_minus_one'}")
        (folder / "spiece.model").write_bytes(model)
        return folder

    return _cached("spm", root, (vocab_size, minus_one), build)


def spm_vocab_size(folder: Path) -> int:
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(
        model_file=str(Path(folder) / "spiece.model")).get_piece_size()


# --------------------------------------------------------------------------- T5


def tiny_t5_config(family: str = "v1.0", *, vocab_size: int, **overrides):
    import transformers

    if family not in T5_FAMILIES:
        raise ValueError(f"unknown T5 family {family!r}; expected one of {sorted(T5_FAMILIES)}")
    values = {**TINY_T5, **T5_FAMILIES[family], "vocab_size": vocab_size, "pad_token_id": PAD,
              "eos_token_id": EOS, "decoder_start_token_id": PAD, **overrides}
    return transformers.T5Config(**values)


def save_t5_folder(folder: Path, config, seed: int, spm_folder: Path):
    """A random torch T5 of `config` saved (safetensors) into `folder` with the tokenizer."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(config).eval()
    if not config.tie_word_embeddings:  # a real v1.1 checkpoint has its own lm_head
        with torch.no_grad():
            model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape))
    model.save_pretrained(str(folder), safe_serialization=True)
    shutil.copy(Path(spm_folder) / "spiece.model", Path(folder) / "spiece.model")
    return model


# v1.0: relu, tied; v1.1: gated-gelu, own lm_head. With Hugging Face's init a tiny model writes the
# same tokens (or nothing) whatever the input; pass `initializer_factor=3.0` for outputs that depend
# on the input (and more peaked distributions).
def tiny_t5_folder(root, *, family: str = "v1.0", seed: int = 0, spm_pieces: int = 600,
                   minus_one: bool = True, **overrides) -> Path:
    """A random tiny T5 folder (config.json, model.safetensors, spiece.model).

    The model's vocabulary is the tokenizer's rounded up to a multiple of 8 (as t5's 32128 over
    32100 pieces); `overrides` are `transformers.T5Config` fields.
    """

    def build() -> Path:
        spm = tiny_spm_folder(root, vocab_size=spm_pieces, minus_one=minus_one)
        vocab = 8 * math.ceil(spm_vocab_size(spm) / 8)
        config = tiny_t5_config(family, vocab_size=vocab, **overrides)
        folder = _new_dir(root, f"t5_{family}_seed{seed}_{len(_CACHE)}")
        save_t5_folder(folder, config, seed, spm)
        return folder

    key = (family, seed, spm_pieces, minus_one, tuple(sorted(overrides.items())))
    return _cached("t5", root, key, build)


# --------------------------------------------------------------------------- classifiers


def tiny_bpe_tokenizer(model_type: str = "roberta", vocab_size: int = 400):
    """A byte-level BPE `tokenizers.Tokenizer` trained on the corpus, with the family's specials
    (RoBERTa: <s>=0 <pad>=1 </s>=2 <unk>=3; BERT: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3) and pair
    template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if model_type == "roberta":
        specials = ["<s>", "<pad>", "</s>", "<unk>"]
        bos, eos = "<s>", "</s>"
        pair, single = "<s> $A </s> </s> $B </s>", "<s> $A </s>"
    elif model_type == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        bos, eos = "[CLS]", "[SEP]"
        pair, single = "[CLS] $A [SEP] $B:1 [SEP]:1", "[CLS] $A [SEP]"
    else:
        raise ValueError(f"unknown encoder family {model_type!r}; expected roberta or bert")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(tiny_corpus(1000), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair,
        special_tokens=[(t, tokenizer.token_to_id(t)) for t in (bos, eos)])
    return tokenizer


def random_classifier(labels: Sequence[str], *, model_type: str, seed: int, vocab_size: int,
                      hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
                      intermediate_size: int = 64, max_position_embeddings: int = 130,
                      weight_std: float | None = 0.2):
    """A random torch `RobertaForSequenceClassification` (or BERT, `model_type="bert"`) with
    `labels` (id order), in eval mode; weights redrawn with std `weight_std` (None: Hugging
    Face's init)."""
    import torch
    import transformers

    id2label = dict(enumerate(labels))
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=num_heads,
                  intermediate_size=intermediate_size,
                  max_position_embeddings=max_position_embeddings,
                  id2label=id2label, label2id={v: k for k, v in id2label.items()})
    torch.manual_seed(seed)
    if model_type == "roberta":
        config = transformers.RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                            type_vocab_size=1, **common)
        model = transformers.RobertaForSequenceClassification(config)
    else:
        config = transformers.BertConfig(pad_token_id=0, type_vocab_size=2, **common)
        model = transformers.BertForSequenceClassification(config)
    if weight_std is not None:  # the default 0.02 init gives near-uniform outputs
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=gen) * weight_std
                p.copy_(1.0 + noise if "LayerNorm.weight" in name else noise)
    return model.eval()


def save_classifier_folder(folder: Path, labels: Sequence[str], *, model_type: str, seed: int,
                           tokenizer=None, **sizes):
    """`random_classifier` saved into `folder` with its tokenizer.json (default: a BPE trained
    here); returns the torch model. `sizes` go to `random_classifier`."""
    tokenizer = tokenizer or tiny_bpe_tokenizer(model_type)
    model = random_classifier(labels, model_type=model_type, seed=seed,
                              vocab_size=tokenizer.get_vocab_size(), **sizes)
    model.save_pretrained(str(folder))
    tokenizer.save(str(Path(folder) / "tokenizer.json"))
    return model


# Weights redrawn with std 0.2 (outputs far from uniform); a byte-level BPE tokenizer.json trained
# here, with RoBERTa's pair template.
def tiny_classifier_folder(root, labels: Sequence[str] = ("bad", "ok", "good"), *,
                           model_type: str = "roberta", seed: int = 0) -> Path:
    """A random tiny sequence classifier folder (config.json with id2label = labels,
    model.safetensors, tokenizer.json)."""
    labels = tuple(labels)

    def build() -> Path:
        folder = _new_dir(root, f"{model_type}_{'_'.join(labels)}_seed{seed}")
        save_classifier_folder(folder, labels, model_type=model_type, seed=seed)
        return folder

    return _cached("classifier", root, (labels, model_type, seed), build)


def tiny_nli_folder(root, labels: Sequence[str] = WANLI_LABELS, *, model_type: str = "roberta",
                    seed: int = 0) -> Path:
    """`tiny_classifier_folder` with roberta-large-wanli's labels by default."""
    return tiny_classifier_folder(root, labels, model_type=model_type, seed=seed)


_DISCRIMINATOR_LABELS = ("irrelevant", "relevant")  # the discriminator's class ids 0, 1
# A DeBERTa-v3-like architecture (shared attention keys, log-bucketed relative positions, no
# absolute positions, no token types), tiny.
TINY_DEBERTA_V3 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=256, relative_attention=True,
                       pos_att_type=["p2c", "c2p"], share_att_key=True,
                       position_biased_input=False, max_relative_positions=64,
                       position_buckets=16, norm_rel_ebd="layer_norm", type_vocab_size=0,
                       pad_token_id=0)


def save_deberta_classifier_folder(folder: Path, labels: Sequence[str] = _DISCRIMINATOR_LABELS,
                                   *, seed: int = 0, **overrides):
    """A random torch `DebertaV2ForSequenceClassification` (`TINY_DEBERTA_V3` updated with
    `overrides`, Hugging Face's init) saved into `folder` with a BPE tokenizer.json trained here
    (BERT-style specials and pair template: [CLS] a [SEP] b [SEP]); returns the torch model."""
    import torch
    import transformers

    tokenizer = tiny_bpe_tokenizer("bert")
    id2label = dict(enumerate(labels))
    config = transformers.DebertaV2Config(
        vocab_size=tokenizer.get_vocab_size(), id2label=id2label,
        label2id={v: k for k, v in id2label.items()}, **{**TINY_DEBERTA_V3, **overrides})
    torch.manual_seed(seed)
    model = transformers.DebertaV2ForSequenceClassification(config).eval()
    model.save_pretrained(str(folder))
    tokenizer.save(str(Path(folder) / "tokenizer.json"))
    return model


def tiny_deberta_classifier_folder(root, labels: Sequence[str] = _DISCRIMINATOR_LABELS, *,
                                   seed: int = 0) -> Path:
    """A random tiny DeBERTa-v3-like sequence classifier folder (config.json with id2label =
    labels, model.safetensors, tokenizer.json): the tiny discriminator's starting point
    (clarifyjax/presets/sft_discriminator_tiny.yaml; `python -m clarifyjax.models.tiny DIR` writes one)."""
    labels = tuple(labels)

    def build() -> Path:
        folder = _new_dir(root, f"deberta_{'_'.join(labels)}_seed{seed}")
        save_deberta_classifier_folder(folder, labels, seed=seed)
        return folder

    return _cached("deberta_classifier", root, (labels, seed), build)


# --------------------------------------------------------------------------- causal LMs

# A Llama-2-chat-like template that writes its own BOS, as most models' templates do.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<<SYS>> ' + message['content'] + ' <</SYS>> ' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}")


def tiny_causal_tokenizer(folder: Path, *, vocab_size: int = 300,
                          chat_template: str | None = TINY_CHAT_TEMPLATE,
                          texts: Sequence[str] | None = None):
    """A byte-level BPE trained on `texts` (None: the first 1000 rows of the corpus) with Llama's
    specials (<unk>=0 <s>=1 </s>=2), BOS added to every text, saved into `folder` as
    transformers' fast tokenizer; returns it. vocab_size 300 splits English into ~1.3
    characters a token; a few thousand, trained on enough text, give a real model's ~3-4."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    texts = tiny_corpus(1000) if texts is None else texts
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))
    return fast


def tiny_llama_folder(root, *, seed: int = 0, chat_template: str | None = TINY_CHAT_TEMPLATE,
                      generation: dict | None = None, tokenizer: dict | None = None,
                      **overrides) -> Path:
    """A random tiny `LlamaForCausalLM` folder (config.json, model.safetensors,
    generation_config.json, the tokenizer of `tiny_causal_tokenizer`). Weights are redrawn with
    std 0.2, so that the next token depends on the prompt; `generation` sets
    generation_config.json fields (do_sample, temperature, top_k, top_p); `tokenizer` is passed
    to `tiny_causal_tokenizer` (vocab_size, texts)."""

    def build() -> Path:
        import torch
        import transformers

        folder = _new_dir(root, f"llama_seed{seed}_{len(_CACHE)}")
        tok = tiny_causal_tokenizer(folder, chat_template=chat_template, **(tokenizer or {}))
        config = transformers.LlamaConfig(**{
            "vocab_size": len(tok), "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 128, "bos_token_id": 1,
            "eos_token_id": 2, "tie_word_embeddings": False, **overrides})
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.copy_(torch.randn(p.shape) * 0.2)
        model.generation_config = transformers.GenerationConfig(
            bos_token_id=1, eos_token_id=2, **(generation or {}))
        model.save_pretrained(str(folder), safe_serialization=True)
        return folder

    key = (seed, chat_template, tuple(sorted((generation or {}).items())),
           hashlib.sha256(repr(sorted((tokenizer or {}).items())).encode()).hexdigest(),
           tuple(sorted(overrides.items())))
    return _cached("llama", root, key, build)


def main(argv: list[str] | None = None) -> int:
    """``python -m clarifyjax.models.tiny [DIR]``: the tiny discriminator's starting folder
    (sft_discriminator_tiny.yaml). Options are parsed as options (``--help`` is help, not a
    folder); a DIR that is a file, or a folder holding other files, is refused."""
    p = argparse.ArgumentParser(prog="python -m clarifyjax.models.tiny",
                                description="Write the tiny random DeBERTa-v3 classifier folder "
                                            "that clarifyjax/presets/sft_discriminator_tiny.yaml starts from.")
    p.add_argument("folder", nargs="?", default="runs/deberta_tiny_discriminator",
                   metavar="DIR", help="the folder to write (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.folder.strip():
        p.error("DIR: empty; give a folder")
    target = Path(args.folder)
    if target.exists() and not target.is_dir():
        p.error(f"DIR {target}: is a file, not a folder")
    known = {"config.json", "model.safetensors", "spm.model", "tokenizer_config.json",
             "special_tokens_map.json", "tokenizer.json", "added_tokens.json"}
    others = sorted(f.name for f in target.iterdir() if f.name not in known) if target.is_dir() else []
    if others:
        p.error(f"DIR {target}: holds {others[:3]}, which are not a tiny classifier's files; "
                "give a new or empty folder")
    target.mkdir(parents=True, exist_ok=True)
    save_deberta_classifier_folder(target)
    print(f"tiny DeBERTa classifier: {target}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
