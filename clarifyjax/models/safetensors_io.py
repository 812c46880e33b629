"""Reading and writing Hugging Face checkpoint folders: the safetensors reader (our own mmap
reader, checked against the file size) and writer, the config.json reader, shared by every model.

Only safetensors are read by default: `pytorch_model.bin` is a pickle and is refused unless the
caller passes `allow_pickle=True`. Tensors are opened lazily, so a sharded load can read just the
slice each device needs.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from collections.abc import Iterator, Mapping

import numpy as np

from clarifyjax.core.ranges import within
from clarifyjax.files.textfiles import atomic_write_bytes


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read as asked; the message names the file or tensor."""


def _dtypes() -> dict[str, np.dtype]:
    import ml_dtypes  # ships with jax

    return {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
            "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
            "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
            "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_)}


MAX_HEADER_BYTES = 100 * 2 ** 20  # the safetensors format's own limit on the JSON header


def _read_header(path: Path) -> tuple[dict, int, int]:
    """(header without __metadata__, data start, data size) of a safetensors file, every claim
    of the header checked against the file's size before anything is allocated or mapped: a
    header length past the end would otherwise ask for that many bytes (MemoryError), and a
    short data section would fail later in a reshape that names no file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file: {size} bytes, shorter than "
                                      "the 8-byte header length")
            n = int(np.frombuffer(head, dtype="<u8")[0])
            if n > size - 8 or n > MAX_HEADER_BYTES:
                raise CheckpointError(f"{path}: not a safetensors file (truncated?): the header "
                                      f"length {n} exceeds the {size - 8} bytes after it"
                                      + (f" or the format's {MAX_HEADER_BYTES}-byte limit"
                                         if n > MAX_HEADER_BYTES else ""))
            text = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the safetensors file ({e})") from e
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: the safetensors header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is a JSON "
                              f"{type(header).__name__}, not an object of tensors")
    header.pop("__metadata__", None)
    _check_entries(path, header, size - 8 - n)
    return header, 8 + n, size - 8 - n


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_entries(path: Path, header: dict, data_size: int) -> None:
    """Each tensor's dtype, shape and data offsets against the data section, and no overlaps."""
    dtypes, spans = _dtypes(), []
    for name, entry in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: header entry is {entry!r}, not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in dtypes:
            raise CheckpointError(f"{where} has unsupported dtype {dtype!r} "
                                  f"(known: {', '.join(dtypes)})")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of sizes >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_count(o) for o in offsets)):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} is not [begin, end]")
        begin, end = offsets
        if begin > end or end > data_size:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] lie outside the "
                                  f"{data_size} data bytes of the file (truncated?)")
        expected = math.prod(shape) * dtypes[dtype].itemsize
        if end - begin != expected:
            raise CheckpointError(f"{where}: {end - begin} data bytes, but shape {shape} of "
                                  f"{dtype} needs {expected}")
        spans.append((begin, end, name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise CheckpointError(f"{path}: tensor {second!r} overlaps tensor {first!r} "
                                  f"(data_offsets)")


class SafetensorsFile:
    """A memory-mapped .safetensors file (8-byte header size, JSON header, raw little-endian data).

    Our own small reader rather than `safetensors.safe_open(framework="numpy")`, which cannot
    represent bfloat16 (the dtype of many released T5 checkpoints). Slicing a tensor touches only
    the pages of the file that the slice covers. The header is checked whole when the file is
    opened (`_read_header`): every error is a `CheckpointError` naming the file and the tensor.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._header, self._start, _ = _read_header(self.path)
        self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")

    def keys(self) -> list[str]:
        return list(self._header)

    def _entry(self, name: str) -> dict:
        if name not in self._header:  # e.g. an index's weight_map that names the wrong file
            raise CheckpointError(f"{self.path}: no tensor {name!r} in this file")
        return self._header[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)["shape"])

    def array(self, name: str) -> np.ndarray:
        """A read-only view of the tensor, backed by the file (no read until indexed)."""
        entry = self._entry(name)
        begin, end = entry["data_offsets"]
        raw = self._mmap[self._start + begin:self._start + end]
        return raw.view(_dtypes()[entry["dtype"]]).reshape(entry["shape"])


def safetensors_bytes(tensors: Mapping[str, np.ndarray], metadata: dict | None = None) -> bytes:
    """Serialize numpy arrays (bfloat16 included) in the safetensors format."""
    codes = {v: k for k, v in _dtypes().items()}
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    chunks, offset = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in codes:
            raise CheckpointError(f"tensor {name!r}: dtype {a.dtype} cannot be saved")
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the data start to 8 bytes
    return np.uint64(len(head)).astype("<u8").tobytes() + head + b"".join(chunks)


def check_folder(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint folder not found: {path}")
    if not path.is_dir():
        raise CheckpointError(f"expected a checkpoint folder, got a file: {path}")
    return path


def read_config(path: str | os.PathLike) -> dict:
    folder = check_folder(path)
    cfg = folder / "config.json"
    if not cfg.exists():
        raise CheckpointError(f"no config.json in {folder}")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg}: invalid JSON at line {e.lineno}: {e.msg}") from e


def check_config_numbers(hf: Mapping, path, ranges: Mapping[str, str]) -> None:
    """The numeric fields of a model's config.json against `ranges` (field -> bound, as
    `clarifyjax.core.ranges.within`; an "int" prefix also asks for an integer): a NaN epsilon or a
    zero size would otherwise load and give NaN outputs or a shape error far from the file.
    Absent or null fields pass (the model's defaults apply)."""
    for name, bound in ranges.items():
        value = hf.get(name)
        if value is None:
            continue
        integer = bound.startswith("int ")
        bound = bound[4:] if integer else bound
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (integer and not float(value).is_integer()) or not within(value, bound):
            kind = "an integer" if integer else "a finite number"
            raise CheckpointError(f"{path}: field {name!r} is {value!r}; must be {kind} {bound}")


class TensorSource:
    """Lazy access to the tensors of a checkpoint folder, by Hugging Face name.

    `get(name)` returns a full numpy array; `get_slice(name, index)` reads only `index`
    (a tuple of slices), which is what a sharded load uses per device.
    """

    def __init__(self, folder: str | os.PathLike, *, allow_pickle: bool = False):
        self.folder = check_folder(folder)
        self._files: dict[str, Path] = {}  # tensor name -> file
        self._handles: dict[Path, object] = {}
        self._torch_state: dict | None = None
        single = self.folder / "model.safetensors"
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: not a safetensors index ({e})") from e
            for name, fname in weight_map.items():
                self._files[name] = self.folder / fname
            for f in set(self._files.values()):
                if not f.exists():
                    raise CheckpointError(f"{index} names {f.name}, which is missing")
        elif single.exists():
            self._handles[single] = SafetensorsFile(single)
            for name in self._handles[single].keys():
                self._files[name] = single
        elif (self.folder / "pytorch_model.bin").exists():
            if not allow_pickle:
                raise CheckpointError(
                    f"{self.folder} holds only pytorch_model.bin, a pickle that can run arbitrary "
                    "code when loaded; convert it to safetensors, or pass allow_pickle=True if you "
                    "trust its source")
            import torch  # only on explicit request

            state = torch.load(self.folder / "pytorch_model.bin", map_location="cpu",
                               weights_only=False)
            self._torch_state = {k: v.float().numpy() for k, v in state.items()}
            for name in self._torch_state:
                self._files[name] = self.folder / "pytorch_model.bin"
        else:
            raise CheckpointError(
                f"no model.safetensors or model.safetensors.index.json in {self.folder}")

    def keys(self) -> list[str]:
        return list(self._files)

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def _handle(self, name: str):
        if name not in self._files:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint in {self.folder}")
        f = self._files[name]
        if f not in self._handles:
            self._handles[f] = SafetensorsFile(f)
        return self._handles[f]

    def shape(self, name: str) -> tuple[int, ...]:
        if self._torch_state is not None:
            return tuple(self._torch_state[name].shape)
        return self._handle(name).shape(name)

    def get(self, name: str) -> np.ndarray:
        if self._torch_state is not None:
            if name not in self._torch_state:
                raise CheckpointError(f"tensor {name!r} is missing from the checkpoint in {self.folder}")
            return self._torch_state[name]
        return np.array(self._handle(name).array(name))

    def get_slice(self, name: str, index: tuple) -> np.ndarray:
        if self._torch_state is not None:
            return self.get(name)[index]
        return np.array(self._handle(name).array(name)[index])


def check_shape(name: str, actual: tuple, expected: tuple) -> None:
    if tuple(actual) != tuple(expected):
        raise CheckpointError(
            f"tensor {name!r} has shape {tuple(actual)} in the checkpoint but the model expects "
            f"{tuple(expected)}")


def check_present(folder, source, expected: Mapping[str, tuple], what: str) -> None:
    """Every tensor of `expected` (Hugging Face name -> shape) is in `source` with that shape;
    the message names the missing tensors (the first 8) or the tensor with the wrong shape.
    `what` says who asks for them ("the llama config")."""
    missing = sorted(name for name in expected if name not in source)
    if missing:
        raise CheckpointError(f"{folder}: {len(missing)} tensor(s) that {what} asks for are "
                              f"missing from the checkpoint: {', '.join(missing[:8])}"
                              f"{' ...' if len(missing) > 8 else ''}")
    for name, shape in expected.items():
        check_shape(name, source.shape(name), shape)


def write_checkpoint(folder: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                     config: dict) -> Path:
    """Write `model.safetensors` + `config.json` into `folder` (each atomically)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / "model.safetensors", safetensors_bytes(tensors))
    atomic_write_bytes(folder / "config.json", (json.dumps(config, indent=2) + "\n").encode())
    return folder


def iter_names(source: TensorSource, prefix: str) -> Iterator[str]:
    return (k for k in source.keys() if k.startswith(prefix))
