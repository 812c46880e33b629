"""Which tensor slices a checkpoint load reads: sharded-load tests check that no device reads a
whole sharded tensor."""
from __future__ import annotations

from clarifyjax.models import safetensors_io


def record_slice_reads() -> list[tuple[str, tuple, tuple]]:
    """Patch `TensorSource.get_slice` in this process; the returned list receives (tensor name,
    shape read, full shape) for every read from then on."""
    reads: list[tuple[str, tuple, tuple]] = []
    get_slice = safetensors_io.TensorSource.get_slice

    def spy(self, name, index):
        out = get_slice(self, name, index)
        reads.append((name, tuple(out.shape), tuple(self.shape(name))))
        return out

    safetensors_io.TensorSource.get_slice = spy
    return reads
