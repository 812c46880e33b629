"""Every key of every shipped config does something, or the loader refuses it.

The test walks every leaf of every file in clarifyjax/presets/ (defaults included), changes it to another
valid value (an ``a.b.c=value`` override), and requires either a `ConfigError` naming the key, or
a change in the runtime object that the key configures. Runtime objects, per section, built by
the code the loops use where there is such code (no weights read, no forward pass):

* model roles: the `T5Config` that `builders.build_t5` returns (with `load_t5` stubbed to record
  its arguments), the tokenizer folder, and the padded lengths of its dataset columns; a
  decoder-only policy's prompt (`builders.policy_tokenizer`, `CausalPolicyText` stubbed);
* reward models: every loader call and the `PipelineConfig` of `loops.build_reward_fn` (the
  model loaders stubbed to record their arguments);
* ppo: the fields of the update's `ppo.PPOUpdateConfig` (the section is one), the KL controller and the
  rollout sampler's arguments as `loops.train_ppo` builds them;
* optimizer: three updates of `programs.make_optimizer` on a small parameter tree (lr, schedule,
  moments, decay, clipping all show in them);
* data: what `pairs.load_sft_pairs` / `load_ppo_situations` read (stubbed readers) and return;
* normalizer: `ppo_eval.fit_normalizer`'s normalizer, or the number of batches it fits on;
* mesh: the axis sizes and the rules table.

Keys read only by the loops (`LOOP_KEYS`: run.*, batch sizes, shuffling, micro-batches) are
checked differently: the list must cover every `RunConfig` field, and loops.py must read each.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from clarifyjax.core.buckets import column_buckets
from clarifyjax.config import ConfigError, PPOConfig, RunConfig, config_from_dict, load_config
from clarifyjax.config.loader import read_yaml, within
from helpers.env import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "clarifyjax" / "presets").glob("*.yaml"))
STRUCTURAL = {"kind"}  # picks the schema itself
LOOP_KEYS = {f"run.{f.name}" for f in dataclasses.fields(RunConfig)} | {
    "data.batch_size", "data.eval_batch_size", "data.shuffle", "ppo.batch_size",
    "ppo.samples_per_situation", "ppo.eval_samples", "ppo.eval_schedule",
    "optimizer.grad_accum", "optimizer.label_smoothing"}


def test_loop_keys_cover_run_and_are_read_by_the_loops():
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert {k.split(".", 1)[1] for k in LOOP_KEYS if k.startswith("run.")} == run_fields
    # The loops and the programs they compile (clarifyjax/training/programs.py) read these keys.
    source = "".join((REPO_ROOT / "clarifyjax" / "training" / f).read_text()
                     for f in ("loops.py", "programs.py", "builders.py"))
    for key in sorted(LOOP_KEYS):
        name = key.split(".", 1)[1]
        if name in ("name", "output_dir"):  # read through RunConfig.directory
            assert "run.directory" in source
            continue
        assert re.search(rf"\.{name}\b", source), f"neither loops.py nor programs.py reads {key}"


# --------------------------------------------------------------------------- leaves and values


def _leaves(cfg, at=""):
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        key, value = f"{at}.{f.name}" if at else f.name, getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, key)
        elif key not in STRUCTURAL:
            yield key, hints[f.name], value, getattr(type(cfg), "_bounds", {}).get(f.name)


def _text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return str(value)


def _other(tp, value, bound):
    """Another valid value for a field of type `tp` (None: leave the leaf alone)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
        typing.Union, getattr(__import__("types"), "UnionType", None)) else [tp]
    tp = args[0]
    if dataclasses.is_dataclass(tp):
        return None  # an absent section: its keys are walked by the schema tests
    if typing.get_origin(tp) is typing.Literal:
        return [v for v in typing.get_args(tp) if v != value][-1]
    if tp is bool:
        return not value
    if tp in (int, float):
        base = [] if value is None else [value + 2, value - 2, value * 2] if tp is int else [
            value * 1.5, value / 2, value + 0.1, value - 0.1]
        candidates = base + [1, 2, 8, 0.5, 0.25, 0]
        return next(tp(c) for c in candidates if (tp is float or float(c).is_integer())
                    and c != value and (bound is None or within(tp(c), bound)))
    if tp is str:
        return "elsewhere" if value is None else value + "_2"
    if typing.get_origin(tp) is tuple:
        if typing.get_args(tp)[0] is str:
            return ("x",) + tuple(value[1:])
        if not value:
            return (4,)
        return ((value[0] // 2,) + value) if value[0] > 1 else value + (value[-1] * 2,)
    raise AssertionError(f"no other value for {tp}")


# --------------------------------------------------------------------------- runtime objects


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, name, result=None):
        def record(*args, **kwargs):
            kwargs.pop("mesh", None), kwargs.pop("rules", None)
            self.calls.append((name, tuple(map(str, args)), tuple(sorted(
                (k, str(v)) for k, v in kwargs.items()))))
            return result
        return record


@functools.cache
def _concrete_t5():
    """A trunk of real (zero) arrays for `ValueModel.from_t5`, which copies it: its values do not
    matter here, only the new head's, and zeros need no random initializer compiled per shape."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from clarifyjax.models.t5 import T5, T5Config

    config = T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), state))


@functools.cache
def _tiny_t5(dtype, param_dtype):
    from flax import nnx

    from clarifyjax.models.t5 import T5, T5Config

    config = T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2,
                      dtype=dtype, param_dtype=param_dtype)
    return config, nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0)))  # abstract: no compile


@functools.cache
def _pairs(n):
    from clarifyjax import data

    return [data.Pair(f"in {i}", f"out {i}", f"g{i // 2}") for i in range(n)]


@pytest.fixture(scope="module")
def stubs():
    """Loaders that record their arguments instead of reading weights or files."""
    from clarifyjax.data import pairs  # the module whose readers the run calls

    from clarifyjax.reward import judge
    from clarifyjax.reward import nli
    from clarifyjax.training import builders
    from clarifyjax.reward import pipeline
    from clarifyjax.decoding import seq2seq
    from clarifyjax.core import sharding
    from clarifyjax.training import loops
    rec = _Recorder()
    mp = pytest.MonkeyPatch()

    def load_t5(path, *, dtype="float32", param_dtype=None, precision="default", **_):
        rec("load_t5")(path, dtype=dtype, param_dtype=param_dtype, precision=precision)
        return _tiny_t5(dtype, param_dtype or dtype)

    def read_pairs(path, task, **kw):
        rec("read_pairs")(path, task, **kw)
        return _pairs(600 if str(path).endswith("/dev.tsv") else 5000)  # rows to cut

    def read_table(path, columns, **kw):
        rec("read_table")(path, columns)
        rows = [{"situation": f"s {i}"} for i in range(900)]
        return pairs.Table(path, tuple(columns), rows, list(range(2, 902)))

    mp.setattr(builders, "load_t5", load_t5)
    mp.setattr(sharding, "create_sharded", lambda *a, **k: None)
    mp.setattr(sharding, "process_mesh", lambda *a, **k: None)
    # Paths are only recorded: a changed path names a file that does not exist.
    mp.setattr(pairs, "resolve_data_path", lambda path, option=None: Path(path))
    mp.setattr(pairs, "read_pairs", read_pairs)
    mp.setattr(pairs, "read_table", read_table)
    mp.setattr(seq2seq.Seq2SeqModel, "from_pretrained", rec("seq2seq"))
    mp.setattr(judge, "load_judge", rec("judge"))
    mp.setattr(pipeline, "load_judge", rec("judge"))  # imported by name there
    mp.setattr(nli.NLIFilter, "from_pretrained", rec("nli"))
    mp.setattr(pipeline, "RewardPipeline", lambda *a: a)
    mp.setattr(loops, "RolloutSampler", rec("sampler"))
    mp.setattr(builders, "CausalPolicyText", rec("policy_text"))
    mp.setattr(builders, "check_causal_lm_folder",
               lambda *a, **k: (SimpleNamespace(eos_token_ids=(2,)), None, None))
    yield rec
    mp.undo()


def _recorded(rec, fn, *args):
    start = len(rec.calls)
    out = fn(*args)
    return out, tuple(rec.calls[start:])


def _t5(rec, model_cfg):
    from clarifyjax.training import builders

    if model_cfg is None:
        return None
    (config, _), calls = _recorded(rec, lambda: builders.build_t5(
        model_cfg, seed=0, mesh=None, rules=None))
    return config, calls


@functools.cache  # sections are frozen: most leaves leave these alone
def _optimizer_trace(opt, steps):
    """Three updates of a 2x3 matrix and a vector (tiny grads, so eps shows) with grads of
    norms 100, 1 and 10 (so clipping changes the moments), and the schedule over the run."""
    import jax.numpy as jnp

    from clarifyjax.training import programs

    schedule = programs.make_schedule(opt, steps)
    out = [float(schedule(c)) for c in np.linspace(0, steps - 1, 9)]
    tx = programs.make_optimizer(opt, steps)
    params = {"w": jnp.ones((2, 3)), "b": jnp.full((3,), 0.5)}
    state = tx.init(params)
    for scale in (100.0, 1.0, 10.0):
        grads = {"w": jnp.full((2, 3), scale / 2.5), "b": jnp.full((3,), scale * 1e-9)}
        updates, state = tx.update(grads, state, params)
        out += [np.asarray(u).tobytes() for u in (updates["w"], updates["b"])]
    return tuple(out)


def _runtime(cfg, rec) -> dict:
    from clarifyjax import data

    from clarifyjax.training import builders, ppo_eval, programs
    from clarifyjax.core import sharding
    from clarifyjax.training import loops
    rt = {"mesh": (cfg.mesh.axis_sizes(), sharding.RULES[cfg.mesh.rules]),
          "optimizer": _optimizer_trace(cfg.optimizer, cfg.run.steps)}
    if not isinstance(cfg, PPOConfig):
        m = cfg.model
        rt["model"] = (_t5(rec, m), m.tokenizer_path)
        rt["lengths"] = tuple(column_buckets(cfg.data.length_buckets, n)
                              for n in (m.max_input_length, m.max_target_length))
        rt["data"] = _recorded(rec, data.load_sft_pairs, cfg.data, cfg.task)
        return rt
    h, p = cfg.ppo, cfg.policy
    rt["policy"] = (_t5(rec, p), p.tokenizer_path,
                    column_buckets(cfg.data.length_buckets, p.max_input_length))
    try:  # a decoder-only policy's prompt (rl.prompts), or the run's refusal of the setting
        family = builders.check_policy_family(cfg)
        rt["policy_text"] = (_recorded(rec, builders.policy_tokenizer, cfg, family)
                             if family == "causal" else family)
    except ConfigError as e:
        rt["policy_text"] = str(e)
    rt["reference"], rt["value"] = _t5(rec, cfg.reference), _t5(rec, cfg.value.model)
    value = builders.build_value(cfg, _concrete_t5())  # as build_ppo_models
    rt["value_head"] = tuple(np.asarray(p[...]).tobytes() for p in (value.head_kernel, value.head_bias))
    from clarifyjax.rl import ppo  # what make_ppo_update reads of the section: its PPOConfig fields

    rt["ppo"] = tuple(getattr(h, f.name) for f in dataclasses.fields(ppo.PPOUpdateConfig))
    rt["kl"] = programs.kl_controller(h)  # as train_ppo builds it
    models = builders.PPOModels(*[None] * len(builders.PPOModels._fields))
    rt["sampler"] = _recorded(rec, loops._sampler, cfg, None, models, "reward_fn", None)
    rt["rewards"] = _recorded(rec, loops.build_reward_fn, cfg)
    n = cfg.normalizer
    rt["normalizer"] = ("fit", n.fit_batches) if n.fit else ppo_eval.fit_normalizer(
        cfg, None, None, None, print)
    rt["data"] = _recorded(rec, data.load_ppo_situations, cfg.data)
    return rt


def _changed(base_repr: dict, runtime: dict) -> bool:
    """Whether any runtime object differs from the base's (compared by repr; the base's reprs are
    made once per config, and the comparison stops at the first difference)."""
    return any(base_repr[k] != repr(v) for k, v in runtime.items())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_leaf_is_consumed_or_refused(path, stubs):
    base_cfg, raw = load_config(path), read_yaml(path)  # what load_config does, parsed once
    base = {k: repr(v) for k, v in _runtime(base_cfg, stubs).items()}
    dead, walked = [], 0
    for key, tp, value, bound in _leaves(base_cfg):
        other = _other(tp, value, bound)
        if other is None:
            continue
        item = f"{key}={_text(other)}"
        walked += 1
        try:
            cfg = config_from_dict(raw, [item], source=str(path))
        except ConfigError as e:
            message = re.sub(r"override '.*?' \(config .*?\)", "", str(e))
            assert key in message or key.rsplit(".", 1)[0] in message, (item, str(e))
            continue
        if key in LOOP_KEYS:
            continue
        if not _changed(base, _runtime(cfg, stubs)):
            dead.append(item)
    assert walked > 40
    assert not dead, f"{path.name}: accepted but changes nothing: {dead}"
