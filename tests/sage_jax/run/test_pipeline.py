"""`sage-jax run` end to end: stages, rows that name their origin, re-queue caps, kill -9 resume,
recorded outputs scoring as `sage-jax score` does, multi-host shares, and the OpenAI-compatible
path (the real `openai` client against servers on 127.0.0.1: `clarifyjax serve`'s app, and tiny
fake endpoints that answer 429 with Retry-After, or keep failing).

The generator is mostly tests/helpers/fake_llm.py's (deterministic in prompt and seed; a quarter
of its answers are unusable, so the re-queue runs everywhere) and ParaScore is its hash-based
stand-in: what is tested there is the pipeline, not the models. Two runs use a real local model
end to end, directly and behind `clarifyjax serve`: tests/helpers/scripted_llm.py's tiny Llama.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from clarifyjax.config.loader import build_root
from helpers.env import require, shared_data
from helpers import pipeline_child
from helpers.children import clean_env
from helpers.fake_llm import FakeGenerator, fake_screen
from sage_jax.run import pipeline
from sage_jax.run.config import SageRunConfig
from sage_jax.run.stages import KEY_FIELDS, read_jsonl

Q100 = "sage-mcc/q100_gpt-3.5-turbo_rot.csv"
GEN = ("paraphrase", "answer", "rot")


@pytest.fixture(scope="module")
def loaded_embedder(embedder):
    """One SentenceEmbedder for every run of this module: its jitted shapes compile once."""
    from clarifyjax.models.embedder import SentenceEmbedder

    return SentenceEmbedder.from_pretrained(embedder)


def config(tmp_path, **over) -> dict:
    raw = {"questions": str(shared_data(Q100)), "out": str(tmp_path / "out"), "limit": 20, "quiet": True,
           "paraphrase": {"generator": {"kind": "local", "model": "paraphraser"}},
           "models": [{"name": "m1", "generator": {"kind": "local", "model": "a"}},
                      {"name": "m2", "generator": {"kind": "local", "model": "b"}}],
           "rot": {"generator": {"kind": "local", "model": "rot-writer"}},
           "hosts": {"process_index": 0, "process_count": 1}}
    for key, value in over.items():
        node = raw
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return raw


SHARED = {}


@pytest.fixture(autouse=True)
def _shared_embedder(request):
    SHARED["embedder"] = request.getfixturevalue("loaded_embedder") if "embedder" in request.fixturenames else None
    yield
    SHARED.clear()


def make_run(raw, generator_of=lambda c: FakeGenerator(name=c.model)):
    cfg = build_root(SageRunConfig, raw)
    return pipeline.Run(cfg, generators=pipeline.Generators(lambda c, b, p: generator_of(c)),
                        screen=fake_screen(), embedder=SHARED.get("embedder"))


def stage_rows(out: Path) -> dict[str, list[dict]]:
    return {str(p.parent.relative_to(out / "stages")): read_jsonl(p)
            for p in sorted((out / "stages").rglob("rows.jsonl"))}


@pytest.mark.slow  # the first scoring run of the module: the embedder's, BERTScore's and SaGE's compiles
def test_the_pipeline_runs_to_the_report_and_every_row_names_its_origin(tmp_path, embedder):
    raw = config(tmp_path, **{"score.embedder": embedder})
    summary = make_run(raw).run()
    out = tmp_path / "out"
    rows = stage_rows(out)
    assert set(rows) == {"paraphrase/p0of1", "answer/m1/p0of1", "answer/m2/p0of1", "rot/m1/p0of1", "rot/m2/p0of1"}
    assert len(rows["paraphrase/p0of1"]) == 20
    for name, stage in rows.items():
        for r in stage:
            assert {*KEY_FIELDS, "attempt", "prompt", "question", "status", "output"} <= set(r), name
            assert r["prompt"] and r["question"]
            if not name.startswith("paraphrase"):
                assert r["paraphrase"] in r["prompt"]
    # the two models answered the same paraphrases
    para = {(r["question_id"], r["paraphrase_index"], r["paraphrase"]) for r in rows["answer/m1/p0of1"]}
    assert para == {(r["question_id"], r["paraphrase_index"], r["paraphrase"]) for r in rows["answer/m2/p0of1"]}
    assert len(para) == 100
    # the fake's unusable answers were re-queued: some rows needed more than one attempt
    assert max(r["attempt"] for r in rows["answer/m1/p0of1"]) >= 1
    # fix 2: a verbatim copy of the question (the fake's line 1) is never kept
    for r in rows["paraphrase/p0of1"]:
        assert all(k["text"].casefold() != r["question"].casefold() for k in r["kept"])
        assert all(k["parascore"] >= 0.6 for k in r["kept"])
    report = out / "report"
    for name in ("table1.md", "table1.csv", "summary.json", "sage_distribution.png", "m1.per_question.csv",
                 "m2.answers.csv", "scores.json"):
        assert (report / name).stat().st_size > 0, name
    models = {m["model"]: m for m in summary["models"]}
    for key in ("sage_answer", "sage_rot", "sage_blend", "bleu", "rouge_l", "bertscore", "bleu_rot", "rouge_l_rot",
                "bertscore_rot", "elazar"):
        assert models["m1"][key]["count"] == 20, key
    assert -1 <= models["m1"]["sage_blend"]["mean"] <= 1
    # the RoT columns of Table 1 score each question's RoTs, in paraphrase order, as the answers are
    import csv

    from sage_jax.lexical import bleu_consistency, rouge_l_consistency
    with open(report / "m1.answers.csv", newline="") as f:
        long = list(csv.DictReader(f))
    with open(report / "m1.per_question.csv", newline="") as f:
        per_question = list(csv.DictReader(f))
    for row in per_question:
        mine = sorted((r for r in long if r["question_id"] == row["question_id"] and r["rot"]),
                      key=lambda r: (int(r["paraphrase_index"]), int(r["sample"])))
        rots = [[r["rot"] for r in mine]]
        assert float(row["bleu_rot"]) == pytest.approx(bleu_consistency(rots)[0], abs=1e-9)
        assert float(row["rouge_l_rot"]) == pytest.approx(rouge_l_consistency(rots)[0], abs=1e-9)
    assert "| m1 |" in (report / "table1.md").read_text()
    assert (out / "config.yaml").exists() and (out / "prompts" / "rot.txt").read_text().startswith("\n# Instruction")
    # A second run recomputes nothing: no generator is even built.
    calls = []
    make_run(raw, lambda c: calls.append(c) or FakeGenerator(name=c.model)).run()
    assert calls == []


def _write_config(raw, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(raw))
    return path


def _child(raw, tmp_path, kill_after) -> int:
    path = _write_config(raw, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "helpers.pipeline_child", str(path), str(kill_after)],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def _batches(out: Path, stage: str) -> int:
    return len(list((out / "stages").glob(f"{stage}/**/batch-*.jsonl")))


KILL_MODELS = [{"name": "m1", "generator": {"kind": "local", "model": "a"}}]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The generating stages run once without a kill -> (their rows, batch files per stage): what
    every killed-and-resumed run must give. Run in this process, by `helpers.pipeline_child`'s
    own `main` (the child's code, without the kill)."""
    folder = tmp_path_factory.mktemp("whole")
    pipeline_child.main(str(_write_config(config(folder, models=KILL_MODELS), folder)), "none")
    return stage_rows(folder / "out"), {s: _batches(folder / "out", s) for s in GEN}


@pytest.mark.child
@pytest.mark.parametrize("stage", GEN)
def test_kill_9_during_a_stage_then_the_same_command_gives_the_uninterrupted_outputs(tmp_path, stage, uninterrupted):
    """A child process killed with SIGKILL in the middle of `stage`; the same command run again
    (here in this process: `pipeline_child.main`, the child's code) finishes with the rows of an
    uninterrupted run."""
    expected, counts = uninterrupted
    # a call in the middle of `stage`: every earlier stage's calls, then half of this one's
    before = sum(counts[s] for s in GEN[:GEN.index(stage)])
    kill_after = before + max(1, counts[stage] // 2)
    killed = config(tmp_path / "killed", models=KILL_MODELS)
    rc, err = _child(killed, tmp_path / "killed", kill_after)
    assert rc == -9, err
    out = tmp_path / "killed" / "out"
    assert not list((out / "stages").glob(f"{stage}/**/rows.jsonl"))  # the stage did not finish
    assert 0 < _batches(out, stage) < counts[stage]
    pipeline_child.main(str(tmp_path / "killed" / "config.json"), "none")
    got = stage_rows(out)
    assert got == expected
    for rows in got.values():
        keys = [tuple(r[k] for k in KEY_FIELDS) for r in rows]
        assert len(keys) == len(set(keys))


def test_unusable_text_fails_every_row_within_the_cap_and_the_report_counts_them(tmp_path, embedder):
    raw = config(tmp_path, **{"paraphrase.source": "file", "answer.max_attempts": 3, "answer.batch_size": 7,
                              "score.bertscore": False, "score.embedder": embedder,
                              "models": [{"name": "m1", "generator": {"kind": "local", "model": "bad"}}]})
    fakes = []

    def generator_of(c):
        fakes.append(FakeGenerator(name=c.model, unusable=c.model == "bad"))
        return fakes[-1]

    summary = make_run(raw, generator_of).run()
    answers = stage_rows(tmp_path / "out")["answer/m1/p0of1"]
    assert len(answers) == 100
    assert all(r["status"] == "failed" and r["attempt"] == 2 and r["reason"] == "answer starts with '#'"
               for r in answers)
    assert len(fakes[0].prompts_seen) == 300  # 3 attempts per row, never more
    m1 = summary["models"][0]
    assert m1["answer_rows_failed"] == 100 and m1["answer_rows"] == 100
    assert m1["failure_reasons"] == {"answer starts with '#'": 100}
    assert m1["sage_answer"]["count"] == 0
    assert "| m1 |" in (tmp_path / "out" / "report" / "table1.md").read_text()


def test_questions_that_never_get_enough_paraphrases_are_kept_failed_and_not_answered(tmp_path):
    raw = config(tmp_path, **{"paraphrase.threshold": 0.99, "paraphrase.max_attempts": 2})
    run = make_run(raw)
    run.run(("paraphrase", "answer"))
    rows = stage_rows(tmp_path / "out")
    para = rows["paraphrase/p0of1"]
    failed = [r for r in para if r["status"] == "failed"]
    assert failed and all(r["attempt"] == 1 and "paraphrases passed ParaScore >= 0.99" in r["reason"] for r in failed)
    answered = {r["question_id"] for r in rows["answer/m1/p0of1"]}
    assert answered == {r["question_id"] for r in para if r["status"] == "ok"}


def test_recorded_outputs_score_as_sage_jax_score_does(tmp_path, embedder):
    """The published answers and RoTs of the first 20 questions through the pipeline (paraphrases,
    answers and RoTs read from the file) give the per-question SaGE of `sage-jax score`."""
    from sage_jax import cli, scoring

    src = shared_data(Q100)
    raw = config(tmp_path, **{"paraphrase.source": "file", "score.bertscore": False, "score.embedder": embedder,
                              "score.lexical": False,
                              "models": [{"name": "gpt", "generator": {"kind": "file", "model": str(src)}}],
                              "rot.generator": {"kind": "file", "model": str(src), "column": "rot"}})
    cfg = build_root(SageRunConfig, raw)
    pipeline.Run(cfg, embedder=SHARED["embedder"]).run()  # the recorded generators, as the config builds them
    long = tmp_path / "out" / "report" / "gpt.answers.csv"
    ours = {r["question_id"]: r for r in _csv(tmp_path / "out" / "report" / "gpt.per_question.csv")}
    assert len(ours) == 20
    for text, column in (("answer", "sage_answer"), ("rot", "sage_rot"), ("blend", "sage_blend")):
        # what `sage-jax score FILE --text TEXT` computes, with the same embedder object
        args = cli.build_sage_parser().parse_args(["score", str(long), "--text", text, "--out", str(tmp_path / text),
                                              "--no-lexical", "--no-bertscore", "--quiet", "--embedder", embedder])
        cli.check_options(args)
        item = scoring.Loaded(long, "gpt", args)
        theirs, _ = scoring.score_loaded(item, args, lambda: SHARED["embedder"], cli._Progress(True))
        np.testing.assert_allclose([float(ours[q][column]) for q in theirs["question_id"]], theirs["sage"], atol=1e-6)
    # the answers are the file's, word for word
    import csv
    with open(src, newline="") as f:
        published = {(r["question_id"], r["paraphrased"].strip()): r["model_output"].strip() for r in csv.DictReader(f)}
    for r in _csv(long):
        assert published[(r["question_id"], r["paraphrased"])] == r["model_output"]


def _csv(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_two_processes_take_their_shares_and_the_report_merges_them(tmp_path, embedder):
    from sage_jax.run.stages import StageError

    shares = [config(tmp_path, **{"hosts": {"process_index": i, "process_count": 2}, "score.bertscore": False,
                                  "score.embedder": embedder, "score.lexical": False}) for i in range(2)]
    make_run(shares[0]).run(GEN)
    with pytest.raises(StageError, match="process p1of2"):
        make_run(shares[0]).run(("score",))
    make_run(shares[1]).run(GEN)
    summary = make_run(shares[0]).run(("score", "report"))
    assert summary["models"][0]["sage_answer"]["count"] == 20
    ids = [r["question_id"] for r in stage_rows(tmp_path / "out")["paraphrase/p1of2"]]
    assert len(ids) == 10


# ----------------------------------------------------------------------------- HTTP


def _endpoint(behaviour):
    """A Starlette app answering /v1/completions as `behaviour(count, body) -> (status, headers, json)`."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen = []

    async def completions(request):
        body = await request.json()
        seen.append((request.headers.get("authorization"), body))
        status, headers, payload = behaviour(len(seen), body)
        return JSONResponse(payload, status_code=status, headers=headers)

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])]), seen


def _choice(text):
    return {"id": "x", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]}


@pytest.mark.reference
def test_a_429_with_retry_after_is_waited_for(monkeypatch):
    require("openai")
    from clarifyjax.serve.http_server import BackgroundServer
    from clarifyjax.text.generator import Sampling
    from sage_jax.run import generators

    app, seen = _endpoint(lambda count, body: (429, {"Retry-After": "2"}, {"error": {"message": "slow down"}})
                          if count == 1 else (200, {}, _choice("fine")))
    waits = []
    with BackgroundServer(app) as server:
        gen = generators.OpenAIGenerator(base_url=server.url + "/v1", model="m", max_retries=3,
                                         sleep=lambda s: (waits.append(s), time.sleep(s)))
        started = time.monotonic()
        [[completion]] = gen.complete(["q"], Sampling(max_new_tokens=8), 1, seed=1)
        elapsed = time.monotonic() - started
    assert completion.text == "fine" and len(seen) == 2
    assert waits == [2.0] and elapsed >= 2.0


@pytest.mark.reference
@pytest.mark.e2e
def test_an_endpoint_that_keeps_failing_ends_the_stage_with_a_clear_error_and_keeps_finished_rows(
        tmp_path, monkeypatch, capsys):
    require("openai")
    from clarifyjax.serve.http_server import BackgroundServer
    from sage_jax import cli

    from sage_jax.run import generators
    monkeypatch.setattr(generators, "BACKOFF_BASE", 0.01)
    app, seen = _endpoint(lambda count, body: (200, {}, _choice("An answer.")) if count <= 40
                          else (503, {}, {"error": {"message": "overloaded"}}))
    monkeypatch.setenv("SAGE_TEST_KEY", "sk-test-SECRET-0123456789")
    with BackgroundServer(app) as server:
        raw = config(tmp_path, **{"paraphrase.source": "file", "answer.batch_size": 10,
                                  "models": [{"name": "remote", "generator": {
                                      "kind": "openai", "base_url": server.url + "/v1", "model": "m",
                                      "max_retries": 2, "concurrency": 4, "api_key_env": "SAGE_TEST_KEY"}}]})
        (tmp_path / "run.yaml").write_text(json.dumps(raw))
        rc = cli.main(["run", str(tmp_path / "run.yaml"), "--stages", "paraphrase,answer"])
    err = capsys.readouterr().err
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith("sage-jax: error: stage answer (remote):") and "InternalServerError 503" in line
    assert "after 3 attempts" in line and "40 of 100 rows are finished and kept" in line
    batches = sorted((tmp_path / "out" / "stages" / "answer" / "remote" / "p0of1").glob("batch-*.jsonl"))
    assert sum(len(read_jsonl(b)) for b in batches) == 40
    assert all(a == "Bearer sk-test-SECRET-0123456789" for a, _ in seen)  # the key was sent ...
    for path in (tmp_path / "out").rglob("*"):  # ... and never written
        assert not path.is_file() or b"SECRET" not in path.read_bytes(), path
    assert "SECRET" not in err


@pytest.mark.e2e
def test_the_api_key_variable_is_checked_before_any_work(tmp_path, monkeypatch, capsys):
    from sage_jax import cli

    monkeypatch.delenv("SAGE_MISSING_KEY", raising=False)
    raw = config(tmp_path, models=[{"name": "r", "generator": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                                                             "model": "m", "api_key_env": "SAGE_MISSING_KEY"}}])
    (tmp_path / "run.yaml").write_text(json.dumps(raw))
    assert cli.main(["run", str(tmp_path / "run.yaml"), "--stages", "answer"]) == 2
    err = capsys.readouterr().err
    assert "models[0].generator.api_key_env: environment variable SAGE_MISSING_KEY is not set" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_config_errors_name_the_key_and_the_file(tmp_path, capsys):
    from sage_jax import cli

    raw = config(tmp_path)
    raw["paraphrase"]["count"] = 1
    (tmp_path / "run.yaml").write_text(json.dumps(raw))
    assert cli.main(["run", str(tmp_path / "run.yaml")]) == 2
    assert f"{tmp_path / 'run.yaml'}: paraphrase.count = 1: must be [2, 100]" in capsys.readouterr().err
    assert cli.main(["run", str(tmp_path / "run.yaml"), "paraphrase.count=3", "--stages", "answer,typo"]) == 2
    assert "--stages: unknown stage 'typo'" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_parascore_model_without_a_default_layer_is_refused_before_any_work(tmp_path, embedder, capsys):
    from sage_jax import cli

    endpoint = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}  # never asked here
    recorded = {"kind": "file", "model": str(shared_data(Q100))}
    raw = config(tmp_path, **{"paraphrase.scorer": {"model": embedder}, "paraphrase.generator": endpoint,
                              "rot.generator": {**recorded, "column": "rot"},
                              "models": [{"name": "m1", "generator": recorded}]})
    (tmp_path / "run.yaml").write_text(json.dumps(raw))
    assert cli.main(["run", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err
    assert "paraphrase.scorer.layer: no default BERTScore layer for 'bert_bad_ok_good_seed0'" in err
    assert "give layer= (0 .. 2)" in err and not (tmp_path / "out" / "stages").exists()
    assert cli.main(["run", str(tmp_path / "run.yaml"), "paraphrase.scorer.layer=3"]) == 2
    assert "layer must be an integer in [0, 2]" in capsys.readouterr().err


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """A tiny Llama folder that writes helpers.scripted_llm.SCRIPT whatever the prompt: six
    numbered lines, so that paraphrases parse, and each answer and RoT is its first line."""
    require("torch")
    from helpers.scripted_llm import scripted_llama_folder

    return str(scripted_llama_folder(tmp_path_factory.mktemp("scripted")))


SCRIPTED_QUESTIONS = 5  # x 5 paraphrases: 25 answers and 25 RoTs per run


def local_lm_run(tmp_path, embedder, generator: dict, name: str) -> dict:
    """Every stage on one generator config, for the first SCRIPTED_QUESTIONS questions; ParaScore
    on the tiny BERT with every non-copy kept (its scores mean nothing for a random BERT), the
    sentence embedder the tiny one."""
    return config(tmp_path, limit=SCRIPTED_QUESTIONS, **{"paraphrase.generator": generator, "rot.generator": generator,
                               "paraphrase.scorer": {"model": embedder, "layer": 2},
                               "paraphrase.threshold": -10.0,
                               "score.bertscore": False, "score.lexical": False, "score.embedder": embedder,
                               "paraphrase.sampling": {"max_new_tokens": 16},
                               "answer.sampling": {"max_new_tokens": 4}, "rot.sampling": {"max_new_tokens": 4},
                               "models": [{"name": name, "generator": generator}]})


def check_scripted_run(out: Path, summary: dict, name: str) -> None:
    from helpers.scripted_llm import SCRIPT

    rows = stage_rows(out)
    questions, texts = SCRIPTED_QUESTIONS, 5 * SCRIPTED_QUESTIONS
    para = rows["paraphrase/p0of1"]
    assert len(para) == questions and all(r["status"] == "ok" and r["attempt"] == 0 for r in para)
    assert all([k["text"] for k in r["kept"]] == [line[3:].strip() for line in SCRIPT[:5]] for r in para)
    answers, rots = rows[f"answer/{name}/p0of1"], rows[f"rot/{name}/p0of1"]
    assert len(answers) == texts and len(rots) == texts
    for r in answers + rots:  # every row names its question, paraphrase, model, attempt and prompt
        assert r["status"] == "ok" and r["attempt"] == 0 and r["model"] == name
        assert r["paraphrase"] in r["prompt"] and r["question"]
    assert all(r["prompt"].startswith("Answer the following question") for r in answers)
    assert all(r["answer"] == SCRIPT[0].strip() for r in answers)
    assert all("# Rule of Thumb" in r["prompt"] and SCRIPT[0].strip() in r["prompt"] for r in rots)
    assert all(r["rot"] == SCRIPT[0].strip() for r in rots)
    model = summary["models"][0]
    assert model["answer_rows"] == texts and model["sage_answer"]["count"] == questions
    assert model["sage_blend"]["count"] == questions
    assert f"| {name} |" in (out / "report" / "table1.md").read_text()


@pytest.mark.reference
@pytest.mark.slow  # the scripted Llama's compiled decode loops (three stages) and the scores
def test_the_pipeline_with_a_tiny_local_causal_lm(tmp_path, embedder, scripted):
    """Every generating stage on `clarifyjax.decoding.local_lm.LocalLM` running a tiny Llama folder (the
    RoT prompt, 1.3k tokens here, shares its few-shot prefix across the batch: all 25 rows are one
    batch), then the scores and the report."""
    raw = local_lm_run(tmp_path, embedder, {"kind": "local", "model": scripted}, "tiny")
    raw.update({"answer": {**raw["answer"], "batch_size": 32}, "rot": {**raw["rot"], "batch_size": 32}})
    cfg = build_root(SageRunConfig, raw)
    summary = pipeline.Run(cfg, embedder=SHARED["embedder"]).run()
    check_scripted_run(tmp_path / "out", summary, "tiny")


@pytest.mark.reference
@pytest.mark.slow  # as above, behind the server's micro-batcher
def test_the_pipeline_through_clarifyjax_serve_with_the_openai_client(tmp_path, embedder, scripted):
    """Every generating stage over HTTP: `clarifyjax serve`'s OpenAI-compatible app on
    127.0.0.1 running the tiny Llama through LocalLM, called through the `openai` package. Each
    request is sampled with its own seed, so it runs in a call of its own: batches of 4 rows, one
    of them the request's (with 32, each request paid for 31 copies of itself)."""
    require("openai")
    from clarifyjax.decoding.local_lm import LocalLM
    from clarifyjax.serve.openai_api import OpenAIServer
    from clarifyjax.serve.http_server import BackgroundServer

    with BackgroundServer(OpenAIServer(LocalLM(scripted, batch_size=4), name="served").app) as server:
        remote = {"kind": "openai", "base_url": server.url + "/v1", "model": "served", "concurrency": 4}
        raw = local_lm_run(tmp_path, embedder, remote, "served")
        summary = pipeline.Run(build_root(SageRunConfig, raw), embedder=SHARED["embedder"]).run()
    check_scripted_run(tmp_path / "out", summary, "served")


def test_rows_whose_prompt_cannot_fit_the_context_fail_without_stopping_the_stage(tmp_path):
    class Counting(FakeGenerator):  # a TokenCounter: one token per character
        context_length = 256 + 280

        def count_tokens(self, prompt):
            return len(prompt)

    raw = config(tmp_path, **{"paraphrase.source": "file",
                              "models": [{"name": "m1", "generator": {"kind": "local", "model": "small"}}]})
    fakes = []
    make_run(raw, lambda c: fakes.append(Counting(name=c.model)) or fakes[-1]).run(("paraphrase", "answer"))
    answers = stage_rows(tmp_path / "out")["answer/m1/p0of1"]
    long = [r for r in answers if len(r["prompt"]) + 256 > Counting.context_length]
    assert 0 < len(long) < len(answers)
    assert all(r["status"] == "failed" and r["attempt"] == 0 and "does not fit the context of 536" in r["reason"]
               for r in long)
    assert not {r["prompt"] for r in long} & set(fakes[0].prompts_seen)
