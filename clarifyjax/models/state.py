"""A model as its training state sees it: an NNX module <-> (graphdef, pure dict of arrays).

Pure dicts are what the jitted steps, optax and orbax see; ``graphdef`` is static. `split_model`
and `merge_model` go between the two; `copy_params` gives the frozen reference its own buffers;
`shape_only` builds a model's shapes without allocating it.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Params = Any  # a nested dict of arrays (nnx.to_pure_dict of a model's state)
DTYPES = ("float32", "bfloat16", "float16")  # the compute and storage dtypes of every model
# The precision of a model's matmuls (a run config's ``precision``): "default" is JAX's (one
# bfloat16 pass on TPU and TF32 on recent NVIDIA GPUs, float32 operands included), "high" (three
# bfloat16 passes on TPU) and "highest" (float32 products, as PyTorch computes in float32).
PRECISIONS = ("default", "high", "highest")


def set_dtype_fields(config, family: str) -> None:
    """Normalize a frozen model config's `dtype` and `param_dtype` fields to dtype names
    (jnp.bfloat16 -> "bfloat16"); ValueError naming the field when not one of `DTYPES`."""
    for field in ("dtype", "param_dtype"):
        value = getattr(config, field)
        try:
            name = jnp.dtype(value).name
        except TypeError:
            name = str(value)
        if name not in DTYPES:
            raise ValueError(f"{family} config field {field!r} is {value!r}; "
                             f"allowed values: {', '.join(DTYPES)}")
        object.__setattr__(config, field, name)


def check_precision(config, family: str) -> None:
    """ValueError naming the field when a model config's `precision` is not one of `PRECISIONS`."""
    if config.precision not in PRECISIONS:
        raise ValueError(f"{family} config field 'precision' is {config.precision!r}; "
                         f"allowed values: {', '.join(PRECISIONS)}")


def matmul_precision(name: str):
    """The context in which every matmul and einsum traced runs at precision `name` (one of
    `PRECISIONS`): `jax.default_matmul_precision`, which the lowered program records on each
    `dot_general`; "default" leaves the process's setting alone."""
    if name not in PRECISIONS:
        raise ValueError(f"matmul precision {name!r}; allowed values: {', '.join(PRECISIONS)}")
    return contextlib.nullcontext() if name == "default" else jax.default_matmul_precision(name)


def honours_precision(method):
    """A model method that runs under `matmul_precision(self.config.precision)`."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with matmul_precision(self.config.precision):
            return method(self, *args, **kwargs)
    return run


def split_model(model: nnx.Module) -> tuple[Any, Params]:
    """(graphdef, params as a pure nested dict of arrays). Raises if the module holds anything but
    parameters (an RNG stream or a cache would be silently dropped from training state)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leftover = jax.tree.leaves(rest)
    if leftover:
        raise ValueError(f"{type(model).__name__} holds {len(leftover)} non-parameter variables; "
                         "the training state carries parameters only")
    return graphdef, nnx.to_pure_dict(params)


def merge_model(graphdef, params: Params) -> nnx.Module:
    """The module back from `split_model`'s pieces (cheap: no copy of the arrays)."""
    return nnx.merge(graphdef, params)


def copy_params(params: Params) -> Params:
    """A new buffer for every leaf (the frozen reference must not alias donated arrays)."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True), params)


class ShapeOnlyRngs:
    """Stands in for `nnx.Rngs` when only shapes matter: every parameter gets the same key.

    With a real `nnx.Rngs`, each key drawn inside the trace updates a counter Variable, and flax
    0.12.8 then asks the tracer for its sharding, for which jax 0.10 builds an error message by
    walking the whole trace, which makes tracing T5-large several times slower. The models use their
    rngs only through ``rngs.params()``; anything else fails loudly here.
    """

    def __init__(self):
        self._key = jax.random.key(0)

    def params(self):
        return self._key


def shape_only(cls: type, config) -> nnx.Module:
    """`cls(config)` with `jax.ShapeDtypeStruct`s for arrays (`nnx.eval_shape`): nothing is
    allocated, so the dry run and the memory plan can list T5-large on any machine."""
    def build():
        with nnx.use_eager_sharding(False):
            return cls(config, rngs=ShapeOnlyRngs())

    return nnx.eval_shape(build)
