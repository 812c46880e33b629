"""Training: the optimizer, the SFT step, the programs (state, shardings, jitted steps), the SFT
and PPO loops, the dry run and memory plan, checkpoints and the run record."""
from __future__ import annotations

