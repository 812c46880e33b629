"""`sage-jax run`: its config, presets and prompts, generators, resumable stages, the pipeline and
its report."""
from __future__ import annotations

