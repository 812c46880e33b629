"""Supervised seq2seq fine-tuning of a T5 (and of the discriminator's classifier): the pure, jitted
pieces, t5x / PureJaxRL style. `token_losses` (cross-entropy *sums* and accuracy counts, so
batches combine exactly), `make_train_step` (one update over ``grad_accum`` micro-batches,
token-weighted), `make_eval_step`, `generation_metrics` (BLEU, ROUGE-L, exact match). The model
enters as a static ``graphdef`` and a traced `nnx.State`; the caller jits per batch shape.
Batches are `clarifyjax.data`'s dicts; a micro-batch stack adds a leading axis [a, b, ...]."""
from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from clarifyjax.models.t5 import T5, shift_right

BATCH_KEYS = ("input_ids", "input_mask", "target_ids", "target_mask", "example_mask")


class SFTState(NamedTuple):
    """params: the model's `nnx.Param` state; opt_state: optax; step: int32 []; rng: uint32 key
    data [2] (raw, so that it checkpoints as a plain array) for dropout."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array


# --------------------------------------------------------------------------- losses


# The same pieces train an encoder sequence classifier (the discriminator): its batch has one target
# column holding the class id, so the "token" sums are per-example cross-entropy over the class
# logits and accuracy counts correct classes.
def token_losses(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                 label_smoothing: float = 0.0) -> dict[str, jax.Array]:
    """Teacher-forced cross-entropy, summed over the masked target tokens.

    logits [b, t, V] float, targets [b, t] int, mask [b, t] (1 = counted).
    Label smoothing eps: the target distribution is (1 - eps) one-hot + eps / V uniform, i.e.
    loss = (1 - eps) * nll + eps * mean_v(-log p_v).
    Returns scalars: loss_sum (smoothed), nll_sum (plain), tokens, correct (argmax == target).
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    loss = nll
    if label_smoothing:
        loss = (1.0 - label_smoothing) * nll - label_smoothing * jnp.mean(logp, axis=-1)
    mask = mask.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return {"loss_sum": jnp.sum(jnp.where(mask > 0, loss, 0.0) * mask),
            "nll_sum": jnp.sum(jnp.where(mask > 0, nll, 0.0) * mask),
            "tokens": jnp.sum(mask),
            "correct": jnp.sum(correct * mask)}


def _forward_sums(graphdef, params, rest, batch, rng, label_smoothing: float, dropout: bool):
    model = nnx.merge(graphdef, params) if rest is None else nnx.merge(graphdef, params, rest)
    targets = batch["target_ids"]
    mask = batch["target_mask"] * batch["example_mask"][:, None]
    if not isinstance(model, T5):  # a sequence classifier: one target "token", the class id
        logits = model(batch["input_ids"], batch["input_mask"])[:, None, :]
        return token_losses(logits, targets[:, :1], mask[:, :1], label_smoothing)
    decoder_input_ids = shift_right(targets, model.config.decoder_start_token_id)
    rngs = nnx.Rngs(dropout=rng) if dropout else None
    logits = model(batch["input_ids"], batch["input_mask"], decoder_input_ids,
                   deterministic=not dropout, rngs=rngs)
    return token_losses(logits, targets, mask, label_smoothing)


def make_train_step(graphdef, tx: optax.GradientTransformation, *, rest=None,
                    label_smoothing: float = 0.0, dropout: bool = False
                    ) -> Callable[[SFTState, Mapping[str, jax.Array]], tuple[SFTState, dict]]:
    """`train_step(state, micro_batches) -> (state, metrics)`, pure (the caller jits it).

    micro_batches: the batch dict with a leading micro-batch axis [a, b, ...] (a = grad_accum).
    The gradient is d(sum of token losses over all micro-batches) / d params / (total tokens):
    exactly the gradient of the token-mean loss over the whole a * b batch. Dropout (when on)
    draws a fresh key per micro-batch from ``state.rng``.
    Metrics: loss (smoothed, token mean), nll, accuracy, tokens, grad_norm, lr-free.
    """
    def sums(params, batch, key):
        out = _forward_sums(graphdef, params, rest, batch, key, label_smoothing, dropout)
        return out["loss_sum"], out

    grad_fn = jax.grad(sums, has_aux=True)

    def train_step(state: SFTState, micro_batches):
        n_micro = micro_batches["input_ids"].shape[0]
        rng = jax.random.wrap_key_data(state.rng)
        rng, step_key = jax.random.split(rng)
        keys = jax.random.split(step_key, n_micro)

        def accumulate(carry, xs):
            grads, totals = carry
            batch, key = xs
            g, out = grad_fn(state.params, batch, key)
            return (jax.tree.map(jnp.add, grads, g), jax.tree.map(jnp.add, totals, out)), None

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        totals0 = {k: jnp.zeros((), jnp.float32) for k in ("loss_sum", "nll_sum", "tokens",
                                                            "correct")}
        (grads, totals), _ = jax.lax.scan(accumulate, (zeros, totals0),
                                          ({k: micro_batches[k] for k in BATCH_KEYS}, keys))
        denom = jnp.maximum(totals["tokens"], 1.0)
        grads = jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": totals["loss_sum"] / denom, "nll": totals["nll_sum"] / denom,
                   "accuracy": totals["correct"] / denom, "tokens": totals["tokens"],
                   "grad_norm": optax.tree.norm(grads)}
        return SFTState(params, opt_state, state.step + 1, jax.random.key_data(rng)), metrics

    return train_step


def make_eval_step(graphdef, rest=None) -> Callable[[Any, Mapping[str, jax.Array]], dict]:
    """`eval_step(params, batch) -> {loss_sum, nll_sum, tokens, correct}` (no smoothing, no
    dropout); padding rows (example_mask 0) count for nothing. Sum over batches, then divide."""
    def eval_step(params, batch):
        return _forward_sums(graphdef, params, rest, batch, None, 0.0, False)
    return eval_step


def init_state(params, tx: optax.GradientTransformation, seed: int) -> SFTState:
    return SFTState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32),
                    rng=jax.random.key_data(jax.random.key(seed)))


# --------------------------------------------------------------------------- host helpers


def stack_micro_batches(batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack `grad_accum` micro-batches into [a, b, ...] arrays, padding each column to the widest
    micro-batch (pad id 0, mask 0), so the stack's shape is still one of the length buckets."""
    if not batches:
        raise ValueError("stack_micro_batches: no micro-batches")
    out = {}
    for key in BATCH_KEYS:
        arrays = [np.asarray(b[key]) for b in batches]
        if arrays[0].ndim == 2:
            width = max(a.shape[1] for a in arrays)
            arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrays]
        out[key] = np.stack(arrays)
    return out


def generation_metrics(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU-4 (nltk, whitespace tokens, lower-cased, smoothing method 1), mean ROUGE-L F
    (rouge-score, stemmed) and the exact-match rate (whitespace-normalized) of `predictions`
    against one reference each, all in [0, 100]."""
    if len(predictions) != len(references):
        raise ValueError(f"generation_metrics: {len(predictions)} predictions but "
                         f"{len(references)} references")
    if not predictions:
        return {"bleu": math.nan, "rouge_l": math.nan, "exact_match": math.nan}
    from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu
    from rouge_score import rouge_scorer

    hyps = [p.lower().split() for p in predictions]
    refs = [[r.lower().split()] for r in references]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bleu = corpus_bleu(refs, hyps, smoothing_function=SmoothingFunction().method1)
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rouge = [scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)]
    # a classifier's accuracy when targets are labels (the discriminator, the judge)
    exact = [" ".join(p.split()) == " ".join(r.split()) for p, r in zip(predictions, references)]
    return {"bleu": 100.0 * float(bleu), "rouge_l": 100.0 * float(np.mean(rouge)),
            "exact_match": 100.0 * float(np.mean(exact))}
