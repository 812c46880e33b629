"""Issue 26, item 2: `clarifyjax train CONFIG --dry-run` checks every input the run would read
before it builds or compiles anything: the data files (read in full, as the run reads them), the
model folders (config.json, weight headers, T5 tensor shapes, a classifier's head and labels) and
the tokenizers (with their vocabulary against the model's). Every problem is named by its option,
all of them in one line; `dryrun.check_models=false` plans a run whose models are not there yet
and still reads the data files.

On clarifyjax/presets/sft_question_tiny.yaml and clarifyjax/presets/ppo_tiny.yaml, their models replaced by tiny folders
made here; every dry run here stops before compiling (`dryrun.compile=none`).
"""
from __future__ import annotations

import json
import re
import shutil

import pytest

from clarifyjax import cli
from clarifyjax.config import ConfigError
from clarifyjax.training import dryrun
from helpers.env import REPO_ROOT, shared_data
from helpers.tiny_models import tiny_nli_folder, tiny_spm_folder, tiny_t5_folder

SFT = str(REPO_ROOT / "clarifyjax/presets/sft_question_tiny.yaml")  # run.output_dir: runs/ in the test's folder
PPO = str(REPO_ROOT / "clarifyjax/presets/ppo_tiny.yaml")
NONE = ["dryrun.compile=none"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The tiny folders, the good overrides of each config, and a folder for bad copies."""
    shared_data("delta-clarify/train.tsv")
    spm = tiny_spm_folder(tmp_path_factory, vocab_size=600)
    t5 = tiny_t5_folder(tmp_path_factory, seed=5)
    nli = tiny_nli_folder(tmp_path_factory, seed=6)
    sft = [f"model.tokenizer={spm}"]
    ppo = [f"policy.init={t5}", f"policy.tokenizer={spm}", f"rewards.answerer.init={t5}",
           f"rewards.answerer.tokenizer={spm}", f"rewards.fusion.init={t5}",
           f"rewards.fusion.tokenizer={spm}", f"rewards.judge.model.init={t5}",
           f"rewards.nli.init={nli}"]
    # the refusals read the smaller shared files (each dry run reads its data in full)
    small = [f"data.train_path={shared_data('delta-clarify/dev.tsv')}",
             f"data.dev_path={shared_data('delta-clarify/test.tsv')}"]
    return {"spm": spm, "t5": t5, "nli": nli, "sft": sft, "ppo": ppo, "small": small,
            "tmp": tmp_path_factory.mktemp("bad_inputs")}


def _copy(folder, root, name: str, *, drop=(), config=None, truncate=None):
    """A copy of `folder` under `root`, without the files in `drop`, config.json updated with
    `config`, the file `truncate` cut to half."""
    copy = root / name
    if not copy.exists():
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(*drop))
        if config is not None:
            hf = json.loads((copy / "config.json").read_text())
            (copy / "config.json").write_text(json.dumps({**hf, **config}))
        if truncate is not None:
            data = (copy / truncate).read_bytes()
            (copy / truncate).write_bytes(data[: len(data) // 2])
    return copy


def _file(root, name: str, content: bytes) -> str:
    path = root / name
    path.write_bytes(content)
    return str(path)


def _with(base: list[str], overrides: list[str]) -> list[str]:
    """`base` with `overrides`, each replacing a base item of its key (a key is given once)."""
    keys = {item.partition("=")[0] for item in overrides}
    return [item for item in base if item.partition("=")[0] not in keys] + overrides


def _refused(config: str, overrides: list[str], *options: str) -> str:
    with pytest.raises(ConfigError) as e:
        dryrun.main(config, overrides + NONE, say=lambda _: None)
    text = str(e.value)
    assert "\n" not in text and text.startswith("the run's inputs: "), text
    named = re.findall(r"(?:^the run's inputs: |; )([\w.]+): ", text)
    assert named == list(options), (named, text)
    return text


@pytest.mark.reference
def test_good_inputs_pass_and_are_reported(inputs):
    lines = []
    sft = dryrun.main(SFT, inputs["sft"] + NONE, say=lines.append)
    assert sft["inputs"] == {"data": ["data.train_path", "data.dev_path"], "models": ["model"]}
    ppo = dryrun.main(PPO, inputs["ppo"] + NONE, say=lines.append)
    assert ppo["inputs"]["models"] == ["policy", "rewards.answerer", "rewards.fusion",
                                       "rewards.judge.model", "rewards.nli"]
    assert any("inputs checked: data.train_path, data.dev_path; policy" in line for line in lines)


@pytest.mark.reference
def test_sft_inputs_are_named_by_option(inputs, tmp_path):
    tmp, t5 = inputs["tmp"], inputs["t5"]
    base = inputs["sft"] + inputs["small"]
    no_column = _file(tmp, "no_column.tsv", b"situation\tnothing\nx\ty\n")
    latin1 = _file(tmp, "latin1.tsv", "situation\tquestion\ncaf\xe9\tq?\n".encode("latin-1"))
    empty = _file(tmp, "empty.tsv", b"")
    init = ["model.tiny=null", "model.tokenizer=null"]
    cases = [  # (overrides, the options the error names, text it holds)
        (["data.train_path=/nonexistent/train.tsv"], ["data.train_path"], "data file not found"),
        (["data.dev_path=/nonexistent/dev.tsv"], ["data.dev_path"], "data file not found"),
        ([f"data.train_path={tmp}"], ["data.train_path"], "data file not found"),
        ([f"data.train_path={no_column}"], ["data.train_path"], "missing column"),
        ([f"data.train_path={latin1}"], ["data.train_path"], "UTF-8"),
        ([f"data.dev_path={empty}"], ["data.dev_path"], "empty"),
        (["model.tokenizer=/nonexistent/spm"], ["model.tokenizer"], "not found"),
        ([f"model.tokenizer={tmp_path}"], ["model.tokenizer"], ""),
        (["model.tiny.vocab_size=100"], ["model.tokenizer"], "tokens but the model's "
                                                             "vocab_size is 100"),
        (init + ["model.init=/nonexistent/t5"], ["model.init"], "not found"),
        (init + [f"model.init={_copy(t5, tmp, 'cut', truncate='model.safetensors')}"],
         ["model.init"], "model.safetensors"),
        (init + [f"model.init={_copy(t5, tmp, 'wide', config={'d_model': 48})}"],
         ["model.init"], "shape"),
        (init + [f"model.init={_copy(t5, tmp, 'nospm', drop=['spiece.model'])}"],
         ["model.init"], ""),
        (init + [f"model.init={_copy(t5, tmp, 'noweights', drop=['model.safetensors'])}"],
         ["model.init"], ""),
        (["data.train_path=/nonexistent/train.tsv", "model.tokenizer=/nonexistent/spm"],
         ["data.train_path", "model.tokenizer"], ""),
    ]
    bad_json = _copy(t5, tmp, "badjson")
    (bad_json / "config.json").write_text("{not json")
    cases.append((init + [f"model.init={bad_json}"], ["model.init"], "invalid JSON"))
    for overrides, options, message in cases:
        text = _refused(SFT, _with(base, overrides), *options)
        assert message in text, (overrides, text)


@pytest.mark.reference
def test_ppo_inputs_are_named_by_option(inputs):
    tmp, t5, nli = inputs["tmp"], inputs["t5"], inputs["nli"]
    base = inputs["ppo"] + inputs["small"]
    no_situation = _file(tmp, "no_situation.tsv", b"text\nx\n")
    cases = [
        (["data.train_path=/nonexistent/train.tsv"], ["data.train_path"]),
        (["data.dev_path=/nonexistent/dev.tsv"], ["data.dev_path"]),
        ([f"data.train_path={no_situation}"], ["data.train_path"]),
        (["policy.init=/nonexistent"], ["policy.init"]),
        (["policy.tokenizer=/nonexistent"], ["policy.tokenizer"]),
        (["reference.init=/nonexistent"], ["reference.init"]),
        (["value.model.init=/nonexistent"], ["value.model.init"]),
        (["rewards.answerer.init=/nonexistent"], ["rewards.answerer.init"]),
        (["rewards.fusion.tokenizer=/nonexistent"], ["rewards.fusion.tokenizer"]),
        ([f"rewards.judge.model.init={_copy(t5, tmp, 'judge_nospm', drop=['spiece.model'])}"],
         ["rewards.judge.model.init"]),
        ([f"rewards.nli.init={t5}"], ["rewards.nli.init"]),  # a T5 is no classifier
        ([f"rewards.nli.init={_copy(nli, tmp, 'nli_notok', drop=['tokenizer.json'])}"],
         ["rewards.nli.init"]),
        ([f"rewards.nli.init={_copy(nli, tmp, 'nli_bare', config={'architectures': ['RobertaModel']})}"],
         ["rewards.nli.init"]),
        (["policy.init=/nonexistent", "rewards.fusion.init=/nonexistent",
          "data.dev_path=/nonexistent/dev.tsv"],
         ["data.dev_path", "policy.init", "rewards.fusion.init"]),
    ]
    for overrides, options in cases:
        _refused(PPO, _with(base, overrides), *options)


def test_too_little_data_is_refused(inputs, capsys):
    """Issue 37: a train_rows smaller than one batch, a training file of fewer rows than a batch,
    and a file with a header and no rows: the dry run passed them, the run stopped once it had
    built its models."""
    tmp = inputs["tmp"]
    gold = b"id\tsource\tsituation\tquestion\n"
    header_only = _file(tmp, "no_rows.tsv", gold)
    few = _file(tmp, "three_rows.tsv", gold + b"".join(b"%d\tx\tSituation %d.\tWhy?\n" % (i, i) for i in range(3)))
    sft = inputs["sft"] + inputs["small"]
    with pytest.raises(ConfigError, match=r"data\.train_rows: 8 pairs are fewer than one batch "
                                          r"\(data\.batch_size = 32\)"):
        dryrun.main(SFT, _with(sft, ["data.train_rows=8"]) + NONE, say=lambda _: None)
    assert cli.main(["train", SFT, *_with(sft, ["data.train_rows=31"]), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "data.train_rows: 31 pairs are fewer than one batch" in err, err
    text = _refused(SFT, _with(sft, [f"data.train_path={header_only}"]), "data.train_path")
    assert f"data.train_path: {header_only}: no question pairs in it (only a header" in text, text
    _refused(SFT, _with(sft, [f"data.dev_path={header_only}"]), "data.dev_path")
    text = _refused(SFT, _with(sft, [f"data.train_path={few}"]), "data.train_path")
    assert text.endswith("data.train_path: 3 training pairs, fewer than one batch (data.batch_size = 32)"), text
    ppo = inputs["ppo"] + inputs["small"]
    _refused(PPO, _with(ppo, [f"data.train_path={header_only}"]), "data.train_path")
    _refused(PPO, _with(ppo, [f"data.dev_path={header_only}"]), "data.dev_path")
    text = _refused(PPO, _with(ppo, [f"data.train_path={few}"]), "data.train_path")
    assert text.endswith("data.train_path: 3 training situations, fewer than one batch of 4 "
                         "(ppo.batch_size / ppo.samples_per_situation)"), text


@pytest.mark.reference
def test_check_models_false_still_reads_the_data(inputs):
    # the shipped tiny config as it is: its runs/ folders are not made here
    report = dryrun.main(SFT, ["dryrun.check_models=false"] + NONE, say=lambda _: None)
    assert report["inputs"]["models"] == []
    _refused(SFT, ["dryrun.check_models=false", "data.train_path=/nonexistent/train.tsv"],
             "data.train_path")
    with pytest.raises(ValueError, match="dryrun.check_models='maybe': expected true or false"):
        dryrun.main(SFT, ["dryrun.check_models=maybe"] + NONE, say=lambda _: None)


@pytest.mark.e2e
def test_the_issue_command_exits_2_with_one_line(capsys):
    """The issue's command: `clarifyjax train clarifyjax/presets/sft_question_tiny.yaml
    data.train_path=/nonexistent/train.tsv --dry-run`."""
    capsys.readouterr()
    status = cli.main(["train", SFT, "data.train_path=/nonexistent/train.tsv", "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.count("\n") == 0, err
    assert err.startswith("clarifyjax train: error: the run's inputs: data.train_path: data file "
                          "not found: /nonexistent/train.tsv"), err
