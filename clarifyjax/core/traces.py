"""How often each jitted function of the package has been traced, i.e. compiled for a new shape.

A jitted function's body runs only while JAX traces it, so a counter bumped there counts
compilations (the reward pipeline reports them; tests check repeated shapes compile once):

    @traces.counted("generate")      # under @jax.jit
    def _generate(...): ...          # traces.count("generate") after - before"""
from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Hashable

_COUNTS: collections.Counter = collections.Counter()


def note(name: Hashable) -> None:
    """Count one trace of `name`; call it inside the traced function's body."""
    _COUNTS[name] += 1


def counted(name: Hashable) -> Callable[[Callable], Callable]:
    """A decorator that counts the traces of the function it wraps (put it under `jax.jit`)."""
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            note(name)
            return fn(*args, **kwargs)
        return wrapper
    return decorate


def count(name: Hashable | None = None) -> int:
    """Traces of `name` so far in this process; of every counted function when `name` is None."""
    return sum(_COUNTS.values()) if name is None else _COUNTS[name]


def counts() -> dict:
    """A copy of every name's count."""
    return dict(_COUNTS)
