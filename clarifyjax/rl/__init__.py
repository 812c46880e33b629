"""Reinforcement learning: pure PPO math (`ppo`), the policy and value functions (`policy`), and
the rollout sampler (`rollout`)."""
from __future__ import annotations

