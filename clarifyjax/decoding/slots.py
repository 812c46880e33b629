"""Continuous batching's engine: a fixed number of decode slots over one `CausalLM`, each a row of a
preallocated KV cache (`SlotCache`) that requests enter and leave between steps.

    engine = SlotEngine(model, slots=32, length=2048, chunk=64)
    engine.add(SlotRequest(prompt_ids, Sampling(max_new_tokens=64, temperature=0)))
    while not engine.idle:
        for request in engine.step(): ...   # finished: request.tokens, .logprobs, .finish"""
from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.core import traces
from clarifyjax.decoding.sampling import choose_rows, stack_rows
from clarifyjax.models.causal_lm import CausalLM
from clarifyjax.models.causal_lm_layers import rope_tables
from clarifyjax.text.generator import Sampling


class SlotCache(NamedTuple):
    """Per layer [S + 1, k, L, d] keys and values; row S is scratch, where the padding rows of a
    prefill chunk write."""
    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]


def slot_cache_bytes(config, slots: int, length: int) -> int:
    """Bytes of the `SlotCache` of `slots` slots of `length` positions for a model `config`."""
    return (2 * config.num_layers * (slots + 1) * config.num_kv_heads * length * config.head_dim
            * np.dtype(config.dtype).itemsize)


def init_slot_cache(model: CausalLM, slots: int, length: int) -> SlotCache:
    c = model.config
    shape = (slots + 1, c.num_kv_heads, length, c.head_dim)
    return SlotCache(tuple(jnp.zeros(shape, c.dtype) for _ in range(c.num_layers)),
                     tuple(jnp.zeros(shape, c.dtype) for _ in range(c.num_layers)))


def _store(cache: jax.Array, new: jax.Array, rows: jax.Array | None, starts: jax.Array,
           span: int) -> tuple[jax.Array, jax.Array]:
    """Write new [r, k, t, d] at positions starts[i].. of cache row rows[i] (rows None: row i,
    t = 1, every row) -> (what the rows attend over [r, k, span, d], the cache)."""
    if rows is None:
        cache = cache.at[jnp.arange(cache.shape[0]), :, starts].set(
            new[:, :, 0].astype(cache.dtype), indices_are_sorted=True, unique_indices=True)
        return cache[:, :, :span], cache
    for i in range(new.shape[0]):  # a few rows: one slice written in place each
        cache = jax.lax.dynamic_update_slice(cache, new[i:i + 1].astype(cache.dtype),
                                             (rows[i], 0, starts[i], 0))
    return cache[rows, :, :span], cache


def slot_hidden(model: CausalLM, ids: jax.Array, positions: jax.Array, rows: jax.Array | None,
                cache: SlotCache, span: int) -> tuple[jax.Array, SlotCache]:
    """Run ids [r, t] (row i: consecutive tokens at positions[i] [t], stored in cache row
    rows[i]; rows None: every cache row, t = 1) over what each row holds at positions < span
    -> (last layer's output [r, t, H], the cache with their keys and values)."""
    c = model.config
    key_pos = jnp.arange(span)
    mask = key_pos[None, None, :] <= positions[:, :, None]                   # [r, t, span]
    if c.sliding_window is not None:
        mask &= positions[:, :, None] - key_pos[None, None, :] < c.sliding_window
    cos, sin = rope_tables(c, positions) if c.positions == "rope" else (None, None)
    x = model.embed(ids, positions)
    keys, values = [], []
    for layer, ck, cv in zip(model.layers, cache.keys, cache.values):
        def store(k, v, ck=ck, cv=cv):
            k_read, ck = _store(ck, k, rows, positions[:, 0], span)
            v_read, cv = _store(cv, v, rows, positions[:, 0], span)
            return k_read, v_read, (ck, cv)
        x, (ck, cv) = layer(x, cos, sin, mask, kv_store=store)
        keys.append(ck)
        values.append(cv)
    return x, SlotCache(tuple(keys), tuple(values))


@functools.partial(jax.jit, static_argnames=("graphdef", "span"), donate_argnames=("cache",))
def decode_program(graphdef, state, cache: SlotCache, tokens, positions, *, span: int):
    """One decoding step of every slot: tokens [S + 1] fed at positions [S + 1] -> (the logits
    of each slot's next token [S + 1, V] float32, the cache)."""
    traces.note("slots_decode")
    model: CausalLM = nnx.merge(graphdef, state)
    hidden, cache = slot_hidden(model, tokens[:, None], positions[:, None], None, cache, span)
    return model.logits(hidden[:, 0]), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "span", "slots"),
                   donate_argnames=("cache",))
def prefill_program(graphdef, state, cache: SlotCache, ids, starts, lasts, rows, *, span: int,
                    slots: int):
    """One prefill chunk: ids [r, C] at positions starts[i] + 0..C-1 of cache rows rows [r] ->
    (logits [S + 1, V] float32: at row rows[i], those after its token at index lasts[i], zeros
    elsewhere; the cache)."""
    traces.note("slots_prefill")
    model: CausalLM = nnx.merge(graphdef, state)
    positions = starts[:, None] + jnp.arange(ids.shape[1])[None, :]
    hidden, cache = slot_hidden(model, ids, positions, rows, cache, span)
    last = model.logits(jnp.take_along_axis(hidden, lasts[:, None, None], axis=1)[:, 0])
    return jnp.zeros((slots + 1, last.shape[-1]), last.dtype).at[rows].set(last), cache


@functools.partial(jax.jit, static_argnames=("eos",))
def choose_program(logits, settings: dict[str, jax.Array], steps, *, eos: tuple[int, ...]):
    """Every slot's next token from its logits [S + 1, V], settings and step (`choose_rows`):
    (token [S + 1], its log-prob). One program for the decoding steps and the prefills."""
    traces.note("slots_choose")
    return choose_rows(logits, settings, steps, eos)


# --------------------------------------------------------------------------- the engine


@dataclasses.dataclass(eq=False)
class SlotRequest:
    """One row to generate: its prompt's token ids and settings (max_new_tokens set; a field
    left None is off, temperature 0 is greedy); filled in as it runs."""
    prompt: Sequence[int]
    sampling: Sampling
    seed: int = 0                                      # uint32: the row's sampling key
    stop_ids: frozenset = frozenset()                  # tokens that end it (kept in `tokens`)
    stop_text: Callable[[list[int]], bool] | None = None  # checked after each token
    tag: Any = None                                    # the caller's
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish: str | None = None                          # "stop", "length" or "cancelled"
    queued_at: float = 0.0
    first_token_at: float | None = None
    done_at: float | None = None
    slot: int | None = None
    prefilled: int = 0                                  # prompt tokens in the cache so far
    alone: bool = False                                 # runs with no other (`recover`)


def _bucket(need: int, smallest: int, length: int) -> int:
    """The attention span for `need` positions: smallest * 2^i, at most `length`."""
    span = smallest
    while span < need:
        span *= 2
    return min(span, length)


class SlotEngine:
    """`slots` decode slots of `length` cache positions each over `model`. Thread-safe: `add` and
    `cancel` may come from any thread while one thread runs `step`. Counters: `steps` (decoding
    steps), `prefills` (prefill chunks), `joined_running` (requests admitted while others were
    decoding), `rerun` (requests run again alone after a failed step, `recover`).

    A slot's tokens sit at cache positions 0.. of its own row, whatever the others hold, so a
    request gets the tokens it would get alone (greedy) and joining changes nothing for the others.
    Each request's `Sampling` and seed are a row of per-row arrays (`sampling.stack_rows`), so a new
    setting compiles nothing: the programs are jitted per shape only, the decoding step per
    attention span (a bucket of the longest running row, `min_span` times a power of two up to
    `length`), the prefill chunk per span and rows (1 or `prefill_rows`), counted by
    `clarifyjax.core.traces` as "slots_decode" / "slots_prefill"; `choose_program` is one program,
    "slots_choose". Shapes: S = slots, L = length, C = chunk, r = rows of a program, t = tokens
    per row, k = KV heads, d = head_dim, V = vocab."""

    def __init__(self, model: CausalLM, *, slots: int = 32, length: int = 2048,
                 chunk: int = 64, prefill_rows: int = 4, min_span: int | None = None):
        if min(slots, chunk, prefill_rows, min_span or 1) < 1:
            raise ValueError(f"SlotEngine: slots {slots}, chunk {chunk}, prefill_rows "
                             f"{prefill_rows} and min_span {min_span} must be >= 1")
        self.slots, self.chunk, self.prefill_rows = slots, chunk, prefill_rows
        self.length = -(-int(length) // chunk) * chunk   # chunks start at multiples of C
        self.min_span = min(min_span or chunk, self.length)
        self.eos = tuple(model.config.eos_token_ids)
        self._graphdef, self._state = nnx.split(model)
        self._new_cache = lambda: init_slot_cache(model, slots, self.length)
        self._cache = self._new_cache()
        self._pad = model.config.pad_id
        self._running: list[SlotRequest | None] = [None] * slots
        self._stepping: list[SlotRequest] = []  # the running requests of the step under way
        self._queue: collections.deque[SlotRequest] = collections.deque()
        self._lock = threading.Lock()
        self._last = np.zeros(slots + 1, np.int32)     # the token each slot feeds next
        self._pos = np.zeros(slots + 1, np.int32)      # cache positions each slot fills
        self._settings = _HostSettings(slots + 1)
        self.steps = self.prefills = self.joined_running = self.rerun = 0

    # -- requests (any thread) -----------------------------------------------------------------

    def add(self, request: SlotRequest) -> None:
        """Queue `request`; ValueError when its prompt and max_new_tokens do not fit a slot, or
        its settings and seed do not fit the per-row arrays (int32 top_k, uint32 seed)."""
        if not request.prompt:
            raise ValueError("SlotEngine: an empty prompt")
        max_new = request.sampling.max_new_tokens
        if max_new is None or len(request.prompt) + max_new > self.length:
            raise ValueError(f"{len(request.prompt)} prompt tokens + max_new_tokens "
                             f"{max_new} do not fit a slot of {self.length} positions")
        try:
            stack_rows([request.sampling], [request.seed])
        except (OverflowError, ValueError, TypeError) as e:
            raise ValueError(f"SlotEngine: settings a slot cannot hold: {e}") from None
        request.queued_at = time.monotonic()
        with self._lock:
            self._queue.append(request)

    def cancel(self, request: SlotRequest) -> None:
        """Drop `request`: from the queue, or its slot at the next step."""
        with self._lock:
            if request.finish is None:
                request.finish = "cancelled"
            if request in self._queue:
                self._queue.remove(request)

    def warmup(self) -> int:
        """Compile every program a stream of requests can use (the decoding step at each span,
        prefill chunks of 1 and `prefill_rows` rows at each span a chunk can need) by running
        it once on idle slots -> how many programs ran. Call it before adding requests."""
        spans, span = [], self.min_span
        while span < self.length:
            spans.append(span)
            span *= 2
        spans.append(self.length)
        zeros = np.zeros(self.slots + 1, np.int32)
        ran = 0
        for span in spans:
            logits, self._cache = decode_program(self._graphdef, self._state, self._cache, zeros,
                                                 zeros, span=span)
            ran += 1
            if span < self.chunk:
                continue
            for rows in sorted({1, self.prefill_rows}):
                self._cache = prefill_program(
                    self._graphdef, self._state, self._cache,
                    np.full((rows, self.chunk), self._pad, np.int32), np.zeros(rows, np.int32),
                    np.zeros(rows, np.int32), np.full(rows, self.slots, np.int32), span=span,
                    slots=self.slots)[1]
                ran += 1
        self._choose(logits)
        jax.block_until_ready(self._cache)
        return ran + 1

    def recover(self) -> list[SlotRequest]:
        """After `step` raised: the requests that failed by themselves, out of the engine. A step
        of one request names it; after a step of several, each goes back to the front of the
        queue, from its start, to run alone, so that a request that fails again fails alone and
        the others get what they get alone. The cache (perhaps donated to the failed program)
        is made again at the next step. Counter: `rerun` (requests sent back)."""
        with self._lock:  # the step's requests, those it finished too (nobody heard of them)
            running = [r for r in dict.fromkeys(self._stepping + self._running)
                       if r is not None and r.finish != "cancelled"]
            self._running, self._stepping = [None] * self.slots, []
            if len(running) > 1:
                for r in reversed(running):
                    r.tokens, r.logprobs, r.slot, r.prefilled = [], [], None, 0
                    r.finish = r.first_token_at = r.done_at = None
                    r.alone = True
                    self._queue.appendleft(r)
                self.rerun += len(running)
        self._cache = None
        return running if len(running) == 1 else []

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._queue and not any(self._running)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._queue)

    @property
    def decoding(self) -> int:
        """Requests in a slot with at least one token."""
        return sum(r is not None and bool(r.tokens) for r in self._running)

    # -- one step (one thread) -----------------------------------------------------------------

    def step(self) -> list[SlotRequest]:
        """Free the slots of finished or cancelled requests, admit queued ones into free slots, run
        one prefill chunk (`chunk` prompt tokens of up to `prefill_rows` admitted requests, so a
        long prompt never stalls the running rows for more than a chunk) and one decoding step of
        every slot; returns the requests that finished. When it raises, call `recover`."""
        finished: list[SlotRequest] = []
        self._admit()
        self._stepping = [r for r in self._running if r is not None]
        if self._cache is None:  # after a failed step
            self._cache = self._new_cache()
        prefilling = [r for r in self._running if r is not None and r.prefilled < len(r.prompt)]
        if prefilling:
            self._prefill(prefilling[:self.prefill_rows], finished)
        if any(r is not None and r.prefilled == len(r.prompt) for r in self._running):
            self._decode(finished)
        return finished

    def _admit(self) -> None:
        with self._lock:
            for slot, r in enumerate(self._running):
                if r is not None and r.finish is not None:  # cancelled
                    self._running[slot] = None
            decoding = any(r is not None and r.tokens for r in self._running)
            alone = any(r is not None and r.alone for r in self._running)
            for slot in range(self.slots):
                if alone or not self._queue:
                    break
                if self._running[slot] is not None:
                    continue
                if self._queue[0].alone and any(self._running):  # it waits for an empty engine
                    break
                r = self._queue.popleft()
                r.slot, r.prefilled = slot, 0
                self._running[slot] = r
                self._settings.set(slot, r)
                self._pos[slot] = 0
                self.joined_running += decoding
                alone = r.alone

    def _prefill(self, rows: list[SlotRequest], finished: list[SlotRequest]) -> None:
        count = 1 if len(rows) == 1 else self.prefill_rows  # two programs per span
        ids = np.full((count, self.chunk), self._pad, np.int32)
        starts, lasts = np.zeros(count, np.int32), np.zeros(count, np.int32)
        slots = np.full(count, self.slots, np.int32)  # padding rows: the scratch row
        for i, r in enumerate(rows):
            piece = r.prompt[r.prefilled:r.prefilled + self.chunk]
            ids[i, :len(piece)] = piece
            starts[i], lasts[i], slots[i] = r.prefilled, len(piece) - 1, r.slot
        span = _bucket(int(starts.max()) + self.chunk, self.min_span, self.length)
        logits, self._cache = prefill_program(self._graphdef, self._state, self._cache, ids,
                                              starts, lasts, slots, span=span, slots=self.slots)
        self.prefills += 1
        done = []
        for r in rows:
            r.prefilled = min(len(r.prompt), r.prefilled + self.chunk)
            self._pos[r.slot] = r.prefilled
            if r.prefilled == len(r.prompt):
                done.append(r)
        if done:  # their first tokens
            token, logp = self._choose(logits)
            for r in done:
                self._record(r, int(token[r.slot]), float(logp[r.slot]), finished)

    def _choose(self, logits) -> tuple[np.ndarray, np.ndarray]:
        token, logp = choose_program(logits, self._settings.device(),
                                     self._settings.steps.copy(), eos=self.eos)
        return np.asarray(token), np.asarray(logp)

    def _decode(self, finished: list[SlotRequest]) -> None:
        decoding = [r for r in self._running if r is not None and r.tokens and r.finish is None]
        if not decoding:
            return
        span = _bucket(int(max(self._pos[r.slot] for r in decoding)) + 1, self.min_span,
                       self.length)
        logits, self._cache = decode_program(  # copies: the host arrays change next
            self._graphdef, self._state, self._cache, self._last.copy(), self._pos.copy(),
            span=span)
        token, logp = self._choose(logits)
        self.steps += 1
        for r in decoding:
            self._pos[r.slot] += 1
            self._record(r, int(token[r.slot]), float(logp[r.slot]), finished)

    def _record(self, r: SlotRequest, token: int, logp: float,
                finished: list[SlotRequest]) -> None:
        """A request's new token: kept, and the request finished when it ends it."""
        now = time.monotonic()
        if r.first_token_at is None:
            r.first_token_at = now
        r.tokens.append(token)
        r.logprobs.append(logp)
        self._last[r.slot] = token
        self._settings.steps[r.slot] = len(r.tokens)
        if r.finish is None:
            if token in r.stop_ids or (r.stop_text is not None and r.stop_text(r.tokens)):
                r.finish = "stop"
            elif len(r.tokens) >= r.sampling.max_new_tokens:
                r.finish = "length"
        if r.finish is not None:
            r.done_at = now
            with self._lock:
                self._running[r.slot] = None
            finished.append(r)


class _HostSettings:
    """Every slot's sampling and seed on the host, stacked and sent to the device when one
    changed."""

    def __init__(self, rows: int):
        self.rows = [Sampling(temperature=0)] * rows
        self.seeds = [0] * rows
        self.steps = np.zeros(rows, np.int32)  # tokens each slot has chosen (sent every step)
        self._device: dict[str, jax.Array] | None = None

    def set(self, slot: int, r: SlotRequest) -> None:
        self.rows[slot], self.seeds[slot], self.steps[slot] = r.sampling, r.seed, 0
        self._device = None

    def device(self) -> dict[str, jax.Array]:
        if self._device is None:
            self._device = jax.device_put(stack_rows(self.rows, self.seeds))
        return self._device
