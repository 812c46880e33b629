"""Helpers shared by the test modules (and by the child processes some tests start): `env`
(REPO_ROOT, optional packages, shared data), `children` (child interpreters and their results),
`tiny_models` and `t5_builders` (random model folders), `ppo_runs` and `ppo_bandit` (PPO setups),
`sage_reference`, `sage_files` and `score_cli` (references, files and command lines), and
`resume_runs` (tiny SFT runs to resume)."""
