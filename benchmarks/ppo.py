"""PPO step time for a t5-small-sized policy and value: rollout, reward and update, and the update
against the same math in PyTorch on the same weights.

Models: random, float32, T5 v1.0 (d_model 512, 6+6 layers, 8 heads, d_ff 2048, vocabulary 32128)
for the policy, the frozen reference (a copy) and the value model
(`models.value.ValueModel.from_t5`, as `train.train_ppo` builds it). Texts use a SentencePiece
vocabulary of 2,000 pieces trained on δ-CLARIFY; the policy's ids beyond it are folded into it for
decoding (`FoldedVocabulary`), so that every sampled token becomes text. Queries: "question: " +
δ-CLARIFY dev situations, 64 tokens.
Settings: configs/ppo_t5_large.yaml's where they apply (4 epochs, 1 minibatch, clips 0.2, vf coef
1, gamma 1, lambda 0.95, fixed KL 0.15, Adam 1e-5, temperature 0.7, top-p 0.6, questions of at
most 30 tokens, the reward pipeline's lengths), with a batch of 16 instead of 64 (2-core CPU), mesh
1 x 1 x 1, float32 and no NLI filter.

One PPO step, as in `train.train_ppo`, split in three:
  rollout  `RolloutSampler.questions` (jitted sampling with the KV cache, then text on the host)
           + the jitted scoring pass (log-probs under policy and reference, values);
  reward   `--reward pipeline`: the real `RewardPipeline` that `train.build_reward_fn` builds
           from the config (answerer, fusion and judge: t5-small-sized random T5s; no NLI), or
           `--reward stand-in`: a cheap host function (for when the pipeline makes a run too long);
  update   the jitted `ppo_update` (`ppo.make_ppo_update` over `policy.make_ppo_fns`).
The first step compiles everything and is reported apart; after `--warmup-steps`, `--steps` steps
are timed. Random weights rarely write EOS, so questions, answers and fusions run to their length
limits: the worst case for sampling and reward (the reward models' texts lose the ids past the
2,000 pieces, as the policy's would without the folding).

Update FLOPs: `jax.jit(...).lower(...).compile().cost_analysis()`. XLA counts a while loop's body
once whatever its trip count (the raw count of the full update is reported too), so the update is
also compiled with epochs=1, minibatches=1 on one minibatch, and its count is multiplied by epochs
x minibatches. The FLOP rate is put in proportion to this machine's jitted float32 matmul
throughput (`t5.matmul_flops_per_s`), measured in the same run.

Peer: the same update math in PyTorch on Hugging Face's T5 with the same weights (shaped rewards,
whitening, GAE, then epochs x minibatches of policy + value forward/backward and an Adam step for
each), on the first step's rollout; its losses and parameter changes are compared with ours.

    python benchmarks/ppo.py                     # the full run (t5-small sizes; ~20-30 min)
    python benchmarks/ppo.py --quick             # tiny sizes: checks that it runs (minutes)
    python benchmarks/ppo.py --reward stand-in   # leave the reward models out
"""
from __future__ import annotations

import argparse
import copy
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

from clarifyjax.training import optim  # noqa: E402

from clarifyjax.rl import ppo

from clarifyjax.training import programs

from clarifyjax.core import traces

from clarifyjax.training import loops as train
from clarifyjax.core import sharding as sharding_lib  # noqa: E402
from clarifyjax.text import formats as text_lib  # noqa: E402
from clarifyjax.config import load_config  # noqa: E402
from clarifyjax.models.hf.t5_map import tensor_maps  # noqa: E402
from clarifyjax.models.tiny import save_t5_folder, tiny_spm_folder, tiny_t5_config  # noqa: E402
from clarifyjax.models.state import copy_params, split_model  # noqa: E402
from clarifyjax.models.value import ValueModel  # noqa: E402
from clarifyjax.rl.policy import make_ppo_fns  # noqa: E402
from clarifyjax.rl.rollout import RolloutSampler  # noqa: E402
from clarifyjax.reward.jsd import RewardNormalizer  # noqa: E402
from clarifyjax.text.tokenizer import Tokenizer  # noqa: E402
from t5 import matmul_flops_per_s  # noqa: E402  (benchmarks/t5.py)

DEV = REPO_ROOT.parent / "shared" / "data" / "delta-clarify" / "dev.tsv"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO_ROOT / "configs" / "ppo_t5_large.yaml"),
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


# --------------------------------------------------------------------------- the PyTorch peer


class TorchValue(torch.nn.Module):
    """HF T5 trunk + scalar head on every decoder position (as `models.value.ValueModel`)."""

    def __init__(self, t5, head_kernel: np.ndarray, head_bias: np.ndarray, scale: bool):
        super().__init__()
        self.t5, self.scale = t5, scale
        self.head = torch.nn.Linear(head_kernel.shape[0], 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor(np.asarray(head_kernel, np.float32).T))
            self.head.bias.copy_(torch.tensor(np.asarray(head_bias, np.float32)))

    def forward(self, ids, mask, decoder_ids):
        enc = self.t5.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden = self.t5.decoder(input_ids=decoder_ids, encoder_hidden_states=enc,
                                 encoder_attention_mask=mask, use_cache=False).last_hidden_state
        if self.scale:
            hidden = hidden * self.t5.config.d_model ** -0.5
        return self.head(hidden)[..., 0]


def _masked_mean(x, mask):
    return (x * mask).sum() / mask.sum().clamp_min(1e-12)


def _whiten(x, mask, shift_mean=True, eps=1e-8):
    mean = _masked_mean(x, mask)
    var = _masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def torch_advantages(r: dict, cfg: ppo.PPOConfig, kl_coef: float):
    """Shaped rewards -> (whitened) rewards -> GAE (a reverse loop) -> whitened advantages."""
    mask = r["response_mask"].float()
    b, t = mask.shape
    positions = torch.arange(t)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    rewards = r["rewards"][:, None] * (positions[None] == last[:, None]).float()
    rewards = rewards - kl_coef * (r["logprobs"] - r["ref_logprobs"]) * mask
    if cfg.whiten_rewards:
        rewards = _whiten(rewards, mask, shift_mean=False)
    values = r["values"] * mask
    advantages = torch.zeros_like(values)
    running = torch.zeros(b)
    for i in reversed(range(t)):
        next_value = values[:, i + 1] if i + 1 < t else torch.zeros(b)
        next_mask = mask[:, i + 1] if i + 1 < t else torch.zeros(b)
        delta = rewards[:, i] + cfg.gamma * next_value - values[:, i]
        running = delta + cfg.gamma * cfg.lam * next_mask * running
        advantages[:, i] = running
    advantages = advantages * mask
    returns = (advantages + values) * mask
    if cfg.whiten_advantages:
        advantages = _whiten(advantages, mask)
    return advantages, returns


def torch_ppo_update(policy, value, opt_p, opt_v, r: dict, cfg: ppo.PPOConfig, kl_coef: float,
                     generator: torch.Generator) -> dict[str, float]:
    """`ppo.make_ppo_update`'s math: epochs x minibatches of clipped policy + value loss, one Adam
    step for each model per minibatch. Returns the losses averaged over all minibatch steps."""
    with torch.no_grad():
        advantages, returns = torch_advantages(r, cfg, kl_coef)
    mask = r["response_mask"].float()
    resp = r["response_ids"]
    decoder_ids = torch.cat([torch.zeros_like(resp[:, :1]), resp[:, :-1]], dim=1)  # start id 0
    b = resp.shape[0]
    logs = {"policy_loss": [], "value_loss": [], "policy_entropy": []}
    for _ in range(cfg.epochs):
        order = torch.randperm(b, generator=generator)
        for idx in order.view(cfg.minibatches, -1):
            m = mask[idx]
            logits = policy(input_ids=r["query_ids"][idx], attention_mask=r["query_mask"][idx],
                            decoder_input_ids=decoder_ids[idx], use_cache=False).logits
            logp_all = torch.log_softmax(logits.float(), dim=-1)
            logp = logp_all.gather(-1, resp[idx][..., None])[..., 0]
            logp = torch.where(m > 0, logp, torch.zeros_like(logp))
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            values = value(r["query_ids"][idx], r["query_mask"][idx], decoder_ids[idx])
            values = torch.where(m > 0, values, torch.zeros_like(values))
            ratio = torch.exp(logp - r["logprobs"][idx])
            adv = advantages[idx]
            pg = _masked_mean(torch.maximum(-adv * ratio,
                                            -adv * ratio.clamp(1 - cfg.clip, 1 + cfg.clip)), m)
            old_v, ret = r["values"][idx], returns[idx]
            v_clipped = old_v + (values - old_v).clamp(-cfg.value_clip, cfg.value_clip)
            vf = 0.5 * _masked_mean(torch.maximum((values - ret) ** 2, (v_clipped - ret) ** 2), m)
            loss = pg + cfg.vf_coef * vf
            for opt in (opt_p, opt_v):
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in (opt_p, opt_v):
                opt.step()
            for k, x in zip(logs, (pg, vf, _masked_mean(entropy, m))):
                logs[k].append(float(x.detach()))
    return {k: float(np.mean(v)) for k, v in logs.items()}


def hf_named(params, config) -> dict[str, np.ndarray]:
    """Our T5 parameters (a pure dict) under their Hugging Face names, in torch layout."""
    maps = tensor_maps(config)
    out = {}
    for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
        key = tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)
        out[maps[key].hf_name] = maps[key].to_hf(np.asarray(value, np.float64))
    return out


def relative_update_difference(ours_before, ours_after, torch_before, torch_after) -> float:
    """||delta_ours - delta_torch|| / ||delta_torch|| over the tensors both name."""
    num = den = 0.0
    for name in ours_before.keys() & torch_before.keys():
        d_ours = ours_after[name] - ours_before[name]
        d_torch = torch_after[name] - torch_before[name]
        num += float(np.sum((d_ours - d_torch) ** 2))
        den += float(np.sum(d_torch ** 2))
    return (num / den) ** 0.5 if den else float("nan")


def torch_state(module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().astype(np.float64) for k, v in module.state_dict().items()}


# --------------------------------------------------------------------------- ours


def build(args, root: Path):
    """The config, the models (ours and the torch policy with the same weights), the sampler,
    the jitted update factory: what `train.train_ppo` sets up, on a 1-device mesh."""
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
    overrides += [f"ppo.{k}={getattr(args, k)}" for k in ("epochs", "minibatches",
                                                         "max_question_length")
                  if getattr(args, k) is not None]
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
    mesh = sharding_lib.make_mesh(cfg.mesh)
    tokenizer = Tokenizer.from_pretrained(spm)
    p_config, policy = programs.build_t5(cfg.policy, seed=0, mesh=mesh,
                                         rules=sharding_lib.DEFAULT_RULES, tokenizer=tokenizer,
                                         where="policy")
    graphdef, params = split_model(policy)
    value_graphdef, value_params = split_model(ValueModel.from_t5(policy, seed=2))
    # The state and the update's shardings as `train.train_ppo` assembles them (its outputs keep
    # the inputs' layout, so the sampler and the scorer see the same parameter layout at every
    # step); the update is jitted here without donation, since the benchmark reuses `state0`.
    program = programs.PPOProgram.build(cfg, mesh, graphdef, params, value_graphdef, value_params)
    tx = optim.make_optimizer(o, cfg.run.steps)

    def jit_update(config: ppo.PPOConfig):
        fn = ppo.make_ppo_update(*make_ppo_fns(graphdef, value_graphdef), tx, tx, config)
        return jax.jit(fn, in_shardings=program.in_shardings,
                       out_shardings=(program.state_shardings["ppo"], program.in_shardings[2]))

    reward_fn = train.build_reward_fn(cfg) if args.reward == "pipeline" else stand_in_reward
    sampler = RolloutSampler(FoldedVocabulary(tokenizer), graphdef, value_graphdef, reward_fn,
                             mesh, max_new_tokens=h.max_question_length,
                             temperature=h.temperature, top_k=h.top_k, top_p=h.top_p)
    return SimpleNamespace(
        cfg=cfg, mesh=mesh, tokenizer=tokenizer, p_config=p_config, torch_policy=torch_policy,
        state0=program.init_state()["ppo"], ref_params=copy_params(params),
        ppo_config=h,  # the config's ppo section is the update's ppo.PPOConfig
        jit_update=jit_update, reward_fn=reward_fn, sampler=sampler,
        normalizer=RewardNormalizer(gain=cfg.normalizer.gain, bias=cfg.normalizer.bias))


def compiled_programs(bench) -> int:
    """Traces so far of the jitted programs a step runs (sampling, the reward models' generate
    and judge, the scorer); the update is compiled ahead of time."""
    return traces.count() + bench.sampler.scorer._cache_size()


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
    rewards = sharding_lib.shard_batch(fields["reward"], bench.mesh)
    logprobs, ref_logprobs, values = scored
    r = ppo.Rollout(query_ids=ids, query_mask=mask, response_ids=gen.tokens,
                    response_mask=gen.mask, logprobs=logprobs, ref_logprobs=ref_logprobs,
                    values=values, rewards=rewards)
    return r, {"sample_s": t1 - t0, "reward_s": t2 - t1, "score_s": t3 - t2}, fields


def main() -> None:
    args = parse_args()
    args.torch_threads = sorted({int(n) for n in str(args.torch_threads).split(",")})
    torch.set_num_threads(max(args.torch_threads))
    load_before = load_average()
    b = args.batch
    tmp = tempfile.TemporaryDirectory()
    t0 = time.perf_counter()
    bench = build(args, Path(tmp.name))
    build_s = time.perf_counter() - t0  # includes writing the folders
    cfg, h, ppo_config = bench.cfg, bench.cfg.ppo, bench.ppo_config
    situations = dev_situations((1 + args.warmup_steps + args.steps) * b)

    def step_inputs(i: int):  # batch i of the situations: (batch, texts)
        sits = situations[i * b:(i + 1) * b]
        ids, mask = bench.tokenizer.encode_batch([text_lib.policy_input(s) for s in sits],
                                                 args.query_len, pad_to=args.query_len)
        return {"input_ids": ids, "input_mask": mask}, sits

    key, state0 = jax.random.key(0), bench.state0
    # --- the first step: everything compiles ----------------------------------------------------
    rollout0, first, _ = rollout(bench, state0, *step_inputs(0), jax.random.fold_in(key, 0))
    k_update0 = jax.random.fold_in(key, 10_000)
    t0 = time.perf_counter()
    update = bench.jit_update(ppo_config).lower(state0, rollout0, k_update0).compile()
    update_compile_s = time.perf_counter() - t0
    raw_update_flops = flops_of(update)
    t0 = time.perf_counter()
    one = bench.jit_update(dataclasses.replace(ppo_config, epochs=1, minibatches=1)).lower(
        state0, jax.tree.map(lambda x: x[:b // ppo_config.minibatches], rollout0),
        k_update0).compile()
    one_step_compile_s = time.perf_counter() - t0
    step_flops = flops_of(one)
    update_flops = ppo_config.epochs * ppo_config.minibatches * step_flops
    del one
    t0 = time.perf_counter()
    state1, metrics0 = jax.block_until_ready(update(state0, rollout0, k_update0))
    first["update_s"] = time.perf_counter() - t0

    # --- warm-up, then the timed steps ----------------------------------------------------------
    state = state1
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
    rollout_s = med["sample_s"] + med["score_s"]
    step_s = rollout_s + med["reward_s"] + med["update_s"]
    update_best = min(phases["update_s"][j] for j in clean)
    matmul = matmul_flops_per_s()
    t_resp = int(np.asarray(rollout0.response_ids).shape[1])
    tokens = float(np.mean(response_tokens))
    r_cfg = cfg.rewards
    results = {
        "mode": "quick" if args.quick else "full",
        "load_before": load_before,
        "settings": {
            "policy_and_value": {"d_model": args.d_model, "layers": f"{args.layers}+{args.layers}",
                                 "heads": args.heads, "d_ff": args.d_ff, "vocab": args.vocab,
                                 "family": "v1.0 (relu, tied)", "dtype": "float32",
                                 "weights": "random"},
            "batch": b, "query_len": args.query_len, "max_question_length": h.max_question_length,
            "ppo": dataclasses.asdict(ppo_config), "kl_coef": h.kl_coef, "adaptive_kl": h.adaptive_kl,
            "optimizer": {"name": cfg.optimizer.name, "lr": cfg.optimizer.lr},
            "sampling": {"temperature": h.temperature, "top_p": h.top_p, "top_k": h.top_k},
            "config": str(args.config), "reward": args.reward,
            "reward_models": (f"answerer, fusion, judge: random, the policy's sizes; no NLI; "
                              f"answers {r_cfg.answer_max_length} tokens, fusions "
                              f"{r_cfg.fusion_max_length}, judgment text 32, dropped answers: "
                              f"{r_cfg.dropped_answer}") if args.reward == "pipeline"
            else "stand-in: share of 'wh' words (host, ~0 s)",
            "warmup_steps": args.warmup_steps, "steps_timed": args.steps,
            "jax_threads": "XLA CPU default (all cores)", "torch_threads": args.torch_threads,
            "build_models_s": build_s,
        },
        "first_step_with_compile": {
            **first, "update_compile_s": update_compile_s,
            "compile_estimate_s": {k: first[k] - med[k] for k in ("sample_s", "score_s",
                                                                  "reward_s")},
            "note": "first calls of sampling, scoring and reward include their compiles; the "
                    "update was compiled ahead of time (update_compile_s), then run (update_s)",
        },
        "steady_step": {
            "rollout_s": rollout_s, "sample_s": med["sample_s"], "score_s": med["score_s"],
            "reward_s": med["reward_s"], "update_s": med["update_s"], "step_s": step_s,
            "share": {"rollout": rollout_s / step_s, "reward": med["reward_s"] / step_s,
                      "update": med["update_s"] / step_s},
            "per_phase_all_timed_steps": {k: summary(v) for k, v in phases.items()},
            "new_programs_per_timed_step": new_programs,
            "steps_used": len(clean) if any(n == 0 for n in new_programs) else 0,
            "steps_note": "medians over the timed steps that compiled nothing (else all)",
            "response_tokens_per_step": tokens, "response_token_slots": b * t_resp,
            "tokens_per_s": tokens / step_s,
            "sampling_tokens_per_s": tokens / med["sample_s"],
            "update_tokens_per_s": ppo_config.epochs * b * (args.query_len + t_resp)
            / med["update_s"],
            "tokens_note": "tokens_per_s: sampled question tokens per second of PPO step; "
                           "update: (query + response) tokens x epochs per second",
            "reward_stage_s_last_step": dict(getattr(bench.reward_fn, "timings", {}) or {}),
            "reward_raw_mean_last_step": float(np.mean(fields["raw_reward"])),
        },
        "update": {
            "flops": update_flops, "flops_one_minibatch_step": step_flops,
            "xla_raw_flops_full_update": raw_update_flops,
            "raw_over_one_step": raw_update_flops / step_flops if step_flops else None,
            "flops_method": "cost_analysis() of the update compiled with epochs=1, minibatches=1 "
                            "on one minibatch, x epochs x minibatches (XLA counts a loop body "
                            "once: raw_over_one_step ~ 1)",
            "one_step_compile_s": one_step_compile_s,
            "best_s": update_best, "median_s": med["update_s"],
            "flops_per_s": update_flops / update_best, "matmul_f32_flops_per_s": matmul,
            "fraction_of_matmul_throughput": update_flops / update_best / matmul,
        },
    }
    if not args.no_torch:
        results["torch_update"] = torch_peer(args, bench, rollout0, state0, state1, metrics0,
                                             update_best)
    results["load_after"] = load_average()
    write_results(args.name, results)
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
    tmp.cleanup()


def torch_peer(args, bench, rollout0, state0, state1, metrics0, ours_best_s: float) -> dict:
    """Time the PyTorch update on the first rollout (from the first state: the same weights);
    compare its first update with ours (`state0` -> `state1`, `metrics0`)."""
    ppo_config, p_config, kl_coef = bench.ppo_config, bench.p_config, float(bench.cfg.ppo.kl_coef)
    torch_policy = bench.torch_policy.train()  # dropout is 0: only the mode changes
    torch_value = TorchValue(copy.deepcopy(torch_policy), state0.value_params["head_kernel"],
                             state0.value_params["head_bias"], p_config.scale_decoder_outputs)
    o = bench.cfg.optimizer
    lr, b1, b2, eps = o.lr, o.b1, o.b2, o.eps
    opt_p = torch.optim.Adam(torch_policy.parameters(), lr=lr, betas=(b1, b2), eps=eps)
    opt_v = torch.optim.Adam(torch_value.parameters(), lr=lr, betas=(b1, b2), eps=eps)
    r = {k: torch.from_numpy(np.array(v)) for k, v in rollout0._asdict().items()}
    for k in ("query_ids", "query_mask", "response_ids", "response_mask"):
        r[k] = r[k].long()
    for k in ("logprobs", "ref_logprobs", "values", "rewards"):
        r[k] = r[k].float()
    generator = torch.Generator().manual_seed(0)

    policy_before, value_before = torch_state(torch_policy), torch_state(torch_value)
    t0 = time.perf_counter()
    losses = torch_ppo_update(torch_policy, torch_value, opt_p, opt_v, r, ppo_config, kl_coef,
                              generator)
    first_s = time.perf_counter() - t0
    policy_after, value_after = torch_state(torch_policy), torch_state(torch_value)

    ours = {k: float(metrics0[k]) for k in losses}
    rel_loss = {k: abs(ours[k] - losses[k]) / max(abs(losses[k]), 1e-12) for k in losses}
    # the value trunk has the policy's architecture: the same names under "t5."
    ours_v0 = {f"t5.{k}": v for k, v in hf_named(state0.value_params["trunk"], p_config).items()}
    ours_v1 = {f"t5.{k}": v for k, v in hf_named(state1.value_params["trunk"], p_config).items()}
    for params, named in ((state0.value_params, ours_v0), (state1.value_params, ours_v1)):
        named["head.weight"] = np.asarray(params["head_kernel"], np.float64).T
        named["head.bias"] = np.asarray(params["head_bias"], np.float64)
    agreement = {
        "ours_losses": ours, "torch_losses": losses, "rel_loss_diff": rel_loss,
        "max_rel_loss_diff": max(rel_loss.values()),
        "policy_update_rel_diff": relative_update_difference(
            hf_named(state0.policy_params, p_config), hf_named(state1.policy_params, p_config),
            policy_before, policy_after),
        "value_update_rel_diff": relative_update_difference(ours_v0, ours_v1, value_before,
                                                            value_after),
        "note": "losses averaged over the epochs x minibatches steps of the first update (same "
                "state, same rollout); *_update_rel_diff = ||dtheta_ours - dtheta_torch|| / "
                "||dtheta_torch|| over all parameters after that update (Adam at lr "
                f"{lr:g}: float32 rounding of theta + dtheta and sign flips of Adam's first "
                "steps on near-zero gradients dominate it)",
    }
    del policy_before, value_before, policy_after, value_after
    times = {}
    for n in args.torch_threads:
        torch.set_num_threads(n)
        times[n] = []
        for _ in range(args.torch_repeats):
            t0 = time.perf_counter()
            torch_ppo_update(torch_policy, torch_value, opt_p, opt_v, r, ppo_config, kl_coef,
                             generator)
            times[n].append(time.perf_counter() - t0)
    best_threads = min(times, key=lambda n: min(times[n]) if times[n] else float("inf"))
    best = min(times[best_threads]) if times[best_threads] else first_s
    return {"best_s": best, "best_threads": best_threads, "first_s_with_warmup": first_s,
            "first_threads": max(args.torch_threads),
            "times_s_by_threads": {str(n): t for n, t in times.items()},
            "ratio_torch_over_ours": best / ours_best_s, "agreement": agreement}


if __name__ == "__main__":
    main()
