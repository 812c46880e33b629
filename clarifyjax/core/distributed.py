"""Multi-host start: one JAX process per host (or per GPU), joined by `jax.distributed.initialize`.

Call `initialize()` first, before any other JAX call (JAX refuses to join a cluster once its
backend is up); it reads explicit arguments, ``CLARIFYJAX_*`` variables or a cluster JAX detects.
Writes that must happen once go through `is_primary()` or `primary_only`; orbax checkpoints are
not primary-only: every process takes part in a sharded save or restore."""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
from typing import TypeVar
from collections.abc import Callable, Mapping, Sequence

import jax
from jax.experimental import multihost_utils

ENV_COORDINATOR = "CLARIFYJAX_COORDINATOR"
ENV_NUM_PROCESSES = "CLARIFYJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "CLARIFYJAX_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "CLARIFYJAX_LOCAL_DEVICE_IDS"

# What jax's SlurmCluster requires before it recognizes a SLURM step (jax/_src/clusters).
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
               "SLURM_LOCALID")
_GOOGLE_PCI_VENDOR_ID = "0x1ae0"  # TPU chips on a Cloud TPU VM

F = TypeVar("F", bound=Callable)


class DistributedError(ValueError):
    """A multi-process setting that cannot work; the message names the flag or variable."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process was started.

    ``source``: "single" (one process), "explicit" (arguments), "env" (CLARIFYJAX_* variables),
    "slurm" / "ompi" / "tpu" (JAX's cluster detection), or "external" (someone else had already
    called `jax.distributed.initialize`). ``num_processes`` / ``process_id`` are None where only
    JAX's detection knows them (a TPU VM without worker variables); after `initialize` they are
    filled in from the running cluster. ``local_device_ids`` (the devices this process drives,
    e.g. its GPU) reach JAX only in a multi-process start; a single process sees every device
    that CUDA_VISIBLE_DEVICES lets it see.
    """

    source: str
    num_processes: int | None
    process_id: int | None
    coordinator_address: str | None = None
    local_device_ids: tuple[int, ...] | None = None

    @property
    def multi_process(self) -> bool:
        """Whether `jax.distributed.initialize` is (or was) needed."""
        return self.num_processes is None or self.num_processes > 1


_launch: Launch | None = None  # what `initialize` did in this process


# --------------------------------------------------------------------------- detection (pure)


def _int(value, name: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise DistributedError(f"{name} must be an integer, got {value!r}") from None


def _device_ids(value, name: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts:
            return None
        return tuple(_int(p, name) for p in parts)
    return tuple(_int(v, name) for v in value)


def _count_list(value: str | None) -> int:
    return len([h for h in (value or "").split(",") if h.strip()])


def has_tpu_chips() -> bool:
    """Whether TPU chips are attached to this machine (Google's PCI vendor id; no JAX call)."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR_ID:
                    return True
        except OSError:
            continue
    return False


def detect_launch(coordinator_address: str | None = None, num_processes: int | None = None,
                  process_id: int | None = None,
                  local_device_ids: int | Sequence[int] | str | None = None, *,
                  environ: Mapping[str, str] | None = None,
                  tpu_chips: bool | None = None) -> Launch:
    """Decide how this process was started, without touching JAX (in `initialize`'s order).

    Args:
      coordinator_address, num_processes, process_id, local_device_ids: explicit settings; any
        one of the first three switches to explicit mode, which then needs all three (when
        ``num_processes > 1``), taking the missing ones from the CLARIFYJAX_* variables.
      environ: the environment to read (default `os.environ`).
      tpu_chips: whether TPU chips are attached (default: `has_tpu_chips()`).
    Raises:
      DistributedError: a value that is not an integer, a process id outside
        ``[0, num_processes)``, or a missing coordinator / process id, naming the argument and
        the variable that would provide it.
    """
    env = os.environ if environ is None else environ
    explicit = any(v is not None for v in (coordinator_address, num_processes, process_id))
    from_env = any(env.get(k) for k in (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID))
    devices = _device_ids(local_device_ids, "local_device_ids")
    if devices is None:
        devices = _device_ids(env.get(ENV_LOCAL_DEVICE_IDS), ENV_LOCAL_DEVICE_IDS)

    if explicit or from_env:
        source = "explicit" if explicit else "env"
        coord = coordinator_address or env.get(ENV_COORDINATOR) or None
        n = num_processes if num_processes is not None else env.get(ENV_NUM_PROCESSES)
        pid = process_id if process_id is not None else env.get(ENV_PROCESS_ID)
        if n is None or str(n).strip() == "":
            raise DistributedError(f"the number of processes is missing: pass num_processes "
                                   f"(--num-processes) or set {ENV_NUM_PROCESSES}")
        n = _int(n, "num_processes" if num_processes is not None else ENV_NUM_PROCESSES)
        if n < 1:
            raise DistributedError(f"num_processes must be >= 1, got {n}")
        if n == 1:
            return Launch("single", 1, 0, None, devices)
        if pid is None or str(pid).strip() == "":
            raise DistributedError(f"{n} processes but no process id: pass process_id "
                                   f"(--process-id) or set {ENV_PROCESS_ID}")
        pid = _int(pid, "process_id" if process_id is not None else ENV_PROCESS_ID)
        if not 0 <= pid < n:
            raise DistributedError(f"process id {pid} is outside [0, {n}) "
                                   f"(num_processes = {n})")
        if not coord:
            raise DistributedError(f"{n} processes but no coordinator: pass coordinator_address "
                                   f"(--coordinator, host:port of process 0) or set "
                                   f"{ENV_COORDINATOR}")
        host, sep, port = str(coord).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise DistributedError(f"coordinator address {coord!r} must look like host:port")
        return Launch(source, n, pid, str(coord), devices)

    if all(k in env for k in _SLURM_VARS):
        n = _int(env.get("SLURM_STEP_NUM_TASKS") or env["SLURM_NTASKS"], "SLURM_NTASKS")
        if n > 1:
            return Launch("slurm", n, _int(env["SLURM_PROCID"], "SLURM_PROCID"), None, devices)
        return Launch("single", 1, 0, None, devices)

    if env.get("OMPI_COMM_WORLD_SIZE") and "OMPI_MCA_orte_hnp_uri" in env:
        n = _int(env["OMPI_COMM_WORLD_SIZE"], "OMPI_COMM_WORLD_SIZE")
        if n > 1:
            pid = _int(env.get("OMPI_COMM_WORLD_RANK", "0"), "OMPI_COMM_WORLD_RANK")
            return Launch("ompi", n, pid, None, devices)
        return Launch("single", 1, 0, None, devices)

    workers = _count_list(env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES"))
    slices = _int(env.get("MEGASCALE_NUM_SLICES") or 1, "MEGASCALE_NUM_SLICES")
    if env.get("MEGASCALE_COORDINATOR_ADDRESS") or slices > 1:
        return Launch("tpu", None, None, None, None)  # multislice: JAX reads MEGASCALE_*
    if workers > 1:
        pid = env.get("TPU_WORKER_ID")
        return Launch("tpu", workers, None if pid is None else _int(pid, "TPU_WORKER_ID"))
    if workers == 1:
        return Launch("single", 1, 0, None, devices)
    if env.get("TPU_SKIP_MDS_QUERY") is None and (
            has_tpu_chips() if tpu_chips is None else tpu_chips):
        return Launch("tpu", None, None)  # a TPU VM: only the metadata server knows the workers
    return Launch("single", 1, 0, None, devices)


# --------------------------------------------------------------------------- the start


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None,
               local_device_ids: int | Sequence[int] | None = None, *,
               initialization_timeout: int = 300) -> Launch:
    """Join the cluster this process belongs to (if any); idempotent. Returns the `Launch`.

    How this process was started is decided in this order: (1) the explicit arguments; (2) the
    environment variables ``CLARIFYJAX_COORDINATOR`` (``host:port`` of process 0),
    ``CLARIFYJAX_NUM_PROCESSES``, ``CLARIFYJAX_PROCESS_ID`` and optionally
    ``CLARIFYJAX_LOCAL_DEVICE_IDS`` (``0,1``), as `launch/local_multiprocess.sh` and
    `launch/slurm.sbatch` set them; (3) a cluster JAX detects by itself (SLURM inside ``srun``, one
    process per GPU by default; Open MPI; Cloud TPU VMs, GKE and multislice); (4) else a single
    process. `jax.distributed.initialize` runs only for several processes (or on a TPU VM whose
    worker count only the metadata server knows).

    Raises:
      DistributedError: bad settings (see `detect_launch`), settings that disagree with an earlier
        call, or a call after the JAX backend was already started by some other JAX call.
    """
    global _launch
    if _launch is not None:
        _check_agrees(_launch, coordinator_address, num_processes, process_id)
        return _launch
    if jax.distributed.is_initialized():  # started by someone else (e.g. a notebook)
        _launch = Launch("external", jax.process_count(), jax.process_index())
        _check_agrees(_launch, coordinator_address, num_processes, process_id)
        return _launch

    launch = detect_launch(coordinator_address, num_processes, process_id, local_device_ids)
    if not launch.multi_process:
        _launch = launch
        return launch

    ids = list(launch.local_device_ids) if launch.local_device_ids is not None else None
    try:
        if launch.source in ("explicit", "env"):
            # Explicit settings turn JAX's own detection off, so every local device stays visible:
            # with one process per SLURM node and 8 GPUs, its SLURM detection would give each one GPU.
            jax.distributed.initialize(
                coordinator_address=launch.coordinator_address,
                num_processes=launch.num_processes, process_id=launch.process_id,
                local_device_ids=ids, cluster_detection_method="deactivate",
                initialization_timeout=initialization_timeout)
        else:  # JAX's own detection (SLURM, Open MPI, Cloud TPU)
            jax.distributed.initialize(local_device_ids=ids,
                                       initialization_timeout=initialization_timeout)
    except RuntimeError as e:
        if "must be called before" in str(e) or "already" in str(e):
            raise DistributedError(
                f"clarifyjax.core.distributed.initialize() ({launch.source}: {launch.num_processes} "
                f"processes) must run before any other JAX call (jax.devices(), creating an "
                f"array, jit): {e}") from e
        raise
    _launch = dataclasses.replace(launch, num_processes=jax.process_count(),
                                  process_id=jax.process_index())
    return _launch


def _check_agrees(launch: Launch, coordinator_address, num_processes, process_id) -> None:
    asked = {"num_processes": num_processes, "process_id": process_id,
             "coordinator_address": coordinator_address}
    for name, value in asked.items():
        have = getattr(launch, name)
        if value is not None and have is not None and str(value) != str(have):
            raise DistributedError(f"initialize() was already called ({launch.source}) with "
                                   f"{name}={have!r}; now asked for {name}={value!r}")


def current_launch() -> Launch | None:
    """What `initialize` decided in this process, or None before it ran."""
    return _launch


def is_primary() -> bool:
    """Whether this is process 0, the one that writes metrics, logs and exports."""
    return jax.process_index() == 0


def primary_only(fn: F) -> F:
    """Decorator: run `fn` on process 0 only; other processes get None.

    For writes that must happen once (metrics.jsonl, TensorBoard, a final Hugging Face export). Do
    not wrap collective work (orbax saves, anything jitted over global arrays): every process must
    take part in those.
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if is_primary():
            return fn(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier called `name` (no-op with one process).

    E.g. after process 0 wrote a file that the others will read.
    """
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
