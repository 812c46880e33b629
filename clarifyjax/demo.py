"""`python -m clarifyjax.demo` (what `make demo` runs): the whole system at tiny scale, on CPU.

It trains a SentencePiece tokenizer, fine-tunes the question generator, answerer, fusion model and
a judge (clarifyjax/presets/sft_*_tiny.yaml), runs PPO (clarifyjax/presets/ppo_tiny.yaml), shows questions before and
after with ``reward_curve.png``, writes ``models.yaml`` for `clarifyjax web`, and scores
sage_jax/examples/sage_demo.jsonl with SaGE. Runs go where the tiny configs put them under ``--out``
(default ``runs``) and resume from their checkpoints; ``--fresh``, ``--quick`` (smoke-sized) and
``--tokenizer-only`` change that. Data: ../shared/data/delta-clarify, else examples/delta-clarify."""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path
from collections.abc import Sequence
import dataclasses

from clarifyjax.files import presets
from clarifyjax.files.tables import REPO_ROOT, read_table
from clarifyjax.models.tiny import shared_data_dir, train_spm_model
from clarifyjax.data.pairs import SILVER_COLUMNS, read_pairs, silver_judge_rows, unique_situations
from clarifyjax.files.textfiles import atomic_write_bytes
from clarifyjax.text.tokenizer import Tokenizer
from clarifyjax.rl.diagnostics import paired_gain
from clarifyjax.text import formats
from clarifyjax.text.generator import Sampling
from sage_jax import cli

EXAMPLES = REPO_ROOT / "examples"
DATA_FILES = ("train.tsv", "dev.tsv", "sc_dev_questions_gpt.tsv", "fusion_dev.csv")
VOCAB = 1999  # + the "-1" piece: the 2,000 of the tiny configs' models
MODEL_VOCAB = 2000  # clarifyjax/presets/sft_question_tiny.yaml: model.tiny.vocab_size
# Delphi's target without "<" (absent from the vocabulary): trains the pieces of the prefix.
DELPHI_TARGET_PIECES = ("class>1/class> text>it's good/text>",
                        "class>0/class> text>it's okay/text>",
                        "class>-1/class> text>it's bad/text>")


DEMO_FOLDERS = ("tokenizer_tiny", "sft_question_tiny", "sft_answerer_tiny", "sft_fusion_tiny",
                "sft_judge_tiny", "sft_judge_tiny_data", "ppo_tiny", "sage_demo",
                "sft_wh_question_tiny", "evaluate_tiny")


def find_data(data_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(folder holding the four δ-CLARIFY files, "shared" | "examples" | "given").

    Falling back to the example files is the demo's choice alone (`main` prints it): training
    configs must name files that exist (`clarifyjax.files.tables.resolve_data_path`)."""
    if data_dir is not None:
        folder, kind = Path(data_dir), "given"
    else:
        folder, kind = shared_data_dir() / "delta-clarify", "shared"
        if not all((folder / f).is_file() for f in DATA_FILES):
            folder, kind = EXAMPLES / "delta-clarify", "examples"
    missing = [f for f in DATA_FILES if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: missing data file(s) {missing}")
    return folder, kind


# --------------------------------------------------------------------------- tokenizer


def corpus(data: Path, max_rows: int = 6000) -> list[str]:
    """Inputs and targets of the question, answerer and fusion tasks (a sample of each file)."""
    texts = []
    for name, task in (("train.tsv", "question"), ("sc_dev_questions_gpt.tsv", "answerer"),
                       ("fusion_dev.csv", "fusion")):
        for pair in read_pairs(data / name, task)[:max_rows]:
            texts += [pair.input, pair.target]
    return texts + list(DELPHI_TARGET_PIECES) * 30


def train_tokenizer(texts: Sequence[str], folder: Path, vocab_size: int = VOCAB) -> Path:
    """A SentencePiece unigram model trained on `texts` -> `folder` (spiece.model, plus the Hugging
    Face tokenizer.json made from it so that later loads are fast), checked for the judge."""
    from clarifyjax.reward import judge

    model = train_spm_model([t.replace("<", " ") for t in texts], vocab_size, num_threads=2,
                            hard_vocab_limit=False)  # the small example files give fewer pieces
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / stale).unlink(missing_ok=True)
    atomic_write_bytes(folder / "spiece.model", model)
    from transformers import T5TokenizerFast

    T5TokenizerFast.from_pretrained(str(folder), extra_ids=0).save_pretrained(str(folder))
    tok = Tokenizer.from_pretrained(folder)
    judge.class_token_ids(tok, "<class>", ("-1", "0", "1"), vocab_size=MODEL_VOCAB,
                          source=str(folder))  # raises if the judge could not read classes
    return folder


def derive_judge_file(silver: Path, path: Path) -> Path:
    """(text, class) TSV from the silver answers: the judge's training file."""
    table = silver_judge_rows(read_table(silver, SILVER_COLUMNS))
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow(["text", "class"])
    writer.writerows([r["text"], r["class"]] for r in table.rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, out.getvalue().encode("utf-8"))
    return path


# --------------------------------------------------------------------------- the runs


def _plan(data: Path, quick: bool) -> dict:
    """Steps and sizes: full on the shared data, smaller on small files (the examples), tiny
    with --quick."""
    with open(data / "train.tsv", encoding="utf-8") as f:
        small = sum(1 for _ in f) < 1000
    plan = {"batch": 8 if small else 32, "ppo_batch": 8 if small else 16, "dev_rows": 64,
            "dev_situations": 8 if small else 256, "eval_samples": 8,
            "evaluate_situations": 8 if small else 32,
            "steps": {"question": 300, "wh_question": 300, "answerer": 250, "fusion": 300,
                      "judge": 250},
            "ppo_steps": 40, "ppo_eval_every": 40}
    if small:
        plan["steps"] = {"question": 80, "wh_question": 80, "answerer": 80, "fusion": 80,
                         "judge": 80}
    if quick:
        plan.update(steps={k: 6 for k in plan["steps"]}, ppo_steps=3, ppo_eval_every=3,
                    dev_rows=16, dev_situations=min(plan["dev_situations"], 8), eval_samples=2,
                    evaluate_situations=8)
    return plan


def sft_config(task: str, out: Path, tokenizer: Path, data: Path, plan: dict, judge_file: Path):
    from clarifyjax.config import load_config

    steps = plan["steps"][task]
    lengths = {"question": (48, 32), "wh_question": (48, 32), "answerer": (64, 32),
               "fusion": (96, 48), "judge": (64, 32)}
    max_in, max_out = lengths[task]
    paths = {"question": [f"data.train_path={data / 'train.tsv'}",
                          f"data.dev_path={data / 'dev.tsv'}"],
             "wh_question": [f"data.train_path={data / 'train.tsv'}",
                             f"data.dev_path={data / 'dev.tsv'}"],
             "answerer": [f"data.train_path={data / 'sc_dev_questions_gpt.tsv'}"],
             "fusion": [f"data.train_path={data / 'fusion_dev.csv'}"],
             "judge": [f"data.train_path={judge_file}", "data.judge_source=table"]}[task]
    name = {"question": "sft_question_tiny", "wh_question": "sft_wh_question_tiny",
            "answerer": "sft_answerer_tiny",
            "fusion": "sft_fusion_tiny", "judge": "sft_judge_tiny"}[task]
    return load_config(presets.FOLDER / f"{name}.yaml", [
        f"run.output_dir={out / f'sft_{task}_tiny'}", f"run.steps={steps}",
        f"run.eval_every={steps}", f"run.save_every={steps}", "run.sample_every=0",
        f"run.log_every={max(1, steps // 10)}", f"model.tokenizer={tokenizer}",
        f"model.tiny.vocab_size={MODEL_VOCAB}", f"model.max_input_length={max_in}",
        f"model.max_target_length={max_out}", f"data.length_buckets=[{max_in}]",
        "data.train_rows=null", f"data.dev_rows={plan['dev_rows']}",
        f"data.batch_size={plan['batch']}", "data.eval_batch_size=32", "optimizer.lr=3e-3",
        "optimizer.schedule=constant", f"optimizer.warmup_steps={min(10, steps)}", *paths])


def ppo_config(out: Path, data: Path, plan: dict, extra: Sequence[str] = ()):
    """The demo's PPO config on the SFT models under `out`; `extra` KEY=VALUE items last."""
    from clarifyjax.config import load_config

    final = {t: str(out / f"sft_{t}_tiny" / "final")
             for t in ("question", "answerer", "fusion", "judge")}
    steps = plan["ppo_steps"]
    return load_config(presets.FOLDER / "ppo_tiny.yaml", [
        f"run.output_dir={out / 'ppo_tiny'}", f"run.steps={steps}", f"run.save_every={steps}",
        f"run.eval_every={plan['ppo_eval_every']}", f"run.sample_every={max(steps // 3, 1)}",
        "run.log_every=1", f"policy.init={final['question']}", "policy.tokenizer=null",
        "policy.max_input_length=48", f"rewards.answerer.init={final['answerer']}",
        "rewards.answerer.tokenizer=null", f"rewards.fusion.init={final['fusion']}",
        "rewards.fusion.tokenizer=null", f"rewards.judge.model.init={final['judge']}",
        "rewards.judge.model.tokenizer=null", f"data.train_path={data / 'train.tsv'}",
        f"data.dev_path={data / 'dev.tsv'}", f"data.dev_situations={plan['dev_situations']}",
        f"data.eval_batch_size={plan['dev_situations']}", "data.length_buckets=[48]",
        f"ppo.batch_size={plan['ppo_batch']}", "ppo.minibatches=2", "ppo.samples_per_situation=4",
        f"ppo.eval_samples={plan['eval_samples']}", "ppo.sampling.max_new_tokens=16", "optimizer.lr=2e-4",
        *extra])


def ppo_summary(result: dict) -> str:
    """What PPO did on the dev situations, in the reward's own units: the raw reward (the JSD,
    0 for a dropped answer) before and after with the paired gain and its standard error, the
    judgment flip rate, and the questions' diversity (distinct, the shares of the most common one
    and five, distinct-2), so that a gain bought by collapsing onto one question shows."""
    first, last = result.get("first_eval") or {}, result.get("eval") or {}
    before, after = result.get("first_eval_rows"), result.get("eval_rows")
    if not (first and last and before and after):
        return "no dev evaluation before and after (run.eval_every, data.dev_path)"
    gain, se = paired_gain(before["raw"], after["raw"])
    nan = float("nan")

    def change(key, fmt):
        return f"{format(first.get(key, nan), fmt)} -> {format(last.get(key, nan), fmt)}"

    return (f"dev raw reward (JSD) {change('eval/reward_raw', '.4f')}, paired gain {gain:+.4f} +- "
            f"{se:.4f} SE ({gain / se:+.1f} SE, {len(after['raw'])} situations); flip rate "
            f"{change('eval/flip_rate', '.3f')}; questions distinct {change('eval/distinct_share', '.0%')}, "
            f"most common {change('eval/top_question_share', '.1%')}, top five "
            f"{change('eval/top5_share', '.1%')}, distinct-2 {change('eval/distinct_2', '.3f')}")


def plot_rewards(metrics: Path, png: Path) -> Path:
    """reward_curve.png: the rollouts' mean normalized reward per PPO step and the dev reward
    (with its standard error), beside the KL to the reference, the policy's entropy and the dev
    questions' diversity at each evaluation, so that a run that drifts or collapses without gaining
    shows at a glance. Paths may be str (docs/usage.md calls it from the shell)."""
    metrics, png = Path(metrics), Path(png)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(metrics, encoding="utf-8")]
    train = sorted({r["step"]: r for r in rows if "train/mean_score" in r}.items())
    dev = sorted({r["step"]: r for r in rows if "eval/reward" in r}.items())
    steps = [s for s, _ in train]
    fig, (ax, ax_kl, ax_ent, ax_div) = plt.subplots(1, 4, figsize=(17, 4), dpi=100)
    _plot_rollout_rewards(ax, steps, [r["train/mean_score"] for _, r in train])
    if dev:
        ax.errorbar([s for s, _ in dev], [r["eval/reward"] for _, r in dev],
                    yerr=[r.get("eval/reward_se", 0.0) for _, r in dev], fmt="o--", capsize=3,
                    label="dev situations (+- standard error)")
    ax.set_ylabel("reward (normalized JSD)")
    ax.set_title("ClarifyDelphi demo: PPO reward", fontsize=10)
    ax.legend(fontsize=8)
    for axis, key, title in ((ax_kl, "train/kl_to_ref", "KL to the reference (nats per question)"),
                             (ax_ent, "train/policy_entropy", "policy entropy (nats per token)")):
        axis.plot(steps, [r.get(key, float("nan")) for _, r in train], ".-", color="C3")
        axis.set_title(title, fontsize=10)
    for key, label in (("eval/distinct_share", "distinct questions (share)"),
                       ("eval/top_question_share", "the most common question's share"),
                       ("eval/top5_share", "the five most common's share"),
                       ("eval/distinct_2", "distinct-2")):
        ax_div.plot([s for s, _ in dev], [r.get(key, float("nan")) for _, r in dev], "o-", label=label)
    ax_div.set_title("dev questions' diversity", fontsize=10)
    ax_div.set_ylim(0, 1)
    ax_div.legend(fontsize=7)
    for axis in (ax, ax_kl, ax_ent, ax_div):
        axis.set_xlabel("PPO step")
        axis.grid(alpha=0.3)
    fig.tight_layout()
    tmp = png.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, png)
    return png


def _plot_rollout_rewards(ax, steps, rewards) -> None:
    ax.plot(steps, rewards, ".-", alpha=0.35, label="rollouts (normalized reward)")
    if len(rewards) >= 5:  # the rollout batches are small: a running mean shows the trend
        window = 5
        mean = [sum(rewards[max(0, i - window + 1): i + 1])
                / len(rewards[max(0, i - window + 1): i + 1]) for i in range(len(rewards))]
        ax.plot(steps, mean, "-", color="C0", label=f"rollouts, running mean of {window}")


def show_samples(cfg, before: Path, after: Path, data: Path, n: int = 5) -> None:
    """Greedy questions of the SFT policy and of the PPO policy for dev situations, with what the
    answer generator, the fusion model and the judge make of them."""
    from clarifyjax.decoding.seq2seq import Seq2SeqModel
    from clarifyjax.training.loops import build_reward_fn

    situations = unique_situations(read_table(data / "dev.tsv",
                                              ("situation",)))[:n]
    reward = build_reward_fn(cfg)
    sampling = Sampling(max_new_tokens=cfg.ppo.sampling.max_new_tokens)
    for label, folder in (("SFT policy", before), ("PPO policy", after)):
        questions = Seq2SeqModel.from_pretrained(folder).generate(
            [formats.policy_input(s) for s in situations], sampling).texts
        out = reward(situations, questions)
        print(f"\n=== {label} ({folder}) ===")
        for i, (s, q) in enumerate(zip(situations, questions)):
            print(f"- {s}\n  Q: {q}   [JSD {float(out.raw_reward[i]):.3f}]")
            print(f"    weakener:     {out.weak_answers[i]!r} -> {out.weak_situations[i]!r}")
            print(f"    strengthener: {out.strong_answers[i]!r} -> {out.strong_situations[i]!r}")


def write_models_file(cfg, out: Path) -> Path:
    """OUT/models.yaml: the PPO policy (the question generator) and the run's reward models, the
    MODELS.yaml of `clarifyjax ask`, `interact` and `web`."""
    from clarifyjax.config import ModelsConfig, load_models_config
    from clarifyjax.config.loader import save_config

    policy = dataclasses.replace(cfg.policy, init=str(out / "ppo_tiny" / "final"))
    path = save_config(ModelsConfig(policy=policy, rewards=cfg.rewards), out / "models.yaml")
    load_models_config(path)  # what the commands will read
    return path
def evaluation_config(ppo_cfg, out: Path, data: Path, plan: dict):
    """`clarifyjax evaluate` of the demo's models: the PPO policy against the t5, pipeline and
    why baselines (the demo trains no NLI filter, discriminator or QA model, so pipeline-nli,
    discriminator and informativeness are left out), with the PPO run's reward models, BERTScore
    on all-MiniLM-L6-v2 when it is installed, and Table 3 on the silver answers."""
    from clarifyjax.config.loader import config_to_dict
    from clarifyjax.config.evaluate import eval_config_from_dict

    wh = str(out / "sft_wh_question_tiny" / "final")
    raw = {
        "out": str(out / "evaluate_tiny"),
        "data": {"situations_path": str(data / "dev.tsv"),
                 "situations": plan["evaluate_situations"], "batch_size": 16},
        "generation": {"sampling": {"max_new_tokens": 16}, "wh_starts": ["what", "how", "why", "is"]},
        "systems": [
            {"name": "ClarifyDelphi (PPO)", "kind": "ppo",
             "model": str(out / "ppo_tiny" / "final")},
            {"name": "t5 fine-tuned", "kind": "t5", "model": ppo_cfg.policy.init},
            {"name": "pipeline", "kind": "pipeline", "model": wh},
            {"name": "why", "kind": "why", "model": wh}],
        "rewards": config_to_dict(ppo_cfg.rewards),
        "table3": {"path": str(data / "sc_dev_questions_gpt.tsv"), "groups": 16,
                   "answerer": ppo_cfg.rewards.answerer.init}}
    try:
        from clarifyjax.models.embedder import default_embedder_path

        raw["bertscore"] = {"model": str(default_embedder_path()), "layer": 6}
    except Exception:  # noqa: BLE001  (the metric is optional here; the table says "-")
        pass
    return eval_config_from_dict(raw, source="the demo")


def run_evaluation(ppo_cfg, out: Path, data: Path, plan: dict) -> dict:
    from clarifyjax.evaluation.evaluate import evaluate

    cfg = evaluation_config(ppo_cfg, out, data, plan)
    print("\n=== clarifyjax evaluate: the PPO policy against the baselines ===", flush=True)
    summary = evaluate(cfg, say=lambda line: print(line, flush=True))
    print((Path(cfg.out) / "results.md").read_text(encoding="utf-8"), flush=True)
    return summary


def run_sage(out: Path) -> int:
    args = ["score", str(cli.EXAMPLE), "--out", str(out / "sage_demo"),
            "--quiet", "--overwrite"]  # a second demo run replaces the first one's scores
    print(f"\n=== SaGE: sage-jax {' '.join(args)} ===", flush=True)
    return cli.main(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clarifyjax.demo", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs")
    parser.add_argument("--data", type=Path, default=None,
                        help="folder with the four δ-CLARIFY files (default: the shared data, "
                             "else examples/delta-clarify)")
    parser.add_argument("--quick", action="store_true", help="smoke-sized steps (for tests)")
    parser.add_argument("--fresh", action="store_true", help="delete the demo's folders first")
    parser.add_argument("--no-sage", action="store_true", help="skip the SaGE part")
    parser.add_argument("--progress", action="store_true", help="progress bars")
    parser.add_argument("--tokenizer-only", action="store_true",
                        help="make OUT/tokenizer_tiny (the tiny configs' tokenizer) and stop")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    start = time.time()
    out = args.out.resolve()
    if args.fresh:
        for name in DEMO_FOLDERS:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import jax

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # else the caller's cache, its settings
        jax.config.update("jax_compilation_cache_dir", str(out / ".jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    from clarifyjax.training import loops

    data, kind = find_data(args.data)
    if kind == "examples":
        print(f"[demo] no δ-CLARIFY files in {shared_data_dir() / 'delta-clarify'}: using the "
              f"project's small example files in {data} instead (smaller runs)", flush=True)
    plan = _plan(data, args.quick)
    print(f"[demo] data: {data} ({kind}); output: {out}; {jax.device_count()} "
          f"{jax.default_backend()} device(s)", flush=True)

    tokenizer = out / "tokenizer_tiny"
    if not (tokenizer / "tokenizer.json").exists():
        train_tokenizer(corpus(data), tokenizer)
    print(f"[demo] tokenizer: {tokenizer} ({time.time() - start:.0f} s)", flush=True)
    if args.tokenizer_only:
        return 0
    judge_file = derive_judge_file(data / "sc_dev_questions_gpt.tsv",
                                   out / "sft_judge_tiny_data" / "judge.tsv")

    for task in ("question", "wh_question", "answerer", "fusion", "judge"):
        cfg = sft_config(task, out, tokenizer, data, plan, judge_file)
        result = loops.train_sft(cfg, progress=args.progress)
        ev = result.get("eval") or {}
        print(f"[demo] SFT {task}: dev loss {ev.get('eval/loss', float('nan')):.3f}, token "
              f"accuracy {ev.get('eval/accuracy', float('nan')):.3f}, ROUGE-L "
              f"{ev.get('eval/rouge_l', float('nan')):.1f} ({time.time() - start:.0f} s)",
              flush=True)

    cfg = ppo_config(out, data, plan)
    result = loops.train_ppo(cfg, progress=args.progress)
    print(f"[demo] PPO: {ppo_summary(result)} ({time.time() - start:.0f} s)", flush=True)
    ppo_dir = out / "ppo_tiny"
    png = plot_rewards(ppo_dir / "metrics.jsonl", ppo_dir / "reward_curve.png")
    print("\n(tiny models trained for minutes on a CPU: expect broken English; the point is the "
          "machinery, which is the same for T5-large on a pod)")
    show_samples(cfg, out / "sft_question_tiny" / "final", out / "ppo_tiny" / "final", data)
    print(f"\n[demo] reward curve: {png}", flush=True)
    models = write_models_file(cfg, out)
    print(f"[demo] ClarifyDelphi on these models, as a web page at http://127.0.0.1:8000/:\n"
          f"    clarifyjax web {models} --port 8000\n"
          f"  in the terminal: clarifyjax interact {models}\n"
          f"  for a file: clarifyjax ask {models} --situations FILE --out OUT.jsonl",
          flush=True)
    run_evaluation(cfg, out, data, plan)

    status = 0 if args.no_sage else run_sage(out)
    print(f"[demo] done in {time.time() - start:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
