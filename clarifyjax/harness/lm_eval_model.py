"""`ClarifyJaxLM`: lm-evaluation-harness 0.4.13's model interface over `clarifyjax.decoding`, for
any decoder-only folder `load_causal_lm` reads; importing this module registers it as the model
"clarifyjax" (`lm_eval.simple_evaluate(model="clarifyjax", model_args="pretrained=DIR")`).

Requests are tokenized as lm-eval's `hf` model tokenizes them (its `TemplateLM` rules, the same
`transformers` tokenizer, BOS and truncation rules) and its text is cut as `hf` cuts it; scoring
runs in jitted batches of one (prompt bucket, continuation bucket) shape each, and generation
through `LocalLM` (length buckets, a shared few-shot prefix run once, one-token stops)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import jinja2
import lm_eval.models  # noqa: F401  (the built-in models, registered before ours)
import numpy as np
import jax
from lm_eval import utils as lm_eval_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from lm_eval.models.utils import (
    handle_stop_sequences,
    has_bos_prefix,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from flax import nnx
from transformers import AutoTokenizer

from clarifyjax.core.buckets import bucket_length, bucket_rows, pad_rows
from clarifyjax.core.sharding import MeshConfig, place_rows, process_mesh, row_shards
from clarifyjax.decoding.api import score, score_after_prefixes
from clarifyjax.decoding.local_lm import EncodedRow, LocalLM, context_length
from clarifyjax.models.safetensors_io import read_config
from clarifyjax.models.state import DTYPES
from clarifyjax.text.generator import Completion, Sampling

# generation arguments of a task's `generation_kwargs` that this model honours (lm-eval's
# normalize_gen_kwargs turns max_new_tokens / max_tokens into max_gen_toks first)
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")


class HarnessGenerator(LocalLM):
    """`LocalLM` whose completions keep every generated token and decode as lm-eval's `hf` model
    does (`skip_special_tokens`, the tokenizer's own clean-up); the stop strings are cut later."""

    def __init__(self, folder, decode, **kwargs):
        super().__init__(folder, **kwargs)
        self.decode_text = decode

    def completion(self, tokens, logprobs, kept, s: Sampling, stop_ids) -> Completion:
        length = min(int(kept.sum()), s.max_new_tokens)
        ids = tuple(int(t) for t in tokens[:length])
        return Completion(self.decode_text(ids), ids, tuple(float(x) for x in logprobs[:length]),
                          "length")


class ClarifyJaxLM(TemplateLM):
    """lm-eval's model "clarifyjax". Model arguments (`--model_args k=v,...`):

    pretrained: the folder (config.json, safetensors, tokenizer files). tokenizer: another
    tokenizer folder. dtype: float32, bfloat16, float16 or "auto" (config.json's torch_dtype).
    batch_size: rows per jitted batch ("auto": 32). max_length: the context of scoring and
    generation (default: the folder's positions, as `hf`). max_gen_toks: new tokens when a task
    names none (256). add_bos_token, prefix_token_id, chat_template_args: as `hf`. mesh_data,
    mesh_fsdp, mesh_model: the device mesh (`core.sharding.MeshConfig`; default: every device
    on the data axis). shared_prefix: see `LocalLM`. seed: of sampled generations. device and
    max_batch_size are ignored (lm-eval passes them to every model).
    """

    def __init__(self, pretrained: str, tokenizer: str | None = None, dtype: str = "float32",
                 batch_size: int | str | None = 16, max_length: int | None = None,
                 max_gen_toks: int = 256, add_bos_token: bool | None = None,
                 prefix_token_id: int | None = None, chat_template_args: dict | None = None,
                 mesh_data: int = -1, mesh_fsdp: int = 1, mesh_model: int = 1,
                 shared_prefix: int = 16, seed: int = 1234, device: str | None = None,
                 max_batch_size: int | None = None, **unknown):
        super().__init__()
        if unknown:
            raise ValueError(f"model clarifyjax: unknown model argument(s) {sorted(unknown)}; "
                             "see `help(clarifyjax.harness.lm_eval_model.ClarifyJaxLM)`")
        folder = str(pretrained)
        if not os.path.isdir(folder):
            raise ValueError(f"model clarifyjax: pretrained={folder} is not a folder")
        self.pretrained = folder
        dtype = _dtype(folder, dtype)
        self.batch_size_per_device = (32 if str(batch_size).startswith("auto")  # auto, auto:N
                                      else int(batch_size or 16))
        if self.batch_size_per_device < 1:
            raise ValueError(f"model clarifyjax: batch_size must be >= 1, got {batch_size}")
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        self.chat_template_args = dict(chat_template_args or {})
        self.seed = int(seed)
        self._max_gen_toks = int(max_gen_toks)
        kwargs = {} if add_bos_token is None else {"add_bos_token": bool(add_bos_token)}
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or folder, use_fast=True,
                                                       **kwargs)
        self._max_length = int(max_length) if max_length else context_length(folder)
        self.mesh = _mesh(int(mesh_data), int(mesh_fsdp), int(mesh_model))
        self.generator = HarnessGenerator(
            folder, self.tok_decode, dtype=dtype, mesh=self.mesh, name=os.path.basename(folder),
            batch_size=self.rows, shared_prefix=int(shared_prefix))
        self.generator.load()

    # -- what lm-eval reads ---------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return int(self.custom_prefix_token_id)
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self.batch_size_per_device

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def get_model_info(self) -> dict:
        params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(self.generator.model)))
        return {"model_num_parameters": params, "model_dtype": self.generator.dtype}

    # -- tokens ---------------------------------------------------------------------------------

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   left_truncate_len: int | None = None, **kwargs) -> list[int]:
        """`hf`'s rule: the tokenizer's special tokens unless told, none when the text already
        starts with the prefix token's text."""
        special = add_special_tokens if add_special_tokens is not None else self.add_bos_token
        if add_special_tokens is None and has_bos_prefix(
                string, self.tokenizer.decode(self.prefix_token_id)):
            special = False
        ids = self.tokenizer.encode(string, **({} if special is None
                                               else {"add_special_tokens": special}))
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def generation_ids(self, context: str) -> list[int]:
        """A generation context's ids, as `hf`'s `tok_batch_encode` gives them (its BOS rule)."""
        if has_bos_prefix(context, getattr(self.tokenizer, "bos_token", None)):
            special = {"add_special_tokens": False}
        elif self.add_bos_token is not None:
            special = {"add_special_tokens": self.add_bos_token}
        else:
            special = {}
        return self.tokenizer(context, **special)["input_ids"]

    def tok_decode(self, tokens, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """`hf`'s: the tokenizer's template; a template that refuses a system turn without it."""
        def render(history):
            return self.tokenizer.apply_chat_template(
                history, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt, **self.chat_template_args)

        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:
            return render([m for m in chat_history if m["role"] != "system"])

    # -- scoring --------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,
                              **kwargs) -> list[tuple[float, bool]]:
        """(log p(continuation | context), whether greedy decoding gives it) of each
        (cache key, context ids, continuation ids); the sequence cut from the left to
        max_length + 1 tokens, as `hf` cuts it."""
        rows = []
        for _, context, continuation in requests:
            if not context or not continuation:
                raise ValueError("model clarifyjax: a request has an empty context or continuation")
            if len(continuation) > self.max_length:
                raise ValueError(f"model clarifyjax: a continuation of {len(continuation)} tokens "
                                 f"is longer than max_length {self.max_length}")
            whole = (list(context) + list(continuation))[-(self.max_length + 1):]
            rows.append((whole[:-len(continuation)], list(continuation)))
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        # A context of >= 2 tokens (a question's, shared by its choices) runs once per batch
        # (`decoding.score_after_prefixes`); the rest (rolling windows) row by row.
        shared = [i for i, (prompt, _) in enumerate(rows) if len(prompt) >= 2]
        alone = [i for i, (prompt, _) in enumerate(rows) if len(prompt) < 2]
        for chunk, run in [(c, self._score_shared) for c in self._score_batches(rows, shared, 1)] + \
                          [(c, self._score_chunk) for c in self._score_batches(rows, alone, 0)]:
            for i, answer in zip(chunk, run([rows[i] for i in chunk])):
                out[i] = answer
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
        return out

    def _score_batches(self, rows, indices: list[int], cut: int) -> list[list[int]]:
        """`indices` in batches of one (bucket of the prompt less its last `cut` tokens, bucket
        of the continuation) each; in a batch, the rows of one prompt next to each other."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i in indices:
            prompt, target = rows[i]
            key = (bucket_length(len(prompt) - cut), bucket_length(len(target)))
            groups.setdefault(key, []).append(i)
        batches = []
        for key in sorted(groups, reverse=True):
            group = sorted(groups[key], key=lambda i: (-len(rows[i][0]), rows[i][0]))
            batches += [group[at:at + self.rows] for at in range(0, len(group), self.rows)]
        return batches

    def _score_shared(self, rows) -> list[tuple[float, bool]]:
        """A batch whose prompts are shared prefixes (each but its last token) run once each,
        and each row the prompt's last token then its continuation."""
        prefixes = list(dict.fromkeys(tuple(p[:-1]) for p, _ in rows))
        at = {prefix: k for k, prefix in enumerate(prefixes)}
        p_len = bucket_length(max(map(len, prefixes)))
        t_len = bucket_length(max(len(t) for _, t in rows))
        pad = self.generator.tokenizer.pad_id
        prefix_ids = np.full((len(prefixes), p_len), pad, np.int32)
        prefix_mask = np.zeros_like(prefix_ids)
        for k, prefix in enumerate(prefixes):
            prefix_ids[k, p_len - len(prefix):], prefix_mask[k, p_len - len(prefix):] = prefix, 1
        inputs = np.full((len(rows), t_len), pad, np.int32)
        targets, mask = np.zeros_like(inputs), np.zeros_like(inputs)
        for r, (prompt, target) in enumerate(rows):  # the prompt's last token predicts target[0]
            n = len(target)
            inputs[r, :n], targets[r, :n], mask[r, :n] = [prompt[-1], *target[:-1]], target, 1
        which = np.array([at[tuple(p[:-1])] for p, _ in rows], np.int32)
        n_prefixes = bucket_rows(len(prefixes), self.rows)
        arrays = [pad_rows(a, self.rows) for a in (which, inputs, mask, targets, mask)]
        if self.mesh is not None:
            arrays = [place_rows(a, self.mesh) for a in arrays]
        logp, greedy = score_after_prefixes(
            self.generator.model, pad_rows(prefix_ids, n_prefixes),
            pad_rows(prefix_mask, n_prefixes), *arrays)
        return self._answers(logp, greedy, len(rows))

    @staticmethod
    def _answers(logp, greedy, n: int) -> list[tuple[float, bool]]:
        logp, greedy = np.asarray(logp, np.float64), np.asarray(greedy)
        return [(float(logp[r].sum()), bool(greedy[r].all())) for r in range(n)]

    @property
    def rows(self) -> int:
        """Rows of every batch: batch_size per data x fsdp device (a short scoring batch is
        filled up), so that each (prompt, continuation) bucket compiles one program."""
        return self.batch_size_per_device * row_shards(self.mesh)

    def _score_chunk(self, rows) -> list[tuple[float, bool]]:
        p_len = bucket_length(max(len(p) for p, _ in rows))
        t_len = bucket_length(max(len(t) for _, t in rows))
        prompts = np.full((len(rows), p_len), self.generator.tokenizer.pad_id, np.int32)
        p_mask = np.zeros_like(prompts)
        targets = np.zeros((len(rows), t_len), np.int32)
        t_mask = np.zeros_like(targets)
        for r, (prompt, target) in enumerate(rows):
            prompts[r, p_len - len(prompt):], p_mask[r, p_len - len(prompt):] = prompt, 1
            targets[r, :len(target)], t_mask[r, :len(target)] = target, 1
        arrays = [pad_rows(a, self.rows) for a in (prompts, p_mask, targets, t_mask)]
        if self.mesh is not None:
            arrays = [place_rows(a, self.mesh) for a in arrays]
        logp, greedy = score(self.generator.model, *arrays, greedy=True)
        return self._answers(logp, greedy, len(rows))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood over `hf`'s disjoint rolling windows of max_length."""
        windows, owner = [], []
        for i, (text,) in enumerate(r.args for r in requests):
            for window in lm_eval_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1):
                windows.append((None, *lm_eval_utils.make_disjoint_window(window)))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=True)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owner, scores):
            totals[i] += logp
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # -- generation -----------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each context's continuation, cut at the first of its `until` strings (and EOS), as
        `hf` generates it: the context cut from the left to max_length - max_gen_toks."""
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        rows, stops = [], []
        for i, (context, gen_kwargs) in enumerate(r.args for r in requests):
            kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            sampling = self._sampling(kwargs, until)
            room = self.max_length - sampling.max_new_tokens
            if room <= 0:
                raise ValueError(f"model clarifyjax: max_gen_toks {sampling.max_new_tokens} "
                                 f"leaves no room for a context in max_length {self.max_length}")
            ids = tuple(self.generation_ids(context)[-room:])
            rows.append(EncodedRow(i, 0, ids, sampling.with_defaults(self.generator.defaults)))
            stops.append(until)
        completions = self.generator.run_rows(rows, [1] * len(rows), seed=self.seed)
        out = []
        for request, (completion,), until in zip(requests, completions, stops):
            text = postprocess_generated_text(completion.text, until, None)
            self.cache_hook.add_partial("generate_until", request.args, text)
            out.append(text)
        return out

    def _sampling(self, kwargs: dict, until: Sequence[str]) -> Sampling:
        """A request's settings; its stop strings of one token end the jitted loop early."""
        unknown = sorted(set(kwargs) - set(GEN_KWARGS))
        if unknown:
            raise ValueError(f"model clarifyjax: generation argument(s) {unknown} are not "
                             f"supported (only {', '.join(GEN_KWARGS)})")
        temperature = float(kwargs.get("temperature") or 0.0)
        sampled = bool(kwargs.get("do_sample")) and temperature > 0.0
        one_token = [s for s in until if s and len(self.generator.stop_token_ids((s,))) >
                     len(self.generator.eos_ids)][:4]
        return Sampling(max_new_tokens=int(kwargs["max_gen_toks"]), min_new_tokens=0,
                        temperature=temperature if sampled else 0.0,
                        top_k=kwargs.get("top_k") if sampled else None,
                        top_p=kwargs.get("top_p") if sampled else None, stop=tuple(one_token))


def _dtype(folder: str, dtype: str) -> str:
    if dtype == "auto":
        found = read_config(folder).get("torch_dtype")
        return found if found in DTYPES else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"model clarifyjax: dtype must be one of {DTYPES} or auto, got {dtype!r}")
    return dtype


def _mesh(data: int, fsdp: int, model: int):
    """None on one device with the default layout; else this process's devices as a mesh."""
    if jax.local_device_count() == 1 and (data, fsdp, model) in ((-1, 1, 1), (1, 1, 1)):
        return None
    return process_mesh(MeshConfig(data=data, fsdp=fsdp, model=model))


if "clarifyjax" not in model_registry:
    model_registry.register("clarifyjax", target=ClarifyJaxLM)
