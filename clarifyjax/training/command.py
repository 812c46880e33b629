"""`clarifyjax train CONFIG [KEY=VALUE ...] [--dry-run]`: SFT or PPO from a YAML config."""
from __future__ import annotations

import argparse

from clarifyjax.core.commands import CLIError, subcommand
from clarifyjax.files.presets import add_data_dir_option, config_type




def _train_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=config_type(),
                   help="YAML run config, a file or a preset's name (`clarifyjax presets`): kind sft "
                        "(sft_*) or ppo (ppo_*)")
    # default=[]: without a default argparse counts a "*" positional as required in its messages
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                   help="config overrides, e.g. run.steps=20 ppo.batch_size=8 (an unknown key is an "
                        "error)")
    p.add_argument("--dry-run", action="store_true",
                   help="check every input the run would read (data files, model folders, "
                        "tokenizers), build the abstract state (jax.eval_shape: nothing "
                        "allocated), print every parameter's sharding and the bytes per device, "
                        "compile one step without running it; options dryrun.compile=ppo|sft|none, "
                        "dryrun.num_layers=N, dryrun.rows=N, dryrun.check_models=false (model "
                        "folders not there yet)")
    add_data_dir_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-tensorboard", action="store_true", help="metrics.jsonl only")


@subcommand("train", "fine-tune (kind: sft) or PPO-train (kind: ppo) a model from a YAML config; "
            "resumes from the run's newest checkpoint", _train_options)
def run_train(args: argparse.Namespace) -> int:
    from clarifyjax.config import ConfigError, load_config, parse_overrides
    from clarifyjax.config.loader import read_yaml

    # The file itself (missing, a directory, not UTF-8, YAML syntax with its line) fails here,
    # before JAX starts; a dry run's own `dryrun.*` overrides are checked by dryrun.main.
    read_yaml(args.config)
    parse_overrides(args.overrides)
    if args.dry_run:
        from clarifyjax.core import distributed  # before any other JAX call

        distributed.initialize()
        from clarifyjax.training import dryrun

        try:
            dryrun.main(str(args.config), list(args.overrides),
                        say=print if distributed.is_primary() else (lambda _: None))
        except (ConfigError, ValueError) as e:
            raise CLIError(str(e)) from e
        return 0

    try:
        cfg = load_config(args.config, parse_overrides(args.overrides))  # fails fast: no JAX call
        from clarifyjax.core import distributed  # before any other JAX call

        distributed.initialize()
        from clarifyjax.training import loops

        result = loops.run(cfg, tensorboard=not args.no_tensorboard,
                           progress=not args.no_progress)
    except ConfigError as e:
        raise CLIError(str(e)) from e
    if result["stopped"]:
        print(f"stopped at step {result['step']} on request; the checkpoint is in "
              f"{result['output_dir']}/checkpoints (run the same command to resume)")
    else:
        print(f"done: {result['step']} steps; model exported to {result['final']}")
    return 0
