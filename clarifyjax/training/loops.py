"""The training loops: supervised fine-tuning of any T5 (`train_sft`) and ClarifyDelphi's PPO
(`train_ppo`), with evaluation, metrics (JSONL + TensorBoard), a progress bar, orbax checkpoints
that resume exactly, SIGTERM handling and a Hugging Face export.

A run writes under ``run.output_dir`` (docs/usage.md lists the files) and resumes by itself from
its newest intact checkpoint (docs/reliability.md). Everything on device is jitted once per
shape: the SFT step per length bucket, the PPO update per query bucket (one jitted function with
the mesh's shardings), the rollout scorer and `decoding.generate`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

import jax
import numpy as np

from clarifyjax import data, decoding
from clarifyjax.core import metrics_log, sharding
from clarifyjax.training import builders, programs, run_record, sft
from clarifyjax.training.checkpointing import Checkpointer, PreemptionGuard
from clarifyjax.config import CLASSIFIER_TASKS, ConfigError
from clarifyjax.core.metrics_log import MetricsLogger, say_through
from clarifyjax.models.hf import save_causal_lm, save_sequence_classifier, save_t5
from clarifyjax.models.causal_lm import CausalLM
from clarifyjax.models.t5 import T5
from clarifyjax.models.state import merge_model, split_model
from clarifyjax.reward.jsd import RewardNormalizer
from clarifyjax.rl.rollout import RolloutSampler, host_rows
from clarifyjax.files.tables import check_data_paths
from clarifyjax.files.textfiles import atomic_write_bytes
from clarifyjax.text import formats
from clarifyjax.text.tokenizer import Tokenizer
from clarifyjax.training.ppo_eval import all_hosts, evaluate_ppo, fit_normalizer
from clarifyjax.reward import pipeline

# --------------------------------------------------------------------------- runs


def _start(cfg, kind: str, say) -> tuple[Path, Any, tuple]:
    # Both checks read files only: a missing data file or a resume with changed settings stops
    # here, before any model is built or anything in the run folder is written.
    check_data_paths(cfg.data)
    run_record.check_resume(cfg, say)
    run_dir = Path(cfg.run.directory)
    mesh = sharding.make_mesh(cfg.mesh)
    say(f"[{kind}] {cfg.run.name}: {jax.device_count()} {jax.default_backend()} device(s), mesh "
        f"{dict(mesh.shape)}, output {run_dir}")
    rules = sharding.RULES[cfg.mesh.rules]
    return run_dir, mesh, rules


def _export(model: T5 | CausalLM, config, tokenizer, folder: Path, say, source=None) -> str:
    """`model` as a Hugging Face folder with its tokenizer; a decoder-only model (`source`: the
    folder it was loaded from) through `hf.save_causal_lm`."""
    if isinstance(model, CausalLM):
        save_causal_lm(model, source, folder)
    else:
        save_t5(model, config, folder)
    if jax.process_index() == 0:
        tokenizer.save_pretrained(folder)
    say(f"[export] Hugging Face folder: {folder}")
    return str(folder)


def _export_classifier(model, source: str, folder: Path, say) -> str:
    """The trained classifier as a Hugging Face folder (`hf.save_sequence_classifier`), with the
    `source` folder's tokenizer.json."""
    save_sequence_classifier(model, folder, source)
    if jax.process_index() == 0:
        atomic_write_bytes(folder / "tokenizer.json",
                           (Path(source) / "tokenizer.json").read_bytes())
    say(f"[export] Hugging Face folder: {folder}")
    return str(folder)


def _restore(ckpt: Checkpointer, state, say, cfg):
    """The newest intact checkpoint (damaged newer ones are set aside with a warning), then the
    run's record: config.yaml (and config_history.jsonl for allowed changes) is written only now,
    so that a refused or failed resume leaves the old record as it was."""
    ckpt.record = run_record.as_record(cfg)  # each checkpoint records the settings it was made with
    restored = ckpt.restore_latest(state, say=say)
    step, state, extra = restored if restored is not None else (0, state, {})
    if restored is not None:
        say(f"[checkpoint] resumed from step {step} ({ckpt.directory})")
    run_record.commit(cfg, step, extra, say)
    return step, state, extra


def _checkpointer(cfg, run_dir: Path) -> Checkpointer:
    return Checkpointer(run_dir / "checkpoints", max_to_keep=cfg.run.max_to_keep,
                        save_interval_steps=max(cfg.run.save_every, 1),
                        async_save=cfg.run.async_checkpointing)


def _due(step: int, every: int, total: int) -> bool:
    """Every `every` steps (never when 0) and at the last step."""
    return bool(every) and (step % every == 0 or step == total)


def _eval_due(step: int, cfg) -> bool:
    """Whether a PPO run evaluates after `step` updates (0: before the first), as
    ``ppo.eval_schedule`` says: before_training at 0, every ``run.eval_every`` and the last;
    after_first_update after updates 1, 1 + eval_every, ... (the original's schedule)."""
    every = cfg.run.eval_every
    if cfg.ppo.eval_schedule == "after_first_update":
        return bool(every) and step >= 1 and (step - 1) % every == 0
    return bool(every) and (step == 0 or _due(step, every, cfg.run.steps))


def _checkpoint(ckpt, guard, step: int, total: int, state, extra: Callable[[], dict]) -> bool:
    """Save when due, at the last step or on a stop request (SIGTERM); True: stop now."""
    stop = guard.should_stop(step)
    if stop or ckpt.should_save(step) or step == total:
        ckpt.save(step, state, extra())
    return stop


def _log_eval(logger, say, at: int, metrics: dict) -> dict:
    logger.write(at, metrics)
    say(f"[eval {at}] " + ", ".join(f"{k[5:]} {v:.4g}" for k, v in metrics.items()))
    return metrics


# --------------------------------------------------------------------------- SFT

def _majority_rate(dataset) -> float:
    """The share of the most frequent class among a classifier dataset's rows (accuracy of
    always answering it)."""
    labels = dataset.ids["target"][:, 0]
    return float(np.bincount(labels).max() / max(len(labels), 1)) if len(labels) else float("nan")


def evaluate_sft(model: T5, eval_step, params, dataset, tokenizer, *, batch_size: int, mesh,
                 max_new_tokens: int, generate: bool = True) -> tuple[dict, list[str]]:
    """Dev loss / token accuracy over every row, and BLEU / ROUGE-L of greedy outputs."""
    totals = {"nll_sum": 0.0, "tokens": 0.0, "correct": 0.0}
    predictions, references = [], []
    for batch in data.eval_batches(dataset, batch_size):
        placed = sharding.shard_batch({k: batch[k] for k in sft.BATCH_KEYS}, mesh)
        out = eval_step(params, placed)
        for k in totals:
            totals[k] += float(out[k])
        if generate:
            gen = decoding.generate(model, placed["input_ids"], placed["input_mask"], rng=None,
                                    max_new_tokens=max_new_tokens, greedy=True)
            texts = tokenizer.decode_batch(host_rows(gen.tokens, mesh))  # this host's rows
            kept = [(t, i) for t, i, k in zip(texts, batch["index"], batch["example_mask"]) if k]
            predictions += [t for t, _ in kept]
            references += [dataset.texts["target"][i] for _, i in kept]
    n = max(totals["tokens"], 1.0)
    metrics = {"eval/loss": totals["nll_sum"] / n, "eval/accuracy": totals["correct"] / n}
    if generate:
        scores = sft.generation_metrics(predictions, references)
        metrics.update({"eval/bleu": scores["bleu"], "eval/rouge_l": scores["rouge_l"],
                        "eval/exact_match": scores["exact_match"]})
    return metrics, predictions


def _sft_model_and_data(cfg, train_pairs, dev_pairs, mesh, rules, say):
    """The SFT run's model, its config and tokenizer, the encoded train / dev sets, and (for a
    classifier) the dev majority-class rate."""
    majority = None
    if cfg.task in CLASSIFIER_TASKS:  # an encoder classifier: (situation, question) pairs -> class logits
        model, tokenizer = builders.build_classifier(cfg.model, mesh=mesh, rules=rules)
        config = model.config
        train_ds, dev_ds = (data.classifier_dataset(pairs, tokenizer,
                                                    cfg.model.max_input_length,
                                                    cfg.data.length_buckets)
                            for pairs in (train_pairs, dev_pairs))
        majority = _majority_rate(dev_ds)
        say(f"[sft:{cfg.task}] {len(train_ds)} train / {len(dev_ds)} dev pairs; "
            f"{config.model_type} classifier, hidden {config.hidden_size}, {config.num_layers} "
            f"layers, labels {list(config.labels)}; dev majority-class rate {majority:.4f}")
    else:
        tokenizer = Tokenizer.from_pretrained(cfg.model.tokenizer_path)
        train_ds, dev_ds = (data.sft_dataset(pairs, tokenizer, cfg.model,
                                             cfg.data.length_buckets)
                            for pairs in (train_pairs, dev_pairs))
        config, model = builders.build_t5(cfg.model, seed=cfg.run.seed, mesh=mesh, rules=rules,
                                          tokenizer=tokenizer)
        say(f"[sft:{cfg.task}] {len(train_ds)} train / {len(dev_ds)} dev pairs; d_model "
            f"{config.d_model}, {config.num_layers} layers, vocab {config.vocab_size}")
    return model, config, tokenizer, train_ds, dev_ds, majority


def train_sft(cfg, *, tensorboard: bool = True, progress: bool = True, export: bool = True
              ) -> dict[str, Any]:
    """Supervised fine-tuning for an `SFTConfig`. Returns {"step", "eval" (last dev metrics),
    "first_eval", "output_dir", "final" (export folder or None), "stopped" (SIGTERM), "program"
    (the `programs.SFTProgram` it ran), "model" (the trained model)}.

    For the tasks in `config.CLASSIFIER_TASKS` (the discriminator) the model is the Hugging Face
    sequence classifier of ``model.init`` (`builders.build_classifier`) trained on (situation,
    question) pairs with cross-entropy on its class logits, through the same program, checkpoints
    and resume; dev metrics are eval/loss, eval/accuracy (class accuracy) and eval/majority_rate;
    final/ is a Hugging Face classifier folder (`hf.save_sequence_classifier`)."""
    say = say_through(None)
    run_dir, mesh, rules = _start(cfg, f"sft:{cfg.task}", say)
    train_pairs, dev_pairs = data.load_sft_pairs(cfg.data, cfg.task)  # bad files fail first
    classifier = cfg.task in CLASSIFIER_TASKS
    model, config, tokenizer, train_ds, dev_ds, majority = _sft_model_and_data(
        cfg, train_pairs, dev_pairs, mesh, rules, say)
    graphdef, params = split_model(model)
    program = programs.SFTProgram.build(cfg, mesh, graphdef, params,
                                        dropout=getattr(config, "dropout_rate", 0.0) > 0)
    state = program.init_state()
    eval_step = jax.jit(sft.make_eval_step(graphdef))
    schedule = programs.make_schedule(cfg.optimizer, cfg.run.steps)
    logger = MetricsLogger(run_dir, tensorboard=tensorboard, say=say)
    result: dict[str, Any] = {"output_dir": str(run_dir), "final": None, "stopped": False,
                              "eval": None, "first_eval": None, "program": program}
    with _checkpointer(cfg, run_dir) as ckpt, PreemptionGuard() as guard:
        step, state, extra = _restore(ckpt, state, say, cfg)
        batches = data.BatchIterator(train_ds, cfg.data.batch_size, seed=cfg.run.seed,
                                     shuffle=cfg.data.shuffle, position=extra.get("data"))

        def evaluate(at: int) -> dict:
            m, preds = evaluate_sft(merge_model(graphdef, state["params"]), eval_step,
                                    state["params"], dev_ds, tokenizer,
                                    batch_size=cfg.data.eval_batch_size, mesh=mesh,
                                    max_new_tokens=cfg.model.max_target_length,
                                    generate=not classifier)
            if classifier:  # eval/accuracy is the class accuracy; beside it, the baseline
                m["eval/majority_rate"] = majority
            _log_eval(logger, say, at, m)
            for i in range(min(3, len(preds))):
                say(f"  {dev_ds.texts['input'][i]!r}\n    -> {preds[i]!r}\n    (ref "
                    f"{dev_ds.texts['target'][i]!r})")
            return m

        result["first_eval"] = evaluate(step) if step == 0 and cfg.run.eval_every else None
        bar = metrics_log.progress(cfg.run.steps, step, progress)
        say, last = say_through(bar), {}
        while step < cfg.run.steps:
            micro_batches = [next(batches) for _ in range(program.grad_accum)]
            state, metrics = program(state, program.place_batch(micro_batches))
            step += 1
            bar.update(1)
            if _due(step, cfg.run.log_every, cfg.run.steps):
                last = {f"train/{k}": float(v) for k, v in metrics.items()}
                last["train/lr"] = float(schedule(step - 1))
                logger.write(step, last)
                bar.set_postfix(loss=f"{last['train/loss']:.3f}",
                                acc=f"{last['train/accuracy']:.3f}")
            if _due(step, cfg.run.eval_every, cfg.run.steps):
                result["eval"] = evaluate(step)
            if _checkpoint(ckpt, guard, step, cfg.run.steps, state,
                           lambda: {"data": batches.position, "train": last}):  # noqa: B023 (called now)
                result["stopped"] = True
                say(f"[sft] stopping at step {step} on request (checkpoint saved)")
                break
        bar.close()
    logger.close()
    result["step"] = step
    trained = result["model"] = merge_model(graphdef, state["params"])
    if export and not result["stopped"]:
        result["final"] = (_export_classifier(trained, cfg.model.init, run_dir / "final", print)
                           if classifier else
                           _export(trained, config, tokenizer, run_dir / "final", print))
    return result


# --------------------------------------------------------------------------- PPO


def build_reward_fn(cfg):
    """ClarifyDelphi's reward for a `PPOConfig`: the `RewardPipeline` of its ``rewards:`` section
    (`pipeline.load_pipeline`, as `clarifyjax score-questions` builds it), returning raw
    JSDs (the loop normalizes).

    Each process scores its own rows, so the reward models live on its `sharding.process_mesh`:
    split by the run's rules (``mesh.rules``) over the fsdp x model devices that the training mesh
    puts in one process, each device reading only its slices of the checkpoints.
    """
    return pipeline.load_pipeline(cfg.rewards, mesh=sharding.process_mesh(cfg.mesh),
                                  rules=sharding.RULES[cfg.mesh.rules])


def _sampler(cfg, tokenizer, m: builders.PPOModels, reward_fn, mesh) -> RolloutSampler:
    """Rollouts of the policy `m`, rewarded by `reward_fn` (default: the config's pipeline)."""
    h = cfg.ppo
    return RolloutSampler(tokenizer, m.graphdef, m.value_graphdef,
                          reward_fn if reward_fn is not None else build_reward_fn(cfg), mesh,
                          sampling=h.sampling, clean_up_spaces=h.clean_up_tokenization_spaces,
                          decode_situations=h.reward_situations == "decoded",
                          logprob_temperature=h.logprob_temperature,
                          stop_token_ids=getattr(tokenizer, "stop_ids", ()))


def _policy(cfg, mesh, rules) -> tuple[Any, builders.PPOModels]:
    """(the policy's tokenizer, the run's models), for a T5 or a decoder-only policy."""
    family = builders.check_policy_family(cfg)
    tokenizer = builders.policy_tokenizer(cfg, family)
    return tokenizer, builders.build_ppo_models(cfg, mesh, rules, tokenizer, family)


def _situations(cfg, tokenizer) -> tuple[Any, Any]:
    """(train dataset, dev dataset or None) of tokenized situations: a T5's input, or a decoder
    policy's prompt (`rl.prompts.CausalPolicyText.prompt`)."""
    def dataset(situations):
        return data.situation_dataset(situations, tokenizer, cfg.policy.max_input_length,
                                      cfg.data.length_buckets,
                                      prompt=getattr(tokenizer, "prompt", formats.policy_input))

    train_sits, dev_sits = data.load_ppo_situations(cfg.data)
    return dataset(train_sits), (dataset(dev_sits) if dev_sits else None)


def _normalizer(cfg, saved: dict | None, where: str, sampler, params, dataset, say):
    """The reward normalizer: the checkpoint's (`saved`), else fitted on the initial policy."""
    if saved is not None:
        return RewardNormalizer.from_dict(saved, where=where)
    return fit_normalizer(cfg, sampler, params, dataset, say)


def _learn(program, state, rollout, key, times: dict):
    """The learner's two calls of one compiled update: record the rollout's log-probs and values
    (`PPOProgram.record`, timed as "time/record"), then update -> (the rollout as recorded, the
    new state, metrics, the update's start time)."""
    t0 = time.perf_counter()
    state, rollout = program.record(state, rollout, key)
    jax.block_until_ready(rollout.logprobs)
    times["time/record"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    return (rollout, *program(state, rollout, key), t0)


def _log_ppo_step(logger, bar, step: int, metrics, fields, times: dict, t_update: float, rollout,
                  mesh) -> dict[str, float]:
    """Log one step's scalars (the update's metrics, timings, raw reward, tokens per second) and
    show some on the bar; returns them."""
    row = {f"train/{k}": float(v) for k, v in metrics.items()}
    # What PPO paid (after a group baseline) and the rollouts' normalized reward itself.
    row["train/mean_score_paid"] = row["train/mean_score"]
    row["train/mean_score"] = float(np.mean(all_hosts(fields["reward"])))
    times["time/update"] = time.perf_counter() - t_update  # float() above synchronized
    row.update(times)
    row["train/reward_raw"] = float(fields["raw_reward"].mean())
    row["train/tokens_per_s"] = float(host_rows(rollout.response_mask, mesh).sum()
                                      ) / max(sum(times.values()), 1e-9)
    if "valid" in fields:  # the rest were paid the dropped-answer value, not a JSD
        row["train/valid_rate"] = float(np.mean(fields["valid"]))
        row["train/dropped_share"] = 1.0 - row["train/valid_rate"]
    logger.write(step, row)
    bar.set_postfix(reward=f"{row['train/mean_score']:.3f}", kl=f"{row['train/kl_to_ref']:.3f}",
                    loss=f"{row['train/total_loss']:.3f}")
    return row


def _say_samples(say, step: int, situations, questions, raw_rewards) -> None:
    for sit, q, r in list(zip(situations, questions, raw_rewards))[:3]:
        say(f"  [{step}] {sit!r}\n      -> {q!r} (raw reward {r:.4g})")


def _say_top_questions(say, metrics: dict, rows: dict) -> None:
    """The dev questions asked most often, so that a collapsed policy is named as such."""
    say(f"  most frequent dev questions ({metrics['eval/distinct_questions']:.0f} distinct of "
        f"{len(rows['questions'])}; the first asked of {metrics['eval/top_question_share']:.0%}): "
        + "; ".join(f"{q!r} x{n}" for q, n in rows["top"][:3]))


def train_ppo(cfg, *, reward_fn: Callable | None = None, tensorboard: bool = True,
              progress: bool = True, export: bool = True) -> dict[str, Any]:
    """ClarifyDelphi's PPO for a `PPOConfig` (Algorithm 1).

    reward_fn(situations, questions) -> raw rewards [b] (or an object with ``.reward``); default:
    the config's `RewardPipeline`. Returns {"step", "history" (logged train metrics), "eval" (last),
    "first_eval" (at step 0, if `_eval_due`) and their per-situation "eval_rows" / "first_eval_rows",
    "normalizer", "state" (the final `ppo.PPOState`), "output_dir", "final", "stopped", "program"}.
    """
    say = say_through(None)
    run_dir, mesh, rules = _start(cfg, "ppo", say)
    h, seed = cfg.ppo, cfg.run.seed
    tokenizer, m = _policy(cfg, mesh, rules)
    train_ds, dev_ds = _situations(cfg, tokenizer)
    say(f"[ppo] {len(train_ds)} training situations, {len(dev_ds or ())} dev situations; policy "
        f"{m.family} ({getattr(m.config, 'model_type', 't5')}), {m.config.num_layers} layers")
    program = programs.PPOProgram.build(cfg, mesh, m.graphdef, m.params, m.value_graphdef,
                                        m.value_params)
    state = program.init_state()
    sampler = _sampler(cfg, tokenizer, m, reward_fn, mesh)
    logger = MetricsLogger(run_dir, tensorboard=tensorboard, say=say)
    result: dict[str, Any] = {"output_dir": str(run_dir), "final": None, "stopped": False,
                              "history": [], "first_eval": None, "eval": None, "program": program}
    with _checkpointer(cfg, run_dir) as ckpt, PreemptionGuard() as guard:
        step, state, extra = _restore(ckpt, state, say, cfg)
        normalizer = _normalizer(cfg, extra.get("normalizer"), f"{ckpt.directory}: normalizer",
                                 sampler, state["ppo"].policy_params, train_ds, say)
        group = h.samples_per_situation  # rloo, grpo: their baselines are paid in the update
        batches = data.BatchIterator(train_ds, h.batch_size // group, seed=seed,
                                     shuffle=cfg.data.shuffle, position=extra.get("data"))

        def evaluate(at: int):
            rows: dict = {}
            metrics = _log_eval(logger, say, at, evaluate_ppo(
                sampler, state["ppo"].policy_params, m.ref_params, dev_ds,
                batch_size=cfg.data.eval_batch_size, normalizer=normalizer,
                key=jax.random.fold_in(jax.random.key(seed + 1), at), samples=h.eval_samples,
                rows=rows))
            result["eval_rows" if at else "first_eval_rows"] = rows
            _say_top_questions(say, metrics, rows)
            return metrics

        if dev_ds is not None and step == 0 and _eval_due(0, cfg):
            result["first_eval"] = evaluate(0)
        bar = metrics_log.progress(cfg.run.steps, step, progress)
        say = say_through(bar)
        while step < cfg.run.steps:
            rng, k_sample, k_update = jax.random.split(jax.random.wrap_key_data(state["rng"]), 3)
            batch = {k: np.repeat(v, group, axis=0) for k, v in next(batches).items()}
            situations = sampler.situations(batch, train_ds.texts["situation"])
            # sample, reward (normalized) and score questions; then one jitted ppo.algorithm update
            rollout, questions, fields, times = sampler.rollout(
                state["ppo"], m.ref_params, batch, situations, k_sample, normalizer,
                group if h.algorithm == "ppo" else 1)
            rollout, new_ppo, metrics, t0 = _learn(program, state["ppo"], rollout, k_update, times)
            state = {"ppo": new_ppo, "rng": jax.random.key_data(rng)}
            step += 1
            bar.update(1)
            if _due(step, cfg.run.log_every, cfg.run.steps):
                row = _log_ppo_step(logger, bar, step, metrics, fields, times, t0, rollout, mesh)
                result["history"].append({"step": step, **row})
            if cfg.run.sample_every and step % cfg.run.sample_every == 0:
                _say_samples(say, step, situations, questions, fields["raw_reward"])
            if dev_ds is not None and _eval_due(step, cfg):
                result["eval"] = evaluate(step)
            if _checkpoint(ckpt, guard, step, cfg.run.steps, state, lambda state=state: {
                    "data": batches.position, "normalizer": normalizer.to_dict(),
                    "kl_coef": float(state["ppo"].kl_ctl.value)}):
                result["stopped"] = True
                say(f"[ppo] stopping at step {step} on request (checkpoint saved)")
                break
        bar.close()
    logger.close()
    result.update(step=step, normalizer=normalizer, state=state["ppo"])
    if export and not result["stopped"]:
        result["final"] = _export(merge_model(m.graphdef, state["ppo"].policy_params), m.config,
                                  tokenizer, run_dir / "final", print, source=cfg.policy.init)
    return result


def run(cfg, **kwargs) -> dict[str, Any]:
    """Dispatch on the config kind ("sft" or "ppo")."""
    if cfg.kind == "sft":
        return train_sft(cfg, **kwargs)
    if cfg.kind == "ppo":
        return train_ppo(cfg, **kwargs)
    raise ConfigError(f"unknown run kind {cfg.kind!r}")
