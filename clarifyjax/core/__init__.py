"""Foundations that import nothing of the package: meshes and sharding, the multi-host start,
padded-shape buckets, range expressions, compile counts, metrics logging."""
from __future__ import annotations

