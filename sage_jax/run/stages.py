"""One generating stage of `sage-jax run`: batches of rows to a generator, checked, failed rows
re-queued in the next batch, every finished batch saved at once, resumable after kill -9: a
resumed stage holds the same rows in the same batches and gets the same texts (`Stage`, whose
schedule and files are described above it)."""
from __future__ import annotations

import hashlib
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from clarifyjax.files.textfiles import atomic_write_bytes
from clarifyjax.text.generator import TokenCounter

KEY_FIELDS = ("question_id", "paraphrase_index", "model", "sample")


class StageError(RuntimeError):
    """A stage stopped (its generator gave up); finished rows are kept on disk."""


@dataclass(frozen=True)
class Task:
    """One row: `key` (question_id, paraphrase_index, model, sample), its prompt, and the context a
    recorded generator looks its text up by."""

    key: tuple
    prompt: object
    context: dict = field(default_factory=dict)


def batch_seed(seed: int, stage: str, k: int) -> int:
    """The generator's seed for batch k of a stage (a batch holds the same rows in every run)."""
    digest = hashlib.sha256(json.dumps([seed, stage, k]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _jsonl(rows: Sequence[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows).encode()


def read_jsonl(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _key(record: dict) -> tuple:
    return tuple(record[k] for k in KEY_FIELDS)


def _unfit(generator, tasks: Sequence[Task], samplings) -> dict[int, str]:
    """Rows whose prompt the generator can tell will not fit its context (a `TokenCounter`): they
    fail at once, with the reason, instead of stopping the stage."""
    out = {i: s for i, s in enumerate(samplings) if isinstance(s, str)}  # a sampling rule's reason
    if not isinstance(generator, TokenCounter):
        return out
    for i, (task, sampling) in enumerate(zip(tasks, samplings)):
        if i in out:
            continue
        budget = sampling.max_new_tokens or 0
        try:
            tokens = generator.count_tokens(task.prompt)
        except ValueError as e:
            out[i] = f"prompt cannot be encoded: {e}"
            continue
        if tokens + budget > generator.context_length:
            out[i] = (f"prompt of {tokens} tokens + {budget} new tokens does not fit the context of "
                      f"{generator.context_length}")
    return out


def waiting_line(bar, where: str) -> Callable[[str], None]:
    """Where a generator says why it waits ("waiting 8 s: endpoint URL answered 429 ..."): the
    stage's progress line, or a line on stderr when no bar is shown (quiet)."""
    def say(text: str) -> None:
        if bar.disable:
            print(f"sage-jax: stage {where}: {text}", file=sys.stderr, flush=True)
        else:
            bar.set_postfix_str(text)
    return say


# RowCheck: (tasks, texts, previous records or None) -> per task {"ok": bool, "reason": str | None, ...fields}
RowCheck = Callable[[Sequence[Task], Sequence[str], Sequence[dict | None]], list[dict]]


@runtime_checkable
class Recorded(Protocol):
    """A generator that gives each prompt its recorded texts in order (a file of earlier outputs,
    `generators.RecordedGenerator`): `complete_from(prompts, served, n)` gives prompt i its texts
    after the first `served[i]`. The stage counts what each prompt was served from its batch files,
    never in memory, so a resumed stage is served what an uninterrupted one was."""

    def complete_from(self, prompts: Sequence, served: Sequence[int], n: int) -> list: ...


def prompt_key(prompt) -> str:
    """One string per prompt (a text or a chat), as its batch file holds it."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


class _Schedule:
    """Which rows batch k holds, rebuilt from the outcomes of batches 0..k-1 (see `Stage`)."""

    def __init__(self, tasks: Sequence[Task], batch_size: int, n: int):
        self.by_key = {t.key: t for t in tasks}
        self.queue: deque = deque(t.key for t in tasks)
        self.batch_size, self.n = batch_size, n
        self.retry: list = []
        self.attempts: dict = {}
        self.last: dict = {}
        self.final: dict = {}
        self.served: dict[str, int] = {}  # prompt -> texts asked for it in the batches so far
        self.batches = 0  # batches applied: the next one is batch `batches`

    def next_batch(self) -> list:
        batch = list(self.retry)
        while self.queue and len(batch) < self.batch_size:
            batch.append(self.queue.popleft())
        return batch

    def served_before(self, tasks: Sequence[Task]) -> list[int]:
        """Per task, how many texts its prompt was asked for before it (earlier batches, then
        earlier rows of this one)."""
        seen, out = dict(self.served), []
        for t in tasks:
            key = prompt_key(t.prompt)
            out.append(seen.get(key, 0))
            seen[key] = out[-1] + self.n
        return out

    def apply(self, batch: list, records: list[dict]) -> None:
        self.retry.clear()
        self.batches += 1
        for key, record in zip(batch, records):
            self.attempts[key] = record["attempt"] + 1
            self.last[key] = record
            if record["output"] is not None:  # asked (a row unfit for the generator was not)
                prompt = prompt_key(self.by_key[key].prompt)
                self.served[prompt] = self.served.get(prompt, 0) + self.n
            if record["status"] == "retry":
                self.retry.append(key)
            else:
                self.final[key] = record


# A stage has a list of `Task`s (one row each, keyed by question id, paraphrase index, model and
# sample). Batch k takes the rows that failed in batch k-1 and are under `max_attempts` first, then
# fresh rows in task order, up to `batch_size`. The generator's seed is a hash of the run's seed, the
# stage and k: the schedule is a pure function of the outcomes, so batch k holds the same rows, in
# the same order, in a resumed run as in an uninterrupted one, and gets the same texts (a `Recorded`
# generator is told how often each prompt was asked in the batches before).
# Files, in `folder` (one per stage, model and process):
#     stage.json            what the rows depend on (fingerprint); another run's folder is refused
#     batch-000000.jsonl    every attempt of batch 0, written whole (temporary file, then rename)
#     rows.jsonl            the final row of every task, in task order, written when the stage ends
# A killed stage replays its batch files (rebuilding the queue exactly) and goes on from the first
# missing batch; a stage whose rows.jsonl exists is not run again. A row that still fails after
# `max_attempts` is kept with status "failed" and the reason of its last attempt. `check` refuses
# another run's folder before anything is written.
class Stage:
    def __init__(self, name: str, folder: Path, tasks: Sequence[Task], *, fingerprint: dict,
                 max_attempts: int, batch_size: int, seed: int):
        self.name, self.folder, self.tasks = name, Path(folder), list(tasks)
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
        self.max_attempts, self.batch_size, self.seed = max_attempts, batch_size, seed
        self.rows_path = self.folder / "rows.jsonl"
        keys = [t.key for t in self.tasks]
        if len(set(keys)) != len(keys):
            raise ValueError(f"stage {name}: two tasks share a key")

    # ------------------------------------------------------------------ files

    def check(self, n: int = 1, error: type[Exception] = StageError) -> None:
        """`error`, before anything is written, when the folder holds this stage of a run with
        other settings, or batch files this run would not schedule (another batch size)."""
        if self._check_marker(error) and not self.finished():
            self._replay(n, error)

    def _check_marker(self, error: type[Exception] = StageError) -> bool:
        """Whether stage.json exists; `error` when it is another run's."""
        marker = self.folder / "stage.json"
        if not marker.exists():
            return False
        on_disk = json.loads(marker.read_text())
        if on_disk != self.fingerprint:
            changed = sorted(k for k in set(on_disk) | set(self.fingerprint)
                             if on_disk.get(k) != self.fingerprint.get(k))
            raise error(f"{self.folder}: holds stage {self.name} of a run with other settings "
                             f"({', '.join(changed[:4])} differ); use another out folder or remove it")
        return True

    def _start(self, n: int) -> _Schedule | None:
        """The schedule to go on from (None: the stage has finished)."""
        if not self._check_marker():
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.folder / "stage.json",
                               json.dumps(self.fingerprint, indent=1, sort_keys=True).encode())
        return None if self.finished() else self._replay(n)

    def _batch_path(self, k: int) -> Path:
        return self.folder / f"batch-{k:06d}.jsonl"

    def _replay(self, n: int, error: type[Exception] = StageError) -> _Schedule:
        """The schedule after the batches a killed run finished (their files, in order)."""
        schedule = _Schedule(self.tasks, self.batch_size, n)
        k = 0
        while self._batch_path(k).exists():
            batch = schedule.next_batch()
            records = read_jsonl(self._batch_path(k))
            if [_key(r) for r in records] != [tuple(b) for b in batch]:
                raise error(f"{self._batch_path(k)}: does not hold the rows this run schedules for that "
                                 "batch (was it written with another batch_size or max_attempts, or by another "
                                 "version?); use the earlier settings, another out folder, or remove it")
            schedule.apply(batch, records)
            k += 1
        return schedule

    def finished(self) -> bool:
        return self.rows_path.exists()

    def rows(self) -> list[dict]:
        return read_jsonl(self.rows_path)

    # ------------------------------------------------------------------ run

    def _records(self, tasks, tries, unfit: dict, answered) -> list[dict]:
        """One batch's records: a row unfit for the generator failed; the others as judged, a row
        the judge refused left for another attempt while `max_attempts` allows."""
        answered = iter(answered)
        records = []
        for i, (task, attempt) in enumerate(zip(tasks, tries)):
            if i in unfit:
                text, verdict, status = None, {"reason": unfit[i]}, "failed"
            else:
                text, verdict = next(answered)
                verdict = dict(verdict)
                ok = verdict.pop("ok")
                status = "ok" if ok else ("retry" if attempt + 1 < self.max_attempts else "failed")
            records.append({**task.context, **dict(zip(KEY_FIELDS, task.key)), "attempt": attempt,
                            "prompt": task.prompt, "output": text, "status": status, **verdict})
        return records

    def _generator(self, generator_fn, bar, describe: str):
        """The stage's generator, an endpoint's or a function's waits said on the stage's bar."""
        generator = generator_fn()
        if hasattr(generator, "on_wait"):
            generator.on_wait = waiting_line(bar, f"{self.name}{describe}")
        return generator

    def _generate(self, generator, schedule: _Schedule, asked: Sequence[Task], chosen, n: int, k: int,
                  describe: str):
        if not asked:
            return []
        prompts = [t.prompt for t in asked]
        try:
            if isinstance(generator, Recorded):
                return generator.complete_from(prompts, schedule.served_before(asked), n)
            return generator.complete(prompts, chosen, n, batch_seed(self.seed, self.name + describe, k))
        except Exception as e:
            raise StageError(f"stage {self.name}{describe}: {e}; {len(schedule.final)} of {len(self.tasks)} rows "
                             f"are finished and kept in {self.folder}; run the same command again to go on "
                             "from there") from e

    def run(self, generator_fn, judge: RowCheck, *, sampling, n: int = 1, quiet: bool = False,
            describe: str = "") -> list[dict]:
        """The final rows, in task order: from rows.jsonl when the stage finished before, else by
        generating (what batches a killed run left are replayed first). `generator_fn()` builds
        the generator only when a row is left to generate. `sampling`: a `Sampling`, or
        `sampling(generator, task)` giving a row's own (or a str: why the row cannot run)."""
        schedule = self._start(n)
        if schedule is None:
            return self.rows()
        order = {t.key: i for i, t in enumerate(self.tasks)}
        from tqdm import tqdm

        bar = tqdm(total=len(self.tasks), initial=len(schedule.final), desc=f"{self.name}{describe}", unit="row",
                   disable=quiet, file=sys.stderr, dynamic_ncols=True, leave=False)
        generator = None
        try:
            while True:
                batch = schedule.next_batch()
                if not batch:
                    break
                generator = generator or self._generator(generator_fn, bar, describe)
                tasks = [schedule.by_key[key] for key in batch]
                tries = [schedule.attempts.get(key, 0) for key in batch]
                settings = [sampling(generator, t) if callable(sampling) else sampling for t in tasks]
                unfit = _unfit(generator, tasks, settings)  # row index -> why (no attempt can change it)
                asked = [t for i, t in enumerate(tasks) if i not in unfit]
                chosen = [s for i, s in enumerate(settings) if i not in unfit]
                k = schedule.batches
                outputs = self._generate(generator, schedule, asked, chosen, n, k, describe)
                texts = [o[0].text if n == 1 else [c.text for c in o] for o in outputs]
                verdicts = judge(asked, texts, [schedule.last.get(t.key) for t in asked]) if asked else []
                records = self._records(tasks, tries, unfit, zip(texts, verdicts))
                atomic_write_bytes(self._batch_path(k), _jsonl(records))
                schedule.apply(batch, records)
                if getattr(bar, "postfix", None):  # a wait it said is over
                    bar.set_postfix_str("", refresh=False)
                bar.update(sum(r["status"] != "retry" for r in records))
        finally:
            bar.close()
        rows = sorted(schedule.final.values(), key=lambda r: order[_key(r)])
        atomic_write_bytes(self.rows_path, _jsonl(rows))
        return rows
