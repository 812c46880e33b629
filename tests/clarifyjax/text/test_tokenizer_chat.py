"""Prompts of decoder-only models (clarifyjax.text.tokenizer.CausalTokenizer): a model's own chat
template gives exactly transformers' `apply_chat_template` ids (one BOS, not two), FastChat's
vicuna_v1.1 gives FastChat's prompt, and a raw prompt is tokenized as `transformers` does by
default (as SaGE's `pipeline` calls send it)."""
from __future__ import annotations

import pytest

from clarifyjax.text.tokenizer import VICUNA_V1_1_SYSTEM, CausalTokenizer
from helpers.env import require, shared_data

pytestmark = pytest.mark.reference

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Is it wrong to lie to a friend?"},
        {"role": "assistant", "content": "Usually."},
        {"role": "user", "content": "And to a stranger?"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    require("transformers")
    require("tokenizers")
    shared_data("delta-clarify/train.tsv")
    from clarifyjax.models import tiny

    with_template = tmp_path_factory.mktemp("chat_tok")
    without = tmp_path_factory.mktemp("plain_tok")
    tiny.tiny_causal_tokenizer(with_template)
    tiny.tiny_causal_tokenizer(without, chat_template=None)
    return with_template, without


def fastchat_vicuna_v1_1(messages) -> str:
    """FastChat's Conversation("vicuna_v1.1").get_prompt(), written from its source
    (fastchat/conversation.py, SeparatorStyle.ADD_COLON_TWO, sep " ", sep2 "</s>") with the
    assistant's turn appended as (ASSISTANT, None), as FastChat's clients do."""
    system = VICUNA_V1_1_SYSTEM
    if messages[0]["role"] == "system":
        system, messages = messages[0]["content"], messages[1:]
    turns = [(("USER", "ASSISTANT")[i % 2], m["content"]) for i, m in enumerate(messages)]
    turns.append(("ASSISTANT", None))
    seps = [" ", "</s>"]
    ret = system + seps[0]
    for i, (role, message) in enumerate(turns):
        ret += role + ": " + message + seps[i % 2] if message else role + ":"
    return ret


def test_the_models_template_gives_transformers_ids_with_one_bos(folders):
    from transformers import AutoTokenizer

    folder, _ = folders
    ours = CausalTokenizer(folder)
    hf = AutoTokenizer.from_pretrained(str(folder))
    expected = hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
    ids = ours.encode(CHAT)
    assert ids == list(expected)
    assert ids[0] == ours.bos_id and ids[1] != ours.bos_id
    # what rendering and then tokenizing with the defaults would have given: two BOS
    naive = hf(ours.render(CHAT))["input_ids"]
    assert naive[:2] == [ours.bos_id, ours.bos_id]


def test_vicuna_v1_1_is_fastchats_prompt(folders):
    from transformers import AutoTokenizer

    folder, _ = folders
    ours = CausalTokenizer(folder)
    for chat in (CHAT, CHAT[1:2], CHAT[1:]):
        text = ours.render(chat, "vicuna_v1.1")
        assert text == fastchat_vicuna_v1_1(chat)
        ids = ours.encode(chat, "vicuna_v1.1")
        assert ids == AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"]
        assert ids.count(ours.bos_id) == 1 and ids[0] == ours.bos_id
    assert ours.render(CHAT[1:2], "vicuna_v1.1") == (
        VICUNA_V1_1_SYSTEM + " USER: Is it wrong to lie to a friend? ASSISTANT:")
    assert "Usually.</s>USER:" in ours.render(CHAT, "vicuna_v1.1")
    with pytest.raises(ValueError, match=r"messages\[1\]\.role"):
        ours.render([CHAT[0], CHAT[2]], "vicuna_v1.1")
    with pytest.raises(ValueError, match="last message must be the user's"):
        ours.render(CHAT[:3], "vicuna_v1.1")


def test_raw_prompts_are_tokenized_as_transformers_does(folders):
    from transformers import AutoTokenizer

    folder, plain = folders
    text = "Answer the following question in one paragraph, be concise.\n# Question\nWhy?"
    for f in (folder, plain):
        ours = CausalTokenizer(f)
        assert ours.encode(text) == AutoTokenizer.from_pretrained(str(f))(text)["input_ids"]
        assert ours.render(text) == text
        assert ours.decode(ours.encode(text)) == text


def test_a_chat_without_a_template_is_a_clear_error(folders):
    _, plain = folders
    ours = CausalTokenizer(plain)
    assert not ours.has_chat_template
    with pytest.raises(ValueError, match="no chat template.*vicuna_v1.1"):
        ours.encode(CHAT)
    assert ours.encode(CHAT[1:2], "vicuna_v1.1")[0] == ours.bos_id
    with pytest.raises(ValueError, match="unknown chat template"):
        ours.encode(CHAT, "chatml")


def test_a_chat_template_that_fails_is_one_line_naming_the_folder(tmp_path):
    require("transformers")
    from clarifyjax.models import tiny

    tiny.tiny_causal_tokenizer(tmp_path, texts=["be kind"] * 20, chat_template="{{ raise_exception('no system') }}")
    with pytest.raises(ValueError, match=rf"^{tmp_path}: its chat template cannot render these messages "
                                         r"\(TemplateError: no system\)$"):
        CausalTokenizer(tmp_path).encode(CHAT)


def test_a_tokenizer_file_transformers_cannot_read_is_one_line_naming_the_folder(tmp_path):
    require("transformers")
    import json

    from clarifyjax.models import tiny
    from clarifyjax.models.safetensors_io import CheckpointError

    tiny.tiny_causal_tokenizer(tmp_path, texts=["be kind"] * 20)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["model"]["type"] = "NoSuchModel"  # the tokenizers library raises a bare Exception for it
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match=rf"^{tmp_path}: no tokenizer transformers can read \(Exception: "):
        CausalTokenizer(tmp_path)
