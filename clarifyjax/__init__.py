"""clarifyjax: ClarifyDelphi (clarification questions trained with PPO) in JAX / Flax NNX.

Subpackages, lowest first (docs/architecture.md is the map): `core`, `files`, `models`, `text`,
`decoding`, `rl`, `config`, `data`, `reward`, `training`, `evaluation`, `serve`, `app`; the
commands are `cli` (`clarifyjax ...`) and `demo` (`make demo`).
"""
