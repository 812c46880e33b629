"""Helpers shared by the test modules (and by the child processes some tests start).

* `env`: REPO_ROOT, optional packages and the shared data (fail under CI=true, skip locally).
* `children`: start child interpreters (fake CPU devices, several processes, the launch script)
  and read the result each one writes with `clarifyjax.files.child_result.write_result`.
* `tiny_models`: the tiny random model folders of `clarifyjax.models.tiny`, test-flavoured.
* `t5_builders`: random T5s drawn on the host, and torch T5 checkpoints.
* `ppo_runs`: the tiny PPO configuration and toy reward of the training-loop tests.
* `ppo_bandit`: the toy bandit policy of the PPO-update tests.
* `sage_reference`: independent references for the SaGE metric.
* `score_cli`: models, rows and command lines of the `score-questions` tests (fixtures).
* `sage_files`: pairs files and CSVs for the sage-jax reliability tests.
* `resume_runs`: tiny SFT runs to resume, and `forget_record`.
"""
