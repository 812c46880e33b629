"""`clarifyjax.decoding.local_lm.LocalLM` on a tiny random Llama: greedy completions of raw prompts and chats
equal PyTorch `transformers` `generate` on the same folder (ids and text); a row's own
max_new_tokens and stop strings cut where they should, with the right finish reason; sampled
completions repeat with their seed and differ between samples; prompts that cannot be run are
named before anything is generated."""
from __future__ import annotations

import pytest

from clarifyjax.text.generator import Sampling, TextGenerator, TokenCounter
from conftest import require
from helpers.tiny_models import tiny_llama_folder

PROMPTS = ["My friend lied", "Is it ok to cheat", [{"role": "user", "content": "Lie?"}]]
MAX_NEW = 12


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    require("torch")
    from clarifyjax.decoding.local_lm import LocalLM

    # one prompt bucket: every call below runs one of two programs (greedy, sampled)
    return LocalLM(tiny_llama_folder(tmp_path_factory, seed=3), batch_size=4, buckets=(32,))


@pytest.fixture(scope="module")
def greedy(lm):
    return lm.complete(PROMPTS, Sampling(max_new_tokens=MAX_NEW, temperature=0))


def test_greedy_completions_equal_transformers_generate(lm, greedy):
    import torch
    import transformers

    assert isinstance(lm, TextGenerator) and isinstance(lm, TokenCounter)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(lm.folder)).eval()
    for prompt, (completion,) in zip(PROMPTS, greedy):
        ids = torch.tensor([lm.encode(prompt)])
        with torch.no_grad():
            expected = hf.generate(ids, attention_mask=torch.ones_like(ids),
                                   max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1]:]
        expected = expected.tolist()
        if lm.tokenizer.eos_id in expected:  # transformers pads after EOS; we stop there
            expected = expected[: expected.index(lm.tokenizer.eos_id) + 1]
        assert list(completion.token_ids) == expected
        assert completion.text == lm.tokenizer.decode(expected)
        assert completion.finish_reason == ("stop" if expected[-1] == lm.tokenizer.eos_id
                                            else "length")
        assert len(completion.logprobs) == len(expected) and max(completion.logprobs) <= 0


def test_max_new_tokens_and_stop_strings_cut_each_row(lm, greedy):
    full = greedy[0][0]
    assert len(full.token_ids) == MAX_NEW and full.finish_reason == "length", \
        "the tiny model should not end this prompt early"
    # a piece from the middle of the text, not one token (which would compile a program that
    # also stops at it)
    middle = full.text[len(full.text) // 2:]
    stop = next(middle[i:i + 3] for i in range(len(middle) - 2)
                if lm._stop_ids((middle[i:i + 3],)) == lm.eos_ids)
    short, cut = lm.complete(PROMPTS[:1] * 2, [Sampling(max_new_tokens=5, temperature=0),
                                               Sampling(max_new_tokens=MAX_NEW, temperature=0,
                                                        stop=(stop,))])
    assert short[0].token_ids == full.token_ids[:5] and short[0].finish_reason == "length"
    assert cut[0].text == full.text[: full.text.index(stop)] and cut[0].finish_reason == "stop"
    assert cut[0].token_ids == full.token_ids[: len(cut[0].token_ids)]
    assert lm.tokenizer.decode(cut[0].token_ids) == cut[0].text[: len(
        lm.tokenizer.decode(cut[0].token_ids))]


def test_sampled_completions_repeat_with_their_seed(lm):
    sampling = Sampling(max_new_tokens=MAX_NEW, temperature=1.0, top_k=20)
    first = lm.complete(PROMPTS[:2], sampling, n=3, seed=7)
    again = lm.complete(PROMPTS[:2], sampling, n=3, seed=7)
    other = lm.complete(PROMPTS[:2], sampling, n=3, seed=8)
    ids = [[c.token_ids for c in row] for row in first]
    assert ids == [[c.token_ids for c in row] for row in again]
    assert ids != [[c.token_ids for c in row] for row in other]
    assert all(len(set(row)) > 1 for row in ids)


def test_prompts_that_cannot_run_are_named(lm):
    with pytest.raises(ValueError, match=r"prompt 1: .* context length of 128"):
        lm.complete(["fine", "lie " * 200], Sampling(max_new_tokens=4))
    with pytest.raises(ValueError, match=r"prompt 0: .*vicuna_v1.1 expects 'user'"):
        lm.chat_template = "vicuna_v1.1"
        try:
            lm.complete([[{"role": "assistant", "content": "x"}]], Sampling(max_new_tokens=4))
        finally:
            lm.chat_template = "model"


def test_a_prefix_every_row_shares_runs_once_with_the_same_completions(tmp_path_factory):
    """Rows that share a long template (the SaGE RoT prompt's few shots) run it once per batch
    (`shared_prefix`): the completions, greedy and sampled with a seed, equal those of the same
    model with the path turned off, and greedy ones equal transformers on the whole prompts."""
    import torch
    import transformers

    from clarifyjax.decoding.local_lm import LocalLM

    folder = tiny_llama_folder(tmp_path_factory, seed=3)
    template = "Rule of thumb for each: " + "be kind and honest with your friends, " * 3
    prompts = [template + tail for tail in ("lies", "stealing bread", "a gift", "x")]
    shared = LocalLM(folder, batch_size=4, buckets=(32,), shared_prefix=8)
    alone = LocalLM(folder, batch_size=4, buckets=(32,), shared_prefix=0)
    assert len(shared.encode(prompts[0])) > 40
    greedy = Sampling(max_new_tokens=MAX_NEW, temperature=0)
    sampled = Sampling(max_new_tokens=MAX_NEW, temperature=1.0, top_k=20)
    for s in (greedy, sampled):
        a, b = shared.complete(prompts, s, n=2, seed=7), alone.complete(prompts, s, n=2, seed=7)
        assert [[c.token_ids for c in row] for row in a] == [[c.token_ids for c in row] for row in b]
        for row_a, row_b in zip(a, b):
            for x, y in zip(row_a, row_b):
                assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    for prompt, (completion, _) in zip(prompts, shared.complete(prompts, greedy, n=2)):
        ids = torch.tensor([shared.encode(prompt)])
        with torch.no_grad():
            expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                                   do_sample=False)[0, ids.shape[1]:].tolist()
        if shared.tokenizer.eos_id in expected:
            expected = expected[: expected.index(shared.tokenizer.eos_id) + 1]
        assert list(completion.token_ids) == expected


SHARDED_LM = """
import tempfile
import jax
from clarifyjax.files.child_result import write_result
from clarifyjax.decoding.local_lm import LocalLM
from clarifyjax.models.tiny import tiny_llama_folder
from clarifyjax.core.sharding import MeshConfig, make_mesh
from clarifyjax.text.generator import Sampling

assert jax.device_count() == 8
folder = tiny_llama_folder(tempfile.mkdtemp(), seed=3)
mesh = make_mesh(MeshConfig(data=2, fsdp=2, model=2))
template = "Rule of thumb for each: " + "be kind and honest with your friends, " * 2
prompts = [template + t for t in ("lies", "stealing bread", "a gift")] + ["My friend lied", "Cheat?"]
one, eight = LocalLM(folder, batch_size=8), LocalLM(folder, batch_size=8, mesh=mesh)
out = {}
for name, s in (("greedy", Sampling(max_new_tokens=8, temperature=0)),
                ("sampled", Sampling(max_new_tokens=8, temperature=1.0, top_k=20))):
    a, b = one.complete(prompts, s, n=2, seed=5), eight.complete(prompts, s, n=2, seed=5)
    out[name] = [[list(x.token_ids) == list(y.token_ids) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]
    out[name + "_logprob_diff"] = max(abs(p - q) for ra, rb in zip(a, b) for x, y in zip(ra, rb)
                                      for p, q in zip(x.logprobs, y.logprobs))
q = eight.model.layers[0].attention.query[...]
out["query_spec"] = [list(a) if isinstance(a, tuple) else a for a in q.sharding.spec]
write_result(out)
"""


@pytest.mark.slow  # a child with 8 fake devices compiling four programs
def test_on_a_mesh_of_8_devices_the_completions_equal_one_device():
    """LocalLM(mesh=...): weights sharded (fsdp x model), each batch's rows split over data x fsdp,
    the shared-prefix path included: the same tokens, greedy and sampled with a seed."""
    require("torch")
    from helpers.children import run_with_fake_devices

    r = run_with_fake_devices(SHARDED_LM, 8)
    assert any(axis is not None for axis in r["query_spec"]), r  # the weights are sharded
    for name in ("greedy", "sampled"):
        assert all(all(row) for row in r[name]), r
        assert r[name + "_logprob_diff"] < 1e-4, r
