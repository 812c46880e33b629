"""benchmarks/reward.py's throughput bound: its matmul FLOP count of a T5 call agrees with XLA's own
count (`cost_analysis`) of the programs our decoding runs (the figures come from the full run,
`python benchmarks/reward.py`, recorded in benchmarks/results/reward.json)."""
from __future__ import annotations

import importlib.util
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from clarifyjax.models.t5 import T5, T5Config
from helpers.env import REPO_ROOT, require

pytestmark = pytest.mark.reference


@pytest.fixture(scope="module")
def bench():
    require("torch"), require("transformers")  # the benchmark's reference side
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # for its `_common`
    spec = importlib.util.spec_from_file_location("reward_benchmark",
                                                  REPO_ROOT / "benchmarks" / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def xla_flops(fn, *args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


@pytest.mark.parametrize("family", ["relu", "gated-gelu"])
def test_t5_call_flops_match_xla(bench, family):
    """Encoder + cross-attention K/V, and one decode step at the cache's last position (where
    the positions so far are the whole cache, as XLA counts them): within 1.5% of XLA's count
    (the rest is norms, softmaxes and activations, which the bound leaves out)."""
    config = T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2,
                      num_heads=4, dropout_rate=0.0, feed_forward_proj=family,
                      tie_word_embeddings=family == "relu")
    graphdef, state = nnx.split(T5(config, rngs=nnx.Rngs(0)))
    rows, source, steps = 8, 16, 12
    ids = jnp.ones((rows, source), jnp.int32)

    def encode_and_cache(state, ids):
        model = nnx.merge(graphdef, state)
        return model.init_cache(model.encode(ids, ids), ids, steps)

    def step(state, cache):
        model = nnx.merge(graphdef, state)
        return model.decode_step(jnp.ones((rows,), jnp.int32), cache, steps - 1)

    cache = jax.eval_shape(encode_and_cache, state, ids)

    def counted(positions):
        call = dict(config=config, rows=rows, source_length=source, decoder_positions=positions,
                    decoder_rows=rows, lm_head_positions=positions)
        return {kind: f for kind, (f, _) in bench.t5_call_flops(call).items()}

    encoder = counted(0)["encoder"]
    assert encoder == pytest.approx(xla_flops(encode_and_cache, state, ids), rel=0.015)
    # one step = the difference of `steps` and `steps - 1` decoded positions
    full, before = counted(steps), counted(steps - 1)
    one_step = sum(full.values()) - sum(before.values())
    assert one_step == pytest.approx(xla_flops(step, state, cache), rel=0.015)
