"""Causal LMs on a (data=2, fsdp=2, model=2) mesh of 8 fake CPU devices equal the one-device
model: logits, `score` and greedy `generate` (the KV cache and the while_loop on the mesh), also
with a shared `prefix_ids` run once for the batch.

`load_causal_lm(..., mesh=, rules=FSDP_RULES)` builds every parameter with
make_array_from_callback; a spy on the checkpoint reader shows that every 2-D tensor is read
block by block (Falcon's fused query_key_value included), and no device holds a whole weight
of a sharded parameter. Tolerance 1e-5 (measured ~1e-6); greedy tokens identical.

The torch models are made here, and the one-device runs are this process's (the child imports no
torch and compiles only the mesh's programs): their shapes are test_causal_lm_parity's, whose
cases include these two models, so in a whole run whichever file comes second loads them from
the compile cache; the prompts with the prefix fit the 16-token bucket of the prompts alone, so
the one-device runs on the whole prompts are one program with those on the prompts alone.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
from flax import nnx

from helpers.causal_lm_builders import MAX_NEW, batches, right_padded
from helpers.children import run_with_fake_devices

from clarifyjax.models.causal_lm import CausalLM, CausalLMConfig

CASES = ("llama-gqa-llama3", "falcon-new-architecture")
TOL = 1e-5


# `FOLDERS` ({case: folder made by make_hf_causal_lm}) and `OUT` (a folder for each case's
# arrays, `{case}.npz`) come first, from the parent
SHARDED = textwrap.dedent("""
    import numpy as np, jax
    from flax import nnx
    from clarifyjax.files.child_result import write_result
    from clarifyjax.decoding import generate, score
    from helpers.read_spy import record_reads
    from clarifyjax.models.hf import load_causal_lm
    from clarifyjax.core.sharding import FSDP_RULES, MeshConfig, make_mesh, shard_batch
    from helpers.causal_lm_builders import MAX_NEW, batches

    assert jax.device_count() == 8
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, model=2))
    reads = record_reads()
    forward = nnx.jit(lambda m, *a: m(*a))
    logits_batch, prompt_batch, target_batch, prefix = batches()
    results = {}
    for case, folder in FOLDERS.items():
        reads.clear()
        _, sharded = load_causal_lm(folder, mesh=mesh, rules=FSDP_RULES)
        r = {"whole_on_a_device": [], "sharded_params": 0}
        for path, var in nnx.to_flat_state(nnx.state(sharded)):
            x = var.get_value()
            if all(a is None for a in x.sharding.spec):
                continue
            r["sharded_params"] += 1
            if any(tuple(s.data.shape) == x.shape for s in x.addressable_shards):
                r["whole_on_a_device"].append(str(path))
        q = sharded.layers[0].attention.query[...]
        r["query_spec"] = [list(a) if isinstance(a, tuple) else a for a in q.sharding.spec]
        r["full_reads_2d"] = sorted({name for name, shape, full in reads
                                     if shape == full and len(full) == 2})
        r["reads_2d"] = len([1 for _, _, full in reads if len(full) == 2])
        ids, mask, targets, target_mask = shard_batch((*prompt_batch, *target_batch), mesh)
        plain = generate(sharded, ids, mask, rng=None, max_new_tokens=MAX_NEW, greedy=True)
        prefixed = generate(sharded, ids, mask, rng=None, max_new_tokens=MAX_NEW, greedy=True,
                            prefix_ids=prefix)
        np.savez(f"{OUT}/{case}.npz",
                 logits=np.asarray(forward(sharded, *shard_batch(logits_batch, mesh))),
                 score=np.asarray(score(sharded, ids, mask, targets, target_mask)),
                 tokens=np.asarray(plain.tokens), logprobs=np.asarray(plain.logprobs),
                 prefix_tokens=np.asarray(prefixed.tokens),
                 prefix_logprobs=np.asarray(prefixed.logprobs))
        results[case] = r
    write_result(results)
""")


def test_every_parameter_has_logical_axis_names():
    config = CausalLMConfig(model_type="opt", vocab_size=64, hidden_size=32, num_layers=1,
                            num_heads=4, num_kv_heads=4, head_dim=8, ffn_size=48, embed_size=16,
                            norm="layer", qkv_bias=True, out_bias=True, mlp_bias=True,
                            gated_mlp=False, positions="learned", qk_norm=True)
    abstract = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
    for path, var in nnx.to_flat_state(nnx.state(abstract)):
        names = var.get_metadata().get("out_sharding")
        assert names is not None and len(names) == len(var.shape), (path, names, var.shape)


def check_against_one_device(case: str, folder, got) -> None:
    """The mesh's arrays `got` (the child's npz) against the one-device model of `folder`."""
    from clarifyjax.decoding import generate, score
    from clarifyjax.models.hf import load_causal_lm

    forward = nnx.jit(lambda model, ids, mask: model(ids, mask))  # test_causal_lm_parity's
    (logits_ids, logits_mask), (ids, mask), targets, prefix = batches()
    _, single = load_causal_lm(folder)
    logits = np.asarray(forward(single, logits_ids, logits_mask))
    diff = np.abs(got["logits"] - logits)[logits_mask == 1].max()
    assert diff <= TOL, (case, "logits", diff)
    diff = np.abs(got["score"] - np.asarray(score(single, ids, mask, *targets))).max()
    assert diff <= TOL, (case, "score", diff)
    plain = generate(single, ids, mask, rng=None, max_new_tokens=MAX_NEW, greedy=True)
    # a shared prefix (prefix_ids) on the mesh against the whole prompts on one device
    whole = right_padded([prefix + [int(t) for t in row[m == 1]] for row, m in zip(ids, mask)])
    assert whole[0].shape[1] <= 16  # the 16-token bucket: the program of `plain`
    prefixed = generate(single, *whole, rng=None, max_new_tokens=MAX_NEW, greedy=True)
    for name, one in (("", plain), ("prefix_", prefixed)):
        np.testing.assert_array_equal(got[name + "tokens"], np.asarray(one.tokens),
                                      err_msg=f"{case} {name}tokens")
        diff = np.abs(got[name + "logprobs"] - np.asarray(one.logprobs)).max()
        assert diff <= TOL, (case, name + "logprobs", diff)


@pytest.mark.child
@pytest.mark.slow  # a subprocess with 8 devices compiling 8 programs: 20-40 s on 2 busy cores
def test_sharded_load_on_8_devices_equals_one_device(tmp_path):
    from helpers.causal_lm_builders import make_hf_causal_lm

    folders = {}
    for case in CASES:
        folders[case] = str(tmp_path / case)
        make_hf_causal_lm(folders[case], case)
    results = run_with_fake_devices(f"FOLDERS = {folders!r}\nOUT = {str(tmp_path)!r}\n"
                                    + SHARDED, 8)
    assert sorted(results) == sorted(CASES)
    for case, r in results.items():
        assert r["query_spec"] == ["fsdp", "model", None], (case, r)
        assert r["sharded_params"] > 10, (case, r)
        assert r["whole_on_a_device"] == [], (case, r)
        assert r["reads_2d"] > 0 and r["full_reads_2d"] == [], (case, r)
        with np.load(tmp_path / f"{case}.npz") as got:
            check_against_one_device(case, folders[case], dict(got))
