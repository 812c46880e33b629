"""PPO, RLOO and GRPO (``ppo.algorithm``) on the demo's reward models, for a T5 policy (the demo's
SFT question model) and a decoder-only one (a tiny random Llama, plain prompt), each over the same
seeds: the raw dev reward's paired gain, the flip rate and the questions' diversity with 95%
intervals over the seeds (ppo_seeds.py's statistics), and the wall time per step. Each policy's
runs share one reward normalizer. Writes results/rl_algorithms.json, .md and .png; kept runs are
read back, not rerun.      python benchmarks/rl_algorithms.py --seeds 0 1 2 3 4 [--arms t5_rloo ...]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo_seeds  # noqa: E402
from ppo_ablation import fmt, summary_cells  # noqa: E402
from ppo_seeds import stat  # noqa: E402
from _common import RESULTS_DIR  # noqa: E402

ALGORITHMS = ("ppo", "rloo", "grpo")
POLICIES = {
    "t5": "the demo's SFT T5 question model",
    "llama": "a random tiny Llama (d_model 64, 2 layers, byte-level BPE of 1000), plain prompt",
}
ARMS = {f"{p}_{a}": (p, a) for p in POLICIES for a in ALGORITHMS}


def llama_folder(models: Path) -> Path:
    """The study's decoder-only policy: a random tiny Llama folder (made once, under MODELS)."""
    from clarifyjax.models.tiny import tiny_corpus, tiny_llama_folder

    return tiny_llama_folder(models / "llama_policy", seed=0, chat_template=None,
                             tokenizer={"vocab_size": 1000, "texts": tiny_corpus(3000)},
                             hidden_size=64, intermediate_size=128, max_position_embeddings=512)


def policy_overrides(policy: str, models: Path) -> list[str]:
    if policy == "t5":
        return []
    return [f"policy.init={llama_folder(models)}", "policy.tokenizer=null",
            "policy.prompt_format=plain", "policy.max_input_length=96", "data.length_buckets=[96]"]


def normalizer(work: Path, models: Path, data: Path, plan: dict, overrides: list[str]) -> list[str]:
    """ppo_seeds.shared_normalizer for one policy: fitted once on its initial questions."""
    from clarifyjax import demo
    from clarifyjax.training import loops

    if not (work / "normalizer.json").exists():
        cfg = demo.ppo_config(models, data, plan, [
            "run.seed=0", f"run.output_dir={work / 'normalizer_fit'}", "run.steps=1",
            "run.eval_every=0", "run.save_every=1", "run.sample_every=0", *overrides])
        result = loops.train_ppo(cfg, progress=False, tensorboard=False, export=False)
        work.mkdir(parents=True, exist_ok=True)
        (work / "normalizer.json").write_text(json.dumps(result["normalizer"].to_dict()) + "\n")
    return ppo_seeds.read_normalizer(work)


def step_seconds(run: Path) -> float:
    """The median wall time of one training step (sample + reward + record + update), first step
    left out (it compiles); runs logged before recording existed have no "time/record"."""
    rows = [json.loads(line) for line in open(run / "metrics.jsonl", encoding="utf-8")]
    steps = {r["step"]: r for r in rows if "time/update" in r}
    times = [sum(r.get(k, 0.0) for k in ("time/sample", "time/reward", "time/record", "time/update"))
             for s, r in sorted(steps.items()) if s > 1]
    return statistics.median(times)


def table(results: dict) -> str:
    """One row per arm, each figure its mean over the seeds [95% interval]."""
    lines = ["| policy | algorithm | seeds | raw dev gain (JSD) | flip rate change | distinct "
             "questions after (before) | most common after | distinct-2 after | s / step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results.values():
        s = r["summary"]
        lines.append(
            f"| {r['policy']} | {r['algorithm']} | {summary_cells(s)} | "
            f"{fmt(s['distinct_2']['after'], '.3f')} | {fmt(r['step_seconds'], '.2f')} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, png: Path) -> Path:
    """Per arm: the raw gain with its interval, and the most common question's share after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), dpi=100)
    names = list(results)
    for ax, key, label in ((axes[0], "gain", "raw dev reward gain (JSD)"),
                           (axes[1], "top_share", "most common question's share after"),
                           (axes[2], "step_seconds", "seconds per step")):
        for i, name in enumerate(names):
            r = results[name]
            stat = r["summary"][key]["after"] if key == "top_share" else (
                r["step_seconds"] if key == "step_seconds" else r["summary"][key])
            low, high = stat["ci95"]
            err = None if low is None else [[stat["mean"] - low], [high - stat["mean"]]]
            ax.errorbar([i], [stat["mean"]], yerr=err, fmt="o", capsize=4,
                        color=f"C{ALGORITHMS.index(r['algorithm'])}")
        ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].axhline(0, color="grey", lw=0.8)
    return ppo_seeds.save_figure(fig, png, "PPO, RLOO and GRPO on the demo's reward models: 95% "
                                 "intervals over seeds")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--models", type=Path, default=Path(__file__).resolve().parents[1] / "runs")
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--work", type=Path, default=None, help="runs' folder (default MODELS/rl_algorithms)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "rl_algorithms.json")
    args = p.parse_args(argv)
    data, plan = ppo_seeds.setup(args.models, args.data)
    work = args.work or args.models / "rl_algorithms"
    results = {}
    for name in args.arms:
        policy, algorithm = ARMS[name]
        given = policy_overrides(policy, args.models)
        shared = normalizer(work / policy, args.models, data, plan, given)
        overrides = [*shared, *given, f"ppo.algorithm={algorithm}"]
        rows = [ppo_seeds.one_seed(s, args.models, data, plan, work / name / f"seed{s}", overrides)
                for s in args.seeds]
        results[name] = {"policy": policy, "algorithm": algorithm, "overrides": overrides,
                         "summary": ppo_seeds.summarize(rows),
                         "step_seconds": stat([step_seconds(work / name / f"seed{s}") for s in args.seeds]),
                         "seeds": [{k: v for k, v in r.items() if k != "curves"} for r in rows]}
        print(f"[rl_algorithms] {name}: raw gain {fmt(results[name]['summary']['gain'], '+.4f')}", flush=True)
    md = table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(md)
    png = plot(results, args.out.with_suffix(".png"))
    ppo_seeds.write_json(args.out, {"benchmark": "rl_algorithms", "policies": POLICIES,
                                    "arms": results, "figure": png.name})
    print(md + f"[rl_algorithms] wrote {args.out}, its .md and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
