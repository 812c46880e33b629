"""What a run reports as it goes: scalars to ``metrics.jsonl`` and TensorBoard (`MetricsLogger`),
a progress bar (`progress`) and messages that do not break it (`say_through`)."""
from __future__ import annotations

import json
from pathlib import Path

import jax


class MetricsLogger:
    """Scalars to ``metrics.jsonl`` (appended; flushed per line) and TensorBoard event files."""

    def __init__(self, directory: Path, *, tensorboard: bool = True, say=print):
        self.path = Path(directory) / "metrics.jsonl"
        self._tb, self._file, self.backend = None, None, "jsonl only"
        self.primary = jax.process_index() == 0  # one writer for all processes
        if not self.primary:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb, self.backend = SummaryWriter(str(directory)), "tensorboardX"
            except ImportError:
                try:
                    import tensorboard  # noqa: F401  (tf.summary writes nothing without it)
                    import tensorflow as tf

                    self._tf = tf
                    self._tb = tf.summary.create_file_writer(str(directory))
                    self.backend = "tf.summary"
                except ImportError:
                    pass
        say(f"[metrics] {self.path} + TensorBoard: {self.backend}")

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if not self.primary:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": int(step), **clean}) + "\n")
        self._file.flush()
        if self.backend == "tensorboardX":
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
        elif self.backend == "tf.summary":
            with self._tb.as_default(step=int(step)):
                for k, v in clean.items():
                    self._tf.summary.scalar(k, v)
            self._tb.flush()

    def close(self) -> None:
        if not self.primary:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close() if self.backend == "tensorboardX" else self._tb.flush()


def progress(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, dynamic_ncols=True)


def say_through(bar):
    """print, or the bar's write while a bar is shown."""
    def say(message: str) -> None:
        (bar.write if bar is not None and not bar.disable else print)(message)
    return say
