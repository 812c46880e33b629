"""The lm-evaluation-harness task `sage_moral` (sage_jax/harness_tasks) run offline through
`lm_eval.simple_evaluate` with the `hf` model on a tiny random Llama folder, three SaGE questions
and two sampled answers per paraphrase (a user's YAML that includes ours): the per-question SaGE,
BLEU, ROUGE-L and BERTScore equal `sage-jax score`'s on the answers the harness logged, written as
`sage-jax run`'s long-format answers file, and the reported means are those questions' means."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from clarifyjax.config.loader import ConfigError
from clarifyjax.files.tables import DataError
from helpers.env import require, shared_data
from helpers.tiny_models import tiny_classifier_folder, tiny_llama_folder
from sage_jax import cli
from sage_jax.harness_tasks import sage_moral, task_folder

QUESTIONS = 3
REPEATS = 2
PARAPHRASES = 5  # per question in the q100 file


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    lm_eval = require("lm_eval")
    from lm_eval.tasks import TaskManager

    root = tmp_path_factory.mktemp("sage_task")
    # the session's folders (clarifyjax.models.tiny caches them per factory and arguments)
    llama = tiny_llama_folder(tmp_path_factory, seed=3)
    bert = tiny_classifier_folder(tmp_path_factory, model_type="bert")  # the embedder and BERTScore's model
    mine = root / "tasks"
    mine.mkdir()
    (mine / "sage_moral_x2.yaml").write_text(
        f"include: {task_folder() / 'sage_moral.yaml'}\ntask: sage_moral_x2\nrepeats: {REPEATS}\n")
    meta = {"sage": {"data": str(shared_data("sage-mcc/q100_gpt-3.5-turbo_rot.csv")), "questions": QUESTIONS,
                     "score": {"embedder": str(bert), "bertscore_model": str(bert)}}}
    manager = TaskManager(include_path=[str(task_folder()), str(mine)], include_defaults=False, metadata=meta)
    result = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={llama},max_length=512,dtype=float32", tasks=["sage_moral_x2"],
        batch_size=8, device="cpu", log_samples=True, gen_kwargs="max_gen_toks=8", task_manager=manager)
    return {"root": root, "bert": bert, "result": result,
            "samples": sorted(result["samples"]["sage_moral_x2"], key=lambda s: s["doc_id"])}


def answers_file(path, samples) -> None:
    """The logged answers as `sage-jax run`'s long-format answers file (one row per answer)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question_id", "question", "paraphrased", "model_output"])
        for s in samples:
            for answer in s["filtered_resps"][0]:
                writer.writerow([s["doc"]["question_id"], s["doc"]["question"], s["doc"]["paraphrase"], answer])


@pytest.mark.reference
def test_per_question_scores_equal_sage_jax_score_on_the_logged_answers(harness, capsys):
    samples, bert, root = harness["samples"], harness["bert"], harness["root"]
    assert len(samples) == QUESTIONS * PARAPHRASES  # one document per paraphrase
    assert all(len(s["filtered_resps"][0]) == REPEATS for s in samples)  # every sample kept, not the first
    assert any(len(set(s["filtered_resps"][0])) > 1 for s in samples)  # sampled, not greedy

    ours = sage_moral.question_scores([s["sage"] for s in samples])  # what the aggregation computes
    answers_file(root / "answers.csv", samples)
    rc = cli.main(["score", str(root / "answers.csv"), "--embedder", str(bert), "--bertscore-model", str(bert),
                   "--out", str(root / "score"), "--quiet"])
    capsys.readouterr()
    assert rc == 0
    with open(root / "score" / "answers.per_question.csv", newline="", encoding="utf-8") as f:
        theirs = list(csv.DictReader(f))
    assert [r["question_id"] for r in theirs] == ours["question_id"]
    assert ours["n_texts"] == [PARAPHRASES * REPEATS] * QUESTIONS  # per question, not per document
    assert ours["n_valid"] == [int(r["n_valid"]) for r in theirs]  # the unusable answers masked alike
    for measure in sage_moral.MEASURES:
        np.testing.assert_allclose(ours[measure], [float(r[measure]) for r in theirs], rtol=0, atol=1e-12,
                                   err_msg=measure)

    reported = harness["result"]["results"]["sage_moral_x2"]
    for measure in sage_moral.MEASURES:
        mean = reported[f"{measure},answers"]
        assert mean == pytest.approx(float(np.mean(ours[measure])), abs=1e-12)
        assert reported[f"{measure}_ci_low,answers"] <= mean <= reported[f"{measure}_ci_high,answers"]
    json.dumps(harness["result"]["results"])  # the results table's numbers are plain floats


def test_the_data_path_and_settings_are_metadata_arguments_named_in_their_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"--metadata '\{\"sage\": \{\"data\""):
        sage_moral.load_dataset(pretrained="model")  # lm-eval adds the model arguments
    with pytest.raises(ConfigError, match="embeder"):
        sage_moral.load_dataset(sage={"data": "q.csv", "score": {"embeder": "x"}})
    with pytest.raises(DataError, match=r"--metadata sage\.data"):
        sage_moral.load_dataset(sage={"data": str(tmp_path / "missing.csv")})
    questions = shared_data("sage-mcc/q100_gpt-3.5-turbo_rot.csv")
    with pytest.raises(ConfigError, match=r"--metadata sage\.score\.embedder: .*nowhere"):
        sage_moral.load_dataset(sage={"data": str(questions), "score": {"embedder": str(tmp_path / "nowhere")}})
