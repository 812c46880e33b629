"""`clarifyjax.decoding.local_lm.LocalLM` on a tiny random Llama: greedy completions of raw prompts and chats
equal PyTorch `transformers` `generate` on the same folder (ids and text); a row's own
max_new_tokens and stop strings cut where they should, with the right finish reason; sampled
completions repeat with their seed and differ between samples; prompts that cannot be run are
named before anything is generated.

Compiling is most of the time: every LocalLM here runs batches of 4 rows padded to the one prompt
bucket of 64 tokens and 16 new tokens, so the runs without a shared prefix are two programs
(greedy, sampled) and those with the RoT-like template's prefix two more; the 8-device child
compiles only its own four, and its completions are compared with this process's."""
from __future__ import annotations

import pytest

from clarifyjax.text.generator import Sampling, TextGenerator, TokenCounter
from helpers.env import require
from helpers.tiny_models import tiny_llama_folder

pytestmark = pytest.mark.reference

PROMPTS = ["My friend lied", "Is it ok to cheat", [{"role": "user", "content": "Lie?"}]]
MAX_NEW = 12
GREEDY = Sampling(max_new_tokens=MAX_NEW, temperature=0)
SAMPLED = Sampling(max_new_tokens=MAX_NEW, temperature=1.0, top_k=20)
# one batch size and prompt bucket (64: the templated prompts' 45-54 tokens fit) for every LocalLM
SHAPES = dict(batch_size=4, buckets=(64,))
TEMPLATE = "Rule of thumb for each: be kind and honest with your friends, "
TEMPLATED = [TEMPLATE + tail for tail in ("lies", "stealing bread", "a gift", "x")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    require("torch")  # every test here compares with transformers or builds on one that does
    return tiny_llama_folder(tmp_path_factory, seed=3)


@pytest.fixture(scope="module")
def lm(folder):
    from clarifyjax.decoding.local_lm import LocalLM

    return LocalLM(folder, **SHAPES)


@pytest.fixture(scope="module")
def shared(folder):
    """A LocalLM that runs the template every TEMPLATED row shares once per batch."""
    from clarifyjax.decoding.local_lm import LocalLM

    return LocalLM(folder, **SHAPES, shared_prefix=8)


@pytest.fixture(scope="module")
def greedy(lm):
    return lm.complete(PROMPTS, GREEDY)


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
    first = lm.complete(PROMPTS[:2], SAMPLED, n=3, seed=7)
    again = lm.complete(PROMPTS[:2], SAMPLED, n=3, seed=7)
    other = lm.complete(PROMPTS[:2], SAMPLED, n=3, seed=8)
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


def test_a_prefix_every_row_shares_runs_once_with_the_same_completions(folder, shared):
    """Rows that share a long template (the SaGE RoT prompt's few shots) run it once per batch
    (`shared_prefix`): the completions, greedy and sampled with a seed, equal those of the same
    model with the path turned off, and greedy ones equal transformers on the whole prompts."""
    import torch
    import transformers

    from clarifyjax.decoding.local_lm import LocalLM

    prompts = TEMPLATED
    alone = LocalLM(folder, **SHAPES, shared_prefix=0)  # the programs of `lm`
    assert len(shared.encode(prompts[0])) > 40
    for s in (GREEDY, SAMPLED):
        a, b = shared.complete(prompts, s, n=2, seed=7), alone.complete(prompts, s, n=2, seed=7)
        assert [[c.token_ids for c in row] for row in a] == [[c.token_ids for c in row] for row in b]
        for row_a, row_b in zip(a, b):
            for x, y in zip(row_a, row_b):
                assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    for prompt, (completion, _) in zip(prompts, shared.complete(prompts, GREEDY, n=2)):
        ids = torch.tensor([shared.encode(prompt)])
        with torch.no_grad():
            expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                                   do_sample=False)[0, ids.shape[1]:].tolist()
        if shared.tokenizer.eos_id in expected:
            expected = expected[: expected.index(shared.tokenizer.eos_id) + 1]
        assert list(completion.token_ids) == expected


# The 8-device half of the comparison; `folder`, `CALLS` (prompts, sampling, n, seed, whether the
# template's prefix is shared) and the LocalLM arguments come first, from the parent.
SHARDED_LM = """
import jax
from clarifyjax.files.child_result import write_result
from clarifyjax.decoding.local_lm import LocalLM
from clarifyjax.core.sharding import MeshConfig, make_mesh
from clarifyjax.text.generator import Sampling

assert jax.device_count() == 8
mesh = make_mesh(MeshConfig(data=2, fsdp=2, model=2))
plain = LocalLM(folder, mesh=mesh, **SHAPES)
shared = LocalLM(folder, mesh=mesh, **SHAPES, shared_prefix=8)
out = {"completions": []}
for prompts, sampling, n, seed, prefix in CALLS:
    got = (shared if prefix else plain).complete(prompts, Sampling(**sampling), n=n, seed=seed)
    out["completions"].append([[[list(c.token_ids), list(c.logprobs)] for c in row] for row in got])
q = plain.model.layers[0].attention.query[...]
out["query_spec"] = [list(a) if isinstance(a, tuple) else a for a in q.sharding.spec]
write_result(out)
"""


@pytest.mark.child
@pytest.mark.slow  # a child with 8 fake devices compiling four programs
def test_on_a_mesh_of_8_devices_the_completions_equal_one_device(folder, lm, shared):
    """LocalLM(mesh=...): weights sharded (fsdp x model), each batch's rows split over data x fsdp,
    the shared-prefix path included: the same tokens, greedy and sampled with a seed, as this
    (one-device) process's LocalLMs with the same arguments."""
    import dataclasses

    from helpers.children import run_with_fake_devices

    calls = [(prompts, dataclasses.asdict(s), 2, 5, prefix)
             for prompts, prefix in ((PROMPTS[:2], False), (TEMPLATED, True))
             for s in (GREEDY, SAMPLED)]
    header = f"folder = {str(folder)!r}\nSHAPES = {SHAPES!r}\nCALLS = {calls!r}\n"
    r = run_with_fake_devices(header + SHARDED_LM, 8)
    assert any(axis is not None for axis in r["query_spec"]), r  # the weights are sharded
    for (prompts, sampling, n, seed, prefix), eight in zip(calls, r["completions"], strict=True):
        one = (shared if prefix else lm).complete(prompts, Sampling(**sampling), n=n, seed=seed)
        what = (sampling["temperature"], prefix)
        assert [[c.token_ids for c in row] for row in one] == [
            [tuple(ids) for ids, _ in row] for row in eight], what
        diff = max(abs(p - q) for row_one, row_eight in zip(one, eight)
                   for c, (_, logprobs) in zip(row_one, row_eight)
                   for p, q in zip(c.logprobs, logprobs))
        assert diff < 1e-4, (what, diff)
