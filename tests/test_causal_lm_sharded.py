"""Causal LMs on a (data=2, fsdp=2, model=2) mesh of 8 fake CPU devices equal the one-device
model: logits, `score` and greedy `generate` (the KV cache and the while_loop on the mesh), also
with a shared `prefix_ids` run once for the batch.

`load_causal_lm(..., mesh=, rules=FSDP_RULES)` builds every parameter with
make_array_from_callback; a spy on the checkpoint reader shows that every 2-D tensor is read
block by block (Falcon's fused query_key_value included), and no device holds a whole weight
of a sharded parameter. Tolerance 1e-5 (measured ~1e-6); greedy tokens identical.
"""
from __future__ import annotations

import textwrap

import pytest
from flax import nnx

from helpers.children import run_with_fake_devices

from clarifyjax.models.causal_lm import CausalLM, CausalLMConfig

SHARDED = textwrap.dedent("""
    import tempfile
    import numpy as np, jax
    from flax import nnx
    from helpers.causal_lm_builders import make_hf_causal_lm, prompts, right_padded
    from clarifyjax.files.child_result import write_result
    from clarifyjax.decoding import generate, score
    from helpers.read_spy import record_reads
    from clarifyjax.models.hf import load_causal_lm
    from clarifyjax.core.sharding import FSDP_RULES, MeshConfig, make_mesh, shard_batch

    assert jax.device_count() == 8
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, model=2))
    reads = record_reads()
    forward = nnx.jit(lambda m, *a: m(*a))

    rng = np.random.RandomState(0)
    ids, mask = right_padded(prompts(rng, [3, 9, 1, 12, 6, 2, 10, 5]))
    targets, target_mask = right_padded(prompts(rng, [4, 1, 6, 2, 3, 5, 1, 2]))
    results = {}
    for case in ("llama-gqa-llama3", "falcon-new-architecture"):
        folder = tempfile.mkdtemp()
        make_hf_causal_lm(folder, case)
        _, single = load_causal_lm(folder)
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
        b = shard_batch((ids, mask, targets, target_mask), mesh)
        r["logits_diff"] = float(np.abs(np.asarray(forward(sharded, b[0], b[1]))
                                        - np.asarray(forward(single, ids, mask)))[mask == 1].max())
        r["score_diff"] = float(np.abs(np.asarray(score(sharded, *b))
                                       - np.asarray(score(single, ids, mask, targets,
                                                          target_mask))).max())
        g1 = generate(single, ids, mask, rng=None, max_new_tokens=6, greedy=True)
        g8 = generate(sharded, b[0], b[1], rng=None, max_new_tokens=6, greedy=True)
        r["generate_equal"] = bool((np.asarray(g1.tokens) == np.asarray(g8.tokens)).all())
        r["generate_logprob_diff"] = float(np.abs(np.asarray(g1.logprobs)
                                                  - np.asarray(g8.logprobs)).max())
        # a shared prefix (prefix_ids) on the mesh against the whole prompts on one device
        prefix = prompts(np.random.RandomState(1), [7])[0]
        whole = right_padded([prefix + [int(t) for t in row[m == 1]] for row, m in zip(ids, mask)])
        g1 = generate(single, *whole, rng=None, max_new_tokens=6, greedy=True)
        g8 = generate(sharded, b[0], b[1], rng=None, max_new_tokens=6, greedy=True,
                      prefix_ids=prefix)
        r["prefix_generate_equal"] = bool((np.asarray(g1.tokens) == np.asarray(g8.tokens)).all())
        r["prefix_logprob_diff"] = float(np.abs(np.asarray(g1.logprobs)
                                                - np.asarray(g8.logprobs)).max())
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


@pytest.mark.slow  # a subprocess with 8 devices compiling ~8 programs: 20-40 s on 2 busy cores
def test_sharded_load_on_8_devices_equals_one_device():
    results = run_with_fake_devices(SHARDED, 8)
    for case, r in results.items():
        assert r["query_spec"] == ["fsdp", "model", None], (case, r)
        assert r["sharded_params"] > 10, (case, r)
        assert r["whole_on_a_device"] == [], (case, r)
        assert r["reads_2d"] > 0 and r["full_reads_2d"] == [], (case, r)
        assert r["logits_diff"] <= 1e-5, (case, r)
        assert r["score_diff"] <= 1e-5, (case, r)
        assert r["generate_equal"], (case, r)
        assert r["generate_logprob_diff"] <= 1e-5, (case, r)
        assert r["prefix_generate_equal"], (case, r)
        assert r["prefix_logprob_diff"] <= 1e-5, (case, r)
