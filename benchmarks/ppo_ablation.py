"""What makes the demo's PPO learn, and what it costs in diversity: each arm changes one setting of
`make demo`'s PPO and runs it over the same seeds, models and reward normalizer (ppo_seeds.py),
reporting the raw dev reward's gain, the flip rate and the questions' diversity with 95% intervals
over the seeds. Writes results/ppo_ablation.json, .md (the table in docs/ppo.md) and .png (gain
against diversity per arm). Finished runs are kept, not rerun.

    python benchmarks/ppo_ablation.py --seeds 0 1 2 --arms demo kl_0.5 entropy_0.05
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo_seeds  # noqa: E402
from _common import RESULTS_DIR  # noqa: E402

# arm -> (what it changes from the demo's settings, the overrides)
ARMS = {
    "demo": ("the demo: group baseline, value head 0, lr 2e-4, fixed KL 0.15", []),
    "no_group_baseline": ("one question per situation, paid its own reward",
                          ["ppo.samples_per_situation=1"]),
    "value_head_torch": ("the value head initialized as the original's (torch default)",
                         ["value.head_init=torch"]),
    "lr_1e-4": ("learning rate 1e-4", ["optimizer.lr=1e-4"]),
    "entropy_0.01": ("entropy bonus 0.01", ["ppo.entropy_coef=0.01"]),
    "entropy_0.05": ("entropy bonus 0.05", ["ppo.entropy_coef=0.05"]),
    "adaptive_kl": ("adaptive KL, target 2 nats per question, horizon 320",
                    ["ppo.adaptive_kl=true", "ppo.kl_target=2.0", "ppo.kl_horizon=320"]),
    "kl_0.5": ("fixed KL 0.5", ["ppo.kl_coef=0.5"]),
    "kl_1.0": ("fixed KL 1.0", ["ppo.kl_coef=1.0"]),
    "sample_t1": ("questions sampled from the policy itself (temperature 1, no top-p)",
                  ["ppo.sampling.temperature=1.0", "ppo.sampling.top_p=1.0"]),
    "no_top_p": ("temperature 0.7 without top-p", ["ppo.sampling.top_p=1.0"]),
    "on_policy_t07": ("temperature 0.7 without top-p, log-probs at 0.7 (ppo.logprobs: sampling)",
                      ["ppo.sampling.top_p=1.0", "ppo.logprobs=sampling"]),
}


def fmt(stat: dict, spec: str) -> str:
    low, high = stat["ci95"]
    if low is None:
        return format(stat["mean"], spec)
    return f"{format(stat['mean'], spec)} [{format(low, spec)}, {format(high, spec)}]"


def table(results: dict) -> str:
    """The markdown table: one row per arm, each figure its mean over the seeds [95% interval]."""
    lines = ["| arm | seeds | raw gain (JSD) | flip rate change | distinct questions after "
             "(SFT: before) | most common after | top five after | distinct-2 after | minutes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        s = r["summary"]
        lines.append(
            f"| {name}: {r['what']} | {summary_cells(s)} | "
            f"{fmt(s['top5_share']['after'], '.3f')} | {fmt(s['distinct_2']['after'], '.3f')} | "
            f"{s['seconds'] / 60:.0f} |")
    return "\n".join(lines) + "\n"


def summary_cells(s: dict) -> str:
    """The table cells a study of seeds shares (`ppo_seeds.summarize`'s summary `s`): seeds, raw
    gain, flip rate change, distinct share after (before), the most common question's share."""
    return (f"{len(s['seeds'])} | {fmt(s['gain'], '+.4f')} | "
            f"{fmt(s['flip_rate']['change'], '+.3f')} | {fmt(s['distinct_share']['after'], '.2f')} "
            f"({s['distinct_share']['before']['mean']:.2f}) | {fmt(s['top_share']['after'], '.3f')}")


def plot(results: dict, png: Path) -> Path:
    """Gain against diversity after PPO: one point per arm with its intervals on both axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    for ax, key, label in ((axes[0], "distinct_share", "distinct questions after PPO (share)"),
                           (axes[1], "top_share", "the most common question's share after PPO")):
        for i, (name, r) in enumerate(results.items()):
            s = r["summary"]
            x, y = s[key]["after"], s["gain"]
            xerr = [[x["mean"] - (x["ci95"][0] or x["mean"])], [(x["ci95"][1] or x["mean"]) - x["mean"]]]
            yerr = [[y["mean"] - (y["ci95"][0] or y["mean"])], [(y["ci95"][1] or y["mean"]) - y["mean"]]]
            ax.errorbar([x["mean"]], [y["mean"]], xerr=xerr, yerr=yerr, fmt="osD^v<>"[i % 7],
                        capsize=3, label=f"{name} ({len(s['seeds'])} seeds)")
        sft = next(iter(results.values()))["summary"][key]["before"]["mean"]
        ax.axvline(sft, color="grey", ls=":", label="the SFT policy")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("raw dev reward gain (JSD), 95% interval over seeds")
        ax.grid(alpha=0.3)
        # two-seed intervals (t quantile 12.7) run far off the figure: the axes show the data
        ax.set_xlim(0, 1.05 if key == "distinct_share" else 0.4)
        ax.set_ylim(-0.045, 0.045)
    axes[1].axvline(0.05, color="C3", ls="--", label="5%")
    axes[0].legend(fontsize=7)
    return ppo_seeds.save_figure(fig, png, "the demo's PPO: what each setting gains and what it "
                                 "costs in diversity")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--models", type=Path, default=Path(__file__).resolve().parents[1] / "runs")
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--work", type=Path, default=None, help="runs' folder (default MODELS/ppo_ablation)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "ppo_ablation.json")
    p.add_argument("--finished", action="store_true",
                   help="run nothing: the table of the runs already finished, each arm's seeds")
    args = p.parse_args(argv)
    if args.finished:
        work = args.work or args.models / "ppo_ablation"
        found = {name: sorted(int(f.parent.name[4:]) for f in (work / name).glob("seed*/row.json"))
                 for name in args.arms}
        args.arms = [name for name in args.arms if found[name]]
        return report(args, work, found, ppo_seeds.read_normalizer(work))
    data, plan = ppo_seeds.setup(args.models, args.data)
    work = args.work or args.models / "ppo_ablation"
    shared = ppo_seeds.shared_normalizer(work, args.models, data, plan)
    return report(args, work, {name: args.seeds for name in args.arms}, shared, (data, plan))


def report(args, work: Path, seeds: dict, shared: list[str], run=None) -> int:
    """Each arm over its seeds (run when `run` = (data, plan) is given, else read back), then the
    table, the JSON and the figure."""
    results = {}
    for name in args.arms:
        what, overrides = ARMS[name]
        rows = [ppo_seeds.one_seed(s, args.models, *(run or (None, None)), work / name / f"seed{s}",
                                   [*shared, *overrides]) for s in seeds[name]]
        results[name] = {"what": what, "overrides": overrides, "summary": ppo_seeds.summarize(rows),
                         "seeds": [{k: v for k, v in r.items() if k != "curves"} for r in rows]}
        g = results[name]["summary"]["gain"]
        print(f"[ppo_ablation] {name}: raw gain {fmt(g, '+.4f')}", flush=True)
    md = table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(md)
    png = plot(results, args.out.with_suffix(".png"))
    ppo_seeds.write_json(args.out, {"benchmark": "ppo_ablation", "normalizer": shared,
                                    "arms": results, "figure": png.name})
    print(md + f"[ppo_ablation] wrote {args.out}, its .md and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
