"""Continuous batching for `clarifyjax serve`: `ContinuousBatcher` has `MicroBatcher`'s interface
(`await submit(job, rows)`, `close()`) but runs every request's rows in the slots of one
`decoding.slots.SlotEngine`: a request joins at the next step (its prompt prefilled chunk by
chunk) and each row leaves the moment it ends, so a short request never waits for a long one.
`--batching window` keeps `MicroBatcher` (requests of one window run to the longest one's end)."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import threading
import time

import numpy as np
import jax

from clarifyjax.decoding.local_lm import EncodedRow, LocalLM
from clarifyjax.decoding.slots import SlotEngine, SlotRequest, slot_cache_bytes
from clarifyjax.serve.http_server import ApiError
from clarifyjax.text.generator import Completion, cut_at_stop
from clarifyjax.core.ranges import number_type


MAX_SLOTS = 4096  # as --batch-size: rows of one decoding step (each step reads every slot)


@dataclasses.dataclass(frozen=True)
class SlotSettings:
    """The engine of `clarifyjax serve --batching continuous`."""
    slots: int = 32          # rows decoded together
    length: int | None = None  # cache positions per slot (prompt + new tokens); None: context
    chunk: int = 64          # prompt tokens per row of a prefill chunk
    prefill_rows: int = 4    # rows per prefill chunk
    min_span: int | None = None  # fewest cache positions a step reads (None: chunk)


@dataclasses.dataclass(eq=False)
class _Job:
    item: object                      # the server's job: prompts, sampling, n, seed
    rows: list[SlotRequest]
    encoded: list[EncodedRow]
    counts: list[int]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float
    left: int = 0


@dataclasses.dataclass(frozen=True)
class JobTiming:
    """When a finished request arrived, got its first token and its last (monotonic seconds),
    with its prompts: what `benchmarks/serve_load.py` reads."""
    prompts: tuple
    arrived: float
    first_token: float
    done: float


class ContinuousBatcher:
    """`MicroBatcher`'s interface over a `SlotEngine` on `lm`. Items are the server's jobs:
    `prompts`, `sampling` (one `Sampling`), `n`, `seed`.

    Greedy rows get the tokens `LocalLM.complete` gives the same request alone; sampled rows draw
    from their own key, derived from (seed, prompt, sample), so a seeded request repeats whatever
    else runs; an unseeded request gets a new seed (reproducible from the server's start). Limits:
    413 for a request of more rows than `max_queued_rows`, 503 while the rows waiting for a slot
    would pass it; a request whose client goes away leaves the queue, or frees its slots at the
    next step. A request that makes a step fail fails alone with a JSON 500, the others of its
    step run again, one at a time, and get their answers (`SlotEngine.recover`)."""

    def __init__(self, lm: LocalLM, settings: SlotSettings = SlotSettings(), *,
                 max_queued_rows: int = 1024):
        if lm.mesh is not None:
            raise ValueError("continuous batching runs on one device; a LocalLM on a mesh "
                             "needs --batching window")
        if settings.length is not None and settings.length > lm.context_length:
            raise ValueError(f"a slot length of {settings.length} positions is more than the "
                             f"model's context length of {lm.context_length}")
        self.lm, self.max_queued_rows = lm.load(), max_queued_rows
        length = settings.length or lm.context_length
        check_memory(lm.model.config, settings.slots, length)
        self.engine = SlotEngine(lm.model, slots=settings.slots, length=length,
                                 chunk=settings.chunk, prefill_rows=settings.prefill_rows,
                                 min_span=settings.min_span)
        self.row_length = length  # positions a prompt and its new tokens may take
        self.batches: list[int] = []  # MicroBatcher's counter: rows of each request admitted
        self.timings: collections.deque[JobTiming] = collections.deque(maxlen=100_000)
        self.cancelled_rows = 0       # rows dropped because their client went away
        self._wakeup = threading.Event()
        self._closed = False
        self._unseeded = 0
        self._thread: threading.Thread | None = None

    async def submit(self, item, rows: int = 1):
        if rows > self.max_queued_rows:
            raise ApiError(413, f"the request needs {rows} rows (prompts x n); this server "
                                f"queues at most {self.max_queued_rows}", code="too_many_rows")
        if self.engine.queued + rows > self.max_queued_rows:
            raise ApiError(503, f"the server is busy ({self.engine.queued} rows queued); retry "
                                "later", code="overloaded")
        loop = asyncio.get_running_loop()
        job = self._job(item, loop)
        for r in job.rows:
            try:
                self.engine.add(r)
            except ValueError as e:  # a prompt or a setting a slot cannot hold
                for added in job.rows:
                    self.engine.cancel(added)
                raise ApiError(400, str(e)) from None
        self.batches.append(len(job.rows))
        self._start()
        self._wakeup.set()
        try:
            return await job.future
        except asyncio.CancelledError:  # the client went away: its rows leave
            for r in job.rows:
                self.engine.cancel(r)
            self.cancelled_rows += len(job.rows)
            raise

    def _job(self, item, loop) -> _Job:
        try:
            encoded, counts = self.lm.prompt_rows(item.prompts, item.sampling, item.n)
            seed = item.seed
            sampled = any(not row.sampling.greedy for row in encoded)
            if seed is None and sampled:  # a new seed per request, reproducible from the start
                seed, self._unseeded = 2 ** 32 + self._unseeded, self._unseeded + 1
            job = _Job(item, [], encoded, counts, loop.create_future(), loop, time.monotonic())
            job.rows = [self._request(row, job, seed) for row in encoded]  # stop strings' ids
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        job.left = len(job.rows)
        return job

    def _request(self, row: EncodedRow, job: _Job, seed: int | None) -> SlotRequest:
        s = row.sampling
        stop_text = None
        if s.stop:
            decode = self.lm.tokenizer.decode

            def stop_text(tokens, stop=s.stop):
                return cut_at_stop(decode(tokens), stop) is not None
        row_seed = 0 if seed is None else int(np.random.SeedSequence(
            [seed % 2 ** 64, row.prompt, row.sample]).generate_state(1)[0])
        return SlotRequest(row.ids, s, row_seed, frozenset(self.lm.stop_token_ids(s.stop)),
                           stop_text, job)

    # -- the worker thread ---------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="slots", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while not self._closed:
            if self.engine.idle:
                self._wakeup.wait(0.5)
                self._wakeup.clear()
                continue
            try:
                finished = self.engine.step()
            except Exception as e:  # only the request that caused it fails (`engine.recover`)
                error = ApiError(500, f"generation failed: {type(e).__name__}: {e}")
                for r in self.engine.recover():
                    for other in r.tag.rows:  # the rest of its request leaves too
                        self.engine.cancel(other)
                    _settle(r.tag, error)
                continue
            for r in finished:
                job: _Job = r.tag
                if r.finish == "cancelled" or job.future.done():
                    continue
                job.left -= 1
                if job.left == 0:
                    self._finish(job)

    def _finish(self, job: _Job) -> None:
        try:
            out: list[list[Completion | None]] = [[None] * c for c in job.counts]
            for row, r in zip(job.encoded, job.rows):
                stop_ids = tuple(sorted(r.stop_ids))
                out[row.prompt][row.sample] = self.lm.completion(
                    np.asarray(r.tokens, np.int32), np.asarray(r.logprobs, np.float32),
                    np.ones(len(r.tokens), np.int32), row.sampling, stop_ids)
        except Exception as e:
            _settle(job, ApiError(500, f"generation failed: {type(e).__name__}: {e}"))
            return
        firsts = [r.first_token_at for r in job.rows]
        self.timings.append(JobTiming(tuple(map(str, job.item.prompts)), job.arrived,
                                      min(firsts), max(r.done_at for r in job.rows)))
        _settle(job, out)

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()


def check_memory(config, slots: int, length: int) -> None:
    """ValueError, before allocating, when the slots' KV cache would take more than 90% of the
    memory free for it: the device's (its allocator's limit less what is in use) or, where the
    device reports none (a CPU), the host's available memory."""
    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        free, where = stats["bytes_limit"] - stats.get("bytes_in_use", 0), "the device has"
    else:
        free, where = _host_available(), "this machine has"
    need = slot_cache_bytes(config, slots, length)
    if free is not None and need > 0.9 * free:
        raise ValueError(f"continuous batching: {slots} slots of {length} positions need a KV "
                         f"cache of {need / 2 ** 30:.1f} GiB, more than 90% of what {where} "
                         f"free ({free / 2 ** 30:.1f} GiB); lower --slots or --slot-length")


def _host_available() -> int | None:
    """Bytes of memory this machine can give without swapping (Linux's MemAvailable), else its
    physical memory, or None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _settle(job: _Job, result) -> None:
    """Hand `result` (a value, or an exception to raise) to the request's coroutine."""
    def settle():
        if job.future.done():
            return
        if isinstance(result, BaseException):
            job.future.set_exception(result)
        else:
            job.future.set_result(result)
    job.loop.call_soon_threadsafe(settle)


def add_batching_options(p) -> None:
    """`clarifyjax serve`'s batching options (an argparse parser)."""
    p.add_argument("--batching", choices=("continuous", "window"), default="continuous",
                   help="continuous: requests join and leave the running batch at every step "
                        "(--slots rows); window: requests arriving within --window-ms run "
                        "together, to the longest one's end")
    p.add_argument("--slots", type=number_type(int, f"[1, {MAX_SLOTS}]"), default=None,
                   help="rows decoded together by continuous batching (default --batch-size); "
                        "their KV cache must fit 90%% of the free memory")
    p.add_argument("--slot-length", type=number_type(int, ">= 2"), default=None,
                   help="cache positions per slot, prompt + new tokens (default and most: the "
                        "model's context)")
    p.add_argument("--prefill-chunk", type=number_type(int, ">= 1"), default=64,
                   help="prompt tokens a row prefills per step, between the running rows' steps")
