"""The one idiom of every family's checkpoint map: a `TensorMap` says, for one parameter, which
entries of a Hugging Face tensor (1-D, or 2-D torch [out, in]) make each of ours, as two small
index tables (`rows`, `cols`) over our dimensions; a reshape and transpose, a pick of rows from a
fused tensor and a plain copy are one data structure. `check_tensors` checks a folder against the
maps; `read_into` fills a model, each device reading only the bounding rows / columns of its block."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.core import sharding
from clarifyjax.models.safetensors_io import CheckpointError, TensorSource, check_present


def _gather(block: np.ndarray, axis: int, table: np.ndarray) -> np.ndarray:
    """block with its `axis` replaced by the axes of `table` (offsets into that axis); a reshape
    (no copy) when the table reads the axis in order."""
    flat = table.reshape(-1)
    shape = block.shape[:axis] + table.shape + block.shape[axis + 1:]
    if flat.size == block.shape[axis] and np.array_equal(flat, np.arange(flat.size)):
        return block.reshape(shape)
    return np.take(block, table, axis=axis)


def _in_order(table: np.ndarray, size: int) -> bool:
    return table.size == size and np.array_equal(table.reshape(-1), np.arange(size))


@dataclasses.dataclass(frozen=True, eq=False)
class TensorMap:
    """ours[i] = hf[rows[i_row], cols[i_col]]: `row_dims` / `col_dims` are our dimensions that
    index the Hugging Face tensor's dim 0 / dim 1 (none for a 1-D tensor); `rows` / `cols` are
    int tables over those dimensions, in that order."""

    hf_name: str
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    row_dims: tuple[int, ...]
    rows: np.ndarray
    col_dims: tuple[int, ...] = ()
    cols: np.ndarray | None = None

    def read(self, source: TensorSource, index: tuple | None = None) -> np.ndarray:
        """Our-layout block `index` (unit-step slices over `shape`), reading from the file only
        the bounding rows and columns of the block."""
        index = tuple(index or ()) + (slice(None),) * (len(self.shape) - len(index or ()))
        r = self.rows[tuple(index[d] for d in self.row_dims)]
        hf_index = [slice(int(r.min()), int(r.max()) + 1)]
        if self.col_dims:
            c = self.cols[tuple(index[d] for d in self.col_dims)]
            hf_index.append(slice(int(c.min()), int(c.max()) + 1))
        block = np.asarray(source.get_slice(self.hf_name, tuple(hf_index)))
        block = _gather(block, 0, r - r.min())
        if self.col_dims:
            block = _gather(block, r.ndim, c - c.min())
        return block.transpose(np.argsort(self.row_dims + self.col_dims))

    def to_hf(self, value: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Our layout -> the torch layout of `hf_name`. A map that covers part of the tensor
        (one part of a fused tensor) writes its entries into `out` (the tensor the other parts
        fill) and returns it; without `out`, only a map that covers the whole tensor."""
        value = np.asarray(value)
        tables = [self.rows] + ([self.cols] if self.col_dims else [])
        whole = [t.size for t in tables] == list(self.hf_shape)
        if not whole and out is None:
            raise ValueError(f"{self.hf_name}: the map covers part of the tensor only")
        block = value.transpose(self.row_dims + self.col_dims)  # [*rows.shape, *cols.shape]
        if whole and all(_in_order(t, n) for t, n in zip(tables, self.hf_shape)):
            return block.reshape(self.hf_shape)
        out = np.zeros(self.hf_shape, value.dtype) if out is None else out
        r = self.rows.reshape(self.rows.shape + (1,) * (block.ndim - self.rows.ndim))
        if not self.col_dims:
            out[r] = block
        else:
            out[r, self.cols.reshape((1,) * self.rows.ndim + self.cols.shape)] = block
        return out


def grid(*shape: int, offset: int = 0, stride: int = 1) -> np.ndarray:
    """An index table of `shape` counting offset, offset + stride, ... in C order."""
    return offset + stride * np.arange(math.prod(shape)).reshape(shape)


def reshaped(hf_name: str, hf_shape: tuple[int, ...], view: tuple[int, ...],
             perm: tuple[int, ...], groups: tuple[tuple[int, ...], ...]) -> TensorMap:
    """The map of ours = hf.reshape(view).transpose(perm), `groups[i]` listing the view dims
    (in order) that make Hugging Face dim i: e.g. T5's q [h*d, m] -> ours [m, h, d] is
    view (h, d, m), perm (2, 0, 1), groups ((0, 1), (2,))."""
    if len(groups) not in (1, 2) or len(groups) != len(hf_shape):
        raise ValueError(f"{hf_name}: a tensor map reads 1-D and 2-D tensors only")
    ours_of_view = tuple(int(d) for d in np.argsort(perm))  # view dim -> our dim
    dims, tables = [], []
    for group, size in zip(groups, hf_shape):
        sizes = tuple(view[g] for g in group)
        if math.prod(sizes) != size:
            raise ValueError(f"{hf_name}: view dims {group} of {view} do not make {size}")
        dims.append(tuple(ours_of_view[g] for g in group))
        tables.append(grid(*sizes))
    shape = tuple(view[p] for p in perm)
    if len(groups) == 1:
        return TensorMap(hf_name, tuple(hf_shape), shape, dims[0], tables[0])
    return TensorMap(hf_name, tuple(hf_shape), shape, dims[0], tables[0], dims[1], tables[1])


def same_layout(hf_name: str, shape: tuple[int, ...]) -> TensorMap:
    """A tensor stored as we store it (embeddings, norms, biases)."""
    dims = tuple(range(len(shape)))
    return reshaped(hf_name, shape, shape, dims, tuple((i,) for i in dims))


def vector(hf_name: str, shape: tuple[int, ...]) -> TensorMap:
    """A 1-D tensor (a bias) reshaped to our `shape` ([h * k] -> [h, k])."""
    dims = tuple(range(len(shape)))
    return reshaped(hf_name, (math.prod(shape),), shape, dims, (dims,))


def linear(hf_name: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> TensorMap:
    """A torch `nn.Linear` weight [prod(out_shape), prod(in_shape)] -> ours
    [*in_shape, *out_shape]: transposed, with joined dims split (q [h*k, d] -> [d, h, k], the
    output projection [d, h*k] -> [h, k, d])."""
    n_out, n_in = len(out_shape), len(in_shape)
    outs, ins = tuple(range(n_out)), tuple(range(n_out, n_out + n_in))
    return reshaped(hf_name, (math.prod(out_shape), math.prod(in_shape)),
                    (*out_shape, *in_shape), ins + outs, (outs, ins))


def check_tensors(folder, source: TensorSource, maps: Mapping[tuple, TensorMap], what: str, *,
                  hint: str = "", ignore: Iterable[str] = (), ignore_suffixes: tuple[str, ...] = (),
                  within: tuple[str, ...] = ("",)) -> None:
    """Every tensor that `maps` reads is in `source` with its shape (`check_present`: the
    message names the missing tensors or the tensor and both shapes), and every tensor of
    `source` whose name starts with one of `within` is read by `maps` or ignored (by name or
    suffix): else a CheckpointError naming them, `what` (who asks: "the T5 config") and `hint`
    (which switches to check)."""
    expected: dict[str, tuple] = {}
    for tm in maps.values():  # parts of a fused tensor share its name
        expected.setdefault(tm.hf_name, tm.hf_shape)
    check_present(folder, source, expected, what)
    ignore = set(ignore)
    unexpected = sorted(k for k in source.keys()
                        if k.startswith(within) and k not in expected and k not in ignore
                        and not k.endswith(ignore_suffixes))
    if unexpected:
        raise CheckpointError(
            f"{folder}: {len(unexpected)} tensor(s) {what} does not account for ({hint}): "
            f"{', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''}")


def read_into(abstract: nnx.Module, maps: Mapping[tuple, TensorMap], source: TensorSource,
              param_dtype: str, mesh: jax.sharding.Mesh | None = None, rules=None) -> nnx.Module:
    """`abstract` (a model from `nnx.eval_shape`) with every parameter read through its map
    (`maps[path].read(source, index)`) in `param_dtype`; with a mesh, each parameter is placed by
    the logical axis `rules` (default `sharding.DEFAULT_RULES`) and each device's callback reads
    only its own block."""
    graphdef, abstract_state = nnx.split(abstract)
    flat = list(nnx.to_flat_state(abstract_state))
    unmapped = [p for p, _ in flat if p not in maps]
    if unmapped:  # a bug in the tensor map, not in the checkpoint
        raise AssertionError(f"{type(abstract).__name__} parameters without a Hugging Face "
                             f"name: {unmapped}")
    np_dtype = jnp.dtype(param_dtype)
    if mesh is None:
        values = {p: jnp.asarray(maps[p].read(source).astype(np_dtype)) for p, _ in flat}
    else:
        shardings = sharding.flat_shardings(abstract_state, mesh, rules)
        values = {}
        for p, _ in flat:
            tm, memo = maps[p], {}

            def read(index, tm=tm, memo=memo):
                key = tuple((s.start, s.stop) for s in index)
                if key not in memo:  # replicated dims: several devices ask for the same block
                    memo[key] = tm.read(source, index).astype(np_dtype)
                return memo[key]

            values[p] = jax.make_array_from_callback(tm.shape, shardings[p], read)
    state = nnx.from_flat_state([(p, var.replace(values[p])) for p, var in flat])
    return nnx.merge(graphdef, state)
