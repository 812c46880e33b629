"""The lm-eval model "clarifyjax" against lm-evaluation-harness 0.4.13's `hf` model on tiny random
Llama and OPT folders, offline (DESIGN §7: its HellaSwag and TruthfulQA MC1 / MC2 YAMLs over
local files, and a generate_until task over a local JSONL with stop strings): every choice's
log-likelihood and is_greedy, every greedy generation (chat-templated too), rolling
log-likelihoods over several windows and every reported metric; and `clarifyjax lm-eval`,
lm-eval's own command line, running those tasks and the shipped sage_moral and printing its table."""
from __future__ import annotations

import json

import pytest

from helpers.env import require, shared_data
from clarifyjax.harness.local_tasks import write_generation_task, write_tasks
from helpers.lm_eval_tasks import hellaswag_rows

MAX_LENGTH = 512
TASKS = ["local_hellaswag", "local_truthfulqa_mc1", "local_truthfulqa_mc2", "local_gen"]
QUESTIONS = [{"question": "What do people eat for breakfast?", "answer": "bread"},
             {"question": "Where do the birds go in the winter?", "answer": "south"},
             {"question": "Is it wrong to lie to a friend?", "answer": "yes"}]


def opt_folder(root):
    from clarifyjax.models.tiny import tiny_causal_tokenizer
    from helpers.causal_lm_builders import make_hf_causal_lm

    folder = root / "opt"
    folder.mkdir()
    tok = tiny_causal_tokenizer(folder, vocab_size=2000)
    make_hf_causal_lm(folder, "opt-pre-ln", seed=3, vocab_size=len(tok), bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, max_position_embeddings=MAX_LENGTH)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require("lm_eval")
    require("torch").set_num_threads(1)
    from clarifyjax.models.tiny import tiny_llama_folder
    from sage_jax.experiments import benchmarks

    root = tmp_path_factory.mktemp("lm_eval_model")
    for name, rows in (("hs.jsonl", hellaswag_rows(2)), ("hs_train.jsonl", hellaswag_rows(2, 100))):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    tqa = root / "truthfulqa_mc.jsonl"  # one of the CSV's questions as MC JSON
    rows = benchmarks.truthfulqa_csv(shared_data("benchmarks/TruthfulQA.csv"))[:1]
    tqa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = write_tasks(root / "tasks", hellaswag=root / "hs.jsonl", hellaswag_train=root / "hs_train.jsonl",
                        truthfulqa=tqa)
    write_generation_task(tasks, QUESTIONS)
    models = {"llama": tiny_llama_folder(root, seed=7, tokenizer={"vocab_size": 2000},
                                         max_position_embeddings=MAX_LENGTH, num_hidden_layers=1),
              "opt": opt_folder(root)}
    return {"tasks": tasks, "models": models,
            "runs": {(family, kind): evaluate(kind, folder, tasks)
                     for family, folder in models.items() for kind in ("hf", "clarifyjax")}}


def evaluate(kind: str, folder, tasks, names=TASKS, **options) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from clarifyjax.harness import lm_eval_model  # noqa: F401  (registers "clarifyjax")

    extra = ",dtype=float32" + (",device=cpu" if kind == "hf" else "")
    return lm_eval.simple_evaluate(
        model=kind, model_args=f"pretrained={folder},max_length={MAX_LENGTH}{extra}", tasks=names,
        batch_size=4, log_samples=True, task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        **options)


@pytest.mark.reference
@pytest.mark.parametrize("family", ["llama", "opt"])
def test_every_choice_generation_and_metric_equals_the_hf_model(setup, family):
    ours, theirs = setup["runs"][(family, "clarifyjax")], setup["runs"][(family, "hf")]
    for task in TASKS:
        mine = sorted(ours["samples"][task], key=lambda s: s["doc_id"])
        other = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
        assert len(mine) == len(other) > 0
        for a, b in zip(mine, other):
            if task == "local_gen":
                assert a["resps"] == b["resps"], (task, a["doc_id"])
                continue
            for (ll, greedy), (ll_ref, greedy_ref) in zip((r[0] for r in a["resps"]), (r[0] for r in b["resps"])):
                assert ll == pytest.approx(ll_ref, abs=1e-4), (task, a["doc_id"])
                assert greedy == greedy_ref, (task, a["doc_id"])
        for key, value in theirs["results"][task].items():
            if key != "alias" and "stderr" not in key:
                assert ours["results"][task][key] == pytest.approx(value, abs=1e-4), (task, key)
    generations = [s["resps"][0][0] for s in ours["samples"]["local_gen"]]
    assert any(generations) and all("\n" not in g and "." not in g for g in generations)


@pytest.mark.reference
def test_chat_templated_generations_equal_the_hf_model(setup):
    chat = dict(apply_chat_template=True, system_instruction="Answer in one word.")
    ours, theirs = (evaluate(kind, setup["models"]["llama"], setup["tasks"], ["local_gen"], **chat)
                    for kind in ("clarifyjax", "hf"))
    mine, other = (sorted(run["samples"]["local_gen"], key=lambda s: s["doc_id"]) for run in (ours, theirs))
    for a, b in zip(mine, other):
        prompt = a["arguments"][0][0]
        assert prompt == b["arguments"][0][0] and prompt.startswith("<s><<SYS>> Answer in one word.")
        assert "[INST] Question:" in prompt and a["resps"] == b["resps"]
    assert ours["config"].get("chat_template") == theirs["config"].get("chat_template")


@pytest.mark.reference
def test_rolling_loglikelihoods_over_several_windows_equal_the_hf_model(setup):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from clarifyjax.harness.lm_eval_model import ClarifyJaxLM

    folder = str(setup["models"]["llama"])
    texts = ["A woman puts the dough on a tray, then waits for the oven to warm up before she bakes "
             "the cookies for her friends, who sing in the garden until the sun goes down.", "Short."]
    requests = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    lm = ClarifyJaxLM(folder, max_length=32, batch_size=4)
    assert len(lm.tok_encode(texts[0])) > 32  # two windows of max_length 32
    ours = lm.loglikelihood_rolling(requests)
    theirs = HFLM(pretrained=folder, max_length=32, device="cpu", dtype="float32",
                  batch_size=4).loglikelihood_rolling(requests, disable_tqdm=True)
    assert ours == pytest.approx(theirs, abs=1e-4) and ours[0] < ours[1] < 0


def sage_questions(path, questions=3, paraphrases=2):
    """A small copy of the SaGE questions file: its first questions, a few paraphrases each."""
    import csv

    with open(shared_data("sage-mcc/q100_gpt-3.5-turbo_rot.csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    kept: dict[str, list] = {}
    for r in rows:
        kept.setdefault(r["question_id"], []).append(r)
    kept = {qid: group[:paraphrases] for qid, group in list(kept.items())[:questions]}
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question_id", "question", "paraphrased"])
        writer.writerows([r["question_id"], r["question"], r["paraphrased"]] for g in kept.values() for r in g)
    return path


@pytest.mark.reference
@pytest.mark.e2e
def test_the_command_line_prints_the_results_table(setup, tmp_path, tmp_path_factory, capsys, monkeypatch):
    """One `clarifyjax lm-eval` for HellaSwag, TruthfulQA MC2, local_gen and the shipped sage_moral
    (--include_path its folder, the questions file and scoring models through --metadata)."""
    import functools
    import math

    from lm_eval.tasks import TaskManager

    from clarifyjax import cli
    from helpers.tiny_models import tiny_classifier_folder
    from sage_jax.harness_tasks import task_folder

    # lm-eval's command indexes its ~10,000 built-in task files (25 s here); these tasks are local
    monkeypatch.setattr(TaskManager, "__init__", functools.partialmethod(TaskManager.__init__,
                                                                        include_defaults=False))
    folder, tasks = setup["models"]["llama"], setup["tasks"]
    bert = tiny_classifier_folder(tmp_path_factory, model_type="bert")  # SaGE's embedder, BERTScore's model
    meta = {"sage": {"data": str(sage_questions(tmp_path / "questions.csv")),
                     "score": {"embedder": str(bert), "bertscore_model": str(bert)},
                     "bootstrap": {"resamples": 200, "method": "percentile"}}}
    local = ",".join(str(tasks / f"{t}.yaml") for t in ("local_hellaswag", "local_truthfulqa_mc2", "local_gen"))
    status = cli.main(["lm-eval", "--model", "clarifyjax", "--model_args",
                       f"pretrained={folder},max_length={MAX_LENGTH}", "--batch_size", "4",
                       "--tasks", f"{local},sage_moral", "--include_path", str(task_folder()),
                       "--metadata", json.dumps(meta)])
    out = capsys.readouterr().out
    assert status == 0
    expected = setup["runs"][("llama", "clarifyjax")]["results"]
    table = [line for line in out.splitlines() if line.startswith("|")]
    for task in ("local_hellaswag", "local_truthfulqa_mc2", "local_gen"):
        assert any(line.startswith(f"|{task}") for line in table), out
        for key, value in expected[task].items():
            if isinstance(value, float) and "stderr" not in key:  # the table's figures: 4 decimals
                assert any(f"|{value:.4f}|" in line.replace(" ", "") for line in table), (task, key, out)
    # sage_moral's rows: |sage_moral|1|answers|0|sage|↑|0.1234|±|N/A| then one row per further metric
    start = next(i for i, line in enumerate(table) if line.startswith("|sage_moral"))
    cells = {}
    for line in table[start:start + 12]:
        row = [c.strip() for c in line.strip("|").split("|")]
        cells[row[4]] = float(row[6])
    names = [f"{m}{s}" for m in ("sage", "bleu", "rouge_l", "bertscore") for s in ("", "_ci_low", "_ci_high")]
    assert sorted(cells) == sorted(names), out
    assert all(math.isfinite(v) for v in cells.values()), out
    for m in ("sage", "bleu", "rouge_l", "bertscore"):
        assert cells[f"{m}_ci_low"] <= cells[m] <= cells[f"{m}_ci_high"], (m, out)
