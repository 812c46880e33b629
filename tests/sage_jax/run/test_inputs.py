"""`sage-jax run`'s inputs where they enter, each refused in one line naming the file, line, field
or endpoint, or computed as the reference computes it: a JSON array or object in a questions or
recorded file (it reached the models as the placeholder text "<JSON array or object>"), each
row's rule of thumb (only a question's first was read), an endpoint's reply that is not JSON, has
no `choices`, or holds a text that is not a string or not encodable (tracebacks), and a CSV field
over the csv module's 128 KiB default (the project's own answers files did not read back).
"""
from __future__ import annotations

import csv
import json

import pytest

from clarifyjax.config.loader import build_root
from clarifyjax.files.tables import DataError, read_rows
from helpers.env import require
from helpers.fake_llm import FakeGenerator
from sage_jax.run import pipeline
from sage_jax.run.config import SageRunConfig
from sage_jax.run.generators import GenerationError, RecordedGenerator
from sage_jax.run.stages import read_jsonl


def run_config(tmp_path, questions, **raw) -> SageRunConfig:
    return build_root(SageRunConfig, {"questions": str(questions), "out": str(tmp_path / "out"), "quiet": True,
                                      "paraphrase": {"source": "file"}, "hosts": {"process_index": 0,
                                                                                  "process_count": 1},
                                      "models": [{"name": "m", "generator": {"kind": "local", "model": "a"}}], **raw})


def test_a_json_array_in_a_questions_file_is_refused_naming_line_and_field(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": "1", "question": "Is it right?", "paraphrased": "Is it ok?"},
            {"question_id": "1", "question": "Is it right?", "paraphrased": ["Is it fine?"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=rf"{path}:2: field 'paraphrased' is a JSON array or object, expected text"):
        pipeline.read_source_questions(run_config(tmp_path, path))


def test_a_json_object_in_a_recorded_file_is_refused_naming_line_and_field(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps({"paraphrased": "Is it ok?", "model_output": {"text": "Yes."}}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:1: field 'model_output' is a JSON array or object"):
        RecordedGenerator(path, column="model_output", prompt_of=pipeline.AnswerPromptOf(chat=False))
    path.write_text(json.dumps({"paraphrased": ["Is it ok?"], "model_output": "Yes."}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:1: field 'paraphrased' is a JSON array or object"):
        RecordedGenerator(path, column="model_output", prompt_of=pipeline.AnswerPromptOf(chat=False))


def rot_questions(tmp_path, rots):
    path = tmp_path / "imp.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question_id", "question", "paraphrased", "imp_rot"])
        writer.writerows(["1", "Is lying wrong?", f"Is lying wrong, case {i}?", rot] for i, rot in enumerate(rots))
    return path


def test_each_paraphrase_is_answered_with_its_own_rows_rule_of_thumb(tmp_path):
    """The reference's improve.py prompts each row with its own `imp_rot`."""
    rots = [f"You should be honest, rule {i}." for i in range(3)]
    cfg = run_config(tmp_path, rot_questions(tmp_path, rots), guide_column="imp_rot", paraphrase={
        "source": "file", "count": 3}, models=[{"name": "m", "guided": True, "generator": {"kind": "local",
                                                                                          "model": "a"}}])
    pipeline.Run(cfg, generators=pipeline.Generators(lambda c, b, p: FakeGenerator(name=c.model))).run(
        ("paraphrase", "answer"))
    rows = read_jsonl(tmp_path / "out" / "stages" / "answer" / "m" / "p0of1" / "rows.jsonl")
    assert [r["paraphrase_index"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert f"# Rule of Thumb\n{rots[r['paraphrase_index']]}\n" in r["prompt"]


def test_rules_of_thumb_that_disagree_are_refused_for_generated_paraphrases(tmp_path):
    cfg = run_config(tmp_path, rot_questions(tmp_path, ["Be honest.", "Be kind."]), guide_column="imp_rot",
                     paraphrase={"source": "generate", "generator": {"kind": "local", "model": "p"}})
    with pytest.raises(DataError, match=r"imp.csv:3: question id '1' has another 'imp_rot' than its first row"):
        pipeline.read_source_questions(cfg)


REPLIES = {  # body -> what the one-line error says
    "<html>busy</html>": "the reply is not JSON ('<html>busy</html>')",
    '{"id": "x"}': "the reply has no `choices` list of objects",
    '{"choices": [{"index": 0, "text": 5, "finish_reason": "stop"}]}': "choice 0's text is int 5, not a string",
    '{"choices": [{"index": 0, "text": "a\\ud800", "finish_reason": "stop"}]}':
        "choice 0's text holds '\\ud800' (a lone surrogate) at character 2",
}


@pytest.mark.parametrize("body", list(REPLIES), ids=["not-json", "no-choices", "not-a-string", "lone-surrogate"])
def test_a_malformed_endpoint_reply_is_one_line_naming_the_endpoint(body):
    require("openai")
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from clarifyjax.serve.http_server import BackgroundServer
    from clarifyjax.text.generator import Sampling
    from sage_jax.run.generators import OpenAIGenerator

    async def completions(request):
        return Response(body, media_type="application/json")

    with BackgroundServer(Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])) as server:
        generator = OpenAIGenerator(base_url=server.url + "/v1", model="m", max_retries=0)
        with pytest.raises(GenerationError) as e:
            generator.complete(["Q?"], Sampling(max_new_tokens=4))
    message = str(e.value)
    assert message.startswith(f"{server.url}/v1 (completions, model m): {REPLIES[body]}") and "\n" not in message


def test_a_field_over_the_csv_modules_default_limit_reads_back(tmp_path):
    answer = "A long answer. " * 20_000  # 300,000 characters: over csv's 131,072
    path = tmp_path / "m.answers.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["question_id", "model_output"], ["1", answer]])
    header, rows = read_rows(path)
    assert [row["model_output"] for _, row in rows] == [answer]
