"""`clarifyjax train CONFIG --dry-run`: the sharded layout and one compiled step, with no weights.

It checks every input the run would read (`check_run_inputs`), lists each parameter with its
sharding and bytes per device, plans the run's memory and compiles the run's own training step
on abstract inputs; options are ``dryrun.*`` overrides (listed above `main`).

    main("clarifyjax/presets/ppo_t5_large.yaml", ["mesh.fsdp=4", "dryrun.num_layers=2"]) -> dict"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

import jax

from clarifyjax.training import memory_plan, builders, programs, run_record

from clarifyjax.core import sharding
from clarifyjax.config import CLASSIFIER_TASKS, ConfigError, PPOConfig, load_config
from clarifyjax.core.commands import one_line
from clarifyjax.models.causal_lm import CausalLMConfig
from clarifyjax.models.hf.causal_lm_map import config_from_hf
from clarifyjax.models.t5 import T5Config
from clarifyjax.models.hf import (check_causal_lm_folder, check_classifier_folder, check_t5_folder,
                                  load_encoder_tokenizer)
from clarifyjax.text.tokenizer import CausalTokenizer, Tokenizer
from clarifyjax import data

DRYRUN_KEYS = ("compile", "num_layers", "rows", "check_models")


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


def _model_roles(cfg) -> list[tuple[str, Any, str]]:
    """(option, `ModelConfig`, kind) of every model the run reads: kind "t5" (a T5 and its
    tokenizer), "t5-weights" (a T5 whose tokens are the policy's), "causal" / "causal-weights"
    (the same for a decoder-only policy) or "classifier"."""
    if not isinstance(cfg, PPOConfig):
        return [("model", cfg.model, "classifier" if cfg.task in CLASSIFIER_TASKS else "t5")]
    r = cfg.rewards
    policy = "causal" if builders.model_family(cfg.policy) == "causal" else "t5"
    weights = f"{policy}-weights"
    roles = [("policy", cfg.policy, policy), ("reference", cfg.reference, weights),
             ("value.model", cfg.value.model, weights), ("rewards.answerer", r.answerer, "t5"),
             ("rewards.fusion", r.fusion, "t5"),
             ("rewards.judge.model", r.judge.model, "t5" if r.judge.kind == "t5" else "classifier"),
             ("rewards.nli", r.nli, "classifier")]
    return [role for role in roles if role[1] is not None]


def _check_model(option: str, model_cfg, kind: str) -> list[str]:
    """The problems of one model folder and of its tokenizer, read as the run reads them without
    a weight, each naming its option."""
    problems, vocab = [], None
    if model_cfg.tiny is not None:
        vocab = model_cfg.tiny.vocab_size
    try:
        if model_cfg.init is not None and kind == "classifier":
            config = check_classifier_folder(model_cfg.init)
            load_encoder_tokenizer(model_cfg.init, model_cfg.max_input_length, config.vocab_size)
        elif model_cfg.init is not None and kind.startswith("causal"):
            check_causal_lm_folder(model_cfg.init, dtype=model_cfg.dtype)
            if kind == "causal":
                CausalTokenizer(model_cfg.tokenizer_path)
            return problems
        elif model_cfg.init is not None:
            vocab = check_t5_folder(model_cfg.init, dtype=model_cfg.dtype)[0].vocab_size
    except (OSError, ValueError) as e:  # CheckpointError: a ValueError naming file and field
        problems.append(f"{option}.init: {one_line(str(e))}")
    if kind != "t5":
        return problems
    at = f"{option}.tokenizer" if model_cfg.tokenizer is not None else f"{option}.init"
    try:
        tokenizer = Tokenizer.from_pretrained(model_cfg.tokenizer_path)
        if vocab is not None and tokenizer.vocab_size > vocab:
            problems.append(f"{at}: the tokenizer {model_cfg.tokenizer_path} has "
                            f"{tokenizer.vocab_size} tokens but the model's vocab_size is {vocab}")
    except (OSError, ValueError) as e:
        if not problems or at != f"{option}.init":  # the folder's own problem is said once
            problems.append(f"{at}: {one_line(str(e))}")
    return problems


def _fewer_than_a_batch(cfg, rows: int) -> list[str]:
    """The problem of a training set smaller than one batch, which the run finds only once it
    has built its models (`data.BatchIterator`)."""
    if isinstance(cfg, PPOConfig):
        need = cfg.ppo.batch_size // cfg.ppo.samples_per_situation
        if rows < need:
            return [f"data.train_path: {rows} training situations, fewer than one batch of {need} "
                    "(ppo.batch_size / ppo.samples_per_situation)"]
    elif rows < cfg.data.batch_size:
        return [f"data.train_path: {rows} training pairs, fewer than one batch "
                f"(data.batch_size = {cfg.data.batch_size})"]
    return []


def check_run_inputs(cfg, *, models: bool = True) -> dict[str, list[str]]:
    """Every input `cfg`'s run would read, read and checked as the run does, with no weight
    loaded: its data files, and with `models` its model folders and tokenizers (`_check_model`),
    then a resume's recorded settings (`run_record.check_resume`). Returns what was checked,
    {"data": [...], "models": [...]} (options).

    Raises:
      ConfigError: one line naming every option whose input is missing or bad.
    """
    problems: list[str] = []
    done: dict[str, list[str]] = {"data": [], "models": []}
    try:
        if isinstance(cfg, PPOConfig):
            train, _ = data.load_ppo_situations(cfg.data)
        else:
            train, _ = data.load_sft_pairs(cfg.data, cfg.task)
        done["data"] = [f"data.{f}" for f in ("train_path", "dev_path")
                        if getattr(cfg.data, f, None) is not None]
        problems += _fewer_than_a_batch(cfg, len(train))
    except (ValueError, OSError) as e:  # DataError: a ValueError naming the file and line
        text = one_line(str(e))
        named = [f"data.{f}" for f in ("train_path", "dev_path")
                 if getattr(cfg.data, f, None) and Path(getattr(cfg.data, f)).name in text]
        problems.append(text if text.startswith("data.") else f"{(named or ['data'])[0]}: {text}")
    for option, model_cfg, kind in _model_roles(cfg) if models else ():
        found = _check_model(option, model_cfg, kind)
        problems += found
        done["models"] += [] if found else [option]
    if problems:
        raise ConfigError(f"the run's inputs: {'; '.join(problems)}",
                          key=problems[0].partition(":")[0])
    run_record.check_resume(cfg, lambda line: None)
    return done


def _t5_config(model_cfg, role: str, configs_dir: Path, num_layers: int | None = None
               ) -> tuple[str, T5Config | CausalLMConfig]:
    """(architecture name, T5Config, or a decoder-only policy's CausalLMConfig) of a config's
    model, without reading any weights."""
    name, hf = memory_plan.resolve_architecture(model_cfg, role, configs_dir)
    if memory_plan.is_causal(hf):
        config = config_from_hf(hf, f"{role}: {name}", dtype=model_cfg.dtype,
                                param_dtype=model_cfg.param_dtype)
        layers = {} if num_layers is None else {"num_layers": num_layers}
    else:
        config = builders.t5_config(model_cfg, hf)
        layers = ({} if num_layers is None else
                  {"num_layers": num_layers, "num_decoder_layers": num_layers})
    return name, dataclasses.replace(config, **layers)


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


def lower_ppo_update(cfg, mesh, rules, policy_config: T5Config, value_config: T5Config | None,
                     rows: int) -> jax.stages.Lowered:
    """One PPO update of `cfg`, lowered on abstract arguments: the `programs.PPOProgram` that
    `loops.train_ppo` runs, for a rollout of `rows` rows of full-length queries (`value_config`
    None: the update of ``ppo.algorithm`` rloo or grpo, which has no value model)."""
    graphdef, params = builders.abstract_model("t5", policy_config, mesh, rules)
    value_graphdef = value_params = None  # rloo, grpo: no value model
    if value_config is not None:
        value_graphdef, value_params = builders.abstract_model("value", value_config, mesh, rules)
    program = programs.PPOProgram.build(cfg, mesh, graphdef, params, value_graphdef, value_params)
    rollout = program.abstract_batch(rows, cfg.policy.max_input_length, cfg.ppo.sampling.max_new_tokens)
    return program.lower(program.abstract_state()["ppo"], rollout, program.abstract_key())


def lower_sft_step(cfg, mesh, rules, model_config: T5Config, model_cfg, rows: int
                   ) -> jax.stages.Lowered:
    """One SFT step of `cfg`, lowered on abstract arguments: the `programs.SFTProgram` that
    `loops.train_sft` runs, for ``grad_accum`` micro-batches of `rows` full-length rows."""
    graphdef, params = builders.abstract_model("t5", model_config, mesh, rules)
    program = programs.SFTProgram.build(cfg, mesh, graphdef, params,
                                        dropout=model_config.dropout_rate > 0)
    batch = program.abstract_batch(rows, model_cfg.max_input_length, model_cfg.max_target_length)
    return program.lower(program.abstract_state(), batch)


def _fmt_bytes(n: float) -> str:
    return f"{n / 2 ** 20:.2f} MiB" if n < 2 ** 30 else f"{n / 2 ** 30:.2f} GiB"


def _models(cfg, configs_dir: Path, num_layers: int | None = None
            ) -> list[tuple[str, str, str, T5Config]]:
    """[(role, kind, architecture, T5Config)] of the trained models: the policy and the value
    model of a PPO config (no value model for ``ppo.algorithm`` rloo or grpo), the model of an
    SFT config."""
    if not isinstance(cfg, PPOConfig):
        return [("model", "t5", *_t5_config(cfg.model, "model", configs_dir, num_layers))]
    policy = ("policy", "t5", *_t5_config(cfg.policy, "policy", configs_dir, num_layers))
    if cfg.ppo.algorithm != "ppo":
        return [policy]
    value_cfg = cfg.value.model or cfg.policy
    return [policy, ("value", "value", *_t5_config(value_cfg, "value", configs_dir, num_layers))]


def _list_parameters(models, mesh, rules, say) -> list[dict]:
    table = []
    for role, kind, _, config in models:
        table += parameter_table(role, builders.abstract_model(kind, config, mesh, rules)[1])
    width = max(len(r["name"]) for r in table)
    for r in table:
        say(f"  {r['name']:<{width}}  {str(tuple(r['shape'])):>16}  {r['dtype']:<8}  "
            f"{r['spec']:<40}  {_fmt_bytes(r['bytes_per_device'])}/device")
    n_params = sum(math.prod(r["shape"]) for r in table)
    say(f"[dry-run] {len(table)} parameters ({n_params:,} values, {models[0][2]}); "
        f"{_fmt_bytes(sum(r['bytes_per_device'] for r in table))} per device of "
        f"{_fmt_bytes(sum(r['bytes'] for r in table))}")
    return table


def _plan(cfg, configs_dir: Path, say) -> dict | None:
    """`memory_plan.plan` of a PPO config on this process's devices (None when it cannot size
    the run, e.g. tiny random models: said why)."""
    hardware = memory_plan.Hardware(f"this mesh ({jax.device_count()} {jax.default_backend()})",
                                    jax.device_count(), 1, jax.local_device_count())
    try:
        plan = memory_plan.plan(cfg, hardware, configs_dir)
    except memory_plan.PlanError as e:
        say(f"[dry-run] no memory plan: {e}")
        return None
    plan.pop("hbm_bytes"), plan.pop("fraction_of_hbm")
    for key, value in plan["components"].items():
        say(f"  {key:<40} {_fmt_bytes(value)}")
    say(f"[dry-run] total per device: {_fmt_bytes(plan['total_bytes'])}")
    return plan


def _compile(cfg, step_kind: str, options: dict, mesh, rules, configs_dir: Path, say) -> dict:
    """Lower and compile (not run) one step; its XLA memory analysis and the program's hash."""
    layers = int(options["num_layers"]) if "num_layers" in options else None
    models = _models(cfg, configs_dir, layers)
    config = models[0][3]
    rows = int(options.get("rows", cfg.ppo.batch_size if isinstance(cfg, PPOConfig)
                           else cfg.data.batch_size))
    start = time.perf_counter()
    if step_kind == "ppo":
        lowered = lower_ppo_update(cfg, mesh, rules, config,
                                   models[1][3] if len(models) > 1 else None, rows)
    elif not isinstance(config, T5Config):
        raise ValueError("dryrun.compile=sft: the policy is a decoder-only model; the SFT step "
                         "is a T5's (give dryrun.compile=ppo)")
    else:
        model_cfg = cfg.policy if isinstance(cfg, PPOConfig) else cfg.model
        lowered = lower_sft_step(cfg, mesh, rules, config, model_cfg, rows)
    text = lowered.as_text()
    analysis = lowered.compile().memory_analysis()
    seconds = time.perf_counter() - start
    memory = {field: int(getattr(analysis, field)) for field in (
        "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
        "generated_code_size_in_bytes") if analysis is not None and hasattr(analysis, field)}
    layers = (f"{config.num_layers} + {config.num_decoder_layers}"
              if isinstance(config, T5Config) else f"{config.num_layers}")
    say(f"[dry-run] compiled one {step_kind} step ({layers} layers, {rows} rows) in "
        f"{seconds:.1f} s; not run. "
        f"XLA per device: " + ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in memory.items()))
    return {"step": step_kind, "num_layers": config.num_layers, "rows": rows, "seconds": seconds,
            "memory": memory, "lowered_sha256": hashlib.sha256(text.encode()).hexdigest()}


# What the dry run does, on whatever devices this process sees (e.g. 8 fake CPU devices):
# 0. `check_run_inputs`: all problems in one error, each naming its option; with
#    dryrun.check_models=false (model folders not there yet, sized by name) only the data files;
# 1. the run's mesh and rules table; 2. every model's abstract state (`jax.eval_shape`: not one
#    parameter allocated, so a T5-large plan runs on a laptop), each parameter listed with its
#    shape, dtype, PartitionSpec and bytes per device; 3. the run's bytes per device
#    (`memory_plan.plan`); 4. one training step lowered and compiled on abstract inputs with their
#    shardings, not run, and XLA's memory analysis of it. The step is the run's own
#    (`training.programs`), so the dry run lowers the program the run executes (batches padded to
#    the longest bucket; the report's lowered_sha256 of its StableHLO lets one check).
# Options, given like overrides: dryrun.compile=ppo|sft|none (default: the config's kind);
# dryrun.num_layers=N (compile with N encoder and N decoder layers of the same width; the listing
# and bytes stay the full model's: the full T5-large PPO update takes minutes to compile on a small
# CPU, the tests use 2); dryrun.rows=N (default: the batch size); dryrun.check_models=true|false.
def main(config_path: str, overrides: Sequence[str] = (), *, say: Callable[[str], None] = print
         ) -> dict:
    """Run the dry run; print the report (through `say`) and return it as a JSON-ready dict:
    ``{config, devices, mesh, rules, parameters: [{name, shape, dtype, spec, bytes,
    bytes_per_device}], plan (memory_plan.plan, PPO only), compiled: {step, num_layers, rows,
    seconds, memory, lowered_sha256 (of the step's StableHLO text)}}``."""
    config_overrides, options = split_overrides(overrides)
    cfg = load_config(config_path, config_overrides)
    check = options.get("check_models", "true").lower()
    if check not in ("true", "false"):
        raise ValueError(f"dryrun.check_models={options['check_models']!r}: expected true or false")
    checked = check_run_inputs(cfg, models=check == "true")  # 0. before anything is built
    configs_dir = Path(config_path).resolve().parent
    mesh = sharding.make_mesh(cfg.mesh)
    rules = sharding.RULES[cfg.mesh.rules]
    is_ppo = isinstance(cfg, PPOConfig)
    if not is_ppo and cfg.task in CLASSIFIER_TASKS:
        raise ConfigError(f"task: {cfg.task!r} trains an encoder classifier, which the dry run "
                          "does not size yet (it lowers T5 programs); run it without --dry-run",
                          key="task")
    step_kind = options.get("compile", "ppo" if is_ppo else "sft")
    if step_kind not in ("ppo", "sft", "none"):
        raise ValueError(f"dryrun.compile={step_kind!r}: expected ppo, sft or none")
    if step_kind == "ppo" and not is_ppo:
        raise ValueError(f"dryrun.compile=ppo needs a PPO config; {config_path} is kind "
                         f"{cfg.kind!r}")
    say(f"[dry-run] {config_path}: inputs checked: {', '.join(checked['data'])}"
        + (f"; {', '.join(checked['models'])}" if check == "true" else
           " (dryrun.check_models=false: model folders not checked)"))
    say(f"[dry-run] {config_path}: {jax.device_count()} {jax.default_backend()} device(s), mesh "
        f"{dict(mesh.shape)}, rules {cfg.mesh.rules}")
    models = _models(cfg, configs_dir)  # 1. every parameter of the trained models, sharded
    report: dict[str, Any] = {"config": str(config_path), "inputs": checked,
                              "devices": jax.device_count(),
                              "mesh": dict(mesh.shape), "rules": cfg.mesh.rules,
                              "architecture": models[0][2],
                              "parameters": _list_parameters(models, mesh, rules, say)}
    if is_ppo:  # 2. bytes per device of the whole run (memory_plan's accounting)
        report["plan"] = _plan(cfg, configs_dir, say)
    if step_kind != "none":  # 3. the step the run executes, compiled and not run
        report["compiled"] = _compile(cfg, step_kind, options, mesh, rules, configs_dir, say)
    return report


if __name__ == "__main__":  # python -m clarifyjax.training.dryrun CONFIG [key=value ...]
    result = main(sys.argv[1], sys.argv[2:])
    print(json.dumps({k: v for k, v in result.items() if k != "parameters"}, default=str)[:2000])
