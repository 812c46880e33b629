"""The t5-large PPO update on one accelerator (the lent H100): tokens/s and the share of the chip's
bf16 matmul throughput measured in the same run.

T5-large-shaped random policy and value, float32 parameters with bfloat16 compute, the paper's
update (batch 64, 4 epochs); the FLOPs counted by `one_epoch_matmul_flops`, the peer a jitted
8192^3 bf16 matmul. `--profile DIR` also writes a trace. Writes benchmarks/results/ppo_gpu.json.

    python benchmarks/ppo_gpu.py [--batch 64] [--layers 24] [--repeats 3] [--cost-analysis]
"""
from __future__ import annotations

import argparse
import time

from _common import timeit, write_results

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from clarifyjax.rl import ppo
from clarifyjax.models.t5 import T5, T5Config
from clarifyjax.models.state import split_model
from clarifyjax.rl.value import ValueModel
from clarifyjax.rl.policy import make_ppo_fns


def bf16_matmul_flops_per_s(n: int = 8192) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: a @ b)
    f(a, b).block_until_ready()
    return 2 * n ** 3 / timeit(lambda: f(a, b).block_until_ready(), repeats=10)["best_s"]


def flops_of(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0)) if cost else float("nan")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--query-len", type=int, default=64)
    p.add_argument("--response-len", type=int, default=30)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cost-analysis", action="store_true",
                   help="also compile epochs=1 for XLA's cost analysis (one more compile)")
    p.add_argument("--profile", default="", help="write a trace of one update to this folder")
    return p.parse_args()


def build_models(layers: int):
    """The T5-large-shaped policy and its value model: (config, policy graphdef and parameters,
    value graphdef and parameters, seconds to build them)."""
    config = T5Config(vocab_size=32128, d_model=1024, d_kv=64, d_ff=4096, num_layers=layers,
                      num_heads=16, feed_forward_proj="relu", dropout_rate=0.0,
                      dtype="bfloat16", param_dtype="float32")
    t0 = time.perf_counter()
    policy = T5(config, rngs=nnx.Rngs(0))
    graphdef, params = split_model(policy)
    value_graphdef, value_params = split_model(ValueModel.from_t5(policy, seed=1))
    return config, (graphdef, params), (value_graphdef, value_params), time.perf_counter() - t0


def random_rollout(b: int, s: int, t: int) -> ppo.Rollout:
    """A rollout of random queries and responses of 5 to t tokens."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, t + 1, size=b)
    response_mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    return ppo.Rollout(
        query_ids=jnp.asarray(rng.integers(2, 32128, (b, s)), jnp.int32),
        query_mask=jnp.ones((b, s), jnp.int32),
        response_ids=jnp.asarray(rng.integers(2, 32128, (b, t)) * response_mask, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        logprobs=jnp.asarray(-rng.uniform(0.5, 5, (b, t)) * response_mask, jnp.float32),
        ref_logprobs=jnp.asarray(-rng.uniform(0.5, 5, (b, t)) * response_mask, jnp.float32),
        values=jnp.asarray(rng.normal(size=(b, t)) * response_mask, jnp.float32),
        rewards=jnp.asarray(rng.normal(size=b), jnp.float32))


def one_epoch_matmul_flops(c: T5Config, b: int, s: int, t: int) -> int:
    """The matmul FLOPs of one epoch of the update: forward and backward of policy and value
    (6 x matmul parameters x tokens, plus the attention products) and the lm_head."""
    inner = c.num_heads * c.d_kv
    encoder_layer = 4 * c.d_model * inner + 2 * c.d_model * c.d_ff        # matmul parameters
    decoder_layer = 8 * c.d_model * inner + 2 * c.d_model * c.d_ff
    attention = c.num_layers * 4 * b * inner * (s * s + t * t + t * s)   # QK^T and PV, forward
    trunk = 6 * (c.num_layers * (encoder_layer * b * s + decoder_layer * b * t)) + 3 * attention
    return 2 * trunk + 6 * c.d_model * c.vocab_size * b * t  # policy, value, lm_head


def time_updates(update, state, rollout, key, repeats: int):
    """The first call (it compiles), then `repeats` timed calls, each waited for; `dispatch` is
    how long each call took to return to the host. Returns (state, metrics, first call s,
    times, dispatch times)."""
    times, dispatch = [], []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        state, metrics = update(state, rollout, key)
        dispatched = time.perf_counter() - t0
        jax.block_until_ready(metrics)
        if not i:  # the first call compiles
            first_call_s = time.perf_counter() - t0
        else:
            times.append(time.perf_counter() - t0)
            dispatch.append(dispatched)
    return state, metrics, first_call_s, times, dispatch


def time_pipelined(update, state, rollout, key, repeats: int):
    """Back to back, without waiting between calls: what a loop that does not read the metrics
    of every update would see. Returns (state, metrics, best seconds per update)."""
    pipelined = []
    for _ in range(2):
        t0 = time.perf_counter()
        for _ in range(repeats):
            state, metrics = update(state, rollout, key)
        jax.block_until_ready((state, metrics))
        pipelined.append((time.perf_counter() - t0) / repeats)
    return state, metrics, min(pipelined)


def main() -> None:
    args = parse_args()
    config, (graphdef, params), (value_graphdef, value_params), init_s = build_models(args.layers)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    tx = optax.adam(1e-5)
    state = ppo.init_ppo_state(params, value_params, tx, tx, ppo.FixedKL(0.15))
    b, s, t = args.batch, args.query_len, args.response_len
    rollout = random_rollout(b, s, t)
    fns = make_ppo_fns(graphdef, value_graphdef)

    def make_update(epochs: int):  # jitted as loops.train_ppo jits it
        fn = ppo.make_ppo_update(*fns, tx, tx, ppo.PPOUpdateConfig(epochs=epochs, minibatches=1))
        return jax.jit(fn, donate_argnums=(0,))

    # XLA's count of the compiled update (epochs=1: a loop body counts once) is only reported
    # beside the exact matmul count: on GPU it misses the matmuls that became cuBLAS custom calls
    # (see benchmarks/README.md), and the lowered program has none there
    one_epoch_compiled_flops = (
        flops_of(make_update(1).lower(state, rollout, jax.random.key(0)).compile())
        if args.cost_analysis else None)
    one_epoch_flops = one_epoch_matmul_flops(config, b, s, t)
    # `dispatch_s` is how long the call takes to return to the host: 0.26 s of a 0.41 s update on
    # the H100, both through this jax.jit function and through an AOT `Compiled` object.
    update = make_update(args.epochs)
    key = jax.random.key(0)
    state, metrics, first_call_s, times, dispatch = time_updates(update, state, rollout, key,
                                                                 args.repeats)
    step_s = min(times)
    compile_s = first_call_s - step_s
    state, metrics, pipelined_s = time_pipelined(update, state, rollout, key, args.repeats)
    if args.profile:
        with jax.profiler.trace(args.profile, create_perfetto_trace=True):
            state, metrics = update(state, rollout, key)
            jax.block_until_ready(metrics)
    flops = one_epoch_flops * args.epochs
    peak = bf16_matmul_flops_per_s()
    write_results("ppo_gpu", {
        "device": str(jax.devices()[0].device_kind), "jax": jax.__version__,
        "config": {"model": "t5-large shape", "layers": f"{args.layers}+{args.layers}",
                   "params_per_model": int(n_params), "param_dtype": "float32",
                   "compute_dtype": "bfloat16", "batch": b, "query_len": s,
                   "response_len": t, "epochs": args.epochs, "minibatches": 1,
                   "optimizer": "adam 1e-5"},
        "init_s": init_s, "compile_s": compile_s, "update_s": step_s, "all_s": times,
        "dispatch_s": min(dispatch), "pipelined_update_s": pipelined_s,
        "pipelined_share_of_bf16_matmul_throughput": flops / pipelined_s / peak,
        "tokens_per_s": args.epochs * b * (s + t) / step_s,
        "response_tokens_per_s": args.epochs * b * t / step_s,
        "update_flops": flops, "update_flops_per_s": flops / step_s,
        "flops_source": "matmul count: 6 x matmul params x tokens (policy + value) + attention",
        "compiled_cost_analysis_flops": (None if one_epoch_compiled_flops is None
                                         else one_epoch_compiled_flops * args.epochs),
        "bf16_matmul_flops_per_s": peak,
        "share_of_bf16_matmul_throughput": flops / step_s / peak,
        "target_share": 0.40,
        "policy_loss": float(metrics["policy_loss"]) if "policy_loss" in metrics else None,
    })

if __name__ == "__main__":
    main()
