"""PPO step time for a t5-small-sized policy and value: rollout, reward and update, and the update
against the same math in PyTorch (`_ppo_torch.py`) on the same weights: one `loops.train_ppo` step
of clarifyjax/presets/ppo_t5_large.yaml on random weights (`build` says what differs), its update's FLOPs
against the jitted float32 matmul rate. Writes benchmarks/results/ppo.json (--name).

    python benchmarks/ppo.py                     # the full run (t5-small sizes; tens of minutes)
    python benchmarks/ppo.py --quick             # tiny sizes: checks that it runs (minutes)
    python benchmarks/ppo.py --reward stand-in   # leave the reward models out
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from _common import REPO_ROOT, write_results

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from clarifyjax.rl import ppo

from clarifyjax.training import builders, programs

from clarifyjax.core import traces

from clarifyjax.training import loops
from clarifyjax.core import sharding  # noqa: E402
from clarifyjax.text import formats  # noqa: E402
from clarifyjax.config import load_config  # noqa: E402
from clarifyjax.models.tiny import save_t5_folder, tiny_spm_folder, tiny_t5_config  # noqa: E402
from clarifyjax.models.state import copy_params, split_model  # noqa: E402
from clarifyjax.rl.value import ValueModel  # noqa: E402
from clarifyjax.rl.policy import make_ppo_fns  # noqa: E402
from clarifyjax.rl.rollout import RolloutSampler  # noqa: E402
from clarifyjax.reward.jsd import RewardNormalizer  # noqa: E402
from clarifyjax.text.tokenizer import Tokenizer  # noqa: E402
from t5 import matmul_flops_per_s  # noqa: E402  (benchmarks/t5.py)
from _ppo_torch import torch_peer  # noqa: E402  (benchmarks/_ppo_torch.py: the PyTorch peer)

DEV = REPO_ROOT.parent / "shared" / "data" / "delta-clarify" / "dev.tsv"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO_ROOT / "clarifyjax" / "presets" / "ppo_t5_large.yaml"),
                   help="PPO config whose hyperparameters are used")
    p.add_argument("--batch", type=int, default=16, help="situations per PPO step")
    p.add_argument("--query-len", type=int, default=64, help="query tokens (padded)")
    p.add_argument("--max-question-length", type=int, default=None, help="default: the config's")
    p.add_argument("--epochs", type=int, default=None, help="default: the config's")
    p.add_argument("--minibatches", type=int, default=None, help="default: the config's")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32128)
    p.add_argument("--reward", choices=("pipeline", "stand-in"), default="pipeline")
    p.add_argument("--warmup-steps", type=int, default=1,
                   help="untimed PPO steps after the first (new padded lengths compile there)")
    p.add_argument("--steps", type=int, default=3, help="timed PPO steps after the warm-up")
    p.add_argument("--torch-repeats", type=int, default=1,
                   help="timed PyTorch updates per thread count, after the first (which is "
                        "compared with ours)")
    p.add_argument("--torch-threads", default=f"1,{os.cpu_count()}",
                   help="PyTorch intra-op thread counts to time, comma-separated; the best is "
                        "the peer (default 1 and all cores: on a loaded machine one thread can "
                        "be several times faster than all)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (d_model 64, 2+2 layers, vocab 2048, batch 8, queries of 32 "
                        "tokens, questions of 12, answers 12, fusions 16): checks that it runs")
    p.add_argument("--name", default="ppo", help="results/<name>.json")
    args = p.parse_args()
    if args.quick:
        args.d_model, args.d_ff, args.layers, args.heads, args.vocab = 64, 256, 2, 4, 2048
        args.batch, args.query_len, args.steps, args.warmup_steps = 8, 32, 3, 2
        args.torch_repeats = 2
        args.max_question_length = args.max_question_length or 12
        args.name = args.name if args.name != "ppo" else "ppo_quick"
    return args


def load_average() -> dict:
    out = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {"uptime": out, "loadavg_1_5_15": list(os.getloadavg())}


def dev_situations(n: int) -> list[str]:
    with open(DEV, newline="", encoding="utf-8") as f:
        rows = [r["situation"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    unique = list(dict.fromkeys(s for s in rows if s and s.strip()))
    if len(unique) < n:
        raise SystemExit(f"{DEV} has only {len(unique)} situations; {n} needed")
    return unique[:n]


class FoldedVocabulary:
    """Decodes a random policy's ids with a smaller tokenizer: an id past its vocabulary V becomes
    3 + (id - V) % (V - 3) (pad, EOS and unk keep their ids), so that every sampled token is text,
    as with a real 32k vocabulary (`Tokenizer.decode_batch` alone drops unknown ids)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def decode_batch(self, ids) -> list[str]:
        ids = np.asarray(ids).astype(np.int64)
        v = self.tokenizer.vocab_size
        return self.tokenizer.decode_batch(np.where(ids >= v, 3 + (ids - v) % (v - 3), ids))


def stand_in_reward(situations, questions) -> np.ndarray:
    """A cheap host-side reward in [0, 1]: the share of the question's words that begin with
    "wh" (the reward pipeline's cost left out)."""
    def share(q: str) -> float:
        words = q.lower().split()
        return sum(w.startswith("wh") for w in words) / len(words) if words else 0.0
    return np.array([share(q) for q in questions], np.float64)


def flops_of(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0))


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "best_s": min(times), "all_s": times}


def build(args, root: Path):
    """The config, the models (ours and the torch policy with the same weights), the sampler,
    the jitted update factory: what `loops.train_ppo` sets up, on a 1-device mesh.

    Random float32 T5 v1.0s (t5-small sizes by default) for the policy, its frozen reference (a
    copy) and the value model (`ValueModel.from_t5`); texts use a 2,000-piece SentencePiece
    vocabulary trained on δ-CLARIFY, the policy's ids past it folded in (`FoldedVocabulary`).
    Queries: "question: " + dev situations. The config's settings where they apply, with a batch
    of 16 instead of 64 (2-core CPU), mesh 1 x 1 x 1, float32 and no NLI filter. The reward is
    the real `RewardPipeline` (`--reward pipeline`: t5-small-sized random answerer, fusion and
    judge) or `stand_in_reward`. Random weights rarely write EOS, so questions, answers and
    fusions run to their length limits: the worst case for sampling and reward."""
    spm = tiny_spm_folder(root, vocab_size=2000)
    hf_config = tiny_t5_config("v1.0", vocab_size=args.vocab, d_model=args.d_model,
                               d_kv=args.d_model // args.heads, d_ff=args.d_ff,
                               num_layers=args.layers, num_decoder_layers=args.layers,
                               num_heads=args.heads, relative_attention_num_buckets=32,
                               relative_attention_max_distance=128)
    names = ("policy", "answerer", "fusion", "judge") if args.reward == "pipeline" else ("policy",)
    folders = {name: root / name for name in names}
    for seed, name in enumerate(names):
        folders[name].mkdir()
        model = save_t5_folder(folders[name], hf_config, seed, spm)
        if name == "policy":
            torch_policy = model
    overrides = ["mesh.data=-1", "mesh.fsdp=1", "mesh.model=1", "mesh.rules=default",
                 f"policy.init={folders['policy']}", "policy.tokenizer=null",
                 "policy.dtype=float32", "policy.param_dtype=float32",
                 f"policy.max_input_length={args.query_len}", f"ppo.batch_size={args.batch}",
                 "rewards.nli=null", "normalizer.fit=false", "normalizer.fit_batches=8"]
    overrides += [f"ppo.{k}={getattr(args, k)}" for k in ("epochs", "minibatches")
                  if getattr(args, k) is not None]
    if args.max_question_length is not None:
        overrides.append(f"ppo.sampling.max_new_tokens={args.max_question_length}")
    for model in ("answerer", "fusion", "judge.model") if args.reward == "pipeline" else ():
        overrides += [f"rewards.{model}.{k}={v}" for k, v in (
            ("init", folders[model.split(".")[0]]), ("tokenizer", "null"), ("dtype", "float32"))]
    if args.quick:
        overrides += ["rewards.answer_max_length=12", "rewards.fusion_max_length=16"]
    cfg = load_config(args.config, overrides)
    o = cfg.optimizer
    if not args.no_torch and (o.name != "adam" or o.max_grad_norm or o.schedule != "constant"
                              or o.warmup_steps):
        raise SystemExit(f"the PyTorch peer is Adam at a constant rate without clipping; "
                         f"{args.config} asks for {o} (use --no-torch)")
    h = cfg.ppo
    mesh = sharding.make_mesh(cfg.mesh)
    tokenizer = Tokenizer.from_pretrained(spm)
    p_config, policy = builders.build_t5(cfg.policy, seed=0, mesh=mesh,
                                         rules=sharding.DEFAULT_RULES, tokenizer=tokenizer,
                                         where="policy")
    graphdef, params = split_model(policy)
    value_graphdef, value_params = split_model(ValueModel.from_t5(policy, seed=2))
    # The state and the update's shardings as `loops.train_ppo` assembles them (its outputs keep
    # the inputs' layout, so the sampler and the scorer see the same parameter layout at every
    # step); the update is jitted here without donation, since the benchmark reuses `state0`.
    program = programs.PPOProgram.build(cfg, mesh, graphdef, params, value_graphdef, value_params)
    tx = programs.make_optimizer(o, cfg.run.steps)

    def jit_update(config: ppo.PPOUpdateConfig):
        fn = ppo.make_ppo_update(*make_ppo_fns(graphdef, value_graphdef), tx, tx, config)
        return jax.jit(fn, in_shardings=program.in_shardings,
                       out_shardings=(program.state_shardings["ppo"], program.in_shardings[2]))

    reward_fn = loops.build_reward_fn(cfg) if args.reward == "pipeline" else stand_in_reward
    sampler = RolloutSampler(FoldedVocabulary(tokenizer), graphdef, value_graphdef, reward_fn,
                             mesh, sampling=h.sampling)
    return SimpleNamespace(
        cfg=cfg, mesh=mesh, tokenizer=tokenizer, p_config=p_config, torch_policy=torch_policy,
        state0=program.init_state()["ppo"], ref_params=copy_params(params),
        ppo_config=h,  # the config's ppo section is the update's ppo.PPOUpdateConfig
        jit_update=jit_update, reward_fn=reward_fn, sampler=sampler,
        normalizer=RewardNormalizer(gain=cfg.normalizer.gain, bias=cfg.normalizer.bias))


def compiled_programs(bench) -> int:
    """Traces so far of the jitted programs a step runs (sampling, the reward models' generate
    and judge, the scorer); the update is compiled ahead of time."""
    return traces.count() + bench.sampler.scorer.cache_size()


def rollout(bench, state: ppo.PPOState, batch, situations, key):
    """(Rollout, phase times, reward fields): `RolloutSampler.rollout`, timed per phase."""
    sampler = bench.sampler
    k_sample, k_reward = jax.random.split(key)
    t0 = time.perf_counter()
    ids, mask, gen, questions = sampler.questions(state.policy_params, batch, k_sample)
    t1 = time.perf_counter()  # decoding to text synchronized
    fields = sampler.rewards(situations, questions, k_reward, bench.normalizer)
    t2 = time.perf_counter()
    scored = jax.block_until_ready(sampler.scorer(
        state.policy_params, bench.ref_params, state.value_params, ids, mask, gen.tokens,
        gen.mask))
    t3 = time.perf_counter()
    rewards = sharding.shard_batch(fields["reward"], bench.mesh)
    logprobs, ref_logprobs, values = scored
    r = ppo.Rollout(query_ids=ids, query_mask=mask, response_ids=gen.tokens,
                    response_mask=gen.mask, logprobs=logprobs, ref_logprobs=ref_logprobs,
                    values=values, rewards=rewards)
    return r, {"sample_s": t1 - t0, "reward_s": t2 - t1, "score_s": t3 - t2}, fields



def make_step_inputs(bench, args, situations):
    """step_inputs(i): batch i of the situations as (the policy's batch, the situations)."""
    b = args.batch

    def step_inputs(i: int):
        sits = situations[i * b:(i + 1) * b]
        ids, mask = bench.tokenizer.encode_batch([formats.policy_input(s) for s in sits],
                                                 args.query_len, pad_to=args.query_len)
        return {"input_ids": ids, "input_mask": mask}, sits
    return step_inputs


def first_step(bench, args, step_inputs, key) -> SimpleNamespace:
    """The first step, where everything compiles: its rollout (phases timed with their compiles),
    the update compiled ahead of time (and, for its FLOPs, once more with epochs=1,
    minibatches=1 on one minibatch), then run."""
    b, ppo_config, state0 = args.batch, bench.ppo_config, bench.state0
    rollout0, first, _ = rollout(bench, state0, *step_inputs(0), jax.random.fold_in(key, 0))
    k_update0 = jax.random.fold_in(key, 10_000)
    t0 = time.perf_counter()
    update = bench.jit_update(ppo_config).lower(state0, rollout0, k_update0).compile()
    update_compile_s = time.perf_counter() - t0
    # XLA counts a while loop's body once whatever its trip count: the full update's count is
    # kept as raw, and one epoch of one minibatch is counted and multiplied out instead
    raw_update_flops = flops_of(update)
    t0 = time.perf_counter()
    one = bench.jit_update(dataclasses.replace(ppo_config, epochs=1, minibatches=1)).lower(
        state0, jax.tree.map(lambda x: x[:b // ppo_config.minibatches], rollout0),
        k_update0).compile()
    one_step_compile_s = time.perf_counter() - t0
    step_flops = flops_of(one)
    del one
    t0 = time.perf_counter()
    state1, metrics0 = jax.block_until_ready(update(state0, rollout0, k_update0))
    first["update_s"] = time.perf_counter() - t0
    return SimpleNamespace(
        rollout0=rollout0, first=first, update=update, update_compile_s=update_compile_s,
        raw_update_flops=raw_update_flops, one_step_compile_s=one_step_compile_s,
        step_flops=step_flops, update_flops=ppo_config.epochs * ppo_config.minibatches * step_flops,
        state0=state0, state1=state1, metrics0=metrics0)


def timed_steps(bench, args, update, state, step_inputs, key) -> SimpleNamespace:
    """`--warmup-steps` untimed steps, then `--steps` timed ones: each phase's seconds, the
    programs each timed step compiled, its sampled tokens, and the last step's reward fields."""
    phases = {"sample_s": [], "score_s": [], "reward_s": [], "update_s": []}
    response_tokens, new_programs = [], []
    for i in range(1, 1 + args.warmup_steps + args.steps):
        before = compiled_programs(bench)
        r, times, fields = rollout(bench, state, *step_inputs(i), jax.random.fold_in(key, i))
        t0 = time.perf_counter()
        state, _ = jax.block_until_ready(update(state, r, jax.random.fold_in(key, 10_000 + i)))
        times["update_s"] = time.perf_counter() - t0
        if i > args.warmup_steps:
            new_programs.append(compiled_programs(bench) - before)
            for k, v in times.items():
                phases[k].append(v)
            response_tokens.append(int(np.asarray(r.response_mask).sum()))
    # A step that compiled something (a padded length not met before) is reported, not used.
    clean = [j for j, n in enumerate(new_programs) if n == 0] or list(range(len(new_programs)))
    med = {k: statistics.median([v[j] for j in clean]) for k, v in phases.items()}
    return SimpleNamespace(phases=phases, response_tokens=response_tokens,
                           new_programs=new_programs, clean=clean, med=med, fields=fields,
                           update_best=min(phases["update_s"][j] for j in clean))


def settings_section(args, bench, build_s: float) -> dict:
    cfg, h, r_cfg = bench.cfg, bench.cfg.ppo, bench.cfg.rewards
    return {
        "policy_and_value": {"d_model": args.d_model, "layers": f"{args.layers}+{args.layers}",
                             "heads": args.heads, "d_ff": args.d_ff, "vocab": args.vocab,
                             "family": "v1.0 (relu, tied)", "dtype": "float32",
                             "weights": "random"},
        "batch": args.batch, "query_len": args.query_len,
        "max_question_length": h.sampling.max_new_tokens,
        "ppo": dataclasses.asdict(bench.ppo_config), "kl_coef": h.kl_coef,
        "adaptive_kl": h.adaptive_kl,
        "optimizer": {"name": cfg.optimizer.name, "lr": cfg.optimizer.lr},
        "sampling": {"temperature": h.sampling.temperature, "top_p": h.sampling.top_p,
                     "top_k": h.sampling.top_k},
        "config": str(args.config), "reward": args.reward,
        "reward_models": (f"answerer, fusion, judge: random, the policy's sizes; no NLI; "
                          f"answers {r_cfg.answer_max_length} tokens, fusions "
                          f"{r_cfg.fusion_max_length}, judgment text 32, dropped answers: "
                          f"{r_cfg.dropped_answer}") if args.reward == "pipeline"
        else "stand-in: share of 'wh' words (host, ~0 s)",
        "warmup_steps": args.warmup_steps, "steps_timed": args.steps,
        "jax_threads": "XLA CPU default (all cores)", "torch_threads": args.torch_threads,
        "build_models_s": build_s,
    }


def first_step_section(one: SimpleNamespace, med: dict) -> dict:
    first = one.first
    return {
        **first, "update_compile_s": one.update_compile_s,
        "compile_estimate_s": {k: first[k] - med[k] for k in ("sample_s", "score_s",
                                                              "reward_s")},
        "note": "first calls of sampling, scoring and reward include their compiles; the "
                "update was compiled ahead of time (update_compile_s), then run (update_s)",
    }


def steady_step_section(args, bench, one: SimpleNamespace, steps: SimpleNamespace) -> dict:
    med, b, epochs = steps.med, args.batch, bench.ppo_config.epochs
    rollout_s = med["sample_s"] + med["score_s"]
    step_s = rollout_s + med["reward_s"] + med["update_s"]
    t_resp = int(np.asarray(one.rollout0.response_ids).shape[1])
    tokens = float(np.mean(steps.response_tokens))
    new_programs = steps.new_programs
    return {
        "rollout_s": rollout_s, "sample_s": med["sample_s"], "score_s": med["score_s"],
        "reward_s": med["reward_s"], "update_s": med["update_s"], "step_s": step_s,
        "share": {"rollout": rollout_s / step_s, "reward": med["reward_s"] / step_s,
                  "update": med["update_s"] / step_s},
        "per_phase_all_timed_steps": {k: summary(v) for k, v in steps.phases.items()},
        "new_programs_per_timed_step": new_programs,
        "steps_used": len(steps.clean) if any(n == 0 for n in new_programs) else 0,
        "steps_note": "medians over the timed steps that compiled nothing (else all)",
        "response_tokens_per_step": tokens, "response_token_slots": b * t_resp,
        "tokens_per_s": tokens / step_s,
        "sampling_tokens_per_s": tokens / med["sample_s"],
        "update_tokens_per_s": epochs * b * (args.query_len + t_resp) / med["update_s"],
        "tokens_note": "tokens_per_s: sampled question tokens per second of PPO step; "
                       "update: (query + response) tokens x epochs per second",
        "reward_stage_s_last_step": dict(getattr(bench.reward_fn, "timings", {}) or {}),
        "reward_raw_mean_last_step": float(np.mean(steps.fields["raw_reward"])),
    }


def update_section(one: SimpleNamespace, steps: SimpleNamespace, matmul: float) -> dict:
    update_flops, step_flops, raw = one.update_flops, one.step_flops, one.raw_update_flops
    best = steps.update_best
    return {
        "flops": update_flops, "flops_one_minibatch_step": step_flops,
        "xla_raw_flops_full_update": raw,
        "raw_over_one_step": raw / step_flops if step_flops else None,
        "flops_method": "cost_analysis() of the update compiled with epochs=1, minibatches=1 "
                        "on one minibatch, x epochs x minibatches (XLA counts a loop body "
                        "once: raw_over_one_step ~ 1)",
        "one_step_compile_s": one.one_step_compile_s,
        "best_s": best, "median_s": steps.med["update_s"],
        "flops_per_s": update_flops / best, "matmul_f32_flops_per_s": matmul,
        "fraction_of_matmul_throughput": update_flops / best / matmul,
    }


def print_summary(results: dict, matmul: float, update_best: float) -> None:
    s, u = results["steady_step"], results["update"]
    print(f"PPO step {s['step_s']:.2f} s: rollout {s['rollout_s']:.2f} (sample {s['sample_s']:.2f}"
          f" + score {s['score_s']:.2f}), reward {s['reward_s']:.2f}, update {s['update_s']:.2f}; "
          f"{s['tokens_per_s']:.1f} question tokens/s")
    print(f"update: {u['flops'] / 1e9:.1f} GFLOP, {u['flops_per_s'] / 1e9:.1f} GFLOP/s = "
          f"{100 * u['fraction_of_matmul_throughput']:.0f}% of the f32 matmul throughput "
          f"({matmul / 1e9:.1f} GFLOP/s)")
    if "torch_update" in results:
        t = results["torch_update"]
        print(f"PyTorch update {t['best_s']:.2f} s ({t['best_threads']} threads) vs ours "
              f"{update_best:.2f} s -> {t['ratio_torch_over_ours']:.2f}x; losses agree to "
              f"{t['agreement']['max_rel_loss_diff']:.1e}, updates to "
              f"{t['agreement']['policy_update_rel_diff']:.1e} (policy)")


def main() -> None:
    args = parse_args()
    args.torch_threads = sorted({int(n) for n in str(args.torch_threads).split(",")})
    torch.set_num_threads(max(args.torch_threads))
    load_before = load_average()
    tmp = tempfile.TemporaryDirectory()
    t0 = time.perf_counter()
    bench = build(args, Path(tmp.name))
    build_s = time.perf_counter() - t0  # includes writing the folders
    situations = dev_situations((1 + args.warmup_steps + args.steps) * args.batch)
    step_inputs = make_step_inputs(bench, args, situations)
    key = jax.random.key(0)
    one = first_step(bench, args, step_inputs, key)
    steps = timed_steps(bench, args, one.update, one.state1, step_inputs, key)
    matmul = matmul_flops_per_s()
    results = {
        "mode": "quick" if args.quick else "full",
        "load_before": load_before,
        "settings": settings_section(args, bench, build_s),
        "first_step_with_compile": first_step_section(one, steps.med),
        "steady_step": steady_step_section(args, bench, one, steps),
        "update": update_section(one, steps, matmul),
    }
    if not args.no_torch:
        results["torch_update"] = torch_peer(args, bench, one.rollout0, one.state0, one.state1,
                                             one.metrics0, steps.update_best)
    results["load_after"] = load_average()
    write_results(args.name, results)
    print_summary(results, matmul, steps.update_best)
    tmp.cleanup()


if __name__ == "__main__":
    main()
