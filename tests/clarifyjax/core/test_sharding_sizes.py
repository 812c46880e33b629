"""`sharding.process_sizes` and `sharding.resolve_sizes`: the mesh a process gets of a run's layout.

Each process of a PPO run scores its own rows, so `train.build_reward_fn` loads the answerer,
fusion model, judge and NLI filter onto the process's devices (`sharding.process_mesh`). That the
reward models then lie on such a mesh, each device holding only its slice, and that the sharded
pipeline gives the unsharded pipeline's outputs, is checked in test_pipeline.py (in a child
with 8 fake CPU devices), beside the unsharded pipeline it is compared with: computed once there,
not a second time in the child. Here: `process_sizes` for the layouts a pod run meets.
"""
from __future__ import annotations

import pytest

from clarifyjax.core import sharding


@pytest.mark.parametrize("global_sizes, n_local, expected", [
    ({"data": 4, "fsdp": 4, "model": 1}, 4, {"data": 1, "fsdp": 4, "model": 1}),   # v4-32, fsdp 4
    ({"data": 1, "fsdp": 16, "model": 1}, 4, {"data": 1, "fsdp": 4, "model": 1}),  # fsdp over hosts
    ({"data": 2, "fsdp": 2, "model": 2}, 8, {"data": 2, "fsdp": 2, "model": 2}),   # one host
    ({"data": 1, "fsdp": 2, "model": 4}, 4, {"data": 1, "fsdp": 1, "model": 4}),
    ({"data": 8, "fsdp": 1, "model": 1}, 8, {"data": 8, "fsdp": 1, "model": 1}),
    ({"data": 1, "fsdp": 3, "model": 1}, 4, {"data": 4, "fsdp": 1, "model": 1}),
])
def test_process_sizes(global_sizes, n_local, expected):
    assert sharding.process_sizes(global_sizes, n_local) == expected


def test_resolve_sizes_fills_and_checks():
    assert sharding.resolve_sizes({"fsdp": 2, "model": 2}, 16) == {"data": 4, "fsdp": 2, "model": 2}
    with pytest.raises(ValueError, match="does not divide the 6 devices"):
        sharding.resolve_sizes({"fsdp": 4}, 6)
