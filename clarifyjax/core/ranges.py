"""Range expressions for numeric settings: ">= 1", "> 0", "== -1", "finite", intervals such as
"[0, 1)" or "(0, 1]", and alternatives joined by " or " ("== -1 or >= 1").

The run configs declare one per numeric field (`clarifyjax.config.loader`), the model loaders check
a checkpoint's config.json with the same rule (`clarifyjax.models.safetensors_io`), and the
commands' numeric options parse with it (`number_type`); it imports nothing of the package, so
all of them may use it.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def finite(value) -> bool:
    """False for a float NaN or infinity; True for anything else."""
    return not isinstance(value, float) or math.isfinite(value)


def within(value, bound: str) -> bool:
    """`value` against ">= a", "> a", "== a", "finite", an interval "[a, b)" / "(a, b]" /
    "[a, b]" / "(a, b)", or alternatives joined by " or ". A float must be finite as well (NaN
    and infinity are meaningless in every field here, and NaN fails no comparison)."""
    if not finite(value):
        return False
    return any(_within_one(value, b.strip()) for b in bound.split(" or "))


def _within_one(value, bound: str) -> bool:
    if bound == "finite":
        return True
    for op, test in ((">=", lambda a: value >= a), ("==", lambda a: value == a),
                     (">", lambda a: value > a)):
        if bound.startswith(op):
            return test(float(bound[len(op):]))
    lo, hi = (float(x) for x in bound[1:-1].split(","))
    return ((lo <= value) if bound[0] == "[" else (lo < value)) and \
        ((value <= hi) if bound[-1] == "]" else (value < hi))


def number_type(kind: type, bound: str | Callable[[], str], *, high: float | None = None
                ) -> Callable[[str], int | float]:
    """An argparse `type`: an int (`kind` int) or a finite float within `bound` and at most
    `high`. `bound` may be a function giving the expression when a value is parsed (a config
    field's own range, read without importing the config at `--help`). argparse puts the
    option's name before the message."""
    def parse(text: str):
        expression = bound() if callable(bound) else bound
        wanted = (("an integer" if kind is int else "a finite number")
                  + ("" if expression == "finite" else f" {expression}")
                  + (f" and <= {high}" if high is not None else ""))
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not (within(value, expression) and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse
