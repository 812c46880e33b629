"""Device mesh, logical axis rules, and placing models and batches on the mesh (t5x style).

Parameters name their dimensions with logical axes (``nnx.with_partitioning(init, ("embed",
"mlp"))``); one rules table maps them onto the mesh axes ``("data", "fsdp", "model")``.

    mesh = make_mesh(MeshConfig(data=-1, fsdp=1, model=2))
    model = create_sharded(lambda: T5(config, rngs=nnx.Rngs(0)), mesh)   # or shard_model
    ids, mask = shard_batch((ids, mask), mesh)"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# data: pure data parallelism (the batch split, parameters replicated); fsdp: the batch split and,
# with FSDP_RULES, parameters split along `embed`, gathered layer by layer by XLA (ZeRO-3); model:
# tensor parallelism (`vocab` / `mlp` / `heads` split). A dimension the chosen mesh axes do not
# divide stays replicated (6 heads on a model axis of 4), so one table serves every model size.
MESH_AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")

# (logical name, mesh axis | tuple of mesh axes | None). A name may appear several times: the first
# candidate whose mesh axes are still free in this spec (and divide the dimension) is used.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("embed", None),
    ("relpos_buckets", None),
    ("length", None),
    ("classes", None),
)
# For models too large to replicate: parameters are also split along `embed` over `fsdp`.
FSDP_RULES: tuple[tuple[str, Any], ...] = tuple(
    (name, "fsdp") if name == "embed" else (name, axes) for name, axes in DEFAULT_RULES)
# The rules tables by the name a config's ``mesh.rules`` gives.
RULES = {"default": DEFAULT_RULES, "fsdp": FSDP_RULES}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the ``(data, fsdp, model)`` mesh axes (one may be -1: all remaining devices) and the
    name of the logical-axis rules table (`RULES`: "fsdp" also splits parameters along embed).

    This is also a run config's ``mesh:`` section (`clarifyjax.config.MeshLayout` is this class):
    `_bounds` and `check` are what the config loader checks there.
    """

    data: int = -1
    fsdp: int = 1
    model: int = 1
    rules: Literal["default", "fsdp"] = "default"

    _bounds: ClassVar = {axis: "== -1 or >= 1" for axis in MESH_AXES}

    def axis_sizes(self) -> dict[str, int]:
        """``{"data": ..., "fsdp": ..., "model": ...}``."""
        return {axis: getattr(self, axis) for axis in MESH_AXES}

    def check(self, at: str) -> None:
        sizes = self.axis_sizes()
        if list(sizes.values()).count(-1) > 1:
            raise ValueError(f"{at}: at most one axis may be -1, got {sizes}")


def _mesh_config(config: MeshConfig | Mapping | None) -> MeshConfig:
    if config is None:
        return MeshConfig()
    if isinstance(config, MeshConfig):
        return config
    if isinstance(config, Mapping):
        unknown = set(config) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"mesh config: unknown axes {sorted(unknown)}; the axes are {MESH_AXES}")
        return MeshConfig(**{k: int(v) for k, v in config.items()})
    raise TypeError(f"mesh config must be a MeshConfig, a mapping or None, got {type(config).__name__}")


def make_mesh(config: MeshConfig | Mapping | None = None, devices: Sequence | None = None) -> Mesh:
    """A ``(data, fsdp, model)`` mesh over `devices` (default: every device of every process).

    Axis types are Auto, so XLA's GSPMD propagates shardings through jitted code.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_sizes(config, len(devices))
    return jax.make_mesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES), devices=devices)


def resolve_sizes(config: MeshConfig | Mapping | None, n_devices: int) -> dict[str, int]:
    """The ``{data, fsdp, model}`` sizes of `config` on `n_devices` devices, the -1 axis filled.

    Raises:
      ValueError: a size below 1 (other than -1), several -1 axes, or sizes that do not match
        the devices.
    """
    sizes = _mesh_config(config).axis_sizes()
    for axis, size in sizes.items():
        if size != -1 and size < 1:
            raise ValueError(f"mesh axis {axis!r} has size {size}; sizes must be >= 1 (or -1 to fill)")
    if list(sizes.values()).count(-1) > 1:
        raise ValueError(f"mesh {sizes}: at most one axis may be -1")
    known = math.prod(s for s in sizes.values() if s != -1)
    if -1 in sizes.values():
        if n_devices % known:
            raise ValueError(f"mesh {sizes}: the fixed axes multiply to {known}, which does not "
                             f"divide the {n_devices} devices")
        return {a: n_devices // known if s == -1 else s for a, s in sizes.items()}
    if known != n_devices:
        raise ValueError(f"mesh {sizes} needs {known} devices, but there are {n_devices}")
    return sizes


def process_sizes(global_sizes: Mapping[str, int], n_local: int) -> dict[str, int]:
    """The layout of one process's own `n_local` devices for models each process runs alone.

    The model-parallel axes keep the global mesh's sizes where they fit in one process
    (``model`` = gcd(model, n_local), then ``fsdp`` = gcd(fsdp, what is left)), and ``data``
    takes the remaining local devices. A parameter is then split as on the global mesh whenever
    its fsdp x model group lies within one host (a v4-32 with fsdp=4: the 4 chips of a host).
    """
    model = math.gcd(int(global_sizes["model"]), n_local)
    fsdp = math.gcd(int(global_sizes["fsdp"]), n_local // model)
    return {"data": n_local // (model * fsdp), "fsdp": fsdp, "model": model}


def process_mesh(config: MeshConfig | Mapping | None = None) -> Mesh:
    """A ``(data, fsdp, model)`` mesh over this process's devices only (`process_sizes` of the
    global layout `config`).

    For models that every process runs on its own rows (the reward models: each host scores the
    questions it sampled): their parameters are sharded like the training mesh shards them, so no
    device holds a whole large model, while the computation never waits on another host.
    """
    sizes = process_sizes(resolve_sizes(config, jax.device_count()), jax.local_device_count())
    return make_mesh(MeshConfig(**sizes), devices=jax.local_devices())


def _as_axes(axes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_mesh_spec(names: Sequence[str | None], rules=DEFAULT_RULES, *,
                         shape: Sequence[int] | None = None, mesh: Mesh | None = None) -> PartitionSpec:
    """Map logical dimension names to a `PartitionSpec` over mesh axes.

    Args:
      names: one logical name (or None: replicated) per dimension, e.g. ``("embed", "mlp")``.
      rules: ``(logical name, mesh axes)`` pairs; the first usable candidate for a name wins.
      shape, mesh: when both are given, a candidate whose mesh axes do not divide the dimension is
        skipped (the dimension ends up replicated if none fits), and mesh axes the mesh lacks are
        dropped.
    Raises:
      ValueError: a name that no rule mentions (a typo would otherwise silently replicate).
    """
    if shape is not None and len(shape) != len(names):
        raise ValueError(f"logical names {tuple(names)} do not match shape {tuple(shape)}")
    candidates: dict[str, list[tuple[str, ...]]] = {}
    for name, axes in rules:
        candidates.setdefault(name, []).append(_as_axes(axes))
    used: set[str] = set()
    spec: list = []
    for dim, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in candidates:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(candidates)}")
        chosen: tuple[str, ...] = ()
        for axes in candidates[name]:
            if mesh is not None:
                axes = tuple(a for a in axes if a in mesh.shape)
            if not axes or used.intersection(axes):
                continue
            if shape is not None and mesh is not None:
                if shape[dim] % math.prod(mesh.shape[a] for a in axes):
                    continue
            chosen = axes
            break
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
    return PartitionSpec(*spec)


def _logical_names(var: nnx.Variable) -> tuple | None:
    names = var.get_metadata().get("out_sharding")
    return None if names is None else tuple(names)


def model_shardings(model_or_state, mesh: Mesh, rules=DEFAULT_RULES):
    """`NamedSharding` of every Variable, as a tree shaped like ``nnx.state(model)``.

    Variables without logical names (RNG state, counters, caches) are replicated.
    """
    state = nnx.state(model_or_state) if isinstance(model_or_state, nnx.Module) else model_or_state

    def sharding(path, var):
        if not isinstance(var, nnx.Variable):  # a bare array in a hand-made tree
            return NamedSharding(mesh, PartitionSpec())
        names, shape = _logical_names(var), tuple(np.shape(var.get_value()))
        if names is None:
            return var.replace(NamedSharding(mesh, PartitionSpec()))
        try:
            spec = logical_to_mesh_spec(names, rules, shape=shape, mesh=mesh)
        except ValueError as e:
            raise ValueError(f"parameter {jax.tree_util.keystr(path)}: {e}") from e
        return var.replace(NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(
        sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def flat_shardings(abstract_state, mesh: Mesh, rules=None) -> dict[tuple, NamedSharding]:
    """`model_shardings` as ``{parameter path: NamedSharding}`` (rules None: DEFAULT_RULES), for
    loaders that place each checkpoint tensor straight into its shards."""
    shardings = nnx.to_flat_state(model_shardings(
        abstract_state, mesh, DEFAULT_RULES if rules is None else rules))
    return {path: s.get_value() if isinstance(s, nnx.Variable) else s for path, s in shardings}


def shard_model(model: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES) -> nnx.Module:
    """Move every Variable of `model` onto `mesh` by the rules, in place; returns `model`."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, model_shardings(state, mesh, rules)))
    return model


def create_sharded(factory: Callable[[], nnx.Module], mesh: Mesh, rules=DEFAULT_RULES) -> nnx.Module:
    """Build ``factory()`` directly in its sharded layout: no device ever holds the whole model.

    The model is traced abstractly (`nnx.eval_shape`) to learn shapes and logical names, then its
    initialization is jitted with those shardings as ``out_shardings``, so each device computes
    only its own shards.
    """
    def build() -> nnx.Module:
        # flax 0.12's `nnx.with_partitioning` (under ``flax_always_shard_variable``) shards a value
        # eagerly when its Variable is created, which fails outside a mesh and ignores our rules:
        # models are built with eager sharding off (or ``eager_sharding=False`` per initializer).
        with nnx.use_eager_sharding(False):
            return factory()

    graphdef, abstract_state = nnx.split(nnx.eval_shape(build))
    shardings = model_shardings(abstract_state, mesh, rules)

    init = jax.jit(lambda: nnx.state(build()), out_shardings=shardings)
    return nnx.merge(graphdef, init())


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading (batch) dimension split over ``("data", "fsdp")``, the rest replicated."""
    axes = tuple(a for a in BATCH_AXES if a in mesh.shape)
    return NamedSharding(mesh, PartitionSpec(axes or None, *([None] * (ndim - 1))))


def row_shards(mesh: Mesh | None) -> int:
    """How many parts `batch_sharding` splits the rows into (1 without a mesh)."""
    return 1 if mesh is None else math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.shape)


def place_rows(x, mesh: Mesh | None) -> jax.Array:
    """One process's array on its own `mesh` (a `process_mesh`), rows split over data x fsdp;
    without a mesh, on the default device.

    Raises:
      ValueError: the rows do not divide into `row_shards(mesh)` parts.
    """
    if mesh is None:
        return jax.numpy.asarray(x)
    x = x if isinstance(x, jax.Array) else np.asarray(x)
    if x.shape[0] % row_shards(mesh):
        raise ValueError(f"{x.shape[0]} rows (shape {x.shape}) do not divide into the "
                         f"{row_shards(mesh)} data x fsdp shards of the mesh {dict(mesh.shape)}")
    return jax.device_put(x, batch_sharding(mesh, x.ndim))


def shard_batch(batch, mesh: Mesh):
    """Place a pytree of arrays (leading dim = batch) on `mesh`, the batch split over data x fsdp.

    With several processes, each passes its own slice of the batch (process-local data) and gets
    back global arrays.
    Raises:
      ValueError: naming the leaf whose batch size the data x fsdp devices do not divide.
    """
    multi_process = jax.process_count() > 1
    split = math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.shape)
    if multi_process:  # each process holds the rows of its own devices
        split = max(1, split // jax.process_count())

    def place(path, x):
        x = x if isinstance(x, jax.Array) else np.asarray(x)
        where = jax.tree_util.keystr(path) or "batch"
        if x.ndim == 0:
            raise ValueError(f"batch leaf {where} is a scalar; every leaf needs a leading batch dim")
        if x.shape[0] % split:
            raise ValueError(f"batch leaf {where} has batch size {x.shape[0]} (shape {x.shape}), "
                             f"not divisible by the {split} data x fsdp shards"
                             f"{' held by this process' if multi_process else ''} of the mesh")
        sharding = batch_sharding(mesh, x.ndim)
        if multi_process:
            return jax.make_array_from_process_local_data(sharding, x)
        return jax.device_put(x, sharding)

    return jax.tree_util.tree_map_with_path(place, batch)
