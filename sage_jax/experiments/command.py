"""`sage-jax experiment CONFIG [key=value ...]`: one of the SaGE paper's experiments from its config
(`sage_jax.experiments.config`), into `out/` (the files are listed above `run_experiment`). Bad
input is one line naming the key or file, before any model is loaded: the config, the questions
file and every generator, the benchmark and label files."""
from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence

from clarifyjax.config.loader import ConfigError, dump_config, parse_overrides
from clarifyjax.files.textfiles import atomic_write_bytes, check_output_folder
from sage_jax.experiments import consistency, validity
from sage_jax.experiments.config import ExperimentConfig, load_experiment_config
from clarifyjax.files.tables import resolve_data_path
from sage_jax.run import pipeline

RUNNERS = {"models": consistency.models_experiment, "temperature": consistency.temperature_experiment,
           "rot_prompt": consistency.rot_prompt_experiment, "accuracy": validity.accuracy_experiment,
           "agreement": validity.agreement_experiment}
TABLES = {"models": "table1", "temperature": "temperature", "rot_prompt": "table4", "accuracy": "table3",
          "agreement": "table2"}
FIGURES = {**TABLES, "accuracy": "figure4"}
RUNS = {"models": consistency.models_runs, "temperature": consistency.temperature_runs,
        "rot_prompt": consistency.rot_prompt_runs, "accuracy": validity.accuracy_runs,
        "agreement": validity.agreement_runs}


def generators_of(cfg: ExperimentConfig) -> list[tuple[str, object]]:
    """(key as the experiment's config names it, generator config) of every generator its runs use."""
    found = [("run.rot.generator", cfg.run.rot.generator)]
    if cfg.run.paraphrase.source == "generate":
        found.append(("run.paraphrase.generator", cfg.run.paraphrase.generator))
    if cfg.kind == "temperature":
        return found + [("temperature.model.generator", t.generator) for t in consistency.temperature_targets(cfg)]
    return found + [(f"models[{i}].generator", m.generator) for i, m in enumerate(cfg.models)]


def check_experiment_inputs(cfg: ExperimentConfig) -> None:
    """The folder, the generators and the files the experiment reads itself, before any work (the
    runs check the rest of their own before they start, naming the experiment's keys)."""
    check_output_folder(cfg.out, option="out", error=ConfigError)
    if cfg.kind != "accuracy" or cfg.run.questions.strip():
        resolve_data_path(cfg.run.questions, "run.questions")
    for key, generator in generators_of(cfg):
        pipeline.check_generator(generator, key)
    for i, b in enumerate(cfg.benchmarks):
        resolve_data_path(b.file, f"benchmarks[{i}].file")
        if b.fewshot_file:
            resolve_data_path(b.fewshot_file, f"benchmarks[{i}].fewshot_file")
        validity.benchmark_docs(b)  # every row read: a bad one is named before any model loads
    if cfg.kind == "agreement":
        validity.check_labels(cfg)
    if cfg.kind == "temperature":
        consistency.check_recorded_repeats(cfg)


# Into `out/`: config.yaml (the config as run); runs/<name>/ (each `sage-jax run` of the experiment,
# resumable); table1 | temperature | table3 | table2 | table4 .md / .json (the table and its
# numbers); <same name>.png and .series.json (the figure and the data it draws; figure4 for accuracy).
# Every run of the experiment is checked (`consistency.checked_run`: its inputs, and what its folder
# holds of an earlier start, an error naming the experiment's key) before anything is written, so a
# refused rerun changes nothing.
def run_experiment(cfg: ExperimentConfig, **given) -> dict:
    """Run one experiment; `given` (embedder, generators) goes to every `sage_jax.run.pipeline.Run`."""
    check_experiment_inputs(cfg)
    out = Path(cfg.out)
    renames = consistency.run_renames(cfg)
    runs = {name: consistency.checked_run(run_cfg, questions, renames=renames, **given)
            for name, (run_cfg, questions) in RUNS[cfg.kind](cfg, out).items()}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "config.yaml", dump_config(cfg).encode())
    return RUNNERS[cfg.kind](cfg, out, runs)


def main(config: Path, overrides: Sequence[str]) -> int:
    """The command: the table printed, and where the files are."""
    cfg = load_experiment_config(config, parse_overrides(overrides))
    run_experiment(cfg)
    out = Path(cfg.out)
    print((out / f"{TABLES[cfg.kind]}.md").read_text().rstrip())
    print(f"\nwrote {out / (TABLES[cfg.kind] + '.md')}, .json and {out / (FIGURES[cfg.kind] + '.png')}")
    return 0
