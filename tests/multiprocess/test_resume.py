"""Checkpoints of the PPO loop: kill -9 in the middle of a run and SIGTERM, then resume; the final
state must equal an uninterrupted run's with the same seed. A checkpoint of another model shape
must be refused clearly."""
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from clarifyjax.files.child_result import RESULT_FILE_ENV
from helpers.children import child_result, clean_env
from helpers.resume_runs import committed_steps

STEPS, SAVE_EVERY = 10, 2
# A 1 + 1-layer policy (and value trunk): what is resumed does not depend on the depth, and each of
# the four processes traces, lowers and compiles a third less than with ppo_tiny's 2 + 2 layers.
LAYERS = "policy.tiny.num_layers=1"

SCRIPT = textwrap.dedent("""
    import sys, time
    import jax, numpy as np
    from helpers.ppo_runs import lower_half_share, ppo_config
    from clarifyjax.training import loops
    from clarifyjax.training.checkpointing import Checkpointer
    from clarifyjax.files.child_result import write_result
    from clarifyjax.text.tokenizer import Tokenizer

    out, spm = sys.argv[1], sys.argv[2]
    reward = lower_half_share(Tokenizer.from_pretrained(spm))
    report = {{"resumed_from": None}}
    restore_latest = Checkpointer.restore_latest

    def spy(self, *args, **kwargs):  # which step the loop really resumed from
        restored = restore_latest(self, *args, **kwargs)
        report["resumed_from"] = None if restored is None else int(restored[0])
        return restored

    Checkpointer.restore_latest = spy

    def slow_reward(situations, questions):  # slow enough to be killed between checkpoints
        time.sleep({sleep})
        return reward(situations, questions)

    cfg = ppo_config(out, spm, steps={steps}, overrides=["run.save_every={save_every}",
                                                         "run.async_checkpointing=true",
                                                         "{layers}"])
    result = loops.train_ppo(cfg, reward_fn=slow_reward, tensorboard=False, progress=False,
                             export=False)
    if not result["stopped"]:
        leaves = jax.tree_util.tree_flatten_with_path(result["state"])[0]
        np.savez(out + "/final_state.npz",
                 **{{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}})
    write_result({{**report, "stopped": result["stopped"], "step": int(result["step"])}})
""")


_STARTS = itertools.count()


def _start(tmp_path, out, spm, cache, sleep=0.4):
    """Start a run into `out` (each reward call sleeps `sleep` s, so that a signal can land
    between checkpoints); returns (process, log file, the path of its result)."""
    script = tmp_path / f"run_ppo_{sleep}.py"
    script.write_text(SCRIPT.format(sleep=sleep, steps=STEPS, save_every=SAVE_EVERY, layers=LAYERS))
    result = tmp_path / f"result.{next(_STARTS)}.json"
    env = clean_env(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    **{RESULT_FILE_ENV: str(result)})
    log = open(tmp_path / f"{Path(out).name}.log", "a")
    return subprocess.Popen([sys.executable, str(script), str(out), str(spm)], env=env, stdout=log,
                            stderr=subprocess.STDOUT), log, result


def _wait_for(proc, run: Path, step: int, timeout: float = 400.0) -> list[int]:
    """Poll until checkpoint `step` (or a later one) is committed; the run must still be going."""
    start = time.time()
    while time.time() - start < timeout:
        steps = committed_steps(run)
        if any(s >= step for s in steps):
            return steps
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before checkpoint {step}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no checkpoint {step} after {timeout} s")


def _finish(proc, log, result, tmp_path, name, timeout=400, killed=False) -> dict | None:
    """Wait for the run; its result (None when `killed` by SIGKILL, as it must have been)."""
    rc = proc.wait(timeout=timeout)
    log.close()
    text = (tmp_path / f"{name}.log").read_text()
    if killed:
        assert rc == -signal.SIGKILL, (rc, text[-3000:])
        return None
    return child_result(result, rc, text, "", f"run {name}")


@pytest.mark.slow
def test_kill_sigterm_and_resume_equal_an_uninterrupted_run(tmp_path_factory, tmp_path):
    """Run A: 10 PPO steps of a tiny 1 + 1-layer policy (checkpoints every 2, asynchronous), in
    one go. Run B: kill -9 right after checkpoint 4 is committed (mid-run), restart (it resumes
    from the newest checkpoint), SIGTERM it after a later checkpoint (it must save and exit 0),
    restart again to the end. Every array of B's final state (policy, value, both Adam states,
    KL controller) must equal A's within 1e-6 (they are in fact identical on CPU), and B's last
    step must have logged A's metrics.
    Then the same folder with a wider policy must be refused with a clear CheckpointError."""
    from helpers.tiny_models import tiny_spm_folder

    spm = tiny_spm_folder(tmp_path_factory, vocab_size=600)
    cache = tmp_path / "jax_cache"  # compiled programs shared by the four processes
    run_a, run_b = tmp_path / "a", tmp_path / "b"

    proc, log, result = _start(tmp_path, run_a, spm, cache, sleep=0.0)  # nothing to interrupt
    done = _finish(proc, log, result, tmp_path, "a")
    assert done == {"resumed_from": None, "stopped": False, "step": STEPS}, done

    proc, log, result = _start(tmp_path, run_b, spm, cache)
    before_kill = _wait_for(proc, run_b, 4)
    os.kill(proc.pid, signal.SIGKILL)
    _finish(proc, log, result, tmp_path, "b", killed=True)
    assert STEPS not in before_kill, before_kill
    resumed_from = max(committed_steps(run_b))
    assert 4 <= resumed_from < STEPS

    proc, log, result = _start(tmp_path, run_b, spm, cache)
    _wait_for(proc, run_b, resumed_from + SAVE_EVERY)
    proc.send_signal(signal.SIGTERM)
    done = _finish(proc, log, result, tmp_path, "b")  # exit status 0, or it fails here
    assert done["resumed_from"] == resumed_from, done
    if done["stopped"]:  # SIGTERM landed before the last step: it saved where it stopped
        stopped_at = done["step"]
        assert max(committed_steps(run_b)) == stopped_at < STEPS
        proc, log, result = _start(tmp_path, run_b, spm, cache)
        done = _finish(proc, log, result, tmp_path, "b")
        assert done["resumed_from"] == stopped_at, done
    assert not done["stopped"] and done["step"] == STEPS, done

    a = np.load(run_a / "final_state.npz")
    b = np.load(run_b / "final_state.npz")
    assert sorted(a.files) == sorted(b.files) and len(a.files) > 20
    worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
                if a[k].size else 0.0 for k in a.files)
    print(f"largest difference, resumed vs uninterrupted: {worst}")
    assert worst <= 1e-6, f"resumed run differs from the uninterrupted one by {worst}"
    moved = [k for k in a.files if "policy_params" in k]
    assert moved

    def last_row(run):
        rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
        return [r for r in rows if r["step"] == STEPS and "train/reward_raw" in r][-1]

    ra, rb = last_row(run_a), last_row(run_b)
    for key in ("train/reward_raw", "train/kl_to_ref", "train/policy_loss", "train/value_loss"):
        assert ra[key] == pytest.approx(rb[key], abs=1e-6), key

    # the same folder with a wider policy: the checkpoint is refused, naming a tensor and shapes
    from clarifyjax.training import loops
    from clarifyjax.models.safetensors_io import CheckpointError
    from helpers.ppo_runs import ppo_config

    # (without the run's record of its settings, which would refuse the change by its key first)
    from helpers.resume_runs import forget_record

    forget_record(run_b)
    wider = ppo_config(run_b, spm, steps=STEPS + 2, overrides=[LAYERS, "policy.tiny.d_model=48"])
    with pytest.raises(CheckpointError, match=rf"checkpoint .*/{STEPS}: '.*' has shape \(.*\) in "
                                              r"the checkpoint but the model expects .*another "
                                              r"model shape"):
        loops.train_ppo(wider, reward_fn=lambda s, q: np.zeros(len(q)), tensorboard=False,
                        progress=False, export=False)
