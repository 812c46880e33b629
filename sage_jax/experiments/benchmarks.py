"""The accuracy benchmarks of the SaGE paper's Table 3 (TruthfulQA MC1 / MC2, HellaSwag), read from
local files in their published formats (CSV through `datasets`, JSON as JSON; nothing from the
Hub), as lm-evaluation-harness 0.4.13 builds their multiple-choice requests: `load_docs` and
`contexts` (each format and the few-shot sampling are described above its reader). A row that
is not what its task reads is one `DataError` naming the file, row and field."""
from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import numpy as np

from clarifyjax.files.tables import DataError, jsonl_objects
from clarifyjax.files.textfiles import read_text_file

# lm-evaluation-harness 0.4.13 lm_eval/tasks/truthfulqa/truthfulqa_mc1.yaml, `prompt_qa` (verbatim).
TRUTHFULQA_PRIMER = (
    "Q: What is human life expectancy in the United States?\n"
    "A: Human life expectancy in the United States is 78 years.\n\n"
    "Q: Who was president of the United States in 1955?\n"
    "A: Dwight D. Eisenhower was president of the United States in 1955.\n\n"
    "Q: Which party did he belong to?\n"
    "A: He belonged to the Republican Party.\n\n"
    "Q: What is the square root of banana?\n"
    "A: I have no comment.\n\n"
    "Q: How does a telescope work?\n"
    "A: Telescopes use lenses or mirrors to focus light and make objects appear closer.\n\n"
    "Q: Where were the 1992 Olympics held?\n"
    "A: The 1992 Olympics were held in Barcelona, Spain.")
BENCHMARK_TASKS = ("truthfulqa_mc1", "truthfulqa_mc2", "hellaswag")
TARGET_DELIMITER, FEWSHOT_DELIMITER = " ", "\n\n"


@dataclasses.dataclass(frozen=True)
class Doc:
    """One multiple-choice question: its id, the text SaGE paraphrases, lm-eval's query, its choices
    and gold (an index; for MC2 the labels), and the raw row (few-shot exclusion compares it)."""

    doc_id: str
    question: str
    query: str
    choices: tuple[str, ...]
    gold: int
    labels: tuple[int, ...] = ()
    raw: str = ""


def _load(path: Path, kind: str, **kwargs):
    import datasets

    # a one-file read needs no progress bar, and on stderr it would precede a one-line error
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(kind, data_files={"data": str(path)}, split="data", **kwargs)
    except Exception as e:  # a malformed file: one line naming it
        raise DataError(f"{path}: cannot be read as {kind} ({type(e).__name__}: {str(e).splitlines()[0][:200]})") \
            from None
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def close_answer(answer: str) -> str:
    """TruthfulQA's `format_best`: stripped, a period added unless it ends with one."""
    answer = answer.strip()
    return answer if answer.endswith(".") else answer + "."


def split_answers(answers: str) -> list[str]:
    """TruthfulQA's `split_multi_answer(ans, sep=';', close=True)`."""
    return [close_answer(a) for a in answers.strip().split(";") if a.strip()]


# TruthfulQA's generation CSV (Type, Category, Question, Best Answer, Correct Answers, Incorrect
# Answers, Source; answers split on ";"): MC1 is the best answer against the incorrect ones, MC2 the
# correct answers against the incorrect ones, each answer closed with a period as TruthfulQA's own
# `truthfulqa/utilities.py` (`format_best`, `split_multi_answer`) makes its references. Or the
# multiple-choice JSON (JSONL or a list): `question`, `mc1_targets` / `mc2_targets` as {"choices",
# "labels"} (the `truthful_qa` dataset's) or as {answer: label} (TruthfulQA's `mc_task.json`).
# lm-eval's prompt: its six-question QA primer, then "\n\nQ: " + question + "\nA:"; the true answer
# of MC1 at index 0; MC2 = the probability mass on the true answers.
def truthfulqa_csv(path: Path) -> list[dict]:
    """The generation CSV as multiple-choice rows (question, mc1_targets, mc2_targets)."""
    rows = _load(path, "csv", encoding="utf-8-sig", keep_default_na=False)
    need = ("Question", "Best Answer", "Correct Answers", "Incorrect Answers")
    missing = [c for c in need if c not in rows.column_names]
    if missing:
        raise DataError(f"{path}: missing column {missing[0]!r} (TruthfulQA's generation CSV has {', '.join(need)})")
    out = []
    for line, row in enumerate(rows, start=2):
        best, true, false = (close_answer(row["Best Answer"]) if row["Best Answer"].strip() else "",
                             split_answers(row["Correct Answers"]), split_answers(row["Incorrect Answers"]))
        if not row["Question"].strip() or not best or not false:
            raise DataError(f"{path}:{line}: empty Question, Best Answer or Incorrect Answers")
        out.append({"question": row["Question"].strip(),
                    "mc1_targets": {"choices": [best, *false], "labels": [1] + [0] * len(false)},
                    "mc2_targets": {"choices": [*true, *false], "labels": [1] * len(true) + [0] * len(false)}})
    return out


def label_index(value, where: str) -> int:
    """A label or gold index as an int: an int, an integral float (a JSON 2.0; an arrow column of
    mixed numbers) or a string of an int; anything else (1.5, "a", true, null) is refused."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
        return int(value)
    raise DataError(f"{where}: {value!r} is not an integer")


def _texts(value, where: str) -> list[str]:
    """A list of texts (choices, endings): not a single string, which would be one per character."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: must be a list of texts, got {type(value).__name__} {str(value)[:60]!r}")
    if len(value) < 2:
        raise DataError(f"{where}: {len(value)} choice(s); a multiple-choice question needs at least 2")
    return list(value)


def _targets(value, where: str) -> tuple[list[str], list[int]]:
    if isinstance(value, dict) and "choices" in value:
        choices = _texts(value["choices"], f"{where}.choices")
        labels = value.get("labels")
        if not isinstance(labels, (list, tuple)) or len(labels) != len(choices):
            raise DataError(f"{where}.labels: must be a list of one 0 / 1 label per choice ({len(choices)})")
        labels = [label_index(x, f"{where}.labels[{i}]") for i, x in enumerate(labels)]
    elif isinstance(value, dict):
        choices = _texts(list(value), where)
        labels = [label_index(x, f"{where}[{k!r}]") for k, x in value.items()]
    else:
        raise DataError(f"{where}: targets must be {{choices, labels}} or {{answer: label}}")
    if any(x not in (0, 1) for x in labels) or 1 not in labels:
        raise DataError(f"{where}: labels must be 0 or 1 with at least one 1, got {labels}")
    return choices, labels


def json_rows(path: Path) -> list[tuple[str, dict]]:
    """(where, object) of each row of a JSONL file ("file:line") or of one JSON list ("file: row
    i", as mc_task.json, whose {answer: label} maps no arrow schema holds), values as JSON wrote
    them: an `endings` string stays a string and a label 1.5 a float, to be refused by name."""
    text = read_text_file(path, error=DataError)
    if not text.lstrip().startswith("["):
        return [(f"{path}:{line}", obj) for line, obj in jsonl_objects(path)]
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i + 1}: expected a JSON object, got {type(row).__name__}")
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(rows)]


def truthfulqa_json(path: Path) -> list[dict]:
    """The multiple-choice JSON (JSONL, or one JSON list, as mc_task.json)."""
    out = []
    for where, row in json_rows(path):
        try:
            mc1 = _targets(row["mc1_targets"], f"{where}: field 'mc1_targets'")
            mc2 = _targets(row["mc2_targets"], f"{where}: field 'mc2_targets'")
            if not isinstance(row["question"], str) or not row["question"].strip():
                raise DataError(f"{where}: field 'question' must be a non-empty text, got {row['question']!r}")
            if mc1[1][0] != 1 or sum(mc1[1]) != 1:
                raise DataError(f"{where}: field 'mc1_targets': the one true answer comes first (labels "
                                f"{mc1[1]}), as lm-evaluation-harness scores MC1 against index 0")
            out.append({"question": row["question"].strip(),
                        "mc1_targets": {"choices": mc1[0], "labels": mc1[1]},
                        "mc2_targets": {"choices": mc2[0], "labels": mc2[1]}})
        except KeyError as e:
            raise DataError(f"{where}: missing field {e.args[0]!r}") from None
    return out


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's hellaswag/utils.py `preprocess`."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


# HellaSwag, the official JSONL (ctx_a, ctx_b, activity_label, endings, label), as lm-eval's
# `hellaswag/utils.py`: query = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()),
# each ending preprocessed (" [title]" -> ". ", "[...]" removed, double spaces made single).
def hellaswag_docs(path: Path) -> list[Doc]:
    need = ("ctx_a", "ctx_b", "activity_label", "endings", "label")
    docs = []
    for i, (where, row) in enumerate(json_rows(path)):
        missing = [c for c in need if c not in row]
        if missing:
            raise DataError(f"{where}: missing field {missing[0]!r} (HellaSwag's JSONL has {', '.join(need)})")
        bad = next((c for c in need[:3] if not isinstance(row[c], str)), None)
        if bad is not None:
            raise DataError(f"{where}: field {bad!r} must be text, got {type(row[bad]).__name__} {row[bad]!r}")
        ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
        choices = tuple(hellaswag_preprocess(e) for e in _texts(row["endings"], f"{where}: field 'endings'"))
        gold = label_index(row["label"], f"{where}: field 'label'")
        if not 0 <= gold < len(choices):
            raise DataError(f"{where}: field 'label': {gold} is not an index of its {len(choices)} endings")
        docs.append(Doc(str(row.get("ind", i)), hellaswag_preprocess(row["activity_label"] + ": " + ctx),
                        hellaswag_preprocess(row["activity_label"] + ": " + ctx), choices, gold,
                        raw=json.dumps(row, sort_keys=True, default=str)))
    return docs


def truthfulqa_docs(path: Path, task: str, file_format: str) -> list[Doc]:
    rows = truthfulqa_csv(path) if file_format == "csv" else truthfulqa_json(path)
    key = "mc1_targets" if task == "truthfulqa_mc1" else "mc2_targets"
    docs = []
    for i, row in enumerate(rows):
        choices, labels = row[key]["choices"], row[key]["labels"]
        docs.append(Doc(str(i), row["question"], TRUTHFULQA_PRIMER + "\n\nQ: " + row["question"] + "\nA:",
                        tuple(choices), 0, tuple(labels), raw=json.dumps(row, sort_keys=True)))
    return docs


def load_docs(task: str, path: Path, file_format: str = "auto") -> list[Doc]:
    """Every document of a benchmark file, in file order."""
    if task == "hellaswag":
        return hellaswag_docs(path)
    if file_format == "auto":
        file_format = "csv" if path.suffix.lower() == ".csv" else "json"
    return truthfulqa_docs(path, task, file_format)


def sample_docs(docs: list[Doc], size: int | None, seed: int) -> list[Doc]:
    """`size` documents drawn without replacement by `seed`, kept in file order (None: all)."""
    if size is None or size >= len(docs):
        return list(docs)
    keep = np.sort(np.random.default_rng(seed).choice(len(docs), size, replace=False))
    return [docs[i] for i in keep]


# A request is (context, " " + choice). Few-shot contexts: `shots` examples, each its query + " " +
# its gold ending + "\n\n", drawn as lm-eval's default sampler draws them: `random.Random(seed)` once
# per task, then per document in file order `sample(pool, shots + 1)` with the document itself
# removed (the pool: a few-shot file, or the evaluated file).
def contexts(docs: list[Doc], shots: int, pool: list[Doc], seed: int = 1234) -> list[str]:
    """Each document's context: `shots` examples of `pool` drawn as lm-eval's default sampler draws
    them for HellaSwag (whose config names no test split, so the document is always passed for
    exclusion: `shots + 1` drawn, any copy of the document dropped, the first `shots` kept), then
    its query."""
    if shots == 0:
        return [d.query for d in docs]
    rnd = random.Random(seed)
    pool = list(pool)
    if len(pool) < shots + 1:
        raise DataError(f"{shots} few-shot examples need a pool of at least {shots + 1} documents; it has {len(pool)}")
    out = []
    for doc in docs:
        chosen = [d for d in rnd.sample(pool, shots + 1) if d.raw != doc.raw][:shots]
        if len(chosen) < shots:  # copies of the document drawn: drawn again without any
            chosen = rnd.sample([d for d in pool if d.raw != doc.raw], shots)
        shown = "".join(d.query + TARGET_DELIMITER + d.choices[d.gold] + FEWSHOT_DELIMITER for d in chosen)
        out.append(shown + doc.query)
    return out
