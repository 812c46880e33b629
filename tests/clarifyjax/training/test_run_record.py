"""Issue 11, section 2: a resumed run must not silently accept changed settings, and a data path
that does not exist must not fall back to the example files.

* A resume that changes a setting outside `run_record.RESUMABLE` stops with one line naming every
  differing key and both values, before any model is built (the builders are replaced by functions
  that fail the test) and with every file of the run folder byte-identical.
* The record is the checkpoint's own (``extra.config``): deleting or editing config.yaml changes
  nothing; checkpoints without one (older code) fall back to config.yaml.
* Allowed changes resume, and are written to config.yaml and config_history.jsonl only after the
  restore.
* A missing data file is one line naming the option and the path, before anything is built.

Bad inputs tried here: 14 SFT settings (one of them three keys at once), 5 PPO settings on a
recorded folder and another policy on a real PPO run, a refused change through the CLI,
config.yaml deleted, config.yaml edited, record-less checkpoints with and without config.yaml,
5 missing data paths (SFT and PPO train/dev, the old example-fallback name through the CLI): 30.
"""
import json

import numpy as np
import pytest

from helpers import resume_runs
from clarifyjax import cli
from clarifyjax.training import run_record
from clarifyjax.training import loops
from clarifyjax.config import ConfigError, dump_config, load_config
from clarifyjax.files.tables import DataError
from helpers.env import REPO_ROOT, shared_data

DEV = str(shared_data("delta-clarify/dev.tsv"))
TRAIN = str(shared_data("delta-clarify/train.tsv"))
TEST = str(shared_data("delta-clarify/test.tsv"))


@pytest.fixture
def nothing_built(monkeypatch):
    """A refusal must come before any model, tokenizer or dataset is built."""
    def built(*args, **kwargs):
        raise AssertionError("something was built before the refusal")

    monkeypatch.setattr(loops.builders, "build_t5", built)
    monkeypatch.setattr(loops.data, "load_sft_pairs", built)
    monkeypatch.setattr(loops.data, "load_ppo_situations", built)
    monkeypatch.setattr(loops.Tokenizer, "from_pretrained", built)


def _refused(run, cfg, step: int = 2, source: str | None = None, **kwargs) -> str:
    """The one-line ConfigError of resuming `cfg`; the run folder must stay byte-identical."""
    before = resume_runs.snapshot(run)
    with pytest.raises(ConfigError) as info:
        (loops.train_ppo if cfg.kind == "ppo" else loops.train_sft)(
            cfg, tensorboard=False, progress=False, export=False, **kwargs)
    message = str(info.value)
    print(message)
    source = source or f"checkpoint {run / 'checkpoints' / str(step)}"
    assert "\n" not in message
    assert message.startswith(f"{run}: cannot resume with changed settings (recorded in "
                              f"{source}): "), message
    assert "may change on resume; restore the recorded values, or give a new run.output_dir" \
        in message
    assert resume_runs.snapshot(run) == before
    return message


def test_a_fresh_run_records_its_config(base):
    run, _ = base
    cfg = resume_runs.sft_config(run, base[1])
    assert (run / "config.yaml").read_text() == dump_config(cfg)
    assert not (run / "config_history.jsonl").exists()
    for step in (1, 2):
        extra = json.loads((run / "checkpoints" / str(step) / "extra" / "metadata").read_text())
        assert extra["config"] == run_record.as_record(cfg)


SFT_CHANGES = [  # (overrides, what the message must say); {model}, {other}: model folders
    (["optimizer.lr=2e-3"], "optimizer.lr: 0.001 in the record, 0.002 now"),
    (["model.init={other}"], 'model.init: "{model}" in the record, "{other}" now'),
    (["run.seed=1"], "run.seed: 0 in the record, 1 now"),
    ([f"data.train_path={TRAIN}"], f'data.train_path: "{DEV}" in the record, "{TRAIN}" now'),
    (["data.dev_path=null"], f'data.dev_path: "{TEST}" in the record, null now'),
    (["data.batch_size=4"], "data.batch_size: 8 in the record, 4 now"),
    (["data.train_rows=32"], "data.train_rows: 64 in the record, 32 now"),
    (["data.length_buckets=[8,16]"], "data.length_buckets: [16] in the record, [8, 16] now"),
    (["model.dropout_rate=0.1"], "model.dropout_rate: 0.0 in the record, 0.1 now"),
    (["optimizer.schedule=cosine"], 'optimizer.schedule: "linear" in the record, "cosine" now'),
    (["optimizer.grad_accum=2"], "optimizer.grad_accum: 1 in the record, 2 now"),
    (["task=answerer"], 'task: "question" in the record, "answerer" now'),
    (["model.tokenizer={model}"], 'model.tokenizer: null in the record, "{model}" now'),
    (["optimizer.lr=2e-3", "run.seed=1", "model.max_input_length=32"],  # all named, in order
     "run.seed: 0 in the record, 1 now; model.max_input_length: 16 in the record, 32 now; "
     "optimizer.lr: 0.001 in the record, 0.002 now."),
]


@pytest.mark.parametrize("overrides,expected", SFT_CHANGES,
                         ids=[c[0][0].split("=")[0] + ("+2" if len(c[0]) > 1 else "")
                              for c in SFT_CHANGES])
def test_a_changed_sft_setting_is_refused_before_anything_is_built(
        base, tmp_path, tmp_path_factory, nothing_built, overrides, expected):
    paths = {"model": str(base[1]), "other": str(resume_runs.t5_folder(tmp_path_factory, seed=1))}
    run = resume_runs.copy_run(base[0], tmp_path)
    cfg = resume_runs.sft_config(run, base[1], "run.steps=3", *[o.format(**paths) for o in overrides])
    message = _refused(run, cfg)
    differing = message.split(". Only ")[0]
    assert expected.format(**paths) in message
    assert "run.steps" not in differing and "run.output_dir" not in differing  # allowed changes
    assert "mesh.*, run.async_checkpointing, " in message  # says which settings may change


@pytest.mark.e2e
def test_the_cli_refuses_with_one_line_and_exit_status_2(base, tmp_path, capsys, nothing_built):
    run = resume_runs.copy_run(base[0], tmp_path)
    before = resume_runs.snapshot(run)
    rc = cli.main(["train", str(resume_runs.CONFIG), *resume_runs.sft_overrides(run, base[1], "optimizer.lr=2e-3"),
                   "--no-progress", "--no-tensorboard"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"clarifyjax train: error: {run}: cannot resume with changed ")
    assert "optimizer.lr: 0.001 in the record, 0.002 now" in lines[0]
    assert resume_runs.snapshot(run) == before


def test_deleted_or_edited_config_yaml_is_checked_against_the_checkpoint(base, tmp_path,
                                                                          nothing_built):
    run = resume_runs.copy_run(base[0], tmp_path)
    (run / "config.yaml").unlink()
    _refused(run, resume_runs.sft_config(run, base[1], "optimizer.lr=2e-3"))
    assert not (run / "config.yaml").exists()
    (run / "config.yaml").write_text(dump_config(resume_runs.sft_config(run, base[1], "optimizer.lr=2e-3")))
    message = _refused(run, resume_runs.sft_config(run, base[1], "optimizer.lr=2e-3"))  # the edit is moot
    assert "optimizer.lr: 0.001 in the record, 0.002 now" in message


def test_checkpoints_without_a_record_fall_back_to_config_yaml(base, tmp_path, capsys):
    run = resume_runs.copy_run(base[0], tmp_path)
    resume_runs.forget_record(run, keep_config_yaml=True)  # older checkpoints, config.yaml kept
    message = _refused(run, resume_runs.sft_config(run, base[1], "run.seed=3"),
                       source=str(run / "config.yaml"))
    assert "run.seed: 0 in the record, 3 now" in message
    (run / "config.yaml").unlink()  # nothing left to compare with: said, then resumed
    capsys.readouterr()
    result = resume_runs.train(resume_runs.sft_config(run, base[1]))
    out = capsys.readouterr().out
    assert result["step"] == 2 and "[checkpoint] resumed from step 2" in out
    assert "has checkpoints but no recorded config" in out and "cannot be checked" in out


@pytest.mark.slow  # resumes a run with every allowed change: ~20 s
def test_allowed_changes_resume_and_are_recorded_after_the_restore(base, tmp_path, capsys):
    """Every RESUMABLE key of an SFT run changed at once (the mesh too: checkpoints restore into
    any layout); the run continues from step 2 to 3."""
    run = resume_runs.copy_run(base[0], tmp_path)
    changed = ["run.steps=3", "run.name=renamed", "run.eval_every=3", "run.save_every=3",
               "run.log_every=2", "run.sample_every=5", "run.max_to_keep=3",
               "run.async_checkpointing=true", "mesh.data=1", "mesh.rules=fsdp",
               "data.eval_batch_size=4", "data.dev_rows=4"]
    cfg = resume_runs.sft_config(run, base[1], *changed)
    capsys.readouterr()
    result = resume_runs.train(cfg)
    out = capsys.readouterr().out
    assert result["step"] == 3 and "[checkpoint] resumed from step 2" in out
    assert "[resume] run.steps: 2 -> 3 from step 2" in out
    assert "the linear learning-rate schedule now ends at step 3 instead of 2" in out
    assert (run / "config.yaml").read_text() == dump_config(cfg)
    history = [json.loads(line) for line in open(run / "config_history.jsonl")]
    assert len(history) == 1 and history[0]["step"] == 2
    assert history[0]["changes"]["run.output_dir"] == [str(base[0]), str(run)]
    assert history[0]["changes"]["mesh.rules"] == ["default", "fsdp"]
    assert len(history[0]["changes"]) == len(changed) + 1
    extra = json.loads((run / "checkpoints" / "3" / "extra" / "metadata").read_text())
    assert extra["config"] == run_record.as_record(cfg)

    resume_runs.train(cfg)  # the same settings again: nothing to record
    assert len(open(run / "config_history.jsonl").readlines()) == 1
    message = _refused(run, resume_runs.sft_config(run, base[1], *changed, "optimizer.lr=5e-3"), step=3)
    assert "optimizer.lr: 0.001 in the record, 0.005 now" in message


def test_the_tables_of_allowed_keys():
    assert run_record.allowed("sft", "mesh.rules") and run_record.allowed("ppo", "run.steps")
    assert run_record.allowed("ppo", "data.dev_path")  # PPO reads it for evaluation only
    assert not run_record.allowed("sft", "data.dev_path")  # null: the split decides the train rows
    for key in ("run.seed", "optimizer.lr", "model.init", "policy.init", "rewards.dropped_answer",
                "data.train_path", "data.batch_size", "normalizer.gain", "run"):
        assert not run_record.allowed("sft", key) and not run_record.allowed("ppo", key), key
    changed, one_sided = run_record.differences(
        {"a": {"b": 1, "gone": 2}, "ref": None}, {"a": {"b": 1, "new": 3}, "ref": {"init": "x"}})
    assert changed == [("ref", None, {"init": "x"})] and one_sided == ["a.gone", "a.new"]


# --------------------------------------------------------------------------- PPO


def _ppo_config(run_dir, policy, *overrides):
    return load_config(REPO_ROOT / "clarifyjax" / "presets" / "ppo_tiny.yaml", [
        f"run.output_dir={run_dir}", "run.steps=1", "run.save_every=1", "run.eval_every=0",
        "run.sample_every=0", "run.log_every=1", "run.async_checkpointing=false",
        f"policy.init={policy}", "policy.tokenizer=null", "policy.max_input_length=32",
        f"data.train_path={DEV}", f"data.dev_path={TEST}", "data.dev_situations=8",
        "data.length_buckets=[32]", "ppo.batch_size=4", "ppo.minibatches=1", "ppo.epochs=1",
        "ppo.sampling.max_new_tokens=4", "normalizer.fit=false",
        "normalizer.fit_batches=8", *overrides])  # (another count is refused when nothing is fit)


def _zero_reward(situations, questions):
    return np.zeros(len(questions))


@pytest.fixture(scope="module")
def ppo_record(tmp_path_factory):
    """A PPO run folder reduced to what the check reads before building anything: checkpoint 1's
    extra JSON with the run's config (`test_a_real_ppo_run_records_and_refuses` runs for real)."""
    policy = resume_runs.t5_folder(tmp_path_factory)
    run = tmp_path_factory.mktemp("ppo_record") / "run"
    (run / "checkpoints" / "1" / "extra").mkdir(parents=True)
    config = run_record.as_record(_ppo_config(run, policy))
    (run / "checkpoints" / "1" / "extra" / "metadata").write_text(json.dumps({"config": config}))
    return run, policy


PPO_CHANGES = [
    ("policy.init={other}", 'policy.init: "{policy}" in the record, "{other}" now'),
    ("rewards.dropped_answer=blank",
     'rewards.dropped_answer: "zero_reward" in the record, "blank" now'),
    ("normalizer.gain=1.0", "normalizer.gain: 4.0725 in the record, 1.0 now"),
    ("ppo.kl_coef=0.3", "ppo.kl_coef: 0.15 in the record, 0.3 now"),
    ("reference={policy}", 'reference: null in the record, {{"init": "{policy}", '),
]


@pytest.mark.parametrize("override,expected", PPO_CHANGES,
                         ids=[c[0].split("=")[0] for c in PPO_CHANGES])
def test_a_changed_ppo_setting_is_refused_before_anything_is_built(
        ppo_record, tmp_path_factory, nothing_built, override, expected):
    run, policy = ppo_record
    paths = {"policy": str(policy), "other": str(resume_runs.t5_folder(tmp_path_factory, seed=1))}
    cfg = _ppo_config(run, policy, "run.steps=2", override.format(**paths))
    message = _refused(run, cfg, step=1, reward_fn=_zero_reward)
    assert expected.format(**paths) in message


@pytest.mark.slow
def test_a_real_ppo_run_records_and_refuses(tmp_path_factory, tmp_path, capsys):
    """One real PPO step: its checkpoint records the config; another policy is refused; the
    evaluation set (dev file and size) may change, and is written to config_history.jsonl."""
    policy = resume_runs.t5_folder(tmp_path_factory)
    run = tmp_path / "run"
    cfg = _ppo_config(run, policy)
    assert loops.train_ppo(cfg, reward_fn=_zero_reward, tensorboard=False, progress=False,
                           export=False)["step"] == 1
    extra = json.loads((run / "checkpoints" / "1" / "extra" / "metadata").read_text())
    assert extra["config"] == run_record.as_record(cfg) and "normalizer" in extra
    other = resume_runs.t5_folder(tmp_path_factory, seed=1)
    message = _refused(run, _ppo_config(run, other), step=1, reward_fn=_zero_reward)
    assert f'policy.init: "{policy}" in the record, "{other}" now' in message

    cfg = _ppo_config(run, policy, f"data.dev_path={TRAIN}", "data.dev_situations=4")
    capsys.readouterr()
    result = loops.train_ppo(cfg, reward_fn=_zero_reward, tensorboard=False, progress=False,
                             export=False)
    assert result["step"] == 1 and "[checkpoint] resumed from step 1" in capsys.readouterr().out
    changes = json.loads((run / "config_history.jsonl").read_text())["changes"]
    assert changes == {"data.dev_path": [TEST, TRAIN], "data.dev_situations": [8, 4]}


# --------------------------------------------------------------------------- data paths


def _missing(option: str, path: str, message: str) -> None:
    print(message)
    assert "\n" not in message
    assert message.startswith(f"{option}: data file not found: {path} (looked at "), message
    assert "examples" not in message


@pytest.mark.parametrize("option", ["data.train_path", "data.dev_path"])
@pytest.mark.parametrize("kind", ["sft", "ppo"])
def test_a_missing_data_file_names_its_option_before_anything_is_built(
        kind, option, tmp_path, nothing_built):
    run = tmp_path / "run"
    missing = str(tmp_path / "no_such.tsv")
    if kind == "sft":
        cfg = resume_runs.sft_config(run, tmp_path / "model", f"{option}={missing}")
    else:
        cfg = _ppo_config(run, tmp_path / "model", f"{option}={missing}")
    with pytest.raises(DataError) as info:
        loops.run(cfg, tensorboard=False, progress=False, export=False)
    _missing(option, missing, str(info.value))
    assert not run.exists()  # nothing was written


@pytest.mark.e2e
def test_the_example_files_are_not_a_fallback(tmp_path, capsys, monkeypatch, nothing_built):
    """With a data folder that lacks it, `delta-clarify/train.tsv` exists only as
    examples/delta-clarify/train.tsv, which the old resolver read instead; now it is an error,
    through the CLI too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("CLARIFYJAX_DATA", str(tmp_path / "data"))  # restored after the test
    assert (REPO_ROOT / "examples" / "delta-clarify" / "train.tsv").is_file()
    rc = cli.main(["train", str(resume_runs.CONFIG), f"run.output_dir={tmp_path / 'run'}",
                   "data.train_path=delta-clarify/train.tsv", "--no-progress"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert rc == 2 and len(lines) == 1, lines
    _missing("data.train_path", "delta-clarify/train.tsv",
             lines[0].removeprefix("clarifyjax train: error: "))
    assert not (tmp_path / "run").exists()
