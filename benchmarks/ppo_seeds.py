"""The demo's PPO over several seeds, from the same SFT models: does PPO raise the dev reward by
more than its noise, on every seed?

Each seed runs `make demo`'s PPO config (plus KEY=VALUE overrides) from the SFT models in --models
(default runs/; missing ones are trained first). Writes benchmarks/results/ppo_seeds.json and .png.

    python benchmarks/ppo_seeds.py                       # 5 seeds, the demo's settings
    python benchmarks/ppo_seeds.py --seeds 0 1 ppo.kl_coef=0.3 --out /tmp/kl03.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, machine_info  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TASKS = ("question", "answerer", "fusion", "judge")


def ensure_sft_models(models: Path, data: Path, plan: dict) -> None:
    """Train the demo's SFT models that `models` lacks, with the demo's settings."""
    from clarifyjax import demo
    from clarifyjax.training import loops

    tokenizer = models / "tokenizer_tiny"
    if not (tokenizer / "tokenizer.json").exists():
        demo.train_tokenizer(demo.corpus(data), tokenizer)
    judge_file = demo.derive_judge_file(data / "sc_dev_questions_gpt.tsv",
                                        models / "sft_judge_tiny_data" / "judge.tsv")
    for task in TASKS:
        if not (models / f"sft_{task}_tiny" / "final" / "model.safetensors").exists():
            print(f"[ppo_seeds] training the demo's SFT {task} model into {models}", flush=True)
            loops.train_sft(demo.sft_config(task, models, tokenizer, data, plan, judge_file),
                            progress=False, tensorboard=False)


def curves(metrics_path: Path) -> dict[str, list]:
    rows = [json.loads(line) for line in open(metrics_path, encoding="utf-8")]
    train = sorted({r["step"]: r for r in rows if "train/mean_score" in r}.items())
    pick = {"reward": "train/mean_score", "reward_raw": "train/reward_raw", "kl": "train/kl_to_ref",
            "entropy": "train/policy_entropy", "approx_kl": "train/approx_kl_k3",
            "explained_variance": "train/explained_variance"}
    out = {"step": [s for s, _ in train]}
    out.update({k: [r.get(v) for _, r in train] for k, v in pick.items()})
    return out


def one_seed(seed: int, models: Path, data: Path, plan: dict, out: Path, overrides) -> dict:
    """One PPO run and its dev evaluation before and after: the normalized reward with its
    standard error over the dev situations, the paired gain (the same situations before and
    after) with its standard error, JSD, judgment flip rate, KL to the reference, question length,
    distinct questions and the share of the most common question."""
    from clarifyjax import demo
    from clarifyjax.rl.diagnostics import paired_gain
    from clarifyjax.training import loops

    cfg = demo.ppo_config(models, data, plan, [f"run.seed={seed}", f"run.output_dir={out}",
                                               *overrides])
    t0 = time.time()
    result = loops.train_ppo(cfg, progress=False, tensorboard=False, export=False)
    first, last = result["first_eval"], result["eval"]
    before, after = result["first_eval_rows"], result["eval_rows"]
    gain, gain_se = paired_gain(before["reward"], after["reward"])
    jsd_gain, jsd_se = paired_gain(before["jsd"], after["jsd"]) if "jsd" in before else (None, None)
    hist = curves(out / "metrics.jsonl")
    tail = [k for k in hist["kl"][-5:] if k is not None]
    row = {"seed": seed, "seconds": round(time.time() - t0, 1), "gain": gain, "gain_se": gain_se,
           "gain_over_se": gain / gain_se if gain_se else None,
           "jsd_gain": jsd_gain, "jsd_gain_se": jsd_se,
           "kl_to_ref_last5": float(sum(tail) / len(tail)) if tail else None,
           "top_questions_after": after["top"][:5], "curves": hist}
    for name, ev in (("before", first), ("after", last)):
        row[name] = {k.split("/", 1)[1]: v for k, v in ev.items()}
    print(f"[ppo_seeds] seed {seed}: dev reward {row['before']['reward']:.3f} -> "
          f"{row['after']['reward']:.3f} (gain {gain:+.3f} +- {gain_se:.3f} SE, "
          f"{row['gain_over_se']:+.1f} SE), JSD {row['before'].get('jsd', float('nan')):.4f} -> "
          f"{row['after'].get('jsd', float('nan')):.4f}, KL {row['kl_to_ref_last5']:.2f}, "
          f"top question {row['after']['top_question_share']:.0%} {after['top'][0][0]!r} "
          f"({row['seconds']:.0f} s)", flush=True)
    return row


def plot(rows: list[dict], png: Path) -> Path:
    """One reward curve per seed, with the KL to the reference and the policy's entropy, so that
    a run that drifts without gaining shows at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=100)
    for row in rows:
        c = row["curves"]
        for ax, key in zip(axes, ("reward", "kl", "entropy")):
            pts = [(s, v) for s, v in zip(c["step"], c[key]) if v is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", lw=1,
                    label=f"seed {row['seed']}: gain {row['gain']:+.2f} ({row['gain_over_se']:+.1f} SE)")
    for ax, title in zip(axes, ("rollouts' normalized reward", "KL to the reference (nats/question)",
                                "policy entropy (nats/token)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("the demo's PPO, one line per seed (dev gain: paired, after - before)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--models", type=Path, default=Path(__file__).resolve().parents[1] / "runs")
    p.add_argument("--data", type=Path, default=None)  # default ../shared/data, else examples/
    p.add_argument("--work", type=Path, default=None, help="PPO runs' folder (default MODELS/ppo_seeds)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "ppo_seeds.json")
    p.add_argument("--merge", type=Path, nargs="+", default=None,
                   help="combine the seeds of earlier runs' JSON files (run in parallel) into --out")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="PPO config overrides")
    args = p.parse_args(argv)
    if args.merge:
        runs = [json.loads(f.read_text()) for f in args.merge]
        if len({json.dumps(r["summary"]["overrides"]) for r in runs}) != 1:
            raise SystemExit("--merge: the runs used different overrides")
        return report([row for r in runs for row in r["seeds"]], runs[0]["summary"]["overrides"],
                      args.out)
    import jax

    from clarifyjax import demo

    jax.config.update("jax_compilation_cache_dir", str(args.models / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    data, _ = demo.find_data(args.data)
    plan = demo._plan(data, False)  # noqa: SLF001  (the demo's own plan, as make demo runs it)
    args.models.mkdir(parents=True, exist_ok=True)
    ensure_sft_models(args.models, data, plan)
    work = args.work or args.models / "ppo_seeds"
    rows = [one_seed(s, args.models, data, plan, work / f"seed{s}", args.overrides) for s in args.seeds]
    return report(rows, args.overrides, args.out)


def report(rows: list[dict], overrides, out: Path) -> int:
    """The summary over the seeds (mean gain, its 95% t interval), the JSON and the figure."""
    from clarifyjax.rl.diagnostics import t_interval

    gains = [r["gain"] for r in rows]
    low, high = t_interval(gains) if len(gains) > 1 else (None, None)
    summary = {"seeds": [r["seed"] for r in rows], "overrides": list(overrides), "gains": gains,
               "mean_gain": sum(gains) / len(gains), "gain_95ci": [low, high],
               "every_seed_gains": all(g > 0 for g in gains),
               "every_seed_over_3se": all((r["gain_over_se"] or 0) >= 3 for r in rows)}
    png = plot(rows, out.with_suffix(".png"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"benchmark": "ppo_seeds", "machine": machine_info(), "summary": summary,
                               "seeds": rows, "figure": png.name}, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"[ppo_seeds] mean gain {summary['mean_gain']:+.3f}, 95% interval "
          f"[{low if low is None else round(low, 3)}, {high if high is None else round(high, 3)}]; "
          f"every seed gains: {summary['every_seed_gains']}; wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
