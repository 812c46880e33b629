"""`LocalLM`: a Hugging Face decoder-only model folder run locally as a `TextGenerator`.

    lm = LocalLM("models/vicuna-7b", dtype="bfloat16", chat_template="vicuna_v1.1")
    [[answer]] = lm.complete(["Is it wrong to lie?"], Sampling(max_new_tokens=64), seed=0)

It loads the model, its tokenizer and its sampling defaults (generation_config.json: a setting a
caller leaves None is the model's, as in `transformers`); `complete` batches and buckets the rows
so that a stream of calls compiles few programs, and is reproducible given its seed."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from collections.abc import Sequence

import numpy as np
import jax

from clarifyjax.core.buckets import FINE_BUCKETS, bucket_length, length_sorted_batches, pad_rows
from clarifyjax.models.safetensors_io import read_config
from clarifyjax.text.generator import Completion, Prompt, Sampling, cut_at_stop, per_prompt
from clarifyjax.text.tokenizer import CHAT_TEMPLATES, CausalTokenizer
from clarifyjax.models.hf import load_causal_lm, read_generation_defaults
from clarifyjax.decoding.api import generate
from clarifyjax.core.sharding import place_rows, row_shards

DEFAULT_MAX_NEW_TOKENS = 256  # when neither the caller nor generation_config.json says
NEW_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# config.json keys that give a model's context length, by family
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def generation_defaults(folder: str | os.PathLike) -> tuple[Sampling, tuple[int, ...]]:
    """The model's own sampling settings (do_sample false: temperature 0) and its EOS ids."""
    found = read_generation_defaults(folder)
    eos = found["eos_token_ids"]
    defaults = Sampling(
        max_new_tokens=found["max_new_tokens"] or DEFAULT_MAX_NEW_TOKENS, min_new_tokens=0,
        temperature=float(found["temperature"]) if found["do_sample"] else 0.0,
        top_k=int(found["top_k"]), top_p=float(found["top_p"]))
    return defaults, tuple(int(i) for i in ([eos] if isinstance(eos, int) else eos))


def context_length(folder: str | os.PathLike, default: int = 2048) -> int:
    """Positions the model was trained for (config.json), `default` when it names none."""
    config = read_config(folder)
    return int(next((config[k] for k in _CONTEXT_KEYS if isinstance(config.get(k), int)),
                    default))


@dataclasses.dataclass(frozen=True)
class EncodedRow:
    """One row of a `complete` call: prompt `prompt`'s sample `sample`, its ids and settings."""
    prompt: int          # index of the prompt in the call
    sample: int          # which of its n samples
    ids: tuple[int, ...]
    sampling: Sampling


class LocalLM:
    """A causal LM folder as a `TextGenerator` (and `TokenCounter`).

    Args:
      folder: config.json, safetensors weights, the tokenizer files, generation_config.json.
      dtype: parameter and compute dtype ("float32", "bfloat16").
      mesh: shard the weights over it (each device reads its shard) and each batch's rows over
        its data x fsdp devices (batch_size rounded up to a multiple of them), or None. One
        process: on a multi-host run, give each process a mesh of its own devices.
      chat_template: how chats are rendered, one of `tokenizer.CHAT_TEMPLATES`.
      batch_size: most rows (prompts x n) per jitted batch.
      shared_prefix: when every row of a batch starts with the same run of at least this many
        tokens (a few-shot template), that run is computed once for the batch
        (`decoding.generate`'s `prefix_ids`); 0 turns it off.
      raw_bos: a raw (string) prompt gets the tokenizer's special tokens (BOS); False tokenizes
        it as transformers' text-generation `pipeline` did before 4.43 (no special tokens).
    """

    def __init__(self, folder: str | os.PathLike, *, dtype: str = "float32", mesh=None,
                 chat_template: str = "model", batch_size: int = 32,
                 buckets: Sequence[int] = FINE_BUCKETS, name: str | None = None,
                 shared_prefix: int = 16, raw_bos: bool = True):
        if chat_template not in CHAT_TEMPLATES:
            raise ValueError(f"chat_template must be one of {list(CHAT_TEMPLATES)}, got "
                             f"{chat_template!r}")
        self.folder = Path(folder)
        self.name = name or self.folder.resolve().name
        self.chat_template, self.batch_size, self.buckets = chat_template, batch_size, buckets
        self.shared_prefix = int(shared_prefix)
        self.raw_bos = bool(raw_bos)
        self.tokenizer = CausalTokenizer(folder)
        self.defaults, eos = generation_defaults(folder)
        self.eos_ids = tuple(sorted(set(eos) | ({self.tokenizer.eos_id}
                                                if self.tokenizer.eos_id is not None else set())))
        self.context_length = context_length(folder)
        self.dtype, self.mesh = dtype, mesh
        self._model = None
        self._stop_cache: dict[tuple[str, ...], tuple[int, ...]] = {}

    def load(self) -> LocalLM:
        """Read the weights (done by the first `complete`; the tokenizer alone checks prompts)."""
        if self._model is None:
            self.config, self._model = load_causal_lm(self.folder, dtype=self.dtype,
                                                      mesh=self.mesh)
        return self

    @property
    def model(self):
        return self.load()._model

    # -- prompts ------------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        return self.tokenizer.encode(prompt, self.chat_template, raw_bos=self.raw_bos)

    def count_tokens(self, prompt: Prompt) -> int:
        return len(self.encode(prompt))

    def stop_token_ids(self, stop: tuple[str, ...]) -> tuple[int, ...]:
        """EOS and the stop strings that are one token (they end the loop early)."""
        return self._stop_ids(stop)

    def _stop_ids(self, stop: tuple[str, ...]) -> tuple[int, ...]:
        if stop not in self._stop_cache:
            self._stop_cache[stop] = self._find_stop_ids(stop)
        return self._stop_cache[stop]

    def _find_stop_ids(self, stop: tuple[str, ...]) -> tuple[int, ...]:
        single = set()
        for s in stop:
            ids = self.tokenizer.encode(s)
            ids = ids[1:] if ids and ids[0] == self.tokenizer.bos_id else ids
            if len(ids) == 1 and self.tokenizer.decode(ids) == s:
                single.add(ids[0])
        return tuple(sorted(set(self.eos_ids) | single))

    # -- generation ---------------------------------------------------------------------------

    def complete(self, prompts: Sequence[Prompt], sampling: Sampling | Sequence[Sampling],
                 n: int | Sequence[int] = 1, seed: int | None = None
                 ) -> list[list[Completion]]:
        """`n` completions of each prompt (see `textgen.TextGenerator`). ValueError naming the
        prompt for one that cannot be rendered or does not fit the context.

        Rows (each prompt times its `n`) are grouped by sampling settings (each a jitted program)
        and by the bucket of their `max_new_tokens`, sorted by length and cut into batches of
        `batch_size` (a short one padded), each left-padded to a length bucket: a stream of calls
        compiles a handful of programs, the same for `generate` and `serve`. A one-token stop
        string also stops the jitted loop; every stop string cuts the text afterwards. Batch k
        draws from a key of (seed, k), so the same call and seed give the same completions."""
        rows, counts = self.prompt_rows(prompts, sampling, n)
        return self.run_rows(rows, counts, seed)

    def run_rows(self, rows: Sequence[EncodedRow], counts: Sequence[int],
                 seed: int | None = None) -> list[list[Completion]]:
        """The completions of rows already encoded and checked (`prompt_rows`, or a caller with
        its own tokenization rule, as the lm-eval model), batched as `complete` says; `counts`
        is the number of rows of each prompt."""
        results: list[list[Completion | None]] = [[None] * c for c in counts]
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        for k, batch in enumerate(self._batches(list(rows))):
            for row, completion in zip(batch, self._run(batch, _batch_seed(seed, k))):
                results[row.prompt][row.sample] = completion
        return results

    def prompt_rows(self, prompts: Sequence[Prompt], sampling: Sampling | Sequence[Sampling],
                    n: int | Sequence[int] = 1) -> tuple[list[EncodedRow], list[int]]:
        """The rows of a `complete` call, before any runs: each prompt's token ids and settings
        (the model's defaults filled in), `n` rows each, checked against the context -> (rows,
        n per prompt). ValueError naming the prompt."""
        prompts = list(prompts)
        settings = [s.with_defaults(self.defaults)
                    for s in per_prompt(sampling, len(prompts), "sampling")]
        counts = per_prompt(n, len(prompts), "n")
        rows = []
        for i, (prompt, s, count) in enumerate(zip(prompts, settings, counts)):
            try:
                ids = tuple(self.encode(prompt))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from e
            if len(ids) + s.max_new_tokens > self.context_length:
                raise ValueError(f"prompt {i}: {len(ids)} tokens + max_new_tokens "
                                 f"{s.max_new_tokens} is more than the context length of "
                                 f"{self.context_length}")
            rows += [EncodedRow(i, j, ids, s) for j in range(count)]
        return rows, counts

    def _group_key(self, s: Sampling) -> tuple:
        sampled = () if s.greedy else (s.temperature, s.top_k, s.top_p)
        return (s.greedy, sampled, s.min_new_tokens,
                bucket_length(s.max_new_tokens, NEW_TOKEN_BUCKETS), self._stop_ids(s.stop))

    def _batches(self, rows: list[EncodedRow]) -> list[list[EncodedRow]]:
        groups: dict[tuple, list[EncodedRow]] = {}
        for row in rows:
            groups.setdefault(self._group_key(row.sampling), []).append(row)
        batches = []
        for key in sorted(groups, key=repr):  # the same call, the same order of batches
            group = groups[key]
            for index in length_sorted_batches([len(r.ids) for r in group], self.batch_size):
                batches.append([group[i] for i in index])
        return batches

    def _run(self, batch: list[EncodedRow], seed_state: int) -> list[Completion]:
        s = batch[0].sampling
        greedy, _, min_new, max_new, stop_ids = self._group_key(s)
        prefix = _common_prefix([r.ids for r in batch])
        if self.shared_prefix <= 0 or len(prefix) < self.shared_prefix:
            prefix = ()
        own = [r.ids[len(prefix):] for r in batch]
        longest = max(len(r.ids) for r in batch)
        # The bucket may run past the context (a learned position table has no row there, and
        # generate refuses it): then as far as the context goes, or at least what a row asked.
        max_new = max(min(max_new, self.context_length - longest),
                      max(r.sampling.max_new_tokens for r in batch))
        width = bucket_length(longest - len(prefix), self.buckets)
        ids = np.full((len(batch), width), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((len(batch), width), np.int32)
        for i, row in enumerate(own):  # left padding: every row's prompt ends at the edge
            ids[i, width - len(row):] = row
            mask[i, width - len(row):] = 1
        # Every batch has batch_size rows (a short one repeats its last row): one program per
        # (prompt bucket, new-token bucket, settings), shared by the CLI and the server.
        rows = self.batch_size
        ids, mask = pad_rows(ids, rows), pad_rows(mask, rows)
        if self.mesh is not None:  # rows split over the mesh's data x fsdp devices
            rows = -(-rows // row_shards(self.mesh)) * row_shards(self.mesh)
            ids, mask = (place_rows(pad_rows(x, rows), self.mesh) for x in (ids, mask))
        out = generate(self.model, ids, mask,
                       rng=jax.random.key(seed_state), max_new_tokens=max_new,
                       min_new_tokens=min_new, greedy=greedy,
                       temperature=1.0 if greedy else s.temperature,
                       top_k=0 if greedy else s.top_k, top_p=1.0 if greedy else s.top_p,
                       stop_token_ids=stop_ids, prefix_ids=list(prefix) or None)
        tokens, logprobs, kept = (np.asarray(a) for a in (out.tokens, out.logprobs, out.mask))
        return [self.completion(tokens[i], logprobs[i], kept[i], row.sampling, stop_ids)
                for i, row in enumerate(batch)]

    def completion(self, tokens, logprobs, kept, s: Sampling, stop_ids) -> Completion:
        """One row's Completion from its tokens, log-probs and mask [n] (as `generate` gives
        them), its settings and the ids that stopped it: text decoded and cut at the first stop
        string (its tokens and log-probs with it)."""
        length = int(kept.sum())
        stopped = length > 0 and int(tokens[length - 1]) in stop_ids
        if length > s.max_new_tokens:  # the group ran to its bucket; this row asked for fewer
            length, stopped = s.max_new_tokens, False
        ids = [int(t) for t in tokens[:length]]
        if stopped and ids[-1] not in self.eos_ids:
            stopped = False  # a one-token stop string: cut below, like any other
        text = self.tokenizer.decode(ids)
        cut = cut_at_stop(text, s.stop)
        if cut is not None:
            text, stopped = text[:cut], True
            keep = 0  # the tokens whose text lies wholly before the cut
            while keep < len(ids) and len(self.tokenizer.decode(ids[:keep + 1])) <= cut:
                keep += 1
            ids = ids[:keep]
        return Completion(text, tuple(ids), tuple(float(x) for x in logprobs[:len(ids)]),
                          "stop" if stopped else "length",
                          tuple(self.tokenizer.token_texts(ids)))


def _common_prefix(rows: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The leading tokens every row shares, leaving each row at least one of its own."""
    return tuple(os.path.commonprefix(rows))[:min(len(r) for r in rows) - 1]


def _batch_seed(seed: int, batch: int) -> int:
    """A 32-bit key seed for batch `batch` of a call seeded `seed` (any int, as OpenAI's)."""
    return int(np.random.SeedSequence([seed % 2 ** 64, batch]).generate_state(1)[0])
