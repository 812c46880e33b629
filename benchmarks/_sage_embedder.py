"""Part (d) of benchmarks/sage_pipeline.py, the sentence embedder on the vicuna pairs file's texts
against the jitted matmul rate at the model's shapes and against plain `transformers`, with the
encoder FLOP count and the matmul rates that part (b) uses too (`bench_embedder` says how)."""
from __future__ import annotations

import os
import time

import numpy as np

from sage import best_of, load_average

PAIRS_FILE = "../shared/data/sage-mcc/vicuna-7b-v1.5_pairs_0.csv"


def pairs_file_texts(n_questions: int | None) -> list[str]:
    """The distinct answers and rules of thumb of the vicuna pairs file (what SaGE embeds)."""
    from clarifyjax.files.tables import resolve_data_path
    from sage_jax import data

    questions = data.read_questions(resolve_data_path(PAIRS_FILE), need=("answer", "rot"))[:n_questions]
    return data.shared_texts(data.text_batch(questions, "answer"), data.text_batch(questions, "rot"))[0]


def encoder_flops(config, rows: int, length: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of the encoder's forward on `rows` sequences of `length`
    tokens: per layer and token, the Q, K, V and output projections (4 x 2 d^2) and the MLP
    (2 x 2 d f); per layer and sequence, the attention scores and the context (2 x 2 s^2 d).
    Embedding lookups, LayerNorm, softmax, GELU and pooling are not counted (no matmul)."""
    d, f, s = config.hidden_size, config.intermediate_size, length
    per_layer = 8 * s * d * d + 4 * s * d * f + 4 * s * s * d
    return rows * config.num_layers * per_layer


def matmul_rates(config, rows: int, length: int, repeats: int) -> dict:
    """FLOP/s of jitted float32 matmuls: at the shapes of one encoder layer on a [rows, length]
    batch (each product timed alone, best of `repeats`; the rate is the layer's FLOPs over the sum
    of the times, i.e. weighted as the model weights them), and a square 1024^3 product."""
    import jax
    import jax.numpy as jnp

    d, f, h = config.hidden_size, config.intermediate_size, config.num_heads
    m = rows * length
    key = iter(jax.random.split(jax.random.PRNGKey(0), 16))
    arr = lambda *shape: jax.random.normal(next(key), shape, jnp.float32)  # noqa: E731
    dot = jax.jit(jnp.dot)
    # the attention products as the encoder runs them (`encoder.SelfAttention`): [b, h, s, k]
    scores = jax.jit(lambda q, k: jnp.einsum("bhqk,bhsk->bhqs", q, k))
    context = jax.jit(lambda p, v: jnp.einsum("bhqs,bhsk->bhqk", p, v))
    qkv = arr(rows, h, length, d // h)
    cases = {  # name: (function, arguments, FLOPs, times per layer)
        "projection [m, d] x [d, d]": (dot, (arr(m, d), arr(d, d)), 2 * m * d * d, 4),
        "mlp in [m, d] x [d, f]": (dot, (arr(m, d), arr(d, f)), 2 * m * d * f, 1),
        "mlp out [m, f] x [f, d]": (dot, (arr(m, f), arr(f, d)), 2 * m * f * d, 1),
        "attention scores": (scores, (qkv, qkv), 2 * rows * length * length * d, 1),
        "attention context": (context, (arr(rows, h, length, length), qkv), 2 * rows * length * length * d, 1),
    }
    out, total_flops, total_s = {}, 0, 0.0
    for name, (fn, args, flops, count) in cases.items():
        t, _, _ = best_of(lambda fn=fn, args=args: jax.block_until_ready(fn(*args)), repeats + 1)
        out[name] = {"flops": flops, "best_s": t, "gflop_per_s": flops / t / 1e9, "per_layer": count}
        total_flops += count * flops
        total_s += count * t
    a, b = arr(1024, 1024), arr(1024, 1024)
    t_square, _, _ = best_of(lambda: jax.block_until_ready(dot(a, b)), repeats + 1)
    return {"batch_shape": [rows, length], "products": out, "model_shapes_flop_per_s": total_flops / total_s,
            "square_1024_flop_per_s": 2 * 1024 ** 3 / t_square}


def torch_peer(folder, batches, normalize: bool):
    """The sentence-transformers-style forward in plain `transformers`: AutoModel on the same
    padded batches, mean pooling over the mask, L2 normalization."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    batches = [(index, torch.from_numpy(np.asarray(ids)), torch.from_numpy(np.asarray(mask)))
               for index, ids, mask in batches]

    def run():
        out = []
        with torch.inference_mode():
            for index, ids, mask in batches:
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
                m = mask[..., None].float()
                vectors = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                if normalize:
                    vectors = torch.nn.functional.normalize(vectors, dim=-1)
                out.append((index, vectors[:len(index)].numpy()))
        return out
    return run


def attention_vs_peer(embedder, folder, shape: tuple[int, int], repeats: int) -> dict:
    """The attention block of layer 0 (self-attention, output projection, residual, LayerNorm:
    transformers' `BertAttention`) on the same hidden states [rows, length] (the last tenth of
    each row padding), ours jitted against transformers' (its default SDPA) at the same threads;
    and the largest difference of their outputs."""
    import jax
    import jax.numpy as jnp
    import torch
    import transformers
    from flax import nnx

    rows, length = shape
    layer = nnx.merge(embedder._graphdef, embedder._state).layers[0]
    graphdef, state = nnx.split(layer)
    x = jax.random.normal(jax.random.PRNGKey(1), (rows, length, embedder.config.hidden_size))
    mask = jnp.arange(length)[None, :] < length - max(1, length // 10)
    mask = jnp.broadcast_to(mask, (rows, length))

    @jax.jit
    def ours(state, x, mask):
        block = nnx.merge(graphdef, state)
        return block.attention_norm(x + block.attention(x, mask))

    peer = transformers.AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    block = peer.encoder.layer[0].attention
    tx = torch.from_numpy(np.asarray(x))
    additive = (~torch.from_numpy(np.asarray(mask)))[:, None, None, :].float() * torch.finfo(
        torch.float32).min

    def theirs():
        with torch.inference_mode():
            out = block(tx, attention_mask=additive)
            return out[0] if isinstance(out, tuple) else out

    t_ours, _, got = best_of(lambda: jax.block_until_ready(ours(state, x, mask)), repeats + 1)
    t_peer, _, want = best_of(theirs, repeats + 1)
    return {"shape": [rows, length], "ours_s": t_ours, "peer_s": t_peer,
            "speedup_vs_peer": t_peer / t_ours,
            "max_abs_diff": float(np.max(np.abs(np.asarray(got) - want.numpy()))),
            "peer": f"transformers BertAttention ({peer.config._attn_implementation})"}


def embed_steps(embedder, texts: list[str], batch_size: int):
    """The embed call in its steps (the same work as `embed()`, timed apart): (seconds per step,
    the padded batches, the vectors)."""
    import jax

    t0 = time.perf_counter()
    encodings = embedder._encode(texts)
    t1 = time.perf_counter()
    batches = list(embedder._batches(encodings, batch_size))
    t2 = time.perf_counter()
    outs = [embedder._pooled(embedder._state, ids, mask) for _, ids, mask in batches]
    t3 = time.perf_counter()
    jax.block_until_ready(outs)
    t4 = time.perf_counter()
    vectors = [np.asarray(v) for v in outs]
    t5 = time.perf_counter()
    return {"tokenize_s": t1 - t0, "pad_batches_s": t2 - t1, "dispatch_s": t3 - t2,
            "forward_wait_s": t4 - t3, "copy_to_host_s": t5 - t4}, batches, vectors


def median_flop_shape(config, batches, padded: int) -> tuple[int, int]:
    """The batch shape that carries the median FLOP of `batches` (`padded`: their total)."""
    by_flops = sorted((encoder_flops(config, *ids.shape), ids.shape) for _, ids, _ in batches)
    cumulative, median_shape = 0, by_flops[-1][1]
    for flops, shape in by_flops:
        cumulative += flops
        if cumulative >= padded / 2:
            median_shape = shape
            break
    return median_shape


def bench_embedder(n_questions: int | None, repeats: int, reference_repeats: int, batch_size: int = 64) -> dict:
    """(d): our sentence embedder on the pairs file's own texts, its FLOP rate against the jitted
    matmul rate at the model's shapes, and the same forward in `transformers` on the same batches.

    The texts: the distinct answers and rules of thumb of the vicuna pairs file. The FLOP rate is
    counted at each text's real length and at the padded batch shapes, against the jitted float32
    matmul rate at the model's own shapes (one layer's products on the batch shape carrying the
    median FLOP), with the square 1024^3 rate for comparison; the embed call is split into its
    steps (tokenize, pad, dispatch, forward, copy back); the peer is plain `transformers`
    (AutoModel + mean pooling) on the same padded batches, same threads."""
    import jax
    import torch

    from clarifyjax.models.embedder import SentenceEmbedder, default_embedder_path, read_sentence_transformers_folder
    from clarifyjax.models.encoder import chunk_rows

    load_start = load_average()
    texts = pairs_file_texts(n_questions)
    embedder = SentenceEmbedder.from_pretrained()
    config = embedder.config
    t_first, _, _ = best_of(lambda: embedder.embed(texts, batch_size=batch_size), 1)  # compiles every bucket

    split, batches, _ = embed_steps(embedder, texts, batch_size)
    lengths = [len(e.ids) for e in embedder._encode(texts)]
    padded = sum(encoder_flops(config, *ids.shape) for _, ids, _ in batches)
    real = sum(encoder_flops(config, 1, n) for n in lengths)
    folder, _, normalize = read_sentence_transformers_folder(default_embedder_path())
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    peer = torch_peer(folder, batches, normalize)
    forward = lambda: jax.block_until_ready(  # noqa: E731
        [embedder._pooled(embedder._state, ids, mask) for _, ids, mask in batches])
    median_shape = median_flop_shape(config, batches, padded)  # the matmul rate is measured at it
    ours_times, forward_times, peer_times, round_rates, run_rates = [], [], [], [], []
    for r in range(max(repeats, reference_repeats)):  # interleaved: the same load for each, the rate too
        ours_times.append(best_of(lambda: embedder.embed(texts, batch_size=batch_size), 1)[0])
        forward_times.append(best_of(forward, 1)[0])
        round_rates.append(matmul_rates(config, *median_shape, repeats=2))
        run_rates.append(matmul_rates(config, chunk_rows(*median_shape), median_shape[1], repeats=2))
        if r < reference_repeats:
            peer_times.append(best_of(peer, 1)[0])
    attention = attention_vs_peer(embedder, folder, median_shape, max(repeats, 3))
    run_rate = max(r["model_shapes_flop_per_s"] for r in run_rates)
    rates = max(round_rates, key=lambda x: x["model_shapes_flop_per_s"])
    rates["model_shapes_flop_per_s_by_round"] = [x["model_shapes_flop_per_s"] for x in round_rates]
    t_ours, t_forward, t_peer = min(ours_times), min(forward_times), min(peer_times)
    rate = rates["model_shapes_flop_per_s"]
    return {
        "part": "d", "texts": len(texts), "questions": n_questions or "all", "file": PAIRS_FILE,
        "model": "all-MiniLM-L6-v2", "batch_size": batch_size, "batches": len(batches),
        "tokens": sum(lengths), "padded_tokens": int(sum(ids.size for _, ids, _ in batches)),
        "flops_counted": "matmuls only, 2 per multiply-add: per layer 8 s d^2 (Q, K, V, output) + "
                         "4 s d f (MLP) + 4 s^2 d (scores, context) per sequence of s tokens; "
                         "padded = at the batches' padded shapes, real = at each text's own length",
        "flops_padded": padded, "flops_real": real,
        "ours_embed_s": t_ours, "ours_embed_times_s": ours_times, "ours_compile_s": max(t_first - t_ours, 0.0),
        "ours_forward_s": t_forward, "ours_forward_times_s": forward_times, "ours_split_s": split,
        "matmul": rates,
        "fraction_of_matmul_rate": real / t_ours / rate,
        "fraction_padded_forward": padded / t_forward / rate,
        "fraction_of_square_matmul_rate": real / t_ours / rates["square_1024_flop_per_s"],
        "run_shapes": f"the forward runs {chunk_rows(*median_shape)} rows at a time "
                      "(encoder.chunk_rows) on one CPU device; its products' rate at those shapes",
        "matmul_run_shapes_flop_per_s": run_rate,
        "fraction_of_matmul_rate_at_run_shapes": real / t_ours / run_rate,
        "fraction_padded_forward_at_run_shapes": padded / t_forward / run_rate,
        "peer": "transformers AutoModel forward + mean pooling + normalize, same padded batches, "
                f"torch threads {threads}",
        "peer_forward_s": t_peer, "peer_forward_times_s": peer_times,
        "speedup_forward_vs_peer": t_peer / t_forward,
        "attention_block": attention,
        "load_average": {"start": load_start, "end": load_average()},
    }
