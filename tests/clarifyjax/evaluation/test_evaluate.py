"""`clarifyjax evaluate` on tiny random models made here: all six systems on 20 situations, the
tables checked against independent computations from the saved files, and a run killed (-9)
during question generation resumed to the same tables.

The 20 situations are dev situations of one token length (the policy's tokenizer), so that both
chunks of 10 pad to the same shapes and each stage compiles once rather than once per chunk; the
Table 3 file holds 8 update groups, one chunk."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from helpers.env import REPO_ROOT, require, shared_data
from helpers.children import clean_env, killed_on_second_call
from helpers.tiny_models import tiny_classifier_folder, tiny_nli_folder, tiny_t5_folder

N_SITUATIONS = 20


def tiny_qa_folder(root):
    """A random RobertaForQuestionAnswering (weights redrawn with std 0.2, as the tiny
    classifiers, so that spans differ by input) with a BPE tokenizer.json trained here."""
    require("torch")
    import torch
    import transformers
    from clarifyjax.models.tiny import tiny_bpe_tokenizer

    folder = root / "qa"
    folder.mkdir()
    tokenizer = tiny_bpe_tokenizer("roberta")
    config = transformers.RobertaConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=130, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    torch.manual_seed(25)
    model = transformers.RobertaForQuestionAnswering(config).eval()
    gen = torch.Generator().manual_seed(25)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.2
            p.copy_(1.0 + noise if "LayerNorm.weight" in name else noise)
    model.save_pretrained(str(folder))
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder, model, tokenizer


def _write_table(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\",
                            lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _situation_rows(policy) -> list[list[str]]:
    """The dev rows (every gold question) of the N_SITUATIONS dev situations whose policy input
    is nearest the most common token length (file order breaks ties; in file order)."""
    from collections import Counter

    from clarifyjax.text.formats import policy_input
    from clarifyjax.text.tokenizer import Tokenizer

    with open(shared_data("delta-clarify/dev.tsv"), newline="", encoding="utf-8") as f:
        dev = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    names = list(dict.fromkeys(r["situation"] for r in dev))
    _, mask = Tokenizer.from_pretrained(policy).encode_batch([policy_input(x) for x in names], 128)
    lengths = mask.sum(1).tolist()
    mode = Counter(lengths).most_common(1)[0][0]
    order = sorted(range(len(names)), key=lambda i: (abs(lengths[i] - mode), i))
    chosen = {names[i] for i in order[:N_SITUATIONS]}
    return [[r["id"], r["source"], r["situation"], r["question"]] for r in dev
            if r["situation"] in chosen]


@pytest.fixture(scope="module")
def config_text(tmp_path_factory):
    """The YAML of an evaluation over tiny models, with an ``OUT`` placeholder."""
    root = tmp_path_factory.mktemp("evaluate")
    m = dict(
        policy=tiny_t5_folder(tmp_path_factory, seed=41, initializer_factor=3.0),
        question=tiny_t5_folder(tmp_path_factory, seed=42, initializer_factor=3.0),
        wh=tiny_t5_folder(tmp_path_factory, seed=43, initializer_factor=3.0),
        answerer=tiny_t5_folder(tmp_path_factory, seed=21, initializer_factor=3.0),
        fusion=tiny_t5_folder(tmp_path_factory, family="v1.1", seed=12, initializer_factor=3.0),
        judge=tiny_t5_folder(tmp_path_factory, seed=44, initializer_factor=3.0),
        nli=tiny_nli_folder(tmp_path_factory, seed=14),
        disc=tiny_classifier_folder(tmp_path_factory, ("irrelevant", "relevant"), seed=15),
        qa=tiny_qa_folder(root)[0])
    situations = _write_table(root / "situations.tsv", ["id", "source", "situation", "question"],
                              _situation_rows(m["policy"]))
    with open(shared_data("delta-clarify/sc_dev_questions_gpt.tsv"), newline="",
              encoding="utf-8") as f:  # 40 rows: 8 (Hypothesis, UpdateType) groups
        silver = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:40]
    social = root / "social.jsonl"
    social.write_text("".join(json.dumps({k: r[k] for k in ("Hypothesis", "Update", "UpdateType",
                                                             "question_davinci")}) + "\n"
                              for r in silver), encoding="utf-8")
    return f"""kind: evaluate
out: OUT
data: {{situations_path: {situations}, batch_size: 10}}
generation: {{sampling: {{max_new_tokens: 8}}, wh_starts: [what, why, how]}}
systems:
  - {{name: ClarifyDelphi, kind: ppo, model: {m['policy']}}}
  - {{name: t5, kind: t5, model: {m['question']}, data_fraction: 1.0}}
  - {{name: pipeline, kind: pipeline, model: {m['wh']}}}
  - {{name: pipeline-nli, kind: pipeline-nli, model: {m['wh']}}}
  - {{name: why, kind: why, model: {m['wh']}}}
  - {{name: discriminator, kind: discriminator, model: {m['wh']}, classifier: {m['disc']}}}
rewards:
  answerer: {m['answerer']}
  fusion: {m['fusion']}
  judge: {{model: {m['judge']}}}
  nli: {m['nli']}
  answer_max_length: 8
  fusion_max_length: 12
table3: {{path: {social}, answerer: {m['answerer']}, max_length: 8}}
informativeness: {{qa: {m['qa']}, max_length: 128}}
bertscore: {{model: {m['nli']}, layer: 2}}
"""


def _config(tmp_path, config_text, name):
    out = tmp_path / name
    path = tmp_path / f"{name}.yaml"
    path.write_text(config_text.replace("OUT", str(out)), encoding="utf-8")
    return path, out


def _evaluate(path, *extra) -> int:
    from clarifyjax import cli

    return cli.main(["evaluate", str(path), *extra])


def _jsd2(p, q):
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    m = (p + q) / 2
    kl = lambda a: np.where(a > 0, a * np.log2(np.where(a > 0, a, 1) / m), 0).sum(-1)  # noqa
    return (kl(p) + kl(q)) / 2


def m_wh(path) -> str:
    """The wh-conditioned model folder named in a config written by `_config`."""
    line = [x for x in path.read_text().splitlines() if "name: why, kind: why" in x][0]
    return line.split("model: ")[1].rstrip("}")


def _numbers(out):
    results = json.loads((out / "results.json").read_text())
    return ({r["system"]: r for r in results["systems"]},
            {r["setting"]: r for r in results["table3"]})


def _check_table4(systems: dict, records: list[dict]) -> int:
    """Each system's Table 4 numbers against their computation here from the saved records;
    returns how many flips were seen."""
    flips_seen, raws = 0, {}
    for name, row in systems.items():
        mine = [r for r in records if r["system"] == name]
        assert len(mine) == N_SITUATIONS == row["situations"]
        p_base, p_weak, p_strong = (np.array([r[k] for r in mine], np.float64)
                                    for k in ("p_base", "p_weak", "p_strong"))
        valid = np.array([r["valid"] for r in mine])
        answered = np.array([r["answered"] for r in mine]) & valid[:, None]
        assert row["avg_jsd"] == pytest.approx(_jsd2(p_weak, p_strong)[valid].mean(), abs=1e-6)
        # the raw reward (0 where not valid), paired against the first system on each situation
        raws[name] = raw = np.where(valid, _jsd2(p_weak, p_strong), 0.0)
        diff = raw - raws[next(iter(systems))]
        assert row["reward_raw"] == pytest.approx(raw.mean(), abs=1e-6)
        assert row["raw_gain"] == pytest.approx(diff.mean(), abs=1e-6)
        assert row["raw_gain_se"] == pytest.approx(np.std(diff, ddof=1) / np.sqrt(len(diff)),
                                                   abs=1e-6)
        base_flips = np.stack([p_weak.argmax(1), p_strong.argmax(1)], 1) != p_base.argmax(1)[:,
                                                                                             None]
        assert row["flips_base"] == pytest.approx(100 * base_flips[answered].mean(), abs=1e-4)
        pair = (p_weak.argmax(1) != p_strong.argmax(1))[valid]
        assert row["flips_pair"] == pytest.approx(100 * pair.mean(), abs=1e-6)
        assert row["flips"] == row["flips_base"]  # the default reading
        flips_seen += int(base_flips[answered].sum() + pair.sum())
        if name in ("pipeline", "pipeline-nli", "discriminator"):
            for r in mine:  # the chosen question is the best-scoring candidate (first on ties)
                assert r["question"] == r["candidates"][int(np.argmax(r["candidate_scores"]))]
    return flips_seen



def _check_table3(out, table3: dict) -> None:
    """Table 3 against nltk and rouge-score called here on the saved texts."""
    from nltk.translate.bleu_score import corpus_bleu
    from rouge_score import rouge_scorer

    updates = [json.loads(line) for line in (out / "updates.jsonl").read_text().splitlines()]
    assert len(updates) == len({(u["hypothesis"], u["update_type"]) for u in updates})
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    for setting in ("with_question", "without_question"):
        refs = [[r.split() for r in u["references"]] for u in updates]
        hyps = [u[setting].split() for u in updates]
        bleu = 100 * corpus_bleu(refs, hyps)
        rouge = 100 * np.mean([max(scorer.score(r, u[setting])["rougeL"].fmeasure
                                   for r in u["references"]) for u in updates])
        row = table3[setting.replace("_", " ")]
        assert row["bleu4"] == pytest.approx(bleu, abs=1e-9)
        assert row["rouge_l"] == pytest.approx(rouge, abs=1e-9)



# `clarifyjax evaluate` in a child that SIGKILLs itself when it starts the ClarifyDelphi
# questions' second chunk (the first is saved by then)
KILLED_CHILD = killed_on_second_call("clarifyjax.evaluation.baselines", "QuestionSampler.__call__",
                                     "from clarifyjax import cli\nsys.exit(cli.main(['evaluate', sys.argv[1]]))")


def _kill_during_questions_then_rerun(tmp_path, config_text, out):
    """Killed (-9) during question generation, then run again: the same tables. Returns the
    config's path."""
    path2, out2 = _config(tmp_path, config_text, "killed")
    child = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(path2)],
                           env=clean_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    done = list((out2 / "cache" / "questions" / "ClarifyDelphi").glob("*.json"))
    assert len(done) == 1 and not (out2 / "results.json").exists()
    assert _evaluate(path2) == 0
    assert _numbers(out2) == _numbers(out)
    assert (out2 / "questions.jsonl").read_text() == (out / "questions.jsonl").read_text()
    return path2


@pytest.mark.reference
@pytest.mark.e2e
@pytest.mark.child
@pytest.mark.slow
def test_evaluate_six_systems_tables_match_independent_computations(tmp_path, config_text):
    path, out = _config(tmp_path, config_text, "run")
    assert _evaluate(path) == 0
    for name in ("results.md", "systems.csv", "results.json", "systems.png", "ablation.png",
                 "table3.csv", "questions.jsonl", "updates.jsonl"):
        assert (out / name).stat().st_size > 0, name
    systems, table3 = _numbers(out)
    assert list(systems) == ["ClarifyDelphi", "t5", "pipeline", "pipeline-nli", "why",
                             "discriminator"]
    records = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    for name, row in systems.items():  # informativeness and BERTScore from the saved values
        mine = [r for r in records if r["system"] == name]
        assert row["unanswerable_pct"] == pytest.approx(
            100 * np.mean([r["unanswerable"] for r in mine]))
        assert row["bertscore_f1"] == pytest.approx(np.mean([r["bertscore_f1"] for r in mine]))
    from clarifyjax.evaluation.bertscore import bertscore
    from clarifyjax.evaluation.evaluate import read_situations

    cfg_lines = path.read_text().splitlines()
    _, gold = read_situations(cfg_lines[2].split("situations_path: ")[1].split(",")[0], None)
    bert_model = [x for x in cfg_lines if x.startswith("bertscore:")][0].split("model: ")[1]
    t5 = [r for r in records if r["system"] == "t5"]
    f1 = bertscore([r["question"] for r in t5], gold, model=bert_model.split(",")[0], layer=2)[2]
    assert systems["t5"]["bertscore_f1"] == pytest.approx(float(np.mean(f1)), abs=1e-6)
    assert _check_table4(systems, records) > 0  # the comparison is not between zeros only
    assert "reading `base`" in (out / "results.md").read_text()

    _check_table3(out, table3)

    path2 = _kill_during_questions_then_rerun(tmp_path, config_text, out)

    # again, and with one more system: only that system's stages run
    from clarifyjax.config.evaluate import load_eval_config
    from clarifyjax.evaluation.evaluate import Evaluation

    assert Evaluation(load_eval_config(path2)).run()["computed"] == {}
    path3 = tmp_path / "more.yaml"
    path3.write_text(path2.read_text().replace(
        "systems:\n", f"systems:\n  - {{name: why-again, kind: why, model: {m_wh(path2)}}}\n"))
    run = Evaluation(load_eval_config(path3)).run()
    assert run["computed"] == {"questions": 2, "judgments": 2, "answers": 2, "bertscore": 2}



@pytest.mark.e2e
def test_config_errors_name_the_key_and_file(tmp_path):
    from clarifyjax.config.loader import ConfigError
    from clarifyjax.config.evaluate import WH_STARTS, load_eval_config

    base = ("kind: evaluate\nsystems:\n  - {name: a, kind: t5, model: m}\n"
            "rewards: {answerer: x, fusion: y, judge: {model: z}}\n")
    path = tmp_path / "e.yaml"
    path.write_text(base)
    cfg = load_eval_config(path)
    s = cfg.generation.sampling
    assert (s.max_new_tokens, s.temperature, s.top_p, s.top_k) == (32, 1.0, 0.6, 50)
    assert len(WH_STARTS) == 14 and cfg.generation.wh_starts == WH_STARTS
    assert cfg.table4.flip == "base"
    cases = {
        "generation.sampling.top_p=1.5": r"e\.yaml.*top_p: must be a number in \(0, 1\]",
        "generation.top_p=0.9": r"generation\.top_p: moved to generation\.sampling\.top_p$",
        "generation.sampling.stop=x": r"generation\.sampling\.stop = .* is not used",
        "data.batch_size=0": r"data\.batch_size = 0: must be >= 1",
        "table4.flip=both": r"bad value for 'table4\.flip'",
        "generation.greedy=true generation.sampling.top_k=5":
            r"generation\.sampling\.top_k = 5 is not used",
        "systems=[]": r"systems: name at least one system",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_eval_config(path, overrides.split())
    path.write_text(base.replace("kind: t5, model: m", "kind: pipeline-nli, model: m"))
    with pytest.raises(ConfigError, match="pipeline-nli system needs rewards.nli"):
        load_eval_config(path)
    path.write_text(base.replace("kind: t5, model: m", "kind: discriminator, model: m"))
    with pytest.raises(ConfigError, match=r"systems\[0\]\.classifier"):
        load_eval_config(path)
    from clarifyjax import cli

    path.write_text(base + "data: {situations: -3}\n")
    assert cli.main(["evaluate", str(path)]) == 2
    from clarifyjax.config.evaluate import check_eval_inputs

    with pytest.raises(ConfigError, match=r"systems\[0\]\.model: m: no such folder"):
        check_eval_inputs(load_eval_config(tmp_path / "e.yaml", ["data.situations=3"]))


@pytest.mark.reference
def test_unanswerable_reads_the_situation_as_context(tmp_path):
    """`qa_metric.Unanswerable` against transformers' RobertaForQuestionAnswering on the same
    weights, with the rule written here in numpy: spans (i <= j) over the situation's tokens and
    CLS; unanswerable when the best span starts at CLS."""
    import torch

    from clarifyjax.evaluation.qa_metric import load_unanswerable

    folder, model, tokenizer = tiny_qa_folder(tmp_path)
    with open(shared_data("delta-clarify/dev.tsv"), newline="", encoding="utf-8") as f:
        dev = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:24]
    situations, questions = [r["situation"] for r in dev], [r["question"] for r in dev]
    ours = load_unanswerable(folder, max_length=128, batch_size=8)(situations, questions)
    expected = []
    for s, q in zip(situations, questions):
        enc = tokenizer.encode(q, s)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([enc.ids]),
                        attention_mask=torch.tensor([enc.attention_mask]))
        start, end = out.start_logits[0].numpy(), out.end_logits[0].numpy()
        allowed = np.array([sid == 1 for sid in enc.sequence_ids])
        allowed[0] = True
        score = np.where(allowed[:, None] & allowed[None, :], start[:, None] + end[None, :],
                         -np.inf)
        score[np.tril_indices(len(start), -1)] = -np.inf
        expected.append(np.unravel_index(np.argmax(score), score.shape)[0] == 0)
    assert ours.tolist() == expected
    assert 0 < sum(expected) < len(expected)  # both outcomes occur


@pytest.mark.reference
def test_discriminator_relevance_matches_transformers(tmp_path_factory):
    """The discriminator baseline's P(relevant) from a DeBERTa-v3 classifier folder (what
    `clarifyjax train clarifyjax/presets/sft_discriminator*.yaml` exports): transformers'
    DebertaV2ForSequenceClassification softmax on the same (situation, question) pair encoding,
    within 1e-5; an empty candidate scores 0; the best candidate is the most relevant one."""
    import tokenizers
    import torch
    import transformers

    from clarifyjax.evaluation.baselines import Discriminator, best_candidates
    from helpers.tiny_models import tiny_deberta_classifier_folder

    folder = tiny_deberta_classifier_folder(tmp_path_factory, seed=45)
    situations = ["borrowing a car without asking", "telling a white lie to a friend"]
    candidates = [["why?", "who owns the car?", "is it an emergency?"],
                  ["what was the lie?", "", "does it hurt anyone?"]]
    scores = Discriminator(folder).scores(situations, candidates)
    model = transformers.DebertaV2ForSequenceClassification.from_pretrained(str(folder)).eval()
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    relevant = model.config.label2id["relevant"]
    for i, s in enumerate(situations):
        for j, q in enumerate(candidates[i]):
            if not q:
                assert scores[i, j] == 0.0  # an empty candidate is never chosen over a question
                continue
            enc = tok.encode(s, q)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([enc.ids]),
                               attention_mask=torch.tensor([enc.attention_mask])).logits[0]
            expected = torch.softmax(logits, -1)[relevant].item()
            assert scores[i, j] == pytest.approx(expected, abs=1e-5)
    assert len({round(float(x), 6) for x in scores.ravel()}) > 2  # not a constant classifier
    chosen = best_candidates(candidates, scores)
    assert chosen == [c[int(np.argmax(r))] for c, r in zip(candidates, scores)]


def test_train_fraction_keeps_whole_situations():
    """The data-size ablation's configs (clarifyjax/presets/sft_question_data*.yaml) keep a seeded share of
    the training situations, each with all its questions."""
    import dataclasses

    from clarifyjax import data
    from clarifyjax.config import load_config

    cfg = load_config(REPO_ROOT / "clarifyjax" / "presets" / "sft_question_data25.yaml")
    assert cfg.data.train_fraction == 0.25
    folder = REPO_ROOT / "examples" / "delta-clarify"
    base = dataclasses.replace(cfg.data, train_path=str(folder / "train.tsv"),
                               dev_path=str(folder / "dev.tsv"))
    full, _ = data.load_sft_pairs(dataclasses.replace(base, train_fraction=None), "question")
    groups = {p.group for p in full}
    for fraction in (0.25, 0.5, 0.75):
        kept, _ = data.load_sft_pairs(dataclasses.replace(base, train_fraction=fraction),
                                      "question")
        kept_groups = {p.group for p in kept}
        assert len(kept_groups) == max(1, round(fraction * len(groups)))
        assert kept == [p for p in full if p.group in kept_groups]  # whole situations, in order


@pytest.mark.e2e
@pytest.mark.parametrize("override, message", [
    ("out=/dev/null", "out /dev/null: is not a folder"),
    ("out=FILE", "is a file; give a folder"),
    ("out=FILE/results", "is a file, not a folder"),
    ("bertscore.layer=99", "bertscore.layer: layer must be an integer in [0, 6]"),
    ("bertscore.layer=7", "bertscore.layer: layer must be an integer in [0, 6]"),
])
def test_out_and_the_bertscore_layer_are_checked_before_any_model_loads(tmp_path, capsys,
                                                                        override, message):
    """`evaluate` with out= naming a file or /dev/null, or a BERTScore layer past the model's
    depth: one line naming the key, exit 2, before any model is read (the model folders here
    are empty: reading one would be another error)."""
    from clarifyjax import cli
    from clarifyjax.models.embedder import default_embedder_path

    empty = tmp_path / "model"
    empty.mkdir()
    taken = tmp_path / "taken.txt"
    taken.write_text("an earlier file\n")
    path = tmp_path / "e.yaml"
    path.write_text(
        f"kind: evaluate\nout: {tmp_path / 'out'}\n"
        f"data: {{situations_path: {shared_data('delta-clarify/dev.tsv')}, situations: 2}}\n"
        f"systems:\n  - {{name: a, kind: t5, model: {empty}}}\n"
        f"rewards: {{answerer: {empty}, fusion: {empty}, judge: {{model: {empty}}}}}\n"
        f"bertscore: {{model: {default_embedder_path()}, layer: 2}}\n")
    status = cli.main(["evaluate", str(path), override.replace("FILE", str(taken))])
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
    assert taken.read_text() == "an earlier file\n"
