"""T5 on a (data=2, fsdp=2, model=2) mesh of 8 fake CPU devices equals T5 on one device.

`load_t5(..., mesh=, rules=FSDP_RULES)` builds every parameter with make_array_from_callback;
the test also spies on the checkpoint reader to show that sharded tensors are read slice by
slice (no device, and no read, ever holds the whole tensor). Tolerance: 1e-5 on logits and
log-probs (measured ~1e-6); greedy tokens identical.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
from flax import nnx

from helpers.children import run_with_fake_devices
from helpers.t5_builders import TINY

from clarifyjax.models.t5 import T5, T5Config

LOGICAL_NAMES = {
    "embedding": ("vocab", "embed"), "lm_head": ("embed", "vocab"),
    "query": ("embed", "heads", "kv"), "key": ("embed", "heads", "kv"),
    "value": ("embed", "heads", "kv"), "out": ("heads", "kv", "embed"),
    "wi": ("embed", "mlp"), "wo": ("mlp", "embed"), "scale": ("embed",),
}


def test_every_parameter_has_logical_axis_names():
    config = T5Config(**{**TINY, "feed_forward_proj": "gated-gelu",
                         "tie_word_embeddings": False})
    abstract = nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0)))
    seen = set()
    for path, var in nnx.to_flat_state(nnx.state(abstract)):
        assert isinstance(var, nnx.Param), path
        names = var.get_metadata().get("out_sharding")
        assert names is not None and len(names) == len(var.shape), (path, names, var.shape)
        key = path[-2] if isinstance(path[-1], int) else path[-1]
        if path[-2:] == ("relative_bias", "embedding"):
            assert tuple(names) == ("relpos_buckets", "heads")
        else:
            assert tuple(names) == LOGICAL_NAMES[key], (path, names)
        seen.add(key)
    assert seen == set(LOGICAL_NAMES)


SHARDED = textwrap.dedent("""
    import tempfile
    import numpy as np, jax, jax.numpy as jnp
    from flax import nnx
    from jax.sharding import PartitionSpec as P
    from helpers.t5_builders import random_t5
    from clarifyjax.files.child_result import write_result
    from helpers.read_spy import record_reads
    from clarifyjax.models.hf import load_t5, save_t5
    from clarifyjax.models.t5 import T5Config
    from clarifyjax.core.sharding import FSDP_RULES, MeshConfig, make_mesh, shard_batch
    from clarifyjax.decoding import generate, score

    assert jax.device_count() == 8
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, model=2))
    reads = record_reads()
    forward = nnx.jit(lambda m, *a: m(*a))
    def spec(x):
        return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]

    rng = np.random.RandomState(0)
    ids = rng.randint(2, 96, (8, 13)).astype(np.int32)
    mask = (np.arange(13)[None] < rng.randint(1, 14, (8, 1))).astype(np.int32)
    dec = rng.randint(2, 96, (8, 7)).astype(np.int32)
    dec_mask = (np.arange(7)[None] < rng.randint(1, 8, (8, 1))).astype(np.int32)
    results = {}
    for family, ff, tie in [("v1.0", "relu", True), ("v1.1", "gated-gelu", False)]:
        config = T5Config(vocab_size=96, d_model=32, d_kv=6, d_ff=48, num_layers=2,
                          num_decoder_layers=3, num_heads=4, relative_attention_num_buckets=8,
                          relative_attention_max_distance=16, dropout_rate=0.0,
                          feed_forward_proj=ff, tie_word_embeddings=tie)
        folder = tempfile.mkdtemp()
        save_t5(random_t5(config, seed=1), config, folder)
        _, single = load_t5(folder)
        reads.clear()
        _, sharded = load_t5(folder, mesh=mesh, rules=FSDP_RULES)
        r = {}
        q = sharded.encoder.layers[0].self_attention.query[...]
        r["query_spec"] = spec(q)
        r["embedding_spec"] = spec(sharded.embedding[...])
        r["embedding_shards"] = sorted({tuple(s.data.shape) for s in sharded.embedding[...].addressable_shards})
        if not tie:
            r["lm_head_spec"] = spec(sharded.lm_head[...])
        r["shared_reads"] = sorted({shape for name, shape, _ in reads if name == "shared.weight"})
        sliced = ("q.weight", "wo.weight", "shared.weight")
        r["full_reads_of_sharded"] = sorted({name for name, shape, full in reads
                                             if shape == full and name.endswith(sliced)})
        b = shard_batch((ids, mask, dec, dec_mask), mesh)
        logits_1 = np.asarray(forward(single, ids, mask, dec, dec_mask))
        logits_8 = forward(sharded, *b)
        r["logits_spec"] = spec(logits_8)
        r["logits_diff"] = float(np.abs(np.asarray(logits_8) - logits_1).max())
        r["logits_scale"] = float(np.abs(logits_1).max())
        s1 = np.asarray(score(single, ids, mask, dec, dec_mask))
        s8 = np.asarray(score(sharded, *b))
        r["score_diff"] = float(np.abs(s1 - s8).max())
        if family == "v1.1":
            g1 = generate(single, ids, mask, rng=None, max_new_tokens=6, greedy=True)
            g8 = generate(sharded, b[0], b[1], rng=None, max_new_tokens=6, greedy=True)
            r["generate_equal"] = bool((np.asarray(g1.tokens) == np.asarray(g8.tokens)).all())
            r["generate_logprob_diff"] = float(np.abs(np.asarray(g1.logprobs) - np.asarray(g8.logprobs)).max())
        results[family] = r
    write_result(results)
""")


@pytest.mark.child
@pytest.mark.slow  # a subprocess with 8 devices compiling ~10 programs: 15-35 s on 2 busy cores
def test_forward_on_8_devices_equals_one_device():
    results = run_with_fake_devices(SHARDED, 8)
    for family, r in results.items():
        # FSDP_RULES: embed over fsdp, heads/mlp/vocab over model
        assert r["query_spec"] == ["fsdp", "model", None], r
        assert r["embedding_spec"] == ["model", "fsdp"], r
        assert r["embedding_shards"] == [[48, 16]], r  # a quarter of [96, 32] per device
        assert r["shared_reads"] == [[48, 16]], r  # each read is one device's slice
        assert r["full_reads_of_sharded"] == [], r
        assert "data" in np.atleast_1d(r["logits_spec"][0]), r  # the batch stays split
        assert r["logits_diff"] <= 1e-5, (family, r)
        assert r["score_diff"] <= 1e-5, (family, r)
    assert results["v1.1"]["lm_head_spec"] == ["fsdp", "model"]
    assert results["v1.1"]["generate_equal"]
    assert results["v1.1"]["generate_logprob_diff"] <= 1e-5
