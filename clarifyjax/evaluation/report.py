"""What `clarifyjax evaluate` writes into its ``out`` folder (`write_report` lists the files): the
tables as Markdown, CSV and JSON, the figures, and the per-question records every table is
computed from."""
from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

import numpy as np

from clarifyjax.evaluation import metrics
from clarifyjax.config.loader import config_to_dict
from clarifyjax.files.textfiles import atomic_write_bytes
from clarifyjax.rl.diagnostics import mean_se, paired_gain, question_stats

SYSTEMS_COLUMNS = ("system", "kind", "situations", "avg_jsd", "flips", "flips_base", "flips_pair",
           "unanswerable_pct", "bertscore_f1", "data_fraction", "avg_jsd_se", "reward_raw",
           "reward_raw_se", "gain_over", "raw_gain", "raw_gain_se", "flips_se", "flips_base_se",
           "flips_pair_se", "distinct_questions", "distinct_share", "top_question_share",
           "top_question_share_se", "top5_share", "top5_share_se", "distinct_2")


def system_rows(outputs, flip: str) -> list[dict]:
    """One row of numbers per system (`evaluation.SystemOutput`), every system judged on the same
    situations; `_noise` and `_collapse` name the standard errors, the gain and the diversity."""
    rows, baseline = [], None
    for out in outputs:
        j = out.judgments
        arrays = [[r[k] for r in j] for k in ("p_base", "p_weak", "p_strong", "valid",
                                              "answered")]
        t4, samples = metrics.table4(*arrays), metrics.table4_samples(*arrays)
        baseline = baseline or (out.system.name, samples["raw"])
        rows.append({
            "system": out.system.name, "kind": out.system.kind, "situations": len(out.questions),
            "avg_jsd": t4["avg_jsd"], "flips": 100 * t4[f"flips_{flip}"],
            "flips_base": 100 * t4["flips_base"], "flips_pair": 100 * t4["flips_pair"],
            "pairs": t4["pairs"], "answers": t4["answers"],
            "unanswerable_pct": (metrics.percent(out.unanswerable)
                                 if out.unanswerable is not None else float("nan")),
            "bertscore_f1": (float(np.mean(out.bertscore)) if out.bertscore is not None
                             else float("nan")),
            "data_fraction": out.system.data_fraction, **_noise(samples, flip, *baseline),
            **_collapse(question_stats(out.questions), len(out.questions))})
    return rows


def _noise(samples: dict, flip: str, baseline: str, baseline_raw) -> dict:
    """Table 4's standard errors over the situations: avg. JSD's over the valid pairs; the raw
    reward (the JSD, 0 where the pair is not valid: PPO's units) with its paired gain over
    `baseline` (the first system) on the same situations; the flip rates' (%) over their
    indicators (per answer for ``base``, per valid pair for ``pair``)."""
    raw, raw_se = mean_se(samples["raw"])
    gain, gain_se = paired_gain(baseline_raw, samples["raw"])
    out = {"avg_jsd_se": mean_se(samples["jsd"][samples["valid"]])[1], "reward_raw": raw,
           "reward_raw_se": raw_se, "gain_over": baseline, "raw_gain": gain,
           "raw_gain_se": gain_se}
    for reading in metrics.FLIP_READINGS:
        out[f"flips_{reading}_se"] = 100 * mean_se(samples[f"flips_{reading}"])[1]
    out["flips_se"] = out[f"flips_{flip}_se"]
    return out


def _collapse(stats: dict, n: int) -> dict:
    """How varied a system's questions are: a policy that asks one question of every situation
    (reward hacking) is named by its most common question and that question's share. Shares in
    % of the `n` situations, the top one's and the top five's with their binomial standard
    errors; distinct-2 in [0, 1]."""
    top = stats["top"][0] if stats["top"] else [None, 0]

    def share(p):
        return 100 * p, 100 * math.sqrt(p * (1 - p) / n) if n else math.nan

    top_share, top_se = share(stats["top_share"])
    top5_share, top5_se = share(stats["top5_share"])
    return {"distinct_questions": stats["distinct"], "distinct_share": 100 * stats["distinct_share"],
            "top_question": top[0], "top_question_share": top_share,
            "top_question_share_se": top_se, "top5_share": top5_share, "top5_share_se": top5_se,
            "distinct_2": stats["distinct_2"], "top_questions": stats["top"]}


def table3_rows(updates) -> list[dict]:
    if not updates:
        return []
    refs = [u["references"] for u in updates]
    return [{"setting": setting.replace("_", " "), **metrics.update_generation(
        [u[setting] for u in updates], refs)} for setting in ("with_question",
                                                               "without_question")]


def _fmt(value, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _pm(value, se, digits: int, sign: str = "") -> str:
    """`value +- se` (one standard error); the value alone when its SE is NaN."""
    text = "-" if value is None or math.isnan(value) else f"{value:{sign}.{digits}f}"
    return text if text == "-" or se is None or math.isnan(se) else f"{text} +- {se:.{digits}f}"


def _table4_lines(rows, flip: str, n: int) -> list[str]:
    reading = {"base": "an answer's updated situation changes the judge's class from the base "
                       "situation's (% of the answers kept and fused)",
               "pair": "the weakener's and the strengthener's classes differ (% of the valid "
                       "pairs)"}[flip]
    baseline = rows[0]["gain_over"] if rows else None
    lines = [f"## Table 4 and question quality ({n} situations)", "",
             f"Judgment flips, reading `{flip}`: {reading}. `+-` is one standard error over the "
             "situations (answers, pairs); avg. JSD is over the valid pairs, the raw reward is "
             "the JSD with 0 where the pair is not valid (PPO's raw reward at `dropped_reward: 0`), "
             f"and its gain is paired over the same situations against `{baseline}`.", "",
             f"| system | kind | avg. JSD | raw reward | gain over `{baseline}` | judgment flips (%) "
             "| unanswerable (%) | BERTScore F1 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gain = ("(baseline)" if r["system"] == baseline
                else _pm(r["raw_gain"], r["raw_gain_se"], 4, "+"))
        lines.append(f"| {r['system']} | {r['kind']} | {_pm(r['avg_jsd'], r['avg_jsd_se'], 4)} | "
                     f"{_pm(r['reward_raw'], r['reward_raw_se'], 4)} | {gain} | "
                     f"{_pm(r['flips'], r['flips_se'], 1)} | {_fmt(r['unanswerable_pct'], 1)} | "
                     f"{_fmt(r['bertscore_f1'], 4)} |")
    lines += ["", "## The questions each system asks", "",
              "Shares in % of the situations, `+-` one binomial standard error; distinct-2: the "
              "distinct word pairs over all word pairs of the system's questions.", "",
              "| system | distinct questions | distinct (%) | most common question | asked of (%) "
              "| five most common (%) | distinct-2 |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['system']} | {r['distinct_questions']} | {_fmt(r['distinct_share'], 1)} | "
              f"{r['top_question']!r} | {_pm(r['top_question_share'], r['top_question_share_se'], 1)}"
              f" | {_pm(r['top5_share'], r['top5_share_se'], 1)} | {_fmt(r['distinct_2'], 3)} |"
              for r in rows]
    return lines


def markdown(rows, t3, flip: str, n: int) -> str:
    lines = _table4_lines(rows, flip, n)
    if t3:
        lines += ["", f"## Table 3: update generation ({t3[0]['hypotheses']} groups)", "",
                  "| setting | BLEU-4 | ROUGE-L |", "|---|---|---|"]
        lines += [f"| {r['setting']} | {_fmt(r['bleu4'], 2)} | {_fmt(r['rouge_l'], 2)} |"
                  for r in t3]
    ablation = sorted((r for r in rows if r["data_fraction"] is not None),
                      key=lambda r: r["data_fraction"])
    if ablation:
        lines += ["", "## Data-size ablation", "",
                  "| training situations | system | unanswerable (%) | BERTScore F1 |",
                  "|---|---|---|---|"]
        lines += [f"| {100 * r['data_fraction']:.0f}% | {r['system']} | "
                  f"{_fmt(r['unanswerable_pct'], 1)} | {_fmt(r['bertscore_f1'], 4)} |"
                  for r in ablation]
    return "\n".join(lines) + "\n"


def _csv(rows, columns) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def _save_figure(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    os.replace(tmp, path)


def plot_systems(rows, flip: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("avg_jsd", "avg. JSD (+- SE)"), ("flips", f"judgment flips % ({flip}, +- SE)"),
              ("unanswerable_pct", "unanswerable %"), ("bertscore_f1", "BERTScore F1")]
    names = [r["system"] for r in rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), dpi=100)
    for ax, (key, title) in zip(axes, panels):
        values = [r[key] if r[key] is not None else float("nan") for r in rows]
        errors = [r.get(f"{key}_se", float("nan")) for r in rows]
        ax.bar(range(len(names)), [0 if math.isnan(v) else v for v in values],
               yerr=[0 if math.isnan(e) else e for e in errors], capsize=3,
               color=[f"C{i}" for i in range(len(names))])
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("clarifyjax evaluate: systems compared")
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)
    return path


def plot_ablation(rows, path: Path) -> Path | None:
    points = sorted((r for r in rows if r["data_fraction"] is not None),
                    key=lambda r: r["data_fraction"])
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [100 * r["data_fraction"] for r in points]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), dpi=100)
    for ax, (key, title) in zip(axes, (("unanswerable_pct", "unanswerable %"),
                                       ("bertscore_f1", "BERTScore F1"))):
        ax.plot(x, [r[key] for r in points], "o-")
        ax.set_xlabel("% of training situations")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    fig.suptitle("Data-size ablation: supervised question generators")
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)
    return path


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def question_records(outputs) -> list[dict]:
    records = []
    for out in outputs:
        for i, question in enumerate(out.questions):
            j = out.judgments[i]
            records.append({
                "system": out.system.name, "situation_index": i, "question": question,
                "candidates": out.candidates[i] if out.candidates is not None else None,
                "candidate_scores": (out.candidate_scores[i] if out.candidate_scores is not None
                                     else None),
                **{k: j[k] for k in ("p_base", "p_weak", "p_strong", "valid", "answered", "jsd",
                                     "weak_answer", "strong_answer", "weak_situation",
                                     "strong_situation")},
                "unanswerable": out.unanswerable[i] if out.unanswerable is not None else None,
                "bertscore_f1": out.bertscore[i] if out.bertscore is not None else None})
    return records


def _jsonl(records) -> bytes:
    return "".join(json.dumps(_json_safe(r), ensure_ascii=False) + "\n"
                   for r in records).encode("utf-8")


def write_report(cfg, run: dict) -> dict:
    """Write each file into ``cfg.out`` whole (a temporary file, then a rename); returns
    results.json's data.

    ``results.md`` (Table 4 with standard errors and the raw reward's paired gain over the first
    system, informativeness and BERTScore per system, the questions' diversity, Table 3, the
    data-size ablation when systems declare ``data_fraction``); ``systems.csv`` (`SYSTEMS_COLUMNS`),
    ``table3.csv``, ``results.json`` (every number, both flip readings, the implementations used);
    ``systems.png`` and ``ablation.png``; ``questions.jsonl`` (per system and situation: the
    question, its candidates and scores, p_base / p_weak / p_strong, valid, answered, unanswerable,
    BERTScore F1: what every table is computed from) and ``updates.jsonl`` (Table 3's texts)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    flip = cfg.table4.flip
    rows = system_rows(run["outputs"], flip)
    t3 = table3_rows(run["updates"])
    n = len(run["outputs"][0].questions) if run["outputs"] else 0
    atomic_write_bytes(out / "questions.jsonl", _jsonl(question_records(run["outputs"])))
    if run["updates"]:
        atomic_write_bytes(out / "updates.jsonl", _jsonl(run["updates"]))
        atomic_write_bytes(out / "table3.csv", _csv(t3, ("setting", "bleu4", "rouge_l",
                                                         "hypotheses")))
    atomic_write_bytes(out / "systems.csv", _csv(rows, SYSTEMS_COLUMNS))
    atomic_write_bytes(out / "results.md", markdown(rows, t3, flip, n).encode("utf-8"))
    figures = {"systems": str(plot_systems(rows, flip, out / "systems.png"))}
    ablation = plot_ablation(rows, out / "ablation.png")
    if ablation is not None:
        figures["ablation"] = str(ablation)
    summary = {"flip_reading": flip, "situations": n,
               "gain_over": rows[0]["gain_over"] if rows else None, "systems": rows, "table3": t3,
               "figures": figures,
               "implementations": {
                   "bertscore": "clarifyjax.evaluation.bertscore" if cfg.bertscore.model else None,
                   "qa": "clarifyjax.evaluation.qa_metric" if cfg.informativeness.qa else None},
               "config": config_to_dict(cfg)}
    atomic_write_bytes(out / "results.json", (json.dumps(_json_safe(summary), indent=2,
                                                         ensure_ascii=False) + "\n").encode())
    return summary
