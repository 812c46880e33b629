"""The score and report stages of `sage-jax run`: every process's rows merged, scored (`score_model`,
`score_stage`) and reported (`write_run_report`); what each writes is above it."""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
from types import SimpleNamespace
import sys

import numpy as np

from clarifyjax.files.textfiles import atomic_write_bytes
from sage_jax import report, scoring
from sage_jax.run.stages import StageError
from sage_jax.scoring import load_bertscore_model

LONG_COLUMNS = ("question_id", "question", "paraphrased", "score", "model_output", "rot", "paraphrase_index",
                "sample", "answer_status", "answer_reason", "answer_attempts", "rot_status", "rot_reason",
                "rot_attempts")
# Column -> label of Table 1, in order.
TABLE = {"sage_answer": "SaGE (answers)", "sage_rot": "SaGE (RoTs)", "sage_blend": "SaGE (0.8 answers + 0.2 RoTs)",
         "bleu": "BLEU (answers)", "bleu_rot": "BLEU (RoTs)", "rouge_l": "ROUGE-L (answers)",
         "rouge_l_rot": "ROUGE-L (RoTs)", "bertscore": "BERTScore (answers)", "bertscore_rot": "BERTScore (RoTs)",
         "elazar": "exact-match consistency (answers)"}
SCORES_VERSION = 3  # in the score stage's fingerprint: 2 added the RoT baselines, 3 the graphs
GRAPHS = {"text": "nodes keyed by text: identical texts are one node (the reference code's graph)",
          "distinct": "one node per answer: identical answers stay separate nodes"}
OTHER = {"text": "distinct", "distinct": "text"}


def _merged(run, stage: str, model: str | None = None) -> list[dict]:
    rows = []
    for i in range(run.count):
        rows.extend(run.finished_rows(stage, model, f"p{i}of{run.count}"))
    return rows


def _csv_bytes(rows: list[dict], columns) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def long_rows(run, target) -> tuple[list[dict], dict]:
    """The model's rows in the long format, and the failures of each stage."""
    paraphrases = _merged(run, "paraphrase")
    answers = _merged(run, "answer", target.name)
    rots = {(r["question_id"], r["paraphrase_index"], r["sample"]): r for r in _merged(run, "rot", target.name)} \
        if run.cfg.rot.generator is not None else {}
    rows = []
    for a in answers:
        r = rots.get((a["question_id"], a["paraphrase_index"], a["sample"]))
        ok = a["status"] == "ok"
        rows.append({"question_id": a["question_id"], "question": a["question"], "paraphrased": a["paraphrase"],
                     "score": a["parascore"], "model_output": a["answer"] if ok else "",
                     "rot": r["rot"] if r is not None and r["status"] == "ok" else "",
                     "paraphrase_index": a["paraphrase_index"], "sample": a["sample"],
                     "answer_status": a["status"], "answer_reason": a["reason"] or "",
                     "answer_attempts": a["attempt"] + 1,
                     "rot_status": r["status"] if r else ("" if not rots else "not asked"),
                     "rot_reason": (r["reason"] or "") if r else "", "rot_attempts": r["attempt"] + 1 if r else 0})
    failed = {"paraphrase_questions_failed": sum(p["status"] != "ok" for p in paraphrases),
              "paraphrase_questions": len(paraphrases),
              "answer_rows_failed": sum(a["status"] != "ok" for a in answers), "answer_rows": len(answers),
              "rot_rows_failed": sum(r["status"] != "ok" for r in rots.values()), "rot_rows": len(rots),
              "failure_reasons": _reasons(paraphrases + answers + list(rots.values()))}
    return rows, failed


def _reasons(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        if r["status"] != "ok":
            out[r["reason"]] = out.get(r["reason"], 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _args(run, text: str, path, bertscore=None, folders=None):
    """`sage-jax score`'s options for one of the run's files (`bertscore`: the loaded (model, layer);
    `folders`: `run.score_folders()`)."""
    from sage_jax.data import Columns

    s, folders = run.cfg.score, folders or {}
    return SimpleNamespace(text=text, format="long", columns=Columns(), edge_weights=None,
                           collapse_identical=run.preset.graph == "text", question_id_column="question_id",
                           alpha=s.alpha, blend_weight=s.blend_weight, chunk_size=8192, batch_size=s.batch_size,
                           no_lexical=not s.lexical, no_bertscore=not s.bertscore,
                           lexical_tokenizer=s.lexical_tokenizer,
                           embedder=folders.get("embedder"), files=[path],
                           bertscore_model=folders.get("bertscore_model"), bertscore_layer=s.bertscore_layer,
                           bertscore=bertscore)


def distinct_answers(texts: list[list[str]]) -> list[int]:
    """Per question, the number of distinct answers among its answered positions."""
    return [len({t for t in q if t}) for q in texts]


# Per model, report/<model>.answers.csv in the SaGE release's long format (question_id, question,
# paraphrased, score, model_output, rot) plus where each row came from (paraphrase index, sample,
# each stage's status, reason and attempts; a failed row's text is empty, so it is masked and
# counted), scored through `sage_jax.scoring` as `sage-jax score` would: SaGE on the answers, the
# RoTs and the 0.8/0.2 blend, on the preset's graph (code: nodes keyed by text; else one node per
# answer) and, to name what the choice changes, on the other graph too; on answers and RoTs the SaGE
# paper's Elazar et al. consistency (mean over the C(n,2) pairs of BLEU, ROUGE-L and BERTScore:
# `lexical`); and on the answers Elazar et al.'s strict measure, exact agreement
# (`lexical.exact_match_consistency`). The scores go to report/scores.json, keyed by a hash of what
# they depend on, so a finished score stage is not computed again.
def score_model(run, target, embedder_fn, bertscore=None) -> dict:
    """Per-question columns of one model (lists), from its long-format file: SaGE on the preset's
    graph (`sage_<text>`) and on the other (`sage_<text>_<graph>_graph`)."""
    from sage_jax import lexical

    path = run.out / "report" / f"{target.name}.answers.csv"
    progress = lambda total, desc: _quiet_bar(run, total, desc)  # noqa: E731
    answers_args = _args(run, "answer", path, bertscore)
    answers = scoring.Loaded(path, target.name, answers_args)  # the baselines: answers, their own mask
    nan = np.full(len(answers.questions), np.nan)
    rot_baselines = {"bleu": nan, "rouge_l": nan, "bertscore": nan}
    item, item_args = answers, answers_args
    if run.cfg.rot.generator is not None:
        item_args = _args(run, "blend", path)
        item = scoring.Loaded(path, target.name, item_args)
        rot_args = _args(run, "rot", path, bertscore)
        rot_baselines = scoring.baselines(scoring.Loaded(path, target.name, rot_args), rot_args, embedder_fn, progress)
    graphs = scoring.sage_both_graphs(item, item_args, embedder_fn, progress)
    mine, other = run.preset.graph, OTHER[run.preset.graph]
    return {"question_id": [q.question_id for q in answers.questions], "n_texts": answers.first.n_texts.tolist(),
            "n_valid": answers.mask.sum(axis=1).tolist(),
            "distinct_answers": distinct_answers(answers.lexical_texts),
            **{f"sage_{text}": _floats(graphs[mine].get(text, nan)) for text in ("answer", "rot", "blend")},
            **{f"sage_{text}_{other}_graph": _floats(graphs[other].get(text, nan)) for text in ("answer", "blend")},
            **{key: _floats(v) for key, v in scoring.baselines(answers, answers_args, embedder_fn, progress).items()},
            **{f"{key}_rot": _floats(v) for key, v in rot_baselines.items()},
            "elazar": _floats(lexical.exact_match_consistency(answers.lexical_texts))}


def _floats(values) -> list[float]:
    return [float(x) for x in values]


def _quiet_bar(run, total, desc):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=run.cfg.quiet, leave=False, file=sys.stderr, dynamic_ncols=True)


def score_stage(run) -> dict:
    """The score stage; its result is reused while the answers files and settings are unchanged."""
    folder = run.out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    files, failures = {}, {}
    for target in run.cfg.models:
        rows, failures[target.name] = long_rows(run, target)
        files[target.name] = _csv_bytes(rows, LONG_COLUMNS)
    digest = hashlib.sha256(json.dumps([SCORES_VERSION, run.preset.graph, dataclasses.asdict(run.cfg.score)],
                                       sort_keys=True).encode())
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + data)
    scores_path = folder / "scores.json"
    if scores_path.exists():
        saved = json.loads(scores_path.read_text())
        if saved.get("fingerprint") == digest.hexdigest():
            return saved
    for name, data in files.items():
        atomic_write_bytes(folder / f"{name}.answers.csv", data)
    cache: dict = {} if run.embedder is None else {"embedder": run.embedder}
    folders = run.score_folders()

    def embedder_fn():
        if "embedder" not in cache:
            from clarifyjax.models.embedder import SentenceEmbedder

            cache["embedder"] = SentenceEmbedder.from_pretrained(folders["embedder"])
        return cache["embedder"]

    bertscore = None
    if run.cfg.score.bertscore:
        bertscore = load_bertscore_model(_args(run, "answer", None, folders=folders))
    models = {}
    for target in run.cfg.models:
        if not files[target.name].count(b"\n") > 1:  # no answered row at all
            models[target.name] = {"per_question": None, "failures": failures[target.name]}
            continue
        models[target.name] = {"per_question": score_model(run, target, embedder_fn, bertscore),
                               "failures": failures[target.name]}
    s = run.cfg.score
    settings = {"graph": run.preset.graph,
                "embedder": {"name": s.embedder, "folder": str(folders["embedder"] or "(given to the run)")},
                "bertscore": None if bertscore is None else {
                    "name": s.bertscore_model, "folder": str(folders["bertscore_model"]), "layer": bertscore[1]}}
    result = {"fingerprint": digest.hexdigest(), "models": models, "scoring": settings}
    atomic_write_bytes(scores_path, json.dumps(_finite(result), indent=1).encode())
    return json.loads(scores_path.read_text())


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _column(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], np.float64)


def graph_difference(run, name: str, pq: dict, stats: dict) -> tuple[dict, str]:
    """What the other graph changes for one model: the questions with identical answers, the SaGE
    the other graph gives (for the summary), and the sentence that says so (for table1.md)."""
    other = OTHER[run.preset.graph]
    identical = sum(1 for d, v in zip(pq["distinct_answers"], pq["n_valid"]) if v >= 2 and d < v)
    alt = {f"sage_{t}_{other}_graph": report.statistics(_column(pq[f"sage_{t}_{other}_graph"]))
           for t in ("answer", "blend")}
    entry = {"questions_with_identical_answers": identical, "other_graph": other, **alt}
    shown = lambda stat: "n/a" if stat["mean"] is None else f"{stat['mean']:.4f}"  # noqa: E731
    changes = "; ".join(f"SaGE ({label}) {shown(alt[f'sage_{t}_{other}_graph'])} instead of "
                        f"{shown(stats[f'sage_{t}'])}" for t, label in (("answer", "answers"), ("blend", "blend"))
                        if stats[f"sage_{t}"]["count"])
    what = ("the reference's graph keyed by text (preset code)" if other == "text"
            else "one node per answer (preset ours)")
    if not identical:
        return entry, f"- {name}: no question has identical answers among its paraphrases: {what} gives the same SaGE."
    how = "makes each set of identical answers one node" if other == "text" else "keeps them apart"
    note = (f"- {name}: {identical} of {len(pq['question_id'])} questions have identical answers among their "
            f"paraphrases; {what} {how}: {changes}.")
    return entry, note


def _header(run, scores: dict) -> str:
    settings = scores.get("scoring") or {}
    bert = settings.get("bertscore")
    models = f"SaGE embedder {run.cfg.score.embedder}" + (
        f"; BERTScore {bert['name']}, layer {bert['layer']}" if bert else "")
    lexical = (f" BLEU / ROUGE-L tokenisation: {run.cfg.score.lexical_tokenizer}."
               if run.cfg.score.lexical else "")
    return (f"Preset {run.cfg.preset}. Graph: {GRAPHS[run.preset.graph]}. Scoring models: "
            f"{models}.{lexical}")


# Per model report/<model>.per_question.csv; for all models report/table1.md and table1.csv (one row
# per model, as the paper's Table 1; table1.md names the preset, the graph, the scoring models and,
# per model, the questions with identical answers and the SaGE the other graph gives),
# report/summary.json (every metric's mean, std and count, each stage's failed rows, the preset, the
# graph, the models of every stage and of the scores, the settings) and report/sage_distribution.png.
def write_run_report(run, scores: dict) -> dict:
    folder = run.out / "report"
    summaries, table_rows, distributions, notes = [], [], {}, []
    for name, entry in scores["models"].items():
        pq = entry["per_question"]
        columns = {k: _column(v) for k, v in pq.items() if k in TABLE} if pq else {k: np.array([]) for k in TABLE}
        if pq:
            report.write_per_question_csv(folder / f"{name}.per_question.csv", {
                "question_id": pq["question_id"], "n_texts": pq["n_texts"], "n_valid": pq["n_valid"],
                "distinct_answers": pq["distinct_answers"], **columns,
                **{k: _column(v) for k, v in pq.items() if k.endswith("_graph")}})
        distributions[name] = columns["sage_answer"]
        stats = {k: report.statistics(v) for k, v in columns.items()}
        difference = None
        if pq:
            difference, note = graph_difference(run, name, pq, stats)
            notes.append(note)
        summaries.append({"model": name, **stats, **entry["failures"], "graph_difference": difference,
                          "n_questions": len(pq["question_id"]) if pq else 0})
        table_rows.append({"model": name, **{label: "" if stats[k]["mean"] is None else f"{stats[k]['mean']:.4f}"
                                             for k, label in TABLE.items()},
                           "questions": len(pq["question_id"]) if pq else 0,
                           "failed rows (answer/rot)": f"{entry['failures']['answer_rows_failed']}/"
                                                       f"{entry['failures']['rot_rows_failed']}",
                           "failed questions (paraphrase)": entry["failures"]["paraphrase_questions_failed"]})
    header = list(table_rows[0]) if table_rows else ["model"]
    atomic_write_bytes(folder / "table1.csv", _csv_bytes(table_rows, header))
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(str(r[h]) for h in header) + " |" for r in table_rows]
    md = [_header(run, scores), "", *md, "", *notes]
    atomic_write_bytes(folder / "table1.md", ("\n".join(md).rstrip() + "\n").encode())
    summary = {"preset": run.cfg.preset, "graph": run.preset.graph, "graph_meaning": GRAPHS[run.preset.graph],
               "parascore_threshold": run.threshold(), "models": summaries,
               "scoring_models": scores.get("scoring"), "stages": stage_models(run),
               "settings": _finite(dataclasses.asdict(run.cfg.score))}
    report.write_summary_json(folder / "summary.json", _finite(summary))
    report.plot_distributions(folder / "sage_distribution.png", distributions, title="SaGE per question (answers)")
    return summary


def stage_models(run) -> dict:
    """The generator and resolved sampling of every generating stage (and model), as run."""
    def one(generator, sampling):
        if generator is None:
            return None
        g = {k: v for k, v in dataclasses.asdict(generator).items()
             if k in ("kind", "model", "base_url", "api", "bos", "accepts", "column") and v is not None}
        return {"generator": g, "sampling": None if generator.kind == "file" else dataclasses.asdict(sampling)}

    cfg = run.cfg
    return {"paraphrase": {"source": "file"} if cfg.paraphrase.source == "file"
            else one(cfg.paraphrase.generator, cfg.paraphrase.sampling),
            "answer": {t.name: one(t.generator, t.sampling) for t in cfg.models},
            "rot": one(cfg.rot.generator, cfg.rot.sampling)}


def score_and_report(run, stages) -> dict | None:
    if "score" in stages:
        scores = score_stage(run)
    else:
        path = run.out / "report" / "scores.json"
        if not path.exists():
            raise StageError(f"stage score has not finished ({path} is missing); run it first (--stages score)")
        scores = json.loads(path.read_text())
    return write_run_report(run, scores) if "report" in stages else None
