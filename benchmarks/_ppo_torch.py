"""The PyTorch peer of benchmarks/ppo.py: `ppo.make_ppo_update`'s math (shaped rewards, whitening,
GAE, then epochs x minibatches of policy + value forward/backward and an Adam step for each) on
Hugging Face's T5 with the same weights, timed on the first step's rollout; its losses and
parameter changes are compared with ours."""
from __future__ import annotations

import copy
import time

import _common  # noqa: F401  (puts the repository root on sys.path)

import jax
import numpy as np
import torch

from clarifyjax.rl import ppo
from clarifyjax.models.hf.t5_map import t5_tensor_maps


class TorchValue(torch.nn.Module):
    """HF T5 trunk + scalar head on every decoder position (as `rl.value.ValueModel`)."""

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


def torch_advantages(r: dict, cfg: ppo.PPOUpdateConfig, kl_coef: float):
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


def torch_ppo_update(policy, value, opt_p, opt_v, r: dict, cfg: ppo.PPOUpdateConfig, kl_coef: float,
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
    maps = t5_tensor_maps(config)
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


# --------------------------------------------------------------------------- the peer's run


def torch_rollout(rollout0: ppo.Rollout) -> dict:
    """Our first rollout as torch tensors: ids and masks long, the rest float32."""
    r = {k: torch.from_numpy(np.array(v)) for k, v in rollout0._asdict().items()}
    for k in ("query_ids", "query_mask", "response_ids", "response_mask"):
        r[k] = r[k].long()
    for k in ("logprobs", "ref_logprobs", "values", "rewards"):
        r[k] = r[k].float()
    return r


def named_value_params(value_params, p_config) -> dict[str, np.ndarray]:
    """Our value model's parameters under the names of `TorchValue`'s state dict: the trunk has
    the policy's architecture (the same names under "t5."), then the head."""
    named = {f"t5.{k}": v for k, v in hf_named(value_params["trunk"], p_config).items()}
    named["head.weight"] = np.asarray(value_params["head_kernel"], np.float64).T
    named["head.bias"] = np.asarray(value_params["head_bias"], np.float64)
    return named


def update_agreement(ours: dict, losses: dict, state0, state1, p_config, before: tuple,
                     after: tuple, lr: float) -> dict:
    """Our first update's losses and parameter changes against the PyTorch update's; `before` and
    `after` are the torch (policy, value) states around that update."""
    rel_loss = {k: abs(ours[k] - losses[k]) / max(abs(losses[k]), 1e-12) for k in losses}
    ours_v0 = named_value_params(state0.value_params, p_config)
    ours_v1 = named_value_params(state1.value_params, p_config)
    return {
        "ours_losses": ours, "torch_losses": losses, "rel_loss_diff": rel_loss,
        "max_rel_loss_diff": max(rel_loss.values()),
        "policy_update_rel_diff": relative_update_difference(
            hf_named(state0.policy_params, p_config), hf_named(state1.policy_params, p_config),
            before[0], after[0]),
        "value_update_rel_diff": relative_update_difference(ours_v0, ours_v1, before[1],
                                                            after[1]),
        "note": "losses averaged over the epochs x minibatches steps of the first update (same "
                "state, same rollout); *_update_rel_diff = ||dtheta_ours - dtheta_torch|| / "
                "||dtheta_torch|| over all parameters after that update (Adam at lr "
                f"{lr:g}: float32 rounding of theta + dtheta and sign flips of Adam's first "
                "steps on near-zero gradients dominate it)",
    }


def time_by_threads(args, update) -> dict[int, list[float]]:
    """Seconds of `update()` per PyTorch thread count of `--torch-threads`, `--torch-repeats`
    times each."""
    times = {}
    for n in args.torch_threads:
        torch.set_num_threads(n)
        times[n] = []
        for _ in range(args.torch_repeats):
            t0 = time.perf_counter()
            update()
            times[n].append(time.perf_counter() - t0)
    return times


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
    r = torch_rollout(rollout0)
    generator = torch.Generator().manual_seed(0)

    def update() -> dict[str, float]:
        return torch_ppo_update(torch_policy, torch_value, opt_p, opt_v, r, ppo_config, kl_coef,
                                generator)

    before = torch_state(torch_policy), torch_state(torch_value)
    t0 = time.perf_counter()
    losses = update()
    first_s = time.perf_counter() - t0
    after = torch_state(torch_policy), torch_state(torch_value)
    ours = {k: float(metrics0[k]) for k in losses}
    agreement = update_agreement(ours, losses, state0, state1, p_config, before, after, lr)
    del before, after
    times = time_by_threads(args, update)
    best_threads = min(times, key=lambda n: min(times[n]) if times[n] else float("inf"))
    best = min(times[best_threads]) if times[best_threads] else first_s
    return {"best_s": best, "best_threads": best_threads, "first_s_with_warmup": first_s,
            "first_threads": max(args.torch_threads),
            "times_s_by_threads": {str(n): t for n, t in times.items()},
            "ratio_torch_over_ours": best / ours_best_s, "agreement": agreement}
