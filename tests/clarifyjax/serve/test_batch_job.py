"""`clarifyjax generate`'s input rows and resumption, model-free: every bad row is one line naming
the file, line and field (before any model is read); chunks of an interrupted run are reused
and give what an uninterrupted run gives; another run's chunks are refused, not mixed in. The
same command on a real model, killed with kill -9: test_llm_generate.py."""
from __future__ import annotations

import json

import pytest

from clarifyjax import cli
from clarifyjax.serve.batch_job import generate_records, read_prompts
from clarifyjax.files.tables import DataError
from clarifyjax.text.generator import Completion, Sampling, per_prompt


def _write(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


@pytest.mark.parametrize("row,message", [
    ({"id": 1, "prompt": "a", "temprature": 0.5}, r":2: unknown field 'temprature'"),
    ({"prompt": "a"}, r":2: field 'id' must be"),
    ({"id": 0, "prompt": "a"}, r":2: id 0 is already used at line 1"),
    ({"id": 1, "prompt": "a", "messages": []}, r":2: a row needs exactly one of"),
    ({"id": 1}, r":2: a row needs exactly one of"),
    ({"id": 1, "prompt": ""}, r":2: field 'prompt' must be non-empty"),
    ({"id": 1, "prompt": "a", "temperature": -1}, r":2: field temperature: must be a number"),
    ({"id": 1, "prompt": "a", "top_p": 0}, r":2: field top_p: must be a number in \(0, 1\]"),
    ({"id": 1, "prompt": "a", "max_new_tokens": 2.5}, r":2: field max_new_tokens"),
    ({"id": 1, "prompt": "a", "stop": [""]}, r":2: field stop"),
    ({"id": 1, "messages": [{"role": "bot", "content": "x"}]},
     r":2: field messages\[0\]\.role: must be one of"),
    ({"id": 1, "messages": [{"role": "user"}]}, r":2: field messages\[0\]\.content"),
    ('{"id": 1, "prompt": "a"', r":2: malformed JSON"),
    ('{"id": 1, "prompt": NaN}', r":2: NaN is not valid JSON"),
])
def test_each_bad_row_is_named_by_file_line_and_field(tmp_path, row, message):
    path = _write(tmp_path / "prompts.jsonl", [{"id": 0, "prompt": "fine"}, row])
    with pytest.raises(DataError, match=message) as e:
        read_prompts(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.e2e
def test_the_command_prints_one_line_before_loading_any_model(tmp_path, capsys):
    path = _write(tmp_path / "prompts.jsonl", [{"id": 0, "prompt": "a", "top_k": -2}])
    status = cli.main(["generate", str(tmp_path / "no_model"), "--input", str(path),
                       "--out", str(tmp_path / "out.jsonl")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.count("\n") == 0
    assert err.startswith("clarifyjax generate: error: ") and f"{path}:1: field top_k" in err
    status = cli.main(["generate", str(tmp_path / "no_model"), "--input", str(path),
                       "--out", str(tmp_path / "out.jsonl"), "--top-p", "1.5"])
    assert status == 2 and "--top-p" in capsys.readouterr().err


class CountingTokens:
    """A generator that counts one token per character, in a context of 20, and has no chat
    template."""

    name, context_length, defaults = "tokens", 20, Sampling(max_new_tokens=8)

    def count_tokens(self, prompt) -> int:
        if not isinstance(prompt, str):
            raise ValueError("the tokenizer has no chat template")
        return len(prompt)

    def complete(self, prompts, sampling, n=1, seed=None):
        raise AssertionError("nothing is generated when a row cannot run")


def test_rows_that_do_not_fit_are_named_before_anything_is_generated(tmp_path):
    from clarifyjax.serve.batch_job import check_fit

    rows = read_prompts(_write(tmp_path / "p.jsonl", [
        {"id": 0, "prompt": "x" * 12}, {"id": 1, "prompt": "x" * 12, "max_new_tokens": 9},
        {"id": 2, "messages": [{"role": "user", "content": "hi"}]}]))
    check_fit(CountingTokens(), rows[:1], Sampling())
    with pytest.raises(DataError, match=r"p.jsonl:2: 12 prompt tokens \+ max_new_tokens 9 .*20"):
        check_fit(CountingTokens(), rows[:2], Sampling())
    with pytest.raises(DataError, match=r"p.jsonl:1: 12 prompt tokens \+ max_new_tokens 10"):
        check_fit(CountingTokens(), rows[:1], Sampling(max_new_tokens=10))  # the command's
    with pytest.raises(DataError, match=r"p.jsonl:3: the tokenizer has no chat template"):
        check_fit(CountingTokens(), rows[2:], Sampling())


class CountingGenerator:
    """Completions that depend on (prompt, seed, sample); fails on call `fail_at` (a kill)."""

    name = "counting"

    def __init__(self, fail_at=None):
        self.calls, self.fail_at = 0, fail_at

    def complete(self, prompts, sampling, n=1, seed=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        sampling = per_prompt(sampling, len(prompts), "sampling")
        return [[Completion(f"{p}|{seed}|{j}|{s.temperature}", (1, 2), (-1.0, -2.0), "length")
                 for j in range(n)] for p, s in zip(prompts, sampling)]


def test_an_interrupted_run_resumes_with_the_same_output(tmp_path):
    rows = read_prompts(_write(tmp_path / "p.jsonl", [
        {"id": f"q{i}", "prompt": f"prompt {i}", **({"temperature": 0} if i % 3 else {})}
        for i in range(10)]))
    settings = dict(sampling=Sampling(temperature=0.7), n=2, seed=5, chunk_rows=3,
                    options={"model": "x"}, folders=(), progress=False, logprobs=True)
    reference, _, store = generate_records(CountingGenerator(), rows,
                                           out=tmp_path / "ref.jsonl", **settings)
    store.finish()
    with pytest.raises(KeyboardInterrupt):
        generate_records(CountingGenerator(fail_at=3), rows, out=tmp_path / "out.jsonl",
                         **settings)
    generator = CountingGenerator()
    records, reused, store = generate_records(generator, rows, out=tmp_path / "out.jsonl",
                                              **settings)
    assert records == reference and reused == 2 and generator.calls == 2  # 4 chunks, 2 kept
    assert [r["id"] for r in records] == [f"q{i}" for i in range(10)]
    assert records[0]["completions"][1]["text"].endswith("|1|0.7")
    assert records[1]["completions"][0]["text"].endswith("|0|0")    # the row's own override
    assert records[0]["completions"][0]["logprobs"] == [-1.0, -2.0]
    store.finish()

    # another run's chunks are refused while they wait (and discarded with --overwrite)
    with pytest.raises(KeyboardInterrupt):
        generate_records(CountingGenerator(fail_at=2), rows, out=tmp_path / "out.jsonl",
                         **settings)
    changed = {**settings, "seed": 6}
    with pytest.raises(DataError, match="interrupted run with other settings"):
        generate_records(CountingGenerator(), rows, out=tmp_path / "out.jsonl", **changed)
    records, reused, _ = generate_records(CountingGenerator(), rows, out=tmp_path / "out.jsonl",
                                          overwrite=True, **changed)
    assert reused == 0 and records != reference


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "no json member"])
def test_a_damaged_chunk_is_made_again_with_a_warning(tmp_path, capfd, damage):
    """A chunk cut short by a crash (or emptied by a full disk) is unfinished: one warning line
    naming it, the chunk made again, the same output as an uninterrupted run."""
    import io

    import numpy as np

    rows = read_prompts(_write(tmp_path / "p.jsonl", [{"id": i, "prompt": f"p{i}"}
                                                      for i in range(6)]))
    settings = dict(sampling=Sampling(temperature=0.7), n=1, seed=3, chunk_rows=2,
                    options={}, folders=(), progress=False)
    reference, _, store = generate_records(CountingGenerator(), rows, out=tmp_path / "r.jsonl",
                                           **settings)
    store.finish()
    with pytest.raises(KeyboardInterrupt):  # chunks 0 and 1 saved, then killed
        generate_records(CountingGenerator(fail_at=3), rows, out=tmp_path / "o.jsonl",
                         **settings)
    chunk = tmp_path / ".o.jsonl.partial" / "chunk-000001.npz"
    data = chunk.read_bytes()
    if damage == "no json member":
        buffer = io.BytesIO()
        np.savez(buffer, other=np.zeros(3))
    chunk.write_bytes({"truncated": data[:len(data) // 2], "empty": b"",
                       "garbage": b"PK\x03\x04" + bytes(range(200)),
                       "no json member": buffer.getvalue() if damage == "no json member"
                       else b""}[damage])
    capfd.readouterr()
    generator = CountingGenerator()
    records, reused, _ = generate_records(generator, rows, out=tmp_path / "o.jsonl", **settings)
    err = capfd.readouterr().err
    assert records == reference and reused == 1 and generator.calls == 2
    warnings = [line for line in err.splitlines() if line.strip()]
    assert len(warnings) == 1 and str(chunk) in warnings[0] and "made again" in warnings[0], err
