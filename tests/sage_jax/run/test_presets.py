"""`sage-jax run`'s presets: the example configs load, each preset parses replies as its table row
says (`code` as the reference, bugs included; `paper` and `ours` with the fixes), and a config
resolves to the sampling, BOS and request arguments of its preset, per stage and model: a local
folder whose generation_config.json has no `do_sample` still samples under `code`, as the
reference's `do_sample=True, top_k=10` did."""
from __future__ import annotations

import json

import pytest

from clarifyjax.config.loader import ConfigError, build_root
from helpers.env import REPO_ROOT, require
from sage_jax.run.config import SageRunConfig, load_run_config
from sage_jax.run import presets
from sage_jax.run import prompts


@pytest.mark.parametrize("name", ["run_local.yaml", "run_endpoint.yaml", "run_recorded.yaml"])
def test_the_example_configs_load_and_resolve(name):
    # in sage_jax/presets/: clarifyjax/presets/*.yaml are the training configs that tests/test_config*.py load
    cfg = load_run_config(REPO_ROOT / "sage_jax" / "presets" / name, ["limit=5"])
    assert cfg.models and cfg.limit == 5
    resolved = presets.resolve(cfg)
    assert resolved.score.embedder and resolved.score.bertscore_model  # never null in a report


def test_run_endpoint_writes_rots_with_the_references_vicuna():
    cfg = load_run_config(REPO_ROOT / "sage_jax" / "presets" / "run_endpoint.yaml")
    assert cfg.preset == "code" and cfg.rot.generator.model == "vicuna-13b-v1.3"  # generate_rots.py:11


def test_the_parsers_of_ours_fix_the_references_bugs():
    # first line kept, an "Answer:" prefix stripped; "Answering..." (no colon) no longer crashes
    assert prompts.parse_answer("Answer: Be kind.\nmore") == ("Be kind.", None)
    assert prompts.parse_answer("Answering it: yes") == ("Answering it: yes", None)
    assert prompts.parse_answer("# Title")[1] == "answer starts with '#'"
    assert prompts.parse_answer("use `x`")[1] == "answer holds a backtick"
    assert prompts.parse_answer("  \n")[1] == "empty answer"
    # "Rule of Thumb:" only as a prefix, not inside the rule; a RoT on its second line is kept
    assert prompts.parse_rot("Rule of Thumb: It is good to help.\nx") == ("It is good to help.", None)
    assert prompts.parse_rot("Follow the Rule of Thumb: be fair.") == ("Follow the Rule of Thumb: be fair.", None)
    assert prompts.parse_rot("\nBe fair.") == ("Be fair.", None)
    assert prompts.parse_rot("RoT:   ")[1] == "empty rule of thumb"
    # a chat reply is kept whole (get_gpt_response: content.strip())
    assert prompts.parse_chat_answer("  One paragraph.\nTwo lines.  ") == ("One paragraph.\nTwo lines.", None)


def test_the_reference_parsers_keep_the_references_behaviour():
    # model_output.py:64-82: "answer..." cut after the first colon; no colon: kept (the crash fixed)
    assert prompts.parse_answer("Answering it: yes\nno", reference=True) == ("yes", None)
    assert prompts.parse_answer("Answering this needs care.", reference=True) == ("Answering this needs care.", None)
    assert prompts.parse_answer("Yes, always. \nmore", reference=True) == ("Yes, always. ", None)  # not stripped
    # generate_rots.py:58-64: the first line as it is (a leading newline: empty, sampled again)
    assert prompts.parse_rot("\nBe fair.", reference=True)[1] == "empty rule of thumb"
    assert prompts.parse_rot("Follow the Rule of Thumb: be fair.", reference=True) == ("Follow the  be fair.", None)


def test_the_reference_paraphrase_filter_keeps_copies_and_mid_line_numbers():
    from sage_jax import parascore

    real = parascore.parascore
    parascore.parascore = lambda candidates, *a, **k: [0.9] * len(candidates)
    try:
        text = "1. Is it wrong?\nIn 2. Imagine a world\n3) Is it bad?\n4. Is it wrong?"
        ours = parascore.filter_paraphrases("Is it wrong?", text, model=None)
        ref = parascore.filter_paraphrases("Is it wrong?", text, model=None, reference=True)
    finally:
        parascore.parascore = real
    assert [p.text for p in ours.kept] == ["Is it bad?"]  # anchored, "1)" read, copies of the question dropped
    assert [p.text for p in ref.kept] == ["Is it wrong?", "Imagine a world", "Is it wrong?"]


def test_the_presets_thresholds_and_prompts():
    code, paper, ours = (presets.PRESETS[n] for n in ("code", "paper", "ours"))
    assert prompts.passes(0.6, code.parascore_threshold, code.parascore_inclusive)
    assert not prompts.passes(0.8, paper.parascore_threshold, paper.parascore_inclusive)
    assert prompts.passes(0.8001, paper.parascore_threshold, paper.parascore_inclusive)
    # the paper's one-shot prompt (section 3.1) as it prints it, its example the code's twenty
    one_shot = prompts.paraphrase_prompt(paper.paraphrase_template, "Is it wrong to lie?")
    assert one_shot.startswith("Instruction: Your task is to generate multiple paraphrased sentences. Do not "
                               "change the meaning of the text and be concise.\n\nSentence: What would society")
    assert one_shot.endswith("\n\nSentence: Is it wrong to lie?\n\nParaphrases:\n")
    assert one_shot.count("Sentence: ") == 2 and one_shot.count("\n20. ") == 1 and "# Context" not in one_shot
    assert code.paraphrase_template.count("\n20. ") == 1 and ours.paraphrase_template == code.paraphrase_template
    assert prompts.answer_prompt("Q?", True, ours.chat_system)[0]["content"] == "You are a helpful assistant."
    assert prompts.answer_prompt("Q?", chat=True)[1]["content"].endswith("Question: Q?")
    assert SageRunConfig().preset == "ours"


def _cfg(tmp_path, preset: str, generator: dict, chat: bool = False, **sampling) -> SageRunConfig:
    return build_root(SageRunConfig, {
        "questions": "q.csv", "out": str(tmp_path / "out"), "preset": preset,
        "paraphrase": {"generator": generator}, "rot": {"generator": generator},
        "models": [{"name": "m", "chat": chat, "generator": generator, "sampling": sampling}]})


@pytest.mark.parametrize("file", [{}, {"temperature": 0.7, "top_p": 0.9}])
def test_a_local_folder_without_do_sample_resolves_to_sampling(tmp_path, file):
    """transformers' generate(do_sample=True, top_k=10) takes temperature and top-p from the
    model's generation_config.json, else 1.0, whatever its do_sample says; ours states 1.0."""
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, **file}))
    local = {"kind": "local", "model": str(folder)}
    code = presets.resolve(_cfg(tmp_path, "code", local))
    want = (file.get("temperature", 1.0), 10, file.get("top_p", 1.0))
    for s in (code.paraphrase.sampling, code.models[0].sampling, code.rot.sampling):
        assert (s.temperature, s.top_k, s.top_p) == want
    assert code.paraphrase.sampling.max_total_tokens == 1024 and code.paraphrase.sampling.max_new_tokens is None
    assert (code.models[0].sampling.max_new_tokens, code.rot.sampling.max_new_tokens) == (256, 128)
    assert code.models[0].generator.bos is False  # the 2023 pipeline: add_special_tokens=False
    ours = presets.resolve(_cfg(tmp_path, "ours", local))
    s = ours.models[0].sampling
    assert (s.temperature, s.top_k, s.top_p, ours.paraphrase.sampling.max_new_tokens) == (1.0, 10, 1.0, 512)
    assert ours.models[0].generator.bos is True


def test_an_endpoint_samples_at_the_generation_config_its_config_names(tmp_path):
    """An endpoint model (api completions) under code takes temperature and top-p from the
    generation_config.json of `generator.generation_config`, as transformers would the local model;
    without one, 1.0 and 1.0; ours states 1.0 whatever the file says."""
    folder = tmp_path / "vicuna"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.9, "top_p": 0.6}))
    endpoint = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "vicuna"}
    code = presets.resolve(_cfg(tmp_path, "code", {**endpoint, "generation_config": str(folder)}))
    for s in (code.paraphrase.sampling, code.models[0].sampling, code.rot.sampling):
        assert (s.temperature, s.top_k, s.top_p) == (0.9, 10, 0.6)
    bare = presets.resolve(_cfg(tmp_path, "code", endpoint)).models[0].sampling
    assert (bare.temperature, bare.top_p) == (1.0, 1.0)
    ours = presets.resolve(_cfg(tmp_path, "ours", {**endpoint, "generation_config": str(folder)}))
    assert (ours.models[0].sampling.temperature, ours.models[0].sampling.top_p) == (1.0, 1.0)
    said = presets.resolve(_cfg(tmp_path, "code", {**endpoint, "generation_config": str(folder)}, temperature=0.5))
    assert (said.models[0].sampling.temperature, said.models[0].sampling.top_p) == (0.5, 0.6)
    with pytest.raises(ConfigError, match=r"generator\.generation_config: .*missing: not a folder"):
        _cfg(tmp_path, "code", {**endpoint, "generation_config": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match=r"generation_config: only for an openai generator with api completions"):
        _cfg(tmp_path, "code", {**endpoint, "api": "chat", "generation_config": str(folder)})


def test_a_chat_target_is_sent_what_the_reference_sent(tmp_path):
    chat = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "gpt", "api": "chat"}
    code = presets.resolve(_cfg(tmp_path, "code", chat, chat=True)).models[0]
    assert code.generator.accepts == ("temperature",)
    assert (code.sampling.temperature, code.sampling.max_new_tokens, code.sampling.top_k) == (0.8, None, None)
    ours = presets.resolve(_cfg(tmp_path, "ours", chat, chat=True)).models[0]
    assert ours.generator.accepts == ("max_tokens", "temperature", "seed")
    assert (ours.sampling.temperature, ours.sampling.max_new_tokens) == (0.8, 256)
    # a setting the endpoint does not accept is refused up front, naming it
    with pytest.raises(ConfigError, match=r"models\[0\]\.sampling\.top_k: the endpoint does not accept top_k"):
        presets.resolve(_cfg(tmp_path, "ours", chat, chat=True, top_k=5))
    with pytest.raises(ConfigError, match="accepts: 'top_q' is not a request argument"):
        _cfg(tmp_path, "ours", {**chat, "accepts": ["top_q"]})


def test_scoring_models_name_the_presets_and_a_missing_one_says_how_to_fix_it(tmp_path):
    chat = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "gpt", "api": "chat"}
    code = presets.resolve(_cfg(tmp_path, "code", chat)).score
    assert (code.embedder, code.bertscore_model, code.bertscore_layer) == (
        "sentence-transformers/stsb-distilroberta-base-v2", "bert-base-uncased", 9)
    ours = presets.resolve(_cfg(tmp_path, "ours", chat)).score
    assert (ours.embedder, ours.bertscore_model, ours.bertscore_layer) == ("all-MiniLM-L6-v2",) * 2 + (None,)
    with pytest.raises(ConfigError, match="score.embedder: no/such/model is neither a folder nor in the local"):
        presets.model_folder("no/such/model", "score.embedder")


@pytest.mark.reference
def test_raw_prompts_without_bos_under_code(tmp_path):
    require("torch")
    from clarifyjax.decoding.local_lm import LocalLM
    from clarifyjax.models.tiny import tiny_llama_folder

    folder = tiny_llama_folder(tmp_path)
    with_bos, without = LocalLM(folder), LocalLM(folder, raw_bos=False)
    assert with_bos.encode("Is it wrong?")[0] == 1 and without.encode("Is it wrong?")[0] != 1
    assert with_bos.encode("Is it wrong?")[1:] == without.encode("Is it wrong?")
    chat = [{"role": "user", "content": "hi"}]
    assert with_bos.encode(chat) == without.encode(chat)  # a chat template writes its own BOS
