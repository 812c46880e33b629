"""Offline lm-evaluation-harness task folders (DESIGN §7): lm-eval 0.4.13's own HellaSwag and
TruthfulQA MC YAMLs and utils.py copied into a folder with `dataset_path: json` over local files,
and `local_gen`, a generate_until task over a JSONL of questions; pass the folder with
`--include_path` (`TaskManager(include_path=...)`). Built-in task names reach the Hub."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml


def _task_folder() -> Path:
    import lm_eval

    return Path(lm_eval.__file__).parent / "tasks"


def write_tasks(folder: Path, *, hellaswag: Path, hellaswag_train: Path, truthfulqa: Path) -> Path:
    """Task YAMLs `local_hellaswag` and `local_hellaswag_2shot` (its few-shot examples from
    `hellaswag_train`), `local_truthfulqa_mc1` and `local_truthfulqa_mc2` over the local files."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks = _task_folder()
    shutil.copy(tasks / "hellaswag" / "utils.py", folder / "hellaswag_utils.py")
    shutil.copy(tasks / "truthfulqa" / "utils.py", folder / "truthfulqa_utils.py")
    text = (tasks / "hellaswag" / "hellaswag.yaml").read_text()
    text = text.replace("!function utils.", "!function hellaswag_utils.")
    (folder / "local_hellaswag.yaml").write_text(text.replace("task: hellaswag", "task: local_hellaswag"))
    _replace(folder / "local_hellaswag.yaml", dataset_path="json", training_split="train", tag=None,
             dataset_kwargs={"data_files": {"train": str(hellaswag_train), "validation": str(hellaswag)}})
    shots = (folder / "local_hellaswag.yaml").read_text()
    shots = shots.replace("task: local_hellaswag", "task: local_hellaswag_2shot")
    (folder / "local_hellaswag_2shot.yaml").write_text(shots + "num_fewshot: 2\n")
    for n in (1, 2):
        text = (tasks / "truthfulqa" / f"truthfulqa_mc{n}.yaml").read_text()
        text = text.replace("!function utils.", "!function truthfulqa_utils.")
        text = text.replace("include: truthfulqa_mc1.yaml", "include: local_truthfulqa_mc1.yaml")
        text = text.replace(f"task: truthfulqa_mc{n}", f"task: local_truthfulqa_mc{n}")
        (folder / f"local_truthfulqa_mc{n}.yaml").write_text(text)
    _replace(folder / "local_truthfulqa_mc1.yaml", dataset_path="json", dataset_name=None, tag=None,
             dataset_kwargs={"data_files": {"validation": str(truthfulqa)}})
    return folder


def _replace(path: Path, **values) -> None:
    """Set top-level keys of a task YAML by rewriting their lines (its !function tags stay as text)."""
    lines = path.read_text().splitlines()
    out, skip = [], False
    for line in lines:
        key = line.split(":", 1)[0]
        if skip and line.startswith((" ", "-")):
            continue
        skip = False
        if key in values and not line.startswith(" "):
            skip = True
            if values[key] is not None:
                out.append(yaml.safe_dump({key: values[key]}, default_flow_style=False).rstrip())
            continue
        out.append(line)
    present = {line.split(":", 1)[0] for line in lines}
    out += [yaml.safe_dump({k: v}, default_flow_style=False).rstrip() for k, v in values.items()
            if k not in present and v is not None]
    path.write_text("\n".join(out) + "\n")


GENERATION_TASK = """task: local_gen
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {file}
validation_split: validation
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: {max_gen_toks}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def write_generation_task(folder: Path, rows: list[dict], *, max_gen_toks: int = 12) -> Path:
    """Task `local_gen` (generate_until, stops at a newline or a full stop, exact_match) over
    `rows` ({"question", "answer"}) written as JSONL into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "gen.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "local_gen.yaml").write_text(GENERATION_TASK.format(file=data, max_gen_toks=max_gen_toks))
    return folder
