"""Training checkpoints with orbax, and turning a preemption (SIGTERM) into a clean save-and-exit.

`Checkpointer` saves a step's ``state`` (a sharded pytree) and ``extra`` (JSON) asynchronously and
atomically, restores straight into a given sharding, and sets damaged checkpoints aside;
`PreemptionGuard` turns SIGTERM into a save at the next step. The training loop's use of both is
written above `Checkpointer`."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from clarifyjax.models.safetensors_io import CheckpointError

STATE, EXTRA = "state", "extra"


def _key_name(key) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _flat(tree) -> dict[str, Any]:
    """{"a/b/0/value": leaf} for a pytree (dicts, lists, NNX states and Variables alike)."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_key_name(k) for k in path): leaf for path, leaf in leaves}


def _is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _stored_shape(leaf) -> tuple[int, ...]:
    """The shape that orbax stores for `leaf` (a PRNG key is stored as its key data)."""
    if _is_key(leaf.dtype):
        return tuple(jax.eval_shape(jax.random.key_data,
                                    jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)).shape)
    return tuple(leaf.shape)


def to_abstract(tree) -> Any:
    """`jax.ShapeDtypeStruct`s with shardings for a pytree of arrays or ShapeDtypeStructs.

    Concrete arrays keep their sharding. A leaf without one gets the first local device, which is
    only right with a single process: multi-host callers must pass shardings.
    """
    multi = jax.process_count() > 1

    def convert(leaf):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            if multi:
                raise CheckpointError(f"a leaf of shape {leaf.shape} has no sharding; with "
                                      f"{jax.process_count()} processes every leaf needs one")
            sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(convert, tree)


def jsonable(value, at: str = "extra"):
    """`value` with numpy / jax scalars and arrays turned into Python numbers and lists, and
    dataclasses (a run config) into dicts.

    Raises:
      CheckpointError: something JSON cannot hold (naming where it is).
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. a run config
        return jsonable(dataclasses.asdict(value), at)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CheckpointError(f"{at}: JSON keys must be strings, got {k!r}")
            out[k] = jsonable(v, f"{at}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v, f"{at}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        return np.asarray(value).tolist()
    raise CheckpointError(f"{at}: a {type(value).__name__} cannot be stored as JSON")


# A checkpoint of step s (the number of completed steps) holds `state`, any pytree of jax arrays
# (possibly sharded over many hosts, saved with StandardSave: every process takes part), and
# `extra`, a JSON document (data position, reward normalizer, KL controller, and the run's config
# when `record` is set, which `run_record` compares a resume against). Saving is asynchronous and
# atomic: orbax writes into <step>.orbax-checkpoint-tmp-<time> and renames it when complete, so a
# run killed mid-save leaves only a temporary folder, ignored and removed on the next start.
# Restoring places every array straight into the sharding of the abstract state it is given. A
# damaged checkpoint is renamed <step>.damaged-<UTC time> by `restore_latest`: orbax ignores such
# names, so it never restores, overwrites or garbage-collects them (docs/reliability.md).
# The training loop (multi-host safe: every process runs the same code):
#     with Checkpointer(run_dir / "checkpoints", max_to_keep=3, save_interval_steps=500) as ckpt, \
#             PreemptionGuard() as guard:
#         restored = ckpt.restore_latest(abstract_state)     # ShapeDtypeStructs with shardings
#         step, state, extra = restored or (0, init_state(), {})
#         while step < total_steps:
#             state = train_step(state, next(batches)); step += 1
#             stop = guard.should_stop(step)
#             if stop or ckpt.should_save(step) or step == total_steps:
#                 ckpt.save(step, state, {"data": batches.position, ...})
#             if stop:
#                 break                                   # leaving the with-block waits for the save
#     # then exit with status 0: the scheduler restarts the job, which resumes from `step`
class Checkpointer:
    """orbax `CheckpointManager` of ``state`` (pytree) + ``extra`` (JSON) items.

    Args:
      directory: where the step folders go (local path, or ``gs://...``).
      max_to_keep: newest checkpoints kept; older ones are deleted after each save.
      save_interval_steps: `should_save(step)` is true every this many steps (the loop decides;
        `save` always saves).
      async_save: write in a background thread (call `wait` or `close` before reading).
    """

    def __init__(self, directory: str | Path, *, max_to_keep: int | None = 3,
                 save_interval_steps: int = 1, async_save: bool = True):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        if save_interval_steps < 1:
            raise ValueError(f"save_interval_steps must be >= 1, got {save_interval_steps}")
        self.save_interval_steps = int(save_interval_steps)
        directory = str(directory)
        self.directory = directory if "://" in directory else str(Path(directory).absolute())
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,  # the schedule is ours (`should_save`); orbax saves when asked
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # leftovers of a run killed mid-save
            create=True,
        )
        # Handlers named up front, so that a fresh process can read the metadata before restoring.
        self._manager = ocp.CheckpointManager(
            self.directory, options=options,
            item_handlers={STATE: ocp.StandardCheckpointHandler(),
                           EXTRA: ocp.JsonCheckpointHandler()})
        # The run's config (plain JSON), added to every save's extra as "config", so that each
        # checkpoint records the settings it was made with (see `clarifyjax.training.run_record`).
        self.record: Mapping[str, Any] | None = None

    # -- saving ----------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """True when `step` is a multiple of ``save_interval_steps`` (a fixed schedule, so that a
        resumed run saves at the same steps as an uninterrupted one)."""
        return step > 0 and step % self.save_interval_steps == 0

    def save(self, step: int, state, extra: Mapping[str, Any] | None = None) -> bool:
        """Start saving `state` and `extra` as checkpoint `step` (every process must call this).

        Waits for the previous save to finish first. The caller decides when to save (see
        `should_save`); a step that already has a checkpoint is skipped. Returns whether a save
        was started.
        """
        if step in self._manager.all_steps():
            return False
        extra = dict(extra or {})
        if self.record is not None:
            extra.setdefault("config", self.record)
        args = self._ocp.args.Composite(**{
            STATE: self._ocp.args.StandardSave(state),
            EXTRA: self._ocp.args.JsonSave(jsonable(extra)),
        })
        return bool(self._manager.save(step, args=args, force=True))

    def wait(self) -> None:
        """Block until every save started so far is on disk (committed)."""
        self._manager.wait_until_finished()

    # -- reading ---------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def check_compatible(self, step: int, abstract_state) -> None:
        """Compare checkpoint `step`'s stored tree with `abstract_state`, leaf by leaf.

        Raises:
          CheckpointError: a leaf missing on either side, or a shape that differs (naming the
            leaf, both shapes and the checkpoint folder). Dtypes may differ (values are cast).
        """
        try:
            metadata = self._manager.item_metadata(step)[STATE]
        except Exception:  # metadata of an older format: let orbax itself complain
            return
        metadata = getattr(metadata, "tree", metadata)
        if metadata is None:
            return
        stored = _flat(metadata)
        wanted = _flat(abstract_state)
        where = f"checkpoint {self.directory}/{step}"
        missing = sorted(set(wanted) - set(stored))
        unexpected = sorted(set(stored) - set(wanted))
        if missing or unexpected:
            raise CheckpointError(
                f"{where} does not match the model: missing from the checkpoint "
                f"{missing[:10]}{' ...' if len(missing) > 10 else ''}; only in the checkpoint "
                f"{unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
        for name, leaf in wanted.items():
            have = tuple(getattr(stored[name], "shape", ()) or ())
            if have != _stored_shape(leaf):
                raise CheckpointError(
                    f"{where}: '{name}' has shape {have} in the checkpoint but the model expects "
                    f"{tuple(leaf.shape)} (a checkpoint of another model shape?)")

    def restore(self, step: int, abstract_state) -> tuple[Any, dict]:
        """(state, extra) of checkpoint `step`, each array placed in the sharding of the matching
        leaf of `abstract_state` (ShapeDtypeStructs with shardings, or arrays)."""
        if step not in self._manager.all_steps():
            raise CheckpointError(f"no checkpoint of step {step} in {self.directory}; "
                                  f"there are {self.all_steps()}")
        abstract = to_abstract(abstract_state)
        self.check_compatible(step, abstract)
        restored = self._manager.restore(step, args=self._ocp.args.Composite(**{
            STATE: self._ocp.args.StandardRestore(abstract),
            EXTRA: self._ocp.args.JsonRestore(),
        }))
        return restored[STATE], dict(restored[EXTRA] or {})

    def restore_latest(self, abstract_state, say: Callable[[str], None] = print
                       ) -> tuple[int, Any, dict] | None:
        """(step, state, extra) of the newest intact checkpoint, or None when there is none.

        A checkpoint that cannot be read is skipped for the next older one; once one restores,
        the damaged newer folders are set aside (`_set_aside`), each with a warning through `say`.

        Raises:
          CheckpointError: every checkpoint is damaged (one line naming each; nothing is moved),
            or one does not match the model (`check_compatible`: not damage, so no fallback).
        """
        self._manager.reload()
        damaged: list[tuple[int, str]] = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            with _quiet_unretrieved_task_errors():  # exits after the error is handled and freed
                state, extra, reason = self._attempt(step, abstract_state)
            # Each process reads its own shards: all must agree, or they would restore different
            # steps (and wait for each other forever).
            if not _on_every_process(not reason):
                damaged.append((step, reason or "unreadable on another process"))
                continue
            if damaged:
                self._set_aside(damaged, step, say)
            return step, state, extra
        if damaged:
            raise CheckpointError(
                f"no intact checkpoint in {self.directory}: " + "; ".join(
                    f"{self.directory}/{s} is damaged ({r})" for s, r in damaged) +
                "; nothing was moved or deleted (move the damaged folders aside to start afresh)")
        return None

    def _attempt(self, step: int, abstract_state) -> tuple[Any, dict, str]:
        """(state, extra, "") of checkpoint `step`, or (None, {}, why) when it is damaged."""
        try:
            return (*self.restore(step, abstract_state), "")
        except CheckpointError:  # the model does not match: not damage, no fallback
            raise
        except Exception as e:  # noqa: BLE001 - TensorStore, JSON, KeyError...: damage
            if not _is_damage(e):
                raise
            return None, {}, _reason(e)

    def _set_aside(self, damaged: list[tuple[int, str]], restored: int, say) -> None:
        """Rename each damaged step folder ``<step>.damaged-<UTC time>`` (process 0), so that
        orbax no longer lists it: left in place, saving that step again would be skipped as
        "already there" and the damaged folder would stay the newest, or count against
        ``max_to_keep`` and get intact checkpoints deleted."""
        from etils import epath

        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for step, reason in damaged:
            src = epath.Path(self.directory) / str(step)
            dst = src.parent / f"{step}.damaged-{stamp}"
            if jax.process_index() == 0:
                src.rename(dst)
            say(f"[checkpoint] warning: checkpoint {src} is damaged ({reason}); moved it to "
                f"{dst} (kept, not deleted) and resumed from step {restored}")
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("clarifyjax_set_aside_damaged_checkpoints")
        self._manager.reload()

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for pending saves, then release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_damage(error: Exception) -> bool:
    """Whether a failed restore means the checkpoint's files are bad. Running out of memory, a
    permission refused or a network time-out says nothing about them: setting an intact
    checkpoint aside for it would silently resume from an older step."""
    if isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in str(error):
        return False
    if isinstance(error, OSError):  # a missing file or folder is damage; other OS errors are not
        return isinstance(error, (FileNotFoundError, NotADirectoryError, IsADirectoryError))
    return True


def _reason(error: BaseException) -> str:
    """The first line of an error, without TensorStore's spec dump: "KeyError: 'Item ...'"."""
    text = str(error).strip().split("\n")[0].split(" See full TensorStore details")[0]
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _on_every_process(ok: bool) -> bool:
    """True when `ok` on every process (a collective with several)."""
    if jax.process_count() == 1:
        return ok
    flags = multihost_utils.process_allgather(np.array([ok], np.int32))
    return bool(np.asarray(flags).all())


class _DropUnretrieved(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "exception was never retrieved" not in record.getMessage()


@contextlib.contextmanager
def _quiet_unretrieved_task_errors():
    """A failed TensorStore read leaves sibling coroutines and asyncio tasks whose errors Python
    prints when they are collected, each with TensorStore's whole spec: the error raised already
    says it. Collect them here, with those reports off."""
    asyncio_logger = logging.getLogger("asyncio")
    drop = _DropUnretrieved()
    asyncio_logger.addFilter(drop)
    hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = hook
        asyncio_logger.removeFilter(drop)


class PreemptionGuard:
    """Turns SIGTERM (a preempted machine, `scancel`, `kill`) into a flag the loop checks.

    Inside the ``with`` block the signals set `requested` instead of killing the process; the loop
    asks `should_stop(step)` once per step, saves, and returns, so the process can exit 0 and be
    restarted. The previous handlers come back on exit. With several processes, `should_stop`
    is a collective (every process must call it at the same steps) that is true everywhere as
    soon as any process was signalled, or orbax reports a preemption sync point: all processes
    then save the same step together.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM,)):
        self.signals = tuple(signals)
        self.requested = False
        self.signal_received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.signal_received = signum
        print(f"[clarifyjax] received {signal.Signals(signum).name}: will save and stop after "
              "the current step", file=sys.stderr, flush=True)

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionGuard must be entered in the main thread "
                               "(signal handlers can only be set there)")
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def should_stop(self, step: int) -> bool:
        """Whether the loop should save `step` and stop (the same answer on every process)."""
        if jax.process_count() == 1:
            return self.requested
        flags = multihost_utils.process_allgather(np.array([self.requested], np.int32))
        stop = bool(np.asarray(flags).any())
        try:
            stop = stop or bool(multihost_utils.reached_preemption_sync_point(step))
        except Exception:  # no preemption service (e.g. started without one): the flag decides
            pass
        return stop
