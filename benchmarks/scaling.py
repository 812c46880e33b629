"""Step time of the tiny PPO update on 1, 2, 4 and 8 fake CPU devices, and its communication share.

    python benchmarks/scaling.py [--devices 1 2 4 8] [--batch 16] [--repeats 5] [--name scaling] [--out FILE]

Each device count runs in its own subprocess (the device count must be set before jax starts);
the comment above `worker` says how the communication share is measured. On fake CPU devices the
collectives are memory copies between threads sharing this machine's cores: read the share as
synchronizing overhead, not as interconnect time. Writes benchmarks/results/scaling.json.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import REPO_ROOT, timeit, write_results

from clarifyjax.files.child_result import RESULT_FILE_ENV, read_result, write_result

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _collectives(hlo: str) -> dict[str, int]:
    """Counts of collective instructions in compiled HLO text (async pairs counted once)."""
    counts = {}
    for op in COLLECTIVES:
        n = len(re.findall(rf"= [^=\n]*\b{op}(-start)?\(", hlo))
        if n:
            counts[op] = n
    return counts


# `worker` measures one device count (`main` sets XLA_FLAGS=--xla_force_host_platform_device_count=N
# for its subprocess). The workload is fixed (strong scaling): one PPO update (4 epochs, 1 minibatch:
# `ppo.make_ppo_update` over `policy.make_ppo_fns`) of a tiny random T5 policy and value model
# (d_model 64, 2 + 2 layers, vocab 256) on a global batch of `batch` rows (query 16, response 12
# tokens), data-parallel over a mesh ``data = N`` (parameters replicated, the batch split).
#
# Communication share, by removing the collectives (not by profiling): the same update is also
# compiled as N independent replicas, `jax.vmap` over a leading replica axis sharded over the N
# devices, each with its own copy of the state and its own batch/N rows: the same per-device
# work (shapes, FLOPs) but no collective (no gradient all-reduce, no all-reduce of the
# whitening's batch statistics), which the compiled HLO confirms (both programs' collectives are
# reported). Then share = max(0, t_data_parallel - t_independent) / t_data_parallel.
def worker(batch: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from clarifyjax.rl import policy

    from clarifyjax.rl import ppo
    from clarifyjax.models.state import split_model
    from clarifyjax.rl.value import ValueModel
    from clarifyjax.core import sharding
    from clarifyjax.models.t5 import T5, T5Config

    n = jax.device_count()
    mesh = sharding.make_mesh({"data": n, "fsdp": 1, "model": 1})
    config = T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=32,
                      dropout_rate=0.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    pol_def, pol = split_model(
        sharding.create_sharded(lambda: T5(config, rngs=nnx.Rngs(0)), mesh))
    val_def, val = split_model(
        sharding.create_sharded(lambda: ValueModel(config, rngs=nnx.Rngs(1)), mesh))

    rs = np.random.RandomState(0)
    s, t = 16, 12
    lengths = rs.randint(3, t + 1, size=batch)
    rm = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    qm = np.ones((batch, s), np.int32)
    qi = rs.randint(2, 256, size=(batch, s)).astype(np.int32)
    ri = (rs.randint(2, 256, size=(batch, t)) * rm).astype(np.int32)
    scorer = jax.jit(policy.make_rollout_scorer(pol_def, val_def))
    logprobs, ref, values = (np.asarray(x) for x in scorer(pol, pol, val, qi, qm, ri, rm))
    rollout_np = ppo.Rollout(query_ids=qi, query_mask=qm, response_ids=ri, response_mask=rm,
                             logprobs=logprobs, ref_logprobs=ref + 0.05 * rs.randn(batch, t),
                             values=values, rewards=rs.randn(batch).astype(np.float32))
    rollout_np = jax.tree.map(lambda x: np.asarray(x, np.float32) if np.asarray(x).dtype ==
                              np.float64 else np.asarray(x), rollout_np)

    tx = optax.adam(1e-4)
    update = ppo.make_ppo_update(*policy.make_ppo_fns(pol_def, val_def), tx, tx, ppo.PPOUpdateConfig())
    state = ppo.init_ppo_state(pol, val, tx, tx)
    key = jax.random.key(0)

    # data parallel: the batch split over `data`, parameters replicated
    rollout = sharding.shard_batch(rollout_np, mesh)  # a Rollout of global arrays
    dp = jax.jit(update)
    dp_hlo = dp.lower(state, rollout, key).compile().as_text()

    # the same per-device work, no collectives: n independent replicas, one per device
    per = batch // n
    replica = NamedSharding(mesh, PartitionSpec("data"))
    stack = lambda x: jax.device_put(jnp.broadcast_to(x, (n,) + x.shape), replica)  # noqa: E731
    states = jax.tree.map(stack, state)
    rollouts = jax.tree.map(lambda x: jax.device_put(x.reshape((n, per) + x.shape[1:]), replica),
                            rollout_np)
    keys = jax.device_put(jax.random.split(key, n), replica)
    local = jax.jit(jax.vmap(update))
    local_hlo = local.lower(states, rollouts, keys).compile().as_text()

    # interleaved, so that a load change on the machine hits both programs alike
    run_dp = lambda: jax.block_until_ready(dp(state, rollout, key))  # noqa: E731
    run_local = lambda: jax.block_until_ready(local(states, rollouts, keys))  # noqa: E731
    run_dp(), run_local()
    times_dp, times_local = [], []
    for _ in range(repeats):
        times_dp.append(timeit(run_dp, repeats=1, warmup=0)["best_s"])
        times_local.append(timeit(run_local, repeats=1, warmup=0)["best_s"])
    t_dp, t_local = (
        {"best_s": min(ts), "median_s": sorted(ts)[len(ts) // 2], "repeats": repeats}
        for ts in (times_dp, times_local))

    dp_s, local_s = t_dp["median_s"], t_local["median_s"]
    return {"devices": n, "global_batch": batch, "rows_per_device": per,
            "step_s": t_dp, "no_collectives_step_s": t_local,
            "communication_share": max(0.0, dp_s - local_s) / dp_s,
            "collectives": _collectives(dp_hlo),
            "collectives_without": _collectives(local_hlo)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--name", default="scaling", help="results/<name>.json")
    parser.add_argument("--out", type=Path, default=None, help="write here instead of results/<name>.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        write_result(worker(args.batch, args.repeats))
        return
    runs = []
    for n in args.devices:
        if args.batch % n:
            raise SystemExit(f"--batch {args.batch} is not divisible by {n} devices")
        with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
            result = Path(tmp) / "result.json"
            # the caller's XLA flags (a compile level, a dump folder) with this run's device count
            flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
                     if not f.startswith("--xla_force_host_platform_device_count")]
            env = dict(os.environ, JAX_PLATFORMS="cpu",
                       XLA_FLAGS=" ".join([f"--xla_force_host_platform_device_count={n}", *flags]),
                       PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       **{RESULT_FILE_ENV: str(result)})
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                                   "--batch", str(args.batch), "--repeats", str(args.repeats)],
                                  env=env, capture_output=True, text=True, cwd=str(REPO_ROOT))
            try:
                if proc.returncode != 0:
                    raise ValueError(f"exit status {proc.returncode}")
                run = read_result(result)
            except (OSError, ValueError) as e:
                raise SystemExit(f"worker with {n} devices failed ({e}):\n{proc.stdout}\n"
                                 f"{proc.stderr}") from e
        print(f"{n} device(s): step {1e3 * run['step_s']['median_s']:.1f} ms, without collectives "
              f"{1e3 * run['no_collectives_step_s']['median_s']:.1f} ms, communication share "
              f"{100 * run['communication_share']:.0f}%, collectives {run['collectives']}",
              flush=True)
        runs.append(run)
    base = runs[0]["step_s"]["median_s"]
    write_results(args.name, {
        "workload": "tiny PPO update (T5 d_model 64, 2+2 layers, policy + value, 4 epochs), "
                    f"global batch {args.batch}, data parallel on fake CPU devices",
        "method": "communication share = (t_data_parallel - t_independent_replicas) / "
                  "t_data_parallel; see the docstring",
        "runs": runs,
        "step_time_vs_first": {str(r["devices"]): r["step_s"]["median_s"] / base for r in runs}},
        args.out)


if __name__ == "__main__":
    main()
