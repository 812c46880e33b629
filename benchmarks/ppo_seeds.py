"""The demo's PPO over several seeds from the same SFT models, in the reward's own units: the raw
dev reward's (JSD's) paired gain, the judgment flip rate and the questions' diversity, with 95%
intervals over the seeds. Runs `make demo`'s PPO config (plus KEY=VALUE overrides), evaluated on
128 dev situations x 4 sampled questions (`STUDY_EVAL`), all seeds with one reward normalizer
fitted on the SFT policy; a finished seed is kept, not rerun. Writes results/ppo_seeds.json, .png.

    python benchmarks/ppo_seeds.py --seeds 0 1 2 3 4 [ppo.kl_coef=0.3 ...] [--out F.json]
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
# The studies' dev evaluation: 4 sampled questions for each of 128 dev situations (the demo's is 8
# for each of 256), so that a study of 45 runs fits in a few hours on two cores.
STUDY_EVAL = ["data.dev_situations=128", "data.eval_batch_size=128", "ppo.eval_samples=4"]
# before and after PPO, per seed: the dev evaluation's metrics the study reports
DEV = {"raw": "reward_raw", "flip_rate": "flip_rate", "distinct_share": "distinct_share",
       "top_share": "top_question_share", "top5_share": "top5_share", "distinct_2": "distinct_2"}


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
    pick = {"reward_raw": "train/reward_raw", "kl": "train/kl_to_ref",
            "entropy": "train/policy_entropy", "kl_coef": "train/kl_coef"}
    out = {"step": [s for s, _ in train]}
    out.update({k: [r.get(v) for _, r in train] for k, v in pick.items()})
    return out


def one_seed(seed: int, models: Path, data: Path, plan: dict, out: Path, overrides) -> dict:
    """One PPO run and its dev evaluation before and after: the raw reward's paired gain (the
    same situations before and after) with its standard error, and the flip rate and question
    diversity before and after. Kept in OUT/row.json: a finished seed is read back, not rerun."""
    from clarifyjax import demo
    from clarifyjax.rl.diagnostics import paired_gain
    from clarifyjax.training import loops

    done = out / "row.json"
    if done.exists():
        row = json.loads(done.read_text())
        if row["overrides"] == list(overrides):
            return row
        raise SystemExit(f"{done}: made with overrides {row['overrides']}, not {list(overrides)}; "
                         "give another --work")
    cfg = demo.ppo_config(models, data, plan, [f"run.seed={seed}", f"run.output_dir={out}",
                                               *STUDY_EVAL, *overrides])
    t0 = time.time()
    result = loops.train_ppo(cfg, progress=False, tensorboard=False, export=False)
    before, after = result["first_eval_rows"], result["eval_rows"]
    gain, gain_se = paired_gain(before["raw"], after["raw"])
    row = {"seed": seed, "overrides": list(overrides), "seconds": round(time.time() - t0, 1),
           "gain": gain, "gain_se": gain_se,
           "normalizer": result["normalizer"].to_dict(),
           "before": {k: result["first_eval"].get(f"eval/{v}") for k, v in DEV.items()},
           "after": {k: result["eval"].get(f"eval/{v}") for k, v in DEV.items()},
           "top_questions_after": after["top"][:5], "curves": curves(out / "metrics.jsonl")}
    print(f"[ppo_seeds] seed {seed}: raw dev reward {row['before']['raw']:.4f} -> "
          f"{row['after']['raw']:.4f} (gain {gain:+.4f} +- {gain_se:.4f} SE); flip rate "
          f"{row['before']['flip_rate']:.3f} -> {row['after']['flip_rate']:.3f}; distinct "
          f"{row['before']['distinct_share']:.0%} -> {row['after']['distinct_share']:.0%}; top "
          f"question {row['after']['top_share']:.1%} {after['top'][0][0]!r} ({row['seconds']:.0f} s)",
          flush=True)
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps(row) + "\n")
    os.replace(tmp, done)
    return row


def shared_normalizer(work: Path, models: Path, data: Path, plan: dict) -> list[str]:
    """The normalizer overrides every run of a study uses: fitted once on the SFT policy, as the
    demo's seed 0 fits it (a one-step run), and kept in WORK/normalizer.json."""
    from clarifyjax import demo
    from clarifyjax.training import loops

    path = work / "normalizer.json"
    if not path.exists():
        cfg = demo.ppo_config(models, data, plan, [
            "run.seed=0", f"run.output_dir={work / 'normalizer_fit'}", "run.steps=1",
            "run.eval_every=0", "run.save_every=1", "run.sample_every=0"])
        result = loops.train_ppo(cfg, progress=False, tensorboard=False, export=False)
        work.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result["normalizer"].to_dict()) + "\n")
    return read_normalizer(work)


def read_normalizer(work: Path) -> list[str]:
    n = json.loads((work / "normalizer.json").read_text())
    # fit_batches back to its default: ppo_tiny.yaml sets it, and with fit false it is refused
    return ["normalizer.fit=false", "normalizer.fit_batches=8", f"normalizer.gain={n['gain']}",
            f"normalizer.bias={n['bias']}"]


def stat(values: list[float]) -> dict:
    """The mean and its 95% t interval over the seeds (None for one seed)."""
    from clarifyjax.rl.diagnostics import t_interval

    low, high = t_interval(values) if len(values) > 1 else (None, None)
    return {"mean": sum(values) / len(values), "ci95": [low, high]}


def summarize(rows: list[dict]) -> dict:
    """Over the seeds: the raw gain's mean and 95% t interval, and for each dev metric its mean
    after PPO and the mean change, with intervals; and whether the study meets the demo preset's
    bar (gain interval above 0, the most common question at most 5% and distinct questions within
    10% of the SFT policy's on every seed)."""
    out = {"seeds": [r["seed"] for r in rows], "gain": stat([r["gain"] for r in rows]),
           "gains": [r["gain"] for r in rows], "gain_ses": [r["gain_se"] for r in rows],
           "seconds": sum(r["seconds"] for r in rows)}
    for key in DEV:
        out[key] = {"before": stat([r["before"][key] for r in rows]),
                    "after": stat([r["after"][key] for r in rows]),
                    "change": stat([r["after"][key] - r["before"][key] for r in rows])}
    low = out["gain"]["ci95"][0]
    out["no_collapse"] = all(r["after"]["top_share"] <= 0.05 and r["after"]["distinct_share"]
                             >= 0.9 * r["before"]["distinct_share"] for r in rows)
    out["meets_bar"] = bool(low is not None and low > 0 and out["no_collapse"])
    return out


def plot(rows: list[dict], png: Path) -> Path:
    """Per seed: the rollouts' raw reward, the KL to the reference and the policy's entropy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=100)
    for row in rows:
        c = row["curves"]
        for ax, key in zip(axes, ("reward_raw", "kl", "entropy")):
            pts = [(s, v) for s, v in zip(c["step"], c[key]) if v is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", lw=1,
                    label=f"seed {row['seed']}: dev gain {row['gain']:+.4f} +- {row['gain_se']:.4f}")
    for ax, title in zip(axes, ("rollouts' raw reward (JSD)", "KL to the reference (nats/question)",
                                "policy entropy (nats/token)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(fig, png, "the demo's PPO, one line per seed (dev gain: paired, after - before)")


def save_figure(fig, png: Path, title: str) -> Path:
    """Title, lay out, write and close a study's figure."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def setup(models: Path, data_arg):
    """(data folder, the demo's plan) with the SFT models in `models` and a compile cache."""
    import jax

    from clarifyjax import demo

    jax.config.update("jax_compilation_cache_dir", str(models / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    data, _ = demo.find_data(data_arg)
    plan = demo._plan(data, False)  # noqa: SLF001  (the demo's own plan, as make demo runs it)
    models.mkdir(parents=True, exist_ok=True)
    ensure_sft_models(models, data, plan)
    return data, plan


def write_json(out: Path, payload: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**payload, "machine": machine_info()}, indent=1) + "\n")
    os.replace(tmp, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--models", type=Path, default=Path(__file__).resolve().parents[1] / "runs")
    p.add_argument("--data", type=Path, default=None)  # default ../shared/data, else examples/
    p.add_argument("--work", type=Path, default=None, help="PPO runs' folder (default MODELS/ppo_seeds)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "ppo_seeds.json")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="PPO config overrides")
    args = p.parse_args(argv)
    data, plan = setup(args.models, args.data)
    work = args.work or args.models / "ppo_seeds"
    overrides = [*shared_normalizer(work, args.models, data, plan), *args.overrides]
    rows = [one_seed(s, args.models, data, plan, work / f"seed{s}", overrides) for s in args.seeds]
    summary = summarize(rows)
    png = plot(rows, args.out.with_suffix(".png"))
    write_json(args.out, {"benchmark": "ppo_seeds", "overrides": overrides, "summary": summary,
                          "seeds": rows, "figure": png.name})
    g = summary["gain"]
    print(f"[ppo_seeds] raw dev reward gain {g['mean']:+.4f}, 95% interval {g['ci95']} over "
          f"{len(rows)} seeds; no collapse on every seed: {summary['no_collapse']}; "
          f"wrote {args.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
