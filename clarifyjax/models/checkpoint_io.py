"""Reading and writing Hugging Face checkpoint folders (safetensors), shared by every model.

Only safetensors are read by default: `pytorch_model.bin` is a pickle and is refused unless the
caller passes `allow_pickle=True`. Tensors are opened lazily, so a sharded load can read just the
slice each device needs.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read as asked; the message names the file or tensor."""


def _dtypes() -> dict[str, np.dtype]:
    import ml_dtypes  # ships with jax

    return {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
            "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
            "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
            "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_)}


class SafetensorsFile:
    """A memory-mapped .safetensors file (8-byte header size, JSON header, raw little-endian data).

    Our own small reader rather than `safetensors.safe_open(framework="numpy")`, which cannot
    represent bfloat16 (the dtype of many released T5 checkpoints). Slicing a tensor touches only
    the pages of the file that the slice covers.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                (n,) = np.frombuffer(f.read(8), dtype="<u8")
                header = json.loads(f.read(int(n)))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.path}: not a readable safetensors file ({e})") from e
        header.pop("__metadata__", None)
        self._start = 8 + int(n)
        self._header = header
        self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        dtypes = _dtypes()
        for name, entry in header.items():
            if entry.get("dtype") not in dtypes:
                raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported dtype "
                                      f"{entry.get('dtype')!r}")

    def keys(self) -> list[str]:
        return list(self._header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._header[name]["shape"])

    def array(self, name: str) -> np.ndarray:
        """A read-only view of the tensor, backed by the file (no read until indexed)."""
        entry = self._header[name]
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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp makes the file 0600; give it the permissions of an ordinary new file.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
