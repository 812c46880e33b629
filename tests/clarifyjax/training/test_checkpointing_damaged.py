"""Issue 11, section 2: a damaged latest checkpoint on a tiny SFT run (checkpoints 1 and 2,
``max_to_keep: 2``; see tests/helpers/resume_runs.py).

Each kind of damage to checkpoint 2 must resume from checkpoint 1 with one warning naming the
damaged folder and where it was moved; the moved folder keeps its (damaged) files; the run then
saves step 2 afresh and step 3, and orbax's retention keeps 2 and 3 (never the damaged folder).
With every checkpoint damaged the run stops with one line naming each, and nothing is moved.

A restore that fails for a reason outside the files (out of memory, permission refused, a
network time-out) is not damage: it stops the run with that error and sets nothing aside.
"""
import shutil

import pytest

from helpers import resume_runs
from clarifyjax.models.safetensors_io import CheckpointError


def _largest_array_file(step):
    files = [p for p in (step / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "truncated array file": lambda s: _truncate(_largest_array_file(s)),
    "missing array file": lambda s: _largest_array_file(s).unlink(),
    "missing state folder": lambda s: shutil.rmtree(s / "state"),
    "missing extra folder": lambda s: shutil.rmtree(s / "extra"),
    "empty step folder": lambda s: (shutil.rmtree(s), s.mkdir()),
    "corrupt state metadata": lambda s: (s / "state" / "_METADATA").write_text("{not json"),
    "corrupt extra metadata": lambda s: (s / "extra" / "metadata").write_text("{not json"),
    "corrupt array manifest": lambda s: _truncate(s / "state" / "manifest.ocdbt"),
}


@pytest.mark.slow  # each resumes a training run: 12-24 s apiece, 8 kinds
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_run_resumes(base, tmp_path, capsys,
                                                                      kind):
    run = resume_runs.copy_run(base[0], tmp_path)
    checkpoints = run / "checkpoints"
    DAMAGE[kind](checkpoints / "2")
    damaged = resume_runs.snapshot(checkpoints / "2")
    capsys.readouterr()
    result = resume_runs.train(resume_runs.sft_config(run, base[1], "run.steps=3"))
    out = capsys.readouterr().out
    print(out)
    assert result["step"] == 3
    moved = [p for p in checkpoints.iterdir() if p.name.startswith("2.damaged-")]
    assert len(moved) == 1
    warnings = [line for line in out.splitlines() if "is damaged" in line]
    assert len(warnings) == 1, out
    assert warnings[0].startswith(f"[checkpoint] warning: checkpoint {checkpoints / '2'} is "
                                  "damaged (")
    assert warnings[0].endswith(f"); moved it to {moved[0]} (kept, not deleted) and resumed "
                                "from step 1")
    assert "Traceback" not in out and "TensorStore details" not in warnings[0]
    assert "[checkpoint] resumed from step 1" in out
    assert resume_runs.snapshot(moved[0]) == damaged  # set aside as it was, not repaired or deleted
    # step 2 saved again (not skipped as "already there"), retention counted intact steps only
    assert resume_runs.committed_steps(run) == [2, 3]
    assert {p.name for p in checkpoints.iterdir()} == {"2", "3", moved[0].name}


def test_no_intact_checkpoint_is_one_line_and_moves_nothing(base, tmp_path):
    run = resume_runs.copy_run(base[0], tmp_path)
    DAMAGE["missing state folder"](run / "checkpoints" / "2")
    DAMAGE["truncated array file"](run / "checkpoints" / "1")
    before = resume_runs.snapshot(run)
    with pytest.raises(CheckpointError) as info:
        resume_runs.train(resume_runs.sft_config(run, base[1], "run.steps=3"))
    message = str(info.value)
    print(message)
    checkpoints = run / "checkpoints"
    assert "\n" not in message
    assert message.startswith(f"no intact checkpoint in {checkpoints}: {checkpoints / '2'} is "
                              "damaged (KeyError: ")
    assert f"; {checkpoints / '1'} is damaged (Exception: " in message
    assert message.endswith("nothing was moved or deleted (move the damaged folders aside to "
                            "start afresh)")
    assert resume_runs.snapshot(run) == before  # config.yaml not rewritten, nothing moved


@pytest.mark.parametrize("error", [MemoryError("host out of memory"),
                                   RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating"),
                                   PermissionError(13, "Permission denied"),
                                   TimeoutError("read timed out")])
def test_a_failure_outside_the_files_is_not_damage(base, tmp_path, monkeypatch, error):
    from clarifyjax.training.checkpointing import Checkpointer

    run = resume_runs.copy_run(base[0], tmp_path)
    before = resume_runs.snapshot(run)

    def restore(self, step, abstract_state):
        raise error

    monkeypatch.setattr(Checkpointer, "restore", restore)
    with pytest.raises(type(error)):
        resume_runs.train(resume_runs.sft_config(run, base[1], "run.steps=3"))
    assert not [p for p in (run / "checkpoints").iterdir() if ".damaged-" in p.name]
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"1", "2"}
    assert resume_runs.snapshot(run) == before
