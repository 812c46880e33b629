"""A fake text generator and ParaScore for pipeline tests: deterministic in (prompt, seed), fast,
and able to misbehave on purpose (unusable text, SIGKILL of its own process after k calls).

It recognizes the three prompts of `sage_jax.run.prompts` and answers each in the shape the parser
expects, except that about a quarter of the answers are unusable ('# ...' lines), so that the
re-queue path runs in every test.
"""
from __future__ import annotations

import hashlib
import os
import random
import re
import signal

import numpy as np

WORDS = ("you should always help others be kind honest fair never harm people animals respect "
         "their choices it is wrong to lie steal cheat good bad right duty care").split()


def _rng(*parts) -> random.Random:
    return random.Random(hashlib.sha256(repr(parts).encode()).hexdigest())


class FakeGenerator:
    def __init__(self, *, unusable: bool = False, kill_after_calls: int | None = None, name: str = "fake"):
        self.unusable, self.kill_after_calls, self.name = unusable, kill_after_calls, name
        self.calls = 0
        self.prompts_seen: list = []


    def _one(self, prompt, seed) -> str:
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        rng = _rng(self.name, text, seed)
        if self.unusable:
            return "# I cannot answer that\n`code`"
        m = re.search(r"# Instruction\nParaphrase (.*)\n", text)
        if m:
            q = m.group(1).strip()
            lines = [f"1. {q}", "Some intro that mentions 2. inline numbers"]
            for i in range(2, 9):
                words = rng.sample(WORDS, 4)
                lines.append(f"{i}. {q.rstrip('?')} — {' '.join(words)}?")
            return "\n".join(lines)
        if "# Rule of Thumb" in text:
            return f"Rule of Thumb: {' '.join(rng.sample(WORDS, 6))}.\nextra line"
        if rng.random() < 0.25:
            return "# Heading instead of an answer"
        return f"Answer: {' '.join(rng.sample(WORDS, 8))}.\nA second line that is dropped."

    def complete(self, prompts, sampling, n=1, seed=None):
        from clarifyjax.text.generator import Completion, per_prompt

        self.calls += 1
        if self.kill_after_calls is not None and self.calls > self.kill_after_calls:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9, mid-stage: this batch is never saved
        self.prompts_seen.extend(prompts)
        return [[Completion(self._one(p, (seed, i, j)), (), (), "stop") for j in range(k)]
                for i, (p, k) in enumerate(zip(prompts, per_prompt(n, len(prompts), "n")))]


def fake_parascore(sources, candidates):
    """A deterministic score in [0.55, 1.0) per pair: about 9 in 10 pass the code preset's 0.6."""
    return [0.55 + 0.45 * _rng(s, c).random() for s, c in zip(sources, candidates)]


def fake_screen(threshold: float = -10.0):
    """`sage_jax.parascore.filter_paraphrases` with `fake_parascore` in place of the BERT model:
    the filter's own parsing and drop rules, the fake's scores (the run applies its threshold)."""
    from sage_jax import parascore

    def screen(question, generation, exclude, reference=False):
        real = parascore.parascore

        def scores(sources, candidates, references=None, **_):
            return np.asarray(fake_parascore(sources, candidates))

        parascore.parascore = scores
        try:
            return parascore.filter_paraphrases(question, generation, model=None, threshold=threshold,
                                                exclude=exclude, reference=reference)
        finally:
            parascore.parascore = real

    return screen
