"""A spy on the checkpoint reader, for the sharded-load tests' children: `record_reads()`
patches `TensorSource.get_slice` so that every read is appended, as (tensor name, shape read,
full shape), to the list it returns."""
from __future__ import annotations

from clarifyjax.models import safetensors_io


def record_reads() -> list[tuple[str, tuple, tuple]]:
    reads: list[tuple[str, tuple, tuple]] = []
    get_slice = safetensors_io.TensorSource.get_slice

    def spy(self, name, index):
        out = get_slice(self, name, index)
        reads.append((name, tuple(out.shape), tuple(self.shape(name))))
        return out

    safetensors_io.TensorSource.get_slice = spy
    return reads
