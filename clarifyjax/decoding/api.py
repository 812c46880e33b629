"""The decoding entry points: `generate` (jitted sampling with a KV cache) and `score`
(teacher-forced log-probs of given targets), for a `T5` or a decoder-only `CausalLM`.

Each checks its arguments (a bad one is a one-line TypeError or ValueError naming it) and hands
them to one function of the model's family: `t5_loop.generate_t5` / `causal_loop.generate_causal`,
`scoring.score_t5` / `scoring.score_causal`. Shapes: b = batch, s = source length,
n = max_new_tokens, t = target length."""
from __future__ import annotations

import functools
import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from clarifyjax.decoding.causal_loop import generate_causal
from clarifyjax.decoding.sampling import LARGEST_TEMPERATURE, SMALLEST_TEMPERATURE
from clarifyjax.decoding.scoring import score_causal, score_causal_after_prefixes, score_t5
from clarifyjax.decoding.step import Generation, empty_outputs
from clarifyjax.decoding.t5_loop import generate_t5
from clarifyjax.models.causal_lm import CausalLM
from clarifyjax.models.t5 import T5
from clarifyjax.text.generator import Sampling


def generate(model: T5 | CausalLM, input_ids: jax.Array, attention_mask: jax.Array, *,
             rng: jax.Array | None, max_new_tokens: int, min_new_tokens: int = 0,
             greedy: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, stop_token_ids: Sequence[int] = (),
             prefix_ids: Sequence[int] | None = None) -> Generation:
    """Sample continuations of input_ids [b, s] (attention_mask [b, s], 1 = token).

    Returns `Generation` with tokens/logprobs/mask [b, max_new_tokens]: the new tokens only.
    EOS is impossible for the first `min_new_tokens` steps. With greedy=True, `rng` may be None
    and the sampling settings are ignored; logprobs are then those of the model's distribution
    at temperature 1. Sampling applies temperature, then top-k, then top-p (transformers'
    order), in float32, with a fresh key per step. Any temperature > 0 is safe: the logits are
    scaled after subtracting each row's largest (`sampling.scale_by_temperature`), so a tiny one
    gives the argmax (log-prob 0) rather than overflowing, and one below float32's smallest
    normal number (`sampling.SMALLEST_TEMPERATURE`) is used as that number.

    For a `CausalLM`, the prompts may be left- or right-padded (every row >= 1 token), a row
    stops after any of `config.eos_token_ids` or `stop_token_ids` (that token included, then
    `config.pad_id`). For a `T5`, `stop_token_ids` must be empty.

    `prefix_ids` (causal LMs): token ids that every prompt starts with, left out of input_ids;
    row i's prompt is prefix_ids + its own tokens (at least one). The prefix runs once for the
    batch (`CausalLM.prefill_after_prefix`) instead of once per row: the same continuations,
    much less prefill work when the rows share a long template.

    Checked (listed above `_check_model`): every argument's type, shape and dtype, eagerly and
    under `jax.jit`; the mask and id values, the rows' padding and the context only on concrete
    arrays (a traced one has no values). An empty batch gives [0, max_new_tokens] outputs.
    """
    vocab = _check_model(model, "generate")
    max_new_tokens, min_new_tokens, top_k = (
        _whole_number(value, name, low, "generate") for value, name, low in (
            (max_new_tokens, "max_new_tokens", 1), (min_new_tokens, "min_new_tokens", 0),
            (top_k, "top_k", 0)))
    _check_sampling(greedy, top_p, "generate")
    settings = _loop_settings(max_new_tokens, min_new_tokens, greedy, temperature, top_k, top_p)
    if not greedy and rng is None:
        raise ValueError("generate: sampling (greedy=False) needs an rng key")
    rng = jax.random.key(0) if rng is None else check_rng(rng, "generate")
    stop_token_ids, prefix_ids = _check_stop_ids(model, stop_token_ids, prefix_ids, vocab,
                                                 "generate")
    input_ids, attention_mask, longest = _token_batch(
        input_ids, attention_mask, ("input_ids", "attention_mask"), vocab, "generate")
    _check_context(model, longest, max_new_tokens + len(prefix_ids or ()), "generate")
    if input_ids.shape[0] == 0:  # nothing to generate: empty [0, n] outputs
        return Generation(*empty_outputs(0, settings, 0))
    if isinstance(model, CausalLM):
        return generate_causal(model, input_ids, attention_mask, rng, settings,
                               stop_token_ids=stop_token_ids, prefix_ids=prefix_ids)
    return generate_t5(model, input_ids, attention_mask, rng, settings)


def _loop_settings(max_new_tokens, min_new_tokens, greedy, temperature, top_k,
                   top_p) -> Sampling:
    """generate's settings, checked, as the loops' static argument; greedy ones (temperature 0)
    with the other sampling fields reset, since they do not change the program."""
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0 <= min_new_tokens <= max_new_tokens:
        raise ValueError(f"generate: min_new_tokens must be in [0, max_new_tokens], got "
                         f"{min_new_tokens}")
    if temperature <= 0:
        raise ValueError(f"generate: temperature must be > 0 (use greedy=True), got {temperature}")
    if top_k < 0:
        raise ValueError(f"generate: top_k must be >= 0 (0 = off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
    # what `sampling.scale_by_temperature` uses: every temperature below (above) the range float32
    # can divide by is one program
    temperature = min(max(float(temperature), SMALLEST_TEMPERATURE), LARGEST_TEMPERATURE)
    if greedy:
        temperature, top_k, top_p = 0.0, 0, 1.0
    return Sampling(max_new_tokens=int(max_new_tokens), min_new_tokens=int(min_new_tokens),
                    temperature=temperature, top_k=int(top_k), top_p=float(top_p))


def score(model: T5 | CausalLM, input_ids: jax.Array, attention_mask: jax.Array,
          target_ids: jax.Array, target_mask: jax.Array, *, greedy: bool = False):
    """Teacher-forced log p(target_ids[:, i] | input, targets before i): [b, t] float32, 0 where
    target_mask is 0. input_ids/attention_mask [b, s]; target_ids/target_mask [b, t]. With
    `greedy=True`, (log-probs, [b, t] bool: each target is the argmax there, True at padding):
    a row whose targets are all True is what greedy decoding would give.

    For a `CausalLM`, input_ids are the prompts (left- or right-padded, every row >= 1 token)
    and the targets their continuations (right-padded). Checked as `generate`'s arguments (listed
    above `_check_model`); an empty batch or zero-length targets give zeros [b, t]."""
    vocab = _check_model(model, "score")
    input_ids, attention_mask, longest = _token_batch(
        input_ids, attention_mask, ("input_ids", "attention_mask"), vocab, "score")
    target_ids, target_mask, _ = _token_batch(
        target_ids, target_mask, ("target_ids", "target_mask"), vocab, "score",
        right_padded=True, empty_rows=True)
    if target_ids.shape[0] != input_ids.shape[0]:
        raise ValueError(f"score: input_ids has {input_ids.shape[0]} rows but target_ids "
                         f"{target_ids.shape[0]}")
    if not isinstance(greedy, bool):
        raise TypeError(f"score: greedy must be True or False, got {greedy!r}")
    # the last target is not an input: a causal LM runs s + t - 1 positions
    _check_context(model, longest, max(target_ids.shape[1] - 1, 0), "score")
    if input_ids.shape[0] == 0 or target_ids.shape[1] == 0:
        zeros = jnp.zeros(target_ids.shape, jnp.float32)
        return (zeros, jnp.ones(target_ids.shape, bool)) if greedy else zeros
    if isinstance(model, CausalLM):
        return score_causal(model, input_ids, attention_mask, target_ids, target_mask, greedy=greedy)
    return score_t5(model, input_ids, attention_mask, target_ids, target_mask, greedy=greedy)


def score_after_prefixes(model: CausalLM, prefix_ids, prefix_mask, row_prefix, input_ids,
                         input_mask, target_ids, target_mask) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced scoring of rows that continue one of several prefixes (the choices of
    multiple-choice questions, each question's context a prefix) -> (log-probs [b, t] float32,
    0 where target_mask is 0; [b, t] bool, the target is the argmax, True there).

    prefix_ids/prefix_mask [D, p] (any padding, every row >= 1 token) each run once; row i is
    prefix row_prefix[i] ([b] ints in [0, D)) followed by input_ids[i] (input_mask [b, t], one
    run of tokens, >= 1), and target_ids[i, j] is the token after input j (scored where
    target_mask is 1; target_mask one run). Checked as `score`'s arguments; causal LMs only."""
    where = "score_after_prefixes"
    if not isinstance(model, CausalLM):
        raise TypeError(f"{where}: model must be a CausalLM, got {type(model).__name__}")
    vocab = _check_model(model, where)
    prefix_ids, prefix_mask, p_longest = _token_batch(
        prefix_ids, prefix_mask, ("prefix_ids", "prefix_mask"), vocab, where)
    input_ids, input_mask, longest = _token_batch(
        input_ids, input_mask, ("input_ids", "input_mask"), vocab, where)
    target_ids, target_mask, _ = _token_batch(
        target_ids, target_mask, ("target_ids", "target_mask"), vocab, where, empty_rows=True)
    if target_ids.shape != input_ids.shape:
        raise ValueError(f"{where}: target_ids {tuple(target_ids.shape)} must have input_ids' "
                         f"shape {tuple(input_ids.shape)}")
    rows = _array(row_prefix, "row_prefix", where)
    if rows.shape != (input_ids.shape[0],) or not jnp.issubdtype(rows.dtype, jnp.integer):
        raise ValueError(f"{where}: row_prefix must be [{input_ids.shape[0]}] integers, got "
                         f"{rows.dtype} {tuple(rows.shape)}")
    if not isinstance(rows, jax.core.Tracer) and rows.size and not (
            0 <= int(np.min(rows)) and int(np.max(rows)) < prefix_ids.shape[0]):
        raise ValueError(f"{where}: row_prefix must be in [0, {prefix_ids.shape[0]}) (a prefix "
                         f"row), got {int(np.min(rows))}..{int(np.max(rows))}")
    if p_longest is not None and longest is not None:
        _check_context(model, p_longest, longest, where)
    return score_causal_after_prefixes(model, prefix_ids, prefix_mask, jnp.asarray(rows, jnp.int32),
                                       input_ids, input_mask, target_ids, target_mask)


# --------------------------------------------------------------------------- argument checks


# Argument checks: each bad argument is a TypeError (wrong kind) or ValueError (wrong shape or
# value) whose one line names the argument, and for a value its row and column.
# - Always, eagerly or under `jax.jit` (types, shapes and dtypes are known then): the model's
#   family; ids an integer array and masks bool / integer / float, both [batch, length >= 1]; `rng`
#   a PRNG key (new-style or raw uint32); the counts Python or NumPy integers, `greedy` a bool,
#   `top_p` real; `prefix_ids` and `stop_token_ids` within the vocabulary.
# - On concrete arrays only (a traced array has no values to read): masks are 0 / 1; every row has
#   a token; a prompt row's tokens are one run (padded left, right or both, never with a gap, as
#   the loops left-align rows), a target row's padded on the right; every id, padding included, is
#   in [0, vocab_size) (a lookup past the table is clamped or NaN, and a NaN spreads through its
#   row); a CausalLM's longest prompt plus prefix plus `max_new_tokens` fits its positions.
# An empty batch (0 rows) passes, and gives empty arrays.
def _check_model(model, where: str) -> int:
    """The vocabulary size of a `T5` or `CausalLM`; anything else is a TypeError."""
    if not isinstance(model, (T5, CausalLM)):
        raise TypeError(f"{where}: model must be a clarifyjax T5 or CausalLM, got "
                        f"{type(model).__name__}")
    return int(model.config.vocab_size)


def _whole_number(value, name: str, low: int, where: str) -> int:
    """`value` as an int if it is a Python / NumPy integer (not a bool) >= low."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{where}: {name} must be >= {low}, got {value}")
    return int(value)


def _check_sampling(greedy, top_p, where: str) -> None:
    """`greedy` a bool, `top_p` a real number (its range is checked with the settings)."""
    if not isinstance(greedy, (bool, np.bool_)):
        raise TypeError(f"{where}: greedy must be True or False, got {greedy!r}")
    if isinstance(top_p, (bool, np.bool_)) or not isinstance(top_p, numbers.Real):
        raise TypeError(f"{where}: top_p must be a number, got {top_p!r}")


def check_rng(rng, where: str) -> jax.Array:
    """A PRNG key: a typed key array of shape () or a raw uint32 key (`jax.random.PRNGKey`)."""
    if isinstance(rng, jax.Array):
        if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
            if rng.shape == ():
                return rng
        elif rng.dtype == jnp.uint32 and rng.shape == _raw_key_shape():
            return rng
    shown = (f"an array of dtype {rng.dtype} and shape {tuple(rng.shape)}"
             if hasattr(rng, "dtype") and hasattr(rng, "shape") else repr(rng))
    raise TypeError(f"{where}: rng must be one JAX PRNG key (jax.random.key(seed)), got {shown}")


@functools.cache
def _raw_key_shape() -> tuple[int, ...]:
    return jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape


def _token_list(values, name: str, vocab_size: int, where: str) -> tuple[int, ...]:
    """A sequence of token ids (`prefix_ids`, `stop_token_ids`), each an integer in
    [0, vocab_size)."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{where}: {name} must be a sequence of token ids, got {values!r}")
    array = np.asarray(values) if not isinstance(values, jax.Array) else values
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"{where}: {name} must be a flat sequence of integer token ids, got "
                        f"{_shown(values)}")
    ids = tuple(int(i) for i in np.asarray(array))
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"{where}: {name} holds {bad[0]}, outside the vocabulary "
                         f"[0, {vocab_size})")
    return ids


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _array(value, name: str, where: str):
    """A JAX array as it is (traced or not), anything else as a NumPy array."""
    if isinstance(value, jax.Array):
        return value
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged lists
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{where}: {name} must be a [batch, length] array ({reason})") from None


def _summary(xp, ids, mask, vocab_size, right_padded: bool):
    """The value checks as 0-d arrays (a few numbers to fetch, also from arrays sharded over
    hosts): the flat index of the first mask value that is not 0/1 and that value, the first row
    without a token, the first row whose tokens are not one run (not right-padded), the flat index
    of the first id out of range and that id (each index -1 if none), and the longest row."""
    def first(flags):
        flat = flags.reshape(-1)
        at = xp.argmax(flat)
        return xp.where(flat[at], at, -1)

    def at(array, flat_index):
        return array.reshape(-1)[xp.maximum(flat_index, 0)]

    on = mask == 1
    starts = on[:, 1:] & ~on[:, :-1]  # a run of tokens starting after column 0
    if right_padded:
        broken = xp.any(starts, axis=1)
    else:
        broken = xp.sum(starts, axis=1) + on[:, 0] > 1
    lengths = xp.sum(on, axis=1)
    bad_mask, bad_id = first((mask != 0) & ~on), first((ids < 0) | (ids >= vocab_size))
    return (bad_mask, at(mask, bad_mask), first(lengths == 0), first(broken), bad_id,
            at(ids, bad_id), xp.max(lengths))


_device_summary = jax.jit(functools.partial(_summary, jnp), static_argnums=(3,))


def _token_batch(ids, mask, names: tuple[str, str], vocab_size: int, where: str, *,
                right_padded: bool = False, empty_rows: bool = False
                ) -> tuple[jax.Array, jax.Array, int | None]:
    """(ids, mask) as int32 arrays, checked as listed above `_check_model`, and the longest row's
    number of tokens (None when traced). `right_padded`: the tokens of each row must come first
    (targets); `empty_rows`: rows without a token pass (targets)."""
    id_name, mask_name = names
    ids, mask = _array(ids, id_name, where), _array(mask, mask_name, where)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"{where}: {id_name} must be an integer array of token ids, got dtype "
                        f"{ids.dtype}")
    if not (mask.dtype == bool or jnp.issubdtype(mask.dtype, jnp.integer)
            or jnp.issubdtype(mask.dtype, jnp.floating)):
        raise TypeError(f"{where}: {mask_name} must hold 0 and 1 (bool, integer or float), got "
                        f"dtype {mask.dtype}")
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise ValueError(f"{where}: {id_name} {tuple(ids.shape)} and {mask_name} "
                         f"{tuple(mask.shape)} must be the same [batch, length] shape")
    if ids.shape[1] == 0 and ids.shape[0] > 0 and not empty_rows:
        raise ValueError(f"{where}: {id_name} has length 0: every row needs a token")
    longest = None
    if ids.size and not any(isinstance(x, jax.core.Tracer) for x in (ids, mask)):
        longest = _check_values(ids, mask, names, vocab_size, where, right_padded, empty_rows)
    return jnp.asarray(ids, jnp.int32), jnp.asarray(jnp.asarray(mask) == 1, jnp.int32), longest


def _check_values(ids, mask, names, vocab_size, where, right_padded, empty_rows) -> int:
    on_host = isinstance(ids, np.ndarray) and isinstance(mask, np.ndarray)
    if on_host:
        flags = _summary(np, ids, mask, vocab_size, right_padded)
    else:
        flags = _device_summary(jnp.asarray(ids), jnp.asarray(mask), vocab_size, right_padded)
    bad_mask, mask_value, empty, broken, bad_id, id_value, longest = (
        np.asarray(f).item() for f in flags)
    id_name, mask_name = names
    width = ids.shape[1]
    if bad_mask >= 0:
        raise ValueError(f"{where}: {mask_name}[{bad_mask // width}, {bad_mask % width}] is "
                         f"{mask_value!r}; a mask holds 0 (padding) and 1 (token)")
    if empty >= 0 and not empty_rows:
        raise ValueError(f"{where}: row {empty} of {mask_name} has no token (all 0): every row "
                         "needs at least one")
    if broken >= 0:
        rule = ("padded on the right (its 1s first)" if right_padded else
                "one run of 1s (padding on the left, the right or both, no gap)")
        raise ValueError(f"{where}: row {broken} of {mask_name} is not {rule}")
    if bad_id >= 0:
        raise ValueError(f"{where}: {id_name}[{bad_id // width}, {bad_id % width}] is "
                         f"{id_value}, outside the vocabulary [0, {vocab_size})")
    return longest


def _check_context(model, longest: int | None, extra: int, where: str) -> None:
    """A `CausalLM`'s prompt (`longest` tokens + `extra`) must fit in its position table."""
    if longest is None or not isinstance(model, CausalLM):
        return
    limit = model.config.max_position_embeddings
    if longest + extra > limit:
        raise ValueError(f"{where}: the longest prompt ({longest} tokens) + {extra} reach "
                         f"{longest + extra} tokens, past the model's context "
                         f"(max_position_embeddings {limit})")


def _check_stop_ids(model, stop_token_ids: Sequence[int], prefix_ids, vocab_size: int,
                   where: str) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(stop_token_ids, prefix_ids or None) checked; both are for causal LMs only."""
    stops = _token_list(stop_token_ids, "stop_token_ids", vocab_size, where)
    prefix = None if prefix_ids is None else _token_list(prefix_ids, "prefix_ids", vocab_size,
                                                        where)
    if not isinstance(model, CausalLM):
        if stops:
            raise ValueError(f"{where}: stop_token_ids is for causal LMs; a T5 stops at its EOS")
        if prefix is not None:
            raise ValueError(f"{where}: prefix_ids is for causal LMs")
    if prefix is not None and not prefix:
        raise ValueError(f"{where}: prefix_ids is empty (leave it out instead)")
    return stops, prefix
