"""Range expressions for numeric settings: ">= 1", "> 0", "== -1", "finite", intervals such as
"[0, 1)" or "(0, 1]", and alternatives joined by " or " ("== -1 or >= 1").

The run configs declare one per numeric field (`clarifyjax.configlib`), and the model loaders check
a checkpoint's config.json with the same rule (`clarifyjax.models.checkpoint_io`); it imports
nothing of the package, so both may use it.
"""
from __future__ import annotations

import math


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
