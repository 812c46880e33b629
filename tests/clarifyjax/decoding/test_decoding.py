"""Cached, jitted decoding against references written here without the cache.

* greedy `generate` (one `lax.while_loop` over the KV cache) == a plain Python greedy loop that
  re-runs the full model on the growing prefix (identical tokens, log-probs within 1e-5);
* sampled log-probs at temperature 1 / no truncation == `score` of the sampled tokens (1e-5);
* temperature / top-k / top-p log-probs == a numpy reference of the filtered distribution (1e-5),
  and the sampled tokens lie in the numpy-computed support;
* repeated calls with the same shapes do not retrace.

Compiling is most of this file's time, so its T5 runs share programs: every batch is [4, 11]
and every `score` target [4, MAX_NEW]; the greedy run of each family's seed-0 model, with the
token it emits most made EOS, is made once (`stopping`) and serves every test that needs a
greedy run whose rows stop early.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clarifyjax import decoding

from clarifyjax.core import traces
from clarifyjax.decoding import Generation, filter_logits, generate, score
from clarifyjax.decoding.sampling import TOP_K_CANDIDATES, choose_rows, filter_rows, stack_rows
from clarifyjax.models.t5 import T5, T5Config, shift_right
from clarifyjax.text.generator import Sampling
from helpers.t5_builders import FAMILIES, TINY, random_t5

MAX_NEW = 12
TOL = 1e-5


def make_model(family: str, seed: int = 0, **overrides) -> T5:
    return random_t5(T5Config(**{**TINY, **FAMILIES[family], **overrides}), seed)


def batch(seed: int = 0):
    rng = np.random.RandomState(seed)
    lengths = [5, 11, 2, 8]
    ids = np.zeros((4, 11), np.int32)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.randint(2, TINY["vocab_size"], n)
        mask[i, :n] = 1
    return jnp.asarray(ids), jnp.asarray(mask)


@nnx.jit
def full_logits(model, ids, mask, dec):
    return model(ids, mask, dec)


def reference_greedy(model: T5, ids, mask, max_new: int, eos: int | None = None):
    """No cache: re-run the whole decoder on the prefix at every step (rows stop at EOS)."""
    c = model.config
    eos = c.eos_token_id if eos is None else eos
    b = ids.shape[0]
    prefix = np.full((b, 1), c.decoder_start_token_id, np.int32)
    done = np.zeros(b, bool)
    tokens = np.full((b, max_new), c.pad_token_id, np.int32)
    logprobs = np.zeros((b, max_new), np.float32)
    for step in range(max_new):
        # pad the prefix to max_new so that one compiled shape serves every step (causal mask)
        dec = np.pad(prefix, ((0, 0), (0, max_new - prefix.shape[1])))
        logits = np.asarray(full_logits(model, ids, mask, jnp.asarray(dec)))[:, step]
        logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), -1))
        token = logits.argmax(-1)
        tokens[:, step] = np.where(done, c.pad_token_id, token)
        logprobs[:, step] = np.where(done, 0.0, logp[np.arange(b), token])
        done |= token == eos
        prefix = np.concatenate([prefix, tokens[:, step:step + 1]], 1)
        if done.all():
            break
    return tokens, logprobs


def frequent_token(model: T5, ids, mask) -> int:
    """The token (other than pad) that greedy decoding emits most: made EOS so that rows stop
    at different steps. Found with the uncached reference, EOS off (no extra compile)."""
    tokens, _ = reference_greedy(model, ids, mask, MAX_NEW, eos=-1)
    values, counts = np.unique(tokens[tokens != model.config.pad_token_id], return_counts=True)
    return int(values[np.argmax(counts)])


@pytest.fixture(scope="module")
def stopping():
    """family -> (model, (ids, mask), its greedy `Generation`, the uncached reference's tokens
    and log-probs): `family`'s seed-0 model with the token that greedy decoding of `batch()`
    emits most made its EOS, so that rows stop at different steps. Made once per family."""
    @functools.cache
    def make(family: str):
        ids, mask = batch()
        model = make_model(family)
        eos = frequent_token(model, ids, mask)
        reference = reference_greedy(model, ids, mask, MAX_NEW, eos=eos)  # logits of this config
        model.config = dataclasses.replace(model.config, eos_token_id=eos)
        got = generate(model, ids, mask, rng=None, max_new_tokens=MAX_NEW, greedy=True)
        return model, (ids, mask), got, reference
    return make


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cached_greedy_equals_uncached_reference(family, stopping):
    model, _, got, (tokens, logprobs) = stopping(family)
    assert isinstance(got, Generation)
    assert got.tokens.shape == got.logprobs.shape == got.mask.shape == (4, MAX_NEW)
    np.testing.assert_array_equal(np.asarray(got.tokens), tokens)
    np.testing.assert_allclose(np.asarray(got.logprobs), logprobs, atol=TOL, rtol=0)
    lengths = np.asarray(got.mask).sum(1)
    assert lengths.min() < MAX_NEW, "no row emitted EOS: the stopping rule is untested"
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    for row, n in enumerate(lengths):  # 1 up to and including EOS, pad after
        assert (np.asarray(got.mask)[row, :n] == 1).all()
        assert n == MAX_NEW or tokens[row, n - 1] == eos
        assert (tokens[row, n:] == pad).all() and (np.asarray(got.logprobs)[row, n:] == 0).all()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sampled_logprobs_equal_score(family):
    ids, mask = batch(1)
    model = make_model(family, seed=1)
    got = generate(model, ids, mask, rng=jax.random.key(3), max_new_tokens=MAX_NEW)
    scored = score(model, ids, mask, got.tokens, got.mask)
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(scored), atol=TOL, rtol=0)
    assert np.asarray(got.mask).sum() > 8


def test_score_is_teacher_forced_log_softmax():
    ids, mask = batch(2)
    model = make_model("v1.1", seed=2)
    c = model.config
    targets = jnp.asarray(np.random.RandomState(0).randint(2, c.vocab_size, (4, MAX_NEW)),
                          jnp.int32)
    target_mask = jnp.asarray(np.arange(MAX_NEW)[None] < np.array([[MAX_NEW], [3], [1], [7]]),
                              jnp.int32)
    logits = full_logits(model, ids, mask, shift_right(targets, c.decoder_start_token_id))
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
    got = score(model, ids, mask, targets, target_mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref * target_mask), atol=TOL, rtol=0)


def numpy_filtered_logprobs(logits: np.ndarray, temperature: float, top_k: int, top_p: float):
    """Reference of the sampled distribution: [V] logits -> [V] log-probs (-inf outside)."""
    z = logits.astype(np.float64) / temperature
    keep = np.ones_like(z, bool)
    order = np.argsort(-z, kind="stable")
    if top_k:
        keep[order[top_k:]] = False
    if top_p < 1:
        p = np.exp(z - z.max())
        p = np.where(keep, p, 0)
        p /= p.sum()
        mass_before = np.cumsum(p[order]) - p[order]
        keep[order[mass_before >= top_p]] = False
    z = np.where(keep, z, -np.inf)
    return z - np.log(np.exp(z[keep] - z[keep].max()).sum()) - z[keep].max()


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.6), (1.0, 5, 1.0),
                                                     (1.3, 10, 0.9)])
def test_filtered_sampling_support_and_logprobs(temperature, top_k, top_p):
    ids, mask = batch(3)
    model = make_model("v1.0", seed=3)
    got = generate(model, ids, mask, rng=jax.random.key(0), max_new_tokens=MAX_NEW,
                   temperature=temperature, top_k=top_k, top_p=top_p)
    tokens, gmask, glogp = np.asarray(got.tokens), np.asarray(got.mask), np.asarray(got.logprobs)
    dec = shift_right(got.tokens, model.config.decoder_start_token_id)
    logits = np.asarray(full_logits(model, ids, mask, dec))
    checked = 0
    for row in range(tokens.shape[0]):
        for step in range(MAX_NEW):
            if not gmask[row, step]:
                continue
            ref = numpy_filtered_logprobs(logits[row, step], temperature, top_k, top_p)
            assert np.isfinite(ref[tokens[row, step]]), "sampled outside the support"
            np.testing.assert_allclose(glogp[row, step], ref[tokens[row, step]],
                                       atol=TOL, rtol=0)
            checked += 1
    assert checked > 8


def test_top_k_1_and_tiny_top_p_equal_greedy(stopping):
    model, (ids, mask), greedy, _ = stopping("v1.1")
    for kw in (dict(top_k=1), dict(top_p=1e-6)):
        out = generate(model, ids, mask, rng=jax.random.key(1), max_new_tokens=MAX_NEW, **kw)
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(greedy.tokens))
        np.testing.assert_allclose(np.asarray(out.logprobs)[np.asarray(out.mask) == 1], 0.0,
                                   atol=TOL)  # a point mass


@pytest.fixture(params=["search", "bisection"])
def threshold_path(request):
    """The ways of finding the top-k / top-p thresholds: `lax.top_k`'s candidates, then a
    bisection where they fall short (the default); the bisections of the whole row
    (`filter_logits`' `bisect=True`). Yields the path's name."""
    return request.param


@functools.cache
def filtered_logprobs(temperature: float, top_k: int, top_p: float, path: str):
    """log_softmax(filter_logits(.)) at one setting and threshold path, jitted once:
    [b, V] -> [b, V]."""
    return jax.jit(lambda x: jax.nn.log_softmax(filter_logits(
        x, temperature=temperature, top_k=top_k, top_p=top_p, bisect=path == "bisection"), -1))


# `sampling.choose_rows` with EOS id 2: one program for the per-row tests (row_batch's shapes)
choose = jax.jit(lambda x, settings, step: choose_rows(x, settings, step, (2,)))
ROW_SETTINGS = [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.9), (1.0, TOP_K_CANDIDATES + 36, 0.8),
                (0.5, 5, 0.5), (2.0, 0, 1.0)]


def row_batch():
    """[6, 3000] logits (row 2 flat), per-row settings ROW_SETTINGS (row i seeded i), steps."""
    rng = np.random.RandomState(3)
    logits = (rng.randn(6, 3000) * np.array([[4.0], [4.0], [0.3], [4.0], [2.0], [1.0]]))
    rows = stack_rows([Sampling(temperature=t, top_k=k, top_p=p) for t, k, p in ROW_SETTINGS],
                      range(6))
    return logits.astype(np.float32), rows, jnp.arange(6, dtype=jnp.int32)


def test_no_threshold_sorts_the_vocabulary():
    """The thresholds take `lax.top_k`'s values whole (a sliced top_k becomes a sort of the
    row on XLA:CPU, 300x slower at [128, 32000]): no compiled filter or per-row choice sorts.
    The filters checked: top-k alone; top-p alone; top-p among top-k's kept (k <= and k >
    TOP_P_CANDIDATES); the last two are the programs that the large-vocabulary test runs."""
    x = jnp.zeros((4, 3000), jnp.float32)
    for setting in ((1.0, 10, 1.0), (0.7, 0, 0.6), (1.0, 7, 0.5), (1.3, 1000, 0.9)):
        text = filtered_logprobs(*setting, "search").lower(x).compile().as_text()
        assert " sort(" not in text, setting
    logits, rows, steps = row_batch()
    assert " sort(" not in choose.lower(logits, rows, steps).compile().as_text()


def test_filter_logits_matches_numpy(threshold_path):
    logits = np.random.RandomState(5).randn(3, 50).astype(np.float32) * 3
    logits[2, :5] = -np.inf
    for t, k, p in [(1.0, 0, 0.5), (0.5, 7, 1.0), (2.0, 20, 0.8), (1.0, 3, 1.0), (1.0, 50, 1.0)]:
        got = np.asarray(jax.nn.log_softmax(filter_logits(jnp.asarray(logits), temperature=t,
                                                          top_k=k, top_p=p,
                                                          bisect=threshold_path == "bisection"),
                                            -1))
        for row in range(3):
            ref = numpy_filtered_logprobs(logits[row], t, k, p)
            np.testing.assert_array_equal(np.isfinite(got[row]), np.isfinite(ref))
            np.testing.assert_allclose(got[row][np.isfinite(ref)], ref[np.isfinite(ref)],
                                       atol=TOL, rtol=0)


def test_top_k_keeps_every_token_tied_with_the_kth(threshold_path):
    """transformers' TopKLogitsWarper removes `scores < topk(scores, k)[0][..., -1]`: a token tied
    with the k-th largest stays, so more than k may be kept."""
    logits = np.round(np.random.RandomState(6).randn(4, 300) * 2).astype(np.float32)
    logits[3, 100:] = -np.inf
    for k in (1, 5, 40, 300):
        got = np.isfinite(np.asarray(filter_logits(jnp.asarray(logits), top_k=k,
                                                   bisect=threshold_path == "bisection")))
        kth = -np.sort(-logits, axis=-1)[:, k - 1:k]
        np.testing.assert_array_equal(got, (logits >= kth) & np.isfinite(logits), err_msg=f"k={k}")
        assert (got.sum(-1) >= min(k, 100)).all()


@pytest.mark.parametrize("spread", ["peaked", "flat", "mixed"])
def test_top_p_over_a_large_vocabulary_matches_numpy(spread, threshold_path):
    """V = 3000 > TOP_P_CANDIDATES: peaked rows find their nucleus among the candidates; flat
    rows (a nucleus of ~1,800 tokens) need the full sort; a batch with both sorts every row."""
    rng = np.random.RandomState(11)
    scale = {"peaked": [6.0] * 4, "flat": [0.5] * 4, "mixed": [6.0, 0.5, 6.0, 0.5]}[spread]
    logits = (rng.randn(4, 3000) * np.asarray(scale)[:, None]).astype(np.float32)
    kept = None
    for t, k, p in [(0.7, 0, 0.6), (1.0, 0, 0.95), (1.3, 1000, 0.9)]:
        got = np.asarray(filtered_logprobs(t, k, p, threshold_path)(jnp.asarray(logits)))
        for row in range(4):
            ref = numpy_filtered_logprobs(logits[row], t, k, p)
            np.testing.assert_array_equal(np.isfinite(got[row]), np.isfinite(ref))
            np.testing.assert_allclose(got[row][np.isfinite(ref)], ref[np.isfinite(ref)],
                                       atol=TOL, rtol=0)
        if kept is None:  # what temperature 0.7, top-p 0.6 keeps (log_softmax keeps the -inf)
            kept = np.isfinite(got).sum(-1)
    assert (kept[np.asarray(scale) == 6.0] < decoding.TOP_P_CANDIDATES).all()
    assert (kept[np.asarray(scale) == 0.5] > decoding.TOP_P_CANDIDATES).all()


def test_top_p_splits_tokens_whose_probabilities_round_together(threshold_path):
    """2,000 distinct logits 1e-7 apart (and 1,000 far below): exp(logit - logsumexp) rounds
    about five neighbours to one float32 probability. The bisection searches the probabilities, so
    where the nucleus ends inside such a group it must still keep only the group's most likely
    tokens: the numpy reference's count, for p between two tokens' masses (the nucleus' last token
    and the next share a probability)."""
    logits = np.full((1, 3000), -20.0, np.float32)
    logits[0, :2000] = np.float32(-0.4) + np.arange(2000, dtype=np.float32)[::-1] * 1e-7
    assert len(np.unique(logits[0, :2000])) == 2000
    probs = np.asarray(jnp.exp(logits - jax.nn.logsumexp(logits, -1, keepdims=True)))[0, :2000]
    assert len(np.unique(probs)) < 500  # the precondition: groups of equal probability
    inside = np.flatnonzero(probs[:-1] == probs[1:])  # a token and the next share a probability
    for last in (inside[inside >= 600][0], inside[inside >= 1200][0], inside[inside >= 1790][0]):
        top_p = (last + 0.5) / 2000
        got = np.asarray(filtered_logprobs(1.0, 0, top_p, threshold_path)(jnp.asarray(logits)))
        ref = numpy_filtered_logprobs(logits[0], 1.0, 0, top_p)
        assert np.isfinite(ref).sum() == last + 1
        np.testing.assert_array_equal(np.isfinite(got[0]), np.isfinite(ref), err_msg=str(last))


@pytest.mark.reference
def test_sample_categorical_draws_from_the_softmax():
    """Inverse-CDF sampling (one uniform per row) against the exact probabilities: a chi-square
    test on 200,000 draws over a vocabulary that is not a multiple of the block size, with
    tokens at -inf that must never be drawn."""
    from scipy import stats
    vocab = 3 * decoding.SAMPLE_BLOCK + 45
    logits = np.random.RandomState(11).randn(vocab).astype(np.float32) * 2
    logits[::7] = -np.inf                       # masked tokens, in every block
    logits[vocab - 1] = 4.0                     # a likely token in the padded last block
    probs = np.exp(logits.astype(np.float64) - logits.max())
    probs /= probs.sum()
    n_rows, n_keys = 8, 25_000
    draw = jax.jit(jax.vmap(lambda k: decoding.sample_categorical(
        k, jnp.broadcast_to(jnp.asarray(logits), (n_rows, vocab)))))
    keys = jax.random.split(jax.random.key(0), n_keys)
    # Running the 200,000 draws is this test's cost, not compiling them: this one program is
    # compiled at XLA's optimization level 2, not the suite's level 0 (helpers.compile_cache),
    # which runs it 8x slower (measured 4.2 s against 0.5 s, for 0.5 s more compiling).
    draw = draw.lower(keys).compile(compiler_options={"xla_backend_optimization_level": 2})
    tokens = np.asarray(draw(keys)).ravel()
    counts = np.bincount(tokens, minlength=vocab)
    assert counts.shape == (vocab,) and counts[::7].sum() == 0
    support = probs > 0
    expected = probs[support] * tokens.size
    pooled = expected < 5                       # pool rare tokens so the chi-square is valid
    observed = np.append(counts[support][~pooled], counts[support][pooled].sum())
    expected = np.append(expected[~pooled], expected[pooled].sum())
    p_value = stats.chisquare(observed, expected).pvalue
    assert p_value > 1e-4, p_value


def test_sample_categorical_point_masses_and_rows_are_independent():
    """Point-mass rows (at both ends of a block) draw their token, whatever the key; 64
    identical uniform rows (one batch with them, one jitted program) draw > 32 distinct tokens:
    one uniform per row, not one per batch."""
    vocab = 2 * decoding.SAMPLE_BLOCK + 3
    targets = np.array([0, decoding.SAMPLE_BLOCK - 1, decoding.SAMPLE_BLOCK, vocab - 1])
    logits = np.zeros((len(targets) + 64, vocab), np.float32)  # rows 4-67: uniform
    logits[:len(targets)] = -np.inf
    logits[np.arange(len(targets)), targets] = 0.0
    draw = jax.jit(decoding.sample_categorical)
    for seed in range(5):
        got = np.asarray(draw(jax.random.key(seed), jnp.asarray(logits)))
        np.testing.assert_array_equal(got[:len(targets)], targets)
        if seed == 0:  # two identical uniform rows get different draws
            assert len(set(got[len(targets):].tolist())) > 32


def test_min_new_tokens_masks_eos(stopping):
    model, (ids, mask), free, _ = stopping("v1.0")
    eos = model.config.eos_token_id
    assert (np.asarray(free.tokens)[:, :4] == eos).any(), "EOS never early: test is vacuous"
    held = generate(model, ids, mask, rng=None, max_new_tokens=MAX_NEW, min_new_tokens=4,
                    greedy=True)
    assert (np.asarray(held.tokens)[:, :4] != eos).all()
    assert (np.asarray(held.mask)[:, :4] == 1).all()
    sampled = generate(model, ids, mask, rng=jax.random.key(2), max_new_tokens=MAX_NEW,
                       min_new_tokens=MAX_NEW)
    assert (np.asarray(sampled.tokens) != eos).all() and (np.asarray(sampled.mask) == 1).all()


def test_repeated_calls_do_not_retrace():
    ids, mask = batch(6)
    model = make_model("v1.0", seed=6)
    first = generate(model, ids, mask, rng=jax.random.key(0), max_new_tokens=MAX_NEW)
    score(model, ids, mask, first.tokens, first.mask)
    before = traces.counts()
    for seed in range(3):
        got = generate(model, ids, mask, rng=jax.random.key(seed), max_new_tokens=MAX_NEW)
        score(model, ids + seed, mask, got.tokens, got.mask)
    assert traces.counts() == before
    # a new setting is a new program: exactly one more trace
    generate(model, ids, mask, rng=jax.random.key(0), max_new_tokens=MAX_NEW, top_p=0.9)
    assert traces.count("generate") == before["generate"] + 1


def test_bad_sampling_arguments():
    ids, mask = batch(7)
    model = make_model("v1.0")
    for kw, match in [(dict(temperature=0.0), "temperature"), (dict(top_p=0.0), "top_p"),
                      (dict(top_k=-1), "top_k"), (dict(min_new_tokens=20), "min_new_tokens"),
                      (dict(max_new_tokens=0), "max_new_tokens")]:
        args = dict(rng=jax.random.key(0), max_new_tokens=4) | kw
        with pytest.raises(ValueError, match=match):
            generate(model, ids, mask, **args)
    with pytest.raises(ValueError, match="rng"):
        generate(model, ids, mask, rng=None, max_new_tokens=4)
    with pytest.raises(ValueError, match="shape"):
        score(model, ids, mask, ids, mask[:, :3])


def test_per_row_settings_filter_and_draw_as_each_row_alone():
    """`choose_rows`: each row of one batch filtered with its own temperature, top-k (one above
    TOP_K_CANDIDATES: the bisection) and top-p (a flat row: past the candidates) keeps what
    `filter_logits` keeps for that row alone; a row's draw depends on its seed and step only."""
    logits, rows, steps = row_batch()
    got = np.asarray(jax.jit(filter_rows)(logits, rows))
    for i, (ti, ki, pi) in enumerate(ROW_SETTINGS):  # jitted: one program each, not op by op
        want = np.asarray(jax.jit(functools.partial(filter_logits, temperature=ti, top_k=ki,
                                                    top_p=pi))(logits[i:i + 1]))[0]
        np.testing.assert_array_equal(np.isfinite(got[i]), np.isfinite(want), err_msg=str(i))
        np.testing.assert_allclose(got[i][np.isfinite(want)], want[np.isfinite(want)], rtol=1e-6)
    assert np.isfinite(got[2]).sum() > 1000  # the flat row's nucleus is past the candidates
    tokens, _ = choose(logits, rows, steps)
    # the same row, seed and step in another batch (other rows' settings and logits changed)
    other = rows | {"seed": np.asarray([0] + [99] * 5, np.uint32),
                    "top_k": np.asarray([ROW_SETTINGS[0][1]] + [3] * 5, np.int32)}
    changed = logits.copy()
    changed[1:] = 0.0
    alone, _ = choose(changed, other, steps)
    assert int(tokens[0]) == int(alone[0])
    greedy = rows | {"greedy": np.ones(6, bool)}
    np.testing.assert_array_equal(np.asarray(choose(logits, greedy, steps)[0]),
                                  np.argmax(logits, -1))
