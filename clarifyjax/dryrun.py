"""`clarifyjax train CONFIG --dry-run`: the sharded layout and one compiled step, with no weights.

What it does, on whatever devices this process sees (e.g. 8 fake CPU devices):

1. reads the config and builds the run's mesh and rules table (`clarifyjax.sharding`);
2. builds the policy's and the value model's *abstract* state with `jax.eval_shape` (shapes,
   dtypes and logical axis names; not one parameter is allocated, so a T5-large plan runs on a
   laptop), and prints every parameter with its shape, dtype, `PartitionSpec` and bytes per device;
3. reports the bytes per device of the whole run (every model, Adam moments, gradients,
   activations) with `launch/memory_plan.py`'s `plan` (the same numbers as the README's table);
4. lowers and compiles one training step (the PPO update for ``kind: ppo``, the SFT step for
   ``kind: sft``) on abstract inputs carrying their shardings, without running it, and prints
   XLA's memory analysis of the compiled step.

Dry-run options are given like config overrides, with the prefix ``dryrun.``:

* ``dryrun.compile=ppo|sft|none``: which step to compile (default: the config's kind);
* ``dryrun.num_layers=N``: compile the step with N encoder and N decoder layers of the same width
  (the listing and the bytes stay those of the full model). Compiling the full T5-large PPO update
  (24 + 24 layers, policy + value, 4 epochs) on a 2-core CPU takes several minutes; the tests use
  ``dryrun.num_layers=2``;
* ``dryrun.rows=N``: batch rows of the compiled step (default: the config's batch size).

    main("configs/ppo_t5_large.yaml", ["mesh.fsdp=4", "dryrun.num_layers=2"]) -> dict
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from clarifyjax import ppo, sft
from clarifyjax import sharding as sharding_lib
from clarifyjax.config import PPOConfig, load_config
from clarifyjax.models.t5 import T5Config

REPO_ROOT = Path(__file__).resolve().parents[1]
DRYRUN_KEYS = ("compile", "num_layers", "rows")


def _memory_plan():
    """`launch/memory_plan.py` as a module (it is a script, not part of the package)."""
    name = "clarifyjax_launch_memory_plan"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "launch" / "memory_plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(config overrides, dry-run options) from ``key=value`` strings."""
    config_overrides, options = [], {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if key.startswith("dryrun."):
            name = key[len("dryrun."):]
            if not sep or name not in DRYRUN_KEYS:
                raise ValueError(f"dry-run option {item!r}: expected dryrun.KEY=VALUE with KEY in "
                                 f"{DRYRUN_KEYS}")
            options[name] = value
        else:
            config_overrides.append(item)
    return config_overrides, options


def _t5_config(model_cfg, role: str, configs_dir: Path, num_layers: int | None = None
               ) -> tuple[str, T5Config]:
    """(architecture name, T5Config) of a config's model, without reading any weights."""
    mp = _memory_plan()
    name, hf = mp.resolve_architecture(model_cfg, role, configs_dir)
    if "tiny" in hf:
        tiny = dict(hf["tiny"])
        tiny["d_kv"] = tiny["d_kv"] or tiny["d_model"] // tiny["num_heads"]
        config = T5Config(**tiny, dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype)
    else:
        config = T5Config.from_hf(hf, dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype)
    if num_layers is not None:
        config = dataclasses.replace(config, num_layers=num_layers, num_decoder_layers=num_layers)
    return name, config


def abstract_model(kind: str, config: T5Config, mesh, rules) -> tuple[Any, Any, Any]:
    """(graphdef, params, shardings) of a T5 ("t5") or value model ("value"), built with
    `jax.eval_shape` (via `nnx.eval_shape`): params is a pure dict of `jax.ShapeDtypeStruct`
    carrying each parameter's `NamedSharding`; shardings is the matching pure dict."""
    from clarifyjax.models.t5 import T5
    from clarifyjax.policy import ValueModel

    mp = _memory_plan()
    cls = ValueModel if kind == "value" else T5

    def build():
        with nnx.use_eager_sharding(False):
            return cls(config, rngs=mp._ShapeOnlyRngs())

    graphdef, state = nnx.split(nnx.eval_shape(build))
    shardings = nnx.to_pure_dict(sharding_lib.model_shardings(state, mesh, rules))
    values = nnx.to_pure_dict(state)
    params = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
                          values, shardings)
    return graphdef, params, shardings


def parameter_table(role: str, params) -> list[dict]:
    """One row per parameter: name, shape, dtype, spec, bytes (whole) and bytes per device."""
    rows = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        size = math.prod(leaf.shape) * leaf.dtype.itemsize
        shard = leaf.sharding.shard_shape(leaf.shape)
        rows.append({"name": f"{role}{jax.tree_util.keystr(path)}", "shape": list(leaf.shape),
                     "dtype": str(leaf.dtype), "spec": str(leaf.sharding.spec),
                     "bytes": int(size),
                     "bytes_per_device": int(math.prod(shard) * leaf.dtype.itemsize)})
    return rows


def _with_shardings(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def _opt_shardings(tx, opt_state, params, shardings, mesh):
    """Optimizer leaves shaped like their parameter share its sharding; others replicate (the
    rule `clarifyjax.train` uses)."""
    import optax

    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(
        tx, lambda leaf, p, s: s if leaf.shape == p.shape else replicated, opt_state, params,
        shardings, transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, (jax.Array, jax.ShapeDtypeStruct)))


def _batch(mesh, shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding_lib.batch_sharding(mesh, len(shape)))


def lower_ppo_update(cfg, mesh, rules, policy_config: T5Config, rows: int):
    """(jitted update, abstract args) of one PPO update for `cfg` (policy + value models)."""
    from clarifyjax import policy

    pol_def, pol, pol_sh = abstract_model("t5", policy_config, mesh, rules)
    val_def, val, val_sh = abstract_model("value", policy_config, mesh, rules)
    tx = sft.make_optimizer(cfg.optimizer, cfg.run.steps)
    h = cfg.ppo
    update = ppo.make_ppo_update(*policy.make_ppo_fns(pol_def, val_def), tx, tx, ppo.PPOConfig(
        epochs=h.epochs, minibatches=h.minibatches, clip=h.clip, value_clip=h.value_clip,
        vf_coef=h.vf_coef, gamma=h.gamma, lam=h.lam, whiten_advantages=h.whiten_advantages))
    state = jax.eval_shape(lambda p, v: ppo.init_ppo_state(p, v, tx, tx), pol, val)
    replicated = NamedSharding(mesh, PartitionSpec())
    state = ppo.PPOState(
        policy_params=pol, value_params=val,
        policy_opt_state=_with_shardings(state.policy_opt_state, _opt_shardings(
            tx, state.policy_opt_state, pol, pol_sh, mesh)),
        value_opt_state=_with_shardings(state.value_opt_state, _opt_shardings(
            tx, state.value_opt_state, val, val_sh, mesh)),
        kl_ctl=jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                            state.kl_ctl),
        step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated))
    s, t = cfg.policy.max_input_length, h.max_question_length
    rollout = ppo.Rollout(
        query_ids=_batch(mesh, (rows, s), jnp.int32), query_mask=_batch(mesh, (rows, s), jnp.int32),
        response_ids=_batch(mesh, (rows, t), jnp.int32),
        response_mask=_batch(mesh, (rows, t), jnp.int32),
        logprobs=_batch(mesh, (rows, t), jnp.float32),
        ref_logprobs=_batch(mesh, (rows, t), jnp.float32),
        values=_batch(mesh, (rows, t), jnp.float32), scores=_batch(mesh, (rows,), jnp.float32))
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)
    return jax.jit(update, donate_argnums=(0,)), (state, rollout, key)


def lower_sft_step(cfg, mesh, rules, model_config: T5Config, model_cfg, rows: int):
    """(jitted step, abstract args) of one SFT step (one micro-batch of `rows` rows)."""
    graphdef, params, shardings = abstract_model("t5", model_config, mesh, rules)
    tx = sft.make_optimizer(cfg.optimizer, cfg.run.steps)
    state = jax.eval_shape(lambda p: sft.init_state(p, tx, 0), params)
    replicated = NamedSharding(mesh, PartitionSpec())
    state = sft.SFTState(
        params=params,
        opt_state=_with_shardings(state.opt_state, _opt_shardings(tx, state.opt_state, params,
                                                                  shardings, mesh)),
        step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
        rng=jax.ShapeDtypeStruct(state.rng.shape, state.rng.dtype, sharding=replicated))
    s, t = model_cfg.max_input_length, model_cfg.max_target_length

    def micro(shape, dtype):  # [a=1, b, ...]: the batch is the second axis
        spec = PartitionSpec(None, tuple(a for a in sharding_lib.BATCH_AXES if a in mesh.shape),
                             *([None] * (len(shape) - 2)))
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    batch = {"input_ids": micro((1, rows, s), jnp.int32), "input_mask": micro((1, rows, s), jnp.int32),
             "target_ids": micro((1, rows, t), jnp.int32),
             "target_mask": micro((1, rows, t), jnp.int32),
             "example_mask": micro((1, rows), jnp.int32)}
    return jax.jit(sft.make_train_step(graphdef, tx), donate_argnums=(0,)), (state, batch)


def _fmt_bytes(n: float) -> str:
    return f"{n / 2 ** 20:.2f} MiB" if n < 2 ** 30 else f"{n / 2 ** 30:.2f} GiB"


def main(config_path: str, overrides: Sequence[str] = (), *, say: Callable[[str], None] = print
         ) -> dict:
    """Run the dry run; print the report (through `say`) and return it as a JSON-ready dict:
    ``{config, devices, mesh, rules, parameters: [{name, shape, dtype, spec, bytes,
    bytes_per_device}], plan (memory_plan.plan, PPO only), compiled: {step, num_layers, rows,
    seconds, memory}}``."""
    config_overrides, options = split_overrides(overrides)
    cfg = load_config(config_path, config_overrides)
    configs_dir = Path(config_path).resolve().parent
    mesh = sharding_lib.make_mesh(cfg.mesh.axis_sizes())
    rules = sharding_lib.RULES[cfg.mesh.rules]
    is_ppo = isinstance(cfg, PPOConfig)
    say(f"[dry-run] {config_path}: {jax.device_count()} {jax.default_backend()} device(s), mesh "
        f"{dict(mesh.shape)}, rules {cfg.mesh.rules}")

    # 1. every parameter of the trained models, with its sharding
    model_cfg = cfg.policy if is_ppo else cfg.model
    arch, model_config = _t5_config(model_cfg, "policy" if is_ppo else "model", configs_dir)
    roles = [("policy", "t5"), ("value", "value")] if is_ppo else [("model", "t5")]
    table = []
    for role, kind in roles:
        _, params, _ = abstract_model(kind, model_config, mesh, rules)
        table += parameter_table(role, params)
    width = max(len(r["name"]) for r in table)
    for r in table:
        say(f"  {r['name']:<{width}}  {str(tuple(r['shape'])):>16}  {r['dtype']:<8}  "
            f"{r['spec']:<40}  {_fmt_bytes(r['bytes_per_device'])}/device")
    n_params = sum(math.prod(r["shape"]) for r in table)
    say(f"[dry-run] {len(table)} parameters ({n_params:,} values, {arch}); "
        f"{_fmt_bytes(sum(r['bytes_per_device'] for r in table))} per device of "
        f"{_fmt_bytes(sum(r['bytes'] for r in table))}")
    report: dict[str, Any] = {"config": str(config_path), "devices": jax.device_count(),
                              "mesh": dict(mesh.shape), "rules": cfg.mesh.rules,
                              "architecture": arch, "parameters": table}

    # 2. bytes per device of the whole run (memory_plan's accounting)
    if is_ppo:
        mp = _memory_plan()
        hardware = mp.Hardware(f"this mesh ({jax.device_count()} {jax.default_backend()})",
                               jax.device_count(), 1, jax.local_device_count())
        plan = mp.plan(cfg, hardware, configs_dir)
        plan.pop("hbm_bytes"), plan.pop("fraction_of_hbm")
        for key, value in plan["components"].items():
            say(f"  {key:<40} {_fmt_bytes(value)}")
        say(f"[dry-run] total per device: {_fmt_bytes(plan['total_bytes'])}")
        report["plan"] = plan

    # 3. one compiled step
    step_kind = options.get("compile", "ppo" if is_ppo else "sft")
    if step_kind not in ("ppo", "sft", "none"):
        raise ValueError(f"dryrun.compile={step_kind!r}: expected ppo, sft or none")
    if step_kind == "ppo" and not is_ppo:
        raise ValueError(f"dryrun.compile=ppo needs a PPO config; {config_path} is kind "
                         f"{cfg.kind!r}")
    if step_kind != "none":
        layers = int(options["num_layers"]) if "num_layers" in options else None
        _, step_config = _t5_config(model_cfg, "policy", configs_dir, layers)
        if "rows" in options:
            rows = int(options["rows"])
        elif is_ppo:
            rows = cfg.ppo.batch_size
        else:
            rows = cfg.data.batch_size
        start = time.perf_counter()
        if step_kind == "ppo":
            fn, args = lower_ppo_update(cfg, mesh, rules, step_config, rows)
        else:
            fn, args = lower_sft_step(cfg, mesh, rules, step_config, model_cfg, rows)
        compiled = fn.lower(*args).compile()
        seconds = time.perf_counter() - start
        memory = {}
        analysis = compiled.memory_analysis()
        for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                      "generated_code_size_in_bytes"):
            if analysis is not None and hasattr(analysis, field):
                memory[field] = int(getattr(analysis, field))
        say(f"[dry-run] compiled one {step_kind} step ({step_config.num_layers} + "
            f"{step_config.num_decoder_layers} layers, {rows} rows) in {seconds:.1f} s; not run. "
            f"XLA per device: " + ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in memory.items()))
        report["compiled"] = {"step": step_kind, "num_layers": step_config.num_layers,
                              "rows": rows, "seconds": seconds, "memory": memory}
    return report


if __name__ == "__main__":  # python -m clarifyjax.dryrun CONFIG [key=value ...]
    result = main(sys.argv[1], sys.argv[2:])
    print(json.dumps({k: v for k, v in result.items() if k != "parameters"}, default=str)[:2000])
